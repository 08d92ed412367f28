/*
 * fuzz_request.c: libFuzzer target for gpcd's request parser
 * (src/sched/request.c), the code every byte from the API socket reaches
 * first. The input is "METHOD\nPATH\nQUERY\nBODY": the query is split into
 * key=value pairs the way libmicrohttpd hands them over. A parsed
 * submission is also turned back into the JSON the API would return, so
 * the job's fields are exercised too. Built with clang -fsanitize=fuzzer
 * (fuzz/CMakeLists.txt) and run briefly as a CTest test.
 *
 * Each input is parsed on a thread with gpcd's HTTP stack size
 * (GPCD_HTTP_THREAD_STACK), not on the fuzzer's 8 MB main stack: a body
 * that recurses deep enough to overflow the daemon's threads must crash
 * here too. The seed corpus holds one such body (deep.txt).
 */
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/sched.h"

#define FUZZ_MAX_ARGS 8

/* Next line of the input (NUL-terminated in a copy), or the rest. */
static char *next_line(char **cursor, char *end) {
    char *start = *cursor;
    char *nl = memchr(start, '\n', (size_t)(end - start));
    if (!nl) {
        *cursor = end;
        return start;
    }
    *nl = '\0';
    *cursor = nl + 1;
    return start;
}

typedef struct {
    const uint8_t *data;
    size_t size;
} fuzz_input;

static void parse_one(const uint8_t *data, size_t size) {
    char *copy = malloc(size + 1);
    if (!copy) return;
    memcpy(copy, data, size);
    copy[size] = '\0';
    char *cursor = copy, *end = copy + size;
    char *method = next_line(&cursor, end);
    char *path = next_line(&cursor, end);
    char *query = next_line(&cursor, end);
    char *body = cursor;
    size_t body_len = (size_t)(end - cursor);

    gpcd_query_arg args[FUZZ_MAX_ARGS];
    int nargs = 0;
    for (char *pair = strtok(query, "&"); pair && nargs < FUZZ_MAX_ARGS; pair = strtok(NULL, "&")) {
        char *eq = strchr(pair, '=');
        if (eq) *eq = '\0';
        args[nargs].key = pair;
        args[nargs].value = eq ? eq + 1 : NULL;
        nargs++;
    }
    gpcd_request request;
    char error[512];
    int status = gpcd_request_parse(method, path, args, nargs, body, body_len, 1000, "fuzz",
                                    &request, error, sizeof error);
    /* the contract: 200 with a job exactly for submissions, else a message */
    if (status == 200 && request.kind == GPCD_REQ_SUBMIT) {
        if (!request.job || !request.job->command) abort();
        json_t *j = gpcd_job_to_json(request.job);
        char *text = json_dumps(j, JSON_COMPACT);
        if (!text) abort();
        free(text);
        json_decref(j);
    } else if (status != 200) {
        if (request.job || !error[0] || status < 400 || status > 599) abort();
    }
    gpcd_request_clear(&request);
    free(copy);
}

static void *parse_thread(void *arg) {
    const fuzz_input *in = arg;
    parse_one(in->data, in->size);
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_input in = {data, size};
    pthread_attr_t attr;
    pthread_t thread;
    if (pthread_attr_init(&attr) != 0 ||
        pthread_attr_setstacksize(&attr, GPCD_HTTP_THREAD_STACK) != 0 ||
        pthread_create(&thread, &attr, parse_thread, &in) != 0)
        abort();
    pthread_join(thread, NULL);
    pthread_attr_destroy(&attr);
    return 0;
}
