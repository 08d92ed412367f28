/*
 * gelu.c: GELU activation, tanh approximation (Hendrycks & Gimpel 2016, as
 * GPT-2 uses it): gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
 *
 * Backward: with u = sqrt(2/pi) (x + 0.044715 x^3) and t = tanh(u),
 * gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2).
 * sech^2 is written 1 - t^2 rather than 1/cosh^2, which overflows for large
 * |u|. Elementwise and independent, so a plain parallel loop; dinp may alias
 * dout because each element is read before it is written.
 */
#include "cpu/cpu.h"

#include <math.h>

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_CUBIC 0.044715f

gpc_status gpc_cpu_gelu_forward(gpc_tensor *out, const gpc_tensor *inp) {
    GPC_TRY(gpc_cpu_need_f32("gelu_forward", "out", out));
    GPC_TRY(gpc_cpu_need_f32("gelu_forward", "inp", inp));
    int64_t n = gpc_tensor_numel(out);
    float *o = out->data;
    const float *x = inp->data;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        o[i] = 0.5f * xi * (1.0f + tanhf(GELU_SCALE * (xi + GELU_CUBIC * xi * xi * xi)));
    }
    return GPC_OK;
}

gpc_status gpc_cpu_gelu_backward(gpc_tensor *dinp, const gpc_tensor *inp, const gpc_tensor *dout) {
    GPC_TRY(gpc_cpu_need_f32("gelu_backward", "dinp", dinp));
    GPC_TRY(gpc_cpu_need_f32("gelu_backward", "inp", inp));
    GPC_TRY(gpc_cpu_need_f32("gelu_backward", "dout", dout));
    int64_t n = gpc_tensor_numel(dinp);
    float *dx = dinp->data;
    const float *x = inp->data, *dy = dout->data;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        float t = tanhf(GELU_SCALE * (xi + GELU_CUBIC * xi * xi * xi));
        float local = 0.5f * (1.0f + t) + 0.5f * xi * (1.0f - t * t) * GELU_SCALE *
                                              (1.0f + 3.0f * GELU_CUBIC * xi * xi);
        dx[i] = local * dy[i];
    }
    return GPC_OK;
}
