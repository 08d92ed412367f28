/*
 * test_cuda_ops.c: every CUDA op against the CPU op on fresh random inputs.
 *
 * Each case draws inputs, rounds them to the dtype under test (so the CPU,
 * which computes in f32, sees exactly the values the GPU sees), runs the op
 * on both devices and compares. Outputs on the GPU are poisoned with NaN
 * before each run (all bytes 0xFF is NaN in f32, bf16 and f16), so an element
 * the kernel forgot to write fails the comparison. Accumulated outputs
 * (parameter gradients, layernorm's dinp) start from the same random values
 * on both sides. Tolerances are relative to the larger of |reference| and
 * the reference's RMS (so tiny elements of a row do not dominate): f32 about
 * 1e-5, bf16/f16 about 1e-2 (outputs rounded to 8 mantissa bits, and
 * attention's probabilities rounded before P.V as in every flash kernel).
 *
 * Without a usable GPU the test exits 77, which CTest reports as skipped.
 */
#include "testutil_cuda.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/attention_sm90.h"
#include "cuda/matmul.h"
#include "ops/ops.h"

static gpc_rng rng;

/* A tensor on each device holding the same values, and the host copy. */
typedef struct {
    gpc_tensor cpu, gpu;
    float *host;
    int64_t n;
} pair;

/* kind: 'r' random in [lo, hi), 'p' poisoned output (NaN on both sides). */
static pair make(gpc_dtype dtype, int ndim, const int64_t *shape, char kind, float lo, float hi) {
    pair p;
    memset(&p, 0, sizeof p);
    TEST_OK(gpc_tensor_alloc(&p.gpu, dtype, (gpc_device){GPC_DEVICE_CUDA, 0}, ndim, shape));
    p.n = gpc_tensor_numel(&p.gpu);
    gpc_dtype host_dtype = dtype == GPC_I32 ? GPC_I32 : GPC_F32;
    TEST_OK(gpc_tensor_alloc(&p.cpu, host_dtype, gpc_cpu(), ndim, shape));
    p.host = malloc((size_t)p.n * sizeof(float) + 4);
    for (int64_t i = 0; i < p.n; i++) {
        float x = kind == 'p' ? NAN : lo + (hi - lo) * gpc_rng_uniform(&rng);
        if (dtype == GPC_I32 && kind != 'p') x = floorf(x);
        p.host[i] = dtype == GPC_I32 ? x : test_round_to(dtype, x);
    }
    if (dtype == GPC_I32) {
        for (int64_t i = 0; i < p.n; i++)
            ((int32_t *)p.cpu.data)[i] = (int32_t)p.host[i];
        test_gpu_upload(&p.gpu, p.host, p.n);
    } else {
        memcpy(p.cpu.data, p.host, (size_t)p.n * sizeof(float));
        if (kind == 'p')
            assert_int_equal(cudaMemset(p.gpu.data, 0xff, gpc_tensor_bytes(&p.gpu)), 0);
        else
            test_gpu_upload(&p.gpu, p.host, p.n);
    }
    return p;
}

static void drop(pair *p) {
    gpc_tensor_free(&p->gpu);
    gpc_tensor_free(&p->cpu);
    free(p->host);
}

/* Compares got, values downloaded from the GPU tensor of p, with its CPU twin. */
static void expect_got(const char *what, const pair *p, const float *got, double tol) {
    const float *want = p->cpu.data;
    double rms = 0;
    for (int64_t i = 0; i < p->n; i++)
        rms += (double)want[i] * want[i];
    rms = sqrt(rms / (p->n ? p->n : 1));
    char label[160];
    snprintf(label, sizeof label, "%s (%s, %lld elements)", what, gpc_dtype_name(p->gpu.dtype),
             (long long)p->n);
    test_assert_close_f32(label, got, want, (size_t)p->n, tol, rms > 1e-30 ? rms : 1e-30);
}

/* Compares the GPU tensor of p with its CPU twin. */
static void expect(const char *what, const pair *p, double tol) {
    float *got = test_gpu_download(&p->gpu);
    expect_got(what, p, got, tol);
    free(got);
}

/* ||gpu - cpu|| / ||cpu|| over the whole tensor. */
static void expect_norm(const char *what, const pair *p, double tol) {
    float *got = test_gpu_download(&p->gpu);
    const float *want = p->cpu.data;
    double num = 0, den = 0;
    for (int64_t i = 0; i < p->n; i++) {
        num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        den += (double)want[i] * want[i];
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    if (!(rel <= tol))
        fail_msg("%s (%s): norm-wise relative error %.3g > %.3g", what,
                 gpc_dtype_name(p->gpu.dtype), rel, tol);
    free(got);
}

/* The same for each third of a [B, T, 3C] tensor (dq, dk and dv apart,
 * as the wgmma backward sums dq in bf16), printed. A third whose norm is
 * under 1% of the whole's is measured against that 1% (at T = 1, dq and dk
 * are zero but for rounding). */
static void expect_thirds_norm(const char *what, const pair *p, double tol) {
    float *got = test_gpu_download(&p->gpu);
    const float *want = p->cpu.data;
    const int64_t C3 = p->gpu.shape[p->gpu.ndim - 1], C = C3 / 3;
    double num[3] = {0}, den[3] = {0}, rel[3];
    for (int64_t i = 0; i < p->n; i++) {
        const int k = (int)(i % C3 / C);
        num[k] += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        den[k] += (double)want[i] * want[i];
    }
    const double least = 1e-4 * (den[0] + den[1] + den[2]);
    for (int k = 0; k < 3; k++)
        rel[k] = sqrt(num[k] / (den[k] > least ? den[k] : least > 0 ? least : 1));
    static const char *name[3] = {"dq", "dk", "dv"};
    printf("  %s T=%lld: norm-wise error dq %.2e, dk %.2e, dv %.2e\n", what,
           (long long)p->gpu.shape[1], rel[0], rel[1], rel[2]);
    for (int k = 0; k < 3; k++) {
        if (!(rel[k] <= tol))
            fail_msg("%s %s (%s): norm-wise relative error %.3g > %.3g", what, name[k],
                     gpc_dtype_name(p->gpu.dtype), rel[k], tol);
    }
    free(got);
}

static double tol_for(gpc_dtype dtype, double f32_tol) {
    return dtype == GPC_F32 ? f32_tol : 2e-2;
}

/* ------------------------------------------------------------- embedding */

static void *device_snapshot(const gpc_tensor *t) {
    void *p = NULL;
    assert_int_equal(cudaMalloc(&p, gpc_tensor_bytes(t)), 0);
    assert_int_equal(cudaMemcpy(p, t->data, gpc_tensor_bytes(t), cudaMemcpyDeviceToDevice), 0);
    return p;
}

static unsigned char *device_bytes(const gpc_tensor *t) {
    unsigned char *h = malloc(gpc_tensor_bytes(t) + 1);
    assert_int_equal(cudaMemcpy(h, t->data, gpc_tensor_bytes(t), cudaMemcpyDeviceToHost), 0);
    return h;
}

static void embedding_case(gpc_dtype dt, int64_t B, int64_t T, int64_t C, int64_t V) {
    int64_t s_tok[2] = {B, T}, s_wte[2] = {V, C}, s_wpe[2] = {T + 3, C}, s_out[3] = {B, T, C};
    pair tok = make(GPC_I32, 2, s_tok, 'r', 0, (float)V);
    pair wte = make(dt, 2, s_wte, 'r', -1, 1), wpe = make(dt, 2, s_wpe, 'r', -1, 1);
    pair out = make(dt, 3, s_out, 'p', 0, 0);
    TEST_OK(gpc_op_embedding_forward(&out.cpu, &tok.cpu, &wte.cpu, &wpe.cpu));
    TEST_OK(gpc_op_embedding_forward(&out.gpu, &tok.gpu, &wte.gpu, &wpe.gpu));
    expect("embedding_forward out", &out, tol_for(dt, 1e-6));

    pair dout = make(dt, 3, s_out, 'r', -1, 1);
    pair dwte = make(dt, 2, s_wte, 'r', -1, 1), dwpe = make(dt, 2, s_wpe, 'r', -1, 1);
    TEST_OK(gpc_op_embedding_backward(&dwte.cpu, &dwpe.cpu, &dout.cpu, &tok.cpu));
    void *start = device_snapshot(&dwte.gpu);
    TEST_OK(gpc_op_embedding_backward(&dwte.gpu, &dwpe.gpu, &dout.gpu, &tok.gpu));
    expect("embedding_backward dwte", &dwte, tol_for(dt, 1e-5));
    expect("embedding_backward dwpe", &dwpe, tol_for(dt, 1e-5));
    /* deterministic: from the same state a second call gives the same bits
     * (each token's rows are summed in the order of their positions) */
    unsigned char *first = device_bytes(&dwte.gpu);
    assert_int_equal(
        cudaMemcpy(dwte.gpu.data, start, gpc_tensor_bytes(&dwte.gpu), cudaMemcpyDeviceToDevice), 0);
    TEST_OK(gpc_op_embedding_backward(&dwte.gpu, &dwpe.gpu, &dout.gpu, &tok.gpu));
    unsigned char *again = device_bytes(&dwte.gpu);
    if (memcmp(first, again, gpc_tensor_bytes(&dwte.gpu)) != 0)
        fail_msg("embedding_backward (%s, %lld tokens, V=%lld): dwte differs between two calls "
                 "from the same state",
                 gpc_dtype_name(dt), (long long)(B * T), (long long)V);
    free(first);
    free(again);
    assert_int_equal(cudaFree(start), 0);
    pair *all[] = {&tok, &wte, &wpe, &out, &dout, &dwte, &dwpe};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        drop(all[i]);
}

static void test_embedding(void **state) {
    (void)state;
    embedding_case(GPC_F32, 3, 37, 36, 11); /* few tokens: many repeats in the scatter */
    embedding_case(GPC_BF16, 2, 29, 64, 101);
    embedding_case(GPC_BF16, 2, 17, 36, 7); /* C not a multiple of 8: a channel a thread */
    /* GPT-2's width, 8192 positions over 50 tokens: long runs of each */
    embedding_case(GPC_BF16, 8, 1024, 768, 50);
}

/* ------------------------------------------------------------- layernorm */

/* A device copy of t's bytes (cudaFree it), and t's bytes on the host (free it). */
static void layernorm_case(gpc_dtype dt, int64_t B, int64_t T, int64_t C) {
    int64_t s_x[3] = {B, T, C}, s_c[1] = {C}, s_n[1] = {B * T};
    pair x = make(dt, 3, s_x, 'r', -2, 3), w = make(dt, 1, s_c, 'r', 0.5f, 1.5f),
         b = make(dt, 1, s_c, 'r', -0.5f, 0.5f);
    pair out = make(dt, 3, s_x, 'p', 0, 0), mean = make(GPC_F32, 1, s_n, 'p', 0, 0),
         rstd = make(GPC_F32, 1, s_n, 'p', 0, 0);
    TEST_OK(gpc_op_layernorm_forward(&out.cpu, &mean.cpu, &rstd.cpu, &x.cpu, &w.cpu, &b.cpu));
    TEST_OK(gpc_op_layernorm_forward(&out.gpu, &mean.gpu, &rstd.gpu, &x.gpu, &w.gpu, &b.gpu));
    expect("layernorm_forward out", &out, tol_for(dt, 1e-5));
    expect("layernorm_forward mean", &mean, 1e-5);
    expect("layernorm_forward rstd", &rstd, 1e-5);

    /* fused residual + layernorm: residual = x + y */
    pair y = make(dt, 3, s_x, 'r', -1, 1), res = make(dt, 3, s_x, 'p', 0, 0);
    pair out2 = make(dt, 3, s_x, 'p', 0, 0), mean2 = make(GPC_F32, 1, s_n, 'p', 0, 0),
         rstd2 = make(GPC_F32, 1, s_n, 'p', 0, 0);
    TEST_OK(gpc_op_residual_layernorm_forward(&res.cpu, &out2.cpu, &mean2.cpu, &rstd2.cpu, &x.cpu,
                                              &y.cpu, &w.cpu, &b.cpu));
    TEST_OK(gpc_op_residual_layernorm_forward(&res.gpu, &out2.gpu, &mean2.gpu, &rstd2.gpu, &x.gpu,
                                              &y.gpu, &w.gpu, &b.gpu));
    /* the CPU sums in f32; the GPU rounds the residual to dt first (as it stores it) */
    expect("residual_layernorm residual", &res, tol_for(dt, 1e-6));
    expect("residual_layernorm out", &out2, tol_for(dt, 1e-5));
    expect("residual_layernorm rstd", &rstd2, dt == GPC_F32 ? 1e-5 : 1e-2);

    /* backward, with the forward's statistics from the CPU on both sides */
    pair dout = make(dt, 3, s_x, 'r', -1, 1), dinp = make(dt, 3, s_x, 'r', -1, 1);
    pair dw = make(dt, 1, s_c, 'r', -1, 1), db = make(dt, 1, s_c, 'r', -1, 1);
    pair ds = make(dt, 1, s_c, 'r', -1, 1); /* dinp's incoming column sums */
    gpc_tensor gmean, grstd;
    TEST_OK(gpc_tensor_alloc(&gmean, GPC_F32, (gpc_device){GPC_DEVICE_CUDA, 0}, 1, s_n));
    TEST_OK(gpc_tensor_alloc(&grstd, GPC_F32, (gpc_device){GPC_DEVICE_CUDA, 0}, 1, s_n));
    TEST_OK(gpc_tensor_copy(&gmean, &mean.cpu));
    TEST_OK(gpc_tensor_copy(&grstd, &rstd.cpu));
    TEST_OK(gpc_op_layernorm_backward(&dinp.cpu, &dw.cpu, &db.cpu, &ds.cpu, &dout.cpu, &x.cpu,
                                      &w.cpu, &mean.cpu, &rstd.cpu));
    pair *acc[3] = {&dinp, &dw, &db}; /* accumulated: start from random values */
    const char *names[3] = {"dinp", "dweight", "dbias"};
    void *start[3];
    for (int i = 0; i < 3; i++)
        start[i] = device_snapshot(&acc[i]->gpu);
    TEST_OK(gpc_op_layernorm_backward(&dinp.gpu, &dw.gpu, &db.gpu, &ds.gpu, &dout.gpu, &x.gpu,
                                      &w.gpu, &gmean, &grstd));
    expect("layernorm_backward dinp", &dinp, tol_for(dt, 1e-5));
    expect("layernorm_backward dweight", &dw, tol_for(dt, 1e-5));
    expect("layernorm_backward dbias", &db, tol_for(dt, 1e-5));
    expect("layernorm_backward dinp_sum", &ds, tol_for(dt, 1e-5));
    /* deterministic: a second call from the same state gives the same bits,
     * and without dinp_sum the other three are the same as with it */
    unsigned char *first[3];
    for (int i = 0; i < 3; i++) {
        first[i] = device_bytes(&acc[i]->gpu);
        assert_int_equal(cudaMemcpy(acc[i]->gpu.data, start[i], gpc_tensor_bytes(&acc[i]->gpu),
                                    cudaMemcpyDeviceToDevice),
                         0);
    }
    TEST_OK(gpc_op_layernorm_backward(&dinp.gpu, &dw.gpu, &db.gpu, NULL, &dout.gpu, &x.gpu, &w.gpu,
                                      &gmean, &grstd));
    for (int i = 0; i < 3; i++) {
        unsigned char *again = device_bytes(&acc[i]->gpu);
        if (memcmp(first[i], again, gpc_tensor_bytes(&acc[i]->gpu)) != 0)
            fail_msg("layernorm_backward (%s, C=%lld): %s differs between two calls from the "
                     "same state",
                     gpc_dtype_name(dt), (long long)C, names[i]);
        free(again);
        free(first[i]);
        assert_int_equal(cudaFree(start[i]), 0);
    }
    gpc_tensor_free(&gmean);
    gpc_tensor_free(&grstd);
    pair *all[] = {&x,    &w,     &b,     &out,  &mean, &rstd, &y,  &res,
                   &out2, &mean2, &rstd2, &dout, &dinp, &dw,   &db, &ds};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        drop(all[i]);
}

static void test_layernorm(void **state) {
    (void)state;
    layernorm_case(GPC_F32, 2, 50, 96);
    layernorm_case(GPC_F32, 3, 7, 37); /* C not a multiple of the vector width */
    layernorm_case(GPC_BF16, 2, 64, 768);
    layernorm_case(GPC_BF16, 1, 9, 44);
    /* the backward's paths: fused (16-byte rows, C <= 1024, 768 in f32) with
     * several rows per warp and N not a multiple of the rows per block, a last
     * pack owned by only some lanes (C = 1000), and the two-kernel fallback
     * for odd, wide, and wide f32 rows */
    layernorm_case(GPC_BF16, 7, 1171, 768);
    layernorm_case(GPC_F32, 3, 701, 768);
    layernorm_case(GPC_F16, 3, 101, 1000);
    layernorm_case(GPC_BF16, 3, 333, 77);
    layernorm_case(GPC_BF16, 1, 37, 2048);
    layernorm_case(GPC_F32, 1, 45, 1024);
    /* rows of 1 to 4 16-byte packs a lane: the forward keeps them in
     * registers (layernorm_forward_rows_kernel) */
    layernorm_case(GPC_BF16, 3, 77, 256);
    layernorm_case(GPC_F16, 2, 45, 512);
    layernorm_case(GPC_BF16, 2, 33, 1024);
    layernorm_case(GPC_F32, 3, 71, 384);
    layernorm_case(GPC_F32, 1, 19, 128);
    /* wider rows, a lane's packs ragged: GPT-2 774M's 1280 (5 packs a lane)
     * and 1.5B's 1600 (7 for lanes 0-7, 6 for the rest), 1536 in f16; the
     * forward in registers, the backward fused at one block an SM */
    layernorm_case(GPC_BF16, 3, 171, 1280);
    layernorm_case(GPC_BF16, 2, 333, 1600);
    layernorm_case(GPC_F16, 1, 77, 1536);
    layernorm_case(GPC_F32, 2, 41, 800);
    /* several rows a warp at 769-1024 and at the wide widths, so the staged
     * backward copies each warp's next rows while it works on one */
    layernorm_case(GPC_BF16, 4, 1000, 1024);
    layernorm_case(GPC_F16, 3, 1001, 1000);
    layernorm_case(GPC_BF16, 3, 1001, 1600);
    layernorm_case(GPC_BF16, 2, 1100, 1280);
}

/* ---------------------------------------------------------------- matmul */

static void matmul_case(gpc_dtype dt, gpc_dtype grad_dt, int64_t B, int64_t T, int64_t C,
                        int64_t OC, int with_bias, int with_dinp) {
    int64_t s_x[3] = {B, T, C}, s_w[2] = {OC, C}, s_b[1] = {OC}, s_o[3] = {B, T, OC};
    pair x = make(dt, 3, s_x, 'r', -1, 1), w = make(dt, 2, s_w, 'r', -1, 1),
         b = make(dt, 1, s_b, 'r', -1, 1), out = make(dt, 3, s_o, 'p', 0, 0);
    TEST_OK(gpc_op_matmul_forward(&out.cpu, &x.cpu, &w.cpu, with_bias ? &b.cpu : NULL));
    TEST_OK(gpc_op_matmul_forward(&out.gpu, &x.gpu, &w.gpu, with_bias ? &b.gpu : NULL));
    expect("matmul_forward out", &out, tol_for(dt, 1e-5));
    /* the product added to a residual: into a third tensor, then in place */
    pair res = make(dt, 3, s_o, 'r', -4, 4), sum = make(dt, 3, s_o, 'p', 0, 0);
    const gpc_tensor *bias_cpu = with_bias ? &b.cpu : NULL, *bias_gpu = with_bias ? &b.gpu : NULL;
    TEST_OK(gpc_op_matmul_residual_forward(&sum.cpu, &x.cpu, &w.cpu, bias_cpu, &res.cpu));
    TEST_OK(gpc_op_matmul_residual_forward(&sum.gpu, &x.gpu, &w.gpu, bias_gpu, &res.gpu));
    expect("matmul_residual_forward out", &sum, tol_for(dt, 1e-5));
    TEST_OK(gpc_op_matmul_residual_forward(&res.cpu, &x.cpu, &w.cpu, bias_cpu, &res.cpu));
    TEST_OK(gpc_op_matmul_residual_forward(&res.gpu, &x.gpu, &w.gpu, bias_gpu, &res.gpu));
    expect("matmul_residual_forward in place", &res, tol_for(dt, 1e-5));
    drop(&res);
    drop(&sum);

    pair dout = make(dt, 3, s_o, 'r', -1, 1), dinp = make(dt, 3, s_x, 'p', 0, 0);
    pair dw = make(grad_dt, 2, s_w, 'r', -1, 1), db = make(grad_dt, 1, s_b, 'r', -1, 1);
    TEST_OK(gpc_op_matmul_backward(with_dinp ? &dinp.cpu : NULL, &dw.cpu,
                                   with_bias ? &db.cpu : NULL, &dout.cpu, &x.cpu, &w.cpu));
    TEST_OK(gpc_op_matmul_backward(with_dinp ? &dinp.gpu : NULL, &dw.gpu,
                                   with_bias ? &db.gpu : NULL, &dout.gpu, &x.gpu, &w.gpu));
    if (with_dinp) expect("matmul_backward dinp", &dinp, tol_for(dt, 1e-5));
    expect("matmul_backward dweight", &dw, tol_for(grad_dt == GPC_F32 ? dt : grad_dt, 1e-5));
    if (with_bias) expect("matmul_backward dbias", &db, tol_for(grad_dt, 1e-5));
    /* the input gradient alone, then the weight and bias gradients alone */
    pair dinp2 = make(dt, 3, s_x, 'p', 0, 0);
    TEST_OK(gpc_op_matmul_backward(&dinp2.cpu, NULL, NULL, &dout.cpu, &x.cpu, &w.cpu));
    TEST_OK(gpc_op_matmul_backward(&dinp2.gpu, NULL, NULL, &dout.gpu, &x.gpu, &w.gpu));
    expect("matmul_backward dinp alone", &dinp2, tol_for(dt, 1e-5));
    TEST_OK(gpc_op_matmul_backward(NULL, &dw.cpu, with_bias ? &db.cpu : NULL, &dout.cpu, &x.cpu,
                                   &w.cpu));
    TEST_OK(gpc_op_matmul_backward(NULL, &dw.gpu, with_bias ? &db.gpu : NULL, &dout.gpu, &x.gpu,
                                   &w.gpu));
    expect("matmul_backward dweight alone (a second time)", &dw,
           tol_for(grad_dt == GPC_F32 ? dt : grad_dt, 1e-5));
    if (with_bias)
        expect("matmul_backward dbias alone (a second time)", &db, tol_for(grad_dt, 1e-5));
    pair *all[] = {&x, &w, &b, &out, &dout, &dinp, &dw, &db, &dinp2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        drop(all[i]);
}

static void test_matmul(void **state) {
    (void)state;
    matmul_case(GPC_F32, GPC_F32, 2, 33, 64, 96, 1, 1);
    matmul_case(GPC_F32, GPC_F32, 1, 5, 12, 7, 0, 0); /* odd sizes, no bias, no dinp */
    matmul_case(GPC_BF16, GPC_BF16, 4, 64, 128, 384, 1, 1);
    matmul_case(GPC_BF16, GPC_F32, 2, 40, 64, 200, 1, 1); /* bf16 products into f32 grads */
    matmul_case(GPC_F16, GPC_F16, 2, 16, 64, 64, 1, 1);
    matmul_case(GPC_BF16, GPC_F32, 1, 24, 64, 36, 1, 1); /* OC not a multiple of 8: scalar dbias */
    /* up to 4 rows (generation's products): the matrix-vector kernel */
    matmul_case(GPC_BF16, GPC_BF16, 1, 1, 768, 2304, 1, 1);
    matmul_case(GPC_BF16, GPC_F32, 1, 3, 64, 200, 1, 1);
    matmul_case(GPC_F16, GPC_F16, 2, 2, 3072, 72, 0, 1);
    matmul_case(GPC_BF16, GPC_BF16, 1, 4, 40, 33, 1, 0);
    matmul_case(GPC_BF16, GPC_BF16, 1, 5, 64, 64, 1, 1); /* 5 rows: cuBLASLt again */
}

/* Fused linear + GELU: forward keeps the pre-activation and writes its GELU;
 * backward's dinp is gelu'(gelu_inp) times the product. inp and gelu_inp
 * are drawn independently: the op's result is defined for any pair, and the
 * CPU composes the two unfused kernels. bf16/f16 runs cuBLASLt's GELU
 * epilogues (when OC, resp. C, is a multiple of 8), f32 the two kernels. */
static void matmul_gelu_case(gpc_dtype dt, int64_t B, int64_t T, int64_t C, int64_t OC,
                             int with_bias) {
    int64_t s_x[3] = {B, T, C}, s_w[2] = {OC, C}, s_b[1] = {OC}, s_o[3] = {B, T, OC};
    pair x = make(dt, 3, s_x, 'r', -1, 1), w = make(dt, 2, s_w, 'r', -0.5f, 0.5f),
         b = make(dt, 1, s_b, 'r', -1, 1), pre = make(dt, 3, s_o, 'p', 0, 0),
         act = make(dt, 3, s_o, 'p', 0, 0);
    TEST_OK(
        gpc_op_matmul_gelu_forward(&pre.cpu, &act.cpu, &x.cpu, &w.cpu, with_bias ? &b.cpu : NULL));
    TEST_OK(
        gpc_op_matmul_gelu_forward(&pre.gpu, &act.gpu, &x.gpu, &w.gpu, with_bias ? &b.gpu : NULL));
    expect("matmul_gelu_forward out_pre", &pre, tol_for(dt, 1e-5));
    expect("matmul_gelu_forward out_gelu", &act, tol_for(dt, 1e-5));

    /* backward of a layer C -> OC whose input was gelu(gelu_inp) */
    pair dout = make(dt, 3, s_o, 'r', -1, 1), gin = make(dt, 3, s_x, 'r', -3, 3),
         dinp = make(dt, 3, s_x, 'p', 0, 0);
    pair dw = make(dt, 2, s_w, 'r', -1, 1), db = make(dt, 1, s_b, 'r', -1, 1);
    pair dpb = make(dt, 1, &C, 'r', -1, 1); /* the bias gradient before the GELU */
    TEST_OK(gpc_op_matmul_backward_dgelu(&dinp.cpu, &dw.cpu, with_bias ? &db.cpu : NULL,
                                         with_bias ? &dpb.cpu : NULL, &dout.cpu, &x.cpu, &w.cpu,
                                         &gin.cpu));
    TEST_OK(gpc_op_matmul_backward_dgelu(&dinp.gpu, &dw.gpu, with_bias ? &db.gpu : NULL,
                                         with_bias ? &dpb.gpu : NULL, &dout.gpu, &x.gpu, &w.gpu,
                                         &gin.gpu));
    expect("matmul_backward_dgelu dinp", &dinp, tol_for(dt, 1e-5));
    expect("matmul_backward_dgelu dweight", &dw, tol_for(dt, 1e-5));
    if (with_bias) {
        expect("matmul_backward_dgelu dbias", &db, tol_for(dt, 1e-5));
        expect("matmul_backward_dgelu dpre_bias", &dpb, tol_for(dt, 1e-5));
    }
    pair *all[] = {&x, &w, &b, &pre, &act, &dout, &gin, &dinp, &dw, &db, &dpb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        drop(all[i]);
}

static void test_matmul_gelu(void **state) {
    (void)state;
    long sm90_before = gpc_cuda_gemm_sm90_calls(),
         clusters_before = gpc_cuda_gemm_sm90_cluster_calls();
    matmul_gelu_case(GPC_F32, 2, 33, 64, 96, 1);
    matmul_gelu_case(GPC_BF16, 4, 64, 128, 512, 1); /* the fc layer's shape kind: epilogues */
    matmul_gelu_case(GPC_BF16, 4, 64, 512, 128, 0); /* fcproj's backward, as the model runs it */
    matmul_gelu_case(GPC_BF16, 2, 32, 256, 64, 1);  /* fcproj's: C -> OC narrower */
    matmul_gelu_case(GPC_BF16, 2, 32, 64, 256, 0);  /* GELU_AUX without bias */
    matmul_gelu_case(GPC_F16, 2, 16, 64, 128, 1);
    matmul_gelu_case(GPC_BF16, 1, 24, 44, 36, 1);   /* not multiples of 8: the two kernels */
    matmul_gelu_case(GPC_BF16, 1, 1, 768, 3072, 1); /* one row: the matrix-vector kernel */
    matmul_gelu_case(GPC_F16, 1, 3, 64, 40, 0);
    /* unless GPC_GEMM_SM90=0 (the test gpu_test_cuda_ops_cublaslt_gelu), bf16
     * forwards with M a multiple of 128, N of 192 and K of 64 go to
     * gemm_sm90.cu on an H100/H200: these two (no bias; then 512 tiles over
     * the blocks, both consumers busy, the staging tiles reused) */
    matmul_gelu_case(GPC_BF16, 2, 64, 64, 768, 0);
    matmul_gelu_case(GPC_BF16, 4, 2048, 128, 1536, 1);
    /* and backwards with dinp's width C a multiple of 192 and OC of 64 go to
     * its DGELU product: one K slice and fewer tiles than blocks; then 512
     * tiles, so each block's ring of two staging tiles turns over */
    matmul_gelu_case(GPC_BF16, 2, 64, 768, 64, 1);
    matmul_gelu_case(GPC_BF16, 4, 2048, 1536, 128, 0);
    matmul_gelu_case(GPC_BF16, 4, 2048, 1536, 128, 1); /* and with the column sums */
    /* from 1024 on, widths of whole 64-column boxes that are not whole
     * 192-column tiles (the larger models' 4C): the last tile partly empty,
     * with one box of it in use (1024, 4096) or two (1280); in clusters of
     * two, the second block's half of the last tile of 1024 is all beyond N */
    matmul_gelu_case(GPC_BF16, 2, 128, 64, 1024, 1);
    matmul_gelu_case(GPC_BF16, 2, 64, 64, 1280, 0);
    matmul_gelu_case(GPC_BF16, 4, 512, 128, 4096, 1);
    matmul_gelu_case(GPC_BF16, 2, 128, 1024, 64, 1);
    matmul_gelu_case(GPC_BF16, 2, 128, 1280, 64, 1);
    matmul_gelu_case(GPC_BF16, 4, 512, 4096, 128, 1);
    long sm90 = gpc_cuda_gemm_sm90_calls() - sm90_before;
    int on = gpc_cuda_gemm_sm90_available();
    printf("  gemm_sm90 products: %ld (GELU %s, DGELU %s here)\n", sm90,
           on & 1 ? "available" : "not available", on & 2 ? "available" : "not available");
    assert_int_equal(sm90, (on & 1 ? 5 : 0) + (on & 2 ? 6 : 0));
    /* the DGELU products of an even count of row tiles (8192, 256 and 2048
     * rows) pair them: clusters of two
     * blocks with GPC_GEMM_SM90_CLUSTER=1 (gpu_test_cuda_ops_sm90_cluster) */
    int clusters_on = on && gpc_setting_flag("GPC_GEMM_SM90_CLUSTER");
    long clustered = gpc_cuda_gemm_sm90_cluster_calls() - clusters_before;
    printf("  of them as clusters of two: %ld\n", clustered);
    assert_int_equal(clustered, clusters_on && (on & 2) ? 5 : 0);
}

/* One bf16 product of 8192 rows as the model runs it, against the CPU: the
 * forward with bias C -> OC ('f'), with GELU as well ('g'), or the input
 * gradient OC -> C ('d'). Lighter than matmul_case, which runs each shape
 * seven times: the reference for 1.5B's shapes is OpenBLAS on the CPU. */
static void large_product_case(char kind, int64_t C, int64_t OC) {
    const int64_t B = 2, T = 4096;
    int64_t s_x[3] = {B, T, C}, s_w[2] = {OC, C}, s_b[1] = {OC}, s_o[3] = {B, T, OC};
    pair w = make(GPC_BF16, 2, s_w, 'r', -1, 1);
    if (kind == 'd') {
        pair dout = make(GPC_BF16, 3, s_o, 'r', -1, 1), x = make(GPC_BF16, 3, s_x, 'r', -1, 1),
             dinp = make(GPC_BF16, 3, s_x, 'p', 0, 0);
        TEST_OK(gpc_op_matmul_backward(&dinp.cpu, NULL, NULL, &dout.cpu, &x.cpu, &w.cpu));
        TEST_OK(gpc_op_matmul_backward(&dinp.gpu, NULL, NULL, &dout.gpu, &x.gpu, &w.gpu));
        expect("large matmul_backward dinp", &dinp, tol_for(GPC_BF16, 1e-5));
        drop(&dout);
        drop(&x);
        drop(&dinp);
    } else {
        pair x = make(GPC_BF16, 3, s_x, 'r', -1, 1), b = make(GPC_BF16, 1, s_b, 'r', -1, 1),
             out = make(GPC_BF16, 3, s_o, 'p', 0, 0);
        if (kind == 'g') {
            pair act = make(GPC_BF16, 3, s_o, 'p', 0, 0);
            TEST_OK(gpc_op_matmul_gelu_forward(&out.cpu, &act.cpu, &x.cpu, &w.cpu, &b.cpu));
            TEST_OK(gpc_op_matmul_gelu_forward(&out.gpu, &act.gpu, &x.gpu, &w.gpu, &b.gpu));
            expect("large matmul_gelu_forward out_gelu", &act, tol_for(GPC_BF16, 1e-5));
            drop(&act);
        } else {
            TEST_OK(gpc_op_matmul_forward(&out.cpu, &x.cpu, &w.cpu, &b.cpu));
            TEST_OK(gpc_op_matmul_forward(&out.gpu, &x.gpu, &w.gpu, &b.gpu));
        }
        expect("large matmul forward out", &out, tol_for(GPC_BF16, 1e-5));
        drop(&x);
        drop(&b);
        drop(&out);
    }
    drop(&w);
}

/* GPT-2's large products at n = 8192 tokens, where matmul.cu takes the
 * configurations of its measured table (on an H100/H200 with cuBLASLt 13;
 * elsewhere the heuristic's, and the values are checked all the same): 124M's
 * and 1.5B's. Each configuration counts once, when its product is first
 * planned (the residual forms and repeated calls reuse the plan). */
static void test_matmul_measured(void **state) {
    (void)state;
    int before = gpc_cuda_matmul_measured_uses();
    matmul_case(GPC_BF16, GPC_BF16, 2, 4096, 768, 50304, 0, 0); /* the output head */
    matmul_case(GPC_BF16, GPC_BF16, 2, 4096, 768, 2304, 1, 0);  /* qkv */
    matmul_case(GPC_BF16, GPC_BF16, 2, 4096, 768, 768, 1, 1);   /* attention projection */
    matmul_gelu_case(GPC_BF16, 2, 4096, 768, 3072, 1);          /* fc, GELU_AUX_BIAS */
    matmul_gelu_case(GPC_BF16, 2, 4096, 3072, 768, 1);          /* fcproj's DGELU backward */
    /* 1.5B (C = 1600): qkv and the attention projection forward and dinp,
     * fcproj's forward, fc's dinp, and fc's GELU forward (its K of 1600 is
     * cuBLASLt's, not gemm_sm90.cu's) */
    large_product_case('f', 1600, 4800);
    large_product_case('d', 1600, 4800);
    large_product_case('f', 1600, 1600);
    large_product_case('d', 1600, 1600);
    large_product_case('f', 6400, 1600);
    large_product_case('d', 1600, 6400);
    large_product_case('g', 1600, 6400);
    int used = gpc_cuda_matmul_measured_uses() - before;
    int applies = gpc_cuda_matmul_measured_applies();
    /* the fc forward and fcproj's DGELU are gemm_sm90.cu's where it runs them */
    int on = gpc_cuda_gemm_sm90_available();
    int expected = applies ? 6 - (on & 1 ? 1 : 0) - (on & 2 ? 1 : 0) + 7 : 0;
    printf("  measured configurations taken: %d of %d (the table %s here)\n", used, expected,
           applies ? "applies" : "does not apply");
    assert_int_equal(used, expected);
}

/* The plain sum the model adds its losses with. */
static void test_sum(void **state) {
    (void)state;
    gpc_dtype dts[] = {GPC_F32, GPC_BF16};
    for (int k = 0; k < 2; k++) {
        int64_t s[1] = {65539}, one[1] = {1};
        pair x = make(dts[k], 1, s, 'r', 0, 11), acc = make(GPC_F32, 1, one, 'r', 0, 5);
        TEST_OK(gpc_op_sum(&acc.cpu, &x.cpu));
        TEST_OK(gpc_op_sum(&acc.gpu, &x.gpu));
        TEST_OK(gpc_op_sum(&acc.cpu, &x.cpu)); /* it adds */
        TEST_OK(gpc_op_sum(&acc.gpu, &x.gpu));
        expect("sum", &acc, 1e-5);
        drop(&x);
        drop(&acc);
    }
}

/* column_sums over a range of a wider matrix's columns, added to what acc
 * held: the qkv bias gradient's query third (16-byte loads: the range and
 * the row start on 8-element boundaries) and an odd range of odd rows (one
 * element a load). */
static void test_column_sums(void **state) {
    (void)state;
    gpc_dtype dts[] = {GPC_F32, GPC_BF16};
    const int64_t cases[][4] = {{4099, 2304, 0, 768}, {1027, 771, 5, 301}, {3, 40, 8, 16}};
    for (int k = 0; k < 2; k++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            int64_t s[2] = {cases[c][0], cases[c][1]}, ks[1] = {cases[c][3]};
            pair x = make(dts[k], 2, s, 'r', -1, 1), acc = make(dts[k], 1, ks, 'r', -2, 2);
            TEST_OK(gpc_op_column_sums(&acc.cpu, &x.cpu, cases[c][2]));
            TEST_OK(gpc_op_column_sums(&acc.gpu, &x.gpu, cases[c][2]));
            expect("column_sums", &acc, tol_for(dts[k], 3e-5));
            drop(&x);
            drop(&acc);
        }
}

/* ----------------------------------------------------------- elementwise */

static void elementwise_case(gpc_dtype dt, int64_t n) {
    int64_t s[1] = {n};
    pair x = make(dt, 1, s, 'r', -4, 4), out = make(dt, 1, s, 'p', 0, 0);
    TEST_OK(gpc_op_gelu_forward(&out.cpu, &x.cpu));
    TEST_OK(gpc_op_gelu_forward(&out.gpu, &x.gpu));
    expect("gelu_forward", &out, tol_for(dt, 1e-5));

    pair dout = make(dt, 1, s, 'r', -1, 1), dinp = make(dt, 1, s, 'p', 0, 0);
    TEST_OK(gpc_op_gelu_backward(&dinp.cpu, &x.cpu, &dout.cpu));
    TEST_OK(gpc_op_gelu_backward(&dinp.gpu, &x.gpu, &dout.gpu));
    expect("gelu_backward", &dinp, tol_for(dt, 1e-5));
    /* in place: dinp aliases dout */
    TEST_OK(gpc_op_gelu_backward(&dout.cpu, &x.cpu, &dout.cpu));
    TEST_OK(gpc_op_gelu_backward(&dout.gpu, &x.gpu, &dout.gpu));
    expect("gelu_backward in place", &dout, tol_for(dt, 1e-5));

    pair y = make(dt, 1, s, 'r', -1, 1), sum = make(dt, 1, s, 'p', 0, 0);
    TEST_OK(gpc_op_residual_forward(&sum.cpu, &x.cpu, &y.cpu));
    TEST_OK(gpc_op_residual_forward(&sum.gpu, &x.gpu, &y.gpu));
    expect("residual_forward", &sum, tol_for(dt, 1e-7));

    TEST_OK(gpc_op_scale(&y.cpu, 0.37f));
    TEST_OK(gpc_op_scale(&y.gpu, 0.37f));
    expect("scale", &y, tol_for(dt, 1e-7));
    pair *all[] = {&x, &out, &dout, &dinp, &y, &sum};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        drop(all[i]);
}

static void test_elementwise(void **state) {
    (void)state;
    elementwise_case(GPC_F32, 1003);
    elementwise_case(GPC_BF16, 4099);
    elementwise_case(GPC_F16, 77);
}

/* ------------------------------------------------------------- attention */

static void attention_case(gpc_dtype dt, int64_t B, int64_t T, int NH, int64_t hs) {
    int64_t C = NH * hs;
    int64_t s_qkv[3] = {B, T, 3 * C}, s_o[3] = {B, T, C}, s_l[3] = {B, NH, T};
    pair qkv = make(dt, 3, s_qkv, 'r', -2, 2), out = make(dt, 3, s_o, 'p', 0, 0),
         lse = make(GPC_F32, 3, s_l, 'p', 0, 0);
    TEST_OK(gpc_op_attention_forward(&out.cpu, &lse.cpu, &qkv.cpu, NH));
    TEST_OK(gpc_op_attention_forward(&out.gpu, &lse.gpu, &qkv.gpu, NH));
    expect("attention_forward out", &out, tol_for(dt, 2e-5));
    expect("attention_forward lse", &lse, dt == GPC_F32 ? 2e-5 : 1e-2);
    /* decode (generation): the last Tq rows only, for one row, some and all */
    int64_t tqs[3] = {1, T / 3 + 1, T};
    for (int i = 0; i < 3; i++) {
        int64_t s_d[3] = {B, tqs[i] < T ? tqs[i] : T, C};
        pair dec = make(dt, 3, s_d, 'p', 0, 0);
        TEST_OK(gpc_op_attention_decode(&dec.cpu, &qkv.cpu, NH));
        TEST_OK(gpc_op_attention_decode(&dec.gpu, &qkv.gpu, NH));
        expect("attention_decode out", &dec, tol_for(dt, 2e-5));
        drop(&dec);
    }

    /* backward from the CPU's forward results, so both sides see one input */
    pair dout = make(dt, 3, s_o, 'r', -1, 1), dqkv = make(dt, 3, s_qkv, 'p', 0, 0);
    gpc_tensor gout, glse;
    TEST_OK(gpc_tensor_alloc(&gout, dt, (gpc_device){GPC_DEVICE_CUDA, 0}, 3, s_o));
    TEST_OK(gpc_tensor_alloc(&glse, GPC_F32, (gpc_device){GPC_DEVICE_CUDA, 0}, 3, s_l));
    for (int64_t i = 0; i < out.n; i++)
        ((float *)out.cpu.data)[i] = test_round_to(dt, ((float *)out.cpu.data)[i]);
    test_gpu_upload(&gout, out.cpu.data, out.n);
    TEST_OK(gpc_tensor_copy(&glse, &lse.cpu));
    TEST_OK(gpc_op_attention_backward(&dqkv.cpu, &dout.cpu, &qkv.cpu, &out.cpu, &lse.cpu, NH));
    TEST_OK(gpc_op_attention_backward(&dqkv.gpu, &dout.gpu, &qkv.gpu, &gout, &glse, NH));
    /* bf16: P is rounded to 8 bits before P^T dO, so dv of the first keys,
     * long sums over every later query, carry a few rounding errors of 2^-9
     * each; 6e-2 of the RMS per element (the largest of some 3e5 elements
     * reaches 5.4e-2 in some draws), and 1e-2 over the whole tensor */
    expect("attention_backward dqkv", &dqkv, dt == GPC_F32 ? 5e-5 : 6e-2);
    if (dt != GPC_F32) {
        expect_norm("attention_backward dqkv", &dqkv, 1e-2);
        expect_thirds_norm("attention_backward", &dqkv, 1e-2);
    }
    gpc_tensor_free(&gout);
    gpc_tensor_free(&glse);
    pair *all[] = {&qkv, &out, &lse, &dout, &dqkv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        drop(all[i]);
}

static void test_attention_simple(void **state) {
    (void)state;
    attention_case(GPC_F32, 2, 45, 3, 16);
    attention_case(GPC_F32, 1, 70, 2, 64);
    attention_case(GPC_BF16, 1, 70, 2, 32); /* 16-bit with a head size the fast path skips */
}

static void test_attention_tensor_cores(void **state) {
    (void)state;
    long before = gpc_cuda_attention_sm90_calls();
    attention_case(GPC_BF16, 2, 256, 2, 64);
    attention_case(GPC_BF16, 1, 200, 3, 64); /* T not a multiple of the 64-row tile */
    attention_case(GPC_F16, 1, 128, 2, 64);
    attention_case(GPC_BF16, 1, 1, 1, 64);
    /* four blocks of 128 keys, so the wgmma kernel's ring of stages turns
     * over and its blocks take two units of key blocks each ((0, 3) and (1,
     * 2)); three, so that one unit has a single key block ((0, 2) and (1)) */
    attention_case(GPC_BF16, 1, 512, 3, 64);
    attention_case(GPC_BF16, 2, 384, 2, 64);
    /* GPT-2's T: four units a head, eight query blocks, each summed in bf16
     * from up to eight key blocks' dQ by the wgmma kernel's TMA adds */
    attention_case(GPC_BF16, 1, 1024, 8, 64);
    /* with GPC_ATTENTION_BWD=wgmma on Hopper the backward ran on wgmma
     * (attention_sm90.cu) for the bf16 cases whose T is a multiple of 128,
     * and the mma.sync kernels for the others */
    const char *bwd = gpc_setting_str("GPC_ATTENTION_BWD");
    int on = bwd && !strcmp(bwd, "wgmma") && gpc_cuda_attention_sm90_available();
    long ran = gpc_cuda_attention_sm90_calls() - before;
    printf("  wgmma attention backwards: %ld (%s)\n", ran, on ? "on" : "off");
    assert_int_equal(ran, on ? 4 : 0);
}

/* ---------------------------------------------------------- crossentropy */

/* How the case passes dlogits: a separate tensor, the logits themselves (as
 * the model does), or none (loss only). */
enum { CE_OUT_OF_PLACE, CE_IN_PLACE, CE_LOSS_ONLY };

/* Random logits in [-4, 4) and targets: -1 (masked) every 5th row from row 0,
 * V-1 and 0 (the vocabulary's edges, V-1 next to the padding) in rows 1 and
 * 2, random elsewhere; with `bad`, an out-of-range target every 5th row from
 * row 3 (V + row, or a negative other than -1), which the CPU op refuses and
 * the GPU answers with NaN loss and gradient (zeros still in the padding):
 * the CPU sees those rows masked and they are checked apart. With
 * target_logit, every row's target logit is set to it: a large one makes
 * the target's softmax nearly 1, so its gradient softmax - 1 cancels. */
static void crossentropy_case_at(gpc_dtype dt, int64_t N, int V, int64_t Vp, int mode, int bad,
                                 float dloss, float target_logit) {
    int64_t s_l[2] = {N, Vp}, s_n[1] = {N};
    pair logits = make(dt, 2, s_l, 'r', -4, 4), losses = make(GPC_F32, 1, s_n, 'p', 0, 0);
    pair targets = make(GPC_I32, 1, s_n, 'r', 0, (float)V);
    int32_t *cpu_targets = targets.cpu.data;
    int *is_bad = calloc((size_t)N, sizeof *is_bad);
    for (int64_t i = 0; i < N; i++) {
        float t = targets.host[i];
        if (i % 5 == 0)
            t = -1;
        else if (i == 1)
            t = (float)(V - 1);
        else if (i == 2)
            t = 0;
        else if (bad && i % 5 == 3) {
            t = i % 2 ? (float)(V + i) : (float)(-2 - i);
            is_bad[i] = 1;
        }
        targets.host[i] = t;
        cpu_targets[i] = is_bad[i] ? -1 : (int32_t)t;
    }
    test_gpu_upload(&targets.gpu, targets.host, N);
    if (target_logit != 0.0f) {
        for (int64_t i = 0; i < N; i++)
            if (cpu_targets[i] >= 0) {
                int64_t at = i * Vp + cpu_targets[i];
                logits.host[at] = ((float *)logits.cpu.data)[at] = target_logit;
            }
        test_gpu_upload(&logits.gpu, logits.host, N * Vp);
    }
    pair dl = make(dt, 2, s_l, 'p', 0, 0);
    pair *d = mode == CE_IN_PLACE ? &logits : mode == CE_OUT_OF_PLACE ? &dl : NULL;
    TEST_OK(gpc_op_crossentropy_forward_backward(&losses.cpu, d ? &d->cpu : NULL, &logits.cpu,
                                                 &targets.cpu, V, dloss));
    TEST_OK(gpc_op_crossentropy_forward_backward(&losses.gpu, d ? &d->gpu : NULL, &logits.gpu,
                                                 &targets.gpu, V, dloss));
    float *got_losses = test_gpu_download(&losses.gpu);
    float *got_d = d ? test_gpu_download(&d->gpu) : NULL;
    for (int64_t i = 0; i < N; i++) {
        if (!is_bad[i]) continue;
        if (!isnan(got_losses[i]))
            fail_msg("crossentropy: row %lld's target %d is outside 0..%d, loss %g, want NaN",
                     (long long)i, (int)targets.host[i], V - 1, (double)got_losses[i]);
        got_losses[i] = 0.0f; /* the CPU's masked row */
        for (int64_t j = 0; got_d && j < Vp; j++) {
            float *g = &got_d[i * Vp + j];
            if (j < V ? !isnan(*g) : *g != 0.0f)
                fail_msg("crossentropy: row %lld (target out of range) column %lld of %d: "
                         "gradient %g, want %s",
                         (long long)i, (long long)j, V, (double)*g, j < V ? "NaN" : "0");
            *g = 0.0f;
        }
    }
    if (target_logit != 0.0f) /* losses near 0: their error is absolute (f32's rounding of
                               * the sum near 1 moves log(sum) by about 1e-6) */
        test_assert_close_f32("crossentropy losses (targets near softmax 1)", got_losses,
                              losses.cpu.data, (size_t)N, 1e-4, 0.1);
    else
        expect_got("crossentropy losses", &losses, got_losses, dt == GPC_F32 ? 1e-5 : 1e-4);
    if (d)
        expect_got(mode == CE_IN_PLACE ? "crossentropy dlogits in place" : "crossentropy dlogits",
                   d, got_d, tol_for(dt, 1e-5));
    free(got_losses);
    free(got_d);
    free(is_bad);
    pair *all[] = {&logits, &losses, &targets, &dl};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        drop(all[i]);
}

static void crossentropy_case(gpc_dtype dt, int64_t N, int V, int64_t Vp, int mode, int bad,
                              float dloss) {
    crossentropy_case_at(dt, N, V, Vp, mode, bad, dloss, 0.0f);
}

/* The vocabulary-parallel cross-entropy's three steps on one slice of S
 * columns from col0 (ops.h), against the CPU's: targets inside the slice,
 * outside it and masked; the finish step fed the CPU's statistics, so the
 * comparison sees only its own rounding. */
static void vocab_slice_case(gpc_dtype dt, int64_t N, int V, int64_t S, int64_t col0,
                             int in_place) {
    int64_t s_l[2] = {N, S}, s_st[2] = {3, N}, s_n[1] = {N};
    int64_t real = V - col0 < S ? V - col0 : S; /* at least 1 here */
    pair logits = make(dt, 2, s_l, 'r', -4, 4), stats = make(GPC_F32, 2, s_st, 'p', 0, 0);
    pair losses = make(GPC_F32, 1, s_n, 'p', 0, 0);
    pair targets = make(GPC_I32, 1, s_n, 'r', 0, (float)V);
    for (int64_t i = 0; i < N; i++) {
        float t = targets.host[i];
        if (i % 5 == 0)
            t = -1;
        else if (i % 3 == 0)
            t = (float)(col0 + i % real);
        targets.host[i] = t;
        ((int32_t *)targets.cpu.data)[i] = (int32_t)t;
    }
    test_gpu_upload(&targets.gpu, targets.host, N);
    TEST_OK(gpc_op_crossentropy_slice_max(&stats.cpu, &logits.cpu, col0, V));
    TEST_OK(gpc_op_crossentropy_slice_max(&stats.gpu, &logits.gpu, col0, V));
    TEST_OK(gpc_op_crossentropy_slice_sums(&stats.cpu, &logits.cpu, &targets.cpu, col0, V));
    TEST_OK(gpc_op_crossentropy_slice_sums(&stats.gpu, &logits.gpu, &targets.gpu, col0, V));
    expect("crossentropy_slice stats", &stats, 1e-5);
    test_gpu_upload(&stats.gpu, stats.cpu.data, 3 * N);
    pair dl = make(dt, 2, s_l, 'p', 0, 0);
    pair *d = in_place ? &logits : &dl;
    float dloss = 1.0f / (float)N;
    TEST_OK(gpc_op_crossentropy_slice_finish(&losses.cpu, &d->cpu, &logits.cpu, &targets.cpu,
                                             &stats.cpu, col0, V, dloss));
    TEST_OK(gpc_op_crossentropy_slice_finish(&losses.gpu, &d->gpu, &logits.gpu, &targets.gpu,
                                             &stats.gpu, col0, V, dloss));
    expect("crossentropy_slice losses", &losses, 1e-5);
    expect(in_place ? "crossentropy_slice dlogits in place" : "crossentropy_slice dlogits", d,
           tol_for(dt, 1e-5));
    pair *all[] = {&logits, &stats, &losses, &targets, &dl};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        drop(all[i]);
}

/* The embedding of a slice of S rows from row0 (tokens of the whole
 * vocabulary V), with and without positions, and its backward. */
static void embedding_slice_case(gpc_dtype dt, int64_t B, int64_t T, int64_t C, int64_t V,
                                 int64_t S, int64_t row0) {
    int64_t s_tok[2] = {B, T}, s_wte[2] = {S, C}, s_wpe[2] = {T + 3, C}, s_out[3] = {B, T, C};
    pair tok = make(GPC_I32, 2, s_tok, 'r', 0, (float)V);
    pair wte = make(dt, 2, s_wte, 'r', -1, 1), wpe = make(dt, 2, s_wpe, 'r', -1, 1);
    for (int with_wpe = 0; with_wpe < 2; with_wpe++) {
        pair out = make(dt, 3, s_out, 'p', 0, 0);
        TEST_OK(gpc_op_embedding_slice_forward(&out.cpu, &tok.cpu, &wte.cpu,
                                               with_wpe ? &wpe.cpu : NULL, row0));
        TEST_OK(gpc_op_embedding_slice_forward(&out.gpu, &tok.gpu, &wte.gpu,
                                               with_wpe ? &wpe.gpu : NULL, row0));
        expect(with_wpe ? "embedding_slice_forward out" : "embedding_slice_forward, no wpe", &out,
               tol_for(dt, 1e-6));
        drop(&out);
    }
    pair dout = make(dt, 3, s_out, 'r', -1, 1);
    pair dwte = make(dt, 2, s_wte, 'r', -1, 1), dwpe = make(dt, 2, s_wpe, 'r', -1, 1);
    TEST_OK(gpc_op_embedding_slice_backward(&dwte.cpu, &dwpe.cpu, &dout.cpu, &tok.cpu, row0));
    TEST_OK(gpc_op_embedding_slice_backward(&dwte.gpu, &dwpe.gpu, &dout.gpu, &tok.gpu, row0));
    expect("embedding_slice_backward dwte", &dwte, tol_for(dt, 1e-5));
    expect("embedding_slice_backward dwpe", &dwpe, tol_for(dt, 1e-5));
    pair *all[] = {&tok, &wte, &wpe, &dout, &dwte, &dwpe};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        drop(all[i]);
}

static void test_vocab_slices(void **state) {
    (void)state;
    vocab_slice_case(GPC_F32, 13, 100, 64, 64, 0);         /* the last slice: 36 real of 64 */
    vocab_slice_case(GPC_BF16, 9, 50257, 12576, 0, 1);     /* GPT-2 over tp 4, first slice */
    vocab_slice_case(GPC_BF16, 9, 50257, 12576, 37728, 1); /* its last: padding at the end */
    vocab_slice_case(GPC_F16, 5, 1000, 520, 520, 0);
    embedding_slice_case(GPC_F32, 3, 37, 36, 11, 4, 4);
    embedding_slice_case(GPC_BF16, 2, 29, 64, 101, 40, 40);
    embedding_slice_case(GPC_BF16, 2, 17, 36, 101, 51, 50); /* C not a multiple of 8 */
}

static void test_crossentropy(void **state) {
    (void)state;
    /* rows held in registers (Vp a multiple of the 16-byte pack, at
     * most 8 packs on each of 1024 threads): 1, 2, 4 and 8 packs a
     * thread */
    crossentropy_case(GPC_F32, 14, 100, 128, CE_OUT_OF_PLACE, 0, 1.0f / 14);
    crossentropy_case(GPC_F32, 9, 100, 100, CE_IN_PLACE, 1, 1.0f / 9);
    crossentropy_case(GPC_BF16, 12, 1000, 1024, CE_IN_PLACE, 1, 1.0f / 12);
    crossentropy_case(GPC_BF16, 6, 16001, 16384, CE_OUT_OF_PLACE, 1, 0.5f);
    crossentropy_case(GPC_F16, 6, 29999, 30000, CE_IN_PLACE, 1, 1.0f / 6);
    crossentropy_case(GPC_F32, 5, 32700, 32768, CE_OUT_OF_PLACE, 1, 3.0f);
    /* GPT-2's classifier: V = 50257 padded to 50304, bf16 */
    crossentropy_case(GPC_BF16, 9, 50257, 50304, CE_IN_PLACE, 1, 1.0f / 9);
    /* targets with softmax near 1 (logit 20 against the others' [-4, 4):
     * gradient about -7e-4 at the target, where softmax - 1 cancels; in f32
     * that leaves about 4e-4 of it, above the f32 tolerance, so bf16 only) */
    crossentropy_case_at(GPC_BF16, 9, 50257, 50304, CE_IN_PLACE, 0, 1.0f / 9, 20.0f);
    crossentropy_case(GPC_BF16, 9, 50257, 50304, CE_OUT_OF_PLACE, 1, 1.0f / 9);
    crossentropy_case(GPC_BF16, 4, 50257, 50304, CE_LOSS_ONLY, 1, 1.0f);
    crossentropy_case(GPC_F16, 4, 50257, 50304, CE_OUT_OF_PLACE, 0, 1.0f / 4);
    /* more rows than multiprocessors, so blocks of several waves share
     * each one */
    crossentropy_case(GPC_BF16, 700, 50257, 50304, CE_IN_PLACE, 1, 1.0f / 700);
    crossentropy_case(GPC_F16, 301, 50257, 50304, CE_OUT_OF_PLACE, 1, 1.0f / 301);
    crossentropy_case(GPC_F32, 403, 20000, 20000, CE_IN_PLACE, 1, 1.0f / 403);
    /* the two-pass kernel: Vp not a multiple of the pack, or a row too
     * long for the registers (f32 at GPT-2's size, bf16 just past 8 x
     * 1024 packs) */
    crossentropy_case(GPC_BF16, 5, 97, 101, CE_OUT_OF_PLACE, 0, 1.0f / 5);
    crossentropy_case(GPC_BF16, 9, 50257, 50301, CE_IN_PLACE, 1, 1.0f / 9);
    crossentropy_case(GPC_F32, 9, 50257, 50304, CE_IN_PLACE, 1, 1.0f / 9);
    crossentropy_case(GPC_F32, 4, 50257, 50304, CE_LOSS_ONLY, 1, 1.0f);
    crossentropy_case(GPC_BF16, 6, 65537, 65544, CE_OUT_OF_PLACE, 1, 1.0f / 6);
    /* enough rows that several share the GPU at once */
    crossentropy_case(GPC_BF16, 700, 50257, 50304, CE_IN_PLACE, 1, 1.0f / 700);
}

/* ------------------------------------------------------------ classifier */

/* The output head (gpc_op_classifier) in bf16 at a shape classifier_sm90.cu
 * takes (N a multiple of 128, Vp of 384, C of 192), so a GPU with the fused
 * kernel runs it and any other the three ops in turn. Inputs: inp in
 * [-1, 1) and weight in [-a, a) with a = 6 / sqrt(C), so the logits' std is
 * sqrt(C (1/3) (a^2/3)) = 2; targets random but -1 every 37th row; dweight
 * starting from values of about its increment (a few 1e-3 at dloss = 1/N),
 * so that a lost += shows. Against a float64 reference from the same bf16
 * inputs, and against the unfused sequence on the GPU: dinp and dweight
 * within 2e-2 of their largest reference element; each loss within 1e-2
 * plus what rounding the logits to bf16 (as the unfused sequence stores
 * them) can move it: 2^-8 of |logit[target]| plus 2^-8 of the row's largest
 * |logit| (the log-sum-exp moves by at most the largest change of a logit).
 * A flat 2e-2 is not enough: 15360 simulated rows of std-2 logits, V = 700,
 * reached 0.026. */
static void classifier_case(int64_t B, int64_t T, int64_t C, int64_t Vp, int V) {
    int64_t N = B * T;
    int64_t s_x[3] = {B, T, C}, s_w[2] = {Vp, C}, s_l[3] = {B, T, Vp}, s_n[2] = {B, T};
    float a = 6.0f / sqrtf((float)C), dloss = 1.0f / (float)N;
    pair x = make(GPC_BF16, 3, s_x, 'r', -1, 1), w = make(GPC_BF16, 2, s_w, 'r', -a, a);
    pair dw = make(GPC_BF16, 2, s_w, 'r', -2e-3f, 2e-3f), dw2 = make(GPC_BF16, 2, s_w, 'p', 0, 0);
    /* the unfused sequence starts from the same dweight */
    test_gpu_upload(&dw2.gpu, dw.host, dw.n);
    pair dx = make(GPC_BF16, 3, s_x, 'p', 0, 0), dx2 = make(GPC_BF16, 3, s_x, 'p', 0, 0);
    pair logits = make(GPC_BF16, 3, s_l, 'p', 0, 0), logits2 = make(GPC_BF16, 3, s_l, 'p', 0, 0);
    pair losses = make(GPC_F32, 2, s_n, 'p', 0, 0), losses2 = make(GPC_F32, 2, s_n, 'p', 0, 0);
    pair tgt = make(GPC_I32, 2, s_n, 'r', 0, (float)V);
    for (int64_t n = 0; n < N; n += 37)
        tgt.host[n] = -1;
    test_gpu_upload(&tgt.gpu, tgt.host, N);

    /* float64 reference: each row's logits, loss and gradient, then the
     * two products; the loss tolerance of each row as above */
    double *d = malloc((size_t)(N * Vp) * 8), *want_loss = malloc((size_t)N * 8);
    double *loss_tol = malloc((size_t)N * 8), *want_dx = malloc((size_t)(N * C) * 8);
    double *want_dw = malloc((size_t)(Vp * C) * 8);
    for (int64_t n = 0; n < N; n++) {
        double *row = d + n * Vp, max = -INFINITY, max_abs = 0;
        for (int64_t j = 0; j < Vp; j++) {
            double s = 0;
            for (int64_t c = 0; c < C; c++)
                s += (double)x.host[n * C + c] * w.host[j * C + c];
            row[j] = s;
            if (j < V) max = fmax(max, s), max_abs = fmax(max_abs, fabs(s));
        }
        double sum = exp(row[0] - max); /* V >= 1 */
        for (int64_t j = 1; j < V; j++)
            sum += exp(row[j] - max);
        double lse = max + log(sum);
        int t = (int)tgt.host[n];
        want_loss[n] = t < 0 ? 0.0 : lse - row[t];
        loss_tol[n] = t < 0 ? 0.0 : 1e-2 + (fabs(row[t]) + max_abs) / 256.0;
        for (int64_t j = 0; j < Vp; j++)
            row[j] = t < 0 || j >= V ? 0.0 : (exp(row[j] - lse) - (j == t)) * dloss;
    }
    double max_dx = 0, max_dw = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            double s = 0;
            for (int64_t j = 0; j < Vp; j++)
                s += d[n * Vp + j] * w.host[j * C + c];
            want_dx[n * C + c] = s;
            max_dx = fmax(max_dx, fabs(s));
        }
    for (int64_t j = 0; j < Vp; j++)
        for (int64_t c = 0; c < C; c++) {
            double s = dw.host[j * C + c];
            for (int64_t n = 0; n < N; n++)
                s += d[n * Vp + j] * x.host[n * C + c];
            want_dw[j * C + c] = s;
            max_dw = fmax(max_dw, fabs(s));
        }

    TEST_OK(gpc_op_classifier(&losses.gpu, &dx.gpu, &dw.gpu, &logits.gpu, &x.gpu, &w.gpu, &tgt.gpu,
                              V, dloss));
    /* the three ops it stands for, in turn, on the GPU */
    TEST_OK(gpc_op_matmul_forward(&logits2.gpu, &x.gpu, &w.gpu, NULL));
    TEST_OK(gpc_op_crossentropy_forward_backward(&losses2.gpu, &logits2.gpu, &logits2.gpu, &tgt.gpu,
                                                 V, dloss));
    TEST_OK(gpc_op_matmul_backward(&dx2.gpu, &dw2.gpu, NULL, &logits2.gpu, &x.gpu, &w.gpu));
    float *got_loss = test_gpu_download(&losses.gpu), *got_dx = test_gpu_download(&dx.gpu);
    float *got_dw = test_gpu_download(&dw.gpu);
    float *seq_loss = test_gpu_download(&losses2.gpu), *seq_dx = test_gpu_download(&dx2.gpu);
    float *seq_dw = test_gpu_download(&dw2.gpu);
    for (int64_t n = 0; n < N; n++) {
        double err = fabs((double)got_loss[n] - want_loss[n]);
        double err_seq = fabs((double)got_loss[n] - seq_loss[n]);
        if (!(err <= loss_tol[n]) || !(err_seq <= loss_tol[n]))
            fail_msg("classifier loss of row %lld (target %d): %.6g, float64 %.6g, unfused "
                     "sequence %.6g; tolerance %.3g",
                     (long long)n, (int)tgt.host[n], (double)got_loss[n], want_loss[n],
                     (double)seq_loss[n], loss_tol[n]);
    }
    test_assert_close("classifier dinp (bf16) against float64", got_dx, want_dx, (size_t)(N * C),
                      2e-2, max_dx);
    test_assert_close("classifier dweight (bf16) against float64", got_dw, want_dw,
                      (size_t)(Vp * C), 2e-2, max_dw);
    test_assert_close_f32("classifier dinp (bf16) against the unfused sequence", got_dx, seq_dx,
                          (size_t)(N * C), 2e-2, max_dx);
    test_assert_close_f32("classifier dweight (bf16) against the unfused sequence", got_dw, seq_dw,
                          (size_t)(Vp * C), 2e-2, max_dw);
    void *host[] = {d,      want_loss, loss_tol, want_dx, want_dw, got_loss,
                    got_dx, got_dw,    seq_loss, seq_dx,  seq_dw};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
    pair *all[] = {&x, &w, &dw, &dw2, &dx, &dx2, &logits, &logits2, &losses, &losses2, &tgt};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        drop(all[i]);
}

static void test_classifier(void **state) {
    (void)state;
    long before = gpc_cuda_classifier_sm90_calls();
    /* on Hopper the fused kernels (classifier_sm90.cu): one tile a block,
     * with padded columns in the last tiles of logits and of dweight */
    classifier_case(2, 128, 384, 768, 700);
    /* two blocks, each walking 12, 4 and 9 tiles of the three products, so
     * the rings of stages and staging tiles turn over */
    setenv("GPC_SM90_BLOCKS", "2", 1);
    classifier_case(2, 256, 384, 1152, 1100);
    unsetenv("GPC_SM90_BLOCKS");
    int on = gpc_cuda_classifier_sm90_available();
    long ran = gpc_cuda_classifier_sm90_calls() - before;
    printf("  fused output heads: %ld (%s here)\n", ran, on ? "available" : "not available");
    assert_int_equal(ran, on ? 2 : 0);
}

/* The fused head keeps exp(logit - 16) in bf16, which holds a row whose
 * largest logit lies in [-50, 80): a row reaching 100 gets a NaN loss there
 * (rather than a wrong gradient), the other rows stay right, and the three
 * ops (GPC_GEMM_SM90_HEAD=0, or another GPU) give every row its loss. The
 * logits: column 7 of row n is x[n][0] (1, and 100 in row 3), every other
 * column 0; the targets are all 7, so a row's loss is log(e^x + 189) - x. */
static void test_classifier_range(void **state) {
    (void)state;
    const int64_t N = 128, C = 64, Vp = 192;
    const int V = 190;
    int64_t s_x[2] = {N, C}, s_w[2] = {Vp, C}, s_l[2] = {N, Vp}, s_n[1] = {N};
    pair x = make(GPC_BF16, 2, s_x, 'r', 0, 0), w = make(GPC_BF16, 2, s_w, 'r', 0, 0);
    pair dw = make(GPC_BF16, 2, s_w, 'r', 0, 0), dx = make(GPC_BF16, 2, s_x, 'p', 0, 0);
    pair logits = make(GPC_BF16, 2, s_l, 'p', 0, 0), losses = make(GPC_F32, 1, s_n, 'p', 0, 0);
    pair tgt = make(GPC_I32, 1, s_n, 'r', 7, 7);
    for (int64_t n = 0; n < N; n++)
        x.host[n * C] = n == 3 ? 100.0f : 1.0f;
    w.host[7 * C] = 1.0f;
    test_gpu_upload(&x.gpu, x.host, x.n);
    test_gpu_upload(&w.gpu, w.host, w.n);
    long before = gpc_cuda_classifier_sm90_calls();
    TEST_OK(gpc_op_classifier(&losses.gpu, &dx.gpu, &dw.gpu, &logits.gpu, &x.gpu, &w.gpu, &tgt.gpu,
                              V, 1.0f / (float)N));
    int fused = gpc_cuda_classifier_sm90_calls() > before;
    float *got = test_gpu_download(&losses.gpu);
    for (int64_t n = 0; n < N; n++) {
        double xn = n == 3 ? 100.0 : 1.0, want = log(exp(xn) + 189.0) - xn;
        if (n == 3 && fused) {
            if (!isnan(got[n])) fail_msg("fused head, largest logit 100: loss %g, not NaN", got[n]);
        } else if (!(fabs(got[n] - want) <= 1e-2)) {
            fail_msg("classifier loss of row %lld: %g, want %g (%s)", (long long)n, got[n], want,
                     fused ? "fused" : "three ops");
        }
    }
    printf("  the head ran %s\n", fused ? "fused: row 3's loss is NaN" : "as three ops");
    free(got);
    pair *all[] = {&x, &w, &dw, &dx, &logits, &losses, &tgt};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        drop(all[i]);
}

/* ------------------------------------------------ sum_squares and adamw */

static void test_sum_squares(void **state) {
    (void)state;
    gpc_dtype dts[] = {GPC_F32, GPC_BF16};
    for (int k = 0; k < 2; k++) {
        int64_t s[1] = {100003}, one[1] = {1};
        pair x = make(dts[k], 1, s, 'r', -1, 1), acc = make(GPC_F32, 1, one, 'r', 0, 5);
        TEST_OK(gpc_op_sum_squares(&acc.cpu, &x.cpu));
        TEST_OK(gpc_op_sum_squares(&acc.gpu, &x.gpu));
        TEST_OK(gpc_op_sum_squares(&acc.cpu, &x.cpu)); /* it adds */
        TEST_OK(gpc_op_sum_squares(&acc.gpu, &x.gpu));
        expect("sum_squares", &acc, 1e-5);
        drop(&x);
        drop(&acc);
    }
}

static void adamw_case(gpc_dtype pdt, gpc_dtype gdt, int with_master, float max_norm) {
    int64_t n = 5003, s[1] = {n}, one[1] = {1};
    pair w = make(GPC_F32, 1, s, 'r', -1, 1); /* master, or the params when f32 */
    pair p = make(pdt, 1, s, 'r', 0, 0);
    for (int64_t i = 0; i < n; i++) {
        p.host[i] = test_round_to(pdt, w.host[i]);
        ((float *)p.cpu.data)[i] = p.host[i];
    }
    test_gpu_upload(&p.gpu, p.host, n);
    pair *params = with_master ? &p : &w;
    pair g = make(gdt, 1, s, 'r', -0.1f, 0.1f), m = make(GPC_F32, 1, s, 'r', -0.01f, 0.01f),
         v = make(GPC_F32, 1, s, 'r', 0, 1e-4f), norm = make(GPC_F32, 1, one, 'r', 0, 0);
    TEST_OK(gpc_tensor_zero(&norm.cpu));
    TEST_OK(gpc_tensor_zero(&norm.gpu));
    TEST_OK(gpc_op_sum_squares(&norm.cpu, &g.cpu));
    TEST_OK(gpc_op_sum_squares(&norm.gpu, &g.gpu));
    gpc_adamw_args args = {.learning_rate = 1e-3f,
                           .beta1 = 0.9f,
                           .beta2 = 0.95f,
                           .eps = 1e-8f,
                           .weight_decay = 0.1f,
                           .step = 7,
                           .max_grad_norm = max_norm,
                           .grad_scale = 1.0f,
                           .seed = (uint32_t)gpc_rng_u32(&rng)};
    args.grad_norm_sq = &norm.cpu;
    TEST_OK(gpc_op_adamw(&params->cpu, with_master ? &w.cpu : NULL, &g.cpu, &m.cpu, &v.cpu, &args));
    args.grad_norm_sq = &norm.gpu;
    TEST_OK(gpc_op_adamw(&params->gpu, with_master ? &w.gpu : NULL, &g.gpu, &m.gpu, &v.gpu, &args));
    expect("adamw m", &m, 1e-5);
    expect("adamw v", &v, 1e-5);
    expect(with_master ? "adamw master" : "adamw params", &w, 1e-5);
    if (with_master && pdt == GPC_BF16) {
        /* stochastic rounding: each param is one of the two bf16 neighbours of
         * its master value, and not always the nearest one */
        float *got = test_gpu_download(&p.gpu), *master = w.cpu.data;
        int64_t not_nearest = 0;
        for (int64_t i = 0; i < n; i++) {
            uint32_t bits;
            memcpy(&bits, &master[i], 4);
            float toward_zero = gpc_bf16_to_f32((uint16_t)(bits >> 16));
            float away = gpc_bf16_to_f32((uint16_t)((bits >> 16) + 1));
            if (got[i] != toward_zero && got[i] != away)
                fail_msg("adamw: param %lld is %.9g, not a bf16 neighbour of master %.9g",
                         (long long)i, got[i], master[i]);
            not_nearest += got[i] != test_round_to(GPC_BF16, master[i]);
        }
        if (not_nearest < n / 20)
            fail_msg("adamw: only %lld of %lld params were rounded away from the nearest bf16: "
                     "rounding is not stochastic",
                     (long long)not_nearest, (long long)n);
        free(got);
    } else if (with_master) {
        expect("adamw params", &p, tol_for(pdt, 1e-5));
    }
    pair *all[] = {&w, &p, &g, &m, &v, &norm};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        drop(all[i]);
}

static void test_adamw(void **state) {
    (void)state;
    adamw_case(GPC_F32, GPC_F32, 0, 0.0f);
    adamw_case(GPC_F32, GPC_F32, 0, 0.5f); /* clipped: the norm is about 4 */
    adamw_case(GPC_BF16, GPC_BF16, 1, 1.0f);
    adamw_case(GPC_F16, GPC_F32, 1, 0.0f);
}

/* --------------------------------------------------------------- convert */

static void test_convert(void **state) {
    (void)state;
    gpc_dtype dts[] = {GPC_F32, GPC_BF16, GPC_F16};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            int64_t s[1] = {1027};
            pair src = make(dts[a], 1, s, 'r', -100, 100), dst = make(dts[b], 1, s, 'p', 0, 0);
            TEST_OK(gpc_op_convert(&dst.gpu, &src.gpu));
            float *got = test_gpu_download(&dst.gpu);
            for (int64_t i = 0; i < src.n; i++) {
                float want = test_round_to(dts[b], src.host[i]); /* round to nearest even */
                if (got[i] != want)
                    fail_msg("convert %s -> %s: element %lld is %.9g, want %.9g",
                             gpc_dtype_name(dts[a]), gpc_dtype_name(dts[b]), (long long)i, got[i],
                             want);
            }
            free(got);
            drop(&src);
            drop(&dst);
        }
}

/* ------------------------------------------------------------ bad inputs */

static void test_mixed_dtypes_refused(void **state) {
    (void)state;
    int64_t s_qkv[3] = {1, 8, 3 * 64}, s_o[3] = {1, 8, 64}, s_l[3] = {1, 1, 8};
    pair qkv = make(GPC_BF16, 3, s_qkv, 'r', -1, 1), out = make(GPC_F32, 3, s_o, 'p', 0, 0),
         lse = make(GPC_F32, 3, s_l, 'p', 0, 0);
    TEST_FAILS(gpc_op_attention_forward(&out.gpu, &lse.gpu, &qkv.gpu, 1), GPC_ERR_UNSUPPORTED,
               "of one dtype");
    int64_t s_x[2] = {4, 64}, s_w[2] = {8, 64}, s_y[2] = {4, 8};
    pair x = make(GPC_F32, 2, s_x, 'r', -1, 1), w = make(GPC_BF16, 2, s_w, 'r', -1, 1),
         y = make(GPC_F32, 2, s_y, 'p', 0, 0);
    TEST_FAILS(gpc_op_matmul_forward(&y.gpu, &x.gpu, &w.gpu, NULL), GPC_ERR_UNSUPPORTED,
               "gpc_op_convert");
    pair *all[] = {&qkv, &out, &lse, &x, &w, &y};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        drop(all[i]);
}

int main(void) {
    if (!gpc_backend_get(GPC_DEVICE_CUDA)) {
        fprintf(stderr, "skipped: %s\n", gpc_last_error());
        return 77;
    }
    gpc_rng_seed(&rng, test_seed(), 3);
    /* these are gpc's own kernels' tests; test_cuda_cudnn.c checks cuDNN's path */
    gpc_op_set_attention_path("gpc");
    /* GPC_TEST_FILTER='*attention*' runs a subset (scripts/gpu-check.sh's racecheck) */
    if (gpc_setting_given("GPC_TEST_FILTER"))
        cmocka_set_test_filter(gpc_setting_given("GPC_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_vocab_slices),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_matmul_gelu),
        cmocka_unit_test(test_matmul_measured),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_attention_simple),
        cmocka_unit_test(test_attention_tensor_cores),
        cmocka_unit_test(test_crossentropy),
        cmocka_unit_test(test_classifier),
        cmocka_unit_test(test_classifier_range),
        cmocka_unit_test(test_sum_squares),
        cmocka_unit_test(test_sum),
        cmocka_unit_test(test_column_sums),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_convert),
        cmocka_unit_test(test_mixed_dtypes_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
