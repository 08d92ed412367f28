/*
 * attention_cudnn.h: cuDNN's fused flash attention, the CUDA backend's second
 * attention path beside gpc's own kernels (attention.cu, which chooses
 * between the two; see gpc_attention_path in ops/ops.h).
 *
 * Plain C so that tests and benchmarks can ask what the path can do here.
 * The library is loaded with dlopen("libcudnn.so.9") on first use, so one
 * binary runs where cuDNN is absent. When cudnn.h was not found at build
 * time (GPC_HAVE_CUDNN undefined) every call answers "built without cuDNN".
 */
#ifndef GPC_CUDA_ATTENTION_CUDNN_H
#define GPC_CUDA_ATTENTION_CUDNN_H

#include "gpc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when this gpc was compiled against cudnn.h (the path exists in the
 * binary), 0 otherwise. */
int gpc_cudnn_attention_built(void);

/* Loads libcudnn (once) and makes a handle for the current GPU. GPC_OK when
 * cuDNN's attention can run here; otherwise GPC_ERR_UNSUPPORTED with a
 * message that says why (built without cuDNN, library not found, wrong
 * major version) and what to do. */
gpc_status gpc_cudnn_attention_load(void);

/* cuDNN's version as a number (91400 for 9.14.0), 0 when not loaded. */
long gpc_cudnn_attention_version(void);

/* Builds (once per shape and dtype, then cached) the execution plans named
 * by which (GPC_CUDNN_FORWARD, GPC_CUDNN_BACKWARD or both) for the current
 * GPU, growing the GPU's shared workspace to what the plans need.
 * GPC_ERR_UNSUPPORTED when cuDNN has no engine for the shape (the message
 * carries cuDNN's own reasons); the failure is cached too. */
enum { GPC_CUDNN_FORWARD = 1, GPC_CUDNN_BACKWARD = 2 };
gpc_status gpc_cudnn_attention_prepare(int B, int T, int NH, int hs, gpc_dtype dtype, int which);

/* 1 when the plans named by which were built for this shape on the current
 * GPU (by gpc_cudnn_attention_prepare or a call) and succeeded; 0 when they
 * failed or were never asked for. Builds nothing. */
int gpc_cudnn_attention_ready(int B, int T, int NH, int hs, gpc_dtype dtype, int which);

/* The ops, same contract as gpc_op_attention_forward/backward (bf16 or f16,
 * head size a multiple of 8 up to 128, 16-byte aligned tensors). Built on
 * first use when gpc_cudnn_attention_prepare was not called. */
gpc_status gpc_cudnn_attention_forward(gpc_tensor *out, gpc_tensor *lse, const gpc_tensor *qkv,
                                       int num_heads);
gpc_status gpc_cudnn_attention_backward(gpc_tensor *dqkv, const gpc_tensor *dout,
                                        const gpc_tensor *qkv, const gpc_tensor *out,
                                        const gpc_tensor *lse, int num_heads);

/* What the cache holds, for tests and gpc bench: plans built (failures not
 * counted) and the bytes of the current GPU's workspace. */
typedef struct {
    int plans;
    size_t workspace_bytes;
} gpc_cudnn_attention_stats;
void gpc_cudnn_attention_get_stats(gpc_cudnn_attention_stats *stats);

#ifdef __cplusplus
}
#endif

#endif /* GPC_CUDA_ATTENTION_CUDNN_H */
