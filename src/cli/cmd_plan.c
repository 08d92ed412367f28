/*
 * cmd_plan.c: `gpc plan`, the memory a training run needs per GPU and which
 * common GPUs fit it, with the largest micro-batch each can take. The memory
 * model is the library's (gpc/plan.h); this file parses and prints.
 */
#include "cli/cli.h"
#include "gpc/model.h"
#include "gpc/plan.h"

#include <stdio.h>
#include <string.h>

static void row(const char *what, uint64_t bytes) {
    char human[32];
    printf("  %-34s %16llu  %10s\n", what, (unsigned long long)bytes,
           cli_format_bytes((double)bytes, human, sizeof human));
}

/* An offloaded GPU run's host memory at start (the pinned state, where
 * fresh weights are drawn and a checkpoint's are read) against what this
 * machine has free now: gpc train refuses a run that does not fit. */
static void print_offload_host(const gpc_plan_result *r) {
    char need[32], have[32];
    uint64_t bytes = r->host_pinned;
    size_t avail = gpc_host_memory_available();
    printf("  host memory to start (the pinned state, where the weights start): %s",
           cli_format_bytes((double)bytes, need, sizeof need));
    if (avail)
        printf("; this machine has %s free: %s\n",
               cli_format_bytes((double)avail, have, sizeof have),
               bytes <= avail ? "fits" : "does not fit (gpc train refuses it)");
    else
        printf("\n");
}

/* Every layout of tp x pp that divides the model and the GPUs, with its
 * memory per GPU and the smallest listed GPU it fits. */
static void print_layouts(const gpc_plan_input *base) {
    int count;
    const gpc_plan_gpu *table = gpc_plan_gpus(&count);
    printf("\n  layouts on %d GPUs (tp x pp x dp; the first stage holds the most):\n", base->gpus);
    printf("  %-4s %-4s %-4s %12s  %s\n", "tp", "pp", "dp", "per GPU", "smallest GPU that fits");
    for (int tp = 1; tp <= base->gpus; tp++) {
        for (int pp = 1; pp <= base->gpus / tp; pp++) {
            if (base->gpus % (tp * pp) || base->heads % tp || base->layers % pp) continue;
            gpc_plan_input in = *base;
            in.tp = tp, in.pp = pp;
            gpc_plan_result r;
            if (gpc_plan_compute(&in, &r) != GPC_OK) {
                gpc_clear_error();
                continue;
            }
            const char *fits = "none listed";
            uint64_t best = 0;
            for (int i = 0; i < count; i++)
                if (r.total <= table[i].bytes && (!best || table[i].bytes < best))
                    best = table[i].bytes, fits = table[i].name;
            char human[32];
            printf("  %-4d %-4d %-4d %12s  %s\n", tp, pp, base->gpus / (tp * pp),
                   cli_format_bytes((double)r.total, human, sizeof human), fits);
        }
    }
}

/* Each recomputation mode over all blocks beside the one asked for: what
 * activations and the total come to, and the largest micro-batch on an
 * H200, so memory can be traded for speed knowingly. */
static void recompute_table(const gpc_plan_input *in) {
    int count;
    const gpc_plan_gpu *gpus = gpc_plan_gpus(&count);
    const gpc_plan_gpu *largest = &gpus[count - 1];
    char human[32], total[32], mode[32];
    printf("  %-16s %12s %12s  largest micro-batch on %s\n", "recompute", "activations", "total",
           largest->name);
    for (int level = 0; level <= GPT_RECOMPUTE_BLOCK; level++) {
        gpc_plan_input probe = *in;
        probe.recompute = level;
        gpc_plan_result r;
        if (gpc_plan_compute(&probe, &r) != GPC_OK) {
            gpc_clear_error();
            continue;
        }
        printf("  %-16s %12s %12s  %d\n", gpt_recompute_name(level, mode, sizeof mode),
               cli_format_bytes((double)r.activations, human, sizeof human),
               cli_format_bytes((double)r.total, total, sizeof total),
               gpc_plan_max_batch(&probe, largest->bytes));
    }
    printf("\n");
}

int cmd_plan(int argc, char **argv) {
    const char *model = NULL, *precision = "bf16", *device = "cuda", *json = NULL;
    const char *recompute_name = "0";
    int context = 1024, batch = 4, zero = 0, gpus = 1, lora = 0, vocab = 50257;
    int recompute_layers = 0, tp = 1, pp = 1, layers = 0, heads = 0, channels = 0;
    int offload = 0;
    const cli_option options[] = {
        {"model", CLI_STRING, &model, "dN",
         "model: dN = N layers, N heads, 64N channels; d24, d36, d48 GPT-2's 350M, 774M, "
         "1.5B (required)"},
        {"context", CLI_INT, &context, "T", "sequence length (default 1024)"},
        {"batch", CLI_INT, &batch, "B", "micro-batch per GPU (default 4)"},
        {"precision", CLI_STRING, &precision, "P", "bf16, f16 or fp32 (default bf16)"},
        {"recompute", CLI_STRING, &recompute_name, "MODE",
         "0 keep activations, 1 (gelu) recompute GELU, 2 (layernorm) also layernorm, block "
         "whole blocks from their input (default 0)"},
        {"recompute-layers", CLI_INT, &recompute_layers, "N",
         "apply --recompute to the first N blocks only (default 0: all)"},
        {"zero", CLI_INT, &zero, "0|1", "1 shards optimizer state over the GPUs (default 0)"},
        {"layers", CLI_INT, &layers, "L", "override the model's layers"},
        {"heads", CLI_INT, &heads, "H", "override the model's attention heads"},
        {"channels", CLI_INT, &channels, "C", "override the model's channels"},
        {"gpus", CLI_INT, &gpus, "N",
         "GPUs: N / (tp x pp) data-parallel copies (default 1); above 1, every layout of "
         "--tp and --pp over them is listed too"},
        {"tp", CLI_INT, &tp, "T",
         "tensor parallelism: heads, MLP units and vocabulary over T GPUs (default 1)"},
        {"pp", CLI_INT, &pp, "P", "pipeline parallelism: layers in P stages (default 1)"},
        {"lora", CLI_INT, &lora, "R", "LoRA rank; 0 trains every weight (default 0)"},
        {"offload-optimizer", CLI_FLAG, &offload, NULL,
         "master weights and AdamW moments in pinned host memory (gpc train's option)"},
        {"vocab", CLI_INT, &vocab, "V", "vocabulary size (default 50257)"},
        {"device", CLI_STRING, &device, "D",
         "cuda or cpu (cpu leaves out CUDA's share; default cuda)"},
        {"json", CLI_STRING, &json, "FILE", "also write the plan as JSON"},
        {0},
    };
    const cli_spec spec = {
        "plan",
        "plan --model dN [--context T] [--batch B] [--precision bf16|fp32] ...",
        "Prints the memory a training run needs per GPU (parameters, gradients, optimizer "
        "state, activations, workspace, CUDA context) and which common GPUs fit it, with the "
        "largest micro-batch each can take.",
        options,
        0,
        NULL,
        NULL};
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    if (!model) return cli_usage_error("plan", "--model is required, e.g. --model d12");

    gpc_plan_input in;
    gpc_plan_defaults(&in);
    gpc_status st = gpc_plan_parse_model(model, &in);
    if (st) return cli_fail("plan", st);
    if (layers > 0) in.layers = layers;
    if (heads > 0) in.heads = heads;
    if (channels > 0) in.channels = channels;
    if (strcmp(precision, "fp32") == 0 || strcmp(precision, "f32") == 0)
        in.dtype = GPC_F32;
    else if (strcmp(precision, "bf16") == 0)
        in.dtype = GPC_BF16;
    else if (strcmp(precision, "f16") == 0 || strcmp(precision, "fp16") == 0)
        in.dtype = GPC_F16;
    else
        return cli_usage_error("plan", "--precision %s is not bf16, f16 or fp32", precision);
    if (strcmp(device, "cuda") == 0)
        in.cuda = 1;
    else if (strcmp(device, "cpu") == 0)
        in.cuda = 0;
    else
        return cli_usage_error("plan", "--device %s is not cuda or cpu", device);
    if (batch < 1) return cli_usage_error("plan", "--batch %d must be at least 1", batch);
    in.context = context;
    in.batch = batch;
    int recompute;
    if (gpt_recompute_parse(recompute_name, &recompute) != GPC_OK)
        return cli_usage_error("plan", "%s", gpc_last_error());
    if (recompute_layers < 0 || (recompute_layers && !gpt_recompute_level(recompute)))
        return cli_usage_error("plan",
                               "--recompute-layers %d needs a --recompute mode and 1 or "
                               "more blocks",
                               recompute_layers);
    if (recompute_layers)
        recompute = GPT_RECOMPUTE(gpt_recompute_level(recompute), recompute_layers);
    in.recompute = recompute;
    in.zero = zero;
    in.gpus = gpus;
    in.tp = tp;
    in.pp = pp;
    if (tp < 1 || pp < 1) return cli_usage_error("plan", "--tp and --pp must be 1 or more");
    in.lora_rank = lora;
    in.offload = offload;
    in.vocab = vocab;

    gpc_plan_result r;
    st = gpc_plan_compute(&in, &r);
    if (st) return cli_fail("plan", st);

    char human[32];
    printf("gpc plan: %s (%d layers, %d heads, %d channels), %llu parameters (%.1fM)\n", model,
           in.layers, in.heads, in.channels, (unsigned long long)r.num_params, r.num_params / 1e6);
    char mode[32];
    printf("  context %d, micro-batch %d, %s, recompute %s, zero %d, %d GPU%s (tp %d x pp %d x "
           "dp %d), lora %d, vocab %d, device %s\n\n",
           in.context, in.batch, gpc_dtype_name(in.dtype),
           gpt_recompute_name(in.recompute, mode, sizeof mode), in.zero, in.gpus,
           in.gpus == 1 ? "" : "s", tp, pp, in.gpus / (tp * pp), in.lora_rank, in.vocab,
           in.cuda ? "cuda" : "cpu");
    printf("  %-34s %16s  %10s\n", tp * pp > 1 ? "memory per GPU (first stage)" : "memory per GPU",
           "bytes", "");
    row("parameters", r.parameters);
    row("gradients", r.gradients);
    row(in.offload            ? "optimizer (offloaded to the host)"
        : in.dtype == GPC_F32 ? "optimizer (AdamW m, v)"
                              : "optimizer (AdamW m, v, f32 master)",
        r.optimizer);
    row("activations", r.activations);
    row("backward scratch", r.backward);
    row(in.cuda ? "workspace (logits, cuBLASLt, cuDNN)" : "workspace (logits)", r.workspace);
    if (in.cuda) row("CUDA context (estimate)", r.context);
    row("total", r.total);
    printf("  each extra sequence in the micro-batch adds %s\n",
           cli_format_bytes((double)r.per_sample, human, sizeof human));
    if (tp > 1) {
        gpt_config padded = {.padded_vocab = (in.vocab + 63) / 64 * 64};
        printf("  tp %d: each GPU holds 1/%d of the block matrices and %lld of wte's %d padded "
               "vocabulary rows (their gradient and AdamW state too); the cross-entropy runs "
               "vocabulary-parallel\n",
               tp, tp, (long long)gpt_tp_vocab_rows(&padded, tp), padded.padded_vocab);
    }
    if (r.optimizer_unsharded > r.optimizer) {
        char whole[32];
        printf("  ZeRO-1 over %d GPUs: optimizer state %s per GPU instead of %s, saving %llu "
               "bytes\n",
               in.gpus, cli_format_bytes((double)r.optimizer, human, sizeof human),
               cli_format_bytes((double)r.optimizer_unsharded, whole, sizeof whole),
               (unsigned long long)(r.optimizer_unsharded - r.optimizer));
    }
    if (in.offload)
        printf("  host pinned memory (optimizer state, staged gradients and weights): %s (%llu "
               "bytes)\n",
               cli_format_bytes((double)r.host_pinned, human, sizeof human),
               (unsigned long long)r.host_pinned);
    if (in.offload && in.cuda) print_offload_host(&r);
    printf("\n");
    recompute_table(&in);

    printf("  %-16s %10s  %-5s %s\n", "GPU", "memory", "fits", "largest micro-batch");
    int count;
    const gpc_plan_gpu *table = gpc_plan_gpus(&count);
    for (int i = 0; i < count; i++) {
        int max_batch = gpc_plan_max_batch(&in, table[i].bytes);
        printf("  %-16s %10s  %-5s %d\n", table[i].name,
               cli_format_bytes((double)table[i].bytes, human, sizeof human),
               r.total <= table[i].bytes ? "yes" : "no", max_batch);
    }
    if (gpus > 1) print_layouts(&in);
    if (json) {
        st = gpc_plan_write_json(json, model, &in, &r);
        if (st) return cli_fail("plan", st);
    }
    return CLI_EXIT_OK;
}
