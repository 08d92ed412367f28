/*
 * test_gpt_recompute.c: activation recomputation and the device-summed loss.
 *
 * With --recompute 1 (GELU), 2 (GELU and layernorm) and block (everything
 * inside a block), on all blocks or the first N, the model keeps one slot of
 * those activations and rebuilds each layer's in backward with the forward
 * pass's own ops, so on the CPU the losses and every gradient must be
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

/* The modes compared with keeping everything: each level on all blocks,
 * and block recomputation and GELU on the first block only. */
#define MODES 6
static const int modes[MODES] = {0,
                                 GPT_RECOMPUTE_GELU,
                                 GPT_RECOMPUTE_LAYERNORM,
                                 GPT_RECOMPUTE_BLOCK,
                                 GPT_RECOMPUTE(GPT_RECOMPUTE_BLOCK, 1),
                                 GPT_RECOMPUTE(GPT_RECOMPUTE_GELU, 1)};

static void test_recompute_is_exact(void **state) {
    (void)state;
    const int L = 1 + (int)gpc_rng_below(&rng, 3), NH = 2,
              C = 16 * (1 + (int)gpc_rng_below(&rng, 2));
    const int B = 3, T = 12, V = 70 + (int)gpc_rng_below(&rng, 50);
    gpt_config config;
    TEST_OK(gpt_config_init(&config, L, NH, C, T, V));
    gpt_model *m[MODES];
    uint64_t seed = gpc_rng_u32(&rng);
    for (int r = 0; r < MODES; r++) {
        TEST_OK(gpt_create_recompute(&m[r], &config, gpc_cpu(), GPC_F32, B, T, 1, modes[r]));
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
        float loss[MODES];
        for (int r = 0; r < MODES; r++) {
            TEST_OK(gpt_forward_backward(m[r], inputs, targets, b, t, 1.0f / (float)(b * t)));
            TEST_OK(gpt_mean_loss(m[r], &loss[r]));
            assert_memory_equal(&loss[0], &loss[r], sizeof(float));
        }
        loss_sum += (double)loss[0] * (double)unmasked;
    }
    float *g0 = grads_of(m[0]);
    for (int r = 1; r < MODES; r++) {
        float *g = grads_of(m[r]);
        char name[32];
        for (size_t i = 0; i < gpt_num_params(m[0]); i++)
            if (memcmp(&g[i], &g0[i], sizeof(float)) != 0)
                fail_msg("--recompute %s: gradient %zu is %.9g, %.9g without recomputation",
                         gpt_recompute_name(modes[r], name, sizeof name), i, (double)g[i],
                         (double)g0[i]);
        free(g);
    }
    free(g0);
    /* the loss summed on the device, read once */
    for (int r = 0; r < MODES; r++) {
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
    /* memory: level 1 drops L-1 layers of [B,T,4C], level 2 also 2(L-1) of
     * [B,T,C]; block also qkv [B,T,3C], atty and residual2 [B,T,C], fch
     * [B,T,4C], lse [B,NH,T] and four [B,T] statistics of L-1 layers; on the
     * first block only, nothing is dropped (one slot is what it had) */
    size_t bytes[MODES];
    for (int r = 0; r < MODES; r++)
        bytes[r] = gpt_memory_bytes(m[r]);
    size_t bt = (size_t)B * T * 4; /* f32 */
    size_t gelu_layer = bt * 4 * C, ln_layer = bt * C;
    size_t block_layer = bt * 3 * C + 2 * bt * C + bt * 4 * C + (size_t)NH * bt + 4 * bt;
    long long slack = 256 * 10; /* arena alignment of the buffers */
    long long d1 = (long long)(bytes[0] - bytes[1]) - (long long)((L - 1) * gelu_layer);
    long long d2 = (long long)(bytes[1] - bytes[2]) - (long long)(2 * (L - 1) * ln_layer);
    long long d3 = (long long)(bytes[2] - bytes[3]) - (long long)((L - 1) * block_layer);
    if (llabs(d1) > slack || llabs(d2) > slack || llabs(d3) > slack)
        fail_msg("L=%d C=%d: memory %zu / %zu / %zu / %zu for recompute 0 / 1 / 2 / block", L, C,
                 bytes[0], bytes[1], bytes[2], bytes[3]);
    assert_int_equal(bytes[4], bytes[0]);
    assert_int_equal(bytes[5], bytes[0]);
    for (int r = 0; r < MODES; r++)
        gpt_free(m[r]);
}

/* Block recomputation on the first N of L blocks drops N-1 layers of every
 * activation inside a block, and its gradients stay exact over a LoRA
 * model too (the adapters' down-projections are rebuilt with the block). */
static void test_recompute_some_blocks(void **state) {
    (void)state;
    const int L = 4, NH = 2, C = 16, B = 2, T = 8, V = 60;
    gpt_config config;
    TEST_OK(gpt_config_init(&config, L, NH, C, T, V));
    int32_t inputs[2 * 8], targets[2 * 8];
    for (int i = 0; i < B * T; i++) {
        inputs[i] = (int32_t)gpc_rng_below(&rng, V);
        targets[i] = (int32_t)gpc_rng_below(&rng, V);
    }
    size_t bytes[L + 1];
    float *g0 = NULL;
    for (int n = 0; n <= L; n++) {
        gpt_lora_options lora = {.rank = 2, .seed = 5};
        gpt_model *m;
        int mode = n ? GPT_RECOMPUTE(GPT_RECOMPUTE_BLOCK, n) : 0;
        TEST_OK(gpt_create_lora(&m, &config, gpc_cpu(), GPC_F32, B, T, 1, mode, &lora));
        TEST_OK(gpt_init_weights(m, 9));
        /* two steps, so that both A and B (zero at first) have moved by
         * their gradients: the adapters after them compare the gradients */
        gpc_optim_options o;
        gpc_optim_defaults(&o);
        for (int step = 0; step < 2; step++) {
            TEST_OK(gpt_zero_grad(m));
            TEST_OK(gpt_forward_backward(m, inputs, targets, B, T, 1.0f / (B * T)));
            TEST_OK(gpt_update(m, &o, NULL, NULL));
        }
        bytes[n] = gpt_memory_bytes(m);
        size_t count = gpt_lora_num_params(m);
        float *g = malloc(count * sizeof(float));
        TEST_OK(gpt_lora_get_params(m, g));
        if (!g0)
            g0 = g;
        else {
            assert_memory_equal(g, g0, count * sizeof(float));
            free(g);
        }
        gpt_free(m);
    }
    free(g0);
    for (int n = 2; n <= L; n++)
        assert_true(bytes[n] < bytes[n - 1]);
    assert_int_equal(bytes[1], bytes[0]);
    /* each further block saves the same */
    long long step1 = (long long)(bytes[1] - bytes[2]), step2 = (long long)(bytes[2] - bytes[3]);
    if (llabs(step1 - step2) > 256 * 12)
        fail_msg("block recomputation on 1, 2, 3 blocks: %zu, %zu, %zu bytes", bytes[1], bytes[2],
                 bytes[3]);
}

static void test_recompute_errors(void **state) {
    (void)state;
    gpt_config config;
    TEST_OK(gpt_config_init(&config, 1, 1, 8, 4, 10));
    gpt_model *m = NULL;
    TEST_FAILS(gpt_create_recompute(&m, &config, gpc_cpu(), GPC_F32, 1, 4, 1,
                                    GPT_RECOMPUTE(GPT_RECOMPUTE_BLOCK, 2)),
               GPC_ERR_INVALID_ARG, "--recompute-layers 2 is more than the model's 1 blocks");
    TEST_FAILS(gpt_create_recompute(&m, &config, gpc_cpu(), GPC_F32, 1, 4, 1, GPT_RECOMPUTE(0, 1)),
               GPC_ERR_INVALID_ARG, "--recompute-layers 1 needs a --recompute level");
    TEST_FAILS(gpt_create_recompute(&m, &config, gpc_cpu(), GPC_F32, 1, 4, 1, -1),
               GPC_ERR_INVALID_ARG, "--recompute -1");
    /* under pipeline parallelism a block count is each stage's */
    gpt_config four;
    TEST_OK(gpt_config_init(&four, 4, 1, 8, 4, 10));
    const gpt_parallel stage = {1, 0, 2, 0, 2};
    TEST_FAILS(gpt_create_part(&m, &four, gpc_cpu(), GPC_F32, 1, 4,
                               GPT_RECOMPUTE(GPT_RECOMPUTE_BLOCK, 3), &stage, 0, SIZE_MAX),
               GPC_ERR_INVALID_ARG,
               "--recompute-layers 3 is more than a pipeline stage's 2 blocks");
    assert_null(m);
    /* an inference model keeps nothing for backward: recompute is ignored */
    TEST_OK(gpt_create_recompute(&m, &config, gpc_cpu(), GPC_F32, 1, 4, 0, 2));
    assert_int_equal(gpt_recompute(m), 0);
    float loss;
    TEST_FAILS(gpt_read_step(m, &loss, NULL), GPC_ERR_INVALID_ARG, "created for inference");
    gpt_free(m);
}

/* The command line's spellings and config.txt's names. */
static void test_recompute_names(void **state) {
    (void)state;
    static const struct {
        const char *text;
        int value;
        const char *name;
    } cases[] = {{"0", 0, "0"},
                 {"none", 0, "0"},
                 {"1", 1, "gelu"},
                 {"gelu", 1, "gelu"},
                 {"2", 2, "layernorm"},
                 {"ln", 2, "layernorm"},
                 {"block", 3, "block"},
                 {"3", 3, "block"},
                 {"block:6", 3 + 6 * 4, "block:6"},
                 {"gelu:2", 1 + 2 * 4, "gelu:2"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int value = -1;
        char name[32];
        TEST_OK(gpt_recompute_parse(cases[i].text, &value));
        assert_int_equal(value, cases[i].value);
        assert_string_equal(gpt_recompute_name(value, name, sizeof name), cases[i].name);
        int blocks = value == 0 ? 0 : value >> 2 ? value >> 2 : 12;
        assert_int_equal(gpt_recompute_layers(value, 12), blocks);
    }
    static const char *const bad[] = {"4", "blocks", "block:", "block:0", "block:x", "0:3", ""};
    int value;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        TEST_FAILS(gpt_recompute_parse(bad[i], &value), GPC_ERR_INVALID_ARG, "is not 0, gelu");
}

int main(void) {
    gpc_rng_seed(&rng, test_seed(), 41);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recompute_is_exact),
        cmocka_unit_test(test_recompute_some_blocks),
        cmocka_unit_test(test_recompute_errors),
        cmocka_unit_test(test_recompute_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
