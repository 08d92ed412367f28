/*
 * runner.c: starts job processes and keeps track of them across gpcd
 * restarts.
 *
 * Each job gets a small supervisor: a child of gpcd that leaves gpcd's
 * session (so killing gpcd does not touch it), forks the command in a new
 * process group, waits for it and writes "exit N" or "signal N" to the job's
 * exit file. gpcd remembers the supervisor's pid and start time (from
 * /proc/PID/stat, so a reused pid is not mistaken for it).
 *
 * Before the command runs, the supervisor claims the start: it writes its
 * pid, start time and the job's process group to the attempt's record file
 * (named after the job and its start time) with link(2), which fails if the
 * file exists. A gpcd that restarts and finds a job it had recorded as
 * starting but without a pid claims the same name first: if it wins, the
 * command never ran and never will, so the job can safely wait again; if
 * the supervisor won, the record says which processes to look for. Either
 * way no job runs twice and none is lost.
 *
 * Every process a job starts is found and stopped, including those that
 * leave its process group (setsid, double forks). Where gpcd can create
 * cgroups (cgroup v2 with cgroup.kill, see gpcd_runner_use_cgroups), the
 * command runs in a cgroup of its own, gpcd-job-PID-START under gpcd's,
 * named after its supervisor; signals reach every process in it and
 * cgroup.kill ends them all. Everywhere, the supervisor is a child
 * subreaper (PR_SET_CHILD_SUBREAPER): a process whose parent dies is
 * reparented to it rather than to init, so the job's processes stay its
 * descendants, which gpcd signals by walking /proc and the supervisor
 * kills when the command ends. After a restart
 * gpcd re-attaches to supervisors still alive and settles jobs whose
 * supervisor is gone from their exit file. Signals (cancel, preemption,
 * time limits) go to the job's process group, reaching everything it
 * started.
 *
 * Between fork and exec only async-signal-safe calls are made; everything
 * that allocates (argv, environment, paths) is prepared before the fork.
 */
#define _GNU_SOURCE /* close_range, pipe2 */
#include "gpc/sched.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <jansson.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* The cgroup v2 folder jobs' cgroups are made in; "" when gpcd cannot. */
static char cgroup_root[512];

static void free_strings(char **v) {
    if (!v) return;
    for (char **p = v; *p; p++)
        free(*p);
    free(v);
}

static char **command_argv(const char *json) {
    json_t *a = json ? json_loads(json, 0, NULL) : NULL;
    if (!json_is_array(a) || json_array_size(a) == 0) {
        json_decref(a);
        return NULL;
    }
    size_t n = json_array_size(a);
    char **argv = calloc(n + 1, sizeof *argv);
    for (size_t i = 0; argv && i < n; i++) {
        const char *s = json_string_value(json_array_get(a, i));
        argv[i] = strdup(s ? s : "");
    }
    json_decref(a);
    return argv;
}

static char *format_env(const char *name, const char *value) {
    size_t len = strlen(name) + strlen(value) + 2;
    char *s = malloc(len);
    if (s) snprintf(s, len, "%s=%s", name, value);
    return s;
}

/* The submitter's environment with gpcd's variables put over it. */
uint64_t gpcd_runner_job_tag(const char *exit_path) {
    uint64_t h = 14695981039346656037ull; /* FNV-1a, 64 bits */
    for (const unsigned char *p = (const unsigned char *)exit_path; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    return h;
}

static char **job_environment(const gpcd_job *job, const char *exit_path) {
    json_t *env = job->env ? json_loads(job->env, 0, NULL) : NULL;
    size_t n = json_is_object(env) ? json_object_size(env) : 0;
    char **envp = calloc(n + 9, sizeof *envp);
    if (!envp) {
        json_decref(env);
        return NULL;
    }
    static const char *const ours[] = {"CUDA_VISIBLE_DEVICES", "NCCL_NVLS_ENABLE", "GPC_JOB_ID",
                                       "GPC_JOB_GPUS", "GPC_JOB_TAG"};
    size_t k = 0;
    const char *key;
    json_t *value;
    if (n) json_object_foreach(env, key, value) {
            int skip = 0;
            for (size_t i = 0; i < sizeof ours / sizeof ours[0]; i++)
                if (strcmp(key, ours[i]) == 0) skip = 1;
            if (!skip && json_is_string(value))
                envp[k++] = format_env(key, json_string_value(value));
        }
    /* a job that asked for memory per GPU (--mem) keeps to it: gpc train's
     * plan and auto-fit and gpc serve's key/value cache size themselves by
     * GPC_DEVICE_MEMORY_LIMIT; a limit the job's own environment sets wins */
    int own_limit = json_is_object(env) && json_object_get(env, "GPC_DEVICE_MEMORY_LIMIT");
    json_decref(env);
    if (!job->env || n == 0) envp[k++] = strdup("PATH=/usr/local/bin:/usr/bin:/bin");
    if (job->mem > 0 && !own_limit) {
        char limit[32];
        snprintf(limit, sizeof limit, "%llu", (unsigned long long)job->mem);
        envp[k++] = format_env("GPC_DEVICE_MEMORY_LIMIT", limit);
    }
    char gpus[GPCD_MAX_GPUS * 4] = "", id[32];
    size_t used = 0;
    for (int i = 0; i < job->assigned_count; i++)
        used +=
            (size_t)snprintf(gpus + used, sizeof gpus - used, i ? ",%d" : "%d", job->assigned[i]);
    snprintf(id, sizeof id, "%lld", (long long)job->id);
    envp[k++] = format_env("CUDA_VISIBLE_DEVICES", gpus);
    /* NVLink SHARP (NVLS) reserves memory on every GPU of the NVLink domain
     * and can hang jobs that share a server; gpcd's jobs do without it. */
    envp[k++] = format_env("NCCL_NVLS_ENABLE", "0");
    envp[k++] = format_env("GPC_JOB_ID", id);
    snprintf(id, sizeof id, "%d", job->assigned_count);
    envp[k++] = format_env("GPC_JOB_GPUS", id);
    /* marks the job's processes for good, whatever group or cgroup they
     * leave: unique to this gpcd and job (its exit file's path), unlike
     * GPC_JOB_ID, which every gpcd on a machine counts from 1 */
    char tag[24];
    snprintf(tag, sizeof tag, "%016llx", (unsigned long long)gpcd_runner_job_tag(exit_path));
    envp[k++] = format_env("GPC_JOB_TAG", tag);
    envp[k] = NULL;
    return envp;
}

/* Writes a string with write(2) only (usable after fork). */
static void say(int fd, const char *s) {
    size_t len = strlen(s);
    while (len > 0) {
        ssize_t n = write(fd, s, len);
        if (n <= 0) return;
        s += n;
        len -= (size_t)n;
    }
}

static void format_uint(char *buf, unsigned long v) {
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (int i = 0; i < n; i++)
        buf[i] = tmp[n - 1 - i];
    buf[n] = '\0';
}

typedef struct {
    char **argv;
    char **envp;
    const char *cwd;
    const char *exit_path;
    char *exit_tmp;
    const char *record_path;
    char *record_tmp;
    int log_fd, null_fd, pipe_w;
    uint64_t log_max;
    char cgroup[700]; /* the job's cgroup, built by the supervisor; "" for none */
    int switch_user;
    uid_t uid;
    gid_t gid;
    gid_t groups[64];
    int ngroups;
} launch;

/* Field 22 of a /proc/PID/stat text (the start time), 0 if malformed. The
 * command name (field 2) may hold spaces and parentheses: fields resume
 * after the last ')'. Field 3 is the state (proc(5)). No allocation, so the
 * supervisor may call it after fork. */
static uint64_t stat_start_time(char *buf) {
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ') return 0;
    p += 2;
    if (*p == 'Z' || *p == 'X') return 0; /* exited, not yet reaped */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p) return 0;
        p++;
    }
    uint64_t v = 0;
    while (*p >= '0' && *p <= '9')
        v = v * 10 + (uint64_t)(*p++ - '0');
    return v;
}

static uint64_t read_start_time(const char *stat_path) {
    char buf[1024];
    int fd = open(stat_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    return stat_start_time(buf);
}

/* Claims the start in record_path ("PID START PGID"); 0 when this
 * supervisor owns it, -1 when gpcd gave the start up (or the disk refused
 * the record: then nothing may run, since a restart could not find it). */
static int claim_start(const launch *l, pid_t child) {
    char line[96], number[24];
    line[0] = '\0';
    format_uint(number, (unsigned long)getpid());
    strcat(line, number);
    strcat(line, " ");
    format_uint(number, (unsigned long)read_start_time("/proc/self/stat"));
    strcat(line, number);
    strcat(line, " ");
    format_uint(number, (unsigned long)child);
    strcat(line, number);
    strcat(line, "\n");
    int fd = open(l->record_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    size_t len = strlen(line);
    int ok = write(fd, line, len) == (ssize_t)len && fsync(fd) == 0;
    close(fd);
    ok = ok && link(l->record_tmp, l->record_path) == 0;
    unlink(l->record_tmp);
    return ok ? 0 : -1;
}

/* The job's log, capped (gpcd_config.log_max): once it would pass the cap,
 * the first half stays, then a line saying output was cut, then the latest
 * output. Each time the file reaches the cap again, its newest quarter is
 * moved up behind that line and the rest cut off, so every byte is copied
 * about once more and the file stays in order. Runs in the supervisor:
 * plain system calls, no allocation. */
typedef struct {
    int fd;
    uint64_t size, max, head; /* head: where the kept tail starts, 0 until cut */
} capped_log;

static const char cut_line[] = "\n[gpcd: output cut here: the job wrote more than log_max; "
                               "its first part is above, its latest below]\n";

static void log_move(capped_log *c, uint64_t from, uint64_t to, uint64_t len, char *buf,
                     size_t cap) {
    for (uint64_t done = 0; done < len;) {
        size_t n = len - done < cap ? (size_t)(len - done) : cap;
        ssize_t got = pread(c->fd, buf, n, (off_t)(from + done));
        if (got <= 0 || pwrite(c->fd, buf, (size_t)got, (off_t)(to + done)) != got) return;
        done += (uint64_t)got;
    }
}

static void log_write(capped_log *c, const char *data, size_t n, char *scratch, size_t cap) {
    while (n > 0) {
        if (c->size + n > c->max) {
            if (!c->head) {
                /* first time: keep the first half, then the line */
                c->head = c->max / 2 + sizeof cut_line - 1;
                if (pwrite(c->fd, cut_line, sizeof cut_line - 1, (off_t)(c->max / 2)) < 0) return;
                c->size = c->head;
            } else {
                uint64_t keep = c->max / 4;
                log_move(c, c->size - keep, c->head, keep, scratch, cap);
                c->size = c->head + keep;
            }
            if (ftruncate(c->fd, (off_t)c->size) != 0) return;
        }
        if (c->size >= c->max) return; /* nothing can be made room for */
        size_t room = (size_t)(c->max - c->size);
        size_t k = n < room ? n : room;
        ssize_t w = pwrite(c->fd, data, k, (off_t)c->size);
        if (w <= 0) return; /* a full disk: the output is dropped, the job goes on */
        c->size += (uint64_t)w;
        data += w;
        n -= (size_t)w;
    }
}

/* Copies the command's output into its log until the command has exited
 * and its output is drained. Output still written later by processes it
 * left behind is not waited for (they are stopped when the job ends). */
static void copy_output(launch *l, int out, pid_t child, int *status) {
    static char buf[65536], scratch[65536];
    /* l->log_fd is closed by now (close_range): the log is the supervisor's stdout,
     * opened read-write so the tail can be moved */
    capped_log c = {1, 0, l->log_max, 0};
    struct stat st;
    if (fstat(c.fd, &st) == 0) c.size = (uint64_t)st.st_size;
    /* positioned writes: O_APPEND would send every pwrite to the end */
    fcntl(c.fd, F_SETFL, fcntl(c.fd, F_GETFL) & ~O_APPEND);
    if (c.size > c.max / 2) {
        /* a rerun after preemption whose log is past half the cap already
         * (log_max may also have been lowered since): the first half stays
         * as the head, the cut line follows, this run's output after it */
        c.head = c.max / 2 + sizeof cut_line - 1;
        if (pwrite(c.fd, cut_line, sizeof cut_line - 1, (off_t)(c.max / 2)) < 0 ||
            ftruncate(c.fd, (off_t)c.head) != 0) {
            /* a disk that refuses: log_write's writes fail the same way */
        }
        c.size = c.head;
    }
    int exited = 0;
    for (;;) {
        struct pollfd p = {out, POLLIN, 0};
        int ready = poll(&p, 1, exited ? 0 : 100);
        if (ready > 0) {
            ssize_t n = read(out, buf, sizeof buf);
            if (n > 0) {
                log_write(&c, buf, (size_t)n, scratch, sizeof scratch);
                continue;
            }
            if (n == 0) break; /* every writer is gone */
            if (errno == EINTR) continue;
            break;
        }
        if (exited) break; /* drained what the command left */
        pid_t w = waitpid(child, status, WNOHANG);
        if (w == child)
            exited = 1;
        else if (w < 0 && errno != EINTR)
            break;
    }
    if (!exited)
        while (waitpid(child, status, 0) < 0)
            if (errno != EINTR) _exit(126);
}

/* Appends text to buf (size bytes) without allocating. */
static void append(char *buf, size_t size, const char *text) {
    size_t used = strlen(buf), add = strlen(text);
    if (used + add >= size) add = size - used - 1;
    memcpy(buf + used, text, add);
    buf[used + add] = '\0';
}

/* ROOT/gpcd-job-PID-START: the cgroup of the job supervised by PID. */
static void cgroup_path(char *buf, size_t size, unsigned long pid, unsigned long start) {
    char number[24];
    buf[0] = '\0';
    append(buf, size, cgroup_root);
    append(buf, size, "/gpcd-job-");
    format_uint(number, pid);
    append(buf, size, number);
    append(buf, size, "-");
    format_uint(number, start);
    append(buf, size, number);
}

static int write_file(const char *dir, const char *name, const char *text) {
    char path[800];
    path[0] = '\0';
    append(path, sizeof path, dir);
    append(path, sizeof path, name);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = write(fd, text, strlen(text));
    close(fd);
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

/* Whether the cgroup still holds a process (cgroup.procs not empty). */
static int cgroup_populated(const char *dir) {
    char path[800], c;
    path[0] = '\0';
    append(path, sizeof path, dir);
    append(path, sizeof path, "/cgroup.procs");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, &c, 1);
    close(fd);
    return n == 1;
}

/* Once the command has ended: SIGKILL to whatever it left, through its
 * cgroup and to the supervisor's children (as subreaper it inherits every
 * orphan), reaping them, until none is left (or 5 s pass: a process stuck
 * in the kernel cannot be waited for longer). */
static void end_leftovers(launch *l, pid_t child) {
    char children[64], number[24], buf[4096];
    children[0] = '\0';
    append(children, sizeof children, "/proc/self/task/");
    format_uint(number, (unsigned long)getpid());
    append(children, sizeof children, number);
    append(children, sizeof children, "/children");
    kill(-child, SIGKILL);
    for (int round = 0; round < 500; round++) {
        if (l->cgroup[0]) write_file(l->cgroup, "/cgroup.kill", "1");
        int any = 0;
        int fd = open(children, O_RDONLY | O_CLOEXEC);
        ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : 0;
        if (fd >= 0) close(fd);
        for (ssize_t i = 0; i < n;) {
            long pid = 0;
            while (i < n && buf[i] >= '0' && buf[i] <= '9')
                pid = pid * 10 + (buf[i++] - '0');
            while (i < n && (buf[i] < '0' || buf[i] > '9'))
                i++;
            if (pid > 0) {
                kill((pid_t)pid, SIGKILL);
                any = 1;
            }
        }
        pid_t reaped;
        while ((reaped = waitpid(-1, NULL, WNOHANG)) > 0)
            any = 1;
        if (l->cgroup[0] && cgroup_populated(l->cgroup)) any = 1;
        if (!any && reaped < 0 && errno == ECHILD) break; /* no child, none to come */
        usleep(10000);
    }
    if (l->cgroup[0]) rmdir(l->cgroup);
}

/* The supervisor: runs in the child of gpcd, never returns. */
static void supervise(launch *l) {
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP) signal(sig, SIG_DFL);
    setsid();
    /* raw system calls: after fork in the threaded gpcd only async-signal-
     * safe calls may run, and the sanitizers' prctl wrapper (PR_SET_NAME)
     * takes a lock that another thread may have held at the fork, which
     * hung the supervisor */
    syscall(SYS_prctl, PR_SET_NAME, "gpcd-supervise", 0, 0, 0); /* apart from gpcd in ps */
    /* orphans of the job become its children, not init's (see the top) */
    syscall(SYS_prctl, PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    l->cgroup[0] = '\0';
    if (cgroup_root[0]) {
        cgroup_path(l->cgroup, sizeof l->cgroup, (unsigned long)getpid(),
                    (unsigned long)read_start_time("/proc/self/stat"));
        if (mkdir(l->cgroup, 0755) != 0) l->cgroup[0] = '\0'; /* the subreaper still serves */
    }
    dup2(l->null_fd, 0);
    dup2(l->log_fd, 1); /* the supervisor's own messages */
    dup2(l->log_fd, 2);
    if (l->pipe_w != 3) {
        dup2(l->pipe_w, 3);
    } else {
        fcntl(3, F_SETFD, 0);
    }
    close_range(4, ~0U, 0);
    /* the command waits for the go byte, sent once the start is claimed */
    int go[2], out[2];
    if (pipe2(go, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
        say(2, "gpcd: cannot start the job: pipe failed\n");
        _exit(126);
    }
    pid_t child = fork();
    if (child < 0) {
        say(2, "gpcd: cannot start the job: fork failed\n");
        _exit(126);
    }
    if (child == 0) {
        setpgid(0, 0);
        close(3);
        close(go[1]);
        char byte;
        ssize_t got;
        while ((got = read(go[0], &byte, 1)) < 0 && errno == EINTR) {
        }
        if (got != 1) _exit(125); /* the start was not claimed: never run */
        close(go[0]);
        /* into the job's cgroup (the supervisor stays out, so that
         * cgroup.kill spares it) */
        if (l->cgroup[0]) write_file(l->cgroup, "/cgroup.procs", "0");
        /* output goes through the supervisor, which caps the log */
        dup2(out[1], 1);
        dup2(out[1], 2);
        close(out[0]);
        close(out[1]);
        if (l->switch_user) {
            if (setgroups((size_t)l->ngroups, l->groups) != 0 || setgid(l->gid) != 0 ||
                setuid(l->uid) != 0) {
                say(2, "gpcd: cannot switch to the job owner's user id\n");
                _exit(126);
            }
        }
        if (chdir(l->cwd) != 0) {
            say(2, "gpcd: cannot enter the job's directory ");
            say(2, l->cwd);
            say(2, ": ");
            say(2, strerror(errno));
            say(2, "\n");
            _exit(126);
        }
        environ = l->envp;
        execvp(l->argv[0], l->argv);
        say(2, "gpcd: cannot run '");
        say(2, l->argv[0]);
        say(2, "': ");
        say(2, strerror(errno));
        say(2, "\n");
        _exit(127);
    }
    setpgid(child, child); /* also in the child: whichever runs first wins the race */
    close(go[0]);
    close(out[1]);
    if (claim_start(l, child) != 0) {
        say(2, "gpcd: the job's start was given up (gpcd restarted, or the disk is full); "
               "not running it\n");
        kill(child, SIGKILL);
        if (l->cgroup[0]) rmdir(l->cgroup);
        _exit(125);
    }
    if (write(go[1], "g", 1) != 1) _exit(126);
    close(go[1]);
    /* gpcd may have died since the fork: the pid then goes nowhere, and the
     * supervisor carries on (a restarted gpcd finds it from the record).
     * Ignoring SIGPIPE here, after the fork, leaves the command's default. */
    signal(SIGPIPE, SIG_IGN);
    pid_t pid_value = child;
    if (write(3, &pid_value, sizeof pid_value) != (ssize_t)sizeof pid_value) {
        /* nobody to tell */
    }
    close(3);
    int status = 0;
    copy_output(l, out[0], child, &status);
    close(out[0]);
    end_leftovers(l, child);
    char line[64], number[24];
    if (WIFSIGNALED(status)) {
        format_uint(number, (unsigned long)WTERMSIG(status));
        strcpy(line, "signal ");
    } else {
        format_uint(number, (unsigned long)WEXITSTATUS(status));
        strcpy(line, "exit ");
    }
    strcat(line, number);
    strcat(line, "\n");
    int fd = open(l->exit_tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
        say(fd, line);
        fsync(fd);
        close(fd);
        rename(l->exit_tmp, l->exit_path);
    }
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

static gpc_status prepare_user(const gpcd_job *job, launch *l) {
    if (geteuid() != 0 || job->owner_uid == 0) return GPC_OK;
    struct passwd pw, *found = NULL;
    char buf[4096];
    if (getpwuid_r(job->owner_uid, &pw, buf, sizeof buf, &found) != 0 || !found)
        return gpc_error(GPC_ERR_INVALID_ARG, "job %lld: its owner (uid %u) has no user entry",
                         (long long)job->id, job->owner_uid);
    l->switch_user = 1;
    l->uid = pw.pw_uid;
    l->gid = pw.pw_gid;
    l->ngroups = 64;
    if (getgrouplist(pw.pw_name, pw.pw_gid, l->groups, &l->ngroups) < 0) {
        l->groups[0] = pw.pw_gid;
        l->ngroups = 1;
    }
    return GPC_OK;
}

void gpcd_runner_record_path(const char *jobs_dir, const gpcd_job *job, char *buf, size_t size) {
    snprintf(buf, size, "%s/%lld.%lld.run", jobs_dir, (long long)job->id,
             (long long)(job->start_time * 1000.0));
}

int gpcd_runner_claim(const char *record_path, gpcd_job *job) {
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.gpcd", record_path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) {
        static const char given_up[] = "given-up\n";
        int ok = write(fd, given_up, sizeof given_up - 1) == (ssize_t)(sizeof given_up - 1) &&
                 fsync(fd) == 0;
        close(fd);
        int won = ok && link(tmp, record_path) == 0;
        unlink(tmp);
        if (won) return 0;
    }
    FILE *f = fopen(record_path, "r");
    if (!f) return -1; /* neither claimed nor readable: the disk or folder is broken */
    long long pid = 0, pgid = 0;
    unsigned long long start = 0;
    int n = fscanf(f, "%lld %llu %lld", &pid, &start, &pgid);
    fclose(f);
    if (n != 3 || pid <= 0) return 0; /* gpcd's own earlier claim */
    job->pid = (pid_t)pid;
    job->pid_start = start;
    job->pgid = (pid_t)pgid;
    return 1;
}

gpc_status gpcd_runner_start(gpcd_job *job, const char *log_path, const char *exit_path,
                             const char *record_path, uint64_t log_max) {
    launch l;
    memset(&l, 0, sizeof l);
    l.log_fd = l.null_fd = -1;
    int pipe_fds[2] = {-1, -1};
    gpc_status st = GPC_OK;
    l.argv = command_argv(job->command);
    l.envp = job_environment(job, exit_path);
    l.cwd = job->cwd ? job->cwd : "/";
    l.exit_path = exit_path;
    l.record_path = record_path;
    l.log_max = log_max ? log_max : UINT64_MAX / 4;
    size_t tmp_len = strlen(exit_path) + 8, record_tmp_len = strlen(record_path) + 8;
    l.exit_tmp = malloc(tmp_len);
    l.record_tmp = malloc(record_tmp_len);
    if (!l.argv || !l.envp || !l.exit_tmp || !l.record_tmp) {
        st = gpc_error(GPC_ERR_INVALID_ARG, "job %lld has no command to run", (long long)job->id);
        goto out;
    }
    snprintf(l.exit_tmp, tmp_len, "%s.tmp", exit_path);
    snprintf(l.record_tmp, record_tmp_len, "%s.tmp", record_path);
    unlink(exit_path);
    if ((st = prepare_user(job, &l)) != GPC_OK) goto out;
    /* A job's first run creates its log, and never appends to a file that
     * is there already (another job's, under an id it once had); a job that
     * runs again after preemption goes on with its own. */
    int first_run = job->preemptions == 0;
    l.log_fd =
        open(log_path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | (first_run ? O_EXCL : 0), 0600);
    if (l.log_fd < 0) {
        st = gpc_error(GPC_ERR_IO, "cannot create the job log %s: %s%s", log_path, strerror(errno),
                       errno == EEXIST ? " (left by an earlier job; gpcd never appends to one)"
                                       : "");
        goto out;
    }
    if (l.switch_user && fchown(l.log_fd, l.uid, l.gid) != 0) {
        /* the owner reads logs through gpcd anyway; note it and go on */
        gpc_log(GPC_LOG_WARN, "cannot give %s to uid %u: %s", log_path, l.uid, strerror(errno));
    }
    l.null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (l.null_fd < 0 || pipe2(pipe_fds, O_CLOEXEC) != 0) {
        st = gpc_error(GPC_ERR_IO, "cannot prepare the job's files: %s", strerror(errno));
        goto out;
    }
    l.pipe_w = pipe_fds[1];
    pid_t supervisor = fork();
    if (supervisor < 0) {
        st = gpc_error(GPC_ERR_IO, "cannot fork for job %lld: %s", (long long)job->id,
                       strerror(errno));
        goto out;
    }
    if (supervisor == 0) supervise(&l);
    close(pipe_fds[1]);
    pipe_fds[1] = -1;
    pid_t child = 0;
    ssize_t n;
    while ((n = read(pipe_fds[0], &child, sizeof child)) < 0 && errno == EINTR) {
    }
    if (n != (ssize_t)sizeof child || child <= 0) {
        st = gpc_error(GPC_ERR_IO, "job %lld's supervisor died before starting it (see %s)",
                       (long long)job->id, log_path);
        goto out;
    }
    job->pid = supervisor;
    job->pgid = child;
    job->pid_start = gpcd_process_start_time(supervisor);
out:
    if (pipe_fds[0] >= 0) close(pipe_fds[0]);
    if (pipe_fds[1] >= 0) close(pipe_fds[1]);
    if (l.log_fd >= 0) close(l.log_fd);
    if (l.null_fd >= 0) close(l.null_fd);
    free_strings(l.argv);
    free_strings(l.envp);
    free(l.exit_tmp);
    free(l.record_tmp);
    return st;
}

uint64_t gpcd_process_start_time(pid_t pid) {
    char path[64], buf[1024];
    if (pid <= 0) return 0;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    return stat_start_time(buf);
}

int gpcd_runner_alive(const gpcd_job *job) {
    if (job->pid <= 0 || job->pid_start == 0) return 0;
    return gpcd_process_start_time(job->pid) == job->pid_start;
}

int gpcd_runner_read_exit(const char *exit_path, int *exit_code, int *signal_out) {
    FILE *f = fopen(exit_path, "r");
    if (!f) return -1;
    char word[16];
    int value;
    int ok = fscanf(f, "%15s %d", word, &value) == 2;
    fclose(f);
    if (!ok) return -1;
    if (strcmp(word, "exit") == 0) {
        *exit_code = value;
        *signal_out = 0;
        return 0;
    }
    if (strcmp(word, "signal") == 0) {
        *exit_code = 128 + value;
        *signal_out = value;
        return 0;
    }
    return -1;
}

void gpcd_runner_use_cgroups(const char *root) {
    snprintf(cgroup_root, sizeof cgroup_root, "%s", root ? root : "");
}

/* The pids in the job's cgroup (none without cgroups); malloc'd. */
static int cgroup_pids(const gpcd_job *job, pid_t **out) {
    *out = NULL;
    if (!cgroup_root[0]) return 0;
    char dir[700], path[800];
    cgroup_path(dir, sizeof dir, (unsigned long)job->pid, (unsigned long)job->pid_start);
    snprintf(path, sizeof path, "%s/cgroup.procs", dir);
    FILE *f = fopen(path, "r");
    int n = 0, cap = 0;
    long pid;
    while (f && fscanf(f, "%ld", &pid) == 1) {
        if (pid <= 0) continue;
        if (n == cap) {
            pid_t *grown = realloc(*out, sizeof **out * (size_t)(cap = cap ? 2 * cap : 64));
            if (!grown) break;
            *out = grown;
        }
        (*out)[n++] = (pid_t)pid;
    }
    if (f) fclose(f);
    return n;
}

/* Signals every process of the job once: its process group, its cgroup,
 * and every descendant of its supervisor (not the supervisor itself),
 * found through the process groups and parent links in /proc. Once: a
 * second SIGTERM is not the same as one to every program (mpirun takes it
 * as "abort now" and kills its ranks while they save a checkpoint). */
static void signal_job_processes(const gpcd_job *job, int sig) {
    enum { MAX = 1 << 16 };
    pid_t root = job->pid;
    pid_t *pids = malloc(sizeof *pids * MAX), *parents = malloc(sizeof *parents * MAX);
    pid_t *groups = malloc(sizeof *groups * MAX), *in_cgroup = NULL;
    int ncgroup = cgroup_pids(job, &in_cgroup);
    DIR *dir = opendir("/proc");
    int n = 0;
    struct dirent *e;
    while (pids && parents && groups && dir && n < MAX && (e = readdir(dir)) != NULL) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0) continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t got = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (got <= 0) continue;
        buf[got] = '\0';
        char *p = strrchr(buf, ')'); /* then " STATE PPID PGRP" */
        if (!p || sscanf(p + 1, " %*c %d %d", &parents[n], &groups[n]) != 2) continue;
        pids[n++] = (pid_t)pid;
    }
    if (dir) closedir(dir);
    char *in = calloc((size_t)n + 1, 1);
    for (int i = 0; in && i < n; i++) {
        in[i] = groups[i] == job->pgid && pids[i] != root;
        for (int k = 0; !in[i] && k < ncgroup; k++)
            in[i] = pids[i] == in_cgroup[k];
    }
    /* grow the set of descendants until it stops growing (trees are shallow) */
    for (int changed = 1; in && changed;) {
        changed = 0;
        for (int i = 0; i < n; i++) {
            if (in[i] || pids[i] == root) continue;
            int parent_in = parents[i] == root;
            for (int k = 0; !parent_in && k < n; k++)
                parent_in = in[k] && pids[k] == parents[i];
            if (parent_in) in[i] = 1, changed = 1;
        }
    }
    for (int i = 0; in && i < n; i++)
        if (in[i]) kill(pids[i], sig);
    if (!in || !pids || !parents || !groups) {
        /* no memory to tell them apart: the group and the cgroup, as before */
        kill(-job->pgid, sig);
        for (int k = 0; k < ncgroup; k++)
            kill(in_cgroup[k], sig);
    }
    free(in);
    free(pids);
    free(parents);
    free(groups);
    free(in_cgroup);
}

void gpcd_runner_signal(const gpcd_job *job, int sig) {
    /* Only while the supervisor lives are its group, cgroup and descendants
     * surely the job's. */
    if (job->pgid <= 1 || !gpcd_runner_alive(job)) return;
    if (sig == SIGKILL) {
        /* repeats are harmless here, and cgroup.kill misses nothing */
        kill(-job->pgid, sig);
        if (cgroup_root[0]) {
            char dir[700];
            cgroup_path(dir, sizeof dir, (unsigned long)job->pid, (unsigned long)job->pid_start);
            write_file(dir, "/cgroup.kill", "1");
        }
    }
    signal_job_processes(job, sig);
}

void gpcd_runner_reap(void) {
    int status;
    while (waitpid(-1, &status, WNOHANG) > 0) {
    }
}
