/*
 * http.c: gpc serve's HTTP front end (gpc/server.h), served by
 * libmicrohttpd with one thread per connection, as gpcd's API is.
 *
 * The engine thread never waits for a client. Its callback only appends
 * the token and its time to the request's buffer (allocated at submit, so
 * the engine thread allocates nothing) and signals a condition variable.
 * The connection's thread then detokenizes, matches stop strings, records
 * latencies and writes: a slow client delays itself alone.
 *
 * A request's state is shared by the engine (until its final event), the
 * connection (until libmicrohttpd's request-completed callback) and, when
 * streaming, the response (until its free callback); the last of the three
 * frees it. A client that goes away is seen either by a failed write or,
 * while its thread waits for tokens, by polling its socket for a hang-up
 * every WAIT_SLICE; either way its request is cancelled, so the engine frees
 * its cache blocks at the next step.
 *
 * Endpoints: POST /v1/completions, GET /v1/models, GET /health and GET
 * /metrics (Prometheus text format 0.0.4). docs/serve.md is the reference.
 */
#define _GNU_SOURCE /* POLLRDHUP */
#include "gpc/server.h"
#include "serve/http_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define WAIT_SLICE_NS 50000000L /* 50 ms: how soon a vanished client is noticed */

/* ---------------------------------------------------------------- metrics */

static const int STATUS_CODES[] = {200, 400, 401, 404, 405, 413, 500, 503};
#define NUM_CODES ((int)(sizeof STATUS_CODES / sizeof STATUS_CODES[0]))
/* Latency buckets in seconds: a GPU step is ~1-10 ms, a CPU one 1-100 ms. */
static const double TTFT_BUCKETS[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
static const double ITL_BUCKETS[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};
#define NUM_TTFT ((int)(sizeof TTFT_BUCKETS / sizeof TTFT_BUCKETS[0]))
#define NUM_ITL ((int)(sizeof ITL_BUCKETS / sizeof ITL_BUCKETS[0]))
#define RATE_SECONDS 16 /* tokens/s is the mean of the last 10 whole seconds */

typedef struct {
    uint64_t counts[16];
    uint64_t total;
    double sum;
} histogram;

typedef struct {
    pthread_mutex_t lock;
    uint64_t by_status[NUM_CODES + 1]; /* the last: any other status */
    histogram ttft, itl;
    uint64_t tokens_sent;
    uint64_t cancelled; /* requests whose client left before their end */
    int64_t rate_second[RATE_SECONDS];
    uint64_t rate_tokens[RATE_SECONDS];
} metrics;

static void histogram_add(histogram *h, const double *bounds, int n, double value) {
    for (int i = 0; i < n; i++)
        if (value <= bounds[i]) h->counts[i]++;
    h->total++;
    h->sum += value;
}

/* ----------------------------------------------------------------- server */

struct gpc_server {
    gpc_engine *engine;
    const gpc_tokenizer *tok;
    gpc_engine_model_info model;
    gpc_server_options options;
    char model_name[256];
    char token[256];
    int has_token;
    char address[300];
    char socket_path[108];
    struct MHD_Daemon *mhd;
    int listen_fd;
    volatile int draining;
    pthread_mutex_t lock; /* active, next_id */
    pthread_cond_t idle;
    int active; /* completions a connection still holds */
    uint64_t seed_counter;
    metrics m;
};

/* One completion: the buffer the engine fills and the connection drains. */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int refs;
    /* written by the engine callback under lock */
    int32_t *tokens;
    double *times;
    size_t count, cap;
    int finished;
    gpc_finish_reason finish;
    char message[256];
    /* the connection's own */
    gpc_server *server;
    uint64_t id;
    int submitted;
    http_completion_request req;
    http_detok detok;
    size_t prompt_tokens, read;
    double arrived, last_time;
    int done;                 /* nothing more will be produced */
    gpc_finish_reason reason; /* why, once done */
    int64_t skip_token;       /* the eos that ended it: no text */
    http_text text;           /* the whole text (non-streaming) or the next chunk's */
    json_t *ids;              /* the generated ids (non-streaming) or the next chunk's */
    http_text out;            /* streaming: bytes not yet given to libmicrohttpd */
    size_t out_pos;
    int sent_done, fd;
    long long created;
    char name[40];
} completion;

/* The state of one request on its connection. */
typedef struct {
    int route;
    http_text body;
    int too_big;
    int counted; /* in the server's count of active completions */
    completion *job;
} request_state;

enum { ROUTE_NONE, ROUTE_COMPLETIONS, ROUTE_MODELS, ROUTE_HEALTH, ROUTE_METRICS };

static void completion_release(completion *c) {
    pthread_mutex_lock(&c->lock);
    int left = --c->refs;
    pthread_mutex_unlock(&c->lock);
    if (left) return;
    http_detok_free(&c->detok);
    http_completion_clear(&c->req);
    http_text_free(&c->text);
    http_text_free(&c->out);
    json_decref(c->ids);
    free(c->tokens);
    free(c->times);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond);
    free(c);
}

/* On the engine thread: queue the token, wake the connection; nothing else. */
static void on_event(void *user, const gpc_engine_event *e) {
    completion *c = user;
    double now = gpc_time_seconds();
    pthread_mutex_lock(&c->lock);
    if (e->token >= 0 && c->count < c->cap) {
        c->tokens[c->count] = e->token;
        c->times[c->count++] = now;
    }
    if (e->finish != GPC_FINISH_NONE) {
        c->finished = 1;
        c->finish = e->finish;
        if (e->message) snprintf(c->message, sizeof c->message, "%s", e->message);
    }
    pthread_cond_signal(&c->cond);
    pthread_mutex_unlock(&c->lock);
    if (e->finish != GPC_FINISH_NONE) completion_release(c); /* the engine's reference */
}

static int client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

static void rate_add(metrics *m, double now, uint64_t n) {
    int64_t second = (int64_t)now;
    int slot = (int)(second % RATE_SECONDS);
    if (m->rate_second[slot] != second) {
        m->rate_second[slot] = second;
        m->rate_tokens[slot] = 0;
    }
    m->rate_tokens[slot] += n;
}

/* Turns the tokens that arrived into text; records latencies. */
static int consume(completion *c, size_t upto, int finished, gpc_finish_reason finish) {
    gpc_server *s = c->server;
    size_t first = c->read;
    for (size_t i = first; i < upto && !c->done; i++) {
        uint32_t token = (uint32_t)c->tokens[i];
        c->read = i + 1;
        if (c->ids) json_array_append_new(c->ids, json_integer(token));
        int last = finished && i + 1 == upto;
        if (last && finish == GPC_FINISH_EOS && (int64_t)token == c->skip_token) continue;
        int rc = http_detok_token(&c->detok, token, &c->text);
        if (rc < 0) return -1;
        if (rc == 1) {
            c->done = 1;
            c->reason = GPC_FINISH_STOP;
            gpc_engine_cancel(s->engine, c->id, GPC_FINISH_STOP);
        }
    }
    if (!c->done && finished && c->read == upto) {
        if (http_detok_finish(&c->detok, &c->text)) return -1;
        c->done = 1;
        c->reason = finish;
    }
    pthread_mutex_lock(&s->m.lock);
    for (size_t i = first; i < c->read; i++) {
        if (i == 0)
            histogram_add(&s->m.ttft, TTFT_BUCKETS, NUM_TTFT, c->times[0] - c->arrived);
        else
            histogram_add(&s->m.itl, ITL_BUCKETS, NUM_ITL, c->times[i] - c->times[i - 1]);
    }
    s->m.tokens_sent += c->read - first;
    if (c->read > first) rate_add(&s->m, gpc_time_seconds(), c->read - first);
    pthread_mutex_unlock(&s->m.lock);
    return 0;
}

/* Waits for tokens (polling for a hang-up meanwhile) and consumes them.
 * Returns 0 with something new or the end reached, -1 when the client went
 * away or memory ran out. */
static int pump(completion *c) {
    pthread_mutex_lock(&c->lock);
    while (c->read == c->count && !c->finished) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += WAIT_SLICE_NS;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        if (pthread_cond_timedwait(&c->cond, &c->lock, &until) == ETIMEDOUT && client_gone(c->fd)) {
            pthread_mutex_unlock(&c->lock);
            return -1;
        }
    }
    size_t upto = c->count;
    int finished = c->finished;
    gpc_finish_reason finish = c->finish;
    pthread_mutex_unlock(&c->lock);
    /* tokens [read, upto) were written before the unlock: safe to read */
    return consume(c, upto, finished, finish);
}

/* ------------------------------------------------------------- responses */

static void count_status(gpc_server *s, unsigned status) {
    int k = NUM_CODES;
    for (int i = 0; i < NUM_CODES; i++)
        if ((unsigned)STATUS_CODES[i] == status) k = i;
    pthread_mutex_lock(&s->m.lock);
    s->m.by_status[k]++;
    pthread_mutex_unlock(&s->m.lock);
}

static enum MHD_Result respond(gpc_server *s, struct MHD_Connection *conn, unsigned status,
                               const char *type, const char *body, size_t len) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (status == 503) {
        char secs[16];
        snprintf(secs, sizeof secs, "%d", s->options.retry_after);
        MHD_add_response_header(r, "Retry-After", secs);
    }
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    count_status(s, status);
    return ret;
}

static enum MHD_Result respond_error(gpc_server *s, struct MHD_Connection *conn, unsigned status,
                                     const char *message) {
    char *body = http_error_body((int)status, message);
    if (!body) return MHD_NO;
    enum MHD_Result ret = respond(s, conn, status, "application/json", body, strlen(body));
    free(body);
    return ret;
}

static enum MHD_Result respond_json(gpc_server *s, struct MHD_Connection *conn, unsigned status,
                                    json_t *value) {
    char *text = json_dumps(value, JSON_COMPACT);
    json_decref(value);
    if (!text) return respond_error(s, conn, 500, "cannot encode the response");
    size_t n = strlen(text);
    char *line = realloc(text, n + 2);
    if (!line) {
        free(text);
        return MHD_NO;
    }
    line[n] = '\n';
    enum MHD_Result ret = respond(s, conn, status, "application/json", line, n + 1);
    free(line);
    return ret;
}

static json_t *usage_json(const completion *c) {
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer((json_int_t)c->prompt_tokens));
    json_object_set_new(u, "completion_tokens", json_integer((json_int_t)c->read));
    json_object_set_new(u, "total_tokens", json_integer((json_int_t)(c->prompt_tokens + c->read)));
    return u;
}

/* One completion object: the whole response, or a chunk of the stream. */
static json_t *completion_json(completion *c, int final, int with_usage) {
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(0));
    json_object_set_new(choice, "text",
                        json_stringn(c->text.data ? c->text.data : "", c->text.len));
    json_object_set_new(choice, "logprobs", json_null());
    if (final) {
        json_object_set_new(choice, "finish_reason", json_string(http_openai_finish(c->reason)));
        json_object_set_new(choice, "gpc_finish_reason",
                            json_string(gpc_finish_reason_name(c->reason)));
    } else {
        json_object_set_new(choice, "finish_reason", json_null());
    }
    json_object_set_new(choice, "gpc_token_ids", c->ids);
    c->ids = json_array();
    json_t *choices = json_array();
    json_array_append_new(choices, choice);
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(c->name));
    json_object_set_new(o, "object", json_string("text_completion"));
    json_object_set_new(o, "created", json_integer(c->created));
    json_object_set_new(o, "model", json_string(c->server->model_name));
    json_object_set_new(o, "choices", choices);
    if (with_usage) json_object_set_new(o, "usage", usage_json(c));
    c->text.len = 0;
    if (c->text.data) c->text.data[0] = '\0';
    return o;
}

/* Appends "data: {...}\n\n" to the stream's pending bytes. */
static int sse_append(completion *c, json_t *o) {
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!text) return -1;
    int rc = http_text_append(&c->out, "data: ", 6) ||
             http_text_append(&c->out, text, strlen(text)) || http_text_append(&c->out, "\n\n", 2);
    free(text);
    return rc ? -1 : 0;
}

/* libmicrohttpd asks for the stream's next bytes; blocking here is fine,
 * since this connection has its own thread. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    completion *c = cls;
    while (c->out_pos == c->out.len) {
        c->out.len = c->out_pos = 0;
        if (c->sent_done) return MHD_CONTENT_READER_END_OF_STREAM;
        if (c->done) {
            if (c->reason == GPC_FINISH_ERROR) {
                char msg[300];
                snprintf(msg, sizeof msg, "generation failed: %s", c->message);
                char *body = http_error_body(500, msg);
                int rc = !body || http_text_append(&c->out, "data: ", 6) ||
                         http_text_append(&c->out, body, strlen(body) - 1) ||
                         http_text_append(&c->out, "\n\n", 2);
                free(body);
                if (rc) return MHD_CONTENT_READER_END_WITH_ERROR;
            } else if (sse_append(c, completion_json(c, 1, 1))) {
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            if (http_text_append(&c->out, "data: [DONE]\n\n", 14))
                return MHD_CONTENT_READER_END_WITH_ERROR;
            c->sent_done = 1;
            break;
        }
        if (pump(c) < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (!c->done && (c->text.len || json_array_size(c->ids)) &&
            sse_append(c, completion_json(c, 0, 0)))
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = c->out.len - c->out_pos;
    if (n > max) n = max;
    memcpy(buf, c->out.data + c->out_pos, n);
    c->out_pos += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    completion_release(cls);
}

/* ---------------------------------------------------------- completions */

static int tokenize(gpc_server *s, http_completion_request *req, uint32_t **ids, size_t *count,
                    char *error, size_t size) {
    if (!req->has_text) {
        *ids = req->prompt_ids;
        *count = req->prompt_ids_len;
        return 0;
    }
    if (!s->tok) {
        snprintf(error, size, "this run has no tokenizer: send 'prompt' as an array of token ids");
        return 400;
    }
    if (req->prompt_text_len == 0) {
        /* an empty prompt starts a fresh text, as after a document's end */
        if (s->model.eos_token < 0) {
            snprintf(error, size, "'prompt' is empty and the model has no end-of-text token");
            return 400;
        }
        req->prompt_ids = malloc(sizeof *req->prompt_ids);
        if (!req->prompt_ids) return 500;
        req->prompt_ids[0] = (uint32_t)s->model.eos_token;
        req->prompt_ids_len = 1;
    } else {
        uint32_t *encoded = NULL;
        size_t n = 0;
        if (gpc_tokenizer_encode(s->tok, req->prompt_text, req->prompt_text_len, &encoded, &n) !=
            GPC_OK) {
            snprintf(error, size, "cannot tokenize the prompt: %s", gpc_last_error());
            return 400;
        }
        /* the request frees its ids with free(), the tokenizer's are gpc_malloc'd */
        req->prompt_ids = malloc((n ? n : 1) * sizeof *req->prompt_ids);
        if (req->prompt_ids && n) memcpy(req->prompt_ids, encoded, n * sizeof *encoded);
        req->prompt_ids_len = n;
        gpc_free(encoded);
        if (!req->prompt_ids) return 500;
    }
    *ids = req->prompt_ids;
    *count = req->prompt_ids_len;
    return 0;
}

static enum MHD_Result handle_completion(gpc_server *s, struct MHD_Connection *conn,
                                         request_state *st) {
    char error[512];
    completion *c = calloc(1, sizeof *c);
    if (!c) return respond_error(s, conn, 500, "out of memory");
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    c->refs = 1;
    c->server = s;
    c->fd = -1;
    c->skip_token = s->model.eos_token;
    c->arrived = gpc_time_seconds();
    c->created = (long long)time(NULL);
    st->job = c; /* the connection's reference, released when the request completes */
    int status = http_completion_parse(st->body.data, st->body.len, s->model.vocab_size, &c->req,
                                       error, sizeof error);
    if (status) return respond_error(s, conn, (unsigned)status, error);
    if (c->req.stop_count && !s->tok)
        return respond_error(s, conn, 400,
                             "'stop' needs text, and this run has no tokenizer; leave it out");
    uint32_t *ids;
    size_t count;
    if ((status = tokenize(s, &c->req, &ids, &count, error, sizeof error)))
        return respond_error(s, conn, (unsigned)status, error);
    if (count > (size_t)s->model.context) {
        snprintf(error, sizeof error,
                 "the prompt has %zu tokens; the model's context holds %d: shorten it", count,
                 s->model.context);
        return respond_error(s, conn, 400, error);
    }
    c->prompt_tokens = count;
    /* the engine's events can never exceed the tokens that fit the context */
    size_t room = (size_t)s->model.context - count + 2;
    c->cap = (size_t)c->req.max_tokens + 1 < room ? (size_t)c->req.max_tokens + 1 : room;
    c->tokens = malloc(c->cap * sizeof *c->tokens);
    c->times = malloc(c->cap * sizeof *c->times);
    c->ids = json_array();
    if (!c->tokens || !c->times || !c->ids) return respond_error(s, conn, 500, "out of memory");
    http_detok_init(&c->detok, s->tok, s->model.eos_token, &c->req);
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (info) c->fd = info->connect_fd;

    gpc_engine_request r;
    gpc_engine_request_init(&r);
    r.prompt = ids;
    r.prompt_len = count;
    r.max_tokens = c->req.max_tokens;
    r.temperature = c->req.temperature;
    r.top_k = c->req.top_k;
    r.top_p = c->req.top_p;
    pthread_mutex_lock(&s->lock);
    /* no seed: each request its own stream, different from its neighbours' */
    r.seed = c->req.has_seed ? c->req.seed
                             : (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ULL + ++s->seed_counter;
    pthread_mutex_unlock(&s->lock);
    r.eos_token = s->model.eos_token;
    r.ignore_eos = c->req.ignore_eos;
    r.min_tokens = c->req.min_tokens;
    r.callback = on_event;
    r.user = c;
    c->refs = 2; /* the engine's, released at its final event */
    gpc_status sub = s->draining ? GPC_ERR_INTERRUPTED : gpc_engine_submit(s->engine, &r, &c->id);
    if (sub != GPC_OK) {
        c->refs = 1;
        if (sub == GPC_ERR_BUSY)
            return respond_error(s, conn, 503, "the server's queue is full; retry later");
        if (sub == GPC_ERR_INTERRUPTED)
            return respond_error(s, conn, 503, "the server is shutting down");
        snprintf(error, sizeof error, "%s", gpc_last_error());
        return respond_error(s, conn, sub == GPC_ERR_INVALID_ARG ? 400 : 500, error);
    }
    c->submitted = 1;
    snprintf(c->name, sizeof c->name, "cmpl-%llu", (unsigned long long)c->id);
    if (c->req.stream) {
        pthread_mutex_lock(&c->lock);
        c->refs++; /* the response's */
        pthread_mutex_unlock(&c->lock);
        struct MHD_Response *resp =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, c, stream_free);
        if (!resp) {
            completion_release(c);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        enum MHD_Result ret = MHD_queue_response(conn, 200, resp);
        MHD_destroy_response(resp);
        count_status(s, 200);
        return ret;
    }
    while (!c->done)
        if (pump(c) < 0) return MHD_NO; /* gone: request_completed cancels it */
    if (c->reason == GPC_FINISH_ERROR) {
        snprintf(error, sizeof error, "generation failed: %s", c->message);
        return respond_error(s, conn, 500, error);
    }
    return respond_json(s, conn, 200, completion_json(c, 1, 1));
}

/* ------------------------------------------------------- other endpoints */

static enum MHD_Result handle_models(gpc_server *s, struct MHD_Connection *conn) {
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(s->model_name));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer(0));
    json_object_set_new(m, "owned_by", json_string("gpc"));
    json_object_set_new(m, "max_model_len", json_integer(s->model.context));
    json_object_set_new(m, "gpc_vocab_size", json_integer(s->model.vocab_size));
    json_object_set_new(m, "gpc_eos_token", json_integer(s->model.eos_token));
    json_object_set_new(m, "gpc_tokenizer",
                        s->tok
                            ? json_string(gpc_tokenizer_kind_name(gpc_tokenizer_get_kind(s->tok)))
                            : json_null());
    json_t *data = json_array();
    json_array_append_new(data, m);
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", data);
    return respond_json(s, conn, 200, o);
}

static void put_histogram(http_text *t, const char *name, const char *help, const histogram *h,
                          const double *bounds, int n) {
    char line[256];
    snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    http_text_append(t, line, strlen(line));
    for (int i = 0; i < n; i++) {
        snprintf(line, sizeof line, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i],
                 (unsigned long long)h->counts[i]);
        http_text_append(t, line, strlen(line));
    }
    snprintf(line, sizeof line, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
             (unsigned long long)h->total, name, h->sum, name, (unsigned long long)h->total);
    http_text_append(t, line, strlen(line));
}

static void put_metric(http_text *t, const char *name, const char *type, const char *help,
                       double value) {
    char line[512];
    snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type,
             name, value);
    http_text_append(t, line, strlen(line));
}

static enum MHD_Result handle_metrics(gpc_server *s, struct MHD_Connection *conn) {
    gpc_engine_stats es;
    gpc_engine_get_stats(s->engine, &es);
    http_text t = {0};
    char line[256];
    metrics m;
    pthread_mutex_lock(&s->m.lock);
    memcpy(&m, &s->m, sizeof m);
    pthread_mutex_unlock(&s->m.lock);
    static const char requests_head[] =
        "# HELP gpc_serve_requests_total HTTP responses by status code\n"
        "# TYPE gpc_serve_requests_total counter\n";
    http_text_append(&t, requests_head, sizeof requests_head - 1);
    for (int i = 0; i <= NUM_CODES; i++) {
        if (i < NUM_CODES)
            snprintf(line, sizeof line, "gpc_serve_requests_total{code=\"%d\"} %llu\n",
                     STATUS_CODES[i], (unsigned long long)m.by_status[i]);
        else
            snprintf(line, sizeof line, "gpc_serve_requests_total{code=\"other\"} %llu\n",
                     (unsigned long long)m.by_status[i]);
        http_text_append(&t, line, strlen(line));
    }
    put_metric(&t, "gpc_serve_queue_depth", "gauge", "requests waiting for a batch slot",
               (double)es.waiting);
    put_metric(&t, "gpc_serve_running_sequences", "gauge", "sequences in the running batch",
               (double)es.running);
    put_metric(&t, "gpc_serve_tokens_generated_total", "counter", "tokens the engine generated",
               (double)es.tokens_generated);
    put_metric(&t, "gpc_serve_prompt_tokens_total", "counter", "prompt tokens the engine read",
               (double)es.prompt_tokens);
    put_metric(&t, "gpc_serve_engine_requests_total", "counter", "requests the engine admitted",
               (double)es.requests_total);
    put_metric(&t, "gpc_serve_steps_total", "counter", "engine steps", (double)es.steps);
    put_metric(&t, "gpc_serve_preemptions_total", "counter",
               "sequences preempted for cache blocks (recomputed later)", (double)es.preemptions);
    int64_t now = (int64_t)gpc_time_seconds();
    uint64_t recent = 0;
    for (int i = 0; i < RATE_SECONDS; i++)
        if (m.rate_second[i] >= now - 10 && m.rate_second[i] < now) recent += m.rate_tokens[i];
    put_metric(&t, "gpc_serve_tokens_per_second", "gauge",
               "tokens sent to clients a second, over the last 10 s", (double)recent / 10.0);
    put_metric(&t, "gpc_serve_tokens_sent_total", "counter", "tokens sent to clients",
               (double)m.tokens_sent);
    put_metric(&t, "gpc_serve_cancelled_total", "counter",
               "requests cancelled because their client went away", (double)m.cancelled);
    put_histogram(&t, "gpc_serve_time_to_first_token_seconds",
                  "from a request's arrival to its first token", &m.ttft, TTFT_BUCKETS, NUM_TTFT);
    put_histogram(&t, "gpc_serve_inter_token_seconds", "between consecutive tokens of a request",
                  &m.itl, ITL_BUCKETS, NUM_ITL);
    put_metric(&t, "gpc_serve_kv_blocks_used", "gauge", "cache blocks in use",
               (double)es.kv_blocks_used);
    put_metric(&t, "gpc_serve_kv_blocks_total", "gauge", "cache blocks allocated at start",
               (double)es.kv_blocks_total);
    put_metric(&t, "gpc_serve_busy_seconds_total", "counter", "device time of engine steps",
               es.busy_seconds);
    put_metric(&t, "gpc_serve_host_seconds_total", "counter",
               "engine thread time outside the model's calls (scheduling, batching, callbacks)",
               es.host_seconds);
    put_metric(&t, "gpc_serve_uptime_seconds", "counter", "seconds since the engine started",
               es.wall_seconds);
    put_metric(&t, "gpc_serve_busy_fraction", "gauge",
               "device busy time over wall time since start",
               es.wall_seconds > 0 ? es.busy_seconds / es.wall_seconds : 0.0);
    if (!t.data) return respond_error(s, conn, 500, "out of memory rendering metrics");
    enum MHD_Result ret = respond(s, conn, 200, "text/plain; version=0.0.4", t.data, t.len);
    http_text_free(&t);
    return ret;
}

/* --------------------------------------------------------------- routing */

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

static int find_route(const char *url, const char **allow) {
    if (!strcmp(url, "/v1/completions")) return *allow = "POST", ROUTE_COMPLETIONS;
    if (!strcmp(url, "/v1/models")) return *allow = "GET", ROUTE_MODELS;
    if (!strcmp(url, "/health")) return *allow = "GET", ROUTE_HEALTH;
    if (!strcmp(url, "/metrics")) return *allow = "GET", ROUTE_METRICS;
    return ROUTE_NONE;
}

static enum MHD_Result respond_405(gpc_server *s, struct MHD_Connection *conn, const char *method,
                                   const char *url, const char *allow) {
    char msg[300];
    snprintf(msg, sizeof msg, "%s does not take %s; use %s", url, method, allow);
    char *body = http_error_body(405, msg);
    if (!body) return MHD_NO;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    MHD_add_response_header(r, "Allow", allow);
    enum MHD_Result ret = MHD_queue_response(conn, 405, r);
    MHD_destroy_response(r);
    count_status(s, 405);
    return ret;
}

/* The first call, with the request line and headers: everything that can
 * be refused before the body is read is refused here. */
static enum MHD_Result begin(gpc_server *s, struct MHD_Connection *conn, const char *url,
                             const char *method, void **con_cls) {
    const char *allow = NULL;
    int route = find_route(url, &allow);
    if (route == ROUTE_NONE) {
        char msg[300];
        snprintf(msg, sizeof msg,
                 "no such endpoint %.200s (gpc serve has POST /v1/completions, GET /v1/models, "
                 "/health, /metrics)",
                 url);
        return respond_error(s, conn, 404, msg);
    }
    int head = !strcmp(method, "HEAD") && !strcmp(allow, "GET");
    if (strcmp(method, allow) != 0 && !head) return respond_405(s, conn, method, url, allow);
    if (s->has_token && route != ROUTE_HEALTH &&
        !token_matches(s->token,
                       MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization")))
        return respond_error(s, conn, 401,
                             "missing or wrong bearer token (send Authorization: Bearer TOKEN, "
                             "the token in gpc serve's --token file)");
    const char *length = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
    if (length && strtoull(length, NULL, 10) > s->options.max_body) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than the limit of %zu bytes",
                 s->options.max_body);
        return respond_error(s, conn, 413, msg);
    }
    request_state *st = calloc(1, sizeof *st);
    if (!st) return MHD_NO;
    st->route = route;
    *con_cls = st;
    return MHD_YES;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload_data,
                              size_t *upload_size, void **con_cls) {
    (void)version;
    gpc_server *s = cls;
    request_state *st = *con_cls;
    if (!st) return begin(s, conn, url, method, con_cls);
    if (*upload_size) {
        if (!st->too_big) {
            if (st->body.len + *upload_size > s->options.max_body)
                st->too_big = 1;
            else if (http_text_append(&st->body, upload_data, *upload_size))
                return MHD_NO;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (st->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than the limit of %zu bytes",
                 s->options.max_body);
        return respond_error(s, conn, 413, msg);
    }
    switch (st->route) {
    case ROUTE_COMPLETIONS:
        if (s->draining) return respond_error(s, conn, 503, "the server is shutting down");
        pthread_mutex_lock(&s->lock);
        s->active++;
        pthread_mutex_unlock(&s->lock);
        st->counted = 1;
        return handle_completion(s, conn, st);
    case ROUTE_MODELS:
        return handle_models(s, conn);
    case ROUTE_METRICS:
        return handle_metrics(s, conn);
    default: {
        json_t *o = json_object();
        json_object_set_new(o, "status", json_string(s->draining ? "draining" : "ok"));
        return respond_json(s, conn, s->draining ? 503 : 200, o);
    }
    }
}

static void request_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                              enum MHD_RequestTerminationCode code) {
    (void)conn;
    (void)code;
    gpc_server *s = cls;
    request_state *st = *con_cls;
    if (!st) return;
    *con_cls = NULL;
    completion *c = st->job;
    if (c) {
        /* a client that left early: its blocks are free after the next step */
        if (c->submitted) {
            pthread_mutex_lock(&c->lock);
            int finished = c->finished;
            pthread_mutex_unlock(&c->lock);
            if (!finished && !c->done) {
                gpc_engine_cancel(s->engine, c->id, GPC_FINISH_CANCELLED);
                pthread_mutex_lock(&s->m.lock);
                s->m.cancelled++;
                pthread_mutex_unlock(&s->m.lock);
            }
        }
        completion_release(c);
    }
    if (st->counted) {
        pthread_mutex_lock(&s->lock);
        if (--s->active == 0) pthread_cond_broadcast(&s->idle);
        pthread_mutex_unlock(&s->lock);
    }
    http_text_free(&st->body);
    free(st);
}

/* ------------------------------------------------------------- listening */

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n')
        line[--n] = '\0';
    gpc_log(GPC_LOG_DEBUG, "http: %s", line);
}

static gpc_status bind_unix(gpc_server *s, const char *path, int *out) {
    char in_use[4200];
    snprintf(in_use, sizeof in_use, "another server is already listening on %s; stop it first",
             path);
    int fd;
    GPC_TRY(gpc_listen_unix(path, 0600, in_use, &fd));
    snprintf(s->socket_path, sizeof s->socket_path, "%s", path);
    snprintf(s->address, sizeof s->address, "unix:%s", path);
    *out = fd;
    return GPC_OK;
}

static gpc_status bind_tcp(gpc_server *s, const char *text, int *out) {
    char host[128];
    const char *colon = strrchr(text, ':');
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || (size_t)(colon - text) >= sizeof host || colon[1] == '\0' || *end || port < 0 ||
        port > 65535)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--listen %s is not ADDR:PORT (e.g. 127.0.0.1:8000; port 0 picks a free "
                         "one)",
                         text);
    memcpy(host, text, (size_t)(colon - text));
    host[colon - text] = '\0';
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host[0] ? host : "0.0.0.0", &addr.sin_addr) != 1)
        return gpc_error(GPC_ERR_INVALID_ARG, "--listen %s: '%s' is not an IPv4 address", text,
                         host);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return gpc_error(GPC_ERR_IO, "socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t len = sizeof addr;
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 4096) != 0 ||
        getsockname(fd, (struct sockaddr *)&addr, &len) != 0) {
        gpc_status st = gpc_error(GPC_ERR_IO,
                                  "cannot listen on %s: %s (in use, or not this "
                                  "host's address?)",
                                  text, strerror(errno));
        close(fd);
        return st;
    }
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof ip);
    snprintf(s->address, sizeof s->address, "http://%s:%u", ip, (unsigned)ntohs(addr.sin_port));
    *out = fd;
    return GPC_OK;
}

void gpc_server_options_init(gpc_server_options *o) {
    memset(o, 0, sizeof *o);
    o->max_body = 1u << 20;
    o->retry_after = 1;
    o->connection_limit = 1024;
    o->drain_timeout = 60;
}

gpc_status gpc_server_start(gpc_server **out, gpc_engine *engine, const gpc_tokenizer *tok,
                            const gpc_server_options *options) {
    *out = NULL;
    gpc_server *s = calloc(1, sizeof *s);
    if (!s) return gpc_error(GPC_ERR_NOMEM, "out of memory starting the server");
    s->engine = engine;
    s->tok = tok;
    s->listen_fd = -1;
    gpc_server_options_init(&s->options);
    if (options) s->options = *options;
    if (!s->options.max_body) s->options.max_body = 1u << 20;
    if (s->options.retry_after <= 0) s->options.retry_after = 1;
    if (s->options.connection_limit <= 0) s->options.connection_limit = 1024;
    gpc_engine_model(engine, &s->model);
    snprintf(s->model_name, sizeof s->model_name, "%s",
             s->options.model_name ? s->options.model_name : s->model.name);
    if (s->options.token) {
        size_t n = strlen(s->options.token);
        if (n >= sizeof s->token) {
            free(s);
            return gpc_error(GPC_ERR_INVALID_ARG, "the bearer token is longer than 255 bytes");
        }
        memcpy(s->token, s->options.token, n + 1);
        s->has_token = 1;
    }
    s->options.token = NULL;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->idle, NULL);
    pthread_mutex_init(&s->m.lock, NULL);
    gpc_status st =
        s->options.socket
            ? bind_unix(s, s->options.socket, &s->listen_fd)
            : bind_tcp(s, s->options.listen ? s->options.listen : "127.0.0.1:8000", &s->listen_fd);
    if (st != GPC_OK) {
        gpc_server_free(s);
        return st;
    }
    /* MHD_USE_ITC: gpc_server_drain quiesces the daemon (stops accepting) */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                     MHD_USE_POLL | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    s->mhd = MHD_start_daemon(flags, 0, NULL, NULL, handle, s, MHD_OPTION_LISTEN_SOCKET,
                              s->listen_fd, MHD_OPTION_NOTIFY_COMPLETED, request_completed, s,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->options.connection_limit,
                              MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
    if (!s->mhd) {
        st = gpc_error(GPC_ERR_IO, "cannot start the HTTP server on %s", s->address);
        gpc_server_free(s);
        return st;
    }
    *out = s;
    return GPC_OK;
}

const char *gpc_server_address(const gpc_server *s) {
    return s->address;
}

gpc_status gpc_server_drain(gpc_server *s) {
    s->draining = 1;
    if (s->mhd) {
        int fd = MHD_quiesce_daemon(s->mhd);
        if (fd >= 0) close(fd);
        s->listen_fd = -1;
    }
    if (s->socket_path[0]) unlink(s->socket_path);
    gpc_status st = gpc_engine_drain(s->engine);
    /* every admitted request has its last token; wait for it to be sent */
    double until = gpc_time_seconds() + s->options.drain_timeout;
    pthread_mutex_lock(&s->lock);
    while (s->active > 0 && gpc_time_seconds() < until) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += 100000000L;
        if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&s->idle, &s->lock, &t);
    }
    int left = s->active;
    pthread_mutex_unlock(&s->lock);
    if (st == GPC_OK && left)
        st = gpc_error(GPC_ERR_INTERRUPTED,
                       "%d responses were still being sent after %.0f s; their clients read too "
                       "slowly",
                       left, s->options.drain_timeout);
    return st;
}

void gpc_server_free(gpc_server *s) {
    if (!s) return;
    if (s->mhd)
        MHD_stop_daemon(s->mhd);
    else if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->socket_path[0]) unlink(s->socket_path);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->idle);
    pthread_mutex_destroy(&s->m.lock);
    free(s);
}
