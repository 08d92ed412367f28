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
#include <string.h>

#include "gpc/core.h"
#include "ops/ops.h"

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

/* The CUDA backend, or NULL after a line on stderr from `program` saying why
 * there is none (no GPU, no driver, a build without CUDA). */
static inline const gpc_backend *bench_cuda(const char *program) {
    const gpc_backend *cuda = gpc_backend_get(GPC_DEVICE_CUDA);
    if (!cuda) fprintf(stderr, "%s: %s\n", program, gpc_last_error());
    return cuda;
}

/* The --precision value `text` as a float dtype (f32, bf16 or f16) into
 * *out; otherwise a line on stderr from `program`, and 0. */
static inline int bench_parse_float_dtype(const char *program, const char *text, gpc_dtype *out) {
    gpc_dtype dt;
    if (gpc_dtype_parse(text, &dt) != GPC_OK ||
        (dt != GPC_F32 && dt != GPC_BF16 && dt != GPC_F16)) {
        fprintf(stderr, "%s: --precision needs f32, bf16 or f16, not '%s'\n", program, text);
        return 0;
    }
    *out = dt;
    return 1;
}

/* Parses the options --rows (1 to 2^22), --channels (8 to max_channels) and
 * --reps (1 to 10000), each followed by its value, into the variables given
 * (which hold the defaults). Returns 0, or 2 after a one-line message. */
static inline int bench_parse_rows_channels_reps(const char *program, int argc, char **argv,
                                                 int64_t *rows, int64_t *channels,
                                                 int64_t max_channels, int64_t *reps) {
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = v != NULL;
        if (ok && !strcmp(a, "--rows"))
            ok = bench_parse_int64(program, a, v, 1, 1 << 22, rows);
        else if (ok && !strcmp(a, "--channels"))
            ok = bench_parse_int64(program, a, v, 8, max_channels, channels);
        else if (ok && !strcmp(a, "--reps"))
            ok = bench_parse_int64(program, a, v, 1, 10000, reps);
        else {
            fprintf(stderr, "%s: unknown option or missing value: %s\n", program, a);
            return 2;
        }
        if (!ok) return 2;
    }
    return 0;
}

/* Fills the [rows, cols] tensor t (any float dtype, any device) with the
 * same `repeat` rows of uniform random values in [lo, hi) over and over, so
 * the host's share of filling a large tensor stays small. Returns 0, or 1
 * after printing gpc's message. */
static inline int bench_fill_rows(const char *program, gpc_tensor *t, gpc_rng *rng, float lo,
                                  float hi, int64_t repeat) {
    int64_t rows = t->shape[0], cols = t->shape[1];
    int64_t chunk = rows < repeat ? rows : repeat, s_h[2] = {chunk, cols};
    gpc_tensor host, host_t;
    BENCH_TRY(program, gpc_tensor_alloc(&host, GPC_F32, gpc_cpu(), 2, s_h));
    BENCH_TRY(program, gpc_tensor_alloc(&host_t, t->dtype, gpc_cpu(), 2, s_h));
    gpc_rng_fill_uniform(rng, host.data, (size_t)(chunk * cols), lo, hi);
    BENCH_TRY(program, gpc_op_convert(&host_t, &host));
    size_t row_bytes = (size_t)cols * gpc_dtype_size(t->dtype);
    for (int64_t r = 0; r < rows; r += chunk) {
        int64_t n = rows - r < chunk ? rows - r : chunk;
        gpc_tensor part =
            gpc_tensor_2d((char *)t->data + r * row_bytes, t->dtype, t->device, n, cols);
        gpc_tensor src = gpc_tensor_2d(host_t.data, t->dtype, gpc_cpu(), n, cols);
        BENCH_TRY(program, gpc_tensor_copy(&part, &src));
    }
    gpc_tensor_free(&host);
    gpc_tensor_free(&host_t);
    return 0;
}

#endif /* GPC_BENCH_UTIL_H */
