/*
 * gpt_internal.h: the GPT model's structure, private to src/model/ (gpt.c,
 * checkpoint.c). Everything else uses the accessors of include/gpc/model.h,
 * so the layout of parameters, activations and optimizer state can change
 * without touching the trainer, data parallelism or serving.
 */
#ifndef GPC_MODEL_GPT_INTERNAL_H
#define GPC_MODEL_GPT_INTERNAL_H

#include "gpc/model.h"
#include "gpc/optim.h"

/* The parameter tensors, as views into one flat buffer. Per-layer tensors
 * carry the layer as their first dimension ([L, ...]). */
typedef union {
    struct {
        gpc_tensor wte;      /* [Vp, C], also the output head (tied) */
        gpc_tensor wpe;      /* [maxT, C] */
        gpc_tensor ln1w;     /* [L, C] */
        gpc_tensor ln1b;     /* [L, C] */
        gpc_tensor qkvw;     /* [L, 3C, C] */
        gpc_tensor qkvb;     /* [L, 3C] */
        gpc_tensor attprojw; /* [L, C, C] */
        gpc_tensor attprojb; /* [L, C] */
        gpc_tensor ln2w;     /* [L, C] */
        gpc_tensor ln2b;     /* [L, C] */
        gpc_tensor fcw;      /* [L, 4C, C] */
        gpc_tensor fcb;      /* [L, 4C] */
        gpc_tensor fcprojw;  /* [L, C, 4C] */
        gpc_tensor fcprojb;  /* [L, C] */
        gpc_tensor lnfw;     /* [C] */
        gpc_tensor lnfb;     /* [C] */
    };
    gpc_tensor all[GPT_NUM_PARAM_TENSORS];
} gpt_tensors;

/* Activations kept for the backward pass, each sized for the planned B x T
 * and, where per layer, with L as the first dimension. Statistics (mean,
 * rstd, lse, losses) are f32; the rest is in the compute dtype. */
typedef struct {
    gpc_tensor encoded;   /* [B,T,C] embedding output, the first residual */
    gpc_tensor ln1;       /* [L,B,T,C] */
    gpc_tensor ln1_mean;  /* [L,B,T] */
    gpc_tensor ln1_rstd;  /* [L,B,T] */
    gpc_tensor qkv;       /* [L,B,T,3C] */
    gpc_tensor atty;      /* [L,B,T,C] attention output before the projection */
    gpc_tensor lse;       /* [L,B,NH,T] log-sum-exp of the attention rows */
    gpc_tensor residual2; /* [L,B,T,C] residual after attention */
    gpc_tensor ln2;       /* [L,B,T,C] */
    gpc_tensor ln2_mean;  /* [L,B,T] */
    gpc_tensor ln2_rstd;  /* [L,B,T] */
    gpc_tensor fch;       /* [L,B,T,4C] */
    gpc_tensor fch_gelu;  /* [L,B,T,4C] */
    gpc_tensor residual3; /* [L,B,T,C] residual after the MLP */
    gpc_tensor lnf;       /* [B,T,C] */
    gpc_tensor lnf_mean;  /* [B,T] */
    gpc_tensor lnf_rstd;  /* [B,T] */
    gpc_tensor
        logits; /* [B,T,Vl] (Vl = Vp, or a tp rank's gpt_tp_vocab_rows); after a training
                 * step, whatever the backend's    gpc_op_classifier left there (its scratch) */
    /* tensor parallelism only (tp > 1), one for all slots: */
    gpc_tensor ce_stats;    /* [3,B*T] f32: the vocab-parallel cross-entropy's row
                             * maxima, sums of exponentials and target logits */
    gpc_tensor logits_full; /* [tp Vl] one row of logits gathered from the ranks */
    gpc_tensor losses;      /* [B,T] f32 */
    gpc_tensor tokens;      /* [B,T] i32 inputs on the device */
    gpc_tensor targets;     /* [B,T] i32 targets on the device */
    /* backward scratch (training models only) */
    gpc_tensor dresidual; /* [B,T,C] gradient of the residual stream, shared by all blocks */
    gpc_tensor dbtc;      /* [B,T,C] */
    gpc_tensor dbt4c;     /* [B,T,4C] also holds dqkv [B,T,3C] */
    gpc_tensor norm_sq;   /* [1] f32: squared global gradient norm */
    gpc_tensor loss_sum;  /* [1] f32: losses summed since gpt_read_step (same buffer) */
} gpt_activations;

/* LoRA adapters (gpt_create_lora). Their parameters and gradients sit in
 * flat buffers of their own, which the model's optimizer updates whole; the
 * base has no gradient buffer. */
typedef struct {
    gpt_lora_options options; /* rank 0: no adapters */
    float scale;              /* alpha / R */
    size_t num_params;
    size_t a_offset[GPT_LORA_TARGETS], b_offset[GPT_LORA_TARGETS]; /* in params_flat */
    gpc_tensor params_flat;                                        /* [num_params] compute dtype */
    gpc_tensor grads_flat; /* [num_params] compute dtype (training) */
    /* u[target]: [L, B, T, R] the scaled down-projection scale * x . A^T,
     * kept for backward (B's gradient reads it) */
    gpc_tensor u[GPT_LORA_TARGETS];
    /* backward scratch (training) */
    gpc_tensor du;  /* [B, T, R] */
    gpc_tensor dx;  /* [B, T, in] the adapter's part of its input's gradient */
    gpc_tensor dln; /* [2C] the frozen layernorms' gradients, discarded */
} gpt_lora;

/* The input and output widths of a LoRA target's projection. */
void gpt_lora_dims(int target, int64_t channels, int64_t *in, int64_t *out);

/* Quantized weights (gpt_create_quant): the four matrix weights of the
 * blocks (gpt_param_quantized) are 8-bit tensors of their own with f32
 * scales; params_flat holds the other tensors only (the "dense" ones), each
 * at dense_offset. Such a model is for inference: no gradients, no
 * optimizer state. */
typedef struct {
    int on;
    gpt_quant_options options;
    size_t dense_offset[GPT_NUM_PARAM_TENSORS]; /* in params_flat; unused for quantized ones */
    size_t dense_count;
    /* for each quantized tensor i: params.all[i] is its [L, OC, C] i8 or
     * f8e4m3 weight, scales[i] its [L, OC] (per channel) or [L, 1] f32 scales */
    gpc_tensor scales[GPT_NUM_PARAM_TENSORS];
} gpt_quant;

/* quant.c: the model's quantized parameters from f32 host values in layout
 * order (quantized on the host), and back (dequantized). */
gpc_status gpt_quant_set_params(gpt_model *m, const float *values);
gpc_status gpt_quant_get_params(const gpt_model *m, float *values);

struct gpt_model {
    gpt_config config;
    gpc_device device;
    gpc_dtype dtype; /* compute dtype of parameters, gradients and activations */
    int training;    /* gradients and optimizer state exist */
    int B, T;        /* the largest batch the activations were planned for */
    int offload;     /* optimizer state in pinned host memory (gpt_create_offload) */
    int recompute;   /* 0 keep activations; 1 rebuild GELU outputs; 2 also layernorm outputs */
    /* 1: backward sums only the query third of the qkv bias gradient and
     * derives the rest (see gpt.c's backward); the default, which
     * GPC_QKV_BIAS_DERIVED=0 at creation turns off */
    int derived_qkv_bias;
    size_t num_params;
    size_t param_offset[GPT_NUM_PARAM_TENSORS]; /* element offsets in the flat buffers */

    /* The optimizer shard: the optimizer holds the state of elements
     * [shard_offset, shard_offset + shard_count) of the flat layout. 0 and
     * P unless the model was created with gpt_create_shard (ZeRO-1: each
     * rank holds 1/N). */
    size_t shard_offset, shard_count;

    gpc_tensor params_flat; /* [P] compute dtype */
    gpc_tensor grads_flat;  /* [P] compute dtype (training) */
    /* master weights (bf16, fp16), AdamW moments (training) and loss
     * scaling, over the 16 parameter tensors */
    gpc_optim *optim;
    gpt_tensors params; /* views of params_flat */
    gpt_tensors grads;  /* views of grads_flat */
    gpt_activations acts;

    /* Tensor parallelism (gpt_create_tp, gpt_tp.c): this rank's slices of
     * the attention heads, MLP units and vocabulary, and the hooks that sum
     * a tensor over the tp ranks (gpt_set_tp_reduce) and take its max
     * (gpt_set_tp_max). tp_size 1: the whole model. */
    int tp_size, tp_rank;
    gpt_tp_reduce_fn tp_reduce;
    void *tp_reduce_user;
    gpt_tp_reduce_fn tp_max; /* the elementwise max over the tp ranks (gpt_set_tp_max) */
    void *tp_max_user;
    /* Pipeline parallelism: config above is the stage's (L/pp layers);
     * whole is the model's. par holds both places (gpt_create_part). */
    gpt_parallel par;
    gpt_config whole;
    gpt_tp_reduce_fn pp_reduce;
    void *pp_reduce_user;
    /* [par.slots] activations, one per micro-batch in flight; acts is the
     * selected one. Backward's scratch (dresidual, dbtc, dbt4c, norm_sq,
     * loss_sum) is one buffer that every slot's struct names. */
    gpt_activations *slot_acts;
    int64_t *slot_unmasked; /* [par.slots] targets that are not -1, per slot */

    /* Gradient-ready hook (gpt_set_grad_ready) */
    gpt_grad_ready_fn grad_ready;
    void *grad_ready_user;

    int last_B, last_T;
    int cached_len;        /* positions whose keys and values gpt_forward_cached keeps */
    int64_t last_unmasked; /* targets that were not -1 in the last forward */
    int64_t loss_count;    /* unmasked targets summed into acts.loss_sum */

    /* host staging, placed at creation */
    float *host_losses; /* [B*T] */
    void *host_row;     /* [B*Vp] logits rows in the compute dtype */

    gpt_lora lora;
    gpt_quant quant;

    gpc_arena param_arena; /* params, grads, then master, m, v (gpc_optim_place) */
    gpc_arena act_arena;   /* activations and scratch */
};

/* The parameter tensors' shapes for a model cut over tp ranks (tp 1: the
 * whole model); gpt_tp.c. */
void gpt_param_shapes(const gpt_config *config, int tp, int64_t shapes[GPT_NUM_PARAM_TENSORS][3],
                      int ndims[GPT_NUM_PARAM_TENSORS]);
/* Element offsets of the 16 tensors, and the total at [16], for tp ranks. */
void gpt_param_layout(const gpt_config *config, int tp, size_t offsets[GPT_NUM_PARAM_TENSORS + 1]);
/* Whether the model is a part (tp or pp above 1) of a whole one. */
int gpt_is_part(const gpt_model *model);
/* Where parameter tensor i ends in the flat buffers (its next's offset, or
 * the parameter count for the last). */
static inline size_t gpt_param_end(const gpt_model *m, int i) {
    return i + 1 < GPT_NUM_PARAM_TENSORS ? m->param_offset[i + 1] : m->num_params;
}
/* Elements of parameter tensor i in the flat buffers. */
static inline size_t gpt_param_count(const gpt_model *m, int i) {
    return gpt_param_end(m, i) - m->param_offset[i];
}

/* For tests of serving (gpt_serve.c): the paged cache's keys and values,
 * [L, blocks, block_size, C], whose last block is the padding rows' where
 * decode steps pad (a GPU); and how many step graphs were captured. */
void gpt_paged_cache(const gpt_paged *paged, gpc_tensor *k_cache, gpc_tensor *v_cache);
int gpt_paged_graph_count(const gpt_paged *paged);
/* Whether tensor i is cut over the tp ranks (wte, qkvw, qkvb, attprojw,
 * fcw, fcb, fcprojw) rather than replicated. */
int gpt_tp_sliced(int index);

#endif /* GPC_MODEL_GPT_INTERNAL_H */
