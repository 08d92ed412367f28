/*
 * cuda_ops.cu: the CUDA backend's table of numeric ops, and the helpers the
 * op families share: selecting the tensor's GPU, the per-GPU scratch buffer
 * and dtype checks. The kernels live one family per file (embedding.cu,
 * layernorm.cu, matmul.cu, gelu.cu, attention.cu, crossentropy.cu,
 * adamw.cu, reduce.cu, convert.cu).
 */
#include "cuda/cuda_common.cuh"

#include <pthread.h>

#define GPC_CUDA_MAX_DEVICES 64

static pthread_mutex_t scratch_lock = PTHREAD_MUTEX_INITIALIZER;
static void *scratch_ptr[GPC_CUDA_MAX_DEVICES];
static size_t scratch_size[GPC_CUDA_MAX_DEVICES];
static int sm_count[GPC_CUDA_MAX_DEVICES];

gpc_status gpc_cuda_enter(const gpc_tensor *t) {
    int current = -1;
    GPC_CUDA_CHECK(cudaGetDevice(&current));
    if (t && t->device.index != current) GPC_CUDA_CHECK(cudaSetDevice(t->device.index));
    return GPC_OK;
}

static int current_device(void) {
    int d = 0;
    if (cudaGetDevice(&d) != cudaSuccess || d < 0 || d >= GPC_CUDA_MAX_DEVICES) d = 0;
    return d;
}

gpc_status gpc_cuda_scratch(size_t bytes, void **out) {
    int d = current_device();
    gpc_status status = GPC_OK;
    pthread_mutex_lock(&scratch_lock);
    if (scratch_size[d] < bytes) {
        /* Grow with headroom so a slightly larger request later does not
         * reallocate again. cudaFree waits for kernels still using the old
         * buffer, which only happens while the step's sizes are first seen. */
        size_t want = bytes + bytes / 4 + 4096;
        if (scratch_ptr[d]) cudaFree(scratch_ptr[d]);
        scratch_ptr[d] = NULL;
        scratch_size[d] = 0;
        cudaError_t err = cudaMalloc(&scratch_ptr[d], want);
        if (err != cudaSuccess) {
            cudaGetLastError();
            status = gpc_error(GPC_ERR_NOMEM,
                               "cuda: no room for %.1f MiB of scratch memory on cuda:%d; lower "
                               "--batch or free GPU memory",
                               want / 1048576.0, d);
        } else {
            scratch_size[d] = want;
        }
    }
    *out = scratch_ptr[d];
    pthread_mutex_unlock(&scratch_lock);
    return status;
}

int gpc_cuda_sm_count(void) {
    int d = current_device();
    if (!sm_count[d]) {
        int n = 0;
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, d) != cudaSuccess || n < 1)
            n = 1;
        sm_count[d] = n;
    }
    return sm_count[d];
}

gpc_status gpc_cuda_same_dtype(const char *op, const char *name_a, const gpc_tensor *a,
                               const char *name_b, const gpc_tensor *b) {
    if (!a || !b || !a->data || !b->data || a->dtype == b->dtype) return GPC_OK;
    return gpc_error(GPC_ERR_UNSUPPORTED,
                     "%s on the GPU needs '%s' and '%s' of one dtype, not %s and %s: convert one "
                     "with gpc_op_convert",
                     op, name_a, name_b, gpc_dtype_name(a->dtype), gpc_dtype_name(b->dtype));
}

extern "C" const gpc_ops_table gpc_cuda_ops = {
    gpc_cuda_embedding_forward,
    gpc_cuda_embedding_backward,
    gpc_cuda_layernorm_forward,
    gpc_cuda_layernorm_backward,
    gpc_cuda_residual_layernorm_forward,
    gpc_cuda_matmul_forward,
    gpc_cuda_matmul_backward,
    gpc_cuda_gelu_forward,
    gpc_cuda_gelu_backward,
    gpc_cuda_residual_forward,
    gpc_cuda_attention_forward,
    gpc_cuda_attention_backward,
    gpc_cuda_crossentropy_forward_backward,
    gpc_cuda_sum_squares,
    gpc_cuda_adamw,
    gpc_cuda_convert,
    gpc_cuda_scale,
};
