/* testutil.c: see testutil.h. */
#include "testutil.h"

#include "gpc/optim.h"
#include "gpc/tokenizer.h"
#include "gpc/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

uint64_t test_seed(void) {
    static uint64_t seed;
    static int chosen;
    if (!chosen) {
        const char *env = gpc_setting_given("GPC_TEST_SEED");
        seed = env ? strtoull(env, NULL, 10)
                   : ((uint64_t)time(NULL) * 2654435761u) ^ ((uint64_t)getpid() << 16);
        chosen = 1;
        fprintf(stderr, "test seed: %llu (set GPC_TEST_SEED to repeat)\n",
                (unsigned long long)seed);
    }
    return seed;
}

float *test_random_floats(gpc_rng *rng, int64_t n, float lo, float hi) {
    return test_random_floats_as(rng, GPC_F32, n, lo, hi);
}

float *test_random_floats_as(gpc_rng *rng, gpc_dtype dtype, int64_t n, float lo, float hi) {
    float *x = malloc((size_t)n * sizeof(float) + 4);
    for (int64_t i = 0; i < n; i++)
        x[i] = test_round_to(dtype, lo + (hi - lo) * gpc_rng_uniform(rng));
    return x;
}

float test_round_to(gpc_dtype dtype, float x) {
    if (dtype == GPC_BF16) return gpc_bf16_to_f32(gpc_f32_to_bf16(x));
    if (dtype == GPC_F16) return gpc_f16_to_f32(gpc_f32_to_f16(x));
    return x;
}

gpc_tensor test_f32_1d(float *data, int64_t d0) {
    return gpc_tensor_1d(data, GPC_F32, gpc_cpu(), d0);
}

gpc_tensor test_f32_2d(float *data, int64_t d0, int64_t d1) {
    return gpc_tensor_2d(data, GPC_F32, gpc_cpu(), d0, d1);
}

double test_gelu64(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static size_t worst_index(const float *a, const double *b, size_t n, double floor, double *worst) {
    size_t at = 0;
    *worst = 0;
    for (size_t i = 0; i < n; i++) {
        double denom = fabs(b[i]) > floor ? fabs(b[i]) : floor;
        double err = fabs((double)a[i] - b[i]) / denom;
        if (isnan(a[i]) != isnan(b[i])) err = INFINITY;
        if (err > *worst || (i == 0 && err != err)) {
            *worst = err;
            at = i;
        }
    }
    return at;
}

double test_max_rel_error(const float *a, const double *b, size_t n, double floor) {
    double worst;
    worst_index(a, b, n, floor, &worst);
    return worst;
}

double test_max_rel_error_f32(const float *a, const float *b, size_t n, double floor) {
    double *wide = malloc(n * sizeof *wide);
    for (size_t i = 0; i < n; i++)
        wide[i] = b[i];
    double worst = test_max_rel_error(a, wide, n, floor);
    free(wide);
    return worst;
}

double test_rel_norm(const float *got, const float *want, size_t n) {
    double d = 0, w = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        w += (double)want[i] * want[i];
    }
    return sqrt(d / fmax(w, 1e-30));
}

void test_assert_close(const char *what, const float *got, const double *want, size_t n, double tol,
                       double floor) {
    double worst;
    size_t at = worst_index(got, want, n, floor, &worst);
    if (!(worst <= tol))
        fail_msg("%s: relative error %.3g > %.3g at element %zu (got %.9g, want %.9g)", what, worst,
                 tol, at, (double)got[at], want[at]);
}

void test_assert_close_f32(const char *what, const float *got, const float *want, size_t n,
                           double tol, double floor) {
    double *wide = malloc(n * sizeof *wide);
    for (size_t i = 0; i < n; i++)
        wide[i] = want[i];
    test_assert_close(what, got, wide, n, tol, floor);
    free(wide);
}

char *test_tmpdir(const char *tag) {
    const char *base = getenv("TMPDIR");
    char *path = gpc_malloc(4096);
    snprintf(path, 4096, "%s/gpc-test-%s-XXXXXX", base ? base : "/tmp", tag);
    if (!mkdtemp(path)) fail_msg("cannot create a temporary directory %s", path);
    return path;
}

void test_rmtree(const char *path) {
    char cmd[4200];
    if (!path || !strstr(path, "gpc-test-")) return; /* never remove anything else */
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", path);
}

char *test_source_path(const char *relative) {
    const char *root = gpc_setting_given("GPC_SOURCE_DIR");
    char *path = gpc_malloc(4096);
    snprintf(path, 4096, "%s/%s", root ? root : ".", relative);
    return path;
}

gpt_config test_make_serving_run(const char *dir, int layers, int heads, int channels, int context,
                                 uint64_t seed) {
    const char *text = "the cat sat on the mat. the dog sat on the log. a cat and a dog met. ";
    size_t len = strlen(text), reps = 40;
    char *corpus = malloc(len * reps + 1);
    for (size_t i = 0; i < reps; i++)
        memcpy(corpus + i * len, text, len);
    corpus[len * reps] = '\0';
    gpc_tokenizer *tok = NULL;
    gpc_status s = gpc_tokenizer_train(&tok, corpus, len * reps, 300, NULL, NULL);
    free(corpus);
    if (s != GPC_OK) fail_msg("training a tokenizer: %s", gpc_last_error());
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.bin", dir);
    TEST_OK(gpc_tokenizer_save(tok, path));
    gpt_config config;
    TEST_OK(
        gpt_config_init(&config, layers, heads, channels, context, gpc_tokenizer_vocab_size(tok)));
    gpc_tokenizer_free(tok);
    gpt_model *m = NULL;
    TEST_OK(gpt_create(&m, &config, gpc_cpu(), GPC_F32, 1, 1, 0));
    TEST_OK(gpt_init_weights(m, seed));
    float *params = malloc(gpt_num_params(m) * sizeof(float));
    TEST_OK(gpt_get_params(m, params));
    size_t wte = (size_t)config.padded_vocab * (size_t)channels;
    for (size_t i = 0; i < wte; i++)
        params[i] *= 8.0f;
    gpt_free(m);
    TEST_OK(gpc_run_save_weights(dir, &config, params));
    free(params);
    return config;
}

gpt_model *test_make_serving_model(gpc_device device, gpc_dtype dtype, int layers, int heads,
                                   int channels, int context, int vocab, uint64_t seed) {
    gpt_config config;
    TEST_OK(gpt_config_init(&config, layers, heads, channels, context, vocab));
    gpt_model *m = NULL;
    TEST_OK(gpt_create(&m, &config, device, dtype, 1, 1, 0));
    TEST_OK(gpt_init_weights(m, seed));
    return m;
}

gpt_paged_options test_paged_options(int num_blocks, int block_size, int max_seqs, int max_tokens) {
    return (gpt_paged_options){.num_blocks = num_blocks,
                               .block_size = block_size,
                               .max_seqs = max_seqs,
                               .max_tokens = max_tokens,
                               .max_logits = max_seqs};
}

void test_offload_overlap_steps(gpt_model *models[2], int overlap, int first_step, int last_step,
                                int eval_every, int B, int T, int V, float learning_rate,
                                gpc_rng *rng, float *first_loss, float *last_loss) {
    const size_t n = (size_t)B * T;
    int32_t *x = malloc(4 * n * sizeof *x), *y = x + 2 * n;
    assert_non_null(x);
    gpc_optim_options o;
    gpc_optim_defaults(&o);
    o.learning_rate = learning_rate;
    for (int step = first_step; step <= last_step; step++) {
        for (size_t i = 0; i < 2 * n; i++) {
            x[i] = (int32_t)gpc_rng_below(rng, (uint64_t)V);
            y[i] = (x[i] * 5 + 1) % V;
        }
        float loss[2], norm[2], eval[2] = {0, 0};
        for (int k = 0; k < 2; k++) {
            TEST_OK(gpt_zero_grad(models[k]));
            for (int u = 0; u < 2; u++)
                TEST_OK(
                    gpt_forward_backward(models[k], x + u * n, y + u * n, B, T, 0.5f / (float)n));
            o.step = step;
            o.overlap = k ? overlap : 0;
            TEST_OK(gpt_update(models[k], &o, NULL, NULL));
            TEST_OK(gpt_read_step(models[k], &loss[k], &norm[k]));
            if (step % eval_every == 0) { /* an evaluation reads the new weights */
                TEST_OK(gpt_forward(models[k], x, y, B, T));
                TEST_OK(gpt_mean_loss(models[k], &eval[k]));
            }
        }
        if (loss[1] != loss[0] || norm[1] != norm[0] || eval[1] != eval[0])
            fail_msg("step %d: overlapped loss %.9g norm %.9g eval %.9g, waiting %.9g %.9g %.9g",
                     step, loss[1], norm[1], eval[1], loss[0], norm[0], eval[0]);
        if (step == first_step && first_loss) *first_loss = loss[0];
        if (step == last_step && last_loss) *last_loss = loss[0];
    }
    free(x);
}
