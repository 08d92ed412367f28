/*
 * gpc dist: collective communication for data-parallel training, and how a
 * process learns its place in a job (bootstrap).
 *
 * One process per device. A process finds its rank, the world size, its rank
 * on the node and where rank 0 listens from the environment, in this order:
 *   gpc launch   GPC_RANK, GPC_WORLD_SIZE, GPC_LOCAL_RANK, GPC_MASTER_ADDR/PORT
 *   mpirun       OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
 *   srun         SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, the first node of
 *                SLURM_JOB_NODELIST (only inside a job step: SLURM_STEP_ID set)
 * and otherwise runs alone (world size 1).
 *
 * The collectives are a struct of function pointers, like the device backend:
 *   none  world size 1: every collective is the identity
 *   mpi   CPU tensors over MPI (built when MPI is found; the processes are
 *         started by mpirun), so the data-parallel logic runs in CI
 *   nccl  GPU tensors over NCCL, loaded with dlopen("libnccl.so.2") at run
 *         time (the build needs no NCCL headers; the binary runs without
 *         NCCL until a multi-GPU job asks for it). Rank 0 makes the NCCL id;
 *         it reaches the others over MPI (under mpirun) or a small TCP
 *         rendezvous at MASTER_ADDR:PORT.
 * Device collectives are queued on a stream (NULL: the default stream) and
 * return before they finish, as the device's other work does; on the CPU
 * they are done when they return.
 */
#ifndef GPC_DIST_H
#define GPC_DIST_H

#include "gpc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ bootstrap */

typedef struct {
    int rank, world_size;
    int local_rank, local_world_size;
    char master_addr[256]; /* "" when the source gives none */
    int master_port;       /* 0 when unknown */
    const char *source;    /* "gpc launch", "mpirun", "slurm" or "none" */
} gpc_dist_env;

/* Reads the variables above through get (getenv-like; user passed along), so
 * tests can feed a table. Inconsistent values (rank outside the world, a
 * non-number) are an error that names the variable. */
typedef const char *(*gpc_env_getter)(const char *name, void *user);
gpc_status gpc_dist_env_parse(gpc_env_getter get, void *user, gpc_dist_env *out);
/* The same, from this process's environment. */
gpc_status gpc_dist_env_from_process(gpc_dist_env *out);
/* The first host of a Slurm node list: "gpu[03-05,9],cpu1" gives "gpu03". */
gpc_status gpc_slurm_first_node(const char *nodelist, char *out, size_t size);

/* Rank 0 hands `bytes` of data to every other rank over TCP: it listens on
 * port (all addresses), the others connect to addr:port. Everyone gives up
 * with a clear message after timeout_s seconds. Used for the NCCL id. */
gpc_status gpc_dist_rendezvous(const char *addr, int port, int rank, int world_size, void *data,
                               size_t bytes, double timeout_s);

/* ---------------------------------------------------------- collectives */

typedef struct gpc_dist gpc_dist;

typedef struct {
    const char *name;
    /* buf += the same buffer of every rank (in place); f32 or bf16 */
    gpc_status (*all_reduce_sum)(gpc_dist *d, void *buf, size_t count, gpc_dtype dtype,
                                 gpc_stream stream);
    /* root's buf receives the sum; other ranks' buffers are left as they were */
    gpc_status (*reduce_sum)(gpc_dist *d, void *buf, size_t count, gpc_dtype dtype, int root,
                             gpc_stream stream);
    /* offsets[0..world]: rank r's segment [offsets[r], offsets[r+1]) of buf
     * receives the sum of that segment over all ranks (in place) */
    gpc_status (*reduce_scatter_sum)(gpc_dist *d, void *buf, const size_t *offsets, gpc_dtype dtype,
                                     gpc_stream stream);
    /* every rank's buf receives each rank's own segment (in place) */
    gpc_status (*all_gather)(gpc_dist *d, void *buf, const size_t *offsets, gpc_dtype dtype,
                             gpc_stream stream);
    gpc_status (*broadcast)(gpc_dist *d, void *buf, size_t count, gpc_dtype dtype, int root,
                            gpc_stream stream);
    /* Collectives between start and end are launched together (NCCL groups). */
    gpc_status (*group_start)(gpc_dist *d);
    gpc_status (*group_end)(gpc_dist *d);
    /* Sum of host doubles over the ranks; waits for the device's queued work
     * and the result. For losses and flags once per step. */
    gpc_status (*all_reduce_host)(gpc_dist *d, double *values, int n);
    gpc_status (*barrier)(gpc_dist *d);
    /* A step of collectives begins or ends: the NCCL watchdog aborts the
     * communicator when one step takes longer than the timeout. */
    void (*watch)(gpc_dist *d, int active);
    void (*destroy)(gpc_dist *d);
    /* child (allocated, its rank and world_size set by gpc_dist_split)
     * becomes the communicator of the ranks that gave the same color,
     * ordered by key; every rank of d calls it together */
    gpc_status (*split)(gpc_dist *d, int color, int key, gpc_dist *child);
    /* point to point: count elements to or from rank peer of d (pipeline
     * stages' activations); both sides queue on their stream */
    gpc_status (*send)(gpc_dist *d, const void *buf, size_t count, gpc_dtype dtype, int peer,
                       gpc_stream stream);
    gpc_status (*recv)(gpc_dist *d, void *buf, size_t count, gpc_dtype dtype, int peer,
                       gpc_stream stream);
    /* buf = the elementwise max of the same buffer over the ranks (in
     * place); f32. The vocabulary-parallel cross-entropy's row maxima. */
    gpc_status (*all_reduce_max)(gpc_dist *d, void *buf, size_t count, gpc_dtype dtype,
                                 gpc_stream stream);
} gpc_dist_ops;

struct gpc_dist {
    const gpc_dist_ops *ops;
    int rank, world_size, local_rank;
    gpc_device device;
    double timeout_s; /* GPC_DIST_TIMEOUT, default 300 */
    void *impl;
};

/* backend: "auto" (none for world 1, mpi for the CPU, nccl for GPUs), "none",
 * "mpi" or "nccl". */
gpc_status gpc_dist_create(gpc_dist **out, const gpc_dist_env *env, gpc_device device,
                           const char *backend);
void gpc_dist_destroy(gpc_dist *d);
/* The sub-communicator of the ranks of d that give the same color, ranked
 * by key (MPI_Comm_split; ncclCommSplit): how tensor-, pipeline- and
 * data-parallel groups are made from one world. Every rank of d calls it;
 * free the result with gpc_dist_destroy before d. */
gpc_status gpc_dist_split(gpc_dist *d, int color, int key, gpc_dist **out);

/* A job's ranks as a grid world = dp x pp x tp, tp fastest: rank =
 * (dp_rank * pp + pp_rank) * tp + tp_rank, so a tensor-parallel group is
 * tp consecutive ranks (one node's GPUs when tp divides them), and a
 * data-parallel group holds one rank of each (pp_rank, tp_rank) place. */
typedef struct {
    int tp, pp, dp;
    int tp_rank, pp_rank, dp_rank;
} gpc_dist_layout;
/* Checks that tp x pp divides the world and fills the grid for rank. */
gpc_status gpc_dist_layout_make(int world_size, int rank, int tp, int pp, gpc_dist_layout *out);

/* Implementations (dist_none.c, dist_mpi.c, dist_nccl.c); d is filled in by
 * gpc_dist_create except ops and impl. */
gpc_status gpc_dist_none_init(gpc_dist *d);
gpc_status gpc_dist_mpi_init(gpc_dist *d, const gpc_dist_env *env);
gpc_status gpc_dist_nccl_init(gpc_dist *d, const gpc_dist_env *env);
/* Whether this build has the MPI backend. */
int gpc_dist_have_mpi(void);
/* GPC_OK when NCCL loads (libnccl.so.2); else why not. Lets a process ask
 * before a collective gpc_dist_create(..., "nccl") that every rank must
 * reach. */
gpc_status gpc_dist_nccl_available(void);
/* MPI_Bcast of host bytes from rank 0 (the NCCL id under mpirun). */
gpc_status gpc_dist_mpi_bcast_bytes(void *data, size_t bytes);

/* Equal shards of n elements over world ranks (the last may be shorter or
 * empty), each but the last a multiple of align elements: offsets[0..world]. */
void gpc_dist_shard_offsets(size_t n, int world, size_t align, size_t *offsets);

#ifdef __cplusplus
}
#endif

#endif /* GPC_DIST_H */
