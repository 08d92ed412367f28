/*
 * cmd_train.c: `gpc train`: trains a GPT on a prepared dataset, with a live
 * progress line. The loop itself is gpc_train (src/train/trainer.c); this
 * file turns options into its settings, draws what it reports, and turns
 * SIGINT/SIGTERM into a clean stop with a checkpoint.
 */
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_dist.h"
#include "gpc/model.h"
#include "gpc/settings.h"
#include "gpc/train.h"
#include "ops/ops.h"

static const char *NAME = "train";

#define UNSET INT_MIN

static const char *human_count(double n, char *buf, size_t size) {
    if (n >= 1e9)
        snprintf(buf, size, "%.2fB", n / 1e9);
    else if (n >= 1e6)
        snprintf(buf, size, "%.2fM", n / 1e6);
    else if (n >= 1e3)
        snprintf(buf, size, "%.1fK", n / 1e3);
    else
        snprintf(buf, size, "%.0f", n);
    return buf;
}

/* " | GPU 1620 MHz 690 W, power cap": the readings NVML gave during the
 * step, "" when it gave none (the CPU, no driver). */
static void format_gpu(const gpc_train_event *e, char *buf, size_t size) {
    char clock[24] = "", power[24] = "";
    buf[0] = '\0';
    if (e->gpu_sm_clock_mhz < 0 && isnan(e->gpu_power_w)) return;
    if (e->gpu_sm_clock_mhz >= 0) snprintf(clock, sizeof clock, " %d MHz", e->gpu_sm_clock_mhz);
    if (!isnan(e->gpu_power_w)) snprintf(power, sizeof power, " %.0f W", e->gpu_power_w);
    snprintf(buf, size, " | GPU%s%s%s", clock, power,
             e->gpu_power_capped == 1 ? ", power cap" : "");
}

typedef struct {
    cli_progress progress;
    int steps;
} view;

static void on_event(void *user, const gpc_train_event *e) {
    view *v = user;
    char a[32], b[32], c[32];
    switch (e->kind) {
    case GPC_TRAIN_START: {
        const gpt_config *m = &e->config;
        v->steps = e->steps;
        fprintf(stderr,
                "gpc train: %d layers, %d heads, %d channels, context %d, vocabulary %d: %s "
                "parameters\n",
                m->layers, m->heads, m->channels, m->max_context, m->vocab_size,
                human_count((double)e->parameters, a, sizeof a));
        fprintf(stderr,
                "gpc train: %lld tokens per step (batch %d x context %d x %d accumulation), %s "
                "%s, %s planned, lr %g, warmup %d\n",
                (long long)e->tokens_per_step, e->B, e->T, e->accumulation_steps,
                gpc_device_name(e->device), gpc_dtype_name(e->precision),
                cli_format_bytes((double)e->memory_planned, b, sizeof b), e->peak_lr, e->warmup);
        if (e->host_pinned)
            fprintf(stderr,
                    "gpc train: optimizer offloaded: master weights and moments in %s of pinned "
                    "host memory, updated on the CPU\n",
                    cli_format_bytes((double)e->host_pinned, b, sizeof b));
        if (e->first_step)
            fprintf(stderr, "gpc train: resuming at step %d of %d\n", e->first_step, e->steps);
        break;
    }
    case GPC_TRAIN_STEP: {
        /* fp16 only: steps the loss scaling skipped, and the scale now */
        char skipped[64] = "";
        if (e->skipped_steps)
            snprintf(skipped, sizeof skipped, " | skipped %d (scale %g)", e->skipped_steps,
                     (double)e->loss_scale);
        char gpu[64];
        format_gpu(e, gpu, sizeof gpu);
        cli_progress_update(&v->progress, e->step == v->steps || e->step == 1 || e->skipped,
                            "step %d/%d | loss %.4f | lr %.2e | %s tok/s | ETA %s | mem %s%s%s",
                            e->step, v->steps, (double)e->loss, (double)e->lr,
                            human_count(e->tokens_per_s, a, sizeof a),
                            cli_format_duration(e->eta_s, b, sizeof b),
                            cli_format_bytes((double)e->memory_bytes, c, sizeof c), skipped, gpu);
        break;
    }
    case GPC_TRAIN_EVAL:
        cli_progress_end(&v->progress);
        fprintf(stderr, "step %d/%d | val loss %.4f (train loss %.4f)\n", e->step, v->steps,
                (double)e->val_loss, (double)e->loss);
        break;
    case GPC_TRAIN_CHECKPOINT:
        cli_progress_end(&v->progress);
        fprintf(stderr, "step %d/%d | checkpoint saved: %s\n", e->step, v->steps, e->path);
        break;
    }
}

/* 0 where it means "none" maps to the trainer's negative "none". */
static int positive_or_unset(const char *flag, int value) {
    if (value == UNSET || value > 0) return 0;
    return cli_usage_error(NAME, "--%s must be a positive number, not %d", flag, value);
}

/* A job that gpcd preempted and requeued runs the same command again. When
 * this process is that job (GPC_JOB_ID equals the gpcd_job its run folder's
 * config.txt records) and the folder holds a checkpoint, training resumes
 * instead of refusing the folder, so preemption loses at most one step. */
static int requeued_gpcd_job(const char *out_dir) {
    const char *job = gpc_setting_given("GPC_JOB_ID");
    char path[4096], line[256], want[128];
    if (!job || !*job || !out_dir) return 0;
    snprintf(path, sizeof path, "%s/checkpoint.bin", out_dir);
    int have = gpc_path_exists(path);
    snprintf(path, sizeof path, "%s/checkpoint.prev.bin", out_dir);
    if (!have && !gpc_path_exists(path)) return 0;
    snprintf(path, sizeof path, "%s/config.txt", out_dir);
    snprintf(want, sizeof want, "gpcd_job=%s\n", job);
    FILE *f = fopen(path, "r");
    int same = 0;
    while (f && !same && fgets(line, sizeof line, f))
        same = strcmp(line, want) == 0;
    if (f) fclose(f);
    if (same)
        fprintf(stderr, "gpc train: gpcd job %s was requeued: resuming from its checkpoint\n", job);
    return same;
}

/* A requeued gpcd job whose checkpoint has every step done: it was stopped
 * (preempted, resized) as it finished, so there is nothing left to train,
 * which for a job is success, not the usage error a user's --resume of a
 * finished run gets. steps: the one given, or UNSET for the run's own. */
static int requeued_job_finished(const char *out_dir, int steps) {
    char path[4096];
    gpt_config config;
    gpc_dtype precision;
    gpt_checkpoint_state state;
    snprintf(path, sizeof path, "%s/checkpoint.bin", out_dir);
    if (gpt_checkpoint_read_header(path, &config, &precision, &state) != GPC_OK) return 0;
    int want = steps != UNSET && steps > 0 ? steps : state.steps;
    if (state.step < (uint64_t)want) return 0;
    fprintf(stderr,
            "gpc train: gpcd job %s was requeued after its last step: all %d steps are done\n",
            gpc_setting_given("GPC_JOB_ID"), want);
    return 1;
}

int cmd_train(int argc, char **argv) {
    const char *data = NULL, *out = NULL, *model = NULL, *device_name = "auto";
    const char *precision_name = NULL, *init_from = NULL, *lora_targets = NULL;
    int lora = UNSET;
    double lora_alpha = NAN;
    /* UNSET values cannot be typed (the parser refuses INT_MIN and NaN), so
     * "left out" and every value a user can give stay apart */
    int layers = UNSET, heads = UNSET, channels = UNSET, context = UNSET, batch = UNSET;
    int steps = UNSET, warmup = UNSET, eval_every = UNSET, eval_batches = UNSET;
    int checkpoint_every = UNSET, resume = 0, stop_after = UNSET, recompute_layers = UNSET;
    const char *recompute_name = NULL;
    int64_t total_batch = UNSET, seed = UNSET;
    double lr = NAN, min_lr_ratio = NAN, weight_decay = NAN, max_grad_norm = NAN;
    int zero = 0, tp = 1, pp = 1;
    double bucket_mb = NAN;
    const char *collectives = "auto", *attention = NULL, *attention_backward = NULL;
    int stochastic_rounding = 0, no_auto_fit = 0, offload_optimizer = 0;
    const cli_option options[] = {
        {"data", CLI_STRING, &data, "DIR", "dataset folder (from gpc data prepare or synth)"},
        {"out", CLI_STRING, &out, "RUN", "run folder: checkpoint, metrics, config, tokenizer"},
        {"model", CLI_STRING, &model, "dN",
         "N layers, N heads, 64*N channels (default d6; d12, d24, d36, d48 = GPT-2 124M, "
         "350M, 774M, 1.5B)"},
        {"layers", CLI_INT, &layers, "N", "override the model's layers"},
        {"heads", CLI_INT, &heads, "N", "override the model's heads"},
        {"channels", CLI_INT, &channels, "N", "override the model's channels"},
        {"context", CLI_INT, &context, "T", "tokens per sequence (default 256)"},
        {"batch", CLI_INT, &batch, "B", "sequences per micro-batch (default 8)"},
        {"total-batch", CLI_INT64, &total_batch, "TOKENS",
         "tokens per optimizer step, a multiple of B*T (default B*T)"},
        {"steps", CLI_INT, &steps, "N", "optimizer steps (default 1000)"},
        {"lr", CLI_FLOAT, &lr, "X", "peak learning rate (default 1e-3 up to d6, 6e-4 above)"},
        {"min-lr-ratio", CLI_FLOAT, &min_lr_ratio, "F",
         "final learning rate as a fraction of the peak (default 0.1)"},
        {"warmup", CLI_INT, &warmup, "N", "warmup steps (default 10% of steps, at most 1000)"},
        {"weight-decay", CLI_FLOAT, &weight_decay, "X", "AdamW weight decay (default 0.1)"},
        {"max-grad-norm", CLI_FLOAT, &max_grad_norm, "X",
         "clip the gradient norm to this, 0 for none (default 1.0)"},
        {"eval-every", CLI_INT, &eval_every, "N",
         "validation loss every N steps and at the end, 0 for never (default 100)"},
        {"eval-batches", CLI_INT, &eval_batches, "N", "batches per validation (default 20)"},
        {"checkpoint-every", CLI_INT, &checkpoint_every, "N",
         "checkpoint every N steps, 0 for only at the end (default 500)"},
        {"device", CLI_STRING, &device_name, "DEV",
         "auto, cpu or cuda[:N] (default auto: a GPU if there is one)"},
        {"precision", CLI_STRING, &precision_name, "P",
         "f32, bf16 or fp16 (default f32 on the CPU, bf16 on a GPU)"},
        {"attention", CLI_STRING, &attention, "A",
         "GPU attention: auto, gpc (gpc's kernels) or cudnn (cuDNN's fused attention) "
         "(default GPC_ATTENTION, else auto: the faster here)"},
        {"attention-backward", CLI_STRING, &attention_backward, "B",
         "GPU attention backward: auto (the fastest that serves), two (gpc's two kernels, the "
         "same bits each run), fused (one kernel) or wgmma (Hopper) (default GPC_ATTENTION_BWD, "
         "else auto)"},
        {"stochastic-rounding", CLI_FLAG, &stochastic_rounding, NULL,
         "round the bf16 weights stochastically after each update, not to nearest (default "
         "GPC_STOCHASTIC_ROUNDING, else off)"},
        {"recompute", CLI_STRING, &recompute_name, "MODE",
         "rebuild activations in backward to save memory: 1 (gelu) GELU, 2 (layernorm) also "
         "layernorm, block each whole block from its input (default 0, or the checkpoint's when "
         "resuming)"},
        {"recompute-layers", CLI_INT, &recompute_layers, "N",
         "apply --recompute to the first N blocks only, trading memory for speed in steps "
         "(default all)"},
        {"no-auto-fit", CLI_FLAG, &no_auto_fit, NULL,
         "fail on running out of device memory instead of going on at half the micro-batch with "
         "twice the accumulation steps"},
        {"offload-optimizer", CLI_FLAG, &offload_optimizer, NULL,
         "keep the f32 master weights and AdamW moments in pinned host memory and update them "
         "on CPU threads while the next forward runs, for models whose optimizer state does not "
         "fit the GPU (one process)"},
        {"resume", CLI_FLAG, &resume, NULL,
         "continue the run in --out from its checkpoint, on its schedule"},
        {"stop-after", CLI_INT, &stop_after, "N",
         "stop with a checkpoint after N steps of this run, the schedule unchanged (--resume "
         "goes on)"},
        {"init-from", CLI_STRING, &init_from, "RUN",
         "fine-tune: start from RUN's weights (gpc train or gpc import hf), whose sizes the "
         "model takes; fresh optimizer and schedule"},
        {"lora", CLI_INT, &lora, "R",
         "with --init-from: train rank-R LoRA adapters on the frozen base, saved alone in "
         "RUN/lora.bin (gpc merge folds them in)"},
        {"lora-alpha", CLI_FLOAT, &lora_alpha, "A", "LoRA scale alpha/R (default alpha = R)"},
        {"lora-targets", CLI_STRING, &lora_targets, "LIST",
         "projections that get adapters, of qkv,proj,fc,fcproj (default all four)"},
        {"seed", CLI_INT64, &seed, "S", "weights, data order and rounding (default 1337)"},
        {"tp", CLI_INT, &tp, "T",
         "several processes: tensor parallelism, each model cut over T of them (its heads, "
         "MLP units and vocabulary); data parallelism over the rest (default 1)"},
        {"pp", CLI_INT, &pp, "P",
         "several processes: pipeline parallelism, the layers cut into P stages run in the 1F1B "
         "order over the accumulation steps (default 1)"},
        {"zero", CLI_INT, &zero, "0|1",
         "several processes: 1 shards the optimizer state over them (ZeRO-1; default 0)"},
        {"bucket-mb", CLI_FLOAT, &bucket_mb, "MB",
         "several processes: gradient bucket size, 0 for one bucket after backward (default 100)"},
        {"collectives", CLI_STRING, &collectives, "C",
         "several processes: auto, nccl (GPUs) or mpi (CPUs under mpirun) (default auto)"},
        {NULL, 0, NULL, NULL, NULL},
    };
    const cli_spec spec = {
        "train",
        "train --data DIR --out RUN [--model dN | --init-from RUN] [--context T] [--batch B] "
        "[--total-batch "
        "TOKENS] [--steps N] [--lr X] [--eval-every N] [--checkpoint-every N] [--device "
        "auto|cpu|cuda] [--attention auto|gpc|cudnn] [--attention-backward auto|two|fused|wgmma] "
        "[--stochastic-rounding] [--recompute 0|1|2|block [--recompute-layers N]] [--lora R "
        "[--lora-alpha A] [--lora-targets "
        "LIST]] [--no-auto-fit] [--resume] [--seed S]",
        "Trains a GPT-2 style model on token shards: micro-batches with gradient accumulation, "
        "AdamW with warmup and cosine decay, validation and checkpoints. Ctrl-C (or SIGTERM) "
        "finishes the step, saves a checkpoint and exits with 128 + the signal (130, 143); "
        "--resume continues exactly.",
        options,
        0,
        NULL,
        NULL,
    };
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    int rc;
    if (!data) return cli_usage_error(NAME, "--data DIR is required (a dataset folder)");
    if (!out) return cli_usage_error(NAME, "--out RUN is required (the run folder)");
    if ((rc = positive_or_unset("layers", layers)) || (rc = positive_or_unset("heads", heads)) ||
        (rc = positive_or_unset("channels", channels)) ||
        (rc = positive_or_unset("context", context)) || (rc = positive_or_unset("batch", batch)) ||
        (rc = positive_or_unset("steps", steps)) ||
        (rc = positive_or_unset("eval-batches", eval_batches)) ||
        (rc = positive_or_unset("stop-after", stop_after)))
        return rc;
    if (total_batch != UNSET && total_batch <= 0)
        return cli_usage_error(NAME, "--total-batch must be a positive number of tokens");
    if ((warmup != UNSET && warmup < 0) || (eval_every != UNSET && eval_every < 0) ||
        (checkpoint_every != UNSET && checkpoint_every < 0))
        return cli_usage_error(NAME, "--warmup, --eval-every and --checkpoint-every must not "
                                     "be negative");
    if (!isnan(lr) && !(lr > 0 && lr < 1))
        return cli_usage_error(NAME, "--lr must be between 0 and 1, not %g", lr);
    if (!isnan(min_lr_ratio) && !(min_lr_ratio >= 0 && min_lr_ratio <= 1))
        return cli_usage_error(NAME, "--min-lr-ratio must be between 0 and 1, not %g",
                               min_lr_ratio);
    if ((!isnan(weight_decay) && weight_decay < 0) || (!isnan(max_grad_norm) && max_grad_norm < 0))
        return cli_usage_error(NAME, "--weight-decay and --max-grad-norm must not be negative");
    if (seed != UNSET && seed < 0) return cli_usage_error(NAME, "--seed must not be negative");

    gpc_train_options o;
    gpc_train_options_init(&o);
    o.data_dir = data;
    o.out_dir = out;
    o.init_from = init_from;
    if (model) {
        int l, h, c;
        if (gpt_config_parse_depth(model, &l, &h, &c) != GPC_OK)
            return cli_fail(NAME, GPC_ERR_INVALID_ARG);
        o.model = model;
    }
    if (precision_name && (rc = cli_precision(NAME, precision_name, &o.precision))) return rc;
    gpc_status s = gpc_device_parse(device_name, &o.device);
    if (s != GPC_OK) return cli_fail(NAME, s);
    if (o.device.type == GPC_DEVICE_CPU && o.precision >= 0 && o.precision != GPC_F32)
        return cli_usage_error(NAME, "the CPU trains in f32 only; use --precision f32 (bf16 and "
                                     "fp16 need a GPU)");
    if (attention) {
        gpc_attention_path path;
        if (gpc_attention_path_parse(attention, &path) != GPC_OK || path == GPC_ATTENTION_SIMPLE)
            return cli_usage_error(NAME, "--attention must be auto, gpc or cudnn, not '%s'",
                                   attention);
        if (path == GPC_ATTENTION_CUDNN && o.device.type == GPC_DEVICE_CPU)
            return cli_usage_error(NAME, "--attention cudnn needs a GPU; on the CPU attention "
                                         "runs gpc's own kernel");
        /* for the whole process: every model it builds */
        if ((s = gpc_op_set_attention_path(attention)) != GPC_OK) return cli_fail(NAME, s);
    }
    /* flags ahead of the environment, for the settings the GPU backend and
     * the trainer read (gpc/settings.h) */
    if (attention_backward &&
        gpc_settings_override("GPC_ATTENTION_BWD", attention_backward) != GPC_OK)
        return cli_usage_error(NAME,
                               "--attention-backward must be auto, two, fused or wgmma, not '%s'",
                               attention_backward);
    if (stochastic_rounding &&
        (s = gpc_settings_override("GPC_STOCHASTIC_ROUNDING", "1")) != GPC_OK)
        return cli_fail(NAME, s);
    int recompute = -1; /* -1: the checkpoint's, else 0 */
    if (recompute_name && gpt_recompute_parse(recompute_name, &recompute) != GPC_OK)
        return cli_usage_error(NAME, "%s", gpc_last_error());
    if (recompute_layers != UNSET) {
        if (recompute_layers < 1 || !recompute_name || gpt_recompute_level(recompute) == 0)
            return cli_usage_error(NAME,
                                   "--recompute-layers %d needs a --recompute mode (gelu, "
                                   "layernorm or block) and 1 or more blocks",
                                   recompute_layers);
        recompute = GPT_RECOMPUTE(gpt_recompute_level(recompute), recompute_layers);
    }
    o.recompute = recompute;
    o.no_auto_fit = no_auto_fit;
    o.offload_optimizer = offload_optimizer;
    o.layers = layers > 0 ? layers : 0;
    o.heads = heads > 0 ? heads : 0;
    o.channels = channels > 0 ? channels : 0;
    o.context = context > 0 ? context : 0;
    o.batch = batch > 0 ? batch : 0;
    o.total_batch = total_batch > 0 ? total_batch : 0;
    o.steps = steps > 0 ? steps : 0;
    o.lr = isnan(lr) ? 0 : lr;
    o.min_lr_ratio = isnan(min_lr_ratio) ? 0 : min_lr_ratio > 0 ? min_lr_ratio : -1;
    o.warmup = warmup == UNSET ? 0 : warmup > 0 ? warmup : -1;
    o.weight_decay = isnan(weight_decay) ? 0 : weight_decay > 0 ? weight_decay : -1;
    o.max_grad_norm = isnan(max_grad_norm) ? 0 : max_grad_norm > 0 ? max_grad_norm : -1;
    o.eval_every = eval_every == UNSET ? 0 : eval_every > 0 ? eval_every : -1;
    o.eval_batches = eval_batches > 0 ? eval_batches : 0;
    o.checkpoint_every = checkpoint_every == UNSET ? 0
                         : checkpoint_every > 0    ? checkpoint_every
                                                   : -1;
    int requeued = !resume && requeued_gpcd_job(out);
    if (requeued && requeued_job_finished(out, steps)) return CLI_EXIT_OK;
    o.resume = resume || requeued;
    o.stop_after = stop_after > 0 ? stop_after : 0;
    if (lora != UNSET && lora < 1)
        return cli_usage_error(NAME, "--lora must be a positive rank, not %d", lora);
    if (!isnan(lora_alpha) && !(lora_alpha > 0))
        return cli_usage_error(NAME, "--lora-alpha must be positive, not %g", lora_alpha);
    if ((lora_targets || !isnan(lora_alpha)) && lora == UNSET)
        return cli_usage_error(NAME, "--lora-alpha and --lora-targets need --lora R");
    o.lora_rank = lora == UNSET ? 0 : lora;
    o.lora_alpha = isnan(lora_alpha) ? 0 : lora_alpha;
    if (lora_targets && (s = gpt_lora_parse_targets(lora_targets, &o.lora_targets)) != GPC_OK)
        return cli_fail(NAME, s);
    if (seed != UNSET) {
        o.seed = (uint64_t)seed;
        o.seed_set = 1;
    }
    view v;
    memset(&v, 0, sizeof v);
    cli_progress_init(&v.progress);
    o.callback = on_event;
    o.user = &v;

    if (zero != 0 && zero != 1) return cli_usage_error(NAME, "--zero must be 0 or 1, not %d", zero);
    if (!isnan(bucket_mb) && bucket_mb < 0)
        return cli_usage_error(NAME, "--bucket-mb must not be negative, not %g", bucket_mb);
    o.zero = zero;
    if (tp < 1) return cli_usage_error(NAME, "--tp must be 1 or more, not %d", tp);
    o.tp = tp;
    if (pp < 1) return cli_usage_error(NAME, "--pp must be 1 or more, not %d", pp);
    o.pp = pp;
    o.bucket_mb = isnan(bucket_mb) ? 0 : bucket_mb > 0 ? bucket_mb : -1;
    gpc_dist *dist = NULL; /* several processes (gpc launch, mpirun, srun) */
    s = cli_dist_setup(&o, collectives, &dist);
    if (s != GPC_OK) return cli_fail(NAME, s);

    /* the first Ctrl-C asks for a checkpoint and a clean exit (the hook only
     * sets a flag: async-signal-safe); a second stops the process at once */
    cli_catch_stop(gpc_train_request_stop);
    gpc_train_result result;
    s = gpc_train(&o, &result);
    cli_progress_end(&v.progress);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    if (s == GPC_ERR_INTERRUPTED) { /* a clean stop with a checkpoint, not a failure */
        int sig = cli_stop_signal() ? cli_stop_signal() : SIGTERM; /* SIGTERM: another rank's */
        fprintf(stderr, "gpc train: stopped by %s: %s\n", cli_stop_name(), gpc_last_error());
        gpc_dist_destroy(dist);
        return 128 + sig;
    }
    if (s != GPC_OK) {
        int status = cli_fail(NAME, s);
        gpc_dist_destroy(dist);
        return status;
    }
    gpc_dist_destroy(dist);
    if (o.rank != 0) return CLI_EXIT_OK; /* rank 0 reports */
    char dur[32];
    printf("trained %d steps in %s: loss %.4f", result.steps_done,
           cli_format_duration(result.seconds, dur, sizeof dur), (double)result.last_loss);
    if (result.last_val_loss == result.last_val_loss)
        printf(", val loss %.4f", (double)result.last_val_loss);
    printf("; sample with: gpc sample --run %s\n", out);
    if (result.steps_done < v.steps)
        printf("stopped at step %d of %d (--stop-after); continue with: gpc train --data %s "
               "--out %s --resume\n",
               result.steps_done, v.steps, data, out);
    /* a GPU held at its power limit: faster kernels would not show */
    char power[256];
    if (gpc_train_power_summary(&result, power, sizeof power))
        fprintf(stderr, "gpc train: %s\n", power);
    if (gpc_train_energy_summary(&result, power, sizeof power))
        fprintf(stderr, "gpc train: %s\n", power);
    return CLI_EXIT_OK;
}
