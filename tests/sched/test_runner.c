/*
 * test_runner.c: job processes under gpcd: exit status recorded exactly,
 * output and environment (CUDA_VISIBLE_DEVICES, NCCL_NVLS_ENABLE) in the
 * log, time limits enforced with SIGTERM and then SIGKILL, and a gpcd
 * restart that re-attaches to a running job and settles one that ended
 * while gpcd was down; and recovery of jobs gpcd was starting when it died,
 * decided from each attempt's record and exit file, never by guessing;
 * job ids that never repeat, even when the database is lost, and logs that
 * are never appended to by a job they do not belong to; and processes that
 * leave a job's process group (setsid, double fork) stopped with it, by
 * its cgroup where there is one and by the supervisor's subreaper walk
 * where not.
 */
#include "sched_testutil.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char *read_log(test_gpcd *g, int64_t id) {
    char path[128];
    snprintf(path, sizeof path, "/jobs/%lld/logs", (long long)id);
    gpcd_response r;
    TEST_OK(gpcd_client_request(g->socket, "GET", path, NULL, &r));
    assert_int_equal(r.status, 200);
    return r.body;
}

/* Creates an empty file: the flag a test job waits for. */
static void touch(const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) fail_msg("cannot create %s", path);
    fclose(f);
}

static void start(test_gpcd *g, const char *gpus);

/* 1 while pid runs. A zombie has ended: without gpcd nobody reaps it (and
 * the container's init may not either). */
static int process_running(pid_t pid) {
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char *got = fgets(line, sizeof line, f);
    fclose(f);
    char *paren = got ? strrchr(line, ')') : NULL;
    return paren && paren[1] == ' ' && paren[2] != 'Z' && paren[2] != 'X';
}

/* The pid of a running job: "running" is recorded just before the fork, so
 * the pid may come a moment later. */
static pid_t wait_pid(test_gpcd *g, int64_t id) {
    double end = gpc_time_seconds() + 5;
    for (;;) {
        json_t *j = test_job(g->socket, id);
        const char *state = json_string_value(json_object_get(j, "state"));
        json_int_t pid = json_integer_value(json_object_get(j, "pid"));
        int running = state && strcmp(state, "running") == 0;
        json_decref(j);
        if (running && pid > 0) return (pid_t)pid;
        if (gpc_time_seconds() > end)
            fail_msg("job %lld never showed a running pid", (long long)id);
        usleep(20000);
    }
}

static void start(test_gpcd *g, const char *gpus) {
    memset(g, 0, sizeof *g);
    g->dir = test_tmpdir("runner");
    test_gpcd_config(g, g->dir, gpus);
    test_gpcd_start(g);
}

static void finish(test_gpcd *g) {
    test_gpcd_stop(g);
    test_rmtree(g->dir);
    gpc_free(g->dir);
}

static void test_exit_status_and_logs(void **state) {
    (void)state;
    test_gpcd g;
    start(&g, "simulated:4x80GB");
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 51);
    int code = 1 + (int)gpc_rng_below(&rng, 120);
    unsigned token = gpc_rng_u32(&rng);
    char body[512];
    snprintf(body, sizeof body,
             "{\"command\":[\"sh\",\"-c\",\"echo token=%u; echo cvd=$CUDA_VISIBLE_DEVICES; "
             "echo nvls=$NCCL_NVLS_ENABLE; echo id=$GPC_JOB_ID; echo home=$MY_VAR; pwd; exit "
             "%d\"],\"gpus\":3,\"env\":{\"MY_VAR\":\"v%u\",\"CUDA_VISIBLE_DEVICES\":\"9\"},"
             "\"cwd\":\"/tmp\"}",
             token, code, token);
    int64_t id = test_submit(g.socket, body);
    json_t *j = test_wait_state(g.socket, id, "failed", 5);
    assert_int_equal(json_integer_value(json_object_get(j, "exit_code")), code);
    assert_true(json_is_null(json_object_get(j, "signal")));
    char message[64];
    snprintf(message, sizeof message, "exited with status %d", code);
    assert_non_null(strstr(json_string_value(json_object_get(j, "message")), message));
    json_decref(j);
    /* which GPUs it had: the last "running" event is gone now, so read the
     * log and check the three listed are distinct valid indices */
    char *log = read_log(&g, id);
    char want[256];
    snprintf(want, sizeof want, "token=%u\n", token);
    assert_non_null(strstr(log, want));
    int a, b, c;
    const char *cvd = strstr(log, "cvd=");
    assert_non_null(cvd);
    assert_int_equal(sscanf(cvd, "cvd=%d,%d,%d", &a, &b, &c), 3);
    assert_true(a != b && b != c && a != c && a >= 0 && b >= 0 && c >= 0 && a < 4 && b < 4 &&
                c < 4);
    assert_non_null(strstr(log, "nvls=0\n"));
    snprintf(want, sizeof want, "id=%lld\nhome=v%u\n/tmp\n", (long long)id, token);
    assert_non_null(strstr(log, want));
    free(log);

    /* success is completed with exit code 0 */
    id = test_submit(g.socket, "{\"command\":[\"true\"]}");
    j = test_wait_state(g.socket, id, "completed", 5);
    assert_int_equal(json_integer_value(json_object_get(j, "exit_code")), 0);
    json_decref(j);
    /* a command that does not exist: 127 and a message in the log */
    id = test_submit(g.socket, "{\"command\":[\"/no/such/program\"]}");
    j = test_wait_state(g.socket, id, "failed", 5);
    assert_int_equal(json_integer_value(json_object_get(j, "exit_code")), 127);
    json_decref(j);
    log = read_log(&g, id);
    assert_non_null(strstr(log, "gpcd: cannot run '/no/such/program': No such file"));
    free(log);
    /* a directory that does not exist: 126 */
    id = test_submit(g.socket, "{\"command\":[\"true\"],\"cwd\":\"/no/such/dir\"}");
    j = test_wait_state(g.socket, id, "failed", 5);
    assert_int_equal(json_integer_value(json_object_get(j, "exit_code")), 126);
    json_decref(j);
    log = read_log(&g, id);
    assert_non_null(strstr(log, "cannot enter the job's directory /no/such/dir"));
    free(log);

    /* --mem becomes the job's GPC_DEVICE_MEMORY_LIMIT (gpc's own cap on
     * what it takes from a GPU), unless the job's environment sets one */
    uint64_t mem = (uint64_t)(1 + gpc_rng_below(&rng, 40)) << 30;
    const char *print = "\"command\":[\"sh\",\"-c\",\"echo lim=$GPC_DEVICE_MEMORY_LIMIT.\"]";
    const char *bodies[3][2] = {
        {"", ""}, {"", ",\"env\":{\"GPC_DEVICE_MEMORY_LIMIT\":\"7G\"}"}, {"none", ""}};
    for (int c = 0; c < 3; c++) {
        char mem_field[48] = "";
        if (strcmp(bodies[c][0], "none") != 0)
            snprintf(mem_field, sizeof mem_field, ",\"mem\":%llu", (unsigned long long)mem);
        snprintf(body, sizeof body, "{%s%s%s}", print, mem_field, bodies[c][1]);
        id = test_submit(g.socket, body);
        json_decref(test_wait_state(g.socket, id, "completed", 5));
        log = read_log(&g, id);
        if (c == 0)
            snprintf(want, sizeof want, "lim=%llu.\n", (unsigned long long)mem);
        else
            snprintf(want, sizeof want, c == 1 ? "lim=7G.\n" : "lim=.\n");
        if (!strstr(log, want)) fail_msg("job %d: expected %s in its log: %s", c, want, log);
        free(log);
    }
    finish(&g);
}

static void test_time_limits(void **state) {
    (void)state;
    test_gpcd g;
    start(&g, "simulated:2x80GB");
    /* a job that stops on SIGTERM: ends by SIGTERM soon after 0.4 s */
    double t0 = gpc_wall_seconds();
    int64_t polite = test_submit(g.socket, "{\"command\":[\"sleep\",\"30\"],\"time_limit\":0.4}");
    /* one that ignores SIGTERM gets SIGKILL after kill_grace (0.5 s) */
    int64_t stubborn = test_submit(
        g.socket, "{\"command\":[\"sh\",\"-c\",\"trap '' TERM; sleep 30 & wait; sleep 30\"],"
                  "\"time_limit\":0.4}");
    json_t *j = test_wait_state(g.socket, polite, "failed", 5);
    assert_int_equal(json_integer_value(json_object_get(j, "signal")), SIGTERM);
    assert_non_null(strstr(json_string_value(json_object_get(j, "message")), "time limit"));
    double ran = json_number_value(json_object_get(j, "end_time")) -
                 json_number_value(json_object_get(j, "start_time"));
    assert_true(ran >= 0.4 && ran < 2.0);
    json_decref(j);
    j = test_wait_state(g.socket, stubborn, "failed", 5);
    assert_int_equal(json_integer_value(json_object_get(j, "signal")), SIGKILL);
    ran = json_number_value(json_object_get(j, "end_time")) -
          json_number_value(json_object_get(j, "start_time"));
    assert_true(ran >= 0.9 && ran < 3.0); /* 0.4 s limit + 0.5 s grace */
    json_decref(j);
    assert_true(gpc_wall_seconds() - t0 < 5);
    finish(&g);
}

static void test_reattach_after_restart(void **state) {
    (void)state;
    test_gpcd g;
    start(&g, "simulated:2x80GB");
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 52);
    int code = 2 + (int)gpc_rng_below(&rng, 100);
    /* A: still running when gpcd comes back; B: ends while gpcd is down.
     * Each waits for a flag file the test creates, so the order of events
     * does not depend on how fast a loaded machine runs the test. */
    char body[9000], a_go[4200], b_go[4200];
    snprintf(a_go, sizeof a_go, "%s/a-go", g.dir);
    snprintf(b_go, sizeof b_go, "%s/b-go", g.dir);
    snprintf(body, sizeof body,
             "{\"command\":[\"sh\",\"-c\",\"echo a-start; while [ ! -e %s ]; do sleep 0.02; "
             "done; echo a-end; exit %d\"]}",
             a_go, code);
    int64_t a = test_submit(g.socket, body);
    snprintf(body, sizeof body,
             "{\"command\":[\"sh\",\"-c\",\"while [ ! -e %s ]; do sleep 0.02; done; exit 5\"]}",
             b_go);
    int64_t b = test_submit(g.socket, body);
    pid_t pid_a = wait_pid(&g, a), pid_b = wait_pid(&g, b);
    json_t *ja, *jb;
    test_gpcd_stop(&g); /* gpcd goes away; the jobs do not */
    assert_true(kill(pid_a, 0) == 0);
    touch(b_go); /* B ends meanwhile */
    for (double end = gpc_time_seconds() + 5; process_running(pid_b);) {
        if (gpc_time_seconds() > end) fail_msg("job B (pid %d) did not end", (int)pid_b);
        usleep(20000);
    }
    test_gpcd_start(&g);
    ja = test_job(g.socket, a);
    assert_string_equal(json_string_value(json_object_get(ja, "state")), "running");
    assert_int_equal(json_integer_value(json_object_get(ja, "pid")), pid_a);
    json_decref(ja);
    jb = test_wait_state(g.socket, b, "failed", 5);
    assert_int_equal(json_integer_value(json_object_get(jb, "exit_code")), 5);
    assert_non_null(
        strstr(json_string_value(json_object_get(jb, "message")), "finished while gpcd was down"));
    json_decref(jb);
    /* A's GPU stays taken: a 2-GPU job must wait for it */
    int64_t both = test_submit(g.socket, "{\"command\":[\"true\"],\"gpus\":2}");
    usleep(200 * 1000);
    json_t *jw = test_job(g.socket, both);
    assert_string_equal(json_string_value(json_object_get(jw, "state")), "queued");
    json_decref(jw);
    touch(a_go);
    ja = test_wait_state(g.socket, a, "failed", 5);
    assert_int_equal(json_integer_value(json_object_get(ja, "exit_code")), code);
    json_decref(ja);
    char *log = read_log(&g, a);
    assert_string_equal(log, "a-start\na-end\n");
    free(log);
    json_decref(test_wait_state(g.socket, both, "completed", 5));
    finish(&g);
}

static void test_process_start_time(void **state) {
    (void)state;
    /* our own start time is nonzero and stable; a dead pid has none */
    uint64_t mine = gpcd_process_start_time(getpid());
    assert_true(mine > 0);
    assert_true(gpcd_process_start_time(getpid()) == mine);
    pid_t child = fork();
    if (child == 0) _exit(0);
    int status;
    waitpid(child, &status, 0);
    assert_true(gpcd_process_start_time(child) == 0);
    gpcd_job job;
    memset(&job, 0, sizeof job);
    job.pid = getpid();
    job.pid_start = mine + 1; /* a reused pid: same number, other start */
    assert_int_equal(gpcd_runner_alive(&job), 0);
    job.pid_start = mine;
    assert_int_equal(gpcd_runner_alive(&job), 1);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0) fail_msg("cannot write %s", path);
    fclose(f);
}

/* A job saved as "starting" (running, no pid yet), as gpcd leaves it when it
 * dies between saving that and learning the supervisor's pid. */
static int64_t starting_job(gpcd_store *store, const char *command, double start_time) {
    gpcd_job *job = gpcd_job_new();
    job->command = strdup(command);
    job->cwd = strdup("/");
    job->env = strdup("{}");
    job->gpus = 1;
    job->submit_time = start_time - 1;
    TEST_OK(gpcd_store_submit(store, job));
    job->state = GPCD_RUNNING;
    job->start_time = start_time;
    job->assigned[0] = (int)(job->id - 1);
    job->assigned_count = 1;
    job->message = strdup("starting");
    TEST_OK(gpcd_store_update(store, job));
    int64_t id = job->id;
    gpcd_job_free(job);
    return id;
}

/* gpcd killed while starting jobs: A never got to run its command (no
 * record) and runs once after the restart; B ran and ended while gpcd was
 * down (record and exit file): completed, not "submit it again"; C still
 * runs (record of a live process): re-attached, its GPU kept. */
static void test_recover_while_starting(void **state) {
    (void)state;
    test_gpcd g;
    memset(&g, 0, sizeof g);
    g.dir = test_tmpdir("runner");
    char path[4300], jobs[4200], command[8800];
    snprintf(jobs, sizeof jobs, "%s/jobs", g.dir);
    TEST_OK(gpc_mkdir_p(jobs));
    snprintf(path, sizeof path, "%s/gpcd.db", g.dir);
    gpcd_store *store;
    TEST_OK(gpcd_store_open(path, &store));
    snprintf(command, sizeof command, "[\"sh\",\"-c\",\"echo ran >> %s/a-runs\"]", g.dir);
    int64_t a = starting_job(store, command, 1000.5);
    int64_t b = starting_job(store, "[\"true\"]", 2000.25);
    int64_t c = starting_job(store, "[\"true\"]", 3000.125);
    gpcd_store_close(store);
    /* B: its supervisor claimed the start, the command ended with 0 */
    snprintf(path, sizeof path, "%s/%lld.2000250.run", jobs, (long long)b);
    write_text(path, "999999999 12345 999999999\n");
    snprintf(path, sizeof path, "%s/%lld.exit", jobs, (long long)b);
    write_text(path, "exit 0\n");
    /* C: a live process stands for its supervisor */
    pid_t live = fork();
    if (live == 0) {
        setpgid(0, 0);
        for (;;)
            pause();
    }
    uint64_t live_start = 0;
    for (int i = 0; i < 100 && !live_start; i++, usleep(10000))
        live_start = gpcd_process_start_time(live);
    char record[128];
    snprintf(record, sizeof record, "%d %llu %d\n", (int)live, (unsigned long long)live_start,
             (int)live);
    snprintf(path, sizeof path, "%s/%lld.3000125.run", jobs, (long long)c);
    write_text(path, record);

    test_gpcd_config(&g, g.dir, "simulated:4x80GB");
    test_gpcd_start(&g);
    json_t *jc = test_job(g.socket, c);
    assert_string_equal(json_string_value(json_object_get(jc, "state")), "running");
    assert_int_equal(json_integer_value(json_object_get(jc, "pid")), live);
    json_decref(jc);
    json_t *jb = test_wait_state(g.socket, b, "completed", 5);
    assert_non_null(
        strstr(json_string_value(json_object_get(jb, "message")), "finished while gpcd was down"));
    json_decref(jb);
    json_decref(test_wait_state(g.socket, a, "completed", 10));
    char *runs = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/a-runs", g.dir);
    TEST_OK(gpc_read_file(path, &runs, &len));
    assert_string_equal(runs, "ran\n"); /* once */
    gpc_free(runs);
    /* A's abandoned attempt stays claimed, so a late supervisor of it
     * cannot run the command after all */
    snprintf(path, sizeof path, "%s/%lld.1000500.run", jobs, (long long)a);
    gpcd_job probe;
    memset(&probe, 0, sizeof probe);
    assert_int_equal(gpcd_runner_claim(path, &probe), 0);
    assert_int_equal(probe.pid, 0);
    /* C ends: settled from its exit file */
    snprintf(path, sizeof path, "%s/%lld.exit", jobs, (long long)c);
    write_text(path, "exit 3\n");
    kill(live, SIGKILL);
    jc = test_wait_state(g.socket, c, "failed", 5);
    assert_int_equal(json_integer_value(json_object_get(jc, "exit_code")), 3);
    json_decref(jc);
    finish(&g);
}

static void remove_database(const char *dir) {
    const char *names[] = {"gpcd.db", "gpcd.db-wal", "gpcd.db-shm"};
    for (int i = 0; i < 3; i++) {
        char path[4300];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
}

static char *job_log_file(const char *dir, int64_t id) {
    char path[4300];
    snprintf(path, sizeof path, "%s/jobs/%lld.log", dir, (long long)id);
    char *text = NULL;
    size_t len = 0;
    TEST_OK(gpc_read_file(path, &text, &len));
    return text;
}

/* The database is lost (deleted, restored from an old backup): new jobs
 * still get ids no earlier job had, so no one reads another's log; and a
 * job never appends to a log that is there before its first run. */
static void test_ids_never_reused(void **state) {
    (void)state;
    test_gpcd g;
    start(&g, "simulated:2x80GB");
    int64_t first = test_submit(g.socket, "{\"command\":[\"echo\",\"first-job-secret\"]}");
    json_decref(test_wait_state(g.socket, first, "completed", 5));
    test_gpcd_stop(&g);
    remove_database(g.dir);
    test_gpcd_start(&g);
    int64_t second = test_submit(g.socket, "{\"command\":[\"echo\",\"second\"]}");
    assert_true(second > first);
    json_decref(test_wait_state(g.socket, second, "completed", 5));
    char *log = read_log(&g, second);
    assert_string_equal(log, "second\n");
    free(log);
    log = job_log_file(g.dir, first);
    assert_string_equal(log, "first-job-secret\n");
    gpc_free(log);
    /* any file of a job counts, whatever its kind */
    char path[4300];
    snprintf(path, sizeof path, "%s/jobs/%lld.exit", g.dir, (long long)second + 40);
    write_text(path, "exit 0\n");
    test_gpcd_stop(&g);
    remove_database(g.dir);
    test_gpcd_start(&g);
    int64_t third = test_submit(g.socket, "{\"command\":[\"true\"]}");
    assert_true(third > second + 40);
    json_decref(test_wait_state(g.socket, third, "completed", 5));
    /* a log that is there before the job's first run is not its own */
    snprintf(path, sizeof path, "%s/jobs/%lld.log", g.dir, (long long)third + 1);
    write_text(path, "someone else's output\n");
    int64_t fourth = test_submit(g.socket, "{\"command\":[\"echo\",\"fourth\"]}");
    assert_int_equal(fourth, third + 1);
    json_t *j = test_wait_state(g.socket, fourth, "failed", 5);
    assert_non_null(
        strstr(json_string_value(json_object_get(j, "message")), "gpcd never appends to one"));
    json_decref(j);
    log = job_log_file(g.dir, fourth);
    assert_string_equal(log, "someone else's output\n");
    gpc_free(log);
    finish(&g);
}

/* The pid of the process whose command line is "sleep SECONDS", 0 if none. */
static pid_t find_sleep(const char *seconds) {
    DIR *dir = opendir("/proc");
    struct dirent *e;
    pid_t found = 0;
    char want[64];
    size_t want_len = (size_t)snprintf(want, sizeof want, "sleep%c%s", '\0', seconds) + 1;
    while (dir && !found && (e = readdir(dir)) != NULL) {
        char path[300], buf[128];
        snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        if (n == want_len && memcmp(buf, want, want_len) == 0 &&
            process_running((pid_t)atoi(e->d_name)))
            found = (pid_t)atoi(e->d_name);
    }
    if (dir) closedir(dir);
    return found;
}

static void wait_gone(pid_t pid, const char *what) {
    for (double end = gpc_time_seconds() + 5; process_running(pid);) {
        if (gpc_time_seconds() > end) fail_msg("%s (pid %d) outlived its job", what, (int)pid);
        usleep(20000);
    }
}

/* One job that starts a process in a new session (setsid) and one that
 * double-forks, then waits; cancelled, both go. A second job leaves the
 * same two behind when it exits; they go when it ends. */
static void escapes_round(test_gpcd *g, int round) {
    char body[512], a[16], b[16], c[16], d[16];
    snprintf(a, sizeof a, "31%d1", round);
    snprintf(b, sizeof b, "31%d2", round);
    snprintf(c, sizeof c, "31%d3", round);
    snprintf(d, sizeof d, "31%d4", round);
    snprintf(body, sizeof body,
             "{\"command\":[\"sh\",\"-c\",\"setsid sleep %s & (sleep %s &); sleep 60\"]}", a, b);
    int64_t id = test_submit(g->socket, body);
    pid_t pa = 0, pb = 0;
    for (double end = gpc_time_seconds() + 5; !pa || !pb; usleep(20000)) {
        if (gpc_time_seconds() > end) fail_msg("the escaping processes never started");
        pa = find_sleep(a);
        pb = find_sleep(b);
    }
    char path[64];
    snprintf(path, sizeof path, "/jobs/%lld/cancel", (long long)id);
    int status;
    json_decref(test_request(g->socket, "POST", path, "", &status));
    assert_int_equal(status, 202);
    json_decref(test_wait_state(g->socket, id, "cancelled", 5));
    wait_gone(pa, "a setsid process");
    wait_gone(pb, "a double-forked process");

    snprintf(body, sizeof body,
             "{\"command\":[\"sh\",\"-c\",\"setsid sleep %s & (sleep %s &); sleep 0.2\"]}", c, d);
    id = test_submit(g->socket, body);
    pid_t pc = 0, pd = 0;
    for (double end = gpc_time_seconds() + 5; !pc || !pd; usleep(20000)) {
        if (gpc_time_seconds() > end) fail_msg("the escaping processes never started");
        pc = find_sleep(c);
        pd = find_sleep(d);
    }
    json_decref(test_wait_state(g->socket, id, "completed", 5));
    wait_gone(pc, "a setsid process left behind");
    wait_gone(pd, "a double-forked process left behind");
}

static void test_escaped_processes(void **state) {
    (void)state;
    test_gpcd g;
    start(&g, "simulated:2x80GB");
    escapes_round(&g, 1);          /* with a cgroup per job where this machine allows it */
    gpcd_runner_use_cgroups(NULL); /* and the fallback: the subreaper's walk */
    escapes_round(&g, 2);
    finish(&g);
}

/* A process of job id on GPU 0 that is none of the job's descendants (as
 * one left behind by a path gpcd cannot see would be): started by a double
 * fork, so neither this test nor gpcd's in-process supervisor reaps it. */
static pid_t start_stray(const char *dir, int64_t id) {
    char exit_file[4300], env_tag[48];
    snprintf(exit_file, sizeof exit_file, "%s/jobs/%lld.exit", dir, (long long)id);
    snprintf(env_tag, sizeof env_tag, "GPC_JOB_TAG=%016llx",
             (unsigned long long)gpcd_runner_job_tag(exit_file));
    int fds[2];
    if (pipe(fds) != 0) fail_msg("pipe");
    pid_t middle = fork();
    if (middle == 0) {
        pid_t stray = fork();
        if (stray == 0) {
            char env_id[48];
            snprintf(env_id, sizeof env_id, "GPC_JOB_ID=%lld", (long long)id);
            char *envp[] = {env_id, env_tag, "CUDA_VISIBLE_DEVICES=0", "PATH=/usr/bin:/bin", NULL};
            setsid();
            execle("/bin/sleep", "sleep", "3199", (char *)NULL, envp);
            _exit(127);
        }
        if (write(fds[1], &stray, sizeof stray) != (ssize_t)sizeof stray) _exit(1);
        _exit(0);
    }
    pid_t stray = 0;
    if (read(fds[0], &stray, sizeof stray) != (ssize_t)sizeof stray) fail_msg("no stray pid");
    close(fds[0]);
    close(fds[1]);
    waitpid(middle, NULL, 0);
    return stray;
}

/* A job ends while a process of it still holds its GPU: the next job gets
 * the GPU only once that process is gone (gpcd kills it), as the monitor
 * (NVML; here the simulation) shows. The next job checks for itself. */
static void test_gpu_held_until_clear(void **state) {
    (void)state;
    test_gpcd g;
    start(&g, "simulated:1x80GB");
    char body[9000], go[4200];
    snprintf(go, sizeof go, "%s/go", g.dir);
    snprintf(body, sizeof body,
             "{\"command\":[\"sh\",\"-c\",\"while [ ! -e %s ]; do sleep 0.02; done\"]}", go);
    int64_t first = test_submit(g.socket, body);
    json_decref(test_wait_state(g.socket, first, "running", 5));
    pid_t stray = start_stray(g.dir, first);
    for (double end = gpc_time_seconds() + 5; !process_running(stray); usleep(10000))
        if (gpc_time_seconds() > end) fail_msg("the stray process did not start");
    snprintf(body, sizeof body,
             "{\"command\":[\"sh\",\"-c\",\"if [ -e /proc/%d ] && ! grep -q '^State:.*Z' "
             "/proc/%d/status; then echo held; else echo clear; fi\"]}",
             (int)stray, (int)stray);
    int64_t next = test_submit(g.socket, body);
    touch(go);
    json_decref(test_wait_state(g.socket, first, "completed", 5));
    json_decref(test_wait_state(g.socket, next, "completed", 5));
    char *log = read_log(&g, next);
    assert_string_equal(log, "clear\n");
    free(log);
    assert_false(process_running(stray));
    finish(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exit_status_and_logs),   cmocka_unit_test(test_time_limits),
        cmocka_unit_test(test_reattach_after_restart), cmocka_unit_test(test_process_start_time),
        cmocka_unit_test(test_recover_while_starting), cmocka_unit_test(test_ids_never_reused),
        cmocka_unit_test(test_escaped_processes),      cmocka_unit_test(test_gpu_held_until_clear),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
