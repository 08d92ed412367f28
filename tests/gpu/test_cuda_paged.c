/*
 * test_cuda_paged.c: the serving ops on the GPU (src/cuda/paged.cu and
 * sample.cu) against the CPU ops on the same inputs.
 *
 * Inputs are drawn in f32 and rounded to the dtype under test, so the CPU
 * (f32) sees exactly the values the GPU sees. Paged attention runs
 * sequences of 1 to 2048 positions whose blocks are handed out in a
 * shuffled order, with decode rows alone (few rows: the keys are split over
 * several blocks) and decode rows mixed with prefill rows (a run of
 * consecutive positions of one sequence), at a head size the 16-byte path
 * takes and one it does not. Cache slots no row may read hold NaN, and the
 * GPU's outputs start as NaN, so a stray read or a missed write fails.
 * test_paged_kernels runs each attention kernel (GPC_PAGED_KERNEL v1, v2,
 * v3) on fresh inputs: 256 rows, one row, rows at random positions, head
 * counts and sizes v2 and v3 take and one they leave to v1; CTest runs the
 * other paged attention tests under each kernel too (gpu_test_cuda_paged_v1,
 * _v2, _v3). test_paged_split_merge runs steps of few rows, whose keys
 * split over blocks, under each kernel, with either merge of the splits.
 * Tolerances are relative to the larger of |reference| and the output's
 * RMS: 1e-4 in f32, 2e-2 in bf16 and f16 (the output's own rounding).
 * kv_store and embedding_at are copies and sums of rounded values, checked
 * exactly. Bad table entries must stay inside the cache (checked against a
 * float64 reference of what the kernel promises). Sampling must give the
 * CPU's token, or, where the uniform or top_p lies within 1e-4 of a
 * boundary, the CPU's token at a nearby uniform or top_p; greedy rows
 * full of ties must give the first largest id exactly. forbid_tokens
 * must change exactly the entries it names, feed_tokens give the CPU's
 * tokens.
 *
 * Without a usable GPU the test exits 77, which CTest reports as skipped.
 */
#include "testutil_cuda.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/paged.h"
#include "ops/ops.h"

static gpc_rng rng;
static const gpc_dtype dtypes[3] = {GPC_F32, GPC_BF16, GPC_F16};

static int32_t below(int32_t n) {
    return (int32_t)gpc_rng_below(&rng, (uint32_t)n);
}

static void shuffle_i32(int32_t *a, int64_t n) {
    for (int64_t i = n - 1; i > 0; i--) {
        int32_t j = below((int32_t)(i + 1)), t = a[i];
        a[i] = a[j], a[j] = t;
    }
}

/* A paged cache on the host: sequences of the given lengths, their blocks
 * shuffled over the cache, keys and values random (rounded to dtype) where
 * a position is stored, NaN in every other slot. */
typedef struct {
    int64_t S, block, max_blocks, num_blocks, C;
    int32_t *tables; /* [S, max_blocks], -1 past a sequence's blocks */
    float *k, *v;    /* [num_blocks * block, C] */
} host_cache;

static host_cache make_cache(gpc_dtype dtype, const int64_t *len, int64_t S, int64_t C) {
    host_cache h;
    h.S = S, h.block = 16, h.max_blocks = 2048 / 16, h.C = C;
    int64_t used = 0;
    for (int64_t s = 0; s < S; s++)
        used += (len[s] + h.block - 1) / h.block;
    h.num_blocks = used + 5; /* blocks no sequence owns, NaN throughout */
    int32_t *perm = malloc((size_t)h.num_blocks * sizeof(int32_t));
    for (int64_t i = 0; i < h.num_blocks; i++)
        perm[i] = (int32_t)i;
    shuffle_i32(perm, h.num_blocks);
    h.tables = malloc((size_t)(S * h.max_blocks) * sizeof(int32_t));
    size_t n = (size_t)(h.num_blocks * h.block * C);
    h.k = malloc(n * sizeof(float)), h.v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        h.k[i] = h.v[i] = NAN;
    int64_t next = 0;
    for (int64_t s = 0; s < S; s++) {
        for (int64_t b = 0; b < h.max_blocks; b++)
            h.tables[s * h.max_blocks + b] = b * h.block < len[s] ? perm[next++] : -1;
        for (int64_t p = 0; p < len[s]; p++) {
            int64_t slot =
                (int64_t)h.tables[s * h.max_blocks + p / h.block] * h.block + p % h.block;
            for (int64_t c = 0; c < C; c++) {
                h.k[slot * C + c] = test_round_to(dtype, gpc_rng_normal(&rng));
                h.v[slot * C + c] = test_round_to(dtype, gpc_rng_normal(&rng));
            }
        }
    }
    free(perm);
    return h;
}

static void drop_cache(host_cache *h) {
    free(h->tables), free(h->k), free(h->v);
}

/* out = paged attention of rows (seq, pos, queries in qkv [N, 3C]) on the
 * CPU (f32) and on the GPU (dtype), compared. */
static void paged_compare(const char *what, gpc_dtype dtype, const host_cache *h, int NH,
                          const int32_t *seq, const int32_t *pos, int64_t N) {
    const int64_t C = h->C;
    float *qkv = malloc((size_t)(N * 3 * C) * sizeof(float));
    for (int64_t i = 0; i < N * 3 * C; i++)
        qkv[i] = test_round_to(dtype, gpc_rng_normal(&rng));
    float *want = malloc((size_t)(N * C) * sizeof(float));
    gpc_device cpu = gpc_cpu();
    gpc_tensor cq = gpc_tensor_2d(qkv, GPC_F32, cpu, N, 3 * C);
    gpc_tensor co = gpc_tensor_2d(want, GPC_F32, cpu, N, C);
    gpc_tensor ck = gpc_tensor_3d(h->k, GPC_F32, cpu, h->num_blocks, h->block, C);
    gpc_tensor cv = gpc_tensor_3d(h->v, GPC_F32, cpu, h->num_blocks, h->block, C);
    gpc_tensor ct = gpc_tensor_2d(h->tables, GPC_I32, cpu, h->S, h->max_blocks);
    gpc_tensor cs = gpc_tensor_1d((void *)seq, GPC_I32, cpu, N);
    gpc_tensor cp = gpc_tensor_1d((void *)pos, GPC_I32, cpu, N);
    TEST_OK(gpc_op_paged_attention(&co, &cq, &ck, &cv, &ct, &cs, &cp, NH));

    const int64_t sq[2] = {N, 3 * C}, so[2] = {N, C}, sc[3] = {h->num_blocks, h->block, C};
    const int64_t st[2] = {h->S, h->max_blocks}, sn[1] = {N};
    gpc_tensor gq = test_gpu_tensor(dtype, 2, sq, qkv), go = test_gpu_tensor(dtype, 2, so, NULL);
    gpc_tensor gk = test_gpu_tensor(dtype, 3, sc, h->k), gv = test_gpu_tensor(dtype, 3, sc, h->v);
    gpc_tensor gt = test_gpu_tensor(GPC_I32, 2, st, h->tables);
    gpc_tensor gs = test_gpu_tensor(GPC_I32, 1, sn, seq), gp = test_gpu_tensor(GPC_I32, 1, sn, pos);
    TEST_OK(gpc_op_paged_attention(&go, &gq, &gk, &gv, &gt, &gs, &gp, NH));
    float *got = test_gpu_download(&go);

    double rms = 0;
    for (int64_t i = 0; i < N * C; i++)
        rms += (double)want[i] * want[i];
    rms = sqrt(rms / (double)(N * C));
    char label[200];
    snprintf(label, sizeof label, "paged attention %s (%s, %lld rows, %d heads of %lld)", what,
             gpc_dtype_name(dtype), (long long)N, NH, (long long)(C / NH));
    test_assert_close_f32(label, got, want, (size_t)(N * C), dtype == GPC_F32 ? 1e-4 : 2e-2,
                          rms > 1e-30 ? rms : 1e-30);
    gpc_tensor *all[] = {&gq, &go, &gk, &gv, &gt, &gs, &gp};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        gpc_tensor_free(all[i]);
    free(qkv), free(want), free(got);
}

static void test_paged_attention(void **state) {
    (void)state;
    /* lengths at and around the kernel's split sizes and the table's end */
    const int64_t len[10] = {1, 17, 255, 256, 257, 700, 1024, 1500, 2047, 2048};
    const int64_t S = 10;
    /* 12 heads of 64 (GPT-2, 16-byte loads) and 2 heads of 48 (scalar) */
    const int heads[2][2] = {{12, 64}, {2, 48}};
    for (int d = 0; d < 3; d++)
        for (int c = 0; c < 2; c++) {
            gpc_dtype dtype = dtypes[d];
            int NH = heads[c][0];
            int64_t C = (int64_t)NH * heads[c][1];
            host_cache h = make_cache(dtype, len, S, C);
            /* decode rows alone: one per sequence, at its last position */
            int32_t seq[10 + 40 + 17], pos[10 + 40 + 17];
            int64_t N = 0;
            for (int64_t s = 0; s < S; s++)
                seq[N] = (int32_t)s, pos[N] = (int32_t)(len[s] - 1), N++;
            paged_compare("decode rows", dtype, &h, NH, seq, pos, N);
            /* and with prefill rows: the last 40 positions of sequence 5,
             * every position of sequence 1, all in a shuffled order */
            for (int64_t p = len[5] - 40; p < len[5]; p++)
                seq[N] = 5, pos[N] = (int32_t)p, N++;
            for (int64_t p = 0; p < len[1]; p++)
                seq[N] = 1, pos[N] = (int32_t)p, N++;
            int32_t order[67];
            for (int64_t i = 0; i < N; i++)
                order[i] = (int32_t)i;
            shuffle_i32(order, N);
            int32_t mseq[67], mpos[67];
            for (int64_t i = 0; i < N; i++)
                mseq[i] = seq[order[i]], mpos[i] = pos[order[i]];
            paged_compare("decode and prefill rows", dtype, &h, NH, mseq, mpos, N);
            drop_cache(&h);
        }
}

/* Each kernel (v1, v2, v3) against the CPU on fresh inputs, at the shapes
 * v2 and v3 take (head rows of 8, 16 and 32 16-byte pieces, head counts
 * that are and are not a multiple of the heads their blocks take) and one
 * they leave to v1: 256 rows of one step (one block per unit, no split), one row (its
 * keys split over many blocks), and rows at random positions of random
 * sequences; lengths at random, mostly not a multiple of the block size. */
static void test_paged_kernels(void **state) {
    (void)state;
    /* dtype, heads, head size, sequences, longest */
    const struct {
        gpc_dtype dtype;
        int NH, hs, S, longest;
    } cases[] = {
        {GPC_BF16, 12, 64, 40, 1100},
        {GPC_BF16, 12, 64, 256, 300},
        {GPC_BF16, 3, 64, 24, 500},
        {GPC_F16, 6, 64, 256, 200},
        {GPC_F32, 5, 32, 40, 1000},
        {GPC_F32, 2, 64, 20, 2048},
        {GPC_BF16, 2, 256, 8, 900},
        /* 12 pieces a head: v1 whatever the setting */
        {GPC_F32, 3, 48, 16, 600},
    };
    for (int kernel = 1; kernel <= 3; kernel++) {
        int before = gpc_cuda_paged_set_kernel(kernel);
        long calls = gpc_cuda_paged_calls(kernel), want_calls = 0;
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            const gpc_dtype dtype = cases[c].dtype;
            const int NH = cases[c].NH, S = cases[c].S;
            const int64_t C = (int64_t)NH * cases[c].hs;
            int64_t *len = malloc((size_t)S * sizeof(int64_t));
            for (int i = 0; i < S; i++)
                len[i] = 1 + below(cases[c].longest);
            len[0] = cases[c].longest, len[1] = 1;
            if (S > 3) len[2] = 16, len[3] = 17;
            host_cache h = make_cache(dtype, len, S, C);
            const int64_t rows = S > 64 ? S : 64;
            int32_t *seq = malloc((size_t)rows * sizeof(int32_t));
            int32_t *pos = malloc((size_t)rows * sizeof(int32_t));
            char what[120];
            snprintf(what, sizeof what, "kernel v%d, one row", kernel);
            seq[0] = 0, pos[0] = (int32_t)(len[0] - 1);
            paged_compare(what, dtype, &h, NH, seq, pos, 1);
            snprintf(what, sizeof what, "kernel v%d, every sequence's last position", kernel);
            for (int i = 0; i < S; i++)
                seq[i] = i, pos[i] = (int32_t)(len[i] - 1);
            paged_compare(what, dtype, &h, NH, seq, pos, S);
            snprintf(what, sizeof what, "kernel v%d, random positions", kernel);
            for (int64_t i = 0; i < rows; i++) {
                seq[i] = below(S);
                pos[i] = below((int32_t)len[seq[i]]);
            }
            paged_compare(what, dtype, &h, NH, seq, pos, rows);
            const int lanes = (int)((int64_t)cases[c].hs * (int64_t)gpc_dtype_size(dtype) / 16);
            if (kernel == 1 || lanes == 8 || lanes == 16 || lanes == 32) want_calls += 3;
            free(seq), free(pos), free(len);
            drop_cache(&h);
        }
        if (gpc_cuda_paged_calls(kernel) - calls != want_calls)
            fail_msg("kernel v%d: %ld calls ran it, %ld expected", kernel,
                     gpc_cuda_paged_calls(kernel) - calls, want_calls);
        gpc_cuda_paged_set_kernel(before);
    }
}

/* Steps of few rows, whose keys split over several blocks, merged by the
 * last block of each unit (GPC_PAGED_COMBINE=fused, the default) or by the
 * combine kernel (=kernel): each kernel, odd head counts and sizes (the
 * scalar path's too), 1 to 5 rows, each shape three times on fresh
 * queries, so that a merge counter left behind by one call would spoil the
 * next (outputs start as NaN). Which merge ran is counted, and must be the
 * one the setting names. CTest runs it with the combine kernel, without
 * programmatic launches, and with splits of 64 keys too. */
static void test_paged_split_merge(void **state) {
    (void)state;
    const struct {
        gpc_dtype dtype;
        int NH, hs;
    } cases[] = {
        {GPC_BF16, 12, 64}, {GPC_BF16, 13, 64}, {GPC_F16, 5, 64},
        {GPC_F32, 3, 32},   {GPC_BF16, 2, 48},  {GPC_F32, 7, 128},
    };
    const char *combine = gpc_setting_str("GPC_PAGED_COMBINE");
    const int fused = !(combine && !strcmp(combine, "kernel"));
    long before[3];
    for (int how = 0; how < 3; how++)
        before[how] = gpc_cuda_paged_split_calls(how);
    long calls = 0;
    for (int kernel = 1; kernel <= 3; kernel++) {
        int was = gpc_cuda_paged_set_kernel(kernel);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            const gpc_dtype dtype = cases[c].dtype;
            const int NH = cases[c].NH, S = 6;
            const int64_t C = (int64_t)NH * cases[c].hs;
            int64_t len[6];
            for (int i = 0; i < S; i++)
                len[i] = 1 + below(1300);
            len[0] = 2048, len[1] = 1, len[2] = 383;
            host_cache h = make_cache(dtype, len, S, C);
            for (int rows = 1; rows <= 5; rows += 2)
                for (int rep = 0; rep < 3; rep++) {
                    int32_t seq[5], pos[5];
                    for (int i = 0; i < rows; i++) {
                        seq[i] = below(S);
                        pos[i] = below((int32_t)len[seq[i]]);
                    }
                    if (rep == 0) seq[0] = 0, pos[0] = 2047; /* every split has keys */
                    char what[120];
                    snprintf(what, sizeof what, "split merge, kernel v%d, call %d", kernel, rep);
                    paged_compare(what, dtype, &h, NH, seq, pos, rows);
                    calls++;
                }
            drop_cache(&h);
        }
        gpc_cuda_paged_set_kernel(was);
    }
    long got[3];
    for (int how = 0; how < 3; how++)
        got[how] = gpc_cuda_paged_split_calls(how) - before[how];
    if (got[0] + got[1] + got[2] != calls)
        fail_msg("split merge: %ld + %ld + %ld calls counted, %ld made", got[0], got[1], got[2],
                 calls);
    if (fused ? got[2] == 0 || got[1] != 0 : got[1] == 0 || got[2] != 0)
        fail_msg("split merge (GPC_PAGED_COMBINE=%s): %ld calls merged by the kernel, %ld by "
                 "the last blocks",
                 fused ? "fused" : "kernel", got[1], got[2]);
}

/* Attention in float64 of query q over the positions 0 .. keys-1 of a
 * sequence whose table entries outside the cache are skipped (what the
 * CUDA kernel promises). */
static void ref_skipping(double *out, const float *q, const host_cache *h, const int32_t *table,
                         int64_t keys, int64_t hs, int64_t head) {
    double max = -INFINITY, sum = 0, *s = malloc((size_t)keys * sizeof(double));
    for (int64_t d = 0; d < hs; d++)
        out[d] = 0;
    for (int64_t p = 0; p < keys; p++) {
        int32_t e = table[p / h->block];
        s[p] = NAN;
        if (e < 0 || e >= h->num_blocks) continue;
        const float *k = h->k + ((int64_t)e * h->block + p % h->block) * h->C + head * hs;
        double dot = 0;
        for (int64_t d = 0; d < hs; d++)
            dot += (double)q[d] * k[d];
        s[p] = dot / sqrt((double)hs);
        if (s[p] > max) max = s[p];
    }
    for (int64_t p = 0; p < keys; p++) {
        if (isnan(s[p])) continue;
        int32_t e = table[p / h->block];
        const float *v = h->v + ((int64_t)e * h->block + p % h->block) * h->C + head * hs;
        double w = exp(s[p] - max);
        sum += w;
        for (int64_t d = 0; d < hs; d++)
            out[d] += w * v[d];
    }
    for (int64_t d = 0; d < hs; d++)
        out[d] /= sum;
    free(s);
}

static void test_paged_attention_bad_tables(void **state) {
    (void)state;
    const int64_t len[3] = {100, 300, 2048}, S = 3, NH = 4, hs = 64, C = NH * hs;
    for (int d = 0; d < 2; d++) {
        gpc_dtype dtype = dtypes[d];
        host_cache h = make_cache(dtype, len, S, C);
        /* sequence 1: a block past the cache and a negative one */
        h.tables[1 * h.max_blocks + 3] = 1 << 30;
        h.tables[1 * h.max_blocks + 7] = -7;
        /* rows: sequence 1 at its end; a sequence past the table; a
         * negative position; sequence 2 past its table's width */
        enum { N = 4 };
        const int32_t seq[N] = {1, 3, 0, 2}, pos[N] = {299, 5, -1, 2048 + 100};
        float *qkv = malloc((size_t)(N * 3 * C) * sizeof(float));
        for (int64_t i = 0; i < N * 3 * C; i++)
            qkv[i] = test_round_to(dtype, gpc_rng_normal(&rng));
        const int64_t sq[2] = {N, 3 * C}, so[2] = {N, C}, sc[3] = {h.num_blocks, h.block, C};
        const int64_t st[2] = {h.S, h.max_blocks}, sn[1] = {N};
        gpc_tensor gq = test_gpu_tensor(dtype, 2, sq, qkv);
        gpc_tensor go = test_gpu_tensor(dtype, 2, so, NULL);
        gpc_tensor gk = test_gpu_tensor(dtype, 3, sc, h.k), gv = test_gpu_tensor(dtype, 3, sc, h.v);
        gpc_tensor gt = test_gpu_tensor(GPC_I32, 2, st, h.tables);
        gpc_tensor gs = test_gpu_tensor(GPC_I32, 1, sn, seq);
        gpc_tensor gp = test_gpu_tensor(GPC_I32, 1, sn, pos);
        TEST_OK(gpc_op_paged_attention(&go, &gq, &gk, &gv, &gt, &gs, &gp, (int)NH));
        float *got = test_gpu_download(&go);
        double want[64];
        const int64_t keys[N] = {300, 0, 0, 2048};
        for (int64_t i = 0; i < N; i++)
            for (int64_t head = 0; head < NH; head++) {
                const float *o = got + i * C + head * hs;
                if (keys[i] == 0) {
                    for (int64_t x = 0; x < hs; x++)
                        if (!isnan(o[x]))
                            fail_msg("%s: bad row %lld (sequence %d, position %d) gave %g at "
                                     "head %lld dimension %lld; NaN expected",
                                     gpc_dtype_name(dtype), (long long)i, seq[i], pos[i],
                                     (double)o[x], (long long)head, (long long)x);
                    continue;
                }
                ref_skipping(want, qkv + i * 3 * C + head * hs, &h,
                             h.tables + (int64_t)seq[i] * h.max_blocks, keys[i], hs, head);
                char label[160];
                snprintf(label, sizeof label, "%s: row %lld head %lld with bad table entries",
                         gpc_dtype_name(dtype), (long long)i, (long long)head);
                test_assert_close(label, o, want, (size_t)hs, dtype == GPC_F32 ? 1e-4 : 2e-2, 0.1);
            }
        gpc_tensor *all[] = {&gq, &go, &gk, &gv, &gt, &gs, &gp};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            gpc_tensor_free(all[i]);
        free(qkv), free(got);
        drop_cache(&h);
    }
}

static void test_kv_store(void **state) {
    (void)state;
    const int64_t N = 37, C = 96, num_blocks = 9, block = 16, rows = num_blocks * block;
    for (int d = 0; d < 3; d++) {
        gpc_dtype dtype = dtypes[d];
        for (int c = 0; c < 2; c++) {
            /* c = 1: C odd in 16-byte units (scalar path) */
            int64_t CC = c ? C + 1 : C;
            float *qkv = malloc((size_t)(N * 3 * CC) * sizeof(float));
            float *k = malloc((size_t)(rows * CC) * sizeof(float));
            float *v = malloc((size_t)(rows * CC) * sizeof(float));
            for (int64_t i = 0; i < N * 3 * CC; i++)
                qkv[i] = test_round_to(dtype, gpc_rng_normal(&rng));
            for (int64_t i = 0; i < rows * CC; i++)
                k[i] = test_round_to(dtype, gpc_rng_normal(&rng)), v[i] = -k[i];
            int32_t perm[144], slots[37];
            for (int64_t i = 0; i < rows; i++)
                perm[i] = (int32_t)i;
            shuffle_i32(perm, rows);
            memcpy(slots, perm, sizeof slots);
            const int64_t sq[2] = {N, 3 * CC}, sc[3] = {num_blocks, block, CC}, sn[1] = {N};
            /* two slots outside the cache: skipped on the GPU */
            slots[4] = -1, slots[9] = (int32_t)rows;
            gpc_tensor gq = test_gpu_tensor(dtype, 2, sq, qkv);
            gpc_tensor gk = test_gpu_tensor(dtype, 3, sc, k);
            gpc_tensor gv = test_gpu_tensor(dtype, 3, sc, v);
            gpc_tensor gs = test_gpu_tensor(GPC_I32, 1, sn, slots);
            TEST_OK(gpc_op_kv_store(&gk, &gv, &gq, &gs));
            float *gotk = test_gpu_download(&gk), *gotv = test_gpu_download(&gv);
            for (int64_t i = 0; i < N; i++) {
                if (slots[i] < 0 || slots[i] >= rows) continue;
                for (int64_t x = 0; x < CC; x++) {
                    k[slots[i] * CC + x] = qkv[i * 3 * CC + CC + x];
                    v[slots[i] * CC + x] = qkv[i * 3 * CC + 2 * CC + x];
                }
            }
            for (int64_t i = 0; i < rows * CC; i++)
                if (!(gotk[i] == k[i] && gotv[i] == v[i]))
                    fail_msg("kv_store (%s, C %lld): cache row %lld channel %lld is k %g v %g, "
                             "want k %g v %g",
                             gpc_dtype_name(dtype), (long long)CC, (long long)(i / CC),
                             (long long)(i % CC), (double)gotk[i], (double)gotv[i], (double)k[i],
                             (double)v[i]);
            gpc_tensor_free(&gq), gpc_tensor_free(&gk), gpc_tensor_free(&gv);
            gpc_tensor_free(&gs);
            free(qkv), free(k), free(v), free(gotk), free(gotv);
        }
    }
}

static void test_embedding_at(void **state) {
    (void)state;
    const int64_t V = 300, C = 64, maxT = 50, N = 33;
    for (int d = 0; d < 3; d++) {
        gpc_dtype dtype = dtypes[d];
        float *wte = malloc((size_t)(V * C) * sizeof(float));
        float *wpe = malloc((size_t)(maxT * C) * sizeof(float));
        for (int64_t i = 0; i < V * C; i++)
            wte[i] = test_round_to(dtype, gpc_rng_normal(&rng));
        for (int64_t i = 0; i < maxT * C; i++)
            wpe[i] = test_round_to(dtype, gpc_rng_normal(&rng));
        int32_t tok[33], pos[33];
        for (int64_t i = 0; i < N; i++)
            tok[i] = below((int32_t)V), pos[i] = below((int32_t)maxT);
        tok[5] = (int32_t)V, pos[7] = -1; /* outside wte and wpe: NaN rows */
        const int64_t se[2] = {V, C}, sp[2] = {maxT, C}, so[2] = {N, C}, sn[1] = {N};
        gpc_tensor ge = test_gpu_tensor(dtype, 2, se, wte);
        gpc_tensor gpe = test_gpu_tensor(dtype, 2, sp, wpe);
        gpc_tensor go = test_gpu_tensor(dtype, 2, so, NULL);
        gpc_tensor gt = test_gpu_tensor(GPC_I32, 1, sn, tok);
        gpc_tensor gp = test_gpu_tensor(GPC_I32, 1, sn, pos);
        TEST_OK(gpc_op_embedding_at(&go, &gt, &gp, &ge, &gpe));
        float *got = test_gpu_download(&go);
        for (int64_t i = 0; i < N; i++)
            for (int64_t c = 0; c < C; c++) {
                float g = got[i * C + c];
                if (i == 5 || i == 7) {
                    if (!isnan(g))
                        fail_msg("embedding_at (%s): row %lld (token %d, position %d) gave %g, "
                                 "NaN expected",
                                 gpc_dtype_name(dtype), (long long)i, tok[i], pos[i], (double)g);
                    continue;
                }
                float want = test_round_to(dtype, wte[tok[i] * C + c] + wpe[pos[i] * C + c]);
                if (g != want)
                    fail_msg("embedding_at (%s): row %lld channel %lld is %g, want %g",
                             gpc_dtype_name(dtype), (long long)i, (long long)c, (double)g,
                             (double)want);
            }
        gpc_tensor_free(&ge), gpc_tensor_free(&gpe), gpc_tensor_free(&go);
        gpc_tensor_free(&gt), gpc_tensor_free(&gp);
        free(wte), free(wpe), free(got);
    }
}

/* The CPU's token for row x at (top_p, uniform) within delta of the given
 * ones: the tokens the GPU may give. Below top_p 1 the tokens are taken in
 * order of probability, and the one drawn moves monotonically down that
 * order as top_p or the uniform grows, so every token whose logit lies
 * between those drawn at the corners of the box is drawn somewhere in it. */
static int acceptable(int32_t got, const float *x, int V, const float *p, char *scratch) {
    const double delta = 1e-4;
    if (p[2] < 1.0f && p[0] > 0) {
        float lo = INFINITY, hi = -INFINITY;
        for (int a = -1; a <= 1; a += 2)
            for (int b = -1; b <= 1; b += 2) {
                double top_p = fmin(p[2] + a * delta, 1.0 - 1e-9), u = p[3] + b * delta;
                u = u < 0 ? 0 : u >= 1 ? 1 - 1e-9 : u;
                uint32_t t = gpc_sample_select(x, V, p[0], (int)p[1], (float)top_p, u, scratch);
                if (t < (uint32_t)V) lo = fminf(lo, x[t]), hi = fmaxf(hi, x[t]);
            }
        if (x[got] >= lo && x[got] <= hi) return 1;
    }
    for (int a = -1; a <= 1; a++)
        for (int b = -1; b <= 1; b++) {
            double top_p = p[2] + a * delta, u = p[3] + b * delta;
            /* top_p 1 orders by id, so stay on the side of 1 given */
            if (a != 0 && (p[2] >= 1.0f || top_p >= 1.0)) continue;
            if (u < 0) u = 0;
            if (u >= 1) u = 1 - 1e-9;
            if ((uint32_t)got == gpc_sample_select(x, V, p[0], (int)p[1], (float)top_p, u, scratch))
                return 1;
        }
    return 0;
}

/* The inputs and output of gpc_op_sample on the GPU. */
typedef struct {
    gpc_tensor logits, params, tokens;
} sample_gpu;

/* Samples rows of logits (rows of ld floats, a vocabulary of V) with
 * params (4 a row) on the CPU into want, and on the GPU with the logits in
 * dtype; returns the GPU's tokens, malloc'd, and leaves its tensors in g. */
static int32_t *sample_both(gpc_dtype dtype, int rows, int ld, int V, float *logits, float *params,
                            int32_t *want, sample_gpu *g) {
    gpc_device cpu = gpc_cpu();
    gpc_tensor ct = gpc_tensor_1d(want, GPC_I32, cpu, rows);
    gpc_tensor cl = gpc_tensor_2d(logits, GPC_F32, cpu, rows, ld);
    gpc_tensor cp = gpc_tensor_2d(params, GPC_F32, cpu, rows, 4);
    TEST_OK(gpc_op_sample(&ct, &cl, V, &cp));
    const int64_t sl[2] = {rows, ld}, sp[2] = {rows, 4}, sn[1] = {rows};
    g->logits = test_gpu_tensor(dtype, 2, sl, logits);
    g->params = test_gpu_tensor(GPC_F32, 2, sp, params);
    g->tokens = test_gpu_tensor(GPC_I32, 1, sn, NULL);
    TEST_OK(gpc_op_sample(&g->tokens, &g->logits, V, &g->params));
    return test_gpu_download_i32(&g->tokens);
}

static void sample_gpu_free(sample_gpu *g) {
    gpc_tensor_free(&g->logits), gpc_tensor_free(&g->params), gpc_tensor_free(&g->tokens);
}

static void test_sample(void **state) {
    (void)state;
    enum { R = 96, V = 50257, VP = 50304, CASES = 12 };
    /* temperature, top_k, top_p */
    const float cases[CASES][3] = {
        {0, 0, 1},           {1, 0, 1},        {0.8f, 40, 1},   {1, 0, 0.9f},
        {0.7f, 1000, 0.95f}, {1.2f, 2000, 1},  {1, 1, 1},       {1, V, 0.5f},
        {1, 60000, 1},       {0.3f, 0, 0.99f}, {2.0f, 5, 0.3f}, {1, 0, 0.999f},
    };
    char *scratch = malloc((size_t)V * 8);
    for (int d = 0; d < 2; d++) {
        gpc_dtype dtype = dtypes[d];
        float *logits = malloc((size_t)R * VP * sizeof(float));
        float params[R * 4];
        for (int64_t i = 0; i < (int64_t)R * VP; i++)
            logits[i] = test_round_to(dtype, 3.0f * gpc_rng_normal(&rng));
        for (int r = 0; r < R; r++) {
            const float *c = cases[r % CASES];
            params[4 * r] = c[0], params[4 * r + 1] = c[1], params[4 * r + 2] = c[2];
            params[4 * r + 3] = r % 17 == 0   ? 0.0f
                                : r % 19 == 0 ? 0.99999994f
                                              : gpc_rng_uniform(&rng);
            /* a masked token (the stop token below min_tokens) in some rows */
            if (r % 5 == 0) logits[(int64_t)r * VP + 50256] = -INFINITY;
        }
        int32_t want[R];
        sample_gpu g;
        int32_t *got = sample_both(dtype, R, VP, V, logits, params, want, &g);
        TEST_OK(gpc_op_sample(&g.tokens, &g.logits, V, &g.params));
        int32_t *again = test_gpu_download_i32(&g.tokens);
        int exact = 0;
        for (int r = 0; r < R; r++) {
            const float *p = params + 4 * r;
            if (got[r] != again[r])
                fail_msg("sample (%s): row %d gave %d, then %d on the same input",
                         gpc_dtype_name(dtype), r, got[r], again[r]);
            if (got[r] == want[r]) {
                exact++;
                continue;
            }
            /* two tokens whose logits agree within rounding are the same
             * draw: at a nucleus's edge (top_p 0.999, a uniform next to 1)
             * their order decides which one the last unit of probability
             * lands on, and the two sides sum in different orders */
            const float *row = logits + (int64_t)r * VP;
            int tie = got[r] >= 0 && got[r] < V &&
                      fabsf(row[got[r]] - row[want[r]]) <= 1e-4f * fmaxf(1.0f, fabsf(row[want[r]]));
            if (got[r] < 0 || got[r] >= V ||
                (!tie && !acceptable(got[r], logits + (int64_t)r * VP, V, p, scratch)))
                fail_msg("sample (%s): row %d (temperature %g, top_k %g, top_p %g, uniform %.9g):"
                         " GPU token %d, CPU token %d (logits %g and %g), and no uniform or top_p "
                         "within 1e-4 gives the GPU's",
                         gpc_dtype_name(dtype), r, (double)p[0], (double)p[1], (double)p[2],
                         (double)p[3], got[r], want[r],
                         got[r] >= 0 && got[r] < V ? (double)logits[(int64_t)r * VP + got[r]] : NAN,
                         (double)logits[(int64_t)r * VP + want[r]]);
        }
        printf("  sample (%s): %d of %d rows give the CPU's token exactly\n", gpc_dtype_name(dtype),
               exact, R);
        /* a boundary within 1e-4 of most uniforms would mean a real bug */
        if (exact < R - 4)
            fail_msg("sample (%s): only %d of %d rows agree exactly", gpc_dtype_name(dtype), exact,
                     R);
        sample_gpu_free(&g);
        free(logits), free(got), free(again);
    }
    free(scratch);
}

/* forbid_tokens: -inf at each row's token, rows of -1 (and, on the GPU,
 * of a token past the row) unchanged; everything else exactly as it was. */
/* Greedy rows on logits full of ties (a handful of values), the largest
 * repeated at random ids: the GPU must give the CPU's token, the smallest
 * id of the largest logit, exactly. Row lengths and vocabularies that
 * leave some rows off a 16-byte boundary (read one logit at a time) and
 * some ids past the last whole pack, for every dtype. */
static void test_sample_greedy_ties(void **state) {
    (void)state;
    const struct { int V, ld; } shapes[] = {{50257, 50304}, {1001, 1003}, {8, 8}, {37, 40}, {3, 5}};
    enum { R = 23 };
    for (int d = 0; d < 3; d++)
        for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
            const gpc_dtype dtype = dtypes[d];
            const int V = shapes[c].V, ld = shapes[c].ld;
            float *logits = malloc((size_t)R * ld * sizeof(float));
            float params[R * 4];
            for (int r = 0; r < R; r++) {
                float *row = logits + (int64_t)r * ld;
                for (int i = 0; i < ld; i++)
                    row[i] = test_round_to(dtype, (float)below(5) - 2.0f);
                /* the largest, 3, at one to four ids (the first pass may miss) */
                int copies = 1 + below(4);
                for (int k = 0; k < copies; k++)
                    row[below(V)] = 3.0f;
                if (r % 7 == 0) row[V - 1] = 3.0f;       /* in the tail */
                if (r % 7 == 0 && ld > V) row[V] = 9.0f; /* padding: never a token */
                params[4 * r] = 0.0f, params[4 * r + 1] = 0.0f, params[4 * r + 2] = 1.0f;
                params[4 * r + 3] = gpc_rng_uniform(&rng);
            }
            int32_t want[R];
            sample_gpu g;
            int32_t *got = sample_both(dtype, R, ld, V, logits, params, want, &g);
            for (int r = 0; r < R; r++) {
                int first = 0;
                while (logits[(int64_t)r * ld + first] != 3.0f)
                    first++;
                if (want[r] != first || got[r] != first)
                    fail_msg("greedy ties (%s, V %d, rows of %d): row %d gave %d on the GPU, %d "
                             "on the CPU; the first largest is %d",
                             gpc_dtype_name(dtype), V, ld, r, got[r], want[r], first);
            }
            sample_gpu_free(&g);
            free(logits), free(got);
        }
}

static void test_forbid_tokens(void **state) {
    (void)state;
    enum { R = 37, VP = 320 };
    for (int d = 0; d < 3; d++) {
        gpc_dtype dtype = dtypes[d];
        float *logits = malloc((size_t)R * VP * sizeof(float));
        int32_t forbid[R];
        for (int64_t i = 0; i < (int64_t)R * VP; i++)
            logits[i] = test_round_to(dtype, gpc_rng_normal(&rng));
        for (int r = 0; r < R; r++)
            forbid[r] = r % 7 == 3 ? -1 : r % 11 == 5 ? VP : (int32_t)gpc_rng_below(&rng, VP);
        const int64_t sl[2] = {R, VP}, sn[1] = {R};
        gpc_tensor gl = test_gpu_tensor(dtype, 2, sl, logits);
        gpc_tensor gf = test_gpu_tensor(GPC_I32, 1, sn, forbid);
        TEST_OK(gpc_op_forbid_tokens(&gl, &gf));
        float *got = test_gpu_download(&gl);
        for (int r = 0; r < R; r++)
            for (int v = 0; v < VP; v++) {
                float want = v == forbid[r] ? -INFINITY : logits[(int64_t)r * VP + v];
                if (got[(int64_t)r * VP + v] != want)
                    fail_msg("forbid_tokens (%s): row %d (token %d) column %d is %g, not %g",
                             gpc_dtype_name(dtype), r, forbid[r], v,
                             (double)got[(int64_t)r * VP + v], (double)want);
            }
        gpc_tensor_free(&gl), gpc_tensor_free(&gf);
        free(logits), free(got);
    }
}

/* feed_tokens on the GPU gives the CPU op's tokens; an entry past the
 * previous step's tokens, which the CPU refuses, leaves its row as it is. */
static void test_feed_tokens(void **state) {
    (void)state;
    enum { N = 300, R = 37 };
    int32_t tokens[N], feed[N], previous[R], want[N], got[N];
    for (int r = 0; r < R; r++)
        previous[r] = (int32_t)gpc_rng_below(&rng, 50257);
    for (int i = 0; i < N; i++) {
        tokens[i] = (int32_t)gpc_rng_below(&rng, 50257);
        feed[i] = i % 4 == 1 ? -1 : (int32_t)gpc_rng_below(&rng, R);
    }
    memcpy(want, tokens, sizeof want);
    gpc_tensor ct = gpc_tensor_1d(want, GPC_I32, gpc_cpu(), N);
    gpc_tensor cf = gpc_tensor_1d(feed, GPC_I32, gpc_cpu(), N);
    gpc_tensor cp = gpc_tensor_1d(previous, GPC_I32, gpc_cpu(), R);
    TEST_OK(gpc_op_feed_tokens(&ct, &cf, &cp));
    /* rows the CPU would refuse: the GPU keeps their tokens */
    for (int i = 7; i < N; i += 50) {
        feed[i] = R + i;
        want[i] = tokens[i];
    }
    const int64_t sn[1] = {N}, sr[1] = {R};
    gpc_tensor gt = test_gpu_tensor(GPC_I32, 1, sn, tokens);
    gpc_tensor gf = test_gpu_tensor(GPC_I32, 1, sn, feed);
    gpc_tensor gp = test_gpu_tensor(GPC_I32, 1, sr, previous);
    TEST_OK(gpc_op_feed_tokens(&gt, &gf, &gp));
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(cudaMemcpy(got, gt.data, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < N; i++)
        if (got[i] != want[i])
            fail_msg("feed_tokens: row %d (feed %d) has token %d, not %d", i, feed[i], got[i],
                     want[i]);
    gpc_tensor_free(&gt), gpc_tensor_free(&gf), gpc_tensor_free(&gp);
}

int main(void) {
    if (!gpc_backend_get(GPC_DEVICE_CUDA)) {
        fprintf(stderr, "skipped: %s\n", gpc_last_error());
        return 77;
    }
    gpc_rng_seed(&rng, test_seed(), 37);
    if (gpc_setting_given("GPC_TEST_FILTER"))
        cmocka_set_test_filter(gpc_setting_given("GPC_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paged_attention),
        cmocka_unit_test(test_paged_attention_bad_tables),
        cmocka_unit_test(test_paged_kernels),
        cmocka_unit_test(test_paged_split_merge),
        cmocka_unit_test(test_sample_greedy_ties),
        cmocka_unit_test(test_kv_store),
        cmocka_unit_test(test_embedding_at),
        cmocka_unit_test(test_sample),
        cmocka_unit_test(test_forbid_tokens),
        cmocka_unit_test(test_feed_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
