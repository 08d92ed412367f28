/*
 * classifier_sm90.cu: the output head of a training step on Hopper, in
 * three products that never store dlogits (gpc_cuda_classifier_sm90, see
 * gemm_sm90.h):
 *   1. LOGITS: logits = inp . w^T, [N, Vp], written; the epilogue also keeps
 *      each row's max and sum of exp over each tile's 192 columns;
 *   2. a small kernel merges those into each row's logsumexp, the loss, and
 *      the row's constant c = log2(dloss) - lse . log2(e) (row_c);
 *   3. DX: dinp = dlogits . w, and 4. DW: dw += dlogits^T . inp, whose
 *      consumers form dlogits as they load the logits:
 *      exp2(logit . log2(e) + c) - dloss at the target, 0 in the padded
 *      columns; that is (softmax - onehot) . dloss.
 * So the logits cross memory three times (one write, two reads) instead of
 * five (the cross-entropy pass read them and wrote dlogits over them).
 *
 * The kernels share gemm_sm90.cu's design (sm90_common.cuh): persistent
 * blocks of 512 threads walking 128 x 192 tiles, a ring of three 64-wide K
 * stages filled by TMA, two consumer warpgroups of 64 rows each, and two
 * staging tiles that TMA stores write out while the next tile's products
 * run. Warps: 0 the producer, 1 the stores (and DW's loads of dw's old
 * tile), 4-11 the consumers, 12-15 the LOGITS statistics; the rest idle.
 *
 * DX and DW take their A operand (the logits) from registers: each consumer
 * loads a k16 slice with ldmatrix (DW with .trans: its A is the logits read
 * down their columns), turns it into dlogits there, and hands it to
 * wgmma's register form, while B (w or inp, transposed K-major into scratch
 * first) comes from shared memory. Up to three k16 products are in flight
 * while the next slice is formed.
 *
 * Shapes: N a multiple of 128, Vp of 384 (tiles of 192 logit columns in
 * LOGITS and 128 rows of dw in DW), C of 192.
 */
#include "cuda/gemm_sm90.h"
#include "cuda/matmul.h"
#include "cuda/sm90_common.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define H_MAX_STAGES 4
#define H_THREADS 512
#define H_STAGE_BYTES (G_A_BYTES + G_B_BYTES)
#define H_TOK_BYTES (G_BK * 8) /* DW: a stage's 64 tokens' (c, target) */
#define H_BARRIERS (2 * H_MAX_STAGES + 4)
#define H_GROUP_M 16 /* LOGITS: row tiles a group of the raster holds in L2 */
#define H_LOG2E 1.4426950408889634f

enum { H_LOGITS, H_DX, H_DW };

/* Each product's ring depth and staging tiles: LOGITS, whose tiles are
 * short (K = C), keeps two staging tiles so that its statistics and stores
 * overlap the next tile; DX and DW, whose tiles run over the whole
 * vocabulary or batch, take a fourth stage instead of a second staging
 * tile. */
template <int MODE> struct h_cfg {
    static constexpr int stages = MODE == H_LOGITS ? 3 : 4;
    static constexpr int bufs = MODE == H_LOGITS ? 2 : 1;
    /* registers a thread (setmaxnreg): the consumers, whose DX and DW forms
     * hold two sets of A fragments beside the accumulators, and the others */
    static constexpr int consumer_regs = MODE == H_LOGITS ? 168 : 200;
    static constexpr int other_regs = MODE == H_LOGITS ? 88 : 56;
    static constexpr int smem = 1024 + stages * H_STAGE_BYTES + bufs * G_STAGING_BYTES +
                                stages * H_TOK_BYTES + H_BARRIERS * 8;
};

/* A row's (max, sum of exp) over one tile of 192 logit columns. */
struct h_stat {
    float max, sum;
};

#ifdef G_KERNEL_BODY
/* Tile w's rows m0 and columns n0. LOGITS walks groups of H_GROUP_M row
 * tiles down all the column tiles, so that the group's rows of inp stay in
 * L2 while w streams past once a group (w's 77 MB at GPT-2's shape would not
 * stay in L2 for a row-by-row walk); DX and DW take the column tiles of a
 * row tile together, which then read the same logits at about the same
 * time. */
template <int MODE>
__device__ __forceinline__ void h_tile(int w, int tiles_m, int tiles_n, int &m0, int &n0) {
    if (MODE == H_LOGITS) {
        const int group = w / (H_GROUP_M * tiles_n), r = w % (H_GROUP_M * tiles_n);
        const int first = group * H_GROUP_M, gm = min(H_GROUP_M, tiles_m - first);
        m0 = (first + r % gm) * G_BM;
        n0 = r / gm * G_BN;
    } else {
        m0 = w / tiles_n * G_BM;
        n0 = w % tiles_n * G_BN;
    }
}

/* ldmatrix of four 8 x 8 bf16 matrices, plain or transposed. */
template <bool TRANS> __device__ __forceinline__ void h_ldmatrix(uint32_t *r, uint32_t addr) {
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
}

/* d[96] += A (64 x 16, from registers: this thread's fragment a) . B (192 x
 * 16)^T, or d = the product. */
__device__ __forceinline__ void h_wgmma_rs(float *d, const uint32_t *a, uint64_t b,
                                           int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %101, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, "
        "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, "
        "%55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, "
        "%73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, "
        "%91, %92, %93, %94, %95}, "
        "{%96, %97, %98, %99}, %100, p, 1, 1, 0;\n"
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
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

/* wgmma.wait_group N that also keeps the A-fragment registers of both sets
 * alive (and unmoved) up to it: the products in flight still read them. */
#define H_FRAG4(x) "+r"(x[0]), "+r"(x[1]), "+r"(x[2]), "+r"(x[3])
template <int N> __device__ __forceinline__ void h_wait_frags(uint32_t (&a)[2][4][4]) {
    asm volatile("wgmma.wait_group.sync.aligned %32;"
                 : H_FRAG4(a[0][0]), H_FRAG4(a[0][1]), H_FRAG4(a[0][2]), H_FRAG4(a[0][3]),
                   H_FRAG4(a[1][0]), H_FRAG4(a[1][1]), H_FRAG4(a[1][2]), H_FRAG4(a[1][3])
                 : "n"(N)
                 : "memory");
}

__device__ __forceinline__ float h_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t h_pack(float lo, float hi) {
    __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
    return *(const uint32_t *)&p;
}

/* One bf16 pair of logits (low element first) into dlogits: exp2(logit .
 * log2(e) + c), each with its own c. */
__device__ __forceinline__ uint32_t h_dlogit2(uint32_t u, float c_lo, float c_hi) {
    return h_pack(h_exp2(fmaf(__uint_as_float(u << 16), H_LOG2E, c_lo)),
                  h_exp2(fmaf(__uint_as_float(u & 0xffff0000u), H_LOG2E, c_hi)));
}

/* Subtracts dloss from element e (0 low, 1 high) of a bf16 pair. */
__device__ __forceinline__ uint32_t h_sub_target(uint32_t u, int e, float dloss) {
    float lo = __uint_as_float(u << 16), hi = __uint_as_float(u & 0xffff0000u);
    if (e == 0)
        lo -= dloss;
    else
        hi -= dloss;
    return h_pack(lo, hi);
}

/* The producer (one thread): each stage's A and B slices by TMA, and in DW
 * the stage's 64 tokens' (c, target) by a bulk copy. LOGITS and DX: A is a
 * [128][64] box at (k, m0); DW: A is logits[k..k+63][m0..m0+127] as two
 * [64 tokens][64 columns] boxes, the consumers reading it transposed. */
template <int MODE>
__device__ __forceinline__ void h_produce(unsigned char *base, unsigned char *tok, uint64_t *full,
                                          uint64_t *empty, const CUtensorMap *map_a,
                                          const CUtensorMap *map_b, const float2 *row_c,
                                          int tiles_m, int tiles_n, int kblocks) {
    constexpr int S = h_cfg<MODE>::stages;
    const int tiles = tiles_m * tiles_n;
    int pos = 0;
    for (int w = blockIdx.x; w < tiles; w += gridDim.x) {
        int m0, n0;
        h_tile<MODE>(w, tiles_m, tiles_n, m0, n0);
        for (int kb = 0; kb < kblocks; kb++, pos++) {
            const int s = pos % S, round = pos / S;
            unsigned char *st = base + s * H_STAGE_BYTES;
            if (round > 0) g_mbar_wait(&empty[s], (round - 1) & 1);
            g_mbar_expect(&full[s], H_STAGE_BYTES + (MODE == H_DW ? H_TOK_BYTES : 0));
            if (MODE == H_DW) {
                g_tma_load(st, map_a, m0, kb * G_BK, &full[s]);
                g_tma_load(st + G_A_BYTES / 2, map_a, m0 + 64, kb * G_BK, &full[s]);
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                             " [%0], [%1], %2, [%3];" ::"r"(g_smem(tok + s * H_TOK_BYTES)),
                             "l"(row_c + (size_t)kb * G_BK), "n"(H_TOK_BYTES), "r"(g_smem(&full[s]))
                             : "memory");
            } else {
                g_tma_load(st, map_a, kb * G_BK, m0, &full[s]);
            }
            g_tma_load(st + G_A_BYTES, map_b, kb * G_BK, n0, &full[s]);
        }
    }
}

/* One k16 slice of dlogits for a DX consumer thread, in place in its A
 * fragment: a[0] row ra, columns 2t, 2t+1 of the slice (from v0); a[1] row
 * rb, the same columns; a[2], a[3] columns 2t+8, 2t+9. Columns at or past V
 * (the padding) become 0. */
__device__ __forceinline__ void h_dx_slice(uint32_t *a, float ca, float cb, int ta, int tb, int v0,
                                           int t, int V, float dloss) {
    if (v0 + 16 <= V) {
        a[0] = h_dlogit2(a[0], ca, ca);
        a[1] = h_dlogit2(a[1], cb, cb);
        a[2] = h_dlogit2(a[2], ca, ca);
        a[3] = h_dlogit2(a[3], cb, cb);
    } else { /* the last slices: the padded columns get c = -inf */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int col = v0 + 2 * t + 8 * (i / 2);
            const float c = i % 2 ? cb : ca;
            a[i] = h_dlogit2(a[i], col < V ? c : -INFINITY, col + 1 < V ? c : -INFINITY);
        }
    }
    /* the target's element, if this slice holds it (rarely) */
    const int da = ta - v0, db = tb - v0;
    if ((unsigned)da < 16u || (unsigned)db < 16u) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int d = (i % 2 ? db : da) - 2 * t - 8 * (i / 2);
            if ((unsigned)d < 2u) a[i] = h_sub_target(a[i], d, dloss);
        }
    }
}

/* The same for a DW consumer thread, whose fragment rows are logit columns
 * (va, va + 8; mask -inf where they are padding) and columns tokens: a[0]
 * column va, tokens 2t, 2t+1 of the slice; a[1] column va + 8; a[2], a[3]
 * tokens 2t+8, 2t+9. tk holds the slice's 16 tokens' (c, target). */
__device__ __forceinline__ void h_dw_slice(uint32_t *a, const float2 *tk, int va, float mask_a,
                                           float mask_b, int t, float dloss) {
    const float4 p = *(const float4 *)(tk + 2 * t), q = *(const float4 *)(tk + 2 * t + 8);
    a[0] = h_dlogit2(a[0], p.x + mask_a, p.z + mask_a);
    a[1] = h_dlogit2(a[1], p.x + mask_b, p.z + mask_b);
    a[2] = h_dlogit2(a[2], q.x + mask_a, q.z + mask_a);
    a[3] = h_dlogit2(a[3], q.x + mask_b, q.z + mask_b);
    const int t0 = __float_as_int(p.y), t1 = __float_as_int(p.w);
    const int t2 = __float_as_int(q.y), t3 = __float_as_int(q.w);
    /* a target at va or va + 8 (the test passes a few more; rarely taken) */
    if (((unsigned)(t0 - va) <= 8u) | ((unsigned)(t1 - va) <= 8u) | ((unsigned)(t2 - va) <= 8u) |
        ((unsigned)(t3 - va) <= 8u)) {
        const int tg[4] = {t0, t1, t2, t3};
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                if (tg[2 * (i / 2) + e] == va + 8 * (i % 2)) a[i] = h_sub_target(a[i], e, dloss);
    }
}

/* What a consumer thread needs to turn its rows' logits into dlogits: DX,
 * its two token rows' (c, target); DW, its two logit columns and their
 * masks (-inf for padding). */
struct h_rows {
    float ca, cb, mask_a, mask_b;
    int ta, tb, va;
};

/* A stage's four k16 slices of dlogits into f: ldmatrix (DW transposed),
 * then each slice formed in place. */
template <int MODE>
__device__ __forceinline__ void h_load_stage(uint32_t (&f)[4][4], const unsigned char *st,
                                             const float2 *tk, int kb, const h_rows &r, int c,
                                             int cw, int lane, int V, float dloss, int variant) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (MODE == H_DX) {
            const int row = 64 * c + 16 * cw + (lane & 7) + 8 * ((lane >> 3) & 1);
            const int chunk = 2 * k + (lane >> 4);
            h_ldmatrix<false>(f[k], g_smem(st + row * 128 + ((chunk ^ (lane & 7)) << 4)));
        } else {
            const int krow = 16 * k + (lane & 7) + 8 * (lane >> 4);
            const int chunk = 2 * cw + ((lane >> 3) & 1);
            h_ldmatrix<true>(
                f[k], g_smem(st + c * (G_A_BYTES / 2) + krow * 128 + ((chunk ^ (lane & 7)) << 4)));
        }
    }
    if (variant) return;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (MODE == H_DX)
            h_dx_slice(f[k], r.ca, r.cb, r.ta, r.tb, kb * G_BK + 16 * k, lane % 4, V, dloss);
        else
            h_dw_slice(f[k], tk + 16 * k, r.va, r.mask_a, r.mask_b, lane % 4, dloss);
    }
}

/* One stage of a DX or DW consumer: the four products of the stage at pos
 * with the fragments of set SET (formed during the last step), then, while
 * they run, the next stage's fragments into the other set, whose products
 * (the last step's) are done first; their stage goes back to the producer. */
template <int MODE, int SET>
__device__ __forceinline__ void
h_rs_step(float *acc, uint32_t (&a)[2][4][4], const unsigned char *base, const unsigned char *tok,
          uint64_t *full, uint64_t *empty, int &pos, int kb, int kblocks, const h_rows &r, int c,
          int cw, int lane, int V, float dloss, int variant) {
    constexpr int S = h_cfg<MODE>::stages;
    const unsigned char *st = base + (pos % S) * H_STAGE_BYTES;
    g_wgmma_fence();
#pragma unroll
    for (int k = 0; k < 4; k++)
        h_wgmma_rs(acc, a[SET][k], g_desc(st + G_A_BYTES + 32 * k), kb > 0 || k > 0);
    g_wgmma_commit();
    h_wait_frags<1>(a);
    if (kb > 0 && lane == 0) g_mbar_arrive(&empty[(pos + S - 1) % S]);
    pos++;
    if (kb + 1 < kblocks) {
        g_mbar_wait(&full[pos % S], (pos / S) & 1);
        h_load_stage<MODE>(a[SET ^ 1], base + (pos % S) * H_STAGE_BYTES,
                           (const float2 *)(tok + (pos % S) * H_TOK_BYTES), kb + 1, r, c, cw, lane,
                           V, dloss, variant);
    }
}

/* The consumers (warps 4-11): warpgroup c takes rows 64c..64c+63 of every
 * tile, its products over K and then its share of the staging tile: the
 * sums as bf16 (DW: plus dw's old tile, which the store warp has loaded
 * into it). LOGITS reads both operands from shared memory; DX and DW form
 * A's fragments a stage ahead of their products (h_rs_step), in two sets. */
template <int MODE>
__device__ __forceinline__ void
h_consume(unsigned char *base, unsigned char *staging, const unsigned char *tok, uint64_t *full,
          uint64_t *empty, uint64_t *staged, uint64_t *freed, const float2 *row_c, int tiles_m,
          int tiles_n, int kblocks, int V, float dloss, int warp, int lane, int variant) {
    constexpr int S = h_cfg<MODE>::stages, NB = h_cfg<MODE>::bufs;
    const int c = warp / 4 - 1, cw = warp % 4, t = lane % 4;
    const int r0 = 64 * c + 16 * cw + lane / 4, swz = r0 % 8;
    const int tiles = tiles_m * tiles_n;
    float acc[G_BN / 2];
    uint32_t a[2][4][4] = {};
    int pos = 0;
    unsigned j = 0;
    for (int w = blockIdx.x; w < tiles; w += gridDim.x, j++) {
        int m0, n0;
        h_tile<MODE>(w, tiles_m, tiles_n, m0, n0);
        if (MODE == H_LOGITS) {
            int prev = -1;
            for (int kb = 0; kb < kblocks; kb++, pos++) {
                const int s = pos % S;
                g_mbar_wait(&full[s], (pos / S) & 1);
                const unsigned char *st = base + s * H_STAGE_BYTES;
                g_wgmma_fence();
#pragma unroll
                for (int k = 0; k < G_BK / 16; k++)
                    g_wgmma(acc, g_desc(st + c * 64 * 128 + 32 * k),
                            g_desc(st + G_A_BYTES + 32 * k), kb > 0 || k > 0);
                g_wgmma_commit();
                g_wgmma_wait<1>();
                if (prev >= 0 && lane == 0) g_mbar_arrive(&empty[prev]);
                prev = s;
            }
            g_wgmma_wait<0>();
            if (prev >= 0 && lane == 0) g_mbar_arrive(&empty[prev]);
        } else {
            h_rows r = {};
            if (MODE == H_DX) {
                const float2 pa = row_c[m0 + r0], pb = row_c[m0 + r0 + 8];
                r.ca = pa.x, r.cb = pb.x, r.ta = __float_as_int(pa.y), r.tb = __float_as_int(pb.y);
            } else {
                r.va = m0 + r0;
                r.mask_a = r.va < V ? 0.0f : -INFINITY;
                r.mask_b = r.va + 8 < V ? 0.0f : -INFINITY;
            }
            /* the tile's first stage, then two stages a turn (kblocks is even) */
            g_mbar_wait(&full[pos % S], (pos / S) & 1);
            h_load_stage<MODE>(a[0], base + (pos % S) * H_STAGE_BYTES,
                               (const float2 *)(tok + (pos % S) * H_TOK_BYTES), 0, r, c, cw, lane,
                               V, dloss, variant);
            for (int kb = 0; kb < kblocks; kb += 2) {
                h_rs_step<MODE, 0>(acc, a, base, tok, full, empty, pos, kb, kblocks, r, c, cw, lane,
                                   V, dloss, variant);
                h_rs_step<MODE, 1>(acc, a, base, tok, full, empty, pos, kb + 1, kblocks, r, c, cw,
                                   lane, V, dloss, variant);
            }
            h_wait_frags<0>(a);
            if (lane == 0) g_mbar_arrive(&empty[(pos + S - 1) % S]);
        }

        /* stage the tile in buffer b once it is free (DW: once dw's old tile is in it) */
        const int b = j % NB;
        unsigned char *row0 = staging + b * G_STAGING_BYTES + r0 * 128 + 4 * t;
        if (MODE == H_DW)
            g_mbar_wait(&freed[b], (j / NB) & 1);
        else if (j >= (unsigned)NB)
            g_mbar_wait(&freed[b], (j / NB - 1) & 1);
#pragma unroll
        for (int q = 0; q < G_BN / 8; q++) {
            unsigned char *at = g_stage_at(row0, q, swz);
            const float *d = acc + 4 * q;
            float2 o0 = make_float2(0.0f, 0.0f), o1 = o0;
            if (MODE == H_DW) {
                o0 = __bfloat1622float2(*(const __nv_bfloat162 *)at);
                o1 = __bfloat1622float2(*(const __nv_bfloat162 *)(at + 1024));
            }
            *(__nv_bfloat162 *)at = __floats2bfloat162_rn(d[0] + o0.x, d[1] + o0.y);
            *(__nv_bfloat162 *)(at + 1024) = __floats2bfloat162_rn(d[2] + o1.x, d[3] + o1.y);
        }
        g_fence_async_smem();
        __syncwarp();
        if (lane == 0) g_mbar_arrive(&staged[b]);
    }
}

/* The LOGITS statistics (warps 12-15, thread e = row e of the tile): the
 * row's max and sum of exp(x - max) over the tile's columns below V, from
 * the staged bf16 logits (the values the backward products will read), into
 * stats[n0 / 192][m0 + e]. */
__device__ __forceinline__ void h_stats(const unsigned char *buf, h_stat *stats, int e, int m0,
                                        int n0, int N, int V) {
    const unsigned char *row = buf + e * 128;
    const int sw = e % 8;
    float mx = -INFINITY;
#pragma unroll 1
    for (int q = 0; q < 3; q++)
#pragma unroll
        for (int ch = 0; ch < 8; ch++) {
            const uint4 v = *(const uint4 *)(row + q * G_BOX_BYTES + ((ch ^ sw) << 4));
            const uint32_t *u = (const uint32_t *)&v;
            const int col = n0 + 64 * q + 8 * ch;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float lo = __uint_as_float(u[k] << 16), hi = __uint_as_float(u[k] & 0xffff0000u);
                if (col + 2 * k < V) mx = fmaxf(mx, lo);
                if (col + 2 * k + 1 < V) mx = fmaxf(mx, hi);
            }
        }
    float sum = 0.0f;
    if (mx > -INFINITY) {
        const float off = -mx * H_LOG2E;
#pragma unroll 1
        for (int q = 0; q < 3; q++)
#pragma unroll
            for (int ch = 0; ch < 8; ch++) {
                const uint4 v = *(const uint4 *)(row + q * G_BOX_BYTES + ((ch ^ sw) << 4));
                const uint32_t *u = (const uint32_t *)&v;
                const int col = n0 + 64 * q + 8 * ch;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    float lo = __uint_as_float(u[k] << 16),
                          hi = __uint_as_float(u[k] & 0xffff0000u);
                    if (col + 2 * k < V) sum += h_exp2(fmaf(lo, H_LOG2E, off));
                    if (col + 2 * k + 1 < V) sum += h_exp2(fmaf(hi, H_LOG2E, off));
                }
            }
    }
    stats[(size_t)(n0 / G_BN) * N + m0 + e] = {mx, sum};
}
#endif /* G_KERNEL_BODY */

/* MODE H_LOGITS: y = logits = A . B^T (A inp, B w), and stats. H_DX: y =
 * dinp = dlogits(A) . B^T (A the logits, B w^T). H_DW: y = dw += dlogits(A)^T
 * . B^T (A the logits read transposed, B inp^T). row_c: each token's (c,
 * target) from h_finish_kernel. */
template <int MODE>
__global__ void __launch_bounds__(H_THREADS, 1)
    classifier_sm90_kernel(const __grid_constant__ CUtensorMap map_a,
                           const __grid_constant__ CUtensorMap map_b,
                           const __grid_constant__ CUtensorMap map_y, h_stat *stats,
                           const float2 *row_c, int tiles_m, int tiles_n, int kblocks, int N, int V,
                           float dloss, int variant) {
#ifdef G_KERNEL_BODY
    extern __shared__ __align__(1024) unsigned char h_shared[];
    unsigned char *base = (unsigned char *)(((uintptr_t)h_shared + 1023) & ~(uintptr_t)1023);
    constexpr int S = h_cfg<MODE>::stages, NB = h_cfg<MODE>::bufs;
    unsigned char *staging = base + S * H_STAGE_BYTES;
    unsigned char *tok = staging + NB * G_STAGING_BYTES;
    uint64_t *full = (uint64_t *)(tok + S * H_TOK_BYTES);
    uint64_t *empty = full + S, *staged = empty + S, *freed = staged + NB;
    /* staged[b]: the consumers have written staging tile b; freed[b]: it may
     * be written again (LOGITS, DX: its store has read it, and in LOGITS the
     * statistics are done; DW: dw's old tile has arrived in it) */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int tiles = tiles_m * tiles_n;

    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) {
            g_mbar_init(&full[s], 1);
            g_mbar_init(&empty[s], 8); /* lane 0 of each consumer warp */
        }
        for (int b = 0; b < NB; b++) {
            g_mbar_init(&staged[b], 8);
            g_mbar_init(&freed[b], MODE == H_LOGITS ? 2 : 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    constexpr int CR = h_cfg<MODE>::consumer_regs, OR = h_cfg<MODE>::other_regs;
    static_assert(2 * 128 * (CR + OR) <= 65536, "the register file");
    if (warp >= 4 && warp < 12) {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(CR));
        h_consume<MODE>(base, staging, tok, full, empty, staged, freed, row_c, tiles_m, tiles_n,
                        kblocks, V, dloss, warp, lane, variant);
        return;
    }
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(OR));

    if (warp == 0) {
        if (lane == 0)
            h_produce<MODE>(base, tok, full, empty, &map_a, &map_b, row_c, tiles_m, tiles_n,
                            kblocks);
        return;
    }
    if (warp == 1) { /* the stores, and DW's loads of dw's old tiles */
        if (lane != 0) return;
        unsigned j = 0;
        int pm0 = 0, pn0 = 0;
        for (int w = blockIdx.x; w < tiles; w += gridDim.x, j++) {
            const int b = j % NB;
            int m0, n0;
            h_tile<MODE>(w, tiles_m, tiles_n, m0, n0);
            if (MODE == H_DW) { /* one staging tile: tile j - 1 out, then tile j's old dw in */
                static_assert(MODE != H_DW || NB == 1, "DW stages in one tile");
                if (j > 0) {
                    g_mbar_wait(&staged[0], (j - 1) & 1);
                    g_tma_store_tile(&map_y, staging, pn0, pm0);
                    g_bulk_wait_read<0>();
                }
                g_mbar_expect(&freed[0], G_STAGING_BYTES);
                for (int x = 0; x < G_BN / 64; x++)
                    g_tma_load(staging + x * G_BOX_BYTES, &map_y, n0 + 64 * x, m0, &freed[0]);
            } else {
                g_mbar_wait(&staged[b], (j / NB) & 1);
                g_tma_store_tile(&map_y, staging + b * G_STAGING_BYTES, n0, m0);
                g_bulk_wait_read<0>();
                g_mbar_arrive(&freed[b]);
            }
            pm0 = m0, pn0 = n0;
        }
        if (MODE == H_DW && j > 0) {
            g_mbar_wait(&staged[0], (j - 1) & 1);
            g_tma_store_tile(&map_y, staging, pn0, pm0);
        }
        asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
        return;
    }
    if (MODE == H_LOGITS && warp >= 12) { /* the statistics */
        const int e = threadIdx.x - 384;
        unsigned j = 0;
        for (int w = blockIdx.x; w < tiles; w += gridDim.x, j++) {
            const int b = j % NB;
            int m0, n0;
            h_tile<MODE>(w, tiles_m, tiles_n, m0, n0);
            g_mbar_wait(&staged[b], (j / NB) & 1);
            h_stats(staging + b * G_STAGING_BYTES, stats, e, m0, n0, N, V);
            asm volatile("bar.sync 1, 128;" ::: "memory");
            if (e == 0) g_mbar_arrive(&freed[b]);
        }
    }
#else
    (void)map_a, (void)map_b, (void)map_y, (void)stats, (void)row_c, (void)tiles_m, (void)tiles_n,
        (void)kblocks, (void)N, (void)V, (void)dloss, (void)variant;
#endif
}

/* Each row's logsumexp from its tiles' (max, sum), merged in tile order;
 * then losses[n] = lse - logits[n][target] (0 for a masked row, NaN for a
 * target outside the vocabulary) and row_c[n] = (log2(dloss) - lse .
 * log2(e), target): -inf for a masked row, whose dlogits are then 0, and NaN
 * for a bad target, whose dlogits are then NaN too, as the unfused
 * cross-entropy gives. A block takes 32 rows, lane l row l, warp w the tiles
 * w, w + 8, ... (coalesced reads of stats [tiles][N]). */
#define H_FINISH_WARPS 8
__device__ __forceinline__ void h_merge(float &m, float &s, float m2, float s2) {
    const float mm = fmaxf(m, m2);
    if (mm == -INFINITY) return;
    s = s * exp2f((m - mm) * H_LOG2E) + s2 * exp2f((m2 - mm) * H_LOG2E);
    m = mm;
}

__global__ void __launch_bounds__(32 * H_FINISH_WARPS)
    h_finish_kernel(float *losses, float2 *row_c, const h_stat *stats, const __nv_bfloat16 *logits,
                    const int32_t *targets, int N, int tiles_n, int64_t Vp, int V, float dloss) {
    __shared__ float sm[H_FINISH_WARPS][32], ss[H_FINISH_WARPS][32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int n = blockIdx.x * 32 + lane;
    float m = -INFINITY, s = 0.0f;
    if (n < N)
        for (int tn = warp; tn < tiles_n; tn += H_FINISH_WARPS) {
            const h_stat st = stats[(size_t)tn * N + n];
            h_merge(m, s, st.max, st.sum);
        }
    sm[warp][lane] = m;
    ss[warp][lane] = s;
    __syncthreads();
    if (warp != 0 || n >= N) return;
    for (int w = 1; w < H_FINISH_WARPS; w++)
        h_merge(m, s, sm[w][lane], ss[w][lane]);
    const float lse = m + logf(s);
    const int tgt = targets[n];
    float loss, c;
    if (tgt == -1) {
        loss = 0.0f;
        c = -INFINITY;
    } else if (tgt < 0 || tgt >= V) {
        loss = c = NAN;
    } else {
        loss = lse - __bfloat162float(logits[(size_t)n * Vp + tgt]);
        c = log2f(dloss) - lse * H_LOG2E;
    }
    losses[n] = loss;
    row_c[n] = make_float2(c, __int_as_float(tgt));
}

/* --------------------------------------------------------------- host */

template <int MODE> static int h_smem_ok(void) {
    return cudaFuncSetAttribute(classifier_sm90_kernel<MODE>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                h_cfg<MODE>::smem) == cudaSuccess;
}

/* Whether this GPU runs the kernels (asked once per device). */
static int h_device_ok(void) {
    static int ok[GPC_CUDA_MAX_DEVICES]; /* 0 unknown, 1 no, 2 yes */
    int d = 0;
    if (cudaGetDevice(&d) != cudaSuccess || d < 0 || d >= GPC_CUDA_MAX_DEVICES) return 0;
    if (!ok[d]) {
        int yes =
            gpc_sm90_gpu_ok() && h_smem_ok<H_LOGITS>() && h_smem_ok<H_DX>() && h_smem_ok<H_DW>();
        if (!yes) cudaGetLastError();
        ok[d] = yes ? 2 : 1;
    }
    return ok[d] == 2;
}

static long calls;

long gpc_cuda_classifier_sm90_calls(void) {
    return __atomic_load_n(&calls, __ATOMIC_RELAXED);
}

template <int MODE>
static gpc_status h_launch(const CUtensorMap &map_a, const CUtensorMap &map_b,
                           const CUtensorMap &map_y, h_stat *stats, const float2 *row_c,
                           int64_t tiles_m, int64_t tiles_n, int64_t kblocks, int64_t N, int V,
                           float dloss) {
    const int64_t tiles = tiles_m * tiles_n;
    /* GPC_SM90_BLOCKS (read each call; for tests) caps the persistent grid,
     * so that a small problem still has blocks walking several tiles */
    const char *cap = getenv("GPC_SM90_BLOCKS");
    int64_t grid = gpc_cuda_sm_count();
    if (cap && atoi(cap) > 0 && atoi(cap) < grid) grid = atoi(cap);
    if (tiles < grid) grid = tiles;
    classifier_sm90_kernel<MODE>
        <<<(unsigned)grid, H_THREADS, h_cfg<MODE>::smem, gpc_cuda_stream()>>>(
            map_a, map_b, map_y, stats, row_c, (int)tiles_m, (int)tiles_n, (int)kblocks, (int)N, V,
            dloss, getenv("GPC_HEAD_VARIANT") ? atoi(getenv("GPC_HEAD_VARIANT")) : 0);
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

gpc_status gpc_cuda_classifier_sm90(float *losses, gpc_bf16_t *dinp, gpc_bf16_t *dw,
                                    gpc_bf16_t *logits, const gpc_bf16_t *inp, const gpc_bf16_t *w,
                                    const int32_t *targets, int64_t N, int64_t Vp, int64_t C, int V,
                                    float dloss) {
    static int head_on = -1;
    const void *ptrs[7] = {losses, dinp, dw, logits, inp, w, targets};
    int aligned = 1;
    for (int i = 0; i < 7; i++)
        aligned &= gpc_cuda_aligned16(ptrs[i]);
    if (!gpc_cuda_env_on("GPC_GEMM_SM90_HEAD", &head_on) || !gpc_cuda_gemm_sm90_available() ||
        N <= 0 || Vp <= 0 || C <= 0 || N % G_BM || Vp % (2 * G_BN) || C % G_BN || V <= 0 ||
        V > Vp || N > 0x7fffffff || Vp > 0x7fffffff || C > 0x7fffffff ||
        (N / G_BM) * (Vp / G_BN) > 0x7fffffff || !(dloss >= 0.0f) || !aligned || !h_device_ok())
        return gpc_error(GPC_ERR_UNSUPPORTED, "classifier_sm90: not for this shape or GPU");
    /* scratch: w^T or inp^T (one at a time), the tiles' statistics, row_c */
    const int64_t tiles_n = Vp / G_BN;
    const size_t t_bytes = ((size_t)(Vp > N ? Vp : N) * C * 2 + 255) & ~(size_t)255;
    const size_t s_bytes = ((size_t)tiles_n * N * sizeof(h_stat) + 255) & ~(size_t)255;
    unsigned char *scratch = NULL;
    GPC_TRY(gpc_cuda_scratch(t_bytes + s_bytes + (size_t)N * sizeof(float2), (void **)&scratch));
    h_stat *stats = (h_stat *)(scratch + t_bytes);
    float2 *row_c = (float2 *)(scratch + t_bytes + s_bytes);

    /* 1. logits and their statistics */
    CUtensorMap map_a, map_b, map_y;
    GPC_TRY(gpc_sm90_make_map(&map_a, inp, N, C, G_BM));
    GPC_TRY(gpc_sm90_make_map(&map_b, w, Vp, C, G_BN));
    GPC_TRY(gpc_sm90_make_map(&map_y, logits, N, Vp, G_BM));
    GPC_TRY(h_launch<H_LOGITS>(map_a, map_b, map_y, stats, row_c, N / G_BM, tiles_n, C / G_BK, N, V,
                               dloss));
    /* 2. the losses and each row's constant */
    h_finish_kernel<<<(unsigned)((N + 31) / 32), 32 * H_FINISH_WARPS, 0, gpc_cuda_stream()>>>(
        losses, row_c, stats, (const __nv_bfloat16 *)logits, targets, (int)N, (int)tiles_n, Vp, V,
        dloss);
    GPC_CUDA_CHECK_LAUNCH();
    /* 3. dinp = dlogits . w, with w^T [C, Vp] as B */
    GPC_TRY(gpc_cuda_transpose16(scratch, w, Vp, C));
    GPC_TRY(gpc_sm90_make_map(&map_a, logits, N, Vp, G_BM));
    GPC_TRY(gpc_sm90_make_map(&map_b, scratch, C, Vp, G_BN));
    GPC_TRY(gpc_sm90_make_map(&map_y, dinp, N, C, G_BM));
    GPC_TRY(h_launch<H_DX>(map_a, map_b, map_y, NULL, row_c, N / G_BM, C / G_BN, Vp / G_BK, N, V,
                           dloss));
    /* 4. dw += dlogits^T . inp, with inp^T [C, N] as B and the logits read
     * in [64 tokens][64 columns] boxes */
    GPC_TRY(gpc_cuda_transpose16(scratch, inp, N, C));
    GPC_TRY(gpc_sm90_make_map(&map_a, logits, N, Vp, 64));
    GPC_TRY(gpc_sm90_make_map(&map_b, scratch, C, N, G_BN));
    GPC_TRY(gpc_sm90_make_map(&map_y, dw, Vp, C, G_BM));
    GPC_TRY(h_launch<H_DW>(map_a, map_b, map_y, NULL, row_c, Vp / G_BM, C / G_BN, N / G_BK, N, V,
                           dloss));
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    return GPC_OK;
}
