/*
 * api.c: gpcd's HTTP/JSON API, served by libmicrohttpd.
 *
 * By default the API listens only on a unix socket (mode socket_mode, 0600
 * unless the administrator opens it) and knows each caller's uid from the
 * kernel (SO_PEERCRED), which is what makes "only the owner or root may
 * cancel" trustworthy. With `listen` it also answers on TCP, where every
 * request must carry `Authorization: Bearer TOKEN`; TCP callers act as
 * gpcd's own user.
 *
 * Every request goes through gpcd_request_parse (request.c) first; bad
 * input gets a 4xx with {"error": "..."}.
 *
 * Slow clients cannot lock others out: each peer (a uid on the socket, an
 * address on TCP) may hold at most peer_connections connections (more are
 * cut as they arrive), a request's line and headers must arrive within
 * header_timeout of the connection opening or the previous request ending
 * (a watchdog thread cuts the others: libmicrohttpd's own timeout is
 * reset by every byte, so one byte every few seconds kept a connection for
 * ever), and on TCP the token is checked before any body is read.
 *
 * Endpoints: POST /jobs, GET /jobs[?all=1&state=a,b&recent=N], GET /jobs/ID,
 * GET /jobs/ID/logs?offset=N&limit=M, POST /jobs/ID/cancel (or DELETE
 * /jobs/ID), GET /gpus, GET /alerts, GET /status, GET /metrics; and GET /
 * (or /dashboard), the web page of dashboard.c, served without a token since
 * it holds no data: its script calls the API with the token (see there).
 */
#define _GNU_SOURCE /* struct ucred for SO_PEERCRED */
#include "sched/sched_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define API_MAX_ARGS 16

/* One open connection, for the per-peer limit and the header deadline. */
typedef struct api_peer_conn {
    int fd;
    uint64_t peer; /* uid on the socket, IPv4 address on TCP */
    double since;  /* connection opened, or the previous request ended */
    int in_request, cut;
    struct api_peer_conn *prev, *next;
} api_peer_conn;

typedef struct {
    gpcd_daemon *daemon;
    int tcp;
    api_peer_conn *conns; /* guarded by the api_state's lock */
} api_listener;

typedef struct {
    char *body;
    size_t len, cap;
    int too_big;
} api_connection;

typedef struct {
    gpcd_query_arg args[API_MAX_ARGS];
    int count;
} query_args;

static enum MHD_Result collect_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value) {
    (void)kind;
    query_args *q = cls;
    if (q->count < API_MAX_ARGS) {
        q->args[q->count].key = key;
        q->args[q->count].value = value;
        q->count++;
    }
    return MHD_YES;
}

static enum MHD_Result respond(struct MHD_Connection *c, unsigned status, const char *type,
                               const char *body, size_t len, const char *next_offset,
                               const char *job_state) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (next_offset) MHD_add_response_header(r, "X-Gpc-Next-Offset", next_offset);
    if (job_state) MHD_add_response_header(r, "X-Gpc-Job-State", job_state);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result respond_json(struct MHD_Connection *c, unsigned status, json_t *value) {
    char *text = json_dumps(value, JSON_COMPACT);
    json_decref(value);
    if (!text)
        return respond(c, 500, "application/json", "{\"error\":\"cannot encode\"}", 24, NULL, NULL);
    size_t len = strlen(text);
    text[len] = '\0';
    enum MHD_Result ret;
    /* a trailing newline keeps curl output tidy */
    char *line = malloc(len + 2);
    if (!line) {
        free(text);
        return MHD_NO;
    }
    memcpy(line, text, len);
    line[len] = '\n';
    ret = respond(c, status, "application/json", line, len + 1, NULL, NULL);
    free(line);
    free(text);
    return ret;
}

static enum MHD_Result respond_error(struct MHD_Connection *c, unsigned status,
                                     const char *message) {
    json_t *o = json_object();
    json_object_set_new(o, "error", json_string(message));
    json_object_set_new(o, "status", json_integer(status));
    return respond_json(c, status, o);
}

static int token_matches(const char *expected, const char *header) {
    if (!header || strncmp(header, "Bearer ", 7) != 0) return 0;
    const char *got = header + 7;
    size_t a = strlen(expected), b = strlen(got);
    unsigned char diff = (unsigned char)(a != b);
    /* constant time in the token's length, so timing does not leak it */
    for (size_t i = 0; i < a; i++)
        diff |= (unsigned char)(expected[i] ^ (i < b ? got[i] : 0));
    return diff == 0;
}

static int peer_uid(struct MHD_Connection *c, uid_t *out) {
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!info) return -1;
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(info->connect_fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return -1;
    *out = cred.uid;
    return 0;
}

static void user_name(uid_t uid, char *buf, size_t size) {
    struct passwd pw, *found = NULL;
    char tmp[2048];
    if (getpwuid_r(uid, &pw, tmp, sizeof tmp, &found) == 0 && found)
        snprintf(buf, size, "%s", pw.pw_name);
    else
        snprintf(buf, size, "uid%u", (unsigned)uid);
}

/* ------------------------------------------------------ slow clients */

static pthread_mutex_t conns_lock = PTHREAD_MUTEX_INITIALIZER;

static int connection_peer(const api_listener *l, struct MHD_Connection *c, int fd,
                           uint64_t *peer) {
    if (l->tcp) {
        const union MHD_ConnectionInfo *info =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (!info || !info->client_addr || info->client_addr->sa_family != AF_INET) return -1;
        *peer = ((const struct sockaddr_in *)(const void *)info->client_addr)->sin_addr.s_addr;
        return 0;
    }
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return -1;
    *peer = cred.uid;
    return 0;
}

static void notify_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                              enum MHD_ConnectionNotificationCode code) {
    api_listener *l = cls;
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        api_peer_conn *e = *socket_context;
        if (!e) return;
        pthread_mutex_lock(&conns_lock);
        if (e->prev)
            e->prev->next = e->next;
        else
            l->conns = e->next;
        if (e->next) e->next->prev = e->prev;
        pthread_mutex_unlock(&conns_lock);
        free(e);
        *socket_context = NULL;
        return;
    }
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    uint64_t peer;
    if (!info || connection_peer(l, c, info->connect_fd, &peer) != 0) return;
    int fd = info->connect_fd;
    api_peer_conn *e = calloc(1, sizeof *e);
    pthread_mutex_lock(&conns_lock);
    int held = 0;
    for (api_peer_conn *o = l->conns; o; o = o->next)
        held += o->peer == peer && !o->cut;
    if (!e || held >= l->daemon->config.peer_connections) {
        pthread_mutex_unlock(&conns_lock);
        free(e);
        /* over the peer's share: the client reads an end of file at once */
        shutdown(fd, SHUT_RDWR);
        gpc_log(GPC_LOG_DEBUG, "http: peer %llu holds %d connections; cut a new one",
                (unsigned long long)peer, held);
        return;
    }
    e->fd = fd;
    e->peer = peer;
    e->since = gpc_time_seconds();
    e->next = l->conns;
    if (l->conns) l->conns->prev = e;
    l->conns = e;
    pthread_mutex_unlock(&conns_lock);
    *socket_context = e;
}

static api_peer_conn *connection_entry(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return info ? info->socket_context : NULL;
}

static void mark_request(struct MHD_Connection *c, int in_request) {
    api_peer_conn *e = connection_entry(c);
    if (!e) return;
    pthread_mutex_lock(&conns_lock);
    e->in_request = in_request;
    e->since = gpc_time_seconds();
    pthread_mutex_unlock(&conns_lock);
}

typedef struct {
    api_listener unix_listener, tcp_listener;
    pthread_t watchdog;
    int watchdog_running;
    volatile int stop;
} api_state;

/* Cuts connections whose request line and headers are late. shutdown(2)
 * only ends the stream: libmicrohttpd sees an end of file and closes the
 * connection itself (and tells notify_connection before the fd closes). */
static void *header_watchdog(void *arg) {
    api_state *s = arg;
    while (!s->stop) {
        usleep(100 * 1000);
        double now = gpc_time_seconds();
        api_listener *ls[2] = {&s->unix_listener, &s->tcp_listener};
        pthread_mutex_lock(&conns_lock);
        for (int i = 0; i < 2; i++)
            for (api_peer_conn *e = ls[i]->conns; e; e = e->next)
                if (!e->in_request && !e->cut &&
                    now - e->since > ls[i]->daemon->config.header_timeout) {
                    shutdown(e->fd, SHUT_RDWR);
                    e->cut = 1;
                }
        pthread_mutex_unlock(&conns_lock);
    }
    return NULL;
}

/* -------------------------------------------------------------- handlers */

static enum MHD_Result respond_dashboard(struct MHD_Connection *c) {
    size_t len;
    const char *page = gpcd_dashboard_page(&len);
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)page, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    /* inline script and style only, requests to gpcd itself only, never framed */
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'none'; script-src 'unsafe-inline'; style-src "
                            "'unsafe-inline'; connect-src 'self'; form-action 'none'; "
                            "frame-ancestors 'none'; base-uri 'none'");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result handle_list(gpcd_daemon *d, struct MHD_Connection *c,
                                   const gpcd_request *req) {
    unsigned mask = req->state_mask;
    if (!mask)
        mask = req->all ? (1u << GPCD_STATE_COUNT) - 1
                        : (1u << GPCD_QUEUED) | (1u << GPCD_RUNNING) | (1u << GPCD_PREEMPTED);
    gpcd_job **jobs;
    int n;
    gpc_status st = req->recent ? gpcd_store_list_recent(d->store, mask, req->recent, &jobs, &n)
                                : gpcd_store_list(d->store, mask, 0, &jobs, &n);
    if (st != GPC_OK) return respond_error(c, 500, gpc_last_error());
    pthread_mutex_lock(&d->lock);
    for (int i = 0; i < n; i++)
        gpcd_daemon_overlay_unsaved(d, jobs[i]);
    pthread_mutex_unlock(&d->lock);
    json_t *array = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(array, gpcd_job_to_json(jobs[i]));
    gpcd_store_free_list(jobs, n);
    json_t *o = json_object();
    json_object_set_new(o, "jobs", array);
    return respond_json(c, 200, o);
}

static enum MHD_Result handle_show(gpcd_daemon *d, struct MHD_Connection *c, int64_t id) {
    gpcd_job *job;
    char msg[128];
    if (gpcd_store_get(d->store, id, &job) != GPC_OK) {
        gpcd_daemon_no_job(d, id, msg, sizeof msg);
        return respond_error(c, 404, msg);
    }
    pthread_mutex_lock(&d->lock);
    gpcd_daemon_overlay_unsaved(d, job);
    pthread_mutex_unlock(&d->lock);
    json_t *o = gpcd_job_to_json(job);
    gpcd_job_free(job);
    char *events = NULL;
    if (gpcd_store_events(d->store, id, &events) == GPC_OK && events) {
        json_t *e = json_loads(events, 0, NULL);
        if (e) json_object_set_new(o, "events", e);
    }
    free(events);
    return respond_json(c, 200, o);
}

static enum MHD_Result handle_logs(gpcd_daemon *d, struct MHD_Connection *c,
                                   const gpcd_request *req, uid_t caller) {
    gpcd_job *job;
    char msg[256];
    if (gpcd_store_get(d->store, req->job_id, &job) != GPC_OK) {
        gpcd_daemon_no_job(d, req->job_id, msg, sizeof msg);
        return respond_error(c, 404, msg);
    }
    if (caller != 0 && caller != job->owner_uid && caller != d->uid) {
        snprintf(msg, sizeof msg,
                 "job %lld belongs to %s; only its owner or root may read its logs",
                 (long long)req->job_id, job->owner ? job->owner : "another user");
        gpcd_job_free(job);
        return respond_error(c, 403, msg);
    }
    char state[32];
    snprintf(state, sizeof state, "%s", gpcd_state_name(job->state));
    gpcd_job_free(job);
    char path[700];
    gpcd_daemon_log_path(d, req->job_id, path, sizeof path);
    char *buf = NULL;
    ssize_t got = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    int64_t offset = req->offset;
    if (fd >= 0) {
        struct stat st;
        /* An offset past the end: the log passed log_max and its tail was
         * moved up (runner.c). A follower goes on from the latest output
         * rather than waiting for the file to grow back to where it was. */
        int have_size = fstat(fd, &st) == 0;
        if (have_size && offset > st.st_size) offset = st.st_size > 65536 ? st.st_size - 65536 : 0;
        if (have_size && st.st_size > offset) {
            size_t want = (size_t)(st.st_size - offset);
            if (want > (size_t)req->limit) want = (size_t)req->limit;
            buf = malloc(want ? want : 1);
            if (buf) got = pread(fd, buf, want, offset);
            if (got < 0) got = 0;
        }
        close(fd);
    }
    char next[32];
    snprintf(next, sizeof next, "%lld", (long long)(offset + got));
    enum MHD_Result ret =
        respond(c, 200, "application/octet-stream", buf ? buf : "", (size_t)got, next, state);
    free(buf);
    return ret;
}

static json_t *reading_json(const gpcd_gpu_reading *r, const gpcd_gpu *g) {
    json_t *o = json_object();
    json_object_set_new(o, "index", json_integer(r->index));
    json_object_set_new(o, "name", json_string(r->name));
    json_object_set_new(o, "utilization", json_real(r->util));
    json_object_set_new(o, "memory_used", json_integer((json_int_t)r->mem_used));
    json_object_set_new(o, "memory_total", json_integer((json_int_t)r->mem_total));
    json_object_set_new(o, "temperature", json_real(r->temperature));
    json_object_set_new(o, "slowdown_temperature", json_real(r->slowdown_temperature));
    json_object_set_new(o, "power", json_real(r->power));
    json_object_set_new(o, "power_limit", json_real(r->power_limit));
    json_object_set_new(o, "sm_clock_mhz", json_real(r->sm_clock_mhz));
    json_object_set_new(o, "numa_node", json_integer(r->numa_node));
    json_object_set_new(o, "busy", json_boolean(r->busy));
    json_object_set_new(o, "memory_reserved", json_integer((json_int_t)g->mem_reserved));
    json_object_set_new(o, "exclusive_jobs", json_integer(g->exclusive_jobs));
    json_object_set_new(o, "shared_jobs", json_integer(g->shared_jobs));
    return o;
}

static json_t *alerts_json(const gpcd_alert *alerts, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) {
        json_t *o = json_object();
        json_object_set_new(o, "id", json_integer(alerts[i].id));
        json_object_set_new(o, "gpu", json_integer(alerts[i].gpu));
        json_object_set_new(o, "kind", json_string(gpcd_alert_kind_name(alerts[i].kind)));
        json_object_set_new(o, "since", json_real(alerts[i].since));
        json_object_set_new(o, "message", json_string(alerts[i].message));
        json_array_append_new(a, o);
    }
    return a;
}

static json_t *gpus_json(gpcd_daemon *d) {
    json_t *a = json_array();
    int n;
    const gpcd_gpu_reading *r = gpcd_monitor_readings(d->monitor, &n);
    for (int g = 0; g < n; g++) {
        json_t *o = reading_json(&r[g], &d->cluster.gpu[g]);
        json_object_set_new(o, "drained", json_boolean(d->gpu_drained[g]));
        if (d->gpu_drained[g])
            json_object_set_new(o, "drain_reason", json_string(d->drain_reason[g]));
        json_t *jobs = json_array();
        for (int i = 0; i < d->nactive; i++)
            for (int k = 0; k < d->active[i]->assigned_count; k++)
                if (d->active[i]->state == GPCD_RUNNING && d->active[i]->assigned[k] == g)
                    json_array_append_new(jobs, json_integer(d->active[i]->id));
        json_object_set_new(o, "jobs", jobs);
        json_array_append_new(a, o);
    }
    return a;
}

static void queue_counts(gpcd_daemon *d, int *pending, int *running, double *oldest) {
    *pending = *running = 0;
    *oldest = 0;
    double now = gpc_wall_seconds();
    for (int i = 0; i < d->nactive; i++) {
        if (d->active[i]->state == GPCD_RUNNING)
            (*running)++;
        else if (gpcd_state_is_pending(d->active[i]->state)) {
            (*pending)++;
            if (now - d->active[i]->submit_time > *oldest)
                *oldest = now - d->active[i]->submit_time;
        }
    }
}

static enum MHD_Result handle_status(gpcd_daemon *d, struct MHD_Connection *c,
                                     gpcd_request_kind kind) {
    int64_t counts[GPCD_STATE_COUNT];
    if (gpcd_store_state_counts(d->store, counts) != GPC_OK)
        return respond_error(c, 500, gpc_last_error());
    pthread_mutex_lock(&d->lock);
    json_t *o = json_object();
    if (kind == GPCD_REQ_GPUS) {
        json_object_set_new(o, "provider", json_string(gpcd_monitor_provider(d->monitor)));
        json_object_set_new(o, "gpus", gpus_json(d));
    } else if (kind == GPCD_REQ_ALERTS) {
        int n;
        const gpcd_alert *alerts = gpcd_monitor_alerts(d->monitor, &n);
        json_object_set_new(o, "alerts", alerts_json(alerts, n));
    } else {
        int pending, running, n;
        double oldest;
        queue_counts(d, &pending, &running, &oldest);
        json_object_set_new(o, "version", json_string(GPC_VERSION));
        json_object_set_new(o, "provider", json_string(gpcd_monitor_provider(d->monitor)));
        json_object_set_new(o, "uptime", json_real(gpc_wall_seconds() - d->started_at));
        json_object_set_new(o, "policies", json_string(d->config.policies));
        json_object_set_new(o, "pending", json_integer(pending));
        json_object_set_new(o, "running", json_integer(running));
        json_object_set_new(o, "submitted_total", json_integer(d->submitted_total));
        json_object_set_new(o, "last_pass_seconds", json_real(d->last_pass_seconds));
        json_t *by_state = json_object();
        for (int s = 0; s < GPCD_STATE_COUNT; s++)
            json_object_set_new(by_state, gpcd_state_name((gpcd_state)s), json_integer(counts[s]));
        json_object_set_new(o, "jobs", by_state);
        json_object_set_new(o, "gpus", gpus_json(d));
        const gpcd_alert *alerts = gpcd_monitor_alerts(d->monitor, &n);
        json_object_set_new(o, "alerts", alerts_json(alerts, n));
    }
    pthread_mutex_unlock(&d->lock);
    return respond_json(c, 200, o);
}

static enum MHD_Result handle_metrics(gpcd_daemon *d, struct MHD_Connection *c) {
    gpcd_metrics_input in;
    memset(&in, 0, sizeof in);
    if (gpcd_store_state_counts(d->store, in.jobs_by_state) != GPC_OK)
        return respond_error(c, 500, gpc_last_error());
    pthread_mutex_lock(&d->lock);
    in.gpus = gpcd_monitor_readings(d->monitor, &in.gpu_count);
    in.alerts = gpcd_monitor_alerts(d->monitor, &in.alert_count);
    in.submitted_total = d->submitted_total;
    in.started_total = d->started_total;
    in.preempted_total = d->preempted_total;
    in.last_pass_seconds = d->last_pass_seconds;
    in.uptime_seconds = gpc_wall_seconds() - d->started_at;
    queue_counts(d, &in.pending, &in.running, &in.oldest_wait_seconds);
    char *text = gpcd_metrics_render(&in);
    pthread_mutex_unlock(&d->lock);
    if (!text) return respond_error(c, 500, "out of memory rendering metrics");
    enum MHD_Result ret =
        respond(c, 200, "text/plain; version=0.0.4", text, strlen(text), NULL, NULL);
    free(text);
    return ret;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload_data,
                              size_t *upload_size, void **con_cls) {
    (void)version;
    const api_listener *listener = cls;
    gpcd_daemon *d = listener->daemon;
    api_connection *conn = *con_cls;
    if (!conn) {
        /* the request line and headers are in: the deadline is met */
        mark_request(c, 1);
        int dashboard =
            strcmp(method, "GET") == 0 && (strcmp(url, "/") == 0 || strcmp(url, "/dashboard") == 0);
        if (listener->tcp && !dashboard &&
            !token_matches(d->token,
                           MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization")))
            /* before any body is read: an unauthenticated upload is never buffered */
            return respond_error(c, 401,
                                 "missing or wrong bearer token (send Authorization: Bearer "
                                 "TOKEN, the token in gpcd's token_file)");
        conn = calloc(1, sizeof *conn);
        if (!conn) return MHD_NO;
        *con_cls = conn;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!conn->too_big) {
            if (conn->len + *upload_size > (size_t)d->config.max_body) {
                conn->too_big = 1;
            } else {
                if (conn->len + *upload_size + 1 > conn->cap) {
                    size_t cap = (conn->len + *upload_size + 1) * 2;
                    char *grown = realloc(conn->body, cap);
                    if (!grown) return MHD_NO;
                    conn->body = grown;
                    conn->cap = cap;
                }
                memcpy(conn->body + conn->len, upload_data, *upload_size);
                conn->len += *upload_size;
                conn->body[conn->len] = '\0';
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (strcmp(method, "GET") == 0 && (strcmp(url, "/") == 0 || strcmp(url, "/dashboard") == 0))
        return respond_dashboard(c);
    uid_t caller = d->uid; /* TCP callers passed the token check on the first call */
    if (!listener->tcp && peer_uid(c, &caller) != 0) {
        return respond_error(c, 500, "cannot tell who is calling (SO_PEERCRED failed)");
    }
    if (conn->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "request body is larger than max_body (%d bytes)",
                 d->config.max_body);
        return respond_error(c, 413, msg);
    }
    query_args q = {.count = 0};
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, collect_arg, &q);
    char owner[128], error[1024];
    user_name(caller, owner, sizeof owner);
    gpcd_request req;
    int status = gpcd_request_parse(method, url, q.args, q.count, conn->body, conn->len,
                                    (uint32_t)caller, owner, &req, error, sizeof error);
    if (status != 200) {
        gpcd_request_clear(&req);
        return respond_error(c, (unsigned)status, error);
    }
    enum MHD_Result ret;
    switch (req.kind) {
    case GPCD_REQ_SUBMIT: {
        char body[1024];
        int st = gpcd_daemon_submit(d, req.job, body, sizeof body);
        if (st == 201) {
            req.job = NULL; /* the daemon owns it now */
            ret = respond(c, 201, "application/json", body, strlen(body), NULL, NULL);
        } else {
            ret = respond_error(c, (unsigned)st, body);
        }
        break;
    }
    case GPCD_REQ_LIST:
        ret = handle_list(d, c, &req);
        break;
    case GPCD_REQ_SHOW:
        ret = handle_show(d, c, req.job_id);
        break;
    case GPCD_REQ_LOGS:
        ret = handle_logs(d, c, &req, caller);
        break;
    case GPCD_REQ_CANCEL: {
        char body[512];
        int st = gpcd_daemon_cancel(d, req.job_id, caller, body, sizeof body);
        if (st == 200 || st == 202)
            ret = respond(c, (unsigned)st, "application/json", body, strlen(body), NULL, NULL);
        else
            ret = respond_error(c, (unsigned)st, body);
        break;
    }
    case GPCD_REQ_METRICS:
        ret = handle_metrics(d, c);
        break;
    case GPCD_REQ_GPU_DRAIN:
    case GPCD_REQ_GPU_RESUME: {
        char body[512];
        int st = gpcd_daemon_drain(d, req.gpu, req.kind == GPCD_REQ_GPU_DRAIN, caller, body,
                                   sizeof body);
        ret = st == 200 ? respond(c, 200, "application/json", body, strlen(body), NULL, NULL)
                        : respond_error(c, (unsigned)st, body);
        break;
    }
    default:
        ret = handle_status(d, c, req.kind);
        break;
    }
    gpcd_request_clear(&req);
    return ret;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode code) {
    (void)cls;
    (void)code;
    mark_request(c, 0); /* the next request's headers are due within header_timeout */
    api_connection *conn = *con_cls;
    if (conn) {
        free(conn->body);
        free(conn);
        *con_cls = NULL;
    }
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n')
        line[--n] = '\0';
    gpc_log(GPC_LOG_DEBUG, "http: %s", line);
}

static gpc_status bind_unix(gpcd_daemon *d, int *out) {
    const char *path = d->config.socket;
    /* a socket file may be left over from a gpcd that died; one that answers
     * belongs to a gpcd that is running */
    char in_use[4200];
    snprintf(in_use, sizeof in_use,
             "another gpcd is already running at %s; stop it first or set another socket", path);
    return gpc_listen_unix(path, (unsigned)d->config.socket_mode, in_use, out);
}

static struct MHD_Daemon *start_mhd(api_listener *listener, int listen_fd,
                                    const struct sockaddr_in *addr) {
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (listen_fd >= 0)
        return MHD_start_daemon(flags, 0, NULL, NULL, handle, listener, MHD_OPTION_LISTEN_SOCKET,
                                listen_fd, MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
                                MHD_OPTION_NOTIFY_CONNECTION, notify_connection, listener,
                                MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60,
                                MHD_OPTION_CONNECTION_LIMIT, (unsigned)4096,
                                MHD_OPTION_THREAD_STACK_SIZE, (size_t)GPCD_HTTP_THREAD_STACK,
                                MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
    return MHD_start_daemon(
        flags, ntohs(addr->sin_port), NULL, NULL, handle, listener, MHD_OPTION_SOCK_ADDR, addr,
        MHD_OPTION_NOTIFY_COMPLETED, completed, NULL, MHD_OPTION_NOTIFY_CONNECTION,
        notify_connection, listener, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)1024, MHD_OPTION_THREAD_STACK_SIZE,
        (size_t)GPCD_HTTP_THREAD_STACK, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
}

static gpc_status parse_listen(const char *text, struct sockaddr_in *addr) {
    char host[128];
    const char *colon = strrchr(text, ':');
    if (!colon || (size_t)(colon - text) >= sizeof host)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "listen = '%s' is not HOST:PORT (e.g. 127.0.0.1:8642)", text);
    memcpy(host, text, (size_t)(colon - text));
    host[colon - text] = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    memset(addr, 0, sizeof *addr);
    addr->sin_family = AF_INET;
    addr->sin_port = htons((uint16_t)port);
    if (*end || port < 1 || port > 65535 || inet_pton(AF_INET, host, &addr->sin_addr) != 1)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "listen = '%s' is not IPV4:PORT (e.g. 127.0.0.1:8642)", text);
    return GPC_OK;
}

gpc_status gpcd_api_start(gpcd_daemon *d) {
    api_state *state = calloc(1, sizeof *state);
    if (!state) return gpc_error(GPC_ERR_NOMEM, "out of memory starting the API");
    state->unix_listener.daemon = state->tcp_listener.daemon = d;
    state->tcp_listener.tcp = 1;
    d->api_state = state;
    if (pthread_create(&state->watchdog, NULL, header_watchdog, state) != 0)
        return gpc_error(GPC_ERR_IO, "cannot start the API's watchdog thread");
    state->watchdog_running = 1;
    int fd = -1;
    GPC_TRY(bind_unix(d, &fd));
    d->http_unix = start_mhd(&state->unix_listener, fd, NULL);
    if (!d->http_unix) {
        close(fd);
        unlink(d->config.socket);
        return gpc_error(GPC_ERR_IO, "cannot start the HTTP server on %s", d->config.socket);
    }
    d->listen_fd = fd;
    if (d->config.listen[0]) {
        struct sockaddr_in addr;
        GPC_TRY(parse_listen(d->config.listen, &addr));
        d->http_tcp = start_mhd(&state->tcp_listener, -1, &addr);
        if (!d->http_tcp)
            return gpc_error(GPC_ERR_IO,
                             "cannot listen on %s (in use, or not this host's address?)",
                             d->config.listen);
    }
    return GPC_OK;
}

void gpcd_api_stop(gpcd_daemon *d) {
    if (d->http_tcp) MHD_stop_daemon(d->http_tcp);
    if (d->http_unix) {
        MHD_stop_daemon(d->http_unix); /* closes the listening socket */
        unlink(d->config.socket);
    }
    d->http_tcp = d->http_unix = NULL;
    api_state *state = d->api_state;
    if (state && state->watchdog_running) {
        state->stop = 1;
        pthread_join(state->watchdog, NULL);
    }
    free(d->api_state);
    d->api_state = NULL;
}
