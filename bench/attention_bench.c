/*
 * attention_bench.c: gpc's causal attention forward and backward at the
 * GPT-2 shape, timed with CUDA events (median of --reps after warm-up), on
 * each GPU path: gpc's own kernels and cuDNN's fused attention
 * (gpc_attention_path), then the ratio of their forward+backward times.
 *
 *   bench_attention_bench [--batch 64] [--context 1024] [--heads 12]
 *                         [--head-size 64] [--reps 20] [--precision bf16]
 *                         [--path both|auto|gpc|cudnn|simple]
 *
 * --path defaults to both, or to GPC_ATTENTION when that is set. Options
 * are checked before a GPU is looked for (exit 2 with a line saying which).
 * Lines:
 * RESULT gpc_attention ... (gpc's kernels, also for simple), RESULT
 * cudnn_attention ..., RESULT attention_paths gpc_over_cudnn=... (above 1:
 * cuDNN is faster). bench/attention_bench.py times PyTorch's SDPA (flash) on
 * the same shape; bench/gpt2_train.sh prints them side by side. FLOPs
 * counted as FA2 does: forward 4 B NH T^2 hs / 2 (causal), backward 2.5
 * times that. With GPC_BENCH_ENERGY_S=S the forward and the backward of
 * each path also run back to back for S seconds at the power cap: RESULT
 * attention_energy PATH_forward|PATH_backward mj=... pj_per_flop=... a call
 * (bench_energy.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/attention_cudnn.h"
#include "bench_energy.h"
#include "gpc/settings.h"
#include "ops/ops.h"

#define PROG "bench_attention_bench"
#define CHECK(x) BENCH_TRY(PROG, x)

/* The tensors of one attention call, for bench_energy_sustain. */
typedef struct {
    gpc_tensor *qkv, *out, *lse, *dout, *dqkv;
    int NH;
} att_call;

static gpc_status run_forward(void *ctx) {
    att_call *c = ctx;
    return gpc_op_attention_forward(c->out, c->lse, c->qkv, c->NH);
}

static gpc_status run_backward(void *ctx) {
    att_call *c = ctx;
    return gpc_op_attention_backward(c->dqkv, c->dout, c->qkv, c->out, c->lse, c->NH);
}

int main(int argc, char **argv) {
    int64_t b = 64, t = 1024, nh = 12, head = 64, r64 = 20;
    const char *precision = "bf16", *path_arg = gpc_setting_given("GPC_ATTENTION");
    if (!path_arg || !path_arg[0]) path_arg = "both";
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = v != NULL;
        if (ok && !strcmp(a, "--batch"))
            ok = bench_parse_int64(PROG, a, v, 1, 4096, &b);
        else if (ok && !strcmp(a, "--context"))
            ok = bench_parse_int64(PROG, a, v, 1, 1 << 17, &t);
        else if (ok && !strcmp(a, "--heads"))
            ok = bench_parse_int64(PROG, a, v, 1, 1024, &nh);
        else if (ok && !strcmp(a, "--head-size"))
            ok = bench_parse_int64(PROG, a, v, 1, 512, &head);
        else if (ok && !strcmp(a, "--reps"))
            ok = bench_parse_int64(PROG, a, v, 1, 10000, &r64);
        else if (ok && !strcmp(a, "--precision"))
            precision = v;
        else if (ok && !strcmp(a, "--path"))
            path_arg = v;
        else {
            fprintf(stderr, "%s: unknown option or missing value: %s\n", PROG, a);
            return 2;
        }
        if (!ok) return 2;
    }
    int B = (int)b, T = (int)t, NH = (int)nh, hs = (int)head, reps = (int)r64;
    gpc_dtype dt;
    if (!bench_parse_float_dtype(PROG, precision, &dt)) return 2;
    if (strcmp(path_arg, "both") && strcmp(path_arg, "auto") && strcmp(path_arg, "gpc") &&
        strcmp(path_arg, "cudnn") && strcmp(path_arg, "simple")) {
        fprintf(stderr,
                "%s: --path (or GPC_ATTENTION) needs both, auto, gpc, cudnn or simple, not '%s'\n",
                PROG, path_arg);
        return 2;
    }
    double energy_s;
    if (!bench_energy_seconds(PROG, &energy_s)) return 2;
    const char *paths[2] = {path_arg, NULL};
    if (!strcmp(path_arg, "both")) paths[0] = "gpc", paths[1] = "cudnn";
    const gpc_backend *cuda = bench_cuda(PROG);
    if (!cuda) return 1;
    gpc_device dev = {GPC_DEVICE_CUDA, 0};
    int64_t C = (int64_t)NH * hs;
    int64_t s_qkv[3] = {B, T, 3 * C}, s_o[3] = {B, T, C}, s_l[3] = {B, NH, T};
    gpc_tensor qkv, out, lse, dout, dqkv, hq, hd;
    CHECK(gpc_tensor_alloc(&qkv, dt, dev, 3, s_qkv));
    CHECK(gpc_tensor_alloc(&dqkv, dt, dev, 3, s_qkv));
    CHECK(gpc_tensor_alloc(&out, dt, dev, 3, s_o));
    CHECK(gpc_tensor_alloc(&dout, dt, dev, 3, s_o));
    CHECK(gpc_tensor_alloc(&lse, GPC_F32, dev, 3, s_l));
    CHECK(gpc_tensor_alloc(&hq, GPC_F32, gpc_cpu(), 3, s_qkv));
    CHECK(gpc_tensor_alloc(&hd, GPC_F32, gpc_cpu(), 3, s_o));
    gpc_rng rng;
    gpc_rng_seed(&rng, 11, 1);
    gpc_rng_fill_normal(&rng, hq.data, (size_t)gpc_tensor_numel(&hq), 0, 1);
    gpc_rng_fill_normal(&rng, hd.data, (size_t)gpc_tensor_numel(&hd), 0, 1);
    gpc_tensor tq, td; /* f32 staging on the device, then converted */
    CHECK(gpc_tensor_alloc(&tq, GPC_F32, dev, 3, s_qkv));
    CHECK(gpc_tensor_alloc(&td, GPC_F32, dev, 3, s_o));
    CHECK(gpc_tensor_copy(&tq, &hq));
    CHECK(gpc_tensor_copy(&td, &hd));
    CHECK(gpc_op_convert(&qkv, &tq));
    CHECK(gpc_op_convert(&dout, &td));
    gpc_nvml *nvml = NULL;
    if (energy_s > 0) CHECK(gpc_nvml_open(&nvml));
    att_call call = {&qkv, &out, &lse, &dout, &dqkv, NH};
    gpc_event e0, e1;
    CHECK(cuda->event_create(&e0));
    CHECK(cuda->event_create(&e1));
    static float fwd[10000], bwd[10000]; /* --reps is at most 10000 */
    double f = 4.0 * B * NH * (double)T * T * hs / 2, total[2] = {0, 0};
    for (int k = 0; k < 2 && paths[k]; k++) {
        CHECK(gpc_op_set_attention_path(paths[k]));
        /* plans (cuDNN) are built here, outside the timing */
        gpc_status prepared = gpc_op_attention_prepare(&qkv, NH, 1);
        if (prepared != GPC_OK) {
            printf("RESULT %s_attention not run: %s\n", paths[k], gpc_last_error());
            continue;
        }
        for (int r = -3; r < reps; r++) {
            CHECK(cuda->event_record(e0, NULL));
            CHECK(gpc_op_attention_forward(&out, &lse, &qkv, NH));
            CHECK(cuda->event_record(e1, NULL));
            float ms;
            CHECK(cuda->event_elapsed_ms(e0, e1, &ms));
            if (r >= 0) fwd[r] = ms;
            CHECK(cuda->event_record(e0, NULL));
            CHECK(gpc_op_attention_backward(&dqkv, &dout, &qkv, &out, &lse, NH));
            CHECK(cuda->event_record(e1, NULL));
            CHECK(cuda->event_elapsed_ms(e0, e1, &ms));
            if (r >= 0) bwd[r] = ms;
        }
        qsort(fwd, reps, sizeof(float), bench_cmp_float);
        qsort(bwd, reps, sizeof(float), bench_cmp_float);
        float mf = fwd[reps / 2], mb = bwd[reps / 2];
        total[k] = mf + mb;
        printf("RESULT %s_attention B=%d T=%d NH=%d hs=%d %s fwd_ms=%.3f bwd_ms=%.3f "
               "fwdbwd_ms=%.3f fwd_tflops=%.1f bwd_tflops=%.1f fwdbwd_tflops=%.1f",
               strcmp(paths[k], "cudnn") ? "gpc" : "cudnn", B, T, NH, hs, precision, mf, mb,
               mf + mb, f / (mf * 1e9), 2.5 * f / (mb * 1e9), 3.5 * f / ((mf + mb) * 1e9));
#ifdef GPC_HAVE_CUDA /* a build without CUDA has no cuDNN path to describe */
        if (!strcmp(paths[k], "cudnn")) {
            gpc_cudnn_attention_stats stats;
            gpc_cudnn_attention_get_stats(&stats);
            printf(" cudnn=%ld workspace_mib=%.1f", gpc_cudnn_attention_version(),
                   stats.workspace_bytes / 1048576.0);
        }
#endif
        printf("\n");
        if (energy_s > 0) {
            const char *name = strcmp(paths[k], "cudnn") ? "gpc" : "cudnn";
            char label[32];
            snprintf(label, sizeof label, "%s_forward", name);
            if (bench_energy_sustain(PROG, cuda, nvml, run_forward, &call, energy_s,
                                     "attention_energy", label, f))
                return 1;
            snprintf(label, sizeof label, "%s_backward", name);
            if (bench_energy_sustain(PROG, cuda, nvml, run_backward, &call, energy_s,
                                     "attention_energy", label, 2.5 * f))
                return 1;
        }
    }
    if (nvml) gpc_nvml_close(nvml);
    if (total[0] > 0 && total[1] > 0)
        printf("RESULT attention_paths B=%d T=%d gpc_fwdbwd_ms=%.3f cudnn_fwdbwd_ms=%.3f "
               "gpc_over_cudnn=%.3f\n",
               B, T, total[0], total[1], total[0] / total[1]);
    gpc_op_set_attention_path(NULL);
    return 0;
}
