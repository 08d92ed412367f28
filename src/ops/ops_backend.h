/*
 * ops_backend.h: the table of numeric operations a backend fills in.
 *
 * src/ops/ops.c validates every call (shapes, dtypes, one device) and then
 * calls the entry of the device's backend, so backends may assume valid,
 * contiguous tensors and need not repeat the checks. The meaning of each
 * entry is documented beside its public twin in ops.h. An entry left NULL
 * makes the public call fail with GPC_ERR_UNSUPPORTED naming the backend.
 */
#ifndef GPC_OPS_BACKEND_H
#define GPC_OPS_BACKEND_H

#include "ops/ops.h"

typedef struct gpc_ops_table {
    gpc_status (*embedding_forward)(gpc_tensor *out, const gpc_tensor *tokens,
                                    const gpc_tensor *wte, const gpc_tensor *wpe);
    gpc_status (*embedding_backward)(gpc_tensor *dwte, gpc_tensor *dwpe, const gpc_tensor *dout,
                                     const gpc_tensor *tokens);
    gpc_status (*layernorm_forward)(gpc_tensor *out, gpc_tensor *mean, gpc_tensor *rstd,
                                    const gpc_tensor *inp, const gpc_tensor *weight,
                                    const gpc_tensor *bias);
    gpc_status (*layernorm_backward)(gpc_tensor *dinp, gpc_tensor *dweight, gpc_tensor *dbias,
                                     const gpc_tensor *dout, const gpc_tensor *inp,
                                     const gpc_tensor *weight, const gpc_tensor *mean,
                                     const gpc_tensor *rstd);
    /* Optional: NULL means ops.c runs residual_forward then layernorm_forward. */
    gpc_status (*residual_layernorm_forward)(gpc_tensor *residual, gpc_tensor *out,
                                             gpc_tensor *mean, gpc_tensor *rstd,
                                             const gpc_tensor *a, const gpc_tensor *b,
                                             const gpc_tensor *weight, const gpc_tensor *bias);
    gpc_status (*matmul_forward)(gpc_tensor *out, const gpc_tensor *inp, const gpc_tensor *weight,
                                 const gpc_tensor *bias);
    gpc_status (*matmul_backward)(gpc_tensor *dinp, gpc_tensor *dweight, gpc_tensor *dbias,
                                  const gpc_tensor *dout, const gpc_tensor *inp,
                                  const gpc_tensor *weight);
    gpc_status (*gelu_forward)(gpc_tensor *out, const gpc_tensor *inp);
    gpc_status (*gelu_backward)(gpc_tensor *dinp, const gpc_tensor *inp, const gpc_tensor *dout);
    gpc_status (*residual_forward)(gpc_tensor *out, const gpc_tensor *a, const gpc_tensor *b);
    gpc_status (*attention_forward)(gpc_tensor *out, gpc_tensor *lse, const gpc_tensor *qkv,
                                    int num_heads);
    gpc_status (*attention_backward)(gpc_tensor *dqkv, const gpc_tensor *dout,
                                     const gpc_tensor *qkv, const gpc_tensor *out,
                                     const gpc_tensor *lse, int num_heads);
    gpc_status (*crossentropy_forward_backward)(gpc_tensor *losses, gpc_tensor *dlogits,
                                                const gpc_tensor *logits, const gpc_tensor *targets,
                                                int vocab_size, float dloss);
    gpc_status (*sum_squares)(gpc_tensor *acc, const gpc_tensor *x);
    gpc_status (*adamw)(gpc_tensor *params, gpc_tensor *master, const gpc_tensor *grads,
                        gpc_tensor *m, gpc_tensor *v, const gpc_adamw_args *args);
    gpc_status (*convert)(gpc_tensor *dst, const gpc_tensor *src);
    gpc_status (*scale)(gpc_tensor *x, float factor);
    /* Optional: NULL means ops.c composes matmul_forward and gelu_forward. */
    gpc_status (*matmul_gelu_forward)(gpc_tensor *out_pre, gpc_tensor *out_gelu,
                                      const gpc_tensor *inp, const gpc_tensor *weight,
                                      const gpc_tensor *bias);
    /* Optional: NULL means ops.c composes matmul_backward and gelu_backward. */
    gpc_status (*matmul_backward_dgelu)(gpc_tensor *dinp, gpc_tensor *dweight, gpc_tensor *dbias,
                                        const gpc_tensor *dout, const gpc_tensor *inp,
                                        const gpc_tensor *weight, const gpc_tensor *gelu_inp);
    gpc_status (*sum)(gpc_tensor *acc, const gpc_tensor *x);
} gpc_ops_table;

#endif /* GPC_OPS_BACKEND_H */
