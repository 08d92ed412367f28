/*
 * gelu.cu: GELU (tanh approximation, as GPT-2) forward and backward.
 *
 * Both are pure streams over memory, so each thread moves 16 bytes per load
 * (8 bf16 or 4 f32) when the buffers allow it, with a scalar loop for any
 * tail; the arithmetic (one tanh) hides under the loads. dinp may alias dout
 * (ops.h): each element is read before the same thread writes it.
 */
#include "cuda/cuda_common.cuh"

__device__ __forceinline__ float gelu_grad_f(float x) {
    float cube = 0.044715f * x * x * x;
    float t = gpc_gelu_tanh(GPC_GELU_SCALE * (x + cube));
    float sech2 = 1.0f - t * t;
    return 0.5f * (1.0f + t) +
           0.5f * x * sech2 * GPC_GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

template <typename T>
__global__ void gelu_forward_kernel(T *out, const T *inp, int64_t n, int vectorised) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t done = 0;
    if (vectorised) {
        typedef gpc_pack<T> P;
        int64_t packs = n / P::n;
        for (int64_t i = first; i < packs; i += stride) {
            P x = ((const P *)inp)[i], y;
#pragma unroll
            for (int k = 0; k < P::n; k++)
                y.v[k] = gpc_from_f32<T>(gpc_gelu(gpc_to_f32(x.v[k])));
            ((P *)out)[i] = y;
        }
        done = packs * P::n;
    }
    for (int64_t i = done + first; i < n; i += stride)
        out[i] = gpc_from_f32<T>(gpc_gelu(gpc_to_f32(inp[i])));
}

template <typename T>
__global__ void gelu_backward_kernel(T *dinp, const T *inp, const T *dout, int64_t n,
                                     int vectorised) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t done = 0;
    if (vectorised) {
        typedef gpc_pack<T> P;
        int64_t packs = n / P::n;
        for (int64_t i = first; i < packs; i += stride) {
            P x = ((const P *)inp)[i], d = ((const P *)dout)[i], y;
#pragma unroll
            for (int k = 0; k < P::n; k++)
                y.v[k] = gpc_from_f32<T>(gelu_grad_f(gpc_to_f32(x.v[k])) * gpc_to_f32(d.v[k]));
            ((P *)dinp)[i] = y;
        }
        done = packs * P::n;
    }
    for (int64_t i = done + first; i < n; i += stride)
        dinp[i] = gpc_from_f32<T>(gelu_grad_f(gpc_to_f32(inp[i])) * gpc_to_f32(dout[i]));
}

static unsigned stream_grid(int64_t n, int per_thread) {
    int64_t blocks = (n / per_thread + 255) / 256;
    int64_t cap = (int64_t)gpc_cuda_sm_count() * 16;
    if (blocks > cap) blocks = cap;
    return (unsigned)(blocks < 1 ? 1 : blocks);
}

gpc_status gpc_cuda_gelu_forward(gpc_tensor *out, const gpc_tensor *inp) {
    GPC_TRY(gpc_cuda_same_dtype("gelu_forward", "out", out, "inp", inp));
    GPC_TRY(gpc_cuda_enter(out));
    int64_t n = gpc_tensor_numel(out);
    if (n == 0) return GPC_OK;
    int vec = gpc_cuda_aligned16(out->data) && gpc_cuda_aligned16(inp->data);
    GPC_CUDA_DISPATCH(out->dtype, E, {
        gelu_forward_kernel<E><<<stream_grid(n, 16 / sizeof(E)), 256, 0, gpc_cuda_stream()>>>(
            (E *)out->data, (const E *)inp->data, n, vec);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

gpc_status gpc_cuda_gelu_backward(gpc_tensor *dinp, const gpc_tensor *inp, const gpc_tensor *dout) {
    GPC_TRY(gpc_cuda_same_dtype("gelu_backward", "dinp", dinp, "inp", inp));
    GPC_TRY(gpc_cuda_same_dtype("gelu_backward", "dinp", dinp, "dout", dout));
    GPC_TRY(gpc_cuda_enter(dinp));
    int64_t n = gpc_tensor_numel(dinp);
    if (n == 0) return GPC_OK;
    int vec = gpc_cuda_aligned16(dinp->data) && gpc_cuda_aligned16(inp->data) &&
              gpc_cuda_aligned16(dout->data);
    GPC_CUDA_DISPATCH(dinp->dtype, E, {
        gelu_backward_kernel<E><<<stream_grid(n, 16 / sizeof(E)), 256, 0, gpc_cuda_stream()>>>(
            (E *)dinp->data, (const E *)inp->data, (const E *)dout->data, n, vec);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}
