/*
 * nvml.c: reads GPU health and topology through NVML, loaded with dlopen.
 *
 * We declare the few NVML types and entry points we use instead of including
 * nvml.h, so gpc builds without the CUDA toolkit and runs without a driver.
 * The declarations follow NVML's public C API, which NVIDIA keeps
 * binary-compatible: versioned entry points (_v2, _v3) are used where the
 * unversioned name is deprecated. Every entry point except init, count and
 * handle lookup is optional: a driver that lacks one reports -1 for that
 * reading rather than failing the whole sample.
 *
 * Not thread-safe: one thread (gpcd's monitor, or gpc doctor) owns a handle.
 */
#include "gpc/nvml.h"
#include "gpc/settings.h"

#include <ctype.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------ NVML's ABI, declared here */

typedef int nvml_return;
typedef struct nvml_device_st *nvml_device;
typedef struct nvml_event_set_st *nvml_event_set;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_TIMEOUT = 10,
};

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvml_utilization;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvml_memory;

typedef struct {
    char bus_id_legacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pci_device_id;
    unsigned int pci_subsystem_id;
    char bus_id[32];
} nvml_pci_info;

typedef struct {
    nvml_device device;
    unsigned long long event_type;
    unsigned long long event_data;
    unsigned int gpu_instance_id;
    unsigned int compute_instance_id;
} nvml_event_data;

#define NVML_TEMPERATURE_GPU 0
#define NVML_TEMPERATURE_THRESHOLD_SHUTDOWN 0
#define NVML_TEMPERATURE_THRESHOLD_SLOWDOWN 1
#define NVML_CLOCK_SM 1
#define NVML_CLOCK_MEM 2
#define NVML_MEMORY_ERROR_TYPE_CORRECTED 0
#define NVML_MEMORY_ERROR_TYPE_UNCORRECTED 1
#define NVML_VOLATILE_ECC 0
#define NVML_P2P_CAPS_INDEX_NVLINK 2
#define NVML_P2P_STATUS_OK 0
#define NVML_NVLINK_MAX_LINKS 18
#define NVML_EVENT_TYPE_XID_CRITICAL 0x8ull

/* GPM (GPU performance monitoring, Hopper and newer): nvmlGpmMetricsGet_t
 * and its parts as NVML's API reference declares them. The metrics array
 * is sized by NVML_GPM_METRIC_MAX (98 in the headers that introduced
 * GPM); the driver reads num_metrics entries, so a smaller count is fine. */
typedef struct nvml_gpm_sample_st *nvml_gpm_sample;
typedef struct {
    unsigned int metric_id;
    nvml_return nvml_return;
    double value;
    struct {
        char *short_name, *long_name, *unit;
    } info;
} nvml_gpm_metric;
typedef struct {
    unsigned int version;
    unsigned int num_metrics;
    nvml_gpm_sample sample1, sample2;
    nvml_gpm_metric metrics[98];
} nvml_gpm_metrics_get;
typedef struct {
    unsigned int version;
    unsigned int is_supported_device;
} nvml_gpm_support;
#define NVML_GPM_METRICS_GET_VERSION 1
#define NVML_GPM_SUPPORT_VERSION 1
#define NVML_GPM_METRIC_SM_UTIL 2
#define NVML_GPM_METRIC_SM_OCCUPANCY 3
#define NVML_GPM_METRIC_ANY_TENSOR_UTIL 5
#define NVML_GPM_METRIC_DRAM_BW_UTIL 10
#define NVML_PCIE_UTIL_TX_BYTES 0
#define NVML_PCIE_UTIL_RX_BYTES 1

/* The entry points, one pointer each; NULL when this driver lacks it. */
typedef struct {
    nvml_return (*init)(void);
    nvml_return (*shutdown)(void);
    const char *(*error_string)(nvml_return);
    nvml_return (*driver_version)(char *, unsigned int);
    nvml_return (*count)(unsigned int *);
    nvml_return (*handle)(unsigned int, nvml_device *);
    nvml_return (*name)(nvml_device, char *, unsigned int);
    nvml_return (*uuid)(nvml_device, char *, unsigned int);
    nvml_return (*pci_info)(nvml_device, nvml_pci_info *);
    nvml_return (*utilization)(nvml_device, nvml_utilization *);
    nvml_return (*memory)(nvml_device, nvml_memory *);
    nvml_return (*temperature)(nvml_device, int, unsigned int *);
    nvml_return (*temperature_threshold)(nvml_device, int, unsigned int *);
    nvml_return (*power)(nvml_device, unsigned int *);
    nvml_return (*power_limit)(nvml_device, unsigned int *);
    nvml_return (*clock)(nvml_device, int, unsigned int *);
    nvml_return (*max_clock)(nvml_device, int, unsigned int *);
    nvml_return (*throttle_reasons)(nvml_device, unsigned long long *);
    nvml_return (*energy)(nvml_device, unsigned long long *);
    nvml_return (*ecc_errors)(nvml_device, int, int, unsigned long long *);
    nvml_return (*pcie_gen)(nvml_device, unsigned int *);
    nvml_return (*pcie_width)(nvml_device, unsigned int *);
    nvml_return (*pcie_gen_max)(nvml_device, unsigned int *);
    nvml_return (*pcie_width_max)(nvml_device, unsigned int *);
    nvml_return (*common_ancestor)(nvml_device, nvml_device, int *);
    nvml_return (*p2p_status)(nvml_device, nvml_device, int, int *);
    nvml_return (*nvlink_state)(nvml_device, unsigned int, int *);
    nvml_return (*event_set_create)(nvml_event_set *);
    nvml_return (*register_events)(nvml_device, unsigned long long, nvml_event_set);
    nvml_return (*event_set_wait)(nvml_event_set, nvml_event_data *, unsigned int);
    nvml_return (*event_set_free)(nvml_event_set);
    nvml_return (*compute_processes)(nvml_device, unsigned int *, void *);
    nvml_return (*pcie_throughput)(nvml_device, int, unsigned int *);
    nvml_return (*gpm_support)(nvml_device, nvml_gpm_support *);
    nvml_return (*gpm_alloc)(nvml_gpm_sample *);
    nvml_return (*gpm_free)(nvml_gpm_sample);
    nvml_return (*gpm_get)(nvml_device, nvml_gpm_sample);
    nvml_return (*gpm_metrics)(nvml_gpm_metrics_get *);
} nvml_api;

/* nvmlProcessInfo_t of nvmlDeviceGetComputeRunningProcesses_v2 and _v3 */
typedef struct {
    unsigned int pid;
    unsigned long long used_memory;
    unsigned int gpu_instance, compute_instance;
} nvml_process_info;

#define GPC_NVML_MAX_DEVICES 64

struct gpc_nvml {
    void *library;
    nvml_api api;
    unsigned int count;
    nvml_device devices[GPC_NVML_MAX_DEVICES];
    nvml_event_set events;
    int64_t xid_count[GPC_NVML_MAX_DEVICES];
    int64_t last_xid[GPC_NVML_MAX_DEVICES];
    int xid_registered[GPC_NVML_MAX_DEVICES];
    char driver[96];
    /* GPM: the previous sample of each GPU (metrics are differences of
     * two); gpm_state 0 untried, 1 supported, -1 not offered */
    nvml_gpm_sample gpm_prev[GPC_NVML_MAX_DEVICES];
    int gpm_state[GPC_NVML_MAX_DEVICES];
};

static void *nvml_symbol(void *library, const char *name, const char *fallback) {
    void *p = dlsym(library, name);
    if (!p && fallback) p = dlsym(library, fallback);
    return p;
}

#define LOAD(field, name, fallback) *(void **)(&api->field) = nvml_symbol(library, name, fallback)

static void nvml_load_api(void *library, nvml_api *api) {
    LOAD(init, "nvmlInit_v2", "nvmlInit");
    LOAD(shutdown, "nvmlShutdown", NULL);
    LOAD(error_string, "nvmlErrorString", NULL);
    LOAD(driver_version, "nvmlSystemGetDriverVersion", NULL);
    LOAD(count, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount");
    LOAD(handle, "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex");
    LOAD(name, "nvmlDeviceGetName", NULL);
    LOAD(uuid, "nvmlDeviceGetUUID", NULL);
    LOAD(pci_info, "nvmlDeviceGetPciInfo_v3", NULL);
    LOAD(utilization, "nvmlDeviceGetUtilizationRates", NULL);
    LOAD(memory, "nvmlDeviceGetMemoryInfo", NULL);
    LOAD(temperature, "nvmlDeviceGetTemperature", NULL);
    LOAD(temperature_threshold, "nvmlDeviceGetTemperatureThreshold", NULL);
    LOAD(power, "nvmlDeviceGetPowerUsage", NULL);
    LOAD(power_limit, "nvmlDeviceGetEnforcedPowerLimit", NULL);
    LOAD(clock, "nvmlDeviceGetClockInfo", NULL);
    LOAD(max_clock, "nvmlDeviceGetMaxClockInfo", NULL);
    LOAD(throttle_reasons, "nvmlDeviceGetCurrentClocksEventReasons",
         "nvmlDeviceGetCurrentClocksThrottleReasons");
    LOAD(energy, "nvmlDeviceGetTotalEnergyConsumption", NULL);
    LOAD(ecc_errors, "nvmlDeviceGetTotalEccErrors", NULL);
    LOAD(pcie_gen, "nvmlDeviceGetCurrPcieLinkGeneration", NULL);
    LOAD(pcie_width, "nvmlDeviceGetCurrPcieLinkWidth", NULL);
    LOAD(pcie_gen_max, "nvmlDeviceGetMaxPcieLinkGeneration", NULL);
    LOAD(pcie_width_max, "nvmlDeviceGetMaxPcieLinkWidth", NULL);
    LOAD(common_ancestor, "nvmlDeviceGetTopologyCommonAncestor", NULL);
    LOAD(p2p_status, "nvmlDeviceGetP2PStatus", NULL);
    LOAD(nvlink_state, "nvmlDeviceGetNvLinkState", NULL);
    LOAD(event_set_create, "nvmlEventSetCreate", NULL);
    LOAD(register_events, "nvmlDeviceRegisterEvents", NULL);
    LOAD(event_set_wait, "nvmlEventSetWait_v2", "nvmlEventSetWait");
    LOAD(event_set_free, "nvmlEventSetFree", NULL);
    LOAD(compute_processes, "nvmlDeviceGetComputeRunningProcesses_v3",
         "nvmlDeviceGetComputeRunningProcesses_v2");
    LOAD(pcie_throughput, "nvmlDeviceGetPcieThroughput", NULL);
    LOAD(gpm_support, "nvmlGpmQueryDeviceSupport", NULL);
    LOAD(gpm_alloc, "nvmlGpmSampleAlloc", NULL);
    LOAD(gpm_free, "nvmlGpmSampleFree", NULL);
    LOAD(gpm_get, "nvmlGpmSampleGet", NULL);
    LOAD(gpm_metrics, "nvmlGpmMetricsGet", NULL);
}

static const char *nvml_message(const gpc_nvml *nvml, nvml_return rc) {
    static _Thread_local char buf[32];
    if (nvml->api.error_string) return nvml->api.error_string(rc);
    snprintf(buf, sizeof buf, "NVML error %d", rc);
    return buf;
}

/* Reads a small integer from sysfs, or -1. */
static int read_sysfs_int(const char *path) {
    FILE *f = fopen(path, "r");
    int value = -1;
    if (!f) return -1;
    if (fscanf(f, "%d", &value) != 1) value = -1;
    fclose(f);
    return value;
}

gpc_status gpc_nvml_open(gpc_nvml **out) {
    *out = NULL;
    const char *path = gpc_setting_str("GPC_NVML_LIBRARY");
    if (!path || !*path) path = "libnvidia-ml.so.1";
    void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!library)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "no NVIDIA driver found (cannot load %s: %s); install the NVIDIA "
                         "driver, or use simulated GPUs where that is intended",
                         path, dlerror());
    gpc_nvml *nvml = calloc(1, sizeof *nvml);
    if (!nvml) {
        dlclose(library);
        return gpc_error(GPC_ERR_NOMEM, "out of memory opening NVML");
    }
    nvml->library = library;
    nvml_load_api(library, &nvml->api);
    if (!nvml->api.init || !nvml->api.count || !nvml->api.handle) {
        gpc_nvml_close(nvml);
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "%s lacks nvmlInit/nvmlDeviceGetCount; the NVIDIA driver is too old or "
                         "broken, reinstall it",
                         path);
    }
    nvml_return rc = nvml->api.init();
    if (rc != NVML_SUCCESS) {
        const char *why = nvml->api.error_string ? nvml->api.error_string(rc) : "unknown error";
        dlclose(library);
        free(nvml);
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "the NVIDIA driver did not start (nvmlInit: %s); check `nvidia-smi` "
                         "and that the kernel module is loaded",
                         why);
    }
    rc = nvml->api.count(&nvml->count);
    if (rc != NVML_SUCCESS) {
        gpc_status st =
            gpc_error(GPC_ERR_DEVICE, "NVML cannot count GPUs: %s", nvml_message(nvml, rc));
        gpc_nvml_close(nvml);
        return st;
    }
    if (nvml->count > GPC_NVML_MAX_DEVICES) nvml->count = GPC_NVML_MAX_DEVICES;
    for (unsigned int i = 0; i < nvml->count; i++) {
        rc = nvml->api.handle(i, &nvml->devices[i]);
        if (rc != NVML_SUCCESS) {
            gpc_status st =
                gpc_error(GPC_ERR_DEVICE, "NVML cannot open GPU %u: %s", i, nvml_message(nvml, rc));
            gpc_nvml_close(nvml);
            return st;
        }
        nvml->xid_count[i] = -1;
    }
    if (nvml->api.driver_version)
        if (nvml->api.driver_version(nvml->driver, sizeof nvml->driver) != NVML_SUCCESS)
            nvml->driver[0] = '\0';
    /* XID events need an event set; drivers or containers without permission
     * for it leave xid_count at -1 ("not available"). */
    if (nvml->api.event_set_create && nvml->api.register_events && nvml->api.event_set_wait &&
        nvml->api.event_set_create(&nvml->events) == NVML_SUCCESS) {
        for (unsigned int i = 0; i < nvml->count; i++)
            if (nvml->api.register_events(nvml->devices[i], NVML_EVENT_TYPE_XID_CRITICAL,
                                          nvml->events) == NVML_SUCCESS) {
                nvml->xid_registered[i] = 1;
                nvml->xid_count[i] = 0;
            }
    } else {
        nvml->events = NULL;
    }
    *out = nvml;
    return GPC_OK;
}

void gpc_nvml_close(gpc_nvml *nvml) {
    if (!nvml) return;
    if (nvml->events && nvml->api.event_set_free) nvml->api.event_set_free(nvml->events);
    for (unsigned i = 0; i < nvml->count && i < GPC_NVML_MAX_DEVICES; i++)
        if (nvml->gpm_prev[i] && nvml->api.gpm_free) nvml->api.gpm_free(nvml->gpm_prev[i]);
    if (nvml->api.shutdown) nvml->api.shutdown();
    dlclose(nvml->library);
    free(nvml);
}

int gpc_nvml_device_count(const gpc_nvml *nvml) {
    return nvml ? (int)nvml->count : 0;
}

const char *gpc_nvml_driver_version(const gpc_nvml *nvml) {
    return nvml ? nvml->driver : "";
}

/* Drains pending XID events without waiting, crediting each to its GPU. */
static void nvml_drain_xid(gpc_nvml *nvml) {
    if (!nvml->events) return;
    nvml_event_data data;
    for (int guard = 0; guard < 256; guard++) {
        memset(&data, 0, sizeof data);
        if (nvml->api.event_set_wait(nvml->events, &data, 0) != NVML_SUCCESS) break;
        for (unsigned int i = 0; i < nvml->count; i++)
            if (nvml->devices[i] == data.device && nvml->xid_registered[i]) {
                nvml->xid_count[i]++;
                nvml->last_xid[i] = (int64_t)data.event_data;
            }
    }
}

#define READ_UINT(fn, dev, target)                                                                 \
    do {                                                                                           \
        unsigned int v_;                                                                           \
        if (nvml->api.fn && nvml->api.fn(dev, &v_) == NVML_SUCCESS) (target) = (int)v_;            \
    } while (0)

/* Power, power limit, SM clock and its maximum and the clocks-event reasons
 * of dev (each -1 where NVML has no reading): what both samplers report of
 * power. The energy counter is gpc_nvml_energy_j's alone. */
static void read_power(gpc_nvml *nvml, nvml_device dev, gpc_nvml_power *out) {
    out->power_w = out->power_limit_w = -1;
    out->sm_clock_mhz = out->sm_clock_max_mhz = -1;
    out->throttle_reasons = -1;
    unsigned int v;
    if (nvml->api.power && nvml->api.power(dev, &v) == NVML_SUCCESS) out->power_w = v / 1000.0;
    if (nvml->api.power_limit && nvml->api.power_limit(dev, &v) == NVML_SUCCESS)
        out->power_limit_w = v / 1000.0;
    if (nvml->api.clock && nvml->api.clock(dev, NVML_CLOCK_SM, &v) == NVML_SUCCESS)
        out->sm_clock_mhz = (int)v;
    if (nvml->api.max_clock && nvml->api.max_clock(dev, NVML_CLOCK_SM, &v) == NVML_SUCCESS)
        out->sm_clock_max_mhz = (int)v;
    unsigned long long bits;
    if (nvml->api.throttle_reasons && nvml->api.throttle_reasons(dev, &bits) == NVML_SUCCESS)
        out->throttle_reasons = (int64_t)bits;
}

gpc_status gpc_nvml_sample_device(gpc_nvml *nvml, int index, gpc_nvml_sample *out) {
    if (!nvml || index < 0 || index >= (int)nvml->count)
        return gpc_error(GPC_ERR_INVALID_ARG, "GPU %d does not exist (NVML sees %d)", index,
                         gpc_nvml_device_count(nvml));
    nvml_device dev = nvml->devices[index];
    memset(out, 0, sizeof *out);
    out->index = index;
    out->utilization_gpu = out->utilization_memory = -1;
    out->temperature_c = out->slowdown_temperature_c = out->shutdown_temperature_c = -1;
    out->power_w = out->power_limit_w = -1;
    out->sm_clock_mhz = out->memory_clock_mhz = out->sm_clock_max_mhz = -1;
    out->throttle_reasons = out->ecc_corrected = out->ecc_uncorrected = -1;
    out->pcie_gen = out->pcie_width = out->pcie_gen_max = out->pcie_width_max = -1;
    out->numa_node = -1;

    /* Memory is the one reading everything else depends on: a failure here is
     * an error (the GPU fell off the bus, say), not a -1. */
    nvml_memory mem;
    nvml_return rc = nvml->api.memory ? nvml->api.memory(dev, &mem) : -1;
    if (rc != NVML_SUCCESS)
        return gpc_error(GPC_ERR_DEVICE, "NVML cannot read GPU %d's memory: %s", index,
                         nvml->api.memory ? nvml_message(nvml, rc) : "entry point missing");
    out->memory_total = mem.total;
    out->memory_used = mem.used;

    if (nvml->api.name) nvml->api.name(dev, out->name, sizeof out->name);
    if (nvml->api.uuid) nvml->api.uuid(dev, out->uuid, sizeof out->uuid);
    nvml_pci_info pci;
    if (nvml->api.pci_info && nvml->api.pci_info(dev, &pci) == NVML_SUCCESS) {
        snprintf(out->pci_bus_id, sizeof out->pci_bus_id, "%04x:%02x:%02x.0", pci.domain & 0xffff,
                 pci.bus & 0xff, pci.device & 0xff);
        char path[128];
        snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", out->pci_bus_id);
        out->numa_node = read_sysfs_int(path);
    }
    nvml_utilization util;
    if (nvml->api.utilization && nvml->api.utilization(dev, &util) == NVML_SUCCESS) {
        out->utilization_gpu = (int)util.gpu;
        out->utilization_memory = (int)util.memory;
    }
    unsigned int v;
    if (nvml->api.temperature && nvml->api.temperature(dev, NVML_TEMPERATURE_GPU, &v) == 0)
        out->temperature_c = (int)v;
    if (nvml->api.temperature_threshold) {
        if (nvml->api.temperature_threshold(dev, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, &v) == 0)
            out->slowdown_temperature_c = (int)v;
        if (nvml->api.temperature_threshold(dev, NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, &v) == 0)
            out->shutdown_temperature_c = (int)v;
    }
    gpc_nvml_power p;
    read_power(nvml, dev, &p);
    out->power_w = p.power_w;
    out->power_limit_w = p.power_limit_w;
    out->sm_clock_mhz = p.sm_clock_mhz;
    out->sm_clock_max_mhz = p.sm_clock_max_mhz;
    out->throttle_reasons = p.throttle_reasons;
    if (nvml->api.clock && nvml->api.clock(dev, NVML_CLOCK_MEM, &v) == 0)
        out->memory_clock_mhz = (int)v;
    if (nvml->api.ecc_errors) {
        unsigned long long n;
        if (nvml->api.ecc_errors(dev, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC, &n) ==
            NVML_SUCCESS)
            out->ecc_corrected = (int64_t)n;
        if (nvml->api.ecc_errors(dev, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, &n) ==
            NVML_SUCCESS)
            out->ecc_uncorrected = (int64_t)n;
    }
    READ_UINT(pcie_gen, dev, out->pcie_gen);
    READ_UINT(pcie_width, dev, out->pcie_width);
    READ_UINT(pcie_gen_max, dev, out->pcie_gen_max);
    READ_UINT(pcie_width_max, dev, out->pcie_width_max);
    nvml_drain_xid(nvml);
    out->xid_count = nvml->xid_count[index];
    out->last_xid = nvml->last_xid[index];
    return GPC_OK;
}

/* 1 when GPU index offers GPM, allocating its first sample on the way. */
static int gpm_ready(gpc_nvml *nvml, int index) {
    const nvml_api *a = &nvml->api;
    if (nvml->gpm_state[index]) return nvml->gpm_state[index] > 0;
    nvml->gpm_state[index] = -1;
    if (!a->gpm_support || !a->gpm_alloc || !a->gpm_free || !a->gpm_get || !a->gpm_metrics)
        return 0;
    nvml_gpm_support support = {NVML_GPM_SUPPORT_VERSION, 0};
    if (a->gpm_support(nvml->devices[index], &support) != NVML_SUCCESS ||
        !support.is_supported_device)
        return 0;
    if (a->gpm_alloc(&nvml->gpm_prev[index]) != NVML_SUCCESS) return 0;
    if (a->gpm_get(nvml->devices[index], nvml->gpm_prev[index]) != NVML_SUCCESS) {
        a->gpm_free(nvml->gpm_prev[index]);
        nvml->gpm_prev[index] = NULL;
        return 0;
    }
    nvml->gpm_state[index] = 1;
    return 0; /* primed: the first metrics come with the next call */
}

gpc_status gpc_nvml_sample_activity(gpc_nvml *nvml, int index, gpc_nvml_activity *out) {
    out->sm_active = out->sm_occupancy = out->tensor_active = out->dram_bw = -1;
    out->pcie_rx_mbs = out->pcie_tx_mbs = -1;
    if (!nvml || index < 0 || (unsigned)index >= nvml->count)
        return gpc_error(GPC_ERR_INVALID_ARG, "no GPU %d: NVML lists %d", index,
                         nvml ? (int)nvml->count : 0);
    const nvml_api *a = &nvml->api;
    nvml_device dev = nvml->devices[index];
    unsigned int kb = 0;
    /* KB/s over the driver's last 20 ms window */
    if (a->pcie_throughput && a->pcie_throughput(dev, NVML_PCIE_UTIL_RX_BYTES, &kb) == NVML_SUCCESS)
        out->pcie_rx_mbs = kb / 1000.0;
    if (a->pcie_throughput && a->pcie_throughput(dev, NVML_PCIE_UTIL_TX_BYTES, &kb) == NVML_SUCCESS)
        out->pcie_tx_mbs = kb / 1000.0;
    if (!gpm_ready(nvml, index)) return GPC_OK;
    nvml_gpm_sample now = NULL;
    if (a->gpm_alloc(&now) != NVML_SUCCESS) return GPC_OK;
    if (a->gpm_get(dev, now) != NVML_SUCCESS) {
        a->gpm_free(now);
        return GPC_OK;
    }
    nvml_gpm_metrics_get *get = calloc(1, sizeof *get);
    if (get) {
        static const unsigned ids[] = {NVML_GPM_METRIC_SM_UTIL, NVML_GPM_METRIC_SM_OCCUPANCY,
                                       NVML_GPM_METRIC_ANY_TENSOR_UTIL,
                                       NVML_GPM_METRIC_DRAM_BW_UTIL};
        double *values[] = {&out->sm_active, &out->sm_occupancy, &out->tensor_active,
                            &out->dram_bw};
        get->version = NVML_GPM_METRICS_GET_VERSION;
        get->num_metrics = 4;
        get->sample1 = nvml->gpm_prev[index];
        get->sample2 = now;
        for (int i = 0; i < 4; i++)
            get->metrics[i].metric_id = ids[i];
        if (a->gpm_metrics(get) == NVML_SUCCESS)
            for (int i = 0; i < 4; i++)
                if (get->metrics[i].nvml_return == NVML_SUCCESS) *values[i] = get->metrics[i].value;
        free(get);
    }
    /* the newer sample starts the next interval */
    a->gpm_free(nvml->gpm_prev[index]);
    nvml->gpm_prev[index] = now;
    return GPC_OK;
}

gpc_status gpc_nvml_sample_power(gpc_nvml *nvml, int index, gpc_nvml_power *out) {
    if (!nvml || index < 0 || index >= (int)nvml->count)
        return gpc_error(GPC_ERR_INVALID_ARG, "GPU %d does not exist (NVML sees %d)", index,
                         gpc_nvml_device_count(nvml));
    read_power(nvml, nvml->devices[index], out);
    out->energy_j = gpc_nvml_energy_j(nvml, index);
    return GPC_OK;
}

double gpc_nvml_energy_j(gpc_nvml *nvml, int index) {
    unsigned long long mj;
    if (!nvml || index < 0 || index >= (int)nvml->count || !nvml->api.energy ||
        nvml->api.energy(nvml->devices[index], &mj) != NVML_SUCCESS)
        return -1;
    return mj / 1000.0;
}

gpc_status gpc_nvml_topology(gpc_nvml *nvml, int a, int b, gpc_nvml_link *out) {
    int n = gpc_nvml_device_count(nvml);
    if (a < 0 || b < 0 || a >= n || b >= n)
        return gpc_error(GPC_ERR_INVALID_ARG, "GPU pair (%d, %d) does not exist (NVML sees %d)", a,
                         b, n);
    out->path = GPC_NVML_PATH_UNKNOWN;
    out->nvlink = 0;
    out->nvlink_links = 0;
    if (a == b) {
        out->path = GPC_NVML_PATH_SAME;
        return GPC_OK;
    }
    nvml_device da = nvml->devices[a], db = nvml->devices[b];
    if (nvml->api.nvlink_state)
        for (unsigned int link = 0; link < NVML_NVLINK_MAX_LINKS; link++) {
            int active = 0;
            if (nvml->api.nvlink_state(da, link, &active) == NVML_SUCCESS && active)
                out->nvlink_links++;
        }
    /* NVSwitch systems report the switch, not the peer, as a link's remote
     * end, so NVLink reachability comes from the P2P status, as nvidia-smi
     * topo does. */
    int status = -1;
    if (nvml->api.p2p_status &&
        nvml->api.p2p_status(da, db, NVML_P2P_CAPS_INDEX_NVLINK, &status) == NVML_SUCCESS &&
        status == NVML_P2P_STATUS_OK)
        out->nvlink = 1;
    int level = -1;
    if (nvml->api.common_ancestor && nvml->api.common_ancestor(da, db, &level) == NVML_SUCCESS) {
        switch (level) {
        case 0:
            out->path = GPC_NVML_PATH_SAME;
            break;
        case 10:
            out->path = GPC_NVML_PATH_PCIE_SWITCH;
            break;
        case 20:
            out->path = GPC_NVML_PATH_PCIE_MULTI;
            break;
        case 30:
            out->path = GPC_NVML_PATH_HOST_BRIDGE;
            break;
        case 40:
            out->path = GPC_NVML_PATH_NUMA_NODE;
            break;
        case 50:
            out->path = GPC_NVML_PATH_SYSTEM;
            break;
        default:
            break;
        }
    }
    if (out->nvlink) out->path = GPC_NVML_PATH_NVLINK;
    return GPC_OK;
}

int gpc_nvml_compute_processes(gpc_nvml *nvml, int index, int *pids, int max) {
    if (!nvml || index < 0 || index >= (int)nvml->count || !nvml->api.compute_processes) return -1;
    nvml_process_info info[128];
    unsigned int n = 128;
    if (nvml->api.compute_processes(nvml->devices[index], &n, info) != NVML_SUCCESS) return -1;
    int k = 0;
    for (unsigned int i = 0; i < n && k < max; i++)
        pids[k++] = (int)info[i].pid;
    return k;
}

const char *gpc_nvml_path_name(gpc_nvml_path path) {
    switch (path) {
    case GPC_NVML_PATH_SAME:
        return "same";
    case GPC_NVML_PATH_NVLINK:
        return "nvlink";
    case GPC_NVML_PATH_PCIE_SWITCH:
        return "pcie-switch";
    case GPC_NVML_PATH_PCIE_MULTI:
        return "pcie-multi-switch";
    case GPC_NVML_PATH_HOST_BRIDGE:
        return "host-bridge";
    case GPC_NVML_PATH_NUMA_NODE:
        return "numa-node";
    case GPC_NVML_PATH_SYSTEM:
        return "system";
    case GPC_NVML_PATH_UNKNOWN:
        break;
    }
    return "unknown";
}

/* ------------------------------------------------------- PCI bus ids */

/* Reads 1 to max_digits hex digits at *p into *value and moves *p past them;
 * 0 when there are none or too many. */
static int parse_hex_field(const char **p, int max_digits, unsigned long *value) {
    int digits = 0;
    *value = 0;
    while (isxdigit((unsigned char)**p)) {
        if (++digits > max_digits) return 0;
        char c = (char)tolower((unsigned char)**p);
        *value = *value * 16 + (unsigned long)(c <= '9' ? c - '0' : c - 'a' + 10);
        (*p)++;
    }
    return digits > 0;
}

/* "domain:bus:device.function" in hex: domain up to 8 digits (NVML writes 8,
 * CUDA and sysfs 4), bus up to 2, device up to 2 and below 32, function one
 * digit below 8 (PCI's own limits). Nothing may follow. */
static int parse_pci_bus_id(const char *s, unsigned long out[4]) {
    if (!s) return 0;
    const char *p = s;
    if (!parse_hex_field(&p, 8, &out[0]) || *p++ != ':') return 0;
    if (!parse_hex_field(&p, 2, &out[1]) || *p++ != ':') return 0;
    if (!parse_hex_field(&p, 2, &out[2]) || *p++ != '.') return 0;
    if (!parse_hex_field(&p, 1, &out[3]) || *p != '\0') return 0;
    return out[2] < 32 && out[3] < 8;
}

int gpc_pci_bus_id_equal(const char *a, const char *b) {
    unsigned long x[4], y[4];
    if (!parse_pci_bus_id(a, x) || !parse_pci_bus_id(b, y)) return 0;
    return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3];
}

gpc_status gpc_nvml_find_bus_id(gpc_nvml *nvml, const char *bus_id, int *index) {
    *index = -1;
    if (!nvml || !bus_id)
        return gpc_error(GPC_ERR_INVALID_ARG, "finding a GPU by PCI bus id needs NVML and an id");
    unsigned long want[4];
    if (!parse_pci_bus_id(bus_id, want))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "'%s' is not a PCI bus id (domain:bus:device.function in hex, as in "
                         "0000:3b:00.0)",
                         bus_id);
    if (!nvml->api.pci_info)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "this NVIDIA driver's NVML lacks nvmlDeviceGetPciInfo_v3, so it cannot "
                         "tell which GPU is %s; update the driver",
                         bus_id);
    for (unsigned int i = 0; i < nvml->count; i++) {
        nvml_pci_info pci;
        memset(&pci, 0, sizeof pci);
        if (nvml->api.pci_info(nvml->devices[i], &pci) != NVML_SUCCESS) continue;
        /* NVML's own string is "00000000:3B:00.0"; where it is empty or
         * cut short, the numeric fields say the same (function 0: NVML lists
         * whole GPUs) */
        pci.bus_id[sizeof pci.bus_id - 1] = '\0';
        int numeric = want[0] == pci.domain && want[1] == (pci.bus & 0xff) &&
                      want[2] == (pci.device & 0x1f) && want[3] == 0;
        if (numeric || gpc_pci_bus_id_equal(bus_id, pci.bus_id)) {
            *index = (int)i;
            return GPC_OK;
        }
    }
    return gpc_error(GPC_ERR_INVALID_ARG,
                     "NVML sees no GPU at PCI bus id %s among its %u; check nvidia-smi's "
                     "Bus-Id column",
                     bus_id, nvml->count);
}

gpc_status gpc_nvml_open_bus_id(const char *bus_id, gpc_nvml **out, int *index) {
    *out = NULL;
    *index = -1;
    gpc_nvml *nvml;
    GPC_TRY(gpc_nvml_open(&nvml));
    gpc_status s = gpc_nvml_find_bus_id(nvml, bus_id, index);
    if (s != GPC_OK) {
        gpc_nvml_close(nvml);
        return s;
    }
    *out = nvml;
    return GPC_OK;
}
