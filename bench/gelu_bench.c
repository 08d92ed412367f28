/*
 * gelu_bench.c: the transformer block's two GELU products on the GPU, as the
 * model calls them, timed with CUDA events (the median of --reps calls after
 * 3 warm-up calls):
 *
 *   forward   gpc_op_matmul_gelu_forward: pre = inp . W_fc^T + b, act =
 *             gelu(pre); inp [N, C], W_fc [4C, C]
 *   dgelu     gpc_op_matmul_backward_dgelu of the projection after it
 *             (W_proj [C, 4C]): dinp = (dout . W_proj) * gelu'(pre), then
 *             W_proj's weight and bias gradients, and fc's bias gradient
 *             (dinp's column sums), as the model asks for them
 *   dinp      the same op with only dinp asked for: the DGELU product alone
 *   dinp_sums dinp and fc's bias gradient
 *
 *   bench_gelu_bench [--rows 65536] [--channels 768] [--reps 20]
 *
 * bf16, filled from 64 random host rows repeated. The defaults run
 * gpc's own Hopper products (gemm_sm90.cu) where the GPU has them;
 * GPC_GEMM_SM90=0 times cuBLASLt's fused epilogues instead. Prints
 * RESULT gelu NAME rows=... ms=... tflops=... (the products' FLOPs: 2NC4C
 * for the forward and dinp, twice that for dgelu's dinp and dweight).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "ops/ops.h"

#define PROG "bench_gelu_bench"
#define CHECK(x) BENCH_TRY(PROG, x)
#define REPEAT_ROWS 64

/* t filled with REPEAT_ROWS random rows in [lo, hi), repeated. */
static int fill(gpc_tensor *t, gpc_rng *rng, float lo, float hi) {
    return bench_fill_rows(PROG, t, rng, lo, hi, REPEAT_ROWS);
}

int main(int argc, char **argv) {
    int64_t N = 65536, C = 768, reps = 20;
    if (bench_parse_rows_channels_reps(PROG, argc, argv, &N, &C, 8192, &reps)) return 2;
    const gpc_backend *cuda = bench_cuda(PROG);
    if (!cuda) return 1;
    gpc_device dev = {GPC_DEVICE_CUDA, 0};
    int64_t s_x[2] = {N, C}, s_h[2] = {N, 4 * C}, s_wfc[2] = {4 * C, C}, s_wp[2] = {C, 4 * C},
            s_b4[2] = {1, 4 * C}, s_b[2] = {1, C};
    gpc_tensor inp, w_fc, b_fc, pre, act, dout, w_proj, dinp, dw, db, db_fc;
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
    CHECK(gpc_tensor_alloc(&db_fc, GPC_BF16, dev, 2, s_b4));
    gpc_rng rng;
    gpc_rng_seed(&rng, 13, 1);
    if (fill(&inp, &rng, -1, 1) || fill(&w_fc, &rng, -0.05f, 0.05f) ||
        fill(&b_fc, &rng, -0.1f, 0.1f) || fill(&dout, &rng, -1, 1) ||
        fill(&w_proj, &rng, -0.05f, 0.05f))
        return 1;
    CHECK(gpc_tensor_zero(&dw));
    CHECK(gpc_tensor_zero(&db));
    CHECK(gpc_tensor_zero(&db_fc));
    gpc_tensor bias = gpc_tensor_1d(b_fc.data, GPC_BF16, dev, 4 * C),
               dbias = gpc_tensor_1d(db.data, GPC_BF16, dev, C),
               dbias_fc = gpc_tensor_1d(db_fc.data, GPC_BF16, dev, 4 * C);

    gpc_event e0, e1;
    CHECK(cuda->event_create(&e0));
    CHECK(cuda->event_create(&e1));
    static float ms[10000]; /* --reps is at most 10000 */
    const char *names[4] = {"forward", "dgelu", "dinp", "dinp_sums"};
    for (int k = 0; k < 4; k++) {
        for (int r = -3; r < reps; r++) {
            CHECK(cuda->event_record(e0, NULL));
            if (k == 0)
                CHECK(gpc_op_matmul_gelu_forward(&pre, &act, &inp, &w_fc, &bias));
            else
                CHECK(gpc_op_matmul_backward_dgelu(
                    &dinp, k == 1 ? &dw : NULL, k == 1 ? &dbias : NULL, k != 2 ? &dbias_fc : NULL,
                    &dout, &act, &w_proj, &pre));
            CHECK(cuda->event_record(e1, NULL));
            float t;
            CHECK(cuda->event_elapsed_ms(e0, e1, &t));
            if (r >= 0) ms[r] = t;
        }
        qsort(ms, (size_t)reps, sizeof(float), bench_cmp_float);
        double flops = 2.0 * (double)N * (double)C * 4.0 * (double)C * (k == 1 ? 2.0 : 1.0);
        double med = ms[reps / 2];
        printf("RESULT gelu %s rows=%lld channels=%lld ms=%.4f min_ms=%.4f tflops=%.1f\n", names[k],
               (long long)N, (long long)C, med, ms[0], flops / (med * 1e9));
    }
    return 0;
}
