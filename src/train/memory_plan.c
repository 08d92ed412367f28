/*
 * memory_plan.c: the memory a GPT training run needs per GPU (gpc/plan.h).
 *
 * The buffer list mirrors gpt_create (include/gpc/model.h): one flat buffer
 * each for parameters, master copy, gradients, m and v; the activations of
 * gpt_activations (per-layer tensors carry L as their first dimension); the
 * backward scratch. Every buffer is rounded up to the arena's 256-byte
 * alignment, as gpc_arena_tensor places it. Recomputation follows llm.c: with
 * recompute 1 the GELU output is rebuilt from its input in the backward pass,
 * so one layer's worth of it is kept instead of L; with recompute 2 the two
 * layernorm outputs of each block are rebuilt the same way (their mean and
 * rstd, small, stay); with block recomputation everything inside a block is
 * rebuilt from the block's input, so only the residual stream between blocks
 * stays per layer. A block count N applies the level to the first N blocks:
 * those share one slot, the other L - N keep theirs. With the optimizer
 * offloaded, master, m and v move to pinned host memory, beside a host
 * copy of the gradients and of the weights (gpc/optim.h).
 */
#include "gpc/plan.h"
#include "gpc/model.h"
#include "ops/ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PLAN_ALIGN 256ull /* gpc_arena's alignment (src/core/memory.c) */

static uint64_t align_up(uint64_t bytes) {
    return (bytes + PLAN_ALIGN - 1) & ~(PLAN_ALIGN - 1);
}

/* One buffer of count elements of size bytes each, as the arena places it. */
static uint64_t buffer(uint64_t count, uint64_t size) {
    return align_up(count * size);
}

void gpc_plan_defaults(gpc_plan_input *in) {
    memset(in, 0, sizeof *in);
    in->layers = 12;
    in->heads = 12;
    in->channels = 768;
    in->context = 1024;
    in->batch = 4;
    in->vocab = 50257;
    in->dtype = GPC_BF16;
    in->gpus = 1;
    in->tp = 1;
    in->pp = 1;
    in->cuda = 1;
}

gpc_status gpc_plan_parse_model(const char *name, gpc_plan_input *in) {
    char *end = NULL;
    long depth = 0;
    if (name && name[0] == 'd') depth = strtol(name + 1, &end, 10);
    if (!name || name[0] != 'd' || end == name + 1 || *end || depth < 1 || depth > 256)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "model '%s' is not of the form dN (N layers, N heads, 64*N channels; "
                         "d12 is GPT-2 124M), N from 1 to 256",
                         name ? name : "");
    /* the model's own rule, GPT-2's sizes at d24, d36 and d48 */
    return gpt_config_parse_depth(name, &in->layers, &in->heads, &in->channels);
}

static gpc_status check_input(const gpc_plan_input *in) {
    if (in->layers < 1 || in->heads < 1 || in->channels < 1 || in->channels % in->heads)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "model shape %d layers, %d heads, %d channels is not valid: channels "
                         "must be a positive multiple of heads",
                         in->layers, in->heads, in->channels);
    if (in->context < 1 || in->context > (1 << 20))
        return gpc_error(GPC_ERR_INVALID_ARG, "--context %d is out of range: use 1 to 1048576",
                         in->context);
    if (in->batch < 0 || in->batch > (1 << 20))
        return gpc_error(GPC_ERR_INVALID_ARG, "--batch %d is out of range: use 1 to 1048576",
                         in->batch);
    if (in->vocab < 2)
        return gpc_error(GPC_ERR_INVALID_ARG, "--vocab %d is too small: use at least 2", in->vocab);
    if (in->dtype != GPC_F32 && in->dtype != GPC_BF16 && in->dtype != GPC_F16)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "precision %s cannot be trained: use bf16, f16 or fp32",
                         gpc_dtype_name(in->dtype));
    GPC_TRY(gpt_recompute_check(in->recompute, in->layers));
    if (in->zero != 0 && in->zero != 1)
        return gpc_error(GPC_ERR_INVALID_ARG, "--zero %d is not 0 or 1 (ZeRO stage 1)", in->zero);
    if (in->gpus < 1 || in->gpus > 4096)
        return gpc_error(GPC_ERR_INVALID_ARG, "--gpus %d is out of range: use 1 to 4096", in->gpus);
    int tp = in->tp > 0 ? in->tp : 1, pp = in->pp > 0 ? in->pp : 1;
    if (in->heads % tp)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--tp %d does not divide the model's %d attention heads: pick a tp "
                         "that divides %d",
                         tp, in->heads, in->heads);
    if (in->layers % pp)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--pp %d does not divide the model's %d layers: pick a pp that divides "
                         "%d",
                         pp, in->layers, in->layers);
    if (in->gpus % (tp * pp))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--gpus %d is not a multiple of --tp %d x --pp %d = %d: each "
                         "data-parallel copy needs tp x pp GPUs",
                         in->gpus, tp, pp, tp * pp);
    if (pp > 1 && (in->recompute >> 2) > in->layers / pp)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--recompute-layers %d is more than a pipeline stage's %d blocks (%d "
                         "layers over --pp %d): under --pp it counts each stage's blocks; give 1 "
                         "to %d (or 0 for all)",
                         in->recompute >> 2, in->layers / pp, in->layers, pp, in->layers / pp);
    if (in->lora_rank && tp * pp > 1)
        return gpc_error(GPC_ERR_INVALID_ARG, "--lora trains on one GPU; leave out --tp and --pp");
    if (in->offload && (in->zero || in->gpus != 1 || tp * pp > 1 || in->lora_rank))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--offload-optimizer plans one GPU training a whole model: leave out "
                         "--gpus, --zero, --tp, --pp and --lora");
    if (in->offload != 0 && in->offload != 1)
        return gpc_error(GPC_ERR_INVALID_ARG, "offload %d is not 0 or 1", in->offload);
    if (in->lora_rank < 0 || in->lora_rank > in->channels)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--lora %d is out of range: use 0 (full fine-tuning) to %d (channels)",
                         in->lora_rank, in->channels);
    return GPC_OK;
}

/* Slots of a per-layer activation that recomputation level `level` drops:
 * one shared by the recomputed blocks, one per kept block (gpt.c's
 * kept_slots), in a pipeline stage's L/pp layers. */
static uint64_t kept_slots(const gpc_plan_input *in, int level) {
    int L = in->layers / (in->pp > 0 ? in->pp : 1);
    int n =
        gpt_recompute_level(in->recompute) >= level ? gpt_recompute_layers(in->recompute, L) : 0;
    return (uint64_t)(n ? L - n + 1 : L);
}

/* Everything but per_sample. */
static void plan_bytes(const gpc_plan_input *in, gpc_plan_result *out) {
    memset(out, 0, sizeof *out);
    /* a part: L/pp layers, and the attention heads, MLP units and
     * vocabulary rows of one of tp slices (the first pipeline stage, which
     * holds the most) */
    const uint64_t tp = in->tp > 0 ? (uint64_t)in->tp : 1, pp = in->pp > 0 ? (uint64_t)in->pp : 1;
    const uint64_t dp = (uint64_t)in->gpus / (tp * pp);
    const uint64_t L = (uint64_t)in->layers / pp, NH = (uint64_t)in->heads / tp;
    const uint64_t C = (uint64_t)in->channels, T = (uint64_t)in->context;
    const uint64_t Cl = C / tp, F = 4 * C / tp, slots = pp;
    const uint64_t B = (uint64_t)in->batch, R = (uint64_t)in->lora_rank;
    const uint64_t Vp = ((uint64_t)in->vocab + 63) / 64 * 64;
    const uint64_t s = gpc_dtype_size(in->dtype); /* compute dtype */
    const uint64_t f32 = 4, BT = B * T;
    const int low_precision = in->dtype != GPC_F32;

    /* Parameters, llm.c's layout: wte Vp*C, wpe T*C, per layer
     * ln1 2C + qkv 3C*C+3C + attproj C*C+C + ln2 2C + fc 4C*C+4C + fcproj 4C*C+C
     * = 12C^2 + 13C, and lnf 2C. A tp slice holds 1/tp of the four matrices
     * and of the qkv and fc biases: 12C^2/tp + 7C/tp + 6C, and about Vp/tp
     * rows of wte (gpt_tp_vocab_rows: the vocabulary-parallel embedding and
     * head), so wte's gradient and AdamW state are 1/tp too. */
    gpt_config vocab = {.padded_vocab = (int)Vp};
    const uint64_t Vl = (uint64_t)gpt_tp_vocab_rows(&vocab, (int)tp);
    uint64_t base = Vl * C + T * C + L * (12 * C * Cl + 7 * Cl + 6 * C) + 2 * C;
    /* LoRA adapters A [R, in] and B [out, R] on qkv (C->3C), attproj (C->C),
     * fc (C->4C) and fcproj (4C->C): R*(4C + 2C + 5C + 5C) = 16RC per layer. */
    uint64_t adapters = R ? L * 16 * R * C : 0;
    out->num_params = base + adapters;
    out->trainable = R ? adapters : base;

    out->parameters = buffer(base, s) + (R ? buffer(adapters, s) : 0);
    out->gradients = buffer(out->trainable, s);
    /* ZeRO-1 gives each GPU 1/gpus of the optimizer state and master copy,
     * cut as gpc_dist_shard_offsets cuts it (align 64): the first shards
     * are the largest, and they are what a GPU must hold. */
    uint64_t shard = out->trainable;
    if (in->zero) {
        uint64_t chunk = (out->trainable + dp - 1) / dp;
        chunk = (chunk + 63) / 64 * 64;
        if (chunk < shard) shard = chunk;
    }
    out->optimizer = 2 * buffer(shard, f32) + (low_precision ? buffer(shard, f32) : 0);
    out->optimizer_unsharded =
        2 * buffer(out->trainable, f32) + (low_precision ? buffer(out->trainable, f32) : 0);
    if (in->offload) {
        /* gpc_optim's one pinned block: the state, a host copy of the
         * gradients and of the weights (compute dtype), and the norm */
        out->host_pinned = out->optimizer + 2 * buffer(out->trainable, s) + 256;
        out->optimizer = out->optimizer_unsharded = 0; /* nothing on the device to shard */
    }

    /* gpt_activations, in its order, once per micro-batch in flight. The
     * recomputed layers of a level share one slot; the others keep theirs. */
    uint64_t kept_gelu = kept_slots(in, 1), kept_ln = kept_slots(in, 2), kept = kept_slots(in, 3);
    uint64_t a = 0;
    a += buffer(BT * C, s);              /* encoded */
    a += buffer(kept_ln * BT * C, s);    /* ln1 */
    a += 2 * buffer(kept * BT, f32);     /* ln1_mean, ln1_rstd */
    a += buffer(kept * BT * 3 * Cl, s);  /* qkv */
    a += buffer(kept * BT * Cl, s);      /* atty */
    a += buffer(kept * B * NH * T, f32); /* lse */
    a += buffer(kept * BT * C, s);       /* residual2 */
    a += buffer(kept_ln * BT * C, s);    /* ln2 */
    a += 2 * buffer(kept * BT, f32);     /* ln2_mean, ln2_rstd */
    a += buffer(kept * BT * F, s);       /* fch */
    a += buffer(kept_gelu * BT * F, s);  /* fch_gelu */
    a += buffer(L * BT * C, s);          /* residual3 */
    a += buffer(BT * C, s);              /* lnf */
    a += 2 * buffer(BT, f32);            /* lnf_mean, lnf_rstd */
    a += 2 * buffer(BT, 4);              /* tokens, targets (i32) */
    a *= slots;
    a += buffer(BT, f32);                  /* losses, one for every slot */
    if (R) a += 4 * buffer(L * BT * R, s); /* the four adapters' down-projections */
    out->activations = a;

    out->backward = 2 * buffer(BT * C, s) /* dresidual, dbtc */
                    + buffer(BT * F, s)   /* dbt4c, also dqkv */
                    + buffer(2, f32);     /* norm_sq and loss_sum, one buffer */
    /* LoRA's backward scratch (gpt.c): the down-projection's gradient, the
     * adapter's part of its input's gradient (4C wide for fcproj), and the
     * frozen layernorms' discarded parameter gradients */
    if (R) out->backward += buffer(BT * R, s) + buffer(BT * 4 * C, s) + buffer(2 * C, s);

    /* On the GPU in bf16/f16, attention auto runs cuDNN's fused attention
     * where it can (Hopper and newer), whose backward adds dQ into an f32
     * [B, NH, T, hs] accumulator: counted for every GPU, so a plan errs by
     * that much on the safe side where cuDNN's backward does not run (an
     * older GPU; bf16 at head size 64 and T a multiple of 128 on compute
     * capability 9.0, where gpc's wgmma backward takes its place). */
    uint64_t hs = (uint64_t)(Cl / NH); /* NH: this slice's heads, Cl their channels */
    uint64_t cudnn =
        in->cuda && in->dtype != GPC_F32 && gpc_attention_cudnn_head_size_ok((int64_t)hs)
            ? buffer(BT * Cl, f32)
            : 0;
    /* the logits of this rank's vocabulary rows; under tp also the
     * cross-entropy's row statistics [3, BT] and one row gathered from the
     * ranks for sampling (gpt.c's ce_stats and logits_full) */
    out->workspace = buffer(BT * Vl, s) + (in->cuda ? GPC_PLAN_CUBLASLT_WORKSPACE : 0) + cudnn;
    if (tp > 1) out->workspace += buffer(3 * BT, f32) + buffer(tp * Vl, s);
    out->context = in->cuda ? GPC_PLAN_CUDA_CONTEXT : 0;
    out->total = out->parameters + out->gradients + out->optimizer + out->activations +
                 out->backward + out->workspace + out->context;
}

gpc_status gpc_plan_compute(const gpc_plan_input *in, gpc_plan_result *out) {
    memset(out, 0, sizeof *out);
    GPC_TRY(check_input(in));
    plan_bytes(in, out);
    /* Every batch-dependent buffer is linear in B (up to alignment), so what
     * one more sequence adds is the total at B = 1 less the total at B = 0. */
    gpc_plan_input probe = *in;
    gpc_plan_result r0, r1;
    probe.batch = 0;
    plan_bytes(&probe, &r0);
    probe.batch = 1;
    plan_bytes(&probe, &r1);
    out->per_sample = r1.total - r0.total;
    return GPC_OK;
}

static const gpc_plan_gpu plan_gpus[] = {
    /* Memory as nvidia-smi reports it (MiB), which is what a process can ask for. */
    {"RTX 3060 12GB", 12288ull << 20}, {"RTX 3090 24GB", 24576ull << 20},
    {"RTX 4090 24GB", 24564ull << 20}, {"A100 40GB", 40960ull << 20},
    {"A100 80GB", 81920ull << 20},     {"H100 80GB", 81559ull << 20},
    {"H200 141GB", 143771ull << 20},
};

const gpc_plan_gpu *gpc_plan_gpus(int *count) {
    *count = (int)(sizeof plan_gpus / sizeof plan_gpus[0]);
    return plan_gpus;
}

int gpc_plan_max_batch(const gpc_plan_input *in, uint64_t bytes) {
    /* The total is nondecreasing in B: binary search the last B that fits. */
    gpc_plan_input probe = *in;
    gpc_plan_result r;
    int lo = 0, hi = 1 << 20;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        probe.batch = mid;
        if (gpc_plan_compute(&probe, &r) == GPC_OK && r.total <= bytes)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

gpc_status gpc_plan_write_json(const char *path, const char *model, const gpc_plan_input *in,
                               const gpc_plan_result *r) {
    FILE *f = fopen(path, "w");
    if (!f) return gpc_error(GPC_ERR_IO, "cannot write %s: check the directory exists", path);
    fprintf(f,
            "{\"model\": \"%s\", \"layers\": %d, \"heads\": %d, \"channels\": %d, "
            "\"context\": %d, \"batch\": %d, \"vocab\": %d, \"precision\": \"%s\", "
            "\"recompute\": %d, \"recompute_layers\": %d, \"zero\": %d, \"gpus\": %d, "
            "\"lora\": %d, \"offload_optimizer\": %d, \"device\": \"%s\",\n",
            model, in->layers, in->heads, in->channels, in->context, in->batch, in->vocab,
            gpc_dtype_name(in->dtype), gpt_recompute_level(in->recompute),
            gpt_recompute_layers(in->recompute, in->layers), in->zero, in->gpus, in->lora_rank,
            in->offload, in->cuda ? "cuda" : "cpu");
    fprintf(f,
            " \"num_params\": %llu, \"trainable\": %llu, \"parameters\": %llu, \"gradients\": "
            "%llu, \"optimizer\": %llu, \"optimizer_unsharded\": %llu, \"activations\": %llu, "
            "\"backward\": %llu, \"workspace\": %llu, \"context_overhead\": %llu, \"total\": "
            "%llu, \"per_sample\": %llu, \"host_pinned\": %llu,\n \"gpus_fit\": [",
            (unsigned long long)r->num_params, (unsigned long long)r->trainable,
            (unsigned long long)r->parameters, (unsigned long long)r->gradients,
            (unsigned long long)r->optimizer, (unsigned long long)r->optimizer_unsharded,
            (unsigned long long)r->activations, (unsigned long long)r->backward,
            (unsigned long long)r->workspace, (unsigned long long)r->context,
            (unsigned long long)r->total, (unsigned long long)r->per_sample,
            (unsigned long long)r->host_pinned);
    int count;
    const gpc_plan_gpu *gpus = gpc_plan_gpus(&count);
    for (int i = 0; i < count; i++)
        fprintf(f, "%s{\"gpu\": \"%s\", \"bytes\": %llu, \"fits\": %s, \"max_batch\": %d}",
                i ? ", " : "", gpus[i].name, (unsigned long long)gpus[i].bytes,
                r->total <= gpus[i].bytes ? "true" : "false",
                gpc_plan_max_batch(in, gpus[i].bytes));
    fprintf(f, "]}\n");
    if (fclose(f) != 0) return gpc_error(GPC_ERR_IO, "cannot finish writing %s", path);
    return GPC_OK;
}
