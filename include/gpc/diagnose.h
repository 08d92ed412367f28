/*
 * gpc diagnose: why a GPU job is slow or failed, from a trace of samples.
 *
 * A trace is what a watcher saw at each interval: the GPU's utilisation and,
 * where the driver offers them (NVML GPM, Hopper and newer), SM activity,
 * occupancy, tensor activity and DRAM bandwidth; PCIe traffic; the process's
 * CPU use and its busiest thread; power and thermal caps; step times and
 * tokens/s; and for data-parallel jobs the exposed all-reduce share. The
 * classifier turns it into findings, each with a cause and a one-line remedy.
 *
 * The classifier is pure: no NVML, no /proc. gpc doctor feeds it live
 * samples; tests feed it recorded traces (gpc_diag_trace_read); gpc doctor
 * --run feeds it a run folder's metrics.jsonl (gpc_diag_run).
 */
#ifndef GPC_DIAGNOSE_H
#define GPC_DIAGNOSE_H

#include "gpc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The thresholds. The seed's alert defaults (utilisation < 70%, memory >
 * 90%, temperature > 85 C) are gpcd's too; the others cite their source. */
#define GPC_DIAG_UTIL_LOW 70.0        /* % of time a kernel ran (seed, gpcd alert default) */
#define GPC_DIAG_MEMORY_FRAC 0.90     /* used/total (seed, gpcd alert default) */
#define GPC_DIAG_TEMPERATURE_HOT 85.0 /* C (seed, gpcd alert default) */
/* GPM SM activity in %: DCGM's profiling guide calls < 50% "likely
 * ineffective GPU usage" and >= 80% "necessary for effective use". */
#define GPC_DIAG_SM_ACTIVE_LOW 50.0
/* % of one core: a thread this busy has no slack, so it sets the pace
 * (the host loop that launches kernels, in a launch-bound job). */
#define GPC_DIAG_THREAD_SATURATED 90.0
/* Utilisation that swings over more than this many points between samples
 * means the GPU idles in bursts: it waits on something (loader, copies). */
#define GPC_DIAG_UTIL_SWING 50.0
/* A step slower than this multiple of the median is a stall; more than
 * GPC_DIAG_STALL_SHARE of steps stalling is a pattern, not a checkpoint. */
#define GPC_DIAG_STALL_RATIO 1.5
#define GPC_DIAG_STALL_SHARE 0.10
/* Host-to-device PCIe traffic (MB/s) above which a starved GPU is waiting
 * on copies rather than on the loader: a tenth of a gen4 x16 link's 25 GB/s. */
#define GPC_DIAG_PCIE_BUSY_MBS 2500.0
/* Share of samples (or steps) capped before a cap counts as a finding. */
#define GPC_DIAG_CAPPED_SHARE 0.25
/* Exposed all-reduce share of a step: overlap hides most of it in a healthy
 * data-parallel step (PyTorch DDP's design note aims at full overlap). */
#define GPC_DIAG_COMM_EXPOSED 0.15
/* Share of the step blocked on the loader (the trainer's input_wait) above
 * which the run is input-bound: a fifth of the step is the most a faster
 * GPU, kernel or batch could not win back, and well above the few percent
 * a prefetching loader costs when it keeps up. */
#define GPC_DIAG_INPUT_WAIT 0.20
/* MFU under this (dense bf16 peak) leaves most of the GPU unused: llm.c and
 * nanoGPT reach 40-50% on GPT-2 sizes at a full micro-batch. */
#define GPC_DIAG_MFU_LOW 0.10

/* The causes the classifier names. */
typedef enum {
    GPC_DIAG_LAUNCH_BOUND = 0, /* a host thread saturated, the GPU idle between short kernels */
    GPC_DIAG_INPUT_BOUND,      /* the GPU waits on the loader or host copies */
    GPC_DIAG_UNDER_OCCUPIED,   /* kernels too small to fill the GPU (small batch) */
    GPC_DIAG_POWER_CAPPED,     /* the power limit holds the clock down */
    GPC_DIAG_THERMAL,          /* hot, or clocks held back by heat */
    GPC_DIAG_MEMORY_FULL,      /* near out of memory */
    GPC_DIAG_COMMUNICATION,    /* exposed all-reduce: data parallelism waits on the network */
    GPC_DIAG_OUT_OF_MEMORY,    /* the run ended out of memory */
    GPC_DIAG_KIND_COUNT
} gpc_diag_kind;

/* "launch_bound", "input_bound", "under_occupied", "power_capped",
 * "thermal", "memory_full", "communication", "out_of_memory". */
const char *gpc_diag_kind_name(gpc_diag_kind kind);

/* One interval of a watch. Every field is -1 when unknown: the classifier
 * uses what is there and skips the rules that need what is not. */
typedef struct {
    double t;              /* seconds since the watch began */
    double util;           /* NVML utilisation: % of time any kernel ran */
    double sm_active;      /* GPM SM activity, % (work spread over the SMs) */
    double sm_occupancy;   /* GPM SM occupancy, % of the warps an SM can hold */
    double tensor_active;  /* GPM any-tensor-core activity, % */
    double dram_bw;        /* GPM DRAM bandwidth use, % of the peak */
    double pcie_rx_mbs;    /* PCIe host to device, MB/s */
    double pcie_tx_mbs;    /* PCIe device to host, MB/s */
    double memory_frac;    /* GPU memory used / total */
    double temperature_c;  /* GPU temperature */
    double power_capped;   /* 1: the power cap held the clock down; 0: not */
    double thermal_capped; /* 1: a thermal slowdown was active; 0: not */
    double cpu_process;    /* the process tree's CPU, % of one core */
    double cpu_top_thread; /* its busiest thread, % of one core */
    double step_ms;        /* training step time */
    double tokens_per_s;   /* training throughput */
    double comm_exposed;   /* share of the step in all-reduce not hidden by backward */
    double input_wait;     /* share of the step blocked on the loader (the trainer's) */
    double input_wait_ms;  /* the same in ms */
} gpc_diag_sample;

/* A sample with every field unknown (-1). */
void gpc_diag_sample_clear(gpc_diag_sample *sample);

/* A measured figure behind a finding, for JSON: "input_wait" 0.62. */
typedef struct {
    const char *name; /* a gpc_diag_sample field's name, or "step_ms" */
    double value;
} gpc_diag_figure;

#define GPC_DIAG_FIGURES 4

typedef struct {
    gpc_diag_kind kind;
    char text[320];   /* what was seen, with the numbers */
    char remedy[320]; /* what to do, one line */
    int nfigures;     /* figures behind text where measured, for JSON */
    gpc_diag_figure figures[GPC_DIAG_FIGURES];
} gpc_diag_finding;

/* Classifies n samples; writes at most max findings to out (each cause at
 * most once) and returns how many. A healthy trace gives none. */
int gpc_diagnose(const gpc_diag_sample *samples, int n, gpc_diag_finding *out, int max);

/* Reads a recorded trace: CSV whose header names gpc_diag_sample's fields
 * (any subset, any order); '#' lines are comments; an empty cell or a
 * missing column is unknown. *out is gpc_free'd by the caller. */
gpc_status gpc_diag_trace_read(const char *path, gpc_diag_sample **out, int *n);

/* Dense peak FLOP/s of a GPU by its name (NVML's, e.g. "NVIDIA H200") for
 * a compute precision ("bf16", "f16", "f32"): the datasheets' figures
 * without sparsity. 0 when the GPU is not in the table. */
double gpc_diag_peak_flops(const char *gpu_name, const char *precision);

/* What a run folder tells after the fact. */
typedef struct {
    int steps;              /* metrics.jsonl lines */
    int out_of_memory;      /* 1: the log or metrics end in an out-of-memory error */
    char oom_line[320];     /* the log line that said so */
    double flops_per_token; /* 6N + 6LCT; -1 unknown */
    double achieved_flops;  /* FLOP/s at the median tokens/s; -1 unknown */
    double peak_flops;      /* -1: the GPU's peak is not known */
    double mfu;             /* achieved / peak; -1 unknown */
    char gpu_name[96];      /* config.txt's gpu_name, "" when absent */
    char peak_note[200];    /* why the MFU is unknown, when it is */
} gpc_diag_run_summary;

/* Post-mortem of a gpc train run folder: RUN/config.txt, RUN/metrics.jsonl
 * and a log (log_path, or else RUN/train.log, RUN/log.txt or any RUN/ *.log).
 * An out-of-memory end is recognised by the texts gpc's CUDA backend writes
 * ("out of GPU memory", "no room for ... scratch memory"), CUDA's own
 * ("cudaErrorMemoryAllocation", "CUDA out of memory") and a status of
 * "out of memory"; the finding's remedy says what fits, from gpc plan's
 * model. The classifier runs over the metrics' step times, tokens/s,
 * power readings, exposed all-reduce and input wait; findings go to out as
 * for gpc_diagnose. */
gpc_status gpc_diag_run(const char *run, const char *log_path, gpc_diag_run_summary *summary,
                        gpc_diag_finding *out, int max, int *count);

/* The median input wait of a run folder's last steps (at most last of
 * them, the first two steps of the run left out): *share of the step and
 * *ms, both -1 when the metrics do not record it (a run of an older gpc,
 * or no steps yet). For gpc doctor --pid on a gpc train process. */
gpc_status gpc_diag_run_input_wait(const char *run, int last, double *share, double *ms);

/* 1 when a log line says the GPU ran out of memory. */
int gpc_diag_is_oom_line(const char *line);

#ifdef __cplusplus
}
#endif

#endif /* GPC_DIAGNOSE_H */
