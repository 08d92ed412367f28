/*
 * gpc doctor: the checks a user runs on a new server or when a job is slow.
 * The host (CPU, memory, OpenMP and OpenBLAS threads, disk), the GPU stack
 * (driver, CUDA runtime, NCCL, cuDNN, NVML) and each GPU's health (memory,
 * temperature, clocks and throttle reasons, PCIe link, ECC, XID), an NCCL
 * all-reduce against the link's expected rate on two or more GPUs, and a
 * few seconds of watching a process with advice for the usual failures.
 *
 * Each finding goes to a callback as it is made, so `gpc doctor` prints it
 * at once and gpcd or a server can collect the same findings. A machine
 * without a GPU is a supported machine: "no GPU" is information.
 */
#ifndef GPC_DOCTOR_H
#define GPC_DOCTOR_H

#include "gpc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    GPC_DOCTOR_OK = 0,  /* a check passed; the text says what was seen */
    GPC_DOCTOR_INFO,    /* worth knowing, not a fault (no GPU, no NCCL on one GPU) */
    GPC_DOCTOR_PROBLEM, /* something to fix; one or more GPC_DOCTOR_ADVICE follow */
    GPC_DOCTOR_ADVICE,  /* what to do about the finding just reported */
    GPC_DOCTOR_SECTION, /* a new part begins: "watching process 12 (gpc) for 5 s" */
} gpc_doctor_kind;

/* "ok", "info", "PROBLEM", "advice", "section". */
const char *gpc_doctor_kind_name(gpc_doctor_kind kind);

/* Receives each finding; text is valid during the call only. */
typedef void (*gpc_doctor_sink)(void *user, gpc_doctor_kind kind, const char *text);

typedef struct gpc_doctor gpc_doctor;

/* A diagnosis whose findings go to sink (NULL: only counted). */
gpc_status gpc_doctor_open(gpc_doctor_sink sink, void *user, gpc_doctor **out);
void gpc_doctor_close(gpc_doctor *doctor);

/* The host, the GPU stack, each GPU, then the all-reduce (two or more GPUs). */
void gpc_doctor_check_machine(gpc_doctor *doctor);

/* The OpenMP finding of the host check, from given figures (tests): the
 * threads a parallel loop starts, OMP_NUM_THREADS (NULL: unset), the cores
 * this process may use, the 1-minute load average and OMP_WAIT_POLICY. A
 * problem when the threads exceed the cores, or the load plus the threads
 * exceeds the cores by more than one (other work already holds them). */
void gpc_doctor_check_threads(gpc_doctor *doctor, int threads, const char *omp_env, int cores,
                              double load, const char *wait_policy);

/* 1 when a process with this id exists (also when it is another user's). */
int gpc_doctor_process_exists(int pid);

/* Watches process pid and its descendants for seconds (0 < seconds <=
 * 3600): CPU use, threads, memory, and on GPUs utilisation, memory and
 * throttling, with advice. A gpc train process whose command line names
 * its run folder (--out) adds its measured wait for input, from the
 * folder's metrics.jsonl. gpus (ngpus of them) are the GPUs it was given,
 * as for a gpcd job; with none, its CUDA_VISIBLE_DEVICES, else every GPU.
 * GPC_ERR_INVALID_ARG when there is no such process. */
gpc_status gpc_doctor_watch(gpc_doctor *doctor, int pid, const int *gpus, int ngpus,
                            double seconds);

/* Post-mortem of a gpc train run folder (gpc/diagnose.h's gpc_diag_run):
 * an out-of-memory end with what would fit, the run's MFU, and the causes
 * its metrics show; log_path NULL finds the log in the folder. Bad folders
 * are GPC_ERR_INVALID_ARG, saying why. */
gpc_status gpc_doctor_run(gpc_doctor *doctor, const char *run, const char *log_path);

/* Writes every finding so far as JSON to path ("-": stdout):
 * {"problems": N, "findings": [{"kind": "problem", "text": "...",
 * "cause": "input_bound", "figures": {"input_wait": 0.62, ...},
 * "advice": ["..."]}, ...]}; "cause" only where the classifier named one,
 * "figures" only where it measured them (gpc_diag_finding's); advice
 * nested under the finding it follows. */
gpc_status gpc_doctor_write_json(const gpc_doctor *doctor, const char *path);

/* Findings of kind GPC_DOCTOR_PROBLEM so far. */
int gpc_doctor_problems(const gpc_doctor *doctor);

#ifdef __cplusplus
}
#endif

#endif /* GPC_DOCTOR_H */
