/*
 * attention.cu: causal multi-head self-attention, forward and backward, as
 * flash attention (Dao 2023, FlashAttention-2): Q, K and V tiles in shared
 * memory, scores and probabilities only in registers, an online softmax, and
 * the log-sum-exp of each row saved so the backward pass can rebuild the
 * probabilities. No T x T matrix ever reaches device memory.
 *
 * The fast path (bf16 or f16, head size 64) runs on tensor cores through
 * mma.sync m16n8k16 with f32 accumulation. A block of 4 warps owns a tile of
 * 64 rows, 16 per warp. The accumulator layout of one product is the operand
 * layout of the next (FA2's register reuse), so the probabilities P feed
 * P.V without leaving registers. Tiles are fetched with cp.async two deep, so
 * the next tile's load overlaps this tile's arithmetic. Shared-memory rows are
 * padded from 64 to 72 elements, shifting each row by 16 bytes, so the eight
 * row addresses of an ldmatrix fall in distinct banks.
 *
 *   forward        grid (query tiles, B*NH), heaviest (last) tiles first:
 *                  for key tiles j <= i: S = Q K^T, online softmax, O += P V.
 *   backward, dq   grid (query tiles, B*NH): S and dP = dO V^T rebuilt,
 *                  dS = P (dP - D), dQ += dS K.
 *   backward, dkdv grid (key tiles, B*NH): for query tiles i >= j:
 *                  S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q.
 * with D = rowsum(dO * O) from a small kernel first. Splitting dq from dk/dv
 * recomputes two of the five products but needs no atomics: every output
 * element is written by one thread, so the gradients are the same bits on
 * every run. GPC_ATTENTION_BWD=fused runs FA2's one-kernel backward instead:
 * the dk/dv loop also adds dS K into an f32 dq buffer with atomics (five
 * products rather than seven; dq then differs in its last bits run to run).
 * GPC_ATTENTION_BWD=wgmma is a one-kernel backward on Hopper's wgmma
 * (attention_sm90.cu: bf16, T a multiple of 128, compute capability 9.0;
 * elsewhere the mma.sync one) that adds each key block's dQ in bf16
 * straight into dqkv; under the auto path it replaces cuDNN's backward by
 * default where it serves.
 *
 * Any other head size or f32 runs a simple kernel, one warp per row (exact
 * and slow: it exists for tests and unusual shapes, not for training).
 *
 * Scores are scaled by 1/sqrt(hs) and handled in base 2 inside the kernels
 * (exp2 is one instruction); lse is stored in natural log, as the CPU does.
 *
 * The entry points at the end also choose the path (gpc_attention_path):
 * these kernels, or cuDNN's fused flash attention (attention_cudnn.cu),
 * which computes the same lse, so a forward of one and a backward of the
 * other agree.
 */
#include "cuda/attention_cudnn.h"
#include "cuda/attention_sm90.h"
#include "cuda/cuda_common.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ATT_HS 64
#define ATT_TILE 64
#define ATT_THREADS 128
#define ATT_PAD 72
#define ATT_LOG2E 1.4426950408889634f
#define ATT_LN2 0.6931471805599453f
#define ATT_NAIVE_MAX_HS 128

/* --------------------------------------------------------- PTX wrappers */

__device__ __forceinline__ uint32_t att_smem(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void att_ldsm_x4(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3,
                                            const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(att_smem(p)));
}

__device__ __forceinline__ void att_ldsm_x4_t(uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                              uint32_t &r3, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(att_smem(p)));
}

template <typename T>
__device__ __forceinline__ void att_mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void att_mma<gpc_bf16_t>(float *c, const uint32_t *a, uint32_t b0,
                                                    uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void att_mma<gpc_f16_t>(float *c, const uint32_t *a, uint32_t b0,
                                                   uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two f32 into one register of two 16-bit values, the lower column first. */
template <typename T> __device__ __forceinline__ uint32_t att_pack(float lo, float hi);
template <> __device__ __forceinline__ uint32_t att_pack<gpc_bf16_t>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}
template <> __device__ __forceinline__ uint32_t att_pack<gpc_f16_t>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&v;
}

__device__ __forceinline__ void att_cp_async16(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(att_smem(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void att_cp_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> __device__ __forceinline__ void att_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* Queues the load of 64 rows x 64 elements starting at row0 (rows past T are
 * filled with zeros) into a padded shared tile. */
template <typename T>
__device__ __forceinline__ void att_load_tile(T *tile, const T *base, int row0, int T_,
                                              int64_t row_stride) {
    for (int c = threadIdx.x; c < ATT_TILE * 8; c += ATT_THREADS) {
        int r = c >> 3, col = (c & 7) * 8, t = row0 + r;
        bool valid = t < T_;
        const T *src = valid ? base + (int64_t)t * row_stride + col : base;
        att_cp_async16(tile + r * ATT_PAD + col, src, valid);
    }
}

/* A operand fragments of this warp's 16 rows x 64 columns of a tile. */
template <typename T>
__device__ __forceinline__ void att_load_a(uint32_t a[4][4], const T *tile, int warp, int lane) {
#pragma unroll
    for (int kc = 0; kc < 4; kc++)
        att_ldsm_x4(a[kc][0], a[kc][1], a[kc][2], a[kc][3],
                    tile + (warp * 16 + (lane & 15)) * ATT_PAD + kc * 16 + (lane >> 4) * 8);
}

/* acc[16 x 64] += A[16 x 64] . tile^T, tile rows = the 64 output columns:
 * the B operand comes straight from the tile's rows (no transpose). */
template <typename T>
__device__ __forceinline__ void att_mma_abt(float acc[8][4], const uint32_t a[4][4], const T *tile,
                                            int lane) {
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
#pragma unroll
        for (int kc = 0; kc < 4; kc += 2) {
            uint32_t b0, b1, b2, b3;
            att_ldsm_x4(b0, b1, b2, b3,
                        tile + (nt * 8 + (lane & 7)) * ATT_PAD + kc * 16 + (lane >> 3) * 8);
            att_mma<T>(acc[nt], a[kc], b0, b1);
            att_mma<T>(acc[nt], a[kc + 1], b2, b3);
        }
    }
}

/* acc[16 x 64] += A[16 x 16] . tile rows 16*kc.. (16 x 64): one k-chunk of a
 * product whose reduction axis is the tile's rows, A as operand fragments. */
template <typename T>
__device__ __forceinline__ void att_mma_chunk(float acc[8][4], const uint32_t a[4], const T *tile,
                                              int kc, int lane) {
#pragma unroll
    for (int dt = 0; dt < 8; dt += 2) {
        uint32_t b0, b1, b2, b3;
        att_ldsm_x4_t(b0, b1, b2, b3,
                      tile + (kc * 16 + (lane & 15)) * ATT_PAD + dt * 8 + (lane >> 4) * 8);
        att_mma<T>(acc[dt], a, b0, b1);
        att_mma<T>(acc[dt + 1], a, b2, b3);
    }
}

/* acc[16 x 64] += P[16 x 64] . tile, with P given as accumulators (the
 * layout of a product's result) and the tile's rows the reduction axis. */
template <typename T>
__device__ __forceinline__ void att_mma_pv(float acc[8][4], const float p[8][4], const T *tile,
                                           int lane) {
#pragma unroll
    for (int kc = 0; kc < 4; kc++) {
        uint32_t a[4];
        a[0] = att_pack<T>(p[2 * kc][0], p[2 * kc][1]);
        a[1] = att_pack<T>(p[2 * kc][2], p[2 * kc][3]);
        a[2] = att_pack<T>(p[2 * kc + 1][0], p[2 * kc + 1][1]);
        a[3] = att_pack<T>(p[2 * kc + 1][2], p[2 * kc + 1][3]);
        att_mma_chunk<T>(acc, a, tile, kc, lane);
    }
}

__device__ __forceinline__ void att_zero(float acc[8][4]) {
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[i][e] = 0.0f;
}

/* Stores a warp's 16 x 64 accumulator rows (scaled) to rows row0.. of dst. */
template <typename T>
__device__ __forceinline__ void att_store_rows(T *dst, int64_t row_stride, int row0, int T_,
                                               const float acc[8][4], float scale0, float scale1,
                                               int lane) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int t = row0 + (lane >> 2) + r * 8;
        if (t >= T_) continue;
        float sc = r ? scale1 : scale0;
        T *row = dst + (int64_t)t * row_stride;
#pragma unroll
        for (int dt = 0; dt < 8; dt++) {
            int col = dt * 8 + (lane & 3) * 2;
            *(uint32_t *)(row + col) = att_pack<T>(acc[dt][2 * r] * sc, acc[dt][2 * r + 1] * sc);
        }
    }
}

/* ------------------------------------------------------ tensor-core path */

template <typename T>
__global__ __launch_bounds__(ATT_THREADS) void att_forward_kernel(T *out, float *lse, const T *qkv,
                                                                  int T_, int NH,
                                                                  float scale_log2) {
    __shared__ __align__(16) T q_s[ATT_TILE * ATT_PAD];
    __shared__ __align__(16) T k_s[2][ATT_TILE * ATT_PAD];
    __shared__ __align__(16) T v_s[2][ATT_TILE * ATT_PAD];
    int qt = gridDim.x - 1 - blockIdx.x; /* the longest rows first: better tail balance */
    int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int C = NH * ATT_HS, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t stride = 3 * (int64_t)C;
    const T *qb = qkv + (int64_t)b * T_ * stride + h * ATT_HS, *kb = qb + C, *vb = qb + 2 * C;
    int q0 = qt * ATT_TILE;

    att_load_tile(q_s, qb, q0, T_, stride);
    att_load_tile(k_s[0], kb, 0, T_, stride);
    att_load_tile(v_s[0], vb, 0, T_, stride);
    att_cp_commit();

    uint32_t qa[4][4];
    float o[8][4], m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.0f, 0.0f};
    att_zero(o);
    int row_g = q0 + warp * 16 + (lane >> 2);
    for (int j = 0; j <= qt; j++) {
        if (j < qt) {
            att_load_tile(k_s[(j + 1) & 1], kb, (j + 1) * ATT_TILE, T_, stride);
            att_load_tile(v_s[(j + 1) & 1], vb, (j + 1) * ATT_TILE, T_, stride);
            att_cp_commit();
            att_cp_wait<1>();
        } else {
            att_cp_wait<0>();
        }
        __syncthreads();
        if (j == 0) att_load_a(qa, q_s, warp, lane);
        const T *ks = k_s[j & 1], *vs = v_s[j & 1];
        float s[8][4];
        att_zero(s);
        att_mma_abt<T>(s, qa, ks, lane);
        float mx[2] = {m_r[0], m_r[1]};
        bool diag = j == qt;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = j * ATT_TILE + nt * 8 + (lane & 3) * 2 + (e & 1);
                float x = s[nt][e] * scale_log2;
                if (diag && key > row_g + (e >> 1) * 8) x = -INFINITY;
                s[nt][e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            corr[r] = exp2f(m_r[r] - mx[r]); /* key 0 is always visible: mx is finite */
            m_r[r] = mx[r];
            l_r[r] *= corr[r];
        }
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = exp2f(s[nt][e] - m_r[e >> 1]);
                s[nt][e] = p;
                l_r[e >> 1] += p;
                o[nt][e] *= corr[e >> 1];
            }
        att_mma_pv<T>(o, s, vs, lane);
        __syncthreads(); /* the buffer is refilled two tiles from now */
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l_r[r] += __shfl_xor_sync(0xffffffffu, l_r[r], 1);
        l_r[r] += __shfl_xor_sync(0xffffffffu, l_r[r], 2);
    }
    att_store_rows(out + (int64_t)b * T_ * C + h * ATT_HS, C, q0 + warp * 16, T_, o, 1.0f / l_r[0],
                   1.0f / l_r[1], lane);
    if ((lane & 3) == 0)
        for (int r = 0; r < 2; r++) {
            int t = row_g + r * 8;
            if (t < T_) lse[(int64_t)bh * T_ + t] = (m_r[r] + log2f(l_r[r])) * ATT_LN2;
        }
}

template <typename T>
__global__ __launch_bounds__(ATT_THREADS) void att_backward_dq_kernel(
    T *dqkv, const T *qkv, const T *dout, const float *lse, const float *dsum, int T_, int NH,
    float scale_log2, float scale) {
    __shared__ __align__(16) T k_s[2][ATT_TILE * ATT_PAD];
    __shared__ __align__(16) T v_s[2][ATT_TILE * ATT_PAD];
    int qt = gridDim.x - 1 - blockIdx.x;
    int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int C = NH * ATT_HS, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t stride = 3 * (int64_t)C;
    const T *qb = qkv + (int64_t)b * T_ * stride + h * ATT_HS, *kb = qb + C, *vb = qb + 2 * C;
    const T *dob = dout + (int64_t)b * T_ * C + h * ATT_HS;
    int q0 = qt * ATT_TILE;

    /* Q and dO pass through the second buffers on their way to registers. */
    att_load_tile(k_s[1], qb, q0, T_, stride);
    att_load_tile(v_s[1], dob, q0, T_, C);
    att_load_tile(k_s[0], kb, 0, T_, stride);
    att_load_tile(v_s[0], vb, 0, T_, stride);
    att_cp_commit();
    att_cp_wait<0>();
    __syncthreads();
    uint32_t qa[4][4], da[4][4];
    att_load_a(qa, k_s[1], warp, lane);
    att_load_a(da, v_s[1], warp, lane);
    int row_g = q0 + warp * 16 + (lane >> 2);
    float lse_r[2], d_r[2];
    for (int r = 0; r < 2; r++) {
        int t = row_g + r * 8;
        lse_r[r] = t < T_ ? lse[(int64_t)bh * T_ + t] * ATT_LOG2E : 0.0f;
        d_r[r] = t < T_ ? dsum[(int64_t)bh * T_ + t] : 0.0f;
    }
    __syncthreads();

    float dq[8][4];
    att_zero(dq);
    for (int j = 0; j <= qt; j++) {
        if (j < qt) {
            att_load_tile(k_s[(j + 1) & 1], kb, (j + 1) * ATT_TILE, T_, stride);
            att_load_tile(v_s[(j + 1) & 1], vb, (j + 1) * ATT_TILE, T_, stride);
            att_cp_commit();
            att_cp_wait<1>();
        } else {
            att_cp_wait<0>();
        }
        __syncthreads();
        const T *ks = k_s[j & 1], *vs = v_s[j & 1];
        float s[8][4], dp[8][4];
        att_zero(s);
        att_zero(dp);
        att_mma_abt<T>(s, qa, ks, lane);
        att_mma_abt<T>(dp, da, vs, lane);
        bool diag = j == qt;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = j * ATT_TILE + nt * 8 + (lane & 3) * 2 + (e & 1);
                float p = exp2f(s[nt][e] * scale_log2 - lse_r[e >> 1]);
                if (diag && key > row_g + (e >> 1) * 8) p = 0.0f;
                s[nt][e] = p * (dp[nt][e] - d_r[e >> 1]);
            }
        att_mma_pv<T>(dq, s, ks, lane);
        __syncthreads();
    }
    att_store_rows(dqkv + (int64_t)b * T_ * stride + h * ATT_HS, stride, q0 + warp * 16, T_, dq,
                   scale, scale, lane);
}

/* acc[16 x 64] += A[16 x 64] . tile, A given as operand fragments and the
 * tile's rows the reduction axis. */
template <typename T>
__device__ __forceinline__ void att_mma_ab(float acc[8][4], const uint32_t a[4][4], const T *tile,
                                           int lane) {
#pragma unroll
    for (int kc = 0; kc < 4; kc++)
        att_mma_chunk<T>(acc, a[kc], tile, kc, lane);
}

/* Adds a warp's 16 x 64 accumulator rows to the f32 rows row0.. of dst
 * (row length 64). Neighbouring lanes swap halves first, so each lane holds
 * four consecutive columns and issues one 16-byte atomic where it would
 * issue two 8-byte ones (Hopper adds float4 atomically). */
__device__ __forceinline__ void att_atomic_add_rows(float *dst, int row0, int T_,
                                                    const float acc[8][4], int lane) {
    int odd = lane & 1;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int t = row0 + (lane >> 2) + r * 8;
#pragma unroll
        for (int dt = 0; dt < 8; dt += 2) {
            /* even lanes keep tile dt and take the odd neighbour's dt values;
             * odd lanes keep tile dt + 1 and take the even neighbour's */
            float give0 = odd ? acc[dt][2 * r] : acc[dt + 1][2 * r];
            float give1 = odd ? acc[dt][2 * r + 1] : acc[dt + 1][2 * r + 1];
            float got0 = __shfl_xor_sync(0xffffffffu, give0, 1);
            float got1 = __shfl_xor_sync(0xffffffffu, give1, 1);
            int tile = odd ? dt + 1 : dt;
            float4 v = odd ? make_float4(got0, got1, acc[dt + 1][2 * r], acc[dt + 1][2 * r + 1])
                           : make_float4(acc[dt][2 * r], acc[dt][2 * r + 1], got0, got1);
            if (t >= T_) continue;
            float *p = dst + (int64_t)t * ATT_HS + tile * 8 + (lane & 2) * 2;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            atomicAdd((float4 *)p, v);
#else
            atomicAdd(p, v.x);
            atomicAdd(p + 1, v.y);
            atomicAdd(p + 2, v.z);
            atomicAdd(p + 3, v.w);
#endif
        }
    }
}

/* The dk/dv backward: grid (key tiles, B*NH); for query tiles i >= j it
 * rebuilds S^T = K Q^T and dP^T = V dO^T and adds dV += P^T dO, dK += dS^T Q.
 * With FUSED (GPC_ATTENTION_BWD=fused) it is FA2's one-kernel backward: each
 * visited query tile also gets dQ_i += dS_ij K_j, added into dq_acc (f32
 * [B*NH, T, 64], zeroed first) with atomics, and att_dq_store_kernel then
 * scales and stores it; five products instead of seven, at the price of the
 * atomics and of run-to-run differences in the last bits of dq. dS goes
 * through shared memory (over the Q tile just used) to be transposed, and K
 * keeps a tile of its own (47 KB of shared memory in all). */
template <typename T, bool FUSED>
__global__ __launch_bounds__(ATT_THREADS) void att_backward_kv_kernel(
    float *dq_acc, T *dqkv, const T *qkv, const T *dout, const float *lse, const float *dsum,
    int T_, int NH, float scale_log2, float scale) {
    __shared__ __align__(16) T q_s[2][ATT_TILE * ATT_PAD];
    __shared__ __align__(16) T do_s[2][ATT_TILE * ATT_PAD];
    __shared__ __align__(16) T k_s[FUSED ? ATT_TILE * ATT_PAD : 8];
    __shared__ float lse_s[2][ATT_TILE], d_s[2][ATT_TILE];
    int kt = blockIdx.x; /* the first key tiles see the most queries: they go first */
    int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int C = NH * ATT_HS, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int nq = (T_ + ATT_TILE - 1) / ATT_TILE;
    int64_t stride = 3 * (int64_t)C;
    const T *qb = qkv + (int64_t)b * T_ * stride + h * ATT_HS, *kb = qb + C, *vb = qb + 2 * C;
    const T *dob = dout + (int64_t)b * T_ * C + h * ATT_HS;
    const float *lse_b = lse + (int64_t)bh * T_, *d_b = dsum + (int64_t)bh * T_;
    int k0 = kt * ATT_TILE;

    /* K and V pass through the second buffers on their way to registers
     * (fused: K stays in its own tile, for dQ = dS K). */
    T *k_tile = FUSED ? k_s : q_s[1];
    att_load_tile(k_tile, kb, k0, T_, stride);
    att_load_tile(do_s[1], vb, k0, T_, stride);
    att_load_tile(q_s[0], qb, k0, T_, stride);
    att_load_tile(do_s[0], dob, k0, T_, C);
    att_cp_commit();
    if (threadIdx.x < ATT_TILE) {
        int t = k0 + threadIdx.x;
        /* rows past T get lse = +inf: their probabilities come out 0 */
        lse_s[0][threadIdx.x] = t < T_ ? lse_b[t] * ATT_LOG2E : INFINITY;
        d_s[0][threadIdx.x] = t < T_ ? d_b[t] : 0.0f;
    }
    att_cp_wait<0>();
    __syncthreads();
    uint32_t ka[4][4], va[4][4];
    att_load_a(ka, k_tile, warp, lane);
    att_load_a(va, do_s[1], warp, lane);
    __syncthreads();

    float dk[8][4], dv[8][4];
    att_zero(dk);
    att_zero(dv);
    int key_g = k0 + warp * 16 + (lane >> 2);
    for (int i = kt; i < nq; i++) {
        int buf = (i - kt) & 1;
        if (i + 1 < nq) {
            int nb = buf ^ 1, q1 = (i + 1) * ATT_TILE;
            att_load_tile(q_s[nb], qb, q1, T_, stride);
            att_load_tile(do_s[nb], dob, q1, T_, C);
            att_cp_commit();
            if (threadIdx.x < ATT_TILE) {
                int t = q1 + threadIdx.x;
                lse_s[nb][threadIdx.x] = t < T_ ? lse_b[t] * ATT_LOG2E : INFINITY;
                d_s[nb][threadIdx.x] = t < T_ ? d_b[t] : 0.0f;
            }
            att_cp_wait<1>();
        } else {
            att_cp_wait<0>();
        }
        __syncthreads();
        T *qs = q_s[buf];
        const T *dos = do_s[buf];
        float st[8][4], dpt[8][4];
        att_zero(st);
        att_zero(dpt);
        att_mma_abt<T>(st, ka, qs, lane);
        att_mma_abt<T>(dpt, va, dos, lane);
        bool diag = i == kt;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int qi = nt * 8 + (lane & 3) * 2 + (e & 1);
                float p = exp2f(st[nt][e] * scale_log2 - lse_s[buf][qi]);
                if (diag && key_g + (e >> 1) * 8 > i * ATT_TILE + qi) p = 0.0f;
                st[nt][e] = p;
                dpt[nt][e] = p * (dpt[nt][e] - d_s[buf][qi]);
            }
        att_mma_pv<T>(dv, st, dos, lane);
        att_mma_pv<T>(dk, dpt, qs, lane);
        __syncthreads(); /* every warp is done with this Q tile */
        if constexpr (FUSED) {
            /* dS^T (keys x queries) goes over the Q tile */
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    int key = warp * 16 + (lane >> 2) + r * 8, qi = nt * 8 + (lane & 3) * 2;
                    *(uint32_t *)(qs + key * ATT_PAD + qi) =
                        att_pack<T>(dpt[nt][2 * r], dpt[nt][2 * r + 1]);
                }
            __syncthreads();
            /* dQ rows 16*warp.. of this query tile: dS (queries x keys, read
             * transposed from the keys-major tile) times K (keys x 64) */
            uint32_t dsa[4][4];
#pragma unroll
            for (int kc = 0; kc < 4; kc++) {
                int m = lane >> 3;
                att_ldsm_x4_t(dsa[kc][0], dsa[kc][1], dsa[kc][2], dsa[kc][3],
                              qs + (kc * 16 + (m >> 1) * 8 + (lane & 7)) * ATT_PAD + warp * 16 +
                                  (m & 1) * 8);
            }
            float dq[8][4];
            att_zero(dq);
            att_mma_ab<T>(dq, dsa, k_s, lane);
            att_atomic_add_rows(dq_acc + (int64_t)bh * T_ * ATT_HS, i * ATT_TILE + warp * 16, T_,
                                dq, lane);
            __syncthreads(); /* the tile is refilled by the next iteration's prefetch */
        }
    }
    T *db = dqkv + (int64_t)b * T_ * stride + h * ATT_HS;
    att_store_rows(db + C, stride, k0 + warp * 16, T_, dk, scale, scale, lane);
    att_store_rows(db + 2 * C, stride, k0 + warp * 16, T_, dv, 1.0f, 1.0f, lane);
}

/* dqkv's q third = scale * dq_acc, eight elements a thread. */
template <typename T>
__global__ void att_dq_store_kernel(T *dqkv, const float *dq_acc, int B, int T_, int NH,
                                    float scale) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t n = (int64_t)B * NH * T_ * (ATT_HS / 8);
    if (i >= n) return;
    int d8 = (int)(i % (ATT_HS / 8)) * 8;
    int64_t row = i / (ATT_HS / 8);
    int t = (int)(row % T_), bh = (int)(row / T_), b = bh / NH, h = bh % NH;
    const float4 *src = (const float4 *)(dq_acc + row * ATT_HS + d8);
    float4 x = src[0], y = src[1];
    int64_t C = (int64_t)NH * ATT_HS;
    uint4 packed;
    packed.x = att_pack<T>(x.x * scale, x.y * scale);
    packed.y = att_pack<T>(x.z * scale, x.w * scale);
    packed.z = att_pack<T>(y.x * scale, y.y * scale);
    packed.w = att_pack<T>(y.z * scale, y.w * scale);
    *(uint4 *)(dqkv + ((int64_t)b * T_ + t) * 3 * C + h * ATT_HS + d8) = packed;
}

/* ----------------------------------------------------------- simple path */

/* One warp per row; lane l holds dimensions l, l+32, l+64, l+96. */
#define ATT_NAIVE_PER (ATT_NAIVE_MAX_HS / 32)

template <typename T>
__device__ __forceinline__ void att_row(float *dst, const T *src, int hs, int lane) {
#pragma unroll
    for (int i = 0; i < ATT_NAIVE_PER; i++) {
        int d = lane + 32 * i;
        dst[i] = d < hs ? gpc_to_f32(src[d]) : 0.0f;
    }
}

__device__ __forceinline__ float att_dot(const float *a, const float *b) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < ATT_NAIVE_PER; i++)
        s += a[i] * b[i];
    return gpc_warp_sum(s);
}

/* One key of a row's online softmax: running max m, sum l, output acc. */
__device__ __forceinline__ void att_online(const float *q, const float *k, const float *v,
                                           float *acc, float &m, float &l, float scale) {
    float s = att_dot(q, k) * scale, mn = fmaxf(m, s);
    float corr = expf(m - mn), p = expf(s - mn);
    l = l * corr + p;
    for (int i = 0; i < ATT_NAIVE_PER; i++)
        acc[i] = acc[i] * corr + p * v[i];
    m = mn;
}

template <typename T>
__global__ void att_naive_forward_kernel(T *out, float *lse, const T *qkv, int B, int T_, int NH,
                                         int hs, float scale) {
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= (int64_t)B * NH * T_) return;
    int t = (int)(w % T_), bh = (int)(w / T_), b = bh / NH, h = bh % NH, C = NH * hs;
    int64_t stride = 3 * (int64_t)C;
    const T *base = qkv + (int64_t)b * T_ * stride + h * hs;
    float q[ATT_NAIVE_PER], k[ATT_NAIVE_PER], v[ATT_NAIVE_PER], acc[ATT_NAIVE_PER] = {0};
    att_row(q, base + t * stride, hs, lane);
    float m = -INFINITY, l = 0.0f;
    for (int j = 0; j <= t; j++) {
        att_row(k, base + j * stride + C, hs, lane);
        att_row(v, base + j * stride + 2 * C, hs, lane);
        att_online(q, k, v, acc, m, l, scale);
    }
    T *o = out + ((int64_t)b * T_ + t) * C + h * hs;
    for (int i = 0; i < ATT_NAIVE_PER; i++)
        if (lane + 32 * i < hs) o[lane + 32 * i] = gpc_from_f32<T>(acc[i] / l);
    if (lane == 0) lse[(int64_t)bh * T_ + t] = m + logf(l);
}

/* Generation's rows (attention_decode): one block of ATT_DECODE_WARPS warps
 * a row, the row's keys dealt out to the warps in turn (key j to warp
 * j % ATT_DECODE_WARPS), each warp keeping its own online softmax as
 * att_naive_forward_kernel does; the warps' (max, sum, output) are then
 * merged in shared memory. A decoding step has few rows (B x NH), so one
 * warp a row would leave the GPU nearly idle while each walked the whole
 * kept sequence alone. */
#define ATT_DECODE_WARPS 8
template <typename T>
__global__ void __launch_bounds__(32 * ATT_DECODE_WARPS)
    att_decode_kernel(T *out, const T *qkv, int T_, int Tq, int NH, int hs, float scale) {
    __shared__ float part_m[ATT_DECODE_WARPS], part_l[ATT_DECODE_WARPS];
    __shared__ float part_o[ATT_DECODE_WARPS][ATT_NAIVE_MAX_HS];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int r = (int)(blockIdx.x % Tq), bh = (int)(blockIdx.x / Tq), b = bh / NH, h = bh % NH;
    int C = NH * hs, t = T_ - Tq + r;
    int64_t stride = 3 * (int64_t)C;
    const T *base = qkv + (int64_t)b * T_ * stride + h * hs;
    float q[ATT_NAIVE_PER], k[ATT_NAIVE_PER], v[ATT_NAIVE_PER], acc[ATT_NAIVE_PER] = {0};
    att_row(q, base + t * stride, hs, lane);
    float m = -INFINITY, l = 0.0f;
    for (int j = warp; j <= t; j += ATT_DECODE_WARPS) {
        att_row(k, base + j * stride + C, hs, lane);
        att_row(v, base + j * stride + 2 * C, hs, lane);
        att_online(q, k, v, acc, m, l, scale);
    }
    if (lane == 0) {
        part_m[warp] = m;
        part_l[warp] = l;
    }
    for (int i = 0; i < ATT_NAIVE_PER; i++)
        if (lane + 32 * i < hs) part_o[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    /* warp 0 holds key 0, so the merged max is finite; a warp with no keys
     * (t < warp) has m = -inf and weighs 0 */
    float mx = part_m[0];
    for (int w = 1; w < ATT_DECODE_WARPS; w++)
        mx = fmaxf(mx, part_m[w]);
    float total = 0.0f;
    for (int w = 0; w < ATT_DECODE_WARPS; w++)
        total += part_l[w] * expf(part_m[w] - mx);
    T *o = out + ((int64_t)b * Tq + r) * C + h * hs;
    for (int d = threadIdx.x; d < hs; d += blockDim.x) {
        float sum = 0.0f;
        for (int w = 0; w < ATT_DECODE_WARPS; w++)
            sum += part_o[w][d] * expf(part_m[w] - mx);
        o[d] = gpc_from_f32<T>(sum / total);
    }
}

template <typename T>
__global__ void att_naive_dq_kernel(T *dqkv, const T *qkv, const T *dout, const float *lse,
                                    const float *dsum, int B, int T_, int NH, int hs, float scale) {
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= (int64_t)B * NH * T_) return;
    int t = (int)(w % T_), bh = (int)(w / T_), b = bh / NH, h = bh % NH, C = NH * hs;
    int64_t stride = 3 * (int64_t)C;
    const T *base = qkv + (int64_t)b * T_ * stride + h * hs;
    float q[ATT_NAIVE_PER], k[ATT_NAIVE_PER], v[ATT_NAIVE_PER], dy[ATT_NAIVE_PER],
        dq[ATT_NAIVE_PER] = {0};
    att_row(q, base + t * stride, hs, lane);
    att_row(dy, dout + ((int64_t)b * T_ + t) * C + h * hs, hs, lane);
    float L = lse[(int64_t)bh * T_ + t], D = dsum[(int64_t)bh * T_ + t];
    for (int j = 0; j <= t; j++) {
        att_row(k, base + j * stride + C, hs, lane);
        att_row(v, base + j * stride + 2 * C, hs, lane);
        float p = expf(att_dot(q, k) * scale - L);
        float ds = p * (att_dot(dy, v) - D);
        for (int i = 0; i < ATT_NAIVE_PER; i++)
            dq[i] += ds * k[i];
    }
    T *o = dqkv + ((int64_t)b * T_ + t) * stride + h * hs;
    for (int i = 0; i < ATT_NAIVE_PER; i++)
        if (lane + 32 * i < hs) o[lane + 32 * i] = gpc_from_f32<T>(dq[i] * scale);
}

template <typename T>
__global__ void att_naive_dkdv_kernel(T *dqkv, const T *qkv, const T *dout, const float *lse,
                                      const float *dsum, int B, int T_, int NH, int hs,
                                      float scale) {
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= (int64_t)B * NH * T_) return;
    int j = (int)(w % T_), bh = (int)(w / T_), b = bh / NH, h = bh % NH, C = NH * hs;
    int64_t stride = 3 * (int64_t)C;
    const T *base = qkv + (int64_t)b * T_ * stride + h * hs;
    float q[ATT_NAIVE_PER], k[ATT_NAIVE_PER], v[ATT_NAIVE_PER], dy[ATT_NAIVE_PER],
        dk[ATT_NAIVE_PER] = {0}, dv[ATT_NAIVE_PER] = {0};
    att_row(k, base + j * stride + C, hs, lane);
    att_row(v, base + j * stride + 2 * C, hs, lane);
    for (int t = j; t < T_; t++) {
        att_row(q, base + t * stride, hs, lane);
        att_row(dy, dout + ((int64_t)b * T_ + t) * C + h * hs, hs, lane);
        float p = expf(att_dot(q, k) * scale - lse[(int64_t)bh * T_ + t]);
        float ds = p * (att_dot(dy, v) - dsum[(int64_t)bh * T_ + t]);
        for (int i = 0; i < ATT_NAIVE_PER; i++) {
            dv[i] += p * dy[i];
            dk[i] += ds * q[i];
        }
    }
    T *o = dqkv + ((int64_t)b * T_ + j) * stride + h * hs;
    for (int i = 0; i < ATT_NAIVE_PER; i++)
        if (lane + 32 * i < hs) {
            o[C + lane + 32 * i] = gpc_from_f32<T>(dk[i] * scale);
            o[2 * C + lane + 32 * i] = gpc_from_f32<T>(dv[i]);
        }
}

/* dsum[b,h,t] = dout[b,t,h,:] . out[b,t,h,:], one warp per row. */
template <typename T>
__global__ void att_dsum_kernel(float *dsum, const T *dout, const T *out, int B, int T_, int NH,
                                int hs) {
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= (int64_t)B * NH * T_) return;
    int t = (int)(w % T_), bh = (int)(w / T_), b = bh / NH, h = bh % NH, C = NH * hs;
    int64_t at = ((int64_t)b * T_ + t) * C + h * hs;
    float s = 0.0f;
    for (int d = lane; d < hs; d += 32)
        s += gpc_to_f32(dout[at + d]) * gpc_to_f32(out[at + d]);
    s = gpc_warp_sum(s);
    if (lane == 0) dsum[w] = s;
}

/* The same for head size 64 (the tensor-core paths): 16 bytes of each
 * operand a thread, 64 / n threads a row. On the way, which saves a
 * memset's pass, the mma.sync backward's zero4 16-byte words of scratch are
 * zeroed (its f32 dq accumulator), or the wgmma backward's dqkv q third
 * (qzero, [B, T, 3, NH, 64], where its TMA adds sum dQ), 16 bytes a thread
 * at the place the thread reads dout from. */
template <typename T>
__global__ void att_dsum64_kernel(float *dsum, float4 *zero, int64_t zero4, T *qzero, const T *dout,
                                  const T *out, int B, int T_, int NH) {
    const int n = gpc_pack<T>::n, per = ATT_HS / n;
    const int64_t rows = (int64_t)B * NH * T_;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, w = i / per;
    /* a row's threads share a warp: all of the warp stay for the shuffles */
    const bool live = w < rows;
    if (!live) w = rows - 1;
    int part = (int)(i % per), t = (int)(w % T_), bh = (int)(w / T_), b = bh / NH, h = bh % NH;
    int64_t at = ((int64_t)b * T_ + t) * NH * ATT_HS + h * ATT_HS + n * part;
    gpc_pack<T> a = *(const gpc_pack<T> *)(dout + at), o = *(const gpc_pack<T> *)(out + at);
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < n; e++)
        s += gpc_to_f32(a.v[e]) * gpc_to_f32(o.v[e]);
#pragma unroll
    for (int m = 1; m < per; m *= 2)
        s += __shfl_xor_sync(0xffffffffu, s, m);
    if (live && part == 0) dsum[w] = s;
    if (live && qzero)
        *(uint4 *)(qzero + ((int64_t)b * T_ + t) * 3 * NH * ATT_HS + h * ATT_HS + n * part) =
            make_uint4(0, 0, 0, 0);
    for (int64_t k = i; k < zero4; k += (int64_t)gridDim.x * blockDim.x)
        zero[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

/* ------------------------------------------------------------------ host */

typedef struct {
    int B, T, C, NH, hs;
} att_shape;

static att_shape att_shape_of(const gpc_tensor *qkv, int num_heads) {
    att_shape s;
    s.B = (int)qkv->shape[0];
    s.T = (int)qkv->shape[1];
    s.C = (int)(qkv->shape[2] / 3);
    s.NH = num_heads;
    s.hs = s.C / num_heads;
    return s;
}

/* The tensor-core kernels need bf16/f16, head size 64 and 16-byte aligned
 * rows; the path simple forces the simple kernels (for comparisons). */
static int att_fast(gpc_attention_path path, gpc_dtype dtype, const att_shape *s,
                    const void *const *ptrs, int n) {
    if (path == GPC_ATTENTION_SIMPLE) return 0;
    if ((dtype != GPC_BF16 && dtype != GPC_F16) || s->hs != ATT_HS) return 0;
    for (int i = 0; i < n; i++)
        if (!gpc_cuda_aligned16(ptrs[i])) return 0;
    return 1;
}

/* ------------------------------------------------------- path choice
 *
 * auto takes cuDNN where it measured faster than these kernels
 * (bench/RESULTS.md, "cuDNN's attention beside gpc's": on an H200 with cuDNN
 * 9.14, forward+backward 1.77x faster at B=64 T=1024 NH=12 hs=64, the GPT-2
 * step 11.5% faster): on Hopper-class GPUs (compute capability 9 and up), in
 * bf16 or fp16, when libcudnn loaded and its engines accepted the shape.
 * Anywhere else auto means gpc's kernels. A missing library under auto costs
 * a one-line notice, once; asking for cudnn by name makes every such reason
 * an error instead. */
#define ATT_AUTO_CUDNN_MIN_MAJOR 9

static int att_auto_wants_cudnn(gpc_dtype dtype, const att_shape *s) {
    if (dtype != GPC_BF16 && dtype != GPC_F16) return 0;
    if (!gpc_cudnn_attention_built() || s->hs % 8 != 0 || s->hs > 128) return 0;
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return major >= ATT_AUTO_CUDNN_MIN_MAJOR;
}

/* *use: 1 when cuDNN serves this call (which: GPC_CUDNN_FORWARD and/or
 * GPC_CUDNN_BACKWARD, the plans it needs). Fails only when cudnn was asked for
 * by name and cannot serve it, or GPC_ATTENTION is not a path.
 *
 * Under auto, only gpc_op_attention_prepare (build = 1) builds plans; a call
 * takes cuDNN only for a shape prepared ahead, as a model's training and
 * evaluation shapes are at gpt_create. Other shapes, such as the growing
 * windows of sampling, stay on gpc's kernels rather than pay a plan build
 * each. cudnn by name builds whatever shape it is given. */
static gpc_status att_route(const char *op, gpc_dtype dtype, const att_shape *s, int which,
                            int build, const void *const *ptrs, int n, gpc_attention_path *path,
                            int *use) {
    *use = 0;
    GPC_TRY(gpc_op_attention_path(path));
    if (*path == GPC_ATTENTION_GPC || *path == GPC_ATTENTION_SIMPLE) return GPC_OK;
    if (*path == GPC_ATTENTION_CUDNN) {
        gpc_status st = gpc_cudnn_attention_prepare(s->B, s->T, s->NH, s->hs, dtype, which);
        if (st != GPC_OK)
            return gpc_error_context(st,
                                     "%s with the cuDNN path (GPC_ATTENTION=cudnn or "
                                     "--attention cudnn): ",
                                     op);
        *use = 1;
        return GPC_OK;
    }
    if (!att_auto_wants_cudnn(dtype, s)) return GPC_OK;
    for (int i = 0; i < n; i++)
        if (!gpc_cuda_aligned16(ptrs[i])) return GPC_OK;
    if (!build) {
        *use = gpc_cudnn_attention_ready(s->B, s->T, s->NH, s->hs, dtype, which);
        return GPC_OK;
    }
    gpc_status st = gpc_cudnn_attention_load();
    if (st != GPC_OK) {
        static int noticed;
        if (!noticed++)
            gpc_log(GPC_LOG_WARN, "attention runs on gpc's kernels: %s", gpc_last_error());
        gpc_clear_error();
        return GPC_OK;
    }
    /* a shape cuDNN has no engine for is cached as such and left to us */
    if (gpc_cudnn_attention_prepare(s->B, s->T, s->NH, s->hs, dtype, which) == GPC_OK)
        *use = 1;
    else
        gpc_clear_error();
    return GPC_OK;
}

#ifndef GPC_HAVE_CUDNN
/* Built without cudnn.h: the path exists in name only. */
#define ATT_NO_CUDNN                                                                               \
    gpc_error(GPC_ERR_UNSUPPORTED,                                                                 \
              "this gpc was built without cuDNN (cudnn.h was not found at build time; point "      \
              "CUDNN_INCLUDE_DIR at it and rebuild), so GPC_ATTENTION=cudnn cannot run; use "      \
              "GPC_ATTENTION=gpc")
extern "C" int gpc_cudnn_attention_built(void) {
    return 0;
}
extern "C" gpc_status gpc_cudnn_attention_load(void) {
    return ATT_NO_CUDNN;
}
extern "C" long gpc_cudnn_attention_version(void) {
    return 0;
}
extern "C" gpc_status gpc_cudnn_attention_prepare(int, int, int, int, gpc_dtype, int) {
    return ATT_NO_CUDNN;
}
extern "C" int gpc_cudnn_attention_ready(int, int, int, int, gpc_dtype, int) {
    return 0;
}
extern "C" gpc_status gpc_cudnn_attention_forward(gpc_tensor *, gpc_tensor *, const gpc_tensor *,
                                                  int) {
    return ATT_NO_CUDNN;
}
extern "C" gpc_status gpc_cudnn_attention_backward(gpc_tensor *, const gpc_tensor *,
                                                   const gpc_tensor *, const gpc_tensor *,
                                                   const gpc_tensor *, int) {
    return ATT_NO_CUDNN;
}
extern "C" void gpc_cudnn_attention_get_stats(gpc_cudnn_attention_stats *stats) {
    memset(stats, 0, sizeof *stats);
}
#endif

/* GPC_ATTENTION_BWD: "auto" (the default: under the auto path the wgmma
 * kernel in place of cuDNN's backward where it serves, and on gpc's path
 * the two kernels) 3, "two" 0, "fused" (the one-kernel backward) 1, "wgmma"
 * (the same on attention_sm90.cu's kernel where it runs, on either path) 2;
 * read once, and any other value is named in a warning. */
enum { ATT_BWD_TWO, ATT_BWD_FUSED, ATT_BWD_WGMMA, ATT_BWD_AUTO };
static int att_backward_mode(void) {
    static int mode = -1;
    if (mode < 0) {
        const char *e = gpc_setting_str("GPC_ATTENTION_BWD");
        mode = !e || !*e || !strcmp(e, "auto") ? ATT_BWD_AUTO
               : !strcmp(e, "two")             ? ATT_BWD_TWO
               : !strcmp(e, "fused")           ? ATT_BWD_FUSED
               : !strcmp(e, "wgmma")           ? ATT_BWD_WGMMA
                                               : -2;
        if (mode == -2) {
            gpc_log(GPC_LOG_WARN,
                    "GPC_ATTENTION_BWD=%s is not 'auto', 'two', 'fused' or 'wgmma': using the "
                    "two-kernel backward",
                    e);
            mode = ATT_BWD_TWO;
        }
    }
    return mode;
}

/* Whether, under the auto path, gpc's wgmma kernel takes a shape's backward
 * from cuDNN (GPC_ATTENTION_BWD auto or wgmma, bf16, head size 64, a T and
 * GPU it serves): cuDNN's forward, then this backward (the two paths' lse
 * agree), and cuDNN's backward plan is never built for the shape. */
static int att_wgmma_takes_backward(gpc_attention_path path, gpc_dtype dtype, const att_shape *s) {
    const int mode = att_backward_mode();
    return path == GPC_ATTENTION_AUTO && (mode == ATT_BWD_AUTO || mode == ATT_BWD_WGMMA) &&
           dtype == GPC_BF16 && s->hs == ATT_HS && gpc_cuda_attention_sm90_serves(s->T);
}

static gpc_status att_check(const char *op, const att_shape *s) {
    if ((int64_t)s->B * s->T * 3 * s->C > ((int64_t)1 << 40) || s->T <= 0)
        return gpc_error(GPC_ERR_UNSUPPORTED, "%s: shape out of the GPU kernel's range", op);
    return GPC_OK;
}

/* What every attention entry does first: out's dtype against qkv's, the
 * device, and qkv's shape into *s (s->B 0: nothing to do). */
static gpc_status att_begin(const char *op, const gpc_tensor *out, const gpc_tensor *qkv,
                            int num_heads, att_shape *s) {
    GPC_TRY(gpc_cuda_same_dtype(op, "out", out, "qkv", qkv));
    GPC_TRY(gpc_cuda_enter(out));
    *s = att_shape_of(qkv, num_heads);
    return s->B == 0 ? GPC_OK : att_check(op, s);
}

gpc_status gpc_cuda_attention_forward(gpc_tensor *out, gpc_tensor *lse, const gpc_tensor *qkv,
                                      int num_heads) {
    const char *op = "attention_forward";
    att_shape s;
    GPC_TRY(att_begin(op, out, qkv, num_heads, &s));
    if (s.B == 0) return GPC_OK;
    const void *ptrs[] = {out->data, qkv->data, lse->data};
    gpc_attention_path path;
    int use_cudnn;
    GPC_TRY(att_route(op, out->dtype, &s, GPC_CUDNN_FORWARD, 0, ptrs, 3, &path, &use_cudnn));
    if (use_cudnn) return gpc_cudnn_attention_forward(out, lse, qkv, num_heads);
    float scale = 1.0f / sqrtf((float)s.hs);
    cudaStream_t st = gpc_cuda_stream();
    if (att_fast(path, out->dtype, &s, ptrs, 2)) {
        dim3 grid((unsigned)((s.T + ATT_TILE - 1) / ATT_TILE), (unsigned)(s.B * s.NH));
        if (out->dtype == GPC_BF16)
            att_forward_kernel<gpc_bf16_t><<<grid, ATT_THREADS, 0, st>>>(
                (gpc_bf16_t *)out->data, (float *)lse->data, (const gpc_bf16_t *)qkv->data, s.T,
                s.NH, scale * ATT_LOG2E);
        else
            att_forward_kernel<gpc_f16_t><<<grid, ATT_THREADS, 0, st>>>(
                (gpc_f16_t *)out->data, (float *)lse->data, (const gpc_f16_t *)qkv->data, s.T, s.NH,
                scale * ATT_LOG2E);
        GPC_CUDA_CHECK_LAUNCH();
        return GPC_OK;
    }
    if (s.hs > ATT_NAIVE_MAX_HS)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "%s: head size %d on the GPU needs bf16 or f16 and head size 64, or a "
                         "head size of at most %d",
                         op, s.hs, ATT_NAIVE_MAX_HS);
    int64_t rows = (int64_t)s.B * s.NH * s.T;
    GPC_CUDA_DISPATCH(out->dtype, E, {
        att_naive_forward_kernel<E><<<gpc_cuda_blocks(rows * 32, 128), 128, 0, st>>>(
            (E *)out->data, (float *)lse->data, (const E *)qkv->data, s.B, s.T, s.NH, s.hs, scale);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

/* Generation's few rows at a time (att_decode_kernel), whose loads of the
 * kept keys and values are what a decoding step costs. */
gpc_status gpc_cuda_attention_decode(gpc_tensor *out, const gpc_tensor *qkv, int num_heads) {
    const char *op = "attention_decode";
    att_shape s;
    GPC_TRY(att_begin(op, out, qkv, num_heads, &s));
    if (s.B == 0) return GPC_OK;
    if (s.hs > ATT_NAIVE_MAX_HS)
        return gpc_error(GPC_ERR_UNSUPPORTED, "%s: head size %d on the GPU is over %d", op, s.hs,
                         ATT_NAIVE_MAX_HS);
    int Tq = (int)out->shape[1];
    int64_t rows = (int64_t)s.B * s.NH * Tq;
    float scale = 1.0f / sqrtf((float)s.hs);
    if (rows > 0x7fffffff) return gpc_error(GPC_ERR_UNSUPPORTED, "%s: too many rows", op);
    GPC_CUDA_DISPATCH(out->dtype, E, {
        att_decode_kernel<E><<<(unsigned)rows, 32 * ATT_DECODE_WARPS, 0, gpc_cuda_stream()>>>(
            (E *)out->data, (const E *)qkv->data, s.T, Tq, s.NH, s.hs, scale);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

/* The mma.sync one-kernel backward: dK, dV and dQ's sums into the zeroed
 * f32 accumulator dq_acc, then dQ stored from it. */
template <typename E>
static void att_fused_backward(gpc_tensor *dqkv, const gpc_tensor *qkv, const gpc_tensor *dout,
                               const gpc_tensor *lse, float *dq_acc, const float *dsum,
                               const att_shape *s, float scale, cudaStream_t st) {
    dim3 grid((unsigned)((s->T + ATT_TILE - 1) / ATT_TILE), (unsigned)(s->B * s->NH));
    att_backward_kv_kernel<E, true><<<grid, ATT_THREADS, 0, st>>>(
        dq_acc, (E *)dqkv->data, (const E *)qkv->data, (const E *)dout->data,
        (const float *)lse->data, dsum, s->T, s->NH, scale * ATT_LOG2E, scale);
    att_dq_store_kernel<E>
        <<<gpc_cuda_blocks((int64_t)s->B * s->NH * s->T * (ATT_HS / 8), 256), 256, 0, st>>>(
            (E *)dqkv->data, dq_acc, s->B, s->T, s->NH, scale);
}

gpc_status gpc_cuda_attention_backward(gpc_tensor *dqkv, const gpc_tensor *dout,
                                       const gpc_tensor *qkv, const gpc_tensor *out,
                                       const gpc_tensor *lse, int num_heads) {
    const char *op = "attention_backward";
    GPC_TRY(gpc_cuda_same_dtype(op, "dqkv", dqkv, "qkv", qkv));
    GPC_TRY(gpc_cuda_same_dtype(op, "dout", dout, "qkv", qkv));
    att_shape s;
    GPC_TRY(att_begin(op, out, qkv, num_heads, &s));
    if (s.B == 0) return GPC_OK;
    const void *ptrs[] = {out->data, qkv->data, dqkv->data, dout->data, lse->data};
    gpc_attention_path path;
    GPC_TRY(gpc_op_attention_path(&path));
    /* where the wgmma kernel takes the backward from cuDNN, a shape cuDNN
     * serves is one whose forward plan was prepared (its backward plan never
     * is); the wgmma kernel then runs in place of cuDNN's backward */
    const int takes = att_wgmma_takes_backward(path, out->dtype, &s);
    int use_cudnn;
    GPC_TRY(att_route(op, out->dtype, &s, takes ? GPC_CUDNN_FORWARD : GPC_CUDNN_BACKWARD, 0, ptrs,
                      5, &path, &use_cudnn));
    if (use_cudnn && !takes)
        return gpc_cudnn_attention_backward(dqkv, dout, qkv, out, lse, num_heads);
    const int from_cudnn = use_cudnn && takes;
    const int mode = att_backward_mode();
    int fast = att_fast(path, out->dtype, &s, ptrs, 4);
    if (!fast && s.hs > ATT_NAIVE_MAX_HS)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "%s: head size %d on the GPU needs bf16 or f16 and head size 64, or a "
                         "head size of at most %d",
                         op, s.hs, ATT_NAIVE_MAX_HS);
    int64_t rows = (int64_t)s.B * s.NH * s.T;
    /* the wgmma kernel (bf16, T a multiple of 128 on compute capability
     * 9.0; lse 16-byte aligned as its bulk copies need), or the mma.sync
     * one-kernel backward in its place where it does not serve. gpc's path
     * keeps its two kernels by default: they give the same bits every run */
    int wgmma = fast && (mode == ATT_BWD_WGMMA || from_cudnn) && out->dtype == GPC_BF16 &&
                gpc_cuda_aligned16(lse->data) && gpc_cuda_attention_sm90_serves(s.T);
    int fused = fast && !wgmma && (mode == ATT_BWD_FUSED || mode == ATT_BWD_WGMMA);
    /* scratch: dsum [rows], then (fused) the f32 dq accumulator [rows, 64].
     * dsum's pass zeroes it, or (wgmma) dqkv's q third, into which that
     * kernel adds dQ itself */
    size_t dsum_bytes = ((size_t)rows * sizeof(float) + 255) & ~(size_t)255;
    size_t zero_bytes = fused ? (size_t)rows * ATT_HS * sizeof(float) : 0;
    void *dsum;
    GPC_TRY(gpc_cuda_scratch(dsum_bytes + zero_bytes, &dsum));
    float *dq_acc = (float *)((char *)dsum + dsum_bytes);
    float scale = 1.0f / sqrtf((float)s.hs);
    cudaStream_t st = gpc_cuda_stream();
    GPC_CUDA_DISPATCH(out->dtype, E, {
        if (fast)
            att_dsum64_kernel<E>
                <<<gpc_cuda_blocks(rows * (ATT_HS / gpc_pack<E>::n), 256), 256, 0, st>>>(
                    (float *)dsum, (float4 *)dq_acc, (int64_t)(zero_bytes / 16),
                    wgmma ? (E *)dqkv->data : NULL, (const E *)dout->data, (const E *)out->data,
                    s.B, s.T, s.NH);
        else
            att_dsum_kernel<E><<<gpc_cuda_blocks(rows * 32, 256), 256, 0, st>>>(
                (float *)dsum, (const E *)dout->data, (const E *)out->data, s.B, s.T, s.NH, s.hs);
    });
    GPC_CUDA_CHECK_LAUNCH();
    if (wgmma)
        return gpc_cuda_attention_backward_sm90(
            (gpc_bf16_t *)dqkv->data, (const gpc_bf16_t *)qkv->data, (const gpc_bf16_t *)dout->data,
            (const float *)lse->data, (const float *)dsum, s.B, s.T, s.NH, scale);
    if (fused) {
        if (out->dtype == GPC_BF16)
            att_fused_backward<gpc_bf16_t>(dqkv, qkv, dout, lse, dq_acc, (const float *)dsum, &s,
                                           scale, st);
        else
            att_fused_backward<gpc_f16_t>(dqkv, qkv, dout, lse, dq_acc, (const float *)dsum, &s,
                                          scale, st);
        GPC_CUDA_CHECK_LAUNCH();
        return GPC_OK;
    }
    if (fast) {
        unsigned tiles = (unsigned)((s.T + ATT_TILE - 1) / ATT_TILE);
        dim3 grid(tiles, (unsigned)(s.B * s.NH));
        float sl2 = scale * ATT_LOG2E;
        if (out->dtype == GPC_BF16) {
            typedef gpc_bf16_t E;
            att_backward_kv_kernel<E, false><<<grid, ATT_THREADS, 0, st>>>(
                NULL, (E *)dqkv->data, (const E *)qkv->data, (const E *)dout->data,
                (const float *)lse->data, (const float *)dsum, s.T, s.NH, sl2, scale);
            att_backward_dq_kernel<E><<<grid, ATT_THREADS, 0, st>>>(
                (E *)dqkv->data, (const E *)qkv->data, (const E *)dout->data,
                (const float *)lse->data, (const float *)dsum, s.T, s.NH, sl2, scale);
        } else {
            typedef gpc_f16_t E;
            att_backward_kv_kernel<E, false><<<grid, ATT_THREADS, 0, st>>>(
                NULL, (E *)dqkv->data, (const E *)qkv->data, (const E *)dout->data,
                (const float *)lse->data, (const float *)dsum, s.T, s.NH, sl2, scale);
            att_backward_dq_kernel<E><<<grid, ATT_THREADS, 0, st>>>(
                (E *)dqkv->data, (const E *)qkv->data, (const E *)dout->data,
                (const float *)lse->data, (const float *)dsum, s.T, s.NH, sl2, scale);
        }
        GPC_CUDA_CHECK_LAUNCH();
        return GPC_OK;
    }
    GPC_CUDA_DISPATCH(out->dtype, E, {
        unsigned grid = gpc_cuda_blocks(rows * 32, 128);
        att_naive_dq_kernel<E><<<grid, 128, 0, st>>>(
            (E *)dqkv->data, (const E *)qkv->data, (const E *)dout->data, (const float *)lse->data,
            (const float *)dsum, s.B, s.T, s.NH, s.hs, scale);
        att_naive_dkdv_kernel<E><<<grid, 128, 0, st>>>(
            (E *)dqkv->data, (const E *)qkv->data, (const E *)dout->data, (const float *)lse->data,
            (const float *)dsum, s.B, s.T, s.NH, s.hs, scale);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

/* Builds what the chosen path needs for this shape ahead of the first step:
 * cuDNN's plans and workspace, when cuDNN will serve it (under auto, only
 * the forward's where gpc's wgmma kernel takes the backward). gpc's kernels
 * need nothing built (their small row-sum scratch grows on first use). */
gpc_status gpc_cuda_attention_prepare(const gpc_tensor *qkv, int num_heads, int backward) {
    GPC_TRY(gpc_cuda_enter(qkv));
    att_shape s = att_shape_of(qkv, num_heads);
    if (s.B == 0 || s.T == 0) return GPC_OK;
    /* the model's tensors are placed 256-byte aligned, so alignment is
     * settled at each call; here only the shape and dtype decide */
    const void *aligned[] = {(const void *)(uintptr_t)256};
    gpc_attention_path path;
    GPC_TRY(gpc_op_attention_path(&path));
    int use;
    int which =
        GPC_CUDNN_FORWARD |
        (backward && !att_wgmma_takes_backward(path, qkv->dtype, &s) ? GPC_CUDNN_BACKWARD : 0);
    return att_route("attention_prepare", qkv->dtype, &s, which, 1, aligned, 1, &path, &use);
}
