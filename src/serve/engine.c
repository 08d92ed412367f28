/*
 * engine.c: the serving engine (include/gpc/engine.h): a request queue, a
 * scheduler that batches every active sequence into one model step
 * (continuous batching with chunked prefill), the paged cache's block
 * tables (kv_blocks.c keeps the blocks), preemption when blocks run out,
 * and sampling. The model step itself is gpt_step_paged.
 *
 * Sampling: on the CPU each row's logits go through gpc_sample_token, as
 * gpc_generate does, so the output is exactly gpc sample's. On a GPU the
 * logits stay on the device (gpt_step_paged_sample): the engine draws each
 * row's uniform from the request's rng before the step, as
 * gpc_sample_token would after it (one number a sampled token, none when
 * greedy), so both devices use the same random stream; min_tokens forbids
 * the end-of-text token on the device.
 *
 * A sequence is its tokens (the prompt, then what it generated) and how
 * many of them have keys and values in the cache (computed). Each step it
 * runs the tokens after computed: one for a sequence that is decoding, a
 * chunk for one that is reading its prompt. When its last token ran, the
 * logits of that row give the next token. A preempted sequence gives its
 * blocks back and keeps its tokens, rng and count, so recomputing it later
 * is just a longer prompt and its output does not change.
 *
 * Scheduling, each step, in this order: (1) every running sequence that is
 * decoding gets its token, oldest first; one that needs a new block and
 * finds none preempts the youngest running sequence not yet in the step
 * (itself, if it is that one); (2) running prompts get chunks from what is
 * left of max_step_tokens, oldest first; (3) waiting requests join, first
 * come first, while the batch has room, tokens are left and the free blocks
 * hold their whole prompt (less the blocks it shares). A sequence's prompt
 * blocks are all taken when it joins, so only decoding ever needs a block.
 *
 * Pipeline (GPC_SERVE_PIPELINE, on by default): the engine runs one step
 * ahead. It schedules and launches step N+1 before it collects step N, so
 * the device computes N+1 while the host delivers N's tokens, applies
 * cancels and schedules. A sequence whose token of step N is still in
 * flight decodes in N+1 all the same: its row is fed that token on the
 * device (gpt_paged_batch.feed; on the CPU, where a launch draws at once,
 * the token itself). Only what cannot be known ahead costs anything: a
 * sequence that ends at N by its end-of-text token or a cancel has its
 * token of N+1 dropped. One that ends by length is not scheduled in N+1.
 * A finished sequence keeps its blocks and its memory until the last step
 * that names it is collected (it is a "zombie" until then), so no later
 * step reuses a block an earlier one still writes. A preempted sequence
 * gives its blocks back at once: only later launches can reuse them, and
 * those run after the earlier steps on the device's one stream.
 *
 * Threads: any thread submits and cancels; steps run on one thread (the
 * engine's, or the caller's through gpc_engine_step). The lock guards the
 * queue, the running list, cancel marks and the statistics; the model step
 * and the callbacks run without it, so a callback may call
 * gpc_engine_cancel.
 */
#include "gpc/engine.h"
#include "gpc/model.h"
#include "gpc/serve.h"
#include "gpc/settings.h"
#include "gpc/tokenizer.h"
#include "serve/kv_blocks.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* The random stream of a request's seed: gpc sample's, so a request and
 * `gpc sample --seed S` draw the same numbers. */
#define ENGINE_RNG_STREAM 0x73616d706c65ULL /* "sample" */

typedef struct seq {
    uint64_t id;
    gpc_engine_request req;
    uint32_t *tokens; /* [context + 1]: the prompt, then the generated tokens */
    int n_tokens, prompt_len, generated;
    int computed;   /* tokens whose keys and values are in the cache */
    int *blocks;    /* [max_blocks] the block table */
    uint64_t *keys; /* [max_blocks] the prefix keys of the first n_keyed blocks */
    int n_blocks, n_keyed;
    gpc_rng rng;
    gpc_finish_reason cancel; /* set by gpc_engine_cancel, under the lock */
    int done;                 /* its final event is queued */
    int queued;               /* in the waiting queue */
    int unlinked;             /* out of the lists, after its final event */
    uint64_t admitted;        /* order of joining the batch: the youngest is preempted first */
    struct seq *prev, *next;  /* the waiting queue */
    struct seq *all_prev, *all_next; /* every live sequence (cancel looks ids up here);
                                        after the final event, the zombies */
    /* the step being scheduled */
    int step_start, step_count;
    /* steps in flight: tokens drawn for it that the host has not seen, the
     * logits row of the last launch that drew one, and 1 + the number of
     * the last launch that names it */
    int in_flight, fed_row;
    uint64_t last_launch;
} seq;

/* A launched step: its sequences, what each ran, and what it drew. */
typedef struct {
    seq *s;
    int start, count, logit_row;
    int generated; /* tokens s had generated before this step's one */
} step_entry;

typedef struct {
    step_entry *entries; /* [max_batch] */
    int n;
    int32_t *drawn;     /* [max_logits] */
    double launched_at; /* gpc_time_seconds() when it was launched */
    double cpu_seconds; /* the model's time on the CPU backend (0 on a GPU) */
} step_record;

typedef struct {
    seq *s;
    gpc_engine_event event;
} pending_event;

struct gpc_engine {
    gpt_model *model;
    gpt_paged *paged;
    gpc_tokenizer *tokenizer;
    gpc_engine_options o;
    gpc_engine_model_info info;
    int context, vocab, block_size, max_blocks;
    kv_blocks kv;

    pthread_mutex_t lock;
    pthread_cond_t work; /* something to do for the engine thread */
    pthread_cond_t idle; /* the last sequence finished (drain waits) */
    pthread_t thread;
    int started, stop, draining, cancels;
    int delivering; /* a step's callbacks run: drain waits for them too */
    seq *wait_head, *wait_tail;
    size_t n_waiting;
    seq **running; /* [max_batch], oldest first */
    int n_running;
    seq *all;
    uint64_t next_id, next_admitted;

    /* step buffers, sized at creation */
    seq **step; /* [max_batch] the sequences of the step being scheduled */
    int n_step;
    int32_t *tokens, *positions, *seqs, *slots, *feed; /* [max_step_tokens] */
    int32_t *tables;                                   /* [max_batch, max_blocks] */
    float *logits;                                     /* [max_batch, vocab], on the CPU only */
    int on_device;                                     /* sample on the model's GPU */
    gpt_paged_sampling *sampling;                      /* [max_batch] on a GPU */
    void *sample_scratch;                              /* [sample_threads, 8 * vocab] bytes */
    int sample_threads;
    int pipeline;                 /* launch a step before collecting the previous one */
    step_record records[2];       /* the launched steps, by launch parity */
    uint64_t launched, collected; /* steps so far */
    seq *zombies;                 /* finished, but named by a step in flight */
    double busy_pending;          /* device time of this round's steps */
    pending_event *events;
    int n_events, max_events;
    char error[512];

    gpc_engine_stats stats;
    double created;
};

const char *gpc_finish_reason_name(gpc_finish_reason reason) {
    switch (reason) {
    case GPC_FINISH_NONE:
        return "none";
    case GPC_FINISH_LENGTH:
        return "length";
    case GPC_FINISH_STOP:
        return "stop";
    case GPC_FINISH_EOS:
        return "eos";
    case GPC_FINISH_CANCELLED:
        return "cancelled";
    case GPC_FINISH_ERROR:
        return "error";
    }
    return "unknown";
}

void gpc_engine_options_init(gpc_engine_options *o) {
    memset(o, 0, sizeof *o);
    o->max_batch = 256;
    o->kv_bytes = 0;
    o->block_size = 16;
    o->max_queue = 1024;
    o->max_step_tokens = 2048;
    o->cuda_graphs = 1;
    o->pipeline = 1;
    o->precision = GPC_BF16;
}

void gpc_engine_request_init(gpc_engine_request *r) {
    memset(r, 0, sizeof *r);
    r->max_tokens = 16;
    r->temperature = 1.0f;
    r->top_k = 0;
    r->top_p = 1.0f;
    r->eos_token = -1;
}

/* ------------------------------------------------------------ sequences */

static void seq_free(seq *s) {
    if (!s) return;
    gpc_free(s->tokens);
    gpc_free(s->blocks);
    gpc_free(s->keys);
    gpc_free(s);
}

static void release_blocks(gpc_engine *e, seq *s) {
    for (int i = 0; i < s->n_blocks; i++)
        kv_blocks_release(&e->kv, s->blocks[i]);
    s->n_blocks = 0;
    s->n_keyed = 0;
    s->computed = 0;
}

static void wait_unlink(gpc_engine *e, seq *s) {
    if (s->prev)
        s->prev->next = s->next;
    else
        e->wait_head = s->next;
    if (s->next)
        s->next->prev = s->prev;
    else
        e->wait_tail = s->prev;
    s->prev = s->next = NULL;
    s->queued = 0;
    e->n_waiting--;
}

static void wait_push_back(gpc_engine *e, seq *s) {
    s->next = NULL;
    s->prev = e->wait_tail;
    if (e->wait_tail)
        e->wait_tail->next = s;
    else
        e->wait_head = s;
    e->wait_tail = s;
    s->queued = 1;
    e->n_waiting++;
}

static void wait_push_front(gpc_engine *e, seq *s) {
    s->prev = NULL;
    s->next = e->wait_head;
    if (e->wait_head)
        e->wait_head->prev = s;
    else
        e->wait_tail = s;
    e->wait_head = s;
    s->queued = 1;
    e->n_waiting++;
}

static void all_unlink(gpc_engine *e, seq *s) {
    if (s->all_prev)
        s->all_prev->all_next = s->all_next;
    else
        e->all = s->all_next;
    if (s->all_next) s->all_next->all_prev = s->all_prev;
    s->all_prev = s->all_next = NULL;
}

static void running_remove(gpc_engine *e, int index) {
    memmove(e->running + index, e->running + index + 1,
            (size_t)(e->n_running - index - 1) * sizeof *e->running);
    e->n_running--;
}

/* Queues s's last event; finish != NONE makes it final (s leaves after the
 * callbacks). */
static void emit(gpc_engine *e, seq *s, int32_t token, gpc_finish_reason finish,
                 const char *message) {
    pending_event *p = &e->events[e->n_events++];
    p->s = s;
    p->event.id = s->id;
    p->event.token = token;
    p->event.finish = finish;
    p->event.prompt_tokens = (size_t)s->prompt_len;
    p->event.generated = (size_t)s->generated;
    p->event.message = message;
    if (finish != GPC_FINISH_NONE) s->done = 1;
}

/* Ends s now (the lock held): it leaves the lists; its blocks go back
 * once its final event is delivered and no step in flight names it
 * (reap). */
static void finish_now(gpc_engine *e, seq *s, gpc_finish_reason reason, int running_index) {
    if (running_index >= 0)
        running_remove(e, running_index);
    else
        wait_unlink(e, s);
    all_unlink(e, s);
    s->unlinked = 1;
    emit(e, s, -1, reason, NULL);
}

/* ------------------------------------------------------------ scheduling */

static int blocks_for(const gpc_engine *e, int positions) {
    return (positions + e->block_size - 1) / e->block_size;
}

/* Gives running[index] back to the queue's front, to be recomputed. */
static void preempt(gpc_engine *e, int index) {
    seq *s = e->running[index];
    release_blocks(e, s);
    running_remove(e, index);
    wait_push_front(e, s);
    e->stats.preemptions++;
}

static void schedule_seq(gpc_engine *e, seq *s, int count) {
    s->step_start = s->computed;
    s->step_count = count;
    e->step[e->n_step++] = s;
}

/* Shares the registered blocks that hold a prefix of s's tokens: whole
 * blocks before its last token (that one must run, for its logits). */
static void share_prefix(gpc_engine *e, seq *s) {
    int bs = e->block_size, parent = -1;
    uint64_t key = 0;
    for (int j = 0; (j + 1) * bs <= s->n_tokens - 1; j++) {
        const uint32_t *t = s->tokens + (size_t)j * bs;
        uint64_t k = kv_blocks_key(key, t, bs);
        int b = kv_blocks_lookup(&e->kv, k, parent, t);
        if (b < 0) break;
        kv_blocks_ref(&e->kv, b);
        s->blocks[s->n_blocks++] = b;
        s->keys[s->n_keyed++] = k;
        key = k;
        parent = b;
    }
    s->computed = s->n_blocks * bs;
}

/* Decoding sequences: one token each, oldest first, preempting the
 * youngest for blocks. Returns the tokens left of the budget. */
static int schedule_decodes(gpc_engine *e, int budget, int *preempted) {
    for (int i = 0; i < e->n_running && budget > 0; i++) {
        seq *s = e->running[i];
        if (s->n_tokens + s->in_flight - s->computed != 1) continue;
        /* its token in flight ends it by length: nothing to run after it */
        if (s->in_flight && (s->generated + s->in_flight >= s->req.max_tokens ||
                             s->n_tokens + s->in_flight > e->context))
            continue;
        int ok = 1;
        while (s->n_blocks < blocks_for(e, s->computed + 1)) {
            int b = kv_blocks_alloc(&e->kv);
            if (b >= 0) {
                s->blocks[s->n_blocks++] = b;
                continue;
            }
            /* the youngest: the tail, as everything after i is unscheduled */
            int victim = e->n_running - 1;
            if (victim == i && e->n_running == 1) {
                /* its token in flight comes first, as without the pipeline */
                if (s->in_flight) {
                    ok = 0;
                    break;
                }
                /* alone, it fills the whole cache: its context ends here */
                finish_now(e, s, GPC_FINISH_LENGTH, i);
                ok = 0;
                break;
            }
            preempt(e, victim);
            (*preempted)++;
            if (victim == i) {
                ok = 0;
                break;
            }
        }
        if (!ok) break; /* s left or waits, and it was the last */
        schedule_seq(e, s, 1);
        budget--;
    }
    return budget;
}

static void schedule(gpc_engine *e) {
    e->n_step = 0;
    for (int i = 0; i < e->n_running; i++)
        e->running[i]->step_count = 0;
    int preempted = 0;
    int budget = schedule_decodes(e, e->o.max_step_tokens, &preempted);
    /* prompts already running, oldest first */
    for (int i = 0; i < e->n_running && budget > 0; i++) {
        seq *s = e->running[i];
        int left = s->n_tokens + s->in_flight - s->computed;
        if (s->step_count || left <= 1) continue;
        int count = left < budget ? left : budget;
        schedule_seq(e, s, count);
        budget -= count;
    }
    /* new sequences, first come first; none in a step that had to preempt */
    while (!preempted && budget > 0 && e->n_running < e->o.max_batch && e->wait_head) {
        seq *s = e->wait_head;
        if (s->in_flight) break; /* preempted with a token in flight: it waits for it */
        if (blocks_for(e, s->n_tokens) > e->kv.num_blocks) {
            /* preempted when it had grown past what the cache holds on its
             * own: it ends as it would have alone */
            finish_now(e, s, GPC_FINISH_LENGTH, -1);
            continue;
        }
        share_prefix(e, s);
        int need = blocks_for(e, s->n_tokens) - s->n_blocks;
        if (kv_blocks_free_count(&e->kv) < need) {
            release_blocks(e, s);
            break;
        }
        while (s->n_blocks < blocks_for(e, s->n_tokens))
            s->blocks[s->n_blocks++] = kv_blocks_alloc(&e->kv);
        wait_unlink(e, s);
        s->admitted = e->next_admitted++;
        e->running[e->n_running++] = s;
        int left = s->n_tokens - s->computed;
        int count = left < budget ? left : budget;
        schedule_seq(e, s, count);
        budget -= count;
    }
}

/* The step's rows: the rows whose logits are wanted first (gpt_paged_batch),
 * then the rest; the step's record names its sequences. A row whose token
 * is still in flight takes it from the previous launch: fed on the device,
 * or, on the CPU, where that launch drew at once, copied here. */
static void build_batch(gpc_engine *e, gpt_paged_batch *b, step_record *rec) {
    const step_record *prev = &e->records[(e->launched + 1) & 1];
    int R = 0, N = 0, bs = e->block_size, mb = e->max_blocks, fed = 0;
    for (int k = 0; k < e->n_step; k++) {
        seq *s = e->step[k];
        N += s->step_count;
        R += s->step_start + s->step_count == s->n_tokens + s->in_flight;
    }
    int r = 0, other = R;
    rec->n = e->n_step;
    for (int k = 0; k < e->n_step; k++) {
        seq *s = e->step[k];
        step_entry *en = &rec->entries[k];
        int end = s->step_start + s->step_count, wants = end == s->n_tokens + s->in_flight;
        en->s = s;
        en->start = s->step_start;
        en->count = s->step_count;
        en->logit_row = wants ? r : -1;
        en->generated = s->generated + s->in_flight;
        for (int p = s->step_start; p < end; p++) {
            int row = wants && p == end - 1 ? r++ : other++;
            e->feed[row] = -1;
            if (p < s->n_tokens) {
                e->tokens[row] = (int32_t)s->tokens[p];
            } else if (e->on_device) {
                e->tokens[row] = 0;
                e->feed[row] = s->fed_row;
                fed = 1;
            } else {
                e->tokens[row] = prev->drawn[s->fed_row];
            }
            e->positions[row] = p;
            e->seqs[row] = k;
            e->slots[row] = s->blocks[p / bs] * bs + p % bs;
        }
        int32_t *t = e->tables + (size_t)k * mb;
        memcpy(t, s->blocks, (size_t)s->n_blocks * sizeof *t);
        for (int j = s->n_blocks; j < mb; j++)
            t[j] = -1;
    }
    b->num_tokens = N;
    b->tokens = e->tokens;
    b->positions = e->positions;
    b->seqs = e->seqs;
    b->slots = e->slots;
    b->num_seqs = e->n_step;
    b->block_tables = e->tables;
    b->num_logits = R;
    b->feed = fed ? e->feed : NULL;
}

/* The next token of s from logits row row, with its own rng (scratch: 8 *
 * vocab bytes), generated tokens before it. Sequences draw independently,
 * so they may draw in parallel and still give what each gives alone. */
static uint32_t draw(const gpc_engine *e, seq *s, int row, int generated, void *scratch) {
    int V = e->vocab;
    float *logits = e->logits + (size_t)row * V;
    const gpc_engine_request *q = &s->req;
    int64_t stop = q->ignore_eos ? -1 : q->eos_token;
    /* below min_tokens the end-of-text token is not drawn (as gpc_generate) */
    if (stop >= 0 && stop < V && generated < q->min_tokens) logits[stop] = -INFINITY;
    return gpc_sample_token(logits, V, q->temperature, q->top_k, q->top_p, &s->rng, scratch);
}

/* How s's logits row is drawn on the device: gpc_sample_token's
 * parameters and uniform (drawn here, before the step, in the same way),
 * and the end-of-text token forbidden below min_tokens (as in draw). */
static gpt_paged_sampling sampling_of(const gpc_engine *e, seq *s, int generated) {
    const gpc_engine_request *q = &s->req;
    int64_t stop = q->ignore_eos ? -1 : q->eos_token;
    gpt_paged_sampling r;
    r.temperature = q->temperature;
    r.top_k = (float)q->top_k;
    r.top_p = q->top_p;
    r.uniform = 0.0f;
    if (q->temperature > 0.0f) {
        /* f32, and below 1 (a double just under 1 rounds up to 1.0f) */
        r.uniform = (float)gpc_rng_uniform64(&s->rng);
        if (r.uniform >= 1.0f) r.uniform = nextafterf(1.0f, 0.0f);
    }
    r.forbidden = stop >= 0 && stop < e->vocab && generated < q->min_tokens ? (int32_t)stop : -1;
    return r;
}

/* Draws on the CPU for every sequence of the step whose last token ran:
 * over the OpenMP threads when there is enough of it (a top-k draw reads
 * the whole vocabulary), each thread with its own scratch. */
static void draw_all(gpc_engine *e, step_record *rec) {
    int64_t work = 0;
    for (int k = 0; k < rec->n; k++)
        work += rec->entries[k].logit_row >= 0 ? e->vocab : 0;
    /* cppcheck-suppress unreadVariable ; the pragma below reads it */
    int threads = work >= 16384 ? e->sample_threads : 1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
    for (int k = 0; k < rec->n; k++) {
        const step_entry *en = &rec->entries[k];
        if (en->logit_row < 0) continue;
        char *scratch = (char *)e->sample_scratch + (size_t)omp_get_thread_num() * 8 * e->vocab;
        rec->drawn[en->logit_row] = (int32_t)draw(e, en->s, en->logit_row, en->generated, scratch);
    }
}

/* Queues the step (on the CPU: runs it and draws). Once launched, its
 * positions count as computed and its draws as in flight. model_seconds
 * gets the time spent in the model's calls. */
static gpc_status launch(gpc_engine *e, const gpt_paged_batch *b, step_record *rec,
                         double *model_seconds) {
    double t0;
    if (e->on_device) {
        for (int k = 0; k < rec->n; k++) {
            const step_entry *en = &rec->entries[k];
            if (en->logit_row >= 0)
                e->sampling[en->logit_row] = sampling_of(e, en->s, en->generated);
        }
        t0 = gpc_time_seconds();
        gpc_status st = gpt_step_paged_launch(e->paged, b, e->sampling);
        *model_seconds += gpc_time_seconds() - t0;
        GPC_TRY(st);
    } else {
        t0 = gpc_time_seconds();
        gpc_status st = gpt_step_paged(e->paged, b, e->logits);
        double dt = gpc_time_seconds() - t0;
        *model_seconds += dt;
        e->busy_pending += dt;
        rec->cpu_seconds = dt;
        GPC_TRY(st);
        draw_all(e, rec);
    }
    e->launched++;
    rec->launched_at = gpc_time_seconds();
    for (int k = 0; k < rec->n; k++) {
        const step_entry *en = &rec->entries[k];
        seq *s = en->s;
        s->computed = en->start + en->count;
        s->last_launch = e->launched;
        if (en->logit_row >= 0) {
            s->in_flight++;
            s->fed_row = en->logit_row;
        }
    }
    return GPC_OK;
}

/* At GPC_LOG=debug, a line a collected step: what it ran and how long it
 * took, so a slow first token or a stalled stream can be traced to steps. */
static void log_step(const gpc_engine *e, const step_record *rec, double step_seconds) {
    if (gpc_log_get_level() > GPC_LOG_DEBUG) return;
    int decoding = 0, prompt = 0;
    for (int k = 0; k < rec->n; k++) {
        if (rec->entries[k].count == 1 && rec->entries[k].start >= rec->entries[k].s->prompt_len)
            decoding++;
        else
            prompt += rec->entries[k].count;
    }
    gpc_log(GPC_LOG_DEBUG,
            "engine step %llu: %d sequences, %d decoding, %d prompt tokens; model %.3f ms, "
            "launch to collect %.3f ms",
            (unsigned long long)e->collected, rec->n, decoding, prompt, step_seconds * 1e3,
            (gpc_time_seconds() - rec->launched_at) * 1e3);
}

/* Waits for the oldest launched step's tokens (on the CPU it has them). */
static gpc_status collect(gpc_engine *e, step_record *rec, double *model_seconds) {
    gpc_status st = GPC_OK;
    double step_seconds = e->on_device ? 0 : rec->cpu_seconds;
    if (e->on_device) {
        double t0 = gpc_time_seconds();
        st = gpt_step_paged_collect(e->paged, rec->drawn);
        *model_seconds += gpc_time_seconds() - t0;
        if (st == GPC_OK) step_seconds = gpt_paged_collected_seconds(e->paged);
        e->busy_pending += step_seconds;
    }
    e->collected++;
    if (st == GPC_OK) log_step(e, rec, step_seconds);
    return st;
}

/* The blocks of s that the collected positions 0 .. done-1 fill become
 * shareable: their tokens are all known now. */
static void register_blocks(gpc_engine *e, seq *s, int done) {
    int bs = e->block_size;
    if (!s->n_blocks) return; /* preempted since: nothing of it is cached */
    while ((s->n_keyed + 1) * bs <= done) {
        int j = s->n_keyed;
        const uint32_t *t = s->tokens + (size_t)j * bs;
        uint64_t key = kv_blocks_key(j ? s->keys[j - 1] : 0, t, bs);
        kv_blocks_register(&e->kv, s->blocks[j], key, j ? s->blocks[j - 1] : -1, t);
        s->keys[s->n_keyed++] = key;
    }
}

/* s takes the token its step drew. Returns the tokens it generated (0 or
 * 1). */
static int advance(gpc_engine *e, seq *s, uint32_t token) {
    const gpc_engine_request *q = &s->req;
    int64_t stop = q->ignore_eos ? -1 : q->eos_token;
    if (stop >= 0 && token == (uint64_t)stop) {
        emit(e, s, -1, GPC_FINISH_EOS, NULL);
        return 0;
    }
    s->generated++;
    s->tokens[s->n_tokens++] = token;
    /* the new token's position is n_tokens - 1: past the context it cannot run */
    gpc_finish_reason finish = s->generated >= q->max_tokens || s->n_tokens > e->context
                                   ? GPC_FINISH_LENGTH
                                   : GPC_FINISH_NONE;
    emit(e, s, (int32_t)token, finish, NULL);
    return 1;
}

/* What a collected step gives: its sequences' tokens, except to those that
 * ended since it was launched (their token is dropped). */
static uint64_t take_tokens(gpc_engine *e, const step_record *rec) {
    uint64_t generated = 0;
    for (int k = 0; k < rec->n; k++) {
        const step_entry *en = &rec->entries[k];
        seq *s = en->s;
        if (en->logit_row >= 0) s->in_flight--;
        if (s->done) continue;
        register_blocks(e, s, en->start + en->count);
        if (en->logit_row >= 0)
            generated += (uint64_t)advance(e, s, (uint32_t)rec->drawn[en->logit_row]);
    }
    return generated;
}

/* Every sequence of a step that failed ends with the error. */
static void fail_step(gpc_engine *e, const step_record *rec) {
    snprintf(e->error, sizeof e->error, "%s", gpc_last_error());
    for (int k = 0; k < rec->n; k++)
        if (!rec->entries[k].s->done) emit(e, rec->entries[k].s, -1, GPC_FINISH_ERROR, e->error);
}

/* Ends every request marked by gpc_engine_cancel (the lock held): the
 * running list in one pass, however many left. */
static void apply_cancels(gpc_engine *e) {
    if (!e->cancels) return;
    e->cancels = 0;
    int kept = 0;
    for (int i = 0; i < e->n_running; i++) {
        seq *s = e->running[i];
        if (!s->cancel) {
            e->running[kept++] = s;
            continue;
        }
        all_unlink(e, s);
        s->unlinked = 1;
        emit(e, s, -1, s->cancel, NULL);
    }
    e->n_running = kept;
    for (seq *s = e->wait_head, *next; s; s = next) {
        next = s->next;
        if (s->cancel) finish_now(e, s, s->cancel, -1);
    }
}

static void update_stats(gpc_engine *e) {
    e->stats.waiting = e->n_waiting;
    e->stats.running = (size_t)e->n_running;
    e->stats.kv_blocks_used = (size_t)(e->kv.num_blocks - kv_blocks_free_count(&e->kv));
}

/* The sequences that ended in a collected step leave the running list (in
 * one pass) or the queue (one preempted with a token in flight), and the
 * list cancel searches (the lock held). */
static void unlink_finished(gpc_engine *e) {
    int w = 0;
    for (int i = 0; i < e->n_running; i++)
        if (!e->running[i]->done) e->running[w++] = e->running[i];
    e->n_running = w;
    for (int i = 0; i < e->n_events; i++) {
        seq *s = e->events[i].s;
        if (e->events[i].event.finish == GPC_FINISH_NONE || s->unlinked) continue;
        if (s->queued) wait_unlink(e, s);
        all_unlink(e, s);
        s->unlinked = 1;
    }
}

/* Calls back with the step's events (the lock not held); the sequences
 * that ended become zombies until reap frees them. */
static void deliver(gpc_engine *e) {
    for (int i = 0; i < e->n_events; i++) {
        pending_event *p = &e->events[i];
        if (p->s->req.callback) p->s->req.callback(p->s->req.user, &p->event);
    }
    for (int i = 0; i < e->n_events; i++)
        if (e->events[i].event.finish != GPC_FINISH_NONE) {
            seq *s = e->events[i].s;
            s->all_prev = NULL;
            s->all_next = e->zombies;
            if (e->zombies) e->zombies->all_prev = s;
            e->zombies = s;
        }
    e->n_events = 0;
}

/* Frees the zombies that no step in flight names: their blocks go back. */
static void reap(gpc_engine *e) {
    for (seq *s = e->zombies, *next; s; s = next) {
        next = s->all_next;
        if (s->last_launch > e->collected) continue;
        if (s->all_prev)
            s->all_prev->all_next = s->all_next;
        else
            e->zombies = s->all_next;
        if (s->all_next) s->all_next->all_prev = s->all_prev;
        release_blocks(e, s);
        seq_free(s);
    }
}

/* One round of the engine: schedule and launch a step (two when none is
 * in flight and the pipeline is on, so that one runs ahead), then collect
 * the oldest, leaving at most one in flight, and deliver its tokens. */
static gpc_status run_step(gpc_engine *e, int *active) {
    double begin = gpc_time_seconds(), model = 0;
    gpc_status st = GPC_OK;
    int rounds = e->pipeline && e->launched == e->collected ? 2 : 1, launched = 0;
    for (int round = 0; round < rounds && st == GPC_OK; round++) {
        pthread_mutex_lock(&e->lock);
        apply_cancels(e);
        schedule(e);
        update_stats(e);
        pthread_mutex_unlock(&e->lock);
        if (!e->n_step) break;
        step_record *rec = &e->records[e->launched & 1];
        gpt_paged_batch batch;
        build_batch(e, &batch, rec);
        st = launch(e, &batch, rec, &model);
        if (st != GPC_OK)
            fail_step(e, rec);
        else
            launched++;
    }
    /* collect down to one step in flight when running ahead (none without
     * the pipeline or after an error), and at least one step a round */
    uint64_t generated = 0;
    int collected = 0;
    while (e->launched > e->collected) {
        uint64_t in_flight = e->launched - e->collected;
        if (e->pipeline && st == GPC_OK && in_flight == 1 && collected) break;
        step_record *rec = &e->records[e->collected & 1];
        gpc_status cs = collect(e, rec, &model);
        if (cs == GPC_OK) {
            generated += take_tokens(e, rec);
        } else {
            fail_step(e, rec);
            st = cs;
        }
        collected++;
    }

    pthread_mutex_lock(&e->lock);
    unlink_finished(e);
    e->stats.steps += (uint64_t)launched;
    e->stats.busy_seconds += e->busy_pending;
    e->busy_pending = 0;
    e->stats.tokens_generated += generated;
    update_stats(e);
    if (active)
        *active = (int)(e->n_waiting + (size_t)e->n_running + (size_t)(e->launched - e->collected));
    e->delivering = 1;
    pthread_mutex_unlock(&e->lock);
    deliver(e);
    pthread_mutex_lock(&e->lock);
    reap(e);
    update_stats(e);
    e->delivering = 0;
    e->stats.host_seconds += gpc_time_seconds() - begin - model;
    if (e->n_waiting == 0 && e->n_running == 0) pthread_cond_broadcast(&e->idle);
    pthread_mutex_unlock(&e->lock);
    return st;
}

/* ------------------------------------------------------------ the thread */

static int has_work(const gpc_engine *e) {
    return e->n_waiting > 0 || e->n_running > 0 || e->cancels || e->launched != e->collected;
}

static void *engine_main(void *arg) {
    gpc_engine *e = arg;
    pthread_mutex_lock(&e->lock);
    while (!e->stop) {
        if (!has_work(e)) {
            pthread_cond_wait(&e->work, &e->lock);
            continue;
        }
        pthread_mutex_unlock(&e->lock);
        if (run_step(e, NULL) != GPC_OK)
            gpc_log(GPC_LOG_ERROR, "serving engine: a step failed: %s", e->error);
        pthread_mutex_lock(&e->lock);
    }
    pthread_mutex_unlock(&e->lock);
    return NULL;
}

gpc_status gpc_engine_start(gpc_engine *e) {
    pthread_mutex_lock(&e->lock);
    if (e->started) {
        pthread_mutex_unlock(&e->lock);
        return gpc_error(GPC_ERR_INVALID_ARG, "the engine's thread runs already");
    }
    int rc = pthread_create(&e->thread, NULL, engine_main, e);
    if (rc == 0) e->started = 1;
    pthread_mutex_unlock(&e->lock);
    if (rc != 0)
        return gpc_error(GPC_ERR_INTERNAL, "cannot start the engine's thread: %s", strerror(rc));
    return GPC_OK;
}

gpc_status gpc_engine_step(gpc_engine *e, int *active) {
    if (e->started)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "the engine runs its own thread (gpc_engine_start): steps are its, not "
                         "the caller's");
    return run_step(e, active);
}

gpc_status gpc_engine_drain(gpc_engine *e) {
    pthread_mutex_lock(&e->lock);
    e->draining = 1;
    if (e->started) {
        pthread_cond_broadcast(&e->work);
        while (e->n_waiting > 0 || e->n_running > 0 || e->delivering)
            pthread_cond_wait(&e->idle, &e->lock);
        pthread_mutex_unlock(&e->lock);
        return GPC_OK;
    }
    pthread_mutex_unlock(&e->lock);
    int active = 1;
    while (active)
        GPC_TRY(run_step(e, &active));
    return GPC_OK;
}

/* ------------------------------------------------------------ requests */

static gpc_status check_request(const gpc_engine *e, const gpc_engine_request *r) {
    if (!r->prompt || r->prompt_len == 0)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "a request needs a prompt of at least one token (the end-of-text token "
                         "starts a fresh text)");
    if (r->prompt_len > (size_t)e->context)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "the prompt's %zu tokens exceed the model's context of %d: shorten it",
                         r->prompt_len, e->context);
    if (blocks_for(e, (int)r->prompt_len) > e->kv.num_blocks)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "the prompt's %zu tokens need more than the whole cache (%d blocks of "
                         "%d): shorten it or give the cache more memory",
                         r->prompt_len, e->kv.num_blocks, e->block_size);
    for (size_t i = 0; i < r->prompt_len; i++)
        if (r->prompt[i] >= (uint32_t)e->vocab)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "prompt token %u (at %zu) is outside the vocabulary of %d",
                             r->prompt[i], i, e->vocab);
    if (r->max_tokens < 1)
        return gpc_error(GPC_ERR_INVALID_ARG, "max_tokens must be at least 1, not %d",
                         r->max_tokens);
    if (!(r->temperature >= 0) || r->top_k < 0 || r->min_tokens < 0)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "temperature, top_k and min_tokens must not be negative");
    if (!(r->top_p > 0.0f && r->top_p <= 1.0f))
        return gpc_error(GPC_ERR_INVALID_ARG, "top_p must be in (0, 1], not %g", (double)r->top_p);
    if (!r->callback)
        return gpc_error(GPC_ERR_INVALID_ARG, "a request needs a callback for its tokens");
    return GPC_OK;
}

gpc_status gpc_engine_submit(gpc_engine *e, const gpc_engine_request *request, uint64_t *id) {
    GPC_TRY(check_request(e, request));
    seq *s = gpc_calloc(1, sizeof *s);
    if (s) {
        s->tokens = gpc_malloc(((size_t)e->context + 1) * sizeof *s->tokens);
        s->blocks = gpc_malloc((size_t)e->max_blocks * sizeof *s->blocks);
        s->keys = gpc_malloc((size_t)e->max_blocks * sizeof *s->keys);
    }
    if (!s || !s->tokens || !s->blocks || !s->keys) {
        seq_free(s);
        return gpc_error(GPC_ERR_NOMEM, "out of host memory for a request");
    }
    s->req = *request;
    s->req.prompt = NULL; /* copied into tokens */
    memcpy(s->tokens, request->prompt, request->prompt_len * sizeof *s->tokens);
    s->n_tokens = s->prompt_len = (int)request->prompt_len;
    gpc_rng_seed(&s->rng, request->seed, ENGINE_RNG_STREAM);

    pthread_mutex_lock(&e->lock);
    gpc_status st = GPC_OK;
    if (e->stop || e->draining)
        st = gpc_error(GPC_ERR_INTERRUPTED, "the engine is shutting down and takes no requests");
    else if (e->n_waiting >= (size_t)e->o.max_queue)
        st =
            gpc_error(GPC_ERR_BUSY, "%zu requests wait already, the queue's bound: try again later",
                      e->n_waiting);
    if (st == GPC_OK) {
        s->id = ++e->next_id;
        wait_push_back(e, s);
        s->all_next = e->all;
        if (e->all) e->all->all_prev = s;
        e->all = s;
        e->stats.requests_total++;
        e->stats.prompt_tokens += request->prompt_len;
        e->stats.waiting = e->n_waiting;
        if (id) *id = s->id;
        pthread_cond_signal(&e->work);
    }
    pthread_mutex_unlock(&e->lock);
    if (st != GPC_OK) seq_free(s);
    return st;
}

void gpc_engine_cancel(gpc_engine *e, uint64_t id, gpc_finish_reason reason) {
    if (reason == GPC_FINISH_NONE) reason = GPC_FINISH_CANCELLED;
    pthread_mutex_lock(&e->lock);
    for (seq *s = e->all; s; s = s->all_next)
        if (s->id == id) {
            if (!s->cancel) {
                s->cancel = reason;
                e->cancels = 1;
                pthread_cond_signal(&e->work);
            }
            break;
        }
    pthread_mutex_unlock(&e->lock);
}

void gpc_engine_get_stats(gpc_engine *e, gpc_engine_stats *stats) {
    pthread_mutex_lock(&e->lock);
    *stats = e->stats;
    stats->wall_seconds = gpc_time_seconds() - e->created;
    pthread_mutex_unlock(&e->lock);
}

void gpc_engine_model(gpc_engine *e, gpc_engine_model_info *info) {
    *info = e->info;
}

const gpc_tokenizer *gpc_engine_tokenizer(gpc_engine *e) {
    return e->tokenizer;
}

/* ------------------------------------------------------------ creation */

static gpc_status check_options(const gpc_engine_options *o) {
    if (o->max_batch < 1 || o->block_size < 1 || o->max_queue < 1 || o->max_step_tokens < 1)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "max_batch (%d), block_size (%d), max_queue (%d) and max_step_tokens "
                         "(%d) must each be at least 1",
                         o->max_batch, o->block_size, o->max_queue, o->max_step_tokens);
    return GPC_OK;
}

/* The run folder's name, for /v1/models. */
static void run_name(const char *run_dir, char *out, size_t size) {
    size_t n = strlen(run_dir);
    while (n > 1 && run_dir[n - 1] == '/')
        n--;
    size_t start = n;
    while (start > 0 && run_dir[start - 1] != '/')
        start--;
    size_t len = n - start < size - 1 ? n - start : size - 1;
    memcpy(out, run_dir + start, len);
    out[len] = '\0';
}

/* Blocks of the cache: options->kv_bytes, or on a GPU 90% of what is free
 * after the weights and the step's buffers (on the CPU 1 GiB), never more
 * than the device has or GPC_DEVICE_MEMORY_LIMIT leaves, nor more than
 * max_batch sequences of the whole context can use. */
static gpc_status plan_blocks(gpc_engine *e, gpc_device device, const gpt_paged_options *po,
                              int *num_blocks) {
    const gpt_config *c = gpt_get_config(e->model);
    gpc_dtype dtype = gpt_dtype(e->model);
    size_t block = gpt_paged_block_bytes(c, dtype, e->block_size);
    size_t step = gpt_paged_step_bytes(c, dtype, po);
    size_t have;
    if (device.type == GPC_DEVICE_CPU) {
        size_t avail = gpc_host_memory_available();
        have = avail > step ? (avail - step) / 2 : 0; /* leave the host room to live */
    } else {
        size_t free_bytes = 0;
        GPC_TRY(gpc_device_memory_free(device, &free_bytes, NULL));
        have = free_bytes > step ? (size_t)((double)(free_bytes - step) * 0.9) : 0;
    }
    /* GPC_DEVICE_MEMORY_LIMIT (a GPU shared through gpcd's --mem, or set by
     * hand) caps the cache on every device, after the weights it counts */
    size_t want = e->o.kv_bytes                   ? e->o.kv_bytes
                  : device.type == GPC_DEVICE_CPU ? (size_t)1 << 30
                                                  : have;
    if (want > have && have > 0) want = have;
    size_t limit = gpc_device_memory_limit();
    if (limit) { /* one block more for the padding rows of a GPU's decode steps */
        size_t used = gpc_device_memory_in_use(device) + step + block;
        size_t left = used < limit ? limit - used : 0;
        if (want > left) want = left;
    }
    size_t blocks = want / block, useful = (size_t)e->o.max_batch * (size_t)e->max_blocks;
    if (blocks > useful) blocks = useful;
    if (blocks < 1)
        return gpc_error(GPC_ERR_NOMEM,
                         "the key/value cache's %zu bytes hold no block of %zu bytes (%d "
                         "positions): give it more memory (kv_bytes) or use smaller blocks",
                         want, block, e->block_size);
    *num_blocks = (int)blocks;
    return GPC_OK;
}

static gpc_status load_run(gpc_engine *e, const char *run_dir, gpc_device device, gpc_dtype dtype) {
    char weights[4200], tok_path[4200];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.bin", run_dir);
    /* checkpoint.bin, or quant.bin for a run of gpc quantize */
    gpt_config config;
    GPC_TRY(gpt_run_weights(run_dir, weights, sizeof weights, &config, NULL));
    if (gpc_path_exists(tok_path)) {
        GPC_TRY(gpc_tokenizer_load(&e->tokenizer, tok_path));
        if (gpc_tokenizer_vocab_size(e->tokenizer) != config.vocab_size)
            return gpc_error(GPC_ERR_MISMATCH,
                             "%s has %d tokens but the checkpoint's model has %d: the run folder "
                             "mixes two runs",
                             tok_path, gpc_tokenizer_vocab_size(e->tokenizer), config.vocab_size);
    }
    /* the step keeps no activations in the model: batch 1 x 1 is enough */
    return gpt_create_from_run(&e->model, run_dir, device, dtype, 1, 1);
}

gpc_status gpc_engine_create(gpc_engine **out, const char *run_dir, gpc_device device,
                             const gpc_engine_options *options) {
    *out = NULL;
    gpc_engine_options o;
    if (options)
        o = *options;
    else
        gpc_engine_options_init(&o);
    GPC_TRY(check_options(&o));
    gpc_dtype dtype = device.type == GPC_DEVICE_CPU ? GPC_F32 : o.precision;
    gpc_engine *e = gpc_calloc(1, sizeof *e);
    if (!e) return gpc_error(GPC_ERR_NOMEM, "out of host memory creating the engine");
    e->o = o;
    e->pipeline = o.pipeline && gpc_setting_flag("GPC_SERVE_PIPELINE");
    e->created = gpc_time_seconds();
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->work, NULL);
    pthread_cond_init(&e->idle, NULL);
    gpc_status s = load_run(e, run_dir, device, dtype);
    gpt_paged_options po = {0};
    if (s == GPC_OK) {
        const gpt_config *c = gpt_get_config(e->model);
        e->context = c->max_context;
        e->vocab = c->vocab_size;
        e->block_size = o.block_size;
        e->max_blocks = blocks_for(e, e->context);
        po.block_size = o.block_size;
        po.max_seqs = o.max_batch;
        po.max_tokens = o.max_step_tokens;
        po.max_logits = o.max_batch < o.max_step_tokens ? o.max_batch : o.max_step_tokens;
        po.eager = !o.cuda_graphs;
        s = plan_blocks(e, device, &po, &po.num_blocks);
    }
    if (s == GPC_OK) s = gpt_paged_create(&e->paged, e->model, &po);
    if (s == GPC_OK) s = kv_blocks_init(&e->kv, po.num_blocks, o.block_size);
    if (s == GPC_OK) {
        size_t B = (size_t)o.max_batch, N = (size_t)o.max_step_tokens;
        /* a round's events: every sequence's final one (preempted ones wait
         * beyond max_queue) and the tokens of two steps */
        e->max_events = o.max_queue + 4 * o.max_batch;
        e->running = gpc_malloc(B * sizeof *e->running);
        e->step = gpc_malloc(B * sizeof *e->step);
        e->tokens = gpc_malloc(N * sizeof *e->tokens);
        e->positions = gpc_malloc(N * sizeof *e->positions);
        e->seqs = gpc_malloc(N * sizeof *e->seqs);
        e->slots = gpc_malloc(N * sizeof *e->slots);
        e->feed = gpc_malloc(N * sizeof *e->feed);
        e->tables = gpc_malloc(B * (size_t)e->max_blocks * sizeof *e->tables);
        e->events = gpc_malloc((size_t)e->max_events * sizeof *e->events);
        int ok = e->running && e->step && e->tokens && e->positions && e->seqs && e->slots &&
                 e->feed && e->tables && e->events;
        for (int i = 0; i < 2; i++) {
            e->records[i].entries = gpc_malloc(B * sizeof *e->records[i].entries);
            e->records[i].drawn = gpc_malloc((size_t)po.max_logits * sizeof(int32_t));
            ok = ok && e->records[i].entries && e->records[i].drawn;
        }
        e->on_device = device.type != GPC_DEVICE_CPU;
        if (e->on_device) {
            e->sampling = gpc_malloc((size_t)po.max_logits * sizeof *e->sampling);
            ok = ok && e->sampling;
        } else {
            e->logits = gpc_malloc((size_t)po.max_logits * (size_t)e->vocab * sizeof *e->logits);
            e->sample_threads = omp_get_max_threads();
            e->sample_scratch = gpc_malloc((size_t)e->sample_threads * (size_t)e->vocab * 8);
            ok = ok && e->logits && e->sample_scratch;
        }
        if (!ok) s = gpc_error(GPC_ERR_NOMEM, "out of host memory for the engine's step buffers");
    }
    if (s != GPC_OK) {
        gpc_engine_free(e);
        return s;
    }
    run_name(run_dir, e->info.name, sizeof e->info.name);
    e->info.context = e->context;
    e->info.vocab_size = e->vocab;
    e->info.eos_token = e->tokenizer ? gpc_tokenizer_eot(e->tokenizer) : -1;
    e->stats.kv_blocks_total = (size_t)po.num_blocks;
    *out = e;
    return GPC_OK;
}

void gpc_engine_free(gpc_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->lock);
    e->stop = 1;
    pthread_cond_broadcast(&e->work);
    int started = e->started;
    pthread_mutex_unlock(&e->lock);
    if (started) pthread_join(e->thread, NULL);
    /* the steps in flight end first: what they drew is dropped */
    while (e->launched > e->collected) {
        if (e->on_device) gpt_step_paged_collect(e->paged, e->records[e->collected & 1].drawn);
        e->collected++;
    }
    /* what still runs or waits ends as cancelled, its callback told so */
    if (e->events) {
        pthread_mutex_lock(&e->lock);
        while (e->n_running > 0)
            finish_now(e, e->running[e->n_running - 1], GPC_FINISH_CANCELLED, e->n_running - 1);
        while (e->wait_head) {
            finish_now(e, e->wait_head, GPC_FINISH_CANCELLED, -1);
            if (e->n_events == e->max_events) {
                pthread_mutex_unlock(&e->lock);
                deliver(e);
                pthread_mutex_lock(&e->lock);
            }
        }
        pthread_mutex_unlock(&e->lock);
        deliver(e);
        reap(e);
    }
    if (e->kv.ref) kv_blocks_destroy(&e->kv);
    gpt_paged_free(e->paged);
    gpt_free(e->model);
    gpc_tokenizer_free(e->tokenizer);
    gpc_free(e->running);
    gpc_free(e->step);
    gpc_free(e->tokens);
    gpc_free(e->positions);
    gpc_free(e->seqs);
    gpc_free(e->slots);
    gpc_free(e->feed);
    for (int i = 0; i < 2; i++) {
        gpc_free(e->records[i].entries);
        gpc_free(e->records[i].drawn);
    }
    gpc_free(e->tables);
    gpc_free(e->logits);
    gpc_free(e->sample_scratch);
    gpc_free(e->sampling);
    gpc_free(e->events);
    pthread_cond_destroy(&e->work);
    pthread_cond_destroy(&e->idle);
    pthread_mutex_destroy(&e->lock);
    gpc_free(e);
}
