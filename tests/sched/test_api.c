/*
 * test_api.c: gpcd's HTTP API end to end, with gpcd running in this process
 * on simulated GPUs: every endpoint with the values it must return, each
 * kind of bad request with its status and message, ownership (403), the
 * TCP listener's token, alerts driven through simulated_file, and
 * preemption of a running job by a higher priority one; slow clients
 * (slowloris) held to their share while others are served.
 */
#include "sched_testutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <sys/stat.h>
#include <sys/wait.h>

#define GIB 1073741824.0

static json_t *get(test_gpcd *g, const char *path) {
    int status;
    json_t *j = test_request(g->socket, "GET", path, NULL, &status);
    if (status != 200) fail_msg("GET %s: %d", path, status);
    return j;
}

static void test_endpoints(void **state) {
    (void)state;
    test_gpcd g = {0};
    g.dir = test_tmpdir("api");
    test_gpcd_config(&g, g.dir, "simulated:8x141GB");
    test_gpcd_start(&g);

    json_t *s = get(&g, "/status");
    assert_string_equal(json_string_value(json_object_get(s, "provider")), "simulated:8x141GB");
    assert_int_equal(json_array_size(json_object_get(s, "gpus")), 8);
    json_decref(s);
    json_t *gpus = get(&g, "/gpus");
    json_t *list = json_object_get(gpus, "gpus");
    assert_int_equal(json_array_size(list), 8);
    for (size_t i = 0; i < 8; i++) {
        json_t *gpu = json_array_get(list, i);
        assert_int_equal(json_integer_value(json_object_get(gpu, "index")), (json_int_t)i);
        assert_true(json_integer_value(json_object_get(gpu, "memory_total")) ==
                    (json_int_t)(141 * GIB));
        assert_int_equal(json_integer_value(json_object_get(gpu, "numa_node")), i < 4 ? 0 : 1);
    }
    json_decref(gpus);

    /* submit: the id comes back, the job shows what was sent */
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 41);
    unsigned token = gpc_rng_u32(&rng);
    /* the job runs until the test creates DIR/go, so "running" cannot be
     * missed by a slow poll (ASan, a loaded CI machine) */
    char body[4608], go[4200];
    snprintf(go, sizeof go, "%s/go", g.dir);
    snprintf(body, sizeof body,
             "{\"command\":[\"sh\",\"-c\",\"echo out-%u; echo err-%u >&2; "
             "while [ ! -e %s ]; do sleep 0.02; done\"],"
             "\"gpus\":2,\"mem\":\"40G\",\"priority\":\"high\",\"type\":\"train\",\"name\":\"t\"}",
             token, token, go);
    int64_t id = test_submit(g.socket, body);
    assert_int_equal(id, 1);
    json_t *job = test_wait_state(g.socket, id, "running", 5);
    assert_int_equal(json_integer_value(json_object_get(job, "gpus")), 2);
    assert_true(json_integer_value(json_object_get(job, "mem")) == (json_int_t)(40 * GIB));
    assert_int_equal(json_integer_value(json_object_get(job, "priority")), GPCD_PRIORITY_HIGH);
    assert_int_equal(json_array_size(json_object_get(job, "assigned_gpus")), 2);
    assert_int_equal(json_integer_value(json_object_get(job, "owner_uid")), (json_int_t)geteuid());
    json_decref(job);
    FILE *flag = fopen(go, "w");
    assert_non_null(flag);
    fclose(flag);
    job = test_wait_state(g.socket, id, "completed", 5);
    assert_int_equal(json_integer_value(json_object_get(job, "exit_code")), 0);
    json_t *events = json_object_get(job, "events");
    assert_string_equal(json_string_value(json_object_get(json_array_get(events, 0), "state")),
                        "queued");
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(events, json_array_size(events) - 1), "state")),
                        "completed");
    json_decref(job);

    /* logs, whole and from an offset */
    gpcd_response r;
    TEST_OK(gpcd_client_request(g.socket, "GET", "/jobs/1/logs", NULL, &r));
    char want[128];
    snprintf(want, sizeof want, "out-%u\nerr-%u\n", token, token);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, want);
    assert_int_equal(atoi(r.next_offset), (int)strlen(want));
    assert_string_equal(r.job_state, "completed");
    gpcd_response_free(&r);
    TEST_OK(gpcd_client_request(g.socket, "GET", "/jobs/1/logs?offset=4&limit=3", NULL, &r));
    assert_int_equal(r.body_len, 3);
    assert_memory_equal(r.body, want + 4, 3);
    assert_int_equal(atoi(r.next_offset), 7);
    gpcd_response_free(&r);

    /* list: finished jobs only with all=1 */
    json_t *l = get(&g, "/jobs");
    assert_int_equal(json_array_size(json_object_get(l, "jobs")), 0);
    json_decref(l);
    l = get(&g, "/jobs?all=1");
    assert_int_equal(json_array_size(json_object_get(l, "jobs")), 1);
    json_decref(l);
    l = get(&g, "/jobs?state=completed");
    assert_int_equal(json_array_size(json_object_get(l, "jobs")), 1);
    json_decref(l);
    l = get(&g, "/jobs?state=completed&recent=5");
    assert_int_equal(json_array_size(json_object_get(l, "jobs")), 1);
    assert_int_equal(
        json_integer_value(json_object_get(json_array_get(json_object_get(l, "jobs"), 0), "id")),
        1);
    json_decref(l);

    /* cancel a queued job (it cannot run: every GPU taken by a long job) */
    int64_t big = test_submit(g.socket, "{\"command\":[\"sleep\",\"30\"],\"gpus\":8}");
    json_decref(test_wait_state(g.socket, big, "running", 5));
    int64_t waiting = test_submit(g.socket, "{\"command\":[\"true\"],\"gpus\":1}");
    int status;
    char path[64];
    snprintf(path, sizeof path, "/jobs/%lld/cancel", (long long)waiting);
    json_t *c = test_request(g.socket, "POST", path, "", &status);
    assert_int_equal(status, 200);
    assert_string_equal(json_string_value(json_object_get(c, "state")), "cancelled");
    json_decref(c);
    job = test_job(g.socket, waiting);
    assert_string_equal(json_string_value(json_object_get(job, "state")), "cancelled");
    json_decref(job);
    test_request_fails(g.socket, "POST", path, "", 409, "already been cancelled");
    /* cancel the running one: SIGTERM, then cancelled */
    snprintf(path, sizeof path, "/jobs/%lld", (long long)big);
    c = test_request(g.socket, "DELETE", path, NULL, &status);
    assert_int_equal(status, 202);
    json_decref(c);
    job = test_wait_state(g.socket, big, "cancelled", 5);
    assert_int_equal(json_integer_value(json_object_get(job, "signal")), 15);
    json_decref(job);

    /* metrics: the series are there with the values the API reports */
    TEST_OK(gpcd_client_request(g.socket, "GET", "/metrics", NULL, &r));
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "gpcd_up 1\n"));
    assert_non_null(strstr(r.body, "gpcd_gpu_memory_total_bytes{gpu=\"7\"} 151397597184\n"));
    assert_non_null(strstr(r.body, "gpcd_jobs{state=\"completed\"} 1\n"));
    assert_non_null(strstr(r.body, "gpcd_jobs{state=\"cancelled\"} 2\n"));
    assert_non_null(strstr(r.body, "gpcd_jobs_submitted_total 3\n"));
    assert_non_null(strstr(r.body, "# TYPE gpcd_jobs_submitted_total counter\n"));
    gpcd_response_free(&r);

    test_gpcd_stop(&g);
    test_rmtree(g.dir);
    gpc_free(g.dir);
}

static void test_bad_requests(void **state) {
    (void)state;
    test_gpcd g = {0};
    g.dir = test_tmpdir("api");
    test_gpcd_config(&g, g.dir, "simulated:2x80GB");
    TEST_OK(gpcd_config_set(&g.config, "max_body", "4096"));
    /* open to every local user, so another uid can reach it below */
    TEST_OK(gpcd_config_set(&g.config, "socket_mode", "0666"));
    test_gpcd_start(&g);
    test_request_fails(g.socket, "GET", "/nothing", NULL, 404, "no such endpoint");
    test_request_fails(g.socket, "GET", "/jobs/55", NULL, 404, "no job 55");
    test_request_fails(g.socket, "GET", "/jobs/55/logs", NULL, 404, "no job 55");
    test_request_fails(g.socket, "POST", "/jobs/55/cancel", "", 404, "no job 55");
    test_request_fails(g.socket, "PUT", "/jobs", "{}", 405, "GET or POST");
    test_request_fails(g.socket, "POST", "/jobs", "{\"command\":", 400, "not valid JSON");
    test_request_fails(g.socket, "POST", "/jobs", "{\"command\":[\"a\"],\"gpus\":3}", 400,
                       "asks for 3 GPUs; this server has 2");
    test_request_fails(g.socket, "POST", "/jobs", "{\"command\":[\"a\"],\"mem\":\"81G\"}", 400,
                       "largest GPU here has 80.0 GiB");
    test_request_fails(g.socket, "GET", "/jobs?state=bogus", NULL, 400, "unknown job state");
    test_request_fails(g.socket, "GET", "/jobs?recent=0", NULL, 400, "recent must be");
    char *huge = malloc(8192);
    memset(huge, ' ', 8191);
    huge[0] = '{';
    huge[8190] = '}';
    huge[8191] = '\0';
    test_request_fails(g.socket, "POST", "/jobs", huge, 413, "larger than max_body");
    /* a body nested 2,000 deep (4 KB, under max_body) once overflowed the
     * HTTP thread's stack and took gpcd down: refused, and gpcd answers on */
    memset(huge, '[', 4000);
    memcpy(huge, "{\"command\":", 11);
    huge[4000] = '\0';
    test_request_fails(g.socket, "POST", "/jobs", huge, 400, "more than 16 deep");
    free(huge);
    json_decref(get(&g, "/status"));
    /* nothing bad reached the store */
    json_t *l = get(&g, "/jobs?all=1");
    assert_int_equal(json_array_size(json_object_get(l, "jobs")), 0);
    json_decref(l);
    /* an elastic range: its minimum must fit, its maximum ends at the
     * server's GPUs, and it runs on as many as are free */
    test_request_fails(g.socket, "POST", "/jobs", "{\"command\":[\"a\"],\"gpus\":\"3-4\"}", 400,
                       "asks for 3 or more GPUs; this server has 2");
    int64_t e = test_submit(g.socket, "{\"command\":[\"true\"],\"gpus\":\"1-8\"}");
    json_t *ej = test_wait_state(g.socket, e, "completed", 20);
    assert_true(json_is_true(json_object_get(ej, "elastic")));
    assert_int_equal(json_integer_value(json_object_get(ej, "gpus_min")), 1);
    assert_int_equal(json_integer_value(json_object_get(ej, "gpus_max")), 2);
    assert_int_equal(json_integer_value(json_object_get(ej, "gpus")), 2);
    json_decref(ej);

    /* another user may not cancel or read someone else's job */
    if (geteuid() == 0) {
        int64_t id = test_submit(g.socket, "{\"command\":[\"sleep\",\"20\"]}");
        pid_t pid = fork();
        if (pid == 0) {
            if (setgid(65534) != 0 || setuid(65534) != 0) _exit(10);
            char path[64];
            snprintf(path, sizeof path, "/jobs/%lld/cancel", (long long)id);
            gpcd_response r;
            if (gpcd_client_request(g.socket, "POST", path, "", &r) != GPC_OK) _exit(11);
            if (r.status != 403 || !strstr(r.body, "only its owner or root may cancel")) _exit(12);
            snprintf(path, sizeof path, "/jobs/%lld/logs", (long long)id);
            if (gpcd_client_request(g.socket, "GET", path, NULL, &r) != GPC_OK) _exit(13);
            if (r.status != 403) _exit(14);
            _exit(0);
        }
        int status;
        waitpid(pid, &status, 0);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
        char path[64];
        snprintf(path, sizeof path, "/jobs/%lld/cancel", (long long)id);
        int st;
        json_decref(test_request(g.socket, "POST", path, "", &st));
        assert_true(st == 200 || st == 202);
    }
    test_gpcd_stop(&g);
    /* gone: the client says so, naming the socket */
    gpcd_response r;
    TEST_FAILS(gpcd_client_request(g.socket, "GET", "/status", NULL, &r), GPC_ERR_IO,
               "gpcd is not running at");
    test_rmtree(g.dir);
    gpc_free(g.dir);
}

static void test_tcp_token(void **state) {
    (void)state;
    test_gpcd g = {0};
    g.dir = test_tmpdir("api");
    test_gpcd_config(&g, g.dir, "simulated:1x80GB");
    char token_path[4200];
    snprintf(token_path, sizeof token_path, "%s/token", g.dir);
    FILE *f = fopen(token_path, "w");
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 42);
    char token[64];
    snprintf(token, sizeof token, "tok%08x%08x", gpc_rng_u32(&rng), gpc_rng_u32(&rng));
    fprintf(f, "%s\n", token);
    fclose(f);
    /* readable by others (the umask's usual 0644): refused, saying how to fix it */
    assert_int_equal(chmod(token_path, 0644), 0);
    TEST_OK(gpcd_config_set(&g.config, "listen", "127.0.0.1:1"));
    TEST_OK(gpcd_config_set(&g.config, "token_file", token_path));
    gpcd_daemon *refused = NULL;
    TEST_FAILS(gpcd_daemon_create(&g.config, &refused), GPC_ERR_INVALID_ARG,
               "can be read or changed by other users (mode 0644); run chmod 600");
    assert_null(refused);
    assert_int_equal(chmod(token_path, 0600), 0);
    int port = 20000 + (int)gpc_rng_below(&rng, 30000);
    char listen[64], where[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(where, sizeof where, "tcp://127.0.0.1:%d", port);
    TEST_OK(gpcd_config_set(&g.config, "listen", listen));
    TEST_OK(gpcd_config_set(&g.config, "token_file", token_path));
    test_gpcd_start(&g);
    unsetenv("GPC_TOKEN");
    test_request_fails(where, "GET", "/status", NULL, 401, "bearer token");
    setenv("GPC_TOKEN", "wrong-token-of-some-length", 1);
    test_request_fails(where, "GET", "/status", NULL, 401, "bearer token");
    setenv("GPC_TOKEN", token, 1);
    int status;
    json_t *s = test_request(where, "GET", "/status", NULL, &status);
    assert_int_equal(status, 200);
    assert_string_equal(json_string_value(json_object_get(s, "provider")), "simulated:1x80GB");
    json_decref(s);
    unsetenv("GPC_TOKEN");
    test_gpcd_stop(&g);
    test_rmtree(g.dir);
    gpc_free(g.dir);
}

static int has_alert(test_gpcd *g, const char *kind, int gpu, const char *needle) {
    json_t *a = get(g, "/alerts");
    json_t *list = json_object_get(a, "alerts");
    int found = 0;
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *x = json_array_get(list, i);
        if (strcmp(json_string_value(json_object_get(x, "kind")), kind) == 0 &&
            json_integer_value(json_object_get(x, "gpu")) == gpu &&
            strstr(json_string_value(json_object_get(x, "message")), needle))
            found = 1;
    }
    json_decref(a);
    return found;
}

static void wait_alert(test_gpcd *g, const char *kind, int gpu, const char *needle, int want) {
    double end = gpc_time_seconds() + 5;
    while (has_alert(g, kind, gpu, needle) != want) {
        if (gpc_time_seconds() > end)
            fail_msg("alert %s on GPU %d ('%s') %s", kind, gpu, needle,
                     want ? "never appeared" : "never cleared");
        usleep(50000);
    }
}

static void test_alerts(void **state) {
    (void)state;
    test_gpcd g = {0};
    g.dir = test_tmpdir("api");
    test_gpcd_config(&g, g.dir, "simulated:2x80GB");
    char sim[4200];
    snprintf(sim, sizeof sim, "%s/sim", g.dir);
    TEST_OK(gpcd_config_set(&g.config, "simulated_file", sim));
    TEST_OK(gpcd_config_set(&g.config, "alert_util_window", "0.3s"));
    test_gpcd_start(&g);
    int64_t id = test_submit(g.socket, "{\"command\":[\"sleep\",\"30\"],\"gpus\":1}");
    json_t *job = test_wait_state(g.socket, id, "running", 5);
    int gpu = (int)json_integer_value(json_array_get(json_object_get(job, "assigned_gpus"), 0));
    json_decref(job);
    int idle = 1 - gpu;
    FILE *f = fopen(sim, "w");
    /* the busy GPU at 30% (input-bound), the idle one hot and nearly full:
     * 86 C > 85, and 76 GiB of 80 = 95% > 90% */
    fprintf(f, "%d util 30\n%d temperature 86\n%d mem_used 76G\n", gpu, idle, idle);
    fclose(f);
    wait_alert(&g, "low_utilization", gpu, "likely input-bound", 1);
    wait_alert(&g, "temperature", idle, "86 C", 1);
    wait_alert(&g, "memory", idle, "95% used", 1);
    /* an idle GPU at low utilisation is not an alert */
    assert_int_equal(has_alert(&g, "low_utilization", idle, ""), 0);
    gpcd_response r;
    TEST_OK(gpcd_client_request(g.socket, "GET", "/metrics", NULL, &r));
    char line[128];
    snprintf(line, sizeof line, "gpcd_alert_active{gpu=\"%d\",kind=\"low_utilization\"} 1\n", gpu);
    assert_non_null(strstr(r.body, line));
    assert_non_null(strstr(r.body, "gpcd_alerts_active{kind=\"memory\"} 1\n"));
    snprintf(line, sizeof line, "gpcd_gpu_utilization_ratio{gpu=\"%d\"} 0.29999999999999999\n",
             gpu);
    assert_non_null(strstr(r.body, line));
    gpcd_response_free(&r);
    /* within 5 C of the GPU's own slowdown threshold (90 C) counts too */
    f = fopen(sim, "w");
    fprintf(f, "%d temperature 80\n%d slowdown 84\n", idle, idle);
    fclose(f);
    wait_alert(&g, "low_utilization", gpu, "", 0);
    wait_alert(&g, "memory", idle, "", 0);
    wait_alert(&g, "temperature", idle, "slowdown at 84 C", 1);
    unlink(sim);
    wait_alert(&g, "temperature", idle, "", 0);
    snprintf(line, sizeof line, "/jobs/%lld/cancel", (long long)id);
    int status;
    json_decref(test_request(g.socket, "POST", line, "", &status));
    json_decref(test_wait_state(g.socket, id, "cancelled", 5));
    test_gpcd_stop(&g);
    test_rmtree(g.dir);
    gpc_free(g.dir);
}

static void test_preemption_requeues(void **state) {
    (void)state;
    test_gpcd g = {0};
    g.dir = test_tmpdir("api");
    test_gpcd_config(&g, g.dir, "simulated:1x80GB");
    /* the default protects a job for its first 10 minutes */
    TEST_OK(gpcd_config_set(&g.config, "preempt_min_runtime", "0.1s"));
    test_gpcd_start(&g);
    /* the low job reports SIGTERM (as gpc train does when it checkpoints) */
    int64_t low =
        test_submit(g.socket, "{\"command\":[\"sh\",\"-c\",\"trap 'echo got-term; exit 0' TERM; "
                              "echo started; sleep 30 & wait\"],\"priority\":\"low\"}");
    json_decref(test_wait_state(g.socket, low, "running", 5));
    /* wait until its trap is set: "running" is recorded before the fork */
    char path[64];
    snprintf(path, sizeof path, "/jobs/%lld/logs", (long long)low);
    gpcd_response r;
    for (double end = gpc_time_seconds() + 5;;) {
        TEST_OK(gpcd_client_request(g.socket, "GET", path, NULL, &r));
        int started = strcmp(r.body, "started\n") == 0;
        gpcd_response_free(&r);
        if (started) break;
        if (gpc_time_seconds() > end) fail_msg("the low job never printed 'started'");
        usleep(20000);
    }
    /* long enough that its "running" is seen, short enough to keep the test quick */
    int64_t high = test_submit(g.socket, "{\"command\":[\"sleep\",\"2\"],\"priority\":\"high\"}");
    json_t *j = test_wait_state(g.socket, low, "preempted", 5);
    assert_int_equal(json_integer_value(json_object_get(j, "preemptions")), 1);
    json_decref(j);
    json_decref(test_wait_state(g.socket, high, "running", 5));
    json_decref(test_wait_state(g.socket, high, "completed", 5));
    /* back in line, it runs again */
    json_decref(test_wait_state(g.socket, low, "running", 5));
    const char *want = "started\ngot-term\nstarted\n";
    double end = gpc_time_seconds() + 5;
    for (;;) { /* the second run may not have printed yet */
        TEST_OK(gpcd_client_request(g.socket, "GET", path, NULL, &r));
        int done = strcmp(r.body, want) == 0 || gpc_time_seconds() > end;
        if (done) assert_string_equal(r.body, want);
        gpcd_response_free(&r);
        if (done) break;
        usleep(20000);
    }
    snprintf(path, sizeof path, "/jobs/%lld/cancel", (long long)low);
    int status;
    json_decref(test_request(g.socket, "POST", path, "", &status));
    json_decref(test_wait_state(g.socket, low, "cancelled", 5));
    test_gpcd_stop(&g);
    test_rmtree(g.dir);
    gpc_free(g.dir);
}

static int gpu_drained(test_gpcd *g, int gpu) {
    json_t *j = get(g, "/gpus");
    int drained = json_is_true(
        json_object_get(json_array_get(json_object_get(j, "gpus"), (size_t)gpu), "drained"));
    json_decref(j);
    return drained;
}

static int assigned_gpu(test_gpcd *g, int64_t id) {
    json_t *j = test_job(g->socket, id);
    int gpu = (int)json_integer_value(json_array_get(json_object_get(j, "assigned_gpus"), 0));
    json_decref(j);
    return gpu;
}

/* A GPU with a hardware-error alert takes no new job until an admin
 * resumes it, even after the alert clears; the drained set survives a
 * restart; gpc's endpoints refuse bad GPUs and methods. */
static void test_drain(void **state) {
    (void)state;
    test_gpcd g = {0};
    g.dir = test_tmpdir("api");
    test_gpcd_config(&g, g.dir, "simulated:2x80GB");
    char sim[4200], go[4200], body[9000];
    snprintf(sim, sizeof sim, "%s/sim", g.dir);
    snprintf(go, sizeof go, "%s/go", g.dir);
    TEST_OK(gpcd_config_set(&g.config, "simulated_file", sim));
    test_gpcd_start(&g);
    FILE *f = fopen(sim, "w");
    fprintf(f, "0 ecc 1\n");
    fclose(f);
    wait_alert(&g, "hardware_errors", 0, "", 1);
    for (double end = gpc_time_seconds() + 5; !gpu_drained(&g, 0); usleep(20000))
        if (gpc_time_seconds() > end) fail_msg("GPU 0 was not drained on its hardware alert");
    snprintf(body, sizeof body,
             "{\"command\":[\"sh\",\"-c\",\"while [ ! -e %s ]; do sleep 0.02; done\"]}", go);
    int64_t first = test_submit(g.socket, body);
    json_decref(test_wait_state(g.socket, first, "running", 5));
    assert_int_equal(assigned_gpu(&g, first), 1);
    int64_t second = test_submit(g.socket, body);
    f = fopen(sim, "w"); /* the alert clears; the GPU stays out */
    fclose(f);
    wait_alert(&g, "hardware_errors", 0, "", 0);
    usleep(300 * 1000);
    json_t *j = test_job(g.socket, second);
    assert_string_equal(json_string_value(json_object_get(j, "state")), "queued");
    json_decref(j);
    test_request_fails(g.socket, "POST", "/gpus/7/resume", "", 404, "no GPU 7");
    test_request_fails(g.socket, "GET", "/gpus/0/resume", NULL, 405, "takes POST");
    test_request_fails(g.socket, "POST", "/gpus/x/resume", "", 404, "not a GPU index");
    int status;
    json_decref(test_request(g.socket, "POST", "/gpus/0/resume", "", &status));
    assert_int_equal(status, 200);
    json_decref(test_wait_state(g.socket, second, "running", 5));
    assert_int_equal(assigned_gpu(&g, second), 0);
    assert_int_equal(gpu_drained(&g, 0), 0);
    /* drained by hand, kept across a restart */
    json_decref(test_request(g.socket, "POST", "/gpus/1/drain", "", &status));
    assert_int_equal(status, 200);
    f = fopen(go, "w");
    fclose(f);
    json_decref(test_wait_state(g.socket, first, "completed", 5));
    json_decref(test_wait_state(g.socket, second, "completed", 5));
    test_gpcd_stop(&g);
    test_gpcd_start(&g);
    assert_int_equal(gpu_drained(&g, 1), 1);
    assert_int_equal(gpu_drained(&g, 0), 0);
    int64_t third = test_submit(g.socket, "{\"command\":[\"true\"],\"gpus\":2}");
    usleep(300 * 1000);
    j = test_job(g.socket, third);
    assert_string_equal(json_string_value(json_object_get(j, "state")), "queued");
    json_decref(j);
    json_decref(test_request(g.socket, "POST", "/gpus/1/resume", "", &status));
    json_decref(test_wait_state(g.socket, third, "completed", 5));
    test_gpcd_stop(&g);
    test_rmtree(g.dir);
    gpc_free(g.dir);
}

#define SLOW_CONNECTIONS 200

static int unix_connect(const char *path) {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a.sun_path) fail_msg("socket path %s is too long", path);
    memcpy(a.sun_path, path, strlen(path) + 1);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) fail_msg("connect %s", path);
    return fd;
}

/* A TCP connection to 127.0.0.1:port from the loopback address `from`
 * (any 127.x.y.z is this host: a second address is a second peer). */
static int tcp_connect(const char *from, int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in src = {.sin_family = AF_INET}, dst = {.sin_family = AF_INET};
    inet_pton(AF_INET, from, &src.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    dst.sin_port = htons((uint16_t)port);
    if (fd < 0 || bind(fd, (struct sockaddr *)&src, sizeof src) != 0 ||
        connect(fd, (struct sockaddr *)&dst, sizeof dst) != 0)
        fail_msg("connect from %s to port %d", from, port);
    return fd;
}

/* 1 when gpcd has ended the connection (end of file or reset). */
static int is_closed(int fd) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) return 0;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK);
    return n == 0 || (n < 0 && errno != EAGAIN);
}

static int count_closed(const int *fds, int n) {
    int closed = 0;
    for (int i = 0; i < n; i++)
        closed += is_closed(fds[i]);
    return closed;
}

/* Sends a request and reads the reply for up to `seconds`. */
static void raw_exchange(int fd, const char *request, char *reply, size_t size, double seconds) {
    if (send(fd, request, strlen(request), MSG_NOSIGNAL) != (ssize_t)strlen(request))
        fail_msg("send");
    size_t got = 0;
    double end = gpc_time_seconds() + seconds;
    while (got + 1 < size && gpc_time_seconds() < end) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0) continue;
        ssize_t n = recv(fd, reply + got, size - 1 - got, 0);
        if (n <= 0) break;
        got += (size_t)n;
        if (strstr(reply, "\r\n\r\n") && strchr(strstr(reply, "\r\n\r\n"), '}')) break;
        reply[got] = '\0';
    }
    reply[got] = '\0';
}

/* Slowloris: 200 connections of one user that send a request's first line
 * and nothing more. Past peer_connections they are cut as they open; the
 * rest are cut at header_timeout; meanwhile another peer is served at
 * once. On TCP a wrong token is answered before the (never sent) 1 MB body
 * it announces. */
static void test_slow_clients(void **state) {
    (void)state;
    test_gpcd g = {0};
    g.dir = test_tmpdir("api");
    test_gpcd_config(&g, g.dir, "simulated:1x80GB");
    TEST_OK(gpcd_config_set(&g.config, "peer_connections", "20"));
    TEST_OK(gpcd_config_set(&g.config, "header_timeout", "2s"));
    char token_path[4200], listen[64], token[] = "slow-client-test-token-1234";
    snprintf(token_path, sizeof token_path, "%s/token", g.dir);
    FILE *f = fopen(token_path, "w");
    fprintf(f, "%s\n", token);
    fclose(f);
    assert_int_equal(chmod(token_path, 0600), 0);
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 43);
    int port = 20000 + (int)gpc_rng_below(&rng, 30000);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    TEST_OK(gpcd_config_set(&g.config, "listen", listen));
    TEST_OK(gpcd_config_set(&g.config, "token_file", token_path));
    test_gpcd_start(&g);

    static const char slow[] = "GET /status HTTP/1.1\r\n"; /* and then nothing */
    int fds[SLOW_CONNECTIONS];
    double opened = gpc_time_seconds();
    for (int i = 0; i < SLOW_CONNECTIONS; i++) {
        fds[i] = unix_connect(g.socket);
        if (send(fds[i], slow, sizeof slow - 1, MSG_NOSIGNAL) < 0) fail_msg("send");
    }
    /* all but the peer's 20 are cut as they open, well before the deadline */
    int closed = 0;
    while ((closed = count_closed(fds, SLOW_CONNECTIONS)) < SLOW_CONNECTIONS - 20 &&
           gpc_time_seconds() - opened < 1.5)
        usleep(20000);
    if (gpc_time_seconds() - opened < 1.9) assert_int_equal(closed, SLOW_CONNECTIONS - 20);
    /* the 20 held are cut at the deadline, and the user is served again */
    while (count_closed(fds, SLOW_CONNECTIONS) < SLOW_CONNECTIONS) {
        if (gpc_time_seconds() - opened > 6) fail_msg("slow connections outlived the deadline");
        usleep(50000);
    }
    assert_true(gpc_time_seconds() - opened >= 1.9);
    for (int i = 0; i < SLOW_CONNECTIONS; i++)
        close(fds[i]);
    json_decref(get(&g, "/status"));

    /* TCP: one address's slow connections leave another's requests alone */
    for (int i = 0; i < SLOW_CONNECTIONS; i++) {
        fds[i] = tcp_connect("127.0.0.1", port);
        if (send(fds[i], slow, sizeof slow - 1, MSG_NOSIGNAL) < 0) fail_msg("send");
    }
    char request[512], reply[4096];
    snprintf(request, sizeof request,
             "GET /status HTTP/1.1\r\nHost: gpcd\r\nAuthorization: Bearer %s\r\n"
             "Connection: close\r\n\r\n",
             token);
    int other = tcp_connect("127.0.0.2", port);
    double asked = gpc_time_seconds();
    raw_exchange(other, request, reply, sizeof reply, 1.5);
    close(other);
    if (strncmp(reply, "HTTP/1.1 200", 12) != 0) fail_msg("other peer got: %.200s", reply);
    assert_true(gpc_time_seconds() - asked < 1.5);
    /* a wrong token is refused before the body it announces is read */
    other = tcp_connect("127.0.0.2", port);
    raw_exchange(other,
                 "POST /jobs HTTP/1.1\r\nHost: gpcd\r\nAuthorization: Bearer wrong\r\n"
                 "Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n",
                 reply, sizeof reply, 1.5);
    close(other);
    if (strncmp(reply, "HTTP/1.1 401", 12) != 0) fail_msg("unauthenticated upload: %.200s", reply);
    for (int i = 0; i < SLOW_CONNECTIONS; i++)
        close(fds[i]);
    test_gpcd_stop(&g);
    test_rmtree(g.dir);
    gpc_free(g.dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_endpoints),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_tcp_token),
        cmocka_unit_test(test_alerts),
        cmocka_unit_test(test_preemption_requeues),
        cmocka_unit_test(test_slow_clients),
        cmocka_unit_test(test_drain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
