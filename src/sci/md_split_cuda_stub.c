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

gpc_status md_split_cuda_create(md_split_cuda **out, int device, const md_split_cuda_slabs *slabs,
                                double atoms, int64_t row_cap, double rc2, double limit2) {
    (void)device, (void)slabs, (void)atoms, (void)row_cap, (void)rc2, (void)limit2;
    *out = NULL;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

void md_split_cuda_free(md_split_cuda *g) {
    (void)g;
}

gpc_status md_split_cuda_upload(md_split_cuda *g, int64_t n, const double *x, const double *v,
                                const int64_t *id) {
    (void)g, (void)n, (void)x, (void)v, (void)id;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status md_split_cuda_wrap(md_split_cuda *g, int *bad, int *stray) {
    (void)g, (void)bad, (void)stray;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status md_split_cuda_leave(md_split_cuda *g, int side, const double **out, int64_t *count) {
    (void)g, (void)side, (void)out, (void)count;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status md_split_cuda_arrive(md_split_cuda *g, const double *in, int64_t count) {
    (void)g, (void)in, (void)count;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status md_split_cuda_choose(md_split_cuda *g, int64_t sends[2]) {
    (void)g, (void)sends;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status md_split_cuda_pack(md_split_cuda *g, const double *out[2]) {
    (void)g, (void)out;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status md_split_cuda_ghost_room(md_split_cuda *g, int side, int64_t values, double **in) {
    (void)g, (void)side, (void)values, (void)in;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status md_split_cuda_ghosts(md_split_cuda *g, int side, int64_t count) {
    (void)g, (void)side, (void)count;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status md_split_cuda_forward_peers(md_split_cuda *g, struct gpc_dist *peers, const int to[2],
                                       const int from[2], const int64_t *arriving) {
    (void)g, (void)peers, (void)to, (void)from, (void)arriving;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status md_split_cuda_list(md_split_cuda *g, int64_t *pairs) {
    (void)g, (void)pairs;
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

gpc_status md_split_cuda_v2(md_split_cuda *g, double *v2) {
    (void)g, (void)v2;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

int64_t md_split_cuda_owned(const md_split_cuda *g) {
    (void)g;
    return 0;
}

gpc_status md_split_cuda_download(md_split_cuda *g, double *x, double *v, int64_t *id) {
    (void)g, (void)x, (void)v, (void)id;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

const char *md_split_cuda_device_name(const md_split_cuda *g) {
    (void)g;
    return "";
}

#else
typedef int md_split_cuda_stub_unused; /* an empty file is not ISO C */
#endif
