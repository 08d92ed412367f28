/*
 * gpc plan: the memory model of a GPT training run, so a user learns before
 * starting whether a model, batch and precision fit a GPU, and which
 * micro-batch is the largest that does.
 *
 * The model counts exactly the buffers gpt_create places (include/gpc/model.h:
 * parameters, f32 master copy, gradients, AdamW m and v, the activation list
 * of gpt_activations and its backward scratch), each rounded up to the
 * arena's 256-byte alignment, plus what sits beside the model on a GPU:
 * cuBLASLt's workspace and the CUDA context. Everything that grows with the
 * micro-batch grows linearly, which makes "largest batch that fits" exact.
 */
#ifndef GPC_PLAN_H
#define GPC_PLAN_H

#include "gpc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a run looks like. Zero-initialise and call gpc_plan_defaults. */
typedef struct {
    int layers;      /* L */
    int heads;       /* NH */
    int channels;    /* C */
    int context;     /* T, also the model's max_context (wpe rows) */
    int batch;       /* B, the micro-batch per GPU */
    int vocab;       /* V; padded to Vp = multiple of 64 */
    gpc_dtype dtype; /* compute precision: GPC_F32, GPC_BF16 or GPC_F16 */
    int recompute;   /* GPT_RECOMPUTE(level, blocks) (gpc/model.h): 0 keep all; 1 recompute
                      * GELU; 2 also layernorm outputs; 3 whole blocks; of the first N (of
                      * each pipeline stage under pp) */
    int zero;        /* 1: ZeRO-1, optimizer state and master sharded over the dp copies */
    int gpus;        /* GPUs: gpus / (tp * pp) data-parallel copies of the model */
    int tp;          /* tensor parallelism: each copy's heads and MLP units over tp GPUs */
    int pp;          /* pipeline parallelism: each copy's layers in pp stages (1F1B) */
    int lora_rank;   /* 0: full fine-tuning; R > 0: LoRA adapters, base frozen */
    int offload;     /* 1: optimizer state in pinned host memory (--offload-optimizer) */
    int cuda;        /* 1: add cuBLASLt workspace and CUDA context */
} gpc_plan_input;

/* Bytes per GPU, by what they hold. With tp or pp, the figures are those of
 * the GPU that holds the most: a first pipeline stage, which keeps pp
 * micro-batches' activations in flight (1F1B); every stage keeps wte, wpe
 * and lnf (gpt_create_part). */
typedef struct {
    uint64_t num_params;          /* elements of the model (padded vocabulary rows included) */
    uint64_t trainable;           /* elements that receive gradients and optimizer state */
    uint64_t parameters;          /* params in the compute dtype */
    uint64_t gradients;           /* gradients of the trainable elements, compute dtype */
    uint64_t optimizer;           /* AdamW m and v (f32) + f32 master when low precision;
                                   * 0 with offload (it is in host_pinned) */
    uint64_t optimizer_unsharded; /* the same without ZeRO-1 (not in the total): what
                                   * zero 1 over gpus saves is the difference;
                                   * 0 with offload */
    uint64_t activations;         /* what the forward pass keeps for backward */
    uint64_t backward;            /* backward scratch: dresidual, dbtc, dbt4c, norm */
    uint64_t workspace;           /* logits (reused for dlogits) + cuBLASLt workspace + cuDNN
                                   * attention's f32 dQ accumulator (GPU, bf16/f16) */
    uint64_t context;             /* CUDA context and library kernels (estimate) */
    uint64_t total;               /* sum of the above: the device's bytes */
    uint64_t per_sample;          /* bytes added by each extra sequence of the micro-batch */
    uint64_t host_pinned;         /* offload: pinned host memory for the optimizer state and
                                   * the staged gradients and weights (not in total); all
                                   * the host memory a run needs to start, the weights
                                   * being drawn or read into its master */
} gpc_plan_result;

/* cuBLASLt workspace gpc's CUDA backend asks for (llm.c's choice, enough for
 * Hopper's split-K kernels). */
#define GPC_PLAN_CUBLASLT_WORKSPACE (32ull << 20)
/* CUDA context + cuBLAS/cuBLASLt kernels resident after the first GEMM, as
 * nvidia-smi shows for a process that allocated nothing else: about 500 to
 * 600 MiB with CUDA 12/13 lazy module loading on Hopper. An estimate; the
 * check against measured peaks (scripts/gpu-plan-check.sh) keeps it honest. */
#define GPC_PLAN_CUDA_CONTEXT (600ull << 20)

void gpc_plan_defaults(gpc_plan_input *in);
/* "dN": N layers, N heads, 64*N channels, GPT-2's sizes at d24, d36, d48:
 * gpt_config_parse_depth's rule. */
gpc_status gpc_plan_parse_model(const char *name, gpc_plan_input *in);
/* Checks the input and computes the breakdown. */
gpc_status gpc_plan_compute(const gpc_plan_input *in, gpc_plan_result *out);

/* A GPU model and its usable memory as nvidia-smi reports it. */
typedef struct {
    const char *name;
    uint64_t bytes;
} gpc_plan_gpu;

/* The common GPUs gpc plan compares against; *count receives how many. */
const gpc_plan_gpu *gpc_plan_gpus(int *count);
/* Largest micro-batch whose plan fits in bytes (0 when not even one does). */
int gpc_plan_max_batch(const gpc_plan_input *in, uint64_t bytes);

/* Writes the plan as one JSON object to path: model (its name as given,
 * "d12"), the input, every figure of r in bytes, and for each GPU of
 * gpc_plan_gpus whether it fits and its largest micro-batch. */
gpc_status gpc_plan_write_json(const char *path, const char *model, const gpc_plan_input *in,
                               const gpc_plan_result *r);

#ifdef __cplusplus
}
#endif

#endif /* GPC_PLAN_H */
