/*
 * gelu_bench.c: the transformer block's two GELU products on the GPU, as the
 * model calls them, timed with CUDA events (the median of --reps calls after
 * 3 warm-up calls):
 *
 *   forward   gpc_op_matmul_gelu_forward: pre = inp . W_fc^T + b, act =
 *             gelu(pre); inp [N, C], W_fc [4C, C]
 *   dgelu     gpc_op_matmul_backward_dgelu of the projection after it
 *             (W_proj [C, 4C]): dinp = (dout . W_proj) * gelu'(pre), then
 *             W_proj's weight and bias gradients
 *
 *   bench_gelu_bench [--rows 65536] [--channels 768] [--reps 20]
 *
 * bf16, filled from 64 random host rows repeated. The defaults run
 * cuBLASLt's fused epilogues; GPC_GEMM_SM90=1 times gpc's own Hopper product
 * (gemm_sm90.cu) for the forward instead. Prints
 * RESULT gelu NAME rows=... ms=... tflops=... (the products' FLOPs: 2NC4C
 * for the forward, twice that for dgelu's dinp and dweight).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "ops/ops.h"

#define PROG "bench_gelu_bench"
#define CHECK(x) BENCH_TRY(PROG, x)
#define REPEAT_ROWS 64

/* Fills the [rows, cols] bf16 device tensor t with REPEAT_ROWS random rows. */
static int fill(gpc_tensor *t, gpc_rng *rng, float lo, float hi) {
    int64_t rows = t->shape[0], cols = t->shape[1];
    int64_t chunk = rows < REPEAT_ROWS ? rows : REPEAT_ROWS, s_h[2] = {chunk, cols};
    gpc_tensor host, host_bf;
    CHECK(gpc_tensor_alloc(&host, GPC_F32, gpc_cpu(), 2, s_h));
    CHECK(gpc_tensor_alloc(&host_bf, t->dtype, gpc_cpu(), 2, s_h));
    gpc_rng_fill_uniform(rng, host.data, (size_t)(chunk * cols), lo, hi);
    CHECK(gpc_op_convert(&host_bf, &host));
    size_t row_bytes = (size_t)cols * gpc_dtype_size(t->dtype);
    for (int64_t r = 0; r < rows; r += chunk) {
        int64_t n = rows - r < chunk ? rows - r : chunk;
        gpc_tensor part =
            gpc_tensor_2d((char *)t->data + r * row_bytes, t->dtype, t->device, n, cols);
        gpc_tensor src = gpc_tensor_2d(host_bf.data, t->dtype, gpc_cpu(), n, cols);
        CHECK(gpc_tensor_copy(&part, &src));
    }
    gpc_tensor_free(&host);
    gpc_tensor_free(&host_bf);
    return 0;
}

int main(int argc, char **argv) {
    int64_t N = 65536, C = 768, reps = 20;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = v != NULL;
        if (ok && !strcmp(a, "--rows"))
            ok = bench_parse_int64(PROG, a, v, 1, 1 << 22, &N);
        else if (ok && !strcmp(a, "--channels"))
            ok = bench_parse_int64(PROG, a, v, 8, 8192, &C);
        else if (ok && !strcmp(a, "--reps"))
            ok = bench_parse_int64(PROG, a, v, 1, 10000, &reps);
        else {
            fprintf(stderr, "%s: unknown option or missing value: %s\n", PROG, a);
            return 2;
        }
        if (!ok) return 2;
    }
    const gpc_backend *cuda = gpc_backend_get(GPC_DEVICE_CUDA);
    if (!cuda) {
        fprintf(stderr, "%s: %s\n", PROG, gpc_last_error());
        return 1;
    }
    gpc_device dev = {GPC_DEVICE_CUDA, 0};
    int64_t s_x[2] = {N, C}, s_h[2] = {N, 4 * C}, s_wfc[2] = {4 * C, C}, s_wp[2] = {C, 4 * C},
            s_b4[2] = {1, 4 * C}, s_b[2] = {1, C};
    gpc_tensor inp, w_fc, b_fc, pre, act, dout, w_proj, dinp, dw, db;
    CHECK(gpc_tensor_alloc(&inp, GPC_BF16, dev, 2, s_x));
    CHECK(gpc_tensor_alloc(&w_fc, GPC_BF16, dev, 2, s_wfc));
    CHECK(gpc_tensor_alloc(&b_fc, GPC_BF16, dev, 2, s_b4));
    CHECK(gpc_tensor_alloc(&pre, GPC_BF16, dev, 2, s_h));
    CHECK(gpc_tensor_alloc(&act, GPC_BF16, dev, 2, s_h));
    CHECK(gpc_tensor_alloc(&dout, GPC_BF16, dev, 2, s_x));
    CHECK(gpc_tensor_alloc(&w_proj, GPC_BF16, dev, 2, s_wp));
    CHECK(gpc_tensor_alloc(&dinp, GPC_BF16, dev, 2, s_h));
    CHECK(gpc_tensor_alloc(&dw, GPC_BF16, dev, 2, s_wp));
    CHECK(gpc_tensor_alloc(&db, GPC_BF16, dev, 2, s_b));
    gpc_rng rng;
    gpc_rng_seed(&rng, 13, 1);
    if (fill(&inp, &rng, -1, 1) || fill(&w_fc, &rng, -0.05f, 0.05f) ||
        fill(&b_fc, &rng, -0.1f, 0.1f) || fill(&dout, &rng, -1, 1) ||
        fill(&w_proj, &rng, -0.05f, 0.05f))
        return 1;
    CHECK(gpc_tensor_zero(&dw));
    CHECK(gpc_tensor_zero(&db));
    gpc_tensor bias = gpc_tensor_1d(b_fc.data, GPC_BF16, dev, 4 * C),
               dbias = gpc_tensor_1d(db.data, GPC_BF16, dev, C);

    gpc_event e0, e1;
    CHECK(cuda->event_create(&e0));
    CHECK(cuda->event_create(&e1));
    float *ms = malloc(sizeof(float) * (size_t)reps);
    if (!ms) return 1;
    const char *names[2] = {"forward", "dgelu"};
    for (int k = 0; k < 2; k++) {
        for (int r = -3; r < reps; r++) {
            CHECK(cuda->event_record(e0, NULL));
            if (k == 0)
                CHECK(gpc_op_matmul_gelu_forward(&pre, &act, &inp, &w_fc, &bias));
            else
                CHECK(gpc_op_matmul_backward_dgelu(&dinp, &dw, &dbias, &dout, &act, &w_proj, &pre));
            CHECK(cuda->event_record(e1, NULL));
            float t;
            CHECK(cuda->event_elapsed_ms(e0, e1, &t));
            if (r >= 0) ms[r] = t;
        }
        qsort(ms, (size_t)reps, sizeof(float), bench_cmp_float);
        double flops = 2.0 * (double)N * (double)C * 4.0 * (double)C * (k ? 2.0 : 1.0);
        double med = ms[reps / 2];
        printf("RESULT gelu %s rows=%lld channels=%lld ms=%.4f min_ms=%.4f tflops=%.1f\n", names[k],
               (long long)N, (long long)C, med, ms[0], flops / (med * 1e9));
    }
    free(ms);
    return 0;
}
