/*
 * stop.c: Ctrl-C and SIGTERM as a request to stop cleanly (cli.h), for the
 * commands whose long loops can end early with what they have (gpc train
 * with a checkpoint, gpc md, gpc stencil): the handler records the signal
 * and calls the command's hook, if any. A second Ctrl-C stops the process
 * at once (SA_RESETHAND). A repeated SIGTERM does not: it comes from
 * managers, and one request often arrives several times (gpcd signals every
 * process of a job, and gpc launch or mpirun forward it to their ranks as
 * well), so a second copy must not kill a rank while it saves its
 * checkpoint. Managers that will not wait send SIGKILL after their grace.
 */
#include "cli/cli.h"

#include <signal.h>
#include <string.h>

static volatile sig_atomic_t stop_signal;
static void (*stop_hook)(void);

static void on_stop(int sig) {
    int first = stop_signal == 0;
    if (first) stop_signal = sig;
    if (stop_hook && (first || sig != SIGTERM)) stop_hook();
}

void cli_catch_stop(void (*hook)(void)) {
    stop_hook = hook;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sa.sa_flags = 0;
    sigaction(SIGTERM, &sa, NULL);
}

int cli_stop_signal(void) {
    return stop_signal;
}

const char *cli_stop_name(void) {
    return stop_signal == SIGINT ? "Ctrl-C" : stop_signal == SIGTERM ? "SIGTERM" : "a signal";
}
