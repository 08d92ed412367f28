/*
 * gemm_sm90.h: gpc's own Hopper products for the fc layer's forward and the
 * GELU backward after it (gemm_sm90.cu), which matmul.cu tries before
 * cuBLASLt's GELU epilogues unless GPC_GEMM_SM90 turns them off: "0" both,
 * "gelu" keeps only the forward, "dgelu" only the backward. The training
 * step's output head on Hopper (classifier_sm90.cu) is the CUDA backend's
 * classifier entry itself, declared with the other ops.
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

#endif
