/* testutil_cuda.c: see testutil_cuda.h. */
#include "testutil_cuda.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

/* n floats as dtype's bytes into buf: f32 as they are, int32 converted,
 * bf16 and f16 rounded. */
static void pack_floats(gpc_dtype dtype, const float *host, int64_t n, unsigned char *buf) {
    size_t es = gpc_dtype_size(dtype);
    for (int64_t i = 0; i < n; i++) {
        if (dtype == GPC_F32) {
            memcpy(buf + i * es, &host[i], 4);
        } else if (dtype == GPC_I32) {
            int32_t v = (int32_t)host[i];
            memcpy(buf + i * es, &v, 4);
        } else {
            uint16_t v = dtype == GPC_BF16 ? gpc_f32_to_bf16(host[i]) : gpc_f32_to_f16(host[i]);
            memcpy(buf + i * es, &v, 2);
        }
    }
}

gpc_tensor test_gpu_tensor(gpc_dtype dtype, int ndim, const int64_t *shape, const void *host) {
    gpc_tensor t;
    TEST_OK(gpc_tensor_alloc(&t, dtype, (gpc_device){GPC_DEVICE_CUDA, 0}, ndim, shape));
    int64_t n = gpc_tensor_numel(&t);
    size_t es = gpc_dtype_size(dtype);
    unsigned char *buf = malloc((size_t)n * es + 1);
    if (!host)
        memset(buf, 0xff, (size_t)n * es);
    else if (dtype == GPC_I32)
        memcpy(buf, host, (size_t)n * 4);
    else
        pack_floats(dtype, host, n, buf);
    assert_int_equal(cudaMemcpy(t.data, buf, (size_t)n * es, cudaMemcpyHostToDevice), 0);
    free(buf);
    return t;
}

gpc_tensor test_gpu_1d(gpc_dtype dtype, int64_t d0, const void *host) {
    return test_gpu_tensor(dtype, 1, &d0, host);
}

gpc_tensor test_gpu_2d(gpc_dtype dtype, int64_t d0, int64_t d1, const void *host) {
    const int64_t shape[] = {d0, d1};
    return test_gpu_tensor(dtype, 2, shape, host);
}

void test_gpu_upload(gpc_tensor *t, const float *host, int64_t n) {
    size_t es = gpc_dtype_size(t->dtype);
    unsigned char *buf = malloc((size_t)n * es + 1);
    pack_floats(t->dtype, host, n, buf);
    assert_int_equal(cudaMemcpy(t->data, buf, (size_t)n * es, cudaMemcpyHostToDevice), 0);
    free(buf);
}

int32_t *test_gpu_download_i32(const gpc_tensor *t) {
    assert_int_equal(t->dtype, GPC_I32);
    int64_t n = gpc_tensor_numel(t);
    float *raw = test_gpu_download(t);
    int32_t *out = malloc((size_t)n * sizeof(int32_t) + 4);
    memcpy(out, raw, (size_t)n * sizeof(int32_t));
    free(raw);
    return out;
}

float *test_gpu_download(const gpc_tensor *t) {
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    int64_t n = gpc_tensor_numel(t);
    size_t es = gpc_dtype_size(t->dtype);
    unsigned char *buf = malloc((size_t)n * es + 1);
    float *out = malloc((size_t)n * sizeof(float) + 4);
    assert_int_equal(cudaMemcpy(buf, t->data, (size_t)n * es, cudaMemcpyDeviceToHost), 0);
    for (int64_t i = 0; i < n; i++) {
        if (es == 4) {
            memcpy(&out[i], buf + i * 4, 4);
        } else {
            uint16_t v;
            memcpy(&v, buf + i * 2, 2);
            out[i] = t->dtype == GPC_BF16 ? gpc_bf16_to_f32(v) : gpc_f16_to_f32(v);
        }
    }
    free(buf);
    return out;
}
