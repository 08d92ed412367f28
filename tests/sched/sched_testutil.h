/*
 * sched_testutil.h: helpers for gpcd's tests: a gpcd running inside the
 * test process (in a thread, with simulated GPUs and its state in a fresh
 * directory), requests to it, and small JSON accessors. Header-only: each
 * test includes it once.
 */
#ifndef GPC_SCHED_TESTUTIL_H
#define GPC_SCHED_TESTUTIL_H

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpc/sched.h"
#include "testutil.h"

typedef struct {
    gpcd_config config;
    gpcd_daemon *daemon;
    pthread_t thread;
    char *dir;
    char socket[256];
} test_gpcd;

static inline void *test_gpcd_main(void *arg) {
    test_gpcd *g = arg;
    gpcd_daemon_run(g->daemon);
    return NULL;
}

/* Fills a config for a daemon in dir (simulated GPUs, fast sampling). */
static inline void test_gpcd_config(test_gpcd *g, const char *dir, const char *gpus) {
    gpcd_config_defaults(&g->config);
    TEST_OK(gpcd_config_set(&g->config, "state_dir", dir));
    TEST_OK(gpcd_config_set(&g->config, "gpus", gpus));
    TEST_OK(gpcd_config_set(&g->config, "sample_interval", "0.1s"));
    TEST_OK(gpcd_config_set(&g->config, "preempt_grace", "0.5s"));
    TEST_OK(gpcd_config_set(&g->config, "kill_grace", "0.5s"));
    snprintf(g->socket, sizeof g->socket, "%s/gpcd.sock", dir);
}

static inline void test_gpcd_start(test_gpcd *g) {
    TEST_OK(gpcd_daemon_create(&g->config, &g->daemon));
    if (pthread_create(&g->thread, NULL, test_gpcd_main, g) != 0) fail_msg("pthread_create");
}

static inline void test_gpcd_stop(test_gpcd *g) {
    if (!g->daemon) return;
    gpcd_daemon_stop(g->daemon);
    pthread_join(g->thread, NULL);
    gpcd_daemon_destroy(g->daemon);
    g->daemon = NULL;
}

/* One request; asserts it reached gpcd. Returns the parsed JSON body (or
 * NULL when it is not JSON) and the status in *status. */
static inline json_t *test_request(const char *socket, const char *method, const char *path,
                                   const char *body, int *status) {
    gpcd_response r;
    TEST_OK(gpcd_client_request(socket, method, path, body, &r));
    *status = r.status;
    json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
    gpcd_response_free(&r);
    return j;
}

/* Asserts the status and that the error message contains needle. */
static inline void test_request_fails(const char *socket, const char *method, const char *path,
                                      const char *body, int want_status, const char *needle) {
    int status;
    json_t *j = test_request(socket, method, path, body, &status);
    const char *message = json_string_value(json_object_get(j, "error"));
    if (status != want_status)
        fail_msg("%s %s: status %d, want %d (%s)", method, path, status, want_status,
                 message ? message : "no message");
    if (!message || !strstr(message, needle))
        fail_msg("%s %s: message '%s' lacks '%s'", method, path, message ? message : "(none)",
                 needle);
    json_decref(j);
}

static inline int64_t test_submit(const char *socket, const char *body) {
    int status;
    json_t *j = test_request(socket, "POST", "/jobs", body, &status);
    if (status != 201) {
        const char *m = json_string_value(json_object_get(j, "error"));
        fail_msg("submit %s: status %d (%s)", body, status, m ? m : "?");
    }
    int64_t id = json_integer_value(json_object_get(j, "id"));
    json_decref(j);
    return id;
}

/* GET /jobs/ID. */
static inline json_t *test_job(const char *socket, int64_t id) {
    char path[64];
    int status;
    snprintf(path, sizeof path, "/jobs/%lld", (long long)id);
    json_t *j = test_request(socket, "GET", path, NULL, &status);
    if (status != 200) fail_msg("GET %s: %d", path, status);
    return j;
}

/* Waits (up to seconds) until job id reaches state; returns its JSON. */
static inline json_t *test_wait_state(const char *socket, int64_t id, const char *state,
                                      double seconds) {
    double end = gpc_time_seconds() + seconds;
    for (;;) {
        json_t *j = test_job(socket, id);
        const char *s = json_string_value(json_object_get(j, "state"));
        if (s && strcmp(s, state) == 0) return j;
        if (gpc_time_seconds() > end)
            fail_msg("job %lld is %s after %.1f s, expected %s", (long long)id, s ? s : "?",
                     seconds, state);
        json_decref(j);
        usleep(20000);
    }
}

#endif /* GPC_SCHED_TESTUTIL_H */
