/*
 * test_cuda_cudnn.c: cuDNN's fused attention (the path GPC_ATTENTION=cudnn,
 * src/cuda/attention_cudnn.cu) against gpc's own CUDA kernels and against
 * the CPU op, on fresh random inputs.
 *
 * Every case draws q, k, v and dout, rounds them to the dtype under test (so
 * the CPU, in f32, sees exactly the GPU's inputs), and checks:
 *   forward   out of cuDNN against the CPU and against gpc's kernel (2e-2 of
 *             the RMS per element, the rounding of P to 8 bits before P V);
 *             lse of cuDNN against gpc's kernel and the CPU within 1e-3
 *             (both sum in f32; lse is the statistic backward relies on);
 *   backward  dqkv of cuDNN from the CPU's forward against the CPU and gpc
 *             (5e-2 of the RMS per element, 1e-2 over the tensor);
 *   mixing    cuDNN's forward with gpc's backward and the reverse, which
 *             must agree with the CPU as well, since both write one lse.
 * Outputs are poisoned with NaN before each run (all bytes 0xFF), so an
 * element a path forgets to write fails. Shapes include odd T (77, 1000)
 * and B=1. Plans must be cached (a shape seen twice builds nothing new).
 *
 * The model check trains a tiny GPT a few steps with the cudnn path and the
 * gpc path from the same weights and tokens; the losses agree within bf16
 * noise (1e-2 relative).
 *
 * Exit 77 (skipped) without a GPU, or when this gpc was built without
 * cuDNN (after checking that GPC_ATTENTION=cudnn then says so). When the
 * cuDNN headers were found at build time, a GPU is here and libcudnn fails
 * to load, the test fails: the path the build promised is not there.
 */
#include "testutil.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/attention_cudnn.h"
#include "cuda/attention_sm90.h"
#include "gpc/model.h"
#include "ops/ops.h"

static gpc_rng rng;
static const gpc_device gpu = {GPC_DEVICE_CUDA, 0};

static void set_path(const char *name) {
    TEST_OK(gpc_op_set_attention_path(name));
}

/* A device tensor holding host (f32) values, converted to dtype. */
static gpc_tensor upload(gpc_dtype dtype, int ndim, const int64_t *shape, const float *host) {
    gpc_tensor t, h, staged;
    TEST_OK(gpc_tensor_alloc(&t, dtype, gpu, ndim, shape));
    h = gpc_tensor_make((void *)host, GPC_F32, gpc_cpu(), ndim, shape);
    TEST_OK(gpc_tensor_alloc(&staged, GPC_F32, gpu, ndim, shape));
    TEST_OK(gpc_tensor_copy(&staged, &h));
    TEST_OK(gpc_op_convert(&t, &staged));
    gpc_tensor_free(&staged);
    return t;
}

/* A device tensor of NaN (0xFF bytes are NaN in f32, bf16 and f16). */
static gpc_tensor poisoned(gpc_dtype dtype, int ndim, const int64_t *shape) {
    gpc_tensor t;
    TEST_OK(gpc_tensor_alloc(&t, dtype, gpu, ndim, shape));
    assert_int_equal(cudaMemset(t.data, 0xff, gpc_tensor_bytes(&t)), 0);
    return t;
}

static void poison(gpc_tensor *t) {
    assert_int_equal(cudaMemset(t->data, 0xff, gpc_tensor_bytes(t)), 0);
}

/* The tensor's values as f32 on the host (malloc'd). */
static float *download(const gpc_tensor *t) {
    int64_t n = gpc_tensor_numel(t);
    gpc_tensor wide, host;
    TEST_OK(gpc_tensor_alloc(&wide, GPC_F32, gpu, t->ndim, t->shape));
    TEST_OK(gpc_op_convert(&wide, t));
    float *out = malloc((size_t)n * sizeof(float) + 4);
    host = gpc_tensor_make(out, GPC_F32, gpc_cpu(), t->ndim, t->shape);
    TEST_OK(gpc_tensor_copy(&host, &wide));
    gpc_tensor_free(&wide);
    return out;
}

static double rms_of(const float *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return sqrt(s / (double)(n ? n : 1));
}

/* got against want, per element relative to max(|want|, RMS of want), and,
 * when norm_tol > 0, ||got - want|| / ||want|| over the whole tensor. */
static void expect_close(const char *what, const float *got, const float *want, int64_t n,
                         double tol, double norm_tol) {
    double rms = rms_of(want, n);
    test_assert_close_f32(what, got, want, (size_t)n, tol, rms > 1e-30 ? rms : 1e-30);
    if (norm_tol > 0) {
        double num = 0, den = 0;
        for (int64_t i = 0; i < n; i++) {
            num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
            den += (double)want[i] * want[i];
        }
        double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        if (!(rel <= norm_tol))
            fail_msg("%s: norm-wise relative error %.3g > %.3g", what, rel, norm_tol);
    }
}

static void expect_device(const char *what, const gpc_tensor *got, const float *want, double tol,
                          double norm_tol) {
    float *g = download(got);
    expect_close(what, g, want, gpc_tensor_numel(got), tol, norm_tol);
    free(g);
}

/* ------------------------------------------------------------ op level */

static void compare_case(gpc_dtype dt, int64_t B, int64_t T, int NH, int64_t hs) {
    int64_t C = NH * hs;
    int64_t s_qkv[3] = {B, T, 3 * C}, s_o[3] = {B, T, C}, s_l[3] = {B, NH, T};
    int64_t n_qkv = B * T * 3 * C, n_o = B * T * C, n_l = B * NH * T;
    char what[160];
    float *hq = test_random_floats_as(&rng, dt, n_qkv, -2, 2);
    float *hdo = test_random_floats_as(&rng, dt, n_o, -1, 1);

    /* the CPU's forward and backward: the reference */
    gpc_tensor cq = gpc_tensor_make(hq, GPC_F32, gpc_cpu(), 3, s_qkv);
    gpc_tensor cdo = gpc_tensor_make(hdo, GPC_F32, gpc_cpu(), 3, s_o);
    gpc_tensor co, cl, cdq;
    TEST_OK(gpc_tensor_alloc(&co, GPC_F32, gpc_cpu(), 3, s_o));
    TEST_OK(gpc_tensor_alloc(&cl, GPC_F32, gpc_cpu(), 3, s_l));
    TEST_OK(gpc_tensor_alloc(&cdq, GPC_F32, gpc_cpu(), 3, s_qkv));
    TEST_OK(gpc_op_attention_forward(&co, &cl, &cq, NH));
    float *ref_out = co.data, *ref_lse = cl.data;
    for (int64_t i = 0; i < n_o; i++) /* the GPU's backward sees out rounded to dt */
        ref_out[i] = test_round_to(dt, ref_out[i]);
    TEST_OK(gpc_op_attention_backward(&cdq, &cdo, &cq, &co, &cl, NH));
    const float *ref_dqkv = cdq.data;

    gpc_tensor q = upload(dt, 3, s_qkv, hq), dout = upload(dt, 3, s_o, hdo);
    gpc_tensor out_c = poisoned(dt, 3, s_o), lse_c = poisoned(GPC_F32, 3, s_l);
    gpc_tensor out_g = poisoned(dt, 3, s_o), lse_g = poisoned(GPC_F32, 3, s_l);

    /* forward: each path, the same inputs */
    set_path("cudnn");
    TEST_OK(gpc_op_attention_forward(&out_c, &lse_c, &q, NH));
    set_path("gpc");
    TEST_OK(gpc_op_attention_forward(&out_g, &lse_g, &q, NH));
    assert_int_equal(cudaDeviceSynchronize(), 0);
    float *o_c = download(&out_c), *o_g = download(&out_g);
    float *l_c = download(&lse_c), *l_g = download(&lse_g);
    snprintf(what, sizeof what, "cuDNN out vs CPU (%s B=%lld T=%lld NH=%d hs=%lld)",
             gpc_dtype_name(dt), (long long)B, (long long)T, NH, (long long)hs);
    expect_close(what, o_c, ref_out, n_o, 2e-2, 0);
    snprintf(what, sizeof what, "cuDNN out vs gpc (%s T=%lld)", gpc_dtype_name(dt), (long long)T);
    expect_close(what, o_c, o_g, n_o, 2e-2, 0);
    /* lse: natural log of each row's sum of exp(scaled scores), ~log T in
     * size; 1e-3 relative to max(|lse|, 1) */
    snprintf(what, sizeof what, "cuDNN lse vs gpc (%s T=%lld)", gpc_dtype_name(dt), (long long)T);
    test_assert_close_f32(what, l_c, l_g, (size_t)n_l, 1e-3, 1.0);
    snprintf(what, sizeof what, "cuDNN lse vs CPU (%s T=%lld)", gpc_dtype_name(dt), (long long)T);
    test_assert_close_f32(what, l_c, ref_lse, (size_t)n_l, 1e-3, 1.0);

    /* backward from the CPU's forward, so both paths see one input */
    gpc_tensor o_ref = upload(dt, 3, s_o, ref_out), l_ref = upload(GPC_F32, 3, s_l, ref_lse);
    gpc_tensor dq_c = poisoned(dt, 3, s_qkv), dq_g = poisoned(dt, 3, s_qkv);
    set_path("cudnn");
    TEST_OK(gpc_op_attention_backward(&dq_c, &dout, &q, &o_ref, &l_ref, NH));
    set_path("gpc");
    TEST_OK(gpc_op_attention_backward(&dq_g, &dout, &q, &o_ref, &l_ref, NH));
    float *d_c = download(&dq_c), *d_g = download(&dq_g);
    snprintf(what, sizeof what, "cuDNN dqkv vs CPU (%s B=%lld T=%lld NH=%d hs=%lld)",
             gpc_dtype_name(dt), (long long)B, (long long)T, NH, (long long)hs);
    expect_close(what, d_c, ref_dqkv, n_qkv, 5e-2, 1e-2);
    snprintf(what, sizeof what, "cuDNN dqkv vs gpc (%s T=%lld)", gpc_dtype_name(dt), (long long)T);
    expect_close(what, d_c, d_g, n_qkv, 5e-2, 1e-2);

    /* mixing: cuDNN's forward, gpc's backward; gpc's forward, cuDNN's backward.
     * The backward now starts from one path's bf16 output rather than the
     * CPU's, so D = rowsum(dO * O) carries that output's rounding into
     * dS = P (dP - D), where it meets cancellation: single elements may be
     * off by up to 1e-1 of the RMS, the tensor as a whole stays at 1e-2. */
    poison(&dq_g);
    set_path("gpc");
    TEST_OK(gpc_op_attention_backward(&dq_g, &dout, &q, &out_c, &lse_c, NH));
    snprintf(what, sizeof what, "cuDNN forward + gpc backward vs CPU (T=%lld)", (long long)T);
    expect_device(what, &dq_g, ref_dqkv, 1e-1, 1e-2);
    poison(&dq_c);
    set_path("cudnn");
    TEST_OK(gpc_op_attention_backward(&dq_c, &dout, &q, &out_g, &lse_g, NH));
    snprintf(what, sizeof what, "gpc forward + cuDNN backward vs CPU (T=%lld)", (long long)T);
    expect_device(what, &dq_c, ref_dqkv, 1e-1, 1e-2);

    /* the same shape again builds nothing new */
    gpc_cudnn_attention_stats before, after;
    gpc_cudnn_attention_get_stats(&before);
    poison(&out_c);
    TEST_OK(gpc_op_attention_forward(&out_c, &lse_c, &q, NH));
    TEST_OK(gpc_op_attention_backward(&dq_c, &dout, &q, &o_ref, &l_ref, NH));
    gpc_cudnn_attention_get_stats(&after);
    assert_int_equal(after.plans, before.plans);
    assert_true(after.workspace_bytes > 0);
    expect_device("cuDNN out, second call", &out_c, ref_out, 2e-2, 0);
    set_path(NULL);

    free(o_c), free(o_g), free(l_c), free(l_g), free(d_c), free(d_g);
    gpc_tensor *all[] = {&co,    &cl,    &cdq,   &q,     &dout, &out_c, &lse_c,
                         &out_g, &lse_g, &o_ref, &l_ref, &dq_c, &dq_g};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        gpc_tensor_free(all[i]);
    free(hq);
    free(hdo);
}

static void test_cudnn_matches(void **state) {
    (void)state;
    compare_case(GPC_BF16, 2, 256, 2, 64);
    compare_case(GPC_BF16, 1, 1000, 2, 64); /* T not a multiple of any tile */
    compare_case(GPC_F16, 1, 77, 3, 64);
    compare_case(GPC_BF16, 3, 64, 4, 32);   /* another head size (gpc: the simple kernel) */
    compare_case(GPC_BF16, 1, 130, 1, 128); /* the largest head size cuDNN's backward takes */
}

/* auto must always run, prepared or not, whatever cuDNN makes of the shape
 * (T=1: one key). */
static void test_auto_always_runs(void **state) {
    (void)state;
    int64_t s_qkv[3] = {1, 1, 3 * 64}, s_o[3] = {1, 1, 64}, s_l[3] = {1, 1, 1};
    float *hq = test_random_floats_as(&rng, GPC_BF16, 3 * 64, -2, 2);
    gpc_tensor q = upload(GPC_BF16, 3, s_qkv, hq);
    gpc_tensor out = poisoned(GPC_BF16, 3, s_o), lse = poisoned(GPC_F32, 3, s_l);
    set_path("auto");
    TEST_OK(gpc_op_attention_prepare(&q, 1, 0));
    TEST_OK(gpc_op_attention_forward(&out, &lse, &q, 1));
    /* one key: the output is v itself and lse the one scaled score */
    float *o = download(&out), *l = download(&lse);
    double score = 0;
    for (int i = 0; i < 64; i++)
        score += (double)hq[i] * hq[64 + i];
    score /= 8.0;
    expect_close("auto, T=1: out = v", o, hq + 128, 64, 1e-2, 0);
    test_assert_close_f32("auto, T=1: lse = q.k/sqrt(hs)", l, &(float){(float)score}, 1, 1e-3, 1.0);
    set_path(NULL);
    free(o), free(l), free(hq);
    gpc_tensor_free(&q), gpc_tensor_free(&out), gpc_tensor_free(&lse);
}

/* auto builds plans only through gpc_op_attention_prepare (a model's shapes,
 * at gpt_create); an unprepared shape runs gpc's kernels and builds nothing.
 * On Hopper, a prepared shape then runs cuDNN: the same bits as cudnn by name. */
static void test_auto_uses_prepared_shapes(void **state) {
    (void)state;
    int64_t B = 1, T = 48, NH = 2, hs = 64, C = NH * hs;
    int64_t s_qkv[3] = {B, T, 3 * C}, s_o[3] = {B, T, C}, s_l[3] = {B, NH, T};
    float *hq = test_random_floats_as(&rng, GPC_BF16, B * T * 3 * C, -2, 2);
    gpc_tensor q = upload(GPC_BF16, 3, s_qkv, hq);
    gpc_tensor out = poisoned(GPC_BF16, 3, s_o), lse = poisoned(GPC_F32, 3, s_l);
    gpc_tensor out_c = poisoned(GPC_BF16, 3, s_o), lse_c = poisoned(GPC_F32, 3, s_l);
    gpc_tensor cq = gpc_tensor_make(hq, GPC_F32, gpc_cpu(), 3, s_qkv), co, cl;
    TEST_OK(gpc_tensor_alloc(&co, GPC_F32, gpc_cpu(), 3, s_o));
    TEST_OK(gpc_tensor_alloc(&cl, GPC_F32, gpc_cpu(), 3, s_l));
    TEST_OK(gpc_op_attention_forward(&co, &cl, &cq, (int)NH));
    int major = 0;
    assert_int_equal(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), 0);

    gpc_cudnn_attention_stats a, b, c;
    set_path("auto");
    gpc_cudnn_attention_get_stats(&a);
    TEST_OK(gpc_op_attention_forward(&out, &lse, &q, (int)NH));
    gpc_cudnn_attention_get_stats(&b);
    assert_int_equal(b.plans, a.plans); /* not prepared: nothing built */
    expect_device("auto, unprepared shape: out vs CPU", &out, co.data, 2e-2, 0);
    TEST_OK(gpc_op_attention_prepare(&q, (int)NH, 1));
    gpc_cudnn_attention_get_stats(&c);
    assert_int_equal(c.plans, a.plans + (major >= 9 ? 2 : 0));
    poison(&out);
    TEST_OK(gpc_op_attention_forward(&out, &lse, &q, (int)NH));
    expect_device("auto, prepared shape: out vs CPU", &out, co.data, 2e-2, 0);
    if (major >= 9) {
        set_path("cudnn");
        TEST_OK(gpc_op_attention_forward(&out_c, &lse_c, &q, (int)NH));
        float *x = download(&out), *y = download(&out_c);
        assert_memory_equal(x, y, (size_t)(B * T * C) * sizeof(float));
        free(x), free(y);
    }
    set_path(NULL);
    gpc_tensor *all[] = {&q, &out, &lse, &out_c, &lse_c, &co, &cl};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        gpc_tensor_free(all[i]);
    free(hq);
}

/* Under auto a prepared shape's backward is gpc's wgmma backward after
 * cuDNN's forward on a GPU the wgmma kernel serves (GPC_ATTENTION_BWD unset,
 * auto or wgmma; read once a process), and prepare builds only cuDNN's
 * forward plan; it is cuDNN's backward otherwise or with
 * GPC_ATTENTION_BWD=two (the ctest variant gpu_test_cuda_cudnn_attention_two),
 * both plans built. Either way the CPU's gradients. */
static void test_auto_backward_route(void **state) {
    (void)state;
    /* a shape no other test builds plans for, so that prepare's count shows */
    int64_t B = 2, T = 384, NH = 2, hs = 64, C = NH * hs;
    int64_t s_qkv[3] = {B, T, 3 * C}, s_o[3] = {B, T, C}, s_l[3] = {B, NH, T};
    float *hq = test_random_floats_as(&rng, GPC_BF16, B * T * 3 * C, -2, 2);
    float *hdo = test_random_floats_as(&rng, GPC_BF16, B * T * C, -1, 1);
    gpc_tensor cq = gpc_tensor_make(hq, GPC_F32, gpc_cpu(), 3, s_qkv);
    gpc_tensor cdo = gpc_tensor_make(hdo, GPC_F32, gpc_cpu(), 3, s_o), co, cl, cdq;
    TEST_OK(gpc_tensor_alloc(&co, GPC_F32, gpc_cpu(), 3, s_o));
    TEST_OK(gpc_tensor_alloc(&cl, GPC_F32, gpc_cpu(), 3, s_l));
    TEST_OK(gpc_tensor_alloc(&cdq, GPC_F32, gpc_cpu(), 3, s_qkv));
    TEST_OK(gpc_op_attention_forward(&co, &cl, &cq, (int)NH));
    TEST_OK(gpc_op_attention_backward(&cdq, &cdo, &cq, &co, &cl, (int)NH));

    gpc_tensor q = upload(GPC_BF16, 3, s_qkv, hq), dout = upload(GPC_BF16, 3, s_o, hdo);
    gpc_tensor out = poisoned(GPC_BF16, 3, s_o), lse = poisoned(GPC_F32, 3, s_l);
    gpc_tensor dq = poisoned(GPC_BF16, 3, s_qkv);
    const char *bwd = gpc_setting_str("GPC_ATTENTION_BWD");
    int on = (!bwd || !*bwd || !strcmp(bwd, "auto") || !strcmp(bwd, "wgmma")) &&
             gpc_cuda_attention_sm90_serves((int)T);
    int major = 0;
    assert_int_equal(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), 0);
    gpc_cudnn_attention_stats a, b;
    set_path("auto");
    gpc_cudnn_attention_get_stats(&a);
    TEST_OK(gpc_op_attention_prepare(&q, (int)NH, 1));
    gpc_cudnn_attention_get_stats(&b);
    printf("  plans built by prepare: %lld\n", (long long)(b.plans - a.plans));
    assert_int_equal(b.plans - a.plans, major < 9 ? 0 : on ? 1 : 2);
    long before = gpc_cuda_attention_sm90_calls();
    TEST_OK(gpc_op_attention_forward(&out, &lse, &q, (int)NH));
    TEST_OK(gpc_op_attention_backward(&dq, &dout, &q, &out, &lse, (int)NH));
    /* from the GPU's bf16 forward, as in the mixing checks of compare_case */
    expect_device("auto backward vs CPU (B=2 T=384)", &dq, cdq.data, 1e-1, 1e-2);
    long ran = gpc_cuda_attention_sm90_calls() - before;
    printf("  auto backward on wgmma: %ld (%s)\n", ran, on ? "on" : "off");
    assert_int_equal(ran, on ? 1 : 0);
    set_path(NULL);
    gpc_tensor *all[] = {&co, &cl, &cdq, &q, &dout, &out, &lse, &dq};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        gpc_tensor_free(all[i]);
    free(hq), free(hdo);
}

/* prepare builds both plans of a shape once, and the workspace with them. */
static void test_prepare_caches(void **state) {
    (void)state;
    int64_t s_qkv[3] = {2, 96, 3 * 128};
    gpc_tensor q = poisoned(GPC_BF16, 3, s_qkv);
    set_path("cudnn");
    gpc_cudnn_attention_stats a, b, c;
    gpc_cudnn_attention_get_stats(&a);
    TEST_OK(gpc_op_attention_prepare(&q, 2, 1));
    gpc_cudnn_attention_get_stats(&b);
    assert_int_equal(b.plans, a.plans + 2);                        /* forward and backward */
    assert_true(b.workspace_bytes >= (size_t)2 * 2 * 96 * 64 * 4); /* at least dQ in f32 */
    TEST_OK(gpc_op_attention_prepare(&q, 2, 1));
    gpc_cudnn_attention_get_stats(&c);
    assert_int_equal(c.plans, b.plans);
    set_path(NULL);
    gpc_tensor_free(&q);
}

/* ---------------------------------------------------------------- errors */

static void test_errors(void **state) {
    (void)state;
    int64_t s_qkv[3] = {1, 16, 3 * 64}, s_o[3] = {1, 16, 64}, s_l[3] = {1, 1, 16};
    /* f32 is gpc's kernels' only: asking cuDNN for it is an error, not a
     * silent fallback */
    gpc_tensor q32 = poisoned(GPC_F32, 3, s_qkv), o32 = poisoned(GPC_F32, 3, s_o);
    gpc_tensor lse = poisoned(GPC_F32, 3, s_l);
    set_path("cudnn");
    TEST_FAILS(gpc_op_attention_forward(&o32, &lse, &q32, 1), GPC_ERR_UNSUPPORTED, "bf16 or fp16");
    /* a head size cuDNN's engines do not take */
    int64_t s_q20[3] = {1, 16, 3 * 40}, s_o20[3] = {1, 16, 40}, s_l20[3] = {1, 2, 16};
    gpc_tensor q20 = poisoned(GPC_BF16, 3, s_q20), o20 = poisoned(GPC_BF16, 3, s_o20);
    gpc_tensor l20 = poisoned(GPC_F32, 3, s_l20);
    TEST_FAILS(gpc_op_attention_forward(&o20, &l20, &q20, 2), GPC_ERR_UNSUPPORTED, "multiple of 8");
    /* a misaligned view of qkv (one element in) */
    int64_t s_big[3] = {1, 17, 3 * 64};
    gpc_tensor big = poisoned(GPC_BF16, 3, s_big), o16 = poisoned(GPC_BF16, 3, s_o);
    gpc_tensor view = gpc_tensor_make((char *)big.data + 2, GPC_BF16, gpu, 3, s_qkv);
    TEST_FAILS(gpc_op_attention_forward(&o16, &lse, &view, 1), GPC_ERR_UNSUPPORTED, "aligned");
    /* a bad name, set or from the environment */
    TEST_FAILS(gpc_op_set_attention_path("fast"), GPC_ERR_INVALID_ARG, "auto, gpc, cudnn");
    set_path(NULL);
    setenv("GPC_ATTENTION", "cudnn9", 1);
    TEST_FAILS(gpc_op_attention_forward(&o16, &lse, &view, 1), GPC_ERR_INVALID_ARG,
               "GPC_ATTENTION");
    unsetenv("GPC_ATTENTION");
    gpc_tensor *all[] = {&q32, &o32, &lse, &q20, &o20, &l20, &big, &o16};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        gpc_tensor_free(all[i]);
}

/* ---------------------------------------------------------- model level */

/* The losses of `steps` AdamW steps on a tiny GPT (head size 64, bf16). */
static void train_losses(float *losses, int steps, uint64_t seed) {
    gpt_config config;
    TEST_OK(gpt_config_init(&config, 2, 2, 128, 64, 300));
    const int B = 4, T = 64;
    gpt_model *m = NULL;
    TEST_OK(gpt_create(&m, &config, gpu, GPC_BF16, B, T, 1));
    TEST_OK(gpt_init_weights(m, seed));
    gpc_rng tokens;
    gpc_rng_seed(&tokens, seed, 11);
    int32_t inputs[4 * 64], targets[4 * 64];
    gpc_optim_options options;
    gpc_optim_defaults(&options);
    options.learning_rate = 3e-3f;
    options.seed = 7;
    for (int step = 0; step < steps; step++) {
        for (int i = 0; i < B * T; i++) { /* a learnable pattern: next = prev + 1 */
            inputs[i] = (int32_t)gpc_rng_below(&tokens, 300);
            targets[i] = (inputs[i] + 1) % 300;
        }
        TEST_OK(gpt_zero_grad(m));
        TEST_OK(gpt_forward_backward(m, inputs, targets, B, T, 1.0f / (float)(B * T)));
        TEST_OK(gpt_mean_loss(m, &losses[step]));
        TEST_OK(gpt_update(m, &options, NULL, NULL));
    }
    gpt_free(m);
}

static void test_model_losses_match(void **state) {
    (void)state;
    enum { STEPS = 6 };
    float with_cudnn[STEPS], with_gpc[STEPS];
    uint64_t seed = gpc_rng_u32(&rng);
    gpc_cudnn_attention_stats before, after;
    gpc_cudnn_attention_get_stats(&before);
    setenv("GPC_ATTENTION", "cudnn", 1); /* the environment's way */
    train_losses(with_cudnn, STEPS, seed);
    unsetenv("GPC_ATTENTION");
    gpc_cudnn_attention_get_stats(&after);
    assert_int_equal(after.plans, before.plans + 2); /* forward and backward, at model setup */
    set_path("gpc");
    train_losses(with_gpc, STEPS, seed);
    set_path(NULL);
    for (int s = 0; s < STEPS; s++) {
        fprintf(stderr, "step %d: loss %.5f with cuDNN, %.5f with gpc's kernels\n", s,
                (double)with_cudnn[s], (double)with_gpc[s]);
        if (!(fabs(with_cudnn[s] - with_gpc[s]) <= 1e-2 * fabs(with_gpc[s])))
            fail_msg("step %d: loss %.6f with cuDNN, %.6f with gpc: more than bf16 noise apart", s,
                     (double)with_cudnn[s], (double)with_gpc[s]);
    }
    assert_true(with_gpc[STEPS - 1] < with_gpc[0]); /* it trained */
}

int main(void) {
    if (!gpc_backend_get(GPC_DEVICE_CUDA)) {
        fprintf(stderr, "skipped: %s\n", gpc_last_error());
        return 77;
    }
    gpc_rng_seed(&rng, test_seed(), 5);
    if (!gpc_cudnn_attention_built()) {
        /* the path exists in name only, and says so */
        int64_t s_qkv[3] = {1, 8, 3 * 64}, s_o[3] = {1, 8, 64}, s_l[3] = {1, 1, 8};
        gpc_tensor q, o, l;
        if (gpc_tensor_alloc(&q, GPC_BF16, gpu, 3, s_qkv) ||
            gpc_tensor_alloc(&o, GPC_BF16, gpu, 3, s_o) ||
            gpc_tensor_alloc(&l, GPC_F32, gpu, 3, s_l)) {
            fprintf(stderr, "FAILED: %s\n", gpc_last_error());
            return 1;
        }
        gpc_op_set_attention_path("cudnn");
        gpc_status s = gpc_op_attention_forward(&o, &l, &q, 1);
        if (s != GPC_ERR_UNSUPPORTED || !strstr(gpc_last_error(), "built without cuDNN")) {
            fprintf(stderr, "FAILED: GPC_ATTENTION=cudnn in a build without cuDNN: %s (%s)\n",
                    gpc_status_name(s), gpc_last_error());
            return 1;
        }
        fprintf(stderr, "skipped: this gpc was built without cuDNN (%s)\n", gpc_last_error());
        return 77;
    }
    if (gpc_cudnn_attention_load() != GPC_OK) {
        fprintf(stderr,
                "FAILED: cuDNN's headers were found when gpc was built, but the library does not "
                "load on this GPU machine: %s\n",
                gpc_last_error());
        return 1;
    }
    fprintf(stderr, "cuDNN %ld\n", gpc_cudnn_attention_version());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_cudnn_matches),
        cmocka_unit_test(test_auto_always_runs),
        cmocka_unit_test(test_auto_uses_prepared_shapes),
        cmocka_unit_test(test_prepare_caches),
        cmocka_unit_test(test_model_losses_match),
        cmocka_unit_test(test_auto_backward_route),
    };
    /* GPC_TEST_FILTER='*route*' runs a subset (a ctest variant) */
    if (gpc_setting_given("GPC_TEST_FILTER"))
        cmocka_set_test_filter(gpc_setting_given("GPC_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
