/*
 * test_policy.c: each placement policy on its own, against an answer worked
 * out another way (a direct formula, a brute-force search, or a scenario
 * whose outcome follows from the rule), with random clusters from
 * test_seed().
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/sched.h"

#define GIB (1024.0 * 1024 * 1024)

static gpcd_policy_config policy_with(unsigned flags) {
    gpcd_policy_config p;
    memset(&p, 0, sizeof p);
    p.flags = flags;
    p.aging_per_hour = 10;
    p.small_job_mem = (uint64_t)(24 * GIB);
    return p;
}

static void cluster_init(gpcd_cluster *c, int n, double mem_gib) {
    memset(c, 0, sizeof *c);
    c->count = n;
    for (int g = 0; g < n; g++) {
        c->gpu[g].index = g;
        c->gpu[g].mem_total = (uint64_t)(mem_gib * GIB);
        c->gpu[g].numa_node = g < n / 2 ? 0 : 1;
        for (int h = 0; h < n; h++)
            c->nvlink[g][h] = g != h;
    }
}

static gpcd_job *job_make(int64_t id, int gpus, double mem_gib, int priority, gpcd_job_type type,
                          double submit) {
    gpcd_job *j = gpcd_job_new();
    j->id = id;
    j->gpus = gpus;
    j->mem = (uint64_t)(mem_gib * GIB);
    j->priority = priority;
    j->type = type;
    j->submit_time = submit;
    j->state = GPCD_QUEUED;
    return j;
}

static void job_run_on(gpcd_job *j, double start, int count, const int *gpus) {
    j->state = GPCD_RUNNING;
    j->start_time = start;
    j->assigned_count = count;
    for (int i = 0; i < count; i++)
        j->assigned[i] = gpus[i];
}

static int started(const gpcd_decision *d, int n, int64_t id, int *gpus_out) {
    for (int i = 0; i < n; i++)
        if (d[i].kind == GPCD_DECIDE_START && d[i].job->id == id) {
            if (gpus_out) memcpy(gpus_out, d[i].gpus, sizeof(int) * (size_t)d[i].gpu_count);
            return d[i].gpu_count;
        }
    return 0;
}

static int preempted(const gpcd_decision *d, int n, int64_t id) {
    for (int i = 0; i < n; i++)
        if (d[i].kind == GPCD_DECIDE_PREEMPT && d[i].job->id == id) return 1;
    return 0;
}

/* priority: with one free GPU, the high priority job starts whatever the
 * submission order; without the policy the first submitted does. */
static void test_priority_orders_queue(void **state) {
    (void)state;
    gpcd_cluster c;
    cluster_init(&c, 1, 80);
    gpcd_job *low = job_make(1, 1, 10, GPCD_PRIORITY_LOW, GPCD_TYPE_BATCH, 100);
    gpcd_job *high = job_make(2, 1, 10, GPCD_PRIORITY_HIGH, GPCD_TYPE_BATCH, 200);
    gpcd_job *pending[] = {low, high};
    gpcd_decision d[8];
    gpcd_policy_config p = policy_with(GPCD_POLICY_PRIORITY);
    int n = gpcd_schedule(&p, &c, pending, 2, NULL, 0, 300, d, 8, NULL);
    assert_int_equal(n, 1);
    assert_int_equal(started(d, n, 2, NULL), 1);
    p = policy_with(0); /* first come, first served */
    n = gpcd_schedule(&p, &c, pending, 2, NULL, 0, 300, d, 8, NULL);
    assert_int_equal(n, 1);
    assert_int_equal(started(d, n, 1, NULL), 1);
    gpcd_job_free(low);
    gpcd_job_free(high);
}

/* aging: effective priority is priority + rate * hours waited; a low job
 * that waited long enough overtakes a fresh high one. */
static void test_aging_prevents_starvation(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 11);
    gpcd_policy_config p = policy_with(GPCD_POLICY_PRIORITY | GPCD_POLICY_AGING);
    p.aging_per_hour = 1 + gpc_rng_uniform64(&rng) * 20;
    double now = 1e6;
    for (int trial = 0; trial < 100; trial++) {
        int prio = (int)gpc_rng_below(&rng, 101);
        double waited = gpc_rng_uniform64(&rng) * 30 * 3600;
        gpcd_job *j = job_make(1, 1, 0, prio, GPCD_TYPE_BATCH, now - waited);
        double want = prio + p.aging_per_hour * waited / 3600.0;
        assert_true(fabs(gpcd_policy_effective_priority(&p, j, now) - want) < 1e-9 * (1 + want));
        gpcd_job_free(j);
    }
    /* hours for low (10) to pass high (90): (90 - 10) / rate, plus a little */
    double hours = (GPCD_PRIORITY_HIGH - GPCD_PRIORITY_LOW) / p.aging_per_hour + 0.1;
    gpcd_cluster c;
    cluster_init(&c, 1, 80);
    gpcd_job *low = job_make(1, 1, 0, GPCD_PRIORITY_LOW, GPCD_TYPE_BATCH, now - hours * 3600);
    gpcd_job *high = job_make(2, 1, 0, GPCD_PRIORITY_HIGH, GPCD_TYPE_BATCH, now);
    gpcd_job *pending[] = {high, low};
    gpcd_decision d[4];
    int n = gpcd_schedule(&p, &c, pending, 2, NULL, 0, now, d, 4, NULL);
    assert_int_equal(started(d, n, 1, NULL), 1);
    assert_int_equal(started(d, n, 2, NULL), 0);
    /* without aging the high one wins */
    p.flags = GPCD_POLICY_PRIORITY;
    n = gpcd_schedule(&p, &c, pending, 2, NULL, 0, now, d, 4, NULL);
    assert_int_equal(started(d, n, 2, NULL), 1);
    gpcd_job_free(low);
    gpcd_job_free(high);
}

/* least_loaded: a one-GPU job goes to the GPU with the smallest
 * util/100 + used/total, computed here directly. */
static void test_least_loaded_placement(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 12);
    gpcd_policy_config p = policy_with(GPCD_POLICY_LEAST_LOADED);
    for (int trial = 0; trial < 200; trial++) {
        gpcd_cluster c;
        int n = 2 + (int)gpc_rng_below(&rng, 15);
        cluster_init(&c, n, 80);
        int best = -1;
        double best_score = INFINITY;
        for (int g = 0; g < n; g++) {
            c.gpu[g].util = gpc_rng_uniform64(&rng) * 100;
            c.gpu[g].mem_used = (uint64_t)(gpc_rng_uniform64(&rng) * 30 * GIB);
            double score = c.gpu[g].util / 100 + (double)c.gpu[g].mem_used / (80 * GIB);
            if (score < best_score) {
                best_score = score;
                best = g;
            }
        }
        gpcd_job *j = job_make(1, 1, 40, 50, GPCD_TYPE_TRAIN, 0);
        int gpus[GPCD_MAX_GPUS];
        assert_int_equal(gpcd_policy_place(&p, &c, j, gpus), 1);
        assert_int_equal(gpus[0], best);
        gpcd_job_free(j);
    }
    /* live memory used outside gpcd counts: a GPU with too little left is skipped */
    gpcd_cluster c;
    cluster_init(&c, 2, 80);
    c.gpu[0].mem_used = (uint64_t)(60 * GIB);
    gpcd_job *j = job_make(1, 1, 40, 50, GPCD_TYPE_TRAIN, 0);
    int gpus[GPCD_MAX_GPUS];
    c.gpu[1].util = 99;
    assert_int_equal(gpcd_policy_place(&p, &c, j, gpus), 1);
    assert_int_equal(gpus[0], 1);
    gpcd_job_free(j);
}

/* binpack: a small shared job goes to the fullest GPU that still fits it
 * (best fit, found here by scanning); a big shared job is spread instead. */
static void test_binpack_small_jobs(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 13);
    gpcd_policy_config p =
        policy_with(GPCD_POLICY_BINPACK | GPCD_POLICY_LEAST_LOADED | GPCD_POLICY_TASK_TYPE);
    for (int trial = 0; trial < 200; trial++) {
        gpcd_cluster c;
        int n = 2 + (int)gpc_rng_below(&rng, 7);
        cluster_init(&c, n, 80);
        double want_gib = 1 + gpc_rng_below(&rng, 20);
        int best = -1;
        double best_left = INFINITY;
        for (int g = 0; g < n; g++) {
            double reserved = gpc_rng_below(&rng, 81);
            c.gpu[g].mem_reserved = (uint64_t)(reserved * GIB);
            c.gpu[g].shared_jobs = reserved > 0;
            c.gpu[g].mem_used = c.gpu[g].mem_reserved / 2;
            double left = 80 - reserved - want_gib;
            if (left >= 0 && left < best_left) {
                best_left = left;
                best = g;
            }
        }
        gpcd_job *j = job_make(1, 1, want_gib, 50, GPCD_TYPE_INFER, 0);
        int gpus[GPCD_MAX_GPUS];
        int k = gpcd_policy_place(&p, &c, j, gpus);
        if (best < 0) {
            assert_int_equal(k, 0);
        } else {
            assert_int_equal(k, 1);
            /* ties in leftover memory may go to either GPU */
            double left = 80 - (double)c.gpu[gpus[0]].mem_reserved / GIB - want_gib;
            assert_true(fabs(left - best_left) < 1e-6);
        }
        gpcd_job_free(j);
    }
    /* above small_job_mem, least loaded: the emptier GPU */
    gpcd_cluster c;
    cluster_init(&c, 2, 80);
    c.gpu[0].mem_reserved = c.gpu[0].mem_used = (uint64_t)(10 * GIB);
    c.gpu[0].shared_jobs = 1;
    gpcd_job *big = job_make(1, 1, 30, 50, GPCD_TYPE_INFER, 0);
    gpcd_job *small = job_make(2, 1, 8, 50, GPCD_TYPE_INFER, 0);
    int gpus[GPCD_MAX_GPUS];
    assert_int_equal(gpcd_policy_place(&p, &c, big, gpus), 1);
    assert_int_equal(gpus[0], 1);
    assert_int_equal(gpcd_policy_place(&p, &c, small, gpus), 1);
    assert_int_equal(gpus[0], 0);
    gpcd_job_free(big);
    gpcd_job_free(small);
}

/* task_type: training takes whole GPUs all or nothing; inference shares
 * within memory; without the policy inference takes whole GPUs too. */
static void test_task_type_whole_gpus_and_sharing(void **state) {
    (void)state;
    gpcd_policy_config p = policy_with(GPCD_POLICY_TASK_TYPE | GPCD_POLICY_LEAST_LOADED);
    gpcd_cluster c;
    cluster_init(&c, 4, 80);
    /* one inference job already shares GPU 0 with 30 GiB */
    gpcd_job *infer0 = job_make(1, 1, 30, 50, GPCD_TYPE_INFER, 0);
    job_run_on(infer0, 0, 1, (int[]){0});
    /* a training job owns GPU 1 */
    gpcd_job *train1 = job_make(2, 1, 10, 50, GPCD_TYPE_TRAIN, 0);
    job_run_on(train1, 0, 1, (int[]){1});
    gpcd_job *running[] = {infer0, train1};
    gpcd_cluster_account(&p, &c, running, 2);
    assert_int_equal(c.gpu[0].shared_jobs, 1);
    assert_true(c.gpu[0].mem_reserved == (uint64_t)(30 * GIB));
    assert_int_equal(c.gpu[1].exclusive_jobs, 1);
    assert_true(c.gpu[1].mem_reserved == c.gpu[1].mem_total);

    gpcd_job *train = job_make(3, 1, 1, 50, GPCD_TYPE_TRAIN, 0);
    gpcd_job *infer = job_make(4, 1, 50, 50, GPCD_TYPE_INFER, 0);
    gpcd_job *too_big = job_make(5, 1, 51, 50, GPCD_TYPE_INFER, 0);
    assert_int_equal(gpcd_policy_gpu_admits(&p, &c.gpu[0], train), 0); /* shared: not whole */
    assert_int_equal(gpcd_policy_gpu_admits(&p, &c.gpu[1], train), 0); /* owned */
    assert_int_equal(gpcd_policy_gpu_admits(&p, &c.gpu[2], train), 1);
    assert_int_equal(gpcd_policy_gpu_admits(&p, &c.gpu[0], infer), 1); /* 30 + 50 = 80 fits */
    assert_int_equal(gpcd_policy_gpu_admits(&p, &c.gpu[0], too_big), 0);
    assert_int_equal(gpcd_policy_gpu_admits(&p, &c.gpu[1], infer), 0);
    gpcd_policy_config whole = policy_with(GPCD_POLICY_LEAST_LOADED);
    assert_int_equal(gpcd_policy_gpu_admits(&whole, &c.gpu[0], infer), 0);

    /* gang: a 3-GPU training job with two whole GPUs free does not start,
     * and nothing is half-allocated; a 2-GPU one takes exactly 2 and 3 */
    gpcd_job *gang3 = job_make(6, 3, 10, 50, GPCD_TYPE_TRAIN, 0);
    gpcd_job *gang2 = job_make(7, 2, 10, 50, GPCD_TYPE_TRAIN, 0);
    gpcd_decision d[8];
    gpcd_job *pending3[] = {gang3};
    int n = gpcd_schedule(&p, &c, pending3, 1, running, 2, 10, d, 8, NULL);
    assert_int_equal(n, 0);
    assert_int_equal(c.gpu[2].exclusive_jobs + c.gpu[3].exclusive_jobs, 0);
    gpcd_job *pending2[] = {gang2};
    int gpus[GPCD_MAX_GPUS];
    n = gpcd_schedule(&p, &c, pending2, 1, running, 2, 10, d, 8, NULL);
    assert_int_equal(started(d, n, 7, gpus), 2);
    assert_true((gpus[0] == 2 && gpus[1] == 3) || (gpus[0] == 3 && gpus[1] == 2));
    gpcd_job *jobs[] = {infer0, train1, train, infer, too_big, gang3, gang2};
    for (size_t i = 0; i < sizeof jobs / sizeof jobs[0]; i++)
        gpcd_job_free(jobs[i]);
}

/* NVLink: multi-GPU training gets a set with the most NVLink pairs, which
 * a brute-force search over all subsets confirms. */
static void test_training_prefers_nvlink_sets(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 14);
    gpcd_policy_config p = policy_with(GPCD_POLICY_TASK_TYPE | GPCD_POLICY_LEAST_LOADED);
    for (int trial = 0; trial < 100; trial++) {
        gpcd_cluster c;
        int n = 8;
        cluster_init(&c, n, 80);
        /* NVLink in pairs (0-1, 2-3, ...) like PCIe servers with bridges,
         * sometimes quads */
        int group = gpc_rng_below(&rng, 2) ? 2 : 4;
        for (int a = 0; a < n; a++)
            for (int b = 0; b < n; b++)
                c.nvlink[a][b] = a != b && a / group == b / group;
        int k = 2 + (int)gpc_rng_below(&rng, 2);
        unsigned busy = 0;
        for (int g = 0; g < n; g++) {
            c.gpu[g].util = gpc_rng_uniform64(&rng) * 50;
            if (gpc_rng_below(&rng, 3) == 0) {
                busy |= 1u << g;
                c.gpu[g].exclusive_jobs = 1;
            }
        }
        int free_count = n - __builtin_popcount(busy);
        /* brute force: the most NVLink pairs over all k-subsets of free GPUs */
        int best_pairs = -1;
        for (unsigned set = 0; set < (1u << n); set++) {
            if ((set & busy) || __builtin_popcount(set) != k) continue;
            int pairs = 0;
            for (int a = 0; a < n; a++)
                for (int b = a + 1; b < n; b++)
                    if ((set >> a & 1) && (set >> b & 1)) pairs += c.nvlink[a][b];
            if (pairs > best_pairs) best_pairs = pairs;
        }
        gpcd_job *j = job_make(1, k, 10, 50, GPCD_TYPE_TRAIN, 0);
        int gpus[GPCD_MAX_GPUS];
        int got = gpcd_policy_place(&p, &c, j, gpus);
        if (free_count < k) {
            assert_int_equal(got, 0);
        } else {
            assert_int_equal(got, k);
            int pairs = 0;
            for (int a = 0; a < k; a++) {
                assert_false(busy >> gpus[a] & 1);
                for (int b = a + 1; b < k; b++)
                    pairs += c.nvlink[gpus[a]][gpus[b]];
            }
            if (pairs != best_pairs)
                fail_msg("trial %d: picked a set with %d NVLink pairs, best has %d", trial, pairs,
                         best_pairs);
        }
        gpcd_job_free(j);
    }
}

/* locality: the GPU on the data's NUMA node wins over a less loaded one,
 * and so does the GPU that last read the same data. */
static void test_locality(void **state) {
    (void)state;
    gpcd_policy_config p = policy_with(GPCD_POLICY_LOCALITY | GPCD_POLICY_LEAST_LOADED);
    TEST_OK(gpcd_numa_rules_parse("/datasets=1, /scratch/=0,/datasets/imagenet=0", &p));
    assert_int_equal(p.numa_rule_count, 3);
    assert_int_equal(gpcd_data_numa_node(&p, "/datasets/x"), 1);
    assert_int_equal(gpcd_data_numa_node(&p, "/datasets/imagenet/train"), 0); /* longest wins */
    assert_int_equal(gpcd_data_numa_node(&p, "/datasetsfoo"), -1); /* component boundary */
    assert_int_equal(gpcd_data_numa_node(&p, "/scratch/a"), 0);
    TEST_FAILS(gpcd_numa_rules_parse("/datasets", &p), GPC_ERR_INVALID_ARG, "PREFIX=NODE");
    TEST_FAILS(gpcd_numa_rules_parse("/d=x", &p), GPC_ERR_INVALID_ARG, "not a number");

    gpcd_cluster c;
    cluster_init(&c, 4, 80); /* GPUs 0,1 on node 0; 2,3 on node 1 */
    c.gpu[2].util = 40;
    c.gpu[3].util = 45;
    gpcd_job *j = job_make(1, 1, 10, 50, GPCD_TYPE_TRAIN, 0);
    j->data = strdup("/datasets/x");
    j->data_hash = gpcd_data_hash(j->data);
    j->data_numa = 1;
    int gpus[GPCD_MAX_GPUS];
    assert_int_equal(gpcd_policy_place(&p, &c, j, gpus), 1);
    assert_int_equal(gpus[0], 2); /* node 1, the less loaded of the two */
    /* warm cache: GPU 3 last ran a job on the same data */
    c.gpu[3].data_hash = j->data_hash;
    assert_int_equal(gpcd_policy_place(&p, &c, j, gpus), 1);
    assert_int_equal(gpus[0], 3);
    /* without locality: least loaded, GPU 0 */
    p.flags = GPCD_POLICY_LEAST_LOADED;
    assert_int_equal(gpcd_policy_place(&p, &c, j, gpus), 1);
    assert_int_equal(gpus[0], 0);
    gpcd_job_free(j);
}

/* backfill: the blocked first job reserves the GPUs that free up first;
 * a later job may use them only if its time limit ends before then. */
static void test_backfill(void **state) {
    (void)state;
    double now = 1e6;
    gpcd_policy_config p = policy_with(GPCD_POLICY_PRIORITY | GPCD_POLICY_BACKFILL);
    gpcd_cluster c;
    cluster_init(&c, 2, 80);
    gpcd_job *running_job = job_make(1, 1, 10, 50, GPCD_TYPE_TRAIN, now - 100);
    running_job->time_limit = 3600;
    job_run_on(running_job, now - 600, 1, (int[]){0}); /* ends at now + 3000 */
    gpcd_job *head = job_make(2, 2, 10, GPCD_PRIORITY_HIGH, GPCD_TYPE_TRAIN, now - 50);
    gpcd_job *fits = job_make(3, 1, 10, GPCD_PRIORITY_LOW, GPCD_TYPE_TRAIN, now - 40);
    fits->time_limit = 2999;
    gpcd_job *too_long = job_make(4, 1, 10, GPCD_PRIORITY_LOW, GPCD_TYPE_TRAIN, now - 30);
    too_long->time_limit = 3001;
    gpcd_job *unlimited = job_make(5, 1, 10, GPCD_PRIORITY_LOW, GPCD_TYPE_TRAIN, now - 20);
    gpcd_job *running[] = {running_job};
    gpcd_decision d[8];
    gpcd_pass_stats stats;

    gpcd_job *p1[] = {head, too_long, unlimited};
    int n = gpcd_schedule(&p, &c, p1, 3, running, 1, now, d, 8, &stats);
    assert_int_equal(n, 0);
    assert_int_equal(stats.reserved_for, 2);
    assert_true(fabs(stats.reservation_time - (now + 3000)) < 1e-6);

    gpcd_job *p2[] = {head, too_long, fits};
    n = gpcd_schedule(&p, &c, p2, 3, running, 1, now, d, 8, &stats);
    assert_int_equal(n, 1);
    assert_int_equal(started(d, n, 3, NULL), 1);

    /* without backfill nothing passes the blocked job */
    p.flags = GPCD_POLICY_PRIORITY;
    n = gpcd_schedule(&p, &c, p2, 3, running, 1, now, d, 8, &stats);
    assert_int_equal(n, 0);
    assert_int_equal(stats.blocked, 3);
    gpcd_job *jobs[] = {running_job, head, fits, too_long, unlimited};
    for (size_t i = 0; i < sizeof jobs / sizeof jobs[0]; i++)
        gpcd_job_free(jobs[i]);
}

/* preemption: a blocked high priority job stops the lower priority job that
 * started last, only as many as it needs, never equal priority ones. */
static void test_preemption(void **state) {
    (void)state;
    double now = 1e6;
    gpcd_policy_config p = policy_with(GPCD_POLICY_PRIORITY | GPCD_POLICY_PREEMPTION);
    gpcd_cluster c;
    cluster_init(&c, 2, 80);
    gpcd_job *old_low = job_make(1, 1, 10, GPCD_PRIORITY_LOW, GPCD_TYPE_TRAIN, now - 900);
    job_run_on(old_low, now - 800, 1, (int[]){0});
    gpcd_job *new_low = job_make(2, 1, 10, GPCD_PRIORITY_LOW, GPCD_TYPE_TRAIN, now - 500);
    job_run_on(new_low, now - 100, 1, (int[]){1});
    gpcd_job *running[] = {old_low, new_low};
    gpcd_job *high = job_make(3, 1, 10, GPCD_PRIORITY_HIGH, GPCD_TYPE_TRAIN, now);
    gpcd_job *pending[] = {high};
    gpcd_decision d[8];
    int n = gpcd_schedule(&p, &c, pending, 1, running, 2, now, d, 8, NULL);
    assert_int_equal(n, 1);
    assert_int_equal(preempted(d, n, 2), 1); /* the most recent loses the least work */

    /* a 2-GPU high job needs both */
    high->gpus = 2;
    n = gpcd_schedule(&p, &c, pending, 1, running, 2, now, d, 8, NULL);
    assert_int_equal(n, 2);
    assert_true(preempted(d, n, 1) && preempted(d, n, 2));

    /* a job already stopping counts as gone: no second victim */
    high->gpus = 1;
    new_low->stop_reason = GPCD_STOP_PREEMPT;
    n = gpcd_schedule(&p, &c, pending, 1, running, 2, now, d, 8, NULL);
    assert_int_equal(n, 0);
    new_low->stop_reason = GPCD_STOP_NONE;

    /* equal priority is never preempted; nor without the policy */
    high->priority = GPCD_PRIORITY_LOW;
    n = gpcd_schedule(&p, &c, pending, 1, running, 2, now, d, 8, NULL);
    assert_int_equal(n, 0);
    high->priority = GPCD_PRIORITY_HIGH;
    p.flags = GPCD_POLICY_PRIORITY;
    n = gpcd_schedule(&p, &c, pending, 1, running, 2, now, d, 8, NULL);
    assert_int_equal(n, 0);
    gpcd_job_free(old_low);
    gpcd_job_free(new_low);
    gpcd_job_free(high);
}

/* Preemption frees what the job needs and no more: a 1-GPU job stops the
 * 1-GPU victim, not the 2-GPU one of lower priority (which would leave a GPU
 * idle); on random clusters the GPUs freed equal the fewest any set of
 * eligible victims could free, found by trying every set. */
static void test_preemption_frees_no_more_than_needed(void **state) {
    (void)state;
    double now = 1e6;
    gpcd_policy_config p = policy_with(GPCD_POLICY_PRIORITY | GPCD_POLICY_PREEMPTION);
    gpcd_cluster c;
    cluster_init(&c, 3, 80);
    gpcd_job *pair = job_make(1, 2, 10, 10, GPCD_TYPE_TRAIN, now - 900);
    job_run_on(pair, now - 800, 2, (int[]){0, 1});
    gpcd_job *single = job_make(2, 1, 10, 20, GPCD_TYPE_TRAIN, now - 900);
    job_run_on(single, now - 800, 1, (int[]){2});
    gpcd_job *running[] = {pair, single};
    gpcd_job *high = job_make(3, 1, 10, GPCD_PRIORITY_HIGH, GPCD_TYPE_TRAIN, now);
    gpcd_job *pending[] = {high};
    gpcd_decision d[8];
    int n = gpcd_schedule(&p, &c, pending, 1, running, 2, now, d, 8, NULL);
    assert_int_equal(n, 1);
    assert_int_equal(preempted(d, n, 2), 1);
    /* two GPUs needed: the pair, one job stopped rather than two */
    high->gpus = 2;
    n = gpcd_schedule(&p, &c, pending, 1, running, 2, now, d, 8, NULL);
    assert_int_equal(n, 1);
    assert_int_equal(preempted(d, n, 1), 1);
    gpcd_job_free(pair);
    gpcd_job_free(single);
    gpcd_job_free(high);

    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 16);
    for (int trial = 0; trial < 300; trial++) {
        int ngpus = 2 + (int)gpc_rng_below(&rng, 7);
        cluster_init(&c, ngpus, 80);
        gpcd_job *jobs[8];
        int njobs = 0, g = 0;
        while (g < ngpus && njobs < 8) {
            int k = 1 + (int)gpc_rng_below(&rng, 3);
            if (k > ngpus - g) k = ngpus - g;
            if (gpc_rng_below(&rng, 5) == 0) { /* leave one idle now and then */
                g++;
                continue;
            }
            int on[GPCD_MAX_GPUS];
            for (int i = 0; i < k; i++)
                on[i] = g + i;
            jobs[njobs] = job_make(njobs + 1, k, 10, 5 + (int)gpc_rng_below(&rng, 40),
                                   GPCD_TYPE_TRAIN, now - 1000);
            job_run_on(jobs[njobs], now - 900 + njobs, k, on);
            njobs++;
            g += k;
        }
        int idle = ngpus;
        for (int j = 0; j < njobs; j++)
            idle -= jobs[j]->gpus;
        int want = 1 + (int)gpc_rng_below(&rng, (uint32_t)ngpus);
        gpcd_job *job = job_make(100, want, 10, GPCD_PRIORITY_HIGH, GPCD_TYPE_TRAIN, now);
        /* the reference: every set of victims, the fewest GPUs that suffice */
        int best = -1;
        if (idle < want)
            for (unsigned set = 1; set < (1u << njobs); set++) {
                int freed = 0;
                for (int j = 0; j < njobs; j++)
                    if (set & (1u << j)) freed += jobs[j]->gpus;
                if (idle + freed >= want && (best < 0 || freed < best)) best = freed;
            }
        gpcd_job *pend[] = {job};
        n = gpcd_schedule(&p, &c, pend, 1, jobs, njobs, now, d, 8, NULL);
        int freed = 0, stops = 0;
        for (int i = 0; i < n; i++)
            if (d[i].kind == GPCD_DECIDE_PREEMPT) freed += d[i].job->gpus, stops++;
        if (idle >= want) {
            assert_int_equal(started(d, n, 100, NULL), want);
        } else if (freed != best) {
            fail_msg("trial %d: %d GPUs, %d idle, job of %d: freed %d, the fewest is %d", trial,
                     ngpus, idle, want, freed, best);
        }
        (void)stops;
        for (int j = 0; j < njobs; j++)
            gpcd_job_free(jobs[j]);
        gpcd_job_free(job);
    }
}

static gpcd_job *elastic_make(int64_t id, int lo, int hi, int priority, double submit) {
    gpcd_job *j = job_make(id, hi, 10, priority, GPCD_TYPE_TRAIN, submit);
    j->gpus_min = lo;
    j->gpus_max = hi;
    return j;
}

static int resized_to(const gpcd_decision *d, int n, int64_t id) {
    for (int i = 0; i < n; i++)
        if (d[i].kind == GPCD_DECIDE_RESIZE && d[i].job->id == id) return d[i].gpu_count;
    return 0;
}

/* elastic placement: the largest count in the range that is free, never
 * below the minimum; checked against the count of free GPUs on random
 * clusters. */
static void test_elastic_placement(void **state) {
    (void)state;
    double now = 1e6;
    gpcd_policy_config p = policy_with(GPCD_POLICY_ALL);
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 21);
    for (int trial = 0; trial < 300; trial++) {
        int ngpus = 1 + (int)gpc_rng_below(&rng, 8);
        gpcd_cluster c;
        cluster_init(&c, ngpus, 80);
        gpcd_job *jobs[8];
        int njobs = 0, busy = 0;
        for (int g = 0; g < ngpus; g++)
            if (gpc_rng_below(&rng, 2)) {
                jobs[njobs] = job_make(njobs + 1, 1, 10, 50, GPCD_TYPE_TRAIN, now - 100);
                job_run_on(jobs[njobs++], now - 50, 1, (int[]){g});
                busy++;
            }
        int lo = 1 + (int)gpc_rng_below(&rng, 4);
        int hi = lo + 1 + (int)gpc_rng_below(&rng, 4);
        gpcd_job *e = elastic_make(100, lo, hi, 50, now);
        gpcd_job *pend[] = {e};
        gpcd_decision d[16];
        int n = gpcd_schedule(&p, &c, pend, 1, jobs, njobs, now, d, 16, NULL);
        int free_gpus = ngpus - busy;
        int want = free_gpus < lo ? 0 : (free_gpus < hi ? free_gpus : hi);
        int gpus[GPCD_MAX_GPUS];
        int k = started(d, n, 100, gpus);
        if (k != want)
            fail_msg("trial %d: %d GPUs, %d free, range %d-%d: started on %d, want %d", trial,
                     ngpus, free_gpus, lo, hi, k, want);
        for (int i = 0; i < k; i++) /* on free GPUs only */
            for (int j = 0; j < njobs; j++)
                assert_int_not_equal(gpus[i], jobs[j]->assigned[0]);
        for (int j = 0; j < njobs; j++)
            gpcd_job_free(jobs[j]);
        gpcd_job_free(e);
    }
}

/* preempted, an elastic job restarts smaller: a 1-2 job on both GPUs is
 * stopped for a high priority 1-GPU job, and the next pass gives each one. */
static void test_elastic_shrinks_on_preemption(void **state) {
    (void)state;
    double now = 1e6;
    gpcd_policy_config p = policy_with(GPCD_POLICY_PRIORITY | GPCD_POLICY_PREEMPTION);
    p.elastic_grow_after = 600;
    gpcd_cluster c;
    cluster_init(&c, 2, 80);
    gpcd_job *e = elastic_make(1, 1, 2, GPCD_PRIORITY_LOW, now - 2000);
    e->gpus = 2;
    job_run_on(e, now - 1000, 2, (int[]){0, 1});
    gpcd_job *high = job_make(2, 1, 10, GPCD_PRIORITY_HIGH, GPCD_TYPE_TRAIN, now);
    gpcd_job *running[] = {e}, *pending[] = {high, NULL};
    gpcd_decision d[8];
    int n = gpcd_schedule(&p, &c, pending, 1, running, 1, now, d, 8, NULL);
    assert_int_equal(n, 1);
    assert_int_equal(preempted(d, n, 1), 1);
    /* it stopped: both wait, the high priority job first */
    e->state = GPCD_PREEMPTED;
    e->assigned_count = 0;
    e->start_time = 0;
    pending[1] = e;
    n = gpcd_schedule(&p, &c, pending, 2, NULL, 0, now + 30, d, 8, NULL);
    assert_int_equal(started(d, n, 2, NULL), 1);
    assert_int_equal(started(d, n, 1, NULL), 1);
    /* a high priority job that needs both: the elastic one, at its minimum
     * of 1, waits (never below its minimum) */
    high->gpus = 2;
    n = gpcd_schedule(&p, &c, pending, 2, NULL, 0, now + 30, d, 8, NULL);
    assert_int_equal(started(d, n, 2, NULL), 2);
    assert_int_equal(started(d, n, 1, NULL), 0);
    gpcd_job_free(e);
    gpcd_job_free(high);
}

/* An elastic job waiting at high priority preempts for its minimum only:
 * a 2-4 job among four 1-GPU jobs of low priority stops two of them. */
static void test_elastic_preempts_for_minimum(void **state) {
    (void)state;
    double now = 1e6;
    gpcd_policy_config p = policy_with(GPCD_POLICY_PRIORITY | GPCD_POLICY_PREEMPTION);
    gpcd_cluster c;
    cluster_init(&c, 4, 80);
    gpcd_job *low[4];
    for (int g = 0; g < 4; g++) {
        low[g] = job_make(g + 1, 1, 10, GPCD_PRIORITY_LOW, GPCD_TYPE_TRAIN, now - 2000);
        job_run_on(low[g], now - 1000, 1, (int[]){g});
    }
    gpcd_job *e = elastic_make(9, 2, 4, GPCD_PRIORITY_HIGH, now);
    gpcd_job *pending[] = {e};
    gpcd_decision d[8];
    int n = gpcd_schedule(&p, &c, pending, 1, low, 4, now, d, 8, NULL);
    int stops = 0;
    for (int i = 0; i < n; i++)
        stops += d[i].kind == GPCD_DECIDE_PREEMPT;
    assert_int_equal(stops, 2);
    for (int g = 0; g < 4; g++)
        gpcd_job_free(low[g]);
    gpcd_job_free(e);
}

/* The grow rule: only with nothing waiting, only when the job could at
 * least double (capped at its maximum), and only after elastic_grow_after
 * at its count. */
static void test_elastic_grow_rule(void **state) {
    (void)state;
    double now = 1e6;
    gpcd_policy_config p = policy_with(GPCD_POLICY_ALL);
    p.elastic_grow_after = 600;
    gpcd_cluster c;
    cluster_init(&c, 4, 80);
    gpcd_job *e = elastic_make(1, 1, 8, 50, now - 5000);
    e->gpus = 1;
    job_run_on(e, now - 700, 1, (int[]){0});
    gpcd_job *running[] = {e, NULL};
    gpcd_decision d[8];
    /* three GPUs free: it grows to all four */
    int n = gpcd_schedule(&p, &c, NULL, 0, running, 1, now, d, 8, NULL);
    assert_int_equal(n, 1);
    assert_int_equal(resized_to(d, n, 1), 4);
    /* not yet elastic_grow_after at its count */
    n = gpcd_schedule(&p, &c, NULL, 0, running, 1, now - 200, d, 8, NULL);
    assert_int_equal(n, 0);
    p.elastic_grow_after = 0; /* never */
    n = gpcd_schedule(&p, &c, NULL, 0, running, 1, now, d, 8, NULL);
    assert_int_equal(n, 0);
    p.elastic_grow_after = 600;
    /* a job that starts on one GPU leaves two: 1 -> 3 still doubles */
    gpcd_job *small = job_make(2, 1, 10, 50, GPCD_TYPE_TRAIN, now - 10);
    gpcd_job *pending[] = {small};
    n = gpcd_schedule(&p, &c, pending, 1, running, 1, now, d, 8, NULL);
    assert_int_equal(started(d, n, 2, NULL), 1);
    assert_int_equal(resized_to(d, n, 1), 3);
    /* a job that cannot start (needs 4): nothing grows while it waits */
    small->gpus = 4;
    n = gpcd_schedule(&p, &c, pending, 1, running, 1, now, d, 8, NULL);
    assert_int_equal(resized_to(d, n, 1), 0);
    /* at 2 GPUs with 2 free it doubles; at 3 with 1 free it would not */
    job_run_on(e, now - 700, 2, (int[]){0, 1});
    n = gpcd_schedule(&p, &c, NULL, 0, running, 1, now, d, 8, NULL);
    assert_int_equal(resized_to(d, n, 1), 4);
    job_run_on(e, now - 700, 3, (int[]){0, 1, 2});
    n = gpcd_schedule(&p, &c, NULL, 0, running, 1, now, d, 8, NULL);
    assert_int_equal(n, 0);
    /* two elastic jobs at 1 with two GPUs free: only one can double */
    job_run_on(e, now - 700, 1, (int[]){0});
    gpcd_job *f = elastic_make(3, 1, 2, 50, now - 5000);
    job_run_on(f, now - 700, 1, (int[]){1});
    running[1] = f;
    n = gpcd_schedule(&p, &c, NULL, 0, running, 2, now, d, 8, NULL);
    assert_int_equal(n, 1);
    assert_int_equal(resized_to(d, n, 1), 3);
    gpcd_job_free(e);
    gpcd_job_free(f);
    gpcd_job_free(small);
}

/* A full pass over random jobs never over-commits a GPU: recounting the
 * decisions by hand gives memory within each GPU and exclusive GPUs alone. */
static void test_pass_never_overcommits(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 15);
    gpcd_policy_config p = policy_with(GPCD_POLICY_ALL);
    for (int trial = 0; trial < 50; trial++) {
        gpcd_cluster c;
        cluster_init(&c, 8, 80);
        int n = 1 + (int)gpc_rng_below(&rng, 60);
        gpcd_job **jobs = calloc((size_t)n, sizeof *jobs);
        for (int i = 0; i < n; i++) {
            gpcd_job_type type = (gpcd_job_type)gpc_rng_below(&rng, GPCD_TYPE_COUNT);
            int gpus = type == GPCD_TYPE_TRAIN ? 1 + (int)gpc_rng_below(&rng, 4) : 1;
            jobs[i] = job_make(i + 1, gpus, 1 + gpc_rng_below(&rng, 60),
                               (int)gpc_rng_below(&rng, 101), type, gpc_rng_below(&rng, 1000));
        }
        gpcd_decision *d = calloc((size_t)n + 64, sizeof *d);
        int nd = gpcd_schedule(&p, &c, jobs, n, NULL, 0, 2000, d, n + 64, NULL);
        double mem[8] = {0};
        int exclusive[8] = {0}, shared[8] = {0};
        for (int i = 0; i < nd; i++) {
            assert_int_equal(d[i].kind, GPCD_DECIDE_START);
            assert_int_equal(d[i].gpu_count, d[i].job->gpus);
            for (int k = 0; k < d[i].gpu_count; k++) {
                int g = d[i].gpus[k];
                for (int m = 0; m < k; m++)
                    assert_int_not_equal(d[i].gpus[m], g);
                if (gpcd_job_shares_gpu(d[i].job)) {
                    shared[g]++;
                    mem[g] += (double)d[i].job->mem;
                } else {
                    exclusive[g]++;
                }
            }
        }
        for (int g = 0; g < 8; g++) {
            assert_true(exclusive[g] <= 1);
            if (exclusive[g]) assert_int_equal(shared[g], 0);
            assert_true(mem[g] <= 80 * GIB);
        }
        for (int i = 0; i < n; i++)
            gpcd_job_free(jobs[i]);
        free(jobs);
        free(d);
    }
}

static void test_value_parsers(void **state) {
    (void)state;
    int prio;
    TEST_OK(gpcd_priority_parse("high", &prio));
    assert_int_equal(prio, GPCD_PRIORITY_HIGH);
    TEST_OK(gpcd_priority_parse("37", &prio));
    assert_int_equal(prio, 37);
    TEST_FAILS(gpcd_priority_parse("101", &prio), GPC_ERR_INVALID_ARG, "0-100");
    TEST_FAILS(gpcd_priority_parse("urgent", &prio), GPC_ERR_INVALID_ARG, "low, normal, high");
    double seconds;
    TEST_OK(gpcd_duration_parse("1h30m", &seconds));
    assert_true(seconds == 5400);
    TEST_OK(gpcd_duration_parse("90", &seconds));
    assert_true(seconds == 90);
    TEST_OK(gpcd_duration_parse("0.5s", &seconds));
    assert_true(seconds == 0.5);
    TEST_FAILS(gpcd_duration_parse("2w", &seconds), GPC_ERR_INVALID_ARG, "unknown unit");
    TEST_FAILS(gpcd_duration_parse("0s", &seconds), GPC_ERR_INVALID_ARG, "above 0");
    uint64_t bytes;
    TEST_OK(gpcd_bytes_parse("40G", &bytes));
    assert_true(bytes == 40ull << 30);
    TEST_OK(gpcd_bytes_parse("141GB", &bytes));
    assert_true(bytes == 141ull << 30);
    TEST_OK(gpcd_bytes_parse("1.5KiB", &bytes));
    assert_true(bytes == 1536);
    TEST_FAILS(gpcd_bytes_parse("40Q", &bytes), GPC_ERR_INVALID_ARG, "unknown unit");
    gpcd_job_type type;
    TEST_FAILS(gpcd_type_parse("training", &type), GPC_ERR_INVALID_ARG, "train, infer");
    gpcd_state st;
    TEST_OK(gpcd_state_parse("preempted", &st));
    assert_int_equal(st, GPCD_PREEMPTED);
}

/* The preemption guards, each against its rule worked out directly: a
 * random cluster state (priorities, ages, run times, earlier preemptions)
 * and gpcd_policy_may_preempt's answer compared with the rule's formula;
 * then whole passes on hand-made cases. */
static void test_preemption_guards(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 19);
    double now = 1e6;
    gpcd_policy_config p =
        policy_with(GPCD_POLICY_PRIORITY | GPCD_POLICY_AGING | GPCD_POLICY_PREEMPTION);
    p.preempt_min_runtime = 60 + gpc_rng_uniform64(&rng) * 1800;
    p.preempt_margin = gpc_rng_uniform64(&rng) * 40;
    p.preempt_grace = 1 + gpc_rng_uniform64(&rng) * 60;
    int allowed = 0, refused = 0;
    for (int trial = 0; trial < 2000; trial++) {
        gpcd_job *job = job_make(1, 1, 0, (int)gpc_rng_below(&rng, 101), GPCD_TYPE_TRAIN,
                                 now - gpc_rng_uniform64(&rng) * 10 * 3600);
        gpcd_job *victim = job_make(2, 1, 0, (int)gpc_rng_below(&rng, 101), GPCD_TYPE_TRAIN,
                                    now - gpc_rng_uniform64(&rng) * 10 * 3600);
        double ran = gpc_rng_uniform64(&rng) * 4 * p.preempt_min_runtime;
        job_run_on(victim, now - ran, 1, (int[]){0});
        victim->preemptions = (int)gpc_rng_below(&rng, 3);
        victim->time_limit = gpc_rng_below(&rng, 2) ? ran + gpc_rng_uniform64(&rng) * 120 : 0;
        double pj = job->priority + p.aging_per_hour * (now - job->submit_time) / 3600;
        double pv = victim->priority + p.aging_per_hour * (now - victim->submit_time) / 3600;
        int want = victim->priority < job->priority && pj >= pv + p.preempt_margin &&
                   ran >= p.preempt_min_runtime * (1 << victim->preemptions) &&
                   !(victim->time_limit > 0 && victim->time_limit - ran <= p.preempt_grace);
        int got = gpcd_policy_may_preempt(&p, job, victim, now);
        if (got != want)
            fail_msg("trial %d: may_preempt %d, want %d (prio %d/%d, eff %.2f/%.2f, ran %.0f, "
                     "preemptions %d, limit %.0f)",
                     trial, got, want, job->priority, victim->priority, pj, pv, ran,
                     victim->preemptions, victim->time_limit);
        allowed += want;
        refused += !want;
        gpcd_job_free(job);
        gpcd_job_free(victim);
    }
    assert_true(allowed > 20 && refused > 20); /* both sides of the rules were reached */

    /* hand-made passes on one GPU: a fresh high job and a low one running */
    p.preempt_min_runtime = 600;
    p.preempt_margin = 20;
    p.preempt_grace = 30;
    gpcd_cluster c;
    cluster_init(&c, 1, 80);
    gpcd_job *low = job_make(1, 1, 10, GPCD_PRIORITY_LOW, GPCD_TYPE_TRAIN, now - 1000);
    gpcd_job *high = job_make(2, 1, 10, GPCD_PRIORITY_HIGH, GPCD_TYPE_TRAIN, now);
    gpcd_job *running[] = {low};
    gpcd_job *pending[] = {high};
    gpcd_decision d[8];
    /* min runtime: 599 s run is protected, 600 s is not */
    job_run_on(low, now - 599, 1, (int[]){0});
    assert_int_equal(gpcd_schedule(&p, &c, pending, 1, running, 1, now, d, 8, NULL), 0);
    low->start_time = now - 600;
    int n = gpcd_schedule(&p, &c, pending, 1, running, 1, now, d, 8, NULL);
    assert_int_equal(n, 1);
    assert_int_equal(preempted(d, n, 1), 1);
    /* preempted once before: protected for twice as long */
    low->preemptions = 1;
    assert_int_equal(gpcd_schedule(&p, &c, pending, 1, running, 1, now, d, 8, NULL), 0);
    low->start_time = now - 1200;
    assert_int_equal(gpcd_schedule(&p, &c, pending, 1, running, 1, now, d, 8, NULL), 1);
    low->preemptions = 0;
    low->start_time = now - 600;
    /* margin: high (90) against low (10) aged to 71 (19 points below) is
     * not enough, aged to 70 (20 below) is */
    low->submit_time = now - 6.1 * 3600;
    assert_int_equal(gpcd_schedule(&p, &c, pending, 1, running, 1, now, d, 8, NULL), 0);
    low->submit_time = now - 6.0 * 3600;
    assert_int_equal(gpcd_schedule(&p, &c, pending, 1, running, 1, now, d, 8, NULL), 1);
    /* no ping-pong: a low job that waited so long it would be requeued
     * ahead of the high one is not stopped for it */
    low->submit_time = now - 20 * 3600;
    assert_int_equal(gpcd_schedule(&p, &c, pending, 1, running, 1, now, d, 8, NULL), 0);
    low->submit_time = now - 1000;
    /* equal base priority never preempts, however long the waiting job aged */
    high->priority = GPCD_PRIORITY_LOW;
    high->submit_time = now - 30 * 3600;
    assert_int_equal(gpcd_schedule(&p, &c, pending, 1, running, 1, now, d, 8, NULL), 0);
    high->priority = GPCD_PRIORITY_HIGH;
    high->submit_time = now;
    /* the GPU frees by its time limit within the grace: wait, do not stop */
    low->time_limit = 600 + 29;
    assert_int_equal(gpcd_schedule(&p, &c, pending, 1, running, 1, now, d, 8, NULL), 0);
    low->time_limit = 600 + 31;
    assert_int_equal(gpcd_schedule(&p, &c, pending, 1, running, 1, now, d, 8, NULL), 1);
    low->time_limit = 0;

    /* two GPUs: another job's time limit frees the other GPU within the
     * grace, so the low job is not stopped; past the grace it is */
    cluster_init(&c, 2, 80);
    gpcd_job *ending = job_make(3, 1, 10, GPCD_PRIORITY_HIGH, GPCD_TYPE_TRAIN, now - 1000);
    job_run_on(ending, now - 900, 1, (int[]){1});
    ending->time_limit = 900 + 10;
    gpcd_job *running2[] = {low, ending};
    assert_int_equal(gpcd_schedule(&p, &c, pending, 1, running2, 2, now, d, 8, NULL), 0);
    ending->time_limit = 900 + 3600;
    n = gpcd_schedule(&p, &c, pending, 1, running2, 2, now, d, 8, NULL);
    assert_int_equal(n, 1);
    assert_int_equal(preempted(d, n, 1), 1);
    gpcd_job_free(low);
    gpcd_job_free(high);
    gpcd_job_free(ending);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_priority_orders_queue),
        cmocka_unit_test(test_aging_prevents_starvation),
        cmocka_unit_test(test_least_loaded_placement),
        cmocka_unit_test(test_binpack_small_jobs),
        cmocka_unit_test(test_task_type_whole_gpus_and_sharing),
        cmocka_unit_test(test_training_prefers_nvlink_sets),
        cmocka_unit_test(test_locality),
        cmocka_unit_test(test_backfill),
        cmocka_unit_test(test_preemption),
        cmocka_unit_test(test_preemption_guards),
        cmocka_unit_test(test_preemption_frees_no_more_than_needed),
        cmocka_unit_test(test_pass_never_overcommits),
        cmocka_unit_test(test_elastic_placement),
        cmocka_unit_test(test_elastic_shrinks_on_preemption),
        cmocka_unit_test(test_elastic_preempts_for_minimum),
        cmocka_unit_test(test_elastic_grow_rule),
        cmocka_unit_test(test_value_parsers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
