/*
 * md_split_cuda_stub.c: the GPU side of a split `gpc md` run
 * (md_split_cuda.h) in a gpc built without CUDA. Each call answers
 * GPC_ERR_UNSUPPORTED with the reason. CMake leaves this file out of a CUDA
 * build, where md_split_cuda.cu defines the same functions.
 */
#ifndef GPC_HAVE_CUDA

#include "sci/md_split_cuda.h"

#define NO_CUDA                                                                                    \
    "md: this gpc was built without CUDA: install the CUDA toolkit (nvcc) and rebuild, or run "    \
    "with --device cpu"

gpc_status md_split_cuda_create(md_split_cuda **out, int device, double atoms, int64_t row_cap,
                                double box, double rc2, double reach, double limit2) {
    (void)device, (void)atoms, (void)row_cap, (void)box, (void)rc2, (void)reach, (void)limit2;
    *out = NULL;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

void md_split_cuda_free(md_split_cuda *g) {
    (void)g;
}

gpc_status md_split_cuda_build(md_split_cuda *g, const md_split_cuda_load *load, int64_t *pairs) {
    (void)g, (void)load, (void)pairs;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status md_split_cuda_forces(md_split_cuda *g, double half_dt, int thermo, double *potential,
                                double *virial) {
    (void)g, (void)half_dt, (void)thermo, (void)potential, (void)virial;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status md_split_cuda_drift(md_split_cuda *g, double half_dt, double dt, int moved[2]) {
    (void)g, (void)half_dt, (void)dt, (void)moved;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status md_split_cuda_pack(md_split_cuda *g, int side, double *out) {
    (void)g, (void)side, (void)out;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status md_split_cuda_ghosts(md_split_cuda *g, int side, const double *in) {
    (void)g, (void)side, (void)in;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status md_split_cuda_v2(md_split_cuda *g, double *v2) {
    (void)g, (void)v2;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status md_split_cuda_download(md_split_cuda *g, double *x, double *v) {
    (void)g, (void)x, (void)v;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

const char *md_split_cuda_device_name(const md_split_cuda *g) {
    (void)g;
    return "";
}

#else
typedef int md_split_cuda_stub_unused; /* an empty file is not ISO C */
#endif
