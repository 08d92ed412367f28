/*
 * embedding.cu: token plus position embedding, forward and backward.
 *
 * Forward: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:], 16 bytes per thread
 * where the rows allow. A token outside the vocabulary cannot be reported
 * without a host-device synchronisation inside the step, so its row is
 * filled with NaN instead: the loss turns NaN and the trainer stops there.
 *
 * Backward: dwte[v,:] += sum of dout rows whose token is v. Adding rows into
 * dwte with atomics would round once per token in bf16 and race; instead the
 * positions are sorted by token id with a stable radix sort (so each token's
 * positions stay in increasing order), the start and end of each token's run
 * are marked, and one block per vocabulary row sums its rows in f32 in that
 * order and adds the total to dwte once: the same bits on every run.
 * dwpe[t,:] += sum over b of dout[b,t,:] is one thread per (t, channels),
 * summing the batch in order. Both read 16 bytes of dout a thread where the
 * rows allow.
 *
 * The slice variants (tensor parallelism's vocabulary-parallel embedding)
 * take wte as rows row0.. of the whole table: another slice's token reads
 * zero (not NaN) and is sorted past the last row in backward.
 */
#include "cuda/cuda_common.cuh"

#include <cub/device/device_radix_sort.cuh>

#include <math.h>

template <typename T>
__global__ void embedding_forward_kernel(T *out, const int32_t *tokens, const T *wte, const T *wpe,
                                         int64_t N, int T_, int C, int V, int vectorised,
                                         int64_t row0, int slice) {
    typedef gpc_pack<T> P;
    int per = vectorised ? P::n : 1;
    int64_t groups = (int64_t)N * (C / per);
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += stride) {
        int64_t n = i / (C / per);
        int c = (int)(i % (C / per)) * per;
        int64_t tok = (int64_t)tokens[n] - row0;
        int t = (int)(n % T_);
        T *o = out + n * C + c;
        int inside = tok >= 0 && tok < V;
        if (!inside && !slice) {
            for (int k = 0; k < per; k++)
                o[k] = gpc_from_f32<T>(NAN);
            continue;
        }
        /* a slice: another slice's token reads zero; wpe may be absent */
        const T *a = inside ? wte + tok * C + c : NULL;
        const T *b = wpe ? wpe + (int64_t)t * C + c : NULL;
        if (vectorised) {
            P x, y, z; /* one 16-byte load each */
            if (a) x = *(const P *)a;
            if (b) y = *(const P *)b;
#pragma unroll
            for (int k = 0; k < P::n; k++)
                z.v[k] = gpc_from_f32<T>((a ? gpc_to_f32(x.v[k]) : 0.0f) +
                                         (b ? gpc_to_f32(y.v[k]) : 0.0f));
            *(P *)o = z;
        } else {
            o[0] = gpc_from_f32<T>((a ? gpc_to_f32(a[0]) : 0.0f) + (b ? gpc_to_f32(b[0]) : 0.0f));
        }
    }
}

/* The sort's input: key n = tokens[n] - row0, or V (after every token)
 * where it is outside the table's rows; value n = n. */
__global__ void embedding_keys_kernel(unsigned *keys, int *positions, const int32_t *tokens,
                                      int64_t N, int V, int64_t row0) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; n < N; n += stride) {
        int64_t tok = (int64_t)tokens[n] - row0;
        keys[n] = tok >= 0 && tok < V ? (unsigned)tok : (unsigned)V;
        positions[n] = (int)n;
    }
}

/* begin[v], end[v]: where token v's run starts and ends in the sorted keys
 * (both left 0 for a token that does not occur). */
__global__ void embedding_runs_kernel(int *begin, int *end, const unsigned *keys, int64_t N,
                                      int V) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N; i += stride) {
        unsigned k = keys[i];
        if (k >= (unsigned)V) continue;
        if (i == 0 || keys[i - 1] != k) begin[k] = (int)i;
        if (i == N - 1 || keys[i + 1] != k) end[k] = (int)(i + 1);
    }
}

/* PER channels of dout row n from c, added to sum (PER > 1: one 16-byte load). */
template <typename T, int PER>
__device__ __forceinline__ void embedding_add_row(float *sum, const T *dout, int64_t n, int C,
                                                  int c) {
    float x[PER];
    gpc_load_f32<PER>(x, dout + n * C + c);
#pragma unroll
    for (int k = 0; k < PER; k++)
        sum[k] += x[k];
}

template <typename T, int PER>
__global__ void embedding_wte_backward_kernel(gpc_cuda_any dwte, const T *dout, const int *order,
                                              const int *begin, const int *end, int C) {
    int v = blockIdx.x;
    int first = begin[v], last = end[v];
    if (first == last) return;
    for (int c = threadIdx.x * PER; c < C; c += blockDim.x * PER) {
        float sum[PER] = {};
        for (int k = first; k < last; k++)
            embedding_add_row<T, PER>(sum, dout, order[k], C, c);
        for (int k = 0; k < PER; k++) {
            int64_t at = (int64_t)v * C + c + k;
            gpc_any_store(dwte, at, gpc_any_load(dwte, at) + sum[k]);
        }
    }
}

template <typename T, int PER>
__global__ void embedding_wpe_backward_kernel(gpc_cuda_any dwpe, const T *dout, int B, int T_,
                                              int C) {
    int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * PER;
    if (i >= (int64_t)T_ * C) return;
    int t = (int)(i / C), c = (int)(i % C);
    float sum[PER] = {};
    for (int b = 0; b < B; b++)
        embedding_add_row<T, PER>(sum, dout, (int64_t)b * T_ + t, C, c);
    for (int k = 0; k < PER; k++)
        gpc_any_store(dwpe, i + k, gpc_any_load(dwpe, i + k) + sum[k]);
}

/* The two reductions, PER channels a thread. */
template <typename E, int PER>
static void embedding_sums(gpc_cuda_any dwte, gpc_cuda_any dwpe, const E *dout, const int *order,
                           const int *begin, const int *end, int64_t V, int64_t B, int64_t T,
                           int64_t C, cudaStream_t s) {
    int threads = (int)((C / PER + 31) / 32 * 32);
    if (threads > 256) threads = 256;
    embedding_wte_backward_kernel<E, PER>
        <<<(unsigned)V, threads, 0, s>>>(dwte, dout, order, begin, end, (int)C);
    embedding_wpe_backward_kernel<E, PER>
        <<<gpc_cuda_blocks(T * C / PER, 256), 256, 0, s>>>(dwpe, dout, (int)B, (int)T, (int)C);
}

static gpc_status forward(const char *op, gpc_tensor *out, const gpc_tensor *tokens,
                          const gpc_tensor *wte, const gpc_tensor *wpe, int64_t row0, int slice) {
    GPC_TRY(gpc_cuda_same_dtype(op, "out", out, "wte", wte));
    if (wpe) GPC_TRY(gpc_cuda_same_dtype(op, "out", out, "wpe", wpe));
    GPC_TRY(gpc_cuda_enter(out));
    int64_t C = wte->shape[wte->ndim - 1], V = gpc_tensor_numel(wte) / C;
    int64_t T = tokens->shape[tokens->ndim - 1], N = gpc_tensor_numel(tokens);
    if (N == 0 || C == 0) return GPC_OK;
    GPC_CUDA_DISPATCH(out->dtype, E, {
        int per = (int)(16 / sizeof(E));
        int vec = C % per == 0 && gpc_cuda_aligned16(out->data) && gpc_cuda_aligned16(wte->data) &&
                  (!wpe || gpc_cuda_aligned16(wpe->data));
        int64_t groups = N * (C / (vec ? per : 1));
        unsigned grid = gpc_cuda_blocks(groups, 256);
        if (grid > (unsigned)gpc_cuda_sm_count() * 32) grid = gpc_cuda_sm_count() * 32;
        embedding_forward_kernel<E><<<grid, 256, 0, gpc_cuda_stream()>>>(
            (E *)out->data, (const int32_t *)tokens->data, (const E *)wte->data,
            wpe ? (const E *)wpe->data : NULL, N, (int)T, (int)C, (int)V, vec, row0, slice);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

gpc_status gpc_cuda_embedding_forward(gpc_tensor *out, const gpc_tensor *tokens,
                                      const gpc_tensor *wte, const gpc_tensor *wpe) {
    return forward("embedding_forward", out, tokens, wte, wpe, 0, 0);
}

gpc_status gpc_cuda_embedding_slice_forward(gpc_tensor *out, const gpc_tensor *tokens,
                                            const gpc_tensor *wte, const gpc_tensor *wpe,
                                            int64_t row0) {
    return forward("embedding_slice_forward", out, tokens, wte, wpe, row0, 1);
}

/* dwte's rows are the table's rows row0..; tokens outside them are sorted
 * past the last row and skipped. */
static gpc_status backward(gpc_tensor *dwte, gpc_tensor *dwpe, const gpc_tensor *dout,
                           const gpc_tensor *tokens, int64_t row0) {
    GPC_TRY(gpc_cuda_enter(dout));
    int64_t C = dwte->shape[dwte->ndim - 1], V = gpc_tensor_numel(dwte) / C;
    int64_t T = tokens->shape[tokens->ndim - 1], N = gpc_tensor_numel(tokens), B = N / T;
    if (N == 0 || C == 0) return GPC_OK;
    if (N > 0x7fffffff || V > 0x7fffffff)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "embedding_backward: %lld tokens or %lld vocabulary rows are more than "
                         "the GPU kernel indexes; use smaller batches",
                         (long long)N, (long long)V);
    /* scratch: keys and positions before and after the sort, begin[V],
     * end[V], then the sort's own temporary storage */
    cudaStream_t s = gpc_cuda_stream();
    int bits = 1;
    while (bits < 32 && (1ll << bits) <= V) /* keys go up to V */
        bits++;
    size_t sort_bytes = 0;
    if (cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (const unsigned *)NULL, (unsigned *)NULL,
                                        (const int *)NULL, (int *)NULL, (int)N, 0, bits,
                                        s) != cudaSuccess)
        return gpc_error(GPC_ERR_DEVICE, "embedding_backward: the sort's storage was not sized");
    size_t ints = ((size_t)(4 * N + 2 * V) + 63) & ~(size_t)63;
    void *scratch;
    GPC_TRY(gpc_cuda_scratch(ints * sizeof(int) + sort_bytes, &scratch));
    unsigned *keys = (unsigned *)scratch, *sorted = keys + N;
    int *positions = (int *)(sorted + N), *order = positions + N, *begin = order + N,
        *end = begin + V;
    void *sort_tmp = (int *)scratch + ints;
    unsigned grid = gpc_cuda_blocks(N, 256);
    embedding_keys_kernel<<<grid, 256, 0, s>>>(keys, positions, (const int32_t *)tokens->data, N,
                                               (int)V, row0);
    GPC_CUDA_CHECK_LAUNCH();
    GPC_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_tmp, sort_bytes, keys, sorted, positions,
                                                   order, (int)N, 0, bits, s));
    GPC_CUDA_CHECK(cudaMemsetAsync(begin, 0, 2 * V * sizeof(int), s));
    embedding_runs_kernel<<<grid, 256, 0, s>>>(begin, end, sorted, N, (int)V);
    GPC_CUDA_CHECK_LAUNCH();
    GPC_CUDA_DISPATCH(dout->dtype, E, {
        const int per = gpc_pack<E>::n;
        if (C % per == 0 && gpc_cuda_aligned16(dout->data))
            embedding_sums<E, per>(gpc_cuda_any_of(dwte), gpc_cuda_any_of(dwpe),
                                   (const E *)dout->data, order, begin, end, V, B, T, C, s);
        else
            embedding_sums<E, 1>(gpc_cuda_any_of(dwte), gpc_cuda_any_of(dwpe),
                                 (const E *)dout->data, order, begin, end, V, B, T, C, s);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

gpc_status gpc_cuda_embedding_backward(gpc_tensor *dwte, gpc_tensor *dwpe, const gpc_tensor *dout,
                                       const gpc_tensor *tokens) {
    return backward(dwte, dwpe, dout, tokens, 0);
}

gpc_status gpc_cuda_embedding_slice_backward(gpc_tensor *dwte, gpc_tensor *dwpe,
                                             const gpc_tensor *dout, const gpc_tensor *tokens,
                                             int64_t row0) {
    return backward(dwte, dwpe, dout, tokens, row0);
}
