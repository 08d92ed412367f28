/*
 * policy.c: where and when jobs run. Each policy is a small rule that can be
 * switched on or off in the config (`policies = ...`), and the scheduling
 * pass composes the ones that are on:
 *
 *   priority      higher priority first (off: first come, first served)
 *   aging         waiting raises priority, aging_per_hour points per hour,
 *                 so low priority work cannot starve
 *   least_loaded  spread big jobs: prefer GPUs with low live utilisation and
 *                 memory use
 *   binpack       pack small shared jobs onto the fullest GPU that still
 *                 fits, keeping whole GPUs free for big work
 *   task_type     training and batch jobs get whole GPUs, all or nothing
 *                 (gang scheduling), multi-GPU training on NVLink-connected
 *                 sets; inference and interactive jobs with a memory limit
 *                 share GPUs (off: every job takes whole GPUs)
 *   locality      prefer GPUs on the NUMA node of the job's data and GPUs
 *                 that last ran a job on the same data (warm page cache)
 *   backfill      when the first job in line cannot start, it gets a
 *                 reservation (EASY backfill, Lifka 1995): later jobs may use
 *                 its GPUs only if their time limit ends before it could start
 *                 (off: nothing passes a blocked job)
 *   preemption    a blocked job may stop running jobs of lower priority
 *                 (SIGTERM, grace, SIGKILL; they return to the queue), with
 *                 guards against churn: only jobs of lower base priority
 *                 whose effective priority is preempt_margin points below
 *                 its own, only jobs that have run preempt_min_runtime
 *                 (doubled per earlier preemption), and never when the job
 *                 could start within the grace period anyway
 *   elastic       (always on; jobs opt in with a GPU range) an elastic job
 *                 starts at the largest count in its range that is free,
 *                 at least its minimum; it waits and preempts for its
 *                 minimum only; preempted, it restarts at the count then
 *                 free. It grows (stops, restarts at a larger count) only
 *                 when nothing waits, it could at least double, and it has
 *                 run elastic_grow_after seconds at its count: growth never
 *                 delays other work and a restart is worth its cost
 *   shortest_first  short jobs first: a job gains shortest_first_points for
 *                 each halving of the GPU time it asks for (time limit x
 *                 GPUs); with aging nothing starves (opt in, not in "all")
 *
 * The pass is pure: it reads the cluster and the jobs and returns decisions;
 * the daemon carries them out. Scores are "lower is better".
 */
#include "gpc/sched.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

/* One GPU-year in seconds: asking for this much or more earns no
 * shortest_first bonus. */
#define GPCD_SHORTEST_FIRST_REFERENCE (365.0 * 86400.0)

static int policy_shares(const gpcd_policy_config *policy, const gpcd_job *job) {
    return (policy->flags & GPCD_POLICY_TASK_TYPE) && gpcd_job_shares_gpu(job);
}

void gpcd_cluster_account(const gpcd_policy_config *policy, gpcd_cluster *cluster,
                          gpcd_job *const *running, int nrunning) {
    for (int g = 0; g < cluster->count; g++) {
        gpcd_gpu *gpu = &cluster->gpu[g];
        gpu->mem_reserved = 0;
        gpu->exclusive_jobs = gpu->unavailable ? 1 : 0; /* a GPU held back takes no job */
        gpu->shared_jobs = 0;
        gpu->free_time = gpu->unavailable ? INFINITY : 0;
    }
    for (int i = 0; i < nrunning; i++) {
        const gpcd_job *job = running[i];
        double end = job->time_limit > 0 ? job->start_time + job->time_limit : INFINITY;
        int shares = policy_shares(policy, job);
        for (int a = 0; a < job->assigned_count; a++) {
            int g = job->assigned[a];
            if (g < 0 || g >= cluster->count) continue;
            gpcd_gpu *gpu = &cluster->gpu[g];
            /* A shared job reserves its request; an exclusive one the whole GPU. */
            if (shares) {
                gpu->shared_jobs++;
                gpu->mem_reserved += job->mem;
            } else {
                gpu->exclusive_jobs++;
                gpu->mem_reserved = gpu->mem_total;
            }
            if (end > gpu->free_time) gpu->free_time = end;
            if (job->data_hash) gpu->data_hash = job->data_hash;
        }
    }
}

double gpcd_policy_effective_priority(const gpcd_policy_config *policy, const gpcd_job *job,
                                      double now) {
    double p = (policy->flags & GPCD_POLICY_PRIORITY) ? job->priority : 0;
    if ((policy->flags & GPCD_POLICY_AGING) && now > job->submit_time)
        p += policy->aging_per_hour * (now - job->submit_time) / 3600.0;
    if ((policy->flags & GPCD_POLICY_SHORTEST_FIRST) && job->time_limit > 0) {
        /* Shortest expected job first, the expectation being the job's own
         * limit: it minimises mean completion time (SJF), and ordering the
         * queue this way before EASY backfill is what Mu'alem and Feitelson
         * (IEEE TPDS 2001) found best with user estimates. Logarithmic, so
         * the bonus is bounded (at most ~19 halvings from a GPU-year down to
         * a GPU-minute) and aging overtakes it in hours: nothing starves. */
        double ask = job->time_limit * (job->gpus > 0 ? job->gpus : 1);
        double bonus = log2(GPCD_SHORTEST_FIRST_REFERENCE / (ask > 60 ? ask : 60));
        if (bonus > 0) p += policy->shortest_first_points * bonus;
    }
    return p;
}

static uint64_t gpu_available(const gpcd_gpu *gpu) {
    uint64_t taken = gpu->mem_reserved > gpu->mem_used ? gpu->mem_reserved : gpu->mem_used;
    return taken >= gpu->mem_total ? 0 : gpu->mem_total - taken;
}

int gpcd_policy_gpu_admits(const gpcd_policy_config *policy, const gpcd_gpu *gpu,
                           const gpcd_job *job) {
    if (gpu->mem_total < job->mem) return 0;
    if (gpu->exclusive_jobs > 0) return 0;
    if (!policy_shares(policy, job)) {
        /* A whole GPU: nothing of gpcd's on it, and enough memory left by
         * whatever else runs there outside gpcd. */
        return gpu->shared_jobs == 0 &&
               gpu->mem_total - (gpu->mem_used < gpu->mem_total ? gpu->mem_used : gpu->mem_total) >=
                   job->mem;
    }
    return gpu_available(gpu) >= job->mem;
}

double gpcd_policy_gpu_score(const gpcd_policy_config *policy, const gpcd_gpu *gpu,
                             const gpcd_job *job) {
    double score = 0;
    double total = gpu->mem_total ? (double)gpu->mem_total : 1.0;
    int small = (policy->flags & GPCD_POLICY_BINPACK) && policy_shares(policy, job) &&
                job->mem <= policy->small_job_mem;
    if (small) {
        /* Best fit: the least memory left over after placing the job. */
        double left = (double)gpu_available(gpu) - (double)job->mem;
        score += (left > 0 ? left : 0) / total;
    } else if (policy->flags & GPCD_POLICY_LEAST_LOADED) {
        double util = gpu->util < 0 ? 0 : gpu->util;
        score += util / 100.0 + (double)gpu->mem_used / total;
    }
    if (policy->flags & GPCD_POLICY_LOCALITY) {
        if (job->data_numa >= 0 && gpu->numa_node == job->data_numa) score -= 1.0;
        if (job->data_hash && gpu->data_hash == job->data_hash) score -= 0.5;
    }
    return score;
}

typedef struct {
    int gpu;
    double score;
} candidate;

static int candidate_cmp(const void *a, const void *b) {
    const candidate *x = a, *y = b;
    if (x->score != y->score) return x->score < y->score ? -1 : 1;
    return x->gpu - y->gpu;
}

/* Among the candidates (sorted best first), the k-set with the most NVLink
 * pairs, grown greedily from each seed; ties go to the better scores. */
static void pick_nvlink_set(const gpcd_cluster *cluster, const candidate *c, int n, int k,
                            int *out) {
    int best_links = -1;
    double best_score = INFINITY;
    int set[GPCD_MAX_GPUS];
    for (int seed = 0; seed < n; seed++) {
        unsigned char used[GPCD_MAX_GPUS] = {0};
        int size = 0, links = 0;
        double score = c[seed].score;
        set[size++] = seed;
        used[seed] = 1;
        while (size < k) {
            int pick = -1, pick_links = -1;
            for (int i = 0; i < n; i++) {
                if (used[i]) continue;
                int l = 0;
                for (int s = 0; s < size; s++)
                    l += cluster->nvlink[c[i].gpu][c[set[s]].gpu];
                if (l > pick_links) { /* candidates are in score order: first wins ties */
                    pick_links = l;
                    pick = i;
                }
            }
            if (pick < 0) break; /* fewer candidates than k: the callers prevent it */
            used[pick] = 1;
            set[size++] = pick;
            links += pick_links;
            score += c[pick].score;
        }
        if (size < k) continue;
        if (links > best_links || (links == best_links && score < best_score)) {
            best_links = links;
            best_score = score;
            for (int i = 0; i < k; i++)
                out[i] = c[set[i]].gpu;
        }
    }
}

static int place_count(const gpcd_policy_config *policy, const gpcd_cluster *cluster,
                       const gpcd_job *job, int k, const unsigned char *hidden, int *gpus_out) {
    candidate c[GPCD_MAX_GPUS];
    int n = 0;
    if (k < 1 || k > cluster->count) return 0;
    for (int g = 0; g < cluster->count; g++) {
        if (hidden && hidden[g]) continue;
        if (!gpcd_policy_gpu_admits(policy, &cluster->gpu[g], job)) continue;
        c[n].gpu = g;
        c[n].score = gpcd_policy_gpu_score(policy, &cluster->gpu[g], job);
        n++;
    }
    if (n < k) return 0; /* all or nothing */
    qsort(c, (size_t)n, sizeof c[0], candidate_cmp);
    if (k > 1 && (policy->flags & GPCD_POLICY_TASK_TYPE) && job->type == GPCD_TYPE_TRAIN) {
        pick_nvlink_set(cluster, c, n, k, gpus_out);
    } else {
        for (int i = 0; i < k; i++)
            gpus_out[i] = c[i].gpu;
    }
    return k;
}

/* A rigid job at its count; an elastic one at the largest count in its
 * range that fits (at least its minimum). */
static int place_masked(const gpcd_policy_config *policy, const gpcd_cluster *cluster,
                        const gpcd_job *job, const unsigned char *hidden, int *gpus_out) {
    if (!gpcd_job_elastic(job))
        return place_count(policy, cluster, job, job->gpus, hidden, gpus_out);
    int top = job->gpus_max < cluster->count ? job->gpus_max : cluster->count;
    for (int k = top; k >= job->gpus_min; k--)
        if (place_count(policy, cluster, job, k, hidden, gpus_out) == k) return k;
    return 0;
}

int gpcd_policy_place(const gpcd_policy_config *policy, const gpcd_cluster *cluster,
                      const gpcd_job *job, int *gpus_out) {
    return place_masked(policy, cluster, job, NULL, gpus_out);
}

int gpcd_data_numa_node(const gpcd_policy_config *policy, const char *path) {
    if (!path || !*path) return -1;
    int best = -1;
    size_t best_len = 0;
    for (int i = 0; i < policy->numa_rule_count; i++) {
        const gpcd_numa_rule *r = &policy->numa_rules[i];
        size_t len = strlen(r->prefix);
        while (len > 1 && r->prefix[len - 1] == '/')
            len--;
        /* the prefix must end at a path component: /data matches /data/x, not /database */
        if (strncmp(path, r->prefix, len) == 0 && (path[len] == '\0' || path[len] == '/') &&
            len > best_len) {
            best = r->node;
            best_len = len;
        }
    }
    if (best >= 0) return best;
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    const char *tails[] = {"device/numa_node", "../device/numa_node", "device/device/numa_node"};
    for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
        char sys[256];
        snprintf(sys, sizeof sys, "/sys/dev/block/%u:%u/%s", major(st.st_dev), minor(st.st_dev),
                 tails[i]);
        FILE *f = fopen(sys, "r");
        if (!f) continue;
        int node = -1;
        if (fscanf(f, "%d", &node) != 1) node = -1;
        fclose(f);
        if (node >= 0) return node;
    }
    return -1;
}

/* ---------------------------------------------------------------- the pass */

typedef struct {
    gpcd_job *job;
    double priority;
} queued;

static int queued_cmp(const void *a, const void *b) {
    const queued *x = a, *y = b;
    if (x->priority != y->priority) return x->priority > y->priority ? -1 : 1;
    if (x->job->submit_time != y->job->submit_time)
        return x->job->submit_time < y->job->submit_time ? -1 : 1;
    return x->job->id < y->job->id ? -1 : x->job->id > y->job->id;
}

/* Records a started job in the cluster so later jobs in the pass see it. */
static void occupy(const gpcd_policy_config *policy, gpcd_cluster *cluster, const gpcd_job *job,
                   const int *gpus, int k, double now) {
    int shares = policy_shares(policy, job);
    double end = job->time_limit > 0 ? now + job->time_limit : INFINITY;
    for (int i = 0; i < k; i++) {
        gpcd_gpu *gpu = &cluster->gpu[gpus[i]];
        if (shares) {
            gpu->shared_jobs++;
            gpu->mem_reserved += job->mem;
        } else {
            gpu->exclusive_jobs++;
            gpu->mem_reserved = gpu->mem_total;
        }
        if (end > gpu->free_time) gpu->free_time = end;
        if (job->data_hash) gpu->data_hash = job->data_hash;
    }
}

/* Earliest time k GPUs able to hold the job are free, from the running jobs'
 * time limits; marks those GPUs reserved. INFINITY when some never say. */
static double reserve(const gpcd_cluster *cluster, const gpcd_job *job, unsigned char *reserved) {
    candidate c[GPCD_MAX_GPUS];
    int n = 0, k = gpcd_job_min_gpus(job); /* an elastic job waits for its minimum */
    for (int g = 0; g < cluster->count; g++)
        if (cluster->gpu[g].mem_total >= job->mem) {
            c[n].gpu = g;
            c[n].score = cluster->gpu[g].free_time;
            n++;
        }
    memset(reserved, 0, GPCD_MAX_GPUS);
    if (n < k) return INFINITY;
    qsort(c, (size_t)n, sizeof c[0], candidate_cmp);
    for (int i = 0; i < k; i++)
        reserved[c[i].gpu] = 1;
    return c[k - 1].score;
}

static int victim_cmp(const void *a, const void *b) {
    const gpcd_job *x = *(gpcd_job *const *)a, *y = *(gpcd_job *const *)b;
    if (x->priority != y->priority) return x->priority - y->priority;
    /* the fewest GPUs: a small job needing one GPU should not stop eight */
    if (x->gpus != y->gpus) return x->gpus - y->gpus;
    /* the most recently started loses the least work */
    if (x->start_time != y->start_time) return x->start_time > y->start_time ? -1 : 1;
    return 0;
}

/* Accounts the cluster as if only `keep` ran; GPUs left empty read as idle. */
static void account_without(const gpcd_policy_config *policy, gpcd_cluster *sim,
                            const gpcd_cluster *cluster, gpcd_job *const *keep, int nkeep) {
    *sim = *cluster;
    gpcd_cluster_account(policy, sim, keep, nkeep);
    for (int g = 0; g < sim->count; g++) {
        gpcd_gpu *gpu = &sim->gpu[g];
        if (gpu->exclusive_jobs == 0 && gpu->shared_jobs == 0 &&
            (cluster->gpu[g].exclusive_jobs || cluster->gpu[g].shared_jobs)) {
            gpu->mem_used = 0;
            gpu->util = 0;
        } else if (gpu->mem_used > gpu->mem_reserved && cluster->gpu[g].shared_jobs) {
            gpu->mem_used = gpu->mem_reserved;
        }
    }
}

int gpcd_policy_may_preempt(const gpcd_policy_config *policy, const gpcd_job *job,
                            const gpcd_job *victim, double now) {
    /* Base priorities first: aging and shortest_first must not let jobs of
     * equal priority stop each other (each would overtake the other in
     * turn as it waits, and they would ping-pong). */
    if (victim->priority >= job->priority) return 0;
    /* Then the same order the queue uses, with a margin: a victim the queue
     * would put ahead of the job (or about level with it) would be requeued
     * only to take its GPUs back at once. */
    if (gpcd_policy_effective_priority(policy, job, now) <
        gpcd_policy_effective_priority(policy, victim, now) + policy->preempt_margin)
        return 0;
    /* Let it run a while first: stopping a job that just started throws
     * away its start-up (loading, warm-up) for little gain. Each earlier
     * preemption doubles the protection, so no job is stopped over and over. */
    int times = victim->preemptions < 16 ? victim->preemptions : 16;
    if (now - victim->start_time < policy->preempt_min_runtime * (double)(1 << times)) return 0;
    /* A victim whose time limit ends within the grace frees its GPUs as soon
     * by itself. */
    if (victim->time_limit > 0 &&
        victim->start_time + victim->time_limit <= now + policy->preempt_grace)
        return 0;
    return 1;
}

/* For a job on whole GPUs: the victims whose GPUs make up what it lacks
 * with the fewest GPUs freed beyond that (stopping a 2-GPU job to start a
 * 1-GPU one leaves a GPU idle). A 0/1 knapsack over GPU counts, the
 * victims taken in victim_cmp order so that among equal totals the first
 * found (lower priority, fewer GPUs, started later) wins. Writes the
 * chosen victims' indices, returns their count; -1 when no set suffices. */
static int fewest_gpus_freed(const gpcd_policy_config *policy, const gpcd_cluster *sim,
                             const gpcd_job *job, gpcd_job *const *victims, int nvictims,
                             int *chosen) {
    if (policy_shares(policy, job) || nvictims > GPCD_MAX_GPUS) return -1;
    int free_now = 0, weight[GPCD_MAX_GPUS];
    for (int g = 0; g < sim->count; g++)
        free_now += sim->gpu[g].exclusive_jobs == 0 && sim->gpu[g].shared_jobs == 0 &&
                    sim->gpu[g].mem_total >= job->mem;
    int lack = job->gpus - free_now;
    if (lack <= 0) return -1;
    for (int v = 0; v < nvictims; v++) {
        if (policy_shares(policy, victims[v])) return -1; /* its GPUs may stay shared */
        weight[v] = 0;
        for (int a = 0; a < victims[v]->assigned_count; a++) {
            int g = victims[v]->assigned[a];
            if (g >= 0 && g < sim->count && sim->gpu[g].mem_total >= job->mem &&
                !sim->gpu[g].unavailable)
                weight[v]++;
        }
    }
    /* reach[s]: the victim that first made a total of s GPUs reachable (the
     * rest of the set is reach[s - its weight], found earlier); -1 never */
    int reach[GPCD_MAX_GPUS + 1];
    memset(reach, -1, sizeof reach);
    reach[0] = GPCD_MAX_GPUS; /* the empty set */
    for (int v = 0; v < nvictims; v++)
        for (int s = GPCD_MAX_GPUS; s >= weight[v]; s--)
            if (weight[v] > 0 && reach[s] < 0 && reach[s - weight[v]] >= 0 &&
                reach[s - weight[v]] != v)
                reach[s] = v;
    int total = -1;
    for (int s = lack; s <= GPCD_MAX_GPUS && total < 0; s++)
        if (reach[s] >= 0) total = s;
    if (total < 0) return -1;
    int n = 0;
    for (int s = total; s > 0; s -= weight[reach[s]])
        chosen[n++] = reach[s];
    return n;
}

/* Chooses running jobs of lower priority whose GPUs would let `job` start.
 * Jobs already stopping count as gone. Returns decisions written. */
static int preempt_for(const gpcd_policy_config *policy, const gpcd_cluster *cluster,
                       const gpcd_job *waiting, gpcd_job *const *running, int nrunning, double now,
                       gpcd_decision *out, int max_out) {
    /* An elastic job stops others for its minimum only: it starts there and
     * grows once the queue is empty. */
    gpcd_job need = *waiting;
    need.gpus = gpcd_job_min_gpus(waiting);
    need.gpus_min = need.gpus_max = 0;
    const gpcd_job *job = &need;
    gpcd_job **keep = malloc(sizeof *keep * (size_t)(nrunning + 1));
    gpcd_job **victims = malloc(sizeof *victims * (size_t)(nrunning + 1));
    gpcd_cluster *sim = malloc(sizeof *sim);
    int nkeep = 0, nvictims = 0, written = 0, gpus[GPCD_MAX_GPUS];
    unsigned char reserved[GPCD_MAX_GPUS];
    if (!keep || !victims || !sim) goto done;
    for (int i = 0; i < nrunning; i++) {
        if (running[i]->stop_reason != GPCD_STOP_NONE) continue;
        keep[nkeep++] = running[i];
        if (gpcd_policy_may_preempt(policy, job, running[i], now)) victims[nvictims++] = running[i];
    }
    if (nvictims == 0) goto done;
    account_without(policy, sim, cluster, keep, nkeep);
    if (place_masked(policy, sim, job, NULL, gpus) > 0) goto done; /* wait for those stopping */
    /* GPUs that the running jobs' time limits free within the grace would
     * start the job as soon as preempting could. */
    if (reserve(sim, job, reserved) <= now + policy->preempt_grace) goto done;
    qsort(victims, (size_t)nvictims, sizeof *victims, victim_cmp);
    int chosen[GPCD_MAX_GPUS];
    int nchosen = fewest_gpus_freed(policy, sim, job, victims, nvictims, chosen);
    if (nchosen > 0) {
        int nleft = 0;
        for (int i = 0; i < nkeep; i++) {
            int is_chosen = 0;
            for (int k = 0; k < nchosen; k++)
                is_chosen |= keep[i] == victims[chosen[k]];
            if (!is_chosen) keep[nleft++] = keep[i];
        }
        account_without(policy, sim, cluster, keep, nleft);
        if (place_masked(policy, sim, job, NULL, gpus) > 0) {
            for (int k = 0; k < nchosen && written < max_out; k++) {
                out[written].kind = GPCD_DECIDE_PREEMPT;
                out[written].job = victims[chosen[k]];
                out[written].gpu_count = 0;
                written++;
            }
            goto done;
        }
        /* placement wants more than a count of GPUs (memory left by
         * others): the greedy search below */
    }
    for (int v = 0; v < nvictims; v++) {
        for (int i = 0; i < nkeep; i++)
            if (keep[i] == victims[v]) {
                keep[i] = keep[--nkeep];
                break;
            }
        account_without(policy, sim, cluster, keep, nkeep);
        if (place_masked(policy, sim, job, NULL, gpus) > 0) {
            /* Of the victims tried, stop only those whose GPUs the job needs. */
            for (int u = 0; u <= v && written < max_out; u++) {
                int needed = 0;
                for (int a = 0; a < victims[u]->assigned_count; a++)
                    for (int i = 0; i < job->gpus; i++)
                        if (victims[u]->assigned[a] == gpus[i]) needed = 1;
                if (!needed) continue;
                out[written].kind = GPCD_DECIDE_PREEMPT;
                out[written].job = victims[u];
                out[written].gpu_count = 0;
                written++;
            }
            break;
        }
    }
done:
    free(keep);
    free(victims);
    free(sim);
    return written;
}

static int any_gpu_open(const gpcd_cluster *cluster) {
    for (int g = 0; g < cluster->count; g++)
        if (cluster->gpu[g].exclusive_jobs == 0 && gpu_available(&cluster->gpu[g]) > 0) return 1;
    return 0;
}

/* With nothing waiting: elastic jobs that could at least double on the
 * GPUs left free, and have run elastic_grow_after seconds at their count,
 * are told to restart larger (a stop and a restart from the checkpoint
 * cost minutes, so a small gain is not worth it, and the wait keeps a job
 * from resizing over and over). Free GPUs are promised in the running
 * jobs' order, each to one job. */
static int grow(const gpcd_policy_config *policy, const gpcd_cluster *cluster,
                gpcd_job *const *running, int nrunning, double now, gpcd_decision *out, int max_out,
                gpcd_pass_stats *stats) {
    if (policy->elastic_grow_after <= 0) return 0;
    unsigned char promised[GPCD_MAX_GPUS] = {0};
    int written = 0;
    for (int i = 0; i < nrunning && written < max_out; i++) {
        const gpcd_job *job = running[i];
        int cur = job->assigned_count;
        if (!gpcd_job_elastic(job) || job->stop_reason != GPCD_STOP_NONE || cur < 1 ||
            cur >= job->gpus_max || now - job->start_time < policy->elastic_grow_after)
            continue;
        int freeg[GPCD_MAX_GPUS], nfree = 0;
        for (int g = 0; g < cluster->count; g++)
            if (!promised[g] && gpcd_policy_gpu_admits(policy, &cluster->gpu[g], job))
                freeg[nfree++] = g;
        int target = cur + nfree < job->gpus_max ? cur + nfree : job->gpus_max;
        if (target < 2 * cur) continue;
        for (int k = 0; k < target - cur; k++)
            promised[freeg[k]] = 1;
        out[written].kind = GPCD_DECIDE_RESIZE;
        out[written].job = running[i];
        out[written].gpu_count = target;
        written++;
        stats->resized++;
    }
    return written;
}

int gpcd_schedule(const gpcd_policy_config *policy, gpcd_cluster *cluster, gpcd_job *const *pending,
                  int npending, gpcd_job *const *running, int nrunning, double now,
                  gpcd_decision *decisions, int max_decisions, gpcd_pass_stats *stats) {
    gpcd_pass_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    gpcd_cluster_account(policy, cluster, running, nrunning);
    if (npending == 0)
        return grow(policy, cluster, running, nrunning, now, decisions, max_decisions, stats);
    queued *order = malloc(sizeof *order * (size_t)npending);
    if (!order) return 0;
    for (int i = 0; i < npending; i++) {
        order[i].job = pending[i];
        order[i].priority = gpcd_policy_effective_priority(policy, pending[i], now);
    }
    qsort(order, (size_t)npending, sizeof *order, queued_cmp);

    int written = 0, blocked_seen = 0, reservation = 0;
    unsigned char reserved[GPCD_MAX_GPUS];
    double shadow = INFINITY;
    for (int i = 0; i < npending && written < max_decisions; i++) {
        gpcd_job *job = order[i].job;
        /* With every GPU taken only the first blocked job has anything left
         * to do (preempt, reserve): the rest of the queue waits. */
        int open = any_gpu_open(cluster);
        if (!open && blocked_seen) {
            stats->blocked += npending - i;
            break;
        }
        /* A job may use reserved GPUs only if it surely ends before the
         * reserved job could start. */
        int backfills = job->time_limit > 0 && now + job->time_limit <= shadow;
        int gpus[GPCD_MAX_GPUS];
        int k = open ? place_masked(policy, cluster, job,
                                    reservation && !backfills ? reserved : NULL, gpus)
                     : 0;
        if (k > 0) {
            gpcd_decision *d = &decisions[written++];
            d->kind = GPCD_DECIDE_START;
            d->job = job;
            d->gpu_count = k;
            memcpy(d->gpus, gpus, sizeof(int) * (size_t)k);
            occupy(policy, cluster, job, gpus, k, now);
            stats->started++;
            continue;
        }
        stats->blocked++;
        if (blocked_seen) continue;
        blocked_seen = 1;
        if (policy->flags & GPCD_POLICY_PREEMPTION) {
            int n = preempt_for(policy, cluster, job, running, nrunning, now, decisions + written,
                                max_decisions - written);
            written += n;
            stats->preempted += n;
        }
        if (!(policy->flags & GPCD_POLICY_BACKFILL)) {
            stats->blocked += npending - i - 1;
            break;
        }
        shadow = reserve(cluster, job, reserved);
        reservation = 1;
        stats->reserved_for = job->id;
        stats->reservation_time = shadow;
    }
    free(order);
    if (stats->blocked == 0 && stats->preempted == 0)
        written += grow(policy, cluster, running, nrunning, now, decisions + written,
                        max_decisions - written, stats);
    return written;
}
