/*
 * optim.c: the one optimizer of gpc: AdamW over a list of trainable ranges
 * of flat parameter and gradient buffers, with f32 master weights for bf16
 * and fp16 parameters, fp16 dynamic loss scaling, and the state of one
 * ZeRO-1 shard only when asked. Single-process training, data parallelism
 * and ZeRO-1 all step through gpc_optim_step (see include/gpc/optim.h).
 *
 * The ranges are clipped to the shard once, at creation ("pieces"). A step
 * launches one AdamW per piece, since weight decay and the rounding seed
 * are per tensor; the norm and the master copies walk maximal runs of
 * touching pieces, so a whole model's norm is one reduction, as before the
 * optimizer took ranges.
 *
 * Offloaded, the state sits in pinned host memory and a step streams the
 * gradients down and the weights up in chunks, on a host thread of its own
 * when the step overlaps the next forward (see the offload section).
 */
#include "gpc/optim.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

/* A range clipped to the shard: flat elements [offset, offset + count),
 * state elements [state, state + count). */
typedef struct {
    size_t offset, count, state;
    int decay;
    uint32_t round_id;
} piece;

/* An offloaded copy-and-update chunk: flat elements [offset, offset +
 * count) of one run of touching pieces, state elements from state on, in
 * the update order's group. */
typedef struct {
    size_t offset, count, state;
    int group;
} chunk;

/* The offloaded optimizer's host side: one pinned block holding the state
 * and the staging buffers (indexed like the state), the two copy streams,
 * an event per chunk for "its gradients are on the host" and one per group
 * for "its weights are on their way up", and the thread of an overlapped
 * update with what it shares with the caller (under lock). */
typedef struct {
    const gpc_backend *backend;
    void *block;
    size_t bytes;
    void *grads;  /* [state_count] gradients, compute dtype */
    void *params; /* [state_count] weights, compute dtype, on their way up */
    float *norm;  /* the step's squared gradient norm */
    chunk *chunks;
    int chunk_count;
    gpc_stream down, up;
    gpc_event ready;      /* on the device's stream: the gradients and norm are final */
    gpc_event uploaded;   /* on up: the last weights are on the device */
    gpc_event *arrived;   /* on down, per chunk */
    gpc_event downloaded; /* on down: every gradient is on the host */
    gpc_event *group_up;  /* on up, per group: its last chunk is queued */
    int group_count;

    pthread_t worker;
    int worker_started, lock_made;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int job;       /* an update queued for the worker */
    int running;   /* an update queued or running: the state is not final */
    int published; /* groups whose uploads are queued, of the running update */
    int quit;
    int synced; /* the device's stream waits for the last update's uploads */
    gpc_status job_status;
    char job_error[256];
    gpc_tensor job_params;
    gpc_optim_options job_options;
    float job_scale;
} offload_side;

struct gpc_optim {
    gpc_device device;
    gpc_dtype dtype;
    int moments;
    size_t shard_begin, shard_end;
    piece *pieces;
    int piece_count;
    size_t state_count;
    size_t flat_end; /* where the last range ends: the flat buffers are at least this long */
    gpc_tensor master, m, v; /* data NULL where absent */
    gpc_arena own;           /* gpc_optim_alloc's arena */
    int offload;
    size_t offload_chunk;
    gpc_optim_span *order; /* gpc_optim_set_offload_order's spans, or NULL */
    int order_count;
    offload_side host; /* offloaded only */

    float loss_scale;        /* fp16: the loss is multiplied by this before backward */
    int good_steps;          /* fp16: steps since the scale last changed */
    int check_pending;       /* fp16: the last step's overflow verdict is on the device */
    gpc_tensor pending_norm; /* where that verdict's squared norm is */
    int step_skipped;
};

void gpc_optim_defaults(gpc_optim_options *o) {
    memset(o, 0, sizeof *o);
    o->learning_rate = 6e-4f;
    o->beta1 = 0.9f;
    o->beta2 = 0.95f;
    o->eps = 1e-8f;
    o->weight_decay = 0.1f;
    o->max_grad_norm = 1.0f;
    o->step = 1;
}

/* Knuth's multiplicative hash of the step's seed, plus twice the id: the
 * low bit that the | 1 sets carries no id, so ids never share a seed. */
uint32_t gpc_optim_round_seed(uint32_t step_seed, uint32_t round_id) {
    return step_seed ? (step_seed * 2654435761u + 2u * round_id) | 1u : 0;
}

gpc_status gpc_optim_create(gpc_optim **out, const gpc_optim_layout *l) {
    *out = NULL;
    if (l->dtype != GPC_F32 && l->dtype != GPC_BF16 && l->dtype != GPC_F16)
        return gpc_error(GPC_ERR_INVALID_ARG, "the optimizer updates f32, bf16 or fp16, not %s",
                         gpc_dtype_name(l->dtype));
    if (l->range_count < 0 || (l->range_count > 0 && !l->ranges))
        return gpc_error(GPC_ERR_INVALID_ARG, "the optimizer needs a list of ranges to train");
    if (l->shard_begin > l->shard_end)
        return gpc_error(GPC_ERR_INVALID_ARG, "optimizer shard [%zu, %zu) ends before it starts",
                         l->shard_begin, l->shard_end);
    for (int i = 0; i < l->range_count; i++) {
        const gpc_optim_range *r = &l->ranges[i];
        if (r->count > SIZE_MAX - r->offset ||
            (i && r->offset < l->ranges[i - 1].offset + l->ranges[i - 1].count))
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "optimizer range %d [%zu, +%zu) overlaps the one before or is out "
                             "of order; list the trainable ranges by ascending offset",
                             i, r->offset, r->count);
    }
    gpc_optim *o = gpc_calloc(1, sizeof *o);
    if (o && l->range_count) o->pieces = gpc_calloc((size_t)l->range_count, sizeof *o->pieces);
    if (!o || (l->range_count && !o->pieces)) {
        gpc_free(o);
        return gpc_error(GPC_ERR_NOMEM, "out of host memory creating the optimizer");
    }
    o->device = l->device;
    o->dtype = l->dtype;
    o->moments = l->moments ? 1 : 0;
    o->shard_begin = l->shard_begin;
    o->shard_end = l->shard_end;
    o->loss_scale = l->dtype == GPC_F16 ? 4096.0f : 1.0f;
    o->offload = l->offload ? 1 : 0;
    o->offload_chunk = l->offload_chunk ? l->offload_chunk : GPC_OPTIM_OFFLOAD_CHUNK;
    for (int i = 0; i < l->range_count; i++) {
        const gpc_optim_range *r = &l->ranges[i];
        size_t a = r->offset > o->shard_begin ? r->offset : o->shard_begin;
        size_t e = r->offset + r->count < o->shard_end ? r->offset + r->count : o->shard_end;
        if (a >= e) continue;
        o->pieces[o->piece_count++] = (piece){a, e - a, o->state_count, r->decay, r->round_id};
        o->state_count += e - a;
    }
    if (l->range_count)
        o->flat_end = l->ranges[l->range_count - 1].offset + l->ranges[l->range_count - 1].count;
    size_t trained = 0;
    for (int i = 0; i < l->range_count; i++)
        trained += l->ranges[i].count;
    if (o->offload && trained != o->state_count) {
        gpc_optim_free(o);
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "an offloaded optimizer holds the whole state; ZeRO-1 shards are not "
                         "supported with --offload-optimizer (leave out --zero)");
    }
    *out = o;
    return GPC_OK;
}

gpc_status gpc_optim_place(gpc_optim *o, gpc_arena *arena) {
    if (o->offload) return GPC_OK; /* host memory, from gpc_optim_alloc */
    int64_t n = (int64_t)o->state_count;
    if (o->dtype != GPC_F32) GPC_TRY(gpc_arena_tensor(arena, &o->master, GPC_F32, 1, &n));
    if (o->moments) {
        GPC_TRY(gpc_arena_tensor(arena, &o->m, GPC_F32, 1, &n));
        GPC_TRY(gpc_arena_tensor(arena, &o->v, GPC_F32, 1, &n));
    }
    return GPC_OK;
}

static gpc_status offload_alloc(gpc_optim *o);
static void offload_free(gpc_optim *o);

gpc_status gpc_optim_alloc(gpc_optim *o) {
    if (o->offload) {
        GPC_TRY(offload_alloc(o));
        return gpc_optim_zero(o);
    }
    gpc_arena measure;
    gpc_arena_measure(&measure, o->device);
    GPC_TRY(gpc_optim_place(o, &measure));
    gpc_arena_destroy(&o->own);
    gpc_status s = gpc_arena_create(&o->own, o->device, measure.peak);
    if (s != GPC_OK)
        return gpc_error_context(s, "allocating %.1f MiB of optimizer state on %s: ",
                                 (double)measure.peak / (1 << 20), gpc_device_name(o->device));
    GPC_TRY(gpc_optim_place(o, &o->own));
    return gpc_optim_zero(o);
}

gpc_status gpc_optim_zero(gpc_optim *o) {
    GPC_TRY(gpc_optim_settle(o));
    if (o->master.data) GPC_TRY(gpc_tensor_zero(&o->master));
    if (o->m.data) GPC_TRY(gpc_tensor_zero(&o->m));
    if (o->v.data) GPC_TRY(gpc_tensor_zero(&o->v));
    return GPC_OK;
}

void gpc_optim_free(gpc_optim *o) {
    if (!o) return;
    offload_free(o);
    gpc_arena_destroy(&o->own);
    gpc_free(o->pieces);
    gpc_free(o->order);
    gpc_free(o);
}

int gpc_optim_offloaded(const gpc_optim *o) {
    return o->offload;
}

size_t gpc_optim_host_bytes(const gpc_optim *o) {
    return o->host.bytes;
}

size_t gpc_optim_state_count(const gpc_optim *o) {
    return o->state_count;
}

/* The accessors of the state wait for a running update first (its error,
 * if any, stays for the next wait or step to report). */
static void settle_quietly(const gpc_optim *o) {
    if (__atomic_load_n(&o->host.running, __ATOMIC_ACQUIRE)) (void)gpc_optim_settle((gpc_optim *)o);
}

const gpc_tensor *gpc_optim_master(const gpc_optim *o) {
    settle_quietly(o);
    return o->master.data ? &o->master : NULL;
}

float *gpc_optim_host_master(const gpc_optim *o, size_t count) {
    settle_quietly(o);
    if (!o->offload || !o->master.data || o->state_count != count) return NULL;
    for (int i = 0; i < o->piece_count; i++)
        if (o->pieces[i].state != o->pieces[i].offset) return NULL;
    return o->master.data;
}

const gpc_tensor *gpc_optim_m(const gpc_optim *o) {
    settle_quietly(o);
    return o->m.data ? &o->m : NULL;
}

const gpc_tensor *gpc_optim_v(const gpc_optim *o) {
    settle_quietly(o);
    return o->v.data ? &o->v : NULL;
}

/* ------------------------------------------------------------ walking */

/* n elements of t from element offset on, as a 1-D tensor. */
static gpc_tensor slice(const gpc_tensor *t, size_t offset, size_t n) {
    return gpc_tensor_1d((char *)t->data + offset * gpc_dtype_size(t->dtype), t->dtype, t->device,
                         (int64_t)n);
}

/* Piece k clipped to [begin, end); 0 when nothing of it is inside. */
static int clip(const gpc_optim *o, int k, size_t begin, size_t end, piece *out) {
    const piece *p = &o->pieces[k];
    size_t a = p->offset > begin ? p->offset : begin;
    size_t e = p->offset + p->count < end ? p->offset + p->count : end;
    if (a >= e) return 0;
    *out = *p;
    out->offset = a;
    out->count = e - a;
    out->state = p->state + (a - p->offset);
    return 1;
}

/* The next maximal run of touching pieces inside [begin, end), from piece
 * *k on; 0 when there is none. */
static int next_run(const gpc_optim *o, size_t begin, size_t end, int *k, piece *run) {
    for (; *k < o->piece_count; (*k)++)
        if (clip(o, *k, begin, end, run)) break;
    if (*k == o->piece_count) return 0;
    piece more;
    for ((*k)++; *k < o->piece_count && clip(o, *k, begin, end, &more); (*k)++) {
        if (more.offset != run->offset + run->count) break;
        run->count += more.count;
    }
    return 1;
}

/* A flat buffer long enough for every range. */
static gpc_status check_flat(const gpc_optim *o, const gpc_tensor *flat) {
    if ((size_t)gpc_tensor_numel(flat) < o->flat_end)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "the optimizer's ranges end at element %zu, but the flat buffer has %lld; "
                         "pass the buffer the ranges were cut from",
                         o->flat_end, (long long)gpc_tensor_numel(flat));
    return GPC_OK;
}

gpc_status gpc_optim_set_master(gpc_optim *o, gpc_tensor *params, const float *values) {
    GPC_TRY(gpc_optim_settle(o));
    if (!o->master.data) return GPC_OK;
    GPC_TRY(check_flat(o, params));
    piece r = {0};
    for (int k = 0; next_run(o, 0, SIZE_MAX, &k, &r);) {
        gpc_tensor host =
            gpc_tensor_1d((void *)(values + r.offset), GPC_F32, gpc_cpu(), (int64_t)r.count);
        gpc_tensor master = slice(&o->master, r.state, r.count);
        GPC_TRY(gpc_tensor_copy(&master, &host));
    }
    return gpc_optim_master_to_params(o, params);
}

static gpc_status offload_master_to_params(gpc_optim *o, gpc_tensor *params);

gpc_status gpc_optim_master_to_params(gpc_optim *o, gpc_tensor *params) {
    GPC_TRY(gpc_optim_settle(o));
    if (!o->master.data) return GPC_OK;
    GPC_TRY(check_flat(o, params));
    if (o->offload) return offload_master_to_params(o, params);
    piece r = {0};
    for (int k = 0; next_run(o, 0, SIZE_MAX, &k, &r);) {
        gpc_tensor master = slice(&o->master, r.state, r.count);
        gpc_tensor low = slice(params, r.offset, r.count);
        GPC_TRY(gpc_op_convert(&low, &master));
    }
    return GPC_OK;
}

gpc_status gpc_optim_get_master(const gpc_optim *o, float *values) {
    GPC_TRY(gpc_optim_settle((gpc_optim *)o));
    if (!o->master.data) return GPC_OK;
    piece r = {0};
    for (int k = 0; next_run(o, 0, SIZE_MAX, &k, &r);) {
        gpc_tensor host = gpc_tensor_1d(values + r.offset, GPC_F32, gpc_cpu(), (int64_t)r.count);
        gpc_tensor master = slice(&o->master, r.state, r.count);
        GPC_TRY(gpc_tensor_copy(&host, &master));
    }
    return GPC_OK;
}

/* ------------------------------------------------------------ loss scale */

float gpc_optim_loss_scale(const gpc_optim *o) {
    return o->loss_scale;
}

void gpc_optim_set_loss_scale(gpc_optim *o, float scale) {
    if (scale > 0.0f) o->loss_scale = scale;
}

int gpc_optim_step_skipped(const gpc_optim *o) {
    return o->step_skipped;
}

int gpc_optim_check_pending(const gpc_optim *o) {
    return o->check_pending;
}

/* Dynamic loss scaling (Micikevicius et al. 2018), once the step's squared
 * gradient norm is on the host: a non-finite norm means the gradients
 * overflowed, so the step was skipped and the scale halves; after 1000
 * clean steps it doubles. Returns whether the step was clean. */
static int scale_update(gpc_optim *o, float norm_sq) {
    float scale = o->loss_scale;
    o->check_pending = 0;
    o->step_skipped = !isfinite(norm_sq);
    if (o->step_skipped) {
        o->loss_scale = scale > 1.0f ? scale * 0.5f : 1.0f;
        o->good_steps = 0;
        return 0;
    }
    if (++o->good_steps >= 1000 && scale < 65536.0f) {
        o->loss_scale = scale * 2.0f;
        o->good_steps = 0;
    }
    return 1;
}

void gpc_optim_observe_norm(gpc_optim *o, float norm_sq) {
    if (o->check_pending) scale_update(o, norm_sq);
}

static gpc_status read_scalar(const gpc_tensor *dev, float *out) {
    gpc_tensor host = gpc_tensor_1d(out, GPC_F32, gpc_cpu(), 1);
    return gpc_tensor_copy(&host, dev);
}

gpc_status gpc_optim_resolve(gpc_optim *o) {
    if (!o->check_pending) return GPC_OK;
    float sq;
    GPC_TRY(read_scalar(&o->pending_norm, &sq));
    scale_update(o, sq);
    return GPC_OK;
}

/* ------------------------------------------------------------ the step */

static gpc_status offload_step(gpc_optim *o, gpc_tensor *params, const gpc_tensor *grads,
                               size_t begin, size_t end, gpc_tensor *norm_sq,
                               const gpc_optim_options *opt, float *grad_norm, int *skipped);

/* AdamW's arguments for piece p of a step. */
static gpc_adamw_args adamw_args(const piece *p, const gpc_optim_options *opt,
                                 const gpc_tensor *norm_sq, float scale, int on_device) {
    gpc_adamw_args args;
    memset(&args, 0, sizeof args);
    args.learning_rate = opt->learning_rate;
    args.beta1 = opt->beta1;
    args.beta2 = opt->beta2;
    args.eps = opt->eps;
    args.weight_decay = p->decay ? opt->weight_decay : 0.0f;
    args.step = opt->step;
    args.grad_norm_sq = norm_sq;
    args.max_grad_norm = opt->max_grad_norm;
    args.grad_scale = 1.0f / scale;
    args.skip_nonfinite = on_device;
    args.seed = gpc_optim_round_seed(opt->seed, p->round_id);
    return args;
}

/* A span inside the shard, over a flat buffer that holds every range. */
static gpc_status check_span(const gpc_optim *o, const gpc_tensor *flat, size_t begin, size_t end) {
    GPC_TRY(check_flat(o, flat));
    if (begin > end || begin < o->shard_begin || end > o->shard_end)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "the optimizer holds the state of elements [%zu, %zu) only, not of "
                         "[%zu, %zu); step the shard this process owns",
                         o->shard_begin, o->shard_end, begin, end);
    return GPC_OK;
}

gpc_status gpc_optim_norm_sq(gpc_optim *o, const gpc_tensor *grads, size_t begin, size_t end,
                             gpc_tensor *norm_sq) {
    GPC_TRY(check_span(o, grads, begin, end));
    /* the last step's verdict may be in this very buffer */
    GPC_TRY(gpc_optim_resolve(o));
    GPC_TRY(gpc_tensor_zero(norm_sq));
    piece r = {0};
    for (int k = 0; next_run(o, begin, end, &k, &r);) {
        gpc_tensor g = slice(grads, r.offset, r.count);
        GPC_TRY(gpc_op_sum_squares(norm_sq, &g));
    }
    return GPC_OK;
}

gpc_status gpc_optim_step(gpc_optim *o, gpc_tensor *params, const gpc_tensor *grads, size_t begin,
                          size_t end, gpc_tensor *norm_sq, const gpc_optim_options *opt,
                          float *grad_norm, int *skipped) {
    if (skipped) *skipped = 0;
    if (!o->moments)
        return gpc_error(GPC_ERR_INVALID_ARG, "this optimizer was created without moments (a "
                                              "model for inference); it cannot step");
    GPC_TRY(check_span(o, params, begin, end));
    GPC_TRY(check_span(o, grads, begin, end));
    o->step_skipped = 0;
    if (o->offload)
        return offload_step(o, params, grads, begin, end, norm_sq, opt, grad_norm, skipped);
    float scale = o->loss_scale;
    int on_device = 0; /* fp16: the overflow check is left to the kernels */
    if (o->dtype == GPC_F16) {
        /* An overflow shows as a non-finite norm. When the caller asks for
         * the norm or the verdict, read it now (a wait for the device);
         * otherwise AdamW itself leaves everything as it was on a
         * non-finite norm, and the verdict is read later. */
        if (grad_norm || skipped) {
            float sq;
            GPC_TRY(read_scalar(norm_sq, &sq));
            if (!scale_update(o, sq)) {
                if (skipped) *skipped = 1;
                if (grad_norm) *grad_norm = NAN;
                return GPC_OK;
            }
        } else {
            on_device = 1;
            o->check_pending = 1;
            o->pending_norm = *norm_sq;
        }
        GPC_TRY(gpc_op_scale(norm_sq, 1.0f / (scale * scale)));
    }
    piece p = {0};
    for (int k = 0; k < o->piece_count; k++) {
        if (!clip(o, k, begin, end, &p)) continue;
        gpc_tensor w = slice(params, p.offset, p.count);
        gpc_tensor g = slice(grads, p.offset, p.count);
        gpc_tensor mom = slice(&o->m, p.state, p.count);
        gpc_tensor var = slice(&o->v, p.state, p.count);
        gpc_tensor master;
        if (o->master.data) master = slice(&o->master, p.state, p.count);
        gpc_adamw_args args = adamw_args(&p, opt, norm_sq, scale, on_device);
        GPC_TRY(gpc_op_adamw(&w, o->master.data ? &master : NULL, &g, &mom, &var, &args));
    }
    if (grad_norm) {
        float sq;
        GPC_TRY(read_scalar(norm_sq, &sq));
        *grad_norm = sqrtf(sq);
    }
    return GPC_OK;
}

/* ------------------------------------------------------------ offload */

/* Bytes of n elements, rounded up to 256 so every part of the block is as
 * aligned as an arena's tensors. */
static size_t part_bytes(size_t n, gpc_dtype dtype) {
    return (n * gpc_dtype_size(dtype) + 255) & ~(size_t)255;
}

/* Cuts r into chunks of at most offload_chunk elements of the group, at
 * chunks[*n] on (counting only, with chunks NULL). */
static void cut_chunks(const gpc_optim *o, const piece *r, int group, chunk *chunks, size_t *n) {
    for (size_t done = 0; done < r->count; done += o->offload_chunk, (*n)++) {
        size_t count = r->count - done < o->offload_chunk ? r->count - done : o->offload_chunk;
        if (chunks) chunks[*n] = (chunk){r->offset + done, count, r->state + done, group};
    }
}

/* The chunks, so that a chunk is one copy each way: in the order's spans,
 * each cut at the pieces' ends; without an order, each maximal run of
 * touching pieces, as one group. Counted first, then made. */
static gpc_status make_chunks(gpc_optim *o) {
    offload_side *h = &o->host;
    size_t most = 0;
    for (int pass = 0; pass < 2; pass++) {
        size_t n = 0;
        chunk *out = pass ? h->chunks : NULL;
        piece r = {0};
        if (!o->order)
            for (int k = 0; next_run(o, 0, SIZE_MAX, &k, &r);)
                cut_chunks(o, &r, 0, out, &n);
        for (int i = 0; o->order && i < o->order_count; i++) {
            const gpc_optim_span *sp = &o->order[i];
            for (int k = 0; k < o->piece_count; k++)
                if (clip(o, k, sp->offset, sp->offset + sp->count, &r))
                    cut_chunks(o, &r, sp->group, out, &n);
        }
        if (pass == 0) {
            most = n;
            h->chunks = gpc_calloc(most ? most : 1, sizeof *h->chunks);
            h->arrived = gpc_calloc(most ? most : 1, sizeof *h->arrived);
            if (!h->chunks || !h->arrived)
                return gpc_error(GPC_ERR_NOMEM, "out of host memory creating the optimizer");
        }
        h->chunk_count = (int)n;
    }
    h->group_count = o->order ? o->order[o->order_count - 1].group + 1 : 1;
    h->group_up = gpc_calloc((size_t)h->group_count, sizeof *h->group_up);
    if (!h->group_up) return gpc_error(GPC_ERR_NOMEM, "out of host memory creating the optimizer");
    return GPC_OK;
}

static int span_offset_order(const void *a, const void *b) {
    size_t x = ((const gpc_optim_span *)a)->offset, y = ((const gpc_optim_span *)b)->offset;
    return x < y ? -1 : x > y;
}

gpc_status gpc_optim_set_offload_order(gpc_optim *o, const gpc_optim_span *spans, int count) {
    if (!o->offload) return GPC_OK;
    if (o->host.backend)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "the offloaded update's order is set before gpc_optim_alloc");
    if (count <= 0 || !spans)
        return gpc_error(GPC_ERR_INVALID_ARG, "an offloaded update's order needs spans");
    gpc_optim_span *copy = gpc_malloc((size_t)count * sizeof *copy);
    if (!copy) return gpc_error(GPC_ERR_NOMEM, "out of host memory creating the optimizer");
    memcpy(copy, spans, (size_t)count * sizeof *copy);
    size_t covered = 0;
    const char *why = NULL;
    for (int i = 0; !why && i < count; i++) {
        int g = spans[i].group, before = i ? spans[i - 1].group : 0;
        if ((i == 0 && g != 0) || (g != before && g != before + 1))
            why = "groups must start at 0 and ascend by one";
        size_t in = 0;
        piece r;
        for (int k = 0; k < o->piece_count; k++)
            if (clip(o, k, spans[i].offset, spans[i].offset + spans[i].count, &r)) in += r.count;
        if (in != spans[i].count) why = "a span holds elements that are not trained";
        covered += in;
    }
    qsort(copy, (size_t)count, sizeof *copy, span_offset_order);
    for (int i = 1; !why && i < count; i++)
        if (copy[i].offset < copy[i - 1].offset + copy[i - 1].count) why = "spans overlap";
    if (!why && covered != o->state_count) why = "the spans leave trained elements out";
    if (why) {
        gpc_free(copy);
        return gpc_error(GPC_ERR_INVALID_ARG, "offloaded update order: %s", why);
    }
    memcpy(copy, spans, (size_t)count * sizeof *copy); /* the caller's order, not sorted */
    gpc_free(o->order);
    o->order = copy;
    o->order_count = count;
    return GPC_OK;
}

static gpc_status offload_alloc(gpc_optim *o) {
    offload_free(o);
    offload_side *h = &o->host;
    GPC_TRY(gpc_backend_require(o->device, &h->backend));
    const gpc_backend *b = h->backend;
    size_t n = o->state_count, f32 = part_bytes(n, GPC_F32), low = part_bytes(n, o->dtype);
    int masters = o->dtype != GPC_F32, moments = o->moments;
    size_t bytes = (size_t)masters * f32 + (size_t)moments * 2 * f32 + 2 * low + 256;
    gpc_status s = b->alloc_host(bytes, &h->block);
    if (s != GPC_OK) {
        h->block = NULL;
        return gpc_error_context(s,
                                 "allocating %.1f MiB of pinned host memory for the offloaded "
                                 "optimizer: ",
                                 (double)bytes / (1 << 20));
    }
    h->bytes = bytes;
    char *at = h->block;
    gpc_device cpu = gpc_cpu();
    if (masters) {
        o->master = gpc_tensor_1d(at, GPC_F32, cpu, (int64_t)n);
        at += f32;
    }
    if (moments) {
        o->m = gpc_tensor_1d(at, GPC_F32, cpu, (int64_t)n);
        o->v = gpc_tensor_1d(at + f32, GPC_F32, cpu, (int64_t)n);
        at += 2 * f32;
    }
    h->grads = at;
    h->params = at + low;
    h->norm = (float *)(void *)(at + 2 * low);
    GPC_TRY(make_chunks(o));
    GPC_TRY(b->stream_create(o->device.index, &h->down));
    GPC_TRY(b->stream_create(o->device.index, &h->up));
    GPC_TRY(b->event_create(&h->ready));
    GPC_TRY(b->event_create(&h->uploaded));
    GPC_TRY(b->event_create(&h->downloaded));
    for (int c = 0; c < h->chunk_count; c++)
        GPC_TRY(b->event_create(&h->arrived[c]));
    for (int g = 0; g < h->group_count; g++)
        GPC_TRY(b->event_create(&h->group_up[g]));
    if (pthread_mutex_init(&h->lock, NULL) || pthread_cond_init(&h->cond, NULL))
        return gpc_error(GPC_ERR_INTERNAL, "cannot make the offloaded update's lock");
    h->lock_made = 1;
    return GPC_OK;
}

static void offload_free(gpc_optim *o) {
    offload_side *h = &o->host;
    const gpc_backend *b = h->backend;
    if (!b) return;
    if (h->worker_started) { /* its running update ends first */
        pthread_mutex_lock(&h->lock);
        h->quit = 1;
        pthread_cond_broadcast(&h->cond);
        pthread_mutex_unlock(&h->lock);
        pthread_join(h->worker, NULL);
    }
    if (h->lock_made) {
        pthread_mutex_destroy(&h->lock);
        pthread_cond_destroy(&h->cond);
    }
    /* copies may still be in flight into or out of the block */
    if (h->down) (void)b->stream_synchronize(h->down);
    if (h->up) (void)b->stream_synchronize(h->up);
    for (int c = 0; h->arrived && c < h->chunk_count; c++)
        if (h->arrived[c]) b->event_destroy(h->arrived[c]);
    for (int g = 0; h->group_up && g < h->group_count; g++)
        if (h->group_up[g]) b->event_destroy(h->group_up[g]);
    if (h->ready) b->event_destroy(h->ready);
    if (h->uploaded) b->event_destroy(h->uploaded);
    if (h->downloaded) b->event_destroy(h->downloaded);
    if (h->down) b->stream_destroy(h->down);
    if (h->up) b->stream_destroy(h->up);
    if (h->block) b->free_host(h->block);
    gpc_free(h->chunks);
    gpc_free(h->arrived);
    gpc_free(h->group_up);
    memset(h, 0, sizeof *h);
    o->master = o->m = o->v = (gpc_tensor){0};
}

/* Element e of a host staging buffer (indexed like the state). */
static void *staged(const gpc_optim *o, void *buffer, size_t e) {
    return (char *)buffer + e * gpc_dtype_size(o->dtype);
}

/* Chunk c's weights, from the host staging buffer to the device, on up. */
static gpc_status upload(gpc_optim *o, gpc_tensor *params, const chunk *c) {
    const gpc_backend *b = o->host.backend;
    size_t size = gpc_dtype_size(o->dtype);
    return b->copy((char *)params->data + c->offset * size, params->device,
                   staged(o, o->host.params, c->state), gpc_cpu(), c->count * size, o->host.up);
}

static gpc_status offload_master_to_params(gpc_optim *o, gpc_tensor *params) {
    offload_side *h = &o->host;
    /* the staging buffer may still be on its way up from the last step */
    GPC_TRY(h->backend->event_synchronize(h->uploaded));
    for (int i = 0; i < h->chunk_count; i++) {
        const chunk *c = &h->chunks[i];
        gpc_tensor low =
            gpc_tensor_1d(staged(o, h->params, c->state), o->dtype, gpc_cpu(), (int64_t)c->count);
        gpc_tensor master = slice(&o->master, c->state, c->count);
        GPC_TRY(gpc_op_convert(&low, &master));
        GPC_TRY(upload(o, params, c));
    }
    GPC_TRY(h->backend->event_record(h->uploaded, h->up));
    /* the device's next use of the weights comes after them */
    return h->backend->stream_wait_event(NULL, h->uploaded);
}

/* AdamW on the CPU over the part of every piece inside chunk c, from the
 * staged gradients into the staged weights. */
static gpc_status update_chunk(gpc_optim *o, const chunk *c, const gpc_optim_options *opt,
                               float scale) {
    offload_side *h = &o->host;
    gpc_device cpu = gpc_cpu();
    gpc_tensor norm = gpc_tensor_1d(h->norm, GPC_F32, cpu, 1);
    piece p;
    for (int k = 0; k < o->piece_count; k++) {
        if (!clip(o, k, c->offset, c->offset + c->count, &p)) continue;
        gpc_tensor w =
            gpc_tensor_1d(staged(o, h->params, p.state), o->dtype, cpu, (int64_t)p.count);
        gpc_tensor g = gpc_tensor_1d(staged(o, h->grads, p.state), o->dtype, cpu, (int64_t)p.count);
        gpc_tensor mom = slice(&o->m, p.state, p.count);
        gpc_tensor var = slice(&o->v, p.state, p.count);
        gpc_tensor master;
        if (o->master.data) master = slice(&o->master, p.state, p.count);
        /* the overflow verdict was taken on the host: nothing to skip here */
        gpc_adamw_args args = adamw_args(&p, opt, &norm, scale, 0);
        GPC_TRY(gpc_op_adamw(&w, o->master.data ? &master : NULL, &g, &mom, &var, &args));
    }
    return GPC_OK;
}

/* Updates every chunk in order as its gradients arrive and queues its
 * weights on the up stream; after a group's last chunk, records the group's
 * event and (publish: an overlapped update's thread) says so under the lock.
 * Then records uploaded. Stops at the first error. */
static gpc_status update_chunks(gpc_optim *o, gpc_tensor *params, const gpc_optim_options *opt,
                                float scale, int publish) {
    offload_side *h = &o->host;
    const gpc_backend *b = h->backend;
    double start = gpc_time_seconds(), waited = 0, first_group = 0;
    for (int i = 0; i < h->chunk_count; i++) {
        const chunk *c = &h->chunks[i];
        double t = gpc_time_seconds();
        GPC_TRY(b->event_synchronize(h->arrived[i]));
        waited += gpc_time_seconds() - t;
        GPC_TRY(update_chunk(o, c, opt, scale));
        GPC_TRY(upload(o, params, c));
        if (c->group == 0) first_group = gpc_time_seconds() - start;
        if (i + 1 < h->chunk_count && h->chunks[i + 1].group == c->group) continue;
        GPC_TRY(b->event_record(h->group_up[c->group], h->up));
        if (!publish) continue;
        pthread_mutex_lock(&h->lock);
        h->published = c->group + 1;
        pthread_cond_broadcast(&h->cond);
        pthread_mutex_unlock(&h->lock);
    }
    /* GPC_LOG=debug: where the host's time went (the step's bound when
     * offloaded) */
    gpc_log(GPC_LOG_DEBUG,
            "offloaded update%s: %d chunks in %.1f ms (%.1f waiting for gradients), the first "
            "group's in %.1f",
            publish ? " (overlapped)" : "", h->chunk_count, (gpc_time_seconds() - start) * 1e3,
            waited * 1e3, first_group * 1e3);
    return b->event_record(h->uploaded, h->up);
}

/* The overlapped update's thread: runs each queued update, keeps its error
 * (the message too: messages are per thread), and says when it is done. */
static void *update_thread(void *arg) {
    gpc_optim *o = arg;
    offload_side *h = &o->host;
    gpc_status made = h->backend->make_current ? h->backend->make_current(o->device.index) : GPC_OK;
    pthread_mutex_lock(&h->lock);
    for (;;) {
        while (!h->job && !h->quit)
            pthread_cond_wait(&h->cond, &h->lock);
        if (!h->job) break;
        h->job = 0;
        pthread_mutex_unlock(&h->lock);
        gpc_status s = made;
        if (s == GPC_OK) s = update_chunks(o, &h->job_params, &h->job_options, h->job_scale, 1);
        pthread_mutex_lock(&h->lock);
        if (s != GPC_OK) {
            h->job_status = s;
            snprintf(h->job_error, sizeof h->job_error, "%s", gpc_last_error());
        }
        __atomic_store_n(&h->running, 0, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&h->cond);
    }
    pthread_mutex_unlock(&h->lock);
    return NULL;
}

/* Hands the update to the thread (started on first use). */
static gpc_status start_update(gpc_optim *o, gpc_tensor *params, const gpc_optim_options *opt,
                               float scale) {
    offload_side *h = &o->host;
    if (!h->worker_started) {
        if (pthread_create(&h->worker, NULL, update_thread, o))
            return gpc_error(GPC_ERR_INTERNAL, "cannot start the offloaded update's thread");
        h->worker_started = 1;
    }
    pthread_mutex_lock(&h->lock);
    h->job_params = *params;
    h->job_options = *opt;
    h->job_scale = scale;
    h->job_status = GPC_OK;
    h->published = 0;
    h->synced = 0;
    h->job = 1;
    __atomic_store_n(&h->running, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&h->cond);
    pthread_mutex_unlock(&h->lock);
    return GPC_OK;
}

gpc_status gpc_optim_wait_group(gpc_optim *o, int group) {
    offload_side *h = &o->host;
    if (!o->offload || !h->lock_made || h->synced) return GPC_OK;
    pthread_mutex_lock(&h->lock);
    while (h->running && h->published <= group && h->job_status == GPC_OK)
        pthread_cond_wait(&h->cond, &h->lock);
    gpc_status s = h->job_status;
    int running = h->running;
    char why[sizeof h->job_error];
    memcpy(why, h->job_error, sizeof why);
    pthread_mutex_unlock(&h->lock);
    if (s != GPC_OK) return gpc_error(s, "the offloaded optimizer's update: %s", why);
    if (!running) { /* all of it: the last upload */
        GPC_TRY(h->backend->stream_wait_event(NULL, h->uploaded));
        h->synced = 1;
        return GPC_OK;
    }
    return h->backend->stream_wait_event(NULL, h->group_up[group]);
}

gpc_status gpc_optim_settle(gpc_optim *o) {
    return gpc_optim_wait_group(o, INT_MAX);
}

/* The offloaded step. The device's stream marks the gradients final; the
 * down stream then copies the norm and every chunk's gradients (f32
 * parameters too: they are their own master) into the staging buffers,
 * each chunk marked by its event. The host updates chunk after chunk as
 * each arrives and queues its weights on the up stream. Everything the
 * device does next waits for the last upload, which the host queued after
 * every download had arrived: the next backward cannot overwrite gradients
 * still being read, nor the next forward read old weights. Overlapped, the
 * host reads the norm (it comes before the first chunk), hands the chunks
 * to the update's thread and returns: the device's next work waits for the
 * downloads alone, and each group's weights are waited for where they are
 * read (gpc_optim_wait_group). */
static gpc_status offload_step(gpc_optim *o, gpc_tensor *params, const gpc_tensor *grads,
                               size_t begin, size_t end, gpc_tensor *norm_sq,
                               const gpc_optim_options *opt, float *grad_norm, int *skipped) {
    offload_side *h = &o->host;
    const gpc_backend *b = h->backend;
    if (!b)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "the offloaded optimizer has no memory: call gpc_optim_alloc first");
    if (o->piece_count && (begin > o->pieces[0].offset || end < o->flat_end))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "an offloaded optimizer steps all its elements at once, [%zu, %zu), "
                         "not [%zu, %zu)",
                         o->pieces[0].offset, o->flat_end, begin, end);
    if (grads->dtype != o->dtype || params->dtype != o->dtype)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "the offloaded optimizer was made for %s parameters and gradients, not "
                         "%s and %s",
                         gpc_dtype_name(o->dtype), gpc_dtype_name(params->dtype),
                         gpc_dtype_name(grads->dtype));
    GPC_TRY(gpc_optim_settle(o)); /* the last overlapped update */
    float scale = o->loss_scale;
    /* fp16: the norm of the unscaled gradients, on the device too, where
     * gpt_read_step reads it (a non-finite norm stays non-finite) */
    if (o->dtype == GPC_F16) GPC_TRY(gpc_op_scale(norm_sq, 1.0f / (scale * scale)));
    /* the staging buffer of weights may still be on its way up */
    GPC_TRY(b->event_synchronize(h->uploaded));
    GPC_TRY(b->event_record(h->ready, NULL));
    GPC_TRY(b->stream_wait_event(h->down, h->ready));
    GPC_TRY(b->copy(h->norm, gpc_cpu(), norm_sq->data, norm_sq->device, sizeof(float), h->down));
    size_t size = gpc_dtype_size(o->dtype);
    for (int i = 0; i < h->chunk_count; i++) {
        const chunk *c = &h->chunks[i];
        GPC_TRY(b->copy(staged(o, h->grads, c->state), gpc_cpu(),
                        (const char *)grads->data + c->offset * size, grads->device,
                        c->count * size, h->down));
        if (!o->master.data)
            GPC_TRY(b->copy(staged(o, h->params, c->state), gpc_cpu(),
                            (const char *)params->data + c->offset * size, params->device,
                            c->count * size, h->down));
        GPC_TRY(b->event_record(h->arrived[i], h->down));
    }
    GPC_TRY(b->event_record(h->downloaded, h->down));
    int clean = 1;
    /* the norm came first, with the first chunk; fp16: an overflowed step
     * is skipped whole, and the scale halves */
    gpc_status s = h->chunk_count ? b->event_synchronize(h->arrived[0]) : GPC_OK;
    if (s == GPC_OK && h->chunk_count && o->dtype == GPC_F16) clean = scale_update(o, h->norm[0]);
    if ((opt->overlap > 1 || (opt->overlap && b->type != GPC_DEVICE_CPU)) && h->chunk_count > 0) {
        GPC_TRY(s);
        if (clean) GPC_TRY(start_update(o, params, opt, scale));
        /* the next writes of the gradients wait for their copies */
        GPC_TRY(b->stream_wait_event(NULL, h->downloaded));
    } else {
        /* each chunk is waited for as it is updated */
        if (s == GPC_OK && clean) s = update_chunks(o, params, opt, scale, 0);
        /* every download has arrived (waited for above, or here when the
         * update stopped early) before the device may reuse the gradients */
        gpc_status wait = b->stream_synchronize(h->down);
        if (s == GPC_OK) s = wait;
        if (s == GPC_OK) s = b->stream_wait_event(NULL, h->uploaded);
        GPC_TRY(s);
    }
    /* nothing trained: the norm arrived with the synchronisation above */
    if (h->chunk_count == 0 && o->dtype == GPC_F16) clean = scale_update(o, h->norm[0]);
    if (skipped) *skipped = !clean;
    if (grad_norm) *grad_norm = clean ? sqrtf(h->norm[0]) : NAN;
    return GPC_OK;
}
