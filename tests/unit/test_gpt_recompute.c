/*
 * test_gpt_recompute.c: activation recomputation and the device-summed loss.
 *
 * With --recompute 1 (GELU) and 2 (GELU and layernorm) the model keeps one
 * layer of those activations and rebuilds each layer's in backward with the
 * forward pass's own ops, so on the CPU the losses and every gradient must be
 * bit for bit those of the model that keeps everything, over several
 * micro-steps (gradient accumulation) and a batch smaller than planned. The
 * memory saved must be exactly the dropped layers' buffers. gpt_read_step's
 * loss, summed over micro-steps by the model, must equal the token-weighted
 * mean of the per-micro-step gpt_mean_loss values (float64 on the host).
 */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/model.h"

static gpc_rng rng;

static float *grads_of(const gpt_model *m) {
    float *g = malloc(gpt_num_params(m) * sizeof(float));
    memcpy(g, gpt_grads_flat(m)->data, gpt_num_params(m) * sizeof(float));
    return g;
}

static void test_recompute_is_exact(void **state) {
    (void)state;
    const int L = 1 + (int)gpc_rng_below(&rng, 3), NH = 2,
              C = 16 * (1 + (int)gpc_rng_below(&rng, 2));
    const int B = 3, T = 12, V = 70 + (int)gpc_rng_below(&rng, 50);
    gpt_config config;
    TEST_OK(gpt_config_init(&config, L, NH, C, T, V));
    gpt_model *m[3];
    uint64_t seed = gpc_rng_u32(&rng);
    for (int r = 0; r < 3; r++) {
        TEST_OK(gpt_create_recompute(&m[r], &config, gpc_cpu(), GPC_F32, B, T, 1, r));
        TEST_OK(gpt_init_weights(m[r], seed));
        TEST_OK(gpt_zero_grad(m[r]));
    }
    /* three micro-steps, the middle one smaller than planned, a few masked targets */
    const int batches[3][2] = {{B, T}, {2, 7}, {B, T}};
    double loss_sum = 0;
    int64_t tokens = 0;
    for (int step = 0; step < 3; step++) {
        int b = batches[step][0], t = batches[step][1];
        int32_t inputs[3 * 12], targets[3 * 12];
        int64_t unmasked = 0;
        for (int i = 0; i < b * t; i++) {
            inputs[i] = (int32_t)gpc_rng_below(&rng, (uint64_t)V);
            targets[i] = i % 7 == 3 ? -1 : (int32_t)gpc_rng_below(&rng, (uint64_t)V);
            unmasked += targets[i] >= 0;
        }
        tokens += unmasked;
        float loss[3];
        for (int r = 0; r < 3; r++) {
            TEST_OK(gpt_forward_backward(m[r], inputs, targets, b, t, 1.0f / (float)(b * t)));
            TEST_OK(gpt_mean_loss(m[r], &loss[r]));
        }
        assert_memory_equal(&loss[0], &loss[1], sizeof(float));
        assert_memory_equal(&loss[0], &loss[2], sizeof(float));
        loss_sum += (double)loss[0] * (double)unmasked;
    }
    float *g0 = grads_of(m[0]);
    for (int r = 1; r < 3; r++) {
        float *g = grads_of(m[r]);
        for (size_t i = 0; i < gpt_num_params(m[0]); i++)
            if (memcmp(&g[i], &g0[i], sizeof(float)) != 0)
                fail_msg("--recompute %d: gradient %zu is %.9g, %.9g without recomputation", r, i,
                         (double)g[i], (double)g0[i]);
        free(g);
    }
    free(g0);
    /* the loss summed on the device, read once */
    for (int r = 0; r < 3; r++) {
        float mean = 0;
        TEST_OK(gpt_read_step(m[r], &mean, NULL));
        double want = loss_sum / (double)tokens;
        if (!(fabs(mean - want) <= 1e-6 * fabs(want)))
            fail_msg("gpt_read_step: %.9g, float64 mean of the micro-steps %.9g", (double)mean,
                     want);
        /* and it starts over */
        TEST_OK(gpt_read_step(m[r], &mean, NULL));
        assert_true(mean == 0.0f);
    }
    /* memory: level 1 drops L-1 layers of [B,T,4C], level 2 also 2(L-1) of [B,T,C] */
    size_t r0 = gpt_memory_bytes(m[0]), r1 = gpt_memory_bytes(m[1]), r2 = gpt_memory_bytes(m[2]);
    size_t gelu_layer = (size_t)B * T * 4 * C * 4, ln_layer = (size_t)B * T * C * 4;
    long long slack = 256 * 3; /* arena alignment of the three buffers */
    long long d1 = (long long)(r0 - r1) - (long long)((L - 1) * gelu_layer);
    long long d2 = (long long)(r1 - r2) - (long long)(2 * (L - 1) * ln_layer);
    if (llabs(d1) > slack || llabs(d2) > slack)
        fail_msg("L=%d C=%d: memory %zu / %zu / %zu for recompute 0 / 1 / 2", L, C, r0, r1, r2);
    for (int r = 0; r < 3; r++)
        gpt_free(m[r]);
}

static void test_recompute_errors(void **state) {
    (void)state;
    gpt_config config;
    TEST_OK(gpt_config_init(&config, 1, 1, 8, 4, 10));
    gpt_model *m = NULL;
    TEST_FAILS(gpt_create_recompute(&m, &config, gpc_cpu(), GPC_F32, 1, 4, 1, 3),
               GPC_ERR_INVALID_ARG, "--recompute 3 is not 0");
    TEST_FAILS(gpt_create_recompute(&m, &config, gpc_cpu(), GPC_F32, 1, 4, 1, -1),
               GPC_ERR_INVALID_ARG, "--recompute -1");
    assert_null(m);
    /* an inference model keeps nothing for backward: recompute is ignored */
    TEST_OK(gpt_create_recompute(&m, &config, gpc_cpu(), GPC_F32, 1, 4, 0, 2));
    assert_int_equal(gpt_recompute(m), 0);
    float loss;
    TEST_FAILS(gpt_read_step(m, &loss, NULL), GPC_ERR_INVALID_ARG, "created for inference");
    gpt_free(m);
}

int main(void) {
    gpc_rng_seed(&rng, test_seed(), 41);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recompute_is_exact),
        cmocka_unit_test(test_recompute_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
