/*
 * dist_mpi.c: the collectives for CPU tensors over MPI, so that the
 * data-parallel trainer (bucketed all-reduce, ZeRO-1 shards) runs with
 * several CPU processes under mpirun, in CI and on machines without GPUs.
 *
 * Every call is blocking: the CPU backend has finished the gradients when
 * the backward hook runs, and overlap on two CI cores would gain nothing.
 * Collectives are in place. A failed MPI call aborts the job (MPI's default
 * error handler), which is what makes mpirun stop every rank when one dies.
 *
 * Built only when CMake finds MPI (GPC_HAVE_MPI); otherwise init explains
 * that this build has no MPI.
 */
#include "gpc/dist.h"

#ifdef GPC_HAVE_MPI

#include <limits.h>
#include <mpi.h>
#include <string.h>

static int mpi_started_here;

int gpc_dist_have_mpi(void) {
    return 1;
}

static gpc_status mpi_type(gpc_dtype dtype, MPI_Datatype *out) {
    if (dtype == GPC_F32) {
        *out = MPI_FLOAT;
        return GPC_OK;
    }
    return gpc_error(GPC_ERR_UNSUPPORTED,
                     "the mpi collectives move f32 tensors, not %s (the CPU trains in f32)",
                     gpc_dtype_name(dtype));
}

static gpc_status mpi_count(size_t count, int *out) {
    if (count > (size_t)INT_MAX)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "%zu elements are too many for one MPI call (at most %d)", count, INT_MAX);
    *out = (int)count;
    return GPC_OK;
}

static gpc_status mpi_check(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return GPC_OK;
    char text[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, text, &n);
    return gpc_error(GPC_ERR_IO, "MPI %s failed: %s", what, text);
}

/* A group made by mpi_split (d->impl; the world's has none). Between
 * group_start and group_end its sends and receives are posted without
 * waiting and complete together at group_end, as NCCL's do: a pipeline
 * stage's send to the next stage paired with its receive from it cannot
 * deadlock against the neighbour's mirror-image pair. */
#define MPI_GROUP_PENDING 16
typedef struct {
    MPI_Comm comm;
    int in_group, pending;
    MPI_Request requests[MPI_GROUP_PENDING];
} mpi_group_state;

static MPI_Comm comm_of(const gpc_dist *d) {
    return d->impl ? ((const mpi_group_state *)d->impl)->comm : MPI_COMM_WORLD;
}

static gpc_status wait_pending(mpi_group_state *g) {
    int n = g->pending;
    g->pending = 0;
    return mpi_check(MPI_Waitall(n, g->requests, MPI_STATUSES_IGNORE), "waitall");
}

static gpc_status mpi_all_reduce(gpc_dist *d, void *buf, size_t count, gpc_dtype dtype,
                                 gpc_stream stream) {
    (void)stream;
    MPI_Datatype t = MPI_FLOAT;
    int n = 0;
    GPC_TRY(mpi_type(dtype, &t));
    GPC_TRY(mpi_count(count, &n));
    if (n == 0) return GPC_OK;
    return mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf, n, t, MPI_SUM, comm_of(d)), "allreduce");
}

static gpc_status mpi_all_reduce_max(gpc_dist *d, void *buf, size_t count, gpc_dtype dtype,
                                     gpc_stream stream) {
    (void)stream;
    if (dtype != GPC_F32)
        return gpc_error(GPC_ERR_UNSUPPORTED, "the MPI max all-reduce takes f32, not %s",
                         gpc_dtype_name(dtype));
    int n = 0;
    GPC_TRY(mpi_count(count, &n));
    if (n == 0) return GPC_OK;
    return mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_MAX, comm_of(d)),
                     "allreduce max");
}

static gpc_status mpi_reduce(gpc_dist *d, void *buf, size_t count, gpc_dtype dtype, int root,
                             gpc_stream stream) {
    (void)stream;
    MPI_Datatype t = MPI_FLOAT;
    int n = 0;
    GPC_TRY(mpi_type(dtype, &t));
    GPC_TRY(mpi_count(count, &n));
    if (n == 0) return GPC_OK;
    /* the root sums into its own buffer; the others only send theirs */
    const void *send = d->rank == root ? MPI_IN_PLACE : buf;
    return mpi_check(
        MPI_Reduce(send, d->rank == root ? buf : NULL, n, t, MPI_SUM, root, comm_of(d)), "reduce");
}

static gpc_status mpi_reduce_scatter(gpc_dist *d, void *buf, const size_t *offsets, gpc_dtype dtype,
                                     gpc_stream stream) {
    size_t elem = gpc_dtype_size(dtype);
    for (int r = 0; r < d->world_size; r++)
        GPC_TRY(mpi_reduce(d, (char *)buf + offsets[r] * elem, offsets[r + 1] - offsets[r], dtype,
                           r, stream));
    return GPC_OK;
}

static gpc_status mpi_all_gather(gpc_dist *d, void *buf, const size_t *offsets, gpc_dtype dtype,
                                 gpc_stream stream) {
    (void)stream;
    MPI_Datatype t = MPI_FLOAT;
    GPC_TRY(mpi_type(dtype, &t));
    int W = d->world_size;
    int counts[W], displs[W];
    for (int r = 0; r < W; r++) {
        GPC_TRY(mpi_count(offsets[r + 1] - offsets[r], &counts[r]));
        GPC_TRY(mpi_count(offsets[r], &displs[r]));
    }
    return mpi_check(
        MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, t, comm_of(d)),
        "allgatherv");
}

static gpc_status mpi_broadcast(gpc_dist *d, void *buf, size_t count, gpc_dtype dtype, int root,
                                gpc_stream stream) {
    (void)stream;
    MPI_Datatype t = MPI_FLOAT;
    int n = 0;
    GPC_TRY(mpi_type(dtype, &t));
    GPC_TRY(mpi_count(count, &n));
    if (n == 0) return GPC_OK;
    return mpi_check(MPI_Bcast(buf, n, t, root, comm_of(d)), "broadcast");
}

static gpc_status mpi_group_start(gpc_dist *d) {
    if (d->impl) ((mpi_group_state *)d->impl)->in_group = 1;
    return GPC_OK;
}

static gpc_status mpi_group_end(gpc_dist *d) {
    mpi_group_state *g = d->impl;
    if (!g) return GPC_OK;
    g->in_group = 0;
    return wait_pending(g);
}

static gpc_status mpi_all_reduce_host(gpc_dist *d, double *values, int n) {
    return mpi_check(MPI_Allreduce(MPI_IN_PLACE, values, n, MPI_DOUBLE, MPI_SUM, comm_of(d)),
                     "allreduce");
}

static gpc_status mpi_barrier(gpc_dist *d) {
    return mpi_check(MPI_Barrier(comm_of(d)), "barrier");
}

static void mpi_watch(gpc_dist *d, int active) {
    (void)d, (void)active; /* mpirun stops the job when a rank dies */
}

static void mpi_destroy(gpc_dist *d) {
    int finalized = 0;
    if (d->impl) { /* a group: its communicator only */
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Comm_free(&((mpi_group_state *)d->impl)->comm);
        gpc_free(d->impl);
        d->impl = NULL;
        return;
    }
    MPI_Finalized(&finalized);
    if (mpi_started_here && !finalized) MPI_Finalize();
    mpi_started_here = 0;
}

static gpc_status mpi_split(gpc_dist *d, int color, int key, gpc_dist *child) {
    mpi_group_state *g = gpc_calloc(1, sizeof *g);
    if (!g) return gpc_error(GPC_ERR_NOMEM, "out of host memory");
    gpc_status s = mpi_check(MPI_Comm_split(comm_of(d), color, key, &g->comm), "comm split");
    if (s != GPC_OK) {
        gpc_free(g);
        return s;
    }
    MPI_Comm_rank(g->comm, &child->rank);
    MPI_Comm_size(g->comm, &child->world_size);
    child->ops = d->ops;
    child->impl = g;
    return GPC_OK;
}

/* A send (sending = 1) or a receive of count elements with peer: blocking
 * outside a group; inside one, posted to complete at group_end. buf is
 * only read when sending (MPI_Send and MPI_Isend take it as const). */
static gpc_status mpi_transfer(gpc_dist *d, void *buf, size_t count, gpc_dtype dtype, int peer,
                               int sending) {
    MPI_Datatype t = MPI_FLOAT;
    int n = 0;
    GPC_TRY(mpi_type(dtype, &t));
    GPC_TRY(mpi_count(count, &n));
    mpi_group_state *g = d->impl;
    if (!g || !g->in_group) {
        if (sending) return mpi_check(MPI_Send(buf, n, t, peer, 0, comm_of(d)), "send");
        return mpi_check(MPI_Recv(buf, n, t, peer, 0, comm_of(d), MPI_STATUS_IGNORE), "recv");
    }
    if (g->pending == MPI_GROUP_PENDING) GPC_TRY(wait_pending(g));
    MPI_Request *request = &g->requests[g->pending++];
    if (sending) return mpi_check(MPI_Isend(buf, n, t, peer, 0, g->comm, request), "isend");
    return mpi_check(MPI_Irecv(buf, n, t, peer, 0, g->comm, request), "irecv");
}

static gpc_status mpi_send(gpc_dist *d, const void *buf, size_t count, gpc_dtype dtype, int peer,
                           gpc_stream stream) {
    (void)stream;
    return mpi_transfer(d, (void *)buf, count, dtype, peer, 1);
}

static gpc_status mpi_recv(gpc_dist *d, void *buf, size_t count, gpc_dtype dtype, int peer,
                           gpc_stream stream) {
    (void)stream;
    return mpi_transfer(d, buf, count, dtype, peer, 0);
}

static const gpc_dist_ops mpi_ops = {.name = "mpi",
                                     .all_reduce_sum = mpi_all_reduce,
                                     .reduce_sum = mpi_reduce,
                                     .reduce_scatter_sum = mpi_reduce_scatter,
                                     .all_gather = mpi_all_gather,
                                     .broadcast = mpi_broadcast,
                                     .group_start = mpi_group_start,
                                     .group_end = mpi_group_end,
                                     .all_reduce_host = mpi_all_reduce_host,
                                     .barrier = mpi_barrier,
                                     .watch = mpi_watch,
                                     .destroy = mpi_destroy,
                                     .split = mpi_split,
                                     .send = mpi_send,
                                     .recv = mpi_recv,
                                     .all_reduce_max = mpi_all_reduce_max};

static gpc_status mpi_start(void) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
        int provided;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return gpc_error(GPC_ERR_IO, "MPI could not start (MPI_Init failed)");
        mpi_started_here = 1;
    }
    return GPC_OK;
}

gpc_status gpc_dist_mpi_init(gpc_dist *d, const gpc_dist_env *env) {
    if (strcmp(env->source, "mpirun") != 0)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "the mpi collectives need processes started by mpirun (found %s): run "
                         "mpirun -np %d gpc train ...",
                         env->source, env->world_size);
    GPC_TRY(mpi_start());
    int rank = -1, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank != env->rank || size != env->world_size)
        return gpc_error(GPC_ERR_MISMATCH,
                         "MPI says rank %d of %d but the environment says rank %d of %d", rank,
                         size, env->rank, env->world_size);
    d->ops = &mpi_ops;
    return GPC_OK;
}

gpc_status gpc_dist_mpi_bcast_bytes(void *data, size_t bytes) {
    GPC_TRY(mpi_start());
    int n = 0;
    GPC_TRY(mpi_count(bytes, &n));
    return mpi_check(MPI_Bcast(data, n, MPI_BYTE, 0, MPI_COMM_WORLD), "broadcast");
}

#else /* no MPI in this build */

int gpc_dist_have_mpi(void) {
    return 0;
}

gpc_status gpc_dist_mpi_init(gpc_dist *d, const gpc_dist_env *env) {
    (void)d, (void)env;
    return gpc_error(GPC_ERR_UNSUPPORTED,
                     "this gpc was built without MPI, which CPU data parallelism needs: install "
                     "libopenmpi-dev (scripts/setup.sh) and rebuild");
}

gpc_status gpc_dist_mpi_bcast_bytes(void *data, size_t bytes) {
    (void)data, (void)bytes;
    return gpc_error(GPC_ERR_UNSUPPORTED, "this gpc was built without MPI");
}

#endif
