/*
 * stop.c: Ctrl-C and SIGTERM as a request to stop cleanly (cli.h), for the
 * commands whose long loops can end early with what they have (gpc train
 * with a checkpoint, gpc md, gpc stencil): the handler records the signal
 * and calls the command's hook, if any; SA_RESETHAND makes a second one stop
 * the process at once.
 */
#include "cli/cli.h"

#include <signal.h>
#include <string.h>

static volatile sig_atomic_t stop_signal;
static void (*stop_hook)(void);

static void on_stop(int sig) {
    stop_signal = sig;
    if (stop_hook) stop_hook();
}

void cli_catch_stop(void (*hook)(void)) {
    stop_hook = hook;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int cli_stop_signal(void) {
    return stop_signal;
}

const char *cli_stop_name(void) {
    return stop_signal == SIGINT ? "Ctrl-C" : stop_signal == SIGTERM ? "SIGTERM" : "a signal";
}
