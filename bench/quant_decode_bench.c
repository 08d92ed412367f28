/*
 * quant_decode_bench.c: decode tokens/s of GPT-2's shapes (random weights,
 * vocabulary 50257, one stream) with bf16 weights and with int8 and fp8
 * weights, each 8-bit model once with the skinny kernel and once with the
 * earlier kernels (gpc_cuda_quant_set_gemv_max_rows 16 and 0), in one
 * process. A step is what gpc sample runs for a token: gpt_forward_cached
 * on one position over the kept keys and values, the logits copied to the
 * host, and a token drawn there (temperature 1, every token).
 *
 * For each model (--models, default d12,d36) and variant it decodes
 * --tokens tokens (default 256) after 16 warm-up steps, from one
 * end-of-text token, every variant with the same random stream, and prints
 *
 *   RESULT quant_decode model=dN weights=NAME path=PATH tokens_per_s=...
 *     step_ms=... forward_ms=... speedup=... same_tokens=...
 *
 * step_ms is a whole step; forward_ms its gpt_forward_cached part (the
 * host's draw excluded); speedup is tokens/s over bf16's; same_tokens is
 * how many tokens the text shares from its start with the skinny kernel's
 * text of the same weights (the earlier kernels round in another order, so
 * a near tie may draw another token, and the texts part there).
 *
 * The 8-bit models quantize the bf16 model's weights (per channel; fp8t:
 * per tensor). The tied head stays bf16 in every variant, as in quant.bin.
 *
 *   bench_quant_decode_bench [--models d12,d36] [--tokens 256] [--device cuda]
 *
 * --device cpu runs the same steps on the CPU in f32 (weights=bf16 is then
 * f32, and the two paths are one): a check of the benchmark itself.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "gpc/model.h"
#include "gpc/serve.h"

#define PROG "bench_quant_decode_bench"
#define VOCAB 50257
#define CONTEXT 1024
#define WARMUP 16

#ifndef GPC_HAVE_CUDA
int main(void) {
    fprintf(stderr, "%s: gpc was built without CUDA; this benchmark times GPU decoding\n", PROG);
    return 1;
}
#else
#include "cuda/quant.h"

#define CHECK(x) BENCH_TRY(PROG, x)

typedef struct {
    const char *name, *path;
    gpc_dtype dtype; /* of the block weights: BF16 for the plain model */
    int per_channel, skinny;
} variant;

static const variant variants[] = {
    {"bf16", "bf16", GPC_BF16, 0, 0},      {"int8", "skinny", GPC_I8, 1, 1},
    {"int8", "earlier", GPC_I8, 1, 0},     {"fp8", "skinny", GPC_F8E4M3, 1, 1},
    {"fp8", "earlier", GPC_F8E4M3, 1, 0},  {"fp8t", "skinny", GPC_F8E4M3, 0, 1},
    {"fp8t", "earlier", GPC_F8E4M3, 0, 0},
};

/* Decodes `tokens` tokens after WARMUP steps; tokens drawn into out. */
static gpc_status decode(gpt_model *m, int tokens, float *logits, void *scratch, uint32_t *out,
                         double *step_s, double *forward_s) {
    gpc_rng rng;
    gpc_rng_seed(&rng, 29, 3);
    int32_t tok = VOCAB - 1; /* GPT-2's end-of-text */
    GPC_TRY(gpt_forward_cached(m, &tok, 0, 1, logits));
    double fwd = 0, t0 = 0;
    for (int step = 0; step < WARMUP + tokens; step++) {
        if (step == WARMUP) fwd = 0, t0 = gpc_time_seconds();
        uint32_t next = gpc_sample_token(logits, VOCAB, 1.0f, 0, 1.0f, &rng, scratch);
        if (step >= WARMUP) out[step - WARMUP] = next;
        tok = (int32_t)next;
        double f0 = gpc_time_seconds();
        GPC_TRY(gpt_forward_cached(m, &tok, step + 1, 1, logits));
        fwd += gpc_time_seconds() - f0;
    }
    *step_s = (gpc_time_seconds() - t0) / tokens;
    *forward_s = fwd / tokens;
    return GPC_OK;
}

/* Parses "d12,d36" into names[]; returns the count, 0 on a bad list. */
static int parse_models(char *text, char **names, int max) {
    int n = 0;
    for (char *p = strtok(text, ","); p && n < max; p = strtok(NULL, ",")) {
        int l, h, c;
        if (gpt_config_parse_depth(p, &l, &h, &c) != GPC_OK) return 0;
        names[n++] = p;
    }
    return n;
}

int main(int argc, char **argv) {
    char models_text[256] = "d12,d36";
    int64_t tokens = 256;
    const char *device_name = "cuda";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = v != NULL;
        if (ok && strcmp(a, "--models") == 0)
            ok = strlen(v) < sizeof models_text &&
                 snprintf(models_text, sizeof models_text, "%s", v);
        else if (ok && strcmp(a, "--device") == 0)
            ok = strcmp(v, "cuda") == 0 || strcmp(v, "cpu") == 0, device_name = v;
        else if (ok && strcmp(a, "--tokens") == 0)
            ok = bench_parse_int64(PROG, a, v, 1, CONTEXT - WARMUP - 2, &tokens);
        else
            ok = 0;
        if (!ok) {
            fprintf(stderr,
                    "usage: %s [--models d12,d36] [--tokens 256 (1 to %d)] [--device cuda|cpu]\n",
                    PROG, CONTEXT - WARMUP - 2);
            return 2;
        }
        i++;
    }
    char *names[8];
    int n_models = parse_models(models_text, names, 8);
    if (!n_models) {
        fprintf(stderr, "%s: --models needs a list such as d12,d36: %s\n", PROG, gpc_last_error());
        return 2;
    }
    int on_cpu = strcmp(device_name, "cpu") == 0;
    if (!on_cpu && !bench_cuda(PROG)) return 1;
    gpc_device dev = on_cpu ? gpc_cpu() : (gpc_device){GPC_DEVICE_CUDA, 0};
    gpc_dtype act = on_cpu ? GPC_F32 : GPC_BF16;
    float *logits = malloc(sizeof(float) * VOCAB);
    void *scratch = malloc((size_t)VOCAB * 8);
    uint32_t *drawn = malloc(sizeof(uint32_t) * (size_t)tokens);
    uint32_t *skinny_drawn = malloc(sizeof(uint32_t) * (size_t)tokens);
    if (!logits || !scratch || !drawn || !skinny_drawn) return 1;
    for (int mi = 0; mi < n_models; mi++) {
        int L, H, C;
        CHECK(gpt_config_parse_depth(names[mi], &L, &H, &C));
        gpt_config c;
        CHECK(gpt_config_init(&c, L, H, C, CONTEXT, VOCAB));
        size_t P = gpt_config_num_params(&c);
        float *w = malloc(P * sizeof(float));
        if (!w) {
            fprintf(stderr, "%s: out of host memory for %s's weights\n", PROG, names[mi]);
            return 1;
        }
        double base = 0;
        gpt_model *m = NULL; /* kept for the next variant of the same weights */
        for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
            const variant *var = &variants[v];
            if (m && (var->dtype != variants[v - 1].dtype ||
                      var->per_channel != variants[v - 1].per_channel)) {
                gpt_free(m);
                m = NULL;
            }
            if (m) {
                /* the same weights, the other path */
            } else if (var->dtype == GPC_BF16) {
                CHECK(gpt_create(&m, &c, dev, act, 1, CONTEXT, 0));
                CHECK(gpt_init_weights(m, 1234));
                CHECK(gpt_get_params(m, w)); /* the bf16 values, for the 8-bit models */
            } else {
                gpt_quant_options q = {var->dtype, var->per_channel};
                CHECK(gpt_create_quant(&m, &c, dev, act, 1, CONTEXT, &q));
                CHECK(gpt_set_params(m, w));
            }
            int before = gpc_cuda_quant_set_gemv_max_rows(var->skinny ? 16 : 0);
            double step_s, forward_s;
            CHECK(decode(m, (int)tokens, logits, scratch, drawn, &step_s, &forward_s));
            gpc_cuda_quant_set_gemv_max_rows(before);
            if (var->skinny) memcpy(skinny_drawn, drawn, sizeof(uint32_t) * (size_t)tokens);
            int same = 0;
            while (same < tokens && drawn[same] == skinny_drawn[same])
                same++;
            double rate = 1.0 / step_s;
            if (var->dtype == GPC_BF16) base = rate;
            printf("RESULT quant_decode model=%s weights=%s path=%s tokens_per_s=%.1f "
                   "step_ms=%.3f forward_ms=%.3f speedup=%.2f same_tokens=",
                   names[mi], var->name, var->path, rate, 1e3 * step_s, 1e3 * forward_s,
                   base > 0 ? rate / base : 0.0);
            if (var->dtype == GPC_BF16)
                printf("-\n");
            else
                printf("%d/%lld\n", same, (long long)tokens);
            fflush(stdout);
        }
        gpt_free(m);
        free(w);
    }
    free(logits), free(scratch), free(drawn), free(skinny_drawn);
    return 0;
}
#endif /* GPC_HAVE_CUDA */
