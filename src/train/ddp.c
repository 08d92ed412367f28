/*
 * ddp.c: data-parallel training of a GPT: gradient buckets planned over the
 * flat buffer, launched from the model's gradient-ready hook on a
 * communication stream while backward goes on, and the optimizer step either
 * on every rank (zero 0) or on one shard per rank (zero 1). See
 * include/gpc/ddp.h for the layout reasoning.
 */
#include "gpc/ddp.h"

#include <stdlib.h>
#include <string.h>

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
    gpc_event start_event; /* the comm stream's first launch of the step */
    gpc_event end_event;   /* the compute stream at the end of backward */
    double host_comm_s;    /* CPU: seconds the step's sends blocked */
    double bytes_sent;     /* the step's gradient bytes handed to the exchange */
    size_t *shard;         /* [world + 1] offsets of the zero-1 shards */
    int hooked;            /* the model's gradient-ready hook is this one */
};

static void *at(const gpc_tensor *flat, size_t offset) {
    return (char *)flat->data + offset * gpc_dtype_size(flat->dtype);
}

/* Sends one bucket: all-reduce (zero 0), or reduce of each piece to the rank
 * whose shard holds it (zero 1). */
static gpc_status send_bucket(gpc_ddp *p, const gpc_ddp_bucket *b) {
    gpc_dist *d = p->dist;
    const gpc_tensor *g = gpt_grads_flat(p->model);
    GPC_TRY(d->ops->group_start(d));
    for (int k = 0; k < b->range_count; k++) {
        const gpc_ddp_range *r = &p->plan.ranges[b->first_range + k];
        p->bytes_sent += (double)r->count * (double)gpc_dtype_size(g->dtype);
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
            if (p->next_bucket == 0) GPC_TRY(p->backend->event_record(p->start_event, p->comm));
        }
        launched = 1;
        double t0 = gpc_time_seconds();
        GPC_TRY(send_bucket(p, &p->plan.buckets[p->next_bucket]));
        if (!p->cuda) p->host_comm_s += gpc_time_seconds() - t0;
        p->next_bucket++;
    }
    return GPC_OK;
}

gpc_status gpc_ddp_create(gpc_ddp **out, gpt_model *m, gpc_dist *d, const gpc_ddp_options *o) {
    *out = NULL;
    if (!gpt_is_training(m))
        return gpc_error(GPC_ERR_INVALID_ARG, "data parallelism needs a model created for "
                                              "training");
    if (o->zero != 0 && o->zero != 1)
        return gpc_error(GPC_ERR_INVALID_ARG, "--zero must be 0 or 1, not %d", o->zero);
    if (!(o->bucket_mb >= 0))
        return gpc_error(GPC_ERR_INVALID_ARG, "--bucket-mb must not be negative");
    gpc_ddp *p = gpc_calloc(1, sizeof *p);
    if (!p) return gpc_error(GPC_ERR_NOMEM, "out of host memory");
    p->model = m;
    p->dist = d;
    p->options = *o;
    gpc_device device = gpt_device(m);
    gpc_dtype dtype = gpt_dtype(m);
    size_t P = gpt_num_params(m), shard_offset, shard_count;
    gpt_shard_range(m, &shard_offset, &shard_count);
    p->cuda = device.type == GPC_DEVICE_CUDA;
    size_t elem = gpc_dtype_size(dtype);
    size_t bucket_elements = (size_t)(o->bucket_mb * 1048576.0 / (double)elem);
    if (o->bucket_mb > 0 && bucket_elements == 0) bucket_elements = 1;
    gpc_status s =
        gpc_ddp_plan_buckets(gpt_get_config(m), gpt_param_offsets(m), P, bucket_elements, &p->plan);
    if (s == GPC_OK) s = gpc_backend_require(device, &p->backend);
    if (s == GPC_OK && p->cuda) {
        s = p->backend->stream_create(device.index, &p->comm);
        if (s == GPC_OK) s = p->backend->event_create(&p->ready_event);
        if (s == GPC_OK) s = p->backend->event_create(&p->done_event);
        if (s == GPC_OK) s = p->backend->event_create(&p->start_event);
        if (s == GPC_OK) s = p->backend->event_create(&p->end_event);
    }
    if (s == GPC_OK) {
        p->shard = gpc_calloc((size_t)d->world_size + 1, sizeof *p->shard);
        if (!p->shard) s = gpc_error(GPC_ERR_NOMEM, "out of host memory");
    }
    if (s == GPC_OK) {
        /* 64 elements keep every shard's start aligned for vector loads */
        gpc_dist_shard_offsets(P, d->world_size, 64, p->shard);
        size_t lo = p->shard[d->rank], hi = p->shard[d->rank + 1];
        if (gpt_is_sharded(m) &&
            (o->zero != 1 || shard_offset != lo || shard_offset + shard_count != hi))
            s = gpc_error(GPC_ERR_INVALID_ARG,
                          "the model holds the optimizer state of elements [%zu, %zu), but "
                          "%s; create it with gpt_create_shard over this rank's shard "
                          "(gpc_dist_shard_offsets, align 64) or whole with gpt_create",
                          shard_offset, shard_offset + shard_count,
                          o->zero != 1 ? "--zero 0 updates every element on every rank"
                                       : "this rank's ZeRO-1 shard is another range");
    }
    if (s == GPC_OK) {
        /* every rank starts from rank 0's weights; a sharded model's master
         * shard was set on its own rank from the same values */
        const gpc_tensor *master = gpc_optim_master(gpt_optimizer(m));
        s = d->ops->broadcast(d, gpt_params_flat(m)->data, P, dtype, 0, NULL);
        if (s == GPC_OK && master && !gpt_is_sharded(m))
            s = d->ops->broadcast(d, master->data, P, GPC_F32, 0, NULL);
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
    if (p->hooked) gpt_set_grad_ready(p->model, NULL, NULL);
    if (p->backend) {
        if (p->ready_event) p->backend->event_destroy(p->ready_event);
        if (p->done_event) p->backend->event_destroy(p->done_event);
        if (p->start_event) p->backend->event_destroy(p->start_event);
        if (p->end_event) p->backend->event_destroy(p->end_event);
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
    p->next_bucket = 0;
    p->hooked = last && !p->options.no_comm;
    if (p->hooked) p->host_comm_s = p->bytes_sent = 0;
    gpt_set_grad_ready(p->model, p->hooked ? on_grad_ready : NULL, p);
    if (last) p->dist->ops->watch(p->dist, 1);
    return GPC_OK;
}

gpc_status gpc_ddp_finish_backward(gpc_ddp *p) {
    int sent = p->hooked;
    gpt_set_grad_ready(p->model, NULL, NULL);
    p->hooked = 0;
    if (!sent) return GPC_OK;
    if (p->next_bucket != p->plan.bucket_count)
        return gpc_error(GPC_ERR_INTERNAL,
                         "backward reported %d of %d gradient buckets ready: the model's "
                         "gradient hook was not called for every block",
                         p->next_bucket, p->plan.bucket_count);
    if (p->cuda) {
        GPC_TRY(p->backend->event_record(p->end_event, NULL));
        GPC_TRY(p->backend->event_record(p->done_event, p->comm));
        GPC_TRY(p->backend->stream_wait_event(NULL, p->done_event));
    }
    return GPC_OK;
}

gpc_status gpc_ddp_comm_times(gpc_ddp *p, double *exposed_ms, double *busy_ms, double *bus_gbs) {
    *exposed_ms = *busy_ms = *bus_gbs = 0;
    if (p->bytes_sent <= 0) return GPC_OK;
    if (p->cuda) {
        float exposed = 0, busy = 0;
        /* the wait is the comm stream's end past backward's end, if any */
        GPC_TRY(p->backend->event_elapsed_ms(p->end_event, p->done_event, &exposed));
        GPC_TRY(p->backend->event_elapsed_ms(p->start_event, p->done_event, &busy));
        *exposed_ms = exposed > 0 ? exposed : 0;
        *busy_ms = busy > 0 ? busy : 0;
    } else {
        *exposed_ms = *busy_ms = p->host_comm_s * 1e3;
    }
    int n = p->dist->world_size;
    double factor = p->options.zero == 0 ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
    if (*busy_ms > 0) *bus_gbs = p->bytes_sent * factor / (*busy_ms * 1e-3) / 1e9;
    return GPC_OK;
}

/* The squared norm of this rank's shard of the gradients, summed over the
 * ranks: the global norm, so every rank clips alike and an fp16 overflow
 * anywhere skips the step everywhere. */
static gpc_status reduce_norm(void *user, gpc_tensor *norm_sq) {
    gpc_dist *d = user;
    return d->ops->all_reduce_sum(d, norm_sq->data, 1, GPC_F32, NULL);
}

gpc_status gpc_ddp_update(gpc_ddp *p, const gpc_optim_options *o, int *skipped) {
    gpt_model *m = p->model;
    gpc_dist *d = p->dist;
    int comm = !p->options.no_comm;
    /* zero 0, or zero 1 without communication on a whole model: every
     * rank steps everything */
    if (p->options.zero == 0 || (!comm && !gpt_is_sharded(m)))
        return gpt_update(m, o, NULL, skipped);
    /* ZeRO-1: AdamW on this rank's shard (even without communication, for
     * benchmarks: a sharded model holds only its shard's state), then
     * every rank gets every shard's new parameters */
    GPC_TRY(gpt_update_span(m, o, p->shard[d->rank], p->shard[d->rank + 1],
                            comm ? reduce_norm : NULL, d, NULL, skipped));
    if (!comm) return GPC_OK;
    const gpc_tensor *params = gpt_params_flat(m);
    return d->ops->all_gather(d, params->data, p->shard, params->dtype, NULL);
}

/* Rank 0 receives one f32 array of the shards (the optimizer's m, v or
 * master: each rank's own) into host[P]. Each owner broadcasts its shard
 * in pieces through the others' gradient buffer (free between steps; at
 * least P/2 floats large). */
static gpc_status gather_array(gpc_ddp *p, const gpc_tensor *mine, float *host) {
    gpc_dist *d = p->dist;
    const gpc_tensor *grads = gpt_grads_flat(p->model);
    size_t cap = gpc_tensor_bytes(grads) / sizeof(float);
    for (int owner = 0; owner < d->world_size; owner++) {
        size_t lo = p->shard[owner], n = p->shard[owner + 1] - lo;
        for (size_t done = 0; done < n; done += cap) {
            size_t k = n - done < cap ? n - done : cap;
            void *buf = d->rank == owner ? at(mine, done) : grads->data;
            GPC_TRY(d->ops->broadcast(d, buf, k, GPC_F32, owner, NULL));
            if (d->rank != 0) continue;
            gpc_tensor src = gpc_tensor_1d(buf, GPC_F32, grads->device, (int64_t)k);
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
    const gpc_optim *opt = gpt_optimizer(m);
    const gpc_tensor *master = gpc_optim_master(opt), *mom = gpc_optim_m(opt);
    const gpc_tensor *var = gpc_optim_v(opt);
    if (!gpt_is_sharded(m)) { /* whole buffers: gather in place */
        if (master) GPC_TRY(d->ops->all_gather(d, master->data, p->shard, GPC_F32, NULL));
        GPC_TRY(d->ops->all_gather(d, mom->data, p->shard, GPC_F32, NULL));
        return d->ops->all_gather(d, var->data, p->shard, GPC_F32, NULL);
    }
    gpc_status s = GPC_OK;
    if (d->rank == 0) {
        size_t bytes = gpt_num_params(m) * sizeof(float);
        out->m = gpc_malloc(bytes);
        out->v = gpc_malloc(bytes);
        if (master) out->master = gpc_malloc(bytes);
        if (!out->m || !out->v || (master && !out->master))
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
    if (s == GPC_OK && master) s = gather_array(p, master, out->master);
    if (s == GPC_OK) s = gather_array(p, mom, out->m);
    if (s == GPC_OK) s = gather_array(p, var, out->v);
    if (s != GPC_OK) gpt_host_state_free(out);
    return s;
}

gpc_status gpc_ddp_reduce_host(gpc_ddp *p, double *values, int n) {
    gpc_status s = p->dist->ops->all_reduce_host(p->dist, values, n);
    p->dist->ops->watch(p->dist, 0);
    return s;
}
