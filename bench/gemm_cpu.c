/*
 * gemm_cpu.c: how fast OpenBLAS's sgemm is on this machine, beside the
 * machine's theoretical fp32 peak, so the CPU trainer's speed can be judged
 * against what the hardware can do (almost all of its FLOPs are GEMMs).
 *
 * For square sizes 256..2048 (or the sizes given as arguments) it times
 * C = A B (row-major, f32) after a warm-up call, repeats until about half a
 * second has passed (at least 3 times), and reports the median: GFLOP/s =
 * 2 n^3 / seconds. OpenBLAS uses its own threads (OPENBLAS_NUM_THREADS,
 * default one per core).
 *
 * Peak estimate: physical cores (distinct physical id / core id pairs of
 * /proc/cpuinfo) x clock (the largest "cpu MHz" there; on a VM this is the
 * nominal clock the hypervisor reports, not a boost clock) x 32 FLOP/cycle,
 * the AVX2 figure: two 256-bit FMA units x 8 floats x 2 FLOPs per FMA. A CPU
 * with two full-width AVX-512 FMA units could reach twice that; the line is
 * printed too when the CPU has avx512f, but it is an upper bound only.
 * Because the reported clock of a VM is often the base clock, the clock is
 * also measured (a chain of dependent integer adds, one per cycle on every
 * x86 core since the Pentium Pro) and the peak given for it as well.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    int cores, logical;
    double mhz;
    int avx2_fma, avx512;
    char model[128];
} cpu_info;

static cpu_info read_cpuinfo(void) {
    cpu_info info = {0};
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return info;
    char line[4096];
    int physical = 0, pairs[1024][2], npairs = 0;
    while (fgets(line, sizeof line, f)) {
        double mhz;
        int value;
        if (sscanf(line, "cpu MHz : %lf", &mhz) == 1 && mhz > info.mhz) info.mhz = mhz;
        if (strncmp(line, "processor", 9) == 0) info.logical++;
        if (sscanf(line, "physical id : %d", &value) == 1) physical = value;
        if (sscanf(line, "core id : %d", &value) == 1) {
            int seen = 0;
            for (int i = 0; i < npairs; i++)
                if (pairs[i][0] == physical && pairs[i][1] == value) seen = 1;
            if (!seen && npairs < 1024) {
                pairs[npairs][0] = physical;
                pairs[npairs][1] = value;
                npairs++;
            }
        }
        if (strncmp(line, "flags", 5) == 0) {
            info.avx2_fma = strstr(line, " avx2") && strstr(line, " fma");
            info.avx512 = strstr(line, " avx512f") != NULL;
        }
        if (!info.model[0] && strncmp(line, "model name", 10) == 0) {
            char *colon = strchr(line, ':');
            if (colon) {
                snprintf(info.model, sizeof info.model, "%s", colon + 2);
                info.model[strcspn(info.model, "\n")] = 0;
            }
        }
    }
    fclose(f);
    info.cores = npairs ? npairs : info.logical;
    return info;
}

/* Cycles per second of one core under load: 8 dependent adds per loop trip,
 * each with a latency of one cycle, so the chain sets the pace. */
static double measure_ghz(void) {
    double best = 0;
    for (int trial = 0; trial < 5; trial++) {
        unsigned long x = 0, trips = 20000000;
        double t0 = now();
        for (unsigned long i = 0; i < trips; i++)
            __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
                             "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0"
                             : "+r"(x));
        double ghz = (double)trips * 8 / (now() - t0) * 1e-9;
        if (ghz > best) best = ghz;
    }
    return best;
}

static double time_sgemm(int n, float *a, float *b, float *c) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    double samples[64];
    int reps = 0;
    double start = now();
    while (reps < 64 && (reps < 3 || now() - start < 0.5)) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c,
                    n);
        samples[reps++] = now() - t0;
    }
    qsort(samples, (size_t)reps, sizeof samples[0], compare_double);
    return samples[reps / 2];
}

int main(int argc, char **argv) {
    int default_sizes[] = {256, 512, 1024, 1536, 2048};
    int count = argc > 1 ? argc - 1 : (int)(sizeof default_sizes / sizeof default_sizes[0]);
    cpu_info cpu = read_cpuinfo();
    printf("cpu: %s, %d cores (%d logical), %.0f MHz\n", cpu.model[0] ? cpu.model : "unknown",
           cpu.cores, cpu.logical, cpu.mhz);
    printf("openblas: %s, core %s, %d threads\n", openblas_get_config(), openblas_get_corename(),
           openblas_get_num_threads());
    double peak = cpu.cores * cpu.mhz * 1e-3 * 32;
    printf("fp32 peak estimate: %d cores x %.2f GHz x 32 FLOP/cycle (2 AVX2 FMA units x 8 "
           "lanes x 2) = %.1f GFLOP/s%s\n",
           cpu.cores, cpu.mhz * 1e-3, peak, cpu.avx2_fma ? "" : " (no AVX2+FMA: an overestimate)");
#if defined(__x86_64__)
    double ghz = measure_ghz();
    printf("measured clock under load: %.2f GHz -> %d x %.2f x 32 = %.1f GFLOP/s\n", ghz, cpu.cores,
           ghz, cpu.cores * ghz * 32);
    if (ghz > cpu.mhz * 1e-3) peak = cpu.cores * ghz * 32; /* the percentages use the higher */
#endif
    if (cpu.avx512)
        printf("  (avx512f present: with two full-width 512-bit FMA units the bound would be "
               "%.1f GFLOP/s)\n",
               2 * peak);
    printf("\n%8s %12s %12s %10s\n", "n", "median ms", "GFLOP/s", "of peak");
    for (int i = 0; i < count; i++) {
        int n = argc > 1 ? atoi(argv[i + 1]) : default_sizes[i];
        if (n <= 0) {
            fprintf(stderr, "bench_gemm_cpu: error: size '%s' is not a positive integer\n",
                    argv[i + 1]);
            return 2;
        }
        size_t elems = (size_t)n * (size_t)n;
        float *a = malloc(elems * sizeof *a), *b = malloc(elems * sizeof *b),
              *c = malloc(elems * sizeof *c);
        if (!a || !b || !c) {
            fprintf(stderr, "bench_gemm_cpu: error: out of memory for n = %d\n", n);
            return 1;
        }
        for (size_t k = 0; k < elems; k++) {
            a[k] = (float)((k * 7919) % 1000) * 1e-3f - 0.5f;
            b[k] = (float)((k * 104729) % 1000) * 1e-3f - 0.5f;
        }
        double seconds = time_sgemm(n, a, b, c);
        double gflops = 2.0 * n * n * (double)n / seconds * 1e-9;
        printf("%8d %12.3f %12.1f %9.0f%%\n", n, seconds * 1e3, gflops,
               peak > 0 ? 100 * gflops / peak : 0);
        free(a), free(b), free(c);
    }
    return 0;
}
