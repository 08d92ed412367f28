/*
 * test_cuda_offload.c: the optimizer offloaded to the host (gpt_create_offload)
 * against the plain bf16 model on the GPU, from the same weights and
 * batches, over 10 AdamW steps with clipping.
 *
 * The two runs differ only in where AdamW runs: the CPU's loop and the
 * GPU's kernel round their f32 arithmetic differently (fused multiply-adds,
 * sqrtf), so a master weight can end a last bit apart and its bf16 copy
 * one bf16 step apart. That is bf16 noise, as in test_cuda_lora.c: each
 * step's loss within 1e-2 of the plain run's, the gradient norms within
 * 2%, and the updates of the master weights, m and v within 5% of their
 * norm. Exact, whatever the rounding: the device's bf16 weights are the
 * host masters rounded to nearest (every chunk came back), and a
 * checkpoint of the offloaded model loads into a plain one with the same
 * master bits, and its weights alone into an offloaded one (--init-from)
 * with zero moments. Weights drawn by gpt_init_weights straight into the
 * pinned master are those a CPU model draws from the seed, bit for bit, and
 * the device's bf16 copy is theirs rounded to nearest. An overlapped update,
 * the next forward waiting layer by layer, repeats the plain offloaded
 * step bit for bit.
 *
 * GPC_OFFLOAD_CHUNK is set to 100,000 elements, so the 3.3M parameters
 * stream in about 33 chunks, and copies and updates overlap as on a large model.
 * Without a usable GPU the test exits 77 (CTest: skipped).
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/model.h"
#include "gpc/optim.h"

enum { B = 4, T = 128, V = 512, STEPS = 10 };

static gpc_rng rng;

/* A state array of the optimizer (device or host) as host floats. */
static float *state_of(const gpc_tensor *t) {
    size_t n = (size_t)gpc_tensor_numel(t);
    float *out = malloc(n * sizeof *out);
    gpc_tensor host = gpc_tensor_1d(out, GPC_F32, gpc_cpu(), (int64_t)n);
    TEST_OK(gpc_tensor_copy(&host, t));
    return out;
}

static void test_offload_against_plain(void **state) {
    (void)state;
    const gpc_device gpu = {GPC_DEVICE_CUDA, 0};
    gpt_config config;
    TEST_OK(gpt_config_init(&config, 4, 4, 256, T, V));
    gpt_model *plain = NULL, *off = NULL, *init = NULL;
    TEST_OK(gpt_create_recompute(&plain, &config, gpu, GPC_BF16, B, T, 1, 0));
    TEST_OK(gpt_create_offload(&off, &config, gpu, GPC_BF16, B, T, 0));
    assert_true(gpt_optimizer_offloaded(off));
    assert_true(gpt_host_pinned_bytes(off) > 0);
    /* the device holds no optimizer state: m, v and the master, 12 bytes
     * an element, are gone from its arenas */
    size_t P = gpt_num_params(plain);
    assert_true(gpt_memory_bytes(plain) - gpt_memory_bytes(off) >= 12 * P);

    TEST_OK(gpt_create(&init, &config, gpc_cpu(), GPC_F32, 1, 1, 0));
    TEST_OK(gpt_init_weights(init, gpc_rng_u32(&rng)));
    float *w0 = malloc(P * sizeof *w0), *wp = malloc(P * sizeof *wp), *wo = malloc(P * sizeof *wo);
    TEST_OK(gpt_get_params(init, w0));
    gpt_free(init);
    TEST_OK(gpt_set_params(plain, w0));
    TEST_OK(gpt_set_params(off, w0));

    /* a learnable map, so the loss moves over the 10 steps */
    int32_t inputs[B * T], targets[B * T];
    gpc_optim_options o;
    gpc_optim_defaults(&o);
    o.learning_rate = 1e-3f;
    float first = 0, last = 0;
    for (int step = 1; step <= STEPS; step++) {
        for (int i = 0; i < B * T; i++) {
            inputs[i] = (int32_t)gpc_rng_below(&rng, V);
            targets[i] = (inputs[i] * 7 + 3) % V;
        }
        float loss[2], norm[2];
        gpt_model *models[2] = {plain, off};
        for (int k = 0; k < 2; k++) {
            TEST_OK(gpt_zero_grad(models[k]));
            TEST_OK(gpt_forward_backward(models[k], inputs, targets, B, T, 1.0f / (B * T)));
            o.step = step;
            TEST_OK(gpt_update(models[k], &o, NULL, NULL));
            TEST_OK(gpt_read_step(models[k], &loss[k], &norm[k]));
        }
        if (fabs(loss[1] - loss[0]) > 1e-2 * fabs(loss[0]))
            fail_msg("step %d: loss %.6f offloaded, %.6f plain", step, loss[1], loss[0]);
        if (fabs(norm[1] - norm[0]) > 2e-2 * fabs(norm[0]))
            fail_msg("step %d: gradient norm %.6f offloaded, %.6f plain", step, norm[1], norm[0]);
        if (step == 1) first = loss[0];
        last = loss[0];
    }
    assert_true(last < first); /* the runs learn */

    /* the master weights moved alike */
    TEST_OK(gpt_get_params(plain, wp));
    TEST_OK(gpt_get_params(off, wo));
    for (size_t i = 0; i < P; i++)
        wp[i] -= w0[i], wo[i] -= w0[i];
    double e = test_rel_norm(wo, wp, P);
    if (e > 5e-2) fail_msg("master updates differ by %.3g of their norm", e);
    const gpc_optim *op = gpt_optimizer(plain), *oo = gpt_optimizer(off);
    const gpc_tensor *sp[2] = {gpc_optim_m(op), gpc_optim_v(op)};
    const gpc_tensor *so[2] = {gpc_optim_m(oo), gpc_optim_v(oo)};
    for (int k = 0; k < 2; k++) {
        assert_int_equal(so[k]->device.type, GPC_DEVICE_CPU);
        float *a = state_of(sp[k]), *b = state_of(so[k]);
        e = test_rel_norm(b, a, P);
        if (e > 5e-2) fail_msg("%s differs by %.3g of its norm", k ? "v" : "m", e);
        free(a), free(b);
    }

    /* every chunk's bf16 weights came back: the device holds the host
     * masters rounded to nearest, bit for bit */
    TEST_OK(gpt_get_params(off, wo));
    uint16_t *low = malloc(P * sizeof *low);
    gpc_tensor host = gpc_tensor_1d(low, GPC_BF16, gpc_cpu(), (int64_t)P);
    TEST_OK(gpc_tensor_copy(&host, gpt_params_flat(off)));
    for (size_t i = 0; i < P; i++)
        if (low[i] != gpc_f32_to_bf16(wo[i]))
            fail_msg("element %zu: device bf16 0x%04x, host master %.9g rounds to 0x%04x", i,
                     low[i], (double)wo[i], gpc_f32_to_bf16(wo[i]));

    /* a checkpoint of the offloaded model loads into a plain one */
    char *dir = test_tmpdir("offload"), path[4200];
    snprintf(path, sizeof path, "%s/checkpoint.bin", dir);
    gpt_checkpoint_state st;
    memset(&st, 0, sizeof st);
    st.step = STEPS;
    st.recompute = 0;
    TEST_OK(gpt_checkpoint_save(path, off, &st));
    gpt_model *back = NULL;
    TEST_OK(gpt_create_recompute(&back, &config, gpu, GPC_BF16, B, T, 1, 0));
    TEST_OK(gpt_checkpoint_load(path, back, NULL));
    TEST_OK(gpt_get_params(back, wp));
    assert_memory_equal(wp, wo, P * sizeof *wp);
    float *m_back = state_of(gpc_optim_m(gpt_optimizer(back)));
    float *m_off = state_of(gpc_optim_m(oo));
    assert_memory_equal(m_back, m_off, P * sizeof *m_back);
    /* and its weights alone (--init-from) into a new offloaded model: read
     * into the pinned master, rounded to the device, moments zero */
    gpt_model *fresh = NULL;
    TEST_OK(gpt_create_offload(&fresh, &config, gpu, GPC_BF16, B, T, 0));
    TEST_OK(gpt_checkpoint_load_weights(path, fresh));
    TEST_OK(gpt_get_params(fresh, wp));
    assert_memory_equal(wp, wo, P * sizeof *wp);
    uint16_t *low_init = malloc(P * sizeof *low_init);
    gpc_tensor host_init = gpc_tensor_1d(low_init, GPC_BF16, gpc_cpu(), (int64_t)P);
    TEST_OK(gpc_tensor_copy(&host_init, gpt_params_flat(fresh)));
    assert_memory_equal(low_init, low, P * sizeof *low);
    const float *m_init = gpc_optim_m(gpt_optimizer(fresh))->data; /* host memory */
    for (size_t i = 0; i < P; i++)
        if (m_init[i] != 0.0f)
            fail_msg("element %zu: m %g after a weights-only load", i, m_init[i]);
    free(low_init);
    gpt_free(fresh);
    test_rmtree(dir);
    gpc_free(dir);
    free(w0), free(wp), free(wo), free(low), free(m_back), free(m_off);
    gpt_free(back);
    gpt_free(plain);
    gpt_free(off);
}

/* gpt_init_weights draws an offloaded model's weights in its pinned master
 * (no f32 copy of the model beside it): the same values as drawn into an
 * f32 CPU model from the seed, and the device's bf16 weights are those
 * values rounded to nearest. */
static void test_offload_init_in_master(void **state) {
    (void)state;
    const gpc_device gpu = {GPC_DEVICE_CUDA, 0};
    gpt_config config;
    TEST_OK(gpt_config_init(&config, 3, 4, 192, T, V));
    gpt_model *off = NULL, *ref = NULL;
    TEST_OK(gpt_create_offload(&off, &config, gpu, GPC_BF16, B, T, 0));
    TEST_OK(gpt_create(&ref, &config, gpc_cpu(), GPC_F32, 1, 1, 0));
    size_t P = gpt_num_params(ref);
    assert_non_null(gpc_optim_host_master(gpt_optimizer(off), P));
    uint64_t seed = gpc_rng_u32(&rng);
    TEST_OK(gpt_init_weights(off, seed));
    TEST_OK(gpt_init_weights(ref, seed));
    float *w = malloc(P * sizeof *w), *want = malloc(P * sizeof *want);
    uint16_t *low = malloc(P * sizeof *low);
    TEST_OK(gpt_get_params(off, w));
    TEST_OK(gpt_get_params(ref, want));
    assert_memory_equal(w, want, P * sizeof *w);
    gpc_tensor host = gpc_tensor_1d(low, GPC_BF16, gpc_cpu(), (int64_t)P);
    TEST_OK(gpc_tensor_copy(&host, gpt_params_flat(off)));
    size_t nonzero = 0;
    for (size_t i = 0; i < P; i++) {
        if (low[i] != gpc_f32_to_bf16(want[i]))
            fail_msg("element %zu: device bf16 0x%04x, drawn %.9g rounds to 0x%04x", i, low[i],
                     (double)want[i], gpc_f32_to_bf16(want[i]));
        nonzero += want[i] != 0.0f;
    }
    assert_true(nonzero > P / 2); /* drawn, not left at zero */
    free(w), free(want), free(low);
    gpt_free(ref);
    gpt_free(off);
}

/* The bf16 weights on the device and the host state (master, m, v) of an
 * offloaded model, as one host array: P halves, then 3P floats. */
static void *offload_state(gpt_model *m, size_t P) {
    char *out = malloc(P * 2 + 3 * P * sizeof(float));
    /* the accessors first: they wait for a running update, and the device's
     * stream for its uploads */
    const gpc_optim *o = gpt_optimizer(m);
    const gpc_tensor *parts[3] = {gpc_optim_master(o), gpc_optim_m(o), gpc_optim_v(o)};
    gpc_tensor low = gpc_tensor_1d(out, GPC_BF16, gpc_cpu(), (int64_t)P);
    TEST_OK(gpc_tensor_copy(&low, gpt_params_flat(m)));
    for (int k = 0; k < 3; k++)
        memcpy(out + P * 2 + k * P * sizeof(float), parts[k]->data, P * sizeof(float));
    return out;
}

/* An overlapped update (options.overlap: the step returns with the CPU
 * update running, the next forward waiting for each layer's weights) gives
 * the same bits as the plain offloaded step: the same CPU arithmetic on the
 * same chunks, only later. Two micro-steps a step, so the second forward
 * meets groups already waited for; every fourth step an evaluation forward
 * (gpt_forward) comes between the update and the next step, and the
 * second-to-last step is followed by a checkpoint-style read of the state
 * (the accessors wait for the update). */
static void test_offload_overlap(void **state) {
    (void)state;
    const gpc_device gpu = {GPC_DEVICE_CUDA, 0};
    gpt_config config;
    TEST_OK(gpt_config_init(&config, 3, 4, 256, T, V));
    gpt_model *models[2] = {NULL, NULL};
    uint64_t seed = gpc_rng_u32(&rng);
    for (int k = 0; k < 2; k++) {
        TEST_OK(gpt_create_offload(&models[k], &config, gpu, GPC_BF16, B, T, 0));
        TEST_OK(gpt_init_weights(models[k], seed));
    }
    size_t P = gpt_num_params(models[0]);
    float first = 0, last = 0;
    test_offload_overlap_steps(models, 1, 1, STEPS - 1, 4, B, T, V, 1e-3f, &rng, &first, NULL);
    /* the state read while the update may run */
    void *a = offload_state(models[0], P), *b = offload_state(models[1], P);
    assert_memory_equal(a, b, P * 2 + 3 * P * sizeof(float));
    free(a), free(b);
    test_offload_overlap_steps(models, 1, STEPS, STEPS, 4, B, T, V, 1e-3f, &rng, NULL, &last);
    assert_true(last < first);
    a = offload_state(models[0], P), b = offload_state(models[1], P);
    assert_memory_equal(a, b, P * 2 + 3 * P * sizeof(float));
    free(a), free(b);
    for (int k = 0; k < 2; k++)
        gpt_free(models[k]);
}

int main(void) {
    if (!gpc_backend_get(GPC_DEVICE_CUDA)) {
        fprintf(stderr, "skipped: %s\n", gpc_last_error());
        return 77;
    }
    setenv("GPC_OFFLOAD_CHUNK", "100000", 1);
    gpc_rng_seed(&rng, test_seed(), 34);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_offload_against_plain),
        cmocka_unit_test(test_offload_init_in_master),
        cmocka_unit_test(test_offload_overlap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
