/*
 * adamw.cu: one AdamW step over a flat parameter buffer on the GPU, with
 * gradient clipping by global norm read on the device and stochastic
 * rounding of bf16 parameters.
 *
 * Same update as the CPU (src/cpu/adamw.c):
 *   g = grad * grad_scale * clip,  clip = min(1, max_norm / sqrt(norm_sq))
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
 *   p -= lr (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd p)
 * The squared norm stays on the device (gpc_op_sum_squares wrote it), so the
 * step needs no host synchronisation for clipping, nor for fp16's overflow
 * check (skip_nonfinite: a non-finite norm leaves every buffer as it was).
 *
 * With an f32 master copy, the master is updated and the bf16/f16 compute
 * copy is, by default (seed 0), the master rounded to nearest: the master
 * keeps the updates smaller than half a bf16 step, and a run resumed from a
 * checkpoint (which stores the master) rebuilds the copy bit for bit. With a
 * non-zero seed the bf16 copy gets stochastic rounding instead: round up
 * with probability equal to the distance to the lower bf16 neighbour
 * (Gupta et al. 2015), the random bits a hash of (seed, index), so a step
 * is reproducible for a given seed; a resumed run then rebuilds the copy
 * rounded to nearest, within one bf16 step of the uninterrupted run's. f16
 * and f32 parameters are always rounded to nearest.
 */
#include "cuda/cuda_common.cuh"

#include <math.h>

/* A 32-bit integer hash (Wang/Jenkins style mixing), enough to decorrelate
 * neighbouring indices and steps for rounding. */
__device__ __forceinline__ uint32_t adamw_hash(uint32_t x, uint32_t seed) {
    x ^= seed * 0x9E3779B9u;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

template <typename P> __device__ __forceinline__ P adamw_round(float w, uint32_t i, uint32_t seed) {
    return gpc_from_f32<P>(w);
}

template <>
__device__ __forceinline__ gpc_bf16_t adamw_round<gpc_bf16_t>(float w, uint32_t i, uint32_t seed) {
    uint32_t bits = __float_as_uint(w);
    if ((bits & 0x7f800000u) == 0x7f800000u) return __float2bfloat16_rn(w); /* inf, NaN */
    bits += adamw_hash(i, seed) & 0xffffu; /* carries into the kept bits with the right odds */
    return __ushort_as_bfloat16((unsigned short)(bits >> 16));
}

/* W: the type of the weights updated in place (f32 master, or params when
 * they are f32). With master, params receive the rounded result. */
template <typename P, typename G>
__global__ void adamw_kernel(P *params, float *master, const G *grads, float *m, float *v,
                             int64_t n, float lr, float b1, float b2, float eps, float wd, float c1,
                             float c2, float grad_scale, const float *norm_sq, float max_norm,
                             int skip_nonfinite, uint32_t seed) {
    /* fp16 overflow, decided here so the host need not read the norm: every
     * thread sees the same norm, so the whole step is skipped */
    if (skip_nonfinite && (__float_as_uint(norm_sq[0]) & 0x7f800000u) == 0x7f800000u) return;
    float clip = 1.0f;
    if (norm_sq && max_norm > 0.0f) {
        float norm = sqrtf(norm_sq[0]);
        if (norm > max_norm) clip = max_norm / norm; /* NaN norm: no clip, as the CPU */
    }
    float gscale = grad_scale * clip;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float g = gpc_to_f32(grads[i]) * gscale;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float w = master ? master[i] : gpc_to_f32(params[i]);
        w -= lr * ((mi / c1) / (sqrtf(vi / c2) + eps) + wd * w);
        if (master) {
            master[i] = w;
            params[i] = seed ? adamw_round<P>(w, (uint32_t)i, seed) : gpc_from_f32<P>(w);
        } else {
            params[i] = gpc_from_f32<P>(w);
        }
    }
}

gpc_status gpc_cuda_adamw(gpc_tensor *params, gpc_tensor *master, const gpc_tensor *grads,
                          gpc_tensor *m, gpc_tensor *v, const gpc_adamw_args *args) {
    GPC_TRY(gpc_cuda_enter(params));
    int64_t n = gpc_tensor_numel(params);
    if (n == 0) return GPC_OK;
    float c1 = (float)(1.0 - pow((double)args->beta1, args->step));
    float c2 = (float)(1.0 - pow((double)args->beta2, args->step));
    const float *norm_sq = args->grad_norm_sq && args->grad_norm_sq->data
                               ? (const float *)args->grad_norm_sq->data
                               : NULL;
    float *mst = master && master->data ? (float *)master->data : NULL;
    int64_t blocks = (n + 255) / 256, cap = (int64_t)gpc_cuda_sm_count() * 16;
    unsigned grid = (unsigned)(blocks > cap ? cap : blocks);
    GPC_CUDA_DISPATCH(params->dtype, P, {
        GPC_CUDA_DISPATCH(grads->dtype, G, {
            adamw_kernel<P, G><<<grid, 256, 0, gpc_cuda_stream()>>>(
                (P *)params->data, mst, (const G *)grads->data, (float *)m->data, (float *)v->data,
                n, args->learning_rate, args->beta1, args->beta2, args->eps, args->weight_decay, c1,
                c2, args->grad_scale, norm_sq, args->max_grad_norm, args->skip_nonfinite && norm_sq,
                args->seed);
        });
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}
