/*
 * core_bench.c: the host work a large model's start and its checkpoints
 * spend time in, each the best of 3 runs:
 *
 *   fill    gpc_rng_fill_normal over --values floats (a model's first
 *           weights), on the OpenMP threads, against a loop of single
 *           gpc_rng_normal draws on one thread (the same values, checked)
 *   crc     gpc_crc32c over --bytes bytes (every file gpc writes or reads)
 *
 *   bench_core_bench [--values 100000000] [--bytes 268435456]
 *
 * Prints RESULT core fill threads=T ns_per_value=X single_ns_per_value=Y
 * and RESULT core crc32c gb_per_s=Z.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/core.h"

int main(int argc, char **argv) {
    size_t values = 100000000, bytes = (size_t)1 << 28;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--values") == 0)
            values = strtoull(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--bytes") == 0)
            bytes = strtoull(argv[i + 1], NULL, 10);
        else {
            fprintf(stderr, "bench_core_bench: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    float *a = malloc(values * sizeof *a), *b = malloc(values * sizeof *b);
    unsigned char *data = malloc(bytes);
    if (!a || !b || !data) {
        fprintf(stderr, "bench_core_bench: out of host memory\n");
        return 1;
    }
    double fill = 1e30, single = 1e30, crc = 1e30;
    for (int run = 0; run < 3; run++) {
        gpc_rng r;
        gpc_rng_seed(&r, 1, 2);
        double t = gpc_time_seconds();
        gpc_rng_fill_normal(&r, a, values, 0.0f, 0.02f);
        double s = gpc_time_seconds() - t;
        fill = s < fill ? s : fill;
        gpc_rng_seed(&r, 1, 2);
        t = gpc_time_seconds();
        for (size_t i = 0; i < values; i++)
            b[i] = 0.0f + 0.02f * gpc_rng_normal(&r);
        s = gpc_time_seconds() - t;
        single = s < single ? s : single;
    }
    if (memcmp(a, b, values * sizeof *a) != 0) {
        fprintf(stderr, "bench_core_bench: the threaded fill differs from single draws\n");
        return 1;
    }
    for (size_t i = 0; i < bytes; i++)
        data[i] = (unsigned char)(i * 2654435761u >> 13);
    uint32_t sum = 0;
    for (int run = 0; run < 3; run++) {
        double t = gpc_time_seconds();
        sum ^= gpc_crc32c(0, data, bytes);
        double s = gpc_time_seconds() - t;
        crc = s < crc ? s : crc;
    }
    printf("RESULT core fill threads=%d values=%zu ns_per_value=%.2f single_ns_per_value=%.2f\n",
           omp_get_max_threads(), values, fill / values * 1e9, single / values * 1e9);
    printf("RESULT core crc32c bytes=%zu gb_per_s=%.2f (checksum %08x)\n", bytes, bytes / crc / 1e9,
           sum);
    free(a), free(b), free(data);
    return 0;
}
