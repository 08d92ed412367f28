/*
 * bench_util.h: what the benchmark programs share: orderings for qsort (to
 * take medians) and the status check that ends a program with gpc's message.
 */
#ifndef GPC_BENCH_UTIL_H
#define GPC_BENCH_UTIL_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpc/core.h"

static inline int bench_cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The value of option `name` as a whole number from lo to hi, into *out;
 * otherwise a line on stderr from `program` saying what is wrong, and 0. */
static inline int bench_parse_int64(const char *program, const char *name, const char *text,
                                    int64_t lo, int64_t hi, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end || errno) {
        fprintf(stderr, "%s: %s needs a whole number, not '%s'\n", program, name, text);
        return 0;
    }
    if (v < lo || v > hi) {
        fprintf(stderr, "%s: %s needs a number from %lld to %lld, not '%s'\n", program, name,
                (long long)lo, (long long)hi, text);
        return 0;
    }
    *out = v;
    return 1;
}

/* In main: returns 1 with gpc's last error when a call fails. */
#define BENCH_TRY(program, x)                                                                      \
    do {                                                                                           \
        if ((x) != GPC_OK) {                                                                       \
            fprintf(stderr, "%s: %s\n", program, gpc_last_error());                                \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

#endif /* GPC_BENCH_UTIL_H */
