/*
 * gpc sched_sim: trace studies of gpcd's placement policies.
 *
 *   trace.c     job traces: the CSV format, and a generator of synthetic
 *               traces shaped like the published Microsoft Philly statistics
 *   simulate.c  runs a trace through the real scheduling pass (policy.c) on
 *               a simulated clock: no sleeping, no processes
 *
 * `gpc sched trace` and `gpc sched simulate` are the commands on top.
 */
#ifndef GPC_SCHED_SIM_H
#define GPC_SCHED_SIM_H

#include <stdint.h>

#include "gpc/sched.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ----------------------------------------------------------------- traces */

/* One job of a trace. The CSV has a header naming its columns, in any order:
 *   submit      seconds from the start of the trace (>= 0), required
 *   duration    seconds of work the job needs (> 0), required
 *   gpus        GPUs, all at once (1-64), required
 *   priority    low, normal, high or 0-100 (default normal)
 *   time_limit  the limit the user asked for, seconds (> 0; empty or 0 = none)
 * Blank lines and lines starting with '#' are skipped. */
typedef struct {
    double submit;
    double duration;
    int gpus;
    int priority;
    double time_limit;
    int line; /* in the file, for messages */
} sched_trace_job;

typedef struct {
    sched_trace_job *jobs;
    int count;
} sched_trace;

/* Parses CSV text; errors name the source and line ("t.csv line 7: ..."). */
gpc_status sched_trace_parse(const char *text, size_t len, const char *source, sched_trace *out);
gpc_status sched_trace_load(const char *path, sched_trace *out);
/* Writes the trace as CSV (header submit,duration,gpus,priority,time_limit),
 * atomically. */
gpc_status sched_trace_save(const char *path, const sched_trace *trace);
void sched_trace_free(sched_trace *trace);

/* What the generator aims for. The defaults (sched_trace_targets_default)
 * are the Philly-like shape described in trace.c. */
#define SCHED_TRACE_SIZES 5
typedef struct {
    int jobs;
    uint64_t seed;
    int cluster_gpus;                     /* the load is offered to this many GPUs */
    double load;                          /* offered GPU-time / (GPUs x span), e.g. 0.9 */
    int size_gpus[SCHED_TRACE_SIZES];     /* 1, 2, 4, 8, 16 */
    double size_share[SCHED_TRACE_SIZES]; /* share of jobs of each size */
    double duration_median;               /* seconds; log-normal */
    double duration_sigma;                /* of log(duration) */
    double duration_min, duration_max;    /* clipped to this range */
    double burst_mean;                    /* jobs per submission burst (geometric) */
    double diurnal_amplitude;             /* arrival rate 1 +- this over a day */
    double share_high, share_low;         /* priorities; the rest are normal */
} sched_trace_targets;

void sched_trace_targets_default(sched_trace_targets *targets);
gpc_status sched_trace_generate(const sched_trace_targets *targets, sched_trace *out);

/* -------------------------------------------------------------- simulation */

typedef struct {
    int gpus;             /* GPUs in the simulated cluster (1-64) */
    uint64_t gpu_mem;     /* per GPU */
    double preempt_grace; /* a preempted job holds its GPUs this long (checkpointing) */
    double tick;          /* extra passes this often while jobs wait (0 = only on events) */
} sched_sim_options;

typedef struct {
    int jobs, completed, timed_out; /* timed out: ran past their time limit and were stopped */
    int preemptions;
    int64_t passes;
    double mean_jct, median_jct, p95_jct; /* job completion time: end - submit */
    double makespan;                      /* last end - first submit */
    double utilization;                   /* GPU-seconds busy / (GPUs x makespan) */
    double mean_wait, worst_wait;         /* time not running: JCT - time running */
    int worst_wait_line;                  /* the trace line of the job that waited longest */
    double wall_seconds;                  /* what the simulation itself took */
} sched_sim_result;

/* "fifo" (no policy: first come, first served, nothing passes a blocked
 * job), "all", or a comma list for sched_policies_parse. */
gpc_status sched_sim_policy_parse(const char *text, unsigned *flags);

/* Runs the trace through sched_schedule on a simulated clock. jct_out, when
 * not NULL, gets each job's completion time in trace order. */
gpc_status sched_simulate(const sched_trace *trace, const sched_policy_config *policy,
                          const sched_sim_options *options, sched_sim_result *result,
                          double *jct_out);

#ifdef __cplusplus
}
#endif

#endif /* GPC_SCHED_SIM_H */
