/*
 * stencil_mpi.h: what the stencil needs from MPI between the processes that
 * share its grid (stencil_mpi.c): the halo planes to and from the process
 * below and above, sent without blocking so the slab's inside is updated
 * meanwhile, and the few reductions of the closing figures. Every call is a
 * no-op in a world of one process, and in a build without MPI a world of
 * more is refused by gpc_stencil_create, so callers need no #ifdef.
 */
#ifndef GPC_SCI_STENCIL_MPI_H
#define GPC_SCI_STENCIL_MPI_H

#include "gpc/core.h"

/* Whether this build can exchange halos over MPI. */
int gpc_stencil_mpi_built(void);

typedef struct gpc_stencil_halo gpc_stencil_halo;

gpc_status gpc_stencil_halo_create(gpc_stencil_halo **out, int rank, int world);
void gpc_stencil_halo_free(gpc_stencil_halo *h);

/* Starts the exchange of one step: send_lo goes to rank - 1, whose send_hi
 * arrives in recv_lo; send_hi goes to rank + 1, whose send_lo arrives in
 * recv_hi; `bytes` each. Ranks 0 and world - 1 skip the missing side. The
 * buffers must stay untouched until gpc_stencil_halo_wait returns. */
gpc_status gpc_stencil_halo_post(gpc_stencil_halo *h, const void *send_lo, const void *send_hi,
                                 void *recv_lo, void *recv_hi, size_t bytes);
gpc_status gpc_stencil_halo_wait(gpc_stencil_halo *h);

/* values[i] becomes the maximum over the processes (exact in any order). */
gpc_status gpc_stencil_mpi_max(double *values, int n, int world);
/* values[i] becomes the sum modulo 2^64 over the processes. */
gpc_status gpc_stencil_mpi_sum_u64(uint64_t *values, int n, int world);
/* root's value into every process's *value. */
gpc_status gpc_stencil_mpi_bcast(double *value, int root, int world);

#endif /* GPC_SCI_STENCIL_MPI_H */
