/*
 * layernorm.cu: layer normalisation forward and backward, the fused residual
 * add + layernorm, and the plain residual add.
 *
 * The same formulas as the CPU (src/cpu/layernorm.c): mean, biased variance
 * from a second pass over (x - mean)^2, rstd = 1/sqrt(var + 1e-5); in the
 * backward pass, with xhat = (x-mean)*rstd and g = w*dout,
 * dinp += rstd * (g - mean(g) - xhat * mean(g*xhat)).
 *
 * Forward: one warp per row; the row is read from global memory once per
 * pass but the later passes hit L1, so the cost is one read and one write of
 * the activations. The fused kernel writes residual = a + b in the first
 * pass, saving a separate kernel's read and write of the residual stream.
 * Rows of 1 to 7 16-byte packs a lane (GPT-2's 768 in bf16 is 3, 1600 is 6
 * or 7) go to a kernel that loads the whole row at once and keeps it in
 * registers: the general one has one pack a lane in flight, which held it
 * to about 2 TB/s at GPT-2's shape.
 *
 * Backward, C <= 1024 (768 in f32) in 16-byte packs (GPT-2's rows): one
 * fused kernel on a persistent grid (LNB_BLOCKS_PER_SM blocks a
 * multiprocessor; bf16 and f16 rows of 1537-1792 columns, GPT-2 1.5B's
 * 1600, at one block, for the registers their sums take). A warp takes
 * one row at a time and keeps it in registers for both passes (the row
 * sums, then dinp), and each lane owns the same columns of every row, so it
 * also keeps its columns' dweight and dbias sums
 * in registers over all its rows. bf16 and f16 rows of 769-1536 columns
 * (GPT-2 350M's 1024, 774M's 1280) go to two warps, each with half the
 * columns, which add the row's two sums through shared memory: half the
 * registers, so two blocks a multiprocessor and twice the warps a row.
 * dout, inp and dinp are each read once and dinp written once: the minimum traffic (an earlier
 * version read dout and inp a second time in a separate column-sum kernel, a third more traffic).
 * Each block adds its warps' sums in warp order and writes one row of
 * partial sums to scratch; a small kernel adds those rows in a fixed order.
 * No atomics: the bits depend only on N, C and the GPU's multiprocessor
 * count, the same on every run. Asked for dinp's incoming column sums (the
 * bias gradient of the projection before this layernorm, see ops.h), the
 * kernel also sums the dinp it reads, per warp in shared memory, so the
 * residual gradient is not read again for that bias (every bf16/f16 row
 * of the fused kernel, f32 rows of up to 512 columns; other rows, and
 * with GPC_LAYERNORM_STAGE=0 those of 769-1024 columns, with
 * GPC_LAYERNORM_WIDE=0 the wide ones, sum in a pass of their own, before
 * the kernel).
 * bf16 and f16 rows too wide to load their dinp with dout and inp in
 * registers (from 769 columns) are staged: each warp copies its
 * rows into shared memory with cp.async, one row ahead (the next row's
 * dout and inp while pass 2 of this one runs, its dinp after), so a warp's
 * loads no longer wait for its arithmetic. At d24's 16,384 rows of 1024 it
 * took the op from 76 to 62 us, at 1600 from 127 to 96
 * (GPC_LAYERNORM_STAGE=0 measures it).
 * Other C (odd, wider, or unaligned rows): one warp per row for dinp, and
 * the column sums by a second kernel that reads dout and inp again, in row
 * blocks whose partial sums the same finishing kernel adds.
 */
#include "cuda/cuda_common.cuh"

#define LAYERNORM_EPS 1e-5f
#define LN_WARPS 8
/* the register forward: rows of up to this many 16-byte packs a lane (C <=
 * 1792 in bf16, GPT-2 1.5B's 1600 included; 896 in f32) */
#define LN_ROWS_MAX_CHUNKS 7
/* the fused backward: block size, and blocks per multiprocessor of its
 * persistent grid (a fixed number, so the partial sums and their order, and
 * so the bits of dweight and dbias, depend only on N, C and the GPU) */
#define LNB_WARPS 8
#define LNB_THREADS (32 * LNB_WARPS)
#define LNB_BLOCKS_PER_SM 2
/* columns per lane: C <= 1024 for bf16 and f16, 768 for f32 (32 f32 spill) */
#define LNB_MAX_ELEMS(E) (sizeof(E) == 2 ? 32 : 24)
/* ... and with dinp's column sums too (SUM) at two blocks a multiprocessor
 * without spilling: C <= 768 for bf16 and f16, 512 for f32; the wide bf16
 * and f16 rows sum them at one block (see LNB_WIDE_MAX_ELEMS) */
#define LNB_SUM_MAX_ELEMS(E) (sizeof(E) == 2 ? 24 : 16)
/* ... and with the rows staged in shared memory (STAGE): C <= 1024 for
 * bf16 and f16, whose instance spills 72 bytes at two blocks but ran 1.19x
 * faster than summing dinp in a pass of its own (bench_reduce_bench) */
#define LNB_STAGE_SUM_MAX_ELEMS(E) (sizeof(E) == 2 ? 32 : 16)
/* wider bf16 and f16 rows, C <= 1792 (GPT-2 774M's 1280 and 1.5B's 1600):
 * the same kernel at one block a multiprocessor, whose 255 registers hold
 * a lane's 56 columns of sums and row without spilling (241 with SUM and
 * STAGE) */
#define LNB_WIDE_MAX_ELEMS 56
/* bf16 and f16 rows of more than LNB_SPLIT_MIN_ELEMS columns a lane at a
 * warp a row (from 769 columns) are split over two warps where that needs
 * at most LNB_SPLIT_MAX_ELEMS a lane (up to 1536 columns): at 16,384 rows
 * 1.08x for 1024 columns, 1.05x for 1280. Rows of 768 ran 0.91x split, and
 * rows of 1600 0.88x (32 columns a lane spill at two blocks an SM) */
#define LNB_SPLIT_MIN_ELEMS 24
#define LNB_SPLIT_MAX_ELEMS 24
/* split rows: the row sums' exchange slots at the start of the kernel's
 * shared memory, two float2 a warp (one a row parity); a multiple of 16 */
#define LNB_EXCHANGE_BYTES (LNB_WARPS * 2 * sizeof(float2))

/* a and b are NULL for plain layernorm (inp is then the input); otherwise
 * residual = a + b is written to inp (cast away: it is the residual tensor). */
template <typename T, int PER>
__global__ void layernorm_forward_kernel(T *out, float *mean_out, float *rstd_out, T *inp,
                                         const T *a, const T *b, gpc_cuda_any weight,
                                         gpc_cuda_any bias, int64_t N, int C) {
    int lane = threadIdx.x & 31;
    int64_t row = (int64_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    if (row >= N) return;
    const int per = PER;
    T *x = inp + row * C;
    float x8[8];
    float sum = 0.0f;
    for (int c = lane * per; c < C; c += 32 * per) {
        if (a) {
            float y8[8];
            gpc_load_f32<PER>(x8, a + row * C + c);
            gpc_load_f32<PER>(y8, b + row * C + c);
            for (int k = 0; k < per; k++)
                x8[k] += y8[k];
            gpc_store_f32<PER>(x + c, x8);
            gpc_load_f32<PER>(x8, x + c); /* use the rounded residual, as the next layer will */
        } else {
            gpc_load_f32<PER>(x8, x + c);
        }
        for (int k = 0; k < per; k++)
            sum += x8[k];
    }
    float mean = gpc_warp_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane * per; c < C; c += 32 * per) {
        gpc_load_f32<PER>(x8, x + c);
        for (int k = 0; k < per; k++)
            var += (x8[k] - mean) * (x8[k] - mean);
    }
    float rstd = rsqrtf(gpc_warp_sum(var) / C + LAYERNORM_EPS);
    T *o = out + row * C;
    for (int c = lane * per; c < C; c += 32 * per) {
        gpc_load_f32<PER>(x8, x + c);
        for (int k = 0; k < per; k++)
            x8[k] = (x8[k] - mean) * rstd * gpc_any_load(weight, c + k) + gpc_any_load(bias, c + k);
        gpc_store_f32<PER>(o + c, x8);
    }
    if (lane == 0) {
        mean_out[row] = mean;
        rstd_out[row] = rstd;
    }
}

/* The same forward for rows of C columns in at most 32 * CHUNKS 16-byte
 * packs (GPT-2's 768 in bf16 is 3 chunks of a pack a lane, 1600 is 6 or 7)
 * with weight and bias in T: each lane loads its packs (lane + 32 i) at once
 * and keeps the row in registers for the three passes, so a warp has the
 * whole row in flight instead of one pack a lane. A lane beyond the row's
 * last pack skips that chunk. Same sums in the same order as
 * layernorm_forward_kernel, so the same bits. */
template <typename T, int CHUNKS>
__global__ void layernorm_forward_rows_kernel(T *out, float *mean_out, float *rstd_out, T *inp,
                                              const T *a, const T *b, const T *weight,
                                              const T *bias, int64_t N, int C) {
    typedef gpc_pack<T> P;
    const int packs = C / P::n;
    int lane = threadIdx.x & 31;
    int64_t row = (int64_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    if (row >= N) return;
    float x[CHUNKS][P::n];
    P v[CHUNKS];
    if (a) {
        P u[CHUNKS];
#pragma unroll
        for (int i = 0; i < CHUNKS; i++)
            if (lane + 32 * i < packs) {
                v[i] = ((const P *)(a + row * C))[lane + 32 * i];
                u[i] = ((const P *)(b + row * C))[lane + 32 * i];
            }
#pragma unroll
        for (int i = 0; i < CHUNKS; i++)
            if (lane + 32 * i < packs) {
#pragma unroll
                for (int k = 0; k < P::n; k++)
                    v[i].v[k] = gpc_from_f32<T>(gpc_to_f32(v[i].v[k]) + gpc_to_f32(u[i].v[k]));
                ((P *)(inp + row * C))[lane + 32 * i] = v[i];
            }
    } else {
#pragma unroll
        for (int i = 0; i < CHUNKS; i++)
            if (lane + 32 * i < packs) v[i] = ((const P *)(inp + row * C))[lane + 32 * i];
    }
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < CHUNKS; i++)
        if (lane + 32 * i < packs)
#pragma unroll
            for (int k = 0; k < P::n; k++) {
                x[i][k] = gpc_to_f32(v[i].v[k]);
                sum += x[i][k];
            }
    float mean = gpc_warp_sum(sum) / C;
    float var = 0.0f;
#pragma unroll
    for (int i = 0; i < CHUNKS; i++)
        if (lane + 32 * i < packs)
#pragma unroll
            for (int k = 0; k < P::n; k++)
                var += (x[i][k] - mean) * (x[i][k] - mean);
    float rstd = rsqrtf(gpc_warp_sum(var) / C + LAYERNORM_EPS);
#pragma unroll
    for (int i = 0; i < CHUNKS; i++) {
        if (lane + 32 * i >= packs) continue;
        P w = ((const P *)weight)[lane + 32 * i], c = ((const P *)bias)[lane + 32 * i], o;
#pragma unroll
        for (int k = 0; k < P::n; k++)
            o.v[k] =
                gpc_from_f32<T>((x[i][k] - mean) * rstd * gpc_to_f32(w.v[k]) + gpc_to_f32(c.v[k]));
        ((P *)(out + row * C))[lane + 32 * i] = o;
    }
    if (lane == 0) {
        mean_out[row] = mean;
        rstd_out[row] = rstd;
    }
}

/* dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = w * dout: one
 * warp per row, PER elements (16 bytes) per lane access. */
template <typename T, int PER>
__global__ void layernorm_dinp_kernel(T *dinp, const T *dout, const T *inp, gpc_cuda_any weight,
                                      const float *mean, const float *rstd, int64_t N, int C) {
    int lane = threadIdx.x & 31;
    int64_t row = (int64_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    if (row >= N) return;
    const T *dy = dout + row * C, *x = inp + row * C;
    T *dx = dinp + row * C;
    float m = mean[row], r = rstd[row];
    float d8[8], x8[8], g_mean = 0.0f, gx_mean = 0.0f;
    for (int c = lane * PER; c < C; c += 32 * PER) {
        gpc_load_f32<PER>(d8, dy + c);
        gpc_load_f32<PER>(x8, x + c);
        for (int k = 0; k < PER; k++) {
            float g = gpc_any_load(weight, c + k) * d8[k];
            g_mean += g;
            gx_mean += g * (x8[k] - m) * r;
        }
    }
    g_mean = gpc_warp_sum(g_mean) / C;
    gx_mean = gpc_warp_sum(gx_mean) / C;
    for (int c = lane * PER; c < C; c += 32 * PER) {
        float o8[8];
        gpc_load_f32<PER>(d8, dy + c);
        gpc_load_f32<PER>(x8, x + c);
        gpc_load_f32<PER>(o8, dx + c);
        for (int k = 0; k < PER; k++) {
            float xhat = (x8[k] - m) * r, g = gpc_any_load(weight, c + k) * d8[k];
            o8[k] += r * (g - g_mean - xhat * gx_mean);
        }
        gpc_store_f32<PER>(dx + c, o8);
    }
}

/* partial[part][c] = sum over this part's rows of dout * xhat, and
 * partial[part][C + c] = sum of dout. Block (32, 8): a lane owns PER
 * neighbouring columns (one 16-byte load per row), the 8 rows of threadIdx.y
 * walk the part's rows, and shared memory adds the 8 in a fixed order. */
template <typename T, int PER>
__global__ void layernorm_params_partial_kernel(float *partial, const T *dout, const T *inp,
                                                const float *mean, const float *rstd, int64_t N,
                                                int C, int64_t rows_per_part) {
    __shared__ float sums[8][32 * PER][2];
    int c0 = (blockIdx.x * 32 + threadIdx.x) * PER;
    int64_t begin = blockIdx.y * rows_per_part;
    int64_t end = begin + rows_per_part < N ? begin + rows_per_part : N;
    float dw[PER], db[PER];
    for (int k = 0; k < PER; k++)
        dw[k] = db[k] = 0.0f;
    if (c0 < C)
        for (int64_t n = begin + threadIdx.y; n < end; n += 8) {
            float d8[8], x8[8], m = mean[n], r = rstd[n];
            gpc_load_f32<PER>(d8, dout + n * C + c0);
            gpc_load_f32<PER>(x8, inp + n * C + c0);
#pragma unroll
            for (int k = 0; k < PER; k++) {
                dw[k] += d8[k] * (x8[k] - m) * r;
                db[k] += d8[k];
            }
        }
#pragma unroll
    for (int k = 0; k < PER; k++) {
        sums[threadIdx.y][threadIdx.x * PER + k][0] = dw[k];
        sums[threadIdx.y][threadIdx.x * PER + k][1] = db[k];
    }
    __syncthreads();
    for (int i = threadIdx.y * 32 + threadIdx.x; i < 32 * PER; i += 256) {
        int c = blockIdx.x * 32 * PER + i;
        if (c >= C) continue;
        float w = 0.0f, b = 0.0f;
        for (int y = 0; y < 8; y++) {
            w += sums[y][i][0];
            b += sums[y][i][1];
        }
        partial[(int64_t)blockIdx.y * 2 * C + c] = w;
        partial[(int64_t)blockIdx.y * 2 * C + C + c] = b;
    }
}

/* Hides the value of a pack from the optimiser (no instruction). */
template <typename T> __device__ __forceinline__ void ln_opaque(gpc_pack<T> &p) {
    unsigned *u = (unsigned *)&p;
#pragma unroll
    for (int j = 0; j < 4; j++)
        asm volatile("" : "+r"(u[j]));
}

/* PER f32 weights from shared memory, 16 bytes a load (s is 16-byte aligned). */
template <int PER> __device__ __forceinline__ void ln_weights(float *w, const float *s) {
#pragma unroll
    for (int k = 0; k < PER; k += 4) {
        float4 v = *(const float4 *)(s + k);
        w[k] = v.x;
        w[k + 1] = v.y;
        w[k + 2] = v.z;
        w[k + 3] = v.w;
    }
}

/* Whether the fused backward sums dinp's columns too at elems columns a
 * lane: rows of up to LNB_SUM_MAX_ELEMS, the wide bf16 and f16 rows (at one
 * block), and with the rows staged those of up to LNB_STAGE_SUM_MAX_ELEMS. */
template <typename T> constexpr bool lnb_can_sum(int elems, bool staged) {
    return elems <= LNB_SUM_MAX_ELEMS(T) || (sizeof(T) == 2 && elems > LNB_MAX_ELEMS(T)) ||
           (staged && elems <= LNB_STAGE_SUM_MAX_ELEMS(T));
}

/* Whether the fused backward loads a row's dinp with its dout and inp (no
 * spills at 128 registers); wider rows load it in pass 2, or in bf16 and
 * f16 are staged in shared memory (STAGE). */
template <typename T> constexpr bool lnb_early(int elems) {
    return elems <= 24 && elems * sizeof(T) <= 64;
}

/* Copies this thread's packs of a row (t + STRIDE i, as far as packs) from
 * g to s[32 i] with cp.async. */
template <typename P, int ITEMS, int STRIDE>
__device__ __forceinline__ void lnb_copy_row(P *s, const P *g, int t, int packs) {
#pragma unroll
    for (int i = 0; i < ITEMS; i++)
        if (t + STRIDE * i < packs) gpc_cp_async16(s + 32 * i, g + t + STRIDE * i, true);
}

/* Waits for the 32 * n threads of named barrier id (1-15; 0 is
 * __syncthreads') and orders their shared memory accesses. */
__device__ __forceinline__ void lnb_bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(32 * n) : "memory");
}

/* The fused backward for rows of at most 32 * SPLIT * ELEMS columns in
 * 16-byte packs: a persistent grid, SPLIT warps per row at a time (a unit),
 * each unit walking the rows unit, unit + units, ... of the whole grid.
 * Thread t of a unit (t = 32 * its warp's place in the unit + lane) owns the
 * same packs of every row (pack t + 32 SPLIT i), so it keeps dweight's and
 * dbias's column sums for them in registers across all of its rows; dout
 * and inp are read once (both passes over the row use the registers), dinp
 * once and written once. With SPLIT 2 the unit's warps add their halves of
 * the row's two sums through shared memory (a slot a warp and row parity)
 * behind a named barrier of the unit's 64 threads, both in the same order,
 * so they agree to the bit: half the registers a lane, and so two blocks a
 * multiprocessor and twice the warps on each row where one warp a row left
 * the schedulers idle (bf16 and f16 rows of 769-1536 columns).
 * With SUM it also sums the columns of dinp as they come in (the residual
 * gradient's column sums: a projection's bias gradient), each unit into its
 * own row of shared memory, since registers for a third set of sums would
 * spill or cost the early loads of dinp (measured 25% slower).
 * At the end the block's warps add their sums in warp order in shared memory
 * and the block writes one partial row [GROUPS * C] (dweight, dbias, then
 * dinp's sums) to partial[blockIdx.x]; layernorm_params_finish_kernel adds the
 * blocks' rows in a fixed order. The weight is staged in shared memory as f32
 * once per block. With STAGE each warp's rows come through its three slots
 * of shared memory (see the comment above the row loop). Dynamic shared
 * memory: (1 + GROUPS) * C floats, LNB_WARPS / SPLIT * C more with SUM,
 * LNB_WARPS slots of 3 * 32 * ELEMS elements with STAGE, and with SPLIT 2
 * LNB_WARPS * 2 float2 slots first. */
template <typename T, int ELEMS, bool SUM, bool STAGE, int MIN_BLOCKS, int SPLIT>
__global__ void __launch_bounds__(LNB_THREADS, MIN_BLOCKS)
    layernorm_backward_fused_kernel(T *__restrict__ dinp, const T *__restrict__ dout,
                                    const T *__restrict__ inp, gpc_cuda_any weight,
                                    const float *__restrict__ mean, const float *__restrict__ rstd,
                                    float *__restrict__ partial, int64_t N, int C) {
    static_assert(SPLIT == 1 || SPLIT == 2, "a row is split over one or two warps");
    typedef gpc_pack<T> P;
    const int PER = P::n, ITEMS = ELEMS / P::n, GROUPS = SUM ? 3 : 2;
    const int UNITS = LNB_WARPS / SPLIT, STRIDE = 32 * SPLIT;
    const bool EARLY = lnb_early<T>(ELEMS);
    extern __shared__ float4 ln_shared[]; /* float4: 16-byte aligned for ln_weights */
    /* SPLIT 2: the row sums' exchange slots, [unit][parity][warp of the unit] */
    float2 *xch = (float2 *)ln_shared;
    float *w_s = (float *)(ln_shared + (SPLIT > 1 ? LNB_EXCHANGE_BYTES / 16 : 0));
    float *sum_s = w_s + C;           /* [GROUPS * C] */
    float *ds_s = sum_s + GROUPS * C; /* SUM: [UNITS][C], a row per unit */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, packs = C / PER;
    const int unit = warp / SPLIT, half = warp % SPLIT, t = 32 * half + lane;
    /* STAGE: the warp's rows of dout, inp and dinp, pack t + STRIDE i of
     * each at [32 i + lane] of its slot */
    P *dy_s = (P *)(ds_s + (SUM ? UNITS * C : 0)) + warp * 3 * 32 * ITEMS + lane;
    P *x_s = dy_s + 32 * ITEMS, *dx_s = x_s + 32 * ITEMS;
    for (int c = threadIdx.x; c < C; c += LNB_THREADS)
        w_s[c] = gpc_any_load(weight, c);
    if (SUM)
        for (int c = threadIdx.x; c < UNITS * C; c += LNB_THREADS)
            ds_s[c] = 0.0f;
    __syncthreads();

    const int64_t units = (int64_t)gridDim.x * UNITS;
    const int64_t first = (int64_t)blockIdx.x * UNITS + unit;
    float dw[ITEMS][PER], db[ITEMS][PER];
#pragma unroll
    for (int i = 0; i < ITEMS; i++)
#pragma unroll
        for (int k = 0; k < PER; k++)
            dw[i][k] = db[i][k] = 0.0f;

    /* STAGE: copies to shared memory, two groups a row in flight: the first
     * row's now, then each next row's dout and inp once pass 1 has read this
     * row's, and its dinp once pass 2 has */
    if (STAGE && first < N) {
        lnb_copy_row<P, ITEMS, STRIDE>(dy_s, (const P *)(dout + first * C), t, packs);
        lnb_copy_row<P, ITEMS, STRIDE>(x_s, (const P *)(inp + first * C), t, packs);
        gpc_cp_async_commit();
        lnb_copy_row<P, ITEMS, STRIDE>(dx_s, (const P *)(dinp + first * C), t, packs);
        gpc_cp_async_commit();
    }
    int parity = 0;
    for (int64_t row = first; row < N; row += units) {
        const int64_t next = row + units;
        const P *dy = (const P *)(dout + row * C), *x = (const P *)(inp + row * C);
        P *dx = (P *)(dinp + row * C);
        P dyp[ITEMS], xp[ITEMS];
        /* STAGE: this row's dout and inp are this thread's copies (its dinp
         * may still be in flight); else every load of the row first, so
         * they are in flight together */
        if (STAGE) gpc_cp_async_wait<1>();
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            int p = t + STRIDE * i;
            if (p < packs) {
                dyp[i] = STAGE ? dy_s[32 * i] : dy[p];
                xp[i] = STAGE ? x_s[32 * i] : x[p];
            }
        }
        const float m = mean[row], r = rstd[row];
        float g_sum = 0.0f, gx_sum = 0.0f;
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            int p = t + STRIDE * i;
            if (p < packs) {
                float w[PER];
                ln_weights<PER>(w, w_s + p * PER);
#pragma unroll
                for (int k = 0; k < PER; k++) {
                    float d = gpc_to_f32(dyp[i].v[k]), xhat = (gpc_to_f32(xp[i].v[k]) - m) * r;
                    float g = w[k] * d;
                    g_sum += g;
                    gx_sum += g * xhat;
                    dw[i][k] += d * xhat;
                    db[i][k] += d;
                }
            }
        }
        if (STAGE) { /* pass 1 has used the slots' values: the next row's */
            if (next < N) {
                lnb_copy_row<P, ITEMS, STRIDE>(dy_s, (const P *)(dout + next * C), t, packs);
                lnb_copy_row<P, ITEMS, STRIDE>(x_s, (const P *)(inp + next * C), t, packs);
            }
            gpc_cp_async_commit();
        }
        /* dinp's loads overlap the row reduction where the registers allow
         * (pass 1's floats are dead by now); otherwise pass 2 loads them */
        P dxp[ITEMS];
#pragma unroll
        for (int i = 0; i < ITEMS; i++)
            if (EARLY && !STAGE && t + STRIDE * i < packs) dxp[i] = dx[t + STRIDE * i];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            g_sum += __shfl_xor_sync(0xffffffffu, g_sum, o);
            gx_sum += __shfl_xor_sync(0xffffffffu, gx_sum, o);
        }
        if (SPLIT > 1) { /* the unit's halves, added in the same order by both */
            float2 *slot = xch + (unit * 2 + parity) * SPLIT;
            if (lane == 0) slot[half] = make_float2(g_sum, gx_sum);
            lnb_bar_sync(1 + unit, SPLIT);
            const float2 a = slot[0], b = slot[1];
            g_sum = a.x + b.x;
            gx_sum = a.y + b.y;
            parity ^= 1; /* the next row's slots: a warp writes these again only
                          * after the next barrier, which its partner reaches
                          * after reading them */
        }
        /* (float)C converted again each row, from a value ptxas cannot
         * hoist: kept across the row loop it is the one value the bf16
         * C = 768 instance with sums spilled at 128 registers, read back from
         * local memory every row (3% of the kernel's time on an H200) */
        int c_row = C;
        asm volatile("" : "+r"(c_row));
        const float g_mean = g_sum / c_row, gx_mean = gx_sum / c_row;
        /* STAGE: this row's dinp (the next row's dout and inp may still be
         * in flight). Pass 2 converts the packs again rather than keeping
         * pass 1's floats alive across the reduction (twice the registers
         * for bf16/f16) */
        if (STAGE) gpc_cp_async_wait<1>();
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            ln_opaque(dyp[i]);
            ln_opaque(xp[i]);
        }
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            int p = t + STRIDE * i;
            if (p < packs) {
                P out;
                if (STAGE)
                    dxp[i] = dx_s[32 * i];
                else if (!EARLY)
                    dxp[i] = dx[p];
                float w[PER];
                ln_weights<PER>(w, w_s + p * PER);
                float4 *acc = (float4 *)(ds_s + unit * C + p * PER);
#pragma unroll
                for (int q = 0; q < PER / 4; q++) {
                    float in[4];
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        int k = 4 * q + j;
                        float d = gpc_to_f32(dyp[i].v[k]), xhat = (gpc_to_f32(xp[i].v[k]) - m) * r;
                        float g = w[k] * d;
                        in[j] = gpc_to_f32(dxp[i].v[k]);
                        out.v[k] = gpc_from_f32<T>(in[j] + r * (g - g_mean - xhat * gx_mean));
                    }
                    if (SUM) {
                        float4 a = acc[q];
                        a.x += in[0], a.y += in[1], a.z += in[2], a.w += in[3];
                        acc[q] = a;
                    }
                }
                dx[p] = out;
            }
        }
        if (STAGE) {
            if (next < N)
                lnb_copy_row<P, ITEMS, STRIDE>(dx_s, (const P *)(dinp + next * C), t, packs);
            gpc_cp_async_commit();
        }
    }

    /* the block's column sums in warp order: the first unit's warps (which
     * between them own every column) set them, then each warp adds its own,
     * 16 bytes an access (a lane's columns are PER in a row: one float a
     * time was an 8-way bank conflict, 20 us of the kernel at 1600 columns) */
    for (int w = 0; w < LNB_WARPS; w++) {
        if (warp == w) {
#pragma unroll
            for (int i = 0; i < ITEMS; i++) {
                int p = t + STRIDE * i;
                if (p < packs) {
                    float4 *sw = (float4 *)(sum_s + p * PER), *sb = (float4 *)(sum_s + C + p * PER);
#pragma unroll
                    for (int q = 0; q < PER / 4; q++) {
                        float4 a = make_float4(dw[i][4 * q], dw[i][4 * q + 1], dw[i][4 * q + 2],
                                               dw[i][4 * q + 3]);
                        float4 b = make_float4(db[i][4 * q], db[i][4 * q + 1], db[i][4 * q + 2],
                                               db[i][4 * q + 3]);
                        if (w >= SPLIT) {
                            const float4 u = sw[q], v = sb[q];
                            a.x += u.x, a.y += u.y, a.z += u.z, a.w += u.w;
                            b.x += v.x, b.y += v.y, b.z += v.z, b.w += v.w;
                        }
                        sw[q] = a;
                        sb[q] = b;
                    }
                }
            }
        }
        __syncthreads();
    }
    if (SUM) /* the units' rows of dinp's sums, in unit order */
        for (int c = threadIdx.x; c < C; c += LNB_THREADS) {
            float s = 0.0f;
            for (int u = 0; u < UNITS; u++)
                s += ds_s[u * C + c];
            sum_s[2 * C + c] = s;
        }
    __syncthreads();
    float *out = partial + (int64_t)blockIdx.x * GROUPS * C;
    for (int c = threadIdx.x; c < GROUPS * C; c += LNB_THREADS)
        out[c] = sum_s[c];
}

/* dweight[c] += sum over parts of partial[part][c], dbias[c] += that of
 * partial[part][C + c], and with dsum (groups 3) dsum[c] += that of
 * partial[part][2C + c]. A block adds 32 of the groups * C columns, in a
 * fixed order (gpc_parts_column_sum, 16 loads in flight a thread: 264
 * blocks' rows took about 1% less time than with 4). */
__global__ void layernorm_params_finish_kernel(gpc_cuda_any dweight, gpc_cuda_any dbias,
                                               gpc_cuda_any dsum, const float *partial, int parts,
                                               int C, int groups) {
    int c = blockIdx.x * 32 + threadIdx.x;
    float t = gpc_parts_column_sum<16>(partial, parts, groups * (int64_t)C);
    if (threadIdx.y != 0 || c >= groups * C) return;
    gpc_cuda_any to = c < C ? dweight : c < 2 * C ? dbias : dsum;
    int j = c % C;
    gpc_any_store(to, j, gpc_any_load(to, j) + t);
}

template <typename T>
__global__ void residual_kernel(T *out, const T *a, const T *b, int64_t n, int vectorised) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, done = 0;
    if (vectorised) {
        typedef gpc_pack<T> P;
        int64_t packs = n / P::n;
        for (int64_t i = first; i < packs; i += stride) {
            P x = ((const P *)a)[i], y = ((const P *)b)[i], z;
#pragma unroll
            for (int k = 0; k < P::n; k++)
                z.v[k] = gpc_from_f32<T>(gpc_to_f32(x.v[k]) + gpc_to_f32(y.v[k]));
            ((P *)out)[i] = z;
        }
        done = packs * P::n;
    }
    for (int64_t i = done + first; i < n; i += stride)
        out[i] = gpc_from_f32<T>(gpc_to_f32(a[i]) + gpc_to_f32(b[i]));
}

/* Queues layernorm_forward_rows_kernel<T, chunks> (CHUNKS counts up to it). */
template <typename T, int CHUNKS>
static void layernorm_forward_rows(int chunks, unsigned grid, cudaStream_t s, T *out,
                                   float *mean_out, float *rstd_out, T *inp, const T *a, const T *b,
                                   const T *weight, const T *bias, int64_t N, int C) {
    if constexpr (CHUNKS < LN_ROWS_MAX_CHUNKS)
        if (chunks > CHUNKS)
            return layernorm_forward_rows<T, CHUNKS + 1>(chunks, grid, s, out, mean_out, rstd_out,
                                                         inp, a, b, weight, bias, N, C);
    layernorm_forward_rows_kernel<T, CHUNKS>
        <<<grid, 32 * LN_WARPS, 0, s>>>(out, mean_out, rstd_out, inp, a, b, weight, bias, N, C);
}

/* GPC_LAYERNORM_WIDE=0 sends bf16 and f16 rows wider than 1024 columns to
 * the two-kernel backward, dinp's column sums in a pass of their own (for
 * measuring the one-block fused kernel against them). */
static int layernorm_wide_enabled(void) {
    static int enabled = -1;
    return gpc_cuda_setting_flag("GPC_LAYERNORM_WIDE", &enabled);
}

/* GPC_LAYERNORM_SPLIT=0 keeps bf16 and f16 rows wider than 768 columns
 * at a warp a row in the fused backward (for measuring the split rows
 * against it). */
static int layernorm_split_enabled(void) {
    static int enabled = -1;
    return gpc_cuda_setting_flag("GPC_LAYERNORM_SPLIT", &enabled);
}

/* GPC_LAYERNORM_STAGE=0 has the fused backward load its rows into
 * registers itself, dinp in the second pass where the rows are too wide to
 * load it early (for measuring the staged copies against it; rows of
 * 769-1024 columns then sum dinp in a pass of their own). */
static int layernorm_stage_enabled(void) {
    static int enabled = -1;
    return gpc_cuda_setting_flag("GPC_LAYERNORM_STAGE", &enabled);
}

/* GPC_LAYERNORM_ROWS=0 keeps every row on layernorm_forward_kernel (for
 * measuring the register kernel against it). */
static int layernorm_rows_enabled(void) {
    static int enabled = -1;
    return gpc_cuda_setting_flag("GPC_LAYERNORM_ROWS", &enabled);
}

static gpc_status layernorm_launch(gpc_tensor *out, gpc_tensor *mean, gpc_tensor *rstd,
                                   gpc_tensor *inp, const gpc_tensor *a, const gpc_tensor *b,
                                   const gpc_tensor *weight, const gpc_tensor *bias) {
    int64_t C = inp->shape[inp->ndim - 1], N = C ? gpc_tensor_numel(inp) / C : 0;
    if (N == 0) return GPC_OK;
    GPC_CUDA_DISPATCH(out->dtype, E, {
        int per = (int)(16 / sizeof(E));
        int vec = C % per == 0 && gpc_cuda_aligned16(out->data) && gpc_cuda_aligned16(inp->data) &&
                  (!a || (gpc_cuda_aligned16(a->data) && gpc_cuda_aligned16(b->data)));
        unsigned grid = gpc_cuda_blocks(N, LN_WARPS);
        const E *pa = a ? (const E *)a->data : NULL, *pb = b ? (const E *)b->data : NULL;
        int chunks = (int)((C / per + 31) / 32); /* packs a lane, the most */
        int rows = vec && chunks >= 1 && chunks <= LN_ROWS_MAX_CHUNKS &&
                   weight->dtype == out->dtype && bias->dtype == out->dtype &&
                   gpc_cuda_aligned16(weight->data) && gpc_cuda_aligned16(bias->data) &&
                   layernorm_rows_enabled();
        if (rows) {
            E *o = (E *)out->data, *x = (E *)inp->data;
            const E *w = (const E *)weight->data, *bb = (const E *)bias->data;
            float *mu = (float *)mean->data, *rs = (float *)rstd->data;
            cudaStream_t s = gpc_cuda_stream();
            int c = (int)C;
            layernorm_forward_rows<E, 1>(chunks, grid, s, o, mu, rs, x, pa, pb, w, bb, N, c);
        } else if (vec)
            layernorm_forward_kernel<E, 16 / sizeof(E)>
                <<<grid, 32 * LN_WARPS, 0, gpc_cuda_stream()>>>(
                    (E *)out->data, (float *)mean->data, (float *)rstd->data, (E *)inp->data, pa,
                    pb, gpc_cuda_any_of(weight), gpc_cuda_any_of(bias), N, (int)C);
        else
            layernorm_forward_kernel<E, 1><<<grid, 32 * LN_WARPS, 0, gpc_cuda_stream()>>>(
                (E *)out->data, (float *)mean->data, (float *)rstd->data, (E *)inp->data, pa, pb,
                gpc_cuda_any_of(weight), gpc_cuda_any_of(bias), N, (int)C);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

gpc_status gpc_cuda_layernorm_forward(gpc_tensor *out, gpc_tensor *mean, gpc_tensor *rstd,
                                      const gpc_tensor *inp, const gpc_tensor *weight,
                                      const gpc_tensor *bias) {
    GPC_TRY(gpc_cuda_same_dtype("layernorm_forward", "out", out, "inp", inp));
    GPC_TRY(gpc_cuda_enter(out));
    return layernorm_launch(out, mean, rstd, (gpc_tensor *)inp, NULL, NULL, weight, bias);
}

gpc_status gpc_cuda_residual_layernorm_forward(gpc_tensor *residual, gpc_tensor *out,
                                               gpc_tensor *mean, gpc_tensor *rstd,
                                               const gpc_tensor *a, const gpc_tensor *b,
                                               const gpc_tensor *weight, const gpc_tensor *bias) {
    const char *op = "residual_layernorm_forward";
    /* ops.c hands the fused entry 'a' and 'b' unchecked (see ops_backend.h). */
    if (!a || !a->data || !b || !b->data)
        return gpc_error(GPC_ERR_INVALID_ARG, "%s: tensor '%s' is missing", op,
                         !a || !a->data ? "a" : "b");
    if (a->device.type != out->device.type || b->device.type != out->device.type ||
        a->device.index != out->device.index || b->device.index != out->device.index)
        return gpc_error(GPC_ERR_MISMATCH, "%s: tensors on different devices (%s and %s)", op,
                         gpc_device_name(out->device),
                         gpc_device_name(a->device.type != out->device.type ||
                                                 a->device.index != out->device.index
                                             ? a->device
                                             : b->device));
    if (gpc_tensor_numel(a) != gpc_tensor_numel(residual) ||
        gpc_tensor_numel(b) != gpc_tensor_numel(residual))
        return gpc_error(GPC_ERR_MISMATCH,
                         "%s: tensors 'a' and 'b' must have as many elements as 'residual'", op);
    GPC_TRY(gpc_cuda_same_dtype(op, "out", out, "residual", residual));
    GPC_TRY(gpc_cuda_same_dtype(op, "out", out, "a", a));
    GPC_TRY(gpc_cuda_same_dtype(op, "out", out, "b", b));
    GPC_TRY(gpc_cuda_enter(out));
    return layernorm_launch(out, mean, rstd, residual, a, b, weight, bias);
}

/* Queues the fused backward for elems columns per lane (see its kernel;
 * ELEMS counts up to it by 8, as far as E's rows go: LNB_WIDE_MAX_ELEMS in
 * bf16/f16, LNB_MAX_ELEMS in f32), summing dinp's columns too when sum is
 * set (at most LNB_SUM_MAX_ELEMS columns a lane, or wide rows); rows
 * wider than LNB_MAX_ELEMS run at one block a multiprocessor (the caller's
 * grid). */
template <typename E, int ELEMS, bool SUM, bool STAGE, int SPLIT>
static gpc_status layernorm_backward_fused_launch(unsigned grid, size_t shared, cudaStream_t s,
                                                  gpc_tensor *dinp, const gpc_tensor *dout,
                                                  const gpc_tensor *inp, const gpc_tensor *weight,
                                                  const float *mu, const float *rs, float *partial,
                                                  int64_t N, int C) {
    constexpr int min_blocks = ELEMS <= LNB_MAX_ELEMS(E) ? LNB_BLOCKS_PER_SM : 1;
    auto kernel = layernorm_backward_fused_kernel<E, ELEMS, SUM, STAGE, min_blocks, SPLIT>;
    /* beyond the default 48 KiB: staged rows, or a row of sums a unit */
    GPC_TRY(gpc_cuda_allow_shared((const void *)kernel, shared, 0, "layernorm_backward"));
    kernel<<<grid, LNB_THREADS, shared, s>>>((E *)dinp->data, (const E *)dout->data,
                                             (const E *)inp->data, gpc_cuda_any_of(weight), mu, rs,
                                             partial, N, C);
    return GPC_OK;
}

/* The fused backward at the smallest ELEMS that holds elems columns a lane
 * (ELEMS counts up to it by 8, as far as E's rows go: LNB_WIDE_MAX_ELEMS in
 * bf16/f16 rows a warp each, LNB_MAX_ELEMS in f32 and in rows split over two
 * warps), summing dinp's columns too when sum is set (the caller sets it
 * only where lnb_can_sum allows), staging dinp in shared memory when stage
 * is set and the rows are too wide to load it early; rows wider than
 * LNB_MAX_ELEMS run at one block a multiprocessor (the caller's grid). */
template <typename E, int ELEMS, int SPLIT>
static gpc_status layernorm_backward_fused(int elems, unsigned grid, cudaStream_t s,
                                           gpc_tensor *dinp, const gpc_tensor *dout,
                                           const gpc_tensor *inp, const gpc_tensor *weight,
                                           const float *mu, const float *rs, float *partial,
                                           int64_t N, int C, int sum, int stage) {
    constexpr int most = SPLIT > 1        ? LNB_SPLIT_MAX_ELEMS
                         : sizeof(E) == 2 ? LNB_WIDE_MAX_ELEMS
                                          : LNB_MAX_ELEMS(E);
    if constexpr (ELEMS < most)
        if (elems > ELEMS)
            return layernorm_backward_fused<E, ELEMS + 8, SPLIT>(
                elems, grid, s, dinp, dout, inp, weight, mu, rs, partial, N, C, sum, stage);
    constexpr bool can_stage = sizeof(E) == 2 && !lnb_early<E>(ELEMS);
    /* only the widths the caller may sum at instantiate the summing kernel */
    constexpr bool sum_plain = lnb_can_sum<E>(ELEMS, false);
    constexpr bool sum_staged = lnb_can_sum<E>(ELEMS, true);
    stage = stage && can_stage;
    size_t shared = (sum ? 4 + LNB_WARPS / SPLIT : 3) * (size_t)C * sizeof(float) +
                    (stage ? (size_t)LNB_WARPS * 3 * 32 * ELEMS * sizeof(E) : 0) +
                    (SPLIT > 1 ? LNB_EXCHANGE_BYTES : 0);
    if (stage && sum)
        return layernorm_backward_fused_launch<E, ELEMS, sum_staged, can_stage, SPLIT>(
            grid, shared, s, dinp, dout, inp, weight, mu, rs, partial, N, C);
    else if (stage)
        return layernorm_backward_fused_launch<E, ELEMS, false, can_stage, SPLIT>(
            grid, shared, s, dinp, dout, inp, weight, mu, rs, partial, N, C);
    else if (sum)
        return layernorm_backward_fused_launch<E, ELEMS, sum_plain, false, SPLIT>(
            grid, shared, s, dinp, dout, inp, weight, mu, rs, partial, N, C);
    else
        return layernorm_backward_fused_launch<E, ELEMS, false, false, SPLIT>(
            grid, shared, s, dinp, dout, inp, weight, mu, rs, partial, N, C);
}

gpc_status gpc_cuda_layernorm_backward(gpc_tensor *dinp, gpc_tensor *dweight, gpc_tensor *dbias,
                                       gpc_tensor *dinp_sum, const gpc_tensor *dout,
                                       const gpc_tensor *inp, const gpc_tensor *weight,
                                       const gpc_tensor *mean, const gpc_tensor *rstd) {
    const char *op = "layernorm_backward";
    GPC_TRY(gpc_cuda_same_dtype(op, "dinp", dinp, "dout", dout));
    GPC_TRY(gpc_cuda_same_dtype(op, "dinp", dinp, "inp", inp));
    GPC_TRY(gpc_cuda_enter(dout));
    int64_t C = inp->shape[inp->ndim - 1], N = C ? gpc_tensor_numel(inp) / C : 0;
    if (N == 0) return GPC_OK;
    cudaStream_t s = gpc_cuda_stream();
    const float *mu = (const float *)mean->data, *rs = (const float *)rstd->data;
    int parts = 0, groups = 2;
    void *partial = NULL;
    GPC_CUDA_DISPATCH(dout->dtype, E, {
        const int P = 16 / sizeof(E);
        int vec = C % P == 0 && gpc_cuda_aligned16(dinp->data) && gpc_cuda_aligned16(dout->data) &&
                  gpc_cuda_aligned16(inp->data);
        /* columns a lane owns in the fused kernel: whole packs, a multiple of 8 */
        int64_t elems = vec ? ((C / P + 31) / 32 * P + 7) / 8 * 8 : 0;
        /* ... and split over two warps (bf16/f16 rows of 769-1536 columns) */
        int64_t elems2 = vec ? ((C / P + 63) / 64 * P + 7) / 8 * 8 : 0;
        int split = vec && sizeof(E) == 2 && elems > LNB_SPLIT_MIN_ELEMS &&
                    elems2 <= LNB_SPLIT_MAX_ELEMS && layernorm_split_enabled();
        if (split) elems = elems2;
        int wide = !split && vec && sizeof(E) == 2 && elems > LNB_MAX_ELEMS(E) &&
                   elems <= LNB_WIDE_MAX_ELEMS && layernorm_wide_enabled();
        int fused = (vec && elems <= LNB_MAX_ELEMS(E)) || wide;
        /* dinp's incoming column sums: in the fused kernel where it has room
         * for them, else a pass of their own before dinp changes (its scratch
         * use ends before the partial sums below take the buffer) */
        int stage = layernorm_stage_enabled();
        int sum = dinp_sum != NULL && fused && lnb_can_sum<E>((int)elems, stage);
        if (dinp_sum && !sum)
            GPC_TRY(gpc_cuda_add_column_sums(dinp_sum, dinp->data, dinp->dtype, N, C, C));
        groups = sum ? 3 : 2;
        if (fused) {
            int64_t grid = (int64_t)gpc_cuda_sm_count() * (wide ? 1 : LNB_BLOCKS_PER_SM),
                    per_block = LNB_WARPS / (split ? 2 : 1), need = (N + per_block - 1) / per_block;
            parts = (int)(grid < need ? grid : need);
            GPC_TRY(gpc_cuda_scratch((size_t)parts * groups * C * sizeof(float), &partial));
            /* (split is never set for f32: its instances stay at a warp a row) */
            constexpr int two = sizeof(E) == 2 ? 2 : 1;
            gpc_status st =
                split ? layernorm_backward_fused<E, 8, two>((int)elems, parts, s, dinp, dout, inp,
                                                            weight, mu, rs, (float *)partial, N,
                                                            (int)C, sum, stage)
                      : layernorm_backward_fused<E, 8, 1>((int)elems, parts, s, dinp, dout, inp,
                                                          weight, mu, rs, (float *)partial, N,
                                                          (int)C, sum, stage);
            if (st != GPC_OK) return st;
        } else {
            /* any C: dinp by one kernel, the column sums by a second */
            int per = vec ? P : 1;
            int col_blocks = (int)((C + 32 * per - 1) / (32 * per));
            int64_t want = (gpc_cuda_sm_count() * 4 + col_blocks - 1) / col_blocks;
            if (want > (N + 63) / 64) want = (N + 63) / 64;
            if (want < 1) want = 1;
            int64_t rows_per = (N + want - 1) / want;
            parts = (int)((N + rows_per - 1) / rows_per);
            GPC_TRY(gpc_cuda_scratch((size_t)parts * 2 * C * sizeof(float), &partial));
            unsigned grid = gpc_cuda_blocks(N, LN_WARPS);
            dim3 pgrid((unsigned)col_blocks, (unsigned)parts), pblock(32, 8);
            if (vec) {
                layernorm_dinp_kernel<E, P><<<grid, 32 * LN_WARPS, 0, s>>>(
                    (E *)dinp->data, (const E *)dout->data, (const E *)inp->data,
                    gpc_cuda_any_of(weight), mu, rs, N, (int)C);
                layernorm_params_partial_kernel<E, P>
                    <<<pgrid, pblock, 0, s>>>((float *)partial, (const E *)dout->data,
                                              (const E *)inp->data, mu, rs, N, (int)C, rows_per);
            } else {
                layernorm_dinp_kernel<E, 1><<<grid, 32 * LN_WARPS, 0, s>>>(
                    (E *)dinp->data, (const E *)dout->data, (const E *)inp->data,
                    gpc_cuda_any_of(weight), mu, rs, N, (int)C);
                layernorm_params_partial_kernel<E, 1>
                    <<<pgrid, pblock, 0, s>>>((float *)partial, (const E *)dout->data,
                                              (const E *)inp->data, mu, rs, N, (int)C, rows_per);
            }
        }
    });
    GPC_CUDA_CHECK_LAUNCH();
    layernorm_params_finish_kernel<<<gpc_cuda_blocks(groups * C, 32), dim3(32, GPC_PARTS_ROWS), 0,
                                     s>>>(gpc_cuda_any_of(dweight), gpc_cuda_any_of(dbias),
                                          gpc_cuda_any_of(dinp_sum), (const float *)partial, parts,
                                          (int)C, groups);
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

gpc_status gpc_cuda_residual_forward(gpc_tensor *out, const gpc_tensor *a, const gpc_tensor *b) {
    GPC_TRY(gpc_cuda_same_dtype("residual_forward", "out", out, "a", a));
    GPC_TRY(gpc_cuda_same_dtype("residual_forward", "out", out, "b", b));
    GPC_TRY(gpc_cuda_enter(out));
    int64_t n = gpc_tensor_numel(out);
    if (n == 0) return GPC_OK;
    int vec =
        gpc_cuda_aligned16(out->data) && gpc_cuda_aligned16(a->data) && gpc_cuda_aligned16(b->data);
    int64_t blocks = (n / 8 + 255) / 256, cap = (int64_t)gpc_cuda_sm_count() * 16;
    unsigned grid = (unsigned)(blocks < 1 ? 1 : blocks > cap ? cap : blocks);
    GPC_CUDA_DISPATCH(out->dtype, E, {
        residual_kernel<E><<<grid, 256, 0, gpc_cuda_stream()>>>((E *)out->data, (const E *)a->data,
                                                                (const E *)b->data, n, vec);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}
