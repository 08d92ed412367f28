/*
 * request.c: turns one HTTP request (method, path, query, body) into a
 * validated gpcd_request, or an HTTP error status with a message.
 *
 * Everything that arrives over the socket passes through here before gpcd
 * acts on it, so this is the file the fuzzer (fuzz/fuzz_request.c) drives.
 * It allocates nothing that outlives the call except the submitted job, and
 * never trusts a length, a number's range or a string's content.
 */
#include "gpc/sched.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQUEST_MAX_ARGS 1024
#define REQUEST_MAX_ARG_BYTES 65536
#define REQUEST_MAX_PATH 4096
#define REQUEST_MAX_ENV 4096
#define REQUEST_MAX_NAME 128
/* A submission nests two levels ({"command": [...]}); jansson parses by
 * recursion, about 250 bytes of stack a level, so an unbounded depth let a
 * 2 KB body overflow an HTTP thread's stack. The bound is checked on the
 * raw bytes, before any parser recurses. */
#define REQUEST_MAX_DEPTH 16

static int reject(char *error, size_t size, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int reject(char *error, size_t size, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error, size, fmt, ap);
    va_end(ap);
    return status;
}

/* A job id: decimal digits only, 1 .. 2^53 (what a JSON number holds exactly). */
static int parse_id(const char *text, size_t len, int64_t *out) {
    if (len == 0 || len > 16) return -1;
    int64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] < '0' || text[i] > '9') return -1;
        v = v * 10 + (text[i] - '0');
    }
    if (v < 1 || v > (1LL << 53)) return -1;
    *out = v;
    return 0;
}

static int parse_count(const char *text, int64_t max, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end || errno || v < 0 || v > max) return -1;
    *out = v;
    return 0;
}

/* A JSON string without embedded NUL bytes, at most max bytes. */
static const char *plain_string(json_t *v, size_t max) {
    if (!json_is_string(v)) return NULL;
    const char *s = json_string_value(v);
    size_t len = json_string_length(v);
    if (len > max || strlen(s) != len) return NULL;
    return s;
}

/* The deepest nesting of arrays and objects in a JSON text, counted without
 * recursion; stops counting once past limit. Brackets inside strings do not
 * count. */
static int json_depth(const char *text, size_t len, int limit) {
    int depth = 0, deepest = 0, in_string = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_string = 0;
        } else if (c == '"') {
            in_string = 1;
        } else if (c == '[' || c == '{') {
            if (++depth > deepest) deepest = depth;
            if (deepest > limit) break;
        } else if ((c == ']' || c == '}') && depth > 0) {
            depth--;
        }
    }
    return deepest;
}

static int parse_submit(json_t *body, uint32_t owner_uid, const char *owner, gpcd_job *job,
                        char *error, size_t size) {
    const char *key;
    json_t *value;
    job->owner_uid = owner_uid;
    job->owner = strdup(owner ? owner : "");
    int have_command = 0;
    json_object_foreach(body, key, value) {
        if (strcmp(key, "command") == 0) {
            size_t n = json_array_size(value);
            if (!json_is_array(value) || n == 0)
                return reject(error, size, 400,
                              "'command' must be a non-empty array of strings (the program and "
                              "its arguments)");
            if (n > REQUEST_MAX_ARGS)
                return reject(error, size, 400, "'command' has %zu arguments; at most %d", n,
                              REQUEST_MAX_ARGS);
            for (size_t i = 0; i < n; i++)
                if (!plain_string(json_array_get(value, i), REQUEST_MAX_ARG_BYTES))
                    return reject(error, size, 400,
                                  "'command' item %zu is not a string (without NUL bytes, at "
                                  "most %d bytes)",
                                  i, REQUEST_MAX_ARG_BYTES);
            if (!*json_string_value(json_array_get(value, 0)))
                return reject(error, size, 400, "'command' starts with an empty program name");
            job->command = json_dumps(value, JSON_COMPACT);
            if (!job->command) return reject(error, size, 400, "'command' cannot be encoded");
            have_command = 1;
        } else if (strcmp(key, "gpus") == 0) {
            int lo = 0, hi = 0;
            if (json_is_integer(value) && json_integer_value(value) >= 1 &&
                json_integer_value(value) <= GPCD_MAX_GPUS) {
                lo = hi = (int)json_integer_value(value);
            } else if (!json_is_string(value) ||
                       gpcd_gpus_parse(json_string_value(value), &lo, &hi) != GPC_OK) {
                return reject(error, size, 400,
                              "'gpus' must be a whole number 1-%d, or a range \"MIN-MAX\" for "
                              "an elastic job",
                              GPCD_MAX_GPUS);
            }
            /* until it first starts, an elastic job shows its largest count */
            job->gpus = hi;
            job->gpus_min = lo < hi ? lo : 0;
            job->gpus_max = lo < hi ? hi : 0;
        } else if (strcmp(key, "mem") == 0) {
            if (json_is_integer(value) && json_integer_value(value) >= 0) {
                job->mem = (uint64_t)json_integer_value(value);
            } else if (json_is_string(value)) {
                if (gpcd_bytes_parse(json_string_value(value), &job->mem) != GPC_OK)
                    return reject(error, size, 400, "'mem': %s", gpc_last_error());
            } else {
                return reject(error, size, 400,
                              "'mem' must be bytes (a whole number >= 0) or a size such as "
                              "\"40G\"");
            }
        } else if (strcmp(key, "priority") == 0) {
            if (json_is_integer(value)) {
                json_int_t p = json_integer_value(value);
                if (p < 0 || p > GPCD_PRIORITY_MAX)
                    return reject(error, size, 400, "'priority' %lld is outside 0-100",
                                  (long long)p);
                job->priority = (int)p;
            } else if (json_is_string(value)) {
                if (gpcd_priority_parse(json_string_value(value), &job->priority) != GPC_OK)
                    return reject(error, size, 400, "'priority': %s", gpc_last_error());
            } else {
                return reject(error, size, 400,
                              "'priority' must be low, normal, high or a number 0-100");
            }
        } else if (strcmp(key, "type") == 0) {
            if (!json_is_string(value) ||
                gpcd_type_parse(json_string_value(value), &job->type) != GPC_OK)
                return reject(error, size, 400,
                              "'type' must be one of train, infer, batch, interactive");
        } else if (strcmp(key, "data") == 0) {
            if (json_is_null(value)) continue;
            const char *s = plain_string(value, REQUEST_MAX_PATH);
            if (!s || s[0] != '/')
                return reject(error, size, 400, "'data' must be an absolute path");
            free(job->data);
            job->data = strdup(s);
        } else if (strcmp(key, "cwd") == 0) {
            const char *s = plain_string(value, REQUEST_MAX_PATH);
            if (!s || s[0] != '/')
                return reject(error, size, 400, "'cwd' must be an absolute path");
            free(job->cwd);
            job->cwd = strdup(s);
        } else if (strcmp(key, "time_limit") == 0) {
            if (json_is_number(value)) {
                double t = json_number_value(value);
                if (!(t > 0) || t > 366.0 * 86400)
                    return reject(error, size, 400,
                                  "'time_limit' must be seconds above 0 and at most a year");
                job->time_limit = t;
            } else if (json_is_string(value)) {
                if (gpcd_duration_parse(json_string_value(value), &job->time_limit) != GPC_OK)
                    return reject(error, size, 400, "'time_limit': %s", gpc_last_error());
            } else {
                return reject(error, size, 400,
                              "'time_limit' must be seconds or a duration such as \"2h\"");
            }
        } else if (strcmp(key, "env") == 0) {
            if (!json_is_object(value) || json_object_size(value) > REQUEST_MAX_ENV)
                return reject(error, size, 400,
                              "'env' must be an object of at most %d string values",
                              REQUEST_MAX_ENV);
            const char *name;
            json_t *v;
            json_object_foreach(value, name, v) {
                if (!*name || strchr(name, '=') || !plain_string(v, REQUEST_MAX_ARG_BYTES))
                    return reject(error, size, 400,
                                  "'env' entry '%.64s' must have a name without '=' and a "
                                  "string value",
                                  name);
            }
            free(job->env);
            job->env = json_dumps(value, JSON_COMPACT);
        } else if (strcmp(key, "name") == 0) {
            const char *s = plain_string(value, REQUEST_MAX_NAME);
            if (!s)
                return reject(error, size, 400, "'name' must be a string of at most %d bytes",
                              REQUEST_MAX_NAME);
            for (const char *c = s; *c; c++)
                if ((unsigned char)*c < 0x20)
                    return reject(error, size, 400, "'name' contains a control character");
            free(job->name);
            job->name = strdup(s);
        } else {
            return reject(error, size, 400,
                          "unknown field '%.64s' (known: command, gpus, mem, priority, type, "
                          "data, time_limit, cwd, env, name)",
                          key);
        }
    }
    if (!have_command)
        return reject(error, size, 400, "'command' is missing: say what the job runs");
    if (!job->cwd) job->cwd = strdup("/");
    if (!job->env) job->env = strdup("{}");
    job->data_hash = gpcd_data_hash(job->data);
    return 200;
}

static const char *find_arg(const gpcd_query_arg *args, int nargs, const char *key) {
    for (int i = 0; i < nargs; i++)
        if (args[i].key && strcmp(args[i].key, key) == 0) return args[i].value ? args[i].value : "";
    return NULL;
}

int gpcd_request_parse(const char *method, const char *path, const gpcd_query_arg *args, int nargs,
                       const char *body, size_t body_len, uint32_t owner_uid, const char *owner,
                       gpcd_request *out, char *error, size_t error_size) {
    memset(out, 0, sizeof *out);
    out->limit = 1 << 20;
    if (!method || !path) return reject(error, error_size, 400, "malformed request");
    int get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0,
        del = strcmp(method, "DELETE") == 0;
    const char *simple[] = {"/gpus", "/alerts", "/metrics", "/status"};
    const gpcd_request_kind simple_kind[] = {GPCD_REQ_GPUS, GPCD_REQ_ALERTS, GPCD_REQ_METRICS,
                                             GPCD_REQ_STATUS};
    for (int i = 0; i < 4; i++)
        if (strcmp(path, simple[i]) == 0) {
            if (!get)
                return reject(error, error_size, 405, "%s takes GET, not %.16s", path, method);
            out->kind = simple_kind[i];
            return 200;
        }
    if (strncmp(path, "/gpus/", 6) == 0) {
        const char *n = path + 6;
        size_t len = strcspn(n, "/");
        int64_t index = 0;
        const char *action = n + len;
        int drain = strcmp(action, "/drain") == 0, resume = strcmp(action, "/resume") == 0;
        for (size_t i = 0; i < len && index < GPCD_MAX_GPUS; i++)
            index = n[i] >= '0' && n[i] <= '9' ? index * 10 + (n[i] - '0') : GPCD_MAX_GPUS;
        if (len == 0 || len > 2 || index >= GPCD_MAX_GPUS)
            return reject(error, error_size, 404, "'%.32s' is not a GPU index (0, 1, ...)", n);
        if (!drain && !resume)
            return reject(error, error_size, 404,
                          "no such endpoint %.64s (/gpus/N/drain or /gpus/N/resume)", path);
        if (!post)
            return reject(error, error_size, 405, "/gpus/N/%s takes POST, not %.16s",
                          drain ? "drain" : "resume", method);
        out->kind = drain ? GPCD_REQ_GPU_DRAIN : GPCD_REQ_GPU_RESUME;
        out->gpu = (int)index;
        return 200;
    }
    if (strcmp(path, "/jobs") == 0 || strcmp(path, "/jobs/") == 0) {
        if (get) {
            out->kind = GPCD_REQ_LIST;
            const char *all = find_arg(args, nargs, "all");
            if (all) {
                if (strcmp(all, "1") != 0 && strcmp(all, "0") != 0 && strcmp(all, "true") != 0 &&
                    strcmp(all, "false") != 0)
                    return reject(error, error_size, 400, "all must be 1 or 0, not '%.32s'", all);
                out->all = all[0] == '1' || all[0] == 't';
            }
            const char *state = find_arg(args, nargs, "state");
            if (state) {
                char buf[128];
                if (strlen(state) >= sizeof buf)
                    return reject(error, error_size, 400, "state filter is too long");
                snprintf(buf, sizeof buf, "%s", state);
                for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                    gpcd_state s;
                    if (gpcd_state_parse(tok, &s) != GPC_OK)
                        return reject(error, error_size, 400, "%s", gpc_last_error());
                    out->state_mask |= 1u << s;
                }
                if (!out->state_mask)
                    return reject(error, error_size, 400, "state filter is empty");
            }
            const char *recent = find_arg(args, nargs, "recent");
            if (recent) {
                char *end;
                long n = strtol(recent, &end, 10);
                if (end == recent || *end || n < 1 || n > 10000)
                    return reject(error, error_size, 400,
                                  "recent must be a number of jobs from 1 to 10000, not '%.32s'",
                                  recent);
                out->recent = (int)n;
            }
            return 200;
        }
        if (!post)
            return reject(error, error_size, 405, "/jobs takes GET or POST, not %.16s", method);
        out->kind = GPCD_REQ_SUBMIT;
        if (!body || body_len == 0)
            return reject(error, error_size, 400,
                          "empty request body: send a JSON object with at least 'command'");
        if (json_depth(body, body_len, REQUEST_MAX_DEPTH) > REQUEST_MAX_DEPTH)
            return reject(error, error_size, 400,
                          "request body nests arrays or objects more than %d deep; a job needs "
                          "2 (send {\"command\": [...], ...})",
                          REQUEST_MAX_DEPTH);
        json_error_t jerr;
        json_t *root = json_loadb(body, body_len, JSON_REJECT_DUPLICATES, &jerr);
        if (!root)
            return reject(error, error_size, 400, "request body is not valid JSON: %s (line %d)",
                          jerr.text, jerr.line);
        if (!json_is_object(root)) {
            json_decref(root);
            return reject(error, error_size, 400, "request body must be a JSON object");
        }
        out->job = gpcd_job_new();
        if (!out->job) {
            json_decref(root);
            return reject(error, error_size, 500, "out of memory");
        }
        int status = parse_submit(root, owner_uid, owner, out->job, error, error_size);
        json_decref(root);
        if (status != 200) {
            gpcd_job_free(out->job);
            out->job = NULL;
        }
        return status;
    }
    if (strncmp(path, "/jobs/", 6) == 0) {
        const char *id_text = path + 6;
        size_t id_len = strcspn(id_text, "/");
        const char *rest = id_text + id_len;
        if (parse_id(id_text, id_len, &out->job_id) != 0)
            return reject(error, error_size, 404, "'%.32s' is not a job id (a number from 1)",
                          id_text);
        if (*rest == '\0') {
            if (get)
                out->kind = GPCD_REQ_SHOW;
            else if (del)
                out->kind = GPCD_REQ_CANCEL;
            else
                return reject(error, error_size, 405, "/jobs/ID takes GET or DELETE, not %.16s",
                              method);
            return 200;
        }
        if (strcmp(rest, "/cancel") == 0) {
            if (!post) return reject(error, error_size, 405, "/jobs/ID/cancel takes POST");
            out->kind = GPCD_REQ_CANCEL;
            return 200;
        }
        if (strcmp(rest, "/logs") == 0) {
            if (!get) return reject(error, error_size, 405, "/jobs/ID/logs takes GET");
            out->kind = GPCD_REQ_LOGS;
            const char *offset = find_arg(args, nargs, "offset");
            if (offset && parse_count(offset, INT64_MAX / 2, &out->offset) != 0)
                return reject(error, error_size, 400,
                              "offset must be a whole number >= 0, not '%.32s'", offset);
            const char *limit = find_arg(args, nargs, "limit");
            if (limit && (parse_count(limit, 16 << 20, &out->limit) != 0 || out->limit == 0))
                return reject(error, error_size, 400,
                              "limit must be a whole number 1-16777216, not '%.32s'", limit);
            return 200;
        }
    }
    return reject(error, error_size, 404,
                  "no such endpoint %.64s (see docs/gpcd.md: /jobs, /jobs/ID, /jobs/ID/logs, "
                  "/jobs/ID/cancel, /gpus, /alerts, /metrics, /status)",
                  path);
}

void gpcd_request_clear(gpcd_request *request) {
    gpcd_job_free(request->job);
    request->job = NULL;
}
