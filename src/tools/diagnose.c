/*
 * diagnose.c: the classifier of gpc/diagnose.h, the trace reader its tests
 * use, the peak-FLOP/s table behind MFU, and the post-mortem of a run
 * folder. Medians rather than means summarise a trace, so that one odd
 * sample (a checkpoint, an evaluation) does not decide the cause.
 */
#include "gpc/diagnose.h"

#include "gpc/model.h"
#include "gpc/plan.h"
#include "gpc/report.h"

#include <ctype.h>
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *gpc_diag_kind_name(gpc_diag_kind kind) {
    static const char *names[] = {"launch_bound", "input_bound", "under_occupied", "power_capped",
                                  "thermal",      "memory_full", "communication",  "out_of_memory"};
    return (unsigned)kind < GPC_DIAG_KIND_COUNT ? names[kind] : "?";
}

/* The fields by name, for the trace reader and the statistics below. */
static const struct {
    const char *name;
    size_t offset;
} diag_fields[] = {
#define FIELD(f)                                                                                   \
    { #f, offsetof(gpc_diag_sample, f) }
    FIELD(t),
    FIELD(util),
    FIELD(sm_active),
    FIELD(sm_occupancy),
    FIELD(tensor_active),
    FIELD(dram_bw),
    FIELD(pcie_rx_mbs),
    FIELD(pcie_tx_mbs),
    FIELD(memory_frac),
    FIELD(temperature_c),
    FIELD(power_capped),
    FIELD(thermal_capped),
    FIELD(cpu_process),
    FIELD(cpu_top_thread),
    FIELD(step_ms),
    FIELD(tokens_per_s),
    FIELD(comm_exposed),
    FIELD(input_wait),
    FIELD(input_wait_ms),
#undef FIELD
};
#define DIAG_NFIELDS (sizeof diag_fields / sizeof diag_fields[0])

/* Through memcpy: the fields are doubles at these offsets, and memcpy says
 * so without a cast between pointer types. */
static void set_field(gpc_diag_sample *s, size_t offset, double v) {
    memcpy((char *)s + offset, &v, sizeof v);
}

static double get_field(const gpc_diag_sample *s, size_t offset) {
    double v;
    memcpy(&v, (const char *)s + offset, sizeof v);
    return v;
}

void gpc_diag_sample_clear(gpc_diag_sample *s) {
    for (size_t i = 0; i < DIAG_NFIELDS; i++)
        set_field(s, diag_fields[i].offset, -1);
}

/* ------------------------------------------------------------ statistics */

typedef struct {
    int known; /* samples with a value */
    double median, min, max;
    double share_set; /* share of known samples >= 0.5 (for 0/1 flags) */
} field_stats;

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Statistics of one field over the samples whose value is known (>= 0). */
static field_stats stats_of(const gpc_diag_sample *samples, int n, size_t offset, double *scratch) {
    field_stats s = {0, -1, -1, -1, 0};
    int set = 0;
    for (int i = 0; i < n; i++) {
        double v = get_field(&samples[i], offset);
        if (!(v >= 0)) continue; /* -1 and NAN: unknown */
        scratch[s.known++] = v;
        set += v >= 0.5;
    }
    if (!s.known) return s;
    qsort(scratch, (size_t)s.known, sizeof *scratch, compare_double);
    s.min = scratch[0];
    s.max = scratch[s.known - 1];
    s.median = s.known % 2 ? scratch[s.known / 2]
                           : 0.5 * (scratch[s.known / 2 - 1] + scratch[s.known / 2]);
    s.share_set = (double)set / s.known;
    return s;
}

#define STATS(f) stats_of(samples, n, offsetof(gpc_diag_sample, f), scratch)

/* Share of the steps slower than GPC_DIAG_STALL_RATIO times the median;
 * -1 with fewer than 5 steps known. */
static double stall_share(const gpc_diag_sample *samples, int n, double median) {
    int known = 0, slow = 0;
    for (int i = 0; i < n; i++) {
        if (!(samples[i].step_ms >= 0)) continue;
        known++;
        slow += samples[i].step_ms > GPC_DIAG_STALL_RATIO * median;
    }
    return known >= 5 ? (double)slow / known : -1;
}

/* The finding written, or NULL when out is full. */
static gpc_diag_finding *add(gpc_diag_finding *out, int max, int *count, gpc_diag_kind kind,
                             const char *remedy, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static gpc_diag_finding *add(gpc_diag_finding *out, int max, int *count, gpc_diag_kind kind,
                             const char *remedy, const char *fmt, ...) {
    if (*count >= max) return NULL;
    gpc_diag_finding *f = &out[(*count)++];
    f->kind = kind;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->text, sizeof f->text, fmt, ap);
    va_end(ap);
    snprintf(f->remedy, sizeof f->remedy, "%s", remedy);
    f->nfigures = 0;
    return f;
}

/* Adds a figure to f (NULL: the finding was dropped). */
static void figure(gpc_diag_finding *f, const char *name, double value) {
    if (f && f->nfigures < GPC_DIAG_FIGURES && value >= 0)
        f->figures[f->nfigures++] = (gpc_diag_figure){name, value};
}

/* ------------------------------------------------------------ classifier */

int gpc_diagnose(const gpc_diag_sample *samples, int n, gpc_diag_finding *out, int max) {
    int count = 0;
    if (n <= 0 || max <= 0) return 0;
    double *scratch = malloc((size_t)n * sizeof *scratch);
    if (!scratch) return 0;
    field_stats util = STATS(util), sm = STATS(sm_active), occ = STATS(sm_occupancy);
    field_stats tensor = STATS(tensor_active), rx = STATS(pcie_rx_mbs);
    field_stats mem = STATS(memory_frac), temp = STATS(temperature_c);
    field_stats power = STATS(power_capped), thermal = STATS(thermal_capped);
    field_stats top = STATS(cpu_top_thread), proc = STATS(cpu_process);
    field_stats step = STATS(step_ms), comm = STATS(comm_exposed);
    field_stats wait = STATS(input_wait), wait_ms = STATS(input_wait_ms);
    free(scratch);

    /* How busy the GPU is: GPM's SM activity where the driver gives it, as
     * NVML's utilisation counts a kernel on one SM as "busy" */
    int gpu_known = sm.known || util.known;
    int gpu_low = sm.known ? sm.median < GPC_DIAG_SM_ACTIVE_LOW
                           : util.known && util.median < GPC_DIAG_UTIL_LOW;
    char busy[128];
    if (sm.known && util.known)
        snprintf(busy, sizeof busy, "SM activity %.0f%% (utilisation %.0f%%)", sm.median,
                 util.median);
    else if (sm.known)
        snprintf(busy, sizeof busy, "SM activity %.0f%%", sm.median);
    else
        snprintf(busy, sizeof busy, "utilisation %.0f%%", util.median);
    /* The host thread that sets the pace; the process total stands in when
     * threads were not read (it overstates a loop spread over threads) */
    double host = top.known ? top.median : proc.known ? proc.median : -1;
    double stalls = step.known ? stall_share(samples, n, step.median) : -1;
    int swing = util.known >= 2 && util.max - util.min > GPC_DIAG_UTIL_SWING;
    int copies = rx.known && rx.median >= GPC_DIAG_PCIE_BUSY_MBS;
    int stalling = stalls > GPC_DIAG_STALL_SHARE;
    /* The trainer's own clock around the loader says what the GPU's swings
     * and the steps' stalls only suggest: where it is known, it decides
     * whether the step waits on the loader (a saturated host thread is then
     * the loader's, not a launching one). Host copies queued on a side
     * stream are not in it, so busy PCIe still counts. */
    int waited = wait.known && wait.median > GPC_DIAG_INPUT_WAIT;
    if (wait.known) swing = stalling = 0;

    int launch = !waited && gpu_low && host >= GPC_DIAG_THREAD_SATURATED;
    if (launch)
        add(out, max, &count, GPC_DIAG_LAUNCH_BOUND,
            "capture the step in a CUDA graph, fuse small operations, or raise the micro-batch "
            "(--batch) so each launch does more work",
            "launch-bound: a host thread runs at %.0f%% of a core while %s: the GPU idles "
            "between short kernels, waiting for the next launch",
            host, busy);
    int input =
        waited ||
        (!launch && ((gpu_low && (swing || copies || stalling)) || (!gpu_known && stalling)));
    if (waited) {
        char of[64] = "";
        if (wait_ms.known && step.known)
            snprintf(of, sizeof of, " (%.1f ms of %.1f ms)", wait_ms.median, step.median);
        else if (wait_ms.known)
            snprintf(of, sizeof of, " (%.1f ms)", wait_ms.median);
        gpc_diag_finding *f = add(
            out, max, &count, GPC_DIAG_INPUT_BOUND,
            "give the loader more threads or a deeper prefetch, prepare the data ahead (gpc data "
            "prepare: token shards, not text), and read it from faster storage (local NVMe or "
            "page cache, not a network file system)",
            "input-bound: the step waits %.0f%% of its time%s for its input batches, over the "
            "%.0f%% at which the loader sets the pace",
            100 * wait.median, of, 100 * GPC_DIAG_INPUT_WAIT);
        figure(f, "input_wait", wait.median);
        figure(f, "input_wait_ms", wait_ms.median);
        figure(f, "step_ms", step.median);
    } else if (input && copies)
        add(out, max, &count, GPC_DIAG_INPUT_BOUND,
            "pin the host buffers and copy on a side stream ahead of the step; send token ids, "
            "not float tensors; keep the data on the GPU between steps",
            "input-bound: %s while PCIe carries %.0f MB/s to the GPU: it waits on host copies",
            busy, rx.median);
    else if (input && swing)
        add(out, max, &count, GPC_DIAG_INPUT_BOUND,
            "use more loader threads and prefetch the next batch; tokenise ahead of time (gpc "
            "data prepare); keep checkpoints and logging off the step",
            "input-bound: utilisation swings between %.0f%% and %.0f%% (median %s): the GPU "
            "idles in bursts, waiting on the loader",
            util.min, util.max, busy);
    else if (input)
        add(out, max, &count, GPC_DIAG_INPUT_BOUND,
            "use more loader threads and prefetch the next batch; tokenise ahead of time (gpc "
            "data prepare); write checkpoints in the background",
            "input-bound: %.0f%% of steps take over %.1fx the median %.1f ms: the step waits on "
            "the loader or host work",
            100 * stalls, GPC_DIAG_STALL_RATIO, step.median);
    if (gpu_low && !launch && !input) {
        char extra[128] = "";
        if (occ.known) snprintf(extra, sizeof extra, ", occupancy %.0f%%", occ.median);
        if (tensor.known)
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", tensor cores %.0f%%",
                     tensor.median);
        add(out, max, &count, GPC_DIAG_UNDER_OCCUPIED,
            "raise the micro-batch (--batch) or the context so each kernel fills the SMs "
            "(gpc plan shows what fits); keep the step size with --total-batch",
            "under-occupied: %s%s with the host not saturated: the kernels are too small to "
            "fill the GPU",
            busy, extra);
    }
    if (power.known && power.share_set >= GPC_DIAG_CAPPED_SHARE)
        add(out, max, &count, GPC_DIAG_POWER_CAPPED,
            "check the limit with nvidia-smi -q -d POWER and raise it (nvidia-smi -pl) if the "
            "power supply allows; a smaller batch does not help",
            "power-capped: the power limit held the SM clock down in %.0f%% of the samples",
            100 * power.share_set);
    if ((temp.known && temp.max > GPC_DIAG_TEMPERATURE_HOT) ||
        (thermal.known && thermal.share_set >= GPC_DIAG_CAPPED_SHARE))
        add(out, max, &count, GPC_DIAG_THERMAL,
            "check fans, airflow and the room's temperature; spread jobs over GPUs",
            "thermal: up to %.0f C (alert above %.0f C), thermal slowdown in %.0f%% of the "
            "samples",
            temp.max, GPC_DIAG_TEMPERATURE_HOT, thermal.known ? 100 * thermal.share_set : 0);
    if (mem.known && mem.max > GPC_DIAG_MEMORY_FRAC)
        add(out, max, &count, GPC_DIAG_MEMORY_FULL,
            "lower --batch and keep the step with --total-batch, or --recompute 2; 'gpc plan' "
            "shows what fits",
            "memory: up to %.0f%% of the GPU's memory in use (alert above %.0f%%): near out of "
            "memory",
            100 * mem.max, 100 * GPC_DIAG_MEMORY_FRAC);
    if (comm.known && comm.median > GPC_DIAG_COMM_EXPOSED)
        figure(
            add(out, max, &count, GPC_DIAG_COMMUNICATION,
                "overlap more: smaller --bucket-mb starts the all-reduce earlier in backward; "
                "check the link with nvidia-smi topo -m (NVLink or one PCIe switch) and "
                "NCCL_DEBUG=INFO",
                "communication: %.0f%% of each step waits on the all-reduce that backward does not "
                "hide",
                100 * comm.median),
            "comm_exposed", comm.median);
    return count;
}

/* ------------------------------------------------------------- traces */

gpc_status gpc_diag_trace_read(const char *path, gpc_diag_sample **out, int *n) {
    *out = NULL;
    *n = 0;
    char *text;
    size_t size;
    GPC_TRY(gpc_read_file(path, &text, &size));
    int column[64], ncolumns = 0, line_no = 0, capacity = 0;
    gpc_diag_sample *samples = NULL;
    gpc_status st = GPC_OK;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        line_no++;
        line[strcspn(line, "\r")] = 0;
        if (line[0] == '#' || line[strspn(line, " \t")] == 0) continue;
        if (!ncolumns) { /* the header */
            for (char *p = line; p && ncolumns < 64;) {
                char *comma = strchr(p, ',');
                if (comma) *comma = 0;
                while (isspace((unsigned char)*p))
                    p++;
                p[strcspn(p, " \t")] = 0;
                column[ncolumns] = -1;
                for (size_t i = 0; i < DIAG_NFIELDS; i++)
                    if (!strcmp(p, diag_fields[i].name)) column[ncolumns] = (int)i;
                if (column[ncolumns] < 0) {
                    st = gpc_error(GPC_ERR_FORMAT,
                                   "%s line %d: '%s' is not a trace field (use the names of "
                                   "gpc_diag_sample: util, sm_active, step_ms, ...)",
                                   path, line_no, p);
                    break;
                }
                ncolumns++;
                p = comma ? comma + 1 : NULL;
            }
            if (st) break;
            continue;
        }
        if (*n == capacity) {
            capacity = capacity ? 2 * capacity : 64;
            gpc_diag_sample *grown = realloc(samples, (size_t)capacity * sizeof *grown);
            if (!grown) {
                st = gpc_error(GPC_ERR_NOMEM, "out of memory reading %s", path);
                break;
            }
            samples = grown;
        }
        gpc_diag_sample *s = &samples[*n];
        gpc_diag_sample_clear(s);
        int c = 0;
        for (char *p = line; p; c++) {
            char *comma = strchr(p, ',');
            if (comma) *comma = 0;
            if (c >= ncolumns) {
                st = gpc_error(GPC_ERR_FORMAT, "%s line %d has more cells than the header names",
                               path, line_no);
                break;
            }
            char *end;
            while (isspace((unsigned char)*p))
                p++;
            if (*p) {
                double v = strtod(p, &end);
                while (isspace((unsigned char)*end))
                    end++;
                if (end == p || *end) {
                    st = gpc_error(GPC_ERR_FORMAT, "%s line %d: '%s' is not a number", path,
                                   line_no, p);
                    break;
                }
                set_field(s, diag_fields[column[c]].offset, v);
            }
            p = comma ? comma + 1 : NULL;
        }
        if (st) break;
        (*n)++;
    }
    gpc_free(text);
    if (st == GPC_OK && *n == 0)
        st = gpc_error(GPC_ERR_FORMAT,
                       "%s holds no samples: a header line and one line per "
                       "sample are needed",
                       path);
    if (st) {
        free(samples);
        *n = 0;
        return st;
    }
    *out = samples;
    return GPC_OK;
}

/* ----------------------------------------------------------------- MFU */

double gpc_diag_peak_flops(const char *gpu_name, const char *precision) {
    /* Dense tensor-core TFLOP/s for bf16/f16 with f32 accumulation, and
     * f32 without tensor cores, from NVIDIA's datasheets. More specific
     * names first: "H100 PCIe" before "H100". */
    static const struct {
        const char *match;
        double low, f32;
    } table[] = {
        {"B200", 2250, 80},  {"H200", 989, 67},       {"H100 PCIe", 756, 51}, {"H100 NVL", 835, 60},
        {"H100", 989, 67},   {"H800", 989, 67},       {"GH200", 989, 67},     {"A100", 312, 19.5},
        {"A800", 312, 19.5}, {"L40S", 362, 91.6},     {"L40", 181, 90.5},     {"L4", 121, 30.3},
        {"A10", 125, 31.2},  {"RTX 4090", 165, 82.6}, {"RTX 3090", 71, 35.6}, {"V100", 125, 15.7},
    };
    if (!gpu_name || !*gpu_name) return 0;
    int low = !precision || !strcmp(precision, "bf16") || !strcmp(precision, "f16");
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strstr(gpu_name, table[i].match)) return (low ? table[i].low : table[i].f32) * 1e12;
    return 0;
}

/* ------------------------------------------------------------ run folder */

int gpc_diag_is_oom_line(const char *line) {
    static const char *needles[] = {
        "out of GPU memory",         /* cuda_backend.c's allocator */
        "scratch memory on cuda:",   /* cuda_ops.cu's scratch buffer */
        "cudaErrorMemoryAllocation", /* a CUDA call's error name */
        "CUDA out of memory",        /* PyTorch and others */
        "CUBLAS_STATUS_ALLOC_FAILED",
        ": out of memory", /* gpc_status_name(GPC_ERR_NOMEM) in a CLI error */
    };
    for (size_t i = 0; i < sizeof needles / sizeof needles[0]; i++)
        if (strstr(line, needles[i])) return 1;
    return 0;
}

/* The run's log: log_path, else RUN/train.log, RUN/log.txt, or the first
 * RUN/ *.log. Writes "" when there is none. */
static void find_log(const char *run, const char *log_path, char *out, size_t size) {
    out[0] = 0;
    if (log_path) {
        snprintf(out, size, "%s", log_path);
        return;
    }
    static const char *names[] = {"train.log", "log.txt"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(out, size, "%s/%s", run, names[i]);
        if (gpc_path_exists(out)) return;
    }
    out[0] = 0;
    DIR *dir = opendir(run);
    struct dirent *e;
    while (dir && (e = readdir(dir))) {
        size_t len = strlen(e->d_name);
        if (len > 4 && !strcmp(e->d_name + len - 4, ".log")) {
            snprintf(out, size, "%s/%s", run, e->d_name);
            break;
        }
    }
    if (dir) closedir(dir);
}

/* The last out-of-memory line of the log (the one that ended the run). */
static gpc_status scan_log(const char *path, gpc_diag_run_summary *s) {
    FILE *f = fopen(path, "r");
    if (!f)
        return gpc_error(GPC_ERR_IO, "cannot read the log %s: give an existing file with --log",
                         path);
    char line[4096];
    while (fgets(line, sizeof line, f))
        if (gpc_diag_is_oom_line(line)) {
            line[strcspn(line, "\r\n")] = 0;
            snprintf(s->oom_line, sizeof s->oom_line, "%.319s", line);
            s->out_of_memory = 1;
        }
    fclose(f);
    return GPC_OK;
}

static int config_int(const gpc_report *r, const char *key, int fallback) {
    const char *v = gpc_report_config(r, key);
    return v && *v ? atoi(v) : fallback;
}

/* The GPU's memory in bytes: the OOM message's "of N GiB" total, else
 * gpc plan's table by the GPU's name; 0 when unknown. */
static uint64_t gpu_bytes(const gpc_diag_run_summary *s) {
    const char *of = strstr(s->oom_line, " GiB free of ");
    if (of) {
        double gib = atof(of + strlen(" GiB free of "));
        if (gib > 0) return (uint64_t)(gib * 1073741824.0);
    }
    int count;
    const gpc_plan_gpu *gpus = gpc_plan_gpus(&count);
    for (int i = 0; i < count; i++) {
        char model[64];
        snprintf(model, sizeof model, "%s", gpus[i].name);
        model[strcspn(model, " ")] = 0; /* "H100 80GB" -> "H100" */
        if (s->gpu_name[0] && strstr(s->gpu_name, model)) return gpus[i].bytes;
    }
    return 0;
}

/* What fits, from gpc plan's model: a smaller micro-batch, recomputation,
 * LoRA, a larger GPU. Writes one line to remedy. */
static void oom_remedy(const gpc_report *r, const gpc_diag_run_summary *s, char *remedy,
                       size_t size) {
    gpc_plan_input in;
    memset(&in, 0, sizeof in);
    gpc_plan_defaults(&in);
    in.layers = config_int(r, "layers", 0);
    in.heads = config_int(r, "heads", 0);
    in.channels = config_int(r, "channels", 0);
    in.context = config_int(r, "context", 0);
    in.vocab = config_int(r, "vocab_size", in.vocab);
    in.batch = config_int(r, "batch", 0);
    in.recompute =
        GPT_RECOMPUTE(config_int(r, "recompute", 0), config_int(r, "recompute_layers", 0));
    const char *precision = gpc_report_config(r, "precision");
    in.dtype = precision && !strcmp(precision, "f32")   ? GPC_F32
               : precision && !strcmp(precision, "f16") ? GPC_F16
                                                        : GPC_BF16;
    in.cuda = 1;
    gpc_plan_result plan;
    uint64_t bytes = gpu_bytes(s);
    if (in.layers <= 0 || in.batch <= 0 || gpc_plan_compute(&in, &plan) != GPC_OK) {
        snprintf(remedy, size,
                 "lower --batch and keep the step with --total-batch, or add --recompute 2; "
                 "'gpc plan --model dN --batch B' shows what fits (config.txt lacks the model)");
        return;
    }
    char need[32];
    gpc_format_bytes((double)plan.total, need, sizeof need);
    int fits = bytes ? gpc_plan_max_batch(&in, bytes) : -1;
    gpc_plan_input rc = in;
    rc.recompute = 2;
    int fits_rc = bytes ? gpc_plan_max_batch(&rc, bytes) : -1;
    gpc_plan_input lora = in;
    lora.lora_rank = 8;
    int fits_lora = bytes ? gpc_plan_max_batch(&lora, bytes) : -1;
    size_t used = 0;
    used +=
        (size_t)snprintf(remedy + used, size - used, "gpc plan: batch %d needs %s", in.batch, need);
    if (bytes) {
        char have[32];
        used += (size_t)snprintf(remedy + used, size - used, " of %s",
                                 gpc_format_bytes((double)bytes, have, sizeof have));
    }
    if (fits > 0 && used < size)
        used += (size_t)snprintf(remedy + used, size - used,
                                 "; --batch %d fits (keep the step with --total-batch)", fits);
    if (fits_rc > fits && gpt_recompute_level(in.recompute) < 2 && used < size)
        used += (size_t)snprintf(remedy + used, size - used,
                                 "; with --recompute 2, --batch %d fits", fits_rc);
    if (fits <= 0 && fits_rc <= 0 && fits_lora > 0 && used < size)
        used += (size_t)snprintf(remedy + used, size - used,
                                 "; LoRA fine-tuning at rank 8 (gpc plan --lora 8) fits --batch %d",
                                 fits_lora);
    if (used < size) {
        int count;
        const gpc_plan_gpu *gpus = gpc_plan_gpus(&count);
        for (int i = 0; i < count; i++)
            if (gpus[i].bytes > bytes && gpus[i].bytes >= plan.total) {
                snprintf(remedy + used, size - used, "; the %s fits it as it is", gpus[i].name);
                break;
            }
    }
}

/* The run's metrics as samples: step time, tokens/s, the power cap, the
 * share of the step waiting on data parallelism's exchange. */
static int run_samples(const gpc_report *r, gpc_diag_sample *samples) {
    int n = gpc_report_steps(r);
    for (int i = 0; i < n; i++) {
        gpc_diag_sample *s = &samples[i];
        gpc_diag_sample_clear(s);
        double ms = gpc_report_value(r, i, "ms");
        double tps = gpc_report_value(r, i, "tokens_per_s");
        double capped = gpc_report_value(r, i, "gpu_power_capped");
        double comm = gpc_report_value(r, i, "comm_exposed");
        double wait = gpc_report_value(r, i, "input_wait");
        double wait_ms = gpc_report_value(r, i, "input_wait_ms");
        /* the first steps compile, tune and warm caches: not the run's pace */
        if (i >= 2 && !isnan(ms)) s->step_ms = ms;
        if (i >= 2 && !isnan(tps)) s->tokens_per_s = tps;
        if (!isnan(capped)) s->power_capped = capped;
        if (i >= 2 && !isnan(comm)) s->comm_exposed = comm;
        if (i >= 2 && !isnan(wait)) s->input_wait = wait;
        if (i >= 2 && !isnan(wait_ms)) s->input_wait_ms = wait_ms;
    }
    return n;
}

static void run_mfu(const gpc_report *r, const gpc_diag_sample *samples, int n,
                    gpc_diag_run_summary *s) {
    const char *params = gpc_report_config(r, "parameters");
    int L = config_int(r, "layers", 0), C = config_int(r, "channels", 0);
    int T = config_int(r, "context", 0);
    if (!params || L <= 0 || C <= 0 || T <= 0) {
        snprintf(s->peak_note, sizeof s->peak_note, "config.txt lacks the model's size");
        return;
    }
    /* FLOPs per token: 6N for the weights' forward and backward, 6LCT for
     * attention's scores (PaLM appendix B, as report.c) */
    s->flops_per_token = 6.0 * atof(params) + 6.0 * L * (double)C * T;
    double *tps = malloc((size_t)(n > 0 ? n : 1) * sizeof *tps);
    field_stats st = tps ? stats_of(samples, n, offsetof(gpc_diag_sample, tokens_per_s), tps)
                         : (field_stats){0, -1, -1, -1, 0};
    free(tps);
    if (st.known) s->achieved_flops = st.median * s->flops_per_token;
    const char *peak = gpc_report_config(r, "peak_tflops");
    if (peak && atof(peak) > 0)
        s->peak_flops = atof(peak) * 1e12;
    else {
        double p = gpc_diag_peak_flops(s->gpu_name, gpc_report_config(r, "precision"));
        if (p > 0) s->peak_flops = p;
    }
    if (s->peak_flops <= 0)
        snprintf(s->peak_note, sizeof s->peak_note,
                 "unknown GPU '%s': its peak FLOP/s is not in gpc's table (add peak_tflops=N "
                 "to config.txt)",
                 s->gpu_name[0] ? s->gpu_name : "none recorded");
    else if (s->achieved_flops > 0)
        s->mfu = s->achieved_flops / s->peak_flops;
}

gpc_status gpc_diag_run(const char *run, const char *log_path, gpc_diag_run_summary *s,
                        gpc_diag_finding *out, int max, int *count) {
    memset(s, 0, sizeof *s);
    s->flops_per_token = s->achieved_flops = s->peak_flops = s->mfu = -1;
    *count = 0;
    if (!gpc_path_is_dir(run))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s is not a directory: give the run folder of gpc train --out", run);
    char metrics[4096], config[4096], log[4096];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run);
    snprintf(config, sizeof config, "%s/config.txt", run);
    if (!gpc_path_exists(metrics) && !gpc_path_exists(config))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s has neither config.txt nor metrics.jsonl: is it a run folder of "
                         "gpc train --out?",
                         run);
    find_log(run, log_path, log, sizeof log);
    if (log[0]) GPC_TRY(scan_log(log, s));

    gpc_report *r;
    GPC_TRY(gpc_report_create(&r));
    /* no steps is expected of a run that died at its start: config.txt
     * still tells what it tried */
    gpc_status st = gpc_report_read(r, run);
    if (st != GPC_OK && gpc_report_steps(r) > 0) {
        gpc_report_free(r);
        return st;
    }
    s->steps = gpc_report_steps(r);
    const char *gpu = gpc_report_config(r, "gpu_name");
    snprintf(s->gpu_name, sizeof s->gpu_name, "%s", gpu && strcmp(gpu, "unknown") ? gpu : "");

    if (s->out_of_memory && *count < max) {
        gpc_diag_finding *f = &out[(*count)++];
        f->kind = GPC_DIAG_OUT_OF_MEMORY;
        f->nfigures = 0;
        snprintf(f->text, sizeof f->text, "out of memory after %d step%s: %.240s", s->steps,
                 s->steps == 1 ? "" : "s", s->oom_line);
        oom_remedy(r, s, f->remedy, sizeof f->remedy);
    }
    gpc_diag_sample *samples = calloc((size_t)(s->steps > 0 ? s->steps : 1), sizeof *samples);
    if (!samples) {
        gpc_report_free(r);
        return gpc_error(GPC_ERR_NOMEM, "out of memory reading %s", run);
    }
    int n = run_samples(r, samples);
    run_mfu(r, samples, n, s);
    *count += gpc_diagnose(samples, n, out + *count, max - *count);
    /* MFU stands in for the GPU's activity, which the metrics lack; a run
     * that waits on its loader has a low MFU for that reason */
    int named = 0;
    for (int i = 0; i < *count; i++)
        named |= out[i].kind == GPC_DIAG_UNDER_OCCUPIED || out[i].kind == GPC_DIAG_LAUNCH_BOUND ||
                 out[i].kind == GPC_DIAG_INPUT_BOUND;
    if (!named && s->mfu >= 0 && s->mfu < GPC_DIAG_MFU_LOW && *count < max) {
        gpc_diag_finding *f = &out[(*count)++];
        f->kind = GPC_DIAG_UNDER_OCCUPIED;
        f->nfigures = 0;
        figure(f, "mfu", s->mfu);
        snprintf(f->text, sizeof f->text,
                 "under-occupied: MFU %.1f%% (%.3g TFLOP/s of %.0f): the GPU does a small "
                 "share of the work it could",
                 100 * s->mfu, s->achieved_flops / 1e12, s->peak_flops / 1e12);
        snprintf(f->remedy, sizeof f->remedy,
                 "raise the micro-batch (--batch) or context so kernels fill the GPU (gpc plan "
                 "shows what fits); 'gpc doctor --pid' while it runs tells launch- from "
                 "input-bound");
    }
    free(samples);
    gpc_report_free(r);
    return GPC_OK;
}

gpc_status gpc_diag_run_input_wait(const char *run, int last, double *share, double *ms) {
    *share = *ms = -1;
    gpc_report *r;
    GPC_TRY(gpc_report_create(&r));
    gpc_status st = gpc_report_read(r, run);
    int n = gpc_report_steps(r);
    if (st != GPC_OK && n == 0) { /* no metrics yet: nothing known, no error */
        gpc_report_free(r);
        return GPC_OK;
    }
    gpc_diag_sample *samples = calloc((size_t)(n > 0 ? n : 1), sizeof *samples);
    double *scratch = calloc((size_t)(n > 0 ? n : 1), sizeof *scratch);
    if (!samples || !scratch) {
        free(samples);
        free(scratch);
        gpc_report_free(r);
        return gpc_error(GPC_ERR_NOMEM, "out of memory reading %s", run);
    }
    run_samples(r, samples);
    int from = last > 0 && n > last ? n - last : 0;
    field_stats a =
        stats_of(samples + from, n - from, offsetof(gpc_diag_sample, input_wait), scratch);
    field_stats b =
        stats_of(samples + from, n - from, offsetof(gpc_diag_sample, input_wait_ms), scratch);
    if (a.known) *share = a.median;
    if (b.known) *ms = b.median;
    free(samples);
    free(scratch);
    gpc_report_free(r);
    return GPC_OK;
}
