/* test_quant.c: quantized weights against references computed another way:
 * fp8 E4M3 encoding against an exhaustive search of its 254 finite values;
 * the quantizer's round-trip error bounds (int8: |w - q s| <= s / 2; fp8:
 * 2^-4 of the magnitude for normals); the CPU op against a float64
 * "dequantize, then multiply" at random shapes, odd ones included; a
 * quantized model's logits against a plain model holding the dequantized
 * weights; the perplexity of a model trained here before and after int8 and
 * fp8; quant.bin's round trip and its checks; and gpc_quantize_run's
 * refusals of bad input. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/model.h"
#include "gpc/optim.h"
#include "gpc/train.h"
#include "ops/ops.h"

static const gpt_quant_options INT8 = {GPC_I8, 1}, FP8C = {GPC_F8E4M3, 1}, FP8T = {GPC_F8E4M3, 0};

/* ------------------------------------------------------------ fp8 codes */

/* Every code decodes to the value its bits say, and every f32 encodes to
 * the nearest finite E4M3 value (ties to the even code), found by search. */
static void test_f8e4m3_round_trip(void **state) {
    (void)state;
    assert_float_equal(gpc_f8e4m3_to_f32(0x7e), 448.0f, 0);
    assert_float_equal(gpc_f8e4m3_to_f32(0x01), ldexpf(1.0f, -9), 0);
    assert_float_equal(gpc_f8e4m3_to_f32(0x08), ldexpf(1.0f, -6), 0);
    assert_float_equal(gpc_f8e4m3_to_f32(0xb8), -1.0f, 0);
    assert_true(isnan(gpc_f8e4m3_to_f32(0x7f)));
    for (int code = 0; code < 256; code++) {
        if ((code & 0x7f) == 0x7f) continue;
        float v = gpc_f8e4m3_to_f32((uint8_t)code);
        uint8_t back = gpc_f32_to_f8e4m3(v);
        if (v == 0.0f) continue; /* -0 and +0 */
        assert_int_equal(back, code);
    }
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 1);
    for (int i = 0; i < 20000; i++) {
        float x = ldexpf(gpc_rng_normal(&rng), (int)gpc_rng_below(&rng, 24) - 14);
        uint8_t got = gpc_f32_to_f8e4m3(x);
        double best = INFINITY;
        int best_code = -1;
        for (int code = 0; code < 256; code++) {
            if ((code & 0x7f) == 0x7f) continue;
            double d = fabs((double)gpc_f8e4m3_to_f32((uint8_t)code) - (double)x);
            if (d < best || (d == best && best_code >= 0 && (code & 1) == 0 &&
                             gpc_f8e4m3_to_f32((uint8_t)code) != 0.0f))
                best = d, best_code = code;
        }
        double err = fabs((double)gpc_f8e4m3_to_f32(got) - (double)x);
        if (fabsf(x) <= 448.0f) {
            if (err != best)
                fail_msg("x = %.9g encodes to %g, the nearest is %g", (double)x,
                         (double)gpc_f8e4m3_to_f32(got),
                         (double)gpc_f8e4m3_to_f32((uint8_t)best_code));
        } else {
            assert_float_equal(fabsf(gpc_f8e4m3_to_f32(got)), 448.0f, 0); /* saturates */
        }
    }
    assert_int_equal(gpc_f32_to_f8e4m3(1e9f), 0x7e);
    assert_int_equal(gpc_f32_to_f8e4m3(-INFINITY), 0xfe);
    assert_string_equal(gpc_dtype_name(GPC_I8), "i8");
    assert_int_equal(gpc_dtype_size(GPC_F8E4M3), 1);
}

/* --------------------------------------------------------- quantizer */

static void test_quantize_bounds(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 2);
    enum { R = 37, K = 53 };
    static float w[R * K];
    static uint8_t q[R * K];
    float scales[R];
    for (int i = 0; i < R * K; i++)
        w[i] = 0.05f * gpc_rng_normal(&rng) * (1.0f + (float)(i / K)); /* rows of growing size */
    for (int k = 0; k < K; k++)
        w[5 * K + k] = 0.0f; /* a row of zeros: scale 1, all codes 0 */
    const gpt_quant_options *all[3] = {&INT8, &FP8C, &FP8T};
    for (int o = 0; o < 3; o++) {
        const gpt_quant_options *opt = all[o];
        TEST_OK(gpt_quantize_matrix(w, R, K, opt, q, scales, "w"));
        float top = opt->dtype == GPC_I8 ? 127.0f : 448.0f;
        for (int r = 0; r < R; r++) {
            float s = scales[opt->per_channel ? r : 0];
            double amax = 0;
            for (int k = 0; k < K; k++)
                amax = fmax(amax, fabs(w[r * K + k]));
            if (opt->per_channel)
                assert_float_equal(s, amax > 0 ? (float)(amax / top) : 1.0f,
                                   1e-6 * (amax / top + 1e-30));
            for (int k = 0; k < K; k++) {
                double x = w[r * K + k];
                double deq = (double)gpt_quant_value(opt->dtype, q[r * K + k]) * s;
                double err = fabs(deq - x);
                if (opt->dtype == GPC_I8) {
                    if (err > 0.5 * s * (1 + 1e-5))
                        fail_msg("int8 row %d: |w - q s| = %g > s/2 = %g", r, err, 0.5 * s);
                } else {
                    /* normals: half a unit of E4M3's 3-bit mantissa, 2^-4 of
                     * the magnitude; subnormals (|x| / s < 2^-6): half of
                     * 2^-9 */
                    double bound =
                        fabs(x) / s >= ldexp(1, -6) ? ldexp(fabs(x), -4) : ldexp((double)s, -10);
                    if (err > bound * (1 + 1e-5))
                        fail_msg("%s row %d: |w - deq| = %g > %g (w %g)", gpt_quant_name(opt), r,
                                 err, bound, x);
                }
            }
        }
    }
    w[7] = NAN;
    TEST_FAILS(gpt_quantize_matrix(w, R, K, &INT8, q, scales, "fcw of layer 3"),
               GPC_ERR_INVALID_ARG, "fcw of layer 3 holds a non-finite");
    gpt_quant_options parsed;
    TEST_OK(gpt_quant_parse("fp8", "tensor", &parsed));
    assert_int_equal(parsed.dtype, GPC_F8E4M3);
    assert_int_equal(parsed.per_channel, 0);
    TEST_FAILS(gpt_quant_parse("int4", NULL, &parsed), GPC_ERR_INVALID_ARG, "--to int4");
    TEST_FAILS(gpt_quant_parse("int8", "tensor", &parsed), GPC_ERR_INVALID_ARG,
               "per output channel only");
    TEST_FAILS(gpt_quant_parse("fp8", "row", &parsed), GPC_ERR_INVALID_ARG, "--scales row");
}

/* ------------------------------------------------------------ the op */

/* out = [residual +] inp . deq(q)^T [+ bias] in float64 from the same
 * dequantized f32 values the op multiplies. */
static void reference(double *out, const float *inp, const uint8_t *q, const float *scales,
                      int per_channel, gpc_dtype dtype, const float *bias, const float *residual,
                      int N, int C, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            float s = scales[per_channel ? o : 0];
            double acc = 0;
            for (int c = 0; c < C; c++)
                acc += (double)inp[n * C + c] * (double)(gpt_quant_value(dtype, q[o * C + c]) * s);
            out[n * OC + o] = acc + (bias ? bias[o] : 0) + (residual ? residual[n * OC + o] : 0);
        }
}

/* Random operands of an [N, C] x [OC, C] product: inputs and biases
 * normal, codes uniform but never fp8's NaN, scales in [0.001, 0.011). */
static void random_operands(gpc_rng *rng, gpc_dtype dtype, float *inp, uint8_t *q, float *scales,
                            float *bias, int N, int C, int OC) {
    for (int i = 0; i < N * C; i++)
        inp[i] = gpc_rng_normal(rng);
    for (int i = 0; i < OC * C; i++) {
        q[i] = (uint8_t)gpc_rng_below(rng, 256);
        if (dtype == GPC_F8E4M3 && (q[i] & 0x7f) == 0x7f) q[i] ^= 1; /* no NaN codes */
    }
    for (int o = 0; o < OC; o++) {
        scales[o] = 0.001f + 0.01f * (float)gpc_rng_uniform(rng);
        bias[o] = gpc_rng_normal(rng);
    }
}

static void test_op_cpu(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 3);
    const int shapes[][3] = {{1, 16, 32}, {1, 17, 5},  {3, 33, 7},   {5, 64, 48},
                             {7, 1, 9},   {13, 80, 3}, {64, 96, 65}, {2, 5, 1}};
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        int N = shapes[t][0], C = shapes[t][1], OC = shapes[t][2];
        for (int variant = 0; variant < 6; variant++) {
            gpc_dtype dtype = variant % 2 ? GPC_F8E4M3 : GPC_I8;
            int per_channel = variant < 4, with_bias = variant % 3 != 2,
                with_res = variant % 2 == 0;
            float *inp = malloc(sizeof(float) * N * C), *out = malloc(sizeof(float) * N * OC);
            float *res = malloc(sizeof(float) * N * OC), *bias = malloc(sizeof(float) * OC);
            float *scales = malloc(sizeof(float) * OC);
            uint8_t *q = malloc((size_t)OC * C);
            double *want = malloc(sizeof(double) * N * OC);
            random_operands(&rng, dtype, inp, q, scales, bias, N, C, OC);
            for (int i = 0; i < N * OC; i++)
                res[i] = gpc_rng_normal(&rng);
            reference(want, inp, q, scales, per_channel, dtype, with_bias ? bias : NULL,
                      with_res ? res : NULL, N, C, OC);
            gpc_tensor ti = gpc_tensor_2d(inp, GPC_F32, gpc_cpu(), N, C);
            gpc_tensor tq = gpc_tensor_2d(q, dtype, gpc_cpu(), OC, C);
            gpc_tensor ts = gpc_tensor_1d(scales, GPC_F32, gpc_cpu(), per_channel ? OC : 1);
            gpc_tensor tb = gpc_tensor_1d(bias, GPC_F32, gpc_cpu(), OC);
            gpc_tensor tr = gpc_tensor_2d(res, GPC_F32, gpc_cpu(), N, OC);
            /* the residual in place (out aliases it) when there is one */
            gpc_tensor to = gpc_tensor_2d(with_res ? res : out, GPC_F32, gpc_cpu(), N, OC);
            TEST_OK(gpc_op_matmul_quant_forward(&to, &ti, &tq, &ts, with_bias ? &tb : NULL,
                                                with_res ? &tr : NULL));
            char what[96];
            snprintf(what, sizeof what, "%s %dx%dx%d variant %d", gpc_dtype_name(dtype), N, C, OC,
                     variant);
            test_assert_close(what, to.data, want, (size_t)N * OC, 2e-5, 1.0);
            free(inp), free(out), free(res), free(bias), free(scales), free(q), free(want);
        }
    }
}

/* GPT-2's GELU (tanh form) in double. */
static double gelu_ref(double x) {
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

/* matmul_quant_gelu_forward: the product (against the float64 reference)
 * and its GELU, int8 and fp8, with and without bias, odd shapes included;
 * then its refusals. */
static void test_gelu_op_cpu(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 4);
    const int shapes[][3] = {{1, 16, 32}, {3, 33, 7}, {16, 40, 17}, {2, 5, 1}};
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++)
        for (int variant = 0; variant < 4; variant++) {
            int N = shapes[t][0], C = shapes[t][1], OC = shapes[t][2];
            gpc_dtype dtype = variant % 2 ? GPC_F8E4M3 : GPC_I8;
            int with_bias = variant < 2;
            float *inp = malloc(sizeof(float) * N * C), *pre = malloc(sizeof(float) * N * OC);
            float *act = malloc(sizeof(float) * N * OC), *bias = malloc(sizeof(float) * OC);
            float *scales = malloc(sizeof(float) * OC);
            uint8_t *q = malloc((size_t)OC * C);
            double *want = malloc(sizeof(double) * N * OC);
            random_operands(&rng, dtype, inp, q, scales, bias, N, C, OC);
            reference(want, inp, q, scales, 1, dtype, with_bias ? bias : NULL, NULL, N, C, OC);
            gpc_tensor ti = gpc_tensor_2d(inp, GPC_F32, gpc_cpu(), N, C);
            gpc_tensor tq = gpc_tensor_2d(q, dtype, gpc_cpu(), OC, C);
            gpc_tensor ts = gpc_tensor_1d(scales, GPC_F32, gpc_cpu(), OC);
            gpc_tensor tb = gpc_tensor_1d(bias, GPC_F32, gpc_cpu(), OC);
            gpc_tensor tp = gpc_tensor_2d(pre, GPC_F32, gpc_cpu(), N, OC);
            gpc_tensor ta = gpc_tensor_2d(act, GPC_F32, gpc_cpu(), N, OC);
            TEST_OK(
                gpc_op_matmul_quant_gelu_forward(&tp, &ta, &ti, &tq, &ts, with_bias ? &tb : NULL));
            char what[96];
            snprintf(what, sizeof what, "gelu %s %dx%dx%d variant %d", gpc_dtype_name(dtype), N, C,
                     OC, variant);
            test_assert_close(what, pre, want, (size_t)N * OC, 2e-5, 1.0);
            for (int i = 0; i < N * OC; i++)
                want[i] = gelu_ref(want[i]);
            test_assert_close(what, act, want, (size_t)N * OC, 2e-5, 1.0);
            free(inp), free(pre), free(act), free(bias), free(scales), free(q), free(want);
        }
    float x[4] = {0}, y[4], z[4], scales[2] = {1, 1};
    uint8_t q[4] = {0};
    gpc_tensor ti = gpc_tensor_2d(x, GPC_F32, gpc_cpu(), 2, 2);
    gpc_tensor tq = gpc_tensor_2d(q, GPC_I8, gpc_cpu(), 2, 2);
    gpc_tensor ts = gpc_tensor_1d(scales, GPC_F32, gpc_cpu(), 2);
    gpc_tensor ty = gpc_tensor_2d(y, GPC_F32, gpc_cpu(), 2, 2);
    gpc_tensor tz = gpc_tensor_2d(z, GPC_F32, gpc_cpu(), 2, 2);
    gpc_tensor small = gpc_tensor_2d(z, GPC_F32, gpc_cpu(), 1, 2);
    TEST_FAILS(gpc_op_matmul_quant_gelu_forward(&ty, &ty, &ti, &tq, &ts, NULL), GPC_ERR_INVALID_ARG,
               "three buffers");
    TEST_FAILS(gpc_op_matmul_quant_gelu_forward(&ty, &tz, &ti, &ti, &ts, NULL), GPC_ERR_MISMATCH,
               "must be i8 or f8e4m3");
    TEST_FAILS(gpc_op_matmul_quant_gelu_forward(&ty, &small, &ti, &tq, &ts, NULL), GPC_ERR_MISMATCH,
               "'out_gelu'");
}

static void test_op_errors(void **state) {
    (void)state;
    float inp[6], out[6], scales[3], bias[3];
    uint8_t q[6];
    memset(inp, 0, sizeof inp);
    gpc_tensor ti = gpc_tensor_2d(inp, GPC_F32, gpc_cpu(), 3, 2);
    gpc_tensor to = gpc_tensor_2d(out, GPC_F32, gpc_cpu(), 3, 2);
    gpc_tensor tq = gpc_tensor_2d(q, GPC_I8, gpc_cpu(), 2, 2);
    gpc_tensor bad = gpc_tensor_2d(inp, GPC_F32, gpc_cpu(), 2, 2);
    gpc_tensor ts = gpc_tensor_1d(scales, GPC_F32, gpc_cpu(), 2);
    gpc_tensor ts3 = gpc_tensor_1d(scales, GPC_F32, gpc_cpu(), 3);
    gpc_tensor tb = gpc_tensor_1d(bias, GPC_F32, gpc_cpu(), 3);
    gpc_tensor wide = gpc_tensor_2d(q, GPC_I8, gpc_cpu(), 2, 3);
    TEST_FAILS(gpc_op_matmul_quant_forward(&to, &ti, &bad, &ts, NULL, NULL), GPC_ERR_MISMATCH,
               "must be i8 or f8e4m3");
    TEST_FAILS(gpc_op_matmul_quant_forward(&to, &ti, &tq, &ts3, NULL, NULL), GPC_ERR_MISMATCH,
               "'scales'");
    TEST_FAILS(gpc_op_matmul_quant_forward(&to, &ti, &tq, &ts, &tb, NULL), GPC_ERR_MISMATCH,
               "'bias'");
    TEST_FAILS(gpc_op_matmul_quant_forward(&to, &ti, &wide, &ts, NULL, NULL), GPC_ERR_MISMATCH,
               "disagree on C");
    TEST_FAILS(gpc_op_matmul_quant_forward(&ti, &ti, &tq, &ts, NULL, NULL), GPC_ERR_INVALID_ARG,
               "out shares its buffer with inp");
}

/* --------------------------------------------------------- the model */

enum { ML = 2, MNH = 2, MC = 64, MT = 32, MV = 48 };

static gpt_config model_config(void) {
    gpt_config c;
    TEST_OK(gpt_config_init(&c, ML, MNH, MC, MT, MV));
    return c;
}

/* A quantized model's logits equal those of a plain model given the
 * quantized model's dequantized weights (the same f32 products), at every
 * forward entry point the serving engine uses. */
static void test_model_matches_dequantized(void **state) {
    (void)state;
    gpt_config c = model_config();
    size_t P = gpt_config_num_params(&c);
    float *w = malloc(P * sizeof *w), *deq = malloc(P * sizeof *deq);
    gpt_model *plain = NULL, *quant = NULL;
    TEST_OK(gpt_create(&plain, &c, gpc_cpu(), GPC_F32, 2, MT, 0));
    TEST_OK(gpt_init_weights(plain, test_seed()));
    TEST_OK(gpt_get_params(plain, w));
    const gpt_quant_options *all[3] = {&INT8, &FP8C, &FP8T};
    int32_t tok[2 * MT];
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 4);
    for (int i = 0; i < 2 * MT; i++)
        tok[i] = (int32_t)gpc_rng_below(&rng, MV);
    float *a = malloc(sizeof(float) * 2 * MV), *b = malloc(sizeof(float) * 2 * MV);
    for (int o = 0; o < 3; o++) {
        TEST_OK(gpt_create_quant(&quant, &c, gpc_cpu(), GPC_F32, 2, MT, all[o]));
        assert_non_null(gpt_quant_of(quant));
        assert_null(gpt_quant_of(plain));
        assert_false(gpt_is_training(quant));
        TEST_OK(gpt_set_params(quant, w));
        TEST_OK(gpt_get_params(quant, deq));
        /* the dense tensors are exact; the matrices are not */
        for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++) {
            size_t s = gpt_param_offsets(plain)[i],
                   e = i + 1 < GPT_NUM_PARAM_TENSORS ? gpt_param_offsets(plain)[i + 1] : P;
            if (!gpt_param_quantized(i)) assert_memory_equal(w + s, deq + s, (e - s) * 4);
        }
        TEST_OK(gpt_set_params(plain, deq));
        TEST_OK(gpt_forward_last_logits(quant, tok, 2, MT, a));
        TEST_OK(gpt_forward_last_logits(plain, tok, 2, MT, b));
        test_assert_close_f32(gpt_quant_name(all[o]), a, b, 2 * MV, 1e-5, 1e-2);
        /* kept keys and values: the prompt, then one token at a time */
        TEST_OK(gpt_forward_cached(quant, tok, 0, MT - 3, a));
        for (int p = MT - 3; p < MT; p++)
            TEST_OK(gpt_forward_cached(quant, tok + p, p, 1, a));
        TEST_OK(gpt_forward_last_logits(plain, tok, 1, MT, b));
        test_assert_close_f32("cached", a, b, MV, 1e-4, 1e-2);
        /* what a quantized model refuses */
        TEST_FAILS(gpt_checkpoint_save("/nonexistent/x.bin", quant, NULL), GPC_ERR_INVALID_ARG,
                   "quantized");
        gpt_free(quant);
    }
    TEST_FAILS(
        gpt_create_quant(&quant, &c, gpc_cpu(), GPC_F32, 1, 1, &(gpt_quant_options){GPC_I8, 0}),
        GPC_ERR_INVALID_ARG, "per output channel");
    TEST_FAILS(
        gpt_create_quant(&quant, &c, gpc_cpu(), GPC_F32, 1, 1, &(gpt_quant_options){GPC_BF16, 1}),
        GPC_ERR_INVALID_ARG, "int8 or fp8");
    gpt_free(plain);
    free(w), free(deq), free(a), free(b);
}

/* A first-order Markov chain over the vocabulary with 3 likely successors
 * per token: structure a small model learns in a few hundred steps. */
static void markov_tokens(uint32_t *out, size_t n, uint64_t seed) {
    gpc_rng rng;
    gpc_rng_seed(&rng, seed, 5);
    uint32_t t = 0;
    for (size_t i = 0; i < n; i++) {
        out[i] = t;
        uint32_t pick = (uint32_t)gpc_rng_below(&rng, 10);
        uint32_t step = pick < 6 ? 1 : pick < 9 ? 7 : 20;
        t = (t * 5 + step) % MV;
    }
}

/* Perplexity on held-out text before and after quantization, of a model
 * trained here: a random model's logits are near uniform and its
 * perplexity barely moves under any error, which would prove nothing. */
static void test_perplexity_after_quantization(void **state) {
    (void)state;
    gpt_config c = model_config();
    enum { B = 8, STEPS = 300 };
    size_t train_n = 40000, val_n = 2049;
    uint32_t *train = malloc(train_n * sizeof *train), *val = malloc(val_n * sizeof *val);
    markov_tokens(train, train_n, 11);
    markov_tokens(val, val_n, 12);
    gpt_model *m = NULL;
    TEST_OK(gpt_create(&m, &c, gpc_cpu(), GPC_F32, B, MT, 1));
    TEST_OK(gpt_init_weights(m, 1));
    gpc_optim_options o;
    gpc_optim_defaults(&o);
    o.learning_rate = 3e-3f;
    o.weight_decay = 0.0f;
    int32_t in[B * MT], tg[B * MT];
    gpc_rng rng;
    gpc_rng_seed(&rng, 6, 6);
    for (int step = 1; step <= STEPS; step++) {
        for (int b = 0; b < B; b++) {
            size_t at = gpc_rng_below(&rng, train_n - MT - 1);
            for (int t = 0; t < MT; t++) {
                in[b * MT + t] = (int32_t)train[at + t];
                tg[b * MT + t] = (int32_t)train[at + t + 1];
            }
        }
        TEST_OK(gpt_zero_grad(m));
        TEST_OK(gpt_forward_backward(m, in, tg, B, MT, 1.0f / (B * MT)));
        o.step = step;
        TEST_OK(gpt_update(m, &o, NULL, NULL));
    }
    size_t P = gpt_config_num_params(&c);
    float *w = malloc(P * sizeof *w);
    TEST_OK(gpt_get_params(m, w));
    gpt_free(m);
    gpt_model *plain = NULL;
    TEST_OK(gpt_create(&plain, &c, gpc_cpu(), GPC_F32, 1, MT, 0));
    TEST_OK(gpt_set_params(plain, w));
    gpc_eval_result base;
    TEST_OK(gpc_eval_tokens(plain, &c, MT, val, val_n, NULL, &base));
    gpt_free(plain);
    /* trained: far below the uniform perplexity of 48 (the chain's own is
     * e^0.90 = 2.46) */
    print_message("trained perplexity %.4f\n", base.perplexity);
    assert_true(base.perplexity < 4.0);
    const gpt_quant_options *all[3] = {&INT8, &FP8C, &FP8T};
    for (int q = 0; q < 3; q++) {
        gpt_model *qm = NULL;
        gpc_eval_result r;
        TEST_OK(gpt_create_quant(&qm, &c, gpc_cpu(), GPC_F32, 1, MT, all[q]));
        TEST_OK(gpt_set_params(qm, w));
        TEST_OK(gpc_eval_tokens(qm, &c, MT, val, val_n, NULL, &r));
        gpt_free(qm);
        double change = r.perplexity / base.perplexity - 1.0;
        print_message("%s: perplexity %.4f (%+.3f%%)\n", gpt_quant_name(all[q]), r.perplexity,
                      100 * change);
        if (fabs(change) >= 0.01)
            fail_msg("%s changes the perplexity by %.3f%%, not under 1%%", gpt_quant_name(all[q]),
                     100 * change);
    }
    free(w), free(train), free(val);
}

/* ------------------------------------------------------------ files */

static void write_run(const char *dir, const gpt_config *c, const float *w) {
    TEST_OK(gpc_mkdir_p(dir));
    TEST_OK(gpc_run_save_weights(dir, c, w));
}

static void test_quant_file_and_run(void **state) {
    (void)state;
    char *tmp = test_tmpdir("quant");
    char run[1024], out[1024], path[1200], again[1024];
    snprintf(run, sizeof run, "%s/run", tmp);
    snprintf(out, sizeof out, "%s/run8", tmp);
    gpt_config c = model_config();
    size_t P = gpt_config_num_params(&c);
    float *w = malloc(P * sizeof *w), *got = malloc(P * sizeof *got), *want = malloc(P * 4);
    gpt_model *plain = NULL;
    TEST_OK(gpt_create(&plain, &c, gpc_cpu(), GPC_F32, 1, MT, 0));
    TEST_OK(gpt_init_weights(plain, 3));
    TEST_OK(gpt_get_params(plain, w));
    gpt_free(plain);
    write_run(run, &c, w);
    /* a tokenizer file travels along, byte for byte */
    snprintf(path, sizeof path, "%s/tokenizer.bin", run);
    TEST_OK(gpc_write_file(path, "tok", 3));

    gpc_quantize_summary sum;
    TEST_OK(gpc_quantize_run(run, out, &FP8T, &sum));
    assert_true(sum.relative_error > 0 && sum.relative_error < 0.05);
    assert_true(sum.quant_bytes < sum.bf16_bytes);
    snprintf(path, sizeof path, "%s/tokenizer.bin", out);
    assert_true(gpc_path_exists(path));
    snprintf(path, sizeof path, "%s/quant.bin", out);
    gpt_config rc;
    gpt_quant_options rq;
    gpc_dtype source;
    TEST_OK(gpt_quant_read_header(path, &rc, &rq, &source));
    assert_true(gpt_config_equal(&rc, &c, "file"));
    assert_int_equal(rq.dtype, GPC_F8E4M3);
    assert_int_equal(rq.per_channel, 0);
    assert_int_equal(source, GPC_F32);
    /* loaded through the run folder: the same values as quantized in memory */
    gpt_model *loaded = NULL, *direct = NULL;
    TEST_OK(gpt_create_from_run(&loaded, out, gpc_cpu(), GPC_F32, 1, MT));
    TEST_OK(gpt_get_params(loaded, got));
    TEST_OK(gpt_create_quant(&direct, &c, gpc_cpu(), GPC_F32, 1, MT, &FP8T));
    TEST_OK(gpt_set_params(direct, w));
    TEST_OK(gpt_get_params(direct, want));
    assert_memory_equal(got, want, P * sizeof *got);
    gpt_free(loaded);
    /* a quantized run is not a checkpoint: training and exporting say why */
    snprintf(path, sizeof path, "%s/checkpoint.bin", out);
    TEST_FAILS(gpt_checkpoint_read_header(path, &rc, NULL, NULL), GPC_ERR_INVALID_ARG,
               "inference only");
    /* a wrong model for the file */
    gpt_model *other = NULL;
    snprintf(path, sizeof path, "%s/quant.bin", out);
    TEST_OK(gpt_create_quant(&other, &c, gpc_cpu(), GPC_F32, 1, MT, &INT8));
    TEST_FAILS(gpt_quant_load(path, other), GPC_ERR_MISMATCH, "fp8/tensor");
    gpt_free(other);
    TEST_OK(gpt_quant_load(path, direct));
    gpt_free(direct);

    /* damaged files: a flipped byte, a cut, another file */
    char *bytes;
    size_t size;
    TEST_OK(gpc_read_file(path, &bytes, &size));
    char bad[1200];
    snprintf(bad, sizeof bad, "%s/bad.bin", tmp);
    bytes[size / 2] ^= 0x10;
    TEST_OK(gpc_write_file(bad, bytes, size));
    TEST_FAILS(gpt_quant_read_header(bad, NULL, NULL, NULL), GPC_ERR_FORMAT, "corrupt");
    bytes[size / 2] ^= 0x10;
    TEST_OK(gpc_write_file(bad, bytes, size - 100));
    TEST_FAILS(gpt_quant_read_header(bad, NULL, NULL, NULL), GPC_ERR_FORMAT, "truncated");
    TEST_OK(gpc_write_file(bad, "GPCCKPT", 8));
    TEST_FAILS(gpt_quant_read_header(bad, NULL, NULL, NULL), GPC_ERR_FORMAT, "GPCQUANT");
    bytes[8] = 9; /* version */
    TEST_OK(gpc_write_file(bad, bytes, size));
    TEST_FAILS(gpt_quant_read_header(bad, NULL, NULL, NULL), GPC_ERR_FORMAT, "version 9");
    gpc_free(bytes);

    /* bad input to gpc quantize */
    snprintf(again, sizeof again, "%s/again", tmp);
    TEST_FAILS(gpc_quantize_run(out, again, &INT8, NULL), GPC_ERR_INVALID_ARG, "already quantized");
    snprintf(again, sizeof again, "%s/missing", tmp);
    TEST_FAILS(gpc_quantize_run(again, out, &INT8, NULL), GPC_ERR_IO, "does not exist");
    TEST_FAILS(gpc_quantize_run(run, out, &INT8, NULL), GPC_ERR_INVALID_ARG, "not an empty folder");
    snprintf(again, sizeof again, "%s/empty", tmp);
    TEST_OK(gpc_mkdir_p(again));
    TEST_OK(gpc_quantize_run(run, again, &INT8, NULL)); /* an empty folder is replaced */
    snprintf(path, sizeof path, "%s/quant.bin", again);
    assert_true(gpc_path_exists(path));
    snprintf(path, sizeof path, "%s/checkpoint.bin", run);
    remove(path);
    snprintf(again, sizeof again, "%s/fresh", tmp);
    TEST_FAILS(gpc_quantize_run(run, again, &INT8, NULL), GPC_ERR_IO, "no checkpoint.bin");
    assert_false(gpc_path_exists(again));
    free(w), free(got), free(want);
    test_rmtree(tmp);
    gpc_free(tmp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f8e4m3_round_trip),
        cmocka_unit_test(test_quantize_bounds),
        cmocka_unit_test(test_op_cpu),
        cmocka_unit_test(test_op_errors),
        cmocka_unit_test(test_gelu_op_cpu),
        cmocka_unit_test(test_model_matches_dequantized),
        cmocka_unit_test(test_perplexity_after_quantization),
        cmocka_unit_test(test_quant_file_and_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
