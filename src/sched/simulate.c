/*
 * simulate.c: runs a job trace through gpcd's scheduling pass
 * (gpcd_schedule in policy.c, the very code the daemon runs) on a simulated
 * clock. Nothing sleeps and nothing is started: time jumps from one event to
 * the next (a job arrives, ends, or finishes stopping after preemption), and
 * a pass runs at every event, as the daemon runs one whenever a job arrives
 * or ends. Optionally a pass also runs every `tick` seconds while jobs wait,
 * as the daemon's once-a-second pass lets aging reorder the queue.
 *
 * What is modelled, and how it matches the daemon:
 *   - the cluster: `gpus` GPUs of `gpu_mem`, in NVLink groups of 8 (one HGX
 *     server each) with the first half of each group on NUMA node 0; a GPU
 *     reads 97% busy while a job runs on it, like the simulated provider;
 *   - jobs are training jobs needing whole GPUs (Philly's workload) with the
 *     trace's priority and time limit; a job still running at its time
 *     limit is stopped there and counts as failed (timed out);
 *   - preemption: the victim gets SIGTERM, checkpoints (it keeps the work
 *     done until then, as gpc train does), holds its GPUs for the grace
 *     period, and waits in the queue to run again;
 *   - elastic jobs (options->elastic): a share of the jobs, spread evenly
 *     over the trace, runs at any count from half to twice its trace count.
 *     Work is the trace's duration at the trace's count and scales linearly
 *     with the count (optimistic for large counts: a study of the policy,
 *     not of scaling); its time limit is stretched to hold at its minimum.
 *     A resize is a stop like a preemption (grace, checkpoint, requeue).
 * Reported: mean, median and p95 job completion time (end - submit; p95 by
 * nearest rank), makespan, GPU utilisation, and the waits (time a job spent
 * not running) with the worst one, to show whether anything starves.
 */
#define _GNU_SOURCE /* qsort_r */
#include "gpc/sched_sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Per-job simulation state beside the real gpcd_job the policy sees. */
typedef struct {
    double remaining; /* seconds of work left at the trace's GPU count */
    int trace_gpus;   /* that count */
    double speed;     /* work seconds per second in the current run: count / trace_gpus */
    double run_start; /* when the current run began */
    double end_at;    /* when the current run ends by itself (done or time limit) */
    double term_at;   /* SIGTERM for preemption, 0 if none */
    double stop_at;   /* term_at + grace: when it has let go of its GPUs */
    double ran;       /* seconds running, over all runs */
    double jct;
} sim_state;

typedef struct {
    const gpcd_policy_config *policy;
    const gpcd_sim_options *options;
    int n;
    gpcd_job *jobs;   /* trace order sorted by submission */
    sim_state *state; /* same index */
    int *trace_index; /* sorted position -> trace position */
    gpcd_job **pending, **running;
    int npending, nrunning;
    gpcd_cluster cluster;
    double busy_gpu_seconds;
    gpcd_sim_result *result;
} simulation;

gpc_status gpcd_sim_policy_parse(const char *text, unsigned *flags) {
    if (strcmp(text, "fifo") == 0) {
        *flags = 0;
        return GPC_OK;
    }
    if (strcmp(text, "all") == 0) {
        *flags = GPCD_POLICY_ALL;
        return GPC_OK;
    }
    return gpcd_policies_parse(text, flags);
}

static void cluster_init(gpcd_cluster *c, const gpcd_sim_options *o) {
    memset(c, 0, sizeof *c);
    c->count = o->gpus;
    for (int g = 0; g < o->gpus; g++) {
        c->gpu[g].index = g;
        c->gpu[g].mem_total = o->gpu_mem;
        c->gpu[g].numa_node = (g % 8) < 4 ? 0 : 1;
        for (int h = 0; h < o->gpus; h++)
            c->nvlink[g][h] = g != h && g / 8 == h / 8;
    }
}

/* The live readings the monitor would give: busy GPUs at 97%. */
static void cluster_readings(simulation *s) {
    for (int g = 0; g < s->cluster.count; g++) {
        s->cluster.gpu[g].util = 0;
        s->cluster.gpu[g].mem_used = 0;
    }
    for (int i = 0; i < s->nrunning; i++)
        for (int a = 0; a < s->running[i]->assigned_count; a++)
            s->cluster.gpu[s->running[i]->assigned[a]].util = 97;
}

static double run_event_time(const simulation *s, const gpcd_job *job) {
    const sim_state *st = &s->state[job - s->jobs];
    return st->term_at > 0 && st->stop_at < st->end_at ? st->stop_at : st->end_at;
}

static void start(simulation *s, gpcd_job *job, const int *gpus, int k, double now) {
    sim_state *st = &s->state[job - s->jobs];
    job->state = GPCD_RUNNING;
    job->start_time = now;
    job->assigned_count = k;
    memcpy(job->assigned, gpus, sizeof(int) * (size_t)k);
    st->run_start = now;
    job->gpus = k; /* an elastic job's count for this run, as gpcd records it */
    st->speed = (double)k / st->trace_gpus;
    double run = st->remaining / st->speed;
    if (job->time_limit > 0 && job->time_limit < run) run = job->time_limit;
    st->end_at = now + run;
    st->term_at = st->stop_at = 0;
    s->running[s->nrunning++] = job;
}

/* A run ends at `now`: finished, timed out, or stopped after preemption. */
static void finish_run(simulation *s, int r, double now) {
    gpcd_job *job = s->running[r];
    sim_state *st = &s->state[job - s->jobs];
    double progress_until = now;
    s->busy_gpu_seconds += (now - st->run_start) * job->gpus;
    if (st->term_at > 0 && st->stop_at < st->end_at) {
        /* preempted or resized: the work up to SIGTERM was checkpointed */
        progress_until = st->term_at;
        st->remaining -= (progress_until - st->run_start) * st->speed;
        st->ran += now - st->run_start;
        job->state = GPCD_PREEMPTED;
        job->start_time = 0;
        if (job->stop_reason == GPCD_STOP_RESIZE) {
            s->result->resizes++;
        } else {
            job->preemptions++;
            s->result->preemptions++;
        }
        s->pending[s->npending++] = job;
    } else {
        st->ran += now - st->run_start;
        double work = (now - st->run_start) * st->speed;
        int done = st->remaining <= work + 1e-9 * (1 + st->remaining);
        st->remaining = done ? 0 : st->remaining - work;
        job->state = done ? GPCD_COMPLETED : GPCD_FAILED;
        job->end_time = now;
        st->jct = now - job->submit_time;
        if (done)
            s->result->completed++;
        else
            s->result->timed_out++;
    }
    job->assigned_count = 0;
    job->stop_reason = GPCD_STOP_NONE;
    job->term_sent = 0;
    st->term_at = st->stop_at = 0;
    s->running[r] = s->running[--s->nrunning];
}

/* Runs passes at `now` until one leaves nothing more to do. */
static void schedule(simulation *s, double now, gpcd_decision *decisions, int max_decisions) {
    for (;;) {
        cluster_readings(s);
        int n = gpcd_schedule(s->policy, &s->cluster, s->pending, s->npending, s->running,
                              s->nrunning, now, decisions, max_decisions, NULL);
        s->result->passes++;
        int started = 0;
        for (int i = 0; i < n; i++) {
            gpcd_decision *d = &decisions[i];
            sim_state *st = &s->state[d->job - s->jobs];
            if (d->kind == GPCD_DECIDE_START) {
                start(s, d->job, d->gpus, d->gpu_count, now);
                started++;
            } else if (d->job->stop_reason == GPCD_STOP_NONE) {
                d->job->stop_reason =
                    d->kind == GPCD_DECIDE_RESIZE ? GPCD_STOP_RESIZE : GPCD_STOP_PREEMPT;
                d->job->term_sent = now;
                st->term_at = now;
                st->stop_at = now + s->options->preempt_grace;
            }
        }
        /* drop the started jobs from the queue, keeping its order */
        int kept = 0;
        for (int i = 0; i < s->npending; i++)
            if (gpcd_state_is_pending(s->pending[i]->state)) s->pending[kept++] = s->pending[i];
        s->npending = kept;
        if (n < max_decisions || started == 0) break;
    }
}

static int cmp_index_by_submit(const void *a, const void *b, void *arg) {
    const gpcd_trace *t = arg;
    int x = *(const int *)a, y = *(const int *)b;
    if (t->jobs[x].submit != t->jobs[y].submit)
        return t->jobs[x].submit < t->jobs[y].submit ? -1 : 1;
    return x - y;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void simulation_free(simulation *s) {
    free(s->jobs);
    free(s->state);
    free(s->trace_index);
    free(s->pending);
    free(s->running);
}

gpc_status gpcd_simulate(const gpcd_trace *trace, const gpcd_policy_config *policy,
                         const gpcd_sim_options *options, gpcd_sim_result *result,
                         double *jct_out) {
    memset(result, 0, sizeof *result);
    if (options->gpus < 1 || options->gpus > GPCD_MAX_GPUS)
        return gpc_error(GPC_ERR_INVALID_ARG, "the simulated cluster needs 1-%d GPUs, not %d",
                         GPCD_MAX_GPUS, options->gpus);
    if (trace->count < 1) return gpc_error(GPC_ERR_INVALID_ARG, "the trace has no jobs");
    for (int i = 0; i < trace->count; i++)
        if (trace->jobs[i].gpus > options->gpus)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "the job on trace line %d needs %d GPUs; the simulated cluster has "
                             "%d (use --gpus)",
                             trace->jobs[i].line, trace->jobs[i].gpus, options->gpus);
    double t0 = gpc_time_seconds();
    simulation s;
    memset(&s, 0, sizeof s);
    /* the pass weighs preemption against the grace the simulation gives */
    gpcd_policy_config sim_policy = *policy;
    sim_policy.preempt_grace = options->preempt_grace;
    s.policy = &sim_policy;
    if (!(options->elastic >= 0 && options->elastic <= 1))
        return gpc_error(GPC_ERR_INVALID_ARG, "the elastic share must be 0-1, not %g",
                         options->elastic);
    s.options = options;
    s.result = result;
    s.n = trace->count;
    s.jobs = calloc((size_t)s.n, sizeof *s.jobs);
    s.state = calloc((size_t)s.n, sizeof *s.state);
    s.trace_index = malloc(sizeof *s.trace_index * (size_t)s.n);
    s.pending = malloc(sizeof *s.pending * (size_t)s.n);
    s.running = malloc(sizeof *s.running * (size_t)(s.n < 4096 ? s.n : 4096));
    int max_decisions = options->gpus * 4 + 16; /* as the daemon asks for */
    gpcd_decision *decisions = malloc(sizeof *decisions * (size_t)max_decisions);
    if (!s.jobs || !s.state || !s.trace_index || !s.pending || !s.running || !decisions) {
        simulation_free(&s);
        free(decisions);
        return gpc_error(GPC_ERR_NOMEM, "out of memory simulating %d jobs", s.n);
    }
    for (int i = 0; i < s.n; i++)
        s.trace_index[i] = i;
    qsort_r(s.trace_index, (size_t)s.n, sizeof *s.trace_index, cmp_index_by_submit, (void *)trace);
    for (int i = 0; i < s.n; i++) {
        const gpcd_trace_job *t = &trace->jobs[s.trace_index[i]];
        gpcd_job *job = &s.jobs[i];
        job->id = i + 1;
        job->gpus = t->gpus;
        job->priority = t->priority;
        job->type = GPCD_TYPE_TRAIN;
        job->time_limit = t->time_limit;
        job->submit_time = t->submit;
        job->exit_code = -1;
        job->data_numa = -1;
        job->state = GPCD_QUEUED;
        s.state[i].remaining = t->duration;
        s.state[i].trace_gpus = t->gpus;
        s.state[i].speed = 1;
        /* the golden-ratio sequence spreads the elastic share evenly over
         * the trace, the same jobs for the same share */
        double phase = fmod((s.trace_index[i] + 1) * 0.6180339887498949, 1.0);
        if (phase < options->elastic) {
            int lo = (t->gpus + 1) / 2,
                hi = 2 * t->gpus < options->gpus ? 2 * t->gpus : options->gpus;
            if (hi > lo) {
                job->gpus_min = lo;
                job->gpus_max = hi;
                job->gpus = hi;
                if (job->time_limit > 0) job->time_limit *= (double)t->gpus / lo;
                result->elastic_jobs++;
            }
        }
    }
    cluster_init(&s.cluster, options);

    int arrived = 0;
    double now = s.jobs[0].submit_time, last_pass = now;
    while (arrived < s.n || s.nrunning > 0 || s.npending > 0) {
        double next = INFINITY;
        if (arrived < s.n) next = s.jobs[arrived].submit_time;
        for (int r = 0; r < s.nrunning; r++) {
            double e = run_event_time(&s, s.running[r]);
            if (e < next) next = e;
        }
        if (options->tick > 0 && s.npending > 0 && last_pass + options->tick < next)
            next = last_pass + options->tick;
        /* the daemon's once-a-second pass would see an elastic job become
         * free to grow: a pass then (the policy decides whether it does) */
        for (int r = 0; r < s.nrunning && sim_policy.elastic_grow_after > 0; r++) {
            const gpcd_job *job = s.running[r];
            double at = job->start_time + sim_policy.elastic_grow_after;
            if (gpcd_job_elastic(job) && job->stop_reason == GPCD_STOP_NONE &&
                job->assigned_count < job->gpus_max && at > now && at < next)
                next = at;
        }
        if (!isfinite(next)) {
            /* waiting jobs, nothing running, nothing arriving: the policy
             * would never start them (a bug, since every job fits) */
            simulation_free(&s);
            free(decisions);
            return gpc_error(GPC_ERR_INTERNAL,
                             "simulation stalled at t=%.0f s with %d jobs waiting on an idle "
                             "cluster",
                             now, s.npending);
        }
        now = next;
        for (int r = 0; r < s.nrunning; r++)
            if (run_event_time(&s, s.running[r]) <= now) finish_run(&s, r--, now);
        while (arrived < s.n && s.jobs[arrived].submit_time <= now)
            s.pending[s.npending++] = &s.jobs[arrived++];
        schedule(&s, now, decisions, max_decisions);
        last_pass = now;
    }
    free(decisions);

    /* statistics, in trace order */
    double *sorted = malloc(sizeof *sorted * (size_t)s.n);
    if (!sorted) {
        simulation_free(&s);
        return gpc_error(GPC_ERR_NOMEM, "out of memory summarising %d jobs", s.n);
    }
    double first = s.jobs[0].submit_time, last = first, jct_sum = 0, wait_sum = 0;
    result->worst_wait = -1;
    for (int i = 0; i < s.n; i++) {
        const sim_state *st = &s.state[i];
        double wait = st->jct - st->ran;
        sorted[i] = st->jct;
        jct_sum += st->jct;
        wait_sum += wait;
        if (s.jobs[i].end_time > last) last = s.jobs[i].end_time;
        if (wait > result->worst_wait) {
            result->worst_wait = wait;
            result->worst_wait_line = trace->jobs[s.trace_index[i]].line;
        }
        if (jct_out) jct_out[s.trace_index[i]] = st->jct;
    }
    qsort(sorted, (size_t)s.n, sizeof *sorted, cmp_double);
    result->jobs = s.n;
    result->mean_jct = jct_sum / s.n;
    result->median_jct = s.n % 2 ? sorted[s.n / 2] : 0.5 * (sorted[s.n / 2 - 1] + sorted[s.n / 2]);
    int rank = (int)ceil(0.95 * s.n); /* nearest rank */
    result->p95_jct = sorted[rank - 1];
    result->makespan = last - first;
    result->utilization =
        result->makespan > 0 ? s.busy_gpu_seconds / (options->gpus * result->makespan) : 0;
    result->mean_wait = wait_sum / s.n;
    result->wall_seconds = gpc_time_seconds() - t0;
    free(sorted);
    simulation_free(&s);
    return GPC_OK;
}
