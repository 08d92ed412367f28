/*
 * ops.c: validation and dispatch of every op in ops.h.
 *
 * Checks happen here, once, for all backends: tensors present, on one device,
 * of float dtypes where floats are expected, with the shapes the op needs.
 * A failed check names the op and the tensor, and shows what was expected,
 * because these errors are nearly always a bug in the calling code that the
 * developer must find quickly. Then the device's backend runs the op.
 */
#include "ops/ops_backend.h"
#include "gpc/settings.h"

#include <stdlib.h>
#include <string.h>

static int is_float(gpc_dtype d) {
    return d == GPC_F32 || d == GPC_BF16 || d == GPC_F16;
}

static gpc_status need(const char *op, const char *name, const gpc_tensor *t) {
    if (!t || !t->data)
        return gpc_error(GPC_ERR_INVALID_ARG, "%s: tensor '%s' is missing", op, name);
    return GPC_OK;
}

static gpc_status need_float(const char *op, const char *name, const gpc_tensor *t) {
    GPC_TRY(need(op, name, t));
    if (!is_float(t->dtype))
        return gpc_error(GPC_ERR_MISMATCH, "%s: tensor '%s' must be f32, bf16 or f16, not %s", op,
                         name, gpc_dtype_name(t->dtype));
    return GPC_OK;
}

static gpc_status need_dtype(const char *op, const char *name, const gpc_tensor *t,
                             gpc_dtype dtype) {
    GPC_TRY(need(op, name, t));
    if (t->dtype != dtype)
        return gpc_error(GPC_ERR_MISMATCH, "%s: tensor '%s' must be %s, not %s", op, name,
                         gpc_dtype_name(dtype), gpc_dtype_name(t->dtype));
    return GPC_OK;
}

static gpc_status need_numel(const char *op, const char *name, const gpc_tensor *t, int64_t numel) {
    if (gpc_tensor_numel(t) != numel) {
        char buf[96];
        return gpc_error(GPC_ERR_MISMATCH, "%s: tensor '%s' is %s; expected %lld elements", op,
                         name, gpc_tensor_describe(t, buf, sizeof buf), (long long)numel);
    }
    return GPC_OK;
}

/* Last dimension of a tensor (1 for a scalar). */
static int64_t last_dim(const gpc_tensor *t) {
    return t->ndim ? t->shape[t->ndim - 1] : 1;
}

/* Rows when the tensor is seen as [rows, last_dim]. */
static int64_t rows(const gpc_tensor *t) {
    int64_t c = last_dim(t);
    return c ? gpc_tensor_numel(t) / c : 0;
}

/* Optional tensors (NULL or without data) are skipped. */
static gpc_status same_device(const char *op, const gpc_tensor *first, const gpc_tensor *other) {
    if (!other || !other->data) return GPC_OK;
    if (other->device.type != first->device.type || other->device.index != first->device.index)
        return gpc_error(GPC_ERR_MISMATCH, "%s: tensors on different devices (%s and %s)", op,
                         gpc_device_name(first->device), gpc_device_name(other->device));
    return GPC_OK;
}

static gpc_status table_for(const char *op, const gpc_tensor *t, const gpc_ops_table **out) {
    const gpc_backend *backend;
    GPC_TRY(gpc_backend_require(t->device, &backend));
    if (!backend->ops)
        return gpc_error(GPC_ERR_UNSUPPORTED, "%s: the %s backend has no numeric ops", op,
                         backend->name);
    *out = backend->ops;
    return GPC_OK;
}

#define DEVICES(op, first, ...)                                                                    \
    do {                                                                                           \
        const gpc_tensor *others_[] = {__VA_ARGS__};                                               \
        for (size_t i_ = 0; i_ < sizeof others_ / sizeof others_[0]; i_++)                         \
            GPC_TRY(same_device(op, first, others_[i_]));                                          \
    } while (0)

#define DISPATCH(op, first, entry, ...)                                                            \
    do {                                                                                           \
        const gpc_ops_table *table_ = NULL;                                                        \
        GPC_TRY(table_for(op, first, &table_));                                                    \
        if (!table_ || !table_->entry)                                                             \
            return gpc_error(GPC_ERR_UNSUPPORTED, "%s is not implemented on %s", op,               \
                             gpc_device_name((first)->device));                                    \
        return table_->entry(__VA_ARGS__);                                                         \
    } while (0)

/* The checks the embedding forward ops share: tokens i32 [N] of rows of T,
 * wte [V, C], wpe [maxT >= T, C] when given, out [N, C]; row0 is the first
 * row of a vocabulary slice (0 for the whole table). */
static gpc_status check_embedding_forward(const char *op, const gpc_tensor *out,
                                          const gpc_tensor *tokens, const gpc_tensor *wte,
                                          const gpc_tensor *wpe, int64_t row0) {
    GPC_TRY(need_float(op, "out", out));
    GPC_TRY(need_dtype(op, "tokens", tokens, GPC_I32));
    GPC_TRY(need_float(op, "wte", wte));
    if (wpe) GPC_TRY(need_float(op, "wpe", wpe));
    DEVICES(op, out, tokens, wte, wpe);
    int64_t C = last_dim(wte), T = last_dim(tokens), N = gpc_tensor_numel(tokens);
    if (wpe && (last_dim(wpe) != C || T > rows(wpe)))
        return gpc_error(GPC_ERR_MISMATCH, "%s: wpe must be [maxT>=%lld, %lld]", op, (long long)T,
                         (long long)C);
    if (row0 < 0)
        return gpc_error(GPC_ERR_INVALID_ARG, "%s: the slice's first row %lld is negative", op,
                         (long long)row0);
    return need_numel(op, "out", out, N * C);
}

/* The same for the backward ops: dwte [V, C], dwpe [maxT >= T, C], dout
 * [N, C]. */
static gpc_status check_embedding_backward(const char *op, const gpc_tensor *dwte,
                                           const gpc_tensor *dwpe, const gpc_tensor *dout,
                                           const gpc_tensor *tokens, int64_t row0) {
    GPC_TRY(need_float(op, "dwte", dwte));
    GPC_TRY(need_float(op, "dwpe", dwpe));
    GPC_TRY(need_float(op, "dout", dout));
    GPC_TRY(need_dtype(op, "tokens", tokens, GPC_I32));
    DEVICES(op, dout, dwte, dwpe, tokens);
    int64_t C = last_dim(dwte), T = last_dim(tokens);
    if (last_dim(dwpe) != C || T > rows(dwpe))
        return gpc_error(GPC_ERR_MISMATCH, "%s: dwpe must be [maxT>=%lld, %lld]", op, (long long)T,
                         (long long)C);
    if (row0 < 0)
        return gpc_error(GPC_ERR_INVALID_ARG, "%s: the slice's first row %lld is negative", op,
                         (long long)row0);
    return need_numel(op, "dout", dout, gpc_tensor_numel(tokens) * C);
}

gpc_status gpc_op_embedding_forward(gpc_tensor *out, const gpc_tensor *tokens,
                                    const gpc_tensor *wte, const gpc_tensor *wpe) {
    const char *op = "embedding_forward";
    GPC_TRY(need(op, "wpe", wpe)); /* only the slice op adds no positions */
    GPC_TRY(check_embedding_forward(op, out, tokens, wte, wpe, 0));
    DISPATCH(op, out, embedding_forward, out, tokens, wte, wpe);
}

gpc_status gpc_op_embedding_backward(gpc_tensor *dwte, gpc_tensor *dwpe, const gpc_tensor *dout,
                                     const gpc_tensor *tokens) {
    const char *op = "embedding_backward";
    GPC_TRY(check_embedding_backward(op, dwte, dwpe, dout, tokens, 0));
    DISPATCH(op, dout, embedding_backward, dwte, dwpe, dout, tokens);
}

gpc_status gpc_op_embedding_slice_forward(gpc_tensor *out, const gpc_tensor *tokens,
                                          const gpc_tensor *wte, const gpc_tensor *wpe,
                                          int64_t row0) {
    const char *op = "embedding_slice_forward";
    GPC_TRY(check_embedding_forward(op, out, tokens, wte, wpe, row0));
    DISPATCH(op, out, embedding_slice_forward, out, tokens, wte, wpe, row0);
}

gpc_status gpc_op_embedding_slice_backward(gpc_tensor *dwte, gpc_tensor *dwpe,
                                           const gpc_tensor *dout, const gpc_tensor *tokens,
                                           int64_t row0) {
    const char *op = "embedding_slice_backward";
    GPC_TRY(check_embedding_backward(op, dwte, dwpe, dout, tokens, row0));
    DISPATCH(op, dout, embedding_slice_backward, dwte, dwpe, dout, tokens, row0);
}

static gpc_status check_layernorm(const char *op, const gpc_tensor *out, const gpc_tensor *mean,
                                  const gpc_tensor *rstd, const gpc_tensor *inp,
                                  const gpc_tensor *weight, const gpc_tensor *bias) {
    GPC_TRY(need_float(op, "out", out));
    GPC_TRY(need_dtype(op, "mean", mean, GPC_F32));
    GPC_TRY(need_dtype(op, "rstd", rstd, GPC_F32));
    GPC_TRY(need_float(op, "inp", inp));
    GPC_TRY(need_float(op, "weight", weight));
    GPC_TRY(need_float(op, "bias", bias));
    DEVICES(op, out, mean, rstd, inp, weight, bias);
    int64_t C = last_dim(inp), N = rows(inp);
    GPC_TRY(need_numel(op, "out", out, N * C));
    GPC_TRY(need_numel(op, "mean", mean, N));
    GPC_TRY(need_numel(op, "rstd", rstd, N));
    GPC_TRY(need_numel(op, "weight", weight, C));
    GPC_TRY(need_numel(op, "bias", bias, C));
    return GPC_OK;
}

gpc_status gpc_op_layernorm_forward(gpc_tensor *out, gpc_tensor *mean, gpc_tensor *rstd,
                                    const gpc_tensor *inp, const gpc_tensor *weight,
                                    const gpc_tensor *bias) {
    GPC_TRY(check_layernorm("layernorm_forward", out, mean, rstd, inp, weight, bias));
    DISPATCH("layernorm_forward", out, layernorm_forward, out, mean, rstd, inp, weight, bias);
}

gpc_status gpc_op_layernorm_backward(gpc_tensor *dinp, gpc_tensor *dweight, gpc_tensor *dbias,
                                     gpc_tensor *dinp_sum, const gpc_tensor *dout,
                                     const gpc_tensor *inp, const gpc_tensor *weight,
                                     const gpc_tensor *mean, const gpc_tensor *rstd) {
    const char *op = "layernorm_backward";
    GPC_TRY(check_layernorm(op, dout, mean, rstd, inp, weight, weight));
    GPC_TRY(need_float(op, "dinp", dinp));
    GPC_TRY(need_float(op, "dweight", dweight));
    GPC_TRY(need_float(op, "dbias", dbias));
    if (dinp_sum && !dinp_sum->data) dinp_sum = NULL;
    if (dinp_sum) GPC_TRY(need_float(op, "dinp_sum", dinp_sum));
    DEVICES(op, dout, dinp, dweight, dbias, dinp_sum);
    GPC_TRY(need_numel(op, "dinp", dinp, gpc_tensor_numel(inp)));
    GPC_TRY(need_numel(op, "dweight", dweight, last_dim(inp)));
    GPC_TRY(need_numel(op, "dbias", dbias, last_dim(inp)));
    if (dinp_sum) GPC_TRY(need_numel(op, "dinp_sum", dinp_sum, last_dim(inp)));
    DISPATCH(op, dout, layernorm_backward, dinp, dweight, dbias, dinp_sum, dout, inp, weight, mean,
             rstd);
}

gpc_status gpc_op_residual_forward(gpc_tensor *out, const gpc_tensor *a, const gpc_tensor *b) {
    const char *op = "residual_forward";
    GPC_TRY(need_float(op, "out", out));
    GPC_TRY(need_float(op, "a", a));
    GPC_TRY(need_float(op, "b", b));
    DEVICES(op, out, a, b);
    GPC_TRY(need_numel(op, "a", a, gpc_tensor_numel(out)));
    GPC_TRY(need_numel(op, "b", b, gpc_tensor_numel(out)));
    DISPATCH(op, out, residual_forward, out, a, b);
}

gpc_status gpc_op_residual_layernorm_forward(gpc_tensor *residual, gpc_tensor *out,
                                             gpc_tensor *mean, gpc_tensor *rstd,
                                             const gpc_tensor *a, const gpc_tensor *b,
                                             const gpc_tensor *weight, const gpc_tensor *bias) {
    const char *op = "residual_layernorm_forward";
    const gpc_ops_table *table = NULL;
    GPC_TRY(need_float(op, "residual", residual));
    GPC_TRY(need_float(op, "a", a));
    GPC_TRY(need_float(op, "b", b));
    DEVICES(op, residual, a, b);
    GPC_TRY(need_numel(op, "a", a, gpc_tensor_numel(residual)));
    GPC_TRY(need_numel(op, "b", b, gpc_tensor_numel(residual)));
    GPC_TRY(check_layernorm(op, out, mean, rstd, residual, weight, bias));
    GPC_TRY(table_for(op, out, &table));
    if (table && table->residual_layernorm_forward)
        return table->residual_layernorm_forward(residual, out, mean, rstd, a, b, weight, bias);
    GPC_TRY(gpc_op_residual_forward(residual, a, b));
    return gpc_op_layernorm_forward(out, mean, rstd, residual, weight, bias);
}

/* The checks matmul_forward and matmul_residual_forward share. */
static gpc_status check_matmul_forward(const char *op, const gpc_tensor *out, const gpc_tensor *inp,
                                       const gpc_tensor *weight, const gpc_tensor *bias) {
    GPC_TRY(need_float(op, "out", out));
    GPC_TRY(need_float(op, "inp", inp));
    GPC_TRY(need_float(op, "weight", weight));
    if (bias) GPC_TRY(need_float(op, "bias", bias));
    DEVICES(op, out, inp, weight, bias);
    int64_t C = last_dim(inp), N = rows(inp), OC = rows(weight);
    if (last_dim(weight) != C) {
        char a[96], b[96];
        return gpc_error(GPC_ERR_MISMATCH, "%s: inp %s and weight %s disagree on C", op,
                         gpc_tensor_describe(inp, a, sizeof a),
                         gpc_tensor_describe(weight, b, sizeof b));
    }
    GPC_TRY(need_numel(op, "out", out, N * OC));
    if (bias) GPC_TRY(need_numel(op, "bias", bias, OC));
    return GPC_OK;
}

gpc_status gpc_op_matmul_forward(gpc_tensor *out, const gpc_tensor *inp, const gpc_tensor *weight,
                                 const gpc_tensor *bias) {
    const char *op = "matmul_forward";
    GPC_TRY(check_matmul_forward(op, out, inp, weight, bias));
    DISPATCH(op, out, matmul_forward, out, inp, weight, bias);
}

gpc_status gpc_op_matmul_residual_forward(gpc_tensor *out, const gpc_tensor *inp,
                                          const gpc_tensor *weight, const gpc_tensor *bias,
                                          const gpc_tensor *residual) {
    const char *op = "matmul_residual_forward";
    GPC_TRY(check_matmul_forward(op, out, inp, weight, bias));
    GPC_TRY(need_dtype(op, "residual", residual, out->dtype));
    DEVICES(op, out, residual);
    GPC_TRY(need_numel(op, "residual", residual, gpc_tensor_numel(out)));
    DISPATCH(op, out, matmul_residual_forward, out, inp, weight, bias, residual);
}

/* The checks that matmul_quant_forward and matmul_quant_gelu_forward share:
 * the 8-bit weight, its scales, the bias, and out's size (N x OC). */
static gpc_status check_quant(const char *op, const gpc_tensor *out, const gpc_tensor *inp,
                              const gpc_tensor *qweight, const gpc_tensor *scales,
                              const gpc_tensor *bias) {
    GPC_TRY(need_float(op, "inp", inp));
    GPC_TRY(need(op, "qweight", qweight));
    if (qweight->dtype != GPC_I8 && qweight->dtype != GPC_F8E4M3)
        return gpc_error(GPC_ERR_MISMATCH, "%s: tensor 'qweight' must be i8 or f8e4m3, not %s", op,
                         gpc_dtype_name(qweight->dtype));
    GPC_TRY(need_dtype(op, "scales", scales, GPC_F32));
    if (bias) GPC_TRY(need_float(op, "bias", bias));
    DEVICES(op, out, inp, qweight, scales, bias);
    int64_t C = last_dim(inp), N = rows(inp), OC = rows(qweight);
    if (last_dim(qweight) != C) {
        char a[96], b[96];
        return gpc_error(GPC_ERR_MISMATCH, "%s: inp %s and qweight %s disagree on C", op,
                         gpc_tensor_describe(inp, a, sizeof a),
                         gpc_tensor_describe(qweight, b, sizeof b));
    }
    if (gpc_tensor_numel(scales) != OC && gpc_tensor_numel(scales) != 1)
        GPC_TRY(need_numel(op, "scales", scales, OC));
    if (bias) GPC_TRY(need_numel(op, "bias", bias, OC));
    if (out->data == inp->data)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s: out shares its buffer with inp, which the product still reads; "
                         "give out its own",
                         op);
    return need_numel(op, "out", out, N * OC);
}

gpc_status gpc_op_matmul_quant_forward(gpc_tensor *out, const gpc_tensor *inp,
                                       const gpc_tensor *qweight, const gpc_tensor *scales,
                                       const gpc_tensor *bias, const gpc_tensor *residual) {
    const char *op = "matmul_quant_forward";
    GPC_TRY(need_float(op, "out", out));
    if (residual) GPC_TRY(need_dtype(op, "residual", residual, out->dtype));
    GPC_TRY(check_quant(op, out, inp, qweight, scales, bias));
    if (residual) {
        DEVICES(op, out, residual);
        GPC_TRY(need_numel(op, "residual", residual, gpc_tensor_numel(out)));
    }
    DISPATCH(op, out, matmul_quant_forward, out, inp, qweight, scales, bias, residual);
}

gpc_status gpc_op_matmul_quant_gelu_forward(gpc_tensor *out_pre, gpc_tensor *out_gelu,
                                            const gpc_tensor *inp, const gpc_tensor *qweight,
                                            const gpc_tensor *scales, const gpc_tensor *bias) {
    const char *op = "matmul_quant_gelu_forward";
    GPC_TRY(need_float(op, "out_pre", out_pre));
    GPC_TRY(need_float(op, "out_gelu", out_gelu));
    GPC_TRY(check_quant(op, out_pre, inp, qweight, scales, bias));
    DEVICES(op, out_pre, out_gelu);
    GPC_TRY(need_numel(op, "out_gelu", out_gelu, gpc_tensor_numel(out_pre)));
    if (out_pre->data == out_gelu->data || out_gelu->data == inp->data)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s: out_pre, out_gelu and inp must be three buffers; give each its own",
                         op);
    DISPATCH(op, out_pre, matmul_quant_gelu_forward, out_pre, out_gelu, inp, qweight, scales, bias);
}

gpc_status gpc_op_matmul_backward(gpc_tensor *dinp, gpc_tensor *dweight, gpc_tensor *dbias,
                                  const gpc_tensor *dout, const gpc_tensor *inp,
                                  const gpc_tensor *weight) {
    const char *op = "matmul_backward";
    if (!dinp && !dweight && !dbias)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s: tensors 'dinp', 'dweight' and 'dbias' are all missing: nothing to "
                         "compute",
                         op);
    GPC_TRY(need_float(op, "dout", dout));
    GPC_TRY(need_float(op, "inp", inp));
    GPC_TRY(need_float(op, "weight", weight));
    if (dweight) GPC_TRY(need_float(op, "dweight", dweight));
    if (dinp) GPC_TRY(need_float(op, "dinp", dinp));
    if (dbias) GPC_TRY(need_float(op, "dbias", dbias));
    DEVICES(op, dout, inp, weight, dweight, dinp, dbias);
    int64_t C = last_dim(inp), N = rows(inp), OC = rows(weight);
    if (last_dim(weight) != C)
        return gpc_error(GPC_ERR_MISMATCH, "matmul_backward: inp and weight disagree on C");
    GPC_TRY(need_numel(op, "dout", dout, N * OC));
    if (dweight) GPC_TRY(need_numel(op, "dweight", dweight, OC * C));
    if (dinp) GPC_TRY(need_numel(op, "dinp", dinp, N * C));
    if (dbias) GPC_TRY(need_numel(op, "dbias", dbias, OC));
    DISPATCH(op, dout, matmul_backward, dinp, dweight, dbias, dout, inp, weight);
}

gpc_status gpc_op_gelu_forward(gpc_tensor *out, const gpc_tensor *inp) {
    const char *op = "gelu_forward";
    GPC_TRY(need_float(op, "out", out));
    GPC_TRY(need_float(op, "inp", inp));
    DEVICES(op, out, inp);
    GPC_TRY(need_numel(op, "inp", inp, gpc_tensor_numel(out)));
    DISPATCH(op, out, gelu_forward, out, inp);
}

gpc_status gpc_op_gelu_backward(gpc_tensor *dinp, const gpc_tensor *inp, const gpc_tensor *dout) {
    const char *op = "gelu_backward";
    GPC_TRY(need_float(op, "dinp", dinp));
    GPC_TRY(need_float(op, "inp", inp));
    GPC_TRY(need_float(op, "dout", dout));
    DEVICES(op, dinp, inp, dout);
    GPC_TRY(need_numel(op, "inp", inp, gpc_tensor_numel(dinp)));
    GPC_TRY(need_numel(op, "dout", dout, gpc_tensor_numel(dinp)));
    DISPATCH(op, dinp, gelu_backward, dinp, inp, dout);
}

/* qkv [B, T, 3C] with C split into num_heads heads. */
static gpc_status check_qkv(const char *op, const gpc_tensor *qkv, int num_heads) {
    if (qkv->ndim != 3 || qkv->shape[2] % 3 != 0)
        return gpc_error(GPC_ERR_MISMATCH, "%s: qkv must be [B, T, 3C]", op);
    int64_t C = qkv->shape[2] / 3;
    if (num_heads <= 0 || C % num_heads != 0)
        return gpc_error(GPC_ERR_MISMATCH, "%s: %lld channels do not split into %d heads", op,
                         (long long)C, num_heads);
    return GPC_OK;
}

static gpc_status check_attention(const char *op, const gpc_tensor *out, const gpc_tensor *lse,
                                  const gpc_tensor *qkv, int num_heads) {
    GPC_TRY(need_float(op, "out", out));
    GPC_TRY(need_dtype(op, "lse", lse, GPC_F32));
    GPC_TRY(need_float(op, "qkv", qkv));
    DEVICES(op, out, lse, qkv);
    GPC_TRY(check_qkv(op, qkv, num_heads));
    int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3;
    GPC_TRY(need_numel(op, "out", out, B * T * C));
    GPC_TRY(need_numel(op, "lse", lse, B * num_heads * T));
    return GPC_OK;
}

gpc_status gpc_op_attention_forward(gpc_tensor *out, gpc_tensor *lse, const gpc_tensor *qkv,
                                    int num_heads) {
    GPC_TRY(check_attention("attention_forward", out, lse, qkv, num_heads));
    DISPATCH("attention_forward", out, attention_forward, out, lse, qkv, num_heads);
}

gpc_status gpc_op_attention_decode(gpc_tensor *out, const gpc_tensor *qkv, int num_heads) {
    const char *op = "attention_decode";
    GPC_TRY(need_float(op, "out", out));
    GPC_TRY(need_float(op, "qkv", qkv));
    DEVICES(op, out, qkv);
    GPC_TRY(check_qkv(op, qkv, num_heads));
    int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3;
    if (out->ndim != 3 || out->shape[0] != B || out->shape[2] != C || out->shape[1] < 1 ||
        out->shape[1] > T)
        return gpc_error(GPC_ERR_MISMATCH,
                         "%s: out must be [%lld, 1..%lld, %lld] for qkv [%lld, %lld, %lld]", op,
                         (long long)B, (long long)T, (long long)C, (long long)B, (long long)T,
                         (long long)(3 * C));
    DISPATCH(op, out, attention_decode, out, qkv, num_heads);
}

gpc_status gpc_op_attention_backward(gpc_tensor *dqkv, const gpc_tensor *dout,
                                     const gpc_tensor *qkv, const gpc_tensor *out,
                                     const gpc_tensor *lse, int num_heads) {
    const char *op = "attention_backward";
    GPC_TRY(check_attention(op, out, lse, qkv, num_heads));
    GPC_TRY(need_float(op, "dqkv", dqkv));
    GPC_TRY(need_float(op, "dout", dout));
    DEVICES(op, out, dqkv, dout);
    GPC_TRY(need_numel(op, "dqkv", dqkv, gpc_tensor_numel(qkv)));
    GPC_TRY(need_numel(op, "dout", dout, gpc_tensor_numel(out)));
    DISPATCH(op, out, attention_backward, dqkv, dout, qkv, out, lse, num_heads);
}

gpc_status gpc_op_attention_prepare(const gpc_tensor *qkv, int num_heads, int backward) {
    const char *op = "attention_prepare";
    if (!qkv) return gpc_error(GPC_ERR_INVALID_ARG, "%s: tensor 'qkv' is missing", op);
    if (!is_float(qkv->dtype))
        return gpc_error(GPC_ERR_MISMATCH, "%s: tensor 'qkv' must be f32, bf16 or f16, not %s", op,
                         gpc_dtype_name(qkv->dtype));
    GPC_TRY(check_qkv(op, qkv, num_heads));
    DISPATCH(op, qkv, attention_prepare, qkv, num_heads, backward ? 1 : 0);
}

/* ------------------------------------------------- attention path choice */

static const char *const attention_path_names[] = {"auto", "gpc", "cudnn", "simple"};
/* -1: not set, read GPC_ATTENTION; else a gpc_attention_path. */
static volatile int attention_path_set = -1;

gpc_status gpc_attention_path_parse(const char *name, gpc_attention_path *out) {
    for (int i = 0; name && i < 4; i++)
        if (!strcmp(name, attention_path_names[i])) {
            *out = (gpc_attention_path)i;
            return GPC_OK;
        }
    return gpc_error(GPC_ERR_INVALID_ARG,
                     "attention path '%s' is not auto, gpc, cudnn or simple (auto: the faster of "
                     "gpc's kernels and cuDNN's for this GPU)",
                     name ? name : "(none)");
}

const char *gpc_attention_path_name(gpc_attention_path path) {
    return (unsigned)path < 4 ? attention_path_names[path] : "unknown";
}

gpc_status gpc_op_set_attention_path(const char *name) {
    if (!name) {
        attention_path_set = -1;
        return GPC_OK;
    }
    gpc_attention_path path = GPC_ATTENTION_AUTO;
    GPC_TRY(gpc_attention_path_parse(name, &path));
    attention_path_set = (int)path;
    return GPC_OK;
}

gpc_status gpc_op_attention_path(gpc_attention_path *out) {
    int set = attention_path_set;
    if (set >= 0) {
        *out = (gpc_attention_path)set;
        return GPC_OK;
    }
    const char *env = gpc_setting_str("GPC_ATTENTION");
    if (!env || !env[0]) {
        *out = GPC_ATTENTION_AUTO;
        return GPC_OK;
    }
    gpc_status s = gpc_attention_path_parse(env, out);
    if (s != GPC_OK) return gpc_error_context(s, "GPC_ATTENTION in the environment: ");
    return GPC_OK;
}

gpc_status gpc_op_crossentropy_forward_backward(gpc_tensor *losses, gpc_tensor *dlogits,
                                                const gpc_tensor *logits, const gpc_tensor *targets,
                                                int vocab_size, float dloss) {
    const char *op = "crossentropy_forward_backward";
    GPC_TRY(need_dtype(op, "losses", losses, GPC_F32));
    GPC_TRY(need_float(op, "logits", logits));
    GPC_TRY(need_dtype(op, "targets", targets, GPC_I32));
    if (dlogits) GPC_TRY(need_float(op, "dlogits", dlogits));
    DEVICES(op, logits, losses, targets, dlogits);
    int64_t Vp = last_dim(logits), N = rows(logits);
    if (vocab_size <= 0 || vocab_size > Vp)
        return gpc_error(GPC_ERR_MISMATCH, "%s: vocab_size %d is outside 1..%lld", op, vocab_size,
                         (long long)Vp);
    GPC_TRY(need_numel(op, "losses", losses, N));
    GPC_TRY(need_numel(op, "targets", targets, N));
    if (dlogits) GPC_TRY(need_numel(op, "dlogits", dlogits, N * Vp));
    DISPATCH(op, logits, crossentropy_forward_backward, losses, dlogits, logits, targets,
             vocab_size, dloss);
}

/* The checks the three steps of the vocab-parallel cross-entropy share:
 * logits [N, S] a slice of columns col0.. of a vocabulary of vocab_size real
 * columns, stats f32 [3, N], targets i32 [N] when given. */
static gpc_status check_slice_ce(const char *op, const gpc_tensor *stats, const gpc_tensor *logits,
                                 const gpc_tensor *targets, int64_t col0, int vocab_size) {
    GPC_TRY(need_dtype(op, "stats", stats, GPC_F32));
    GPC_TRY(need_float(op, "logits", logits));
    if (targets) GPC_TRY(need_dtype(op, "targets", targets, GPC_I32));
    DEVICES(op, logits, stats, targets);
    int64_t N = rows(logits);
    if (vocab_size <= 0 || col0 < 0)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s: vocab_size %d and the slice's first column %lld must be positive", op,
                         vocab_size, (long long)col0);
    GPC_TRY(need_numel(op, "stats", stats, 3 * N));
    if (targets) GPC_TRY(need_numel(op, "targets", targets, N));
    return GPC_OK;
}

gpc_status gpc_op_crossentropy_slice_max(gpc_tensor *stats, const gpc_tensor *logits, int64_t col0,
                                         int vocab_size) {
    const char *op = "crossentropy_slice_max";
    GPC_TRY(check_slice_ce(op, stats, logits, NULL, col0, vocab_size));
    DISPATCH(op, logits, crossentropy_slice_max, stats, logits, col0, vocab_size);
}

gpc_status gpc_op_crossentropy_slice_sums(gpc_tensor *stats, const gpc_tensor *logits,
                                          const gpc_tensor *targets, int64_t col0, int vocab_size) {
    const char *op = "crossentropy_slice_sums";
    GPC_TRY(need(op, "targets", targets));
    GPC_TRY(check_slice_ce(op, stats, logits, targets, col0, vocab_size));
    DISPATCH(op, logits, crossentropy_slice_sums, stats, logits, targets, col0, vocab_size);
}

gpc_status gpc_op_crossentropy_slice_finish(gpc_tensor *losses, gpc_tensor *dlogits,
                                            const gpc_tensor *logits, const gpc_tensor *targets,
                                            const gpc_tensor *stats, int64_t col0, int vocab_size,
                                            float dloss) {
    const char *op = "crossentropy_slice_finish";
    GPC_TRY(need(op, "targets", targets));
    GPC_TRY(check_slice_ce(op, stats, logits, targets, col0, vocab_size));
    GPC_TRY(need_dtype(op, "losses", losses, GPC_F32));
    GPC_TRY(need_numel(op, "losses", losses, rows(logits)));
    if (dlogits) {
        GPC_TRY(need_float(op, "dlogits", dlogits));
        GPC_TRY(need_numel(op, "dlogits", dlogits, gpc_tensor_numel(logits)));
        if (dlogits->dtype != logits->dtype)
            return gpc_error(GPC_ERR_MISMATCH, "%s: dlogits must be %s like the logits", op,
                             gpc_dtype_name(logits->dtype));
    }
    DEVICES(op, logits, losses, dlogits);
    DISPATCH(op, logits, crossentropy_slice_finish, losses, dlogits, logits, targets, stats, col0,
             vocab_size, dloss);
}

gpc_status gpc_op_sum_squares(gpc_tensor *acc, const gpc_tensor *x) {
    const char *op = "sum_squares";
    GPC_TRY(need_dtype(op, "acc", acc, GPC_F32));
    GPC_TRY(need_float(op, "x", x));
    DEVICES(op, acc, x);
    GPC_TRY(need_numel(op, "acc", acc, 1));
    DISPATCH(op, x, sum_squares, acc, x);
}

gpc_status gpc_op_adamw(gpc_tensor *params, gpc_tensor *master, const gpc_tensor *grads,
                        gpc_tensor *m, gpc_tensor *v, const gpc_adamw_args *args) {
    const char *op = "adamw";
    GPC_TRY(need_float(op, "params", params));
    GPC_TRY(need_float(op, "grads", grads));
    GPC_TRY(need_dtype(op, "m", m, GPC_F32));
    GPC_TRY(need_dtype(op, "v", v, GPC_F32));
    if (master) GPC_TRY(need_dtype(op, "master", master, GPC_F32));
    if (!master && params->dtype != GPC_F32)
        return gpc_error(GPC_ERR_INVALID_ARG, "adamw: %s parameters need an f32 master copy",
                         gpc_dtype_name(params->dtype));
    if (args->grad_norm_sq) GPC_TRY(need_dtype(op, "grad_norm_sq", args->grad_norm_sq, GPC_F32));
    if (args->skip_nonfinite && !args->grad_norm_sq)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "adamw: skip_nonfinite needs grad_norm_sq, the norm it tests");
    DEVICES(op, params, master, grads, m, v, args->grad_norm_sq);
    int64_t n = gpc_tensor_numel(params);
    GPC_TRY(need_numel(op, "grads", grads, n));
    GPC_TRY(need_numel(op, "m", m, n));
    GPC_TRY(need_numel(op, "v", v, n));
    if (master) GPC_TRY(need_numel(op, "master", master, n));
    if (args->step < 1) return gpc_error(GPC_ERR_INVALID_ARG, "adamw: step must start at 1");
    DISPATCH(op, params, adamw, params, master, grads, m, v, args);
}

gpc_status gpc_op_convert(gpc_tensor *dst, const gpc_tensor *src) {
    const char *op = "convert";
    GPC_TRY(need_float(op, "dst", dst));
    GPC_TRY(need_float(op, "src", src));
    DEVICES(op, dst, src);
    GPC_TRY(need_numel(op, "src", src, gpc_tensor_numel(dst)));
    DISPATCH(op, dst, convert, dst, src);
}

gpc_status gpc_op_scale(gpc_tensor *x, float factor) {
    GPC_TRY(need_float("scale", "x", x));
    DISPATCH("scale", x, scale, x, factor);
}

/* Shapes shared by the fused linear + GELU ops: inp [N,C], weight [OC,C]. */
static gpc_status check_linear(const char *op, const gpc_tensor *inp, const gpc_tensor *weight,
                               int64_t *N, int64_t *C, int64_t *OC) {
    *C = last_dim(inp), *N = rows(inp), *OC = rows(weight);
    if (last_dim(weight) != *C) {
        char a[96], b[96];
        return gpc_error(GPC_ERR_MISMATCH, "%s: inp %s and weight %s disagree on C", op,
                         gpc_tensor_describe(inp, a, sizeof a),
                         gpc_tensor_describe(weight, b, sizeof b));
    }
    return GPC_OK;
}

gpc_status gpc_op_matmul_gelu_forward(gpc_tensor *out_pre, gpc_tensor *out_gelu,
                                      const gpc_tensor *inp, const gpc_tensor *weight,
                                      const gpc_tensor *bias) {
    const char *op = "matmul_gelu_forward";
    const gpc_ops_table *table = NULL;
    int64_t N, C, OC;
    GPC_TRY(need_float(op, "out_pre", out_pre));
    GPC_TRY(need_float(op, "out_gelu", out_gelu));
    GPC_TRY(need_float(op, "inp", inp));
    GPC_TRY(need_float(op, "weight", weight));
    if (bias) GPC_TRY(need_float(op, "bias", bias));
    DEVICES(op, out_pre, out_gelu, inp, weight, bias);
    GPC_TRY(check_linear(op, inp, weight, &N, &C, &OC));
    GPC_TRY(need_numel(op, "out_pre", out_pre, N * OC));
    GPC_TRY(need_numel(op, "out_gelu", out_gelu, N * OC));
    if (bias) GPC_TRY(need_numel(op, "bias", bias, OC));
    if (out_pre->data == out_gelu->data)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s: out_pre and out_gelu are one buffer; give each its own, since the "
                         "backward pass needs the pre-activation",
                         op);
    GPC_TRY(table_for(op, out_pre, &table));
    if (table && table->matmul_gelu_forward)
        return table->matmul_gelu_forward(out_pre, out_gelu, inp, weight, bias);
    GPC_TRY(gpc_op_matmul_forward(out_pre, inp, weight, bias));
    return gpc_op_gelu_forward(out_gelu, out_pre);
}

gpc_status gpc_op_matmul_backward_dgelu(gpc_tensor *dinp, gpc_tensor *dweight, gpc_tensor *dbias,
                                        gpc_tensor *dpre_bias, const gpc_tensor *dout,
                                        const gpc_tensor *inp, const gpc_tensor *weight,
                                        const gpc_tensor *gelu_inp) {
    const char *op = "matmul_backward_dgelu";
    const gpc_ops_table *table = NULL;
    int64_t N, C, OC;
    GPC_TRY(need_float(op, "dinp", dinp));
    if (dweight) GPC_TRY(need_float(op, "dweight", dweight));
    if (dbias) GPC_TRY(need_float(op, "dbias", dbias));
    if (dpre_bias) GPC_TRY(need_float(op, "dpre_bias", dpre_bias));
    GPC_TRY(need_float(op, "dout", dout));
    GPC_TRY(need_float(op, "inp", inp));
    GPC_TRY(need_float(op, "weight", weight));
    GPC_TRY(need_float(op, "gelu_inp", gelu_inp));
    DEVICES(op, dinp, dweight, dbias, dpre_bias, dout, inp, weight, gelu_inp);
    GPC_TRY(check_linear(op, inp, weight, &N, &C, &OC));
    GPC_TRY(need_numel(op, "dout", dout, N * OC));
    if (dweight) GPC_TRY(need_numel(op, "dweight", dweight, OC * C));
    GPC_TRY(need_numel(op, "dinp", dinp, N * C));
    GPC_TRY(need_numel(op, "gelu_inp", gelu_inp, N * C));
    if (dbias) GPC_TRY(need_numel(op, "dbias", dbias, OC));
    if (dpre_bias) GPC_TRY(need_numel(op, "dpre_bias", dpre_bias, C));
    if (dinp->data == inp->data || dinp->data == dout->data)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s: dinp shares its buffer with %s, which the product still reads; "
                         "give dinp its own",
                         op, dinp->data == inp->data ? "inp" : "dout");
    GPC_TRY(table_for(op, dinp, &table));
    if (table && table->matmul_backward_dgelu)
        return table->matmul_backward_dgelu(dinp, dweight, dbias, dpre_bias, dout, inp, weight,
                                            gelu_inp);
    GPC_TRY(gpc_op_matmul_backward(dinp, dweight, dbias, dout, inp, weight));
    GPC_TRY(gpc_op_gelu_backward(dinp, gelu_inp, dinp));
    return dpre_bias ? gpc_op_column_sums(dpre_bias, dinp, 0) : GPC_OK;
}

/* The output head: the checks here, then the backend's fused kernel, or
 * the three ops it stands for when the backend has none for these tensors
 * (GPC_ERR_UNSUPPORTED), so every backend gives the composition's result. */
gpc_status gpc_op_classifier(gpc_tensor *losses, gpc_tensor *dinp, gpc_tensor *dweight,
                             gpc_tensor *logits, const gpc_tensor *inp, const gpc_tensor *weight,
                             const gpc_tensor *targets, int vocab_size, float dloss) {
    const char *op = "classifier";
    const gpc_ops_table *table = NULL;
    int64_t N, C, Vp;
    GPC_TRY(need_dtype(op, "losses", losses, GPC_F32));
    GPC_TRY(need_float(op, "inp", inp));
    GPC_TRY(need_dtype(op, "weight", weight, inp->dtype));
    GPC_TRY(need_dtype(op, "logits", logits, inp->dtype));
    GPC_TRY(need_dtype(op, "dinp", dinp, inp->dtype));
    GPC_TRY(need_dtype(op, "dweight", dweight, inp->dtype));
    GPC_TRY(need_dtype(op, "targets", targets, GPC_I32));
    DEVICES(op, inp, losses, dinp, dweight, logits, weight, targets);
    GPC_TRY(check_linear(op, inp, weight, &N, &C, &Vp));
    if (vocab_size <= 0 || vocab_size > Vp)
        return gpc_error(GPC_ERR_MISMATCH, "%s: vocab_size %d is outside 1..%lld (weight's rows)",
                         op, vocab_size, (long long)Vp);
    GPC_TRY(need_numel(op, "logits", logits, N * Vp));
    GPC_TRY(need_numel(op, "losses", losses, N));
    GPC_TRY(need_numel(op, "targets", targets, N));
    GPC_TRY(need_numel(op, "dinp", dinp, N * C));
    GPC_TRY(need_numel(op, "dweight", dweight, Vp * C));
    if (dinp->data == inp->data || dinp->data == logits->data)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s: dinp shares its buffer with %s, which the product still reads; "
                         "give dinp its own",
                         op, dinp->data == inp->data ? "inp" : "logits");
    if (logits->data == inp->data || logits->data == weight->data)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s: logits shares its buffer with %s, which the products still read; "
                         "give logits its own",
                         op, logits->data == inp->data ? "inp" : "weight");
    /* [N, Vp] whatever shape logits came in, so that the product and the
     * cross-entropy agree on its rows */
    gpc_tensor rows_vp = gpc_tensor_2d(logits->data, logits->dtype, logits->device, N, Vp);
    GPC_TRY(table_for(op, inp, &table));
    if (table && table->classifier) {
        gpc_status st = table->classifier(losses, dinp, dweight, &rows_vp, inp, weight, targets,
                                          vocab_size, dloss);
        if (st != GPC_ERR_UNSUPPORTED) return st;
        gpc_clear_error(); /* no fused kernel for these tensors or this device */
    }
    GPC_TRY(gpc_op_matmul_forward(&rows_vp, inp, weight, NULL));
    GPC_TRY(gpc_op_crossentropy_forward_backward(losses, &rows_vp, &rows_vp, targets, vocab_size,
                                                 dloss));
    return gpc_op_matmul_backward(dinp, dweight, NULL, &rows_vp, inp, weight);
}

gpc_status gpc_op_column_sums(gpc_tensor *acc, const gpc_tensor *x, int64_t first) {
    const char *op = "column_sums";
    GPC_TRY(need_float(op, "acc", acc));
    GPC_TRY(need_float(op, "x", x));
    DEVICES(op, acc, x);
    int64_t K = gpc_tensor_numel(acc), W = last_dim(x);
    if (first < 0 || K > W || first > W - K)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s: columns %lld to %lld are not all among x's %lld columns", op,
                         (long long)first, (long long)(first + K - 1), (long long)W);
    DISPATCH(op, x, column_sums, acc, x, first);
}

gpc_status gpc_op_sum(gpc_tensor *acc, const gpc_tensor *x) {
    const char *op = "sum";
    GPC_TRY(need_dtype(op, "acc", acc, GPC_F32));
    GPC_TRY(need_float(op, "x", x));
    DEVICES(op, acc, x);
    GPC_TRY(need_numel(op, "acc", acc, 1));
    DISPATCH(op, x, sum, acc, x);
}

/* ------------------------------------------------------------ serving */

gpc_status gpc_op_embedding_at(gpc_tensor *out, const gpc_tensor *tokens,
                               const gpc_tensor *positions, const gpc_tensor *wte,
                               const gpc_tensor *wpe) {
    const char *op = "embedding_at";
    GPC_TRY(need_float(op, "out", out));
    GPC_TRY(need_dtype(op, "tokens", tokens, GPC_I32));
    GPC_TRY(need_dtype(op, "positions", positions, GPC_I32));
    GPC_TRY(need_float(op, "wte", wte));
    GPC_TRY(need_float(op, "wpe", wpe));
    DEVICES(op, out, tokens, positions, wte, wpe);
    int64_t C = last_dim(wte), N = gpc_tensor_numel(tokens);
    if (last_dim(wpe) != C)
        return gpc_error(GPC_ERR_MISMATCH, "%s: wpe must be [maxT, %lld]", op, (long long)C);
    GPC_TRY(need_numel(op, "positions", positions, N));
    GPC_TRY(need_numel(op, "out", out, N * C));
    DISPATCH(op, out, embedding_at, out, tokens, positions, wte, wpe);
}

/* A paged cache [num_blocks, block_size, C] of qkv's dtype. */
static gpc_status check_cache(const char *op, const char *name, const gpc_tensor *cache,
                              const gpc_tensor *qkv, int64_t C) {
    GPC_TRY(need_dtype(op, name, cache, qkv->dtype));
    if (cache->ndim != 3 || cache->shape[2] != C || cache->shape[0] < 1 || cache->shape[1] < 1)
        return gpc_error(GPC_ERR_MISMATCH, "%s: %s must be [num_blocks, block_size, %lld]", op,
                         name, (long long)C);
    return GPC_OK;
}

/* qkv [N, 3C] with C a multiple of num_heads (num_heads 0: not checked). */
static gpc_status check_rows_qkv(const char *op, const gpc_tensor *qkv, int num_heads, int64_t *N,
                                 int64_t *C) {
    GPC_TRY(need_float(op, "qkv", qkv));
    if (qkv->ndim != 2 || qkv->shape[1] % 3 != 0)
        return gpc_error(GPC_ERR_MISMATCH, "%s: qkv must be [N, 3C]", op);
    *N = qkv->shape[0];
    *C = qkv->shape[1] / 3;
    if (num_heads && (num_heads < 0 || *C % num_heads != 0))
        return gpc_error(GPC_ERR_MISMATCH, "%s: %lld channels do not split into %d heads", op,
                         (long long)*C, num_heads);
    return GPC_OK;
}

gpc_status gpc_op_kv_store(gpc_tensor *k_cache, gpc_tensor *v_cache, const gpc_tensor *qkv,
                           const gpc_tensor *slots) {
    const char *op = "kv_store";
    int64_t N = 0, C = 0;
    GPC_TRY(check_rows_qkv(op, qkv, 0, &N, &C));
    GPC_TRY(check_cache(op, "k_cache", k_cache, qkv, C));
    GPC_TRY(check_cache(op, "v_cache", v_cache, qkv, C));
    GPC_TRY(need_dtype(op, "slots", slots, GPC_I32));
    GPC_TRY(need_numel(op, "slots", slots, N));
    if (gpc_tensor_numel(v_cache) != gpc_tensor_numel(k_cache))
        return gpc_error(GPC_ERR_MISMATCH, "%s: k_cache and v_cache differ in shape", op);
    DEVICES(op, qkv, k_cache, v_cache, slots);
    DISPATCH(op, qkv, kv_store, k_cache, v_cache, qkv, slots);
}

gpc_status gpc_op_decode_product(gpc_tensor *out, const gpc_tensor *inp, const gpc_tensor *weight,
                                 const gpc_decode_product_args *args) {
    const char *op = "decode_product";
    gpc_decode_product_args none;
    memset(&none, 0, sizeof none);
    const gpc_decode_product_args *a = args ? args : &none;
    GPC_TRY(check_matmul_forward(op, out, inp, weight, a->bias));
    int64_t C = last_dim(inp), N = rows(inp), OC = rows(weight);
    if (N > GPC_DECODE_MAX_ROWS)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s: %lld rows; the fused decode product takes at most %d (use the "
                         "unfused ops for more)",
                         op, (long long)N, GPC_DECODE_MAX_ROWS);
    if (out->dtype != inp->dtype)
        return gpc_error(GPC_ERR_MISMATCH, "%s: out is %s and inp %s; they share a dtype", op,
                         gpc_dtype_name(out->dtype), gpc_dtype_name(inp->dtype));
    if (out->data == inp->data)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s: out shares its buffer with inp, which the product still reads; "
                         "give out its own",
                         op);
    if (!a->ln_weight != !a->ln_bias)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s: the layernorm prologue needs both ln_weight and ln_bias", op);
    if (a->ln_weight) {
        GPC_TRY(need_float(op, "ln_weight", a->ln_weight));
        GPC_TRY(need_float(op, "ln_bias", a->ln_bias));
        DEVICES(op, out, a->ln_weight, a->ln_bias);
        GPC_TRY(need_numel(op, "ln_weight", a->ln_weight, C));
        GPC_TRY(need_numel(op, "ln_bias", a->ln_bias, C));
    }
    if (a->residual) {
        if (a->gelu)
            return gpc_error(GPC_ERR_INVALID_ARG, "%s: a residual and GELU do not go together", op);
        GPC_TRY(need_dtype(op, "residual", a->residual, out->dtype));
        DEVICES(op, out, a->residual);
        GPC_TRY(need_numel(op, "residual", a->residual, N * OC));
    }
    int kv = a->k_cache != NULL, parts = kv + (a->v_cache != NULL) + (a->slots != NULL);
    if (parts != 0 && parts != 3)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s: storing keys and values needs k_cache, v_cache and slots", op);
    if (kv) {
        if (OC % 3 != 0)
            return gpc_error(GPC_ERR_MISMATCH,
                             "%s: storing keys and values needs qkv's product, of 3C columns; "
                             "got %lld",
                             op, (long long)OC);
        gpc_tensor qkv = gpc_tensor_2d(out->data, out->dtype, out->device, N, OC);
        GPC_TRY(check_cache(op, "k_cache", a->k_cache, &qkv, OC / 3));
        GPC_TRY(check_cache(op, "v_cache", a->v_cache, &qkv, OC / 3));
        if (gpc_tensor_numel(a->v_cache) != gpc_tensor_numel(a->k_cache))
            return gpc_error(GPC_ERR_MISMATCH, "%s: k_cache and v_cache differ in shape", op);
        GPC_TRY(need_dtype(op, "slots", a->slots, GPC_I32));
        GPC_TRY(need_numel(op, "slots", a->slots, N));
        DEVICES(op, out, a->k_cache, a->v_cache, a->slots);
    }
    DISPATCH(op, out, decode_product, out, inp, weight, a);
}

gpc_status gpc_op_paged_attention(gpc_tensor *out, const gpc_tensor *qkv, const gpc_tensor *k_cache,
                                  const gpc_tensor *v_cache, const gpc_tensor *block_tables,
                                  const gpc_tensor *token_seq, const gpc_tensor *token_pos,
                                  int num_heads) {
    const char *op = "paged_attention";
    int64_t N = 0, C = 0;
    GPC_TRY(check_rows_qkv(op, qkv, num_heads, &N, &C));
    GPC_TRY(need_float(op, "out", out));
    GPC_TRY(need_numel(op, "out", out, N * C));
    GPC_TRY(check_cache(op, "k_cache", k_cache, qkv, C));
    GPC_TRY(check_cache(op, "v_cache", v_cache, qkv, C));
    if (gpc_tensor_numel(v_cache) != gpc_tensor_numel(k_cache))
        return gpc_error(GPC_ERR_MISMATCH, "%s: k_cache and v_cache differ in shape", op);
    GPC_TRY(need_dtype(op, "block_tables", block_tables, GPC_I32));
    if (block_tables->ndim != 2)
        return gpc_error(GPC_ERR_MISMATCH, "%s: block_tables must be [S, max_blocks]", op);
    GPC_TRY(need_dtype(op, "token_seq", token_seq, GPC_I32));
    GPC_TRY(need_dtype(op, "token_pos", token_pos, GPC_I32));
    GPC_TRY(need_numel(op, "token_seq", token_seq, N));
    GPC_TRY(need_numel(op, "token_pos", token_pos, N));
    DEVICES(op, qkv, out, k_cache, v_cache, block_tables, token_seq, token_pos);
    DISPATCH(op, qkv, paged_attention, out, qkv, k_cache, v_cache, block_tables, token_seq,
             token_pos, num_heads);
}

gpc_status gpc_op_sample(gpc_tensor *tokens_out, const gpc_tensor *logits, int vocab_size,
                         const gpc_tensor *params) {
    const char *op = "sample";
    GPC_TRY(need_dtype(op, "tokens_out", tokens_out, GPC_I32));
    GPC_TRY(need_float(op, "logits", logits));
    GPC_TRY(need_dtype(op, "params", params, GPC_F32));
    DEVICES(op, logits, tokens_out, params);
    int64_t Vp = last_dim(logits), R = rows(logits);
    if (vocab_size < 1 || vocab_size > Vp)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s: vocab_size %d must be in 1 .. %lld, the logits' last dimension", op,
                         vocab_size, (long long)Vp);
    GPC_TRY(need_numel(op, "tokens_out", tokens_out, R));
    GPC_TRY(need_numel(op, "params", params, 4 * R));
    DISPATCH(op, logits, sample, tokens_out, logits, vocab_size, params);
}

gpc_status gpc_op_forbid_tokens(gpc_tensor *logits, const gpc_tensor *tokens) {
    const char *op = "forbid_tokens";
    GPC_TRY(need_float(op, "logits", logits));
    GPC_TRY(need_dtype(op, "tokens", tokens, GPC_I32));
    DEVICES(op, logits, tokens);
    GPC_TRY(need_numel(op, "tokens", tokens, rows(logits)));
    DISPATCH(op, logits, forbid_tokens, logits, tokens);
}

gpc_status gpc_op_feed_tokens(gpc_tensor *tokens, const gpc_tensor *feed,
                              const gpc_tensor *previous) {
    const char *op = "feed_tokens";
    GPC_TRY(need_dtype(op, "tokens", tokens, GPC_I32));
    GPC_TRY(need_dtype(op, "feed", feed, GPC_I32));
    GPC_TRY(need_dtype(op, "previous", previous, GPC_I32));
    DEVICES(op, tokens, feed, previous);
    GPC_TRY(need_numel(op, "feed", feed, gpc_tensor_numel(tokens)));
    DISPATCH(op, tokens, feed_tokens, tokens, feed, previous);
}
