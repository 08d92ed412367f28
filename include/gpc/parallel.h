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
#include "gpc/dist.h"
#include "gpc/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Points the model's tp hook at the group's all-reduce. The group's size
 * and this rank's place in it must be the model's tp size and rank. */
gpc_status gpc_tp_attach(gpt_model *model, gpc_dist *tp_group);

/* The whole model's f32 parameters and, for a training model, AdamW's m and
 * v gathered from the tp group's slices into host arrays on the group's
 * rank 0 (*out: master holds the parameters; free with
 * gpt_host_state_free), for gpt_checkpoint_save_full. Every rank of the
 * group calls it, between steps: the gradient buffer is the staging area.
 * The model must hold its whole optimizer state (no ZeRO-1 shard). */
gpc_status gpc_tp_gather_full(gpt_model *model, gpc_dist *tp_group, gpt_host_state *out);

#ifdef __cplusplus
}
#endif

#endif /* GPC_PARALLEL_H */
