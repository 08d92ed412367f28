/*
 * gpt2_step.c: the GPT-2 training step on one GPU, timed through the model
 * API (gpt_forward_backward + gpt_update), without the data pipeline.
 *
 *   bench_gpt2_step [--depth 12] [--batch 64] [--context 1024] [--accum 8]
 *                   [--steps 10] [--warmup 3] [--precision bf16] [--recompute 0|1|2]
 *                   [--offload 0|1]
 *
 * --depth N is gpc train's --model dN: 24, 36 and 48 are GPT-2's larger
 * shapes (24 x 16 x 1024, 36 x 20 x 1280, 48 x 25 x 1600). --offload 1
 * keeps the optimizer state in pinned host memory (gpc train's
 * --offload-optimizer), its CPU update overlapping the next step's forward
 * as gpc train runs it (GPC_OFFLOAD_OVERLAP=0: each step waits for it).
 *
 * Prints one line per timed step and a summary: tokens/s (median step),
 * MFU against the H200's 989 TFLOP/s dense bf16 (FLOPs per token 6N + 6LCT,
 * N without the position embedding and the padded rows, as llm.c counts),
 * the model's planned memory and the GPU memory in use. With
 * GPC_CUDA_PROFILE=1 it adds the time of every op family over the timed
 * steps (CUDA events around each op, src/cuda/cuda_ops.cu). The first timed
 * step is the NVTX range "timed-step". Random tokens: throughput does not
 * depend on the text.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/model.h"
#include "gpc/settings.h"
#include "gpc/trace.h"
#include "bench_util.h"
#ifdef GPC_HAVE_CUDA
#include "cuda/cuda_profile.h"
#endif

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int depth = 12, B = 64, T = 1024, accum = 8, steps = 10, warmup = 3, recompute = 0;
    int offload = 0;
    const char *precision = "bf16";
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--depth"))
            depth = atoi(v);
        else if (!strcmp(k, "--batch"))
            B = atoi(v);
        else if (!strcmp(k, "--context"))
            T = atoi(v);
        else if (!strcmp(k, "--accum"))
            accum = atoi(v);
        else if (!strcmp(k, "--steps"))
            steps = atoi(v);
        else if (!strcmp(k, "--warmup"))
            warmup = atoi(v);
        else if (!strcmp(k, "--recompute"))
            recompute = atoi(v);
        else if (!strcmp(k, "--offload"))
            offload = atoi(v);
        else if (!strcmp(k, "--precision"))
            precision = v;
        else {
            fprintf(stderr, "bench_gpt2_step: unknown option %s\n", k);
            return 2;
        }
    }
    const gpc_backend *cuda = bench_cuda("bench_gpt2_step");
    if (!cuda) return 1;
    gpc_dtype dtype;
    gpt_config config;
    /* dN as gpc train's --model: d24, d36, d48 are GPT-2's larger shapes */
    char name[16];
    int layers, heads, channels;
    snprintf(name, sizeof name, "d%d", depth);
    gpt_model *model = NULL;
    gpc_device dev = {GPC_DEVICE_CUDA, 0};
    if (gpc_dtype_parse(precision, &dtype) != GPC_OK ||
        gpt_config_parse_depth(name, &layers, &heads, &channels) != GPC_OK ||
        gpt_config_init(&config, layers, heads, channels, T, 50257) != GPC_OK ||
        (offload
             ? gpt_create_offload(&model, &config, dev, dtype, B, T, recompute)
             : gpt_create_recompute(&model, &config, dev, dtype, B, T, 1, recompute)) != GPC_OK ||
        gpt_init_weights(model, 1337) != GPC_OK) {
        fprintf(stderr, "bench_gpt2_step: %s\n", gpc_last_error());
        return 1;
    }
    size_t n = (size_t)B * T;
    int32_t *tokens = malloc((n + 1) * sizeof(int32_t) * 2);
    gpc_rng rng;
    gpc_rng_seed(&rng, 42, 1);
    for (size_t i = 0; i < 2 * (n + 1); i++)
        tokens[i] = (int32_t)gpc_rng_below(&rng, 50257);

    /* 6N + 6LCT FLOPs per token (PaLM appendix B; llm.c's MFU), N without wpe */
    double N = (double)gpt_num_params(model) - (double)config.max_context * config.channels -
               (double)(config.padded_vocab - config.vocab_size) * config.channels;
    double flops_per_token = 6.0 * N + 6.0 * config.layers * config.channels * (double)T;
    printf("gpc d%d (%d x %d x %d): %.1fM parameters, B=%d T=%d accumulation %d (%lld tokens a "
           "step), %s, "
           "%.3f GFLOP/token\n",
           depth, layers, heads, channels, N / 1e6, B, T, accum, (long long)n * accum, precision,
           flops_per_token / 1e9);

    gpc_optim_options opt;
    gpc_optim_defaults(&opt);
    opt.overlap = gpc_setting_flag("GPC_OFFLOAD_OVERLAP"); /* as gpc train; offloaded only */
    double *times = calloc((size_t)steps, sizeof(double));
    gpc_status status = GPC_OK;
    for (int step = 0; step < warmup + steps && status == GPC_OK; step++) {
#ifdef GPC_HAVE_CUDA
        if (step == warmup) gpc_cuda_profile_reset();
#endif
        cuda->synchronize(0);
        double t0 = gpc_time_seconds();
        /* the first timed step is an NVTX range, so a profiler can take its
         * kernels alone (scripts/gpu-kernels.sh) */
        if (step == warmup) gpc_trace_push("timed-step");
        status = gpt_zero_grad(model);
        for (int a = 0; a < accum && status == GPC_OK; a++) {
            const int32_t *x = tokens + (a & 1) * (n + 1);
            status = gpt_forward_backward(model, x, x + 1, B, T, 1.0f / (float)(n * accum));
        }
        opt.step = step + 1;
        opt.seed = (uint32_t)step;
        float loss = 0, norm = 0;
        if (status == GPC_OK) status = gpt_update(model, &opt, NULL, NULL);
        if (status == GPC_OK) status = gpt_read_step(model, &loss, &norm);
        if (step == warmup) gpc_trace_pop();
        cuda->synchronize(0);
        double dt = gpc_time_seconds() - t0;
        if (step >= warmup) times[step - warmup] = dt;
        printf("step %3d%s loss %.4f norm %.3f %8.1f ms %10.0f tokens/s\n", step + 1,
               step < warmup ? " (warm-up)" : "", loss, norm, dt * 1e3, n * accum / dt);
    }
    if (status != GPC_OK) {
        fprintf(stderr, "bench_gpt2_step: %s\n", gpc_last_error());
        return 1;
    }
    qsort(times, (size_t)steps, sizeof(double), compare_double);
    double median = times[steps / 2];
    double tps = n * accum / median;
    size_t free_bytes = 0, total_bytes = 0;
    cuda->memory_info(0, &free_bytes, &total_bytes);
    printf(
        "RESULT gpc tokens_per_s=%.0f step_ms=%.1f mfu=%.1f%% model_gib=%.2f gpu_used_gib=%.2f\n",
        tps, median * 1e3, 100.0 * tps * flops_per_token / 989e12,
        gpt_memory_bytes(model) / 1073741824.0, (total_bytes - free_bytes) / 1073741824.0);
#ifdef GPC_HAVE_CUDA
    static char report[8192];
    if (gpc_cuda_profile_report(report, sizeof report))
        printf("per-op GPU time over %d steps (CUDA events):\n%s", steps, report);
#endif
    free(times);
    free(tokens);
    gpt_free(model);
    return 0;
}
