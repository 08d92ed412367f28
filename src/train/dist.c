/*
 * dist.c: where a process stands in a data-parallel job (environment from
 * gpc launch, mpirun or srun), the TCP rendezvous that hands rank 0's NCCL id
 * to the others, choosing a collective backend, and the "none" backend of a
 * one-process world.
 */
#define _GNU_SOURCE
#include "gpc/dist.h"
#include "gpc/settings.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ------------------------------------------------------------ bootstrap */

/* Parses a non-negative integer variable; absent leaves *out. */
static gpc_status env_int(gpc_env_getter get, void *user, const char *name, int *out,
                          int *present) {
    const char *v = get(name, user);
    if (present) *present = v && *v;
    if (!v || !*v) return GPC_OK;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < 0 || x > 1 << 24)
        return gpc_error(GPC_ERR_INVALID_ARG, "%s=%s is not a non-negative number", name, v);
    *out = (int)x;
    return GPC_OK;
}

static void env_str(gpc_env_getter get, void *user, const char *name, char *out, size_t size) {
    const char *v = get(name, user);
    if (v && *v) snprintf(out, size, "%s", v);
}

gpc_status gpc_slurm_first_node(const char *list, char *out, size_t size) {
    if (!list || !*list)
        return gpc_error(GPC_ERR_INVALID_ARG, "the Slurm node list is empty (SLURM_JOB_NODELIST)");
    size_t n = 0;
    int depth = 0, taking = 1;
    for (const char *p = list; *p; p++) {
        char c = *p;
        if (c == '[') {
            depth++;
            taking = 1;
            continue;
        }
        if (c == ']') {
            if (depth == 0) break;
            depth--;
            taking = 1;
            continue;
        }
        if (depth == 0 && c == ',') break; /* the first host ends here */
        /* inside brackets: the first number of the first range only */
        if (depth > 0 && (c == '-' || c == ',')) taking = 0;
        if (!taking) continue;
        if (n + 1 >= size) return gpc_error(GPC_ERR_INVALID_ARG, "Slurm node name too long");
        out[n++] = c;
    }
    out[n] = '\0';
    if (depth != 0 || n == 0)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "cannot read the first node of the Slurm node list '%s'", list);
    return GPC_OK;
}

gpc_status gpc_dist_env_parse(gpc_env_getter get, void *user, gpc_dist_env *e) {
    memset(e, 0, sizeof *e);
    e->world_size = 1;
    e->local_world_size = 1;
    e->source = "none";
    int has_rank = 0, has_size = 0;
    const char *rank_var, *size_var;
    GPC_TRY(env_int(get, user, "GPC_RANK", &e->rank, &has_rank));
    if (has_rank) {
        e->source = "gpc launch";
        rank_var = "GPC_RANK";
        size_var = "GPC_WORLD_SIZE";
        GPC_TRY(env_int(get, user, size_var, &e->world_size, &has_size));
        GPC_TRY(env_int(get, user, "GPC_LOCAL_RANK", &e->local_rank, NULL));
        GPC_TRY(env_int(get, user, "GPC_LOCAL_WORLD_SIZE", &e->local_world_size, NULL));
        env_str(get, user, "GPC_MASTER_ADDR", e->master_addr, sizeof e->master_addr);
        GPC_TRY(env_int(get, user, "GPC_MASTER_PORT", &e->master_port, NULL));
    } else if (get("OMPI_COMM_WORLD_RANK", user)) {
        e->source = "mpirun";
        rank_var = "OMPI_COMM_WORLD_RANK";
        size_var = "OMPI_COMM_WORLD_SIZE";
        GPC_TRY(env_int(get, user, rank_var, &e->rank, &has_rank));
        GPC_TRY(env_int(get, user, size_var, &e->world_size, &has_size));
        GPC_TRY(env_int(get, user, "OMPI_COMM_WORLD_LOCAL_RANK", &e->local_rank, NULL));
        GPC_TRY(env_int(get, user, "OMPI_COMM_WORLD_LOCAL_SIZE", &e->local_world_size, NULL));
        env_str(get, user, "GPC_MASTER_ADDR", e->master_addr, sizeof e->master_addr);
        GPC_TRY(env_int(get, user, "GPC_MASTER_PORT", &e->master_port, NULL));
    } else if (get("SLURM_PROCID", user) &&
               (get("SLURM_STEP_ID", user) || get("SLURM_STEPID", user))) {
        /* a task of an srun step; a batch script alone also has SLURM_PROCID
         * but is one process, so the step id must be there too */
        e->source = "slurm";
        rank_var = "SLURM_PROCID";
        size_var = "SLURM_NTASKS";
        GPC_TRY(env_int(get, user, rank_var, &e->rank, &has_rank));
        GPC_TRY(env_int(get, user, size_var, &e->world_size, &has_size));
        GPC_TRY(env_int(get, user, "SLURM_LOCALID", &e->local_rank, NULL));
        const char *nodes = get("SLURM_STEP_NODELIST", user);
        if (!nodes) nodes = get("SLURM_JOB_NODELIST", user);
        if (e->world_size > 1) {
            if (!nodes)
                return gpc_error(GPC_ERR_INVALID_ARG,
                                 "SLURM_JOB_NODELIST is not set: cannot find the first node of "
                                 "the job; set GPC_MASTER_ADDR");
            GPC_TRY(gpc_slurm_first_node(nodes, e->master_addr, sizeof e->master_addr));
        }
        env_str(get, user, "GPC_MASTER_ADDR", e->master_addr, sizeof e->master_addr);
        int job = 0;
        GPC_TRY(env_int(get, user, "SLURM_JOB_ID", &job, NULL));
        e->master_port = 20000 + job % 20000; /* one port per job, same on every task */
        GPC_TRY(env_int(get, user, "GPC_MASTER_PORT", &e->master_port, NULL));
    } else {
        return GPC_OK;
    }
    if (!has_size)
        return gpc_error(GPC_ERR_INVALID_ARG, "%s is set but %s is not: cannot tell the world size",
                         rank_var, size_var);
    if (e->world_size < 1 || e->rank >= e->world_size)
        return gpc_error(GPC_ERR_INVALID_ARG, "%s=%d is outside the world of %s=%d processes",
                         rank_var, e->rank, size_var, e->world_size);
    if (e->local_world_size < 1) e->local_world_size = 1;
    if (e->master_port > 65535)
        return gpc_error(GPC_ERR_INVALID_ARG, "master port %d is not a TCP port (1..65535)",
                         e->master_port);
    return GPC_OK;
}

static const char *process_getenv(const char *name, void *user) {
    (void)user;
    /* gpc's own through the table of settings; SLURM_*, OMPI_* as they are */
    return strncmp(name, "GPC_", 4) == 0 ? gpc_setting_given(name) : getenv(name);
}

gpc_status gpc_dist_env_from_process(gpc_dist_env *out) {
    return gpc_dist_env_parse(process_getenv, NULL, out);
}

/* ------------------------------------------------------------ rendezvous */

static gpc_status send_all(int fd, const void *data, size_t bytes) {
    const char *p = data;
    while (bytes) {
        ssize_t n = send(fd, p, bytes, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return gpc_error(GPC_ERR_IO, "rendezvous: send failed: %s", strerror(errno));
        p += n;
        bytes -= (size_t)n;
    }
    return GPC_OK;
}

static gpc_status recv_all(int fd, void *data, size_t bytes, double deadline) {
    char *p = data;
    while (bytes) {
        int left_ms = (int)((deadline - gpc_time_seconds()) * 1e3);
        if (left_ms <= 0) return gpc_error(GPC_ERR_IO, "rendezvous: timed out reading");
        struct pollfd pfd = {fd, POLLIN, 0};
        int r = poll(&pfd, 1, left_ms);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;
        ssize_t n = recv(fd, p, bytes, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return gpc_error(GPC_ERR_IO, "rendezvous: the peer closed the connection");
        p += n;
        bytes -= (size_t)n;
    }
    return GPC_OK;
}

#define RENDEZVOUS_MAGIC 0x67706372u /* "gpcr" */

static gpc_status rendezvous_serve(int port, int world, const void *data, size_t bytes,
                                   double deadline) {
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    int v6 = fd >= 0;
    if (!v6) fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return gpc_error(GPC_ERR_IO, "rendezvous: socket: %s", strerror(errno));
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc;
    if (v6) {
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero); /* v4 too */
        struct sockaddr_in6 a;
        memset(&a, 0, sizeof a);
        a.sin6_family = AF_INET6;
        a.sin6_addr = in6addr_any;
        a.sin6_port = htons((uint16_t)port);
        rc = bind(fd, (struct sockaddr *)&a, sizeof a);
    } else {
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        a.sin_port = htons((uint16_t)port);
        rc = bind(fd, (struct sockaddr *)&a, sizeof a);
    }
    if (rc != 0 || listen(fd, 128) != 0) {
        gpc_status s = gpc_error(GPC_ERR_IO,
                                 "rank 0 cannot listen on port %d: %s (choose another with "
                                 "--master ADDR:PORT or GPC_MASTER_PORT)",
                                 port, strerror(errno));
        close(fd);
        return s;
    }
    gpc_status s = GPC_OK;
    for (int joined = 1; joined < world && s == GPC_OK;) {
        int left_ms = (int)((deadline - gpc_time_seconds()) * 1e3);
        if (left_ms <= 0) {
            s = gpc_error(GPC_ERR_IO,
                          "rendezvous: only %d of %d ranks reached rank 0 on port %d in time; "
                          "check that every rank started and uses the same master address",
                          joined, world, port);
            break;
        }
        struct pollfd pfd = {fd, POLLIN, 0};
        if (poll(&pfd, 1, left_ms) <= 0) continue;
        int c = accept(fd, NULL, NULL);
        if (c < 0) continue;
        uint32_t hello[2];
        if (recv_all(c, hello, sizeof hello, deadline) == GPC_OK && hello[0] == RENDEZVOUS_MAGIC) {
            uint64_t n = bytes;
            s = send_all(c, &n, sizeof n);
            if (s == GPC_OK) s = send_all(c, data, bytes);
            joined++;
        }
        close(c);
    }
    close(fd);
    return s;
}

static gpc_status rendezvous_join(const char *addr, int port, int rank, void *data, size_t bytes,
                                  double deadline) {
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(addr, service, &hints, &res);
    if (gai != 0)
        return gpc_error(GPC_ERR_IO, "rendezvous: cannot resolve the master address '%s': %s", addr,
                         gai_strerror(gai));
    gpc_status s = GPC_ERR_IO;
    /* rank 0 may not listen yet: try again until the deadline */
    while (gpc_time_seconds() < deadline) {
        for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
            int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
            if (fd < 0) continue;
            if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
                uint32_t hello[2] = {RENDEZVOUS_MAGIC, (uint32_t)rank};
                uint64_t n = 0;
                s = send_all(fd, hello, sizeof hello);
                if (s == GPC_OK) s = recv_all(fd, &n, sizeof n, deadline);
                if (s == GPC_OK && n != bytes)
                    s = gpc_error(GPC_ERR_MISMATCH,
                                  "rendezvous: rank 0 sent %llu bytes, expected %zu (different "
                                  "gpc versions?)",
                                  (unsigned long long)n, bytes);
                if (s == GPC_OK) s = recv_all(fd, data, bytes, deadline);
                close(fd);
                freeaddrinfo(res);
                return s;
            }
            close(fd);
        }
        usleep(50000);
    }
    freeaddrinfo(res);
    return gpc_error(GPC_ERR_IO,
                     "rendezvous: rank %d could not reach rank 0 at %s:%d in time; check that "
                     "rank 0 started and the address and port are right",
                     rank, addr, port);
}

gpc_status gpc_dist_rendezvous(const char *addr, int port, int rank, int world, void *data,
                               size_t bytes, double timeout_s) {
    if (world <= 1) return GPC_OK;
    if (port <= 0 || port > 65535 || (rank > 0 && (!addr || !*addr)))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "rendezvous needs the master's address and port (GPC_MASTER_ADDR and "
                         "GPC_MASTER_PORT; gpc launch sets them)");
    double deadline = gpc_time_seconds() + timeout_s;
    if (rank == 0) return rendezvous_serve(port, world, data, bytes, deadline);
    return rendezvous_join(addr, port, rank, data, bytes, deadline);
}

/* ------------------------------------------------------------ none */

static gpc_status none_ok(gpc_dist *d) {
    (void)d;
    return GPC_OK;
}
static gpc_status none_buf(gpc_dist *d, void *b, size_t n, gpc_dtype t, gpc_stream s) {
    (void)d, (void)b, (void)n, (void)t, (void)s;
    return GPC_OK;
}
static gpc_status none_root(gpc_dist *d, void *b, size_t n, gpc_dtype t, int r, gpc_stream s) {
    (void)d, (void)b, (void)n, (void)t, (void)r, (void)s;
    return GPC_OK;
}
static gpc_status none_seg(gpc_dist *d, void *b, const size_t *o, gpc_dtype t, gpc_stream s) {
    (void)d, (void)b, (void)o, (void)t, (void)s;
    return GPC_OK;
}
static gpc_status none_host(gpc_dist *d, double *v, int n) {
    (void)d, (void)v, (void)n;
    return GPC_OK;
}
static void none_watch(gpc_dist *d, int active) {
    (void)d, (void)active;
}
static void none_destroy(gpc_dist *d) {
    (void)d;
}

static gpc_status none_split(gpc_dist *d, int color, int key, gpc_dist *child) {
    (void)d, (void)color, (void)key;
    child->ops = d->ops;
    return GPC_OK;
}
static gpc_status none_send(gpc_dist *d, const void *b, size_t n, gpc_dtype t, int p,
                            gpc_stream s) {
    (void)d, (void)b, (void)n, (void)t, (void)p, (void)s;
    return gpc_error(GPC_ERR_INVALID_ARG, "a send needs a peer: this job has one process");
}
static gpc_status none_recv(gpc_dist *d, void *b, size_t n, gpc_dtype t, int p, gpc_stream s) {
    return none_send(d, b, n, t, p, s);
}

static const gpc_dist_ops none_ops = {
    "none",    none_buf, none_root,  none_seg,     none_seg,   none_root, none_ok,   none_ok,
    none_host, none_ok,  none_watch, none_destroy, none_split, none_send, none_recv, none_buf};

gpc_status gpc_dist_none_init(gpc_dist *d) {
    if (d->world_size != 1)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "the 'none' collectives serve one process, not %d; use mpi or nccl",
                         d->world_size);
    d->ops = &none_ops;
    return GPC_OK;
}

/* ------------------------------------------------------------ create */

gpc_status gpc_dist_create(gpc_dist **out, const gpc_dist_env *env, gpc_device device,
                           const char *backend) {
    *out = NULL;
    if (!backend || !*backend) backend = "auto";
    const char *pick = backend;
    if (strcmp(backend, "auto") == 0)
        pick = env->world_size == 1 ? "none" : device.type == GPC_DEVICE_CPU ? "mpi" : "nccl";
    gpc_dist *d = gpc_calloc(1, sizeof *d);
    if (!d) return gpc_error(GPC_ERR_NOMEM, "out of host memory");
    d->rank = env->rank;
    d->world_size = env->world_size;
    d->local_rank = env->local_rank;
    d->device = device;
    d->timeout_s = gpc_setting_double("GPC_DIST_TIMEOUT");
    gpc_status s;
    if (strcmp(pick, "none") == 0) {
        s = gpc_dist_none_init(d);
    } else if (strcmp(pick, "mpi") == 0) {
        if (device.type != GPC_DEVICE_CPU)
            s = gpc_error(GPC_ERR_UNSUPPORTED,
                          "the mpi collectives move CPU tensors; for GPUs use nccl");
        else
            s = gpc_dist_mpi_init(d, env);
    } else if (strcmp(pick, "nccl") == 0) {
        if (device.type != GPC_DEVICE_CUDA)
            s = gpc_error(GPC_ERR_UNSUPPORTED,
                          "nccl moves GPU tensors; %d CPU processes need the mpi collectives "
                          "(start them with mpirun -np %d gpc train ...)",
                          env->world_size, env->world_size);
        else
            s = gpc_dist_nccl_init(d, env);
    } else {
        s = gpc_error(GPC_ERR_INVALID_ARG,
                      "unknown collective backend '%s'; use auto, none, mpi or nccl", backend);
    }
    if (s != GPC_OK) {
        gpc_free(d);
        return s;
    }
    *out = d;
    return GPC_OK;
}

void gpc_dist_destroy(gpc_dist *d) {
    if (!d) return;
    if (d->ops && d->ops->destroy) d->ops->destroy(d);
    gpc_free(d);
}

gpc_status gpc_dist_split(gpc_dist *d, int color, int key, gpc_dist **out) {
    *out = NULL;
    if (!d->ops->split)
        return gpc_error(GPC_ERR_UNSUPPORTED, "the %s collectives cannot make sub-groups",
                         d->ops->name);
    gpc_dist *child = gpc_calloc(1, sizeof *child);
    if (!child) return gpc_error(GPC_ERR_NOMEM, "out of host memory");
    child->device = d->device;
    child->local_rank = d->local_rank;
    child->timeout_s = d->timeout_s;
    child->rank = 0;
    child->world_size = 1;
    gpc_status s = d->ops->split(d, color, key, child);
    if (s != GPC_OK) {
        gpc_free(child);
        return gpc_error_context(s, "rank %d: making a group of ranks: ", d->rank);
    }
    *out = child;
    return GPC_OK;
}

gpc_status gpc_dist_layout_make(int world, int rank, int tp, int pp, gpc_dist_layout *out) {
    memset(out, 0, sizeof *out);
    if (tp < 1 || pp < 1)
        return gpc_error(GPC_ERR_INVALID_ARG, "--tp %d and --pp %d must be 1 or more", tp, pp);
    if (world % (tp * pp) != 0)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%d processes are not a multiple of --tp %d x --pp %d = %d: start a "
                         "multiple of %d processes, or change --tp/--pp",
                         world, tp, pp, tp * pp, tp * pp);
    out->tp = tp;
    out->pp = pp;
    out->dp = world / (tp * pp);
    out->tp_rank = rank % tp;
    out->pp_rank = rank / tp % pp;
    out->dp_rank = rank / (tp * pp);
    return GPC_OK;
}

void gpc_dist_shard_offsets(size_t n, int world, size_t align, size_t *offsets) {
    if (align < 1) align = 1;
    size_t chunk = (n + (size_t)world - 1) / (size_t)world;
    chunk = (chunk + align - 1) / align * align;
    for (int r = 0; r <= world; r++) {
        size_t o = (size_t)r * chunk;
        offsets[r] = o < n ? o : n;
    }
}
