/*
 * trace.c: NVTX ranges behind gpc/trace.h. A CUDA build uses NVTX3, which
 * is header-only and finds the profiler's injection library itself (Nsight
 * sets NVTX_INJECTION64_PATH); other builds look for the old shared
 * libnvToolsExt.so.1 once and fall back to doing nothing.
 */
#include "gpc/trace.h"

#if defined(GPC_HAVE_CUDA) && defined(__has_include)
#if __has_include(<nvtx3/nvToolsExt.h>)
#define GPC_TRACE_NVTX3 1
#endif
#endif

#ifdef GPC_TRACE_NVTX3
#include <nvtx3/nvToolsExt.h>

void gpc_trace_push(const char *name) {
    nvtxRangePushA(name);
}

void gpc_trace_pop(void) {
    nvtxRangePop();
}

int gpc_trace_available(void) {
    return 1;
}

#else
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>

static int (*trace_push_fn)(const char *);
static int (*trace_pop_fn)(void);
static pthread_once_t trace_once = PTHREAD_ONCE_INIT;

static void trace_load(void) {
    void *lib = dlopen("libnvToolsExt.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    trace_push_fn = (int (*)(const char *))dlsym(lib, "nvtxRangePushA");
    trace_pop_fn = (int (*)(void))dlsym(lib, "nvtxRangePop");
    if (!trace_push_fn || !trace_pop_fn) trace_push_fn = NULL, trace_pop_fn = NULL;
}

void gpc_trace_push(const char *name) {
    pthread_once(&trace_once, trace_load);
    if (trace_push_fn) trace_push_fn(name);
}

void gpc_trace_pop(void) {
    pthread_once(&trace_once, trace_load);
    if (trace_pop_fn) trace_pop_fn();
}

int gpc_trace_available(void) {
    pthread_once(&trace_once, trace_load);
    return trace_push_fn != NULL;
}
#endif
