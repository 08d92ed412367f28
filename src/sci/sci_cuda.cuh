/*
 * sci_cuda.cuh: what the GPU sides of `gpc md` and `gpc stencil` share:
 * opening the GPU a run asked for, with a reason a user can act on when it
 * cannot be opened, and a block's sum. Private to the sci layer's .cu
 * files.
 */
#ifndef GPC_SCI_SCI_CUDA_CUH
#define GPC_SCI_SCI_CUDA_CUH

#include "cuda/cuda_common.cuh"

/* Selects GPU `device` for command `who` ("md", "stencil") and reads its
 * free and total memory. No GPU at all: GPC_ERR_UNSUPPORTED, "no CUDA GPU
 * is usable here"; a number past the last: GPC_ERR_INVALID_ARG, "cuda:N
 * does not exist" with the numbers there are. */
static inline gpc_status sci_cuda_open(const char *who, int device, size_t *free_bytes,
                                       size_t *total_bytes) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        cudaGetLastError(); /* clear it: later calls must not report it */
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "%s: no CUDA GPU is usable here (%s): check nvidia-smi and "
                         "CUDA_VISIBLE_DEVICES, or run with --device cpu",
                         who, err != cudaSuccess ? cudaGetErrorString(err) : "none visible");
    }
    if (device < 0 || device >= count)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s: cuda:%d does not exist: this machine has %d usable GPU%s (cuda:0 "
                         "to cuda:%d)",
                         who, device, count, count == 1 ? "" : "s", count - 1);
    GPC_CUDA_CHECK(cudaSetDevice(device));
    GPC_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
    return GPC_OK;
}

/* a[0 .. n) in ascending order by insertion: for the few atoms of a cell,
 * which the binning's atomics left in any order. */
__device__ __forceinline__ void sort_ascending(int *a, int n) {
    for (int i = 1; i < n; i++) {
        const int key = a[i];
        int k = i - 1;
        while (k >= 0 && a[k] > key) {
            a[k + 1] = a[k];
            k--;
        }
        a[k + 1] = key;
    }
}

/* The sum of `value` over the block, in a fixed order (a tree over
 * shared[blockDim.x], blockDim.x a power of two), returned to every
 * thread; shared is free again when it returns. */
template <typename T> __device__ T block_sum(T value, T *shared) {
    shared[threadIdx.x] = value;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
        __syncthreads();
    }
    T total = shared[0];
    __syncthreads(); /* the caller may use shared again */
    return total;
}

#endif /* GPC_SCI_SCI_CUDA_CUH */
