/*
 * bench_cuda.h: the GPU measurements of `gpc bench` and `gpc doctor`, as
 * plain C functions: GEMM kernels (naive, shared-memory tiled, cuBLAS in
 * every precision the GPU has), host<->device copies from pageable, pinned
 * and managed memory, a chunked copy-compute-copy pipeline on several
 * streams, version probes and an NCCL all-reduce bandwidth test.
 *
 * Private to the tools layer: bench.c and doctor.c reach the GPU through
 * these calls only, so no CUDA header is needed above them. Implemented in
 * bench_gemm.cu when gpc is built with CUDA; otherwise bench_cuda_stub.c
 * answers every call with GPC_ERR_UNSUPPORTED and
 * "this gpc was built without CUDA", so callers need no #ifdef.
 */
#ifndef GPC_TOOLS_BENCH_CUDA_H
#define GPC_TOOLS_BENCH_CUDA_H

#include "gpc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* GPUs usable for measurements; 0 with the reason in gpc_last_error() when
 * there are none (no build support, no driver, no device). */
int gpc_bench_cuda_device_count(void);
gpc_status gpc_bench_cuda_device_info(int device, char *name, size_t name_size, int *cc_major,
                                      int *cc_minor, size_t *total_bytes);
/* CUDA driver and runtime versions as 1000*major + 10*minor (13000 = 13.0);
 * driver is 0 when no driver is installed. */
gpc_status gpc_bench_cuda_versions(int *driver, int *runtime);
/* cuDNN's fused attention: *built is 1 when this gpc was compiled against
 * cudnn.h. Then GPC_OK with *version (91400 for 9.14.0) when libcudnn loads
 * on this machine, else the reason it does not. */
gpc_status gpc_bench_cudnn_version(int *built, long *version);

typedef enum {
    GPC_GEMM_NAIVE = 0, /* one thread per output, operands from global memory */
    GPC_GEMM_TILED,     /* 32x32 tiles staged through shared memory */
    GPC_GEMM_CUBLAS,    /* cuBLAS (cuBLASLt for fp8) */
} gpc_gemm_kernel;

typedef enum {
    GPC_GEMM_F32 = 0,
    GPC_GEMM_TF32, /* f32 in memory, tensor cores at tf32 */
    GPC_GEMM_BF16,
    GPC_GEMM_F16,
    GPC_GEMM_FP8, /* e4m3 inputs, bf16 output; compute capability 8.9 and up */
} gpc_gemm_precision;

const char *gpc_gemm_kernel_name(gpc_gemm_kernel kernel);
const char *gpc_gemm_precision_name(gpc_gemm_precision precision);

/* C = A B with n x n matrices of uniform random numbers in [-1, 1]. One
 * warm-up, then reps timed runs: *seconds is the median. *max_error is the
 * largest |C - C64| / sum_k |A_ik B_kj| over 64 sampled entries, C64 computed
 * in float64 on the host from the rounded inputs. The naive and tiled
 * kernels exist in f32 only (GPC_ERR_UNSUPPORTED otherwise). */
gpc_status gpc_bench_cuda_gemm(int device, gpc_gemm_kernel kernel, gpc_gemm_precision precision,
                               int n, int reps, double *seconds, double *max_error);

typedef enum {
    GPC_COPY_PAGEABLE = 0,    /* malloc'd host memory: the driver stages it */
    GPC_COPY_PINNED,          /* cudaMallocHost: DMA straight from it */
    GPC_COPY_MANAGED,         /* cudaMallocManaged, pages migrate on first touch */
    GPC_COPY_MANAGED_PREFETCH /* cudaMallocManaged + cudaMemPrefetchAsync */
} gpc_copy_memory;

typedef enum { GPC_COPY_H2D = 0, GPC_COPY_D2H, GPC_COPY_D2D } gpc_copy_direction;

const char *gpc_copy_memory_name(gpc_copy_memory memory);
const char *gpc_copy_direction_name(gpc_copy_direction direction);

/* Moves bytes in the given direction: median wall seconds of reps, measured
 * on the host around the copy and its synchronisation (what a program
 * waits). Managed memory "copies" are the access that migrates the pages: a
 * kernel reading the buffer (to the device) or the host reading it (back),
 * with or without a prefetch first. D2D ignores memory. */
gpc_status gpc_bench_cuda_copy(int device, gpc_copy_memory memory, gpc_copy_direction direction,
                               size_t bytes, int reps, double *seconds);

/* A pipeline over bytes of pinned input: chunks of it are copied to the
 * device, transformed by a kernel that takes about as long as the copy, and
 * copied back, round-robin over streams. Median wall seconds of reps.
 * *max_error (where not NULL): the largest difference between what came
 * back and the same transform computed on the host (0 when every chunk
 * made its way through: the transform is fmaf in both places). */
gpc_status gpc_bench_cuda_overlap(int device, int streams, size_t bytes, int chunks, int reps,
                                  double *seconds, double *max_error);

/* NCCL (loaded with dlopen, libnccl.so.2) version as 10000*major +
 * 100*minor + patch, or GPC_ERR_UNSUPPORTED when the library is absent. */
gpc_status gpc_bench_nccl_version(int *version);
/* All-reduce (sum, f32) of bytes on each of the first gpus devices: median
 * seconds of reps. Bus bandwidth = bytes / seconds * 2 (gpus - 1) / gpus
 * (nccl-tests' definition). */
gpc_status gpc_bench_cuda_allreduce(int gpus, size_t bytes, int reps, double *seconds);

#ifdef __cplusplus
}
#endif

#endif /* GPC_TOOLS_BENCH_CUDA_H */
