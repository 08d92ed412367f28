/*
 * md_split.c: Lennard-Jones MD split across MPI processes (md_split.h), the
 * physics of md.c: the box cut into one slab along x per process.
 *
 * A process owns the atoms whose x lies in its slab at the last neighbour
 * build, and holds ghost copies of the atoms of its two neighbours that lie
 * within cutoff + skin of its faces (shifted by the box across the periodic
 * seam). Between builds atoms move less than half the skin, so every pair
 * within the cutoff is an owned atom with an owned atom or a ghost: each
 * step only the ghosts' positions travel, in the same order (LAMMPS's
 * "forward communication"). At a build, atoms that left the slab migrate to
 * the neighbour that now owns them, and the ghosts are chosen again.
 *
 * The neighbour list is full (each owned atom lists every partner, owned or
 * ghost) and forces act on owned atoms only, so no force travels back; each
 * process adds half of each pair's energy and virial, and the thermo sums
 * are reduced over the processes at the end of each run. The rebuild
 * decision (an atom moved over half the skin on any process) is one
 * all-reduce of two ints a step.
 *
 * On a GPU (md_split_cuda.h) the atoms stay there: each build's wrap,
 * migration, choice of ghosts and list run on the GPU in the order above,
 * and the host carries only what crosses processes (leavers, arrivals,
 * ghost positions, counts and flags) through the same exchanges.
 *
 * Results differ from one process's only in the order of the force sums.
 */
#include "sci/md_split.h"

#include "sci/md_split_cuda.h"
#include "gpc/dist.h"

#include <math.h>
#include <string.h>

#ifdef GPC_HAVE_MPI

#include <mpi.h>

struct md_split {
    int rank, world, left, right;
    double box, inv_box, width, reach, rc2, reach2, limit2, slack, dt;
    int rebuild_every;
    int64_t since_build, total;
    /* owned atoms: x, v, f, x_built [cap][3], id [cap] */
    int64_t n, cap;
    double *x, *v, *f, *x_built;
    int64_t *id;
    /* owned then ghosts from the left then from the right: [all_cap][3] */
    double *all;
    int64_t recv_left, recv_right, all_cap;
    /* owned atoms whose positions go to each neighbour every step */
    int64_t *send_left, *send_right;
    int64_t n_send_left, n_send_right;
    int64_t send_left_cap, send_right_cap;
    double *buf_out, *buf_in;
    int64_t buf_out_cap, buf_in_cap; /* doubles */
    /* the full list: row i at rows[i * row_cap], count[i] partners */
    int32_t *rows, *count;
    int64_t row_cap, rows_cap, count_cap;
    int32_t *head, *next; /* atoms by cell: the first, then each one's next */
    int64_t head_cap, next_cap;
    double potential, virial; /* this process's halves of its pairs */
    int64_t pairs;            /* its listed partners */
    double sum_potential, sum_virial, sum_v2;
    int64_t sum_pairs, builds, dangerous;
    md_split_cuda *gpu; /* the slab on a GPU, or NULL */
    gpc_dist *peers;    /* with gpu: NCCL for the ghosts, GPU to GPU; or NULL */
};

static gpc_status mpi_ok(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return GPC_OK;
    return gpc_error(GPC_ERR_IO, "md: MPI %s failed (code %d)", what, rc);
}

/* A buffer of `old` items grown to `want` (contents kept), or NULL. */
static void *resize(void *p, int64_t old, int64_t want, size_t item) {
    void *q = gpc_malloc((size_t)want * item);
    if (q && p && old > 0) memcpy(q, p, (size_t)old * item);
    if (q) gpc_free(p);
    return q;
}

#define NOMEM(count)                                                                               \
    gpc_error(GPC_ERR_NOMEM, "md: out of host memory for %lld atoms", (long long)(count))

/* Room for `need` items in *p, whose capacity is *cap. */
static gpc_status reserve(void **p, int64_t *cap, int64_t need, size_t item) {
    if (need <= *cap) return GPC_OK;
    int64_t want = need + need / 2 + 64;
    void *q = resize(*p, *cap, want, item);
    if (!q) return NOMEM(need);
    *p = q;
    *cap = want;
    return GPC_OK;
}

/* Room for `need` owned atoms in each owned array. */
static gpc_status reserve_owned(md_split *s, int64_t need) {
    if (need <= s->cap) return GPC_OK;
    int64_t want = need + need / 2 + 64;
    double **vecs[] = {&s->x, &s->v, &s->f, &s->x_built};
    for (int k = 0; k < 4; k++) {
        double *q = resize(*vecs[k], 3 * s->cap, 3 * want, sizeof(double));
        if (!q) return NOMEM(need);
        *vecs[k] = q;
    }
    int64_t *q = resize(s->id, s->cap, want, sizeof(int64_t));
    if (!q) return NOMEM(need);
    s->id = q;
    s->cap = want;
    return GPC_OK;
}

static int owner_of(const md_split *s, double x) {
    int r = (int)(x / s->width);
    return r < 0 ? 0 : (r >= s->world ? s->world - 1 : r);
}

static double wrap(double p, double box, double inv_box) {
    double w = p - box * floor(p * inv_box);
    return w >= box || w < 0 ? 0.0 : w;
}

static double nearest(double d, double box, double inv_box) {
    return d - box * nearbyint(d * inv_box);
}

/* Sends `count` to `to` while receiving `from`'s into *received. */
static gpc_status swap_count(int64_t count, int to, int from, int64_t *received, int tag) {
    long long n_out = count, n_in = 0;
    GPC_TRY(mpi_ok(MPI_Sendrecv(&n_out, 1, MPI_LONG_LONG, to, tag, &n_in, 1, MPI_LONG_LONG, from,
                                tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                   "sendrecv of a count"));
    *received = n_in;
    return GPC_OK;
}

/* Sends `count` doubles of `out` to `to` while receiving what `from` sends
 * into s->buf_in, or on a GPU with ghost_side >= 0 into that side's pinned
 * room on the GPU's side (md_split_cuda_ghost_room); *received: how many
 * came. */
static gpc_status exchange(md_split *s, const double *out, int to, int from, int64_t count,
                           int64_t *received, int tag, int ghost_side) {
    const long long n_out = count;
    int64_t got = 0;
    GPC_TRY(swap_count(count, to, from, &got, tag));
    const long long n_in = got;
    if (n_out > (1 << 30) || n_in > (1 << 30))
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "md: a message of %lld values is too long for one MPI call: use more "
                         "processes",
                         n_out > n_in ? n_out : n_in);
    double *in = NULL;
    if (s->gpu && ghost_side >= 0) { /* straight into the GPU's pinned room */
        GPC_TRY(md_split_cuda_ghost_room(s->gpu, ghost_side, n_in, &in));
    } else {
        GPC_TRY(reserve((void **)&s->buf_in, &s->buf_in_cap, n_in, sizeof(double)));
        in = s->buf_in;
    }
    *received = n_in;
    return mpi_ok(MPI_Sendrecv(out, (int)n_out, MPI_DOUBLE, to, tag + 1, in, (int)n_in, MPI_DOUBLE,
                               from, tag + 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                  "sendrecv");
}

/* ------------------------------------------------------------- migration */

/* After a build's wrap: whether a position on any process was no longer
 * finite (bad), the run's end if so. */
static gpc_status agree_finite(md_split *s, int bad, int64_t step) {
    int total_bad = 0;
    GPC_TRY(
        mpi_ok(MPI_Allreduce(&bad, &total_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "allreduce"));
    if (total_bad)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "md: the run blew up by step %lld (an atom's position is no longer "
                         "finite): use a smaller time step than %g or a lower temperature",
                         (long long)step, s->dt);
    return GPC_OK;
}

/* After migration: whether an atom on any process had crossed more than one
 * slab (stray), which the exchange with neighbours cannot carry. */
static gpc_status agree_no_stray(int stray, int64_t step) {
    int any_stray = 0;
    GPC_TRY(mpi_ok(MPI_Allreduce(&stray, &any_stray, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD),
                   "allreduce"));
    if (any_stray)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "md: an atom crossed more than one slab between neighbour-list builds "
                         "(by step %lld): use --rebuild-every 0, or fewer processes",
                         (long long)step);
    return GPC_OK;
}

/* Wraps the owned positions into the box and sends each atom whose slab is
 * now a neighbour's there (x, v, id as 7 doubles; ids are below 2^53).
 * Kept atoms stay in order; arrivals from the left, then the right, follow. */
static gpc_status migrate(md_split *s, int64_t step) {
    int bad = 0;
    for (int64_t k = 0; k < 3 * s->n; k++) {
        if (!isfinite(s->x[k])) bad = 1;
        s->x[k] = wrap(s->x[k], s->box, s->inv_box);
    }
    GPC_TRY(agree_finite(s, bad, step));
    int stray = 0;
    for (int side = 0; side < 2; side++) { /* 0: to the right, 1: to the left */
        const int to = side == 0 ? s->right : s->left, from = side == 0 ? s->left : s->right;
        int64_t out = 0, kept = 0;
        GPC_TRY(reserve((void **)&s->buf_out, &s->buf_out_cap, 7 * s->n, sizeof(double)));
        for (int64_t i = 0; i < s->n; i++) {
            int r = owner_of(s, s->x[3 * i]);
            /* with two processes both neighbours are the same one: the right */
            int leaves = r != s->rank && (side == 0 ? r == s->right : r == s->left);
            if (r != s->rank && r != s->left && r != s->right) stray = 1;
            if (leaves) {
                double *o = s->buf_out + 7 * out++;
                memcpy(o, s->x + 3 * i, 3 * sizeof(double));
                memcpy(o + 3, s->v + 3 * i, 3 * sizeof(double));
                o[6] = (double)s->id[i];
            } else {
                memmove(s->x + 3 * kept, s->x + 3 * i, 3 * sizeof(double));
                memmove(s->v + 3 * kept, s->v + 3 * i, 3 * sizeof(double));
                s->id[kept++] = s->id[i];
            }
        }
        s->n = kept;
        int64_t got = 0;
        GPC_TRY(exchange(s, s->buf_out, to, from, 7 * out, &got, 10 + 2 * side, -1));
        GPC_TRY(reserve_owned(s, s->n + got / 7));
        for (int64_t a = 0; a < got / 7; a++, s->n++) {
            const double *in = s->buf_in + 7 * a;
            memcpy(s->x + 3 * s->n, in, 3 * sizeof(double));
            memcpy(s->v + 3 * s->n, in + 3, 3 * sizeof(double));
            s->id[s->n] = (int64_t)in[6];
        }
    }
    return agree_no_stray(stray, step);
}

/* ---------------------------------------------------------------- ghosts */

/* Packs the positions of the atoms listed for one side, shifted across the
 * periodic seam where the neighbour sits on the other side of it. */
static void pack_positions(md_split *s, int side) {
    const int64_t *list = side == 0 ? s->send_right : s->send_left;
    const int64_t count = side == 0 ? s->n_send_right : s->n_send_left;
    /* to the right from the last slab, to the left from the first: the
     * copies land on the far side of the neighbour's slab */
    const double shift =
        side == 0 ? (s->rank == s->world - 1 ? -s->box : 0.0) : (s->rank == 0 ? s->box : 0.0);
    for (int64_t a = 0; a < count; a++) {
        const double *p = s->x + 3 * list[a];
        s->buf_out[3 * a] = p[0] + shift;
        s->buf_out[3 * a + 1] = p[1];
        s->buf_out[3 * a + 2] = p[2];
    }
}

/* The ghosts' positions now: owned positions first in s->all, then those
 * from the left, then from the right, in the order of the last build. */
static gpc_status forward(md_split *s, int choose) {
    if (s->peers) { /* GPU to GPU: only a build's counts go over MPI */
        if (choose) {
            GPC_TRY(swap_count(s->n_send_right, s->right, s->left, &s->recv_left, 20));
            GPC_TRY(swap_count(s->n_send_left, s->left, s->right, &s->recv_right, 22));
        }
        const int to[2] = {s->right, s->left}, from[2] = {s->left, s->right};
        const int64_t arriving[2] = {s->recv_left, s->recv_right};
        return md_split_cuda_forward_peers(s->gpu, s->peers, to, from, choose ? arriving : NULL);
    }
    const int64_t need = s->n + s->recv_left + s->recv_right;
    if (!choose && !s->gpu)
        GPC_TRY(reserve((void **)&s->all, &s->all_cap, 3 * need, sizeof(double)));
    /* on a GPU both sides are packed at once, into pinned memory */
    const double *packed[2] = {NULL, NULL};
    if (s->gpu) GPC_TRY(md_split_cuda_pack(s->gpu, packed));
    for (int side = 0; side < 2; side++) {
        const int to = side == 0 ? s->right : s->left, from = side == 0 ? s->left : s->right;
        const int64_t count = side == 0 ? s->n_send_right : s->n_send_left;
        if (!s->gpu) {
            GPC_TRY(reserve((void **)&s->buf_out, &s->buf_out_cap, 3 * count, sizeof(double)));
            pack_positions(s, side);
            packed[side] = s->buf_out;
        }
        int64_t got = 0;
        GPC_TRY(exchange(s, packed[side], to, from, 3 * count, &got, 20 + 2 * side, side));
        const int64_t expect = side == 0 ? s->recv_left : s->recv_right;
        if (choose) {
            if (side == 0)
                s->recv_left = got / 3;
            else
                s->recv_right = got / 3;
        } else if (got != 3 * expect) {
            return gpc_error(GPC_ERR_INTERNAL, "md: %lld ghost positions came, %lld expected",
                             (long long)got / 3, (long long)expect);
        }
        if (s->gpu) { /* at a build their number is new */
            GPC_TRY(md_split_cuda_ghosts(s->gpu, side, choose ? got / 3 : -1));
            continue;
        }
        const int64_t at = side == 0 ? s->n : s->n + s->recv_left;
        GPC_TRY(reserve((void **)&s->all, &s->all_cap, 3 * (at + got / 3), sizeof(double)));
        memcpy(s->all + 3 * at, s->buf_in, (size_t)got * sizeof(double));
    }
    if (!s->gpu) memcpy(s->all, s->x, (size_t)(3 * s->n) * sizeof(double));
    return GPC_OK;
}

/* Chooses the atoms each neighbour needs (within reach of the face they
 * share) and sends their positions. */
static gpc_status choose_ghosts(md_split *s) {
    const double lo = s->rank * s->width, hi = (s->rank + 1) * s->width;
    GPC_TRY(reserve((void **)&s->send_left, &s->send_left_cap, s->n, sizeof(int64_t)));
    GPC_TRY(reserve((void **)&s->send_right, &s->send_right_cap, s->n, sizeof(int64_t)));
    s->n_send_left = s->n_send_right = 0;
    for (int64_t i = 0; i < s->n; i++) {
        const double x = s->x[3 * i];
        if (x < lo + s->reach + s->slack) s->send_left[s->n_send_left++] = i;
        if (x >= hi - s->reach - s->slack) s->send_right[s->n_send_right++] = i;
    }
    s->recv_left = s->recv_right = 0;
    return forward(s, 1);
}

/* ------------------------------------------------------- neighbour list */

/* Each owned atom's partners within reach among owned atoms and ghosts,
 * found through cells at least reach wide: along x over the span of the
 * positions (no wrap: the ghosts are the images), along y and z over the
 * periodic box. Rows that overflow make the build run again with more. */
static gpc_status build_list(md_split *s) {
    const int64_t all = s->n + s->recv_left + s->recv_right;
    double xmin = INFINITY, xmax = -INFINITY;
    for (int64_t j = 0; j < all; j++)
        xmin = fmin(xmin, s->all[3 * j]), xmax = fmax(xmax, s->all[3 * j]);
    if (all == 0) xmin = xmax = 0;
    int mx = (int)floor((xmax - xmin) / s->reach);
    if (mx < 1) mx = 1;
    const double cw = (xmax - xmin) / mx > 0 ? (xmax - xmin) / mx : 1.0;
    int m = (int)floor(s->box / s->reach);
    if (m < 1) m = 1;
    const int64_t cells = (int64_t)mx * m * m;
    GPC_TRY(reserve((void **)&s->head, &s->head_cap, cells, sizeof(int32_t)));
    GPC_TRY(reserve((void **)&s->next, &s->next_cap, all, sizeof(int32_t)));
    GPC_TRY(reserve((void **)&s->count, &s->count_cap, s->n, sizeof(int32_t)));
    for (int64_t c = 0; c < cells; c++)
        s->head[c] = -1;
#define CELL_X(p) ((int)fmin(fmax(floor(((p)-xmin) / cw), 0), mx - 1))
#define CELL_P(p) ((int)fmin(fmax(floor((p)*s->inv_box * m), 0), m - 1))
    /* the lists are built backwards, so walking a cell meets atoms in order */
    for (int64_t j = all - 1; j >= 0; j--) {
        const double *p = s->all + 3 * j;
        int64_t c = ((int64_t)CELL_P(p[2]) * m + CELL_P(p[1])) * mx + CELL_X(p[0]);
        s->next[j] = s->head[c];
        s->head[c] = (int32_t)j;
    }
    const int span = m >= 3 ? 3 : m;
    for (;;) {
        const int64_t cap = s->row_cap;
        GPC_TRY(reserve((void **)&s->rows, &s->rows_cap, s->n * cap, sizeof(int32_t)));
        int64_t longest = 0;
#pragma omp parallel for schedule(dynamic, 64) reduction(max : longest)
        for (int64_t i = 0; i < s->n; i++) {
            const double *p = s->all + 3 * i;
            const int cx = CELL_X(p[0]), cy = CELL_P(p[1]), cz = CELL_P(p[2]);
            int64_t found = 0;
            int32_t *row = s->rows + i * cap;
            for (int a = 0; a < span; a++) {
                const int nz = m >= 3 ? (cz + a - 1 + m) % m : a;
                for (int b = 0; b < span; b++) {
                    const int ny = m >= 3 ? (cy + b - 1 + m) % m : b;
                    for (int dxc = -1; dxc <= 1; dxc++) {
                        const int nx = cx + dxc;
                        if (nx < 0 || nx >= mx) continue;
                        for (int32_t j = s->head[((int64_t)nz * m + ny) * mx + nx]; j >= 0;
                             j = s->next[j]) {
                            if (j == i) continue;
                            const double *q = s->all + 3 * (int64_t)j;
                            double dx = p[0] - q[0];
                            double dy = nearest(p[1] - q[1], s->box, s->inv_box);
                            double dz = nearest(p[2] - q[2], s->box, s->inv_box);
                            if (dx * dx + dy * dy + dz * dz < s->reach2) {
                                if (found < cap) row[found] = j;
                                found++;
                            }
                        }
                    }
                }
            }
            s->count[i] = (int32_t)(found < cap ? found : cap);
            if (found > longest) longest = found;
        }
        if (longest <= cap) break;
        s->row_cap = longest + longest / 4 + 8;
    }
#undef CELL_X
#undef CELL_P
    s->pairs = 0;
    for (int64_t i = 0; i < s->n; i++)
        s->pairs += s->count[i];
    memcpy(s->x_built, s->x, (size_t)(3 * s->n) * sizeof(double));
    s->builds++;
    s->since_build = 0;
    return GPC_OK;
}

/* A build with the atoms on the GPU: migrate(), choose_ghosts() and
 * build_list() done there, what crosses processes crossing here. */
static gpc_status rebuild_on_gpu(md_split *s, int64_t step) {
    int bad = 0, stray = 0;
    GPC_TRY(md_split_cuda_wrap(s->gpu, &bad, &stray));
    GPC_TRY(agree_finite(s, bad, step));
    for (int side = 0; side < 2; side++) { /* 0: to the right, 1: to the left */
        const int to = side == 0 ? s->right : s->left, from = side == 0 ? s->left : s->right;
        const double *out = NULL;
        int64_t count = 0, got = 0;
        GPC_TRY(md_split_cuda_leave(s->gpu, side, &out, &count));
        GPC_TRY(exchange(s, out, to, from, 7 * count, &got, 10 + 2 * side, -1));
        GPC_TRY(md_split_cuda_arrive(s->gpu, s->buf_in, got / 7));
    }
    GPC_TRY(agree_no_stray(stray, step));
    int64_t sends[2];
    GPC_TRY(md_split_cuda_choose(s->gpu, sends));
    s->n_send_right = sends[0], s->n_send_left = sends[1];
    s->recv_left = s->recv_right = 0;
    GPC_TRY(forward(s, 1));
    GPC_TRY(md_split_cuda_list(s->gpu, &s->pairs));
    s->n = md_split_cuda_owned(s->gpu);
    s->builds++;
    s->since_build = 0;
    return GPC_OK;
}

static gpc_status rebuild(md_split *s, int64_t step) {
    if (s->gpu) return rebuild_on_gpu(s, step);
    GPC_TRY(migrate(s, step));
    GPC_TRY(reserve_owned(s, s->n));
    GPC_TRY(choose_ghosts(s));
    return build_list(s);
}

/* --------------------------------------------------------------- forces */

static void compute_forces(md_split *s) {
    double e = 0, w = 0;
    const double *all = s->all;
#pragma omp parallel for schedule(static) reduction(+ : e, w)
    for (int64_t i = 0; i < s->n; i++) {
        const double *p = all + 3 * i;
        double fx = 0, fy = 0, fz = 0;
        const int32_t *row = s->rows + i * s->row_cap;
        for (int32_t k = 0; k < s->count[i]; k++) {
            const double *q = all + 3 * (int64_t)row[k];
            double dx = p[0] - q[0];
            double dy = nearest(p[1] - q[1], s->box, s->inv_box);
            double dz = nearest(p[2] - q[2], s->box, s->inv_box);
            double r2 = dx * dx + dy * dy + dz * dz;
            if (r2 >= s->rc2) continue;
            double r2inv = 1.0 / r2, r6inv = r2inv * r2inv * r2inv;
            double fpair = r6inv * (48.0 * r6inv - 24.0) * r2inv;
            fx += dx * fpair, fy += dy * fpair, fz += dz * fpair;
            e += 0.5 * 4.0 * r6inv * (r6inv - 1.0); /* half: the partner adds the other */
            w += 0.5 * r2 * fpair;
        }
        s->f[3 * i] = fx, s->f[3 * i + 1] = fy, s->f[3 * i + 2] = fz;
    }
    s->potential = e;
    s->virial = w;
}

/* Forces on the owned atoms, then v += half_dt f (0: none); the pair
 * energy and virial too where `thermo` (always on the CPU). */
static gpc_status forces_kick(md_split *s, double half_dt, int thermo) {
    if (s->gpu) return md_split_cuda_forces(s->gpu, half_dt, thermo, &s->potential, &s->virial);
    compute_forces(s);
    if (half_dt != 0) {
        double *v = s->v;
        const double *f = s->f;
#pragma omp parallel for schedule(static)
        for (int64_t k = 0; k < 3 * s->n; k++)
            v[k] += half_dt * f[k];
    }
    return GPC_OK;
}

/* The half kick and drift; flags[0]: an atom moved over half the skin,
 * flags[1]: a position is no longer finite. */
static gpc_status kick_drift(md_split *s, int flags[2]) {
    const double dt = s->dt, half_dt = 0.5 * dt;
    if (s->gpu) return md_split_cuda_drift(s->gpu, half_dt, dt, flags);
    int moved = 0, bad = 0;
    double *x = s->x, *v = s->v;
    const double *f = s->f, *x_built = s->x_built, limit2 = s->limit2;
#pragma omp parallel for schedule(static) reduction(max : moved, bad)
    for (int64_t i = 0; i < s->n; i++) {
        double d2 = 0;
        for (int d = 0; d < 3; d++) {
            const int64_t k = 3 * i + d;
            v[k] += half_dt * f[k];
            x[k] += dt * v[k];
            const double dx = x[k] - x_built[k];
            d2 += dx * dx;
        }
        if (!(d2 <= limit2)) moved = 1;
        if (!isfinite(d2)) bad = 1;
    }
    flags[0] = moved, flags[1] = bad;
    return GPC_OK;
}

/* The whole crystal's sums, on every process. */
static gpc_status reduce_sums(md_split *s) {
    double local[4] = {s->potential, s->virial, 0, (double)s->pairs}, total[4];
    if (s->gpu)
        GPC_TRY(md_split_cuda_v2(s->gpu, &local[2]));
    else
        for (int64_t k = 0; k < 3 * s->n; k++)
            local[2] += s->v[k] * s->v[k];
    GPC_TRY(
        mpi_ok(MPI_Allreduce(local, total, 4, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "allreduce"));
    s->sum_potential = total[0], s->sum_virial = total[1], s->sum_v2 = total[2];
    s->sum_pairs = (int64_t)(total[3] / 2); /* the full list holds each pair twice */
    return GPC_OK;
}

/* ------------------------------------------------------------ the run */

void md_split_free(md_split *s) {
    if (!s) return;
    void *buffers[] = {s->x,    s->v,         s->f,          s->x_built, s->id,
                       s->all,  s->send_left, s->send_right, s->buf_out, s->buf_in,
                       s->rows, s->count,     s->head,       s->next};
    for (size_t k = 0; k < sizeof buffers / sizeof buffers[0]; k++)
        gpc_free(buffers[k]);
    md_split_cuda_free(s->gpu);
    gpc_free(s);
}

gpc_status md_split_create(md_split **out, const gpc_md_config *c, int rank, int world,
                           int64_t atoms, double box, const double *x, const double *v,
                           const int64_t *id) {
    *out = NULL;
    const double reach = c->cutoff + c->skin;
    if (box / world < reach)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "md: %d processes cut the box (%.4g wide) into slabs %.4g wide, narrower "
                         "than cutoff + skin (%.4g): use at most %d processes, or more cells",
                         world, box, box / world, reach, (int)floor(box / reach));
    md_split *s = gpc_calloc(1, sizeof *s);
    if (!s) return NOMEM(atoms);
    s->rank = rank, s->world = world;
    s->left = (rank - 1 + world) % world, s->right = (rank + 1) % world;
    s->box = box, s->inv_box = 1.0 / box, s->width = box / world;
    s->reach = reach, s->rc2 = c->cutoff * c->cutoff, s->reach2 = reach * reach;
    s->limit2 = 0.25 * c->skin * c->skin, s->slack = 1e-9 * box, s->dt = c->dt;
    s->rebuild_every = c->rebuild_every;
    s->total = atoms;
    s->row_cap = (int64_t)(2.0 * c->density * 4.0 * M_PI / 3.0 * reach * reach * reach) + 32;
    int64_t mine = 0;
    for (int64_t i = 0; i < atoms; i++)
        mine += owner_of(s, wrap(x[3 * i], box, s->inv_box)) == rank;
    gpc_status st = reserve_owned(s, mine);
    for (int64_t i = 0; st == GPC_OK && i < atoms; i++) {
        if (owner_of(s, wrap(x[3 * i], box, s->inv_box)) != rank) continue;
        memcpy(s->x + 3 * s->n, x + 3 * i, 3 * sizeof(double));
        memcpy(s->v + 3 * s->n, v + 3 * i, 3 * sizeof(double));
        s->id[s->n++] = id[i];
    }
    if (st == GPC_OK && c->device.type == GPC_DEVICE_CUDA) {
        /* this slab's share of the atoms and its ghosts, with room to vary */
        const double slab = (double)atoms / world * (1.0 + 2.0 * reach / s->width) * 1.25;
        const md_split_cuda_slabs slabs = {.rank = rank,
                                           .world = world,
                                           .box = box,
                                           .width = s->width,
                                           .reach = reach,
                                           .slack = s->slack};
        st = md_split_cuda_create(&s->gpu, c->device.index, &slabs, slab, s->row_cap, s->rc2,
                                  s->limit2);
        s->peers = c->gpu_dist;
        if (st == GPC_OK) st = md_split_cuda_upload(s->gpu, s->n, s->x, s->v, s->id);
    }
    {
        /* every process set up, or none goes on to the exchanges (which
         * would wait for the one that stopped) */
        int failed = st != GPC_OK, any = 0;
        gpc_status agreed =
            mpi_ok(MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "allreduce");
        if (st == GPC_OK && agreed != GPC_OK) st = agreed;
        if (st == GPC_OK && any)
            st = gpc_error(GPC_ERR_DEVICE, "md: another process could not set up its slab (its "
                                           "message says why)");
    }
    if (st == GPC_OK) st = rebuild(s, 0);
    if (st == GPC_OK) st = forces_kick(s, 0, 1);
    if (st == GPC_OK) st = reduce_sums(s);
    if (st != GPC_OK) {
        md_split_free(s);
        return st;
    }
    *out = s;
    return GPC_OK;
}

gpc_status md_split_run(md_split *s, int steps, int64_t first_step) {
    const double dt = s->dt, half_dt = 0.5 * dt;
    for (int step = 0; step < steps; step++) {
        const int64_t now = first_step + step + 1;
        /* moved over half the skin; not finite; this process's GPU failed
         * (which all learn here, every step, rather than wait for it in an
         * exchange) */
        int flags[3] = {0, 0, 0}, any[3];
        const gpc_status drifted = kick_drift(s, flags);
        flags[2] = drifted != GPC_OK;
        GPC_TRY(
            mpi_ok(MPI_Allreduce(flags, any, 3, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "allreduce"));
        if (drifted != GPC_OK) return drifted;
        if (any[2])
            return gpc_error(GPC_ERR_DEVICE,
                             "md: another process's GPU failed at step %lld (its message says why)",
                             (long long)now);
        if (any[1])
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "md: the run blew up at step %lld (an atom's position is no longer "
                             "finite): use a smaller time step than %g or a lower temperature",
                             (long long)now, dt);
        s->since_build++;
        int again = any[0];
        if (s->rebuild_every > 0) {
            again = s->since_build >= s->rebuild_every;
            if (again && any[0]) s->dangerous++;
        }
        if (again)
            GPC_TRY(rebuild(s, now));
        else
            GPC_TRY(forward(s, 0));
        GPC_TRY(forces_kick(s, half_dt, step == steps - 1));
    }
    GPC_TRY(reduce_sums(s));
    if (!isfinite(s->sum_potential) || !isfinite(s->sum_virial))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "md: the run blew up by step %lld (the energy is no longer finite): use "
                         "a smaller time step than %g or a lower temperature",
                         (long long)(first_step + steps), dt);
    return GPC_OK;
}

void md_split_sums(const md_split *s, double *potential, double *virial, double *v2,
                   int64_t *pairs) {
    *potential = s->sum_potential, *virial = s->sum_virial, *v2 = s->sum_v2;
    *pairs = s->sum_pairs;
}

int64_t md_split_builds(const md_split *s) {
    return s->builds;
}

int64_t md_split_dangerous(const md_split *s) {
    return s->dangerous;
}

const char *md_split_device_name(const md_split *s) {
    return s->gpu ? md_split_cuda_device_name(s->gpu) : NULL;
}

gpc_status md_split_gather_positions(md_split *s, double *out) {
    if (s->gpu) { /* the host's arrays have held nothing since the first build */
        s->n = md_split_cuda_owned(s->gpu);
        GPC_TRY(reserve_owned(s, s->n));
        GPC_TRY(md_split_cuda_download(s->gpu, s->x, NULL, s->id));
    }
    memset(out, 0, (size_t)(3 * s->total) * sizeof *out);
    for (int64_t i = 0; i < s->n; i++)
        for (int d = 0; d < 3; d++)
            out[3 * s->id[i] + d] = wrap(s->x[3 * i + d], s->box, s->inv_box);
    if (3 * s->total > (1 << 30))
        return gpc_error(GPC_ERR_UNSUPPORTED, "md: too many atoms to gather in one MPI call");
    return mpi_ok(
        MPI_Allreduce(MPI_IN_PLACE, out, (int)(3 * s->total), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD),
        "allreduce");
}

#else /* no MPI in this build */

gpc_status md_split_create(md_split **out, const gpc_md_config *c, int rank, int world,
                           int64_t atoms, double box, const double *x, const double *v,
                           const int64_t *id) {
    (void)c, (void)rank, (void)world, (void)atoms, (void)box, (void)x, (void)v, (void)id;
    *out = NULL;
    return gpc_error(GPC_ERR_UNSUPPORTED,
                     "md: this gpc was built without MPI, which a run over several processes "
                     "needs: install libopenmpi-dev (scripts/setup.sh) and rebuild");
}

void md_split_free(md_split *s) {
    gpc_free(s);
}

gpc_status md_split_run(md_split *s, int steps, int64_t first_step) {
    (void)s, (void)steps, (void)first_step;
    return gpc_error(GPC_ERR_UNSUPPORTED, "md: this gpc was built without MPI");
}

void md_split_sums(const md_split *s, double *potential, double *virial, double *v2,
                   int64_t *pairs) {
    (void)s;
    *potential = *virial = *v2 = 0;
    *pairs = 0;
}

int64_t md_split_builds(const md_split *s) {
    (void)s;
    return 0;
}

int64_t md_split_dangerous(const md_split *s) {
    (void)s;
    return 0;
}

const char *md_split_device_name(const md_split *s) {
    (void)s;
    return NULL;
}

gpc_status md_split_gather_positions(md_split *s, double *out) {
    (void)s, (void)out;
    return gpc_error(GPC_ERR_UNSUPPORTED, "md: this gpc was built without MPI");
}

#endif
