/*
 * ops_cpu.c: time of each CPU op at the shapes of a GPT-2 d12 training step
 * (B=4, T=64, C=768, vocabulary 50257 padded to 50304), and attention at
 * T=1024, so the step's time can be attributed to ops and GFLOP/s compared
 * with bench_gemm_cpu. Usage: bench_ops_cpu [B T C NH]. Median of 5 runs
 * after a warm-up; inputs are random (the time does not depend on values).
 */
#include "gpc/core.h"
#include "ops/ops.h"

#include <stdio.h>
#include <stdlib.h>

static gpc_rng rng;

static float *buffer(int64_t n) {
    float *p = malloc((size_t)n * sizeof(float));
    if (!p) {
        fprintf(stderr, "bench_ops_cpu: error: out of memory\n");
        exit(1);
    }
    gpc_rng_fill_normal(&rng, p, (size_t)n, 0.0f, 0.5f);
    return p;
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define TIME(label, flops, expr)                                                                   \
    do {                                                                                           \
        double samples_[5];                                                                        \
        if ((expr) != GPC_OK) {                                                                    \
            fprintf(stderr, "bench_ops_cpu: error: %s: %s\n", label, gpc_last_error());            \
            return 1;                                                                              \
        }                                                                                          \
        for (int r_ = 0; r_ < 5; r_++) {                                                           \
            double t0_ = gpc_time_seconds();                                                       \
            (void)(expr);                                                                          \
            samples_[r_] = gpc_time_seconds() - t0_;                                               \
        }                                                                                          \
        qsort(samples_, 5, sizeof(double), compare_double);                                        \
        double f_ = (flops);                                                                       \
        printf("%-36s %10.3f ms", label, samples_[2] * 1e3);                                       \
        if (f_ > 0) printf(" %8.1f GFLOP/s", f_ / samples_[2] * 1e-9);                             \
        printf("\n");                                                                              \
    } while (0)

int main(int argc, char **argv) {
    int64_t B = 4, T = 64, C = 768, NH = 12, V = 50257, Vp = 50304;
    if (argc == 5) {
        B = atoll(argv[1]), T = atoll(argv[2]), C = atoll(argv[3]), NH = atoll(argv[4]);
    } else if (argc != 1) {
        fprintf(stderr, "usage: bench_ops_cpu [B T C NH]\n");
        return 2;
    }
    gpc_rng_seed(&rng, 1, 1);
    int64_t N = B * T;
    gpc_device cpu = gpc_cpu();
    printf("shapes: B=%lld T=%lld C=%lld NH=%lld Vp=%lld\n", (long long)B, (long long)T,
           (long long)C, (long long)NH, (long long)Vp);
    float *x = buffer(N * C), *y = buffer(N * 4 * C), *w = buffer(4 * C * C), *b = buffer(4 * C);
    float *dx = buffer(N * 4 * C), *dw = buffer(4 * C * C), *db = buffer(4 * C);
    float *mean = buffer(N), *rstd = buffer(N), *qkv = buffer(N * 3 * C), *att = buffer(N * C);
    float *lse = buffer(B * NH * T), *dqkv = buffer(N * 3 * C);
    gpc_tensor tx = gpc_tensor_2d(x, GPC_F32, cpu, N, C);
    gpc_tensor tw4 = gpc_tensor_2d(w, GPC_F32, cpu, 4 * C, C);
    gpc_tensor tb4 = gpc_tensor_1d(b, GPC_F32, cpu, 4 * C);
    gpc_tensor ty4 = gpc_tensor_2d(y, GPC_F32, cpu, N, 4 * C);
    gpc_tensor tdy4 = gpc_tensor_2d(dx, GPC_F32, cpu, N, 4 * C);
    gpc_tensor tdx = gpc_tensor_2d(att, GPC_F32, cpu, N, C);
    gpc_tensor tdw4 = gpc_tensor_2d(dw, GPC_F32, cpu, 4 * C, C);
    gpc_tensor tdb4 = gpc_tensor_1d(db, GPC_F32, cpu, 4 * C);
    gpc_tensor tc = gpc_tensor_1d(b, GPC_F32, cpu, C), tdc = gpc_tensor_1d(db, GPC_F32, cpu, C);
    gpc_tensor tmean = gpc_tensor_1d(mean, GPC_F32, cpu, N);
    gpc_tensor trstd = gpc_tensor_1d(rstd, GPC_F32, cpu, N);
    gpc_tensor tqkv = gpc_tensor_3d(qkv, GPC_F32, cpu, B, T, 3 * C);
    gpc_tensor tatt = gpc_tensor_3d(att, GPC_F32, cpu, B, T, C);
    gpc_tensor tlse = gpc_tensor_3d(lse, GPC_F32, cpu, B, NH, T);
    gpc_tensor tdqkv = gpc_tensor_3d(dqkv, GPC_F32, cpu, B, T, 3 * C);
    gpc_tensor tdatt = gpc_tensor_3d(x, GPC_F32, cpu, B, T, C);
    double mm = 2.0 * N * C * 4 * C;
    TIME("matmul_forward (fc, C -> 4C)", mm, gpc_op_matmul_forward(&ty4, &tx, &tw4, &tb4));
    TIME("matmul_backward (fc)", 2 * mm,
         gpc_op_matmul_backward(&tdx, &tdw4, &tdb4, &tdy4, &tx, &tw4));
    TIME("layernorm_forward", 0, gpc_op_layernorm_forward(&tdx, &tmean, &trstd, &tx, &tc, &tc));
    TIME("layernorm_backward", 0,
         gpc_op_layernorm_backward(&tdx, &tdc, &tdc, NULL, &tx, &tx, &tc, &tmean, &trstd));
    TIME("gelu_forward (4C)", 0, gpc_op_gelu_forward(&tdy4, &ty4));
    TIME("gelu_backward (4C)", 0, gpc_op_gelu_backward(&tdy4, &ty4, &tdy4));
    double af = 4.0 * B * NH * (T * (T + 1) / 2.0) * (C / NH);
    TIME("attention_forward", af, gpc_op_attention_forward(&tatt, &tlse, &tqkv, (int)NH));
    TIME("attention_backward", 2 * af,
         gpc_op_attention_backward(&tdqkv, &tdatt, &tqkv, &tatt, &tlse, (int)NH));
    free(y), free(dx);
    float *logits = buffer(N * Vp), *losses = buffer(N), *wte = buffer(Vp * C);
    int32_t *targets = malloc((size_t)N * sizeof *targets);
    for (int64_t i = 0; i < N; i++)
        targets[i] = (int32_t)gpc_rng_below(&rng, (uint32_t)V);
    gpc_tensor tlogits = gpc_tensor_2d(logits, GPC_F32, cpu, N, Vp);
    gpc_tensor twte = gpc_tensor_2d(wte, GPC_F32, cpu, Vp, C);
    gpc_tensor tlosses = gpc_tensor_1d(losses, GPC_F32, cpu, N);
    gpc_tensor ttargets = gpc_tensor_1d(targets, GPC_I32, cpu, N);
    double lm = 2.0 * N * C * Vp;
    TIME("matmul_forward (classifier)", lm, gpc_op_matmul_forward(&tlogits, &tx, &twte, NULL));
    TIME("crossentropy_forward_backward", 0,
         gpc_op_crossentropy_forward_backward(&tlosses, &tlogits, &tlogits, &ttargets, (int)V,
                                              1.0f / (float)N));
    free(w), free(dw), free(b), free(db), free(x), free(mean), free(rstd), free(qkv), free(att);
    free(lse), free(dqkv), free(logits), free(losses), free(wte), free(targets);
    return 0;
}
