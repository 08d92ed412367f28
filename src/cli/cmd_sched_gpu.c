/*
 * cmd_sched_gpu.c: gpc gpu drain|resume N: takes a GPU out of gpcd's
 * service (jobs on it carry on, new ones go elsewhere) or puts it back.
 * gpcd drains a GPU by itself on a hardware-error alert; only an admin
 * (root or gpcd's user) resumes it.
 */
#include "cli/cmd_sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cmd_gpu(int argc, char **argv) {
    const char *socket = NULL, *positional[2];
    int npositional = 0;
    const cli_option options[] = {
        {"socket", CLI_STRING, &socket, "PATH", "gpcd's socket"},
        {0},
    };
    const cli_spec spec = {"gpu",
                           "gpu drain|resume N",
                           "Drain GPU N (no new jobs start on it; running ones carry on) or "
                           "resume it. gpcd drains a GPU by itself when it reports hardware "
                           "errors; only root or gpcd's user may drain or resume.",
                           options,
                           2,
                           positional,
                           &npositional};
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    if (npositional != 2)
        return cli_usage_error("gpu", "give an action and a GPU, e.g. gpc gpu drain 3");
    int drain = strcmp(positional[0], "drain") == 0;
    if (!drain && strcmp(positional[0], "resume") != 0)
        return cli_usage_error("gpu", "unknown action '%s' (use drain or resume)", positional[0]);
    char *end;
    long gpu = strtol(positional[1], &end, 10);
    if (end == positional[1] || *end || gpu < 0 || gpu >= GPCD_MAX_GPUS)
        return cli_usage_error("gpu", "'%s' is not a GPU index (0-%d)", positional[1],
                               GPCD_MAX_GPUS - 1);
    char path[64];
    snprintf(path, sizeof path, "/gpus/%ld/%s", gpu, drain ? "drain" : "resume");
    gpcd_response r;
    int rc = gpcd_cli_call("gpu", socket, "POST", path, "", &r);
    if (rc) return rc;
    gpcd_response_free(&r);
    printf("GPU %ld %s\n", gpu,
           drain ? "drained: running jobs carry on, new ones go elsewhere" : "back in service");
    return CLI_EXIT_OK;
}
