/*
 * classifier_sm90.cu: the output head of a training step on Hopper without
 * a cross-entropy pass over the logits: the CUDA backend's classifier entry
 * (gpc_op_classifier).
 *
 * The unfused head writes the logits [N, Vp], reads them back in the
 * cross-entropy, writes dlogits over them and reads dlogits in both
 * backward products: five passes over 6.6 GB at GPT-2's training shape.
 * Here the head's product writes e = exp(logit - H_SHIFT) in place of each
 * logit, and dlogits is never formed:
 *   1. the product (this file's kernel): its epilogue turns each staged tile
 *      of bf16 logits into e (0 in the padded columns), keeps each row's
 *      largest logit and sum of e over the tile, and the target's logit;
 *   2. h_finish_kernel: each row's sum S over its tiles, the loss
 *      log S + H_SHIFT - logit[target], scale = dloss / S, and e at the
 *      target lowered by S in f32, so that e . scale is (softmax - onehot) .
 *      dloss exactly as the cross-entropy forms it (the softmax near 1 at a
 *      confident target cancels before rounding, not after);
 *   3. dinp = scale . (e . w): cuBLASLt's product, then its rows scaled;
 *   4. dw += e^T . (scale . inp): cuBLASLt's product with inp's rows scaled
 *      first.
 * So the big tensor crosses memory three times instead of five. The shift
 * keeps e within bf16's range for rows whose largest logit lies in
 * [H_MIN_LOGIT, H_MAX_LOGIT); a row outside it gets a NaN loss and NaN
 * gradients, which the trainer reports, rather than a wrong gradient.
 *
 * The product follows gemm_sm90.cu (sm90_common.cuh): persistent blocks of
 * 512 threads walking 128 x 192 tiles in groups of H_GROUP_M row tiles (so
 * a group's rows of inp stay in L2 while w streams past once), a ring of
 * three 64-wide K stages filled by TMA, two consumer warpgroups of 64 rows,
 * and two staging tiles. Warps: 0 the producer, 1 the stores, 4-11 the
 * consumers, 12-15 the epilogue (one row a thread); the rest idle. The
 * consumers take 168 registers a thread, the epilogue 120 (enough to load
 * half a box ahead of the one it works on), warps 0-3 the 56 left.
 * The blocks run in clusters of two on adjacent row tiles of the same
 * columns, each producer copying half of w's 192 rows into both blocks'
 * stages (TMA multicast, as gemm_sm90.cu's DGELU clusters): no faster
 * alone, but 3.4% less energy for the whole head at the power cap, and the
 * training step 1.0012-1.0029x in 9 of 11 rounds over four A/Bs
 * (bench/RESULTS.md). GPC_HEAD_CLUSTER=0 runs single blocks. (Four stages
 * with one staging tile ran slower; larger groups of row tiles did not
 * pay.)
 *
 * Shapes: N a multiple of 128, Vp of 192, C of 64.
 */
#include "cuda/matmul.h"
#include "cuda/sm90_common.cuh"

#include <math.h>

#define H_BUFS 2 /* staging tiles */
#define H_THREADS 512
#define H_BARRIERS (2 * G_STAGES + 3 * H_BUFS)
#define H_SMEM (1024 + G_STAGES * G_STAGE_BYTES + H_BUFS * G_STAGING_BYTES + H_BARRIERS * 8)
#define H_CONSUMER_REGS 168
#define H_SERVICE_REGS 56   /* warps 0-3 */
#define H_EPILOGUE_REGS 120 /* warps 12-15 */
#define H_GROUP_M 16        /* row tiles a group of the raster holds in L2 */
#define H_LOG2E 1.4426950408889634f
#define H_SHIFT 16.0f      /* e = exp(logit - H_SHIFT) */
#define H_MIN_LOGIT -50.0f /* a row's largest logit: e of it at least exp(-66) */
#define H_MAX_LOGIT 80.0f  /* and at most exp(64), so sums and products stay finite */

/* A row's largest logit and sum of e over one tile of 192 columns. */
struct h_stat {
    float max, sum;
};

#ifdef G_KERNEL_BODY
__device__ __forceinline__ float h_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* The consumers (warps 4-11): warpgroup c takes rows 64c..64c+63 of every
 * tile, a chain of m64n192k16 products over K, then writes its sums as bf16
 * logits into staging tile j % 2 once the store of tile j - 2 has read it. */
template <int CL>
__device__ __forceinline__ void h_consume(unsigned char *base, unsigned char *staging,
                                          uint64_t *full, uint64_t *empty, uint64_t *staged,
                                          uint64_t *freed, const g_sched &sc, int kblocks, int warp,
                                          int lane, int stm) {
    const int c = warp / 4 - 1, t = lane % 4;
    const int r0 = 64 * c + 16 * (warp % 4) + lane / 4, swz = r0 % 8;
    float acc[G_BN / 2];
    int pos = 0;
    unsigned j = 0;
    for (int w = sc.first; w < sc.works; w += sc.step, j++) {
        g_mainloop<CL>(acc, base, full, empty, pos, kblocks, c, lane, sc.rank);

        const int b = j % H_BUFS;
        if (j >= H_BUFS) g_mbar_wait(&freed[b], (j / H_BUFS - 1) & 1);
        unsigned char *tile = staging + b * G_STAGING_BYTES;
        if (stm) {
            const int rb = 64 * c + 16 * (warp % 4);
#pragma unroll
            for (int q = 0; q < G_BN / 8; q += 2) {
                const float *d = acc + 4 * q;
                g_stmatrix4(g_matrix_at(tile, rb, q, lane), g_pack_bf16(d[0], d[1]),
                            g_pack_bf16(d[2], d[3]), g_pack_bf16(d[4], d[5]),
                            g_pack_bf16(d[6], d[7]));
            }
        } else {
            unsigned char *row0 = tile + r0 * 128 + 4 * t;
#pragma unroll
            for (int q = 0; q < G_BN / 8; q++) {
                unsigned char *at = g_stage_at(row0, q, swz);
                const float *d = acc + 4 * q;
                *(__nv_bfloat162 *)at = __floats2bfloat162_rn(d[0], d[1]);
                *(__nv_bfloat162 *)(at + 1024) = __floats2bfloat162_rn(d[2], d[3]);
            }
        }
        __syncwarp();
        if (lane == 0) g_mbar_arrive(&staged[b]);
    }
}

/* The 16-byte chunks 4(h % 2) .. +3 of box h / 2 of a staged row: its
 * columns 32h .. 32h + 31, read in the swizzled order (sw = row % 8), so the
 * 32 rows of a warp cover all banks. */
__device__ __forceinline__ unsigned char *h_chunk(unsigned char *row, int h, int i, int sw) {
    return row + h / 2 * G_BOX_BYTES + (((4 * (h % 2) + i) ^ sw) << 4);
}

__device__ __forceinline__ void h_load_half(uint4 v[4], unsigned char *row, int h, int sw) {
#pragma unroll
    for (int i = 0; i < 4; i++)
        v[i] = *(const uint4 *)h_chunk(row, h, i, sw);
}

/* Half a box of a row (columns n0 + 32h ..): each logit x becomes e =
 * exp(x - H_SHIFT) in bf16, 0 at and past column V, written back; mx and
 * sum take the real logits' maximum and the stored e's sum (two maxima and
 * four sums, so that the exponentials overlap). */
__device__ __forceinline__ void h_exp_half(uint4 v[4], unsigned char *row, int h, int sw, int n0,
                                           int V, bool all_real, float mx[2], float sum[4]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t u[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
        const int col = n0 + 32 * h + 8 * i;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float lo = __uint_as_float(u[k] << 16);
            const float hi = __uint_as_float(u[k] & 0xffff0000u);
            const bool real_lo = all_real || col + 2 * k < V;
            const bool real_hi = all_real || col + 2 * k + 1 < V;
            mx[0] = fmaxf(mx[0], real_lo ? lo : -INFINITY);
            mx[1] = fmaxf(mx[1], real_hi ? hi : -INFINITY);
            const float e_lo = real_lo ? h_exp2(fmaf(lo, H_LOG2E, -H_SHIFT * H_LOG2E)) : 0.0f;
            const float e_hi = real_hi ? h_exp2(fmaf(hi, H_LOG2E, -H_SHIFT * H_LOG2E)) : 0.0f;
            asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(u[k]) : "f"(e_hi), "f"(e_lo));
            /* the sum of the values stored */
            sum[k] += __uint_as_float(u[k] << 16) + __uint_as_float(u[k] & 0xffff0000u);
        }
        *(uint4 *)h_chunk(row, h, i, sw) = make_uint4(u[0], u[1], u[2], u[3]);
    }
}

/* The epilogue for one staged tile (warps 12-15, thread e = row e): each
 * bf16 logit of the row becomes e (h_exp_half) in place; the row's largest
 * logit and sum of the stored e go to stats[n0 / 192][m0 + e], and its
 * target's logit, if the tile holds it, to target_logit[m0 + e]. Each half
 * box's loads are issued before the half box ahead of it is worked on, so
 * that their latency (long while the products read shared memory) is
 * hidden. */
__device__ __forceinline__ void h_epilogue(unsigned char *buf, h_stat *stats, float *target_logit,
                                           int target, int e, int m0, int n0, int N, int V) {
    unsigned char *row = buf + e * 128;
    const int sw = e % 8;
    const bool all_real = n0 + G_BN <= V;
    /* the target's logit first, read where it lies before it becomes e */
    if (target >= n0 && target < n0 + G_BN) {
        const int col = target - n0;
        const unsigned char *at = h_chunk(row, col / 32, col % 32 / 8, sw);
        const uint16_t bits = *(const uint16_t *)(at + (col % 8) * 2);
        target_logit[m0 + e] = __uint_as_float((uint32_t)bits << 16);
    }
    float mx[2] = {-INFINITY, -INFINITY}, sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    uint4 even[4], odd[4];
    h_load_half(even, row, 0, sw);
#pragma unroll 1
    for (int h = 0; h < G_BN / 32; h += 2) {
        h_load_half(odd, row, h + 1, sw);
        h_exp_half(even, row, h, sw, n0, V, all_real, mx, sum);
        if (h + 2 < G_BN / 32) h_load_half(even, row, h + 2, sw);
        h_exp_half(odd, row, h + 1, sw, n0, V, all_real, mx, sum);
    }
    stats[(size_t)(n0 / G_BN) * N + m0 + e] = {fmaxf(mx[0], mx[1]),
                                               (sum[0] + sum[1]) + (sum[2] + sum[3])};
}
#endif /* G_KERNEL_BODY */

/* e = exp(inp . w^T - H_SHIFT) (A inp [N, C], B w [Vp, C], y e [N, Vp])
 * with each tile's statistics (h_epilogue). */
template <int CL>
__global__ void __launch_bounds__(H_THREADS, 1)
    classifier_sm90_kernel(const __grid_constant__ CUtensorMap map_a,
                           const __grid_constant__ CUtensorMap map_b,
                           const __grid_constant__ CUtensorMap map_y, h_stat *stats,
                           float *target_logit, const int32_t *targets, int tiles_m, int tiles_n,
                           int kblocks, int N, int V, int stm) {
#ifdef G_KERNEL_BODY
    extern __shared__ __align__(1024) unsigned char h_shared[];
    unsigned char *base = (unsigned char *)(((uintptr_t)h_shared + 1023) & ~(uintptr_t)1023);
    unsigned char *staging = base + G_STAGES * G_STAGE_BYTES;
    uint64_t *full = (uint64_t *)(staging + H_BUFS * G_STAGING_BYTES);
    uint64_t *empty = full + G_STAGES, *staged = empty + G_STAGES;
    uint64_t *ready = staged + H_BUFS, *freed = ready + H_BUFS;
    /* for staging tile b: staged[b] the consumers have written its logits,
     * ready[b] the epilogue has turned them into e, freed[b] its store has
     * read it */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const g_sched sc = g_schedule<CL>(tiles_m, tiles_n, H_GROUP_M);

    if (threadIdx.x == 0) {
        for (int s = 0; s < G_STAGES; s++) {
            g_mbar_init(&full[s], 1);
            g_mbar_init(&empty[s], 8 * CL); /* lane 0 of each consumer warp, of each block */
        }
        for (int b = 0; b < H_BUFS; b++) {
            g_mbar_init(&staged[b], 8);
            g_mbar_init(&ready[b], 1);
            g_mbar_init(&freed[b], 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if (CL > 1) /* the peer's barriers are ready before any copy or arrival reaches them */
        g_cluster_sync();
    else
        __syncthreads();
    /* registers a thread, moved to the consumers from the others (each
     * warpgroup's code reachable from its own setmaxnreg alone, or ptxas
     * holds them all to the least) */
    static_assert(128 * (H_SERVICE_REGS + 2 * H_CONSUMER_REGS + H_EPILOGUE_REGS) <= 65536,
                  "the register file");
    if (warp >= 12) { /* the epilogue */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(H_EPILOGUE_REGS));
        const int e = threadIdx.x - 384;
        unsigned j = 0;
        for (int w = sc.first; w < sc.works; w += sc.step, j++) {
            const int b = j % H_BUFS;
            int m0, n0;
            sc.at(w, m0, n0);
            const int target = targets[m0 + e];
            g_mbar_wait(&staged[b], (j / H_BUFS) & 1);
            h_epilogue(staging + b * G_STAGING_BYTES, stats, target_logit, target, e, m0, n0, N, V);
            g_fence_async_smem(); /* the e written here, before the TMA store reads it */
            asm volatile("bar.sync 1, 128;" ::: "memory");
            if (e == 0) g_mbar_arrive(&ready[b]);
        }
        return;
    }
    if (warp >= 4 && warp < 12) {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(H_CONSUMER_REGS));
        h_consume<CL>(base, staging, full, empty, staged, freed, sc, kblocks, warp, lane, stm);
        return;
    }
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(H_SERVICE_REGS));

    if (warp == 0) {
        if (lane == 0) g_produce<CL>(base, full, empty, &map_a, &map_b, sc, kblocks);
        return;
    }
    if (warp == 1) { /* the stores */
        if (lane != 0) return;
        unsigned j = 0;
        for (int w = sc.first; w < sc.works; w += sc.step, j++) {
            const int b = j % H_BUFS;
            int m0, n0;
            sc.at(w, m0, n0);
            g_mbar_wait(&ready[b], (j / H_BUFS) & 1);
            g_tma_store_tile(&map_y, staging + b * G_STAGING_BYTES, n0, m0);
            g_bulk_wait_read<0>();
            g_mbar_arrive(&freed[b]);
        }
        asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
        return;
    }
#else
    (void)map_a, (void)map_b, (void)map_y, (void)stats, (void)target_logit, (void)targets,
        (void)tiles_m, (void)tiles_n, (void)kblocks, (void)N, (void)V, (void)stm;
#endif
}

/* Each row's sum S of e over its tiles (in tile order) and largest logit;
 * then losses[n] = log S + H_SHIFT - logit[target], scale[n] = dloss / S and
 * e[n][target] -= S (in f32, rounded once). A masked row (target -1): loss
 * 0, scale 0. A target outside 0..V-1, or a largest logit outside
 * [H_MIN_LOGIT, H_MAX_LOGIT): NaN loss and scale. A block takes 32 rows,
 * lane l row l, warp w the tiles w, w + 8, ... (coalesced reads of stats
 * [tiles][N]). */
#define H_FINISH_WARPS 8
__global__ void __launch_bounds__(32 * H_FINISH_WARPS)
    h_finish_kernel(float *losses, float *scale, __nv_bfloat16 *e, const h_stat *stats,
                    const float *target_logit, const int32_t *targets, int N, int tiles_n,
                    int64_t Vp, int V, float dloss) {
    __shared__ float sm[H_FINISH_WARPS][32], ss[H_FINISH_WARPS][32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int n = blockIdx.x * 32 + lane;
    float m = -INFINITY, s = 0.0f;
    if (n < N)
        for (int tn = warp; tn < tiles_n; tn += H_FINISH_WARPS) {
            const h_stat st = stats[(size_t)tn * N + n];
            m = fmaxf(m, st.max);
            s += st.sum;
        }
    sm[warp][lane] = m;
    ss[warp][lane] = s;
    __syncthreads();
    if (warp != 0 || n >= N) return;
    for (int w = 1; w < H_FINISH_WARPS; w++) {
        m = fmaxf(m, sm[w][lane]);
        s += ss[w][lane];
    }
    const int tgt = targets[n];
    float loss, sc;
    if (tgt == -1) {
        loss = sc = 0.0f;
    } else if (tgt < 0 || tgt >= V || !(m >= H_MIN_LOGIT && m < H_MAX_LOGIT)) {
        loss = sc = NAN;
    } else {
        loss = logf(s) + H_SHIFT - target_logit[n];
        sc = dloss / s;
        __nv_bfloat16 *at = e + (size_t)n * Vp + tgt;
        *at = __float2bfloat16_rn(__bfloat162float(*at) - s);
    }
    losses[n] = loss;
    scale[n] = sc;
}

/* out[n][c] = x[n][c] * scale[n], bf16 rows of C (a multiple of 8), 16
 * bytes a thread; out may be x. */
__global__ void h_scale_rows_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *x, const float *scale,
                                    int64_t packs, int C) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= packs) return;
    const float f = scale[i * 8 / C];
    uint4 v = ((const uint4 *)x)[i];
    __nv_bfloat162 *p = (__nv_bfloat162 *)&v;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 a = __bfloat1622float2(p[k]);
        p[k] = __floats2bfloat162_rn(a.x * f, a.y * f);
    }
    ((uint4 *)out)[i] = v;
}

/* --------------------------------------------------------------- host */

static gpc_status scale_rows(gpc_bf16_t *out, const gpc_bf16_t *x, const float *scale, int64_t N,
                             int64_t C) {
    const int64_t packs = N * C / 8;
    h_scale_rows_kernel<<<(unsigned)((packs + 255) / 256), 256, 0, gpc_cuda_stream()>>>(
        (__nv_bfloat16 *)out, (const __nv_bfloat16 *)x, scale, packs, (int)C);
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

/* Clusters of two blocks of the kernel resident at once, a device. */
static int h_clusters[GPC_CUDA_MAX_DEVICES];

static int h_kernel_ok(int device) {
    if (cudaFuncSetAttribute(classifier_sm90_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             H_SMEM) != cudaSuccess ||
        cudaFuncSetAttribute(classifier_sm90_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             H_SMEM) != cudaSuccess)
        return 0;
    h_clusters[device] = gpc_sm90_max_clusters(classifier_sm90_kernel<2>, H_THREADS, H_SMEM);
    return 1;
}

/* The product in clusters of two blocks sharing w's tiles (unless
 * GPC_HEAD_CLUSTER=0, read once) where the GPU holds them and the row
 * tiles pair up: how many clusters are resident at once, or 0 for single
 * blocks. */
static int h_cluster_count(int64_t tiles_m) {
    static int on = -1;
    return gpc_sm90_cluster_count("GPC_HEAD_CLUSTER", &on, h_clusters, tiles_m);
}

/* Whether this GPU runs the kernel (asked once per device). */
static int h_device_ok(void) {
    static int ok[GPC_CUDA_MAX_DEVICES];
    return gpc_sm90_device_ok(ok, h_kernel_ok);
}

int gpc_cuda_classifier_sm90_available(void) {
    static int head_on = -1;
    return gpc_cuda_setting_flag("GPC_GEMM_SM90_HEAD", &head_on) &&
           gpc_cuda_gemm_sm90_available() && h_device_ok();
}

static long calls;

long gpc_cuda_classifier_sm90_calls(void) {
    return __atomic_load_n(&calls, __ATOMIC_RELAXED);
}

/* The CUDA backend's classifier entry (gpc_op_classifier; ops.c has checked
 * the tensors). In bf16 on Hopper:
 *   losses[n] = logsumexp(logits[n][0..V-1]) - logits[n][targets[n]];
 *   dinp = dlogits . weight, overwritten; dweight += dlogits^T . inp;
 * for logits = inp . weight^T and dlogits = (softmax(logits[n][0..V-1]) -
 * onehot(targets[n])) * dloss, zero in the padded columns V..Vp-1. The
 * [N, Vp] buffer logits is scratch: it ends up holding exp(logits - 16),
 * lowered at the targets, which with a per-row scale is dlogits. A target of
 * -1 masks its row (loss 0, gradient 0); one outside 0..V-1, or a row whose
 * largest logit is below -50 or at least 80, gives a NaN loss and NaN
 * gradients. GPC_ERR_UNSUPPORTED (nothing queued) for another dtype, unless
 * N is a multiple of 128, Vp of 192, C of 64, the buffers 16-byte aligned,
 * the GPU of compute capability 9.0 and GPC_GEMM_SM90 / GPC_GEMM_SM90_HEAD
 * not turning it off; ops.c then runs the product, the cross-entropy and the
 * backward products in turn. */
gpc_status gpc_cuda_classifier(gpc_tensor *losses, gpc_tensor *dinp, gpc_tensor *dweight,
                               gpc_tensor *logits, const gpc_tensor *inp, const gpc_tensor *weight,
                               const gpc_tensor *targets, int V, float dloss) {
    GPC_TRY(gpc_cuda_enter(inp));
    if (inp->dtype != GPC_BF16) /* ops.c checked that the others are inp's dtype */
        return gpc_error(GPC_ERR_UNSUPPORTED, "classifier: no fused kernel for %s on the GPU",
                         gpc_dtype_name(inp->dtype));
    const int64_t C = inp->shape[inp->ndim - 1], N = C ? gpc_tensor_numel(inp) / C : 0;
    const int64_t Vp = C ? gpc_tensor_numel(weight) / C : 0;
    const void *ptrs[7] = {losses->data, dinp->data,   dweight->data, logits->data,
                           inp->data,    weight->data, targets->data};
    int aligned = 1;
    for (int i = 0; i < 7; i++)
        aligned &= gpc_cuda_aligned16(ptrs[i]);
    if (N <= 0 || Vp <= 0 || C <= 0 || N % G_BM || Vp % G_BN || C % G_BK || V <= 0 || V > Vp ||
        N > 0x7fffffff || Vp > 0x7fffffff || C > 0x7fffffff ||
        (N / G_BM) * (Vp / G_BN) > 0x7fffffff || !(dloss >= 0.0f) || !aligned ||
        !gpc_cuda_classifier_sm90_available())
        return gpc_error(GPC_ERR_UNSUPPORTED, "classifier_sm90: not for this shape or GPU");
    /* scratch: the tiles' statistics, the target logits, the row scales and
     * inp's rows scaled (cuBLASLt's products below use none of it) */
    const int64_t tiles_m = N / G_BM, tiles_n = Vp / G_BN;
    const size_t stat_bytes = ((size_t)(tiles_n * N) * sizeof(h_stat) + 255) & ~(size_t)255;
    const size_t row_bytes = ((size_t)N * sizeof(float) + 255) & ~(size_t)255;
    unsigned char *scratch = NULL;
    GPC_TRY(gpc_cuda_scratch(stat_bytes + 2 * row_bytes + (size_t)(N * C) * 2, (void **)&scratch));
    h_stat *stats = (h_stat *)scratch;
    float *target_logit = (float *)(scratch + stat_bytes);
    float *scale = (float *)(scratch + stat_bytes + row_bytes);
    gpc_bf16_t *inp_scaled = (gpc_bf16_t *)(scratch + stat_bytes + 2 * row_bytes);

    /* 1. e and the tiles' statistics: one block a multiprocessor, or in
     * clusters of two, each block's producer copying half of w's 192 rows
     * into both blocks' stages (map_b's boxes then 96 rows) */
    const int64_t tiles = tiles_m * tiles_n;
    const int clusters = h_cluster_count(tiles_m);
    CUtensorMap map_a, map_b, map_y;
    GPC_TRY(gpc_sm90_make_map(&map_a, inp->data, N, C, G_BM));
    GPC_TRY(gpc_sm90_make_map(&map_y, logits->data, N, Vp, G_BM));
    GPC_TRY(gpc_sm90_make_map(&map_b, weight->data, Vp, C, clusters ? G_BN / 2 : G_BN));
    const int grid = gpc_sm90_grid(tiles), stm = gpc_sm90_stmatrix();
    const int32_t *tgt = (const int32_t *)targets->data;
    const int kblocks = (int)(C / G_BK);
    if (clusters) {
        int pairs = (grid + 1) / 2;
        if (pairs > clusters) pairs = clusters;
        cudaLaunchAttribute attr;
        cudaLaunchConfig_t cfg = gpc_sm90_cluster_config(&attr, 2 * pairs, H_THREADS, H_SMEM);
        cudaError_t e = cudaLaunchKernelEx(&cfg, classifier_sm90_kernel<2>, map_a, map_b, map_y,
                                           stats, target_logit, tgt, (int)tiles_m, (int)tiles_n,
                                           kblocks, (int)N, V, stm);
        if (e != cudaSuccess)
            return gpc_error(GPC_ERR_DEVICE, "classifier_sm90: cluster launch failed: %s",
                             cudaGetErrorString(e));
    } else {
        classifier_sm90_kernel<1><<<(unsigned)grid, H_THREADS, H_SMEM, gpc_cuda_stream()>>>(
            map_a, map_b, map_y, stats, target_logit, tgt, (int)tiles_m, (int)tiles_n, kblocks,
            (int)N, V, stm);
    }
    GPC_CUDA_CHECK_LAUNCH();
    /* 2. the losses, the row scales, e at the targets */
    h_finish_kernel<<<(unsigned)((N + 31) / 32), 32 * H_FINISH_WARPS, 0, gpc_cuda_stream()>>>(
        (float *)losses->data, scale, (__nv_bfloat16 *)logits->data, stats, target_logit,
        (const int32_t *)targets->data, (int)N, (int)tiles_n, Vp, V, dloss);
    GPC_CUDA_CHECK_LAUNCH();
    /* 3. dinp = scale . (e . weight) */
    gpc_bf16_t *dinp_data = (gpc_bf16_t *)dinp->data;
    GPC_TRY(gpc_cuda_matmul_backward(dinp, NULL, NULL, logits, inp, weight));
    GPC_TRY(scale_rows(dinp_data, dinp_data, scale, N, C));
    /* 4. dweight += e^T . (scale . inp) */
    GPC_TRY(scale_rows(inp_scaled, (const gpc_bf16_t *)inp->data, scale, N, C));
    gpc_tensor scaled = gpc_tensor_2d(inp_scaled, GPC_BF16, inp->device, N, C);
    GPC_TRY(gpc_cuda_matmul_backward(NULL, dweight, NULL, logits, &scaled, weight));
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    return GPC_OK;
}
