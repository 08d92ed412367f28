/*
 * gemm_bench.c: each matrix product of a GPT-2 training step through gpc's
 * matmul ops (cuBLASLt, bias epilogue) against plain cuBLAS (cublasGemmEx)
 * on the same shapes, bf16 in and out with f32 accumulation.
 *
 *   bench_gemm_bench [--depth 12] [--batch 64] [--context 1024] [--reps 20]
 *
 * For each layer kind (qkv, attention projection, fc, fc projection, the
 * output head) it times forward (out = inp W^T + b), backward dinp and
 * dweight together (dout W, and dW += dout^T inp), dweight alone, and for
 * the layers with a bias dweight with the bias gradient (db += the column
 * sums of dout), as gpc's ops run them, and the same work through
 * cublasGemmEx with no epilogue (the bias gradient as a product with a
 * vector of ones). Each figure is the median of `reps` runs (CUDA events),
 * after warm-up, on random data; the ratio column is cuBLAS time / gpc time
 * (1.0 or more: gpc as fast).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef GPC_HAVE_CUDA
int main(void) {
    puts("bench_gemm_bench: this gpc was built without CUDA");
    return 0;
}
#else
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "bench_util.h"
#include "ops/ops.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "bench_gemm_bench: %s failed at line %d: %s\n", #x, __LINE__,          \
                    gpc_last_error());                                                             \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static gpc_tensor dev_random(int64_t rows, int64_t cols, gpc_rng *rng) {
    gpc_tensor t, h;
    int64_t shape[2] = {rows, cols};
    CHECK(gpc_tensor_alloc(&t, GPC_BF16, (gpc_device){GPC_DEVICE_CUDA, 0}, 2, shape) == GPC_OK);
    CHECK(gpc_tensor_alloc(&h, GPC_BF16, gpc_cpu(), 2, shape) == GPC_OK);
    uint16_t *p = h.data;
    for (int64_t i = 0; i < rows * cols; i++)
        p[i] = gpc_f32_to_bf16(0.05f * (gpc_rng_uniform(rng) * 2.0f - 1.0f));
    CHECK(gpc_tensor_copy(&t, &h) == GPC_OK);
    gpc_tensor_free(&h);
    return t;
}

/* What is timed: gpc's ops, then the same work through cuBLAS */
enum { FWD, BOTH, DW, DWB, KINDS, BLAS = KINDS };

/* dW += dout^T inp through cuBLAS, and with db db += dout^T ones */
static void blas_dweight(cublasHandle_t blas, const gpc_tensor *x, const gpc_tensor *dy,
                         gpc_tensor *dw, gpc_tensor *db, const gpc_tensor *ones) {
    int N = (int)x->shape[0], C = (int)x->shape[1], OC = (int)dy->shape[1];
    float one = 1.0f;
    CHECK(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, x->data, CUDA_R_16BF, C,
                       dy->data, CUDA_R_16BF, OC, &one, dw->data, CUDA_R_16BF, C,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    if (db)
        CHECK(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, OC, 1, N, &one, dy->data, CUDA_R_16BF,
                           OC, ones->data, CUDA_R_16BF, N, &one, db->data, CUDA_R_16BF, OC,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
}

/* kind: FWD .. DWB through gpc's ops, BLAS + the same through cuBLAS */
static float time_one(int kind, int reps, cublasHandle_t blas, gpc_tensor *x, gpc_tensor *w,
                      gpc_tensor *b, gpc_tensor *y, gpc_tensor *dy, gpc_tensor *dx, gpc_tensor *dw,
                      gpc_tensor *db, const gpc_tensor *ones, int has_bias) {
    int N = (int)x->shape[0], C = (int)x->shape[1], OC = (int)w->shape[0];
    float one = 1.0f, zero = 0.0f, *ms = malloc(sizeof(float) * (size_t)reps);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int r = -3; r < reps; r++) {
        cudaEventRecord(e0, 0);
        switch (kind) {
        case FWD:
            CHECK(gpc_op_matmul_forward(y, x, w, has_bias ? b : NULL) == GPC_OK);
            break;
        case BOTH:
            CHECK(gpc_op_matmul_backward(dx, dw, NULL, dy, x, w) == GPC_OK);
            break;
        case DW:
        case DWB:
            CHECK(gpc_op_matmul_backward(NULL, dw, kind == DWB ? db : NULL, dy, x, w) == GPC_OK);
            break;
        case BLAS + FWD:
            CHECK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, w->data, CUDA_R_16BF,
                               C, x->data, CUDA_R_16BF, C, &zero, y->data, CUDA_R_16BF, OC,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
            break;
        case BLAS + BOTH:
            CHECK(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, w->data, CUDA_R_16BF,
                               C, dy->data, CUDA_R_16BF, OC, &zero, dx->data, CUDA_R_16BF, C,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
            blas_dweight(blas, x, dy, dw, NULL, NULL);
            break;
        case BLAS + DW:
        case BLAS + DWB:
            blas_dweight(blas, x, dy, dw, kind == BLAS + DWB ? db : NULL, ones);
            break;
        }
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        if (r >= 0) cudaEventElapsedTime(&ms[r], e0, e1);
    }
    CHECK(cudaGetLastError() == cudaSuccess);
    qsort(ms, (size_t)reps, sizeof(float), bench_cmp_float);
    float median = ms[reps / 2];
    free(ms);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return median;
}

int main(int argc, char **argv) {
    int depth = 12, B = 64, T = 1024, reps = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--depth")) depth = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--batch")) B = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--context")) T = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
    }
    if (!bench_cuda("bench_gemm_bench")) return 1;
    int C = 64 * depth, N = B * T;
    struct {
        const char *name;
        int C, OC, bias;
    } layers[] = {{"qkv", C, 3 * C, 1},
                  {"attproj", C, C, 1},
                  {"fc", C, 4 * C, 1},
                  {"fcproj", 4 * C, C, 1},
                  {"head", C, 50304, 0}};
    cublasHandle_t blas;
    CHECK(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS);
    gpc_rng rng;
    gpc_rng_seed(&rng, 7, 1);
    printf("GEMMs of a d%d step, N=%d rows, bf16, median of %d (ms; TFLOP/s; ratio = cuBLAS/gpc)\n",
           depth, N, reps);
    printf("%-8s %-9s %9s %8s %9s %8s %6s\n", "layer", "product", "gpc ms", "TFLOP/s", "cuBLAS ms",
           "TFLOP/s", "ratio");
    gpc_tensor ones = dev_random(N, 1, &rng);
    {
        gpc_tensor h;
        CHECK(gpc_tensor_alloc(&h, GPC_BF16, gpc_cpu(), 2, ones.shape) == GPC_OK);
        for (int i = 0; i < N; i++)
            ((uint16_t *)h.data)[i] = gpc_f32_to_bf16(1.0f);
        CHECK(gpc_tensor_copy(&ones, &h) == GPC_OK);
        gpc_tensor_free(&h);
    }
    for (size_t l = 0; l < sizeof layers / sizeof layers[0]; l++) {
        int c = layers[l].C, oc = layers[l].OC;
        gpc_tensor x = dev_random(N, c, &rng), w = dev_random(oc, c, &rng),
                   b = dev_random(1, oc, &rng), y = dev_random(N, oc, &rng),
                   dy = dev_random(N, oc, &rng), dx = dev_random(N, c, &rng),
                   dw = dev_random(oc, c, &rng), db = dev_random(1, oc, &rng);
        b.ndim = db.ndim = 1;
        b.shape[0] = db.shape[0] = oc;
        double flops = 2.0 * N * c * oc;
        const char *what[KINDS] = {"forward", "bwd both", "dweight", "dw+dbias"};
        for (int k = 0; k < (layers[l].bias ? KINDS : DWB); k++) {
            float g =
                time_one(k, reps, blas, &x, &w, &b, &y, &dy, &dx, &dw, &db, &ones, layers[l].bias);
            float r = time_one(BLAS + k, reps, blas, &x, &w, &b, &y, &dy, &dx, &dw, &db, &ones, 0);
            double f = k == BOTH ? 2 * flops : flops;
            printf("%-8s %-9s %9.3f %8.1f %9.3f %8.1f %6.3f\n", layers[l].name, what[k], g,
                   f / (g * 1e9), r, f / (r * 1e9), r / g);
        }
        gpc_tensor *all[] = {&x, &w, &b, &y, &dy, &dx, &dw, &db};
        for (int i = 0; i < 8; i++)
            gpc_tensor_free(all[i]);
    }
    gpc_tensor_free(&ones);
    cublasDestroy(blas);
    return 0;
}
#endif
