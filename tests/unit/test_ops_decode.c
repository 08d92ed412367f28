/*
 * test_ops_decode.c: the fused decode products (gpc_op_decode_product) on
 * the CPU.
 *
 * Each form must give exactly what the unfused ops give (the CPU composes
 * the same kernels, so bit for bit): layernorm then the product with its
 * bias, the product added to a residual in place, layernorm then the
 * product and GELU, layernorm then qkv's product and the cache store (the
 * cache's other rows untouched), and the plain product. And the layernorm
 * and product forms must match a float64 loop of the formula within 1e-5
 * relative to the larger of |value| and 1. Rows 1, 2, 3, 7 and 16, odd
 * shapes. Bad calls are refused with a message that names the problem.
 */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

static gpc_rng rng;

/* want[N, OC] = [gelu](layernorm?(x) @ w^T + b) [+ residual] in float64. */
static void reference(double *want, const float *x, const float *lw, const float *lb,
                      const float *w, const float *b, const float *residual, int gelu, int64_t N,
                      int64_t C, int64_t OC) {
    double *row = malloc((size_t)C * sizeof *row);
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C;
        double mean = 0, var = 0;
        for (int64_t c = 0; c < C; c++)
            mean += xr[c];
        mean /= (double)C;
        for (int64_t c = 0; c < C; c++)
            var += (xr[c] - mean) * (xr[c] - mean);
        double rstd = 1.0 / sqrt(var / (double)C + 1e-5);
        for (int64_t c = 0; c < C; c++)
            row[c] = lw ? (xr[c] - mean) * rstd * lw[c] + lb[c] : xr[c];
        for (int64_t o = 0; o < OC; o++) {
            double s = b ? b[o] : 0.0;
            for (int64_t c = 0; c < C; c++)
                s += row[c] * w[o * C + c];
            if (gelu) s = test_gelu64(s);
            if (residual) s += residual[n * OC + o];
            want[n * OC + o] = s;
        }
    }
    free(row);
}

static void one_case(int64_t N, int64_t C, int64_t OC) {
    float *x = test_random_floats(&rng, N * C, -2, 2);
    float *w = test_random_floats(&rng, OC * C, -0.2f, 0.2f);
    float *b = test_random_floats(&rng, OC, -1, 1), *lw = test_random_floats(&rng, C, 0.5f, 1.5f);
    float *lb = test_random_floats(&rng, C, -0.5f, 0.5f);
    float *res = test_random_floats(&rng, N * OC, -1, 1);
    float *got = malloc((size_t)(N * OC) * 4), *ref = malloc((size_t)(N * OC) * 4);
    float *ln = malloc((size_t)(N * C) * 4), *mean = malloc((size_t)N * 4);
    float *rstd = malloc((size_t)N * 4);
    double *want = malloc((size_t)(N * OC) * 8);
    gpc_tensor tx = test_f32_2d(x, N, C), tw = test_f32_2d(w, OC, C), tb = test_f32_1d(b, OC);
    gpc_tensor tlw = test_f32_1d(lw, C);
    gpc_tensor tlb = test_f32_1d(lb, C), tgot = test_f32_2d(got, N, OC);
    gpc_tensor tref = test_f32_2d(ref, N, OC);
    gpc_tensor tln = test_f32_2d(ln, N, C), tmean = test_f32_1d(mean, N);
    gpc_tensor trstd = test_f32_1d(rstd, N);
    size_t bytes = (size_t)(N * OC) * 4;

    /* layernorm, product, bias */
    gpc_decode_product_args a = {.ln_weight = &tlw, .ln_bias = &tlb, .bias = &tb};
    TEST_OK(gpc_op_decode_product(&tgot, &tx, &tw, &a));
    TEST_OK(gpc_op_layernorm_forward(&tln, &tmean, &trstd, &tx, &tlw, &tlb));
    TEST_OK(gpc_op_matmul_forward(&tref, &tln, &tw, &tb));
    assert_memory_equal(got, ref, bytes);
    reference(want, x, lw, lb, w, b, NULL, 0, N, C, OC);
    test_assert_close("layernorm + product", got, want, (size_t)(N * OC), 1e-5, 1.0);

    /* layernorm, product, GELU */
    a.gelu = 1;
    TEST_OK(gpc_op_decode_product(&tgot, &tx, &tw, &a));
    TEST_OK(gpc_op_matmul_forward(&tref, &tln, &tw, &tb));
    TEST_OK(gpc_op_gelu_forward(&tref, &tref));
    assert_memory_equal(got, ref, bytes);
    reference(want, x, lw, lb, w, b, NULL, 1, N, C, OC);
    test_assert_close("layernorm + product + gelu", got, want, (size_t)(N * OC), 1e-5, 1.0);

    /* product onto a residual, in place */
    gpc_decode_product_args r = {.bias = &tb, .residual = &tgot};
    reference(want, x, NULL, NULL, w, b, res, 0, N, C, OC);
    memcpy(got, res, bytes);
    memcpy(ref, res, bytes);
    TEST_OK(gpc_op_decode_product(&tgot, &tx, &tw, &r));
    TEST_OK(gpc_op_matmul_residual_forward(&tref, &tx, &tw, &tb, &tref));
    assert_memory_equal(got, ref, bytes);
    test_assert_close("product + residual", got, want, (size_t)(N * OC), 1e-5, 1.0);

    /* the plain product (no args) */
    TEST_OK(gpc_op_decode_product(&tgot, &tx, &tw, NULL));
    TEST_OK(gpc_op_matmul_forward(&tref, &tx, &tw, NULL));
    assert_memory_equal(got, ref, bytes);

    free(x), free(w), free(b), free(lw), free(lb), free(res), free(got), free(ref);
    free(ln), free(mean), free(rstd), free(want);
}

static void test_forms_equal_unfused(void **state) {
    (void)state;
    static const int64_t rows[] = {1, 2, 3, 7, 16};
    static const int64_t shapes[][2] = {{64, 96}, {48, 37}, {40, 200}, {24, 6}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
            one_case(rows[i], shapes[k][0], shapes[k][1]);
}

/* layernorm, qkv's product and the cache store against layernorm,
 * matmul_forward and kv_store on a second cache. */
static void test_kv_store(void **state) {
    (void)state;
    enum { BLOCKS = 5, BS = 4 };
    static const int64_t rows[] = {1, 3, 7, 16};
    const int64_t C = 24, OC = 3 * C;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        int64_t N = rows[i], cache_n = BLOCKS * BS * C;
        float *x = test_random_floats(&rng, N * C, -2, 2);
        float *w = test_random_floats(&rng, OC * C, -0.3f, 0.3f);
        float *b = test_random_floats(&rng, OC, -1, 1);
        float *lw = test_random_floats(&rng, C, 0.5f, 1.5f);
        float *lb = test_random_floats(&rng, C, -0.5f, 0.5f);
        float *kc = test_random_floats(&rng, cache_n, -1, 1);
        float *vc = test_random_floats(&rng, cache_n, -1, 1);
        float *kc2 = malloc((size_t)cache_n * 4), *vc2 = malloc((size_t)cache_n * 4);
        memcpy(kc2, kc, (size_t)cache_n * 4);
        memcpy(vc2, vc, (size_t)cache_n * 4);
        float *qkv = malloc((size_t)(N * OC) * 4), *qkv2 = malloc((size_t)(N * OC) * 4);
        float *ln = malloc((size_t)(N * C) * 4), *st = malloc((size_t)N * 8);
        int32_t slots[16];
        int used[BLOCKS * BS] = {0};
        for (int64_t n = 0; n < N; n++) { /* distinct slots in any order */
            int32_t sl;
            do
                sl = (int32_t)gpc_rng_below(&rng, BLOCKS * BS);
            while (used[sl]);
            used[sl] = 1;
            slots[n] = sl;
        }
        gpc_tensor tx = test_f32_2d(x, N, C), tw = test_f32_2d(w, OC, C), tb = test_f32_1d(b, OC);
        gpc_tensor tlw = test_f32_1d(lw, C);
        gpc_tensor tlb = test_f32_1d(lb, C), tq = test_f32_2d(qkv, N, OC);
        gpc_tensor tq2 = test_f32_2d(qkv2, N, OC);
        gpc_tensor tk = gpc_tensor_3d(kc, GPC_F32, gpc_cpu(), BLOCKS, BS, C);
        gpc_tensor tv = gpc_tensor_3d(vc, GPC_F32, gpc_cpu(), BLOCKS, BS, C);
        gpc_tensor tk2 = gpc_tensor_3d(kc2, GPC_F32, gpc_cpu(), BLOCKS, BS, C);
        gpc_tensor tv2 = gpc_tensor_3d(vc2, GPC_F32, gpc_cpu(), BLOCKS, BS, C);
        gpc_tensor ts = gpc_tensor_1d(slots, GPC_I32, gpc_cpu(), N);
        gpc_tensor tln = test_f32_2d(ln, N, C), tm = test_f32_1d(st, N);
        gpc_tensor tr = test_f32_1d(st + N, N);
        gpc_decode_product_args a = {.ln_weight = &tlw,
                                     .ln_bias = &tlb,
                                     .bias = &tb,
                                     .k_cache = &tk,
                                     .v_cache = &tv,
                                     .slots = &ts};
        TEST_OK(gpc_op_decode_product(&tq, &tx, &tw, &a));
        TEST_OK(gpc_op_layernorm_forward(&tln, &tm, &tr, &tx, &tlw, &tlb));
        TEST_OK(gpc_op_matmul_forward(&tq2, &tln, &tw, &tb));
        TEST_OK(gpc_op_kv_store(&tk2, &tv2, &tq2, &ts));
        assert_memory_equal(qkv, qkv2, (size_t)(N * OC) * 4);
        assert_memory_equal(kc, kc2, (size_t)cache_n * 4);
        assert_memory_equal(vc, vc2, (size_t)cache_n * 4);
        /* and the stored rows are the key and value thirds */
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++) {
                assert_true(kc[slots[n] * C + c] == qkv[n * OC + C + c]);
                assert_true(vc[slots[n] * C + c] == qkv[n * OC + 2 * C + c]);
            }
        /* a slot outside the cache is refused */
        slots[0] = BLOCKS * BS;
        TEST_FAILS(gpc_op_decode_product(&tq, &tx, &tw, &a), GPC_ERR_INVALID_ARG, "slot");
        free(x), free(w), free(b), free(lw), free(lb), free(kc), free(vc), free(kc2), free(vc2);
        free(qkv), free(qkv2), free(ln), free(st);
    }
}

static void test_bad_calls(void **state) {
    (void)state;
    const int64_t C = 8, OC = 12;
    float *x = test_random_floats(&rng, 17 * C, -1, 1);
    float *w = test_random_floats(&rng, OC * C, -1, 1);
    float *out = test_random_floats(&rng, 17 * OC, -1, 1), *lw = test_random_floats(&rng, C, -1, 1);
    float *kc = test_random_floats(&rng, 2 * 4 * 4, -1, 1);
    int32_t slots[2] = {0, 1};
    gpc_tensor tx = test_f32_2d(x, 2, C), tw = test_f32_2d(w, OC, C), to = test_f32_2d(out, 2, OC);
    gpc_tensor tlw = test_f32_1d(lw, C);
    gpc_tensor big_x = test_f32_2d(x, 17, C), big_o = test_f32_2d(out, 17, OC);
    gpc_tensor ts = gpc_tensor_1d(slots, GPC_I32, gpc_cpu(), 2);
    gpc_tensor tk = gpc_tensor_3d(kc, GPC_F32, gpc_cpu(), 2, 4, 4);
    TEST_FAILS(gpc_op_decode_product(&big_o, &big_x, &tw, NULL), GPC_ERR_INVALID_ARG, "at most 16");
    gpc_decode_product_args half_ln = {.ln_weight = &tlw};
    TEST_FAILS(gpc_op_decode_product(&to, &tx, &tw, &half_ln), GPC_ERR_INVALID_ARG,
               "both ln_weight and ln_bias");
    gpc_decode_product_args both = {.residual = &to, .gelu = 1};
    TEST_FAILS(gpc_op_decode_product(&to, &tx, &tw, &both), GPC_ERR_INVALID_ARG,
               "residual and GELU");
    gpc_decode_product_args part_kv = {.k_cache = &tk, .slots = &ts};
    TEST_FAILS(gpc_op_decode_product(&to, &tx, &tw, &part_kv), GPC_ERR_INVALID_ARG,
               "k_cache, v_cache and slots");
    gpc_tensor self = test_f32_2d(x, 2, C), sq_w = test_f32_2d(w, C, C);
    TEST_FAILS(gpc_op_decode_product(&self, &tx, &sq_w, NULL), GPC_ERR_INVALID_ARG,
               "shares its buffer");
    /* qkv's caches must be [blocks, block_size, OC / 3]: 4 columns here */
    gpc_decode_product_args kv = {.k_cache = &tk, .v_cache = &tk, .slots = &ts};
    TEST_OK(gpc_op_decode_product(&to, &tx, &tw, &kv));
    gpc_tensor tw9 = test_f32_2d(w, 9, C), to9 = test_f32_2d(out, 2, 9);
    TEST_FAILS(gpc_op_decode_product(&to9, &tx, &tw9, &kv), GPC_ERR_MISMATCH, "k_cache must be");
    gpc_tensor tw10 = test_f32_2d(w, 10, C), to10 = test_f32_2d(out, 2, 10);
    TEST_FAILS(gpc_op_decode_product(&to10, &tx, &tw10, &kv), GPC_ERR_MISMATCH, "3C columns");
    free(x), free(w), free(out), free(lw), free(kc);
}

int main(void) {
    gpc_rng_seed(&rng, test_seed(), 39);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forms_equal_unfused),
        cmocka_unit_test(test_kv_store),
        cmocka_unit_test(test_bad_calls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
