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
 * largest (top_k 0 or >= V: all of them). scratch holds V floats and V ints
 * (8*V bytes). */
uint32_t gpc_sample_token(const float *logits, int V, float temperature, int top_k, gpc_rng *rng,
                          void *scratch);

typedef struct {
    int max_tokens;     /* tokens to generate, default 200 */
    float temperature;  /* default 0.8 */
    int top_k;          /* default 40; 0 for all */
    int64_t stop_token; /* generation ends when this is drawn (not emitted); -1: never */
} gpc_generate_options;

void gpc_generate_options_init(gpc_generate_options *options);

/* Called with each generated token; a non-zero return stops generation. */
typedef int (*gpc_generate_callback)(void *user, uint32_t token);

/* Generates from a prompt (at least one token) with a model created for
 * batch 1 and its full context. The window slides when the text outgrows the
 * context. Each step recomputes the whole window (no KV cache yet), so a step
 * costs a forward pass over up to max_context tokens. *generated (optional)
 * receives the number of tokens emitted. */
gpc_status gpc_generate(gpt_model *model, const uint32_t *prompt, size_t prompt_len,
                        const gpc_generate_options *options, gpc_rng *rng,
                        gpc_generate_callback callback, void *user, size_t *generated);

#ifdef __cplusplus
}
#endif

#endif /* GPC_SERVE_H */
