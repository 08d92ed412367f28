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
} gpcd_trace_job;

typedef struct {
    gpcd_trace_job *jobs;
    int count;
} gpcd_trace;

/* Parses CSV text; errors name the source and line ("t.csv line 7: ..."). */
gpc_status gpcd_trace_parse(const char *text, size_t len, const char *source, gpcd_trace *out);
gpc_status gpcd_trace_load(const char *path, gpcd_trace *out);
/* Writes the trace as CSV (header submit,duration,gpus,priority,time_limit),
 * atomically. */
gpc_status gpcd_trace_save(const char *path, const gpcd_trace *trace);
void gpcd_trace_free(gpcd_trace *trace);

/* What the generator aims for. The defaults (gpcd_trace_targets_default)
 * are the Philly-like shape described in trace.c. */
#define GPCD_TRACE_SIZES 5
typedef struct {
    int jobs;
    uint64_t seed;
    int cluster_gpus;                    /* the load is offered to this many GPUs */
    double load;                         /* offered GPU-time / (GPUs x span), e.g. 0.9 */
    int size_gpus[GPCD_TRACE_SIZES];     /* 1, 2, 4, 8, 16 */
    double size_share[GPCD_TRACE_SIZES]; /* share of jobs of each size */
    double duration_median;              /* seconds; log-normal */
    double duration_sigma;               /* of log(duration) */
    double duration_min, duration_max;   /* clipped to this range */
    double burst_mean;                   /* jobs per submission burst (geometric) */
    double diurnal_amplitude;            /* arrival rate 1 +- this over a day */
    double share_high, share_low;        /* priorities; the rest are normal */
} gpcd_trace_targets;

void gpcd_trace_targets_default(gpcd_trace_targets *targets);
gpc_status gpcd_trace_generate(const gpcd_trace_targets *targets, gpcd_trace *out);

/* -------------------------------------------------------------- simulation */

typedef struct {
    int gpus;             /* GPUs in the simulated cluster (1-64) */
    uint64_t gpu_mem;     /* per GPU */
    double preempt_grace; /* a preempted job holds its GPUs this long (checkpointing) */
    double tick;          /* extra passes this often while jobs wait (0 = only on events) */
    /* This share of the jobs (0..1, spread evenly over the trace) is
     * elastic: a job of G GPUs runs at any count from ceil(G/2) to 2G (at
     * most the cluster), its work scaling linearly with the count. */
    double elastic;
} gpcd_sim_options;

typedef struct {
    int jobs, completed, timed_out; /* timed out: ran past their time limit and were stopped */
    int preemptions;
    int elastic_jobs; /* jobs made elastic (gpcd_sim_options.elastic) */
    int resizes;      /* elastic jobs stopped to grow */
    int64_t passes;
    double mean_jct, median_jct, p95_jct; /* job completion time: end - submit */
    double makespan;                      /* last end - first submit */
    double utilization;                   /* GPU-seconds busy / (GPUs x makespan) */
    double mean_wait, worst_wait;         /* time not running: JCT - time running */
    int worst_wait_line;                  /* the trace line of the job that waited longest */
    double wall_seconds;                  /* what the simulation itself took */
} gpcd_sim_result;

/* "fifo" (no policy: first come, first served, nothing passes a blocked
 * job), "all", or a comma list for gpcd_policies_parse. */
gpc_status gpcd_sim_policy_parse(const char *text, unsigned *flags);

/* Runs the trace through gpcd_schedule on a simulated clock. jct_out, when
 * not NULL, gets each job's completion time in trace order. */
gpc_status gpcd_simulate(const gpcd_trace *trace, const gpcd_policy_config *policy,
                         const gpcd_sim_options *options, gpcd_sim_result *result, double *jct_out);

#ifdef __cplusplus
}
#endif

#endif /* GPC_SCHED_SIM_H */
