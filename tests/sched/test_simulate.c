/*
 * test_simulate.c: the trace simulator and the trace generator.
 *
 *   - hand-made traces whose completion times follow from the rules by hand
 *     (FIFO, EASY backfill, preemption with a grace period, time limits,
 *     shortest_first), asserted exactly;
 *   - random traces under FIFO against a direct queue formula (each job
 *     starts when it arrives or when the earliest GPU frees, in order);
 *   - the shortest_first bonus against its formula;
 *   - every kind of bad CSV line, with the line named in the message;
 *   - generated traces against the generator's targets (sizes, run times,
 *     offered load, bursts, the daily cycle, priorities, time limits).
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/sched_sim.h"

static gpcd_policy_config policy_with(unsigned flags) {
    gpcd_config c;
    gpcd_config_defaults(&c);
    c.policy.flags = flags;
    return c.policy;
}

static gpcd_trace parse(const char *text) {
    gpcd_trace t;
    TEST_OK(gpcd_trace_parse(text, strlen(text), "hand.csv", &t));
    return t;
}

static gpcd_sim_result run_with(const char *text, const gpcd_policy_config *p, int gpus,
                                double grace, double tick, double *jct) {
    gpcd_trace t = parse(text);
    gpcd_sim_options o = {gpus, 80ull << 30, grace, tick, 0};
    gpcd_sim_result r;
    TEST_OK(gpcd_simulate(&t, p, &o, &r, jct));
    gpcd_trace_free(&t);
    return r;
}

static gpcd_sim_result run(const char *text, unsigned flags, int gpus, double grace, double *jct) {
    gpcd_trace t = parse(text);
    gpcd_policy_config p = policy_with(flags);
    gpcd_sim_options o = {gpus, 80ull << 30, grace, 0, 0};
    gpcd_sim_result r;
    TEST_OK(gpcd_simulate(&t, &p, &o, &r, jct));
    gpcd_trace_free(&t);
    return r;
}

static void assert_jcts(const double *got, const double *want, int n) {
    for (int i = 0; i < n; i++)
        if (fabs(got[i] - want[i]) > 1e-9)
            fail_msg("job %d: JCT %.9g, want %.9g", i, got[i], want[i]);
}

static gpcd_sim_result run_elastic(const char *text, unsigned flags, int gpus, double share,
                                   double *jct) {
    gpcd_trace t = parse(text);
    gpcd_policy_config p = policy_with(flags);
    gpcd_sim_options o = {gpus, 80ull << 30, 30, 0, share};
    gpcd_sim_result r;
    TEST_OK(gpcd_simulate(&t, &p, &o, &r, jct));
    gpcd_trace_free(&t);
    return r;
}

/* Elastic jobs by hand. Every job elastic (share 1), two GPUs: A (100 s at
 * 1 GPU, range 1-2) starts on both and takes 50 s; B (50 s at 1) waits for
 * them and takes 25 s: JCTs 50 and 65 against 100 and 50 rigid. Then a
 * rigid job beside an elastic one (share 0.3 picks trace line 2 only, the
 * golden-ratio phase of job 2 being 0.236): the elastic job starts on the
 * GPU left, may grow at elastic_grow_after (600 s) once the other ended,
 * is stopped then, holds its GPUs for the 30 s grace and runs its last
 * 1,400 s of work on two GPUs in 700 s: it ends at 1,330 s, not 2,000. */
static void test_elastic_by_hand(void **state) {
    (void)state;
    const char *two = "submit,duration,gpus\n"
                      "0,100,1\n"
                      "10,50,1\n";
    double jct[2], rigid_jct[2];
    gpcd_sim_result rigid = run_elastic(two, 0, 2, 0, rigid_jct);
    gpcd_sim_result e = run_elastic(two, 0, 2, 1, jct);
    assert_jcts(rigid_jct, (const double[]){100, 50}, 2);
    assert_jcts(jct, (const double[]){50, 65}, 2);
    assert_int_equal(rigid.elastic_jobs, 0);
    assert_int_equal(e.elastic_jobs, 2);
    assert_true(e.mean_jct <= rigid.mean_jct);
    assert_true(fabs(e.utilization - 1.0) < 1e-12); /* both GPUs busy all along */

    const char *grow = "submit,duration,gpus\n"
                       "0,100,1\n"
                       "0,2000,1\n";
    rigid = run_elastic(grow, 0, 2, 0, rigid_jct);
    e = run_elastic(grow, 0, 2, 0.3, jct);
    assert_jcts(rigid_jct, (const double[]){100, 2000}, 2);
    assert_jcts(jct, (const double[]){100, 1330}, 2);
    assert_int_equal(e.elastic_jobs, 1);
    assert_int_equal(e.resizes, 1);
    assert_int_equal(e.preemptions, 0);
    assert_int_equal(e.completed, 2);
    assert_true(e.mean_jct < rigid.mean_jct);
    /* a share outside 0-1 is refused */
    gpcd_trace t = parse(two);
    gpcd_policy_config p = policy_with(0);
    gpcd_sim_options o = {2, 80ull << 30, 30, 0, 1.5};
    gpcd_sim_result r;
    TEST_FAILS(gpcd_simulate(&t, &p, &o, &r, NULL), GPC_ERR_INVALID_ARG, "elastic share must be");
    gpcd_trace_free(&t);
}

/* FIFO on 2 GPUs: A holds both until 100; B and C start then; D (2 GPUs)
 * waits for B to end at 150. */
static void test_fifo_by_hand(void **state) {
    (void)state;
    const char *trace = "submit,duration,gpus\n"
                        "0,100,2\n"
                        "10,50,1\n"
                        "20,10,1\n"
                        "30,30,2\n";
    double jct[4];
    gpcd_sim_result r = run(trace, 0, 2, 30, jct);
    const double want[4] = {100, 140, 90, 150};
    assert_jcts(jct, want, 4);
    assert_int_equal(r.jobs, 4);
    assert_int_equal(r.completed, 4);
    assert_true(fabs(r.mean_jct - 120) < 1e-9);
    assert_true(fabs(r.median_jct - 120) < 1e-9); /* (100 + 140) / 2 */
    assert_true(fabs(r.p95_jct - 150) < 1e-9);    /* nearest rank: ceil(0.95 * 4) = 4th */
    assert_true(fabs(r.makespan - 180) < 1e-9);
    /* GPU-seconds: 2*100 + 50 + 10 + 2*30 = 320 of 2 * 180 */
    assert_true(fabs(r.utilization - 320.0 / 360.0) < 1e-12);
    /* waits: 0, 90, 80, 120 */
    assert_true(fabs(r.mean_wait - 72.5) < 1e-9);
    assert_true(fabs(r.worst_wait - 120) < 1e-9);
    assert_int_equal(r.worst_wait_line, 5);
}

/* A 2-GPU job blocked behind A: FIFO holds everyone back; with EASY
 * backfill C (limit 40, ends by 42 <= the reservation at 100) runs at once,
 * while D (limit 200) may not delay B and waits. */
static void test_backfill_by_hand(void **state) {
    (void)state;
    const char *trace = "submit,duration,gpus,time_limit\n"
                        "0,100,1,100\n"
                        "1,50,2,60\n"
                        "2,30,1,40\n"
                        "3,200,1,200\n";
    double jct[4];
    run(trace, 0, 2, 30, jct);
    const double fifo[4] = {100, 149, 178, 347};
    assert_jcts(jct, fifo, 4);
    gpcd_sim_result r = run(trace, GPCD_POLICY_BACKFILL, 2, 30, jct);
    const double backfill[4] = {100, 149, 30, 347};
    assert_jcts(jct, backfill, 4);
    assert_true(fabs(r.makespan - 350) < 1e-9);
}

/* A low job is preempted at 10 by a high one; it holds the GPU for the 5 s
 * grace, keeps the 10 s of work done before SIGTERM, and resumes at 35. */
static void test_preemption_by_hand(void **state) {
    (void)state;
    const char *trace = "submit,duration,gpus,priority\n"
                        "0,100,1,low\n"
                        "10,20,1,high\n";
    double jct[2];
    gpcd_policy_config p = policy_with(GPCD_POLICY_PRIORITY | GPCD_POLICY_PREEMPTION);
    p.preempt_min_runtime = 10; /* A has run exactly that long at 10 */
    gpcd_sim_result r = run_with(trace, &p, 1, 5, 0, jct);
    const double want[2] = {35 + 90, 35 - 10};
    assert_jcts(jct, want, 2);
    assert_int_equal(r.preemptions, 1);
    /* A ran 15 s (10 of work + 5 of grace) then 90: it waited 20; B 5 */
    assert_true(fabs(r.worst_wait - 20) < 1e-9);
    assert_true(fabs(r.mean_wait - 12.5) < 1e-9);
    /* busy: 15 + 20 + 90 GPU-seconds over 125 */
    assert_true(fabs(r.utilization - 125.0 / 125.0) < 1e-12);
}

/* preempt_min_runtime: the high job arriving at 10 waits until the low one
 * has run 60 s (the once-a-second pass sees it at 60); the low job keeps
 * its 60 s of work, holds the GPU for the 5 s grace, and resumes after the
 * high one at 85 with 40 s left. */
static void test_preemption_min_runtime_by_hand(void **state) {
    (void)state;
    const char *trace = "submit,duration,gpus,priority\n"
                        "0,100,1,low\n"
                        "10,20,1,high\n";
    double jct[2];
    gpcd_policy_config p = policy_with(GPCD_POLICY_PRIORITY | GPCD_POLICY_PREEMPTION);
    p.preempt_min_runtime = 60;
    gpcd_sim_result r = run_with(trace, &p, 1, 5, 1, jct);
    const double want[2] = {85 + 40, 85 - 10};
    assert_jcts(jct, want, 2);
    assert_int_equal(r.preemptions, 1);
}

/* No ping-pong: a low job that has aged past a fresh high one (10 + 10 h x
 * 10 points = 110 > 90) would be requeued ahead of it and take its GPU
 * back at once, over and over; it is not preempted, and the high job
 * waits for it. Two jobs of equal base priority never preempt each other,
 * whichever has aged more. */
static void test_preemption_no_ping_pong_by_hand(void **state) {
    (void)state;
    const char *trace = "submit,duration,gpus,priority\n"
                        "0,72000,1,low\n"
                        "36000,100,1,high\n"
                        "36000,100,1,low\n";
    double jct[3];
    gpcd_policy_config p =
        policy_with(GPCD_POLICY_PRIORITY | GPCD_POLICY_AGING | GPCD_POLICY_PREEMPTION);
    gpcd_sim_result r = run_with(trace, &p, 1, 5, 60, jct);
    const double want[3] = {72000, 72100 - 36000, 72200 - 36000};
    assert_jcts(jct, want, 3);
    assert_int_equal(r.preemptions, 0);
    /* equal base priority: the second job ages for 10 h and never stops the first */
    const char *equal = "submit,duration,gpus,priority\n"
                        "0,72000,1,normal\n"
                        "1,100,1,normal\n";
    r = run_with(equal, &p, 1, 5, 60, jct);
    const double want_equal[2] = {72000, 72100 - 1};
    assert_jcts(jct, want_equal, 2);
    assert_int_equal(r.preemptions, 0);
}

/* Past its time limit a job is stopped and counts as timed out. */
static void test_time_limit_by_hand(void **state) {
    (void)state;
    const char *trace = "submit,duration,gpus,time_limit\n"
                        "0,100,1,60\n"
                        "0,10,1,\n";
    double jct[2];
    gpcd_sim_result r = run(trace, 0, 1, 30, jct);
    const double want[2] = {60, 70};
    assert_jcts(jct, want, 2);
    assert_int_equal(r.timed_out, 1);
    assert_int_equal(r.completed, 1);
}

/* shortest_first: when A ends, C (limit 15 min) goes before B (1 h). */
static void test_shortest_first_by_hand(void **state) {
    (void)state;
    const char *trace = "submit,duration,gpus,time_limit\n"
                        "0,100,1,100\n"
                        "1,50,1,3600\n"
                        "2,10,1,900\n";
    double jct[3];
    run(trace, 0, 1, 30, jct);
    const double fifo[3] = {100, 149, 158};
    assert_jcts(jct, fifo, 3);
    run(trace, GPCD_POLICY_SHORTEST_FIRST, 1, 30, jct);
    const double sjf[3] = {100, 159, 108};
    assert_jcts(jct, sjf, 3);
}

/* The bonus: points x log2(GPU-year / (limit x GPUs)), none without a
 * limit or beyond a GPU-year, on top of priority and aging. */
static void test_shortest_first_formula(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 71);
    gpcd_policy_config p =
        policy_with(GPCD_POLICY_PRIORITY | GPCD_POLICY_AGING | GPCD_POLICY_SHORTEST_FIRST);
    p.shortest_first_points = 1 + 20 * gpc_rng_uniform64(&rng);
    for (int trial = 0; trial < 200; trial++) {
        gpcd_job *j = gpcd_job_new();
        j->priority = (int)gpc_rng_below(&rng, 101);
        j->gpus = 1 + (int)gpc_rng_below(&rng, 16);
        j->time_limit = trial % 10 == 0 ? 0 : 30 * pow(10, 6 * gpc_rng_uniform64(&rng));
        j->submit_time = 1000;
        double now = 1000 + 86400 * gpc_rng_uniform64(&rng);
        double want = j->priority + p.aging_per_hour * (now - 1000) / 3600.0;
        if (j->time_limit > 0) {
            double ask = fmax(j->time_limit * j->gpus, 60.0);
            want += p.shortest_first_points * fmax(0.0, log2(365.0 * 86400.0 / ask));
        }
        double got = gpcd_policy_effective_priority(&p, j, now);
        if (fabs(got - want) > 1e-9 * fabs(want))
            fail_msg("priority %.12g, want %.12g (limit %g, gpus %d)", got, want, j->time_limit,
                     j->gpus);
        gpcd_job_free(j);
    }
}

/* FIFO with 1-GPU jobs on k GPUs is a k-server queue: job i starts at
 * max(its arrival, the earliest time a GPU frees), in arrival order. */
static void test_fifo_random_against_queue(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 72);
    for (int trial = 0; trial < 20; trial++) {
        int n = 20 + (int)gpc_rng_below(&rng, 200), k = 1 + (int)gpc_rng_below(&rng, 8);
        gpcd_trace t = {calloc((size_t)n, sizeof(gpcd_trace_job)), n};
        double clock = 0;
        for (int i = 0; i < n; i++) {
            clock += floor(100 * gpc_rng_uniform64(&rng)); /* ties happen */
            t.jobs[i].submit = clock;
            t.jobs[i].duration = 1 + floor(400 * gpc_rng_uniform64(&rng));
            t.jobs[i].gpus = 1;
            t.jobs[i].priority = 50;
            t.jobs[i].line = i + 2;
        }
        double *jct = malloc(sizeof *jct * (size_t)n), free_at[8] = {0};
        gpcd_policy_config p = policy_with(0);
        gpcd_sim_options o = {k, 80ull << 30, 30, 0, 0};
        gpcd_sim_result r;
        TEST_OK(gpcd_simulate(&t, &p, &o, &r, jct));
        double sum = 0, last = 0;
        for (int i = 0; i < n; i++) {
            int g = 0;
            for (int h = 1; h < k; h++)
                if (free_at[h] < free_at[g]) g = h;
            double start = fmax(t.jobs[i].submit, free_at[g]);
            free_at[g] = start + t.jobs[i].duration;
            double want = free_at[g] - t.jobs[i].submit;
            if (fabs(jct[i] - want) > 1e-6)
                fail_msg("trial %d, %d jobs on %d GPUs: job %d JCT %.6f, want %.6f", trial, n, k, i,
                         jct[i], want);
            sum += want;
            last = fmax(last, free_at[g]);
        }
        assert_true(fabs(r.mean_jct - sum / n) < 1e-6);
        assert_true(fabs(r.makespan - (last - t.jobs[0].submit)) < 1e-6);
        free(jct);
        gpcd_trace_free(&t);
    }
}

static void expect_parse_error(const char *text, const char *needle) {
    gpcd_trace t;
    TEST_FAILS(gpcd_trace_parse(text, strlen(text), "bad.csv", &t), GPC_ERR_INVALID_ARG, needle);
}

static void test_bad_traces(void **state) {
    (void)state;
    expect_parse_error("", "bad.csv is empty");
    expect_parse_error("# only a comment\n", "bad.csv is empty");
    expect_parse_error("submit,duration,gpus\n", "has a header but no jobs");
    expect_parse_error("submit,duration\n0,1\n",
                       "bad.csv line 1: the header lacks the column 'gpus'");
    expect_parse_error("submit,duration,gpus,cost\n", "bad.csv line 1: unknown column 'cost'");
    expect_parse_error("submit,gpus,gpus,duration\n", "line 1: column 'gpus' appears twice");
    expect_parse_error("submit,duration,gpus\n0,10,1\n\n# c\n5,10\n",
                       "bad.csv line 5: 2 fields, the header has 3");
    expect_parse_error("submit,duration,gpus\n-1,10,1\n", "line 2: submit '-1' is not a time");
    expect_parse_error("submit,duration,gpus\n0,0,1\n", "line 2: duration '0' is not");
    expect_parse_error("submit,duration,gpus\n0,abc,1\n", "line 2: duration 'abc' is not");
    expect_parse_error("submit,duration,gpus\n0,1,0\n",
                       "line 2: gpus '0' is not a whole number 1-64");
    expect_parse_error("submit,duration,gpus\n0,1,1.5\n", "line 2: gpus '1.5'");
    expect_parse_error("submit,duration,gpus\n0,1,65\n", "line 2: gpus '65'");
    expect_parse_error("submit,duration,gpus,priority\n0,1,1,urgent\n",
                       "line 2: priority 'urgent' is not low, normal, high or 0-100");
    expect_parse_error("submit,duration,gpus,time_limit\n0,1,1,-5\n", "line 2: time_limit '-5'");
    expect_parse_error("submit,duration,gpus\n0,1,1\n0,nan,1\n", "line 3: duration 'nan'");
    /* fine: spaces, CRLF, comments, blank lines, named priorities, empty limit */
    gpcd_trace t = parse("# a trace\r\n gpus , submit,duration,priority,time_limit\r\n\r\n"
                         "2, 5.5, 60, high,\r\n1,7,30,12,90\r\n");
    assert_int_equal(t.count, 2);
    assert_int_equal(t.jobs[0].gpus, 2);
    assert_true(t.jobs[0].submit == 5.5 && t.jobs[0].duration == 60);
    assert_int_equal(t.jobs[0].priority, GPCD_PRIORITY_HIGH);
    assert_true(t.jobs[0].time_limit == 0);
    assert_int_equal(t.jobs[0].line, 4);
    assert_int_equal(t.jobs[1].priority, 12);
    assert_true(t.jobs[1].time_limit == 90);
    /* the simulator refuses a job bigger than its cluster, naming the line */
    gpcd_policy_config p = policy_with(0);
    gpcd_sim_options o = {1, 80ull << 30, 30, 0, 0};
    gpcd_sim_result r;
    TEST_FAILS(gpcd_simulate(&t, &p, &o, &r, NULL), GPC_ERR_INVALID_ARG,
               "the job on trace line 4 needs 2 GPUs; the simulated cluster has 1");
    gpcd_trace_free(&t);
    unsigned flags;
    TEST_OK(gpcd_sim_policy_parse("fifo", &flags));
    assert_int_equal(flags, 0);
    TEST_OK(gpcd_sim_policy_parse("backfill,shortest_first", &flags));
    assert_int_equal(flags, GPCD_POLICY_BACKFILL | GPCD_POLICY_SHORTEST_FIRST);
    TEST_FAILS(gpcd_sim_policy_parse("sjf", &flags), GPC_ERR_INVALID_ARG, "unknown policy 'sjf'");
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void test_generator_matches_targets(void **state) {
    (void)state;
    gpcd_trace_targets t;
    gpcd_trace_targets_default(&t);
    t.jobs = 20000;
    t.seed = test_seed();
    gpcd_trace trace;
    TEST_OK(gpcd_trace_generate(&t, &trace));
    int n = trace.count;
    assert_int_equal(n, t.jobs);

    /* sizes: each share within 5 standard errors; jobs come in bursts of
     * one size, so the independent draws are the bursts (n / burst_mean) */
    double draws = n / t.burst_mean;
    for (int s = 0; s < GPCD_TRACE_SIZES; s++) {
        int count = 0;
        for (int i = 0; i < n; i++)
            count += trace.jobs[i].gpus == t.size_gpus[s];
        double share = (double)count / n, p = t.size_share[s];
        double se = sqrt(p * (1 - p) / draws);
        if (fabs(share - p) > 5 * se + 1e-3)
            fail_msg("%d-GPU share %.4f, target %.4f (se %.4f)", t.size_gpus[s], share, p, se);
    }
    /* run times: log-normal median, spread (the interquartile range of
     * log(duration) is 2 * 0.6745 sigma), clipped to the range */
    double *logs = malloc(sizeof *logs * (size_t)n);
    double work = 0;
    for (int i = 0; i < n; i++) {
        const gpcd_trace_job *j = &trace.jobs[i];
        assert_true(j->duration >= t.duration_min && j->duration <= t.duration_max);
        logs[i] = log(j->duration);
        work += j->duration * j->gpus;
        /* the limit a user asks for: at least the run time, from the usual round values */
        assert_true(j->time_limit >= j->duration);
        assert_true(fmod(j->time_limit, 900) == 0);
        if (i > 0) assert_true(j->submit >= trace.jobs[i - 1].submit);
        assert_int_equal(j->line, i + 2);
    }
    qsort(logs, (size_t)n, sizeof *logs, cmp_double);
    double median = logs[n / 2], iqr = logs[3 * n / 4] - logs[n / 4];
    assert_true(fabs(median - log(t.duration_median)) < 0.08);
    assert_true(fabs(iqr - 2 * 0.6745 * t.duration_sigma) < 0.15);
    free(logs);
    /* offered load: GPU time asked for over the span it arrives in */
    double span = trace.jobs[n - 1].submit - trace.jobs[0].submit;
    double load = work / (span * t.cluster_gpus);
    if (fabs(load - t.load) > 0.02 * t.load)
        fail_msg("offered load %.4f, target %.2f", load, t.load);
    /* bursty: inter-arrival times vary far more than a Poisson process's
     * (coefficient of variation 1) */
    double sum = 0, sum2 = 0;
    for (int i = 1; i < n; i++) {
        double gap = trace.jobs[i].submit - trace.jobs[i - 1].submit;
        sum += gap;
        sum2 += gap * gap;
    }
    double mean = sum / (n - 1), cv = sqrt(sum2 / (n - 1) - mean * mean) / mean;
    if (cv < 1.5) fail_msg("inter-arrival coefficient of variation %.2f: not bursty", cv);
    /* the daily cycle: rate 1 + A sin puts (1 + 2A/pi) / 2 of the arrivals in
     * the half-day where the sine is positive */
    int day = 0;
    for (int i = 0; i < n; i++)
        day += fmod(trace.jobs[i].submit, 86400.0) < 43200.0;
    double want_day = (1 + 2 * t.diurnal_amplitude / M_PI) / 2;
    assert_true(fabs((double)day / n - want_day) < 0.05);
    /* priorities */
    int high = 0, low = 0;
    for (int i = 0; i < n; i++) {
        high += trace.jobs[i].priority == GPCD_PRIORITY_HIGH;
        low += trace.jobs[i].priority == GPCD_PRIORITY_LOW;
    }
    assert_true(fabs((double)high / n - t.share_high) < 0.02);
    assert_true(fabs((double)low / n - t.share_low) < 0.02);

    /* the same seed gives the same trace; save and load round-trips it */
    gpcd_trace again;
    TEST_OK(gpcd_trace_generate(&t, &again));
    assert_memory_equal(trace.jobs, again.jobs, sizeof *trace.jobs * (size_t)n);
    gpcd_trace_free(&again);
    char *dir = test_tmpdir("trace");
    char path[4200];
    snprintf(path, sizeof path, "%s/t.csv", dir);
    TEST_OK(gpcd_trace_save(path, &trace));
    gpcd_trace loaded;
    TEST_OK(gpcd_trace_load(path, &loaded));
    assert_int_equal(loaded.count, n);
    for (int i = 0; i < n; i++) {
        const gpcd_trace_job *a = &trace.jobs[i], *b = &loaded.jobs[i];
        assert_true(fabs(a->submit - b->submit) < 1e-3 && a->duration == b->duration &&
                    a->gpus == b->gpus && a->priority == b->priority &&
                    a->time_limit == b->time_limit && a->line == b->line);
    }
    gpcd_trace_free(&loaded);
    gpcd_trace_free(&trace);
    test_rmtree(dir);
    gpc_free(dir);

    t.jobs = 0;
    TEST_FAILS(gpcd_trace_generate(&t, &trace), GPC_ERR_INVALID_ARG, "1 to 10,000,000 jobs");
    t.jobs = 10;
    t.size_share[0] = 0.5;
    TEST_FAILS(gpcd_trace_generate(&t, &trace), GPC_ERR_INVALID_ARG, "add up to 0.7");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo_by_hand),
        cmocka_unit_test(test_elastic_by_hand),
        cmocka_unit_test(test_backfill_by_hand),
        cmocka_unit_test(test_preemption_by_hand),
        cmocka_unit_test(test_preemption_min_runtime_by_hand),
        cmocka_unit_test(test_preemption_no_ping_pong_by_hand),
        cmocka_unit_test(test_time_limit_by_hand),
        cmocka_unit_test(test_shortest_first_by_hand),
        cmocka_unit_test(test_shortest_first_formula),
        cmocka_unit_test(test_fifo_random_against_queue),
        cmocka_unit_test(test_bad_traces),
        cmocka_unit_test(test_generator_matches_targets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
