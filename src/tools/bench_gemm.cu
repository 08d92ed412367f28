/*
 * bench_gemm.cu: the GPU side of `gpc bench` and `gpc doctor` (see
 * bench_cuda.h): GEMM with a naive kernel, a shared-memory tiled kernel and
 * cuBLAS in each precision; copies from pageable, pinned and managed memory;
 * a multi-stream copy-compute-copy pipeline; driver, runtime and cuDNN
 * versions; an NCCL all-reduce.
 *
 * The two hand-written GEMM kernels are the textbook pair (CUDA C
 * Programming Guide, "Shared Memory"): they exist to show what staging tiles
 * in shared memory buys over reading every operand from global memory, and
 * what cuBLAS's tensor-core kernels buy over both. Every GEMM checks a sample
 * of its output against float64 on the host, so a fast wrong kernel cannot
 * pass for a fast one.
 */
#include "tools/bench_cuda.h"

#include "cuda/attention_cudnn.h"
#include "cuda/cuda_common.cuh"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Like GPC_CUDA_CHECK but jumps to the function's cleanup label, so buffers
 * are freed on every path. */
#define BENCH_CHECK(call)                                                                          \
    do {                                                                                           \
        cudaError_t bench_err_ = (call);                                                           \
        if (bench_err_ != cudaSuccess) {                                                           \
            status = gpc_error(bench_err_ == cudaErrorMemoryAllocation ? GPC_ERR_NOMEM             \
                                                                       : GPC_ERR_DEVICE,           \
                               "CUDA error at %s:%d: %s (%s)", __FILE__, __LINE__,                 \
                               cudaGetErrorString(bench_err_), #call);                             \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

#define BENCH_CUBLAS(call)                                                                         \
    do {                                                                                           \
        int bench_cublas_ = (int)(call);                                                           \
        if (bench_cublas_ != 0) {                                                                  \
            status = gpc_error(GPC_ERR_DEVICE, "cuBLAS error %d at %s:%d (%s)", bench_cublas_,     \
                               __FILE__, __LINE__, #call);                                         \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *values, int count) {
    qsort(values, (size_t)count, sizeof *values, compare_double);
    return count % 2 ? values[count / 2] : 0.5 * (values[count / 2 - 1] + values[count / 2]);
}

extern "C" int gpc_bench_cuda_device_count(void) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        cudaGetLastError();
        if (err == cudaErrorInsufficientDriver)
            gpc_error(GPC_ERR_UNSUPPORTED,
                      "no GPU: there is no NVIDIA driver, or it is older than this CUDA runtime "
                      "(%d.%d); check nvidia-smi",
                      CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
        else
            gpc_error(GPC_ERR_UNSUPPORTED, "no GPU: %s (check nvidia-smi and CUDA_VISIBLE_DEVICES)",
                      err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device is visible");
        return 0;
    }
    return count;
}

extern "C" gpc_status gpc_bench_cuda_device_info(int device, char *name, size_t name_size,
                                                 int *cc_major, int *cc_minor,
                                                 size_t *total_bytes) {
    cudaDeviceProp prop;
    GPC_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    if (name) snprintf(name, name_size, "%s", prop.name);
    if (cc_major) *cc_major = prop.major;
    if (cc_minor) *cc_minor = prop.minor;
    if (total_bytes) *total_bytes = prop.totalGlobalMem;
    return GPC_OK;
}

extern "C" gpc_status gpc_bench_cuda_versions(int *driver, int *runtime) {
    *driver = 0;
    *runtime = 0;
    if (cudaRuntimeGetVersion(runtime) != cudaSuccess) *runtime = CUDART_VERSION;
    if (cudaDriverGetVersion(driver) != cudaSuccess) {
        cudaGetLastError();
        *driver = 0;
    }
    return GPC_OK;
}

extern "C" gpc_status gpc_bench_cudnn_version(int *built, long *version) {
    *built = gpc_cudnn_attention_built();
    *version = 0;
    if (!*built) return gpc_error(GPC_ERR_UNSUPPORTED, "this gpc was built without cudnn.h");
    GPC_TRY(gpc_cudnn_attention_load());
    *version = gpc_cudnn_attention_version();
    return GPC_OK;
}

extern "C" const char *gpc_gemm_kernel_name(gpc_gemm_kernel kernel) {
    static const char *names[] = {"naive", "tiled", "cublas"};
    return (unsigned)kernel < 3 ? names[kernel] : "?";
}

extern "C" const char *gpc_gemm_precision_name(gpc_gemm_precision precision) {
    static const char *names[] = {"f32", "tf32", "bf16", "f16", "fp8"};
    return (unsigned)precision < 5 ? names[precision] : "?";
}

/* ------------------------------------------------------------ GEMM kernels */

/* Row-major C[n,n] = A[n,n] B[n,n]; thread (x, y) computes C[y, x]. Adjacent
 * threads read adjacent columns of B (coalesced) and the same A element
 * (a broadcast), but every operand comes from global memory n times. */
__global__ void bench_gemm_naive(const float *A, const float *B, float *C, int n) {
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= n || col >= n) return;
    float acc = 0.0f;
    for (int k = 0; k < n; k++)
        acc += A[(size_t)row * n + k] * B[(size_t)k * n + col];
    C[(size_t)row * n + col] = acc;
}

#define BENCH_TILE 32

/* The same product with 32x32 tiles of A and B staged in shared memory: each
 * global element is read n/32 times instead of n times. */
__global__ void bench_gemm_tiled(const float *A, const float *B, float *C, int n) {
    __shared__ float tile_a[BENCH_TILE][BENCH_TILE];
    __shared__ float tile_b[BENCH_TILE][BENCH_TILE + 1]; /* +1: no bank conflicts */
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * BENCH_TILE + ty;
    int col = blockIdx.x * BENCH_TILE + tx;
    float acc = 0.0f;
    for (int t = 0; t < n; t += BENCH_TILE) {
        tile_a[ty][tx] = (row < n && t + tx < n) ? A[(size_t)row * n + t + tx] : 0.0f;
        tile_b[ty][tx] = (t + ty < n && col < n) ? B[(size_t)(t + ty) * n + col] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BENCH_TILE; k++)
            acc += tile_a[ty][k] * tile_b[k][tx];
        __syncthreads();
    }
    if (row < n && col < n) C[(size_t)row * n + col] = acc;
}

/* Converts f32 to the benchmark's storage type and writes back the rounded
 * value, so the host reference uses exactly what the GEMM saw. */
__global__ void bench_round(float *values, void *out, size_t count, int precision) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    float x = values[i];
    switch (precision) {
    case GPC_GEMM_BF16: {
        __nv_bfloat16 h = __float2bfloat16(x);
        ((__nv_bfloat16 *)out)[i] = h;
        values[i] = __bfloat162float(h);
        break;
    }
    case GPC_GEMM_F16: {
        __half h = __float2half(x);
        ((__half *)out)[i] = h;
        values[i] = __half2float(h);
        break;
    }
    case GPC_GEMM_FP8: {
        __nv_fp8_e4m3 h = __nv_fp8_e4m3(x);
        ((__nv_fp8_e4m3 *)out)[i] = h;
        values[i] = float(h);
        break;
    }
    default:
        ((float *)out)[i] = x;
        break;
    }
}

/* Output back to f32 for the check. */
__global__ void bench_widen(const void *in, float *out, size_t count, int precision) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    if (precision == GPC_GEMM_BF16 || precision == GPC_GEMM_FP8)
        out[i] = __bfloat162float(((const __nv_bfloat16 *)in)[i]);
    else if (precision == GPC_GEMM_F16)
        out[i] = __half2float(((const __half *)in)[i]);
    else
        out[i] = ((const float *)in)[i];
}

static size_t storage_size(gpc_gemm_precision p) {
    switch (p) {
    case GPC_GEMM_BF16:
    case GPC_GEMM_F16:
        return 2;
    case GPC_GEMM_FP8:
        return 1;
    default:
        return 4;
    }
}

/* fp8 in cuBLASLt wants A transposed ("TN"): D[i + j*n] = sum_p A[p + i*n]
 * B[p + j*n] (column-major), which read row-major is d[j][i] = sum_p
 * a[i][p] b[j][p]. The other paths compute row-major c[i][j] = sum_p
 * a[i][p] b[p][j]. */
static void reference_entry(const float *a, const float *b, int n, int fp8, int i, int j,
                            double *value, double *scale) {
    double sum = 0, mag = 0;
    for (int p = 0; p < n; p++) {
        double x = a[(size_t)i * n + p];
        double y = fp8 ? b[(size_t)j * n + p] : b[(size_t)p * n + j];
        sum += x * y;
        mag += fabs(x * y);
    }
    *value = sum;
    *scale = mag > 0 ? mag : 1.0;
}

typedef struct {
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t heuristic;
    void *workspace;
} bench_blas;

static void bench_blas_destroy(bench_blas *b) {
    if (b->pref) cublasLtMatmulPreferenceDestroy(b->pref);
    if (b->la) cublasLtMatrixLayoutDestroy(b->la);
    if (b->lb) cublasLtMatrixLayoutDestroy(b->lb);
    if (b->ld) cublasLtMatrixLayoutDestroy(b->ld);
    if (b->op) cublasLtMatmulDescDestroy(b->op);
    if (b->lt) cublasLtDestroy(b->lt);
    if (b->blas) cublasDestroy(b->blas);
    if (b->workspace) cudaFree(b->workspace);
}

static gpc_status bench_fp8_setup(bench_blas *b, int n) {
    gpc_status status = GPC_OK;
    const size_t workspace = 32u << 20;
    cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    int found = 0;
    BENCH_CHECK(cudaMalloc(&b->workspace, workspace));
    BENCH_CUBLAS(cublasLtCreate(&b->lt));
    BENCH_CUBLAS(cublasLtMatmulDescCreate(&b->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(b->op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                                sizeof trans_a));
    BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(b->op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                                sizeof trans_b));
    BENCH_CUBLAS(cublasLtMatrixLayoutCreate(&b->la, CUDA_R_8F_E4M3, n, n, n));
    BENCH_CUBLAS(cublasLtMatrixLayoutCreate(&b->lb, CUDA_R_8F_E4M3, n, n, n));
    BENCH_CUBLAS(cublasLtMatrixLayoutCreate(&b->ld, CUDA_R_16BF, n, n, n));
    BENCH_CUBLAS(cublasLtMatmulPreferenceCreate(&b->pref));
    BENCH_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        b->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
    BENCH_CUBLAS(cublasLtMatmulAlgoGetHeuristic(b->lt, b->op, b->la, b->lb, b->ld, b->ld, b->pref,
                                                1, &b->heuristic, &found));
    if (!found)
        status =
            gpc_error(GPC_ERR_UNSUPPORTED, "cuBLASLt has no fp8 kernel for n=%d on this GPU", n);
done:
    return status;
}

static gpc_status bench_gemm_once(bench_blas *b, gpc_gemm_kernel kernel,
                                  gpc_gemm_precision precision, int n, const void *A, const void *B,
                                  void *C) {
    gpc_status status = GPC_OK;
    const float one = 1.0f, zero = 0.0f;
    if (kernel == GPC_GEMM_NAIVE) {
        dim3 block(16, 16), grid((n + 15) / 16, (n + 15) / 16);
        bench_gemm_naive<<<grid, block>>>((const float *)A, (const float *)B, (float *)C, n);
        BENCH_CHECK(cudaGetLastError());
    } else if (kernel == GPC_GEMM_TILED) {
        dim3 block(BENCH_TILE, BENCH_TILE),
            grid((n + BENCH_TILE - 1) / BENCH_TILE, (n + BENCH_TILE - 1) / BENCH_TILE);
        bench_gemm_tiled<<<grid, block>>>((const float *)A, (const float *)B, (float *)C, n);
        BENCH_CHECK(cudaGetLastError());
    } else if (precision == GPC_GEMM_FP8) {
        BENCH_CUBLAS(cublasLtMatmul(b->lt, b->op, &one, A, b->la, B, b->lb, &zero, C, b->ld, C,
                                    b->ld, &b->heuristic.algo, b->workspace, 32u << 20, 0));
    } else {
        /* Row-major C = A B is column-major C^T = B^T A^T: pass B first. */
        cudaDataType type = precision == GPC_GEMM_BF16  ? CUDA_R_16BF
                            : precision == GPC_GEMM_F16 ? CUDA_R_16F
                                                        : CUDA_R_32F;
        cublasComputeType_t compute =
            precision == GPC_GEMM_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        BENCH_CUBLAS(cublasGemmEx(b->blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, B, type, n, A,
                                  type, n, &zero, C, type, n, compute, CUBLAS_GEMM_DEFAULT));
    }
done:
    return status;
}

extern "C" gpc_status gpc_bench_cuda_gemm(int device, gpc_gemm_kernel kernel,
                                          gpc_gemm_precision precision, int n, int reps,
                                          double *seconds, double *max_error) {
    if (n < 16 || n > 65536 || reps < 1)
        return gpc_error(GPC_ERR_INVALID_ARG, "GEMM size %d or repetitions %d out of range", n,
                         reps);
    if (kernel != GPC_GEMM_CUBLAS && precision != GPC_GEMM_F32)
        return gpc_error(GPC_ERR_UNSUPPORTED, "the %s kernel exists in f32 only",
                         gpc_gemm_kernel_name(kernel));
    gpc_status status = GPC_OK;
    const size_t count = (size_t)n * n, elem = storage_size(precision);
    const size_t out_elem = precision == GPC_GEMM_FP8 ? 2 : elem;
    float *host_a = NULL, *host_b = NULL, *host_c = NULL;
    float *dev_fa = NULL, *dev_fb = NULL, *dev_fc = NULL;
    void *dev_a = NULL, *dev_b = NULL, *dev_c = NULL;
    cudaEvent_t start = NULL, stop = NULL;
    double *times = (double *)calloc((size_t)reps, sizeof(double));
    bench_blas b;
    memset(&b, 0, sizeof b);
    gpc_rng rng;
    int threads = 256, blocks = (int)((count + 255) / 256);

    host_a = (float *)malloc(count * sizeof(float));
    host_b = (float *)malloc(count * sizeof(float));
    host_c = (float *)malloc(count * sizeof(float));
    if (!times || !host_a || !host_b || !host_c) {
        status = gpc_error(GPC_ERR_NOMEM, "no host memory for %d x %d GEMM operands", n, n);
        goto done;
    }
    BENCH_CHECK(cudaSetDevice(device));
    if (precision == GPC_GEMM_FP8) {
        int major = 0, minor = 0;
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
        if (major * 10 + minor < 89) {
            status = gpc_error(GPC_ERR_UNSUPPORTED,
                               "this GPU (compute capability %d.%d) has no fp8 tensor cores; "
                               "they start with 8.9 (Ada, Hopper)",
                               major, minor);
            goto done;
        }
        if (n % 16) {
            status = gpc_error(GPC_ERR_INVALID_ARG, "fp8 GEMM needs n divisible by 16, not %d", n);
            goto done;
        }
    }
    gpc_rng_seed(&rng, 1234u + (uint64_t)n, 7);
    gpc_rng_fill_uniform(&rng, host_a, count, -1.0f, 1.0f);
    gpc_rng_fill_uniform(&rng, host_b, count, -1.0f, 1.0f);
    BENCH_CHECK(cudaMalloc(&dev_fa, count * sizeof(float)));
    BENCH_CHECK(cudaMalloc(&dev_fb, count * sizeof(float)));
    BENCH_CHECK(cudaMalloc(&dev_fc, count * sizeof(float)));
    BENCH_CHECK(cudaMalloc(&dev_a, count * elem));
    BENCH_CHECK(cudaMalloc(&dev_b, count * elem));
    BENCH_CHECK(cudaMalloc(&dev_c, count * out_elem));
    BENCH_CHECK(cudaMemcpy(dev_fa, host_a, count * sizeof(float), cudaMemcpyHostToDevice));
    BENCH_CHECK(cudaMemcpy(dev_fb, host_b, count * sizeof(float), cudaMemcpyHostToDevice));
    bench_round<<<blocks, threads>>>(dev_fa, dev_a, count, (int)precision);
    bench_round<<<blocks, threads>>>(dev_fb, dev_b, count, (int)precision);
    BENCH_CHECK(cudaGetLastError());
    BENCH_CHECK(cudaMemcpy(host_a, dev_fa, count * sizeof(float), cudaMemcpyDeviceToHost));
    BENCH_CHECK(cudaMemcpy(host_b, dev_fb, count * sizeof(float), cudaMemcpyDeviceToHost));

    if (kernel == GPC_GEMM_CUBLAS) {
        if (precision == GPC_GEMM_FP8) {
            status = bench_fp8_setup(&b, n);
            if (status) goto done;
        } else {
            BENCH_CUBLAS(cublasCreate(&b.blas));
        }
    }
    BENCH_CHECK(cudaEventCreate(&start));
    BENCH_CHECK(cudaEventCreate(&stop));
    status = bench_gemm_once(&b, kernel, precision, n, dev_a, dev_b, dev_c); /* warm-up */
    if (status) goto done;
    BENCH_CHECK(cudaDeviceSynchronize());
    for (int r = 0; r < reps; r++) {
        float ms = 0;
        BENCH_CHECK(cudaEventRecord(start, 0));
        status = bench_gemm_once(&b, kernel, precision, n, dev_a, dev_b, dev_c);
        if (status) goto done;
        BENCH_CHECK(cudaEventRecord(stop, 0));
        BENCH_CHECK(cudaEventSynchronize(stop));
        BENCH_CHECK(cudaEventElapsedTime(&ms, start, stop));
        times[r] = ms * 1e-3;
    }
    *seconds = median(times, reps);

    bench_widen<<<blocks, threads>>>(dev_c, dev_fc, count, (int)precision);
    BENCH_CHECK(cudaGetLastError());
    BENCH_CHECK(cudaMemcpy(host_c, dev_fc, count * sizeof(float), cudaMemcpyDeviceToHost));
    *max_error = 0;
    for (int s = 0; s < 64; s++) {
        int i = (int)gpc_rng_below(&rng, (uint32_t)n), j = (int)gpc_rng_below(&rng, (uint32_t)n);
        double want, scale;
        reference_entry(host_a, host_b, n, precision == GPC_GEMM_FP8, i, j, &want, &scale);
        double got =
            precision == GPC_GEMM_FP8 ? host_c[(size_t)j * n + i] : host_c[(size_t)i * n + j];
        double err = fabs(got - want) / scale;
        if (!(err <= *max_error)) *max_error = err; /* NaN propagates as the worst */
    }
done:
    bench_blas_destroy(&b);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    cudaFree(dev_fa);
    cudaFree(dev_fb);
    cudaFree(dev_fc);
    cudaFree(dev_a);
    cudaFree(dev_b);
    cudaFree(dev_c);
    free(host_a);
    free(host_b);
    free(host_c);
    free(times);
    return status;
}

/* ------------------------------------------------------------------ copies */

extern "C" const char *gpc_copy_memory_name(gpc_copy_memory memory) {
    static const char *names[] = {"pageable", "pinned", "managed", "managed+prefetch"};
    return (unsigned)memory < 4 ? names[memory] : "?";
}

extern "C" const char *gpc_copy_direction_name(gpc_copy_direction direction) {
    static const char *names[] = {"h2d", "d2h", "d2d"};
    return (unsigned)direction < 3 ? names[direction] : "?";
}

/* Reads every float of a buffer on the device (what makes managed pages
 * migrate there); the sum goes nowhere unless it hits an impossible value,
 * which keeps the compiler from dropping the loads. */
__global__ void bench_touch(const float *data, size_t count, float *sink) {
    float acc = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x)
        acc += data[i];
    if (acc == 1234567.0f) *sink = acc;
}

__global__ void bench_fill(float *data, size_t count, float value) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x)
        data[i] = value;
}

static cudaMemLocation location(int device) {
    cudaMemLocation where;
    memset(&where, 0, sizeof where);
    if (device < 0) {
        where.type = cudaMemLocationTypeHost;
        where.id = 0;
    } else {
        where.type = cudaMemLocationTypeDevice;
        where.id = device;
    }
    return where;
}

extern "C" gpc_status gpc_bench_cuda_copy(int device, gpc_copy_memory memory,
                                          gpc_copy_direction direction, size_t bytes, int reps,
                                          double *seconds) {
    if (bytes < 4 || reps < 1)
        return gpc_error(GPC_ERR_INVALID_ARG, "copy of %zu bytes, %d repetitions: out of range",
                         bytes, reps);
    gpc_status status = GPC_OK;
    const size_t count = bytes / sizeof(float);
    const int managed = memory == GPC_COPY_MANAGED || memory == GPC_COPY_MANAGED_PREFETCH;
    const int prefetch = memory == GPC_COPY_MANAGED_PREFETCH;
    void *host = NULL, *dev = NULL, *dev2 = NULL, *scratch = NULL;
    float *sink = NULL;
    cudaStream_t stream = NULL;
    double *times = (double *)calloc((size_t)reps, sizeof(double));
    int sms = 1;
    if (!times) return gpc_error(GPC_ERR_NOMEM, "no host memory");
    BENCH_CHECK(cudaSetDevice(device));
    BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    BENCH_CHECK(cudaMalloc(&sink, sizeof(float)));
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (direction == GPC_COPY_D2D) {
        BENCH_CHECK(cudaMalloc(&dev, bytes));
        BENCH_CHECK(cudaMalloc(&dev2, bytes));
        BENCH_CHECK(cudaMemset(dev, 1, bytes));
    } else if (managed) {
        BENCH_CHECK(cudaMallocManaged(&dev, bytes, cudaMemAttachGlobal));
        scratch = malloc(bytes);
        if (!scratch) {
            status = gpc_error(GPC_ERR_NOMEM, "no host memory for %zu bytes", bytes);
            goto done;
        }
        memset(scratch, 0, bytes);
    } else {
        BENCH_CHECK(cudaMalloc(&dev, bytes));
        if (memory == GPC_COPY_PINNED) {
            BENCH_CHECK(cudaMallocHost(&host, bytes));
        } else {
            host = malloc(bytes);
            if (!host) {
                status = gpc_error(GPC_ERR_NOMEM, "no host memory for %zu bytes", bytes);
                goto done;
            }
        }
        memset(host, 1, bytes); /* touch every page before timing */
    }
    for (int r = -1; r < reps; r++) { /* r = -1 is the warm-up */
        double t0 = 0, t1 = 0;
        if (direction == GPC_COPY_D2D) {
            t0 = gpc_time_seconds();
            BENCH_CHECK(cudaMemcpyAsync(dev2, dev, bytes, cudaMemcpyDeviceToDevice, stream));
            BENCH_CHECK(cudaStreamSynchronize(stream));
            t1 = gpc_time_seconds();
        } else if (!managed) {
            t0 = gpc_time_seconds();
            if (direction == GPC_COPY_H2D)
                BENCH_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream));
            else
                BENCH_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream));
            BENCH_CHECK(cudaStreamSynchronize(stream));
            t1 = gpc_time_seconds();
        } else if (direction == GPC_COPY_H2D) {
            /* The pages start on the host (written there), then the device reads them. */
            memset(dev, r & 0x7f, bytes);
            t0 = gpc_time_seconds();
            if (prefetch)
                BENCH_CHECK(cudaMemPrefetchAsync(dev, bytes, location(device), 0, stream));
            bench_touch<<<sms * 4, 256, 0, stream>>>((const float *)dev, count, sink);
            BENCH_CHECK(cudaGetLastError());
            BENCH_CHECK(cudaStreamSynchronize(stream));
            t1 = gpc_time_seconds();
        } else {
            /* The pages start on the device (written by a kernel), then the host reads them. */
            bench_fill<<<sms * 4, 256, 0, stream>>>((float *)dev, count, (float)r);
            BENCH_CHECK(cudaGetLastError());
            BENCH_CHECK(cudaStreamSynchronize(stream));
            t0 = gpc_time_seconds();
            if (prefetch) {
                BENCH_CHECK(cudaMemPrefetchAsync(dev, bytes, location(-1), 0, stream));
                BENCH_CHECK(cudaStreamSynchronize(stream));
            }
            memcpy(scratch, dev, bytes);
            t1 = gpc_time_seconds();
        }
        if (r >= 0) times[r] = t1 - t0;
    }
    *seconds = median(times, reps);
done:
    if (stream) cudaStreamDestroy(stream);
    cudaFree(sink);
    cudaFree(dev);
    cudaFree(dev2);
    if (memory == GPC_COPY_PINNED)
        cudaFreeHost(host);
    else
        free(host);
    free(scratch);
    free(times);
    return status;
}

/* --------------------------------------------------------------- overlap */

/* y = a x + b (one fused multiply-add, rounded once) applied `iterations`
 * times: arithmetic whose cost is set from the host so that computing a
 * chunk takes about as long as copying it, and whose result the host can
 * compute to the bit. */
__host__ __device__ inline float bench_step(float x, int iterations) {
    for (int k = 0; k < iterations; k++)
        x = fmaf(x, 0.999f, 0.001f);
    return x;
}

__global__ void bench_work(float *data, size_t count, int iterations) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x)
        data[i] = bench_step(data[i], iterations);
}

/* The pipeline's input: a few distinct values, so the host computes each
 * one's transform once. */
#define BENCH_OVERLAP_VALUES 7
static float bench_overlap_input(size_t i) {
    return (float)(i % BENCH_OVERLAP_VALUES) * 0.25f - 0.5f;
}

extern "C" gpc_status gpc_bench_cuda_overlap(int device, int streams, size_t bytes, int chunks,
                                             int reps, double *seconds, double *max_error) {
    if (streams < 1 || streams > 16 || chunks < 1 || bytes < (size_t)chunks * 1024 || reps < 1)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "overlap with %d streams, %d chunks over %zu bytes: out of range", streams,
                         chunks, bytes);
    gpc_status status = GPC_OK;
    const size_t chunk = bytes / (size_t)chunks / sizeof(float) * sizeof(float);
    const size_t chunk_count = chunk / sizeof(float);
    char *host_in = NULL, *host_out = NULL, *dev = NULL;
    cudaStream_t s[16] = {0};
    double *times = (double *)calloc((size_t)reps, sizeof(double));
    int sms = 1, iterations = 256;
    if (!times) return gpc_error(GPC_ERR_NOMEM, "no host memory");
    BENCH_CHECK(cudaSetDevice(device));
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    BENCH_CHECK(cudaMallocHost((void **)&host_in, chunk * chunks));
    BENCH_CHECK(cudaMallocHost((void **)&host_out, chunk * chunks));
    BENCH_CHECK(cudaMalloc((void **)&dev, chunk * chunks));
    for (size_t i = 0; i < chunk_count * chunks; i++)
        ((float *)host_in)[i] = bench_overlap_input(i);
    for (int i = 0; i < streams; i++)
        BENCH_CHECK(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking));
    {
        /* Calibrate: time one chunk's copy and 256 iterations of the kernel,
         * then scale the iterations so the kernel takes about the copy's time. */
        double t0 = gpc_time_seconds();
        BENCH_CHECK(cudaMemcpyAsync(dev, host_in, chunk, cudaMemcpyHostToDevice, s[0]));
        BENCH_CHECK(cudaStreamSynchronize(s[0]));
        double copy = gpc_time_seconds() - t0;
        bench_work<<<sms * 4, 256, 0, s[0]>>>((float *)dev, chunk_count, iterations);
        BENCH_CHECK(cudaStreamSynchronize(s[0]));
        t0 = gpc_time_seconds();
        bench_work<<<sms * 4, 256, 0, s[0]>>>((float *)dev, chunk_count, iterations);
        BENCH_CHECK(cudaGetLastError());
        BENCH_CHECK(cudaStreamSynchronize(s[0]));
        double work = gpc_time_seconds() - t0;
        double scaled = work > 0 ? iterations * copy / work : iterations;
        iterations = scaled < 1 ? 1 : scaled > 65536 ? 65536 : (int)scaled;
    }
    for (int r = -1; r < reps; r++) {
        double t0 = gpc_time_seconds();
        for (int c = 0; c < chunks; c++) {
            cudaStream_t st = s[c % streams];
            size_t off = (size_t)c * chunk;
            BENCH_CHECK(
                cudaMemcpyAsync(dev + off, host_in + off, chunk, cudaMemcpyHostToDevice, st));
            bench_work<<<sms * 4 / streams + 1, 256, 0, st>>>((float *)(dev + off), chunk_count,
                                                              iterations);
            BENCH_CHECK(cudaGetLastError());
            BENCH_CHECK(
                cudaMemcpyAsync(host_out + off, dev + off, chunk, cudaMemcpyDeviceToHost, st));
        }
        for (int i = 0; i < streams; i++)
            BENCH_CHECK(cudaStreamSynchronize(s[i]));
        if (r >= 0) times[r] = gpc_time_seconds() - t0;
    }
    *seconds = median(times, reps);
    if (max_error) {
        float want[BENCH_OVERLAP_VALUES];
        for (int v = 0; v < BENCH_OVERLAP_VALUES; v++)
            want[v] = bench_step(bench_overlap_input((size_t)v), iterations);
        double worst = 0;
        for (size_t i = 0; i < chunk_count * chunks; i++) {
            double d = fabs((double)((float *)host_out)[i] - want[i % BENCH_OVERLAP_VALUES]);
            if (isnan(d)) {
                worst = d;
                break;
            }
            if (d > worst) worst = d;
        }
        *max_error = worst;
    }
done:
    for (int i = 0; i < streams; i++)
        if (s[i]) cudaStreamDestroy(s[i]);
    cudaFreeHost(host_in);
    cudaFreeHost(host_out);
    cudaFree(dev);
    free(times);
    return status;
}

/* ------------------------------------------------------------------ NCCL */

/* The few NCCL entry points used, by their documented signatures (nccl.h);
 * loaded at run time so gpc runs where NCCL is not installed. */
typedef struct ncclComm *bench_nccl_comm;
typedef int (*nccl_get_version_fn)(int *);
typedef int (*nccl_comm_init_all_fn)(bench_nccl_comm *, int, const int *);
typedef int (*nccl_comm_destroy_fn)(bench_nccl_comm);
typedef int (*nccl_all_reduce_fn)(const void *, void *, size_t, int, int, bench_nccl_comm,
                                  cudaStream_t);
typedef int (*nccl_group_fn)(void);
typedef const char *(*nccl_error_string_fn)(int);
#define BENCH_NCCL_FLOAT32 7 /* ncclFloat32 */
#define BENCH_NCCL_SUM 0     /* ncclSum */

static void *nccl_open(void) {
    void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        gpc_error(GPC_ERR_UNSUPPORTED,
                  "NCCL is not installed (libnccl.so.2 not found): install libnccl2 for "
                  "multi-GPU training");
    return lib;
}

extern "C" gpc_status gpc_bench_nccl_version(int *version) {
    void *lib = nccl_open();
    if (!lib) return GPC_ERR_UNSUPPORTED;
    nccl_get_version_fn get = (nccl_get_version_fn)dlsym(lib, "ncclGetVersion");
    gpc_status status = GPC_OK;
    if (!get || get(version) != 0)
        status = gpc_error(GPC_ERR_DEVICE, "libnccl.so.2 loaded but ncclGetVersion failed");
    dlclose(lib);
    return status;
}

extern "C" gpc_status gpc_bench_cuda_allreduce(int gpus, size_t bytes, int reps, double *seconds) {
    if (gpus < 2 || gpus > 64 || bytes < 4 || reps < 1)
        return gpc_error(GPC_ERR_INVALID_ARG, "all-reduce needs 2 to 64 GPUs, not %d", gpus);
    void *lib = nccl_open();
    if (!lib) return GPC_ERR_UNSUPPORTED;
    gpc_status status = GPC_OK;
    nccl_comm_init_all_fn init = (nccl_comm_init_all_fn)dlsym(lib, "ncclCommInitAll");
    nccl_comm_destroy_fn destroy = (nccl_comm_destroy_fn)dlsym(lib, "ncclCommDestroy");
    nccl_all_reduce_fn all_reduce = (nccl_all_reduce_fn)dlsym(lib, "ncclAllReduce");
    nccl_group_fn group_start = (nccl_group_fn)dlsym(lib, "ncclGroupStart");
    nccl_group_fn group_end = (nccl_group_fn)dlsym(lib, "ncclGroupEnd");
    nccl_error_string_fn error_string = (nccl_error_string_fn)dlsym(lib, "ncclGetErrorString");
    bench_nccl_comm comms[64] = {0};
    cudaStream_t streams[64] = {0};
    void *buffers[64] = {0};
    int devices[64];
    double *times = (double *)calloc((size_t)reps, sizeof(double));
    int inited = 0, rc = 0;
    const size_t count = bytes / sizeof(float);
    if (!init || !destroy || !all_reduce || !group_start || !group_end || !times) {
        status = gpc_error(GPC_ERR_UNSUPPORTED, "libnccl.so.2 lacks the functions gpc needs");
        goto done;
    }
    for (int g = 0; g < gpus; g++) {
        devices[g] = g;
        BENCH_CHECK(cudaSetDevice(g));
        BENCH_CHECK(cudaMalloc(&buffers[g], count * sizeof(float)));
        BENCH_CHECK(cudaMemset(buffers[g], 0, count * sizeof(float)));
        BENCH_CHECK(cudaStreamCreateWithFlags(&streams[g], cudaStreamNonBlocking));
    }
    if ((rc = init(comms, gpus, devices)) != 0) {
        status = gpc_error(GPC_ERR_DEVICE, "ncclCommInitAll failed: %s",
                           error_string ? error_string(rc) : "unknown error");
        goto done;
    }
    inited = 1;
    for (int r = -2; r < reps; r++) { /* two warm-ups: the first builds NCCL's rings */
        double t0 = gpc_time_seconds();
        group_start();
        for (int g = 0; g < gpus; g++)
            rc |= all_reduce(buffers[g], buffers[g], count, BENCH_NCCL_FLOAT32, BENCH_NCCL_SUM,
                             comms[g], streams[g]);
        group_end();
        for (int g = 0; g < gpus; g++) {
            BENCH_CHECK(cudaSetDevice(g));
            BENCH_CHECK(cudaStreamSynchronize(streams[g]));
        }
        if (rc) {
            status = gpc_error(GPC_ERR_DEVICE, "ncclAllReduce failed: %s",
                               error_string ? error_string(rc) : "unknown error");
            goto done;
        }
        if (r >= 0) times[r] = gpc_time_seconds() - t0;
    }
    *seconds = median(times, reps);
done:
    for (int g = 0; g < gpus; g++) {
        if (inited && comms[g]) destroy(comms[g]);
        if (streams[g]) cudaStreamDestroy(streams[g]);
        if (buffers[g]) cudaFree(buffers[g]);
    }
    free(times);
    dlclose(lib);
    return status;
}
