/*
 * quant.h: what matmul_quant.cu tells tests and benchmarks about the path
 * its products took. Plain C.
 */
#ifndef GPC_CUDA_QUANT_H
#define GPC_CUDA_QUANT_H

#ifdef __cplusplus
extern "C" {
#endif

/* Products run since the process started: on cuBLASLt's FP8 tensor cores
 * (per-tensor fp8 weights, bf16 activations, more rows than the skinny
 * kernel takes, a GPU of compute capability 8.9 or more, GPC_QUANT_FP8_LT
 * on), in the skinny kernel (1 to GPC_QUANT_GEMV_MAX_M rows), and in gpc's
 * other dequantizing kernels (everything else). */
long gpc_cuda_quant_lt_calls(void);
long gpc_cuda_quant_gemv_calls(void);
long gpc_cuda_quant_kernel_calls(void);
/* Sets the most rows the skinny kernel takes (0: none, so every product
 * takes the earlier paths; at most 16) for the products that follow, in
 * place of GPC_QUANT_GEMV_MAX_M (a negative value goes back to it);
 * returns the limit before. For tests and benchmarks that compare the
 * paths in one process. */
int gpc_cuda_quant_set_gemv_max_rows(int rows);
/* Products cuBLASLt refused after offering an algorithm (gpc's kernels ran
 * them instead). */
long gpc_cuda_quant_lt_refused(void);

#ifdef __cplusplus
}
#endif

#endif /* GPC_CUDA_QUANT_H */
