/*
 * mpi_check.h: the checks of the MPI test programs, which run as several
 * processes at once. CHECK counts a failed condition and says which rank
 * saw it, so every rank's failures are reported before the program ends;
 * MUST ends the process at once on a gpc error, with its message. The file
 * that includes this defines `static int rank, failures;` first.
 */
#ifndef GPC_TESTS_MPI_CHECK_H
#define GPC_TESTS_MPI_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rank %d: ", rank);                                                    \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

#define MUST(expr)                                                                                 \
    do {                                                                                           \
        if ((expr) != GPC_OK) {                                                                    \
            fprintf(stderr, "rank %d: %s failed: %s\n", rank, #expr, gpc_last_error());            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#endif /* GPC_TESTS_MPI_CHECK_H */
