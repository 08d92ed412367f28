/*
 * md_split_cuda.h: the GPU side of a `gpc md` run split across processes
 * (md_split.c calls it when the run is on cuda[:N]): one process's slab on
 * its GPU, the steps between neighbour-list builds there.
 *
 * The host keeps what it did on the CPU at each build (wrapping, migrating
 * atoms to their new owners, choosing the ghosts each neighbour needs) and
 * hands the result over with md_split_cuda_build; between builds the GPU
 * steps the owned atoms and packs the positions the neighbours need, and
 * the host only carries those over MPI and the ghosts back. Atoms keep the
 * host's order, so the host's arrays and the GPU's index the same atoms.
 *
 * The list is the host's (md_split.c build_list): full rows in the order
 * of a walk over cells along x over the span of the positions and along y
 * and z over the periodic box, each cell's atoms in ascending index (a
 * candidate within a rounding of cutoff + skin may fall either way, as it
 * adds no force). Forces are float64,
 * summed over each row in order; the pair energy and virial (halves, as on
 * the host) are reduced in float64 on the steps that ask for them.
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

/* What one build hands to the GPU: `owned` atoms then the ghosts in `all`
 * ([owned + ghosts[0] + ghosts[1]][3]: those from the left neighbour, then
 * from the right), the owned atoms' velocities ([owned][3]), and for
 * each side (0: to the right, 1: to the left) the owned atoms whose
 * positions go there every step and the shift along x they take. */
typedef struct {
    int64_t owned, ghosts[2];
    const double *all, *v;
    const int64_t *send[2];
    int64_t sends[2];
    double shift[2];
} md_split_cuda_load;

/* Checks that GPU `device` exists and has room for a slab of about `atoms`
 * atoms (owned and ghosts) with rows of `row_cap` partners, then opens it.
 * `box`: the periodic box's side; rc2 and reach2: the squared cutoff and
 * cutoff + skin; limit2: the squared half skin. */
gpc_status md_split_cuda_create(md_split_cuda **out, int device, double atoms, int64_t row_cap,
                                double box, double rc2, double reach, double limit2);
void md_split_cuda_free(md_split_cuda *g);

/* Uploads a build and builds the neighbour list on the GPU (rows grow until
 * the longest fits). *pairs: the listed partners summed over the rows. */
gpc_status md_split_cuda_build(md_split_cuda *g, const md_split_cuda_load *load, int64_t *pairs);

/* Forces on the owned atoms from the current positions, then the half kick
 * v += half_dt f (0: none). With thermo, also this process's halves of the
 * pair energy and virial (waits for them); else queued. */
gpc_status md_split_cuda_forces(md_split_cuda *g, double half_dt, int thermo, double *potential,
                                double *virial);

/* The half kick and drift (v += half_dt f, x += dt v) of every owned atom,
 * then waits for the flags: moved[0] an atom is over half the skin from
 * where the build found it, moved[1] a position is no longer finite. */
gpc_status md_split_cuda_drift(md_split_cuda *g, double half_dt, double dt, int moved[2]);

/* The positions of the atoms listed for `side` at the last build, shifted,
 * into out ([sends][3]); waits for them. */
gpc_status md_split_cuda_pack(md_split_cuda *g, int side, double *out);

/* The ghosts' new positions from the neighbour on `side` (0: the left's,
 * placed after the owned atoms; 1: the right's, after those), as many as
 * the last build had. */
gpc_status md_split_cuda_ghosts(md_split_cuda *g, int side, const double *in);

/* Sum of v^2 over the owned atoms, in float64. */
gpc_status md_split_cuda_v2(md_split_cuda *g, double *v2);

/* The owned atoms' positions and velocities ([owned][3]; either may be
 * NULL). */
gpc_status md_split_cuda_download(md_split_cuda *g, double *x, double *v);

/* "NVIDIA H200 (cuda:0)" or the like. */
const char *md_split_cuda_device_name(const md_split_cuda *g);

#ifdef __cplusplus
}
#endif

#endif /* GPC_SCI_MD_SPLIT_CUDA_H */
