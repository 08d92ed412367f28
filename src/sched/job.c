/*
 * job.c: what a gpcd job is: its states, types and priorities, the parsers
 * for the values users type (priorities, durations, sizes), and its JSON
 * form in the API.
 */
#include "gpc/sched.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const state_names[GPCD_STATE_COUNT] = {"queued", "running",   "completed",
                                                          "failed", "cancelled", "preempted"};
static const char *const type_names[GPCD_TYPE_COUNT] = {"train", "infer", "batch", "interactive"};

const char *gpcd_state_name(gpcd_state state) {
    return (unsigned)state < GPCD_STATE_COUNT ? state_names[state] : "unknown";
}

gpc_status gpcd_state_parse(const char *name, gpcd_state *out) {
    for (int i = 0; i < GPCD_STATE_COUNT; i++)
        if (name && strcmp(name, state_names[i]) == 0) {
            *out = (gpcd_state)i;
            return GPC_OK;
        }
    return gpc_error(GPC_ERR_INVALID_ARG,
                     "unknown job state '%s' (use queued, running, completed, failed, "
                     "cancelled or preempted)",
                     name ? name : "");
}

const char *gpcd_type_name(gpcd_job_type type) {
    return (unsigned)type < GPCD_TYPE_COUNT ? type_names[type] : "unknown";
}

gpc_status gpcd_type_parse(const char *name, gpcd_job_type *out) {
    for (int i = 0; i < GPCD_TYPE_COUNT; i++)
        if (name && strcmp(name, type_names[i]) == 0) {
            *out = (gpcd_job_type)i;
            return GPC_OK;
        }
    return gpc_error(GPC_ERR_INVALID_ARG,
                     "unknown job type '%s' (use train, infer, batch or interactive)",
                     name ? name : "");
}

gpc_status gpcd_priority_parse(const char *text, int *out) {
    if (!text || !*text)
        return gpc_error(GPC_ERR_INVALID_ARG, "empty priority (use low, normal, high or 0-100)");
    if (strcmp(text, "low") == 0)
        *out = GPCD_PRIORITY_LOW;
    else if (strcmp(text, "normal") == 0)
        *out = GPCD_PRIORITY_NORMAL;
    else if (strcmp(text, "high") == 0)
        *out = GPCD_PRIORITY_HIGH;
    else {
        char *end;
        errno = 0;
        long v = strtol(text, &end, 10);
        if (*end || errno || v < 0 || v > GPCD_PRIORITY_MAX)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "priority '%s' is not low, normal, high or a number 0-100", text);
        *out = (int)v;
    }
    return GPC_OK;
}

const char *gpcd_priority_name(int priority, char *buf, size_t size) {
    if (priority == GPCD_PRIORITY_LOW)
        snprintf(buf, size, "low");
    else if (priority == GPCD_PRIORITY_NORMAL)
        snprintf(buf, size, "normal");
    else if (priority == GPCD_PRIORITY_HIGH)
        snprintf(buf, size, "high");
    else
        snprintf(buf, size, "%d", priority);
    return buf;
}

gpc_status gpcd_duration_parse(const char *text, double *out) {
    if (!text || !*text)
        return gpc_error(GPC_ERR_INVALID_ARG, "empty duration (write 90s, 15m, 2h or 1d)");
    double total = 0;
    const char *p = text;
    while (*p) {
        char *end;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p || errno || !isfinite(v) || v < 0)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "duration '%s' is not a time such as 90s, 15m, 2h or 1h30m", text);
        double unit = 1;
        switch (*end) {
        case 's':
            unit = 1;
            end++;
            break;
        case 'm':
            unit = 60;
            end++;
            break;
        case 'h':
            unit = 3600;
            end++;
            break;
        case 'd':
            unit = 86400;
            end++;
            break;
        case '\0':
            break;
        default:
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "duration '%s' has an unknown unit '%c' (use s, m, h or d)", text,
                             *end);
        }
        total += v * unit;
        p = end;
    }
    if (!(total > 0) || total > 366.0 * 86400)
        return gpc_error(GPC_ERR_INVALID_ARG, "duration '%s' must be above 0 and at most a year",
                         text);
    *out = total;
    return GPC_OK;
}

gpc_status gpcd_bytes_parse(const char *text, uint64_t *out) {
    return gpc_parse_bytes(text, out);
}

int gpcd_state_is_final(gpcd_state state) {
    return state == GPCD_COMPLETED || state == GPCD_FAILED || state == GPCD_CANCELLED;
}

int gpcd_state_is_pending(gpcd_state state) {
    return state == GPCD_QUEUED || state == GPCD_PREEMPTED;
}

int gpcd_job_shares_gpu(const gpcd_job *job) {
    /* Sharing needs a memory limit to keep jobs from crowding each other out;
     * training and batch work want the whole GPU's compute anyway. */
    return (job->type == GPCD_TYPE_INFER || job->type == GPCD_TYPE_INTERACTIVE) && job->mem > 0;
}

int gpcd_job_elastic(const gpcd_job *job) {
    return job->gpus_min >= 1 && job->gpus_max > job->gpus_min;
}

int gpcd_job_min_gpus(const gpcd_job *job) {
    return gpcd_job_elastic(job) ? job->gpus_min : job->gpus;
}

static int parse_count(const char *p, char **end) {
    if (*p < '0' || *p > '9') return -1;
    long v = strtol(p, end, 10);
    return v >= 1 && v <= GPCD_MAX_GPUS ? (int)v : -1;
}

gpc_status gpcd_gpus_parse(const char *text, int *min, int *max) {
    char *end = NULL;
    int lo = text ? parse_count(text, &end) : -1, hi = lo;
    if (lo > 0 && *end == '-') hi = parse_count(end + 1, &end);
    if (lo < 1 || hi < 1 || *end != '\0')
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "GPU count '%.32s' is not N or MIN-MAX (whole numbers 1-%d, e.g. 2 or "
                         "1-4)",
                         text ? text : "", GPCD_MAX_GPUS);
    if (lo > hi)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "GPU range '%.32s' runs backwards; write the smaller count first (%d-%d)",
                         text, hi, lo);
    *min = lo;
    *max = hi;
    return GPC_OK;
}

uint32_t gpcd_data_hash(const char *path) {
    if (!path || !*path) return 0;
    uint32_t h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)path; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h ? h : 1;
}

gpcd_job *gpcd_job_new(void) {
    gpcd_job *job = calloc(1, sizeof *job);
    if (!job) return NULL;
    job->gpus = 1;
    job->priority = GPCD_PRIORITY_NORMAL;
    job->exit_code = -1;
    job->data_numa = -1;
    return job;
}

static char *dup_or_null(const char *s) {
    return s ? strdup(s) : NULL;
}

gpcd_job *gpcd_job_copy(const gpcd_job *job) {
    gpcd_job *copy = malloc(sizeof *copy);
    if (!copy) return NULL;
    *copy = *job;
    copy->owner = dup_or_null(job->owner);
    copy->name = dup_or_null(job->name);
    copy->command = dup_or_null(job->command);
    copy->cwd = dup_or_null(job->cwd);
    copy->env = dup_or_null(job->env);
    copy->data = dup_or_null(job->data);
    copy->message = dup_or_null(job->message);
    return copy;
}

void gpcd_job_free(gpcd_job *job) {
    if (!job) return;
    free(job->owner);
    free(job->name);
    free(job->command);
    free(job->cwd);
    free(job->env);
    free(job->data);
    free(job->message);
    free(job);
}

void *gpcd_job_to_json(const gpcd_job *job) {
    json_t *o = json_object();
    char prio[16];
    json_object_set_new(o, "id", json_integer(job->id));
    json_object_set_new(o, "state", json_string(gpcd_state_name(job->state)));
    json_object_set_new(o, "owner", json_string(job->owner ? job->owner : ""));
    json_object_set_new(o, "owner_uid", json_integer(job->owner_uid));
    if (job->name) json_object_set_new(o, "name", json_string(job->name));
    json_t *command = job->command ? json_loads(job->command, 0, NULL) : NULL;
    json_object_set_new(o, "command", command ? command : json_array());
    json_object_set_new(o, "cwd", job->cwd ? json_string(job->cwd) : json_null());
    json_object_set_new(o, "gpus", json_integer(job->gpus));
    /* the range an elastic job runs in; a rigid job's is its count */
    json_object_set_new(o, "elastic", json_boolean(gpcd_job_elastic(job)));
    json_object_set_new(o, "gpus_min", json_integer(gpcd_job_min_gpus(job)));
    json_object_set_new(o, "gpus_max",
                        json_integer(gpcd_job_elastic(job) ? job->gpus_max : job->gpus));
    json_object_set_new(o, "mem", json_integer((json_int_t)job->mem));
    json_object_set_new(o, "priority", json_integer(job->priority));
    json_object_set_new(o, "priority_name",
                        json_string(gpcd_priority_name(job->priority, prio, sizeof prio)));
    json_object_set_new(o, "type", json_string(gpcd_type_name(job->type)));
    json_object_set_new(o, "data", job->data ? json_string(job->data) : json_null());
    json_object_set_new(o, "time_limit", json_real(job->time_limit));
    json_object_set_new(o, "submit_time", json_real(job->submit_time));
    json_object_set_new(o, "start_time",
                        job->start_time > 0 ? json_real(job->start_time) : json_null());
    json_object_set_new(o, "end_time", job->end_time > 0 ? json_real(job->end_time) : json_null());
    json_object_set_new(o, "exit_code",
                        job->exit_code >= 0 ? json_integer(job->exit_code) : json_null());
    json_object_set_new(o, "signal", job->signal ? json_integer(job->signal) : json_null());
    json_t *gpus = json_array();
    for (int i = 0; i < job->assigned_count; i++)
        json_array_append_new(gpus, json_integer(job->assigned[i]));
    json_object_set_new(o, "assigned_gpus", gpus);
    json_object_set_new(o, "pid", job->pid > 0 ? json_integer(job->pid) : json_null());
    json_object_set_new(o, "preemptions", json_integer(job->preemptions));
    json_object_set_new(o, "message", job->message ? json_string(job->message) : json_null());
    return o;
}
