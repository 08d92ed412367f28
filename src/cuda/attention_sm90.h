/*
 * attention_sm90.h: the attention backward's kernel on Hopper's wgmma
 * (attention_sm90.cu), which attention.cu runs after its D pass in place of
 * cuDNN's backward under the auto path (the default) and of its own
 * mma.sync kernels under GPC_ATTENTION_BWD=wgmma. The queries are plain C, for tests
 * and for attention.cu's choice of path; the launch is for CUDA files.
 */
#ifndef GPC_CUDA_ATTENTION_SM90_H
#define GPC_CUDA_ATTENTION_SM90_H

#ifdef __cplusplus
extern "C" {
#endif

/* Whether this GPU runs the kernel (compute capability 9.0; asked once per
 * device), and how many times it has been queued since the process
 * started. */
int gpc_cuda_attention_sm90_available(void);
long gpc_cuda_attention_sm90_calls(void);

/* Whether the kernel serves T (a multiple of GPC_ATTENTION_SM90_BLOCK) on
 * this GPU, for bf16 and head size 64 (pointers 16-byte aligned). */
#define GPC_ATTENTION_SM90_BLOCK 128
int gpc_cuda_attention_sm90_serves(int T);

#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#include "cuda/cuda_common.cuh"

/* For causal attention over qkv [B, T, 3, NH, 64] (bf16), with dout [B, T,
 * NH * 64], lse [B*NH, T] (natural log) and dsum = rowsum(dout * out) [B*NH,
 * T]: writes dK and dV into dqkv's k and v thirds and adds dQ into its q
 * third, which must be zero (each key block's part, rounded to bf16 by the
 * adds), all scaled by scale as the softmax is, on the current GPU's
 * stream. GPC_ERR_UNSUPPORTED (nothing queued) unless T is a multiple of
 * 128, the pointers 16-byte aligned and the GPU of compute capability 9.0. */
gpc_status gpc_cuda_attention_backward_sm90(gpc_bf16_t *dqkv, const gpc_bf16_t *qkv,
                                            const gpc_bf16_t *dout, const float *lse,
                                            const float *dsum, int B, int T, int NH, float scale);
#endif

#endif
