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
 * (per-tensor fp8 weights, bf16 activations, 5 rows or more, a GPU of
 * compute capability 8.9 or more, GPC_QUANT_FP8_LT on), and in gpc's own
 * dequantizing kernels (everything else). */
long gpc_cuda_quant_lt_calls(void);
long gpc_cuda_quant_kernel_calls(void);

#ifdef __cplusplus
}
#endif

#endif /* GPC_CUDA_QUANT_H */
