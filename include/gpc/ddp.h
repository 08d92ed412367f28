/*
 * gpc ddp: data-parallel training of a GPT over the collectives of dist.h.
 *
 * Every rank holds the whole model and computes gradients on its own part of
 * the batch. The gradients are summed over the ranks in buckets while
 * backward still runs: the model's gradient-ready hook reports each block as
 * it finishes, and every bucket whose gradients are then final is launched
 * at once on a communication stream that waits (an event) for the compute
 * stream. Micro-steps that only accumulate communicate nothing; only the
 * last micro-step of an optimizer step does.
 *
 * The parameter layout is llm.c's: tensors with the layer as first dimension
 * (qkvw is [L, 3C, C]), so one block's gradients are 12 slices, and layers
 * l..L-1 of a tensor are one contiguous range. A bucket is a run of blocks
 * from the top down: for each per-layer tensor one range, merged where they
 * touch. The final layernorm rides with the first bucket; wte and wpe (final
 * only after the embedding backward) are the last.
 *
 * zero 0: all-reduce of every bucket, then every rank runs the same AdamW.
 * zero 1 (ZeRO stage 1, Rajbhandari et al. 2020): the flat buffer is cut
 * into one shard per rank; each bucket range is reduced to the ranks owning
 * its pieces (a reduce-scatter), each rank runs the model's optimizer on
 * its shard only (gpt_update_span, with the squared gradient norm summed
 * over the ranks), and the parameters are all-gathered.
 */
#ifndef GPC_DDP_H
#define GPC_DDP_H

#include "gpc/core.h"
#include "gpc/dist.h"
#include "gpc/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    size_t offset, count; /* elements of the flat buffer */
} gpc_ddp_range;

typedef struct {
    int ready_layer; /* launched when the hook reports this layer (L: final layernorm, -1: end) */
    int first_range, range_count;
    size_t elements;
} gpc_ddp_bucket;

typedef struct {
    int bucket_count;
    gpc_ddp_bucket *buckets; /* in launch order */
    int range_count;
    gpc_ddp_range *ranges;
} gpc_ddp_plan;

/* Plans the buckets of a model's flat gradient buffer. bucket_elements 0
 * puts every gradient into one bucket launched after backward (no overlap).
 * offsets are gpt_param_offsets. */
gpc_status gpc_ddp_plan_buckets(const gpt_config *config, const size_t *offsets, size_t num_params,
                                size_t bucket_elements, gpc_ddp_plan *out);
void gpc_ddp_plan_free(gpc_ddp_plan *plan);

typedef struct {
    int zero;         /* 0 or 1 */
    double bucket_mb; /* bucket size in MiB of gradients; 0: one bucket after backward */
    int no_comm;      /* benchmarks only: skip the gradient communication (wrong results) */
} gpc_ddp_options;

/* Default bucket size in MiB (see docs/distributed.md for the measurement). */
#define GPC_DDP_DEFAULT_BUCKET_MB 100.0

typedef struct gpc_ddp gpc_ddp;

/* Takes the model (created, weights set on rank 0 at least) and the
 * collectives; broadcasts rank 0's parameters so every rank starts equal.
 * With zero 1 the model may hold only this rank's shard of the optimizer
 * state (gpt_create_shard over gpc_dist_shard_offsets with align 64), so
 * each rank keeps 1/N of m, v and the master weights; its weights must then
 * be set on every rank (the master shards are not broadcast). */
gpc_status gpc_ddp_create(gpc_ddp **out, gpt_model *model, gpc_dist *dist,
                          const gpc_ddp_options *options);
void gpc_ddp_free(gpc_ddp *ddp);
/* Before a micro-step's forward_backward: last says whether it ends the
 * optimizer step (only then is the hook installed and gradients sent). */
gpc_status gpc_ddp_micro_step(gpc_ddp *ddp, int last);
/* After the last micro-step: the compute stream waits for the communication. */
gpc_status gpc_ddp_finish_backward(gpc_ddp *ddp);
/* AdamW: gpt_update for zero 0; the shard update and all-gather for zero 1,
 * in every precision (fp16's overflow skip is decided on the global norm, so
 * all ranks skip together). Either way the global squared gradient norm is
 * left where gpt_read_step reads it. */
gpc_status gpc_ddp_update(gpc_ddp *ddp, const gpc_optim_options *options, int *skipped);
/* zero 1: gathers the master weights and AdamW moments so a checkpoint
 * holds the whole optimizer state; every rank takes part. A whole model
 * (gpt_create) gathers in place on every rank and *out stays empty. A
 * sharded model (gpt_create_shard) leaves every shard in host arrays on rank
 * 0 (*out, for gpt_checkpoint_save_full; free with gpt_host_state_free),
 * using the gradient buffers as staging: call it between steps. */
gpc_status gpc_ddp_gather_state(gpc_ddp *ddp, gpt_host_state *out);
/* Sums host values over the ranks (the step's loss, the stop flag) and ends
 * the step the NCCL watchdog watches. */
gpc_status gpc_ddp_reduce_host(gpc_ddp *ddp, double *values, int n);
const gpc_ddp_plan *gpc_ddp_get_plan(const gpc_ddp *ddp);

/* The gradient communication of the last optimizer step, for gpc doctor:
 * exposed_ms is the time the step waited for it after backward's last
 * kernel (what overlap did not hide), busy_ms the span from its first
 * launch to its end, bus_gbs the bus bandwidth that span achieved (bytes
 * times 2(n-1)/n for an all-reduce, (n-1)/n for ZeRO-1's reduce, over
 * busy_ms, as nccl-tests counts). On a GPU it reads CUDA events, so call it
 * once the step is known finished (after gpt_read_step). On the CPU the
 * exchange blocks backward, so all of it is exposed. All three are 0 when
 * the step sent nothing. */
gpc_status gpc_ddp_comm_times(gpc_ddp *ddp, double *exposed_ms, double *busy_ms, double *bus_gbs);

#ifdef __cplusplus
}
#endif

#endif /* GPC_DDP_H */
