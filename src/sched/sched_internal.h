/*
 * sched_internal.h: what gpcd's own files share and nobody else needs: the
 * daemon's state (daemon.c owns it, api.c reads it under its lock) and the
 * metrics renderer's input.
 */
#ifndef GPC_SCHED_INTERNAL_H
#define GPC_SCHED_INTERNAL_H

#include <pthread.h>
#include <signal.h>

#include "gpc/sched.h"

typedef struct {
    const gpcd_gpu_reading *gpus;
    int gpu_count;
    const gpcd_alert *alerts;
    int alert_count;
    int64_t jobs_by_state[GPCD_STATE_COUNT];
    int64_t submitted_total, started_total, preempted_total;
    double last_pass_seconds;
    double uptime_seconds;
    int pending, running;
    double oldest_wait_seconds;
} gpcd_metrics_input;

/* Prometheus text exposition format 0.0.4; malloc'd. */
char *gpcd_metrics_render(const gpcd_metrics_input *in);

struct MHD_Daemon;

struct gpcd_daemon {
    gpcd_config config;
    gpcd_store *store;
    gpcd_monitor *monitor;
    struct MHD_Daemon *http_unix, *http_tcp;
    void *api_state;   /* api.c's listener contexts */
    void *slurm_state; /* slurm.c's, with backend = slurm */
    int listen_fd;
    char token[256];
    char jobs_dir[600];
    char logs_dir[600]; /* jobs_dir, or slurm_log_dir */
    uid_t uid;
    double started_at;
    int wake_fd;
    volatile sig_atomic_t stop;

    /* Everything below is guarded by lock. */
    pthread_mutex_t lock;
    gpcd_cluster cluster;
    gpcd_job **active; /* queued, preempted and running jobs, owned */
    int nactive, cap_active;
    int dirty; /* a pass is due */
    /* The database refuses writes (a full disk): the storage alert is open,
     * no job starts, and jobs whose change is unsaved stay in memory until
     * a retry saves them. */
    int storage_failing;
    double storage_retry_at;
    /* GPUs whose last job ended while processes of it may still hold them:
     * the job's id, until the monitor sees none of its processes there */
    int64_t gpu_held_by[GPCD_MAX_GPUS];
    double held_check_at;
    /* GPUs taken out of service (a hardware-error alert, or an admin) until
     * an admin resumes them; saved in the database's meta table */
    int gpu_drained[GPCD_MAX_GPUS];
    char drain_reason[GPCD_MAX_GPUS][200];
    int64_t drained_for_alert[GPCD_MAX_GPUS]; /* the alert that drained it, once */
    int64_t submitted_total, started_total, preempted_total;
    double last_pass_seconds;
    gpcd_pass_stats last_pass;
};

/* api.c */
gpc_status gpcd_api_start(gpcd_daemon *daemon);
void gpcd_api_stop(gpcd_daemon *daemon);

/* dashboard.c: the web page served at / (static HTML and JavaScript) */
const char *gpcd_dashboard_page(size_t *len);

/* slurm.c: backend = slurm. The poll runs from the main loop (it takes the
 * lock itself, and runs Slurm's commands without it). */
int gpcd_slurm_enabled(const gpcd_daemon *daemon);
gpc_status gpcd_slurm_start(gpcd_daemon *daemon);
void gpcd_slurm_poll(gpcd_daemon *daemon);
void gpcd_slurm_stop(gpcd_daemon *daemon);
/* Whether the job was handed to Slurm already (0 with the local backend). */
int gpcd_slurm_submitted(gpcd_daemon *daemon, int64_t job);
/* Removes a finished job's files of the Slurm backend (its batch script and
 * the record of its Slurm id); the local backend writes neither. */
void gpcd_slurm_remove_files(const gpcd_daemon *daemon, int64_t job);

/* daemon.c: operations the API calls */
void gpcd_daemon_wake(gpcd_daemon *daemon);
/* Saves a validated job and queues it; returns the HTTP status and writes
 * the reply ({"id":N}) or the error into body. On 201 the daemon owns the
 * job; otherwise the caller still does. */
int gpcd_daemon_submit(gpcd_daemon *daemon, gpcd_job *job, char *body, size_t size);
int gpcd_daemon_cancel(gpcd_daemon *daemon, int64_t id, uid_t caller, char *body, size_t size);
void gpcd_daemon_log_path(const gpcd_daemon *daemon, int64_t id, char *buf, size_t size);
/* "no job ID", and when keep_finished is set, that gpcd removes old jobs. */
void gpcd_daemon_no_job(const gpcd_daemon *daemon, int64_t id, char *buf, size_t size);
/* Under the lock: a job's state as gpcd holds it when the database has not
 * caught up (job->unsaved), copied over what the store returned. */
void gpcd_daemon_overlay_unsaved(gpcd_daemon *daemon, gpcd_job *job);
/* Drains (on) or resumes a GPU for an admin (root or gpcd's own user);
 * returns the HTTP status with the reply or error in body. */
int gpcd_daemon_drain(gpcd_daemon *daemon, int gpu, int on, uid_t caller, char *body, size_t size);

#endif /* GPC_SCHED_INTERNAL_H */
