/*
 * sched_pass.c: how long one gpcd scheduling pass takes with 10,000 jobs
 * waiting on 8 GPUs (goal: under 5 ms), with every policy on. Two cases:
 * "busy" (every GPU taken by running jobs, the usual state of a loaded
 * server: the pass must order the queue, find nothing fits, reserve for
 * the first job and consider preemption) and "idle" (all 8 GPUs free: the
 * pass places jobs until they are full). Jobs are a random mix of types,
 * GPU counts, memory, priorities and time limits (fixed seed).
 *
 *   bench_sched_pass [--jobs N] [--gpus N] [--repeat N]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "gpc/sched.h"

static gpcd_job *random_job(gpc_rng *rng, int64_t id, int gpus_total, double now) {
    gpcd_job *j = gpcd_job_new();
    j->id = id;
    j->type = (gpcd_job_type)gpc_rng_below(rng, GPCD_TYPE_COUNT);
    j->gpus = j->type == GPCD_TYPE_TRAIN ? 1 << gpc_rng_below(rng, 4) : 1;
    if (j->gpus > gpus_total) j->gpus = gpus_total;
    j->mem = (uint64_t)(1 + gpc_rng_below(rng, 80)) << 30;
    j->priority = (int)gpc_rng_below(rng, 101);
    j->time_limit = gpc_rng_below(rng, 2) ? 600.0 * (1 + gpc_rng_below(rng, 48)) : 0;
    j->submit_time = now - gpc_rng_uniform64(rng) * 86400;
    j->state = GPCD_QUEUED;
    return j;
}

static double run_case(const char *name, int njobs, int ngpus, int repeat, int busy) {
    gpc_rng rng;
    gpc_rng_seed(&rng, 2024, 1);
    double now = 1.8e9;
    gpcd_policy_config policy;
    memset(&policy, 0, sizeof policy);
    policy.flags = GPCD_POLICY_ALL;
    policy.aging_per_hour = 10;
    policy.small_job_mem = 24ull << 30;
    gpcd_job **pending = malloc(sizeof *pending * (size_t)njobs);
    for (int i = 0; i < njobs; i++)
        pending[i] = random_job(&rng, i + 1, ngpus, now);
    /* busy: one training job per GPU at top priority, so nothing preempts it */
    gpcd_job **running = malloc(sizeof *running * (size_t)ngpus);
    int nrunning = busy ? ngpus : 0;
    for (int g = 0; g < nrunning; g++) {
        running[g] = gpcd_job_new();
        running[g]->id = njobs + g + 1;
        running[g]->type = GPCD_TYPE_TRAIN;
        running[g]->priority = GPCD_PRIORITY_MAX;
        running[g]->state = GPCD_RUNNING;
        running[g]->start_time = now - 100;
        running[g]->time_limit = 3600;
        running[g]->assigned_count = 1;
        running[g]->assigned[0] = g;
    }
    gpcd_cluster cluster;
    memset(&cluster, 0, sizeof cluster);
    cluster.count = ngpus;
    for (int g = 0; g < ngpus; g++) {
        cluster.gpu[g].index = g;
        cluster.gpu[g].mem_total = 141ull << 30;
        cluster.gpu[g].numa_node = g < ngpus / 2 ? 0 : 1;
        cluster.gpu[g].util = busy ? 95 : 0;
        for (int h = 0; h < ngpus; h++)
            cluster.nvlink[g][h] = g != h;
    }
    int max_decisions = ngpus * 4 + 16;
    gpcd_decision *decisions = malloc(sizeof *decisions * (size_t)max_decisions);
    double *times = malloc(sizeof *times * (size_t)repeat);
    int started = 0, preempted = 0;
    for (int r = 0; r < repeat; r++) {
        gpcd_pass_stats stats;
        double t0 = gpc_time_seconds();
        gpcd_schedule(&policy, &cluster, pending, njobs, running, nrunning, now, decisions,
                      max_decisions, &stats);
        times[r] = gpc_time_seconds() - t0;
        started = stats.started;
        preempted = stats.preempted;
    }
    qsort(times, (size_t)repeat, sizeof *times, bench_cmp_double);
    printf("%-5s %6d jobs %3d GPUs: median %.3f ms, min %.3f ms, max %.3f ms over %d passes "
           "(%d started, %d preempted per pass)\n",
           name, njobs, ngpus, times[repeat / 2] * 1e3, times[0] * 1e3, times[repeat - 1] * 1e3,
           repeat, started, preempted);
    double median = times[repeat / 2];
    for (int i = 0; i < njobs; i++)
        gpcd_job_free(pending[i]);
    for (int g = 0; g < nrunning; g++)
        gpcd_job_free(running[g]);
    free(pending);
    free(running);
    free(decisions);
    free(times);
    return median;
}

int main(int argc, char **argv) {
    int njobs = 10000, ngpus = 8, repeat = 101;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--jobs") == 0)
            njobs = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--gpus") == 0)
            ngpus = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--repeat") == 0)
            repeat = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_sched_pass [--jobs N] [--gpus N] [--repeat N]\n");
            return 2;
        }
    }
    if (njobs < 1 || ngpus < 1 || ngpus > GPCD_MAX_GPUS || repeat < 1) {
        fprintf(stderr, "bench_sched_pass: error: jobs and repeat must be >= 1, gpus 1-%d\n",
                GPCD_MAX_GPUS);
        return 2;
    }
    double busy = run_case("busy", njobs, ngpus, repeat, 1);
    double idle = run_case("idle", njobs, ngpus, repeat, 0);
    printf("goal: one pass under 5 ms: %s\n", fmax(busy, idle) < 5e-3 ? "met" : "NOT met");
    return 0;
}
