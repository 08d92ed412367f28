/*
 * stencil.h: a 3D finite-difference solver of the heat equation on the CPU.
 *
 * u_t = alpha (u_xx + u_yy + u_zz) on the n x n x n interior points of a
 * unit cube whose faces are held at 0, advanced by explicit Euler with the
 * 7-point Laplacian:
 *
 *   u' = u + r (u[x-1] + u[x+1] + u[y-1] + u[y+1] + u[z-1] + u[z+1] - 6 u)
 *
 * with r = alpha dt / h^2, stable for r <= 1/6. The grid is split into
 * `domains` slabs along z, each with its own arrays and one halo plane on
 * either side, filled from the neighbouring slab before every step (the
 * halo exchange that several GPUs do between their memories). A split grid
 * computes exactly what one slab computes, point for point.
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
 */
#ifndef GPC_STENCIL_H
#define GPC_STENCIL_H

#include "gpc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int n;       /* interior points along each side */
    int domains; /* slabs along z */
    double r;    /* alpha dt / h^2: 0 < r <= 1/6 */
    int mode[3]; /* the starting sine mode, each 1 to n */
} gpc_stencil_config;

/* n 128, one domain, r 1/8, mode (1, 1, 1). */
void gpc_stencil_defaults(gpc_stencil_config *config);

typedef struct gpc_stencil gpc_stencil;

gpc_status gpc_stencil_create(gpc_stencil **out, const gpc_stencil_config *config);

/* Bytes of each of the two buffers of gpc stencil's memory-copy baseline:
 * one array's size, but at least 4 times the last-level cache (so the copy
 * measures memory, not the cache) and at most 512 MiB. gpc_stencil_create's
 * memory check counts them. */
size_t gpc_stencil_copy_bytes(const gpc_stencil_config *config);
void gpc_stencil_free(gpc_stencil *s);

/* Advances `steps` steps (a halo exchange, then the update, each). */
gpc_status gpc_stencil_run(gpc_stencil *s, int steps);

int64_t gpc_stencil_steps(const gpc_stencil *s);

/* The field at interior point (x, y, z), each 0 to n - 1. */
double gpc_stencil_at(const gpc_stencil *s, int x, int y, int z);

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
