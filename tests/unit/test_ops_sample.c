/*
 * test_ops_sample.c: the sampling op on the CPU (gpc_op_sample in ops.h).
 * Hand-worked rows check the rule's order (ties by id, the ids' order
 * without filters), greedy and top-p; random rows check that the op draws
 * exactly the token gpc_sample_token draws from the same generator; and bad
 * parameters get an error naming the row. The serving step's small
 * companions, forbid_tokens and feed_tokens, are checked here too.
 */
#include "testutil.h"

#include "gpc/serve.h"
#include "ops/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static gpc_rng rng;

static int setup(void **state) {
    (void)state;
    gpc_rng_seed(&rng, test_seed(), 29);
    return 0;
}

/* The op on R rows of V logits with params [R, 4], into tokens. */
static gpc_status sample(int32_t *tokens, float *logits, int R, int V, int vocab_size,
                         float *params) {
    gpc_device cpu = gpc_cpu();
    gpc_tensor tt = gpc_tensor_1d(tokens, GPC_I32, cpu, R);
    gpc_tensor tl = gpc_tensor_2d(logits, GPC_F32, cpu, R, V);
    gpc_tensor tp = gpc_tensor_2d(params, GPC_F32, cpu, R, 4);
    return gpc_op_sample(&tt, &tl, vocab_size, &tp);
}

static void test_sample_by_hand(void **state) {
    (void)state;
    /* weights at temperature 1: e^-2, 1, 1, e^-1 (total 2.503) */
    float row[5] = {1.0f, 3.0f, 3.0f, 2.0f, 99.0f}; /* the last column is padding */
    enum { R = 7 };
    float logits[R * 5], params[R * 4] = {
                             0, 0, 1,    0.5f,   /* greedy: the first largest, id 1 */
                             1, 2, 1,    0.25f,  /* top-2: ids 1, 2 by id; 0.25 of 2 -> id 1 */
                             1, 2, 1,    0.75f,  /* 0.75 -> id 2 */
                             1, 0, 1,    0.0f,   /* no filter: ids in order, 0 first */
                             1, 0, 1,    0.999f, /* ... and 3 last */
                             1, 0, 0.3f, 0.9f,   /* top-p 0.3 of 2.503: id 1 alone */
                             1, 0, 0.9f, 0.99f   /* 0.9: ids 1, 2, 3 (2.368); the top is 3 */
                         };
    for (int r = 0; r < R; r++)
        memcpy(logits + r * 5, row, sizeof row);
    int32_t tokens[R];
    const int32_t want[R] = {1, 1, 2, 0, 3, 1, 3};
    TEST_OK(sample(tokens, logits, R, 5, 4, params));
    for (int r = 0; r < R; r++)
        if (tokens[r] != want[r])
            fail_msg("row %d (temperature %g, top_k %g, top_p %g, uniform %g): token %d, want %d",
                     r, (double)params[4 * r], (double)params[4 * r + 1], (double)params[4 * r + 2],
                     (double)params[4 * r + 3], tokens[r], want[r]);
}

/* The op against gpc_sample_token on the same generator: the op gets the
 * uniform gpc_sample_token will draw, rounded down to f32; the two agree
 * unless a boundary between tokens lies in that rounding (checked with
 * gpc_sample_select, and then skipped). */
static void test_sample_matches_sample_token(void **state) {
    (void)state;
    enum { R = 48, V = 997, VP = 1003, CASES = 8 };
    const float temps[CASES] = {0.0f, 1.0f, 0.7f, 1.5f, 1.0f, 0.8f, 1.0f, 0.5f};
    const int ks[CASES] = {0, 0, 40, 1, 0, 50, 2000, 997};
    const float ps[CASES] = {1.0f, 1.0f, 1.0f, 1.0f, 0.9f, 0.5f, 0.95f, 0.2f};
    float *logits = malloc((size_t)R * VP * sizeof(float));
    float params[R * 4];
    int32_t tokens[R];
    char *scratch = malloc((size_t)V * 8);
    int skipped = 0;
    for (int c = 0; c < CASES; c++) {
        for (int64_t i = 0; i < (int64_t)R * VP; i++) {
            /* coarse values, so that equal logits (ties) are common */
            logits[i] = roundf(8.0f * gpc_rng_normal(&rng)) / 4.0f;
        }
        gpc_rng streams[R];
        for (int r = 0; r < R; r++) {
            gpc_rng_seed(&streams[r], test_seed() + (uint64_t)c, (uint64_t)r);
            gpc_rng copy = streams[r];
            double u = temps[c] > 0 ? gpc_rng_uniform64(&copy) : 0.0;
            float f = (float)u;
            if ((double)f > u) f = nextafterf(f, 0.0f);
            params[4 * r] = temps[c], params[4 * r + 1] = (float)ks[c];
            params[4 * r + 2] = ps[c], params[4 * r + 3] = f;
        }
        TEST_OK(sample(tokens, logits, R, VP, V, params));
        for (int r = 0; r < R; r++) {
            const float *x = logits + (int64_t)r * VP;
            gpc_rng copy = streams[r];
            double u = temps[c] > 0 ? gpc_rng_uniform64(&copy) : 0.0;
            uint32_t want = gpc_sample_token(x, V, temps[c], ks[c], ps[c], &streams[r], scratch);
            if ((uint32_t)tokens[r] == want) continue;
            if (gpc_sample_select(x, V, temps[c], ks[c], ps[c], u, scratch) !=
                gpc_sample_select(x, V, temps[c], ks[c], ps[c], (double)params[4 * r + 3],
                                  scratch)) {
                skipped++;
                continue;
            }
            fail_msg("case %d row %d (temperature %g, top_k %d, top_p %g, uniform %.9g): the op "
                     "drew %d, gpc_sample_token %u",
                     c, r, (double)temps[c], ks[c], (double)ps[c], u, tokens[r], want);
        }
    }
    /* a boundary within 2^-24 of a uniform: about one draw in ten million */
    assert_true(skipped <= 1);
    free(logits), free(scratch);
}

static void test_sample_errors(void **state) {
    (void)state;
    float logits[2 * 3] = {0, 1, 2, 3, 4, 5};
    float good[8] = {1, 0, 1, 0.5f, 0, 0, 1, 0};
    int32_t tokens[2];
    TEST_OK(sample(tokens, logits, 2, 3, 3, good));
    assert_int_equal(tokens[1], 2); /* greedy */
    TEST_FAILS(sample(tokens, logits, 2, 3, 4, good), GPC_ERR_INVALID_ARG, "vocab_size 4");
    struct {
        int at;
        float value;
        const char *needle;
    } bad[] = {
        {4, -1.0f, "row 1 has temperature -1"}, {5, 1.5f, "row 1 has top_k 1.5"},
        {6, 0.0f, "row 1 has top_p 0"},         {6, NAN, "row 1 has top_p nan"},
        {7, 1.0f, "row 1 has uniform 1"},       {3, -0.5f, "row 0 has uniform -0.5"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        float p[8];
        memcpy(p, good, sizeof p);
        p[bad[i].at] = bad[i].value;
        TEST_FAILS(sample(tokens, logits, 2, 3, 3, p), GPC_ERR_INVALID_ARG, bad[i].needle);
    }
    gpc_device cpu = gpc_cpu();
    gpc_tensor tt = gpc_tensor_1d(tokens, GPC_I32, cpu, 2);
    gpc_tensor tl = gpc_tensor_2d(logits, GPC_F32, cpu, 2, 3);
    gpc_tensor tp = gpc_tensor_2d(good, GPC_F32, cpu, 1, 4);
    TEST_FAILS(gpc_op_sample(&tt, &tl, 3, &tp), GPC_ERR_MISMATCH, "params");
}

/* forbid_tokens puts -inf at the given token of each row, leaves rows of
 * -1 alone, and names a row whose token is past the logits. */
static void test_forbid_tokens(void **state) {
    (void)state;
    float logits[3 * 4] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    int32_t forbid[3] = {3, -1, 0};
    gpc_device cpu = gpc_cpu();
    gpc_tensor tl = gpc_tensor_2d(logits, GPC_F32, cpu, 3, 4);
    gpc_tensor tf = gpc_tensor_1d(forbid, GPC_I32, cpu, 3);
    TEST_OK(gpc_op_forbid_tokens(&tl, &tf));
    const float want[12] = {0, 1, 2, -INFINITY, 4, 5, 6, 7, -INFINITY, 9, 10, 11};
    for (int i = 0; i < 12; i++)
        assert_true(logits[i] == want[i]);
    /* greedy now takes the best token left */
    float params[12] = {0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0};
    int32_t tokens[3];
    TEST_OK(sample(tokens, logits, 3, 4, 4, params));
    assert_int_equal(tokens[0], 2);
    assert_int_equal(tokens[1], 3);
    assert_int_equal(tokens[2], 3);
    forbid[1] = 4;
    TEST_FAILS(gpc_op_forbid_tokens(&tl, &tf), GPC_ERR_INVALID_ARG, "row 1 forbids token 4");
    gpc_tensor two = gpc_tensor_1d(forbid, GPC_I32, cpu, 2);
    TEST_FAILS(gpc_op_forbid_tokens(&tl, &two), GPC_ERR_MISMATCH, "tokens");
}

/* feed_tokens against the rule written out: rows with a feed entry take
 * that entry's previous token, the others keep theirs; an entry past the
 * previous tokens names its row. */
static void test_feed_tokens(void **state) {
    (void)state;
    enum { N = 64, R = 9 };
    int32_t tokens[N], want[N], feed[N], previous[R];
    for (int r = 0; r < R; r++)
        previous[r] = (int32_t)gpc_rng_below(&rng, 50000);
    for (int i = 0; i < N; i++) {
        tokens[i] = (int32_t)gpc_rng_below(&rng, 50000);
        feed[i] = i % 3 ? (int32_t)gpc_rng_below(&rng, R) : -1;
        want[i] = feed[i] >= 0 ? previous[feed[i]] : tokens[i];
    }
    gpc_device cpu = gpc_cpu();
    gpc_tensor tt = gpc_tensor_1d(tokens, GPC_I32, cpu, N);
    gpc_tensor tf = gpc_tensor_1d(feed, GPC_I32, cpu, N);
    gpc_tensor tp = gpc_tensor_1d(previous, GPC_I32, cpu, R);
    TEST_OK(gpc_op_feed_tokens(&tt, &tf, &tp));
    assert_memory_equal(tokens, want, sizeof want);
    feed[5] = R;
    TEST_FAILS(gpc_op_feed_tokens(&tt, &tf, &tp), GPC_ERR_INVALID_ARG,
               "row 5 takes token 9 of a step that drew 9");
    assert_memory_equal(tokens, want, sizeof want); /* checked before anything changed */
    gpc_tensor short_feed = gpc_tensor_1d(feed, GPC_I32, cpu, N - 1);
    TEST_FAILS(gpc_op_feed_tokens(&tt, &short_feed, &tp), GPC_ERR_MISMATCH, "feed");
    float f[N];
    gpc_tensor wrong = gpc_tensor_1d(f, GPC_F32, cpu, N);
    TEST_FAILS(gpc_op_feed_tokens(&wrong, &tf, &tp), GPC_ERR_MISMATCH, "tokens");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sample_by_hand), cmocka_unit_test(test_sample_matches_sample_token),
        cmocka_unit_test(test_sample_errors),  cmocka_unit_test(test_forbid_tokens),
        cmocka_unit_test(test_feed_tokens),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
