/*
 * test_cuda_quant.c: products with quantized weights on the GPU against the
 * CPU op, and a quantized model on the GPU against the same model on the
 * CPU.
 *
 * The op: int8 and fp8 weights, scales per channel and per tensor, f32,
 * bf16 and f16 activations, 1 to 4 rows (the skinny kernel by default, the
 * warp-per-channel kernel with GPC_QUANT_GEMV_MAX_M=0), more rows (the
 * tiled kernel, and for per-tensor fp8 with bf16 cuBLASLt's FP8 product),
 * channel counts that are and are not multiples of 16, with and without
 * bias and residual (in place). Activations are rounded to their dtype
 * first, so the CPU sees the GPU's values. On cuBLASLt's path the
 * activations are quantized to E4M3 on the device; the reference then
 * quantizes them the same way on the host (scale amax / 448, x / scale in
 * IEEE division rounded to nearest even), so both multiply the same E4M3
 * values. The error is measured against the reference's RMS: 1e-5 for
 * f32, 1e-2 for 16-bit outputs (their own rounding), 3e-2 on cuBLASLt's
 * path (see run_case).
 *
 * On a GPU of compute capability 8.9 or more (an H200 is 9.0) with
 * GPC_QUANT_FP8_LT on, the per-tensor fp8 bf16 cases must have run on
 * cuBLASLt when the rows are a multiple of 16 (cuBLASLt may decline other
 * shapes, and the kernel then runs); the test says which path ran.
 *
 * test_skinny checks the skinny kernel (1 to 16 rows, decode) against
 * float64 element by element, and test_greedy_paths greedy decoding of a
 * quantized model with it and with the earlier kernels; their tolerances
 * are stated at each.
 *
 * Without a usable GPU the test exits 77, which CTest reports as skipped.
 */
#include "testutil.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/quant.h"
#include "gpc/model.h"
#include "ops/ops.h"

static gpc_rng rng;

static gpc_device gpu(void) {
    return (gpc_device){GPC_DEVICE_CUDA, 0};
}

/* A device tensor of dtype holding host f32 values (rounded to it), or raw
 * bytes when raw is not NULL. */
static gpc_tensor to_gpu(gpc_dtype dtype, int ndim, const int64_t *shape, const float *host,
                         const void *raw) {
    gpc_tensor t;
    TEST_OK(gpc_tensor_alloc(&t, dtype, gpu(), ndim, shape));
    int64_t n = gpc_tensor_numel(&t);
    size_t es = gpc_dtype_size(dtype);
    unsigned char *buf = malloc((size_t)n * es + 1);
    if (raw) memcpy(buf, raw, (size_t)n * es);
    for (int64_t i = 0; !raw && i < n; i++) {
        if (dtype == GPC_F32) {
            memcpy(buf + i * es, &host[i], 4);
        } else {
            uint16_t v = dtype == GPC_BF16 ? gpc_f32_to_bf16(host[i]) : gpc_f32_to_f16(host[i]);
            memcpy(buf + i * es, &v, 2);
        }
    }
    assert_int_equal(cudaMemcpy(t.data, buf, (size_t)n * es, cudaMemcpyHostToDevice), 0);
    free(buf);
    return t;
}

static void from_gpu(const gpc_tensor *t, float *out) {
    int64_t n = gpc_tensor_numel(t);
    size_t es = gpc_dtype_size(t->dtype);
    unsigned char *buf = malloc((size_t)n * es + 1);
    assert_int_equal(cudaMemcpy(buf, t->data, (size_t)n * es, cudaMemcpyDeviceToHost), 0);
    for (int64_t i = 0; i < n; i++) {
        if (t->dtype == GPC_F32) {
            memcpy(&out[i], buf + i * es, 4);
        } else {
            uint16_t v;
            memcpy(&v, buf + i * es, 2);
            out[i] = t->dtype == GPC_BF16 ? gpc_bf16_to_f32(v) : gpc_f16_to_f32(v);
        }
    }
    free(buf);
}

/* max |got - want| / RMS(want) */
static double error_vs_rms(const float *got, const float *want, size_t n) {
    double rms = 0, worst = 0;
    for (size_t i = 0; i < n; i++)
        rms += (double)want[i] * want[i];
    rms = sqrt(rms / (double)(n ? n : 1)) + 1e-30;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= worst)) worst = d; /* NaN wins */
    }
    return worst / rms;
}

static int fp8_tensor_cores(void) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
    return major * 10 + minor >= 89 && gpc_setting_flag("GPC_QUANT_FP8_LT");
}

/* Random operands, drawn in this order: nx inputs, [OC, C] codes (never
 * fp8's NaN), OC scales and biases, a [rows, OC] residual; the floats
 * representable in act. */
static void random_operands(gpc_dtype act, gpc_dtype qtype, int nx, int C, int OC, int rows,
                            float *x, uint8_t *q, float *scales, float *bias, float *res) {
    for (int i = 0; i < nx; i++)
        x[i] = test_round_to(act, gpc_rng_normal(&rng));
    for (int i = 0; i < OC * C; i++) {
        q[i] = (uint8_t)gpc_rng_below(&rng, 256);
        if (qtype == GPC_F8E4M3 && (q[i] & 0x7f) == 0x7f) q[i] ^= 1; /* no NaN codes */
    }
    for (int o = 0; o < OC; o++) {
        scales[o] = (qtype == GPC_I8 ? 0.01f : 0.003f) * (0.5f + (float)gpc_rng_uniform(&rng));
        bias[o] = test_round_to(act, gpc_rng_normal(&rng));
    }
    for (int i = 0; i < rows * OC; i++)
        res[i] = test_round_to(act, gpc_rng_normal(&rng));
}

/* One case: N x C inputs, OC outputs. */
static void run_case(gpc_dtype act, gpc_dtype qtype, int per_channel, int N, int C, int OC,
                     int with_bias, int with_res) {
    float *x = malloc(sizeof(float) * N * C), *xref = malloc(sizeof(float) * N * C);
    float *bias = malloc(sizeof(float) * OC), *res = malloc(sizeof(float) * N * OC);
    float *want = malloc(sizeof(float) * N * OC), *got = malloc(sizeof(float) * N * OC);
    float *scales = malloc(sizeof(float) * OC);
    uint8_t *q = malloc((size_t)OC * C);
    random_operands(act, qtype, N * C, C, OC, N, x, q, scales, bias, res);
    int skinny_rows = gpc_cuda_quant_set_gemv_max_rows(0);
    gpc_cuda_quant_set_gemv_max_rows(skinny_rows);
    int lt = qtype == GPC_F8E4M3 && !per_channel && act == GPC_BF16 &&
             N > (skinny_rows > 4 ? skinny_rows : 4) && C % 16 == 0 && OC % 16 == 0 &&
             fp8_tensor_cores();
    /* the GPU first (the residual updated in place when there is one), to
     * learn which path ran */
    int64_t sx[2] = {N, C}, sq[2] = {OC, C}, so[2] = {N, OC}, ss = per_channel ? OC : 1, sb = OC;
    gpc_tensor gx = to_gpu(act, 2, sx, x, NULL), gq = to_gpu(qtype, 2, sq, NULL, q);
    gpc_tensor gs = to_gpu(GPC_F32, 1, &ss, scales, NULL), gb = to_gpu(act, 1, &sb, bias, NULL);
    gpc_tensor gr = to_gpu(act, 2, so, res, NULL), go;
    TEST_OK(gpc_tensor_alloc(&go, act, gpu(), 2, so));
    assert_int_equal(cudaMemset(go.data, 0xff, gpc_tensor_bytes(&go)), 0); /* NaN */
    gpc_tensor *out = with_res ? &gr : &go;
    long lt_before = gpc_cuda_quant_lt_calls(), refused_before = gpc_cuda_quant_lt_refused();
    TEST_OK(gpc_op_matmul_quant_forward(out, &gx, &gq, &gs, with_bias ? &gb : NULL,
                                        with_res ? &gr : NULL));
    assert_int_equal(cudaDeviceSynchronize(), 0);
    int ran_lt = gpc_cuda_quant_lt_calls() > lt_before;
    from_gpu(out, got);
    memcpy(xref, x, sizeof(float) * N * C);
    float amax = 0;
    if (ran_lt) { /* the activations as cuBLASLt multiplied them */
        for (int i = 0; i < N * C; i++)
            amax = fmaxf(amax, fabsf(x[i]));
        float s = amax > 0 ? amax / 448.0f : 1.0f;
        for (int i = 0; i < N * C; i++)
            xref[i] = gpc_f8e4m3_to_f32(gpc_f32_to_f8e4m3(x[i] / s)) * s;
    }
    /* the CPU reference */
    gpc_tensor cx = gpc_tensor_make(xref, GPC_F32, gpc_cpu(), 2, sx);
    gpc_tensor cq = gpc_tensor_make(q, qtype, gpc_cpu(), 2, sq);
    gpc_tensor cs = gpc_tensor_make(scales, GPC_F32, gpc_cpu(), 1, &ss);
    gpc_tensor cb = gpc_tensor_make(bias, GPC_F32, gpc_cpu(), 1, &sb);
    gpc_tensor cr = gpc_tensor_make(res, GPC_F32, gpc_cpu(), 2, so);
    gpc_tensor co = gpc_tensor_make(want, GPC_F32, gpc_cpu(), 2, so);
    TEST_OK(gpc_op_matmul_quant_forward(&co, &cx, &cq, &cs, with_bias ? &cb : NULL,
                                        with_res ? &cr : NULL));
    /* f32: summation order only. 16-bit outputs in gpc's kernels: the
     * inputs are exact in both, so each element differs by its rounding to
     * 2^-9 of itself, and of the product before the residual is added (the
     * largest elements reach several times the RMS, so a bound on the RMS
     * alone fails now and then): within 2^-8 (|out| + |product|) plus 1e-4
     * of the RMS, as a fraction of which err is given. cuBLASLt FP8: the
     * activations are the reference's E4M3 values exactly, so what is left
     * is the outputs' bf16 rounding (2^-9 of elements up to several times
     * the RMS: about 1e-2 of it) and the tensor cores' order of additions;
     * 3e-2 of the RMS. One activation a whole E4M3 step off near amax moves
     * its row's outputs by up to ~0.1 of the RMS, which this catches. */
    double tol = act == GPC_F32 ? 1e-5 : ran_lt ? 3e-2 : 1.0;
    double err = error_vs_rms(got, want, (size_t)N * OC);
    if (act != GPC_F32 && !ran_lt) {
        double rms = 0;
        for (int i = 0; i < N * OC; i++)
            rms += (double)want[i] * want[i];
        rms = sqrt(rms / (N * OC));
        err = 0;
        for (int i = 0; i < N * OC; i++) {
            double prod = (double)want[i] - (with_res ? (double)res[i] : 0.0);
            double bound = (fabs((double)want[i]) + fabs(prod)) / 256.0 + 1e-4 * rms;
            double e = fabs((double)got[i] - (double)want[i]) / bound;
            if (!(e <= err)) err = e; /* NaN wins */
        }
    }
    char what[160];
    snprintf(what, sizeof what, "%s weights (%s scales), %s activations, %d x %d x %d%s%s (%s)",
             gpc_dtype_name(qtype), per_channel ? "channel" : "tensor", gpc_dtype_name(act), N, C,
             OC, with_bias ? ", bias" : "", with_res ? ", residual" : "",
             ran_lt ? "cuBLASLt FP8" : "gpc kernel");
    char amax_note[64] = ""; /* which scale the activations had, when they were E4M3 */
    if (ran_lt) snprintf(amax_note, sizeof amax_note, " (activations' amax %.9g)", (double)amax);
    if (!(err <= tol))
        fail_msg("%s: error %.3g of the %s > %.3g%s", what, err,
                 tol == 1.0 ? "rounding bound" : "RMS", tol, amax_note);
    /* cuBLASLt may offer no algorithm for a shape (the kernel then runs),
     * but it must take the aligned ones */
    if (ran_lt && !lt) fail_msg("%s: cuBLASLt ran where it does not apply", what);
    int refused = gpc_cuda_quant_lt_refused() > refused_before;
    if (lt && !ran_lt && N % 16 == 0 && !refused)
        fail_msg("%s: expected cuBLASLt's FP8 path", what);
    if (refused) printf("%s: cuBLASLt refused it; gpc's kernel ran it\n", what);
    if ((N == 64 && C == 256) || ran_lt)
        print_message("%s: error %.2g of the %s\n", what, err,
                      tol == 1.0 ? "rounding bound" : "RMS");
    gpc_tensor_free(&gx), gpc_tensor_free(&gq), gpc_tensor_free(&gs), gpc_tensor_free(&gb);
    gpc_tensor_free(&gr), gpc_tensor_free(&go);
    free(x), free(xref), free(bias), free(res), free(want), free(got), free(scales), free(q);
}

static void test_op(void **state) {
    (void)state;
    const int shapes[][3] = {{1, 256, 384}, {2, 64, 96},    {3, 33, 17},   {4, 1600, 48}, {1, 7, 5},
                             {5, 64, 48},   {64, 256, 768}, {77, 100, 33}, {130, 768, 64}};
    const gpc_dtype acts[3] = {GPC_F32, GPC_BF16, GPC_F16};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int a = 0; a < 3; a++)
            for (int v = 0; v < 3; v++) {
                gpc_dtype qtype = v == 0 ? GPC_I8 : GPC_F8E4M3;
                int per_channel = v != 2;
                for (int e = 0; e < 3; e++)
                    run_case(acts[a], qtype, per_channel, shapes[s][0], shapes[s][1], shapes[s][2],
                             e != 1, e != 2);
            }
    print_message("paths: %ld products on cuBLASLt FP8, %ld in gpc's kernels\n",
                  gpc_cuda_quant_lt_calls(), gpc_cuda_quant_kernel_calls());
}

/* ------------------------------------------------ the skinny kernel */

static double gelu64(double x) {
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

/* The relative rounding of one element of dtype (half its unit). */
static double unit_of(gpc_dtype dtype) {
    return dtype == GPC_BF16 ? 1.0 / 256 : dtype == GPC_F16 ? 1.0 / 2048 : 0.0;
}

/* One product of M rows in the skinny kernel against float64: each output
 * within 4e-6 of sum_k |x w| + |bias| + |residual| plus its dtype's
 * rounding of itself (half a unit: 2^-8 bf16, 2^-11 f16, 0 f32). The f32
 * sum of an output passes through at most ~64 additions (a lane's share of
 * the depth, 5 shuffles, the warps of a split), each within 2^-24 of that
 * magnitude: 64 * 2^-24 = 3.8e-6. With gelu (the GELU op), the
 * pre-activation so, and the output within its rounding plus 1e-6 of
 * itself plus 1e-5 (f32 arithmetic and __expf) of GELU in float64 of the
 * pre-activation the kernel stored. misalign: the input one element past a
 * 16-byte boundary, so every weight is read on its own. */
static void skinny_case(gpc_dtype act, gpc_dtype qtype, int per_channel, int M, int C, int OC,
                        int misalign, int with_bias, int with_res, int gelu) {
    float *x = malloc(sizeof(float) * ((size_t)M * C + 1)), *bias = malloc(sizeof(float) * OC);
    float *res = malloc(sizeof(float) * M * OC), *got = malloc(sizeof(float) * M * OC);
    float *got_pre = malloc(sizeof(float) * M * OC), *scales = malloc(sizeof(float) * OC);
    uint8_t *q = malloc((size_t)OC * C);
    random_operands(act, qtype, M * C + 1, C, OC, M, x, q, scales, bias, res);
    const float *xs = x + misalign; /* the rows the product reads */
    int64_t sx[2] = {M * C + 1, 1}, sq[2] = {OC, C}, so[2] = {M, OC}, ss = per_channel ? OC : 1;
    int64_t sb = OC;
    gpc_tensor whole = to_gpu(act, 2, sx, x, NULL), gq = to_gpu(qtype, 2, sq, NULL, q);
    gpc_tensor gs = to_gpu(GPC_F32, 1, &ss, scales, NULL), gb = to_gpu(act, 1, &sb, bias, NULL);
    gpc_tensor gr = to_gpu(act, 2, so, res, NULL), go, gp;
    gpc_tensor gx =
        gpc_tensor_2d((char *)whole.data + misalign * gpc_dtype_size(act), act, gpu(), M, C);
    TEST_OK(gpc_tensor_alloc(&go, act, gpu(), 2, so));
    TEST_OK(gpc_tensor_alloc(&gp, act, gpu(), 2, so));
    assert_int_equal(cudaMemset(go.data, 0xff, gpc_tensor_bytes(&go)), 0); /* NaN */
    assert_int_equal(cudaMemset(gp.data, 0xff, gpc_tensor_bytes(&gp)), 0);
    gpc_tensor *out = with_res && !gelu ? &gr : &go;
    long before = gpc_cuda_quant_gemv_calls();
    if (gelu)
        TEST_OK(gpc_op_matmul_quant_gelu_forward(&gp, &go, &gx, &gq, &gs, with_bias ? &gb : NULL));
    else
        TEST_OK(gpc_op_matmul_quant_forward(out, &gx, &gq, &gs, with_bias ? &gb : NULL,
                                            with_res ? &gr : NULL));
    assert_int_equal(cudaDeviceSynchronize(), 0);
    char what[200];
    snprintf(what, sizeof what, "%s%s weights (%s scales), %s activations, %d x %d x %d%s%s%s",
             gelu ? "GELU, " : "", gpc_dtype_name(qtype), per_channel ? "channel" : "tensor",
             gpc_dtype_name(act), M, C, OC, misalign ? ", unaligned input" : "",
             with_bias ? ", bias" : "", with_res && !gelu ? ", residual" : "");
    if (gpc_cuda_quant_gemv_calls() != before + 1)
        fail_msg("%s: the skinny kernel did not run", what);
    from_gpu(out, got);
    if (gelu) from_gpu(&gp, got_pre);
    double worst = 0;
    for (int m = 0; m < M; m++)
        for (int o = 0; o < OC; o++) {
            double s = scales[per_channel ? o : 0], sum = 0, mag = 0;
            for (int k = 0; k < C; k++) {
                double w = gpt_quant_value(qtype, q[(size_t)o * C + k]) * s;
                sum += (double)xs[(size_t)m * C + k] * w;
                mag += fabs((double)xs[(size_t)m * C + k] * w);
            }
            if (with_bias) sum += bias[o], mag += fabs(bias[o]);
            if (with_res && !gelu) sum += res[m * OC + o], mag += fabs(res[m * OC + o]);
            size_t at = (size_t)m * OC + o;
            double pre = gelu ? got_pre[at] : got[at];
            double tol = 4e-6 * mag + unit_of(act) * fabs(sum) + 1e-30;
            double err = fabs(pre - sum);
            if (!(err <= tol))
                fail_msg("%s: row %d, channel %d: %.9g, float64 %.9g (tolerance %.3g)", what, m, o,
                         pre, sum, tol);
            if (err / tol > worst) worst = err / tol;
            if (gelu) {
                double g = gelu64(got_pre[at]), gtol = (unit_of(act) + 1e-6) * fabs(g) + 1e-5;
                if (!(fabs(got[at] - g) <= gtol))
                    fail_msg("%s: row %d, channel %d: GELU %.9g of %.9g, float64 %.9g", what, m, o,
                             got[at], got_pre[at], g);
            }
        }
    if (M == 16 && C >= 768) print_message("%s: worst error %.2f of the tolerance\n", what, worst);
    gpc_tensor_free(&whole), gpc_tensor_free(&gq), gpc_tensor_free(&gs), gpc_tensor_free(&gb);
    gpc_tensor_free(&gr), gpc_tensor_free(&go), gpc_tensor_free(&gp);
    free(x), free(bias), free(res), free(got), free(got_pre), free(scales), free(q);
}

/* M in {1, 2, 3, 7, 16} against float64: GPT-2's shapes, depths of every
 * split (kw 1, 2 and 4), depths and channel counts that are not multiples
 * of 8 or of the block's channels, and an unaligned input; int8 and fp8,
 * scales per channel and per tensor, the three activation dtypes; bias,
 * residual in place and the GELU op. */
static void test_skinny(void **state) {
    (void)state;
    int before = gpc_cuda_quant_set_gemv_max_rows(16);
    const int shapes[][2] = {{768, 2304}, {3072, 768}, {1600, 48}, {6400, 40},
                             {1001, 37},  {24, 5},     {7, 3},     {1024, 129}};
    const int rows[5] = {1, 2, 3, 7, 16};
    const gpc_dtype acts[3] = {GPC_BF16, GPC_F32, GPC_F16};
    int count = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int r = 0; r < 5; r++)
            for (int v = 0; v < 3; v++, count++) {
                gpc_dtype qtype = v == 0 ? GPC_I8 : GPC_F8E4M3;
                /* every combination over the cases, not every case each */
                gpc_dtype act = acts[count % 3];
                int misalign = count % 7 == 3, e = count % 4;
                skinny_case(act, qtype, v != 2, rows[r], shapes[s][0], shapes[s][1], misalign,
                            e != 1, e == 0 || e == 2, e == 3);
            }
    /* the setting's 0 keeps the earlier kernels */
    gpc_cuda_quant_set_gemv_max_rows(0);
    long calls = gpc_cuda_quant_gemv_calls();
    run_case(GPC_BF16, GPC_I8, 1, 3, 64, 48, 1, 1);
    assert_int_equal(gpc_cuda_quant_gemv_calls(), calls);
    gpc_cuda_quant_set_gemv_max_rows(before);
}

/* Greedy decoding of a quantized model (bf16) with the skinny kernel and
 * with the earlier kernels (GPC_QUANT_GEMV_MAX_M=0): the second run is fed
 * the first's tokens, and at every step the logits agree within 3e-2 of
 * their RMS (bf16 activations rounded in different orders) and the drawn
 * token is the same unless the first run's top two logits were closer than
 * that. The prompt has 4 tokens, so neither path quantizes activations
 * (cuBLASLt's FP8 product takes more rows). */
static void test_greedy_paths(void **state) {
    (void)state;
    enum { PROMPT = 4, STEPS = 24, CTX = 64, V = 101 };
    gpt_config c;
    TEST_OK(gpt_config_init(&c, 2, 4, 256, CTX, V));
    size_t P = gpt_config_num_params(&c);
    float *w = malloc(P * sizeof *w);
    gpt_model *init = NULL;
    TEST_OK(gpt_create(&init, &c, gpc_cpu(), GPC_F32, 1, 1, 0));
    TEST_OK(gpt_init_weights(init, 7));
    TEST_OK(gpt_get_params(init, w));
    gpt_free(init);
    const gpt_quant_options all[3] = {{GPC_I8, 1}, {GPC_F8E4M3, 1}, {GPC_F8E4M3, 0}};
    static float logits[2][STEPS][V];
    int32_t tok[PROMPT + STEPS];
    for (int q = 0; q < 3; q++) {
        gpt_model *m = NULL;
        TEST_OK(gpt_create_quant(&m, &c, gpu(), GPC_BF16, 1, CTX, &all[q]));
        TEST_OK(gpt_set_params(m, w));
        for (int i = 0; i < PROMPT; i++)
            tok[i] = (int32_t)gpc_rng_below(&rng, V);
        int agree = 0;
        for (int path = 0; path < 2; path++) {
            int before = gpc_cuda_quant_set_gemv_max_rows(path == 0 ? 16 : 0);
            long calls = gpc_cuda_quant_gemv_calls();
            TEST_OK(gpt_forward_cached(m, tok, 0, PROMPT, logits[path][0]));
            for (int t = 0; t < STEPS; t++) {
                if (t > 0)
                    TEST_OK(gpt_forward_cached(m, tok + PROMPT + t - 1, PROMPT + t - 1, 1,
                                               logits[path][t]));
                int best = 0;
                for (int v = 1; v < V; v++)
                    if (logits[path][t][v] > logits[path][t][best]) best = v;
                if (path == 0) tok[PROMPT + t] = best; /* the second run follows the first */
                if (path == 1) {
                    double err = error_vs_rms(logits[1][t], logits[0][t], V);
                    if (!(err <= 3e-2))
                        fail_msg("%s model, step %d: logits of the two paths differ by %.3g of "
                                 "their RMS",
                                 gpt_quant_name(&all[q]), t, err);
                    if (best == tok[PROMPT + t]) {
                        agree++;
                    } else { /* only where the first run's two best were close */
                        double rms = 0;
                        for (int v = 0; v < V; v++)
                            rms += (double)logits[0][t][v] * logits[0][t][v];
                        rms = sqrt(rms / V);
                        double gap = logits[0][t][tok[PROMPT + t]] - logits[0][t][best];
                        if (!(gap <= 3e-2 * rms))
                            fail_msg("%s model, step %d: token %d against %d, %.3g apart",
                                     gpt_quant_name(&all[q]), t, best, tok[PROMPT + t], gap);
                    }
                }
            }
            /* decode steps of one row: the skinny kernel ran only when on */
            long ran = gpc_cuda_quant_gemv_calls() - calls;
            if (path == 0 && ran < (long)STEPS * 4 * 2)
                fail_msg("%s model: only %ld products in the skinny kernel",
                         gpt_quant_name(&all[q]), ran);
            if (path == 1 && ran != 0)
                fail_msg("%s model: the skinny kernel ran with GPC_QUANT_GEMV_MAX_M=0",
                         gpt_quant_name(&all[q]));
            gpc_cuda_quant_set_gemv_max_rows(before);
        }
        print_message("%s model: %d of %d greedy tokens the same on both paths\n",
                      gpt_quant_name(&all[q]), agree, STEPS);
        gpt_free(m);
    }
    free(w);
}

/* A quantized model on the GPU (bf16 activations) against the same
 * quantized weights on the CPU (f32): the last position's logits of a
 * whole window, and generation over kept keys and values. */
static void test_model(void **state) {
    (void)state;
    gpt_config c;
    TEST_OK(gpt_config_init(&c, 2, 4, 128, 64, 101));
    size_t P = gpt_config_num_params(&c);
    float *w = malloc(P * sizeof *w);
    gpt_model *init = NULL;
    TEST_OK(gpt_create(&init, &c, gpc_cpu(), GPC_F32, 1, 1, 0));
    TEST_OK(gpt_init_weights(init, 5));
    TEST_OK(gpt_get_params(init, w));
    gpt_free(init);
    int32_t tok[64];
    for (int i = 0; i < 64; i++)
        tok[i] = (int32_t)gpc_rng_below(&rng, 101);
    float cpu_logits[101], gpu_logits[101];
    const gpt_quant_options all[3] = {{GPC_I8, 1}, {GPC_F8E4M3, 1}, {GPC_F8E4M3, 0}};
    for (int q = 0; q < 3; q++) {
        gpt_model *cm = NULL, *gm = NULL;
        TEST_OK(gpt_create_quant(&cm, &c, gpc_cpu(), GPC_F32, 1, 64, &all[q]));
        TEST_OK(gpt_create_quant(&gm, &c, gpu(), GPC_BF16, 1, 64, &all[q]));
        TEST_OK(gpt_set_params(cm, w));
        TEST_OK(gpt_set_params(gm, w));
        TEST_OK(gpt_forward_last_logits(cm, tok, 1, 64, cpu_logits));
        TEST_OK(gpt_forward_last_logits(gm, tok, 1, 64, gpu_logits));
        /* fp8 per tensor runs the prompt on cuBLASLt, whose activations
         * are E4M3 too: a coarser match with the CPU's f32 activations */
        double tol = all[q].per_channel ? 5e-2 : 1e-1;
        double err = error_vs_rms(gpu_logits, cpu_logits, 101);
        if (!(err <= tol))
            fail_msg("%s model, whole window: error %.3g of the RMS", gpt_quant_name(&all[q]), err);
        TEST_OK(gpt_forward_cached(gm, tok, 0, 60, gpu_logits));
        for (int p = 60; p < 64; p++)
            TEST_OK(gpt_forward_cached(gm, tok + p, p, 1, gpu_logits));
        err = error_vs_rms(gpu_logits, cpu_logits, 101);
        if (!(err <= tol))
            fail_msg("%s model, kept keys and values: error %.3g of the RMS",
                     gpt_quant_name(&all[q]), err);
        print_message("%s model: logits within %.2g of the RMS\n", gpt_quant_name(&all[q]), err);
        gpt_free(cm);
        gpt_free(gm);
    }
    free(w);
}

int main(void) {
    if (!gpc_backend_get(GPC_DEVICE_CUDA)) {
        fprintf(stderr, "skipped: %s\n", gpc_last_error());
        return 77;
    }
    gpc_rng_seed(&rng, test_seed(), 9);
    if (gpc_setting_given("GPC_TEST_FILTER"))
        cmocka_set_test_filter(gpc_setting_given("GPC_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_op),
        cmocka_unit_test(test_model),
        cmocka_unit_test(test_skinny),
        cmocka_unit_test(test_greedy_paths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
