/*
 * gpc train: the GPT training loop and its learning-rate schedule.
 *
 * gpc_train runs what `gpc train` does: opens the dataset, builds the model
 * on the device, trains with micro-batches and gradient accumulation up to a
 * total batch in tokens, warmup + cosine learning rate, validation every N
 * steps, checkpoints every N steps and at the end, and writes the run folder:
 *   RUN/checkpoint.bin       latest checkpoint (RUN/checkpoint.prev.bin: the one before)
 *   RUN/config.txt           the model and training settings, key=value
 *   RUN/tokenizer.bin        the dataset's tokenizer, so RUN alone can generate text
 *                            (config.txt's tokenizer= says which kind: gpc, gpt2 or none)
 *   RUN/metrics.jsonl        one JSON object per step
 * With resume set it continues from RUN/checkpoint.bin exactly: the losses of
 * the following steps are bitwise those of an uninterrupted run.
 *
 * The library prints nothing: it reports through a callback, and the CLI
 * draws the progress line. A stop request (from a signal handler) makes the
 * loop finish its step, write a checkpoint and return GPC_ERR_INTERRUPTED.
 */
#ifndef GPC_TRAIN_H
#define GPC_TRAIN_H

#include "gpc/core.h"
#include "gpc/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ schedule */

/* Linear warmup over `warmup` steps to lr, then cosine decay to
 * lr * min_lr_ratio at the last step (as in llm.c and nanoGPT). */
typedef struct {
    double lr;
    double min_lr_ratio;
    int warmup;
    int steps;
} gpc_lr_schedule;

/* Learning rate of 0-based step `step`:
 *   step < warmup:  lr * (step + 1) / warmup
 *   otherwise:      min + 0.5 (1 + cos(pi * (step - warmup) / (steps - warmup))) (lr - min)
 *                   with min = lr * min_lr_ratio. */
double gpc_lr_at(const gpc_lr_schedule *schedule, int step);
/* Default warmup: 10% of the steps, at most 1000. */
int gpc_lr_default_warmup(int steps);
/* Default peak learning rate: 1e-3 for models up to 384 channels (d6),
 * 6e-4 (GPT-2 small's) above. */
double gpc_lr_default(int channels);

/* ------------------------------------------------------------ options */

typedef enum {
    GPC_TRAIN_START,      /* model built, data open: the header line */
    GPC_TRAIN_STEP,       /* one optimizer step done */
    GPC_TRAIN_EVAL,       /* a validation pass done */
    GPC_TRAIN_CHECKPOINT, /* a checkpoint written */
} gpc_train_event_kind;

typedef struct {
    gpc_train_event_kind kind;
    /* START */
    gpt_config config;
    size_t parameters;
    int B, T;
    int64_t tokens_per_step;
    int accumulation_steps;
    gpc_device device;
    gpc_dtype precision;
    size_t memory_planned; /* bytes the model placed on the device */
    size_t host_pinned;    /* bytes of the offloaded optimizer in pinned host memory (0: none) */
    int first_step;        /* 0, or the step a resumed run continues from */
    int steps;
    double peak_lr;
    int warmup;
    /* STEP, EVAL, CHECKPOINT */
    int step;       /* steps done (1-based) */
    float loss;     /* mean training loss of the step */
    float val_loss; /* EVAL (and the STEP that ran it); NAN otherwise */
    float lr;
    float grad_norm;   /* before clipping; NAN for a skipped step */
    int skipped;       /* fp16: 1 when gradients overflowed and the update was skipped */
    int skipped_steps; /* fp16: steps skipped so far in this process */
    float loss_scale;  /* fp16: the dynamic loss scale after the step (1 otherwise) */
    double ms;         /* wall time of the step */
    double tokens_per_s;
    uint64_t tokens_seen;
    double eta_s;        /* estimated time to the last step */
    size_t memory_bytes; /* process RSS on the CPU, used device memory on a GPU */
    const char *path;    /* CHECKPOINT: the file written */
    /* STEP on a CUDA device, read from NVML while the GPU runs the step, just
     * before the step's one wait: every step, or once per half second and at
     * the last step when steps are shorter (unknown on the other steps, on
     * the CPU, without NVML, or where the driver lacks the reading). A GPU
     * at its power limit lowers its SM
     * clock, so kernels that are faster at full clock may not make such a
     * step faster. */
    double gpu_power_w;       /* board power draw; NAN when unknown */
    double gpu_power_limit_w; /* the enforced power limit; NAN when unknown */
    int gpu_sm_clock_mhz;     /* -1 when unknown */
    int gpu_sm_clock_max_mhz; /* -1 when unknown */
    int gpu_power_capped;     /* 1: clocks held down by the power limit (NVML's SW power cap
                               * or HW power brake reason), 0: not, -1: unknown */
    double gpu_step_energy_j; /* the GPU's energy a step since the previous reading that
                               * gave one (NVML's energy counter, which the driver updates
                               * only every so often: readings count a second or more
                               * apart; validation passes in between count too); NAN on
                               * the other steps */
    /* Data parallel: the gradient exchange of the step (gpc_ddp_comm_times):
     * the time the step waited for it after backward, its span, and the bus
     * bandwidth it achieved; NAN in a run of one process. */
    double comm_exposed_ms;
    double comm_busy_ms;
    double comm_bus_gbs;
    /* STEP: host time the step waited for its input batches (blocked on the
     * prefetching loader; on a GPU the copy is queued on a side stream and
     * is not in it, except a pipeline's, which reads the batch back to the
     * host). A share of ms above gpc doctor's GPC_DIAG_INPUT_WAIT is an
     * input-bound run. */
    double input_wait_ms;
} gpc_train_event;

typedef void (*gpc_train_callback)(void *user, const gpc_train_event *event);

/* Zero (or negative where noted) means "default", which for a resumed run is
 * the checkpoint's value. */
typedef struct {
    const char *data_dir;        /* required */
    const char *out_dir;         /* required: the run folder */
    const char *model;           /* "dN"; default d6 (6 layers, 6 heads, 384 channels) */
    int layers, heads, channels; /* override the model's sizes */
    int context;                 /* T, default 256 */
    int batch;                   /* micro-batch B, default 8 */
    int64_t total_batch;         /* tokens per optimizer step, default B*T (no accumulation) */
    int steps;                   /* optimizer steps, default 1000 */
    double lr;                   /* peak learning rate, default gpc_lr_default */
    double min_lr_ratio;         /* default 0.1; negative: 0 */
    int warmup;                  /* steps, default gpc_lr_default_warmup; negative: none */
    double weight_decay;         /* default 0.1; negative: none */
    double max_grad_norm;        /* default 1.0; negative: no clipping */
    int eval_every;              /* steps between validation passes, default 100; negative: never */
    int eval_batches;            /* batches per validation pass, default 20 */
    int checkpoint_every; /* steps between checkpoints, default 500; negative: only at the end */
    int resume;           /* continue from out_dir/checkpoint.bin */
    /* fine-tuning: a new run starts from the weights of this run folder's
     * checkpoint.bin (gpc train or gpc import hf) instead of random ones;
     * the model's sizes come from it, the optimizer state and the
     * learning-rate schedule start afresh; the dataset must share its
     * vocabulary (and its tokenizer, when both have one). Ignored when
     * resuming: the run's own checkpoint holds the weights then. */
    const char *init_from;
    /* LoRA (with init_from): rank-R adapters on the frozen base, saved
     * alone in out_dir/lora.bin; 0 trains every weight. alpha 0 means R;
     * targets 0 means all of qkv, proj, fc and fcproj (GPT_LORA_* bits).
     * A resumed LoRA run takes all three, and the base, from lora.bin. */
    int lora_rank;
    double lora_alpha;
    unsigned lora_targets;
    int seed_set;          /* seed was given (a resumed run must then agree) */
    uint64_t seed;         /* default 1337: weights, data order and the optimizer's rounding */
    gpc_device device;     /* default CPU */
    int precision;         /* a gpc_dtype, or -1: f32 on the CPU, bf16 on a GPU */
    int recompute;         /* GPT_RECOMPUTE(level, blocks) (gpc/model.h): 0 keep activations,
                            * 1 recompute GELU, 2 also layernorm, 3 whole blocks, on the
                            * first N blocks or all; -1 (the default): the checkpoint's when
                            * resuming, else 0 */
    int world_size, rank;  /* data parallelism: processes and this one's place (1 and 0 alone) */
    struct gpc_dist *dist; /* collectives (gpc/dist.h) when world_size > 1; the caller owns it */
    int zero;              /* 1: ZeRO-1 optimizer shards across the ranks */
    int tp;                /* > 1: tensor parallelism, each model cut over tp ranks */
    int pp;                /* > 1: pipeline parallelism over pp stages (1F1B, the accumulation
                            * steps as micro-batches); data parallelism over world_size /
                            * (tp * pp) copies (gpc/parallel.h) */
    double bucket_mb;      /* gradient bucket size in MiB; 0: default; negative: one bucket */
    /* Out-of-memory auto-fit (one process): when building the run or a
     * step runs out of device memory, everything of the attempt is freed
     * and the run goes on at a smaller micro-batch with as many more
     * accumulation steps (the same step, the same losses up to rounding),
     * from the last checkpoint this process saved, else from its start;
     * down to micro-batch 1. On a GPU, a micro-batch that gpc plan says
     * cannot fit in the free memory is divided before allocating. A
     * resumed run asked for a larger --batch than its checkpoint's, by a
     * whole factor, resumes at the checkpoint's. 1 turns this off. */
    int no_auto_fit;
    /* 1: the f32 master weights and AdamW moments in pinned host memory,
     * updated on CPU threads (gpt_create_offload); one process training a
     * whole model: refused with --tp, --pp, data parallelism or LoRA. A
     * checkpoint is the same either way, so a run resumes with or without. */
    int offload_optimizer;
    int stop_after; /* > 0: stop (with a checkpoint) after this many steps of this
                     * process; the schedule still runs over steps */
    gpc_train_callback callback;
    void *user;
} gpc_train_options;

void gpc_train_options_init(gpc_train_options *options);

/* The most recent steps whose SM clock gpc_train keeps for the median. */
#define GPC_TRAIN_CLOCK_STEPS 4096

typedef struct {
    int steps_done;
    float last_loss;
    float last_val_loss; /* NAN when no validation ran */
    double seconds;
    /* This process's GPU over the steps of this run (all zero or unknown on
     * the CPU or without NVML); see gpc_train_event's gpu_ fields. */
    int gpu_steps_sampled;       /* steps read whose reading said whether power held the clock */
    int gpu_steps_power_capped;  /* of those, the steps with gpu_power_capped == 1 */
    int gpu_sm_clock_median_mhz; /* over the last GPC_TRAIN_CLOCK_STEPS steps read; -1 */
    int gpu_sm_clock_max_mhz;    /* -1 when unknown */
    double gpu_power_limit_w;    /* NAN when unknown */
    /* NVML's energy counter from the first reading to the last that gave a
     * step energy: joules, the steps between the two and the tokens this
     * process trained in them (all 0 when there was no such pair: runs
     * shorter than about a second, or no counter) */
    double gpu_energy_j;
    int gpu_energy_steps;
    int64_t gpu_energy_tokens;
} gpc_train_result;

/* Trains; see the top of this file. result may be NULL. */
gpc_status gpc_train(const gpc_train_options *options, gpc_train_result *result);

/* The closing remark on power of a run: when at least 3 steps were sampled
 * and the GPU was at its power limit in at least half of them, writes into
 * buf a line such as "the GPU was at its power limit (700 W) in 95% of 200
 * steps read, SM clock median 1620 of 1980 MHz: power, not kernel speed, bounds
 * the step" (the parts NVML did not give left out) and returns 1; otherwise
 * writes "" and returns 0. */
int gpc_train_power_summary(const gpc_train_result *result, char *buf, size_t size);

/* The energy of training steps from readings of a GPU's energy counter
 * (gpc_train_event.gpu_step_energy_j). */
#define GPC_ENERGY_PERIOD_S 1.0 /* readings counted at least this far apart */
typedef struct {
    double first_j, base_j, base_time;
    int first_step, base_step; /* -1: no reading yet */
} gpc_energy_meter;

void gpc_energy_meter_init(gpc_energy_meter *meter);
/* A reading of the counter (joules) taken during step `step` (counted from
 * 0) at time `now` (seconds): the energy a step since the base reading when
 * the two are GPC_ENERGY_PERIOD_S or more apart and the counter has moved (the
 * reading then becomes the base); otherwise NAN. The first reading, and the
 * first after the counter went back, only sets the base. */
double gpc_energy_meter_read(gpc_energy_meter *meter, int step, double now, double energy_j);
/* Joules from the first reading to the base, and in *steps the steps between
 * them; 0 and 0 when there are none. */
double gpc_energy_meter_total(const gpc_energy_meter *meter, int *steps);

/* The run's energy on this process's GPU: when the energy counter was read
 * over at least one step, writes a line such as "the GPU used 4.75 kJ over
 * 10 steps: 475 J a step, 11,038 tokens per joule" and returns 1; otherwise
 * writes "" and returns 0. At a power limit, energy is what a step costs;
 * tokens per joule compare runs, settings and peers on one footing. */
int gpc_train_energy_summary(const gpc_train_result *result, char *buf, size_t size);

/* Asks a running gpc_train to stop after its current step (with a
 * checkpoint). Async-signal-safe: it only sets a flag. */
void gpc_train_request_stop(void);
int gpc_train_stop_requested(void);
void gpc_train_clear_stop(void);

/* ---------------------------------------------- Hugging Face run folders */

/* src/train/hf_run.c; the formats themselves are gpc/hf.h's. */

/* What an import or export did, for the summary line. */
typedef struct {
    gpt_config config;
    size_t parameters;     /* gpt_config_num_params */
    gpc_dtype dtype;       /* import: the dtype of the files; export: the one written */
    int tokenizer;         /* 1: GPT-2's tokenizer came along (vocab.json, merges.txt) */
    int tokenizer_skipped; /* export: the run's tokenizer is gpc's, not written */
    double seconds;
} gpc_hf_summary;

/* Writes DIR/checkpoint.bin holding PARAMS (f32, in the model's layout
 * order) of a model of CONFIG, with no optimizer or run state: the
 * checkpoint of an imported or a merged run. */
gpc_status gpc_run_save_weights(const char *dir, const gpt_config *config, const float *params);

/* `gpc import hf DIR --out RUN`: reads the transformers GPT-2 folder DIR
 * and writes the run folder RUN (which must not exist): checkpoint.bin
 * (f32), config.txt (source=hf, tokenizer=gpt2|none) and, when DIR has
 * vocab.json and merges.txt, tokenizer.bin (GPT-2's). Everything is read
 * and checked first and written into RUN.tmp.PID, renamed at the end: on
 * any error RUN does not exist afterwards. summary may be NULL. */
gpc_status gpc_hf_import(const char *hf_dir, const char *run_dir, gpc_hf_summary *summary);

/* `gpc merge RUN --out RUN2`: RUN's LoRA adapters (RUN/lora.bin) folded
 * into the weights of their base run (W += alpha/R * B . A), written as a
 * plain run folder RUN2 (which must not exist): checkpoint.bin (f32, no
 * optimizer state), RUN's tokenizer.bin (else the base's) and config.txt.
 * Written through RUN2.tmp.PID, renamed at the end. */
gpc_status gpc_lora_merge(const char *run_dir, const char *out_dir);

/* What gpc_quantize_run did. */
typedef struct {
    gpt_config config;
    double relative_error; /* ||W - dequantized|| / ||W|| over the quantized matrices */
    size_t bf16_bytes;     /* the weights in bf16 */
    size_t quant_bytes;    /* quantized (the rest in bf16) */
} gpc_quantize_summary;

/* `gpc quantize RUN --to int8|fp8 --out RUN2`: RUN's checkpoint quantized
 * for inference (gpt_quant_options), written as a run folder RUN2 (absent
 * or empty): quant.bin, RUN's tokenizer.bin and config.txt (source_run,
 * quantization). Refuses a run that is already quantized. Written through
 * RUN2.tmp.PID, renamed at the end. summary may be NULL. */
gpc_status gpc_quantize_run(const char *run_dir, const char *out_dir,
                            const gpt_quant_options *quant, gpc_quantize_summary *summary);

/* `gpc export hf RUN --out DIR`: writes config.json and model.safetensors
 * (dtype f32, bf16 or f16) of RUN/checkpoint.bin, with vocab.json and
 * merges.txt when RUN's tokenizer is GPT-2's, into DIR (which must not
 * exist or be empty), through DIR.tmp.PID as for the import. */
gpc_status gpc_hf_export(const char *run_dir, const char *hf_dir, gpc_dtype dtype,
                         gpc_hf_summary *summary);

/* ------------------------------------------------------------ evaluation */

/* What `gpc eval` measures: the cross-entropy of the model's prediction of
 * each token from the ones before it. */
typedef struct {
    int64_t tokens;    /* tokens predicted: count - 1 */
    double mean_loss;  /* mean cross-entropy, nats */
    double perplexity; /* exp(mean_loss) */
} gpc_eval_result;

/* Runs the model (planned for B >= 1 and T >= context) over tokens in
 * windows of context + 1 tokens with stride context, so every token but the
 * first is predicted once, from up to context tokens before it (the last
 * window may be shorter). The cross-entropy of each prediction is computed
 * from the logits in double; losses (count - 1 floats, may be NULL)
 * receives them in order. config is the model's. */
gpc_status gpc_eval_tokens(gpt_model *model, const gpt_config *config, int context,
                           const uint32_t *tokens, size_t count, float *losses,
                           gpc_eval_result *result);

#ifdef __cplusplus
}
#endif

#endif /* GPC_TRAIN_H */
