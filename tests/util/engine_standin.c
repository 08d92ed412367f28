/*
 * engine_standin.c: a stand-in for the serving engine (gpc/engine.h) with a
 * made-up model, linked only into a tree that has no engine of its own, so
 * the HTTP front end builds and its plumbing can be exercised. Its "model"
 * draws token (31 * previous + 7 * position + 1) mod (vocab - 1); cache
 * blocks are counted as the real engine counts them.
 */
#include "gpc/engine.h"
#include "gpc/tokenizer.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct standin_seq {
    uint64_t id;
    gpc_engine_request r;
    uint32_t last;
    size_t pos, generated, blocks;
    gpc_finish_reason cancel;
    int running;
    struct standin_seq *next;
} standin_seq;

struct gpc_engine {
    gpc_engine_options o;
    gpc_engine_model_info info;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_t thread;
    int started, stop, draining;
    standin_seq *seqs;
    uint64_t next_id;
    size_t blocks_total, blocks_used;
    gpc_engine_stats stats;
    double t0;
};

void gpc_engine_options_init(gpc_engine_options *o) {
    memset(o, 0, sizeof *o);
    o->max_batch = 256;
    o->block_size = 16;
    o->max_queue = 1024;
    o->max_step_tokens = 2048;
    o->cuda_graphs = 1;
    o->precision = GPC_BF16;
}

void gpc_engine_request_init(gpc_engine_request *r) {
    memset(r, 0, sizeof *r);
    r->max_tokens = 16;
    r->temperature = 1;
    r->top_p = 1;
    r->eos_token = -1;
}

const char *gpc_finish_reason_name(gpc_finish_reason reason) {
    static const char *names[] = {"none", "length", "stop", "eos", "cancelled", "error"};
    return reason <= GPC_FINISH_ERROR ? names[reason] : "?";
}

gpc_status gpc_engine_create(gpc_engine **out, const char *run_dir, gpc_device device,
                             const gpc_engine_options *options) {
    (void)device;
    gpc_tokenizer *tok = NULL;
    GPC_TRY(gpc_tokenizer_load_from(&tok, run_dir));
    gpc_engine *e = calloc(1, sizeof *e);
    gpc_engine_options_init(&e->o);
    if (options) e->o = *options;
    snprintf(e->info.name, sizeof e->info.name, "standin");
    e->info.context = 64;
    e->info.vocab_size = gpc_tokenizer_vocab_size(tok);
    e->info.eos_token = gpc_tokenizer_eot(tok);
    gpc_tokenizer_free(tok);
    size_t kv = e->o.kv_bytes ? e->o.kv_bytes : (size_t)1 << 30;
    e->blocks_total = kv / 4096;
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->wake, NULL);
    e->t0 = gpc_time_seconds();
    *out = e;
    return GPC_OK;
}

static size_t blocks_for(const gpc_engine *e, size_t positions) {
    return (positions + (size_t)e->o.block_size - 1) / (size_t)e->o.block_size;
}

static void finish(gpc_engine *e, standin_seq **link, gpc_finish_reason why, int32_t token) {
    standin_seq *q = *link;
    *link = q->next;
    e->blocks_used -= q->blocks;
    gpc_engine_event ev = {q->id, token, why, q->r.prompt_len, q->generated, NULL};
    q->r.callback(q->r.user, &ev);
    free((void *)q->r.prompt);
    free(q);
}

gpc_status gpc_engine_step(gpc_engine *e, int *active) {
    pthread_mutex_lock(&e->lock);
    int running = 0;
    for (standin_seq **l = &e->seqs; *l;) {
        standin_seq *q = *l;
        if (q->cancel) {
            finish(e, l, q->cancel, -1);
            continue;
        }
        if (!q->running) {
            size_t need = blocks_for(e, q->pos + 1);
            if (running >= e->o.max_batch || e->blocks_used + need > e->blocks_total) {
                l = &q->next;
                continue;
            }
            q->running = 1;
            q->blocks = need;
            e->blocks_used += need;
        }
        running++;
        uint32_t t = (uint32_t)((31u * q->last + 7u * (uint32_t)q->pos + 1u) %
                                (uint32_t)(e->info.vocab_size - 1));
        q->last = t;
        q->pos++;
        q->generated++;
        size_t need = blocks_for(e, q->pos + 1);
        if (need > q->blocks && e->blocks_used < e->blocks_total) {
            e->blocks_used++;
            q->blocks++;
        }
        e->stats.tokens_generated++;
        if ((int)q->generated >= q->r.max_tokens || q->pos >= (size_t)e->info.context) {
            finish(e, l, GPC_FINISH_LENGTH, (int32_t)t);
            continue;
        }
        gpc_engine_event ev = {q->id,           (int32_t)t,   GPC_FINISH_NONE,
                               q->r.prompt_len, q->generated, NULL};
        q->r.callback(q->r.user, &ev);
        l = &q->next;
    }
    e->stats.steps++;
    int n = 0;
    for (standin_seq *q = e->seqs; q; q = q->next)
        n++;
    *active = n;
    pthread_mutex_unlock(&e->lock);
    usleep(2000);
    e->stats.busy_seconds += 0.002;
    return GPC_OK;
}

static void *loop(void *arg) {
    gpc_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->lock);
        while (!e->seqs && !e->stop)
            pthread_cond_wait(&e->wake, &e->lock);
        int stop = e->stop;
        pthread_mutex_unlock(&e->lock);
        if (stop) break;
        int active;
        gpc_engine_step(e, &active);
    }
    return NULL;
}

gpc_status gpc_engine_start(gpc_engine *e) {
    e->started = pthread_create(&e->thread, NULL, loop, e) == 0;
    return GPC_OK;
}

gpc_status gpc_engine_submit(gpc_engine *e, const gpc_engine_request *r, uint64_t *id) {
    pthread_mutex_lock(&e->lock);
    size_t waiting = 0;
    for (standin_seq *q = e->seqs; q; q = q->next)
        waiting += !q->running;
    gpc_status st = GPC_OK;
    if (e->draining)
        st = gpc_error(GPC_ERR_INTERRUPTED, "the engine is draining");
    else if (waiting >= (size_t)e->o.max_queue)
        st = gpc_error(GPC_ERR_BUSY, "the queue is full");
    else if (r->prompt_len > (size_t)e->info.context)
        st = gpc_error(GPC_ERR_INVALID_ARG, "the prompt is longer than the context");
    if (st != GPC_OK) {
        pthread_mutex_unlock(&e->lock);
        return st;
    }
    standin_seq *q = calloc(1, sizeof *q);
    q->r = *r;
    uint32_t *copy = malloc(r->prompt_len * sizeof *copy);
    memcpy(copy, r->prompt, r->prompt_len * sizeof *copy);
    q->r.prompt = copy;
    q->pos = r->prompt_len;
    q->last = r->prompt[r->prompt_len - 1];
    q->id = *id = ++e->next_id;
    standin_seq **l = &e->seqs;
    while (*l)
        l = &(*l)->next;
    *l = q;
    e->stats.requests_total++;
    e->stats.prompt_tokens += r->prompt_len;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->lock);
    return GPC_OK;
}

void gpc_engine_cancel(gpc_engine *e, uint64_t id, gpc_finish_reason reason) {
    pthread_mutex_lock(&e->lock);
    for (standin_seq *q = e->seqs; q; q = q->next)
        if (q->id == id) q->cancel = reason;
    pthread_mutex_unlock(&e->lock);
}

gpc_status gpc_engine_drain(gpc_engine *e) {
    pthread_mutex_lock(&e->lock);
    e->draining = 1;
    pthread_mutex_unlock(&e->lock);
    for (;;) {
        pthread_mutex_lock(&e->lock);
        int empty = e->seqs == NULL;
        pthread_mutex_unlock(&e->lock);
        if (empty) return GPC_OK;
        usleep(5000);
    }
}

void gpc_engine_free(gpc_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->lock);
    e->stop = 1;
    for (standin_seq *q = e->seqs; q; q = q->next)
        q->cancel = GPC_FINISH_CANCELLED;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->lock);
    if (e->started) pthread_join(e->thread, NULL);
    int active;
    if (e->seqs) gpc_engine_step(e, &active);
    free(e);
}

void gpc_engine_get_stats(gpc_engine *e, gpc_engine_stats *s) {
    pthread_mutex_lock(&e->lock);
    *s = e->stats;
    for (standin_seq *q = e->seqs; q; q = q->next) {
        s->running += q->running;
        s->waiting += !q->running;
    }
    s->kv_blocks_used = e->blocks_used;
    s->kv_blocks_total = e->blocks_total;
    s->wall_seconds = gpc_time_seconds() - e->t0;
    pthread_mutex_unlock(&e->lock);
}

void gpc_engine_model(gpc_engine *e, gpc_engine_model_info *info) {
    *info = e->info;
}
