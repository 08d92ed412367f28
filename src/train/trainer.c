/*
 * trainer.c: the training loop behind `gpc train`.
 *
 * One optimizer step: zero the gradients; for each of the accumulation
 * micro-steps, take a batch from the prefetching loader (already on the
 * device: gpc_prefetch_next) and run forward + backward with
 * dloss = 1/(B*T*accumulation) so the gradients add up to those of the mean
 * over the whole step; then the AdamW update with the schedule's learning
 * rate and global-norm clipping. Nothing in the step waits for the device;
 * gpt_read_step, which reads the loss for the metrics line, is the one
 * wait, and just before it the host reads the GPU's power and clock. After
 * the step come the metrics line, the callback, validation and checkpoints.
 * The clock read around each gpc_prefetch_next gives the time the step was
 * blocked on its loader (input_wait_ms in the metrics): what tells an
 * input-bound run from a slow step, for gpc doctor.
 *
 * Exact resume: everything that decides the next steps is in the checkpoint
 * (f32 weights, from which the bf16 copy is rounded to nearest, AdamW
 * moments, step, the loader's epoch and batch, the RNG) and nothing else carries state from step
 * to step, so a resumed run computes bit for bit what the uninterrupted run
 * would have.
 *
 * On a CUDA device NVML is read while the GPU runs the queued step (every
 * step, or once per half second when steps are shorter): power, SM clock,
 * whether the power limit holds the clock down. A
 * GPU at its power cap runs the step at a lower clock, which no kernel timing
 * in isolation shows. The readings go into the metrics and the result;
 * without NVML there are none and training is the same.
 */
#include "gpc/train.h"
#include "gpc/tokenizer.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/data.h"
#include "gpc/ddp.h"
#include "gpc/parallel.h"
#include "gpc/nvml.h"
#include "gpc/plan.h"
#include "gpc/settings.h"
#include "gpc/tokenizer.h"
#include "gpc/trace.h"

static volatile sig_atomic_t stop_flag;

void gpc_train_request_stop(void) {
    stop_flag = 1;
}

int gpc_train_stop_requested(void) {
    return stop_flag != 0;
}

void gpc_train_clear_stop(void) {
    stop_flag = 0;
}

void gpc_train_options_init(gpc_train_options *o) {
    memset(o, 0, sizeof *o);
    o->seed = 1337;
    o->device = gpc_cpu();
    o->precision = -1;
    o->world_size = 1;
    o->recompute = -1;
}

/* A rank's part of a model cut by --tp and --pp, and the groups it works
 * in: its tp slices' group, its pipeline's stages, and all tp x pp parts
 * of its copy (rank pp_rank * tp + tp_rank there), which gather
 * checkpoints and agree on stopping. */
typedef struct {
    gpt_parallel par;
    gpc_dist *tp, *pp, *model;
} train_parts;

/* The settings of a run after defaults and the checkpoint are applied. */
typedef struct {
    gpt_config config;
    gpc_dtype precision;
    int B, T, accumulation, steps;
    int64_t total_batch;
    gpc_lr_schedule schedule;
    double weight_decay, max_grad_norm;
    int eval_every, eval_batches, checkpoint_every;
    int recompute;
    int batch_asked;         /* the micro-batch asked for, which auto-fit may have divided */
    int stochastic_rounding; /* GPC_STOCHASTIC_ROUNDING=1: of the bf16 copy of the weights */
    uint64_t seed;
} run_settings;

typedef struct {
    const gpc_train_options *o;
    run_settings s;
    gpt_model *model;
    gpc_prefetch *train; /* batches prepared by a thread, copied to the device ahead */
    gpc_loader *val;
    int32_t *inputs, *targets;
    FILE *metrics;
    gpc_rng rng;
    int step;          /* optimizer steps done */
    int skipped_steps; /* fp16 steps skipped on overflow in this process */
    gpc_ddp *ddp;      /* data parallelism (src/train/ddp.c); NULL alone */
    /* tensor and pipeline parallelism: this rank's part and its groups
     * (NULL: the whole model). With it, t->o is the data-parallel view:
     * its world_size, rank and dist are the dp group's (see gpc_train). */
    const train_parts *parts;
    int32_t *pipe_inputs, *pipe_targets; /* [accumulation * B * T] host tokens of a step */
    gpc_pipeline_timing pipe_sum;        /* summed over the steps */
    int rank0;                           /* this process writes the run folder and reports */
    int stop_all;                        /* a stop was requested on some rank (agreed each step) */
    char checkpoint_path[4096], prev_path[4096];
    /* LoRA: the adapters' options, the file they are saved in, and the base
     * run's folder (absolute), whose weights stay frozen */
    gpt_lora_options lora;
    char lora_path[4096], base_run[4096];
    const char *resume_path; /* the checkpoint resumed from: checkpoint_path or prev_path */
    int saved;               /* this process has saved a checkpoint (auto-fit retries from it) */
    int started;             /* START was emitted: the run was built once */
    int oom_injected;        /* GPC_TEST_OOM_STEP has failed its step */
    int current_damaged;     /* checkpoint.bin did not load: not kept as the previous one */
    /* this process's GPU as NVML sees it (src/core/nvml.c); NULL on the CPU
     * or when NVML cannot be opened or does not list the device */
    gpc_nvml *nvml;
    int nvml_index;
    int gpu_sample_failed; /* a reading failed once: logged, not again */
    double gpu_last_read;  /* gpc_time_seconds() of the last reading; 0 before the first */
    int gpu_sampled, gpu_capped;
    int gpu_clock_max_mhz;
    double gpu_power_limit_w;
    int gpu_clock_count;        /* clocks recorded; the last GPC_TRAIN_CLOCK_STEPS are kept */
    const char *tokenizer_kind; /* the dataset's: "gpc", "gpt2" or "none" */
    int gpu_clocks[GPC_TRAIN_CLOCK_STEPS];
    gpc_energy_meter gpu_energy; /* energy a step from NVML's counter */
} trainer;

/* ------------------------------------------------------------ settings */

/* A setting the resumed run must keep: the given value must equal the
 * checkpoint's. */
static gpc_status same_as_checkpoint(const char *option, long long given, long long stored) {
    if (given == stored) return GPC_OK;
    return gpc_error(GPC_ERR_MISMATCH,
                     "the checkpoint was trained with --%s %lld; this run asks for %lld (leave "
                     "--%s out to resume, or train a new run with --out elsewhere)",
                     option, stored, given, option);
}

/* config.txt's batch_asked of a run folder: the micro-batch its command
 * asked for; 0 when it has none. */
static int read_batch_asked(const char *out_dir) {
    char path[4200], *text = NULL;
    size_t size = 0;
    snprintf(path, sizeof path, "%s/config.txt", out_dir);
    if (!gpc_path_exists(path) || gpc_read_file(path, &text, &size) != GPC_OK) {
        gpc_clear_error();
        return 0;
    }
    const char *line = strstr(text, "\nbatch_asked=");
    int batch = line ? atoi(line + strlen("\nbatch_asked=")) : 0;
    gpc_free(text);
    return batch;
}

static gpc_status resolve(const gpc_train_options *o, const gpc_dataset_info *data,
                          const gpt_config *ck_config, const gpt_checkpoint_state *ck,
                          const gpt_config *init, run_settings *s) {
    memset(s, 0, sizeof *s);
    int resume = ck != NULL;
    if (resume && ck->batch <= 0)
        return gpc_error(GPC_ERR_FORMAT, "the checkpoint holds weights for sampling, no training "
                                         "state to resume; train a new run with --out elsewhere");
    int L = 6, NH = 6, C = 384; /* d6 */
    int sized = o->model || o->layers || o->heads || o->channels;
    if (init && sized)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "the model's sizes come from --init-from %s; leave out --model, "
                         "--layers, --heads and --channels",
                         o->init_from);
    if (init) L = init->layers, NH = init->heads, C = init->channels;
    if (o->model) GPC_TRY(gpt_config_parse_depth(o->model, &L, &NH, &C));
    if (resume && !sized) L = ck_config->layers, NH = ck_config->heads, C = ck_config->channels;
    if (o->layers) L = o->layers;
    if (o->heads) NH = o->heads;
    if (o->channels) C = o->channels;
    if (o->layers < 0 || o->heads < 0 || o->channels < 0 || o->context < 0 || o->batch < 0 ||
        o->total_batch < 0 || o->steps < 0 || o->eval_batches < 0)
        return gpc_error(GPC_ERR_INVALID_ARG, "sizes and counts must be positive");
    if (o->recompute != -1) GPC_TRY(gpt_recompute_check(o->recompute, L));
    s->stochastic_rounding = gpc_setting_flag("GPC_STOCHASTIC_ROUNDING");
    /* a memory-for-speed choice that leaves the numbers alone: a resumed run
     * keeps its own unless told otherwise */
    s->recompute = o->recompute >= 0              ? o->recompute
                   : resume && ck->recompute >= 0 ? ck->recompute
                                                  : 0;
    if (o->context && resume) GPC_TRY(same_as_checkpoint("context", o->context, ck->context));
    /* a run that auto-fit went on with at a smaller micro-batch resumes at
     * that one when the first command is given again */
    int asked = resume ? read_batch_asked(o->out_dir) : 0;
    int fitted = resume && o->batch != ck->batch && o->batch == asked && !o->no_auto_fit;
    if (fitted)
        gpc_log(GPC_LOG_INFO,
                "train: the run went on at micro-batch %d after running out of memory at %d; "
                "resuming at %d",
                ck->batch, o->batch, ck->batch);
    else if (o->batch && resume)
        GPC_TRY(same_as_checkpoint("batch", o->batch, ck->batch));
    if (o->total_batch && resume)
        GPC_TRY(same_as_checkpoint("total-batch", o->total_batch, ck->total_batch));
    if (o->seed_set && resume)
        GPC_TRY(same_as_checkpoint("seed", (long long)o->seed, (long long)ck->seed));
    /* positions the model knows: a fine-tuned model keeps its own */
    int max_context = init ? init->max_context : resume ? ck_config->max_context : 0;
    s->T = o->context ? o->context : resume ? ck->context : 256;
    if (init && !o->context && s->T > max_context) s->T = max_context;
    if (max_context && s->T > max_context)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--context %d is more than the %d positions the model knows", s->T,
                         max_context);
    if (!max_context) max_context = s->T;
    s->B = o->batch && !fitted ? o->batch : resume ? ck->batch : 8;
    s->batch_asked = asked ? asked : s->B;
    s->seed = resume ? ck->seed : o->seed;
    if (data->vocab_size > (uint32_t)INT32_MAX)
        return gpc_error(GPC_ERR_FORMAT, "the dataset's vocabulary is too large");
    if (init && (uint32_t)init->vocab_size != data->vocab_size)
        return gpc_error(GPC_ERR_MISMATCH,
                         "the dataset has a vocabulary of %u tokens, the model of --init-from %s "
                         "%d: prepare the data with `gpc data prepare --tokenizer %s`",
                         data->vocab_size, o->init_from, init->vocab_size, o->init_from);
    GPC_TRY(gpt_config_init(&s->config, L, NH, C, max_context, (int)data->vocab_size));
    if (resume && !gpt_config_equal(ck_config, &s->config, "the checkpoint"))
        return gpc_error_context(GPC_ERR_MISMATCH, "cannot resume: ");

    int world = o->world_size > 0 ? o->world_size : 1;
    int64_t micro = (int64_t)s->B * s->T * world;
    s->total_batch = o->total_batch ? o->total_batch : resume ? ck->total_batch : micro;
    /* first, so that the multiples suggested below cannot overflow */
    if (s->total_batch / micro > 1 << 20)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--total-batch %lld needs %lld micro-steps of %lld tokens; at most %d "
                         "are allowed",
                         (long long)s->total_batch, (long long)(s->total_batch / micro),
                         (long long)micro, 1 << 20);
    if (s->total_batch % micro != 0)
        return gpc_error(
            GPC_ERR_INVALID_ARG,
            "--total-batch %lld is not a multiple of batch x context x processes "
            "= %d x %d x %d = %lld tokens; use %lld or %lld",
            (long long)s->total_batch, s->B, s->T, world, (long long)micro,
            (long long)(s->total_batch / micro > 0 ? s->total_batch / micro * micro : micro),
            (long long)((s->total_batch / micro + 1) * micro));
    if (s->total_batch / micro > 1 << 20)
        return gpc_error(GPC_ERR_INVALID_ARG, "--total-batch %lld needs too many micro-steps",
                         (long long)s->total_batch);
    s->accumulation = (int)(s->total_batch / micro);

    s->steps = o->steps ? o->steps : resume ? ck->steps : 1000;
    if (resume && o->steps && (uint64_t)o->steps > ck->step && o->steps != ck->steps)
        gpc_log(GPC_LOG_WARN,
                "train: --steps %d changes the run's learning-rate schedule: it now decays over "
                "%d steps, not %d (warmup kept); to stop early without changing it, leave "
                "--steps out and give --stop-after N",
                o->steps, o->steps, ck->steps);
    s->schedule.steps = s->steps;
    s->schedule.lr = o->lr > 0 ? o->lr : resume ? ck->learning_rate : gpc_lr_default(C);
    s->schedule.warmup = o->warmup > 0   ? o->warmup
                         : o->warmup < 0 ? 0
                         : resume        ? ck->warmup
                                         : gpc_lr_default_warmup(s->steps);
    s->schedule.min_lr_ratio = o->min_lr_ratio > 0   ? o->min_lr_ratio
                               : o->min_lr_ratio < 0 ? 0.0
                               : resume              ? ck->min_lr_ratio
                                                     : 0.1;
    s->weight_decay = o->weight_decay > 0   ? o->weight_decay
                      : o->weight_decay < 0 ? 0.0
                      : resume              ? ck->weight_decay
                                            : 0.1;
    s->max_grad_norm = o->max_grad_norm > 0   ? o->max_grad_norm
                       : o->max_grad_norm < 0 ? 0.0
                       : resume               ? ck->max_grad_norm
                                              : 1.0;
    if (o->lr < 0 || s->schedule.min_lr_ratio > 1)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "the learning rate must be positive and --min-lr-ratio at most 1");
    s->eval_every = o->eval_every > 0 ? o->eval_every : o->eval_every < 0 ? 0 : 100;
    s->eval_batches = o->eval_batches > 0 ? o->eval_batches : 20;
    s->checkpoint_every = o->checkpoint_every > 0   ? o->checkpoint_every
                          : o->checkpoint_every < 0 ? 0
                                                    : 500;
    if (o->precision >= 0)
        s->precision = (gpc_dtype)o->precision;
    else
        s->precision = o->device.type == GPC_DEVICE_CPU ? GPC_F32 : GPC_BF16;
    if (resume && ck->step >= (uint64_t)s->steps)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "the run has already done %llu of its %d steps; give a larger --steps "
                         "to train longer",
                         (unsigned long long)ck->step, s->steps);
    return GPC_OK;
}

/* gpc plan's figures for the run at micro-batch B into *r; 0 when the
 * plan cannot say. */
static int plan_run(const gpc_train_options *o, const run_settings *s, const train_parts *parts,
                    int B, gpc_plan_result *r) {
    gpc_plan_input in;
    gpc_plan_defaults(&in);
    in.layers = s->config.layers;
    in.heads = s->config.heads;
    in.channels = s->config.channels;
    in.batch = B;
    in.vocab = s->config.vocab_size;
    in.dtype = s->precision;
    in.recompute = s->recompute;
    in.zero = o->zero;
    in.gpus = o->world_size > 1 ? o->world_size : 1;
    if (parts) { /* this process holds one part (the plan's first stage) */
        in.tp = parts->par.tp_size;
        in.pp = parts->par.pp_size;
        in.gpus *= in.tp * in.pp;
    }
    in.lora_rank = o->lora_rank;
    in.offload = o->offload_optimizer ? 1 : 0;
    in.cuda = o->device.type == GPC_DEVICE_CUDA;
    in.context = s->T;
    if (gpc_plan_compute(&in, r) != GPC_OK) { /* resolve checked the shape: leave it to create */
        gpc_clear_error();
        return 0;
    }
    return 1;
}

/* gpc plan's bytes for the run at micro-batch B on its device (the batch
 * buffers included: inputs and targets here and in the loader's two
 * slots); 0 when the plan cannot say. parts: the model's cut, whose first
 * stage the plan counts (NULL: the whole model). */
static double plan_bytes(const gpc_train_options *o, const run_settings *s,
                         const train_parts *parts, int B) {
    gpc_plan_result r;
    if (!plan_run(o, s, parts, B, &r)) return 0;
    /* the plan takes one T: a fine-tuned model's extra rows of wpe (more
     * positions than this run's context) are counted apart, each element
     * with its gradient, moments and master copy */
    double wpe = (double)(s->config.max_context - s->T) * s->config.channels *
                 (2.0 * (double)gpc_dtype_size(s->precision) + 8 + (s->precision != GPC_F32) * 4);
    /* on the CPU the offloaded state is host memory like the rest */
    double host = o->device.type == GPC_DEVICE_CUDA ? 0 : (double)r.host_pinned;
    /* a GPU's context exists by the time its free memory is read */
    return (double)(r.total - r.context) + host + wpe + 6.0 * B * (double)s->T * sizeof(int32_t);
}

/* ------------------------------------------------------------ auto-fit */

/* The micro-batch auto-fit goes on at after B ran out of memory: B over
 * its smallest prime factor (half of an even B), so that the step's B x
 * accumulation tokens stay the same; 0 when B is 1. */
static int smaller_batch(int B) {
    for (int p = 2; p * p <= B; p++)
        if (B % p == 0) return B / p;
    return B > 1 ? 1 : 0;
}

static int auto_fit_on(const trainer *t) {
    /* every rank would have to agree on the new micro-batch: one process
     * only (a tp or pp part is one of several, even without data parallelism) */
    return !t->o->no_auto_fit && t->o->world_size <= 1 && !t->o->dist && !t->parts;
}

/* Memory the device has free now, as the allocator will see it (the
 * GPC_DEVICE_MEMORY_LIMIT cap included); 0 when unknown. */
static double device_free(gpc_device device) {
    size_t free_bytes = 0;
    if (gpc_device_memory_free(device, &free_bytes, NULL) != GPC_OK) {
        gpc_clear_error();
        return 0;
    }
    return (double)free_bytes;
}

/* Micro-batch B to `to`, accumulation up by as much: the same step. */
static void set_batch(run_settings *s, int to) {
    int factor = s->B / to;
    s->B = to;
    s->accumulation *= factor;
    /* validation over the same windows: as many more batches */
    s->eval_batches *= factor;
}

/* Before allocating on a GPU: when gpc plan says the asked micro-batch
 * cannot fit in the memory free now, start at the largest that can. */
static void fit_to_free_memory(trainer *t) {
    run_settings *s = &t->s;
    if (t->o->device.type != GPC_DEVICE_CUDA || !auto_fit_on(t)) return;
    double free_bytes = device_free(t->o->device), need = plan_bytes(t->o, s, t->parts, s->B);
    if (free_bytes <= 0 || need <= 0 || need <= free_bytes) return;
    int B = s->B, fit = s->B;
    while (fit > 1 && plan_bytes(t->o, s, t->parts, fit) > free_bytes)
        fit = smaller_batch(fit);
    if (fit == B) return;
    set_batch(s, fit);
    char a[32], b[32];
    gpc_log(GPC_LOG_WARN,
            "train: micro-batch %d needs %s by gpc plan, %s has %s free; starting at "
            "micro-batch %d x %d accumulation steps",
            B, gpc_format_bytes(need, a, sizeof a), gpc_device_name(t->o->device),
            gpc_format_bytes(free_bytes, b, sizeof b), s->B, s->accumulation);
}

/* An offloaded optimizer on a GPU pins its state in host memory (gpc plan's
 * host_pinned; the weights are drawn or read into it): a run needing more
 * than is free would be killed by the OOM killer while it pins, so it is
 * refused first. */
static gpc_status check_pinned_memory(const gpc_train_options *o, const run_settings *s,
                                      const train_parts *parts) {
    gpc_plan_result r;
    if (!o->offload_optimizer || !plan_run(o, s, parts, s->B, &r)) return GPC_OK;
    return gpc_host_memory_check((double)r.host_pinned, "--offload-optimizer needs",
                                 " pinned for the optimizer state",
                                 "train a smaller model, or leave out --offload-optimizer where "
                                 "the GPU holds the optimizer state");
}

/* On the CPU the model lives in host memory beside everything else on the
 * machine: a plan larger than what is free now (MemAvailable, the cgroup's
 * limit) would be killed by the OOM killer part way, so it is refused before
 * anything is allocated. Each process of a data-parallel run holds a replica
 * (ZeRO-1 shards the optimizer state); of a model-parallel one, a part. */
static gpc_status check_host_memory(const gpc_train_options *o, const run_settings *s,
                                    const train_parts *parts) {
    if (o->device.type != GPC_DEVICE_CPU) return check_pinned_memory(o, s, parts);
    return gpc_host_memory_check(plan_bytes(o, s, parts, s->B), "this run needs", "",
                                 "use a smaller --context, --batch or model, or --recompute");
}

/* ------------------------------------------------------------ run folder */

static gpc_status write_config(const trainer *t) {
    const run_settings *s = &t->s;
    char path[4096], text[4096], device_name[128] = "unknown";
    const gpc_backend *backend = gpc_backend_get(t->o->device.type);
    if (backend && backend->device_name)
        (void)backend->device_name(t->o->device.index, device_name, sizeof device_name);
    snprintf(path, sizeof path, "%s/config.txt", t->o->out_dir);
    snprintf(text, sizeof text,
             "# gpc training run: the settings it was started with\n"
             "data=%s\nlayers=%d\nheads=%d\nchannels=%d\ncontext=%d\nvocab_size=%d\n"
             "padded_vocab=%d\nparameters=%zu\nbatch=%d\ntotal_batch=%lld\n"
             "accumulation_steps=%d\nsteps=%d\nlr=%g\nwarmup=%d\nmin_lr_ratio=%g\n"
             "weight_decay=%g\nmax_grad_norm=%g\neval_every=%d\neval_batches=%d\n"
             "checkpoint_every=%d\nseed=%llu\ndevice=%s\nprecision=%s\nrecompute=%d\n"
             "recompute_layers=%d\nbatch_asked=%d\n%s_name=%s\ngpcd_job=%s\ninit_from=%"
             "s\ntokenizer=%s\n",
             t->o->data_dir, s->config.layers, s->config.heads, s->config.channels,
             s->config.max_context, s->config.vocab_size, s->config.padded_vocab,
             gpt_config_num_params(&s->config), s->B, (long long)s->total_batch, s->accumulation,
             s->steps, s->schedule.lr, s->schedule.warmup, s->schedule.min_lr_ratio,
             s->weight_decay, s->max_grad_norm, s->eval_every, s->eval_batches, s->checkpoint_every,
             (unsigned long long)s->seed, gpc_device_name(t->o->device),
             gpc_dtype_name(s->precision), gpt_recompute_level(s->recompute), s->recompute >> 2,
             /* 0: every block */ s->batch_asked,
             t->o->device.type == GPC_DEVICE_CPU ? "cpu" : "gpu", device_name,
             gpc_setting_given("GPC_JOB_ID") ? gpc_setting_given("GPC_JOB_ID") : "",
             t->o->init_from ? t->o->init_from : "", t->tokenizer_kind);
    return gpc_write_file(path, text, strlen(text));
}

/* RUN/tokenizer.bin: a byte copy of the dataset's, loaded (checksum and
 * fields) first, so that a damaged one stops the run before training
 * rather than the sampling after it. */
static gpc_status copy_tokenizer(const trainer *t) {
    char from[4096], to[4096];
    snprintf(from, sizeof from, "%s/tokenizer.bin", t->o->data_dir);
    snprintf(to, sizeof to, "%s/tokenizer.bin", t->o->out_dir);
    gpc_tokenizer *check;
    GPC_TRY(gpc_tokenizer_load(&check, from));
    gpc_tokenizer_free(check);
    return gpc_copy_file(from, to);
}

/* Opens metrics.jsonl: new for a new run; for a resumed run, keeps the lines
 * up to the checkpoint's step (later ones belong to steps that are redone). */
static gpc_status open_metrics(trainer *t, int resume) {
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", t->o->out_dir);
    char *old = NULL;
    size_t size = 0;
    if (resume && gpc_path_exists(path)) GPC_TRY(gpc_read_file(path, &old, &size));
    t->metrics = fopen(path, "w");
    if (!t->metrics) {
        gpc_free(old);
        return gpc_error(GPC_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    }
    /* strtol, not sscanf: glibc's sscanf measures the whole rest of the
     * buffer on every call, which made a resume quadratic in the file's
     * length (34 s for 200,000 lines, minutes for a longer run) */
    static const char key[] = "{\"step\":";
    for (char *line = old; line && *line;) {
        char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line + 1) : strlen(line);
        if (end && !strncmp(line, key, sizeof key - 1)) {
            char *digits = line + sizeof key - 1, *after;
            long step = strtol(digits, &after, 10);
            if (after > digits && step <= t->step) fwrite(line, 1, n, t->metrics);
        }
        line += n;
    }
    gpc_free(old);
    fflush(t->metrics);
    return GPC_OK;
}

/* JSON has no NaN or infinity: those become null. */
static void json_number(FILE *f, const char *key, double value) {
    if (isfinite(value))
        fprintf(f, ",\"%s\":%.9g", key, value);
    else
        fprintf(f, ",\"%s\":null", key);
}

static void write_metrics(trainer *t, const gpc_train_event *e) {
    FILE *f = t->metrics;
    if (!f) return; /* ranks other than 0 */
    fprintf(f, "{\"step\":%d", e->step);
    json_number(f, "loss", e->loss);
    if (!isnan(e->val_loss)) json_number(f, "val_loss", e->val_loss);
    json_number(f, "lr", e->lr);
    json_number(f, "grad_norm", e->grad_norm);
    if (e->skipped_steps) {
        fprintf(f, ",\"skipped\":%d,\"skipped_steps\":%d", e->skipped, e->skipped_steps);
        json_number(f, "loss_scale", e->loss_scale);
    }
    json_number(f, "tokens_per_s", e->tokens_per_s);
    json_number(f, "ms", e->ms);
    fprintf(f, ",\"memory\":%llu", (unsigned long long)e->memory_bytes);
    /* GPU readings only where NVML gave them: absent, not null, otherwise */
    if (!isnan(e->gpu_power_w)) json_number(f, "gpu_power_w", e->gpu_power_w);
    if (!isnan(e->gpu_step_energy_j)) json_number(f, "gpu_step_energy_j", e->gpu_step_energy_j);
    if (e->gpu_sm_clock_mhz >= 0) fprintf(f, ",\"gpu_sm_clock_mhz\":%d", e->gpu_sm_clock_mhz);
    if (e->gpu_power_capped >= 0) fprintf(f, ",\"gpu_power_capped\":%d", e->gpu_power_capped);
    /* data parallel: the share of the step spent waiting on the gradient
     * exchange (what gpc doctor --run reads), and its bandwidth */
    if (!isnan(e->comm_exposed_ms) && e->ms > 0) {
        json_number(f, "comm_exposed", e->comm_exposed_ms / e->ms);
        json_number(f, "comm_exposed_ms", e->comm_exposed_ms);
        json_number(f, "comm_bus_gbs", e->comm_bus_gbs);
    }
    /* the share of the step blocked on the loader (gpc doctor's input-bound) */
    if (!isnan(e->input_wait_ms) && e->ms > 0) {
        json_number(f, "input_wait", e->input_wait_ms / e->ms);
        json_number(f, "input_wait_ms", e->input_wait_ms);
    }
    fprintf(f, ",\"tokens\":%llu}\n", (unsigned long long)e->tokens_seen);
    fflush(f);
}

static gpc_status save_checkpoint(trainer *t) {
    gpt_checkpoint_state st;
    gpc_loader_state ls;
    memset(&st, 0, sizeof st);
    gpc_prefetch_get_state(t->train, &ls); /* the last batch trained on, not the thread's */
    st.step = (uint64_t)t->step;
    st.loader_epoch = ls.epoch;
    /* in batches of one process: with W ranks each has taken ls.batch, so
     * the run is W times as far into the window order, and a run resumed at
     * another world size continues at the same place (same --batch) */
    st.loader_batch = ls.batch * (uint64_t)(t->o->world_size > 0 ? t->o->world_size : 1);
    st.rng = t->rng;
    st.loss_scale = gpt_loss_scale(t->model);
    st.batch = t->s.B;
    st.context = t->s.T;
    st.total_batch = t->s.total_batch;
    st.steps = t->s.steps;
    st.warmup = t->s.schedule.warmup;
    st.learning_rate = t->s.schedule.lr;
    st.min_lr_ratio = t->s.schedule.min_lr_ratio;
    st.weight_decay = t->s.weight_decay;
    st.max_grad_norm = t->s.max_grad_norm;
    st.seed = t->s.seed;
    st.recompute = t->s.recompute;
    if (t->lora.rank) return gpt_lora_save(t->lora_path, t->model, &st, t->base_run);
    /* ZeRO-1: every rank takes part; rank 0 gets the whole state */
    gpt_host_state full = {0};
    if (t->parts) {
        /* the first copy's parts make the file, from their whole local
         * state (ZeRO-1 gathers each part's shards first) */
        gpt_host_state mine = {0};
        gpc_status gathered = t->ddp ? gpc_ddp_gather_state(t->ddp, &mine) : GPC_OK;
        if (gathered == GPC_OK && t->o->rank == 0)
            gathered = gpc_tp_gather_full(t->model, t->parts->model, &mine, &full);
        gpt_host_state_free(&mine);
        GPC_TRY(gathered);
    } else if (t->ddp) {
        GPC_TRY(gpc_ddp_gather_state(t->ddp, &full));
    }
    gpc_status s = GPC_OK;
    /* The previous checkpoint gets a second name (a hard link) before the
     * new one is written beside it and renamed over checkpoint.bin: at every
     * moment checkpoint.bin is a whole checkpoint, and checkpoint.prev.bin
     * the one before, whatever kills the process or fills the disk. A
     * checkpoint.bin that could not be loaded is not made the previous one. */
    if (t->rank0 && !t->current_damaged && gpc_path_exists(t->checkpoint_path))
        s = gpc_link_replace(t->checkpoint_path, t->prev_path);
    if (t->rank0 && s == GPC_OK)
        s = gpt_checkpoint_save_full(t->checkpoint_path, t->model, &st, &full);
    if (s == GPC_OK) t->current_damaged = 0;
    gpt_host_state_free(&full);
    return s;
}

/* ------------------------------------------------------------ GPU readings */

static void gpu_readings_unknown(gpc_train_event *e) {
    e->gpu_power_w = e->gpu_power_limit_w = NAN;
    e->gpu_sm_clock_mhz = e->gpu_sm_clock_max_mhz = -1;
    e->gpu_power_capped = -1;
    e->gpu_step_energy_j = NAN;
    e->comm_exposed_ms = e->comm_busy_ms = e->comm_bus_gbs = NAN;
    e->input_wait_ms = NAN;
}

/* Finds this process's GPU in NVML. NVML numbers all GPUs of the machine and
 * ignores CUDA_VISIBLE_DEVICES, so the GPU is matched by its PCI bus id. Any
 * failure leaves t->nvml NULL, says why at debug level and lets training go
 * on without readings. */
static void open_gpu_readings(trainer *t) {
    gpc_device device = t->o->device;
    if (device.type != GPC_DEVICE_CUDA) return;
    const gpc_backend *b = gpc_backend_get(device.type);
    char bus_id[64];
    gpc_status s = b && b->device_pci_bus_id
                       ? b->device_pci_bus_id(device.index, bus_id, sizeof bus_id)
                       : gpc_error(GPC_ERR_UNSUPPORTED, "the backend gives no PCI bus id");
    if (s == GPC_OK) s = gpc_nvml_open_bus_id(bus_id, &t->nvml, &t->nvml_index);
    if (s != GPC_OK) {
        gpc_log(GPC_LOG_DEBUG, "train: no GPU power or clock readings for %s: %s",
                gpc_device_name(device), gpc_last_error());
        gpc_clear_error();
        return;
    }
    gpc_log(GPC_LOG_DEBUG, "train: %s (PCI %s) is NVML's GPU %d", gpc_device_name(device), bus_id,
            t->nvml_index);
}

/* Reads the GPU's power, SM clock and throttle reasons into the event and
 * the run's counts; a reading NVML cannot give stays unknown. A reading takes
 * about 1.5 ms and NVML's power is an average over about a second, so steps
 * shorter than GPU_READ_PERIOD_S are read once per period (and the last
 * step always): a small model's millisecond steps do not pay for it. */
#define GPU_READ_PERIOD_S 0.5
static void sample_gpu(trainer *t, gpc_train_event *e) {
    if (!t->nvml) return;
    double now = gpc_time_seconds();
    int last = t->step + 1 == t->s.steps;
    if (t->gpu_last_read > 0 && now - t->gpu_last_read < GPU_READ_PERIOD_S && !last) return;
    t->gpu_last_read = now;
    gpc_nvml_power p;
    if (gpc_nvml_sample_power(t->nvml, t->nvml_index, &p) != GPC_OK) {
        if (!t->gpu_sample_failed)
            gpc_log(GPC_LOG_DEBUG, "train: reading the GPU failed: %s", gpc_last_error());
        t->gpu_sample_failed = 1;
        gpc_clear_error();
        return;
    }
    if (p.power_w >= 0) e->gpu_power_w = p.power_w;
    if (p.power_limit_w > 0) e->gpu_power_limit_w = t->gpu_power_limit_w = p.power_limit_w;
    e->gpu_sm_clock_mhz = p.sm_clock_mhz;
    if (p.sm_clock_max_mhz > 0) e->gpu_sm_clock_max_mhz = t->gpu_clock_max_mhz = p.sm_clock_max_mhz;
    if (p.sm_clock_mhz >= 0)
        t->gpu_clocks[t->gpu_clock_count++ % GPC_TRAIN_CLOCK_STEPS] = p.sm_clock_mhz;
    if (p.energy_j >= 0)
        e->gpu_step_energy_j = gpc_energy_meter_read(&t->gpu_energy, t->step, now, p.energy_j);
    if (p.throttle_reasons < 0) return; /* no verdict on power: not a sampled step */
    e->gpu_power_capped = (p.throttle_reasons & (int64_t)(GPC_NVML_THROTTLE_SW_POWER_CAP |
                                                          GPC_NVML_THROTTLE_HW_POWER_BRAKE)) != 0;
    t->gpu_sampled++;
    t->gpu_capped += e->gpu_power_capped;
}

static int compare_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The run's GPU figures into the result; sorts the kept clocks, so it is
 * called once, after the loop. */
static void gpu_result(trainer *t, gpc_train_result *result) {
    result->gpu_steps_sampled = t->gpu_sampled;
    result->gpu_steps_power_capped = t->gpu_capped;
    result->gpu_sm_clock_max_mhz = t->gpu_clock_max_mhz;
    result->gpu_power_limit_w = t->gpu_power_limit_w;
    int world = t->o->world_size > 1 ? t->o->world_size : 1;
    result->gpu_energy_j = gpc_energy_meter_total(&t->gpu_energy, &result->gpu_energy_steps);
    result->gpu_energy_tokens = (int64_t)result->gpu_energy_steps * t->s.total_batch / world;
    int n = t->gpu_clock_count < GPC_TRAIN_CLOCK_STEPS ? t->gpu_clock_count : GPC_TRAIN_CLOCK_STEPS;
    result->gpu_sm_clock_median_mhz = -1;
    if (n == 0) return;
    qsort(t->gpu_clocks, (size_t)n, sizeof t->gpu_clocks[0], compare_int);
    /* an even count takes the mean of the middle two, rounded */
    result->gpu_sm_clock_median_mhz =
        n % 2 ? t->gpu_clocks[n / 2] : (t->gpu_clocks[n / 2 - 1] + t->gpu_clocks[n / 2] + 1) / 2;
}

int gpc_train_power_summary(const gpc_train_result *r, char *buf, size_t size) {
    if (size) buf[0] = '\0';
    int sampled = r->gpu_steps_sampled, capped = r->gpu_steps_power_capped;
    if (sampled < 3 || capped < 0 || capped > sampled || 2 * (int64_t)capped < sampled) return 0;
    char limit[32] = "", clock[64] = "";
    if (r->gpu_power_limit_w > 0) snprintf(limit, sizeof limit, " (%.0f W)", r->gpu_power_limit_w);
    if (r->gpu_sm_clock_median_mhz >= 0 && r->gpu_sm_clock_max_mhz > 0)
        snprintf(clock, sizeof clock, ", SM clock median %d of %d MHz", r->gpu_sm_clock_median_mhz,
                 r->gpu_sm_clock_max_mhz);
    else if (r->gpu_sm_clock_median_mhz >= 0)
        snprintf(clock, sizeof clock, ", SM clock median %d MHz", r->gpu_sm_clock_median_mhz);
    /* rounded down, so 199 of 200 is 99%, not 100% */
    snprintf(
        buf, size,
        "the GPU was at its power limit%s in %d%% of %d steps read%s: power, not kernel speed, "
        "bounds the step",
        limit, (int)((int64_t)capped * 100 / sampled), sampled, clock);
    return 1;
}

void gpc_energy_meter_init(gpc_energy_meter *m) {
    memset(m, 0, sizeof *m);
    m->first_step = m->base_step = -1;
}

/* Readings are taken at the same point of their steps, so the difference of
 * two is the energy of the steps between them. The driver updates the
 * counter only every so often (an H200 showed no change over 50 ms), so a
 * difference counts once the readings are GPC_ENERGY_PERIOD_S apart and the
 * counter has moved; until then the earlier reading stays the base. A
 * counter that went back (the driver reloaded) starts the base again. */
double gpc_energy_meter_read(gpc_energy_meter *m, int step, double now, double energy_j) {
    if (!(energy_j >= 0)) return NAN;
    if (m->base_step < 0) {
        m->first_j = m->base_j = energy_j;
        m->first_step = m->base_step = step;
        m->base_time = now;
        return NAN;
    }
    if (energy_j < m->base_j) { /* a new counter: what came before cannot be compared */
        gpc_energy_meter_init(m);
        return gpc_energy_meter_read(m, step, now, energy_j);
    }
    if (step <= m->base_step || now - m->base_time < GPC_ENERGY_PERIOD_S || energy_j == m->base_j)
        return NAN;
    double per_step = (energy_j - m->base_j) / (step - m->base_step);
    m->base_j = energy_j;
    m->base_step = step;
    m->base_time = now;
    return per_step;
}

double gpc_energy_meter_total(const gpc_energy_meter *m, int *steps) {
    *steps = m->base_step > m->first_step ? m->base_step - m->first_step : 0;
    return *steps ? m->base_j - m->first_j : 0.0;
}

/* v with thousands separated by commas ("11,038"). */
static const char *grouped(char *buf, size_t size, double v) {
    char digits[32];
    snprintf(digits, sizeof digits, "%.0f", v);
    size_t n = strlen(digits), o = 0;
    for (size_t i = 0; i < n && o + 2 < size; i++) {
        if (i > 0 && digits[0] != '-' && (n - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o < size ? o : size - 1] = '\0';
    return buf;
}

/* j joules to three significant digits in J, kJ or MJ ("475 J", "4.75 kJ"). */
static const char *joules(char *buf, size_t size, double j) {
    if (j >= 1e6)
        snprintf(buf, size, "%.3g MJ", j / 1e6);
    else if (j >= 1e3)
        snprintf(buf, size, "%.3g kJ", j / 1e3);
    else
        snprintf(buf, size, "%.3g J", j);
    return buf;
}

int gpc_train_energy_summary(const gpc_train_result *r, char *buf, size_t size) {
    if (size) buf[0] = '\0';
    if (!(r->gpu_energy_j > 0) || r->gpu_energy_steps < 1 || r->gpu_energy_tokens < 1) return 0;
    char total[32], step[32], per_token[32];
    snprintf(buf, size, "the GPU used %s over %d step%s: %s a step, %s tokens per joule",
             joules(total, sizeof total, r->gpu_energy_j), r->gpu_energy_steps,
             r->gpu_energy_steps == 1 ? "" : "s",
             joules(step, sizeof step, r->gpu_energy_j / r->gpu_energy_steps),
             grouped(per_token, sizeof per_token, (double)r->gpu_energy_tokens / r->gpu_energy_j));
    return 1;
}

/* ------------------------------------------------------------ the loop */

static size_t memory_in_use(gpc_device device) {
    if (device.type == GPC_DEVICE_CPU) return gpc_process_rss();
    const gpc_backend *b = gpc_backend_get(device.type);
    size_t free_bytes = 0, total = 0;
    if (b && b->memory_info && b->memory_info(device.index, &free_bytes, &total) == GPC_OK)
        return total - free_bytes;
    return 0;
}

static gpc_status evaluate(trainer *t, float *val_loss) {
    uint64_t batches = gpc_loader_batches_per_epoch(t->val);
    if (batches > (uint64_t)t->s.eval_batches) batches = (uint64_t)t->s.eval_batches;
    gpc_loader_rewind(t->val);
    double sum = 0;
    for (uint64_t i = 0; i < batches; i++) {
        float loss;
        GPC_TRY(gpc_loader_next(t->val, t->inputs, t->targets));
        if (t->pipe_inputs) { /* forward through the stages */
            GPC_TRY(gpc_pipeline_eval(t->model, t->parts->pp, t->inputs, t->targets, t->s.B, t->s.T,
                                      &loss));
        } else {
            GPC_TRY(gpt_forward(t->model, t->inputs, t->targets, t->s.B, t->s.T));
            GPC_TRY(gpt_mean_loss(t->model, &loss));
        }
        sum += loss;
    }
    if (t->ddp) { /* the mean over every rank's validation batches */
        double total[1] = {sum};
        GPC_TRY(gpc_ddp_reduce_host(t->ddp, total, 1));
        sum = total[0] / t->o->world_size;
    }
    *val_loss = (float)(sum / (double)batches);
    return GPC_OK;
}

static void emit(const trainer *t, const gpc_train_event *e) {
    if (t->o->callback && t->rank0) t->o->callback(t->o->user, e);
}

/* A pipeline stage's forward and backward passes of one step: every stage
 * reads the step's micro-batches (the first uses the inputs, the last the
 * targets) and gpc_pipeline_step runs them in the 1F1B order. */
static gpc_status pipeline_step(trainer *t, float dloss, double *input_wait_ms) {
    const run_settings *s = &t->s;
    size_t n = (size_t)s->B * (size_t)s->T;
    for (int micro = 0; micro < s->accumulation; micro++) {
        /* the copies back to the host wait for the batch's transfer: they
         * are part of the wait for input */
        double waited = gpc_time_seconds();
        gpc_batch batch;
        GPC_TRY(gpc_prefetch_next(t->train, &batch));
        gpc_tensor in = gpc_tensor_2d(t->pipe_inputs + micro * n, GPC_I32, gpc_cpu(), s->B, s->T);
        gpc_tensor tg = gpc_tensor_2d(t->pipe_targets + micro * n, GPC_I32, gpc_cpu(), s->B, s->T);
        GPC_TRY(gpc_tensor_copy(&in, &batch.inputs));
        GPC_TRY(gpc_tensor_copy(&tg, &batch.targets));
        *input_wait_ms += (gpc_time_seconds() - waited) * 1e3;
    }
    gpc_pipeline_timing timing;
    gpc_trace_push("pipeline");
    gpc_status st = gpc_pipeline_step(t->model, t->parts->pp, t->ddp, t->pipe_inputs,
                                      t->pipe_targets, s->accumulation, s->B, s->T, dloss, &timing);
    gpc_trace_pop();
    GPC_TRY(st);
    t->pipe_sum.step_s += timing.step_s;
    t->pipe_sum.compute_s += timing.compute_s;
    t->pipe_sum.predicted = timing.predicted;
    return GPC_OK;
}

/* The pipeline's bubble over the run, stage by stage, in the log. */
static gpc_status report_bubble(trainer *t) {
    if (!t->pipe_inputs || t->pipe_sum.step_s <= 0) return GPC_OK;
    const gpt_parallel *par = &t->parts->par;
    double stage[2 * 64] = {0};
    int P = par->pp_size < 64 ? par->pp_size : 64;
    if (par->pp_rank < P) {
        stage[par->pp_rank] = t->pipe_sum.step_s;
        stage[64 + par->pp_rank] = t->pipe_sum.compute_s;
    }
    GPC_TRY(t->parts->pp->ops->all_reduce_host(t->parts->pp, stage, 2 * 64));
    if (!t->rank0) return GPC_OK;
    char line[1024];
    int at = 0;
    for (int k = 0; k < P && at < (int)sizeof line - 64; k++)
        at += snprintf(line + at, sizeof line - (size_t)at, "%s stage %d %.0f%% of %.1f s",
                       k ? "," : "", k, 100.0 * (1.0 - stage[64 + k] / stage[k]), stage[k]);
    gpc_log(GPC_LOG_INFO,
            "train: pipeline bubble (idle share of the pipelined time):%s; 1F1B "
            "predicts %.0f%%",
            line, 100.0 * t->pipe_sum.predicted);
    return GPC_OK;
}

static void watch_parts(trainer *t, int active) {
    const train_parts *p = t->parts;
    p->tp->ops->watch(p->tp, active);
    p->pp->ops->watch(p->pp, active);
    p->model->ops->watch(p->model, active);
}

/* One optimizer step; the loss and gradient norm go into the event. */
static gpc_status train_step(trainer *t, gpc_train_event *e) {
    const run_settings *s = &t->s;
    /* with W ranks the summed gradients must be those of the mean over W */
    int world = t->ddp ? t->o->world_size : 1;
    float dloss = (float)(1.0 / ((double)s->B * s->T * s->accumulation * world));
    /* a fault injected on purpose: a step that runs out of device memory,
     * as the first steps on a full GPU can (lazily made workspaces) */
    if (!t->oom_injected && gpc_setting_int("GPC_TEST_OOM_STEP") == t->step + 1) {
        t->oom_injected = 1;
        return gpc_error(GPC_ERR_NOMEM, "out of memory in step %d (GPC_TEST_OOM_STEP)",
                         t->step + 1);
    }
    GPC_TRY(gpt_zero_grad(t->model));
    /* the NCCL watchdog of each model-parallel group watches the step: a
     * slice or stage that died leaves the others in a collective */
    if (t->parts) watch_parts(t, 1);
    /* The batches arrive on the device through the copy stream, and the
     * model sums the micro-steps' losses on the device: nothing inside the
     * step waits for the GPU; gpt_read_step below is the one wait. */
    e->input_wait_ms = 0;
    if (t->pipe_inputs) GPC_TRY(pipeline_step(t, dloss, &e->input_wait_ms));
    for (int micro = 0; !t->pipe_inputs && micro < s->accumulation; micro++) {
        gpc_batch batch;
        /* the time blocked on the loader: two clock reads a micro-step */
        double waited = gpc_time_seconds();
        gpc_trace_push("data");
        gpc_status st = gpc_prefetch_next(t->train, &batch);
        gpc_trace_pop();
        e->input_wait_ms += (gpc_time_seconds() - waited) * 1e3;
        GPC_TRY(st);
        if (t->ddp) GPC_TRY(gpc_ddp_micro_step(t->ddp, micro == s->accumulation - 1));
        gpc_trace_push("forward+backward");
        st = gpt_forward_backward_device(t->model, &batch.inputs, &batch.targets, batch.unmasked,
                                         dloss);
        gpc_trace_pop();
        GPC_TRY(st);
    }
    gpc_optim_options adam;
    gpc_optim_defaults(&adam);
    adam.learning_rate = (float)gpc_lr_at(&s->schedule, t->step);
    adam.weight_decay = (float)s->weight_decay;
    adam.max_grad_norm = (float)s->max_grad_norm;
    adam.step = t->step + 1;
    /* bf16 copies are rounded to nearest from the f32 master (a resumed run
     * then repeats bit for bit); GPC_STOCHASTIC_ROUNDING=1 rounds them
     * stochastically. The draw happens either way, so the RNG stream and the
     * checkpoint do not depend on the choice. */
    uint32_t draw = gpc_rng_u32(&t->rng);
    adam.seed = s->stochastic_rounding ? (draw | 1u) : 0;
    /* offloaded on a GPU, the CPU update runs on while the next step's
     * forward waits for each layer's new weights alone */
    adam.overlap = gpc_setting_flag("GPC_OFFLOAD_OVERLAP");
    gpc_trace_push("optimizer");
    gpc_status update_status = GPC_OK;
    if (t->ddp) update_status = gpc_ddp_finish_backward(t->ddp);
    if (update_status == GPC_OK)
        update_status =
            t->ddp ? gpc_ddp_update(t->ddp, &adam, NULL) : gpt_update(t->model, &adam, NULL, NULL);
    gpc_trace_pop();
    GPC_TRY(update_status);
    /* The GPU is still working through the queued step while the host, which
     * would only wait, reads its power and clock: the readings are those of
     * the loaded GPU, and cost the step nothing unless the GPU finishes first. */
    sample_gpu(t, e);
    /* fp16: the overflow verdict comes back with the loss */
    GPC_TRY(gpt_read_step(t->model, &e->loss, &e->grad_norm));
    e->skipped = gpt_step_skipped(t->model);
    if (t->ddp) /* the step is finished: its exchange's events can be read */
        GPC_TRY(
            gpc_ddp_comm_times(t->ddp, &e->comm_exposed_ms, &e->comm_busy_ms, &e->comm_bus_gbs));
    if (t->ddp) { /* the step's loss over all ranks, and whether any was asked to stop */
        double v[2] = {e->loss, gpc_train_stop_requested() ? 1.0 : 0.0};
        GPC_TRY(gpc_ddp_reduce_host(t->ddp, v, 2));
        e->loss = (float)(v[0] / world);
        t->stop_all = v[1] > 0;
    }
    if (t->parts) {
        /* the loss is the last stage's (the others read 0); the parts of
         * one model stop together */
        gpc_dist *d = t->parts->model;
        int last = t->parts->par.pp_rank == t->parts->par.pp_size - 1;
        double v[2] = {last && t->parts->par.tp_rank == 0 ? e->loss : 0.0,
                       t->ddp                       ? t->stop_all
                       : gpc_train_stop_requested() ? 1.0
                                                    : 0.0};
        GPC_TRY(d->ops->all_reduce_host(d, v, 2));
        e->loss = (float)v[0];
        t->stop_all = v[1] > 0;
        watch_parts(t, 0);
    }
    if (e->skipped) e->grad_norm = NAN; /* fp16 overflow: no finite norm */
    t->skipped_steps += e->skipped;
    e->skipped_steps = t->skipped_steps;
    e->loss_scale = gpt_loss_scale(t->model);
    e->lr = adam.learning_rate;
    if (!isfinite(e->loss))
        return gpc_error(GPC_ERR_INTERNAL,
                         "the loss became %f at step %d: training diverged; lower --lr (now %g) "
                         "or resume from the last checkpoint",
                         (double)e->loss, t->step + 1, s->schedule.lr);
    return GPC_OK;
}

static gpc_status run_loop(trainer *t, gpc_train_result *result) {
    const run_settings *s = &t->s;
    double start = gpc_time_seconds(), timed = 0, first_seconds = 0;
    int timed_steps = 0, first = t->step;
    float last_val = NAN;
    gpc_train_event e;
    while (t->step < s->steps) {
        memset(&e, 0, sizeof e);
        gpu_readings_unknown(&e);
        double t0 = gpc_time_seconds();
        GPC_TRY(train_step(t, &e));
        double seconds = gpc_time_seconds() - t0;
        t->step++;
        /* the first step of a process pays for page faults and thread start:
         * leave it out of the estimate once there are others */
        if (t->step == first + 1) {
            first_seconds = seconds;
        } else {
            timed += seconds;
            timed_steps++;
        }
        e.kind = GPC_TRAIN_STEP;
        e.step = t->step;
        e.ms = seconds * 1e3;
        e.tokens_per_s = (double)s->total_batch / seconds;
        e.tokens_seen = (uint64_t)t->step * (uint64_t)s->total_batch;
        e.eta_s = (timed_steps ? timed / timed_steps : first_seconds) * (s->steps - t->step);
        e.memory_bytes = memory_in_use(t->o->device);
        e.val_loss = NAN;
        int last = t->step == s->steps;
        /* --stop-after: the run's own end for validation and the checkpoint */
        int stop_early = t->o->stop_after > 0 && t->step - first >= t->o->stop_after;
        last = last || stop_early;
        if (t->val && s->eval_every && (t->step % s->eval_every == 0 || last)) {
            gpc_trace_push("evaluate");
            gpc_status eval_status = evaluate(t, &e.val_loss);
            gpc_trace_pop();
            GPC_TRY(eval_status);
            last_val = e.val_loss;
        }
        write_metrics(t, &e);
        emit(t, &e);
        if (!isnan(e.val_loss)) {
            gpc_train_event v = e;
            v.kind = GPC_TRAIN_EVAL;
            emit(t, &v);
        }
        int stop = t->ddp || t->parts ? t->stop_all : gpc_train_stop_requested();
        if (last || stop || (s->checkpoint_every && t->step % s->checkpoint_every == 0)) {
            GPC_TRY(save_checkpoint(t));
            t->saved = 1;
            gpc_train_event c = e;
            c.kind = GPC_TRAIN_CHECKPOINT;
            c.path = t->checkpoint_path;
            emit(t, &c);
        }
        if (result) {
            result->steps_done = t->step;
            result->last_loss = e.loss;
            result->last_val_loss = last_val;
            result->seconds = gpc_time_seconds() - start;
        }
        if (stop_early) break;
        if (stop && !last)
            return gpc_error(GPC_ERR_INTERRUPTED,
                             "interrupted after step %d of %d: checkpoint saved at step %d; "
                             "resume with --resume (%s)",
                             t->step, s->steps, t->step, t->checkpoint_path);
    }
    return GPC_OK;
}

/* Fine-tuning: the weights of --init-from's checkpoint, its optimizer
 * state left behind. They load straight into the training model (its part
 * under --tp/--pp), so the host holds no copy of the model; a LoRA base is
 * read through a host model and set, its frozen weights having no master. */
static gpc_status init_weights_from(trainer *t) {
    char path[4200];
    const char *from = t->lora.rank ? t->base_run : t->o->init_from;
    snprintf(path, sizeof path, "%s/checkpoint.bin", from);
    if (!t->lora.rank) {
        gpc_status s = gpt_checkpoint_load_weights(path, t->model);
        return s == GPC_OK ? s : gpc_error_context(s, "--init-from %s: ", from);
    }
    gpt_model *host = NULL;
    float *values = gpc_malloc(gpt_config_num_params(&t->s.config) * sizeof *values);
    gpc_status s = values ? GPC_OK : gpc_error(GPC_ERR_NOMEM, "out of host memory");
    if (s == GPC_OK) s = gpt_create(&host, &t->s.config, gpc_cpu(), GPC_F32, 1, 1, 0);
    if (s == GPC_OK) s = gpt_checkpoint_load(path, host, NULL);
    if (s == GPC_OK) s = gpt_get_params(host, values);
    gpt_free(host);
    if (s == GPC_OK) s = gpt_set_params(t->model, values);
    gpc_free(values);
    return s == GPC_OK ? s : gpc_error_context(s, "--init-from %s: ", from);
}

/* --init-from: the starting run's config, and its tokenizer must be the
 * dataset's when both have one (same bytes of tokenizer.bin). */
static gpc_status read_init(const gpc_train_options *o, gpt_config *init) {
    char path[4096], other[4096];
    snprintf(path, sizeof path, "%s/quant.bin", o->init_from);
    if (gpc_path_exists(path))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--init-from %s holds quantized weights (gpc quantize) for inference "
                         "only; train from the run it was quantized from (source_run in its "
                         "config.txt)",
                         o->init_from);
    snprintf(path, sizeof path, "%s/checkpoint.bin", o->init_from);
    if (!gpc_path_exists(path))
        return gpc_error(GPC_ERR_IO,
                         "--init-from %s has no checkpoint.bin: give a run folder of gpc train "
                         "or gpc import hf",
                         o->init_from);
    GPC_TRY(gpt_checkpoint_read_header(path, init, NULL, NULL));
    snprintf(path, sizeof path, "%s/tokenizer.bin", o->init_from);
    snprintf(other, sizeof other, "%s/tokenizer.bin", o->data_dir);
    if (!gpc_path_exists(path) || !gpc_path_exists(other)) return GPC_OK;
    char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    gpc_status s = gpc_read_file(path, &a, &na);
    if (s == GPC_OK) s = gpc_read_file(other, &b, &nb);
    if (s == GPC_OK && (na != nb || memcmp(a, b, na) != 0))
        s = gpc_error(GPC_ERR_MISMATCH,
                      "%s was tokenized with another tokenizer than --init-from %s: prepare it "
                      "with `gpc data prepare --tokenizer %s`",
                      o->data_dir, o->init_from, o->init_from);
    gpc_free(a);
    gpc_free(b);
    return s;
}

/* "gpc", "gpt2" or "none": the kind of the dataset's tokenizer, for config.txt */
static const char *tokenizer_kind(const char *data_dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.bin", data_dir);
    gpc_tokenizer *tok;
    if (!gpc_path_exists(path) || gpc_tokenizer_load(&tok, path) != GPC_OK) return "none";
    const char *kind = gpc_tokenizer_kind_name(gpc_tokenizer_get_kind(tok));
    gpc_tokenizer_free(tok);
    return kind;
}

/* Data parallelism over the caller's collectives, when there are ranks. */
static gpc_status open_ddp(trainer *t) {
    const gpc_train_options *o = t->o;
    if (o->world_size <= 1 && !o->dist) return GPC_OK;
    if (!o->dist || o->dist->world_size != o->world_size)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "training with %d processes needs their collectives (gpc_dist_create)",
                         o->world_size);
    gpc_ddp_options d;
    memset(&d, 0, sizeof d);
    d.zero = o->zero;
    d.bucket_mb = o->bucket_mb > 0   ? o->bucket_mb
                  : o->bucket_mb < 0 ? 0
                                     : GPC_DDP_DEFAULT_BUCKET_MB;
    d.no_comm = gpc_setting_flag("GPC_DDP_NO_COMM"); /* benchmarks: the step without comm */
    return gpc_ddp_create(&t->ddp, t->model, o->dist, &d);
}

static gpc_status open_run(trainer *t, const gpc_dataset_info *info,
                           const gpt_checkpoint_state *ck) {
    const gpc_train_options *o = t->o;
    const run_settings *s = &t->s;
    int world = o->world_size > 0 ? o->world_size : 1;
    /* the thread reads the shards while the model is built */
    GPC_TRY(gpc_prefetch_open(&t->train, o->data_dir, GPC_SPLIT_TRAIN, s->B, s->T, s->seed, o->rank,
                              world, o->device, 0));
    if (ck) { /* the header's position: the same the checkpoint load reads */
        /* in batches of the checkpoint's micro-batch, which auto-fit may
         * since have divided: as many more of the smaller ones */
        uint64_t scale = ck->batch > s->B ? (uint64_t)(ck->batch / s->B) : 1;
        gpc_loader_state ls = {ck->loader_epoch, ck->loader_batch / (uint64_t)world * scale};
        GPC_TRY(gpc_prefetch_set_state(t->train, &ls));
    }
    if (s->eval_every && info->val_tokens > (uint64_t)s->T * world)
        GPC_TRY(gpc_loader_open(&t->val, o->data_dir, GPC_SPLIT_VAL, s->B, s->T, s->seed, o->rank,
                                world));
    size_t n = (size_t)s->B * (size_t)s->T;
    t->inputs = gpc_malloc(n * sizeof(int32_t));
    t->targets = gpc_malloc(n * sizeof(int32_t));
    if (!t->inputs || !t->targets) return gpc_error(GPC_ERR_NOMEM, "out of host memory");
    if (t->lora.rank) {
        if (o->offload_optimizer)
            return gpc_error(GPC_ERR_UNSUPPORTED,
                             "--offload-optimizer does not train LoRA adapters, whose state is "
                             "small: leave it out with --lora");
        if (world > 1 || o->dist)
            return gpc_error(GPC_ERR_UNSUPPORTED,
                             "--lora trains on one process; leave out the extra processes");
        GPC_TRY(gpt_create_lora(&t->model, &s->config, o->device, s->precision, s->B, s->T, 1,
                                s->recompute, &t->lora));
        gpc_rng_seed(&t->rng, s->seed, 0x747261696eULL); /* "train" */
        GPC_TRY(init_weights_from(t));
        if (!ck) return GPC_OK;
        gpt_checkpoint_state loaded;
        GPC_TRY(gpt_lora_load(t->lora_path, t->model, &loaded));
        t->rng = loaded.rng;
        t->step = (int)loaded.step;
        return GPC_OK;
    }
    if (t->parts) {
        /* 1F1B keeps up to P - s micro-batches in flight on stage s */
        gpt_parallel par = t->parts->par;
        par.slots = par.pp_size - par.pp_rank;
        if (par.slots > s->accumulation) par.slots = s->accumulation;
        /* ZeRO-1: this rank's shard of its part's local layout, cut over
         * the data-parallel copies as gpc_ddp_create cuts the update */
        size_t lo = 0, count = SIZE_MAX;
        if (o->zero == 1 && o->dist && world > 1) {
            size_t *shard = gpc_calloc((size_t)world + 1, sizeof *shard);
            if (!shard) return gpc_error(GPC_ERR_NOMEM, "out of host memory");
            gpc_dist_shard_offsets(gpt_part_num_params(&s->config, &par), world, 64, shard);
            lo = shard[o->rank];
            count = shard[o->rank + 1] - lo;
            gpc_free(shard);
        }
        GPC_TRY(gpt_create_part(&t->model, &s->config, o->device, s->precision, s->B, s->T,
                                s->recompute, &par, lo, count));
        GPC_TRY(gpc_tp_attach(t->model, t->parts->tp));
        GPC_TRY(gpc_pipeline_attach(t->model, t->parts->pp));
        if (par.pp_size > 1) {
            size_t step_tokens = (size_t)s->accumulation * (size_t)s->B * (size_t)s->T;
            t->pipe_inputs = gpc_malloc(step_tokens * sizeof(int32_t));
            t->pipe_targets = gpc_malloc(step_tokens * sizeof(int32_t));
            if (!t->pipe_inputs || !t->pipe_targets)
                return gpc_error(GPC_ERR_NOMEM, "out of host memory");
        }
    } else if (o->zero == 1 && o->dist && world > 1 && o->rank >= 0 && o->rank < world) {
        /* ZeRO-1: this rank holds only its shard of m, v and the master
         * weights, cut as gpc_ddp_create cuts the update */
        size_t *shard = gpc_calloc((size_t)world + 1, sizeof *shard);
        if (!shard) return gpc_error(GPC_ERR_NOMEM, "out of host memory");
        gpc_dist_shard_offsets(gpt_config_num_params(&s->config), world, 64, shard);
        gpc_status st =
            gpt_create_shard(&t->model, &s->config, o->device, s->precision, s->B, s->T,
                             s->recompute, shard[o->rank], shard[o->rank + 1] - shard[o->rank]);
        gpc_free(shard);
        GPC_TRY(st);
    } else if (o->offload_optimizer) {
        GPC_TRY(gpt_create_offload(&t->model, &s->config, o->device, s->precision, s->B, s->T,
                                   s->recompute));
    } else {
        GPC_TRY(gpt_create_recompute(&t->model, &s->config, o->device, s->precision, s->B, s->T, 1,
                                     s->recompute));
    }
    gpc_rng_seed(&t->rng, s->seed, 0x747261696eULL); /* "train" */
    if (!ck) {
        GPC_TRY(o->init_from ? init_weights_from(t) : gpt_init_weights(t->model, s->seed));
        return open_ddp(t);
    }
    gpt_checkpoint_state loaded;
    GPC_TRY(gpt_checkpoint_load(t->resume_path, t->model, &loaded));
    t->rng = loaded.rng;
    t->step = (int)loaded.step;
    return open_ddp(t);
}

/* The newest checkpoint that loads: checkpoint.bin, else checkpoint.prev.bin
 * (a save cut short on a file system without hard links, a damaged disk),
 * said as a warning. */
static gpc_status pick_checkpoint(trainer *t, gpt_config *config, gpt_checkpoint_state *ck) {
    t->resume_path = t->checkpoint_path;
    int have = gpc_path_exists(t->checkpoint_path), have_prev = gpc_path_exists(t->prev_path);
    if (!have && !have_prev)
        return gpc_error(GPC_ERR_IO,
                         "nothing to resume: %s does not exist (train without --resume first)",
                         t->checkpoint_path);
    gpc_status s = have ? gpt_checkpoint_read_header(t->checkpoint_path, config, NULL, ck)
                        : gpc_error(GPC_ERR_IO, "%s does not exist", t->checkpoint_path);
    if (s == GPC_OK || !have_prev) return s;
    char why[1024];
    snprintf(why, sizeof why, "%s", gpc_last_error());
    gpc_clear_error();
    if (gpt_checkpoint_read_header(t->prev_path, config, NULL, ck) != GPC_OK) {
        gpc_clear_error();
        return gpc_error(s, "%s (and the previous checkpoint %s cannot be loaded either)", why,
                         t->prev_path);
    }
    t->resume_path = t->prev_path;
    t->current_damaged = have;
    gpc_log(GPC_LOG_WARN, "train: %s; resuming from the previous checkpoint %s (step %llu)", why,
            t->prev_path, (unsigned long long)ck->step);
    return GPC_OK;
}

/* START: the header line, once the run is built. */
static void emit_start(trainer *t) {
    gpc_train_event e;
    memset(&e, 0, sizeof e);
    e.kind = GPC_TRAIN_START;
    e.config = t->s.config;
    e.parameters = gpt_config_num_params(&t->s.config); /* the whole model's, at any tp */
    e.B = t->s.B;
    e.T = t->s.T;
    e.tokens_per_step = t->s.total_batch;
    e.accumulation_steps = t->s.accumulation;
    e.device = t->o->device;
    e.precision = t->s.precision;
    e.memory_planned = gpt_memory_bytes(t->model);
    e.host_pinned = gpt_host_pinned_bytes(t->model);
    e.first_step = t->step;
    e.steps = t->s.steps;
    e.peak_lr = t->s.schedule.lr;
    e.warmup = t->s.schedule.warmup;
    e.val_loss = NAN;
    gpu_readings_unknown(&e);
    emit(t, &e);
}

/* Frees everything open_run and open_metrics made (a failed attempt's
 * too), so that an auto-fit retry starts with the device as it was. */
static void close_run(trainer *t) {
    if (t->metrics) fclose(t->metrics);
    t->metrics = NULL;
    gpc_ddp_free(t->ddp);
    t->ddp = NULL;
    gpt_free(t->model);
    t->model = NULL;
    gpc_prefetch_close(t->train);
    t->train = NULL;
    gpc_loader_close(t->val);
    t->val = NULL;
    gpc_free(t->inputs);
    gpc_free(t->targets);
    t->inputs = t->targets = NULL;
    gpc_free(t->pipe_inputs);
    gpc_free(t->pipe_targets);
    t->pipe_inputs = t->pipe_targets = NULL;
}

/* Where an auto-fit retry starts: the checkpoint this process saved last
 * (re-read, as a resume reads it), else where the run started (*from
 * unchanged: the resumed checkpoint, or NULL for step 0). */
static gpc_status retry_point(trainer *t, const gpt_checkpoint_state **from, gpt_config *config,
                              gpt_checkpoint_state *ck) {
    if (!t->saved) {
        t->step = 0;
        return GPC_OK;
    }
    if (t->lora.rank)
        GPC_TRY(gpt_lora_read_header(t->lora_path, config, NULL, ck, NULL, 0));
    else
        GPC_TRY(pick_checkpoint(t, config, ck));
    *from = ck;
    return GPC_OK;
}

/* Halves the micro-batch after an out-of-memory error, said in one line. */
static void report_shrink(trainer *t, int was) {
    char why[512];
    snprintf(why, sizeof why, "%s", gpc_last_error());
    gpc_clear_error();
    set_batch(&t->s, smaller_batch(was));
    double need = plan_bytes(t->o, &t->s, t->parts, was), free_bytes = device_free(t->o->device);
    char needs[128] = "";
    if (need > 0 && free_bytes > 0) {
        char a[32], b[32];
        snprintf(needs, sizeof needs, " (needs %s by gpc plan, %s has %s free)",
                 gpc_format_bytes(need, a, sizeof a), gpc_device_name(t->o->device),
                 gpc_format_bytes(free_bytes, b, sizeof b));
    }
    gpc_log(GPC_LOG_WARN,
            "train: out of memory at micro-batch %d%s; going on at micro-batch %d x %d "
            "accumulation steps%s",
            was, needs, t->s.B, t->s.accumulation, t->saved ? ", from the last checkpoint" : "");
    gpc_log(GPC_LOG_DEBUG, "train: the allocation that failed: %s", why);
}

/* A run over the data-parallel view o; parts the model's cut (NULL: the
 * whole model), rank0 whether this process writes the run folder. */
static gpc_status train_run(const gpc_train_options *o, const train_parts *parts, int rank0,
                            gpc_train_result *result) {
    if (!o->data_dir || !o->out_dir)
        return gpc_error(GPC_ERR_INVALID_ARG, "training needs a dataset (--data) and a run "
                                              "folder (--out)");
    if (result) {
        memset(result, 0, sizeof *result);
        result->last_val_loss = NAN;
        result->gpu_sm_clock_median_mhz = result->gpu_sm_clock_max_mhz = -1;
        result->gpu_power_limit_w = NAN;
    }
    gpc_dataset_info info;
    GPC_TRY(gpc_dataset_info_read(o->data_dir, &info));

    trainer t;
    memset(&t, 0, sizeof t);
    t.o = o;
    t.parts = parts;
    t.rank0 = rank0;
    t.gpu_clock_max_mhz = -1;
    t.gpu_power_limit_w = NAN;
    gpc_energy_meter_init(&t.gpu_energy);
    snprintf(t.checkpoint_path, sizeof t.checkpoint_path, "%s/checkpoint.bin", o->out_dir);
    snprintf(t.prev_path, sizeof t.prev_path, "%s/checkpoint.prev.bin", o->out_dir);
    if (t.rank0) { /* what killed writes left behind */
        static const char *const written[] = {"checkpoint.bin", "checkpoint.prev.bin", "config.txt",
                                              "tokenizer.bin", "lora.bin"};
        for (size_t i = 0; i < sizeof written / sizeof written[0]; i++) {
            char path[4200];
            snprintf(path, sizeof path, "%s/%s", o->out_dir, written[i]);
            gpc_remove_stale_temporaries(path);
        }
    }
    snprintf(t.lora_path, sizeof t.lora_path, "%s/lora.bin", o->out_dir);
    if (o->lora_rank < 0)
        return gpc_error(GPC_ERR_INVALID_ARG, "--lora %d must be a positive rank", o->lora_rank);
    gpt_config ck_config;
    gpt_checkpoint_state ck;
    int lora_run = gpc_path_exists(t.lora_path);
    if (o->resume && lora_run) {
        /* a LoRA run: its state, options and base come from lora.bin */
        GPC_TRY(gpt_lora_read_header(t.lora_path, &ck_config, &t.lora, &ck, t.base_run,
                                     sizeof t.base_run));
        if (o->lora_rank && o->lora_rank != t.lora.rank)
            GPC_TRY(same_as_checkpoint("lora", o->lora_rank, t.lora.rank));
    } else if (o->resume) {
        if (o->lora_rank)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "%s holds no LoRA adapters (lora.bin) to resume; leave out --lora",
                             o->out_dir);
        GPC_TRY(pick_checkpoint(&t, &ck_config, &ck));
    } else if (lora_run) {
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s already holds LoRA adapters; add --resume to continue them, or "
                         "choose another --out",
                         o->out_dir);
    } else if (gpc_path_exists(t.checkpoint_path)) {
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s already holds a trained run; add --resume to continue it, or "
                         "choose another --out",
                         o->out_dir);
    }
    gpt_config init;
    int from = o->init_from && !o->resume;
    if (o->lora_rank && !o->resume) {
        if (!o->init_from)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "--lora adapts a trained model: give its run folder with --init-from "
                             "RUN (gpc train or gpc import hf)");
        if (!realpath(o->init_from, t.base_run))
            return gpc_error(GPC_ERR_IO, "--init-from %s: %s", o->init_from, strerror(errno));
        t.lora = (gpt_lora_options){.rank = o->lora_rank,
                                    .alpha = (float)o->lora_alpha,
                                    .targets = o->lora_targets,
                                    .seed = o->seed};
    }
    if (from) GPC_TRY(read_init(o, &init));
    GPC_TRY(resolve(o, &info, o->resume ? &ck_config : NULL, o->resume ? &ck : NULL,
                    from ? &init : NULL, &t.s));
    GPC_TRY(check_host_memory(o, &t.s, parts));
    t.tokenizer_kind = tokenizer_kind(o->data_dir);
    GPC_TRY(gpc_mkdir_p(o->out_dir));
    fit_to_free_memory(&t);

    /* Out of memory while building the run or in a step: with auto-fit, all
     * of the attempt is freed and the run starts again at a smaller
     * micro-batch, from the checkpoint this process wrote last, else from
     * where it started (same steps, same numbers: nothing is lost). */
    gpc_status s = GPC_OK;
    const gpt_checkpoint_state *start_from = o->resume ? &ck : NULL;
    for (;;) {
        s = open_run(&t, &info, start_from);
        if (s == GPC_ERR_NOMEM && t.rank0) {
            /* the run folder says what was tried even when the model did not
             * fit, so gpc doctor --run can say what would */
            char why[1024];
            snprintf(why, sizeof why, "%s", gpc_last_error());
            (void)write_config(&t);
            gpc_error(s, "%s", why);
        }
        if (s == GPC_OK && t.rank0) s = write_config(&t);
        if (s == GPC_OK && t.rank0 && info.has_tokenizer && !t.started) s = copy_tokenizer(&t);
        if (s == GPC_OK && t.rank0) s = open_metrics(&t, o->resume || t.started);
        if (s == GPC_OK && !t.started) {
            open_gpu_readings(&t);
            emit_start(&t);
            t.started = 1;
        }
        if (s == GPC_OK) s = run_loop(&t, result);
        if (s == GPC_OK) s = report_bubble(&t);
        if (s != GPC_ERR_NOMEM || !auto_fit_on(&t) || t.s.B == 1) break;
        int was = t.s.B;
        close_run(&t);
        gpc_status again = retry_point(&t, &start_from, &ck_config, &ck);
        if (again != GPC_OK) return again;
        report_shrink(&t, was);
    }
    if (s == GPC_ERR_NOMEM && auto_fit_on(&t))
        s = gpc_error_context(s, "even at micro-batch 1: use --recompute block, LoRA (--lora R "
                                 "with --init-from RUN), a smaller model or --context; "
                                 "'gpc plan' shows what fits: ");
    if (result) gpu_result(&t, result);
    gpc_nvml_close(t.nvml);
    close_run(&t);
    return s;
}

/* The combinations --offload-optimizer does not support, refused before
 * anything is built: it keeps one whole model's state in one process. */
static gpc_status check_offload(const gpc_train_options *o) {
    if (!o->offload_optimizer) return GPC_OK;
    if (o->tp > 1 || o->pp > 1)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "--offload-optimizer keeps a whole model's optimizer state in one "
                         "process: leave out --tp and --pp");
    if (o->world_size > 1 || o->dist || o->zero)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "--offload-optimizer trains on one process: leave out data parallelism "
                         "(the extra processes and --zero)");
    if (o->lora_rank)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "--offload-optimizer does not train LoRA adapters, whose state is "
                         "small: leave it out with --lora");
    return GPC_OK;
}

gpc_status gpc_train(const gpc_train_options *o, gpc_train_result *result) {
    GPC_TRY(check_offload(o));
    int tp = o->tp > 1 ? o->tp : 1, pp = o->pp > 1 ? o->pp : 1;
    if (tp == 1 && pp == 1) return train_run(o, NULL, o->rank == 0, result);
    /* model parallelism: world = dp x pp x tp; the trainer sees its dp
     * group as its world, and the model's tp x pp parts work together */
    int world = o->world_size > 0 ? o->world_size : 1;
    if (o->lora_rank)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "--lora trains on one process; leave out --tp and --pp");
    if (!o->dist || o->dist->world_size != world)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--tp %d --pp %d needs %d processes started together (gpc launch, "
                         "mpirun or srun); this is one",
                         tp, pp, tp * pp);
    gpc_dist_layout lay;
    GPC_TRY(gpc_dist_layout_make(world, o->rank, tp, pp, &lay));
    train_parts parts = {{tp, lay.tp_rank, pp, lay.pp_rank, 1}, NULL, NULL, NULL};
    int place = lay.pp_rank * tp + lay.tp_rank;
    gpc_dist *dp_group = NULL;
    gpc_status s = gpc_dist_split(o->dist, lay.dp_rank * pp + lay.pp_rank, lay.tp_rank, &parts.tp);
    if (s == GPC_OK)
        s = gpc_dist_split(o->dist, lay.dp_rank * tp + lay.tp_rank, lay.pp_rank, &parts.pp);
    if (s == GPC_OK) s = gpc_dist_split(o->dist, place, lay.dp_rank, &dp_group);
    if (s == GPC_OK) s = gpc_dist_split(o->dist, lay.dp_rank, place, &parts.model);
    if (s == GPC_OK) {
        gpc_train_options dp = *o;
        dp.world_size = lay.dp;
        dp.rank = lay.dp_rank;
        dp.dist = lay.dp > 1 ? dp_group : NULL;
        s = train_run(&dp, &parts, o->rank == 0, result);
    }
    gpc_dist_destroy(parts.model);
    gpc_dist_destroy(dp_group);
    gpc_dist_destroy(parts.pp);
    gpc_dist_destroy(parts.tp);
    return s;
}
