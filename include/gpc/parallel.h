/*
 * gpc parallel: tensor-parallel training of a GPT over a group of ranks
 * (dist.h), the model side of which is gpt_create_tp (model.h).
 *
 * A job of world = dp x pp x tp ranks is cut into groups with
 * gpc_dist_layout_make and gpc_dist_split: the tp ranks of one group hold
 * the slices of one model and see the same tokens; the dp groups (one rank
 * of each tensor-parallel place) sum gradients as gpc_ddp does for whole
 * models, over the local layout, which is the same on every rank of a dp
 * group. The sums inside a block go through the model's tp hook, which
 * gpc_tp_attach points at the tp group's all-reduce (queued on the compute
 * stream on GPUs, so no synchronisation is added).
 */
#ifndef GPC_PARALLEL_H
#define GPC_PARALLEL_H

#include "gpc/core.h"
#include "gpc/ddp.h"
#include "gpc/dist.h"
#include "gpc/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Points the model's tp hooks at the group's all-reduces (the sum and the
 * max). The group's size and this rank's place in it must be the model's
 * tp size and rank. */
gpc_status gpc_tp_attach(gpt_model *model, gpc_dist *tp_group);

/* The whole model's f32 parameters and, for a training model, AdamW's m and
 * v gathered from the parts of one model into host arrays on the group's
 * rank 0 (*out: master holds the parameters; free with
 * gpt_host_state_free), for gpt_checkpoint_save_full. The group is the
 * model's tp x pp ranks, rank pp_rank * tp + tp_rank each (the tp group
 * alone without pipeline). Every rank of the group calls it, between
 * steps: the gradient buffer is the staging area. A part holding a ZeRO-1
 * shard gives its whole local state as gpc_ddp_gather_state left it on
 * its dp rank 0 (state); otherwise state is NULL. */
gpc_status gpc_tp_gather_full(gpt_model *model, gpc_dist *model_group, const gpt_host_state *state,
                              gpt_host_state *out);

/* ------------------------------------------------ pipeline parallelism */

/* Points the model's stage-sum hook (the gradient norm) at the pipeline
 * group, whose rank must be the model's stage. */
gpc_status gpc_pipeline_attach(gpt_model *model, gpc_dist *pp_group);

/* What one pipelined step cost on this stage: its wall time, the part spent
 * in forward and backward, the bubble measured (1 - compute / step) and
 * the 1F1B schedule's (P - 1) / (M + P - 1). On GPUs the compute times
 * are host-side launch times unless the device is synchronous. */
typedef struct {
    double step_s, compute_s, bubble, predicted;
} gpc_pipeline_timing;

/* The forward and backward passes of one optimizer step over M
 * micro-batches in the 1F1B order (Narayanan et al. 2021, PipeDream-Flush):
 * stage s runs P - s - 1 forwards ahead, then alternates one forward and
 * one backward, then drains the backwards; activations and their
 * gradients move between neighbouring stages, sends paired with receives
 * in one group so that neighbours cannot deadlock. inputs and targets are
 * host [M][B * T]: the same on every stage (only the first reads inputs,
 * the last targets). ddp (NULL without data parallelism) hears which
 * backward is the step's last and is finished (gpc_ddp_finish_backward)
 * before the tied wte gradient is summed over the stages. The model needs
 * min(M, P - s) activation slots. */
gpc_status gpc_pipeline_step(gpt_model *model, gpc_dist *pp_group, gpc_ddp *ddp,
                             const int32_t *inputs, const int32_t *targets, int M, int B, int T,
                             float dloss, gpc_pipeline_timing *timing);

/* Validation through the stages: one batch (host [B * T] inputs and
 * targets, the same on every stage) forward, stage by stage, and its mean
 * loss from the last stage into *loss on every stage. */
gpc_status gpc_pipeline_eval(gpt_model *model, gpc_dist *pp_group, const int32_t *inputs,
                             const int32_t *targets, int B, int T, float *loss);

#ifdef __cplusplus
}
#endif

#endif /* GPC_PARALLEL_H */
