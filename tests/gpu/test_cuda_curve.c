/*
 * test_cuda_curve.c: 200 training steps of a small GPT on a real (generated)
 * text corpus, on the GPU and on the CPU, and their loss curves compared.
 *
 * The corpus is written at test time: documents of sentences drawn from a
 * small grammar (word lists below, about 250 KB of text), separated by "%"
 * lines as in a fortune file, then prepared with gpc_data_prepare (its own
 * 512-token BPE tokenizer) as `gpc data prepare` would. A model of 2 layers,
 * 64 channels in one head of size 64 (so bf16 runs the tensor-core attention
 * kernels; small, so the CPU run takes seconds),
 * context 128 and batch 4 (T a multiple of 128, so that bf16 on Hopper
 * runs the wgmma attention backward, with dQ summed in bf16, where cuDNN
 * gives the forward or GPC_ATTENTION_BWD=wgmma asks for it)
 * trains for 200 AdamW steps at lr 1e-3 with
 * clipping, from the same initial weights and the same batches: on the CPU
 * in f32 (the reference), and on the GPU in f32 and in bf16.
 *
 * The step losses are compared as means over windows of 20 steps (a single
 * step's loss is one batch's: the windows average the batch-to-batch noise
 * that both runs share less and less as their weights drift apart):
 *  - GPU f32: each window within 1% of the CPU's. Both compute in f32;
 *    they differ only in summation order, which AdamW's normalised steps
 *    amplify slowly over 200 steps.
 *  - GPU bf16: each window within 3% of the CPU's. Every activation and
 *    gradient is rounded to 8 mantissa bits (relative error 2^-9 per value),
 *    and the weights the forward pass sees are bf16 copies of the f32 master
 *    weights: mixed-precision GPT-2 runs stay within about 1-2% of f32 runs,
 *    so 3% is that noise with margin, while a wrong kernel moves the curve by
 *    far more (a GELU or layernorm bug costs tenths of a nat).
 * Both curves must also fall (last window below 80% of the first), so the
 * comparison is between two runs that learn.
 *
 * Without a usable GPU the test exits 77 (CTest: skipped).
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/data.h"
#include "gpc/model.h"

#define STEPS 200
#define WINDOW 20
#define B 4
#define T 128

static const char *const subjects[] = {
    "the old sailor",   "a quiet child",  "my neighbour", "the tired engineer", "every cat",
    "the small robot",  "our teacher",    "a wise owl",   "the baker",          "the river",
    "a lost traveller", "the programmer", "her brother",  "the orchestra",      "a farmer"};
static const char *const verbs[] = {"watches", "remembers", "builds",  "carries",  "paints",
                                    "forgets", "repairs",   "follows", "sings to", "finds",
                                    "borrows", "counts",    "feeds",   "reads",    "opens"};
static const char *const objects[] = {
    "the red door", "a broken clock",  "the morning bread", "an empty boat",  "the long road",
    "a letter",     "the garden gate", "a bright lantern",  "the last train", "a wooden box",
    "the cold tea", "an old map",      "the silver key",    "a tall ladder",  "the evening news"};
static const char *const endings[] = {" before dawn",
                                      " in the rain",
                                      " without a word",
                                      " every sunday",
                                      " near the harbour",
                                      " after supper",
                                      "",
                                      " with great care",
                                      " for the winter",
                                      " under the bridge",
                                      " once again",
                                      ""};

#define PICK(list) list[gpc_rng_below(&rng, sizeof list / sizeof list[0])]

/* About `bytes` of text in documents of 2-7 sentences. */
static void write_corpus(const char *path, size_t bytes, uint64_t seed) {
    gpc_rng rng;
    gpc_rng_seed(&rng, seed, 77);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    size_t written = 0;
    while (written < bytes) {
        int sentences = 2 + (int)gpc_rng_below(&rng, 6);
        for (int s = 0; s < sentences; s++) {
            char line[256];
            int n = snprintf(line, sizeof line, "%s %s %s%s.%s", PICK(subjects), PICK(verbs),
                             PICK(objects), PICK(endings), s + 1 < sentences ? " " : "\n");
            line[0] = (char)(line[0] - 'a' + 'A');
            fputs(line, f);
            written += (size_t)n;
        }
        fputs("%\n", f);
        written += 2;
    }
    fclose(f);
}

/* 200 steps from seed's weights on the loader's batches; losses[STEPS]. */
static void train(const char *data_dir, gpc_device device, gpc_dtype dtype, uint64_t seed,
                  float *losses) {
    gpc_dataset_info info;
    TEST_OK(gpc_dataset_info_read(data_dir, &info));
    gpt_config config;
    TEST_OK(gpt_config_init(&config, 2, 1, 64, T, (int)info.vocab_size));
    gpt_model *m = NULL;
    TEST_OK(gpt_create(&m, &config, device, dtype, B, T, 1));
    TEST_OK(gpt_init_weights(m, seed));
    gpc_loader *loader = NULL;
    TEST_OK(gpc_loader_open(&loader, data_dir, GPC_SPLIT_TRAIN, B, T, seed, 0, 1));
    int32_t inputs[B * T], targets[B * T];
    for (int step = 0; step < STEPS; step++) {
        TEST_OK(gpc_loader_next(loader, inputs, targets));
        TEST_OK(gpt_zero_grad(m));
        TEST_OK(gpt_forward_backward(m, inputs, targets, B, T, 1.0f / (B * T)));
        gpc_optim_options o;
        gpc_optim_defaults(&o);
        o.learning_rate = 1e-3f;
        o.step = step + 1;
        o.seed = (uint32_t)step;
        TEST_OK(gpt_update(m, &o, NULL, NULL));
        TEST_OK(gpt_read_step(m, &losses[step], NULL));
    }
    gpc_loader_close(loader);
    gpt_free(m);
}

static void compare(const char *what, const float *gpu, const float *cpu, double tol) {
    double worst = 0;
    for (int w = 0; w < STEPS / WINDOW; w++) {
        double sg = 0, sc = 0;
        for (int i = w * WINDOW; i < (w + 1) * WINDOW; i++)
            sg += gpu[i], sc += cpu[i];
        double rel = fabs(sg - sc) / sc;
        if (rel > worst) worst = rel;
        if (!(rel <= tol))
            fail_msg("%s: steps %d-%d mean loss %.4f on the GPU, %.4f on the CPU (%.2f%% > "
                     "%.2f%%)",
                     what, w * WINDOW + 1, (w + 1) * WINDOW, sg / WINDOW, sc / WINDOW, 100 * rel,
                     100 * tol);
    }
    double first = 0, last = 0;
    for (int i = 0; i < WINDOW; i++)
        first += gpu[i], last += gpu[STEPS - WINDOW + i];
    if (!(last < 0.8 * first))
        fail_msg("%s: the loss did not fall (%.4f to %.4f)", what, first / WINDOW, last / WINDOW);
    fprintf(stderr, "%s: loss %.4f -> %.4f (CPU %.4f), largest window difference %.3f%%\n", what,
            gpu[0], last / WINDOW, cpu[STEPS - 1], 100 * worst);
}

static void test_loss_curves_agree(void **state) {
    (void)state;
    char *root = test_tmpdir("curve");
    char corpus[4096], data[4096];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", root);
    snprintf(data, sizeof data, "%s/data", root);
    uint64_t seed = test_seed();
    write_corpus(corpus, 250000, seed);
    gpc_prepare_options po;
    gpc_prepare_options_init(&po);
    po.vocab_size = 512;
    const char *inputs[1] = {corpus};
    TEST_OK(gpc_data_prepare(inputs, 1, data, &po));

    float cpu[STEPS], gpu32[STEPS], gpu16[STEPS];
    gpc_device cuda = {GPC_DEVICE_CUDA, 0};
    train(data, gpc_cpu(), GPC_F32, seed, cpu);
    train(data, cuda, GPC_F32, seed, gpu32);
    train(data, cuda, GPC_BF16, seed, gpu16);
    compare("GPU f32 vs CPU f32", gpu32, cpu, 1e-2);
    compare("GPU bf16 vs CPU f32", gpu16, cpu, 3e-2);
    test_rmtree(root);
    gpc_free(root);
}

int main(void) {
    if (!gpc_backend_get(GPC_DEVICE_CUDA)) {
        fprintf(stderr, "skipped: %s\n", gpc_last_error());
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loss_curves_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
