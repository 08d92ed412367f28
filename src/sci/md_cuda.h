/*
 * md_cuda.h: the GPU side of `gpc md` (md.c calls it for a run on
 * cuda[:N]): atoms, neighbour lists, forces and thermo reductions held on
 * one GPU, the whole time step queued there without a host round trip.
 *
 * Private to the sci layer. Implemented in md_cuda.cu when gpc is built
 * with CUDA; otherwise md_cuda_stub.c answers every call with
 * GPC_ERR_UNSUPPORTED and "this gpc was built without CUDA".
 *
 * Positions, velocities and forces are float64 (pair forces float32 with
 * forces_f32); energies and virial are reduced in float64.
 *
 * Atoms are held in the order of the last neighbour-list build (sorted by
 * cell), as the CPU's are; the host mirrors of md.c are copied from and to
 * that order.
 */
#ifndef GPC_SCI_MD_CUDA_H
#define GPC_SCI_MD_CUDA_H

#include "gpc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpc_md_cuda gpc_md_cuda;

typedef struct {
    int64_t atoms;
    double box, cutoff, skin, dt;
    int cells_per_side; /* of the cell grid, cells at least cutoff + skin wide */
    int row_capacity;   /* neighbour slots per atom (a full list: both halves of a pair) */
    int rebuild_every;  /* 0: when an atom moved over half the skin */
    int forces_f32;     /* pair forces in float32 (1) or float64 (0) */
    int lanes;          /* threads per atom in the force kernel: 1, 2, 4 or 8; 0: 4 */
    int build_f64;      /* the build tests each candidate in float64, not in float32 first */
    int fused_step;     /* the force kernel ends each step and begins the next (kicks, drift) */
    int unroll; /* partners (forces), candidates (the build) loaded together: 1, 2, 4, 8; 0: 1 */
    int build_per_atom; /* the list built by a thread per atom (md_build), not a warp per cell */
} gpc_md_cuda_config;

/* The sums of the last step whose thermo was computed (the step a create,
 * compute or run ended on): the pair energy and virial sum r . f over every
 * pair once, sum of v^2 over the atoms, all accumulated in float64. After a
 * run the energy and virial are computed at the first call (a kernel over
 * the pairs, then a wait): a run whose rows are not printed skips them. On
 * failure (a device error, or an energy no longer finite: the blow-up
 * message) the sums are NaN. */
typedef struct {
    double potential, virial, v2;
} gpc_md_cuda_sums;

/* Bytes of GPU memory a run of this shape takes. */
double gpc_md_cuda_bytes(const gpc_md_cuda_config *config);

/* Checks that GPU `device` exists and has about gpc_md_cuda_bytes free, so a
 * run too large is refused before the host allocates anything. */
gpc_status gpc_md_cuda_check(int device, const gpc_md_cuda_config *config);

/* Allocates the run on GPU `device`, uploads positions, velocities and ids
 * ([atoms][3] float64 and [atoms]), sorts the atoms by cell, builds the
 * neighbour list and computes forces and the thermo sums. */
gpc_status gpc_md_cuda_create(gpc_md_cuda **out, int device, const gpc_md_cuda_config *config,
                              const double *x, const double *v, const int64_t *id);
void gpc_md_cuda_free(gpc_md_cuda *gpu);

/* Advances `steps` velocity-Verlet steps, `first_step` being the number of
 * the step before the first (for the blow-up message). Reads back a few
 * flags once at the end: a run whose positions or energy stop being finite
 * fails with GPC_ERR_INVALID_ARG, a neighbour row that overflowed with
 * GPC_ERR_INTERNAL. */
gpc_status gpc_md_cuda_run(gpc_md_cuda *gpu, int steps, int64_t first_step);

/* Uploads positions and velocities (either may be NULL: left as they are),
 * rebuilds the neighbour list and recomputes forces and thermo sums. */
gpc_status gpc_md_cuda_compute(gpc_md_cuda *gpu, const double *x, const double *v);

gpc_status gpc_md_cuda_sums_get(gpc_md_cuda *gpu, gpc_md_cuda_sums *out);

/* Copies the state to the host in the GPU's order; any pointer may be NULL.
 * x, v, f: [atoms][3] float64; id: [atoms]. */
gpc_status gpc_md_cuda_download(gpc_md_cuda *gpu, double *x, double *v, double *f, int64_t *id);

/* The neighbour list of the last build: counts [atoms] and rows
 * [atoms][row_capacity] (row i's first counts[i] entries are its partners,
 * both halves of each pair, in the GPU's order of atoms). For tests. */
gpc_status gpc_md_cuda_neighbors(gpc_md_cuda *gpu, int32_t *counts, int32_t *rows);

/* Neighbour-list builds so far, and those of them (with rebuild_every N)
 * that came after an atom had moved over half the skin. */
int64_t gpc_md_cuda_builds(const gpc_md_cuda *gpu);
int64_t gpc_md_cuda_dangerous(const gpc_md_cuda *gpu);
/* Listed pairs (each pair once) in the current list: summed on the GPU. */
int64_t gpc_md_cuda_pairs(gpc_md_cuda *gpu);
/* With GPC_MD_PHASES=1 (read at create): the GPU time in milliseconds of
 * each phase (gpc/md.h's GPC_MD_PHASE_*) over every run so far, from CUDA
 * events recorded between the phases' kernels; returns 1. Else 0, ms left
 * as it is. */
int gpc_md_cuda_phase_ms(const gpc_md_cuda *gpu, double *ms);
/* "NVIDIA H200 (cuda:0)" or the like, for the run's header. */
const char *gpc_md_cuda_device_name(const gpc_md_cuda *gpu);

#ifdef __cplusplus
}
#endif

#endif /* GPC_SCI_MD_CUDA_H */
