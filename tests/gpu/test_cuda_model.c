/*
 * test_cuda_model.c: the whole GPT model on the GPU against the same model on
 * the CPU, on a tiny config with head size 64 (so bf16 runs the tensor-core
 * attention kernels): the loss, every parameter gradient of one training
 * micro-step, and the loss after one AdamW update.
 *
 * Both models start from gpt_init_weights with one seed (the same weights on
 * every device) and see the same random tokens. In f32 the gradients must
 * agree element by element within 1e-4 of the tensor's RMS; in bf16 and f16,
 * where every activation and gradient is rounded to 8 or 11 mantissa bits,
 * each tensor's relative error ||gpu - cpu|| / ||cpu|| must stay within
 * 2e-2 (the whole network's rounding, not one op's).
 *
 * The GPU model also runs with activation recomputation (--recompute 1 and
 * 2) against the CPU model without: the same tolerances hold, since the
 * rebuilt activations are the forward pass's own values (layernorm rebuilt
 * from the stored bf16 residual may differ from the fused kernel's in the
 * last bf16 bit). fp16's dynamic loss scaling is checked by forcing an
 * overflow: the step must be skipped, reported, the scale halved and the
 * weights left as they were. Generation's forward over kept keys and values
 * is checked against the CPU model's full forward. A vocabulary whose padded
 * width is a multiple of 192 takes the fused output head on Hopper.
 *
 * Without a usable GPU the test exits 77 (CTest: skipped).
 */
#include "testutil.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/matmul.h"
#include "gpc/model.h"

static gpc_rng rng;

/* The gradients as f32, with fp16's loss scale taken out. */
static float *grads_to_host(const gpt_model *m) {
    size_t n = gpt_num_params(m), es = gpc_dtype_size(gpt_dtype(m));
    float *out = malloc(n * sizeof(float));
    void *raw = malloc(n * es);
    if (gpt_device(m).type == GPC_DEVICE_CPU)
        memcpy(raw, gpt_grads_flat(m)->data, n * es);
    else
        assert_int_equal(cudaMemcpy(raw, gpt_grads_flat(m)->data, n * es, cudaMemcpyDeviceToHost),
                         0);
    for (size_t i = 0; i < n; i++) {
        if (gpt_dtype(m) == GPC_F32)
            out[i] = ((float *)raw)[i];
        else if (gpt_dtype(m) == GPC_BF16)
            out[i] = gpc_bf16_to_f32(((uint16_t *)raw)[i]);
        else
            out[i] = gpc_f16_to_f32(((uint16_t *)raw)[i]);
        out[i] /= gpt_loss_scale(m);
    }
    free(raw);
    return out;
}

static void compare_model(gpc_dtype dtype, int recompute, int vocab) {
    gpt_config config;
    TEST_OK(gpt_config_init(&config, 2, 2, 128, 64, vocab));
    const int B = 2, T = 64;
    gpt_model *cpu = NULL, *gpu = NULL;
    TEST_OK(gpt_create(&cpu, &config, gpc_cpu(), GPC_F32, B, T, 1));
    TEST_OK(gpt_create_recompute(&gpu, &config, (gpc_device){GPC_DEVICE_CUDA, 0}, dtype, B, T, 1,
                                 recompute));
    uint64_t seed = gpc_rng_u32(&rng);
    TEST_OK(gpt_init_weights(cpu, seed));
    TEST_OK(gpt_init_weights(gpu, seed));

    int32_t inputs[2 * 64], targets[2 * 64];
    for (int i = 0; i < B * T; i++) {
        inputs[i] = (int32_t)gpc_rng_below(&rng, (uint32_t)vocab);
        targets[i] = i % 17 == 5 ? -1 : (int32_t)gpc_rng_below(&rng, (uint32_t)vocab);
    }
    float dloss = 1.0f / (float)(B * T);
    TEST_OK(gpt_zero_grad(cpu));
    TEST_OK(gpt_zero_grad(gpu));
    TEST_OK(gpt_forward_backward(cpu, inputs, targets, B, T, dloss));
    TEST_OK(gpt_forward_backward(gpu, inputs, targets, B, T, dloss));
    float loss_cpu, loss_gpu;
    TEST_OK(gpt_mean_loss(cpu, &loss_cpu));
    TEST_OK(gpt_mean_loss(gpu, &loss_gpu));
    double loss_tol = dtype == GPC_F32 ? 1e-5 : 1e-2;
    if (!(fabs(loss_gpu - loss_cpu) <= loss_tol * fabs(loss_cpu)))
        fail_msg("%s model: loss %.7f on the GPU, %.7f on the CPU", gpc_dtype_name(dtype), loss_gpu,
                 loss_cpu);
    /* the loss summed on the device: the same mean over the unmasked tokens */
    float step_loss = -1, step_norm = -1;
    TEST_OK(gpt_read_step(gpu, &step_loss, &step_norm));
    if (!(fabs(step_loss - loss_cpu) <= loss_tol * fabs(loss_cpu)))
        fail_msg("%s model: gpt_read_step loss %.7f, CPU mean loss %.7f", gpc_dtype_name(dtype),
                 step_loss, loss_cpu);

    float *gc = grads_to_host(cpu), *gg = grads_to_host(gpu);
    for (int p = 0; p < GPT_NUM_PARAM_TENSORS; p++) {
        size_t begin = gpt_param_offsets(cpu)[p];
        size_t end =
            p + 1 < GPT_NUM_PARAM_TENSORS ? gpt_param_offsets(cpu)[p + 1] : gpt_num_params(cpu);
        size_t n = end - begin;
        double sq = 0, diff = 0;
        for (size_t i = begin; i < end; i++) {
            sq += (double)gc[i] * gc[i];
            diff += ((double)gg[i] - gc[i]) * ((double)gg[i] - gc[i]);
        }
        double rms = sqrt(sq / (double)n);
        char what[96];
        snprintf(what, sizeof what, "%s gradient of %s", gpc_dtype_name(dtype), gpt_param_names[p]);
        if (rms == 0) continue; /* e.g. padded rows only: nothing to compare */
        if (dtype == GPC_F32) {
            test_assert_close_f32(what, gg + begin, gc + begin, n, 1e-4, rms);
        } else {
            double rel = sqrt(diff / sq);
            if (!(rel <= 2e-2)) fail_msg("%s: relative error %.3g > 2e-2", what, rel);
        }
    }
    free(gc);
    free(gg);

    /* one update, then the loss of a fresh forward pass */
    gpc_optim_options options;
    gpc_optim_defaults(&options);
    options.learning_rate = 1e-3f;
    options.seed = 7;
    TEST_OK(gpt_update(cpu, &options, NULL, NULL));
    TEST_OK(gpt_update(gpu, &options, NULL, NULL));
    TEST_OK(gpt_forward(cpu, inputs, targets, B, T));
    TEST_OK(gpt_forward(gpu, inputs, targets, B, T));
    TEST_OK(gpt_mean_loss(cpu, &loss_cpu));
    TEST_OK(gpt_mean_loss(gpu, &loss_gpu));
    if (!(fabs(loss_gpu - loss_cpu) <= (dtype == GPC_F32 ? 1e-4 : 1e-2) * fabs(loss_cpu)))
        fail_msg("%s model after one step: loss %.7f on the GPU, %.7f on the CPU",
                 gpc_dtype_name(dtype), loss_gpu, loss_cpu);
    gpt_free(cpu);
    gpt_free(gpu);
}

static void test_model_f32(void **state) {
    (void)state;
    compare_model(GPC_F32, 0, 300);
}

static void test_model_bf16(void **state) {
    (void)state;
    compare_model(GPC_BF16, 0, 300);
}

/* A vocabulary of 380 pads to 384 columns, two tiles of 192: on Hopper the
 * bf16 model's output head then runs fused (classifier_sm90.cu), its
 * gradients reaching every parameter through lnf's. */
static void test_model_bf16_fused_head(void **state) {
    (void)state;
    long before = gpc_cuda_classifier_sm90_calls();
    compare_model(GPC_BF16, 0, 380);
    int on = gpc_cuda_classifier_sm90_available();
    long ran = gpc_cuda_classifier_sm90_calls() - before;
    printf("  fused output heads: %ld (%s here)\n", ran, on ? "available" : "not available");
    assert_int_equal(ran, on ? 1 : 0);
}

static void test_model_f16(void **state) {
    (void)state;
    compare_model(GPC_F16, 0, 300);
}

static void test_model_recompute(void **state) {
    (void)state;
    compare_model(GPC_F32, 2, 300);
    compare_model(GPC_BF16, 1, 300);
    compare_model(GPC_BF16, 2, 300);
}

/* Forces an fp16 overflow with a huge loss scale: the update is skipped and
 * reported, the scale halves, the weights stay; at a sane scale the next
 * step updates. */
static void test_f16_overflow_skips_step(void **state) {
    (void)state;
    gpt_config config;
    TEST_OK(gpt_config_init(&config, 1, 2, 128, 32, 200));
    const int B = 2, T = 32;
    gpt_model *m = NULL;
    TEST_OK(gpt_create(&m, &config, (gpc_device){GPC_DEVICE_CUDA, 0}, GPC_F16, B, T, 1));
    TEST_OK(gpt_init_weights(m, gpc_rng_u32(&rng)));
    int32_t inputs[2 * 32], targets[2 * 32];
    for (int i = 0; i < B * T; i++) {
        inputs[i] = (int32_t)gpc_rng_below(&rng, 200);
        targets[i] = (int32_t)gpc_rng_below(&rng, 200);
    }
    float *before = malloc(gpt_num_params(m) * sizeof(float));
    float *after = malloc(gpt_num_params(m) * sizeof(float));
    TEST_OK(gpt_get_params(m, before));
    gpc_optim_options options;
    gpc_optim_defaults(&options);
    options.learning_rate = 1e-3f;
    /* dlogits ~ scale / (B*T) = 1e9 / 64: far beyond fp16's 65504 */
    gpt_set_loss_scale(m, 1e9f);
    TEST_OK(gpt_zero_grad(m));
    TEST_OK(gpt_forward_backward(m, inputs, targets, B, T, 1.0f / (float)(B * T)));
    int skipped = 0;
    float norm = 0;
    TEST_OK(gpt_update(m, &options, &norm, &skipped));
    assert_int_equal(skipped, 1);
    assert_true(isnan(norm));
    assert_true(gpt_loss_scale(m) == 5e8f);
    TEST_OK(gpt_get_params(m, after));
    assert_memory_equal(before, after, gpt_num_params(m) * sizeof(float));

    gpt_set_loss_scale(m, 1024.0f);
    TEST_OK(gpt_zero_grad(m));
    TEST_OK(gpt_forward_backward(m, inputs, targets, B, T, 1.0f / (float)(B * T)));
    TEST_OK(gpt_update(m, &options, &norm, &skipped));
    assert_int_equal(skipped, 0);
    assert_true(isfinite(norm) && norm > 0);
    TEST_OK(gpt_get_params(m, after));
    assert_true(memcmp(before, after, gpt_num_params(m) * sizeof(float)) != 0);
    free(before);
    free(after);
    gpt_free(m);
}

/* Generation's forward on the GPU (gpt_forward_cached: one position at a
 * time over kept keys and values) against the CPU model's full forward on
 * the same sequence, in f32 and bf16, with the prompt in two chunks. */
static void test_forward_cached(void **state) {
    (void)state;
    gpt_config config;
    TEST_OK(gpt_config_init(&config, 2, 2, 128, 64, 300));
    const int T = 40, V = 300;
    gpt_model *cpu = NULL;
    TEST_OK(gpt_create(&cpu, &config, gpc_cpu(), GPC_F32, 1, 64, 0));
    uint64_t seed = gpc_rng_u32(&rng);
    TEST_OK(gpt_init_weights(cpu, seed));
    int32_t seq[40];
    for (int i = 0; i < T; i++)
        seq[i] = (int32_t)gpc_rng_below(&rng, V);
    float want[300], got[300];
    const gpc_dtype dtypes[2] = {GPC_F32, GPC_BF16};
    for (int d = 0; d < 2; d++) {
        gpt_model *gpu = NULL;
        TEST_OK(gpt_create(&gpu, &config, (gpc_device){GPC_DEVICE_CUDA, 0}, dtypes[d], 1, 64, 0));
        TEST_OK(gpt_init_weights(gpu, seed));
        int pos = 0;
        while (pos < T) {
            int n = pos == 0 ? 7 : pos == 7 ? 9 : 1;
            TEST_OK(gpt_forward_cached(gpu, seq + pos, pos, n, got));
            pos += n;
            TEST_OK(gpt_forward_last_logits(cpu, seq, 1, pos, want));
            char what[64];
            snprintf(what, sizeof what, "%s cached logits to %d", gpc_dtype_name(dtypes[d]), pos);
            if (dtypes[d] == GPC_F32)
                test_assert_close_f32(what, got, want, V, 1e-4, 1.0);
            else {
                double num = 0, den = 0;
                for (int v = 0; v < V; v++)
                    num += (got[v] - want[v]) * (got[v] - want[v]), den += want[v] * want[v];
                if (!(sqrt(num / den) <= 2e-2))
                    fail_msg("%s: relative error %.3g", what, sqrt(num / den));
            }
        }
        gpt_free(gpu);
    }
    gpt_free(cpu);
}

int main(void) {
    if (!gpc_backend_get(GPC_DEVICE_CUDA)) {
        fprintf(stderr, "skipped: %s\n", gpc_last_error());
        return 77;
    }
    gpc_rng_seed(&rng, test_seed(), 5);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_f32),
        cmocka_unit_test(test_model_bf16),
        cmocka_unit_test(test_model_bf16_fused_head),
        cmocka_unit_test(test_model_f16),
        cmocka_unit_test(test_model_recompute),
        cmocka_unit_test(test_f16_overflow_skips_step),
        cmocka_unit_test(test_forward_cached),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
