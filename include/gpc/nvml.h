/*
 * gpc nvml: GPU health and topology read from the NVIDIA driver's
 * management library (NVML), loaded at run time with dlopen.
 *
 * Loading at run time keeps every gpc binary usable on machines without a
 * driver: gpc_nvml_open fails with GPC_ERR_UNSUPPORTED and a message, and
 * callers (gpcd's monitor, gpc doctor) decide what to do. The NVML types are
 * declared privately in nvml.c, so no NVIDIA header is needed to build.
 *
 * Readings the driver cannot give on a device (no ECC on a consumer GPU, no
 * power sensor) are reported as -1, never as a made-up zero.
 */
#ifndef GPC_NVML_H
#define GPC_NVML_H

#include <stdint.h>

#include "gpc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpc_nvml gpc_nvml;

/* Bits of gpc_nvml_sample.throttle_reasons (NVML's clocks-event reasons). */
#define GPC_NVML_THROTTLE_GPU_IDLE 0x1ull
#define GPC_NVML_THROTTLE_APP_CLOCKS 0x2ull
#define GPC_NVML_THROTTLE_SW_POWER_CAP 0x4ull
#define GPC_NVML_THROTTLE_HW_SLOWDOWN 0x8ull
#define GPC_NVML_THROTTLE_SYNC_BOOST 0x10ull
#define GPC_NVML_THROTTLE_SW_THERMAL 0x20ull
#define GPC_NVML_THROTTLE_HW_THERMAL 0x40ull
#define GPC_NVML_THROTTLE_HW_POWER_BRAKE 0x80ull

/* One reading of one GPU. Integers are -1 where the driver has no value. */
typedef struct {
    int index;
    char name[96];
    char uuid[96];
    char pci_bus_id[32];    /* "0000:3b:00.0", as in /sys/bus/pci/devices */
    int utilization_gpu;    /* percent of time a kernel ran over the last sample period */
    int utilization_memory; /* percent of time memory was read or written */
    uint64_t memory_used;   /* bytes */
    uint64_t memory_total;  /* bytes */
    int temperature_c;
    int slowdown_temperature_c; /* the GPU's own threshold where it starts to slow down */
    int shutdown_temperature_c;
    double power_w;       /* -1 when unknown */
    double power_limit_w; /* the enforced limit; -1 when unknown */
    int sm_clock_mhz;
    int memory_clock_mhz;
    int sm_clock_max_mhz;
    int64_t throttle_reasons; /* GPC_NVML_THROTTLE_* bits; -1 when unknown */
    int64_t ecc_corrected;    /* volatile counts since the driver loaded; -1 without ECC */
    int64_t ecc_uncorrected;
    int64_t xid_count; /* critical XID events seen by this handle; -1 when not available */
    int64_t last_xid;  /* the last XID code, 0 when none */
    int pcie_gen;
    int pcie_width;
    int pcie_gen_max;
    int pcie_width_max;
    int numa_node; /* from sysfs for the GPU's PCI device; -1 when unknown */
} gpc_nvml_sample;

/* The readings that say whether power holds a GPU's clock down: a subset of
 * gpc_nvml_sample, which gpc_train takes every step. */
typedef struct {
    double power_w;           /* -1 when unknown */
    double power_limit_w;     /* the enforced limit; -1 when unknown */
    int sm_clock_mhz;         /* -1 when unknown */
    int sm_clock_max_mhz;     /* -1 when unknown */
    int64_t throttle_reasons; /* GPC_NVML_THROTTLE_* bits; -1 when unknown */
    double energy_j;          /* energy counter, joules since the driver loaded; -1: unknown */
} gpc_nvml_power;

/* How two GPUs reach each other, nearest first (NVML's topology levels). */
typedef enum {
    GPC_NVML_PATH_SAME = 0,        /* the same GPU */
    GPC_NVML_PATH_NVLINK = 1,      /* direct NVLink or an NVSwitch */
    GPC_NVML_PATH_PCIE_SWITCH = 2, /* one PCIe switch */
    GPC_NVML_PATH_PCIE_MULTI = 3,  /* several PCIe switches */
    GPC_NVML_PATH_HOST_BRIDGE = 4, /* the CPU's PCIe host bridge */
    GPC_NVML_PATH_NUMA_NODE = 5,   /* host bridges within one NUMA node */
    GPC_NVML_PATH_SYSTEM = 6,      /* across NUMA nodes (the CPU interconnect) */
    GPC_NVML_PATH_UNKNOWN = 7,
} gpc_nvml_path;

typedef struct {
    gpc_nvml_path path;
    int nvlink;       /* 1 when the two GPUs can talk over NVLink */
    int nvlink_links; /* active NVLink links on the first GPU (0 without NVLink) */
} gpc_nvml_link;

/* Loads libnvidia-ml.so.1 (or the file named by GPC_NVML_LIBRARY) and
 * initialises it. Without a driver: GPC_ERR_UNSUPPORTED, saying so. */
gpc_status gpc_nvml_open(gpc_nvml **out);
void gpc_nvml_close(gpc_nvml *nvml);
int gpc_nvml_device_count(const gpc_nvml *nvml);
/* The driver version, e.g. "550.54.15" ("" when unknown). */
const char *gpc_nvml_driver_version(const gpc_nvml *nvml);
gpc_status gpc_nvml_sample_device(gpc_nvml *nvml, int index, gpc_nvml_sample *out);
/* Power, SM clock, clocks-event reasons and the energy counter only: six
 * NVML calls and no sysfs read, for a caller inside a loop (gpc_train reads it every step).
 * Measured on an H200 in a VM: 1.5 ms a call, against 2.0 ms for
 * gpc_nvml_sample_device. Readings the driver cannot give are -1; only a bad
 * index fails. */
gpc_status gpc_nvml_sample_power(gpc_nvml *nvml, int index, gpc_nvml_power *out);
/* How much of the GPU its kernels use, beyond NVML's "a kernel ran"
 * utilisation. -1 where the driver has no value. */
typedef struct {
    double sm_active;     /* GPM: % of SMs busy (Hopper and newer) */
    double sm_occupancy;  /* GPM: % of the warps the SMs can hold */
    double tensor_active; /* GPM: % of time any tensor core worked */
    double dram_bw;       /* GPM: % of the DRAM bandwidth */
    double pcie_rx_mbs;   /* host to GPU, MB/s (nvmlDeviceGetPcieThroughput) */
    double pcie_tx_mbs;   /* GPU to host, MB/s */
} gpc_nvml_activity;

/* Reads the activity of GPU index. GPM metrics are differences of two
 * samples: the first call on a GPU primes them and returns -1 for the GPM
 * fields; each later call covers the time since the one before. Only a
 * bad index fails. */
gpc_status gpc_nvml_sample_activity(gpc_nvml *nvml, int index, gpc_nvml_activity *out);
/* The energy counter alone (one NVML call): joules since the driver
 * loaded, -1 when unknown (no counter, no NVML, an index it does not list).
 * gpc_energy_sustain (gpc/energy.h) measures a call's energy with it. */
double gpc_nvml_energy_j(gpc_nvml *nvml, int index);
gpc_status gpc_nvml_topology(gpc_nvml *nvml, int a, int b, gpc_nvml_link *out);
const char *gpc_nvml_path_name(gpc_nvml_path path);
/* The pids of the compute processes on GPU index (at most max, up to 128),
 * their count; -1 when the driver cannot tell. */
int gpc_nvml_compute_processes(gpc_nvml *nvml, int index, int *pids, int max);

/* The NVML index of the GPU at PCI bus id bus_id (as the CUDA backend's
 * device_pci_bus_id writes it). NVML numbers every GPU of the machine and
 * ignores CUDA_VISIBLE_DEVICES, so CUDA's device N is not NVML's N; the bus id
 * names the same GPU in both. No such GPU: GPC_ERR_INVALID_ARG, saying so. */
gpc_status gpc_nvml_find_bus_id(gpc_nvml *nvml, const char *bus_id, int *index);
/* gpc_nvml_open, then gpc_nvml_find_bus_id: NVML opened for the GPU at
 * bus_id, and its index. On failure *out is NULL, *index -1 and nothing
 * stays open. */
gpc_status gpc_nvml_open_bus_id(const char *bus_id, gpc_nvml **out, int *index);
/* 1 when a and b name the same PCI function: both parse as hex
 * domain:bus:device.function and the four numbers agree, so CUDA's
 * "0000:3B:00.0", sysfs's "0000:3b:00.0" and NVML's "00000000:3B:00.0" are
 * equal. 0 otherwise, and whenever either is malformed (or NULL). */
int gpc_pci_bus_id_equal(const char *a, const char *b);

#ifdef __cplusplus
}
#endif

#endif /* GPC_NVML_H */
