/*
 * ops.h: every numeric operation of gpc, declared once.
 *
 * Each function checks shapes, dtypes and devices of its tensors (a mismatch
 * is GPC_ERR_MISMATCH with a message naming the tensor), then dispatches to
 * the backend of the tensors' device (src/cpu/ or src/cuda/). All tensors of
 * one call must live on the same device. The model (src/model/) is written
 * against this header only, so a new backend needs no model changes.
 *
 * Shapes use B (batch), T (time, sequence position), C (channels), NH (number
 * of heads), V (vocabulary as used by the classifier), Vp (vocabulary padded
 * to a multiple of 64 for aligned matrix products), N = B*T rows.
 *
 * Gradient convention (the one that makes gradient accumulation work):
 * parameter gradients are ACCUMULATED (+=) so micro-steps add up; activation
 * gradients are OVERWRITTEN (=), except layernorm's dinp, which ACCUMULATES
 * because it adds into the residual stream's gradient, shared by the whole
 * stack of blocks. The model therefore needs no separate residual backward.
 *
 * Precision: f32 tensors everywhere on the CPU. On CUDA, activations and the
 * parameters used in compute may be bf16 or f16; statistics (mean, rstd, lse,
 * losses) and optimizer state are always f32.
 */
#ifndef GPC_OPS_H
#define GPC_OPS_H

#include "gpc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[B,T,C] = wte[tokens[b,t], :] + wpe[t, :]. tokens is i32 [B,T] on the
 * same device; wte [Vp,C]; wpe [maxT,C] with T <= maxT. */
gpc_status gpc_op_embedding_forward(gpc_tensor *out, const gpc_tensor *tokens,
                                    const gpc_tensor *wte, const gpc_tensor *wpe);
/* dwte += scatter of dout by token; dwpe[t] += sum over b of dout[b,t]. */
gpc_status gpc_op_embedding_backward(gpc_tensor *dwte, gpc_tensor *dwpe, const gpc_tensor *dout,
                                     const gpc_tensor *tokens);

/* The embedding over a slice of the vocabulary (tensor parallelism: each
 * rank holds rows row0 .. row0 + R - 1 of the whole table as wte [R, C]):
 * out[b,t,:] = wte[tokens[b,t] - row0, :] for a token in the slice and 0
 * for any other, plus wpe[t, :] when wpe is not NULL. Summed over the
 * slices (with wpe given on one of them) this is gpc_op_embedding_forward. */
gpc_status gpc_op_embedding_slice_forward(gpc_tensor *out, const gpc_tensor *tokens,
                                          const gpc_tensor *wte, const gpc_tensor *wpe,
                                          int64_t row0);
/* dwte[v - row0] += the dout rows of each token v in the slice (the others
 * are skipped); dwpe[t] += sum over b of dout[b,t], as
 * gpc_op_embedding_backward. */
gpc_status gpc_op_embedding_slice_backward(gpc_tensor *dwte, gpc_tensor *dwpe,
                                           const gpc_tensor *dout, const gpc_tensor *tokens,
                                           int64_t row0);

/* out[N,C] = (inp - mean) * rstd * weight + bias, eps = 1e-5; writes mean[N]
 * and rstd[N] (f32) for the backward pass. inp may be [B,T,C] or [N,C]. */
gpc_status gpc_op_layernorm_forward(gpc_tensor *out, gpc_tensor *mean, gpc_tensor *rstd,
                                    const gpc_tensor *inp, const gpc_tensor *weight,
                                    const gpc_tensor *bias);
/* dinp += ..., dweight += ..., dbias += ...; and dinp_sum [C] (may be NULL)
 * += the column sums of dinp as it came in, before this op adds to it. In a
 * transformer block dinp is the residual stream's gradient, whose column sums
 * are the bias gradient of the projection added to the residual before this
 * layernorm: the model takes that bias gradient here, from the rows this op
 * reads anyway, instead of reading the [N,C] gradient again in
 * gpc_op_matmul_backward. */
gpc_status gpc_op_layernorm_backward(gpc_tensor *dinp, gpc_tensor *dweight, gpc_tensor *dbias,
                                     gpc_tensor *dinp_sum, const gpc_tensor *dout,
                                     const gpc_tensor *inp, const gpc_tensor *weight,
                                     const gpc_tensor *mean, const gpc_tensor *rstd);

/* Fused residual add and layernorm: residual = a + b, then
 * out = layernorm(residual). Backends without a fused kernel run the two
 * steps; the result is the same. */
gpc_status gpc_op_residual_layernorm_forward(gpc_tensor *residual, gpc_tensor *out,
                                             gpc_tensor *mean, gpc_tensor *rstd,
                                             const gpc_tensor *a, const gpc_tensor *b,
                                             const gpc_tensor *weight, const gpc_tensor *bias);

/* out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC]; bias may be NULL.
 * inp may be [B,T,C]; out then is [B,T,OC]. */
gpc_status gpc_op_matmul_forward(gpc_tensor *out, const gpc_tensor *inp, const gpc_tensor *weight,
                                 const gpc_tensor *bias);
/* out[N,OC] = residual[N,OC] + inp[N,C] @ weight[OC,C]^T + bias[OC], rounded
 * once: a projection added to the residual stream in one product, so the
 * projection's output is never stored and read back. bias may be NULL; out
 * may alias residual (the stream updated in place). */
gpc_status gpc_op_matmul_residual_forward(gpc_tensor *out, const gpc_tensor *inp,
                                          const gpc_tensor *weight, const gpc_tensor *bias,
                                          const gpc_tensor *residual);
/* A product with quantized weights (inference only; gpc quantize):
 * out[N,OC] = [residual +] inp[N,C] @ W^T + bias, where W[o,c] =
 * qweight[o,c] * scales[o] (or scales[0] for every row), qweight [OC,C] i8
 * or f8e4m3, scales f32 [OC] (per output channel) or [1] (per tensor). The
 * CPU dequantizes to f32 and multiplies in f32; the GPU reads the weights
 * in 8 bits and accumulates in f32 (per-tensor fp8 on Hopper: cuBLASLt's
 * FP8 tensor cores, the activations quantized per tensor on the fly).
 * bias and residual may be NULL; out may alias residual. */
gpc_status gpc_op_matmul_quant_forward(gpc_tensor *out, const gpc_tensor *inp,
                                       const gpc_tensor *qweight, const gpc_tensor *scales,
                                       const gpc_tensor *bias, const gpc_tensor *residual);
/* The same product followed by GELU, for fc's product of a quantized
 * model: out_pre[N,OC] = inp @ W^T + bias (bias may be NULL) and out_gelu =
 * gelu(out_pre). The result is that of gpc_op_matmul_quant_forward then
 * gpc_op_gelu_forward; CUDA's skinny kernel (decode's few rows) applies
 * GELU as it stores, so the step runs one kernel instead of two. */
gpc_status gpc_op_matmul_quant_gelu_forward(gpc_tensor *out_pre, gpc_tensor *out_gelu,
                                            const gpc_tensor *inp, const gpc_tensor *qweight,
                                            const gpc_tensor *scales, const gpc_tensor *bias);
/* dinp = dout @ weight (overwritten), dweight += dout^T @ inp, dbias +=
 * column sums of dout. Each of the three may be NULL to skip it (not all
 * three), so the input gradient and the weight gradients can be computed
 * apart. */
gpc_status gpc_op_matmul_backward(gpc_tensor *dinp, gpc_tensor *dweight, gpc_tensor *dbias,
                                  const gpc_tensor *dout, const gpc_tensor *inp,
                                  const gpc_tensor *weight);

/* GELU, tanh approximation as in GPT-2:
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
gpc_status gpc_op_gelu_forward(gpc_tensor *out, const gpc_tensor *inp);
/* dinp = gelu'(inp) * dout (overwritten). dinp may alias dout. */
gpc_status gpc_op_gelu_backward(gpc_tensor *dinp, const gpc_tensor *inp, const gpc_tensor *dout);

/* out = a + b, same shapes. out may alias a or b. */
gpc_status gpc_op_residual_forward(gpc_tensor *out, const gpc_tensor *a, const gpc_tensor *b);

/* Causal multi-head self-attention. qkv [B,T,3C] holds q, k, v side by side
 * (each [B,T,NH,C/NH] within its third). out [B,T,C]. lse [B,NH,T] (f32)
 * receives the log-sum-exp of each row of scaled scores, which is all the
 * backward pass needs to rebuild the probabilities: no T x T matrix is kept. */
gpc_status gpc_op_attention_forward(gpc_tensor *out, gpc_tensor *lse, const gpc_tensor *qkv,
                                    int num_heads);
/* Attention of the last Tq positions over all Tk positions of qkv, for
 * generation that keeps keys and values: qkv [B,Tk,3C] holds q, k and v of
 * positions 0..Tk-1 (of the first Tk-Tq positions only k and v are read), and
 * out [B,Tq,C] receives rows Tk-Tq .. Tk-1 of causal attention over qkv, the
 * same values gpc_op_attention_forward gives those rows. Forward only: no
 * lse is written. */
gpc_status gpc_op_attention_decode(gpc_tensor *out, const gpc_tensor *qkv, int num_heads);
/* dqkv [B,T,3C] (overwritten) from dout [B,T,C], using qkv, out and lse of
 * the forward pass. */
gpc_status gpc_op_attention_backward(gpc_tensor *dqkv, const gpc_tensor *dout,
                                     const gpc_tensor *qkv, const gpc_tensor *out,
                                     const gpc_tensor *lse, int num_heads);
/* Readies attention for qkv's shape [B,T,3C] before the first step, so that
 * what the path needs is built and placed at setup, not inside a step: with
 * cuDNN, the execution plans (forward, and backward when backward is 1) and
 * their workspace. A shape the chosen path cannot run fails here when that
 * path was asked for by name; under auto it leaves the shape to gpc's kernels.
 * Only qkv's shape, dtype and device are read. */
gpc_status gpc_op_attention_prepare(const gpc_tensor *qkv, int num_heads, int backward);

/* Which implementation runs attention on a GPU (the CPU has one, and ignores
 * this): gpc's flash-attention kernels (src/cuda/attention.cu), cuDNN's
 * fused flash attention (bf16 and f16; libcudnn loaded at run time,
 * src/cuda/attention_cudnn.cu), or auto, the faster of the two for the GPU
 * and dtype (docs/ARCHITECTURE.md says which it picks and why). simple is
 * gpc's exact one-warp-per-row kernel, for comparisons. Asking for cudnn
 * where it cannot run is an error at the first attention call, never a
 * silent fallback. */
typedef enum {
    GPC_ATTENTION_AUTO = 0,
    GPC_ATTENTION_GPC,
    GPC_ATTENTION_CUDNN,
    GPC_ATTENTION_SIMPLE,
} gpc_attention_path;

/* The head sizes cuDNN's fused attention engines take (cudnn-frontend's
 * support checks: a multiple of 8 up to 128, for the backward too); the
 * cuDNN path checks it, and gpc plan counts cuDNN's dQ accumulator by it. */
static inline int gpc_attention_cudnn_head_size_ok(int64_t head_size) {
    return head_size % 8 == 0 && head_size <= 128;
}

/* "auto", "gpc", "cudnn" or "simple"; anything else is GPC_ERR_INVALID_ARG. */
gpc_status gpc_attention_path_parse(const char *name, gpc_attention_path *out);
const char *gpc_attention_path_name(gpc_attention_path path);
/* Sets the path for the whole process (gpc train --attention); NULL goes
 * back to the environment's GPC_ATTENTION. A bad name changes nothing. */
gpc_status gpc_op_set_attention_path(const char *name);
/* The path in force: the one set, else GPC_ATTENTION, else auto. A bad
 * GPC_ATTENTION is GPC_ERR_INVALID_ARG with a message naming it. */
gpc_status gpc_op_attention_path(gpc_attention_path *out);

/* ------------------------------------------------------------ serving
 *
 * The ops of a serving step (src/serve/), where one step runs N tokens of
 * many sequences together: the new tokens of each sequence (one for a
 * decode, a chunk of its prompt for a prefill), flattened into rows. Keys
 * and values live in a paged cache: per layer, k_cache and v_cache are
 * [num_blocks, block_size, C] of the model's compute dtype, allocated once;
 * a sequence owns whole blocks, listed in its row of block_tables
 * [S, max_blocks] (i32; -1 past its last block). Position p of sequence s
 * is row block_tables[s][p / block_size] * block_size + p % block_size of
 * the cache seen as [num_blocks * block_size, C], its "slot". */

/* out[N,C] = wte[tokens[i], :] + wpe[positions[i], :]: the embedding of
 * tokens at arbitrary positions. tokens and positions i32 [N]; wte [Vp,C];
 * wpe [maxT,C], every position < maxT. */
gpc_status gpc_op_embedding_at(gpc_tensor *out, const gpc_tensor *tokens,
                               const gpc_tensor *positions, const gpc_tensor *wte,
                               const gpc_tensor *wpe);
/* Writes the keys and values of qkv [N,3C] (the second and third thirds of
 * each row) to rows slots[i] of k_cache and v_cache (slots i32 [N], each in
 * 0 .. num_blocks * block_size - 1). qkv and the caches share a dtype. */
gpc_status gpc_op_kv_store(gpc_tensor *k_cache, gpc_tensor *v_cache, const gpc_tensor *qkv,
                           const gpc_tensor *slots);
/* Causal attention of N query rows over the paged cache: row i is the query
 * (first third of qkv [N,3C]) of sequence token_seq[i] at position
 * token_pos[i] (both i32 [N]); it attends to positions 0 .. token_pos[i] of
 * that sequence, read from k_cache and v_cache through the sequence's row of
 * block_tables, so the step's own keys and values must be stored first
 * (gpc_op_kv_store). out [N,C] gets the same values as gpc_op_attention_forward
 * gives that row on the contiguous sequence, up to rounding. The CPU checks
 * every index of the serving ops; CUDA trusts the engine's tables (checking
 * would read them back inside the step) but stays inside every tensor: see
 * src/cuda/paged.cu for what a bad entry gives. With few rows, CUDA's
 * paged_attention uses the scratch buffer, sized at its first call of a
 * shape: run a step before capturing it in a CUDA graph. */
gpc_status gpc_op_paged_attention(gpc_tensor *out, const gpc_tensor *qkv, const gpc_tensor *k_cache,
                                  const gpc_tensor *v_cache, const gpc_tensor *block_tables,
                                  const gpc_tensor *token_seq, const gpc_tensor *token_pos,
                                  int num_heads);

/* The products of a decode step (a serving step of a few rows), each with
 * what surrounds it in the model fused in, so that a layer runs a handful
 * of kernels instead of one per op (gpt_serve.c, GPC_DECODE_FUSED_MAX_M):
 *   x   = inp [N, C], or layernorm(inp) with ln_weight and ln_bias (eps
 *         1e-5, rounded to inp's dtype as gpc_op_layernorm_forward writes
 *         it; mean and rstd are not kept);
 *   y   = x @ weight^T + bias (weight [OC, C]; bias [OC] or NULL);
 *   out = y, or residual + y (residual [N, OC] of out's dtype, may be out:
 *         the stream updated in place), or gelu(y) with gelu set (GELU of y
 *         rounded to out's dtype, as gpc_op_matmul_gelu_forward's out_gelu);
 *         rounded once;
 *   with k_cache, v_cache and slots (qkv's product, OC = 3 C'): columns C' ..
 *         2C'-1 and 2C' .. 3C'-1 of each row of out also go to row slots[i]
 *         of k_cache and v_cache, as gpc_op_kv_store would copy them.
 * So the result is that of gpc_op_layernorm_forward, then
 * gpc_op_matmul_forward (or _residual_forward, or _gelu_forward), then
 * gpc_op_kv_store; the CPU runs exactly those. N is at most
 * GPC_DECODE_MAX_ROWS; out must not share inp's buffer. CUDA streams the
 * weight once, at close to the memory's rate, in one kernel
 * (src/cuda/decode.cu); it trusts the slots as gpc_op_kv_store does. */
#define GPC_DECODE_MAX_ROWS 16
typedef struct {
    const gpc_tensor *ln_weight, *ln_bias; /* both or neither: the layernorm prologue */
    const gpc_tensor *bias;                /* NULL: none */
    const gpc_tensor *residual;            /* NULL: none; not with gelu */
    int gelu;                              /* out = gelu(y) */
    gpc_tensor *k_cache, *v_cache;         /* all three or none: the cache store */
    const gpc_tensor *slots;
} gpc_decode_product_args;
/* args NULL: the plain product. */
gpc_status gpc_op_decode_product(gpc_tensor *out, const gpc_tensor *inp, const gpc_tensor *weight,
                                 const gpc_decode_product_args *args);

/* The next token of each of R rows: tokens_out i32 [R] gets a token of
 * logits [R, Vp] (any float dtype; the first vocab_size columns are real),
 * drawn by the rule of gpc_sample_select with row r's parameters params
 * [R, 4] (f32): temperature, top_k, top_p, and a uniform number in [0, 1)
 * that the caller draws from the request's generator. Temperature 0 is the
 * first largest logit. The CPU checks the parameters (temperature >= 0,
 * top_k >= 0, top_p in (0, 1], uniform in [0, 1)); the GPU cannot without
 * reading them back, so there temperature <= 0 (or NaN) is greedy, top_k
 * is clamped to 0 .. vocab_size, top_p above 1 keeps every token and the
 * uniform is clamped to [0, 1). The logits must be finite but for -inf.
 * The GPU sums weights in fixed point (2^-36 of the largest), so its token
 * differs from the CPU's only where the uniform or top_p falls within about
 * 1e-6 of a boundary between two tokens. */
gpc_status gpc_op_sample(gpc_tensor *tokens_out, const gpc_tensor *logits, int vocab_size,
                         const gpc_tensor *params);

/* Takes one token per row out of the draw: logits [R, Vp] (any float
 * dtype) get -inf at [r, tokens[r]] for each row whose tokens[r] (i32 [R])
 * is in 0 .. Vp-1; a negative entry leaves its row as it is. The serving
 * engine uses it for min_tokens (the end-of-text token is not drawn yet)
 * before gpc_op_sample, without the logits leaving the device. The CPU
 * rejects an entry of Vp or more; the GPU cannot read the entries back, so
 * there it leaves such a row as it is. */
gpc_status gpc_op_forbid_tokens(gpc_tensor *logits, const gpc_tensor *tokens);

/* The input tokens of a step that follows another without waiting for it:
 * tokens[i] = previous[feed[i]] where feed[i] >= 0, else tokens[i] is left
 * as it is (tokens and feed i32 [N], previous i32 [R], the tokens the
 * previous step drew). A decode step so takes each sequence's last token
 * straight from the device, before that token reaches the host. The CPU
 * rejects an entry of R or more; the GPU cannot read the entries back, so
 * there such a row keeps its token. */
gpc_status gpc_op_feed_tokens(gpc_tensor *tokens, const gpc_tensor *feed,
                              const gpc_tensor *previous);

/* The sampling rule of gpc_op_sample for one row, on the host, shared by
 * the CPU backend and gpc_sample_token (gpc/serve.h) so that both draw the
 * same token from the same uniform. temperature <= 0: the first largest of
 * logits[0 .. V). Otherwise the candidates are the top_k largest (top_k 0
 * or >= V: all V), ranked by logit, largest first, equal logits by id. Each
 * weighs w = expf((logit - max) / temperature) (f32; sums in double). With
 * top_p < 1 they shrink to the shortest prefix of that ranking whose
 * weight reaches top_p of their total. The token is then the first
 * candidate whose running sum of weights exceeds uniform * total, in the
 * ranking's order, except with all V candidates and top_p >= 1, where the
 * order is the ids' (no sort needed). scratch holds 8 * V bytes. */
uint32_t gpc_sample_select(const float *logits, int V, float temperature, int top_k, float top_p,
                           double uniform, void *scratch);

/* Fused softmax + cross-entropy over logits [N,Vp], of which the first
 * vocab_size columns are real. losses [N] (f32) receives -log p[target].
 * If dlogits is not NULL it receives (softmax - onehot(target)) * dloss with
 * zeros in the padded columns; dlogits may alias logits (in place), which is
 * how the model saves a [N,Vp] buffer. targets is i32 [N] or [B,T]; a target
 * of -1 masks the row (loss 0, gradient 0). */
gpc_status gpc_op_crossentropy_forward_backward(gpc_tensor *losses, gpc_tensor *dlogits,
                                                const gpc_tensor *logits, const gpc_tensor *targets,
                                                int vocab_size, float dloss);

/* The cross-entropy over a slice of the vocabulary (Megatron-LM's
 * vocab-parallel cross-entropy, Shoeybi et al. 2019): logits [N, S] are
 * columns col0 .. col0 + S - 1 of the whole [N, Vp], of which the first
 * vocab_size are real; stats is f32 [3, N]. Three steps, with a reduction
 * over the slices after each of the first two:
 *  - slice_max: stats[0][n] = the largest real logit of row n in the slice
 *    (-inf when the slice has none); then stats[0] = the max over slices.
 *  - slice_sums: stats[1][n] = sum over the slice's real columns of
 *    exp(logit - stats[0][n]), stats[2][n] = the target's logit when the
 *    target is in the slice, else 0; then stats[1..2] = the sums over slices.
 *  - slice_finish: losses[n] = stats[0] + log(stats[1]) - stats[2] (0 for a
 *    target of -1), and, when dlogits is not NULL (it may alias logits),
 *    dlogits = (softmax - onehot(target)) * dloss on the slice, zeros in the
 *    padded columns and in masked rows.
 * So no slice ever holds the whole row's logits; the losses and gradients
 * are what gpc_op_crossentropy_forward_backward gives on the whole row.
 * targets i32 [N] (or [B, T]) index the whole vocabulary. */
gpc_status gpc_op_crossentropy_slice_max(gpc_tensor *stats, const gpc_tensor *logits, int64_t col0,
                                         int vocab_size);
gpc_status gpc_op_crossentropy_slice_sums(gpc_tensor *stats, const gpc_tensor *logits,
                                          const gpc_tensor *targets, int64_t col0, int vocab_size);
gpc_status gpc_op_crossentropy_slice_finish(gpc_tensor *losses, gpc_tensor *dlogits,
                                            const gpc_tensor *logits, const gpc_tensor *targets,
                                            const gpc_tensor *stats, int64_t col0, int vocab_size,
                                            float dloss);

/* The output head of a training step: logits = inp . weight^T into logits
 * [N, Vp] (scratch: what it holds afterwards is the backend's: dlogits for
 * the three ops below, exp(logits - 16) lowered at the targets on Hopper),
 * losses [N] and dlogits as gpc_op_crossentropy_forward_backward
 * computes them (first vocab_size columns real, target -1 masks a row),
 * then dinp = dlogits . weight (overwritten) and dweight += dlogits^T . inp.
 * inp [N, C] (or [B, T, C]), weight [Vp, C], dweight like weight, dinp like
 * inp; inp, weight, logits, dinp and dweight of one float dtype, losses f32,
 * targets i32 [N] (or [B, T]). dinp and logits must have buffers of their
 * own (the products still read inp, weight and the logits while they are
 * written). A backend may fuse these so that dlogits is never stored
 * (CUDA on Hopper, in bf16: src/cuda/classifier_sm90.cu, which wants each
 * row's largest logit in [-50, 80) and gives a NaN loss for a row outside
 * it; GPC_GEMM_SM90_HEAD=0 turns it off); otherwise they run as gpc_op_matmul_forward,
 * gpc_op_crossentropy_forward_backward (in place) and gpc_op_matmul_backward
 * in turn, and give exactly what those three give. */
gpc_status gpc_op_classifier(gpc_tensor *losses, gpc_tensor *dinp, gpc_tensor *dweight,
                             gpc_tensor *logits, const gpc_tensor *inp, const gpc_tensor *weight,
                             const gpc_tensor *targets, int vocab_size, float dloss);

/* Adds the sum of squares of x (any float dtype) to acc[0] (f32, one
 * element). Used for the global gradient norm: zero acc, call once per
 * gradient buffer. */
gpc_status gpc_op_sum_squares(gpc_tensor *acc, const gpc_tensor *x);

typedef struct {
    float learning_rate;
    float beta1;
    float beta2;
    float eps;
    float weight_decay; /* decoupled (AdamW), applied as param -= lr * wd * param */
    int step;           /* 1-based, for bias correction */
    /* Gradient clipping by global norm: with grad_norm_sq (device f32 [1],
     * the output of gpc_op_sum_squares) and max_grad_norm > 0, gradients are
     * scaled by min(1, max_grad_norm / sqrt(grad_norm_sq)) before the update.
     * grad_scale multiplies gradients as well (1/loss_scale for fp16). */
    const gpc_tensor *grad_norm_sq;
    float max_grad_norm;
    float grad_scale;
    /* With grad_norm_sq: a non-finite norm (fp16 gradients that overflowed)
     * leaves params, master, m and v as they were, decided on the device so
     * the host need not read the norm first. */
    int skip_nonfinite;
    uint32_t seed; /* 0: an f32 master's low-precision copy is rounded to nearest;
                    * otherwise stochastically, seeded by this */
} gpc_adamw_args;

/* One AdamW step over a flat parameter buffer. master is the f32 copy of
 * params when params are bf16/f16 (NULL when params are f32); m and v f32.
 * grads may be f32, bf16 or f16. */
gpc_status gpc_op_adamw(gpc_tensor *params, gpc_tensor *master, const gpc_tensor *grads,
                        gpc_tensor *m, gpc_tensor *v, const gpc_adamw_args *args);

/* dst = src converted between float dtypes (f32, bf16, f16), same numel. */
gpc_status gpc_op_convert(gpc_tensor *dst, const gpc_tensor *src);

/* x *= factor, in place (any float dtype). */
gpc_status gpc_op_scale(gpc_tensor *x, float factor);

/* The linear layer and GELU in one: out_pre[N,OC] = inp @ weight^T + bias
 * (bias may be NULL), kept for the backward pass, and out_gelu = gelu(out_pre).
 * The result is that of gpc_op_matmul_forward then gpc_op_gelu_forward;
 * CUDA computes both in one cuBLASLt product (GELU in the epilogue), so the
 * [N,OC] pre-activation is not read back by a separate GELU kernel. */
gpc_status gpc_op_matmul_gelu_forward(gpc_tensor *out_pre, gpc_tensor *out_gelu,
                                      const gpc_tensor *inp, const gpc_tensor *weight,
                                      const gpc_tensor *bias);
/* gpc_op_matmul_backward for a layer whose input was inp = gelu(gelu_inp):
 * dinp = gelu'(gelu_inp) * (dout @ weight), the gradient of gelu_inp
 * (overwritten; required), dweight += dout^T @ inp, dbias += column sums of
 * dout, and dpre_bias[C] += column sums of dinp: the gradient of the bias
 * added into gelu_inp by the layer before (each may be NULL). The result is
 * that of gpc_op_matmul_backward, gpc_op_gelu_backward and
 * gpc_op_column_sums; CUDA applies gelu' in the product's epilogue, and its
 * own Hopper product sums dpre_bias there too, so dinp is not read again. */
gpc_status gpc_op_matmul_backward_dgelu(gpc_tensor *dinp, gpc_tensor *dweight, gpc_tensor *dbias,
                                        gpc_tensor *dpre_bias, const gpc_tensor *dout,
                                        const gpc_tensor *inp, const gpc_tensor *weight,
                                        const gpc_tensor *gelu_inp);

/* acc[K] += the sums over rows of x's columns first .. first+K-1, x viewed
 * as [rows, W] with W its last dimension (K = acc's element count; any float
 * dtypes, summed in f32). The model sums one part of a wider gradient with
 * it: the query third of the qkv bias gradient. */
gpc_status gpc_op_column_sums(gpc_tensor *acc, const gpc_tensor *x, int64_t first);

/* Adds the sum of x (any float dtype) to acc[0] (f32, one element). The
 * model sums its per-token losses on the device with it, so the trainer
 * reads the loss once per step instead of once per micro-step. */
gpc_status gpc_op_sum(gpc_tensor *acc, const gpc_tensor *x);

#ifdef __cplusplus
}
#endif

#endif /* GPC_OPS_H */
