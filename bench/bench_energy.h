/*
 * bench_energy.h: energy a call at the GPU's power cap, for the CUDA
 * benchmark programs. GPC_BENCH_ENERGY_S=S runs an op back to back for S
 * seconds, after S/4 (at most 1 s) for the clock to settle where the op's
 * power puts it, and reads NVML's energy counter of GPU 0 before and after.
 * At the cap a training step's speed is set by its joules, not by how fast
 * each kernel runs at full clock, so this is the measure that predicts it.
 */
#ifndef GPC_BENCH_ENERGY_H
#define GPC_BENCH_ENERGY_H

#include <time.h>

#include "bench_util.h"
#include "gpc/nvml.h"
#include "gpc/settings.h"

/* The seconds GPC_BENCH_ENERGY_S asks for (0 when unset) in *seconds: 1, or
 * 0 after saying what is wrong with it. */
static inline int bench_energy_seconds(const char *program, double *seconds) {
    const char *es = gpc_setting_given("GPC_BENCH_ENERGY_S");
    char *end = NULL;
    *seconds = es && *es ? strtod(es, &end) : 0.0;
    if (es && *es && (*end || !(*seconds >= 0 && *seconds <= 600))) {
        fprintf(stderr, "%s: GPC_BENCH_ENERGY_S=%s is not a number of seconds in 0..600\n", program,
                es);
        return 0;
    }
    return 1;
}

static inline double bench_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* run(ctx) back to back as above; prints "RESULT TAG NAME mj=... ms=...
 * watts=... mhz=... calls=..." (and pj_per_flop=... where flops, the FLOPs
 * of one call, is above 0). 0, or 1 after saying what failed. */
static inline int bench_energy_sustain(const char *program, const gpc_backend *cuda, gpc_nvml *nvml,
                                       gpc_status (*run)(void *), void *ctx, double seconds,
                                       const char *tag, const char *name, double flops) {
    gpc_event e;
    if (cuda->event_create(&e) != GPC_OK) {
        fprintf(stderr, "%s: %s\n", program, gpc_last_error());
        return 1;
    }
    gpc_nvml_power p0 = {0}, p1 = {0};
    double settle = seconds / 4 < 1 ? seconds / 4 : 1, t0 = 0, end = bench_now_s() + settle;
    long calls = 0;
    gpc_status st = GPC_OK;
    for (int phase = 0; phase < 2 && st == GPC_OK; phase++) {
        while (st == GPC_OK) {
            for (int i = 0; i < 20 && st == GPC_OK; i++, calls++)
                st = run(ctx);
            float unused;
            if (st == GPC_OK) st = cuda->event_record(e, NULL);
            if (st == GPC_OK) st = cuda->event_elapsed_ms(e, e, &unused); /* waits for the batch */
            if (bench_now_s() >= end) break;
        }
        if (st == GPC_OK) st = gpc_nvml_sample_power(nvml, 0, phase ? &p1 : &p0);
        if (!phase) t0 = bench_now_s(), end = t0 + seconds, calls = 0;
    }
    double t1 = bench_now_s(), j = p1.energy_j - p0.energy_j;
    cuda->event_destroy(e);
    if (st != GPC_OK) {
        fprintf(stderr, "%s: %s\n", program, gpc_last_error());
        return 1;
    }
    if (p0.energy_j < 0 || p1.energy_j < 0) {
        fprintf(stderr, "%s: NVML gives no energy counter here\n", program);
        return 1;
    }
    printf("RESULT %s %s mj=%.3f ms=%.4f watts=%.0f mhz=%d calls=%ld", tag, name,
           j * 1e3 / (double)calls, (t1 - t0) * 1e3 / (double)calls, j / (t1 - t0), p1.sm_clock_mhz,
           calls);
    if (flops > 0) printf(" pj_per_flop=%.3f", j * 1e12 / ((double)calls * flops));
    printf("\n");
    return 0;
}

#endif
