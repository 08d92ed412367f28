/*
 * test_ops_errors.c: the checks of src/ops/ops.c, which every backend relies
 * on. Each bad call (a missing tensor, a wrong dtype or shape, tensors on two
 * devices, a bad argument) must fail with GPC_ERR_INVALID_ARG or
 * GPC_ERR_MISMATCH and a message that names the op and what was wrong, and
 * must not touch its outputs. Shapes are random so that messages carrying
 * sizes are checked against the sizes actually passed.
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
    gpc_rng_seed(&rng, test_seed(), 23);
    return 0;
}

static int64_t rand_range(int64_t lo, int64_t hi) {
    return lo + (int64_t)gpc_rng_below(&rng, (uint32_t)(hi - lo + 1));
}

/* One scratch buffer, large enough for every tensor of these tests: the
 * checks fail before anything is read, and outputs are compared after. */
static float pool[8][4096];

static gpc_tensor f32_2d(int k, int64_t d0, int64_t d1) {
    return gpc_tensor_2d(pool[k], GPC_F32, gpc_cpu(), d0, d1);
}

static gpc_tensor f32_1d(int k, int64_t d0) {
    return gpc_tensor_1d(pool[k], GPC_F32, gpc_cpu(), d0);
}

/* A tensor that claims to live on a GPU; its data is never dereferenced
 * because the device check comes first. */
static gpc_tensor on_gpu(gpc_tensor t) {
    t.device.type = GPC_DEVICE_CUDA;
    t.device.index = 0;
    return t;
}

static void test_missing_tensors(void **state) {
    (void)state;
    int64_t n = rand_range(1, 100);
    gpc_tensor out = f32_1d(0, n), inp = f32_1d(1, n), empty = f32_1d(2, n);
    empty.data = NULL;
    TEST_FAILS(gpc_op_gelu_forward(&out, NULL), GPC_ERR_INVALID_ARG,
               "gelu_forward: tensor 'inp' is missing");
    TEST_FAILS(gpc_op_gelu_forward(&empty, &inp), GPC_ERR_INVALID_ARG,
               "gelu_forward: tensor 'out' is missing");
    TEST_FAILS(gpc_op_residual_forward(&out, &inp, NULL), GPC_ERR_INVALID_ARG,
               "residual_forward: tensor 'b' is missing");
    gpc_tensor w = f32_2d(3, n, n);
    TEST_FAILS(gpc_op_matmul_backward(NULL, NULL, NULL, &out, &inp, &w), GPC_ERR_INVALID_ARG,
               "matmul_backward: tensors 'dinp', 'dweight' and 'dbias' are all missing");
    /* the fused residual + layernorm checks its inputs too */
    int64_t C = rand_range(2, 30), N = rand_range(1, 30);
    gpc_tensor r = f32_2d(0, N, C), o = f32_2d(1, N, C), m = f32_1d(2, N), s = f32_1d(3, N);
    gpc_tensor a = f32_2d(4, N, C), wt = f32_1d(5, C), bs = f32_1d(6, C);
    TEST_FAILS(gpc_op_residual_layernorm_forward(&r, &o, &m, &s, &a, NULL, &wt, &bs),
               GPC_ERR_INVALID_ARG, "tensor 'b' is missing");
    TEST_FAILS(gpc_op_residual_layernorm_forward(&r, &o, &m, &s, NULL, &a, &wt, &bs),
               GPC_ERR_INVALID_ARG, "tensor 'a' is missing");
    TEST_FAILS(
        gpc_op_adamw(&out, NULL, &inp, NULL, &inp, &(gpc_adamw_args){.step = 1, .grad_scale = 1}),
        GPC_ERR_INVALID_ARG, "adamw: tensor 'm' is missing");
}

static void test_wrong_dtypes(void **state) {
    (void)state;
    int64_t B = rand_range(1, 4), T = rand_range(1, 8), C = rand_range(1, 16);
    gpc_tensor out = f32_2d(0, B * T, C), wte = f32_2d(1, 10, C), wpe = f32_2d(2, T, C);
    gpc_tensor tokens = f32_2d(3, B, T); /* f32, not i32 */
    TEST_FAILS(gpc_op_embedding_forward(&out, &tokens, &wte, &wpe), GPC_ERR_MISMATCH,
               "embedding_forward: tensor 'tokens' must be i32, not f32");
    gpc_tensor itok = gpc_tensor_2d(pool[3], GPC_I32, gpc_cpu(), B, T);
    gpc_tensor iwte = gpc_tensor_2d(pool[1], GPC_I32, gpc_cpu(), 10, C);
    TEST_FAILS(gpc_op_embedding_forward(&out, &itok, &iwte, &wpe), GPC_ERR_MISMATCH,
               "tensor 'wte' must be f32, bf16 or f16, not i32");
    /* statistics are f32 on every backend */
    gpc_tensor x = f32_2d(0, B * T, C), m16 = gpc_tensor_1d(pool[4], GPC_BF16, gpc_cpu(), B * T);
    gpc_tensor rs = f32_1d(5, B * T), w = f32_1d(6, C), b = f32_1d(7, C), y = f32_2d(1, B * T, C);
    TEST_FAILS(gpc_op_layernorm_forward(&y, &m16, &rs, &x, &w, &b), GPC_ERR_MISMATCH,
               "layernorm_forward: tensor 'mean' must be f32, not bf16");
    gpc_tensor p16 = gpc_tensor_1d(pool[0], GPC_BF16, gpc_cpu(), C), g = f32_1d(1, C);
    gpc_tensor mm = f32_1d(2, C), vv = f32_1d(3, C);
    TEST_FAILS(gpc_op_adamw(&p16, NULL, &g, &mm, &vv, &(gpc_adamw_args){.step = 1}),
               GPC_ERR_INVALID_ARG, "adamw: bf16 parameters need an f32 master copy");
}

static void test_wrong_shapes(void **state) {
    (void)state;
    int64_t N = rand_range(1, 20), C = rand_range(2, 30), OC = rand_range(1, 30);
    char needle[128];
    /* matmul: inner dimensions disagree */
    gpc_tensor inp = f32_2d(0, N, C), w = f32_2d(1, OC, C + 1), out = f32_2d(2, N, OC);
    snprintf(needle, sizeof needle, "inp [%lld, %lld] f32 on cpu and weight [%lld, %lld]",
             (long long)N, (long long)C, (long long)OC, (long long)C + 1);
    TEST_FAILS(gpc_op_matmul_forward(&out, &inp, &w, NULL), GPC_ERR_MISMATCH, needle);
    /* matmul: out has the wrong size */
    gpc_tensor w2 = f32_2d(1, OC, C), out2 = f32_2d(2, N, OC + 1);
    snprintf(needle, sizeof needle, "tensor 'out' is [%lld, %lld] f32 on cpu; expected %lld",
             (long long)N, (long long)OC + 1, (long long)(N * OC));
    TEST_FAILS(gpc_op_matmul_forward(&out2, &inp, &w2, NULL), GPC_ERR_MISMATCH, needle);
    gpc_tensor bias = f32_1d(3, OC + 2);
    TEST_FAILS(gpc_op_matmul_forward(&out, &inp, &w2, &bias), GPC_ERR_MISMATCH,
               "matmul_forward: tensor 'bias'");
    /* the residual form: the same checks, and a residual of out's size */
    TEST_FAILS(gpc_op_matmul_residual_forward(&out, &inp, &w, NULL, &out), GPC_ERR_MISMATCH,
               "matmul_residual_forward: inp");
    gpc_tensor short_res = f32_2d(5, N, OC - 1 > 0 ? OC - 1 : OC + 1);
    snprintf(needle, sizeof needle, "matmul_residual_forward: tensor 'residual' is [%lld, %lld]",
             (long long)N, (long long)(OC - 1 > 0 ? OC - 1 : OC + 1));
    TEST_FAILS(gpc_op_matmul_residual_forward(&out, &inp, &w2, NULL, &short_res), GPC_ERR_MISMATCH,
               needle);
    TEST_FAILS(gpc_op_matmul_residual_forward(&out, &inp, &w2, NULL, NULL), GPC_ERR_INVALID_ARG,
               "matmul_residual_forward: tensor 'residual' is missing");
    gpc_tensor dw = f32_2d(4, OC, C - 1);
    TEST_FAILS(gpc_op_matmul_backward(NULL, &dw, NULL, &out, &inp, &w2), GPC_ERR_MISMATCH,
               "matmul_backward: tensor 'dweight'");
    /* layernorm: weight of the wrong width */
    gpc_tensor y = f32_2d(1, N, C), m = f32_1d(2, N), rs = f32_1d(3, N);
    gpc_tensor lw = f32_1d(4, C + 1), lb = f32_1d(5, C);
    snprintf(needle, sizeof needle, "layernorm_forward: tensor 'weight' is [%lld] f32 on cpu",
             (long long)C + 1);
    TEST_FAILS(gpc_op_layernorm_forward(&y, &m, &rs, &inp, &lw, &lb), GPC_ERR_MISMATCH, needle);
    gpc_tensor m_short = f32_1d(2, N + 1);
    TEST_FAILS(gpc_op_layernorm_forward(&y, &m_short, &rs, &inp, &lb, &lb), GPC_ERR_MISMATCH,
               "tensor 'mean'");
    /* layernorm backward: the residual gradient's column sums of the wrong width */
    gpc_tensor ldw = f32_1d(6, C), ldb = f32_1d(7, C), lds = f32_1d(5, C + 1);
    TEST_FAILS(gpc_op_layernorm_backward(&y, &ldw, &ldb, &lds, &y, &inp, &lb, &m, &rs),
               GPC_ERR_MISMATCH, "layernorm_backward: tensor 'dinp_sum'");
    /* embedding: sequence longer than the position table */
    int64_t T = rand_range(2, 16);
    gpc_tensor tok = gpc_tensor_2d(pool[6], GPC_I32, gpc_cpu(), 1, T);
    memset(pool[6], 0, sizeof pool[6]);
    gpc_tensor wte = f32_2d(0, 4, C), wpe = f32_2d(1, T - 1, C), eout = f32_2d(2, T, C);
    snprintf(needle, sizeof needle, "wpe must be [maxT>=%lld, %lld]", (long long)T, (long long)C);
    TEST_FAILS(gpc_op_embedding_forward(&eout, &tok, &wte, &wpe), GPC_ERR_MISMATCH, needle);
    /* attention: heads that do not divide the channels, and qkv not [B,T,3C] */
    int64_t NH = rand_range(2, 5), hs = rand_range(1, 4), Ca = NH * hs + 1;
    gpc_tensor qkv = gpc_tensor_3d(pool[0], GPC_F32, gpc_cpu(), 1, 4, 3 * Ca);
    gpc_tensor aout = gpc_tensor_3d(pool[1], GPC_F32, gpc_cpu(), 1, 4, Ca);
    gpc_tensor lse = gpc_tensor_3d(pool[2], GPC_F32, gpc_cpu(), 1, NH, 4);
    snprintf(needle, sizeof needle, "%lld channels do not split into %lld heads", (long long)Ca,
             (long long)NH);
    TEST_FAILS(gpc_op_attention_forward(&aout, &lse, &qkv, (int)NH), GPC_ERR_MISMATCH, needle);
    TEST_FAILS(gpc_op_attention_forward(&aout, &lse, &qkv, 0), GPC_ERR_MISMATCH,
               "do not split into 0 heads");
    gpc_tensor qkv2 = f32_2d(0, 4, 3 * Ca);
    TEST_FAILS(gpc_op_attention_forward(&aout, &lse, &qkv2, 1), GPC_ERR_MISMATCH,
               "qkv must be [B, T, 3C]");
    /* decode: the same checks, and out no longer than qkv nor of other B or C */
    TEST_FAILS(gpc_op_attention_decode(&aout, &qkv, (int)NH), GPC_ERR_MISMATCH, needle);
    TEST_FAILS(gpc_op_attention_decode(&aout, &qkv2, 1), GPC_ERR_MISMATCH,
               "qkv must be [B, T, 3C]");
    gpc_tensor dqkv = gpc_tensor_3d(pool[0], GPC_F32, gpc_cpu(), 2, 4, 3 * Ca);
    gpc_tensor long_out = gpc_tensor_3d(pool[1], GPC_F32, gpc_cpu(), 2, 5, Ca);
    gpc_tensor wide_out = gpc_tensor_3d(pool[1], GPC_F32, gpc_cpu(), 2, 1, Ca + 1);
    gpc_tensor one_b = gpc_tensor_3d(pool[1], GPC_F32, gpc_cpu(), 1, 1, Ca);
    TEST_FAILS(gpc_op_attention_decode(&long_out, &dqkv, 1), GPC_ERR_MISMATCH,
               "out must be [2, 1..4");
    TEST_FAILS(gpc_op_attention_decode(&wide_out, &dqkv, 1), GPC_ERR_MISMATCH, "out must be");
    TEST_FAILS(gpc_op_attention_decode(&one_b, &dqkv, 1), GPC_ERR_MISMATCH, "out must be");
    /* cross-entropy: a vocabulary wider than the logits */
    int64_t Vp = rand_range(2, 64);
    gpc_tensor logits = f32_2d(0, N, Vp), losses = f32_1d(1, N);
    gpc_tensor targets = gpc_tensor_1d(pool[2], GPC_I32, gpc_cpu(), N);
    snprintf(needle, sizeof needle, "vocab_size %lld is outside 1..%lld", (long long)Vp + 1,
             (long long)Vp);
    TEST_FAILS(
        gpc_op_crossentropy_forward_backward(&losses, NULL, &logits, &targets, (int)Vp + 1, 1.0f),
        GPC_ERR_MISMATCH, needle);
    gpc_tensor losses_short = f32_1d(1, N + 1);
    TEST_FAILS(
        gpc_op_crossentropy_forward_backward(&losses_short, NULL, &logits, &targets, (int)Vp, 1.0f),
        GPC_ERR_MISMATCH, "tensor 'losses'");
    /* sum of squares: the accumulator is one element */
    gpc_tensor acc = f32_1d(3, 2);
    TEST_FAILS(gpc_op_sum_squares(&acc, &logits), GPC_ERR_MISMATCH,
               "sum_squares: tensor 'acc' is [2] f32 on cpu; expected 1 elements");
    /* column sums: the range must lie among x's columns */
    gpc_tensor sums = f32_1d(3, 2);
    snprintf(needle, sizeof needle, "column_sums: columns %lld to %lld are not all among x's %lld",
             (long long)Vp - 1, (long long)Vp, (long long)Vp);
    TEST_FAILS(gpc_op_column_sums(&sums, &logits, Vp - 1), GPC_ERR_INVALID_ARG, needle);
    TEST_FAILS(gpc_op_column_sums(&sums, &logits, -1), GPC_ERR_INVALID_ARG,
               "column_sums: columns -1 to 0");
    /* convert: element counts differ */
    gpc_tensor dst = gpc_tensor_1d(pool[4], GPC_BF16, gpc_cpu(), N * Vp + 1);
    TEST_FAILS(gpc_op_convert(&dst, &logits), GPC_ERR_MISMATCH, "convert: tensor 'src'");
}

static void test_mismatched_devices(void **state) {
    (void)state;
    int64_t n = rand_range(1, 64);
    gpc_tensor out = f32_1d(0, n), a = f32_1d(1, n), b = on_gpu(f32_1d(2, n));
    pool[0][0] = 42.0f;
    TEST_FAILS(gpc_op_residual_forward(&out, &a, &b), GPC_ERR_MISMATCH,
               "residual_forward: tensors on different devices (cpu and cuda");
    assert_true(pool[0][0] == 42.0f);
    int64_t N = rand_range(1, 8), C = rand_range(2, 8), OC = rand_range(1, 8);
    gpc_tensor inp = f32_2d(0, N, C), w = on_gpu(f32_2d(1, OC, C)), mo = f32_2d(2, N, OC);
    TEST_FAILS(gpc_op_matmul_forward(&mo, &inp, &w, NULL), GPC_ERR_MISMATCH,
               "matmul_forward: tensors on different devices");
    gpc_tensor p = f32_1d(0, n), g = f32_1d(1, n), m = f32_1d(2, n), v = f32_1d(3, n);
    gpc_tensor norm = on_gpu(f32_1d(4, 1));
    gpc_adamw_args args = {.step = 1, .grad_norm_sq = &norm, .max_grad_norm = 1, .grad_scale = 1};
    TEST_FAILS(gpc_op_adamw(&p, NULL, &g, &m, &v, &args), GPC_ERR_MISMATCH,
               "adamw: tensors on different devices");
}

static void test_bad_arguments(void **state) {
    (void)state;
    int64_t n = rand_range(1, 64);
    gpc_tensor p = f32_1d(0, n), g = f32_1d(1, n), m = f32_1d(2, n), v = f32_1d(3, n);
    for (int64_t i = 0; i < n; i++)
        pool[0][i] = (float)i;
    gpc_adamw_args args = {.learning_rate = 1, .step = 0, .grad_scale = 1};
    TEST_FAILS(gpc_op_adamw(&p, NULL, &g, &m, &v, &args), GPC_ERR_INVALID_ARG,
               "adamw: step must start at 1");
    for (int64_t i = 0; i < n; i++)
        assert_true(pool[0][i] == (float)i);
}

/* attention_prepare checks qkv like the attention ops do */
static void test_attention_prepare(void **state) {
    (void)state;
    int64_t T = rand_range(1, 8), C = 4 * rand_range(1, 8);
    gpc_tensor qkv = gpc_tensor_3d(pool[0], GPC_F32, gpc_cpu(), 2, T, 3 * C);
    TEST_OK(gpc_op_attention_prepare(&qkv, 4, 1));
    TEST_FAILS(gpc_op_attention_prepare(NULL, 4, 1), GPC_ERR_INVALID_ARG, "'qkv' is missing");
    gpc_tensor bad = gpc_tensor_3d(pool[0], GPC_F32, gpc_cpu(), 2, T, 3 * C + 1);
    TEST_FAILS(gpc_op_attention_prepare(&bad, 4, 1), GPC_ERR_MISMATCH, "[B, T, 3C]");
    char want[64];
    snprintf(want, sizeof want, "%lld channels do not split into %lld heads", (long long)C,
             (long long)(C + 1));
    TEST_FAILS(gpc_op_attention_prepare(&qkv, (int)C + 1, 1), GPC_ERR_MISMATCH, want);
    gpc_tensor ints = gpc_tensor_3d(pool[0], GPC_I32, gpc_cpu(), 2, T, 3 * C);
    TEST_FAILS(gpc_op_attention_prepare(&ints, 4, 0), GPC_ERR_MISMATCH, "not i32");
}

/* The GPU attention path: named, set for the process, or from GPC_ATTENTION. */
static void test_attention_path(void **state) {
    (void)state;
    static const char *const names[] = {"auto", "gpc", "cudnn", "simple"};
    for (int i = 0; i < 4; i++) {
        gpc_attention_path path;
        TEST_OK(gpc_attention_path_parse(names[i], &path));
        assert_int_equal(path, i);
        assert_string_equal(gpc_attention_path_name(path), names[i]);
    }
    gpc_attention_path path = GPC_ATTENTION_GPC;
    TEST_FAILS(gpc_attention_path_parse("flash", &path), GPC_ERR_INVALID_ARG,
               "'flash' is not auto, gpc, cudnn or simple");
    TEST_FAILS(gpc_attention_path_parse(NULL, &path), GPC_ERR_INVALID_ARG, "(none)");

    unsetenv("GPC_ATTENTION");
    TEST_OK(gpc_op_set_attention_path(NULL));
    TEST_OK(gpc_op_attention_path(&path));
    assert_int_equal(path, GPC_ATTENTION_AUTO); /* the default */
    setenv("GPC_ATTENTION", "gpc", 1);
    TEST_OK(gpc_op_attention_path(&path));
    assert_int_equal(path, GPC_ATTENTION_GPC);
    TEST_OK(gpc_op_set_attention_path("cudnn")); /* set wins over the environment */
    TEST_OK(gpc_op_attention_path(&path));
    assert_int_equal(path, GPC_ATTENTION_CUDNN);
    TEST_FAILS(gpc_op_set_attention_path("fastest"), GPC_ERR_INVALID_ARG, "'fastest'");
    TEST_OK(gpc_op_attention_path(&path));
    assert_int_equal(path, GPC_ATTENTION_CUDNN); /* a bad name changed nothing */
    TEST_OK(gpc_op_set_attention_path(NULL));
    setenv("GPC_ATTENTION", "cuDNN", 1);
    TEST_FAILS(gpc_op_attention_path(&path), GPC_ERR_INVALID_ARG,
               "GPC_ATTENTION in the environment: attention path 'cuDNN'");
    unsetenv("GPC_ATTENTION");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing_tensors), cmocka_unit_test(test_wrong_dtypes),
        cmocka_unit_test(test_wrong_shapes),    cmocka_unit_test(test_mismatched_devices),
        cmocka_unit_test(test_bad_arguments),   cmocka_unit_test(test_attention_prepare),
        cmocka_unit_test(test_attention_path),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
