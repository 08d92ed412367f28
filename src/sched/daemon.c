/*
 * daemon.c: gpcd's main loop and the operations that change jobs.
 *
 * One thread runs the loop: it watches running jobs (exit, time limits,
 * SIGTERM-then-SIGKILL escalation), samples the GPUs every sample_interval,
 * and runs a scheduling pass whenever something changed (and once a second,
 * since aging moves waiting jobs up). HTTP threads (api.c) submit and cancel
 * under the same lock; a submission is in the database before it is queued
 * in memory, so a crash at any point loses nothing that was acknowledged.
 *
 * Stopping gpcd leaves running jobs alone: their supervisors keep them going
 * and the next gpcd re-attaches to them (runner.c).
 */
#include "sched/sched_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#define LOOP_TICK_MS 50

void gpcd_daemon_log_path(const gpcd_daemon *d, int64_t id, char *buf, size_t size) {
    snprintf(buf, size, "%s/%lld.log", d->logs_dir, (long long)id);
}

void gpcd_daemon_no_job(const gpcd_daemon *d, int64_t id, char *buf, size_t size) {
    double keep = d->config.keep_finished;
    if (keep <= 0) {
        snprintf(buf, size, "no job %lld", (long long)id);
        return;
    }
    /* keep_finished as it would be written: 30d, 12h, 90m, 45s */
    const double units[] = {86400, 3600, 60, 1};
    const char *names = "dhms";
    int u = 0;
    while (u < 3 && fmod(keep, units[u]) != 0)
        u++;
    snprintf(buf, size, "no job %lld (gpcd removes jobs %g%c after they end: keep_finished)",
             (long long)id, keep / units[u], names[u]);
}

static void exit_path(const gpcd_daemon *d, int64_t id, char *buf, size_t size) {
    snprintf(buf, size, "%s/%lld.exit", d->jobs_dir, (long long)id);
}

void gpcd_daemon_wake(gpcd_daemon *d) {
    uint64_t one = 1;
    if (write(d->wake_fd, &one, sizeof one) < 0) {
        /* the counter is full: the loop is awake anyway */
    }
}

void gpcd_daemon_stop(gpcd_daemon *d) {
    d->stop = 1;
    gpcd_daemon_wake(d);
}

static void set_message(gpcd_job *job, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void set_message(gpcd_job *job, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    free(job->message);
    job->message = strdup(buf);
}

static gpc_status add_active(gpcd_daemon *d, gpcd_job *job) {
    if (d->nactive == d->cap_active) {
        int cap = d->cap_active ? d->cap_active * 2 : 256;
        gpcd_job **grown = realloc(d->active, sizeof *grown * (size_t)cap);
        if (!grown) return gpc_error(GPC_ERR_NOMEM, "out of memory queueing a job");
        d->active = grown;
        d->cap_active = cap;
    }
    d->active[d->nactive++] = job;
    d->dirty = 1;
    return GPC_OK;
}

static void remove_active(gpcd_daemon *d, int index) {
    gpcd_job_free(d->active[index]);
    d->active[index] = d->active[--d->nactive];
    d->dirty = 1;
}

/* The database refused a write: raise the storage alert (once). */
static void storage_trouble(gpcd_daemon *d, const char *why) {
    if (d->storage_failing) return;
    d->storage_failing = 1;
    d->storage_retry_at = gpc_time_seconds() + 1.0;
    char message[512];
    snprintf(message, sizeof message,
             "gpcd cannot write its database (%.300s): free space on the state filesystem; no "
             "job starts until it can, and nothing is lost",
             why);
    gpcd_monitor_storage_alert(d->monitor, 1, message, gpc_wall_seconds());
}

/* Saves a job's change. When the database refuses, the job is marked
 * unsaved and kept in memory (finished or not) until a retry saves it, so
 * what gpcd reports and what it would recover never part ways. */
static gpc_status save(gpcd_daemon *d, gpcd_job *job) {
    gpc_status st = gpcd_store_update(d->store, job);
    if (st != GPC_OK) {
        gpc_log(GPC_LOG_ERROR, "job %lld: %s", (long long)job->id, gpc_last_error());
        job->unsaved = 1;
        storage_trouble(d, gpc_last_error());
    } else {
        job->unsaved = 0;
    }
    return st;
}

/* Once a second while the database refuses writes: saves what is unsaved;
 * when everything is, the alert closes and finished jobs leave memory. */
static void storage_retry(gpcd_daemon *d, double now) {
    if (!d->storage_failing || now < d->storage_retry_at) return;
    d->storage_retry_at = now + 1.0;
    int ok = gpcd_store_reserve_ids(d->store, 0) == GPC_OK; /* a write with no unsaved job */
    for (int i = 0; ok && i < d->nactive; i++)
        if (d->active[i]->unsaved && gpcd_store_update(d->store, d->active[i]) != GPC_OK) ok = 0;
    if (!ok) return;
    for (int i = 0; i < d->nactive; i++) {
        d->active[i]->unsaved = 0;
        if (gpcd_state_is_final(d->active[i]->state)) remove_active(d, i--);
    }
    d->storage_failing = 0;
    d->dirty = 1;
    gpcd_monitor_storage_alert(d->monitor, 0, NULL, gpc_wall_seconds());
    gpc_log(GPC_LOG_INFO, "the database takes writes again; every change is saved");
}

void gpcd_daemon_overlay_unsaved(gpcd_daemon *d, gpcd_job *job) {
    /* a job is unsaved only while the database refuses writes: otherwise
     * there is nothing to overlay, and a list of N jobs need not walk the
     * active jobs N times (10,000 queued: 10^8 steps under d->lock) */
    if (!d->storage_failing) return;
    for (int i = 0; i < d->nactive; i++) {
        const gpcd_job *a = d->active[i];
        if (a->id != job->id || !a->unsaved) continue;
        job->state = a->state;
        job->exit_code = a->exit_code;
        job->signal = a->signal;
        job->end_time = a->end_time;
        free(job->message);
        char note[600];
        snprintf(note, sizeof note, "%s%snot saved yet: gpcd cannot write its database",
                 a->message ? a->message : "", a->message ? "; " : "");
        job->message = strdup(note);
    }
}

/* ------------------------------------------------------------- settling */

/* Records how a job whose supervisor is gone ended. */
static void settle(gpcd_daemon *d, gpcd_job *job, int recovering) {
    char path[700], record[700];
    exit_path(d, job->id, path, sizeof path);
    gpcd_runner_record_path(d->jobs_dir, job, record, sizeof record);
    unlink(record); /* this attempt is over */
    int code = -1, sig = 0;
    int have_exit = gpcd_runner_read_exit(path, &code, &sig) == 0;
    if (!recovering && job->pgid > 1) kill(-job->pgid, SIGKILL); /* stragglers it left */
    job->end_time = gpc_wall_seconds();
    job->exit_code = have_exit ? code : -1;
    job->signal = have_exit ? sig : 0;
    switch (job->stop_reason) {
    case GPCD_STOP_PREEMPT:
        job->state = GPCD_PREEMPTED;
        job->preemptions++;
        job->end_time = 0;
        set_message(job, "%s",
                    gpcd_job_elastic(job)
                        ? "preempted by higher priority work; restarts on the GPUs then free"
                        : "preempted by higher priority work; waiting to run again");
        break;
    case GPCD_STOP_RESIZE:
        /* not a preemption: it does not count against the job's protection */
        job->state = GPCD_PREEMPTED;
        job->end_time = 0;
        set_message(job, "stopped to grow; restarts on more GPUs");
        break;
    case GPCD_STOP_CANCEL:
        job->state = GPCD_CANCELLED;
        set_message(job, "cancelled while running");
        break;
    case GPCD_STOP_TIMEOUT:
        job->state = GPCD_FAILED;
        set_message(job, "stopped at its time limit of %.0f s", job->time_limit);
        break;
    default:
        if (!have_exit) {
            job->state = GPCD_FAILED;
            set_message(job, "%s",
                        recovering ? "its process was gone after gpcd restarted and left no "
                                     "exit status"
                                   : "its supervisor vanished without an exit status");
        } else if (code == 0) {
            job->state = GPCD_COMPLETED;
            free(job->message);
            job->message = NULL;
        } else if (sig) {
            job->state = GPCD_FAILED;
            set_message(job, "killed by signal %d", sig);
        } else {
            job->state = GPCD_FAILED;
            set_message(job, "exited with status %d%s", code,
                        code == 127 ? " (command not found: see gpc logs)" : "");
        }
        if (recovering && have_exit)
            set_message(job, "%s (finished while gpcd was down)",
                        job->message ? job->message : "completed");
    }
    job->assigned_count = 0;
    job->pid = 0;
    job->pid_start = 0;
    job->pgid = 0;
    job->stop_reason = GPCD_STOP_NONE;
    job->term_sent = 0;
    job->kill_sent = 0;
    if (job->state == GPCD_PREEMPTED) {
        job->exit_code = -1;
        job->signal = 0;
        job->start_time = 0;
    }
    save(d, job);
    gpc_log(GPC_LOG_INFO, "job %lld %s%s%s", (long long)job->id, gpcd_state_name(job->state),
            job->message ? ": " : "", job->message ? job->message : "");
}

/* A GPU takes jobs only when neither drained nor held. */
static void update_availability(gpcd_daemon *d, int g) {
    int unavailable = d->gpu_drained[g] || d->gpu_held_by[g] != 0;
    if (d->cluster.gpu[g].unavailable && !unavailable) d->dirty = 1;
    d->cluster.gpu[g].unavailable = unavailable;
}

/* Saves the drained GPUs ("0,3") so that a restart keeps them out. */
static void save_drained(gpcd_daemon *d) {
    char list[GPCD_MAX_GPUS * 4] = "";
    size_t used = 0;
    for (int g = 0; g < d->cluster.count; g++)
        if (d->gpu_drained[g])
            used += (size_t)snprintf(list + used, sizeof list - used, used ? ",%d" : "%d", g);
    if (gpcd_store_meta_set(d->store, "drained_gpus", list) != GPC_OK)
        gpc_log(GPC_LOG_ERROR, "drained GPUs not saved: %s", gpc_last_error());
}

static void drain(gpcd_daemon *d, int g, int on, const char *reason) {
    d->gpu_drained[g] = on;
    snprintf(d->drain_reason[g], sizeof d->drain_reason[g], "%s", on ? reason : "");
    update_availability(d, g);
    save_drained(d);
    if (on)
        gpc_log(GPC_LOG_WARN, "GPU %d drained (%s): no new jobs until 'gpc gpu resume %d'", g,
                reason, g);
    else
        gpc_log(GPC_LOG_INFO, "GPU %d back in service", g);
}

/* A hardware-error alert (uncorrectable ECC, XID: a GPU fallen off the bus)
 * drains its GPU: jobs already there carry on, new ones go elsewhere, until
 * an admin resumes it. Each alert drains once, so a resume sticks while it
 * lasts. */
static void drain_on_alerts(gpcd_daemon *d) {
    int n;
    const gpcd_alert *alerts = gpcd_monitor_alerts(d->monitor, &n);
    for (int i = 0; i < n; i++) {
        const gpcd_alert *a = &alerts[i];
        if (a->kind != GPCD_ALERT_ECC || a->gpu < 0 || a->gpu >= d->cluster.count) continue;
        if (d->gpu_drained[a->gpu] || d->drained_for_alert[a->gpu] == a->id + 1) continue;
        d->drained_for_alert[a->gpu] = a->id + 1;
        char reason[200];
        snprintf(reason, sizeof reason, "hardware errors: %.170s", a->message);
        drain(d, a->gpu, 1, reason);
    }
}

int gpcd_daemon_drain(gpcd_daemon *d, int gpu, int on, uid_t caller, char *body, size_t size) {
    if (caller != 0 && caller != d->uid) {
        snprintf(body, size, "only root or gpcd's own user may %s a GPU", on ? "drain" : "resume");
        return 403;
    }
    pthread_mutex_lock(&d->lock);
    if (gpu >= d->cluster.count) {
        snprintf(body, size, "no GPU %d (this server has %d)", gpu, d->cluster.count);
        pthread_mutex_unlock(&d->lock);
        return 404;
    }
    drain(d, gpu, on, "drained by an administrator");
    pthread_mutex_unlock(&d->lock);
    gpcd_daemon_wake(d);
    snprintf(body, size, "{\"gpu\":%d,\"drained\":%s}", gpu, on ? "true" : "false");
    return 200;
}

/* The job's GPUs are not handed on until no process of it holds them
 * (release_gpus checks); settle runs first, so take them before. */
static void hold_gpus(gpcd_daemon *d, const gpcd_job *job) {
    for (int a = 0; a < job->assigned_count; a++) {
        int g = job->assigned[a];
        if (g < 0 || g >= d->cluster.count) continue;
        d->gpu_held_by[g] = job->id;
        update_availability(d, g);
    }
    d->held_check_at = 0;
}

/* Whether process pid carries the job's GPC_JOB_TAG: one of its processes
 * (GPC_JOB_ID alone would match another gpcd's job of the same id). */
static int process_of_job(gpcd_daemon *d, int pid, int64_t id) {
    char path[700], want[48];
    static char env[65536];
    exit_path(d, id, path, sizeof path);
    snprintf(want, sizeof want, "GPC_JOB_TAG=%016llx",
             (unsigned long long)gpcd_runner_job_tag(path));
    snprintf(path, sizeof path, "/proc/%d/environ", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t len = fread(env, 1, sizeof env - 1, f);
    fclose(f);
    env[len] = '\0';
    for (size_t i = 0; i < len; i += strlen(env + i) + 1)
        if (strcmp(env + i, want) == 0) return 1;
    return 0;
}

/* Hands held GPUs on once the monitor (NVML, or the simulation) shows no
 * process of their last job on them; such a process is killed (the job is
 * over: its cgroup or supervisor should have ended it already). */
static void release_gpus(gpcd_daemon *d, double now) {
    if (now < d->held_check_at) return;
    d->held_check_at = now + 0.2;
    for (int g = 0; g < d->cluster.count; g++) {
        if (!d->gpu_held_by[g]) continue;
        int pids[128], held = 0;
        int n = gpcd_monitor_gpu_processes(d->monitor, g, pids, 128);
        for (int i = 0; i < n; i++)
            if (process_of_job(d, pids[i], d->gpu_held_by[g])) {
                held = 1;
                kill(pids[i], SIGKILL);
                gpc_log(GPC_LOG_WARN, "GPU %d: process %d of ended job %lld still holds it; killed",
                        g, pids[i], (long long)d->gpu_held_by[g]);
            }
        if (held) continue;
        d->gpu_held_by[g] = 0;
        update_availability(d, g);
    }
}

static void watch_running(gpcd_daemon *d, double now) {
    for (int i = 0; i < d->nactive; i++) {
        gpcd_job *job = d->active[i];
        if (job->state != GPCD_RUNNING) continue;
        if (!gpcd_runner_alive(job)) {
            hold_gpus(d, job);
            settle(d, job, 0);
            d->dirty = 1;
            if (gpcd_state_is_final(job->state) && !job->unsaved) remove_active(d, i--);
            continue;
        }
        if (job->stop_reason == GPCD_STOP_NONE && job->time_limit > 0 &&
            now - job->start_time > job->time_limit) {
            job->stop_reason = GPCD_STOP_TIMEOUT;
            job->term_sent = now;
            gpcd_runner_signal(job, SIGTERM);
            gpc_log(GPC_LOG_INFO, "job %lld passed its time limit; sent SIGTERM",
                    (long long)job->id);
        }
        if (job->term_sent > 0 && !job->kill_sent) {
            double grace = job->stop_reason == GPCD_STOP_TIMEOUT ? d->config.kill_grace
                                                                 : d->config.preempt_grace;
            if (now - job->term_sent >= grace) {
                gpcd_runner_signal(job, SIGKILL);
                job->kill_sent = 1;
            }
        }
    }
}

/* ----------------------------------------------------------- scheduling */

static void start_job(gpcd_daemon *d, gpcd_job *job, const int *gpus, int k) {
    gpcd_state waiting = job->state;
    job->state = GPCD_RUNNING;
    job->start_time = gpc_wall_seconds();
    job->gpus = k; /* an elastic job's count for this run */
    job->assigned_count = k;
    memcpy(job->assigned, gpus, sizeof(int) * (size_t)k);
    job->exit_code = -1;
    job->signal = 0;
    set_message(job, "starting");
    job->pid = 0;
    /* Recorded as starting, durably, before the fork; a job whose start
     * cannot be saved does not start (it would be lost, or run again, after
     * a restart). After a crash in between, recovery claims the attempt's
     * record (runner.c) to learn whether the command ran. */
    if (save(d, job) != GPC_OK) {
        job->state = waiting;
        job->start_time = 0;
        job->assigned_count = 0;
        set_message(job, "waiting: its start could not be saved (%s)", gpc_last_error());
        return;
    }
    char log_path[700], exit_file[700], record[700];
    gpcd_daemon_log_path(d, job->id, log_path, sizeof log_path);
    exit_path(d, job->id, exit_file, sizeof exit_file);
    gpcd_runner_record_path(d->jobs_dir, job, record, sizeof record);
    if (gpcd_runner_start(job, log_path, exit_file, record, d->config.log_max) != GPC_OK) {
        job->state = GPCD_FAILED;
        job->end_time = gpc_wall_seconds();
        job->assigned_count = 0;
        set_message(job, "could not start: %s", gpc_last_error());
        gpc_log(GPC_LOG_ERROR, "job %lld %s", (long long)job->id, job->message);
    } else {
        free(job->message);
        job->message = NULL;
        d->started_total++;
        gpc_log(GPC_LOG_INFO, "job %lld started on %d GPU(s), pid %d", (long long)job->id, k,
                (int)job->pgid);
    }
    save(d, job);
}

static void schedule(gpcd_daemon *d) {
    gpcd_job **pending = malloc(sizeof *pending * (size_t)(d->nactive + 1));
    gpcd_job **running = malloc(sizeof *running * (size_t)(d->nactive + 1));
    int max_decisions = d->cluster.count * 4 + 16;
    gpcd_decision *decisions = malloc(sizeof *decisions * (size_t)max_decisions);
    if (!pending || !running || !decisions) goto out;
    int np = 0, nr = 0;
    for (int i = 0; i < d->nactive; i++) {
        if (gpcd_state_is_pending(d->active[i]->state))
            pending[np++] = d->active[i];
        else if (d->active[i]->state == GPCD_RUNNING)
            running[nr++] = d->active[i];
    }
    double t0 = gpc_time_seconds();
    int n = gpcd_schedule(&d->config.policy, &d->cluster, pending, np, running, nr,
                          gpc_wall_seconds(), decisions, max_decisions, &d->last_pass);
    d->last_pass_seconds = gpc_time_seconds() - t0;
    for (int i = 0; i < n; i++) {
        gpcd_decision *dec = &decisions[i];
        if (dec->kind == GPCD_DECIDE_START) {
            start_job(d, dec->job, dec->gpus, dec->gpu_count);
        } else if (dec->job->stop_reason == GPCD_STOP_NONE) {
            int resize = dec->kind == GPCD_DECIDE_RESIZE;
            dec->job->stop_reason = resize ? GPCD_STOP_RESIZE : GPCD_STOP_PREEMPT;
            dec->job->term_sent = gpc_wall_seconds();
            gpcd_runner_signal(dec->job, SIGTERM);
            if (!resize) d->preempted_total++;
            if (resize)
                gpc_log(GPC_LOG_INFO,
                        "elastic job %lld stopped to grow from %d to %d GPUs (SIGTERM, %.0f s "
                        "grace)",
                        (long long)dec->job->id, dec->job->assigned_count, dec->gpu_count,
                        d->config.preempt_grace);
            else
                gpc_log(GPC_LOG_INFO, "job %lld preempted (SIGTERM, %.0f s grace)",
                        (long long)dec->job->id, d->config.preempt_grace);
        }
    }
    /* jobs that failed to start are final */
    for (int i = 0; i < d->nactive; i++)
        if (gpcd_state_is_final(d->active[i]->state) && !d->active[i]->unsaved)
            remove_active(d, i--);
out:
    free(pending);
    free(running);
    free(decisions);
}

static void running_jobs(gpcd_daemon *d, gpcd_job **out, int *n) {
    *n = 0;
    for (int i = 0; i < d->nactive; i++)
        if (d->active[i]->state == GPCD_RUNNING) out[(*n)++] = d->active[i];
}

static void sample(gpcd_daemon *d, double now) {
    gpcd_job **running = malloc(sizeof *running * (size_t)(d->nactive + 1));
    int n = 0;
    if (!running) return;
    running_jobs(d, running, &n);
    if (gpcd_monitor_sample(d->monitor, &d->cluster, running, n, now) != GPC_OK)
        gpc_log(GPC_LOG_WARN, "monitor: %s", gpc_last_error());
    free(running);
}

/* ------------------------------------------------------------- recovery */

static gpc_status recover(gpcd_daemon *d) {
    gpcd_job **jobs;
    int n;
    unsigned mask = (1u << GPCD_QUEUED) | (1u << GPCD_RUNNING) | (1u << GPCD_PREEMPTED);
    GPC_TRY(gpcd_store_list(d->store, mask, 0, &jobs, &n));
    int reattached = 0, settled = 0, queued = 0;
    for (int i = 0; i < n; i++) {
        gpcd_job *job = jobs[i];
        jobs[i] = NULL;
        job->data_numa = gpcd_data_numa_node(&d->config.policy, job->data);
        if (gpcd_slurm_enabled(d)) {
            /* backend = slurm: Slurm runs them; slurm.c picks up where it was */
            queued++;
        } else if (job->state == GPCD_RUNNING) {
            int claimed = 1;
            if (job->pid <= 0) {
                /* gpcd stopped while starting it: the attempt's record says
                 * whether the command ran (and which processes it has) */
                char record[700];
                gpcd_runner_record_path(d->jobs_dir, job, record, sizeof record);
                claimed = gpcd_runner_claim(record, job);
                if (claimed <= 0) {
                    /* the claim stays: a supervisor of that attempt still
                     * on its way finds it and does not run the command */
                    if (claimed < 0)
                        gpc_log(GPC_LOG_WARN, "job %lld: cannot write or read %s: %s",
                                (long long)job->id, record, strerror(errno));
                    job->state = GPCD_QUEUED;
                    job->start_time = 0;
                    job->assigned_count = 0;
                    job->pid = job->pgid = 0;
                    job->pid_start = 0;
                    set_message(job, "gpcd stopped while starting it, before it ran; waiting "
                                     "to run");
                    /* nothing of the command is in it: the next start creates
                     * the log afresh, exclusively */
                    char log_path[700];
                    gpcd_daemon_log_path(d, job->id, log_path, sizeof log_path);
                    if (claimed == 0) unlink(log_path);
                    save(d, job);
                    queued++;
                }
            }
            if (claimed <= 0) {
                /* requeued above */
            } else if (job->pid > 0 && gpcd_runner_alive(job)) {
                save(d, job); /* the pids found in the record */
                reattached++;
            } else {
                hold_gpus(d, job);
                settle(d, job, 1);
                settled++;
                if (gpcd_state_is_final(job->state)) {
                    gpcd_job_free(job);
                    continue;
                }
            }
        } else {
            queued++;
        }
        if (add_active(d, job) != GPC_OK) {
            gpcd_job_free(job);
            gpcd_store_free_list(jobs, n);
            return GPC_ERR_NOMEM;
        }
    }
    gpcd_store_free_list(jobs, n);
    gpc_log(GPC_LOG_INFO, "recovered %d waiting job(s), re-attached %d running, settled %d", queued,
            reattached, settled);
    return GPC_OK;
}

/* The largest job id among the files of a jobs folder (ID.log, ID.exit,
 * ID.START.run, ID.sbatch...), 0 when none. */
static int64_t largest_file_id(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int64_t largest = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *p = e->d_name;
        int64_t id = 0;
        int digits = 0;
        while (*p >= '0' && *p <= '9' && digits < 16) {
            id = id * 10 + (*p++ - '0');
            digits++;
        }
        if (digits && *p == '.' && id > largest) largest = id;
    }
    closedir(d);
    return largest;
}

/* The cgroup v2 folder gpcd itself runs in, when gpcd may make cgroups
 * there that have cgroup.kill (Linux 5.14): tried by making one. Writes ""
 * otherwise (no cgroup v2, no permission: a child subreaper then finds the
 * job's processes, runner.c). */
static void find_cgroup_root(char *root, size_t size) {
    root[0] = '\0';
    char mount[512] = "", line[1024], path[1024] = "";
    FILE *f = fopen("/proc/self/mountinfo", "r");
    while (f && fgets(line, sizeof line, f)) {
        char point[512], type[64];
        const char *dash = strstr(line, " - ");
        if (dash && sscanf(dash, " - %63s", type) == 1 && strcmp(type, "cgroup2") == 0 &&
            sscanf(line, "%*s %*s %*s %*s %511s", point) == 1)
            snprintf(mount, sizeof mount, "%s", point);
    }
    if (f) fclose(f);
    f = fopen("/proc/self/cgroup", "r");
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "0::", 3) == 0) {
            line[strcspn(line, "\n")] = '\0';
            snprintf(path, sizeof path, "%s", line + 3);
        }
    if (f) fclose(f);
    if (!mount[0] || !path[0] || strlen(mount) + strlen(path) >= 1000) return;
    char candidate[1100], probe[1200], kill_file[1300];
    snprintf(candidate, sizeof candidate, "%.511s%.511s", mount,
             strcmp(path, "/") == 0 ? "" : path);
    snprintf(probe, sizeof probe, "%s/gpcd-probe-%d", candidate, (int)getpid());
    if (mkdir(probe, 0755) != 0) return;
    snprintf(kill_file, sizeof kill_file, "%s/cgroup.kill", probe);
    int has_kill = access(kill_file, W_OK) == 0;
    rmdir(probe);
    if (has_kill && strlen(candidate) < size) snprintf(root, size, "%s", candidate);
}

/* -------------------------------------------------- operations for the API */

int gpcd_daemon_submit(gpcd_daemon *d, gpcd_job *job, char *error, size_t size) {
    pthread_mutex_lock(&d->lock);
    int gpu_count = d->cluster.count;
    uint64_t largest = 0;
    for (int g = 0; g < gpu_count; g++)
        if (d->cluster.gpu[g].mem_total > largest) largest = d->cluster.gpu[g].mem_total;
    pthread_mutex_unlock(&d->lock);
    if (gpcd_slurm_enabled(d)) gpu_count = GPCD_MAX_GPUS, largest = UINT64_MAX; /* Slurm judges */
    if (gpcd_job_min_gpus(job) > gpu_count) {
        snprintf(error, size, "the job asks for %d%s GPUs; this server has %d",
                 gpcd_job_min_gpus(job), gpcd_job_elastic(job) ? " or more" : "", gpu_count);
        return 400;
    }
    if (gpcd_job_elastic(job) && job->gpus_max > gpu_count) {
        /* more than the server has is never free: the range ends at all of it */
        job->gpus_max = job->gpus = gpu_count;
        if (job->gpus_max == job->gpus_min) job->gpus_min = job->gpus_max = 0;
    }
    if (job->mem > largest) {
        snprintf(error, size,
                 "the job asks for %.1f GiB per GPU; the largest GPU here has %.1f GiB",
                 job->mem / 1073741824.0, largest / 1073741824.0);
        return 400;
    }
    job->state = GPCD_QUEUED;
    job->submit_time = gpc_wall_seconds();
    job->data_numa = gpcd_data_numa_node(&d->config.policy, job->data);
    if (gpcd_store_submit(d->store, job) != GPC_OK) {
        snprintf(error, size,
                 "%s; gpcd cannot save new jobs until its state filesystem has room (try again "
                 "later)",
                 gpc_last_error());
        pthread_mutex_lock(&d->lock);
        storage_trouble(d, gpc_last_error());
        pthread_mutex_unlock(&d->lock);
        return 507;
    }
    int64_t id = job->id; /* once queued, the main loop owns (and may free) the job */
    pthread_mutex_lock(&d->lock);
    d->submitted_total++;
    gpc_status st = add_active(d, job);
    pthread_mutex_unlock(&d->lock);
    if (st != GPC_OK) {
        /* saved but not queued in memory: the next restart picks it up */
        snprintf(error, size, "job %lld was saved but not queued (%s); restart gpcd", (long long)id,
                 gpc_last_error());
        return 503;
    }
    gpcd_daemon_wake(d);
    snprintf(error, size, "{\"id\":%lld}", (long long)id);
    return 201;
}

int gpcd_daemon_cancel(gpcd_daemon *d, int64_t id, uid_t caller, char *body, size_t size) {
    pthread_mutex_lock(&d->lock);
    int index = -1;
    for (int i = 0; i < d->nactive; i++)
        if (d->active[i]->id == id) index = i;
    if (index < 0) {
        pthread_mutex_unlock(&d->lock);
        gpcd_job *job = NULL;
        if (gpcd_store_get(d->store, id, &job) != GPC_OK) {
            gpcd_daemon_no_job(d, id, body, size);
            return 404;
        }
        snprintf(body, size, "job %lld has already %s", (long long)id,
                 job->state == GPCD_CANCELLED ? "been cancelled" : "ended");
        gpcd_job_free(job);
        return 409;
    }
    gpcd_job *job = d->active[index];
    if (gpcd_state_is_final(job->state)) { /* ended, its end not saved yet */
        snprintf(body, size,
                 "job %lld has already ended (%s); gpcd cannot write its database yet, so the "
                 "end is not saved",
                 (long long)id, gpcd_state_name(job->state));
        pthread_mutex_unlock(&d->lock);
        return 409;
    }
    if (caller != 0 && caller != job->owner_uid) {
        snprintf(body, size,
                 "job %lld belongs to %s (uid %u); only its owner or root may cancel it",
                 (long long)id, job->owner ? job->owner : "another user", job->owner_uid);
        pthread_mutex_unlock(&d->lock);
        return 403;
    }
    int status;
    if (gpcd_state_is_pending(job->state) && !gpcd_slurm_submitted(d, job->id)) {
        job->state = GPCD_CANCELLED;
        job->end_time = gpc_wall_seconds();
        set_message(job, "cancelled before it started");
        if (save(d, job) == GPC_OK) remove_active(d, index); /* else kept until saved */
        snprintf(body, size, "{\"id\":%lld,\"state\":\"cancelled\"}", (long long)id);
        status = 200;
    } else {
        if (job->stop_reason != GPCD_STOP_CANCEL) {
            job->stop_reason = GPCD_STOP_CANCEL;
            if (job->term_sent == 0) {
                job->term_sent = gpc_wall_seconds();
                gpcd_runner_signal(job, SIGTERM);
            }
        }
        snprintf(body, size, "{\"id\":%lld,\"state\":\"cancelling\"}", (long long)id);
        status = 202;
    }
    pthread_mutex_unlock(&d->lock);
    gpcd_daemon_wake(d);
    return status;
}

/* ------------------------------------------------------------- lifecycle */

gpc_status gpcd_daemon_create(const gpcd_config *config, gpcd_daemon **out) {
    *out = NULL;
    gpcd_daemon *d = calloc(1, sizeof *d);
    if (!d) return gpc_error(GPC_ERR_NOMEM, "out of memory starting gpcd");
    d->config = *config;
    d->listen_fd = -1;
    d->wake_fd = -1;
    d->uid = geteuid();
    d->started_at = gpc_wall_seconds();
    pthread_mutex_init(&d->lock, NULL);
    gpc_status st = gpcd_config_finish(&d->config);
    if (st == GPC_OK) st = gpc_mkdir_p(d->config.state_dir);
    if (st == GPC_OK) {
        /* Owner-only, but where other users must reach a path inside it
         * (the socket, when socket_mode lets them in; Slurm's jobs opening
         * their logs in STATE_DIR/jobs) they may traverse it, never list it. */
        size_t dir_len = strlen(d->config.state_dir);
        int socket_inside = strncmp(d->config.socket, d->config.state_dir, dir_len) == 0 &&
                            d->config.socket[dir_len] == '/';
        int slurm_logs_inside =
            strcmp(d->config.backend, "slurm") == 0 && !d->config.slurm_log_dir[0];
        int traverse = (socket_inside && (d->config.socket_mode & 077)) || slurm_logs_inside;
        if (chmod(d->config.state_dir, traverse ? 0711 : 0700) != 0)
            st = gpc_error(GPC_ERR_IO, "cannot set the mode of state_dir %s: %s",
                           d->config.state_dir, strerror(errno));
    }
    if (st == GPC_OK) {
        snprintf(d->jobs_dir, sizeof d->jobs_dir, "%s/jobs", d->config.state_dir);
        st = gpc_mkdir_p(d->jobs_dir);
        /* Slurm opens a job's output as the job's user: the folder must let
         * users reach their own (pre-created, owner-only) log file */
        int slurm = strcmp(d->config.backend, "slurm") == 0;
        chmod(d->jobs_dir, slurm && !d->config.slurm_log_dir[0] ? 0711 : 0700);
        snprintf(d->logs_dir, sizeof d->logs_dir, "%s",
                 d->config.slurm_log_dir[0] ? d->config.slurm_log_dir : d->jobs_dir);
        if (st == GPC_OK && d->config.slurm_log_dir[0] && !gpc_path_is_dir(d->logs_dir)) {
            st = gpc_mkdir_p(d->logs_dir);
            if (st == GPC_OK) chmod(d->logs_dir, 0711);
        }
    }
    if (st == GPC_OK && d->config.token_file[0]) {
        /* the token starts jobs as gpcd's user: a file others can read
         * hands that to them */
        struct stat token_stat;
        if (stat(d->config.token_file, &token_stat) == 0 && (token_stat.st_mode & 077))
            st = gpc_error(GPC_ERR_INVALID_ARG,
                           "token_file %s can be read or changed by other users (mode %04o); "
                           "run chmod 600 %s, since whoever has the token runs jobs as gpcd's "
                           "user",
                           d->config.token_file, (unsigned)(token_stat.st_mode & 07777),
                           d->config.token_file);
    }
    if (st == GPC_OK && d->config.token_file[0]) {
        char *text = NULL;
        size_t len = 0;
        st = gpc_read_file(d->config.token_file, &text, &len);
        if (st == GPC_OK) {
            while (len > 0 &&
                   (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' '))
                text[--len] = '\0';
            if (len < 16 || len >= sizeof d->token)
                st = gpc_error(GPC_ERR_INVALID_ARG,
                               "token_file %s must hold a token of 16-255 characters",
                               d->config.token_file);
            else
                memcpy(d->token, text, len + 1);
            gpc_free(text);
        }
    }
    if (st == GPC_OK) {
        char db[700];
        snprintf(db, sizeof db, "%s/gpcd.db", d->config.state_dir);
        st = gpcd_store_open(db, &d->store);
    }
    if (st == GPC_OK) {
        /* ids never repeat, even when the database was lost: a new job must
         * not take an id whose log or exit file an old job left */
        int64_t a = largest_file_id(d->jobs_dir), b = largest_file_id(d->logs_dir);
        st = gpcd_store_reserve_ids(d->store, a > b ? a : b);
    }
    if (st == GPC_OK) st = gpcd_monitor_open(d->config.gpus, &d->config, &d->monitor);
    if (st == GPC_OK) {
        gpcd_monitor_set_store(d->monitor, d->store);
        gpcd_monitor_topology(d->monitor, &d->cluster);
        /* a first reading before any placement, so live memory is known */
        st = gpcd_monitor_sample(d->monitor, &d->cluster, NULL, 0, gpc_wall_seconds());
        if (st != GPC_OK) {
            gpc_log(GPC_LOG_WARN, "monitor: %s", gpc_last_error());
            st = GPC_OK;
        }
        gpcd_monitor_topology(d->monitor, &d->cluster);
    }
    if (st == GPC_OK) {
        d->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (d->wake_fd < 0) st = gpc_error(GPC_ERR_IO, "eventfd: %s", strerror(errno));
    }
    if (st == GPC_OK) {
        char list[GPCD_MAX_GPUS * 4];
        if (gpcd_store_meta_get(d->store, "drained_gpus", list, sizeof list) == GPC_OK)
            for (char *p = list; *p;) {
                char *end;
                long g = strtol(p, &end, 10);
                if (end == p) break;
                if (g >= 0 && g < d->cluster.count) {
                    d->gpu_drained[g] = 1;
                    snprintf(d->drain_reason[g], sizeof d->drain_reason[g],
                             "drained before gpcd restarted");
                    d->cluster.gpu[g].unavailable = 1;
                }
                p = *end == ',' ? end + 1 : end;
            }
    }
    if (st == GPC_OK) {
        char root[512];
        find_cgroup_root(root, sizeof root);
        gpcd_runner_use_cgroups(root);
        gpc_log(GPC_LOG_INFO, "job processes: %s%s", root[0] ? "a cgroup each under " : "",
                root[0] ? root : "no cgroup v2 here; found as the supervisors' descendants");
    }
    if (st == GPC_OK) st = recover(d);
    if (st == GPC_OK && gpcd_slurm_enabled(d)) st = gpcd_slurm_start(d);
    if (st == GPC_OK) st = gpcd_api_start(d);
    if (st != GPC_OK) {
        char message[1024];
        snprintf(message, sizeof message, "%s", gpc_last_error());
        gpcd_daemon_destroy(d);
        return gpc_error(st, "%s", message);
    }
    gpc_log(GPC_LOG_INFO, "gpcd %s: %d GPU(s) from %s, listening on %s%s%s", GPC_VERSION,
            d->cluster.count, gpcd_monitor_provider(d->monitor), d->config.socket,
            d->config.listen[0] ? " and " : "", d->config.listen);
    *out = d;
    return GPC_OK;
}

/* With keep_finished: removes the jobs that ended longer ago than that (a
 * batch at a time, oldest first), then their files. Runs outside d->lock:
 * finished jobs have left d->active, and the store has its own lock.
 * Returns the seconds until the next try: 1, or 60 after a failure, which
 * is logged (once a minute, not once a second). */
#define PRUNE_BATCH 256

static double prune_finished(gpcd_daemon *d) {
    int64_t ids[PRUNE_BATCH];
    int n;
    if (gpcd_store_prune_finished(d->store, gpc_wall_seconds() - d->config.keep_finished,
                                  PRUNE_BATCH, ids, &n) != GPC_OK) {
        gpc_log(GPC_LOG_WARN,
                "removing old finished jobs (keep_finished): %s; trying again in 60 s",
                gpc_last_error());
        return 60.0;
    }
    for (int i = 0; i < n; i++) {
        char path[700];
        gpcd_daemon_log_path(d, ids[i], path, sizeof path);
        unlink(path);
        exit_path(d, ids[i], path, sizeof path);
        unlink(path);
        gpcd_slurm_remove_files(d, ids[i]);
    }
    if (n)
        gpc_log(GPC_LOG_INFO, "removed %d job(s) that ended over %.0f s ago (keep_finished)", n,
                d->config.keep_finished);
    return 1.0;
}

gpc_status gpcd_daemon_run(gpcd_daemon *d) {
    double next_sample = gpc_time_seconds() + d->config.sample_interval;
    double next_pass = 0, next_prune = 0;
    while (!d->stop) {
        struct pollfd p = {d->wake_fd, POLLIN, 0};
        poll(&p, 1, LOOP_TICK_MS);
        uint64_t count;
        if (read(d->wake_fd, &count, sizeof count) < 0) {
            /* nothing pending: a timeout */
        }
        if (d->stop) break;
        double now = gpc_time_seconds();
        int slurm = gpcd_slurm_enabled(d);
        if (slurm) gpcd_slurm_poll(d); /* Slurm runs the jobs: follow them */
        pthread_mutex_lock(&d->lock);
        gpcd_runner_reap();
        if (!slurm) watch_running(d, gpc_wall_seconds());
        if (now >= next_sample) {
            sample(d, gpc_wall_seconds());
            if (!slurm) drain_on_alerts(d);
            next_sample += d->config.sample_interval;
            if (next_sample < now) next_sample = now + d->config.sample_interval;
        }
        storage_retry(d, now);
        if (!slurm) release_gpus(d, now);
        if (!slurm && !d->storage_failing && (d->dirty || now >= next_pass)) {
            d->dirty = 0;
            schedule(d);
            next_pass = now + 1.0;
        }
        int prune = d->config.keep_finished > 0 && !d->storage_failing && now >= next_prune;
        pthread_mutex_unlock(&d->lock);
        if (prune) next_prune = now + prune_finished(d);
    }
    gpc_log(GPC_LOG_INFO, "gpcd stopping; running jobs keep running and are re-attached on the "
                          "next start");
    return GPC_OK;
}

void gpcd_daemon_destroy(gpcd_daemon *d) {
    if (!d) return;
    gpcd_api_stop(d);
    gpcd_slurm_stop(d);
    gpcd_monitor_close(d->monitor);
    gpcd_store_close(d->store);
    for (int i = 0; i < d->nactive; i++)
        gpcd_job_free(d->active[i]);
    free(d->active);
    if (d->wake_fd >= 0) close(d->wake_fd);
    pthread_mutex_destroy(&d->lock);
    free(d);
}
