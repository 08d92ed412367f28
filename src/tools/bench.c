/*
 * bench.c: the measurements behind `gpc bench` (gpc/bench.h): CPU GEMM
 * through OpenBLAS on every core, host memcpy, gpc's attention op on the
 * chosen device (on a GPU, gpc's kernels and cuDNN's path side by side),
 * and the GPU measurements of bench_cuda.h; then the
 * seed article's claims against what was measured, and the JSON file.
 */
#include "gpc/bench.h"

#include "ops/ops.h"
#include "tools/bench_cuda.h"

#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Normalised error a GEMM result may have in each precision: the error of an
 * entry divided by sum_k |a_ik b_kj|, so it is about the unit roundoff of
 * the inputs (tf32 10 bits, bf16 7, f16 10, fp8 e4m3 3 but the inputs are
 * already rounded) or of the output (bf16, f16), times a small factor. */
static double gemm_tolerance(gpc_gemm_precision p) {
    switch (p) {
    case GPC_GEMM_F32:
        return 1e-4;
    case GPC_GEMM_TF32:
        return 1e-2;
    case GPC_GEMM_BF16:
        return 2e-2;
    case GPC_GEMM_F16:
        return 1e-2;
    case GPC_GEMM_FP8:
        return 2e-2;
    }
    return 0;
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *values, int count) {
    qsort(values, (size_t)count, sizeof *values, compare_double);
    return count % 2 ? values[count / 2] : 0.5 * (values[count / 2 - 1] + values[count / 2]);
}

static void skip(const gpc_bench_options *o, gpc_bench_report *r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void skip(const gpc_bench_options *o, gpc_bench_report *r, const char *fmt, ...) {
    if (r->num_skipped >= GPC_BENCH_MAX_SKIPPED) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->skipped[r->num_skipped], sizeof r->skipped[0], fmt, ap);
    va_end(ap);
    if (o->on_skip) o->on_skip(r->skipped[r->num_skipped], o->user);
    r->num_skipped++;
}

static gpc_status add(const gpc_bench_options *o, gpc_bench_report *r, const char *group,
                      const char *name, const char *device, int64_t size, double seconds,
                      double work, const char *unit, double error, int ok) {
    if (r->count == r->capacity) {
        int capacity = r->capacity ? 2 * r->capacity : 64;
        gpc_bench_result *grown = realloc(r->results, (size_t)capacity * sizeof *grown);
        if (!grown) return gpc_error(GPC_ERR_NOMEM, "no memory for benchmark results");
        r->results = grown;
        r->capacity = capacity;
    }
    gpc_bench_result *x = &r->results[r->count++];
    memset(x, 0, sizeof *x);
    snprintf(x->group, sizeof x->group, "%s", group);
    snprintf(x->name, sizeof x->name, "%s", name);
    snprintf(x->device, sizeof x->device, "%s", device);
    snprintf(x->unit, sizeof x->unit, "%s", unit);
    x->size = size;
    x->seconds = seconds;
    x->work = work;
    x->rate = seconds > 0 ? work / seconds / 1e9 : 0;
    x->error = error;
    x->ok = ok;
    if (o->on_result) o->on_result(x, o->user);
    return GPC_OK;
}

void gpc_bench_report_free(gpc_bench_report *report) {
    free(report->results);
    memset(report, 0, sizeof *report);
}

static void read_cpu_name(char *out, size_t size) {
    snprintf(out, size, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            const char *colon = strchr(line, ':');
            if (colon) {
                colon++;
                while (*colon == ' ')
                    colon++;
                snprintf(out, size, "%s", colon);
                out[strcspn(out, "\n")] = 0;
            }
            break;
        }
    }
    fclose(f);
}

/* ------------------------------------------------------------- CPU GEMM */

/* Row-major C = A B of n x n f32 matrices through OpenBLAS on every core;
 * 64 sampled entries checked against float64. */
static gpc_status cpu_gemm(const gpc_bench_options *o, gpc_bench_report *r, int n, int reps) {
    size_t count = (size_t)n * n;
    float *a = malloc(count * sizeof *a), *b = malloc(count * sizeof *b);
    float *c = malloc(count * sizeof *c);
    double *times = calloc((size_t)reps, sizeof *times);
    gpc_status status = GPC_OK;
    if (!a || !b || !c || !times) {
        status = gpc_error(GPC_ERR_NOMEM, "no memory for a %d x %d GEMM", n, n);
        goto done;
    }
    gpc_rng rng;
    gpc_rng_seed(&rng, 99u + (uint64_t)n, 1);
    gpc_rng_fill_uniform(&rng, a, count, -1.0f, 1.0f);
    gpc_rng_fill_uniform(&rng, b, count, -1.0f, 1.0f);
    for (int rep = -1; rep < reps; rep++) {
        double t0 = gpc_time_seconds();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c,
                    n);
        double t = gpc_time_seconds() - t0;
        if (rep >= 0) times[rep] = t;
    }
    double worst = 0;
    for (int s = 0; s < 64; s++) {
        int i = (int)gpc_rng_below(&rng, (uint32_t)n), j = (int)gpc_rng_below(&rng, (uint32_t)n);
        double sum = 0, mag = 0;
        for (int k = 0; k < n; k++) {
            double p = (double)a[(size_t)i * n + k] * b[(size_t)k * n + j];
            sum += p;
            mag += fabs(p);
        }
        double err = fabs(c[(size_t)i * n + j] - sum) / (mag > 0 ? mag : 1);
        if (!(err <= worst)) worst = err;
    }
    status = add(o, r, "gemm", "openblas-f32", "cpu", n, median(times, reps),
                 2.0 * n * n * (double)n, "GFLOP/s", worst, worst <= gemm_tolerance(GPC_GEMM_F32));
done:
    free(a);
    free(b);
    free(c);
    free(times);
    return status;
}

static gpc_status cpu_memcpy(const gpc_bench_options *o, gpc_bench_report *r, size_t bytes,
                             int reps) {
    char *src = malloc(bytes), *dst = malloc(bytes);
    double *times = calloc((size_t)reps, sizeof *times);
    gpc_status status = GPC_OK;
    if (!src || !dst || !times) {
        status = gpc_error(GPC_ERR_NOMEM, "no memory for a %zu-byte copy", bytes);
        goto done;
    }
    memset(src, 1, bytes);
    memset(dst, 0, bytes);
    for (int rep = -1; rep < reps; rep++) {
        double t0 = gpc_time_seconds();
        memcpy(dst, src, bytes);
        double t = gpc_time_seconds() - t0;
        if (rep >= 0) times[rep] = t;
    }
    /* read + write, as the device-to-device figure counts them */
    status = add(o, r, "copy", "host-memcpy", "cpu", (int64_t)bytes, median(times, reps),
                 2.0 * (double)bytes, "GB/s", -1, dst[bytes - 1] == 1);
done:
    free(src);
    free(dst);
    free(times);
    return status;
}

/* ------------------------------------------------------------ attention */

/* gpc's attention op, forward and backward, on the device, with the d12
 * shape (12 heads of 64). Causal FLOPs: forward QK^T and PV, each
 * B*NH*T*T*hs*2 halved by the mask, = 2*B*T*T*C; backward recomputes the
 * probabilities and forms dV, dP, dQ, dK: 2.5 times that. On a GPU, path
 * names the implementation (gpc_attention_path: "gpc" or "cudnn"), which
 * also names the rows; *total gets the median forward+backward seconds. */
static gpc_status attention(const gpc_bench_options *o, gpc_bench_report *r, gpc_device device,
                            int B, int T, int reps, const char *path, double *total) {
    const int NH = 12, C = 768;
    gpc_dtype dtype = device.type == GPC_DEVICE_CPU ? GPC_F32 : GPC_BF16;
    gpc_tensor qkv = {0}, out = {0}, lse = {0}, dout = {0}, dqkv = {0}, host = {0};
    int64_t qkv_shape[3] = {B, T, 3 * C}, out_shape[3] = {B, T, C}, lse_shape[3] = {B, NH, T};
    double *fwd = calloc((size_t)reps, sizeof *fwd), *bwd = calloc((size_t)reps, sizeof *bwd);
    double *both = calloc((size_t)reps, sizeof *both);
    float *values = malloc((size_t)B * T * 3 * C * sizeof *values);
    uint16_t *half = malloc((size_t)B * T * 3 * C * sizeof *half);
    const gpc_backend *backend = NULL;
    char name[24], row[40];
    gpc_status status = GPC_OK;
    if (!path) path = "gpc";
    if (!fwd || !bwd || !both || !values || !half) {
        status = gpc_error(GPC_ERR_NOMEM, "no memory for the attention benchmark");
        goto done;
    }
    snprintf(name, sizeof name, "%s", gpc_device_name(device));
    if ((status = gpc_backend_require(device, &backend))) goto done;
    if ((status = gpc_tensor_alloc(&qkv, dtype, device, 3, qkv_shape))) goto done;
    if ((status = gpc_tensor_alloc(&dqkv, dtype, device, 3, qkv_shape))) goto done;
    if ((status = gpc_tensor_alloc(&out, dtype, device, 3, out_shape))) goto done;
    if ((status = gpc_tensor_alloc(&dout, dtype, device, 3, out_shape))) goto done;
    if ((status = gpc_tensor_alloc(&lse, GPC_F32, device, 3, lse_shape))) goto done;
    gpc_rng rng;
    gpc_rng_seed(&rng, 5, 5);
    size_t count = (size_t)B * T * 3 * C;
    gpc_rng_fill_normal(&rng, values, count, 0.0f, 1.0f);
    if (dtype == GPC_BF16)
        for (size_t i = 0; i < count; i++)
            half[i] = gpc_f32_to_bf16(values[i]);
    host = gpc_tensor_make(dtype == GPC_BF16 ? (void *)half : (void *)values, dtype, gpc_cpu(), 3,
                           qkv_shape);
    if ((status = gpc_tensor_copy(&qkv, &host))) goto done;
    host.shape[2] = C; /* the first third of the same random numbers as dout */
    if ((status = gpc_tensor_copy(&dout, &host))) goto done;
    if (device.type != GPC_DEVICE_CPU) {
        if ((status = gpc_op_set_attention_path(path))) goto done;
        /* plans (cuDNN) are built here, outside the timed repetitions */
        if ((status = gpc_op_attention_prepare(&qkv, NH, 1))) goto done;
    }
    for (int rep = -1; rep < reps; rep++) {
        double t0 = gpc_time_seconds();
        if ((status = gpc_op_attention_forward(&out, &lse, &qkv, NH))) goto done;
        if ((status = backend->synchronize(device.index))) goto done;
        double t1 = gpc_time_seconds();
        if ((status = gpc_op_attention_backward(&dqkv, &dout, &qkv, &out, &lse, NH))) goto done;
        if ((status = backend->synchronize(device.index))) goto done;
        double t2 = gpc_time_seconds();
        if (rep >= 0) {
            fwd[rep] = t1 - t0;
            bwd[rep] = t2 - t1;
            both[rep] = t2 - t0;
        }
    }
    double flops = 2.0 * B * (double)T * T * C;
    snprintf(row, sizeof row, "%s-forward", path);
    if ((status = add(o, r, "attention", row, name, T, median(fwd, reps), flops, "GFLOP/s", -1, 1)))
        goto done;
    snprintf(row, sizeof row, "%s-backward", path);
    if ((status = add(o, r, "attention", row, name, T, median(bwd, reps), 2.5 * flops, "GFLOP/s",
                      -1, 1)))
        goto done;
    if (total) *total = median(both, reps);
    if (device.type != GPC_DEVICE_CPU) {
        snprintf(row, sizeof row, "%s-fwd+bwd", path);
        status =
            add(o, r, "attention", row, name, T, median(both, reps), 3.5 * flops, "GFLOP/s", -1, 1);
    }
done:
    if (device.type != GPC_DEVICE_CPU) gpc_op_set_attention_path(NULL);
    gpc_tensor_free(&qkv);
    gpc_tensor_free(&dqkv);
    gpc_tensor_free(&out);
    gpc_tensor_free(&dout);
    gpc_tensor_free(&lse);
    free(fwd);
    free(bwd);
    free(both);
    free(values);
    free(half);
    return status;
}

/* ------------------------------------------------------------- GPU parts */

static gpc_status gpu_gemm(const gpc_bench_options *o, gpc_bench_report *r, const char *dev,
                           int cc) {
    static const int sizes_full[] = {1024, 2048, 4096, 8192}, sizes_quick[] = {512, 1024};
    const int *sizes = o->quick ? sizes_quick : sizes_full;
    int nsizes = o->quick ? 2 : 4, reps = o->quick ? 3 : 5;
    char name[40];
    for (int s = 0; s < nsizes; s++) {
        int n = sizes[s];
        for (int k = GPC_GEMM_NAIVE; k <= GPC_GEMM_CUBLAS; k++) {
            for (int p = GPC_GEMM_F32; p <= GPC_GEMM_FP8; p++) {
                if (k != GPC_GEMM_CUBLAS && p != GPC_GEMM_F32) continue;
                if (p == GPC_GEMM_FP8 && cc < 89) {
                    if (s == 0)
                        skip(o, r,
                             "gemm cublas-fp8: this GPU (compute capability %d.%d) has no "
                             "fp8 tensor cores",
                             cc / 10, cc % 10);
                    continue;
                }
                double seconds = 0, error = -1;
                snprintf(name, sizeof name, "%s-%s", gpc_gemm_kernel_name(k),
                         gpc_gemm_precision_name(p));
                gpc_status st = gpc_bench_cuda_gemm(o->gpu, k, p, n, reps, &seconds, &error);
                if (st == GPC_ERR_NOMEM) return st;
                if (st) {
                    skip(o, r, "gemm %s n=%d: %s", name, n, gpc_last_error());
                    continue;
                }
                GPC_TRY(add(o, r, "gemm", name, dev, n, seconds, 2.0 * n * n * (double)n, "GFLOP/s",
                            error, error <= gemm_tolerance(p)));
            }
        }
    }
    return GPC_OK;
}

static gpc_status gpu_copy(const gpc_bench_options *o, gpc_bench_report *r, const char *dev) {
    static const size_t sizes_full[] = {4096, 1u << 20, 16u << 20, 256u << 20};
    static const size_t sizes_quick[] = {4096, 1u << 20, 16u << 20};
    const size_t *sizes = o->quick ? sizes_quick : sizes_full;
    int nsizes = o->quick ? 3 : 4;
    char name[40];
    for (int s = 0; s < nsizes; s++) {
        size_t bytes = sizes[s];
        /* small copies are about latency: more repetitions are cheap */
        int reps = bytes <= 4096 ? 50 : o->quick ? 3 : 5;
        for (int d = GPC_COPY_H2D; d <= GPC_COPY_D2D; d++) {
            for (int m = GPC_COPY_PAGEABLE; m <= GPC_COPY_MANAGED_PREFETCH; m++) {
                if (d == GPC_COPY_D2D && m != GPC_COPY_PAGEABLE) continue;
                if (d == GPC_COPY_D2D)
                    snprintf(name, sizeof name, "d2d");
                else
                    snprintf(name, sizeof name, "%s-%s", gpc_copy_direction_name(d),
                             gpc_copy_memory_name(m));
                double seconds = 0;
                gpc_status st = gpc_bench_cuda_copy(o->gpu, m, d, bytes, reps, &seconds);
                if (st == GPC_ERR_NOMEM) return st;
                if (st) {
                    skip(o, r, "copy %s %zu bytes: %s", name, bytes, gpc_last_error());
                    continue;
                }
                /* d2d reads and writes every byte: count both, like the host memcpy */
                double work = d == GPC_COPY_D2D ? 2.0 * (double)bytes : (double)bytes;
                GPC_TRY(add(o, r, "copy", name, dev, (int64_t)bytes, seconds, work, "GB/s", -1, 1));
            }
        }
    }
    return GPC_OK;
}

static gpc_status gpu_overlap(const gpc_bench_options *o, gpc_bench_report *r, const char *dev) {
    size_t bytes = o->quick ? (32u << 20) : (256u << 20);
    int reps = o->quick ? 3 : 5;
    static const int streams[] = {1, 2, 4};
    char name[40];
    for (int i = 0; i < 3; i++) {
        double seconds = 0, error = 0;
        snprintf(name, sizeof name, "streams-%d", streams[i]);
        gpc_status st =
            gpc_bench_cuda_overlap(o->gpu, streams[i], bytes, 16, reps, &seconds, &error);
        if (st == GPC_ERR_NOMEM) return st;
        if (st) {
            skip(o, r, "overlap %s: %s", name, gpc_last_error());
            continue;
        }
        if (error != 0) {
            skip(o, r, "overlap %s: the data came back wrong (off by %g): not a measurement", name,
                 error);
            continue;
        }
        /* bytes in and bytes out through the pipeline */
        GPC_TRY(add(o, r, "overlap", name, dev, (int64_t)bytes, seconds, 2.0 * (double)bytes,
                    "GB/s", -1, 1));
    }
    return GPC_OK;
}

gpc_status gpc_bench_run(const gpc_bench_options *o, gpc_bench_report *r) {
    r->gpu = -1;
    read_cpu_name(r->cpu_name, sizeof r->cpu_name);
    /* all cores, as the issue asks: the CPU's best against the GPU's */
    openblas_set_num_threads(openblas_get_num_procs());
    r->cpu_threads = openblas_get_num_threads();

    int gpu_ok = 0, cc = 0;
    char gpu_why[256] = "";
    char dev[16];
    if (o->cuda || o->auto_device) {
        int count = gpc_bench_cuda_device_count();
        if (count <= 0) {
            snprintf(gpu_why, sizeof gpu_why, "%s", gpc_last_error());
        } else if (o->gpu < 0 || o->gpu >= count) {
            snprintf(gpu_why, sizeof gpu_why, "GPU %d does not exist: this machine has %d", o->gpu,
                     count);
        } else {
            int major = 0, minor = 0;
            size_t total = 0;
            if (gpc_bench_cuda_device_info(o->gpu, r->gpu_name, sizeof r->gpu_name, &major, &minor,
                                           &total) == GPC_OK) {
                gpu_ok = 1;
                cc = major * 10 + minor;
                r->gpu = o->gpu;
            } else {
                snprintf(gpu_why, sizeof gpu_why, "%s", gpc_last_error());
            }
        }
        if (!gpu_ok && o->cuda) return gpc_error(GPC_ERR_UNSUPPORTED, "%s", gpu_why);
    } else {
        snprintf(gpu_why, sizeof gpu_why, "--device cpu was asked");
    }
    snprintf(dev, sizeof dev, "cuda:%d", o->gpu);

    if (o->gemm) {
        static const int cpu_full[] = {256, 512, 1024, 2048}, cpu_quick[] = {64, 128, 256};
        const int *sizes = o->quick ? cpu_quick : cpu_full;
        int nsizes = o->quick ? 3 : 4;
        for (int s = 0; s < nsizes; s++)
            GPC_TRY(cpu_gemm(o, r, sizes[s], o->quick ? 3 : sizes[s] >= 2048 ? 3 : 5));
        if (gpu_ok)
            GPC_TRY(gpu_gemm(o, r, dev, cc));
        else
            skip(o, r, "gemm on the GPU (naive, tiled, cuBLAS f32/tf32/bf16/f16/fp8) not run: %s",
                 gpu_why);
    }
    if (o->copy) {
        GPC_TRY(cpu_memcpy(o, r, o->quick ? (16u << 20) : (256u << 20), o->quick ? 3 : 5));
        if (gpu_ok)
            GPC_TRY(gpu_copy(o, r, dev));
        else
            skip(o, r, "copies host<->GPU (pageable, pinned, managed) not run: %s", gpu_why);
    }
    if (o->overlap) {
        if (gpu_ok)
            GPC_TRY(gpu_overlap(o, r, dev));
        else
            skip(o, r, "overlap (copy-compute-copy on 1, 2, 4 streams) not run: %s", gpu_why);
    }
    if (o->attention) {
        gpc_status st =
            attention(o, r, gpc_cpu(), 1, o->quick ? 128 : 512, o->quick ? 2 : 3, NULL, NULL);
        if (st == GPC_ERR_NOMEM) return st;
        if (st) skip(o, r, "attention on the CPU: %s", gpc_last_error());
        if (gpu_ok) {
            /* the two GPU paths side by side: gpc's kernels, then cuDNN's
             * fused attention; the last row is their ratio (above 1: cuDNN
             * is faster), which is what auto's choice rests on */
            gpc_device gpu = {GPC_DEVICE_CUDA, o->gpu};
            int B = o->quick ? 2 : 8, reps = o->quick ? 3 : 5;
            double t_gpc = 0, t_cudnn = 0;
            st = attention(o, r, gpu, B, 1024, reps, "gpc", &t_gpc);
            if (st == GPC_ERR_NOMEM) return st;
            if (st) skip(o, r, "attention on %s: %s", dev, gpc_last_error());
            gpc_status sc = attention(o, r, gpu, B, 1024, reps, "cudnn", &t_cudnn);
            if (sc == GPC_ERR_NOMEM) return sc;
            if (sc) skip(o, r, "attention via cuDNN on %s not run: %s", dev, gpc_last_error());
            if (!st && !sc && t_cudnn > 0)
                /* work t_gpc * 1e9 over t_cudnn seconds: rate = t_gpc / t_cudnn */
                GPC_TRY(add(o, r, "attention", "gpc/cudnn-time", dev, 1024, t_cudnn, t_gpc * 1e9,
                            "x", -1, 1));
        } else {
            skip(o, r, "attention on the GPU not run: %s", gpu_why);
        }
    }
    return GPC_OK;
}

/* --------------------------------------------------------------- claims */

const char *gpc_claim_verdict_name(gpc_claim_verdict verdict) {
    switch (verdict) {
    case GPC_CLAIM_HOLDS:
        return "holds";
    case GPC_CLAIM_PARTLY:
        return "partly";
    case GPC_CLAIM_DOES_NOT_HOLD:
        return "does not hold";
    default:
        return "not measured";
    }
}

/* Best rate among the checked results of one name on one side (CPU/GPU);
 * *size receives its size. */
static const gpc_bench_result *best(const gpc_bench_report *r, const char *group, const char *name,
                                    int on_gpu) {
    const gpc_bench_result *top = NULL;
    for (int i = 0; i < r->count; i++) {
        const gpc_bench_result *x = &r->results[i];
        if (!x->ok || strcmp(x->group, group) || strcmp(x->name, name)) continue;
        if ((strncmp(x->device, "cuda", 4) == 0) != on_gpu) continue;
        if (!top || x->rate > top->rate) top = x;
    }
    return top;
}

static const gpc_bench_result *find(const gpc_bench_report *r, const char *group, const char *name,
                                    int64_t size) {
    for (int i = 0; i < r->count; i++)
        if (r->results[i].ok && !strcmp(r->results[i].group, group) &&
            !strcmp(r->results[i].name, name) && r->results[i].size == size)
            return &r->results[i];
    return NULL;
}

/* "holds" when the measured ratio reaches the claim (within 10%, the noise
 * of a shared machine), "partly" when the gain is there but smaller. */
static void judge(gpc_bench_claim *c, double measured) {
    c->measured = measured;
    c->verdict = measured >= 0.9 * c->claimed ? GPC_CLAIM_HOLDS
                 : measured > 1.0             ? GPC_CLAIM_PARTLY
                                              : GPC_CLAIM_DOES_NOT_HOLD;
}

static const char *gpu_reason(const gpc_bench_report *r) {
    for (int i = 0; i < r->num_skipped; i++)
        if (strstr(r->skipped[i], "not run: ")) return strstr(r->skipped[i], "not run: ") + 9;
    return "the GPU part of this group was not run";
}

void gpc_bench_claims(const gpc_bench_report *r, gpc_bench_claim c[GPC_BENCH_NUM_CLAIMS]) {
    memset(c, 0, sizeof(gpc_bench_claim) * GPC_BENCH_NUM_CLAIMS);
    c[0].claim = "GEMM on a GPU is about 50x a server CPU (V100 vs 28-core Xeon, f32)";
    c[0].claimed = 50;
    c[1].claim = "FP16 GEMM on a GPU is about 80x the CPU";
    c[1].claimed = 80;
    c[2].claim = "shared-memory tiling makes GEMM about 30% faster than a naive kernel";
    c[2].claimed = 1.30;
    c[3].claim = "unified memory cuts small-transfer latency from 15 us to 2 us";
    c[3].claimed = 7.5;

    const gpc_bench_result *cpu = best(r, "gemm", "openblas-f32", 0);
    const char *cpu_text = cpu ? "" : "the CPU GEMM was not measured";
    for (int k = 0; k < 2; k++) {
        const gpc_bench_result *gpu = best(r, "gemm", k == 0 ? "cublas-f32" : "cublas-f16", 1);
        if (cpu && gpu) {
            judge(&c[k], gpu->rate / cpu->rate);
            snprintf(c[k].detail, sizeof c[k].detail,
                     "cuBLAS %s %.0f GFLOP/s (n=%lld) vs OpenBLAS f32 %.1f GFLOP/s on %d threads "
                     "(n=%lld): %.0fx, %s",
                     k == 0 ? "f32" : "f16", gpu->rate, (long long)gpu->size, cpu->rate,
                     r->cpu_threads, (long long)cpu->size, c[k].measured,
                     c[k].measured >= c[k].claimed ? "above the claim" : "below the claim");
        } else {
            snprintf(c[k].detail, sizeof c[k].detail, "not measured: %s",
                     cpu ? gpu_reason(r) : cpu_text);
        }
    }
    /* tiling: the largest size both kernels ran at */
    const gpc_bench_result *naive = NULL, *tiled = NULL;
    for (int i = 0; i < r->count; i++) {
        const gpc_bench_result *x = &r->results[i];
        if (x->ok && !strcmp(x->name, "tiled-f32")) {
            const gpc_bench_result *n = find(r, "gemm", "naive-f32", x->size);
            if (n && (!tiled || x->size > tiled->size)) {
                tiled = x;
                naive = n;
            }
        }
    }
    if (naive && tiled) {
        judge(&c[2], naive->seconds / tiled->seconds);
        snprintf(c[2].detail, sizeof c[2].detail,
                 "n=%lld: naive %.0f GFLOP/s, tiled %.0f GFLOP/s: tiled is %+.0f%%",
                 (long long)tiled->size, naive->rate, tiled->rate, (c[2].measured - 1) * 100);
    } else {
        snprintf(c[2].detail, sizeof c[2].detail, "not measured: %s", gpu_reason(r));
    }
    const gpc_bench_result *explicit_copy = find(r, "copy", "h2d-pageable", 4096);
    const gpc_bench_result *pinned = find(r, "copy", "h2d-pinned", 4096);
    const gpc_bench_result *managed = find(r, "copy", "h2d-managed+prefetch", 4096);
    const gpc_bench_result *faulted = find(r, "copy", "h2d-managed", 4096);
    if (explicit_copy && managed) {
        judge(&c[3], explicit_copy->seconds / managed->seconds);
        snprintf(c[3].detail, sizeof c[3].detail,
                 "4 KiB to the GPU: cudaMemcpy from pageable %.1f us, pinned %.1f us; managed "
                 "memory with prefetch %.1f us, without %.1f us: %.2fx",
                 explicit_copy->seconds * 1e6, pinned ? pinned->seconds * 1e6 : 0,
                 managed->seconds * 1e6, faulted ? faulted->seconds * 1e6 : 0, c[3].measured);
    } else {
        snprintf(c[3].detail, sizeof c[3].detail, "not measured: %s", gpu_reason(r));
    }
}

/* ----------------------------------------------------------------- JSON */

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", *s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

gpc_status gpc_bench_write_json(const char *path, const gpc_bench_options *o,
                                const gpc_bench_report *r,
                                const gpc_bench_claim c[GPC_BENCH_NUM_CLAIMS]) {
    FILE *f = fopen(path, "w");
    if (!f) return gpc_error(GPC_ERR_IO, "cannot write %s: check that its directory exists", path);
    fprintf(f,
            "{\"gpc_bench\": 1, \"quick\": %s, \"cpu\": {\"name\": ", o->quick ? "true" : "false");
    json_string(f, r->cpu_name);
    fprintf(f, ", \"threads\": %d}, \"gpu\": ", r->cpu_threads);
    if (r->gpu >= 0) {
        fprintf(f, "{\"index\": %d, \"name\": ", r->gpu);
        json_string(f, r->gpu_name);
        fprintf(f, "}");
    } else {
        fprintf(f, "null");
    }
    fprintf(f, ",\n \"results\": [");
    for (int i = 0; i < r->count; i++) {
        const gpc_bench_result *x = &r->results[i];
        fprintf(f,
                "%s\n  {\"group\": \"%s\", \"name\": \"%s\", \"device\": \"%s\", \"size\": %lld, "
                "\"seconds\": %.9g, \"work\": %.9g, \"rate\": %.9g, \"unit\": \"%s\", "
                "\"error\": %.3g, \"ok\": %s}",
                i ? "," : "", x->group, x->name, x->device, (long long)x->size, x->seconds, x->work,
                x->rate, x->unit, x->error, x->ok ? "true" : "false");
    }
    fprintf(f, "],\n \"skipped\": [");
    for (int i = 0; i < r->num_skipped; i++) {
        fprintf(f, "%s\n  ", i ? "," : "");
        json_string(f, r->skipped[i]);
    }
    fprintf(f, "],\n \"claims\": [");
    for (int i = 0; i < GPC_BENCH_NUM_CLAIMS; i++) {
        fprintf(f, "%s\n  {\"claim\": ", i ? "," : "");
        json_string(f, c[i].claim);
        fprintf(f, ", \"claimed\": %g, \"measured\": ", c[i].claimed);
        if (c[i].verdict == GPC_CLAIM_NOT_MEASURED)
            fprintf(f, "null");
        else
            fprintf(f, "%.6g", c[i].measured);
        fprintf(f, ", \"verdict\": \"%s\", \"detail\": ", gpc_claim_verdict_name(c[i].verdict));
        json_string(f, c[i].detail);
        fprintf(f, "}");
    }
    fprintf(f, "]}\n");
    if (fclose(f) != 0) return gpc_error(GPC_ERR_IO, "cannot finish writing %s", path);
    return GPC_OK;
}
