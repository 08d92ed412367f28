/*
 * elementwise.c: the ops that treat a tensor as a flat array: residual add,
 * sum of squares (for the global gradient norm), sum (for the loss), dtype
 * conversion and in-place scaling.
 *
 * Only these and AdamW accept bf16 and f16 on the CPU, because they are what
 * moves data between precisions; bf16 and f16 values are widened to f32 to
 * compute and rounded to nearest even when stored (core.h's converters).
 *
 * sum_squares (and sum) is a reduction whose result must not depend on thread timing
 * (the trainer's --resume test compares losses bit for bit, and the gradient
 * norm feeds clipping). So the array is cut into a fixed number of chunks
 * that depends only on its length, each chunk summed in double in order, and
 * the chunk sums added in order: the same bits for any thread count.
 */
#include "cpu/cpu.h"

#include <string.h>

/* Chunks of the sum of squares: at most this many, at least this size. */
#define SUM_SQUARES_MAX_CHUNKS 256
#define SUM_SQUARES_MIN_CHUNK 4096

float gpc_cpu_load(const gpc_tensor *t, int64_t i) {
    switch (t->dtype) {
    case GPC_BF16:
        return gpc_bf16_to_f32(((const uint16_t *)t->data)[i]);
    case GPC_F16:
        return gpc_f16_to_f32(((const uint16_t *)t->data)[i]);
    default:
        return ((const float *)t->data)[i];
    }
}

void gpc_cpu_store(gpc_tensor *t, int64_t i, float value) {
    switch (t->dtype) {
    case GPC_BF16:
        ((uint16_t *)t->data)[i] = gpc_f32_to_bf16(value);
        break;
    case GPC_F16:
        ((uint16_t *)t->data)[i] = gpc_f32_to_f16(value);
        break;
    default:
        ((float *)t->data)[i] = value;
        break;
    }
}

static int is_float(gpc_dtype d) {
    return d == GPC_F32 || d == GPC_BF16 || d == GPC_F16;
}

static gpc_status need_float(const char *op, const char *name, const gpc_tensor *t) {
    if (is_float(t->dtype)) return GPC_OK;
    return gpc_error(GPC_ERR_UNSUPPORTED, "%s: tensor '%s' is %s; expected f32, bf16 or f16", op,
                     name, gpc_dtype_name(t->dtype));
}

gpc_status gpc_cpu_residual_forward(gpc_tensor *out, const gpc_tensor *a, const gpc_tensor *b) {
    GPC_TRY(gpc_cpu_need_f32("residual_forward", "out", out));
    GPC_TRY(gpc_cpu_need_f32("residual_forward", "a", a));
    GPC_TRY(gpc_cpu_need_f32("residual_forward", "b", b));
    int64_t n = gpc_tensor_numel(out);
    float *o = out->data;
    const float *pa = a->data, *pb = b->data;
#pragma omp parallel for schedule(static) if (n >= GPC_CPU_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++)
        o[i] = pa[i] + pb[i];
    return GPC_OK;
}

/* acc[0] += the sum of x (square 0) or of its squares (square 1), in the
 * fixed chunk order described at the top of the file. */
static gpc_status sum_chunked(const char *op, gpc_tensor *acc, const gpc_tensor *x, int square) {
    GPC_TRY(need_float(op, "x", x));
    int64_t n = gpc_tensor_numel(x);
    int64_t chunk = (n + SUM_SQUARES_MAX_CHUNKS - 1) / SUM_SQUARES_MAX_CHUNKS;
    if (chunk < SUM_SQUARES_MIN_CHUNK) chunk = SUM_SQUARES_MIN_CHUNK;
    int64_t chunks = (n + chunk - 1) / chunk;
    double partial[SUM_SQUARES_MAX_CHUNKS] = {0};
    const float *xf = x->dtype == GPC_F32 ? x->data : NULL;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < chunks; k++) {
        int64_t i0 = k * chunk, i1 = i0 + chunk < n ? i0 + chunk : n;
        double s = 0.0;
        for (int64_t i = i0; i < i1; i++) {
            double v = xf ? (double)xf[i] : (double)gpc_cpu_load(x, i);
            s += square ? v * v : v;
        }
        partial[k] = s;
    }
    double total = 0.0;
    for (int64_t k = 0; k < chunks; k++)
        total += partial[k];
    float *a = acc->data;
    a[0] = (float)((double)a[0] + total);
    return GPC_OK;
}

gpc_status gpc_cpu_sum_squares(gpc_tensor *acc, const gpc_tensor *x) {
    return sum_chunked("sum_squares", acc, x, 1);
}

gpc_status gpc_cpu_sum(gpc_tensor *acc, const gpc_tensor *x) {
    return sum_chunked("sum", acc, x, 0);
}

gpc_status gpc_cpu_convert(gpc_tensor *dst, const gpc_tensor *src) {
    GPC_TRY(need_float("convert", "dst", dst));
    GPC_TRY(need_float("convert", "src", src));
    int64_t n = gpc_tensor_numel(dst);
    if (dst->dtype == src->dtype) {
        if (dst->data != src->data) memmove(dst->data, src->data, gpc_tensor_bytes(dst));
        return GPC_OK;
    }
    if (dst->data == src->data)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "convert: %s to %s cannot run in place; give it a separate destination",
                         gpc_dtype_name(src->dtype), gpc_dtype_name(dst->dtype));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        gpc_cpu_store(dst, i, gpc_cpu_load(src, i));
    return GPC_OK;
}

gpc_status gpc_cpu_scale(gpc_tensor *x, float factor) {
    GPC_TRY(need_float("scale", "x", x));
    int64_t n = gpc_tensor_numel(x);
    if (x->dtype == GPC_F32) {
        float *p = x->data;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++)
            p[i] *= factor;
        return GPC_OK;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        gpc_cpu_store(x, i, gpc_cpu_load(x, i) * factor);
    return GPC_OK;
}
