/*
 * md_split_cuda.h: the GPU side of a `gpc md` run split across processes
 * (md_split.c calls it when the run is on cuda[:N]): one process's slab on
 * its GPU, the steps between neighbour-list builds there.
 *
 * The GPU holds the slab's atoms (positions, velocities, ids) and does each
 * neighbour-list build's work as md_split.c does it on the CPU: it wraps
 * the positions, takes out the atoms that now belong to a neighbour (kept
 * ones stay in order) and appends those that arrive, chooses the atoms each
 * neighbour needs and builds the list. The host only carries what crosses
 * between processes: leavers and arrivals at a build, the positions the
 * neighbours need every step, counts and flags. Each call that returns
 * something waits for it; the others are queued.
 *
 * The list is the host's (md_split.c build_list): full rows in the order
 * of a walk over cells along x over the span of the positions and along y
 * and z over the periodic box, each cell's atoms in ascending index (a
 * candidate within a rounding of cutoff + skin may fall either way, as it
 * adds no force). Forces are float64, summed over each row in order; the
 * pair energy and virial (halves, as on the host) are reduced in float64
 * on the steps that ask for them.
 *
 * Private to the sci layer. Implemented in md_split_cuda.cu when gpc is
 * built with CUDA; otherwise md_split_cuda_stub.c answers every call with
 * GPC_ERR_UNSUPPORTED and the reason.
 */
#ifndef GPC_SCI_MD_SPLIT_CUDA_H
#define GPC_SCI_MD_SPLIT_CUDA_H

#include "gpc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct md_split_cuda md_split_cuda;
struct gpc_dist;

/* How the box is cut: this process's `rank` of `world`, slabs `width`
 * wide along x (rank r owns [r width, (r + 1) width)), the ghosts' reach
 * (cutoff + skin, plus a slack for rounding at the faces). */
typedef struct {
    int rank, world;
    double box, width, reach, slack;
} md_split_cuda_slabs;

/* Checks that GPU `device` exists and has room for a slab of about `atoms`
 * atoms (owned and ghosts) with rows of `row_cap` partners, then opens it.
 * rc2: the squared cutoff; limit2: the squared half skin. */
gpc_status md_split_cuda_create(md_split_cuda **out, int device, const md_split_cuda_slabs *slabs,
                                double atoms, int64_t row_cap, double rc2, double limit2);
void md_split_cuda_free(md_split_cuda *g);

/* Replaces the slab's atoms: positions and velocities [n][3], ids [n]. */
gpc_status md_split_cuda_upload(md_split_cuda *g, int64_t n, const double *x, const double *v,
                                const int64_t *id);

/* A build, first part: wraps the owned positions into the box. *bad: a
 * position was no longer finite; *stray: an atom now belongs to a process
 * that is no neighbour of this one. */
gpc_status md_split_cuda_wrap(md_split_cuda *g, int *bad, int *stray);

/* Takes out the atoms whose slab is now the neighbour's on `side` (0: the
 * right, 1: the left; with two processes both are the right), the others
 * staying in order, and packs them [count][7] (x, v, id) into host memory
 * of its own: *out, valid until the next call. */
gpc_status md_split_cuda_leave(md_split_cuda *g, int side, const double **out, int64_t *count);

/* Appends atoms that arrived ([count][7], as md_split_cuda_leave packs). */
gpc_status md_split_cuda_arrive(md_split_cuda *g, const double *in, int64_t count);

/* Chooses the owned atoms each neighbour needs, those within reach of the
 * face they share, in ascending order: sends[0] go right, sends[1] left. */
gpc_status md_split_cuda_choose(md_split_cuda *g, int64_t sends[2]);

/* The positions of the atoms chosen for each side, shifted across the
 * periodic seam where that neighbour sits on the other side of it, packed
 * into pinned host memory of its own: out[side] ([sends][3]), valid until
 * the next call. */
gpc_status md_split_cuda_pack(md_split_cuda *g, const double *out[2]);
/* Pinned host memory for `values` doubles of ghost positions from the
 * neighbour on `side`, for the host to receive them into before
 * md_split_cuda_ghosts; it waits for that side's last upload. */
gpc_status md_split_cuda_ghost_room(md_split_cuda *g, int side, int64_t values, double **in);
/* Uploads the ghosts received into the side's room (0: the left's, placed
 * after the owned atoms; 1: the right's, after those), queued: with
 * `count` >= 0 a build's (their number changes), with -1 a step's (as
 * many as the build had). */
gpc_status md_split_cuda_ghosts(md_split_cuda *g, int side, int64_t count);
/* The positions each neighbour needs, GPU to GPU over `peers` (NCCL, the
 * same ranks as MPI's): packed for each side as md_split_cuda_pack does,
 * sent to to[side] while the ghosts from from[side] arrive in place, all
 * queued in one group. arriving: a build's new numbers of ghosts from the
 * left and the right (the neighbours' sends, whose counts came over MPI);
 * NULL on a step (as many as the build had). */
gpc_status md_split_cuda_forward_peers(md_split_cuda *g, struct gpc_dist *peers, const int to[2],
                                       const int from[2], const int64_t *arriving);
/* The build's last part: the neighbour list over the owned atoms and the
 * ghosts (rows grow until the longest fits), and the positions the next
 * displacement test starts from. *pairs: the listed partners, summed. */
gpc_status md_split_cuda_list(md_split_cuda *g, int64_t *pairs);

/* Forces on the owned atoms from the current positions, then the half kick
 * v += half_dt f (0: none). With thermo, also this process's halves of the
 * pair energy and virial. */
gpc_status md_split_cuda_forces(md_split_cuda *g, double half_dt, int thermo, double *potential,
                                double *virial);

/* The half kick and drift (v += half_dt f, x += dt v) of every owned atom;
 * moved[0]: an atom is over half the skin from where the last list found
 * it, moved[1]: a position is no longer finite. */
gpc_status md_split_cuda_drift(md_split_cuda *g, double half_dt, double dt, int moved[2]);

/* Sum of v^2 over the owned atoms, in float64. */
gpc_status md_split_cuda_v2(md_split_cuda *g, double *v2);

/* Atoms this process owns now. */
int64_t md_split_cuda_owned(const md_split_cuda *g);

/* The owned atoms' positions and velocities ([owned][3]) and ids; any may
 * be NULL. */
gpc_status md_split_cuda_download(md_split_cuda *g, double *x, double *v, int64_t *id);

/* "NVIDIA H200 (cuda:0)" or the like. */
const char *md_split_cuda_device_name(const md_split_cuda *g);

#ifdef __cplusplus
}
#endif

#endif /* GPC_SCI_MD_SPLIT_CUDA_H */
