/*
 * test_paged_graphs.c: the graph switch of the paged step on the CPU, which
 * captures no graphs: gpt_paged_options.eager on and off give the same
 * logits and tokens bit for bit over decode steps of 1, 3, 16 and 17 rows, and
 * nothing is captured; the backend's graph calls say the CPU has none; the
 * queued copy copies. Likewise the fused decode products of steps of up to
 * 16 rows against the unfused ops (GPC_DECODE_FUSED_MAX_M=0): the CPU's
 * fused op runs the same kernels, so the same bits.
 */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "gpc/model.h"
#include "model/gpt_internal.h"

enum { VOCAB = 97, BS = 4, SEQS = 17, PER_SEQ = 4, BLOCKS = SEQS * PER_SEQ + 3 };

static void test_cpu_has_no_graphs(void **state) {
    (void)state;
    assert_int_equal(gpc_graph_supported(gpc_cpu()), 0);
    TEST_FAILS(gpc_graph_capture_begin(gpc_cpu()), GPC_ERR_UNSUPPORTED, "captures no graphs");
    gpc_graph graph = (gpc_graph)1;
    TEST_FAILS(gpc_graph_capture_end(gpc_cpu(), &graph), GPC_ERR_UNSUPPORTED, "captures no graphs");
    assert_null(graph);
    TEST_FAILS(gpc_graph_launch(gpc_cpu(), NULL), GPC_ERR_UNSUPPORTED, "captures no graphs");
    gpc_graph_destroy(gpc_cpu(), NULL); /* nothing to do, and no crash */
    int32_t src[5] = {1, -2, 3, 40000, 5}, dst[5] = {0};
    gpc_tensor s = gpc_tensor_1d(src, GPC_I32, gpc_cpu(), 5),
               d = gpc_tensor_1d(dst, GPC_I32, gpc_cpu(), 5);
    TEST_OK(gpc_tensor_copy_async(&d, &s));
    assert_memory_equal(dst, src, sizeof src);
    gpc_tensor short_dst = gpc_tensor_1d(dst, GPC_I32, gpc_cpu(), 4);
    TEST_FAILS(gpc_tensor_copy_async(&short_dst, &s), GPC_ERR_MISMATCH, "sizes or dtypes differ");
}

typedef struct {
    int32_t tokens[PER_SEQ * BS];
    int len;
} sequence;

/* Steps of 1, 3, 16 and 17 rows on two caches of one model, the second eager
 * (eager) or without the fused decode products (unfused): the same logits
 * and tokens, bit for bit. */
static void two_caches_agree(int eager, int unfused) {
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 41);
    gpt_model *m = test_make_serving_model(gpc_cpu(), GPC_F32, 2, 2, 32, PER_SEQ * BS, VOCAB, 99);
    gpt_paged_options po = test_paged_options(BLOCKS, BS, SEQS, 64);
    gpt_paged *on = NULL, *off = NULL;
    setenv("GPC_DECODE_FUSED_MAX_M", "16", 1); /* the fused products, opt-in */
    gpc_status made = gpt_paged_create(&on, m, &po);
    unsetenv("GPC_DECODE_FUSED_MAX_M");
    TEST_OK(made);
    po.eager = eager;
    setenv("GPC_DECODE_FUSED_MAX_M", unfused ? "0" : "16", 1);
    gpc_status created = gpt_paged_create(&off, m, &po);
    unsetenv("GPC_DECODE_FUSED_MAX_M");
    TEST_OK(created);
    int mb = gpt_paged_max_blocks(on);
    sequence seqs[SEQS];
    int32_t tables[SEQS * PER_SEQ];
    assert_int_equal(mb, PER_SEQ);
    for (int s = 0; s < SEQS; s++) {
        seqs[s].len = 1;
        seqs[s].tokens[0] = (int32_t)gpc_rng_below(&rng, VOCAB);
        for (int b = 0; b < PER_SEQ; b++)
            tables[s * PER_SEQ + b] = BLOCKS - 1 - (s * PER_SEQ + b); /* any order */
    }
    static const int sizes[] = {1, 3, 17, 16, 3, 1, 17};
    float *la = malloc((size_t)SEQS * VOCAB * sizeof *la);
    float *lb = malloc((size_t)SEQS * VOCAB * sizeof *lb);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int n = sizes[k];
        int32_t tok[SEQS], pos[SEQS], seq[SEQS], slot[SEQS], a[SEQS], b[SEQS];
        gpt_paged_sampling rows[SEQS];
        int32_t step_tables[SEQS * PER_SEQ];
        for (int j = 0; j < n; j++) {
            const sequence *s = &seqs[j];
            int p = s->len - 1;
            tok[j] = s->tokens[p], pos[j] = p, seq[j] = j;
            slot[j] = tables[j * PER_SEQ + p / BS] * BS + p % BS;
            memcpy(step_tables + j * PER_SEQ, tables + j * PER_SEQ, PER_SEQ * sizeof *tables);
            rows[j] =
                (gpt_paged_sampling){j % 2 ? 0.8f : 0.0f, 0.0f, 1.0f, gpc_rng_uniform(&rng), -1};
        }
        gpt_paged_batch batch = {n, tok, pos, seq, slot, n, step_tables, n, NULL};
        TEST_OK(gpt_step_paged(on, &batch, la));
        TEST_OK(gpt_step_paged(off, &batch, lb));
        assert_memory_equal(la, lb, (size_t)n * VOCAB * sizeof *la);
        TEST_OK(gpt_step_paged_sample(on, &batch, rows, a));
        TEST_OK(gpt_step_paged_sample(off, &batch, rows, b));
        assert_memory_equal(a, b, (size_t)n * sizeof *a);
        for (int j = 0; j < n; j++) {
            assert_true(a[j] >= 0 && a[j] < VOCAB);
            seqs[j].tokens[seqs[j].len++] = a[j];
        }
    }
    assert_int_equal(gpt_paged_graph_count(on), 0);
    assert_int_equal(gpt_paged_graph_count(off), 0);
    free(la), free(lb);
    gpt_paged_free(on);
    gpt_paged_free(off);
    gpt_free(m);
}

static void test_eager_switch_changes_nothing(void **state) {
    (void)state;
    two_caches_agree(1, 0);
}

static void test_fused_products_change_nothing(void **state) {
    (void)state;
    two_caches_agree(0, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_has_no_graphs),
        cmocka_unit_test(test_eager_switch_changes_nothing),
        cmocka_unit_test(test_fused_products_change_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
