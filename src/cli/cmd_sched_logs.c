/*
 * cmd_sched_logs.c: gpc logs JOB [-f] (the job's stdout and stderr, as
 * gpcd recorded them) and gpc cancel JOB.
 *
 * Logs are fetched in pieces by byte offset, so -f follows a running job by
 * asking for what came after the last piece until the job has ended.
 */
#include "cli/cmd_sched.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int job_argument(const char *command, int npositional, const char **positional,
                        long long *id) {
    if (npositional != 1) return cli_usage_error(command, "give one job id");
    char *end;
    *id = strtoll(positional[0], &end, 10);
    if (*end || *id < 1)
        return cli_usage_error(command, "'%s' is not a job id (the number gpc submit printed)",
                               positional[0]);
    return 0;
}

static int job_has_ended(const char *state) {
    return strcmp(state, "completed") == 0 || strcmp(state, "failed") == 0 ||
           strcmp(state, "cancelled") == 0;
}

int cmd_logs(int argc, char **argv) {
    int follow = 0;
    const char *socket = NULL, *positional[1];
    int npositional = 0;
    const cli_option options[] = {
        {"follow", CLI_FLAG, &follow, NULL, "keep printing output until the job ends (also -f)"},
        {"socket", CLI_STRING, &socket, "PATH", "gpcd's socket"},
        {0},
    };
    const cli_spec spec = {
        "logs",     "logs JOB [-f]", "Print a job's output (stdout and stderr).", options, 1,
        positional, &npositional};
    /* -f is the short form everyone types */
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "-f") == 0) argv[i] = (char *)"--follow";
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    int rc;
    long long id = 0;
    if ((rc = job_argument("logs", npositional, positional, &id))) return rc;
    long long offset = 0;
    for (;;) {
        char path[128];
        snprintf(path, sizeof path, "/jobs/%lld/logs?offset=%lld", id, offset);
        gpcd_response r;
        if ((rc = gpcd_cli_call("logs", socket, "GET", path, NULL, &r))) return rc;
        if (r.body_len) {
            fwrite(r.body, 1, r.body_len, stdout);
            fflush(stdout);
        }
        long long next = strtoll(r.next_offset, NULL, 10);
        int ended = job_has_ended(r.job_state);
        size_t got = r.body_len;
        gpcd_response_free(&r);
        if (next > offset) offset = next;
        if (got > 0) continue; /* more may be waiting right away */
        if (!follow || ended) break;
        usleep(300 * 1000);
    }
    return CLI_EXIT_OK;
}

int cmd_cancel(int argc, char **argv) {
    const char *socket = NULL, *positional[1];
    int npositional = 0;
    const cli_option options[] = {
        {"socket", CLI_STRING, &socket, "PATH", "gpcd's socket"},
        {0},
    };
    const cli_spec spec = {"cancel",
                           "cancel JOB",
                           "Cancel a job: a waiting job is dropped, a running one gets SIGTERM "
                           "and, after gpcd's grace period, SIGKILL. Only its owner or root may.",
                           options,
                           1,
                           positional,
                           &npositional};
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    int rc;
    long long id = 0;
    if ((rc = job_argument("cancel", npositional, positional, &id))) return rc;
    char path[64];
    snprintf(path, sizeof path, "/jobs/%lld/cancel", id);
    gpcd_response r;
    if ((rc = gpcd_cli_call("cancel", socket, "POST", path, "", &r))) return rc;
    if (r.status == 202)
        printf("job %lld is stopping (SIGTERM now, SIGKILL after the grace period)\n", id);
    else
        printf("job %lld cancelled\n", id);
    gpcd_response_free(&r);
    return CLI_EXIT_OK;
}
