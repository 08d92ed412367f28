/*
 * monitor.c: reads every GPU once per sample_interval and raises alerts.
 *
 * Two providers give the same readings. "nvml" reads the driver through
 * gpc_nvml (src/core/nvml.c); "simulated:COUNTxMEMORY" makes GPUs up from
 * the jobs gpcd placed on them, for CI and trace studies, optionally steered
 * by simulated_file (lines "GPU KEY VALUE") to play out low utilisation,
 * heat or memory pressure. The simulated provider is only ever chosen in the
 * config: when NVML is asked for and there is no driver, gpcd stops with an
 * error instead of pretending.
 *
 * Alerts (thresholds from the config): a busy GPU under alert_util_below
 * percent for alert_util_window ("likely input-bound"), memory above
 * alert_mem_above percent, temperature above alert_temp_above or within
 * alert_slowdown_margin of the GPU's own slowdown threshold, and
 * uncorrectable ECC errors or XID events. Each alert opens once, stays
 * active while its condition holds, and closes when it clears; both ends are
 * recorded in the store.
 */
#include "gpc/nvml.h"
#include "gpc/sched.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gpcd_monitor {
    int simulated;
    gpc_nvml *nvml;
    int count;
    uint64_t sim_mem;
    char provider[128];
    double util_below, util_window, mem_above, temp_above, slowdown_margin;
    double retention;
    char sim_file[512];
    gpcd_gpu_reading readings[GPCD_MAX_GPUS];
    int numa[GPCD_MAX_GPUS];
    uint8_t nvlink[GPCD_MAX_GPUS][GPCD_MAX_GPUS];
    double low_since[GPCD_MAX_GPUS];
    /* index into alerts + 1, 0 = none; the last row is for alerts of no
     * GPU (gpu -1: the state filesystem) */
    int active[GPCD_MAX_GPUS + 1][GPCD_ALERT_KIND_COUNT];
    gpcd_alert alerts[(GPCD_MAX_GPUS + 1) * GPCD_ALERT_KIND_COUNT];
    int alert_count;
    gpcd_store *store;
};

const char *gpcd_alert_kind_name(gpcd_alert_kind kind) {
    switch (kind) {
    case GPCD_ALERT_LOW_UTIL:
        return "low_utilization";
    case GPCD_ALERT_MEMORY:
        return "memory";
    case GPCD_ALERT_TEMPERATURE:
        return "temperature";
    case GPCD_ALERT_ECC:
        return "hardware_errors";
    case GPCD_ALERT_STORAGE:
        return "storage";
    case GPCD_ALERT_KIND_COUNT:
        break;
    }
    return "unknown";
}

static gpc_status parse_simulated(const char *spec, int *count, uint64_t *mem) {
    const char *p = spec + strlen("simulated:");
    char *end;
    long n = strtol(p, &end, 10);
    if (end == p || (*end != 'x' && *end != 'X') || n < 1 || n > GPCD_MAX_GPUS)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "gpus = %s: write simulated:COUNTxMEMORY with COUNT 1-%d, e.g. "
                         "simulated:8x141GB",
                         spec, GPCD_MAX_GPUS);
    if (gpcd_bytes_parse(end + 1, mem) != GPC_OK || *mem < (1ull << 20))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "gpus = %s: the memory per GPU must be a size such as 141GB", spec);
    *count = (int)n;
    return GPC_OK;
}

gpc_status gpcd_monitor_open(const char *spec, const gpcd_config *config, gpcd_monitor **out) {
    *out = NULL;
    gpcd_monitor *m = calloc(1, sizeof *m);
    if (!m) return gpc_error(GPC_ERR_NOMEM, "out of memory starting the GPU monitor");
    m->util_below = config->alert_util_below;
    m->util_window = config->alert_util_window;
    m->mem_above = config->alert_mem_above;
    m->temp_above = config->alert_temp_above;
    m->slowdown_margin = config->alert_slowdown_margin;
    m->retention = config->sample_retention;
    snprintf(m->sim_file, sizeof m->sim_file, "%s", config->simulated_file);
    if (strncmp(spec, "simulated:", 10) == 0) {
        gpc_status st = parse_simulated(spec, &m->count, &m->sim_mem);
        if (st != GPC_OK) {
            free(m);
            return st;
        }
        m->simulated = 1;
        snprintf(m->provider, sizeof m->provider, "%s", spec);
        /* An HGX-like box: every pair joined through NVSwitch, the first half
         * of the GPUs on NUMA node 0 and the rest on node 1. */
        for (int i = 0; i < m->count; i++) {
            m->numa[i] = m->count > 1 && i >= m->count / 2 ? 1 : 0;
            for (int j = 0; j < m->count; j++)
                m->nvlink[i][j] = i != j;
        }
    } else if (strcmp(spec, "nvml") == 0) {
        gpc_status st = gpc_nvml_open(&m->nvml);
        if (st != GPC_OK) {
            free(m);
            return gpc_error_context(st, "gpus = nvml: ");
        }
        m->count = gpc_nvml_device_count(m->nvml);
        if (m->count > GPCD_MAX_GPUS) m->count = GPCD_MAX_GPUS;
        if (m->count == 0) {
            gpc_nvml_close(m->nvml);
            free(m);
            return gpc_error(GPC_ERR_UNSUPPORTED,
                             "gpus = nvml: the NVIDIA driver sees no GPU; check nvidia-smi");
        }
        snprintf(m->provider, sizeof m->provider, "nvml (driver %s)",
                 gpc_nvml_driver_version(m->nvml));
        for (int i = 0; i < m->count; i++)
            for (int j = 0; j < m->count; j++) {
                gpc_nvml_link link;
                m->nvlink[i][j] =
                    i != j && gpc_nvml_topology(m->nvml, i, j, &link) == GPC_OK && link.nvlink;
            }
    } else if (strcmp(spec, "none") == 0) {
        /* backend = slurm on a machine without GPUs: nothing to read */
        snprintf(m->provider, sizeof m->provider, "none");
    } else {
        free(m);
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "gpus = '%s' is not a GPU provider: use nvml, or simulated:8x141GB "
                         "for simulated GPUs",
                         spec);
    }
    for (int i = 0; i < m->count; i++) {
        m->readings[i].index = i;
        m->readings[i].numa_node = m->simulated ? m->numa[i] : -1;
    }
    *out = m;
    return GPC_OK;
}

void gpcd_monitor_close(gpcd_monitor *monitor) {
    if (!monitor) return;
    gpc_nvml_close(monitor->nvml);
    free(monitor);
}

/* Simulated GPUs: a process uses GPU g when it carries GPC_JOB_TAG (a gpcd
 * job's) and g is in its CUDA_VISIBLE_DEVICES, as a CUDA program would. */
static int simulated_processes(int gpu, int *pids, int max) {
    DIR *dir = opendir("/proc");
    if (!dir) return -1;
    static char env[65536];
    int n = 0;
    struct dirent *e;
    while (n < max && (e = readdir(dir)) != NULL) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0) continue;
        char path[64];
        snprintf(path, sizeof path, "/proc/%ld/environ", pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t len = fread(env, 1, sizeof env - 1, f);
        fclose(f);
        env[len] = '\0';
        int job = 0, uses = 0;
        for (size_t i = 0; i < len; i += strlen(env + i) + 1) {
            if (strncmp(env + i, "GPC_JOB_TAG=", 12) == 0) job = 1;
            if (strncmp(env + i, "CUDA_VISIBLE_DEVICES=", 21) == 0)
                for (char *p = env + i + 21; *p;) {
                    char *next;
                    long g = strtol(p, &next, 10);
                    if (next == p) break;
                    if (g == gpu) uses = 1;
                    p = *next == ',' ? next + 1 : next;
                }
        }
        if (job && uses) pids[n++] = (int)pid;
    }
    closedir(dir);
    return n;
}

int gpcd_monitor_gpu_processes(gpcd_monitor *monitor, int gpu, int *pids, int max) {
    if (gpu < 0 || gpu >= monitor->count) return -1;
    if (monitor->simulated) return simulated_processes(gpu, pids, max);
    return monitor->nvml ? gpc_nvml_compute_processes(monitor->nvml, gpu, pids, max) : -1;
}

int gpcd_monitor_gpu_count(const gpcd_monitor *monitor) {
    return monitor->count;
}

const char *gpcd_monitor_provider(const gpcd_monitor *monitor) {
    return monitor->provider;
}

void gpcd_monitor_set_store(gpcd_monitor *monitor, gpcd_store *store) {
    monitor->store = store;
}

void gpcd_monitor_topology(const gpcd_monitor *monitor, gpcd_cluster *cluster) {
    cluster->count = monitor->count;
    for (int i = 0; i < monitor->count; i++) {
        gpcd_gpu *gpu = &cluster->gpu[i];
        gpu->index = i;
        gpu->numa_node = monitor->readings[i].numa_node;
        if (monitor->simulated)
            gpu->mem_total = monitor->sim_mem;
        else if (monitor->readings[i].mem_total)
            gpu->mem_total = monitor->readings[i].mem_total;
        for (int j = 0; j < monitor->count; j++)
            cluster->nvlink[i][j] = monitor->nvlink[i][j];
    }
}

/* Applies simulated_file's lines "GPU KEY VALUE" to the readings. */
static void apply_overrides(gpcd_monitor *m) {
    if (!m->sim_file[0]) return;
    FILE *f = fopen(m->sim_file, "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        int gpu;
        char key[32], value[64];
        if (sscanf(line, "%d %31s %63s", &gpu, key, value) != 3) continue;
        if (gpu < 0 || gpu >= m->count) continue;
        gpcd_gpu_reading *r = &m->readings[gpu];
        double v = strtod(value, NULL);
        if (strcmp(key, "util") == 0)
            r->util = v;
        else if (strcmp(key, "temperature") == 0)
            r->temperature = v;
        else if (strcmp(key, "slowdown") == 0)
            r->slowdown_temperature = v;
        else if (strcmp(key, "power") == 0)
            r->power = v;
        else if (strcmp(key, "ecc") == 0)
            r->ecc_uncorrected = (int64_t)v;
        else if (strcmp(key, "xid") == 0)
            r->xid_count = (int64_t)v;
        else if (strcmp(key, "mem_used") == 0) {
            uint64_t bytes;
            if (gpcd_bytes_parse(value, &bytes) == GPC_OK)
                r->mem_used = bytes < r->mem_total ? bytes : r->mem_total;
        }
    }
    fclose(f);
}

static void read_simulated(gpcd_monitor *m, int g, gpcd_gpu_reading *r, gpcd_job *const *running,
                           int nrunning) {
    uint64_t used = 0;
    int busy = 0;
    for (int i = 0; i < nrunning; i++)
        for (int a = 0; a < running[i]->assigned_count; a++)
            if (running[i]->assigned[a] == g) {
                used += running[i]->mem;
                busy = 1;
            }
    snprintf(r->name, sizeof r->name, "Simulated GPU");
    r->mem_total = m->sim_mem;
    r->mem_used = used < m->sim_mem ? used : m->sim_mem;
    r->util = busy ? 97 : 0;
    r->temperature = busy ? 64 : 34;
    r->slowdown_temperature = 90;
    r->power = busy ? 520 : 72;
    r->power_limit = 700;
    r->sm_clock_mhz = busy ? 1980 : 345;
    r->mem_clock_mhz = 2619;
    r->throttle_reasons = busy ? 0 : (int64_t)GPC_NVML_THROTTLE_GPU_IDLE;
    r->ecc_uncorrected = 0;
    r->xid_count = 0;
    r->numa_node = m->numa[g];
}

static gpc_status read_nvml(gpcd_monitor *m, int g, gpcd_gpu_reading *r) {
    gpc_nvml_sample s;
    GPC_TRY(gpc_nvml_sample_device(m->nvml, g, &s));
    snprintf(r->name, sizeof r->name, "%s", s.name);
    r->util = s.utilization_gpu;
    r->mem_used = s.memory_used;
    r->mem_total = s.memory_total;
    r->temperature = s.temperature_c;
    r->slowdown_temperature = s.slowdown_temperature_c;
    r->power = s.power_w;
    r->power_limit = s.power_limit_w;
    r->sm_clock_mhz = s.sm_clock_mhz;
    r->mem_clock_mhz = s.memory_clock_mhz;
    r->throttle_reasons = s.throttle_reasons;
    r->ecc_uncorrected = s.ecc_uncorrected;
    r->xid_count = s.xid_count;
    r->numa_node = s.numa_node;
    return GPC_OK;
}

/* Opens or refreshes (cond true) or closes (false) one alert. */
static int alert_row(int gpu) {
    return gpu < 0 ? GPCD_MAX_GPUS : gpu;
}

static void set_alert(gpcd_monitor *m, int gpu, gpcd_alert_kind kind, int cond, double now,
                      const char *message) {
    int slot = m->active[alert_row(gpu)][kind];
    if (cond && slot) {
        snprintf(m->alerts[slot - 1].message, sizeof m->alerts[0].message, "%s", message);
        return;
    }
    if (cond) {
        gpcd_alert *a = &m->alerts[m->alert_count++];
        memset(a, 0, sizeof *a);
        a->gpu = gpu;
        a->kind = kind;
        a->since = now;
        snprintf(a->message, sizeof a->message, "%s", message);
        if (m->store && gpcd_store_alert_open(m->store, gpu, gpcd_alert_kind_name(kind), message,
                                              now, &a->id) != GPC_OK)
            gpc_log(GPC_LOG_WARN, "%s", gpc_last_error());
        m->active[alert_row(gpu)][kind] = m->alert_count;
        gpc_log(GPC_LOG_WARN, "alert: %s", message);
        return;
    }
    if (!slot) return;
    if (m->store && m->alerts[slot - 1].id)
        gpcd_store_alert_close(m->store, m->alerts[slot - 1].id, now);
    /* keep the array dense: move the last alert into the freed slot */
    int last = m->alert_count - 1;
    if (slot - 1 != last) {
        m->alerts[slot - 1] = m->alerts[last];
        m->active[alert_row(m->alerts[slot - 1].gpu)][m->alerts[slot - 1].kind] = slot;
    }
    m->alert_count--;
    m->active[alert_row(gpu)][kind] = 0;
}

void gpcd_monitor_storage_alert(gpcd_monitor *monitor, int on, const char *message, double now) {
    set_alert(monitor, -1, GPCD_ALERT_STORAGE, on, now, message ? message : "");
}

static void evaluate_alerts(gpcd_monitor *m, int g, double now) {
    const gpcd_gpu_reading *r = &m->readings[g];
    char msg[512];
    const double gib = 1024.0 * 1024 * 1024;

    int low = r->busy && r->util >= 0 && r->util < m->util_below;
    if (!low)
        m->low_since[g] = 0;
    else if (m->low_since[g] == 0)
        m->low_since[g] = now;
    int low_long = low && now - m->low_since[g] >= m->util_window;
    snprintf(msg, sizeof msg,
             "GPU %d at %.0f%% utilization for %.0f s while job %lld runs: likely input-bound: "
             "the GPU waits for data; add loader workers or prefetching, use pinned memory, or "
             "move the data to local disk",
             g, r->util, low ? now - m->low_since[g] : 0.0, (long long)r->busy_job);
    set_alert(m, g, GPCD_ALERT_LOW_UTIL, low_long, now, msg);

    double mem_pct = r->mem_total ? 100.0 * (double)r->mem_used / (double)r->mem_total : 0;
    snprintf(msg, sizeof msg,
             "GPU %d memory %.0f%% used (%.1f of %.1f GiB): jobs here are close to running out "
             "of memory",
             g, mem_pct, r->mem_used / gib, r->mem_total / gib);
    set_alert(m, g, GPCD_ALERT_MEMORY, mem_pct > m->mem_above, now, msg);

    int hot = r->temperature > m->temp_above ||
              (r->slowdown_temperature > 0 &&
               r->temperature >= r->slowdown_temperature - m->slowdown_margin);
    snprintf(msg, sizeof msg,
             "GPU %d at %.0f C (alert above %.0f C, slowdown at %.0f C): it will slow itself "
             "down; check cooling and airflow",
             g, r->temperature, m->temp_above, r->slowdown_temperature);
    set_alert(m, g, GPCD_ALERT_TEMPERATURE, r->temperature >= 0 && hot, now, msg);

    int errors = r->ecc_uncorrected > 0 || r->xid_count > 0;
    snprintf(msg, sizeof msg,
             "GPU %d reports %lld uncorrectable ECC errors and %lld XID events: drain it and "
             "check nvidia-smi -q",
             g, (long long)(r->ecc_uncorrected > 0 ? r->ecc_uncorrected : 0),
             (long long)(r->xid_count > 0 ? r->xid_count : 0));
    set_alert(m, g, GPCD_ALERT_ECC, errors, now, msg);
}

gpc_status gpcd_monitor_sample(gpcd_monitor *m, gpcd_cluster *cluster, gpcd_job *const *running,
                               int nrunning, double now) {
    gpcd_sample_row rows[GPCD_MAX_GPUS];
    for (int g = 0; g < m->count; g++) {
        gpcd_gpu_reading *r = &m->readings[g];
        r->index = g;
        if (m->simulated) {
            read_simulated(m, g, r, running, nrunning);
        } else if (read_nvml(m, g, r) != GPC_OK) {
            gpc_log(GPC_LOG_WARN, "monitor: %s", gpc_last_error());
            r->util = -1;
        }
        r->busy = 0;
        r->busy_job = 0;
        for (int i = 0; i < nrunning && !r->busy; i++)
            for (int a = 0; a < running[i]->assigned_count; a++)
                if (running[i]->assigned[a] == g) {
                    r->busy = 1;
                    r->busy_job = running[i]->id;
                }
    }
    if (m->simulated) apply_overrides(m);
    for (int g = 0; g < m->count; g++) {
        gpcd_gpu_reading *r = &m->readings[g];
        evaluate_alerts(m, g, now);
        if (cluster && g < cluster->count) {
            cluster->gpu[g].util = r->util;
            cluster->gpu[g].mem_used = r->mem_used;
            if (r->mem_total) cluster->gpu[g].mem_total = r->mem_total;
            cluster->gpu[g].numa_node = r->numa_node;
        }
        rows[g].time = now;
        rows[g].gpu = g;
        rows[g].util = r->util;
        rows[g].mem_used = r->mem_used;
        rows[g].mem_total = r->mem_total;
        rows[g].temperature = r->temperature;
        rows[g].power = r->power;
    }
    if (m->store) return gpcd_store_add_samples(m->store, rows, m->count, m->retention, now);
    return GPC_OK;
}

const gpcd_gpu_reading *gpcd_monitor_readings(const gpcd_monitor *monitor, int *count) {
    *count = monitor->count;
    return monitor->readings;
}

const gpcd_alert *gpcd_monitor_alerts(const gpcd_monitor *monitor, int *count) {
    *count = monitor->alert_count;
    return monitor->alerts;
}
