/*
 * log.c: leveled logging to stderr.
 *
 * One line per call, written with a single fprintf so lines from several
 * threads do not interleave mid-line. The level comes from the GPC_LOG
 * setting (gpc/settings.h) the first time anything is logged.
 */
#include "gpc/core.h"
#include "gpc/settings.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int log_level = -1;

static void log_level_from_env(void) {
    const char *env = gpc_setting_str("GPC_LOG");
    log_level = GPC_LOG_INFO;
    if (!env) return;
    if (strcmp(env, "debug") == 0)
        log_level = GPC_LOG_DEBUG;
    else if (strcmp(env, "warn") == 0)
        log_level = GPC_LOG_WARN;
    else if (strcmp(env, "error") == 0)
        log_level = GPC_LOG_ERROR;
}

void gpc_log_set_level(gpc_log_level level) {
    log_level = (int)level;
}

gpc_log_level gpc_log_get_level(void) {
    if (log_level < 0) log_level_from_env();
    return (gpc_log_level)log_level;
}

void gpc_log(gpc_log_level level, const char *fmt, ...) {
    static const char *const names[] = {"debug", "info", "warning", "error"};
    char line[2048];
    va_list ap;
    if ((int)level < (int)gpc_log_get_level()) return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (level == GPC_LOG_INFO)
        fprintf(stderr, "%s\n", line);
    else
        fprintf(stderr, "gpc: %s: %s\n", names[level], line);
}
