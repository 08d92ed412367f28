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
 * token positions are bucketed by token id (histogram, prefix sum, scatter:
 * a counting sort), and one block per vocabulary row sums its rows in f32
 * and adds the total to dwte once. dwpe[t,:] += sum over b of dout[b,t,:] is
 * one thread per (t, channel), summing the batch in order.
 */
#include "cuda/cuda_common.cuh"

#include <math.h>

template <typename T>
__global__ void embedding_forward_kernel(T *out, const int32_t *tokens, const T *wte, const T *wpe,
                                         int64_t N, int T_, int C, int V, int vectorised) {
    typedef gpc_pack<T> P;
    int per = vectorised ? P::n : 1;
    int64_t groups = (int64_t)N * (C / per);
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += stride) {
        int64_t n = i / (C / per);
        int c = (int)(i % (C / per)) * per;
        int tok = tokens[n];
        int t = (int)(n % T_);
        T *o = out + n * C + c;
        if (tok < 0 || tok >= V) {
            for (int k = 0; k < per; k++)
                o[k] = gpc_from_f32<T>(NAN);
            continue;
        }
        const T *a = wte + (int64_t)tok * C + c, *b = wpe + (int64_t)t * C + c;
        if (vectorised) {
            P x = *(const P *)a, y = *(const P *)b, z;
#pragma unroll
            for (int k = 0; k < P::n; k++)
                z.v[k] = gpc_from_f32<T>(gpc_to_f32(x.v[k]) + gpc_to_f32(y.v[k]));
            *(P *)o = z;
        } else {
            o[0] = gpc_from_f32<T>(gpc_to_f32(a[0]) + gpc_to_f32(b[0]));
        }
    }
}

__global__ void embedding_histogram_kernel(int *counts, const int32_t *tokens, int64_t N, int V) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; n < N; n += stride) {
        int tok = tokens[n];
        if (tok >= 0 && tok < V) atomicAdd(&counts[tok], 1);
    }
}

/* Exclusive prefix sum of counts[V] into offsets[V+1], one block of 1024
 * threads: each thread scans a contiguous chunk, the chunk totals are
 * scanned in shared memory. V is at most a few hundred thousand. */
__global__ void embedding_scan_kernel(int *offsets, const int *counts, int V) {
    __shared__ int totals[1024];
    int chunk = (V + blockDim.x - 1) / blockDim.x;
    int begin = threadIdx.x * chunk, end = min(begin + chunk, V);
    int sum = 0;
    for (int i = begin; i < end; i++)
        sum += counts[i];
    totals[threadIdx.x] = sum;
    __syncthreads();
    for (int off = 1; off < (int)blockDim.x; off <<= 1) {
        int v = threadIdx.x >= (unsigned)off ? totals[threadIdx.x - off] : 0;
        __syncthreads();
        totals[threadIdx.x] += v;
        __syncthreads();
    }
    int running = totals[threadIdx.x] - sum; /* exclusive start of this chunk */
    for (int i = begin; i < end; i++) {
        offsets[i] = running;
        running += counts[i];
    }
    if (threadIdx.x == blockDim.x - 1) offsets[V] = totals[threadIdx.x];
}

__global__ void embedding_scatter_kernel(int *order, int *cursor, const int *offsets,
                                         const int32_t *tokens, int64_t N, int V) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; n < N; n += stride) {
        int tok = tokens[n];
        if (tok < 0 || tok >= V) continue;
        int slot = atomicAdd(&cursor[tok], 1);
        order[offsets[tok] + slot] = (int)n;
    }
}

template <typename T>
__global__ void embedding_wte_backward_kernel(gpc_cuda_any dwte, const T *dout, const int *order,
                                              const int *offsets, int C) {
    int v = blockIdx.x;
    int begin = offsets[v], end = offsets[v + 1];
    if (begin == end) return;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float sum = 0.0f;
        for (int k = begin; k < end; k++)
            sum += gpc_to_f32(dout[(int64_t)order[k] * C + c]);
        int64_t at = (int64_t)v * C + c;
        gpc_any_store(dwte, at, gpc_any_load(dwte, at) + sum);
    }
}

template <typename T>
__global__ void embedding_wpe_backward_kernel(gpc_cuda_any dwpe, const T *dout, int B, int T_,
                                              int C) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)T_ * C) return;
    int t = (int)(i / C), c = (int)(i % C);
    float sum = 0.0f;
    for (int b = 0; b < B; b++)
        sum += gpc_to_f32(dout[((int64_t)b * T_ + t) * C + c]);
    gpc_any_store(dwpe, i, gpc_any_load(dwpe, i) + sum);
}

gpc_status gpc_cuda_embedding_forward(gpc_tensor *out, const gpc_tensor *tokens,
                                      const gpc_tensor *wte, const gpc_tensor *wpe) {
    const char *op = "embedding_forward";
    GPC_TRY(gpc_cuda_same_dtype(op, "out", out, "wte", wte));
    GPC_TRY(gpc_cuda_same_dtype(op, "out", out, "wpe", wpe));
    GPC_TRY(gpc_cuda_enter(out));
    int64_t C = wte->shape[wte->ndim - 1], V = gpc_tensor_numel(wte) / C;
    int64_t T = tokens->shape[tokens->ndim - 1], N = gpc_tensor_numel(tokens);
    if (N == 0 || C == 0) return GPC_OK;
    GPC_CUDA_DISPATCH(out->dtype, E, {
        int per = (int)(16 / sizeof(E));
        int vec = C % per == 0 && gpc_cuda_aligned16(out->data) && gpc_cuda_aligned16(wte->data) &&
                  gpc_cuda_aligned16(wpe->data);
        int64_t groups = N * (C / (vec ? per : 1));
        unsigned grid = gpc_cuda_blocks(groups, 256);
        if (grid > (unsigned)gpc_cuda_sm_count() * 32) grid = gpc_cuda_sm_count() * 32;
        embedding_forward_kernel<E><<<grid, 256, 0, gpc_cuda_stream()>>>(
            (E *)out->data, (const int32_t *)tokens->data, (const E *)wte->data,
            (const E *)wpe->data, N, (int)T, (int)C, (int)V, vec);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

gpc_status gpc_cuda_embedding_backward(gpc_tensor *dwte, gpc_tensor *dwpe, const gpc_tensor *dout,
                                       const gpc_tensor *tokens) {
    GPC_TRY(gpc_cuda_enter(dout));
    int64_t C = dwte->shape[dwte->ndim - 1], V = gpc_tensor_numel(dwte) / C;
    int64_t T = tokens->shape[tokens->ndim - 1], N = gpc_tensor_numel(tokens), B = N / T;
    if (N == 0 || C == 0) return GPC_OK;
    if (N > 0x7fffffff || V > 0x7fffffff)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "embedding_backward: %lld tokens or %lld vocabulary rows are more than "
                         "the GPU kernel indexes; use smaller batches",
                         (long long)N, (long long)V);
    /* scratch: counts[V], cursor[V], offsets[V+1], order[N] */
    void *scratch;
    size_t ints = (size_t)(3 * V + 1 + N);
    GPC_TRY(gpc_cuda_scratch(ints * sizeof(int), &scratch));
    int *counts = (int *)scratch, *cursor = counts + V, *offsets = cursor + V,
        *order = offsets + V + 1;
    cudaStream_t s = gpc_cuda_stream();
    GPC_CUDA_CHECK(cudaMemsetAsync(counts, 0, 2 * V * sizeof(int), s));
    unsigned grid = gpc_cuda_blocks(N, 256);
    embedding_histogram_kernel<<<grid, 256, 0, s>>>(counts, (const int32_t *)tokens->data, N,
                                                    (int)V);
    GPC_CUDA_CHECK_LAUNCH();
    embedding_scan_kernel<<<1, 1024, 0, s>>>(offsets, counts, (int)V);
    GPC_CUDA_CHECK_LAUNCH();
    embedding_scatter_kernel<<<grid, 256, 0, s>>>(order, cursor, offsets,
                                                  (const int32_t *)tokens->data, N, (int)V);
    GPC_CUDA_CHECK_LAUNCH();
    GPC_CUDA_DISPATCH(dout->dtype, E, {
        embedding_wte_backward_kernel<E><<<(unsigned)V, 128, 0, s>>>(
            gpc_cuda_any_of(dwte), (const E *)dout->data, order, offsets, (int)C);
        embedding_wpe_backward_kernel<E><<<gpc_cuda_blocks(T * C, 256), 256, 0, s>>>(
            gpc_cuda_any_of(dwpe), (const E *)dout->data, (int)B, (int)T, (int)C);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}
