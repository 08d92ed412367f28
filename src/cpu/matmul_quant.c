/*
 * matmul_quant.c: the product with quantized weights (gpc quantize) on the
 * CPU: out = [residual +] inp @ W^T [+ bias] with W[o,c] = q[o,c] * scale,
 * and the same followed by GELU (matmul_quant_gelu_forward).
 *
 * The weight is dequantized to f32 (each value q * scale rounded once, as
 * the reference "dequantize, then multiply in f32" does) and the product is
 * one gpc_cpu_sgemm, so the result is that of gpc_cpu_matmul_forward on the
 * dequantized weight, bit for bit. The f32 copy is allocated per call: the
 * CPU path is the reference the GPU kernels are tested against, and the
 * weight's own GEMM costs far more than the allocation.
 */
#include "cpu/cpu.h"

gpc_status gpc_cpu_matmul_quant_forward(gpc_tensor *out, const gpc_tensor *inp,
                                        const gpc_tensor *qweight, const gpc_tensor *scales,
                                        const gpc_tensor *bias, const gpc_tensor *residual) {
    const char *op = "matmul_quant_forward";
    GPC_TRY(gpc_cpu_need_f32(op, "out", out));
    GPC_TRY(gpc_cpu_need_f32(op, "inp", inp));
    GPC_TRY(gpc_cpu_need_f32(op, "bias", bias));
    GPC_TRY(gpc_cpu_need_f32(op, "residual", residual));
    int64_t C = gpc_cpu_last_dim(inp), N = gpc_cpu_rows(inp), OC = gpc_cpu_rows(qweight);
    GPC_TRY(gpc_cpu_need_blas_dim(op, N));
    GPC_TRY(gpc_cpu_need_blas_dim(op, C));
    GPC_TRY(gpc_cpu_need_blas_dim(op, OC));
    float *o = out->data;
    const float *b = bias && bias->data ? bias->data : NULL;
    const float *r = residual && residual->data ? residual->data : NULL;
    if (N == 0 || OC == 0) return GPC_OK;
    float *w = gpc_malloc((size_t)OC * (size_t)(C ? C : 1) * sizeof *w);
    if (!w) return gpc_error(GPC_ERR_NOMEM, "%s: out of host memory dequantizing the weight", op);
    /* fp8's 256 values, decoded once per call */
    float table[256];
    for (int k = 0; k < 256; k++)
        table[k] = qweight->dtype == GPC_F8E4M3 ? gpc_f8e4m3_to_f32((uint8_t)k) : (float)(int8_t)k;
    const uint8_t *q = qweight->data;
    const float *s = scales->data;
    int per_channel = gpc_tensor_numel(scales) == OC && OC != 1;
#pragma omp parallel for schedule(static) if (OC * C >= GPC_CPU_PARALLEL_MIN)
    for (int64_t i = 0; i < OC; i++) {
        float scale = s[per_channel ? i : 0];
        for (int64_t c = 0; c < C; c++)
            w[i * C + c] = table[q[i * C + c]] * scale;
    }
    float beta = b || r ? 1.0f : 0.0f;
    if (beta != 0.0f) {
#pragma omp parallel for schedule(static) if (N * OC >= GPC_CPU_PARALLEL_MIN)
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = 0; j < OC; j++)
                o[n * OC + j] = (r ? r[n * OC + j] : 0.0f) + (b ? b[j] : 0.0f);
    }
    if (C > 0)
        gpc_cpu_sgemm(0, 1, N, OC, C, 1.0f, inp->data, C, w, C, beta, o, OC);
    else if (beta == 0.0f)
        for (int64_t k = 0; k < N * OC; k++)
            o[k] = 0.0f;
    gpc_free(w);
    return GPC_OK;
}

/* fc's product of a quantized model: the product into out_pre, then GELU,
 * as gpc_op_matmul_quant_forward and gpc_op_gelu_forward compute them. */
gpc_status gpc_cpu_matmul_quant_gelu_forward(gpc_tensor *out_pre, gpc_tensor *out_gelu,
                                             const gpc_tensor *inp, const gpc_tensor *qweight,
                                             const gpc_tensor *scales, const gpc_tensor *bias) {
    GPC_TRY(gpc_cpu_matmul_quant_forward(out_pre, inp, qweight, scales, bias, NULL));
    return gpc_cpu_gelu_forward(out_gelu, out_pre);
}
