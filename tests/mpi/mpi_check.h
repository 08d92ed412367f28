/*
 * mpi_check.h: the checks of the MPI test programs, which run as several
 * processes at once. CHECK counts a failed condition and says which rank
 * saw it, so every rank's failures are reported before the program ends;
 * MUST ends the process at once on a gpc error, with its message;
 * every_rank_has_a_gpu asks all ranks whether they see a GPU, and
 * every_rank_has_its_own_gpu_and_nccl (after it) whether each has a GPU
 * of its own and NCCL. The file
 * that includes this defines `static int rank, failures;` first.
 */
#ifndef GPC_TESTS_MPI_CHECK_H
#define GPC_TESTS_MPI_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "gpc/dist.h"

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

/* Whether every rank of `d` sees a GPU (through the CUDA backend; a build
 * without it sees none): a program's "cuda" runs skip unless all do. */
static inline int every_rank_has_a_gpu(gpc_dist *d) {
    const gpc_backend *b = gpc_backend_get(GPC_DEVICE_CUDA);
    double none = b && b->device_count && b->device_count() > 0 ? 0 : 1;
    MUST(d->ops->all_reduce_host(d, &none, 1));
    return none == 0;
}

/* Whether every rank of d has a GPU of its own (its local rank) and NCCL
 * loads there: what the "nccl" variants need. */
static inline int every_rank_has_its_own_gpu_and_nccl(gpc_dist *d, int local_rank) {
    const gpc_backend *b = gpc_backend_get(GPC_DEVICE_CUDA);
    double lacking = local_rank < b->device_count() && !gpc_dist_nccl_available() ? 0 : 1;
    MUST(d->ops->all_reduce_host(d, &lacking, 1));
    return lacking == 0;
}

#endif /* GPC_TESTS_MPI_CHECK_H */
