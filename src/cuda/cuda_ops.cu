/*
 * cuda_ops.cu: the CUDA backend's table of numeric ops, and the helpers the
 * op families share: selecting the tensor's GPU, the per-GPU scratch buffer
 * and dtype checks. The kernels live one family per file (embedding.cu,
 * layernorm.cu, matmul.cu, gelu.cu, attention.cu (which chooses among
 * attention_mma.cu, attention_simple.cu, attention_sm90.cu and cuDNN's
 * path), crossentropy.cu, adamw.cu, reduce.cu, convert.cu, and the serving
 * ops: paged.cu and sample.cu).
 */
#include "cuda/cuda_common.cuh"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static pthread_mutex_t scratch_lock = PTHREAD_MUTEX_INITIALIZER;
static void *scratch_ptr[GPC_CUDA_MAX_DEVICES];
static size_t scratch_size[GPC_CUDA_MAX_DEVICES];
static int sm_count[GPC_CUDA_MAX_DEVICES];
/* graphs alive (gpc_cuda_scratch_keep), and the buffers outgrown while they
 * were, which those graphs may still read */
#define SCRATCH_RETIRED 64
static int scratch_keepers;
static void *scratch_retired[SCRATCH_RETIRED];
static int scratch_retired_device[SCRATCH_RETIRED];
static int scratch_n_retired;

thread_local cudaStream_t gpc_cuda_capture_stream = 0;

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
    if (scratch_size[d] < bytes && gpc_cuda_capturing()) {
        /* a graph cannot allocate: the eager run before a capture sizes it */
        status = gpc_error(GPC_ERR_INTERNAL,
                           "cuda: an op asked for %.1f MiB of scratch memory while a graph was "
                           "captured (%.1f MiB there); run the step once before capturing it",
                           bytes / 1048576.0, scratch_size[d] / 1048576.0);
    } else if (scratch_size[d] < bytes) {
        /* Grow with headroom so a slightly larger request later does not
         * reallocate again. cudaFree waits for kernels still using the old
         * buffer, which only happens while the step's sizes are first seen. */
        size_t want = bytes + bytes / 4 + 4096;
        if (scratch_ptr[d] && scratch_keepers > 0 && scratch_n_retired == SCRATCH_RETIRED) {
            status = gpc_error(GPC_ERR_NOMEM,
                               "cuda: the scratch buffer grew %d times while CUDA graphs held "
                               "it; turn graphs off (GPC_SERVE_GRAPHS=0)",
                               SCRATCH_RETIRED);
        } else {
            if (scratch_ptr[d] && scratch_keepers > 0) {
                scratch_retired_device[scratch_n_retired] = d;
                scratch_retired[scratch_n_retired++] = scratch_ptr[d];
            } else if (scratch_ptr[d]) {
                cudaFree(scratch_ptr[d]);
            }
            scratch_ptr[d] = NULL;
            scratch_size[d] = 0;
            cudaError_t err = cudaMalloc(&scratch_ptr[d], want);
            if (err != cudaSuccess) {
                cudaGetLastError();
                status = gpc_error(GPC_ERR_NOMEM,
                                   "cuda: no room for %.1f MiB of scratch memory on cuda:%d; "
                                   "lower --batch or free GPU memory",
                                   want / 1048576.0, d);
            } else {
                scratch_size[d] = want;
            }
        }
    }
    *out = scratch_ptr[d];
    pthread_mutex_unlock(&scratch_lock);
    return status;
}

void gpc_cuda_scratch_keep(int delta) {
    pthread_mutex_lock(&scratch_lock);
    scratch_keepers += delta;
    if (scratch_keepers <= 0) {
        scratch_keepers = 0;
        int current = current_device();
        for (int i = 0; i < scratch_n_retired; i++) {
            cudaSetDevice(scratch_retired_device[i]);
            cudaFree(scratch_retired[i]);
        }
        if (scratch_n_retired) cudaSetDevice(current);
        scratch_n_retired = 0;
    }
    pthread_mutex_unlock(&scratch_lock);
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

/* What the runtime was allowed per kernel and GPU (gpc_cuda_allow_shared):
 * the most dynamic shared memory asked so far. */
#define ALLOWED_KNOWN 128
static struct {
    const void *fn;
    int device;
    size_t bytes;
} allowed[ALLOWED_KNOWN];
static int allowed_count;
static pthread_mutex_t allowed_lock = PTHREAD_MUTEX_INITIALIZER;

gpc_status gpc_cuda_allow_shared(const void *fn, size_t bytes, size_t static_bytes,
                                 const char *op) {
    if (bytes + static_bytes <= (48 << 10)) return GPC_OK;
    int d = 0;
    if (cudaGetDevice(&d) != cudaSuccess) {
        cudaGetLastError();
        d = -1; /* not recorded: asked every time */
    }
    pthread_mutex_lock(&allowed_lock);
    int i = 0;
    while (i < allowed_count && (allowed[i].fn != fn || allowed[i].device != d))
        i++;
    int raise = i == allowed_count || allowed[i].bytes < bytes;
    if (raise && i == allowed_count && d >= 0 && allowed_count < ALLOWED_KNOWN) {
        allowed[allowed_count].fn = fn, allowed[allowed_count].device = d;
        allowed[allowed_count].bytes = 0;
        allowed_count++;
    }
    gpc_status status = GPC_OK;
    if (raise) {
        cudaError_t e =
            cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
        if (e != cudaSuccess) {
            cudaGetLastError();
            status = gpc_error(GPC_ERR_DEVICE, "%s: %zu bytes of shared memory refused: %s", op,
                               bytes, cudaGetErrorString(e));
        } else if (i < allowed_count) {
            allowed[i].bytes = bytes;
        }
    }
    pthread_mutex_unlock(&allowed_lock);
    return status;
}

int gpc_cuda_pdl_capable(void) {
    static signed char capable[GPC_CUDA_MAX_DEVICES]; /* 0 unknown, 1 yes, -1 no */
    int d = 0;
    if (cudaGetDevice(&d) != cudaSuccess || d < 0 || d >= GPC_CUDA_MAX_DEVICES) {
        cudaGetLastError();
        return 0;
    }
    if (!capable[d]) {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) != cudaSuccess) {
            cudaGetLastError();
            major = 0;
        }
        capable[d] = major >= 9 ? 1 : -1;
    }
    return capable[d] > 0;
}

gpc_status gpc_cuda_same_dtype(const char *op, const char *name_a, const gpc_tensor *a,
                               const char *name_b, const gpc_tensor *b) {
    if (!a || !b || !a->data || !b->data || a->dtype == b->dtype) return GPC_OK;
    return gpc_error(GPC_ERR_UNSUPPORTED,
                     "%s on the GPU needs '%s' and '%s' of one dtype, not %s and %s: convert one "
                     "with gpc_op_convert",
                     op, name_a, name_b, gpc_dtype_name(a->dtype), gpc_dtype_name(b->dtype));
}

/* ------------------------------------------------------------ profiling
 *
 * With GPC_CUDA_PROFILE=1 in the environment every op is bracketed by a pair
 * of CUDA events on its stream, so the time of each op family inside a real
 * training step can be read without a profiler and without stopping the
 * step: events are resolved in batches when the pool fills, and at report
 * time. Off (the default) it costs one branch per op. */

/* One profile slot per op, numbered in table order. */
#define GPC_CUDA_OP_ID(name, params) GPC_CUDA_OP_##name,
enum { GPC_OPS_LIST(GPC_CUDA_OP_ID) PROFILE_OPS };
#undef GPC_CUDA_OP_ID
#define PROFILE_POOL 8192

#define GPC_CUDA_OP_NAME(name, params) #name,
static const char *const profile_names[PROFILE_OPS] = {GPC_OPS_LIST(GPC_CUDA_OP_NAME)};
#undef GPC_CUDA_OP_NAME

static int profile_enabled = -1;
static cudaEvent_t profile_events[PROFILE_POOL][2];
static int profile_op[PROFILE_POOL];
static int profile_used;
static double profile_ms[PROFILE_OPS];
static long profile_calls[PROFILE_OPS];

static void profile_flush(void) {
    if (profile_used == 0) return;
    cudaEventSynchronize(profile_events[profile_used - 1][1]);
    for (int i = 0; i < profile_used; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, profile_events[i][0], profile_events[i][1]) == cudaSuccess) {
            profile_ms[profile_op[i]] += ms;
            profile_calls[profile_op[i]]++;
        }
    }
    cudaGetLastError();
    profile_used = 0;
}

static int profile_on(void) {
    if (profile_enabled < 0) {
        profile_enabled = gpc_setting_flag("GPC_CUDA_PROFILE");
        if (profile_enabled)
            for (int i = 0; i < PROFILE_POOL; i++)
                if (cudaEventCreate(&profile_events[i][0]) != cudaSuccess ||
                    cudaEventCreate(&profile_events[i][1]) != cudaSuccess) {
                    cudaGetLastError();
                    profile_enabled = 0;
                    break;
                }
    }
    return profile_enabled;
}

template <typename Sig, Sig *F, int ID> struct profiled;
template <typename... A, gpc_status (*F)(A...), int ID> struct profiled<gpc_status(A...), F, ID> {
    static gpc_status run(A... args) {
        /* events recorded into a graph being captured time nothing */
        if (!profile_on() || gpc_cuda_capturing()) return F(args...);
        if (profile_used == PROFILE_POOL) profile_flush();
        int slot = profile_used++;
        profile_op[slot] = ID;
        cudaEventRecord(profile_events[slot][0], gpc_cuda_stream());
        gpc_status status = F(args...);
        cudaEventRecord(profile_events[slot][1], gpc_cuda_stream());
        return status;
    }
};

#define PROFILED(fn, id) profiled<decltype(fn), fn, id>::run

extern "C" void gpc_cuda_profile_reset(void) {
    if (!profile_on()) return;
    profile_flush();
    for (int i = 0; i < PROFILE_OPS; i++)
        profile_ms[i] = 0, profile_calls[i] = 0;
}

extern "C" int gpc_cuda_profile_report(char *buf, size_t size) {
    if (!profile_on() || size == 0) return 0;
    profile_flush();
    double total = 0;
    for (int i = 0; i < PROFILE_OPS; i++)
        total += profile_ms[i];
    size_t at = 0;
    at += snprintf(buf + at, size - at, "%-30s %8s %12s %7s\n", "op", "calls", "ms", "share");
    for (int i = 0; i < PROFILE_OPS && at < size; i++)
        if (profile_calls[i])
            at += snprintf(buf + at, size - at, "%-30s %8ld %12.3f %6.1f%%\n", profile_names[i],
                           profile_calls[i], profile_ms[i],
                           total > 0 ? 100.0 * profile_ms[i] / total : 0.0);
    if (at < size) snprintf(buf + at, size - at, "%-30s %8s %12.3f\n", "total", "", total);
    return 1;
}

/* Positional (C++ has no designated initializers here), in GPC_OPS_LIST's
 * order, which is the struct's order. */
#define GPC_CUDA_ENTRY(name, params) PROFILED(gpc_cuda_##name, GPC_CUDA_OP_##name),
extern "C" const gpc_ops_table gpc_cuda_ops = {GPC_OPS_LIST(GPC_CUDA_ENTRY)};
#undef GPC_CUDA_ENTRY
