/*
 * md_cuda_stub.c: the GPU side of `gpc md` (md_cuda.h) in a gpc built
 * without CUDA. Each call answers GPC_ERR_UNSUPPORTED with the reason, so
 * `gpc md --device cuda` says plainly what is missing. CMake leaves this
 * file out of a CUDA build, where md_cuda.cu defines the same functions.
 */
#ifndef GPC_HAVE_CUDA

#include "sci/md_cuda.h"

#define NO_CUDA                                                                                    \
    "md: this gpc was built without CUDA: install the CUDA toolkit (nvcc) and rebuild, or run "    \
    "with --device cpu"

double gpc_md_cuda_bytes(const gpc_md_cuda_config *config) {
    (void)config;
    return 0;
}

gpc_status gpc_md_cuda_check(int device, const gpc_md_cuda_config *config) {
    (void)device, (void)config;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status gpc_md_cuda_create(gpc_md_cuda **out, int device, const gpc_md_cuda_config *config,
                              const double *x, const double *v, const int64_t *id) {
    (void)device, (void)config, (void)x, (void)v, (void)id;
    *out = NULL;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

void gpc_md_cuda_free(gpc_md_cuda *gpu) {
    (void)gpu;
}

gpc_status gpc_md_cuda_run(gpc_md_cuda *gpu, int steps, int64_t first_step) {
    (void)gpu, (void)steps, (void)first_step;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status gpc_md_cuda_compute(gpc_md_cuda *gpu, const double *x, const double *v) {
    (void)gpu, (void)x, (void)v;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status gpc_md_cuda_sums_get(gpc_md_cuda *gpu, gpc_md_cuda_sums *out) {
    (void)gpu;
    out->potential = out->virial = out->v2 = 0;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status gpc_md_cuda_download(gpc_md_cuda *gpu, double *x, double *v, double *f, int64_t *id) {
    (void)gpu, (void)x, (void)v, (void)f, (void)id;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status gpc_md_cuda_neighbors(gpc_md_cuda *gpu, int32_t *counts, int32_t *rows) {
    (void)gpu, (void)counts, (void)rows;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

int64_t gpc_md_cuda_builds(const gpc_md_cuda *gpu) {
    (void)gpu;
    return 0;
}

int64_t gpc_md_cuda_dangerous(const gpc_md_cuda *gpu) {
    (void)gpu;
    return 0;
}

int64_t gpc_md_cuda_pairs(gpc_md_cuda *gpu) {
    (void)gpu;
    return 0;
}

int gpc_md_cuda_phase_ms(const gpc_md_cuda *gpu, double *ms) {
    (void)gpu, (void)ms;
    return 0;
}

const char *gpc_md_cuda_device_name(const gpc_md_cuda *gpu) {
    (void)gpu;
    return "none";
}

#else
/* ISO C wants a translation unit to declare something. */
typedef int gpc_md_cuda_stub_unused;
#endif
