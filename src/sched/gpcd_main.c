/*
 * gpcd_main.c: the gpcd command: reads the options, becomes a daemon (or
 * stays in the foreground for systemd), handles signals, runs the loop.
 *
 *   SIGTERM, SIGINT  stop gpcd; running jobs keep running and the next gpcd
 *                    re-attaches to them
 *   SIGHUP           ignored (restart gpcd to reload its config)
 */
#include "gpc/sched.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static gpcd_daemon *running_daemon;

static void on_stop(int sig) {
    (void)sig;
    if (running_daemon) gpcd_daemon_stop(running_daemon);
}

static void usage(FILE *f) {
    fprintf(f, "usage: gpcd [--config FILE] [--foreground] [--state-dir DIR] [--socket PATH]\n"
               "            [--gpus nvml|simulated:8x141GB] [--print-options] [--version]\n\n"
               "gpcd shares this server's GPUs among jobs submitted with 'gpc submit'.\n"
               "Options given here override the config file. 'gpcd --print-options' lists\n"
               "every config key with its default (docs/gpcd.md explains them).\n");
}

static int fail(const char *what) {
    fprintf(stderr, "gpcd: error: %s%s\n", what, gpc_last_error());
    return 1;
}

static int daemonize(const char *state_dir) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid > 0) _exit(0);
    if (setsid() < 0) return -1;
    pid = fork();
    if (pid < 0) return -1;
    if (pid > 0) _exit(0);
    char log_path[700];
    snprintf(log_path, sizeof log_path, "%s/gpcd.log", state_dir);
    int null_fd = open("/dev/null", O_RDONLY);
    int log_fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (null_fd < 0 || log_fd < 0) return -1;
    if (fchmod(log_fd, 0600) != 0) return -1; /* owner-only, whatever an older gpcd left */
    dup2(null_fd, 0);
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    close(null_fd);
    close(log_fd);
    if (chdir("/") != 0) return -1;
    return 0;
}

int main(int argc, char **argv) {
    const char *config_path = NULL, *state_dir = NULL, *socket_path = NULL, *gpus = NULL;
    int foreground = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **target = NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--version") == 0) {
            printf("gpcd %s\n", GPC_VERSION);
            return 0;
        } else if (strcmp(a, "--print-options") == 0) {
            gpcd_config_write_markdown(stdout);
            return 0;
        } else if (strcmp(a, "--foreground") == 0) {
            foreground = 1;
            continue;
        } else if (strcmp(a, "--config") == 0)
            target = &config_path;
        else if (strcmp(a, "--state-dir") == 0)
            target = &state_dir;
        else if (strcmp(a, "--socket") == 0)
            target = &socket_path;
        else if (strcmp(a, "--gpus") == 0)
            target = &gpus;
        else {
            fprintf(stderr, "gpcd: error: unknown argument '%s' (see gpcd --help)\n", a);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "gpcd: error: %s needs a value (see gpcd --help)\n", a);
            return 2;
        }
        *target = argv[++i];
    }
    gpcd_config config;
    gpcd_config_defaults(&config);
    if (config_path && gpcd_config_load(&config, config_path) != GPC_OK) return fail("");
    if (state_dir && gpcd_config_set(&config, "state_dir", state_dir) != GPC_OK)
        return fail("--state-dir: ");
    if (socket_path && gpcd_config_set(&config, "socket", socket_path) != GPC_OK)
        return fail("--socket: ");
    if (gpus && gpcd_config_set(&config, "gpus", gpus) != GPC_OK) return fail("--gpus: ");
    if (strcmp(config.log_level, "debug") == 0)
        gpc_log_set_level(GPC_LOG_DEBUG);
    else if (strcmp(config.log_level, "warn") == 0)
        gpc_log_set_level(GPC_LOG_WARN);
    else if (strcmp(config.log_level, "error") == 0)
        gpc_log_set_level(GPC_LOG_ERROR);

    signal(SIGPIPE, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    gpcd_daemon *daemon;
    /* Created before detaching, so configuration errors reach the terminal. */
    if (gpcd_daemon_create(&config, &daemon) != GPC_OK) return fail("");
    if (!foreground) {
        /* MHD's threads do not survive fork: stop, detach, start again. */
        gpcd_daemon_destroy(daemon);
        if (gpc_mkdir_p(config.state_dir) != GPC_OK || daemonize(config.state_dir) != 0) {
            fprintf(stderr, "gpcd: error: cannot become a daemon: %s\n", strerror(errno));
            return 1;
        }
        if (gpcd_daemon_create(&config, &daemon) != GPC_OK) return fail("");
    }
    running_daemon = daemon;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    gpc_status st = gpcd_daemon_run(daemon);
    running_daemon = NULL;
    gpcd_daemon_destroy(daemon);
    return st == GPC_OK ? 0 : 1;
}
