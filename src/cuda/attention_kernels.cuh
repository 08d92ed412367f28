/*
 * attention_kernels.cuh: what attention.cu, which chooses the path of each
 * attention call, needs from the two files of gpc's own attention kernels:
 * attention_mma.cu (flash attention on tensor cores: bf16 or f16, head size
 * ATT_HS) and attention_simple.cu (one warp per row: any dtype, head size up
 * to ATT_NAIVE_MAX_HS). Kernels are launched from the file that defines
 * them (no separable compilation), so each step of a path is one launcher
 * here. A launcher only queues kernels on st; the caller checks the launch.
 */
#ifndef GPC_CUDA_ATTENTION_KERNELS_CUH
#define GPC_CUDA_ATTENTION_KERNELS_CUH

#include "cuda/cuda_common.cuh"

#define ATT_HS 64
#define ATT_NAIVE_MAX_HS 128

/* One call's shape: qkv [B, T, 3C], C = NH * hs. */
typedef struct {
    int B, T, C, NH, hs;
} att_shape;

/* ------------------------------------------- attention_mma.cu (head size 64) */

/* out and lse from qkv (bf16 or f16), scores scaled by scale. */
void gpc_cuda_attention_mma_forward(gpc_tensor *out, gpc_tensor *lse, const gpc_tensor *qkv,
                                    const att_shape *s, float scale, cudaStream_t st);
/* dsum = rowsum(dout * out), zeroing on the way zero4 16-byte words at zero
 * and, unless NULL, the q third of qzero (dqkv, for the wgmma backward). */
gpc_status gpc_cuda_attention_mma_dsum(float *dsum, float *zero, int64_t zero4, void *qzero,
                                       const gpc_tensor *dout, const gpc_tensor *out,
                                       const att_shape *s, cudaStream_t st);
/* The two-kernel backward (dk/dv, then dq): the same bits every run. */
void gpc_cuda_attention_mma_backward(gpc_tensor *dqkv, const gpc_tensor *qkv,
                                     const gpc_tensor *dout, const gpc_tensor *lse,
                                     const float *dsum, const att_shape *s, float scale,
                                     cudaStream_t st);
/* The one-kernel backward, summing dQ in dq_acc (f32 [B*NH, T, 64], zeroed
 * by gpc_cuda_attention_mma_dsum) with atomics. */
void gpc_cuda_attention_mma_backward_fused(gpc_tensor *dqkv, const gpc_tensor *qkv,
                                           const gpc_tensor *dout, const gpc_tensor *lse,
                                           float *dq_acc, const float *dsum, const att_shape *s,
                                           float scale, cudaStream_t st);

/* ------------------------------------ attention_simple.cu (one warp per row) */

gpc_status gpc_cuda_attention_simple_forward(gpc_tensor *out, gpc_tensor *lse,
                                             const gpc_tensor *qkv, const att_shape *s, float scale,
                                             cudaStream_t st);
/* out [B, Tq, C]: the last Tq rows of each sequence of qkv. */
gpc_status gpc_cuda_attention_simple_decode(gpc_tensor *out, const gpc_tensor *qkv,
                                            const att_shape *s, int Tq, float scale,
                                            cudaStream_t st);
gpc_status gpc_cuda_attention_simple_dsum(float *dsum, const gpc_tensor *dout,
                                          const gpc_tensor *out, const att_shape *s,
                                          cudaStream_t st);
gpc_status gpc_cuda_attention_simple_backward(gpc_tensor *dqkv, const gpc_tensor *qkv,
                                              const gpc_tensor *dout, const gpc_tensor *lse,
                                              const float *dsum, const att_shape *s, float scale,
                                              cudaStream_t st);

#endif /* GPC_CUDA_ATTENTION_KERNELS_CUH */
