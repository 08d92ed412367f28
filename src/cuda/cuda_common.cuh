/*
 * cuda_common.cuh: what every CUDA file of gpc shares: the check macro that
 * turns a CUDA error into a gpc_status with file and line, and the backend's
 * ops table declaration.
 */
#ifndef GPC_CUDA_COMMON_CUH
#define GPC_CUDA_COMMON_CUH

#include <cuda_runtime.h>

extern "C" {
#include "ops/ops_backend.h"
}

#define GPC_CUDA_CHECK(call)                                                                       \
    do {                                                                                           \
        cudaError_t gpc_cuda_err_ = (call);                                                        \
        if (gpc_cuda_err_ != cudaSuccess)                                                          \
            return gpc_error(gpc_cuda_err_ == cudaErrorMemoryAllocation ? GPC_ERR_NOMEM            \
                                                                        : GPC_ERR_DEVICE,          \
                             "CUDA error at %s:%d: %s (%s)", __FILE__, __LINE__,                   \
                             cudaGetErrorString(gpc_cuda_err_), #call);                            \
    } while (0)

/* Checks the launch of the kernel just queued. */
#define GPC_CUDA_CHECK_LAUNCH() GPC_CUDA_CHECK(cudaGetLastError())

extern "C" const gpc_ops_table gpc_cuda_ops;

#endif /* GPC_CUDA_COMMON_CUH */
