/*
 * crossentropy.cu: the fused classifier tail: softmax, cross-entropy loss and
 * its gradient over logits [N, Vp], without materialising the probabilities.
 *
 * One block per row, in one of two kernels.
 *
 * The row kept in registers (crossentropy_registers_kernel, the usual case):
 * each thread loads its share of the row, up to PACKS 16-byte packs, into
 * registers, all loads issued before any is used; it takes the max and then
 * the sum of exp over what it holds, the (max, sum) pairs are merged across
 * the block (the online softmax's merge, Milakov & Gimelshein 2018), and the
 * thread writes (softmax - onehot) * dloss from its registers. So the row is
 * read once and written once: 2x its bytes instead of the 3x of two passes,
 * whose second read mostly misses L2 (about 500 rows of 100 KB in flight on
 * an H200 against its 50 MB of L2). A pack is 4 registers whatever the dtype;
 * PACKS is 1, 2, 4 or 8, the smallest that holds the row launched with as
 * many threads as the row then needs (a multiple of 32, up to 1024): a row
 * of up to 65536 bf16/f16 or 32768 f32 logits fits. GPT-2's 50304 bf16
 * logits (6288 packs) run as PACKS 8 on 800 threads. 32 registers of data fit
 * in the 64 a thread of a 1024-thread block may have: sm_90 ptxas reports
 * 64 registers for PACKS 8 (59-64 unbounded), 42 for 4, at most 32 below, no
 * spills. To get there the max is taken in T's own arithmetic (ce_max):
 * converting every element to f32 for it let the compiler keep those f32
 * values alive for the sum, which spilled.
 *
 * Two passes (crossentropy_kernel, the fallback for a row too long for the
 * registers, a Vp not a multiple of the pack, or a pointer not 16-byte
 * aligned): the first pass keeps a running (max, sum of exp) per thread,
 * merged across the block, the second reads the row again and writes the
 * gradient. It makes 3x the row's bytes of traffic.
 *
 * Both write the gradient straight over the logits when dlogits aliases them
 * (the model's way to save an [N, Vp] buffer), with zeros in the padded
 * columns V..Vp-1. Each element is read by the thread that writes it, so the
 * in-place update is safe. dlogits NULL computes the loss only.
 *
 * A target of -1 masks the row (loss 0, gradient 0), as on the CPU. A target
 * outside the vocabulary cannot be reported without stopping the step for
 * the host, so its loss and gradient are NaN, which the trainer sees at its
 * next read-out.
 *
 * The whole output head (gpc_op_classifier: the product into the logits,
 * this cross-entropy and the two backward products) runs fused where
 * classifier_sm90.cu takes it (bf16 on Hopper, where dlogits is never
 * stored); elsewhere that backend entry answers unsupported and ops.c runs
 * the product, the kernels here and the backward products in turn.
 */
#include "cuda/cuda_common.cuh"

#include <math.h>

#define CE_THREADS 512           /* two-pass kernel */
#define CE_REGISTER_THREADS 1024 /* most threads of the register kernel */
#define CE_REGISTER_PACKS 8      /* most packs a thread of it holds */

__device__ __forceinline__ void ce_merge(float &m, float &s, float m2, float s2) {
    float mm = fmaxf(m, m2);
    if (mm == -INFINITY) return; /* both empty */
    s = s * __expf(m - mm) + s2 * __expf(m2 - mm);
    m = mm;
}

/* Merges every thread's (m, s) across the block; every thread gets the row's
 * max and sum of exp. blockDim.x is a multiple of 32, at most 1024. */
__device__ __forceinline__ void ce_block_merge(float &m, float &s) {
    __shared__ float shared_m[32], shared_s[32];
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
    m = shared_m[0];
    s = shared_s[0];
}

/* The loss of a row from its statistics and the target's logit. */
__device__ __forceinline__ float ce_loss(int masked, int bad, float row_max, float sum,
                                         float target_logit) {
    if (bad) return NAN;
    if (masked) return 0.0f;
    return logf(sum) + row_max - target_logit;
}

/* The gradient of column col, which holds logit f. zero_all is 0 for a masked
 * row, poison NaN for a bad target. */
__device__ __forceinline__ float ce_grad(float f, int col, int V, int target, float row_max,
                                         float inv_sum, float dloss, float zero_all, float poison) {
    if (col >= V) return 0.0f;
    return (__expf(f - row_max) * inv_sum - (col == target ? 1.0f : 0.0f)) * dloss * zero_all +
           poison;
}

/* Element k (a constant once unrolled) of a pack of T held as 4 words. */
template <typename T> __device__ __forceinline__ float ce_element(const uint4 &v, int k);
template <> __device__ __forceinline__ float ce_element<float>(const uint4 &v, int k) {
    unsigned w = k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
    return __uint_as_float(w);
}
template <> __device__ __forceinline__ float ce_element<gpc_bf16_t>(const uint4 &v, int k) {
    unsigned w = k < 2 ? v.x : k < 4 ? v.y : k < 6 ? v.z : v.w;
    return __uint_as_float(k & 1 ? w & 0xffff0000u : w << 16); /* bf16 is f32's top half */
}
template <> __device__ __forceinline__ float ce_element<gpc_f16_t>(const uint4 &v, int k) {
    unsigned w = k < 2 ? v.x : k < 4 ? v.y : k < 6 ? v.z : v.w;
    return __half2float(__ushort_as_half((unsigned short)(k & 1 ? w >> 16 : w & 0xffffu)));
}

/* -inf in T's bits. */
template <typename T> struct ce_bits;
template <> struct ce_bits<float> { static const unsigned neg_inf = 0xff800000u; };
template <> struct ce_bits<gpc_bf16_t> { static const unsigned neg_inf = 0xff80u; };
template <> struct ce_bits<gpc_f16_t> { static const unsigned neg_inf = 0xfc00u; };
/* The running max of a thread's packs, in T's own arithmetic (exact, and
 * for bf16/f16 two elements an instruction with no conversion to f32, whose
 * values the compiler would otherwise keep for the sum and spill). As fmaxf,
 * a NaN is passed over. */
template <typename T> struct ce_max {
    float m = -INFINITY;
    __device__ __forceinline__ void add(const uint4 &v) {
        m = fmaxf(fmaxf(m, fmaxf(__uint_as_float(v.x), __uint_as_float(v.y))),
                  fmaxf(__uint_as_float(v.z), __uint_as_float(v.w)));
    }
    __device__ __forceinline__ float get() const {
        return m;
    }
};
template <typename T2> __device__ __forceinline__ T2 ce_pair(unsigned w) {
    T2 h;
    memcpy(&h, &w, sizeof h);
    return h;
}
template <typename T, typename T2> struct ce_max_pairs {
    T2 m = ce_pair<T2>(ce_bits<T>::neg_inf << 16 | ce_bits<T>::neg_inf);
    __device__ __forceinline__ void add(const uint4 &v) {
        m = __hmax2(m, __hmax2(__hmax2(ce_pair<T2>(v.x), ce_pair<T2>(v.y)),
                               __hmax2(ce_pair<T2>(v.z), ce_pair<T2>(v.w))));
    }
};
template <> struct ce_max<gpc_bf16_t> : ce_max_pairs<gpc_bf16_t, __nv_bfloat162> {
    __device__ __forceinline__ float get() const {
        return fmaxf(__low2float(m), __high2float(m));
    }
};
template <> struct ce_max<gpc_f16_t> : ce_max_pairs<gpc_f16_t, __half2> {
    __device__ __forceinline__ float get() const {
        return fmaxf(__low2float(m), __high2float(m));
    }
};

/* Sets element k of a pack to -inf. */
template <typename T> __device__ __forceinline__ void ce_set_neg_inf(uint4 &v, int k) {
    const int per_word = 4 / sizeof(T), shift = (k % per_word) * 8 * sizeof(T);
    const unsigned mask = (sizeof(T) == 4 ? 0xffffffffu : 0xffffu) << shift;
    unsigned &w = (k / per_word) == 0   ? v.x
                  : (k / per_word) == 1 ? v.y
                  : (k / per_word) == 2 ? v.z
                                        : v.w;
    w = (w & ~mask) | (ce_bits<T>::neg_inf << shift);
}

template <typename T, int PACKS>
__global__ __launch_bounds__(CE_REGISTER_THREADS) void crossentropy_registers_kernel(
    float *losses, T *dlogits, const T *logits, const int32_t *targets, int V, int Vp,
    float dloss) {
    const int n = gpc_pack<T>::n;
    __shared__ float shared_target_logit;
    int64_t row = blockIdx.x;
    int stride = blockDim.x, first = threadIdx.x; /* this thread's first pack */
    const uint4 *x = (const uint4 *)(logits + row * Vp);
    int packs = Vp / n, target = targets[row];
    int masked = target == -1, bad = !masked && (target < 0 || target >= V);
    /* Pack p of this thread is pack first + p * stride of the row: the
     * warp's loads are contiguous. All loads first, so they overlap. */
    uint4 r[PACKS];
#pragma unroll
    for (int p = 0; p < PACKS; p++) {
        int i = first + p * stride;
        r[p] = i < packs ? x[i] : make_uint4(0, 0, 0, 0);
    }
    /* Columns past V (padding, or packs past the row) become -inf: they then
     * add nothing to the sum and get a gradient of 0 with no test per element. */
#pragma unroll
    for (int p = 0; p < PACKS; p++) {
        int keep = V - (first + p * stride) * n;
        if (keep < n) {
#pragma unroll
            for (int k = 0; k < n; k++)
                if (k >= keep) ce_set_neg_inf<T>(r[p], k);
        }
    }
    if (!masked && !bad) {
        int tp = target / n;
        if (tp % stride == first) {
            int pi = tp / stride, ki = target % n;
#pragma unroll
            for (int p = 0; p < PACKS; p++)
#pragma unroll
                for (int k = 0; k < n; k++)
                    if (p == pi && k == ki) shared_target_logit = ce_element<T>(r[p], k);
        }
    }
    /* The thread's max, then its sum of exp: no rescaling, the row is here. */
    ce_max<T> thread_max;
#pragma unroll
    for (int p = 0; p < PACKS; p++)
        thread_max.add(r[p]);
    float m = thread_max.get(), s = 0.0f;
    if (m != -INFINITY) {
#pragma unroll
        for (int p = 0; p < PACKS; p++)
#pragma unroll
            for (int k = 0; k < n; k++)
                s += __expf(ce_element<T>(r[p], k) - m);
    }
    /* its __syncthreads also publishes shared_target_logit */
    ce_block_merge(m, s);
    float target_logit = masked || bad ? 0.0f : shared_target_logit;
    float row_max = m, inv_sum = 1.0f / s;
    if (threadIdx.x == 0) losses[row] = ce_loss(masked, bad, row_max, s, target_logit);
    if (!dlogits) return;
    gpc_pack<T> *d = (gpc_pack<T> *)(dlogits + row * Vp);
    if (masked || bad) { /* the whole block takes this branch; rare */
#pragma unroll
        for (int p = 0; p < PACKS; p++) {
            int i = first + p * stride;
            if (i < packs) {
                gpc_pack<T> out;
#pragma unroll
                for (int k = 0; k < n; k++)
                    out.v[k] = gpc_from_f32<T>(bad && i * n + k < V ? NAN : 0.0f);
                d[i] = out;
            }
        }
        return;
    }
#pragma unroll
    for (int p = 0; p < PACKS; p++) {
        int i = first + p * stride;
        if (i < packs) {
            gpc_pack<T> out;
#pragma unroll
            for (int k = 0; k < n; k++)
                out.v[k] = gpc_from_f32<T>((__expf(ce_element<T>(r[p], k) - row_max) * inv_sum -
                                            (i * n + k == target ? 1.0f : 0.0f)) *
                                           dloss);
            d[i] = out;
        }
    }
}

template <typename T>
__global__
__launch_bounds__(CE_THREADS) void crossentropy_kernel(float *losses, T *dlogits, const T *logits,
                                                       const int32_t *targets, int V, int Vp,
                                                       float dloss, int vectorised) {
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
    ce_block_merge(m, s);
    float row_max = m, inv_sum = 1.0f / s;
    int masked = target == -1, bad = !masked && (target < 0 || target >= V);
    if (threadIdx.x == 0)
        losses[row] =
            ce_loss(masked, bad, row_max, s, masked || bad ? 0.0f : gpc_to_f32(x[target]));
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
            for (int k = 0; k < P::n; k++)
                out.v[k] = gpc_from_f32<T>(ce_grad(gpc_to_f32(v.v[k]), i * P::n + k, V, target,
                                                   row_max, inv_sum, dloss, zero_all, poison));
            ((P *)d)[i] = out;
        }
        start = packs * P::n;
    }
    for (int col = start + threadIdx.x; col < Vp; col += blockDim.x)
        d[col] = gpc_from_f32<T>(
            ce_grad(gpc_to_f32(x[col]), col, V, target, row_max, inv_sum, dloss, zero_all, poison));
}

/* Launches the register kernel with the fewest packs a thread (of PACKS and
 * its doublings up to CE_REGISTER_PACKS) that hold a row of `packs` packs, on
 * as many threads (a multiple of 32) as that needs. */
template <typename T, int PACKS>
static void crossentropy_registers_launch(int packs, unsigned rows, float *losses, T *dlogits,
                                          const T *logits, const int32_t *targets, int V, int Vp,
                                          float dloss) {
    if (PACKS < CE_REGISTER_PACKS && packs > PACKS * CE_REGISTER_THREADS) {
        crossentropy_registers_launch<T, (PACKS < CE_REGISTER_PACKS ? 2 * PACKS : PACKS)>(
            packs, rows, losses, dlogits, logits, targets, V, Vp, dloss);
        return;
    }
    int threads = ((packs + PACKS - 1) / PACKS + 31) / 32 * 32;
    crossentropy_registers_kernel<T, PACKS>
        <<<rows, threads, 0, gpc_cuda_stream()>>>(losses, dlogits, logits, targets, V, Vp, dloss);
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
        E *d = dlogits && dlogits->data ? (E *)dlogits->data : NULL;
        if (vec && Vp / per <= (int64_t)CE_REGISTER_THREADS * CE_REGISTER_PACKS)
            crossentropy_registers_launch<E, 1>(
                (int)(Vp / per), (unsigned)N, (float *)losses->data, d, (const E *)logits->data,
                (const int32_t *)targets->data, vocab_size, (int)Vp, dloss);
        else
            crossentropy_kernel<E><<<(unsigned)N, CE_THREADS, 0, gpc_cuda_stream()>>>(
                (float *)losses->data, d, (const E *)logits->data, (const int32_t *)targets->data,
                vocab_size, (int)Vp, dloss, vec);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

/* ---------------------------------------- vocabulary-parallel (ops.h)
 *
 * The three steps of the cross-entropy over one tensor-parallel rank's
 * slice of the vocabulary, each one block of CE_SLICE_THREADS per row. The
 * caller reduces the row maxima and then the sums over the ranks between
 * the steps, so the kernels are plain loops over the slice: simple rather
 * than fused, as the slice is 1/tp of a row. */
#define CE_SLICE_THREADS 256

/* Max over the block; every thread gets the result. shared holds 32
 * floats; blockDim.x a multiple of 32. */
__device__ __forceinline__ float ce_slice_block_max(float v, float *shared) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = gpc_warp_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < warps ? shared[lane] : -INFINITY;
    return gpc_warp_max(v);
}

template <typename T>
__global__ __launch_bounds__(CE_SLICE_THREADS) void ce_slice_max_kernel(float *stats,
                                                                        const T *logits, int64_t S,
                                                                        int64_t real) {
    __shared__ float shared[32];
    int64_t row = blockIdx.x;
    const T *x = logits + row * S;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < real; j += blockDim.x)
        m = fmaxf(m, gpc_to_f32(x[j]));
    m = ce_slice_block_max(m, shared);
    if (threadIdx.x == 0) stats[row] = m;
}

template <typename T>
__global__ __launch_bounds__(CE_SLICE_THREADS) void ce_slice_sums_kernel(
    float *stats, const T *logits, const int32_t *targets, int64_t N, int64_t S, int64_t real,
    int64_t col0) {
    __shared__ float shared[32];
    int64_t row = blockIdx.x;
    const T *x = logits + row * S;
    float m = stats[row], s = 0.0f;
    for (int64_t j = threadIdx.x; j < real; j += blockDim.x)
        s += __expf(gpc_to_f32(x[j]) - m);
    s = gpc_block_sum(s, shared);
    if (threadIdx.x == 0) {
        int64_t t = (int64_t)targets[row] - col0;
        stats[N + row] = s;
        stats[2 * N + row] = targets[row] >= 0 && t >= 0 && t < real ? gpc_to_f32(x[t]) : 0.0f;
    }
}

/* In place (dlogits == logits) is safe: each thread reads the element it
 * writes, and the target's logit comes from stats. */
template <typename T>
__global__ __launch_bounds__(CE_SLICE_THREADS) void ce_slice_finish_kernel(
    float *losses, T *dlogits, const T *logits, const int32_t *targets, const float *stats,
    int64_t N, int64_t S, int64_t real, int64_t col0, float dloss) {
    int64_t row = blockIdx.x;
    int target = targets[row];
    float m = stats[row], sum = stats[N + row], xt = stats[2 * N + row];
    if (threadIdx.x == 0) losses[row] = target < 0 ? 0.0f : m + logf(sum) - xt;
    if (!dlogits) return;
    const T *x = logits + row * S;
    T *d = dlogits + row * S;
    float inv = 1.0f / sum;
    int64_t t = (int64_t)target - col0;
    for (int64_t j = threadIdx.x; j < S; j += blockDim.x) {
        float g = 0.0f;
        if (target >= 0 && j < real)
            g = (__expf(gpc_to_f32(x[j]) - m) * inv - (j == t ? 1.0f : 0.0f)) * dloss;
        d[j] = gpc_from_f32<T>(g);
    }
}

/* Rows and the real columns of a slice [col0, col0 + S) of V. */
static gpc_status ce_slice_shape(const char *op, const gpc_tensor *logits, int64_t col0,
                                 int vocab_size, int64_t *N, int64_t *S, int64_t *real) {
    *S = logits->shape[logits->ndim - 1];
    *N = *S ? gpc_tensor_numel(logits) / *S : 0;
    *real = vocab_size - col0 < 0 ? 0 : vocab_size - col0 > *S ? *S : vocab_size - col0;
    if (*N > 0x7fffffff)
        return gpc_error(GPC_ERR_UNSUPPORTED, "%s: %lld rows are beyond the GPU kernel's grid", op,
                         (long long)*N);
    return GPC_OK;
}

gpc_status gpc_cuda_crossentropy_slice_max(gpc_tensor *stats, const gpc_tensor *logits,
                                           int64_t col0, int vocab_size) {
    int64_t N, S, real;
    GPC_TRY(ce_slice_shape("crossentropy_slice_max", logits, col0, vocab_size, &N, &S, &real));
    GPC_TRY(gpc_cuda_enter(logits));
    if (N == 0) return GPC_OK;
    GPC_CUDA_DISPATCH(logits->dtype, E, {
        ce_slice_max_kernel<E><<<(unsigned)N, CE_SLICE_THREADS, 0, gpc_cuda_stream()>>>(
            (float *)stats->data, (const E *)logits->data, S, real);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

gpc_status gpc_cuda_crossentropy_slice_sums(gpc_tensor *stats, const gpc_tensor *logits,
                                            const gpc_tensor *targets, int64_t col0,
                                            int vocab_size) {
    int64_t N, S, real;
    GPC_TRY(ce_slice_shape("crossentropy_slice_sums", logits, col0, vocab_size, &N, &S, &real));
    GPC_TRY(gpc_cuda_enter(logits));
    if (N == 0) return GPC_OK;
    GPC_CUDA_DISPATCH(logits->dtype, E, {
        ce_slice_sums_kernel<E><<<(unsigned)N, CE_SLICE_THREADS, 0, gpc_cuda_stream()>>>(
            (float *)stats->data, (const E *)logits->data, (const int32_t *)targets->data, N, S,
            real, col0);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

gpc_status gpc_cuda_crossentropy_slice_finish(gpc_tensor *losses, gpc_tensor *dlogits,
                                              const gpc_tensor *logits, const gpc_tensor *targets,
                                              const gpc_tensor *stats, int64_t col0, int vocab_size,
                                              float dloss) {
    int64_t N, S, real;
    GPC_TRY(ce_slice_shape("crossentropy_slice_finish", logits, col0, vocab_size, &N, &S, &real));
    GPC_TRY(gpc_cuda_enter(logits));
    if (N == 0) return GPC_OK;
    GPC_CUDA_DISPATCH(logits->dtype, E, {
        E *d = dlogits && dlogits->data ? (E *)dlogits->data : NULL;
        ce_slice_finish_kernel<E><<<(unsigned)N, CE_SLICE_THREADS, 0, gpc_cuda_stream()>>>(
            (float *)losses->data, d, (const E *)logits->data, (const int32_t *)targets->data,
            (const float *)stats->data, N, S, real, col0, dloss);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}
