/*
 * http_request.c: what gpc serve does with text on its connection threads:
 * parses and checks a completions request (OpenAI's fields, strictly typed,
 * so a typo is a 400 rather than a silent default), turns tokens back into
 * text one at a time (a UTF-8 character split across tokens is held until
 * it is whole) and finds stop strings in that text as it grows.
 *
 * Stop strings are matched on bytes before the UTF-8 step, so a stop
 * string is found even next to bytes that are not UTF-8; the text that could
 * still become a stop string is held back, so a streamed response never
 * shows part of one.
 */
#include "serve/http_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ text */

int http_text_append(http_text *t, const void *bytes, size_t n) {
    if (n > SIZE_MAX / 4) return -1;
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 64;
        while (cap < t->len + n + 1)
            cap *= 2;
        char *grown = realloc(t->data, cap);
        if (!grown) return -1;
        t->data = grown;
        t->cap = cap;
    }
    if (n) memcpy(t->data + t->len, bytes, n);
    t->len += n;
    t->data[t->len] = '\0';
    return 0;
}

void http_text_free(http_text *t) {
    free(t->data);
    t->data = NULL;
    t->len = t->cap = 0;
}

/* --------------------------------------------------------------- request */

static int fail(char *error, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *error, size_t size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error, size, fmt, ap);
    va_end(ap);
    return 400;
}

void http_completion_clear(http_completion_request *req) {
    free(req->prompt_text);
    free(req->prompt_ids);
    for (int i = 0; i < req->stop_count; i++)
        free(req->stop[i]);
    memset(req, 0, sizeof *req);
}

/* A whole number in [lo, hi] into *out; null leaves *out as it is. */
static int get_int(json_t *v, const char *name, long long lo, long long hi, long long *out,
                   char *error, size_t size) {
    if (json_is_null(v)) return 0;
    if (!json_is_integer(v))
        return fail(error, size, "'%s' must be a whole number, not %s", name,
                    json_is_string(v) ? "a string" : "this value");
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return fail(error, size, "'%s' must be %lld to %lld, not %lld", name, lo, hi, x);
    *out = x;
    return 0;
}

static int get_number(json_t *v, const char *name, double *out, char *error, size_t size) {
    if (json_is_null(v)) return 0;
    if (!json_is_number(v)) return fail(error, size, "'%s' must be a number", name);
    *out = json_number_value(v);
    return 0;
}

static int get_bool(json_t *v, const char *name, int *out, char *error, size_t size) {
    if (json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return fail(error, size, "'%s' must be true or false", name);
    *out = json_is_true(v);
    return 0;
}

static int parse_ids(json_t *array, int vocab_size, http_completion_request *req, char *error,
                     size_t size) {
    size_t n = json_array_size(array);
    if (n == 0) return fail(error, size, "'prompt' as token ids must hold at least one id");
    req->prompt_ids = malloc(n * sizeof *req->prompt_ids);
    if (!req->prompt_ids) return fail(error, size, "out of memory reading the prompt");
    for (size_t i = 0; i < n; i++) {
        json_t *id = json_array_get(array, i);
        if (!json_is_integer(id))
            return fail(error, size, "'prompt' must be a string or an array of token ids");
        json_int_t x = json_integer_value(id);
        if (x < 0 || x >= vocab_size)
            return fail(error, size,
                        "token id %lld in 'prompt' is outside the vocabulary (0 to %d)",
                        (long long)x, vocab_size - 1);
        req->prompt_ids[i] = (uint32_t)x;
    }
    req->prompt_ids_len = n;
    return 0;
}

static int parse_prompt(json_t *v, int vocab_size, http_completion_request *req, char *error,
                        size_t size) {
    /* OpenAI's batch forms with one prompt: ["text"] and [[ids]] */
    if (json_is_array(v) && json_array_size(v) == 1 &&
        (json_is_string(json_array_get(v, 0)) || json_is_array(json_array_get(v, 0))))
        v = json_array_get(v, 0);
    else if (json_is_array(v) && json_array_size(v) > 1 &&
             (json_is_string(json_array_get(v, 0)) || json_is_array(json_array_get(v, 0))))
        return fail(error, size, "'prompt' holds several prompts; send one request for each");
    if (json_is_string(v)) {
        size_t n = json_string_length(v);
        req->prompt_text = malloc(n + 1);
        if (!req->prompt_text) return fail(error, size, "out of memory reading the prompt");
        memcpy(req->prompt_text, json_string_value(v), n + 1);
        req->prompt_text_len = n;
        req->has_text = 1;
        return 0;
    }
    if (json_is_array(v)) return parse_ids(v, vocab_size, req, error, size);
    return fail(error, size, "'prompt' must be a string or an array of token ids");
}

static int parse_stop(json_t *v, http_completion_request *req, char *error, size_t size) {
    if (json_is_null(v)) return 0;
    json_t *one[1] = {v};
    json_t **items = one;
    size_t n = 1;
    if (json_is_array(v)) {
        n = json_array_size(v);
        if (n > HTTP_MAX_STOP)
            return fail(error, size, "'stop' holds %zu strings; at most %d", n, HTTP_MAX_STOP);
        items = NULL;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *s = items ? items[i] : json_array_get(v, i);
        if (!json_is_string(s))
            return fail(error, size, "'stop' must be a string or an array of strings");
        size_t len = json_string_length(s);
        if (len == 0 || len > HTTP_MAX_STOP_LEN)
            return fail(error, size, "a stop string must hold 1 to %d bytes", HTTP_MAX_STOP_LEN);
        char *copy = malloc(len + 1);
        if (!copy) return fail(error, size, "out of memory reading 'stop'");
        memcpy(copy, json_string_value(s), len + 1);
        req->stop[req->stop_count] = copy;
        req->stop_len[req->stop_count++] = len;
    }
    return 0;
}

/* OpenAI fields gpc accepts only at their neutral value. */
static int neutral_field(const char *key, json_t *v, char *error, size_t size) {
    if (!strcmp(key, "n") || !strcmp(key, "best_of")) {
        if (json_is_null(v) || (json_is_integer(v) && json_integer_value(v) == 1)) return 0;
        return fail(error, size, "'%s' must be 1: gpc gives one completion a request", key);
    }
    if (!strcmp(key, "echo")) {
        if (json_is_null(v) || json_is_false(v)) return 0;
        return fail(error, size, "'echo' must be false: gpc does not echo the prompt");
    }
    if (!strcmp(key, "logprobs")) {
        if (json_is_null(v) || json_is_false(v)) return 0;
        return fail(error, size, "'logprobs' is not supported; leave it out");
    }
    if (!strcmp(key, "presence_penalty") || !strcmp(key, "frequency_penalty")) {
        if (json_is_null(v) || (json_is_number(v) && json_number_value(v) == 0)) return 0;
        return fail(error, size, "'%s' is not supported; leave it out or send 0", key);
    }
    if (!strcmp(key, "logit_bias")) {
        if (json_is_null(v) || (json_is_object(v) && json_object_size(v) == 0)) return 0;
        return fail(error, size, "'logit_bias' is not supported; leave it out");
    }
    if (!strcmp(key, "suffix")) {
        if (json_is_null(v)) return 0;
        return fail(error, size, "'suffix' is not supported; leave it out");
    }
    return -1;
}

static int parse_field(const char *key, json_t *v, int vocab_size, http_completion_request *req,
                       int *saw_prompt, char *error, size_t size) {
    long long x;
    double d;
    int rc;
    if (!strcmp(key, "prompt")) {
        *saw_prompt = 1;
        return parse_prompt(v, vocab_size, req, error, size);
    }
    if (!strcmp(key, "model") || !strcmp(key, "user")) {
        if (json_is_null(v) || json_is_string(v)) return 0;
        return fail(error, size, "'%s' must be a string", key);
    }
    if (!strcmp(key, "max_tokens")) {
        x = req->max_tokens;
        if ((rc = get_int(v, key, 1, INT32_MAX, &x, error, size))) return rc;
        req->max_tokens = (int)x;
        return 0;
    }
    if (!strcmp(key, "min_tokens")) {
        x = req->min_tokens;
        if ((rc = get_int(v, key, 0, INT32_MAX, &x, error, size))) return rc;
        req->min_tokens = (int)x;
        return 0;
    }
    if (!strcmp(key, "top_k")) {
        x = req->top_k;
        /* -1 is vLLM's "all", 0 gpc's */
        if ((rc = get_int(v, key, -1, INT32_MAX, &x, error, size))) return rc;
        req->top_k = x < 0 ? 0 : (int)x;
        return 0;
    }
    if (!strcmp(key, "seed")) {
        if (json_is_null(v)) return 0;
        x = 0;
        if ((rc = get_int(v, key, 0, INT64_MAX, &x, error, size))) return rc;
        req->seed = (uint64_t)x;
        req->has_seed = 1;
        return 0;
    }
    if (!strcmp(key, "temperature")) {
        d = req->temperature;
        if ((rc = get_number(v, key, &d, error, size))) return rc;
        if (!(d >= 0 && d <= 100))
            return fail(error, size, "'temperature' must be 0 (greedy) to 100, not %g", d);
        req->temperature = (float)d;
        return 0;
    }
    if (!strcmp(key, "top_p")) {
        d = req->top_p;
        if ((rc = get_number(v, key, &d, error, size))) return rc;
        if (!(d > 0 && d <= 1)) return fail(error, size, "'top_p' must be above 0 and at most 1");
        req->top_p = (float)d;
        return 0;
    }
    if (!strcmp(key, "stop")) return parse_stop(v, req, error, size);
    if (!strcmp(key, "stream")) return get_bool(v, key, &req->stream, error, size);
    if (!strcmp(key, "ignore_eos")) return get_bool(v, key, &req->ignore_eos, error, size);
    if (!strcmp(key, "stream_options")) {
        if (json_is_null(v)) return 0;
        if (!json_is_object(v)) return fail(error, size, "'stream_options' must be an object");
        const char *k;
        json_t *o;
        json_object_foreach(v, k, o) {
            if (strcmp(k, "include_usage") != 0)
                return fail(error, size, "unknown field 'stream_options.%s'", k);
            if ((rc =
                     get_bool(o, "stream_options.include_usage", &req->include_usage, error, size)))
                return rc;
        }
        return 0;
    }
    rc = neutral_field(key, v, error, size);
    if (rc >= 0) return rc;
    return fail(error, size,
                "unknown field '%s' (gpc reads prompt, max_tokens, temperature, top_k, top_p, "
                "seed, stop, stream, ignore_eos, min_tokens)",
                key);
}

int http_completion_parse(const char *body, size_t len, int vocab_size,
                          http_completion_request *req, char *error, size_t size) {
    memset(req, 0, sizeof *req);
    req->max_tokens = 16; /* OpenAI's default */
    req->temperature = 1.0f;
    req->top_p = 1.0f;
    json_error_t jerr;
    json_t *root = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return fail(error, size, "the body is not valid JSON (line %d, column %d: %s)", jerr.line,
                    jerr.column, jerr.text);
    int rc = 0, saw_prompt = 0;
    if (!json_is_object(root)) {
        rc = fail(error, size, "the body must be a JSON object");
    } else {
        const char *key;
        json_t *v;
        json_object_foreach(root, key, v) {
            rc = parse_field(key, v, vocab_size, req, &saw_prompt, error, size);
            if (rc) break;
        }
    }
    if (!rc && !saw_prompt)
        rc = fail(error, size, "'prompt' is required (a string or an array of token ids)");
    if (!rc && req->min_tokens > req->max_tokens)
        rc = fail(error, size, "'min_tokens' (%d) must not exceed 'max_tokens' (%d)",
                  req->min_tokens, req->max_tokens);
    json_decref(root);
    if (rc) http_completion_clear(req);
    return rc;
}

/* ------------------------------------------------------------------ UTF-8 */

static const char REPLACEMENT[] = "\xEF\xBF\xBD"; /* U+FFFD */

/* Bytes of the character a lead byte starts; 0 for a byte no character
 * starts with (continuation bytes, C0, C1, F5..FF: RFC 3629). */
static int utf8_length(unsigned char b) {
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) return 3;
    if (b >= 0xF0 && b <= 0xF4) return 4;
    return 0;
}

/* Whether byte k (k >= 1) of a character led by lead may be c: the ranges
 * of RFC 3629's table, which rule out overlong forms, surrogates and code
 * points past U+10FFFF. */
static int utf8_continues(unsigned char lead, int k, unsigned char c) {
    if ((c & 0xC0) != 0x80) return 0;
    if (k > 1) return 1;
    if (lead == 0xE0) return c >= 0xA0;
    if (lead == 0xED) return c <= 0x9F;
    if (lead == 0xF0) return c >= 0x90;
    if (lead == 0xF4) return c <= 0x8F;
    return 1;
}

static int utf8_scan(http_utf8 *u, const unsigned char *s, size_t n, int final, http_text *out) {
    size_t i = 0;
    while (i < n) {
        unsigned char b = s[i];
        int need = utf8_length(b);
        if (need == 1) {
            size_t j = i;
            while (j < n && s[j] < 0x80)
                j++;
            if (http_text_append(out, s + i, j - i)) return -1;
            i = j;
            continue;
        }
        int k = 1;
        while (need && k < need && i + (size_t)k < n && utf8_continues(b, k, s[i + (size_t)k]))
            k++;
        if (need && k == need) {
            if (http_text_append(out, s + i, (size_t)need)) return -1;
            i += (size_t)need;
        } else if (need && i + (size_t)k == n && !final) {
            /* a character still arriving: keep its first bytes */
            memcpy(u->held, s + i, (size_t)k);
            u->held_len = k;
            return 0;
        } else {
            if (http_text_append(out, REPLACEMENT, 3)) return -1;
            i++;
        }
    }
    return 0;
}

int http_utf8_feed(http_utf8 *u, const char *bytes, size_t n, int final, http_text *out) {
    if (u->held_len == 0) return utf8_scan(u, (const unsigned char *)bytes, n, final, out);
    /* the held bytes and the new ones as one run */
    unsigned char small[64];
    size_t total = (size_t)u->held_len + n;
    unsigned char *s = total <= sizeof small ? small : malloc(total);
    if (!s) return -1;
    memcpy(s, u->held, (size_t)u->held_len);
    if (n) memcpy(s + u->held_len, bytes, n);
    u->held_len = 0;
    int rc = utf8_scan(u, s, total, final, out);
    if (s != small) free(s);
    return rc;
}

/* ------------------------------------------------------------ stop strings */

int http_stop_feed(http_stop *s, const char *bytes, size_t n, http_text *out) {
    if (s->count == 0) return http_text_append(out, bytes, n);
    if (http_text_append(&s->pending, bytes, n)) return -1;
    const char *p = s->pending.data;
    size_t len = s->pending.len;
    /* the earliest match wins: the text before it is the answer */
    size_t best = SIZE_MAX;
    for (int k = 0; k < s->count; k++) {
        size_t m = s->lens[k];
        for (size_t at = 0; m <= len && at + m <= len && at < best; at++)
            if (p[at] == s->stops[k][0] && memcmp(p + at, s->stops[k], m) == 0) {
                best = at;
                break;
            }
    }
    if (best != SIZE_MAX) {
        int rc = http_text_append(out, p, best);
        s->pending.len = 0;
        return rc ? -1 : 1;
    }
    /* hold the longest tail that a stop string starts with */
    size_t hold = 0;
    for (int k = 0; k < s->count; k++) {
        size_t m = s->lens[k] - 1 < len ? s->lens[k] - 1 : len;
        for (size_t t = m; t > hold; t--)
            if (memcmp(p + len - t, s->stops[k], t) == 0) {
                hold = t;
                break;
            }
    }
    if (http_text_append(out, p, len - hold)) return -1;
    memmove(s->pending.data, p + len - hold, hold);
    s->pending.len = hold;
    s->pending.data[hold] = '\0';
    return 0;
}

int http_stop_flush(http_stop *s, http_text *out) {
    int rc = s->pending.len ? http_text_append(out, s->pending.data, s->pending.len) : 0;
    s->pending.len = 0;
    return rc;
}

void http_stop_free(http_stop *s) {
    http_text_free(&s->pending);
}

/* ----------------------------------------------------------- detokenizer */

void http_detok_init(http_detok *d, const gpc_tokenizer *tok, int64_t eos_token,
                     const http_completion_request *req) {
    memset(d, 0, sizeof *d);
    d->tok = tok;
    d->eos_token = eos_token;
    d->stop.stops = (const char *const *)req->stop;
    d->stop.lens = req->stop_len;
    d->stop.count = req->stop_count;
}

int http_detok_token(http_detok *d, uint32_t token, http_text *out) {
    if (d->stopped || !d->tok) return d->stopped;
    size_t n = 0;
    const char *bytes = gpc_tokenizer_token_bytes(d->tok, token, &n);
    if (!bytes || n == 0) return 0;
    http_text safe = {0};
    int rc = http_stop_feed(&d->stop, bytes, n, &safe);
    if (rc >= 0 && safe.len && http_utf8_feed(&d->utf8, safe.data, safe.len, rc == 1, out))
        rc = -1;
    else if (rc == 1 && http_utf8_feed(&d->utf8, "", 0, 1, out))
        rc = -1;
    http_text_free(&safe);
    if (rc == 1) d->stopped = 1;
    return rc;
}

int http_detok_finish(http_detok *d, http_text *out) {
    if (d->stopped || !d->tok) return 0;
    http_text rest = {0};
    int rc = http_stop_flush(&d->stop, &rest);
    if (!rc) rc = http_utf8_feed(&d->utf8, rest.data ? rest.data : "", rest.len, 1, out);
    http_text_free(&rest);
    return rc;
}

void http_detok_free(http_detok *d) {
    http_stop_free(&d->stop);
}

/* -------------------------------------------------------------- responses */

const char *http_openai_finish(gpc_finish_reason reason) {
    switch (reason) {
    case GPC_FINISH_LENGTH:
        return "length";
    case GPC_FINISH_STOP:
    case GPC_FINISH_EOS:
        return "stop";
    case GPC_FINISH_CANCELLED:
        return "cancelled";
    case GPC_FINISH_ERROR:
        return "error";
    default:
        return "none";
    }
}

static const char *error_type(int status) {
    switch (status) {
    case 400:
    case 413:
        return "invalid_request_error";
    case 401:
        return "authentication_error";
    case 404:
        return "not_found_error";
    case 405:
        return "method_not_allowed";
    case 503:
        return "overloaded_error";
    default:
        return "server_error";
    }
}

char *http_error_body(int status, const char *message) {
    json_t *inner = json_object();
    json_object_set_new(inner, "message", json_string(message));
    json_object_set_new(inner, "type", json_string(error_type(status)));
    json_object_set_new(inner, "code", json_integer(status));
    json_t *o = json_object();
    json_object_set_new(o, "error", inner);
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!text) return NULL;
    size_t n = strlen(text);
    char *line = realloc(text, n + 2);
    if (!line) {
        free(text);
        return NULL;
    }
    line[n] = '\n';
    line[n + 1] = '\0';
    return line;
}
