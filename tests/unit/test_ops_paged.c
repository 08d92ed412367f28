/*
 * test_ops_paged.c: the serving ops on the CPU (ops.h, "serving") against a
 * float64 reference computed on contiguous sequences: sequences of random
 * lengths, their positions scattered over shuffled cache blocks, queries at
 * random positions; and the errors a bad block table or slot gives.
 */
#include "testutil.h"

#include "ops/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static gpc_rng rng;

static int setup(void **state) {
    (void)state;
    gpc_rng_seed(&rng, test_seed(), 23);
    return 0;
}

static int32_t below(int32_t n) {
    return (int32_t)gpc_rng_below(&rng, (uint32_t)n);
}

/* Causal attention of query q (one head's hs floats) over keys and values
 * 0..pos of a contiguous sequence seq_qkv [len, 3C]. */
static void ref_row(double *out, const float *q, const float *seq_qkv, int64_t pos, int64_t C,
                    int64_t h, int64_t hs) {
    double *s = malloc((size_t)(pos + 1) * sizeof(double)), max = -INFINITY, sum = 0;
    for (int64_t j = 0; j <= pos; j++) {
        const float *k = seq_qkv + j * 3 * C + C + h * hs;
        double dot = 0;
        for (int64_t d = 0; d < hs; d++)
            dot += (double)q[d] * k[d];
        s[j] = dot / sqrt((double)hs);
        if (s[j] > max) max = s[j];
    }
    for (int64_t j = 0; j <= pos; j++)
        sum += exp(s[j] - max);
    for (int64_t d = 0; d < hs; d++)
        out[d] = 0;
    for (int64_t j = 0; j <= pos; j++) {
        const float *v = seq_qkv + j * 3 * C + 2 * C + h * hs;
        for (int64_t d = 0; d < hs; d++)
            out[d] += exp(s[j] - max) / sum * v[d];
    }
    free(s);
}

static void test_paged_attention(void **state) {
    (void)state;
    const int64_t S = 5, NH = 3, hs = 8, C = NH * hs, block = 4, max_blocks = 6;
    const int64_t num_blocks = S * max_blocks + 3;
    int64_t len[5], total = 0;
    for (int64_t s = 0; s < S; s++)
        total += len[s] = 1 + below((int32_t)(max_blocks * block));
    /* every position of every sequence, as rows of one step */
    float *qkv = malloc((size_t)(total * 3 * C) * sizeof(float));
    gpc_rng_fill_normal(&rng, qkv, (size_t)(total * 3 * C), 0.0f, 1.0f);
    /* blocks handed out in a shuffled order */
    int32_t *perm = malloc((size_t)num_blocks * sizeof(int32_t));
    for (int64_t i = 0; i < num_blocks; i++)
        perm[i] = (int32_t)i;
    for (int64_t i = num_blocks - 1; i > 0; i--) {
        int32_t j = below((int32_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int32_t tables[5 * 6], *seq = malloc((size_t)total * 4), *pos = malloc((size_t)total * 4);
    int32_t *slots = malloc((size_t)total * 4);
    int64_t next = 0, row = 0;
    for (int64_t s = 0; s < S; s++) {
        for (int64_t b = 0; b < max_blocks; b++)
            tables[s * max_blocks + b] = b * block < len[s] ? perm[next++] : -1;
        for (int64_t p = 0; p < len[s]; p++, row++) {
            seq[row] = (int32_t)s, pos[row] = (int32_t)p;
            slots[row] = (int32_t)(tables[s * max_blocks + p / block] * block + p % block);
        }
    }
    float *kc = calloc((size_t)(num_blocks * block * C), sizeof(float));
    float *vc = calloc((size_t)(num_blocks * block * C), sizeof(float));
    gpc_device cpu = gpc_cpu();
    gpc_tensor tqkv = gpc_tensor_2d(qkv, GPC_F32, cpu, total, 3 * C);
    gpc_tensor tk = gpc_tensor_3d(kc, GPC_F32, cpu, num_blocks, block, C);
    gpc_tensor tv = gpc_tensor_3d(vc, GPC_F32, cpu, num_blocks, block, C);
    gpc_tensor tslots = gpc_tensor_1d(slots, GPC_I32, cpu, total);
    TEST_OK(gpc_op_kv_store(&tk, &tv, &tqkv, &tslots));

    /* the queries: every row, in a shuffled order, as one step */
    int32_t *order = malloc((size_t)total * 4), *qseq = malloc((size_t)total * 4);
    int32_t *qpos = malloc((size_t)total * 4);
    for (int64_t i = 0; i < total; i++)
        order[i] = (int32_t)i;
    for (int64_t i = total - 1; i > 0; i--) {
        int32_t j = below((int32_t)(i + 1)), t = order[i];
        order[i] = order[j], order[j] = t;
    }
    float *q = malloc((size_t)(total * 3 * C) * sizeof(float));
    for (int64_t i = 0; i < total; i++) {
        memcpy(q + i * 3 * C, qkv + (int64_t)order[i] * 3 * C, (size_t)(3 * C) * sizeof(float));
        qseq[i] = seq[order[i]], qpos[i] = pos[order[i]];
    }
    float *out = malloc((size_t)(total * C) * sizeof(float));
    double *want = malloc((size_t)(total * C) * sizeof(double));
    int64_t first[5] = {0};
    for (int64_t s = 1; s < S; s++)
        first[s] = first[s - 1] + len[s - 1];
    for (int64_t i = 0; i < total; i++)
        for (int64_t h = 0; h < NH; h++)
            ref_row(want + i * C + h * hs, q + i * 3 * C + h * hs, qkv + first[qseq[i]] * 3 * C,
                    qpos[i], C, h, hs);
    gpc_tensor tq = gpc_tensor_2d(q, GPC_F32, cpu, total, 3 * C);
    gpc_tensor tout = gpc_tensor_2d(out, GPC_F32, cpu, total, C);
    gpc_tensor ttab = gpc_tensor_2d(tables, GPC_I32, cpu, S, max_blocks);
    gpc_tensor tseq = gpc_tensor_1d(qseq, GPC_I32, cpu, total);
    gpc_tensor tpos = gpc_tensor_1d(qpos, GPC_I32, cpu, total);
    TEST_OK(gpc_op_paged_attention(&tout, &tq, &tk, &tv, &ttab, &tseq, &tpos, (int)NH));
    /* outputs are weighted means of unit normals: 1e-5 absolute is f32
     * summation over up to 24 keys with room to spare */
    test_assert_close("paged attention", out, want, (size_t)(total * C), 1e-5, 1.0);

    /* a block table entry past the cache, and a slot past it */
    int32_t saved = tables[0];
    tables[0] = (int32_t)num_blocks;
    qseq[0] = 0, qpos[0] = 0;
    TEST_FAILS(gpc_op_paged_attention(&tout, &tq, &tk, &tv, &ttab, &tseq, &tpos, (int)NH),
               GPC_ERR_INVALID_ARG, "block 0 of sequence 0");
    tables[0] = saved;
    slots[0] = (int32_t)(num_blocks * block);
    TEST_FAILS(gpc_op_kv_store(&tk, &tv, &tqkv, &tslots), GPC_ERR_INVALID_ARG, "slot");
    free(qkv), free(perm), free(seq), free(pos), free(slots), free(kc), free(vc), free(order);
    free(qseq), free(qpos), free(q), free(out), free(want);
}

static void test_embedding_at(void **state) {
    (void)state;
    const int64_t V = 11, C = 6, maxT = 9, N = 17;
    float *wte = malloc((size_t)(V * C) * sizeof(float)), *wpe = malloc((size_t)(maxT * C) * 4);
    gpc_rng_fill_normal(&rng, wte, (size_t)(V * C), 0.0f, 1.0f);
    gpc_rng_fill_normal(&rng, wpe, (size_t)(maxT * C), 0.0f, 1.0f);
    int32_t tok[17], pos[17];
    float out[17 * 6];
    for (int64_t i = 0; i < N; i++)
        tok[i] = below((int32_t)V), pos[i] = below((int32_t)maxT);
    gpc_device cpu = gpc_cpu();
    gpc_tensor tout = gpc_tensor_2d(out, GPC_F32, cpu, N, C);
    gpc_tensor ttok = gpc_tensor_1d(tok, GPC_I32, cpu, N),
               tpos = gpc_tensor_1d(pos, GPC_I32, cpu, N);
    gpc_tensor twte = gpc_tensor_2d(wte, GPC_F32, cpu, V, C);
    gpc_tensor twpe = gpc_tensor_2d(wpe, GPC_F32, cpu, maxT, C);
    TEST_OK(gpc_op_embedding_at(&tout, &ttok, &tpos, &twte, &twpe));
    for (int64_t i = 0; i < N; i++)
        for (int64_t c = 0; c < C; c++)
            assert_true(out[i * C + c] == wte[tok[i] * C + c] + wpe[pos[i] * C + c]);
    pos[3] = (int32_t)maxT;
    TEST_FAILS(gpc_op_embedding_at(&tout, &ttok, &tpos, &twte, &twpe), GPC_ERR_INVALID_ARG,
               "position 9 of row 3");
    free(wte), free(wpe);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paged_attention),
        cmocka_unit_test(test_embedding_at),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
