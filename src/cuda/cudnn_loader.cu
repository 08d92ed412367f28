/*
 * cudnn_loader.cu: opens libcudnn with dlopen("libcudnn.so.9") on first use
 * and looks up only the dozen functions cudnn_loader.cuh lists, so the
 * binary needs no cuDNN to start and a missing or wrong library is an
 * error that says what to install. Every cuDNN failure becomes a gpc_error
 * carrying cudnnGetErrorString and cudnnGetLastErrorString; with
 * CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr cuDNN also explains why it
 * rejects a graph.
 */
#include "cuda/cudnn_loader.cuh"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

gpc_cudnn_library gpc_cudnn;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_failure[512]; /* empty when the library loaded */

static void load_library(void) {
    const char *names[] = {"libcudnn.so.9", "libcudnn.so"};
    char first_error[256] = "";
    for (int i = 0; i < 2 && !gpc_cudnn.lib; i++) {
        gpc_cudnn.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!gpc_cudnn.lib && i == 0) {
            const char *e = dlerror();
            snprintf(first_error, sizeof first_error, "%s", e ? e : "not found");
        }
    }
    if (!gpc_cudnn.lib) {
        snprintf(load_failure, sizeof load_failure,
                 "cuDNN is not installed here (dlopen libcudnn.so.9: %s); install cuDNN 9 "
                 "(Debian/Ubuntu: libcudnn9-cuda-12 or -13) or add its folder to "
                 "LD_LIBRARY_PATH, or use GPC_ATTENTION=gpc",
                 first_error);
        return;
    }
#define CUDNN_ATT_SYM(field, name)                                                                 \
    gpc_cudnn.field = (decltype(gpc_cudnn.field))dlsym(gpc_cudnn.lib, #name);                      \
    if (!gpc_cudnn.field) {                                                                        \
        snprintf(load_failure, sizeof load_failure,                                                \
                 "the cuDNN library found lacks %s (not cuDNN 9?); install cuDNN 9 or use "        \
                 "GPC_ATTENTION=gpc",                                                              \
                 #name);                                                                           \
        return;                                                                                    \
    }
    CUDNN_ATT_SYM(GetVersion, cudnnGetVersion);
    CUDNN_ATT_SYM(GetErrorString, cudnnGetErrorString);
    CUDNN_ATT_SYM(GetLastErrorString, cudnnGetLastErrorString);
    CUDNN_ATT_SYM(Create, cudnnCreate);
    CUDNN_ATT_SYM(SetStream, cudnnSetStream);
    CUDNN_ATT_SYM(CreateDescriptor, cudnnBackendCreateDescriptor);
    CUDNN_ATT_SYM(DestroyDescriptor, cudnnBackendDestroyDescriptor);
    CUDNN_ATT_SYM(SetAttribute, cudnnBackendSetAttribute);
    CUDNN_ATT_SYM(GetAttribute, cudnnBackendGetAttribute);
    CUDNN_ATT_SYM(Finalize, cudnnBackendFinalize);
    CUDNN_ATT_SYM(Execute, cudnnBackendExecute);
#undef CUDNN_ATT_SYM
    long version = (long)gpc_cudnn.GetVersion();
    if (version / 10000 != CUDNN_MAJOR) {
        snprintf(load_failure, sizeof load_failure,
                 "the cuDNN library found is version %ld.%ld; gpc was built for cuDNN %d; "
                 "install cuDNN %d or use GPC_ATTENTION=gpc",
                 version / 10000, version / 100 % 100, CUDNN_MAJOR, CUDNN_MAJOR);
        return;
    }
    gpc_cudnn.version = version;
}

gpc_status gpc_cudnn_open(void) {
    pthread_once(&load_once, load_library);
    if (load_failure[0]) return gpc_error(GPC_ERR_UNSUPPORTED, "%s", load_failure);
    return GPC_OK;
}

gpc_status gpc_cudnn_failure(cudnnStatus_t status, const char *fmt, ...) {
    char what[256], last[512] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    gpc_cudnn.GetLastErrorString(last, sizeof last);
    int category = (int)status / 1000 * 1000;
    gpc_status code = category == CUDNN_STATUS_NOT_SUPPORTED ? GPC_ERR_UNSUPPORTED
                      : status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
                              status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED
                          ? GPC_ERR_NOMEM
                          : GPC_ERR_DEVICE;
    return gpc_error(code, "cuDNN attention: %s: %s%s%s", what, gpc_cudnn.GetErrorString(status),
                     last[0] ? "; cuDNN says: " : "", last);
}
