/* energy.c: a call's energy at the GPU's power cap (gpc/energy.h): the
 * call run back to back, first to let the clock settle, then measured
 * between two readings of NVML's energy counter. */
#include "gpc/energy.h"

#include <string.h>

/* Runs call in batches for at least `seconds` (one batch at least), each
 * batch ended by wait; *batch doubles while a batch takes under
 * GPC_ENERGY_BATCH_S, and *calls counts the calls. */
static gpc_status run_for(gpc_energy_fn call, gpc_energy_fn wait, void *ctx, double seconds,
                          long *batch, long *calls) {
    double start = gpc_time_seconds();
    do {
        double b0 = gpc_time_seconds();
        for (long r = 0; r < *batch; r++)
            GPC_TRY(call(ctx));
        GPC_TRY(wait(ctx));
        *calls += *batch;
        if (gpc_time_seconds() - b0 < GPC_ENERGY_BATCH_S && *batch < (1L << 20)) *batch *= 2;
    } while (gpc_time_seconds() - start < seconds);
    return GPC_OK;
}

gpc_status gpc_energy_sustain(gpc_nvml *nvml, int index, gpc_energy_fn call, gpc_energy_fn wait,
                              void *ctx, double settle_s, double seconds, gpc_energy_run *out) {
    if (!call || !wait || !out)
        return gpc_error(GPC_ERR_INVALID_ARG, "gpc_energy_sustain needs a call, a wait and a "
                                              "result to fill");
    if (!(seconds > 0 && seconds <= 3600) || !(settle_s >= 0 && settle_s <= 3600))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "gpc_energy_sustain: %g s settling and %g s measured; give 0 to 3600 s "
                         "and more than 0 to 3600 s",
                         settle_s, seconds);
    memset(out, 0, sizeof *out);
    out->joules = -1;
    out->sm_clock_mhz = -1;
    out->throttle_reasons = -1;
    long batch = 1, settle_calls = 0, calls = 0;
    GPC_TRY(run_for(call, wait, ctx, settle_s, &batch, &settle_calls));
    const int counted = nvml && index >= 0;
    double e0 = counted ? gpc_nvml_energy_j(nvml, index) : -1;
    double t0 = gpc_time_seconds();
    GPC_TRY(run_for(call, wait, ctx, seconds, &batch, &calls));
    double t1 = gpc_time_seconds();
    out->calls = calls;
    out->seconds = t1 - t0;
    gpc_nvml_power end;
    if (!counted) return GPC_OK;
    if (gpc_nvml_sample_power(nvml, index, &end) != GPC_OK) {
        gpc_clear_error(); /* a GPU NVML does not list: no energy, the time stands */
        return GPC_OK;
    }
    out->sm_clock_mhz = end.sm_clock_mhz;
    out->throttle_reasons = end.throttle_reasons;
    if (e0 >= 0 && end.energy_j >= e0) out->joules = end.energy_j - e0;
    return GPC_OK;
}
