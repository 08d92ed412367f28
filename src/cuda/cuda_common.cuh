/*
 * cuda_common.cuh: what every CUDA file of gpc shares: the check macro that
 * turns a CUDA error into a gpc_status with file and line, the element types
 * (f32, bf16, f16) and their conversions, the dtype dispatch used by every
 * op, warp and block reductions, the per-device scratch buffer, and the
 * declarations of each op family's entry points gathered in cuda_ops.cu.
 *
 * Kernels are templates over the element type of their large tensors
 * (activations) only; small tensors such as layernorm weights or parameter
 * gradients go through gpc_cuda_any, a pointer with a run-time dtype, so one
 * kernel serves every mix the model uses without a template per combination
 * (which would multiply compile time, which CI pays on two cores).
 */
#ifndef GPC_CUDA_COMMON_CUH
#define GPC_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "gpc/settings.h"
#include "ops/ops_backend.h"
}

#define GPC_CUDA_CHECK(call)                                                                       \
    do {                                                                                           \
        cudaError_t gpc_cuda_err_ = (call);                                                        \
        if (gpc_cuda_err_ != cudaSuccess)                                                          \
            return gpc_error(gpc_cuda_err_ == cudaErrorMemoryAllocation ? GPC_ERR_NOMEM            \
                                                                        : GPC_ERR_DEVICE,          \
                             "CUDA error at %s:%d: %s (%s)", __FILE__, __LINE__,                   \
                             cudaGetErrorString(gpc_cuda_err_), #call);                            \
    } while (0)

/* Checks the launch of the kernel just queued. */
#define GPC_CUDA_CHECK_LAUNCH() GPC_CUDA_CHECK(cudaGetLastError())

/* A cuBLASLt call in a function that cleans up at a `done:` label: on
 * failure, `status` (a gpc_status of the caller's) gets the error, naming the
 * call, and control goes to done. For files that include cublasLt.h. */
#define GPC_LT_CHECK(call)                                                                         \
    do {                                                                                           \
        cublasStatus_t lt_status_ = (call);                                                        \
        if (lt_status_ != CUBLAS_STATUS_SUCCESS) {                                                 \
            status = gpc_error(GPC_ERR_DEVICE, "cuBLASLt error %d at %s:%d (%s)", (int)lt_status_, \
                               __FILE__, __LINE__, #call);                                         \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

extern "C" const gpc_ops_table gpc_cuda_ops;

/* ------------------------------------------------------------ element types */

typedef __nv_bfloat16 gpc_bf16_t;
typedef __half gpc_f16_t;

__device__ __forceinline__ float gpc_to_f32(float x) {
    return x;
}
__device__ __forceinline__ float gpc_to_f32(gpc_bf16_t x) {
    return __bfloat162float(x);
}
__device__ __forceinline__ float gpc_to_f32(gpc_f16_t x) {
    return __half2float(x);
}

template <typename T> __device__ __forceinline__ T gpc_from_f32(float x);
template <> __device__ __forceinline__ float gpc_from_f32<float>(float x) {
    return x;
}
template <> __device__ __forceinline__ gpc_bf16_t gpc_from_f32<gpc_bf16_t>(float x) {
    return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ gpc_f16_t gpc_from_f32<gpc_f16_t>(float x) {
    return __float2half_rn(x);
}

/* A tensor pointer whose dtype is known only at run time: for small tensors
 * (weights of a norm, gradients of parameters) where a branch per element
 * costs nothing next to the memory traffic of the activations. */
struct gpc_cuda_any {
    void *ptr;
    int dtype; /* gpc_dtype: GPC_F32, GPC_BF16 or GPC_F16 */
};

static inline gpc_cuda_any gpc_cuda_any_of(const gpc_tensor *t) {
    gpc_cuda_any a;
    a.ptr = t ? t->data : NULL;
    a.dtype = t ? (int)t->dtype : (int)GPC_F32;
    return a;
}

__device__ __forceinline__ float gpc_any_load(gpc_cuda_any a, int64_t i) {
    if (a.dtype == GPC_BF16) return __bfloat162float(((const gpc_bf16_t *)a.ptr)[i]);
    if (a.dtype == GPC_F16) return __half2float(((const gpc_f16_t *)a.ptr)[i]);
    return ((const float *)a.ptr)[i];
}

__device__ __forceinline__ void gpc_any_store(gpc_cuda_any a, int64_t i, float v) {
    if (a.dtype == GPC_BF16)
        ((gpc_bf16_t *)a.ptr)[i] = __float2bfloat16_rn(v);
    else if (a.dtype == GPC_F16)
        ((gpc_f16_t *)a.ptr)[i] = __float2half_rn(v);
    else
        ((float *)a.ptr)[i] = v;
}

/* Runs BODY with ELEM typedef'd to the C type of a float dtype. Anything else
 * was refused by ops.c, so the default case is an internal error. */
#define GPC_CUDA_DISPATCH(dtype, ELEM, ...)                                                        \
    switch (dtype) {                                                                               \
    case GPC_F32: {                                                                                \
        typedef float ELEM;                                                                        \
        __VA_ARGS__;                                                                               \
    } break;                                                                                       \
    case GPC_BF16: {                                                                               \
        typedef gpc_bf16_t ELEM;                                                                   \
        __VA_ARGS__;                                                                               \
    } break;                                                                                       \
    case GPC_F16: {                                                                                \
        typedef gpc_f16_t ELEM;                                                                    \
        __VA_ARGS__;                                                                               \
    } break;                                                                                       \
    default:                                                                                       \
        return gpc_error(GPC_ERR_INTERNAL, "cuda: dtype %s reached a float kernel",                \
                         gpc_dtype_name((gpc_dtype)(dtype)));                                      \
    }

/* 16 bytes of elements, for loads and stores of one instruction each. */
template <typename T> struct alignas(16) gpc_pack {
    static const int n = 16 / sizeof(T);
    T v[16 / sizeof(T)];
};

/* PER elements at p (1, or gpc_pack<T>::n as one 16-byte load) into f32. */
template <int PER, typename T> __device__ __forceinline__ void gpc_load_f32(float *x, const T *p) {
    if (PER == 1) {
        x[0] = gpc_to_f32(p[0]);
    } else {
        gpc_pack<T> v = *(const gpc_pack<T> *)p;
#pragma unroll
        for (int k = 0; k < gpc_pack<T>::n; k++)
            x[k] = gpc_to_f32(v.v[k]);
    }
}

/* The reverse: PER f32 values rounded to T and stored at p. */
template <int PER, typename T> __device__ __forceinline__ void gpc_store_f32(T *p, const float *x) {
    if (PER == 1) {
        p[0] = gpc_from_f32<T>(x[0]);
    } else {
        gpc_pack<T> v;
#pragma unroll
        for (int k = 0; k < gpc_pack<T>::n; k++)
            v.v[k] = gpc_from_f32<T>(x[k]);
        *(gpc_pack<T> *)p = v;
    }
}

/* A switch of the table of settings (gpc/settings.h, which holds its
 * default), read at the first call only, since kernels ask at every launch:
 * *cached starts at -1 and keeps the answer. */
static inline int gpc_cuda_setting_flag(const char *name, int *cached) {
    if (*cached < 0) *cached = gpc_setting_flag(name);
    return *cached;
}

static inline int gpc_cuda_aligned16(const void *p) {
    return ((uintptr_t)p & 15) == 0;
}

/* GELU, tanh approximation (GPT-2's). tanh through one exponential: gpc
 * builds with --use_fast_math, under which tanhf may become the hardware's
 * tanh.approx (about 2^-11 relative error), too coarse for the f32 path's
 * 1e-5. 1 - 2/(e^{2u}+1) is exact to a few ulps away from 0 and to about
 * 1e-7 absolute near it; it saturates correctly (e^{2u} = inf gives 1, 0
 * gives -1). */
#define GPC_GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
__device__ __forceinline__ float gpc_gelu_tanh(float u) {
    return 1.0f - 2.0f / (__expf(2.0f * u) + 1.0f);
}

__device__ __forceinline__ float gpc_gelu(float x) {
    float cube = 0.044715f * x * x * x;
    return 0.5f * x * (1.0f + gpc_gelu_tanh(GPC_GELU_SCALE * (x + cube)));
}

/* --------------------------------------------------------------- reductions */

__device__ __forceinline__ float gpc_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float gpc_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block; every thread gets the result. shared must hold 32
 * floats; blockDim.x a multiple of 32. */
__device__ __forceinline__ float gpc_block_sum(float v, float *shared) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = gpc_warp_sum(v);
    __syncthreads(); /* shared may still be read by a previous call */
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < warps ? shared[lane] : 0.0f;
    return gpc_warp_sum(v);
}

/* Column sums of partial sums: the sum over p < parts of
 * partial[p * width + c] with c = blockIdx.x * 32 + threadIdx.x, for a block
 * of (32, GPC_PARTS_ROWS) threads. Thread y adds the parts y, y + ROWS, ...
 * in order (the loads of a warp are one coalesced 128-byte line, and the
 * ROWS warps keep that many lines in flight), then the ROWS results are added
 * in order in shared memory, so the bits do not depend on scheduling. The
 * sum is returned to the threads with threadIdx.y == 0 (0 elsewhere and for
 * c >= width). Every thread of the block must call it. */
#define GPC_PARTS_ROWS 16
template <int UNROLL = 4>
__device__ __forceinline__ float gpc_parts_column_sum(const float *partial, int parts,
                                                      int64_t width) {
    __shared__ float s[GPC_PARTS_ROWS][33];
    int64_t c = (int64_t)blockIdx.x * 32 + threadIdx.x;
    float v = 0.0f;
    if (c < width) /* unrolled: UNROLL loads in flight, added in the same order */
#pragma unroll UNROLL
        for (int k = threadIdx.y; k < parts; k += GPC_PARTS_ROWS)
            v += partial[(int64_t)k * width + c];
    s[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    float t = 0.0f;
    if (threadIdx.y == 0)
        for (int y = 0; y < GPC_PARTS_ROWS; y++)
            t += s[y][threadIdx.x];
    return t;
}

/* ---------------------------------------------------------- host helpers */

/* The stream a thread's ops are queued on while it captures a graph
 * (cuda_backend.cu, graph_capture_begin), else 0. */
extern thread_local cudaStream_t gpc_cuda_capture_stream;

/* The stream every op is queued on. The default stream, but while the
 * calling thread captures a CUDA graph: the legacy default stream cannot be
 * captured, so the capture runs on a stream of its own, and the graph it
 * makes is then launched on the default stream, in order with everything
 * else. The model runs its step on one stream, and the data loader's
 * copies on their own stream order themselves against it with events. */
static inline cudaStream_t gpc_cuda_stream(void) {
    return gpc_cuda_capture_stream;
}

/* Whether the calling thread is capturing a graph: what may not happen then
 * (allocations, host waits, timing runs) is skipped or refused. */
static inline int gpc_cuda_capturing(void) {
    return gpc_cuda_capture_stream != 0;
}

/* Makes the tensor's GPU current for the calling thread (cheap when it is). */
gpc_status gpc_cuda_enter(const gpc_tensor *t);

/* A grow-only scratch buffer per GPU for the partial sums of reductions and
 * similar short-lived data. It is sized by the first step and then reused,
 * so the training step does not allocate after its first micro-step. Ops
 * queue on one stream, so an op may use the buffer freely until it returns;
 * the next op's kernels run after its own. */
gpc_status gpc_cuda_scratch(size_t bytes, void **out);

/* Graphs bake the scratch buffer's address into their kernels, so while any
 * graph lives (count > 0 after gpc_cuda_scratch_keep(+1)) a larger request
 * allocates a new buffer and keeps the old one until the last graph goes
 * (gpc_cuda_scratch_keep(-1)). */
void gpc_cuda_scratch_keep(int delta);

/* acc[j] += the sum over rows n of x[n * ld + j], j < C (x N rows of ld
 * elements in dtype on the current GPU; acc any float dtype): partial sums
 * per block of rows, then their sum in a fixed order, so the bits do not
 * depend on scheduling. Uses the scratch buffer. The bias gradients' column
 * sums (matmul.cu). */
gpc_status gpc_cuda_add_column_sums(const gpc_tensor *acc, const void *x, gpc_dtype dtype,
                                    int64_t N, int64_t C, int64_t ld);

/* acc[C] += the column sums of partial [parts, C] (f32, on the device), in
 * a fixed order: the finishing pass of gpc_cuda_add_column_sums, for
 * kernels that leave such partial sums themselves (matmul.cu). */
gpc_status gpc_cuda_add_partial_sums(const gpc_tensor *acc, const float *partial, int parts, int C);

/* dst [cols, rows] = the transpose of src [rows, cols], 2-byte elements
 * (bf16 or f16), both on the current GPU, queued on its stream (convert.cu). */
gpc_status gpc_cuda_transpose16(void *dst, const void *src, int64_t rows, int64_t cols);

/* How many GPUs a process keeps per-device state for (handles, scratch,
 * cached answers); device numbers at or above it get none. */
#define GPC_CUDA_MAX_DEVICES 64

/* Number of multiprocessors of the current GPU (cached). */
int gpc_cuda_sm_count(void);

/* Lets kernel fn take `bytes` of dynamic shared memory on the current GPU
 * beside its `static_bytes` of static arrays: above the 48 KiB default the
 * runtime must allow it. Asked once per kernel, GPU and larger size, and
 * only ever raised (a graph captured with a larger size keeps it), so a
 * launch in a capture asks nothing once an eager run of the same size has.
 * A refusal is an error naming op. */
gpc_status gpc_cuda_allow_shared(const void *fn, size_t bytes, size_t static_bytes, const char *op);

/* Whether the current GPU takes programmatic dependent launches (compute
 * capability 9.0 or more; cached per device). */
int gpc_cuda_pdl_capable(void);

/* Programmatic dependent launch (Hopper): a kernel launched with
 * cudaLaunchAttributeProgrammaticStreamSerialization may start once every
 * block of the kernel before it has started and said so (or ended); it
 * must wait for that kernel's end (and its writes) before it reads what it
 * wrote. Both are no-ops in a kernel launched plainly. */
__device__ __forceinline__ void gpc_pdl_let_next_start(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void gpc_pdl_wait_previous(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* cp.async: 16 bytes from global to shared memory (L2 only), zero-filled
 * where !valid; a thread's copies are its own to wait for (commit, then
 * wait until at most N groups are in flight) before it reads them. */
__device__ __forceinline__ void gpc_cp_async16(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void gpc_cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void gpc_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* fn<<<grid, threads, 0, stream>>>(args...), as a programmatic dependent
 * of the kernel before it when pdl (which the caller sets only on a GPU
 * that takes it: gpc_cuda_pdl_capable); a launch error is left for
 * GPC_CUDA_CHECK_LAUNCH. */
template <typename... Params, typename... Args>
static inline void gpc_cuda_start(int pdl, void (*fn)(Params...), dim3 grid, unsigned threads,
                                  Args... args) {
    if (pdl) {
        cudaLaunchAttribute attr = {};
        attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = grid;
        cfg.blockDim = dim3(threads);
        cfg.stream = gpc_cuda_stream();
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
        cudaLaunchKernelEx(&cfg, fn, ((Params)args)...);
    } else {
        fn<<<grid, threads, 0, gpc_cuda_stream()>>>(((Params)args)...);
    }
}

/* Whether the serving ops' kernels (paged.cu: embedding_at, paged
 * attention and its combine; sample.cu: feed_tokens, forbid_tokens,
 * sample) launch as programmatic dependents: GPC_PAGED_PDL on a GPU that
 * takes them. Each waits for the kernel before at its start, then lets
 * the next start at once, so a decode step's kernels overlap their
 * launches and ramps. */
static inline int gpc_cuda_serving_pdl(void) {
    static int enabled = -1;
    return gpc_cuda_setting_flag("GPC_PAGED_PDL", &enabled) && gpc_cuda_pdl_capable();
}

static inline unsigned gpc_cuda_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b);
}

/* Entry points of each op family (one .cu each), gpc_cuda_NAME for every op
 * of gpc_ops_table, gathered in cuda_ops.cu. */
#define GPC_CUDA_DECLARE(name, params) gpc_status gpc_cuda_##name params;
GPC_OPS_LIST(GPC_CUDA_DECLARE)
#undef GPC_CUDA_DECLARE

/* Refuses a mix of dtypes a kernel does not serve (GPC_ERR_UNSUPPORTED,
 * naming the op and both tensors). */
gpc_status gpc_cuda_same_dtype(const char *op, const char *name_a, const gpc_tensor *a,
                               const char *name_b, const gpc_tensor *b);

#endif /* GPC_CUDA_COMMON_CUH */
