/* test_gpt_sample.c: sampling and generation. The sampler's frequencies
 * match the exact top-k/temperature distribution computed here in float64
 * (a chi-square bound), greedy picks the argmax, generation (with kept keys
 * and values and without) equals a hand-written loop of full forward passes,
 * the window's drops included (and counted), a stop token ends it unless
 * fewer than min_tokens were drawn, and the kept-keys forward equals the full
 * one at every position, in training models under every recomputation
 * setting too. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/model.h"
#include "gpc/serve.h"

static void test_sample_distribution(void **state) {
    (void)state;
    enum { V = 50, DRAWS = 200000, CASES = 6 };
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 41);
    float logits[V];
    for (int v = 0; v < V; v++)
        logits[v] = 2.0f * gpc_rng_normal(&rng);
    static char scratch[V * 8];
    const int ks[CASES] = {0, 5, 1, 0, 8, 0};
    const float temps[CASES] = {1.0f, 0.5f, 2.0f, 1.0f, 0.7f, 2.0f};
    const float ps[CASES] = {1.0f, 1.0f, 1.0f, 0.9f, 0.6f, 0.3f};
    /* the logits' order, largest first */
    int order[V];
    for (int v = 0; v < V; v++)
        order[v] = v;
    for (int i = 0; i < V; i++)
        for (int j = i + 1; j < V; j++)
            if (logits[order[j]] > logits[order[i]]) {
                int t = order[i];
                order[i] = order[j], order[j] = t;
            }
    for (int c = 0; c < CASES; c++) {
        int k = ks[c] ? ks[c] : V;
        float temp = temps[c];
        /* exact probabilities: softmax(logits / temp) over the k largest,
         * then the likeliest of those up to and including the one whose
         * cumulative probability reaches p */
        double p[V] = {0}, total = 0, kept = 0;
        for (int i = 0; i < k; i++)
            total += exp((double)logits[order[i]] / temp);
        for (int i = 0; i < k && (i == 0 || kept < ps[c] * total); i++) {
            p[order[i]] = exp((double)logits[order[i]] / temp);
            kept += p[order[i]];
        }
        int counts[V] = {0};
        for (int i = 0; i < DRAWS; i++) {
            uint32_t t = gpc_sample_token(logits, V, temp, ks[c], ps[c], &rng, scratch);
            assert_true(t < V);
            counts[t]++;
        }
        double chi2 = 0;
        int dof = -1;
        for (int v = 0; v < V; v++) {
            double expect = p[v] / kept * DRAWS;
            if (expect == 0) {
                if (counts[v] != 0)
                    fail_msg("top-k %d top-p %g: token %d, outside the kept set, drawn %d times",
                             ks[c], (double)ps[c], v, counts[v]);
                continue;
            }
            chi2 += (counts[v] - expect) * (counts[v] - expect) / expect;
            dof++;
        }
        /* chi-square with dof degrees of freedom: mean dof, sd sqrt(2 dof);
         * 6 sd leaves a false alarm rate far below one in a million */
        if (dof > 0 && chi2 > dof + 6 * sqrt(2.0 * dof))
            fail_msg("top-k %d top-p %g temperature %g: chi-square %.1f for %d degrees of freedom",
                     ks[c], (double)ps[c], temp, chi2, dof);
    }
    /* temperature 0: the first largest logit */
    logits[17] = 100.0f;
    logits[30] = 100.0f;
    assert_int_equal(gpc_sample_token(logits, V, 0.0f, 40, 1.0f, &rng, scratch), 17);
    /* top-p this small keeps the likeliest token alone (of two equal, the
     * first) */
    for (int i = 0; i < 100; i++)
        assert_int_equal(gpc_sample_token(logits, V, 1.0f, 0, 1e-6f, &rng, scratch), 17);
}

/* Collects generated tokens. */
typedef struct {
    uint32_t got[32];
    int n;
} token_sink;

static int collect(void *user, uint32_t token) {
    token_sink *s = user;
    if (s->n < 32) s->got[s->n] = token;
    s->n++;
    return 0;
}

/* A CPU model for sampling (batch 1, its whole context). */
static gpt_model *inference_model(int L, int NH, int C, int T, int V) {
    gpt_config c;
    gpt_model *m = NULL;
    TEST_OK(gpt_config_init(&c, L, NH, C, T, V));
    TEST_OK(gpt_create(&m, &c, gpc_cpu(), GPC_F32, 1, T, 0));
    return m;
}

/* The greedy reference: the window gpc_generate keeps (the prompt's last T
 * tokens; when full it drops its oldest gpc_generate_window_drop(T)), run
 * whole through the model at every step. Returns the smallest gap between
 * the two largest logits over the steps, so a caller can avoid near ties
 * that rounding alone could flip. */
static float greedy_reference(gpt_model *m, const uint32_t *prompt, int plen, int steps,
                              int32_t *out) {
    int T = gpt_context(m), V = gpt_get_config(m)->vocab_size;
    int32_t window[64];
    int len = plen < T ? plen : T;
    for (int i = 0; i < len; i++)
        window[i] = (int32_t)prompt[plen - len + i];
    float *logits = malloc((size_t)T * V * sizeof(float)), gap = INFINITY;
    for (int s = 0; s < steps; s++) {
        TEST_OK(gpt_forward(m, window, NULL, 1, len));
        TEST_OK(gpt_copy_logits(m, logits));
        const float *last = logits + (size_t)(len - 1) * V;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (last[v] > last[best]) best = v;
        for (int v = 0; v < V; v++)
            if (v != best) gap = fminf(gap, last[best] - last[v]);
        out[s] = best;
        if (len == T) {
            int drop = gpc_generate_window_drop(T);
            memmove(window, window + drop, (size_t)(T - drop) * sizeof(int32_t));
            len -= drop;
        }
        window[len++] = best;
    }
    free(logits);
    return gap;
}

/* Greedy generation, with kept keys and values and without, against the
 * reference loop of full forward passes; prompts shorter and longer than
 * the context, and enough steps for the window to drop tokens several times. */
static void test_generate_matches_forward(void **state) {
    (void)state;
    enum { V = 40, T = 8, STEPS = 16 };
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 42);
    gpt_model *m = inference_model(2, 2, 16, T, V);
    float *w = malloc(gpt_num_params(m) * sizeof(float));
    uint32_t prompt[11];
    int32_t want[STEPS];
    for (int plen = 3; plen <= 11; plen += 8) {
        /* weights larger than the initialisation's so the argmax is
         * clear-cut; redrawn in the rare case of a near tie */
        float gap = 0;
        for (int draw = 0; draw < 20 && gap < 1e-3f; draw++) {
            gpc_rng_fill_normal(&rng, w, gpt_num_params(m), 0.0f, 0.5f);
            TEST_OK(gpt_set_params(m, w));
            for (int i = 0; i < plen; i++)
                prompt[i] = gpc_rng_below(&rng, V);
            gap = greedy_reference(m, prompt, plen, STEPS, want);
        }
        assert_true(gap >= 1e-3f);
        for (int cache = 0; cache <= 1; cache++) {
            gpc_generate_options o;
            gpc_generate_options_init(&o);
            o.max_tokens = STEPS;
            o.temperature = 0.0f;
            o.kv_cache = cache;
            token_sink out = {{0}, 0};
            size_t generated;
            TEST_OK(gpc_generate(m, prompt, (size_t)plen, &o, &rng, collect, &out, &generated));
            assert_int_equal(generated, STEPS);
            assert_int_equal(out.n, STEPS);
            for (int s = 0; s < STEPS; s++)
                if (out.got[s] != (uint32_t)want[s])
                    fail_msg("prompt of %d, cache %d: step %d drew %u, the reference %d", plen,
                             cache, s, out.got[s], want[s]);

            /* a stop token ends generation before it is emitted */
            o.stop_token = want[4];
            int first = 0;
            while (want[first] != want[4])
                first++; /* its first occurrence in the output */
            out.n = 0;
            TEST_OK(gpc_generate(m, prompt, (size_t)plen, &o, &rng, collect, &out, &generated));
            assert_int_equal(generated, first);
            assert_int_equal(out.n, first);
            gpc_generate_result r;
            out.n = 0;
            TEST_OK(gpc_generate_run(m, prompt, (size_t)plen, &o, &rng, collect, &out, &r));
            assert_int_equal(r.generated, first);
            assert_int_equal(r.stop, GPC_GENERATE_END_OF_TEXT);

            /* below min_tokens the stop token is never drawn: greedy takes
             * the runner-up there, and the text before it is unchanged */
            o.min_tokens = first + 1;
            out.n = 0;
            TEST_OK(gpc_generate_run(m, prompt, (size_t)plen, &o, &rng, collect, &out, &r));
            assert_true(r.generated >= (size_t)first + 1);
            for (int s = 0; s < first; s++)
                assert_int_equal(out.got[s], want[s]);
            for (int s = 0; s <= first; s++)
                assert_int_not_equal(out.got[s], want[4]);
            assert_int_equal(r.stop, r.generated == STEPS ? GPC_GENERATE_TOKEN_LIMIT
                                                          : GPC_GENERATE_END_OF_TEXT);
            o.min_tokens = 0;

            /* no stop token: the limit, and the window's drops counted as
             * the loop above makes them */
            o.stop_token = -1;
            TEST_OK(gpc_generate_run(m, prompt, (size_t)plen, &o, &rng, NULL, NULL, &r));
            assert_int_equal(r.generated, STEPS);
            assert_int_equal(r.stop, GPC_GENERATE_TOKEN_LIMIT);
            int len = plen < T ? plen : T, drops = 0;
            for (int s = 0; s < STEPS; s++) {
                if (len == T) len -= gpc_generate_window_drop(T), drops++;
                len++;
            }
            assert_int_equal(r.window_drops, drops);
            assert_true(drops >= 2);
        }
    }

    /* bad input */
    gpc_generate_options o;
    gpc_generate_options_init(&o);
    uint32_t bad = V;
    TEST_FAILS(gpc_generate(m, &bad, 1, &o, &rng, NULL, NULL, NULL), GPC_ERR_INVALID_ARG,
               "outside the vocabulary");
    TEST_FAILS(gpc_generate(m, prompt, 0, &o, &rng, NULL, NULL, NULL), GPC_ERR_INVALID_ARG,
               "at least one token");
    const float bad_p[3] = {0.0f, -0.5f, 1.5f};
    for (int i = 0; i < 3; i++) {
        o.top_p = bad_p[i];
        TEST_FAILS(gpc_generate(m, prompt, 1, &o, &rng, NULL, NULL, NULL), GPC_ERR_INVALID_ARG,
                   "top-p must be in (0, 1]");
    }
    free(w);
    gpt_free(m);
}

/* gpt_forward_cached against full forward passes: the prompt in chunks of
 * random sizes, then one position at a time, each call's logits equal to
 * those of the whole sequence so far; a new sequence from position 0; and
 * the calls it must refuse. */
static void test_forward_cached(void **state) {
    (void)state;
    enum { V = 50, T = 24 };
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 43);
    gpt_model *m = inference_model(3, 4, 32, T, V);
    float *w = malloc(gpt_num_params(m) * sizeof(float));
    gpc_rng_fill_normal(&rng, w, gpt_num_params(m), 0.0f, 0.3f);
    TEST_OK(gpt_set_params(m, w));
    float *full = malloc((size_t)T * V * sizeof(float)), got[V];
    for (int round = 0; round < 2; round++) {
        int32_t seq[T];
        for (int i = 0; i < T; i++)
            seq[i] = (int32_t)gpc_rng_below(&rng, V);
        int pos = 0;
        while (pos < T) {
            /* chunks of 1..6 positions, then single positions past half */
            int n = pos < T / 2 ? 1 + (int)gpc_rng_below(&rng, 6) : 1;
            if (n > T - pos) n = T - pos;
            TEST_OK(gpt_forward_cached(m, seq + pos, pos, n, got));
            assert_int_equal(gpt_cached_len(m), pos + n);
            pos += n;
            /* the reference overwrites what is kept: check, then rebuild it */
            TEST_OK(gpt_forward(m, seq, NULL, 1, pos));
            assert_int_equal(gpt_cached_len(m), 0);
            TEST_OK(gpt_copy_logits(m, full));
            char what[64];
            snprintf(what, sizeof what, "round %d, positions to %d", round, pos);
            test_assert_close_f32(what, got, full + (size_t)(pos - 1) * V, V, 1e-5, 1.0);
            TEST_OK(gpt_forward_cached(m, seq, 0, pos, got));
            test_assert_close_f32(what, got, full + (size_t)(pos - 1) * V, V, 1e-5, 1.0);
        }
    }

    /* refused: gaps, the context's end, bad tokens, stale keys */
    int32_t tok[T] = {0};
    TEST_OK(gpt_forward_cached(m, tok, 0, 4, got));
    TEST_FAILS(gpt_forward_cached(m, tok, 5, 1, got), GPC_ERR_INVALID_ARG, "not kept");
    TEST_FAILS(gpt_forward_cached(m, tok, 4, T - 3, got), GPC_ERR_INVALID_ARG, "context");
    TEST_FAILS(gpt_forward_cached(m, tok, 4, 0, got), GPC_ERR_INVALID_ARG, "context");
    tok[1] = V;
    TEST_FAILS(gpt_forward_cached(m, tok, 4, 2, got), GPC_ERR_INVALID_ARG, "vocabulary");
    tok[1] = 0;
    TEST_OK(gpt_forward_cached(m, tok, 4, 1, got));
    TEST_OK(gpt_set_params(m, w));
    assert_int_equal(gpt_cached_len(m), 0);
    TEST_FAILS(gpt_forward_cached(m, tok, 5, 1, got), GPC_ERR_INVALID_ARG, "not kept");
    free(w), free(full);
    gpt_free(m);
}

/* gpt_forward_cached on models created for training with each setting of
 * activation recomputation (none, GELU, layernorm, block, block on the
 * first 2 of 3 layers): a prompt of 5 positions, then one position at a
 * time, each call's logits equal to gpt_forward's on the whole sequence
 * so far in an inference model with the same weights. Recomputed blocks
 * share one slot of keys and values, so the kept ones of earlier positions
 * would be the last such block's; the bound is f32 rounding (1e-5 of the
 * logits' scale). */
static void test_forward_cached_recompute(void **state) {
    (void)state;
    enum { V = 50, T = 16, L = 3, B = 2, PROMPT = 5 };
    const int settings[] = {GPT_RECOMPUTE_NONE, GPT_RECOMPUTE_GELU, GPT_RECOMPUTE_LAYERNORM,
                            GPT_RECOMPUTE_BLOCK, GPT_RECOMPUTE(GPT_RECOMPUTE_BLOCK, 2)};
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 47);
    gpt_model *ref = inference_model(L, 4, 32, T, V);
    float *w = malloc(gpt_num_params(ref) * sizeof(float));
    gpc_rng_fill_normal(&rng, w, gpt_num_params(ref), 0.0f, 0.3f);
    TEST_OK(gpt_set_params(ref, w));
    int32_t seq[T];
    for (int i = 0; i < T; i++)
        seq[i] = (int32_t)gpc_rng_below(&rng, V);
    float *full = malloc((size_t)T * V * sizeof(float)), got[V];
    TEST_OK(gpt_forward(ref, seq, NULL, 1, T));
    TEST_OK(gpt_copy_logits(ref, full));
    gpt_config c;
    TEST_OK(gpt_config_init(&c, L, 4, 32, T, V));
    for (size_t k = 0; k < sizeof settings / sizeof settings[0]; k++) {
        gpt_model *m = NULL;
        TEST_OK(gpt_create_recompute(&m, &c, gpc_cpu(), GPC_F32, B, T, 1, settings[k]));
        TEST_OK(gpt_set_params(m, w));
        char name[32], what[96];
        gpt_recompute_name(settings[k], name, sizeof name);
        for (int pos = 0; pos < T;) {
            int n = pos ? 1 : PROMPT;
            TEST_OK(gpt_forward_cached(m, seq + pos, pos, n, got));
            pos += n;
            assert_int_equal(gpt_cached_len(m), pos);
            snprintf(what, sizeof what, "recompute %s, positions to %d", name, pos);
            test_assert_close_f32(what, got, full + (size_t)(pos - 1) * V, V, 1e-5, 1.0);
        }
        gpt_free(m);
    }
    free(w), free(full);
    gpt_free(ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sample_distribution),
        cmocka_unit_test(test_generate_matches_forward),
        cmocka_unit_test(test_forward_cached),
        cmocka_unit_test(test_forward_cached_recompute),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
