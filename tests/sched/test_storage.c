/*
 * test_storage.c: gpcd when the disk is the problem. A job printing
 * endlessly keeps a log of at most log_max (its first half and its latest
 * output) while other users' jobs run; and a database that refuses writes
 * (a full disk, simulated) is a state with an alert: no job starts, nothing
 * finished is forgotten or reported two ways, and everything is saved and
 * started once the writes go through again.
 */
#include "sched_testutil.h"

#include <sys/stat.h>
#include <sys/wait.h>

#include "sched/sched_internal.h"

static void start(test_gpcd *g, const char *gpus) {
    memset(g, 0, sizeof *g);
    g->dir = test_tmpdir("storage");
    test_gpcd_config(g, g->dir, gpus);
    TEST_OK(gpcd_config_set(&g->config, "log_max", "1M"));
    test_gpcd_start(g);
}

static void finish(test_gpcd *g) {
    test_gpcd_stop(g);
    test_rmtree(g->dir);
    gpc_free(g->dir);
}

static char *log_file(test_gpcd *g, int64_t id, size_t *len) {
    char path[4300];
    snprintf(path, sizeof path, "%s/jobs/%lld.log", g->dir, (long long)id);
    char *text = NULL;
    TEST_OK(gpc_read_file(path, &text, len));
    return text;
}

/* 40 MB of numbered lines against a 1 MiB cap: the log holds the first
 * lines, the cut notice and the last lines in order, and a small job of
 * another user runs meanwhile with its log whole. */
static void test_log_cap(void **state) {
    (void)state;
    test_gpcd g;
    start(&g, "simulated:2x80GB");
    int64_t flood =
        test_submit(g.socket, "{\"command\":[\"sh\",\"-c\",\"seq 1 5000000; echo last-line\"]}");
    int64_t small = test_submit(g.socket, "{\"command\":[\"echo\",\"small job\"]}");
    json_decref(test_wait_state(g.socket, small, "completed", 10));
    json_decref(test_wait_state(g.socket, flood, "completed", 60));
    size_t len;
    char *small_log = log_file(&g, small, &len);
    assert_string_equal(small_log, "small job\n");
    gpc_free(small_log);
    char *text = log_file(&g, flood, &len);
    assert_true(len <= (1u << 20));
    assert_true(len > (1u << 19));
    assert_memory_equal(text, "1\n2\n3\n", 6);
    size_t at = 0;
    while (at < len && strncmp(text + at, "[gpcd: output cut here", 22) != 0)
        at++;
    assert_true(at >= (1u << 19) - 1 && at <= (1u << 19) + 1);
    static const char end[] = "4999999\n5000000\nlast-line\n";
    assert_true(len > sizeof end && strcmp(text + len - (sizeof end - 1), end) == 0);
    /* after the notice the lines run on in order: each one more than the
     * last (the first may be cut mid-number, so counting starts after it) */
    while (text[at] != '\n')
        at++;
    at++;
    while (text[at] != '\n')
        at++; /* the partial line */
    at++;
    long previous = strtol(text + at, NULL, 10);
    int checked = 0;
    for (;;) {
        while (text[at] != '\n')
            at++;
        at++;
        if (text[at] == 'l' || text[at] == '\0') break;
        long v = strtol(text + at, NULL, 10);
        if (v != previous + 1) fail_msg("line %ld follows %ld after the cut", v, previous);
        previous = v;
        checked++;
    }
    assert_true(checked > 10000);
    assert_int_equal(previous, 5000000);
    /* a follower whose offset the cut left past the end goes on from the
     * latest output */
    char path[64];
    snprintf(path, sizeof path, "/jobs/%lld/logs?offset=%d", (long long)flood, 2 << 20);
    gpcd_response r;
    TEST_OK(gpcd_client_request(g.socket, "GET", path, NULL, &r));
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, 65536);
    assert_memory_equal(r.body, text + len - 65536, 65536);
    assert_int_equal(strtoll(r.next_offset, NULL, 10), (long long)len);
    gpcd_response_free(&r);
    gpc_free(text);
    finish(&g);
}

/* A job preempted with its log past half the cap (or the cap lowered since)
 * runs again: its log keeps the first half, the cut line and the new
 * output, and stays under the cap. */
static void test_log_cap_on_rerun(void **state) {
    (void)state;
    char *dir = test_tmpdir("storage");
    char log[4300], exit_file[4300], record[4300];
    snprintf(log, sizeof log, "%s/7.log", dir);
    snprintf(exit_file, sizeof exit_file, "%s/7.exit", dir);
    snprintf(record, sizeof record, "%s/7.1.run", dir);
    FILE *f = fopen(log, "w");
    for (int i = 0; i < 300000; i++) /* 2.1 MB of "earlier\n" lines */
        fputs("earlier\n", f);
    fclose(f);
    gpcd_job *job = gpcd_job_new();
    job->id = 7;
    job->preemptions = 1;
    job->command = strdup("[\"echo\",\"rerun\"]");
    job->cwd = strdup("/");
    job->env = strdup("{}");
    TEST_OK(gpcd_runner_start(job, log, exit_file, record, 1u << 20));
    int status;
    waitpid(job->pid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char *text = NULL;
    size_t len;
    TEST_OK(gpc_read_file(log, &text, &len));
    assert_true(len <= (1u << 20));
    assert_memory_equal(text, "earlier\nearlier\n", 16);
    assert_int_equal(strncmp(text + (1 << 19), "\n[gpcd: output cut here", 23), 0);
    assert_string_equal(text + len - 6, "rerun\n");
    gpc_free(text);
    gpcd_job_free(job);
    test_rmtree(dir);
    gpc_free(dir);
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static int storage_alerts(test_gpcd *g) {
    int status, n = 0;
    json_t *j = test_request(g->socket, "GET", "/alerts", NULL, &status);
    json_t *alerts = json_object_get(j, "alerts");
    for (size_t i = 0; i < json_array_size(alerts); i++) {
        json_t *a = json_array_get(alerts, i);
        if (strcmp(json_string_value(json_object_get(a, "kind")), "storage") == 0) {
            assert_int_equal(json_integer_value(json_object_get(a, "gpu")), -1);
            n++;
        }
    }
    json_decref(j);
    return n;
}

static void test_disk_full(void **state) {
    (void)state;
    test_gpcd g;
    start(&g, "simulated:1x80GB");
    char body[9000], go[4200], runs[4200];
    snprintf(go, sizeof go, "%s/go", g.dir);
    snprintf(runs, sizeof runs, "%s/runs", g.dir);
    snprintf(body, sizeof body,
             "{\"command\":[\"sh\",\"-c\",\"while [ ! -e %s ]; do sleep 0.02; done\"]}", go);
    int64_t blocker = test_submit(g.socket, body);
    json_decref(test_wait_state(g.socket, blocker, "running", 5));
    snprintf(body, sizeof body, "{\"command\":[\"sh\",\"-c\",\"echo ran >> %s\"]}", runs);
    int64_t waiting = test_submit(g.socket, body);

    gpcd_store_simulate_full(g.daemon->store, 1);
    FILE *f = fopen(go, "w"); /* the blocker ends: its end cannot be saved */
    fclose(f);
    json_t *j = test_wait_state(g.socket, blocker, "completed", 5);
    assert_non_null(strstr(json_string_value(json_object_get(j, "message")), "not saved yet"));
    json_decref(j);
    assert_int_equal(storage_alerts(&g), 1);
    /* the list shows the end the database has not taken, as GET /jobs/ID does */
    int status;
    json_t *all = test_request(g.socket, "GET", "/jobs?all=1", "", &status);
    assert_int_equal(status, 200);
    json_t *listed = NULL, *one;
    size_t k;
    json_array_foreach(json_object_get(all, "jobs"), k, one) {
        if (json_integer_value(json_object_get(one, "id")) == blocker) listed = one;
    }
    assert_non_null(listed);
    assert_string_equal(json_string_value(json_object_get(listed, "state")), "completed");
    assert_non_null(strstr(json_string_value(json_object_get(listed, "message")), "not saved yet"));
    json_decref(all);
    /* its end is known and said the same way everywhere */
    char path[64];
    snprintf(path, sizeof path, "/jobs/%lld/cancel", (long long)blocker);
    test_request_fails(g.socket, "POST", path, "", 409, "has already ended (completed)");
    /* the GPU is free, but the waiting job's start could not be saved: it waits */
    usleep(600 * 1000);
    assert_false(file_exists(runs));
    j = test_job(g.socket, waiting);
    assert_string_equal(json_string_value(json_object_get(j, "state")), "queued");
    json_decref(j);
    test_request_fails(g.socket, "POST", "/jobs", "{\"command\":[\"true\"]}", 507,
                       "cannot save new jobs");

    gpcd_store_simulate_full(g.daemon->store, 0);
    json_decref(test_wait_state(g.socket, waiting, "completed", 10));
    assert_int_equal(storage_alerts(&g), 0);
    gpcd_job *saved;
    TEST_OK(gpcd_store_get(g.daemon->store, blocker, &saved));
    assert_int_equal(saved->state, GPCD_COMPLETED);
    gpcd_job_free(saved);
    char *text = NULL;
    size_t len;
    TEST_OK(gpc_read_file(runs, &text, &len));
    assert_string_equal(text, "ran\n");
    gpc_free(text);
    finish(&g);
}

/* keep_finished = 1s: a job that ended goes, with its log and exit file,
 * and then reads as gone with the reason; a job still running stays, and
 * goes a second after it ends in turn. */
static void test_keep_finished(void **state) {
    (void)state;
    test_gpcd g;
    memset(&g, 0, sizeof g);
    g.dir = test_tmpdir("keep");
    test_gpcd_config(&g, g.dir, "simulated:2x80GB");
    TEST_OK(gpcd_config_set(&g.config, "keep_finished", "1s"));
    test_gpcd_start(&g);
    char body[9000], go[4200], log[4300], exit_file[4300];
    snprintf(go, sizeof go, "%s/go", g.dir);
    snprintf(body, sizeof body,
             "{\"command\":[\"sh\",\"-c\",\"echo waiting; while [ ! -e %s ]; do sleep 0.02; "
             "done\"]}",
             go);
    int64_t running = test_submit(g.socket, body);
    int64_t quick = test_submit(g.socket, "{\"command\":[\"sh\",\"-c\",\"echo done\"]}");
    json_decref(test_wait_state(g.socket, quick, "completed", 10));
    snprintf(log, sizeof log, "%s/jobs/%lld.log", g.dir, (long long)quick);
    snprintf(exit_file, sizeof exit_file, "%s/jobs/%lld.exit", g.dir, (long long)quick);
    char path[64];
    snprintf(path, sizeof path, "/jobs/%lld", (long long)quick);
    double end = gpc_time_seconds() + 10;
    for (;;) { /* gone within about two seconds of its end */
        int status;
        json_t *j = test_request(g.socket, "GET", path, "", &status);
        json_decref(j);
        if (status == 404) break;
        if (gpc_time_seconds() > end)
            fail_msg("job %lld is still there after 10 s", (long long)quick);
        usleep(50000);
    }
    test_request_fails(g.socket, "GET", path, "", 404,
                       "gpcd removes jobs 1s after they end: keep_finished");
    snprintf(path, sizeof path, "/jobs/%lld/logs", (long long)quick);
    test_request_fails(g.socket, "GET", path, "", 404, "keep_finished");
    assert_false(file_exists(log));
    assert_false(file_exists(exit_file));
    /* the running job is untouched, its log too */
    json_t *j = test_job(g.socket, running);
    assert_string_equal(json_string_value(json_object_get(j, "state")), "running");
    json_decref(j);
    snprintf(log, sizeof log, "%s/jobs/%lld.log", g.dir, (long long)running);
    assert_true(file_exists(log));
    FILE *f = fopen(go, "w");
    fclose(f);
    json_decref(test_wait_state(g.socket, running, "completed", 10));
    end = gpc_time_seconds() + 10;
    while (file_exists(log) && gpc_time_seconds() < end)
        usleep(50000);
    assert_false(file_exists(log));
    int status; /* both gone from the list of every job */
    json_t *all = test_request(g.socket, "GET", "/jobs?all=1", "", &status);
    assert_int_equal(status, 200);
    assert_int_equal(json_array_size(json_object_get(all, "jobs")), 0);
    json_decref(all);
    finish(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_log_cap),
        cmocka_unit_test(test_log_cap_on_rerun),
        cmocka_unit_test(test_disk_full),
        cmocka_unit_test(test_keep_finished),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
