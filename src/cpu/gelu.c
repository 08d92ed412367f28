/*
 * gelu.c: GELU activation, tanh approximation (Hendrycks & Gimpel 2016, as
 * GPT-2 uses it): gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
 *
 * Computed through the identity 0.5 (1 + tanh(u)) = sigmoid(2u) = s, so
 * gelu(x) = x s and, since d/du sigmoid(2u) = 2 s (1 - s),
 * gelu'(x) = s + x * 2 s (1 - s) * sqrt(2/pi) (1 + 3 * 0.044715 x^2).
 * Two reasons: the sigmoid form has no 1 + tanh cancellation for negative x,
 * and with gpc_cpu_expf it is branch-free code the compiler vectorises
 * (glibc's tanhf, one call per element, made GELU cost as much as a matmul).
 * Elementwise and independent, so a plain parallel loop; dinp may alias dout
 * because each element is read before it is written.
 */
#include "cpu/cpu.h"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_CUBIC 0.044715f

gpc_status gpc_cpu_gelu_forward(gpc_tensor *out, const gpc_tensor *inp) {
    GPC_TRY(gpc_cpu_need_f32("gelu_forward", "out", out));
    GPC_TRY(gpc_cpu_need_f32("gelu_forward", "inp", inp));
    int64_t n = gpc_tensor_numel(out);
    float *o = out->data;
    const float *x = inp->data;
#pragma omp parallel for simd schedule(static) if (n >= GPC_CPU_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        float u = GELU_SCALE * (xi + GELU_CUBIC * xi * xi * xi);
        o[i] = xi / (1.0f + gpc_cpu_expf(-2.0f * u));
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
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        float u = GELU_SCALE * (xi + GELU_CUBIC * xi * xi * xi);
        float s = 1.0f / (1.0f + gpc_cpu_expf(-2.0f * u));
        float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * xi * xi);
        dx[i] = (s + xi * 2.0f * s * (1.0f - s) * du) * dy[i];
    }
    return GPC_OK;
}
