/*
 * parallel.c: the train layer's side of tensor parallelism: the model's tp
 * hooks bound to a group's all-reduces (sum, and max for the
 * vocabulary-parallel cross-entropy), and the whole model gathered from
 * the group's slices for a checkpoint (include/gpc/parallel.h).
 */
#include "gpc/parallel.h"

#include <string.h>

static gpc_status tp_all_reduce(void *user, gpc_tensor *t) {
    gpc_dist *d = user;
    return d->ops->all_reduce_sum(d, t->data, (size_t)gpc_tensor_numel(t), t->dtype, NULL);
}

static gpc_status tp_all_reduce_max(void *user, gpc_tensor *t) {
    gpc_dist *d = user;
    if (!d->ops->all_reduce_max)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "the %s collectives have no max all-reduce, which tensor parallelism's "
                         "cross-entropy needs: use mpi or nccl",
                         d->ops->name);
    return d->ops->all_reduce_max(d, t->data, (size_t)gpc_tensor_numel(t), t->dtype, NULL);
}

gpc_status gpc_tp_attach(gpt_model *m, gpc_dist *tp) {
    if (tp->world_size != gpt_tp_size(m) || tp->rank != gpt_tp_rank(m))
        return gpc_error(GPC_ERR_MISMATCH,
                         "the model is slice %d of %d but its tensor-parallel group makes this "
                         "rank %d of %d: create the model with the group's rank and size",
                         gpt_tp_rank(m), gpt_tp_size(m), tp->rank, tp->world_size);
    gpt_set_tp_reduce(m, tp_all_reduce, tp);
    gpt_set_tp_max(m, tp_all_reduce_max, tp);
    return GPC_OK;
}

/* Rank 0 of the group receives every rank's local f32 array (mine: this
 * rank's, on the device or the host) and puts it into the whole layout in
 * full. Each owner stages its array in pieces in its gradient buffer and
 * broadcasts them into the others'. */
static gpc_status gather_one(gpt_model *m, gpc_dist *d, const gpc_tensor *mine, float *local,
                             float *full) {
    const gpt_config *c = gpt_whole_config(m);
    const gpc_tensor *grads = gpt_grads_flat(m);
    size_t n = gpt_num_params(m), cap = gpc_tensor_bytes(grads) / sizeof(float);
    for (int owner = 0; owner < d->world_size; owner++) {
        for (size_t done = 0; done < n; done += cap) {
            size_t k = n - done < cap ? n - done : cap;
            gpc_tensor src =
                gpc_tensor_1d((float *)mine->data + done, GPC_F32, mine->device, (int64_t)k);
            gpc_tensor dst = gpc_tensor_1d(local + done, GPC_F32, gpc_cpu(), (int64_t)k);
            if (owner == 0) { /* rank 0's own array needs no message */
                if (d->rank == 0) GPC_TRY(gpc_tensor_copy(&dst, &src));
                continue;
            }
            gpc_tensor stage = gpc_tensor_1d(grads->data, GPC_F32, grads->device, (int64_t)k);
            if (d->rank == owner) GPC_TRY(gpc_tensor_copy(&stage, &src));
            GPC_TRY(d->ops->broadcast(d, stage.data, k, GPC_F32, owner, NULL));
            if (d->rank == 0) GPC_TRY(gpc_tensor_copy(&dst, &stage));
        }
        if (d->rank != 0) continue;
        /* the owner's place: rank pp_rank * tp + tp_rank of the group */
        gpt_parallel place = *gpt_parallel_of(m);
        place.tp_rank = owner % place.tp_size;
        place.pp_rank = owner / place.tp_size;
        gpt_part_unslice(c, &place, local, full);
    }
    return GPC_OK;
}

gpc_status gpc_tp_gather_full(gpt_model *m, gpc_dist *d, const gpt_host_state *state,
                              gpt_host_state *out) {
    memset(out, 0, sizeof *out);
    const gpc_optim *opt = gpt_optimizer(m);
    if (gpt_is_sharded(m) &&
        (!state || !state->m || !state->v || (gpc_optim_master(opt) && !state->master)))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "the model holds a ZeRO-1 shard of its optimizer state: gather it first "
                         "(gpc_ddp_gather_state) and pass it to gpc_tp_gather_full");
    if (!gpt_is_sharded(m)) state = NULL;
    const gpc_tensor *params = gpc_optim_master(opt) ? gpc_optim_master(opt) : gpt_params_flat(m);
    if (params->dtype != GPC_F32 || !gpt_is_training(m))
        return gpc_error(GPC_ERR_INVALID_ARG, "gathering a tensor-parallel model needs a training "
                                              "model with f32 parameters or master weights");
    const gpt_parallel *par = gpt_parallel_of(m);
    if (d->world_size != par->tp_size * par->pp_size ||
        d->rank != par->pp_rank * par->tp_size + par->tp_rank)
        return gpc_error(GPC_ERR_MISMATCH,
                         "gathering a model's parts needs the group of its %d x %d parts, with "
                         "this part as rank %d; the group has %d ranks and this is rank %d",
                         par->tp_size, par->pp_size, par->pp_rank * par->tp_size + par->tp_rank,
                         d->world_size, d->rank);
    size_t P = gpt_config_num_params(gpt_whole_config(m)), Pl = gpt_num_params(m);
    /* a ZeRO-1 part's whole local state, gathered on the host */
    gpc_tensor host_master, host_m, host_v;
    const gpc_tensor *src_m = gpc_optim_m(opt), *src_v = gpc_optim_v(opt);
    if (state) {
        host_m = gpc_tensor_1d(state->m, GPC_F32, gpc_cpu(), (int64_t)Pl);
        host_v = gpc_tensor_1d(state->v, GPC_F32, gpc_cpu(), (int64_t)Pl);
        src_m = &host_m, src_v = &host_v;
        if (state->master) {
            host_master = gpc_tensor_1d(state->master, GPC_F32, gpc_cpu(), (int64_t)Pl);
            params = &host_master;
        }
    }
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
    if (s == GPC_OK) s = gather_one(m, d, src_m, local, out->m);
    if (s == GPC_OK) s = gather_one(m, d, src_v, local, out->v);
    gpc_free(local);
    if (s != GPC_OK) gpt_host_state_free(out);
    return s;
}

/* ------------------------------------------------------------ pipeline */

static gpc_status pp_all_reduce(void *user, gpc_tensor *t) {
    gpc_dist *d = user;
    return d->ops->all_reduce_sum(d, t->data, (size_t)gpc_tensor_numel(t), t->dtype, NULL);
}

gpc_status gpc_pipeline_attach(gpt_model *m, gpc_dist *pp) {
    const gpt_parallel *par = gpt_parallel_of(m);
    if (pp->world_size != par->pp_size || pp->rank != par->pp_rank)
        return gpc_error(GPC_ERR_MISMATCH,
                         "the model is stage %d of %d but its pipeline group makes this rank %d "
                         "of %d: create the model with the group's rank and size",
                         par->pp_rank, par->pp_size, pp->rank, pp->world_size);
    gpt_set_pp_reduce(m, pp_all_reduce, pp);
    return GPC_OK;
}

/* One stage's view of the step: its neighbours and buffers. */
typedef struct {
    gpt_model *m;
    gpc_dist *d;
    gpc_ddp *ddp;
    const int32_t *inputs, *targets;
    int M, B, T, slots, first, last;
    float dloss;
    double compute_s;
} stage;

static int slot_of(const stage *s, int i) {
    return i % s->slots;
}

/* Queues the receive of micro-batch i's input (not on the first stage). */
static gpc_status recv_forward(stage *s, int i) {
    if (s->first) return GPC_OK;
    gpc_tensor in = gpt_stage_input(s->m, slot_of(s, i), s->B, s->T);
    return s->d->ops->recv(s->d, in.data, (size_t)gpc_tensor_numel(&in), in.dtype, s->d->rank - 1,
                           NULL);
}

static gpc_status send_forward(stage *s, int i) {
    if (s->last) return GPC_OK;
    gpc_tensor out = gpt_stage_output(s->m, slot_of(s, i), s->B, s->T);
    return s->d->ops->send(s->d, out.data, (size_t)gpc_tensor_numel(&out), out.dtype,
                           s->d->rank + 1, NULL);
}

static gpc_status recv_backward(stage *s) {
    if (s->last) return GPC_OK;
    gpc_tensor g = gpt_stage_grad(s->m, s->B, s->T);
    return s->d->ops->recv(s->d, g.data, (size_t)gpc_tensor_numel(&g), g.dtype, s->d->rank + 1,
                           NULL);
}

static gpc_status send_backward(stage *s) {
    if (s->first) return GPC_OK;
    gpc_tensor g = gpt_stage_grad(s->m, s->B, s->T);
    return s->d->ops->send(s->d, g.data, (size_t)gpc_tensor_numel(&g), g.dtype, s->d->rank - 1,
                           NULL);
}

/* The point-to-point operations between start and end complete together. */
static gpc_status exchange(stage *s, gpc_status (*a)(stage *, int), int ia,
                           gpc_status (*b)(stage *, int), int ib) {
    GPC_TRY(s->d->ops->group_start(s->d));
    gpc_status st = a(s, ia);
    if (st == GPC_OK && b) st = b(s, ib);
    gpc_status end = s->d->ops->group_end(s->d);
    return st != GPC_OK ? st : end;
}

static gpc_status recv_backward_i(stage *s, int i) {
    (void)i;
    return recv_backward(s);
}

static gpc_status send_backward_i(stage *s, int i) {
    (void)i;
    return send_backward(s);
}

static gpc_status forward(stage *s, int i) {
    size_t at = (size_t)i * (size_t)s->B * (size_t)s->T;
    double t0 = gpc_time_seconds();
    gpc_status st =
        gpt_stage_forward(s->m, slot_of(s, i), s->inputs + at, s->targets + at, s->B, s->T);
    s->compute_s += gpc_time_seconds() - t0;
    return st;
}

static gpc_status backward(stage *s, int i) {
    if (s->ddp) GPC_TRY(gpc_ddp_micro_step(s->ddp, i == s->M - 1));
    double t0 = gpc_time_seconds();
    gpc_status st = gpt_stage_backward(s->m, slot_of(s, i), s->B, s->T, s->dloss);
    s->compute_s += gpc_time_seconds() - t0;
    return st;
}

gpc_status gpc_pipeline_step(gpt_model *m, gpc_dist *d, gpc_ddp *ddp, const int32_t *inputs,
                             const int32_t *targets, int M, int B, int T, float dloss,
                             gpc_pipeline_timing *timing) {
    const gpt_parallel *par = gpt_parallel_of(m);
    int P = par->pp_size, rank = par->pp_rank;
    int warmup = P - rank - 1 < M ? P - rank - 1 : M, steady = M - warmup;
    if (M < 1) return gpc_error(GPC_ERR_INVALID_ARG, "a pipelined step needs micro-batches");
    if (par->slots < (M < P - rank ? M : P - rank))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "stage %d keeps %d micro-batches' activations but 1F1B over %d stages "
                         "has up to %d in flight here: create it with that many slots",
                         rank, par->slots, P, P - rank);
    stage s = {m, d, ddp, inputs, targets, M, B, T, 0, rank == 0, rank == P - 1, dloss, 0.0};
    s.slots = par->slots;
    double t0 = gpc_time_seconds();
    for (int i = 0; i < warmup; i++) {
        GPC_TRY(exchange(&s, recv_forward, i, NULL, 0));
        GPC_TRY(forward(&s, i));
        GPC_TRY(exchange(&s, send_forward, i, NULL, 0));
    }
    if (steady > 0) GPC_TRY(exchange(&s, recv_forward, warmup, NULL, 0));
    for (int k = 0; k < steady; k++) {
        int f = warmup + k;
        GPC_TRY(forward(&s, f));
        GPC_TRY(exchange(&s, send_forward, f, recv_backward_i, k));
        GPC_TRY(backward(&s, k));
        if (k == steady - 1)
            GPC_TRY(exchange(&s, send_backward_i, k, NULL, 0));
        else
            GPC_TRY(exchange(&s, send_backward_i, k, recv_forward, f + 1));
    }
    for (int k = steady; k < M; k++) {
        GPC_TRY(exchange(&s, recv_backward_i, k, NULL, 0));
        GPC_TRY(backward(&s, k));
        GPC_TRY(exchange(&s, send_backward_i, k, NULL, 0));
    }
    /* the data-parallel sums first: on GPUs they run on ddp's stream */
    if (ddp) GPC_TRY(gpc_ddp_finish_backward(ddp));
    if (P > 1) { /* the embedding's and the head's parts of wte's gradient */
        gpc_tensor g = gpt_stage_tied_grad(m);
        GPC_TRY(d->ops->all_reduce_sum(d, g.data, (size_t)gpc_tensor_numel(&g), g.dtype, NULL));
    }
    if (timing) {
        timing->step_s = gpc_time_seconds() - t0;
        timing->compute_s = s.compute_s;
        timing->bubble = timing->step_s > 0 ? 1.0 - s.compute_s / timing->step_s : 0.0;
        timing->predicted = (double)(P - 1) / (double)(M + P - 1);
    }
    return GPC_OK;
}

gpc_status gpc_pipeline_eval(gpt_model *m, gpc_dist *d, const int32_t *inputs,
                             const int32_t *targets, int B, int T, float *loss) {
    const gpt_parallel *par = gpt_parallel_of(m);
    stage s = {m,
               d,
               NULL,
               inputs,
               targets,
               1,
               B,
               T,
               1,
               par->pp_rank == 0,
               par->pp_rank == par->pp_size - 1,
               1.0f,
               0.0};
    GPC_TRY(exchange(&s, recv_forward, 0, NULL, 0));
    GPC_TRY(gpt_stage_forward(m, 0, inputs, targets, B, T));
    GPC_TRY(exchange(&s, send_forward, 0, NULL, 0));
    float mine = 0.0f;
    if (s.last) GPC_TRY(gpt_stage_loss(m, 0, B, T, &mine));
    double sum = mine; /* the last stage's; the others add 0 */
    GPC_TRY(d->ops->all_reduce_host(d, &sum, 1));
    *loss = (float)sum;
    return GPC_OK;
}
