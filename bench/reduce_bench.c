/*
 * reduce_bench.c: the memory-bound reductions of GPT-2's backward pass on the
 * GPU, as the model calls them, timed with CUDA events (the median of --reps
 * timings after 3 warm-up ones, each over BATCH calls in a row so that the
 * host's launch time hides behind the GPU's work, as in a training step)
 * with the memory rate each makes:
 *
 *   layernorm   gpc_op_layernorm_backward with dinp's column sums, [N, C]:
 *               reads dout, inp and dinp, writes dinp (4 N C elements)
 *   fc_bias     the fc bias gradient, column sums of [N, 4C] (N 4C read)
 *   q_bias      the query third of the qkv bias gradient, columns 0..C-1 of
 *               [N, 3C] (N C read)
 *
 *   bench_reduce_bench [--rows 65536] [--channels 768] [--reps 20]
 *
 * The tensors are bf16, filled from 64 random host rows repeated. Prints one
 * line per reduction: RESULT reduce NAME rows=... ms=... tb_per_s=...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "ops/ops.h"

#define PROG "bench_reduce_bench"
#define CHECK(x) BENCH_TRY(PROG, x)
#define REPEAT_ROWS 64
#define BATCH 10

/* t filled with REPEAT_ROWS random rows in [lo, hi), repeated. */
static int fill(gpc_tensor *t, gpc_rng *rng, float lo, float hi) {
    return bench_fill_rows(PROG, t, rng, lo, hi, REPEAT_ROWS);
}

enum { LAYERNORM, FC_BIAS, Q_BIAS, KINDS };
static const char *const kind_names[KINDS] = {"layernorm", "fc_bias", "q_bias"};

int main(int argc, char **argv) {
    int64_t N = 65536, C = 768, reps = 20;
    if (bench_parse_rows_channels_reps(PROG, argc, argv, &N, &C, 4096, &reps)) return 2;
    if (C % 8) {
        fprintf(stderr, "%s: --channels needs a multiple of 8, not %lld\n", PROG, (long long)C);
        return 2;
    }
    const gpc_backend *cuda = bench_cuda(PROG);
    if (!cuda) return 1;
    gpc_device dev = {GPC_DEVICE_CUDA, 0};
    int64_t s_x[2] = {N, C}, s_fc[2] = {N, 4 * C}, s_qkv[2] = {N, 3 * C}, s_c[1] = {C},
            s_4c[1] = {4 * C}, s_n[1] = {N};
    gpc_tensor dout, inp, dinp, fc, qkv, w, dw, db, ds, dfc, mean, rstd;
    CHECK(gpc_tensor_alloc(&dout, GPC_BF16, dev, 2, s_x));
    CHECK(gpc_tensor_alloc(&inp, GPC_BF16, dev, 2, s_x));
    CHECK(gpc_tensor_alloc(&dinp, GPC_BF16, dev, 2, s_x));
    CHECK(gpc_tensor_alloc(&fc, GPC_BF16, dev, 2, s_fc));
    CHECK(gpc_tensor_alloc(&qkv, GPC_BF16, dev, 2, s_qkv));
    CHECK(gpc_tensor_alloc(&w, GPC_F32, dev, 1, s_c));
    CHECK(gpc_tensor_alloc(&dw, GPC_F32, dev, 1, s_c));
    CHECK(gpc_tensor_alloc(&db, GPC_F32, dev, 1, s_c));
    CHECK(gpc_tensor_alloc(&ds, GPC_F32, dev, 1, s_c));
    CHECK(gpc_tensor_alloc(&dfc, GPC_F32, dev, 1, s_4c));
    CHECK(gpc_tensor_alloc(&mean, GPC_F32, dev, 1, s_n));
    CHECK(gpc_tensor_alloc(&rstd, GPC_F32, dev, 1, s_n));
    gpc_rng rng;
    gpc_rng_seed(&rng, 11, 1);
    if (fill(&dout, &rng, -1, 1) || fill(&inp, &rng, -2, 2) || fill(&dinp, &rng, -1, 1) ||
        fill(&fc, &rng, -1, 1) || fill(&qkv, &rng, -1, 1))
        return 1;
    gpc_tensor w2 = gpc_tensor_2d(w.data, GPC_F32, dev, 1, C),
               mean2 = gpc_tensor_2d(mean.data, GPC_F32, dev, 1, N),
               rstd2 = gpc_tensor_2d(rstd.data, GPC_F32, dev, 1, N);
    if (fill(&w2, &rng, 0.5f, 1.5f) || fill(&mean2, &rng, -0.1f, 0.1f) ||
        fill(&rstd2, &rng, 0.5f, 2.0f))
        return 1;
    CHECK(gpc_tensor_zero(&dw));
    CHECK(gpc_tensor_zero(&db));
    CHECK(gpc_tensor_zero(&ds));
    CHECK(gpc_tensor_zero(&dfc));

    gpc_event e0, e1;
    CHECK(cuda->event_create(&e0));
    CHECK(cuda->event_create(&e1));
    static float ms[10000]; /* --reps is at most 10000 */
    for (int k = 0; k < KINDS; k++) {
        for (int r = -3; r < reps; r++) {
            CHECK(cuda->event_record(e0, NULL));
            for (int b = 0; b < BATCH; b++) {
                if (k == LAYERNORM)
                    CHECK(gpc_op_layernorm_backward(&dinp, &dw, &db, &ds, &dout, &inp, &w, &mean,
                                                    &rstd));
                else if (k == FC_BIAS)
                    CHECK(gpc_op_column_sums(&dfc, &fc, 0));
                else
                    CHECK(gpc_op_column_sums(&ds, &qkv, 0));
            }
            CHECK(cuda->event_record(e1, NULL));
            float t;
            CHECK(cuda->event_elapsed_ms(e0, e1, &t));
            if (r >= 0) ms[r] = t / BATCH;
        }
        qsort(ms, (size_t)reps, sizeof(float), bench_cmp_float);
        double elems = k == LAYERNORM ? 4.0 * C : k == FC_BIAS ? 4.0 * C : 1.0 * C;
        double bytes = elems * (double)N * 2.0, med = ms[reps / 2];
        printf("RESULT reduce %s rows=%lld channels=%lld ms=%.4f min_ms=%.4f tb_per_s=%.2f\n",
               kind_names[k], (long long)N, (long long)C, med, ms[0], bytes / (med * 1e9));
    }
    return 0;
}
