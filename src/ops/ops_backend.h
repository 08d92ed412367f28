/*
 * ops_backend.h: the table of numeric operations a backend fills in.
 *
 * src/ops/ops.c validates every call (shapes, dtypes, one device) and then
 * calls the entry of the device's backend, so backends may assume valid,
 * contiguous tensors and need not repeat the checks. The meaning of each
 * entry is documented beside its public twin in ops.h. An entry left NULL
 * makes the public call fail with GPC_ERR_UNSUPPORTED naming the backend,
 * except the fused ops, which ops.c composes from the unfused ones:
 * residual_layernorm_forward, matmul_gelu_forward and matmul_backward_dgelu
 * left NULL, and classifier left NULL or answering GPC_ERR_UNSUPPORTED (for a
 * dtype, shape or GPU its fused kernel does not take).
 */
#ifndef GPC_OPS_BACKEND_H
#define GPC_OPS_BACKEND_H

#include "ops/ops.h"

/* Every op of the table, in table order, as X(name, (parameters)). The struct
 * below, each backend's declarations (gpc_cpu_NAME, gpc_cuda_NAME) and its
 * table are generated from this one list, so a new op is added once here and
 * once in ops.h, and a backend that lacks it fails to link. */
/* clang-format off */
#define GPC_OPS_LIST(X)                                                                            \
    X(embedding_forward, (gpc_tensor *out, const gpc_tensor *tokens, const gpc_tensor *wte,        \
      const gpc_tensor *wpe))                                                                      \
    X(embedding_backward, (gpc_tensor *dwte, gpc_tensor *dwpe, const gpc_tensor *dout,             \
      const gpc_tensor *tokens))                                                                   \
    X(layernorm_forward, (gpc_tensor *out, gpc_tensor *mean, gpc_tensor *rstd,                     \
      const gpc_tensor *inp, const gpc_tensor *weight, const gpc_tensor *bias))                    \
    X(layernorm_backward, (gpc_tensor *dinp, gpc_tensor *dweight, gpc_tensor *dbias,               \
      gpc_tensor *dinp_sum, const gpc_tensor *dout, const gpc_tensor *inp,                         \
      const gpc_tensor *weight, const gpc_tensor *mean, const gpc_tensor *rstd))                   \
    X(residual_layernorm_forward, (gpc_tensor *residual, gpc_tensor *out, gpc_tensor *mean,        \
      gpc_tensor *rstd, const gpc_tensor *a, const gpc_tensor *b, const gpc_tensor *weight,        \
      const gpc_tensor *bias))                                                                     \
    X(matmul_forward, (gpc_tensor *out, const gpc_tensor *inp, const gpc_tensor *weight,           \
      const gpc_tensor *bias))                                                                     \
    X(matmul_backward, (gpc_tensor *dinp, gpc_tensor *dweight, gpc_tensor *dbias,                  \
      const gpc_tensor *dout, const gpc_tensor *inp, const gpc_tensor *weight))                    \
    X(gelu_forward, (gpc_tensor *out, const gpc_tensor *inp))                                      \
    X(gelu_backward, (gpc_tensor *dinp, const gpc_tensor *inp, const gpc_tensor *dout))            \
    X(residual_forward, (gpc_tensor *out, const gpc_tensor *a, const gpc_tensor *b))               \
    X(attention_forward, (gpc_tensor *out, gpc_tensor *lse, const gpc_tensor *qkv, int num_heads)) \
    X(attention_backward, (gpc_tensor *dqkv, const gpc_tensor *dout, const gpc_tensor *qkv,        \
      const gpc_tensor *out, const gpc_tensor *lse, int num_heads))                                \
    X(attention_prepare, (const gpc_tensor *qkv, int num_heads, int backward))                     \
    X(crossentropy_forward_backward, (gpc_tensor *losses, gpc_tensor *dlogits,                     \
      const gpc_tensor *logits, const gpc_tensor *targets, int vocab_size, float dloss))           \
    X(sum_squares, (gpc_tensor *acc, const gpc_tensor *x))                                         \
    X(adamw, (gpc_tensor *params, gpc_tensor *master, const gpc_tensor *grads, gpc_tensor *m,      \
      gpc_tensor *v, const gpc_adamw_args *args))                                                  \
    X(convert, (gpc_tensor *dst, const gpc_tensor *src))                                           \
    X(scale, (gpc_tensor *x, float factor))                                                        \
    X(matmul_gelu_forward, (gpc_tensor *out_pre, gpc_tensor *out_gelu, const gpc_tensor *inp,      \
      const gpc_tensor *weight, const gpc_tensor *bias))                                           \
    X(matmul_backward_dgelu, (gpc_tensor *dinp, gpc_tensor *dweight, gpc_tensor *dbias,            \
      gpc_tensor *dpre_bias, const gpc_tensor *dout, const gpc_tensor *inp,                        \
      const gpc_tensor *weight, const gpc_tensor *gelu_inp))                                       \
    X(sum, (gpc_tensor *acc, const gpc_tensor *x))                                                 \
    X(attention_decode, (gpc_tensor *out, const gpc_tensor *qkv, int num_heads))                   \
    X(column_sums, (gpc_tensor *acc, const gpc_tensor *x, int64_t first))                          \
    X(matmul_residual_forward, (gpc_tensor *out, const gpc_tensor *inp, const gpc_tensor *weight,  \
      const gpc_tensor *bias, const gpc_tensor *residual))                                         \
    X(classifier, (gpc_tensor *losses, gpc_tensor *dinp, gpc_tensor *dweight, gpc_tensor *logits,  \
      const gpc_tensor *inp, const gpc_tensor *weight, const gpc_tensor *targets, int vocab_size,  \
      float dloss))                                                                               \
    X(embedding_at, (gpc_tensor *out, const gpc_tensor *tokens, const gpc_tensor *positions,       \
      const gpc_tensor *wte, const gpc_tensor *wpe))                                               \
    X(kv_store, (gpc_tensor *k_cache, gpc_tensor *v_cache, const gpc_tensor *qkv,                  \
      const gpc_tensor *slots))                                                                    \
    X(paged_attention, (gpc_tensor *out, const gpc_tensor *qkv, const gpc_tensor *k_cache,         \
      const gpc_tensor *v_cache, const gpc_tensor *block_tables, const gpc_tensor *token_seq,      \
      const gpc_tensor *token_pos, int num_heads))                                                \
    X(sample, (gpc_tensor *tokens_out, const gpc_tensor *logits, int vocab_size,                   \
      const gpc_tensor *params))                                                                   \
    X(matmul_quant_forward, (gpc_tensor *out, const gpc_tensor *inp, const gpc_tensor *qweight,    \
      const gpc_tensor *scales, const gpc_tensor *bias, const gpc_tensor *residual))              \
    X(forbid_tokens, (gpc_tensor *logits, const gpc_tensor *tokens))                               \
    X(feed_tokens, (gpc_tensor *tokens, const gpc_tensor *feed, const gpc_tensor *previous))       \
    X(embedding_slice_forward, (gpc_tensor *out, const gpc_tensor *tokens, const gpc_tensor *wte,  \
      const gpc_tensor *wpe, int64_t row0))                                                        \
    X(embedding_slice_backward, (gpc_tensor *dwte, gpc_tensor *dwpe, const gpc_tensor *dout,       \
      const gpc_tensor *tokens, int64_t row0))                                                     \
    X(crossentropy_slice_max, (gpc_tensor *stats, const gpc_tensor *logits, int64_t col0,          \
      int vocab_size))                                                                             \
    X(crossentropy_slice_sums, (gpc_tensor *stats, const gpc_tensor *logits,                       \
      const gpc_tensor *targets, int64_t col0, int vocab_size))                                    \
    X(crossentropy_slice_finish, (gpc_tensor *losses, gpc_tensor *dlogits,                         \
      const gpc_tensor *logits, const gpc_tensor *targets, const gpc_tensor *stats, int64_t col0,  \
      int vocab_size, float dloss))                                                                \
    X(matmul_quant_gelu_forward, (gpc_tensor *out_pre, gpc_tensor *out_gelu,                       \
      const gpc_tensor *inp, const gpc_tensor *qweight, const gpc_tensor *scales,                  \
      const gpc_tensor *bias))                                                                     \
    X(decode_product, (gpc_tensor *out, const gpc_tensor *inp, const gpc_tensor *weight,          \
      const gpc_decode_product_args *args))
/* clang-format on */

#define GPC_OPS_FIELD(name, params) gpc_status(*name) params;

typedef struct gpc_ops_table {
    GPC_OPS_LIST(GPC_OPS_FIELD)
} gpc_ops_table;

#endif /* GPC_OPS_BACKEND_H */
