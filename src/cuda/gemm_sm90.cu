/*
 * gemm_sm90.cu: gpc's own Hopper matrix products for the two GELU products
 * of the transformer block, where cuBLASLt's GELU epilogues run well below
 * its plain products (their [N, 4C] epilogue does not overlap the short
 * K = C main loop):
 *   - GELU (the fc forward): pre = inp . W^T + bias and act = gelu(pre),
 *     both written;
 *   - DGELU (fcproj's backward): dinp = (dout . W) * gelu'(pre), with W
 *     transposed K-major first (gpc_cuda_transpose16, a few microseconds),
 *     and, when asked, dinp's column sums (fc's bias gradient) summed by the
 *     epilogue from the tile it stages, so dinp is not read again for them.
 *
 * y[M, N] = A[M, K] . B[N, K]^T with A and B K-major. The kernel (sm_90a:
 * wgmma and TMA) is persistent, one block a multiprocessor walking tiles of
 * 128 x 192 outputs, with four warpgroups (512 threads; the consumers take
 * 168 registers a thread with setmaxnreg, the others keep 88):
 *   - warp 0 is the producer: one thread queues TMA copies of each 64-wide
 *     K slice of A (128 rows) and B (192 rows) into a ring of G_STAGES
 *     shared-memory stages (128-byte swizzle), each with a "full" mbarrier
 *     (its bytes arrived) and an "empty" one (the consumers are done);
 *   - warpgroups 1 and 2 are the consumers: each takes 64 of the tile's
 *     rows, a chain of m64n192k16 wgmma over K into f32 registers, then
 *     writes the tile's result as bf16 into a staging tile and goes
 *     straight on to the next tile. GELU: the sums plus the bias (which 96
 *     of them fetch during the products and put in shared memory). DGELU:
 *     the sums times gelu'(pre), read from the staging tile;
 *   - warps 1-3 and 12-14 are the epilogue (warp 15 has nothing to do: six
 *     warps split the staging tile's three 64-column boxes evenly, and an
 *     epilogue of three warps, the earlier form, held the DGELU product's
 *     consumers up). GELU: a TMA store writes the staged tile
 *     to pre while the warps write its GELU into the second staging tile,
 *     which a second TMA store writes to act. DGELU: the two staging tiles
 *     are a ring; for each tile a TMA load brings pre into one, the warps
 *     turn it into gelu'(pre) in f16 in place, and once the consumers have
 *     written dinp over it a TMA store sends it out. Either way the
 *     epilogue's work overlaps the next tile's products.
 * With GPC_GEMM_SM90_CLUSTER=1 the DGELU product runs in clusters of two
 * blocks: the blocks of a cluster take tiles of the same columns and
 * adjacent rows, and each producer copies half of B's 192 rows into both
 * blocks' stages at once (TMA multicast), so each block reads 28 KiB a stage
 * from L2 instead of 40. A stage is then free only once the consumers of
 * both blocks are done with it: each consumer warp releases it to its own
 * block and to the peer, whose producer waits for both. One GPU's step:
 * 1.0014x in 4 of 5 rounds over two calls (noise-level); two GPUs with it
 * scaled 1.954x in one call against 1.983-1.985x before, not yet told apart
 * from the machine, so it is opt-in. The GELU forward measured 10% slower
 * this way in one call (each block held to its peer's pace, its epilogue
 * being the heavier), so it has no cluster form.
 * A staging tile is three [128][64] boxes in the 128-byte swizzle, the
 * layout the TMA copies use; the consumers' accesses to it are then free of
 * bank conflicts. The elementwise math runs in f16 pairs (half the
 * instructions of f32; f16 keeps 11 bits, more than the bf16 results' 8),
 * from the bf16 pre-activation, as the backward pass sees it.
 *
 * Shapes: M a multiple of 128, K of 64, N of 192 or, from 1024 on with K
 * at most 1280, of 64 (GPT-2 350M's and 774M's 4C: 4096, 5120), all
 * pointers 16-byte aligned and bf16; anything else, or another GPU than
 * compute capability 9.0, answers GPC_ERR_UNSUPPORTED and the caller takes
 * cuBLASLt's path. Where N is not whole tiles the last column of tiles runs
 * partly empty: TMA fills B's and x's rows beyond N with zeros and clips
 * the stores at N, and the bias fetch and the column sums stop there (at N
 * = 4096, 2.3% of the products are spent on the zeros). At K = 1600 (1.5B)
 * cuBLASLt's longer main loop hides its epilogue and it is the faster
 * (0.536 against 0.560 ms for the GELU product at 16,384 rows).
 *
 * On by default; GPC_GEMM_SM90=0 turns both off, gelu or dgelu keeps one.
 * On an H200 at GPT-2's shape (bench_gelu_bench, bench/RESULTS.md) the GELU
 * form takes 0.529-0.531 ms against cuBLASLt's 0.545-0.548, and the DGELU
 * product with fc's bias gradient 0.616 ms against 0.708 for cuBLASLt's
 * product and a column-sum pass; the training step, at the GPU's power cap,
 * ran 1.009x faster. Built with -DGPC_SM90_PROFILE, each call prints the
 * cycles a tile spends in each phase (consumers: products, waiting,
 * staging; epilogue: waiting, work, stores), which is how these were tuned.
 */
#include "cuda/cuda_common.cuh"
#include "cuda/gemm_sm90.h"
#include "cuda/sm90_common.cuh"
#include "cuda/matmul.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define G_THREADS 512         /* four warpgroups: see above */
#define G_EPI_THREADS 192     /* warps 1-3 and 12-14 */
#define G_EPI_HALF 96         /* the epilogue warps of one warpgroup */
#define G_CONSUMER_REGS 168   /* registers a consumer thread (setmaxnreg) */
#define G_OTHER_REGS 88       /* and a thread of the other two warpgroups */
#define G_SUM_ROWS (G_BM / 2) /* rows a DGELU partial column sum covers */
#define G_BARRIERS (2 * G_STAGES + 6)
#define G_BIAS_BYTES (2 * G_BN * 2) /* the bias of two tiles, bf16 */
#define G_SMEM                                                                                     \
    (1024 + G_STAGES * G_STAGE_BYTES + 2 * G_STAGING_BYTES + G_BARRIERS * 8 + G_BIAS_BYTES)

/* GPC_SM90_PROFILE builds (not the default) sum clock64 intervals of the
 * first consumer thread and the first epilogue thread over all blocks. */
#ifdef GPC_SM90_PROFILE
__device__ unsigned long long g_prof[8];
#endif

#ifdef G_KERNEL_BODY
#ifdef GPC_SM90_PROFILE
#define G_PROF_T(v) long long v = clock64()
#define G_PROF_ADD(on, slot, t0)                                                                   \
    do {                                                                                           \
        if (on) atomicAdd(&g_prof[slot], (unsigned long long)(clock64() - (t0)));                  \
    } while (0)
#else
#define G_PROF_T(v)
#define G_PROF_ADD(on, slot, t0)
#endif

/* The epilogue's own barrier (named barrier 1, its three warps). */
__device__ __forceinline__ void g_epi_sync() {
    asm volatile("bar.sync 1, %0;" ::"n"(G_EPI_THREADS) : "memory");
}

/* The epilogues' elementwise work in f16 pairs, half the instructions of
 * f32 (the loops over it are latency-bound, hence unrolled). f16 keeps 11 bits,
 * more than the bf16 results' 8; x comes from bf16, so exactly, within the
 * clamps below. tanh.approx.f16x2 is good to about 2^-10.7. */
__device__ __forceinline__ __half2 g_tanh2(__half2 x) {
    uint32_t y, in = *(const uint32_t *)&x;
    asm("tanh.approx.f16x2 %0, %1;" : "=r"(y) : "r"(in));
    return *(const __half2 *)&y;
}

/* gelu of a pair: x . 0.5 (1 + tanh(u)) with the half-sum in f16 pairs and
 * the product in f32, so large x keep their value (the f16 copy of x is
 * clamped where tanh(u) is +-1 already). */
__device__ __forceinline__ __nv_bfloat162 g_gelu2(__nv_bfloat162 in) {
    float2 x = __bfloat1622float2(in);
    __half2 h = __hmax2(__hmin2(__floats2half2_rn(x.x, x.y), __float2half2_rn(16.0f)),
                        __float2half2_rn(-16.0f));
    __half2 v = __hfma2(__hmul2(h, h), __float2half2_rn(0.044715f * GPC_GELU_SCALE),
                        __float2half2_rn(GPC_GELU_SCALE));
    __half2 a = __hfma2(g_tanh2(__hmul2(h, v)), __float2half2_rn(0.5f), __float2half2_rn(0.5f));
    float2 af = __half22float2(a);
    return __floats2bfloat162_rn(x.x * af.x, x.y * af.y);
}

/* gelu' of a pair, as f16: 0.5 (1 + t) + 0.5 x (1 - t^2) u'(x) with t =
 * tanh(u), u = s (x + 0.044715 x^3). Beyond |x| = 8 it is 1 or 0 to f16's
 * precision (t is +-1), so x is clamped there. */
__device__ __forceinline__ __half2 g_gelu_grad2(__nv_bfloat162 in) {
    float2 xf = __bfloat1622float2(in);
    __half2 x = __hmax2(__hmin2(__floats2half2_rn(xf.x, xf.y), __float2half2_rn(8.0f)),
                        __float2half2_rn(-8.0f));
    __half2 x2 = __hmul2(x, x);
    __half2 v =
        __hfma2(x2, __float2half2_rn(0.044715f * GPC_GELU_SCALE), __float2half2_rn(GPC_GELU_SCALE));
    __half2 t = g_tanh2(__hmul2(x, v));
    __half2 a = __hfma2(t, __float2half2_rn(0.5f), __float2half2_rn(0.5f));
    __half2 s = __hfma2(__hneg2(t), t, __float2half2_rn(1.0f));
    __half2 du = __hfma2(x2, __float2half2_rn(3.0f * 0.044715f * GPC_GELU_SCALE),
                         __float2half2_rn(GPC_GELU_SCALE));
    return __hfma2(__hmul2(__hmul2(__float2half2_rn(0.5f), x), s), du, a);
}

/* The end of a DGELU tile in the epilogue, once the consumers have written
 * its y into buf (ready, of the given parity): the first thread queues its
 * TMA store and, with sums, the six warps add up its columns, so that
 * sums[m0 / 64 + h][n0 + column] is the column's sum over the tile's rows
 * 64h..64h+63. Epilogue warp w takes box w % 3 and half h = w / 3; lane l
 * the 16-byte chunk l % 8 of rows 64h + l / 8, 64h + l / 8 + 4, ..., so the
 * eight lanes of each quarter-warp read one whole 128-byte row, free of
 * bank conflicts. The row groups' sums are then added by shuffles in a
 * fixed order, and the epilogue syncs, since buf is reloaded next. */
__device__ __forceinline__ void g_dgelu_end(const CUtensorMap *map_y, const unsigned char *buf,
                                            uint64_t *ready, unsigned parity, int e, int m0, int n0,
                                            float *sums, int N) {
    static_assert(2 * (G_BN / 64) == G_EPI_THREADS / 32, "two epilogue warps a box");
    if (sums || e == 0) g_mbar_wait(ready, parity);
    if (e == 0) g_tma_store_tile(map_y, buf, n0, m0);
    if (!sums) return;
    const int w = e / 32 % 3, h = e / 32 / 3, lane = e % 32, c = lane % 8;
    const unsigned char *box = buf + w * G_BOX_BYTES;
    float s[8];
#pragma unroll
    for (int k = 0; k < 8; k++)
        s[k] = 0.0f;
#pragma unroll 4
    for (int r = G_SUM_ROWS * h + lane / 8; r < G_SUM_ROWS * (h + 1); r += 4) {
        uint4 v = *(const uint4 *)(box + r * 128 + ((c ^ (r % 8)) * 16));
        const uint32_t *u = (const uint32_t *)&v;
#pragma unroll
        for (int k = 0; k < 4; k++) { /* bf16 pairs: low element first */
            s[2 * k] += __uint_as_float(u[k] << 16);
            s[2 * k + 1] += __uint_as_float(u[k] & 0xffff0000u);
        }
    }
#pragma unroll
    for (int k = 0; k < 8; k++) {
        s[k] += __shfl_xor_sync(0xffffffffu, s[k], 8);
        s[k] += __shfl_xor_sync(0xffffffffu, s[k], 16);
    }
    if (lane < 8 && n0 + 64 * w < N) { /* the last tile's boxes beyond N are empty */
        float4 *dst = (float4 *)(sums + (size_t)(m0 / G_SUM_ROWS + h) * N + n0 + 64 * w + 8 * c);
        dst[0] = make_float4(s[0], s[1], s[2], s[3]);
        dst[1] = make_float4(s[4], s[5], s[6], s[7]);
    }
    g_epi_sync();
}

#endif /* G_KERNEL_BODY */

/* Tiles across N, the last one partly empty where N is not whole tiles. */
__host__ __device__ __forceinline__ int64_t sm90_tiles_n(int64_t N) {
    return (N + G_BN - 1) / G_BN;
}

/* MODE G_GELU: x = A . B^T + bias and y = gelu(x), both written (map_x,
 * map_y). MODE G_DGELU: y = (A . B^T) * gelu'(x), x read (map_x), and with
 * sums, y's column sums over each 128-row tile in sums[M / 128][N]. */
enum { G_GELU, G_DGELU };

#ifdef G_KERNEL_BODY
/* The consumers (warps 4-11): warpgroup c takes rows 64c..64c+63 of every
 * tile, its products (g_mainloop) and then its share of the tile's staging:
 * GELU, the sums plus the bias; DGELU, the sums times gelu'(x), which the
 * epilogue has put in the tile's staging buffer. */
template <int MODE, int CL>
__device__ __forceinline__ void g_consume(unsigned char *base, unsigned char *staging,
                                          uint64_t *full, uint64_t *empty, uint64_t *bar,
                                          const g_sched &sc, int kblocks, const gpc_bf16_t *bias,
                                          int N, int warp, int lane, int stm) {
    const int c = warp / 4 - 1, t = threadIdx.x % 128, cw = t / 32;
    const int r0 = 64 * c + 16 * cw + lane / 4, swz = r0 % 8;
    float acc[G_BN / 2];
    int pos = 0;
    unsigned j = 0;
    for (int w = sc.first; w < sc.works; w += sc.step, j++) {
        int m0, n0;
        sc.at(w, m0, n0);
        [[maybe_unused]] const bool prof = threadIdx.x == 128;
        /* GELU: the first 96 consumer threads fetch the tile's bias, a pair
         * each, while the products run; it goes to shared memory after them */
        const int ct = threadIdx.x - 128;
        __nv_bfloat162 bpair = __float2bfloat162_rn(0.0f);
        if (MODE == G_GELU && bias && ct < G_BN / 2 && n0 + 2 * ct < N)
            bpair = *(const __nv_bfloat162 *)(bias + n0 + 2 * ct);
        G_PROF_T(q0);
        g_mainloop<CL>(acc, base, full, empty, pos, kblocks, c, lane, sc.rank);
        G_PROF_ADD(prof, 0, q0);
#ifdef GPC_SM90_PROFILE
        if (prof) atomicAdd(&g_prof[3], 1ull);
#endif
        if (MODE == G_GELU) {
            /* stage the tile (with its bias) once the epilogue is done with the last one */
            __nv_bfloat162 *bias_s = (__nv_bfloat162 *)(full + G_BARRIERS) + (j & 1) * (G_BN / 2);
            if (ct < G_BN / 2) bias_s[ct] = bpair;
            /* the consumers' own barrier (named barrier 2): the bias is in.
             * Tile j + 2 writes this half again only after every consumer
             * has passed tile j + 1's barrier, so after these reads. */
            asm volatile("bar.sync 2, %0;" ::"n"(2 * 128) : "memory");
            G_PROF_T(q1);
            if (j > 0) g_mbar_wait(&bar[1], (j - 1) & 1);
            G_PROF_ADD(prof, 1, q1);
            G_PROF_T(q2);
            unsigned char *row0 = staging + r0 * 128 + 4 * (lane % 4);
            if (stm) {
#pragma unroll
                for (int q = 0; q < G_BN / 8; q += 2) {
                    const float2 b0 = __bfloat1622float2(bias_s[4 * q + lane % 4]);
                    const float2 b1 = __bfloat1622float2(bias_s[4 * (q + 1) + lane % 4]);
                    const float *d = acc + 4 * q;
                    g_stmatrix4(g_matrix_at(staging, r0 - lane / 4, q, lane),
                                g_pack_bf16(d[0] + b0.x, d[1] + b0.y),
                                g_pack_bf16(d[2] + b0.x, d[3] + b0.y),
                                g_pack_bf16(d[4] + b1.x, d[5] + b1.y),
                                g_pack_bf16(d[6] + b1.x, d[7] + b1.y));
                }
            } else {
                /* a box at a time: its 8 bias loads first, so they are in flight together */
#pragma unroll
                for (int q0 = 0; q0 < G_BN / 8; q0 += 8) {
                    float2 bb[8];
#pragma unroll
                    for (int q = 0; q < 8; q++)
                        bb[q] = __bfloat1622float2(bias_s[4 * (q0 + q) + lane % 4]);
#pragma unroll
                    for (int q = 0; q < 8; q++) {
                        unsigned char *at = g_stage_at(row0, q0 + q, swz);
                        const float *d = acc + 4 * (q0 + q);
                        *(__nv_bfloat162 *)at =
                            __floats2bfloat162_rn(d[0] + bb[q].x, d[1] + bb[q].y);
                        *(__nv_bfloat162 *)(at + 1024) =
                            __floats2bfloat162_rn(d[2] + bb[q].x, d[3] + bb[q].y);
                    }
                }
            }
            g_fence_async_smem();
            __syncwarp();
            if (lane == 0) g_mbar_arrive(&bar[0]);
            G_PROF_ADD(prof, 2, q2);
        } else {
            /* y = the sums times gelu'(x), which the epilogue has put in this tile's buffer */
            const int b = j & 1;
            unsigned char *row0 = staging + b * G_STAGING_BYTES + r0 * 128 + 4 * (lane % 4);
            G_PROF_T(q1);
            g_mbar_wait(&bar[2 + b], (j >> 1) & 1);
            G_PROF_ADD(prof, 1, q1);
            G_PROF_T(q2);
            if (stm) {
                unsigned char *tile = staging + b * G_STAGING_BYTES;
#pragma unroll
                for (int q = 0; q < G_BN / 8; q += 2) {
                    unsigned char *at = g_matrix_at(tile, r0 - lane / 4, q, lane);
                    uint32_t gv[4];
                    g_ldmatrix4(at, gv);
                    const float *d = acc + 4 * q;
                    float2 g[4];
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        g[i] = __half22float2(*(const __half2 *)&gv[i]);
                    g_stmatrix4(at, g_pack_bf16(d[0] * g[0].x, d[1] * g[0].y),
                                g_pack_bf16(d[2] * g[1].x, d[3] * g[1].y),
                                g_pack_bf16(d[4] * g[2].x, d[5] * g[2].y),
                                g_pack_bf16(d[6] * g[3].x, d[7] * g[3].y));
                }
            } else {
                /* a box at a time: its 16 loads first, so they are in flight together */
#pragma unroll
                for (int q0 = 0; q0 < G_BN / 8; q0 += 8) {
                    __half2 g[16];
#pragma unroll
                    for (int q = 0; q < 8; q++) {
                        const unsigned char *at = g_stage_at(row0, q0 + q, swz);
                        g[2 * q] = *(const __half2 *)at;
                        g[2 * q + 1] = *(const __half2 *)(at + 1024);
                    }
#pragma unroll
                    for (int q = 0; q < 8; q++) {
                        unsigned char *at = g_stage_at(row0, q0 + q, swz);
                        const float *d = acc + 4 * (q0 + q);
                        float2 g0 = __half22float2(g[2 * q]), g1 = __half22float2(g[2 * q + 1]);
                        *(__nv_bfloat162 *)at = __floats2bfloat162_rn(d[0] * g0.x, d[1] * g0.y);
                        *(__nv_bfloat162 *)(at + 1024) =
                            __floats2bfloat162_rn(d[2] * g1.x, d[3] * g1.y);
                    }
                }
            }
            g_fence_async_smem();
            __syncwarp();
            if (lane == 0) g_mbar_arrive(&bar[4 + b]);
            G_PROF_ADD(prof, 2, q2);
        }
    }
}
#endif

template <int MODE, int CL>
__global__ void __launch_bounds__(G_THREADS, 1)
    gemm_sm90_kernel(const __grid_constant__ CUtensorMap map_a,
                     const __grid_constant__ CUtensorMap map_b,
                     const __grid_constant__ CUtensorMap map_x,
                     const __grid_constant__ CUtensorMap map_y, const gpc_bf16_t *bias, float *sums,
                     int M, int N, int K, int stm) {
#ifdef G_KERNEL_BODY
    extern __shared__ __align__(1024) unsigned char g_shared[];
    /* the swizzled stages and staging boxes want 1024-byte alignment */
    unsigned char *base = (unsigned char *)(((uintptr_t)g_shared + 1023) & ~(uintptr_t)1023);
    /* two staging tiles: GELU's pre and act; DGELU's ring of two tiles */
    unsigned char *staging = base + G_STAGES * G_STAGE_BYTES;
    unsigned char *staging2 = staging + G_STAGING_BYTES;
    uint64_t *full = (uint64_t *)(staging2 + G_STAGING_BYTES);
    uint64_t *empty = full + G_STAGES, *bar = empty + G_STAGES;
    /* GELU: bar[0] the tile is staged, bar[1] the epilogue has drained it.
     * DGELU, each for staging tile b: bar[b] its x tile has arrived,
     * bar[2 + b] gelu'(x) is in it, bar[4 + b] the consumers' y is in it. */
    const int tiles_n = (int)sm90_tiles_n(N), kblocks = K / G_BK;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const g_sched sc = g_schedule<CL>(M / G_BM, tiles_n, 1); /* row by row */

    if (threadIdx.x == 0) {
        for (int s = 0; s < G_STAGES; s++) {
            g_mbar_init(&full[s], 1);
            g_mbar_init(&empty[s], 8 * CL); /* lane 0 of each consumer warp, of each block */
        }
        if (MODE == G_GELU) {
            g_mbar_init(&bar[0], 8); /* consumer warps: the tile is staged */
            g_mbar_init(&bar[1], 1); /* the epilogue: the pre staging is free again */
        } else {
            for (int b = 0; b < 2; b++) {
                g_mbar_init(&bar[b], 1);     /* the TMA load's bytes */
                g_mbar_init(&bar[2 + b], 1); /* the epilogue's first thread */
                g_mbar_init(&bar[4 + b], 8); /* consumer warps */
            }
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if (CL > 1) /* the peer's barriers are ready before any copy or arrival reaches them */
        g_cluster_sync();
    else
        __syncthreads();
    /* the consumers' accumulators want more registers than an even split of
     * 512 threads gives; the producer and epilogue warpgroups hand theirs
     * over (warp 15, unused, only takes part in that) */
    static_assert(2 * 128 * (G_CONSUMER_REGS + G_OTHER_REGS) <= 65536, "the register file");
    if (warp >= 4 && warp < 12) {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(G_CONSUMER_REGS));
        g_consume<MODE, CL>(base, staging, full, empty, bar, sc, kblocks, bias, N, warp, lane, stm);
        return;
    }
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(G_OTHER_REGS));
    if (warp == 15) return;
    /* epilogue threads: warps 1-3 and 12-14, numbered 0..191 */
    const bool epilogue = (warp >= 1 && warp < 4) || warp >= 12;
    const int e = warp < 4 ? (int)threadIdx.x - 32 : (int)threadIdx.x - 384 + G_EPI_HALF;

    if (warp == 0) { /* the producer */
        if (lane == 0) g_produce<CL>(base, full, empty, &map_a, &map_b, sc, kblocks);
        return;
    }

    if (epilogue && MODE == G_GELU) { /* the epilogue: x stored, y = gelu(x) */
        const uint4 *in = (const uint4 *)staging;
        uint4 *out = (uint4 *)staging2;
        unsigned j = 0;
        for (int w = sc.first; w < sc.works; w += sc.step, j++) {
            int m0, n0;
            sc.at(w, m0, n0);
            G_PROF_T(p0);
            g_mbar_wait(&bar[0], j & 1);
            G_PROF_ADD(e == 0, 4, p0);
            G_PROF_T(p1);
            if (e == 0) {
                g_tma_store_tile(&map_x, staging, n0, m0);
                g_bulk_wait_read<1>(); /* the last tile's act store has read staging2 */
            }
            g_epi_sync();
            /* GELU, elementwise, so the swizzled order is no matter */
#pragma unroll 4
            for (int i = e; i < G_STAGING_BYTES / 16; i += G_EPI_THREADS) {
                uint4 v = in[i];
                __nv_bfloat162 *w = (__nv_bfloat162 *)&v;
#pragma unroll
                for (int k = 0; k < 4; k++)
                    w[k] = g_gelu2(w[k]);
                out[i] = v;
            }
            g_fence_async_smem();
            g_epi_sync();
            G_PROF_ADD(e == 0, 5, p1);
            G_PROF_T(p2);
            if (e == 0) {
                g_tma_store_tile(&map_y, staging2, n0, m0);
                g_bulk_wait_read<1>(); /* this tile's pre store has read staging */
                g_mbar_arrive(&bar[1]);
            }
            G_PROF_ADD(e == 0, 6, p2);
        }
        if (e == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
        return;
    }

    if (epilogue && MODE == G_DGELU) { /* the epilogue: x loaded, gelu'(x) in its place, y stored */
        /* (and summed: each tile's end, g_dgelu_end, comes after the next
         * tile's gelu', so that it overlaps the consumers' products) */
        int prev_m0 = 0, prev_n0 = 0;
        unsigned j = 0;
        for (int w = sc.first; w < sc.works; w += sc.step, j++) {
            const int b = j & 1;
            int m0, n0;
            sc.at(w, m0, n0);
            unsigned char *buf = staging + b * G_STAGING_BYTES;
            if (e == 0) {
                /* tile j - 2's store, the last queued, has read buf */
                g_bulk_wait_read<0>();
                g_mbar_expect(&bar[b], G_STAGING_BYTES);
#pragma unroll
                for (int x = 0; x < G_BN / 64; x++)
                    g_tma_load(buf + x * G_BOX_BYTES, &map_x, n0 + 64 * x, m0, &bar[b]);
            }
            G_PROF_T(p0);
            g_mbar_wait(&bar[b], (j >> 1) & 1);
            G_PROF_ADD(e == 0, 4, p0);
            G_PROF_T(p1);
            /* gelu'(x) as f16 over x's bf16, elementwise */
#pragma unroll 4
            for (int i = e; i < G_STAGING_BYTES / 16; i += G_EPI_THREADS) {
                uint4 v = ((const uint4 *)buf)[i];
                uint32_t *w = (uint32_t *)&v;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    __half2 g = g_gelu_grad2(*(const __nv_bfloat162 *)&w[k]);
                    w[k] = *(const uint32_t *)&g;
                }
                ((uint4 *)buf)[i] = v;
            }
            g_epi_sync();
            G_PROF_ADD(e == 0, 5, p1);
            G_PROF_T(p2);
            if (e == 0) g_mbar_arrive(&bar[2 + b]);
            if (j > 0) /* the last tile's y, once the consumers have written it */
                g_dgelu_end(&map_y, staging + (b ^ 1) * G_STAGING_BYTES, &bar[4 + (b ^ 1)],
                            ((j - 1) >> 1) & 1, e, prev_m0, prev_n0, sums, N);
            G_PROF_ADD(e == 0, 6, p2);
            prev_m0 = m0, prev_n0 = n0;
        }
        if (j > 0) {
            const int b = (j - 1) & 1;
            g_dgelu_end(&map_y, staging + b * G_STAGING_BYTES, &bar[4 + b], ((j - 1) >> 1) & 1, e,
                        prev_m0, prev_n0, sums, N);
        }
        if (e == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
        return;
    }

#else
    (void)map_a, (void)map_b, (void)map_x, (void)map_y, (void)bias, (void)sums, (void)M, (void)N,
        (void)stm, (void)K;
#endif
}

/* --------------------------------------------------------------- host */

static PFN_cuTensorMapEncodeTiled_v12000 encode_fn;
static pthread_once_t encode_once = PTHREAD_ONCE_INIT;

static void encode_lookup(void) {
    cudaDriverEntryPointQueryResult q;
    void *fn = NULL;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
        encode_fn = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    else
        cudaGetLastError();
}

gpc_status gpc_sm90_make_map(CUtensorMap *map, const void *p, int64_t rows, int64_t cols,
                             unsigned box_rows) {
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)cols * 2};
    cuuint32_t box[2] = {64, box_rows}, elem[2] = {1, 1};
    CUresult r = encode_fn(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)p, dims, strides, box,
                           elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return gpc_error(GPC_ERR_DEVICE, "sm90: cuTensorMapEncodeTiled failed (%d)", (int)r);
    return GPC_OK;
}

int gpc_sm90_device_ok(int *cache, int (*kernels_ok)(int device)) {
    int d = 0, major = 0, minor = 0;
    if (cudaGetDevice(&d) != cudaSuccess || d < 0 || d >= GPC_CUDA_MAX_DEVICES) return 0;
    if (!cache[d]) {
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d);
        pthread_once(&encode_once, encode_lookup);
        int yes = major == 9 && minor == 0 && encode_fn && kernels_ok(d);
        if (!yes) cudaGetLastError();
        cache[d] = yes ? 2 : 1;
    }
    return cache[d] == 2;
}

/* Which products run here (GPC_GEMM_SM90, read once): both by default or
 * with "1", none with "0", "gelu" the forward, "dgelu" the backward; any
 * other value is said once and leaves both on. */
enum { SM90_GELU = 1, SM90_DGELU = 2 };
static int sm90_enabled(void) {
    static int enabled = -1;
    if (enabled < 0) {
        const char *e = gpc_setting_str("GPC_GEMM_SM90");
        const int both = SM90_GELU | SM90_DGELU;
        enabled = !e || !*e || !strcmp(e, "1") ? both
                  : !strcmp(e, "0")            ? 0
                  : !strcmp(e, "gelu")         ? SM90_GELU
                  : !strcmp(e, "dgelu")        ? SM90_DGELU
                                               : -1;
        if (enabled < 0) {
            gpc_log(GPC_LOG_WARN, "GPC_GEMM_SM90=%s is not 1, 0, gelu or dgelu: both stay on", e);
            enabled = both;
        }
    }
    return enabled;
}

template <int MODE, int CL> static int smem_ok(void) {
    return cudaFuncSetAttribute(gemm_sm90_kernel<MODE, CL>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, G_SMEM) == cudaSuccess;
}

/* The kernels' shared memory on device d, and how many clusters of two it
 * holds at once. */
static int clusters[GPC_CUDA_MAX_DEVICES];
static int kernels_ok(int d) {
    if (!(smem_ok<G_GELU, 1>() && smem_ok<G_DGELU, 1>() && smem_ok<G_DGELU, 2>())) return 0;
    clusters[d] = gpc_sm90_max_clusters(gemm_sm90_kernel<G_DGELU, 2>, G_THREADS, G_SMEM);
    return 1;
}

/* Whether this GPU runs the kernels (asked once per device). */
static int device_ok(void) {
    static int ok[GPC_CUDA_MAX_DEVICES];
    return gpc_sm90_device_ok(ok, kernels_ok);
}

static long calls, cluster_calls;

int gpc_cuda_gemm_sm90_available(void) {
    return sm90_enabled() && device_ok() ? sm90_enabled() : 0;
}

long gpc_cuda_gemm_sm90_calls(void) {
    return __atomic_load_n(&calls, __ATOMIC_RELAXED);
}

long gpc_cuda_gemm_sm90_cluster_calls(void) {
    return __atomic_load_n(&cluster_calls, __ATOMIC_RELAXED);
}

/* Whether the kernels take this product: which (SM90_*) on, M and K in
 * whole tiles, N in whole tiles or from 1024 on (K at most 1280) in whole
 * 64-column boxes (the last tile partly empty), sizes within int, pointers
 * 16-byte aligned, the GPU able. */
static int sm90_takes(int which, int64_t M, int64_t N, int64_t K, const void *const *ptrs,
                      int nptrs) {
    if (!(sm90_enabled() & which) || M <= 0 || N <= 0 || K <= 0 || M % G_BM ||
        (N % G_BN && (N % 64 || N < 1024 || K > 1280)) || K % G_BK || M > 0x7fffffff ||
        N > 0x7fffffff || K > 0x7fffffff || (M / G_BM) * sm90_tiles_n(N) > 0x7fffffff)
        return 0;
    for (int i = 0; i < nptrs; i++)
        if (!gpc_cuda_aligned16(ptrs[i])) return 0;
    return device_ok();
}

/* GPC_SM90_PROFILE builds: the kernel's intervals, in cycles a tile. */
static void sm90_profile(const char *what) {
#ifdef GPC_SM90_PROFILE
    unsigned long long p[8] = {0};
    cudaDeviceSynchronize();
    cudaMemcpyFromSymbol(p, g_prof, sizeof p);
    double n = p[3] ? (double)p[3] : 1.0;
    fprintf(stderr,
            "sm90 %s profile, cycles a tile (%llu tiles): consumer main loop %.0f, wait %.0f, "
            "staging %.0f; epilogue wait %.0f, work %.0f, stores %.0f\n",
            what, p[3], p[0] / n, p[1] / n, p[2] / n, p[4] / n, p[5] / n, p[6] / n);
    memset(p, 0, sizeof p);
    cudaMemcpyToSymbol(g_prof, p, sizeof p);
#else
    (void)what;
#endif
}

/* The DGELU product in clusters of two blocks sharing B's tiles
 * (GPC_GEMM_SM90_CLUSTER=1, read once) where the GPU holds them and the tile
 * rows pair up: the number of clusters resident at once, or 0 for single
 * blocks. (The GELU forward, whose epilogue does more a tile, measured 10%
 * slower in clusters, each block held to its peer's pace.) */
static int sm90_clusters(int mode, int64_t M) {
    static int on = -1;
    return mode == G_DGELU
               ? gpc_sm90_cluster_count("GPC_GEMM_SM90_CLUSTER", &on, clusters, M / G_BM)
               : 0;
}

/* The tensor maps of A [M, K], B [N, K], x and y [M, N], and the launch on a
 * persistent grid: one block a multiprocessor (or a cluster of two for each
 * pair that fits at once), or fewer where there are fewer tiles. */
template <int MODE>
static gpc_status sm90_launch(const void *a, const void *b, const void *x, const void *y,
                              const gpc_bf16_t *bias, float *sums, int64_t M, int64_t N,
                              int64_t K) {
    const int64_t tiles = (M / G_BM) * sm90_tiles_n(N);
    const int cl = sm90_clusters(MODE, M);
    CUtensorMap map_a, map_b, map_x, map_y;
    GPC_TRY(gpc_sm90_make_map(&map_a, a, M, K, G_BM));
    GPC_TRY(gpc_sm90_make_map(&map_b, b, N, K, cl ? G_BN / 2 : G_BN));
    GPC_TRY(gpc_sm90_make_map(&map_x, x, M, N, G_BM));
    GPC_TRY(gpc_sm90_make_map(&map_y, y, M, N, G_BM));
    if (cl) { /* sm90_clusters says 0 but for the DGELU product, the one with a clusters' kernel */
        if constexpr (MODE == G_DGELU) {
            int64_t works = tiles / 2;
            int grid = 2 * (int)(works < cl ? works : cl);
            cudaLaunchAttribute attr;
            cudaLaunchConfig_t cfg = gpc_sm90_cluster_config(&attr, grid, G_THREADS, G_SMEM);
            cudaError_t e =
                cudaLaunchKernelEx(&cfg, gemm_sm90_kernel<MODE, 2>, map_a, map_b, map_x, map_y,
                                   bias, sums, (int)M, (int)N, (int)K, gpc_sm90_stmatrix());
            if (e != cudaSuccess)
                return gpc_error(GPC_ERR_DEVICE, "gemm_sm90: cluster launch failed: %s",
                                 cudaGetErrorString(e));
            __atomic_add_fetch(&cluster_calls, 1, __ATOMIC_RELAXED);
        }
    } else {
        int sms = gpc_cuda_sm_count(), grid = (int)(tiles < sms ? tiles : sms);
        gemm_sm90_kernel<MODE, 1><<<grid, G_THREADS, G_SMEM, gpc_cuda_stream()>>>(
            map_a, map_b, map_x, map_y, bias, sums, (int)M, (int)N, (int)K, gpc_sm90_stmatrix());
    }
    GPC_CUDA_CHECK_LAUNCH();
    sm90_profile(MODE == G_GELU ? "GELU" : "DGELU");
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    return GPC_OK;
}

gpc_status gpc_cuda_gemm_gelu_sm90(gpc_bf16_t *pre, gpc_bf16_t *act, const gpc_bf16_t *a,
                                   const gpc_bf16_t *w, const gpc_bf16_t *bias, int64_t M,
                                   int64_t N, int64_t K) {
    const void *ptrs[4] = {pre, act, a, w};
    if (!sm90_takes(SM90_GELU, M, N, K, ptrs, 4))
        return gpc_error(GPC_ERR_UNSUPPORTED, "gemm_sm90: not for this shape or GPU");
    return sm90_launch<G_GELU>(a, w, pre, act, bias, NULL, M, N, K);
}

gpc_status gpc_cuda_gemm_dgelu_sm90(gpc_bf16_t *dinp, const gpc_tensor *pre_bias,
                                    const gpc_bf16_t *dout, const gpc_bf16_t *w,
                                    const gpc_bf16_t *pre, int64_t M, int64_t N, int64_t K) {
    const void *ptrs[4] = {dinp, dout, w, pre};
    if (!sm90_takes(SM90_DGELU, M, N, K, ptrs, 4))
        return gpc_error(GPC_ERR_UNSUPPORTED, "gemm_sm90: not for this shape or GPU");
    /* the scratch buffer: the kernel's B, w^T [N, K] (it wants B K-major),
     * then the column sums of each half tile (G_SUM_ROWS rows), [M / 64, N] f32 */
    size_t wt_bytes = ((size_t)(N * K) * 2 + 255) & ~(size_t)255;
    size_t sum_bytes = pre_bias ? (size_t)(M / G_SUM_ROWS * N) * sizeof(float) : 0;
    unsigned char *scratch = NULL;
    GPC_TRY(gpc_cuda_scratch(wt_bytes + sum_bytes, (void **)&scratch));
    float *sums = pre_bias ? (float *)(scratch + wt_bytes) : NULL;
    GPC_TRY(gpc_cuda_transpose16(scratch, w, K, N));
    GPC_TRY(sm90_launch<G_DGELU>(dout, scratch, pre, dinp, NULL, sums, M, N, K));
    return sums ? gpc_cuda_add_partial_sums(pre_bias, sums, (int)(M / G_SUM_ROWS), (int)N) : GPC_OK;
}
