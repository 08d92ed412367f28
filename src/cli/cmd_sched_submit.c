/*
 * cmd_sched_submit.c: gpc submit: hands a command to gpcd to run when GPUs
 * are free. Everything after "--" is the command, passed through untouched;
 * the job inherits the current directory and environment. The job id is
 * printed alone on stdout, so `id=$(gpc submit ... -- cmd)` works.
 *
 * Only the environment a job needs is sent: the variables of
 * submit_env_names (the shell, locale, paths, and the settings of gpc,
 * OpenMP, NCCL and CUDA) and those named with --env. gpcd keeps what it is
 * sent in its database until the job is gone, so a submitter's API keys and
 * passwords stay out of it unless the job needs them.
 */
#include "cli/cmd_sched.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

/* Variables a job gets without asking: NAME, or a PREFIX ending in '_'. */
static const char *const submit_env_names[] = {"PATH",
                                               "HOME",
                                               "USER",
                                               "LOGNAME",
                                               "SHELL",
                                               "LANG",
                                               "LANGUAGE",
                                               "LC_",
                                               "TZ",
                                               "TERM",
                                               "TMPDIR",
                                               "LD_LIBRARY_PATH",
                                               "PYTHONPATH",
                                               "PYTHONUNBUFFERED",
                                               "VIRTUAL_ENV",
                                               "CONDA_PREFIX",
                                               "CONDA_DEFAULT_ENV",
                                               "XDG_CACHE_HOME",
                                               "HF_HOME",
                                               "OMP_",
                                               "OPENBLAS_",
                                               "MKL_",
                                               "GPC_",
                                               "NCCL_",
                                               "CUDA_"};

static int env_wanted(const char *key, const cli_list *named) {
    for (size_t i = 0; i < sizeof submit_env_names / sizeof submit_env_names[0]; i++) {
        const char *n = submit_env_names[i];
        size_t len = strlen(n);
        if (n[len - 1] == '_' ? strncmp(key, n, len) == 0 : strcmp(key, n) == 0) return 1;
    }
    for (int i = 0; i < named->count; i++)
        if (strcmp(key, named->items[i]) == 0 || strcmp(named->items[i], "ALL") == 0) return 1;
    return 0;
}

int cmd_submit(int argc, char **argv) {
    const char *gpus = "1";
    const char *mem = NULL, *priority = NULL, *type = "batch", *data = NULL, *time_limit = NULL,
               *name = NULL, *socket = NULL;
    cli_list env_names = {0};
    const cli_option options[] = {
        {"gpus", CLI_STRING, &gpus, "N|MIN-MAX",
         "GPUs the job needs, all at once (default 1); a range MIN-MAX makes it elastic: it "
         "runs at any count in it, restarted from its checkpoint when the count changes"},
        {"mem", CLI_STRING, &mem, "SIZE", "GPU memory needed per GPU, e.g. 40G"},
        {"priority", CLI_STRING, &priority, "P", "low, normal (default), high or 0-100"},
        {"type", CLI_STRING, &type, "TYPE",
         "train, infer, batch (default) or interactive: how it is placed"},
        {"data", CLI_STRING, &data, "PATH", "data the job reads, to place it near that data"},
        {"time", CLI_STRING, &time_limit, "DURATION",
         "time limit such as 30m or 2h (lets short jobs backfill)"},
        {"name", CLI_STRING, &name, "NAME", "a label shown in gpc queue"},
        {"env", CLI_STRING_LIST, &env_names, "NAME...",
         "pass these variables too (API keys the job needs); ALL passes everything"},
        {"socket", CLI_STRING, &socket, "PATH",
         "gpcd's socket (default $GPC_SOCKET or " GPCD_DEFAULT_SOCKET ")"},
        {0},
    };
    const cli_spec spec = {"submit",
                           "submit [OPTIONS] -- COMMAND [ARGS...]",
                           "Queue COMMAND with gpcd. It starts when the GPUs it needs are free, "
                           "with CUDA_VISIBLE_DEVICES set to them; the job id is printed on the "
                           "last line.",
                           options,
                           0,
                           NULL,
                           NULL};
    /* cli_parse treats "--" as an argument: split the command off first. */
    int split = argc;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--") == 0) {
            split = i;
            break;
        }
    int rc = cli_parse(&spec, split, argv);
    if (rc == CLI_HELP_SHOWN) return CLI_EXIT_OK;
    if (rc) return rc;
    if (split >= argc - 1)
        return cli_usage_error("submit", "give the command after '--', e.g. gpc submit --gpus 2 "
                                         "-- gpc train --config run.ini");
    int gpus_min, gpus_max;
    if (gpcd_gpus_parse(gpus, &gpus_min, &gpus_max) != GPC_OK)
        return cli_usage_error("submit", "--gpus: %s", gpc_last_error());
    for (int i = 0; i < env_names.count; i++)
        if (strcmp(env_names.items[i], "ALL") != 0 && !getenv(env_names.items[i]))
            return cli_usage_error("submit", "--env %s: no such variable in this environment",
                                   env_names.items[i]);
    json_t *job = json_object();
    json_t *command = json_array();
    for (int i = split + 1; i < argc; i++)
        json_array_append_new(command, json_string(argv[i]));
    json_object_set_new(job, "command", command);
    json_object_set_new(job, "gpus",
                        gpus_min == gpus_max ? json_integer(gpus_min) : json_string(gpus));
    json_object_set_new(job, "type", json_string(type));
    if (mem) json_object_set_new(job, "mem", json_string(mem));
    if (priority) json_object_set_new(job, "priority", json_string(priority));
    if (time_limit) json_object_set_new(job, "time_limit", json_string(time_limit));
    if (name) json_object_set_new(job, "name", json_string(name));
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd)) {
        json_decref(job);
        fprintf(stderr, "gpc submit: error: cannot read the current directory\n");
        return CLI_EXIT_RUNTIME;
    }
    json_object_set_new(job, "cwd", json_string(cwd));
    if (data) {
        char *absolute = realpath(data, NULL);
        if (!absolute && data[0] != '/') {
            json_decref(job);
            return cli_usage_error("submit", "--data %s does not exist (give an existing path)",
                                   data);
        }
        json_object_set_new(job, "data", json_string(absolute ? absolute : data));
        free(absolute);
    }
    json_t *env = json_object();
    for (char **e = environ; *e; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq || eq == *e) continue;
        char key[256];
        size_t len = (size_t)(eq - *e);
        if (len >= sizeof key) continue;
        memcpy(key, *e, len);
        key[len] = '\0';
        if (!env_wanted(key, &env_names)) continue;
        json_t *value = json_string(eq + 1);
        if (value) json_object_set_new(env, key, value); /* skips values that are not UTF-8 */
    }
    json_object_set_new(job, "env", env);
    char *body = json_dumps(job, JSON_COMPACT);
    json_decref(job);
    if (!body) {
        fprintf(stderr, "gpc submit: error: the command or environment is not valid UTF-8\n");
        return CLI_EXIT_USAGE;
    }
    gpcd_response response;
    rc = gpcd_cli_call("submit", socket, "POST", "/jobs", body, &response);
    free(body);
    if (rc) return rc;
    json_t *reply = json_loadb(response.body, response.body_len, 0, NULL);
    json_int_t id = json_integer_value(json_object_get(reply, "id"));
    json_decref(reply);
    gpcd_response_free(&response);
    if (id <= 0) {
        fprintf(stderr, "gpc submit: error: gpcd accepted the job but sent no id\n");
        return CLI_EXIT_RUNTIME;
    }
    fprintf(stderr, "gpc submit: job %lld queued (%s, %s GPU%s%s%s%s)\n", (long long)id, type, gpus,
            gpus_max == 1 ? "" : "s", gpus_min < gpus_max ? ", elastic" : "",
            priority ? ", priority " : "", priority ? priority : "");
    printf("%lld\n", (long long)id);
    return CLI_EXIT_OK;
}
