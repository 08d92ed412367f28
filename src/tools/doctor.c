/*
 * doctor.c: the diagnosis of gpc/doctor.h. Reads /proc, OpenMP and
 * OpenBLAS for the host, NVML (dlopen) for the GPUs, and reaches CUDA,
 * cuDNN and NCCL only through bench_cuda.h, so it builds the same with or
 * without CUDA. Every check hands its findings to the caller's sink, one
 * line each, with advice after a problem.
 */
#include "gpc/doctor.h"

#include "gpc/diagnose.h"
#include "gpc/nvml.h"
#include "tools/bench_cuda.h"

#include <cblas.h>
#include <ctype.h>
#include <dirent.h>
#include <omp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

typedef struct {
    gpc_nvml *nvml; /* NULL when the driver's NVML is absent */
    int count;      /* GPUs NVML sees */
} gpu_state;

struct gpc_doctor {
    gpc_doctor_sink sink;
    void *user;
    int problems;
    int gpu_opened; /* check_gpu_stack ran (NVML opened or found absent) */
    gpu_state gpu;
    const char *cause;              /* the classifier's kind of the finding being made, else NULL */
    const gpc_diag_finding *source; /* the classifier's finding being made, for its figures */
    /* every finding, for gpc_doctor_write_json */
    struct doctor_record *records;
    int nrecords, records_cap;
};

/* 1 when /proc/cpuinfo lists the flag (e.g. "avx2") for the first CPU. */
static int cpu_has_flag(const char *flag) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[8192];
    int found = 0;
    size_t n = strlen(flag);
    while (f && !found && fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) != 0) continue;
        for (char *p = strstr(line, flag); p; p = strstr(p + 1, flag))
            if (p[-1] == ' ' && (p[n] == ' ' || p[n] == '\n')) found = 1;
        break;
    }
    if (f) fclose(f);
    return found;
}

/* ------------------------------------------------------------- records */

struct doctor_record {
    gpc_doctor_kind kind;
    char cause[32];
    char text[1024];
    int nfigures;
    gpc_diag_figure figures[GPC_DIAG_FIGURES]; /* names are string literals */
};

/* Keeps a finding for JSON; a failed allocation drops it, never the run. */
static void record(gpc_doctor *d, gpc_doctor_kind kind, const char *text) {
    if (d->nrecords == d->records_cap) {
        int cap = d->records_cap ? 2 * d->records_cap : 64;
        struct doctor_record *grown = realloc(d->records, (size_t)cap * sizeof *grown);
        if (!grown) return;
        d->records = grown;
        d->records_cap = cap;
    }
    struct doctor_record *r = &d->records[d->nrecords++];
    r->kind = kind;
    snprintf(r->cause, sizeof r->cause, "%s", d->cause ? d->cause : "");
    snprintf(r->text, sizeof r->text, "%s", text);
    r->nfigures = 0;
    if (d->source && kind == GPC_DOCTOR_PROBLEM) {
        r->nfigures = d->source->nfigures;
        memcpy(r->figures, d->source->figures, sizeof r->figures);
    }
}

static void json_string_out(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void say(gpc_doctor *d, gpc_doctor_kind kind, const char *fmt, va_list ap) {
    char text[1024];
    vsnprintf(text, sizeof text, fmt, ap);
    if (kind == GPC_DOCTOR_PROBLEM) d->problems++;
    record(d, kind, text);
    if (d->sink) d->sink(d->user, kind, text);
}

static void finding(gpc_doctor *d, gpc_doctor_kind kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void finding(gpc_doctor *d, gpc_doctor_kind kind, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    say(d, kind, fmt, ap);
    va_end(ap);
}

static void advice(gpc_doctor *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void advice(gpc_doctor *d, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    say(d, GPC_DOCTOR_ADVICE, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------ host */

static long meminfo_kb(const char *key) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    long value = -1;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') {
            value = strtol(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return value;
}

static void cpu_name(char *out, size_t size) {
    snprintf(out, size, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            const char *v = strchr(line, ':') + 1;
            while (*v == ' ')
                v++;
            snprintf(out, size, "%s", v);
            out[strcspn(out, "\n")] = 0;
            break;
        }
    fclose(f);
}

void gpc_doctor_check_threads(gpc_doctor *d, int threads, const char *omp_env, int cores,
                              double load, const char *wait_policy) {
    char policy[96];
    snprintf(policy, sizeof policy, "waiting %s",
             wait_policy && *wait_policy ? wait_policy : "active (libgomp's default: spinning)");
    if (threads > cores) {
        finding(d, GPC_DOCTOR_PROBLEM, "OpenMP: %d threads (OMP_NUM_THREADS=%s) on %d cores, %s",
                threads, omp_env ? omp_env : "unset", cores, policy);
        advice(d,
               "more threads than cores makes every parallel loop wait on descheduled threads; "
               "set OMP_NUM_THREADS=%d (or unset it)",
               cores);
        return;
    }
    /* The 1-minute load counts the runnable processes (one is this one).
     * Beyond the cores, gpc's threads take turns with the others, and a
     * parallel loop waits for its last thread to be scheduled. */
    if (load + threads > cores + 1.0) {
        int spare = (int)(cores - load); /* the cores the others leave whole */
        finding(d, GPC_DOCTOR_PROBLEM,
                "OpenMP: %d threads (OMP_NUM_THREADS=%s) on %d cores, %s, oversubscribed: the "
                "load is already %.2f",
                threads, omp_env ? omp_env : "unset", cores, policy, load);
        advice(d,
               "other work keeps the cores busy: set OMP_NUM_THREADS=%d, or run when the load is "
               "lower%s",
               spare > 1 ? spare : 1,
               wait_policy && strcmp(wait_policy, "passive") == 0
                   ? ""
                   : ", with OMP_WAIT_POLICY=passive so waiting threads yield their cores");
        return;
    }
    finding(d, GPC_DOCTOR_OK, "OpenMP: %d threads (OMP_NUM_THREADS=%s) on %d cores, %s", threads,
            omp_env ? omp_env : "unset", cores, policy);
}

static void check_host(gpc_doctor *d) {
    char name[256], human[32], human2[32];
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_name(name, sizeof name);
    double load[3] = {0, 0, 0};
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = 0;
        fclose(f);
    }
    finding(d, GPC_DOCTOR_OK, "CPU: %s, %ld cores online, load %.2f (1 min)", name, cores, load[0]);

    long total = meminfo_kb("MemTotal"), avail = meminfo_kb("MemAvailable");
    if (total > 0 && avail >= 0) {
        double frac = (double)avail / (double)total;
        if (frac < 0.05) {
            finding(d, GPC_DOCTOR_PROBLEM, "memory: only %s available of %s (%.0f%%)",
                    gpc_format_bytes(avail * 1024.0, human, sizeof human),
                    gpc_format_bytes(total * 1024.0, human2, sizeof human2), 100 * frac);
            advice(d, "the data loader and pinned buffers need host memory; stop other processes "
                      "or lower --batch");
        } else {
            finding(d, GPC_DOCTOR_OK, "memory: %s available of %s",
                    gpc_format_bytes(avail * 1024.0, human, sizeof human),
                    gpc_format_bytes(total * 1024.0, human2, sizeof human2));
        }
    }

    gpc_doctor_check_threads(d, omp_get_max_threads(), getenv("OMP_NUM_THREADS"),
                             gpc_host_cores_available(), load[0], getenv("OMP_WAIT_POLICY"));
    int blas = openblas_get_num_threads();
    const char *config = openblas_get_config();
    if (blas > cores) {
        finding(d, GPC_DOCTOR_PROBLEM, "OpenBLAS: %d threads on %ld cores (%s)", blas, cores,
                config ? config : "");
        advice(d, "set OPENBLAS_NUM_THREADS=%ld so matrix products do not oversubscribe the CPU",
               cores);
    } else if (config && cpu_has_flag("avx2") &&
               (strstr(config, "Prescott") || strstr(config, "Core2") ||
                strstr(config, "Nehalem") || strstr(config, "Atom"))) {
        /* Seen on virtual machines that hide the CPU model: OpenBLAS falls back to
         * SSE3 kernels and every CPU matrix product runs several times slower. */
        finding(d, GPC_DOCTOR_PROBLEM, "OpenBLAS: pre-AVX2 kernels on a CPU with AVX2 (%s)",
                config);
        advice(d,
               "the CPU's model is hidden from OpenBLAS (common in virtual machines); set "
               "OPENBLAS_CORETYPE=%s so matrix products use the CPU's vector units",
               cpu_has_flag("avx512f") ? "SkylakeX" : "Haswell");
    } else {
        finding(d, GPC_DOCTOR_OK, "OpenBLAS: %d threads (%s)", blas, config ? config : "");
    }

    struct statvfs fs;
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, ".");
    if (statvfs(".", &fs) == 0) {
        double free_bytes = (double)fs.f_bavail * fs.f_frsize;
        double total_bytes = (double)fs.f_blocks * fs.f_frsize;
        gpc_format_bytes(free_bytes, human, sizeof human);
        gpc_format_bytes(total_bytes, human2, sizeof human2);
        if (free_bytes < 1024.0 * 1024 * 1024 || free_bytes < 0.02 * total_bytes) {
            finding(d, GPC_DOCTOR_PROBLEM, "disk: %s free of %s at %s", human, human2, cwd);
            advice(d, "checkpoints and token shards need room (a d12 checkpoint is about 1.5 GB); "
                      "free space or write runs elsewhere");
        } else {
            finding(d, GPC_DOCTOR_OK, "disk: %s free of %s at %s", human, human2, cwd);
        }
    }
}

/* ------------------------------------------------------------------- GPU */

static const char *throttle_text(int64_t bits, char *buf, size_t size) {
    static const struct {
        uint64_t bit;
        const char *name;
    } names[] = {
        {GPC_NVML_THROTTLE_SW_POWER_CAP, "power cap"},
        {GPC_NVML_THROTTLE_HW_SLOWDOWN, "hardware slowdown"},
        {GPC_NVML_THROTTLE_SW_THERMAL, "software thermal"},
        {GPC_NVML_THROTTLE_HW_THERMAL, "hardware thermal"},
        {GPC_NVML_THROTTLE_HW_POWER_BRAKE, "power brake"},
        {GPC_NVML_THROTTLE_APP_CLOCKS, "application clocks"},
        {GPC_NVML_THROTTLE_SYNC_BOOST, "sync boost"},
    };
    buf[0] = 0;
    if (bits < 0) return "unknown";
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if ((uint64_t)bits & names[i].bit)
            snprintf(buf + strlen(buf), size - strlen(buf), "%s%s", buf[0] ? ", " : "",
                     names[i].name);
    return buf[0] ? buf : "none";
}

/* Throttling that slows a busy GPU: heat, hardware slowdown, power brake,
 * or a power cap that pulls the clock well under its maximum. */
static int throttled(const gpc_nvml_sample *s) {
    if (s->throttle_reasons < 0) return 0;
    uint64_t bad = GPC_NVML_THROTTLE_HW_SLOWDOWN | GPC_NVML_THROTTLE_SW_THERMAL |
                   GPC_NVML_THROTTLE_HW_THERMAL | GPC_NVML_THROTTLE_HW_POWER_BRAKE;
    if ((uint64_t)s->throttle_reasons & bad) return 1;
    return ((uint64_t)s->throttle_reasons & GPC_NVML_THROTTLE_SW_POWER_CAP) &&
           s->sm_clock_max_mhz > 0 && s->sm_clock_mhz < 0.8 * s->sm_clock_max_mhz;
}

static void throttle_advice(gpc_doctor *d, const gpc_nvml_sample *s) {
    uint64_t bits = (uint64_t)s->throttle_reasons;
    if (bits & (GPC_NVML_THROTTLE_SW_THERMAL | GPC_NVML_THROTTLE_HW_THERMAL))
        advice(d,
               "GPU %d is hot (%d C, slows down at %d C): check fans, airflow and the room; "
               "spread jobs over GPUs",
               s->index, s->temperature_c, s->slowdown_temperature_c);
    if (bits & (GPC_NVML_THROTTLE_SW_POWER_CAP | GPC_NVML_THROTTLE_HW_POWER_BRAKE))
        advice(d,
               "GPU %d is held by power (%.0f W of a %.0f W limit, SM clock %d of %d MHz): check "
               "the limit with nvidia-smi -q -d POWER and the server's power supply",
               s->index, s->power_w, s->power_limit_w, s->sm_clock_mhz, s->sm_clock_max_mhz);
    if (bits & GPC_NVML_THROTTLE_HW_SLOWDOWN)
        advice(d,
               "GPU %d reports hardware slowdown (heat or power supply): see nvidia-smi -q -d "
               "PERFORMANCE and the server's event log",
               s->index);
}

static double pcie_lane_gbps(int gen) {
    /* GB/s per lane each way after encoding (PCI-SIG): 8b/10b for gen 1-2,
     * 128b/130b from gen 3. */
    static const double rate[] = {0, 0.25, 0.5, 0.985, 1.969, 3.938, 7.563};
    return gen >= 1 && gen <= 6 ? rate[gen] : 0;
}

static void check_gpu_sample(gpc_doctor *d, const gpc_nvml_sample *s) {
    char human[32], human2[32], reasons[160];
    finding(d, GPC_DOCTOR_OK, "GPU %d: %s, %s used of %s, %d C, %.0f W, SM %d/%d MHz, PCI %s",
            s->index, s->name, gpc_format_bytes((double)s->memory_used, human, sizeof human),
            gpc_format_bytes((double)s->memory_total, human2, sizeof human2), s->temperature_c,
            s->power_w, s->sm_clock_mhz, s->sm_clock_max_mhz, s->pci_bus_id);
    if (s->pcie_width > 0 && s->pcie_width_max > 0 && s->pcie_width < s->pcie_width_max) {
        finding(d, GPC_DOCTOR_PROBLEM, "GPU %d: PCIe link x%d of x%d (gen %d of %d)", s->index,
                s->pcie_width, s->pcie_width_max, s->pcie_gen, s->pcie_gen_max);
        advice(d,
               "the card runs on fewer lanes than it can: reseat it or move it to a full x%d "
               "slot; host copies get %.0f GB/s instead of %.0f",
               s->pcie_width_max, s->pcie_width * pcie_lane_gbps(s->pcie_gen_max),
               s->pcie_width_max * pcie_lane_gbps(s->pcie_gen_max));
    } else if (s->pcie_gen > 0 && s->pcie_gen < s->pcie_gen_max) {
        finding(d, GPC_DOCTOR_INFO,
                "GPU %d: PCIe gen %d x%d now, gen %d x%d at most (the link slows down when "
                "idle; under load it should reach gen %d)",
                s->index, s->pcie_gen, s->pcie_width, s->pcie_gen_max, s->pcie_width_max,
                s->pcie_gen_max);
    } else if (s->pcie_gen > 0) {
        finding(d, GPC_DOCTOR_OK, "GPU %d: PCIe gen %d x%d (the maximum)", s->index, s->pcie_gen,
                s->pcie_width);
    }
    if (throttled(s)) {
        finding(d, GPC_DOCTOR_PROBLEM, "GPU %d: clocks held back: %s", s->index,
                throttle_text(s->throttle_reasons, reasons, sizeof reasons));
        throttle_advice(d, s);
    } else {
        finding(d, GPC_DOCTOR_OK, "GPU %d: throttle reasons: %s", s->index,
                throttle_text(s->throttle_reasons, reasons, sizeof reasons));
    }
    if (s->slowdown_temperature_c > 0 && s->temperature_c >= s->slowdown_temperature_c - 5) {
        finding(d, GPC_DOCTOR_PROBLEM, "GPU %d: %d C, within 5 C of its slowdown temperature %d C",
                s->index, s->temperature_c, s->slowdown_temperature_c);
        advice(d, "check fans and airflow before the GPU starts to slow itself down");
    }
    if (s->ecc_uncorrected > 0) {
        finding(d, GPC_DOCTOR_PROBLEM,
                "GPU %d: %lld uncorrected ECC errors since the driver loaded", s->index,
                (long long)s->ecc_uncorrected);
        advice(d, "results on this GPU may be wrong: drain it, reset it (nvidia-smi -r) and, if "
                  "errors return, have it replaced");
    }
    if (s->xid_count > 0) {
        finding(d, GPC_DOCTOR_PROBLEM, "GPU %d: %lld XID errors (last XID %lld)", s->index,
                (long long)s->xid_count, (long long)s->last_xid);
        advice(d, "look the XID up in NVIDIA's XID catalogue; 48, 63, 64, 74, 79 and 94/95 mean "
                  "hardware trouble");
    }
}

/* The expected per-GPU rate between GPU 0 and 1 for an all-reduce: NVLink
 * 25 GB/s per link each way (NVLink 2 to 4), else PCIe at the GPU's maximum
 * generation and width. */
static double expected_link_gbps(gpu_state *g, const char **what) {
    gpc_nvml_link link;
    gpc_nvml_sample s;
    if (gpc_nvml_topology(g->nvml, 0, 1, &link) == GPC_OK && link.nvlink && link.nvlink_links > 0) {
        *what = "NVLink";
        return 25.0 * link.nvlink_links;
    }
    *what = "PCIe";
    if (gpc_nvml_sample_device(g->nvml, 0, &s) == GPC_OK && s.pcie_width_max > 0)
        return pcie_lane_gbps(s.pcie_gen_max) * s.pcie_width_max;
    return 0;
}

static void check_allreduce(gpc_doctor *d, gpu_state *g, int nccl_ok) {
    if (g->count < 2) return;
    if (!nccl_ok) {
        finding(d, GPC_DOCTOR_INFO, "all-reduce test not run: NCCL is not installed");
        return;
    }
    int cuda_count = gpc_bench_cuda_device_count();
    if (cuda_count < 2) {
        finding(d, GPC_DOCTOR_INFO, "all-reduce test not run: %s",
                cuda_count == 0 ? gpc_last_error() : "CUDA sees one GPU");
        return;
    }
    int gpus = cuda_count < g->count ? cuda_count : g->count;
    size_t bytes = 256u << 20;
    double seconds = 0;
    if (gpc_bench_cuda_allreduce(gpus, bytes, 5, &seconds) != GPC_OK) {
        finding(d, GPC_DOCTOR_PROBLEM, "NCCL all-reduce over %d GPUs failed: %s", gpus,
                gpc_last_error());
        advice(d, "run with NCCL_DEBUG=INFO to see why; check that the GPUs can reach each other "
                  "(nvidia-smi topo -m)");
        return;
    }
    /* nccl-tests' bus bandwidth: what each link carried */
    double busbw = bytes / seconds / 1e9 * 2.0 * (gpus - 1) / gpus;
    const char *what = "link";
    double expected = expected_link_gbps(g, &what);
    if (expected > 0 && busbw < 0.5 * expected) {
        finding(d, GPC_DOCTOR_PROBLEM,
                "NCCL all-reduce of 256 MiB over %d GPUs: bus bandwidth %.1f GB/s, under half "
                "of what %s should give (%.0f GB/s)",
                gpus, busbw, what, expected);
        advice(d, "check nvidia-smi topo -m (GPUs across CPU sockets go through the CPU "
                  "interconnect), that NCCL_P2P_DISABLE is not set, and that PCIe ACS is off on "
                  "the switches; NCCL_DEBUG=INFO shows the transport chosen");
    } else {
        finding(d, GPC_DOCTOR_OK,
                "NCCL all-reduce of 256 MiB over %d GPUs: bus bandwidth %.1f GB/s (%s "
                "should give about %.0f)",
                gpus, busbw, what, expected);
    }
}

/* cuDNN's fused attention: the faster attention path on Hopper (1.77x gpc's
 * kernels at the GPT-2 shape on an H200), so its absence is worth a line. */
static void check_cudnn(gpc_doctor *d) {
    int built = 0;
    long v = 0;
    gpc_status st = gpc_bench_cudnn_version(&built, &v);
    if (!built) {
        finding(d, GPC_DOCTOR_INFO,
                "cuDNN: this gpc was built without cudnn.h; attention runs on gpc's own kernels");
        advice(d, "install cuDNN 9's headers (or set CUDNN_INCLUDE_DIR) and rebuild for the "
                  "faster attention path on Hopper GPUs");
        return;
    }
    if (st != GPC_OK) {
        finding(d, GPC_DOCTOR_INFO, "cuDNN: %s; attention runs on gpc's own kernels",
                gpc_last_error());
        return;
    }
    finding(d, GPC_DOCTOR_OK,
            "cuDNN %ld.%ld.%ld: fused attention available (--attention auto uses it on "
            "Hopper and newer)",
            v / 10000, v % 10000 / 100, v % 100);
}

static void check_gpu_stack(gpc_doctor *d, gpu_state *g) {
    int driver = 0, runtime = 0;
    gpc_status cuda = gpc_bench_cuda_versions(&driver, &runtime);
    char cuda_why[512] = "";
    if (cuda) snprintf(cuda_why, sizeof cuda_why, "%s", gpc_last_error());

    gpc_status st = gpc_nvml_open(&g->nvml);
    if (st == GPC_OK) {
        g->count = gpc_nvml_device_count(g->nvml);
        finding(d, GPC_DOCTOR_OK, "NVIDIA driver %s (NVML), %d GPU%s",
                gpc_nvml_driver_version(g->nvml), g->count, g->count == 1 ? "" : "s");
    } else {
        finding(d, GPC_DOCTOR_INFO, "no GPU: %s; gpc runs on the CPU here", gpc_last_error());
    }
    if (cuda)
        finding(d, GPC_DOCTOR_INFO, "CUDA: %s", cuda_why);
    else if (driver == 0 && g->count > 0)
        finding(d, GPC_DOCTOR_PROBLEM, "CUDA runtime %d.%d but the CUDA driver API did not answer",
                runtime / 1000, runtime % 1000 / 10);
    else if (driver && driver < runtime) {
        finding(d, GPC_DOCTOR_PROBLEM,
                "CUDA runtime %d.%d is newer than the driver supports (CUDA %d.%d)", runtime / 1000,
                runtime % 1000 / 10, driver / 1000, driver % 1000 / 10);
        advice(d, "update the NVIDIA driver, or build gpc with a CUDA toolkit no newer than %d.%d",
               driver / 1000, driver % 1000 / 10);
    } else if (driver)
        finding(d, GPC_DOCTOR_OK, "CUDA runtime %d.%d, driver supports CUDA %d.%d", runtime / 1000,
                runtime % 1000 / 10, driver / 1000, driver % 1000 / 10);
    else
        finding(d, GPC_DOCTOR_INFO, "CUDA runtime %d.%d built in; no CUDA driver on this machine",
                runtime / 1000, runtime % 1000 / 10);

    int nccl = 0;
    int nccl_ok = gpc_bench_nccl_version(&nccl) == GPC_OK;
    if (nccl_ok)
        finding(d, GPC_DOCTOR_OK, "NCCL %d.%d.%d", nccl / 10000, nccl % 10000 / 100, nccl % 100);
    else
        finding(d, g->count >= 2 ? GPC_DOCTOR_PROBLEM : GPC_DOCTOR_INFO, "NCCL: %s",
                gpc_last_error());
    if (!cuda && g->count > 0) check_cudnn(d);

    for (int i = 0; i < g->count; i++) {
        gpc_nvml_sample s;
        if (gpc_nvml_sample_device(g->nvml, i, &s) != GPC_OK) {
            finding(d, GPC_DOCTOR_PROBLEM, "GPU %d: %s", i, gpc_last_error());
            advice(d, "check nvidia-smi; a GPU that NVML cannot read may have fallen off the bus");
            continue;
        }
        check_gpu_sample(d, &s);
    }
    check_allreduce(d, g, nccl_ok);
}

/* ------------------------------------------------------------- watching */

/* CPU ticks (user + system) of a process, and its parent, from /proc. */
static int proc_stat(int pid, long long *ticks, int *ppid, int *threads, char *comm,
                     size_t comm_size) {
    char path[64], buf[2048];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    /* comm is in parentheses and may hold spaces: parse after the last ')' */
    char *open = strchr(buf, '('), *close = strrchr(buf, ')');
    if (!open || !close) return -1;
    if (comm) snprintf(comm, comm_size, "%.*s", (int)(close - open - 1), open + 1);
    char state;
    int parent;
    unsigned long utime, stime;
    long nthreads;
    if (sscanf(close + 2, "%c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu %*d %*d %*d %*d %ld",
               &state, &parent, &utime, &stime, &nthreads) != 5)
        return -1;
    if (ticks) *ticks = (long long)(utime + stime);
    if (ppid) *ppid = parent;
    if (threads) *threads = (int)nthreads;
    return 0;
}

/* Ticks of a process and all its descendants (a gpcd job's supervisor
 * starts the trainer as a child). */
static long long tree_ticks(int root, int *nthreads) {
    long long total = 0;
    int pids[4096], parents[4096], count = 0;
    DIR *dir = opendir("/proc");
    if (!dir) return -1;
    struct dirent *e;
    long long ticks[4096];
    int threads[4096];
    while ((e = readdir(dir)) && count < 4096) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        int pid = atoi(e->d_name);
        if (proc_stat(pid, &ticks[count], &parents[count], &threads[count], NULL, 0) == 0)
            pids[count++] = pid;
    }
    closedir(dir);
    /* mark descendants: repeat until nothing new joins */
    char in[4096] = {0};
    int changed = 1;
    while (changed) {
        changed = 0;
        for (int i = 0; i < count; i++) {
            if (in[i]) continue;
            int join = pids[i] == root;
            for (int j = 0; j < count && !join; j++)
                join = in[j] && pids[j] == parents[i];
            if (join) in[i] = changed = 1;
        }
    }
    *nthreads = 0;
    for (int i = 0; i < count; i++)
        if (in[i]) {
            total += ticks[i];
            *nthreads += threads[i];
        }
    return total;
}

/* The GPUs a process may use: its CUDA_VISIBLE_DEVICES (indices), else all. */
static int process_gpus(int pid, int count, int *gpus) {
    char path[64], buf[65536];
    snprintf(path, sizeof path, "/proc/%d/environ", pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    for (size_t i = 0; i < n; i += strlen(buf + i) + 1) {
        if (strncmp(buf + i, "CUDA_VISIBLE_DEVICES=", 21)) continue;
        int used = 0;
        for (char *p = buf + i + 21; *p;) {
            char *end;
            long g = strtol(p, &end, 10);
            if (end == p) break; /* UUIDs: fall back to every GPU */
            if (g >= 0 && g < count) gpus[used++] = (int)g;
            p = *end == ',' ? end + 1 : end;
            if (end == p) break;
        }
        if (used) return used;
    }
    for (int i = 0; i < count; i++)
        gpus[i] = i;
    return count;
}

static double rss_of(int pid) {
    char path[64];
    long pages = 0, resident = 0;
    snprintf(path, sizeof path, "/proc/%d/statm", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    fclose(f);
    return (double)resident * (double)sysconf(_SC_PAGESIZE);
}

static int uses_cuda(int pid) {
    char path[64], line[1024];
    snprintf(path, sizeof path, "/proc/%d/maps", pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, "libcuda.so") != NULL;
    fclose(f);
    return found;
}

/* CPU ticks of every thread of the process tree under root, by thread id:
 * the busiest thread tells a saturated launch loop from spread-out work. */
typedef struct {
    int tid[2048];
    long long ticks[2048];
    int count;
} thread_ticks;

static void read_thread_ticks(int root, thread_ticks *out) {
    out->count = 0;
    DIR *dir = opendir("/proc");
    if (!dir) return;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        int pid = atoi(e->d_name), up = pid;
        for (int hops = 0; hops < 64 && up > 1 && up != root; hops++)
            if (proc_stat(up, NULL, &up, NULL, NULL, 0) != 0) up = 0;
        if (up != root) continue;
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/task", pid);
        DIR *tasks = opendir(path);
        struct dirent *t;
        while (tasks && (t = readdir(tasks)) && out->count < 2048) {
            if (!isdigit((unsigned char)t->d_name[0])) continue;
            char stat[320], buf[1024];
            snprintf(stat, sizeof stat, "/proc/%d/task/%s/stat", pid, t->d_name);
            FILE *f = fopen(stat, "r");
            size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
            if (f) fclose(f);
            buf[n] = 0;
            const char *close = strrchr(buf, ')');
            unsigned long utime, stime;
            if (!close || sscanf(close + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
                                 &utime, &stime) != 2)
                continue;
            out->tid[out->count] = atoi(t->d_name);
            out->ticks[out->count++] = (long long)(utime + stime);
        }
        if (tasks) closedir(tasks);
    }
    closedir(dir);
}

/* The busiest thread between two readings, % of one core. */
static double busiest_thread(const thread_ticks *before, const thread_ticks *after,
                             double seconds) {
    long long most = 0;
    for (int i = 0; i < after->count; i++)
        for (int j = 0; j < before->count; j++)
            if (before->tid[j] == after->tid[i] && after->ticks[i] - before->ticks[j] > most)
                most = after->ticks[i] - before->ticks[j];
    return seconds > 0 ? 100.0 * (double)most / (double)sysconf(_SC_CLK_TCK) / seconds : -1;
}

/* One interval of GPU gi as the classifier reads it. */
static void diag_sample_gpu(gpc_nvml *nvml, int gi, const gpc_nvml_sample *s, double t, double cpu,
                            double top, gpc_diag_sample *out) {
    gpc_diag_sample_clear(out);
    out->t = t;
    out->util = s->utilization_gpu;
    out->memory_frac = s->memory_total ? (double)s->memory_used / (double)s->memory_total : -1;
    out->temperature_c = s->temperature_c;
    if (s->throttle_reasons >= 0) {
        uint64_t bits = (uint64_t)s->throttle_reasons;
        out->power_capped =
            throttled(s) &&
            (bits & (GPC_NVML_THROTTLE_SW_POWER_CAP | GPC_NVML_THROTTLE_HW_POWER_BRAKE));
        out->thermal_capped =
            (bits & (GPC_NVML_THROTTLE_SW_THERMAL | GPC_NVML_THROTTLE_HW_THERMAL)) != 0;
    }
    out->cpu_process = cpu;
    out->cpu_top_thread = top;
    gpc_nvml_activity a;
    if (gpc_nvml_sample_activity(nvml, gi, &a) == GPC_OK) {
        out->sm_active = a.sm_active;
        out->sm_occupancy = a.sm_occupancy;
        out->tensor_active = a.tensor_active;
        out->dram_bw = a.dram_bw;
        out->pcie_rx_mbs = a.pcie_rx_mbs;
        out->pcie_tx_mbs = a.pcie_tx_mbs;
    }
}

/* The classifier's findings for GPU gi (-1: the process on the CPU): the
 * cause of low use and communication (memory, power and heat have their
 * own lines above). */
static void diag_report_gpu(gpc_doctor *d, int gi, const gpc_diag_sample *samples, int n) {
    gpc_diag_finding found[GPC_DIAG_KIND_COUNT];
    int count = gpc_diagnose(samples, n, found, GPC_DIAG_KIND_COUNT);
    char label[32] = "";
    if (gi >= 0) snprintf(label, sizeof label, "GPU %d: ", gi);
    for (int i = 0; i < count; i++) {
        gpc_diag_kind k = found[i].kind;
        if (k == GPC_DIAG_MEMORY_FULL || k == GPC_DIAG_POWER_CAPPED || k == GPC_DIAG_THERMAL)
            continue;
        d->cause = gpc_diag_kind_name(k);
        d->source = &found[i];
        finding(d, GPC_DOCTOR_PROBLEM, "%s%s", label, found[i].text);
        advice(d, "%s", found[i].remedy);
        d->cause = NULL;
        d->source = NULL;
    }
}

/* The run folder of a gpc train process: its command line's --out DIR (or
 * --out=DIR), relative to its working directory, when it holds
 * metrics.jsonl. 0 and "" when the process is no gpc train or names none. */
static int process_run_dir(int pid, char *out, size_t size) {
    char path[64], args[8192];
    out[0] = 0;
    snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(args, 1, sizeof args - 1, f);
    fclose(f);
    args[n] = 0;
    const char *dir = NULL;
    int train = 0;
    /* the arguments are NUL-separated */
    for (const char *a = args; a < args + n; a += strlen(a) + 1) {
        train |= !strcmp(a, "train");
        const char *next = a + strlen(a) + 1;
        if (!strcmp(a, "--out") && next < args + n)
            dir = next;
        else if (!strncmp(a, "--out=", 6))
            dir = a + 6;
    }
    if (!train || !dir || !*dir) return 0;
    if (dir[0] == '/') {
        snprintf(out, size, "%s", dir);
    } else {
        char cwd[4096];
        snprintf(path, sizeof path, "/proc/%d/cwd", pid);
        ssize_t len = readlink(path, cwd, sizeof cwd - 1);
        if (len <= 0) return 0;
        cwd[len] = 0;
        int written = snprintf(out, size, "%s/%s", cwd, dir);
        if (written < 0 || (size_t)written >= size) return 0;
    }
    char metrics[4200];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", out);
    if (!gpc_path_exists(metrics)) {
        out[0] = 0;
        return 0;
    }
    return 1;
}

/* The steps of a watched gpc train process whose input wait counts: about
 * the watch's span at the pace of short steps. */
#define WATCH_RUN_STEPS 20

/* A watched gpc train process's input wait from its run folder's metrics,
 * with a line saying so: *share and *ms, -1 when unknown. */
static void watch_input_wait(gpc_doctor *d, int pid, double *share, double *ms) {
    char run[4096];
    *share = *ms = -1;
    if (!process_run_dir(pid, run, sizeof run)) return;
    if (gpc_diag_run_input_wait(run, WATCH_RUN_STEPS, share, ms) != GPC_OK || *share < 0) {
        finding(d, GPC_DOCTOR_INFO, "its run folder %s records no input wait yet", run);
        return;
    }
    finding(d, GPC_DOCTOR_INFO,
            "its run folder %s: the step waits %.0f%% of its time (%.1f ms) for its input "
            "batches (median of the last %d steps)",
            run, 100 * *share, *ms, WATCH_RUN_STEPS);
}

static gpc_status watch(gpc_doctor *d, gpu_state *g, int pid, const int *job_gpus, int njob_gpus,
                        double seconds) {
    char comm[64] = "?", human[32], human2[32];
    if (kill(pid, 0) != 0 && proc_stat(pid, NULL, NULL, NULL, NULL, 0) != 0)
        return gpc_error(GPC_ERR_INVALID_ARG, "no process with pid %d (is it still running?)", pid);
    proc_stat(pid, NULL, NULL, NULL, comm, sizeof comm);
    finding(d, GPC_DOCTOR_SECTION, "watching process %d (%s) for %.0f s", pid, comm, seconds);

    int gpus[64], ngpus = 0;
    if (g->count > 0) {
        if (njob_gpus > 0) {
            for (int i = 0; i < njob_gpus && i < 64; i++)
                if (job_gpus[i] >= 0 && job_gpus[i] < g->count) gpus[ngpus++] = job_gpus[i];
        } else {
            ngpus = process_gpus(pid, g->count < 64 ? g->count : 64, gpus);
        }
    }
    double util_sum[64] = {0}, util_min[64], util_max[64] = {0}, mem_max[64] = {0};
    uint64_t total_mem[64] = {0};
    int throttles[64] = {0}, samples = 0;
    gpc_nvml_sample worst[64];
    for (int i = 0; i < 64; i++)
        util_min[i] = 101;
    long hz = sysconf(_SC_CLK_TCK);
    int threads = 0;
    long long t_start = tree_ticks(pid, &threads);
    double w_start = gpc_time_seconds(), step = 0.25;
    /* the classifier's trace: per GPU, one sample per interval */
    int cap = (int)(seconds / step) + 8;
    gpc_diag_sample *trace = ngpus ? malloc((size_t)ngpus * (size_t)cap * sizeof *trace) : NULL;
    for (int i = 0; trace && i < ngpus * cap; i++)
        gpc_diag_sample_clear(&trace[i]);
    thread_ticks *tt = malloc(2 * sizeof *tt);
    if (tt) read_thread_ticks(pid, &tt[0]);
    long long t_last = t_start;
    double w_last = w_start;
    while (gpc_time_seconds() - w_start < seconds) {
        usleep((useconds_t)(step * 1e6));
        double w_now = gpc_time_seconds(), top = -1, cpu_now = -1;
        long long t_now = trace ? tree_ticks(pid, &threads) : -1;
        if (trace && t_now >= t_last && w_now > w_last)
            cpu_now = 100.0 * (double)(t_now - t_last) / hz / (w_now - w_last);
        if (trace && tt) {
            read_thread_ticks(pid, &tt[1]);
            top = busiest_thread(&tt[0], &tt[1], w_now - w_last);
            tt[0] = tt[1];
        }
        t_last = t_now;
        w_last = w_now;
        for (int k = 0; k < ngpus; k++) {
            gpc_nvml_sample s;
            if (gpc_nvml_sample_device(g->nvml, gpus[k], &s) != GPC_OK) continue;
            util_sum[k] += s.utilization_gpu;
            if (s.utilization_gpu < util_min[k]) util_min[k] = s.utilization_gpu;
            if (s.utilization_gpu > util_max[k]) util_max[k] = s.utilization_gpu;
            if ((double)s.memory_used > mem_max[k]) mem_max[k] = (double)s.memory_used;
            if (trace && samples < cap)
                diag_sample_gpu(g->nvml, gpus[k], &s, w_now - w_start, cpu_now, top,
                                &trace[k * cap + samples]);
            total_mem[k] = s.memory_total;
            if (throttled(&s)) {
                throttles[k]++;
                worst[k] = s;
            }
        }
        samples++;
    }
    double elapsed = gpc_time_seconds() - w_start;
    long long t_end = tree_ticks(pid, &threads);
    if (proc_stat(pid, NULL, NULL, NULL, NULL, 0) != 0) {
        free(trace);
        free(tt);
        finding(d, GPC_DOCTOR_PROBLEM, "process %d ended while it was watched", pid);
        advice(d, "look at its log for the error (gpc logs ID for a gpcd job)");
        return GPC_OK;
    }
    /* 100% = one core busy all the time */
    double cpu = t_end >= t_start ? 100.0 * (double)(t_end - t_start) / hz / elapsed : 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    finding(d, GPC_DOCTOR_INFO,
            "process %d: CPU %.0f%% (100%% = one core; %ld cores), %d threads, "
            "resident %s",
            pid, cpu, cores, threads, gpc_format_bytes(rss_of(pid), human, sizeof human));

    free(tt);
    /* a gpc train process measures its own wait for input: the classifier
     * takes it over what utilisation suggests */
    double wait, wait_ms;
    watch_input_wait(d, pid, &wait, &wait_ms);
    for (int i = 0; trace && i < ngpus * cap; i++) {
        trace[i].input_wait = wait;
        trace[i].input_wait_ms = wait_ms;
    }
    int on_gpu = uses_cuda(pid);
    if (g->count == 0 || on_gpu == 0) {
        if (g->count == 0)
            finding(d, GPC_DOCTOR_INFO, "no GPU to watch: the process runs on the CPU");
        else
            finding(d, GPC_DOCTOR_INFO,
                    "process %d has not loaded the CUDA driver: it runs on the CPU", pid);
        if (cpu < 50.0 * cores / 2 && cores > 1 && threads >= cores)
            finding(d, GPC_DOCTOR_INFO,
                    "it keeps %.1f of %ld cores busy: I/O, locks or a serial part "
                    "limit it",
                    cpu / 100, cores);
        if (wait >= 0) {
            gpc_diag_sample only;
            gpc_diag_sample_clear(&only);
            only.input_wait = wait;
            only.input_wait_ms = wait_ms;
            diag_report_gpu(d, -1, &only, 1);
        }
        free(trace);
        return GPC_OK;
    }
    for (int k = 0; k < ngpus; k++) {
        int gi = gpus[k];
        double util = samples ? util_sum[k] / samples : 0;
        double mem_frac = total_mem[k] ? mem_max[k] / (double)total_mem[k] : 0;
        finding(d, GPC_DOCTOR_INFO,
                "GPU %d: utilisation %.0f%% (min %.0f, max %.0f), memory up to %s of %s", gi, util,
                util_min[k] > 100 ? 0 : util_min[k], util_max[k],
                gpc_format_bytes(mem_max[k], human, sizeof human),
                gpc_format_bytes((double)total_mem[k], human2, sizeof human2));
        if (mem_frac > 0.92) {
            finding(d, GPC_DOCTOR_PROBLEM, "GPU %d: memory %.0f%% full: near out of memory", gi,
                    100 * mem_frac);
            advice(d, "lower the micro-batch (--batch) and keep the step size with --total-batch "
                      "(gradient accumulation); --recompute 1 or 2 trades compute for activation "
                      "memory; 'gpc plan --model dN --batch B' shows what fits");
        }
        if (trace) diag_report_gpu(d, gi, &trace[k * cap], samples < cap ? samples : cap);
        if (util < 60 && !trace) {
            finding(d, GPC_DOCTOR_PROBLEM, "GPU %d: low utilisation, %.0f%% on average", gi, util);
            if (cpu >= 90)
                advice(d,
                       "the process keeps a core busy (CPU %.0f%%) while the GPU waits: it is "
                       "CPU bound: tokenise ahead of time (gpc data prepare), use more loader "
                       "threads, pinned buffers, and keep Python/host work out of the step",
                       cpu);
            else if (util_max[k] - (util_min[k] > 100 ? 0 : util_min[k]) > 50)
                advice(d,
                       "utilisation swings between %.0f%% and %.0f%%: the GPU idles while the "
                       "host waits on it; avoid reading values back every step (log every N "
                       "steps), cudaDeviceSynchronize, and synchronous checkpoints",
                       util_min[k] > 100 ? 0 : util_min[k], util_max[k]);
            else
                advice(d, "steady low utilisation with an idle CPU: the kernels are too small "
                          "to fill the GPU; raise the micro-batch or context, fuse small "
                          "operations, or capture the step in a CUDA graph");
        }
        if (throttles[k]) {
            char reasons[160];
            finding(d, GPC_DOCTOR_PROBLEM, "GPU %d: throttled in %d of %d samples (%s)", gi,
                    throttles[k], samples,
                    throttle_text(worst[k].throttle_reasons, reasons, sizeof reasons));
            throttle_advice(d, &worst[k]);
        }
    }
    free(trace);
    return GPC_OK;
}

/* ----------------------------------------------------------- the API */

const char *gpc_doctor_kind_name(gpc_doctor_kind kind) {
    static const char *names[] = {"ok", "info", "PROBLEM", "advice", "section"};
    return (unsigned)kind < sizeof names / sizeof names[0] ? names[kind] : "?";
}

gpc_status gpc_doctor_open(gpc_doctor_sink sink, void *user, gpc_doctor **out) {
    gpc_doctor *d = calloc(1, sizeof *d);
    if (!d) return gpc_error(GPC_ERR_NOMEM, "out of memory starting the diagnosis");
    d->sink = sink;
    d->user = user;
    *out = d;
    return GPC_OK;
}

void gpc_doctor_close(gpc_doctor *d) {
    if (!d) return;
    if (d->gpu.nvml) gpc_nvml_close(d->gpu.nvml);
    free(d->records);
    free(d);
}

void gpc_doctor_check_machine(gpc_doctor *d) {
    check_host(d);
    check_gpu_stack(d, &d->gpu);
    d->gpu_opened = 1;
}

int gpc_doctor_process_exists(int pid) {
    return pid > 0 && (kill(pid, 0) == 0 || proc_stat(pid, NULL, NULL, NULL, NULL, 0) == 0);
}

gpc_status gpc_doctor_watch(gpc_doctor *d, int pid, const int *gpus, int ngpus, double seconds) {
    if (!(seconds > 0 && seconds <= 3600))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "watching for %g s is out of range: use more than 0 and at most 3600",
                         seconds);
    if (!d->gpu_opened) {
        /* watched without the machine's checks: the GPUs quietly, if any */
        if (gpc_nvml_open(&d->gpu.nvml) == GPC_OK)
            d->gpu.count = gpc_nvml_device_count(d->gpu.nvml);
        d->gpu_opened = 1;
    }
    return watch(d, &d->gpu, pid, gpus, gpus ? ngpus : 0, seconds);
}

int gpc_doctor_problems(const gpc_doctor *d) {
    return d->problems;
}

/* ------------------------------------------------------ post-mortem, JSON */

gpc_status gpc_doctor_run(gpc_doctor *d, const char *run, const char *log_path) {
    gpc_diag_finding found[2 * GPC_DIAG_KIND_COUNT];
    gpc_diag_run_summary sum;
    int count = 0;
    GPC_TRY(gpc_diag_run(run, log_path, &sum, found, 2 * GPC_DIAG_KIND_COUNT, &count));
    finding(d, GPC_DOCTOR_SECTION, "run %s: %d step%s", run, sum.steps, sum.steps == 1 ? "" : "s");
    if (sum.mfu >= 0)
        finding(d, GPC_DOCTOR_INFO,
                "throughput: %.3g TFLOP/s achieved (6N + 6LCT per token), MFU %.1f%% of %s's "
                "%.0f TFLOP/s",
                sum.achieved_flops / 1e12, 100 * sum.mfu,
                sum.gpu_name[0] ? sum.gpu_name : "the GPU", sum.peak_flops / 1e12);
    else if (sum.steps > 0)
        finding(d, GPC_DOCTOR_INFO, "MFU not known: %s", sum.peak_note);
    for (int i = 0; i < count; i++) {
        d->cause = gpc_diag_kind_name(found[i].kind);
        d->source = &found[i];
        finding(d, GPC_DOCTOR_PROBLEM, "%s", found[i].text);
        advice(d, "%s", found[i].remedy);
        d->cause = NULL;
        d->source = NULL;
    }
    if (!sum.out_of_memory)
        finding(d, GPC_DOCTOR_OK, "no out-of-memory error in its log%s",
                count ? "" : ", and its metrics show no cause of slowness");
    return GPC_OK;
}

gpc_status gpc_doctor_write_json(const gpc_doctor *d, const char *path) {
    int to_stdout = !strcmp(path, "-");
    FILE *f = to_stdout ? stdout : fopen(path, "w");
    if (!f)
        return gpc_error(GPC_ERR_IO, "cannot write %s: check the folder exists and is writable",
                         path);
    static const char *kinds[] = {"ok", "info", "problem", "advice", "section"};
    fprintf(f, "{\"problems\": %d, \"findings\": [", d->problems);
    int open_finding = 0, first = 1;
    for (int i = 0; i < d->nrecords; i++) {
        const struct doctor_record *r = &d->records[i];
        if (r->kind == GPC_DOCTOR_ADVICE && open_finding) {
            fputs(open_finding == 1 ? ", \"advice\": [" : ", ", f);
            json_string_out(f, r->text);
            open_finding = 2;
            continue;
        }
        if (open_finding) fputs(open_finding == 2 ? "]}" : "}", f);
        fprintf(f, "%s\n  {\"kind\": \"%s\", \"text\": ", first ? "" : ",",
                (unsigned)r->kind < 5 ? kinds[r->kind] : "?");
        json_string_out(f, r->text);
        if (r->cause[0]) fprintf(f, ", \"cause\": \"%s\"", r->cause);
        for (int k = 0; k < r->nfigures; k++)
            fprintf(f, "%s\"%s\": %.6g%s", k ? ", " : ", \"figures\": {", r->figures[k].name,
                    r->figures[k].value, k == r->nfigures - 1 ? "}" : "");
        open_finding = 1;
        first = 0;
    }
    if (open_finding) fputs(open_finding == 2 ? "]}" : "}", f);
    fputs("\n]}\n", f);
    int failed = ferror(f);
    if (!to_stdout)
        failed |= fclose(f) != 0;
    else
        fflush(f);
    return failed ? gpc_error(GPC_ERR_IO, "writing %s failed (disk full?)", path) : GPC_OK;
}
