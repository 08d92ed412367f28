/* test_gpt.c: the GPT model against references computed another way: a
 * float64 forward pass written here with plain loops (logits and loss),
 * central finite differences of the mean loss for every parameter tensor's
 * gradient, and the model's own invariants (batch views, causality, tied
 * head, padded vocabulary rows, the initialisation's statistics). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/model.h"
#include "model/gpt_internal.h" /* test_derived_qkv_bias switches a private flag */

/* The tiny config of the gradient check: V=67 pads to Vp=128. */
enum { TL = 2, TNH = 2, TC = 16, TT = 8, TV = 67, TB = 2 };

static gpt_model *make_model(int L, int NH, int C, int maxT, int V, int B, int T, int training) {
    gpt_config config;
    gpt_model *m = NULL;
    TEST_OK(gpt_config_init(&config, L, NH, C, maxT, V));
    TEST_OK(gpt_create(&m, &config, gpc_cpu(), GPC_F32, B, T, training));
    return m;
}

/* Random weights larger than GPT-2's initialisation, with non-trivial
 * layernorm weights and biases, so every path carries a visible gradient. */
static float *random_params(const gpt_model *m, gpc_rng *rng) {
    float *w = malloc(gpt_num_params(m) * sizeof(float));
    for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++) {
        size_t start = gpt_param_offsets(m)[i];
        size_t end =
            i + 1 < GPT_NUM_PARAM_TENSORS ? gpt_param_offsets(m)[i + 1] : gpt_num_params(m);
        const char *name = gpt_param_names[i];
        int is_ln_weight = strncmp(name, "ln", 2) == 0 && name[strlen(name) - 1] == 'w';
        for (size_t k = start; k < end; k++)
            w[k] = (is_ln_weight ? 1.0f : 0.0f) + 0.3f * gpc_rng_normal(rng);
    }
    /* padded rows of wte stay zero, as the model keeps them */
    size_t real = (size_t)gpt_get_config(m)->vocab_size * gpt_get_config(m)->channels;
    memset(w + real, 0,
           ((size_t)gpt_get_config(m)->padded_vocab * gpt_get_config(m)->channels - real) * 4);
    return w;
}

static void random_tokens(gpc_rng *rng, int32_t *tokens, int32_t *targets, int n, int V) {
    for (int i = 0; i < n; i++) {
        tokens[i] = (int32_t)gpc_rng_below(rng, (uint32_t)V);
        targets[i] = (int32_t)gpc_rng_below(rng, (uint32_t)V);
    }
}

/* ---------------------------------------------------------------- float64 reference */

static void ref_layernorm(double *out, const double *x, const float *w, const float *b, int C) {
    double mean = 0, var = 0;
    for (int i = 0; i < C; i++)
        mean += x[i];
    mean /= C;
    for (int i = 0; i < C; i++)
        var += (x[i] - mean) * (x[i] - mean);
    var /= C;
    double rstd = 1.0 / sqrt(var + 1e-5);
    for (int i = 0; i < C; i++)
        out[i] = (x[i] - mean) * rstd * w[i] + b[i];
}

/* out[OC] = W[OC,C] x + b */
static void ref_linear(double *out, const double *x, const float *W, const float *b, int C,
                       int OC) {
    for (int o = 0; o < OC; o++) {
        double s = b ? b[o] : 0.0;
        for (int i = 0; i < C; i++)
            s += (double)W[(size_t)o * C + i] * x[i];
        out[o] = s;
    }
}

static double ref_gelu(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* Logits [B,T,V] and per-position losses [B,T] in float64. */
static void ref_forward(const gpt_model *m, const float *w, const int32_t *tokens,
                        const int32_t *targets, int B, int T, double *logits, double *losses) {
    const gpt_config *c = gpt_get_config(m);
    int L = c->layers, C = c->channels, NH = c->heads, hs = C / NH, V = c->vocab_size;
    const float *P[GPT_NUM_PARAM_TENSORS];
    for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++)
        P[i] = w + gpt_param_offsets(m)[i];
    enum { WTE, WPE, LN1W, LN1B, QKVW, QKVB, APW, APB, LN2W, LN2B, FCW, FCB, FPW, FPB, LNFW, LNFB };
    double *x = calloc((size_t)T * C, 8), *h = calloc((size_t)T * C, 8);
    double *qkv = calloc((size_t)T * 3 * C, 8), *y = calloc((size_t)T * C, 8);
    double *f = calloc((size_t)4 * C, 8), *tmp = calloc((size_t)4 * C, 8);
    double *att = calloc((size_t)T, 8);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++)
            for (int i = 0; i < C; i++)
                x[t * C + i] =
                    (double)P[WTE][(size_t)tokens[b * T + t] * C + i] + P[WPE][(size_t)t * C + i];
        for (int l = 0; l < L; l++) {
            for (int t = 0; t < T; t++) {
                ref_layernorm(h + t * C, x + t * C, P[LN1W] + l * C, P[LN1B] + l * C, C);
                ref_linear(qkv + (size_t)t * 3 * C, h + t * C, P[QKVW] + (size_t)l * 3 * C * C,
                           P[QKVB] + l * 3 * C, C, 3 * C);
            }
            for (int t = 0; t < T; t++)
                for (int hd = 0; hd < NH; hd++) {
                    const double *q = qkv + (size_t)t * 3 * C + hd * hs;
                    double mx = -1e300, sum = 0;
                    for (int s = 0; s <= t; s++) {
                        const double *k = qkv + (size_t)s * 3 * C + C + hd * hs;
                        double dot = 0;
                        for (int i = 0; i < hs; i++)
                            dot += q[i] * k[i];
                        att[s] = dot / sqrt((double)hs);
                        if (att[s] > mx) mx = att[s];
                    }
                    for (int s = 0; s <= t; s++)
                        sum += (att[s] = exp(att[s] - mx));
                    for (int i = 0; i < hs; i++) {
                        double acc = 0;
                        for (int s = 0; s <= t; s++)
                            acc += att[s] / sum * qkv[(size_t)s * 3 * C + 2 * C + hd * hs + i];
                        y[t * C + hd * hs + i] = acc;
                    }
                }
            for (int t = 0; t < T; t++) {
                ref_linear(tmp, y + t * C, P[APW] + (size_t)l * C * C, P[APB] + l * C, C, C);
                for (int i = 0; i < C; i++)
                    x[t * C + i] += tmp[i];
                ref_layernorm(h + t * C, x + t * C, P[LN2W] + l * C, P[LN2B] + l * C, C);
                ref_linear(f, h + t * C, P[FCW] + (size_t)l * 4 * C * C, P[FCB] + l * 4 * C, C,
                           4 * C);
                for (int i = 0; i < 4 * C; i++)
                    f[i] = ref_gelu(f[i]);
                ref_linear(tmp, f, P[FPW] + (size_t)l * C * 4 * C, P[FPB] + l * C, 4 * C, C);
                for (int i = 0; i < C; i++)
                    x[t * C + i] += tmp[i];
            }
        }
        for (int t = 0; t < T; t++) {
            ref_layernorm(h + t * C, x + t * C, P[LNFW], P[LNFB], C);
            double *lg = logits + ((size_t)b * T + t) * V;
            ref_linear(lg, h + t * C, P[WTE], NULL, C, V);
            if (!targets) continue;
            double mx = -1e300, sum = 0;
            for (int v = 0; v < V; v++)
                mx = lg[v] > mx ? lg[v] : mx;
            for (int v = 0; v < V; v++)
                sum += exp(lg[v] - mx);
            int tgt = targets[b * T + t];
            losses[b * T + t] = tgt < 0 ? 0.0 : log(sum) + mx - lg[tgt];
        }
    }
    free(x), free(h), free(qkv), free(y), free(f), free(tmp), free(att);
}

/* ---------------------------------------------------------------- tests */

static void test_config(void **state) {
    (void)state;
    gpt_config c;
    int L, NH, C;
    TEST_OK(gpt_config_parse_depth("d12", &L, &NH, &C));
    assert_int_equal(L, 12), assert_int_equal(NH, 12), assert_int_equal(C, 768);
    TEST_OK(gpt_config_init(&c, L, NH, C, 1024, 50257));
    assert_int_equal(c.padded_vocab, 50304);
    /* GPT-2 124M with the vocabulary padded to 50304: llm.c reports 124,475,904 */
    assert_int_equal(gpt_config_num_params(&c), 124475904);
    TEST_FAILS(gpt_config_parse_depth("x12", &L, &NH, &C), GPC_ERR_INVALID_ARG, "unknown model");
    TEST_FAILS(gpt_config_parse_depth("d0", &L, &NH, &C), GPC_ERR_INVALID_ARG, "dN");
    TEST_FAILS(gpt_config_init(&c, 2, 3, 16, 8, 67), GPC_ERR_INVALID_ARG,
               "16 channels do not split into 3 heads");
    TEST_FAILS(gpt_config_init(&c, 0, 1, 16, 8, 67), GPC_ERR_INVALID_ARG, "layers");
    TEST_FAILS(gpt_config_init(&c, 1, 1, 16, 8, 1), GPC_ERR_INVALID_ARG, "vocabulary size");
    gpt_config a, b;
    TEST_OK(gpt_config_init(&a, 12, 12, 768, 1024, 50257));
    TEST_OK(gpt_config_init(&b, 24, 12, 768, 1024, 50257));
    assert_false(gpt_config_equal(&a, &b, "checkpoint"));
    assert_string_equal(gpc_last_error(),
                        "checkpoint was written by a model with 12 layers; this config has 24");
    assert_true(gpt_config_equal(&a, &a, "checkpoint"));
}

static void test_create_errors(void **state) {
    (void)state;
    gpt_config c;
    gpt_model *m = NULL;
    TEST_OK(gpt_config_init(&c, TL, TNH, TC, TT, TV));
    TEST_FAILS(gpt_create(&m, &c, gpc_cpu(), GPC_BF16, TB, TT, 1), GPC_ERR_UNSUPPORTED,
               "--precision f32");
    TEST_FAILS(gpt_create(&m, &c, gpc_cpu(), GPC_F32, TB, TT + 1, 1), GPC_ERR_INVALID_ARG,
               "context 8");
    TEST_OK(gpt_create(&m, &c, gpc_cpu(), GPC_F32, TB, TT, 0));
    int32_t tok[TB * TT] = {0}, tgt[TB * TT] = {0};
    tok[3] = TV; /* out of range */
    TEST_FAILS(gpt_forward(m, tok, NULL, TB, TT), GPC_ERR_INVALID_ARG, "outside the vocabulary");
    tok[3] = 0;
    tgt[5] = -2;
    TEST_FAILS(gpt_forward(m, tok, tgt, TB, TT), GPC_ERR_INVALID_ARG, "-1 to mask");
    TEST_FAILS(gpt_forward(m, tok, NULL, TB + 1, TT), GPC_ERR_INVALID_ARG, "planned");
    TEST_FAILS(gpt_forward_backward(m, tok, tok, TB, TT, 1.0f), GPC_ERR_INVALID_ARG, "inference");
    gpt_free(m);
}

/* Initialisation statistics: GPT-2's standard deviations, ones and zeros. */
static void test_init(void **state) {
    (void)state;
    gpt_model *m = make_model(4, 4, 64, 64, 1000, 1, 4, 0);
    TEST_OK(gpt_init_weights(m, test_seed()));
    float *w = malloc(gpt_num_params(m) * sizeof(float));
    TEST_OK(gpt_get_params(m, w));
    double expect_std[GPT_NUM_PARAM_TENSORS] = {
        0.02, 0.01, 0, 0, 0.02, 0, 0.02 / sqrt(8.0), 0, 0, 0, 0.02, 0, 0.02 / sqrt(8.0), 0, 0, 0};
    for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++) {
        size_t start = gpt_param_offsets(m)[i];
        size_t end =
            i + 1 < GPT_NUM_PARAM_TENSORS ? gpt_param_offsets(m)[i + 1] : gpt_num_params(m);
        if (i == 0)
            end = start + (size_t)gpt_get_config(m)->vocab_size * gpt_get_config(m)->channels;
        double sum = 0, sum2 = 0;
        for (size_t k = start; k < end; k++)
            sum += w[k], sum2 += (double)w[k] * w[k];
        double n = (double)(end - start), mean = sum / n, sd = sqrt(sum2 / n - mean * mean);
        const char *name = gpt_param_names[i];
        if (expect_std[i] > 0) {
            /* five standard errors: about 1 in 10^6 runs per tensor */
            if (fabs(mean) > 5 * expect_std[i] / sqrt(n) || fabs(sd / expect_std[i] - 1) > 0.05)
                fail_msg("%s: mean %g sd %g, expected 0 and %g", name, mean, sd, expect_std[i]);
        } else {
            double want = (strncmp(name, "ln", 2) == 0 && name[strlen(name) - 1] == 'w') ? 1 : 0;
            for (size_t k = start; k < end; k++)
                assert_true(w[k] == want);
        }
    }
    /* padded rows of wte are zero */
    size_t real = (size_t)gpt_get_config(m)->vocab_size * gpt_get_config(m)->channels;
    for (size_t k = real; k < (size_t)gpt_get_config(m)->padded_vocab * gpt_get_config(m)->channels;
         k++)
        assert_true(w[k] == 0.0f);
    /* same seed, same weights */
    float *w2 = malloc(gpt_num_params(m) * sizeof(float));
    TEST_OK(gpt_init_weights(m, test_seed()));
    TEST_OK(gpt_get_params(m, w2));
    assert_memory_equal(w, w2, gpt_num_params(m) * sizeof(float));
    free(w), free(w2);
    gpt_free(m);
}

/* Logits and loss against the float64 reference, for a batch smaller than
 * the planned one (which exercises the per-layer views). */
static void test_forward_matches_float64(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 11);
    gpt_model *m = make_model(TL, TNH, TC, TT, TV, 3, TT, 1);
    float *w = random_params(m, &rng);
    TEST_OK(gpt_set_params(m, w));
    int B = 2, T = 6;
    int32_t tokens[3 * TT], targets[3 * TT];
    random_tokens(&rng, tokens, targets, B * T, TV);
    targets[4] = -1; /* a masked position */
    TEST_OK(gpt_forward(m, tokens, targets, B, T));
    float loss;
    TEST_OK(gpt_mean_loss(m, &loss));
    double *ref_logits = malloc((size_t)B * T * TV * 8), ref_losses[3 * TT];
    ref_forward(m, w, tokens, targets, B, T, ref_logits, ref_losses);
    double ref_loss = 0;
    for (int i = 0; i < B * T; i++)
        ref_loss += ref_losses[i];
    ref_loss /= B * T - 1;
    float *logits = malloc((size_t)B * T * TV * 4);
    TEST_OK(gpt_copy_logits(m, logits));
    test_assert_close("logits", logits, ref_logits, (size_t)B * T * TV, 1e-4, 1e-1);
    test_assert_close("loss", &loss, &ref_loss, 1, 1e-5, 1e-3);

    /* the training step reports the same loss */
    TEST_OK(gpt_zero_grad(m));
    TEST_OK(gpt_forward_backward(m, tokens, targets, B, T, 1.0f / (B * T)));
    float loss2;
    TEST_OK(gpt_mean_loss(m, &loss2));
    assert_true(loss2 == loss);

    /* last-position logits, as the sampler uses them */
    float last[3 * TV];
    TEST_OK(gpt_forward_last_logits(m, tokens, B, T, last));
    for (int b = 0; b < B; b++)
        test_assert_close("last logits", last + b * TV, ref_logits + ((size_t)b * T + T - 1) * TV,
                          TV, 1e-4, 1e-1);
    free(w), free(ref_logits), free(logits);
    gpt_free(m);
}

/* Position t's logits do not depend on later tokens; a shorter window gives
 * the same logits at its positions. */
static void test_causal(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 12);
    gpt_model *m = make_model(TL, TNH, TC, TT, TV, 1, TT, 0);
    float *w = random_params(m, &rng);
    TEST_OK(gpt_set_params(m, w));
    int32_t tokens[TT], unused[TT];
    random_tokens(&rng, tokens, unused, TT, TV);
    float full[TT * TV], part[TT * TV];
    TEST_OK(gpt_forward(m, tokens, NULL, 1, TT));
    TEST_OK(gpt_copy_logits(m, full));
    TEST_OK(gpt_forward(m, tokens, NULL, 1, 5));
    TEST_OK(gpt_copy_logits(m, part));
    test_assert_close_f32("window of 5", part, full, 5 * TV, 1e-5, 1.0);
    tokens[TT - 1] = (tokens[TT - 1] + 1) % TV;
    TEST_OK(gpt_forward(m, tokens, NULL, 1, TT));
    TEST_OK(gpt_copy_logits(m, part));
    test_assert_close_f32("earlier positions", part, full, (TT - 1) * TV, 1e-5, 1.0);
    free(w);
    gpt_free(m);
}

static double loss_at(gpt_model *m, const float *w, const int32_t *tok, const int32_t *tgt) {
    float loss;
    TEST_OK(gpt_set_params(m, w));
    TEST_OK(gpt_forward(m, tok, tgt, TB, TT));
    TEST_OK(gpt_mean_loss(m, &loss));
    return loss;
}

/* Central difference of the loss at step h: along dir over [start, end), or,
 * with dir NULL, along the single element start (divided by the step f32
 * actually took). */
static double central_difference(gpt_model *m, const float *w, float *wp, size_t n,
                                 const int32_t *tok, const int32_t *tgt, size_t start, size_t end,
                                 const double *dir, double h) {
    memcpy(wp, w, n * 4);
    if (!dir) {
        wp[start] = (float)(w[start] + h);
        float step = wp[start] - w[start];
        double up = loss_at(m, wp, tok, tgt);
        wp[start] = (float)(w[start] - h);
        double down = loss_at(m, wp, tok, tgt);
        return (up - down) / (2.0 * step);
    }
    for (size_t k = start; k < end; k++)
        wp[k] = (float)(w[k] + h * dir[k]);
    double up = loss_at(m, wp, tok, tgt);
    for (size_t k = start; k < end; k++)
        wp[k] = (float)(w[k] - h * dir[k]);
    double down = loss_at(m, wp, tok, tgt);
    return (up - down) / (2 * h);
}

/* Richardson's extrapolation of central differences at steps h and 2h: it
 * cancels the h^2 term. */
static double richardson(gpt_model *m, const float *w, float *wp, size_t n, const int32_t *tok,
                         const int32_t *tgt, size_t start, size_t end, const double *dir,
                         double h) {
    double d1 = central_difference(m, w, wp, n, tok, tgt, start, end, dir, h);
    double d2 = central_difference(m, w, wp, n, tok, tgt, start, end, dir, 2 * h);
    return (4 * d1 - d2) / 3;
}

/* Every parameter tensor's gradient against central differences of the
 * mean loss: its largest elements and a few random ones one by one, and the
 * directional derivative along a random direction (extrapolated from several
 * steps, so the f32 forward's rounding and the O(h^2) term both stay small). */
static void test_gradient_check(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 13);
    gpt_model *m = make_model(TL, TNH, TC, TT, TV, TB, TT, 1);
    float *w = random_params(m, &rng);
    int32_t tok[TB * TT], tgt[TB * TT];
    random_tokens(&rng, tok, tgt, TB * TT, TV);
    tgt[3] = -1;
    int unmasked = TB * TT - 1;
    TEST_OK(gpt_set_params(m, w));
    TEST_OK(gpt_zero_grad(m));
    /* dloss weights each position: 1/unmasked gives the gradient of the mean */
    TEST_OK(gpt_forward_backward(m, tok, tgt, TB, TT, 1.0f / unmasked));
    float *grad = malloc(gpt_num_params(m) * 4);
    gpc_tensor host = gpc_tensor_1d(grad, GPC_F32, gpc_cpu(), (int64_t)gpt_num_params(m));
    TEST_OK(gpc_tensor_copy(&host, gpt_grads_flat(m)));

    float *wp = malloc(gpt_num_params(m) * 4);
    double *dir = malloc(gpt_num_params(m) * 8);
    for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++) {
        size_t start = gpt_param_offsets(m)[i];
        size_t end =
            i + 1 < GPT_NUM_PARAM_TENSORS ? gpt_param_offsets(m)[i + 1] : gpt_num_params(m);
        if (i == 0) { /* padded rows of wte: gradient exactly zero */
            size_t real = start + (size_t)TV * TC;
            for (size_t k = real; k < end; k++)
                assert_true(grad[k] == 0.0f);
            end = real;
        }
        const char *name = gpt_param_names[i];
        double gmax = 0;
        for (size_t k = start; k < end; k++)
            gmax = fmax(gmax, fabs(grad[k]));
        assert_true(gmax > 0);
        if (gpc_setting_flag("GPC_TEST_VERBOSE"))
            fprintf(stderr, "%s: largest gradient %.3g\n", name, gmax);

        /* elements: the three largest |g| and three random ones */
        size_t picks[6];
        for (int p = 0; p < 3; p++) {
            size_t best = start;
            double bestv = -1;
            for (size_t k = start; k < end; k++) {
                int taken = 0;
                for (int q = 0; q < p; q++)
                    taken |= picks[q] == k;
                if (!taken && fabs(grad[k]) > bestv) bestv = fabs(grad[k]), best = k;
            }
            picks[p] = best;
        }
        for (int p = 3; p < 6; p++)
            picks[p] = start + gpc_rng_below(&rng, (uint32_t)(end - start));
        for (int p = 0; p < 6; p++) {
            size_t k = picks[p];
            double fd = richardson(m, w, wp, gpt_num_params(m), tok, tgt, k, k + 1, NULL, 1e-2);
            /* the f32 forward's rounding (~1e-6 of the loss) limits what
             * finite differences can resolve: a floor of 2% of the largest
             * gradient of the tensor */
            double floor = fmax(0.02 * gmax, 5e-3);
            double err = fabs(fd - grad[k]) / fmax(fabs(fd), floor);
            if (err > 1e-2)
                fail_msg("%s[%zu]: gradient %.6g, finite difference %.6g (error %.3g)", name,
                         k - start, grad[k], fd, err);
        }

        /* directional derivative along a random direction with a component
         * along the gradient, unit length */
        double norm = 0, gnorm = 0;
        for (size_t k = start; k < end; k++)
            gnorm += (double)grad[k] * grad[k];
        gnorm = sqrt(gnorm);
        for (size_t k = start; k < end; k++) {
            dir[k] = grad[k] / gnorm + gpc_rng_normal(&rng) / sqrt((double)(end - start));
            norm += dir[k] * dir[k];
        }
        double analytic = 0;
        for (size_t k = start; k < end; k++) {
            dir[k] /= sqrt(norm);
            analytic += dir[k] * grad[k];
        }
        /* A step along many elements at once meets the loss's curvature
         * sooner: with weights this large it is far from quadratic at 0.02,
         * while the f32 forward's rounding grows as the step shrinks. So the
         * estimate at 0.01, 0.005 or 0.0025 is kept that agrees best with the
         * next larger step's (Ridders' rule): the data choose the step, never
         * the analytic value. */
        double r[3];
        for (int q = 0; q < 3; q++)
            r[q] =
                richardson(m, w, wp, gpt_num_params(m), tok, tgt, start, end, dir, 1e-2 / (1 << q));
        double fd = fabs(r[2] - r[1]) < fabs(r[1] - r[0]) ? r[2] : r[1];
        /* the f32 forward's rounding leaves ~1e-4 of noise at the smallest
         * step: a floor of 0.25 under small derivatives (these run 0.05-3) */
        double err = fabs(fd - analytic) / fmax(fabs(analytic), 0.25);
        if (err > 1e-3)
            fail_msg("%s: directional derivative %.8g, finite difference %.8g (error %.3g)", name,
                     analytic, fd, err);
    }
    free(w), free(wp), free(grad), free(dir);
    gpt_free(m);
}

/* Gradients accumulate across micro-steps: two calls with half weight each
 * equal one call with full weight. */
static void test_gradient_accumulates(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 14);
    gpt_model *m = make_model(TL, TNH, TC, TT, TV, TB, TT, 1);
    float *w = random_params(m, &rng);
    TEST_OK(gpt_set_params(m, w));
    int32_t tok[TB * TT], tgt[TB * TT];
    random_tokens(&rng, tok, tgt, TB * TT, TV);
    size_t P = gpt_num_params(m);
    float *g1 = malloc(P * 4), *g2 = malloc(P * 4);
    gpc_tensor h1 = gpc_tensor_1d(g1, GPC_F32, gpc_cpu(), (int64_t)P);
    gpc_tensor h2 = gpc_tensor_1d(g2, GPC_F32, gpc_cpu(), (int64_t)P);
    TEST_OK(gpt_zero_grad(m));
    TEST_OK(gpt_forward_backward(m, tok, tgt, TB, TT, 1.0f));
    TEST_OK(gpc_tensor_copy(&h1, gpt_grads_flat(m)));
    TEST_OK(gpt_zero_grad(m));
    TEST_OK(gpt_forward_backward(m, tok, tgt, TB, TT, 0.5f));
    TEST_OK(gpt_forward_backward(m, tok, tgt, TB, TT, 0.5f));
    TEST_OK(gpc_tensor_copy(&h2, gpt_grads_flat(m)));
    test_assert_close_f32("accumulated gradient", g2, g1, P, 1e-4, 1e-3);
    free(w), free(g1), free(g2);
    gpt_free(m);
}

/* GPC_QKV_BIAS_DERIVED's backward (m->derived_qkv_bias) against the one that
 * sums all of dqkv, over two micro-steps: every other gradient is the same
 * bit for bit, and so is the query third of the qkv bias gradient (the same
 * column sums); the key third is zero where the sums give float32 noise
 * around zero, and the value third, the attention projection's bias
 * gradient times its weight, matches the value columns' sums. Those sums
 * cancel terms much larger than their result, so the two roundings agree to
 * about 1e-4 of the largest bias gradient (over 1,000 seeds); the test
 * allows 1e-3, where a wrong derivation is off by the whole value. */
static void test_derived_qkv_bias(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 15);
    gpt_model *m = make_model(TL, TNH, TC, TT, TV, TB, TT, 1);
    float *w = random_params(m, &rng);
    TEST_OK(gpt_set_params(m, w));
    int32_t tok[TB * TT], tgt[TB * TT], tok2[TB * TT], tgt2[TB * TT];
    random_tokens(&rng, tok, tgt, TB * TT, TV);
    random_tokens(&rng, tok2, tgt2, TB * TT, TV);
    size_t P = gpt_num_params(m);
    float *summed = malloc(P * 4), *derived = malloc(P * 4);
    for (int d = 0; d < 2; d++) {
        m->derived_qkv_bias = d; /* white-box: the private switch of the two backwards */
        gpc_tensor host = gpc_tensor_1d(d ? derived : summed, GPC_F32, gpc_cpu(), (int64_t)P);
        TEST_OK(gpt_zero_grad(m));
        TEST_OK(gpt_forward_backward(m, tok, tgt, TB, TT, 0.5f));
        TEST_OK(gpt_forward_backward(m, tok2, tgt2, TB, TT, 0.5f));
        TEST_OK(gpc_tensor_copy(&host, gpt_grads_flat(m)));
    }
    int qkvb = -1;
    for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++)
        if (!strcmp(gpt_param_names[i], "qkvb")) qkvb = i;
    assert_true(qkvb >= 0 && qkvb + 1 < GPT_NUM_PARAM_TENSORS);
    size_t start = gpt_param_offsets(m)[qkvb], end = gpt_param_offsets(m)[qkvb + 1];
    if (memcmp(summed, derived, start * 4) || memcmp(summed + end, derived + end, (P - end) * 4))
        fail_msg("a gradient other than qkvb's differs between the two backwards");
    double big = 0;
    for (size_t k = start; k < end; k++)
        big = fmax(big, fabs(summed[k]));
    assert_true(big > 0);
    for (int l = 0; l < TL; l++) {
        const float *s = summed + start + (size_t)l * 3 * TC,
                    *d = derived + start + (size_t)l * 3 * TC;
        if (memcmp(s, d, TC * 4)) fail_msg("layer %d: the query third differs", l);
        for (int j = 0; j < TC; j++) {
            if (d[TC + j] != 0.0f) fail_msg("layer %d: key bias gradient %g, not 0", l, d[TC + j]);
            if (fabs(s[TC + j]) > 1e-5 * big)
                fail_msg("layer %d: the summed key bias gradient %g is not about 0 (largest %g)", l,
                         s[TC + j], big);
        }
        test_assert_close_f32("value bias gradient", d + 2 * TC, s + 2 * TC, TC, 1e-3, 1e-3 * big);
    }
    free(w), free(summed), free(derived);
    gpt_free(m);
}

/* One AdamW step against the formula computed here in float64, with the
 * global-norm clip active and weight decay only on 2-D weights. */
static void test_update(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 15);
    gpt_model *m = make_model(TL, TNH, TC, TT, TV, TB, TT, 1);
    float *w = random_params(m, &rng);
    TEST_OK(gpt_set_params(m, w));
    int32_t tok[TB * TT], tgt[TB * TT];
    random_tokens(&rng, tok, tgt, TB * TT, TV);
    size_t P = gpt_num_params(m);
    float *g = malloc(P * 4), *after = malloc(P * 4);
    gpc_tensor hg = gpc_tensor_1d(g, GPC_F32, gpc_cpu(), (int64_t)P);
    TEST_OK(gpt_zero_grad(m));
    TEST_OK(gpt_forward_backward(m, tok, tgt, TB, TT, 1.0f / (TB * TT)));
    TEST_OK(gpc_tensor_copy(&hg, gpt_grads_flat(m)));
    double norm = 0;
    for (size_t k = 0; k < P; k++)
        norm += (double)g[k] * g[k];
    norm = sqrt(norm);
    gpc_optim_options o;
    gpc_optim_defaults(&o);
    o.learning_rate = 1e-2f;
    o.max_grad_norm = (float)(norm / 2); /* the clip halves the gradient */
    float reported;
    TEST_OK(gpt_update(m, &o, &reported, NULL));
    assert_true(fabs(reported - norm) <= 1e-5 * norm);
    TEST_OK(gpt_get_params(m, after));
    double *want = malloc(P * 8);
    for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++) {
        size_t end = i + 1 < GPT_NUM_PARAM_TENSORS ? gpt_param_offsets(m)[i + 1] : P;
        double wd = gpt_param_decays(i) ? o.weight_decay : 0.0;
        for (size_t k = gpt_param_offsets(m)[i]; k < end; k++) {
            double gk = g[k] * 0.5;
            double mk = (1 - o.beta1) * gk, vk = (1 - o.beta2) * gk * gk;
            double mhat = mk / (1 - o.beta1), vhat = vk / (1 - o.beta2);
            want[k] = w[k] - o.learning_rate * (mhat / (sqrt(vhat) + o.eps) + wd * w[k]);
        }
    }
    test_assert_close("parameters after AdamW", after, want, P, 1e-5, 1e-2);
    free(w), free(g), free(after), free(want);
    gpt_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_forward_matches_float64),
        cmocka_unit_test(test_causal),
        cmocka_unit_test(test_gradient_check),
        cmocka_unit_test(test_gradient_accumulates),
        cmocka_unit_test(test_derived_qkv_bias),
        cmocka_unit_test(test_update),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
