/*
 * test_store.c: the SQLite store: jobs read back exactly as written,
 * state changes recorded in order, group commit under concurrent
 * submissions (every id distinct and every job present once), sample
 * retention, alerts, and the configuration table and its errors.
 */
#include "testutil.h"

#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/sched.h"

static gpcd_job *sample_job(gpc_rng *rng) {
    gpcd_job *j = gpcd_job_new();
    char cmd[64];
    snprintf(cmd, sizeof cmd, "[\"run\",\"%u\"]", gpc_rng_u32(rng));
    j->command = strdup(cmd);
    j->owner = strdup("bob");
    j->owner_uid = 1000 + gpc_rng_below(rng, 100);
    j->cwd = strdup("/tmp");
    j->env = strdup("{}");
    j->data = gpc_rng_below(rng, 2) ? strdup("/datasets/y") : NULL;
    j->gpus = 1 + (int)gpc_rng_below(rng, 8);
    j->mem = (uint64_t)gpc_rng_below(rng, 1u << 30) << 6;
    j->priority = (int)gpc_rng_below(rng, 101);
    j->type = (gpcd_job_type)gpc_rng_below(rng, GPCD_TYPE_COUNT);
    j->time_limit = gpc_rng_below(rng, 10000);
    j->submit_time = 1.7e9 + gpc_rng_uniform64(rng) * 1e6;
    return j;
}

static void assert_same_job(const gpcd_job *a, const gpcd_job *b) {
    assert_int_equal(a->id, b->id);
    assert_string_equal(a->command, b->command);
    assert_string_equal(a->owner, b->owner);
    assert_int_equal(a->owner_uid, b->owner_uid);
    if (a->data || b->data) assert_string_equal(a->data, b->data);
    assert_int_equal(a->gpus, b->gpus);
    assert_true(a->mem == b->mem);
    assert_int_equal(a->priority, b->priority);
    assert_int_equal(a->type, b->type);
    assert_true(a->time_limit == b->time_limit);
    assert_true(a->submit_time == b->submit_time);
    assert_int_equal(a->state, b->state);
}

/* A new store in a fresh folder (*dir, to remove at the end; path: its file). */
static gpcd_store *open_fresh(const char *tag, char **dir, char *path, size_t size) {
    *dir = test_tmpdir(tag);
    snprintf(path, size, "%s/gpcd.db", *dir);
    gpcd_store *store;
    TEST_OK(gpcd_store_open(path, &store));
    return store;
}

static void test_jobs_round_trip(void **state) {
    (void)state;
    char *dir, path[4200];
    gpcd_store *store = open_fresh("store", &dir, path, sizeof path);
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 31);
    gpcd_job *jobs[20];
    for (int i = 0; i < 20; i++) {
        jobs[i] = sample_job(&rng);
        TEST_OK(gpcd_store_submit(store, jobs[i]));
        assert_int_equal(jobs[i]->id, i + 1);
    }
    /* job 3 runs and fails */
    gpcd_job *j = jobs[2];
    j->state = GPCD_RUNNING;
    j->start_time = j->submit_time + 5;
    j->assigned_count = 3;
    j->assigned[0] = 4, j->assigned[1] = 6, j->assigned[2] = 7;
    j->pid = 1234;
    j->pid_start = 99887766;
    TEST_OK(gpcd_store_update(store, j));
    gpcd_job *got;
    TEST_OK(gpcd_store_get(store, 3, &got));
    assert_same_job(j, got);
    assert_int_equal(got->assigned_count, 3);
    assert_int_equal(got->assigned[2], 7);
    assert_int_equal(got->pid, 1234);
    assert_true(got->pid_start == 99887766);
    gpcd_job_free(got);
    j->state = GPCD_FAILED;
    j->exit_code = 3;
    j->message = strdup("exited with status 3");
    TEST_OK(gpcd_store_update(store, j));
    char *events;
    TEST_OK(gpcd_store_events(store, 3, &events));
    assert_non_null(strstr(events, "\"state\":\"queued\""));
    const char *running = strstr(events, "\"state\":\"running\"");
    const char *failed =
        strstr(events, "\"state\":\"failed\",\"message\":\"exited with status 3\"");
    assert_non_null(running);
    assert_non_null(failed);
    assert_true(running < failed);
    free(events);

    /* reopening reads the same data; list filters by state */
    gpcd_store_close(store);
    TEST_OK(gpcd_store_open(path, &store));
    gpcd_job **list;
    int n;
    TEST_OK(gpcd_store_list(store, 1u << GPCD_QUEUED, 0, &list, &n));
    assert_int_equal(n, 19);
    for (int i = 0, k = 0; i < 20; i++) {
        if (i == 2) continue;
        assert_same_job(jobs[i], list[k++]);
    }
    gpcd_store_free_list(list, n);
    TEST_OK(gpcd_store_list(store, 1u << GPCD_FAILED, 0, &list, &n));
    assert_int_equal(n, 1);
    assert_int_equal(list[0]->exit_code, 3);
    assert_string_equal(list[0]->message, "exited with status 3");
    gpcd_store_free_list(list, n);
    /* two states: every job of either, in id order; none asked, none */
    TEST_OK(gpcd_store_list(store, 1u << GPCD_QUEUED | 1u << GPCD_FAILED, 0, &list, &n));
    assert_int_equal(n, 20);
    for (int i = 0; i < 20; i++)
        assert_int_equal(list[i]->id, jobs[i]->id);
    assert_int_equal(list[2]->state, GPCD_FAILED);
    gpcd_store_free_list(list, n);
    TEST_OK(gpcd_store_list(store, 1u << GPCD_RUNNING | 1u << GPCD_PREEMPTED, 0, &list, &n));
    assert_int_equal(n, 0);
    gpcd_store_free_list(list, n);
    TEST_OK(gpcd_store_list(store, 0, 0, &list, &n));
    assert_int_equal(n, 0);
    gpcd_store_free_list(list, n);
    int64_t counts[GPCD_STATE_COUNT];
    TEST_OK(gpcd_store_state_counts(store, counts));
    assert_int_equal(counts[GPCD_QUEUED], 19);
    assert_int_equal(counts[GPCD_FAILED], 1);
    TEST_FAILS(gpcd_store_get(store, 999, &got), GPC_ERR_INVALID_ARG, "no job 999");
    gpcd_job ghost = *jobs[0];
    ghost.id = 777;
    TEST_FAILS(gpcd_store_update(store, &ghost), GPC_ERR_INTERNAL, "not in the database");
    for (int i = 0; i < 20; i++)
        gpcd_job_free(jobs[i]);
    gpcd_store_close(store);
    test_rmtree(dir);
    gpc_free(dir);
}

typedef struct {
    gpcd_store *store;
    int count;
    uint32_t seed;
    int64_t *ids;
} submitter;

static void *submit_many(void *arg) {
    submitter *s = arg;
    gpc_rng rng;
    gpc_rng_seed(&rng, s->seed, 5);
    for (int i = 0; i < s->count; i++) {
        gpcd_job *j = sample_job(&rng);
        if (gpcd_store_submit(s->store, j) != GPC_OK) fail_msg("submit: %s", gpc_last_error());
        s->ids[i] = j->id;
        gpcd_job_free(j);
    }
    return NULL;
}

/* The newest finished jobs by end time: 40 jobs, 30 of them ended at
 * random times (some equal, so ties fall back to the id), against the order
 * computed here. */
static void test_list_recent(void **state) {
    (void)state;
    char *dir, path[4200];
    gpcd_store *store = open_fresh("recent", &dir, path, sizeof path);
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 33);
    enum { JOBS = 40 };
    double end[JOBS + 1] = {0};
    for (int i = 1; i <= JOBS; i++) {
        gpcd_job *j = sample_job(&rng);
        TEST_OK(gpcd_store_submit(store, j));
        if (i % 4 != 0) { /* every fourth stays queued */
            j->state = gpc_rng_below(&rng, 2) ? GPCD_COMPLETED : GPCD_FAILED;
            j->start_time = j->submit_time + 1;
            j->end_time = 1.8e9 + (double)gpc_rng_below(&rng, 12); /* few values: ties */
            end[i] = j->end_time;
            TEST_OK(gpcd_store_update(store, j));
        }
        gpcd_job_free(j);
    }
    const unsigned finished = (1u << GPCD_COMPLETED) | (1u << GPCD_FAILED);
    for (int want = 1; want <= JOBS; want += 7) {
        gpcd_job **list;
        int n;
        TEST_OK(gpcd_store_list_recent(store, finished, want, &list, &n));
        assert_int_equal(n, want < 30 ? want : 30);
        /* the reference: ids of finished jobs by end time, then id, both descending */
        int order[JOBS], count = 0;
        for (int i = 1; i <= JOBS; i++)
            if (end[i] > 0) order[count++] = i;
        for (int a = 0; a < count; a++)
            for (int b = a + 1; b < count; b++)
                if (end[order[b]] > end[order[a]] ||
                    (end[order[b]] == end[order[a]] && order[b] > order[a])) {
                    int t = order[a];
                    order[a] = order[b], order[b] = t;
                }
        for (int k = 0; k < n; k++) {
            assert_int_equal(list[k]->id, order[k]);
            assert_true(list[k]->end_time == end[order[k]]);
        }
        gpcd_store_free_list(list, n);
    }
    gpcd_store_close(store);
    test_rmtree(dir);
    gpc_free(dir);
}

/* keep_finished's pruning: only jobs that ended (completed, failed,
 * cancelled) before the cutoff go, oldest first and at most `most` a call,
 * with their events; waiting, running and preempted jobs stay whatever
 * their times; a failed write removes nothing. */
static void test_prune_finished(void **state) {
    (void)state;
    char *dir, path[4200];
    gpcd_store *store = open_fresh("prune", &dir, path, sizeof path);
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 35);
    enum { JOBS = 60 };
    const gpcd_state kinds[] = {GPCD_QUEUED,    GPCD_RUNNING, GPCD_PREEMPTED,
                                GPCD_COMPLETED, GPCD_FAILED,  GPCD_CANCELLED};
    double end[JOBS + 1];
    int state_of[JOBS + 1], slot[JOBS];
    for (int i = 0; i < JOBS; i++) /* distinct end times, in random order */
        slot[i] = i;
    for (int i = JOBS - 1; i > 0; i--) {
        int k = (int)gpc_rng_below(&rng, (uint32_t)i + 1), t = slot[i];
        slot[i] = slot[k], slot[k] = t;
    }
    for (int i = 1; i <= JOBS; i++) {
        gpcd_job *j = sample_job(&rng);
        TEST_OK(gpcd_store_submit(store, j));
        j->state = kinds[gpc_rng_below(&rng, 6)];
        j->start_time = j->submit_time + 1;
        j->end_time = 1.8e9 + slot[i - 1]; /* set even on jobs that have not ended */
        end[i] = j->end_time, state_of[i] = j->state;
        if (j->state != GPCD_QUEUED) TEST_OK(gpcd_store_update(store, j));
        gpcd_job_free(j);
    }
    const double cutoff = 1.8e9 + JOBS / 2;
    /* the reference: finished jobs that ended before the cutoff, by end time */
    int order[JOBS], count = 0;
    for (int i = 1; i <= JOBS; i++)
        if (state_of[i] >= GPCD_COMPLETED && state_of[i] <= GPCD_CANCELLED && end[i] < cutoff)
            order[count++] = i;
    for (int a = 0; a < count; a++)
        for (int b = a + 1; b < count; b++)
            if (end[order[b]] < end[order[a]]) {
                int t = order[a];
                order[a] = order[b], order[b] = t;
            }
    assert_true(count > 5);
    int64_t ids[JOBS];
    int n;
    TEST_OK(gpcd_store_prune_finished(store, cutoff, 5, ids, &n));
    assert_int_equal(n, 5);
    for (int k = 0; k < 5; k++)
        assert_int_equal(ids[k], order[k]);
    /* a failed write removes nothing */
    gpcd_store_simulate_full(store, 1);
    TEST_FAILS(gpcd_store_prune_finished(store, cutoff, JOBS, ids, &n), GPC_ERR_IO, "full");
    assert_int_equal(n, 0);
    gpcd_store_simulate_full(store, 0);
    TEST_OK(gpcd_store_prune_finished(store, cutoff, JOBS, ids, &n));
    assert_int_equal(n, count - 5);
    for (int k = 0; k < n; k++)
        assert_int_equal(ids[k], order[k + 5]);
    TEST_OK(gpcd_store_prune_finished(store, cutoff, JOBS, ids, &n));
    assert_int_equal(n, 0);
    /* what is left: every other job, with its events */
    for (int i = 1; i <= JOBS; i++) {
        int pruned = 0;
        for (int k = 0; k < count; k++)
            pruned |= order[k] == i;
        gpcd_job *got = NULL;
        char *events = NULL;
        TEST_OK(gpcd_store_events(store, i, &events));
        if (pruned) {
            TEST_FAILS(gpcd_store_get(store, i, &got), GPC_ERR_INVALID_ARG, "no job");
            assert_string_equal(events, "[]");
        } else {
            TEST_OK(gpcd_store_get(store, i, &got));
            assert_int_equal(got->state, state_of[i]);
            assert_non_null(strstr(events, "\"state\":\"queued\""));
            gpcd_job_free(got);
        }
        free(events);
    }
    gpcd_store_close(store);
    test_rmtree(dir);
    gpc_free(dir);
}

static void test_group_commit_concurrent(void **state) {
    (void)state;
    char *dir, path[4200];
    gpcd_store *store = open_fresh("store", &dir, path, sizeof path);
    enum { THREADS = 8, EACH = 60 };
    pthread_t threads[THREADS];
    submitter subs[THREADS];
    for (int t = 0; t < THREADS; t++) {
        subs[t] =
            (submitter){store, EACH, (uint32_t)test_seed() + t, calloc(EACH, sizeof(int64_t))};
        pthread_create(&threads[t], NULL, submit_many, &subs[t]);
    }
    for (int t = 0; t < THREADS; t++)
        pthread_join(threads[t], NULL);
    /* every id 1..THREADS*EACH handed out exactly once, and all in the store */
    int seen[THREADS * EACH + 1] = {0};
    for (int t = 0; t < THREADS; t++)
        for (int i = 0; i < EACH; i++) {
            int64_t id = subs[t].ids[i];
            assert_true(id >= 1 && id <= THREADS * EACH);
            seen[id]++;
        }
    for (int i = 1; i <= THREADS * EACH; i++)
        assert_int_equal(seen[i], 1);
    gpcd_job **list;
    int n;
    TEST_OK(gpcd_store_list(store, 0xff, 0, &list, &n));
    assert_int_equal(n, THREADS * EACH);
    gpcd_store_free_list(list, n);
    for (int t = 0; t < THREADS; t++)
        free(subs[t].ids);
    gpcd_store_close(store);
    test_rmtree(dir);
    gpc_free(dir);
}

static void test_samples_and_alerts(void **state) {
    (void)state;
    char *dir, path[4200];
    gpcd_store *store = open_fresh("store", &dir, path, sizeof path);
    gpcd_sample_row rows[4];
    for (int g = 0; g < 4; g++)
        rows[g] = (gpcd_sample_row){0, g, 50, 1, 2, 40, 300};
    /* 30 seconds of samples with a 10 s window: only times within 10 s of
     * the last remain: t = 20..29 for 4 GPUs */
    for (int t = 0; t < 30; t++) {
        for (int g = 0; g < 4; g++)
            rows[g].time = t;
        TEST_OK(gpcd_store_add_samples(store, rows, 4, 10.0, (double)t));
    }
    int64_t count;
    TEST_OK(gpcd_store_count_samples(store, &count));
    assert_int_equal(count, 11 * 4); /* t = 19 .. 29: time >= now - retention */
    int64_t id;
    TEST_OK(gpcd_store_alert_open(store, 3, "memory", "GPU 3 memory 95% used", 100, &id));
    assert_true(id > 0);
    TEST_OK(gpcd_store_alert_close(store, id, 160));
    gpcd_store_close(store);
    test_rmtree(dir);
    gpc_free(dir);
}

static void test_store_open_errors(void **state) {
    (void)state;
    gpcd_store *store;
    TEST_FAILS(gpcd_store_open("/nonexistent-dir/x/gpcd.db", &store), GPC_ERR_IO,
               "cannot open job database");
    char *dir = test_tmpdir("store");
    char path[4200];
    snprintf(path, sizeof path, "%s/gpcd.db", dir);
    FILE *f = fopen(path, "w");
    fputs("this is not a database, just text that is long enough to be looked at", f);
    fclose(f);
    TEST_FAILS(gpcd_store_open(path, &store), GPC_ERR_IO, "job database");
    test_rmtree(dir);
    gpc_free(dir);
}

/* A database the previous schema (version 1, before elastic jobs) wrote:
 * written here with that schema verbatim, it opens, its jobs read back
 * with a fixed GPU count, it is upgraded in place, and elastic jobs then
 * round-trip; a database from a newer gpcd is still refused. */
static void test_store_migration(void **state) {
    (void)state;
    char *dir = test_tmpdir("store");
    char path[4200];
    snprintf(path, sizeof path, "%s/gpcd.db", dir);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    const char *v1 =
        "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT);"
        "INSERT INTO meta VALUES('schema_version', '1');"
        "CREATE TABLE jobs("
        " id INTEGER PRIMARY KEY AUTOINCREMENT, owner_uid INTEGER NOT NULL, owner TEXT,"
        " name TEXT, command TEXT NOT NULL, cwd TEXT, env TEXT, data TEXT,"
        " gpus INTEGER NOT NULL, mem INTEGER NOT NULL, priority INTEGER NOT NULL,"
        " type INTEGER NOT NULL, time_limit REAL NOT NULL, state INTEGER NOT NULL,"
        " submit_time REAL NOT NULL, start_time REAL, end_time REAL, exit_code INTEGER,"
        " signal INTEGER, assigned TEXT, pid INTEGER, pid_start INTEGER, pgid INTEGER,"
        " preemptions INTEGER NOT NULL DEFAULT 0, message TEXT);"
        "CREATE TABLE job_events("
        " job_id INTEGER NOT NULL, time REAL NOT NULL, state TEXT NOT NULL, message TEXT);"
        "INSERT INTO jobs(owner_uid, owner, command, gpus, mem, priority, type, time_limit,"
        " state, submit_time, exit_code) VALUES(1000, 'ann', '[\"sleep\",\"1\"]', 3, 0, 50, 0,"
        " 0, 0, 1700000000, -1);";
    assert_int_equal(sqlite3_exec(db, v1, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);

    gpcd_store *store;
    TEST_OK(gpcd_store_open(path, &store));
    gpcd_job *old;
    TEST_OK(gpcd_store_get(store, 1, &old));
    assert_int_equal(old->gpus, 3);
    assert_int_equal(old->gpus_min, 0);
    assert_int_equal(old->gpus_max, 0);
    assert_false(gpcd_job_elastic(old));
    assert_int_equal(gpcd_job_min_gpus(old), 3);
    assert_string_equal(old->owner, "ann");
    char version[16];
    TEST_OK(gpcd_store_meta_get(store, "schema_version", version, sizeof version));
    assert_string_equal(version, "2");
    gpcd_job_free(old);

    gpcd_job *e = gpcd_job_new();
    e->command = strdup("[\"train\"]");
    e->owner = strdup("bob");
    e->gpus = 4;
    e->gpus_min = 1;
    e->gpus_max = 4;
    e->submit_time = 1.7e9;
    TEST_OK(gpcd_store_submit(store, e));
    assert_int_equal(e->id, 2);
    e->state = GPCD_RUNNING; /* started at 2 of its 1-4 */
    e->gpus = 2;
    e->assigned_count = 2;
    e->assigned[0] = 5;
    e->assigned[1] = 6;
    TEST_OK(gpcd_store_update(store, e));
    gpcd_store_close(store);
    TEST_OK(gpcd_store_open(path, &store)); /* a second open: nothing left to migrate */
    gpcd_job *back;
    TEST_OK(gpcd_store_get(store, 2, &back));
    assert_true(gpcd_job_elastic(back));
    assert_int_equal(back->gpus, 2);
    assert_int_equal(back->gpus_min, 1);
    assert_int_equal(back->gpus_max, 4);
    assert_int_equal(back->assigned_count, 2);
    gpcd_job_free(back);
    gpcd_job_free(e);
    TEST_OK(gpcd_store_meta_set(store, "schema_version", "3"));
    gpcd_store_close(store);
    TEST_FAILS(gpcd_store_open(path, &store), GPC_ERR_FORMAT, "schema version 3");
    test_rmtree(dir);
    gpc_free(dir);
}

static void test_config(void **state) {
    (void)state;
    gpcd_config c;
    gpcd_config_defaults(&c);
    assert_string_equal(c.state_dir, "/var/lib/gpcd");
    assert_string_equal(c.gpus, "nvml");
    assert_int_equal(c.socket_mode, 0600);
    assert_true(c.alert_util_below == 70 && c.alert_util_window == 60);
    assert_true(c.alert_mem_above == 90 && c.alert_temp_above == 85 &&
                c.alert_slowdown_margin == 5);
    assert_true(c.preempt_grace == 30 && c.sample_retention == 86400);
    /* keep_finished: 0 (forever) by default, or a duration; nothing else */
    assert_true(c.keep_finished == 0);
    TEST_OK(gpcd_config_set(&c, "keep_finished", "30d"));
    assert_true(c.keep_finished == 30 * 86400);
    TEST_FAILS(gpcd_config_set(&c, "keep_finished", "-1d"), GPC_ERR_INVALID_ARG, "keep_finished");
    TEST_FAILS(gpcd_config_set(&c, "keep_finished", "0s"), GPC_ERR_INVALID_ARG, "above 0");
    TEST_OK(gpcd_config_set(&c, "keep_finished", "0"));
    assert_true(c.keep_finished == 0);
    assert_true(c.policy.small_job_mem == 24ull << 30);
    TEST_OK(gpcd_config_finish(&c));
    assert_string_equal(c.socket, "/var/lib/gpcd/gpcd.sock");
    assert_int_equal(c.policy.flags, GPCD_POLICY_ALL);

    char *dir = test_tmpdir("config");
    char path[4200];
    snprintf(path, sizeof path, "%s/gpcd.conf", dir);
    FILE *f = fopen(path, "w");
    fprintf(f,
            "[gpcd]\nstate_dir = %s\ngpus = simulated:4x80GB\npolicies = priority, backfill\n"
            "[alerts]\nalert_util_window = 2m\nsocket_mode = 0666\ndata_numa = /d=1\n",
            dir);
    fclose(f);
    gpcd_config_defaults(&c);
    TEST_OK(gpcd_config_load(&c, path));
    TEST_OK(gpcd_config_finish(&c));
    assert_string_equal(c.gpus, "simulated:4x80GB");
    assert_true(c.alert_util_window == 120);
    assert_int_equal(c.socket_mode, 0666);
    assert_int_equal(c.policy.flags, GPCD_POLICY_PRIORITY | GPCD_POLICY_BACKFILL);
    assert_int_equal(c.policy.numa_rule_count, 1);
    assert_int_equal(c.policy.numa_rules[0].node, 1);

    f = fopen(path, "w");
    fprintf(f, "gpus = nvml\n\nunknown_key = 3\n");
    fclose(f);
    gpcd_config_defaults(&c);
    TEST_FAILS(gpcd_config_load(&c, path), GPC_ERR_INVALID_ARG, "line 3: unknown option");
    f = fopen(path, "w");
    fprintf(f, "preempt_grace = soon\n");
    fclose(f);
    TEST_FAILS(gpcd_config_load(&c, path), GPC_ERR_INVALID_ARG, "line 1: preempt_grace");
    f = fopen(path, "w");
    fprintf(f, "this line has no equals sign\n");
    fclose(f);
    TEST_FAILS(gpcd_config_load(&c, path), GPC_ERR_INVALID_ARG, "line 1");
    TEST_FAILS(gpcd_config_load(&c, "/nonexistent/gpcd.conf"), GPC_ERR_IO, "cannot read");
    gpcd_config_defaults(&c);
    TEST_FAILS(gpcd_config_set(&c, "socket_mode", "0999"), GPC_ERR_INVALID_ARG, "octal");
    TEST_OK(gpcd_config_set(&c, "policies", "fastest"));
    TEST_FAILS(gpcd_config_finish(&c), GPC_ERR_INVALID_ARG, "unknown policy 'fastest'");
    gpcd_config_defaults(&c);
    TEST_OK(gpcd_config_set(&c, "listen", "127.0.0.1:8642"));
    TEST_FAILS(gpcd_config_finish(&c), GPC_ERR_INVALID_ARG, "needs token_file");

    /* every option is documented, in the Markdown too */
    int n;
    const gpcd_option_doc *docs = gpcd_config_options(&n);
    char *md = NULL;
    size_t md_size = 0;
    FILE *m = open_memstream(&md, &md_size);
    gpcd_config_write_markdown(m);
    fclose(m);
    for (int i = 0; i < n; i++) {
        assert_true(strlen(docs[i].doc) > 10);
        char key[80];
        snprintf(key, sizeof key, "| `%s` |", docs[i].key);
        assert_non_null(strstr(md, key));
        /* every default parses */
        gpcd_config_defaults(&c);
        TEST_OK(gpcd_config_set(&c, docs[i].key, docs[i].default_value));
    }
    free(md);
    test_rmtree(dir);
    gpc_free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jobs_round_trip),         cmocka_unit_test(test_list_recent),
        cmocka_unit_test(test_group_commit_concurrent), cmocka_unit_test(test_samples_and_alerts),
        cmocka_unit_test(test_store_open_errors),       cmocka_unit_test(test_config),
        cmocka_unit_test(test_store_migration),         cmocka_unit_test(test_prune_finished),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
