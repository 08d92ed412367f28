/*
 * cpu.h: the CPU backend's ops, one function per entry of gpc_ops_table.
 * Implementations are C11 + OpenMP; every matrix product goes through
 * OpenBLAS (cblas_sgemm). Inputs arrive validated by src/ops/ops.c.
 *
 * The kernels live one family per file (embedding.c, layernorm.c, matmul.c,
 * gelu.c, elementwise.c, attention.c, crossentropy.c, adamw.c) and are gathered
 * into gpc_cpu_ops in cpu_ops.c. Every kernel gives the same bits for the same
 * inputs on every run with the same thread count: reductions run in a fixed
 * order, never in the order threads happen to finish.
 */
#ifndef GPC_CPU_H
#define GPC_CPU_H

#include "ops/ops_backend.h"

extern const gpc_ops_table gpc_cpu_ops;

/* One kernel per op of gpc_ops_table, named gpc_cpu_NAME; the file of each
 * family is named after it (embedding.c, layernorm.c, matmul.c, ...). */
#define GPC_CPU_DECLARE(name, params) gpc_status gpc_cpu_##name params;

/* Loops over fewer elements than this run on the calling thread (an OpenMP
 * `if` clause): waking the team costs more than it saves on, say, the one
 * row of a generation step. Every loop it gates gives the same bits either
 * way. */
#define GPC_CPU_PARALLEL_MIN 32768
GPC_OPS_LIST(GPC_CPU_DECLARE)
#undef GPC_CPU_DECLARE

/* cpu_common.c: checks the kernels share. */

/* One row-major cblas_sgemm on the calling thread, but a matrix-vector
 * product (sgemv) when C has one row and A is not transposed: OpenBLAS
 * 0.3.21's sgemm packs op(B) even then, 2 to 8 times slower on generation's
 * one-row products. */
void gpc_cpu_sgemm1(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                    int64_t ldc);

/* GPC_ERR_UNSUPPORTED unless t is f32 (a NULL t passes: optional tensors). */
gpc_status gpc_cpu_need_f32(const char *op, const char *name, const gpc_tensor *t);
/* GPC_ERR_UNSUPPORTED when a dimension does not fit OpenBLAS's int. */
gpc_status gpc_cpu_need_blas_dim(const char *op, int64_t dim);
/* Matrix products. The CPU backend runs all its threads through OpenMP: on
 * first use it sets OpenBLAS to one thread per call, and gpc_cpu_sgemm splits
 * a product into one block of rows or columns per OpenMP thread, each a
 * single-threaded cblas_sgemm. Letting OpenBLAS thread on its own while
 * OpenMP's idle workers spin after every parallel loop put two busy threads
 * on each core and doubled the time of a matmul that followed a GELU. Every
 * element is a whole dot product of one call, so results do not depend on
 * timing. Row-major, C = alpha op(A) op(B) + beta C, op(A) [M,K], op(B) [K,N]. */
void gpc_cpu_blas_init(void);
void gpc_cpu_sgemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                   int64_t ldc);

/* acc[j] += the sum over rows n of x[n * ld + j], for j < C: parallel over
 * blocks of columns, each adding its rows in order (deterministic, no
 * atomics). The bias gradients' column sums. */
void gpc_cpu_add_column_sums(float *acc, const float *x, int64_t N, int64_t C, int64_t ld);

/* Last dimension, and rows when seen as [rows, last dimension]. */
int64_t gpc_cpu_last_dim(const gpc_tensor *t);
int64_t gpc_cpu_rows(const gpc_tensor *t);

/* e^x in f32 that the compiler can vectorise (glibc's expf is a call per
 * element, and softmax, cross-entropy and GELU are bound by it). Cephes'
 * expf (Moshier): x = n ln2 + r with |r| <= ln2/2, e^r by a degree-7
 * polynomial, 2^n put in the exponent bits; relative error below 1e-7.
 * Below -87.3 it returns 0 (so e^-inf = 0), above 88 it saturates at e^88,
 * NaN stays NaN. Branch-free so a loop of it becomes SIMD code. */
static inline float gpc_cpu_expf(float x) {
    float c = x > -87.3f ? x : -87.3f; /* also maps NaN to -87.3; restored below */
    c = c < 88.0f ? c : 88.0f;
    /* n = round(c / ln2) by the 1.5 * 2^23 trick: floorf would not vectorise
     * without -fno-trapping-math, and the sum cannot be folded away (no
     * -ffast-math). */
    float n = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = c - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union {
        int32_t i;
        float f;
    } scale = {.i = ((int32_t)n + 127) << 23};
    float result = p * scale.f;
    result = x > -87.3f ? result : 0.0f;
    return x != x ? x : result;
}

/* elementwise.c: element i of a float tensor of any float dtype, and the
 * write back (with round to nearest even for bf16 and f16). */
float gpc_cpu_load(const gpc_tensor *t, int64_t i);
void gpc_cpu_store(gpc_tensor *t, int64_t i, float value);

#endif /* GPC_CPU_H */
