/*
 * test_ops_cpu.c: every op of ops.h on the CPU backend, checked against a
 * float64 reference written here with plain loops (forward), against central
 * finite differences of L = sum(out * R) through that reference (backward),
 * and for the gradient conventions of ops.h: parameter gradients accumulate,
 * activation gradients are overwritten, layernorm's dinp accumulates.
 * Shapes and inputs are random for every run (test_seed()); shapes are kept
 * small so the whole file runs in seconds, sanitizers included.
 */
#include "testutil.h"

#include "ops/ops.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static gpc_rng rng;

static int setup(void **state) {
    (void)state;
    gpc_rng_seed(&rng, test_seed(), 11);
    return 0;
}

/* ------------------------------------------------------------ helpers */

static int64_t rand_range(int64_t lo, int64_t hi) {
    return lo + (int64_t)gpc_rng_below(&rng, (uint32_t)(hi - lo + 1));
}

static float *randn(int64_t n, float stddev) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    gpc_rng_fill_normal(&rng, p, (size_t)n, 0.0f, stddev);
    return p;
}

static float *filled(int64_t n, float value) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        p[i] = value;
    return p;
}

static float *copy_of(const float *src, int64_t n) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    memcpy(p, src, (size_t)n * sizeof(float));
    return p;
}

static double *widen(const float *src, int64_t n) {
    double *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++)
        p[i] = src[i];
    return p;
}

static double *dzeros(int64_t n) {
    return calloc((size_t)(n > 0 ? n : 1), sizeof(double));
}

static gpc_tensor t1(void *data, int64_t d0) {
    return gpc_tensor_1d(data, GPC_F32, gpc_cpu(), d0);
}

static gpc_tensor t2(void *data, int64_t d0, int64_t d1) {
    return gpc_tensor_2d(data, GPC_F32, gpc_cpu(), d0, d1);
}

static gpc_tensor t3(void *data, int64_t d0, int64_t d1, int64_t d2) {
    return gpc_tensor_3d(data, GPC_F32, gpc_cpu(), d0, d1, d2);
}

static double weighted_sum(const double *out, const float *r, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += out[i] * r[i];
    return s;
}

/* Central differences of loss(ctx) with respect to each x[i] (double):
 * h = 1e-6 leaves truncation (h^2) and rounding (eps/h) errors near 1e-10. */
typedef double (*loss_fn)(void *ctx);

static double *finite_diff(double *x, int64_t n, loss_fn loss, void *ctx) {
    double *g = dzeros(n);
    for (int64_t i = 0; i < n; i++) {
        double orig = x[i], h = 1e-6 * (fabs(orig) > 1 ? fabs(orig) : 1);
        x[i] = orig + h;
        double lp = loss(ctx);
        x[i] = orig - h;
        double lm = loss(ctx);
        x[i] = orig;
        g[i] = (lp - lm) / (2 * h);
    }
    return g;
}

/* want[i] += prefill[i]: the expected value of an accumulating gradient. */
static void add_prefill(double *want, const float *prefill, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        want[i] += prefill[i];
}

/* Tolerances: forward fp32 against float64; backward fp32 against float64
 * finite differences (sums over tens of terms, so a little looser). */
#define FWD_TOL 1e-5
#define BWD_TOL 1e-4

/* ---------------------------------------------------------- embedding */

typedef struct {
    int64_t B, T, C, V, maxT;
    const int32_t *tok;
    double *wte, *wpe;
    const float *r;
} embedding_ctx;

static void embedding_ref(double *out, const embedding_ctx *c) {
    for (int64_t n = 0; n < c->B * c->T; n++)
        for (int64_t k = 0; k < c->C; k++)
            out[n * c->C + k] = c->wte[c->tok[n] * c->C + k] + c->wpe[(n % c->T) * c->C + k];
}

static double embedding_loss(void *ctx) {
    embedding_ctx *c = ctx;
    int64_t n = c->B * c->T * c->C;
    double *out = dzeros(n);
    embedding_ref(out, c);
    double l = weighted_sum(out, c->r, n);
    free(out);
    return l;
}

static void test_embedding(void **state) {
    (void)state;
    embedding_ctx c = {.B = rand_range(1, 3), .T = rand_range(1, 6), .C = rand_range(1, 9)};
    c.V = rand_range(2, 7);
    c.maxT = c.T + rand_range(0, 3);
    int64_t N = c.B * c.T, NC = N * c.C;
    int32_t *tok = malloc((size_t)N * sizeof *tok);
    for (int64_t i = 0; i < N; i++)
        tok[i] = (int32_t)gpc_rng_below(&rng, (uint32_t)c.V);
    c.tok = tok;
    float *wte = randn(c.V * c.C, 1), *wpe = randn(c.maxT * c.C, 1), *out = filled(NC, NAN);
    gpc_tensor tt = gpc_tensor_2d(tok, GPC_I32, gpc_cpu(), c.B, c.T);
    gpc_tensor tout = t3(out, c.B, c.T, c.C), twte = t2(wte, c.V, c.C), twpe = t2(wpe, c.maxT, c.C);
    TEST_OK(gpc_op_embedding_forward(&tout, &tt, &twte, &twpe));
    c.wte = widen(wte, c.V * c.C);
    c.wpe = widen(wpe, c.maxT * c.C);
    double *want = dzeros(NC);
    embedding_ref(want, &c);
    test_assert_close("embedding out", out, want, (size_t)NC, FWD_TOL, 1e-6);

    /* backward: both gradients are parameters, so they accumulate on a prefill */
    float *r = randn(NC, 1);
    c.r = r;
    float *dwte = randn(c.V * c.C, 1), *dwpe = randn(c.maxT * c.C, 1);
    float *pre_te = copy_of(dwte, c.V * c.C), *pre_pe = copy_of(dwpe, c.maxT * c.C);
    gpc_tensor tdout = t3(r, c.B, c.T, c.C), tdte = t2(dwte, c.V, c.C),
               tdpe = t2(dwpe, c.maxT, c.C);
    TEST_OK(gpc_op_embedding_backward(&tdte, &tdpe, &tdout, &tt));
    double *g_te = finite_diff(c.wte, c.V * c.C, embedding_loss, &c);
    double *g_pe = finite_diff(c.wpe, c.maxT * c.C, embedding_loss, &c);
    add_prefill(g_te, pre_te, c.V * c.C);
    add_prefill(g_pe, pre_pe, c.maxT * c.C);
    test_assert_close("embedding dwte", dwte, g_te, (size_t)(c.V * c.C), BWD_TOL, 1e-2);
    test_assert_close("embedding dwpe", dwpe, g_pe, (size_t)(c.maxT * c.C), BWD_TOL, 1e-2);

    /* a token outside the vocabulary is the caller's error, named with its position */
    tok[N - 1] = (int32_t)c.V;
    char needle[64];
    snprintf(needle, sizeof needle, "token %d at position %lld", (int)c.V, (long long)N - 1);
    TEST_FAILS(gpc_op_embedding_forward(&tout, &tt, &twte, &twpe), GPC_ERR_INVALID_ARG, needle);
    TEST_FAILS(gpc_op_embedding_backward(&tdte, &tdpe, &tdout, &tt), GPC_ERR_INVALID_ARG, needle);
    tok[0] = -3;
    TEST_FAILS(gpc_op_embedding_forward(&tout, &tt, &twte, &twpe), GPC_ERR_INVALID_ARG,
               "token -3 at position 0");

    free(tok), free(wte), free(wpe), free(out), free(c.wte), free(c.wpe), free(want), free(r);
    free(dwte), free(dwpe), free(pre_te), free(pre_pe), free(g_te), free(g_pe);
}

/* The backward scatter gives the same bits on every run and for any thread
 * count: many repeated tokens, C not a multiple of the channel block. */
static void test_embedding_backward_deterministic(void **state) {
    (void)state;
    int64_t B = 4, T = 257, C = 100 + rand_range(0, 40), V = 13;
    int64_t N = B * T;
    int32_t *tok = malloc((size_t)N * sizeof *tok);
    for (int64_t i = 0; i < N; i++)
        tok[i] = (int32_t)gpc_rng_below(&rng, (uint32_t)V);
    float *dout = randn(N * C, 1), *pre_te = randn(V * C, 1), *pre_pe = randn(T * C, 1);
    float *runs_te[3], *runs_pe[3];
    int threads[3] = {2, 2, 1};
    int saved = omp_get_max_threads();
    for (int run = 0; run < 3; run++) {
        omp_set_num_threads(threads[run]);
        runs_te[run] = copy_of(pre_te, V * C);
        runs_pe[run] = copy_of(pre_pe, T * C);
        gpc_tensor tt = gpc_tensor_2d(tok, GPC_I32, gpc_cpu(), B, T);
        gpc_tensor td = t3(dout, B, T, C), tte = t2(runs_te[run], V, C),
                   tpe = t2(runs_pe[run], T, C);
        TEST_OK(gpc_op_embedding_backward(&tte, &tpe, &td, &tt));
    }
    omp_set_num_threads(saved);
    for (int run = 1; run < 3; run++) {
        assert_memory_equal(runs_te[0], runs_te[run], (size_t)(V * C) * sizeof(float));
        assert_memory_equal(runs_pe[0], runs_pe[run], (size_t)(T * C) * sizeof(float));
    }
    /* and the values are right: the sums in double */
    double *want = widen(pre_te, V * C);
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < C; k++)
            want[tok[n] * C + k] += dout[n * C + k];
    /* sums of ~N/V unit terms: the floor is their scale */
    test_assert_close("embedding dwte (many tokens)", runs_te[0], want, (size_t)(V * C), 1e-5, 1.0);
    for (int run = 0; run < 3; run++)
        free(runs_te[run]), free(runs_pe[run]);
    free(tok), free(dout), free(pre_te), free(pre_pe), free(want);
}

/* ---------------------------------------------------------- layernorm */

typedef struct {
    int64_t N, C;
    double *x, *w, *b;
    const float *r;
} layernorm_ctx;

static void layernorm_ref(double *out, double *mean, double *rstd, const layernorm_ctx *c) {
    for (int64_t n = 0; n < c->N; n++) {
        const double *x = c->x + n * c->C;
        double m = 0, v = 0;
        for (int64_t k = 0; k < c->C; k++)
            m += x[k];
        m /= c->C;
        for (int64_t k = 0; k < c->C; k++)
            v += (x[k] - m) * (x[k] - m);
        v /= c->C; /* biased, as PyTorch */
        double rs = 1 / sqrt(v + 1e-5);
        for (int64_t k = 0; k < c->C; k++)
            out[n * c->C + k] = (x[k] - m) * rs * c->w[k] + c->b[k];
        if (mean) mean[n] = m;
        if (rstd) rstd[n] = rs;
    }
}

static double layernorm_loss(void *ctx) {
    layernorm_ctx *c = ctx;
    double *out = dzeros(c->N * c->C);
    layernorm_ref(out, NULL, NULL, c);
    double l = weighted_sum(out, c->r, c->N * c->C);
    free(out);
    return l;
}

static void test_layernorm(void **state) {
    (void)state;
    /* C >= 4: with two channels a row can be nearly constant, and then the f32
     * mean saved for the backward pass is too coarse for a 1e-4 check */
    int64_t B = rand_range(1, 3), T = rand_range(1, 5), C = rand_range(4, 40);
    layernorm_ctx c = {.N = B * T, .C = C};
    int64_t NC = c.N * C;
    /* an offset mean makes a one-pass variance formula fail the test */
    float *x = randn(NC, 2), *w = randn(C, 1), *b = randn(C, 1);
    for (int64_t i = 0; i < NC; i++)
        x[i] += 3.0f;
    float *out = filled(NC, NAN), *mean = filled(c.N, NAN), *rstd = filled(c.N, NAN);
    gpc_tensor tx = t3(x, B, T, C), tw = t1(w, C), tb = t1(b, C), tout = t3(out, B, T, C);
    gpc_tensor tm = t1(mean, c.N), trs = t1(rstd, c.N);
    TEST_OK(gpc_op_layernorm_forward(&tout, &tm, &trs, &tx, &tw, &tb));
    c.x = widen(x, NC), c.w = widen(w, C), c.b = widen(b, C);
    double *want = dzeros(NC), *wmean = dzeros(c.N), *wrstd = dzeros(c.N);
    layernorm_ref(want, wmean, wrstd, &c);
    /* out is xhat * w + b, of unit scale, and cancels near zero: unit floor */
    test_assert_close("layernorm out", out, want, (size_t)NC, FWD_TOL, 1.0);
    test_assert_close("layernorm mean", mean, wmean, (size_t)c.N, FWD_TOL, 1e-3);
    test_assert_close("layernorm rstd", rstd, wrstd, (size_t)c.N, FWD_TOL, 1e-6);

    /* backward: dinp, dweight and dbias all accumulate */
    float *r = randn(NC, 1);
    c.r = r;
    float *dx = randn(NC, 1), *dw = randn(C, 1), *db = randn(C, 1), *ds = randn(C, 1);
    float *pre_x = copy_of(dx, NC), *pre_w = copy_of(dw, C), *pre_b = copy_of(db, C);
    gpc_tensor tdy = t2(r, c.N, C), tdx = t2(dx, c.N, C), tdw = t1(dw, C), tdb = t1(db, C);
    gpc_tensor tds = t1(ds, C);
    /* dinp_sum gets the column sums of dinp as it came in */
    double *want_ds = dzeros(C);
    for (int64_t j = 0; j < C; j++) {
        want_ds[j] = ds[j];
        for (int64_t n = 0; n < c.N; n++)
            want_ds[j] += dx[n * C + j];
    }
    TEST_OK(gpc_op_layernorm_backward(&tdx, &tdw, &tdb, &tds, &tdy, &tx, &tw, &tm, &trs));
    /* float32 sums of N unit terms: rounding at the size of the running sum,
     * up to sqrt(N), so the floor is sqrt(N) (a floor of 1e-3 failed on 15
     * of 300 seeds, where the sum cancelled to near 0) */
    test_assert_close("layernorm dinp_sum", ds, want_ds, (size_t)C, 3e-5, sqrt((double)c.N));
    double *gx = finite_diff(c.x, NC, layernorm_loss, &c);
    double *gw = finite_diff(c.w, C, layernorm_loss, &c);
    double *gb = finite_diff(c.b, C, layernorm_loss, &c);
    add_prefill(gx, pre_x, NC);
    add_prefill(gw, pre_w, C);
    add_prefill(gb, pre_b, C);
    test_assert_close("layernorm dinp", dx, gx, (size_t)NC, BWD_TOL, 0.1);
    test_assert_close("layernorm dweight", dw, gw, (size_t)C, BWD_TOL, 0.1);
    test_assert_close("layernorm dbias", db, gb, (size_t)C, BWD_TOL, 0.1);

    free(x), free(w), free(b), free(out), free(mean), free(rstd), free(c.x), free(c.w), free(c.b);
    free(want), free(wmean), free(wrstd), free(r), free(dx), free(dw), free(db);
    free(pre_x), free(pre_w), free(pre_b), free(gx), free(gw), free(gb), free(ds), free(want_ds);
}

static void test_residual_layernorm(void **state) {
    (void)state;
    int64_t N = rand_range(1, 12), C = rand_range(2, 70);
    float *a = randn(N * C, 1), *bb = randn(N * C, 1), *w = randn(C, 1), *bias = randn(C, 1);
    float *res = filled(N * C, NAN), *out = filled(N * C, NAN);
    float *mean = filled(N, NAN), *rstd = filled(N, NAN);
    gpc_tensor ta = t2(a, N, C), tb = t2(bb, N, C), tw = t1(w, C), tbias = t1(bias, C);
    gpc_tensor tres = t2(res, N, C), tout = t2(out, N, C), tm = t1(mean, N), trs = t1(rstd, N);
    TEST_OK(gpc_op_residual_layernorm_forward(&tres, &tout, &tm, &trs, &ta, &tb, &tw, &tbias));
    double *sum = dzeros(N * C);
    for (int64_t i = 0; i < N * C; i++)
        sum[i] = (double)a[i] + bb[i];
    test_assert_close("residual", res, sum, (size_t)(N * C), 1e-6, 1e-6);
    layernorm_ctx c = {.N = N, .C = C, .w = widen(w, C), .b = widen(bias, C)};
    c.x = widen(res, N * C);
    double *want = dzeros(N * C), *wmean = dzeros(N), *wrstd = dzeros(N);
    layernorm_ref(want, wmean, wrstd, &c);
    test_assert_close("residual layernorm out", out, want, (size_t)(N * C), FWD_TOL, 1.0);
    test_assert_close("residual layernorm rstd", rstd, wrstd, (size_t)N, FWD_TOL, 1e-6);

    /* in place: the residual stream overwrites a, as the model does */
    TEST_OK(gpc_op_residual_layernorm_forward(&ta, &tout, &tm, &trs, &ta, &tb, &tw, &tbias));
    assert_memory_equal(a, res, (size_t)(N * C) * sizeof(float));

    free(a), free(bb), free(w), free(bias), free(res), free(out), free(mean), free(rstd);
    free(sum), free(c.w), free(c.b), free(c.x), free(want), free(wmean), free(wrstd);
}

/* ------------------------------------------------------------- matmul */

typedef struct {
    int64_t N, C, OC;
    double *x, *w, *b; /* b may be NULL */
    const float *r;
} matmul_ctx;

static void matmul_ref(double *out, const matmul_ctx *c) {
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t o = 0; o < c->OC; o++) {
            double s = c->b ? c->b[o] : 0;
            for (int64_t k = 0; k < c->C; k++)
                s += c->x[n * c->C + k] * c->w[o * c->C + k];
            out[n * c->OC + o] = s;
        }
}

static double matmul_loss(void *ctx) {
    matmul_ctx *c = ctx;
    double *out = dzeros(c->N * c->OC);
    matmul_ref(out, c);
    double l = weighted_sum(out, c->r, c->N * c->OC);
    free(out);
    return l;
}

static void matmul_case(int with_bias) {
    int64_t B = rand_range(1, 3), T = rand_range(1, 7), C = rand_range(1, 33),
            OC = rand_range(1, 29);
    matmul_ctx c = {.N = B * T, .C = C, .OC = OC};
    float *x = randn(c.N * C, 1), *w = randn(OC * C, 1), *b = with_bias ? randn(OC, 1) : NULL;
    float *out = filled(c.N * OC, NAN);
    gpc_tensor tx = t3(x, B, T, C), tw = t2(w, OC, C), tout = t3(out, B, T, OC);
    gpc_tensor tb = t1(b, OC);
    TEST_OK(gpc_op_matmul_forward(&tout, &tx, &tw, with_bias ? &tb : NULL));
    c.x = widen(x, c.N * C), c.w = widen(w, OC * C), c.b = with_bias ? widen(b, OC) : NULL;
    double *want = dzeros(c.N * OC);
    matmul_ref(want, &c);
    test_assert_close("matmul out", out, want, (size_t)(c.N * OC), FWD_TOL, 1.0);
    /* the product added to a residual: into a third tensor, then in place */
    {
        float *res = randn(c.N * OC, 4), *sum = filled(c.N * OC, NAN);
        gpc_tensor tres = t3(res, B, T, OC), tsum = t3(sum, B, T, OC);
        double *want_r = dzeros(c.N * OC);
        for (int64_t i = 0; i < c.N * OC; i++)
            want_r[i] = want[i] + res[i];
        TEST_OK(gpc_op_matmul_residual_forward(&tsum, &tx, &tw, with_bias ? &tb : NULL, &tres));
        test_assert_close("matmul residual out", sum, want_r, (size_t)(c.N * OC), FWD_TOL, 1.0);
        TEST_OK(gpc_op_matmul_residual_forward(&tres, &tx, &tw, with_bias ? &tb : NULL, &tres));
        test_assert_close("matmul residual in place", res, want_r, (size_t)(c.N * OC), FWD_TOL,
                          1.0);
        free(res), free(sum), free(want_r);
    }

    /* backward: dinp overwritten (NaN prefill), dweight and dbias accumulate */
    float *r = randn(c.N * OC, 1);
    c.r = r;
    float *dx = filled(c.N * C, NAN), *dw = randn(OC * C, 1), *db = randn(OC, 1);
    float *pre_w = copy_of(dw, OC * C), *pre_b = copy_of(db, OC);
    gpc_tensor tdy = t3(r, B, T, OC), tdx = t3(dx, B, T, C), tdw = t2(dw, OC, C), tdb = t1(db, OC);
    TEST_OK(gpc_op_matmul_backward(&tdx, &tdw, with_bias ? &tdb : NULL, &tdy, &tx, &tw));
    double *gx = finite_diff(c.x, c.N * C, matmul_loss, &c);
    double *gw = finite_diff(c.w, OC * C, matmul_loss, &c);
    add_prefill(gw, pre_w, OC * C);
    /* sums of up to ~30 unit products: a unit floor */
    test_assert_close("matmul dinp", dx, gx, (size_t)(c.N * C), BWD_TOL, 1.0);
    test_assert_close("matmul dweight", dw, gw, (size_t)(OC * C), BWD_TOL, 1.0);
    if (with_bias) {
        double *gb = finite_diff(c.b, OC, matmul_loss, &c);
        add_prefill(gb, pre_b, OC);
        test_assert_close("matmul dbias", db, gb, (size_t)OC, BWD_TOL, 1.0);
        free(gb);
    } else {
        assert_memory_equal(db, pre_b, (size_t)OC * sizeof(float));
    }
    /* dinp may be skipped; dweight still accumulates (a second time now) */
    float *dw2 = copy_of(dw, OC * C);
    TEST_OK(gpc_op_matmul_backward(NULL, &tdw, NULL, &tdy, &tx, &tw));
    double *twice = widen(dw2, OC * C);
    for (int64_t i = 0; i < OC * C; i++)
        twice[i] += gw[i] - pre_w[i];
    test_assert_close("matmul dweight, second micro-step", dw, twice, (size_t)(OC * C), BWD_TOL,
                      1.0);
    /* dweight may be skipped too (backward queues the input gradient and the
     * weight gradients apart): dinp alone is the same product, and dbias
     * alone accumulates its column sums once more */
    float *dx2 = filled(c.N * C, NAN), *db2 = copy_of(db, OC);
    gpc_tensor tdx2 = t3(dx2, B, T, C);
    TEST_OK(gpc_op_matmul_backward(&tdx2, NULL, NULL, &tdy, &tx, &tw));
    assert_memory_equal(dx2, dx, (size_t)(c.N * C) * sizeof(float));
    TEST_OK(gpc_op_matmul_backward(NULL, NULL, &tdb, &tdy, &tx, &tw));
    double *sums = widen(db2, OC);
    for (int64_t o = 0; o < OC; o++)
        for (int64_t n = 0; n < c.N; n++)
            sums[o] += r[n * OC + o];
    test_assert_close("matmul dbias alone", db, sums, (size_t)OC, FWD_TOL, 1.0);
    free(dx2), free(db2), free(sums);

    free(x), free(w), free(b), free(out), free(c.x), free(c.w), free(c.b), free(want), free(r);
    free(dx), free(dw), free(db), free(pre_w), free(pre_b), free(gx), free(gw), free(dw2);
    free(twice);
}

static void test_matmul(void **state) {
    (void)state;
    matmul_case(1);
    matmul_case(0);
}

/* A larger product, through the threaded GEMM path, against float64. */
static void test_matmul_large(void **state) {
    (void)state;
    int64_t N = 64 + rand_range(0, 64), C = 96 + rand_range(0, 64), OC = 80 + rand_range(0, 64);
    matmul_ctx c = {.N = N, .C = C, .OC = OC};
    float *x = randn(N * C, 1), *w = randn(OC * C, 1), *b = randn(OC, 1);
    float *out = filled(N * OC, NAN);
    gpc_tensor tx = t2(x, N, C), tw = t2(w, OC, C), tb = t1(b, OC), tout = t2(out, N, OC);
    TEST_OK(gpc_op_matmul_forward(&tout, &tx, &tw, &tb));
    c.x = widen(x, N * C), c.w = widen(w, OC * C), c.b = widen(b, OC);
    double *want = dzeros(N * OC);
    matmul_ref(want, &c);
    /* sums of ~C products of N(0,1): absolute error scales with sqrt(C) */
    test_assert_close("matmul out (large)", out, want, (size_t)(N * OC), FWD_TOL, sqrt((double)C));
    free(x), free(w), free(b), free(out), free(c.x), free(c.w), free(c.b), free(want);
}

/* One row (generation's decoding step), which the CPU computes as a
 * matrix-vector product: forward and dinp against float64, small (one call)
 * and wide (columns spread over the threads). */
static void test_matmul_one_row(void **state) {
    (void)state;
    const int64_t sizes[2][2] = {{rand_range(1, 40), rand_range(1, 40)},
                                 {300 + rand_range(0, 200), 2000 + rand_range(0, 500)}};
    for (int k = 0; k < 2; k++) {
        int64_t C = sizes[k][0], OC = sizes[k][1];
        matmul_ctx c = {.N = 1, .C = C, .OC = OC};
        float *x = randn(C, 1), *w = randn(OC * C, 1), *b = randn(OC, 1), *out = filled(OC, NAN);
        gpc_tensor tx = t2(x, 1, C), tw = t2(w, OC, C), tb = t1(b, OC), tout = t2(out, 1, OC);
        TEST_OK(gpc_op_matmul_forward(&tout, &tx, &tw, &tb));
        c.x = widen(x, C), c.w = widen(w, OC * C), c.b = widen(b, OC);
        double *want = dzeros(OC);
        matmul_ref(want, &c);
        test_assert_close("matmul out (one row)", out, want, (size_t)OC, FWD_TOL, sqrt((double)C));
        /* dinp = dout W, one row too */
        float *dy = randn(OC, 1), *dx = filled(C, NAN), *dw = filled(OC * C, 0),
              *db = filled(OC, 0);
        gpc_tensor tdy = t2(dy, 1, OC), tdx = t2(dx, 1, C), tdw = t2(dw, OC, C), tdb = t1(db, OC);
        TEST_OK(gpc_op_matmul_backward(&tdx, &tdw, &tdb, &tdy, &tx, &tw));
        double *wdx = dzeros(C);
        for (int64_t o = 0; o < OC; o++)
            for (int64_t i = 0; i < C; i++)
                wdx[i] += (double)dy[o] * c.w[o * C + i];
        test_assert_close("matmul dinp (one row)", dx, wdx, (size_t)C, FWD_TOL, sqrt((double)OC));
        free(x), free(w), free(b), free(out), free(c.x), free(c.w), free(c.b), free(want);
        free(dy), free(dx), free(dw), free(db), free(wdx);
    }
}

/* --------------------------------------------------- gelu and residual */

static double gelu_ref(double x) {
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

typedef struct {
    int64_t n;
    double *x;
    const float *r;
} gelu_ctx;

static double gelu_loss(void *ctx) {
    gelu_ctx *c = ctx;
    double l = 0;
    for (int64_t i = 0; i < c->n; i++)
        l += gelu_ref(c->x[i]) * c->r[i];
    return l;
}

static void test_gelu(void **state) {
    (void)state;
    int64_t n = rand_range(1, 300);
    float *x = randn(n, 2), *out = filled(n, NAN);
    x[0] = 12.0f; /* far tails: tanh saturates, the gradient must stay finite */
    if (n > 1) x[1] = -12.0f;
    gpc_tensor tx = t1(x, n), tout = t1(out, n);
    TEST_OK(gpc_op_gelu_forward(&tout, &tx));
    double *want = dzeros(n);
    for (int64_t i = 0; i < n; i++)
        want[i] = gelu_ref(x[i]);
    /* 1 + tanh(u) cancels for negative x (as in every fp32 GELU): absolute floor */
    test_assert_close("gelu out", out, want, (size_t)n, FWD_TOL, 1e-2);

    float *r = randn(n, 1), *dx = filled(n, NAN);
    gelu_ctx c = {.n = n, .x = widen(x, n), .r = r};
    gpc_tensor tdy = t1(r, n), tdx = t1(dx, n);
    TEST_OK(gpc_op_gelu_backward(&tdx, &tx, &tdy));
    double *g = finite_diff(c.x, n, gelu_loss, &c);
    test_assert_close("gelu dinp", dx, g, (size_t)n, BWD_TOL, 0.1);
    /* dinp may alias dout */
    float *inplace = copy_of(r, n);
    gpc_tensor tin = t1(inplace, n);
    TEST_OK(gpc_op_gelu_backward(&tin, &tx, &tin));
    assert_memory_equal(inplace, dx, (size_t)n * sizeof(float));
    free(x), free(out), free(want), free(r), free(dx), free(c.x), free(g), free(inplace);
}

static void test_residual(void **state) {
    (void)state;
    int64_t n = rand_range(1, 500);
    float *a = randn(n, 1), *b = randn(n, 1), *out = filled(n, NAN);
    gpc_tensor ta = t1(a, n), tb = t1(b, n), tout = t1(out, n);
    TEST_OK(gpc_op_residual_forward(&tout, &ta, &tb));
    double *want = dzeros(n);
    for (int64_t i = 0; i < n; i++)
        want[i] = (double)a[i] + b[i];
    test_assert_close("residual out", out, want, (size_t)n, 1e-7, 1e-6);
    TEST_OK(gpc_op_residual_forward(&ta, &ta, &tb)); /* out may alias a */
    assert_memory_equal(a, out, (size_t)n * sizeof(float));
    free(a), free(b), free(out), free(want);
}

/* ---------------------------------------------------------- attention */

typedef struct {
    int64_t B, T, C, NH;
    double *qkv;
    const float *r;
} attention_ctx;

/* Plain causal softmax attention, the whole score row at once. */
static void attention_ref(double *out, double *lse, const attention_ctx *c) {
    int64_t hs = c->C / c->NH, C3 = 3 * c->C;
    double *s = dzeros(c->T);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->NH; h++)
            for (int64_t i = 0; i < c->T; i++) {
                const double *q = c->qkv + (b * c->T + i) * C3 + h * hs;
                double max = -INFINITY;
                for (int64_t j = 0; j <= i; j++) {
                    const double *k = c->qkv + (b * c->T + j) * C3 + c->C + h * hs;
                    double dot = 0;
                    for (int64_t d = 0; d < hs; d++)
                        dot += q[d] * k[d];
                    s[j] = dot / sqrt((double)hs);
                    if (s[j] > max) max = s[j];
                }
                double sum = 0;
                for (int64_t j = 0; j <= i; j++)
                    sum += exp(s[j] - max);
                if (lse) lse[(b * c->NH + h) * c->T + i] = max + log(sum);
                double *o = out + (b * c->T + i) * c->C + h * hs;
                for (int64_t d = 0; d < hs; d++)
                    o[d] = 0;
                for (int64_t j = 0; j <= i; j++) {
                    const double *v = c->qkv + (b * c->T + j) * C3 + 2 * c->C + h * hs;
                    double p = exp(s[j] - max) / sum;
                    for (int64_t d = 0; d < hs; d++)
                        o[d] += p * v[d];
                }
            }
    free(s);
}

static double attention_loss(void *ctx) {
    attention_ctx *c = ctx;
    int64_t n = c->B * c->T * c->C;
    double *out = dzeros(n);
    attention_ref(out, NULL, c);
    double l = weighted_sum(out, c->r, n);
    free(out);
    return l;
}

/* The backward pass written out from the full probability matrix, in
 * float64: for sizes where finite differences would be slow. */
static void attention_backward_ref(double *dqkv, const double *dout, const attention_ctx *c) {
    int64_t T = c->T, C = c->C, hs = C / c->NH, C3 = 3 * C;
    double scale = 1 / sqrt((double)hs), *p = dzeros(T), *dp = dzeros(T);
    memset(dqkv, 0, (size_t)(c->B * T * C3) * sizeof(double));
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->NH; h++)
            for (int64_t i = 0; i < T; i++) {
                const double *q = c->qkv + (b * T + i) * C3 + h * hs,
                             *dy = dout + (b * T + i) * C + h * hs;
                double max = -INFINITY, sum = 0, D = 0;
                for (int64_t j = 0; j <= i; j++) {
                    const double *k = c->qkv + (b * T + j) * C3 + C + h * hs;
                    const double *v = k + C;
                    double dot = 0, dv = 0;
                    for (int64_t d = 0; d < hs; d++)
                        dot += q[d] * k[d], dv += dy[d] * v[d];
                    p[j] = dot * scale;
                    dp[j] = dv;
                    if (p[j] > max) max = p[j];
                }
                for (int64_t j = 0; j <= i; j++)
                    sum += exp(p[j] - max);
                for (int64_t j = 0; j <= i; j++) {
                    p[j] = exp(p[j] - max) / sum;
                    D += p[j] * dp[j];
                }
                double *dq = dqkv + (b * T + i) * C3 + h * hs;
                for (int64_t j = 0; j <= i; j++) {
                    const double *k = c->qkv + (b * T + j) * C3 + C + h * hs;
                    double *dk = dqkv + (b * T + j) * C3 + C + h * hs, *dv = dk + C;
                    double ds = p[j] * (dp[j] - D) * scale;
                    for (int64_t d = 0; d < hs; d++) {
                        dq[d] += ds * k[d];
                        dk[d] += ds * q[d];
                        dv[d] += p[j] * dy[d];
                    }
                }
            }
    free(p), free(dp);
}

static void attention_case(int64_t B, int64_t T, int64_t NH, int64_t hs, int finite_differences) {
    attention_ctx c = {.B = B, .T = T, .C = NH * hs, .NH = NH};
    int64_t C = c.C, nq = B * T * 3 * C, no = B * T * C;
    float *qkv = randn(nq, 1), *out = filled(no, NAN), *lse = filled(B * NH * T, NAN);
    gpc_tensor tqkv = t3(qkv, B, T, 3 * C), tout = t3(out, B, T, C);
    gpc_tensor tlse = t3(lse, B, NH, T);
    TEST_OK(gpc_op_attention_forward(&tout, &tlse, &tqkv, (int)NH));
    c.qkv = widen(qkv, nq);
    double *want = dzeros(no), *wlse = dzeros(B * NH * T);
    attention_ref(want, wlse, &c);
    test_assert_close("attention out", out, want, (size_t)no, FWD_TOL, 0.1);
    test_assert_close("attention lse", lse, wlse, (size_t)(B * NH * T), FWD_TOL, 0.1);
    /* decode: the last Tq rows only (every Tq for short rows, a few for
     * long ones), equal to the same rows of the reference */
    for (int64_t Tq = 1; Tq <= T; Tq += T < 10 ? 1 : rand_range(1, T)) {
        float *last = filled(B * Tq * C, NAN);
        gpc_tensor tlast = t3(last, B, Tq, C);
        TEST_OK(gpc_op_attention_decode(&tlast, &tqkv, (int)NH));
        for (int64_t b = 0; b < B; b++)
            test_assert_close("attention decode", last + b * Tq * C, want + (b * T + T - Tq) * C,
                              (size_t)(Tq * C), FWD_TOL, 0.1);
        free(last);
    }
    float *r = randn(no, 1), *dqkv = filled(nq, NAN); /* overwritten, so NaN must vanish */
    c.r = r;
    gpc_tensor tdy = t3(r, B, T, C), tdqkv = t3(dqkv, B, T, 3 * C);
    TEST_OK(gpc_op_attention_backward(&tdqkv, &tdy, &tqkv, &tout, &tlse, (int)NH));
    if (finite_differences) {
        double *g = finite_diff(c.qkv, nq, attention_loss, &c);
        /* floor 0.1: where the exact gradient is 0 (a row's only key: its
         * softmax is constant), f32's p (dp - D) leaves about 1e-6 of the
         * gradients' scale of 1, as much as BWD_TOL x 1e-2 */
        test_assert_close("attention dqkv", dqkv, g, (size_t)nq, BWD_TOL, 0.1);
        free(g);
    } else {
        double *g = dzeros(nq), *dy = widen(r, no);
        attention_backward_ref(g, dy, &c);
        test_assert_close("attention dqkv (long rows)", dqkv, g, (size_t)nq, BWD_TOL, 0.1);
        free(g), free(dy);
    }
    free(r), free(dqkv);
    free(qkv), free(out), free(lse), free(c.qkv), free(want), free(wlse);
}

static void test_attention(void **state) {
    (void)state;
    for (int rep = 0; rep < 3; rep++)
        attention_case(rand_range(1, 2), rand_range(1, 9), rand_range(1, 3), rand_range(1, 6), 1);
    /* rows longer than one block of queries (128 on the CPU), against the
     * written-out float64 backward */
    attention_case(2, 120 + rand_range(0, 150), 3, 16, 0);
}

/* Forward and backward give the same bits on every run and any thread count. */
static void test_attention_deterministic(void **state) {
    (void)state;
    int64_t B = 2, T = 130 + rand_range(0, 30), NH = 3, hs = 8, C = NH * hs;
    int64_t nq = B * T * 3 * C, no = B * T * C;
    float *qkv = randn(nq, 1), *dout = randn(no, 1);
    float *outs[3], *lses[3], *dqkvs[3];
    int threads[3] = {2, 2, 1};
    int saved = omp_get_max_threads();
    for (int run = 0; run < 3; run++) {
        omp_set_num_threads(threads[run]);
        outs[run] = filled(no, 0), lses[run] = filled(B * NH * T, 0), dqkvs[run] = filled(nq, 0);
        gpc_tensor tqkv = t3(qkv, B, T, 3 * C), tout = t3(outs[run], B, T, C);
        gpc_tensor tlse = t3(lses[run], B, NH, T), tdy = t3(dout, B, T, C);
        gpc_tensor tdqkv = t3(dqkvs[run], B, T, 3 * C);
        TEST_OK(gpc_op_attention_forward(&tout, &tlse, &tqkv, (int)NH));
        TEST_OK(gpc_op_attention_backward(&tdqkv, &tdy, &tqkv, &tout, &tlse, (int)NH));
    }
    omp_set_num_threads(saved);
    for (int run = 1; run < 3; run++) {
        assert_memory_equal(outs[0], outs[run], (size_t)no * sizeof(float));
        assert_memory_equal(lses[0], lses[run], (size_t)(B * NH * T) * sizeof(float));
        assert_memory_equal(dqkvs[0], dqkvs[run], (size_t)nq * sizeof(float));
    }
    for (int run = 0; run < 3; run++)
        free(outs[run]), free(lses[run]), free(dqkvs[run]);
    free(qkv), free(dout);
}

/* ------------------------------------------------------ cross-entropy */

typedef struct {
    int64_t N, Vp, V;
    double *logits;
    const int32_t *targets;
    double dloss;
} ce_ctx;

static void ce_ref(double *losses, double *dlogits, const ce_ctx *c) {
    for (int64_t n = 0; n < c->N; n++) {
        const double *x = c->logits + n * c->Vp;
        int32_t t = c->targets[n];
        double max = -INFINITY, sum = 0;
        for (int64_t j = 0; j < c->V; j++)
            max = x[j] > max ? x[j] : max;
        for (int64_t j = 0; j < c->V; j++)
            sum += exp(x[j] - max);
        losses[n] = t < 0 ? 0 : max + log(sum) - x[t];
        if (dlogits)
            for (int64_t j = 0; j < c->Vp; j++)
                dlogits[n * c->Vp + j] =
                    t < 0 || j >= c->V ? 0 : (exp(x[j] - max) / sum - (j == t)) * c->dloss;
    }
}

static double ce_loss(void *ctx) {
    ce_ctx *c = ctx;
    double *losses = dzeros(c->N), l = 0;
    ce_ref(losses, NULL, c);
    for (int64_t n = 0; n < c->N; n++)
        l += losses[n] * c->dloss;
    free(losses);
    return l;
}

static void test_crossentropy(void **state) {
    (void)state;
    int64_t B = rand_range(1, 3), T = rand_range(2, 6), V = rand_range(2, 40);
    ce_ctx c = {.N = B * T, .V = V, .Vp = V + rand_range(1, 8), .dloss = 1.0 / (B * T)};
    int64_t N = c.N, Vp = c.Vp;
    float *logits = randn(N * Vp, 3);
    /* stability: e^100 overflows f32, so row 0 passes only if the max is subtracted */
    for (int64_t j = 0; j < Vp; j++)
        logits[j] += 100.0f;
    int32_t *tg = malloc((size_t)N * sizeof *tg);
    for (int64_t n = 0; n < N; n++)
        tg[n] = (int32_t)gpc_rng_below(&rng, (uint32_t)V);
    tg[rand_range(0, N - 1)] = -1; /* one masked row */
    c.targets = tg;
    c.logits = widen(logits, N * Vp);
    float *losses = filled(N, NAN), *dl = filled(N * Vp, NAN);
    gpc_tensor tlog = t2(logits, N, Vp), tl = t1(losses, N), tdl = t2(dl, N, Vp);
    gpc_tensor ttg = gpc_tensor_2d(tg, GPC_I32, gpc_cpu(), B, T);
    TEST_OK(gpc_op_crossentropy_forward_backward(&tl, &tdl, &tlog, &ttg, (int)V, (float)c.dloss));
    double *wl = dzeros(N), *wdl = dzeros(N * Vp);
    ce_ref(wl, wdl, &c);
    test_assert_close("crossentropy losses", losses, wl, (size_t)N, FWD_TOL, 1e-3);
    /* gradients are of scale dloss; p - 1 cancels near p = 1, hence a floor of dloss */
    test_assert_close("crossentropy dlogits", dl, wdl, (size_t)(N * Vp), FWD_TOL, c.dloss);
    /* padded columns and masked rows are exactly zero */
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < Vp; j++)
            if (tg[n] < 0 || j >= V) assert_true(dl[n * Vp + j] == 0.0f);
    for (int64_t n = 0; n < N; n++)
        if (tg[n] < 0) assert_true(losses[n] == 0.0f);
    /* and the gradient is that of the loss: finite differences */
    double *g = finite_diff(c.logits, N * Vp, ce_loss, &c);
    test_assert_close("crossentropy dlogits (finite differences)", dl, g, (size_t)(N * Vp), BWD_TOL,
                      c.dloss);

    /* in place: dlogits aliases logits, the model's way of saving a buffer */
    float *inplace = copy_of(logits, N * Vp), *losses2 = filled(N, NAN);
    gpc_tensor tin = t2(inplace, N, Vp), tl2 = t1(losses2, N);
    TEST_OK(gpc_op_crossentropy_forward_backward(&tl2, &tin, &tin, &ttg, (int)V, (float)c.dloss));
    assert_memory_equal(inplace, dl, (size_t)(N * Vp) * sizeof(float));
    assert_memory_equal(losses2, losses, (size_t)N * sizeof(float));
    /* without dlogits: losses only */
    TEST_OK(gpc_op_crossentropy_forward_backward(&tl2, NULL, &tlog, &ttg, (int)V, 1.0f));
    assert_memory_equal(losses2, losses, (size_t)N * sizeof(float));

    /* a target outside the vocabulary names its row and value; nothing is written */
    int64_t bad_row = rand_range(0, N - 1);
    tg[bad_row] = (int32_t)V;
    float *untouched = copy_of(logits, N * Vp);
    char needle[64];
    snprintf(needle, sizeof needle, "target %d in row %lld", (int)V, (long long)bad_row);
    TEST_FAILS(gpc_op_crossentropy_forward_backward(&tl2, &tin, &tin, &ttg, (int)V, 1.0f),
               GPC_ERR_INVALID_ARG, needle);
    memcpy(inplace, logits, (size_t)(N * Vp) * sizeof(float));
    TEST_FAILS(gpc_op_crossentropy_forward_backward(&tl2, &tin, &tin, &ttg, (int)V, 1.0f),
               GPC_ERR_INVALID_ARG, needle);
    assert_memory_equal(inplace, untouched, (size_t)(N * Vp) * sizeof(float));
    tg[bad_row] = -2;
    TEST_FAILS(gpc_op_crossentropy_forward_backward(&tl2, NULL, &tlog, &ttg, (int)V, 1.0f),
               GPC_ERR_INVALID_ARG, "target -2");

    free(logits), free(tg), free(c.logits), free(losses), free(dl), free(wl), free(wdl), free(g);
    free(inplace), free(losses2), free(untouched);
}

/* --------------------------------------------- sum of squares, adamw */

static void test_sum_squares(void **state) {
    (void)state;
    int64_t n = rand_range(1, 20000);
    float *x = randn(n, 1), acc = 2.5f;
    gpc_tensor tx = t1(x, n), tacc = t1(&acc, 1);
    TEST_OK(gpc_op_sum_squares(&tacc, &tx));
    double want = 2.5;
    for (int64_t i = 0; i < n; i++)
        want += (double)x[i] * x[i];
    test_assert_close("sum_squares (adds to acc)", &acc, &want, 1, 1e-6, 1e-6);
    /* bf16 gradients too: the sum of the bf16 values */
    uint16_t *h = malloc((size_t)n * sizeof *h);
    double want16 = 0;
    for (int64_t i = 0; i < n; i++) {
        h[i] = gpc_f32_to_bf16(x[i]);
        double v = gpc_bf16_to_f32(h[i]);
        want16 += v * v;
    }
    acc = 0;
    gpc_tensor th = gpc_tensor_1d(h, GPC_BF16, gpc_cpu(), n);
    TEST_OK(gpc_op_sum_squares(&tacc, &th));
    test_assert_close("sum_squares bf16", &acc, &want16, 1, 1e-6, 1e-6);
    free(x), free(h);
}

/* column_sums: a random range of a random matrix's columns, added to what
 * acc held, against float64 sums; the columns outside the range untouched
 * is what acc's length and the sums' match together show. */
static void test_column_sums(void **state) {
    (void)state;
    int64_t N = rand_range(1, 3000), W = rand_range(1, 200);
    int64_t first = rand_range(0, W - 1), K = rand_range(1, W - first);
    float *x = randn(N * W, 1.0f), *acc = randn(K, 1.0f);
    double *want = widen(acc, K);
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < K; j++)
            want[j] += x[n * W + first + j];
    gpc_tensor tx = t2(x, N, W), tacc = t1(acc, K);
    TEST_OK(gpc_op_column_sums(&tacc, &tx, first));
    /* float32 sums of N terms of size 1 reach sqrt(N), and each addition
     * rounds at that size: about sqrt(N) * sqrt(N) * eps / 2 in all, under
     * 3e-5 of sqrt(N) for every N here, with room to spare */
    test_assert_close("column_sums", acc, want, K, 3e-5, sqrt((double)N));
    free(x), free(acc), free(want);
}

typedef struct {
    double lr, b1, b2, eps, wd, grad_scale, max_norm;
} adamw_ref_args;

static void adamw_ref(double *p, double *m, double *v, const float *grads, int64_t n, int step,
                      const adamw_ref_args *a) {
    double norm2 = 0, clip = 1;
    for (int64_t i = 0; i < n; i++)
        norm2 += (double)grads[i] * grads[i];
    if (a->max_norm > 0 && sqrt(norm2) > a->max_norm) clip = a->max_norm / sqrt(norm2);
    for (int64_t i = 0; i < n; i++) {
        double g = grads[i] * a->grad_scale * clip;
        m[i] = a->b1 * m[i] + (1 - a->b1) * g;
        v[i] = a->b2 * v[i] + (1 - a->b2) * g * g;
        double mhat = m[i] / (1 - pow(a->b1, step)), vhat = v[i] / (1 - pow(a->b2, step));
        p[i] -= a->lr * (mhat / (sqrt(vhat) + a->eps) + a->wd * p[i]);
    }
}

static void adamw_case(double max_norm, double grad_scale) {
    int64_t n = rand_range(1, 3000);
    adamw_ref_args ra = {.lr = 1e-2,
                         .b1 = 0.9,
                         .b2 = 0.95,
                         .eps = 1e-8,
                         .wd = 0.1,
                         .grad_scale = grad_scale,
                         .max_norm = max_norm};
    float *p = randn(n, 1), *m = filled(n, 0), *v = filled(n, 0);
    double *rp = widen(p, n), *rm = dzeros(n), *rv = dzeros(n);
    for (int step = 1; step <= 4; step++) {
        float *g = randn(n, 0.5f), norm2 = 0;
        gpc_tensor tg = t1(g, n), tn = t1(&norm2, 1), tp = t1(p, n), tm = t1(m, n), tv = t1(v, n);
        TEST_OK(gpc_op_sum_squares(&tn, &tg));
        gpc_adamw_args a = {.learning_rate = (float)ra.lr,
                            .beta1 = (float)ra.b1,
                            .beta2 = (float)ra.b2,
                            .eps = (float)ra.eps,
                            .weight_decay = (float)ra.wd,
                            .step = step,
                            .grad_norm_sq = &tn,
                            .max_grad_norm = (float)max_norm,
                            .grad_scale = (float)grad_scale};
        TEST_OK(gpc_op_adamw(&tp, NULL, &tg, &tm, &tv, &a));
        adamw_ref(rp, rm, rv, g, n, step, &ra);
        free(g);
    }
    test_assert_close("adamw params", p, rp, (size_t)n, 1e-5, 1e-2);
    test_assert_close("adamw m", m, rm, (size_t)n, 1e-5, 1e-2);
    test_assert_close("adamw v", v, rv, (size_t)n, 1e-5, 1e-4);
    free(p), free(m), free(v), free(rp), free(rm), free(rv);
}

static void test_adamw(void **state) {
    (void)state;
    adamw_case(1.0, 1.0);  /* norm ~ 0.5 sqrt(n) > 1: clipping is active */
    adamw_case(1e9, 1.0);  /* clipping inactive */
    adamw_case(0.0, 0.25); /* no clipping, a loss scale undone */
}

/* bf16 parameters with an f32 master copy: the master is updated as f32 would
 * be, and params are the master rounded to bf16. Gradients in bf16 too. */
static void test_adamw_master(void **state) {
    (void)state;
    int64_t n = rand_range(1, 2000);
    float *master = randn(n, 1), *m = filled(n, 0), *v = filled(n, 0), *g = randn(n, 1);
    uint16_t *params = malloc((size_t)n * sizeof *params), *g16 = malloc((size_t)n * sizeof *g16);
    for (int64_t i = 0; i < n; i++) {
        params[i] = gpc_f32_to_bf16(master[i]);
        g16[i] = gpc_f32_to_bf16(g[i]);
        g[i] = gpc_bf16_to_f32(g16[i]); /* the reference sees the bf16 gradient */
    }
    adamw_ref_args ra = {
        .lr = 3e-3, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8, .wd = 0.0, .grad_scale = 1, .max_norm = 0};
    double *rp = widen(master, n), *rm = dzeros(n), *rv = dzeros(n);
    gpc_tensor tp = gpc_tensor_1d(params, GPC_BF16, gpc_cpu(), n);
    gpc_tensor tg = gpc_tensor_1d(g16, GPC_BF16, gpc_cpu(), n);
    gpc_tensor tmaster = t1(master, n), tm = t1(m, n), tv = t1(v, n);
    gpc_adamw_args a = {.learning_rate = (float)ra.lr,
                        .beta1 = 0.9f,
                        .beta2 = 0.999f,
                        .eps = 1e-8f,
                        .step = 1,
                        .grad_scale = 1.0f};
    TEST_OK(gpc_op_adamw(&tp, &tmaster, &tg, &tm, &tv, &a));
    adamw_ref(rp, rm, rv, g, n, 1, &ra);
    test_assert_close("adamw master", master, rp, (size_t)n, 1e-5, 1e-2);
    for (int64_t i = 0; i < n; i++)
        assert_int_equal(params[i], gpc_f32_to_bf16(master[i]));
    /* bf16 gradients and weights take a loop of their own: a second step,
     * clipped and decayed, gives the bits of the general loop, which here
     * reads the same gradients widened to f32 */
    float *master2 = malloc((size_t)n * 4), *m2 = malloc((size_t)n * 4),
          *v2 = malloc((size_t)n * 4);
    uint16_t *params2 = malloc((size_t)n * sizeof *params2);
    memcpy(master2, master, (size_t)n * 4), memcpy(m2, m, (size_t)n * 4);
    memcpy(v2, v, (size_t)n * 4), memcpy(params2, params, (size_t)n * 2);
    float norm2 = 4.0f;
    gpc_tensor tn = t1(&norm2, 1), tg32 = t1(g, n),
               tp2 = gpc_tensor_1d(params2, GPC_BF16, gpc_cpu(), n);
    gpc_tensor tmaster2 = t1(master2, n), tm2 = t1(m2, n), tv2 = t1(v2, n);
    a.step = 2, a.weight_decay = 0.1f, a.grad_norm_sq = &tn, a.max_grad_norm = 1.0f;
    TEST_OK(gpc_op_adamw(&tp, &tmaster, &tg, &tm, &tv, &a));
    TEST_OK(gpc_op_adamw(&tp2, &tmaster2, &tg32, &tm2, &tv2, &a));
    assert_memory_equal(master, master2, (size_t)n * 4);
    assert_memory_equal(m, m2, (size_t)n * 4);
    assert_memory_equal(v, v2, (size_t)n * 4);
    assert_memory_equal(params, params2, (size_t)n * 2);
    free(master2), free(m2), free(v2), free(params2);
    free(master), free(m), free(v), free(g), free(params), free(g16), free(rp), free(rm), free(rv);
}

/* skip_nonfinite (fp16 overflow decided on the device): a non-finite norm
 * leaves every buffer as it was; a finite one gives the plain step. */
static void test_adamw_skip_nonfinite(void **state) {
    (void)state;
    int64_t n = rand_range(1, 2000);
    float *p = randn(n, 1), *m = randn(n, 0.1f), *v = filled(n, 0.5f), *g = randn(n, 1);
    float *p0 = malloc((size_t)n * 4), *m0 = malloc((size_t)n * 4), *v0 = malloc((size_t)n * 4);
    memcpy(p0, p, (size_t)n * 4), memcpy(m0, m, (size_t)n * 4), memcpy(v0, v, (size_t)n * 4);
    float norm2 = 0;
    gpc_tensor tp = t1(p, n), tm = t1(m, n), tv = t1(v, n), tg = t1(g, n), tn = t1(&norm2, 1);
    gpc_adamw_args a = {.learning_rate = 1e-2f,
                        .beta1 = 0.9f,
                        .beta2 = 0.95f,
                        .eps = 1e-8f,
                        .step = 3,
                        .grad_norm_sq = &tn,
                        .max_grad_norm = 1.0f,
                        .grad_scale = 1.0f / 1024,
                        .skip_nonfinite = 1};
    const float bad[] = {INFINITY, NAN};
    for (int k = 0; k < 2; k++) {
        norm2 = bad[k];
        TEST_OK(gpc_op_adamw(&tp, NULL, &tg, &tm, &tv, &a));
        assert_memory_equal(p, p0, (size_t)n * 4);
        assert_memory_equal(m, m0, (size_t)n * 4);
        assert_memory_equal(v, v0, (size_t)n * 4);
    }
    /* finite: bit for bit the step without the flag */
    norm2 = 0;
    TEST_OK(gpc_op_sum_squares(&tn, &tg));
    TEST_OK(gpc_op_adamw(&tp, NULL, &tg, &tm, &tv, &a));
    gpc_tensor tp0 = t1(p0, n), tm0 = t1(m0, n), tv0 = t1(v0, n);
    a.skip_nonfinite = 0;
    TEST_OK(gpc_op_adamw(&tp0, NULL, &tg, &tm0, &tv0, &a));
    assert_memory_equal(p, p0, (size_t)n * 4);
    assert_memory_equal(m, m0, (size_t)n * 4);
    assert_memory_equal(v, v0, (size_t)n * 4);
    a.skip_nonfinite = 1;
    a.grad_norm_sq = NULL;
    TEST_FAILS(gpc_op_adamw(&tp, NULL, &tg, &tm, &tv, &a), GPC_ERR_INVALID_ARG,
               "skip_nonfinite needs grad_norm_sq");
    free(p), free(m), free(v), free(g), free(p0), free(m0), free(v0);
}

/* ---------------------------------------------------- convert, scale */

static void test_convert_and_scale(void **state) {
    (void)state;
    int64_t n = rand_range(1, 5000);
    float *x = randn(n, 10), *back = filled(n, NAN);
    uint16_t *b16 = malloc((size_t)n * 2), *h16 = malloc((size_t)n * 2);
    gpc_tensor tx = t1(x, n), tback = t1(back, n);
    gpc_tensor tb = gpc_tensor_1d(b16, GPC_BF16, gpc_cpu(), n);
    gpc_tensor th = gpc_tensor_1d(h16, GPC_F16, gpc_cpu(), n);
    TEST_OK(gpc_op_convert(&tb, &tx));
    for (int64_t i = 0; i < n; i++)
        assert_int_equal(b16[i], gpc_f32_to_bf16(x[i]));
    TEST_OK(gpc_op_convert(&th, &tb)); /* bf16 -> f16 goes through f32 exactly */
    for (int64_t i = 0; i < n; i++)
        assert_int_equal(h16[i], gpc_f32_to_f16(gpc_bf16_to_f32(b16[i])));
    TEST_OK(gpc_op_convert(&tback, &th));
    for (int64_t i = 0; i < n; i++)
        assert_true(back[i] == gpc_f16_to_f32(h16[i]));
    TEST_OK(gpc_op_convert(&th, &tx));
    for (int64_t i = 0; i < n; i++)
        assert_int_equal(h16[i], gpc_f32_to_f16(x[i]));
    TEST_OK(gpc_op_convert(&tback, &tx)); /* same dtype: a copy */
    assert_memory_equal(back, x, (size_t)n * sizeof(float));
    /* a conversion that changes the element size cannot run in place */
    gpc_tensor tx_as16 = gpc_tensor_1d(x, GPC_BF16, gpc_cpu(), n);
    TEST_FAILS(gpc_op_convert(&tx_as16, &tx), GPC_ERR_INVALID_ARG, "cannot run in place");
    assert_memory_equal(back, x, (size_t)n * sizeof(float));

    /* scale in place, f32 and bf16 */
    float f = (float)(gpc_rng_uniform(&rng) * 4 - 2);
    TEST_OK(gpc_op_scale(&tx, f));
    for (int64_t i = 0; i < n; i++)
        assert_true(x[i] == back[i] * f);
    TEST_OK(gpc_op_scale(&tb, f));
    for (int64_t i = 0; i < n; i++)
        assert_int_equal(b16[i], gpc_f32_to_bf16(gpc_bf16_to_f32(gpc_f32_to_bf16(back[i])) * f));
    free(x), free(back), free(b16), free(h16);
}

/* Compute ops need f32 on the CPU; other dtypes are refused by name. */
static void test_cpu_needs_f32(void **state) {
    (void)state;
    int64_t N = 2, C = 4;
    float x[8], out[8], w[4], b[4], mean[2], rstd[2];
    uint16_t x16[8] = {0};
    gpc_tensor tx16 = gpc_tensor_2d(x16, GPC_BF16, gpc_cpu(), N, C);
    gpc_tensor tout = t2(out, N, C), tw = t1(w, C), tb = t1(b, C), tm = t1(mean, N),
               trs = t1(rstd, N), tx = t2(x, N, C);
    TEST_FAILS(gpc_op_layernorm_forward(&tout, &tm, &trs, &tx16, &tw, &tb), GPC_ERR_UNSUPPORTED,
               "tensor 'inp' is bf16");
    TEST_FAILS(gpc_op_gelu_forward(&tout, &tx16), GPC_ERR_UNSUPPORTED, "f32 only");
    gpc_tensor tw16 = gpc_tensor_2d(x16, GPC_BF16, gpc_cpu(), 2, C);
    gpc_tensor tout2 = t2(out, N, 2);
    TEST_FAILS(gpc_op_matmul_forward(&tout2, &tx, &tw16, NULL), GPC_ERR_UNSUPPORTED,
               "tensor 'weight' is bf16");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_embedding_backward_deterministic),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_residual_layernorm),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_matmul_large),
        cmocka_unit_test(test_matmul_one_row),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_residual),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_deterministic),
        cmocka_unit_test(test_crossentropy),
        cmocka_unit_test(test_sum_squares),
        cmocka_unit_test(test_column_sums),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_adamw_master),
        cmocka_unit_test(test_adamw_skip_nonfinite),
        cmocka_unit_test(test_convert_and_scale),
        cmocka_unit_test(test_cpu_needs_f32),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
