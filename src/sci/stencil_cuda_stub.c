/*
 * stencil_cuda_stub.c: the GPU half of the stencil (stencil_cuda.h) in a
 * gpc built without CUDA: every call says so and what to do, so
 * `gpc stencil --device cuda` fails with a clear line.
 */
#ifndef GPC_HAVE_CUDA

#include "sci/stencil_cuda.h"

#define NO_CUDA                                                                                    \
    "stencil: this gpc was built without CUDA: install the CUDA toolkit (nvcc) and rebuild, or "   \
    "run with --device cpu"

double gpc_stencil_cuda_bytes(const gpc_stencil_cuda_config *c) {
    (void)c;
    return 0;
}

gpc_status gpc_stencil_cuda_check(int device, double bytes, const char *what) {
    (void)device, (void)bytes, (void)what;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status gpc_stencil_cuda_create(gpc_stencil_cuda **out, const gpc_stencil_cuda_config *c) {
    (void)c;
    *out = NULL;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

void gpc_stencil_cuda_free(gpc_stencil_cuda *g) {
    (void)g;
}

void gpc_stencil_cuda_host_halos(const gpc_stencil_cuda *g, gpc_stencil_cuda_halos *out) {
    (void)g;
    out->send_lo = out->send_hi = out->recv_lo = out->recv_hi = NULL;
    out->bytes = 0;
}

gpc_status gpc_stencil_cuda_step_begin(gpc_stencil_cuda *g) {
    (void)g;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status gpc_stencil_cuda_step_end(gpc_stencil_cuda *g) {
    (void)g;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

int gpc_stencil_cuda_pairs(const gpc_stencil_cuda *g) {
    (void)g;
    return 0;
}

gpc_status gpc_stencil_cuda_step_pair(gpc_stencil_cuda *g) {
    (void)g;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status gpc_stencil_cuda_sync(gpc_stencil_cuda *g) {
    (void)g;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status gpc_stencil_cuda_plane(const gpc_stencil_cuda *g, int zl, double *out) {
    (void)g, (void)zl, (void)out;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status gpc_stencil_cuda_at(const gpc_stencil_cuda *g, int x, int y, int zl, double *out) {
    (void)g, (void)x, (void)y, (void)zl, (void)out;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status gpc_stencil_cuda_error(const gpc_stencil_cuda *g, double scale, double *err,
                                  double *big) {
    (void)g, (void)scale, (void)err, (void)big;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status gpc_stencil_cuda_checksum(const gpc_stencil_cuda *g, uint64_t *sum) {
    (void)g, (void)sum;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status gpc_stencil_cuda_copy_rate(int device, size_t bytes, double *bytes_per_second) {
    (void)device, (void)bytes;
    *bytes_per_second = 0;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

#endif
