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
 */
#include "gpc/optim.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ops/ops.h"

/* A range clipped to the shard: flat elements [offset, offset + count),
 * state elements [state, state + count). */
typedef struct {
    size_t offset, count, state;
    int decay;
    uint32_t round_id;
} piece;

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
    *out = o;
    return GPC_OK;
}

gpc_status gpc_optim_place(gpc_optim *o, gpc_arena *arena) {
    int64_t n = (int64_t)o->state_count;
    if (o->dtype != GPC_F32) GPC_TRY(gpc_arena_tensor(arena, &o->master, GPC_F32, 1, &n));
    if (o->moments) {
        GPC_TRY(gpc_arena_tensor(arena, &o->m, GPC_F32, 1, &n));
        GPC_TRY(gpc_arena_tensor(arena, &o->v, GPC_F32, 1, &n));
    }
    return GPC_OK;
}

gpc_status gpc_optim_alloc(gpc_optim *o) {
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
    if (o->master.data) GPC_TRY(gpc_tensor_zero(&o->master));
    if (o->m.data) GPC_TRY(gpc_tensor_zero(&o->m));
    if (o->v.data) GPC_TRY(gpc_tensor_zero(&o->v));
    return GPC_OK;
}

void gpc_optim_free(gpc_optim *o) {
    if (!o) return;
    gpc_arena_destroy(&o->own);
    gpc_free(o->pieces);
    gpc_free(o);
}

size_t gpc_optim_state_count(const gpc_optim *o) {
    return o->state_count;
}

const gpc_tensor *gpc_optim_master(const gpc_optim *o) {
    return o->master.data ? &o->master : NULL;
}

const gpc_tensor *gpc_optim_m(const gpc_optim *o) {
    return o->m.data ? &o->m : NULL;
}

const gpc_tensor *gpc_optim_v(const gpc_optim *o) {
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
    if (!o->master.data) return GPC_OK;
    GPC_TRY(check_flat(o, params));
    piece r = {0};
    for (int k = 0; next_run(o, 0, SIZE_MAX, &k, &r);) {
        gpc_tensor host =
            gpc_tensor_1d((void *)(values + r.offset), GPC_F32, gpc_cpu(), (int64_t)r.count);
        gpc_tensor master = slice(&o->master, r.state, r.count);
        gpc_tensor low = slice(params, r.offset, r.count);
        GPC_TRY(gpc_tensor_copy(&master, &host));
        GPC_TRY(gpc_op_convert(&low, &master));
    }
    return GPC_OK;
}

gpc_status gpc_optim_get_master(const gpc_optim *o, float *values) {
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
        gpc_adamw_args args;
        memset(&args, 0, sizeof args);
        args.learning_rate = opt->learning_rate;
        args.beta1 = opt->beta1;
        args.beta2 = opt->beta2;
        args.eps = opt->eps;
        args.weight_decay = p.decay ? opt->weight_decay : 0.0f;
        args.step = opt->step;
        args.grad_norm_sq = norm_sq;
        args.max_grad_norm = opt->max_grad_norm;
        args.grad_scale = 1.0f / scale;
        args.skip_nonfinite = on_device;
        args.seed = gpc_optim_round_seed(opt->seed, p.round_id);
        GPC_TRY(gpc_op_adamw(&w, o->master.data ? &master : NULL, &g, &mom, &var, &args));
    }
    if (grad_norm) {
        float sq;
        GPC_TRY(read_scalar(norm_sq, &sq));
        *grad_norm = sqrtf(sq);
    }
    return GPC_OK;
}
