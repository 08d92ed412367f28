/*
 * gpc sched: gpcd, the daemon that shares one multi-GPU server among many
 * jobs, and the pieces it is made of. One file per concern (src/sched/):
 *
 *   config.c   the options table (key, default, documentation) and its parser
 *   job.c      jobs: fields, states, priorities, JSON
 *   request.c  parsing and validating API requests (fuzzed)
 *   store.c    SQLite in WAL mode: jobs, state changes, GPU samples, alerts
 *   policy.c   placement policies and the scheduling pass
 *   runner.c   starting, watching, signalling and re-attaching job processes
 *   monitor.c  GPU providers (NVML or simulated), samples and alerts
 *   metrics.c  Prometheus text exposition
 *   api.c      HTTP/JSON over a unix socket (or TCP with a token)
 *   daemon.c   the main loop tying them together
 *   client.c   the HTTP client the gpc commands use
 *   dashboard.c  the web page served at /
 *   slurm.c    backend = slurm: jobs handed to Slurm instead of local GPUs
 *   trace.c, simulate.c  trace studies of the policies (gpc/sched_sim.h)
 *
 * Everything returns gpc_status with a message, like the rest of libgpc.
 */
#ifndef GPC_SCHED_H
#define GPC_SCHED_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "gpc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GPCD_MAX_GPUS 64
#define GPCD_DEFAULT_SOCKET "/var/lib/gpcd/gpcd.sock"

/* ------------------------------------------------------------------ jobs */

typedef enum {
    GPCD_QUEUED = 0,
    GPCD_RUNNING,
    GPCD_COMPLETED,
    GPCD_FAILED,
    GPCD_CANCELLED,
    GPCD_PREEMPTED, /* stopped to make room; waits in the queue to run again */
    GPCD_STATE_COUNT
} gpcd_state;

/* What a job does decides how it is placed (see policy.c): training and
 * batch work get whole GPUs; inference and interactive work with a memory
 * limit may share a GPU. */
typedef enum {
    GPCD_TYPE_TRAIN = 0,
    GPCD_TYPE_INFER,
    GPCD_TYPE_BATCH,
    GPCD_TYPE_INTERACTIVE,
    GPCD_TYPE_COUNT
} gpcd_job_type;

/* Priorities are 0..100; the names map to fixed points of that scale. */
#define GPCD_PRIORITY_LOW 10
#define GPCD_PRIORITY_NORMAL 50
#define GPCD_PRIORITY_HIGH 90
#define GPCD_PRIORITY_MAX 100

/* A job. Strings are malloc'd and owned by the job (gpcd_job_free). */
typedef struct {
    int64_t id;
    uint32_t owner_uid;
    char *owner;   /* user name at submission */
    char *name;    /* optional label */
    char *command; /* JSON array of strings: the argv */
    char *cwd;
    char *env;  /* JSON object of strings, the submitter's environment */
    char *data; /* data path the job reads, for locality; NULL when none */
    int gpus;   /* GPUs it needs; an elastic job's count in its current (or last) run */
    /* An elastic job (gpus_max > gpus_min >= 1) runs at any count in the
     * range: placed at the largest count free, stopped and restarted at
     * another when preempted or when it may grow (policy.c); both 0 for a
     * job that needs exactly `gpus`. */
    int gpus_min, gpus_max;
    uint64_t mem; /* GPU memory needed per GPU, bytes; 0 = unspecified */
    int priority; /* 0..100 */
    gpcd_job_type type;
    double time_limit; /* seconds; 0 = none */
    gpcd_state state;
    double submit_time, start_time, end_time; /* wall clock, 0 = not yet */
    int exit_code;                            /* -1 until it exits */
    int signal;                               /* the signal that ended it, 0 if none */
    int assigned[GPCD_MAX_GPUS];              /* GPU indices while running */
    int assigned_count;
    pid_t pid;          /* the supervisor process */
    uint64_t pid_start; /* its start time in clock ticks since boot (/proc/PID/stat) */
    pid_t pgid;         /* the job's process group */
    int preemptions;    /* times it was preempted */
    char *message;      /* why it ended, or why it waits */
    int data_numa;      /* NUMA node of the data path, -1 unknown (not stored) */
    uint32_t data_hash; /* hash of the data path, 0 when none (not stored) */
    /* runner bookkeeping, in memory only */
    int stop_reason;  /* GPCD_STOP_* once a stop was requested */
    double term_sent; /* when SIGTERM went out, 0 if not */
    int kill_sent;
    int unsaved; /* its latest state is not in the database yet (storage failing) */
} gpcd_job;

enum {
    GPCD_STOP_NONE = 0,
    GPCD_STOP_CANCEL,
    GPCD_STOP_PREEMPT,
    GPCD_STOP_TIMEOUT,
    GPCD_STOP_RESIZE /* an elastic job stopped to restart on more GPUs */
};

const char *gpcd_state_name(gpcd_state state);
gpc_status gpcd_state_parse(const char *name, gpcd_state *out);
const char *gpcd_type_name(gpcd_job_type type);
gpc_status gpcd_type_parse(const char *name, gpcd_job_type *out);
/* "low", "normal", "high" or a number 0..100. */
gpc_status gpcd_priority_parse(const char *text, int *out);
const char *gpcd_priority_name(int priority, char *buf, size_t size);
/* "90", "90s", "15m", "2h", "1d", "1h30m"; result in seconds, > 0. */
gpc_status gpcd_duration_parse(const char *text, double *out);
/* "40G", "512M", "1.5T", "1024" (bytes); powers of 1024. */
gpc_status gpcd_bytes_parse(const char *text, uint64_t *out);
int gpcd_state_is_final(gpcd_state state);
/* Queued or preempted: waiting for GPUs. */
int gpcd_state_is_pending(gpcd_state state);
/* Whether a job of this type and memory request may share a GPU. */
int gpcd_job_shares_gpu(const gpcd_job *job);
/* Whether the job runs at any GPU count in gpus_min..gpus_max. */
int gpcd_job_elastic(const gpcd_job *job);
/* The fewest GPUs the job can run on: gpus_min when elastic, else gpus. */
int gpcd_job_min_gpus(const gpcd_job *job);
/* "4" or "1-4" (an elastic range); min <= max, both 1..GPCD_MAX_GPUS. */
gpc_status gpcd_gpus_parse(const char *text, int *min, int *max);

gpcd_job *gpcd_job_new(void);
gpcd_job *gpcd_job_copy(const gpcd_job *job);
void gpcd_job_free(gpcd_job *job);
/* FNV-1a of the data path, never 0 for a non-empty path. */
uint32_t gpcd_data_hash(const char *path);

/* The JSON the API returns for a job (a jansson json_t *, as void * so this
 * header does not need jansson). */
void *gpcd_job_to_json(const gpcd_job *job);

/* ---------------------------------------------------------------- config */

#define GPCD_POLICY_PRIORITY (1u << 0)
#define GPCD_POLICY_AGING (1u << 1)
#define GPCD_POLICY_LEAST_LOADED (1u << 2)
#define GPCD_POLICY_BINPACK (1u << 3)
#define GPCD_POLICY_TASK_TYPE (1u << 4)
#define GPCD_POLICY_LOCALITY (1u << 5)
#define GPCD_POLICY_BACKFILL (1u << 6)
#define GPCD_POLICY_PREEMPTION (1u << 7)
#define GPCD_POLICY_SHORTEST_FIRST (1u << 8) /* not in ALL: opt in (docs/gpcd.md) */
#define GPCD_POLICY_ALL 0xffu

/* A data-path prefix and the NUMA node its storage hangs off. */
typedef struct {
    char prefix[256];
    int node;
} gpcd_numa_rule;

#define GPCD_MAX_NUMA_RULES 16

typedef struct gpcd_policy_config {
    unsigned flags;         /* GPCD_POLICY_* */
    double aging_per_hour;  /* priority points gained per hour of waiting */
    uint64_t small_job_mem; /* shared jobs up to this much memory are bin-packed */
    gpcd_numa_rule numa_rules[GPCD_MAX_NUMA_RULES];
    int numa_rule_count;
    double shortest_first_points; /* points per halving of the GPU time a job asks for */
    /* preemption guards (policy.c): a victim has run at least min_runtime
     * (doubled for each time it was preempted before), the waiting job's
     * effective priority exceeds the victim's by margin points, and the job
     * could not start within grace seconds anyway */
    double preempt_min_runtime;
    double preempt_margin;
    double preempt_grace; /* mirrors gpcd_config.preempt_grace */
    /* an elastic job grows (stops, restarts on more GPUs) only when nothing
     * waits, it could at least double, and it has run this long at its
     * current count; 0 = never grow */
    double elastic_grow_after;
} gpcd_policy_config;

typedef struct {
    char state_dir[512];
    char socket[512];
    int socket_mode;
    char listen[256];
    char token_file[512];
    char gpus[128];
    char policies[256];
    gpcd_policy_config policy;
    double preempt_grace;
    double kill_grace;
    double sample_interval;
    double sample_retention;
    double keep_finished; /* seconds a finished job is kept; 0: forever */
    double alert_util_below;
    double alert_util_window;
    double alert_mem_above;
    double alert_temp_above;
    double alert_slowdown_margin;
    char simulated_file[512];
    int max_body;
    int peer_connections;  /* connections one uid (socket) or address (TCP) may hold */
    double header_timeout; /* a request's line and headers must arrive within this */
    uint64_t log_max;      /* a job's log keeps its first and last halves of this many bytes */
    char log_level[16];
    /* backend = slurm (slurm.c): jobs go to Slurm instead of local GPUs */
    char backend[16];
    char slurm_options[512];
    char slurm_gpu_option[64];
    double slurm_poll_interval;
    char slurm_log_dir[400]; /* where Slurm jobs write their output; "" = STATE_DIR/jobs */
} gpcd_config;

/* One entry of the options table: gpcd's configuration is this table. */
typedef struct {
    const char *key;
    const char *default_value;
    const char *doc;
} gpcd_option_doc;

/* Fills every field with its default. */
void gpcd_config_defaults(gpcd_config *config);
/* Reads an ini file over the defaults; unknown keys and bad values are
 * errors naming the file, line and key. */
gpc_status gpcd_config_load(gpcd_config *config, const char *path);
/* Sets one key from text, as the file would. */
gpc_status gpcd_config_set(gpcd_config *config, const char *key, const char *value);
/* Fills derived fields (socket path inside state_dir, policy flags). */
gpc_status gpcd_config_finish(gpcd_config *config);
const gpcd_option_doc *gpcd_config_options(int *count);
/* Writes the options as a Markdown table (docs/gpcd.md is made from it). */
void gpcd_config_write_markdown(void *file);
gpc_status gpcd_policies_parse(const char *text, unsigned *flags);
/* NUMA rules "/datasets=0,/scratch=1". */
gpc_status gpcd_numa_rules_parse(const char *text, gpcd_policy_config *policy);

/* ---------------------------------------------------------------- cluster */

/* What the scheduler knows about one GPU: the live reading and the jobs
 * gpcd placed on it. */
typedef struct {
    int index;
    uint64_t mem_total;
    uint64_t mem_used; /* live, from the monitor (all processes, not only gpcd's) */
    double util;       /* live utilisation, percent */
    int numa_node;     /* -1 unknown */
    /* filled from the running jobs by gpcd_cluster_account */
    uint64_t mem_reserved; /* sum of memory requests of the jobs on it */
    int exclusive_jobs;    /* jobs that own it whole */
    int shared_jobs;       /* jobs sharing it */
    double free_time;      /* when its last job is expected to end (0 = free now, inf = unknown) */
    uint32_t data_hash;    /* data of the job that last ran on it */
    int unavailable; /* held back: drained, or its last job's processes have not left it yet */
} gpcd_gpu;

typedef struct {
    int count;
    gpcd_gpu gpu[GPCD_MAX_GPUS];
    uint8_t nvlink[GPCD_MAX_GPUS][GPCD_MAX_GPUS]; /* 1 when the pair talks over NVLink */
} gpcd_cluster;

/* Recomputes reservations from the running jobs (live readings are kept). */
void gpcd_cluster_account(const struct gpcd_policy_config *policy, gpcd_cluster *cluster,
                          gpcd_job *const *running, int nrunning);

/* ---------------------------------------------------------------- policy */

/* RESIZE: stop an elastic job (as PREEMPT does) so that the next pass
 * restarts it on gpu_count GPUs, the count it could grow to. */
typedef enum { GPCD_DECIDE_START = 0, GPCD_DECIDE_PREEMPT, GPCD_DECIDE_RESIZE } gpcd_decision_kind;

typedef struct {
    gpcd_decision_kind kind;
    gpcd_job *job;
    int gpu_count;
    int gpus[GPCD_MAX_GPUS];
} gpcd_decision;

typedef struct {
    int started;
    int preempted;
    int resized;             /* elastic jobs told to grow */
    int blocked;             /* pending jobs that could not start */
    int64_t reserved_for;    /* job id holding the backfill reservation, 0 if none */
    double reservation_time; /* when that job is expected to start */
} gpcd_pass_stats;

/* The job's place in the queue: its priority, plus aging when enabled. */
double gpcd_policy_effective_priority(const gpcd_policy_config *policy, const gpcd_job *job,
                                      double now);
/* Whether the preemption policy lets `job` (waiting) stop `victim`
 * (running) at `now`: lower base priority, effective priority preempt_margin
 * below, run at least preempt_min_runtime (doubled per earlier preemption),
 * and not ending by itself within preempt_grace. */
int gpcd_policy_may_preempt(const gpcd_policy_config *policy, const gpcd_job *job,
                            const gpcd_job *victim, double now);
/* Whether the job may use this GPU now (task type, memory, exclusivity). */
int gpcd_policy_gpu_admits(const gpcd_policy_config *policy, const gpcd_gpu *gpu,
                           const gpcd_job *job);
/* Lower is better: least-loaded for big jobs, bin-packing for small ones,
 * with a bonus for data locality. */
double gpcd_policy_gpu_score(const gpcd_policy_config *policy, const gpcd_gpu *gpu,
                             const gpcd_job *job);
/* Picks job->gpus GPUs among those admitted, all or nothing (an elastic
 * job: the largest count in its range that fits); for multi-GPU training
 * prefers sets joined by NVLink. Returns the count chosen (0 when the job
 * does not fit). */
int gpcd_policy_place(const gpcd_policy_config *policy, const gpcd_cluster *cluster,
                      const gpcd_job *job, int *gpus_out);
/* NUMA node of a data path: the config's rules first, then sysfs for the
 * device holding it; -1 when unknown. */
int gpcd_data_numa_node(const gpcd_policy_config *policy, const char *path);

/* One scheduling pass over the pending jobs. Fills decisions (at most
 * max_decisions) and returns how many; the cluster's reservations are
 * updated for the jobs started. Pure: starts nothing itself. */
int gpcd_schedule(const gpcd_policy_config *policy, gpcd_cluster *cluster, gpcd_job *const *pending,
                  int npending, gpcd_job *const *running, int nrunning, double now,
                  gpcd_decision *decisions, int max_decisions, gpcd_pass_stats *stats);

/* ----------------------------------------------------------------- store */

typedef struct gpcd_store gpcd_store;

gpc_status gpcd_store_open(const char *path, gpcd_store **out);
void gpcd_store_close(gpcd_store *store);
/* Makes every job id handed out from now on larger than `above` (gpcd
 * passes the largest id among the files in its jobs folder, so a lost
 * database never gives a new job an id, and a log, an old job had). */
gpc_status gpcd_store_reserve_ids(gpcd_store *store, int64_t above);
/* A value kept in the database's meta table ("" when absent), and setting
 * it (durably). */
gpc_status gpcd_store_meta_get(gpcd_store *store, const char *key, char *value, size_t size);
gpc_status gpcd_store_meta_set(gpcd_store *store, const char *key, const char *value);
/* For tests: every write transaction fails as on a full disk (on = 1),
 * until called with 0. */
void gpcd_store_simulate_full(gpcd_store *store, int on);
/* Inserts a job and commits it durably before returning; concurrent callers
 * share one commit (group commit). Sets job->id. */
gpc_status gpcd_store_submit(gpcd_store *store, gpcd_job *job);
/* Writes a job's state and runtime fields and records the state change. */
gpc_status gpcd_store_update(gpcd_store *store, const gpcd_job *job);
gpc_status gpcd_store_get(gpcd_store *store, int64_t id, gpcd_job **out);
/* Jobs with a state in the mask (1 << state), ordered by id; since_end
 * keeps finished jobs that ended after it (0 = all). */
gpc_status gpcd_store_list(gpcd_store *store, unsigned state_mask, double since_end,
                           gpcd_job ***out, int *count);
/* The `newest` jobs with a state in the mask, latest end time first (jobs
 * that have not ended, end time 0, come last), ties by id, newest first. */
gpc_status gpcd_store_list_recent(gpcd_store *store, unsigned state_mask, int newest,
                                  gpcd_job ***out, int *count);
void gpcd_store_free_list(gpcd_job **jobs, int count);
/* State changes of one job: JSON array [{time, state, message}] as text. */
gpc_status gpcd_store_events(gpcd_store *store, int64_t id, char **json_out);

typedef struct {
    double time;
    int gpu;
    double util;
    uint64_t mem_used;
    uint64_t mem_total;
    double temperature;
    double power;
} gpcd_sample_row;

gpc_status gpcd_store_add_samples(gpcd_store *store, const gpcd_sample_row *rows, int count,
                                  double retention, double now);
gpc_status gpcd_store_count_samples(gpcd_store *store, int64_t *out);
gpc_status gpcd_store_alert_open(gpcd_store *store, int gpu, const char *kind, const char *message,
                                 double now, int64_t *id_out);
gpc_status gpcd_store_alert_close(gpcd_store *store, int64_t id, double now);
/* Removes, oldest first, up to `most` jobs that finished (completed,
 * failed, cancelled) before ended_before, with their events; their ids go
 * to ids (room for `most`) and their number to *count. One transaction:
 * on an error nothing is removed and *count is 0. */
gpc_status gpcd_store_prune_finished(gpcd_store *store, double ended_before, int most, int64_t *ids,
                                     int *count);
/* Counts of jobs by state, indexed by gpcd_state. */
gpc_status gpcd_store_state_counts(gpcd_store *store, int64_t counts[GPCD_STATE_COUNT]);

/* ------------------------------------------------------------------- runner */

/* Starts the job: a supervisor process (own session) forks the command in its
 * own process group with CUDA_VISIBLE_DEVICES set, output appended to
 * log_path (capped at log_max bytes, keeping the head and the latest
 * output; 0 = no cap), and writes the exit status to exit_path when it ends, even if
 * gpcd has died meanwhile. The command runs only once the supervisor has
 * claimed record_path (gpcd_runner_record_path) with its pids. Fills
 * job->pid, pid_start, pgid. */
gpc_status gpcd_runner_start(gpcd_job *job, const char *log_path, const char *exit_path,
                             const char *record_path, uint64_t log_max);
/* The record of one start attempt: jobs_dir/ID.START_MS.run. */
void gpcd_runner_record_path(const char *jobs_dir, const gpcd_job *job, char *buf, size_t size);
/* For recovery of a job recorded as starting without a pid: claims the
 * attempt's record. 0: gpcd won, so the command never ran and never will;
 * 1: the supervisor had claimed it, and job->pid, pid_start and pgid are
 * filled from it; -1: the record can be neither written nor read. */
int gpcd_runner_claim(const char *record_path, gpcd_job *job);
/* Start time of a process in clock ticks since boot, 0 when it is gone. */
uint64_t gpcd_process_start_time(pid_t pid);
/* Whether the supervisor recorded in the job is still the same process. */
int gpcd_runner_alive(const gpcd_job *job);
/* Reads the exit file: 0 when found (exit code or signal set), -1 when absent. */
int gpcd_runner_read_exit(const char *exit_path, int *exit_code, int *signal);
/* Puts each job's command in a cgroup of its own under root (a cgroup v2
 * folder gpcd may create cgroups in, with cgroup.kill); NULL or "" for
 * none. For the whole process. */
void gpcd_runner_use_cgroups(const char *root);
/* The value of GPC_JOB_TAG, set in every job's environment: a hash of the
 * job's exit file path, so unique to one gpcd's job on this machine. */
uint64_t gpcd_runner_job_tag(const char *exit_path);
/* Sends a signal to every process of the job: its process group, its
 * cgroup, and every descendant of its supervisor (a subreaper, so
 * processes that left the group stay descendants). */
void gpcd_runner_signal(const gpcd_job *job, int sig);
/* Reaps finished supervisors that are our children (no blocking). */
void gpcd_runner_reap(void);

/* ------------------------------------------------------------------ monitor */

/* One reading of one GPU, the same for NVML and simulated GPUs. */
typedef struct {
    int index;
    char name[96];
    double util;
    uint64_t mem_used, mem_total;
    double temperature;
    double slowdown_temperature; /* -1 unknown */
    double power, power_limit;   /* -1 unknown */
    double sm_clock_mhz, mem_clock_mhz;
    int64_t throttle_reasons;
    int64_t ecc_uncorrected, xid_count;
    int numa_node;
    int busy; /* a gpcd job runs on it */
    int64_t busy_job;
} gpcd_gpu_reading;

typedef enum {
    GPCD_ALERT_LOW_UTIL = 0,
    GPCD_ALERT_MEMORY,
    GPCD_ALERT_TEMPERATURE,
    GPCD_ALERT_ECC,
    GPCD_ALERT_STORAGE, /* gpcd cannot write its database (a full disk); gpu -1 */
    GPCD_ALERT_KIND_COUNT
} gpcd_alert_kind;

typedef struct {
    int64_t id; /* in the store */
    int gpu;
    gpcd_alert_kind kind;
    double since;
    char message[512];
} gpcd_alert;

typedef struct gpcd_monitor gpcd_monitor;

/* spec is "nvml" or "simulated:8x141GB". NVML without a driver is an error:
 * there is no silent fallback to simulated GPUs. */
gpc_status gpcd_monitor_open(const char *spec, const gpcd_config *config, gpcd_monitor **out);
void gpcd_monitor_close(gpcd_monitor *monitor);
int gpcd_monitor_gpu_count(const gpcd_monitor *monitor);
const char *gpcd_monitor_provider(const gpcd_monitor *monitor);
/* Fills the cluster's static part (count, memory, NUMA, NVLink). */
void gpcd_monitor_topology(const gpcd_monitor *monitor, gpcd_cluster *cluster);
/* Takes a reading of every GPU, updates the cluster's live fields, records
 * the samples in the store (when set) and opens or closes alerts. The
 * running jobs tell which GPUs are busy (and drive simulated GPUs). */
gpc_status gpcd_monitor_sample(gpcd_monitor *monitor, gpcd_cluster *cluster,
                               gpcd_job *const *running, int nrunning, double now);
const gpcd_gpu_reading *gpcd_monitor_readings(const gpcd_monitor *monitor, int *count);
/* Active alerts (pointer into the monitor, valid until the next sample). */
const gpcd_alert *gpcd_monitor_alerts(const gpcd_monitor *monitor, int *count);
/* Links alerts to the store: opened alerts get ids, closed ones end. */
void gpcd_monitor_set_store(gpcd_monitor *monitor, gpcd_store *store);
const char *gpcd_alert_kind_name(gpcd_alert_kind kind);
/* The pids of the processes using a GPU (NVML's compute processes; for
 * simulated GPUs, gpcd jobs' processes with it in CUDA_VISIBLE_DEVICES);
 * -1 when that cannot be told. */
int gpcd_monitor_gpu_processes(gpcd_monitor *monitor, int gpu, int *pids, int max);
/* Opens (on) or closes the storage alert, which belongs to no GPU. */
void gpcd_monitor_storage_alert(gpcd_monitor *monitor, int on, const char *message, double now);

/* ------------------------------------------------------------------- daemon */

typedef struct gpcd_daemon gpcd_daemon;

gpc_status gpcd_daemon_create(const gpcd_config *config, gpcd_daemon **out);
/* Runs the main loop until gpcd_daemon_stop; returns after cleanup. */
gpc_status gpcd_daemon_run(gpcd_daemon *daemon);
/* Async-signal-safe. */
void gpcd_daemon_stop(gpcd_daemon *daemon);
void gpcd_daemon_destroy(gpcd_daemon *daemon);

/* ----------------------------------------------------------- API requests */

typedef enum {
    GPCD_REQ_SUBMIT = 0,
    GPCD_REQ_LIST,
    GPCD_REQ_SHOW,
    GPCD_REQ_LOGS,
    GPCD_REQ_CANCEL,
    GPCD_REQ_GPUS,
    GPCD_REQ_ALERTS,
    GPCD_REQ_METRICS,
    GPCD_REQ_STATUS,
    GPCD_REQ_GPU_DRAIN,  /* POST /gpus/N/drain: no new jobs on GPU N */
    GPCD_REQ_GPU_RESUME, /* POST /gpus/N/resume: back in service */
} gpcd_request_kind;

typedef struct {
    const char *key;
    const char *value;
} gpcd_query_arg;

typedef struct {
    gpcd_request_kind kind;
    int64_t job_id;
    int all;             /* list: include finished jobs */
    unsigned state_mask; /* list: states wanted (0 = default) */
    int recent;          /* list: only the newest this many by end time (0 = all) */
    int gpu;             /* drain, resume: the GPU index */
    int64_t offset;      /* logs */
    int64_t limit;       /* logs */
    gpcd_job *job;       /* submit: the validated job (caller frees) */
} gpcd_request;

/* Stack of each HTTP thread. A request's deepest path is the handler's
 * buffers (about 4 KB), getpwuid_r with the NSS modules under it, SQLite's
 * query execution (tens of KB) and jansson at most 16 levels deep (the
 * parser refuses deeper bodies before parsing, about 250 bytes a level):
 * well under 100 KB, so 512 KB leaves a wide margin. The fuzzer and the
 * tests run the parser on a thread of this size. */
#define GPCD_HTTP_THREAD_STACK (512 * 1024)

/* Parses and validates one request. Returns the HTTP status: 200 when the
 * request is good, else 400/404/405/413 with a message in error. owner_uid
 * and owner become the job's owner for a submission. */
int gpcd_request_parse(const char *method, const char *path, const gpcd_query_arg *args, int nargs,
                       const char *body, size_t body_len, uint32_t owner_uid, const char *owner,
                       gpcd_request *out, char *error, size_t error_size);
void gpcd_request_clear(gpcd_request *request);

/* ---------------------------------------------------------------- client */

typedef struct {
    int status; /* HTTP status */
    char *body; /* malloc'd, NUL-terminated */
    size_t body_len;
    char next_offset[32]; /* X-Gpc-Next-Offset */
    char job_state[32];   /* X-Gpc-Job-State */
} gpcd_response;

/* The socket a client uses: explicit, else $GPC_SOCKET, else the default. */
const char *gpcd_client_socket(const char *explicit_path);
/* One HTTP request to gpcd over its unix socket. When gpcd is not there:
 * GPC_ERR_IO with "gpcd is not running at PATH; start it with ...". */
gpc_status gpcd_client_request(const char *socket_path, const char *method, const char *path,
                               const char *body, gpcd_response *out);
void gpcd_response_free(gpcd_response *response);

#ifdef __cplusplus
}
#endif

#endif /* GPC_SCHED_H */
