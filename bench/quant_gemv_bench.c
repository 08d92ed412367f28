/*
 * quant_gemv_bench.c: the products of decoding (a few rows against a whole
 * weight) with quantized and bf16 weights on the GPU, as GB/s of weight
 * bytes read, so that a product can be set against the memory's rate.
 *
 * For each weight shape OC x C (default GPT-2's fc 3072 x 768 and fcproj
 * 768 x 3072 at d12, the head's 50304 x 768, and d48's fc 6400 x 1600 and
 * fcproj 1600 x 6400) and each row count M (--rows, default 1,16) it times
 * out[M, OC] = inp[M, C] @ W^T + bias for:
 *
 *   bf16         gpc_op_matmul_forward on bf16 weights (gemv_kernel up to 4
 *                rows, cuBLASLt beyond)
 *   bf16 decode_product  gpc_op_decode_product (src/cuda/decode.cu, the
 *                fused products of serving steps of up to 16 rows), with
 *                the bias only; consecutive calls overlap their starts as
 *                in the step (GPC_DECODE_PDL)
 *   int8 skinny  gpc_op_matmul_quant_forward, per-channel int8, the skinny
 *                kernel (GPC_QUANT_GEMV_MAX_M 16)
 *   int8 earlier the same with the skinny kernel off (limit 0): the
 *                warp-per-channel kernel up to 4 rows, the tiled one beyond
 *   fp8 skinny, fp8 earlier  the same for per-channel E4M3
 *   fp8t earlier per-tensor E4M3 with the skinny kernel off: cuBLASLt's FP8
 *                product beyond 4 rows
 *
 * A product of a few MiB would sit in the H200's L2 if it ran again on the
 * same weight, so each timing walks copies of the weight (at least 256 MiB
 * of them) in turn: every call reads its weight from memory. A timing is
 * --calls calls between two events; before the first event it queues about
 * 2 ms of large bf16 products, so the host's launches run ahead and the GPU
 * runs the timed calls back to back: the figure is the kernels' own rate,
 * not the rate of launches. The median of 5 timings is kept. Prints
 *
 *   RESULT quant_gemv shape=OCxC rows=M weights=NAME path=PATH us=... gbps=...
 *     fraction=...
 *
 * with fraction the GB/s over --peak-gbps (default 4800, an H200's HBM3e).
 *
 *   bench_quant_gemv_bench [--rows 1,16] [--calls 200] [--peak-gbps 4800]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "ops/ops.h"

#define PROG "bench_quant_gemv_bench"

#ifndef GPC_HAVE_CUDA
int main(void) {
    fprintf(stderr, "%s: gpc was built without CUDA; this benchmark times GPU kernels\n", PROG);
    return 1;
}
#else
#include "cuda/quant.h"

#define CHECK(x) BENCH_TRY(PROG, x)
#define MIN_BYTES ((size_t)256 << 20)
#define MAX_ROWS 16

typedef struct {
    const char *name, *path;
    gpc_dtype dtype;         /* of the weight */
    int per_channel, skinny; /* skinny 2: gpc_op_decode_product */
} variant;

static const variant variants[] = {
    {"bf16", "gemv_or_cublaslt", GPC_BF16, 0, 0},
    {"bf16", "decode_product", GPC_BF16, 0, 2},
    {"int8", "skinny", GPC_I8, 1, 1},
    {"int8", "earlier", GPC_I8, 1, 0},
    {"fp8", "skinny", GPC_F8E4M3, 1, 1},
    {"fp8", "earlier", GPC_F8E4M3, 1, 0},
    {"fp8t", "earlier", GPC_F8E4M3, 0, 0},
};

/* Host bytes for a weight of dtype: bf16 values of +-0.05, or random 8-bit
 * codes (E4M3's NaN codes avoided). */
static void fill_host(unsigned char *h, size_t n, gpc_dtype dtype, gpc_rng *rng) {
    for (size_t i = 0; i < n; i++) {
        if (dtype == GPC_BF16) {
            uint16_t v = gpc_f32_to_bf16(0.1f * (float)gpc_rng_uniform(rng) - 0.05f);
            memcpy(h + 2 * i, &v, 2);
        } else {
            uint8_t b = (uint8_t)gpc_rng_below(rng, 256);
            if (dtype == GPC_F8E4M3 && (b & 0x7f) == 0x7f) b ^= 1;
            h[i] = b;
        }
    }
}

/* Parses "1,16" into rows[] (1 to MAX_ROWS each); returns the count, 0 on
 * a bad list. */
static int parse_rows(const char *text, int *rows, int max) {
    int n = 0;
    const char *p = text;
    while (*p && n < max) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > MAX_ROWS || (*end && *end != ',')) return 0;
        rows[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return *p ? 0 : n;
}

int main(int argc, char **argv) {
    int rows[8], n_rows = 2;
    rows[0] = 1, rows[1] = 16;
    int64_t calls = 200, peak = 4800;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = v != NULL;
        if (ok && strcmp(a, "--rows") == 0)
            ok = (n_rows = parse_rows(v, rows, 8)) > 0;
        else if (ok && strcmp(a, "--calls") == 0)
            ok = bench_parse_int64(PROG, a, v, 1, 100000, &calls);
        else if (ok && strcmp(a, "--peak-gbps") == 0)
            ok = bench_parse_int64(PROG, a, v, 1, 1000000, &peak);
        else
            ok = 0;
        if (!ok) {
            fprintf(stderr,
                    "usage: %s [--rows 1,16 (1 to %d each)] [--calls 200] [--peak-gbps 4800]\n",
                    PROG, MAX_ROWS);
            return 2;
        }
        i++;
    }
    const gpc_backend *cuda = bench_cuda(PROG);
    if (!cuda) return 1;
    gpc_device dev = {GPC_DEVICE_CUDA, 0};
    const int shapes[][2] = {{3072, 768}, {768, 3072}, {50304, 768}, {6400, 1600}, {1600, 6400}};
    gpc_rng rng;
    gpc_rng_seed(&rng, 17, 1);
    gpc_event e0, e1;
    CHECK(cuda->event_create(&e0));
    CHECK(cuda->event_create(&e1));
    /* the queued work ahead of a timing: 8192 x 4096 x 4096 products */
    int64_t s_da[2] = {8192, 4096}, s_dw[2] = {4096, 4096};
    gpc_tensor da, dw, dout;
    CHECK(gpc_tensor_alloc(&da, GPC_BF16, dev, 2, s_da));
    CHECK(gpc_tensor_alloc(&dw, GPC_BF16, dev, 2, s_dw));
    CHECK(gpc_tensor_alloc(&dout, GPC_BF16, dev, 2, s_da));
    CHECK(gpc_tensor_zero(&da));
    CHECK(gpc_tensor_zero(&dw));
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t OC = shapes[s][0], C = shapes[s][1];
        /* activations, bias, output and scales, shared by the variants */
        int64_t s_x[2] = {MAX_ROWS, C}, s_o[2] = {MAX_ROWS, OC};
        gpc_tensor x, out, bias, scales, scale1;
        CHECK(gpc_tensor_alloc(&x, GPC_BF16, dev, 2, s_x));
        CHECK(gpc_tensor_alloc(&out, GPC_BF16, dev, 2, s_o));
        CHECK(gpc_tensor_alloc(&bias, GPC_BF16, dev, 1, &OC));
        CHECK(gpc_tensor_alloc(&scales, GPC_F32, dev, 1, &OC));
        int64_t one = 1;
        CHECK(gpc_tensor_alloc(&scale1, GPC_F32, dev, 1, &one));
        unsigned char *h = malloc((size_t)(OC > C ? OC : C) * MAX_ROWS * 2);
        if (!h) return 1;
        fill_host(h, (size_t)MAX_ROWS * (size_t)C, GPC_BF16, &rng);
        gpc_tensor hx = gpc_tensor_2d(h, GPC_BF16, gpc_cpu(), MAX_ROWS, C);
        CHECK(gpc_tensor_copy(&x, &hx));
        fill_host(h, (size_t)OC, GPC_BF16, &rng);
        gpc_tensor hb = gpc_tensor_1d(h, GPC_BF16, gpc_cpu(), OC);
        CHECK(gpc_tensor_copy(&bias, &hb));
        free(h);
        float *hs = malloc(sizeof(float) * (size_t)OC);
        if (!hs) return 1;
        for (int64_t o = 0; o < OC; o++)
            hs[o] = 0.001f + 0.001f * (float)gpc_rng_uniform(&rng);
        gpc_tensor hsc = gpc_tensor_1d(hs, GPC_F32, gpc_cpu(), OC);
        CHECK(gpc_tensor_copy(&scales, &hsc));
        gpc_tensor hs1 = gpc_tensor_1d(hs, GPC_F32, gpc_cpu(), 1);
        CHECK(gpc_tensor_copy(&scale1, &hs1));
        free(hs);
        for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
            const variant *var = &variants[v];
            size_t bytes = (size_t)OC * (size_t)C * gpc_dtype_size(var->dtype);
            int copies = (int)((MIN_BYTES + bytes - 1) / bytes);
            if (copies < 2) copies = 2;
            int64_t s_w[2] = {(int64_t)copies * OC, C};
            gpc_tensor all;
            CHECK(gpc_tensor_alloc(&all, var->dtype, dev, 2, s_w));
            /* one copy made on the host, repeated on the device */
            unsigned char *hw = malloc(bytes);
            if (!hw) return 1;
            fill_host(hw, (size_t)OC * (size_t)C, var->dtype, &rng);
            for (int k = 0; k < copies; k++) {
                gpc_tensor dst =
                    gpc_tensor_2d((char *)all.data + (size_t)k * bytes, var->dtype, dev, OC, C);
                gpc_tensor src = gpc_tensor_2d(hw, var->dtype, gpc_cpu(), OC, C);
                CHECK(gpc_tensor_copy(&dst, &src));
            }
            free(hw);
            int before = gpc_cuda_quant_set_gemv_max_rows(var->skinny == 1 ? MAX_ROWS : 0);
            const gpc_decode_product_args fused = {.bias = &bias};
            for (int r = 0; r < n_rows; r++) {
                int M = rows[r];
                gpc_tensor xm = gpc_tensor_2d(x.data, GPC_BF16, dev, M, C);
                gpc_tensor om = gpc_tensor_2d(out.data, GPC_BF16, dev, M, OC);
                double us[5];
                for (int t = -1; t < 5; t++) { /* t = -1: warm-up */
                    for (int d = 0; d < 4; d++)
                        CHECK(gpc_op_matmul_forward(&dout, &da, &dw, NULL));
                    CHECK(cuda->event_record(e0, NULL));
                    for (int64_t c = 0; c < calls; c++) {
                        gpc_tensor w =
                            gpc_tensor_2d((char *)all.data + (size_t)(c % copies) * bytes,
                                          var->dtype, dev, OC, C);
                        if (var->skinny == 2)
                            CHECK(gpc_op_decode_product(&om, &xm, &w, &fused));
                        else if (var->dtype == GPC_BF16)
                            CHECK(gpc_op_matmul_forward(&om, &xm, &w, &bias));
                        else
                            CHECK(gpc_op_matmul_quant_forward(
                                &om, &xm, &w, var->per_channel ? &scales : &scale1, &bias, NULL));
                    }
                    CHECK(cuda->event_record(e1, NULL));
                    float ms;
                    CHECK(cuda->event_elapsed_ms(e0, e1, &ms));
                    if (t >= 0) us[t] = 1000.0 * ms / (double)calls;
                }
                qsort(us, 5, sizeof(double), bench_cmp_double);
                double gbps = (double)bytes / (us[2] * 1e3);
                printf("RESULT quant_gemv shape=%lldx%lld rows=%d weights=%s path=%s us=%.2f "
                       "gbps=%.0f fraction=%.2f\n",
                       (long long)OC, (long long)C, M, var->name, var->path, us[2], gbps,
                       gbps / (double)peak);
                fflush(stdout);
            }
            gpc_cuda_quant_set_gemv_max_rows(before);
            gpc_tensor_free(&all);
        }
        gpc_tensor_free(&x), gpc_tensor_free(&out), gpc_tensor_free(&bias);
        gpc_tensor_free(&scales), gpc_tensor_free(&scale1);
    }
    return 0;
}
#endif /* GPC_HAVE_CUDA */
