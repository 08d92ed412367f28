/*
 * test_pipeline.c: the input pipeline on a GPU (gpc_prefetch_* with pinned
 * host buffers and a copy stream, gpt_forward_backward_device, and fp16's
 * overflow check left to the device) against the synchronous path:
 *  - the batches that reach the device are the synchronous loader's, as
 *    the compute stream sees them while it lags behind the host (slow work
 *    queued before each read), over several epochs and changes of position:
 *    what keeps them right is the events, not luck;
 *  - a small model trained on prefetched batches gives the losses and
 *    weights of one trained on host tokens uploaded by gpt_forward_backward,
 *    in f32 and bf16 (bitwise expected, the embedding backward summing
 *    each token's rows in the order of their positions; asserted within
 *    1e-6);
 *  - fp16 steps whose overflow verdict gpt_read_step reads skip and rescale
 *    exactly as steps whose verdict gpt_update reads itself;
 *  - gpc_train on the GPU, interrupted and resumed from its checkpoint,
 *    repeats the uninterrupted run bit for bit; where NVML answers, every
 *    step's line in metrics.jsonl carries the GPU's SM clock and power
 *    (both above zero) and the result counts the steps read.
 * Bitwise comparisons need kernels that sum in a fixed order: attention
 * runs on gpc's kernels with their two-kernel backward (cuDNN's, or the
 * fused backward of GPC_ATTENTION_BWD=fused, add dq with atomics), whatever
 * the environment asks.
 *
 * Without a usable GPU the test exits 77 (CTest: skipped).
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpc/data.h"
#include "gpc/model.h"
#include "gpc/nvml.h"
#include "gpc/train.h"
#include "ops/ops.h"

enum { V = 4096, B = 4, T = 32 };

static gpc_rng rng;
static char *root;
static char data_dir[4096];
static const gpc_device gpu = {GPC_DEVICE_CUDA, 0};

/* The training split is a permutation of the vocabulary, written in shards
 * of 1000 tokens, so no token occurs twice in a batch; the validation split
 * another permutation. */
static int setup(void **state) {
    (void)state;
    root = test_tmpdir("pipeline");
    snprintf(data_dir, sizeof data_dir, "%s/data", root);
    if (gpc_mkdir_p(data_dir) != GPC_OK) return -1;
    uint64_t *perm = malloc(V * sizeof *perm);
    uint32_t *tokens = malloc(V * sizeof *tokens);
    int shards = 0;
    for (int split = 0; split < 2; split++) {
        for (uint64_t i = 0; i < V; i++)
            perm[i] = i;
        gpc_rng_shuffle_u64(&rng, perm, V);
        for (uint64_t i = 0; i < V; i++)
            tokens[i] = (uint32_t)perm[i];
        for (int at = 0, k = 0; at < V; at += 1000, k++) {
            char path[4200];
            snprintf(path, sizeof path, "%s/%s_%04d.bin", data_dir, split ? "val" : "train", k);
            int n = V - at < 1000 ? V - at : 1000;
            if (gpc_shard_write(path, tokens + at, (uint64_t)n, V) != GPC_OK) return -1;
            if (!split) shards = k + 1;
        }
    }
    char path[4200], text[512];
    int len = snprintf(text, sizeof text,
                       "gpc-dataset 1\nvocab_size=%d\ntrain_tokens=%d\nval_tokens=%d\n"
                       "train_shards=%d\nval_shards=%d\n",
                       V, V, V, shards, shards);
    snprintf(path, sizeof path, "%s/dataset.txt", data_dir);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(text, 1, (size_t)len, f) != (size_t)len) return -1;
    fclose(f);
    free(perm);
    free(tokens);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    test_rmtree(root);
    gpc_free(root);
    return 0;
}

/* ---------------------------------------------------------- the batches */

/* Each batch is copied, on the compute stream and after slow work queued
 * there, into a device history; read back at the end, the history must
 * hold the synchronous loader's batches. A device slot overwritten before
 * the compute stream read it, or read before its copy arrived, would show. */
static void check_arrivals(int depth) {
    gpc_loader *l;
    gpc_prefetch *p;
    uint64_t seed = gpc_rng_u32(&rng);
    TEST_OK(gpc_loader_open(&l, data_dir, GPC_SPLIT_TRAIN, B, T, seed, 0, 1));
    TEST_OK(gpc_prefetch_open(&p, data_dir, GPC_SPLIT_TRAIN, B, T, seed, 0, 1, gpu, depth));
    uint64_t batches = gpc_loader_batches_per_epoch(l);
    const int K = (int)(3 * batches + 5);
    size_t n = (size_t)B * T;
    gpc_tensor history, slow;
    int64_t hshape[3] = {K, 2, (int64_t)n}, sshape[1] = {1 << 24};
    TEST_OK(gpc_tensor_alloc(&history, GPC_I32, gpu, 3, hshape));
    TEST_OK(gpc_tensor_alloc(&slow, GPC_F32, gpu, 1, sshape));
    TEST_OK(gpc_tensor_zero(&slow));
    int32_t *want = malloc((size_t)K * 2 * n * sizeof *want);
    int32_t *got = malloc((size_t)K * 2 * n * sizeof *got);
    for (int k = 0; k < K; k++) {
        if (k % 11 == 10) { /* a new position, on both */
            gpc_loader_state to = {gpc_rng_below(&rng, 4), gpc_rng_below(&rng, (uint32_t)batches)};
            TEST_OK(gpc_prefetch_set_state(p, &to));
            TEST_OK(gpc_loader_set_state(l, &to));
        }
        gpc_batch batch;
        TEST_OK(gpc_prefetch_next(p, &batch));
        TEST_OK(gpc_loader_next(l, want + (size_t)k * 2 * n, want + ((size_t)k * 2 + 1) * n));
        assert_int_equal(batch.inputs.device.type, GPC_DEVICE_CUDA);
        assert_int_equal(batch.inputs.dtype, GPC_I32);
        assert_int_equal(batch.inputs.shape[0], B);
        assert_int_equal(batch.inputs.shape[1], T);
        assert_int_equal(batch.unmasked, (int64_t)n);
        for (int r = 0; r < 1 + k % 3; r++) /* the GPU falls behind the host */
            TEST_OK(gpc_op_scale(&slow, 1.0f));
        gpc_tensor in_k =
            gpc_tensor_1d((int32_t *)history.data + (size_t)k * 2 * n, GPC_I32, gpu, (int64_t)n);
        gpc_tensor tg_k = gpc_tensor_1d((int32_t *)history.data + ((size_t)k * 2 + 1) * n, GPC_I32,
                                        gpu, (int64_t)n);
        gpc_tensor in = gpc_tensor_1d(batch.inputs.data, GPC_I32, gpu, (int64_t)n);
        gpc_tensor tg = gpc_tensor_1d(batch.targets.data, GPC_I32, gpu, (int64_t)n);
        TEST_OK(gpc_tensor_copy(&in_k, &in)); /* device to device: queued on the compute stream */
        TEST_OK(gpc_tensor_copy(&tg_k, &tg));
    }
    gpc_tensor host = gpc_tensor_3d(got, GPC_I32, gpc_cpu(), K, 2, (int64_t)n);
    TEST_OK(gpc_tensor_copy(&host, &history));
    for (int k = 0; k < K; k++)
        if (memcmp(got + (size_t)k * 2 * n, want + (size_t)k * 2 * n, 2 * n * sizeof *got) != 0)
            fail_msg("depth %d: batch %d on the GPU is not the loader's", depth, k);
    gpc_prefetch_close(p);
    gpc_loader_close(l);
    gpc_tensor_free(&history);
    gpc_tensor_free(&slow);
    free(want);
    free(got);
}

static void test_batches_arrive_in_order(void **state) {
    (void)state;
    check_arrivals(2);
    check_arrivals(4);
}

/* ------------------------------------------------- training, two ways */

static void check_training(gpc_dtype dtype) {
    gpt_config config;
    TEST_OK(gpt_config_init(&config, 2, 2, 128, T, V)); /* head size 64 */
    gpt_model *host = NULL, *dev = NULL;
    TEST_OK(gpt_create(&host, &config, gpu, dtype, B, T, 1));
    TEST_OK(gpt_create(&dev, &config, gpu, dtype, B, T, 1));
    uint64_t seed = gpc_rng_u32(&rng);
    TEST_OK(gpt_init_weights(host, seed));
    TEST_OK(gpt_init_weights(dev, seed));
    gpc_loader *l;
    gpc_prefetch *p;
    TEST_OK(gpc_loader_open(&l, data_dir, GPC_SPLIT_TRAIN, B, T, seed, 0, 1));
    TEST_OK(gpc_prefetch_open(&p, data_dir, GPC_SPLIT_TRAIN, B, T, seed, 0, 1, gpu, 0));
    int32_t in[B * T], tg[B * T];
    int bitwise = 0;
    const int steps = 8, accumulation = 2;
    for (int step = 1; step <= steps; step++) {
        TEST_OK(gpt_zero_grad(host));
        TEST_OK(gpt_zero_grad(dev));
        for (int micro = 0; micro < accumulation; micro++) {
            gpc_batch batch;
            float dloss = 1.0f / (float)(accumulation * B * T);
            TEST_OK(gpc_loader_next(l, in, tg));
            TEST_OK(gpt_forward_backward(host, in, tg, B, T, dloss));
            TEST_OK(gpc_prefetch_next(p, &batch));
            TEST_OK(gpt_forward_backward_device(dev, &batch.inputs, &batch.targets, batch.unmasked,
                                                dloss));
        }
        gpc_optim_options o;
        gpc_optim_defaults(&o);
        o.learning_rate = 3e-3f;
        o.step = step;
        o.seed = (uint32_t)step;
        TEST_OK(gpt_update(host, &o, NULL, NULL));
        TEST_OK(gpt_update(dev, &o, NULL, NULL));
        float la, lb, na, nb;
        TEST_OK(gpt_read_step(host, &la, &na));
        TEST_OK(gpt_read_step(dev, &lb, &nb));
        bitwise += la == lb && na == nb;
        if (!(fabsf(la - lb) <= 1e-6f * fabsf(la)) || !(fabsf(na - nb) <= 1e-6f * fabsf(na)))
            fail_msg("%s step %d: loss %.9g, norm %.9g on uploaded tokens; %.9g, %.9g on "
                     "prefetched ones",
                     gpc_dtype_name(dtype), step, la, na, lb, nb);
    }
    fprintf(stderr, "%s: %d of %d steps bitwise equal\n", gpc_dtype_name(dtype), bitwise, steps);
    size_t P = gpt_num_params(host);
    float *wa = malloc(P * sizeof *wa), *wb = malloc(P * sizeof *wb);
    TEST_OK(gpt_get_params(host, wa));
    TEST_OK(gpt_get_params(dev, wb));
    test_assert_close_f32("weights after training on prefetched batches", wb, wa, P, 1e-5, 1e-3);
    free(wa);
    free(wb);
    gpc_prefetch_close(p);
    gpc_loader_close(l);
    gpt_free(host);
    gpt_free(dev);
}

static void test_training_f32(void **state) {
    (void)state;
    check_training(GPC_F32);
}

static void test_training_bf16(void **state) {
    (void)state;
    check_training(GPC_BF16);
}

/* ------------------------------------------------- fp16's overflow check */

/* Two fp16 models from a scale that overflows for several steps: one reads
 * the verdict inside gpt_update (a wait), the other leaves it to the AdamW
 * kernel and gpt_read_step. Same skips, same scales, same weights. */
static void test_f16_check_on_device(void **state) {
    (void)state;
    gpt_config config;
    TEST_OK(gpt_config_init(&config, 1, 2, 128, T, V));
    gpt_model *now = NULL, *later = NULL;
    TEST_OK(gpt_create(&now, &config, gpu, GPC_F16, B, T, 1));
    TEST_OK(gpt_create(&later, &config, gpu, GPC_F16, B, T, 1));
    uint64_t seed = gpc_rng_u32(&rng);
    TEST_OK(gpt_init_weights(now, seed));
    TEST_OK(gpt_init_weights(later, seed));
    size_t P = gpt_num_params(now);
    float *before = malloc(P * sizeof *before), *after = malloc(P * sizeof *after);
    /* the target's dlogit is about -scale / (B*T): 1e8 / 128 and the
     * gradients made from it overflow fp16 (65504) until the scale has
     * halved several times */
    gpt_set_loss_scale(now, 1e8f);
    gpt_set_loss_scale(later, 1e8f);
    gpc_loader *l;
    TEST_OK(gpc_loader_open(&l, data_dir, GPC_SPLIT_TRAIN, B, T, seed, 0, 1));
    int32_t in[B * T], tg[B * T];
    int skips = 0, clean = 0;
    for (int step = 1; step <= 16; step++) {
        TEST_OK(gpc_loader_next(l, in, tg));
        TEST_OK(gpt_get_params(later, before));
        TEST_OK(gpt_zero_grad(now));
        TEST_OK(gpt_zero_grad(later));
        TEST_OK(gpt_forward_backward(now, in, tg, B, T, 1.0f / (B * T)));
        TEST_OK(gpt_forward_backward(later, in, tg, B, T, 1.0f / (B * T)));
        gpc_optim_options o;
        gpc_optim_defaults(&o);
        o.learning_rate = 1e-3f;
        o.step = step;
        o.seed = (uint32_t)step;
        int skipped = -1;
        float norm_now = 0, norm_later = 0, loss_now, loss_later;
        TEST_OK(gpt_update(now, &o, &norm_now, &skipped));
        TEST_OK(gpt_read_step(now, &loss_now, NULL));
        TEST_OK(gpt_update(later, &o, NULL, NULL));
        assert_true(gpc_optim_check_pending(gpt_optimizer(later)));
        TEST_OK(gpt_read_step(later, &loss_later, &norm_later));
        assert_false(gpc_optim_check_pending(gpt_optimizer(later)));
        /* equal verdicts every step: equal counts of clean steps too */
        if (gpt_step_skipped(later) != skipped || gpt_loss_scale(later) != gpt_loss_scale(now))
            fail_msg("step %d: skipped %d / %d, scale %g / %g", step, skipped,
                     gpt_step_skipped(later), gpt_loss_scale(now), gpt_loss_scale(later));
        assert_true(loss_now == loss_later);
        if (skipped) {
            assert_true(isnan(norm_now) && isnan(norm_later));
            TEST_OK(gpt_get_params(later, after));
            assert_memory_equal(before, after, P * sizeof *after);
        } else {
            assert_true(norm_now == norm_later && isfinite(norm_now) && norm_now > 0);
        }
        skips += skipped;
        clean += !skipped;
    }
    fprintf(stderr, "fp16: %d steps skipped, %d clean\n", skips, clean);
    assert_true(skips >= 3 && clean >= 3);
    TEST_OK(gpt_get_params(now, before));
    TEST_OK(gpt_get_params(later, after));
    assert_memory_equal(before, after, P * sizeof *after);

    /* a verdict nobody read is read before the scale is used again */
    gpt_set_loss_scale(later, 1e9f);
    TEST_OK(gpt_zero_grad(later));
    TEST_OK(gpt_forward_backward(later, in, tg, B, T, 1.0f / (B * T)));
    gpc_optim_options o;
    gpc_optim_defaults(&o);
    TEST_OK(gpt_update(later, &o, NULL, NULL));
    assert_true(gpt_loss_scale(later) == 1e9f && gpc_optim_check_pending(gpt_optimizer(later)));
    TEST_OK(gpt_forward_backward(later, in, tg, B, T, 1.0f / (B * T)));
    assert_true(gpt_loss_scale(later) == 5e8f && gpt_step_skipped(later) &&
                !gpc_optim_check_pending(gpt_optimizer(later)));
    free(before);
    free(after);
    gpc_loader_close(l);
    gpt_free(now);
    gpt_free(later);
}

/* ------------------------------------------------- the trainer, resumed */

typedef struct {
    float loss[32];
    int steps, stop_at;
    int gpu_clocked; /* steps whose event carried an SM clock above zero */
    int pace;        /* wait 150 ms after each step */
} record;

static void on_event(void *user, const gpc_train_event *e) {
    record *r = user;
    if (e->kind != GPC_TRAIN_STEP) return;
    assert_true(e->step >= 1 && e->step < 32);
    r->loss[e->step] = e->loss;
    r->gpu_clocked += e->gpu_sm_clock_mhz > 0;
    r->steps++;
    if (r->stop_at && e->step == r->stop_at) gpc_train_request_stop();
    /* a run paced to a step each 150 ms lasts long enough (1.8 s) for the
     * trainer to take energy readings a second apart */
    if (r->pace) nanosleep(&(struct timespec){0, 150 * 1000 * 1000}, NULL);
}

static void options(gpc_train_options *o, const char *out, record *r) {
    gpc_train_options_init(o);
    o->data_dir = data_dir;
    o->out_dir = out;
    o->device = gpu; /* bf16, the GPU's default */
    o->layers = 2;
    o->heads = 2;
    o->channels = 128;
    o->context = T;
    o->batch = B;
    o->total_batch = 2 * B * T; /* two micro-steps */
    o->steps = 12;
    o->lr = 3e-3;
    o->eval_every = 4;
    o->eval_batches = 4;
    o->callback = on_event;
    o->user = r;
}

/* The number after "key": in a metrics line, or NAN when the key is absent. */
static double metrics_value(const char *line, const char *key) {
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\":", key);
    const char *at = strstr(line, quoted);
    return at ? strtod(at + strlen(quoted), NULL) : NAN;
}

/* The lines of RUN/metrics.jsonl that the trainer read the GPU for hold its
 * SM clock and power, both above zero, and whether the power limit held the
 * clock (0 or 1), and the others none of the three. This run's steps are
 * milliseconds, so it reads the first, then once per half second, and the
 * last. The result agrees. Only where NVML answers here, as the trainer's
 * reads it. */
static void check_gpu_readings(const char *run, const gpc_train_result *result, const record *r) {
    gpc_nvml *nvml;
    if (gpc_nvml_open(&nvml) != GPC_OK) {
        fprintf(stderr, "GPU readings not checked: %s\n", gpc_last_error());
        return;
    }
    int counter = 0; /* the driver keeps an energy counter */
    for (int i = 0; i < gpc_nvml_device_count(nvml); i++) {
        gpc_nvml_power p;
        counter |= gpc_nvml_sample_power(nvml, i, &p) == GPC_OK && p.energy_j >= 0;
    }
    gpc_nvml_close(nvml);
    char path[4300];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    char *text;
    size_t size;
    TEST_OK(gpc_read_file(path, &text, &size));
    int lines = 0, read = 0, first_read = 0, last_read = 0, energies = 0, first_step = -1,
        last_energy_step = -1;
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        assert_non_null(end);
        *end = '\0';
        double clock = metrics_value(line, "gpu_sm_clock_mhz");
        double power = metrics_value(line, "gpu_power_w");
        double capped = metrics_value(line, "gpu_power_capped");
        int any = !isnan(clock) || !isnan(power) || !isnan(capped);
        if (any && !(clock > 0 && power > 0 && (capped == 0 || capped == 1)))
            fail_msg("metrics line %d has part of the GPU's readings: %s", lines + 1, line);
        /* the energy a step: only on read lines after the first read, above
         * zero, and in joules (a paced step of 0.15 s cannot take 500 J) */
        double energy = metrics_value(line, "gpu_step_energy_j");
        if (!isnan(energy)) {
            if (!any || read == 0 || !(energy > 0 && energy < 500))
                fail_msg("metrics line %d has a wrong step energy: %s", lines + 1, line);
            energies++;
            last_energy_step = lines + 1;
        }
        lines++;
        if (any && first_step < 0) first_step = lines;
        read += any;
        if (lines == 1) first_read = any;
        last_read = any;
        line = end + 1;
    }
    gpc_free(text);
    assert_int_equal(lines, 12);
    assert_true(first_read && last_read && read >= 2);
    assert_int_equal(r->gpu_clocked, read);
    assert_int_equal(result->gpu_steps_sampled, read);
    assert_true(result->gpu_steps_power_capped >= 0 && result->gpu_steps_power_capped <= read);
    assert_true(result->gpu_sm_clock_median_mhz > 0);
    if (result->gpu_sm_clock_max_mhz > 0)
        assert_true(result->gpu_sm_clock_median_mhz <= result->gpu_sm_clock_max_mhz);
    fprintf(stderr,
            "GPU readings: %d steps, %d at the power limit (%.0f W), SM clock median %d of %d "
            "MHz\n",
            result->gpu_steps_sampled, result->gpu_steps_power_capped, result->gpu_power_limit_w,
            result->gpu_sm_clock_median_mhz, result->gpu_sm_clock_max_mhz);
    /* the energy from the first reading to the last that gave a step's, and
     * the tokens between: the paced run lasts 1.8 s, so there is one where
     * the driver has an energy counter (Volta and later) */
    if (!counter) {
        fprintf(stderr, "energy not checked: this GPU's driver gives no energy counter\n");
        return;
    }
    assert_true(energies >= 1);
    assert_true(result->gpu_energy_j > 0);
    assert_int_equal(result->gpu_energy_steps, last_energy_step - first_step);
    assert_true(result->gpu_energy_tokens == (int64_t)result->gpu_energy_steps * 2 * B * T);
    char energy_line[256];
    assert_int_equal(gpc_train_energy_summary(result, energy_line, sizeof energy_line), 1);
    fprintf(stderr, "%d step energies; %s\n", energies, energy_line);
}

static void test_trainer_resume_exact(void **state) {
    (void)state;
    char full_dir[4200], part_dir[4200];
    snprintf(full_dir, sizeof full_dir, "%s/full", root);
    snprintf(part_dir, sizeof part_dir, "%s/part", root);
    gpc_train_options o;
    record full, part, resumed;
    memset(&full, 0, sizeof full);
    memset(&part, 0, sizeof part);
    memset(&resumed, 0, sizeof resumed);
    options(&o, full_dir, &full);
    full.pace = 1;
    gpc_train_result result;
    TEST_OK(gpc_train(&o, &result));
    assert_int_equal(full.steps, 12);
    check_gpu_readings(full_dir, &result, &full);
    options(&o, part_dir, &part);
    part.stop_at = 5;
    TEST_FAILS(gpc_train(&o, NULL), GPC_ERR_INTERRUPTED, "checkpoint saved at step 5");
    gpc_train_clear_stop();
    options(&o, part_dir, &resumed);
    o.resume = 1;
    TEST_OK(gpc_train(&o, NULL));
    assert_int_equal(resumed.steps, 7);
    for (int s = 1; s <= 5; s++)
        if (part.loss[s] != full.loss[s])
            fail_msg("step %d: %.9g, uninterrupted %.9g", s, part.loss[s], full.loss[s]);
    for (int s = 6; s <= 12; s++)
        if (resumed.loss[s] != full.loss[s])
            fail_msg("step %d: resumed loss %.9g, uninterrupted %.9g", s, resumed.loss[s],
                     full.loss[s]);
}

/* --offload-optimizer on a model whose pinned state (16 bytes a parameter:
 * master, moments, staged gradients and weights; fresh weights are drawn
 * in it) is more than the host has free: refused before anything is
 * allocated or written, where it used to be killed by the OOM killer while
 * it pinned. */
static void test_offload_beyond_host_memory(void **state) {
    (void)state;
    size_t avail = gpc_host_memory_available();
    if (avail == 0) {
        fprintf(stderr, "offload refusal not checked: free host memory unknown\n");
        return;
    }
    char out[4200];
    snprintf(out, sizeof out, "%s/offload-huge", root);
    gpc_train_options o;
    record r;
    memset(&r, 0, sizeof r);
    options(&o, out, &r);
    o.offload_optimizer = 1;
    o.heads = 32;
    o.channels = 2048; /* 12 x 2048^2 = 50M parameters a layer, 0.8 GB pinned */
    /* 8 layers (6.4 GB) beyond what is free: the margin keeps the case
     * refused while other processes free memory, rather than pinning it */
    o.layers = (int)(avail / (16.0 * 12 * 2048 * 2048)) + 8;
    TEST_FAILS(gpc_train(&o, NULL), GPC_ERR_NOMEM, "more than this machine has free");
    assert_non_null(strstr(gpc_last_error(), "pinned for the optimizer state"));
    assert_false(gpc_path_exists(out));
    gpc_clear_error();
}

int main(void) {
    if (!gpc_backend_get(GPC_DEVICE_CUDA)) {
        fprintf(stderr, "skipped: %s\n", gpc_last_error());
        return 77;
    }
    gpc_rng_seed(&rng, test_seed(), 43);
    unsetenv("GPC_ATTENTION_BWD");
    if (gpc_op_set_attention_path("gpc") != GPC_OK) {
        fprintf(stderr, "%s\n", gpc_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batches_arrive_in_order),
        cmocka_unit_test(test_training_f32),
        cmocka_unit_test(test_training_bf16),
        cmocka_unit_test(test_f16_check_on_device),
        cmocka_unit_test(test_trainer_resume_exact),
        cmocka_unit_test(test_offload_beyond_host_memory),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
