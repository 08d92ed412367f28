/*
 * sched_submit.c: sustained durable submissions per second into gpcd
 * (goal: at least 2,000/s). Starts gpcd in this process on simulated GPUs
 * with its database in a fresh directory (on the disk under $TMPDIR, or
 * --dir), fills the GPUs with one job so submissions queue, then THREADS
 * clients submit JOBS jobs over the unix socket, each acknowledged only
 * after its SQLite commit (WAL, synchronous=FULL). Reports jobs/s and the
 * latency of an acknowledgement.
 *
 *   bench_sched_submit [--jobs N] [--threads N] [--dir DIR]
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "gpc/sched.h"

typedef struct {
    const char *socket;
    int count;
    double *latency;
    int failed;
} client;

static void *submit_loop(void *arg) {
    client *c = arg;
    for (int i = 0; i < c->count; i++) {
        char body[128];
        snprintf(body, sizeof body, "{\"command\":[\"true\"],\"name\":\"b%d\"}", i);
        gpcd_response r;
        double t0 = gpc_time_seconds();
        if (gpcd_client_request(c->socket, "POST", "/jobs", body, &r) != GPC_OK) {
            c->failed++;
            continue;
        }
        c->latency[i] = gpc_time_seconds() - t0;
        if (r.status != 201) c->failed++;
        gpcd_response_free(&r);
    }
    return NULL;
}

static void *daemon_main(void *arg) {
    gpcd_daemon_run(arg);
    return NULL;
}

int main(int argc, char **argv) {
    int jobs = 20000, threads = 32;
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--jobs") == 0)
            jobs = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--threads") == 0)
            threads = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--dir") == 0)
            base = argv[i + 1];
        else {
            fprintf(stderr, "usage: bench_sched_submit [--jobs N] [--threads N] [--dir DIR]\n");
            return 2;
        }
    }
    if (jobs < threads || threads < 1 || threads > 1024) {
        fprintf(stderr, "bench_sched_submit: error: need 1-1024 threads and jobs >= threads\n");
        return 2;
    }
    char dir[512];
    snprintf(dir, sizeof dir, "%s/gpc-bench-submit-XXXXXX", base);
    if (!mkdtemp(dir)) {
        fprintf(stderr, "bench_sched_submit: error: cannot create a directory under %s\n", base);
        return 1;
    }
    gpc_log_set_level(GPC_LOG_WARN);
    gpcd_config config;
    gpcd_config_defaults(&config);
    gpcd_config_set(&config, "state_dir", dir);
    gpcd_config_set(&config, "gpus", "simulated:8x141GB");
    /* every client thread is this one user: let them all connect at once */
    char peers[16];
    snprintf(peers, sizeof peers, "%d", threads + 8);
    gpcd_config_set(&config, "peer_connections", peers);
    gpcd_daemon *daemon;
    if (gpcd_daemon_create(&config, &daemon) != GPC_OK) {
        fprintf(stderr, "bench_sched_submit: error: %s\n", gpc_last_error());
        return 1;
    }
    pthread_t loop;
    pthread_create(&loop, NULL, daemon_main, daemon);
    char socket[600];
    snprintf(socket, sizeof socket, "%s/gpcd.sock", dir);
    gpcd_response r;
    if (gpcd_client_request(socket, "POST", "/jobs", "{\"command\":[\"sleep\",\"600\"],\"gpus\":8}",
                            &r) != GPC_OK) {
        fprintf(stderr, "bench_sched_submit: error: %s\n", gpc_last_error());
        return 1;
    }
    gpcd_response_free(&r);
    usleep(200 * 1000);

    client *clients = calloc((size_t)threads, sizeof *clients);
    pthread_t *tids = calloc((size_t)threads, sizeof *tids);
    double *latency = calloc((size_t)jobs, sizeof *latency);
    int per = jobs / threads;
    double t0 = gpc_time_seconds();
    for (int t = 0; t < threads; t++) {
        clients[t] = (client){socket, per, latency + (size_t)t * per, 0};
        pthread_create(&tids[t], NULL, submit_loop, &clients[t]);
    }
    int failed = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tids[t], NULL);
        failed += clients[t].failed;
    }
    double elapsed = gpc_time_seconds() - t0;
    int done = per * threads;
    qsort(latency, (size_t)done, sizeof *latency, bench_cmp_double);
    printf("%d durable submissions from %d clients in %.2f s: %.0f jobs/s; acknowledgement "
           "latency median %.2f ms, p99 %.2f ms; %d failed\n",
           done, threads, elapsed, done / elapsed, latency[done / 2] * 1e3,
           latency[(size_t)(done * 0.99)] * 1e3, failed);
    printf("goal: at least 2,000 jobs/s: %s\n", done / elapsed >= 2000 ? "met" : "NOT met");
    /* stop the job holding the GPUs, then gpcd */
    gpcd_client_request(socket, "POST", "/jobs/1/cancel", "", &r);
    gpcd_response_free(&r);
    usleep(700 * 1000);
    gpcd_daemon_stop(daemon);
    pthread_join(loop, NULL);
    gpcd_daemon_destroy(daemon);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "bench_sched_submit: could not remove %s\n", dir);
    free(clients);
    free(tids);
    free(latency);
    return failed ? 1 : 0;
}
