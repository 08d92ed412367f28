/*
 * dist_nccl.c: the collectives for GPU tensors over NCCL.
 *
 * NCCL is loaded at run time with dlopen("libnccl.so.2"), and the few types
 * and functions used here are declared below from NCCL's public API (nccl.h,
 * stable since NCCL 2.0), so gpc builds without NCCL headers and runs without
 * NCCL until a multi-GPU job asks for it.
 *
 * Collectives are queued on the stream given (NULL: the legacy default
 * stream, where the model's ops run) and return at once. NVLink multicast
 * (NVLS) is switched off for every process (NCCL_NVLS_ENABLE=0): the shared
 * GPU servers gpc targets must not use it.
 *
 * Hangs: NCCL waits forever for a peer that died or hung. A watchdog thread
 * watches the steps that the trainer marks (ops->watch): when one takes
 * longer than GPC_DIST_TIMEOUT seconds (default 300), or NCCL reports an
 * asynchronous error, it aborts the communicator, which releases the waiting
 * kernels, and the step fails with a message. If the process is still stuck
 * 30 s later, the watchdog ends it (the one exit in libgpc: a process whose
 * device waits forever cannot recover), so the launcher sees the failure and
 * stops the other ranks.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpc/dist.h"

/* ------------------------------------------------------------ NCCL API */

typedef struct nccl_comm *nccl_comm_t;
typedef struct {
    char internal[128]; /* NCCL_UNIQUE_ID_BYTES */
} nccl_unique_id;
typedef int nccl_result; /* ncclSuccess = 0 */
enum { NCCL_INT8 = 0, NCCL_FLOAT16 = 6, NCCL_FLOAT32 = 7, NCCL_FLOAT64 = 8, NCCL_BFLOAT16 = 9 };
enum { NCCL_SUM = 0, NCCL_MAX = 2 }; /* ncclRedOp_t: ncclSum, ncclProd, ncclMax */

typedef struct {
    void *lib;
    nccl_result (*get_unique_id)(nccl_unique_id *);
    nccl_result (*comm_init_rank)(nccl_comm_t *, int, nccl_unique_id, int);
    nccl_result (*comm_destroy)(nccl_comm_t);
    nccl_result (*comm_abort)(nccl_comm_t);
    nccl_result (*comm_get_async_error)(nccl_comm_t, nccl_result *);
    nccl_result (*all_reduce)(const void *, void *, size_t, int, int, nccl_comm_t, void *);
    nccl_result (*reduce)(const void *, void *, size_t, int, int, int, nccl_comm_t, void *);
    nccl_result (*broadcast)(const void *, void *, size_t, int, int, nccl_comm_t, void *);
    nccl_result (*reduce_scatter)(const void *, void *, size_t, int, int, nccl_comm_t, void *);
    nccl_result (*all_gather)(const void *, void *, size_t, int, nccl_comm_t, void *);
    nccl_result (*group_start)(void);
    nccl_result (*group_end)(void);
    const char *(*error_string)(nccl_result);
    nccl_result (*get_version)(int *);
    /* optional: NCCL 2.18 (split), 2.7 (send, recv); NULL when absent */
    nccl_result (*comm_split)(nccl_comm_t, int, int, nccl_comm_t *, void *);
    nccl_result (*send)(const void *, size_t, int, int, nccl_comm_t, void *);
    nccl_result (*recv)(void *, size_t, int, int, nccl_comm_t, void *);
} nccl_api;

static nccl_api api;

static gpc_status nccl_load(void) {
    if (api.lib) return GPC_OK;
    void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "multi-GPU training needs NCCL, and libnccl.so.2 could not be loaded "
                         "(%s): install NCCL (libnccl2) or add its folder to LD_LIBRARY_PATH",
                         dlerror());
    nccl_api a;
    memset(&a, 0, sizeof a);
    a.lib = lib;
#define SYM(field, name)                                                                           \
    do {                                                                                           \
        *(void **)&a.field = dlsym(lib, name);                                                     \
        if (!a.field) {                                                                            \
            dlclose(lib);                                                                          \
            return gpc_error(GPC_ERR_UNSUPPORTED,                                                  \
                             "libnccl.so.2 lacks %s: NCCL 2.7 or newer is needed", name);          \
        }                                                                                          \
    } while (0)
    SYM(get_unique_id, "ncclGetUniqueId");
    SYM(comm_init_rank, "ncclCommInitRank");
    SYM(comm_destroy, "ncclCommDestroy");
    SYM(comm_abort, "ncclCommAbort");
    SYM(comm_get_async_error, "ncclCommGetAsyncError");
    SYM(all_reduce, "ncclAllReduce");
    SYM(reduce, "ncclReduce");
    SYM(broadcast, "ncclBroadcast");
    SYM(reduce_scatter, "ncclReduceScatter");
    SYM(all_gather, "ncclAllGather");
    SYM(group_start, "ncclGroupStart");
    SYM(group_end, "ncclGroupEnd");
    SYM(error_string, "ncclGetErrorString");
    SYM(get_version, "ncclGetVersion");
#undef SYM
    *(void **)&a.comm_split = dlsym(lib, "ncclCommSplit");
    *(void **)&a.send = dlsym(lib, "ncclSend");
    *(void **)&a.recv = dlsym(lib, "ncclRecv");
    api = a;
    return GPC_OK;
}

/* ------------------------------------------------------------ state */

typedef struct {
    nccl_comm_t comm;
    const gpc_backend *backend;
    double *host_dev; /* device buffer for all_reduce_host */
    int host_cap;
    /* watchdog */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t lock;
    double active_since; /* 0: not in a watched step */
    volatile int aborted, stopping;
} nccl_state;

static gpc_status nccl_check(gpc_dist *d, nccl_result r, const char *what) {
    nccl_state *st = d->impl;
    if (st->aborted)
        return gpc_error(GPC_ERR_IO,
                         "rank %d: NCCL was aborted after no progress for %.0f s: another rank "
                         "hung or died (see its messages)",
                         d->rank, d->timeout_s);
    if (r == 0) return GPC_OK;
    return gpc_error(GPC_ERR_DEVICE, "rank %d: NCCL %s failed: %s", d->rank, what,
                     api.error_string(r));
}

static gpc_status nccl_type(gpc_dtype dtype, int *out) {
    switch (dtype) {
    case GPC_F32:
        *out = NCCL_FLOAT32;
        return GPC_OK;
    case GPC_BF16:
        *out = NCCL_BFLOAT16;
        return GPC_OK;
    case GPC_F16:
        *out = NCCL_FLOAT16;
        return GPC_OK;
    case GPC_I8: /* bytes, for point-to-point copies of any data */
        *out = NCCL_INT8;
        return GPC_OK;
    default:
        return gpc_error(GPC_ERR_UNSUPPORTED, "NCCL collectives on %s are not supported",
                         gpc_dtype_name(dtype));
    }
}

static gpc_status n_all_reduce(gpc_dist *d, void *buf, size_t count, gpc_dtype dtype,
                               gpc_stream stream) {
    nccl_state *st = d->impl;
    int t = 0;
    GPC_TRY(nccl_type(dtype, &t));
    if (!count) return GPC_OK;
    return nccl_check(d, api.all_reduce(buf, buf, count, t, NCCL_SUM, st->comm, stream),
                      "all-reduce");
}

static gpc_status n_all_reduce_max(gpc_dist *d, void *buf, size_t count, gpc_dtype dtype,
                                   gpc_stream stream) {
    nccl_state *st = d->impl;
    int t = 0;
    GPC_TRY(nccl_type(dtype, &t));
    if (!count) return GPC_OK;
    return nccl_check(d, api.all_reduce(buf, buf, count, t, NCCL_MAX, st->comm, stream),
                      "max all-reduce");
}

static gpc_status n_reduce(gpc_dist *d, void *buf, size_t count, gpc_dtype dtype, int root,
                           gpc_stream stream) {
    nccl_state *st = d->impl;
    int t = 0;
    GPC_TRY(nccl_type(dtype, &t));
    if (!count) return GPC_OK;
    return nccl_check(d, api.reduce(buf, buf, count, t, NCCL_SUM, root, st->comm, stream),
                      "reduce");
}

static gpc_status n_broadcast(gpc_dist *d, void *buf, size_t count, gpc_dtype dtype, int root,
                              gpc_stream stream) {
    nccl_state *st = d->impl;
    int t = 0;
    GPC_TRY(nccl_type(dtype, &t));
    if (!count) return GPC_OK;
    return nccl_check(d, api.broadcast(buf, buf, count, t, root, st->comm, stream), "broadcast");
}

/* Equal segments laid out rank after rank: NCCL's own reduce-scatter and
 * all-gather work in place there. Otherwise one reduce (broadcast) per
 * segment, launched as a group. */
static int equal_segments(const gpc_dist *d, const size_t *offsets) {
    size_t n = offsets[1] - offsets[0];
    if (offsets[0] != 0) return 0;
    for (int r = 0; r < d->world_size; r++)
        if (offsets[r + 1] - offsets[r] != n) return 0;
    return 1;
}

static gpc_status n_reduce_scatter(gpc_dist *d, void *buf, const size_t *offsets, gpc_dtype dtype,
                                   gpc_stream stream) {
    nccl_state *st = d->impl;
    int t = 0;
    GPC_TRY(nccl_type(dtype, &t));
    size_t elem = gpc_dtype_size(dtype);
    if (equal_segments(d, offsets)) {
        size_t n = offsets[1];
        if (!n) return GPC_OK;
        return nccl_check(d,
                          api.reduce_scatter(buf, (char *)buf + offsets[d->rank] * elem, n, t,
                                             NCCL_SUM, st->comm, stream),
                          "reduce-scatter");
    }
    GPC_TRY(nccl_check(d, api.group_start(), "group start"));
    for (int r = 0; r < d->world_size; r++)
        GPC_TRY(n_reduce(d, (char *)buf + offsets[r] * elem, offsets[r + 1] - offsets[r], dtype, r,
                         stream));
    return nccl_check(d, api.group_end(), "group end");
}

static gpc_status n_all_gather(gpc_dist *d, void *buf, const size_t *offsets, gpc_dtype dtype,
                               gpc_stream stream) {
    nccl_state *st = d->impl;
    int t = 0;
    GPC_TRY(nccl_type(dtype, &t));
    size_t elem = gpc_dtype_size(dtype);
    if (equal_segments(d, offsets)) {
        size_t n = offsets[1];
        if (!n) return GPC_OK;
        return nccl_check(
            d, api.all_gather((char *)buf + offsets[d->rank] * elem, buf, n, t, st->comm, stream),
            "all-gather");
    }
    GPC_TRY(nccl_check(d, api.group_start(), "group start"));
    for (int r = 0; r < d->world_size; r++)
        GPC_TRY(n_broadcast(d, (char *)buf + offsets[r] * elem, offsets[r + 1] - offsets[r], dtype,
                            r, stream));
    return nccl_check(d, api.group_end(), "group end");
}

static gpc_status n_group_start(gpc_dist *d) {
    return nccl_check(d, api.group_start(), "group start");
}

static gpc_status n_group_end(gpc_dist *d) {
    return nccl_check(d, api.group_end(), "group end");
}

static gpc_status n_all_reduce_host(gpc_dist *d, double *values, int n) {
    nccl_state *st = d->impl;
    if (n > st->host_cap) {
        if (st->host_dev) st->backend->free(d->device.index, st->host_dev);
        st->host_dev = NULL;
        st->host_cap = 0;
        GPC_TRY(st->backend->alloc(d->device.index, (size_t)n * sizeof(double),
                                   (void **)&st->host_dev));
        st->host_cap = n;
    }
    size_t bytes = (size_t)n * sizeof(double);
    /* the copies run on the default stream, behind the step's work */
    GPC_TRY(st->backend->copy(st->host_dev, d->device, values, gpc_cpu(), bytes, NULL));
    GPC_TRY(nccl_check(d,
                       api.all_reduce(st->host_dev, st->host_dev, (size_t)n, NCCL_FLOAT64, NCCL_SUM,
                                      st->comm, NULL),
                       "all-reduce"));
    GPC_TRY(st->backend->copy(values, gpc_cpu(), st->host_dev, d->device, bytes, NULL));
    return nccl_check(d, 0, "all-reduce");
}

static gpc_status n_barrier(gpc_dist *d) {
    double x = 0;
    return n_all_reduce_host(d, &x, 1);
}

static void n_watch(gpc_dist *d, int active) {
    nccl_state *st = d->impl;
    pthread_mutex_lock(&st->lock);
    st->active_since = active ? gpc_time_seconds() : 0;
    pthread_mutex_unlock(&st->lock);
}

static void *watchdog(void *arg) {
    gpc_dist *d = arg;
    nccl_state *st = d->impl;
    double aborted_at = 0;
    while (!st->stopping) {
        usleep(200000);
        pthread_mutex_lock(&st->lock);
        double since = st->active_since;
        pthread_mutex_unlock(&st->lock);
        double now = gpc_time_seconds();
        nccl_result async = 0;
        if (st->comm && !st->aborted) api.comm_get_async_error(st->comm, &async);
        if (!st->aborted && (async != 0 || (since > 0 && now - since > d->timeout_s))) {
            if (async != 0)
                gpc_log(GPC_LOG_ERROR, "rank %d: NCCL reported an error: %s; aborting", d->rank,
                        api.error_string(async));
            else
                gpc_log(GPC_LOG_ERROR,
                        "rank %d: a step of collectives made no progress for %.0f s "
                        "(GPC_DIST_TIMEOUT): another rank hung or died; aborting NCCL",
                        d->rank, d->timeout_s);
            st->aborted = 1;
            aborted_at = now;
            if (st->comm) api.comm_abort(st->comm);
        }
        if (st->aborted && since > 0 && now - aborted_at > 30) {
            gpc_log(GPC_LOG_ERROR, "rank %d: still stuck 30 s after aborting NCCL; exiting",
                    d->rank);
            _exit(1);
        }
    }
    return NULL;
}

static void n_destroy(gpc_dist *d) {
    nccl_state *st = d->impl;
    if (!st) return;
    if (st->thread_started) {
        st->stopping = 1;
        pthread_join(st->thread, NULL);
    }
    if (st->comm && !st->aborted) api.comm_destroy(st->comm);
    if (st->host_dev) st->backend->free(d->device.index, st->host_dev);
    pthread_mutex_destroy(&st->lock);
    gpc_free(st);
    d->impl = NULL;
}

static gpc_status n_split(gpc_dist *d, int color, int key, gpc_dist *child);

static gpc_status n_send(gpc_dist *d, const void *buf, size_t count, gpc_dtype dtype, int peer,
                         gpc_stream stream) {
    nccl_state *st = d->impl;
    int t = 0;
    GPC_TRY(nccl_type(dtype, &t));
    if (!api.send)
        return gpc_error(GPC_ERR_UNSUPPORTED, "this NCCL has no ncclSend: NCCL 2.7 or newer is "
                                              "needed for pipeline parallelism");
    return nccl_check(d, api.send(buf, count, t, peer, st->comm, stream), "send");
}

static gpc_status n_recv(gpc_dist *d, void *buf, size_t count, gpc_dtype dtype, int peer,
                         gpc_stream stream) {
    nccl_state *st = d->impl;
    int t = 0;
    GPC_TRY(nccl_type(dtype, &t));
    if (!api.recv)
        return gpc_error(GPC_ERR_UNSUPPORTED, "this NCCL has no ncclRecv: NCCL 2.7 or newer is "
                                              "needed for pipeline parallelism");
    return nccl_check(d, api.recv(buf, count, t, peer, st->comm, stream), "recv");
}

static const gpc_dist_ops nccl_ops = {"nccl",           n_all_reduce, n_reduce,
                                      n_reduce_scatter, n_all_gather, n_broadcast,
                                      n_group_start,    n_group_end,  n_all_reduce_host,
                                      n_barrier,        n_watch,      n_destroy,
                                      n_split,          n_send,       n_recv,
                                      n_all_reduce_max};

/* A group's communicator from the world's (ncclCommSplit, NCCL 2.18), with
 * its own state and watchdog. */
static gpc_status n_split(gpc_dist *d, int color, int key, gpc_dist *child) {
    nccl_state *parent = d->impl;
    if (!api.comm_split)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "this NCCL has no ncclCommSplit: tensor and pipeline parallelism need "
                         "NCCL 2.18 or newer");
    nccl_state *st = gpc_calloc(1, sizeof *st);
    if (!st) return gpc_error(GPC_ERR_NOMEM, "out of host memory");
    st->backend = parent->backend;
    pthread_mutex_init(&st->lock, NULL);
    n_watch(d, 1); /* the split waits for every rank of d */
    nccl_result r = api.comm_split(parent->comm, color, key, &st->comm, NULL);
    n_watch(d, 0);
    if (r != 0) {
        pthread_mutex_destroy(&st->lock);
        gpc_free(st);
        return gpc_error(GPC_ERR_DEVICE, "NCCL could not split the communicator: %s",
                         api.error_string(r));
    }
    /* the child's rank and size: an all-reduce of ones would need the
     * device; NCCL reports them */
    nccl_result (*count)(nccl_comm_t, int *) = NULL;
    nccl_result (*user_rank)(nccl_comm_t, int *) = NULL;
    *(void **)&count = dlsym(api.lib, "ncclCommCount");
    *(void **)&user_rank = dlsym(api.lib, "ncclCommUserRank");
    if (!count || !user_rank || count(st->comm, &child->world_size) != 0 ||
        user_rank(st->comm, &child->rank) != 0) {
        api.comm_destroy(st->comm);
        pthread_mutex_destroy(&st->lock);
        gpc_free(st);
        return gpc_error(GPC_ERR_DEVICE, "NCCL could not report a group's rank and size");
    }
    child->ops = &nccl_ops;
    child->impl = st;
    if (pthread_create(&st->thread, NULL, watchdog, child) == 0) st->thread_started = 1;
    return GPC_OK;
}

gpc_status gpc_dist_nccl_available(void) {
    return nccl_load();
}

gpc_status gpc_dist_nccl_init(gpc_dist *d, const gpc_dist_env *env) {
    setenv("NCCL_NVLS_ENABLE", "0", 1); /* NVLink multicast stays off on shared servers */
    GPC_TRY(nccl_load());
    const gpc_backend *backend;
    GPC_TRY(gpc_backend_require(d->device, &backend));
    /* makes this process's GPU current, which NCCL's init needs */
    size_t free_bytes, total;
    GPC_TRY(backend->memory_info(d->device.index, &free_bytes, &total));

    nccl_unique_id id;
    memset(&id, 0, sizeof id);
    if (d->rank == 0) {
        nccl_result r = api.get_unique_id(&id);
        if (r != 0)
            return gpc_error(GPC_ERR_DEVICE, "NCCL could not make a unique id: %s",
                             api.error_string(r));
    }
    if (strcmp(env->source, "mpirun") == 0 && !env->master_addr[0] && gpc_dist_have_mpi()) {
        GPC_TRY(gpc_dist_mpi_bcast_bytes(&id, sizeof id));
    } else {
        gpc_status s = gpc_dist_rendezvous(env->master_addr, env->master_port, d->rank,
                                           d->world_size, &id, sizeof id, d->timeout_s);
        if (s != GPC_OK) return gpc_error_context(s, "rank %d: starting NCCL: ", d->rank);
    }

    nccl_state *st = gpc_calloc(1, sizeof *st);
    if (!st) return gpc_error(GPC_ERR_NOMEM, "out of host memory");
    st->backend = backend;
    pthread_mutex_init(&st->lock, NULL);
    d->impl = st;
    d->ops = &nccl_ops;
    if (pthread_create(&st->thread, NULL, watchdog, d) == 0) st->thread_started = 1;
    n_watch(d, 1); /* init waits for every rank: watched too */
    nccl_result r = api.comm_init_rank(&st->comm, d->world_size, id, d->rank);
    n_watch(d, 0);
    if (r != 0) {
        gpc_status s = gpc_error(GPC_ERR_DEVICE, "rank %d: NCCL could not connect the %d ranks: %s",
                                 d->rank, d->world_size, api.error_string(r));
        st->comm = NULL;
        n_destroy(d);
        return s;
    }
    int version = 0;
    api.get_version(&version);
    gpc_log(GPC_LOG_DEBUG, "rank %d of %d: NCCL %d on cuda:%d", d->rank, d->world_size, version,
            d->device.index);
    return GPC_OK;
}
