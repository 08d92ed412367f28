/*
 * test_cuda_decode.c: the fused decode products (src/cuda/decode.cu)
 * against the CPU op on the same inputs, and the serving step with them
 * against the step without them (GPC_DECODE_FUSED_MAX_M=0).
 *
 * Inputs are drawn in f32 and rounded to the dtype under test, so the CPU
 * (f32) sees the values the GPU sees; the GPU's outputs start as NaN, so a
 * missed write fails. Each form (layernorm + product + bias, + GELU,
 * product onto a residual in place, layernorm + qkv's product + cache
 * store, layernorm + the head's product without bias) runs on 1, 2, 3, 7
 * and 16 rows at GPT-2's shapes (768 and 1600 channels, fc's 4C, the head's
 * 50304 rows) and odd ones (channels not a multiple of a 16-byte pack, so
 * the scalar path; channel counts not a multiple of a block's), with the
 * normalised rows staged in shared memory and normalised as read
 * (gpc_cuda_decode_set_ln_staging(0)), and f32 rows too wide to stage.
 * Under GPC_DECODE_MMA=1 (a variant in tests/CMakeLists.txt) the products
 * of 5 to 16 rows in bf16 and f16 must have run on tensor cores.
 * Tolerance: relative to the larger of |reference| and the output's RMS,
 * 1e-4 in f32, 3e-2 in bf16 and 1e-2 in f16 (the GPU rounds the
 * normalised rows and the output to the dtype, the CPU keeps f32). The
 * cache rows at the slots must be the key and value thirds of the GPU's
 * own output exactly, every other cache row untouched (NaN).
 *
 * The step: a random bf16 model of GPT-2's width, prompts, then decode
 * steps of 1, 3, 7 and 16 rows on two caches, one with the fused products
 * (CUDA graphs on) and one without: the logits must agree within bf16
 * tolerance (relative L2 norm 2e-2, no entry off by more than 0.1 of the
 * RMS), and each greedy token must be the unfused one's, or one whose
 * unfused logit is within that tolerance of the best. The fused products
 * must have run on the first cache only.
 *
 * Without a usable GPU the test exits 77, which CTest reports as skipped.
 */
#include "testutil_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/decode.h"
#include "gpc/model.h"
#include "model/gpt_internal.h"
#include "ops/ops.h"

static gpc_rng rng;
static const gpc_device gpu = {GPC_DEVICE_CUDA, 0};

static double tolerance(gpc_dtype dtype) {
    return dtype == GPC_F32 ? 1e-4 : dtype == GPC_BF16 ? 3e-2 : 1e-2;
}

/* Every |got - want| within tol of max(|want|, RMS of want, floor); no
 * NaN. floor: the size of a product's terms summed (their RMS times the
 * root of their count), which its rounding scales with; with a few
 * outputs the RMS of want alone can be far below it where the terms
 * cancel. */
static void assert_near(const char *what, const float *got, const float *want, int64_t n,
                        double tol, double floor) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++)
        ss += (double)want[i] * want[i];
    double rms = sqrt(ss / (double)(n ? n : 1)) + 1e-30;
    if (rms < floor) rms = floor;
    for (int64_t i = 0; i < n; i++) {
        double scale = fabs(want[i]) > rms ? fabs(want[i]) : rms;
        if (!(fabs((double)got[i] - want[i]) <= tol * scale))
            fail_msg("%s: element %lld is %.6g, the CPU's %.6g (rms %.3g, tolerance %.1e)", what,
                     (long long)i, got[i], want[i], rms, tol);
    }
}

enum { FORM_LN, FORM_GELU, FORM_RESIDUAL, FORM_QKV, FORM_HEAD, FORMS };
static const char *const form_names[FORMS] = {"layernorm+product", "layernorm+product+gelu",
                                              "product+residual", "layernorm+qkv+cache",
                                              "layernorm+head"};

/* One form on N rows of C channels into OC outputs, GPU against CPU. */
static void one_case(gpc_dtype dtype, int form, int64_t N, int64_t C, int64_t OC) {
    enum { BLOCKS = 6, BS = 8 };
    float *x = test_random_floats_as(&rng, dtype, N * C, -2, 2);
    float *w = test_random_floats_as(&rng, dtype, OC * C, -0.1f, 0.1f);
    float *b = test_random_floats_as(&rng, dtype, OC, -0.5f, 0.5f);
    float *lw = test_random_floats_as(&rng, dtype, C, 0.5f, 1.5f);
    float *lb = test_random_floats_as(&rng, dtype, C, -0.5f, 0.5f);
    float *res = test_random_floats_as(&rng, dtype, N * OC, -1, 1);
    float *ref = malloc((size_t)(N * OC) * 4 + 4);
    int kv = form == FORM_QKV, C3 = (int)(OC / 3);
    int32_t slots[GPC_DECODE_MAX_ROWS];
    int used[BLOCKS * BS] = {0};
    for (int64_t n = 0; n < N; n++) {
        int32_t s;
        do
            s = (int32_t)gpc_rng_below(&rng, BLOCKS * BS);
        while (used[s]);
        used[s] = 1;
        slots[n] = s;
    }
    /* the CPU */
    gpc_tensor cx = gpc_tensor_2d(x, GPC_F32, gpc_cpu(), N, C);
    gpc_tensor cw = gpc_tensor_2d(w, GPC_F32, gpc_cpu(), OC, C);
    gpc_tensor cb = gpc_tensor_1d(b, GPC_F32, gpc_cpu(), OC);
    gpc_tensor clw = gpc_tensor_1d(lw, GPC_F32, gpc_cpu(), C);
    gpc_tensor clb = gpc_tensor_1d(lb, GPC_F32, gpc_cpu(), C);
    gpc_tensor cref = gpc_tensor_2d(ref, GPC_F32, gpc_cpu(), N, OC);
    gpc_decode_product_args ca;
    memset(&ca, 0, sizeof ca);
    if (form != FORM_RESIDUAL) ca.ln_weight = &clw, ca.ln_bias = &clb;
    if (form != FORM_HEAD) ca.bias = &cb;
    ca.gelu = form == FORM_GELU;
    if (form == FORM_RESIDUAL) {
        memcpy(ref, res, (size_t)(N * OC) * 4);
        ca.residual = &cref;
    }
    TEST_OK(gpc_op_decode_product(&cref, &cx, &cw, &ca));
    /* the GPU */
    gpc_tensor gx = test_gpu_2d(dtype, N, C, x), gw = test_gpu_2d(dtype, OC, C, w);
    gpc_tensor gb = test_gpu_1d(dtype, OC, b), glw = test_gpu_1d(dtype, C, lw);
    gpc_tensor glb = test_gpu_1d(dtype, C, lb);
    gpc_tensor gout = test_gpu_2d(dtype, N, OC, form == FORM_RESIDUAL ? res : NULL);
    const int64_t cache_shape[] = {BLOCKS, BS, kv ? C3 : 1};
    gpc_tensor gk = test_gpu_tensor(dtype, 3, cache_shape, NULL);
    gpc_tensor gv = test_gpu_tensor(dtype, 3, cache_shape, NULL);
    gpc_tensor gs = test_gpu_1d(GPC_I32, N, slots);
    gpc_decode_product_args ga;
    memset(&ga, 0, sizeof ga);
    if (form != FORM_RESIDUAL) ga.ln_weight = &glw, ga.ln_bias = &glb;
    if (form != FORM_HEAD) ga.bias = &gb;
    ga.gelu = form == FORM_GELU;
    if (form == FORM_RESIDUAL) ga.residual = &gout;
    if (kv) ga.k_cache = &gk, ga.v_cache = &gv, ga.slots = &gs;
    long before = gpc_cuda_decode_calls(), mma_before = gpc_cuda_decode_mma_calls();
    TEST_OK(gpc_op_decode_product(&gout, &gx, &gw, &ga));
    assert_int_equal(gpc_cuda_decode_calls(), before + 1);
    /* GPC_DECODE_MMA=1: 5 to 16 rows of 2-byte values, C a multiple of 32 */
    int mma = gpc_setting_flag("GPC_DECODE_MMA") && N >= 5 && dtype != GPC_F32 && C % 32 == 0;
    assert_int_equal(gpc_cuda_decode_mma_calls(), mma_before + mma);
    float *got = test_gpu_download(&gout);
    char what[160];
    snprintf(what, sizeof what, "%s %s, %lld rows, %lld -> %lld", form_names[form],
             gpc_dtype_name(dtype), (long long)N, (long long)C, (long long)OC);
    /* the terms: the layernorm's output (RMS about that of its weight and
     * bias) or x, times w */
    double in2 = 0, w2 = 0;
    for (int64_t c = 0; c < C; c++)
        in2 += form == FORM_RESIDUAL ? (double)x[c] * x[c] : (double)lw[c] * lw[c] + lb[c] * lb[c];
    for (int64_t k = 0; k < OC * C; k++)
        w2 += (double)w[k] * w[k];
    const double terms = sqrt(in2 / (double)C) * sqrt(w2 / (double)(OC * C)) * sqrt((double)C);
    assert_near(what, got, ref, N * OC, tolerance(dtype), terms);
    if (kv) {
        float *k = test_gpu_download(&gk), *v = test_gpu_download(&gv);
        for (int s = 0; s < BLOCKS * BS; s++) {
            int64_t n = -1;
            for (int64_t i = 0; i < N; i++)
                if (slots[i] == s) n = i;
            for (int c = 0; c < C3; c++) {
                float kk = k[(int64_t)s * C3 + c], vv = v[(int64_t)s * C3 + c];
                if (n < 0) {
                    if (!isnan(kk) || !isnan(vv))
                        fail_msg("%s: slot %d, owned by no row, was written", what, s);
                } else if (kk != got[n * OC + C3 + c] || vv != got[n * OC + 2 * C3 + c]) {
                    fail_msg("%s: slot %d column %d holds %g, %g; row %lld's key and value are "
                             "%g, %g",
                             what, s, c, kk, vv, (long long)n, got[n * OC + C3 + c],
                             got[n * OC + 2 * C3 + c]);
                }
            }
        }
        free(k), free(v);
    }
    free(got);
    gpc_tensor *all[] = {&gx, &gw, &gb, &glw, &glb, &gout, &gk, &gv, &gs};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        gpc_tensor_free(all[i]);
    free(x), free(w), free(b), free(lw), free(lb), free(res), free(ref);
}

static const int64_t rows[] = {1, 2, 3, 7, 16};
#define ROWS (sizeof rows / sizeof rows[0])

/* GPT-2's shapes in bf16 (and the others in f32 and f16 at a few rows). */
static void test_gpt2_shapes(void **state) {
    (void)state;
    static const gpc_dtype dtypes[3] = {GPC_BF16, GPC_F32, GPC_F16};
    for (int d = 0; d < 3; d++)
        for (size_t i = 0; i < ROWS; i++) {
            int64_t N = rows[i];
            if (dtypes[d] != GPC_BF16 && N != 1 && N != 7) continue;
            one_case(dtypes[d], FORM_QKV, N, 768, 3 * 768);
            one_case(dtypes[d], FORM_RESIDUAL, N, 768, 768);
            one_case(dtypes[d], FORM_GELU, N, 768, 4 * 768);
            one_case(dtypes[d], FORM_RESIDUAL, N, 4 * 768, 768);
            one_case(dtypes[d], FORM_LN, N, 1024, 3 * 1024);
            one_case(dtypes[d], FORM_GELU, N, 1600, 4 * 1600);
            one_case(dtypes[d], FORM_RESIDUAL, N, 4 * 1600, 1600);
        }
}

/* The output head: 50304 rows of wte at 768 and 1600 channels. */
static void test_head(void **state) {
    (void)state;
    for (size_t i = 0; i < ROWS; i++) {
        one_case(GPC_BF16, FORM_HEAD, rows[i], 768, 50304);
        if (rows[i] == 1 || rows[i] == 16) one_case(GPC_BF16, FORM_HEAD, rows[i], 1600, 50304);
    }
    one_case(GPC_F32, FORM_HEAD, 3, 768, 50304);
}

/* Odd shapes: channels not a multiple of a pack (the scalar path), output
 * counts not a multiple of a block's channels, few outputs, deep rows. */
static void test_odd_shapes(void **state) {
    (void)state;
    static const gpc_dtype dtypes[3] = {GPC_BF16, GPC_F32, GPC_F16};
    static const int64_t shapes[][2] = {{100, 37}, {768, 50}, {96, 3 * 33}, {1000, 13},
                                        {8, 5},    {7, 9},    {4096, 24},   {72, 1}};
    for (int d = 0; d < 3; d++)
        for (size_t i = 0; i < ROWS; i++)
            for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
                int64_t C = shapes[k][0], OC = shapes[k][1];
                for (int form = 0; form < FORMS; form++) {
                    if (form == FORM_QKV && OC % 3 != 0) continue;
                    one_case(dtypes[d], form, rows[i], C, OC);
                }
            }
}

/* The layernorm prologue normalising as it reads (the path of rows too
 * wide for shared memory), forced; and f32 rows that do not fit. */
static void test_inline_layernorm(void **state) {
    (void)state;
    int before = gpc_cuda_decode_set_ln_staging(0);
    for (size_t i = 0; i < ROWS; i++) {
        one_case(GPC_BF16, FORM_QKV, rows[i], 768, 3 * 768);
        one_case(GPC_BF16, FORM_GELU, rows[i], 100, 37);
        one_case(GPC_F32, FORM_LN, rows[i], 1600, 200);
    }
    gpc_cuda_decode_set_ln_staging(before);
    /* 16 rows of 4096 f32 channels are 256 KiB, more than a block's shared
     * memory; 1600 of them need more than the default 48 KiB */
    one_case(GPC_F32, FORM_LN, 16, 4096, 64);
    one_case(GPC_F32, FORM_GELU, 16, 1600, 300);
    one_case(GPC_BF16, FORM_LN, 16, 1600, 300);
}

/* ---------------------------------------------------------------- the step */

enum { LAYERS = 2, HEADS = 12, CHANNELS = 768, CONTEXT = 128, VOCAB = 50257, BS = 16 };
enum { SEQS = 16, PROMPT = 20, PER_SEQ = CONTEXT / BS, BLOCKS = SEQS * PER_SEQ + 2 };

static void test_step_matches_unfused(void **state) {
    (void)state;
    gpt_model *m =
        test_make_serving_model(gpu, GPC_BF16, LAYERS, HEADS, CHANNELS, CONTEXT, VOCAB, 20261202);
    gpt_paged_options po = test_paged_options(BLOCKS, BS, SEQS, SEQS * PROMPT);
    gpt_paged *fused = NULL, *plain = NULL;
    long calls0 = gpc_cuda_decode_calls();
    setenv("GPC_DECODE_FUSED_MAX_M", "16", 1); /* opt-in */
    gpc_status made_fused = gpt_paged_create(&fused, m, &po);
    unsetenv("GPC_DECODE_FUSED_MAX_M");
    TEST_OK(made_fused);
    long calls1 = gpc_cuda_decode_calls();
    assert_true(calls1 > calls0); /* the warm-up's small buckets ran them */
    setenv("GPC_DECODE_FUSED_MAX_M", "0", 1);
    gpc_status made = gpt_paged_create(&plain, m, &po);
    unsetenv("GPC_DECODE_FUSED_MAX_M");
    TEST_OK(made);
    assert_int_equal(gpc_cuda_decode_calls(), calls1);

    int mb = gpt_paged_max_blocks(fused);
    int32_t *tables = malloc((size_t)SEQS * mb * sizeof *tables);
    for (int s = 0; s < SEQS; s++)
        for (int b = 0; b < mb; b++)
            tables[s * mb + b] = BLOCKS - 1 - (s * PER_SEQ + b);
    /* prompts: every sequence's PROMPT tokens in one step (unfused on both:
     * more rows than the fused products take) */
    int32_t last[SEQS], len[SEQS];
    {
        int n = SEQS * PROMPT;
        int32_t *tok = malloc((size_t)n * 4), *pos = malloc((size_t)n * 4);
        int32_t *seq = malloc((size_t)n * 4), *slot = malloc((size_t)n * 4);
        for (int s = 0; s < SEQS; s++)
            for (int p = 0; p < PROMPT; p++) {
                int i = s * PROMPT + p;
                tok[i] = (int32_t)gpc_rng_below(&rng, VOCAB);
                pos[i] = p, seq[i] = s;
                slot[i] = tables[s * mb + p / BS] * BS + p % BS;
            }
        gpt_paged_batch batch = {n, tok, pos, seq, slot, SEQS, tables, 0, NULL};
        TEST_OK(gpt_step_paged(fused, &batch, NULL));
        TEST_OK(gpt_step_paged(plain, &batch, NULL));
        for (int s = 0; s < SEQS; s++)
            last[s] = tok[s * PROMPT + PROMPT - 1], len[s] = PROMPT - 1;
        free(tok), free(pos), free(seq), free(slot);
    }
    static const int sizes[] = {1, 3, 7, 16, 16, 7, 3, 1, 2};
    float *la = malloc((size_t)SEQS * VOCAB * sizeof *la);
    float *lb = malloc((size_t)SEQS * VOCAB * sizeof *lb);
    long decode_before = gpc_cuda_decode_calls();
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int n = sizes[k];
        int32_t tok[SEQS], pos[SEQS], seq[SEQS], slot[SEQS], ta[SEQS], tb[SEQS];
        gpt_paged_sampling greedy[SEQS];
        for (int j = 0; j < n; j++) {
            int p = len[j];
            tok[j] = last[j], pos[j] = p, seq[j] = j;
            slot[j] = tables[j * mb + p / BS] * BS + p % BS;
            greedy[j] = (gpt_paged_sampling){0.0f, 0.0f, 1.0f, 0.0f, -1};
        }
        gpt_paged_batch batch = {n, tok, pos, seq, slot, n, tables, n, NULL};
        TEST_OK(gpt_step_paged(fused, &batch, la));
        TEST_OK(gpt_step_paged(plain, &batch, lb));
        size_t total = (size_t)n * VOCAB;
        double diff = 0, norm = 0, worst = 0;
        for (size_t i = 0; i < total; i++) {
            double d = fabs((double)la[i] - lb[i]);
            diff += d * d, norm += (double)lb[i] * lb[i];
            if (d > worst) worst = d;
        }
        double rms = sqrt(norm / (double)total);
        if (!(sqrt(diff) <= 2e-2 * sqrt(norm)) || !(worst <= 0.1 * rms))
            fail_msg("step of %d rows: logits differ by %.3g relative (worst %.3g, rms %.3g)", n,
                     sqrt(diff / (norm > 0 ? norm : 1)), worst, rms);
        /* drawn on the device (fused: replayed from a graph) */
        TEST_OK(gpt_step_paged_sample(fused, &batch, greedy, ta));
        TEST_OK(gpt_step_paged_sample(plain, &batch, greedy, tb));
        for (int j = 0; j < n; j++) {
            const float *row = lb + (size_t)j * VOCAB;
            assert_true(ta[j] >= 0 && ta[j] < VOCAB && tb[j] >= 0 && tb[j] < VOCAB);
            if (ta[j] != tb[j] && !(row[tb[j]] - row[ta[j]] <= 0.1 * rms))
                fail_msg("step of %d rows, row %d: fused drew %d (unfused logit %g), unfused %d "
                         "(%g)",
                         n, j, ta[j], row[ta[j]], tb[j], row[tb[j]]);
            last[j] = tb[j]; /* both continue from the same token */
        }
        for (int j = 0; j < n; j++)
            len[j]++;
    }
    assert_true(gpc_cuda_decode_calls() > decode_before);
    assert_true(gpt_paged_graph_count(fused) > 0);
    free(la), free(lb), free(tables);
    gpt_paged_free(fused);
    gpt_paged_free(plain);
    gpt_free(m);
}

int main(void) {
    if (!gpc_backend_get(GPC_DEVICE_CUDA)) {
        fprintf(stderr, "skipped: %s\n", gpc_last_error());
        return 77;
    }
    gpc_rng_seed(&rng, test_seed(), 39);
    if (gpc_setting_given("GPC_TEST_FILTER"))
        cmocka_set_test_filter(gpc_setting_given("GPC_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_shapes),          cmocka_unit_test(test_head),
        cmocka_unit_test(test_odd_shapes),           cmocka_unit_test(test_inline_layernorm),
        cmocka_unit_test(test_step_matches_unfused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
