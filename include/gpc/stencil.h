/*
 * stencil.h: a 3D finite-difference solver of the heat equation, on the CPU
 * or a GPU, in one process or split across several.
 *
 * u_t = alpha (u_xx + u_yy + u_zz) on the n x n x n interior points of a
 * unit cube whose faces are held at 0, advanced by explicit Euler with the
 * 7-point Laplacian:
 *
 *   u' = u + r (u[x-1] + u[x+1] + u[y-1] + u[y+1] + u[z-1] + u[z+1] - 6 u)
 *
 * with r = alpha dt / h^2, stable for r <= 1/6. Every point is computed as
 * (1 - 6 r) u + r s in one fused multiply-add, s the six neighbours summed
 * in the order written, on the CPU and the GPU alike, so the field does not
 * depend on how the grid is split.
 *
 * The grid is split along z twice. Processes (config.dist: started by
 * mpirun or srun) each hold a band of planes, and each band is split into
 * `domains` slabs, each with its own arrays and one halo plane on either
 * side, filled from the neighbouring slab (memory copies) or process (MPI)
 * every step. The planes next to a halo are updated first; the rest of the
 * slab is updated while the halos travel. A split grid computes exactly
 * what one slab computes, to the last bit.
 *
 * The starting field is a sine mode, sin(kx pi x) sin(ky pi y) sin(kz pi z)
 * at the grid points, an eigenvector of the discrete operator: after s steps
 * it is lambda^s times itself, lambda = 1 - 4 r (sin^2(kx pi h / 2) +
 * sin^2(ky pi h / 2) + sin^2(kz pi h / 2)), h = 1 / (n + 1), which
 * gpc_stencil_error compares against: it checks the solver computes its
 * scheme. The heat equation itself takes the mode to exp(-alpha pi^2 (kx^2 +
 * ky^2 + kz^2) t) times itself; gpc_stencil_heat_error compares against
 * that, which measures the scheme's own error (second order in h at a fixed
 * r, the time step's included, since dt = r h^2 / alpha).
 *
 * With several processes, the functions that look at the whole grid
 * (gpc_stencil_error, gpc_stencil_heat_error, gpc_stencil_checksum,
 * gpc_stencil_at_all) are collective: every process calls them.
 */
#ifndef GPC_STENCIL_H
#define GPC_STENCIL_H

#include "gpc/core.h"
#include "gpc/dist.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int n;             /* interior points along each side */
    int domains;       /* slabs along z in each process (on a GPU: subdomains of its memory) */
    double r;          /* alpha dt / h^2: 0 < r <= 1/6 */
    int mode[3];       /* the starting sine mode, each 1 to n */
    gpc_device device; /* the CPU, or cuda:N */
    int fp32;          /* 1: single precision (GPUs only); 0: double */
    /* The processes that share the grid (gpc_dist_create with the "mpi"
     * backend), each holding n / world_size planes or so; NULL: this
     * process alone. Not owned. */
    gpc_dist *dist;
    /* On GPUs, the same processes over NCCL (gpc_dist_create with "nccl"),
     * each on a GPU of its own: halo planes then go from GPU to GPU over
     * it. NULL: through host buffers and `dist`. Not owned. */
    gpc_dist *gpu_dist;
} gpc_stencil_config;

/* n 128, one domain, r 1/8, mode (1, 1, 1), the CPU, double, alone. */
void gpc_stencil_defaults(gpc_stencil_config *config);

typedef struct gpc_stencil gpc_stencil;

/* Refuses, before allocating anything, a config that cannot run: r above
 * 1/6, a grid that does not split into world_size x domains slabs of a
 * plane or more, fp32 on the CPU, a GPU that does not exist, arrays larger
 * than the free memory of the host or the GPU. */
gpc_status gpc_stencil_create(gpc_stencil **out, const gpc_stencil_config *config);

/* Bytes of each of the two buffers of gpc stencil's memory-copy baseline.
 * CPU: one array's size, but at least 4 times the last-level cache (so the
 * copy measures memory, not the cache) and at most 512 MiB. GPU: one
 * array's size, but at least 256 MiB (5 times an H200's L2) and at most
 * 2 GiB. gpc_stencil_create's memory check counts them. */
size_t gpc_stencil_copy_bytes(const gpc_stencil_config *config);

/* The memory-copy rate of the config's device, bytes read plus written a
 * second, the best of 5 copies of gpc_stencil_copy_bytes: memcpy over the
 * OpenMP threads on the CPU, cudaMemcpy device to device on a GPU. A
 * memory-bound stencil's ceiling. */
gpc_status gpc_stencil_copy_rate(const gpc_stencil_config *config, double *bytes_per_second);
void gpc_stencil_free(gpc_stencil *s);

/* Advances `steps` steps and returns when they are done (on a GPU too). */
gpc_status gpc_stencil_run(gpc_stencil *s, int steps);

int64_t gpc_stencil_steps(const gpc_stencil *s);

/* The GPU's update kernel, as GPC_STENCIL_KERNEL names it ("vector",
 * "column", "plain", "shared"), read when the solver was created; "cpu" on
 * the CPU. */
const char *gpc_stencil_kernel_name(const gpc_stencil *s);

/* The planes of the grid this process holds: *first to *first + *count - 1. */
void gpc_stencil_planes(const gpc_stencil *s, int *first, int *count);

/* The field at interior point (x, y, z), each 0 to n - 1; NaN where plane z
 * belongs to another process. */
double gpc_stencil_at(const gpc_stencil *s, int x, int y, int z);

/* The same, every process getting the value from the one holding it
 * (collective). */
double gpc_stencil_at_all(const gpc_stencil *s, int x, int y, int z);

/* The n x n values of plane z (x fastest) as doubles into out; z must be one
 * of this process's planes. */
gpc_status gpc_stencil_plane(const gpc_stencil *s, int z, double *out);

/* A checksum of the whole field (collective): the sum, modulo 2^64, over the
 * points of a hash of each value's bits and the point's place. Any split,
 * any device and any order of summing give the same number for the same
 * bits; one bit changed anywhere changes it. */
uint64_t gpc_stencil_checksum(const gpc_stencil *s);

/* The factor the starting mode is multiplied by each step. */
double gpc_stencil_lambda(const gpc_stencil_config *config);

/* max |u - lambda^s u0| / max |u0| over the grid: how far the field is
 * from the discrete operator's exact evolution of its starting mode (the
 * decay the scheme itself should give), against the starting
 * amplitude (rounding puts a little of every other mode in, which a high
 * mode's fast decay leaves behind). */
double gpc_stencil_error(const gpc_stencil *s);

/* exp(-pi^2 (kx^2 + ky^2 + kz^2) r h^2 steps): the factor the heat
 * equation's exact solution has multiplied the starting mode by after
 * `steps` steps of time alpha dt = r h^2 each. */
double gpc_stencil_heat_decay(const gpc_stencil_config *config, int64_t steps);

/* max |u - gpc_stencil_heat_decay * u0| / max |u0|: how far the field is
 * from the heat equation's exact solution at the same time. */
double gpc_stencil_heat_error(const gpc_stencil *s);

#ifdef __cplusplus
}
#endif

#endif /* GPC_STENCIL_H */
