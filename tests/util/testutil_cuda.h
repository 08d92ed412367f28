/*
 * testutil_cuda.h: helpers shared by the GPU tests (tests/gpu/): tensors on
 * cuda:0 filled from host values, and a GPU tensor's values read back as
 * floats. Built and linked only when gpc is built with CUDA.
 */
#ifndef GPC_TESTUTIL_CUDA_H
#define GPC_TESTUTIL_CUDA_H

#include "testutil.h"

/* A tensor of dtype on cuda:0 holding host's values: floats (stored in
 * dtype, so bf16 and f16 round them), or int32 values for GPC_I32. A NULL
 * host fills every byte with 0xff, NaN in f32, bf16 and f16, so that an
 * output element a kernel forgets to write fails its comparison. */
gpc_tensor test_gpu_tensor(gpc_dtype dtype, int ndim, const int64_t *shape, const void *host);
gpc_tensor test_gpu_1d(gpc_dtype dtype, int64_t d0, const void *host);
gpc_tensor test_gpu_2d(gpc_dtype dtype, int64_t d0, int64_t d1, const void *host);

/* Writes n floats from host into the GPU tensor t in its dtype (GPC_I32:
 * each float converted to an integer). */
void test_gpu_upload(gpc_tensor *t, const float *host, int64_t n);

/* Waits for the device, then returns the GPU tensor's values as floats,
 * malloc'd; for GPC_I32 the buffer holds the int32 values as they are. */
float *test_gpu_download(const gpc_tensor *t);

/* The same for a GPC_I32 tensor, as int32 values, malloc'd. */
int32_t *test_gpu_download_i32(const gpc_tensor *t);

#endif /* GPC_TESTUTIL_CUDA_H */
