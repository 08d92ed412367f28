/*
 * gemm_sm90.h: gpc's own Hopper product for the GELU products (gemm_sm90.cu),
 * which matmul.cu tries before cuBLASLt's fused epilogues.
 */
#ifndef GPC_CUDA_GEMM_SM90_H
#define GPC_CUDA_GEMM_SM90_H

#include "cuda/cuda_common.cuh"

enum {
    GPC_GEMM_GELU = 0, /* pre = a . w^T + bias, act = gelu(pre); w [N, K] */
    GPC_GEMM_DGELU = 1 /* act = (a . w) * gelu'(pre); w [K, N] */
};

/* The product of mode on the current GPU's stream: a [M, K], outputs and pre
 * [M, N], all bf16, bias [N] or NULL (GELU only). GPC_ERR_UNSUPPORTED (with
 * nothing queued) unless M is a multiple of 128, N of 256, K of 64, the pointers
 * 16-byte aligned, the GPU of compute capability 9.0 and GPC_GEMM_SM90 not
 * 0; the caller then takes another path. */
gpc_status gpc_cuda_gemm_sm90(int mode, gpc_bf16_t *pre, gpc_bf16_t *act, const gpc_bf16_t *a,
                              const gpc_bf16_t *w, const gpc_bf16_t *bias, int64_t M, int64_t N,
                              int64_t K);

/* 0 when GPC_GEMM_SM90=0 turns the kernel off (read once). */
int gpc_cuda_gemm_sm90_enabled(void);

#endif
