/*
 * bench_util.h: what the benchmark programs share: orderings for qsort (to
 * take medians) and the status check that ends a program with gpc's message.
 */
#ifndef GPC_BENCH_UTIL_H
#define GPC_BENCH_UTIL_H

#include <stdio.h>

#include "gpc/core.h"

static inline int bench_cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
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
