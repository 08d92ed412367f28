/* test_trainer.c: the training loop on synthetic data: the loss falls on a
 * learnable pattern, a resumed run repeats an uninterrupted one bit for bit,
 * gradient accumulation equals a larger micro-batch, the learning-rate
 * schedule follows its formula, the run folder holds what it should, and
 * every bad setting is refused with its message, and a run with the
 * optimizer offloaded repeats the plain one bit for bit, resuming either way. A run on the CPU has
 * no GPU readings, and the closing remark on the GPU's power limit appears exactly when the counts
 * call for it. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/data.h"
#include "gpc/model.h"
#include "gpc/train.h"

enum { V = 32, PERIOD = 11, MAX_STEPS = 64 };

static char *root;
static char data_dir[4096];

/* A dataset whose every shard repeats one sequence of PERIOD distinct
 * tokens: the next token is a function of the current one, so a model that
 * learns brings the loss from ln(32) = 3.47 towards zero. */
static int setup(void **state) {
    (void)state;
    root = test_tmpdir("trainer");
    snprintf(data_dir, sizeof data_dir, "%s/data", root);
    if (gpc_data_synth(data_dir, V, 40000, 7, 1 << 14) != GPC_OK) {
        fprintf(stderr, "synth: %s\n", gpc_last_error());
        return -1;
    }
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 31);
    uint32_t pattern[V];
    for (uint32_t i = 0; i < V; i++)
        pattern[i] = i;
    for (uint32_t i = V - 1; i > 0; i--) { /* a random arrangement */
        uint32_t j = gpc_rng_below(&rng, i + 1), tmp = pattern[i];
        pattern[i] = pattern[j], pattern[j] = tmp;
    }
    for (int split = 0; split < 2; split++)
        for (int i = 0;; i++) {
            char path[4200];
            snprintf(path, sizeof path, "%s/%s_%04d.bin", data_dir, split ? "val" : "train", i);
            gpc_shard_info info;
            if (!gpc_path_exists(path)) break;
            if (gpc_shard_info_read(path, &info) != GPC_OK) return -1;
            uint32_t *tokens = malloc(info.tokens * sizeof *tokens);
            for (uint64_t k = 0; k < info.tokens; k++)
                tokens[k] = pattern[k % PERIOD];
            gpc_status s = gpc_shard_write(path, tokens, info.tokens, V);
            free(tokens);
            if (s != GPC_OK) return -1;
        }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    test_rmtree(root);
    gpc_free(root);
    return 0;
}

static const char *run_dir(const char *name) {
    static char paths[4][4096];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, 4096, "%s/%s", root, name);
    return p;
}

/* What the callback saw. */
typedef struct {
    int steps;
    float loss[MAX_STEPS + 1];
    float lr[MAX_STEPS + 1];
    float val_loss[MAX_STEPS + 1];
    int evals, checkpoints, starts;
    int gpu_readings; /* STEP events that carried any GPU reading */
    gpc_train_event start;
    int stop_at; /* request a stop after this step (0: never) */
} record;

static void on_event(void *user, const gpc_train_event *e) {
    record *r = user;
    switch (e->kind) {
    case GPC_TRAIN_START:
        r->starts++;
        r->start = *e;
        break;
    case GPC_TRAIN_STEP:
        assert_true(e->step >= 1 && e->step <= MAX_STEPS);
        r->loss[e->step] = e->loss;
        r->lr[e->step] = e->lr;
        r->val_loss[e->step] = e->val_loss;
        r->gpu_readings += !isnan(e->gpu_power_w) || !isnan(e->gpu_power_limit_w) ||
                           e->gpu_sm_clock_mhz != -1 || e->gpu_sm_clock_max_mhz != -1 ||
                           e->gpu_power_capped != -1;
        r->steps++;
        if (r->stop_at && e->step == r->stop_at) gpc_train_request_stop();
        break;
    case GPC_TRAIN_EVAL:
        r->evals++;
        break;
    case GPC_TRAIN_CHECKPOINT:
        r->checkpoints++;
        break;
    }
}

static void tiny_options(gpc_train_options *o, const char *out, record *r) {
    gpc_train_options_init(o);
    o->data_dir = data_dir;
    o->out_dir = out;
    o->layers = 2;
    o->heads = 2;
    o->channels = 32;
    o->context = 16;
    o->batch = 4;
    o->steps = 30;
    o->lr = 1e-2;
    o->eval_every = 10;
    o->eval_batches = 4;
    o->checkpoint_every = -1;
    o->callback = on_event;
    o->user = r;
    memset(r, 0, sizeof *r);
}

static int count_lines(const char *path, const char *needle) {
    char *text;
    size_t size;
    TEST_OK(gpc_read_file(path, &text, &size));
    int n = 0;
    for (char *line = text; line && *line;) {
        char *end = strchr(line, '\n');
        if (end) *end = '\0';
        if (!needle || strstr(line, needle)) n++;
        line = end ? end + 1 : NULL;
    }
    gpc_free(text);
    return n;
}

static void test_loss_falls(void **state) {
    (void)state;
    gpc_train_options o;
    record r;
    const char *out = run_dir("falls");
    tiny_options(&o, out, &r);
    gpc_train_result result;
    TEST_OK(gpc_train(&o, &result));
    assert_int_equal(r.starts, 1);
    assert_int_equal(r.steps, 30);
    assert_int_equal(result.steps_done, 30);
    /* the header: sizes as configured, parameter count as the config says */
    gpt_config c;
    TEST_OK(gpt_config_init(&c, 2, 2, 32, 16, V));
    assert_int_equal(r.start.parameters, gpt_config_num_params(&c));
    assert_int_equal(r.start.tokens_per_step, 4 * 16);
    assert_int_equal(r.start.accumulation_steps, 1);
    assert_int_equal(r.start.warmup, 3); /* 10% of 30 steps */
    assert_int_equal(r.start.precision, GPC_F32);
    /* the first loss is that of a near-uniform guess; the last ones far lower */
    assert_true(fabs(r.loss[1] - log(V)) < 0.3);
    double tail = (r.loss[26] + r.loss[27] + r.loss[28] + r.loss[29] + r.loss[30]) / 5;
    if (!(tail < 0.35 * r.loss[1]))
        fail_msg("loss did not fall enough: %.4f at step 1, %.4f over the last five", r.loss[1],
                 tail);
    /* validation at steps 10, 20, 30, and it agrees with the training loss
     * on this stationary pattern */
    assert_int_equal(r.evals, 3);
    assert_true(isnan(r.val_loss[5]) && !isnan(r.val_loss[30]));
    assert_true(fabs(r.val_loss[30] - r.loss[30]) < 0.2);
    assert_true(fabs(result.last_val_loss - r.val_loss[30]) == 0);
    /* learning rates reported are the schedule's */
    gpc_lr_schedule sch = {1e-2, 0.1, 3, 30};
    for (int s = 1; s <= 30; s++)
        assert_true(r.lr[s] == (float)gpc_lr_at(&sch, s - 1));
    /* the run folder */
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    assert_int_equal(count_lines(path, NULL), 30);
    assert_int_equal(count_lines(path, "\"val_loss\":"), 3);
    assert_int_equal(count_lines(path, "{\"step\":17,\"loss\":"), 1);
    snprintf(path, sizeof path, "%s/config.txt", out);
    assert_int_equal(count_lines(path, "layers=2"), 1);
    snprintf(path, sizeof path, "%s/checkpoint.bin", out);
    gpt_checkpoint_state st;
    TEST_OK(gpt_checkpoint_read_header(path, NULL, NULL, &st));
    assert_int_equal(st.step, 30);
    assert_int_equal(r.checkpoints, 1); /* only at the end */
    snprintf(path, sizeof path, "%s/tokenizer.bin", out);
    assert_false(gpc_path_exists(path)); /* synthetic data has none */
    /* the CPU has no GPU readings: unknown in events and result, absent from
     * the metrics, and no remark on power */
    assert_int_equal(r.gpu_readings, 0);
    assert_true(isnan(r.start.gpu_power_w) && r.start.gpu_power_capped == -1);
    assert_int_equal(result.gpu_steps_sampled, 0);
    assert_int_equal(result.gpu_steps_power_capped, 0);
    assert_int_equal(result.gpu_sm_clock_median_mhz, -1);
    assert_int_equal(result.gpu_sm_clock_max_mhz, -1);
    assert_true(isnan(result.gpu_power_limit_w));
    assert_true(result.gpu_energy_j == 0 && result.gpu_energy_steps == 0);
    assert_true(isnan(r.start.gpu_step_energy_j));
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    assert_int_equal(count_lines(path, "\"gpu_"), 0);
    char line[256] = "x";
    assert_int_equal(gpc_train_power_summary(&result, line, sizeof line), 0);
    assert_string_equal(line, "");
    strcpy(line, "x");
    assert_int_equal(gpc_train_energy_summary(&result, line, sizeof line), 0);
    assert_string_equal(line, "");
}

/* A result as a GPU run would leave it. */
static gpc_train_result gpu_result(int sampled, int capped, int median, int max, double limit) {
    gpc_train_result r;
    memset(&r, 0, sizeof r);
    r.last_val_loss = NAN;
    r.gpu_steps_sampled = sampled;
    r.gpu_steps_power_capped = capped;
    r.gpu_sm_clock_median_mhz = median;
    r.gpu_sm_clock_max_mhz = max;
    r.gpu_power_limit_w = limit;
    return r;
}

/* A result with energy readings as a GPU run would leave it. */
static gpc_train_result energy_result(double joules, int steps, int64_t tokens) {
    gpc_train_result r = gpu_result(0, 0, -1, -1, NAN);
    r.gpu_energy_j = joules;
    r.gpu_energy_steps = steps;
    r.gpu_energy_tokens = tokens;
    return r;
}

static void test_energy_summary(void **state) {
    (void)state;
    char line[256];
    /* GPT-2 124M's 524,288-token step on an H200: about 600 J */
    gpc_train_result r = energy_result(5995.0, 10, 5242880);
    assert_int_equal(gpc_train_energy_summary(&r, line, sizeof line), 1);
    assert_string_equal(line,
                        "the GPU used 6 kJ over 10 steps: 600 J a step, 875 tokens per joule");
    r = energy_result(4750.0, 10, 52428800);
    assert_int_equal(gpc_train_energy_summary(&r, line, sizeof line), 1);
    assert_string_equal(line, "the GPU used 4.75 kJ over 10 steps: 475 J a step, 11,038 tokens "
                              "per joule");
    /* one step, joules below a kilojoule, megajoules, millions of tokens */
    r = energy_result(12.5, 1, 4096);
    assert_int_equal(gpc_train_energy_summary(&r, line, sizeof line), 1);
    assert_string_equal(line, "the GPU used 12.5 J over 1 step: 12.5 J a step, 328 tokens per "
                              "joule");
    r = energy_result(2.5e6, 5000, (int64_t)5000 * 524288);
    assert_int_equal(gpc_train_energy_summary(&r, line, sizeof line), 1);
    assert_string_equal(line, "the GPU used 2.5 MJ over 5000 steps: 500 J a step, 1,049 tokens "
                              "per joule");
    r = energy_result(0.5, 2, (int64_t)2 * 1000000);
    assert_int_equal(gpc_train_energy_summary(&r, line, sizeof line), 1);
    assert_non_null(strstr(line, ": 0.25 J a step, 4,000,000 tokens per joule"));
    /* nothing to say: no counter, no steps between readings, no tokens */
    const gpc_train_result quiet[] = {energy_result(0, 0, 0),      energy_result(100.0, 0, 0),
                                      energy_result(0, 3, 3000),   energy_result(100.0, 3, 0),
                                      energy_result(NAN, 3, 3000), energy_result(-5.0, 3, 3000)};
    for (size_t i = 0; i < sizeof quiet / sizeof quiet[0]; i++) {
        strcpy(line, "x");
        if (gpc_train_energy_summary(&quiet[i], line, sizeof line) != 0 || line[0] != '\0')
            fail_msg("case %zu gave '%s'", i, line);
    }
    /* a short buffer is cut, not overrun */
    char small[16];
    memset(small, 'z', sizeof small);
    r = energy_result(4750.0, 10, 52428800);
    assert_int_equal(gpc_train_energy_summary(&r, small, 9), 1);
    assert_string_equal(small, "the GPU ");
    assert_int_equal(small[9], 'z');
}

/* The energy meter: differences a second or more apart, once the counter
 * has moved, per step. */
static void test_energy_meter(void **state) {
    (void)state;
    gpc_energy_meter m;
    gpc_energy_meter_init(&m);
    int steps = -1;
    assert_true(gpc_energy_meter_total(&m, &steps) == 0 && steps == 0);
    assert_true(isnan(gpc_energy_meter_read(&m, 0, 10.0, 1000.0))); /* the base */
    assert_true(isnan(gpc_energy_meter_read(&m, 1, 10.4, 1250.0))); /* too soon */
    assert_true(isnan(gpc_energy_meter_read(&m, 2, 10.9, 1500.0)));
    /* 1.1 s and 4 steps on: (2200 - 1000) / 4 */
    assert_true(gpc_energy_meter_read(&m, 4, 11.1, 2200.0) == 300.0);
    assert_true(gpc_energy_meter_total(&m, &steps) == 1200.0 && steps == 4);
    /* a counter the driver has not updated yet: no figure, the base stays */
    assert_true(isnan(gpc_energy_meter_read(&m, 6, 12.5, 2200.0)));
    assert_true(gpc_energy_meter_read(&m, 8, 12.6, 3400.0) == 300.0);
    assert_true(gpc_energy_meter_total(&m, &steps) == 2400.0 && steps == 8);
    /* a reading in the same step, or no counter, changes nothing */
    assert_true(isnan(gpc_energy_meter_read(&m, 8, 14.0, 3900.0)));
    assert_true(isnan(gpc_energy_meter_read(&m, 9, 14.0, -1.0)));
    assert_true(isnan(gpc_energy_meter_read(&m, 9, 14.0, NAN)));
    assert_true(gpc_energy_meter_read(&m, 9, 14.0, 3700.0) == 300.0);
    /* a counter that went back starts over, never a negative energy */
    assert_true(isnan(gpc_energy_meter_read(&m, 12, 16.0, 50.0)));
    assert_true(gpc_energy_meter_total(&m, &steps) == 0 && steps == 0);
    assert_true(gpc_energy_meter_read(&m, 14, 17.0, 650.0) == 300.0);
    assert_true(gpc_energy_meter_total(&m, &steps) == 600.0 && steps == 2);
}

static void test_power_summary(void **state) {
    (void)state;
    char line[256];
    /* the H200 case that motivated it */
    gpc_train_result r = gpu_result(200, 190, 1620, 1980, 700.0);
    assert_int_equal(gpc_train_power_summary(&r, line, sizeof line), 1);
    assert_string_equal(line, "the GPU was at its power limit (700 W) in 95% of 200 steps read, SM "
                              "clock median 1620 of 1980 MHz: power, not kernel speed, bounds "
                              "the step");
    /* exactly half is enough; the percentage rounds down, never up to 100 */
    r = gpu_result(10, 5, 1700, 1980, 700.0);
    assert_int_equal(gpc_train_power_summary(&r, line, sizeof line), 1);
    assert_non_null(strstr(line, " in 50% of 10 steps read"));
    r = gpu_result(200, 199, 1600, 1980, 699.5);
    assert_int_equal(gpc_train_power_summary(&r, line, sizeof line), 1);
    assert_non_null(strstr(line, "(700 W) in 99% of 200 steps read"));
    /* readings NVML did not give are left out of the line */
    r = gpu_result(4, 4, 1500, -1, NAN);
    assert_int_equal(gpc_train_power_summary(&r, line, sizeof line), 1);
    assert_string_equal(line, "the GPU was at its power limit in 100% of 4 steps read, SM clock "
                              "median 1500 MHz: power, not kernel speed, bounds the step");
    r = gpu_result(3, 2, -1, 1980, 700.0);
    assert_int_equal(gpc_train_power_summary(&r, line, sizeof line), 1);
    assert_string_equal(line,
                        "the GPU was at its power limit (700 W) in 66% of 3 steps read: power, "
                        "not kernel speed, bounds the step");
    /* no remark: under half the steps capped, too few steps, no GPU, or
     * counts that cannot be */
    const gpc_train_result quiet[] = {
        gpu_result(10, 4, 1980, 1980, 700.0), gpu_result(2, 2, 1600, 1980, 700.0),
        gpu_result(0, 0, -1, -1, NAN),        gpu_result(5, 6, 1600, 1980, 700.0),
        gpu_result(5, -1, 1600, 1980, 700.0),
    };
    for (size_t i = 0; i < sizeof quiet / sizeof quiet[0]; i++) {
        strcpy(line, "x");
        if (gpc_train_power_summary(&quiet[i], line, sizeof line) != 0 || line[0] != '\0')
            fail_msg("case %zu: %d of %d steps capped gave '%s'", i,
                     quiet[i].gpu_steps_power_capped, quiet[i].gpu_steps_sampled, line);
    }
    /* a short buffer is cut, not overrun */
    char small[16];
    memset(small, 'z', sizeof small);
    r = gpu_result(200, 190, 1620, 1980, 700.0);
    assert_int_equal(gpc_train_power_summary(&r, small, 12), 1);
    assert_string_equal(small, "the GPU was");
    assert_int_equal(small[12], 'z');
}

/* An interrupted run resumed from its checkpoint repeats the uninterrupted
 * one exactly: same losses bit for bit, same final checkpoint file. */
static void test_resume_exact(void **state) {
    (void)state;
    gpc_train_options o;
    record full, part;
    tiny_options(&o, run_dir("full"), &full);
    o.steps = 12;
    o.batch = 2;
    o.total_batch = 2 * 2 * 16; /* accumulation of 2 */
    o.eval_every = 4;
    TEST_OK(gpc_train(&o, NULL));
    assert_int_equal(full.steps, 12);

    tiny_options(&o, run_dir("part"), &part);
    o.steps = 12;
    o.batch = 2;
    o.total_batch = 2 * 2 * 16;
    o.eval_every = 4;
    part.stop_at = 5;
    TEST_FAILS(gpc_train(&o, NULL), GPC_ERR_INTERRUPTED,
               "checkpoint saved at step 5; resume with --resume");
    gpc_train_clear_stop();
    assert_int_equal(part.steps, 5);

    /* lines past the checkpoint, as a run killed long after its last save
     * leaves them: 200,000 of them, one that is no record and one cut off
     * mid-write; the resume keeps the five before the checkpoint, byte for
     * byte, and drops the rest (in well under a second: the file is read
     * once, not once a line) */
    char metrics[4200];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run_dir("part"));
    char *kept;
    size_t kept_size;
    TEST_OK(gpc_read_file(metrics, &kept, &kept_size));
    FILE *f = fopen(metrics, "a");
    assert_non_null(f);
    for (int s = 6; s < 6 + 200000; s++) /* about 20 MB, as long as the real lines */
        fprintf(f,
                "{\"step\":%d,\"loss\":1.5,\"lr\":0.001,\"grad_norm\":0.25,"
                "\"tokens_per_s\":250000,\"ms\":1,\"memory\":182124544,\"tokens\":%d}\n",
                s, 256 * s);
    fprintf(f, "not a record\n{\"step\":3");
    assert_int_equal(fclose(f), 0);

    /* resume with only the folders given: every other setting comes from the checkpoint */
    record resumed;
    gpc_train_options_init(&o);
    memset(&resumed, 0, sizeof resumed);
    o.data_dir = data_dir;
    o.out_dir = run_dir("part");
    o.resume = 1;
    o.eval_every = 4;
    o.eval_batches = 4;
    o.checkpoint_every = -1;
    o.callback = on_event;
    o.user = &resumed;
    TEST_OK(gpc_train(&o, NULL));
    assert_int_equal(resumed.start.first_step, 5);
    assert_int_equal(resumed.steps, 7);
    for (int s = 1; s <= 5; s++)
        assert_true(part.loss[s] == full.loss[s]);
    for (int s = 6; s <= 12; s++)
        if (resumed.loss[s] != full.loss[s])
            fail_msg("step %d: resumed loss %.9g, uninterrupted %.9g", s, resumed.loss[s],
                     full.loss[s]);
    char a[4200], b[4200];
    snprintf(a, sizeof a, "%s/checkpoint.bin", run_dir("full"));
    snprintf(b, sizeof b, "%s/checkpoint.bin", run_dir("part"));
    char *ta, *tb;
    size_t na, nb;
    TEST_OK(gpc_read_file(a, &ta, &na));
    TEST_OK(gpc_read_file(b, &tb, &nb));
    assert_int_equal(na, nb);
    assert_memory_equal(ta, tb, na);
    gpc_free(ta), gpc_free(tb);
    /* metrics.jsonl has each step once, the first five as they were */
    snprintf(b, sizeof b, "%s/metrics.jsonl", run_dir("part"));
    assert_int_equal(count_lines(b, NULL), 12);
    TEST_OK(gpc_read_file(b, &tb, &nb));
    assert_true(nb > kept_size);
    assert_memory_equal(tb, kept, kept_size);
    assert_memory_equal(tb + kept_size, "{\"step\":6,", 10);
    gpc_free(tb), gpc_free(kept);
    assert_int_equal(count_lines(b, "{\"step\":5,"), 1);
    assert_int_equal(count_lines(b, "{\"step\":6,"), 1);
    snprintf(b, sizeof b, "%s/checkpoint.prev.bin", run_dir("part"));
    assert_true(gpc_path_exists(b));
}

/* Two micro-batches of B accumulate to the gradient of one micro-batch of
 * 2B; and the trainer with accumulation 2 follows the trainer with the
 * doubled micro-batch. */
static void test_accumulation(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 32);
    gpt_config c;
    TEST_OK(gpt_config_init(&c, 2, 2, 32, 16, V));
    gpt_model *big = NULL, *small = NULL;
    TEST_OK(gpt_create(&big, &c, gpc_cpu(), GPC_F32, 4, 16, 1));
    TEST_OK(gpt_create(&small, &c, gpc_cpu(), GPC_F32, 2, 16, 1));
    uint64_t seed = gpc_rng_u32(&rng);
    TEST_OK(gpt_init_weights(big, seed));
    TEST_OK(gpt_init_weights(small, seed));
    int32_t tok[64], tgt[64];
    for (int i = 0; i < 64; i++) {
        tok[i] = (int32_t)gpc_rng_below(&rng, V);
        tgt[i] = (int32_t)gpc_rng_below(&rng, V);
    }
    TEST_OK(gpt_zero_grad(big));
    TEST_OK(gpt_forward_backward(big, tok, tgt, 4, 16, 1.0f / 64));
    TEST_OK(gpt_zero_grad(small));
    TEST_OK(gpt_forward_backward(small, tok, tgt, 2, 16, 1.0f / 64));
    TEST_OK(gpt_forward_backward(small, tok + 32, tgt + 32, 2, 16, 1.0f / 64));
    size_t P = gpt_num_params(big);
    const float *gb = gpt_grads_flat(big)->data, *gs = gpt_grads_flat(small)->data;
    double gmax = 0, diff2 = 0, norm2 = 0;
    for (size_t k = 0; k < P; k++) {
        gmax = fmax(gmax, fabs(gb[k]));
        diff2 += ((double)gs[k] - gb[k]) * ((double)gs[k] - gb[k]);
        norm2 += (double)gb[k] * gb[k];
    }
    /* the whole update within 1e-5 (summation order differs, so single
     * elements that cancel are looser) */
    if (!(sqrt(diff2 / norm2) < 1e-5))
        fail_msg("accumulated gradient differs by %.3g of its norm", sqrt(diff2 / norm2));
    test_assert_close_f32("accumulated gradients", gs, gb, P, 1e-3, 1e-2 * gmax);
    gpt_free(big), gpt_free(small);

    gpc_train_options o;
    record one, two;
    tiny_options(&o, run_dir("micro4"), &one);
    o.steps = 3;
    o.batch = 4;
    TEST_OK(gpc_train(&o, NULL));
    tiny_options(&o, run_dir("micro2x2"), &two);
    o.steps = 3;
    o.batch = 2;
    o.total_batch = 4 * 16;
    TEST_OK(gpc_train(&o, NULL));
    assert_int_equal(two.start.accumulation_steps, 2);
    for (int s = 1; s <= 3; s++)
        if (fabsf(two.loss[s] - one.loss[s]) > 1e-5f * one.loss[s])
            fail_msg("step %d: accumulated loss %.9g, one micro-batch %.9g", s, two.loss[s],
                     one.loss[s]);
}

static void test_schedule(void **state) {
    (void)state;
    gpc_lr_schedule s = {1e-3, 0.1, 10, 100};
    assert_true(fabs(gpc_lr_at(&s, 0) - 1e-4) < 1e-12);
    assert_true(fabs(gpc_lr_at(&s, 4) - 5e-4) < 1e-12);
    assert_true(fabs(gpc_lr_at(&s, 9) - 1e-3) < 1e-12);
    assert_true(fabs(gpc_lr_at(&s, 10) - 1e-3) < 1e-12);   /* the cosine starts at the peak */
    assert_true(fabs(gpc_lr_at(&s, 55) - 5.5e-4) < 1e-12); /* halfway: the mean of peak and floor */
    double last = 1e-4 + 0.5 * (1 + cos(M_PI * 89.0 / 90.0)) * 9e-4;
    assert_true(fabs(gpc_lr_at(&s, 99) - last) < 1e-12);
    assert_true(fabs(gpc_lr_at(&s, 100) - 1e-4) < 1e-12);
    assert_true(fabs(gpc_lr_at(&s, 500) - 1e-4) < 1e-12);
    for (int k = 11; k < 100; k++)
        assert_true(gpc_lr_at(&s, k) <= gpc_lr_at(&s, k - 1));
    gpc_lr_schedule none = {2e-3, 0.0, 0, 50};
    assert_true(fabs(gpc_lr_at(&none, 0) - 2e-3) < 1e-12);
    assert_true(fabs(gpc_lr_at(&none, 25) - 1e-3) < 1e-12);
    assert_int_equal(gpc_lr_default_warmup(100), 10);
    assert_int_equal(gpc_lr_default_warmup(5), 0);
    assert_int_equal(gpc_lr_default_warmup(100000), 1000);
    assert_true(gpc_lr_default(384) == 1e-3 && gpc_lr_default(768) == 6e-4);
}

static void test_bad_settings(void **state) {
    (void)state;
    gpc_train_options o;
    record r;
    tiny_options(&o, run_dir("bad"), &r);
    o.total_batch = 100;
    TEST_FAILS(gpc_train(&o, NULL), GPC_ERR_INVALID_ARG,
               "--total-batch 100 is not a multiple of batch x context x processes = 4 x 16 x 1 "
               "= 64 tokens; use 64 or 128");
    tiny_options(&o, run_dir("bad"), &r);
    o.resume = 1;
    TEST_FAILS(gpc_train(&o, NULL), GPC_ERR_IO, "nothing to resume");
    tiny_options(&o, run_dir("bad"), &r);
    o.data_dir = run_dir("no-such-data");
    TEST_FAILS(gpc_train(&o, NULL), GPC_ERR_IO, "no-such-data");
    tiny_options(&o, run_dir("bad"), &r);
    o.precision = GPC_BF16;
    TEST_FAILS(gpc_train(&o, NULL), GPC_ERR_UNSUPPORTED, "f32 only");
    tiny_options(&o, run_dir("bad"), &r);
    o.model = "dx";
    TEST_FAILS(gpc_train(&o, NULL), GPC_ERR_INVALID_ARG, "unknown model 'dx'");
    tiny_options(&o, run_dir("bad"), &r);
    o.heads = 3;
    TEST_FAILS(gpc_train(&o, NULL), GPC_ERR_INVALID_ARG, "do not split into 3 heads");

    /* a finished run: training into it again, or resuming it differently */
    tiny_options(&o, run_dir("done"), &r);
    o.steps = 2;
    TEST_OK(gpc_train(&o, NULL));
    TEST_FAILS(gpc_train(&o, NULL), GPC_ERR_INVALID_ARG, "add --resume to continue it");
    o.resume = 1;
    TEST_FAILS(gpc_train(&o, NULL), GPC_ERR_INVALID_ARG, "already done 2 of its 2 steps");
    o.batch = 8;
    o.steps = 4;
    TEST_FAILS(gpc_train(&o, NULL), GPC_ERR_MISMATCH,
               "the checkpoint was trained with --batch 4; this run asks for 8");
    o.batch = 0;
    o.layers = 3;
    TEST_FAILS(gpc_train(&o, NULL), GPC_ERR_MISMATCH,
               "was written by a model with 2 layers; this config has 3");
    o.layers = 2;
    o.seed_set = 1;
    o.seed = 99;
    TEST_FAILS(gpc_train(&o, NULL), GPC_ERR_MISMATCH, "--seed 1337");
    /* and extending it works: two more steps */
    o.seed_set = 0;
    memset(&r, 0, sizeof r);
    TEST_OK(gpc_train(&o, NULL));
    assert_int_equal(r.steps, 2);
    assert_int_equal(r.start.first_step, 2);
}

/* Out-of-memory auto-fit: a device limit between what micro-batch 2 and 4
 * hold makes the run go on at 2 x 2, whose losses are bitwise those of the
 * run started at 2 x 2 and within 1e-4 of those at 4 (the gradient sums
 * rounded in another order; AdamW's first steps move a weight by about lr
 * whatever its gradient's size, so a gradient near zero rounded the other
 * way moves the loss by more than the rounding: 5.6e-6 at most over 200
 * seeds, 1.4e-5 for seed 4768288084868198931); the device holds nothing
 * afterwards. */
static void test_auto_fit(void **state) {
    (void)state;
    gpc_train_options o;
    record at4, at2, fit, off_record;
    tiny_options(&o, run_dir("fit4"), &at4);
    o.steps = 6;
    o.eval_every = 3;
    TEST_OK(gpc_train(&o, NULL));
    size_t held4 = at4.start.memory_planned;
    tiny_options(&o, run_dir("fit2"), &at2);
    o.steps = 6;
    o.eval_every = 3;
    o.batch = 2;
    o.total_batch = 4 * 16;
    o.eval_batches = 8;
    TEST_OK(gpc_train(&o, NULL));
    size_t held2 = at2.start.memory_planned;
    assert_true(held2 < held4);

    char limit[32];
    snprintf(limit, sizeof limit, "%zu", (held2 + held4) / 2);
    setenv("GPC_DEVICE_MEMORY_LIMIT", limit, 1);
    tiny_options(&o, run_dir("fit"), &fit);
    o.steps = 6;
    o.eval_every = 3;
    gpc_status s = gpc_train(&o, NULL);
    tiny_options(&o, run_dir("fit-off"), &off_record);
    o.no_auto_fit = 1;
    gpc_status off = gpc_train(&o, NULL);
    unsetenv("GPC_DEVICE_MEMORY_LIMIT");
    TEST_OK(s);
    assert_int_equal(off, GPC_ERR_NOMEM);
    gpc_clear_error();
    assert_int_equal(fit.starts, 1);
    assert_int_equal(fit.start.B, 2);
    assert_int_equal(fit.start.accumulation_steps, 2);
    assert_int_equal(fit.steps, 6);
    for (int step = 1; step <= 6; step++) {
        assert_memory_equal(&fit.loss[step], &at2.loss[step], sizeof(float));
        assert_true(fabsf(fit.loss[step] - at4.loss[step]) <= 1e-4f * fabsf(at4.loss[step]));
        if (!isnan(at2.val_loss[step]))
            assert_memory_equal(&fit.val_loss[step], &at2.val_loss[step], sizeof(float));
    }
    assert_int_equal(gpc_device_memory_in_use(gpc_cpu()), 0);
}

/* Whether two files hold the same bytes. */
static void assert_same_file(const char *a, const char *b) {
    char *ta, *tb;
    size_t na, nb;
    TEST_OK(gpc_read_file(a, &ta, &na));
    TEST_OK(gpc_read_file(b, &tb, &nb));
    assert_int_equal(na, nb);
    if (memcmp(ta, tb, na) != 0) fail_msg("%s and %s differ", a, b);
    gpc_free(ta), gpc_free(tb);
}

static void checkpoint_of(const char *run, char *path, size_t size) {
    snprintf(path, size, "%s/checkpoint.bin", run_dir(run));
}

/* --offload-optimizer on the CPU: 10 steps repeat the plain run's losses
 * bit for bit, and the final checkpoints (weights, m and v) are the same
 * bytes; a run stopped at step 5 resumes with the other setting, either
 * way, to the same end. */
static void test_offload_exact(void **state) {
    (void)state;
    const char *names[4] = {"plain", "offload", "offload_then_plain", "plain_then_offload"};
    /* chunks of 1000 elements: the tiny model's 28k stream in several */
    setenv("GPC_OFFLOAD_CHUNK", "1000", 1);
    record runs[4];
    for (int k = 0; k < 4; k++) {
        gpc_train_options o;
        tiny_options(&o, run_dir(names[k]), &runs[k]);
        o.steps = 10;
        o.eval_every = 5;
        o.offload_optimizer = k == 1 || k == 2;
        if (k >= 2) {
            runs[k].stop_at = 5;
            TEST_FAILS(gpc_train(&o, NULL), GPC_ERR_INTERRUPTED, "resume with --resume");
            gpc_train_clear_stop();
            assert_int_equal(runs[k].steps, 5);
            o.offload_optimizer = k == 3;
            o.resume = 1;
            runs[k].stop_at = 0;
        }
        TEST_OK(gpc_train(&o, NULL));
        assert_int_equal(runs[k].loss[10] != 0, 1);
    }
    char a[4200], b[4200];
    checkpoint_of(names[0], a, sizeof a);
    for (int k = 1; k < 4; k++) {
        for (int s = 1; s <= 10; s++)
            if (runs[k].loss[s] != runs[0].loss[s])
                fail_msg("%s, step %d: loss %.9g, plain %.9g", names[k], s, runs[k].loss[s],
                         runs[0].loss[s]);
        checkpoint_of(names[k], b, sizeof b);
        assert_same_file(a, b);
    }
    unsetenv("GPC_OFFLOAD_CHUNK");
}

/* Four steps of the tiny model into run `name`, the optimizer offloaded or
 * not, auto-fit on or off. */
static gpc_status train_four_steps(const char *name, record *r, int offload, int no_auto_fit) {
    gpc_train_options o;
    tiny_options(&o, run_dir(name), r);
    o.steps = 4;
    o.offload_optimizer = offload;
    o.no_auto_fit = no_auto_fit;
    return gpc_train(&o, NULL);
}

/* An offloaded run holds m and v (8 bytes a parameter in f32) in host
 * memory, not on the device: under a device limit between the two runs'
 * needs, the plain run runs out of memory and the offloaded one trains,
 * at the same micro-batch and to the same losses. */
static void test_offload_memory(void **state) {
    (void)state;
    record plain, off, limited;
    TEST_OK(train_four_steps("mem_plain", &plain, 0, 0));
    TEST_OK(train_four_steps("mem_off", &off, 1, 0));
    size_t P = plain.start.parameters, held = plain.start.memory_planned;
    size_t held_off = off.start.memory_planned;
    assert_true(held - held_off >= 8 * P && held - held_off < 8 * P + 2 * 256);
    assert_int_equal(plain.start.host_pinned, 0);
    assert_true(off.start.host_pinned >= 16 * P); /* m, v, gradients and weights (f32) */

    char limit[32];
    snprintf(limit, sizeof limit, "%zu", held_off + (held - held_off) / 2);
    setenv("GPC_DEVICE_MEMORY_LIMIT", limit, 1);
    gpc_status s = train_four_steps("mem_plain_limited", &limited, 0, 1);
    gpc_status s_off = train_four_steps("mem_off_limited", &limited, 1, 1);
    unsetenv("GPC_DEVICE_MEMORY_LIMIT");
    assert_int_equal(s, GPC_ERR_NOMEM);
    TEST_OK(s_off);
    gpc_clear_error();
    assert_int_equal(limited.start.B, 4);
    for (int step = 1; step <= 4; step++)
        assert_memory_equal(&limited.loss[step], &plain.loss[step], sizeof(float));
}

/* The combinations --offload-optimizer does not support, each refused
 * with what to leave out. */
static void test_offload_refusals(void **state) {
    (void)state;
    gpc_train_options o;
    record r;
    tiny_options(&o, run_dir("offload_refused"), &r);
    o.offload_optimizer = 1;
    o.tp = 2;
    TEST_FAILS(gpc_train(&o, NULL), GPC_ERR_UNSUPPORTED, "leave out --tp and --pp");
    o.tp = 1;
    o.pp = 2;
    TEST_FAILS(gpc_train(&o, NULL), GPC_ERR_UNSUPPORTED, "leave out --tp and --pp");
    o.pp = 1;
    o.world_size = 2;
    TEST_FAILS(gpc_train(&o, NULL), GPC_ERR_UNSUPPORTED, "trains on one process");
    o.world_size = 1;
    o.zero = 1;
    TEST_FAILS(gpc_train(&o, NULL), GPC_ERR_UNSUPPORTED, "--zero");
    o.zero = 0;
    o.lora_rank = 4;
    TEST_FAILS(gpc_train(&o, NULL), GPC_ERR_UNSUPPORTED, "leave it out with --lora");
    assert_int_equal(r.steps, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedule),         cmocka_unit_test(test_loss_falls),
        cmocka_unit_test(test_resume_exact),     cmocka_unit_test(test_accumulation),
        cmocka_unit_test(test_bad_settings),     cmocka_unit_test(test_power_summary),
        cmocka_unit_test(test_energy_summary),   cmocka_unit_test(test_energy_meter),
        cmocka_unit_test(test_auto_fit),         cmocka_unit_test(test_offload_exact),
        cmocka_unit_test(test_offload_refusals), cmocka_unit_test(test_offload_memory),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
