/*
 * sm90_common.cuh: what gpc's Hopper kernels share (gemm_sm90.cu,
 * classifier_sm90.cu): the tile geometry, the PTX wrappers for mbarriers,
 * TMA and wgmma, the persistent tile schedule, and the host's tensor maps.
 * Built for sm_90a only (CMakeLists.txt: the *_sm90.cu files).
 *
 * A tile is G_BM x G_BN outputs; each stage of the ring holds a 64-wide K
 * slice (one 128-byte swizzle row) of A's G_BM rows and B's G_BN rows, and
 * a staging tile is three [128][64] boxes in the 128-byte swizzle, the
 * layout the TMA copies use.
 */
#ifndef GPC_CUDA_SM90_COMMON_CUH
#define GPC_CUDA_SM90_COMMON_CUH

#include "cuda/cuda_common.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>

#define G_BM 128                          /* rows of A (tokens) per tile */
#define G_BK 64                           /* K per stage: one 128-byte swizzle row */
#define G_BN 192                          /* rows of B (output columns) per tile */
#define G_A_BYTES (G_BM * G_BK * 2)       /* 16 KiB */
#define G_B_BYTES (G_BN * G_BK * 2)       /* 24 KiB */
#define G_BOX_BYTES (G_BM * 64 * 2)       /* a staging box: [128][64] bf16 */
#define G_STAGING_BYTES (G_BM * G_BN * 2) /* one staging tile, 48 KiB */
#define G_STAGES 3                        /* ring depth */
#define G_STAGE_BYTES (G_A_BYTES + G_B_BYTES)

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define G_KERNEL_BODY 1
#endif

#ifdef G_KERNEL_BODY
/* ------------------------------------------------------- PTX wrappers */
__device__ __forceinline__ uint32_t g_smem(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void g_mbar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(g_smem(bar)), "r"(count));
}

__device__ __forceinline__ void g_mbar_expect(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(g_smem(bar)),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void g_mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(g_smem(bar)) : "memory");
}

/* Waits until the phase of the given parity has completed. A waiter may be
 * at most one phase behind the barrier, which the callers ensure. */
__device__ __forceinline__ void g_mbar_wait(uint64_t *bar, unsigned parity) {
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "WAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WAIT_%=;\n"
                 "}\n" ::"r"(g_smem(bar)),
                 "r"(parity)
                 : "memory");
}

/* A box [rows][64] at (k, row) of the tensor map into dst. */
__device__ __forceinline__ void g_tma_load(void *dst, const CUtensorMap *map, int k, int row,
                                           uint64_t *bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];" ::"r"(g_smem(dst)),
                 "l"(map), "r"(k), "r"(row), "r"(g_smem(bar))
                 : "memory");
}

/* The same box copied into this CTA's and its cluster peer's shared memory
 * at the same offset (cta_mask 0b11), each copy signalling the mbarrier at
 * bar's offset in its own CTA. */
__device__ __forceinline__ void g_tma_load_multicast(void *dst, const CUtensorMap *map, int k,
                                                     int row, uint64_t *bar, uint16_t cta_mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(g_smem(dst)),
                 "l"(map), "r"(k), "r"(row), "r"(g_smem(bar)), "h"(cta_mask)
                 : "memory");
}

/* Arrives on the mbarrier at bar's offset in cluster CTA cta. */
__device__ __forceinline__ void g_mbar_arrive_cta(uint64_t *bar, unsigned cta) {
    asm volatile("{\n"
                 ".reg .b32 remote;\n"
                 "mapa.shared::cluster.u32 remote, %0, %1;\n"
                 "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
                 "}\n" ::"r"(g_smem(bar)),
                 "r"(cta)
                 : "memory");
}

__device__ __forceinline__ unsigned g_cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

/* Every thread of both CTAs of the cluster. */
__device__ __forceinline__ void g_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;" ::
                     : "memory");
}

/* The wgmma descriptor of a K-major tile with 128-byte rows in the 128-byte
 * swizzle (8-row atoms of 1024 bytes): start address, leading offset 1
 * (unused for this layout), stride offset 1024 bytes, swizzle mode 1. */
__device__ __forceinline__ uint64_t g_desc_at(uint32_t smem_addr) {
    return ((uint64_t)(smem_addr & 0x3FFFF) >> 4) | (1ull << 16) | ((uint64_t)(1024 >> 4) << 32) |
           (1ull << 62);
}
__device__ __forceinline__ uint64_t g_desc(const void *p) {
    return g_desc_at(g_smem(p));
}

__device__ __forceinline__ void g_wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void g_wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N> __device__ __forceinline__ void g_wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

/* d[96] += A (64 x 16) . B (192 x 16)^T, or d = the product. */
__device__ __forceinline__ void g_wgmma(float *d, uint64_t a, uint64_t b, int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %98, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, "
        "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, "
        "%55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, "
        "%73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, "
        "%91, %92, %93, %94, %95}, "
        "%96, %97, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
          "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
          "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
          "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
          "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
          "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
          "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
        : "l"(a), "l"(b), "r"(accumulate));
}

/* A staging tile's three boxes to the tensor map at column n0, row m0
 * (one thread), as one bulk group. */
__device__ __forceinline__ void g_tma_store_tile(const CUtensorMap *map, const void *staging,
                                                 int n0, int m0) {
#pragma unroll
    for (int b = 0; b < G_BN / 64; b++)
        asm volatile(
            "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(
                map),
            "r"(n0 + 64 * b), "r"(m0), "r"(g_smem((const unsigned char *)staging + b * G_BOX_BYTES))
            : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

/* Waits until all but the newest N bulk store groups of this thread have
 * read their shared memory. */
template <int N> __device__ __forceinline__ void g_bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

/* Makes this thread's shared-memory writes visible to TMA (async proxy). */
__device__ __forceinline__ void g_fence_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/* Which tiles a block takes, in order. The blocks of a cluster of cl (1 or
 * 2) take work items first, first + step, ... of works = tiles / cl; item w
 * is the tiles of columns n0 and rows m0 (at(w)), one per block of the cluster
 * (rank), which so share the tile of B. The items are walked in groups of
 * `group` row items (rows in all), each group down all tiles_n columns, a
 * column's row items together: with group 1 row by row, with more a group's
 * rows of A stay in L2 while B streams past once. */
struct g_sched {
    int first, step, works, tiles_n, rank, cl, group, rows;
    __device__ void at(int w, int &m0, int &n0) const {
        const int g = w / (group * tiles_n), r = w % (group * tiles_n);
        const int top = g * group, gm = min(group, rows - top);
        m0 = ((top + r % gm) * cl + rank) * G_BM;
        n0 = r / gm * G_BN;
    }
};

/* A block's schedule over tiles_m x tiles_n tiles (tiles_m a multiple of
 * CL), in groups of group row items. */
template <int CL>
__device__ __forceinline__ g_sched g_schedule(int tiles_m, int tiles_n, int group) {
    const int rank = CL > 1 ? (int)g_cluster_rank() : 0;
    return {
        (int)blockIdx.x / CL, (int)gridDim.x / CL, tiles_m / CL * tiles_n, tiles_n, rank, CL, group,
        tiles_m / CL};
}

/* Where a consumer thread's sums go in a staging tile: acc[4q + e] is row r0
 * (+8 for e >= 2), column 8q + 2(lane%4) (+1 for odd e), so box q/8, 16-byte
 * chunk q%8 of its 128-byte row, which the swizzle puts at chunk (q%8) ^
 * (row%8), the same for both rows (row r0 + 8 is 1024 bytes on). */
__device__ __forceinline__ unsigned char *g_stage_at(unsigned char *row0, int q, int swz) {
    return row0 + (q / 8) * G_BOX_BYTES + (((q % 8) ^ swz) * 16);
}

/* Four 8 x 8 bf16 matrices from a warp's registers into shared memory
 * (stmatrix): lane l gives the address of row l % 8 of matrix l / 8, and its
 * register i holds matrix i's row l / 4, columns 2(l % 4) and + 1, the
 * layout of a wgmma accumulator's column pairs. One instruction where
 * 4-byte stores take four. */
__device__ __forceinline__ void g_stmatrix4(void *at, uint32_t a, uint32_t b, uint32_t c,
                                            uint32_t d) {
    asm volatile(
        "stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(g_smem(at)),
        "r"(a), "r"(b), "r"(c), "r"(d)
        : "memory");
}

/* The same four matrices loaded (ldmatrix), in the same layout. */
__device__ __forceinline__ void g_ldmatrix4(const void *at, uint32_t v[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                 : "r"(g_smem(at))
                 : "memory");
}

__device__ __forceinline__ uint32_t g_pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* The address lane gives g_stmatrix4 / g_ldmatrix4 for a consumer warp's
 * rows rb .. rb + 15 (rb a multiple of 8) and column chunks q and q + 1 of 8
 * columns in a staging tile (boxes of [128][64] in the 128-byte swizzle):
 * matrices (q, rows rb..), (q, rows rb + 8..), (q + 1, rb..), (q + 1, rb + 8..),
 * which are acc[4q .. 4q + 7] of g_stage_at's layout. */
__device__ __forceinline__ unsigned char *g_matrix_at(unsigned char *tile, int rb, int q,
                                                      int lane) {
    const int m = lane / 8, i = lane % 8, row = rb + i + 8 * (m % 2), k = q + m / 2;
    return tile + (k / 8) * G_BOX_BYTES + row * 128 + (((k % 8) ^ i) << 4);
}

/* A consumer warp gives stage s back: to its own block, and in a cluster to
 * the peer too, whose producer copies half of B into it. */
template <int CL> __device__ __forceinline__ void g_release(uint64_t *empty, int s, int rank) {
    g_mbar_arrive(&empty[s]);
    if (CL > 1) g_mbar_arrive_cta(&empty[s], (unsigned)rank ^ 1u);
}

/* The producer (one thread): TMA copies of every tile's K slices of A and B
 * into the ring of stages, each stage reused once the consumers are done. In a cluster of two each
 * block loads half of B's rows into both blocks' stages (multicast; map_b's boxes are G_BN / 2
 * rows), and a stage is free again once the consumers of both have released it (empty counts both);
 * at the end the producer waits for those releases, so that no arrival from the peer is still on
 * its way when this block exits. */
template <int CL>
__device__ __forceinline__ void g_produce(unsigned char *base, uint64_t *full, uint64_t *empty,
                                          const CUtensorMap *map_a, const CUtensorMap *map_b,
                                          const g_sched &sc, int kblocks) {
    int pos = 0;
    for (int w = sc.first; w < sc.works; w += sc.step) {
        int m0, n0;
        sc.at(w, m0, n0);
        for (int kb = 0; kb < kblocks; kb++, pos++) {
            int s = pos % G_STAGES, round = pos / G_STAGES;
            unsigned char *st = base + s * G_STAGE_BYTES;
            if (round > 0) g_mbar_wait(&empty[s], (round - 1) & 1);
            g_mbar_expect(&full[s], G_STAGE_BYTES);
            g_tma_load(st, map_a, kb * G_BK, m0, &full[s]);
            if (CL == 1)
                g_tma_load(st + G_A_BYTES, map_b, kb * G_BK, n0, &full[s]);
            else
                g_tma_load_multicast(st + G_A_BYTES + sc.rank * (G_B_BYTES / 2), map_b, kb * G_BK,
                                     n0 + sc.rank * (G_BN / 2), &full[s], 0x3);
        }
    }
    if (CL > 1)
        for (int i = 0; i < G_STAGES; i++, pos++)
            if (pos >= G_STAGES) g_mbar_wait(&empty[pos % G_STAGES], (pos / G_STAGES - 1) & 1);
}

/* A consumer warpgroup's (c) products for one tile: acc = its 64 rows of the
 * tile over all of K. pos counts the stages taken so far (both consumers
 * take every stage). */
template <int CL>
__device__ __forceinline__ void g_mainloop(float *acc, const unsigned char *base, uint64_t *full,
                                           uint64_t *empty, int &pos, int kblocks, int c, int lane,
                                           int rank) {
    int prev = -1;
    for (int kb = 0; kb < kblocks; kb++, pos++) {
        int s = pos % G_STAGES;
        g_mbar_wait(&full[s], (pos / G_STAGES) & 1);
        const unsigned char *a = base + s * G_STAGE_BYTES + c * 64 * 128;
        const unsigned char *b = base + s * G_STAGE_BYTES + G_A_BYTES;
        g_wgmma_fence();
#pragma unroll
        for (int k = 0; k < G_BK / 16; k++)
            g_wgmma(acc, g_desc(a + 32 * k), g_desc(b + 32 * k), kb > 0 || k > 0);
        g_wgmma_commit();
        /* the previous slice's products are done: its stage goes back */
        g_wgmma_wait<1>();
        if (prev >= 0 && lane == 0) g_release<CL>(empty, prev, rank);
        prev = s;
    }
    g_wgmma_wait<0>();
    if (prev >= 0 && lane == 0) g_release<CL>(empty, prev, rank);
}

#endif /* G_KERNEL_BODY */

/* The consumers stage their sums with stmatrix (and the DGELU form loads
 * gelu' with ldmatrix): a quarter of the instructions of 4-byte shared-memory
 * stores and loads, in the part of each tile where the tensor cores wait
 * (the training step 1.0054x on an H200, 3 of 3 rounds).
 * GPC_SM90_STMATRIX=0 keeps the 4-byte stores; read at the first call. */
static inline int gpc_sm90_stmatrix(void) {
    static int on = -1;
    return gpc_cuda_setting_flag("GPC_SM90_STMATRIX", &on);
}

/* The launch of a kernel in clusters of two blocks (threads a block, smem
 * bytes of dynamic shared memory) on grid blocks, on gpc's stream. */
static inline cudaLaunchConfig_t gpc_sm90_cluster_config(cudaLaunchAttribute *attr, int grid,
                                                         int threads, size_t smem) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)grid);
    cfg.blockDim = dim3((unsigned)threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = gpc_cuda_stream();
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = 2;
    attr->val.clusterDim.y = 1;
    attr->val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cfg;
}

/* How many clusters of two blocks of kernel are resident at once on the
 * current GPU (0: none, or the question failed). */
template <class Kernel> static int gpc_sm90_max_clusters(Kernel kernel, int threads, size_t smem) {
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = gpc_sm90_cluster_config(&attr, 2 * gpc_cuda_sm_count(), threads, smem);
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
        cudaGetLastError();
        n = 0;
    }
    return n;
}

/* Whether a product runs in clusters of two: where the switch var allows it
 * (a flag of the table of settings, read once into *on, -1 before), the row
 * tiles pair up and the current device holds clusters, the number resident
 * at once (table[device], the file's gpc_sm90_max_clusters answers); else 0,
 * for single blocks. */
static inline int gpc_sm90_cluster_count(const char *var, int *on, const int *table,
                                         int64_t tiles_m) {
    int d = 0;
    const int want = gpc_cuda_setting_flag(var, on);
    if (!want || tiles_m % 2 || cudaGetDevice(&d) != cudaSuccess || d < 0 ||
        d >= GPC_CUDA_MAX_DEVICES)
        return 0;
    return table[d];
}

/* The persistent grid: one block a multiprocessor, fewer where there are
 * fewer tiles, or (GPC_SM90_BLOCKS, read each call; for tests) fewer still,
 * so that a small problem still has blocks walking several tiles. */
static inline int gpc_sm90_grid(int64_t tiles) {
    const long cap = gpc_setting_int("GPC_SM90_BLOCKS"); /* 0 when unset */
    int64_t grid = gpc_cuda_sm_count();
    if (cap > 0 && cap < grid) grid = cap;
    return (int)(tiles < grid ? tiles : grid);
}

/* The tensor map of a rows x cols bf16 matrix (cols contiguous), boxes of
 * box_rows x 64 in the 128-byte swizzle. */
gpc_status gpc_sm90_make_map(CUtensorMap *map, const void *p, int64_t rows, int64_t cols,
                             unsigned box_rows);

/* Whether the current GPU runs a file's sm_90a kernels, asked once per
 * device: compute capability 9.0, the driver's tensor-map encoder found,
 * and kernels_ok(device) (the kernels' shared-memory attributes, and what
 * else the file wants to know of the device once). cache is the file's
 * [GPC_CUDA_MAX_DEVICES] answers (0 unknown, 1 no, 2 yes); a failed
 * check's CUDA error is cleared. */
int gpc_sm90_device_ok(int *cache, int (*kernels_ok)(int device));

#endif
