/*
 * gpc/engine.h: the serving engine: many generation requests at once over
 * one model, batched step by step (continuous batching), with keys and
 * values in a paged cache.
 *
 * One engine thread owns the model. Each step it runs every active sequence
 * together: one new token for each sequence that is decoding, and a chunk
 * of the prompt for each that is still reading it (chunked prefill, so a
 * long prompt never stalls the running streams). New requests join at the
 * next step; finished ones leave and give their cache blocks back. Keys and
 * values live in fixed-size blocks allocated once at creation; a sequence
 * lists its blocks in a block table (ops.h, "serving"), and sequences whose
 * prompts share a prefix of whole blocks share those blocks.
 *
 * Any thread may submit and cancel; results come back through each
 * request's callback, called on the engine thread. The HTTP server
 * (gpc serve) is one client of this interface; tests drive it directly.
 */
#ifndef GPC_ENGINE_H
#define GPC_ENGINE_H

#include "gpc/core.h"
#include "gpc/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpc_engine gpc_engine;

typedef struct {
    int max_batch;       /* sequences active in one step; default 256 */
    size_t kv_bytes;     /* memory for the paged key/value cache; 0: the default
                            (on a GPU 90% of what is free after the weights, on
                            the CPU 1 GiB), capped by what the device has
                            and by what max_batch sequences of the whole
                            context can use */
    int block_size;      /* positions per cache block; default 16 */
    int max_queue;       /* requests waiting for a slot before submit refuses
                            more with GPC_ERR_BUSY; default 1024 */
    int max_step_tokens; /* tokens of one step, decodes and prefill chunks
                            together; default 2048 */
    int cuda_graphs;     /* GPU: capture decode steps of common batch sizes; default 1 */
    int pipeline;        /* launch each step before handling the previous one's tokens,
                            so the device never waits for the host; default 1
                            (GPC_SERVE_PIPELINE=0 turns it off too) */
    gpc_dtype precision; /* compute dtype on a GPU (bf16 default); the CPU is f32 */
} gpc_engine_options;

void gpc_engine_options_init(gpc_engine_options *options);

/* Why a sequence ended. */
typedef enum {
    GPC_FINISH_NONE = 0,  /* still running (an event carrying a token) */
    GPC_FINISH_LENGTH,    /* max_tokens generated, or the context is full */
    GPC_FINISH_STOP,      /* the client's stop condition (gpc_engine_cancel with stop) */
    GPC_FINISH_EOS,       /* the end-of-text token was drawn */
    GPC_FINISH_CANCELLED, /* cancelled (client gone, or the engine shutting down) */
    GPC_FINISH_ERROR,     /* the engine failed; message in the event */
} gpc_finish_reason;

const char *gpc_finish_reason_name(gpc_finish_reason reason); /* "length", "stop", ... */

typedef struct {
    uint64_t id;
    int32_t token;            /* the new token, or -1 on a final event without one */
    gpc_finish_reason finish; /* GPC_FINISH_NONE except on the last event of a request */
    size_t prompt_tokens;
    size_t generated;    /* tokens generated so far, this one included */
    const char *message; /* GPC_FINISH_ERROR: what failed */
} gpc_engine_event;

/* Called on the engine thread, once per generated token and once more (or
 * with the last token) with finish set; it must be quick (queue the token,
 * wake a connection) and must not call back into the engine except
 * gpc_engine_cancel. After the final event the request is gone.
 * The final event carries the last token when max_tokens or the context
 * ends the request (GPC_FINISH_LENGTH), and token -1 otherwise: the
 * end-of-text token that ends a request (GPC_FINISH_EOS) is not emitted,
 * as gpc sample does not print it. A sequence that alone fills the whole
 * cache ends with GPC_FINISH_LENGTH too (its context is what the cache
 * holds). */
typedef void (*gpc_engine_callback)(void *user, const gpc_engine_event *event);

typedef struct {
    const uint32_t *prompt; /* at least one token; copied by submit */
    size_t prompt_len;
    int max_tokens;    /* default 16 (as the completions API) */
    float temperature; /* 0 greedy; default 1 */
    int top_k;         /* 0: all */
    float top_p;       /* 1: off */
    uint64_t seed;     /* the request's own random stream: gpc sample's for
                          this seed, so both draw the same tokens */
    int64_t eos_token; /* -1: none */
    int ignore_eos;    /* keep going past eos_token */
    int min_tokens;    /* eos is not drawn before this many tokens (its
                          probability goes to the others, as gpc sample) */
    gpc_engine_callback callback;
    void *user;
} gpc_engine_request;

void gpc_engine_request_init(gpc_engine_request *request);

/* Loads a run folder (a checkpoint written by gpc train, an import from
 * Hugging Face, a merged LoRA run) onto device and allocates the cache:
 * everything a step needs is allocated here, never later. */
gpc_status gpc_engine_create(gpc_engine **out, const char *run_dir, gpc_device device,
                             const gpc_engine_options *options);
/* Starts the engine thread. Without it, gpc_engine_step runs steps on the
 * caller's thread (what deterministic tests do). */
gpc_status gpc_engine_start(gpc_engine *engine);
/* Queues a request; *id identifies it in events and for cancel. A full
 * queue is GPC_ERR_BUSY (the server's 503 with Retry-After), an engine
 * draining or stopped GPC_ERR_INTERRUPTED, a prompt longer than the
 * context or than the whole cache GPC_ERR_INVALID_ARG. */
gpc_status gpc_engine_submit(gpc_engine *engine, const gpc_engine_request *request, uint64_t *id);
/* Ends a request at the next step with reason (GPC_FINISH_STOP when the
 * client's stop string matched, GPC_FINISH_CANCELLED when it went away);
 * its blocks are free after that step. Unknown or finished ids are ignored. */
void gpc_engine_cancel(gpc_engine *engine, uint64_t id, gpc_finish_reason reason);
/* One step on the caller's thread (engine not started): *active receives
 * the number of sequences still running or waiting afterwards. */
gpc_status gpc_engine_step(gpc_engine *engine, int *active);
/* Stops taking requests and returns once every admitted request finished. */
gpc_status gpc_engine_drain(gpc_engine *engine);
/* Stops the thread (cancelling what runs) and frees everything. */
void gpc_engine_free(gpc_engine *engine);

typedef struct {
    size_t waiting, running; /* requests queued, sequences in the batch */
    size_t kv_blocks_used, kv_blocks_total;
    uint64_t requests_total, tokens_generated, prompt_tokens, steps, preemptions;
    double busy_seconds; /* device time of steps (GPU: CUDA events) */
    double host_seconds; /* engine thread time outside the model's calls: scheduling,
                            batching, CPU sampling, callbacks */
    double wall_seconds; /* since start */
} gpc_engine_stats;

void gpc_engine_get_stats(gpc_engine *engine, gpc_engine_stats *stats);

/* The model's facts a server reports (name for /v1/models, context, vocab,
 * the end-of-text token, -1 when the tokenizer has none). */
typedef struct {
    char name[256];
    int context, vocab_size;
    int64_t eos_token;
} gpc_engine_model_info;

void gpc_engine_model(gpc_engine *engine, gpc_engine_model_info *info);

/* The run's tokenizer (RUN/tokenizer.bin), or NULL when the run has none
 * (then prompts come as token ids). It lives as long as the engine, which
 * never changes it: the server encodes prompts and decodes tokens with it
 * on its own threads (gpc_tokenizer_encode, gpc_tokenizer_token_bytes). */
const gpc_tokenizer *gpc_engine_tokenizer(gpc_engine *engine);

#ifdef __cplusplus
}
#endif

#endif /* GPC_ENGINE_H */
