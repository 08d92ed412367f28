/*
 * gpc energy: what a call costs in energy at the GPU's power cap.
 *
 * A GPU held at its power limit (an H200 at 700 W) runs each kernel at the
 * clock its power allows, so a training step's speed follows its joules,
 * not how fast each kernel runs alone at full clock. gpc_energy_sustain
 * runs a call back to back until the clock settles where the call's power
 * puts it, then reads NVML's energy counter around a measured stretch. The
 * benchmarks (GPC_BENCH_ENERGY_S, gemm_search --energy-s) and cuDNN's engine
 * tuning (GPC_CUDNN_TUNE=energy) measure through it.
 *
 * The call and the wait are callbacks, so this core function knows no
 * device: the caller's wait is its device's synchronisation.
 */
#ifndef GPC_ENERGY_H
#define GPC_ENERGY_H

#include <stdint.h>

#include "gpc/core.h"
#include "gpc/nvml.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The measured stretch of a gpc_energy_sustain. */
typedef struct {
    long calls;               /* calls made in it */
    double seconds;           /* its wall time */
    double joules;            /* its energy from NVML's counter; -1 when unknown */
    int sm_clock_mhz;         /* the SM clock at its end; -1 when unknown */
    int64_t throttle_reasons; /* GPC_NVML_THROTTLE_* bits at its end; -1 when unknown */
} gpc_energy_run;

typedef gpc_status (*gpc_energy_fn)(void *ctx);

/* Runs call(ctx) back to back for settle_s seconds, then for `seconds`
 * more, reading NVML's energy counter of GPU `index` before and after the
 * second part, the measured one. Calls go in batches, each ended by
 * wait(ctx), which returns once the device has finished them; a batch
 * doubles until it takes GPC_ENERGY_BATCH_S, so the device's queue stays
 * full between waits. Each part runs one batch at least. Without NVML
 * (nvml NULL or index < 0) or its counter, joules is -1 and the rest is
 * measured. The first failure of call or wait is returned as it is. */
#define GPC_ENERGY_BATCH_S 0.01
gpc_status gpc_energy_sustain(gpc_nvml *nvml, int index, gpc_energy_fn call, gpc_energy_fn wait,
                              void *ctx, double settle_s, double seconds, gpc_energy_run *out);

#ifdef __cplusplus
}
#endif

#endif /* GPC_ENERGY_H */
