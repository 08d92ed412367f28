/*
 * cmd_sched_top.c: gpc top, a live view of gpcd's server: every GPU's
 * utilisation, memory, temperature and power, the jobs on it, the queue and
 * the active alerts, redrawn every --interval seconds. --once prints one
 * frame without terminal control codes (for scripts and tests).
 */
#include "cli/cmd_sched.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t top_stop;

static void on_interrupt(int sig) {
    (void)sig;
    top_stop = 1;
}

static double num(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : -1;
}

static const char *str(json_t *o, const char *key, const char *fallback) {
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : fallback;
}

static void bar(double fraction, char *buf, int width) {
    int filled = (int)(fraction * width + 0.5);
    if (filled < 0) filled = 0;
    if (filled > width) filled = width;
    for (int i = 0; i < width; i++)
        buf[i] = i < filled ? '#' : '.';
    buf[width] = '\0';
}

static void render(FILE *out, json_t *status, json_t *jobs) {
    char b1[32], b2[32], b3[32];
    json_t *counts = json_object_get(status, "jobs");
    fprintf(out, "gpcd %s on %s, up %s, last scheduling pass %.2f ms\n",
            str(status, "version", "?"), str(status, "provider", "?"),
            cli_format_duration(num(status, "uptime"), b1, sizeof b1),
            num(status, "last_pass_seconds") * 1e3);
    fprintf(out,
            "jobs: %lld running, %lld waiting, %lld completed, %lld failed, %lld cancelled\n\n",
            (long long)num(status, "running"), (long long)num(status, "pending"),
            (long long)num(counts, "completed"), (long long)num(counts, "failed"),
            (long long)num(counts, "cancelled"));
    fprintf(out, "GPU  %-20s %5s %-12s %-21s %6s %-11s %s\n", "NAME", "UTIL", "", "MEMORY", "TEMP",
            "POWER", "JOBS");
    json_t *gpus = json_object_get(status, "gpus");
    for (size_t i = 0; i < json_array_size(gpus); i++) {
        json_t *g = json_array_get(gpus, i);
        double util = num(g, "utilization"), used = num(g, "memory_used"),
               total = num(g, "memory_total");
        char ubar[16], mem[64], power[32], temp[16], ids[128] = "";
        bar(util / 100.0, ubar, 10);
        snprintf(mem, sizeof mem, "%s / %s", cli_format_bytes(used, b2, sizeof b2),
                 cli_format_bytes(total, b3, sizeof b3));
        if (num(g, "power") >= 0)
            snprintf(power, sizeof power, "%.0f/%.0f W", num(g, "power"), num(g, "power_limit"));
        else
            snprintf(power, sizeof power, "-");
        if (num(g, "temperature") >= 0)
            snprintf(temp, sizeof temp, "%.0f C", num(g, "temperature"));
        else
            snprintf(temp, sizeof temp, "-");
        json_t *on = json_object_get(g, "jobs");
        size_t used_ids = 0;
        for (size_t k = 0; k < json_array_size(on) && used_ids + 12 < sizeof ids; k++)
            used_ids +=
                (size_t)snprintf(ids + used_ids, sizeof ids - used_ids, k ? ",%lld" : "%lld",
                                 (long long)json_integer_value(json_array_get(on, k)));
        fprintf(out, "%3lld  %-20.20s %4.0f%% [%s] %-21s %6s %-11s %s\n",
                (long long)num(g, "index"), str(g, "name", "?"), util < 0 ? 0 : util, ubar, mem,
                temp, power, ids[0] ? ids : "-");
    }
    json_t *alerts = json_object_get(status, "alerts");
    fprintf(out, "\nalerts: %s\n", json_array_size(alerts) ? "" : "none");
    for (size_t i = 0; i < json_array_size(alerts); i++) {
        json_t *a = json_array_get(alerts, i);
        fprintf(out, "  [%s] %s\n", str(a, "kind", "?"), str(a, "message", ""));
    }
    json_t *list = json_object_get(jobs, "jobs");
    fprintf(out, "\n%-6s %-10s %-10s %-6s %-11s %-5s %-8s %s\n", "ID", "STATE", "OWNER", "PRIO",
            "TYPE", "GPUS", "ON", "COMMAND");
    size_t shown = 0;
    for (size_t i = 0; i < json_array_size(list) && shown < 30; i++, shown++) {
        json_t *j = json_array_get(list, i);
        char on[64] = "", cmd[64] = "";
        json_t *assigned = json_object_get(j, "assigned_gpus");
        size_t u = 0;
        for (size_t k = 0; k < json_array_size(assigned) && u + 8 < sizeof on; k++)
            u += (size_t)snprintf(on + u, sizeof on - u, k ? ",%lld" : "%lld",
                                  (long long)json_integer_value(json_array_get(assigned, k)));
        json_t *c = json_object_get(j, "command");
        u = 0;
        for (size_t k = 0; k < json_array_size(c) && u + 2 < sizeof cmd; k++)
            u += (size_t)snprintf(cmd + u, sizeof cmd - u, k ? " %s" : "%s",
                                  str(json_array_get(c, k), NULL, ""));
        fprintf(out, "%-6lld %-10s %-10.10s %-6s %-11s %-5lld %-8s %s\n", (long long)num(j, "id"),
                str(j, "state", "?"), str(j, "owner", "?"), str(j, "priority_name", "?"),
                str(j, "type", "?"), (long long)num(j, "gpus"), on[0] ? on : "-", cmd);
    }
    if (json_array_size(list) > shown)
        fprintf(out, "... and %zu more (gpc queue lists them all)\n",
                json_array_size(list) - shown);
}

int cmd_top(int argc, char **argv) {
    int once = 0;
    double interval = 1.0;
    const char *socket = NULL;
    const cli_option options[] = {
        {"once", CLI_FLAG, &once, NULL, "print one frame and exit"},
        {"interval", CLI_FLOAT, &interval, "SECONDS", "time between frames (default 1)"},
        {"socket", CLI_STRING, &socket, "PATH", "gpcd's socket"},
        {0},
    };
    const cli_spec spec = {"top",
                           "top [--once] [--interval SECONDS]",
                           "Live view of the GPUs, jobs and alerts gpcd sees. Ctrl-C quits.",
                           options,
                           0,
                           NULL,
                           NULL};
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    int rc;
    if (!(interval >= 0.1)) return cli_usage_error("top", "--interval must be at least 0.1");
    signal(SIGINT, on_interrupt);
    signal(SIGTERM, on_interrupt);
    int tty = isatty(STDOUT_FILENO) && !once;
    while (!top_stop) {
        gpcd_response status, jobs;
        if ((rc = gpcd_cli_call("top", socket, "GET", "/status", NULL, &status))) return rc;
        if ((rc = gpcd_cli_call("top", socket, "GET", "/jobs", NULL, &jobs))) {
            gpcd_response_free(&status);
            return rc;
        }
        json_t *s = json_loadb(status.body, status.body_len, 0, NULL);
        json_t *j = json_loadb(jobs.body, jobs.body_len, 0, NULL);
        if (tty) fputs("\033[H\033[2J", stdout);
        render(stdout, s, j);
        fflush(stdout);
        json_decref(s);
        json_decref(j);
        gpcd_response_free(&status);
        gpcd_response_free(&jobs);
        if (once) break;
        usleep((useconds_t)(interval * 1e6));
    }
    return CLI_EXIT_OK;
}
