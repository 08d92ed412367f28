/*
 * config.c: gpcd's configuration is one table of options, each with its key,
 * default and documentation (as in Redis's config.c). The defaults, the ini
 * parser (inih), `gpcd --print-options` and docs/gpcd.md all come from this
 * table, so they cannot disagree.
 */
#include "gpc/sched.h"

#include <errno.h>
#include <ini.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* OPT_NUMA_RULES is parsed into policy.numa_rules rather than kept as text. */
typedef enum {
    OPT_STRING,
    OPT_DURATION,
    OPT_DURATION_OR_0, /* a duration, or 0 for "never" */
    OPT_NUMBER,
    OPT_BYTES,
    OPT_MODE,
    OPT_INT,
    OPT_NUMA_RULES
} option_type;

typedef struct {
    const char *key;
    option_type type;
    size_t offset; /* into gpcd_config */
    size_t size;   /* for strings */
    const char *default_value;
    const char *doc;
} config_option;

#define STR(field) OPT_STRING, offsetof(gpcd_config, field), sizeof(((gpcd_config *)0)->field)
#define NUM(kind, field) kind, offsetof(gpcd_config, field), 0

static const config_option options[] = {
    {"state_dir", STR(state_dir), "/var/lib/gpcd",
     "Directory for the job database (gpcd.db), job logs and exit files, and the socket."},
    {"socket", STR(socket), "",
     "Unix socket the API listens on; empty means STATE_DIR/gpcd.sock. Clients find it with "
     "--socket or GPC_SOCKET."},
    {"socket_mode", NUM(OPT_MODE, socket_mode), "0600",
     "Permissions of the socket (octal). 0600 lets only gpcd's user in; 0666 lets every local "
     "user submit, each identified by SO_PEERCRED."},
    {"listen", STR(listen), "",
     "Optional TCP address HOST:PORT for the API as well; needs token_file."},
    {"token_file", STR(token_file), "",
     "File holding the bearer token TCP clients must send (Authorization: Bearer TOKEN); gpcd "
     "refuses one that other users can read or write (chmod 600 it)."},
    {"gpus", STR(gpus), "nvml",
     "GPU provider: nvml (the NVIDIA driver; gpcd refuses to start without it) or "
     "simulated:COUNTxMEMORY such as simulated:8x141GB for tests and trace studies, or none "
     "(only with backend = slurm, on a machine without GPUs)."},
    {"policies", STR(policies),
     "priority,aging,least_loaded,binpack,task_type,locality,backfill,preemption",
     "Placement policies, comma-separated, any subset of: priority, aging, least_loaded, "
     "binpack, task_type, locality, backfill, preemption, shortest_first."},
    {"aging_per_hour", NUM(OPT_NUMBER, policy.aging_per_hour), "10",
     "Priority points a waiting job gains per hour (aging), so low priority work cannot "
     "starve."},
    {"shortest_first_points", NUM(OPT_NUMBER, policy.shortest_first_points), "10",
     "With shortest_first: priority points a job gains for each halving of the GPU time it "
     "asks for (time limit x GPUs, counted down from one GPU-year); jobs without a time limit "
     "gain none."},
    {"small_job_mem", NUM(OPT_BYTES, policy.small_job_mem), "24G",
     "Shared (inference, interactive) jobs needing at most this much GPU memory are "
     "bin-packed onto the fullest GPU that fits; bigger ones go to the least loaded."},
    {"data_numa", OPT_NUMA_RULES, 0, 0, "",
     "NUMA node of data paths, PREFIX=NODE,...; e.g. /datasets=0,/scratch=1. Paths not listed "
     "are looked up in sysfs."},
    {"preempt_grace", NUM(OPT_DURATION, preempt_grace), "30s",
     "Time a preempted or cancelled job gets between SIGTERM and SIGKILL (to checkpoint)."},
    {"preempt_min_runtime", NUM(OPT_DURATION, policy.preempt_min_runtime), "10m",
     "With preemption: a job is not preempted before it has run this long, and each time it "
     "was preempted doubles that (so no job is stopped over and over)."},
    {"preempt_margin", NUM(OPT_NUMBER, policy.preempt_margin), "20",
     "With preemption: a waiting job preempts only jobs of lower base priority whose effective "
     "priority (with aging and shortest_first) is at least this many points below its own."},
    {"elastic_grow_after", NUM(OPT_DURATION, policy.elastic_grow_after), "10m",
     "An elastic job (gpc submit --gpus MIN-MAX) grows, restarting from its checkpoint on "
     "more GPUs, only when nothing waits, it could at least double, and it has run this long "
     "at its count (365d: about never)."},
    {"kill_grace", NUM(OPT_DURATION, kill_grace), "10s",
     "Time between SIGTERM and SIGKILL when a job passes its time limit."},
    {"sample_interval", NUM(OPT_DURATION, sample_interval), "1s",
     "How often the monitor reads every GPU."},
    {"sample_retention", NUM(OPT_DURATION, sample_retention), "1d",
     "How long GPU samples are kept in the database."},
    {"alert_util_below", NUM(OPT_NUMBER, alert_util_below), "70",
     "Alert when a GPU running a job stays under this utilisation (percent) ..."},
    {"alert_util_window", NUM(OPT_DURATION, alert_util_window), "60s",
     "... for this long (the job is likely input-bound)."},
    {"alert_mem_above", NUM(OPT_NUMBER, alert_mem_above), "90",
     "Alert when a GPU's memory use passes this percentage."},
    {"alert_temp_above", NUM(OPT_NUMBER, alert_temp_above), "85",
     "Alert when a GPU is hotter than this (Celsius) ..."},
    {"alert_slowdown_margin", NUM(OPT_NUMBER, alert_slowdown_margin), "5",
     "... or within this many degrees of its own slowdown temperature."},
    {"simulated_file", STR(simulated_file), "",
     "With simulated GPUs: a file of lines 'GPU KEY VALUE' (util, mem_used, temperature, "
     "power) read at every sample, to play out load and faults."},
    {"max_body", NUM(OPT_INT, max_body), "1048576",
     "Largest request body the API accepts, in bytes."},
    {"peer_connections", NUM(OPT_INT, peer_connections), "64",
     "Connections one user (on the socket) or one address (on TCP) may hold at once; more are "
     "cut as they open, so no one can take every connection."},
    {"header_timeout", NUM(OPT_DURATION, header_timeout), "10s",
     "Time a client has to send a request's line and headers, from connecting or from its "
     "previous request; slower connections are cut."},
    {"log_max", NUM(OPT_BYTES, log_max), "100M",
     "Largest a job's log grows (at least 1M): past it gpcd keeps the first half and the latest "
     "output, with a line saying what was cut, so a job printing endlessly cannot fill the "
     "disk."},
    {"keep_finished", NUM(OPT_DURATION_OR_0, keep_finished), "0",
     "How long a job that ended (completed, failed, cancelled) is kept: its record, state "
     "changes, log and exit file; then gpcd removes them, oldest first. 0 keeps them forever "
     "(the database and STATE_DIR/jobs then grow with every job run)."},
    {"log_level", STR(log_level), "info", "debug, info, warn or error."},
    {"backend", STR(backend), "local",
     "Where jobs run: local (this server's GPUs, placed by the policies) or slurm (each job is "
     "handed to Slurm with sbatch and followed with scontrol; Slurm schedules the cluster)."},
    {"slurm_options", STR(slurm_options), "",
     "With backend = slurm: extra sbatch options for every job, separated by spaces, e.g. "
     "--partition=gpu --account=ml."},
    {"slurm_gpu_option", STR(slurm_gpu_option), "--gpus=%d",
     "With backend = slurm: the sbatch option carrying a job's GPU count (%d), e.g. "
     "--gres=gpu:%d on clusters without --gpus; empty sends none."},
    {"slurm_poll_interval", NUM(OPT_DURATION, slurm_poll_interval), "2s",
     "With backend = slurm: how often gpcd asks Slurm (scontrol) how its jobs are doing."},
    {"slurm_log_dir", STR(slurm_log_dir), "",
     "With backend = slurm: the folder jobs write their output to, for gpc logs. On a cluster, "
     "a folder the compute nodes and gpcd's host share (the default, STATE_DIR/jobs, is seen "
     "only by jobs that run on gpcd's own machine)."},
};

#define OPTION_COUNT ((int)(sizeof options / sizeof options[0]))

static gpcd_option_doc option_docs[OPTION_COUNT];

const gpcd_option_doc *gpcd_config_options(int *count) {
    for (int i = 0; i < OPTION_COUNT; i++) {
        option_docs[i].key = options[i].key;
        option_docs[i].default_value = options[i].default_value;
        option_docs[i].doc = options[i].doc;
    }
    *count = OPTION_COUNT;
    return option_docs;
}

gpc_status gpcd_config_set(gpcd_config *config, const char *key, const char *value) {
    const config_option *o = NULL;
    for (int i = 0; i < OPTION_COUNT; i++)
        if (strcmp(options[i].key, key) == 0) o = &options[i];
    if (!o)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "unknown option '%s' (gpcd --print-options lists them)", key);
    char *field = (char *)config + o->offset;
    switch (o->type) {
    case OPT_NUMA_RULES:
        return gpcd_numa_rules_parse(value, &config->policy);
    case OPT_STRING:
        /* sockaddr_un's sun_path holds 108 bytes; gpcd_config_finish
         * keeps paths under 100 */
        if (field == config->socket && strlen(value) > 99)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "socket path '%.40s...' is %zu bytes, too long for a unix socket "
                             "(at most 99 bytes); choose a shorter one",
                             value, strlen(value));
        if (strlen(value) >= o->size)
            return gpc_error(GPC_ERR_INVALID_ARG, "%s is too long (at most %zu characters)", key,
                             o->size - 1);
        snprintf(field, o->size, "%s", value);
        return GPC_OK;
    case OPT_DURATION_OR_0:
        if (strcmp(value, "0") == 0) {
            *(double *)field = 0;
            return GPC_OK;
        }
        /* fall through */
    case OPT_DURATION: {
        double v;
        if (gpcd_duration_parse(value, &v) != GPC_OK)
            return gpc_error_context(GPC_ERR_INVALID_ARG, "%s: ", key);
        *(double *)field = v;
        /* the scheduling pass sees only the policy part of the config, and
         * needs the grace to tell whether preempting would gain anything */
        if (field == (char *)&config->preempt_grace) config->policy.preempt_grace = v;
        return GPC_OK;
    }
    case OPT_NUMBER: {
        char *end;
        errno = 0;
        double v = strtod(value, &end);
        if (end == value || *end || errno || v < 0)
            return gpc_error(GPC_ERR_INVALID_ARG, "%s needs a number >= 0, not '%s'", key, value);
        *(double *)field = v;
        return GPC_OK;
    }
    case OPT_BYTES: {
        uint64_t v;
        if (gpcd_bytes_parse(value, &v) != GPC_OK)
            return gpc_error_context(GPC_ERR_INVALID_ARG, "%s: ", key);
        *(uint64_t *)field = v;
        return GPC_OK;
    }
    case OPT_MODE:
    case OPT_INT: {
        char *end;
        errno = 0;
        long v = strtol(value, &end, o->type == OPT_MODE ? 8 : 10);
        if (end == value || *end || errno || v < 0 || v > 0x7fffffff ||
            (o->type == OPT_MODE && v > 0777))
            return gpc_error(GPC_ERR_INVALID_ARG, "%s needs %s, not '%s'", key,
                             o->type == OPT_MODE ? "an octal mode such as 0600" : "a whole number",
                             value);
        *(int *)field = (int)v;
        return GPC_OK;
    }
    }
    return GPC_OK;
}

void gpcd_config_defaults(gpcd_config *config) {
    memset(config, 0, sizeof *config);
    for (int i = 0; i < OPTION_COUNT; i++) {
        gpc_status st = gpcd_config_set(config, options[i].key, options[i].default_value);
        (void)st; /* the defaults are tested to parse (test_config) */
    }
}

typedef struct {
    gpcd_config *config;
    const char *path;
    gpc_status status;
    char message[768];
} ini_state;

static int config_ini_line(void *user, const char *section, const char *key, const char *value) {
    ini_state *s = user;
    if (s->status != GPC_OK) return 0;
    /* Sections are accepted for readability ([gpcd], [alerts]) and ignored:
     * keys are unique across the whole table. */
    (void)section;
    if (gpcd_config_set(s->config, key, value) != GPC_OK) {
        s->status = GPC_ERR_INVALID_ARG;
        snprintf(s->message, sizeof s->message, "%s", gpc_last_error());
        return 0;
    }
    return 1;
}

/* inih reads a line in INI_MAX_LINE bytes and takes the rest of a longer
 * one for a line of its own, which it then calls malformed ("not key =
 * value") though the real problem is the length. Such lines are found
 * first and judged here: the key's own check speaks when it has one (a
 * socket path past the unix limit), else the length is named. */
static gpc_status check_long_lines(gpcd_config *config, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return GPC_OK; /* ini_parse reports it */
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int number = 0;
    gpc_status st = GPC_OK;
    while (st == GPC_OK && (len = getline(&line, &cap, f)) >= 0) {
        number++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (len < INI_MAX_LINE - 1) continue;
        char *key = line + strspn(line, " \t");
        if (*key == ';' || *key == '#') continue; /* a long comment is harmless */
        char *eq = strchr(key, '=');
        if (eq) {
            char *end = eq;
            while (end > key && (end[-1] == ' ' || end[-1] == '\t'))
                end--;
            *end = '\0';
            char *value = eq + 1 + strspn(eq + 1, " \t");
            if (gpcd_config_set(config, key, value) != GPC_OK) {
                char message[768]; /* gpc_error writes where gpc_last_error points */
                snprintf(message, sizeof message, "%s", gpc_last_error());
                st = gpc_error(GPC_ERR_INVALID_ARG, "%s line %d: %s", path, number, message);
                break;
            }
        }
        st = gpc_error(GPC_ERR_INVALID_ARG,
                       "%s line %d is %zd characters long; config lines hold at most %d", path,
                       number, len, INI_MAX_LINE - 2);
    }
    free(line);
    fclose(f);
    return st;
}

gpc_status gpcd_config_load(gpcd_config *config, const char *path) {
    GPC_TRY(check_long_lines(config, path));
    ini_state s = {config, path, GPC_OK, ""};
    int rc = ini_parse(path, config_ini_line, &s);
    if (rc == -1)
        return gpc_error(GPC_ERR_IO, "cannot read config file %s: %s", path, strerror(errno));
    if (rc == -2) return gpc_error(GPC_ERR_NOMEM, "out of memory reading %s", path);
    if (rc > 0) {
        if (s.status != GPC_OK)
            return gpc_error(GPC_ERR_INVALID_ARG, "%s line %d: %s", path, rc, s.message);
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s line %d: not 'key = value' (or a [section] header)", path, rc);
    }
    return GPC_OK;
}

gpc_status gpcd_policies_parse(const char *text, unsigned *flags) {
    static const struct {
        const char *name;
        unsigned flag;
    } names[] = {{"priority", GPCD_POLICY_PRIORITY},
                 {"aging", GPCD_POLICY_AGING},
                 {"least_loaded", GPCD_POLICY_LEAST_LOADED},
                 {"binpack", GPCD_POLICY_BINPACK},
                 {"task_type", GPCD_POLICY_TASK_TYPE},
                 {"locality", GPCD_POLICY_LOCALITY},
                 {"backfill", GPCD_POLICY_BACKFILL},
                 {"preemption", GPCD_POLICY_PREEMPTION},
                 {"shortest_first", GPCD_POLICY_SHORTEST_FIRST}};
    unsigned out = 0;
    const char *p = text;
    while (*p) {
        while (*p == ' ' || *p == ',')
            p++;
        if (!*p) break;
        size_t len = strcspn(p, ", ");
        int found = 0;
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            if (strlen(names[i].name) == len && strncmp(p, names[i].name, len) == 0) {
                out |= names[i].flag;
                found = 1;
            }
        if (!found)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "unknown policy '%.*s' (use priority, aging, least_loaded, binpack, "
                             "task_type, locality, backfill, preemption, shortest_first)",
                             (int)len, p);
        p += len;
    }
    *flags = out;
    return GPC_OK;
}

gpc_status gpcd_numa_rules_parse(const char *text, gpcd_policy_config *policy) {
    policy->numa_rule_count = 0;
    const char *p = text;
    while (*p) {
        while (*p == ' ' || *p == ',')
            p++;
        if (!*p) break;
        size_t len = strcspn(p, ",");
        const char *eq = memchr(p, '=', len);
        if (!eq || eq == p)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "data_numa entry '%.*s' is not PREFIX=NODE (e.g. /datasets=0)",
                             (int)len, p);
        if (policy->numa_rule_count >= GPCD_MAX_NUMA_RULES)
            return gpc_error(GPC_ERR_INVALID_ARG, "data_numa has more than %d entries",
                             GPCD_MAX_NUMA_RULES);
        size_t plen = (size_t)(eq - p);
        if (plen >= sizeof policy->numa_rules[0].prefix)
            return gpc_error(GPC_ERR_INVALID_ARG, "data_numa prefix is too long");
        char node_text[16];
        size_t nlen = len - plen - 1;
        if (nlen == 0 || nlen >= sizeof node_text)
            return gpc_error(GPC_ERR_INVALID_ARG, "data_numa entry '%.*s' lacks a node number",
                             (int)len, p);
        memcpy(node_text, eq + 1, nlen);
        node_text[nlen] = '\0';
        char *end;
        long node = strtol(node_text, &end, 10);
        if (*end || node < 0 || node > 1023)
            return gpc_error(GPC_ERR_INVALID_ARG, "data_numa node '%s' is not a number 0-1023",
                             node_text);
        gpcd_numa_rule *r = &policy->numa_rules[policy->numa_rule_count++];
        memcpy(r->prefix, p, plen);
        r->prefix[plen] = '\0';
        r->node = (int)node;
        p += len;
    }
    return GPC_OK;
}

/* Relative paths are made absolute, since gpcd leaves its working directory. */
static gpc_status make_absolute(char *path, size_t size, const char *key) {
    if (!path[0] || path[0] == '/') return GPC_OK;
    char cwd[512], joined[1100];
    if (!getcwd(cwd, sizeof cwd))
        return gpc_error(GPC_ERR_IO, "%s: cannot resolve the relative path %s", key, path);
    snprintf(joined, sizeof joined, "%s/%s", cwd, path);
    if (strlen(joined) >= size)
        return gpc_error(GPC_ERR_INVALID_ARG, "%s: path %s is too long", key, joined);
    snprintf(path, size, "%s", joined);
    return GPC_OK;
}

gpc_status gpcd_config_finish(gpcd_config *config) {
    if (!config->state_dir[0])
        return gpc_error(GPC_ERR_INVALID_ARG, "state_dir is empty; set it in the config file");
    GPC_TRY(make_absolute(config->state_dir, sizeof config->state_dir, "state_dir"));
    GPC_TRY(make_absolute(config->socket, sizeof config->socket, "socket"));
    if (!config->socket[0]) {
        int n = snprintf(config->socket, sizeof config->socket, "%s/gpcd.sock", config->state_dir);
        /* sockaddr_un holds 108 bytes */
        if (n >= 100)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "socket path %s/gpcd.sock is too long for a unix socket; set a "
                             "shorter state_dir or socket",
                             config->state_dir);
    }
    if (strlen(config->socket) >= 100)
        return gpc_error(GPC_ERR_INVALID_ARG, "socket path '%s' is too long (at most 99 bytes)",
                         config->socket);
    GPC_TRY(gpcd_policies_parse(config->policies, &config->policy.flags));
    if (config->listen[0] && !config->token_file[0])
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "listen = %s needs token_file too: TCP clients must send a bearer token",
                         config->listen);
    if (strcmp(config->backend, "local") != 0 && strcmp(config->backend, "slurm") != 0)
        return gpc_error(GPC_ERR_INVALID_ARG, "backend = %s: use local or slurm", config->backend);
    if (strcmp(config->gpus, "none") == 0 && strcmp(config->backend, "slurm") != 0)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "gpus = none only suits backend = slurm (a login node without GPUs)");
    {
        /* used as text with %d replaced, never as a printf format */
        const char *o = config->slurm_gpu_option, *d = strstr(o, "%d");
        if (*o && (strncmp(o, "--", 2) != 0 || !d || strchr(d + 2, '%') ||
                   memchr(o, '%', (size_t)(d - o)) || strchr(o, ' ')))
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "slurm_gpu_option = '%s' must be one sbatch option with one %%d, "
                             "such as --gpus=%%d or --gres=gpu:%%d",
                             o);
    }
    if (config->slurm_poll_interval < 0.1)
        return gpc_error(GPC_ERR_INVALID_ARG, "slurm_poll_interval must be at least 100ms");
    if (config->slurm_log_dir[0] && strcmp(config->backend, "slurm") != 0)
        return gpc_error(
            GPC_ERR_INVALID_ARG,
            "slurm_log_dir is for backend = slurm (local jobs write to STATE_DIR/jobs)");
    if (config->slurm_log_dir[0] && config->slurm_log_dir[0] != '/')
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "slurm_log_dir = %s must be an absolute path (the compute nodes open it)",
                         config->slurm_log_dir);
    if (config->peer_connections < 1)
        return gpc_error(GPC_ERR_INVALID_ARG, "peer_connections must be at least 1");
    if (config->log_max < (1u << 20))
        return gpc_error(GPC_ERR_INVALID_ARG, "log_max must be at least 1M");
    if (config->sample_interval < 0.05)
        return gpc_error(GPC_ERR_INVALID_ARG, "sample_interval must be at least 50ms");
    return GPC_OK;
}

void gpcd_config_write_markdown(void *file) {
    FILE *f = file;
    fprintf(f, "| key | default | meaning |\n| --- | --- | --- |\n");
    for (int i = 0; i < OPTION_COUNT; i++)
        fprintf(f, "| `%s` | `%s` | %s |\n", options[i].key,
                options[i].default_value[0] ? options[i].default_value : "\"\"", options[i].doc);
}
