/*
 * layernorm.c: layer normalisation over the last dimension, forward and
 * backward, and the fused residual add + layernorm of the forward pass.
 *
 * Forward, per row of C channels: mean, biased variance (as PyTorch's
 * LayerNorm), rstd = 1/sqrt(var + 1e-5), out = (x - mean) * rstd * w + b.
 * Mean and rstd are saved so the backward pass need not recompute them.
 * Variance is computed in a second pass over the row, (x - mean)^2, rather
 * than E[x^2] - mean^2, which cancels badly when the mean is large. The row
 * statistics and xhat are computed in double: in f32, the rounding of a large
 * mean is amplified by rstd when a row's spread is small (1e-4 relative
 * errors are easy to meet), and the cost is nothing beside the matmuls. The
 * reductions are `omp simd`, vectorised in a fixed order: still deterministic.
 *
 * Backward (the standard derivation, as in llm.c): with xhat = (x-mean)*rstd
 * and g = w * dout, dinp += rstd * (g - mean(g) - xhat * mean(g * xhat));
 * dweight += sum over rows of dout * xhat; dbias += sum over rows of dout.
 * dinp ACCUMULATES because it is the residual stream's gradient (ops.h). The
 * row pass is parallel over rows; the parameter sums are a second pass
 * parallel over blocks of channels, each walking the rows in order, so the
 * sums need no atomics and come out bitwise the same on every run.
 */
#include "cpu/cpu.h"

#include <math.h>

#define LAYERNORM_EPS 1e-5f
#define LAYERNORM_CHANNEL_BLOCK 64

static void layernorm_row(float *out, float *mean_out, float *rstd_out, const float *x,
                          const float *w, const float *b, int64_t C) {
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < C; c++)
        sum += x[c];
    double mean = sum / (double)C;
    double var = 0.0;
#pragma omp simd reduction(+ : var)
    for (int64_t c = 0; c < C; c++) {
        double dx = x[c] - mean;
        var += dx * dx;
    }
    var /= (double)C;
    double rstd = 1.0 / sqrt(var + LAYERNORM_EPS);
    for (int64_t c = 0; c < C; c++)
        out[c] = (float)((x[c] - mean) * rstd) * w[c] + b[c];
    *mean_out = (float)mean;
    *rstd_out = (float)rstd;
}

gpc_status gpc_cpu_layernorm_forward(gpc_tensor *out, gpc_tensor *mean, gpc_tensor *rstd,
                                     const gpc_tensor *inp, const gpc_tensor *weight,
                                     const gpc_tensor *bias) {
    const char *op = "layernorm_forward";
    GPC_TRY(gpc_cpu_need_f32(op, "out", out));
    GPC_TRY(gpc_cpu_need_f32(op, "inp", inp));
    GPC_TRY(gpc_cpu_need_f32(op, "weight", weight));
    GPC_TRY(gpc_cpu_need_f32(op, "bias", bias));
    int64_t C = gpc_cpu_last_dim(inp), N = gpc_cpu_rows(inp);
    float *o = out->data, *mu = mean->data, *rs = rstd->data;
    const float *x = inp->data, *w = weight->data, *b = bias->data;
#pragma omp parallel for schedule(static) if (N * C >= GPC_CPU_PARALLEL_MIN)
    for (int64_t n = 0; n < N; n++)
        layernorm_row(o + n * C, mu + n, rs + n, x + n * C, w, b, C);
    return GPC_OK;
}

gpc_status gpc_cpu_residual_layernorm_forward(gpc_tensor *residual, gpc_tensor *out,
                                              gpc_tensor *mean, gpc_tensor *rstd,
                                              const gpc_tensor *a, const gpc_tensor *b,
                                              const gpc_tensor *weight, const gpc_tensor *bias) {
    const char *op = "residual_layernorm_forward";
    /* ops.c calls a fused kernel before it checks 'a' and 'b', so they are checked here. */
    if (!a || !a->data || !b || !b->data)
        return gpc_error(GPC_ERR_INVALID_ARG, "%s: tensor '%s' is missing", op,
                         !a || !a->data ? "a" : "b");
    if (a->device.type != GPC_DEVICE_CPU || b->device.type != GPC_DEVICE_CPU)
        return gpc_error(GPC_ERR_MISMATCH, "%s: tensors on different devices (cpu and %s)", op,
                         gpc_device_name(a->device.type != GPC_DEVICE_CPU ? a->device : b->device));
    GPC_TRY(gpc_cpu_need_f32(op, "residual", residual));
    GPC_TRY(gpc_cpu_need_f32(op, "out", out));
    GPC_TRY(gpc_cpu_need_f32(op, "a", a));
    GPC_TRY(gpc_cpu_need_f32(op, "b", b));
    GPC_TRY(gpc_cpu_need_f32(op, "weight", weight));
    GPC_TRY(gpc_cpu_need_f32(op, "bias", bias));
    if (gpc_tensor_numel(a) != gpc_tensor_numel(residual) ||
        gpc_tensor_numel(b) != gpc_tensor_numel(residual))
        return gpc_error(GPC_ERR_MISMATCH,
                         "%s: tensors 'a' and 'b' must have as many elements as 'residual'", op);
    int64_t C = gpc_cpu_last_dim(residual), N = gpc_cpu_rows(residual);
    float *r = residual->data, *o = out->data, *mu = mean->data, *rs = rstd->data;
    const float *pa = a->data, *pb = b->data, *w = weight->data, *bi = bias->data;
    /* One pass per row: the sum is still in cache when the row is normalised. */
#pragma omp parallel for schedule(static) if (N * C >= GPC_CPU_PARALLEL_MIN)
    for (int64_t n = 0; n < N; n++) {
        float *row = r + n * C;
        for (int64_t c = 0; c < C; c++)
            row[c] = pa[n * C + c] + pb[n * C + c];
        layernorm_row(o + n * C, mu + n, rs + n, row, w, bi, C);
    }
    return GPC_OK;
}

gpc_status gpc_cpu_layernorm_backward(gpc_tensor *dinp, gpc_tensor *dweight, gpc_tensor *dbias,
                                      gpc_tensor *dinp_sum, const gpc_tensor *dout,
                                      const gpc_tensor *inp, const gpc_tensor *weight,
                                      const gpc_tensor *mean, const gpc_tensor *rstd) {
    const char *op = "layernorm_backward";
    GPC_TRY(gpc_cpu_need_f32(op, "dinp", dinp));
    GPC_TRY(gpc_cpu_need_f32(op, "dweight", dweight));
    GPC_TRY(gpc_cpu_need_f32(op, "dbias", dbias));
    GPC_TRY(gpc_cpu_need_f32(op, "dinp_sum", dinp_sum));
    GPC_TRY(gpc_cpu_need_f32(op, "dout", dout));
    GPC_TRY(gpc_cpu_need_f32(op, "inp", inp));
    GPC_TRY(gpc_cpu_need_f32(op, "weight", weight));
    int64_t C = gpc_cpu_last_dim(inp), N = gpc_cpu_rows(inp);
    float *dx = dinp->data, *dw = dweight->data, *db = dbias->data;
    const float *dy = dout->data, *x = inp->data, *w = weight->data;
    const float *mu = mean->data, *rs = rstd->data;
    int64_t blocks = (C + LAYERNORM_CHANNEL_BLOCK - 1) / LAYERNORM_CHANNEL_BLOCK;
    /* dinp as it came in, before the rows below add to it */
    if (dinp_sum) gpc_cpu_add_column_sums(dinp_sum->data, dx, N, C, C);
#pragma omp parallel
    {
#pragma omp for schedule(static) nowait
        for (int64_t n = 0; n < N; n++) {
            const float *dyr = dy + n * C, *xr = x + n * C;
            float m = mu[n], r = rs[n];
            float g_mean = 0.0f, gx_mean = 0.0f;
#pragma omp simd reduction(+ : g_mean, gx_mean)
            for (int64_t c = 0; c < C; c++) {
                float g = w[c] * dyr[c];
                g_mean += g;
                gx_mean += g * (xr[c] - m) * r;
            }
            g_mean /= (float)C;
            gx_mean /= (float)C;
            float *dxr = dx + n * C;
            for (int64_t c = 0; c < C; c++) {
                float xhat = (xr[c] - m) * r;
                dxr[c] += r * (w[c] * dyr[c] - g_mean - xhat * gx_mean);
            }
        }
        /* The parameter sums read only inputs, so they need no barrier after the rows. */
#pragma omp for schedule(static)
        for (int64_t blk = 0; blk < blocks; blk++) {
            int64_t c0 = blk * LAYERNORM_CHANNEL_BLOCK;
            int64_t width = C - c0 < LAYERNORM_CHANNEL_BLOCK ? C - c0 : LAYERNORM_CHANNEL_BLOCK;
            float sw[LAYERNORM_CHANNEL_BLOCK] = {0}, sb[LAYERNORM_CHANNEL_BLOCK] = {0};
            for (int64_t n = 0; n < N; n++) {
                const float *dyr = dy + n * C + c0, *xr = x + n * C + c0;
                float m = mu[n], r = rs[n];
                for (int64_t c = 0; c < width; c++) {
                    sw[c] += dyr[c] * ((xr[c] - m) * r);
                    sb[c] += dyr[c];
                }
            }
            for (int64_t c = 0; c < width; c++) {
                dw[c0 + c] += sw[c];
                db[c0 + c] += sb[c];
            }
        }
    }
    return GPC_OK;
}
