/*
 * md.h: Lennard-Jones molecular dynamics on the CPU or one GPU.
 *
 * Reduced units (epsilon = sigma = mass = Boltzmann's constant = 1), the
 * pair potential 4 (r^-12 - r^-6) cut at `cutoff` without shifting (what
 * LAMMPS calls lj/cut), atoms on an fcc lattice in a periodic cube, velocity
 * Verlet at constant energy (NVE). Pairs come from a half neighbour list
 * (each pair once, Newton's third law) built from a grid of cells of at
 * least cutoff + skin, rebuilt when an atom has moved more than half the
 * skin since the last build (or every N steps, as LAMMPS's benchmark does).
 * The defaults are LAMMPS's `in.lj` melt benchmark: 32,000 atoms at density
 * 0.8442, temperature 3.0, cutoff 2.5, skin 0.3, time step 0.005.
 *
 * On a GPU (config.device cuda:N) the whole step runs there, over a full
 * neighbour list, in float64 (pair forces in float32 on request), energies
 * and virial reduced in float64 (sci/md_cuda.cu). The accessors below then
 * copy the state back to host arrays on each call.
 *
 * Thermodynamic output follows LAMMPS's conventions, so the two can be read
 * side by side: energies per atom, temperature over 3N - 3 degrees of
 * freedom (total momentum is zero), pressure from the kinetic part and the
 * pair virial.
 */
#ifndef GPC_MD_H
#define GPC_MD_H

#include "gpc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int cells;             /* fcc unit cells along each side: 4 cells^3 atoms */
    double density;        /* atoms per unit volume */
    double temperature;    /* initial temperature */
    double cutoff;         /* pair cutoff */
    double skin;           /* neighbour-list margin beyond the cutoff */
    double dt;             /* time step */
    uint64_t seed;         /* initial velocities */
    int rebuild_every;     /* 0: rebuild when an atom moved over skin/2; N: every N steps */
    gpc_device device;     /* the CPU (OpenMP threads) or a GPU */
    int gpu_forces_f32;    /* on a GPU: pair forces in float32, not float64 */
    int gpu_lanes;         /* on a GPU: threads per atom in the force kernel, 1, 2, 4 or 8; 0: 4 */
    int gpu_build_f64;     /* on a GPU: the list build tests every candidate in float64, not
                              in float32 first */
    int gpu_step_fused;    /* on a GPU: the force kernel ends each step and begins the next
                              (the half kicks and the drift); gpc_md_defaults: 1 unless
                              GPC_MD_STEP is split */
    int gpu_unroll;        /* on a GPU: partners (forces) and candidates (the list build)
                              whose loads issue together, 1, 2, 4 or 8 (0: 1);
                              gpc_md_defaults: GPC_MD_UNROLL */
    int gpu_list_per_atom; /* on a GPU: the neighbour list built by a thread per atom, not a
                              warp per cell (the same rows); gpc_md_defaults: 1 when
                              GPC_MD_LIST is atoms */
    /* Split across processes on GPUs (gpc_md_create_split): the same
     * processes over NCCL (gpc_dist_create with "nccl"), each on a GPU of
     * its own, for the ghosts' positions to go from GPU to GPU each step.
     * NULL: through host buffers and MPI. Not owned. */
    struct gpc_dist *gpu_dist;
} gpc_md_config;

/* LAMMPS's in.lj: 20 cells (32,000 atoms), 0.8442, 3.0, 2.5, 0.3, 0.005;
 * on the CPU. */
void gpc_md_defaults(gpc_md_config *config);

typedef struct {
    int64_t step;
    double temperature;
    double potential; /* pair energy per atom */
    double kinetic;   /* per atom */
    double total;     /* per atom */
    double pressure;
} gpc_md_thermo;

typedef struct gpc_md gpc_md;

/* Places the atoms, draws velocities (uniform, total momentum removed,
 * scaled to the temperature exactly) and computes the first forces. Errors,
 * all found before anything is allocated: a value out of range, a box not
 * more than twice cutoff + skin wide (the nearest image would be
 * ambiguous), more atoms than the host's (or the GPU's) free memory holds,
 * a GPU that does not exist or a build without CUDA. */
gpc_status gpc_md_create(gpc_md **out, const gpc_md_config *config);
void gpc_md_free(gpc_md *md);

/* Advances `steps` time steps. A run whose energy stops being finite (a time
 * step too long for the temperature) fails with GPC_ERR_INVALID_ARG. On a
 * GPU the steps are queued and waited for once, at the end. */
gpc_status gpc_md_run(gpc_md *md, int steps);

/* Recomputes forces, energy and virial at the current positions, rebuilding
 * the neighbour list first (after positions were changed from outside). */
gpc_status gpc_md_compute(gpc_md *md);

void gpc_md_get_thermo(const gpc_md *md, gpc_md_thermo *out);

int64_t gpc_md_atoms(const gpc_md *md);
double gpc_md_box(const gpc_md *md); /* side of the cube */
/* Atoms are sorted by cell at each neighbour-list build, so an atom's row
 * changes: gpc_md_ids gives each row's atom (its place in the lattice order
 * of creation). Positions are wrapped into the box at each build. */
/* On a GPU: copied back from it at each call (NULL if that fails, with the
 * reason in gpc_last_error()); what is written into positions or
 * velocities goes back to the GPU at the next gpc_md_compute. */
double *gpc_md_positions(gpc_md *md);  /* [atoms][3], writable */
double *gpc_md_velocities(gpc_md *md); /* [atoms][3], writable */
const double *gpc_md_forces(const gpc_md *md);
const int64_t *gpc_md_ids(const gpc_md *md);
int64_t gpc_md_neighbor_builds(const gpc_md *md);
/* With rebuild_every N: the rebuilds at which an atom had moved more than
 * half the skin since the one before, so pairs may have been missed. */
int64_t gpc_md_dangerous_builds(const gpc_md *md);
int64_t gpc_md_pairs(const gpc_md *md); /* pairs in the current neighbour list */

/* The phases of a GPU time step, for gpc_md_gpu_phase_ms: the opening half
 * kick and drift (fused into the forces with --gpu-step fused, but for a
 * run's first step), the rebuild decision, the list build (its kernels
 * return at once on steps without one), the pair forces, and thermo: the
 * closing half kick and sum of v^2 at the end of each run, and the pair
 * energy and virial when gpc_md_get_thermo first asks for them after a
 * run. */
enum {
    GPC_MD_PHASE_INTEGRATE,
    GPC_MD_PHASE_DECIDE,
    GPC_MD_PHASE_BUILD,
    GPC_MD_PHASE_FORCES,
    GPC_MD_PHASE_THERMO,
    GPC_MD_PHASES
};
/* "integrate", "decide", "build", "forces", "thermo". */
const char *gpc_md_phase_name(int phase);
/* On a GPU with GPC_MD_PHASES=1 (CUDA events between the phases' kernels,
 * read when the run is created): the GPU milliseconds of each phase over
 * every gpc_md_run so far, and 1. Else 0, ms untouched. */
int gpc_md_gpu_phase_ms(const gpc_md *md, double ms[GPC_MD_PHASES]);

/* "cpu, 4 threads" or "NVIDIA H200 (cuda:0)": where the run computes. */
const char *gpc_md_where(const gpc_md *md);

/* One run split across the `world` processes of an MPI job (mpirun, or gpc
 * launch of a CPU run), this one being `rank`: the box cut into slabs along
 * x, one a process, each holding its atoms and copies of its neighbours'
 * within cutoff + skin of its faces (sci/md_split.c). Results equal one
 * process's up to the order of the force sums. With config->device a GPU
 * each process steps its slab on that GPU, its pair forces in float64
 * (gpu_forces_f32 is refused; the other gpu_* choices shape one process's
 * kernels and are not used here). World 1 is gpc_md_create. Collective from here on: every process
 * calls gpc_md_run, gpc_md_gather_positions and gpc_md_free alike; gpc_md_get_thermo and the
 * counters give the whole crystal's figures on each. gpc_md_positions and
 * the other per-atom arrays are NULL on a split run. Errors as
 * gpc_md_create's, and slabs narrower than cutoff + skin. */
gpc_status gpc_md_create_split(gpc_md **out, const gpc_md_config *config, int rank, int world);
int gpc_md_processes(const gpc_md *md); /* 1 unless split */

/* Every atom's position by id ([atoms][3]), wrapped into the box, on every
 * process of a split run (collective), or of a run in one process. */
gpc_status gpc_md_gather_positions(gpc_md *md, double *out);

/* Every pair of atoms against every other, nearest image (a reference for
 * tests): forces [atoms][3], the pair energy and the virial sum r . f. */
void gpc_md_brute_force(const gpc_md *md, double *forces, double *energy, double *virial);

#ifdef __cplusplus
}
#endif

#endif /* GPC_MD_H */
