/*
 * attention_cudnn_plan.cuh: what the files of cuDNN's attention share: an
 * entry of the plan cache (one shape, dtype and direction on one GPU: its
 * execution plan, the candidates GPC_CUDNN_TUNE compares, the variant packs
 * of the tensors it ran with) and what each file offers the others:
 *
 *   attention_cudnn_graph.cu  builds an entry's plan: the graphs, cuDNN's
 *                             heuristics, the workspace it needs;
 *   attention_cudnn.cu        the cache and the public API; runs a plan;
 *   attention_cudnn_tune.cu   picks among an entry's candidates by time or
 *                             by energy at the power limit.
 */
#ifndef GPC_CUDA_ATTENTION_CUDNN_PLAN_CUH
#define GPC_CUDA_ATTENTION_CUDNN_PLAN_CUH

#include "cuda/attention_cudnn.h"
#include "cuda/cudnn_loader.cuh"

#include <stdio.h>

#define CUDNN_ATT_MAX_PACKS 128  /* variant packs kept per plan: one per layer's tensors */
#define CUDNN_ATT_MAX_CONFIGS 8  /* engine configurations tried per graph */
#define CUDNN_ATT_MAX_DESCS 160  /* descriptors of one graph (the backward: about 90) */
#define CUDNN_ATT_MAX_TENSORS 16 /* tensors the caller provides (the variant pack) */

/* What a plan serves: one shape, dtype and direction on one GPU. */
typedef struct {
    int device, B, T, NH, hs, backward;
    gpc_dtype dtype;
} plan_key;

/* What each tensor of a graph's variant pack is, so one execution fills the
 * pointers without knowing which variant of the graph was built. */
typedef enum {
    ROLE_Q,
    ROLE_K,
    ROLE_V,
    ROLE_O,
    ROLE_STATS,
    ROLE_DO,
    ROLE_DQ,
    ROLE_DK,
    ROLE_DV,
    ROLE_SCALE,
    ROLE_NEG_INF,
    ROLE_ONE,
    ROLE_ACCUM, /* f32 dQ accumulator, in the workspace */
    ROLE_ROWSUM /* D = rowsum(dO * O), in the workspace */
} tensor_role;

typedef struct {
    const void *key[6]; /* the caller's tensors, then the workspace it was made for */
    cudnnBackendDescriptor_t pack;
} pack_entry;

/* An execution plan that finalized, with what it needs to be kept or timed. */
typedef struct {
    cudnnBackendDescriptor_t plan;
    long engine_index;       /* cuDNN's global index of the engine, -1 if unknown */
    int rank;                /* its place in the heuristics' order, from 1 */
    int64_t workspace_bytes; /* the engine's own workspace */
} candidate;

typedef struct {
    plan_key key;
    gpc_status status; /* GPC_OK, or why cuDNN cannot run this shape */
    char why[1024];
    cudnnBackendDescriptor_t plan;
    /* GPC_CUDNN_TUNE=1: the plans still to time at the first execution, plan
     * among them (the heuristics' first); 0 when there is nothing to time */
    candidate candidates[CUDNN_ATT_MAX_CONFIGS];
    int num_candidates;
    cudnnBackendDescriptor_t descs[CUDNN_ATT_MAX_DESCS]; /* what the plan was built from */
    int num_descs;
    int64_t uids[CUDNN_ATT_MAX_TENSORS];
    tensor_role roles[CUDNN_ATT_MAX_TENSORS];
    int num_tensors;
    int64_t engine_bytes; /* the engine's own workspace (the largest of the candidates') */
    size_t accum_offset, rowsum_offset, total_bytes;
    long engine_index;
    int variant;
    float scale, neg_inf, one; /* by-value scalars: read from host memory at execution */
    pack_entry packs[CUDNN_ATT_MAX_PACKS];
    int num_packs, next_pack;
} plan_entry;

/* The key as text for logs and errors: "forward B=8 T=1024 NH=12 hs=64 bf16". */
static inline const char *shape_text(const plan_key *k, char *buf, size_t size) {
    snprintf(buf, size, "%s B=%d T=%d NH=%d hs=%d %s", k->backward ? "backward" : "forward", k->B,
             k->T, k->NH, k->hs, gpc_dtype_name(k->dtype));
    return buf;
}

/* Builds the plan of p->key on handle (attention_cudnn_graph.cu): p->status
 * GPC_OK with the plan, or why not in p->why. */
void gpc_cudnn_att_plan_build(plan_entry *p, cudnnHandle_t handle);

/* One run of plan on stream with the tensors of pack (attention_cudnn.cu). */
gpc_status gpc_cudnn_att_run_plan(const plan_entry *p, cudnnBackendDescriptor_t plan,
                                  cudnnBackendDescriptor_t pack, cudaStream_t stream);

/* GPC_CUDNN_TUNE set to 1 or energy: plans keep every candidate
 * (attention_cudnn_tune.cu). */
int gpc_cudnn_att_tune_enabled(void);

/* Times p's candidates with the tensors of pack and keeps the best as
 * p->plan (attention_cudnn_tune.cu). */
gpc_status gpc_cudnn_att_tune(plan_entry *p, cudnnBackendDescriptor_t pack, cudaStream_t stream);

#endif /* GPC_CUDA_ATTENTION_CUDNN_PLAN_CUH */
