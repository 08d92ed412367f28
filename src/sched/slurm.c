/*
 * slurm.c: backend = slurm. gpcd keeps its CLI, API, store and dashboard,
 * but hands every job to Slurm instead of placing it on local GPUs: Slurm
 * does the cluster's scheduling, gpcd follows what happens.
 *
 *   submit   each waiting job becomes a batch script STATE_DIR/jobs/ID.sbatch
 *            (the submitter's environment and directory, then `exec` of the
 *            command) given to `sbatch --parsable` with the GPU count
 *            (slurm_gpu_option, --gpus=N by default), --time from the time
 *            limit, --output to the job's log, a name gpcd-INSTANCE-ID and
 *            slurm_options. The Slurm job id is kept in STATE_DIR/jobs/ID.slurm.
 *   follow   every slurm_poll_interval one `scontrol -o show job` lists the
 *            jobs Slurm holds; gpcd's states follow theirs (PENDING -> queued,
 *            RUNNING -> running, COMPLETED/FAILED/TIMEOUT/CANCELLED... -> the
 *            final state with the exit code). A job Slurm has already
 *            forgotten (MinJobAge) is looked up with sacct.
 *   cancel   `gpc cancel` marks the job; the next poll runs scancel and the
 *            job ends as cancelled when Slurm says so.
 *
 * Slurm commands run from gpcd's main thread only, outside the daemon's
 * lock (they can take seconds when slurmctld is busy), and nowhere else:
 * the main loop also reaps children, so this is the one thread that waits
 * for them. After a crash between sbatch and writing ID.slurm, the next
 * gpcd finds the job in Slurm by its name instead of submitting it twice.
 *
 * When gpcd runs as root, jobs go to Slurm as their owner (sbatch --uid,
 * --gid), as local jobs run as their owner.
 */
#define _GNU_SOURCE /* pipe2, strptime */
#include "sched/sched_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <sys/statfs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define SLURM_COMMAND_TIMEOUT 60.0 /* seconds; sbatch retries a busy slurmctld for a while */

typedef struct {
    int64_t job;
    int64_t slurm;
    int cancel_sent;
} slurm_link;

typedef struct {
    slurm_link *links;
    int count, cap;
    double next_poll;
    char instance[16]; /* tells this gpcd's jobs from another's in Slurm */
} slurm_state;

int gpcd_slurm_enabled(const gpcd_daemon *d) {
    return strcmp(d->config.backend, "slurm") == 0;
}

static slurm_link *find_link(slurm_state *s, int64_t job) {
    for (int i = 0; i < s->count; i++)
        if (s->links[i].job == job) return &s->links[i];
    return NULL;
}

static int add_link(slurm_state *s, int64_t job, int64_t slurm) {
    slurm_link *l = find_link(s, job);
    if (!l) {
        if (s->count == s->cap) {
            int cap = s->cap ? s->cap * 2 : 64;
            slurm_link *grown = realloc(s->links, sizeof *grown * (size_t)cap);
            if (!grown) return -1;
            s->links = grown;
            s->cap = cap;
        }
        l = &s->links[s->count++];
        l->job = job;
    }
    l->slurm = slurm;
    l->cancel_sent = 0;
    return 0;
}

static void drop_link(slurm_state *s, int64_t job) {
    slurm_link *l = find_link(s, job);
    if (l) *l = s->links[--s->count];
}

int gpcd_slurm_submitted(gpcd_daemon *d, int64_t job) {
    if (!gpcd_slurm_enabled(d) || !d->slurm_state) return 0;
    return find_link(d->slurm_state, job) != NULL;
}

/* ------------------------------------------------------ running commands */

typedef struct {
    int exit_code; /* -1 when it could not run or was killed */
    char *out, *err;
} slurm_output;

static void output_free(slurm_output *o) {
    free(o->out);
    free(o->err);
    o->out = o->err = NULL;
}

static int append(char **buf, size_t *len, const char *data, size_t n) {
    char *grown = realloc(*buf, *len + n + 1);
    if (!grown) return -1;
    memcpy(grown + *len, data, n);
    *len += n;
    grown[*len] = '\0';
    *buf = grown;
    return 0;
}

/* Runs argv (found in PATH), collecting stdout and stderr. */
static gpc_status slurm_run(char *const argv[], slurm_output *o) {
    o->exit_code = -1;
    o->out = calloc(1, 1);
    o->err = calloc(1, 1);
    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    if (!o->out || !o->err || pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
        if (out_pipe[0] >= 0) {
            close(out_pipe[0]);
            close(out_pipe[1]);
        }
        return gpc_error(GPC_ERR_IO, "cannot run %s: %s", argv[0], strerror(errno));
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err_pipe[1], 2);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(out_pipe[1]);
    close(err_pipe[1]);
    if (rc != 0) {
        close(out_pipe[0]);
        close(err_pipe[0]);
        return gpc_error(GPC_ERR_IO,
                         "cannot run %s: %s (backend = slurm needs the Slurm client commands "
                         "in gpcd's PATH)",
                         argv[0], strerror(rc));
    }
    size_t out_len = 0, err_len = 0;
    struct pollfd p[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
    double deadline = gpc_time_seconds() + SLURM_COMMAND_TIMEOUT;
    int open_fds = 2, timed_out = 0;
    while (open_fds > 0) {
        int left = (int)((deadline - gpc_time_seconds()) * 1000);
        if (left <= 0) {
            timed_out = 1;
            kill(pid, SIGKILL);
            break;
        }
        if (poll(p, 2, left) < 0 && errno != EINTR) break;
        for (int i = 0; i < 2; i++) {
            if (p[i].fd < 0 || !p[i].revents) continue;
            char buf[4096];
            ssize_t n = read(p[i].fd, buf, sizeof buf);
            if (n > 0) {
                if (i == 0 ? append(&o->out, &out_len, buf, (size_t)n)
                           : append(&o->err, &err_len, buf, (size_t)n))
                    n = 0;
            }
            if (n <= 0 && !(n < 0 && errno == EINTR)) {
                close(p[i].fd);
                p[i].fd = -1;
                open_fds--;
            }
        }
    }
    for (int i = 0; i < 2; i++)
        if (p[i].fd >= 0) close(p[i].fd);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (timed_out)
        return gpc_error(GPC_ERR_IO, "%s did not answer within %.0f s (is slurmctld up?)", argv[0],
                         SLURM_COMMAND_TIMEOUT);
    o->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return GPC_OK;
}

/* The first line of a command's complaint, for messages. */
static const char *first_line(char *text, const char *fallback) {
    while (*text == '\n' || *text == ' ')
        text++;
    text[strcspn(text, "\n")] = '\0';
    return *text ? text : fallback;
}

/* ---------------------------------------------------------- submission */

static int shell_name(const char *s) {
    if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || *s == '_')) return 0;
    for (; *s; s++)
        if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') ||
              *s == '_'))
            return 0;
    return 1;
}

/* 'text' for sh: single quotes, each ' as '\'' */
static void put_quoted(FILE *f, const char *text) {
    fputc('\'', f);
    for (const char *p = text; *p; p++) {
        if (*p == '\'')
            fputs("'\\''", f);
        else
            fputc(*p, f);
    }
    fputc('\'', f);
}

/* Variables Slurm sets for the job itself; the submitter's must not win. */
static int slurm_owned(const char *name) {
    return strncmp(name, "SLURM_", 6) == 0 || strcmp(name, "CUDA_VISIBLE_DEVICES") == 0 ||
           strcmp(name, "GPU_DEVICE_ORDINAL") == 0 || strcmp(name, "ROCR_VISIBLE_DEVICES") == 0;
}

static gpc_status write_script(const gpcd_daemon *d, const gpcd_job *job, const char *path) {
    json_t *command = job->command ? json_loads(job->command, 0, NULL) : NULL;
    if (!json_is_array(command) || json_array_size(command) == 0) {
        json_decref(command);
        return gpc_error(GPC_ERR_INVALID_ARG, "job %lld has no command", (long long)job->id);
    }
    char tmp[800];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    /* owner-only from its creation: it holds the submitter's environment,
     * and the folder lets users reach their own logs */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0700);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        json_decref(command);
        return gpc_error(GPC_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
    }
    fprintf(f, "#!/bin/sh\n# gpcd job %lld for %s, handed to Slurm by gpcd (backend = slurm)\n",
            (long long)job->id, job->owner ? job->owner : "?");
    json_t *env = job->env ? json_loads(job->env, 0, NULL) : NULL;
    const char *key;
    json_t *value;
    if (json_is_object(env)) json_object_foreach(env, key, value) {
            if (!json_is_string(value) || !shell_name(key) || slurm_owned(key)) continue;
            fprintf(f, "export %s=", key);
            put_quoted(f, json_string_value(value));
            fputc('\n', f);
        }
    json_decref(env);
    fprintf(f, "export GPC_JOB_ID=%lld NCCL_NVLS_ENABLE=0\nexec", (long long)job->id);
    size_t i;
    json_t *arg;
    json_array_foreach(command, i, arg) {
        fputc(' ', f);
        put_quoted(f, json_string_value(arg) ? json_string_value(arg) : "");
    }
    fputc('\n', f);
    json_decref(command);
    (void)d;
    if (fclose(f) != 0 || chmod(tmp, 0700) != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        return gpc_error(GPC_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    }
    return GPC_OK;
}

static void link_path(const gpcd_daemon *d, int64_t job, char *buf, size_t size) {
    snprintf(buf, size, "%s/%lld.slurm", d->jobs_dir, (long long)job);
}

static void script_path(const gpcd_daemon *d, int64_t job, char *buf, size_t size) {
    snprintf(buf, size, "%s/%lld.sbatch", d->jobs_dir, (long long)job);
}

void gpcd_slurm_remove_files(const gpcd_daemon *d, int64_t job) {
    char path[700];
    link_path(d, job, path, sizeof path);
    unlink(path);
    script_path(d, job, path, sizeof path);
    unlink(path);
}

static void save_link(const gpcd_daemon *d, int64_t job, int64_t slurm) {
    char path[700], text[32];
    link_path(d, job, path, sizeof path);
    int n = snprintf(text, sizeof text, "%lld\n", (long long)slurm);
    gpc_atomic_file f;
    if (gpc_atomic_open(&f, path) != GPC_OK || gpc_atomic_write(&f, text, (size_t)n) != GPC_OK ||
        gpc_atomic_commit(&f) != GPC_OK) {
        gpc_atomic_abort(&f);
        gpc_log(GPC_LOG_WARN, "job %lld: cannot record Slurm job %lld: %s", (long long)job,
                (long long)slurm, gpc_last_error());
    }
}

typedef enum { SUBMIT_OK, SUBMIT_RETRY, SUBMIT_REFUSED } submit_result;

/* sbatch for one job; on SUBMIT_REFUSED, why is in message. */
static submit_result submit(const gpcd_daemon *d, const slurm_state *s, const gpcd_job *job,
                            int64_t *slurm_id, char *message, size_t size) {
    char script[700], log[700], name[64], gpus[96] = "", time_opt[48] = "", nice[32] = "";
    char chdir[1100] = "", uid[32] = "", gid[32] = "";
    script_path(d, job->id, script, sizeof script);
    gpcd_daemon_log_path(d, job->id, log, sizeof log);
    if (write_script(d, job, script) != GPC_OK) {
        snprintf(message, size, "%s", gpc_last_error());
        return SUBMIT_REFUSED;
    }
    snprintf(name, sizeof name, "--job-name=gpcd-%s-%lld", s->instance, (long long)job->id);
    const char *o = d->config.slurm_gpu_option, *pct = strstr(o, "%d");
    if (*o && pct) snprintf(gpus, sizeof gpus, "%.*s%d%s", (int)(pct - o), o, job->gpus, pct + 2);
    if (job->time_limit > 0) {
        long t = (long)ceil(job->time_limit);
        snprintf(time_opt, sizeof time_opt, "--time=%ld-%02ld:%02ld:%02ld", t / 86400,
                 (t / 3600) % 24, (t / 60) % 60, t % 60);
    }
    /* below normal priority yields to others in Slurm too; raising it is
     * the cluster administrator's business */
    if (job->priority < GPCD_PRIORITY_NORMAL)
        snprintf(nice, sizeof nice, "--nice=%d", (GPCD_PRIORITY_NORMAL - job->priority) * 100);
    if (job->cwd) snprintf(chdir, sizeof chdir, "--chdir=%s", job->cwd);
    gid_t owner_gid = (gid_t)-1;
    if (geteuid() == 0 && job->owner_uid != 0) {
        struct passwd pw, *found = NULL;
        char buf[2048];
        snprintf(uid, sizeof uid, "--uid=%u", job->owner_uid);
        if (getpwuid_r(job->owner_uid, &pw, buf, sizeof buf, &found) == 0 && found) {
            owner_gid = pw.pw_gid;
            snprintf(gid, sizeof gid, "--gid=%u", (unsigned)owner_gid);
        }
    }
    /* the log exists before Slurm opens it as the job's user: owner-only,
     * and the user's, so a shared folder need not be writable by all */
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(message, size, "cannot create the job log %.300s: %s", log, strerror(errno));
        return SUBMIT_REFUSED;
    }
    if (fchmod(fd, 0600) != 0) /* whatever the umask */
        gpc_log(GPC_LOG_WARN, "cannot make the log %s owner-only: %s", log, strerror(errno));
    if (uid[0] && fchown(fd, job->owner_uid, owner_gid) != 0)
        gpc_log(GPC_LOG_WARN, "cannot give the log %s to uid %u: %s", log, job->owner_uid,
                strerror(errno));
    close(fd);
    char log_opt[720];
    snprintf(log_opt, sizeof log_opt, "--output=%s", log);
    char options[sizeof d->config.slurm_options];
    snprintf(options, sizeof options, "%s", d->config.slurm_options);
    char *argv[64];
    int argc = 0;
    argv[argc++] = "sbatch";
    argv[argc++] = "--parsable";
    argv[argc++] = name;
    argv[argc++] = log_opt;
    argv[argc++] = "--open-mode=append"; /* a requeued job keeps its earlier output */
    char *optional[] = {gpus, time_opt, nice, chdir, uid, gid};
    for (size_t i = 0; i < sizeof optional / sizeof optional[0]; i++)
        if (optional[i][0]) argv[argc++] = optional[i];
    for (char *save = NULL, *w = strtok_r(options, " \t", &save); w && argc < 60;
         w = strtok_r(NULL, " \t", &save))
        argv[argc++] = w;
    argv[argc++] = script;
    argv[argc] = NULL;
    slurm_output out;
    gpc_status st = slurm_run(argv, &out);
    submit_result result = SUBMIT_RETRY;
    if (st != GPC_OK) {
        snprintf(message, size, "%s", gpc_last_error());
    } else if (out.exit_code == 0 && atoll(out.out) > 0) {
        *slurm_id = atoll(out.out); /* "ID" or "ID;CLUSTER" */
        result = SUBMIT_OK;
    } else {
        const char *why = first_line(out.err, "sbatch failed without a message");
        snprintf(message, size, "%s", why);
        /* a controller that is down or busy is worth another try; anything
         * else (a bad option, an impossible request) will not get better */
        result = strstr(why, "Unable to contact") || strstr(why, "timed out") ||
                         strstr(why, "Zero Bytes") || strstr(why, "Connection refused")
                     ? SUBMIT_RETRY
                     : SUBMIT_REFUSED;
    }
    output_free(&out);
    return result;
}

/* ---------------------------------------------------------- following */

typedef struct {
    int64_t id;
    char name[96];
    char state[32];
    char reason[64];
    char exit_code[16];
    char start[32], end[32];
    char nodes[128];
} slurm_job_info;

/* The value of " KEY=" in one scontrol -o line (values gpcd reads hold no
 * spaces). */
static void field(const char *line, const char *key, char *out, size_t size) {
    size_t klen = strlen(key);
    out[0] = '\0';
    for (const char *p = line; (p = strstr(p, key)) != NULL; p += klen) {
        if ((p != line && p[-1] != ' ') || p[klen] != '=') continue;
        const char *v = p + klen + 1;
        size_t n = strcspn(v, " \n");
        if (n >= size) n = size - 1;
        memcpy(out, v, n);
        out[n] = '\0';
        return;
    }
}

static int parse_listing(char *text, slurm_job_info **out) {
    int n = 0, cap = 0;
    *out = NULL;
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char id[32];
        field(line, "JobId", id, sizeof id);
        if (!id[0]) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            slurm_job_info *grown = realloc(*out, sizeof *grown * (size_t)cap);
            if (!grown) break;
            *out = grown;
        }
        slurm_job_info *j = &(*out)[n++];
        j->id = atoll(id);
        field(line, "JobName", j->name, sizeof j->name);
        field(line, "JobState", j->state, sizeof j->state);
        field(line, "Reason", j->reason, sizeof j->reason);
        field(line, "ExitCode", j->exit_code, sizeof j->exit_code);
        field(line, "StartTime", j->start, sizeof j->start);
        field(line, "EndTime", j->end, sizeof j->end);
        field(line, "NodeList", j->nodes, sizeof j->nodes);
    }
    return n;
}

/* When Slurm has forgotten a job (after MinJobAge), accounting may know. */
static int sacct_lookup(int64_t slurm, slurm_job_info *j) {
    char id[32];
    snprintf(id, sizeof id, "%lld", (long long)slurm);
    char *argv[] = {"sacct", "-n", "-P", "-X", "-j", id, "-o", "State,ExitCode,Start,End", NULL};
    slurm_output out;
    int found = 0;
    if (slurm_run(argv, &out) == GPC_OK && out.exit_code == 0) {
        char *line = out.out;
        line[strcspn(line, "\n")] = '\0';
        char *fields[4] = {0};
        int k = 0;
        for (char *save = NULL, *f = strtok_r(line, "|", &save); f && k < 4;
             f = strtok_r(NULL, "|", &save))
            fields[k++] = f;
        if (k == 4) {
            memset(j, 0, sizeof *j);
            j->id = slurm;
            /* "CANCELLED by 0" */
            snprintf(j->state, sizeof j->state, "%.*s", (int)strcspn(fields[0], " "), fields[0]);
            snprintf(j->exit_code, sizeof j->exit_code, "%s", fields[1]);
            snprintf(j->start, sizeof j->start, "%s", fields[2]);
            snprintf(j->end, sizeof j->end, "%s", fields[3]);
            found = 1;
        }
    }
    output_free(&out);
    return found;
}

static double slurm_time(const char *text, double fallback) {
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *end = strptime(text, "%Y-%m-%dT%H:%M:%S", &tm);
    if (!end || *end) return fallback;
    tm.tm_isdst = -1;
    time_t t = mktime(&tm);
    return t == (time_t)-1 ? fallback : (double)t;
}

static int in_list(const char *state, const char *const *list) {
    for (; *list; list++)
        if (strcmp(state, *list) == 0) return 1;
    return 0;
}

/* What gpcd makes of Slurm's view of a job. Returns 1 when the job changed. */
static int apply_info(gpcd_job *job, const slurm_job_info *info, double now) {
    static const char *const waiting[] = {"PENDING",     "REQUEUED",     "REQUEUE_HOLD",
                                          "REQUEUE_FED", "SPECIAL_EXIT", "RESV_DEL_HOLD",
                                          NULL};
    static const char *const running[] = {"RUNNING",   "CONFIGURING", "COMPLETING", "SUSPENDED",
                                          "STAGE_OUT", "RESIZING",    "SIGNALING",  NULL};
    char message[256];
    gpcd_state state;
    int code = -1, sig = 0;
    if (info->exit_code[0]) sscanf(info->exit_code, "%d:%d", &code, &sig);
    if (in_list(info->state, waiting)) {
        state = job->state == GPCD_PREEMPTED ? GPCD_PREEMPTED : GPCD_QUEUED;
        int reason = info->reason[0] && strcmp(info->reason, "None") != 0;
        snprintf(message, sizeof message, "Slurm job %lld: waiting in Slurm's queue%s%s%s",
                 (long long)info->id, reason ? " (" : "", reason ? info->reason : "",
                 reason ? ")" : "");
    } else if (in_list(info->state, running)) {
        state = GPCD_RUNNING;
        snprintf(message, sizeof message, "Slurm job %lld on %s", (long long)info->id,
                 info->nodes[0] ? info->nodes : "?");
    } else if (strcmp(info->state, "COMPLETED") == 0) {
        state = GPCD_COMPLETED;
        snprintf(message, sizeof message, "Slurm job %lld completed", (long long)info->id);
    } else if (strcmp(info->state, "CANCELLED") == 0) {
        state = GPCD_CANCELLED;
        snprintf(message, sizeof message, "Slurm job %lld cancelled%s", (long long)info->id,
                 job->stop_reason == GPCD_STOP_CANCEL ? "" : " in Slurm (scancel)");
    } else if (strcmp(info->state, "TIMEOUT") == 0) {
        state = GPCD_FAILED;
        snprintf(message, sizeof message, "Slurm job %lld stopped at its time limit",
                 (long long)info->id);
    } else {
        /* FAILED, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE, PREEMPTED */
        state = GPCD_FAILED;
        snprintf(message, sizeof message, "Slurm job %lld %s (exit status %d%s)",
                 (long long)info->id, info->state, code, sig ? ", signal" : "");
        if (sig) {
            size_t n = strlen(message);
            snprintf(message + n - 1, sizeof message - n + 1, " %d)", sig);
        }
    }
    int changed = state != job->state || !job->message || strcmp(job->message, message) != 0;
    if (!changed) return 0;
    if (state == GPCD_RUNNING && job->state != GPCD_RUNNING)
        job->start_time = slurm_time(info->start, now);
    if (gpcd_state_is_final(state)) {
        if (job->start_time <= 0 && info->start[0]) job->start_time = slurm_time(info->start, 0);
        job->end_time = slurm_time(info->end, now);
        job->exit_code = code;
        job->signal = sig;
        job->stop_reason = GPCD_STOP_NONE;
    }
    job->state = state;
    free(job->message);
    job->message = strdup(message);
    return 1;
}

/* -------------------------------------------------------------- the poll */

typedef struct {
    gpcd_job *copy;  /* snapshot, for the script */
    int64_t slurm;   /* 0 until submitted */
    int cancel;      /* gpc cancel asked for it */
    int cancel_sent; /* scancel already went out */
    int just_submitted;
    int refused;
    char message[512];
    slurm_job_info info;
    int have_info;
} slurm_work;

static void forget_job(gpcd_daemon *d, int index) {
    /* as daemon.c's remove_active: the job is final and saved */
    gpcd_job_free(d->active[index]);
    d->active[index] = d->active[--d->nactive];
}

static void scancel(int64_t slurm) {
    char id[32];
    snprintf(id, sizeof id, "%lld", (long long)slurm);
    char *argv[] = {"scancel", id, NULL};
    slurm_output out;
    if (slurm_run(argv, &out) != GPC_OK || out.exit_code != 0)
        gpc_log(GPC_LOG_WARN, "scancel %s failed: %s", id,
                out.err ? first_line(out.err, "no message") : gpc_last_error());
    output_free(&out);
}

void gpcd_slurm_poll(gpcd_daemon *d) {
    slurm_state *s = d->slurm_state;
    double now = gpc_time_seconds();
    pthread_mutex_lock(&d->lock);
    if (!d->dirty && now < s->next_poll) {
        pthread_mutex_unlock(&d->lock);
        return;
    }
    d->dirty = 0;
    s->next_poll = now + d->config.slurm_poll_interval;
    int n = d->nactive;
    slurm_work *work = calloc((size_t)(n ? n : 1), sizeof *work);
    if (!work) {
        pthread_mutex_unlock(&d->lock);
        return;
    }
    for (int i = 0; i < n; i++) {
        slurm_link *l = find_link(s, d->active[i]->id);
        work[i].copy = gpcd_job_copy(d->active[i]);
        work[i].slurm = l ? l->slurm : 0;
        work[i].cancel_sent = l ? l->cancel_sent : 0;
        work[i].cancel = d->active[i]->stop_reason == GPCD_STOP_CANCEL;
    }
    pthread_mutex_unlock(&d->lock);

    /* what Slurm holds now */
    char *argv[] = {"scontrol", "-o", "show", "job", NULL};
    slurm_output listing;
    slurm_job_info *infos = NULL;
    int ninfos = 0, listed = 0;
    if (slurm_run(argv, &listing) == GPC_OK && listing.exit_code == 0) {
        ninfos = parse_listing(listing.out, &infos);
        listed = 1;
    } else {
        gpc_log(GPC_LOG_WARN, "scontrol show job failed: %s",
                listing.err ? first_line(listing.err, "no message") : gpc_last_error());
    }
    output_free(&listing);
    char wanted[96];
    for (int i = 0; i < n && listed; i++) {
        slurm_work *w = &work[i];
        if (!w->copy) continue;
        if (!w->slurm) {
            /* submitted before a crash that lost ID.slurm? find it by name */
            snprintf(wanted, sizeof wanted, "gpcd-%s-%lld", s->instance, (long long)w->copy->id);
            for (int k = 0; k < ninfos; k++)
                if (strcmp(infos[k].name, wanted) == 0)
                    w->slurm = infos[k].id, w->just_submitted = 1;
        }
        if (!w->slurm && !w->cancel && gpcd_state_is_pending(w->copy->state)) {
            submit_result r = submit(d, s, w->copy, &w->slurm, w->message, sizeof w->message);
            if (r == SUBMIT_OK) {
                w->just_submitted = 1;
                gpc_log(GPC_LOG_INFO, "job %lld handed to Slurm as job %lld",
                        (long long)w->copy->id, (long long)w->slurm);
            } else if (r == SUBMIT_REFUSED) {
                w->refused = 1;
            } else {
                gpc_log(GPC_LOG_WARN, "job %lld: sbatch will be tried again: %s",
                        (long long)w->copy->id, w->message);
            }
        }
        if (w->slurm && w->cancel && !w->cancel_sent) {
            scancel(w->slurm);
            w->cancel_sent = 1;
        }
        if (w->slurm && !w->just_submitted) {
            for (int k = 0; k < ninfos; k++)
                if (infos[k].id == w->slurm) {
                    w->info = infos[k];
                    w->have_info = 1;
                }
            if (!w->have_info) w->have_info = sacct_lookup(w->slurm, &w->info) ? 1 : -1;
        }
    }
    free(infos);

    /* apply, under the lock; the API may have cancelled waiting jobs meanwhile */
    int64_t *orphans = calloc((size_t)(n ? n : 1), sizeof *orphans);
    int norphans = 0;
    pthread_mutex_lock(&d->lock);
    double wall = gpc_wall_seconds();
    for (int i = 0; i < n; i++) {
        slurm_work *w = &work[i];
        if (!w->copy) continue;
        int index = -1;
        for (int a = 0; a < d->nactive; a++)
            if (d->active[a]->id == w->copy->id) index = a;
        if (index < 0) {
            if (w->just_submitted && orphans) orphans[norphans++] = w->slurm;
            drop_link(s, w->copy->id);
            continue;
        }
        gpcd_job *job = d->active[index];
        int changed = 0;
        if (w->just_submitted) {
            if (add_link(s, job->id, w->slurm) == 0) save_link(d, job->id, w->slurm);
            free(job->message);
            char m[96];
            snprintf(m, sizeof m, "Slurm job %lld: submitted", (long long)w->slurm);
            job->message = strdup(m);
            changed = 1;
        } else if (w->refused) {
            job->state = GPCD_FAILED;
            job->end_time = wall;
            free(job->message);
            char m[600];
            snprintf(m, sizeof m, "Slurm refused the job: %s", w->message);
            job->message = strdup(m);
            changed = 1;
        } else if (w->have_info == 1) {
            changed = apply_info(job, &w->info, wall);
        } else if (w->have_info == -1) {
            job->state = GPCD_FAILED;
            job->end_time = wall;
            free(job->message);
            char m[160];
            snprintf(m, sizeof m,
                     "Slurm no longer knows job %lld and has no accounting to ask (sacct)",
                     (long long)w->slurm);
            job->message = strdup(m);
            changed = 1;
        }
        slurm_link *l = find_link(s, job->id);
        if (l && w->cancel_sent) l->cancel_sent = 1;
        if (changed) {
            if (gpcd_store_update(d->store, job) != GPC_OK)
                gpc_log(GPC_LOG_ERROR, "job %lld: %s", (long long)job->id, gpc_last_error());
            gpc_log(GPC_LOG_INFO, "job %lld %s: %s", (long long)job->id,
                    gpcd_state_name(job->state), job->message ? job->message : "");
            if (job->state == GPCD_RUNNING) d->started_total += w->copy->state != GPCD_RUNNING;
        }
        if (gpcd_state_is_final(job->state)) {
            drop_link(s, job->id);
            forget_job(d, index);
        }
    }
    pthread_mutex_unlock(&d->lock);
    for (int i = 0; i < norphans; i++)
        scancel(orphans[i]); /* cancelled in gpcd while sbatch ran */
    free(orphans);
    for (int i = 0; i < n; i++)
        gpcd_job_free(work[i].copy);
    free(work);
}

/* Whether path is on a network or cluster filesystem (by statfs's type);
 * unknown types count as shared, so only a plainly local disk warns. */
static int shared_filesystem(const char *path) {
    struct statfs f;
    if (statfs(path, &f) != 0) return 1;
    switch ((unsigned long)f.f_type) {
    case 0xEF53UL:     /* ext2/3/4 */
    case 0x58465342UL: /* xfs */
    case 0x9123683EUL: /* btrfs */
    case 0x01021994UL: /* tmpfs */
    case 0x794C7630UL: /* overlayfs */
    case 0x2FC12FC1UL: /* zfs */
    case 0xF2F52010UL: /* f2fs */
        return 0;
    default:
        return 1;
    }
}

gpc_status gpcd_slurm_start(gpcd_daemon *d) {
    slurm_state *s = calloc(1, sizeof *s);
    if (!s) return gpc_error(GPC_ERR_NOMEM, "out of memory starting the Slurm backend");
    d->slurm_state = s;
    snprintf(s->instance, sizeof s->instance, "%08x", gpcd_data_hash(d->config.state_dir));
    char *argv[] = {"sbatch", "--version", NULL};
    slurm_output out;
    gpc_status st = slurm_run(argv, &out);
    if (st == GPC_OK && out.exit_code != 0)
        st = gpc_error(GPC_ERR_UNSUPPORTED, "backend = slurm: 'sbatch --version' failed: %s",
                       first_line(out.err, "no message"));
    output_free(&out);
    if (st != GPC_OK) return st;
    /* the jobs already handed over, from their ID.slurm files */
    for (int i = 0; i < d->nactive; i++) {
        char path[700], *text = NULL;
        size_t len;
        link_path(d, d->active[i]->id, path, sizeof path);
        if (gpc_read_file(path, &text, &len) != GPC_OK) continue;
        int64_t id = atoll(text);
        gpc_free(text);
        if (id > 0 && add_link(s, d->active[i]->id, id) != 0)
            return gpc_error(GPC_ERR_NOMEM, "out of memory reading Slurm job ids");
    }
    gpc_clear_error();
    gpc_log(GPC_LOG_INFO, "backend = slurm: %d job(s) already in Slurm", s->count);
    if (!shared_filesystem(d->logs_dir))
        gpc_log(GPC_LOG_WARN,
                "backend = slurm: job logs go to %s, on a local filesystem: a job that runs on "
                "another node writes its output there, where gpc logs cannot read it. On a "
                "cluster, set slurm_log_dir to a folder the nodes share",
                d->logs_dir);
    d->dirty = 1;
    return GPC_OK;
}

void gpcd_slurm_stop(gpcd_daemon *d) {
    slurm_state *s = d->slurm_state;
    if (!s) return;
    free(s->links);
    free(s);
    d->slurm_state = NULL;
}
