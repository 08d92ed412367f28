/*
 * attention_cudnn_tune.cu: picks the engine of a cuDNN attention plan when
 * GPC_CUDNN_TUNE asks (attention_cudnn_graph.cu builds the candidates,
 * attention_cudnn.cu runs the choice).
 *
 * A plan is the first of cuDNN's heuristic (mode A) engine configurations
 * whose execution plan finalizes. With GPC_CUDNN_TUNE=1 every configuration
 * that finalizes is kept as a candidate (the workspace sized for the
 * largest), and the first call of the shape and direction, when the real
 * tensors are known, times each on the current stream with CUDA events (one
 * warm-up run, then CUDNN_ATT_TUNE_RUNS), keeps the fastest median, destroys
 * the others and logs the times. GPC_CUDNN_TUNE=energy instead runs each
 * candidate back to back for a second and keeps the one of the least energy
 * a run (NVML's counter; the least time a run when there is no counter): the
 * training step runs at the GPU's power limit, where a short timing at full
 * clock ranks candidates by the wrong measure. Repeating a run is harmless: the forward
 * writes O and Stats, the backward writes dQ, dK and dV (none is added to),
 * and the backward's f32 dQ accumulator starts from zero in every run.
 */
#include "cuda/attention_cudnn_plan.cuh"
#include "gpc/energy.h"

#include <stdlib.h>
#include <string.h>

#define CUDNN_ATT_TUNE_RUNS 3  /* timed runs of each candidate with GPC_CUDNN_TUNE=1 */
#define CUDNN_ATT_ENERGY_S 1.0 /* GPC_CUDNN_TUNE=energy: seconds each candidate is measured */

/* GPC_CUDNN_TUNE=1 (or =energy): keep every engine configuration that
 * finalizes and time them at the first execution. */
int gpc_cudnn_att_tune_enabled(void) {
    const char *e = gpc_setting_str("GPC_CUDNN_TUNE");
    return e && (strcmp(e, "1") == 0 || strcmp(e, "energy") == 0);
}

/* GPC_CUDNN_TUNE=energy: compare the candidates by their energy a run at the
 * power limit instead of by a few short timings (tune_energy). */
static int tune_by_energy(void) {
    const char *e = gpc_setting_str("GPC_CUDNN_TUNE");
    return e && strcmp(e, "energy") == 0;
}

/* Destroys one of a plan entry's descriptors and drops it from the list. */
static void drop_descriptor(plan_entry *p, cudnnBackendDescriptor_t d) {
    for (int i = 0; i < p->num_descs; i++)
        if (p->descs[i] == d) {
            gpc_cudnn.DestroyDescriptor(d);
            memmove(&p->descs[i], &p->descs[i + 1],
                    (size_t)(p->num_descs - i - 1) * sizeof p->descs[0]);
            p->num_descs--;
            return;
        }
}

/* GPC_CUDNN_TUNE=energy: NVML, opened for `device` at the first use and
 * kept, and the GPU's index in it; -1 when NVML cannot read it (energy_run
 * then measures time alone). Plans run, and are tuned, under `lock`, one at
 * a time. */
static gpc_nvml *energy_nvml[GPC_CUDA_MAX_DEVICES];

static int energy_index(int device) {
    static int index[GPC_CUDA_MAX_DEVICES], looked[GPC_CUDA_MAX_DEVICES];
    if (device < 0 || device >= GPC_CUDA_MAX_DEVICES) return -1;
    if (!looked[device]) {
        char bus[32];
        looked[device] = 1;
        index[device] = -1;
        if (cudaDeviceGetPCIBusId(bus, (int)sizeof bus, device) == cudaSuccess &&
            gpc_nvml_open_bus_id(bus, &energy_nvml[device], &index[device]) != GPC_OK)
            index[device] = -1;
        cudaGetLastError();
        gpc_clear_error();
    }
    return index[device];
}

/* Seconds each candidate is measured with GPC_CUDNN_TUNE=energy:
 * GPC_CUDNN_TUNE_ENERGY_S (0.01 to 60; tests take a short one), else
 * CUDNN_ATT_ENERGY_S. */
static double energy_seconds(void) {
    static double seconds;
    if (seconds == 0) {
        const char *e = gpc_setting_str("GPC_CUDNN_TUNE_ENERGY_S");
        char *end = NULL;
        double v = e && *e ? strtod(e, &end) : CUDNN_ATT_ENERGY_S;
        if (e && *e && (*end || !(v >= 0.01 && v <= 60))) {
            gpc_log(GPC_LOG_WARN, "GPC_CUDNN_TUNE_ENERGY_S=%s is not 0.01 to 60 seconds: using %g",
                    e, CUDNN_ATT_ENERGY_S);
            v = CUDNN_ATT_ENERGY_S;
        }
        seconds = v;
    }
    return seconds;
}

/* What gpc_energy_sustain's callbacks need: one candidate's plan and the
 * call's tensors. */
typedef struct {
    const plan_entry *p;
    cudnnBackendDescriptor_t plan, pack;
    cudaStream_t stream;
} energy_call;

static gpc_status energy_call_run(void *ctx) {
    const energy_call *c = (const energy_call *)ctx;
    return gpc_cudnn_att_run_plan(c->p, c->plan, c->pack, c->stream);
}

static gpc_status energy_call_wait(void *ctx) {
    GPC_CUDA_CHECK(cudaStreamSynchronize(((const energy_call *)ctx)->stream));
    return GPC_OK;
}

/* Runs plan back to back (gpc_energy_sustain), a quarter of
 * energy_seconds() so that the clock settles where the candidate's power
 * puts it, then energy_seconds() measured: *ms gets the time a run and *mj
 * its energy from NVML's counter (-1 when the counter cannot be read or did
 * not move). At the power limit, where the training step runs, a run's time
 * follows its energy; a short timing at full clock does not. */
static gpc_status energy_run(const plan_entry *p, cudnnBackendDescriptor_t plan,
                             cudnnBackendDescriptor_t pack, cudaStream_t stream, int index,
                             float *ms, float *mj) {
    energy_call call = {p, plan, pack, stream};
    gpc_nvml *nvml = index >= 0 ? energy_nvml[p->key.device] : NULL;
    gpc_energy_run r;
    GPC_TRY(gpc_energy_sustain(nvml, index, energy_call_run, energy_call_wait, &call,
                               0.25 * energy_seconds(), energy_seconds(), &r));
    *ms = (float)(r.seconds * 1e3 / (double)r.calls);
    *mj = r.joules > 0 ? (float)(r.joules * 1e3 / (double)r.calls) : -1.0f;
    return GPC_OK;
}

/* GPC_CUDNN_TUNE=1, at a plan's first execution: times each candidate with
 * the call's own tensors on stream (one warm-up run, then
 * CUDNN_ATT_TUNE_RUNS runs, each between two events), keeps the one of the
 * lowest median as p->plan, destroys the other plans and logs the times.
 * The timed runs include run_plan's zeroing of the dQ accumulator where
 * there is one, the same for every candidate. A candidate that fails to run
 * is left out; when all fail, the heuristics' first stays and the run that
 * follows reports its error. Waiting for the events is a host-device
 * synchronisation inside the step, which this opt-in pays once per shape and
 * direction. A CUDA failure of the timing itself is returned, and the
 * candidates stay for the next call. */
gpc_status gpc_cudnn_att_tune(plan_entry *p, cudnnBackendDescriptor_t pack, cudaStream_t stream) {
    const int runs = CUDNN_ATT_TUNE_RUNS;
    cudaEvent_t events[CUDNN_ATT_TUNE_RUNS + 1] = {0};
    float median[CUDNN_ATT_MAX_CONFIGS], mean[CUDNN_ATT_MAX_CONFIGS];
    int ran[CUDNN_ATT_MAX_CONFIGS] = {0};
    char text[96];
    shape_text(&p->key, text, sizeof text);
    cudaError_t err = cudaSuccess;
    for (int e = 0; e <= runs && err == cudaSuccess; e++)
        err = cudaEventCreate(&events[e]);
    const int by_energy = tune_by_energy();
    const int index = by_energy ? energy_index(p->key.device) : -1;
    /* why energies were not compared, when they were not */
    const char *by_time =
        index < 0 ? "ms a run, no energy counter" : "ms a run, the energy counter did not move";
    int measured_energy = by_energy;
    for (int c = 0; by_energy && c < p->num_candidates && err == cudaSuccess; c++) {
        /* energy a run (or, without NVML's counter, the time a run) back to
         * back: median[] holds what is compared, mean[] the time */
        cudnnBackendDescriptor_t plan = p->candidates[c].plan;
        float ms = 0.0f, mj = 0.0f;
        if (energy_run(p, plan, pack, stream, index, &ms, &mj) != GPC_OK) {
            gpc_log(GPC_LOG_DEBUG, "cuDNN attention: %s: engine %ld left out: %s", text,
                    p->candidates[c].engine_index, gpc_last_error());
            cudaGetLastError(); /* a failed launch's error is this candidate's alone */
            err = cudaStreamSynchronize(stream);
            continue;
        }
        if (mj < 0) measured_energy = 0;
        median[c] = mj >= 0 ? mj : ms, mean[c] = ms, ran[c] = 1;
    }
    for (int c = 0; !by_energy && c < p->num_candidates && err == cudaSuccess; c++) {
        cudnnBackendDescriptor_t plan = p->candidates[c].plan;
        int ok = gpc_cudnn_att_run_plan(p, plan, pack, stream) == GPC_OK; /* the warm-up */
        for (int r = 0; ok && r <= runs && err == cudaSuccess; r++) {
            err = cudaEventRecord(events[r], stream);
            if (r < runs && err == cudaSuccess)
                ok = gpc_cudnn_att_run_plan(p, plan, pack, stream) == GPC_OK;
        }
        if (ok && err == cudaSuccess) err = cudaEventSynchronize(events[runs]);
        if (err != cudaSuccess) break;
        if (!ok) {
            gpc_log(GPC_LOG_DEBUG, "cuDNN attention: %s: engine %ld left out: %s", text,
                    p->candidates[c].engine_index, gpc_last_error());
            cudaGetLastError(); /* a failed launch's error is this candidate's alone */
            continue;
        }
        float ms[CUDNN_ATT_TUNE_RUNS], sum = 0.0f;
        for (int r = 0; r < runs && err == cudaSuccess; r++) {
            err = cudaEventElapsedTime(&ms[r], events[r], events[r + 1]);
            if (err == cudaSuccess) sum += ms[r];
        }
        if (err != cudaSuccess) break;
        for (int r = 1; r < runs; r++) /* insertion sort, for the median */
            for (int q = r; q > 0 && ms[q] < ms[q - 1]; q--) {
                float t = ms[q];
                ms[q] = ms[q - 1], ms[q - 1] = t;
            }
        median[c] = ms[runs / 2], mean[c] = sum / runs, ran[c] = 1;
    }
    for (int e = 0; e <= runs; e++)
        if (events[e]) cudaEventDestroy(events[e]);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return gpc_error(err == cudaErrorMemoryAllocation ? GPC_ERR_NOMEM : GPC_ERR_DEVICE,
                         "cuDNN attention: timing the engines of %s (GPC_CUDNN_TUNE=1): %s; "
                         "unset GPC_CUDNN_TUNE to run the heuristics' first engine untimed",
                         text, cudaGetErrorString(err));
    }

    if (by_energy && !measured_energy) /* a mix of energies and times cannot be compared */
        for (int c = 0; c < p->num_candidates; c++)
            if (ran[c]) median[c] = mean[c];
    int best = 0, any = 0;
    for (int c = 0; c < p->num_candidates; c++)
        if (ran[c] && (!any || median[c] < median[best])) best = c, any = 1;
    char line[1024];
    size_t at =
        by_energy
            ? (size_t)snprintf(line, sizeof line,
                               "cuDNN attention %s on cuda:%d: %d engine candidates, each run "
                               "back to back %.2g s (heuristics' rank: engine, %s):",
                               text, p->key.device, p->num_candidates, energy_seconds(),
                               measured_energy ? "mJ/ms a run" : by_time)
            : (size_t)snprintf(line, sizeof line,
                               "cuDNN attention %s on cuda:%d: %d engine candidates "
                               "(heuristics' rank: engine, median/mean of %d runs):",
                               text, p->key.device, p->num_candidates, runs);
    for (int c = 0; c < p->num_candidates && at < sizeof line; c++) {
        const char *sep = c + 1 < p->num_candidates ? "," : ";";
        if (ran[c] && by_energy && measured_energy)
            at += (size_t)snprintf(line + at, sizeof line - at, " %d: engine %ld %.3f mJ %.4f ms%s",
                                   p->candidates[c].rank, p->candidates[c].engine_index, median[c],
                                   mean[c], sep);
        else if (ran[c] && by_energy)
            at += (size_t)snprintf(line + at, sizeof line - at, " %d: engine %ld %.4f ms%s",
                                   p->candidates[c].rank, p->candidates[c].engine_index, mean[c],
                                   sep);
        else if (ran[c])
            at += (size_t)snprintf(line + at, sizeof line - at, " %d: engine %ld %.3f/%.3f ms%s",
                                   p->candidates[c].rank, p->candidates[c].engine_index, median[c],
                                   mean[c], sep);
        else
            at += (size_t)snprintf(line + at, sizeof line - at, " %d: engine %ld failed to run%s",
                                   p->candidates[c].rank, p->candidates[c].engine_index, sep);
    }
    gpc_log(GPC_LOG_INFO, "%s %s %d (engine %ld)", line,
            any ? "picked" : "none ran; keeping the heuristics' first,", p->candidates[best].rank,
            p->candidates[best].engine_index);
    for (int c = 0; c < p->num_candidates; c++)
        if (c != best) drop_descriptor(p, p->candidates[c].plan);
    p->plan = p->candidates[best].plan;
    p->engine_index = p->candidates[best].engine_index;
    p->num_candidates = 0;
    return GPC_OK;
}
