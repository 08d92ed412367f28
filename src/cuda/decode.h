/*
 * decode.h: what decode.cu tells tests and benchmarks about its fused
 * decode products. Plain C.
 */
#ifndef GPC_CUDA_DECODE_H
#define GPC_CUDA_DECODE_H

#ifdef __cplusplus
extern "C" {
#endif

/* Fused decode products (gpc_op_decode_product) run on the GPU since the
 * process started. */
long gpc_cuda_decode_calls(void);
/* Of those, the ones run on tensor cores (GPC_DECODE_MMA). */
long gpc_cuda_decode_mma_calls(void);
/* 1 (the default): a layernorm prologue keeps the normalised rows in
 * shared memory where they fit; 0: every product normalises each value as
 * it reads it (the path of rows too wide to stage), for tests. Returns the
 * setting before. */
int gpc_cuda_decode_set_ln_staging(int on);

#ifdef __cplusplus
}
#endif

#endif /* GPC_CUDA_DECODE_H */
