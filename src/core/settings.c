/*
 * settings.c: the one table of gpc's GPC_* environment variables, and the
 * accessors that read them (see gpc/settings.h).
 *
 * A variable gpc reads, sets for a child process, or reads in a script has
 * its row here. tests/cli/test_settings.sh fails when source code names a
 * variable without a row, when a row is named nowhere, and when
 * docs/environment.md differs from `gpc help env --markdown`. The rows are
 * grouped as `gpc help env` prints them; a help line is one sentence, and
 * docs/environment.md carries the longer explanations and measurements.
 */
#include "gpc/settings.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define FLAG GPC_SETTING_FLAG
#define INT GPC_SETTING_INT
#define DOUBLE GPC_SETTING_DOUBLE
#define STRING GPC_SETTING_STRING

static const gpc_setting_info table[] = {
    /* everyday */
    {"GPC_LOG", STRING, "info", "everyday", "log level", 0, 0, "debug|info|warn|error"},
    {"GPC_ATTENTION", STRING, "auto", "everyday",
     "GPU attention path: auto picks cuDNN on Hopper where it loads (gpc train --attention)", 0, 0,
     "auto|gpc|cudnn|simple"},
    {"GPC_NVML_LIBRARY", STRING, "libnvidia-ml.so.1", "everyday",
     "the NVML library that gpcd, gpc doctor and gpc train load", 0, 0, NULL},
    {"GPC_DEVICE_MEMORY_LIMIT", STRING, NULL, "everyday",
     "caps the memory gpc takes on each device, such as 20G: for sharing a GPU, and for tests", 0,
     0, NULL},
    {"GPC_SERVE_PIPELINE", FLAG, "1", "everyday",
     "gpc serve launches each step before handling the previous one's tokens (0: one at a time)", 0,
     0, NULL},

    /* numerics: choices that change the numbers a run computes */
    {"GPC_STOCHASTIC_ROUNDING", FLAG, "0", "numerics",
     "AdamW rounds the bf16 weights stochastically (gpc train --stochastic-rounding)", 0, 0, NULL},
    {"GPC_ATTENTION_BWD", STRING, "auto", "numerics",
     "which GPU attention backward runs (gpc train --attention-backward)", 0, 0,
     "auto|two|fused|wgmma"},
    {"GPC_QKV_BIAS_DERIVED", FLAG, "1", "numerics",
     "backward derives the qkv bias gradient's key and value thirds instead of summing them", 0, 0,
     NULL},
    {"GPC_FUSED_BIAS_GRADS", FLAG, "1", "numerics",
     "the projections' bias gradients come from the layernorm backwards, not their own sums", 0, 0,
     NULL},

    /* distributed: gpc launch sets most of these for each process */
    {"GPC_DIST_TIMEOUT", DOUBLE, "300", "distributed",
     "seconds a rank waits for the others (rendezvous, NCCL watchdog) before it stops", 0.001, 1e7,
     NULL},
    {"GPC_RANK", INT, NULL, "distributed", "this process's rank in the job (gpc launch sets it)", 0,
     0, NULL},
    {"GPC_WORLD_SIZE", INT, NULL, "distributed", "processes in the job (gpc launch sets it)", 0, 0,
     NULL},
    {"GPC_LOCAL_RANK", INT, NULL, "distributed",
     "this process's rank on its node (gpc launch sets it)", 0, 0, NULL},
    {"GPC_LOCAL_WORLD_SIZE", INT, NULL, "distributed",
     "processes on this node (gpc launch sets it)", 0, 0, NULL},
    {"GPC_NODE_RANK", INT, NULL, "distributed", "this node's index in the job (gpc launch sets it)",
     0, 0, NULL},
    {"GPC_MASTER_ADDR", STRING, NULL, "distributed",
     "rank 0's address for the rendezvous (from gpc launch, Slurm or MPI)", 0, 0, NULL},
    {"GPC_MASTER_PORT", INT, NULL, "distributed",
     "rank 0's port for the rendezvous (from gpc launch, or 20000 + the Slurm job id mod 20000)", 1,
     65535, NULL},

    /* gpcd and its clients */
    {"GPC_SOCKET", STRING, "/var/lib/gpcd/gpcd.sock", "gpcd",
     "where gpc submit, queue and the other clients find gpcd; tcp://HOST:PORT for a remote one", 0,
     0, NULL},
    {"GPC_TOKEN", STRING, NULL, "gpcd", "bearer token the clients send to a gpcd reached over TCP",
     0, 0, NULL},
    {"GPC_JOB_ID", STRING, NULL, "gpcd",
     "set by gpcd in each job: its id (gpc train resumes a requeued job with it)", 0, 0, NULL},
    {"GPC_JOB_GPUS", INT, NULL, "gpcd", "set by gpcd in each job: how many GPUs it was given", 0, 0,
     NULL},
    {"GPC_JOB_TAG", STRING, NULL, "gpcd",
     "set by gpcd in each job: a tag unique to one gpcd and job, by which it finds the job's "
     "processes",
     0, 0, NULL},

    /* benchmarks and diagnosis: switches to measure one form against another */
    {"GPC_CUDA_PROFILE", FLAG, "0", "benchmarks",
     "time every GPU op with CUDA events (bench_gpt2_step prints the per-op table)", 0, 0, NULL},
    {"GPC_DDP_NO_COMM", FLAG, "0", "benchmarks",
     "data-parallel steps without gradient traffic (the ranks drift apart)", 0, 0, NULL},
    {"GPC_MATMUL_TUNE", FLAG, "0", "benchmarks",
     "time cuBLASLt's candidates at each large GEMM shape's first call and keep the fastest", 0, 0,
     NULL},
    {"GPC_MATMUL_MEASURED", FLAG, "1", "benchmarks",
     "cuBLASLt configurations measured to need less energy for GPT-2 124M's and 1.5B's products", 0,
     0, NULL},
    {"GPC_MATMUL_WORKSPACE_MB", INT, "32", "benchmarks", "cuBLASLt's workspace in MiB", 1, 4096,
     NULL},
    {"GPC_OFFLOAD_CHUNK", INT, "8388608", "benchmarks",
     "elements per copy and CPU update of gpc train --offload-optimizer", 1, 100000000, NULL},
    {"GPC_OFFLOAD_OVERLAP", FLAG, "1", "benchmarks",
     "--offload-optimizer on a GPU: the CPU update overlaps the next forward; 0: it ends each step",
     0, 0, NULL},
    {"GPC_QUANT_FP8_LT", FLAG, "1", "benchmarks",
     "per-tensor fp8 weights on cuBLASLt's FP8 tensor cores (prefill); 0: the dequantizing "
     "kernel",
     0, 0, NULL},
    {"GPC_QUANT_GEMV_MAX_M", INT, "16", "benchmarks",
     "most rows a quantized product runs in the skinny decode kernel; 0: the earlier kernels", 0,
     16, NULL},
    {"GPC_DECODE_FUSED_MAX_M", INT, "2", "benchmarks",
     "most rows a serving step runs in the fused decode kernels (16 at most); 0: the unfused ops",
     0, 16, NULL},
    {"GPC_DECODE_MMA", FLAG, "0", "benchmarks",
     "fused decode products of 5 to 16 rows in bf16 or f16 on tensor cores (mma.sync)", 0, 0, NULL},
    {"GPC_DECODE_PDL", FLAG, "1", "benchmarks",
     "fused decode kernels start as the kernel before them ends (programmatic dependent launch)", 0,
     0, NULL},
    {"GPC_DECODE_EARLY", FLAG, "1", "benchmarks",
     "fused decode products of up to 4 rows load the layernorm's weights early and each row once",
     0, 0, NULL},
    {"GPC_MATMUL_GELU", FLAG, "1", "benchmarks",
     "GELU in cuBLASLt's epilogues; 0: GELU as its own kernel", 0, 0, NULL},
    {"GPC_MATMUL_BGRAD", FLAG, "0", "benchmarks",
     "bias gradients from cuBLASLt's BGRADB epilogue instead of gpc's column sums", 0, 0, NULL},
    {"GPC_GEMM_SM90", STRING, "1", "benchmarks",
     "which of gpc's Hopper GELU and DGELU products run: 1 both, 0 neither, or the one named", 0, 0,
     "0|1|gelu|dgelu"},
    {"GPC_GEMM_SM90_HEAD", FLAG, "1", "benchmarks",
     "the fused output head on Hopper (classifier_sm90.cu) instead of three ops", 0, 0, NULL},
    {"GPC_GEMM_SM90_CLUSTER", FLAG, "0", "benchmarks",
     "gemm_sm90.cu's DGELU product in clusters of two blocks sharing the weight's tiles", 0, 0,
     NULL},
    {"GPC_HEAD_CLUSTER", FLAG, "1", "benchmarks",
     "the fused head's product in clusters of two blocks sharing the weight's tiles", 0, 0, NULL},
    {"GPC_SM90_STMATRIX", FLAG, "1", "benchmarks",
     "gpc's Hopper products stage tiles with stmatrix and ldmatrix; 0: 4-byte stores", 0, 0, NULL},
    {"GPC_SM90_BLOCKS", INT, NULL, "benchmarks",
     "caps the Hopper kernels' persistent grids at this many blocks (tests; unset: one an SM)", 1,
     1000000, NULL},
    {"GPC_SERVE_GRAPHS", FLAG, "1", "benchmarks",
     "gpc serve replays its decode steps as CUDA graphs; 0: every step launches its kernels", 0, 0,
     NULL},
    {"GPC_PAGED_KERNEL", STRING, "auto", "benchmarks",
     "gpc serve's paged attention on the GPU: v1 a block a head, v2 and v3 a block several heads",
     0, 0, "auto|v1|v2|v3"},
    {"GPC_PAGED_COMBINE", STRING, "fused", "benchmarks",
     "who merges split paged attention: each head's last block (fused) or a kernel of its own", 0,
     0, "fused|kernel"},
    {"GPC_PAGED_SPLIT_KEYS", INT, "64", "benchmarks",
     "fewest keys a block of paged attention v1 takes when a step of few rows splits them", 16,
     65536, NULL},
    {"GPC_PAGED_PDL", FLAG, "1", "benchmarks",
     "serving kernels (attention, embedding, sampling) start as the kernel before them ends (PDL)",
     0, 0, NULL},
    {"GPC_PAGED_EARLY", FLAG, "1", "benchmarks",
     "paged attention v1 reads its tables and asks its keys into L2 before waiting on the kernel "
     "before",
     0, 0, NULL},
    {"GPC_LAYERNORM_ROWS", FLAG, "1", "benchmarks",
     "layernorm forward keeps rows of up to 7 packs a lane in registers; 0: the general kernel", 0,
     0, NULL},
    {"GPC_LAYERNORM_WIDE", FLAG, "1", "benchmarks",
     "layernorm backward fuses bf16/f16 rows of 1025-1792 columns not split; 0: the two-kernel "
     "path",
     0, 0, NULL},
    {"GPC_LAYERNORM_SPLIT", FLAG, "1", "benchmarks",
     "layernorm backward splits bf16/f16 rows of 769-1536 columns over two warps; 0: a warp a row",
     0, 0, NULL},
    {"GPC_LAYERNORM_STAGE", FLAG, "1", "benchmarks",
     "layernorm backward stages bf16/f16 rows of 769+ columns in shared memory, a row ahead; 0: "
     "off",
     0, 0, NULL},
    {"GPC_STENCIL_KERNEL", STRING, "auto", "benchmarks",
     "gpc stencil's GPU update kernel; auto is stream2; twostep and stream2 do two steps a pass", 0,
     0, "auto|vector|column|plain|shared|twostep|async|stream2"},
    {"GPC_STENCIL_ASYNC_ROWS", STRING, "16", "benchmarks",
     "rows of the async stencil kernel's tile; 8 and 32 for measuring", 0, 0, "8|16|32"},
    {"GPC_STENCIL_STREAM2_ROWS", STRING, "6", "benchmarks",
     "rows of the stream2 stencil kernel's tile; 14 and 30 for measuring", 0, 0, "6|14|30"},
    {"GPC_MD_STEP", STRING, "fused", "benchmarks",
     "gpc md on a GPU: split (integrate, then forces) or fused (forces end a step, begin the next)",
     0, 0, "split|fused"},
    {"GPC_MD_UNROLL", STRING, "4", "benchmarks",
     "gpc md on a GPU: partners (forces) and candidates (list build) whose loads issue together", 0,
     0, "1|2|4|8"},
    {"GPC_MD_LIST", STRING, "cells", "benchmarks",
     "gpc md on a GPU: the list built by a warp per cell (cells1: a candidate a lane) or a thread "
     "per atom",
     0, 0, "cells|cells1|atoms"},
    {"GPC_MD_PHASES", FLAG, "0", "benchmarks",
     "gpc md on a GPU times each phase of the step (integrate, decide, build, forces, thermo)", 0,
     0, NULL},
    {"GPC_CUDNN_TUNE", STRING, "0", "benchmarks",
     "time cuDNN's attention engines at each shape's first call, by time (1) or by energy", 0, 0,
     "0|1|energy"},
    {"GPC_CUDNN_TUNE_ENERGY_S", DOUBLE, "1", "benchmarks",
     "seconds each cuDNN candidate runs with GPC_CUDNN_TUNE=energy", 0.01, 60, NULL},
    {"GPC_BENCH_ENERGY_S", DOUBLE, "0", "benchmarks",
     "seconds each op of the CUDA benchmarks also runs at the power cap, for its energy", 0, 600,
     NULL},
    {"GPC_LOADER_DELAY_MS", INT, "0", "benchmarks",
     "the training loader sleeps this long before each batch, to provoke an input-bound run", 0,
     60000, NULL},
    {"GPC_BENCH_DATA", STRING, "/tmp/gpc-bench-data", "benchmarks",
     "bench/train_run.sh: where the benchmark's token shards are kept", 0, 0, NULL},
    {"GPC_CHECKS", STRING, "tests plan bench doctor gpcd", "benchmarks",
     "scripts/gpu-tools-check.sh: which of its parts run", 0, 0, NULL},
    {"GPC_PLAN_CASES", STRING, "d12:8 d12:16 d12:32 d24:4 d24:8 d24:16", "benchmarks",
     "scripts/gpu-plan-check.sh: the model:batch cases it checks", 0, 0, NULL},

    /* tests */
    {"GPC_TEST_SEED", STRING, NULL, "tests",
     "the randomised tests' seed, printed by each, to repeat a run (unset: a fresh one)", 0, 0,
     NULL},
    {"GPC_TEST_VERBOSE", FLAG, "0", "tests", "tests print more of what they compare", 0, 0, NULL},
    {"GPC_TEST_OOM_STEP", INT, NULL, "tests",
     "gpc train's step N (1-based) fails once as out of memory, as on a full GPU (auto-fit tests)",
     1, 1e9, NULL},
    {"GPC_TEST_FILTER", STRING, NULL, "tests",
     "the GPU test programs run only the tests this pattern matches", 0, 0, NULL},
    {"GPC_SOURCE_DIR", STRING, NULL, "tests", "the source tree the tests read (CTest sets it)", 0,
     0, NULL},
    {"GPC_BINARY_DIR", STRING, NULL, "tests", "the build tree the tests run from (CTest sets it)",
     0, 0, NULL},
};

#define COUNT (sizeof table / sizeof table[0])

/* Values set by gpc_settings_override, ahead of the environment. Fixed
 * buffers: flags' values are short, and nothing is left to free at exit. */
#define OVERRIDE_MAX 256
static char override_value[COUNT][OVERRIDE_MAX];
static unsigned char overridden[COUNT];

/* One warning per setting for a value that does not parse, however often it
 * is read (some are read at every step). */
static atomic_int warned[COUNT];

size_t gpc_settings_count(void) {
    return COUNT;
}

const gpc_setting_info *gpc_settings_at(size_t index) {
    return index < COUNT ? &table[index] : NULL;
}

const gpc_setting_info *gpc_settings_find(const char *name) {
    for (size_t i = 0; name && i < COUNT; i++)
        if (strcmp(table[i].name, name) == 0) return &table[i];
    return NULL;
}

/* The entry of name, or NULL after logging the bug. */
static const gpc_setting_info *entry(const char *name) {
    const gpc_setting_info *info = gpc_settings_find(name);
    if (!info)
        gpc_log(GPC_LOG_ERROR,
                "%s is read as a setting but is not in gpc's table of settings: add it to "
                "src/core/settings.c",
                name ? name : "(null)");
    return info;
}

static const char *given(const gpc_setting_info *info) {
    size_t i = (size_t)(info - table);
    const char *v = overridden[i] ? override_value[i] : getenv(info->name);
    return v && *v ? v : NULL;
}

static void warn_once(const gpc_setting_info *info, const char *value, const char *expected) {
    if (atomic_exchange(&warned[info - table], 1)) return;
    gpc_log(GPC_LOG_WARN, "%s=%s is not %s: using %s", info->name, value, expected,
            info->default_value ? info->default_value : "none");
}

/* -1 when text is not one of the words. */
static int parse_flag(const char *text) {
    static const char *const on[] = {"1", "on", "true", "yes"};
    static const char *const off[] = {"0", "off", "false", "no"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(text, on[i]) == 0) return 1;
        if (strcasecmp(text, off[i]) == 0) return 0;
    }
    return -1;
}

static int in_range(const gpc_setting_info *info, double v) {
    return !(info->min < info->max) || (v >= info->min && v <= info->max);
}

/* 0 when text is a whole number within the entry's range. */
static int parse_int(const gpc_setting_info *info, const char *text, long *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || !in_range(info, (double)v)) return -1;
    *out = v;
    return 0;
}

static int parse_double(const gpc_setting_info *info, const char *text, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !isfinite(v) || !in_range(info, v)) return -1;
    *out = v;
    return 0;
}

/* 0 when text is one of choices ("a|b|c"), or there are none. */
static int is_choice(const gpc_setting_info *info, const char *text) {
    if (!info->choices) return 0;
    size_t n = strlen(text);
    for (const char *c = info->choices; *c;) {
        size_t len = strcspn(c, "|");
        if (len == n && strncmp(c, text, n) == 0) return 0;
        c += len + (c[len] == '|');
    }
    return -1;
}

/* "a whole number from 1 to 4096" and the like, for messages. */
static const char *expected_text(const gpc_setting_info *info, char *buf, size_t size) {
    switch (info->type) {
    case GPC_SETTING_FLAG:
        return "1, on, true, yes, 0, off, false or no";
    case GPC_SETTING_INT:
        if (info->min < info->max)
            snprintf(buf, size, "a whole number from %.0f to %.0f", info->min, info->max);
        else
            snprintf(buf, size, "a whole number");
        return buf;
    case GPC_SETTING_DOUBLE:
        if (info->min < info->max)
            snprintf(buf, size, "a number from %g to %g", info->min, info->max);
        else
            snprintf(buf, size, "a number");
        return buf;
    case GPC_SETTING_STRING:
        snprintf(buf, size, "one of %s", info->choices ? info->choices : "(any)");
        return buf;
    }
    return "valid";
}

int gpc_setting_is_choice(const char *name, const char *text) {
    const gpc_setting_info *info = entry(name);
    return info && text && is_choice(info, text) == 0;
}

const char *gpc_setting_given(const char *name) {
    const gpc_setting_info *info = entry(name);
    return info ? given(info) : NULL;
}

const char *gpc_setting_str(const char *name) {
    const gpc_setting_info *info = entry(name);
    if (!info) return NULL;
    const char *v = given(info);
    return v ? v : info->default_value;
}

int gpc_setting_flag(const char *name) {
    const gpc_setting_info *info = entry(name);
    if (!info) return 0;
    const int dflt = info->default_value ? parse_flag(info->default_value) == 1 : 0;
    const char *v = given(info);
    if (!v) return dflt;
    int on = parse_flag(v);
    if (on >= 0) return on;
    char buf[128];
    warn_once(info, v, expected_text(info, buf, sizeof buf));
    return dflt;
}

long gpc_setting_int(const char *name) {
    const gpc_setting_info *info = entry(name);
    if (!info) return 0;
    long dflt = 0, v = 0;
    if (info->default_value) dflt = strtol(info->default_value, NULL, 10);
    const char *text = given(info);
    if (!text) return dflt;
    if (parse_int(info, text, &v) == 0) return v;
    char buf[128];
    warn_once(info, text, expected_text(info, buf, sizeof buf));
    return dflt;
}

double gpc_setting_double(const char *name) {
    const gpc_setting_info *info = entry(name);
    if (!info) return 0;
    double dflt = 0, v = 0;
    if (info->default_value) dflt = strtod(info->default_value, NULL);
    const char *text = given(info);
    if (!text) return dflt;
    if (parse_double(info, text, &v) == 0) return v;
    char buf[128];
    warn_once(info, text, expected_text(info, buf, sizeof buf));
    return dflt;
}

gpc_status gpc_setting_int_checked(const char *name, long *out) {
    const gpc_setting_info *info = entry(name);
    *out = 0;
    if (!info || info->type != GPC_SETTING_INT)
        return gpc_error(GPC_ERR_INTERNAL, "%s is not an integer setting of gpc's table",
                         name ? name : "(null)");
    if (info->default_value) *out = strtol(info->default_value, NULL, 10);
    const char *text = given(info);
    if (!text || parse_int(info, text, out) == 0) return GPC_OK;
    char buf[128];
    return gpc_error(GPC_ERR_INVALID_ARG, "%s must be %s, not '%s'", name,
                     expected_text(info, buf, sizeof buf), text);
}

gpc_status gpc_settings_override(const char *name, const char *value) {
    const gpc_setting_info *info = gpc_settings_find(name);
    if (!info)
        return gpc_error(GPC_ERR_INVALID_ARG, "%s is not a gpc setting (gpc help env lists them)",
                         name ? name : "(null)");
    size_t i = (size_t)(info - table);
    if (!value) {
        overridden[i] = 0;
        return GPC_OK;
    }
    long l;
    double d;
    int bad = info->type == GPC_SETTING_FLAG     ? parse_flag(value) < 0
              : info->type == GPC_SETTING_INT    ? parse_int(info, value, &l) != 0
              : info->type == GPC_SETTING_DOUBLE ? parse_double(info, value, &d) != 0
                                                 : is_choice(info, value) != 0;
    if (bad) {
        char buf[128];
        return gpc_error(GPC_ERR_INVALID_ARG, "%s must be %s, not '%s'", name,
                         expected_text(info, buf, sizeof buf), value);
    }
    if (strlen(value) >= OVERRIDE_MAX)
        return gpc_error(GPC_ERR_INVALID_ARG, "%s's value is longer than %d characters", name,
                         OVERRIDE_MAX - 1);
    memcpy(override_value[i], value, strlen(value) + 1);
    overridden[i] = 1;
    return GPC_OK;
}
