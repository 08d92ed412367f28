/*
 * gemm_search.cu: does cuBLASLt have faster algorithms than its heuristic's
 * first choice for GPT-2 124M's matrix products? bf16 inputs and outputs, f32
 * accumulation (CUBLAS_COMPUTE_32F, f32 scale), column-major descriptions
 * built as src/cuda/matmul.cu builds them, on N tokens (65536 by default)
 * and C = 768 channels (--channels for GPT-2's larger shapes).
 * Self-contained: it calls cuBLASLt directly, not gpc.
 *
 *   bench_gemm_search [--tokens 65536] [--channels 768] [--shape NAME|all]
 *                     [--budget-s 20]
 *                     [--max-configs 400] [--finalists 20] [--runs 10]
 *                     [--warmup 2] [--warm-s 0.5] [--skip-algo ID]...
 *                     [--energy-s 0] [--energy-configs 4] [--verbose] [--list]
 *
 * For each shape (--list names them) it times, as the median of --runs runs
 * (CUDA events around each run) after --warmup untimed ones:
 *   (a) the first result of cublasLtMatmulAlgoGetHeuristic, asked as
 *       matmul.cu asks (32 MiB workspace, 256-byte alignments): what gpc runs;
 *   (b) each of the heuristic's first 16 results;
 *   (c) the best of a search of its own over cublasLtMatmulAlgoGetIds' ids,
 *       each configured from the capabilities it reports.
 * The search cannot run the whole product tiles x stages x cluster shapes x
 * split-K x swizzle (thousands of valid configurations for some ids) in a
 * budget of seconds, so it goes in two phases:
 *   1. every (id, tile, stages) with split-K 1, no swizzle, custom option 0
 *      and the first cluster shape cublasLtMatmulAlgoCheck accepts (AUTO,
 *      1x1x1, 1x2x1, 2x1x1), taken tile by tile across the ids when there are
 *      more than two thirds of --max-configs;
 *   2. around the 8 fastest of phase 1: the other stages of the same tile,
 *      swizzle 1, each cluster shape of a short list (with and without
 *      swizzle), split-K 2 and 4 with each reduction scheme the id supports,
 *      custom options 1 to 7.
 * This cuBLASLt (13.1) has no CUBLASLT_ALGO_CAP_CLUSTER_SHAPE_IDS, so cluster
 * shapes are proposed from a fixed list and AlgoCheck says which hold, as
 * NVIDIA's LtMatmulCustomFind sample does. A configuration is kept when
 * AlgoCheck accepts it with at most 32 MiB of workspace; it is screened with
 * one timed run after one untimed run (CUDA loads kernels lazily, so a first
 * run would time the load), and the --finalists fastest are timed as (a).
 * Screening stops at 60% (phase 1) and 85% (phase 2) of --budget-s; AlgoCheck
 * at 30%. A configuration that fails is reported and skipped; one that breaks
 * the CUDA context (a kernel fault) ends the program, naming it, so the run
 * can be repeated with --skip-algo.
 *
 * Correctness: the heuristic's first algorithm's output is the reference (for
 * DGELU_BGRAD without a heuristic result: DGELU's, with its row sums as the
 * bias gradient). A winner of (b) or (c) counts only when every output it
 * writes (D; aux for GELU_AUX_BIAS; the bias gradient) is within
 * max_rel_diff <= 5e-2 of the reference, where max_rel_diff is the largest
 * |out - ref| / max(|ref|, rms(ref)) over the output: bf16 rounds at 2^-8 =
 * 3.9e-3 relative, so two correct summation orders differ by ~1e-2 at most,
 * and the rms floor keeps sums that nearly cancel from counting as errors.
 * Otherwise the next fastest is checked.
 *
 * Output: indented detail lines for each shape, then one line
 *   SEARCH shape=NAME heuristic_algos=K heuristic_ms=T best_top16_ms=T
 *          best_full_ms=T gain=G tflops=F best=SOURCE algo=.. tile=..
 *          stages=.. splitK=.. reduction=.. swizzle=.. custom=.. cluster=..
 *          max_rel_diff=..
 * where gain = heuristic_ms / the fastest checked time of (a), (b) and (c),
 * tflops = 2mnk over that time, SOURCE says which set it came from, and the
 * configuration printed is the full search's best. "none" marks a figure
 * that does not exist (no heuristic result; nothing passed the check).
 *
 * Energy (--energy-s S > 0). A GPU held at its power limit (an H200 at 700 W
 * runs GPT-2's training step there) takes as long for a product as the
 * product's energy allows, so a configuration that is faster alone may gain
 * nothing in the step. This mode runs, back to back for S seconds each after
 * a settling run of S/4 (at most 1 s): the heuristic's pick, the
 * --energy-configs fastest checked ones of (b) and of (c), and the heuristic's
 * pick again. NVML's energy counter gives millijoules a call, and wall time
 * over the calls the time a call takes at the clock the power allows. Then
 *   ENERGY shape=NAME heuristic_mj=E heuristic_ms=T drift=D best_mj=E
 *          best_ms=T gain_energy=G gain_time=G best=SOURCE algo=.. ...
 * where the heuristic's figures are the mean of its two runs, drift is the
 * second over the first (how much the GPU's state moved meanwhile), and best
 * is the configuration with the least energy a call.
 */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gpc/energy.h"
#include "gpc/nvml.h"

#include <algorithm>
#include <string>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>

#define WORKSPACE_BYTES ((size_t)32 << 20) /* matmul.cu's: NVIDIA's advice for Hopper */
#define ALIGNMENT_BYTES 256u               /* cudaMalloc's, which matmul.cu passes on */
#define HEURISTIC_RESULTS 16
#define MAX_ALGO_IDS 1024
#define MAX_RUNS 64
#define MAX_SKIPPED 32
#define SEEDS 8             /* phase 2 explores around this many of phase 1's fastest */
#define MAX_CUSTOM_OPTION 7 /* custom options tried in phase 2: 1 to this */
#define CHECK_LIMIT 5e-2    /* the largest max_rel_diff a winner may have */
#define GPT2_C 768          /* GPT-2 124M's channels, the default --channels */
#define GPT2_VP 50304       /* its vocabulary, padded as gpc pads it */

/* Names of cuBLASLt's tile, stages and cluster-shape ids, generated from the
 * enums of cublasLt.h in cuBLAS 13.1; an id beyond them prints as #id. */
static const char *const tile_names[] = {
    "undefined", "8x8",     "8x16",    "16x8",    "8x32",    "16x16",   "32x8",    "8x64",
    "16x32",     "32x16",   "64x8",    "32x32",   "32x64",   "64x32",   "32x128",  "64x64",
    "128x32",    "64x128",  "128x64",  "64x256",  "128x128", "256x64",  "64x512",  "128x256",
    "256x128",   "512x64",  "64x96",   "96x64",   "96x128",  "128x160", "160x128", "192x128",
    "128x192",   "128x96",  "32x256",  "256x32",  "8x128",   "8x192",   "8x256",   "8x320",
    "8x384",     "8x448",   "8x512",   "8x576",   "8x640",   "8x704",   "8x768",   "16x64",
    "16x128",    "16x192",  "16x256",  "16x320",  "16x384",  "16x448",  "16x512",  "16x576",
    "16x640",    "16x704",  "16x768",  "24x64",   "24x128",  "24x192",  "24x256",  "24x320",
    "24x384",    "24x448",  "24x512",  "24x576",  "24x640",  "24x704",  "24x768",  "32x192",
    "32x320",    "32x384",  "32x448",  "32x512",  "32x576",  "32x640",  "32x704",  "32x768",
    "40x64",     "40x128",  "40x192",  "40x256",  "40x320",  "40x384",  "40x448",  "40x512",
    "40x576",    "40x640",  "40x704",  "40x768",  "48x64",   "48x128",  "48x192",  "48x256",
    "48x320",    "48x384",  "48x448",  "48x512",  "48x576",  "48x640",  "48x704",  "48x768",
    "56x64",     "56x128",  "56x192",  "56x256",  "56x320",  "56x384",  "56x448",  "56x512",
    "56x576",    "56x640",  "56x704",  "56x768",  "64x192",  "64x320",  "64x384",  "64x448",
    "64x576",    "64x640",  "64x704",  "64x768",  "72x64",   "72x128",  "72x192",  "72x256",
    "72x320",    "72x384",  "72x448",  "72x512",  "72x576",  "72x640",  "80x64",   "80x128",
    "80x192",    "80x256",  "80x320",  "80x384",  "80x448",  "80x512",  "80x576",  "88x64",
    "88x128",    "88x192",  "88x256",  "88x320",  "88x384",  "88x448",  "88x512",  "96x192",
    "96x256",    "96x320",  "96x384",  "96x448",  "96x512",  "104x64",  "104x128", "104x192",
    "104x256",   "104x320", "104x384", "104x448", "112x64",  "112x128", "112x192", "112x256",
    "112x320",   "112x384", "120x64",  "120x128", "120x192", "120x256", "120x320", "120x384",
    "128x320",   "128x384", "136x64",  "136x128", "136x192", "136x256", "136x320", "144x64",
    "144x128",   "144x192", "144x256", "144x320", "152x64",  "152x128", "152x192", "152x256",
    "152x320",   "160x64",  "160x192", "160x256", "168x64",  "168x128", "168x192", "168x256",
    "176x64",    "176x128", "176x192", "176x256", "184x64",  "184x128", "184x192", "184x256",
    "192x64",    "192x192", "192x256", "200x64",  "200x128", "200x192", "208x64",  "208x128",
    "208x192",   "216x64",  "216x128", "216x192", "224x64",  "224x128", "224x192", "232x64",
    "232x128",   "232x192", "240x64",  "240x128", "240x192", "248x64",  "248x128", "248x192",
    "256x192",   "264x64",  "264x128", "272x64",  "272x128", "280x64",  "280x128", "288x64",
    "288x128",   "296x64",  "296x128", "304x64",  "304x128", "312x64",  "312x128", "320x64",
    "320x128",   "328x64",  "328x128", "336x64",  "336x128", "344x64",  "344x128", "352x64",
    "352x128",   "360x64",  "360x128", "368x64",  "368x128", "376x64",  "376x128", "384x64",
    "384x128",   "392x64",  "400x64",  "408x64",  "416x64",  "424x64",  "432x64",  "440x64",
    "448x64",    "456x64",  "464x64",  "472x64",  "480x64",  "488x64",  "496x64",  "504x64",
    "520x64",    "528x64",  "536x64",  "544x64",  "552x64",  "560x64",  "568x64",  "576x64",
    "584x64",    "592x64",  "600x64",  "608x64",  "616x64",  "624x64",  "632x64",  "640x64",
    "648x64",    "656x64",  "664x64",  "672x64",  "680x64",  "688x64",  "696x64",  "704x64",
    "712x64",    "720x64",  "728x64",  "736x64",  "744x64",  "752x64",  "760x64",  "768x64",
    "64x16",     "64x24",   "64x40",   "64x48",   "64x56",   "64x72",   "64x80",   "64x88",
    "64x104",    "64x112",  "64x120",  "64x136",  "64x144",  "64x152",  "64x160",  "64x168",
    "64x176",    "64x184",  "64x200",  "64x208",  "64x216",  "64x224",  "64x232",  "64x240",
    "64x248",    "64x264",  "64x272",  "64x280",  "64x288",  "64x296",  "64x304",  "64x312",
    "64x328",    "64x336",  "64x344",  "64x352",  "64x360",  "64x368",  "64x376",  "64x392",
    "64x400",    "64x408",  "64x416",  "64x424",  "64x432",  "64x440",  "64x456",  "64x464",
    "64x472",    "64x480",  "64x488",  "64x496",  "64x504",  "64x520",  "64x528",  "64x536",
    "64x544",    "64x552",  "64x560",  "64x568",  "64x584",  "64x592",  "64x600",  "64x608",
    "64x616",    "64x624",  "64x632",  "64x648",  "64x656",  "64x664",  "64x672",  "64x680",
    "64x688",    "64x696",  "64x712",  "64x720",  "64x728",  "64x736",  "64x744",  "64x752",
    "64x760",    "128x8",   "128x16",  "128x24",  "128x40",  "128x48",  "128x56",  "128x72",
    "128x80",    "128x88",  "128x104", "128x112", "128x120", "128x136", "128x144", "128x152",
    "128x168",   "128x176", "128x184", "128x200", "128x208", "128x216", "128x224", "128x232",
    "128x240",   "128x248", "128x264", "128x272", "128x280", "128x288", "128x296", "128x304",
    "128x312",   "128x328", "128x336", "128x344", "128x352", "128x360", "128x368", "128x376",
    "128x392",   "128x400", "128x408", "128x416", "128x424", "128x432", "128x440", "128x448",
    "128x456",   "128x464", "128x472", "128x480", "128x488", "128x496", "128x504", "128x512",
    "192x8",     "192x16",  "192x24",  "192x32",  "192x40",  "192x48",  "192x56",  "192x72",
    "192x80",    "192x88",  "192x96",  "192x104", "192x112", "192x120", "192x136", "192x144",
    "192x152",   "192x160", "192x168", "192x176", "192x184", "192x200", "192x208", "192x216",
    "192x224",   "192x232", "192x240", "192x248", "192x264", "192x272", "192x280", "192x288",
    "192x296",   "192x304", "192x312", "192x320", "192x328", "192x336", "256x8",   "256x16",
    "256x24",    "256x40",  "256x48",  "256x56",  "256x72",  "256x80",  "256x88",  "256x96",
    "256x104",   "256x112", "256x120", "256x136", "256x144", "256x152", "256x160", "256x168",
    "256x176",   "256x184", "256x200", "256x208", "256x216", "256x224", "256x232", "256x240",
    "256x248",   "256x256", "320x8",   "320x16",  "320x24",  "320x32",  "320x40",  "320x48",
    "320x56",    "320x72",  "320x80",  "320x88",  "320x96",  "320x104", "320x112", "320x120",
    "320x136",   "320x144", "320x152", "320x160", "320x168", "320x176", "320x184", "320x192",
    "320x200",   "384x8",   "384x16",  "384x24",  "384x32",  "384x40",  "384x48",  "384x56",
    "384x72",    "384x80",  "384x88",  "384x96",  "384x104", "384x112", "384x120", "384x136",
    "384x144",   "384x152", "384x160", "384x168", "448x8",   "448x16",  "448x24",  "448x32",
    "448x40",    "448x48",  "448x56",  "448x72",  "448x80",  "448x88",  "448x96",  "448x104",
    "448x112",   "448x120", "448x128", "448x136", "448x144", "512x8",   "512x16",  "512x24",
    "512x32",    "512x40",  "512x48",  "512x56",  "512x72",  "512x80",  "512x88",  "512x96",
    "512x104",   "512x112", "512x120", "512x128", "576x8",   "576x16",  "576x24",  "576x32",
    "576x40",    "576x48",  "576x56",  "576x72",  "576x80",  "576x88",  "576x96",  "576x104",
    "576x112",   "640x8",   "640x16",  "640x24",  "640x32",  "640x40",  "640x48",  "640x56",
    "640x72",    "640x80",  "640x88",  "640x96",  "704x8",   "704x16",  "704x24",  "704x32",
    "704x40",    "704x48",  "704x56",  "704x72",  "704x80",  "704x88",  "768x8",   "768x16",
    "768x24",    "768x32",  "768x40",  "768x48",  "768x56",  "768x72",  "768x80",  "256x512",
    "256x1024",  "512x512", "512x1024"};
static const char *const stages_names[] = {
    "undefined", "16x1",    "16x2",    "16x3",    "16x4",     "16x5",     "16x6",    "32x1",
    "32x2",      "32x3",    "32x4",    "32x5",    "32x6",     "64x1",     "64x2",    "64x3",
    "64x4",      "64x5",    "64x6",    "128x1",   "128x2",    "128x3",    "128x4",   "128x5",
    "128x6",     "32x10",   "8x4",     "16x10",   "8x5",      "",         "",        "8x3",
    "8xAUTO",    "16xAUTO", "32xAUTO", "64xAUTO", "128xAUTO", "256xAUTO", "768xAUTO"};
static const char *const cluster_names[] = {
    "AUTO",   "",       "1x1x1",  "2x1x1",  "4x1x1",  "1x2x1",  "2x2x1",  "4x2x1",  "1x4x1",
    "2x4x1",  "4x4x1",  "8x1x1",  "1x8x1",  "8x2x1",  "2x8x1",  "16x1x1", "1x16x1", "3x1x1",
    "5x1x1",  "6x1x1",  "7x1x1",  "9x1x1",  "10x1x1", "11x1x1", "12x1x1", "13x1x1", "14x1x1",
    "15x1x1", "3x2x1",  "5x2x1",  "6x2x1",  "7x2x1",  "1x3x1",  "2x3x1",  "3x3x1",  "4x3x1",
    "5x3x1",  "3x4x1",  "1x5x1",  "2x5x1",  "3x5x1",  "1x6x1",  "2x6x1",  "1x7x1",  "2x7x1",
    "1x9x1",  "1x10x1", "1x11x1", "1x12x1", "1x13x1", "1x14x1", "1x15x1"};

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

static const char *id_name(const char *const *table, size_t count, unsigned id, char *buf,
                           size_t size) {
    if (id < count && table[id][0]) return table[id];
    snprintf(buf, size, "#%u", id);
    return buf;
}

/* ------------------------------------------------------------ errors */

static int lt_ok(cublasStatus_t st, const char *call, int line) {
    if (st == CUBLAS_STATUS_SUCCESS) return 1;
    fprintf(stderr, "bench_gemm_search: %s failed (line %d): %s: %s\n", call, line,
            cublasLtGetStatusName(st), cublasLtGetStatusString(st));
    return 0;
}

static int cuda_ok(cudaError_t e, const char *call, int line) {
    if (e == cudaSuccess) return 1;
    fprintf(stderr, "bench_gemm_search: %s failed (line %d): %s: %s\n", call, line,
            cudaGetErrorName(e), cudaGetErrorString(e));
    return 0;
}

#define LT_OK(call) lt_ok((call), #call, __LINE__)
#define CUDA_OK(call) cuda_ok((call), #call, __LINE__)

/* After a CUDA error in a configuration's run: clears it and returns 1 if it
 * was an ordinary error; returns 0 when the context is lost (a kernel fault:
 * every later call would fail too). */
static int cuda_recover(void) {
    cudaGetLastError();
    if (cudaDeviceSynchronize() == cudaSuccess) return 1;
    cudaGetLastError();
    return cudaDeviceSynchronize() == cudaSuccess;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------ kernels */

__device__ __forceinline__ float to_f32(__nv_bfloat16 x) {
    return __bfloat162float(x);
}
__device__ __forceinline__ float to_f32(float x) {
    return x;
}
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16(x);
}
template <> __device__ __forceinline__ float from_f32<float>(float x) {
    return x;
}

/* A uniform number in [-1, 1) from element i and a seed (splitmix64). */
__device__ __forceinline__ float uniform_pm1(uint64_t i, uint64_t seed) {
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull + 1;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

template <typename T> __global__ void fill_kernel(T *x, int64_t count, uint64_t seed, float scale) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
        x[i] = from_f32<T>(scale * uniform_pm1((uint64_t)i, seed));
}

/* What the comparison gathers; the maxima are float bits (non-negative
 * floats order as their bits, so atomicMax on them is a float maximum). */
typedef struct {
    double ref_sumsq;
    unsigned int ref_max;
    unsigned int rel_max;
    unsigned long long nonfinite;
} diff_stats;

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The reference's sum of squares and largest magnitude (blocks of whole warps). */
template <typename R> __global__ void ref_stats_kernel(diff_stats *s, const R *ref, int64_t count) {
    double sq = 0.0;
    float mx = 0.0f;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        float r = to_f32(ref[i]);
        if (!isfinite(r)) continue;
        sq += (double)r * r;
        mx = fmaxf(mx, fabsf(r));
    }
    sq = warp_sum(sq);
    mx = warp_max(mx);
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(&s->ref_sumsq, sq);
        atomicMax(&s->ref_max, __float_as_uint(mx));
    }
}

/* max |out - ref| / max(|ref|, floor), and the count of NaN or Inf on either side. */
template <typename O, typename R>
__global__ void rel_diff_kernel(diff_stats *s, const O *out, const R *ref, int64_t count,
                                float floor_value) {
    float mx = 0.0f;
    unsigned long long bad = 0;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        float a = to_f32(out[i]), b = to_f32(ref[i]);
        if (!isfinite(a) || !isfinite(b)) {
            bad++;
            continue;
        }
        mx = fmaxf(mx, fabsf(a - b) / fmaxf(fabsf(b), floor_value));
    }
    mx = warp_max(mx);
    if (bad) atomicAdd(&s->nonfinite, bad);
    if ((threadIdx.x & 31) == 0) atomicMax(&s->rel_max, __float_as_uint(mx));
}

/* sums[i] += the sum of row i of the column-major m x n matrix d over this
 * block's columns: DGELU_BGRAD's bias gradient, from DGELU's output. */
__global__ void row_sums_kernel(float *sums, const __nv_bfloat16 *d, int m, int64_t n,
                                int64_t cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= m) return;
    int64_t j0 = (int64_t)blockIdx.y * cols, j1 = j0 + cols < n ? j0 + cols : n;
    float s = 0.0f;
    for (int64_t j = j0; j < j1; j++)
        s += __bfloat162float(d[(int64_t)i + j * m]);
    atomicAdd(&sums[i], s);
}

/* ------------------------------------------------------------ the shapes */

typedef enum { BIAS_NONE, BIAS_BF16, BGRAD_F32, BGRAD_BF16 } bias_kind;
typedef enum { AUX_NONE, AUX_OUT, AUX_IN } aux_kind;
typedef enum { BUF_BF16, BUF_F32 } buf_type;

/* D (m x n, ld m) = op(A) op(B) + beta D, column-major, as matmul.cu's
 * lt_matmul describes it; aux is m x n with ld m, the bias m long. */
typedef struct {
    const char *name, *what;
    int m, n, k, transa, transb;
    float beta;
    cublasLtEpilogue_t epilogue;
    bias_kind bias;
    aux_kind aux;
} gemm_shape;

#define SHAPE_COUNT 20

static void gpt2_shapes(gemm_shape *s, int N, int C) {
    const gemm_shape list[SHAPE_COUNT] = {
        {"fc_fwd", "fc forward: out^T (4C x N) = W^T' (4C x C) . inp^T (C x N), GELU_AUX_BIAS",
         4 * C, N, C, 1, 0, 0.0f, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, BIAS_BF16, AUX_OUT},
        {"fcproj_dinp_dgelu",
         "fcproj backward dinp: dinp^T (4C x N) = W (4C x C) . dout^T (C x N), DGELU", 4 * C, N, C,
         0, 0, 0.0f, CUBLASLT_EPILOGUE_DGELU, BIAS_NONE, AUX_IN},
        {"fcproj_dinp_dgelu_bgrad_f32",
         "fcproj backward dinp, DGELU_BGRAD, f32 bias gradient (BIAS_DATA_TYPE = CUDA_R_32F)",
         4 * C, N, C, 0, 0, 0.0f, CUBLASLT_EPILOGUE_DGELU_BGRAD, BGRAD_F32, AUX_IN},
        {"fcproj_dinp_dgelu_bgrad_bf16",
         "fcproj backward dinp, DGELU_BGRAD, bf16 bias gradient (BIAS_DATA_TYPE not set)", 4 * C, N,
         C, 0, 0, 0.0f, CUBLASLT_EPILOGUE_DGELU_BGRAD, BGRAD_BF16, AUX_IN},
        {"qkv_fwd", "qkv forward: out^T (3C x N) = W^T' (3C x C) . inp^T (C x N), BIAS", 3 * C, N,
         C, 1, 0, 0.0f, CUBLASLT_EPILOGUE_BIAS, BIAS_BF16, AUX_NONE},
        {"attproj_fwd", "attproj forward: out^T (C x N) = W^T' (C x C) . inp^T (C x N), BIAS", C, N,
         C, 1, 0, 0.0f, CUBLASLT_EPILOGUE_BIAS, BIAS_BF16, AUX_NONE},
        {"qkv_dweight", "qkv backward dweight: dW^T (C x 3C) += inp^T (C x N) . dout (N x 3C)", C,
         3 * C, N, 0, 1, 1.0f, CUBLASLT_EPILOGUE_DEFAULT, BIAS_NONE, AUX_NONE},
        {"fcproj_dinp", "fcproj backward dinp without epilogue (the DGELU shapes' reference)",
         4 * C, N, C, 0, 0, 0.0f, CUBLASLT_EPILOGUE_DEFAULT, BIAS_NONE, AUX_NONE},
        {"fcproj_fwd", "fcproj forward: out^T (C x N) = W^T' (C x 4C) . inp^T (4C x N), BIAS", C, N,
         4 * C, 1, 0, 0.0f, CUBLASLT_EPILOGUE_BIAS, BIAS_BF16, AUX_NONE},
        {"qkv_dinp", "qkv backward dinp: dinp^T (C x N) = W (C x 3C) . dout^T (3C x N)", C, N,
         3 * C, 0, 0, 0.0f, CUBLASLT_EPILOGUE_DEFAULT, BIAS_NONE, AUX_NONE},
        {"attproj_dinp", "attproj backward dinp: dinp^T (C x N) = W (C x C) . dout^T (C x N)", C, N,
         C, 0, 0, 0.0f, CUBLASLT_EPILOGUE_DEFAULT, BIAS_NONE, AUX_NONE},
        {"attproj_dweight",
         "attproj backward dweight: dW^T (C x C) += inp^T (C x N) . dout (N x C)", C, C, N, 0, 1,
         1.0f, CUBLASLT_EPILOGUE_DEFAULT, BIAS_NONE, AUX_NONE},
        {"fcproj_dweight",
         "fcproj backward dweight: dW^T (4C x C) += inp^T (4C x N) . dout (N x C)", 4 * C, C, N, 0,
         1, 1.0f, CUBLASLT_EPILOGUE_DEFAULT, BIAS_NONE, AUX_NONE},
        {"fc_dinp", "fc backward dinp: dinp^T (C x N) = W (C x 4C) . dout^T (4C x N)", C, N, 4 * C,
         0, 0, 0.0f, CUBLASLT_EPILOGUE_DEFAULT, BIAS_NONE, AUX_NONE},
        {"fc_dweight", "fc backward dweight: dW^T (C x 4C) += inp^T (C x N) . dout (N x 4C)", C,
         4 * C, N, 0, 1, 1.0f, CUBLASLT_EPILOGUE_DEFAULT, BIAS_NONE, AUX_NONE},
        {"fc_dweight_bgradb",
         "fc backward dweight with the bias gradient (BGRADB, f32): db (4C) = column sums of dout",
         C, 4 * C, N, 0, 1, 1.0f, CUBLASLT_EPILOGUE_BGRADB, BGRAD_F32, AUX_NONE},
        {"qkv_dweight_bgradb",
         "qkv backward dweight with the bias gradient (BGRADB, f32): db (3C) = column sums of dout",
         C, 3 * C, N, 0, 1, 1.0f, CUBLASLT_EPILOGUE_BGRADB, BGRAD_F32, AUX_NONE},
        {"classifier_fwd", "output head: logits^T (V x N) = wte^T' (V x C) . lnf^T (C x N)",
         GPT2_VP, N, C, 1, 0, 0.0f, CUBLASLT_EPILOGUE_DEFAULT, BIAS_NONE, AUX_NONE},
        {"classifier_dinp", "output head dinp: dlnf^T (C x N) = wte (C x V) . dlogits^T (V x N)", C,
         N, GPT2_VP, 0, 0, 0.0f, CUBLASLT_EPILOGUE_DEFAULT, BIAS_NONE, AUX_NONE},
        {"classifier_dweight",
         "output head dweight: dwte^T (C x V) += lnf^T (C x N) . dlogits (N x V)", C, GPT2_VP, N, 0,
         1, 1.0f, CUBLASLT_EPILOGUE_DEFAULT, BIAS_NONE, AUX_NONE},
    };
    for (int i = 0; i < SHAPE_COUNT; i++)
        s[i] = list[i];
}

static const char *epilogue_name(cublasLtEpilogue_t e) {
    switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT:
        return "DEFAULT";
    case CUBLASLT_EPILOGUE_BIAS:
        return "BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
        return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU:
        return "DGELU";
    case CUBLASLT_EPILOGUE_DGELU_BGRAD:
        return "DGELU_BGRAD";
    case CUBLASLT_EPILOGUE_BGRADB:
        return "BGRADB";
    default:
        return "other";
    }
}

static int epilogue_uses_bias(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
           e == CUBLASLT_EPILOGUE_DGELU_BGRAD || e == CUBLASLT_EPILOGUE_BGRADB;
}

/* The bias's length: one per row of D (m), but BGRADB's gradient has one per
 * column of op(B) (n). */
static size_t bias_length(const gemm_shape *s) {
    return (size_t)(s->epilogue == CUBLASLT_EPILOGUE_BGRADB ? s->n : s->m);
}

/* ------------------------------------------------------------ the problem */

typedef struct {
    int tokens, channels;
    const char *shape;
    double budget_s, warm_s;
    int max_configs, finalists, runs, warmup;
    int skip[MAX_SKIPPED], nskip;
    int verbose;
    double energy_s; /* > 0: each pick's energy, run back to back this long */
    int energy_configs;
} options;

/* What every shape shares: the handle, the stream, cuBLASLt's workspace. */
typedef struct {
    const options *opt;
    cublasLtHandle_t handle;
    cudaStream_t stream;
    void *workspace;
    diff_stats *stats; /* device */
    cudaEvent_t start[MAX_RUNS], stop[MAX_RUNS];
    int cluster_launch; /* the GPU launches thread-block clusters (Hopper) */
    gpc_nvml *nvml;     /* with --energy-s: NVML, and the GPU's index in it */
    int nvml_index;
} bench;

/* One shape's descriptors and buffers. */
typedef struct {
    bench *b;
    const gemm_shape *shape;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    void *a, *bmat, *d, *d_init, *d_ref, *aux, *aux_ref, *bias, *bias_ref;
    size_t d_bytes;
    buf_type bias_ref_type;
    int have_ref;
} problem;

static void *device_alloc(size_t bytes, const char *what) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        fprintf(stderr,
                "bench_gemm_search: no room for %s (%.1f MiB) on the GPU (%s); try a smaller "
                "--tokens\n",
                what, (double)bytes / (1 << 20), cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

template <typename T>
static int fill(void *x, int64_t count, uint64_t seed, float scale, cudaStream_t s) {
    fill_kernel<T><<<1024, 256, 0, s>>>((T *)x, count, seed, scale);
    return CUDA_OK(cudaGetLastError());
}

/* The operation descriptor for the shape with this epilogue (the shape's
 * own, or DGELU for the reference of DGELU_BGRAD), pointers set as
 * matmul.cu sets them. */
static int make_desc(const problem *p, cublasLtEpilogue_t epilogue, cublasLtMatmulDesc_t *out) {
    const gemm_shape *s = p->shape;
    cublasLtMatmulDesc_t desc = NULL;
    cublasOperation_t opa = s->transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = s->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    int ok = LT_OK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) &&
             LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa,
                                                  sizeof opa)) &&
             LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb,
                                                  sizeof opb)) &&
             LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                  sizeof epilogue));
    if (ok && s->bias != BIAS_NONE && epilogue_uses_bias(epilogue)) {
        const void *bias = p->bias;
        ok = LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                  sizeof bias));
        if (ok && s->bias == BGRAD_F32) {
            cudaDataType_t f32 = CUDA_R_32F;
            ok = LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                      &f32, sizeof f32));
        }
    }
    if (ok && s->aux != AUX_NONE) {
        void *aux = p->aux;
        int64_t ldaux = s->m;
        ok = LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                  &aux, sizeof aux)) &&
             LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                  &ldaux, sizeof ldaux));
    }
    if (!ok) {
        if (desc) cublasLtMatmulDescDestroy(desc);
        return 0;
    }
    *out = desc;
    return 1;
}

static void problem_free(problem *p) {
    void *bufs[] = {p->a,   p->bmat,    p->d,    p->d_init,  p->d_ref,
                    p->aux, p->aux_ref, p->bias, p->bias_ref};
    for (size_t i = 0; i < COUNT_OF(bufs); i++)
        if (bufs[i]) cudaFree(bufs[i]);
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->ld) cublasLtMatrixLayoutDestroy(p->ld);
}

/* Buffers filled with uniform numbers scaled so that each product term
 * has variance 1/k and the output is of order 1: A in [-1, 1), B in
 * +-sqrt(3/k); the bias in [-1, 1); DGELU's pre-activation in [-3, 3). */
static int problem_init(problem *p, bench *b, const gemm_shape *s) {
    memset(p, 0, sizeof *p);
    p->b = b;
    p->shape = s;
    const size_t m = (size_t)s->m, n = (size_t)s->n, k = (size_t)s->k, bf = 2;
    size_t bias_bytes = bias_length(s) * (s->bias == BGRAD_F32 ? 4 : 2);
    p->d_bytes = m * n * bf;
    if (!(p->a = device_alloc(m * k * bf, "A")) || !(p->bmat = device_alloc(k * n * bf, "B")) ||
        !(p->d = device_alloc(p->d_bytes, "D")) ||
        !(p->d_ref = device_alloc(p->d_bytes, "the reference D")))
        return 0;
    if (s->beta != 0.0f && !(p->d_init = device_alloc(p->d_bytes, "D's starting values"))) return 0;
    if (s->aux != AUX_NONE && !(p->aux = device_alloc(m * n * bf, "aux"))) return 0;
    if (s->aux == AUX_OUT && !(p->aux_ref = device_alloc(m * n * bf, "the reference aux")))
        return 0;
    if (s->bias != BIAS_NONE && !(p->bias = device_alloc(bias_bytes, "the bias"))) return 0;
    if ((s->bias == BGRAD_F32 || s->bias == BGRAD_BF16) &&
        !(p->bias_ref = device_alloc(bias_length(s) * 4, "the reference bias gradient")))
        return 0;

    cudaStream_t st = b->stream;
    if (!fill<__nv_bfloat16>(p->a, (int64_t)(m * k), 1, 1.0f, st) ||
        !fill<__nv_bfloat16>(p->bmat, (int64_t)(k * n), 2, sqrtf(3.0f / (float)k), st) ||
        !fill<__nv_bfloat16>(p->d, (int64_t)(m * n), 3, 1.0f, st))
        return 0;
    if (p->d_init &&
        !CUDA_OK(cudaMemcpyAsync(p->d_init, p->d, p->d_bytes, cudaMemcpyDeviceToDevice, st)))
        return 0;
    if (s->aux == AUX_IN && !fill<__nv_bfloat16>(p->aux, (int64_t)(m * n), 4, 3.0f, st)) return 0;
    if (s->bias == BIAS_BF16 && !fill<__nv_bfloat16>(p->bias, (int64_t)m, 5, 1.0f, st)) return 0;
    if (!CUDA_OK(cudaStreamSynchronize(st))) return 0;

    int lda = s->transa ? s->k : s->m, ldb = s->transb ? s->n : s->k;
    return LT_OK(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, lda, s->transa ? s->m : s->k,
                                            lda)) &&
           LT_OK(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, ldb, s->transb ? s->k : s->n,
                                            ldb)) &&
           LT_OK(cublasLtMatrixLayoutCreate(&p->ld, CUDA_R_16BF, s->m, s->n, s->m)) &&
           make_desc(p, s->epilogue, &p->desc);
}

/* D = op(A) op(B) + beta D with this descriptor and algorithm; C is D, as in matmul.cu. */
static cublasStatus_t run_once(const problem *p, cublasLtMatmulDesc_t desc,
                               const cublasLtMatmulAlgo_t *algo) {
    float alpha = 1.0f, beta = p->shape->beta;
    return cublasLtMatmul(p->b->handle, desc, &alpha, p->a, p->la, p->bmat, p->lb, &beta, p->d,
                          p->ld, p->d, p->ld, algo, p->b->workspace, WORKSPACE_BYTES, p->b->stream);
}

/* Times algo: `warmup` untimed runs, then `runs` runs each between its own
 * pair of events; *ms gets their median. Returns 0; -1 when the algorithm
 * failed (reported under `label`, to be skipped); -2 when it broke the CUDA
 * context. */
static int time_algo(const problem *p, const cublasLtMatmulAlgo_t *algo, int warmup, int runs,
                     float *ms, const char *label) {
    bench *b = p->b;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    cudaError_t e = cudaSuccess;
    for (int w = 0; w < warmup && st == CUBLAS_STATUS_SUCCESS; w++)
        st = run_once(p, p->desc, algo);
    for (int r = 0; r < runs && st == CUBLAS_STATUS_SUCCESS && e == cudaSuccess; r++) {
        e = cudaEventRecord(b->start[r], b->stream);
        st = run_once(p, p->desc, algo);
        if (e == cudaSuccess) e = cudaEventRecord(b->stop[r], b->stream);
    }
    cudaError_t sync = cudaStreamSynchronize(b->stream);
    if (e == cudaSuccess) e = sync;
    if (st != CUBLAS_STATUS_SUCCESS || e != cudaSuccess) {
        fprintf(stderr, "  skipped %s: %s\n", label,
                e != cudaSuccess ? cudaGetErrorString(e) : cublasLtGetStatusName(st));
        return cuda_recover() ? -1 : -2;
    }
    float t[MAX_RUNS];
    for (int r = 0; r < runs; r++)
        if (!CUDA_OK(cudaEventElapsedTime(&t[r], b->start[r], b->stop[r]))) return -1;
    std::sort(t, t + runs);
    *ms = runs % 2 ? t[runs / 2] : 0.5f * (t[runs / 2 - 1] + t[runs / 2]);
    return 0;
}

/* Runs algo for about `seconds` so that the clocks have ramped up before
 * anything is timed. */
static void warm_gpu(const problem *p, const cublasLtMatmulAlgo_t *algo, double seconds) {
    double end = now_s() + seconds;
    while (now_s() < end) {
        for (int i = 0; i < 8; i++)
            if (run_once(p, p->desc, algo) != CUBLAS_STATUS_SUCCESS) return;
        if (cudaStreamSynchronize(p->b->stream) != cudaSuccess) {
            cuda_recover();
            return;
        }
    }
}

/* ------------------------------------------------------------ comparison */

/* max_rel_diff of out against ref (count elements; see the file's comment),
 * or a negative number on a CUDA error; NaN or Inf on either side counts as
 * infinitely wrong. */
static double max_rel_diff(const problem *p, const void *out, buf_type ot, const void *ref,
                           buf_type rt, int64_t count) {
    bench *b = p->b;
    diff_stats h;
    const int grid = 1024, block = 256;
    if (!CUDA_OK(cudaMemsetAsync(b->stats, 0, sizeof h, b->stream))) return -1.0;
    if (rt == BUF_BF16)
        ref_stats_kernel<<<grid, block, 0, b->stream>>>(b->stats, (const __nv_bfloat16 *)ref,
                                                        count);
    else
        ref_stats_kernel<<<grid, block, 0, b->stream>>>(b->stats, (const float *)ref, count);
    if (!CUDA_OK(cudaGetLastError()) ||
        !CUDA_OK(cudaMemcpyAsync(&h, b->stats, sizeof h, cudaMemcpyDeviceToHost, b->stream)) ||
        !CUDA_OK(cudaStreamSynchronize(b->stream)))
        return -1.0;
    float rms = (float)sqrt(h.ref_sumsq / (double)(count > 0 ? count : 1));
    if (!(rms > 1e-30f)) rms = 1e-30f;
    if (ot == BUF_BF16 && rt == BUF_BF16)
        rel_diff_kernel<<<grid, block, 0, b->stream>>>(b->stats, (const __nv_bfloat16 *)out,
                                                       (const __nv_bfloat16 *)ref, count, rms);
    else if (ot == BUF_F32 && rt == BUF_F32)
        rel_diff_kernel<<<grid, block, 0, b->stream>>>(b->stats, (const float *)out,
                                                       (const float *)ref, count, rms);
    else if (ot == BUF_BF16 && rt == BUF_F32)
        rel_diff_kernel<<<grid, block, 0, b->stream>>>(b->stats, (const __nv_bfloat16 *)out,
                                                       (const float *)ref, count, rms);
    else
        rel_diff_kernel<<<grid, block, 0, b->stream>>>(b->stats, (const float *)out,
                                                       (const __nv_bfloat16 *)ref, count, rms);
    if (!CUDA_OK(cudaGetLastError()) ||
        !CUDA_OK(cudaMemcpyAsync(&h, b->stats, sizeof h, cudaMemcpyDeviceToHost, b->stream)) ||
        !CUDA_OK(cudaStreamSynchronize(b->stream)))
        return -1.0;
    if (h.nonfinite) return INFINITY;
    float rel;
    memcpy(&rel, &h.rel_max, sizeof rel);
    return rel;
}

static int restore_d(const problem *p) {
    if (!p->d_init) return 1; /* beta 0: D is not read */
    return CUDA_OK(
        cudaMemcpyAsync(p->d, p->d_init, p->d_bytes, cudaMemcpyDeviceToDevice, p->b->stream));
}

static buf_type bias_type(const gemm_shape *s) {
    return s->bias == BGRAD_F32 ? BUF_F32 : BUF_BF16;
}

/* The reference outputs: the heuristic's first algorithm's (ref_algo), or,
 * for DGELU_BGRAD when there is none, DGELU's D with its row sums as the
 * bias gradient. Returns 1 when there is a reference. */
static int make_reference(problem *p, const cublasLtMatmulAlgo_t *ref_algo) {
    const gemm_shape *s = p->shape;
    cudaStream_t st = p->b->stream;
    const size_t m = (size_t)s->m, n = (size_t)s->n;
    cublasLtMatmulDesc_t desc = p->desc;
    cublasLtMatmulAlgo_t algo;
    if (ref_algo) {
        algo = *ref_algo;
    } else if (s->epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
        if (!make_desc(p, CUBLASLT_EPILOGUE_DGELU, &desc)) return 0;
        cublasLtMatmulPreference_t pref = NULL;
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        size_t ws = WORKSPACE_BYTES;
        int ok = LT_OK(cublasLtMatmulPreferenceCreate(&pref)) &&
                 LT_OK(cublasLtMatmulPreferenceSetAttribute(
                     pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws)) &&
                 LT_OK(cublasLtMatmulAlgoGetHeuristic(p->b->handle, desc, p->la, p->lb, p->ld,
                                                      p->ld, pref, 1, &res, &found)) &&
                 found > 0;
        if (pref) cublasLtMatmulPreferenceDestroy(pref);
        if (!ok) {
            cublasLtMatmulDescDestroy(desc);
            printf("  reference: none (no DGELU algorithm either)\n");
            return 0;
        }
        algo = res.algo;
    } else {
        printf("  reference: none, so no configuration can be checked\n");
        return 0;
    }
    int ok = restore_d(p) && LT_OK(run_once(p, desc, &algo)) &&
             CUDA_OK(cudaMemcpyAsync(p->d_ref, p->d, p->d_bytes, cudaMemcpyDeviceToDevice, st));
    if (ok && p->aux_ref)
        ok = CUDA_OK(cudaMemcpyAsync(p->aux_ref, p->aux, m * n * 2, cudaMemcpyDeviceToDevice, st));
    if (ok && p->bias_ref && ref_algo) {
        p->bias_ref_type = bias_type(s);
        ok = CUDA_OK(cudaMemcpyAsync(p->bias_ref, p->bias,
                                     bias_length(s) * (s->bias == BGRAD_F32 ? 4 : 2),
                                     cudaMemcpyDeviceToDevice, st));
    } else if (ok && p->bias_ref) {
        p->bias_ref_type = BUF_F32;
        int64_t cols = (int64_t)((n + 255) / 256);
        ok = CUDA_OK(cudaMemsetAsync(p->bias_ref, 0, m * 4, st));
        if (ok) {
            dim3 grid((unsigned)((m + 255) / 256), 256);
            row_sums_kernel<<<grid, 256, 0, st>>>(
                (float *)p->bias_ref, (const __nv_bfloat16 *)p->d_ref, s->m, (int64_t)n, cols);
            ok = CUDA_OK(cudaGetLastError());
        }
    }
    ok = ok && CUDA_OK(cudaStreamSynchronize(st));
    if (desc != p->desc) cublasLtMatmulDescDestroy(desc);
    if (!ok) {
        cuda_recover();
        printf("  reference: failed to run, so no configuration can be checked\n");
        return 0;
    }
    printf("  reference: %s\n", ref_algo ? "the heuristic's first algorithm"
                                         : "DGELU's heuristic algorithm, row sums for the bias "
                                           "gradient");
    return 1;
}

/* Runs algo once from the starting D and compares everything it writes with
 * the reference; returns the largest max_rel_diff (INFINITY when it failed
 * or there is no reference) and prints the parts under `label`. */
static double check_algo(const problem *p, const cublasLtMatmulAlgo_t *algo, const char *label) {
    const gemm_shape *s = p->shape;
    const int64_t mn = (int64_t)s->m * s->n;
    if (!p->have_ref) return INFINITY;
    if (!restore_d(p)) return INFINITY;
    cublasStatus_t st = run_once(p, p->desc, algo);
    if (st != CUBLAS_STATUS_SUCCESS || cudaStreamSynchronize(p->b->stream) != cudaSuccess) {
        printf("  check %s: the run failed (%s)\n", label, cublasLtGetStatusName(st));
        cuda_recover();
        return INFINITY;
    }
    double d = max_rel_diff(p, p->d, BUF_BF16, p->d_ref, BUF_BF16, mn), aux = 0.0, bias = 0.0;
    if (p->aux_ref) aux = max_rel_diff(p, p->aux, BUF_BF16, p->aux_ref, BUF_BF16, mn);
    if (p->bias_ref)
        bias = max_rel_diff(p, p->bias, bias_type(s), p->bias_ref, p->bias_ref_type,
                            (int64_t)bias_length(s));
    if (d < 0.0 || aux < 0.0 || bias < 0.0) return INFINITY;
    printf("  check %s: max_rel_diff D %.3g", label, d);
    if (p->aux_ref) printf(", aux %.3g", aux);
    if (p->bias_ref) printf(", bias gradient %.3g", bias);
    double worst = std::max(d, std::max(aux, bias));
    printf("%s\n", worst <= CHECK_LIMIT ? "" : " (FAILED)");
    return worst;
}

/* ------------------------------------------------------------ configurations */

typedef struct {
    cublasLtMatmulAlgo_t algo;
    int32_t id, splitk;
    uint32_t tile, stages, reduction, swizzle, custom;
    uint16_t cluster, inner;
    size_t workspace;
    float waves;
    float screen_ms, ms; /* negative: not timed, or failed */
} algo_config;

/* What an algorithm structure says of itself (the heuristic's results). */
static void config_read(algo_config *c) {
    const cublasLtMatmulAlgo_t *a = &c->algo;
    size_t w = 0;
    c->id = -1, c->splitk = 1;
    c->tile = c->stages = c->reduction = c->swizzle = c->custom = 0;
    c->cluster = c->inner = 0;
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_ID, &c->id, sizeof c->id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &c->tile, sizeof c->tile,
                                         &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &c->stages,
                                         sizeof c->stages, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &c->splitk,
                                         sizeof c->splitk, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &c->reduction,
                                         sizeof c->reduction, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &c->swizzle,
                                         sizeof c->swizzle, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &c->custom,
                                         sizeof c->custom, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &c->cluster,
                                         sizeof c->cluster, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &c->inner,
                                         sizeof c->inner, &w);
}

/* c->algo = base (as cublasLtMatmulAlgoInit left it) with c's settings. */
static int config_apply(algo_config *c, const cublasLtMatmulAlgo_t *base) {
    cublasLtMatmulAlgo_t *a = &c->algo;
    *a = *base;
    return LT_OK(cublasLtMatmulAlgoConfigSetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &c->tile,
                                                      sizeof c->tile)) &&
           LT_OK(cublasLtMatmulAlgoConfigSetAttribute(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &c->stages,
                                                      sizeof c->stages)) &&
           LT_OK(cublasLtMatmulAlgoConfigSetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                                      &c->splitk, sizeof c->splitk)) &&
           LT_OK(cublasLtMatmulAlgoConfigSetAttribute(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                      &c->reduction, sizeof c->reduction)) &&
           LT_OK(cublasLtMatmulAlgoConfigSetAttribute(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING,
                                                      &c->swizzle, sizeof c->swizzle)) &&
           LT_OK(cublasLtMatmulAlgoConfigSetAttribute(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION,
                                                      &c->custom, sizeof c->custom)) &&
           LT_OK(cublasLtMatmulAlgoConfigSetAttribute(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                                      &c->cluster, sizeof c->cluster));
}

/* Whether cublasLtMatmulAlgoCheck accepts c for the problem within the workspace. */
static int config_check(const problem *p, algo_config *c) {
    cublasLtMatmulHeuristicResult_t r;
    memset(&r, 0, sizeof r);
    if (cublasLtMatmulAlgoCheck(p->b->handle, p->desc, p->la, p->lb, p->ld, p->ld, &c->algo, &r) !=
            CUBLAS_STATUS_SUCCESS ||
        r.workspaceSize > WORKSPACE_BYTES)
        return 0;
    c->workspace = r.workspaceSize;
    c->waves = r.wavesCount;
    return 1;
}

static int config_same(const algo_config *a, const algo_config *b) {
    return a->id == b->id && a->tile == b->tile && a->stages == b->stages &&
           a->splitk == b->splitk && a->reduction == b->reduction && a->swizzle == b->swizzle &&
           a->custom == b->custom && a->cluster == b->cluster;
}

/* "algo=ID tile=.. stages=.. splitK=.. reduction=.. swizzle=.. custom=.. cluster=..". */
static const char *config_describe(const algo_config *c, char *buf, size_t size) {
    char t[16], s[16], cl[16];
    snprintf(buf, size,
             "algo=%d tile=%s stages=%s splitK=%d reduction=%u swizzle=%u custom=%u cluster=%s",
             c->id, id_name(tile_names, COUNT_OF(tile_names), c->tile, t, sizeof t),
             id_name(stages_names, COUNT_OF(stages_names), c->stages, s, sizeof s), c->splitk,
             c->reduction, c->swizzle, c->custom,
             id_name(cluster_names, COUNT_OF(cluster_names), c->cluster, cl, sizeof cl));
    return buf;
}

static double tflops(const gemm_shape *s, double ms) {
    return 2.0 * s->m * s->n * (double)s->k / (ms * 1e-3) / 1e12;
}

static void print_timed(const problem *p, const char *what, const algo_config *c) {
    char desc[256];
    printf("  %-9s %9.4f ms %7.1f TFLOPS  %s inner=%u ws=%zuKiB waves=%.2f\n", what, c->ms,
           tflops(p->shape, c->ms), config_describe(c, desc, sizeof desc), c->inner,
           c->workspace >> 10, c->waves);
}

/* The heuristic's first `want` results, asked as matmul.cu asks. */
static int heuristic(const problem *p, int want, std::vector<algo_config> *out,
                     cublasStatus_t *status) {
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res[HEURISTIC_RESULTS];
    size_t ws = WORKSPACE_BYTES;
    uint32_t align = ALIGNMENT_BYTES;
    int found = 0;
    *status = CUBLAS_STATUS_SUCCESS;
    if (!LT_OK(cublasLtMatmulPreferenceCreate(&pref))) return 0;
    int ok =
        LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &ws, sizeof ws)) &&
        LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                   &align, sizeof align)) &&
        LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                   &align, sizeof align)) &&
        LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                   &align, sizeof align)) &&
        LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                   &align, sizeof align));
    if (ok) {
        *status = cublasLtMatmulAlgoGetHeuristic(p->b->handle, p->desc, p->la, p->lb, p->ld, p->ld,
                                                 pref, want, res, &found);
        if (*status != CUBLAS_STATUS_SUCCESS) found = 0;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    for (int i = 0; i < found; i++) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
        algo_config c = {};
        c.algo = res[i].algo;
        config_read(&c);
        c.workspace = res[i].workspaceSize;
        c.waves = res[i].wavesCount;
        c.screen_ms = c.ms = -1.0f;
        out->push_back(c);
    }
    return (int)out->size();
}

/* ------------------------------------------------------------ the search */

/* What an algorithm id offers (cublasLtMatmulAlgoCapGetAttribute). */
typedef struct {
    int id;
    cublasLtMatmulAlgo_t base; /* as cublasLtMatmulAlgoInit left it */
    std::vector<uint32_t> tiles, stages;
    int32_t splitk, custom_max;
    uint32_t reduction_mask, swizzle;
} algo_caps;

/* An id list capability (tiles, stages); {0} (UNDEFINED: the algorithm
 * picks) when it lists none. */
static std::vector<uint32_t> cap_ids(const cublasLtMatmulAlgo_t *algo,
                                     cublasLtMatmulAlgoCapAttributes_t attr) {
    std::vector<uint32_t> ids;
    size_t bytes = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(algo, attr, NULL, 0, &bytes) == CUBLAS_STATUS_SUCCESS &&
        bytes >= sizeof(uint32_t)) {
        ids.resize(bytes / sizeof(uint32_t));
        if (cublasLtMatmulAlgoCapGetAttribute(algo, attr, ids.data(), ids.size() * sizeof(uint32_t),
                                              &bytes) != CUBLAS_STATUS_SUCCESS)
            ids.clear();
    }
    if (ids.empty()) ids.push_back(0);
    return ids;
}

static void cap_value(const cublasLtMatmulAlgo_t *algo, cublasLtMatmulAlgoCapAttributes_t attr,
                      void *value, size_t size) {
    size_t w = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(algo, attr, value, size, &w) != CUBLAS_STATUS_SUCCESS)
        memset(value, 0, size);
}

typedef struct {
    int ids, usable;
    long checks1, valid1, checks2, valid2;
    int screened1, screened2, failed, finalists;
    int checks_cut, screen_cut;
} search_counts;

/* Screens c: one untimed run, one timed. 0, -1 (failed), -2 (context lost). */
static int screen(const problem *p, algo_config *c, search_counts *n, int phase) {
    char label[256];
    config_describe(c, label, sizeof label);
    int r = time_algo(p, &c->algo, 1, 1, &c->screen_ms, label);
    if (r == -2)
        fprintf(stderr,
                "bench_gemm_search: %s broke the CUDA context; rerun with --skip-algo %d "
                "(and --shape %s)\n",
                label, c->id, p->shape->name);
    if (r < 0) {
        n->failed++;
        return r;
    }
    if (p->b->opt->verbose) printf("  screen%d %9.4f ms  %s\n", phase, c->screen_ms, label);
    return 0;
}

static int skipped(const options *o, int id) {
    for (int i = 0; i < o->nskip; i++)
        if (o->skip[i] == id) return 1;
    return 0;
}

/* The cluster shapes phase 1 tries in turn for each (id, tile, stages), and
 * those phase 2 tries around a seed (Hopper's common ones: at most 8 CTAs). */
static const uint16_t cluster_first[] = {CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_1x1x1,
                                         CUBLASLT_CLUSTER_SHAPE_1x2x1,
                                         CUBLASLT_CLUSTER_SHAPE_2x1x1};
static const uint16_t cluster_variants[] = {
    CUBLASLT_CLUSTER_SHAPE_AUTO,  CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
    CUBLASLT_CLUSTER_SHAPE_1x2x1, CUBLASLT_CLUSTER_SHAPE_2x2x1, CUBLASLT_CLUSTER_SHAPE_4x1x1,
    CUBLASLT_CLUSTER_SHAPE_1x4x1, CUBLASLT_CLUSTER_SHAPE_2x4x1, CUBLASLT_CLUSTER_SHAPE_4x2x1};

/* Phase 2's neighbours of seed: one setting changed at a time (and swizzle
 * with each cluster shape). */
static void neighbours(const bench *b, const algo_caps *cap, const algo_config *seed,
                       std::vector<algo_config> *out) {
    algo_config v;
    for (uint32_t st : cap->stages)
        if (st != seed->stages) v = *seed, v.stages = st, out->push_back(v);
    if (cap->swizzle) v = *seed, v.swizzle = 1, out->push_back(v);
    if (b->cluster_launch)
        for (uint16_t cl : cluster_variants) {
            if (cl == seed->cluster) continue;
            v = *seed, v.cluster = cl, out->push_back(v);
            if (cap->swizzle) v.swizzle = 1, out->push_back(v);
        }
    if (cap->splitk)
        for (int32_t k : {2, 4})
            for (uint32_t r = 1; r < (uint32_t)CUBLASLT_REDUCTION_SCHEME_MASK; r <<= 1)
                if (cap->reduction_mask & r)
                    v = *seed, v.splitk = k, v.reduction = r, out->push_back(v);
    for (int32_t cu = 1; cu <= std::min(cap->custom_max, (int32_t)MAX_CUSTOM_OPTION); cu++)
        v = *seed, v.custom = (uint32_t)cu, out->push_back(v);
}

static bool by_screen(const algo_config &a, const algo_config &b) {
    return a.screen_ms < b.screen_ms;
}
static bool by_median(const algo_config &a, const algo_config &b) {
    return a.ms < b.ms;
}

/* The full search (see the file's comment). *finals gets the finalists,
 * fastest first. Returns 0, or -2 when a configuration broke the context. */
static int full_search(const problem *p, std::vector<algo_config> *finals, search_counts *n) {
    const options *o = p->b->opt;
    const double t0 = now_s(), budget = o->budget_s;
    memset(n, 0, sizeof *n);

    int ids[MAX_ALGO_IDS], nids = 0;
    if (!LT_OK(cublasLtMatmulAlgoGetIds(p->b->handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF,
                                        CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, MAX_ALGO_IDS, ids,
                                        &nids)))
        return 0;
    n->ids = nids;
    std::vector<algo_caps> caps;
    for (int i = 0; i < nids; i++) {
        algo_caps c;
        c.id = ids[i];
        if (skipped(o, c.id) ||
            cublasLtMatmulAlgoInit(p->b->handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF,
                                   CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, c.id,
                                   &c.base) != CUBLAS_STATUS_SUCCESS)
            continue;
        c.tiles = cap_ids(&c.base, CUBLASLT_ALGO_CAP_TILE_IDS);
        c.stages = cap_ids(&c.base, CUBLASLT_ALGO_CAP_STAGES_IDS);
        cap_value(&c.base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &c.splitk, sizeof c.splitk);
        cap_value(&c.base, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &c.reduction_mask,
                  sizeof c.reduction_mask);
        cap_value(&c.base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &c.swizzle, sizeof c.swizzle);
        cap_value(&c.base, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &c.custom_max, sizeof c.custom_max);
        caps.push_back(c);
    }
    n->usable = (int)caps.size();

    /* Phase 1: (id, tile, stages), tile by tile across the ids so that a cut
     * (budget or count) leaves every id its first tiles. */
    typedef struct {
        algo_config c;
        int rank, tile, algo; /* rank: the how-manieth valid stages of its tile */
    } candidate;
    std::vector<candidate> cands;
    size_t max_tiles = 0;
    for (const algo_caps &c : caps)
        max_tiles = std::max(max_tiles, c.tiles.size());
    size_t nclusters = p->b->cluster_launch ? COUNT_OF(cluster_first) : 1;
    for (size_t t = 0; t < max_tiles && !n->checks_cut; t++)
        for (size_t a = 0; a < caps.size() && !n->checks_cut; a++) {
            const algo_caps *cap = &caps[a];
            if (t >= cap->tiles.size()) continue;
            int rank = 0;
            for (uint32_t st : cap->stages) {
                if (now_s() - t0 > 0.3 * budget) {
                    n->checks_cut = 1;
                    break;
                }
                for (size_t ci = 0; ci < nclusters; ci++) {
                    candidate cd = {};
                    cd.c.id = cap->id, cd.c.tile = cap->tiles[t], cd.c.stages = st;
                    cd.c.splitk = 1, cd.c.cluster = cluster_first[ci];
                    cd.c.screen_ms = cd.c.ms = -1.0f;
                    n->checks1++;
                    if (!config_apply(&cd.c, &cap->base) || !config_check(p, &cd.c)) continue;
                    cd.rank = rank++, cd.tile = (int)t, cd.algo = (int)a;
                    cands.push_back(cd);
                    break;
                }
            }
        }
    n->valid1 = (long)cands.size();
    std::stable_sort(cands.begin(), cands.end(), [](const candidate &x, const candidate &y) {
        if (x.rank != y.rank) return x.rank < y.rank;
        if (x.tile != y.tile) return x.tile < y.tile;
        return x.algo < y.algo;
    });
    const int cap1 = std::max(1, o->max_configs - o->max_configs / 3);
    std::vector<algo_config> screened;
    for (size_t i = 0; i < cands.size() && n->screened1 < cap1; i++) {
        if (now_s() - t0 > 0.6 * budget) {
            n->screen_cut = 1;
            break;
        }
        int r = screen(p, &cands[i].c, n, 1);
        if (r == -2) return -2;
        if (r == 0) screened.push_back(cands[i].c), n->screened1++;
    }

    /* Phase 2: the neighbours of phase 1's fastest. */
    std::sort(screened.begin(), screened.end(), by_screen);
    std::vector<algo_config> seeds(screened.begin(),
                                   screened.begin() + std::min((size_t)SEEDS, screened.size()));
    std::vector<algo_config> tried(screened);
    for (const algo_config &seed : seeds) {
        const algo_caps *cap = NULL;
        for (const algo_caps &c : caps)
            if (c.id == seed.id) cap = &c;
        if (!cap) continue;
        std::vector<algo_config> vs;
        neighbours(p->b, cap, &seed, &vs);
        for (algo_config &v : vs) {
            if (n->screened1 + n->screened2 >= o->max_configs) break;
            if (now_s() - t0 > 0.85 * budget) {
                n->screen_cut = 1;
                break;
            }
            int seen = 0;
            for (const algo_config &t : tried)
                if (config_same(&t, &v)) seen = 1;
            if (seen) continue;
            tried.push_back(v);
            n->checks2++;
            if (!config_apply(&v, &cap->base) || !config_check(p, &v)) continue;
            n->valid2++;
            int r = screen(p, &v, n, 2);
            if (r == -2) return -2;
            if (r == 0) screened.push_back(v), n->screened2++;
        }
    }

    /* The finalists, timed as the heuristic's results are. */
    std::sort(screened.begin(), screened.end(), by_screen);
    for (size_t i = 0; i < screened.size() && (int)i < o->finalists; i++) {
        algo_config c = screened[i];
        char label[256];
        config_describe(&c, label, sizeof label);
        int r = time_algo(p, &c.algo, o->warmup, o->runs, &c.ms, label);
        if (r == -2) {
            fprintf(stderr,
                    "bench_gemm_search: %s broke the CUDA context; rerun with --skip-algo %d\n",
                    label, c.id);
            return -2;
        }
        if (r == 0) finals->push_back(c);
    }
    std::sort(finals->begin(), finals->end(), by_median);
    n->finalists = (int)finals->size();
    printf("  search: %d ids, %d usable; phase 1: %ld checked, %ld valid, %d screened%s; "
           "phase 2: %ld checked, %ld valid, %d screened; %d failed; %d finalists; %.1f s\n",
           n->ids, n->usable, n->checks1, n->valid1, n->screened1,
           n->checks_cut ? " (checks cut by the budget)" : "", n->checks2, n->valid2, n->screened2,
           n->failed, n->finalists, now_s() - t0);
    if (n->screen_cut) printf("  search: screening stopped at the time budget (--budget-s)\n");
    return 0;
}

/* The index of the fastest of list (sorted by median) that passes the check,
 * or -1; *rel gets its max_rel_diff. */
static int first_checked(const problem *p, const std::vector<algo_config> &list, const char *set,
                         double *rel) {
    for (size_t i = 0; i < list.size(); i++) {
        char label[300];
        snprintf(label, sizeof label, "%s #%zu", set, i);
        double r = check_algo(p, &list[i].algo, label);
        if (r <= CHECK_LIMIT) {
            *rel = r;
            return (int)i;
        }
    }
    return -1;
}

/* ------------------------------------------------------------ energy */

/* One configuration run back to back, as the training step runs it at the
 * GPU's power limit: wall time and energy a call from NVML's counter. */
typedef struct {
    long calls;
    double ms, mj, watts;
    int mhz, capped; /* SM clock, and the power cap's clocks-event reason, at the end */
} sustained;

/* What gpc_energy_sustain's callbacks need: the shape and the
 * configuration to run. */
typedef struct {
    const problem *p;
    const cublasLtMatmulAlgo_t *algo;
} sustain_call;

static gpc_status sustain_run(void *ctx) {
    const sustain_call *c = (const sustain_call *)ctx;
    cublasStatus_t st = run_once(c->p, c->p->desc, c->algo);
    if (st == CUBLAS_STATUS_SUCCESS) return GPC_OK;
    return gpc_error(GPC_ERR_DEVICE, "cublasLtMatmul: %s", cublasLtGetStatusName(st));
}

static gpc_status sustain_wait(void *ctx) {
    const sustain_call *c = (const sustain_call *)ctx;
    cudaError_t e = cudaStreamSynchronize(c->p->b->stream);
    if (e == cudaSuccess) return GPC_OK;
    return gpc_error(GPC_ERR_DEVICE, "cudaStreamSynchronize: %s", cudaGetErrorString(e));
}

/* Runs c back to back (gpc_energy_sustain): a quarter of `seconds` (at most
 * 1 s) so that the clock settles where this configuration's power puts it,
 * then `seconds` between two readings of the energy counter. 0 when a run
 * or NVML failed. */
static int sustain(const problem *p, const algo_config *c, double seconds, sustained *out) {
    bench *b = p->b;
    sustain_call call = {p, &c->algo};
    gpc_energy_run r;
    if (gpc_energy_sustain(b->nvml, b->nvml_index, sustain_run, sustain_wait, &call,
                           std::min(1.0, seconds / 4), seconds, &r) != GPC_OK) {
        fprintf(stderr, "bench_gemm_search: %s\n", gpc_last_error());
        return 0;
    }
    if (r.joules < 0 || r.calls == 0) return 0;
    out->calls = r.calls;
    out->ms = r.seconds * 1e3 / (double)r.calls;
    out->mj = r.joules * 1e3 / (double)r.calls;
    out->watts = r.joules / r.seconds;
    out->mhz = r.sm_clock_mhz;
    out->capped =
        r.throttle_reasons >= 0 && (r.throttle_reasons & GPC_NVML_THROTTLE_SW_POWER_CAP) != 0;
    return 1;
}

typedef struct {
    algo_config c;
    const char *set;
    sustained e;
} energy_pick;

/* Up to `want` configurations of list (sorted by time) that pass the check and
 * are not already in picks. */
static void add_checked(const problem *p, const std::vector<algo_config> &list, const char *set,
                        int want, std::vector<energy_pick> *picks) {
    int added = 0;
    for (size_t i = 0; i < list.size() && added < want; i++) {
        int seen = 0;
        for (const energy_pick &e : *picks)
            seen |= config_same(&e.c, &list[i]);
        char label[64];
        snprintf(label, sizeof label, "%s #%zu for energy", set, i);
        if (seen || check_algo(p, &list[i].algo, label) > CHECK_LIMIT) continue;
        energy_pick e = {};
        e.c = list[i], e.set = set;
        picks->push_back(e);
        added++;
    }
}

/* --energy-s: the heuristic's pick, the fastest few of its other results and
 * of the full search, each run back to back; then the heuristic's pick again,
 * which says how far the GPU drifted (temperature) meanwhile. Prints one
 * ENERGY line. */
static void energy_shape(const problem *p, const std::vector<algo_config> &top,
                         const std::vector<algo_config> &top_timed,
                         const std::vector<algo_config> &finals) {
    const options *o = p->b->opt;
    const gemm_shape *s = p->shape;
    if (top.empty() || top[0].ms <= 0) {
        printf("ENERGY shape=%s none (no heuristic pick to compare with)\n", s->name);
        return;
    }
    std::vector<energy_pick> picks;
    energy_pick h = {};
    h.c = top[0], h.set = "heuristic";
    picks.push_back(h);
    add_checked(p, top_timed, "top16", o->energy_configs, &picks);
    add_checked(p, finals, "full", o->energy_configs, &picks);
    picks.push_back(h);
    for (energy_pick &e : picks) {
        char desc[256];
        if (!sustain(p, &e.c, o->energy_s, &e.e)) {
            printf("  energy %-9s failed (a run, or NVML's energy counter)\n", e.set);
            e.e.mj = -1.0;
            cuda_recover();
            continue;
        }
        printf("  energy %-9s %8.4f ms %9.3f mJ %5.0f W %4d MHz%s %6.1f TFLOPS  %s\n", e.set,
               e.e.ms, e.e.mj, e.e.watts, e.e.mhz, e.e.capped ? " capped" : "       ",
               tflops(s, e.e.ms), config_describe(&e.c, desc, sizeof desc));
    }
    const energy_pick &first = picks.front(), &last = picks.back();
    if (first.e.mj <= 0 || last.e.mj <= 0) {
        printf("ENERGY shape=%s none (the heuristic's pick could not be measured)\n", s->name);
        return;
    }
    /* the heuristic's figure: the mean of its two runs, which bracket the rest */
    double h_mj = 0.5 * (first.e.mj + last.e.mj), h_ms = 0.5 * (first.e.ms + last.e.ms);
    const energy_pick *best = NULL;
    for (size_t i = 1; i + 1 < picks.size(); i++)
        if (picks[i].e.mj > 0 && (!best || picks[i].e.mj < best->e.mj)) best = &picks[i];
    char desc[256];
    if (best)
        config_describe(&best->c, desc, sizeof desc);
    else
        snprintf(desc, sizeof desc, "algo=none");
    printf("ENERGY shape=%s heuristic_mj=%.3f heuristic_ms=%.4f drift=%.3f best_mj=%.3f "
           "best_ms=%.4f gain_energy=%.3f gain_time=%.3f best=%s %s\n",
           s->name, h_mj, h_ms, last.e.mj / first.e.mj, best ? best->e.mj : -1.0,
           best ? best->e.ms : -1.0, best ? h_mj / best->e.mj : -1.0,
           best ? h_ms / best->e.ms : -1.0, best ? best->set : "none", desc);
    fflush(stdout);
}

/* ------------------------------------------------------------ one shape */

/* v with `decimals` decimals, or "none" when it is not positive (does not exist). */
static const char *number(char *buf, size_t size, double v, int decimals) {
    if (v > 0)
        snprintf(buf, size, "%.*f", decimals, v);
    else
        snprintf(buf, size, "none");
    return buf;
}

/* 0: done; 1: this shape could not run; 2: the CUDA context is lost. */
static int run_shape(bench *b, const gemm_shape *s) {
    const options *o = b->opt;
    problem p;
    printf("== %s: %s\n   m=%d n=%d k=%d transa=%d transb=%d beta=%g epilogue=%s, %.1f GFLOP\n",
           s->name, s->what, s->m, s->n, s->k, s->transa, s->transb, s->beta,
           epilogue_name(s->epilogue), 2.0 * s->m * s->n * (double)s->k / 1e9);
    if (!problem_init(&p, b, s)) {
        problem_free(&p);
        printf("  skipped %s: see the error above\n", s->name);
        return 1;
    }

    /* (a) and (b): the heuristic's results. */
    std::vector<algo_config> top;
    cublasStatus_t hst;
    heuristic(&p, HEURISTIC_RESULTS, &top, &hst);
    if (top.empty())
        printf("  heuristic: no algorithm (cublasLtMatmulAlgoGetHeuristic: %s)\n",
               cublasLtGetStatusName(hst));
    else
        printf("  heuristic: %zu algorithms\n", top.size());
    p.have_ref = make_reference(&p, top.empty() ? NULL : &top[0].algo);
    if (!top.empty()) warm_gpu(&p, &top[0].algo, o->warm_s);
    std::vector<algo_config> top_timed;
    float heuristic_ms = -1.0f;
    for (size_t i = 0; i < top.size(); i++) {
        char label[300], desc[256];
        snprintf(label, sizeof label, "heuristic #%zu (%s)", i,
                 config_describe(&top[i], desc, sizeof desc));
        int r = time_algo(&p, &top[i].algo, o->warmup, o->runs, &top[i].ms, label);
        if (r == -2) {
            problem_free(&p);
            return 2;
        }
        if (r < 0) continue;
        snprintf(label, sizeof label, "top16 #%zu", i);
        print_timed(&p, label, &top[i]);
        if (i == 0) heuristic_ms = top[0].ms;
        top_timed.push_back(top[i]);
    }
    std::sort(top_timed.begin(), top_timed.end(), by_median);
    double top_rel = INFINITY;
    int top_best = first_checked(&p, top_timed, "top16 by time", &top_rel);

    /* (c): the full search. */
    std::vector<algo_config> finals;
    search_counts counts;
    if (full_search(&p, &finals, &counts) == -2) {
        problem_free(&p);
        return 2;
    }
    for (size_t i = 0; i < finals.size(); i++) {
        char label[32];
        snprintf(label, sizeof label, "full #%zu", i);
        print_timed(&p, label, &finals[i]);
    }
    double full_rel = INFINITY;
    int full_best = first_checked(&p, finals, "full by time", &full_rel);

    /* The line. */
    float top_ms = top_best >= 0 ? top_timed[top_best].ms : -1.0f;
    float full_ms = full_best >= 0 ? finals[full_best].ms : -1.0f;
    float best_ms = heuristic_ms;
    const char *best = heuristic_ms > 0 ? "heuristic" : "none";
    if (top_ms > 0 && (best_ms < 0 || top_ms < best_ms)) best_ms = top_ms, best = "top16";
    if (full_ms > 0 && (best_ms < 0 || full_ms < best_ms)) best_ms = full_ms, best = "full";
    char h[32], t[32], f[32], g[32], tf[32], cfg[256], rel[32];
    number(h, sizeof h, heuristic_ms, 4);
    number(t, sizeof t, top_ms, 4);
    number(f, sizeof f, full_ms, 4);
    number(g, sizeof g, heuristic_ms > 0 && best_ms > 0 ? heuristic_ms / best_ms : -1.0, 3);
    number(tf, sizeof tf, best_ms > 0 ? tflops(s, best_ms) : -1.0, 1);
    if (full_best >= 0)
        config_describe(&finals[full_best], cfg, sizeof cfg);
    else
        snprintf(cfg, sizeof cfg, "algo=none");
    if (full_best >= 0)
        snprintf(rel, sizeof rel, "%.3g", full_rel);
    else
        snprintf(rel, sizeof rel, "none");
    printf("SEARCH shape=%s heuristic_algos=%zu heuristic_ms=%s best_top16_ms=%s best_full_ms=%s "
           "gain=%s tflops=%s best=%s %s max_rel_diff=%s\n",
           s->name, top.size(), h, t, f, g, tf, best, cfg, rel);
    if (!finals.empty() && full_best < 0)
        printf("  note: no finalist of the full search passed the check%s; the fastest, "
               "unchecked, took %.4f ms\n",
               p.have_ref ? "" : " (there is no reference to check against)", finals[0].ms);
    fflush(stdout);
    if (o->energy_s > 0) energy_shape(&p, top, top_timed, finals);
    problem_free(&p);
    return 0;
}

/* ------------------------------------------------------------ main */

static void usage(FILE *f) {
    fprintf(f,
            "usage: bench_gemm_search [--tokens N] [--channels C] [--shape NAME|all]\n"
            "                         [--budget-s S]\n"
            "                         [--max-configs N] [--finalists N] [--runs N] [--warmup N]\n"
            "                         [--warm-s S] [--skip-algo ID]... [--energy-s S]\n"
            "                         [--energy-configs N] [--verbose] [--list]\n"
            "  --tokens N       tokens in a batch (default 65536)\n"
            "  --channels C     the model's channels (default 768, GPT-2 124M; 1024, 1280\n"
            "                   and 1600 are GPT-2 350M, 774M and 1.5B)\n"
            "  --shape NAMES    shapes, comma-separated (see --list), or all (default)\n"
            "  --budget-s S     seconds of full search a shape (default 20)\n"
            "  --max-configs N  configurations screened a shape (default 400)\n"
            "  --finalists N    screened configurations timed in full (default 20)\n"
            "  --runs N         timed runs a figure, the median reported (default 10, max %d)\n"
            "  --warmup N       untimed runs before them (default 2)\n"
            "  --warm-s S       seconds of running before a shape's timings (default 0.5)\n"
            "  --skip-algo ID   leave algorithm id ID out of the search (repeatable)\n"
            "  --energy-s S     also run the picks back to back S seconds each and read their\n"
            "                   energy from NVML (default 0: off)\n"
            "  --energy-configs N  fastest checked configurations of each set so run (default 4)\n"
            "  --verbose        print every screened configuration\n",
            MAX_RUNS);
}

/* Parses a number in [lo, hi] for option `name`; 0 when it is not one. */
static int parse_num(const char *name, const char *text, double lo, double hi, double *out) {
    char *end = NULL;
    double v = text ? strtod(text, &end) : 0.0;
    if (!text || end == text || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "bench_gemm_search: %s needs a number from %.10g to %.10g, not '%s'\n",
                name, lo, hi, text ? text : "");
        return 0;
    }
    *out = v;
    return 1;
}

/* parse_num for a count: a whole number from lo to hi into *out. */
static int parse_count(const char *name, const char *text, double lo, double hi, int *out) {
    double v = 0.0;
    if (!parse_num(name, text, lo, hi, &v)) return 0;
    if (v != floor(v)) {
        fprintf(stderr, "bench_gemm_search: %s needs a whole number, not '%s'\n", name, text);
        return 0;
    }
    *out = (int)v;
    return 1;
}

static int parse_args(int argc, char **argv, options *o, int *list) {
    o->tokens = 65536, o->channels = GPT2_C, o->shape = "all", o->budget_s = 20.0, o->warm_s = 0.5;
    o->max_configs = 400, o->finalists = 20, o->runs = 10, o->warmup = 2;
    o->nskip = 0, o->verbose = 0;
    o->energy_s = 0.0, o->energy_configs = 4;
    *list = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x = 0.0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--list")) {
            *list = 1;
        } else if (!strcmp(a, "--verbose")) {
            o->verbose = 1;
        } else if (!strcmp(a, "--shape") && v) {
            o->shape = v, i++;
        } else if (!strcmp(a, "--tokens")) {
            if (!parse_count(a, v, 1, 1 << 24, &o->tokens)) return 0;
            i++;
        } else if (!strcmp(a, "--channels")) {
            if (!parse_count(a, v, 64, 1 << 16, &o->channels)) return 0;
            i++;
        } else if (!strcmp(a, "--budget-s")) {
            if (!parse_num(a, v, 0.1, 3600, &x)) return 0;
            o->budget_s = x, i++;
        } else if (!strcmp(a, "--warm-s")) {
            if (!parse_num(a, v, 0, 60, &x)) return 0;
            o->warm_s = x, i++;
        } else if (!strcmp(a, "--max-configs")) {
            if (!parse_count(a, v, 1, 100000, &o->max_configs)) return 0;
            i++;
        } else if (!strcmp(a, "--finalists")) {
            if (!parse_count(a, v, 1, 1000, &o->finalists)) return 0;
            i++;
        } else if (!strcmp(a, "--runs")) {
            if (!parse_count(a, v, 1, MAX_RUNS, &o->runs)) return 0;
            i++;
        } else if (!strcmp(a, "--warmup")) {
            if (!parse_count(a, v, 0, 1000, &o->warmup)) return 0;
            i++;
        } else if (!strcmp(a, "--energy-s")) {
            if (!parse_num(a, v, 0, 600, &x)) return 0;
            o->energy_s = x, i++;
        } else if (!strcmp(a, "--energy-configs")) {
            if (!parse_count(a, v, 0, 100, &o->energy_configs)) return 0;
            i++;
        } else if (!strcmp(a, "--skip-algo")) {
            if (o->nskip == MAX_SKIPPED) {
                fprintf(stderr, "bench_gemm_search: at most %d --skip-algo\n", MAX_SKIPPED);
                return 0;
            }
            if (!parse_count(a, v, 0, 1e9, &o->skip[o->nskip])) return 0;
            o->nskip++, i++;
        } else {
            fprintf(stderr, "bench_gemm_search: unknown option or missing value: %s\n", a);
            usage(stderr);
            return 0;
        }
    }
    return 1;
}

/* Whether `name` is one of `names` (comma-separated, or "all"). */
static int shape_selected(const char *names, const char *name) {
    if (!strcmp(names, "all")) return 1;
    size_t len = strlen(name);
    for (const char *q = names; *q;) {
        const char *end = strchr(q, ',');
        size_t n = end ? (size_t)(end - q) : strlen(q);
        if (n == len && !strncmp(q, name, len)) return 1;
        q += n + (end ? 1 : 0);
    }
    return 0;
}

int main(int argc, char **argv) {
    options o;
    int list = 0;
    if (!parse_args(argc, argv, &o, &list)) return 2;
    gemm_shape shapes[SHAPE_COUNT];
    gpt2_shapes(shapes, o.tokens, o.channels);
    if (list) {
        for (int i = 0; i < SHAPE_COUNT; i++)
            printf("%-30s %s\n", shapes[i].name, shapes[i].what);
        return 0;
    }
    /* every name given must be a shape */
    for (const char *q = o.shape; strcmp(o.shape, "all") && *q;) {
        const char *end = strchr(q, ',');
        std::string name(q, end ? (size_t)(end - q) : strlen(q));
        int known = 0;
        for (int i = 0; i < SHAPE_COUNT; i++)
            known |= name == shapes[i].name;
        if (!known) {
            fprintf(stderr, "bench_gemm_search: no shape '%s'; --list names them\n", name.c_str());
            return 2;
        }
        q += name.size() + (end ? 1 : 0);
    }

    bench b;
    memset(&b, 0, sizeof b);
    b.opt = &o;
    int dev = 0, ndev = 0, driver = 0, runtime = 0;
    cudaDeviceProp prop;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "bench_gemm_search: no CUDA GPU is visible; check nvidia-smi\n");
        return 1;
    }
    if (!CUDA_OK(cudaGetDevice(&dev)) || !CUDA_OK(cudaGetDeviceProperties(&prop, dev)) ||
        !CUDA_OK(cudaDeviceGetAttribute(&b.cluster_launch, cudaDevAttrClusterLaunch, dev)))
        return 1;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    printf("bench_gemm_search: %s (sm_%d%d, %d SMs), driver %d, runtime %d, cuBLASLt %zu; "
           "N=%d tokens, C=%d, budget %.1f s a shape, %d configurations at most\n",
           prop.name, prop.major, prop.minor, prop.multiProcessorCount, driver, runtime,
           cublasLtGetVersion(), o.tokens, o.channels, o.budget_s, o.max_configs);
    if (o.energy_s > 0) {
        char bus[32];
        if (!CUDA_OK(cudaDeviceGetPCIBusId(bus, (int)sizeof bus, dev))) return 1;
        if (gpc_nvml_open_bus_id(bus, &b.nvml, &b.nvml_index) != GPC_OK) {
            fprintf(stderr, "bench_gemm_search: --energy-s needs NVML's view of this GPU: %s\n",
                    gpc_last_error());
            return 1;
        }
    }
    if (!LT_OK(cublasLtCreate(&b.handle))) return 1;
    int ok = CUDA_OK(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking)) &&
             (b.workspace = device_alloc(WORKSPACE_BYTES, "cuBLASLt's workspace")) != NULL &&
             (b.stats = (diff_stats *)device_alloc(sizeof(diff_stats), "the comparison")) != NULL;
    for (int r = 0; ok && r < MAX_RUNS; r++)
        ok = CUDA_OK(cudaEventCreate(&b.start[r])) && CUDA_OK(cudaEventCreate(&b.stop[r]));
    int status = ok ? 0 : 1;
    for (int i = 0; ok && i < SHAPE_COUNT; i++) {
        if (!shape_selected(o.shape, shapes[i].name)) continue;
        int r = run_shape(&b, &shapes[i]);
        if (r == 1) status = 1;
        if (r == 2) {
            status = 1;
            break; /* the context is lost: nothing else can run */
        }
    }
    for (int r = 0; r < MAX_RUNS; r++) {
        if (b.start[r]) cudaEventDestroy(b.start[r]);
        if (b.stop[r]) cudaEventDestroy(b.stop[r]);
    }
    if (b.stats) cudaFree(b.stats);
    if (b.workspace) cudaFree(b.workspace);
    if (b.stream) cudaStreamDestroy(b.stream);
    cublasLtDestroy(b.handle);
    if (b.nvml) gpc_nvml_close(b.nvml);
    return status;
}
