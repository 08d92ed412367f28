/*
 * cmd_sched_queue.c: gpc queue (waiting and running jobs, or all with
 * --all) and gpc show JOB (one job with its history). --json prints gpcd's
 * JSON unchanged, for scripts.
 */
#include "cli/cmd_sched.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *text_of(json_t *o, const char *key, const char *fallback) {
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : fallback;
}

static double number_of(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : 0;
}

/* The command as one line, shortened to width characters. */
static void command_line(json_t *job, char *buf, size_t width) {
    size_t used = 0;
    buf[0] = '\0';
    json_t *cmd = json_object_get(job, "command");
    for (size_t i = 0; i < json_array_size(cmd) && used + 1 < width; i++) {
        const char *s = json_string_value(json_array_get(cmd, i));
        used += (size_t)snprintf(buf + used, width - used, i ? " %s" : "%s", s ? s : "");
    }
    if (used >= width - 1 && width > 4) strcpy(buf + width - 4, "...");
}

static void gpu_list(json_t *job, char *buf, size_t size) {
    json_t *gpus = json_object_get(job, "assigned_gpus");
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < json_array_size(gpus) && used + 8 < size; i++)
        used += (size_t)snprintf(buf + used, size - used, i ? ",%lld" : "%lld",
                                 (long long)json_integer_value(json_array_get(gpus, i)));
}

/* "2", or for an elastic job its range, after the count it runs at: "2/1-4". */
static void gpu_count(json_t *job, char *buf, size_t size) {
    long long gpus = (long long)json_integer_value(json_object_get(job, "gpus"));
    long long lo = (long long)json_integer_value(json_object_get(job, "gpus_min"));
    long long hi = (long long)json_integer_value(json_object_get(job, "gpus_max"));
    if (!json_is_true(json_object_get(job, "elastic")))
        snprintf(buf, size, "%lld", gpus);
    else if (json_array_size(json_object_get(job, "assigned_gpus")) > 0)
        snprintf(buf, size, "%lld/%lld-%lld", gpus, lo, hi);
    else
        snprintf(buf, size, "%lld-%lld", lo, hi);
}

static void print_table(json_t *jobs) {
    double now = gpc_wall_seconds();
    printf("%-6s %-10s %-10s %-6s %-11s %-7s %-9s %-9s %-8s %s\n", "ID", "STATE", "OWNER", "PRIO",
           "TYPE", "GPUS", "MEM", "TIME", "ON", "COMMAND");
    for (size_t i = 0; i < json_array_size(jobs); i++) {
        json_t *j = json_array_get(jobs, i);
        const char *state = text_of(j, "state", "?");
        char mem[32] = "-", age[32], on[64], cmd[80], count[32];
        double m = number_of(j, "mem");
        if (m > 0) cli_format_bytes(m, mem, sizeof mem);
        double start = number_of(j, "start_time"), end = number_of(j, "end_time");
        double since = start > 0 ? start : number_of(j, "submit_time");
        gpcd_cli_age((end > 0 ? end : now) - since, age, sizeof age);
        gpu_list(j, on, sizeof on);
        gpu_count(j, count, sizeof count);
        command_line(j, cmd, sizeof cmd);
        const char *name = text_of(j, "name", NULL);
        printf("%-6lld %-10s %-10.10s %-6s %-11s %-7s %-9s %-9s %-8s %s%s%s\n",
               (long long)json_integer_value(json_object_get(j, "id")), state,
               text_of(j, "owner", "?"), text_of(j, "priority_name", "?"), text_of(j, "type", "?"),
               count, mem, age, on[0] ? on : "-", name ? name : "", name ? ": " : "", cmd);
    }
}

int cmd_queue(int argc, char **argv) {
    int json = 0, all = 0;
    const char *state = NULL, *socket = NULL;
    const cli_option options[] = {
        {"all", CLI_FLAG, &all, NULL, "include finished jobs"},
        {"state", CLI_STRING, &state, "S[,S]", "only jobs in these states (queued, running, ...)"},
        {"json", CLI_FLAG, &json, NULL, "print gpcd's JSON"},
        {"socket", CLI_STRING, &socket, "PATH", "gpcd's socket"},
        {0},
    };
    const cli_spec spec = {
        "queue",
        "queue [--all] [--state S] [--json]",
        "List gpcd's waiting and running jobs (with --all, finished ones too), by id.",
        options,
        0,
        NULL,
        NULL};
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    int rc;
    char path[256];
    snprintf(path, sizeof path, "/jobs%s%s%s", all ? "?all=1" : "",
             state ? (all ? "&state=" : "?state=") : "", state ? state : "");
    if (state && strspn(state, "abcdefghijklmnopqrstuvwxyz,") != strlen(state))
        return cli_usage_error("queue", "--state takes names such as queued,running");
    gpcd_response r;
    if ((rc = gpcd_cli_call("queue", socket, "GET", path, NULL, &r))) return rc;
    if (json) {
        fwrite(r.body, 1, r.body_len, stdout);
    } else {
        json_t *reply = json_loadb(r.body, r.body_len, 0, NULL);
        print_table(json_object_get(reply, "jobs"));
        json_decref(reply);
    }
    gpcd_response_free(&r);
    return CLI_EXIT_OK;
}

static int parse_job_id(const char *command, const char *text, long long *id) {
    char *end;
    *id = strtoll(text, &end, 10);
    if (*end || *id < 1)
        return cli_usage_error(command, "'%s' is not a job id (the number gpc submit printed)",
                               text);
    return 0;
}

int cmd_show(int argc, char **argv) {
    int json = 0;
    const char *socket = NULL, *positional[1];
    int npositional = 0;
    const cli_option options[] = {
        {"json", CLI_FLAG, &json, NULL, "print gpcd's JSON"},
        {"socket", CLI_STRING, &socket, "PATH", "gpcd's socket"},
        {0},
    };
    const cli_spec spec = {
        "show",     "show JOB [--json]", "Show one job: its fields and history.", options, 1,
        positional, &npositional};
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    int rc;
    if (npositional != 1) return cli_usage_error("show", "give a job id");
    long long id;
    if ((rc = parse_job_id("show", positional[0], &id))) return rc;
    char path[64];
    snprintf(path, sizeof path, "/jobs/%lld", id);
    gpcd_response r;
    if ((rc = gpcd_cli_call("show", socket, "GET", path, NULL, &r))) return rc;
    if (json) {
        fwrite(r.body, 1, r.body_len, stdout);
        gpcd_response_free(&r);
        return CLI_EXIT_OK;
    }
    json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
    gpcd_response_free(&r);
    char cmd[4096], mem[32] = "unspecified", on[256], buf[64];
    command_line(j, cmd, sizeof cmd);
    gpu_list(j, on, sizeof on);
    if (number_of(j, "mem") > 0) cli_format_bytes(number_of(j, "mem"), mem, sizeof mem);
    printf("job %lld: %s\n", id, text_of(j, "state", "?"));
    printf("  command    %s\n  directory  %s\n", cmd, text_of(j, "cwd", "/"));
    printf("  owner      %s\n  type       %s\n  priority   %s\n", text_of(j, "owner", "?"),
           text_of(j, "type", "?"), text_of(j, "priority_name", "?"));
    char count[32];
    gpu_count(j, count, sizeof count);
    printf("  gpus       %s%s%s%s%s\n  memory     %s per GPU\n", count,
           json_is_true(json_object_get(j, "elastic")) ? " (elastic)" : "", on[0] ? " (on " : "",
           on, on[0] ? ")" : "", mem);
    if (text_of(j, "data", NULL)) printf("  data       %s\n", text_of(j, "data", ""));
    if (number_of(j, "time_limit") > 0)
        printf("  time limit %s\n",
               cli_format_duration(number_of(j, "time_limit"), buf, sizeof buf));
    if (json_is_integer(json_object_get(j, "exit_code")))
        printf("  exit code  %lld\n",
               (long long)json_integer_value(json_object_get(j, "exit_code")));
    if (json_integer_value(json_object_get(j, "preemptions")) > 0)
        printf("  preempted  %lld time(s)\n",
               (long long)json_integer_value(json_object_get(j, "preemptions")));
    if (text_of(j, "message", NULL)) printf("  note       %s\n", text_of(j, "message", ""));
    json_t *events = json_object_get(j, "events");
    double first = json_array_size(events) ? number_of(json_array_get(events, 0), "time") : 0;
    if (json_array_size(events)) printf("history:\n");
    for (size_t i = 0; i < json_array_size(events); i++) {
        json_t *e = json_array_get(events, i);
        const char *message = text_of(e, "message", NULL);
        printf("  +%-8s %s%s%s\n", gpcd_cli_age(number_of(e, "time") - first, buf, sizeof buf),
               text_of(e, "state", "?"), message ? ": " : "", message ? message : "");
    }
    json_decref(j);
    return CLI_EXIT_OK;
}
