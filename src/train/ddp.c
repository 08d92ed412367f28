/*
 * ddp.c: data-parallel training of a GPT: gradient buckets planned over the
 * flat buffer, launched from the model's gradient-ready hook on a
 * communication stream while backward goes on, and the optimizer step either
 * on every rank (zero 0) or on one shard per rank (zero 1). See
 * include/gpc/ddp.h for the layout reasoning.
 */
#include "gpc/ddp.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

/* ------------------------------------------------------------ planning */

static int range_by_offset(const void *a, const void *b) {
    const gpc_ddp_range *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Sorts a bucket's ranges and merges those that touch; returns the count. */
static int merge_ranges(gpc_ddp_range *r, int n) {
    qsort(r, (size_t)n, sizeof *r, range_by_offset);
    int out = 0;
    for (int i = 0; i < n; i++) {
        if (!r[i].count) continue;
        if (out && r[out - 1].offset + r[out - 1].count == r[i].offset)
            r[out - 1].count += r[i].count;
        else
            r[out++] = r[i];
    }
    return out;
}

/* Per-layer tensors are indices 2 (ln1w) .. 13 (fcprojb) of the layout;
 * 0, 1 are wte, wpe and 14, 15 lnfw, lnfb. */
#define FIRST_LAYER_TENSOR 2
#define LAST_LAYER_TENSOR 13
#define LNF_TENSOR 14

gpc_status gpc_ddp_plan_buckets(const gpt_config *c, const size_t *offsets, size_t P,
                                size_t bucket_elements, gpc_ddp_plan *out) {
    memset(out, 0, sizeof *out);
    int L = c->layers;
    if (L < 1 || offsets[LNF_TENSOR] > P)
        return gpc_error(GPC_ERR_INVALID_ARG, "bucket planning needs a model with layers");
    size_t per[GPT_NUM_PARAM_TENSORS] = {0}, layer_elements = 0;
    for (int i = FIRST_LAYER_TENSOR; i <= LAST_LAYER_TENSOR; i++) {
        per[i] = (offsets[i + 1] - offsets[i]) / (size_t)L;
        layer_elements += per[i];
    }
    int max_buckets = L + 2;
    out->buckets = gpc_calloc((size_t)max_buckets, sizeof *out->buckets);
    out->ranges = gpc_calloc((size_t)max_buckets * 16, sizeof *out->ranges);
    if (!out->buckets || !out->ranges) {
        gpc_ddp_plan_free(out);
        return gpc_error(GPC_ERR_NOMEM, "out of host memory planning gradient buckets");
    }
    if (bucket_elements == 0) { /* everything at the end, one range */
        out->buckets[0] = (gpc_ddp_bucket){-1, 0, 1, P};
        out->ranges[0] = (gpc_ddp_range){0, P};
        out->bucket_count = out->range_count = 1;
        return GPC_OK;
    }
    int hi = L - 1, first = 1;
    size_t acc = 0;
    for (int l = L - 1; l >= 0; l--) {
        acc += layer_elements;
        if (acc < bucket_elements && l > 0) continue;
        /* blocks l..hi form the next bucket */
        gpc_ddp_range *r = out->ranges + out->range_count;
        int n = 0;
        for (int i = FIRST_LAYER_TENSOR; i <= LAST_LAYER_TENSOR; i++)
            r[n++] =
                (gpc_ddp_range){offsets[i] + (size_t)l * per[i], (size_t)(hi - l + 1) * per[i]};
        if (first) r[n++] = (gpc_ddp_range){offsets[LNF_TENSOR], P - offsets[LNF_TENSOR]};
        n = merge_ranges(r, n);
        size_t elements = 0;
        for (int k = 0; k < n; k++)
            elements += r[k].count;
        out->buckets[out->bucket_count++] = (gpc_ddp_bucket){l, out->range_count, n, elements};
        out->range_count += n;
        hi = l - 1;
        acc = 0;
        first = 0;
    }
    /* wte and wpe: final after the embedding backward */
    out->ranges[out->range_count] = (gpc_ddp_range){0, offsets[FIRST_LAYER_TENSOR]};
    out->buckets[out->bucket_count++] =
        (gpc_ddp_bucket){-1, out->range_count, 1, offsets[FIRST_LAYER_TENSOR]};
    out->range_count++;
    return GPC_OK;
}

void gpc_ddp_plan_free(gpc_ddp_plan *plan) {
    gpc_free(plan->buckets);
    gpc_free(plan->ranges);
    memset(plan, 0, sizeof *plan);
}

int gpc_ddp_shard_segments(const size_t *offsets, size_t P, size_t begin, size_t end,
                           gpc_ddp_segment *segments) {
    int n = 0;
    for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++) {
        size_t lo = offsets[i], hi = i + 1 < GPT_NUM_PARAM_TENSORS ? offsets[i + 1] : P;
        size_t a = begin > lo ? begin : lo, b = end < hi ? end : hi;
        if (a < b) segments[n++] = (gpc_ddp_segment){i, a, b - a};
    }
    return n;
}

/* ------------------------------------------------------------ runtime */

struct gpc_ddp {
    gpt_model *model;
    gpc_dist *dist;
    gpc_ddp_options options;
    gpc_ddp_plan plan;
    int next_bucket;
    int cuda;
    const gpc_backend *backend;
    gpc_stream comm;       /* NULL on the CPU */
    gpc_event ready_event; /* compute stream -> comm stream */
    gpc_event done_event;  /* comm stream -> compute stream */
    size_t *shard;         /* [world + 1] offsets of the zero-1 shards */
    gpc_ddp_segment segments[GPT_NUM_PARAM_TENSORS];
    int segment_count; /* this rank's shard cut at tensor boundaries */
};

static void *at(const gpc_tensor *flat, size_t offset) {
    return (char *)flat->data + offset * gpc_dtype_size(flat->dtype);
}

/* Sends one bucket: all-reduce (zero 0), or reduce of each piece to the rank
 * whose shard holds it (zero 1). */
static gpc_status send_bucket(gpc_ddp *p, const gpc_ddp_bucket *b) {
    gpc_dist *d = p->dist;
    const gpc_tensor *g = &p->model->grads_flat;
    GPC_TRY(d->ops->group_start(d));
    for (int k = 0; k < b->range_count; k++) {
        const gpc_ddp_range *r = &p->plan.ranges[b->first_range + k];
        if (p->options.zero == 0) {
            GPC_TRY(d->ops->all_reduce_sum(d, at(g, r->offset), r->count, g->dtype, p->comm));
            continue;
        }
        for (int owner = 0; owner < d->world_size; owner++) {
            size_t lo = p->shard[owner], hi = p->shard[owner + 1];
            size_t a = r->offset > lo ? r->offset : lo;
            size_t e = r->offset + r->count < hi ? r->offset + r->count : hi;
            if (a < e) GPC_TRY(d->ops->reduce_sum(d, at(g, a), e - a, g->dtype, owner, p->comm));
        }
    }
    return d->ops->group_end(d);
}

static gpc_status on_grad_ready(void *user, int layer) {
    gpc_ddp *p = user;
    int launched = 0;
    while (p->next_bucket < p->plan.bucket_count &&
           p->plan.buckets[p->next_bucket].ready_layer >= layer) {
        if (!launched && p->cuda) {
            /* the comm stream starts after the gradients queued so far */
            GPC_TRY(p->backend->event_record(p->ready_event, NULL));
            GPC_TRY(p->backend->stream_wait_event(p->comm, p->ready_event));
        }
        launched = 1;
        GPC_TRY(send_bucket(p, &p->plan.buckets[p->next_bucket]));
        p->next_bucket++;
    }
    return GPC_OK;
}

gpc_status gpc_ddp_create(gpc_ddp **out, gpt_model *m, gpc_dist *d, const gpc_ddp_options *o) {
    *out = NULL;
    if (!m->training)
        return gpc_error(GPC_ERR_INVALID_ARG, "data parallelism needs a model created for "
                                              "training");
    if (o->zero != 0 && o->zero != 1)
        return gpc_error(GPC_ERR_INVALID_ARG, "--zero must be 0 or 1, not %d", o->zero);
    if (o->zero == 1 && m->dtype == GPC_F16)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "--zero 1 works with f32 and bf16; fp16 needs the loss-scale check on "
                         "every rank: use --zero 0 or --precision bf16");
    if (!(o->bucket_mb >= 0))
        return gpc_error(GPC_ERR_INVALID_ARG, "--bucket-mb must not be negative");
    gpc_ddp *p = gpc_calloc(1, sizeof *p);
    if (!p) return gpc_error(GPC_ERR_NOMEM, "out of host memory");
    p->model = m;
    p->dist = d;
    p->options = *o;
    p->cuda = m->device.type == GPC_DEVICE_CUDA;
    size_t elem = gpc_dtype_size(m->dtype);
    size_t bucket_elements = (size_t)(o->bucket_mb * 1048576.0 / (double)elem);
    if (o->bucket_mb > 0 && bucket_elements == 0) bucket_elements = 1;
    gpc_status s =
        gpc_ddp_plan_buckets(&m->config, m->param_offset, m->num_params, bucket_elements, &p->plan);
    if (s == GPC_OK) s = gpc_backend_require(m->device, &p->backend);
    if (s == GPC_OK && p->cuda) {
        s = p->backend->stream_create(m->device.index, &p->comm);
        if (s == GPC_OK) s = p->backend->event_create(&p->ready_event);
        if (s == GPC_OK) s = p->backend->event_create(&p->done_event);
    }
    if (s == GPC_OK) {
        p->shard = gpc_calloc((size_t)d->world_size + 1, sizeof *p->shard);
        if (!p->shard) s = gpc_error(GPC_ERR_NOMEM, "out of host memory");
    }
    if (s == GPC_OK) {
        /* 64 elements keep every shard's start aligned for vector loads */
        gpc_dist_shard_offsets(m->num_params, d->world_size, 64, p->shard);
        p->segment_count = gpc_ddp_shard_segments(m->param_offset, m->num_params, p->shard[d->rank],
                                                  p->shard[d->rank + 1], p->segments);
        size_t lo = p->shard[d->rank], hi = p->shard[d->rank + 1];
        if (gpt_is_sharded(m) &&
            (o->zero != 1 || m->shard_offset != lo || m->shard_offset + m->shard_count != hi))
            s = gpc_error(GPC_ERR_INVALID_ARG,
                          "the model holds the optimizer state of elements [%zu, %zu), but "
                          "%s; create it with gpt_create_shard over this rank's shard "
                          "(gpc_dist_shard_offsets, align 64) or whole with gpt_create",
                          m->shard_offset, m->shard_offset + m->shard_count,
                          o->zero != 1 ? "--zero 0 updates every element on every rank"
                                       : "this rank's ZeRO-1 shard is another range");
    }
    if (s == GPC_OK) {
        /* every rank starts from rank 0's weights; a sharded model's master
         * shard was set on its own rank from the same values */
        s = d->ops->broadcast(d, m->params_flat.data, m->num_params, m->dtype, 0, NULL);
        if (s == GPC_OK && m->master_flat.data && !gpt_is_sharded(m))
            s = d->ops->broadcast(d, m->master_flat.data, m->num_params, GPC_F32, 0, NULL);
    }
    if (s != GPC_OK) {
        gpc_ddp_free(p);
        return s;
    }
    *out = p;
    return GPC_OK;
}

void gpc_ddp_free(gpc_ddp *p) {
    if (!p) return;
    if (p->model && p->model->grad_ready_user == p) {
        p->model->grad_ready = NULL;
        p->model->grad_ready_user = NULL;
    }
    if (p->backend) {
        if (p->ready_event) p->backend->event_destroy(p->ready_event);
        if (p->done_event) p->backend->event_destroy(p->done_event);
        if (p->comm) p->backend->stream_destroy(p->comm);
    }
    gpc_ddp_plan_free(&p->plan);
    gpc_free(p->shard);
    gpc_free(p);
}

const gpc_ddp_plan *gpc_ddp_get_plan(const gpc_ddp *p) {
    return &p->plan;
}

gpc_status gpc_ddp_micro_step(gpc_ddp *p, int last) {
    gpt_model *m = p->model;
    p->next_bucket = 0;
    int send = last && !p->options.no_comm;
    m->grad_ready = send ? on_grad_ready : NULL;
    m->grad_ready_user = send ? p : NULL;
    if (last) p->dist->ops->watch(p->dist, 1);
    return GPC_OK;
}

gpc_status gpc_ddp_finish_backward(gpc_ddp *p) {
    gpt_model *m = p->model;
    int sent = m->grad_ready != NULL;
    m->grad_ready = NULL;
    m->grad_ready_user = NULL;
    if (!sent) return GPC_OK;
    if (p->next_bucket != p->plan.bucket_count)
        return gpc_error(GPC_ERR_INTERNAL,
                         "backward reported %d of %d gradient buckets ready: the model's "
                         "gradient hook was not called for every block",
                         p->next_bucket, p->plan.bucket_count);
    if (p->cuda) {
        GPC_TRY(p->backend->event_record(p->done_event, p->comm));
        GPC_TRY(p->backend->stream_wait_event(NULL, p->done_event));
    }
    return GPC_OK;
}

/* ZeRO-1: AdamW on this rank's shard, then every rank gets every shard's
 * new parameters. The clipping norm is global: each rank sums the squares
 * of its shard's (already summed) gradients, and those sums are added. */
static gpc_status update_shard(gpc_ddp *p, const gpt_adamw_options *o) {
    gpt_model *m = p->model;
    gpc_dist *d = p->dist;
    /* m, v and master start at flat element base (0 for a whole model) */
    size_t base = m->shard_offset;
    int comm = !p->options.no_comm;
    gpc_tensor *norm_sq = &m->acts.norm_sq;
    GPC_TRY(gpc_tensor_zero(norm_sq));
    for (int k = 0; k < p->segment_count; k++) {
        const gpc_ddp_segment *sg = &p->segments[k];
        gpc_tensor g =
            gpc_tensor_1d(at(&m->grads_flat, sg->offset), m->dtype, m->device, (int64_t)sg->count);
        GPC_TRY(gpc_op_sum_squares(norm_sq, &g));
    }
    if (comm) GPC_TRY(d->ops->all_reduce_sum(d, norm_sq->data, 1, GPC_F32, NULL));
    for (int k = 0; k < p->segment_count; k++) {
        const gpc_ddp_segment *sg = &p->segments[k];
        int64_t n = (int64_t)sg->count;
        gpc_tensor params = gpc_tensor_1d(at(&m->params_flat, sg->offset), m->dtype, m->device, n);
        gpc_tensor grads = gpc_tensor_1d(at(&m->grads_flat, sg->offset), m->dtype, m->device, n);
        gpc_tensor mom = gpc_tensor_1d(at(&m->m_flat, sg->offset - base), GPC_F32, m->device, n);
        gpc_tensor var = gpc_tensor_1d(at(&m->v_flat, sg->offset - base), GPC_F32, m->device, n);
        gpc_tensor master;
        if (m->master_flat.data)
            master = gpc_tensor_1d(at(&m->master_flat, sg->offset - base), GPC_F32, m->device, n);
        gpc_adamw_args args;
        memset(&args, 0, sizeof args);
        args.learning_rate = o->learning_rate;
        args.beta1 = o->beta1;
        args.beta2 = o->beta2;
        args.eps = o->eps;
        args.weight_decay = gpt_param_decays(sg->tensor) ? o->weight_decay : 0.0f;
        args.step = o->step;
        args.grad_norm_sq = norm_sq;
        args.max_grad_norm = o->max_grad_norm;
        args.grad_scale = 1.0f / m->loss_scale;
        args.seed = gpt_param_round_seed(o->seed, sg->tensor);
        GPC_TRY(
            gpc_op_adamw(&params, m->master_flat.data ? &master : NULL, &grads, &mom, &var, &args));
    }
    /* norm_sq now holds the global squared norm, for gpt_read_step */
    if (!comm) return GPC_OK;
    return d->ops->all_gather(d, m->params_flat.data, p->shard, m->dtype, NULL);
}

gpc_status gpc_ddp_update(gpc_ddp *p, const gpt_adamw_options *o, int *skipped) {
    /* a sharded model has only its shard's state: the shard update even
     * without communication (benchmarks) */
    if (p->options.zero == 1 && (!p->options.no_comm || gpt_is_sharded(p->model))) {
        if (skipped) *skipped = 0;
        return update_shard(p, o);
    }
    return gpt_update(p->model, o, NULL, skipped);
}

/* Rank 0 receives one f32 array of the shards (m_flat, v_flat or
 * master_flat: the same offset in each rank's model) into host[P]. Each
 * owner broadcasts its shard in pieces through the others' gradient buffer
 * (free between steps; at least P/2 floats large). */
static gpc_status gather_array(gpc_ddp *p, size_t field, float *host) {
    gpt_model *m = p->model;
    gpc_dist *d = p->dist;
    const gpc_tensor *mine = (const gpc_tensor *)((const char *)m + field);
    size_t cap = gpc_tensor_bytes(&m->grads_flat) / sizeof(float);
    for (int owner = 0; owner < d->world_size; owner++) {
        size_t lo = p->shard[owner], n = p->shard[owner + 1] - lo;
        for (size_t done = 0; done < n; done += cap) {
            size_t k = n - done < cap ? n - done : cap;
            void *buf = d->rank == owner ? at(mine, done) : m->grads_flat.data;
            GPC_TRY(d->ops->broadcast(d, buf, k, GPC_F32, owner, NULL));
            if (d->rank != 0) continue;
            gpc_tensor src = gpc_tensor_1d(buf, GPC_F32, m->device, (int64_t)k);
            gpc_tensor dst = gpc_tensor_1d(host + lo + done, GPC_F32, gpc_cpu(), (int64_t)k);
            GPC_TRY(gpc_tensor_copy(&dst, &src));
        }
    }
    return GPC_OK;
}

gpc_status gpc_ddp_gather_state(gpc_ddp *p, gpt_host_state *out) {
    memset(out, 0, sizeof *out);
    if (p->options.zero != 1) return GPC_OK;
    gpt_model *m = p->model;
    gpc_dist *d = p->dist;
    if (!gpt_is_sharded(m)) { /* whole buffers: gather in place */
        if (m->master_flat.data)
            GPC_TRY(d->ops->all_gather(d, m->master_flat.data, p->shard, GPC_F32, NULL));
        GPC_TRY(d->ops->all_gather(d, m->m_flat.data, p->shard, GPC_F32, NULL));
        return d->ops->all_gather(d, m->v_flat.data, p->shard, GPC_F32, NULL);
    }
    gpc_status s = GPC_OK;
    if (d->rank == 0) {
        size_t bytes = m->num_params * sizeof(float);
        out->m = gpc_malloc(bytes);
        out->v = gpc_malloc(bytes);
        if (m->master_flat.data) out->master = gpc_malloc(bytes);
        if (!out->m || !out->v || (m->master_flat.data && !out->master))
            s = gpc_error(GPC_ERR_NOMEM,
                          "out of host memory gathering the optimizer state for a checkpoint "
                          "(%.1f MiB)",
                          3.0 * (double)bytes / 1048576.0);
    }
    /* every rank learns whether rank 0 can receive, so none waits alone */
    double failed = s != GPC_OK;
    gpc_status r = d->ops->all_reduce_host(d, &failed, 1);
    if (s == GPC_OK && r != GPC_OK) s = r;
    if (s == GPC_OK && failed > 0)
        s = gpc_error(GPC_ERR_NOMEM, "rank 0 is out of host memory for the checkpoint");
    if (s == GPC_OK && m->master_flat.data)
        s = gather_array(p, offsetof(gpt_model, master_flat), out->master);
    if (s == GPC_OK) s = gather_array(p, offsetof(gpt_model, m_flat), out->m);
    if (s == GPC_OK) s = gather_array(p, offsetof(gpt_model, v_flat), out->v);
    if (s != GPC_OK) gpt_host_state_free(out);
    return s;
}

gpc_status gpc_ddp_reduce_host(gpc_ddp *p, double *values, int n) {
    gpc_status s = p->dist->ops->all_reduce_host(p->dist, values, n);
    p->dist->ops->watch(p->dist, 0);
    return s;
}
