/*
 * test_cuda_engine.c: the serving engine on the GPU (bf16, sampling on the
 * device, each step launched before the previous one is collected) against
 * the same engine on the CPU (f32, sampling on the host), on one tiny
 * random run folder.
 *
 * bf16 and f32 round differently, so greedy tokens agree up to the first
 * near-tie and may then part: the test prints how many agree and requires
 * the first four of each request and three quarters of all of them. A
 * seeded sampled run must give the same tokens twice on the GPU, and
 * min_tokens must keep the end-of-text token out on the device. The greedy
 * check runs again on int8 and fp8 copies of the run (gpc quantize).
 * Running ahead (decode rows fed on the device) must give the same tokens
 * as one step at a time, whose steps hold the same rows.
 *
 * Without a usable GPU the test exits 77, which CTest reports as skipped.
 */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/engine.h"
#include "gpc/model.h"
#include "gpc/tokenizer.h"
#include "gpc/train.h"

enum { LAYERS = 2, HEADS = 2, CHANNELS = 64, CONTEXT = 128, PROMPTS = 8, GEN = 48 };

static char *run_dir;
static gpt_config config;
static int vocab;
static int pipeline = 1; /* the engine option run_jobs uses */

static int setup(void **state) {
    (void)state;
    run_dir = test_tmpdir("cuda_engine");
    config = test_make_serving_run(run_dir, LAYERS, HEADS, CHANNELS, CONTEXT, 20261203);
    vocab = config.vocab_size;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    test_rmtree(run_dir);
    gpc_free(run_dir);
    return 0;
}

typedef struct {
    uint32_t prompt[CONTEXT];
    size_t prompt_len;
    int max_tokens, min_tokens, top_k;
    float temperature, top_p;
    uint64_t seed;
    int64_t eos;
    uint32_t got[GEN + 1];
    int n_got, finished;
    gpc_finish_reason finish;
} job;

static void on_event(void *user, const gpc_engine_event *ev) {
    job *j = user;
    if (ev->token >= 0 && j->n_got <= GEN) j->got[j->n_got++] = (uint32_t)ev->token;
    if (ev->finish != GPC_FINISH_NONE) j->finished = 1, j->finish = ev->finish;
}

/* Runs the jobs (their results reset) through a fresh engine of the run
 * folder dir on device, all submitted at once, stepping until every one
 * has finished. */
static void run_jobs(const char *dir, gpc_device device, job *jobs, int n) {
    gpc_engine_options o;
    gpc_engine_options_init(&o);
    o.max_batch = 16;
    o.max_step_tokens = 256;
    o.pipeline = pipeline;
    o.kv_bytes =
        64 * gpt_paged_block_bytes(&config, device.type == GPC_DEVICE_CPU ? GPC_F32 : GPC_BF16,
                                   o.block_size);
    gpc_engine *e = NULL;
    TEST_OK(gpc_engine_create(&e, dir, device, &o));
    for (int i = 0; i < n; i++) {
        job *j = &jobs[i];
        j->n_got = 0, j->finished = 0;
        gpc_engine_request r;
        gpc_engine_request_init(&r);
        r.prompt = j->prompt;
        r.prompt_len = j->prompt_len;
        r.max_tokens = j->max_tokens;
        r.min_tokens = j->min_tokens;
        r.temperature = j->temperature;
        r.top_k = j->top_k;
        r.top_p = j->top_p;
        r.seed = j->seed;
        r.eos_token = j->eos;
        r.callback = on_event;
        r.user = j;
        TEST_OK(gpc_engine_submit(e, &r, NULL));
    }
    int active = 1, steps = 0;
    while (active && steps < 10000) {
        TEST_OK(gpc_engine_step(e, &active));
        steps++;
    }
    if (active) fail_msg("%d requests still ran after %d steps", active, steps);
    gpc_engine_free(e);
    for (int i = 0; i < n; i++)
        if (!jobs[i].finished) fail_msg("request %d never finished", i);
}

static void make_jobs(job *jobs, float temperature, int top_k, float top_p) {
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 41);
    for (int i = 0; i < PROMPTS; i++) {
        job *j = &jobs[i];
        memset(j, 0, sizeof *j);
        j->prompt_len = 1 + (size_t)(i * 9) % 60; /* 1 .. 60 tokens: decode and prefill mixed */
        for (size_t t = 0; t < j->prompt_len; t++)
            j->prompt[t] = gpc_rng_below(&rng, (uint32_t)vocab);
        j->max_tokens = GEN;
        j->temperature = temperature;
        j->top_k = top_k;
        j->top_p = top_p;
        j->seed = 1000 + (uint64_t)i;
        j->eos = -1;
    }
}

static const gpc_device gpu = {GPC_DEVICE_CUDA, 0};

/* Each request drew the same tokens in two runs of the same jobs, a and b
 * (named in the message). */
static void expect_same_tokens(const job *a, const char *a_name, const job *b, const char *b_name) {
    for (int i = 0; i < PROMPTS; i++) {
        assert_int_equal(a[i].n_got, b[i].n_got);
        for (int t = 0; t < a[i].n_got; t++)
            if (a[i].got[t] != b[i].got[t])
                fail_msg("request %d: token %d is %u %s, %u %s", i, t, a[i].got[t], a_name,
                         b[i].got[t], b_name);
    }
}

/* Greedy on the GPU agrees with the CPU up to the first differing token,
 * for the run folder dir. */
static void greedy_against_cpu(const char *dir) {
    static job cpu_jobs[PROMPTS], gpu_jobs[PROMPTS];
    make_jobs(cpu_jobs, 0.0f, 0, 1.0f);
    memcpy(gpu_jobs, cpu_jobs, sizeof cpu_jobs);
    run_jobs(dir, gpc_cpu(), cpu_jobs, PROMPTS);
    run_jobs(dir, gpu, gpu_jobs, PROMPTS);
    int agree_total = 0, total = 0;
    for (int i = 0; i < PROMPTS; i++) {
        assert_int_equal(cpu_jobs[i].n_got, GEN);
        assert_int_equal(gpu_jobs[i].n_got, GEN);
        int agree = 0;
        while (agree < GEN && cpu_jobs[i].got[agree] == gpu_jobs[i].got[agree])
            agree++;
        printf("  greedy request %d (prompt %zu): %d of %d tokens agree with the CPU\n", i,
               cpu_jobs[i].prompt_len, agree, GEN);
        if (agree < 4)
            fail_msg("request %d: token %d is %u on the GPU, %u on the CPU (first four must agree)",
                     i, agree, gpu_jobs[i].got[agree], cpu_jobs[i].got[agree]);
        agree_total += agree, total += GEN;
    }
    printf("  greedy: %d of %d tokens agree (%.1f%%)\n", agree_total, total,
           100.0 * agree_total / total);
    if (4 * agree_total < 3 * total)
        fail_msg("only %d of %d greedy tokens agree with the CPU", agree_total, total);
}

static void test_greedy_against_cpu(void **state) {
    (void)state;
    greedy_against_cpu(run_dir);
}

/* The same for the run's int8 and fp8 copies (gpc quantize): decode steps
 * of up to 8 rows run in the skinny kernel, prompts in the others. */
static void test_quantized_greedy_against_cpu(void **state) {
    (void)state;
    const gpt_quant_options kinds[2] = {{GPC_I8, 1}, {GPC_F8E4M3, 0}};
    for (int k = 0; k < 2; k++) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s-q%d", run_dir, k);
        TEST_OK(gpc_quantize_run(run_dir, dir, &kinds[k], NULL));
        printf("  %s weights:\n", gpt_quant_name(&kinds[k]));
        greedy_against_cpu(dir);
        test_rmtree(dir);
    }
}

/* A seeded sampled run gives the same tokens twice, and they are tokens. */
static void test_sampled_deterministic(void **state) {
    (void)state;
    static job first[PROMPTS], second[PROMPTS];
    make_jobs(first, 0.9f, 40, 0.95f);
    first[1].top_k = 0, first[2].top_p = 1.0f, first[3].temperature = 1.5f;
    memcpy(second, first, sizeof first);
    run_jobs(run_dir, gpu, first, PROMPTS);
    run_jobs(run_dir, gpu, second, PROMPTS);
    for (int i = 0; i < PROMPTS; i++) {
        assert_int_equal(first[i].n_got, GEN);
        for (int t = 0; t < GEN; t++)
            if (first[i].got[t] >= (uint32_t)vocab)
                fail_msg("request %d drew token %u, outside the vocabulary of %d", i,
                         first[i].got[t], vocab);
    }
    expect_same_tokens(first, "sampled once", second, "again with the same seed");
}

/* Running ahead gives the tokens of one step at a time on the GPU. Without
 * an end-of-text token the two put the same rows in every step, so the
 * device computes the same numbers and the tokens agree exactly; requests
 * of other lengths check that one ending by length is not run ahead. */
static void test_pipeline_same_on_device(void **state) {
    (void)state;
    static job ahead[PROMPTS], one[PROMPTS];
    make_jobs(ahead, 0.9f, 40, 0.95f);
    for (int i = 0; i < PROMPTS; i++)
        ahead[i].max_tokens = GEN - 5 * i;
    ahead[0].temperature = 0.0f; /* greedy too */
    memcpy(one, ahead, sizeof ahead);
    run_jobs(run_dir, gpu, ahead, PROMPTS);
    pipeline = 0;
    run_jobs(run_dir, gpu, one, PROMPTS);
    pipeline = 1;
    for (int i = 0; i < PROMPTS; i++) {
        assert_int_equal(ahead[i].n_got, GEN - 5 * i);
        assert_int_equal(ahead[i].finish, GPC_FINISH_LENGTH);
    }
    expect_same_tokens(ahead, "running ahead", one, "one step at a time");
}

/* min_tokens forbids the end-of-text token on the device: with eos set to
 * the token greedy draws first, the GPU draws something else for the first
 * min_tokens tokens. */
static void test_min_tokens_on_device(void **state) {
    (void)state;
    static job probe[PROMPTS], cpu_job[1], gpu_job[1]; /* make_jobs fills PROMPTS */
    make_jobs(probe, 0.0f, 0, 1.0f);
    probe[0].max_tokens = 1;
    run_jobs(run_dir, gpu, probe, 1);
    assert_int_equal(probe[0].n_got, 1);
    memcpy(cpu_job, probe, sizeof cpu_job);
    cpu_job[0].max_tokens = GEN;
    cpu_job[0].eos = probe[0].got[0];
    cpu_job[0].min_tokens = 3;
    memcpy(gpu_job, cpu_job, sizeof cpu_job);
    run_jobs(run_dir, gpc_cpu(), cpu_job, 1);
    run_jobs(run_dir, gpu, gpu_job, 1);
    int n = gpu_job[0].n_got;
    if (n < 3) fail_msg("the GPU ended after %d tokens, under min_tokens 3", n);
    for (int t = 0; t < 3; t++)
        if (gpu_job[0].got[t] == (uint32_t)cpu_job[0].eos)
            fail_msg("the GPU drew the end-of-text token %u at %d, under min_tokens",
                     gpu_job[0].got[t], t);
    printf("  min_tokens: the GPU's first token %u, the CPU's %u (eos %lld)\n", gpu_job[0].got[0],
           cpu_job[0].got[0], (long long)cpu_job[0].eos);
}

int main(void) {
    if (!gpc_backend_get(GPC_DEVICE_CUDA)) {
        fprintf(stderr, "skipped: %s\n", gpc_last_error());
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_against_cpu),
        cmocka_unit_test(test_quantized_greedy_against_cpu),
        cmocka_unit_test(test_sampled_deterministic),
        cmocka_unit_test(test_min_tokens_on_device),
        cmocka_unit_test(test_pipeline_same_on_device),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
