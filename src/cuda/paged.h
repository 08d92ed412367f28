/*
 * paged.h: what paged.cu tells tests and benchmarks about its attention
 * kernels, and how they pick one. Plain C.
 */
#ifndef GPC_CUDA_PAGED_H
#define GPC_CUDA_PAGED_H

#ifdef __cplusplus
extern "C" {
#endif

/* Sets the paged attention kernel (1, 2 or 3: v1, v2, v3; anything else
 * goes back to GPC_PAGED_KERNEL) for the calls that follow; returns the
 * kernel before. For tests and benchmarks that compare the kernels in one
 * process. v2 and v3 run only where they take the shape (head sizes of 8,
 * 16 or 32 16-byte pieces); elsewhere v1 does. */
int gpc_cuda_paged_set_kernel(int kernel);
/* Calls that ran kernel 1, 2 or 3 since the process started. */
long gpc_cuda_paged_calls(int kernel);
/* Calls since the process started that ran unsplit (how 0), split with the
 * combine kernel (1), or split with the last blocks merging (2:
 * GPC_PAGED_COMBINE=fused). */
long gpc_cuda_paged_split_calls(int how);

#ifdef __cplusplus
}
#endif

#endif /* GPC_CUDA_PAGED_H */
