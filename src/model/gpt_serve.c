/*
 * gpt_serve.c: the GPT model's serving step: many sequences at once over a
 * paged key/value cache (model.h, "serving: paged steps").
 *
 * A step flattens the new tokens of every sequence into N rows. Each layer
 * runs as in gpt.c's forward, except for attention: the rows' keys and
 * values are first stored in the cache (gpc_op_kv_store), then each row's
 * query attends to its own sequence read through the block tables
 * (gpc_op_paged_attention). Everything between is row-wise, so rows of
 * different sequences and positions can share every product. The output
 * head runs only on the rows whose logits are wanted, which the caller puts
 * first, so no gather is needed. Written against ops.h only: every backend
 * runs it, in the model's compute dtype. A quantized model (gpc quantize)
 * runs its four block products on its 8-bit weights.
 *
 * gpt_step_paged copies the logits to the host; gpt_step_paged_launch
 * draws on the device instead (gpc_op_forbid_tokens, gpc_op_sample), so a
 * step moves its integers and sampling parameters to the device in one
 * copy from pinned memory, queued without a wait, and only R tokens back:
 * no logits leave it.
 *
 * Launch and collect are split so that the host prepares step N+1 while
 * the device runs step N: a launch queues the step and the copy of its
 * drawn tokens (on a copy stream, after an event) and returns; a collect
 * waits for that copy. Two steps may be in flight, so everything a step
 * still uses after its launch returns comes in two, indexed by the parity
 * of its launch: the drawn tokens on the device (the feed of step N+1
 * reads step N's, gpc_op_feed_tokens), their pinned copy on the host, and
 * the pinned staging of the step's integers with the event that says its
 * upload is done.
 *
 * Fused decode products: a step of at most GPC_DECODE_FUSED_MAX_M rows
 * (default 16; 0: never) runs each layer in five kernels instead of nine,
 * through gpc_op_decode_product: layernorm, qkv's product and the cache
 * store in one; attention; proj's product added to the stream; layernorm,
 * fc's product and GELU; fcproj's product added to the stream. The head is
 * the final layernorm and the product over wte in one. Each kernel streams
 * its weight at close to the memory's rate, where cuBLASLt's tiles, made
 * for many rows, read it far slower at one row. The result is that of the
 * unfused ops up to rounding (on the CPU, the same bits). Quantized models
 * keep their own skinny kernel for the four block products.
 *
 * Decode steps in graphs: a decode step launches about ten kernels a layer,
 * each taking the host a few microseconds, which at one or a few rows is
 * longer than the kernels run. Where the backend captures graphs, a decode
 * step of n rows is padded to a bucket of B rows (1, 2, 4 .. 256, at most
 * the planned sizes), so that a few shapes cover every batch; each bucket
 * is captured once and then replayed with one launch. A graph keeps the
 * addresses and sizes it saw, so a bucket's step reads everything from
 * fixed places: the integers at offsets that depend only on B, the block
 * tables always max_blocks wide, the whole of the other parity's drawn
 * tokens for its feed. It writes its own parity's drawn tokens, so each
 * bucket has a graph per parity. Padding row i is token 0 at position 0
 * of a sequence of its own whose one block is the cache's last, which no
 * real sequence owns: it writes there, attends to it only, is fed nothing,
 * and its token is dropped. Padding does not depend on whether graphs are
 * on, so turning them off runs the same kernels on the same shapes and
 * gives the same bits. A bucket runs eagerly once before its capture, so
 * that lazy set-up (cuBLASLt's handle and workspace, algorithm choices,
 * the scratch buffer, module loading) happens outside the capture;
 * gpt_paged_create runs every bucket of either parity twice (and one
 * prompt-sized step) so the first request pays none of it.
 */
#include "model/gpt_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gpc/settings.h"
#include "ops/ops.h"

/* decode buckets 1, 2, 4 .. 256 (bucket k has 2^k rows, or the cap) */
#define BUCKETS 9
#define MAX_BUCKET_ROWS (1 << (BUCKETS - 1))

struct gpt_paged {
    gpt_model *model;
    gpt_paged_options o;
    int max_blocks;              /* per sequence: the whole context */
    int cache_blocks;            /* num_blocks, and the padding rows' block where steps pad */
    gpc_tensor k_cache, v_cache; /* [L, cache_blocks, block_size, C] */
    /* decode steps padded to buckets (0: never, the backend has no graphs);
     * the largest bucket's rows */
    int bucket_cap;
    int use_graphs; /* replay padded steps from graphs */
    /* steps of at most this many rows run the fused decode products
     * (GPC_DECODE_FUSED_MAX_M; 0: never) */
    int fused_max;
    /* [launch parity][draws on the device][bucket] */
    gpc_graph graphs[2][2][BUCKETS];
    unsigned char warmed[2][2][BUCKETS]; /* ran once eagerly */
    int graph_count;
    gpc_arena arena; /* the step's buffers */
    /* a step's integers, i32, in one buffer so that one copy uploads them:
     * tokens, positions, seqs, slots and feed [N] each, then the block
     * tables [S, max_blocks], then, when it samples, the forbidden tokens
     * [R] and the sampling parameters [R, 4] (f32 bits); packed for the
     * step's N, S and R */
    gpc_tensor ints;     /* [5 * max_tokens + max_seqs * max_blocks + 5 * max_logits] */
    gpc_tensor drawn[2]; /* [max_logits] the tokens a step drew, by launch parity */
    /* on the host (pinned on a GPU), by launch parity: where a step packs
     * its integers, and where its drawn tokens arrive */
    int32_t *host_ints[2], *host_drawn[2];
    int32_t *host_memory;            /* one allocation holding the four */
    const gpc_backend *host_backend; /* who allocated host_memory; the device's streams, events */
    gpc_stream copy_stream;          /* drawn tokens to the host, beside the step */
    /* by launch parity: the step's start (on the copy stream), its draw
     * and the copy of its tokens done, and its integers' upload done (so
     * host_ints may be rewritten) */
    gpc_event started[2], sampled[2], copied[2], uploaded[2];
    uint64_t launched, collected; /* steps so far: in flight = the difference */
    int step_logits[2];           /* R of each step in flight, by parity */
    int previous_logits;          /* R of the last launched step: what a feed may index */
    double collected_seconds;     /* device time of the last collected step */
    /* activations of one layer, reused by every layer; x is the residual
     * stream, updated in place by the projections */
    gpc_tensor x, ln;         /* [max_tokens, C] */
    gpc_tensor mean, rstd;    /* [max_tokens] f32 */
    gpc_tensor qkv;           /* [max_tokens, 3C] */
    gpc_tensor atty;          /* [max_tokens, C] */
    gpc_tensor fch, fch_gelu; /* [max_tokens, 4C] */
    gpc_tensor logits;        /* [max_logits, Vp] */
    void *host_logits;        /* [max_logits, Vp] compute dtype */
};

static gpc_status warm_up(gpt_paged *p);

/* Rows start .. start+n-1 of a 2-D tensor [rows, width] (or of a flat one
 * seen so), as [n, width]; width 0 gives a 1-D view of n elements. */
static gpc_tensor rows_of(const gpc_tensor *t, int64_t start, int64_t n, int64_t width) {
    int64_t w = width ? width : 1;
    char *base = (char *)t->data + (size_t)(start * w) * gpc_dtype_size(t->dtype);
    if (!width) return gpc_tensor_1d(base, t->dtype, t->device, n);
    return gpc_tensor_2d(base, t->dtype, t->device, n, width);
}

/* Layer l of a parameter [L, rows, cols] (cols 0: [L, rows]), as [rows,
 * cols] (or [rows]). */
static gpc_tensor layer_of(const gpc_tensor *t, int l, int64_t rows, int64_t cols) {
    return rows_of(t, (int64_t)l * rows, rows, cols);
}

/* A block's product on parameter tensor `index` (layer l's weight w):
 * out = [residual +] inp @ w^T + bias, on the 8-bit weight and its scales
 * when the model is quantized; with out_gelu, fc's product: out is the
 * pre-activation and out_gelu its GELU. */
static gpc_status block_product(const gpt_model *m, int index, int l, gpc_tensor *out,
                                gpc_tensor *out_gelu, const gpc_tensor *inp, const gpc_tensor *w,
                                const gpc_tensor *bias, const gpc_tensor *residual) {
    if (m->quant.on) {
        const gpc_tensor *all = &m->quant.scales[index];
        gpc_tensor scales = layer_of(all, l, all->shape[1], 0);
        if (out_gelu) return gpc_op_matmul_quant_gelu_forward(out, out_gelu, inp, w, &scales, bias);
        return gpc_op_matmul_quant_forward(out, inp, w, &scales, bias, residual);
    }
    if (out_gelu) return gpc_op_matmul_gelu_forward(out, out_gelu, inp, w, bias);
    if (residual) return gpc_op_matmul_residual_forward(out, inp, w, bias, residual);
    return gpc_op_matmul_forward(out, inp, w, bias);
}

/* Layer l of the cache, [cache_blocks, block_size, C]. */
static gpc_tensor cache_layer(const gpt_paged *p, const gpc_tensor *cache, int l) {
    int64_t C = p->model->config.channels, per = (int64_t)p->cache_blocks * p->o.block_size * C;
    char *base = (char *)cache->data + (size_t)(l * per) * gpc_dtype_size(cache->dtype);
    return gpc_tensor_3d(base, cache->dtype, cache->device, p->cache_blocks, p->o.block_size, C);
}

size_t gpt_paged_block_bytes(const gpt_config *c, gpc_dtype dtype, int block_size) {
    return 2 * (size_t)c->layers * (size_t)block_size * (size_t)c->channels * gpc_dtype_size(dtype);
}

static gpc_status place(gpt_paged *p, gpc_arena *a) {
    const gpt_config *c = &p->model->config;
    int64_t N = p->o.max_tokens, C = c->channels, R = p->o.max_logits;
    gpc_dtype d = p->model->dtype;
    int64_t table = (int64_t)p->o.max_seqs * p->max_blocks;
#define PLACE(t, dtype, ...)                                                                       \
    do {                                                                                           \
        const int64_t shape_[] = {__VA_ARGS__};                                                    \
        GPC_TRY(                                                                                   \
            gpc_arena_tensor(a, &p->t, dtype, (int)(sizeof shape_ / sizeof shape_[0]), shape_));   \
    } while (0)
    PLACE(ints, GPC_I32, 5 * N + table + 5 * R);
    PLACE(drawn[0], GPC_I32, R);
    PLACE(drawn[1], GPC_I32, R);
    PLACE(x, d, N, C);
    PLACE(ln, d, N, C);
    PLACE(mean, GPC_F32, N);
    PLACE(rstd, GPC_F32, N);
    PLACE(qkv, d, N, 3 * C);
    PLACE(atty, d, N, C);
    PLACE(fch, d, N, 4 * C);
    PLACE(fch_gelu, d, N, 4 * C);
    PLACE(logits, d, R, c->padded_vocab);
#undef PLACE
    return GPC_OK;
}

static gpc_status check_options(const gpt_config *c, const gpt_paged_options *o) {
    if (o->num_blocks < 1 || o->block_size < 1 || o->max_seqs < 1 || o->max_tokens < 1 ||
        o->max_logits < 1 || o->max_logits > o->max_tokens)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "a paged cache needs at least one block of at least one position, and "
                         "steps of at least one sequence, one row and one logits row (at most "
                         "the rows); got %d blocks of %d, %d sequences, %d rows, %d logits rows",
                         o->num_blocks, o->block_size, o->max_seqs, o->max_tokens, o->max_logits);
    if ((int64_t)o->num_blocks * o->block_size > INT32_MAX / 2 ||
        (int64_t)o->max_seqs * ((c->max_context + o->block_size - 1) / o->block_size) >
            INT32_MAX / 2)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%d blocks of %d positions (or %d sequences) exceed what 32-bit slots "
                         "address; use fewer or smaller blocks",
                         o->num_blocks, o->block_size, o->max_seqs);
    return GPC_OK;
}

size_t gpt_paged_step_bytes(const gpt_config *c, gpc_dtype dtype, const gpt_paged_options *o) {
    gpt_model fake;
    memset(&fake, 0, sizeof fake);
    fake.config = *c;
    fake.dtype = dtype;
    gpt_paged p;
    memset(&p, 0, sizeof p);
    p.model = &fake;
    p.o = *o;
    p.max_blocks = (c->max_context + o->block_size - 1) / o->block_size;
    gpc_arena measure;
    gpc_arena_measure(&measure, gpc_cpu());
    if (place(&p, &measure) != GPC_OK) return 0;
    return measure.peak;
}

gpc_status gpt_paged_create(gpt_paged **out, gpt_model *m, const gpt_paged_options *o) {
    *out = NULL;
    if (gpt_is_part(m))
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "serving runs a whole model on one device, not a tensor or pipeline "
                         "part (tp %d, pp %d); create it with gpt_create or gpt_create_from_run",
                         m->par.tp_size, m->par.pp_size);
    GPC_TRY(check_options(&m->config, o));
    gpt_paged *p = gpc_calloc(1, sizeof *p);
    if (!p) return gpc_error(GPC_ERR_NOMEM, "out of host memory creating a paged cache");
    p->model = m;
    p->o = *o;
    p->max_blocks = (m->config.max_context + o->block_size - 1) / o->block_size;
    if (gpc_graph_supported(m->device)) {
        int cap = MAX_BUCKET_ROWS;
        if (cap > o->max_seqs) cap = o->max_seqs;
        if (cap > o->max_tokens) cap = o->max_tokens;
        if (cap > o->max_logits) cap = o->max_logits;
        p->bucket_cap = cap;
        p->use_graphs = !o->eager && gpc_setting_flag("GPC_SERVE_GRAPHS");
    }
    p->fused_max = (int)gpc_setting_int("GPC_DECODE_FUSED_MAX_M");
    if (p->fused_max > GPC_DECODE_MAX_ROWS) p->fused_max = GPC_DECODE_MAX_ROWS;
    /* one block more where steps pad: the padding rows' */
    p->cache_blocks = o->num_blocks + (p->bucket_cap > 0);
    const int64_t shape[] = {m->config.layers, p->cache_blocks, o->block_size, m->config.channels};
    gpc_status s = gpc_tensor_alloc(&p->k_cache, m->dtype, m->device, 4, shape);
    if (s == GPC_OK) s = gpc_tensor_alloc(&p->v_cache, m->dtype, m->device, 4, shape);
    if (s != GPC_OK) {
        s = gpc_error_context(
            s, "allocating a key/value cache of %d blocks (%.1f MiB) on %s: ", o->num_blocks,
            (double)o->num_blocks * gpt_paged_block_bytes(&m->config, m->dtype, o->block_size) /
                (1 << 20),
            gpc_device_name(m->device));
    }
    if (s == GPC_OK) {
        gpc_arena measure;
        gpc_arena_measure(&measure, m->device);
        s = place(p, &measure);
        if (s == GPC_OK) s = gpc_arena_create(&p->arena, m->device, measure.peak);
        if (s == GPC_OK) s = place(p, &p->arena);
    }
    if (s == GPC_OK) {
        /* pinned, so the one upload a step makes and the tokens it reads
         * back are direct transfers, not staged through a bounce buffer */
        s = gpc_backend_require(m->device, &p->host_backend);
        size_t ints = (size_t)gpc_tensor_numel(&p->ints), R = (size_t)o->max_logits;
        if (s == GPC_OK)
            s = p->host_backend->alloc_host(2 * (ints + R) * sizeof(int32_t),
                                            (void **)&p->host_memory);
        if (s != GPC_OK) p->host_memory = NULL;
        if (s == GPC_OK) {
            p->host_ints[0] = p->host_memory;
            p->host_ints[1] = p->host_memory + ints;
            p->host_drawn[0] = p->host_memory + 2 * ints;
            p->host_drawn[1] = p->host_memory + 2 * ints + R;
        }
    }
    if (s == GPC_OK) s = p->host_backend->stream_create(m->device.index, &p->copy_stream);
    for (int i = 0; i < 2 && s == GPC_OK; i++) {
        s = p->host_backend->event_create(&p->started[i]);
        if (s == GPC_OK) s = p->host_backend->event_create(&p->sampled[i]);
        if (s == GPC_OK) s = p->host_backend->event_create(&p->copied[i]);
        if (s == GPC_OK) s = p->host_backend->event_create(&p->uploaded[i]);
    }
    if (s == GPC_OK) {
        p->host_logits = gpc_malloc((size_t)o->max_logits * (size_t)m->config.padded_vocab *
                                    gpc_dtype_size(m->dtype));
        if (!p->host_logits) s = gpc_error(GPC_ERR_NOMEM, "out of host memory for a step's logits");
    }
    /* a fresh cache reads as zeros, not as whatever memory held before */
    if (s == GPC_OK) s = gpc_tensor_zero(&p->k_cache);
    if (s == GPC_OK) s = gpc_tensor_zero(&p->v_cache);
    if (s == GPC_OK) s = warm_up(p);
    if (s != GPC_OK) {
        gpt_paged_free(p);
        return s;
    }
    *out = p;
    return GPC_OK;
}

void gpt_paged_free(gpt_paged *p) {
    if (!p) return;
    if (p->host_backend) {
        /* a step still in flight must not copy into freed memory, nor an
         * upload still queued read from it */
        for (uint64_t k = p->collected; k < p->launched; k++)
            p->host_backend->event_synchronize(p->copied[k & 1]);
        for (int i = 0; i < 2; i++)
            if (p->uploaded[i]) p->host_backend->event_synchronize(p->uploaded[i]);
    }
    for (int par = 0; par < 2; par++)
        for (int d = 0; d < 2; d++)
            for (int k = 0; k < BUCKETS; k++)
                gpc_graph_destroy(p->model->device, p->graphs[par][d][k]);
    if (p->k_cache.data) gpc_tensor_free(&p->k_cache);
    if (p->v_cache.data) gpc_tensor_free(&p->v_cache);
    if (p->arena.base) gpc_arena_destroy(&p->arena);
    gpc_free(p->host_logits);
    if (p->host_backend) {
        for (int i = 0; i < 2; i++) {
            p->host_backend->event_destroy(p->started[i]);
            p->host_backend->event_destroy(p->sampled[i]);
            p->host_backend->event_destroy(p->copied[i]);
            p->host_backend->event_destroy(p->uploaded[i]);
        }
        if (p->copy_stream) p->host_backend->stream_destroy(p->copy_stream);
        if (p->host_memory) p->host_backend->free_host(p->host_memory);
    }
    gpc_free(p);
}

int gpt_paged_max_blocks(const gpt_paged *p) {
    return p->max_blocks;
}

void gpt_paged_cache(const gpt_paged *p, gpc_tensor *k_cache, gpc_tensor *v_cache) {
    *k_cache = p->k_cache;
    *v_cache = p->v_cache;
}

int gpt_paged_graph_count(const gpt_paged *p) {
    return p->graph_count;
}

/* Every index of the batch against the cache and the model, on the host:
 * a bookkeeping error becomes a message naming the row, on every backend. */
static gpc_status check_batch(const gpt_paged *p, const gpt_paged_batch *b) {
    const gpt_config *c = &p->model->config;
    if (b->num_tokens < 1 || b->num_tokens > p->o.max_tokens || b->num_seqs < 1 ||
        b->num_seqs > p->o.max_seqs || b->num_logits < 0 || b->num_logits > b->num_tokens ||
        b->num_logits > p->o.max_logits)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "a paged step of %d rows, %d sequences and %d logits rows does not fit "
                         "the %d rows, %d sequences and %d logits rows it was planned for",
                         b->num_tokens, b->num_seqs, b->num_logits, p->o.max_tokens, p->o.max_seqs,
                         p->o.max_logits);
    int64_t slots = (int64_t)p->o.num_blocks * p->o.block_size;
    for (int i = 0; b->feed && i < b->num_tokens; i++)
        if (b->feed[i] >= p->previous_logits)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "paged step row %d is fed token %d of the previous step, which drew "
                             "%d: feed only a step launched after a step that drew that row",
                             i, b->feed[i], p->previous_logits > 0 ? p->previous_logits : 0);
    for (int i = 0; i < b->num_tokens; i++)
        if ((b->feed && b->feed[i] >= 0 ? 0 : b->tokens[i] < 0 || b->tokens[i] >= c->vocab_size) ||
            b->positions[i] < 0 || b->positions[i] >= c->max_context || b->seqs[i] < 0 ||
            b->seqs[i] >= b->num_seqs || b->slots[i] < 0 || b->slots[i] >= slots)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "paged step row %d: token %d, position %d, sequence %d or slot %d "
                             "is outside the vocabulary (%d), context (%d), step (%d sequences) "
                             "or cache (%lld slots)",
                             i, b->tokens[i], b->positions[i], b->seqs[i], b->slots[i],
                             c->vocab_size, c->max_context, b->num_seqs, (long long)slots);
    return GPC_OK;
}

/* Where the sampling part of ints starts for a step run with N rows and S
 * sequences: after the rows and the tables. */
static size_t sampling_offset(const gpt_paged *p, int64_t N, int64_t S) {
    return 5 * (size_t)N + (size_t)S * (size_t)p->max_blocks;
}

/* The padded rows of a decode step (every row a sequence's one row, all
 * wanting logits): its bucket's size; 0 where the step runs as it is
 * (not a decode step, too large, or no padding on this backend). */
static int padded_rows(const gpt_paged *p, const gpt_paged_batch *b) {
    int n = b->num_tokens;
    if (!p->bucket_cap || n != b->num_seqs || n != b->num_logits || n > p->bucket_cap) return 0;
    int rows = 1;
    while (rows < n)
        rows *= 2;
    return rows < p->bucket_cap ? rows : p->bucket_cap;
}

/* Bucket index of a padded step's rows: the k with 2^k >= rows (the cap
 * shares the index of the power of two at or above it). */
static int bucket_of(int rows) {
    int k = 0;
    while ((1 << k) < rows)
        k++;
    return k;
}

/* Waits, if it must, until the last upload of parity par has left
 * host_ints[par], so a step may pack into it (at once in practice: the
 * collect of the step two launches back, or the wait of a step run alone,
 * came after it). */
static gpc_status host_ints_free(gpt_paged *p, int par) {
    return p->host_backend->event_synchronize(p->uploaded[par]);
}

/* Queues the upload of the first count integers packed in host_ints[par],
 * without a wait, on the stream the step's ops run on. */
static gpc_status upload_packed(gpt_paged *p, int par, size_t count) {
    gpc_tensor dev = rows_of(&p->ints, 0, (int64_t)count, 0);
    gpc_tensor host = gpc_tensor_1d(p->host_ints[par], GPC_I32, gpc_cpu(), (int64_t)count);
    GPC_TRY(gpc_tensor_copy_async(&dev, &host));
    return p->host_backend->event_record(p->uploaded[par], NULL);
}

/* Packs a step's integers (and, given rows, its sampling parameters) into
 * host_ints[par] as a step of N rows, S sequences and R logits rows runs
 * them, and uploads them in one copy (on a GPU, one transfer instead of
 * eight). N, S and R exceed the batch's by the same number of padding
 * rows, or equal them. */
static gpc_status upload(gpt_paged *p, int par, const gpt_paged_batch *b,
                         const gpt_paged_sampling *rows, int64_t N, int64_t S, int64_t R) {
    size_t n = (size_t)b->num_tokens, r = (size_t)b->num_logits, s = (size_t)b->num_seqs;
    size_t mb = (size_t)p->max_blocks, at = sampling_offset(p, N, S);
    int32_t pad_slot = (int32_t)((int64_t)p->o.num_blocks * p->o.block_size);
    GPC_TRY(host_ints_free(p, par));
    int32_t *h = p->host_ints[par];
    if (n) { /* warm_up's steps have padding rows only */
        memcpy(h, b->tokens, n * sizeof *h);
        memcpy(h + N, b->positions, n * sizeof *h);
        memcpy(h + 2 * N, b->seqs, n * sizeof *h);
        memcpy(h + 3 * N, b->slots, n * sizeof *h);
        memcpy(h + 5 * N, b->block_tables, s * mb * sizeof *h);
    }
    for (size_t i = 0; i < n; i++)
        h[4 * N + i] = b->feed ? b->feed[i] : -1;
    for (size_t i = n; i < (size_t)N; i++) { /* padding: sequence s + (i - n), alone in its block */
        h[i] = 0, h[N + i] = 0, h[3 * N + i] = pad_slot, h[4 * N + i] = -1;
        size_t seq = s + (i - n);
        h[2 * N + i] = (int32_t)seq;
        int32_t *table = h + 5 * N + seq * mb;
        table[0] = p->o.num_blocks;
        for (size_t j = 1; j < mb; j++)
            table[j] = -1;
    }
    if (rows) {
        for (size_t i = 0; i < (size_t)R; i++) {
            /* padding rows draw greedily, the cheapest way, and are dropped */
            gpt_paged_sampling g = {0.0f, 0.0f, 1.0f, 0.0f, -1};
            const gpt_paged_sampling *q = i < r ? &rows[i] : &g;
            const float params[4] = {q->temperature, q->top_k, q->top_p, q->uniform};
            h[at + i] = q->forbidden;
            memcpy(h + at + R + 4 * i, params, sizeof params); /* f32 bits in i32 slots */
        }
        at += 5 * (size_t)R;
    }
    return upload_packed(p, par, at);
}

/* The step's ops for N rows of S sequences, R logits rows, launched with
 * parity par: the feed from the other parity's drawn tokens, then up to
 * the logits of rows 0 .. R-1, left in p->logits on the device, and with
 * sample the tokens drawn from them into drawn[par]. Reads only what
 * upload packed at offsets that depend on N, S and R, and whole buffers
 * chosen by par, so a graph of it replays any step of those sizes and
 * that parity. */
static gpc_status step_ops(gpt_paged *p, int par, int64_t N, int64_t S, int64_t R, int sample) {
    gpt_model *m = p->model;
    const gpt_config *c = &m->config;
    gpt_tensors *w = &m->params;
    int64_t C = c->channels;
    int L = c->layers, NH = c->heads;
    gpc_tensor tokens = rows_of(&p->ints, 0, N, 0), positions = rows_of(&p->ints, N, N, 0);
    gpc_tensor seqs = rows_of(&p->ints, 2 * N, N, 0), slots = rows_of(&p->ints, 3 * N, N, 0);
    gpc_tensor tables =
        gpc_tensor_2d((int32_t *)p->ints.data + 5 * N, GPC_I32, p->ints.device, S, p->max_blocks);
    gpc_tensor x = rows_of(&p->x, 0, N, C), ln = rows_of(&p->ln, 0, N, C);
    gpc_tensor mean = rows_of(&p->mean, 0, N, 0), rstd = rows_of(&p->rstd, 0, N, 0);
    gpc_tensor qkv = rows_of(&p->qkv, 0, N, 3 * C), atty = rows_of(&p->atty, 0, N, C);
    gpc_tensor fch = rows_of(&p->fch, 0, N, 4 * C), fch_gelu = rows_of(&p->fch_gelu, 0, N, 4 * C);

    /* the tokens the previous launch drew, taken on the device; always
     * run, so a graph holds it (rows not fed are -1 and keep their token),
     * and over the whole buffer, whose size does not vary: the host
     * checked each feed against what that step drew (check_batch) */
    gpc_tensor feed = rows_of(&p->ints, 4 * N, N, 0), previous = p->drawn[par ^ 1];
    GPC_TRY(gpc_op_feed_tokens(&tokens, &feed, &previous));
    /* few rows: the fused decode products (not for 8-bit weights, which
     * have their own skinny kernel) */
    int fused = !m->quant.on && N <= p->fused_max;
    GPC_TRY(gpc_op_embedding_at(&x, &tokens, &positions, &w->wte, &w->wpe));
    for (int l = 0; l < L; l++) {
        gpc_tensor ln1w = layer_of(&w->ln1w, l, C, 0), ln1b = layer_of(&w->ln1b, l, C, 0);
        gpc_tensor qkvw = layer_of(&w->qkvw, l, 3 * C, C), qkvb = layer_of(&w->qkvb, l, 3 * C, 0);
        gpc_tensor projw = layer_of(&w->attprojw, l, C, C);
        gpc_tensor projb = layer_of(&w->attprojb, l, C, 0);
        gpc_tensor ln2w = layer_of(&w->ln2w, l, C, 0), ln2b = layer_of(&w->ln2b, l, C, 0);
        gpc_tensor fcw = layer_of(&w->fcw, l, 4 * C, C), fcb = layer_of(&w->fcb, l, 4 * C, 0);
        gpc_tensor fcprojw = layer_of(&w->fcprojw, l, C, 4 * C);
        gpc_tensor fcprojb = layer_of(&w->fcprojb, l, C, 0);
        gpc_tensor kc = cache_layer(p, &p->k_cache, l), vc = cache_layer(p, &p->v_cache, l);

        if (fused) {
            /* the layer in five kernels: layernorm, qkv's product and the
             * cache store; attention; proj's product onto the stream;
             * layernorm, fc's product and GELU; fcproj's onto the stream */
            const gpc_decode_product_args qkv_args = {.ln_weight = &ln1w,
                                                      .ln_bias = &ln1b,
                                                      .bias = &qkvb,
                                                      .k_cache = &kc,
                                                      .v_cache = &vc,
                                                      .slots = &slots};
            const gpc_decode_product_args proj_args = {.bias = &projb, .residual = &x};
            const gpc_decode_product_args fc_args = {
                .ln_weight = &ln2w, .ln_bias = &ln2b, .bias = &fcb, .gelu = 1};
            const gpc_decode_product_args fcproj_args = {.bias = &fcprojb, .residual = &x};
            GPC_TRY(gpc_op_decode_product(&qkv, &x, &qkvw, &qkv_args));
            GPC_TRY(gpc_op_paged_attention(&atty, &qkv, &kc, &vc, &tables, &seqs, &positions, NH));
            GPC_TRY(gpc_op_decode_product(&x, &atty, &projw, &proj_args));
            GPC_TRY(gpc_op_decode_product(&fch_gelu, &x, &fcw, &fc_args));
            GPC_TRY(gpc_op_decode_product(&x, &fch_gelu, &fcprojw, &fcproj_args));
            continue;
        }
        GPC_TRY(gpc_op_layernorm_forward(&ln, &mean, &rstd, &x, &ln1w, &ln1b));
        GPC_TRY(block_product(m, 4, l, &qkv, NULL, &ln, &qkvw, &qkvb, NULL));
        GPC_TRY(gpc_op_kv_store(&kc, &vc, &qkv, &slots));
        GPC_TRY(gpc_op_paged_attention(&atty, &qkv, &kc, &vc, &tables, &seqs, &positions, NH));
        GPC_TRY(block_product(m, 6, l, &x, NULL, &atty, &projw, &projb, &x));
        GPC_TRY(gpc_op_layernorm_forward(&ln, &mean, &rstd, &x, &ln2w, &ln2b));
        GPC_TRY(block_product(m, 10, l, &fch, &fch_gelu, &ln, &fcw, &fcb, NULL));
        GPC_TRY(block_product(m, 12, l, &x, NULL, &fch_gelu, &fcprojw, &fcprojb, &x));
    }
    if (R == 0) return GPC_OK;
    /* the head on the wanted rows, which lead */
    int64_t Vp = c->padded_vocab;
    gpc_tensor xr = rows_of(&p->x, 0, R, C), lnr = rows_of(&p->ln, 0, R, C);
    gpc_tensor meanr = rows_of(&p->mean, 0, R, 0), rstdr = rows_of(&p->rstd, 0, R, 0);
    gpc_tensor logits = rows_of(&p->logits, 0, R, Vp);
    if (R <= p->fused_max) {
        const gpc_decode_product_args head = {.ln_weight = &w->lnfw, .ln_bias = &w->lnfb};
        GPC_TRY(gpc_op_decode_product(&logits, &xr, &w->wte, &head));
    } else {
        GPC_TRY(gpc_op_layernorm_forward(&lnr, &meanr, &rstdr, &xr, &w->lnfw, &w->lnfb));
        GPC_TRY(gpc_op_matmul_forward(&logits, &lnr, &w->wte, NULL));
    }
    if (!sample) return GPC_OK;
    size_t at = sampling_offset(p, N, S);
    gpc_tensor forbidden = rows_of(&p->ints, (int64_t)at, R, 0);
    /* the same 4 bytes an entry, uploaded as f32 bits */
    gpc_tensor params =
        gpc_tensor_2d((int32_t *)p->ints.data + at + R, GPC_F32, p->ints.device, R, 4);
    gpc_tensor drawn = rows_of(&p->drawn[par], 0, R, 0);
    GPC_TRY(gpc_op_forbid_tokens(&logits, &forbidden));
    return gpc_op_sample(&drawn, &logits, c->vocab_size, &params);
}

/* Captures a bucket's step into *out. The op's own message wins over the
 * capture's when both fail. */
static gpc_status capture(gpt_paged *p, int par, int rows, int sample, gpc_graph *out) {
    gpc_device device = p->model->device;
    GPC_TRY(gpc_graph_capture_begin(device));
    gpc_status s = step_ops(p, par, rows, rows, rows, sample);
    char why[512] = "";
    if (s != GPC_OK) snprintf(why, sizeof why, "%s", gpc_last_error());
    gpc_graph graph = NULL;
    gpc_status e = gpc_graph_capture_end(device, &graph);
    if (s != GPC_OK) {
        gpc_graph_destroy(device, graph);
        return gpc_error(s, "%s", why);
    }
    GPC_TRY(e);
    *out = graph;
    p->graph_count++;
    return GPC_OK;
}

/* A padded step of a bucket's rows and parity par, its integers uploaded:
 * eagerly the first time, then captured and replayed. A capture that fails
 * turns graphs off for this cache (said once) and the step runs eagerly. */
static gpc_status run_bucket(gpt_paged *p, int par, int rows, int sample) {
    int k = bucket_of(rows);
    if (!p->use_graphs) return step_ops(p, par, rows, rows, rows, sample);
    gpc_graph *graph = &p->graphs[par][sample][k];
    if (!*graph && !p->warmed[par][sample][k]) {
        p->warmed[par][sample][k] = 1;
        return step_ops(p, par, rows, rows, rows, sample);
    }
    if (!*graph) {
        gpc_status s = capture(p, par, rows, sample, graph);
        if (s != GPC_OK) {
            gpc_log(GPC_LOG_WARN, "decode steps run without CUDA graphs: %s", gpc_last_error());
            gpc_clear_error();
            p->use_graphs = 0;
            return step_ops(p, par, rows, rows, rows, sample);
        }
    }
    return gpc_graph_launch(p->model->device, *graph);
}

/* The step, launched with parity par, up to the logits of rows 0 ..
 * num_logits-1, left in p->logits on the device, and given rows the tokens
 * drawn from them in drawn[par]. Returns once the work is queued on the
 * stream the ops run on: the caller's copy back is the wait. */
static gpc_status run_step(gpt_paged *p, int par, const gpt_paged_batch *b,
                           const gpt_paged_sampling *rows) {
    GPC_TRY(check_batch(p, b));
    int padded = padded_rows(p, b);
    if (padded) {
        GPC_TRY(upload(p, par, b, rows, padded, padded, padded));
        return run_bucket(p, par, padded, rows != NULL);
    }
    GPC_TRY(upload(p, par, b, rows, b->num_tokens, b->num_seqs, b->num_logits));
    return step_ops(p, par, b->num_tokens, b->num_seqs, b->num_logits, rows != NULL);
}

/* One warm-up step of n rows of one padding sequence (positions 0, 1, ..
 * wrapping at the context, every key to the padding slot, so positions
 * past its block read none) and n / 10 greedy logits rows (at least one,
 * at most max_logits), run eagerly on parity 0. */
static gpc_status warm_prompt_step(gpt_paged *p, int n) {
    int ctx = p->model->config.max_context, r = n / 10;
    if (r < 1) r = 1;
    if (r > p->o.max_logits) r = p->o.max_logits;
    GPC_TRY(host_ints_free(p, 0));
    int32_t *h = p->host_ints[0];
    size_t at = sampling_offset(p, n, 1);
    for (int i = 0; i < n; i++) {
        h[i] = 0, h[n + i] = i % ctx, h[2 * n + i] = 0, h[4 * n + i] = -1;
        h[3 * n + i] = (int32_t)((int64_t)p->o.num_blocks * p->o.block_size);
    }
    h[5 * n] = p->o.num_blocks;
    for (int j = 1; j < p->max_blocks; j++)
        h[5 * n + j] = -1;
    const float greedy[4] = {0.0f, 0.0f, 1.0f, 0.0f};
    for (int i = 0; i < r; i++) {
        h[at + i] = -1;
        memcpy(h + at + r + 4 * i, greedy, sizeof greedy);
    }
    GPC_TRY(upload_packed(p, 0, at + 5 * (size_t)r));
    return step_ops(p, 0, n, 1, r, 1);
}

/* Runs every bucket of either parity twice (eagerly, then captured and
 * replayed where graphs are on) and prompt-sized steps up to max_tokens
 * rows (warm_prompt_step), on padding rows only, so that lazy set-up
 * happens here and not in the first requests' time. Only where steps pad
 * (a GPU): the CPU has nothing to set up. The steps count as no launch:
 * what they draw feeds nothing. */
static gpc_status warm_up(gpt_paged *p) {
    if (!p->bucket_cap) return GPC_OK;
    gpt_paged_batch none;
    memset(&none, 0, sizeof none);
    /* non-NULL: the steps draw (every row's parameters are the padding's) */
    const gpt_paged_sampling draws = {0.0f, 0.0f, 1.0f, 0.0f, -1};
    for (int rows = 1;; rows = rows * 2 < p->bucket_cap ? rows * 2 : p->bucket_cap) {
        /* the engine's steps draw on the device: those are captured now;
         * steps that return logits are warmed, and captured at a second use */
        for (int par = 0; par < 2; par++) {
            GPC_TRY(upload(p, par, &none, NULL, rows, rows, rows));
            GPC_TRY(run_bucket(p, par, rows, 0));
            for (int twice = 0; twice < 2; twice++) {
                GPC_TRY(upload(p, par, &none, &draws, rows, rows, rows));
                GPC_TRY(run_bucket(p, par, rows, 1));
            }
        }
        if (rows == p->bucket_cap) break;
    }
    /* prompt-sized steps, as a loaded server runs them (prompt chunks and
     * decodes mixed, up to max_tokens rows): 128 rows, then each power of
     * two up to max_tokens, with as many logits rows as a tenth of the
     * rows (at least one), so that the products' kernels for the larger
     * shapes are chosen and loaded here, not in the first busy seconds */
    for (int n = p->o.max_tokens < 128 ? p->o.max_tokens : 128;;
         n = n * 2 < p->o.max_tokens ? n * 2 : p->o.max_tokens) {
        GPC_TRY(warm_prompt_step(p, n));
        if (n == p->o.max_tokens) break;
    }
    /* the wait that surfaces any error of the work queued above */
    gpc_tensor drawn = rows_of(&p->drawn[0], 0, 1, 0);
    gpc_tensor host = gpc_tensor_1d(p->host_drawn[0], GPC_I32, gpc_cpu(), 1);
    return gpc_tensor_copy(&host, &drawn);
}

gpc_status gpt_step_paged(gpt_paged *p, const gpt_paged_batch *b, float *logits_out) {
    if (p->launched != p->collected || b->feed)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "gpt_step_paged runs alone and takes no feed: collect the launched "
                         "steps first (gpt_step_paged_collect), and feed only launched steps");
    /* nothing is in flight: either parity's buffers are free */
    GPC_TRY(run_step(p, (int)(p->launched & 1), b, NULL));
    gpt_model *m = p->model;
    int64_t R = b->num_logits, Vp = m->config.padded_vocab, V = m->config.vocab_size;
    if (R == 0) return GPC_OK;
    gpc_tensor logits = rows_of(&p->logits, 0, R, Vp);
    gpc_tensor host = gpc_tensor_2d(p->host_logits, m->dtype, gpc_cpu(), R, Vp);
    GPC_TRY(gpc_tensor_copy(&host, &logits));
    for (int64_t r = 0; r < R; r++) {
        float *o = logits_out + r * V;
        if (m->dtype == GPC_F32) {
            memcpy(o, (const float *)p->host_logits + r * Vp, (size_t)V * sizeof(float));
            continue;
        }
        const uint16_t *half = (const uint16_t *)p->host_logits + r * Vp;
        for (int64_t v = 0; v < V; v++)
            o[v] = m->dtype == GPC_BF16 ? gpc_bf16_to_f32(half[v]) : gpc_f16_to_f32(half[v]);
    }
    return GPC_OK;
}

gpc_status gpt_step_paged_launch(gpt_paged *p, const gpt_paged_batch *b,
                                 const gpt_paged_sampling *rows) {
    if (p->launched - p->collected >= 2)
        return gpc_error(GPC_ERR_INVALID_ARG, "two paged steps are in flight already: collect one "
                                              "(gpt_step_paged_collect) before launching another");
    if (b->num_logits > 0 && !rows)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "a launched step draws its %d logits rows' tokens: give their sampling",
                         b->num_logits);
    const gpc_backend *be = p->host_backend;
    int par = (int)(p->launched & 1);
    int64_t R = b->num_logits;
    /* the start is recorded on the copy stream, which belongs to the
     * model's device: the calling thread's current device may still be
     * another until the step's first op makes it this one. It completes
     * at once, or when the previous step's tokens are copied: when the
     * device is done with that step. */
    GPC_TRY(be->event_record(p->started[par], p->copy_stream));
    GPC_TRY(run_step(p, par, b, rows));
    /* the drawn tokens go to pinned memory on the copy stream once the
     * step has drawn them: the host does not wait here, and the next
     * launch queues behind this step. The event is recorded on the stream
     * the step's ops and graph launches ran on (the default stream, NULL:
     * no capture is open here); only the real rows' tokens are copied,
     * padding rows' stay behind. */
    GPC_TRY(be->event_record(p->sampled[par], NULL));
    GPC_TRY(be->stream_wait_event(p->copy_stream, p->sampled[par]));
    if (R > 0) {
        GPC_TRY(be->copy(p->host_drawn[par], gpc_cpu(), p->drawn[par].data, p->drawn[par].device,
                         (size_t)R * sizeof(int32_t), p->copy_stream));
    }
    GPC_TRY(be->event_record(p->copied[par], p->copy_stream));
    p->step_logits[par] = (int)R;
    p->previous_logits = (int)R;
    p->launched++;
    return GPC_OK;
}

gpc_status gpt_step_paged_collect(gpt_paged *p, int32_t *tokens_out) {
    if (p->collected == p->launched)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "no paged step is in flight: launch one (gpt_step_paged_launch) first");
    const gpc_backend *be = p->host_backend;
    int par = (int)(p->collected & 1), R = p->step_logits[par];
    /* the step's one wait for the device */
    GPC_TRY(be->event_synchronize(p->copied[par]));
    float ms = 0.0f;
    GPC_TRY(be->event_elapsed_ms(p->started[par], p->sampled[par], &ms));
    p->collected_seconds = ms * 1e-3;
    if (R > 0) memcpy(tokens_out, p->host_drawn[par], (size_t)R * sizeof *tokens_out);
    p->collected++;
    return GPC_OK;
}

double gpt_paged_collected_seconds(const gpt_paged *p) {
    return p->collected_seconds;
}

gpc_status gpt_step_paged_sample(gpt_paged *p, const gpt_paged_batch *b,
                                 const gpt_paged_sampling *rows, int32_t *tokens_out) {
    if (p->launched != p->collected)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "gpt_step_paged_sample runs alone: collect the launched steps first "
                         "(gpt_step_paged_collect)");
    GPC_TRY(gpt_step_paged_launch(p, b, rows));
    return gpt_step_paged_collect(p, tokens_out);
}
