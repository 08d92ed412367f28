/*
 * test_cuda_lora.c: LoRA on the GPU in bf16 (the base frozen in bf16, the
 * adapters computing in bf16 with f32 master copies in the optimizer)
 * against the same LoRA model on the CPU in f32: the loss of one forward,
 * the losses of three training steps, the base weights' bits after them,
 * the adapters' f32 masters after them, and the merged plain bf16 model's
 * logits against the adapted model's.
 *
 * Tolerances are those of a bf16 network (test_cuda_model.c): 2e-2 of the
 * loss, and relative norms for tensors. Without a usable GPU the test exits
 * 77 (CTest: skipped).
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/model.h"

static gpc_rng rng;

static void test_bf16_against_cpu(void **state) {
    (void)state;
    gpt_config config;
    TEST_OK(gpt_config_init(&config, 2, 2, 128, 64, 320));
    const int B = 2, T = 64, V = 320;
    gpt_lora_options lora = {.rank = 8, .alpha = 16.0f, .seed = 3};
    gpt_model *cpu = NULL, *gpu = NULL;
    TEST_OK(gpt_create_lora(&cpu, &config, gpc_cpu(), GPC_F32, B, T, 1, 0, &lora));
    TEST_OK(gpt_create_lora(&gpu, &config, (gpc_device){GPC_DEVICE_CUDA, 0}, GPC_BF16, B, T, 1, 0,
                            &lora));
    /* the base: bf16-representable values, so both models hold the same */
    gpt_model *init = NULL;
    TEST_OK(gpt_create(&init, &config, gpc_cpu(), GPC_F32, 1, 1, 0));
    TEST_OK(gpt_init_weights(init, gpc_rng_u32(&rng)));
    size_t P = gpt_num_params(cpu), n = gpt_lora_num_params(cpu);
    float *w = malloc(P * sizeof *w), *after = malloc(P * sizeof *after);
    TEST_OK(gpt_get_params(init, w));
    for (size_t i = 0; i < P; i++)
        w[i] = gpc_bf16_to_f32(gpc_f32_to_bf16(w[i]));
    gpt_free(init);
    float *a = malloc(n * sizeof *a), *ac = malloc(n * sizeof *ac), *ag = malloc(n * sizeof *ag);
    for (size_t i = 0; i < n; i++)
        a[i] = gpc_bf16_to_f32(gpc_f32_to_bf16(0.05f * gpc_rng_normal(&rng)));
    TEST_OK(gpt_set_params(cpu, w));
    TEST_OK(gpt_set_params(gpu, w));
    TEST_OK(gpt_lora_set_params(cpu, a));
    TEST_OK(gpt_lora_set_params(gpu, a));

    int32_t inputs[2 * 64], targets[2 * 64];
    for (int i = 0; i < B * T; i++) {
        inputs[i] = (int32_t)gpc_rng_below(&rng, V);
        targets[i] = (int32_t)gpc_rng_below(&rng, V);
    }
    gpc_optim_options o;
    gpc_optim_defaults(&o);
    o.learning_rate = 1e-3f;
    for (int step = 1; step <= 3; step++) {
        float lc, lg;
        TEST_OK(gpt_zero_grad(cpu));
        TEST_OK(gpt_zero_grad(gpu));
        TEST_OK(gpt_forward_backward(cpu, inputs, targets, B, T, 1.0f / (B * T)));
        TEST_OK(gpt_forward_backward(gpu, inputs, targets, B, T, 1.0f / (B * T)));
        o.step = step;
        TEST_OK(gpt_update(cpu, &o, NULL, NULL));
        TEST_OK(gpt_update(gpu, &o, NULL, NULL));
        TEST_OK(gpt_read_step(cpu, &lc, NULL));
        TEST_OK(gpt_read_step(gpu, &lg, NULL));
        if (fabs(lg - lc) > 2e-2 * fabs(lc))
            fail_msg("step %d: loss %.6f on the GPU, %.6f on the CPU", step, lg, lc);
    }
    /* the frozen base keeps its bits on the GPU */
    TEST_OK(gpt_get_params(gpu, after));
    assert_memory_equal(w, after, P * sizeof *w);
    /* the adapters' f32 masters moved alike */
    TEST_OK(gpt_lora_get_params(cpu, ac));
    TEST_OK(gpt_lora_get_params(gpu, ag));
    for (size_t i = 0; i < n; i++)
        ac[i] -= a[i], ag[i] -= a[i];
    double e = test_rel_norm(ag, ac, n);
    if (e > 0.1) fail_msg("adapter updates differ by %.3g of their norm", e);

    /* merged into a plain bf16 model: the adapted model's logits */
    float *merged = malloc(P * sizeof *merged);
    TEST_OK(gpt_lora_merged_params(gpu, merged));
    gpt_model *plain = NULL;
    TEST_OK(gpt_create(&plain, &config, (gpc_device){GPC_DEVICE_CUDA, 0}, GPC_BF16, B, T, 0));
    TEST_OK(gpt_set_params(plain, merged));
    float *lg = malloc((size_t)B * T * V * sizeof *lg),
          *lp = malloc((size_t)B * T * V * sizeof *lp);
    TEST_OK(gpt_forward(gpu, inputs, NULL, B, T));
    TEST_OK(gpt_copy_logits(gpu, lg));
    TEST_OK(gpt_forward(plain, inputs, NULL, B, T));
    TEST_OK(gpt_copy_logits(plain, lp));
    e = test_rel_norm(lp, lg, (size_t)B * T * V);
    if (e > 2e-2) fail_msg("merged logits differ by %.3g of their norm", e);
    free(w), free(after), free(a), free(ac), free(ag), free(merged), free(lg), free(lp);
    gpt_free(plain);
    gpt_free(cpu);
    gpt_free(gpu);
}

int main(void) {
    if (!gpc_backend_get(GPC_DEVICE_CUDA)) {
        fprintf(stderr, "skipped: %s\n", gpc_last_error());
        return 77;
    }
    gpc_rng_seed(&rng, test_seed(), 33);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_against_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
