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
 * blocks (flash-decoding; GPC_PAGED_SPLIT_KEYS keys a block at least):
 * each writes its partial max, sum and output, and the last block of the
 * (row, head) to finish merges them (paged_finish; GPC_PAGED_COMBINE=kernel:
 * a second kernel does). On Hopper the kernels start as programmatic
 * dependents of the kernel before them (GPC_PAGED_PDL, as embedding_at
 * and sample.cu's kernels); v1 reads the rows' tables before it waits for
 * that kernel and asks L2 for its keys (GPC_PAGED_EARLY). Prefill rows are
 * rows like any other: each reads its own prefix of the sequence (through
 * L2 for the shared part).
 * That is kernel v1; GPC_PAGED_KERNEL=v2 or v3 picks the kernels described
 * before paged_attention_v2_kernel (a block a row and group of heads,
 * cp.async copies in flight), with the same guarantees, where they take
 * the shape.
 */
#include "cuda/cuda_common.cuh"
#include "cuda/paged.h"

#include <math.h>
#include <pthread.h>

/* ------------------------------------------------------------ embedding */

template <typename T>
__global__ void embedding_at_kernel(T *out, const int32_t *tokens, const int32_t *positions,
                                    const T *wte, const T *wpe, int64_t N, int C, int V, int maxT,
                                    int per) {
    gpc_pdl_wait_previous(); /* GPC_PAGED_PDL: the tokens come from feed_tokens */
    gpc_pdl_let_next_start();
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
        gpc_cuda_start(gpc_cuda_serving_pdl(), embedding_at_kernel<E>, dim3(grid), 256,
                       (E *)out->data, (const int32_t *)tokens->data,
                       (const int32_t *)positions->data, (const E *)wte->data, (const E *)wpe->data,
                       N, (int)C, (int)V, (int)maxT, per);
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
#define PAGED_MIN_SPLIT_KEYS 64

struct paged_shape {
    int NH, hs, C;
    int block_size, max_blocks, S;
    int64_t num_blocks;
    int keys_per_split;
    /* per unit, how many of its splits have written their parts: the last
     * merges them and sets it back to 0 (paged_finish); NULL: the combine
     * kernel merges them */
    int *done;
    int block_shift;  /* log2(block_size) when it is a power of two, else -1 */
    float scale_log2; /* 1/sqrt(hs) * log2(e): scores in base 2 */
    int early;        /* v1 reads the tables before the wait (GPC_PAGED_EARLY) */
};

/* Asks L2 for the line at p (a hint: no data comes back, nothing faults). */
__device__ __forceinline__ void paged_prefetch_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

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

/* A lane's start on one row-head: its PER elements of the query (0 for a
 * lane without a head) scaled by scale_log2, so that the scores come out
 * in log2 units for exp2, and its output accumulator zeroed. */
template <typename T, int PER, bool VEC>
__device__ __forceinline__ void paged_query(float (&q)[PER], float (&acc)[PER], const T *head,
                                            int d0, int hs, bool head_ok, float scale_log2) {
    if (head_ok) {
        paged_load<T, PER, VEC>(q, head, d0, hs);
    } else {
#pragma unroll
        for (int k = 0; k < PER; k++)
            q[k] = 0.0f;
    }
#pragma unroll
    for (int k = 0; k < PER; k++)
        q[k] *= scale_log2;
#pragma unroll
    for (int k = 0; k < PER; k++)
        acc[k] = 0.0f;
}

/* Element d of row-head rh's output from its splits' parts: their
 * outputs weighted by exp2(max - the largest max), over the sum of their
 * sums weighted the same; a split without keys (max -inf) weighs 0, a row
 * without any gets NaN. Read past L1: in the fused merge the parts come
 * from other blocks of the same kernel. */
__device__ __forceinline__ float paged_merge(const float *part_ml, const float *part_o, int64_t rh,
                                             int d, int hs, int splits) {
    const float *ml = part_ml + 2 * rh * splits;
    float mx = -INFINITY, total = 0.0f, sum = 0.0f;
    for (int p = 0; p < splits; p++)
        mx = fmaxf(mx, __ldcg(ml + 2 * p));
    for (int p = 0; p < splits; p++) {
        const float mp = __ldcg(ml + 2 * p);
        if (mp == -INFINITY) continue;
        const float f = exp2f(mp - mx);
        total += __ldcg(ml + 2 * p + 1) * f;
        sum += __ldcg(part_o + (rh * splits + p) * hs + d) * f;
    }
    return total > 0.0f ? sum / total : NAN;
}

/* After a block of a split step has written its parts (those of unit
 * `unit`: row i's heads h0 .. h1 - 1): with s.done, the unit's last block
 * to get here merges all splits' parts into out, so no combine kernel
 * runs. Each block's parts are visible device-wide (__threadfence) before
 * it counts itself; the last one sees every count, so every part. */
template <typename T>
__device__ __forceinline__ void paged_finish(T *out, const float *part_ml, const float *part_o,
                                             const paged_shape &s, int64_t unit, int64_t i, int h0,
                                             int h1) {
    const int splits = gridDim.y;
    __threadfence();
    __syncthreads();
    int last = 0; /* told to the block by __syncthreads_or: v3 has no shared memory left */
    if (threadIdx.x == 0) {
        __threadfence(); /* the block's writes, seen through the barrier, before the count */
        last = atomicAdd(s.done + unit, 1) == splits - 1;
        if (last) s.done[unit] = 0; /* for the next call: no other block of it counts now */
    }
    if (!__syncthreads_or(last)) return;
    __threadfence();
    const int n = (h1 - h0) * s.hs;
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        const int h = h0 + e / s.hs, d = e % s.hs;
        const float v = paged_merge(part_ml, part_o, i * s.NH + h, d, s.hs, splits);
        out[i * s.C + (int64_t)h * s.hs + d] = gpc_from_f32<T>(v);
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
    /* launched as a programmatic dependent (GPC_PAGED_PDL): q and this
     * step's keys and values the kernel before wrote, so they are read
     * after the wait. The rows' sequences, positions and tables were
     * uploaded before the step's first kernel and earlier steps wrote the
     * other keys: with s.early they are read before it (past L1), and the
     * block's keys and values asked into L2, while that kernel runs. */
    if (!s.early) {
        gpc_pdl_wait_previous();
        gpc_pdl_let_next_start();
    }
    const int64_t rh = blockIdx.x;
    const int64_t i = rh / s.NH;
    const int h = (int)(rh % s.NH), split = blockIdx.y, splits = gridDim.y;
    const int g = threadIdx.x / LANES, lane = threadIdx.x % LANES, d0 = lane * PER;
    const int seq = __ldcg(token_seq + i), pos = __ldcg(token_pos + i);
    const bool bad = seq < 0 || seq >= s.S || pos < 0;
    const int64_t width = (int64_t)s.max_blocks * s.block_size;
    const int keys = bad ? 0 : (int)min((int64_t)pos + 1, width);
    const int first = split * s.keys_per_split, last = min(keys, first + s.keys_per_split);
    const int32_t *table = tables + (int64_t)(bad ? 0 : seq) * s.max_blocks;
    const int64_t C = s.C;
    /* the block entry of key j (-1 past the split), read one iteration
     * ahead of the key's loads: a lookup never waits in front of them */
    auto entry_of = [&](int j) -> int64_t {
        return j < last ? __ldcg(table + j / s.block_size) : -1;
    };
    int64_t next[PAGED_UNROLL];
#pragma unroll
    for (int u = 0; u < PAGED_UNROLL; u++)
        next[u] = entry_of(first + u * GROUPS + g);
    if (s.early) {
        const int es = (int)sizeof(T), line = 128 / es; /* elements a line */
        for (int j = first + (int)threadIdx.x; j < last; j += PAGED_THREADS) {
            const int64_t entry = __ldcg(table + j / s.block_size);
            if (entry < 0 || entry >= s.num_blocks) continue;
            const int64_t at = (entry * s.block_size + j % s.block_size) * C + (int64_t)h * s.hs;
            for (int d = 0; d < s.hs; d += line) {
                paged_prefetch_l2(k_cache + at + d);
                paged_prefetch_l2(v_cache + at + d);
            }
        }
        gpc_pdl_wait_previous();
        gpc_pdl_let_next_start();
    }

    float q[PER], acc[PER];
    paged_query<T, PER, VEC>(q, acc, qkv + i * 3 * C + (int64_t)h * s.hs, d0, s.hs, true,
                             s.scale_log2);
    float m = -INFINITY, l = 0.0f;

    /* every group runs the same number of iterations, so the shuffles of a
     * warp always have all its lanes */
    for (int base = first; base < last; base += GROUPS * PAGED_UNROLL) {
        float kf[PAGED_UNROLL][PER], vf[PAGED_UNROLL][PER];
        bool ok[PAGED_UNROLL];
#pragma unroll
        for (int u = 0; u < PAGED_UNROLL; u++) {
            int j = base + u * GROUPS + g;
            int64_t entry = next[u];
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
        for (int u = 0; u < PAGED_UNROLL; u++)
            next[u] = entry_of(base + GROUPS * PAGED_UNROLL + u * GROUPS + g);
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
        if (s.done) paged_finish<T>(out, part_ml, part_o, s, rh, i, h, h + 1);
    }
}

/* ------------------------------------------- paged attention, kernel v2 */

/* Kernels v2 and v3 (GPC_PAGED_KERNEL=v2, v3): one block of HW x WK warps
 * works on one row, HW groups of HG = 32 / LANES heads and one split of
 * its keys. Lane l of a warp holds 16 bytes of its group's heads' rows
 * (head l / LANES, its dimensions from (l % LANES) * PER), so a warp reads
 * one key's rows of HG heads, 512 contiguous bytes of the slot row, as one
 * 16-byte load a lane; the HW warps of one key read HW x 512 contiguous
 * bytes. Keys go to the WK warps of a group in turn (key j of a stage to
 * warp j % WK), PAGED2_KPW keys a warp per stage. v2 is HW 1, WK 4 (a block
 * per row and four heads of 64 in bf16: 768 blocks at 256 rows); v3 is HW
 * 3, WK 2 (a block per row and twelve heads: the whole slot row of GPT-2
 * read together; 256 rows in two splits, 512 blocks).
 *
 * The loads are cp.async copies into shared memory, PAGED2_STAGES stages in
 * flight: while a warp works on one stage the next ones' keys and values
 * are on their way, without holding registers. Each thread reads back only
 * the 16-byte pieces it copied itself, so the loop needs no barrier. The
 * table entries of a stage are read one stage before its copies are
 * issued, so a table lookup never waits in front of a copy. A warp's KPW
 * scores are computed together, then one rescale of the online softmax for
 * all of them. Bad table entries give zero-size copies and weigh 0, as in
 * v1; lanes of heads past the last (NH not a multiple of HG) copy nothing
 * and write nothing. */
#define PAGED2_HW 1 /* v2: warps across head groups, */
#define PAGED2_WK 4 /* and across keys */
#define PAGED3_HW 3 /* v3 */
#define PAGED3_WK 2
/* v3 splits the keys while there are fewer units (rows x blocks a row)
 * than this many an SM: four v3 blocks fit an SM (48 KiB each), and a
 * block's copies in flight are its ring's, so 256 rows of GPT-2 run as
 * 512 blocks of half the keys, as many copies in flight as v2's */
#define PAGED3_UNITS_PER_SM 2
#define PAGED2_KPW 2
#define PAGED2_STAGES 4
/* v2's splits: fewer keys each than v1's (its blocks start their copies
 * at once and keep them in flight) */
#define PAGED2_MIN_SPLIT_KEYS 32

template <typename T, int LANES, int HW, int WK>
__global__ void __launch_bounds__(32 * HW * WK)
    paged_attention_v2_kernel(T *out, float *part_ml, float *part_o, const T *qkv, const T *k_cache,
                              const T *v_cache, const int32_t *tables, const int32_t *token_seq,
                              const int32_t *token_pos, paged_shape s) {
    constexpr int PER = 16 / (int)sizeof(T), HG = 32 / LANES, KPW = PAGED2_KPW;
    constexpr int STAGES = PAGED2_STAGES, KEYS = WK * KPW; /* keys a stage */
    constexpr int THREADS = 32 * HW * WK;
    /* [stage][key of the warp][K, V][thread]: a warp's 16-byte pieces are
     * contiguous, so its copies and reads have no bank conflicts */
    __shared__ uint4 ring[STAGES * KPW * 2][THREADS];
    gpc_pdl_wait_previous(); /* as in v1 */
    gpc_pdl_let_next_start();
    const int per_row = (s.NH + HG * HW - 1) / (HG * HW); /* blocks a row */
    const int64_t i = blockIdx.x / per_row;
    const int bg = (int)(blockIdx.x % per_row), split = blockIdx.y, splits = gridDim.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int hw = warp % HW, wk = warp / HW, hg = bg * HW + hw;
    const int h = hg * HG + lane / LANES, d0 = (lane % LANES) * PER;
    const bool head_ok = h < s.NH;
    const int seq = token_seq[i], pos = token_pos[i];
    const bool bad = seq < 0 || seq >= s.S || pos < 0;
    const int64_t width = (int64_t)s.max_blocks * s.block_size;
    const int keys = bad ? 0 : (int)min((int64_t)pos + 1, width);
    const int first = split * s.keys_per_split, last = min(keys, first + s.keys_per_split);
    const int32_t *table = tables + (int64_t)(bad ? 0 : seq) * s.max_blocks;
    /* the head's first element in a row of qkv or the caches; the lane's */
    const int64_t C = s.C, head_at = (int64_t)(head_ok ? h : 0) * s.hs, hoff = head_at + d0;
    const int iters = last > first ? (last - first + KEYS - 1) / KEYS : 0;

    /* the block entry of key u of this warp in stage it (-1: none) */
    auto entry_of = [&](int it, int u) -> int32_t {
        int j = first + it * KEYS + u * WK + wk;
        if (j >= last) return -1;
        return table[s.block_shift >= 0 ? j >> s.block_shift : j / s.block_size];
    };
    /* stage it's copies into ring slot st; the keys that have one in okb */
    unsigned okb = 0;
    auto issue = [&](int it, int st, const int32_t *ent) {
#pragma unroll
        for (int u = 0; u < KPW; u++) {
            int j = first + it * KEYS + u * WK + wk;
            int64_t e = ent[u];
            bool ok = e >= 0 && e < s.num_blocks;
            const T *kp = k_cache, *vp = v_cache;
            if (ok) {
                int in_block = s.block_shift >= 0 ? j & (s.block_size - 1) : j % s.block_size;
                int64_t at = (e * s.block_size + in_block) * C + hoff;
                kp += at, vp += at;
            }
            gpc_cp_async16(&ring[(st * KPW + u) * 2][threadIdx.x], kp, ok && head_ok);
            gpc_cp_async16(&ring[(st * KPW + u) * 2 + 1][threadIdx.x], vp, ok && head_ok);
            unsigned bit = 1u << (st * KPW + u);
            okb = ok ? okb | bit : okb & ~bit;
        }
    };

    /* the first STAGES - 1 stages: their table entries all read first */
    int32_t ent[STAGES][KPW];
#pragma unroll
    for (int st = 0; st < STAGES; st++)
#pragma unroll
        for (int u = 0; u < KPW; u++)
            ent[st][u] = entry_of(st, u);
#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {
        issue(st, st, ent[st]);
        gpc_cp_async_commit();
    }
    int32_t next[KPW];
#pragma unroll
    for (int u = 0; u < KPW; u++)
        next[u] = ent[STAGES - 1][u];

    float q[PER], acc[PER];
    paged_query<T, PER, true>(q, acc, qkv + i * 3 * C + head_at, d0, s.hs, head_ok, s.scale_log2);
    float m = -INFINITY, l = 0.0f;

    for (int it = 0; it < iters; it++) {
        issue(it + STAGES - 1, (it + STAGES - 1) % STAGES, next);
        gpc_cp_async_commit();
#pragma unroll
        for (int u = 0; u < KPW; u++)
            next[u] = entry_of(it + STAGES, u);
        gpc_cp_async_wait<STAGES - 1>();
        const int st = it % STAGES;
        const unsigned ok = (okb >> (st * KPW)) & ((1u << KPW) - 1);
        if (ok == 0) continue; /* the same for the whole warp */
        float sc[KPW];
#pragma unroll
        for (int u = 0; u < KPW; u++) {
            float kf[PER];
            gpc_load_f32<PER>(kf, (const T *)&ring[(st * KPW + u) * 2][threadIdx.x]);
            float dot = 0.0f;
#pragma unroll
            for (int k = 0; k < PER; k++)
                dot += q[k] * kf[k];
            sc[u] = dot;
        }
#pragma unroll
        for (int o = LANES / 2; o > 0; o >>= 1)
#pragma unroll
            for (int u = 0; u < KPW; u++)
                sc[u] += __shfl_xor_sync(0xffffffffu, sc[u], o);
        float mn = m;
#pragma unroll
        for (int u = 0; u < KPW; u++)
            if (ok >> u & 1) mn = fmaxf(mn, sc[u]);
        const float corr = exp2f(m - mn);
        l *= corr;
#pragma unroll
        for (int k = 0; k < PER; k++)
            acc[k] *= corr;
#pragma unroll
        for (int u = 0; u < KPW; u++) {
            if (!(ok >> u & 1)) continue;
            float vf[PER];
            gpc_load_f32<PER>(vf, (const T *)&ring[(st * KPW + u) * 2 + 1][threadIdx.x]);
            const float p = exp2f(sc[u] - mn);
            l += p;
#pragma unroll
            for (int k = 0; k < PER; k++)
                acc[k] += p * vf[k];
        }
        m = mn;
    }
    gpc_cp_async_wait<0>();
    __syncthreads();

    /* the warps' softmaxes merged, in the ring's memory */
    float *sm_m = (float *)&ring[0][0], *sm_l = sm_m + THREADS;
    float *sm_o = sm_l + THREADS; /* [warp][lane * PER + k] */
    sm_m[threadIdx.x] = m, sm_l[threadIdx.x] = l;
#pragma unroll
    for (int k = 0; k < PER; k++)
        sm_o[warp * 32 * PER + lane * PER + k] = acc[k];
    __syncthreads();
    /* element e of head group x's heads: lane e / PER's dimension e % hs,
     * merged over the WK warps of the group (warps x, x + HW, ...) */
    for (int xe = threadIdx.x; xe < HW * 32 * PER; xe += THREADS) {
        const int x = xe / (32 * PER), e = xe % (32 * PER), ln = e / PER;
        const int hh = (bg * HW + x) * HG + ln / LANES, d = e % s.hs;
        if (hh >= s.NH) continue;
        float mx = -INFINITY;
#pragma unroll
        for (int w = x; w < HW * WK; w += HW)
            mx = fmaxf(mx, sm_m[w * 32 + ln]);
        float total = 0.0f, sum = 0.0f;
#pragma unroll
        for (int w = x; w < HW * WK; w += HW) {
            const float mw = sm_m[w * 32 + ln];
            const float f = mw == -INFINITY ? 0.0f : exp2f(mw - mx);
            total += sm_l[w * 32 + ln] * f;
            sum += sm_o[w * 32 * PER + e] * f;
        }
        if (splits == 1) {
            out[i * C + (int64_t)hh * s.hs + d] = gpc_from_f32<T>(total > 0.0f ? sum / total : NAN);
        } else {
            const int64_t at = (i * s.NH + hh) * splits + split;
            if (d == 0) part_ml[2 * at] = mx, part_ml[2 * at + 1] = total;
            part_o[at * s.hs + d] = sum;
        }
    }
    if (splits > 1 && s.done) {
        const int h0 = bg * HW * HG;
        paged_finish<T>(out, part_ml, part_o, s, blockIdx.x, i, h0, min(s.NH, h0 + HW * HG));
    }
}

/* The splits of each (row, head) merged: one warp a pair, lanes over the
 * head's dimensions. */
template <typename T>
__global__ void paged_combine_kernel(T *out, const float *part_ml, const float *part_o, int64_t RH,
                                     int NH, int hs, int splits) {
    gpc_pdl_wait_previous();
    gpc_pdl_let_next_start();
    int64_t rh = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (rh >= RH) return;
    int64_t i = rh / NH, h = rh % NH;
    T *o = out + i * NH * hs + h * hs;
    for (int d = lane; d < hs; d += 32)
        o[d] = gpc_from_f32<T>(paged_merge(part_ml, part_o, rh, d, hs, splits));
}

/* How many blocks share the keys of one unit (a (row, head) in v1, a
 * (row, heads of a block) in v2 and v3): one when there are per_sm units
 * an SM, more for a step of few rows, never splits of fewer than min_keys
 * positions of the table. The table's width
 * bounds every row's keys; the host does not know the rows' positions
 * (they are on the device), so a row shorter than the width leaves its last
 * splits empty, and those blocks return at once. */
static int paged_splits(int64_t units, int64_t width, int min_keys, int per_sm) {
    int64_t want = (int64_t)per_sm * gpc_cuda_sm_count();
    if (units >= want) return 1;
    int64_t splits = (want + units - 1) / units;
    int64_t most = (width + min_keys - 1) / min_keys;
    if (splits > most) splits = most;
    return splits < 1 ? 1 : (int)splits;
}

template <typename E, int LANES, int PER, bool VEC>
static void
paged_launch(dim3 grid, gpc_tensor *out, float *part_ml, float *part_o, const gpc_tensor *qkv,
             const gpc_tensor *k_cache, const gpc_tensor *v_cache, const gpc_tensor *tables,
             const gpc_tensor *token_seq, const gpc_tensor *token_pos, const paged_shape &s) {
    gpc_cuda_start(gpc_cuda_serving_pdl(), paged_attention_kernel<E, LANES, PER, VEC>, grid,
                   PAGED_THREADS, (E *)out->data, part_ml, part_o, (const E *)qkv->data,
                   (const E *)k_cache->data, (const E *)v_cache->data,
                   (const int32_t *)tables->data, (const int32_t *)token_seq->data,
                   (const int32_t *)token_pos->data, s);
}

/* v2 (HW, WK = PAGED2_*) or v3 (PAGED3_*) for a head of `lanes` 16-byte
 * pieces: 8, 16 or 32 */
template <typename E, int HW, int WK>
static void paged_launch_v2(int lanes, dim3 grid, gpc_tensor *out, float *part_ml, float *part_o,
                            const gpc_tensor *qkv, const gpc_tensor *k_cache,
                            const gpc_tensor *v_cache, const gpc_tensor *tables,
                            const gpc_tensor *token_seq, const gpc_tensor *token_pos,
                            const paged_shape &s) {
    void (*fn)(E *, float *, float *, const E *, const E *, const E *, const int32_t *,
               const int32_t *, const int32_t *, paged_shape) =
        lanes == 8    ? paged_attention_v2_kernel<E, 8, HW, WK>
        : lanes == 16 ? paged_attention_v2_kernel<E, 16, HW, WK>
                      : paged_attention_v2_kernel<E, 32, HW, WK>;
    gpc_cuda_start(gpc_cuda_serving_pdl(), fn, grid, 32 * HW * WK, (E *)out->data, part_ml, part_o,
                   (const E *)qkv->data, (const E *)k_cache->data, (const E *)v_cache->data,
                   (const int32_t *)tables->data, (const int32_t *)token_seq->data,
                   (const int32_t *)token_pos->data, s);
}

/* Whether split steps merge their parts in the last block of each unit
 * (GPC_PAGED_COMBINE=fused, the default) or in the combine kernel; read
 * once, an unknown value said and taken as fused. */
static int paged_fused_combine(void) {
    static int fused = -1;
    if (fused < 0) {
        const char *e = gpc_setting_str("GPC_PAGED_COMBINE");
        fused = !(e && !strcmp(e, "kernel"));
        if (e && *e && strcmp(e, "kernel") && strcmp(e, "fused"))
            gpc_log(GPC_LOG_WARN, "GPC_PAGED_COMBINE=%s is not fused or kernel: using fused", e);
    }
    return fused;
}

/* v1's fewest keys a split (GPC_PAGED_SPLIT_KEYS, read once). */
static int paged_split_keys(void) {
    static int keys = 0;
    if (!keys) {
        long k = gpc_setting_int("GPC_PAGED_SPLIT_KEYS");
        keys = k >= 1 && k <= (1 << 20) ? (int)k : PAGED_MIN_SPLIT_KEYS;
    }
    return keys;
}

/* The fused merge's counters on the current GPU: PAGED_BLOCKS_PER_SM x
 * SMs of them, as many units as a split step can have (it splits only
 * with fewer), zeroed once; every call leaves them at 0 again. NULL (the
 * combine kernel runs) while a graph is captured before a first split
 * step allocated them, or when they cannot be allocated. Never freed, so
 * graphs holding their address stay valid. Like the scratch buffer they
 * serve one stream of ops a GPU at a time. */
static int *paged_counters(int64_t units) {
    static int *counters[GPC_CUDA_MAX_DEVICES];
    static int64_t count[GPC_CUDA_MAX_DEVICES];
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    int d = 0;
    if (cudaGetDevice(&d) != cudaSuccess || d < 0 || d >= GPC_CUDA_MAX_DEVICES) {
        cudaGetLastError();
        return NULL;
    }
    pthread_mutex_lock(&lock);
    if (!counters[d] && !gpc_cuda_capturing()) {
        int64_t n = (int64_t)PAGED_BLOCKS_PER_SM * gpc_cuda_sm_count();
        int *c = NULL;
        if (cudaMalloc((void **)&c, (size_t)n * sizeof(int)) == cudaSuccess &&
            cudaMemsetAsync(c, 0, (size_t)n * sizeof(int), gpc_cuda_stream()) == cudaSuccess) {
            counters[d] = c, count[d] = n;
        } else {
            cudaGetLastError();
            if (c) cudaFree(c);
        }
    }
    int *c = units <= count[d] ? counters[d] : NULL;
    pthread_mutex_unlock(&lock);
    return c;
}

/* GPC_PAGED_KERNEL=auto (the default): v2 for steps of at least
 * PAGED_AUTO_V2_ROWS rows, v1 for fewer. On an H200 (bench_paged_attention
 * _bench, GPT-2 124M's 12 heads of 64, bf16) v2 read 2,962-4,208 GB/s at
 * 256 rows against v1's 2,097-2,848, and won at 64 rows from context 256
 * up; v1 was faster at 1 and 16 rows, where both are bound by latency. */
#define PAGED_KERNEL_AUTO 4
#define PAGED_AUTO_V2_ROWS 64

/* The kernel GPC_PAGED_KERNEL names (1, 2 or 3; auto: PAGED_KERNEL_AUTO),
 * read at the first call, or the one gpc_cuda_paged_set_kernel set; an
 * unknown name is said once and auto's kernel runs. */
static int paged_kernel_set = -1;
static long paged_calls[4]; /* by the kernel that ran */
static long split_calls[3]; /* unsplit, merged by the combine kernel, by the last blocks */

static int paged_kernel_setting(void) {
    const char *e = gpc_setting_str("GPC_PAGED_KERNEL");
    if (!e || !*e || !strcmp(e, "auto")) return PAGED_KERNEL_AUTO;
    if (!strcmp(e, "v1")) return 1;
    if (!strcmp(e, "v2")) return 2;
    if (!strcmp(e, "v3")) return 3;
    gpc_log(GPC_LOG_WARN, "GPC_PAGED_KERNEL=%s is not auto, v1, v2 or v3: using auto", e);
    return PAGED_KERNEL_AUTO;
}

static int paged_kernel(void) {
    int k = __atomic_load_n(&paged_kernel_set, __ATOMIC_RELAXED);
    if (k <= 0) {
        k = paged_kernel_setting();
        __atomic_store_n(&paged_kernel_set, k, __ATOMIC_RELAXED);
    }
    return k;
}

extern "C" int gpc_cuda_paged_set_kernel(int kernel) {
    int before = __atomic_exchange_n(&paged_kernel_set, kernel >= 1 && kernel <= 3 ? kernel : -1,
                                     __ATOMIC_RELAXED);
    return before > 0 ? before : paged_kernel_setting();
}

extern "C" long gpc_cuda_paged_split_calls(int how) {
    return how >= 0 && how <= 2 ? __atomic_load_n(&split_calls[how], __ATOMIC_RELAXED) : 0;
}

extern "C" long gpc_cuda_paged_calls(int kernel) {
    return kernel >= 1 && kernel <= 3 ? __atomic_load_n(&paged_calls[kernel], __ATOMIC_RELAXED) : 0;
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
    static int early = -1;
    s.early = gpc_cuda_setting_flag("GPC_PAGED_EARLY", &early);
    s.block_shift = -1;
    for (int b = 0; b < 31; b++)
        if (s.block_size == 1 << b) s.block_shift = b;
    const size_t es = gpc_dtype_size(qkv->dtype);
    const int vec = es > 0 && hs % (int64_t)(16 / es) == 0 && gpc_cuda_aligned16(qkv->data) &&
                    gpc_cuda_aligned16(k_cache->data) && gpc_cuda_aligned16(v_cache->data);
    const int lanes = vec ? (int)(hs / (int64_t)(16 / es)) : 0;
    /* v2 and v3 take the head sizes of 8, 16 or 32 16-byte pieces (and
     * tables a few stages short of 2^31 positions: their key indices run
     * past the last key by that much); v1 the rest */
    int kernel = paged_kernel();
    if (kernel == PAGED_KERNEL_AUTO) kernel = N >= PAGED_AUTO_V2_ROWS ? 2 : 1;
    if (kernel > 1 && !((lanes == 8 || lanes == 16 || lanes == 32) && width <= 0x7fffffff - 4096))
        kernel = 1;
    /* units: v1's (row, head) pairs, v2's and v3's (row, heads of a block) */
    const int64_t heads_a_block = kernel == 1   ? 1
                                  : kernel == 2 ? 32 / lanes * PAGED2_HW
                                                : 32 / lanes * PAGED3_HW;
    const int64_t units = N * ((num_heads + heads_a_block - 1) / heads_a_block);
    int splits = kernel == 1 ? paged_splits(units, width, paged_split_keys(), PAGED_BLOCKS_PER_SM)
                 : kernel == 2
                     ? paged_splits(units, width, PAGED2_MIN_SPLIT_KEYS, PAGED_BLOCKS_PER_SM)
                     : paged_splits(units, width, PAGED2_MIN_SPLIT_KEYS, PAGED3_UNITS_PER_SM);
    s.keys_per_split = (int)((width + splits - 1) / splits);
    float *part_ml = NULL, *part_o = NULL;
    if (splits > 1) {
        void *scratch;
        size_t parts = (size_t)RH * (size_t)splits;
        GPC_TRY(gpc_cuda_scratch(parts * (size_t)(2 + hs) * sizeof(float), &scratch));
        part_ml = (float *)scratch;
        part_o = part_ml + 2 * parts;
    }
    s.done = splits > 1 && paged_fused_combine() ? paged_counters(units) : NULL;
    dim3 grid((unsigned)units, (unsigned)splits);
    GPC_CUDA_DISPATCH(qkv->dtype, E, {
        const int P = gpc_pack<E>::n;
        if (kernel == 2)
            paged_launch_v2<E, PAGED2_HW, PAGED2_WK>(lanes, grid, out, part_ml, part_o, qkv,
                                                     k_cache, v_cache, block_tables, token_seq,
                                                     token_pos, s);
        else if (kernel == 3)
            paged_launch_v2<E, PAGED3_HW, PAGED3_WK>(lanes, grid, out, part_ml, part_o, qkv,
                                                     k_cache, v_cache, block_tables, token_seq,
                                                     token_pos, s);
        else if (lanes == 8)
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
        __atomic_fetch_add(&paged_calls[kernel], 1, __ATOMIC_RELAXED);
        if (splits > 1 && !s.done)
            gpc_cuda_start(gpc_cuda_serving_pdl(), paged_combine_kernel<E>,
                           dim3(gpc_cuda_blocks(RH * 32, 128)), 128, (E *)out->data,
                           (const float *)part_ml, (const float *)part_o, RH, num_heads, (int)hs,
                           splits);
        __atomic_fetch_add(&split_calls[splits > 1 ? s.done ? 2 : 1 : 0], 1, __ATOMIC_RELAXED);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}
