/*
 * stencil_mpi.c: halo planes and reductions of the stencil over MPI
 * (stencil_mpi.h). MPI itself is started by gpc_dist_create's mpi backend,
 * which also checks the ranks agree with the launcher's environment; this
 * file only moves bytes on MPI_COMM_WORLD. A failed MPI call aborts the job
 * (MPI's default error handler), which makes mpirun stop every rank.
 */
#include "sci/stencil_mpi.h"

#include <stdlib.h>

#ifdef GPC_HAVE_MPI

#include <limits.h>
#include <mpi.h>

/* tags: which way a plane travels, so a two-process ring cannot mix them */
enum { TAG_UP = 1, TAG_DOWN = 2 };

struct gpc_stencil_halo {
    int rank, world, count;
    MPI_Request requests[4];
};

int gpc_stencil_mpi_built(void) {
    return 1;
}

static gpc_status check(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return GPC_OK;
    char text[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, text, &n);
    return gpc_error(GPC_ERR_IO, "stencil: MPI %s failed: %s", what, text);
}

gpc_status gpc_stencil_halo_create(gpc_stencil_halo **out, int rank, int world) {
    *out = gpc_calloc(1, sizeof **out);
    if (!*out) return gpc_error(GPC_ERR_NOMEM, "stencil: out of host memory");
    (*out)->rank = rank, (*out)->world = world;
    return GPC_OK;
}

gpc_status gpc_stencil_halo_post(gpc_stencil_halo *h, const void *send_lo, const void *send_hi,
                                 void *recv_lo, void *recv_hi, size_t bytes) {
    h->count = 0;
    if (h->world <= 1) return GPC_OK;
    if (bytes > (size_t)INT_MAX)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "stencil: a halo plane of %zu bytes is too large for one MPI message",
                         bytes);
    const int b = (int)bytes;
    MPI_Request *q = h->requests;
    /* receives first, so a plane that arrives early lands in place */
    if (h->rank > 0) {
        GPC_TRY(check(
            MPI_Irecv(recv_lo, b, MPI_BYTE, h->rank - 1, TAG_UP, MPI_COMM_WORLD, &q[h->count++]),
            "irecv"));
    }
    if (h->rank + 1 < h->world) {
        GPC_TRY(check(
            MPI_Irecv(recv_hi, b, MPI_BYTE, h->rank + 1, TAG_DOWN, MPI_COMM_WORLD, &q[h->count++]),
            "irecv"));
    }
    if (h->rank > 0) {
        GPC_TRY(check(
            MPI_Isend(send_lo, b, MPI_BYTE, h->rank - 1, TAG_DOWN, MPI_COMM_WORLD, &q[h->count++]),
            "isend"));
    }
    if (h->rank + 1 < h->world) {
        GPC_TRY(check(
            MPI_Isend(send_hi, b, MPI_BYTE, h->rank + 1, TAG_UP, MPI_COMM_WORLD, &q[h->count++]),
            "isend"));
    }
    return GPC_OK;
}

gpc_status gpc_stencil_halo_wait(gpc_stencil_halo *h) {
    if (h->count == 0) return GPC_OK;
    int n = h->count;
    h->count = 0;
    return check(MPI_Waitall(n, h->requests, MPI_STATUSES_IGNORE), "waitall");
}

gpc_status gpc_stencil_mpi_max(double *values, int n, int world) {
    if (world <= 1) return GPC_OK;
    return check(MPI_Allreduce(MPI_IN_PLACE, values, n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD),
                 "allreduce");
}

gpc_status gpc_stencil_mpi_sum_u64(uint64_t *values, int n, int world) {
    if (world <= 1) return GPC_OK;
    return check(MPI_Allreduce(MPI_IN_PLACE, values, n, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD),
                 "allreduce");
}

gpc_status gpc_stencil_mpi_bcast(double *value, int root, int world) {
    if (world <= 1) return GPC_OK;
    return check(MPI_Bcast(value, 1, MPI_DOUBLE, root, MPI_COMM_WORLD), "broadcast");
}

#else /* no MPI: only a world of one process, where every call is a no-op */

struct gpc_stencil_halo {
    int unused;
};

int gpc_stencil_mpi_built(void) {
    return 0;
}

gpc_status gpc_stencil_halo_create(gpc_stencil_halo **out, int rank, int world) {
    (void)rank;
    *out = NULL;
    if (world > 1)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "stencil: this gpc was built without MPI, which %d processes need: "
                         "install libopenmpi-dev (scripts/setup.sh) and rebuild",
                         world);
    *out = gpc_calloc(1, sizeof **out);
    return *out ? GPC_OK : gpc_error(GPC_ERR_NOMEM, "stencil: out of host memory");
}

gpc_status gpc_stencil_halo_post(gpc_stencil_halo *h, const void *send_lo, const void *send_hi,
                                 void *recv_lo, void *recv_hi, size_t bytes) {
    (void)h, (void)send_lo, (void)send_hi, (void)recv_lo, (void)recv_hi, (void)bytes;
    return GPC_OK;
}

gpc_status gpc_stencil_halo_wait(gpc_stencil_halo *h) {
    (void)h;
    return GPC_OK;
}

gpc_status gpc_stencil_mpi_max(double *values, int n, int world) {
    (void)values, (void)n, (void)world;
    return GPC_OK;
}

gpc_status gpc_stencil_mpi_sum_u64(uint64_t *values, int n, int world) {
    (void)values, (void)n, (void)world;
    return GPC_OK;
}

gpc_status gpc_stencil_mpi_bcast(double *value, int root, int world) {
    (void)value, (void)root, (void)world;
    return GPC_OK;
}

#endif

void gpc_stencil_halo_free(gpc_stencil_halo *h) {
    gpc_free(h);
}
