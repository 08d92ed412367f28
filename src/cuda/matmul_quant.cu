/*
 * matmul_quant.cu: products with quantized weights on the GPU, for inference
 * (gpc quantize): out = [residual +] inp @ W^T [+ bias] with
 * W[o,c] = q[o,c] * scale (scale per output channel or per tensor), q int8
 * or fp8 E4M3, activations f32, bf16 or f16; and the same followed by GELU
 * (matmul_quant_gelu_forward, fc's product).
 *
 * Decoding a token multiplies one row (a serving step: a few rows) by every
 * weight, so the step's time is the time to read the weights: 8-bit weights
 * are half of bf16's bytes. The paths, each accumulating in f32 and
 * applying the scale once per output:
 *  - up to GPC_QUANT_GEMV_MAX_M rows (default 16): the skinny kernel. A
 *    group of warps takes two output channels and splits the depth among
 *    its lanes; each lane streams 8 weight bytes at a time past L1
 *    (ld.global.nc.L1::no_allocate: they are read once) and decodes them
 *    in registers (int8 by the exponent trick, two operations a weight;
 *    fp8 by the hardware's E4M3x2 -> f16x2 conversion). The input rows, a
 *    few KiB, are read as 16-byte packs through L1 where they stay; each
 *    one meets both channels' weights. GELU, bias and residual are fused
 *    into its store, so fc's product is one kernel as in bf16;
 *  - more rows, or GPC_QUANT_GEMV_MAX_M=0: the earlier kernels. Up to 4
 *    rows a warp per output channel walks its row with 16-byte loads; more
 *    rows run a tiled kernel on CUDA cores (64 x 64 outputs per block, 4 x 4
 *    per thread, the weight tile decoded to f32 in shared memory): correct
 *    for any shape, slower than a tensor-core product (prefill);
 *  - per-tensor fp8 with bf16 activations on Ada or Hopper, more rows than
 *    the skinny kernel takes: cuBLASLt's FP8 product (E4M3 x E4M3 -> bf16),
 *    the weight's scale and the activations' per-tensor scale as its scale
 *    pointers. The activations are quantized first by two small kernels
 *    (their absolute maximum into a scale of amax / 448, then x / scale
 *    rounded to nearest E4M3, both divisions IEEE despite fast math), on
 *    the stream, without a host synchronisation.
 *    Where cuBLASLt offers no algorithm for a shape, the tiled kernel runs
 *    instead.
 * gpc_cuda_quant_lt_calls, gpc_cuda_quant_gemv_calls and
 * gpc_cuda_quant_kernel_calls (quant.h) count the paths taken; the first
 * product of each path says which ran in one log line.
 */
#include "cuda/cuda_common.cuh"
#include "cuda/quant.h"

#include <cublasLt.h>
#include <cuda_fp8.h>
#include <pthread.h>
#include <stdint.h>

static long lt_calls, kernel_calls, lt_refused;

extern "C" long gpc_cuda_quant_lt_calls(void) {
    return __atomic_load_n(&lt_calls, __ATOMIC_RELAXED);
}

extern "C" long gpc_cuda_quant_lt_refused(void) {
    return __atomic_load_n(&lt_refused, __ATOMIC_RELAXED);
}

extern "C" long gpc_cuda_quant_kernel_calls(void) {
    return __atomic_load_n(&kernel_calls, __ATOMIC_RELAXED);
}

/* Counts a product on a path and says once which path quantized products
 * take. */
static void count_path(long *counter, const char *what) {
    if (__atomic_fetch_add(counter, 1, __ATOMIC_RELAXED) == 0)
        gpc_log(GPC_LOG_INFO, "matmul_quant: %s", what);
}

/* One weight byte as f32: int8 as the integer, fp8 E4M3 decoded bit by bit
 * (bias 7, subnormals m * 2^-9), exactly as gpc_f8e4m3_to_f32 on the host.
 * The quantizer never writes E4M3's NaN code, so it is not decoded. */
template <bool FP8> __device__ __forceinline__ float quant_decode(uint8_t b) {
    if (!FP8) return (float)(int8_t)b;
    int e = (b >> 3) & 15, m = b & 7;
    float v = e ? __int_as_float(((e + 120) << 23) | (m << 20)) : (float)m * (1.0f / 512.0f);
    return (b & 0x80) ? -v : v;
}

/* The output of row n, channel o from its f32 sum: scaled, plus bias and
 * residual, rounded once to T. */
template <typename T>
__device__ __forceinline__ void quant_store(T *out, float sum, float scale, gpc_cuda_any bias,
                                            const T *residual, int64_t n, int o, int OC) {
    float v = sum * scale;
    if (bias.ptr) v += gpc_any_load(bias, o);
    int64_t at = n * OC + o;
    if (residual) v += gpc_to_f32(residual[at]);
    out[at] = gpc_from_f32<T>(v);
}

/* ------------------------------------------------------------ a few rows */

#define QGEMV_MAX_ROWS 4
#define QGEMV_WARPS 8

/* vec: C % 16 == 0 and q 16-byte aligned, so each lane loads 16 weights at
 * once; otherwise every weight is loaded on its own. */
template <typename T, bool FP8, int ROWS>
__global__ void __launch_bounds__(32 * QGEMV_WARPS)
    quant_gemv_kernel(T *out, const T *__restrict__ inp, const uint8_t *__restrict__ q,
                      const float *__restrict__ scales, int per_channel, gpc_cuda_any bias,
                      const T *residual, int C, int OC, int vec) {
    int lane = threadIdx.x & 31;
    int o = blockIdx.x * QGEMV_WARPS + (threadIdx.x >> 5);
    if (o >= OC) return; /* the whole warp: o is the warp's */
    const uint8_t *w = q + (int64_t)o * C;
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++)
        acc[r] = 0.0f;
    int c0 = 0;
    if (vec) {
        int packs = C / 16;
        for (int p = lane; p < packs; p += 32) {
            uint4 raw = ((const uint4 *)w)[p];
            const uint8_t *bytes = (const uint8_t *)&raw;
            float wf[16];
#pragma unroll
            for (int k = 0; k < 16; k++)
                wf[k] = quant_decode<FP8>(bytes[k]);
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                const T *x = inp + (int64_t)r * C + (int64_t)p * 16;
#pragma unroll
                for (int k = 0; k < 16; k++)
                    acc[r] += wf[k] * gpc_to_f32(x[k]);
            }
        }
        c0 = packs * 16;
    }
    for (int c = c0 + lane; c < C; c += 32) {
        float wf = quant_decode<FP8>(w[c]);
#pragma unroll
        for (int r = 0; r < ROWS; r++)
            acc[r] += wf * gpc_to_f32(inp[(int64_t)r * C + c]);
    }
    float scale = scales[per_channel ? o : 0];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        float sum = gpc_warp_sum(acc[r]);
        if (lane == 0) quant_store<T>(out, sum, scale, bias, residual, r, o, OC);
    }
}

/* ------------------------------------------------------------ many rows */

#define QT_BM 64 /* rows of inp per block */
#define QT_BN 64 /* output channels per block */
#define QT_BK 16 /* depth of a shared-memory tile */

/* 256 threads as 16 x 16, each computing 4 rows x 4 channels. */
template <typename T, bool FP8>
__global__ void __launch_bounds__(256)
    quant_tiled_kernel(T *out, const T *__restrict__ inp, const uint8_t *__restrict__ q,
                       const float *__restrict__ scales, int per_channel, gpc_cuda_any bias,
                       const T *residual, int N, int C, int OC) {
    __shared__ float xs[QT_BK][QT_BM + 4];
    __shared__ float ws[QT_BK][QT_BN + 4];
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    int64_t row0 = (int64_t)blockIdx.y * QT_BM;
    int col0 = blockIdx.x * QT_BN;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < C; k0 += QT_BK) {
        for (int i = threadIdx.x; i < QT_BM * QT_BK; i += 256) {
            int r = i / QT_BK, k = i % QT_BK, c = k0 + k;
            int64_t n = row0 + r;
            int o = col0 + r;
            xs[k][r] = n < N && c < C ? gpc_to_f32(inp[n * C + c]) : 0.0f;
            ws[k][r] = o < OC && c < C ? quant_decode<FP8>(q[(int64_t)o * C + c]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < QT_BK; k++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                a[i] = xs[k][ty * 4 + i];
                b[i] = ws[k][tx * 4 + i];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int64_t n = row0 + ty * 4 + i;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int o = col0 + tx * 4 + j;
            if (n < N && o < OC)
                quant_store<T>(out, acc[i][j], scales[per_channel ? o : 0], bias, residual, n, o,
                               OC);
        }
    }
}

template <bool FP8>
static gpc_status run_kernels(gpc_tensor *out, const gpc_tensor *inp, const gpc_tensor *qweight,
                              const gpc_tensor *scales, const gpc_tensor *bias,
                              const gpc_tensor *residual, int64_t N, int C, int OC) {
    const uint8_t *q = (const uint8_t *)qweight->data;
    const float *s = (const float *)scales->data;
    int per_channel = gpc_tensor_numel(scales) != 1;
    gpc_cuda_any b = gpc_cuda_any_of(bias && bias->data ? bias : NULL);
    int vec = C % 16 == 0 && gpc_cuda_aligned16(q);
    cudaStream_t st = gpc_cuda_stream();
    GPC_CUDA_DISPATCH(out->dtype, E, {
        E *o = (E *)out->data;
        const E *x = (const E *)inp->data;
        const E *r = residual && residual->data ? (const E *)residual->data : NULL;
        if (N <= QGEMV_MAX_ROWS) {
            unsigned grid = gpc_cuda_blocks(OC, QGEMV_WARPS);
            switch (N) {
            case 1:
                quant_gemv_kernel<E, FP8, 1>
                    <<<grid, 32 * QGEMV_WARPS, 0, st>>>(o, x, q, s, per_channel, b, r, C, OC, vec);
                break;
            case 2:
                quant_gemv_kernel<E, FP8, 2>
                    <<<grid, 32 * QGEMV_WARPS, 0, st>>>(o, x, q, s, per_channel, b, r, C, OC, vec);
                break;
            case 3:
                quant_gemv_kernel<E, FP8, 3>
                    <<<grid, 32 * QGEMV_WARPS, 0, st>>>(o, x, q, s, per_channel, b, r, C, OC, vec);
                break;
            default:
                quant_gemv_kernel<E, FP8, 4>
                    <<<grid, 32 * QGEMV_WARPS, 0, st>>>(o, x, q, s, per_channel, b, r, C, OC, vec);
                break;
            }
        } else {
            dim3 grid((unsigned)((OC + QT_BN - 1) / QT_BN), (unsigned)((N + QT_BM - 1) / QT_BM));
            quant_tiled_kernel<E, FP8>
                <<<grid, 256, 0, st>>>(o, x, q, s, per_channel, b, r, (int)N, C, OC);
        }
    });
    GPC_CUDA_CHECK_LAUNCH();
    count_path(&kernel_calls, "quantized weights in gpc's dequantizing kernels (f32 accumulation)");
    return GPC_OK;
}

/* ------------------------------------------------ skinny products
 *
 * Up to QSK_MAX_ROWS rows of inp against the whole weight, which is the
 * traffic. A block of QSK_THREADS threads holds 4 / kw groups of kw warps;
 * a group computes QSK_OUTS output channels for every row, its 32 * kw
 * lanes taking turns over the depth in chunks of 8 (kw grows with the depth
 * so that each lane has a few chunks and enough loads are in flight: a
 * product of few channels and great depth, such as fcproj's 768 x 3072,
 * would otherwise leave most SMs idle). The lanes' sums meet by warp
 * shuffles, then the kw warps' in shared memory, added in a fixed order:
 * the result does not depend on timing.
 *
 * A lane takes 8 weight bytes, not 16: its 8 inputs are then one 16-byte
 * bf16 pack, and the warp's packs are contiguous, so L1 serves them whole
 * (with 16 weights a lane would need two packs 32 bytes apart, half of each
 * wavefront wasted); 256 bytes a warp instruction still fill whole
 * sectors. The inputs are read from L1 rather than staged in shared memory
 * as f32: half the bytes, no barrier before the first weight load, and no
 * tiling of the depth (16 rows of d48's 6400 channels are 400 KiB in f32). */
#define QSK_MAX_ROWS 16
#define QSK_THREADS 128
#define QSK_OUTS 2   /* output channels a group computes: each input pack meets both */
#define QSK_UNROLL 4 /* chunks a lane loads before it multiplies */

/* 8 weight bytes, read once: past L1, from the read-only path. */
__device__ __forceinline__ uint2 quant_stream8(const uint8_t *p) {
    uint2 v;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

/* Four int8 of a word as f32: byte ^ 0x80 (q + 128, 0..255) placed as the
 * mantissa of 2^23 (exponent byte 0x4B) gives 2^23 + q + 128 exactly, one
 * subtraction from q. Two operations a weight, where I2F runs at a quarter
 * of the FMA rate. */
__device__ __forceinline__ void quant_i8x4(uint32_t word, float *w) {
    uint32_t u = word ^ 0x80808080u;
    w[0] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7540)) - 8388736.0f;
    w[1] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7541)) - 8388736.0f;
    w[2] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7542)) - 8388736.0f;
    w[3] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7543)) - 8388736.0f;
}

/* Four E4M3 of a word as f32, two at a time through f16 (exact: every
 * E4M3 value, subnormals included, is an f16 value). */
__device__ __forceinline__ void quant_f8x4(uint32_t word, float *w) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(
            (__nv_fp8x2_storage_t)((word >> (16 * h)) & 0xffffu), __NV_E4M3);
        float2 f = __half22float2(__half2(raw));
        w[2 * h] = f.x;
        w[2 * h + 1] = f.y;
    }
}

template <bool FP8> __device__ __forceinline__ void quant_decode8(uint2 raw, float *w) {
    if (FP8) {
        quant_f8x4(raw.x, w);
        quant_f8x4(raw.y, w + 4);
    } else {
        quant_i8x4(raw.x, w);
        quant_i8x4(raw.y, w + 4);
    }
}

/* 8 activations at p (16-byte aligned) as f32: one 16-byte pack of bf16 or
 * f16, two of f32. */
template <typename T> __device__ __forceinline__ void quant_load_x8(const T *p, float *x) {
    typedef gpc_pack<T> P;
#pragma unroll
    for (int i = 0; i < 8 / P::n; i++) {
        P v = ((const P *)p)[i];
#pragma unroll
        for (int k = 0; k < P::n; k++)
            x[i * P::n + k] = gpc_to_f32(v.v[k]);
    }
}

/* MT: rows the kernel is built for (1, 2, 4, 8 or 16), M <= MT of them
 * real. vec: C % 8 == 0, q 8-byte and inp 16-byte aligned; otherwise every
 * weight is read on its own (the same sums, slower). out_pre: the GELU
 * variant (out = gelu(pre), pre kept in out_pre, as gemv_kernel in
 * matmul.cu). residual may be out. */
template <typename T, bool FP8, int MT>
__global__ void __launch_bounds__(QSK_THREADS)
    quant_skinny_kernel(T *out, T *out_pre, const T *__restrict__ inp,
                        const uint8_t *__restrict__ q, const float *__restrict__ scales,
                        int per_channel, gpc_cuda_any bias, const T *residual, int M, int C, int OC,
                        int kw, int vec) {
    __shared__ float parts[QSK_THREADS / 32][MT * QSK_OUTS];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int group = warp / kw, turn = (warp % kw) * 32 + lane, stride = kw * 32;
    int o0 = (blockIdx.x * ((QSK_THREADS / 32) / kw) + group) * QSK_OUTS;
    /* a channel past OC reads the last row (valid memory) and is not stored */
    const uint8_t *w[QSK_OUTS];
#pragma unroll
    for (int r = 0; r < QSK_OUTS; r++)
        w[r] = q + (int64_t)min(o0 + r, OC - 1) * C;
    float acc[MT][QSK_OUTS];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int r = 0; r < QSK_OUTS; r++)
            acc[m][r] = 0.0f;

    int chunks = vec ? C / 8 : 0;
    for (int c = turn; c < chunks; c += stride * QSK_UNROLL) {
        uint2 raw[QSK_UNROLL][QSK_OUTS];
#pragma unroll
        for (int u = 0; u < QSK_UNROLL; u++)
#pragma unroll
            for (int r = 0; r < QSK_OUTS; r++)
                raw[u][r] = c + u * stride < chunks
                                ? quant_stream8(w[r] + (int64_t)(c + u * stride) * 8)
                                : make_uint2(0u, 0u);
#pragma unroll
        for (int u = 0; u < QSK_UNROLL; u++) {
            if (c + u * stride >= chunks) break;
            int k0 = (c + u * stride) * 8;
            float wf[QSK_OUTS][8];
#pragma unroll
            for (int r = 0; r < QSK_OUTS; r++)
                quant_decode8<FP8>(raw[u][r], wf[r]);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                if (m >= M) break;
                float x[8];
                quant_load_x8<T>(inp + (int64_t)m * C + k0, x);
#pragma unroll
                for (int r = 0; r < QSK_OUTS; r++)
#pragma unroll
                    for (int k = 0; k < 8; k++)
                        acc[m][r] = fmaf(x[k], wf[r][k], acc[m][r]);
            }
        }
    }
    /* what the packs left: the last C % 8 channels, or all of them */
    for (int k = chunks * 8 + turn; k < C; k += stride) {
        float wf[QSK_OUTS];
#pragma unroll
        for (int r = 0; r < QSK_OUTS; r++)
            wf[r] = quant_decode<FP8>(w[r][k]);
#pragma unroll
        for (int m = 0; m < MT; m++) {
            if (m >= M) break;
            float x = gpc_to_f32(inp[(int64_t)m * C + k]);
#pragma unroll
            for (int r = 0; r < QSK_OUTS; r++)
                acc[m][r] = fmaf(x, wf[r], acc[m][r]);
        }
    }

    /* lane j of the group's first warp ends with output j: row j / QSK_OUTS,
     * channel o0 + j % QSK_OUTS (MT * QSK_OUTS <= 32) */
    float mine = 0.0f;
#pragma unroll
    for (int m = 0; m < MT; m++) {
        if (m >= M) break;
#pragma unroll
        for (int r = 0; r < QSK_OUTS; r++) {
            float v = gpc_warp_sum(acc[m][r]);
            if (lane == m * QSK_OUTS + r) mine = v;
        }
    }
    if (kw > 1) {
        if (lane < MT * QSK_OUTS) parts[warp][lane] = mine;
        __syncthreads();
        if (warp % kw != 0) return;
        mine = 0.0f;
        for (int p = 0; p < kw; p++)
            mine += lane < MT * QSK_OUTS ? parts[warp + p][lane] : 0.0f;
    }
    int m = lane / QSK_OUTS, o = o0 + lane % QSK_OUTS;
    if (lane >= MT * QSK_OUTS || m >= M || o >= OC) return;
    float v = mine * scales[per_channel ? o : 0];
    if (bias.ptr) v += gpc_any_load(bias, o);
    int64_t at = (int64_t)m * OC + o;
    if (residual) v += gpc_to_f32(residual[at]);
    if (out_pre) {
        out_pre[at] = gpc_from_f32<T>(v);
        v = gpc_gelu(gpc_to_f32(gpc_from_f32<T>(v))); /* GELU of the stored pre-activation */
    }
    out[at] = gpc_from_f32<T>(v);
}

static long gemv_calls;
static int gemv_max_rows = -1; /* GPC_QUANT_GEMV_MAX_M, read at the first product */

extern "C" long gpc_cuda_quant_gemv_calls(void) {
    return __atomic_load_n(&gemv_calls, __ATOMIC_RELAXED);
}

extern "C" int gpc_cuda_quant_set_gemv_max_rows(int rows) {
    int before = __atomic_exchange_n(&gemv_max_rows, rows, __ATOMIC_RELAXED);
    return before < 0 ? (int)gpc_setting_int("GPC_QUANT_GEMV_MAX_M") : before;
}

static int skinny_applies(int64_t N) {
    int limit = __atomic_load_n(&gemv_max_rows, __ATOMIC_RELAXED);
    if (limit < 0) {
        limit = (int)gpc_setting_int("GPC_QUANT_GEMV_MAX_M");
        __atomic_store_n(&gemv_max_rows, limit, __ATOMIC_RELAXED);
    }
    if (limit > QSK_MAX_ROWS) limit = QSK_MAX_ROWS;
    return N >= 1 && N <= limit;
}

template <bool FP8, typename E>
static void launch_skinny(E *o, E *pre, const E *x, const uint8_t *q, const float *s,
                          int per_channel, gpc_cuda_any b, const E *r, int M, int C, int OC) {
    int vec = C % 8 == 0 && ((uintptr_t)q & 7) == 0 && gpc_cuda_aligned16(x);
    int chunks = vec ? C / 8 : C;
    /* 2 warps on a pair of channels from 1024 channels of depth on, 4 from
     * 4096: each lane keeps at least 2 chunks */
    int kw = chunks >= 512 ? 4 : chunks >= 128 ? 2 : 1;
    int per_block = (QSK_THREADS / 32) / kw * QSK_OUTS;
    unsigned grid = (unsigned)((OC + per_block - 1) / per_block);
    cudaStream_t st = gpc_cuda_stream();
#define QSK_LAUNCH(MT)                                                                             \
    quant_skinny_kernel<E, FP8, MT>                                                                \
        <<<grid, QSK_THREADS, 0, st>>>(o, pre, x, q, s, per_channel, b, r, M, C, OC, kw, vec)
    if (M <= 1)
        QSK_LAUNCH(1);
    else if (M <= 2)
        QSK_LAUNCH(2);
    else if (M <= 4)
        QSK_LAUNCH(4);
    else if (M <= 8)
        QSK_LAUNCH(8);
    else
        QSK_LAUNCH(16);
#undef QSK_LAUNCH
}

/* The skinny kernel on any of the activation dtypes; out_pre for GELU. */
static gpc_status run_skinny(gpc_tensor *out, gpc_tensor *out_pre, const gpc_tensor *inp,
                             const gpc_tensor *qweight, const gpc_tensor *scales,
                             const gpc_tensor *bias, const gpc_tensor *residual, int N, int C,
                             int OC) {
    const uint8_t *q = (const uint8_t *)qweight->data;
    const float *s = (const float *)scales->data;
    int per_channel = gpc_tensor_numel(scales) != 1;
    int fp8 = qweight->dtype == GPC_F8E4M3;
    gpc_cuda_any b = gpc_cuda_any_of(bias && bias->data ? bias : NULL);
    GPC_CUDA_DISPATCH(out->dtype, E, {
        E *o = (E *)out->data;
        E *pre = out_pre ? (E *)out_pre->data : NULL;
        const E *x = (const E *)inp->data;
        const E *r = residual && residual->data ? (const E *)residual->data : NULL;
        if (fp8)
            launch_skinny<true, E>(o, pre, x, q, s, per_channel, b, r, N, C, OC);
        else
            launch_skinny<false, E>(o, pre, x, q, s, per_channel, b, r, N, C, OC);
    });
    GPC_CUDA_CHECK_LAUNCH();
    count_path(&gemv_calls, "quantized weights of a few rows in gpc's skinny kernel (8-bit "
                            "streaming loads, f32 accumulation)");
    return GPC_OK;
}

/* ------------------------------------------------- fp8 on cuBLASLt */

#define QUANT_LT_WORKSPACE ((size_t)8 << 20)
#define QUANT_LT_CACHE 64
/* where the activations' scale and their E4M3 copy sit in the scratch */
#define QUANT_ACT_OFFSET 256

typedef struct {
    int device, m, n, k, bias, residual;
    int align_a, align_b, align_c, align_d, align_bias; /* of the pointers, up to 256 bytes */
} lt_key;

typedef struct {
    lt_key key;
    cublasLtMatmulAlgo_t algo;
    int used; /* 1: algo valid; 2: cuBLASLt has none for this key */
} lt_entry;

typedef struct {
    cublasLtHandle_t handle;
    void *workspace;
    int capable; /* compute capability 8.9 or more */
} lt_device;

static lt_device *lt_devices[GPC_CUDA_MAX_DEVICES];
static lt_entry lt_cache[QUANT_LT_CACHE];
static int lt_next;
static pthread_mutex_t lt_lock = PTHREAD_MUTEX_INITIALIZER;

/* The current GPU's handle and workspace, made at the first fp8 product;
 * NULL (with GPC_OK) when the GPU has no FP8 tensor cores. */
static gpc_status lt_state(lt_device **out, int *device) {
    *out = NULL;
    GPC_CUDA_CHECK(cudaGetDevice(device));
    if (*device < 0 || *device >= GPC_CUDA_MAX_DEVICES) return GPC_OK;
    pthread_mutex_lock(&lt_lock);
    gpc_status status = GPC_OK;
    lt_device *d = lt_devices[*device];
    if (!d) {
        int major = 0, minor = 0;
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, *device);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, *device);
        d = (lt_device *)calloc(1, sizeof *d);
        if (!d) {
            status = gpc_error(GPC_ERR_NOMEM, "matmul_quant: out of host memory");
        } else {
            d->capable = major * 10 + minor >= 89;
            if (d->capable && cublasLtCreate(&d->handle) != CUBLAS_STATUS_SUCCESS) d->capable = 0;
            if (d->capable && cudaMalloc(&d->workspace, QUANT_LT_WORKSPACE) != cudaSuccess) {
                cudaGetLastError();
                cublasLtDestroy(d->handle);
                d->capable = 0; /* the kernels need no workspace */
            }
            lt_devices[*device] = d;
        }
    }
    pthread_mutex_unlock(&lt_lock);
    if (status == GPC_OK && d && d->capable) *out = d;
    return status;
}

/* The largest power of two up to 256 dividing the address: cuBLASLt's
 * heuristic assumes 256-byte alignment unless told, and per-layer views
 * of the weights and activations are only 16-byte aligned. */
static int lt_alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int align = 256;
    while (align > 1 && (a % align) != 0)
        align >>= 1;
    return align;
}

static int lt_applies(const gpc_tensor *out, const gpc_tensor *inp, const gpc_tensor *qweight,
                      const gpc_tensor *scales, const gpc_tensor *bias, const gpc_tensor *residual,
                      int64_t N, int64_t C, int64_t OC) {
    static int enabled = -1;
    return qweight->dtype == GPC_F8E4M3 && gpc_tensor_numel(scales) == 1 &&
           inp->dtype == GPC_BF16 && out->dtype == GPC_BF16 && N > QGEMV_MAX_ROWS &&
           N <= 0x7fffffff && C % 16 == 0 && OC % 16 == 0 &&
           (!bias || !bias->data || bias->dtype == GPC_BF16) && gpc_cuda_aligned16(out->data) &&
           gpc_cuda_aligned16(inp->data) && gpc_cuda_aligned16(qweight->data) &&
           (!bias || !bias->data || gpc_cuda_aligned16(bias->data)) &&
           (!residual || !residual->data || gpc_cuda_aligned16(residual->data)) &&
           gpc_cuda_setting_flag("GPC_QUANT_FP8_LT", &enabled);
}

/* amax of x over one block into scale[0] = amax / 448 (1 when x is all
 * zeros, so the quantized copy is zeros too). Both divisions, here and in
 * act_quant_kernel, round as IEEE (__fdiv_rn): --use_fast_math makes '/'
 * approximate (div.approx, within 2 ulp), and a quotient on or next to the
 * midpoint of two E4M3 values may then round to the other one. x and amax
 * are both bf16, so for some amax dozens of x's values (hundreds of
 * activations) give quotients on or within 2 ulp of a midpoint; each would
 * move a whole E4M3 step (up to 32/448 of amax) from the quantization that
 * gpc_f32_to_f8e4m3(x / scale) defines. */
template <typename T>
__global__ void __launch_bounds__(1024) act_scale_kernel(float *scale, const T *x, int64_t n) {
    __shared__ float shared[32];
    float m = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        m = fmaxf(m, fabsf(gpc_to_f32(x[i])));
    m = gpc_warp_max(m);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) shared[warp] = m;
    __syncthreads();
    if (warp == 0) {
        m = lane < (int)(blockDim.x >> 5) ? shared[lane] : 0.0f;
        m = gpc_warp_max(m);
        if (lane == 0) scale[0] = m > 0.0f ? __fdiv_rn(m, GPC_F8E4M3_MAX) : 1.0f;
    }
}

/* xq = x / scale rounded to nearest E4M3, ties to even, as
 * gpc_f32_to_f8e4m3 (|x| / scale <= 448 by the scale's choice; the
 * conversion saturates anyway). */
template <typename T>
__global__ void act_quant_kernel(__nv_fp8_e4m3 *xq, const T *x, const float *scale, int64_t n) {
    float s = scale[0];
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        xq[i] = __nv_fp8_e4m3(__fdiv_rn(gpc_to_f32(x[i]), s));
}

/* The product on cuBLASLt's FP8 tensor cores; *ran = 0 (and nothing
 * queued) when cuBLASLt has no algorithm for the shape. In cuBLASLt's
 * column-major terms: D [OC, N] = A^T B with A = the weight [C, OC] (ld C)
 * and B = the quantized activations [C, N] (ld C), the "TN" layout FP8
 * requires; C (the residual) and D are bf16 [OC, N] (ld OC). */
static gpc_status lt_fp8(lt_device *d, int device, gpc_tensor *out, const gpc_tensor *inp,
                         const gpc_tensor *qweight, const gpc_tensor *scales,
                         const gpc_tensor *bias, const gpc_tensor *residual, int N, int C, int OC,
                         int *ran) {
    *ran = 0;
    gpc_status status = GPC_OK;
    void *scratch = NULL;
    GPC_TRY(gpc_cuda_scratch(QUANT_ACT_OFFSET + (size_t)N * (size_t)C, &scratch));
    float *act_scale = (float *)scratch;
    __nv_fp8_e4m3 *xq = (__nv_fp8_e4m3 *)((char *)scratch + QUANT_ACT_OFFSET);
    const void *bias_ptr = bias && bias->data ? bias->data : NULL;
    const void *res_ptr = residual && residual->data ? residual->data : NULL;
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
    cublasLtEpilogue_t epilogue = bias_ptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    cudaDataType_t bf16 = CUDA_R_16BF;
    const void *a_scale = scales->data;
    const void *b_scale = act_scale;
    float alpha = 1.0f, beta = res_ptr ? 1.0f : 0.0f;
    const void *c_ptr = res_ptr ? res_ptr : out->data;
    lt_key key = {device,
                  OC,
                  N,
                  C,
                  bias_ptr != NULL,
                  res_ptr != NULL,
                  lt_alignment(qweight->data),
                  lt_alignment(xq),
                  lt_alignment(c_ptr),
                  lt_alignment(out->data),
                  bias_ptr ? lt_alignment(bias_ptr) : 256};
    cublasLtMatmulAlgo_t algo;
    memset(&algo, 0, sizeof algo);
    int found = 0;
    GPC_LT_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    GPC_LT_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    GPC_LT_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    GPC_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                &a_scale, sizeof a_scale));
    GPC_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                &b_scale, sizeof b_scale));
    GPC_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                sizeof epilogue));
    if (bias_ptr) {
        GPC_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &bias_ptr, sizeof bias_ptr));
        GPC_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                    &bf16, sizeof bf16));
    }
    GPC_LT_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, C, OC, C));
    GPC_LT_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, C, N, C));
    GPC_LT_CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, OC, N, OC));
    GPC_LT_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, OC, N, OC));

    /* the algorithm: cached per shape, since the heuristic's query costs
     * more than a decode step's product */
    pthread_mutex_lock(&lt_lock);
    for (int i = 0; i < QUANT_LT_CACHE; i++)
        if (lt_cache[i].used && memcmp(&lt_cache[i].key, &key, sizeof key) == 0) {
            found = lt_cache[i].used;
            algo = lt_cache[i].algo;
            break;
        }
    pthread_mutex_unlock(&lt_lock);
    if (!found) {
        cublasLtMatmulHeuristicResult_t result;
        int count = 0;
        size_t ws = QUANT_LT_WORKSPACE;
        GPC_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        uint32_t al_a = (uint32_t)key.align_a, al_b = (uint32_t)key.align_b;
        uint32_t al_c = (uint32_t)key.align_c, al_d = (uint32_t)key.align_d;
        GPC_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
        GPC_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
        GPC_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
        GPC_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
        GPC_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d));
        if (cublasLtMatmulAlgoGetHeuristic(d->handle, desc, la, lb, lc, ld, pref, 1, &result,
                                           &count) != CUBLAS_STATUS_SUCCESS ||
            count < 1)
            found = 2;
        else
            found = 1, algo = result.algo;
        pthread_mutex_lock(&lt_lock);
        lt_entry *e = &lt_cache[lt_next];
        lt_next = (lt_next + 1) % QUANT_LT_CACHE;
        e->key = key;
        e->algo = algo;
        e->used = found;
        pthread_mutex_unlock(&lt_lock);
    }
    if (found != 1) goto done; /* no algorithm: the caller's kernels run */
    {
        cudaStream_t st = gpc_cuda_stream();
        int64_t n = (int64_t)N * C;
        act_scale_kernel<gpc_bf16_t>
            <<<1, 1024, 0, st>>>(act_scale, (const gpc_bf16_t *)inp->data, n);
        act_quant_kernel<gpc_bf16_t>
            <<<gpc_cuda_blocks(n, 256) < 4096 ? gpc_cuda_blocks(n, 256) : 4096, 256, 0, st>>>(
                xq, (const gpc_bf16_t *)inp->data, act_scale, n);
        if (cudaGetLastError() != cudaSuccess) {
            status = gpc_error(GPC_ERR_DEVICE, "matmul_quant: quantizing the activations failed");
            goto done;
        }
        cublasStatus_t lt =
            cublasLtMatmul(d->handle, desc, &alpha, qweight->data, la, xq, lb, &beta, c_ptr, lc,
                           out->data, ld, &algo, d->workspace, QUANT_LT_WORKSPACE, st);
        if (lt == CUBLAS_STATUS_NOT_SUPPORTED) {
            /* cuBLASLt offered an algorithm and then refused the call (seen
             * with the residual as C on one cuBLAS): remember the shape and
             * let gpc's kernel run this product and the next of this shape */
            pthread_mutex_lock(&lt_lock);
            for (int i = 0; i < QUANT_LT_CACHE; i++)
                if (lt_cache[i].used && memcmp(&lt_cache[i].key, &key, sizeof key) == 0)
                    lt_cache[i].used = 2;
            pthread_mutex_unlock(&lt_lock);
            if (__atomic_fetch_add(&lt_refused, 1, __ATOMIC_RELAXED) == 0)
                gpc_log(GPC_LOG_INFO,
                        "matmul_quant: cuBLASLt refused an FP8 product of %d x %d x %d%s%s; "
                        "gpc's kernel runs it",
                        N, C, OC, res_ptr ? " with a residual" : "", bias_ptr ? " and a bias" : "");
            goto done;
        }
        GPC_LT_CHECK(lt);
        *ran = 1;
    }
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (desc) cublasLtMatmulDescDestroy(desc);
    return status;
}

/* Sizes of a product from its tensors; *skip when there is nothing to do. */
static gpc_status quant_dims(const char *op, const gpc_tensor *inp, const gpc_tensor *qweight,
                             int64_t *N, int64_t *C, int64_t *OC, int *skip) {
    *C = inp->shape[inp->ndim - 1];
    *N = *C ? gpc_tensor_numel(inp) / *C : 0;
    *OC = gpc_tensor_numel(qweight) / (*C ? *C : 1);
    *skip = 0;
    if (*C > 0x7fffffff || *OC > 0x7fffffff)
        return gpc_error(GPC_ERR_UNSUPPORTED, "%s: %lld x %lld weights are beyond 32-bit sizes", op,
                         (long long)*OC, (long long)*C);
    if (*N == 0 || *OC == 0) {
        *skip = 1;
        return GPC_OK;
    }
    if (*C == 0) return gpc_error(GPC_ERR_UNSUPPORTED, "%s: inputs with 0 channels", op);
    return GPC_OK;
}

gpc_status gpc_cuda_matmul_quant_forward(gpc_tensor *out, const gpc_tensor *inp,
                                         const gpc_tensor *qweight, const gpc_tensor *scales,
                                         const gpc_tensor *bias, const gpc_tensor *residual) {
    const char *op = "matmul_quant_forward";
    GPC_TRY(gpc_cuda_same_dtype(op, "out", out, "inp", inp));
    GPC_TRY(gpc_cuda_enter(out));
    int64_t N, C, OC;
    int skip;
    GPC_TRY(quant_dims(op, inp, qweight, &N, &C, &OC, &skip));
    if (skip) return GPC_OK;
    if (skinny_applies(N))
        return run_skinny(out, NULL, inp, qweight, scales, bias, residual, (int)N, (int)C, (int)OC);
    if (lt_applies(out, inp, qweight, scales, bias, residual, N, C, OC)) {
        lt_device *d = NULL;
        int device = 0, ran = 0;
        GPC_TRY(lt_state(&d, &device));
        if (d)
            GPC_TRY(lt_fp8(d, device, out, inp, qweight, scales, bias, residual, (int)N, (int)C,
                           (int)OC, &ran));
        if (ran) {
            count_path(&lt_calls, "per-tensor fp8 weights on cuBLASLt's FP8 tensor cores "
                                  "(activations quantized per tensor)");
            return GPC_OK;
        }
    }
    if (qweight->dtype == GPC_F8E4M3)
        return run_kernels<true>(out, inp, qweight, scales, bias, residual, N, (int)C, (int)OC);
    return run_kernels<false>(out, inp, qweight, scales, bias, residual, N, (int)C, (int)OC);
}

/* fc's product: the skinny kernel applies GELU as it stores; more rows take
 * the product's path, then gelu.cu's kernel. */
gpc_status gpc_cuda_matmul_quant_gelu_forward(gpc_tensor *out_pre, gpc_tensor *out_gelu,
                                              const gpc_tensor *inp, const gpc_tensor *qweight,
                                              const gpc_tensor *scales, const gpc_tensor *bias) {
    const char *op = "matmul_quant_gelu_forward";
    GPC_TRY(gpc_cuda_same_dtype(op, "out_pre", out_pre, "inp", inp));
    GPC_TRY(gpc_cuda_same_dtype(op, "out_gelu", out_gelu, "inp", inp));
    GPC_TRY(gpc_cuda_enter(out_gelu));
    int64_t N, C, OC;
    int skip;
    GPC_TRY(quant_dims(op, inp, qweight, &N, &C, &OC, &skip));
    if (skip) return GPC_OK;
    if (skinny_applies(N))
        return run_skinny(out_gelu, out_pre, inp, qweight, scales, bias, NULL, (int)N, (int)C,
                          (int)OC);
    GPC_TRY(gpc_cuda_matmul_quant_forward(out_pre, inp, qweight, scales, bias, NULL));
    return gpc_cuda_gelu_forward(out_gelu, out_pre);
}
