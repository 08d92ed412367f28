/*
 * gemm_sm90.h: gpc's own Hopper products for the fc layer's forward and the
 * GELU backward after it (gemm_sm90.cu), which matmul.cu tries before
 * cuBLASLt's GELU epilogues unless GPC_GEMM_SM90 turns them off: "0" both,
 * "gelu" keeps only the forward, "dgelu" only the backward; and the training
 * step's output head without a cross-entropy pass (classifier_sm90.cu),
 * which gpc_op_classifier tries first unless GPC_GEMM_SM90=0 or
 * GPC_GEMM_SM90_HEAD=0.
 */
#ifndef GPC_CUDA_GEMM_SM90_H
#define GPC_CUDA_GEMM_SM90_H

#include "cuda/cuda_common.cuh"

/* pre = a . w^T + bias and act = gelu(pre) on the current GPU's stream: a
 * [M, K], w [N, K], pre and act [M, N], bias [N] or NULL, all bf16.
 * GPC_ERR_UNSUPPORTED (with nothing queued) unless M is a multiple of 128,
 * N of 192, K of 64, the pointers 16-byte aligned, the GPU of compute
 * capability 9.0 and GPC_GEMM_SM90 not turning it off; the caller then
 * takes another path. */
gpc_status gpc_cuda_gemm_gelu_sm90(gpc_bf16_t *pre, gpc_bf16_t *act, const gpc_bf16_t *a,
                                   const gpc_bf16_t *w, const gpc_bf16_t *bias, int64_t M,
                                   int64_t N, int64_t K);

/* dinp = (dout . w) * gelu'(pre), the backward product of a layer whose
 * input was gelu(pre): dout [M, K], w [K, N] (the layer's weight, which is
 * transposed into the scratch buffer first), pre and dinp [M, N], all bf16.
 * With pre_bias (any float dtype, [N]; may be NULL), pre_bias += the column
 * sums of dinp as stored (bf16), summed by the epilogue from the tile it
 * stages and finished in a fixed order: no second read of dinp.
 * GPC_ERR_UNSUPPORTED as above (M a multiple of 128, N of 192, K of 64). */
gpc_status gpc_cuda_gemm_dgelu_sm90(gpc_bf16_t *dinp, const gpc_tensor *pre_bias,
                                    const gpc_bf16_t *dout, const gpc_bf16_t *w,
                                    const gpc_bf16_t *pre, int64_t M, int64_t N, int64_t K);

/* The output head of a training step without a cross-entropy pass over the
 * logits (classifier_sm90.cu), all bf16 but losses (f32) and targets (i32):
 *   losses[n] = logsumexp(logits[n][0..V-1]) - logits[n][targets[n]];
 *   dinp = dlogits . w, [N, C], overwritten;
 *   dw += dlogits^T . inp, [Vp, C];
 * for logits = inp . w^T and dlogits = (softmax(logits[n][0..V-1]) -
 * onehot(targets[n])) * dloss, zero in the padded columns V..Vp-1. The
 * [N, Vp] buffer logits is scratch: it ends up holding exp(logits - 16),
 * lowered at the targets, which with a per-row scale is dlogits. A target of
 * -1 masks its row (loss 0, gradient 0); one outside 0..V-1, or a row whose
 * largest logit is below -50 or at least 80, gives a NaN loss and NaN
 * gradients. GPC_ERR_UNSUPPORTED (nothing queued) unless N is a multiple of
 * 128, Vp of 192, C of 64, the pointers 16-byte aligned, the GPU of compute
 * capability 9.0 and GPC_GEMM_SM90 / GPC_GEMM_SM90_HEAD not turning it off;
 * the caller then runs the product, the cross-entropy and the backward
 * products in turn. */
gpc_status gpc_cuda_classifier_sm90(float *losses, gpc_bf16_t *dinp, gpc_bf16_t *dw,
                                    gpc_bf16_t *logits, const gpc_bf16_t *inp,
                                    const gpc_bf16_t *w, const int32_t *targets, int64_t N,
                                    int64_t Vp, int64_t C, int V, float dloss);

#endif
