/*
 * attention_no_cudnn.cu: the cuDNN attention API (attention_cudnn.h) of a
 * gpc built without cudnn.h. The path exists in name only: asking for it
 * answers an error that says how to build it in, and auto never takes it.
 * CMakeLists.txt builds this file exactly when the cuDNN files are left out.
 */
#include "cuda/attention_cudnn.h"

#include <string.h>

#ifdef GPC_HAVE_CUDNN
#error "attention_no_cudnn.cu is for builds without cuDNN; CMakeLists.txt should leave it out"
#endif

/* Built without cudnn.h: the path exists in name only. */
#define ATT_NO_CUDNN                                                                               \
    gpc_error(GPC_ERR_UNSUPPORTED,                                                                 \
              "this gpc was built without cuDNN (cudnn.h was not found at build time; point "      \
              "CUDNN_INCLUDE_DIR at it and rebuild), so GPC_ATTENTION=cudnn cannot run; use "      \
              "GPC_ATTENTION=gpc")
extern "C" int gpc_cudnn_attention_built(void) {
    return 0;
}
extern "C" gpc_status gpc_cudnn_attention_load(void) {
    return ATT_NO_CUDNN;
}
extern "C" long gpc_cudnn_attention_version(void) {
    return 0;
}
extern "C" gpc_status gpc_cudnn_attention_prepare(int, int, int, int, gpc_dtype, int) {
    return ATT_NO_CUDNN;
}
extern "C" int gpc_cudnn_attention_ready(int, int, int, int, gpc_dtype, int) {
    return 0;
}
extern "C" gpc_status gpc_cudnn_attention_forward(gpc_tensor *, gpc_tensor *, const gpc_tensor *,
                                                  int) {
    return ATT_NO_CUDNN;
}
extern "C" gpc_status gpc_cudnn_attention_backward(gpc_tensor *, const gpc_tensor *,
                                                   const gpc_tensor *, const gpc_tensor *,
                                                   const gpc_tensor *, int) {
    return ATT_NO_CUDNN;
}
extern "C" void gpc_cudnn_attention_get_stats(gpc_cudnn_attention_stats *stats) {
    memset(stats, 0, sizeof *stats);
}
