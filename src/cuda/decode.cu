/*
 * decode.cu: the fused products of a decode step (ops.h, decode_product):
 * out [N, OC] = epilogue(prologue(inp) @ weight^T + bias) for N <= 16 rows,
 * the weight [OC, C] in the activations' dtype (bf16, f16 or f32), in one
 * kernel.
 *
 * A decode step of one or a few rows reads every weight once and does
 * little else, so a layer's time is that of reading 14 MB (GPT-2 124M in
 * bf16) plus what its kernels cost to start and drain: with a kernel per op
 * (layernorm, product, cache store, ...) the second dominates. This kernel
 * takes a product with what surrounds it in the model:
 *  - prologue: the layernorm of the input rows. Each block computes the
 *    rows' mean and rstd itself (a warp per row, the sums in the order of
 *    layernorm.cu's forward kernel, so the same bits) and, where the rows
 *    fit in shared memory, stores them there normalised and rounded to the
 *    activations' dtype, as the layernorm op would write them; otherwise
 *    (wide rows in f32) each value is normalised as it is read. The first
 *    weight loads are issued before the prologue, so it hides behind them.
 *    With up to 4 rows of at most 1024 bf16 values (dp_prologue_early,
 *    GPC_DECODE_EARLY) a warp reads its row once into registers and the
 *    layernorm's weight and bias come before the wait for the previous
 *    kernel, through shared memory; else three passes over each row;
 *  - epilogue: bias; then a residual (in place allowed) or GELU (of the
 *    product rounded to the dtype, as matmul_gelu's out_gelu); and for
 *    qkv's product, the key and value thirds also stored to their slots of
 *    the paged cache (what kv_store copies).
 * The product streams the weight as the quantized skinny kernel does
 * (matmul_quant.cu): a group of kw warps takes DP_OUTS output channels and
 * splits the depth among its lanes, each lane loading 16 bytes of each
 * channel's row at a time, DP_UNROLL of them in flight, past L1
 * (ld.global.nc.L1::no_allocate: read once); the input rows come from L1
 * (or shared memory) and meet both channels' weights. f32 accumulation,
 * the lanes' sums added by warp shuffles, then the kw warps' in a fixed
 * order: the bits do not depend on timing. Blocks walk the channels on a
 * grid of as many blocks as the multiprocessors hold at once, so the output
 * head's 50304 channels do not repeat the prologue 25,000 times; each block
 * issues its next channels' loads before it reduces and stores the current
 * ones. On Hopper a product launches as a programmatic dependent of the
 * kernel before it (GPC_DECODE_PDL, on by default): its blocks start while
 * that kernel ends and send out their first weight loads, then wait for
 * its writes before reading the input rows, so consecutive products of a
 * layer (proj, fc, fcproj, the next qkv) overlap their ramps.
 * gpc_cuda_decode_calls (decode.h) counts the products run here.
 */
#include "cuda/cuda_common.cuh"
#include "cuda/decode.h"

#include <pthread.h>
#include <stdint.h>

#define DP_THREADS 128
#define DP_WARPS (DP_THREADS / 32)
#define DP_OUTS 2   /* output channels a group computes: each input pack meets both */
#define DP_UNROLL 4 /* 16-byte chunks a lane loads per channel before it multiplies */
/* blocks a multiprocessor must hold at once: 170 registers a thread, which
 * the 16-row kernel needs without spilling (ptxas's own choice for 128
 * threads was 128 registers, and spills) */
#define DP_MIN_BLOCKS 3
/* and for one row five, so that the output head's grid holds as many
 * blocks, and the next product's early blocks fit beside a product's */
#define DP_MIN_BLOCKS_1 5
/* room left beside the staged rows for a kernel's static shared arrays
 * (parts, mean, rstd: at most about 4.2 KiB, the tensor-core kernel's) */
#define DP_STATIC_SMEM (8 << 10)
#define DP_EPS 1e-5f /* layernorm.cu's */
/* dp_prologue_early: 16-byte packs of its row a lane holds (rows of up to
 * 1024 bf16 or 512 f32 values), and 16-byte pieces of the layernorm's
 * weight and bias a thread loads before the wait (the two together up to
 * 4 KiB) */
#define DP_ROW_PACKS 4
#define DP_LN_PIECES 2

/* how the input rows reach the product */
enum { DP_PLAIN = 0, DP_LN_STAGED = 1, DP_LN_INLINE = 2 };

struct dp_params {
    void *out;
    const void *inp, *weight, *residual;
    gpc_cuda_any ln_w, ln_b, bias;
    void *k_cache, *v_cache;
    const int32_t *slots;
    int gelu, ln, vec;
    int M, C, OC, kw, tiles;
    /* dp_prologue_early: bytes of the layernorm's weight (and of its bias),
     * staged after the rows; 0: dp_prologue */
    int ln_bytes;
};

/* 16 weight bytes, read once: past L1, from the read-only path. Volatile,
 * so that the compiler keeps the first loads before the wait for the
 * previous kernel (dp_wait_previous), where they overlap its end. */
__device__ __forceinline__ uint4 dp_stream16(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* gpc_pdl_let_next_start and gpc_pdl_wait_previous (cuda_common.cuh) */
__device__ __forceinline__ void dp_let_next_start(void) {
    gpc_pdl_let_next_start();
}

__device__ __forceinline__ void dp_wait_previous(void) {
    gpc_pdl_wait_previous();
}

/* The chunks c, c + stride, .. (DP_UNROLL of them) of each channel's row,
 * zeros past the last. */
template <typename T>
__device__ __forceinline__ void dp_load_weights(uint4 (&raw)[DP_UNROLL][DP_OUTS],
                                                const T *const (&w)[DP_OUTS], int c, int stride,
                                                int chunks) {
    const int PN = gpc_pack<T>::n;
#pragma unroll
    for (int u = 0; u < DP_UNROLL; u++)
#pragma unroll
        for (int r = 0; r < DP_OUTS; r++)
            raw[u][r] = c + u * stride < chunks ? dp_stream16(w[r] + (int64_t)(c + u * stride) * PN)
                                                : make_uint4(0u, 0u, 0u, 0u);
}

/* A 16-byte pack of T as f32, straight from the loaded words. */
__device__ __forceinline__ void dp_unpack_word(uint32_t u, float *w, const float *) {
    w[0] = __uint_as_float(u);
}
__device__ __forceinline__ void dp_unpack_word(uint32_t u, float *w, const gpc_bf16_t *) {
    w[0] = __uint_as_float(u << 16);
    w[1] = __uint_as_float(u & 0xffff0000u);
}
__device__ __forceinline__ void dp_unpack_word(uint32_t u, float *w, const gpc_f16_t *) {
    w[0] = __half2float(__ushort_as_half((unsigned short)(u & 0xffffu)));
    w[1] = __half2float(__ushort_as_half((unsigned short)(u >> 16)));
}
template <typename T> __device__ __forceinline__ void dp_unpack(uint4 raw, float *w) {
    const int per = 4 / (int)sizeof(T); /* elements a word */
    const T *tag = NULL;
    dp_unpack_word(raw.x, w, tag);
    dp_unpack_word(raw.y, w + per, tag);
    dp_unpack_word(raw.z, w + 2 * per, tag);
    dp_unpack_word(raw.w, w + 3 * per, tag);
}

/* Input x of row m at column k normalised as the layernorm op does (not
 * yet rounded to the dtype). */
__device__ __forceinline__ float dp_normalise(const dp_params &p, float x, float mean, float rstd,
                                              int k) {
    return (x - mean) * rstd * gpc_any_load(p.ln_w, k) + gpc_any_load(p.ln_b, k);
}

/* PN inputs of row m from column k0 (a pack's worth; PN 1 for the scalar
 * path): from xs (inp itself, or the normalised rows in shared memory), or
 * normalised here from inp. */
template <typename T, int PN>
__device__ __forceinline__ void dp_load_x(float *x, const T *xs, const dp_params &p,
                                          const float *mean, const float *rstd, int m, int k0) {
    const T *row = xs + (int64_t)m * p.C + k0;
    if (PN == 1)
        x[0] = gpc_to_f32(row[0]);
    else
        gpc_load_f32<PN>(x, row);
    if (p.ln == DP_LN_INLINE) {
#pragma unroll
        for (int k = 0; k < PN; k++) {
            x[k] = gpc_to_f32(gpc_from_f32<T>(dp_normalise(p, x[k], mean[m], rstd[m], k0 + k)));
        }
    }
}

/* A lane's share of each of a warp's RPW rows' sums (every 32 PER-th run
 * of PER elements from its own): of x, or with SQUARES of (x - mu)^2, in
 * the order of layernorm.cu's forward kernel. */
template <typename T, int PER, int RPW, bool SQUARES>
__device__ __forceinline__ void dp_row_sums(const T *const (&x)[RPW], int C, int lane,
                                            const float (&mu)[RPW], float (&sum)[RPW]) {
    float x8[RPW][PER];
    for (int c = lane * PER; c < C; c += 32 * PER) {
#pragma unroll
        for (int j = 0; j < RPW; j++)
            gpc_load_f32<PER>(x8[j], x[j] + c);
#pragma unroll
        for (int j = 0; j < RPW; j++)
#pragma unroll
            for (int k = 0; k < PER; k++)
                sum[j] += SQUARES ? (x8[j][k] - mu[j]) * (x8[j][k] - mu[j]) : x8[j][k];
    }
}

/* The layernorm statistics of the M rows (warp w takes rows w, w + 4, ..;
 * each row's sums PER elements a lane at a time as layernorm_forward_kernel
 * adds them), and with DP_LN_STAGED the normalised rows, rounded to T, in
 * xs. */
template <typename T, int PER, int MT>
__device__ __forceinline__ void dp_prologue(const dp_params &p, T *xs, float *mean, float *rstd) {
    /* a warp's rows side by side, so that their loads are in flight
     * together; each row's sums in the order of layernorm.cu's */
    const int RPW = (MT + DP_WARPS - 1) / DP_WARPS;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, C = p.C;
    const T *x[RPW];
    float mu[RPW], rs[RPW], x8[RPW][PER];
#pragma unroll
    for (int j = 0; j < RPW; j++) {
        int m = min(warp + j * DP_WARPS, p.M - 1); /* a row past M repeats the last */
        x[j] = (const T *)p.inp + (int64_t)m * C;
        mu[j] = 0.0f, rs[j] = 0.0f;
    }
    dp_row_sums<T, PER, RPW, false>(x, C, lane, mu, mu);
#pragma unroll
    for (int j = 0; j < RPW; j++)
        mu[j] = gpc_warp_sum(mu[j]) / C;
    dp_row_sums<T, PER, RPW, true>(x, C, lane, mu, rs);
#pragma unroll
    for (int j = 0; j < RPW; j++) {
        rs[j] = rsqrtf(gpc_warp_sum(rs[j]) / C + DP_EPS);
        int m = warp + j * DP_WARPS;
        if (lane == 0 && m < p.M) mean[m] = mu[j], rstd[m] = rs[j];
    }
    if (p.ln != DP_LN_STAGED) return;
    for (int c = lane * PER; c < C; c += 32 * PER) {
#pragma unroll
        for (int j = 0; j < RPW; j++)
            gpc_load_f32<PER>(x8[j], x[j] + c);
        float w[PER], b[PER];
#pragma unroll
        for (int k = 0; k < PER; k++)
            w[k] = gpc_any_load(p.ln_w, c + k), b[k] = gpc_any_load(p.ln_b, c + k);
#pragma unroll
        for (int j = 0; j < RPW; j++) {
            int m = warp + j * DP_WARPS;
            if (m >= p.M) break;
#pragma unroll
            for (int k = 0; k < PER; k++)
                x8[j][k] = (x8[j][k] - mu[j]) * rs[j] * w[k] + b[k];
            gpc_store_f32<PER>(xs + (int64_t)m * C + c, x8[j]);
        }
    }
}

/* What the epilogue of row m, channel o adds besides the sum: its bias
 * (a parameter: loaded before the wait for the previous kernel) and its
 * residual (after it), each 0 where there is none. */
__device__ __forceinline__ float dp_bias(const dp_params &p, int o) {
    return p.bias.ptr ? gpc_any_load(p.bias, o) : 0.0f;
}

template <typename T>
__device__ __forceinline__ float dp_residual(const dp_params &p, int m, int o) {
    return p.residual ? gpc_to_f32(((const T *)p.residual)[(int64_t)m * p.OC + o]) : 0.0f;
}

/* Row m, channel o of the product (v, its sum) finished and stored: bias;
 * a residual or GELU; and for qkv's product the key and value thirds also
 * to their slots of the paged cache. bias and residual as dp_bias and
 * dp_residual give them. */
template <typename T>
__device__ __forceinline__ void dp_epilogue(const dp_params &p, int m, int o, float v, float bias,
                                            float residual) {
    if (p.bias.ptr) v += bias;
    int64_t at = (int64_t)m * p.OC + o;
    if (p.residual) v += residual;
    if (p.gelu) v = gpc_gelu(gpc_to_f32(gpc_from_f32<T>(v)));
    T y = gpc_from_f32<T>(v);
    ((T *)p.out)[at] = y;
    int third = p.OC / 3;
    if (p.k_cache && o >= third) {
        int64_t slot = p.slots[m];
        T *cache = (T *)(o < 2 * third ? p.k_cache : p.v_cache);
        cache[slot * third + (o % third)] = y;
    }
}

template <typename T>
__device__ __forceinline__ void dp_epilogue(const dp_params &p, int m, int o, float v) {
    dp_epilogue<T>(p, m, o, v, dp_bias(p, o), dp_residual<T>(p, m, o));
}

/* The layernorm's weight and bias as 16-byte pieces, this thread's share
 * (pieces threadIdx.x, + DP_THREADS, ..: the weight's, then the bias's),
 * loaded before the wait for the previous kernel: they are parameters. */
__device__ __forceinline__ void dp_load_ln(const dp_params &p, uint4 (&ln)[DP_LN_PIECES]) {
    const int half = p.ln_bytes / 16;
#pragma unroll
    for (int q = 0; q < DP_LN_PIECES; q++) {
        int i = (int)threadIdx.x + q * DP_THREADS;
        if (i < 2 * half)
            ln[q] = dp_stream16((const uint4 *)(i < half ? p.ln_w.ptr : p.ln_b.ptr) +
                                (i < half ? i : i - half));
    }
}

/* dp_prologue for rows of at most DP_ROW_PACKS packs a lane and one row a
 * warp (MT <= DP_WARPS), staged (p.ln_bytes > 0): the row read at once
 * into registers, the sums from there in dp_row_sums' order (the same
 * bits), the layernorm's weight and bias (ln, loaded before the wait)
 * through shared memory after the staged rows. One read of the row where
 * dp_prologue makes three passes over it and reads the weights inside
 * the wait. */
template <typename T, int MT>
__device__ __forceinline__ void dp_prologue_early(const dp_params &p, T *xs,
                                                  const uint4 (&ln)[DP_LN_PIECES], float *mean,
                                                  float *rstd) {
    typedef gpc_pack<T> P;
    const int PER = P::n;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, C = p.C;
    const int m = min(warp, p.M - 1); /* a row past M repeats the last */
    const T *x = (const T *)p.inp + (int64_t)m * C;
    P raw[DP_ROW_PACKS];
#pragma unroll
    for (int i = 0; i < DP_ROW_PACKS; i++) {
        int c = (lane + 32 * i) * PER;
        if (c < C) raw[i] = *(const P *)(x + c);
    }
    /* the weight and bias to shared memory while the row is on its way */
    unsigned char *lns = (unsigned char *)(xs + (int64_t)p.M * C);
    const int pieces = 2 * (p.ln_bytes / 16);
#pragma unroll
    for (int q = 0; q < DP_LN_PIECES; q++) {
        int i = (int)threadIdx.x + q * DP_THREADS;
        if (i < pieces) ((uint4 *)lns)[i] = ln[q];
    }
    float mu = 0.0f, rs = 0.0f;
#pragma unroll
    for (int i = 0; i < DP_ROW_PACKS; i++)
        if ((lane + 32 * i) * PER < C)
#pragma unroll
            for (int k = 0; k < PER; k++)
                mu += gpc_to_f32(raw[i].v[k]);
    mu = gpc_warp_sum(mu) / C;
#pragma unroll
    for (int i = 0; i < DP_ROW_PACKS; i++)
        if ((lane + 32 * i) * PER < C)
#pragma unroll
            for (int k = 0; k < PER; k++) {
                float d = gpc_to_f32(raw[i].v[k]);
                rs += (d - mu) * (d - mu);
            }
    rs = rsqrtf(gpc_warp_sum(rs) / C + DP_EPS);
    if (lane == 0 && warp < p.M) mean[warp] = mu, rstd[warp] = rs;
    __syncthreads(); /* the weight and bias in shared memory */
    if (warp >= p.M) return;
    gpc_cuda_any w = p.ln_w, b = p.ln_b;
    w.ptr = lns, b.ptr = lns + p.ln_bytes;
#pragma unroll
    for (int i = 0; i < DP_ROW_PACKS; i++) {
        int c = (lane + 32 * i) * PER;
        if (c >= C) break;
        float y[PER];
#pragma unroll
        for (int k = 0; k < PER; k++)
            y[k] = (gpc_to_f32(raw[i].v[k]) - mu) * rs * gpc_any_load(w, c + k) +
                   gpc_any_load(b, c + k);
        gpc_store_f32<PER>(xs + (int64_t)warp * C + c, y);
    }
}

/* MT: rows the kernel is built for (1, 2, 4, 8 or 16), p.M <= MT of them
 * real. A tile is the DP_WARPS / kw groups' channels of one block. */
template <typename T, int MT>
__global__ void __launch_bounds__(DP_THREADS, MT == 1 ? DP_MIN_BLOCKS_1 : DP_MIN_BLOCKS)
    decode_product_kernel(const dp_params p) {
    typedef gpc_pack<T> P;
    const int PN = P::n;
    extern __shared__ __align__(16) unsigned char dp_dynamic[];
    __shared__ float parts[DP_WARPS][MT * DP_OUTS];
    __shared__ float mean[MT], rstd[MT];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, kw = p.kw;
    int group = warp / kw, turn = (warp % kw) * 32 + lane, stride = kw * 32;
    int per_tile = (DP_WARPS / kw) * DP_OUTS, C = p.C, OC = p.OC;
    int chunks = p.vec ? C / PN : 0, step = stride * DP_UNROLL;
    const T *weight = (const T *)p.weight;
    T *staged = (T *)dp_dynamic;
    const T *xs = p.ln == DP_LN_STAGED ? staged : (const T *)p.inp;

    int tile = blockIdx.x;
    int o0 = tile * per_tile + group * DP_OUTS;
    /* a channel past OC reads the last row (valid memory) and is not stored */
    const T *w[DP_OUTS];
#pragma unroll
    for (int r = 0; r < DP_OUTS; r++)
        w[r] = weight + (int64_t)min(o0 + r, OC - 1) * C;
    uint4 raw[DP_UNROLL][DP_OUTS];
    int c = turn;
    dp_load_weights<T>(raw, w, c, stride, chunks);
    /* the weights are constant: their first loads go out before the wait
     * for the kernel that writes the input rows; the next product may
     * start its own the same way. So do the layernorm's weight and bias
     * and the bias of the channel this lane finishes in the first tile. */
    const bool early = MT <= DP_WARPS && p.ln_bytes > 0;
    uint4 ln[DP_LN_PIECES];
    if (early) dp_load_ln(p, ln);
    const int em = lane / DP_OUTS, eo = o0 + lane % DP_OUTS;
    const bool finisher = warp % kw == 0 && lane < MT * DP_OUTS;
    float bias = finisher && eo < OC ? dp_bias(p, eo) : 0.0f;
    dp_let_next_start();
    dp_wait_previous();
    /* the first tile's residual, on its way during the product */
    float residual = finisher && em < p.M && eo < OC ? dp_residual<T>(p, em, eo) : 0.0f;

    if (p.ln != DP_PLAIN) {
        if (early)
            dp_prologue_early<T, MT>(p, staged, ln, mean, rstd);
        else if (p.vec)
            dp_prologue<T, PN, MT>(p, staged, mean, rstd);
        else
            dp_prologue<T, 1, MT>(p, staged, mean, rstd);
        __syncthreads();
    }
    bool first = true;

    for (;;) {
        float acc[MT][DP_OUTS];
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int r = 0; r < DP_OUTS; r++)
                acc[m][r] = 0.0f;
        while (c < chunks) {
#pragma unroll
            for (int u = 0; u < DP_UNROLL; u++) {
                if (c + u * stride >= chunks) break;
                int k0 = (c + u * stride) * PN;
                float wf[DP_OUTS][PN];
#pragma unroll
                for (int r = 0; r < DP_OUTS; r++)
                    dp_unpack<T>(raw[u][r], wf[r]);
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    if (m >= p.M) break;
                    float x[PN];
                    dp_load_x<T, PN>(x, xs, p, mean, rstd, m, k0);
#pragma unroll
                    for (int r = 0; r < DP_OUTS; r++)
#pragma unroll
                        for (int k = 0; k < PN; k++)
                            acc[m][r] = fmaf(x[k], wf[r][k], acc[m][r]);
                }
            }
            c += step;
            if (c < chunks) dp_load_weights<T>(raw, w, c, stride, chunks);
        }
        /* rows not in whole aligned packs: every element on its own */
        if (!p.vec) {
            for (int k = turn; k < C; k += stride) {
                float wf[DP_OUTS];
#pragma unroll
                for (int r = 0; r < DP_OUTS; r++)
                    wf[r] = gpc_to_f32(w[r][k]);
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    if (m >= p.M) break;
                    float x;
                    dp_load_x<T, 1>(&x, xs, p, mean, rstd, m, k);
#pragma unroll
                    for (int r = 0; r < DP_OUTS; r++)
                        acc[m][r] = fmaf(x, wf[r], acc[m][r]);
                }
            }
        }

        /* the next tile's loads go out before this one's sums are reduced */
        int o_done = o0, next = tile + (int)gridDim.x;
        if (next < p.tiles) {
            tile = next;
            o0 = tile * per_tile + group * DP_OUTS;
#pragma unroll
            for (int r = 0; r < DP_OUTS; r++)
                w[r] = weight + (int64_t)min(o0 + r, OC - 1) * C;
            c = turn;
            dp_load_weights<T>(raw, w, c, stride, chunks);
        }

        /* lane j of the group's first warp ends with row j / DP_OUTS,
         * channel o_done + j % DP_OUTS (MT * DP_OUTS <= 32) */
        float mine = 0.0f;
#pragma unroll
        for (int m = 0; m < MT; m++) {
            if (m >= p.M) break;
#pragma unroll
            for (int r = 0; r < DP_OUTS; r++) {
                float v = gpc_warp_sum(acc[m][r]);
                if (lane == m * DP_OUTS + r) mine = v;
            }
        }
        if (kw > 1) {
            if (lane < MT * DP_OUTS) parts[warp][lane] = mine;
            __syncthreads();
            if (warp % kw == 0) {
                mine = 0.0f;
                for (int q = 0; q < kw; q++)
                    mine += lane < MT * DP_OUTS ? parts[warp + q][lane] : 0.0f;
            }
            __syncthreads(); /* parts is rewritten by the next tile */
        }
        int m = lane / DP_OUTS, o = o_done + lane % DP_OUTS;
        if (finisher && m < p.M && o < OC) {
            if (!first) bias = dp_bias(p, o), residual = dp_residual<T>(p, m, o);
            dp_epilogue<T>(p, m, o, mine, bias, residual);
        }
        first = false;
        if (next >= p.tiles) break;
    }
}

/* ------------------------------------------------ tensor cores (opt-in)
 *
 * With 16 rows the kernel above does 16 FMAs and a conversion per weight
 * element and per row, which at 16 rows takes longer than reading the
 * weight. With GPC_DECODE_MMA=1, products of 5 to 16 rows in bf16 or f16
 * (C a multiple of 32) run on mma.sync.m16n8k16 instead: a warp takes 16
 * output channels (A, 16 x 16 of the weight) against 8 input rows (B) per
 * instruction, f32 accumulators. The sum over the depth does not care in
 * which order its terms come, so A and B may both be permuted the same way
 * along it: lane (g, t) = (lane / 4, lane % 4) loads 16 bytes of weight
 * rows g and g + 8 and of input row g at column 8 t of a 32-column step,
 * and those words go to the slots the instruction's layout gives the lane
 * (columns 2t, 2t+1, 2t+8, 2t+9 of each of two 16-column halves): no
 * shuffle or shared memory on the way. kw warps split the depth as above;
 * the same prologue and epilogue. */
#define DP_MMA_MIN_ROWS 5

__device__ __forceinline__ void dp_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1, const gpc_bf16_t *) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void dp_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1, const gpc_f16_t *) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Two values rounded to T (2 bytes) in one word, the first in the low half
 * (the lower address). */
__device__ __forceinline__ uint32_t dp_pack2(float a, float b, const gpc_bf16_t *) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(a)) |
           ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(b)) << 16);
}
__device__ __forceinline__ uint32_t dp_pack2(float a, float b, const gpc_f16_t *) {
    return (uint32_t)__half_as_ushort(__float2half_rn(a)) |
           ((uint32_t)__half_as_ushort(__float2half_rn(b)) << 16);
}

/* 8 inputs of row m from column k0 as they are stored (2-byte T): from xs,
 * or normalised here from inp (DP_LN_INLINE) and rounded to T. */
template <typename T>
__device__ __forceinline__ uint4 dp_mma_x(const T *xs, const dp_params &p, const float *mean,
                                          const float *rstd, int m, int k0) {
    uint4 v = *(const uint4 *)(xs + (int64_t)m * p.C + k0);
    if (p.ln != DP_LN_INLINE) return v;
    float x[8];
    dp_unpack<T>(v, x);
#pragma unroll
    for (int k = 0; k < 8; k++)
        x[k] = dp_normalise(p, x[k], mean[m], rstd[m], k0 + k);
    const T *tag = NULL;
    v.x = dp_pack2(x[0], x[1], tag);
    v.y = dp_pack2(x[2], x[3], tag);
    v.z = dp_pack2(x[4], x[5], tag);
    v.w = dp_pack2(x[6], x[7], tag);
    return v;
}

/* NT: tiles of 8 rows (1 or 2), p.M <= 8 NT of them real. p.kw warps
 * share a warp tile of 16 channels; a block holds DP_WARPS / kw of them.
 * C % 32 == 0, p.vec. */
template <typename T, int NT>
__global__ void __launch_bounds__(DP_THREADS, DP_MIN_BLOCKS) decode_mma_kernel(const dp_params p) {
    const int MT = 8 * NT;
    extern __shared__ __align__(16) unsigned char dp_dynamic[];
    __shared__ float parts[DP_WARPS][NT * 4][32];
    __shared__ float mean[MT], rstd[MT];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, kw = p.kw;
    int g = lane >> 2, t = lane & 3;
    int group = warp / kw, turn = warp % kw, C = p.C, OC = p.OC;
    int per_tile = (DP_WARPS / kw) * 16, steps = C / 32;
    const T *weight = (const T *)p.weight;
    T *staged = (T *)dp_dynamic;
    const T *xs = p.ln == DP_LN_STAGED ? staged : (const T *)p.inp;
    const T *tag = NULL;

    int tile = blockIdx.x;
    int o0 = tile * per_tile + group * 16;
    const T *wlo = weight + (int64_t)min(o0 + g, OC - 1) * C + 8 * t;
    const T *whi = weight + (int64_t)min(o0 + g + 8, OC - 1) * C + 8 * t;
    uint4 rlo[DP_UNROLL], rhi[DP_UNROLL];
    int s = turn;
#define DP_MMA_LOAD()                                                                              \
    do {                                                                                           \
        _Pragma("unroll") for (int u = 0; u < DP_UNROLL; u++) {                                    \
            int su = s + u * kw;                                                                   \
            rlo[u] = su < steps ? dp_stream16(wlo + (int64_t)su * 32) : make_uint4(0, 0, 0, 0);    \
            rhi[u] = su < steps ? dp_stream16(whi + (int64_t)su * 32) : make_uint4(0, 0, 0, 0);    \
        }                                                                                          \
    } while (0)
    DP_MMA_LOAD();
    dp_let_next_start();
    dp_wait_previous();
    if (p.ln != DP_PLAIN) {
        dp_prologue<T, 8, MT>(p, staged, mean, rstd);
        __syncthreads();
    }
    /* the input rows this lane feeds to B: g and g + 8 (a row past M
     * repeats the last; its column of the product is not stored) */
    int xrow[NT];
#pragma unroll
    for (int j = 0; j < NT; j++)
        xrow[j] = min(8 * j + g, p.M - 1);

    for (;;) {
        float acc[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[j][e] = 0.0f;
        while (s < steps) {
#pragma unroll
            for (int u = 0; u < DP_UNROLL; u++) {
                int su = s + u * kw;
                if (su >= steps) break;
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    uint4 xv = dp_mma_x<T>(xs, p, mean, rstd, xrow[j], su * 32 + 8 * t);
                    dp_mma(acc[j], rlo[u].x, rhi[u].x, rlo[u].y, rhi[u].y, xv.x, xv.y, tag);
                    dp_mma(acc[j], rlo[u].z, rhi[u].z, rlo[u].w, rhi[u].w, xv.z, xv.w, tag);
                }
            }
            s += DP_UNROLL * kw;
            if (s < steps) DP_MMA_LOAD();
        }

        int o_done = o0, next = tile + (int)gridDim.x;
        if (next < p.tiles) {
            tile = next;
            o0 = tile * per_tile + group * 16;
            wlo = weight + (int64_t)min(o0 + g, OC - 1) * C + 8 * t;
            whi = weight + (int64_t)min(o0 + g + 8, OC - 1) * C + 8 * t;
            s = turn;
            DP_MMA_LOAD();
        }
        if (kw > 1) {
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    parts[warp][j * 4 + e][lane] = acc[j][e];
            __syncthreads();
            if (turn == 0) {
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float v = 0.0f;
                        for (int q = 0; q < kw; q++)
                            v += parts[warp + q][j * 4 + e][lane];
                        acc[j][e] = v;
                    }
            }
            __syncthreads(); /* parts is rewritten by the next tile */
        }
        /* acc[j][e]: channel o_done + g (+ 8 for e >= 2), row 8 j + 2 t (+ 1
         * for odd e) */
        if (turn == 0) {
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int o = o_done + g + (e >= 2 ? 8 : 0), m = 8 * j + 2 * t + (e & 1);
                    if (o >= OC || m >= p.M) continue;
                    dp_epilogue<T>(p, m, o, acc[j][e]);
                }
        }
        if (next >= p.tiles) break;
    }
#undef DP_MMA_LOAD
}

/* ------------------------------------------------------------ host side */

static long decode_calls, mma_calls;
static int ln_staging = 1; /* gpc_cuda_decode_set_ln_staging */

extern "C" long gpc_cuda_decode_calls(void) {
    return __atomic_load_n(&decode_calls, __ATOMIC_RELAXED);
}

extern "C" long gpc_cuda_decode_mma_calls(void) {
    return __atomic_load_n(&mma_calls, __ATOMIC_RELAXED);
}

extern "C" int gpc_cuda_decode_set_ln_staging(int on) {
    return __atomic_exchange_n(&ln_staging, on ? 1 : 0, __ATOMIC_RELAXED);
}

/* The most dynamic shared memory a block of this GPU may ask for (less
 * what the kernel's static arrays take), cached per device. */
static size_t staging_limit(void) {
    static size_t limit[GPC_CUDA_MAX_DEVICES];
    int d = 0;
    if (cudaGetDevice(&d) != cudaSuccess || d < 0 || d >= GPC_CUDA_MAX_DEVICES) {
        cudaGetLastError();
        return 48 << 10;
    }
    if (!limit[d]) {
        int optin = 0;
        if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, d) !=
                cudaSuccess ||
            optin < (48 << 10)) {
            cudaGetLastError();
            optin = 48 << 10;
        }
        limit[d] = (size_t)optin - DP_STATIC_SMEM;
    }
    return limit[d];
}

/* A kernel of this file. */
typedef void (*dp_kernel)(const dp_params);

/* What the runtime was told and said per kernel, GPU and shared memory
 * size, kept so that a product asks once (a serving step's products then
 * ask nothing inside a graph capture: the first product of a shape runs
 * before its capture). */
#define DP_KNOWN 64
static struct {
    dp_kernel fn;
    int device, blocks;
    size_t smem;
} known[DP_KNOWN];
static int known_count;
static pthread_mutex_t known_lock = PTHREAD_MUTEX_INITIALIZER;

/* How many blocks of fn with `smem` bytes of dynamic shared memory a
 * multiprocessor of the current GPU holds at once, having let fn ask for
 * that much shared memory (above the 48 KiB default it must be allowed).
 * The grid is that many a multiprocessor (or fewer, one a tile), so every
 * block starts at once and they walk equal shares of the tiles; a second
 * wave would start its shares late. */
static gpc_status resident_blocks(dp_kernel fn, size_t smem, int *out) {
    int d = 0;
    GPC_CUDA_CHECK(cudaGetDevice(&d));
    pthread_mutex_lock(&known_lock);
    for (int i = 0; i < known_count; i++)
        if (known[i].fn == fn && known[i].device == d && known[i].smem == smem) {
            *out = known[i].blocks;
            pthread_mutex_unlock(&known_lock);
            return GPC_OK;
        }
    pthread_mutex_unlock(&known_lock);
    /* the 48 KiB count the kernel's own shared arrays too (under 5 KiB) */
    GPC_TRY(gpc_cuda_allow_shared((const void *)fn, smem, DP_STATIC_SMEM, "decode_product"));
    int blocks = 0;
    GPC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, DP_THREADS, smem));
    if (blocks < 1) blocks = 1;
    pthread_mutex_lock(&known_lock);
    if (known_count < DP_KNOWN) {
        known[known_count].fn = fn, known[known_count].device = d;
        known[known_count].smem = smem, known[known_count].blocks = blocks;
        known_count++;
    }
    pthread_mutex_unlock(&known_lock);
    *out = blocks;
    return GPC_OK;
}

/* Whether products launch as programmatic dependents of the kernel before
 * them: GPC_DECODE_PDL on a GPU of compute capability 9.0 or more (cached
 * per device). */
static int pdl_applies(void) {
    static int enabled = -1;
    return gpc_cuda_setting_flag("GPC_DECODE_PDL", &enabled) && gpc_cuda_pdl_capable();
}

static gpc_status launch(dp_kernel fn, const dp_params &p, size_t smem) {
    int per_sm = 0;
    GPC_TRY(resident_blocks(fn, smem, &per_sm));
    unsigned grid = (unsigned)p.tiles;
    unsigned cap = (unsigned)gpc_cuda_sm_count() * (unsigned)per_sm;
    if (grid > cap) grid = cap;
    if (pdl_applies()) {
        cudaLaunchAttribute attr = {};
        attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(grid);
        cfg.blockDim = dim3(DP_THREADS);
        cfg.dynamicSmemBytes = smem;
        cfg.stream = gpc_cuda_stream();
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
        GPC_CUDA_CHECK(cudaLaunchKernelEx(&cfg, fn, p));
        return GPC_OK;
    }
    fn<<<grid, DP_THREADS, smem, gpc_cuda_stream()>>>(p);
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

/* Whether a layernormed product of N rows takes dp_prologue_early
 * (GPC_DECODE_EARLY): at most a row a warp, the rows in whole packs of at
 * most DP_ROW_PACKS a lane, the layernorm's weight and bias of one dtype,
 * aligned, in whole 16-byte pieces that DP_LN_PIECES a thread hold. The
 * rows' layernorm then reads each row once, and its weight and bias, and
 * the products' bias, before the wait for the previous kernel. */
static int early_applies(int64_t N, int64_t C, int pn, int vec, size_t ln_bytes,
                         const gpc_decode_product_args *a) {
    static int enabled = -1;
    return N <= DP_WARPS && vec && C <= (int64_t)32 * pn * DP_ROW_PACKS && a->ln_bias &&
           a->ln_bias->dtype == a->ln_weight->dtype && ln_bytes % 16 == 0 &&
           2 * ln_bytes <= (size_t)16 * DP_THREADS * DP_LN_PIECES &&
           gpc_cuda_aligned16(a->ln_weight->data) && gpc_cuda_aligned16(a->ln_bias->data) &&
           gpc_cuda_setting_flag("GPC_DECODE_EARLY", &enabled);
}

/* Whether a product of N rows runs on tensor cores: GPC_DECODE_MMA, 5 to
 * 16 rows, 2-byte elements in whole aligned packs, C a multiple of 32. */
static int mma_applies(int64_t N, int64_t C, size_t elem, int vec) {
    static int enabled = -1;
    return N >= DP_MMA_MIN_ROWS && elem == 2 && vec && C % 32 == 0 &&
           gpc_cuda_setting_flag("GPC_DECODE_MMA", &enabled);
}

gpc_status gpc_cuda_decode_product(gpc_tensor *out, const gpc_tensor *inp, const gpc_tensor *weight,
                                   const gpc_decode_product_args *a) {
    const char *op = "decode_product";
    GPC_TRY(gpc_cuda_same_dtype(op, "out", out, "inp", inp));
    GPC_TRY(gpc_cuda_same_dtype(op, "weight", weight, "inp", inp));
    GPC_TRY(gpc_cuda_enter(out));
    int64_t C = inp->shape[inp->ndim - 1], N = C ? gpc_tensor_numel(inp) / C : 0;
    int64_t OC = gpc_tensor_numel(weight) / (C ? C : 1);
    if (N == 0 || OC == 0) return GPC_OK;
    if (C == 0) return gpc_error(GPC_ERR_UNSUPPORTED, "%s: inputs with 0 channels", op);
    if (C > 0x7fffffff || OC > 0x7fffffff)
        return gpc_error(GPC_ERR_UNSUPPORTED, "%s: %lld x %lld weights are beyond 32-bit sizes", op,
                         (long long)OC, (long long)C);
    dp_params p;
    memset(&p, 0, sizeof p);
    p.out = out->data;
    p.inp = inp->data;
    p.weight = weight->data;
    p.residual = a->residual ? a->residual->data : NULL;
    p.ln_w = gpc_cuda_any_of(a->ln_weight);
    p.ln_b = gpc_cuda_any_of(a->ln_bias);
    p.bias = gpc_cuda_any_of(a->bias && a->bias->data ? a->bias : NULL);
    p.k_cache = a->k_cache ? a->k_cache->data : NULL;
    p.v_cache = a->v_cache ? a->v_cache->data : NULL;
    p.slots = a->slots ? (const int32_t *)a->slots->data : NULL;
    p.gelu = a->gelu != 0;
    p.M = (int)N;
    p.C = (int)C;
    p.OC = (int)OC;
    size_t elem = gpc_dtype_size(inp->dtype), smem = 0;
    int pn = (int)(16 / elem);
    p.vec = C % pn == 0 && gpc_cuda_aligned16(inp->data) && gpc_cuda_aligned16(weight->data);
    int chunks = p.vec ? (int)(C / pn) : (int)C;
    /* kw warps share a pair of channels when one warp's lanes would load
     * more than DP_UNROLL chunks each */
    int need = (chunks + 32 * DP_UNROLL - 1) / (32 * DP_UNROLL);
    p.kw = need <= 1 ? 1 : need <= 2 ? 2 : 4;
    int per_tile = (DP_WARPS / p.kw) * DP_OUTS;
    p.tiles = (int)((OC + per_tile - 1) / per_tile);
    if (a->ln_weight) {
        size_t bytes = (size_t)N * (size_t)C * elem;
        int staged = __atomic_load_n(&ln_staging, __ATOMIC_RELAXED) && bytes <= staging_limit();
        p.ln = staged ? DP_LN_STAGED : DP_LN_INLINE;
        if (staged) smem = bytes;
        size_t ln_bytes = (size_t)C * gpc_dtype_size(a->ln_weight->dtype);
        if (staged && early_applies(N, C, pn, p.vec, ln_bytes, a) &&
            bytes + 2 * ln_bytes <= staging_limit()) {
            p.ln_bytes = (int)ln_bytes;
            smem = bytes + 2 * ln_bytes;
        }
    }
    if (mma_applies(N, C, elem, p.vec)) {
        /* a warp tile of 16 channels, a 32-column step of the depth */
        int steps = (int)(C / 32);
        need = (steps + DP_UNROLL - 1) / DP_UNROLL;
        p.kw = need <= 1 ? 1 : need <= 2 ? 2 : 4;
        per_tile = (DP_WARPS / p.kw) * 16;
        p.tiles = (int)((OC + per_tile - 1) / per_tile);
        dp_kernel fn = NULL;
        if (inp->dtype == GPC_BF16)
            fn = N <= 8 ? decode_mma_kernel<gpc_bf16_t, 1> : decode_mma_kernel<gpc_bf16_t, 2>;
        else
            fn = N <= 8 ? decode_mma_kernel<gpc_f16_t, 1> : decode_mma_kernel<gpc_f16_t, 2>;
        GPC_TRY(launch(fn, p, smem));
        __atomic_fetch_add(&decode_calls, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&mma_calls, 1, __ATOMIC_RELAXED);
        return GPC_OK;
    }
    GPC_CUDA_DISPATCH(out->dtype, E, {
        dp_kernel fn = N <= 1   ? decode_product_kernel<E, 1>
                       : N <= 2 ? decode_product_kernel<E, 2>
                       : N <= 4 ? decode_product_kernel<E, 4>
                       : N <= 8 ? decode_product_kernel<E, 8>
                                : decode_product_kernel<E, 16>;
        GPC_TRY(launch(fn, p, smem));
    });
    __atomic_fetch_add(&decode_calls, 1, __ATOMIC_RELAXED);
    return GPC_OK;
}
