/*
 * bench_energy.h: energy a call at the GPU's power cap, for the CUDA
 * benchmark programs. GPC_BENCH_ENERGY_S=S runs an op back to back for S
 * seconds, after S/4 (at most 1 s) for the clock to settle where the op's
 * power puts it, and reads NVML's energy counter of GPU 0 before and after
 * (gpc_energy_sustain in gpc/energy.h).
 * At the cap a training step's speed is set by its joules, not by how fast
 * each kernel runs at full clock, so this is the measure that predicts it.
 */
#ifndef GPC_BENCH_ENERGY_H
#define GPC_BENCH_ENERGY_H

#include "bench_util.h"
#include "gpc/energy.h"
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

/* What bench_energy_sustain's callbacks need: the op, and an event on the
 * default stream whose wait ends a batch. */
typedef struct {
    const gpc_backend *cuda;
    gpc_event event;
    gpc_status (*run)(void *);
    void *ctx;
} bench_energy_call;

static inline gpc_status bench_energy_run(void *c) {
    const bench_energy_call *call = (const bench_energy_call *)c;
    return call->run(call->ctx);
}

static inline gpc_status bench_energy_wait(void *c) {
    const bench_energy_call *call = (const bench_energy_call *)c;
    float unused;
    GPC_TRY(call->cuda->event_record(call->event, NULL));
    return call->cuda->event_elapsed_ms(call->event, call->event, &unused); /* waits */
}

/* run(ctx) back to back as above (gpc_energy_sustain); prints "RESULT TAG
 * NAME mj=... ms=... watts=... mhz=... calls=..." (and pj_per_flop=...
 * where flops, the FLOPs of one call, is above 0). 0, or 1 after saying
 * what failed. */
static inline int bench_energy_sustain(const char *program, const gpc_backend *cuda, gpc_nvml *nvml,
                                       gpc_status (*run)(void *), void *ctx, double seconds,
                                       const char *tag, const char *name, double flops) {
    bench_energy_call call = {cuda, NULL, run, ctx};
    if (cuda->event_create(&call.event) != GPC_OK) {
        fprintf(stderr, "%s: %s\n", program, gpc_last_error());
        return 1;
    }
    double settle = seconds / 4 < 1 ? seconds / 4 : 1;
    gpc_energy_run r;
    gpc_status st = gpc_energy_sustain(nvml, 0, bench_energy_run, bench_energy_wait, &call, settle,
                                       seconds, &r);
    cuda->event_destroy(call.event);
    if (st != GPC_OK) {
        fprintf(stderr, "%s: %s\n", program, gpc_last_error());
        return 1;
    }
    if (r.joules < 0) {
        fprintf(stderr, "%s: NVML gives no energy counter here\n", program);
        return 1;
    }
    double j = r.joules;
    printf("RESULT %s %s mj=%.3f ms=%.4f watts=%.0f mhz=%d calls=%ld", tag, name,
           j * 1e3 / (double)r.calls, r.seconds * 1e3 / (double)r.calls, j / r.seconds,
           r.sm_clock_mhz, r.calls);
    if (flops > 0) printf(" pj_per_flop=%.3f", j * 1e12 / ((double)r.calls * flops));
    printf("\n");
    return 0;
}

#endif
