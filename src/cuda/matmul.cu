/*
 * matmul.cu: the linear layer on the GPU through cuBLASLt, forward and
 * backward, with the bias fused into the forward product's epilogue.
 *
 * Row-major tensors are column-major matrices transposed, so with
 * inp [N,C], weight [OC,C], out [N,OC] the three products are, in cuBLASLt's
 * column-major terms (m x k times k x n):
 *   forward   out^T     (OC x N) = weight^T' (OC x C) . inp^T (C x N)   + bias
 *   backward  dinp^T    (C x N)  = weight^T  (C x OC) . dout^T (OC x N)  beta 0
 *             dweight^T (C x OC) = inp^T     (C x N)  . dout   (N x OC)  beta 1
 * (dweight accumulates, dinp is overwritten: ops.h). bf16/f16 inputs run on
 * tensor cores with f32 accumulation; f32 inputs use CUBLAS_COMPUTE_32F,
 * which is true f32 and not TF32, so the f32 path can be checked at 1e-5.
 *
 * One cuBLASLt handle and one 32 MiB workspace per GPU (NVIDIA recommends
 * 32 MiB on Hopper), created at the first product. The algorithm for a shape
 * comes from cuBLASLt's heuristic once and is cached, so the step does not
 * pay the heuristic on every call. With GPC_MATMUL_TUNE=1 the first call of
 * a large shape times the heuristic's first 16 candidates and their variants
 * (tune_candidates) on the GPU and keeps the fastest; the run then depends on
 * timing, so two runs may pick different algorithms and differ in the last
 * bits. On an H200 its picks by short timings were 4-13% faster than the
 * heuristic's in isolation, yet the GPT-2 step was not faster (0.999x): the
 * step runs at the GPU's power cap, where time follows energy, and some of
 * those picks needed more energy. Its finalists are now timed back to back
 * for 0.2 s each, as the step runs them (not yet measured in the step); it
 * stays off.
 * What does pay there is a small table of configurations measured to need
 * less energy a call at the cap (measured_configs, from
 * bench_gemm_search --energy-s), taken in place of the heuristic's first
 * choice for those shapes on the GPU they were measured on. The
 * bias gradient is a column sum of dout in two deterministic passes (partial
 * sums per block of rows with 16-byte loads, then their sum in order);
 * cuBLASLt's BGRADB epilogue on the dweight product can do it instead
 * (GPC_MATMUL_BGRAD=1), but measured no faster.
 *
 * The fused linear + GELU ops put GELU into the epilogue: forward
 * GELU_AUX(_BIAS) writes gelu(X) and the pre-activation X in one pass over
 * the output tile; backward DGELU multiplies the dinp product by gelu'(X) as
 * it stores it. That saves a separate GELU kernel's read and write of the
 * [N,4C] activation each way. Only for bf16/f16 (the training precisions):
 * cuBLASLt's GELU need not match our f32 tanh formula to 1e-5, and the f32
 * path exists to check the model at that tolerance, so f32 composes the two
 * kernels. GPC_MATMUL_GELU=0 turns the epilogues off (for benchmarks).
 * DGELU_BGRAD, which would also sum fc's bias gradient, has no algorithm
 * with an f32 sum on an H200, and with a bf16 one it ran 1.75x slower than
 * DGELU (bench/gemm_search.cu), so that bias gradient is a column sum.
 *
 * Forward products of at most 4 rows in bf16/f16 (generation's one row a
 * step) skip cuBLASLt for gemv_kernel, a warp per output column.
 */
#include "cuda/cuda_common.cuh"
#include "cuda/matmul.h"
#include "cuda/gemm_sm90.h"

#include <cublasLt.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* cuBLASLt's workspace: GPC_MATMUL_WORKSPACE_MB, 32 MiB by default (1 to
 * 4096; for measuring whether more room for split-K pays). */
static size_t matmul_workspace_bytes(void) {
    static size_t bytes;
    if (!bytes) bytes = (size_t)gpc_setting_int("GPC_MATMUL_WORKSPACE_MB") << 20;
    return bytes;
}
#define MATMUL_WORKSPACE_BYTES matmul_workspace_bytes()
#define MATMUL_CACHE_SIZE 128

typedef struct {
    int m, n, k, transa, transb;
    int atype, btype, dtype, epilogue;
    int align_a, align_b, align_d, align_bias, align_aux, align_c;
} matmul_key;

typedef struct {
    matmul_key key;
    cublasLtMatmulAlgo_t algo;
    int used; /* 1: algo is valid; 2: cuBLASLt has none for this key */
} matmul_cache_entry;

typedef struct {
    cublasLtHandle_t handle;
    void *workspace;
    matmul_cache_entry cache[MATMUL_CACHE_SIZE];
    int next;
    int measured; /* measured_configs apply to this GPU: 0 not asked yet, 1 no, 2 yes */
} matmul_device;

static matmul_device *devices[GPC_CUDA_MAX_DEVICES];
static pthread_mutex_t matmul_lock = PTHREAD_MUTEX_INITIALIZER;

static gpc_status device_state(matmul_device **out) {
    int d = 0;
    GPC_CUDA_CHECK(cudaGetDevice(&d));
    if (d < 0 || d >= GPC_CUDA_MAX_DEVICES)
        return gpc_error(GPC_ERR_UNSUPPORTED, "matmul: GPU %d is beyond the %d gpc supports", d,
                         GPC_CUDA_MAX_DEVICES);
    pthread_mutex_lock(&matmul_lock);
    gpc_status status = GPC_OK;
    if (!devices[d]) {
        matmul_device *md = (matmul_device *)calloc(1, sizeof *md);
        if (!md) {
            status = gpc_error(GPC_ERR_NOMEM, "matmul: out of host memory");
        } else if (cublasLtCreate(&md->handle) != CUBLAS_STATUS_SUCCESS) {
            free(md);
            status = gpc_error(GPC_ERR_DEVICE,
                               "matmul: cuBLASLt could not start on cuda:%d; "
                               "check the driver with nvidia-smi",
                               d);
        } else if (cudaMalloc(&md->workspace, MATMUL_WORKSPACE_BYTES) != cudaSuccess) {
            cudaGetLastError();
            cublasLtDestroy(md->handle);
            free(md);
            status = gpc_error(GPC_ERR_NOMEM,
                               "matmul: no room for cuBLASLt's %zu MiB workspace "
                               "on cuda:%d",
                               MATMUL_WORKSPACE_BYTES >> 20, d);
        } else {
            devices[d] = md;
        }
    }
    *out = devices[d];
    pthread_mutex_unlock(&matmul_lock);
    return status;
}

static cudaDataType_t lt_type(gpc_dtype t) {
    return t == GPC_BF16 ? CUDA_R_16BF : t == GPC_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static int alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int align = 256;
    while (align > 1 && (a % align) != 0)
        align >>= 1;
    return align;
}

/* GPC_MATMUL_TUNE=1: time the heuristic's candidates at a shape's first call.
 * Asked at every product, so read once, as measured_enabled's switch is. */
static int tune_enabled(void) {
    static int on = -1;
    return gpc_cuda_setting_flag("GPC_MATMUL_TUNE", &on);
}

#define MATMUL_TUNE_CANDIDATES 16 /* the heuristic's first, each with its variants */
#define MATMUL_TUNE_MAX 256       /* candidates timed at most */
#define MATMUL_TUNE_FINALISTS 6
#define MATMUL_TUNE_REPEATS 5
#define MATMUL_TUNE_SUSTAIN_S 0.2 /* each finalist run back to back this long */
#define MATMUL_TUNE_SUSTAIN_MAX_CALLS 20000
#define MATMUL_TUNE_MIN_FLOP 1e9             /* smaller products are not worth the timing */
#define MATMUL_TUNE_MAX_SCRATCH (512u << 20) /* the largest temporary output timing may use */

typedef struct {
    cublasLtMatmulAlgo_t algo;
    float ms;
} tune_candidate;

/* Appends algo to list when cuBLASLt accepts it for the problem within the
 * workspace and no candidate already has the same configuration. */
static void tune_add(matmul_device *md, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                     cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld,
                     const cublasLtMatmulAlgo_t *algo, tune_candidate *list, int *count) {
    if (*count >= MATMUL_TUNE_MAX) return;
    for (int i = 0; i < *count; i++)
        if (!memcmp(&list[i].algo, algo, sizeof *algo)) return;
    cublasLtMatmulHeuristicResult_t r;
    memset(&r, 0, sizeof r);
    if (cublasLtMatmulAlgoCheck(md->handle, desc, la, lb, ld, ld, algo, &r) !=
            CUBLAS_STATUS_SUCCESS ||
        r.workspaceSize > MATMUL_WORKSPACE_BYTES)
        return;
    list[*count].algo = *algo;
    list[*count].ms = -1.0f;
    (*count)++;
}

/* The heuristic's candidates and, for each, the variants its ranking does not
 * try: thread-block cluster shapes 1x1, 2x1, 1x2 and 2x2, custom options 0
 * and 1, and no split-K where it splits (on an H200 these beat the
 * heuristic's first choice by 8-29% on GPT-2's products in isolation,
 * bench/gemm_search.cu). */
static int tune_candidates(matmul_device *md, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                           cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld,
                           const cublasLtMatmulHeuristicResult_t *heur, int found,
                           tune_candidate *list) {
    static const uint16_t clusters[] = {CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
                                        CUBLASLT_CLUSTER_SHAPE_1x2x1, CUBLASLT_CLUSTER_SHAPE_2x2x1};
    static const uint32_t customs[] = {0, 1};
    int count = 0;
    for (int h = 0; h < found; h++)
        tune_add(md, desc, la, lb, ld, &heur[h].algo, list, &count);
    for (int h = 0; h < found; h++) {
        int32_t splitk = 1;
        size_t w = 0;
        cublasLtMatmulAlgoConfigGetAttribute(&heur[h].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                             &splitk, sizeof splitk, &w);
        for (int unsplit = 0; unsplit <= (splitk > 1); unsplit++)
            for (size_t c = 0; c < sizeof clusters / sizeof clusters[0]; c++)
                for (size_t u = 0; u < sizeof customs / sizeof customs[0]; u++) {
                    cublasLtMatmulAlgo_t algo = heur[h].algo;
                    if (unsplit) {
                        int32_t one = 1;
                        uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
                        cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                                             &one, sizeof one);
                        cublasLtMatmulAlgoConfigSetAttribute(
                            &algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none, sizeof none);
                    }
                    if (cublasLtMatmulAlgoConfigSetAttribute(
                            &algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &clusters[c],
                            sizeof clusters[c]) != CUBLAS_STATUS_SUCCESS ||
                        cublasLtMatmulAlgoConfigSetAttribute(
                            &algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &customs[u],
                            sizeof customs[u]) != CUBLAS_STATUS_SUCCESS)
                        continue;
                    tune_add(md, desc, la, lb, ld, &algo, list, &count);
                }
    }
    return count;
}

static int compare_ms(const void *a, const void *b) {
    float x = ((const tune_candidate *)a)->ms, y = ((const tune_candidate *)b)->ms;
    if (x < 0.0f || y < 0.0f) return (x < 0.0f) - (y < 0.0f); /* failed ones last */
    return (x > y) - (x < y);
}

/* Median time of runs of one candidate (-1 when it fails); runs 0 times it once. */
static float tune_time(matmul_device *md, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                       cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld,
                       const cublasLtMatmulAlgo_t *algo, const void *a, const void *b, void *target,
                       float beta, int runs, cudaEvent_t *events) {
    cudaStream_t stream = gpc_cuda_stream();
    float alpha = 1.0f, ms[MATMUL_TUNE_REPEATS];
    int n = runs < 1 ? 1 : runs > MATMUL_TUNE_REPEATS ? MATMUL_TUNE_REPEATS : runs;
    /* one untimed run first: a kernel's first launch also loads it */
    int ok =
        cublasLtMatmul(md->handle, desc, &alpha, a, la, b, lb, &beta, target, ld, target, ld, algo,
                       md->workspace, MATMUL_WORKSPACE_BYTES, stream) == CUBLAS_STATUS_SUCCESS;
    for (int r = 0; ok && r < n; r++)
        ok = cudaEventRecord(events[2 * r], stream) == cudaSuccess &&
             cublasLtMatmul(md->handle, desc, &alpha, a, la, b, lb, &beta, target, ld, target, ld,
                            algo, md->workspace, MATMUL_WORKSPACE_BYTES,
                            stream) == CUBLAS_STATUS_SUCCESS &&
             cudaEventRecord(events[2 * r + 1], stream) == cudaSuccess;
    ok = ok && cudaEventSynchronize(events[2 * n - 1]) == cudaSuccess;
    for (int r = 0; ok && r < n; r++)
        ok = cudaEventElapsedTime(&ms[r], events[2 * r], events[2 * r + 1]) == cudaSuccess;
    if (!ok) {
        cudaGetLastError();
        return -1.0f;
    }
    for (int i = 1; i < n; i++) /* insertion sort of at most MATMUL_TUNE_REPEATS */
        for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
            float t = ms[j];
            ms[j] = ms[j - 1], ms[j - 1] = t;
        }
    return ms[n / 2];
}

/* The time a call of algo takes run back to back for about
 * MATMUL_TUNE_SUSTAIN_S (after a quarter of that to settle), from two events
 * around the whole run; est_ms, a first timing, sets the number of calls.
 * At a GPU's power limit, where training steps run, a configuration's time
 * follows its energy, and a few short runs at full clock rank
 * configurations by the wrong measure: on an H200 some that were faster in
 * short runs needed more energy (bench_gemm_search --energy-s). -1 when it
 * fails. */
static float tune_sustained(matmul_device *md, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                            cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld,
                            const cublasLtMatmulAlgo_t *algo, const void *a, const void *b,
                            void *target, float beta, float est_ms, cudaEvent_t *events) {
    cudaStream_t stream = gpc_cuda_stream();
    float alpha = 1.0f, ms = 0.0f;
    double want = est_ms > 0.0f ? MATMUL_TUNE_SUSTAIN_S * 1e3 / est_ms : 16.0;
    int calls = want < 4                               ? 4
                : want > MATMUL_TUNE_SUSTAIN_MAX_CALLS ? MATMUL_TUNE_SUSTAIN_MAX_CALLS
                                                       : (int)want;
    int ok = 1;
    for (int i = 0; ok && i < calls + calls / 4; i++) {
        if (i == calls / 4) ok = cudaEventRecord(events[0], stream) == cudaSuccess;
        ok = ok && cublasLtMatmul(md->handle, desc, &alpha, a, la, b, lb, &beta, target, ld, target,
                                  ld, algo, md->workspace, MATMUL_WORKSPACE_BYTES,
                                  stream) == CUBLAS_STATUS_SUCCESS;
    }
    ok = ok && cudaEventRecord(events[1], stream) == cudaSuccess &&
         cudaEventSynchronize(events[1]) == cudaSuccess &&
         cudaEventElapsedTime(&ms, events[0], events[1]) == cudaSuccess;
    if (!ok) {
        cudaGetLastError();
        return -1.0f;
    }
    return ms / (float)calls;
}

/* The fastest configuration for the product described by desc/la/lb/ld:
 * every candidate (tune_candidates) timed once on the current stream, then
 * the MATMUL_TUNE_FINALISTS fastest and the heuristic's first run back to
 * back (tune_sustained), as the training step runs them.
 * The runs write D, aux and the bias gradient; when that would change the
 * result (beta != 0 accumulates into D; D aliasing an input), they write a
 * zeroed scratch matrix instead, and when the scratch would be too large the
 * heuristic's first choice stands. Returns 0 with *out set, or -1 when
 * nothing could be timed (the caller keeps the heuristic's first). */
static int tune_pick(matmul_device *md, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                     cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld,
                     const cublasLtMatmulHeuristicResult_t *heur, int found, const void *a,
                     const void *b, void *d, const void *aux, float beta, size_t d_bytes, int m,
                     int n, int k, cublasLtMatmulAlgo_t *out) {
    cudaStream_t stream = gpc_cuda_stream();
    void *target = d, *scratch = NULL;
    cudaEvent_t events[2 * MATMUL_TUNE_REPEATS];
    int made = 0, result = -1, count = 0;
    tune_candidate *list = (tune_candidate *)malloc(MATMUL_TUNE_MAX * sizeof *list);
    if (!list) return -1;
    if (beta != 0.0f || d == a || d == b || d == aux) {
        if (d_bytes > MATMUL_TUNE_MAX_SCRATCH || cudaMalloc(&scratch, d_bytes) != cudaSuccess ||
            cudaMemsetAsync(scratch, 0, d_bytes, stream) != cudaSuccess) {
            cudaGetLastError();
            goto out;
        }
        target = scratch;
    }
    for (; made < 2 * MATMUL_TUNE_REPEATS; made++)
        if (cudaEventCreate(&events[made]) != cudaSuccess) {
            cudaGetLastError();
            goto out;
        }
    {
        count = tune_candidates(md, desc, la, lb, ld, heur, found, list);
        for (int i = 0; i < count; i++)
            list[i].ms =
                tune_time(md, desc, la, lb, ld, &list[i].algo, a, b, target, beta, 1, events);
        int finalists = count < MATMUL_TUNE_FINALISTS ? count : MATMUL_TUNE_FINALISTS;
        /* the heuristic's first is always a finalist, as the measure to beat;
         * finalists are timed back to back (tune_sustained) */
        float first = tune_time(md, desc, la, lb, ld, &heur[0].algo, a, b, target, beta,
                                MATMUL_TUNE_REPEATS, events);
        if (first >= 0.0f)
            first = tune_sustained(md, desc, la, lb, ld, &heur[0].algo, a, b, target, beta, first,
                                   events);
        qsort(list, (size_t)count, sizeof *list, compare_ms);
        for (int i = 0; i < finalists; i++)
            if (list[i].ms >= 0.0f)
                list[i].ms = tune_sustained(md, desc, la, lb, ld, &list[i].algo, a, b, target, beta,
                                            list[i].ms, events);
        qsort(list, (size_t)finalists, sizeof *list, compare_ms);
        if (finalists > 0 && list[0].ms >= 0.0f && (first < 0.0f || list[0].ms < first)) {
            *out = list[0].algo;
            result = 0;
        }
        gpc_log(GPC_LOG_INFO,
                "matmul %dx%dx%d: %d configurations timed; the heuristic's first %.4f ms, the "
                "fastest %.4f ms (%.3fx)",
                m, n, k, count, first, result == 0 ? list[0].ms : first,
                result == 0 && list[0].ms > 0.0f ? first / list[0].ms : 1.0);
    }
out:
    for (int i = 0; i < made; i++)
        cudaEventDestroy(events[i]);
    if (scratch) {
        cudaStreamSynchronize(stream);
        cudaFree(scratch);
    }
    free(list);
    return result;
}

/* ------------------------------------------------ measured configurations */

/* Configurations that need less energy a call than the heuristic's first
 * choice for GPT-2's large products on an H100/H200 (sm_90, 132 SMs) with
 * cuBLASLt 13, found by `bench_gemm_search --energy-s` (bench/gemm_search.cu):
 * each product run back to back at the GPU's 700 W power cap, where the
 * training step runs and a product's time follows its energy. The gain is
 * energy a call against the heuristic's pick: GPT-2 124M at N = 65,536
 * tokens (C = 768), 1.5B at 8,192 (C = 1600). An entry matches on m, k, the
 * transposes and the epilogue, so each size's entries apply to its own
 * products only. The same search at 350M and 774M (C = 1024, 1280; 1.03-1.04x
 * less energy for three and two products) slowed their steps 0.998x and
 * 0.990x, so those sizes keep the heuristic's picks; 1.5B's step ran 1.0075x.
 * Configurations faster only in short runs (higher clocks) are not here:
 * some of those need more energy at the cap (fc's dweight, for one). Used
 * for bf16 with 256-byte aligned operands and n >= MEASURED_MIN_N, when
 * cublasLtMatmulAlgoCheck accepts them; GPC_MATMUL_MEASURED=0 turns them
 * off (the heuristic's first choice then, as everywhere else). */
typedef struct {
    const char *what;
    int m, k, transa, transb;
    cublasLtEpilogue_t epilogue;
    int32_t id;
    uint32_t tile, stages, swizzle, custom;
    uint16_t cluster;
} measured_config;

#define MEASURED_MIN_N 8192

static int measured_uses;

int gpc_cuda_matmul_measured_uses(void) {
    return __atomic_load_n(&measured_uses, __ATOMIC_RELAXED);
}

static const measured_config measured_configs[] = {
    /* 1.096x: 8.40 -> 7.61 ms at the cap */
    {"output head forward", 50304, 768, 1, 0, CUBLASLT_EPILOGUE_DEFAULT, 66,
     CUBLASLT_MATMUL_TILE_176x128, CUBLASLT_MATMUL_STAGES_64xAUTO, 0, 2,
     CUBLASLT_CLUSTER_SHAPE_1x2x1},
    /* 1.055x: 0.684 -> 0.649 ms */
    {"fc forward, GELU", 3072, 768, 1, 0, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 66,
     CUBLASLT_MATMUL_TILE_192x64, CUBLASLT_MATMUL_STAGES_64xAUTO, 0, 0,
     CUBLASLT_CLUSTER_SHAPE_1x2x1},
    /* 1.036x: 0.679 -> 0.656 ms */
    {"fcproj backward dinp, DGELU", 3072, 768, 0, 0, CUBLASLT_EPILOGUE_DGELU, 39,
     CUBLASLT_MATMUL_TILE_128x128, CUBLASLT_MATMUL_STAGES_64xAUTO, 1, 0,
     CUBLASLT_CLUSTER_SHAPE_2x1x1},
    /* 1.035x: 0.391 -> 0.376 ms */
    {"qkv forward", 2304, 768, 1, 0, CUBLASLT_EPILOGUE_BIAS, 66, CUBLASLT_MATMUL_TILE_96x192,
     CUBLASLT_MATMUL_STAGES_64xAUTO, 0, 0, CUBLASLT_CLUSTER_SHAPE_2x1x1},
    /* 1.053x: 0.138 -> 0.131 ms */
    {"attention projection forward", 768, 768, 1, 0, CUBLASLT_EPILOGUE_BIAS, 66,
     CUBLASLT_MATMUL_TILE_128x128, CUBLASLT_MATMUL_STAGES_64xAUTO, 0, 3,
     CUBLASLT_CLUSTER_SHAPE_1x1x1},
    /* 1.089x: 0.135 -> 0.125 ms */
    {"attention projection backward dinp", 768, 768, 0, 0, CUBLASLT_EPILOGUE_DEFAULT, 66,
     CUBLASLT_MATMUL_TILE_128x160, CUBLASLT_MATMUL_STAGES_64xAUTO, 0, 1,
     CUBLASLT_CLUSTER_SHAPE_2x1x1},
    /* GPT-2 1.5B (C = 1600): 1.169x, 154.2 -> 132.0 mJ */
    {"qkv forward", 4800, 1600, 1, 0, CUBLASLT_EPILOGUE_BIAS, 66, CUBLASLT_MATMUL_TILE_128x128,
     CUBLASLT_MATMUL_STAGES_64xAUTO, 0, 0, CUBLASLT_CLUSTER_SHAPE_2x1x1},
    /* 1.109x: 53.4 -> 48.1 mJ */
    {"attention projection forward", 1600, 1600, 1, 0, CUBLASLT_EPILOGUE_BIAS, 66,
     CUBLASLT_MATMUL_TILE_136x128, CUBLASLT_MATMUL_STAGES_64xAUTO, 0, 0,
     CUBLASLT_CLUSTER_SHAPE_2x1x1},
    /* 1.082x: 195.9 -> 181.0 mJ */
    {"fcproj forward", 1600, 6400, 1, 0, CUBLASLT_EPILOGUE_BIAS, 66, CUBLASLT_MATMUL_TILE_136x128,
     CUBLASLT_MATMUL_STAGES_64xAUTO, 0, 0, CUBLASLT_CLUSTER_SHAPE_2x1x1},
    /* 1.060x: 210.0 -> 198.0 mJ */
    {"fc forward, GELU", 6400, 1600, 1, 0, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 66,
     CUBLASLT_MATMUL_TILE_96x128, CUBLASLT_MATMUL_STAGES_64xAUTO, 0, 0,
     CUBLASLT_CLUSTER_SHAPE_2x4x1},
    /* 1.094x: 145.6 -> 133.1 mJ */
    {"qkv backward dinp", 1600, 4800, 0, 0, CUBLASLT_EPILOGUE_DEFAULT, 66,
     CUBLASLT_MATMUL_TILE_320x64, CUBLASLT_MATMUL_STAGES_64xAUTO, 0, 0,
     CUBLASLT_CLUSTER_SHAPE_1x2x1},
    /* 1.088x: 50.6 -> 46.5 mJ */
    {"attention projection backward dinp", 1600, 1600, 0, 0, CUBLASLT_EPILOGUE_DEFAULT, 66,
     CUBLASLT_MATMUL_TILE_320x64, CUBLASLT_MATMUL_STAGES_64xAUTO, 0, 0,
     CUBLASLT_CLUSTER_SHAPE_1x2x1},
    /* 1.043x: 183.3 -> 175.7 mJ */
    {"fc backward dinp", 1600, 6400, 0, 0, CUBLASLT_EPILOGUE_DEFAULT, 66,
     CUBLASLT_MATMUL_TILE_160x128, CUBLASLT_MATMUL_STAGES_64xAUTO, 0, 0,
     CUBLASLT_CLUSTER_SHAPE_2x1x1},
};

static int measured_enabled(void) {
    static int on = -1;
    return gpc_cuda_setting_flag("GPC_MATMUL_MEASURED", &on);
}

/* Whether md's GPU (the current one) and cuBLASLt are the ones the table was
 * measured on; asked once per GPU. */
static int measured_gpu(matmul_device *md) {
    if (!md->measured) {
        int dev = 0, major = 0, sms = 0;
        size_t version = cublasLtGetVersion(); /* 130100 for 13.1.0 */
        int yes =
            cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
            major == 9 && sms == 132 && version / 10000 == 13;
        cudaGetLastError();
        md->measured = yes ? 2 : 1;
    }
    return md->measured == 2;
}

int gpc_cuda_matmul_measured_applies(void) {
    matmul_device *md = NULL;
    if (device_state(&md) != GPC_OK) {
        gpc_clear_error();
        return 0;
    }
    return measured_enabled() && !tune_enabled() && measured_gpu(md);
}

/* The measured configuration for this product in *out (0), or -1 when the
 * table has none or cuBLASLt does not accept it here. */
static int measured_pick(matmul_device *md, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                         cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld,
                         const matmul_key *key, cublasLtEpilogue_t epilogue,
                         cublasLtMatmulAlgo_t *out) {
    if (!measured_enabled() || key->n < MEASURED_MIN_N || key->atype != GPC_BF16 ||
        key->btype != GPC_BF16 || key->dtype != GPC_BF16 || key->align_a < 256 ||
        key->align_b < 256 || key->align_d < 256 || key->align_c < 256 ||
        (key->align_aux && key->align_aux < 256) || !measured_gpu(md))
        return -1;
    for (size_t i = 0; i < sizeof measured_configs / sizeof measured_configs[0]; i++) {
        const measured_config *c = &measured_configs[i];
        if (c->m != key->m || c->k != key->k || c->transa != key->transa ||
            c->transb != key->transb || c->epilogue != epilogue)
            continue;
        cublasLtMatmulAlgo_t algo;
        int32_t one = 1;
        uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
        cublasLtMatmulHeuristicResult_t r;
        memset(&r, 0, sizeof r);
        if (cublasLtMatmulAlgoInit(md->handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF,
                                   CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, c->id,
                                   &algo) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &c->tile,
                                                 sizeof c->tile) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &c->stages,
                                                 sizeof c->stages) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one,
                                                 sizeof one) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                 &none, sizeof none) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING,
                                                 &c->swizzle,
                                                 sizeof c->swizzle) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION,
                                                 &c->custom,
                                                 sizeof c->custom) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                                 &c->cluster,
                                                 sizeof c->cluster) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulAlgoCheck(md->handle, desc, la, lb, ld, ld, &algo, &r) !=
                CUBLAS_STATUS_SUCCESS ||
            r.workspaceSize > MATMUL_WORKSPACE_BYTES) {
            gpc_log(GPC_LOG_DEBUG,
                    "matmul %dx%dx%d: cuBLASLt does not take the measured "
                    "configuration for the %s; using its heuristic's",
                    key->m, key->n, key->k, c->what);
            return -1;
        }
        gpc_log(GPC_LOG_DEBUG, "matmul %dx%dx%d: the measured configuration for the %s", key->m,
                key->n, key->k, c->what);
        __atomic_fetch_add(&measured_uses, 1, __ATOMIC_RELAXED);
        *out = algo;
        return 0;
    }
    return -1;
}

/* What the epilogue does with GELU: nothing; D = gelu(X) with X (the
 * pre-activation) also written to aux (forward); D = X * gelu'(aux) (the
 * backward of a layer whose input was gelu(aux)). aux is m x n with leading
 * dimension ldd, in D's dtype. */
typedef enum { MATMUL_NO_GELU, MATMUL_GELU_AUX, MATMUL_DGELU } matmul_gelu;

/* D (m x n, ld ldd) = alpha op(A) op(B) + beta C [+ bias], column-major, with
 * C = D unless c (a matrix of D's dtype and layout) is given.
 * With bias_grad (f32 [n]) the epilogue also writes the column sums of op(B)
 * there (BGRADB); when cuBLASLt has no algorithm for that, the call returns
 * GPC_ERR_UNSUPPORTED having done nothing, and the caller sums itself. The
 * GELU epilogues (see matmul_gelu) fail the same way when unsupported. */
static gpc_status lt_matmul(void *d, gpc_dtype dtype, const void *a, gpc_dtype atype, const void *b,
                            gpc_dtype btype, const void *bias, int m, int n, int k, int transa,
                            int transb, int lda, int ldb, int ldd, float beta, float *bias_grad,
                            matmul_gelu gelu = MATMUL_NO_GELU, void *aux = NULL,
                            const void *c = NULL) {
    matmul_device *md = NULL;
    GPC_TRY(device_state(&md));
    gpc_status status = GPC_OK;
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasOperation_t opa = transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t epilogue = gelu == MATMUL_GELU_AUX ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                                  : CUBLASLT_EPILOGUE_GELU_AUX)
                                  : gelu == MATMUL_DGELU  ? CUBLASLT_EPILOGUE_DGELU
                                  : bias                  ? CUBLASLT_EPILOGUE_BIAS
                                  : bias_grad             ? CUBLASLT_EPILOGUE_BGRADB
                                                          : CUBLASLT_EPILOGUE_DEFAULT;
    cudaDataType_t f32 = CUDA_R_32F;
    float alpha = 1.0f;
    matmul_key key;
    memset(&key, 0, sizeof key);
    key.m = m, key.n = n, key.k = k, key.transa = transa, key.transb = transb;
    key.atype = atype, key.btype = btype, key.dtype = dtype, key.epilogue = (int)epilogue;
    key.align_a = alignment(a), key.align_b = alignment(b), key.align_d = alignment(d);
    key.align_bias = bias ? alignment(bias) : bias_grad ? alignment(bias_grad) : 0;
    key.align_aux = aux ? alignment(aux) : 0;
    key.align_c = c ? alignment(c) : key.align_d;

    GPC_LT_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    GPC_LT_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    GPC_LT_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    GPC_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                sizeof epilogue));
    if (bias)
        GPC_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                    sizeof bias));
    if (bias_grad) {
        GPC_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &bias_grad, sizeof bias_grad));
        GPC_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &f32,
                                                    sizeof f32));
    }
    if (aux) {
        int64_t ldaux = ldd; /* the docs ask for a multiple of 8; callers check */
        GPC_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                    &aux, sizeof aux));
        GPC_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                    &ldaux, sizeof ldaux));
    }
    GPC_LT_CHECK(
        cublasLtMatrixLayoutCreate(&la, lt_type(atype), transa ? k : m, transa ? m : k, lda));
    GPC_LT_CHECK(
        cublasLtMatrixLayoutCreate(&lb, lt_type(btype), transb ? n : k, transb ? k : n, ldb));
    GPC_LT_CHECK(cublasLtMatrixLayoutCreate(&ld, lt_type(dtype), m, n, ldd));

    {
        matmul_cache_entry *hit = NULL;
        pthread_mutex_lock(&matmul_lock);
        for (int i = 0; i < MATMUL_CACHE_SIZE; i++)
            if (md->cache[i].used && !memcmp(&md->cache[i].key, &key, sizeof key)) {
                hit = &md->cache[i];
                break;
            }
        cublasLtMatmulAlgo_t algo;
        int none = hit && hit->used == 2;
        if (hit) algo = hit->algo;
        pthread_mutex_unlock(&matmul_lock);
        if (none) {
            status = gpc_error(GPC_ERR_UNSUPPORTED, "matmul: cuBLASLt has no algorithm for this "
                                                    "epilogue");
            goto done;
        }
        if (!hit) {
            cublasLtMatmulHeuristicResult_t result[MATMUL_TUNE_CANDIDATES];
            int found = 0;
            /* timing waits for the GPU, which a graph's capture cannot */
            int tune = tune_enabled() && !c && 2.0 * m * n * k >= MATMUL_TUNE_MIN_FLOP &&
                       !gpc_cuda_capturing();
            size_t ws = MATMUL_WORKSPACE_BYTES;
            uint32_t al_a = key.align_a, al_b = key.align_b, al_c = key.align_c;
            uint32_t al_d = key.align_d;
            GPC_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
            GPC_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
            GPC_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
            GPC_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
            GPC_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
            GPC_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d));
            if (cublasLtMatmulAlgoGetHeuristic(md->handle, desc, la, lb, ld, ld, pref,
                                               tune ? MATMUL_TUNE_CANDIDATES : 1, result,
                                               &found) != CUBLAS_STATUS_SUCCESS ||
                found == 0) {
                pthread_mutex_lock(&matmul_lock);
                matmul_cache_entry *e = &md->cache[md->next];
                md->next = (md->next + 1) % MATMUL_CACHE_SIZE;
                e->key = key;
                e->used = 2;
                pthread_mutex_unlock(&matmul_lock);
                status = gpc_error(GPC_ERR_UNSUPPORTED,
                                   "matmul: cuBLASLt has no algorithm for %dx%dx%d with %s x %s -> "
                                   "%s%s%s; try another precision",
                                   m, n, k, gpc_dtype_name(atype), gpc_dtype_name(btype),
                                   gpc_dtype_name(dtype), bias ? " and bias" : "",
                                   gelu ? " and a GELU epilogue" : "");
                goto done;
            }
            algo = result[0].algo;
            if (!tune)
                measured_pick(md, desc, la, lb, ld, &key, epilogue, &algo);
            else
                tune_pick(md, desc, la, lb, ld, result, found, a, b, d, aux, beta,
                          (size_t)ldd * (size_t)n * gpc_dtype_size(dtype), m, n, k, &algo);
            pthread_mutex_lock(&matmul_lock);
            matmul_cache_entry *e = &md->cache[md->next];
            md->next = (md->next + 1) % MATMUL_CACHE_SIZE;
            e->key = key;
            e->algo = algo;
            e->used = 1;
            pthread_mutex_unlock(&matmul_lock);
        }
        GPC_LT_CHECK(cublasLtMatmul(md->handle, desc, &alpha, a, la, b, lb, &beta, c ? c : d, ld, d,
                                    ld, &algo, md->workspace, MATMUL_WORKSPACE_BYTES,
                                    gpc_cuda_stream()));
    }
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (desc) cublasLtMatmulDescDestroy(desc);
    return status;
}

/* out[n, j] += bias[j] for when the epilogue cannot take the bias dtype. */
template <typename T>
__global__ void add_bias_kernel(T *out, gpc_cuda_any bias, int64_t N, int OC) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N * OC; i += stride)
        out[i] = gpc_from_f32<T>(gpc_to_f32(out[i]) + gpc_any_load(bias, i % OC));
}

/* partial[blockIdx.y][j] = sum of dout[n * ld + j] over this block's rows. Block
 * (32, 8): a lane owns PER neighbouring columns (one 16-byte load per row
 * when PER > 1), the 8 rows of threadIdx.y walk the block's rows, and shared
 * memory adds the 8 in a fixed order. */
template <typename T, int PER>
__global__ void bias_grad_partial_kernel(float *partial, const T *dout, int64_t N, int OC,
                                         int64_t ld, int64_t rows_per_block) {
    __shared__ float sums[8][32 * PER];
    int j0 = (blockIdx.x * 32 + threadIdx.x) * PER;
    int64_t begin = blockIdx.y * rows_per_block;
    int64_t end = begin + rows_per_block < N ? begin + rows_per_block : N;
    float s[PER];
#pragma unroll
    for (int k = 0; k < PER; k++)
        s[k] = 0.0f;
    if (j0 < OC)
        for (int64_t n = begin + threadIdx.y; n < end; n += 8) {
            if (PER == 1) {
                s[0] += gpc_to_f32(dout[n * ld + j0]);
            } else {
                gpc_pack<T> v = *(const gpc_pack<T> *)(dout + n * ld + j0);
#pragma unroll
                for (int k = 0; k < PER; k++)
                    s[k] += gpc_to_f32(v.v[k]);
            }
        }
#pragma unroll
    for (int k = 0; k < PER; k++)
        sums[threadIdx.y][threadIdx.x * PER + k] = s[k];
    __syncthreads();
    for (int i = threadIdx.y * 32 + threadIdx.x; i < 32 * PER; i += 256) {
        int j = blockIdx.x * 32 * PER + i;
        if (j >= OC) continue;
        float t = 0.0f;
        for (int y = 0; y < 8; y++)
            t += sums[y][i];
        partial[(int64_t)blockIdx.y * OC + j] = t;
    }
}

/* dbias[j] += the sum over parts of partial[part][j], 32 columns a block in a
 * fixed order (gpc_parts_column_sum): each thread reads parts / 16 partial
 * rows, so the sum is not one thread's chain of dependent loads. */
__global__ void bias_grad_finish_kernel(gpc_cuda_any dbias, const float *partial, int parts,
                                        int OC) {
    int j = blockIdx.x * 32 + threadIdx.x;
    float s = gpc_parts_column_sum(partial, parts, OC);
    if (threadIdx.y == 0 && j < OC) gpc_any_store(dbias, j, gpc_any_load(dbias, j) + s);
}

gpc_status gpc_cuda_add_partial_sums(const gpc_tensor *dbias, const float *partial, int parts,
                                     int OC) {
    bias_grad_finish_kernel<<<gpc_cuda_blocks(OC, 32), dim3(32, GPC_PARTS_ROWS), 0,
                              gpc_cuda_stream()>>>(gpc_cuda_any_of(dbias), partial, parts, OC);
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

/* ------------------------------------------------ products of a few rows
 *
 * Generation runs its products on one row a step, where cuBLASLt's tiles
 * read the weight at under 1 TB/s (measured on an H200: 6.6 us for fc's
 * 4.7 MB). Here a warp takes one output column and walks the weight's row
 * for it with 16-byte loads, so the weight, which dominates the traffic, is
 * read once at close to the memory's rate; the few input rows come from
 * cache. f32 accumulation, the lanes' sums added in a fixed order. With
 * out_pre the output is gelu(x + bias) and x + bias goes to out_pre (the
 * GELU_AUX epilogue's contract); with residual (never with out_pre; it may
 * be out) the output is residual + x + bias. */
#define GEMV_MAX_ROWS 4
#define GEMV_WARPS 8

template <typename T, int ROWS>
__global__ void __launch_bounds__(32 * GEMV_WARPS)
    gemv_kernel(T *out, T *out_pre, const T *__restrict__ inp, const T *__restrict__ weight,
                const T *__restrict__ bias, const T *residual, int C, int OC) {
    typedef gpc_pack<T> P;
    int lane = threadIdx.x & 31;
    int o = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (o >= OC) return;
    const P *w = (const P *)(weight + (int64_t)o * C);
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++)
        acc[r] = 0.0f;
#pragma unroll 4
    for (int p = lane; p < C / P::n; p += 32) {
        P wp = w[p];
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            P xp = ((const P *)(inp + (int64_t)r * C))[p];
#pragma unroll
            for (int k = 0; k < P::n; k++)
                acc[r] += gpc_to_f32(wp.v[k]) * gpc_to_f32(xp.v[k]);
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        float v = gpc_warp_sum(acc[r]) + (bias ? gpc_to_f32(bias[o]) : 0.0f);
        if (lane != 0) continue;
        if (residual) v += gpc_to_f32(residual[(int64_t)r * OC + o]);
        if (out_pre) {
            out_pre[(int64_t)r * OC + o] = gpc_from_f32<T>(v);
            v = gpc_gelu(gpc_to_f32(gpc_from_f32<T>(v))); /* GELU of the stored x */
        }
        out[(int64_t)r * OC + o] = gpc_from_f32<T>(v);
    }
}

/* Whether a product of N rows runs as gemv_kernel: a handful of rows, bf16
 * or f16 throughout (f32 keeps cuBLASLt's exact path that the tests check at
 * 1e-5), whole 16-byte packs. */
static int gemv_fits(int64_t N, int64_t C, const gpc_tensor *out, const gpc_tensor *inp,
                     const gpc_tensor *weight, const gpc_tensor *bias, const gpc_tensor *out_pre) {
    gpc_dtype t = out->dtype;
    return N >= 1 && N <= GEMV_MAX_ROWS && t != GPC_F32 && inp->dtype == t && weight->dtype == t &&
           (!bias || !bias->data || bias->dtype == t) && C % 8 == 0 &&
           gpc_cuda_aligned16(inp->data) && gpc_cuda_aligned16(weight->data) &&
           (!out_pre || out_pre->dtype == t);
}

static gpc_status gemv(gpc_tensor *out, gpc_tensor *out_pre, const gpc_tensor *inp,
                       const gpc_tensor *weight, const gpc_tensor *bias, const gpc_tensor *residual,
                       int N, int C, int OC) {
    unsigned grid = gpc_cuda_blocks(OC, GEMV_WARPS);
    GPC_CUDA_DISPATCH(out->dtype, E, {
        E *o = (E *)out->data, *pre = out_pre ? (E *)out_pre->data : NULL;
        const E *x = (const E *)inp->data, *w = (const E *)weight->data;
        const E *b = bias && bias->data ? (const E *)bias->data : NULL;
        const E *r = residual ? (const E *)residual->data : NULL;
        cudaStream_t s = gpc_cuda_stream();
        switch (N) {
        case 1:
            gemv_kernel<E, 1><<<grid, 32 * GEMV_WARPS, 0, s>>>(o, pre, x, w, b, r, C, OC);
            break;
        case 2:
            gemv_kernel<E, 2><<<grid, 32 * GEMV_WARPS, 0, s>>>(o, pre, x, w, b, r, C, OC);
            break;
        case 3:
            gemv_kernel<E, 3><<<grid, 32 * GEMV_WARPS, 0, s>>>(o, pre, x, w, b, r, C, OC);
            break;
        default:
            gemv_kernel<E, 4><<<grid, 32 * GEMV_WARPS, 0, s>>>(o, pre, x, w, b, r, C, OC);
            break;
        }
    });
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

static gpc_status check_types(const char *op, gpc_dtype a, gpc_dtype b, gpc_dtype d,
                              const char *what) {
    if (a != b || (d != a && d != GPC_F32))
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "%s on the GPU multiplies two matrices of one dtype into that dtype or "
                         "f32; %s are %s, %s -> %s: convert with gpc_op_convert",
                         op, what, gpc_dtype_name(a), gpc_dtype_name(b), gpc_dtype_name(d));
    return GPC_OK;
}

static gpc_status dims_fit(const char *op, int64_t N, int64_t C, int64_t OC) {
    if (N > 0x7fffffff || C > 0x7fffffff || OC > 0x7fffffff)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "%s: a dimension of %lld x %lld x %lld is beyond cuBLASLt's 32-bit "
                         "sizes; use smaller batches",
                         op, (long long)N, (long long)C, (long long)OC);
    return GPC_OK;
}

/* out = [residual +] inp @ weight^T [+ bias] (matmul_forward and
 * matmul_residual_forward). cuBLASLt reads the residual as its C matrix
 * (beta 1), so the sum is rounded once. */
static gpc_status forward(const char *op, gpc_tensor *out, const gpc_tensor *inp,
                          const gpc_tensor *weight, const gpc_tensor *bias,
                          const gpc_tensor *residual) {
    GPC_TRY(check_types(op, weight->dtype, inp->dtype, out->dtype, "weight, inp -> out"));
    GPC_TRY(gpc_cuda_enter(out));
    int64_t C = inp->shape[inp->ndim - 1], N = C ? gpc_tensor_numel(inp) / C : 0;
    int64_t OC = gpc_tensor_numel(weight) / (C ? C : 1);
    GPC_TRY(dims_fit(op, N, C, OC));
    if (N == 0 || OC == 0) return GPC_OK;
    if (C == 0) return gpc_error(GPC_ERR_UNSUPPORTED, "%s: inputs with 0 channels", op);
    if (gemv_fits(N, C, out, inp, weight, bias, NULL))
        return gemv(out, NULL, inp, weight, bias, residual, (int)N, (int)C, (int)OC);
    int fused = bias && bias->data && bias->dtype == out->dtype;
    GPC_TRY(lt_matmul(out->data, out->dtype, weight->data, weight->dtype, inp->data, inp->dtype,
                      fused ? bias->data : NULL, (int)OC, (int)N, (int)C, 1, 0, (int)C, (int)C,
                      (int)OC, residual ? 1.0f : 0.0f, NULL, MATMUL_NO_GELU, NULL,
                      residual ? residual->data : NULL));
    if (bias && bias->data && !fused) {
        GPC_CUDA_DISPATCH(out->dtype, E, {
            add_bias_kernel<E><<<gpc_cuda_sm_count() * 8, 256, 0, gpc_cuda_stream()>>>(
                (E *)out->data, gpc_cuda_any_of(bias), N, (int)OC);
        });
        GPC_CUDA_CHECK_LAUNCH();
    }
    return GPC_OK;
}

gpc_status gpc_cuda_matmul_forward(gpc_tensor *out, const gpc_tensor *inp, const gpc_tensor *weight,
                                   const gpc_tensor *bias) {
    return forward("matmul_forward", out, inp, weight, bias, NULL);
}

gpc_status gpc_cuda_matmul_residual_forward(gpc_tensor *out, const gpc_tensor *inp,
                                            const gpc_tensor *weight, const gpc_tensor *bias,
                                            const gpc_tensor *residual) {
    return forward("matmul_residual_forward", out, inp, weight, bias, residual);
}

gpc_status gpc_cuda_matmul_backward(gpc_tensor *dinp, gpc_tensor *dweight, gpc_tensor *dbias,
                                    const gpc_tensor *dout, const gpc_tensor *inp,
                                    const gpc_tensor *weight) {
    const char *op = "matmul_backward";
    GPC_TRY(gpc_cuda_enter(dout));
    int64_t C = inp->shape[inp->ndim - 1], N = C ? gpc_tensor_numel(inp) / C : 0;
    int64_t OC = gpc_tensor_numel(weight) / (C ? C : 1);
    GPC_TRY(dims_fit(op, N, C, OC));
    int want_dweight = dweight && dweight->data;
    if (dinp && dinp->data)
        GPC_TRY(check_types(op, weight->dtype, dout->dtype, dinp->dtype, "weight, dout -> dinp"));
    if (want_dweight)
        GPC_TRY(check_types(op, inp->dtype, dout->dtype, dweight->dtype, "inp, dout -> dweight"));
    if (N == 0 || C == 0 || OC == 0) return GPC_OK;
    if (dinp && dinp->data)
        GPC_TRY(lt_matmul(dinp->data, dinp->dtype, weight->data, weight->dtype, dout->data,
                          dout->dtype, NULL, (int)C, (int)N, (int)OC, 0, 0, (int)C, (int)OC, (int)C,
                          0.0f, NULL));
    /* Opt-in (GPC_MATMUL_BGRAD=1): on an H200 the epilogue was slower than the
     * scalar column sum in one run and 0.04-0.07 ms faster per d12 layer than
     * the 16-byte one in another (bench/gemm_bench.c); cuBLASLt 13.1 has no
     * BGRADB algorithm with an f32 sum for GPT-2's dweight products at all
     * (bench_gemm_search's *_bgradb shapes), so there it falls back, said once. */
    static int epilogue_bgrad = -1;
    if (dbias && dbias->data && want_dweight &&
        gpc_cuda_setting_flag("GPC_MATMUL_BGRAD", &epilogue_bgrad)) {
        /* First choice: the bias gradient from the dweight product's epilogue
         * (cuBLASLt reads dout once for both), into f32 scratch, then added. */
        void *sums;
        GPC_TRY(gpc_cuda_scratch((size_t)OC * sizeof(float), &sums));
        gpc_status st = lt_matmul(dweight->data, dweight->dtype, inp->data, inp->dtype, dout->data,
                                  dout->dtype, NULL, (int)C, (int)OC, (int)N, 0, 1, (int)C, (int)OC,
                                  (int)C, 1.0f, (float *)sums);
        if (st == GPC_OK) return gpc_cuda_add_partial_sums(dbias, (const float *)sums, 1, (int)OC);
        if (st != GPC_ERR_UNSUPPORTED) return st;
        static int said;
        if (!said) {
            said = 1;
            gpc_log(GPC_LOG_WARN,
                    "GPC_MATMUL_BGRAD=1: %s (BGRADB for the %dx%d weight gradient): "
                    "bias gradients are column sums instead",
                    gpc_last_error(), (int)OC, (int)C);
        }
        gpc_clear_error();
    }
    if (want_dweight)
        GPC_TRY(lt_matmul(dweight->data, dweight->dtype, inp->data, inp->dtype, dout->data,
                          dout->dtype, NULL, (int)C, (int)OC, (int)N, 0, 1, (int)C, (int)OC, (int)C,
                          1.0f, NULL));
    if (dbias && dbias->data)
        GPC_TRY(gpc_cuda_add_column_sums(dbias, dout->data, dout->dtype, N, OC, OC));
    return GPC_OK;
}

gpc_status gpc_cuda_add_column_sums(const gpc_tensor *acc, const void *x, gpc_dtype dtype,
                                    int64_t N, int64_t C, int64_t ld) {
    if (N == 0 || C == 0) return GPC_OK;
    if (C > 0x7fffffff)
        return gpc_error(GPC_ERR_UNSUPPORTED, "column sums: %lld columns are too many",
                         (long long)C);
    int64_t parts = 1;
    void *partial = NULL;
    GPC_CUDA_DISPATCH(dtype, E, {
        const int P = 16 / sizeof(E);
        int vec = C % P == 0 && ld % P == 0 && gpc_cuda_aligned16(x);
        int per = vec ? P : 1;
        int col_blocks = (int)((C + 32 * per - 1) / (32 * per));
        parts = (gpc_cuda_sm_count() * 4 + col_blocks - 1) / col_blocks;
        if (parts > (N + 63) / 64) parts = (N + 63) / 64;
        if (parts < 1) parts = 1;
        int64_t rows_per = (N + parts - 1) / parts;
        parts = (N + rows_per - 1) / rows_per;
        GPC_TRY(gpc_cuda_scratch((size_t)parts * C * sizeof(float), &partial));
        dim3 grid((unsigned)col_blocks, (unsigned)parts), block(32, 8);
        if (vec)
            bias_grad_partial_kernel<E, P><<<grid, block, 0, gpc_cuda_stream()>>>(
                (float *)partial, (const E *)x, N, (int)C, ld, rows_per);
        else
            bias_grad_partial_kernel<E, 1><<<grid, block, 0, gpc_cuda_stream()>>>(
                (float *)partial, (const E *)x, N, (int)C, ld, rows_per);
    });
    GPC_CUDA_CHECK_LAUNCH();
    return gpc_cuda_add_partial_sums(acc, (const float *)partial, (int)parts, (int)C);
}

gpc_status gpc_cuda_column_sums(gpc_tensor *acc, const gpc_tensor *x, int64_t first) {
    GPC_TRY(gpc_cuda_enter(x));
    int64_t W = x->ndim ? x->shape[x->ndim - 1] : 1;
    int64_t N = W ? gpc_tensor_numel(x) / W : 0;
    const char *data = (const char *)x->data + first * (int64_t)gpc_dtype_size(x->dtype);
    return gpc_cuda_add_column_sums(acc, data, x->dtype, N, gpc_tensor_numel(acc), W);
}

/* The GELU epilogues, unless GPC_MATMUL_GELU=0 asks for the separate kernels. */
static int gelu_epilogue_enabled(void) {
    static int enabled = -1;
    return gpc_cuda_setting_flag("GPC_MATMUL_GELU", &enabled);
}

gpc_status gpc_cuda_matmul_gelu_forward(gpc_tensor *out_pre, gpc_tensor *out_gelu,
                                        const gpc_tensor *inp, const gpc_tensor *weight,
                                        const gpc_tensor *bias) {
    const char *op = "matmul_gelu_forward";
    GPC_TRY(gpc_cuda_same_dtype(op, "out_pre", out_pre, "out_gelu", out_gelu));
    GPC_TRY(gpc_cuda_enter(out_gelu));
    gpc_dtype t = out_gelu->dtype;
    int64_t C = inp->shape[inp->ndim - 1], N = C ? gpc_tensor_numel(inp) / C : 0;
    int64_t OC = gpc_tensor_numel(weight) / (C ? C : 1);
    int fuse = gelu_epilogue_enabled() && t != GPC_F32 && inp->dtype == t && weight->dtype == t &&
               (!bias || !bias->data || bias->dtype == t) && N > 0 && C > 0 && OC % 8 == 0 &&
               OC <= 0x7fffffff && N <= 0x7fffffff && C <= 0x7fffffff &&
               gpc_cuda_aligned16(out_pre->data) && gpc_cuda_aligned16(out_gelu->data);
    if (fuse && gemv_fits(N, C, out_gelu, inp, weight, bias, out_pre))
        return gemv(out_gelu, out_pre, inp, weight, bias, NULL, (int)N, (int)C, (int)OC);
    if (fuse && t == GPC_BF16) {
        gpc_status st = gpc_cuda_gemm_gelu_sm90(
            (gpc_bf16_t *)out_pre->data, (gpc_bf16_t *)out_gelu->data,
            (const gpc_bf16_t *)inp->data, (const gpc_bf16_t *)weight->data,
            bias && bias->data ? (const gpc_bf16_t *)bias->data : NULL, N, OC, C);
        if (st != GPC_ERR_UNSUPPORTED) return st;
        gpc_clear_error(); /* off, or not for this shape or GPU: cuBLASLt's epilogue */
    }
    if (fuse) {
        gpc_status st =
            lt_matmul(out_gelu->data, t, weight->data, t, inp->data, t,
                      bias && bias->data ? bias->data : NULL, (int)OC, (int)N, (int)C, 1, 0, (int)C,
                      (int)C, (int)OC, 0.0f, NULL, MATMUL_GELU_AUX, out_pre->data);
        if (st != GPC_ERR_UNSUPPORTED) return st;
        gpc_clear_error(); /* no epilogue algorithm for this shape: the two kernels */
    }
    GPC_TRY(gpc_cuda_matmul_forward(out_pre, inp, weight, bias));
    return gpc_cuda_gelu_forward(out_gelu, out_pre);
}

gpc_status gpc_cuda_matmul_backward_dgelu(gpc_tensor *dinp, gpc_tensor *dweight, gpc_tensor *dbias,
                                          gpc_tensor *dpre_bias, const gpc_tensor *dout,
                                          const gpc_tensor *inp, const gpc_tensor *weight,
                                          const gpc_tensor *gelu_inp) {
    const char *op = "matmul_backward_dgelu";
    GPC_TRY(gpc_cuda_same_dtype(op, "dinp", dinp, "gelu_inp", gelu_inp));
    GPC_TRY(gpc_cuda_enter(dout));
    gpc_dtype t = dinp->dtype;
    int64_t C = inp->shape[inp->ndim - 1], N = C ? gpc_tensor_numel(inp) / C : 0;
    int64_t OC = gpc_tensor_numel(weight) / (C ? C : 1);
    int fuse = gelu_epilogue_enabled() && t != GPC_F32 && dout->dtype == t && weight->dtype == t &&
               N > 0 && OC > 0 && C % 8 == 0 && OC <= 0x7fffffff && N <= 0x7fffffff &&
               C <= 0x7fffffff && gpc_cuda_aligned16(dinp->data) &&
               gpc_cuda_aligned16(gelu_inp->data);
    int pre_sums = dpre_bias && dpre_bias->data;
    if (fuse && t == GPC_BF16) { /* with dpre_bias summed inside the product */
        gpc_status st = gpc_cuda_gemm_dgelu_sm90(
            (gpc_bf16_t *)dinp->data, pre_sums ? dpre_bias : NULL, (const gpc_bf16_t *)dout->data,
            (const gpc_bf16_t *)weight->data, (const gpc_bf16_t *)gelu_inp->data, N, C, OC);
        if (st == GPC_OK) return gpc_cuda_matmul_backward(NULL, dweight, dbias, dout, inp, weight);
        if (st != GPC_ERR_UNSUPPORTED) return st;
        gpc_clear_error(); /* off, or not for this shape or GPU: cuBLASLt's epilogue */
    }
    gpc_status st = GPC_ERR_UNSUPPORTED;
    if (fuse) {
        /* dinp^T (C x N) = weight^T (C x OC) . dout^T (OC x N), times gelu'(gelu_inp) */
        st = lt_matmul(dinp->data, t, weight->data, t, dout->data, t, NULL, (int)C, (int)N, (int)OC,
                       0, 0, (int)C, (int)OC, (int)C, 0.0f, NULL, MATMUL_DGELU,
                       (void *)gelu_inp->data);
        if (st != GPC_ERR_UNSUPPORTED)
            GPC_TRY(st);
        else
            gpc_clear_error(); /* no epilogue algorithm for this shape: the two kernels */
    }
    if (st == GPC_OK) {
        GPC_TRY(gpc_cuda_matmul_backward(NULL, dweight, dbias, dout, inp, weight));
    } else {
        GPC_TRY(gpc_cuda_matmul_backward(dinp, dweight, dbias, dout, inp, weight));
        GPC_TRY(gpc_cuda_gelu_backward(dinp, gelu_inp, dinp));
    }
    return pre_sums ? gpc_cuda_add_column_sums(dpre_bias, dinp->data, t, N, C, C) : GPC_OK;
}
