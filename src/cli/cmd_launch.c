/*
 * cmd_launch.c: `gpc launch`: starts one process per GPU of this node for a
 * data-parallel job, watches them and stops them together.
 *
 *   gpc launch --nproc N [--nnodes M --node-rank R --master ADDR:PORT] -- COMMAND...
 *
 * --nproc auto takes N from GPC_JOB_GPUS, so one command line serves every
 * GPU count an elastic gpcd job runs at.
 *
 * Each process gets GPC_RANK, GPC_WORLD_SIZE, GPC_LOCAL_RANK,
 * GPC_LOCAL_WORLD_SIZE, GPC_NODE_RANK, GPC_MASTER_ADDR and GPC_MASTER_PORT
 * (and the RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT names other
 * tools read), and NCCL_NVLS_ENABLE=0: NVLink multicast stays off on the
 * shared servers gpc runs on. Without OMP_NUM_THREADS, each gets cores/N
 * OpenMP threads, so the processes do not oversubscribe the node's cores.
 *
 * Failure: when a process exits with a non-zero status or a signal, the
 * others are sent SIGTERM (the trainer checkpoints and stops), then SIGKILL
 * after a grace period, and the launcher exits 1 with one line naming the
 * rank and what happened to it. When a process finishes cleanly, the others
 * have --timeout seconds to finish too; one that does not is taken as hung
 * and stopped the same way. SIGINT and SIGTERM to the launcher go to every
 * process. Each process leads its own process group, so whatever it starts
 * is stopped with it.
 *
 * CPU runs: gpc's CPU collectives are MPI's, whose processes only mpirun can
 * start and wire together. When COMMAND is gpc and its --device (default
 * auto) comes to the CPU, gpc launch becomes `mpirun -np N COMMAND...`
 * instead (Open MPI found on PATH; one node), with the same cores/N
 * OpenMP threads a rank. mpirun then stops the others when one fails, and
 * forwards SIGINT and SIGTERM.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "gpc/settings.h"

static const char *NAME = "launch";

#define LAUNCH_MAX_PROCS 1024
#define LAUNCH_GRACE_S 10.0 /* SIGTERM to SIGKILL */

static volatile sig_atomic_t forwarded_signal;

static void on_signal(int sig) {
    forwarded_signal = sig;
}

typedef struct {
    pid_t pid;
    int rank;
    int running;
    int status; /* from waitpid, once exited */
} child;

/* A free TCP port on this host for rank 0's rendezvous (bound and released:
 * another process could take it in between, which is unlikely and then shows
 * as a clear "cannot listen" error). */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 29517;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = 29517;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static void describe(int status, char *buf, size_t size) {
    if (WIFEXITED(status))
        snprintf(buf, size, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, size, "was killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        snprintf(buf, size, "stopped (status %d)", status);
}

static void set_int(const char *name, long value) {
    char v[32];
    snprintf(v, sizeof v, "%ld", value);
    setenv(name, v, 1);
}

static void signal_all(child *c, int n, int sig) {
    for (int i = 0; i < n; i++)
        if (c[i].running) kill(-c[i].pid, sig);
}

/* Reaps what has exited; returns how many are still running. */
static int reap(child *c, int n) {
    int running = 0;
    for (int i = 0; i < n; i++) {
        if (!c[i].running) continue;
        int status;
        pid_t r = waitpid(c[i].pid, &status, WNOHANG);
        if (r == c[i].pid) {
            c[i].running = 0;
            c[i].status = status;
            /* whatever the process left behind in its group goes too */
            kill(-c[i].pid, SIGKILL);
        } else {
            running++;
        }
    }
    return running;
}

/* Stops every running process: SIGTERM, then SIGKILL after the grace. */
static void stop_all(child *c, int n) {
    signal_all(c, n, SIGTERM);
    double until = gpc_time_seconds() + LAUNCH_GRACE_S;
    while (reap(c, n) > 0 && gpc_time_seconds() < until)
        usleep(20000);
    if (reap(c, n) > 0) {
        signal_all(c, n, SIGKILL);
        while (reap(c, n) > 0)
            usleep(20000);
    }
}

/* The processes of this node share its cores: each gets cores/nproc OpenMP
 * threads (at least one) unless OMP_NUM_THREADS says otherwise, instead of
 * each starting one thread per core. */
static void share_cores(int nproc) {
    if (getenv("OMP_NUM_THREADS")) return;
    int cores = gpc_host_cores_available();
    set_int("OMP_NUM_THREADS", cores / nproc > 1 ? cores / nproc : 1);
}

/* Whether COMMAND is a gpc command whose device comes to the CPU: argv0
 * named gpc or this very binary, and --device cpu, or auto on a machine
 * without a GPU. */
static int is_cpu_gpc_run(char **cmd) {
    const char *base = strrchr(cmd[0], '/');
    base = base ? base + 1 : cmd[0];
    char self[4096], target[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = '\0';
    int ours = strcmp(base, "gpc") == 0 ||
               (n > 0 && realpath(cmd[0], target) && strcmp(target, self) == 0);
    if (!ours) return 0;
    const char *device = "auto";
    for (int i = 1; cmd[i]; i++) {
        if (strcmp(cmd[i], "--device") == 0 && cmd[i + 1]) device = cmd[i + 1];
        if (strncmp(cmd[i], "--device=", 9) == 0) device = cmd[i] + 9;
    }
    gpc_device d;
    if (gpc_device_parse(device, &d) != GPC_OK) {
        gpc_clear_error(); /* the command itself says what is wrong with it */
        return 0;
    }
    return d.type == GPC_DEVICE_CPU;
}

/* The first executable NAME on PATH into path; 0 when there is none. */
static int find_on_path(const char *name, char *path, size_t size) {
    const char *dirs = getenv("PATH");
    if (!dirs) return 0;
    while (*dirs) {
        size_t len = strcspn(dirs, ":");
        snprintf(path, size, "%.*s/%s", (int)len, len ? dirs : ".", name);
        struct stat st;
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0) return 1;
        dirs += len + (dirs[len] == ':');
    }
    return 0;
}

/* Runs COMMAND as `mpirun -np N COMMAND`: returns only on failure. */
static int exec_mpirun(int nproc, int nnodes, char **cmd) {
    if (nnodes > 1)
        return cli_usage_error(NAME,
                               "a CPU run over %d nodes is started by mpirun with a host file "
                               "(mpirun -np N --hostfile FILE gpc train ...), not gpc launch",
                               nnodes);
#ifndef GPC_HAVE_MPI
    (void)nproc, (void)cmd;
    fprintf(stderr, "gpc launch: error: CPU processes exchange gradients over MPI, and this gpc "
                    "was built without it: install libopenmpi-dev and rebuild, or train on a "
                    "GPU (--device cuda)\n");
    return CLI_EXIT_RUNTIME;
#else
    char mpirun[4096];
    if (!find_on_path("mpirun", mpirun, sizeof mpirun)) {
        fprintf(stderr,
                "gpc launch: error: %d CPU processes are started by mpirun, which is not "
                "on PATH: install Open MPI (apt-get install openmpi-bin), or train on a "
                "GPU (--device cuda)\n",
                nproc);
        return CLI_EXIT_RUNTIME;
    }
    int argc = 0;
    while (cmd[argc])
        argc++;
    char **args = calloc((size_t)argc + 8, sizeof *args);
    if (!args) {
        fprintf(stderr, "gpc launch: error: out of memory\n");
        return CLI_EXIT_RUNTIME;
    }
    char np[16];
    snprintf(np, sizeof np, "%d", nproc);
    /* --bind-to none: Open MPI would pin each rank to one core and its
     * OpenMP threads with it; --oversubscribe: more ranks than cores is the
     * user's choice (a test, a small machine), not an error */
    const char *head[] = {mpirun, "--oversubscribe", "--bind-to", "none", "-np", np};
    int k = 0;
    for (size_t i = 0; i < sizeof head / sizeof head[0]; i++)
        args[k++] = (char *)head[i];
    for (int i = 0; i < argc; i++)
        args[k++] = cmd[i];
    args[k] = NULL;
    /* Open MPI refuses to run as root unless told: a container's root is
     * the usual case, and gpc launch forks as root anyway */
    if (geteuid() == 0) {
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    }
    setenv("OMPI_MCA_plm_rsh_agent", "", 0); /* one node: no ssh */
    share_cores(nproc);
    fflush(NULL);
    execv(mpirun, args);
    fprintf(stderr, "gpc launch: error: cannot run %s: %s\n", mpirun, strerror(errno));
    free(args);
    return CLI_EXIT_RUNTIME;
#endif
}

int cmd_launch(int argc, char **argv) {
    int dash = -1;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--") == 0) {
            dash = i;
            break;
        }
    int nproc = 1, nnodes = 1, node_rank = 0;
    const char *nproc_text = "1";
    double timeout = 300;
    const char *master = NULL;
    const cli_option options[] = {
        {"nproc", CLI_STRING, &nproc_text, "N|auto",
         "processes on this node, one per GPU (default 1); auto: GPC_JOB_GPUS, the count gpcd "
         "gave the job (an elastic job's changes from run to run)"},
        {"nnodes", CLI_INT, &nnodes, "M", "nodes in the job (default 1)"},
        {"node-rank", CLI_INT, &node_rank, "R", "this node's place, 0..M-1 (default 0)"},
        {"master", CLI_STRING, &master, "ADDR:PORT",
         "where rank 0 listens (default 127.0.0.1 and a free port; needed with --nnodes)"},
        {"timeout", CLI_FLOAT, &timeout, "S",
         "seconds the others may run on after one process finished (default 300)"},
        {NULL, 0, NULL, NULL, NULL},
    };
    const cli_spec spec = {
        "launch",
        "launch --nproc N [--nnodes M --node-rank R --master ADDR:PORT] [--timeout S] -- "
        "COMMAND...",
        "Starts COMMAND once per GPU for data-parallel training (rank i uses GPU i of the node), "
        "with the environment that gpc train reads. When one process fails, the others are "
        "stopped and the exit status is 1, with the rank and its status on stderr. A gpc "
        "command on the CPU runs under mpirun -np N instead, its collectives being MPI's.",
        options,
        0,
        NULL,
        NULL,
    };
    int rc = cli_parse(&spec, dash < 0 ? argc : dash, argv);
    if (rc == CLI_HELP_SHOWN) return CLI_EXIT_OK;
    if (rc) return rc;
    if (dash < 0 || dash + 1 >= argc)
        return cli_usage_error(NAME, "give the command to start after '--', e.g. gpc launch "
                                     "--nproc 2 -- gpc train --data DIR --out RUN");
    if (strcmp(nproc_text, "auto") == 0) {
        const char *given = gpc_setting_given("GPC_JOB_GPUS");
        if (!given)
            return cli_usage_error(NAME, "--nproc auto takes the count from GPC_JOB_GPUS, which "
                                         "gpcd sets in each job; outside gpcd give a number");
        nproc = (int)gpc_setting_int("GPC_JOB_GPUS");
    } else {
        char *end;
        long v = strtol(nproc_text, &end, 10);
        nproc = *nproc_text && !*end && v >= 1 && v <= LAUNCH_MAX_PROCS ? (int)v : 0;
        if (!nproc)
            return cli_usage_error(NAME, "--nproc must be 1..%d or auto, not '%s'",
                                   LAUNCH_MAX_PROCS, nproc_text);
    }
    if (nproc < 1 || nproc > LAUNCH_MAX_PROCS)
        return cli_usage_error(NAME, "--nproc must be 1..%d, not %d", LAUNCH_MAX_PROCS, nproc);
    if (nnodes < 1 || node_rank < 0 || node_rank >= nnodes)
        return cli_usage_error(NAME, "--node-rank must be 0..%d for --nnodes %d, not %d",
                               nnodes - 1, nnodes, node_rank);
    if (!(timeout > 0)) return cli_usage_error(NAME, "--timeout must be positive seconds");
    if (is_cpu_gpc_run(argv + dash + 1)) return exec_mpirun(nproc, nnodes, argv + dash + 1);
    char addr[256] = "127.0.0.1";
    int port = 0;
    if (master) {
        const char *colon = strrchr(master, ':');
        char *end = NULL;
        long p = colon ? strtol(colon + 1, &end, 10) : 0;
        if (!colon || colon == master || !end || *end || p < 1 || p > 65535 ||
            (size_t)(colon - master) >= sizeof addr)
            return cli_usage_error(NAME, "--master must be ADDR:PORT (port 1..65535), not '%s'",
                                   master);
        memcpy(addr, master, (size_t)(colon - master));
        addr[colon - master] = '\0';
        port = (int)p;
    } else if (nnodes > 1) {
        return cli_usage_error(NAME,
                               "with --nnodes %d every node needs --master ADDR:PORT of "
                               "node 0",
                               nnodes);
    } else {
        port = free_port();
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    int world = nproc * nnodes;
    child procs[LAUNCH_MAX_PROCS];
    memset(procs, 0, sizeof procs);
    fflush(NULL);
    for (int local = 0; local < nproc; local++) {
        int rank = node_rank * nproc + local;
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "gpc launch: error: cannot start rank %d: %s\n", rank, strerror(errno));
            stop_all(procs, local);
            return CLI_EXIT_RUNTIME;
        }
        if (pid == 0) {
            setpgid(0, 0);
            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            set_int("GPC_RANK", rank);
            set_int("GPC_WORLD_SIZE", world);
            set_int("GPC_LOCAL_RANK", local);
            set_int("GPC_LOCAL_WORLD_SIZE", nproc);
            set_int("GPC_NODE_RANK", node_rank);
            setenv("GPC_MASTER_ADDR", addr, 1);
            set_int("GPC_MASTER_PORT", port);
            set_int("RANK", rank);
            set_int("WORLD_SIZE", world);
            set_int("LOCAL_RANK", local);
            set_int("LOCAL_WORLD_SIZE", nproc);
            setenv("MASTER_ADDR", addr, 1);
            set_int("MASTER_PORT", port);
            setenv("NCCL_NVLS_ENABLE", "0", 1);
            share_cores(nproc);
            execvp(argv[dash + 1], argv + dash + 1);
            fprintf(stderr, "gpc launch: error: rank %d cannot run '%s': %s\n", rank,
                    argv[dash + 1], strerror(errno));
            _exit(127);
        }
        setpgid(pid, pid); /* also here, so the group exists before any signal */
        procs[local] = (child){pid, rank, 1, 0};
    }

    double first_done = 0;
    int first_ok = -1;
    for (;;) {
        int running = reap(procs, nproc);
        if (forwarded_signal) {
            int sig = forwarded_signal;
            forwarded_signal = 0;
            signal_all(procs, nproc, sig);
        }
        for (int i = 0; i < nproc; i++) {
            if (procs[i].running) continue;
            int st = procs[i].status;
            if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
                if (first_ok < 0) {
                    first_ok = i;
                    first_done = gpc_time_seconds();
                }
                continue;
            }
            /* a failure: stop the rest and say which rank and why */
            char why[128];
            describe(st, why, sizeof why);
            int others = running;
            stop_all(procs, nproc);
            fprintf(stderr,
                    "gpc launch: error: rank %d (pid %d) %s; stopped the other %d running "
                    "process%s (see rank %d's messages above)\n",
                    procs[i].rank, (int)procs[i].pid, why, others, others == 1 ? "" : "es",
                    procs[i].rank);
            return CLI_EXIT_RUNTIME;
        }
        if (running == 0) return CLI_EXIT_OK;
        if (first_ok >= 0 && gpc_time_seconds() - first_done > timeout) {
            int hung = 0; /* running > 0 here, so one of them is still running */
            for (int i = nproc - 1; i >= 0; i--)
                if (procs[i].running) hung = i;
            stop_all(procs, nproc);
            fprintf(stderr,
                    "gpc launch: error: rank %d (pid %d) was still running %.0f s after rank %d "
                    "finished: taken as hung and stopped with %d other%s (raise --timeout if "
                    "ranks may finish that far apart)\n",
                    procs[hung].rank, (int)procs[hung].pid, timeout, procs[first_ok].rank,
                    running - 1, running - 1 == 1 ? "" : "s");
            return CLI_EXIT_RUNTIME;
        }
        usleep(20000);
    }
}
