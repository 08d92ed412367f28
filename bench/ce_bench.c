/*
 * ce_bench.c: the fused cross-entropy (softmax, loss and gradient written over
 * the logits, as the model calls it) at GPT-2's classifier shape on the GPU,
 * timed with CUDA events: the median of --reps calls after 3 warm-up calls,
 * and the memory rate that makes (one read and one write of the logits).
 *
 *   bench_ce_bench [--rows 65536] [--vocab 50257] [--padded 50304]
 *                  [--reps 20] [--precision bf16]
 *
 * Each call gets fresh logits (converted from f32 outside the timed span),
 * so every call sees the same values. The f32 logits are 512 random rows
 * repeated, which keeps the host's share of the setup short.
 * Prints: RESULT crossentropy rows=... ms=... tb_per_s=...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "ops/ops.h"

#define CHECK(x) BENCH_TRY("bench_ce_bench", x)

int main(int argc, char **argv) {
    const char *prog = "bench_ce_bench";
    int64_t N = 65536, V = 50257, Vp = 50304, reps = 20;
    const char *precision = "bf16";
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = v != NULL;
        if (ok && !strcmp(a, "--rows"))
            ok = bench_parse_int64(prog, a, v, 1, 1 << 24, &N);
        else if (ok && !strcmp(a, "--vocab"))
            ok = bench_parse_int64(prog, a, v, 1, 1 << 24, &V);
        else if (ok && !strcmp(a, "--padded"))
            ok = bench_parse_int64(prog, a, v, 1, 1 << 24, &Vp);
        else if (ok && !strcmp(a, "--reps"))
            ok = bench_parse_int64(prog, a, v, 1, 10000, &reps);
        else if (ok && !strcmp(a, "--precision"))
            precision = v;
        else {
            fprintf(stderr, "%s: unknown option or missing value: %s\n", prog, a);
            return 2;
        }
        if (!ok) return 2;
    }
    if (Vp < V) {
        fprintf(stderr, "%s: --padded %lld is below --vocab %lld\n", prog, (long long)Vp,
                (long long)V);
        return 2;
    }
    gpc_dtype dt;
    if (!bench_parse_float_dtype(prog, precision, &dt)) return 2;
    const gpc_backend *cuda = bench_cuda(prog);
    if (!cuda) return 1;
    gpc_device dev = {GPC_DEVICE_CUDA, 0};
    int64_t s_l[2] = {N, Vp}, s_n[1] = {N};
    int64_t chunk = N < 512 ? N : 512, s_c[2] = {chunk, Vp};
    gpc_tensor logits, staged, losses, targets, host_l, host_t;
    CHECK(gpc_tensor_alloc(&logits, dt, dev, 2, s_l));
    CHECK(gpc_tensor_alloc(&staged, GPC_F32, dev, 2, s_l));
    CHECK(gpc_tensor_alloc(&losses, GPC_F32, dev, 1, s_n));
    CHECK(gpc_tensor_alloc(&targets, GPC_I32, dev, 1, s_n));
    CHECK(gpc_tensor_alloc(&host_l, GPC_F32, gpc_cpu(), 2, s_c));
    CHECK(gpc_tensor_alloc(&host_t, GPC_I32, gpc_cpu(), 1, s_n));
    gpc_rng rng;
    gpc_rng_seed(&rng, 7, 1);
    gpc_rng_fill_normal(&rng, host_l.data, (size_t)gpc_tensor_numel(&host_l), 0, 2);
    for (int64_t i = 0; i < N; i++)
        ((int32_t *)host_t.data)[i] = (int32_t)(gpc_rng_uniform(&rng) * (double)V) % (int32_t)V;
    for (int64_t r = 0; r < N; r += chunk) {
        int64_t rows = N - r < chunk ? N - r : chunk;
        gpc_tensor part = gpc_tensor_2d((float *)staged.data + r * Vp, GPC_F32, dev, rows, Vp);
        gpc_tensor src = gpc_tensor_2d(host_l.data, GPC_F32, gpc_cpu(), rows, Vp);
        CHECK(gpc_tensor_copy(&part, &src));
    }
    CHECK(gpc_tensor_copy(&targets, &host_t));
    gpc_event e0, e1;
    CHECK(cuda->event_create(&e0));
    CHECK(cuda->event_create(&e1));
    static float ms[10000]; /* --reps is at most 10000 */
    for (int r = -3; r < reps; r++) {
        CHECK(gpc_op_convert(&logits, &staged));
        CHECK(cuda->event_record(e0, NULL));
        CHECK(gpc_op_crossentropy_forward_backward(&losses, &logits, &logits, &targets, (int)V,
                                                   1.0f / (float)N));
        CHECK(cuda->event_record(e1, NULL));
        float t;
        CHECK(cuda->event_elapsed_ms(e0, e1, &t));
        if (r >= 0) ms[r] = t;
    }
    qsort(ms, (size_t)reps, sizeof(float), bench_cmp_float);
    float med = ms[reps / 2];
    double bytes = 2.0 * (double)N * (double)Vp * (double)gpc_dtype_size(dt);
    printf("RESULT crossentropy rows=%lld vocab=%lld padded=%lld %s ms=%.3f min_ms=%.3f "
           "tb_per_s=%.2f\n",
           (long long)N, (long long)V, (long long)Vp, precision, med, ms[0], bytes / (med * 1e9));
    return 0;
}
