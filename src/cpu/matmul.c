/*
 * matmul.c: the linear layer, out = inp @ weight^T + bias, and its backward.
 *
 * Shapes: inp [N,C], weight [OC,C] (PyTorch's nn.Linear layout, rows are
 * output channels), out [N,OC]. Every product is one GEMM (OpenBLAS):
 *   forward   out     = inp  @ weight^T   (bias, and the residual of
 *                                         matmul_residual_forward, pre-filled,
 *                                         beta = 1)
 *   backward  dinp    = dout @ weight     (beta = 0: activations overwrite)
 *             dweight += dout^T @ inp     (beta = 1: parameters accumulate)
 * gpc_cpu_sgemm spreads each GEMM over the OpenMP threads (cpu.h says why
 * OpenBLAS does not thread them itself). The bias gradient is a column sum of
 * dout, parallel over blocks of columns, each summing rows in order, so it is
 * deterministic without atomics.
 */
#include "cpu/cpu.h"

#define MATMUL_COLUMN_BLOCK 64

static gpc_status check_dims(const char *op, int64_t N, int64_t C, int64_t OC) {
    GPC_TRY(gpc_cpu_need_blas_dim(op, N));
    GPC_TRY(gpc_cpu_need_blas_dim(op, C));
    GPC_TRY(gpc_cpu_need_blas_dim(op, OC));
    return GPC_OK;
}

/* out = [residual +] inp @ weight^T [+ bias]: residual and bias (either may
 * be NULL) are laid into out first, and the product adds to them (beta 1). */
static gpc_status forward(const char *op, gpc_tensor *out, const gpc_tensor *inp,
                          const gpc_tensor *weight, const gpc_tensor *bias,
                          const gpc_tensor *residual) {
    GPC_TRY(gpc_cpu_need_f32(op, "out", out));
    GPC_TRY(gpc_cpu_need_f32(op, "inp", inp));
    GPC_TRY(gpc_cpu_need_f32(op, "weight", weight));
    GPC_TRY(gpc_cpu_need_f32(op, "bias", bias));
    GPC_TRY(gpc_cpu_need_f32(op, "residual", residual));
    int64_t C = gpc_cpu_last_dim(inp), N = gpc_cpu_rows(inp), OC = gpc_cpu_rows(weight);
    GPC_TRY(check_dims(op, N, C, OC));
    float *o = out->data;
    const float *b = bias && bias->data ? bias->data : NULL;
    const float *r = residual && residual->data ? residual->data : NULL;
    float beta = b || r ? 1.0f : 0.0f;
    if (beta != 0.0f) {
#pragma omp parallel for schedule(static) if (N * OC >= GPC_CPU_PARALLEL_MIN)
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = 0; j < OC; j++)
                o[n * OC + j] = (r ? r[n * OC + j] : 0.0f) + (b ? b[j] : 0.0f);
    }
    if (N == 0 || OC == 0) return GPC_OK;
    gpc_cpu_sgemm(0, 1, N, OC, C, 1.0f, inp->data, C, weight->data, C, beta, o, OC);
    return GPC_OK;
}

gpc_status gpc_cpu_matmul_forward(gpc_tensor *out, const gpc_tensor *inp, const gpc_tensor *weight,
                                  const gpc_tensor *bias) {
    return forward("matmul_forward", out, inp, weight, bias, NULL);
}

gpc_status gpc_cpu_matmul_residual_forward(gpc_tensor *out, const gpc_tensor *inp,
                                           const gpc_tensor *weight, const gpc_tensor *bias,
                                           const gpc_tensor *residual) {
    return forward("matmul_residual_forward", out, inp, weight, bias, residual);
}

gpc_status gpc_cpu_matmul_backward(gpc_tensor *dinp, gpc_tensor *dweight, gpc_tensor *dbias,
                                   const gpc_tensor *dout, const gpc_tensor *inp,
                                   const gpc_tensor *weight) {
    const char *op = "matmul_backward";
    GPC_TRY(gpc_cpu_need_f32(op, "dinp", dinp));
    GPC_TRY(gpc_cpu_need_f32(op, "dweight", dweight));
    GPC_TRY(gpc_cpu_need_f32(op, "dbias", dbias));
    GPC_TRY(gpc_cpu_need_f32(op, "dout", dout));
    GPC_TRY(gpc_cpu_need_f32(op, "inp", inp));
    GPC_TRY(gpc_cpu_need_f32(op, "weight", weight));
    int64_t C = gpc_cpu_last_dim(inp), N = gpc_cpu_rows(inp), OC = gpc_cpu_rows(weight);
    GPC_TRY(check_dims(op, N, C, OC));
    if (N == 0 || C == 0 || OC == 0) return GPC_OK;
    const float *dy = dout->data;
    if (dinp && dinp->data)
        gpc_cpu_sgemm(0, 0, N, C, OC, 1.0f, dy, OC, weight->data, C, 0.0f, dinp->data, C);
    if (dweight && dweight->data)
        gpc_cpu_sgemm(1, 0, OC, C, N, 1.0f, dy, OC, inp->data, C, 1.0f, dweight->data, C);
    if (dbias && dbias->data) gpc_cpu_add_column_sums(dbias->data, dy, N, OC, OC);
    return GPC_OK;
}

void gpc_cpu_add_column_sums(float *acc, const float *x, int64_t N, int64_t C, int64_t ld) {
    int64_t blocks = (C + MATMUL_COLUMN_BLOCK - 1) / MATMUL_COLUMN_BLOCK;
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < blocks; blk++) {
        int64_t j0 = blk * MATMUL_COLUMN_BLOCK;
        int64_t width = C - j0 < MATMUL_COLUMN_BLOCK ? C - j0 : MATMUL_COLUMN_BLOCK;
        float sum[MATMUL_COLUMN_BLOCK] = {0};
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = 0; j < width; j++)
                sum[j] += x[n * ld + j0 + j];
        for (int64_t j = 0; j < width; j++)
            acc[j0 + j] += sum[j];
    }
}

gpc_status gpc_cpu_column_sums(gpc_tensor *acc, const gpc_tensor *x, int64_t first) {
    const char *op = "column_sums";
    GPC_TRY(gpc_cpu_need_f32(op, "acc", acc));
    GPC_TRY(gpc_cpu_need_f32(op, "x", x));
    int64_t W = gpc_cpu_last_dim(x);
    gpc_cpu_add_column_sums(acc->data, (const float *)x->data + first, gpc_cpu_rows(x),
                            gpc_tensor_numel(acc), W);
    return GPC_OK;
}
