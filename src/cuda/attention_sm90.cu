/*
 * attention_sm90.cu: the attention backward on Hopper's wgmma, for bf16,
 * head size 64 and T a multiple of 128 (attention.cu runs it after
 * att_dsum64_kernel, which gives D = rowsum(dO * O) and zeroes dqkv's q
 * third; lse in natural log). dK and dV are written into dqkv, and each
 * key block's part of dQ, dS K, is added into dqkv's q third in bf16 by
 * TMA reduce-adds: no f32 accumulator, no pass to zero it or convert it.
 * Query block i is summed from the i + 1 key blocks at or before it, each
 * add rounded to bf16 (the sum in f32 would be rounded once).
 *
 * Work comes in units: one (batch, head) and two blocks of 128 keys, kb and
 * nkb - 1 - kb, so that every unit has nkb + 1 query blocks to walk (each
 * key block from its own, the diagonal, masked, to the last). Persistent
 * blocks, one a multiprocessor, take units blockIdx.x, + gridDim.x, ...: the
 * units running at once are neighbours, a few heads' worth, whose Q, dO and
 * dq lines meet in L2 (with single key blocks, issued key block by key
 * block, the kernel took 16% longer). 384 threads: warpgroup 0's first
 * thread is the producer (each key block's K and V into one of two buffers
 * once the buffer is free; per query block Q, dO by TMA and lse, D by bulk
 * copies into a ring of two stages, which runs on across key blocks and
 * units), warpgroups 1 and 2 the consumers, 64 keys each:
 *
 *   S^T = K Q^T, dP^T = V dO^T      wgmma m64n128, both operands K-major
 *   P^T = exp(S^T - lse), dS^T = P^T (dP^T - D)   in the accumulators
 *   dV += P^T dO, dK += dS^T Q      wgmma m64n64, A from registers (the
 *                                   accumulator layout is the A layout),
 *                                   B transposed (dO and Q as loaded)
 *   dS to shared memory             stmatrix.trans, into a K-major tile
 *   dQ = dS K                       wgmma m64n64, each consumer 64 queries,
 *                                   staged in shared memory (bf16) and added
 *                                   to dqkv by its reducer thread's TMA
 *                                   reduce-add (warps 1 and 2)
 *
 * dQ needs both warpgroups' halves of dS, so it runs one query block behind
 * (the key block's last one after its loop): by then the other warpgroup
 * has long written the previous block's half, and neither waits for the
 * other. dS is double-buffered, each buffer with two mbarriers (written by
 * all eight consumer warps; read by their dQ products). Overlap within a
 * warpgroup: P^T's exponentials while dP^T's products run, dV and dK's
 * products while the previous block's dQ is issued. Consumer mbarrier
 * waits trap after 10 s rather than hang.
 *
 * Measured on an H200 (bench/RESULTS.md) at B=64 T=1024 NH=12: the
 * backward (with att_dsum64_kernel) 0.834 ms against cuDNN's 1.058 ms, and
 * 20% less energy; with dQ summed in an f32 accumulator (zeroed by the D
 * pass, converted by att_dq_store_kernel) it took 0.964 ms.
 */
#include "cuda/attention_sm90.h"
#include "cuda/sm90_common.cuh"

#define AW_HS 64                             /* head size */
#define AW_BLOCK GPC_ATTENTION_SM90_BLOCK    /* keys a block, queries a stage */
#define AW_TILE_BYTES (AW_BLOCK * AW_HS * 2) /* [128][64] bf16, 16 KiB */
#define AW_STAGES 2
#define AW_THREADS 384
#define AW_CONSUMER_REGS 240
#define AW_PRODUCER_REGS 24
#define AW_LAUNCH_REGS 168 /* what ptxas gives 384 threads of one block a multiprocessor */
#define AW_LOG2E 1.4426950408889634f

#define AW_UNIT 2                    /* key blocks a unit of work: kb and nkb - 1 - kb */
#define AW_DQ_BYTES (64 * AW_HS * 2) /* a warpgroup's dQ: [64][64] bf16, one box */
/* shared memory, from a 1024-byte aligned base */
#define AW_KV(j) ((j)*2 * AW_TILE_BYTES)                       /* key block buffer j: K, then V */
#define AW_STAGE(s) (AW_KV(AW_UNIT) + (s)*2 * AW_TILE_BYTES)   /* Q, then dO */
#define AW_DS(b) (AW_STAGE(AW_STAGES) + (b)*2 * AW_TILE_BYTES) /* two [128][64] boxes */
#define AW_DQ(c) (AW_DS(2) + (c)*AW_DQ_BYTES)                  /* warpgroup c's dQ, staged */
#define AW_ROWS(s) (AW_DQ(2) + (s)*2 * AW_BLOCK * 4)           /* lse, then D */
/* four ints: each key block buffer's key block (unit * 2 + which, or -1:
 * no more), each dQ staging's query block (bh * nqb + i, or -1: no more) */
#define AW_INFO AW_ROWS(AW_STAGES)
#define AW_BARS (AW_INFO + 16)
/* the mbarriers, at AW_BARS: each key block buffer's kv_full and kv_empty,
 * each stage's full and empty, each dS buffer's ds_full and ds_free, each
 * dQ staging's dq_full and dq_empty */
#define AW_KV_FULL 0
#define AW_KV_EMPTY (AW_KV_FULL + AW_UNIT)
#define AW_FULL (AW_KV_EMPTY + AW_UNIT)
#define AW_EMPTY (AW_FULL + AW_STAGES)
#define AW_DS_FULL (AW_EMPTY + AW_STAGES)
#define AW_DS_FREE (AW_DS_FULL + 2)
#define AW_DQ_FULL (AW_DS_FREE + 2)
#define AW_DQ_EMPTY (AW_DQ_FULL + 2)
#define AW_NBARS (AW_DQ_EMPTY + 2)
#define AW_SMEM_USED (AW_BARS + 8 * AW_NBARS)
/* All a block may have on compute capability 9.0. The layout leaves no room
 * for a kilobyte of alignment slack: the dynamic shared memory starts
 * 1024-byte aligned where nothing else is in shared memory, and the kernel
 * traps if it finds it further off than what is left over. */
#define AW_SMEM 232448
static_assert(AW_SMEM_USED <= AW_SMEM, "the shared memory layout");

#ifdef G_KERNEL_BODY
/* d[64] += A (64 x 16, K-major) . B (128 x 16, K-major)^T, or d = it */
__device__ __forceinline__ void aw_wgmma_128(float *d, uint64_t a, uint64_t b, int accumulate) {
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "setp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
                 "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "
                 "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "
                 "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "%64, %65, p, 1, 1, 0, 0;\n"
                 "}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
                   "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
                   "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(a), "l"(b), "r"(accumulate));
}

/* The 32 accumulator registers of an m64n64 product: the operand list and
 * their constraints, %0 .. %31 */
#define AW_D32                                                                                     \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "  \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define AW_D32_OUT(d)                                                                              \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),            \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

/* d[32] += A (64 x 16, from registers) . B (16 x 64, N contiguous: transposed), or d = it */
__device__ __forceinline__ void aw_wgmma_64_rt(float *d, const uint32_t *a, uint64_t b,
                                               int accumulate) {
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "setp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " AW_D32 ", "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n"
                 "}\n"
                 : AW_D32_OUT(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

/* d[32] += A (64 x 16, K-major) . B (16 x 64, N contiguous: transposed), or d = it */
__device__ __forceinline__ void aw_wgmma_64_st(float *d, uint64_t a, uint64_t b, int accumulate) {
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "setp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " AW_D32 ", "
                 "%32, %33, p, 1, 1, 0, 1;\n"
                 "}\n"
                 : AW_D32_OUT(d)
                 : "l"(a), "l"(b), "r"(accumulate));
}

/* g_mbar_wait with a limit: a phase that has not completed after
 * AW_WAIT_LIMIT_NS of waiting means a copy or an arrival that never comes
 * (a wrong byte count, a lost release), and the kernel traps, so the launch
 * fails with an error instead of holding the GPU. No wait of a working
 * kernel comes near it. */
#define AW_WAIT_LIMIT_NS 10000000000ull /* 10 s */
__device__ __forceinline__ void aw_mbar_wait(uint64_t *bar, unsigned parity) {
    uint64_t start = 0;
    for (unsigned spins = 0;; spins++) {
        uint32_t done;
        asm volatile("{\n"
                     ".reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n"
                     "}\n"
                     : "=r"(done)
                     : "r"(g_smem(bar)), "r"(parity)
                     : "memory");
        if (done) return;
        if (spins % 1024 == 0) {
            uint64_t now;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
            if (!start)
                start = now;
            else if (now - start > AW_WAIT_LIMIT_NS)
                __trap();
        }
    }
}

/* Two floats from shared memory at a shared-space address. */
__device__ __forceinline__ float2 aw_lds2(uint32_t at) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(at) : "memory");
    return v;
}

/* Key block j (0 or 1) of unit u: u, then nkb - 1 - u; and how many the
 * unit has (one where they are the same, the middle of an odd nkb). */
__device__ __forceinline__ int aw_key_block(int j, int u, int nkb) {
    return j == 0 ? u : nkb - 1 - u;
}
__device__ __forceinline__ int aw_unit_keys(int u, int nkb) {
    return nkb - 1 - u == u ? 1 : 2;
}

/* A 1-D bulk copy of bytes (a multiple of 16) into shared memory, counted
 * on bar's transaction bytes. */
__device__ __forceinline__ void aw_bulk_load(void *dst, const void *src, unsigned bytes,
                                             uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];" ::"r"(g_smem(dst)),
                 "l"(src), "r"(bytes), "r"(g_smem(bar))
                 : "memory");
}

/* Four 8 x 8 bf16 matrices from registers into shared memory, each stored
 * transposed (lane l gives the address of memory row l % 8 of matrix l / 8,
 * which is column l % 8 of the matrix as the registers hold it). */
__device__ __forceinline__ void aw_stmatrix4_t(uint32_t at, uint32_t a, uint32_t b, uint32_t c,
                                               uint32_t d) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(at),
                 "r"(a), "r"(b), "r"(c), "r"(d)
                 : "memory");
}

/* dQ of the queries 64c .. 64c + 63 of a query block, from dS in buffer ds
 * (written by both warpgroups, each its 64 keys: waited for on ds_full,
 * ring position p) and K at k_s: dS (K-major, keys in two boxes) times K
 * (transposed B: keys are its K). The group of products the warpgroup
 * committed before these is waited for first, then done() runs; once dQ's
 * products are done too, ds_free is arrived on (dS read). The sums go to
 * the warpgroup's staging (once its reducer has sent the last ones off,
 * dq_empty), scaled and in bf16, in the 128-byte swizzle of a [64][64]
 * box, and the reducer is told (dq_full) with the query block's tag (bh *
 * nqb + i). */
template <class Done>
__device__ __forceinline__ void aw_dq(unsigned char *base, uint64_t *bars, uint32_t k_s, int p,
                                      int tag, float scale, int c, int wi, int lane, Done done) {
    float dq[32];
    const uint32_t ds = g_smem(base + AW_DS(p % 2)), stage = g_smem(base + AW_DQ(c));
    aw_mbar_wait(&bars[AW_DS_FULL + p % 2], (p / 2) & 1);
    g_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < AW_BLOCK / 16; kk++)
        aw_wgmma_64_st(dq, g_desc_at(ds + (kk / 4) * AW_TILE_BYTES + c * 64 * 128 + 32 * (kk % 4)),
                       g_desc_at(k_s + 2048 * kk), kk > 0);
    g_wgmma_commit();
    g_wgmma_wait<1>();
    done();
    g_wgmma_wait<0>();
    __syncwarp();
    if (lane == 0) g_mbar_arrive(&bars[AW_DS_FREE + p % 2]);
    if (p > 0) aw_mbar_wait(&bars[AW_DQ_EMPTY + c], (p - 1) & 1);
    /* dq[4q + e] is row r0 + 8(e / 2) (r0 = 16wi + lane / 4, so row % 8 is
     * lane / 4 for both), column 8q + colq + e % 2: 16-byte chunk q of the
     * row, 2colq bytes in; scaled (by a power of two: the same as scaling
     * the rounded sum) and rounded to bf16 in pairs. A warp's 32 stores meet
     * 8 rows in 8 different chunks: no bank conflict. */
    const int r0 = 16 * wi + lane / 4, colq = 2 * (lane % 4);
#pragma unroll
    for (int q = 0; q < 8; q++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t at = stage + (r0 + 8 * h) * 128 + ((q ^ (lane / 4)) << 4) + 2 * colq;
            asm volatile("st.shared.b32 [%0], %1;" ::"r"(at),
                         "r"(g_pack_bf16(dq[4 * q + 2 * h] * scale, dq[4 * q + 2 * h + 1] * scale))
                         : "memory");
        }
    g_fence_async_smem();
    if (wi == 0 && lane == 0) ((volatile int *)(base + AW_INFO))[2 + c] = tag;
    g_mbar_arrive(&bars[AW_DQ_FULL + c]);
}

/* The consumers of warpgroup c (0 or 1): keys 64c .. 64c + 63 of the block.
 * Their operands' descriptors (g_desc_at) are of tiles whose rows are 128
 * bytes in the 128-byte swizzle: for a K-major operand the rows are M or N
 * and K runs along them (advance 32 bytes a k16 step); for a transposed
 * (N-contiguous) B the rows are K and N = 64 runs along them (advance two
 * 8-row atoms, 2048 bytes, a k16 step). Both have 1024 bytes between 8-row
 * atoms. */
__device__ __forceinline__ int aw_consume(unsigned char *base, uint64_t *bars, gpc_bf16_t *dqkv,
                                          int bh, int kb, int kc, int g0, int T, int NH,
                                          float scale_log2, float scale, int c, int wi, int lane) {
    const int j = kc % AW_UNIT, b = bh / NH, h = bh % NH, nqb = T / AW_BLOCK;
    uint64_t *kv_empty = bars + AW_KV_EMPTY + j;
    uint64_t *full = bars + AW_FULL, *empty = bars + AW_EMPTY;
    uint64_t *ds_full = bars + AW_DS_FULL, *ds_free = bars + AW_DS_FREE;
    const int nq = nqb - kb;
    const uint32_t s_base = g_smem(base), k_s = s_base + AW_KV(j), v_s = k_s + AW_TILE_BYTES;
    const int r0 = 16 * wi + lane / 4; /* this thread's first row of the 64 */
    const int key0 = 64 * c + r0;      /* its first key in the block */
    const int colq = 2 * (lane % 4);   /* its first column in each 8 */
    float dk[32], dv[32];
#pragma unroll
    for (int i = 0; i < 32; i++)
        dk[i] = dv[i] = 0.0f;
    for (int it = 0; it < nq; it++) {
        const int g = g0 + it, s = g % AW_STAGES, i = kb + it;
        const uint32_t q_s = s_base + AW_STAGE(s), do_s = q_s + AW_TILE_BYTES;
        const uint32_t lse_s = s_base + AW_ROWS(s), d_s = lse_s + AW_BLOCK * 4;
        aw_mbar_wait(&full[s], (g / AW_STAGES) & 1);

        /* S^T and dP^T for this warpgroup's 64 keys and the block's 128
         * queries, as two groups: P^T's exponentials run while dP^T's
         * products do */
        float st[64], dpt[64];
        g_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < AW_HS / 16; kk++)
            aw_wgmma_128(st, g_desc_at(k_s + c * 64 * 128 + 32 * kk), g_desc_at(q_s + 32 * kk),
                         kk > 0);
        g_wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < AW_HS / 16; kk++)
            aw_wgmma_128(dpt, g_desc_at(v_s + c * 64 * 128 + 32 * kk), g_desc_at(do_s + 32 * kk),
                         kk > 0);
        g_wgmma_commit();
        g_wgmma_wait<1>();

        /* P^T in place of S^T; st[4q + e] is row r0 + 8(e / 2), column 8q +
         * colq + e % 2 */
        const bool diag = it == 0;
#pragma unroll
        for (int q = 0; q < 16; q++) {
            const int col = 8 * q + colq;
            const float2 l2 = aw_lds2(lse_s + 4 * col);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qi = col + (e & 1), key = key0 + 8 * (e >> 1);
                const float lse2 = ((e & 1) ? l2.y : l2.x) * AW_LOG2E;
                st[4 * q + e] = exp2f(st[4 * q + e] * scale_log2 - lse2);
                if (diag && key > qi) st[4 * q + e] = 0.0f;
            }
        }
        g_wgmma_wait<0>();

        /* dS^T, then both packed in pairs: pa[2q + r] holds row r0 + 8r,
         * columns 8q + colq and + 1, which for k16 step kk are the A
         * fragment registers pa[4kk .. 4kk + 3] */
        uint32_t pa[32], dsa[32];
#pragma unroll
        for (int q = 0; q < 16; q++) {
            const float2 d2 = aw_lds2(d_s + 4 * (8 * q + colq));
            float ds[4];
#pragma unroll
            for (int e = 0; e < 4; e++)
                ds[e] = st[4 * q + e] * (dpt[4 * q + e] - ((e & 1) ? d2.y : d2.x));
            pa[2 * q] = g_pack_bf16(st[4 * q], st[4 * q + 1]);
            pa[2 * q + 1] = g_pack_bf16(st[4 * q + 2], st[4 * q + 3]);
            dsa[2 * q] = g_pack_bf16(ds[0], ds[1]);
            dsa[2 * q + 1] = g_pack_bf16(ds[2], ds[3]);
        }

        /* dS (queries x keys) into buffer g % 2, K-major for dQ = dS K, once
         * both warpgroups' dQ of ring position g - 2 has read it: the x4
         * store takes dsa[2q .. 2q + 3], matrices (keys rb.., queries 8q..),
         * (rb + 8.., 8q..), (rb.., 8q + 8..), (rb + 8.., 8q + 8..) */
        const uint32_t ds_s = s_base + AW_DS(g % 2);
        if (g >= 2) aw_mbar_wait(&ds_free[g % 2], (g / 2 - 1) & 1);
        {
            const int m = lane / 8, row_in = lane % 8;
            const int key = 64 * c + 16 * wi + 8 * (m & 1); /* this lane's matrix: its keys */
#pragma unroll
            for (int q = 0; q < 16; q += 2) {
                const int qrow = 8 * (q + (m >> 1)) + row_in; /* the memory row: a query */
                const uint32_t at = ds_s + (key / 64) * AW_TILE_BYTES + qrow * 128 +
                                    ((((key % 64) / 8) ^ (qrow % 8)) << 4);
                aw_stmatrix4_t(at, dsa[2 * q], dsa[2 * q + 1], dsa[2 * q + 2], dsa[2 * q + 3]);
            }
        }
        /* this warp's part of dS written, and seen by the async proxy */
        g_fence_async_smem();
        __syncwarp();
        if (lane == 0) g_mbar_arrive(&ds_full[g % 2]);

        /* dV += P^T dO, dK += dS^T Q over the 128 queries */
        g_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < AW_BLOCK / 16; kk++)
            aw_wgmma_64_rt(dv, pa + 4 * kk, g_desc_at(do_s + 2048 * kk), 1);
#pragma unroll
        for (int kk = 0; kk < AW_BLOCK / 16; kk++)
            aw_wgmma_64_rt(dk, dsa + 4 * kk, g_desc_at(q_s + 2048 * kk), 1);
        g_wgmma_commit();
        /* dV and dK done: this stage's Q, dO, lse and D are read, and the
         * producer may refill it. Every thread arrives, each releasing its
         * own loads of lse and D (racecheck does not count a warp's lanes
         * meeting before lane 0 arrives as ordering the others' loads before
         * the next copy; this form it does, at no measurable cost) */
        auto release = [&] { g_mbar_arrive(&empty[s]); };
        /* dQ one query block behind, so that neither warpgroup waits for
         * the other's half of this block's dS: by now the other has long
         * written the previous block's */
        if (it > 0) {
            aw_dq(base, bars, k_s, g - 1, bh * nqb + i - 1, scale, c, wi, lane, release);
        } else {
            g_wgmma_wait<0>();
            release();
        }
    }
    /* the last query block's dQ, before K is given up */
    aw_dq(base, bars, k_s, g0 + nq - 1, bh * nqb + nqb - 1, scale, c, wi, lane, [] {});

    /* every warp's products are done with this K and V: the producer may
     * load the next key block's into their buffer */
    __syncwarp();
    if (lane == 0) g_mbar_arrive(kv_empty);

    /* dK (times the softmax scale) and dV into dqkv */
    const int64_t C = (int64_t)NH * AW_HS, stride = 3 * C;
    gpc_bf16_t *row = dqkv + ((int64_t)b * T + (int64_t)kb * AW_BLOCK + key0) * stride + h * AW_HS;
#pragma unroll
    for (int q = 0; q < 8; q++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            gpc_bf16_t *at = row + r * 8 * stride + 8 * q + colq;
            *(uint32_t *)(at + C) =
                g_pack_bf16(dk[4 * q + 2 * r] * scale, dk[4 * q + 2 * r + 1] * scale);
            *(uint32_t *)(at + 2 * C) = g_pack_bf16(dv[4 * q + 2 * r], dv[4 * q + 2 * r + 1]);
        }
    return g0 + nq;
}

/* The producer (one thread): for the block's units (blockIdx.x, +
 * gridDim.x, ...), each key block's K and V once its buffer is free, with
 * the key block's place (unit * 2 + which) in AW_INFO for the consumers,
 * then its query blocks' Q, dO, lse and D into the ring. When the units run
 * out, a buffer's place is -1. (The consumers could derive their units as
 * the producer does, but then they keep the walk's state in registers and
 * spill 44 bytes; reading the place costs them nothing.) It runs on few
 * registers (AW_PRODUCER_REGS): rows and columns are recomputed where used
 * rather than kept, and its waits have no time limit (a lost arrival stops
 * the consumers' timed waits instead). */
__device__ __forceinline__ void aw_produce(unsigned char *base, uint64_t *bars,
                                           const CUtensorMap *map_qkv, const CUtensorMap *map_do,
                                           const float *lse, const float *dsum, int B, int T,
                                           int NH) {
    uint64_t *kv_full = bars + AW_KV_FULL, *kv_empty = bars + AW_KV_EMPTY;
    uint64_t *full = bars + AW_FULL, *empty = bars + AW_EMPTY;
    volatile int *place = (volatile int *)(base + AW_INFO);
    const int nkb = T / AW_BLOCK, upb = (nkb + 1) / 2, C = NH * AW_HS;
    int kc = 0;
    for (int n = blockIdx.x, g = 0; n < B * NH * upb; n += gridDim.x) {
        const int bh = n / upb, u = n % upb;
        for (int j = 0; j < aw_unit_keys(u, nkb); j++, kc++) {
            const int kb = aw_key_block(j, u, nkb), kv = kc % AW_UNIT;
            if (kc >= AW_UNIT) g_mbar_wait(&kv_empty[kv], (kc / AW_UNIT - 1) & 1);
            place[kv] = 2 * n + j;
            g_mbar_expect(&kv_full[kv], 2 * AW_TILE_BYTES);
            const int krow = bh / NH * T + kb * AW_BLOCK, kcol = C + bh % NH * AW_HS;
            g_tma_load(base + AW_KV(kv), map_qkv, kcol, krow, &kv_full[kv]);
            g_tma_load(base + AW_KV(kv) + AW_TILE_BYTES, map_qkv, kcol + C, krow, &kv_full[kv]);
            for (int i = kb; i < nkb; i++, g++) {
                const int s = g % AW_STAGES, round = g / AW_STAGES;
                if (round > 0) g_mbar_wait(&empty[s], (round - 1) & 1);
                g_mbar_expect(&full[s], 2 * AW_TILE_BYTES + 2 * AW_BLOCK * 4);
                const int qrow = bh / NH * T + i * AW_BLOCK, qcol = bh % NH * AW_HS;
                g_tma_load(base + AW_STAGE(s), map_qkv, qcol, qrow, &full[s]);
                g_tma_load(base + AW_STAGE(s) + AW_TILE_BYTES, map_do, qcol, qrow, &full[s]);
                const int64_t r = (int64_t)bh * T + i * AW_BLOCK;
                aw_bulk_load(base + AW_ROWS(s), lse + r, AW_BLOCK * 4, &full[s]);
                aw_bulk_load(base + AW_ROWS(s) + AW_BLOCK * 4, dsum + r, AW_BLOCK * 4, &full[s]);
            }
        }
    }
    const int kv = kc % AW_UNIT;
    if (kc >= AW_UNIT) g_mbar_wait(&kv_empty[kv], (kc / AW_UNIT - 1) & 1);
    place[kv] = -1;
    g_mbar_arrive(&kv_full[kv]);
}

/* The reducer of warpgroup c's dQ halves (one thread): for each staged
 * half (dq_full, its tag bh * nqb + i in AW_INFO), a TMA add of the box
 * into dqkv's q third (cp.reduce.async.bulk.tensor add, bf16, rounded to
 * nearest), and dq_empty once it has read the staging. A tag of -1 ends
 * it. */
__device__ __forceinline__ void aw_reduce(unsigned char *base, uint64_t *bars,
                                          const CUtensorMap *map_dq, int T, int NH, int c) {
    const volatile int *tag = (const volatile int *)(base + AW_INFO) + 2 + c;
    const uint32_t stage = g_smem(base + AW_DQ(c));
    const int nqb = T / AW_BLOCK;
    for (int p = 0;; p++) {
        aw_mbar_wait(&bars[AW_DQ_FULL + c], p & 1);
        const int t = *tag;
        if (t < 0) break;
        const int bh = t / nqb, row = bh / NH * T + t % nqb * AW_BLOCK + 64 * c;
        asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group"
                     " [%0, {%1, %2}], [%3];" ::"l"(map_dq),
                     "r"(bh % NH * AW_HS), "r"(row), "r"(stage)
                     : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        g_bulk_wait_read<0>();
        g_mbar_arrive(&bars[AW_DQ_EMPTY + c]);
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
#endif /* G_KERNEL_BODY */

__global__ void __launch_bounds__(AW_THREADS, 1)
    att_sm90_backward_kernel(const __grid_constant__ CUtensorMap map_qkv,
                             const __grid_constant__ CUtensorMap map_do,
                             const __grid_constant__ CUtensorMap map_dq, gpc_bf16_t *dqkv,
                             const float *lse, const float *dsum, int B, int T, int NH,
                             float scale_log2, float scale) {
#ifdef G_KERNEL_BODY
    extern __shared__ __align__(1024) unsigned char aw_shared[];
    unsigned char *base = (unsigned char *)(((uintptr_t)aw_shared + 1023) & ~(uintptr_t)1023);
    if (base - aw_shared > AW_SMEM - AW_SMEM_USED) __trap();
    uint64_t *bars = (uint64_t *)(base + AW_BARS);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    /* Units of work: (batch, head) bh with key blocks u and nkb - 1 - u (one
     * when they are the same), nkb + 1 query blocks in all, so that every
     * unit costs about the same. Block b takes units b, b + gridDim.x, ...
     * (aw_produce): the units running at once are neighbours, a few heads'
     * worth, which share their Q, dO and dQ sums in L2. Key blocks count on
     * (kc) and the stages' ring turns on (g) across a block's units. */
    const int nkb = T / AW_BLOCK, upb = (nkb + 1) / 2;

    if (threadIdx.x == 0) {
        for (int j = 0; j < AW_UNIT; j++) {
            g_mbar_init(&bars[AW_KV_FULL + j], 1);
            g_mbar_init(&bars[AW_KV_EMPTY + j], 8); /* lane 0 of each consumer warp */
        }
        for (int s = 0; s < AW_STAGES; s++) {
            g_mbar_init(&bars[AW_FULL + s], 1);
            g_mbar_init(&bars[AW_EMPTY + s], 256); /* every consumer thread */
        }
        for (int d = 0; d < 2; d++) { /* lane 0 of each consumer warp */
            g_mbar_init(&bars[AW_DS_FULL + d], 8);
            g_mbar_init(&bars[AW_DS_FREE + d], 8);
        }
        for (int c = 0; c < 2; c++) {
            g_mbar_init(&bars[AW_DQ_FULL + c], 128); /* every thread of warpgroup c */
            g_mbar_init(&bars[AW_DQ_EMPTY + c], 1);  /* its reducer */
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    /* setmaxnreg moves registers within what the launch gave the block (168
     * a thread for 384 threads): the producer's warpgroup hands over what
     * the consumers take, or their increase would wait forever */
    static_assert(128 * (2 * AW_CONSUMER_REGS + AW_PRODUCER_REGS) <= AW_THREADS * AW_LAUNCH_REGS,
                  "the launch's registers");
    if (warp >= 4) {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(AW_CONSUMER_REGS));
        const int c = warp / 4 - 1, wi = warp % 4;
        const volatile int *place = (const volatile int *)(base + AW_INFO);
        int g = 0;
        for (int kc = 0;; kc++) {
            aw_mbar_wait(&bars[AW_KV_FULL + kc % AW_UNIT], (kc / AW_UNIT) & 1);
            const int at = place[kc % AW_UNIT];
            if (at < 0) break;
            const int n = at / 2, bh = n / upb, u = n % upb;
            g = aw_consume(base, bars, dqkv, bh, aw_key_block(at % 2, u, nkb), kc, g, T, NH,
                           scale_log2, scale, c, wi, lane);
        }
        /* no more: the reducer is told once it has taken the last half */
        if (g > 0) aw_mbar_wait(&bars[AW_DQ_EMPTY + c], (g - 1) & 1);
        if (wi == 0 && lane == 0) ((volatile int *)(base + AW_INFO))[2 + c] = -1;
        g_mbar_arrive(&bars[AW_DQ_FULL + c]);
        return;
    }
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(AW_PRODUCER_REGS));
    if ((warp == 1 || warp == 2) && lane == 0)
        aw_reduce(base, bars, &map_dq, T, NH, warp - 1);
    else if (threadIdx.x == 0)
        aw_produce(base, bars, &map_qkv, &map_do, lse, dsum, B, T, NH);
#else
    (void)map_qkv, (void)map_do, (void)map_dq, (void)dqkv, (void)lse, (void)dsum, (void)B, (void)T,
        (void)NH, (void)scale_log2, (void)scale;
#endif
}

/* --------------------------------------------------------------- host */

/* The shared memory, and the registers the kernel was built with: the
 * warpgroups' setmaxnreg counts add up to 168 a thread (AW_LAUNCH_REGS), and
 * with fewer the consumers' increase would never be granted. */
static int aw_kernel_ok(int device) {
    (void)device;
    cudaFuncAttributes attr;
    return cudaFuncSetAttribute(att_sm90_backward_kernel,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                AW_SMEM) == cudaSuccess &&
           cudaFuncGetAttributes(&attr, att_sm90_backward_kernel) == cudaSuccess &&
           attr.numRegs == AW_LAUNCH_REGS;
}

static long calls;

long gpc_cuda_attention_sm90_calls(void) {
    return __atomic_load_n(&calls, __ATOMIC_RELAXED);
}

int gpc_cuda_attention_sm90_available(void) {
    static int ok[GPC_CUDA_MAX_DEVICES];
    return gpc_sm90_device_ok(ok, aw_kernel_ok);
}

int gpc_cuda_attention_sm90_serves(int T) {
    return T > 0 && T % AW_BLOCK == 0 && gpc_cuda_attention_sm90_available();
}

gpc_status gpc_cuda_attention_backward_sm90(gpc_bf16_t *dqkv, const gpc_bf16_t *qkv,
                                            const gpc_bf16_t *dout, const float *lse,
                                            const float *dsum, int B, int T, int NH, float scale) {
    const void *ptrs[5] = {dqkv, qkv, dout, lse, dsum};
    int aligned = 1;
    for (int i = 0; i < 5; i++)
        aligned &= gpc_cuda_aligned16(ptrs[i]);
    const int64_t units = (int64_t)(T / AW_BLOCK + 1) / 2 * B * NH;
    if (B <= 0 || NH <= 0 || !aligned || units > 0x7fffffff || (int64_t)B * T > 0x7fffffff ||
        (int64_t)B * NH * T > 0x7fffffff || !gpc_cuda_attention_sm90_serves(T))
        return gpc_error(GPC_ERR_UNSUPPORTED, "attention_sm90: not for this shape or GPU");
    const int64_t C = (int64_t)NH * AW_HS;
    CUtensorMap map_qkv, map_do, map_dq;
    GPC_TRY(gpc_sm90_make_map(&map_qkv, qkv, (int64_t)B * T, 3 * C, AW_BLOCK));
    GPC_TRY(gpc_sm90_make_map(&map_do, dout, (int64_t)B * T, C, AW_BLOCK));
    GPC_TRY(gpc_sm90_make_map(&map_dq, dqkv, (int64_t)B * T, 3 * C, 64));
    att_sm90_backward_kernel<<<gpc_sm90_grid(units), AW_THREADS, AW_SMEM, gpc_cuda_stream()>>>(
        map_qkv, map_do, map_dq, dqkv, lse, dsum, B, T, NH, scale * AW_LOG2E, scale);
    GPC_CUDA_CHECK_LAUNCH();
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    return GPC_OK;
}
