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
 *   fc        gpc_op_matmul_forward: pre alone (bias in the product), the
 *             forward's product without act's write
 *   proj      gpc_op_matmul_residual_forward from act: out = res + act .
 *             W_proj^T + b, the product after the GELU
 *
 * With GPC_BENCH_ENERGY_S=S each op also runs back to back for S seconds at
 * the GPU's power cap (after S/4 to settle its clock), NVML's energy counter
 * of GPU 0 read before and after: RESULT gelu_energy NAME mj=... a call.
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

#include "bench_energy.h"
#include "ops/ops.h"

#define PROG "bench_gelu_bench"
#define CHECK(x) BENCH_TRY(PROG, x)
#define REPEAT_ROWS 64

/* t filled with REPEAT_ROWS random rows in [lo, hi), repeated. */
static int fill(gpc_tensor *t, gpc_rng *rng, float lo, float hi) {
    return bench_fill_rows(PROG, t, rng, lo, hi, REPEAT_ROWS);
}

/* The tensors of the ops timed. */
typedef struct {
    gpc_tensor inp, w_fc, pre, act, dout, w_proj, dinp, dw, res, out;
    gpc_tensor bias, dbias, dbias_fc, bias_proj;
} mlp;

/* Queues op k (see the list above). */
static gpc_status run_op(mlp *m, int k) {
    switch (k) {
    case 0:
        return gpc_op_matmul_gelu_forward(&m->pre, &m->act, &m->inp, &m->w_fc, &m->bias);
    case 4:
        return gpc_op_matmul_forward(&m->pre, &m->inp, &m->w_fc, &m->bias);
    case 5:
        return gpc_op_matmul_residual_forward(&m->out, &m->act, &m->w_proj, &m->bias_proj, &m->res);
    default:
        return gpc_op_matmul_backward_dgelu(&m->dinp, k == 1 ? &m->dw : NULL,
                                            k == 1 ? &m->dbias : NULL, k != 2 ? &m->dbias_fc : NULL,
                                            &m->dout, &m->act, &m->w_proj, &m->pre);
    }
}

/* One op of the bench, for bench_energy_sustain. */
typedef struct {
    mlp *m;
    int k;
} op_call;

static gpc_status run_call(void *ctx) {
    op_call *c = ctx;
    return run_op(c->m, c->k);
}

int main(int argc, char **argv) {
    int64_t N = 65536, C = 768, reps = 20;
    if (bench_parse_rows_channels_reps(PROG, argc, argv, &N, &C, 8192, &reps)) return 2;
    double energy_s;
    if (!bench_energy_seconds(PROG, &energy_s)) return 2;
    const gpc_backend *cuda = bench_cuda(PROG);
    if (!cuda) return 1;
    gpc_device dev = {GPC_DEVICE_CUDA, 0};
    int64_t s_x[2] = {N, C}, s_h[2] = {N, 4 * C}, s_wfc[2] = {4 * C, C}, s_wp[2] = {C, 4 * C},
            s_b4[2] = {1, 4 * C}, s_b[2] = {1, C};
    mlp m;
    gpc_tensor b_fc, db, db_fc;
    CHECK(gpc_tensor_alloc(&m.inp, GPC_BF16, dev, 2, s_x));
    CHECK(gpc_tensor_alloc(&m.w_fc, GPC_BF16, dev, 2, s_wfc));
    CHECK(gpc_tensor_alloc(&b_fc, GPC_BF16, dev, 2, s_b4));
    CHECK(gpc_tensor_alloc(&m.pre, GPC_BF16, dev, 2, s_h));
    CHECK(gpc_tensor_alloc(&m.act, GPC_BF16, dev, 2, s_h));
    CHECK(gpc_tensor_alloc(&m.dout, GPC_BF16, dev, 2, s_x));
    CHECK(gpc_tensor_alloc(&m.w_proj, GPC_BF16, dev, 2, s_wp));
    CHECK(gpc_tensor_alloc(&m.dinp, GPC_BF16, dev, 2, s_h));
    CHECK(gpc_tensor_alloc(&m.dw, GPC_BF16, dev, 2, s_wp));
    CHECK(gpc_tensor_alloc(&db, GPC_BF16, dev, 2, s_b));
    CHECK(gpc_tensor_alloc(&db_fc, GPC_BF16, dev, 2, s_b4));
    CHECK(gpc_tensor_alloc(&m.res, GPC_BF16, dev, 2, s_x));
    CHECK(gpc_tensor_alloc(&m.out, GPC_BF16, dev, 2, s_x));
    gpc_rng rng;
    gpc_rng_seed(&rng, 13, 1);
    if (fill(&m.inp, &rng, -1, 1) || fill(&m.w_fc, &rng, -0.05f, 0.05f) ||
        fill(&b_fc, &rng, -0.1f, 0.1f) || fill(&m.dout, &rng, -1, 1) ||
        fill(&m.w_proj, &rng, -0.05f, 0.05f) || fill(&m.res, &rng, -1, 1))
        return 1;
    CHECK(gpc_tensor_zero(&m.dw));
    CHECK(gpc_tensor_zero(&db));
    CHECK(gpc_tensor_zero(&db_fc));
    m.bias = gpc_tensor_1d(b_fc.data, GPC_BF16, dev, 4 * C);
    m.dbias = gpc_tensor_1d(db.data, GPC_BF16, dev, C);
    m.dbias_fc = gpc_tensor_1d(db_fc.data, GPC_BF16, dev, 4 * C);
    m.bias_proj = gpc_tensor_1d(b_fc.data, GPC_BF16, dev, C);
    CHECK(run_op(&m, 0)); /* pre and act for them all */

    gpc_nvml *nvml = NULL;
    if (energy_s > 0) CHECK(gpc_nvml_open(&nvml));
    gpc_event e0, e1;
    CHECK(cuda->event_create(&e0));
    CHECK(cuda->event_create(&e1));
    static float ms[10000]; /* --reps is at most 10000 */
    const char *names[6] = {"forward", "dgelu", "dinp", "dinp_sums", "fc", "proj"};
    for (int k = 0; k < 6; k++) {
        for (int r = -3; r < reps; r++) {
            CHECK(cuda->event_record(e0, NULL));
            CHECK(run_op(&m, k));
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
        op_call call = {&m, k};
        if (energy_s > 0 && bench_energy_sustain(PROG, cuda, nvml, run_call, &call, energy_s,
                                                 "gelu_energy", names[k], flops))
            return 1;
    }
    if (nvml) gpc_nvml_close(nvml);
    return 0;
}
