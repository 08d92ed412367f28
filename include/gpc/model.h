/*
 * gpc model: the GPT-2 family (config, parameters, forward, backward,
 * optimizer step) and its checkpoint files.
 *
 * gpt_model is opaque (its struct is private to src/model/): callers read
 * what they need through the accessors below. Every update goes through
 * the model's optimizer (gpc/optim.h), which holds the master weights,
 * AdamW's moments and the fp16 loss scale.
 *
 * The model is written only against src/ops/ops.h, so it runs unchanged on
 * every backend. All of its memory is planned up front in arenas (parameters,
 * gradients, optimizer state, activations); forward, backward and update
 * allocate nothing.
 *
 * Parameters live in ONE contiguous buffer in llm.c's order (wte, wpe, ln1w,
 * ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw,
 * fcprojb, lnfw, lnfb), and gradients in another with the same layout, so the
 * global gradient norm is one reduction and a future all-reduce is one call.
 */
#ifndef GPC_MODEL_H
#define GPC_MODEL_H

#include "gpc/core.h"
#include "gpc/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- config */

typedef struct {
    int layers;       /* L */
    int heads;        /* NH */
    int channels;     /* C, a multiple of heads */
    int max_context;  /* maxT: positions the model knows */
    int vocab_size;   /* V: real tokens */
    int padded_vocab; /* Vp: V rounded up to a multiple of 64, for aligned matrix products */
} gpt_config;

/* Fills a config and checks it (positive sizes, channels divisible by heads,
 * vocabulary 2..2^31/2); computes padded_vocab. */
gpc_status gpt_config_init(gpt_config *config, int layers, int heads, int channels, int max_context,
                           int vocab_size);
/* "dN": N layers, N heads, 64*N channels (d12 = GPT-2 124M), except GPT-2's
 * larger sizes: d24 16 heads, 1024 channels (350M); d36 20, 1280 (774M);
 * d48 25, 1600 (1.5B). Writes only layers, heads and channels. */
gpc_status gpt_config_parse_depth(const char *name, int *layers, int *heads, int *channels);
/* Parameter count (elements, padded vocabulary rows included). */
size_t gpt_config_num_params(const gpt_config *config);
/* True when two configs describe the same parameter layout; otherwise a
 * message such as "checkpoint was written by a model with 12 layers; this
 * config has 24" (what names the first side) is left in gpc_last_error(). */
int gpt_config_equal(const gpt_config *a, const gpt_config *b, const char *what);

/* -------------------------------------------------------------- tensors */

#define GPT_NUM_PARAM_TENSORS 16

/* Names in layout order ("wte", "wpe", "ln1w", ...), for messages and tests. */
extern const char *const gpt_param_names[GPT_NUM_PARAM_TENSORS];
/* Whether AdamW's weight decay applies: the 2-D weights (embeddings and matrix
 * weights, as in GPT-2/nanoGPT), not biases or layernorm parameters. */
int gpt_param_decays(int index);

/* ----------------------------------------------------------------- model */

/* The model: parameters, gradients, optimizer state and activations, planned
 * at creation. Opaque: callers use the functions below. */
typedef struct gpt_model gpt_model;

/* Plans and allocates a model for batches up to B x T (T <= max_context) on a
 * device. dtype is the compute precision: f32, bf16 or f16 (the last two keep
 * f32 master weights; the CPU backend supports only f32). With training == 0
 * there are no gradients, optimizer state or backward buffers (sampling).
 * Parameters are zero until gpt_init_weights or gpt_checkpoint_load. */
gpc_status gpt_create(gpt_model **out, const gpt_config *config, gpc_device device, gpc_dtype dtype,
                      int B, int T, int training);
/* Activation recomputation trades compute for memory. A level says what
 * backward rebuilds instead of keeping: GELU outputs, also the layernorm
 * outputs (their mean and rstd stay), or the whole block from its input
 * (only the residual stream between blocks stays: the largest saving, one
 * more forward pass of the block). A count of blocks applies the level to
 * the first N blocks only (0: all), so memory trades for speed in steps, as
 * Megatron's --recompute-method block does. Both travel in one int, packed
 * by GPT_RECOMPUTE: a plain level (0..3) means every block. */
#define GPT_RECOMPUTE_NONE 0
#define GPT_RECOMPUTE_GELU 1
#define GPT_RECOMPUTE_LAYERNORM 2
#define GPT_RECOMPUTE_BLOCK 3
#define GPT_RECOMPUTE(level, layers) ((level) | ((layers) << 2))
static inline int gpt_recompute_level(int recompute) {
    return recompute & 3;
}
/* The blocks the level applies to in a model of `layers` blocks. */
static inline int gpt_recompute_layers(int recompute, int layers) {
    int n = recompute >> 2;
    return (recompute & 3) == 0 ? 0 : n == 0 || n > layers ? layers : n;
}
/* Checks a packed value against a model of `layers` blocks (layers 0: the
 * level alone); the message names --recompute and --recompute-layers. */
gpc_status gpt_recompute_check(int recompute, int layers);
/* "0", "gelu", "layernorm", "block", and ":N" after it when the level
 * applies to the first N blocks only (e.g. "block:6"), into buf. */
const char *gpt_recompute_name(int recompute, char *buf, size_t size);
/* Parses a level ("0".."3", "none", "gelu", "layernorm" or "ln", "block")
 * with an optional ":N" block count into a packed value. */
gpc_status gpt_recompute_parse(const char *text, int *recompute);

/* gpt_create with activation recomputation (training only; see above): a
 * packed GPT_RECOMPUTE value. Recomputed activations of the chosen blocks
 * share one slot; gpc plan counts the same buffers. Gradients are bitwise
 * those of a model that keeps everything: backward rebuilds each value by
 * the same ops as forward. */
gpc_status gpt_create_recompute(gpt_model **out, const gpt_config *config, gpc_device device,
                                gpc_dtype dtype, int B, int T, int training, int recompute);
/* A training model whose optimizer state (f32 master weights, AdamW m and
 * v) lives in the device's pinned host memory and is updated on CPU
 * threads (gpc/optim.h, layout.offload): the device holds parameters,
 * gradients and activations only. Whole models only: no shard, part,
 * LoRA or quantized weights. Checkpoints are the same as a plain model's. */
gpc_status gpt_create_offload(gpt_model **out, const gpt_config *config, gpc_device device,
                              gpc_dtype dtype, int B, int T, int recompute);
int gpt_optimizer_offloaded(const gpt_model *m);
/* Pinned host bytes of an offloaded optimizer (0 otherwise). */
size_t gpt_host_pinned_bytes(const gpt_model *m);
/* A training model holding the optimizer state (AdamW m, v and, for bf16
 * and fp16, the f32 master weights) of elements [shard_offset,
 * shard_offset + shard_count) of the flat layout only: ZeRO stage 1, where
 * each rank updates its shard (gpt_update_span, called by gpc_ddp_update).
 * Parameters and gradients stay whole. gpt_update refuses such a model;
 * gpt_set_params, gpt_init_weights and gpt_checkpoint_load keep this shard
 * of what they are given, so every rank must call them (each with the same
 * values). A shard of the whole buffer is gpt_create_recompute. */
gpc_status gpt_create_shard(gpt_model **out, const gpt_config *config, gpc_device device,
                            gpc_dtype dtype, int B, int T, int recompute, size_t shard_offset,
                            size_t shard_count);
/* Whether the model holds only part of the optimizer state. */
int gpt_is_sharded(const gpt_model *model);
void gpt_free(gpt_model *model);
/* Bytes of device memory the model holds (parameters + state + activations). */
size_t gpt_memory_bytes(const gpt_model *model);

/* What the model was created with. */
const gpt_config *gpt_get_config(const gpt_model *model);
gpc_device gpt_device(const gpt_model *model);
gpc_dtype gpt_dtype(const gpt_model *model); /* compute dtype */
int gpt_is_training(const gpt_model *model);
/* The largest batch (B) and context (T) the activations were planned for. */
int gpt_batch(const gpt_model *model);
int gpt_context(const gpt_model *model);
int gpt_recompute(const gpt_model *model);
size_t gpt_num_params(const gpt_model *model);
/* [GPT_NUM_PARAM_TENSORS] element offsets of the tensors in the flat
 * buffers; tensor i ends where i + 1 starts, the last at num_params. */
const size_t *gpt_param_offsets(const gpt_model *model);
/* Positions whose keys and values gpt_forward_cached keeps. */
int gpt_cached_len(const gpt_model *model);

/* --------------------------------------------------- data parallelism */

/* The flat buffers, [num_params] in the compute dtype: the parameters, and
 * the gradients (data NULL unless training). Collectives read and write
 * their elements in place. */
const gpc_tensor *gpt_params_flat(const gpt_model *model);
const gpc_tensor *gpt_grads_flat(const gpt_model *model);
/* The span of the flat layout whose optimizer state the model holds:
 * [0, num_params) unless created with gpt_create_shard. */
void gpt_shard_range(const gpt_model *model, size_t *offset, size_t *count);
/* The optimizer: master weights, AdamW moments and the fp16 loss scale
 * (include/gpc/optim.h), e.g. to gather a ZeRO-1 shard's state. */
const gpc_optim *gpt_optimizer(const gpt_model *model);

/* Gradient-ready hook: when set, backward calls it as soon as gradients
 * become final: with layer == L after the final layernorm (lnfw, lnfb),
 * with l after block l (its per-layer slices), and with -1 at the end
 * (wte, wpe). Called on the host while the device may still be computing:
 * the hook orders itself after the queued work (an event on the compute
 * stream). fn NULL removes it. */
typedef gpc_status (*gpt_grad_ready_fn)(void *user, int layer);
void gpt_set_grad_ready(gpt_model *model, gpt_grad_ready_fn fn, void *user);

/* ------------------------------------------------- tensor parallelism */

/* Tensor parallelism in the Megatron-LM style (Shoeybi et al. 2019): each of
 * tp ranks holds the query, key and value rows of heads/tp heads and 4C/tp
 * of the MLP's hidden units (column slices of qkvw, fcw and their biases),
 * and the matching input columns of attprojw and fcprojw (row slices).
 * wte, the token embedding tied to the output head, is cut by vocabulary
 * rows (gpt_tp_vocab_rows: about Vp/tp each). Its embedding gives zero
 * for other ranks' tokens and the ranks' outputs are summed; the head
 * computes the logits of the rank's rows only and the cross-entropy runs
 * vocabulary-parallel (the row maxima, then the sums of exponentials and
 * the target logits, reduced over the ranks), so no rank holds a whole
 * row of logits. wpe, the layernorms and the projection biases are
 * replicated. Per block, forward sums the two projections' partial outputs
 * over the ranks and backward sums the two partial input gradients of qkv
 * and fc: four calls of the tp hook per block and micro-step. The
 * replicated parameters then see identical inputs and identical output
 * gradients on every rank, so their gradients are identical and need no
 * communication. The local flat layout is the whole model's with the seven
 * sliced tensors narrower (gpt_tp_num_params elements). */
typedef gpc_status (*gpt_tp_reduce_fn)(void *user, gpc_tensor *tensor);

/* Errors for a tp size that does not divide the heads (the channels and
 * MLP width follow). */
gpc_status gpt_tp_check(const gpt_config *config, int tp_size);
/* The rows of wte each of tp_size ranks holds: ceil(padded_vocab /
 * tp_size), rounded up to a multiple of 8 above one rank (the whole
 * padded_vocab at tp_size 1). Rank r holds rows [r rows, (r + 1) rows);
 * those past padded_vocab are zero and in no checkpoint. */
int64_t gpt_tp_vocab_rows(const gpt_config *config, int tp_size);
/* Elements of one rank's local layout (tp_size 1: gpt_config_num_params). */
size_t gpt_tp_num_params(const gpt_config *config, int tp_size);
/* Rank tp_rank's local values cut out of a whole model's (f32, layout
 * order), and put back into one (only its slices and the replicated
 * tensors are written). */
void gpt_tp_slice(const gpt_config *config, int tp_size, int tp_rank, const float *full,
                  float *local);
void gpt_tp_unslice(const gpt_config *config, int tp_size, int tp_rank, const float *local,
                    float *full);
/* A training model holding rank tp_rank's slices (tp_size 1: the whole
 * model), with the optimizer state of elements [shard_offset, shard_offset
 * + shard_count) of its local layout (SIZE_MAX count: all of it). Before
 * any forward of a model with tp_size > 1 the sum over the tp ranks must
 * be set with gpt_set_tp_reduce. gpt_set_params, gpt_get_params and
 * gpt_init_weights take and give local values; gpt_checkpoint_load slices
 * a whole checkpoint; a checkpoint is written from whole arrays
 * (gpt_checkpoint_save_full with every array given). LoRA is refused. */
gpc_status gpt_create_tp(gpt_model **out, const gpt_config *config, gpc_device device,
                         gpc_dtype dtype, int B, int T, int recompute, int tp_size, int tp_rank,
                         size_t shard_offset, size_t shard_count);
int gpt_tp_size(const gpt_model *model);
int gpt_tp_rank(const gpt_model *model);
/* The sum over the tp ranks, in place, of a tensor on the model's device
 * (queued on the compute stream). fn NULL removes it. */
void gpt_set_tp_reduce(gpt_model *model, gpt_tp_reduce_fn fn, void *user);
/* The elementwise max over the tp ranks, in place, of an f32 tensor on the
 * model's device (the cross-entropy's row maxima); needed with the sum. */
void gpt_set_tp_max(gpt_model *model, gpt_tp_reduce_fn fn, void *user);

/* ---------------------------------------------- pipeline parallelism */

/* A model's place in tensor and pipeline parallelism: slice tp_rank of
 * tp_size (above), and stage pp_rank of pp_size, which holds layers
 * [pp_rank * L/pp_size, (pp_rank + 1) * L/pp_size); the first stage also
 * uses the embeddings, the last the final layernorm and the head (wte,
 * tied). Every stage keeps wte, wpe and lnf in its layout (unused ones get
 * zero gradients); the head's and the embedding's wte gradients are summed
 * over the stages (gpt_stage_tied_grad) so the two copies stay equal.
 * slots: micro-batches whose activations a stage keeps at once (1F1B:
 * pp_size - pp_rank; 1 without pipeline). */
typedef struct {
    int tp_size, tp_rank;
    int pp_size, pp_rank;
    int slots;
} gpt_parallel;

/* Errors for a layout that does not divide the model (heads % tp, layers
 * % pp) or a place outside it. */
gpc_status gpt_parallel_check(const gpt_config *config, const gpt_parallel *par);
/* Elements of the part's local layout. */
size_t gpt_part_num_params(const gpt_config *config, const gpt_parallel *par);
/* The part's local values cut out of a whole model's, and put back. */
void gpt_part_slice(const gpt_config *config, const gpt_parallel *par, const float *full,
                    float *local);
void gpt_part_unslice(const gpt_config *config, const gpt_parallel *par, const float *local,
                      float *full);
/* gpt_create_tp for any part: config is the whole model's (gpt_get_config
 * then gives the part's: L/pp_size layers; gpt_whole_config the whole). */
gpc_status gpt_create_part(gpt_model **out, const gpt_config *config, gpc_device device,
                           gpc_dtype dtype, int B, int T, int recompute, const gpt_parallel *par,
                           size_t shard_offset, size_t shard_count);
const gpt_parallel *gpt_parallel_of(const gpt_model *model);
const gpt_config *gpt_whole_config(const gpt_model *model);
/* The sum over the pipeline stages of a device tensor, in place: used for
 * the squared gradient norm, each stage giving its own tensors' part. */
void gpt_set_pp_reduce(gpt_model *model, gpt_tp_reduce_fn fn, void *user);

/* One stage's half of a micro-step on activation slot `slot`. Forward:
 * the first stage embeds inputs, the others start from gpt_stage_input
 * (filled by the caller, the previous stage's output); the last stage's
 * forward ends at the final layernorm. Backward: the last stage runs the
 * head (its losses summed for gpt_read_step, with dloss as in
 * gpt_forward_backward) and starts there; the others start from
 * gpt_stage_grad, filled with the gradient of their output. After it,
 * gpt_stage_grad holds the gradient of the stage's input (the first
 * stage's has gone into the embeddings). Host tokens [B, T]: inputs are
 * read by the first stage, targets by the last. */
gpc_status gpt_stage_forward(gpt_model *model, int slot, const int32_t *inputs,
                             const int32_t *targets, int B, int T);
gpc_status gpt_stage_backward(gpt_model *model, int slot, int B, int T, float dloss);
/* The last stage, after gpt_stage_forward of a slot: the head and the mean
 * loss over the slot's unmasked targets (validation; nothing trains). */
gpc_status gpt_stage_loss(gpt_model *model, int slot, int B, int T, float *loss);
/* [B, T, C] views: the stage's input and output residual streams of a slot,
 * and the one residual-gradient buffer the stages exchange. */
gpc_tensor gpt_stage_input(const gpt_model *model, int slot, int B, int T);
gpc_tensor gpt_stage_output(const gpt_model *model, int slot, int B, int T);
gpc_tensor gpt_stage_grad(const gpt_model *model, int B, int T);
/* wte's gradient, [Vp, C]: summed over the stages after the last
 * micro-step, since the first stage's embedding and the last stage's head
 * both feed it. */
gpc_tensor gpt_stage_tied_grad(const gpt_model *model);

/* fp16: the factor the loss is multiplied by before backward (1 in f32 and
 * bf16), and whether the last update was skipped for an overflow (known
 * after gpt_read_step or an update that reported it). */
float gpt_loss_scale(const gpt_model *model);
void gpt_set_loss_scale(gpt_model *model, float scale);
int gpt_step_skipped(const gpt_model *model);

/* GPT-2 initialisation (Radford et al. 2019, as in nanoGPT and llm.c):
 * weights normal(0, 0.02), wpe normal(0, 0.01), residual projections
 * (attprojw, fcprojw) scaled by 1/sqrt(2L), biases 0, layernorm weights 1,
 * padded rows of wte 0. Same seed, same weights on every device. */
gpc_status gpt_init_weights(gpt_model *model, uint64_t seed);

/* Sets every parameter from an f32 host array in layout order (num_params
 * elements), and reads them back. Used by checkpoints and tests. A sharded
 * low-precision model has f32 master weights of its shard only: reading
 * gives the master values there and the compute-dtype values elsewhere. */
gpc_status gpt_set_params(gpt_model *model, const float *values);
gpc_status gpt_get_params(const gpt_model *model, float *values);

/* Forward pass on B x T tokens (host i32, B <= gpt_batch, T <= gpt_context).
 * With targets (host i32, -1 masks a position) the per-position losses are
 * computed too; gpt_mean_loss reads their mean back. */
gpc_status gpt_forward(gpt_model *model, const int32_t *inputs, const int32_t *targets, int B,
                       int T);
/* One training micro-step: forward with targets, the output head's losses
 * and gradients (gpc_op_classifier, with the logits buffer as its scratch),
 * backward. Parameter gradients are ADDED to the gradient buffer (gradient
 * accumulation); dloss is the weight of each position's loss,
 * 1/(B*T*accumulation_steps) for the mean. The tokens are checked against
 * the vocabulary and copied to the device, which waits for the copy. */
gpc_status gpt_forward_backward(gpt_model *model, const int32_t *inputs, const int32_t *targets,
                                int B, int T, float dloss);
/* The same micro-step on tokens already on the model's device (the data
 * loader's, gpc_prefetch_next): inputs and targets [B, T] i32, unmasked the
 * number of targets that are not -1. Nothing waits for the device, and the
 * tokens are not checked: the caller guarantees 0 <= input < vocab_size and
 * -1 <= target < vocab_size (the loader checked every token of the shards
 * against the dataset's vocabulary, which is the model's). The result is
 * the same as gpt_forward_backward's on the same tokens. */
gpc_status gpt_forward_backward_device(gpt_model *model, const gpc_tensor *inputs,
                                       const gpc_tensor *targets, int64_t unmasked, float dloss);
gpc_status gpt_zero_grad(gpt_model *model);
/* Mean loss over the unmasked positions of the last forward pass (reads the
 * losses back to the host, so it waits for the device). */
gpc_status gpt_mean_loss(gpt_model *model, float *loss);
/* After gpt_update: the mean loss over the tokens of every
 * gpt_forward_backward since the last call (summed on the device, so the
 * micro-steps need no host synchronisation) and the gradient norm of the
 * last gpt_update before clipping, both read in one copy; then starts the
 * sum over. Either pointer may be NULL. With fp16 this is also where the
 * update's overflow check is read: gpt_step_skipped says whether the
 * step was skipped (the norm is then NaN) and the loss scale adapts. */
gpc_status gpt_read_step(gpt_model *model, float *mean_loss, float *grad_norm);

/* Global gradient norm, then AdamW on every parameter tensor (weight decay on
 * 2-D weights only), with clipping, through the model's optimizer
 * (gpc_optim_step). *grad_norm (optional) receives the norm before
 * clipping (a one-float read back). With fp16 a step whose gradients
 * overflowed is skipped and the loss scale halved: with grad_norm or
 * skipped given, the norm is read here (*skipped = 1 on overflow); with
 * neither, nothing waits for the device: the AdamW kernel skips the step on
 * the device, and the next gpt_read_step reads the verdict and adapts the
 * scale (gpt_step_skipped; a forward_backward or update that comes first
 * reads it itself). A sharded model refuses: it needs gpt_update_span. */
gpc_status gpt_update(gpt_model *model, const gpc_optim_options *options, float *grad_norm,
                      int *skipped);
/* Sums the squared gradient norm of one process's part (norm_sq, device f32
 * [1]) over the processes; data parallelism's all-reduce. */
typedef gpc_status (*gpt_norm_reduce_fn)(void *user, gpc_tensor *norm_sq);
/* gpt_update on the elements [begin, end) of the flat layout only (ZeRO-1:
 * the shard this process owns, inside the model's shard range): the norm of
 * the span's gradients, summed over the processes by reduce (when not
 * NULL), clips every process's update alike; an fp16 overflow anywhere
 * skips the step everywhere. */
gpc_status gpt_update_span(gpt_model *model, const gpc_optim_options *options, size_t begin,
                           size_t end, gpt_norm_reduce_fn reduce, void *user, float *grad_norm,
                           int *skipped);

/* Inference: forward on B x T tokens (no targets) and copy the logits of the
 * last position of each row to logits_out (host f32, [B, V]). Recomputes the
 * whole window each call; gpt_forward_cached does not. */
gpc_status gpt_forward_last_logits(gpt_model *model, const int32_t *inputs, int B, int T,
                                   float *logits_out);
/* Inference that keeps keys and values (generation): runs the n tokens at
 * positions start .. start+n-1 of one sequence and copies the logits of the
 * last of them to logits_out (host f32, [V]). Positions 0 .. start-1 are not
 * recomputed: their keys and values are the ones earlier calls left in the
 * model, so start must not exceed gpt_cached_len (the positions those
 * calls covered); start 0 begins a new sequence. start + n <= the model's T.
 * Afterwards cached_len is start + n. Any other forward overwrites what is
 * kept, and gpt_set_params and gpt_update make it stale (cached_len becomes
 * 0 with each). The logits equal gpt_forward_last_logits's
 * on the whole sequence up to rounding. A training model that recomputes
 * whole blocks keeps no keys and values for them, so each call runs the
 * sequence from position 0 again. */
gpc_status gpt_forward_cached(gpt_model *model, const int32_t *tokens, int start, int n,
                              float *logits_out);
/* Copies the logits of the last forward, [B,T,V] (host f32) for tests. */
gpc_status gpt_copy_logits(gpt_model *model, float *out);

/* ------------------------------------------------- serving: paged steps */

/* The model's side of a serving engine (src/model/gpt_serve.c): keys and
 * values of many sequences in a paged cache, and one step that runs N rows
 * (tokens of any sequences, at any positions) through the model together.
 * The cache is per layer [num_blocks, block_size, C] keys and as many
 * values, in the model's compute dtype on its device (ops.h, "serving");
 * the step's buffers are sized once for max_tokens rows, so a step
 * allocates nothing. The engine (src/serve/engine.c) owns the block tables. */
typedef struct gpt_paged gpt_paged;

typedef struct {
    int num_blocks; /* cache blocks, shared by all sequences */
    int block_size; /* positions per block */
    int max_seqs;   /* sequences in one step: rows of the block table */
    int max_tokens; /* rows of one step */
    int max_logits; /* rows of one step whose logits are wanted (<= max_tokens) */
    int eager;      /* 1: never replay decode steps as graphs (see gpt_step_paged) */
} gpt_paged_options;

/* Device bytes of one cache block over all layers, keys and values. */
size_t gpt_paged_block_bytes(const gpt_config *config, gpc_dtype dtype, int block_size);
/* Device bytes of a step's buffers (everything but the cache). */
size_t gpt_paged_step_bytes(const gpt_config *config, gpc_dtype dtype, const gpt_paged_options *o);
/* Allocates the cache and the step's buffers on the model's device. The
 * model must outlive them; an inference model of batch 1 x context 1 is
 * enough (the step keeps no activations in the model). */
gpc_status gpt_paged_create(gpt_paged **out, gpt_model *model, const gpt_paged_options *options);
void gpt_paged_free(gpt_paged *paged);
/* Blocks one sequence of the model's whole context needs: the width of a
 * block table's rows. */
int gpt_paged_max_blocks(const gpt_paged *paged);

/* One step. Row i is token tokens[i] at position positions[i] of sequence
 * seqs[i] (0 .. num_seqs-1, a row of block_tables [num_seqs,
 * gpt_paged_max_blocks], -1 past a sequence's last block); its keys and
 * values go to cache row slots[i] (block * block_size + position %
 * block_size). Rows may come in any order and may belong to any sequences;
 * a row attends to positions 0 .. its own of its sequence, which are either
 * in the cache already or rows of this step. Rows 0 .. num_logits-1 are the
 * ones whose next-token logits are wanted (a sequence's last row of the
 * step): put them first. */
typedef struct {
    int num_tokens;
    const int32_t *tokens, *positions, *seqs, *slots; /* host, [num_tokens] */
    int num_seqs;
    const int32_t *block_tables; /* host, [num_seqs, gpt_paged_max_blocks] */
    int num_logits;
    /* optional (NULL: none), host [num_tokens]: row i's input token is the
     * token drawn for logits row feed[i] of the previously launched step
     * (>= 0), or tokens[i] (-1). The gather happens on the device, so a
     * decode step can be launched before the previous step's tokens reach
     * the host. Only gpt_step_paged_launch takes it. */
    const int32_t *feed;
} gpt_paged_batch;

/* Runs a step: embedding, every layer (the keys and values of the rows
 * stored in the cache, attention read through the block tables) and the
 * output head for rows 0 .. num_logits-1, whose logits land in logits_out
 * (host f32 [num_logits, vocab_size]). Each row gets the logits
 * gpt_forward_cached gives at its position, up to rounding.
 * On a device with graphs (a GPU), a decode step (num_tokens == num_seqs ==
 * num_logits, at most 256) runs padded to the next of 1, 2, 4 .. 256 rows
 * (at most the planned sizes), the padding rows in a cache block of their
 * own, and each such size is captured as a CUDA graph at its second use and
 * replayed after, unless options.eager or GPC_SERVE_GRAPHS=0 says not. The
 * padding is the same with graphs off, so the switch changes no result. */
gpc_status gpt_step_paged(gpt_paged *paged, const gpt_paged_batch *batch, float *logits_out);

/* How row r of a step's logits rows is drawn on the model's device
 * (gpc_op_sample's parameters): temperature (<= 0: greedy), top_k (0:
 * all), top_p, a uniform number in [0, 1) from the request's generator,
 * and a token that must not be drawn (-1: none; min_tokens keeps the
 * end-of-text token out so). */
typedef struct {
    float temperature, top_k, top_p, uniform;
    int32_t forbidden;
} gpt_paged_sampling;

/* The step of gpt_step_paged, then a token for each logits row r drawn on
 * the device with rows[r] (host, [num_logits]), queued without waiting for
 * the device: the host may prepare the next step meanwhile (its feed takes
 * this step's tokens on the device). At most two steps are in flight;
 * batch and rows may be reused as soon as this returns. The logits never
 * leave the device: one upload of the step's integers and parameters, one
 * copy of the tokens back. */
gpc_status gpt_step_paged_launch(gpt_paged *paged, const gpt_paged_batch *batch,
                                 const gpt_paged_sampling *rows);
/* Waits for the oldest launched step and writes its num_logits drawn
 * tokens to tokens_out (host). */
gpc_status gpt_step_paged_collect(gpt_paged *paged, int32_t *tokens_out);
/* Device time of the last collected step, from its start to its draw
 * (events on the device's stream; wall time on the CPU). */
double gpt_paged_collected_seconds(const gpt_paged *paged);
/* Launch and collect of one step, with nothing else in flight. */
gpc_status gpt_step_paged_sample(gpt_paged *paged, const gpt_paged_batch *batch,
                                 const gpt_paged_sampling *rows, int32_t *tokens_out);

/* ------------------------------------------------------------ checkpoints */

#define GPT_CHECKPOINT_VERSION 1

/* What a training run needs besides the weights to continue exactly. */
typedef struct {
    uint64_t step; /* optimizer steps done */
    uint64_t loader_epoch;
    uint64_t loader_batch;
    gpc_rng rng;
    float loss_scale;
    /* the training settings of the run */
    int32_t batch;
    int32_t context;
    int64_t total_batch;
    int32_t steps;
    int32_t warmup;
    double learning_rate;
    double min_lr_ratio;
    double weight_decay;
    double max_grad_norm;
    uint64_t seed;
    int32_t recompute; /* the run's --recompute; -1 in checkpoints that predate it */
} gpt_checkpoint_state;

/* File: magic "GPCCKPT\0", version, config, precision, state, parameters
 * (f32 master), AdamW m and v (absent when the model has none), CRC-32C of
 * everything before it. Written atomically. */
gpc_status gpt_checkpoint_save(const char *path, const gpt_model *model,
                               const gpt_checkpoint_state *state);
/* The whole optimizer state of a sharded model gathered on the host
 * (gpc_ddp_gather_state): [num_params] f32 each; master NULL when the
 * parameters are f32 (params_flat is then the master copy). */
typedef struct {
    float *master, *m, *v;
} gpt_host_state;
void gpt_host_state_free(gpt_host_state *state);
/* gpt_checkpoint_save taking master weights, m and v from full (when not
 * NULL) instead of the model: how a sharded model writes a whole checkpoint. */
gpc_status gpt_checkpoint_save_full(const char *path, const gpt_model *model,
                                    const gpt_checkpoint_state *state, const gpt_host_state *full);
/* A checkpoint of weights alone (f32, no optimizer state) straight from a
 * host array of gpt_config_num_params(config) floats in gpc's order, with no
 * model built: what an import writes, holding the weights once. Loads like
 * any checkpoint of an f32 model that is not training. */
gpc_status gpt_checkpoint_save_weights(const char *path, const gpt_config *config,
                                       const float *params, const gpt_checkpoint_state *state);
/* Reads and checks the header only (magic, version, size): the config and
 * precision the checkpoint was written with and its state. */
gpc_status gpt_checkpoint_read_header(const char *path, gpt_config *config, gpc_dtype *precision,
                                      gpt_checkpoint_state *state);
/* Loads weights (and m, v when the model trains and the file has them) after
 * checking magic, version, size, checksum and that the file's config equals
 * the model's. A sharded model keeps its shard of the optimizer state, so a
 * checkpoint loads at any world size. state may be NULL. */
gpc_status gpt_checkpoint_load(const char *path, gpt_model *model, gpt_checkpoint_state *state);
/* The same checks, and the weights alone: the file's optimizer state is
 * left behind and a training model's m and v start at zero. The file may
 * come from any device and precision (its values are f32); a model part
 * takes its slice. How --init-from starts a run, with no host copy of the
 * model. */
gpc_status gpt_checkpoint_load_weights(const char *path, gpt_model *model);

/* ----------------------------------------------------------------- LoRA */

/* Low-rank adapters (Hu et al. 2021, "LoRA"): on each chosen projection
 * W [out, in] of every block, A [R, in] and B [out, R] add
 * (alpha / R) * x . A^T . B^T to the projection's output. B starts at zero,
 * so a new adapter leaves the model's output unchanged. The base weights are
 * frozen: a LoRA model holds no gradients and no optimizer state for them,
 * its optimizer's ranges are the adapters alone, and backward skips the
 * base weights' products. Adapters compute in the model's dtype; with bf16
 * or fp16 the optimizer keeps their f32 master copy. */
enum { GPT_LORA_QKV = 1, GPT_LORA_PROJ = 2, GPT_LORA_FC = 4, GPT_LORA_FCPROJ = 8 };
#define GPT_LORA_TARGETS 4
#define GPT_LORA_ALL 15u

typedef struct {
    int rank;         /* R, 1 .. channels */
    float alpha;      /* the scale is alpha / R; 0 means alpha = R (scale 1) */
    unsigned targets; /* GPT_LORA_* bits; 0 means all four */
    uint64_t seed;    /* of A's initialisation */
} gpt_lora_options;

/* "qkv,proj,fc,fcproj" (any non-empty subset, comma-separated) into bits. */
gpc_status gpt_lora_parse_targets(const char *list, unsigned *targets);
/* Adapter elements for a config, rank and targets: per layer and target
 * R * (in + out). */
size_t gpt_lora_count_params(const gpt_config *config, int rank, unsigned targets);
/* gpt_create_recompute with adapters: the base as gpt_create makes it (set
 * it with gpt_set_params or gpt_checkpoint_load), A drawn from a normal of
 * variance 1/(3 in) (PEFT's Kaiming-uniform variance) and B zero. Training
 * computes gradients for the adapters only. */
gpc_status gpt_create_lora(gpt_model **out, const gpt_config *config, gpc_device device,
                           gpc_dtype dtype, int B, int T, int training, int recompute,
                           const gpt_lora_options *lora);
/* The adapters' options (alpha and targets filled in), NULL for a model
 * without adapters. */
const gpt_lora_options *gpt_lora_of(const gpt_model *model);
/* Adapter elements (0 without adapters). Layout: for each chosen target in
 * the order qkv, proj, fc, fcproj, A [L, R, in] then B [L, out, R]. */
size_t gpt_lora_num_params(const gpt_model *model);
/* Sets and reads the adapters as f32 host values in that layout. */
gpc_status gpt_lora_set_params(gpt_model *model, const float *values);
gpc_status gpt_lora_get_params(const gpt_model *model, float *values);
/* The base parameters with the adapters folded in (W += scale * B . A,
 * summed in double), [num_params] f32 host values: a plain model's. */
gpc_status gpt_lora_merged_params(const gpt_model *model, float *values);

#define GPT_LORA_VERSION 1
/* Adapter file: magic "GPCLORA\0", version, config, rank, alpha, targets,
 * the training state, the base run's folder, adapters f32, AdamW m and v
 * when the model trains, CRC-32C of everything before it. Written
 * atomically; a few MB where the base is hundreds. */
gpc_status gpt_lora_save(const char *path, const gpt_model *model,
                         const gpt_checkpoint_state *state, const char *base_run);
/* Checks magic, version and checksum, then reads the header: base_run gets
 * the base run's folder (NUL-terminated, cut to base_size). Any output may
 * be NULL. */
gpc_status gpt_lora_read_header(const char *path, gpt_config *config, gpt_lora_options *lora,
                                gpt_checkpoint_state *state, char *base_run, size_t base_size);
/* Loads adapters (and m, v when the model trains) into a LoRA model with
 * the same config, rank and targets. */
gpc_status gpt_lora_load(const char *path, gpt_model *model, gpt_checkpoint_state *state);

/* ------------------------------------------------------ quantized weights */

/* Weights quantized for inference (gpc quantize): the four matrix weights of
 * every block (qkvw, attprojw, fcw, fcprojw) as 8-bit values q with f32
 * scales, W[o,c] = q[o,c] * scale. int8 is symmetric with a scale per
 * output channel, max|W[o,:]| / 127; fp8 is E4M3 with a scale per output
 * channel or per matrix, amax / 448. The tied embedding and output head
 * (wte), wpe, biases and layernorms stay in the compute dtype: the head's
 * logits feed the sampler directly, and one matrix's error there shifts
 * every token's probability. They are 32% of GPT-2 124M's weights (wte is
 * large next to 12 small layers) and 5% of 1.5B's. */
typedef struct {
    gpc_dtype dtype; /* GPC_I8 or GPC_F8E4M3 */
    int per_channel; /* 1: a scale per output channel; 0: one per matrix (fp8 only) */
} gpt_quant_options;

/* Whether parameter tensor `index` is quantized (the four matrix weights). */
int gpt_param_quantized(int index);
/* "int8" or "fp8", and "channel" or "tensor" (NULL: channel), into options;
 * int8 takes per-channel scales only. */
gpc_status gpt_quant_parse(const char *to, const char *scales, gpt_quant_options *out);
/* "int8/channel", "fp8/tensor", ... for messages and config.txt. */
const char *gpt_quant_name(const gpt_quant_options *q);
/* Quantizes a [rows, cols] f32 matrix on the host into q [rows, cols] and
 * scales [rows] (per channel) or [1]. A row of zeros gets scale 1. Refuses
 * non-finite values (the weight's name in `what`). */
gpc_status gpt_quantize_matrix(const float *w, int64_t rows, int64_t cols,
                               const gpt_quant_options *options, uint8_t *q, float *scales,
                               const char *what);
/* The value of one quantized element before its scale. */
float gpt_quant_value(gpc_dtype dtype, uint8_t q);

/* An inference model with quantized weights: as gpt_create with training 0,
 * and the same forward functions (gpt_forward, gpt_forward_last_logits,
 * gpt_forward_cached), whose matrix products run as
 * gpc_op_matmul_quant_forward. gpt_set_params quantizes f32 values;
 * gpt_get_params returns the dequantized ones. */
gpc_status gpt_create_quant(gpt_model **out, const gpt_config *config, gpc_device device,
                            gpc_dtype dtype, int B, int T, const gpt_quant_options *quant);
/* The model's quantization, NULL for a plain model. */
const gpt_quant_options *gpt_quant_of(const gpt_model *model);
/* Bytes of a config's weights quantized so (the quantized matrices, their
 * scales, the rest in a compute dtype of dense_bytes per element). */
size_t gpt_quant_weight_bytes(const gpt_config *config, const gpt_quant_options *quant,
                              size_t dense_bytes);

#define GPT_QUANT_VERSION 1
/* File (a run's quant.bin): magic "GPCQUANT", version, config, the
 * quantization, the precision of the checkpoint it came from, then the
 * other tensors f32 in layout order, then for each quantized tensor its
 * scales f32 and its bytes, then CRC-32C of everything before it. Written
 * atomically. */
gpc_status gpt_quant_save(const char *path, const gpt_model *model, gpc_dtype source_precision);
/* Checks magic, version, size and checksum, then reads the header. Any
 * output may be NULL. */
gpc_status gpt_quant_read_header(const char *path, gpt_config *config, gpt_quant_options *quant,
                                 gpc_dtype *source_precision);
/* Loads a quant.bin into a quantized model of the same config and
 * quantization. */
gpc_status gpt_quant_load(const char *path, gpt_model *model);

/* ------------------------------------------------------ run folders */

/* The weights of a run folder for inference: RUN/quant.bin (quantized,
 * *quant filled in) when there, else RUN/checkpoint.bin (quant->dtype
 * GPC_F32). path (size bytes) receives the file's path; config its model.
 * quant may be NULL. */
gpc_status gpt_run_weights(const char *run_dir, char *path, size_t size, gpt_config *config,
                           gpt_quant_options *quant);
/* An inference model (training 0) for a run folder's weights, quantized or
 * not (gpt_run_weights), loaded: what gpc sample, gpc eval and the serving
 * engine create. */
gpc_status gpt_create_from_run(gpt_model **out, const char *run_dir, gpc_device device,
                               gpc_dtype dtype, int B, int T);

#ifdef __cplusplus
}
#endif

#endif /* GPC_MODEL_H */
