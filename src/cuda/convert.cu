/*
 * convert.cu: dtype conversion between f32, bf16 and f16 (round to nearest
 * even, as the CPU's gpc_f32_to_bf16), and scaling in place.
 *
 * Conversion is how the model makes its bf16 compute copy of the f32 master
 * weights and how tests move data between precisions; scaling serves the
 * loss scale of fp16 training. Both are single passes over memory. The
 * transpose of a 2-byte matrix gives gemm_sm90.cu's backward product its
 * weight K-major.
 */
#include "cuda/cuda_common.cuh"

template <typename D, typename S> __global__ void convert_kernel(D *dst, const S *src, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = gpc_from_f32<D>(gpc_to_f32(src[i]));
}

template <typename T> __global__ void scale_kernel(T *x, float factor, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        x[i] = gpc_from_f32<T>(gpc_to_f32(x[i]) * factor);
}

static unsigned grid_for(int64_t n) {
    int64_t blocks = (n + 255) / 256, cap = (int64_t)gpc_cuda_sm_count() * 32;
    if (blocks > cap) blocks = cap;
    return (unsigned)(blocks < 1 ? 1 : blocks);
}

gpc_status gpc_cuda_convert(gpc_tensor *dst, const gpc_tensor *src) {
    GPC_TRY(gpc_cuda_enter(dst));
    int64_t n = gpc_tensor_numel(dst);
    if (n == 0) return GPC_OK;
    if (dst->dtype == src->dtype) {
        if (dst->data != src->data)
            GPC_CUDA_CHECK(cudaMemcpyAsync(dst->data, src->data, gpc_tensor_bytes(dst),
                                           cudaMemcpyDeviceToDevice, gpc_cuda_stream()));
        return GPC_OK;
    }
    GPC_CUDA_DISPATCH(dst->dtype, D, {
        GPC_CUDA_DISPATCH(src->dtype, S, {
            convert_kernel<D, S><<<grid_for(n), 256, 0, gpc_cuda_stream()>>>(
                (D *)dst->data, (const S *)src->data, n);
        });
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

gpc_status gpc_cuda_scale(gpc_tensor *x, float factor) {
    GPC_TRY(gpc_cuda_enter(x));
    int64_t n = gpc_tensor_numel(x);
    if (n == 0) return GPC_OK;
    GPC_CUDA_DISPATCH(x->dtype, E, {
        scale_kernel<E><<<grid_for(n), 256, 0, gpc_cuda_stream()>>>((E *)x->data, factor, n);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

/* dst[c][r] = src[r][c] through a 32 x 33 tile of shared memory (the extra
 * column keeps the transposed reads off one bank); 32 x 8 threads. */
__global__ void transpose16_kernel(uint16_t *dst, const uint16_t *src, int64_t rows, int64_t cols) {
    __shared__ uint16_t tile[32][33];
    int64_t r0 = (int64_t)blockIdx.y * 32, c0 = (int64_t)blockIdx.x * 32;
    for (int i = threadIdx.y; i < 32; i += 8) {
        int64_t r = r0 + i, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[i][threadIdx.x] = src[r * cols + c];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += 8) {
        int64_t c = c0 + i, r = r0 + threadIdx.x;
        if (r < rows && c < cols) dst[c * rows + r] = tile[threadIdx.x][i];
    }
}

gpc_status gpc_cuda_transpose16(void *dst, const void *src, int64_t rows, int64_t cols) {
    if (rows <= 0 || cols <= 0) return GPC_OK;
    if ((rows + 31) / 32 > 65535)
        return gpc_error(GPC_ERR_UNSUPPORTED, "transpose: %lld rows are too many", (long long)rows);
    dim3 grid((unsigned)((cols + 31) / 32), (unsigned)((rows + 31) / 32)), block(32, 8);
    transpose16_kernel<<<grid, block, 0, gpc_cuda_stream()>>>((uint16_t *)dst,
                                                              (const uint16_t *)src, rows, cols);
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}
