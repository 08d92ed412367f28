/*
 * gpc serve: text generation from a trained GPT: sampling the next token
 * from logits (temperature, top-k) and the generation loop.
 *
 * Sampling runs on the CPU from the last position's logits, which is cheap
 * next to the forward pass and keeps the random stream identical on every
 * device: the same seed gives the same text on the CPU and on a GPU, up to
 * the logits' own rounding.
 */
#ifndef GPC_SERVE_H
#define GPC_SERVE_H

#include "gpc/core.h"
#include "gpc/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Picks a token from logits[V]: temperature 0 is greedy (the first largest
 * logit); otherwise softmax(logits / temperature) restricted to the top_k
 * largest (top_k 0 or >= V: all of them), and then, with top_p < 1, to the
 * likeliest of those whose probabilities sum to top_p or just past it
 * (nucleus sampling; top_p 1 keeps them all). scratch holds 8*V bytes. */
uint32_t gpc_sample_token(const float *logits, int V, float temperature, int top_k, float top_p,
                          gpc_rng *rng, void *scratch);

typedef struct {
    int max_tokens;     /* tokens to generate, default 200 */
    float temperature;  /* default 0.8 */
    int top_k;          /* default 40; 0 for all */
    float top_p;        /* default 1 (off): nucleus sampling over probability top_p */
    int64_t stop_token; /* generation ends when this is drawn (not emitted); -1: never */
    int min_tokens;     /* stop_token is drawn again, not obeyed, before this many tokens;
                           default 0 */
    int kv_cache;       /* default 1: keep keys and values, run one position a step;
                           0: recompute the whole window every step */
} gpc_generate_options;

void gpc_generate_options_init(gpc_generate_options *options);

/* Why a generation ended. */
typedef enum {
    GPC_GENERATE_TOKEN_LIMIT = 0, /* max_tokens were generated */
    GPC_GENERATE_END_OF_TEXT,     /* the stop token was drawn */
    GPC_GENERATE_CALLBACK,        /* the callback asked to stop */
} gpc_generate_stop;

typedef struct {
    size_t generated;       /* tokens emitted */
    gpc_generate_stop stop; /* why it ended (meaningless on an error) */
    int window_drops;       /* times the text filled the context and the window slid */
} gpc_generate_result;

/* Tokens the generation window drops when it is full: a quarter of the
 * context (at least one), so a token always sees at least 3/4 of it. */
int gpc_generate_window_drop(int context);

/* Called with each generated token; a non-zero return stops generation. */
typedef int (*gpc_generate_callback)(void *user, uint32_t token);

/* Generates from a prompt (at least one token) with a model created for
 * batch 1 and its full context. The prompt runs once; after that each step
 * runs only the newly drawn token through the model, its attention reading
 * the keys and values kept from earlier positions (gpt_forward_cached). When
 * the text fills the context, the window drops its oldest
 * gpc_generate_window_drop(context) tokens and runs once more from position
 * 0 (the positions have shifted). With options->kv_cache 0 every step
 * recomputes the whole window instead, the same window; the logits agree up
 * to rounding. *generated (optional) receives the number of tokens emitted. */
gpc_status gpc_generate(gpt_model *model, const uint32_t *prompt, size_t prompt_len,
                        const gpc_generate_options *options, gpc_rng *rng,
                        gpc_generate_callback callback, void *user, size_t *generated);
/* gpc_generate that also says why it stopped and whether the text outgrew the
 * context (result optional). */
gpc_status gpc_generate_run(gpt_model *model, const uint32_t *prompt, size_t prompt_len,
                            const gpc_generate_options *options, gpc_rng *rng,
                            gpc_generate_callback callback, void *user,
                            gpc_generate_result *result);

#ifdef __cplusplus
}
#endif

#endif /* GPC_SERVE_H */
