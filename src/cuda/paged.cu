/*
 * paged.cu: the serving ops on the GPU (ops.h, "serving"): embedding at
 * given positions, storing keys and values in the paged cache, and attention
 * over the cache through block tables.
 *
 * The CPU backend checks every index the engine gives (src/cpu/paged.c).
 * Here a check would need the host to read device memory inside the step,
 * so the kernels trust the engine's tables, but every access stays inside
 * the tensors' shapes whatever the tables hold:
 * - embedding_at: a token or position outside wte or wpe gives a NaN row
 *   (as embedding_forward does), so the logits turn NaN.
 * - kv_store: a slot outside the cache is skipped.
 * - paged_attention: a row naming a sequence outside block_tables, or at a
 *   negative position, gets NaN; a position past the table attends to the
 *   positions the table covers; a key whose block entry is outside the
 *   cache is skipped (its weight is 0).
 *
 * paged_attention is the decode step's hot loop: each (row, head) reads
 * pos + 1 keys and values of hs elements through the block table, and does
 * two multiply-adds per element read, so its speed is the memory bandwidth
 * it reaches. One block of PAGED_WARPS warps works on one (row, head) and
 * one split of its keys; inside it, groups of LANES lanes each take one
 * key at a time (key j to group j % groups), each lane holding 16 bytes of
 * the head's row, so a key's row is one 16-byte load per lane and the
 * warp's loads are whole 32-byte sectors. Each group keeps its own online
 * softmax in f32 (running max, sum and output, in base 2); the groups merge
 * in shared memory at the end. When the step has few rows (rows x heads
 * under PAGED_BLOCKS_PER_SM blocks per SM), the keys are split over several
 * blocks (flash-decoding): each writes its partial max, sum and output, and
 * a second kernel combines them. Prefill rows are rows like any other: each
 * reads its own prefix of the sequence (through L2 for the shared part).
 */
#include "cuda/cuda_common.cuh"

#include <math.h>

/* ------------------------------------------------------------ embedding */

template <typename T>
__global__ void embedding_at_kernel(T *out, const int32_t *tokens, const int32_t *positions,
                                    const T *wte, const T *wpe, int64_t N, int C, int V, int maxT,
                                    int per) {
    int64_t groups = N * (C / per);
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += stride) {
        int64_t n = i / (C / per);
        int c = (int)(i % (C / per)) * per;
        int tok = tokens[n], t = positions[n];
        T *o = out + n * C + c;
        if (tok < 0 || tok >= V || t < 0 || t >= maxT) {
            for (int k = 0; k < per; k++)
                o[k] = gpc_from_f32<T>(NAN);
            continue;
        }
        const T *a = wte + (int64_t)tok * C + c, *b = wpe + (int64_t)t * C + c;
        if (per > 1) {
            gpc_pack<T> x = *(const gpc_pack<T> *)a, y = *(const gpc_pack<T> *)b, z;
#pragma unroll
            for (int k = 0; k < gpc_pack<T>::n; k++)
                z.v[k] = gpc_from_f32<T>(gpc_to_f32(x.v[k]) + gpc_to_f32(y.v[k]));
            *(gpc_pack<T> *)o = z;
        } else {
            o[0] = gpc_from_f32<T>(gpc_to_f32(a[0]) + gpc_to_f32(b[0]));
        }
    }
}

gpc_status gpc_cuda_embedding_at(gpc_tensor *out, const gpc_tensor *tokens,
                                 const gpc_tensor *positions, const gpc_tensor *wte,
                                 const gpc_tensor *wpe) {
    const char *op = "embedding_at";
    GPC_TRY(gpc_cuda_same_dtype(op, "out", out, "wte", wte));
    GPC_TRY(gpc_cuda_same_dtype(op, "out", out, "wpe", wpe));
    GPC_TRY(gpc_cuda_enter(out));
    int64_t C = wte->shape[wte->ndim - 1], V = gpc_tensor_numel(wte) / C;
    int64_t maxT = gpc_tensor_numel(wpe) / C, N = gpc_tensor_numel(tokens);
    if (N == 0 || C == 0) return GPC_OK;
    if (C > 0x7fffffff || V > 0x7fffffff || maxT > 0x7fffffff)
        return gpc_error(GPC_ERR_UNSUPPORTED, "%s: tables of more than 2^31 rows or channels", op);
    GPC_CUDA_DISPATCH(out->dtype, E, {
        int per = gpc_pack<E>::n;
        if (C % per != 0 || !gpc_cuda_aligned16(out->data) || !gpc_cuda_aligned16(wte->data) ||
            !gpc_cuda_aligned16(wpe->data))
            per = 1;
        unsigned grid = gpc_cuda_blocks(N * (C / per), 256);
        if (grid > (unsigned)gpc_cuda_sm_count() * 32) grid = gpc_cuda_sm_count() * 32;
        embedding_at_kernel<E><<<grid, 256, 0, gpc_cuda_stream()>>>(
            (E *)out->data, (const int32_t *)tokens->data, (const int32_t *)positions->data,
            (const E *)wte->data, (const E *)wpe->data, N, (int)C, (int)V, (int)maxT, per);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

/* ------------------------------------------------------------- kv_store */

/* One thread per PER channels of one row: its key to k_cache and its value
 * to v_cache, 16 bytes a load where the rows allow. */
template <typename T>
__global__ void kv_store_kernel(T *k_cache, T *v_cache, const T *qkv, const int32_t *slots,
                                int64_t N, int C, int64_t cache_rows, int per) {
    int64_t groups = N * (C / per);
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += stride) {
        int64_t n = i / (C / per);
        int c = (int)(i % (C / per)) * per;
        int64_t slot = slots[n];
        if (slot < 0 || slot >= cache_rows) continue;
        const T *k = qkv + n * 3 * C + C + c;
        T *kd = k_cache + slot * C + c, *vd = v_cache + slot * C + c;
        if (per > 1) {
            *(gpc_pack<T> *)kd = *(const gpc_pack<T> *)k;
            *(gpc_pack<T> *)vd = *(const gpc_pack<T> *)(k + C);
        } else {
            kd[0] = k[0];
            vd[0] = k[C];
        }
    }
}

gpc_status gpc_cuda_kv_store(gpc_tensor *k_cache, gpc_tensor *v_cache, const gpc_tensor *qkv,
                             const gpc_tensor *slots) {
    GPC_TRY(gpc_cuda_enter(qkv));
    int64_t N = qkv->shape[0], C = qkv->shape[1] / 3;
    int64_t cache_rows = k_cache->shape[0] * k_cache->shape[1];
    if (N == 0 || C == 0) return GPC_OK;
    GPC_CUDA_DISPATCH(qkv->dtype, E, {
        int per = gpc_pack<E>::n;
        if (C % per != 0 || !gpc_cuda_aligned16(qkv->data) || !gpc_cuda_aligned16(k_cache->data) ||
            !gpc_cuda_aligned16(v_cache->data))
            per = 1;
        unsigned grid = gpc_cuda_blocks(N * (C / per), 256);
        if (grid > (unsigned)gpc_cuda_sm_count() * 32) grid = gpc_cuda_sm_count() * 32;
        kv_store_kernel<E><<<grid, 256, 0, gpc_cuda_stream()>>>(
            (E *)k_cache->data, (E *)v_cache->data, (const E *)qkv->data,
            (const int32_t *)slots->data, N, (int)C, cache_rows, per);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

/* ------------------------------------------------------ paged attention */

#define PAGED_WARPS 4
#define PAGED_THREADS (32 * PAGED_WARPS)
/* keys each group has in flight per iteration: two 16-byte loads of K and
 * two of V a lane before the first is used */
#define PAGED_UNROLL 2
/* fewer (row, head) pairs than this many blocks per SM: split the keys */
#define PAGED_BLOCKS_PER_SM 4
/* and never into splits of fewer keys than this (the combine's reads and
 * each block's fixed costs would outweigh the keys' own loads) */
#define PAGED_MIN_SPLIT_KEYS 256

struct paged_shape {
    int NH, hs, C;
    int block_size, max_blocks, S;
    int64_t num_blocks;
    int keys_per_split;
    float scale_log2; /* 1/sqrt(hs) * log2(e): scores in base 2 */
};

/* PER elements of one lane from p into f32: one 16-byte load when VEC
 * (PER elements are exactly 16 bytes), else PER scalar loads of the
 * elements below hs (d0 is the lane's first dimension). */
template <typename T, int PER, bool VEC>
__device__ __forceinline__ void paged_load(float *x, const T *p, int d0, int hs) {
    if (VEC) {
        gpc_load_f32<PER>(x, p + d0);
    } else {
#pragma unroll
        for (int k = 0; k < PER; k++)
            x[k] = d0 + k < hs ? gpc_to_f32(p[d0 + k]) : 0.0f;
    }
}

/* One block: row i = blockIdx.x / NH, head h = blockIdx.x % NH, keys of
 * split blockIdx.y. With one split the block writes out; otherwise its
 * partial (max, sum) to part_ml and unnormalised output to part_o. */
template <typename T, int LANES, int PER, bool VEC>
__global__ void __launch_bounds__(PAGED_THREADS)
    paged_attention_kernel(T *out, float *part_ml, float *part_o, const T *qkv, const T *k_cache,
                           const T *v_cache, const int32_t *tables, const int32_t *token_seq,
                           const int32_t *token_pos, paged_shape s) {
    const int GROUPS = PAGED_THREADS / LANES;
    __shared__ float sm_m[GROUPS], sm_l[GROUPS];
    __shared__ float sm_o[GROUPS][LANES * PER];
    const int64_t rh = blockIdx.x;
    const int64_t i = rh / s.NH;
    const int h = (int)(rh % s.NH), split = blockIdx.y, splits = gridDim.y;
    const int g = threadIdx.x / LANES, lane = threadIdx.x % LANES, d0 = lane * PER;
    const int seq = token_seq[i], pos = token_pos[i];
    const bool bad = seq < 0 || seq >= s.S || pos < 0;
    const int64_t width = (int64_t)s.max_blocks * s.block_size;
    const int keys = bad ? 0 : (int)min((int64_t)pos + 1, width);
    const int first = split * s.keys_per_split, last = min(keys, first + s.keys_per_split);
    const int32_t *table = tables + (int64_t)(bad ? 0 : seq) * s.max_blocks;
    const int64_t C = s.C;

    float q[PER];
    paged_load<T, PER, VEC>(q, qkv + i * 3 * C + (int64_t)h * s.hs, d0, s.hs);
#pragma unroll
    for (int k = 0; k < PER; k++)
        q[k] *= s.scale_log2;
    float m = -INFINITY, l = 0.0f, acc[PER];
#pragma unroll
    for (int k = 0; k < PER; k++)
        acc[k] = 0.0f;

    /* every group runs the same number of iterations, so the shuffles of a
     * warp always have all its lanes */
    for (int base = first; base < last; base += GROUPS * PAGED_UNROLL) {
        float kf[PAGED_UNROLL][PER], vf[PAGED_UNROLL][PER];
        bool ok[PAGED_UNROLL];
#pragma unroll
        for (int u = 0; u < PAGED_UNROLL; u++) {
            int j = base + u * GROUPS + g;
            ok[u] = j < last;
            int64_t entry = ok[u] ? table[j / s.block_size] : -1;
            ok[u] = entry >= 0 && entry < s.num_blocks;
            if (ok[u]) {
                int64_t slot = entry * s.block_size + j % s.block_size;
                const int64_t at = slot * C + (int64_t)h * s.hs;
                paged_load<T, PER, VEC>(kf[u], k_cache + at, d0, s.hs);
                paged_load<T, PER, VEC>(vf[u], v_cache + at, d0, s.hs);
            } else {
#pragma unroll
                for (int k = 0; k < PER; k++)
                    kf[u][k] = vf[u][k] = 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < PAGED_UNROLL; u++) {
            float dot = 0.0f;
#pragma unroll
            for (int k = 0; k < PER; k++)
                dot += q[k] * kf[u][k];
#pragma unroll
            for (int o = LANES / 2; o > 0; o >>= 1)
                dot += __shfl_xor_sync(0xffffffffu, dot, o);
            if (ok[u]) {
                float mn = fmaxf(m, dot), corr = exp2f(m - mn), p = exp2f(dot - mn);
                l = l * corr + p;
#pragma unroll
                for (int k = 0; k < PER; k++)
                    acc[k] = acc[k] * corr + p * vf[u][k];
                m = mn;
            }
        }
    }

    if (lane == 0) sm_m[g] = m, sm_l[g] = l;
#pragma unroll
    for (int k = 0; k < PER; k++)
        sm_o[g][d0 + k] = acc[k];
    __syncthreads();
    float mx = -INFINITY;
    for (int w = 0; w < GROUPS; w++)
        mx = fmaxf(mx, sm_m[w]);
    /* a group without keys has m = -inf and weighs 0; a block without keys
     * (mx = -inf) weighs nothing at all */
    float total = 0.0f;
    for (int w = 0; w < GROUPS; w++)
        total += sm_m[w] == -INFINITY ? 0.0f : sm_l[w] * exp2f(sm_m[w] - mx);
    if (splits == 1) {
        T *o = out + i * C + (int64_t)h * s.hs;
        for (int d = threadIdx.x; d < s.hs; d += PAGED_THREADS) {
            float sum = 0.0f;
            for (int w = 0; w < GROUPS; w++)
                sum += sm_m[w] == -INFINITY ? 0.0f : sm_o[w][d] * exp2f(sm_m[w] - mx);
            /* no key at all (a bad row): NaN, never a value that looks right */
            o[d] = gpc_from_f32<T>(total > 0.0f ? sum / total : NAN);
        }
    } else {
        int64_t at = rh * splits + split;
        if (threadIdx.x == 0) part_ml[2 * at] = mx, part_ml[2 * at + 1] = total;
        for (int d = threadIdx.x; d < s.hs; d += PAGED_THREADS) {
            float sum = 0.0f;
            for (int w = 0; w < GROUPS; w++)
                sum += sm_m[w] == -INFINITY ? 0.0f : sm_o[w][d] * exp2f(sm_m[w] - mx);
            part_o[at * s.hs + d] = sum;
        }
    }
}

/* The splits of each (row, head) merged: one warp a pair, lanes over the
 * head's dimensions. */
template <typename T>
__global__ void paged_combine_kernel(T *out, const float *part_ml, const float *part_o, int64_t RH,
                                     int NH, int hs, int splits) {
    int64_t rh = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (rh >= RH) return;
    const float *ml = part_ml + 2 * rh * splits;
    float mx = -INFINITY, total = 0.0f;
    for (int p = 0; p < splits; p++)
        mx = fmaxf(mx, ml[2 * p]);
    for (int p = 0; p < splits; p++)
        total += ml[2 * p] == -INFINITY ? 0.0f : ml[2 * p + 1] * exp2f(ml[2 * p] - mx);
    int64_t i = rh / NH, h = rh % NH;
    T *o = out + i * NH * hs + h * hs;
    for (int d = lane; d < hs; d += 32) {
        float sum = 0.0f;
        for (int p = 0; p < splits; p++)
            sum += ml[2 * p] == -INFINITY
                       ? 0.0f
                       : part_o[(rh * splits + p) * hs + d] * exp2f(ml[2 * p] - mx);
        o[d] = gpc_from_f32<T>(total > 0.0f ? sum / total : NAN);
    }
}

/* How many blocks share the keys of one (row, head): one when the rows and
 * heads already fill the GPU, more for a step of few rows, never splits of
 * fewer than PAGED_MIN_SPLIT_KEYS positions of the table. The table's width
 * bounds every row's keys; the host does not know the rows' positions
 * (they are on the device), so a row shorter than the width leaves its last
 * splits empty, and those blocks return at once. */
static int paged_splits(int64_t RH, int64_t width) {
    int64_t want = (int64_t)PAGED_BLOCKS_PER_SM * gpc_cuda_sm_count();
    if (RH >= want) return 1;
    int64_t splits = (want + RH - 1) / RH;
    int64_t most = (width + PAGED_MIN_SPLIT_KEYS - 1) / PAGED_MIN_SPLIT_KEYS;
    if (splits > most) splits = most;
    return splits < 1 ? 1 : (int)splits;
}

template <typename E, int LANES, int PER, bool VEC>
static void
paged_launch(dim3 grid, gpc_tensor *out, float *part_ml, float *part_o, const gpc_tensor *qkv,
             const gpc_tensor *k_cache, const gpc_tensor *v_cache, const gpc_tensor *tables,
             const gpc_tensor *token_seq, const gpc_tensor *token_pos, const paged_shape &s) {
    paged_attention_kernel<E, LANES, PER, VEC><<<grid, PAGED_THREADS, 0, gpc_cuda_stream()>>>(
        (E *)out->data, part_ml, part_o, (const E *)qkv->data, (const E *)k_cache->data,
        (const E *)v_cache->data, (const int32_t *)tables->data, (const int32_t *)token_seq->data,
        (const int32_t *)token_pos->data, s);
}

gpc_status gpc_cuda_paged_attention(gpc_tensor *out, const gpc_tensor *qkv,
                                    const gpc_tensor *k_cache, const gpc_tensor *v_cache,
                                    const gpc_tensor *block_tables, const gpc_tensor *token_seq,
                                    const gpc_tensor *token_pos, int num_heads) {
    const char *op = "paged_attention";
    GPC_TRY(gpc_cuda_same_dtype(op, "out", out, "qkv", qkv));
    GPC_TRY(gpc_cuda_enter(qkv));
    int64_t N = qkv->shape[0], C = qkv->shape[1] / 3, hs = C / num_heads;
    int64_t RH = N * num_heads;
    if (N == 0 || C == 0) return GPC_OK;
    paged_shape s;
    s.NH = num_heads, s.hs = (int)hs, s.C = (int)C;
    s.num_blocks = k_cache->shape[0];
    s.block_size = (int)k_cache->shape[1];
    s.S = (int)block_tables->shape[0];
    s.max_blocks = (int)block_tables->shape[1];
    int64_t width = (int64_t)s.max_blocks * s.block_size;
    if (C > 0x7fffffff / 3 || RH > 0x7fffffff || width > 0x7fffffff ||
        k_cache->shape[1] > 1 << 30 || block_tables->shape[0] > 0x7fffffff ||
        block_tables->shape[1] > 0x7fffffff)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "%s: %lld rows x %d heads, %lld channels or a table of %lld positions "
                         "is more than the GPU kernel indexes",
                         op, (long long)N, num_heads, (long long)C, (long long)width);
    if (width == 0) return gpc_error(GPC_ERR_INVALID_ARG, "%s: block_tables has no blocks", op);
    s.scale_log2 = 1.4426950408889634f / sqrtf((float)hs);
    int splits = paged_splits(RH, width);
    s.keys_per_split = (int)((width + splits - 1) / splits);
    float *part_ml = NULL, *part_o = NULL;
    if (splits > 1) {
        void *scratch;
        size_t parts = (size_t)RH * (size_t)splits;
        GPC_TRY(gpc_cuda_scratch(parts * (size_t)(2 + hs) * sizeof(float), &scratch));
        part_ml = (float *)scratch;
        part_o = part_ml + 2 * parts;
    }
    dim3 grid((unsigned)RH, (unsigned)splits);
    GPC_CUDA_DISPATCH(qkv->dtype, E, {
        const int P = gpc_pack<E>::n;
        int vec = hs % P == 0 && gpc_cuda_aligned16(qkv->data) &&
                  gpc_cuda_aligned16(k_cache->data) && gpc_cuda_aligned16(v_cache->data);
        int lanes = vec ? (int)(hs / P) : 0;
        if (lanes == 8)
            paged_launch<E, 8, P, true>(grid, out, part_ml, part_o, qkv, k_cache, v_cache,
                                        block_tables, token_seq, token_pos, s);
        else if (lanes == 16)
            paged_launch<E, 16, P, true>(grid, out, part_ml, part_o, qkv, k_cache, v_cache,
                                         block_tables, token_seq, token_pos, s);
        else if (lanes == 32)
            paged_launch<E, 32, P, true>(grid, out, part_ml, part_o, qkv, k_cache, v_cache,
                                         block_tables, token_seq, token_pos, s);
        else if (hs <= 128)
            /* any other head size: a warp a key, four scalar loads a lane */
            paged_launch<E, 32, 4, false>(grid, out, part_ml, part_o, qkv, k_cache, v_cache,
                                          block_tables, token_seq, token_pos, s);
        else
            return gpc_error(GPC_ERR_UNSUPPORTED,
                             "%s: head size %lld on the GPU needs to be at most 128, or 16 bytes "
                             "times 8, 16 or 32",
                             op, (long long)hs);
        GPC_CUDA_CHECK_LAUNCH();
        if (splits > 1) {
            paged_combine_kernel<E><<<gpc_cuda_blocks(RH * 32, 128), 128, 0, gpc_cuda_stream()>>>(
                (E *)out->data, part_ml, part_o, RH, num_heads, (int)hs, splits);
        }
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}
