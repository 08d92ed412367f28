/*
 * progress.c: the live progress line of long commands. On a terminal the
 * line is redrawn in place; into a log file it prints one line per interval
 * so logs stay readable.
 */
#include "cli/cli.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

void cli_progress_init(cli_progress *p) {
    p->tty = isatty(STDERR_FILENO);
    p->last = -1e9;
    p->interval = p->tty ? 0.1 : 10.0;
    p->open = 0;
}

void cli_progress_update(cli_progress *p, int force, const char *fmt, ...) {
    double now = gpc_time_seconds();
    char line[512];
    va_list ap;
    if (!force && now - p->last < p->interval) return;
    p->last = now;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (p->tty) {
        fprintf(stderr, "\r\033[K%s", line);
        p->open = 1;
    } else {
        fprintf(stderr, "%s\n", line);
    }
    fflush(stderr);
}

void cli_progress_end(cli_progress *p) {
    if (p->tty && p->open) fprintf(stderr, "\n");
    p->open = 0;
}
