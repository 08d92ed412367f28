/* test_gpt_sample.c: sampling and generation. The sampler's frequencies
 * match the exact top-k/temperature distribution computed here in float64
 * (a chi-square bound), greedy picks the argmax, and generation equals a
 * hand-written loop of full forward passes, window sliding included. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/model.h"
#include "gpc/serve.h"

static void test_sample_distribution(void **state) {
    (void)state;
    enum { V = 50, DRAWS = 200000 };
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 41);
    float logits[V];
    for (int v = 0; v < V; v++)
        logits[v] = 2.0f * gpc_rng_normal(&rng);
    static char scratch[V * 8];
    const int ks[3] = {0, 5, 1};
    const float temps[3] = {1.0f, 0.5f, 2.0f};
    for (int c = 0; c < 3; c++) {
        int k = ks[c];
        float temp = temps[c];
        /* exact probabilities: softmax(logits / temp) over the k largest */
        double p[V], total = 0;
        float kth = -INFINITY;
        if (k) {
            float sorted[V];
            memcpy(sorted, logits, sizeof sorted);
            for (int i = 0; i < V; i++)
                for (int j = i + 1; j < V; j++)
                    if (sorted[j] > sorted[i]) {
                        float t = sorted[i];
                        sorted[i] = sorted[j], sorted[j] = t;
                    }
            kth = sorted[k - 1];
        }
        for (int v = 0; v < V; v++) {
            p[v] = logits[v] >= kth ? exp((double)logits[v] / temp) : 0.0;
            total += p[v];
        }
        int counts[V] = {0};
        for (int i = 0; i < DRAWS; i++) {
            uint32_t t = gpc_sample_token(logits, V, temp, k, &rng, scratch);
            assert_true(t < V);
            counts[t]++;
        }
        double chi2 = 0;
        int dof = -1;
        for (int v = 0; v < V; v++) {
            double expect = p[v] / total * DRAWS;
            if (expect == 0) {
                assert_int_equal(counts[v], 0); /* outside the top k: never drawn */
                continue;
            }
            chi2 += (counts[v] - expect) * (counts[v] - expect) / expect;
            dof++;
        }
        /* chi-square with dof degrees of freedom: mean dof, sd sqrt(2 dof);
         * 6 sd leaves a false alarm rate far below one in a million */
        if (dof > 0 && chi2 > dof + 6 * sqrt(2.0 * dof))
            fail_msg("top-k %d temperature %g: chi-square %.1f for %d degrees of freedom", k, temp,
                     chi2, dof);
    }
    /* temperature 0: the first largest logit */
    logits[17] = 100.0f;
    logits[30] = 100.0f;
    assert_int_equal(gpc_sample_token(logits, V, 0.0f, 40, &rng, scratch), 17);
}

/* Collects generated tokens. */
typedef struct {
    uint32_t got[16];
    int n;
} token_sink;

static int collect(void *user, uint32_t token) {
    token_sink *s = user;
    if (s->n < 16) s->got[s->n] = token;
    s->n++;
    return 0;
}

/* Greedy generation against a loop of full forward passes over the window. */
static void test_generate_matches_forward(void **state) {
    (void)state;
    enum { V = 40, T = 8, STEPS = 13 };
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 42);
    gpt_config c;
    gpt_model *m = NULL;
    TEST_OK(gpt_config_init(&c, 2, 2, 16, T, V));
    TEST_OK(gpt_create(&m, &c, gpc_cpu(), GPC_F32, 1, T, 0));
    /* weights larger than the initialisation's so the argmax is clear-cut */
    float *w = malloc(m->num_params * sizeof(float));
    gpc_rng_fill_normal(&rng, w, m->num_params, 0.0f, 0.5f);
    TEST_OK(gpt_set_params(m, w));
    uint32_t prompt[3];
    for (int i = 0; i < 3; i++)
        prompt[i] = gpc_rng_below(&rng, V);

    /* reference: the whole sequence so far, its last T tokens through the model */
    int32_t seq[3 + STEPS];
    for (int i = 0; i < 3; i++)
        seq[i] = (int32_t)prompt[i];
    int len = 3;
    float logits[T * V];
    for (int s = 0; s < STEPS; s++) {
        int n = len < T ? len : T;
        TEST_OK(gpt_forward(m, seq + len - n, NULL, 1, n));
        TEST_OK(gpt_copy_logits(m, logits));
        const float *last = logits + (size_t)(n - 1) * V;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (last[v] > last[best]) best = v;
        seq[len++] = best;
    }

    gpc_generate_options o;
    gpc_generate_options_init(&o);
    o.max_tokens = STEPS;
    o.temperature = 0.0f;
    token_sink out = {{0}, 0};
    size_t generated;
    TEST_OK(gpc_generate(m, prompt, 3, &o, &rng, collect, &out, &generated));
    assert_int_equal(generated, STEPS);
    assert_int_equal(out.n, STEPS);
    for (int s = 0; s < STEPS; s++)
        assert_int_equal(out.got[s], seq[3 + s]);

    /* a stop token ends generation before it is emitted */
    o.stop_token = seq[3 + 4];
    int first = 3;
    while (seq[first] != seq[3 + 4])
        first++; /* its first occurrence in the output */
    out.n = 0;
    TEST_OK(gpc_generate(m, prompt, 3, &o, &rng, collect, &out, &generated));
    assert_int_equal(generated, first - 3);

    /* bad input */
    uint32_t bad = V;
    TEST_FAILS(gpc_generate(m, &bad, 1, &o, &rng, NULL, NULL, NULL), GPC_ERR_INVALID_ARG,
               "outside the vocabulary");
    TEST_FAILS(gpc_generate(m, prompt, 0, &o, &rng, NULL, NULL, NULL), GPC_ERR_INVALID_ARG,
               "at least one token");
    free(w);
    gpt_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sample_distribution),
        cmocka_unit_test(test_generate_matches_forward),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
