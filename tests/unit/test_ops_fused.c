/*
 * test_ops_fused.c: the fused linear + GELU ops, the output head and the
 * plain sum on the CPU.
 *
 * The fused ops must give exactly what the two unfused ops give (the CPU
 * composes the same kernels, so bit for bit), and both must match a float64
 * loop of the formula: gelu(inp @ weight^T + bias) with the tanh GELU, and
 * dinp = gelu'(gelu_inp) * (dout @ weight), within 1e-5 relative to the
 * larger of |value| and 1 (the inputs are O(1), and a sum of O(1) terms that
 * cancels to near zero keeps f32's absolute error); dpre_bias, a column sum
 * of up to 64 rows of dinp, within 1e-5 of the sum of its terms' magnitudes
 * (seed 315 once took it to 1.08e-5 of its value). The sum must match a float64
 * sum. Bad inputs (aliased buffers, missing dinp, wrong shapes) are refused
 * with a message that names the problem.
 *
 * The output head (gpc_op_classifier) must give bit for bit what its three
 * ops give (matmul_forward, crossentropy_forward_backward in place,
 * matmul_backward), and match a float64 loop of the formula: softmax over
 * the first V of Vp columns, loss logsumexp - logit[target], dlogits
 * (softmax - onehot) * dloss, dinp = dlogits . weight, dweight +=
 * dlogits^T . inp, within 1e-5 relative to the larger of |value| and 0.1
 * (losses of about log V, gradients of about dloss). Its bad inputs are
 * refused before any output is touched.
 */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

static gpc_rng rng;

/* The derivative of GPT-2's GELU (test_gelu64) in float64. */
static double gelu_grad64(double x) {
    double u = sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
    double t = tanh(u);
    return 0.5 * (1.0 + t) +
           0.5 * x * (1.0 - t * t) * sqrt(2.0 / M_PI) * (1.0 + 3 * 0.044715 * x * x);
}

static void fused_case(int64_t N, int64_t C, int64_t OC, int with_bias) {
    float *x = test_random_floats(&rng, N * C, -1, 1);
    float *w = test_random_floats(&rng, OC * C, -0.5f, 0.5f);
    float *b = test_random_floats(&rng, OC, -1, 1);
    float *pre = malloc(N * OC * 4), *act = malloc(N * OC * 4);
    float *pre2 = malloc(N * OC * 4), *act2 = malloc(N * OC * 4);
    gpc_tensor tx = test_f32_2d(x, N, C), tw = test_f32_2d(w, OC, C), tb = test_f32_1d(b, OC);
    gpc_tensor tpre = test_f32_2d(pre, N, OC), tact = test_f32_2d(act, N, OC);
    gpc_tensor tpre2 = test_f32_2d(pre2, N, OC), tact2 = test_f32_2d(act2, N, OC);
    TEST_OK(gpc_op_matmul_gelu_forward(&tpre, &tact, &tx, &tw, with_bias ? &tb : NULL));
    TEST_OK(gpc_op_matmul_forward(&tpre2, &tx, &tw, with_bias ? &tb : NULL));
    TEST_OK(gpc_op_gelu_forward(&tact2, &tpre2));
    assert_memory_equal(pre, pre2, (size_t)(N * OC) * 4);
    assert_memory_equal(act, act2, (size_t)(N * OC) * 4);
    double *want_pre = malloc(N * OC * 8), *want_act = malloc(N * OC * 8);
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < OC; j++) {
            double s = with_bias ? b[j] : 0.0;
            for (int64_t c = 0; c < C; c++)
                s += (double)x[n * C + c] * w[j * C + c];
            want_pre[n * OC + j] = s;
            want_act[n * OC + j] = test_gelu64(s);
        }
    test_assert_close("matmul_gelu_forward out_pre", pre, want_pre, (size_t)(N * OC), 1e-5, 1.0);
    test_assert_close("matmul_gelu_forward out_gelu", act, want_act, (size_t)(N * OC), 1e-5, 1.0);

    /* backward of a layer C -> OC whose input was gelu(gin) */
    float *dout = test_random_floats(&rng, N * OC, -1, 1);
    float *gin = test_random_floats(&rng, N * C, -3, 3);
    float *dw = test_random_floats(&rng, OC * C, -1, 1), *db = test_random_floats(&rng, OC, -1, 1);
    float *dw2 = malloc(OC * C * 4), *db2 = malloc(OC * 4);
    memcpy(dw2, dw, OC * C * 4);
    memcpy(db2, db, OC * 4);
    float *dinp = malloc(N * C * 4), *dinp2 = malloc(N * C * 4);
    float *dpb = test_random_floats(&rng, C, -1, 1), *dpb2 = malloc(C * 4);
    memcpy(dpb2, dpb, C * 4);
    gpc_tensor tdpb = test_f32_1d(dpb, C), tdpb2 = test_f32_1d(dpb2, C);
    gpc_tensor tdout = test_f32_2d(dout, N, OC), tgin = test_f32_2d(gin, N, C);
    gpc_tensor tdw = test_f32_2d(dw, OC, C), tdb = test_f32_1d(db, OC);
    gpc_tensor tdw2 = test_f32_2d(dw2, OC, C), tdb2 = test_f32_1d(db2, OC);
    gpc_tensor tdinp = test_f32_2d(dinp, N, C), tdinp2 = test_f32_2d(dinp2, N, C);
    double *want_dinp = malloc(N * C * 8), *want_dw = malloc(OC * C * 8);
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            double s = 0;
            for (int64_t j = 0; j < OC; j++)
                s += (double)dout[n * OC + j] * w[j * C + c];
            want_dinp[n * C + c] = s * gelu_grad64(gin[n * C + c]);
        }
    for (int64_t j = 0; j < OC; j++)
        for (int64_t c = 0; c < C; c++) {
            double s = dw[j * C + c];
            for (int64_t n = 0; n < N; n++)
                s += (double)dout[n * OC + j] * x[n * C + c];
            want_dw[j * C + c] = s;
        }
    /* the gradient of the bias before the GELU: dpre_bias += column sums of
     * dinp; scale_dpb is the sum of its terms' magnitudes, which bounds the
     * f32 sum's rounding (N additions of values up to a few units can cancel
     * to well below them) */
    double *want_dpb = malloc(C * 8), *scale_dpb = malloc(C * 8);
    for (int64_t c = 0; c < C; c++) {
        want_dpb[c] = dpb[c];
        scale_dpb[c] = fabs(dpb[c]);
        for (int64_t n = 0; n < N; n++) {
            want_dpb[c] += want_dinp[n * C + c];
            scale_dpb[c] += fabs(want_dinp[n * C + c]);
        }
    }
    TEST_OK(gpc_op_matmul_backward_dgelu(&tdinp, &tdw, with_bias ? &tdb : NULL,
                                         with_bias ? &tdpb : NULL, &tdout, &tx, &tw, &tgin));
    TEST_OK(gpc_op_matmul_backward(&tdinp2, &tdw2, with_bias ? &tdb2 : NULL, &tdout, &tx, &tw));
    TEST_OK(gpc_op_gelu_backward(&tdinp2, &tgin, &tdinp2));
    if (with_bias) TEST_OK(gpc_op_column_sums(&tdpb2, &tdinp2, 0));
    assert_memory_equal(dinp, dinp2, (size_t)(N * C) * 4);
    assert_memory_equal(dw, dw2, (size_t)(OC * C) * 4);
    assert_memory_equal(db, db2, (size_t)OC * 4);
    assert_memory_equal(dpb, dpb2, (size_t)C * 4);
    test_assert_close("matmul_backward_dgelu dinp", dinp, want_dinp, (size_t)(N * C), 1e-5, 1.0);
    test_assert_close("matmul_backward_dgelu dweight", dw, want_dw, (size_t)(OC * C), 1e-5, 1.0);
    for (int64_t c = 0; with_bias && c < C; c++)
        if (!(fabs(dpb[c] - want_dpb[c]) <= 1e-5 * fmax(scale_dpb[c], 1.0)))
            fail_msg("matmul_backward_dgelu dpre_bias[%lld]: %.9g, float64 %.9g (terms' "
                     "magnitudes sum to %.3g)",
                     (long long)c, (double)dpb[c], want_dpb[c], scale_dpb[c]);
    void *all[] = {x,        w,         b,       pre, act,  pre2,     act2,     want_pre,
                   want_act, dout,      gin,     dw,  db,   dw2,      db2,      dinp,
                   dinp2,    want_dinp, want_dw, dpb, dpb2, want_dpb, scale_dpb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

static void test_fused_equals_unfused(void **state) {
    (void)state;
    for (int trial = 0; trial < 4; trial++) {
        int64_t N = 1 + (int64_t)gpc_rng_below(&rng, 40), C = 1 + (int64_t)gpc_rng_below(&rng, 70);
        int64_t OC = 1 + (int64_t)gpc_rng_below(&rng, 90);
        fused_case(N, C, OC, trial != 3);
    }
    fused_case(64, 32, 128, 1); /* the fc layer's 4x widening */
}

/* The output head on inp [B, T, C] (so the [B, T] shapes are exercised),
 * weight [Vp, C], V <= Vp real columns, one masked row, dweight starting
 * from random values so that the += is checked. */
static void classifier_case(int64_t B, int64_t T, int64_t C, int64_t Vp, int V, float dloss) {
    int64_t N = B * T;
    float *x = test_random_floats(&rng, N * C, -1, 1), *w = test_random_floats(&rng, Vp * C, -1, 1);
    float *dw = test_random_floats(&rng, Vp * C, -1, 1), *dw2 = malloc(Vp * C * 4);
    memcpy(dw2, dw, Vp * C * 4);
    float *logits = malloc(N * Vp * 4), *logits2 = malloc(N * Vp * 4);
    float *losses = malloc(N * 4), *losses2 = malloc(N * 4);
    float *dx = malloc(N * C * 4), *dx2 = malloc(N * C * 4);
    int32_t *tgt = malloc(N * 4);
    for (int64_t n = 0; n < N; n++)
        tgt[n] = (int32_t)gpc_rng_below(&rng, (uint32_t)V);
    if (N > 1) tgt[gpc_rng_below(&rng, (uint32_t)N)] = -1;
    gpc_tensor tx = gpc_tensor_3d(x, GPC_F32, gpc_cpu(), B, T, C), tw = test_f32_2d(w, Vp, C);
    gpc_tensor tdw = test_f32_2d(dw, Vp, C), tdw2 = test_f32_2d(dw2, Vp, C);
    gpc_tensor tl = gpc_tensor_3d(logits, GPC_F32, gpc_cpu(), B, T, Vp);
    gpc_tensor tl2 = gpc_tensor_3d(logits2, GPC_F32, gpc_cpu(), B, T, Vp);
    gpc_tensor tloss = test_f32_2d(losses, B, T), tloss2 = test_f32_2d(losses2, B, T);
    gpc_tensor tdx = gpc_tensor_3d(dx, GPC_F32, gpc_cpu(), B, T, C);
    gpc_tensor tdx2 = gpc_tensor_3d(dx2, GPC_F32, gpc_cpu(), B, T, C);
    gpc_tensor tt = gpc_tensor_2d(tgt, GPC_I32, gpc_cpu(), B, T);

    /* float64: the logits, then each row's loss and gradient */
    double *want_loss = malloc(N * 8), *d = malloc(N * Vp * 8);
    double *want_dx = malloc(N * C * 8), *want_dw = malloc(Vp * C * 8);
    for (int64_t n = 0; n < N; n++) {
        double *row = d + n * Vp, max = -INFINITY;
        for (int64_t j = 0; j < Vp; j++) {
            double s = 0;
            for (int64_t c = 0; c < C; c++)
                s += (double)x[n * C + c] * w[j * C + c];
            row[j] = s;
            if (j < V && s > max) max = s;
        }
        double sum = exp(row[0] - max); /* V >= 1 */
        for (int64_t j = 1; j < V; j++)
            sum += exp(row[j] - max);
        double lse = max + log(sum);
        int t = tgt[n];
        want_loss[n] = t < 0 ? 0.0 : lse - row[t];
        for (int64_t j = 0; j < Vp; j++)
            row[j] = t < 0 || j >= V ? 0.0 : (exp(row[j] - lse) - (j == t)) * dloss;
    }
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            double s = 0;
            for (int64_t j = 0; j < Vp; j++)
                s += d[n * Vp + j] * w[j * C + c];
            want_dx[n * C + c] = s;
        }
    for (int64_t j = 0; j < Vp; j++)
        for (int64_t c = 0; c < C; c++) {
            double s = dw[j * C + c];
            for (int64_t n = 0; n < N; n++)
                s += d[n * Vp + j] * x[n * C + c];
            want_dw[j * C + c] = s;
        }

    TEST_OK(gpc_op_classifier(&tloss, &tdx, &tdw, &tl, &tx, &tw, &tt, V, dloss));
    test_assert_close("classifier losses", losses, want_loss, (size_t)N, 1e-5, 0.1);
    test_assert_close("classifier dinp", dx, want_dx, (size_t)(N * C), 1e-5, 0.1);
    test_assert_close("classifier dweight", dw, want_dw, (size_t)(Vp * C), 1e-5, 0.1);
    for (int64_t n = 0; n < N; n++)
        if (tgt[n] < 0 && losses[n] != 0.0f)
            fail_msg("classifier: masked row %lld has loss %g, want 0", (long long)n,
                     (double)losses[n]);

    /* the three ops it stands for, in turn: the same bits */
    TEST_OK(gpc_op_matmul_forward(&tl2, &tx, &tw, NULL));
    TEST_OK(gpc_op_crossentropy_forward_backward(&tloss2, &tl2, &tl2, &tt, V, dloss));
    TEST_OK(gpc_op_matmul_backward(&tdx2, &tdw2, NULL, &tl2, &tx, &tw));
    assert_memory_equal(losses, losses2, (size_t)N * 4);
    assert_memory_equal(dx, dx2, (size_t)(N * C) * 4);
    assert_memory_equal(dw, dw2, (size_t)(Vp * C) * 4);
    void *all[] = {x,  w,   dw,  dw2,       logits, logits2, losses, losses2,
                   dx, dx2, tgt, want_loss, d,      want_dx, want_dw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

static void test_classifier(void **state) {
    (void)state;
    classifier_case(2, 3, 8, 12, 10, 1.0f / 6); /* N = 6, C = 8, Vp = 12, V = 10 */
    classifier_case(1, 1, 8, 12, 12, 1.0f);     /* one row, no padding */
    classifier_case(3, 11, 40, 64, 50, 0.37f);
}

/* Each bad call fails with a message naming the op and the problem, and
 * leaves losses, dinp and dweight as they were. */
static void test_classifier_bad_inputs(void **state) {
    (void)state;
    enum { N = 6, C = 8, Vp = 12 };
    float x[N * C], w[Vp * C], dw[Vp * C], logits[N * Vp], losses[N], dx[N * C];
    float copy_dw[Vp * C], copy_losses[N], copy_dx[N * C];
    int32_t tgt[N];
    float f32_tgt[N];
    memset(x, 0, sizeof x);
    memset(w, 0, sizeof w);
    for (int i = 0; i < Vp * C; i++)
        dw[i] = copy_dw[i] = (float)i;
    for (int i = 0; i < N * C; i++)
        dx[i] = copy_dx[i] = (float)-i;
    for (int i = 0; i < N; i++)
        losses[i] = copy_losses[i] = 7.0f, tgt[i] = i, f32_tgt[i] = (float)i;
    gpc_tensor tx = test_f32_2d(x, N, C), tw = test_f32_2d(w, Vp, C), tdw = test_f32_2d(dw, Vp, C);
    gpc_tensor tl = test_f32_2d(logits, N, Vp), tloss = test_f32_1d(losses, N);
    gpc_tensor tdx = test_f32_2d(dx, N, C);
    gpc_tensor tt = gpc_tensor_1d(tgt, GPC_I32, gpc_cpu(), N);
    gpc_tensor f32_targets = test_f32_1d(f32_tgt, N);
    TEST_FAILS(gpc_op_classifier(&tloss, &tdx, &tdw, &tl, &tx, &tw, &f32_targets, 10, 1.0f),
               GPC_ERR_MISMATCH, "classifier: tensor 'targets' must be i32, not f32");
    gpc_tensor i32_losses = gpc_tensor_1d(losses, GPC_I32, gpc_cpu(), N);
    TEST_FAILS(gpc_op_classifier(&i32_losses, &tdx, &tdw, &tl, &tx, &tw, &tt, 10, 1.0f),
               GPC_ERR_MISMATCH, "classifier: tensor 'losses' must be f32");
    gpc_tensor bf16_dw = gpc_tensor_2d(dw, GPC_BF16, gpc_cpu(), Vp, C);
    TEST_FAILS(gpc_op_classifier(&tloss, &tdx, &bf16_dw, &tl, &tx, &tw, &tt, 10, 1.0f),
               GPC_ERR_MISMATCH, "classifier: tensor 'dweight' must be f32, not bf16");
    gpc_tensor short_dx = test_f32_2d(dx, N - 1, C);
    TEST_FAILS(gpc_op_classifier(&tloss, &short_dx, &tdw, &tl, &tx, &tw, &tt, 10, 1.0f),
               GPC_ERR_MISMATCH, "classifier: tensor 'dinp' is [5, 8]");
    gpc_tensor narrow_w = test_f32_2d(w, Vp, C - 1);
    TEST_FAILS(gpc_op_classifier(&tloss, &tdx, &tdw, &tl, &tx, &narrow_w, &tt, 10, 1.0f),
               GPC_ERR_MISMATCH, "disagree on C");
    gpc_tensor short_dw = test_f32_2d(dw, Vp - 1, C);
    TEST_FAILS(gpc_op_classifier(&tloss, &tdx, &short_dw, &tl, &tx, &tw, &tt, 10, 1.0f),
               GPC_ERR_MISMATCH, "classifier: tensor 'dweight' is [11, 8]");
    gpc_tensor short_logits = test_f32_2d(logits, N, Vp - 1);
    TEST_FAILS(gpc_op_classifier(&tloss, &tdx, &tdw, &short_logits, &tx, &tw, &tt, 10, 1.0f),
               GPC_ERR_MISMATCH, "classifier: tensor 'logits'");
    TEST_FAILS(gpc_op_classifier(&tloss, &tdx, &tdw, &tl, &tx, &tw, &tt, 0, 1.0f), GPC_ERR_MISMATCH,
               "classifier: vocab_size 0 is outside 1..12");
    TEST_FAILS(gpc_op_classifier(&tloss, &tdx, &tdw, &tl, &tx, &tw, &tt, Vp + 1, 1.0f),
               GPC_ERR_MISMATCH, "classifier: vocab_size 13 is outside 1..12");
    TEST_FAILS(gpc_op_classifier(&tloss, &tdx, &tdw, &tl, &tx, &tw, NULL, 10, 1.0f),
               GPC_ERR_INVALID_ARG, "classifier: tensor 'targets' is missing");
    gpc_tensor dx_over_x = test_f32_2d(x, N, C);
    TEST_FAILS(gpc_op_classifier(&tloss, &dx_over_x, &tdw, &tl, &tx, &tw, &tt, 10, 1.0f),
               GPC_ERR_INVALID_ARG, "classifier: dinp shares its buffer with inp");
    gpc_tensor logits_over_w = test_f32_2d(w, N, Vp);
    TEST_FAILS(gpc_op_classifier(&tloss, &tdx, &tdw, &logits_over_w, &tx, &tw, &tt, 10, 1.0f),
               GPC_ERR_INVALID_ARG, "classifier: logits shares its buffer with weight");
    gpc_tensor gpu_dw = tdw;
    gpu_dw.device = (gpc_device){GPC_DEVICE_CUDA, 0}; /* never dereferenced */
    TEST_FAILS(gpc_op_classifier(&tloss, &tdx, &gpu_dw, &tl, &tx, &tw, &tt, 10, 1.0f),
               GPC_ERR_MISMATCH, "classifier: tensors on different devices");
    assert_memory_equal(dw, copy_dw, sizeof dw);
    assert_memory_equal(dx, copy_dx, sizeof dx);
    assert_memory_equal(losses, copy_losses, sizeof losses);
}

static void test_sum(void **state) {
    (void)state;
    int64_t n = 100000 + (int64_t)gpc_rng_below(&rng, 5000);
    float *x = test_random_floats(&rng, n, -2, 3);
    float acc = 1.5f;
    double want = 1.5;
    for (int64_t i = 0; i < n; i++)
        want += x[i];
    gpc_tensor tx = test_f32_1d(x, n), tacc = test_f32_1d(&acc, 1);
    TEST_OK(gpc_op_sum(&tacc, &tx));
    if (!(fabs(acc - want) <= 1e-6 * fabs(want)))
        fail_msg("sum: %.9g, float64 %.9g", (double)acc, want);
    free(x);
}

static void test_bad_inputs(void **state) {
    (void)state;
    float x[6 * 4], w[8 * 4], b[8], pre[6 * 8], act[6 * 8], dinp[6 * 4], acc[2];
    memset(x, 0, sizeof x);
    memset(w, 0, sizeof w);
    gpc_tensor tx = test_f32_2d(x, 6, 4), tw = test_f32_2d(w, 8, 4), tb = test_f32_1d(b, 8);
    gpc_tensor tpre = test_f32_2d(pre, 6, 8), tact = test_f32_2d(act, 6, 8);
    gpc_tensor tdinp = test_f32_2d(dinp, 6, 4);
    TEST_FAILS(gpc_op_matmul_gelu_forward(&tpre, &tpre, &tx, &tw, &tb), GPC_ERR_INVALID_ARG,
               "out_pre and out_gelu are one buffer");
    gpc_tensor short_act = test_f32_2d(act, 5, 8);
    TEST_FAILS(gpc_op_matmul_gelu_forward(&tpre, &short_act, &tx, &tw, &tb), GPC_ERR_MISMATCH,
               "tensor 'out_gelu'");
    gpc_tensor wrong_w = test_f32_2d(w, 4, 8);
    TEST_FAILS(gpc_op_matmul_gelu_forward(&tpre, &tact, &tx, &wrong_w, &tb), GPC_ERR_MISMATCH,
               "disagree on C");
    /* backward: dinp required, and must not share inp's or dout's buffer */
    gpc_tensor dw = test_f32_2d(w, 8, 4);
    TEST_FAILS(gpc_op_matmul_backward_dgelu(NULL, &dw, NULL, NULL, &tpre, &tx, &tw, &tx),
               GPC_ERR_INVALID_ARG, "tensor 'dinp' is missing");
    TEST_FAILS(gpc_op_matmul_backward_dgelu(&tx, &dw, NULL, NULL, &tpre, &tx, &tw, &tdinp),
               GPC_ERR_INVALID_ARG, "dinp shares its buffer with inp");
    TEST_FAILS(gpc_op_matmul_backward_dgelu(&tdinp, &dw, NULL, NULL, &tpre, &tx, &tw, &tact),
               GPC_ERR_MISMATCH, "tensor 'gelu_inp'");
    TEST_FAILS(gpc_op_matmul_backward_dgelu(&tdinp, &dw, NULL, &tb, &tpre, &tx, &tw, &tx),
               GPC_ERR_MISMATCH, "tensor 'dpre_bias'");
    gpc_tensor two = test_f32_1d(acc, 2);
    TEST_FAILS(gpc_op_sum(&two, &tx), GPC_ERR_MISMATCH, "tensor 'acc'");
    gpc_tensor acc_i32 = gpc_tensor_1d(acc, GPC_I32, gpc_cpu(), 1);
    TEST_FAILS(gpc_op_sum(&acc_i32, &tx), GPC_ERR_MISMATCH, "must be f32");
}

int main(void) {
    gpc_rng_seed(&rng, test_seed(), 31);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fused_equals_unfused),
        cmocka_unit_test(test_sum),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_classifier),
        cmocka_unit_test(test_classifier_bad_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
