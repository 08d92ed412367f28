/*
 * sample.c: generation from a GPT: drawing a token (the rule itself is
 * gpc_sample_select, src/ops/sample_rule.c, which the serving op shares)
 * and the loop that feeds each drawn token back as input.
 */
#include "gpc/serve.h"
#include "ops/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void gpc_generate_options_init(gpc_generate_options *o) {
    o->max_tokens = 200;
    o->temperature = 0.8f;
    o->top_k = 40;
    o->top_p = 1.0f;
    o->stop_token = -1;
    o->min_tokens = 0;
    o->kv_cache = 1;
}

uint32_t gpc_sample_token(const float *logits, int V, float temperature, int top_k, float top_p,
                          gpc_rng *rng, void *scratch) {
    /* greedy draws no number, so a seeded stream is the same with and
     * without greedy steps in between */
    double uniform = temperature <= 0.0f ? 0.0 : gpc_rng_uniform64(rng);
    return gpc_sample_select(logits, V, temperature, top_k, top_p, uniform, scratch);
}

int gpc_generate_window_drop(int context) {
    return context >= 4 ? context / 4 : 1;
}

gpc_status gpc_generate(gpt_model *m, const uint32_t *prompt, size_t prompt_len,
                        const gpc_generate_options *o, gpc_rng *rng, gpc_generate_callback callback,
                        void *user, size_t *generated) {
    gpc_generate_result r;
    gpc_status s = gpc_generate_run(m, prompt, prompt_len, o, rng, callback, user, &r);
    if (generated) *generated = r.generated;
    return s;
}

gpc_status gpc_generate_run(gpt_model *m, const uint32_t *prompt, size_t prompt_len,
                            const gpc_generate_options *o, gpc_rng *rng,
                            gpc_generate_callback callback, void *user,
                            gpc_generate_result *result) {
    gpc_generate_result ignored = {0, GPC_GENERATE_TOKEN_LIMIT, 0};
    gpc_generate_result *r = result ? result : &ignored;
    *r = ignored;
    if (prompt_len == 0)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "generation needs a prompt of at least one token (the end-of-text token "
                         "starts a fresh text)");
    if (o->max_tokens < 0 || o->temperature < 0 || o->top_k < 0 || o->min_tokens < 0)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "tokens, minimum tokens, temperature and top-k must not be negative");
    if (!(o->top_p > 0.0f && o->top_p <= 1.0f))
        return gpc_error(GPC_ERR_INVALID_ARG, "top-p must be in (0, 1], not %g", (double)o->top_p);
    int V = gpt_get_config(m)->vocab_size, maxT = gpt_context(m);
    int32_t *window = gpc_malloc((size_t)maxT * sizeof(int32_t));
    float *logits = gpc_malloc((size_t)V * sizeof(float));
    void *scratch = gpc_malloc((size_t)V * 8);
    if (!window || !logits || !scratch) {
        gpc_free(window), gpc_free(logits), gpc_free(scratch);
        return gpc_error(GPC_ERR_NOMEM, "out of host memory for generation");
    }
    /* the last maxT tokens of the prompt */
    size_t skip = prompt_len > (size_t)maxT ? prompt_len - (size_t)maxT : 0;
    int len = (int)(prompt_len - skip);
    gpc_status s = GPC_OK;
    for (int i = 0; i < len; i++) {
        if (prompt[skip + i] >= (uint32_t)V) {
            s = gpc_error(GPC_ERR_INVALID_ARG, "prompt token %u is outside the vocabulary (%d)",
                          prompt[skip + i], V);
            break;
        }
        window[i] = (int32_t)prompt[skip + i];
    }
    /* with the cache, window[0 .. cached) have their keys and values in the
     * model and each step runs only the positions after them */
    int cached = 0;
    for (int step = 0; s == GPC_OK && step < o->max_tokens; step++) {
        s = o->kv_cache ? gpt_forward_cached(m, window + cached, cached, len - cached, logits)
                        : gpt_forward_last_logits(m, window, 1, len, logits);
        if (s != GPC_OK) break;
        cached = len;
        /* below min_tokens the stop token cannot be drawn: its probability
         * goes to the other tokens in proportion, as if it were not there */
        if (o->stop_token >= 0 && o->stop_token < V && r->generated < (size_t)o->min_tokens)
            logits[o->stop_token] = -INFINITY;
        uint32_t token =
            gpc_sample_token(logits, V, o->temperature, o->top_k, o->top_p, rng, scratch);
        if (o->stop_token >= 0 && token == (uint64_t)o->stop_token &&
            r->generated >= (size_t)o->min_tokens) {
            r->stop = GPC_GENERATE_END_OF_TEXT;
            break;
        }
        r->generated++;
        if (callback && callback(user, token)) {
            r->stop = GPC_GENERATE_CALLBACK;
            break;
        }
        if (len == maxT) {
            /* the window is full: drop its oldest quarter. Positions shift,
             * so what the cache kept is recomputed once, on the next step,
             * and each token still sees at least 3/4 of the context. */
            int drop = gpc_generate_window_drop(maxT);
            memmove(window, window + drop, (size_t)(maxT - drop) * sizeof(int32_t));
            len -= drop;
            cached = 0;
            r->window_drops++;
        }
        window[len++] = (int32_t)token;
    }
    gpc_free(window), gpc_free(logits), gpc_free(scratch);
    return s;
}
