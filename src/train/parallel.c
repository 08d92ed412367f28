/*
 * parallel.c: the train layer's side of tensor parallelism: the model's tp
 * hook bound to a group's all-reduce, and the whole model gathered from
 * the group's slices for a checkpoint (include/gpc/parallel.h).
 */
#include "gpc/parallel.h"

#include <string.h>

static gpc_status tp_all_reduce(void *user, gpc_tensor *t) {
    gpc_dist *d = user;
    return d->ops->all_reduce_sum(d, t->data, (size_t)gpc_tensor_numel(t), t->dtype, NULL);
}

gpc_status gpc_tp_attach(gpt_model *m, gpc_dist *tp) {
    if (tp->world_size != gpt_tp_size(m) || tp->rank != gpt_tp_rank(m))
        return gpc_error(GPC_ERR_MISMATCH,
                         "the model is slice %d of %d but its tensor-parallel group makes this "
                         "rank %d of %d: create the model with the group's rank and size",
                         gpt_tp_rank(m), gpt_tp_size(m), tp->rank, tp->world_size);
    gpt_set_tp_reduce(m, tp_all_reduce, tp);
    return GPC_OK;
}

/* Rank 0 of the group receives every rank's local f32 array (mine: this
 * rank's, on the device) and puts it into the whole layout in full. Each
 * owner broadcasts in pieces through the others' gradient buffer. */
static gpc_status gather_one(gpt_model *m, gpc_dist *d, const gpc_tensor *mine, float *local,
                             float *full) {
    const gpt_config *c = gpt_get_config(m);
    const gpc_tensor *grads = gpt_grads_flat(m);
    size_t n = gpt_num_params(m), cap = gpc_tensor_bytes(grads) / sizeof(float);
    for (int owner = 0; owner < d->world_size; owner++) {
        for (size_t done = 0; done < n; done += cap) {
            size_t k = n - done < cap ? n - done : cap;
            void *buf = (float *)mine->data + done;
            if (owner != 0) { /* rank 0's own array needs no message */
                if (d->rank != owner) buf = grads->data;
                GPC_TRY(d->ops->broadcast(d, buf, k, GPC_F32, owner, NULL));
            }
            if (d->rank != 0) continue;
            gpc_tensor src = gpc_tensor_1d(buf, GPC_F32, mine->device, (int64_t)k);
            gpc_tensor dst = gpc_tensor_1d(local + done, GPC_F32, gpc_cpu(), (int64_t)k);
            GPC_TRY(gpc_tensor_copy(&dst, &src));
        }
        if (d->rank == 0) gpt_tp_unslice(c, d->world_size, owner, local, full);
    }
    return GPC_OK;
}

gpc_status gpc_tp_gather_full(gpt_model *m, gpc_dist *d, gpt_host_state *out) {
    memset(out, 0, sizeof *out);
    if (gpt_is_sharded(m))
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "gathering a tensor-parallel model whose optimizer state is a ZeRO-1 "
                         "shard is not supported: train with --zero 0 beside --tp");
    const gpc_optim *opt = gpt_optimizer(m);
    const gpc_tensor *params = gpc_optim_master(opt) ? gpc_optim_master(opt) : gpt_params_flat(m);
    if (params->dtype != GPC_F32 || !gpt_is_training(m))
        return gpc_error(GPC_ERR_INVALID_ARG, "gathering a tensor-parallel model needs a training "
                                              "model with f32 parameters or master weights");
    size_t P = gpt_config_num_params(gpt_get_config(m)), Pl = gpt_num_params(m);
    float *local = NULL;
    gpc_status s = GPC_OK;
    if (d->rank == 0) {
        out->master = gpc_malloc(P * sizeof(float));
        out->m = gpc_malloc(P * sizeof(float));
        out->v = gpc_malloc(P * sizeof(float));
        local = gpc_malloc(Pl * sizeof(float));
        if (!out->master || !out->m || !out->v || !local)
            s = gpc_error(GPC_ERR_NOMEM,
                          "out of host memory gathering the model for a checkpoint (%.1f MiB)",
                          (3.0 * (double)P + (double)Pl) * 4.0 / 1048576.0);
    }
    /* every rank learns whether rank 0 can receive, so none waits alone */
    double failed = s != GPC_OK;
    gpc_status r = d->ops->all_reduce_host(d, &failed, 1);
    if (s == GPC_OK && r != GPC_OK) s = r;
    if (s == GPC_OK && failed > 0)
        s = gpc_error(GPC_ERR_NOMEM, "rank 0 of the tensor-parallel group is out of host memory");
    if (s == GPC_OK) s = gather_one(m, d, params, local, out->master);
    if (s == GPC_OK) s = gather_one(m, d, gpc_optim_m(opt), local, out->m);
    if (s == GPC_OK) s = gather_one(m, d, gpc_optim_v(opt), local, out->v);
    gpc_free(local);
    if (s != GPC_OK) gpt_host_state_free(out);
    return s;
}
