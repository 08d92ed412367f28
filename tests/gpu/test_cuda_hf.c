/* test_cuda_hf.c: an imported transformers GPT-2 on the GPU, against
 * transformers' logits (tests/fixtures/hf_tiny, scripts/hf_fixtures.py).
 *
 * f32 on the GPU: logits within 1e-4 of transformers' (relative to the
 * largest), as on the CPU. bf16: within bf16's tolerance (5% of the largest
 * logit, the loss within 1%), and the folder saved in bf16 gives the same
 * logits bit for bit as the fp32 folder, since a bf16 model computes with
 * its f32 weights rounded to bf16, which is what the bf16 folder holds.
 * Without a usable GPU the test exits 77 (CTest: skipped). */
#include "testutil.h"

#include "gpc/hf.h"
#include "gpc/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define B 2
#define T 16
#define V 500

static int32_t tokens[B * T], targets[B * T];
static float ref_logits[B * T * V], ref_loss;

static float *import(const char *name, gpt_config *c) {
    char *dir = test_source_path(name);
    float *params;
    TEST_OK(gpc_hf_gpt2_read(dir, c, &params, NULL));
    gpc_free(dir);
    return params;
}

static void read_reference(void) {
    char *path = test_source_path("tests/fixtures/hf_tiny/reference.safetensors");
    gpc_safetensors *st;
    TEST_OK(gpc_safetensors_open(&st, path));
    gpc_free(path);
    memcpy(tokens, gpc_safetensors_find(st, "tokens")->data, sizeof tokens);
    memcpy(targets, gpc_safetensors_find(st, "targets")->data, sizeof targets);
    memcpy(ref_logits, gpc_safetensors_find(st, "logits")->data, sizeof ref_logits);
    memcpy(&ref_loss, gpc_safetensors_find(st, "loss")->data, sizeof ref_loss);
    gpc_safetensors_close(st);
}

/* logits and loss of params on the GPU in dtype */
static void run(const gpt_config *c, const float *params, gpc_dtype dtype, float *logits,
                float *loss) {
    gpt_model *m;
    gpc_device cuda = {GPC_DEVICE_CUDA, 0};
    TEST_OK(gpt_create(&m, c, cuda, dtype, B, T, 0));
    TEST_OK(gpt_set_params(m, params));
    TEST_OK(gpt_forward(m, tokens, targets, B, T));
    TEST_OK(gpt_copy_logits(m, logits));
    TEST_OK(gpt_mean_loss(m, loss));
    gpt_free(m);
}

static double worst_of(const float *logits, double *scale) {
    double worst = 0;
    *scale = 0;
    for (int i = 0; i < B * T * V; i++) {
        worst = fmax(worst, fabs((double)logits[i] - ref_logits[i]));
        *scale = fmax(*scale, fabs((double)ref_logits[i]));
    }
    return worst;
}

static void test_f32(void **state) {
    (void)state;
    gpt_config c;
    float *p = import("tests/fixtures/hf_tiny/model", &c);
    float *logits = malloc(sizeof ref_logits), loss;
    run(&c, p, GPC_F32, logits, &loss);
    double scale, worst = worst_of(logits, &scale);
    fprintf(stderr, "f32 on the GPU: logits within %.3g of %.3g, loss %.7f (transformers %.7f)\n",
            worst, scale, (double)loss, (double)ref_loss);
    assert_true(worst <= 1e-4 * scale);
    assert_true(fabs((double)loss - ref_loss) <= 1e-5 * ref_loss);
    free(logits);
    gpc_free(p);
}

static void test_bf16(void **state) {
    (void)state;
    gpt_config c;
    float *p = import("tests/fixtures/hf_tiny/model", &c);
    float *q = import("tests/fixtures/hf_tiny/bf16", &c);
    float *a = malloc(sizeof ref_logits), *b = malloc(sizeof ref_logits), la, lb;
    run(&c, p, GPC_BF16, a, &la);
    run(&c, q, GPC_BF16, b, &lb);
    double scale, worst = worst_of(a, &scale);
    fprintf(stderr, "bf16 on the GPU: logits within %.3g of %.3g, loss %.5f (transformers %.5f)\n",
            worst, scale, (double)la, (double)ref_loss);
    assert_true(worst <= 0.05 * scale);
    assert_true(fabs((double)la - ref_loss) <= 0.01 * ref_loss);
    assert_memory_equal(a, b, sizeof ref_logits);
    assert_true(la == lb);
    free(a);
    free(b);
    gpc_free(p);
    gpc_free(q);
}

int main(void) {
    if (!gpc_backend_get(GPC_DEVICE_CUDA)) {
        fprintf(stderr, "skipped: %s\n", gpc_last_error());
        return 77;
    }
    read_reference();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32),
        cmocka_unit_test(test_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
