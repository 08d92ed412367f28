/*
 * sample.cu: the sampling op on the GPU (gpc_op_sample in ops.h): one block
 * per row draws the row's next token by the rule of gpc_sample_select, so
 * the serving engine never copies logits to the host.
 *
 * Greedy rows are an argmax (largest logit, then smallest id) by block
 * reduction, the row read in 16-byte packs. Sampling rows never sort:
 * every step of the rule is a search for "the first candidate, in the
 * ranking (logit descending, id ascending), where a running sum reaches a
 * threshold": top-k is that search on counts (threshold k), top-p and the
 * draw on weights. The search is a radix select over the logits' bits seen
 * as ordered 32-bit keys: four passes of 8 bits, each a histogram of the
 * candidates' weights per digit (only those whose higher digits match the
 * ones chosen so far), then the candidates with the chosen key in id
 * order. A candidate set is kept as its last member (key, id), so the sets
 * never need storing.
 *
 * Weights are exp((logit - max) / temperature) in fixed point, 2^36 for the
 * largest, summed as 64-bit integers: the sums are exact and the same
 * whatever the order the threads add in, so a row's token depends only on
 * its logits and parameters. Weights under 2^-36 of the largest count as 0
 * (a token that unlikely is not drawn). The CPU sums float weights in
 * double; both agree but where the uniform or top_p falls within rounding
 * of a boundary between two tokens.
 *
 * gpc_op_forbid_tokens, the engine's step before a draw (min_tokens keeps
 * the end-of-text token out), and gpc_op_feed_tokens, which gives a step
 * the tokens its predecessor drew, are here too: one thread a row.
 */
#include "cuda/cuda_common.cuh"

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <math.h>

#define SAMPLE_THREADS 512
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
#define SAMPLE_ONE 68719476736.0f /* 2^36, the largest weight */

typedef unsigned long long sample_u64;
typedef cub::BlockReduce<sample_u64, SAMPLE_THREADS> sample_reduce;
typedef cub::BlockScan<sample_u64, SAMPLE_THREADS> sample_scan_t;

struct sample_shared {
    sample_u64 hist[SAMPLE_WARPS][256]; /* one histogram per warp: no atomics across warps */
    sample_u64 digit_sum[256];
    union {
        sample_reduce::TempStorage reduce;
        sample_scan_t::TempStorage scan;
    } cub;
    sample_u64 value, above, found_cum;
    int digit, found_idx;
};

/* The logit's bits as an unsigned key in the logits' order (-0 as +0, so
 * equal logits have equal keys). */
__device__ __forceinline__ uint32_t sample_key(float x) {
    uint32_t u = __float_as_uint(x);
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* One row and its current candidate set: keys above klim, and those equal
 * to klim with an id up to ilim. */
template <typename T> struct sample_row {
    const T *x;
    int V, best;
    float max, inv_t;
    uint32_t klim;
    int ilim;
    __device__ float value(int i) const {
        return gpc_to_f32(x[i]);
    }
    __device__ bool candidate(uint32_t key, int i) const {
        return key > klim || (key == klim && i <= ilim);
    }
    /* 1 when counting, else the fixed-point weight */
    __device__ sample_u64 weight(float v, bool count) const {
        if (count) return 1;
        return (sample_u64)(expf((v - max) * inv_t) * SAMPLE_ONE);
    }
};

/* Adds w to digit d of the warp's histogram (d 256: nothing). A warp whose
 * lanes all have one digit (the top digits of logits are few) adds once. */
__device__ __forceinline__ void sample_hist_add(sample_u64 *hist, uint32_t d, sample_u64 w) {
    int same = 0;
    __match_all_sync(0xffffffffu, d, &same);
    if (same) {
        if (d >= 256) return;
        /* weights are below 2^37: 32 of them in two 32-bit halves */
        unsigned lo = __reduce_add_sync(0xffffffffu, (unsigned)(w & 0xffffffu));
        unsigned hi = __reduce_add_sync(0xffffffffu, (unsigned)(w >> 24));
        if ((threadIdx.x & 31) == 0) hist[d] += ((sample_u64)hi << 24) + lo;
    } else if (d < 256) {
        atomicAdd(&hist[d], w);
    }
}

/* In id order, among the candidates whose key is kfix (any key when
 * all_keys): the first whose running sum, from base, reaches thr. Each
 * thread walks a contiguous stretch of ids; a block scan of the stretches'
 * sums says which thread's stretch holds it. sh.found_idx and sh.found_cum
 * get the id and the sum there (row.best and 0 if none does). */
template <typename T>
__device__ void sample_scan_ids(const sample_row<T> &row, bool count, bool all_keys, uint32_t kfix,
                                sample_u64 base, sample_u64 thr, sample_shared &sh) {
    const int chunk = (row.V + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int first = threadIdx.x * chunk, end = min(row.V, first + chunk);
    if (threadIdx.x == 0) sh.found_idx = row.best, sh.found_cum = 0;
    sample_u64 sum = 0;
    for (int i = first; i < end; i++) {
        float v = row.value(i);
        uint32_t key = sample_key(v);
        if ((all_keys || key == kfix) && row.candidate(key, i)) sum += row.weight(v, count);
    }
    sample_u64 before;
    __syncthreads(); /* the temporary storage's last user is done */
    sample_scan_t(sh.cub.scan).ExclusiveSum(sum, before);
    before += base;
    if (sum > 0 && before < thr && before + sum >= thr) {
        sample_u64 acc = before;
        for (int i = first; i < end; i++) {
            float v = row.value(i);
            uint32_t key = sample_key(v);
            if (!((all_keys || key == kfix) && row.candidate(key, i))) continue;
            acc += row.weight(v, count);
            if (acc >= thr) {
                sh.found_idx = i, sh.found_cum = acc;
                break;
            }
        }
    }
    __syncthreads();
}

/* The first candidate in the ranking whose running sum (of counts or
 * weights) reaches thr (1 <= thr <= the candidates' total): a radix
 * select over the keys, 8 bits a pass from the top, then the candidates
 * with the chosen key in id order. Leaves its key in *key and its id and
 * running sum in sh.found_idx, sh.found_cum. */
template <typename T>
__device__ void sample_find(const sample_row<T> &row, bool count, sample_u64 thr, sample_shared &sh,
                            uint32_t *key) {
    const int warp = threadIdx.x >> 5;
    uint32_t prefix = 0;
    sample_u64 above = 0; /* the candidates' sum over keys above the prefix */
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < SAMPLE_WARPS * 256; b += SAMPLE_THREADS)
            (&sh.hist[0][0])[b] = 0;
        __syncthreads();
        /* the same trip count for every thread: the warp votes together */
        for (int base = 0; base < row.V; base += SAMPLE_THREADS) {
            int i = base + threadIdx.x;
            uint32_t d = 256;
            sample_u64 w = 0;
            if (i < row.V) {
                float v = row.value(i);
                uint32_t k = sample_key(v);
                bool match = shift == 24 || (k >> (shift + 8)) == (prefix >> (shift + 8));
                if (match && row.candidate(k, i)) {
                    w = row.weight(v, count);
                    if (w) d = (k >> shift) & 255;
                }
            }
            sample_hist_add(sh.hist[warp], d, w);
        }
        __syncthreads();
        if (threadIdx.x < 256) {
            sample_u64 s = 0;
            for (int w = 0; w < SAMPLE_WARPS; w++)
                s += sh.hist[w][threadIdx.x];
            sh.digit_sum[threadIdx.x] = s;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            sample_u64 a = above;
            int chosen = 0;
            for (int d = 255; d >= 0; d--) {
                if (a + sh.digit_sum[d] >= thr) {
                    chosen = d;
                    break;
                }
                a += sh.digit_sum[d];
            }
            sh.above = a, sh.digit = chosen;
        }
        __syncthreads();
        above = sh.above;
        prefix |= (uint32_t)sh.digit << shift;
    }
    *key = prefix;
    sample_scan_ids(row, count, false, prefix, above, thr, sh);
}

/* The sum over the block of v (every thread gets it). */
__device__ sample_u64 sample_block_sum(sample_u64 v, sample_shared &sh) {
    __syncthreads();
    sample_u64 s = sample_reduce(sh.cub.reduce).Sum(v);
    if (threadIdx.x == 0) sh.value = s;
    __syncthreads();
    return sh.value;
}

template <typename T>
__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(int32_t *tokens, const T *logits, int64_t ld, int V, const float *params) {
    __shared__ sample_shared sh;
    gpc_pdl_wait_previous(); /* GPC_PAGED_PDL (cuda_common.cuh), as the kernels below */
    gpc_pdl_let_next_start();
    const int64_t r = blockIdx.x;
    const float temperature = params[4 * r], top_k = params[4 * r + 1];
    const float top_p = params[4 * r + 2], uniform = params[4 * r + 3];
    sample_row<T> row;
    row.x = logits + r * ld;
    row.V = V;

    /* the largest key, then the smallest id: key above, ~id below. A row
     * at a 16-byte boundary is read a pack at a time (a thread's loads all
     * in flight together; at one row this pass is most of the kernel),
     * the ids past the last whole pack one at a time. */
    sample_u64 best = 0;
    const int PN = gpc_pack<T>::n;
    const int packs = ((uintptr_t)row.x & 15) == 0 ? V / PN : 0;
#pragma unroll 4
    for (int p = threadIdx.x; p < packs; p += SAMPLE_THREADS) {
        float x[PN];
        gpc_load_f32<PN>(x, row.x + (int64_t)p * PN);
#pragma unroll
        for (int k = 0; k < PN; k++) {
            sample_u64 c =
                ((sample_u64)sample_key(x[k]) << 32) | (0xffffffffu - (uint32_t)(p * PN + k));
            best = c > best ? c : best;
        }
    }
    for (int i = packs * PN + threadIdx.x; i < V; i += SAMPLE_THREADS) {
        sample_u64 c = ((sample_u64)sample_key(row.value(i)) << 32) | (0xffffffffu - (uint32_t)i);
        best = c > best ? c : best;
    }
    __syncthreads();
    best = sample_reduce(sh.cub.reduce).Reduce(best, cuda::maximum<>());
    if (threadIdx.x == 0) sh.value = best;
    __syncthreads();
    row.best = (int)(0xffffffffu - (uint32_t)sh.value);
    if (!(temperature > 0.0f)) {
        if (threadIdx.x == 0) tokens[r] = row.best;
        return;
    }
    row.max = row.value(row.best);
    row.inv_t = 1.0f / temperature;
    row.klim = 0, row.ilim = V; /* every token */

    uint32_t key;
    int k = top_k >= 1.0f && top_k < (float)V ? (int)top_k : V;
    if (k < V) {
        sample_find(row, true, (sample_u64)k, sh, &key);
        row.klim = key, row.ilim = sh.found_idx;
    }
    sample_u64 mine = 0;
    for (int i = threadIdx.x; i < V; i += SAMPLE_THREADS) {
        float v = row.value(i);
        if (row.candidate(sample_key(v), i)) mine += row.weight(v, false);
    }
    sample_u64 total = sample_block_sum(mine, sh);
    if (top_p < 1.0f) {
        /* the shortest prefix of the ranking whose sum reaches top_p of
         * the total: ceil, as the sums are whole numbers */
        double want = ceil((double)top_p * (double)total);
        sample_u64 thr = want < 1.0 ? 1 : want > (double)total ? total : (sample_u64)want;
        sample_find(row, false, thr, sh, &key);
        row.klim = key, row.ilim = sh.found_idx;
        total = sh.found_cum;
    }
    /* the first candidate whose running sum exceeds uniform * total */
    double u = uniform > 0.0f ? (double)uniform : 0.0;
    double below = floor(u * (double)total);
    sample_u64 thr = below >= (double)total ? total : (sample_u64)below + 1;
    if (k < V || top_p < 1.0f)
        sample_find(row, false, thr, sh, &key);
    else
        sample_scan_ids(row, false, true, 0, 0, thr, sh);
    if (threadIdx.x == 0) tokens[r] = sh.found_idx;
}

gpc_status gpc_cuda_sample(gpc_tensor *tokens_out, const gpc_tensor *logits, int vocab_size,
                           const gpc_tensor *params) {
    GPC_TRY(gpc_cuda_enter(logits));
    int64_t Vp = logits->shape[logits->ndim - 1], R = gpc_tensor_numel(logits) / Vp;
    if (R == 0) return GPC_OK;
    if (R > 0x7fffffff)
        return gpc_error(GPC_ERR_UNSUPPORTED, "sample: %lld rows are more than one launch takes",
                         (long long)R);
    GPC_CUDA_DISPATCH(logits->dtype, E, {
        gpc_cuda_start(gpc_cuda_serving_pdl(), sample_kernel<E>, dim3((unsigned)R), SAMPLE_THREADS,
                       (int32_t *)tokens_out->data, (const E *)logits->data, Vp, vocab_size,
                       (const float *)params->data);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

template <typename T>
__global__ void forbid_tokens_kernel(T *logits, int64_t ld, const int32_t *tokens, int64_t R) {
    gpc_pdl_wait_previous();
    gpc_pdl_let_next_start();
    int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= R) return;
    int32_t t = tokens[r];
    if (t >= 0 && t < ld) logits[r * ld + t] = gpc_from_f32<T>(-INFINITY);
}

gpc_status gpc_cuda_forbid_tokens(gpc_tensor *logits, const gpc_tensor *tokens) {
    GPC_TRY(gpc_cuda_enter(logits));
    int64_t Vp = logits->shape[logits->ndim - 1], R = gpc_tensor_numel(logits) / Vp;
    if (R == 0) return GPC_OK;
    const int threads = 128;
    GPC_CUDA_DISPATCH(logits->dtype, E, {
        gpc_cuda_start(gpc_cuda_serving_pdl(), forbid_tokens_kernel<E>,
                       dim3((unsigned)((R + threads - 1) / threads)), threads, (E *)logits->data,
                       Vp, (const int32_t *)tokens->data, R);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

/* One thread a row; an entry past the previous step's rows keeps its token,
 * so a bad feed never reads outside previous. */
__global__ void feed_tokens_kernel(int32_t *tokens, const int32_t *feed, const int32_t *previous,
                                   int64_t N, int64_t R) {
    gpc_pdl_wait_previous();
    gpc_pdl_let_next_start();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    int32_t f = feed[i];
    if (f >= 0 && f < R) tokens[i] = previous[f];
}

gpc_status gpc_cuda_feed_tokens(gpc_tensor *tokens, const gpc_tensor *feed,
                                const gpc_tensor *previous) {
    GPC_TRY(gpc_cuda_enter(tokens));
    int64_t N = gpc_tensor_numel(tokens), R = gpc_tensor_numel(previous);
    if (N == 0) return GPC_OK;
    const int threads = 128;
    gpc_cuda_start(gpc_cuda_serving_pdl(), feed_tokens_kernel,
                   dim3((unsigned)((N + threads - 1) / threads)), threads, (int32_t *)tokens->data,
                   (const int32_t *)feed->data, (const int32_t *)previous->data, N, R);
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}
