/*
 * attention_mma.cu: gpc's causal multi-head self-attention on tensor cores,
 * forward and backward, for bf16 or f16 and head size 64, as flash attention
 * (Dao 2023, FlashAttention-2): Q, K and V tiles in shared memory, scores
 * and probabilities only in registers, an online softmax, and the
 * log-sum-exp of each row saved so the backward pass can rebuild the
 * probabilities. No T x T matrix ever reaches device memory. attention.cu
 * chooses when this path runs (attention_kernels.cuh are its launchers).
 *
 * The products run through mma.sync m16n8k16 with f32 accumulation
 * (attention_ptx.cuh). A block of 4 warps owns a tile of 64 rows, 16 per
 * warp. The accumulator layout of one product is the operand layout of the
 * next (FA2's register reuse), so the probabilities P feed P.V without
 * leaving registers. Tiles are fetched with cp.async two deep, so the next
 * tile's load overlaps this tile's arithmetic. Shared-memory rows are padded
 * from 64 to 72 elements, shifting each row by 16 bytes, so the eight row
 * addresses of an ldmatrix fall in distinct banks.
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
 *
 * Scores are scaled by 1/sqrt(hs) and handled in base 2 inside the kernels
 * (exp2 is one instruction); lse is stored in natural log, as the CPU does.
 */
#include "cuda/attention_kernels.cuh"
#include "cuda/attention_ptx.cuh"

#include <math.h>

#define ATT_TILE 64
#define ATT_THREADS 128
#define ATT_PAD 72
#define ATT_LOG2E 1.4426950408889634f
#define ATT_LN2 0.6931471805599453f

/* ------------------------------------------------------ tile operations */

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

/* ---------------------------------------------------------------- kernels */

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

/* D = rowsum(dO * O) for head size 64: 16 bytes of each operand a thread,
 * 64 / n threads a row. On the way, which saves a memset's pass, the
 * mma.sync backward's zero4 16-byte words of scratch are zeroed (its f32 dq
 * accumulator), or the wgmma backward's dqkv q third (qzero, [B, T, 3, NH,
 * 64], where its TMA adds sum dQ), 16 bytes a thread at the place the
 * thread reads dout from. */
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

/* ------------------------------------------------------------- launchers */

void gpc_cuda_attention_mma_forward(gpc_tensor *out, gpc_tensor *lse, const gpc_tensor *qkv,
                                    const att_shape *s, float scale, cudaStream_t st) {
    dim3 grid((unsigned)((s->T + ATT_TILE - 1) / ATT_TILE), (unsigned)(s->B * s->NH));
    if (out->dtype == GPC_BF16)
        att_forward_kernel<gpc_bf16_t><<<grid, ATT_THREADS, 0, st>>>(
            (gpc_bf16_t *)out->data, (float *)lse->data, (const gpc_bf16_t *)qkv->data, s->T, s->NH,
            scale * ATT_LOG2E);
    else
        att_forward_kernel<gpc_f16_t><<<grid, ATT_THREADS, 0, st>>>(
            (gpc_f16_t *)out->data, (float *)lse->data, (const gpc_f16_t *)qkv->data, s->T, s->NH,
            scale * ATT_LOG2E);
}

/* Dispatches over every dtype, as the op's other kernels do, though only
 * bf16 and f16 reach it. */
gpc_status gpc_cuda_attention_mma_dsum(float *dsum, float *zero, int64_t zero4, void *qzero,
                                       const gpc_tensor *dout, const gpc_tensor *out,
                                       const att_shape *s, cudaStream_t st) {
    int64_t rows = (int64_t)s->B * s->NH * s->T;
    GPC_CUDA_DISPATCH(out->dtype, E, {
        att_dsum64_kernel<E>
            <<<gpc_cuda_blocks(rows * (ATT_HS / gpc_pack<E>::n), 256), 256, 0, st>>>(
                dsum, (float4 *)zero, zero4, (E *)qzero, (const E *)dout->data,
                (const E *)out->data, s->B, s->T, s->NH);
    });
    return GPC_OK;
}

void gpc_cuda_attention_mma_backward(gpc_tensor *dqkv, const gpc_tensor *qkv,
                                     const gpc_tensor *dout, const gpc_tensor *lse,
                                     const float *dsum, const att_shape *s, float scale,
                                     cudaStream_t st) {
    unsigned tiles = (unsigned)((s->T + ATT_TILE - 1) / ATT_TILE);
    dim3 grid(tiles, (unsigned)(s->B * s->NH));
    float sl2 = scale * ATT_LOG2E;
    if (dqkv->dtype == GPC_BF16) {
        typedef gpc_bf16_t E;
        att_backward_kv_kernel<E, false><<<grid, ATT_THREADS, 0, st>>>(
            NULL, (E *)dqkv->data, (const E *)qkv->data, (const E *)dout->data,
            (const float *)lse->data, dsum, s->T, s->NH, sl2, scale);
        att_backward_dq_kernel<E><<<grid, ATT_THREADS, 0, st>>>(
            (E *)dqkv->data, (const E *)qkv->data, (const E *)dout->data, (const float *)lse->data,
            dsum, s->T, s->NH, sl2, scale);
    } else {
        typedef gpc_f16_t E;
        att_backward_kv_kernel<E, false><<<grid, ATT_THREADS, 0, st>>>(
            NULL, (E *)dqkv->data, (const E *)qkv->data, (const E *)dout->data,
            (const float *)lse->data, dsum, s->T, s->NH, sl2, scale);
        att_backward_dq_kernel<E><<<grid, ATT_THREADS, 0, st>>>(
            (E *)dqkv->data, (const E *)qkv->data, (const E *)dout->data, (const float *)lse->data,
            dsum, s->T, s->NH, sl2, scale);
    }
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

void gpc_cuda_attention_mma_backward_fused(gpc_tensor *dqkv, const gpc_tensor *qkv,
                                           const gpc_tensor *dout, const gpc_tensor *lse,
                                           float *dq_acc, const float *dsum, const att_shape *s,
                                           float scale, cudaStream_t st) {
    if (dqkv->dtype == GPC_BF16)
        att_fused_backward<gpc_bf16_t>(dqkv, qkv, dout, lse, dq_acc, dsum, s, scale, st);
    else
        att_fused_backward<gpc_f16_t>(dqkv, qkv, dout, lse, dq_acc, dsum, s, scale, st);
}
