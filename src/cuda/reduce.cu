/*
 * reduce.cu: the sum of squares of a buffer, or its plain sum, added to
 * acc[0] on the device.
 *
 * It feeds the global gradient norm: the trainer zeroes acc, calls this once
 * per gradient buffer, and AdamW reads acc on the device for clipping, so the
 * step never waits on the host for the norm. Two passes, both in a fixed
 * order for a given size: per-block partial sums into scratch, then one
 * block adds them up. Same input, same bits. The plain sum serves the loss:
 * the model adds each micro-step's per-token losses into one f32 on the
 * device, and the trainer reads it once per step.
 */
#include "cuda/cuda_common.cuh"

template <typename T, bool SQUARE>
__global__ void sum_squares_partial_kernel(float *partial, const T *x, int64_t n, int vectorised) {
    __shared__ float shared[32];
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, done = 0;
    float s = 0.0f;
    if (vectorised) {
        typedef gpc_pack<T> P;
        int64_t packs = n / P::n;
        for (int64_t i = first; i < packs; i += stride) {
            P v = ((const P *)x)[i];
#pragma unroll
            for (int k = 0; k < P::n; k++) {
                float f = gpc_to_f32(v.v[k]);
                s += SQUARE ? f * f : f;
            }
        }
        done = packs * P::n;
    }
    for (int64_t i = done + first; i < n; i += stride) {
        float f = gpc_to_f32(x[i]);
        s += SQUARE ? f * f : f;
    }
    s = gpc_block_sum(s, shared);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_squares_finish_kernel(float *acc, const float *partial, int parts) {
    __shared__ float shared[32];
    float s = 0.0f;
    for (int i = threadIdx.x; i < parts; i += blockDim.x)
        s += partial[i];
    s = gpc_block_sum(s, shared);
    if (threadIdx.x == 0) acc[0] += s;
}

template <bool SQUARE> static gpc_status reduce_into(gpc_tensor *acc, const gpc_tensor *x) {
    GPC_TRY(gpc_cuda_enter(x));
    int64_t n = gpc_tensor_numel(x);
    if (n == 0) return GPC_OK;
    int64_t blocks = (n + 2047) / 2048, cap = (int64_t)gpc_cuda_sm_count() * 4;
    if (blocks > cap) blocks = cap;
    if (blocks < 1) blocks = 1;
    void *partial;
    GPC_TRY(gpc_cuda_scratch((size_t)blocks * sizeof(float), &partial));
    cudaStream_t s = gpc_cuda_stream();
    int vec = gpc_cuda_aligned16(x->data);
    GPC_CUDA_DISPATCH(x->dtype, E, {
        sum_squares_partial_kernel<E, SQUARE>
            <<<(unsigned)blocks, 256, 0, s>>>((float *)partial, (const E *)x->data, n, vec);
    });
    GPC_CUDA_CHECK_LAUNCH();
    sum_squares_finish_kernel<<<1, 1024, 0, s>>>((float *)acc->data, (const float *)partial,
                                                 (int)blocks);
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

gpc_status gpc_cuda_sum_squares(gpc_tensor *acc, const gpc_tensor *x) {
    return reduce_into<true>(acc, x);
}

gpc_status gpc_cuda_sum(gpc_tensor *acc, const gpc_tensor *x) {
    return reduce_into<false>(acc, x);
}
