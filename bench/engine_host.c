/*
 * engine_host.c: the serving engine's host time per step, the time its
 * thread spends outside the model's calls (scheduling, building the
 * batch, sampling on the CPU, callbacks), with many sequences decoding.
 * The model is a one-layer GPT of 32 channels on the CPU, so the step
 * itself is short and the host's share shows.
 *
 *   bench_engine_host [--sequences 256] [--steps 200] [--pipeline 1]
 *
 * Every sequence gets a 16-token prompt and decodes for all the steps.
 * Timing starts once every prompt ran. Line: RESULT engine_host
 * sequences=S steps=N pipeline=P host_us_per_step=... model_us_per_step=...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "gpc/engine.h"
#include "gpc/model.h"
#include "gpc/train.h"

#define PROG "bench_engine_host"
#define CHECK(x) BENCH_TRY(PROG, x)

static void on_event(void *user, const gpc_engine_event *event) {
    (void)event;
    ++*(long *)user;
}

int main(int argc, char **argv) {
    int sequences = 256, steps = 200, pipeline = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--sequences"))
            sequences = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--pipeline"))
            pipeline = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "%s: unknown option %s\n", PROG, argv[i]);
            return 2;
        }
    }
    if (sequences < 1 || steps < 1) {
        fprintf(stderr, "%s: --sequences and --steps must be at least 1\n", PROG);
        return 2;
    }
    char dir[] = "/tmp/gpc-engine-host-XXXXXX";
    if (!mkdtemp(dir)) {
        perror(PROG);
        return 1;
    }
    gpt_config config;
    CHECK(gpt_config_init(&config, 1, 1, 32, 1024, 256));
    gpt_model *m = NULL;
    CHECK(gpt_create(&m, &config, gpc_cpu(), GPC_F32, 1, 1, 0));
    CHECK(gpt_init_weights(m, 1));
    float *params = malloc(gpt_num_params(m) * sizeof(float));
    CHECK(gpt_get_params(m, params));
    gpt_free(m);
    CHECK(gpc_run_save_weights(dir, &config, params));
    free(params);

    gpc_engine_options o;
    gpc_engine_options_init(&o);
    o.max_batch = sequences;
    o.max_step_tokens = sequences * 16;
    o.pipeline = pipeline;
    o.kv_bytes = (size_t)sequences * (16 + (size_t)steps + 32) / 16 *
                 gpt_paged_block_bytes(&config, GPC_F32, 16);
    gpc_engine *e = NULL;
    CHECK(gpc_engine_create(&e, dir, gpc_cpu(), &o));
    long events = 0;
    uint32_t prompt[16];
    for (int s = 0; s < sequences; s++) {
        for (int i = 0; i < 16; i++)
            prompt[i] = (uint32_t)((s * 31 + i * 7) % 255);
        gpc_engine_request r;
        gpc_engine_request_init(&r);
        r.prompt = prompt;
        r.prompt_len = 16;
        r.max_tokens = steps + 8;
        r.temperature = 0.0f; /* greedy: the host draws cheaply, as on a GPU it does not at all */
        r.seed = (uint64_t)s;
        r.callback = on_event;
        r.user = &events;
        CHECK(gpc_engine_submit(e, &r, NULL));
    }
    for (int i = 0; i < 3; i++) /* the prompts, then decoding only */
        CHECK(gpc_engine_step(e, NULL));
    gpc_engine_stats a, b;
    gpc_engine_get_stats(e, &a);
    double t0 = gpc_time_seconds();
    for (int i = 0; i < steps; i++)
        CHECK(gpc_engine_step(e, NULL));
    double wall = gpc_time_seconds() - t0;
    gpc_engine_get_stats(e, &b);
    double n = (double)(b.steps - a.steps);
    printf("RESULT engine_host sequences=%d steps=%.0f pipeline=%d host_us_per_step=%.1f "
           "model_us_per_step=%.1f wall_us_per_step=%.1f\n",
           sequences, n, pipeline, (b.host_seconds - a.host_seconds) / n * 1e6,
           (b.busy_seconds - a.busy_seconds) / n * 1e6, wall / n * 1e6);
    gpc_engine_free(e);
    gpc_remove_flat_dir(dir);
    return 0;
}
