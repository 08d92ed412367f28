/*
 * test_vocab_parallel.c: the ops of tensor parallelism's vocabulary-parallel
 * head and embedding (ops.h), on the CPU, with the ranks' reductions done
 * here on the host.
 *
 * Cross-entropy: random logits [N, Vp] are cut into T column slices; each
 * slice runs crossentropy_slice_max, the maxima are reduced (max), each runs
 * crossentropy_slice_sums, the sums are reduced (sum), and each runs
 * crossentropy_slice_finish. Every slice's losses and the slices' dlogits
 * put side by side must equal the full cross-entropy computed in float64
 * from the same logits: within 2e-6 relative (losses, floor 1e-3) and 1e-5
 * relative (dlogits, floor 1e-6 x dloss). The slices round the sum of
 * exponentials to f32 once per slice and once after the reduction, and
 * exp in f32, a few ulps each; a wrong slice offset, a missing reduction or
 * a target taken from the wrong slice is off by 1e-2 or more. Targets fall
 * in every slice, some rows are masked (-1), the padded columns hold junk
 * that must be ignored, one case has a slice of padding only and one has
 * slices that do not divide the padded vocabulary (the last runs past it).
 *
 * Embedding: the slices' outputs (wpe added on slice 0 only) summed equal
 * gpc_op_embedding_forward's bit for bit (the other slices add zeros), and
 * the slices' wte gradients side by side equal gpc_op_embedding_backward's,
 * with the same dwpe on every slice.
 */
#include "testutil.h"

#include "ops/ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static gpc_rng rng;

static int setup(void **state) {
    (void)state;
    gpc_rng_seed(&rng, test_seed(), 37);
    return 0;
}

static float *randn(int64_t n, float stddev) {
    float *p = malloc((size_t)n * sizeof(float));
    gpc_rng_fill_normal(&rng, p, (size_t)n, 0.0f, stddev);
    return p;
}

/* A target for row n: -1 for every seventh row, otherwise a real column of
 * slice n % parts when it has one (so every slice with real columns gets
 * targets), else of the vocabulary. */
static int32_t pick_target(int64_t n, int parts, int64_t S, int64_t V) {
    if (n % 7 == 3) return -1;
    int64_t col0 = (n % parts) * S, real = V - col0 < S ? V - col0 : S;
    if (real <= 0) return (int32_t)gpc_rng_below(&rng, (uint32_t)V);
    return (int32_t)(col0 + gpc_rng_below(&rng, (uint32_t)real));
}

/* One case: N rows, vocabulary V (padded to 64), cut into parts slices of
 * S columns (gpt_tp_vocab_rows), the last one running past Vp where parts
 * does not divide it. Vp here is the slices' columns together. */
static void check_crossentropy(int64_t N, int64_t V, int parts) {
    gpt_config c = {.padded_vocab = (int)((V + 63) / 64 * 64)};
    int64_t S = gpt_tp_vocab_rows(&c, parts), Vp = parts * S;
    float dloss = 1.0f / (float)N;
    float *logits = randn(N * Vp, 3.0f);
    int32_t *tg = malloc((size_t)N * sizeof *tg);
    int *hit = calloc((size_t)parts, sizeof *hit);
    for (int64_t n = 0; n < N; n++) {
        tg[n] = pick_target(n, parts, S, V);
        if (tg[n] >= 0) hit[tg[n] / S]++;
    }
    for (int r = 0; r < parts; r++)
        if (r * S < V && !hit[r]) fail_msg("slice %d got no target: the test is too small", r);

    /* float64 reference on the whole rows (real columns only) */
    double *want_loss = calloc((size_t)N, sizeof(double));
    double *want_d = calloc((size_t)(N * Vp), sizeof(double));
    for (int64_t n = 0; n < N; n++) {
        if (tg[n] < 0) continue;
        const float *x = logits + n * Vp;
        double m = x[0];
        for (int64_t j = 1; j < V; j++)
            m = x[j] > m ? x[j] : m;
        double sum = exp((double)x[0] - m);
        for (int64_t j = 1; j < V; j++)
            sum += exp((double)x[j] - m);
        want_loss[n] = m + log(sum) - x[tg[n]];
        for (int64_t j = 0; j < V; j++)
            want_d[n * Vp + j] = (exp((double)x[j] - m) / sum - (j == tg[n])) * dloss;
    }

    /* the slices, each a [N, S] tensor of its own, as a rank holds it */
    float **slice = malloc((size_t)parts * sizeof *slice),
          **stats = malloc((size_t)parts * sizeof *stats);
    float **dlog = malloc((size_t)parts * sizeof *dlog),
          **loss = malloc((size_t)parts * sizeof *loss);
    gpc_tensor ttg = gpc_tensor_1d(tg, GPC_I32, gpc_cpu(), N);
    for (int r = 0; r < parts; r++) {
        slice[r] = malloc((size_t)(N * S) * sizeof(float));
        for (int64_t n = 0; n < N; n++)
            memcpy(slice[r] + n * S, logits + n * Vp + r * S, (size_t)S * sizeof(float));
        stats[r] = malloc((size_t)(3 * N) * sizeof(float));
        dlog[r] = malloc((size_t)(N * S) * sizeof(float));
        loss[r] = malloc((size_t)N * sizeof(float));
        gpc_tensor tl = gpc_tensor_2d(slice[r], GPC_F32, gpc_cpu(), N, S);
        gpc_tensor ts = gpc_tensor_2d(stats[r], GPC_F32, gpc_cpu(), 3, N);
        TEST_OK(gpc_op_crossentropy_slice_max(&ts, &tl, r * S, (int)V));
    }
    for (int64_t n = 0; n < N; n++) { /* the max over the ranks */
        float m = -INFINITY;
        for (int r = 0; r < parts; r++)
            m = stats[r][n] > m ? stats[r][n] : m;
        for (int r = 0; r < parts; r++)
            stats[r][n] = m;
    }
    for (int r = 0; r < parts; r++) {
        gpc_tensor tl = gpc_tensor_2d(slice[r], GPC_F32, gpc_cpu(), N, S);
        gpc_tensor ts = gpc_tensor_2d(stats[r], GPC_F32, gpc_cpu(), 3, N);
        TEST_OK(gpc_op_crossentropy_slice_sums(&ts, &tl, &ttg, r * S, (int)V));
    }
    for (int64_t i = N; i < 3 * N; i++) { /* the sums over the ranks */
        float sum = 0.0f;
        for (int r = 0; r < parts; r++)
            sum += stats[r][i];
        for (int r = 0; r < parts; r++)
            stats[r][i] = sum;
    }
    float *got_d = malloc((size_t)(N * Vp) * sizeof(float));
    for (int r = 0; r < parts; r++) {
        gpc_tensor tl = gpc_tensor_2d(slice[r], GPC_F32, gpc_cpu(), N, S);
        gpc_tensor ts = gpc_tensor_2d(stats[r], GPC_F32, gpc_cpu(), 3, N);
        gpc_tensor tloss = gpc_tensor_1d(loss[r], GPC_F32, gpc_cpu(), N);
        /* the last slice in place, as the model runs it; the others apart */
        int in_place = r == parts - 1;
        gpc_tensor td = gpc_tensor_2d(in_place ? slice[r] : dlog[r], GPC_F32, gpc_cpu(), N, S);
        TEST_OK(
            gpc_op_crossentropy_slice_finish(&tloss, &td, &tl, &ttg, &ts, r * S, (int)V, dloss));
        for (int64_t n = 0; n < N; n++)
            memcpy(got_d + n * Vp + r * S, (float *)td.data + n * S, (size_t)S * sizeof(float));
        char what[64];
        snprintf(what, sizeof what, "slice %d of %d: losses", r, parts);
        /* a loss is m + log(sum) - x[target] in f32, terms near 10 here:
         * their rounding (up to about 1e-6) bounds a small loss's error,
         * so below 1 the bound is absolute */
        test_assert_close(what, loss[r], want_loss, (size_t)N, 2e-6, 1.0);
    }
    char what[64];
    snprintf(what, sizeof what, "%d slices: dlogits", parts);
    test_assert_close(what, got_d, want_d, (size_t)(N * Vp), 1e-5, 1e-6 * dloss);
    for (int64_t n = 0; n < N; n++) /* padded columns exactly zero */
        for (int64_t j = V; j < Vp; j++)
            if (got_d[n * Vp + j] != 0.0f)
                fail_msg("%d slices: padded column %lld of row %lld has gradient %g", parts,
                         (long long)j, (long long)n, (double)got_d[n * Vp + j]);
    /* and the whole-row op agrees on the same logits */
    float *whole_loss = malloc((size_t)N * sizeof(float));
    gpc_tensor tw = gpc_tensor_2d(logits, GPC_F32, gpc_cpu(), N, Vp);
    gpc_tensor twl = gpc_tensor_1d(whole_loss, GPC_F32, gpc_cpu(), N);
    TEST_OK(gpc_op_crossentropy_forward_backward(&twl, NULL, &tw, &ttg, (int)V, 1.0f));
    test_assert_close_f32("the whole-row op's losses", loss[0], whole_loss, (size_t)N, 2e-6, 1.0);

    for (int r = 0; r < parts; r++)
        free(slice[r]), free(stats[r]), free(dlog[r]), free(loss[r]);
    free(slice), free(stats), free(dlog), free(loss), free(got_d), free(whole_loss);
    free(logits), free(tg), free(hit), free(want_loss), free(want_d);
}

static void test_crossentropy_slices(void **state) {
    (void)state;
    for (int parts = 2; parts <= 4; parts *= 2) {
        int64_t N = 20 + (int64_t)gpc_rng_below(&rng, 30);
        /* every slice holds real columns: V above Vp - Vp/parts */
        int64_t V = 129 + (int64_t)gpc_rng_below(&rng, 60);
        check_crossentropy(N, V, parts);
    }
    /* 50 of 64 padded columns over 8 slices of 8: the last slice is all
     * padding (its max is -inf and adds nothing) */
    check_crossentropy(24, 50, 8);
    /* 3 slices of 24 columns over 100 of 128: the last runs past Vp */
    check_crossentropy(30, 100, 3);
    check_crossentropy(16, 100, 1); /* one slice: the whole row */
}

static void test_embedding_slices(void **state) {
    (void)state;
    int64_t B = 2, T = 5, C = 12, V = 64, maxT = 8, N = B * T;
    int parts = 4;
    int64_t S = V / parts;
    int32_t tok[10];
    for (int64_t i = 0; i < N; i++) /* every slice's tokens, some repeated */
        tok[i] = (int32_t)((i % parts) * S + gpc_rng_below(&rng, 3));
    float *wte = randn(V * C, 1), *wpe = randn(maxT * C, 1), *dout = randn(N * C, 1);
    gpc_tensor tt = gpc_tensor_2d(tok, GPC_I32, gpc_cpu(), B, T);
    gpc_tensor twpe = gpc_tensor_2d(wpe, GPC_F32, gpc_cpu(), maxT, C);
    float *want = malloc((size_t)(N * C) * sizeof(float));
    gpc_tensor tw = gpc_tensor_3d(want, GPC_F32, gpc_cpu(), B, T, C);
    gpc_tensor twte = gpc_tensor_2d(wte, GPC_F32, gpc_cpu(), V, C);
    TEST_OK(gpc_op_embedding_forward(&tw, &tt, &twte, &twpe));
    float *want_dwte = calloc((size_t)(V * C), sizeof(float));
    float *want_dwpe = calloc((size_t)(maxT * C), sizeof(float));
    gpc_tensor tdo = gpc_tensor_3d(dout, GPC_F32, gpc_cpu(), B, T, C);
    gpc_tensor twd = gpc_tensor_2d(want_dwte, GPC_F32, gpc_cpu(), V, C);
    gpc_tensor twpd = gpc_tensor_2d(want_dwpe, GPC_F32, gpc_cpu(), maxT, C);
    TEST_OK(gpc_op_embedding_backward(&twd, &twpd, &tdo, &tt));

    float *sum = calloc((size_t)(N * C), sizeof(float)),
          *out = malloc((size_t)(N * C) * sizeof(float));
    float *dwte = calloc((size_t)(S * C), sizeof(float)),
          *dwpe = malloc((size_t)(maxT * C) * sizeof(float));
    for (int r = 0; r < parts; r++) {
        gpc_tensor ts = gpc_tensor_2d(wte + r * S * C, GPC_F32, gpc_cpu(), S, C);
        gpc_tensor to = gpc_tensor_3d(out, GPC_F32, gpc_cpu(), B, T, C);
        TEST_OK(gpc_op_embedding_slice_forward(&to, &tt, &ts, r == 0 ? &twpe : NULL, r * S));
        for (int64_t i = 0; i < N * C; i++)
            sum[i] += out[i];
        memset(dwte, 0, (size_t)(S * C) * sizeof(float));
        memset(dwpe, 0, (size_t)(maxT * C) * sizeof(float));
        gpc_tensor tds = gpc_tensor_2d(dwte, GPC_F32, gpc_cpu(), S, C);
        gpc_tensor tdp = gpc_tensor_2d(dwpe, GPC_F32, gpc_cpu(), maxT, C);
        TEST_OK(gpc_op_embedding_slice_backward(&tds, &tdp, &tdo, &tt, r * S));
        assert_memory_equal(dwte, want_dwte + r * S * C, (size_t)(S * C) * sizeof(float));
        assert_memory_equal(dwpe, want_dwpe, (size_t)(maxT * C) * sizeof(float));
    }
    assert_memory_equal(sum, want, (size_t)(N * C) * sizeof(float));
    gpc_tensor ts = gpc_tensor_2d(wte, GPC_F32, gpc_cpu(), S, C);
    gpc_tensor to = gpc_tensor_3d(out, GPC_F32, gpc_cpu(), B, T, C);
    TEST_FAILS(gpc_op_embedding_slice_forward(&to, &tt, &ts, NULL, -1), GPC_ERR_INVALID_ARG,
               "first row -1 is negative");
    free(wte), free(wpe), free(dout), free(want), free(want_dwte), free(want_dwpe);
    free(sum), free(out), free(dwte), free(dwpe);
}

/* A tp that does not divide the padded vocabulary pads the last slice
 * further: the slices' rows cover the whole, the rows past it are zero in
 * the part and left out when the part is put back. */
static void test_tp_vocabulary_rows(void **state) {
    (void)state;
    gpt_config c;
    TEST_OK(gpt_config_init(&c, 2, 3, 48, 16, 50)); /* 3 heads; 50 tokens pad to 64 rows */
    TEST_OK(gpt_tp_check(&c, 3));
    assert_int_equal(gpt_tp_vocab_rows(&c, 1), 64);
    assert_int_equal(gpt_tp_vocab_rows(&c, 3), 24); /* ceil(64 / 3) = 22, to 8: 3 x 24 = 72 */
    size_t P = gpt_config_num_params(&c), Pl = gpt_tp_num_params(&c, 3);
    float *whole = randn((int64_t)P, 1), *back = calloc(P, sizeof(float));
    float *local = malloc(Pl * sizeof(float));
    for (int r = 0; r < 3; r++) {
        memset(local, 0x7f, Pl * sizeof(float)); /* junk where nothing is copied */
        gpt_tp_slice(&c, 3, r, whole, local);
        /* wte leads the layout: rows [24 r, 24 r + 24) of the whole's 64 */
        for (int64_t row = 0; row < 24; row++)
            for (int64_t k = 0; k < 48; k++) {
                int64_t at = 24 * r + row;
                float want = at < 64 ? whole[at * 48 + k] : 0.0f;
                if (local[row * 48 + k] != want)
                    fail_msg("slice %d: wte row %lld holds %g, not %g", r, (long long)row,
                             (double)local[row * 48 + k], (double)want);
            }
        gpt_tp_unslice(&c, 3, r, local, back);
    }
    assert_memory_equal(back, whole, P * sizeof(float));
    free(whole), free(back), free(local);
    /* a part holds Vl rows of wte: its layout is that much smaller */
    TEST_OK(gpt_config_init(&c, 2, 4, 32, 16, 97));
    size_t all = gpt_config_num_params(&c), part = gpt_tp_num_params(&c, 2);
    /* wte 128 x 32 halves; the blocks' sliced tensors halve; the rest stays */
    size_t blocks_sliced =
        2 * (size_t)(3 * 32 * 32 + 3 * 32 + 32 * 32 + 4 * 32 * 32 + 4 * 32 + 4 * 32 * 32);
    assert_int_equal(all - part, 128 * 32 / 2 + blocks_sliced / 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crossentropy_slices),
        cmocka_unit_test(test_embedding_slices),
        cmocka_unit_test(test_tp_vocabulary_rows),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
