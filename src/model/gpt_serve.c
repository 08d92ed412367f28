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
 * gpt_step_paged copies the logits to the host; gpt_step_paged_sample
 * draws on the device instead (gpc_op_forbid_tokens, gpc_op_sample), so a
 * step moves its integers and sampling parameters to the device in one
 * copy from pinned memory and only R tokens back: no logits leave it.
 */
#include "model/gpt_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ops/ops.h"

struct gpt_paged {
    gpt_model *model;
    gpt_paged_options o;
    int max_blocks;              /* per sequence: the whole context */
    gpc_tensor k_cache, v_cache; /* [L, num_blocks, block_size, C] */
    gpc_arena arena;             /* the step's buffers */
    /* a step's integers, i32, in one buffer so that one copy uploads them:
     * tokens, positions, seqs and slots [N] each, then the block tables
     * [S, max_blocks], then, when it samples, the forbidden tokens [R] and
     * the sampling parameters [R, 4] (f32 bits), then the drawn tokens [R]
     * (device to host); packed for the step's N, S and R */
    gpc_tensor ints;    /* [4 * max_tokens + max_seqs * max_blocks + 6 * max_logits] */
    int32_t *host_ints; /* the same on the host (pinned on a GPU), where a step packs them */
    const gpc_backend *host_backend; /* who allocated host_ints */
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

/* Layer l of the cache, [num_blocks, block_size, C]. */
static gpc_tensor cache_layer(const gpt_paged *p, const gpc_tensor *cache, int l) {
    int64_t C = p->model->config.channels, per = (int64_t)p->o.num_blocks * p->o.block_size * C;
    char *base = (char *)cache->data + (size_t)(l * per) * gpc_dtype_size(cache->dtype);
    return gpc_tensor_3d(base, cache->dtype, cache->device, p->o.num_blocks, p->o.block_size, C);
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
    PLACE(ints, GPC_I32, 4 * N + table + 6 * R);
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
    const int64_t shape[] = {m->config.layers, o->num_blocks, o->block_size, m->config.channels};
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
        if (s == GPC_OK)
            s = p->host_backend->alloc_host((size_t)gpc_tensor_numel(&p->ints) * sizeof(int32_t),
                                            (void **)&p->host_ints);
        if (s != GPC_OK) p->host_ints = NULL;
    }
    if (s == GPC_OK) {
        p->host_logits = gpc_malloc((size_t)o->max_logits * (size_t)m->config.padded_vocab *
                                    gpc_dtype_size(m->dtype));
        if (!p->host_logits) s = gpc_error(GPC_ERR_NOMEM, "out of host memory for a step's logits");
    }
    /* a fresh cache reads as zeros, not as whatever memory held before */
    if (s == GPC_OK) s = gpc_tensor_zero(&p->k_cache);
    if (s == GPC_OK) s = gpc_tensor_zero(&p->v_cache);
    if (s != GPC_OK) {
        gpt_paged_free(p);
        return s;
    }
    *out = p;
    return GPC_OK;
}

void gpt_paged_free(gpt_paged *p) {
    if (!p) return;
    if (p->k_cache.data) gpc_tensor_free(&p->k_cache);
    if (p->v_cache.data) gpc_tensor_free(&p->v_cache);
    if (p->arena.base) gpc_arena_destroy(&p->arena);
    gpc_free(p->host_logits);
    if (p->host_ints) p->host_backend->free_host(p->host_ints);
    gpc_free(p);
}

int gpt_paged_max_blocks(const gpt_paged *p) {
    return p->max_blocks;
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
    for (int i = 0; i < b->num_tokens; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= c->vocab_size || b->positions[i] < 0 ||
            b->positions[i] >= c->max_context || b->seqs[i] < 0 || b->seqs[i] >= b->num_seqs ||
            b->slots[i] < 0 || b->slots[i] >= slots)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "paged step row %d: token %d, position %d, sequence %d or slot %d "
                             "is outside the vocabulary (%d), context (%d), step (%d sequences) "
                             "or cache (%lld slots)",
                             i, b->tokens[i], b->positions[i], b->seqs[i], b->slots[i],
                             c->vocab_size, c->max_context, b->num_seqs, (long long)slots);
    return GPC_OK;
}

/* Where the sampling part of ints starts: after the step's rows and
 * tables. */
static size_t sampling_offset(const gpt_paged *p, const gpt_paged_batch *b) {
    return 4 * (size_t)b->num_tokens + (size_t)b->num_seqs * (size_t)p->max_blocks;
}

/* Packs the step's integers (and, given rows, its sampling parameters) and
 * uploads them in one copy (on a GPU, one transfer instead of seven). */
static gpc_status upload(gpt_paged *p, const gpt_paged_batch *b, const gpt_paged_sampling *rows) {
    size_t N = (size_t)b->num_tokens, R = (size_t)b->num_logits;
    size_t table = (size_t)b->num_seqs * (size_t)p->max_blocks, at = sampling_offset(p, b);
    int32_t *h = p->host_ints;
    memcpy(h, b->tokens, N * sizeof *h);
    memcpy(h + N, b->positions, N * sizeof *h);
    memcpy(h + 2 * N, b->seqs, N * sizeof *h);
    memcpy(h + 3 * N, b->slots, N * sizeof *h);
    memcpy(h + 4 * N, b->block_tables, table * sizeof *h);
    if (rows) {
        for (size_t r = 0; r < R; r++) {
            const float params[4] = {rows[r].temperature, rows[r].top_k, rows[r].top_p,
                                     rows[r].uniform};
            h[at + r] = rows[r].forbidden;
            memcpy(h + at + R + 4 * r, params, sizeof params); /* f32 bits in i32 slots */
        }
        at += 5 * R;
    }
    gpc_tensor dev = rows_of(&p->ints, 0, (int64_t)at, 0);
    gpc_tensor host = gpc_tensor_1d(h, GPC_I32, gpc_cpu(), (int64_t)at);
    return gpc_tensor_copy(&dev, &host);
}

/* The step up to the logits of rows 0 .. R-1, left in p->logits on the
 * device. */
static gpc_status run_step(gpt_paged *p, const gpt_paged_batch *b, const gpt_paged_sampling *rows) {
    GPC_TRY(check_batch(p, b));
    gpt_model *m = p->model;
    const gpt_config *c = &m->config;
    gpt_tensors *w = &m->params;
    int64_t N = b->num_tokens, C = c->channels, R = b->num_logits;
    int L = c->layers, NH = c->heads;
    GPC_TRY(upload(p, b, rows));
    gpc_tensor tokens = rows_of(&p->ints, 0, N, 0), positions = rows_of(&p->ints, N, N, 0);
    gpc_tensor seqs = rows_of(&p->ints, 2 * N, N, 0), slots = rows_of(&p->ints, 3 * N, N, 0);
    gpc_tensor tables = gpc_tensor_2d((int32_t *)p->ints.data + 4 * N, GPC_I32, p->ints.device,
                                      b->num_seqs, p->max_blocks);
    gpc_tensor x = rows_of(&p->x, 0, N, C), ln = rows_of(&p->ln, 0, N, C);
    gpc_tensor mean = rows_of(&p->mean, 0, N, 0), rstd = rows_of(&p->rstd, 0, N, 0);
    gpc_tensor qkv = rows_of(&p->qkv, 0, N, 3 * C), atty = rows_of(&p->atty, 0, N, C);
    gpc_tensor fch = rows_of(&p->fch, 0, N, 4 * C), fch_gelu = rows_of(&p->fch_gelu, 0, N, 4 * C);

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
    GPC_TRY(gpc_op_layernorm_forward(&lnr, &meanr, &rstdr, &xr, &w->lnfw, &w->lnfb));
    return gpc_op_matmul_forward(&logits, &lnr, &w->wte, NULL);
}

gpc_status gpt_step_paged(gpt_paged *p, const gpt_paged_batch *b, float *logits_out) {
    GPC_TRY(run_step(p, b, NULL));
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

gpc_status gpt_step_paged_sample(gpt_paged *p, const gpt_paged_batch *b,
                                 const gpt_paged_sampling *rows, int32_t *tokens_out) {
    GPC_TRY(run_step(p, b, rows));
    int64_t R = b->num_logits, Vp = p->model->config.padded_vocab;
    if (R == 0) return GPC_OK;
    size_t at = sampling_offset(p, b);
    gpc_tensor logits = rows_of(&p->logits, 0, R, Vp);
    gpc_tensor forbidden = rows_of(&p->ints, (int64_t)at, R, 0);
    /* the same 4 bytes an entry, uploaded as f32 bits */
    gpc_tensor params =
        gpc_tensor_2d((int32_t *)p->ints.data + at + R, GPC_F32, p->ints.device, R, 4);
    gpc_tensor drawn = rows_of(&p->ints, (int64_t)(at + 5 * (size_t)R), R, 0);
    GPC_TRY(gpc_op_forbid_tokens(&logits, &forbidden));
    GPC_TRY(gpc_op_sample(&drawn, &logits, p->model->config.vocab_size, &params));
    /* the step's one wait for the device: R tokens into pinned memory */
    int32_t *h = p->host_ints + at + 5 * (size_t)R;
    gpc_tensor host = gpc_tensor_1d(h, GPC_I32, gpc_cpu(), R);
    GPC_TRY(gpc_tensor_copy(&host, &drawn));
    memcpy(tokens_out, h, (size_t)R * sizeof *tokens_out);
    return GPC_OK;
}
