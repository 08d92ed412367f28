/*
 * md.c: Lennard-Jones molecular dynamics on the CPU (gpc/md.h).
 *
 * The neighbour list is a half list: each pair within cutoff + skin once,
 * found through a grid of cells at least that wide (an atom looks at the
 * later atoms of its own cell and at the 13 cells "above" it). At each build
 * the positions are wrapped into the box and the atoms sorted by cell, and
 * each entry records which periodic image of its partner is the near one,
 * so the force loop needs neither ghost atoms nor a rounding per pair. That
 * takes a box more than twice cutoff + skin wide (gpc_md_create checks).
 *
 * Forces: each thread walks a static share of the atoms and adds both
 * halves of each pair into its own force array, then the arrays are summed
 * per atom in thread order, so a run's results do not depend on scheduling
 * for a given thread count.
 *
 * A run on a GPU shares the setup (lattice, velocities, checks) and hands
 * the rest to md_cuda.cu; the host arrays are then mirrors, copied from the
 * GPU when asked for.
 */
#include "gpc/md.h"
#include "gpc/settings.h"
#include "sci/md_cuda.h"
#include "sci/md_split.h"
#include "sci/sci.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gpc_md {
    gpc_md_config config;
    int64_t n;
    double box, volume;
    double *x, *v, *f; /* [n][3] */
    double *x_built;   /* positions at the last neighbour-list build */
    double *thread_f;  /* [threads][n][3] */
    int threads;
    int64_t *id; /* each atom's place in the lattice order of creation */
    int64_t *id_scratch;
    /* neighbour list: atom i's row is neigh[i * row_capacity ..], with the
     * count[i] partners whose near image is themselves at its front (bare
     * indices) and the shifted[i] others at its back (coded entries);
     * before[i] sums both counts over the atoms before i */
    uint32_t *neigh;
    int32_t *count, *shifted;
    int64_t *before;
    int64_t row_capacity, neigh_capacity;
    int32_t *cell_of, *cell_start, *order;
    double *scratch; /* [n][3] */
    int cells_per_side;
    double shift[27][3]; /* box times each image offset, by shift code */
    double potential, virial;
    int64_t step, builds, since_build, dangerous;
    gpc_md_cuda *gpu; /* NULL on the CPU */
    md_split *split;  /* NULL in one process */
    int ranks;
    /* on a GPU: whether x and v hold the GPU's current state (copied back
     * since the last step), so what is written there may be sent back */
    int host_x_fresh, host_v_fresh;
    char where[320];
};

void gpc_md_defaults(gpc_md_config *c) {
    memset(c, 0, sizeof *c);
    c->cells = 20;
    c->density = 0.8442;
    c->temperature = 3.0;
    c->cutoff = 2.5;
    c->skin = 0.3;
    c->dt = 0.005;
    c->seed = 87287;
    c->rebuild_every = 0;
    c->device = gpc_cpu();
    const char *step = gpc_setting_str("GPC_MD_STEP");
    c->gpu_step_fused = !step || strcmp(step, "split") != 0;
    const char *unroll = gpc_setting_str("GPC_MD_UNROLL");
    c->gpu_unroll = unroll ? atoi(unroll) : 4;
    const char *list = gpc_setting_str("GPC_MD_LIST");
    c->gpu_list_per_atom = list && strcmp(list, "atoms") == 0;
}

static gpc_status check_config(const gpc_md_config *c) {
    if (c->cells < 1 || c->cells > 300) /* 4 x 300^3 atoms: neighbour indices take 27 bits */
        return gpc_error(GPC_ERR_INVALID_ARG, "md: cells %d is not 1 to 300", c->cells);
    if (!(c->density > 0 && c->density < 10))
        return gpc_error(GPC_ERR_INVALID_ARG, "md: density %g is not above 0 and below 10",
                         c->density);
    if (!(c->temperature >= 0 && c->temperature < 1e6))
        return gpc_error(GPC_ERR_INVALID_ARG, "md: temperature %g is not 0 or more",
                         c->temperature);
    if (!(c->cutoff > 0))
        return gpc_error(GPC_ERR_INVALID_ARG, "md: cutoff %g is not above 0", c->cutoff);
    if (!(c->skin >= 0)) return gpc_error(GPC_ERR_INVALID_ARG, "md: skin %g is negative", c->skin);
    if (!(c->dt > 0 && c->dt < 1))
        return gpc_error(GPC_ERR_INVALID_ARG, "md: time step %g is not above 0 and below 1", c->dt);
    if (c->rebuild_every < 0)
        return gpc_error(GPC_ERR_INVALID_ARG, "md: rebuild every %d steps: not 0 or more",
                         c->rebuild_every);
    if (c->gpu_lanes != 0 && c->gpu_lanes != 1 && c->gpu_lanes != 2 && c->gpu_lanes != 4 &&
        c->gpu_lanes != 8)
        return gpc_error(GPC_ERR_INVALID_ARG, "md: %d GPU lanes per atom: use 1, 2, 4 or 8",
                         c->gpu_lanes);
    if (c->gpu_unroll != 0 && c->gpu_unroll != 1 && c->gpu_unroll != 2 && c->gpu_unroll != 4 &&
        c->gpu_unroll != 8)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "md: %d partners at a time on the GPU: use 1, 2, 4 or 8", c->gpu_unroll);
    return GPC_OK;
}

void gpc_md_free(gpc_md *md) {
    if (!md) return;
    gpc_md_cuda_free(md->gpu);
    md_split_free(md->split);
    gpc_free(md->x), gpc_free(md->v), gpc_free(md->f), gpc_free(md->x_built);
    gpc_free(md->thread_f), gpc_free(md->id), gpc_free(md->id_scratch), gpc_free(md->neigh),
        gpc_free(md->count);
    gpc_free(md->shifted);
    gpc_free(md->before), gpc_free(md->cell_of), gpc_free(md->cell_start), gpc_free(md->order);
    gpc_free(md->scratch);
    gpc_free(md);
}

static double nearest(double d, double box, double inv_box) {
    return d - box * nearbyint(d * inv_box);
}

/* ------------------------------------------------------------ neighbours */

/* A neighbour entry: the partner's index in the low 27 bits, and in the top
 * 5 which periodic image of it is the near one: the partner's position plus
 * box times (sx, sy, sz), each -1, 0 or 1, numbered by shift_code (13 is the
 * partner itself). The image stays right until the next build, because
 * positions are wrapped into the box only then. */
#define INDEX_BITS 27
#define INDEX_MASK ((1u << INDEX_BITS) - 1)
#define SHIFT_NONE 13

static int shift_code(int sx, int sy, int sz) {
    return ((sz + 1) * 3 + (sy + 1)) * 3 + (sx + 1);
}

/* The cell itself and the 13 cells "above" it (offsets whose last non-zero
 * component, z then y then x, is positive): each pair of cells is visited
 * once. (Cells half the reach wide, about 60 of them with 2 or 3 atoms
 * each, test fewer atoms but cost more in loop overhead: measured slower.) */
static const int8_t upper[14][3] = {{0, 0, 0},   {1, 0, 0},  {-1, 1, 0}, {0, 1, 0},  {1, 1, 0},
                                    {-1, -1, 1}, {0, -1, 1}, {1, -1, 1}, {-1, 0, 1}, {0, 0, 1},
                                    {1, 0, 1},   {-1, 1, 1}, {0, 1, 1},  {1, 1, 1}};

/* Sorts the atoms by cell (positions wrapped into the box first), so each
 * cell's atoms are consecutive: the pair loops then read neighbouring
 * positions from a few runs of memory. ids follow the atoms. */
static gpc_status sort_by_cell(gpc_md *md) {
    const int64_t n = md->n;
    const int m = md->cells_per_side;
    const int64_t cells = (int64_t)m * m * m;
    const double box = md->box, inv_box = 1.0 / box;
    for (int64_t k = 0; k < 3 * n; k++) {
        if (!isfinite(md->x[k]))
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "md: the run blew up by step %lld (an atom's position is no longer "
                             "finite): use a smaller time step than %g or a lower temperature",
                             (long long)md->step + 1, md->config.dt);
        double p = md->x[k] - box * floor(md->x[k] * inv_box);
        md->x[k] = p >= box || p < 0 ? 0.0 : p; /* p < 0 or p = box: rounding at the faces */
    }
    memset(md->cell_start, 0, (size_t)(cells + 1) * sizeof *md->cell_start);
    for (int64_t i = 0; i < n; i++) {
        int c[3];
        for (int d = 0; d < 3; d++) {
            c[d] = (int)(md->x[3 * i + d] * inv_box * m);
            if (c[d] >= m) c[d] = m - 1;
            if (c[d] < 0) c[d] = 0;
        }
        md->cell_of[i] = (int32_t)((c[2] * m + c[1]) * m + c[0]);
        md->cell_start[md->cell_of[i] + 1]++;
    }
    for (int64_t c = 0; c < cells; c++)
        md->cell_start[c + 1] += md->cell_start[c];
    int32_t *fill = gpc_malloc((size_t)cells * sizeof *fill);
    if (!fill) return gpc_error(GPC_ERR_NOMEM, "md: out of host memory for the cell grid");
    memcpy(fill, md->cell_start, (size_t)cells * sizeof *fill);
    for (int64_t i = 0; i < n; i++)
        md->order[fill[md->cell_of[i]]++] = (int32_t)i;
    gpc_free(fill);
    /* permute positions, velocities and ids into cell order */
    double *arrays[2] = {md->x, md->v};
    for (int a = 0; a < 2; a++) {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++)
            for (int d = 0; d < 3; d++)
                md->scratch[3 * i + d] = arrays[a][3 * (int64_t)md->order[i] + d];
        memcpy(arrays[a], md->scratch, (size_t)(3 * n) * sizeof *md->scratch);
    }
    for (int64_t i = 0; i < n; i++)
        md->id_scratch[i] = md->id[md->order[i]];
    int64_t *t = md->id;
    md->id = md->id_scratch, md->id_scratch = t;
    return GPC_OK;
}

/* Each atom's partners within cutoff + skin: the later atoms of its own cell
 * and every atom of the 13 cells above it, each pair once. Rows have a fixed
 * capacity; a row that overflows makes the build run again with more. */
static gpc_status build_neighbors(gpc_md *md) {
    GPC_TRY(sort_by_cell(md));
    const int64_t n = md->n;
    const int m = md->cells_per_side;
    const double box = md->box, reach = md->config.cutoff + md->config.skin;
    const double reach2 = reach * reach;
    for (;;) {
        const int64_t cap = md->row_capacity;
        if ((int64_t)n * cap > md->neigh_capacity) {
            gpc_free(md->neigh);
            md->neigh = gpc_malloc((size_t)(n * cap) * sizeof *md->neigh);
            md->neigh_capacity = md->neigh ? n * cap : 0;
            if (!md->neigh)
                return gpc_error(GPC_ERR_NOMEM, "md: out of host memory for %lld neighbour slots",
                                 (long long)(n * cap));
        }
        int64_t longest = 0;
#pragma omp parallel for schedule(dynamic, 64) reduction(max : longest)
        for (int64_t c = 0; c < (int64_t)m * m * m; c++) {
            int cx = (int)(c % m), cy = (int)((c / m) % m), cz = (int)(c / ((int64_t)m * m));
            for (int32_t i = md->cell_start[c]; i < md->cell_start[c + 1]; i++) {
                const double xi = md->x[3 * (int64_t)i], yi = md->x[3 * (int64_t)i + 1],
                             zi = md->x[3 * (int64_t)i + 2];
                uint32_t *row = md->neigh + (int64_t)i * cap;
                int64_t count = 0, plain = 0, far = 0;
                for (int s = 0; s < 14; s++) {
                    int nx = cx + upper[s][0], ny = cy + upper[s][1], nz = cz + upper[s][2];
                    int sx = nx < 0    ? -1
                             : nx >= m ? 1
                                       : 0,
                        sy = ny < 0    ? -1
                             : ny >= m ? 1
                                       : 0,
                        sz = nz < 0    ? -1
                             : nz >= m ? 1
                                       : 0;
                    nx -= sx * m, ny -= sy * m, nz -= sz * m;
                    int cell = (nz * m + ny) * m + nx;
                    /* the partner's near image is at x_j + box * (sx, sy, sz) */
                    const double ox = box * sx, oy = box * sy, oz = box * sz;
                    const int code = shift_code(sx, sy, sz);
                    const uint32_t coded = (uint32_t)code << INDEX_BITS;
                    int32_t q = s == 0 ? i + 1 : md->cell_start[cell];
                    for (; q < md->cell_start[cell + 1]; q++) {
                        double dx = xi - md->x[3 * (int64_t)q] - ox;
                        double dy = yi - md->x[3 * (int64_t)q + 1] - oy;
                        double dz = zi - md->x[3 * (int64_t)q + 2] - oz;
                        if (dx * dx + dy * dy + dz * dz < reach2) {
                            if (++count > cap) continue; /* counted: the row grows next time */
                            if (code == SHIFT_NONE)
                                row[plain++] = (uint32_t)q;
                            else
                                row[cap - 1 - far++] = coded | (uint32_t)q;
                        }
                    }
                }
                md->count[i] = (int32_t)plain, md->shifted[i] = (int32_t)far;
                if (count > longest) longest = count;
            }
        }
        if (longest <= cap) break;
        md->row_capacity = longest + longest / 4 + 8; /* and build again */
    }
    /* pairs before each atom, so threads can take equal numbers of pairs */
    md->before[0] = 0;
    for (int64_t i = 0; i < n; i++)
        md->before[i + 1] = md->before[i] + md->count[i] + md->shifted[i];
    memcpy(md->x_built, md->x, (size_t)(3 * n) * sizeof *md->x);
    md->builds++;
    md->since_build = 0;
    return GPC_OK;
}

/* Whether an atom moved more than half the skin since the last build. */
static int moved_too_far(const gpc_md *md) {
    const double limit = 0.25 * md->config.skin * md->config.skin;
    int far = 0;
#pragma omp parallel for schedule(static) reduction(| : far)
    for (int64_t i = 0; i < md->n; i++) {
        double dx = md->x[3 * i] - md->x_built[3 * i];
        double dy = md->x[3 * i + 1] - md->x_built[3 * i + 1];
        double dz = md->x[3 * i + 2] - md->x_built[3 * i + 2];
        far |= dx * dx + dy * dy + dz * dz > limit;
    }
    return far;
}

/* ---------------------------------------------------------------- forces */

/* The first atom i whose pairs start at or after pair number `pair`
 * (before[i] >= pair; the atom count when none does). */
static int64_t first_atom_from(const gpc_md *md, int64_t pair) {
    int64_t a = 0, b = md->n;
    while (a < b) {
        int64_t mid = (a + b) / 2;
        if (md->before[mid] < pair)
            a = mid + 1;
        else
            b = mid;
    }
    return a;
}

static void compute_forces(gpc_md *md) {
    const int64_t n = md->n;
    const double rc2 = md->config.cutoff * md->config.cutoff;
    double potential = 0, virial = 0;
#pragma omp parallel num_threads(md->threads) reduction(+ : potential, virial)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        double *f = md->thread_f + (size_t)t * 3 * (size_t)n;
        memset(f, 0, (size_t)(3 * n) * sizeof *f);
        int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
        /* threads take equal numbers of pairs, not of atoms */
        if (nt > 1) {
            int64_t pairs = md->before[n];
            lo = t == 0 ? 0 : first_atom_from(md, pairs * t / nt);
            hi = t == nt - 1 ? n : first_atom_from(md, pairs * (t + 1) / nt);
        }
        double pair[3][md->row_capacity]; /* one row's pair forces (a few KiB) */
        for (int64_t i = lo; i < hi; i++) {
            const double *x = md->x;
            const double xi = x[3 * i], yi = x[3 * i + 1], zi = x[3 * i + 2];
            double fx = 0, fy = 0, fz = 0;
            const uint32_t *row = md->neigh + i * md->row_capacity;
            double e = 0, w = 0;
            /* partners that are their own near image, in two loops: the
             * first, over gathered positions only, vectorises; the second
             * adds the pair forces to the partners */
            const int32_t plain = md->count[i];
#pragma omp simd reduction(+ : fx, fy, fz, e, w)
            for (int32_t k = 0; k < plain; k++) {
                const int64_t j = row[k];
                double dx = xi - x[3 * j], dy = yi - x[3 * j + 1], dz = zi - x[3 * j + 2];
                double r2 = dx * dx + dy * dy + dz * dz;
                double r2inv = 1.0 / r2, r6inv = r2inv * r2inv * r2inv;
                int inside = r2 < rc2;
                double fpair = inside ? r6inv * (48.0 * r6inv - 24.0) * r2inv : 0.0;
                fx += dx * fpair, fy += dy * fpair, fz += dz * fpair;
                e += inside ? 4.0 * r6inv * (r6inv - 1.0) : 0.0;
                w += r2 * fpair;
                pair[0][k] = dx * fpair, pair[1][k] = dy * fpair, pair[2][k] = dz * fpair;
            }
            for (int32_t k = 0; k < plain; k++) {
                double *fj = f + 3 * (int64_t)row[k];
                fj[0] -= pair[0][k], fj[1] -= pair[1][k], fj[2] -= pair[2][k];
            }
            /* the others, each with its image's offset */
            const uint32_t *back = row + md->row_capacity - md->shifted[i];
            for (int32_t k = 0; k < md->shifted[i]; k++) {
                const int64_t j = back[k] & INDEX_MASK;
                const double *o = md->shift[back[k] >> INDEX_BITS];
                double dx = xi - x[3 * j] - o[0], dy = yi - x[3 * j + 1] - o[1],
                       dz = zi - x[3 * j + 2] - o[2];
                double r2 = dx * dx + dy * dy + dz * dz;
                if (r2 >= rc2) continue;
                double r2inv = 1.0 / r2, r6inv = r2inv * r2inv * r2inv;
                double fpair = r6inv * (48.0 * r6inv - 24.0) * r2inv;
                fx += dx * fpair, fy += dy * fpair, fz += dz * fpair;
                f[3 * j] -= dx * fpair, f[3 * j + 1] -= dy * fpair, f[3 * j + 2] -= dz * fpair;
                e += 4.0 * r6inv * (r6inv - 1.0);
                w += r2 * fpair;
            }
            f[3 * i] += fx, f[3 * i + 1] += fy, f[3 * i + 2] += fz;
            potential += e, virial += w;
        }
#pragma omp barrier
        /* sum the threads' arrays, atom by atom in thread order */
#pragma omp for schedule(static)
        for (int64_t k = 0; k < 3 * n; k++) {
            double s = 0;
            for (int u = 0; u < nt; u++)
                s += md->thread_f[(size_t)u * 3 * (size_t)n + (size_t)k];
            md->f[k] = s;
        }
    }
    md->potential = potential;
    md->virial = virial;
}

gpc_status gpc_md_compute(gpc_md *md) {
    if (md->split)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "md: a run split across processes cannot take positions from outside");
    if (md->gpu) {
        /* what the host holds goes back only when it is the GPU's state,
         * possibly written since: a stale copy would undo steps */
        gpc_status st = gpc_md_cuda_compute(md->gpu, md->host_x_fresh ? md->x : NULL,
                                            md->host_v_fresh ? md->v : NULL);
        md->host_x_fresh = md->host_v_fresh = 0; /* the build reordered the atoms */
        return st;
    }
    GPC_TRY(build_neighbors(md));
    compute_forces(md);
    return GPC_OK;
}

/* ------------------------------------------------------------- the run */

/* The fcc lattice (4 atoms a cell, x fastest: LAMMPS's create_atoms order)
 * of spacing a, and velocities: uniform, total momentum removed, scaled to
 * the temperature exactly. */
static void fill_lattice(const gpc_md_config *c, double a, int64_t n, double *x, double *v,
                         int64_t *id) {
    for (int64_t k = 0; k < n; k++)
        id[k] = k;
    /* the fcc lattice: 4 atoms a cell, x fastest (LAMMPS's create_atoms order) */
    static const double basis[4][3] = {{0, 0, 0}, {0.5, 0.5, 0}, {0.5, 0, 0.5}, {0, 0.5, 0.5}};
    int64_t i = 0;
    for (int cz = 0; cz < c->cells; cz++)
        for (int cy = 0; cy < c->cells; cy++)
            for (int cx = 0; cx < c->cells; cx++)
                for (int b = 0; b < 4; b++, i++) {
                    x[3 * i] = (cx + basis[b][0]) * a;
                    x[3 * i + 1] = (cy + basis[b][1]) * a;
                    x[3 * i + 2] = (cz + basis[b][2]) * a;
                }
    /* velocities: uniform, total momentum removed, scaled to the temperature */
    gpc_rng rng;
    gpc_rng_seed(&rng, c->seed, 0x6d64);
    double mean[3] = {0, 0, 0};
    for (int64_t k = 0; k < 3 * n; k++) {
        v[k] = gpc_rng_uniform64(&rng) - 0.5;
        mean[k % 3] += v[k];
    }
    double sum2 = 0;
    for (int64_t k = 0; k < 3 * n; k++) {
        v[k] -= mean[k % 3] / (double)n;
        sum2 += v[k] * v[k];
    }
    const double dof = 3.0 * (double)n - 3.0;
    double scale = dof > 0 && sum2 > 0 ? sqrt(c->temperature * dof / sum2) : 0.0;
    for (int64_t k = 0; k < 3 * n; k++)
        v[k] *= scale;
}

gpc_status gpc_md_create(gpc_md **out, const gpc_md_config *config) {
    *out = NULL;
    GPC_TRY(check_config(config));
    GPC_TRY(gpc_sci_check_gpu_dist("md", config->gpu_dist, config->device, 0, 1));
    const gpc_md_config *c = config;
    const double a = cbrt(4.0 / c->density);
    const double box = a * c->cells, reach = c->cutoff + c->skin;
    if (!(box > 2 * reach))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "md: the box (%d cells of %.4g, %.4g wide) must be more than twice cutoff "
                         "+ skin (%.4g): use at least %d cells",
                         c->cells, a, box, reach, (int)floor(2 * reach / a) + 1);
    const int on_gpu = c->device.type == GPC_DEVICE_CUDA;
    int cells_per_side = (int)floor(box / reach);
    if (cells_per_side < 1) cells_per_side = 1;
    /* the GPU's full list: all the atoms within reach, room for twice that */
    gpc_md_cuda_config gpu_config = {
        .atoms = 4 * (int64_t)c->cells * c->cells * c->cells,
        .box = box,
        .cutoff = c->cutoff,
        .skin = c->skin,
        .dt = c->dt,
        .cells_per_side = cells_per_side,
        .row_capacity = (int)(2.0 * c->density * 4.0 * M_PI / 3.0 * reach * reach * reach) + 32,
        .rebuild_every = c->rebuild_every,
        .forces_f32 = c->gpu_forces_f32,
        .lanes = c->gpu_lanes,
        .build_f64 = c->gpu_build_f64,
        .fused_step = c->gpu_step_fused,
        .unroll = c->gpu_unroll,
        .build_per_atom = c->gpu_list_per_atom,
    };
    {
        /* refuse what cannot fit rather than be killed filling it in */
        const double atoms = 4.0 * c->cells * c->cells * c->cells;
        const double row = 2.0 * c->density * 2.0 * M_PI / 3.0 * reach * reach * reach + 16;
        char what[64];
        snprintf(what, sizeof what, "md: %.0f atoms need", atoms);
        if (on_gpu) {
            GPC_TRY(gpc_md_cuda_check(c->device.index, &gpu_config));
            /* the host's mirrors and a copy's staging buffer */
            GPC_TRY(gpc_host_memory_check(atoms * (3 * 24 + 8 + 32), what, "", "use fewer cells"));
        } else {
            GPC_TRY(gpc_host_memory_check(
                atoms * (5 * 24 + 24.0 * omp_get_max_threads() + 40 + 4 * row), what, "",
                "use fewer cells"));
        }
    }
    gpc_md *md = gpc_calloc(1, sizeof *md);
    if (!md) return gpc_error(GPC_ERR_NOMEM, "md: out of host memory");
    md->config = *c;
    md->n = 4 * (int64_t)c->cells * c->cells * c->cells;
    md->box = box;
    md->volume = box * box * box;
    md->threads = omp_get_max_threads();
    md->cells_per_side = cells_per_side;
    const int64_t n = md->n,
                  cells = (int64_t)md->cells_per_side * md->cells_per_side * md->cells_per_side;
    const size_t vec = (size_t)(3 * n) * sizeof(double);
    md->x = gpc_malloc(vec), md->v = gpc_malloc(vec), md->f = gpc_malloc(vec);
    md->id = gpc_malloc((size_t)n * sizeof *md->id);
    if (!on_gpu) { /* the GPU holds the rest itself */
        md->x_built = gpc_malloc(vec);
        md->thread_f = gpc_malloc(vec * (size_t)md->threads);
        md->id_scratch = gpc_malloc((size_t)n * sizeof *md->id_scratch);
        md->count = gpc_malloc((size_t)n * sizeof *md->count);
        md->shifted = gpc_malloc((size_t)n * sizeof *md->shifted);
        md->before = gpc_malloc((size_t)(n + 1) * sizeof *md->before);
        md->order = gpc_malloc((size_t)n * sizeof *md->order);
        md->scratch = gpc_malloc(vec);
        md->cell_of = gpc_malloc((size_t)n * sizeof *md->cell_of);
        md->cell_start = gpc_malloc((size_t)(cells + 1) * sizeof *md->cell_start);
    }
    if (!md->x || !md->v || !md->f || !md->id ||
        (!on_gpu &&
         (!md->x_built || !md->thread_f || !md->id_scratch || !md->count || !md->shifted ||
          !md->before || !md->order || !md->scratch || !md->cell_of || !md->cell_start))) {
        gpc_md_free(md);
        return gpc_error(GPC_ERR_NOMEM, "md: out of host memory for %lld atoms", (long long)n);
    }

    for (int code = 0; code < 27; code++) {
        md->shift[code][0] = box * (code % 3 - 1);
        md->shift[code][1] = box * ((code / 3) % 3 - 1);
        md->shift[code][2] = box * (code / 9 - 1);
    }
    /* half of the atoms within reach, and room for twice that in a row */
    md->row_capacity = (int64_t)(2.0 * c->density * 2.0 * M_PI / 3.0 * reach * reach * reach) + 16;
    fill_lattice(c, a, n, md->x, md->v, md->id);

    gpc_status st;
    if (on_gpu) {
        st = gpc_md_cuda_create(&md->gpu, c->device.index, &gpu_config, md->x, md->v, md->id);
        if (st == GPC_OK)
            snprintf(md->where, sizeof md->where, "%s", gpc_md_cuda_device_name(md->gpu));
    } else {
        st = gpc_md_compute(md);
        snprintf(md->where, sizeof md->where, "cpu, %d thread%s", md->threads,
                 md->threads == 1 ? "" : "s");
    }
    if (st != GPC_OK) {
        gpc_md_free(md);
        return st;
    }
    *out = md;
    return GPC_OK;
}

gpc_status gpc_md_run(gpc_md *md, int steps) {
    if (md->split) {
        GPC_TRY(md_split_run(md->split, steps, md->step));
        md->step += steps > 0 ? steps : 0;
        return GPC_OK;
    }
    if (md->gpu) {
        md->host_x_fresh = md->host_v_fresh = 0;
        GPC_TRY(gpc_md_cuda_run(md->gpu, steps, md->step));
        md->step += steps > 0 ? steps : 0;
        return GPC_OK;
    }
    const int64_t n3 = 3 * md->n;
    const double half_dt = 0.5 * md->config.dt, dt = md->config.dt;
    for (int s = 0; s < steps; s++) {
        double *x = md->x, *v = md->v;
        const double *f = md->f;
#pragma omp parallel for schedule(static)
        for (int64_t k = 0; k < n3; k++) {
            v[k] += half_dt * f[k];
            x[k] += dt * v[k];
        }
        md->since_build++;
        int rebuild;
        if (md->config.rebuild_every > 0) {
            rebuild = md->since_build >= md->config.rebuild_every;
            /* a fixed interval that let an atom move over half the skin may
             * have missed pairs in between (LAMMPS's "dangerous builds") */
            if (rebuild && moved_too_far(md)) md->dangerous++;
        } else {
            rebuild = moved_too_far(md);
        }
        if (rebuild) GPC_TRY(build_neighbors(md));
        compute_forces(md);
        if (!isfinite(md->potential) || !isfinite(md->virial))
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "md: the run blew up at step %lld (the energy is no longer finite): "
                             "use a smaller time step than %g or a lower temperature",
                             (long long)md->step + 1, md->config.dt);
#pragma omp parallel for schedule(static)
        for (int64_t k = 0; k < n3; k++)
            v[k] += half_dt * f[k];
        md->step++;
    }
    return GPC_OK;
}

void gpc_md_get_thermo(const gpc_md *md, gpc_md_thermo *out) {
    double sum2 = 0, potential = md->potential, virial = md->virial;
    if (md->split) {
        int64_t pairs;
        md_split_sums(md->split, &potential, &virial, &sum2, &pairs);
    } else if (md->gpu) {
        gpc_md_cuda_sums sums;
        /* the energy and virial summed on the GPU at the first call after a
         * run; NaN if that fails (gpc_last_error says why) */
        gpc_md_cuda_sums_get(md->gpu, &sums);
        sum2 = sums.v2, potential = sums.potential, virial = sums.virial;
    } else {
        for (int64_t k = 0; k < 3 * md->n; k++)
            sum2 += md->v[k] * md->v[k];
    }
    const double n = (double)md->n, dof = 3.0 * n - 3.0, ke = 0.5 * sum2;
    out->step = md->step;
    out->temperature = dof > 0 ? 2.0 * ke / dof : 0.0;
    out->potential = potential / n;
    out->kinetic = ke / n;
    out->total = (potential + ke) / n;
    out->pressure = (dof * out->temperature + virial) / (3.0 * md->volume);
}

int64_t gpc_md_atoms(const gpc_md *md) {
    return md->n;
}

double gpc_md_box(const gpc_md *md) {
    return md->box;
}

static const char split_message[] =
    "md: a run split across processes holds its atoms in pieces: use gpc_md_gather_positions";

double *gpc_md_positions(gpc_md *md) {
    if (md->split) {
        gpc_error(GPC_ERR_UNSUPPORTED, split_message);
        return NULL;
    }
    if (md->gpu && !md->host_x_fresh) {
        if (gpc_md_cuda_download(md->gpu, md->x, NULL, NULL, NULL) != GPC_OK) return NULL;
        md->host_x_fresh = 1;
    }
    return md->x;
}

double *gpc_md_velocities(gpc_md *md) {
    if (md->split) {
        gpc_error(GPC_ERR_UNSUPPORTED, split_message);
        return NULL;
    }
    if (md->gpu && !md->host_v_fresh) {
        if (gpc_md_cuda_download(md->gpu, NULL, md->v, NULL, NULL) != GPC_OK) return NULL;
        md->host_v_fresh = 1;
    }
    return md->v;
}

/* Forces and ids are never sent back to a GPU, so they are copied at each
 * call (the arrays, not the struct, change: md stays const). */
const double *gpc_md_forces(const gpc_md *md) {
    if (md->split) {
        gpc_error(GPC_ERR_UNSUPPORTED, split_message);
        return NULL;
    }
    if (md->gpu && gpc_md_cuda_download(md->gpu, NULL, NULL, md->f, NULL) != GPC_OK) return NULL;
    return md->f;
}

const int64_t *gpc_md_ids(const gpc_md *md) {
    if (md->split) {
        gpc_error(GPC_ERR_UNSUPPORTED, split_message);
        return NULL;
    }
    if (md->gpu && gpc_md_cuda_download(md->gpu, NULL, NULL, NULL, md->id) != GPC_OK) return NULL;
    return md->id;
}

int64_t gpc_md_neighbor_builds(const gpc_md *md) {
    return md->split ? md_split_builds(md->split)
           : md->gpu ? gpc_md_cuda_builds(md->gpu)
                     : md->builds;
}

int64_t gpc_md_dangerous_builds(const gpc_md *md) {
    return md->split ? md_split_dangerous(md->split)
           : md->gpu ? gpc_md_cuda_dangerous(md->gpu)
                     : md->dangerous;
}

int64_t gpc_md_pairs(const gpc_md *md) {
    if (md->split) {
        double e, w, v2;
        int64_t pairs;
        md_split_sums(md->split, &e, &w, &v2, &pairs);
        return pairs;
    }
    return md->gpu ? gpc_md_cuda_pairs(md->gpu) : md->before[md->n];
}

const char *gpc_md_phase_name(int phase) {
    static const char *const names[GPC_MD_PHASES] = {"integrate", "decide", "build", "forces",
                                                     "thermo"};
    return phase >= 0 && phase < GPC_MD_PHASES ? names[phase] : "?";
}

int gpc_md_gpu_phase_ms(const gpc_md *md, double ms[GPC_MD_PHASES]) {
    return md->gpu ? gpc_md_cuda_phase_ms(md->gpu, ms) : 0;
}

const char *gpc_md_where(const gpc_md *md) {
    return md->where;
}

int gpc_md_processes(const gpc_md *md) {
    return md->split ? md->ranks : 1;
}

gpc_status gpc_md_gather_positions(gpc_md *md, double *out) {
    if (md->split) return md_split_gather_positions(md->split, out);
    const double *x = gpc_md_positions(md);
    const int64_t *id = gpc_md_ids(md);
    if (!x || !id) return gpc_error(GPC_ERR_DEVICE, "md: %s", gpc_last_error());
    for (int64_t i = 0; i < md->n; i++)
        for (int d = 0; d < 3; d++) {
            double p = x[3 * i + d] - md->box * floor(x[3 * i + d] / md->box);
            out[3 * id[i] + d] = p >= md->box || p < 0 ? 0.0 : p;
        }
    return GPC_OK;
}

gpc_status gpc_md_create_split(gpc_md **out, const gpc_md_config *config, int rank, int world) {
    if (world <= 1) return gpc_md_create(out, config);
    *out = NULL;
    GPC_TRY(check_config(config));
    const gpc_md_config *c = config;
    if (c->device.type == GPC_DEVICE_CUDA && c->gpu_forces_f32)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "md: a run over several processes on GPUs computes pair forces in "
                         "float64: leave out --forces f32, or run one process");
    GPC_TRY(gpc_sci_check_gpu_dist("md", c->gpu_dist, c->device, rank, world));
    const double a = cbrt(4.0 / c->density), box = a * c->cells, reach = c->cutoff + c->skin;
    if (!(box > 2 * reach))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "md: the box (%d cells of %.4g, %.4g wide) must be more than twice cutoff "
                         "+ skin (%.4g): use at least %d cells",
                         c->cells, a, box, reach, (int)floor(2 * reach / a) + 1);
    const double atoms = 4.0 * c->cells * c->cells * c->cells;
    {
        /* the whole crystal once (every process draws it, then keeps its
         * slab) and a slab's share of the rest, twice for ghosts */
        const double row = 2.0 * c->density * 4.0 * M_PI / 3.0 * reach * reach * reach + 32;
        char what[64];
        snprintf(what, sizeof what, "md: %.0f atoms need", atoms);
        GPC_TRY(gpc_host_memory_check(atoms * 56 + atoms / world * 2 * (14 * 8 + 4 * row), what, "",
                                      "use fewer cells"));
    }
    gpc_md *md = gpc_calloc(1, sizeof *md);
    if (!md) return gpc_error(GPC_ERR_NOMEM, "md: out of host memory");
    md->config = *c;
    md->n = (int64_t)atoms;
    md->box = box;
    md->volume = box * box * box;
    md->threads = omp_get_max_threads();
    md->ranks = world;
    const size_t vec = (size_t)(3 * md->n) * sizeof(double);
    double *x = gpc_malloc(vec), *v = gpc_malloc(vec);
    int64_t *id = gpc_malloc((size_t)md->n * sizeof *id);
    gpc_status st = GPC_OK;
    if (!x || !v || !id) {
        st = gpc_error(GPC_ERR_NOMEM, "md: out of host memory for %lld atoms", (long long)md->n);
    } else {
        fill_lattice(c, a, md->n, x, v, id);
        st = md_split_create(&md->split, c, rank, world, md->n, box, x, v, id);
    }
    gpc_free(x), gpc_free(v), gpc_free(id);
    if (st != GPC_OK) {
        gpc_md_free(md);
        return st;
    }
    const char *gpu = md_split_device_name(md->split);
    if (gpu)
        snprintf(md->where, sizeof md->where, "%s, %d processes, ghosts %s", gpu, world,
                 c->gpu_dist ? "GPU to GPU over NCCL" : "through the host over MPI");
    else
        snprintf(md->where, sizeof md->where, "cpu, %d processes of %d thread%s", world,
                 md->threads, md->threads == 1 ? "" : "s");
    *out = md;
    return GPC_OK;
}

void gpc_md_brute_force(const gpc_md *md, double *forces, double *energy, double *virial) {
    const int64_t n = md->n;
    const double box = md->box, inv_box = 1.0 / box;
    const double rc2 = md->config.cutoff * md->config.cutoff;
    double e = 0, w = 0;
    memset(forces, 0, (size_t)(3 * n) * sizeof *forces);
    if (md->split) { /* every pair needs every position: not for a split run */
        *energy = *virial = NAN;
        return;
    }
    /* on a GPU, its positions, unless the host's copy is already them */
    if (md->gpu && !md->host_x_fresh &&
        gpc_md_cuda_download(md->gpu, md->x, NULL, NULL, NULL) != GPC_OK) {
        *energy = *virial = NAN;
        return;
    }
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = i + 1; j < n; j++) {
            double dx = nearest(md->x[3 * i] - md->x[3 * j], box, inv_box);
            double dy = nearest(md->x[3 * i + 1] - md->x[3 * j + 1], box, inv_box);
            double dz = nearest(md->x[3 * i + 2] - md->x[3 * j + 2], box, inv_box);
            double r2 = dx * dx + dy * dy + dz * dz;
            if (r2 >= rc2) continue;
            double r6 = r2 * r2 * r2, r12 = r6 * r6;
            double fpair = (48.0 / r12 - 24.0 / r6) / r2;
            forces[3 * i] += dx * fpair, forces[3 * i + 1] += dy * fpair;
            forces[3 * i + 2] += dz * fpair;
            forces[3 * j] -= dx * fpair, forces[3 * j + 1] -= dy * fpair;
            forces[3 * j + 2] -= dz * fpair;
            e += 4.0 * (1.0 / r12 - 1.0 / r6);
            w += r2 * fpair;
        }
    *energy = e;
    *virial = w;
}
