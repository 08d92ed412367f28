/* test_lora.c: LoRA adapters against references computed another way:
 * central finite differences of the mean loss for every adapter tensor's
 * gradient, the base model's logits (B = 0 at creation changes nothing),
 * the merged plain model's logits, the base weights' bits after training,
 * and the adapter file's round trip and its checks on damaged input. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/model.h"
#include "model/gpt_internal.h" /* the adapters' gradient buffer */

enum { TL = 2, TNH = 2, TC = 16, TT = 8, TV = 67, TB = 2, TR = 3 };

static gpt_config tiny_config(void) {
    gpt_config c;
    TEST_OK(gpt_config_init(&c, TL, TNH, TC, TT, TV));
    return c;
}

static gpt_model *make_lora(unsigned targets, int recompute, int training) {
    gpt_config c = tiny_config();
    gpt_lora_options o = {.rank = TR, .alpha = 6.0f, .targets = targets, .seed = 7};
    gpt_model *m = NULL;
    TEST_OK(gpt_create_lora(&m, &c, gpc_cpu(), GPC_F32, TB, TT, training, recompute, &o));
    return m;
}

/* Random base weights, layernorm weights near 1, padded wte rows zero. */
static float *random_base(size_t n, const gpt_model *m, gpc_rng *rng) {
    float *w = malloc(n * sizeof *w);
    for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++) {
        size_t start = gpt_param_offsets(m)[i];
        size_t end = i + 1 < GPT_NUM_PARAM_TENSORS ? gpt_param_offsets(m)[i + 1] : n;
        const char *name = gpt_param_names[i];
        int ln_weight = strncmp(name, "ln", 2) == 0 && name[strlen(name) - 1] == 'w';
        for (size_t k = start; k < end; k++)
            w[k] = (ln_weight ? 1.0f : 0.0f) + 0.3f * gpc_rng_normal(rng);
    }
    size_t real = (size_t)TV * TC;
    memset(w + real, 0, ((size_t)gpt_get_config(m)->padded_vocab * TC - real) * sizeof *w);
    return w;
}

static float *random_adapters(size_t n, gpc_rng *rng) {
    float *a = malloc(n * sizeof *a);
    for (size_t k = 0; k < n; k++)
        a[k] = 0.3f * gpc_rng_normal(rng);
    return a;
}

static void random_tokens(gpc_rng *rng, int32_t *tok, int32_t *tgt, int n) {
    for (int i = 0; i < n; i++) {
        tok[i] = (int32_t)gpc_rng_below(rng, TV);
        tgt[i] = (int32_t)gpc_rng_below(rng, TV);
    }
}

static double loss_with(gpt_model *m, const float *adapters, const int32_t *tok,
                        const int32_t *tgt) {
    float loss;
    TEST_OK(gpt_lora_set_params(m, adapters));
    TEST_OK(gpt_forward(m, tok, tgt, TB, TT));
    TEST_OK(gpt_mean_loss(m, &loss));
    return loss;
}

/* Central differences at h and 2h, Richardson-extrapolated (cancels h^2):
 * along dir over [start, end), or along element start when dir is NULL. */
static double difference(gpt_model *m, const float *a, float *ap, size_t n, const int32_t *tok,
                         const int32_t *tgt, size_t start, size_t end, const double *dir,
                         double h) {
    double d[2];
    for (int q = 0; q < 2; q++) {
        double step = h * (q + 1);
        memcpy(ap, a, n * sizeof *a);
        for (size_t k = start; k < end; k++)
            ap[k] = (float)(a[k] + step * (dir ? dir[k] : 1.0));
        double up = loss_with(m, ap, tok, tgt);
        for (size_t k = start; k < end; k++)
            ap[k] = (float)(a[k] - step * (dir ? dir[k] : 1.0));
        double down = loss_with(m, ap, tok, tgt);
        double taken = dir ? step : (double)((float)(a[start] + step) - a[start]);
        d[q] = (up - down) / (2.0 * taken);
    }
    return (4 * d[0] - d[1]) / 3;
}

/* Every adapter tensor's gradient against finite differences: its three
 * largest elements and three random ones, and the directional derivative
 * along a random direction. */
static void gradient_check(unsigned targets, int recompute) {
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 21);
    gpt_model *m = make_lora(targets, recompute, 1);
    size_t P = gpt_num_params(m), n = gpt_lora_num_params(m);
    assert_true(n == gpt_lora_count_params(gpt_get_config(m), TR, targets));
    float *w = random_base(P, m, &rng), *a = random_adapters(n, &rng);
    float *ap = malloc(n * sizeof *ap), *grad = malloc(n * sizeof *grad);
    double *dir = malloc(n * sizeof *dir);
    int32_t tok[TB * TT], tgt[TB * TT];
    random_tokens(&rng, tok, tgt, TB * TT);
    tgt[5] = -1;
    TEST_OK(gpt_set_params(m, w));
    TEST_OK(gpt_lora_set_params(m, a));
    TEST_OK(gpt_zero_grad(m));
    TEST_OK(gpt_forward_backward(m, tok, tgt, TB, TT, 1.0f / (TB * TT - 1)));
    gpc_tensor host = gpc_tensor_1d(grad, GPC_F32, gpc_cpu(), (int64_t)n);
    TEST_OK(gpc_tensor_copy(&host, &m->lora.grads_flat));
    assert_null(gpt_grads_flat(m)->data); /* the frozen base has no gradient buffer */

    const gpt_lora *lo = &m->lora;
    for (int t = 0; t < GPT_LORA_TARGETS; t++) {
        if (!(lo->options.targets & (1u << t))) continue;
        for (int which = 0; which < 2; which++) {
            size_t start = which ? lo->b_offset[t] : lo->a_offset[t];
            int64_t in, out;
            gpt_lora_dims(t, TC, &in, &out);
            size_t end = start + (size_t)TL * TR * (size_t)(which ? out : in);
            double gmax = 0;
            for (size_t k = start; k < end; k++)
                gmax = fmax(gmax, fabs(grad[k]));
            assert_true(gmax > 0);
            size_t picks[6] = {0};
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
                /* two steps: 1e-2 keeps the f32 loss's rounding small against
                 * a small gradient; where the loss curves steeply (a large
                 * qkv gradient) its truncation can reach a few per cent, and
                 * 2e-3, whose rounding is small against a large gradient,
                 * is the fair reference */
                double fd = 0, err = INFINITY;
                for (int h = 0; h < 2 && err > 1e-2; h++) {
                    fd = difference(m, a, ap, n, tok, tgt, k, k + 1, NULL, h ? 2e-3 : 1e-2);
                    err = fabs(fd - grad[k]) / fmax(fabs(fd), fmax(0.02 * gmax, 5e-3));
                }
                if (err > 1e-2)
                    fail_msg("target %d %s[%zu]: gradient %.6g, finite difference %.6g", t,
                             which ? "B" : "A", k - start, grad[k], fd);
            }
            double norm = 0, gnorm = 0, analytic = 0;
            for (size_t k = start; k < end; k++)
                gnorm += (double)grad[k] * grad[k];
            for (size_t k = start; k < end; k++) {
                dir[k] = grad[k] / sqrt(gnorm) + gpc_rng_normal(&rng) / sqrt((double)(end - start));
                norm += dir[k] * dir[k];
            }
            for (size_t k = start; k < end; k++) {
                dir[k] /= sqrt(norm);
                analytic += dir[k] * grad[k];
            }
            /* the step halved until two estimates agree: where the loss
             * curves steeply along dir, 2.5e-3 still truncates by a per
             * cent, and 3e-4 is as small as f32's rounding of it allows.
             * Once a halving moves the estimate more than the one before,
             * the f32 loss's rounding outweighs the truncation: the
             * coarser estimate is kept */
            double fd = difference(m, a, ap, n, tok, tgt, start, end, dir, 2.5e-3);
            double last_move = INFINITY;
            for (double h = 1.25e-3; h > 3e-4; h /= 2) {
                double finer = difference(m, a, ap, n, tok, tgt, start, end, dir, h);
                double move = fabs(finer - fd);
                if (move >= last_move) break;
                fd = finer, last_move = move;
                if (move <= 5e-4 * fmax(fabs(fd), 0.25)) break;
            }
            double err = fabs(fd - analytic) / fmax(fabs(analytic), 0.25);
            if (err > 2e-3)
                fail_msg("target %d %s: directional derivative %.8g, finite difference %.8g", t,
                         which ? "B" : "A", analytic, fd);
        }
    }
    free(w), free(a), free(ap), free(grad), free(dir);
    gpt_free(m);
}

static void test_gradient_all_targets(void **state) {
    (void)state;
    gradient_check(GPT_LORA_ALL, 0);
}

/* Two targets, with the layernorm and GELU outputs rebuilt in backward. */
static void test_gradient_some_targets_recompute(void **state) {
    (void)state;
    gradient_check(GPT_LORA_QKV | GPT_LORA_FCPROJ, 2);
}

/* B = 0 at creation: the adapted model's logits are the base model's, bit
 * for bit (the adapters add an exact zero). */
static void test_zero_b_equals_base(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 22);
    gpt_config c = tiny_config();
    gpt_model *base = NULL, *m = make_lora(GPT_LORA_ALL, 0, 0);
    TEST_OK(gpt_create(&base, &c, gpc_cpu(), GPC_F32, TB, TT, 0));
    size_t P = gpt_num_params(m), n = gpt_lora_num_params(m), V = TV;
    float *w = random_base(P, m, &rng), *a = malloc(n * sizeof *a);
    TEST_OK(gpt_lora_get_params(m, a));
    double a_sq = 0;
    for (int t = 0; t < GPT_LORA_TARGETS; t++) {
        int64_t in, out;
        gpt_lora_dims(t, TC, &in, &out);
        for (size_t k = 0; k < (size_t)TL * TR * (size_t)in; k++)
            a_sq += (double)a[m->lora.a_offset[t] + k] * a[m->lora.a_offset[t] + k];
        for (size_t k = 0; k < (size_t)TL * TR * (size_t)out; k++)
            assert_true(a[m->lora.b_offset[t] + k] == 0.0f);
    }
    assert_true(a_sq > 0); /* A is random */
    TEST_OK(gpt_set_params(m, w));
    TEST_OK(gpt_set_params(base, w));
    int32_t tok[TB * TT], tgt[TB * TT];
    random_tokens(&rng, tok, tgt, TB * TT);
    float *la = malloc(TB * TT * V * sizeof *la), *lb = malloc(TB * TT * V * sizeof *lb);
    TEST_OK(gpt_forward(m, tok, NULL, TB, TT));
    TEST_OK(gpt_copy_logits(m, la));
    TEST_OK(gpt_forward(base, tok, NULL, TB, TT));
    TEST_OK(gpt_copy_logits(base, lb));
    assert_memory_equal(la, lb, TB * TT * V * sizeof *la);
    free(w), free(a), free(la), free(lb);
    gpt_free(m);
    gpt_free(base);
}

/* Training steps move the adapters, lower the loss, and leave every base
 * weight with the bits it had. */
static void test_base_frozen(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 23);
    gpt_model *m = make_lora(GPT_LORA_ALL, 0, 1);
    size_t P = gpt_num_params(m), n = gpt_lora_num_params(m);
    float *w = random_base(P, m, &rng), *after = malloc(P * sizeof *after);
    float *a0 = malloc(n * sizeof *a0), *a1 = malloc(n * sizeof *a1);
    for (size_t k = 0; k < P; k++)
        w[k] *= 0.3f; /* a calmer base, so that the steps train */
    TEST_OK(gpt_set_params(m, w));
    TEST_OK(gpt_lora_get_params(m, a0));
    int32_t tok[TB * TT], tgt[TB * TT];
    random_tokens(&rng, tok, tgt, TB * TT);
    gpc_optim_options o;
    gpc_optim_defaults(&o);
    o.learning_rate = 1e-2f;
    float first = 0, last = 0;
    for (int step = 1; step <= 8; step++) {
        TEST_OK(gpt_zero_grad(m));
        TEST_OK(gpt_forward_backward(m, tok, tgt, TB, TT, 1.0f / (TB * TT)));
        o.step = step;
        TEST_OK(gpt_update(m, &o, NULL, NULL));
        TEST_OK(gpt_read_step(m, step == 1 ? &first : &last, NULL));
    }
    assert_true(last < first - 0.05f);
    TEST_OK(gpt_get_params(m, after));
    assert_memory_equal(w, after, P * sizeof *w);
    TEST_OK(gpt_lora_get_params(m, a1));
    assert_true(memcmp(a0, a1, n * sizeof *a0) != 0);
    /* the optimizer holds state for the adapters only */
    assert_true(gpc_optim_state_count(gpt_optimizer(m)) == n);
    free(w), free(after), free(a0), free(a1);
    gpt_free(m);
}

/* The merged weights in a plain model give the adapted model's logits up
 * to f32 rounding. */
static void test_merge_logits(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 24);
    gpt_config c = tiny_config();
    gpt_model *plain = NULL, *m = make_lora(GPT_LORA_ALL, 0, 0);
    TEST_OK(gpt_create(&plain, &c, gpc_cpu(), GPC_F32, TB, TT, 0));
    size_t P = gpt_num_params(m), n = gpt_lora_num_params(m), V = TV;
    float *w = random_base(P, m, &rng), *a = random_adapters(n, &rng);
    float *merged = malloc(P * sizeof *merged);
    TEST_OK(gpt_set_params(m, w));
    TEST_OK(gpt_lora_set_params(m, a));
    TEST_OK(gpt_lora_merged_params(m, merged));
    assert_true(memcmp(merged, w, P * sizeof *w) != 0);
    TEST_OK(gpt_set_params(plain, merged));
    int32_t tok[TB * TT], tgt[TB * TT];
    random_tokens(&rng, tok, tgt, TB * TT);
    float *la = malloc(TB * TT * V * sizeof *la), *lb = malloc(TB * TT * V * sizeof *lb);
    TEST_OK(gpt_forward(m, tok, NULL, TB, TT));
    TEST_OK(gpt_copy_logits(m, la));
    TEST_OK(gpt_forward(plain, tok, NULL, TB, TT));
    TEST_OK(gpt_copy_logits(plain, lb));
    double worst = 0, scale = 0;
    for (size_t k = 0; k < (size_t)TB * TT * V; k++) {
        worst = fmax(worst, fabs((double)la[k] - lb[k]));
        scale = fmax(scale, fabs((double)la[k]));
    }
    if (worst > 1e-5 * fmax(scale, 1.0))
        fail_msg("merged logits differ by %.3g (largest logit %.3g)", worst, scale);
    free(w), free(a), free(merged), free(la), free(lb);
    gpt_free(m);
    gpt_free(plain);
}

/* The adapter file: a round trip of adapters, moments and state; then a
 * flipped byte, a cut file, another file's magic and another rank. */
static void test_file(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 25);
    char *dir = test_tmpdir("lora");
    char path[4096];
    snprintf(path, sizeof path, "%s/lora.bin", dir);
    gpt_model *m = make_lora(GPT_LORA_QKV | GPT_LORA_FC, 0, 1);
    size_t P = gpt_num_params(m), n = gpt_lora_num_params(m);
    float *w = random_base(P, m, &rng), *a = random_adapters(n, &rng);
    TEST_OK(gpt_set_params(m, w));
    TEST_OK(gpt_lora_set_params(m, a));
    int32_t tok[TB * TT], tgt[TB * TT];
    random_tokens(&rng, tok, tgt, TB * TT);
    gpc_optim_options o;
    gpc_optim_defaults(&o);
    TEST_OK(gpt_forward_backward(m, tok, tgt, TB, TT, 1.0f / (TB * TT)));
    TEST_OK(gpt_update(m, &o, NULL, NULL));
    gpt_checkpoint_state st;
    memset(&st, 0, sizeof st);
    st.step = 1, st.batch = TB, st.context = TT, st.steps = 5, st.seed = 99;
    TEST_OK(gpt_lora_save(path, m, &st, "/runs/base"));

    gpt_model *back = make_lora(GPT_LORA_QKV | GPT_LORA_FC, 0, 1);
    gpt_checkpoint_state got;
    TEST_OK(gpt_lora_load(path, back, &got));
    assert_true(got.step == 1 && got.seed == 99 && got.steps == 5);
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    TEST_OK(gpt_lora_get_params(m, x));
    TEST_OK(gpt_lora_get_params(back, y));
    assert_memory_equal(x, y, n * sizeof *x);
    gpc_tensor hx = gpc_tensor_1d(x, GPC_F32, gpc_cpu(), (int64_t)n);
    gpc_tensor hy = gpc_tensor_1d(y, GPC_F32, gpc_cpu(), (int64_t)n);
    TEST_OK(gpc_tensor_copy(&hx, gpc_optim_v(gpt_optimizer(m))));
    TEST_OK(gpc_tensor_copy(&hy, gpc_optim_v(gpt_optimizer(back))));
    assert_memory_equal(x, y, n * sizeof *x);
    char base[64];
    gpt_lora_options lo;
    TEST_OK(gpt_lora_read_header(path, NULL, &lo, NULL, base, sizeof base));
    assert_string_equal(base, "/runs/base");
    assert_int_equal(lo.rank, TR);
    assert_true(lo.alpha == 6.0f);

    /* another rank: a mismatch, named */
    gpt_config c = tiny_config();
    gpt_lora_options other = {.rank = 2, .targets = GPT_LORA_QKV | GPT_LORA_FC};
    gpt_model *wrong = NULL;
    TEST_OK(gpt_create_lora(&wrong, &c, gpc_cpu(), GPC_F32, TB, TT, 0, 0, &other));
    TEST_FAILS(gpt_lora_load(path, wrong, NULL), GPC_ERR_MISMATCH, "rank 3");
    gpt_free(wrong);

    /* a flipped byte in the adapters: the checksum says so first */
    char *bytes;
    size_t size;
    TEST_OK(gpc_read_file(path, &bytes, &size));
    bytes[1024 + 5] ^= 0x40;
    FILE *f = fopen(path, "wb");
    fwrite(bytes, 1, size, f);
    fclose(f);
    TEST_FAILS(gpt_lora_load(path, back, NULL), GPC_ERR_FORMAT, "checksum");
    /* a flipped byte in the header's rank: the checksum, not the rank */
    bytes[1024 + 5] ^= 0x40;
    bytes[40] ^= 0x01;
    f = fopen(path, "wb");
    fwrite(bytes, 1, size, f);
    fclose(f);
    TEST_FAILS(gpt_lora_read_header(path, NULL, NULL, NULL, NULL, 0), GPC_ERR_FORMAT, "checksum");
    /* cut short */
    bytes[40] ^= 0x01;
    f = fopen(path, "wb");
    fwrite(bytes, 1, 700, f);
    fclose(f);
    TEST_FAILS(gpt_lora_load(path, back, NULL), GPC_ERR_FORMAT, "truncated");
    /* not an adapter file */
    memcpy(bytes, "GPCCKPT", 8);
    f = fopen(path, "wb");
    fwrite(bytes, 1, size, f);
    fclose(f);
    TEST_FAILS(gpt_lora_load(path, back, NULL), GPC_ERR_FORMAT, "not a gpc adapter file");
    /* a plain model has no adapters to load; a checkpoint takes no LoRA model */
    gpt_model *plain = NULL;
    TEST_OK(gpt_create(&plain, &c, gpc_cpu(), GPC_F32, TB, TT, 0));
    TEST_FAILS(gpt_lora_save(path, plain, NULL, NULL), GPC_ERR_INVALID_ARG, "no LoRA adapters");
    TEST_FAILS(gpt_checkpoint_save(path, m, &st), GPC_ERR_INVALID_ARG, "frozen");
    gpt_free(plain);
    gpc_free(bytes);
    free(w), free(a), free(x), free(y);
    gpt_free(m);
    gpt_free(back);
    test_rmtree(dir);
    gpc_free(dir);
}

static void test_parse_targets(void **state) {
    (void)state;
    unsigned t;
    TEST_OK(gpt_lora_parse_targets("qkv,fcproj", &t));
    assert_int_equal(t, GPT_LORA_QKV | GPT_LORA_FCPROJ);
    TEST_OK(gpt_lora_parse_targets("proj,fc,qkv,fcproj", &t));
    assert_int_equal(t, GPT_LORA_ALL);
    TEST_FAILS(gpt_lora_parse_targets("qkv,mlp", &t), GPC_ERR_INVALID_ARG, "'mlp'");
    TEST_FAILS(gpt_lora_parse_targets("", &t), GPC_ERR_INVALID_ARG, "empty");
    gpt_config c = tiny_config();
    gpt_model *m = NULL;
    gpt_lora_options o = {.rank = TC + 1};
    TEST_FAILS(gpt_create_lora(&m, &c, gpc_cpu(), GPC_F32, TB, TT, 1, 0, &o), GPC_ERR_INVALID_ARG,
               "--lora 17");
}

/* The model's bytes with and without adapters at a GPT-2-like size. */
static void test_memory(void **state) {
    (void)state;
    gpt_config c;
    TEST_OK(gpt_config_init(&c, 6, 6, 384, 256, 50257));
    gpt_model *full = NULL, *lora = NULL;
    gpt_lora_options o = {.rank = 8};
    TEST_OK(gpt_create(&full, &c, gpc_cpu(), GPC_F32, 4, 256, 1));
    TEST_OK(gpt_create_lora(&lora, &c, gpc_cpu(), GPC_F32, 4, 256, 1, 0, &o));
    size_t bf = gpt_memory_bytes(full), bl = gpt_memory_bytes(lora);
    fprintf(stderr, "d6 B=4 T=256 f32: full fine-tuning %zu bytes, LoRA r=8 %zu bytes (%.1f%%)\n",
            bf, bl, 100.0 * (double)bl / (double)bf);
    /* gradients, m and v of the base (3 x 4 bytes a parameter) are gone */
    size_t P = gpt_num_params(full);
    assert_true(bf - bl > 11 * P);
    gpt_free(full);
    gpt_free(lora);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradient_all_targets),
        cmocka_unit_test(test_gradient_some_targets_recompute),
        cmocka_unit_test(test_zero_b_equals_base),
        cmocka_unit_test(test_base_frozen),
        cmocka_unit_test(test_merge_logits),
        cmocka_unit_test(test_file),
        cmocka_unit_test(test_parse_targets),
        cmocka_unit_test(test_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
