/*
 * bench_cuda_stub.c: the GPU measurements of bench_cuda.h in a gpc built
 * without CUDA. Each answers GPC_ERR_UNSUPPORTED with the reason, so `gpc
 * bench --device cuda` and `gpc doctor` say plainly what is missing. NCCL's
 * version is still read, through dlopen, since that needs no CUDA build.
 */
#ifndef GPC_HAVE_CUDA

#include "tools/bench_cuda.h"

#include <dlfcn.h>

#define NO_CUDA                                                                                    \
    "this gpc was built without CUDA: install the CUDA toolkit (nvcc) and rebuild to measure "     \
    "the GPU"

int gpc_bench_cuda_device_count(void) {
    gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
    return 0;
}

gpc_status gpc_bench_cuda_device_info(int device, char *name, size_t name_size, int *cc_major,
                                      int *cc_minor, size_t *total_bytes) {
    (void)device, (void)name, (void)name_size, (void)cc_major, (void)cc_minor, (void)total_bytes;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status gpc_bench_cuda_versions(int *driver, int *runtime) {
    *driver = 0;
    *runtime = 0;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status gpc_bench_cudnn_version(int *built, long *version) {
    *built = 0;
    *version = 0;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

const char *gpc_gemm_kernel_name(gpc_gemm_kernel kernel) {
    static const char *names[] = {"naive", "tiled", "cublas"};
    return (unsigned)kernel < 3 ? names[kernel] : "?";
}

const char *gpc_gemm_precision_name(gpc_gemm_precision precision) {
    static const char *names[] = {"f32", "tf32", "bf16", "f16", "fp8"};
    return (unsigned)precision < 5 ? names[precision] : "?";
}

gpc_status gpc_bench_cuda_gemm(int device, gpc_gemm_kernel kernel, gpc_gemm_precision precision,
                               int n, int reps, double *seconds, double *max_error) {
    (void)device, (void)kernel, (void)precision, (void)n, (void)reps, (void)seconds,
        (void)max_error;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

const char *gpc_copy_memory_name(gpc_copy_memory memory) {
    static const char *names[] = {"pageable", "pinned", "managed", "managed+prefetch"};
    return (unsigned)memory < 4 ? names[memory] : "?";
}

const char *gpc_copy_direction_name(gpc_copy_direction direction) {
    static const char *names[] = {"h2d", "d2h", "d2d"};
    return (unsigned)direction < 3 ? names[direction] : "?";
}

gpc_status gpc_bench_cuda_copy(int device, gpc_copy_memory memory, gpc_copy_direction direction,
                               size_t bytes, int reps, double *seconds) {
    (void)device, (void)memory, (void)direction, (void)bytes, (void)reps, (void)seconds;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status gpc_bench_cuda_overlap(int device, int streams, size_t bytes, int chunks, int reps,
                                  double *seconds, double *max_error) {
    (void)device, (void)streams, (void)bytes, (void)chunks, (void)reps, (void)seconds;
    (void)max_error;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

gpc_status gpc_bench_nccl_version(int *version) {
    void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "NCCL is not installed (libnccl.so.2 not found): install libnccl2 for "
                         "multi-GPU training");
    int (*get)(int *) = (int (*)(int *))dlsym(lib, "ncclGetVersion");
    gpc_status status = GPC_OK;
    if (!get || get(version) != 0)
        status = gpc_error(GPC_ERR_DEVICE, "libnccl.so.2 loaded but ncclGetVersion failed");
    dlclose(lib);
    return status;
}

gpc_status gpc_bench_cuda_allreduce(int gpus, size_t bytes, int reps, double *seconds) {
    (void)gpus, (void)bytes, (void)reps, (void)seconds;
    return gpc_error(GPC_ERR_UNSUPPORTED, NO_CUDA);
}

#else
/* ISO C wants a translation unit to declare something. */
typedef int gpc_bench_cuda_stub_unused;
#endif
