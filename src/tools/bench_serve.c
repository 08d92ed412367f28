/*
 * bench_serve.c: gpc bench serve, a load generator for gpc serve written
 * against plain sockets, so that it needs nothing beyond libgpc (no Python
 * on CI, no libcurl).
 *
 * Each client thread sends one request a connection ("Connection: close",
 * so the response ends at end of file), decodes HTTP/1.1 chunked transfer
 * when the server streams, and stamps each server-sent event when its last
 * byte arrives. Prompts are random token ids (below the vocabulary that
 * /v1/models reports), so their length is exact and no tokenizer is
 * needed; ignore_eos makes every response max_tokens long.
 */
#include "gpc/bench.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct {
    char *data;
    size_t len, cap;
} buffer;

static int buffer_append(buffer *b, const void *bytes, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *grown = realloc(b->data, cap);
        if (!grown) return -1;
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, bytes, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

/* Appends t to the growing array *v of *n values (room for *cap); -1
 * when memory runs out. */
static int push_time(double **v, size_t *n, size_t *cap, double t) {
    if (*n == *cap) {
        size_t grown_cap = *cap ? *cap * 2 : 64;
        double *grown = realloc(*v, grown_cap * sizeof *grown);
        if (!grown) return -1;
        *v = grown;
        *cap = grown_cap;
    }
    (*v)[(*n)++] = t;
    return 0;
}

typedef struct {
    struct sockaddr_in addr;
    char host[128];
    const gpc_bench_serve_options *o;
    int vocab;
    pthread_mutex_t lock;
    int next; /* the next request to send */
    gpc_bench_serve_result *r;
    double *ttft;
    int nttft;
    double *itl;
    size_t nitl, citl;
} bench_state;

static int parse_url(const char *url, struct sockaddr_in *addr, char *host, size_t size) {
    const char *p = strncmp(url, "http://", 7) == 0 ? url + 7 : url;
    const char *colon = strchr(p, ':');
    if (!colon || (size_t)(colon - p) >= size) return -1;
    memcpy(host, p, (size_t)(colon - p));
    host[colon - p] = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if ((*end && *end != '/') || port < 1 || port > 65535) return -1;
    memset(addr, 0, sizeof *addr);
    addr->sin_family = AF_INET;
    addr->sin_port = htons((uint16_t)port);
    const char *ip = strcmp(host, "localhost") == 0 ? "127.0.0.1" : host;
    return inet_pton(AF_INET, ip, &addr->sin_addr) == 1 ? 0 : -1;
}

/* Decodes the chunked bytes of raw[*pos..] into out; returns 1 at the last
 * chunk, 0 when more bytes are needed. */
static int dechunk(const buffer *raw, size_t *pos, buffer *out) {
    for (;;) {
        char *line_end = strstr(raw->data + *pos, "\r\n");
        if (!line_end) return 0;
        size_t size = strtoul(raw->data + *pos, NULL, 16);
        size_t start = (size_t)(line_end - raw->data) + 2;
        if (size == 0) return 1;
        if (start + size + 2 > raw->len) return 0;
        if (buffer_append(out, raw->data + start, size)) return 0;
        *pos = start + size + 2;
    }
}

/* One HTTP exchange: writes request, reads to end of file. on_bytes (when
 * not NULL) is called after each read with the body decoded so far. */
typedef void (*body_progress)(void *user, const buffer *body, double now);

static int exchange(const bench_state *s, const char *method, const char *path, const char *body,
                    int *status, buffer *out, body_progress on_bytes, void *user) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (const struct sockaddr *)&s->addr, sizeof s->addr) != 0) {
        close(fd);
        return -1;
    }
    char head[1024];
    size_t body_len = body ? strlen(body) : 0;
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n%s%s%s"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, path, s->host, s->o->token ? "Authorization: Bearer " : "",
                     s->o->token ? s->o->token : "", s->o->token ? "\r\n" : "", body_len);
    buffer req = {0};
    int rc =
        buffer_append(&req, head, (size_t)n) || (body_len && buffer_append(&req, body, body_len));
    for (size_t sent = 0; !rc && sent < req.len;) {
        ssize_t w = send(fd, req.data + sent, req.len - sent, MSG_NOSIGNAL);
        if (w <= 0)
            rc = -1;
        else
            sent += (size_t)w;
    }
    free(req.data);
    buffer raw = {0};
    size_t body_start = 0, chunk_pos = 0;
    int chunked = 0;
    char block[16384];
    while (!rc) {
        ssize_t got = recv(fd, block, sizeof block, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        if (buffer_append(&raw, block, (size_t)got)) {
            rc = -1; /* out of memory: raw holds nothing to parse */
            break;
        }
        double now = gpc_time_seconds();
        if (!body_start) {
            char *end = strstr(raw.data, "\r\n\r\n");
            if (!end) continue;
            body_start = (size_t)(end - raw.data) + 4;
            *status = atoi(raw.data + 9);
            *end = '\0';
            for (char *p = raw.data; *p; p++)
                if (*p >= 'A' && *p <= 'Z') *p = (char)(*p - 'A' + 'a');
            chunked = strstr(raw.data, "transfer-encoding: chunked") != NULL;
            *end = '\r';
            chunk_pos = body_start;
        }
        if (chunked) {
            dechunk(&raw, &chunk_pos, out);
        } else {
            out->len = 0;
            buffer_append(out, raw.data + body_start, raw.len - body_start);
        }
        if (on_bytes) on_bytes(user, out, now);
    }
    close(fd);
    free(raw.data);
    if (!body_start) return -1;
    if (!out->data) buffer_append(out, "", 0);
    return rc;
}

/* The events of a stream that carry tokens, stamped as they complete. A
 * server may send several ready tokens in one event (at most as many
 * events as tokens, then), and a last event of usage alone. */
typedef struct {
    size_t scanned;
    double first; /* the first event of any kind; 0 before it */
    double *times;
    size_t count, cap;
} stream_watch;

/* Whether one event's JSON carries tokens: gpc serve's gpc_token_ids, or
 * the text of a server that does not send them. */
static int carries_tokens(const char *json, size_t len) {
    json_t *root = json_loadb(json, len, 0, NULL);
    json_t *choice = json_array_get(json_object_get(root, "choices"), 0);
    json_t *ids = json_object_get(choice, "gpc_token_ids");
    json_t *text = json_object_get(choice, "text");
    int yes = json_is_array(ids) ? json_array_size(ids) > 0
                                 : json_is_string(text) && json_string_length(text) > 0;
    json_decref(root);
    return yes;
}

static void watch_events(void *user, const buffer *body, double now) {
    stream_watch *w = user;
    char *p;
    if (!body->data) return; /* headers only, so far */
    while ((p = strstr(body->data + w->scanned, "\n\n")) != NULL) {
        const char *event = body->data + w->scanned;
        w->scanned = (size_t)(p - body->data) + 2;
        if (strncmp(event, "data: {", 7) != 0) continue;
        if (!w->first) w->first = now;
        if (!carries_tokens(event + 6, (size_t)(p - event) - 6)) continue;
        if (push_time(&w->times, &w->count, &w->cap, now)) return;
    }
}

/* The completion tokens a response's usage reports (the last event of a stream). */
static long usage_tokens(const buffer *body, int stream) {
    const char *json = body->data;
    if (stream) {
        const char *last = NULL;
        for (const char *p = body->data; (p = strstr(p, "data: {")) != NULL; p += 7)
            last = p + 6;
        json = last;
    }
    if (!json) return -1;
    json_t *root = json_loads(json, JSON_DISABLE_EOF_CHECK, NULL);
    json_t *t = json_object_get(json_object_get(root, "usage"), "completion_tokens");
    long n = json_is_integer(t) ? (long)json_integer_value(t) : -1;
    json_decref(root);
    return n;
}

static void *client(void *arg) {
    bench_state *s = arg;
    const gpc_bench_serve_options *o = s->o;
    gpc_rng rng;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        int k = s->next < o->requests ? s->next++ : -1;
        pthread_mutex_unlock(&s->lock);
        if (k < 0) break;
        gpc_rng_seed(&rng, (uint64_t)k, 0x62656e6368ULL); /* "bench" */
        buffer body = {0};
        char piece[64];
        buffer_append(&body, "{\"prompt\":[", 11);
        for (int i = 0; i < o->prompt_tokens; i++) {
            int len = snprintf(piece, sizeof piece, "%s%u", i ? "," : "",
                               gpc_rng_below(&rng, (uint32_t)(s->vocab > 1 ? s->vocab - 1 : 1)));
            buffer_append(&body, piece, (size_t)len);
        }
        int len =
            snprintf(piece, sizeof piece,
                     "],\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,", o->max_tokens);
        buffer_append(&body, piece, (size_t)len);
        buffer_append(&body, o->stream ? "\"stream\":true}" : "\"stream\":false}",
                      o->stream ? 14 : 15);
        stream_watch w = {0};
        buffer out = {0};
        int status = 0;
        double t0 = gpc_time_seconds();
        int rc = exchange(s, "POST", "/v1/completions", body.data, &status, &out,
                          o->stream ? watch_events : NULL, &w);
        double t1 = gpc_time_seconds();
        long tokens = rc == 0 && status == 200 ? usage_tokens(&out, o->stream) : -1;
        pthread_mutex_lock(&s->lock);
        if (status == 200 && tokens >= 0) {
            s->r->ok++;
            s->r->completion_tokens += (uint64_t)tokens;
            s->r->events += w.count;
            s->ttft[s->nttft++] = (w.count ? w.times[0] : w.first ? w.first : t1) - t0;
            for (size_t i = 1; i < w.count; i++)
                if (push_time(&s->itl, &s->nitl, &s->citl, w.times[i] - w.times[i - 1])) break;
        } else {
            if (status == 503)
                s->r->busy++;
            else
                s->r->failed++;
            if (!s->r->first_error[0])
                snprintf(s->r->first_error, sizeof s->r->first_error, "status %d: %.200s", status,
                         out.data ? out.data : "no response");
        }
        pthread_mutex_unlock(&s->lock);
        free(w.times);
        free(out.data);
        free(body.data);
    }
    return NULL;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double percentile(double *v, size_t n, double p) {
    if (n == 0) return -1;
    qsort(v, n, sizeof *v, by_value);
    size_t k = (size_t)(p * (double)(n - 1) + 0.5);
    return v[k];
}

/* The server's busy seconds and uptime from /metrics; -1 when absent. */
static void server_busy(const bench_state *s, double *busy, double *wall) {
    *busy = *wall = -1;
    buffer out = {0};
    int status = 0;
    if (exchange(s, "GET", "/metrics", NULL, &status, &out, NULL, NULL) == 0 && status == 200) {
        static const char busy_name[] = "\ngpc_serve_busy_seconds_total ",
                          wall_name[] = "\ngpc_serve_uptime_seconds ";
        const char *b = strstr(out.data, busy_name), *w = strstr(out.data, wall_name);
        if (b && w) {
            *busy = strtod(b + sizeof busy_name - 1, NULL);
            *wall = strtod(w + sizeof wall_name - 1, NULL);
        }
    }
    free(out.data);
}

/* Runs the requests of s->o over concurrency client threads; returns the
 * threads that started. */
static int run_clients(bench_state *s, pthread_t *threads, int concurrency) {
    int started = 0;
    for (; started < concurrency; started++)
        if (pthread_create(&threads[started], NULL, client, s) != 0) break;
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    return started;
}

/* The warm-up requests, sent as the measured ones are and forgotten. */
static void warm_up(const bench_state *measured, pthread_t *threads) {
    const gpc_bench_serve_options *o = measured->o;
    gpc_bench_serve_options wo = *o;
    wo.requests = o->warmup;
    gpc_bench_serve_result ignored;
    memset(&ignored, 0, sizeof ignored);
    bench_state w = *measured;
    w.o = &wo;
    w.r = &ignored;
    w.next = w.nttft = 0;
    w.itl = NULL;
    w.nitl = w.citl = 0;
    w.ttft = calloc((size_t)wo.requests, sizeof *w.ttft);
    if (!w.ttft) return;
    pthread_mutex_init(&w.lock, NULL);
    run_clients(&w, threads, o->concurrency < o->warmup ? o->concurrency : o->warmup);
    pthread_mutex_destroy(&w.lock);
    free(w.ttft);
    free(w.itl);
}

gpc_status gpc_bench_serve(const gpc_bench_serve_options *o, gpc_bench_serve_result *r) {
    memset(r, 0, sizeof *r);
    if (o->concurrency < 1 || o->requests < 1 || o->prompt_tokens < 1 || o->max_tokens < 1)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "concurrency, requests, prompt tokens and max tokens must be positive");
    if (o->warmup < 0)
        return gpc_error(GPC_ERR_INVALID_ARG, "warm-up requests must not be negative, not %d",
                         o->warmup);
    bench_state s;
    memset(&s, 0, sizeof s);
    s.o = o;
    s.r = r;
    if (parse_url(o->url, &s.addr, s.host, sizeof s.host) != 0)
        return gpc_error(GPC_ERR_INVALID_ARG, "--url %s is not http://IPV4:PORT", o->url);
    buffer models = {0};
    int status = 0;
    if (exchange(&s, "GET", "/v1/models", NULL, &status, &models, NULL, NULL) != 0 ||
        status != 200) {
        free(models.data);
        return gpc_error(GPC_ERR_IO,
                         "no server answers GET %s/v1/models (status %d); start gpc "
                         "serve first",
                         o->url, status);
    }
    json_t *root = json_loads(models.data, 0, NULL);
    json_t *v = json_object_get(json_array_get(json_object_get(root, "data"), 0), "gpc_vocab_size");
    s.vocab = json_is_integer(v) ? (int)json_integer_value(v) : 50257;
    json_decref(root);
    free(models.data);
    s.ttft = calloc((size_t)o->requests, sizeof *s.ttft);
    pthread_t *threads = calloc((size_t)o->concurrency, sizeof *threads);
    if (!s.ttft || !threads) {
        free(s.ttft);
        free(threads);
        return gpc_error(GPC_ERR_NOMEM, "out of memory for %d requests", o->requests);
    }
    pthread_mutex_init(&s.lock, NULL);
    if (o->warmup > 0) warm_up(&s, threads);
    double busy0, wall0, busy1, wall1;
    server_busy(&s, &busy0, &wall0);
    double t0 = gpc_time_seconds();
    int started = run_clients(&s, threads, o->concurrency);
    r->seconds = gpc_time_seconds() - t0;
    server_busy(&s, &busy1, &wall1);
    r->concurrency = o->concurrency;
    r->requests = o->requests;
    r->tokens_per_second = r->seconds > 0 ? (double)r->completion_tokens / r->seconds : 0;
    r->ttft_p50 = percentile(s.ttft, (size_t)s.nttft, 0.50);
    r->ttft_p99 = percentile(s.ttft, (size_t)s.nttft, 0.99);
    r->itl_p50 = o->stream ? percentile(s.itl, s.nitl, 0.50) : -1;
    r->itl_p99 = o->stream ? percentile(s.itl, s.nitl, 0.99) : -1;
    r->server_busy_fraction =
        busy0 >= 0 && busy1 >= 0 && wall1 > wall0 ? (busy1 - busy0) / (wall1 - wall0) : -1;
    pthread_mutex_destroy(&s.lock);
    free(s.ttft);
    free(s.itl);
    free(threads);
    if (started == 0) return gpc_error(GPC_ERR_IO, "cannot start client threads");
    return GPC_OK;
}
