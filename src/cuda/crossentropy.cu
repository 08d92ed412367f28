/*
 * crossentropy.cu: the fused classifier tail: softmax, cross-entropy loss and
 * its gradient over logits [N, Vp], without materialising the probabilities.
 *
 * One block per row. The first pass keeps a running (max, sum of exp) per
 * thread (the online softmax of Milakov & Gimelshein 2018), merged across the
 * block, so the row is read once for the statistics; the second pass reads
 * the row again and writes (softmax - onehot) * dloss straight over it when
 * dlogits aliases logits (the model's way to save an [N, Vp] buffer), zeros
 * in the padded columns V..Vp-1. Each element is read by the thread that
 * writes it, so the in-place update is safe.
 *
 * A target of -1 masks the row (loss 0, gradient 0), as on the CPU. A target
 * outside the vocabulary cannot be reported without stopping the step for
 * the host, so its loss is NaN, which the trainer sees at its next read-out.
 */
#include "cuda/cuda_common.cuh"

#include <math.h>

#define CE_THREADS 512

__device__ __forceinline__ void ce_merge(float &m, float &s, float m2, float s2) {
    float mm = fmaxf(m, m2);
    if (mm == -INFINITY) return; /* both empty */
    s = s * __expf(m - mm) + s2 * __expf(m2 - mm);
    m = mm;
}

template <typename T>
__global__
__launch_bounds__(CE_THREADS) void crossentropy_kernel(float *losses, T *dlogits, const T *logits,
                                                       const int32_t *targets, int V, int Vp,
                                                       float dloss, int vectorised) {
    __shared__ float shared_m[32], shared_s[32];
    int64_t row = blockIdx.x;
    const T *x = logits + row * Vp;
    int target = targets[row];
    float m = -INFINITY, s = 0.0f;
    typedef gpc_pack<T> P;
    int start = 0;
    if (vectorised) {
        int packs = V / P::n;
        for (int i = threadIdx.x; i < packs; i += blockDim.x) {
            P v = ((const P *)x)[i];
            float f[P::n], mx = m;
#pragma unroll
            for (int k = 0; k < P::n; k++) {
                f[k] = gpc_to_f32(v.v[k]);
                mx = fmaxf(mx, f[k]);
            }
            float add = 0.0f;
#pragma unroll
            for (int k = 0; k < P::n; k++)
                add += __expf(f[k] - mx);
            s = s * __expf(m - mx) + add;
            m = mx;
        }
        start = packs * P::n;
    }
    for (int i = start + threadIdx.x; i < V; i += blockDim.x) {
        float f = gpc_to_f32(x[i]);
        ce_merge(m, s, f, 1.0f);
    }
    /* merge across the warp, then across warps */
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        ce_merge(m, s, m2, s2);
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        shared_m[warp] = m;
        shared_s[warp] = s;
    }
    __syncthreads();
    if (warp == 0) {
        int warps = blockDim.x >> 5;
        m = lane < warps ? shared_m[lane] : -INFINITY;
        s = lane < warps ? shared_s[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) {
            float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
            ce_merge(m, s, m2, s2);
        }
        if (lane == 0) {
            shared_m[0] = m;
            shared_s[0] = s;
        }
    }
    __syncthreads();
    float row_max = shared_m[0], inv_sum = 1.0f / shared_s[0];
    int masked = target == -1, bad = !masked && (target < 0 || target >= V);
    if (threadIdx.x == 0) {
        float loss = 0.0f;
        if (bad)
            loss = NAN;
        else if (!masked)
            loss = logf(shared_s[0]) + row_max - gpc_to_f32(x[target]);
        losses[row] = loss;
    }
    if (!dlogits) return;
    /* Thread 0 read x[target] for the loss; in place, another thread will
     * overwrite that column, so wait for the read first. */
    __syncthreads();
    T *d = dlogits + row * Vp;
    float zero_all = masked ? 0.0f : 1.0f;
    float poison = bad ? NAN : 0.0f;
    start = 0;
    if (vectorised) {
        int packs = Vp / P::n;
        for (int i = threadIdx.x; i < packs; i += blockDim.x) {
            P v = ((const P *)x)[i], out;
#pragma unroll
            for (int k = 0; k < P::n; k++) {
                int col = i * P::n + k;
                float g = 0.0f;
                if (col < V)
                    g = (__expf(gpc_to_f32(v.v[k]) - row_max) * inv_sum -
                         (col == target ? 1.0f : 0.0f)) *
                            dloss * zero_all +
                        poison;
                out.v[k] = gpc_from_f32<T>(g);
            }
            ((P *)d)[i] = out;
        }
        start = packs * P::n;
    }
    for (int col = start + threadIdx.x; col < Vp; col += blockDim.x) {
        float g = 0.0f;
        if (col < V)
            g = (__expf(gpc_to_f32(x[col]) - row_max) * inv_sum - (col == target ? 1.0f : 0.0f)) *
                    dloss * zero_all +
                poison;
        d[col] = gpc_from_f32<T>(g);
    }
}

gpc_status gpc_cuda_crossentropy_forward_backward(gpc_tensor *losses, gpc_tensor *dlogits,
                                                  const gpc_tensor *logits,
                                                  const gpc_tensor *targets, int vocab_size,
                                                  float dloss) {
    const char *op = "crossentropy_forward_backward";
    if (dlogits && dlogits->data)
        GPC_TRY(gpc_cuda_same_dtype(op, "dlogits", dlogits, "logits", logits));
    GPC_TRY(gpc_cuda_enter(logits));
    int64_t Vp = logits->shape[logits->ndim - 1], N = Vp ? gpc_tensor_numel(logits) / Vp : 0;
    if (N == 0) return GPC_OK;
    if (N > 0x7fffffff || Vp > 0x7fffffff)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "%s: %lld rows of %lld logits are beyond the GPU "
                         "kernel's sizes",
                         op, (long long)N, (long long)Vp);
    GPC_CUDA_DISPATCH(logits->dtype, E, {
        int per = (int)(16 / sizeof(E));
        int vec = Vp % per == 0 && gpc_cuda_aligned16(logits->data) &&
                  (!dlogits || !dlogits->data || gpc_cuda_aligned16(dlogits->data));
        crossentropy_kernel<E><<<(unsigned)N, CE_THREADS, 0, gpc_cuda_stream()>>>(
            (float *)losses->data, dlogits && dlogits->data ? (E *)dlogits->data : NULL,
            (const E *)logits->data, (const int32_t *)targets->data, vocab_size, (int)Vp, dloss,
            vec);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}
