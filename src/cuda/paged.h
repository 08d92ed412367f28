/*
 * paged.h: what paged.cu tells tests and benchmarks about its attention
 * kernels, and how they pick one. Plain C.
 */
#ifndef GPC_CUDA_PAGED_H
#define GPC_CUDA_PAGED_H

#ifdef __cplusplus
extern "C" {
#endif

/* Sets the paged attention kernel (1: v1, 2: v2; anything else goes back
 * to GPC_PAGED_KERNEL) for the calls that follow; returns the kernel
 * before. For tests and benchmarks that compare the kernels in one
 * process. v2 runs only where it takes the shape (head sizes of 8, 16 or
 * 32 16-byte pieces); elsewhere v1 does. */
int gpc_cuda_paged_set_kernel(int kernel);
/* Calls that ran kernel v2 since the process started. */
long gpc_cuda_paged_v2_calls(void);

#ifdef __cplusplus
}
#endif

#endif /* GPC_CUDA_PAGED_H */
