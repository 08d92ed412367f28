/* test_cuda_md_split.c: the GPU side of a split `gpc md` run
 * (sci/md_split_cuda.h), each part of a build and of a step against the
 * same computed on the host in float64, in one process (no MPI; the MPI
 * test runs the whole split against one process's run):
 *   - one slab of one: its ghosts are its own atoms near the two faces,
 *     shifted by the box and fed back as a neighbour would feed them. The
 *     faces' atoms are chosen in ascending order and packed with the seam's
 *     shift; the list then holds each pair within cutoff + skin (minimum
 *     image) once from each side; the forces (within 1e-10 of the largest),
 *     pair energy and virial (1e-10 relative) equal every pair summed by
 *     minimum image; a kick and drift move each atom as the host does, and
 *     the displacement flag rises past half the skin; sum v^2;
 *   - the first slab of two, on atoms strewn past the box: the wrap puts
 *     them in it (a NaN raises its flag), the atoms now in the second slab
 *     leave packed (x, v, id) in order, the others stay in order, arrivals
 *     land after them, and each face's atoms are chosen and packed.
 * Random positions on a jittered fcc crystal, seeded by GPC_TEST_SEED.
 * Exits 77 without a GPU. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sci/md_split_cuda.h"

#define CELLS 6 /* 4 * 6^3 = 864 atoms */
#define ATOMS (4 * CELLS * CELLS * CELLS)
#define CUTOFF 2.5
#define REACH 2.8 /* cutoff + skin */

static double box_side(void) {
    return cbrt(4.0 / 0.8442) * CELLS; /* in.lj's density: 10.08 */
}

static double wrap(double p, double box) {
    double w = p - box * floor(p / box);
    return w >= box || w < 0 ? 0.0 : w;
}

static double nearest(double d, double box) {
    return d - box * nearbyint(d / box);
}

/* A jittered fcc crystal (x spread by `spread` of the box past each side),
 * random velocities, ids 0.. */
static void crystal(gpc_rng *rng, double spread, double *x, double *v, int64_t *id) {
    const double a = cbrt(4.0 / 0.8442), box = box_side();
    static const double basis[4][3] = {{0, 0, 0}, {0.5, 0.5, 0}, {0.5, 0, 0.5}, {0, 0.5, 0.5}};
    int64_t n = 0;
    for (int i = 0; i < CELLS; i++)
        for (int j = 0; j < CELLS; j++)
            for (int k = 0; k < CELLS; k++)
                for (int b = 0; b < 4; b++, n++) {
                    const double c[3] = {i + basis[b][0], j + basis[b][1], k + basis[b][2]};
                    for (int d = 0; d < 3; d++) {
                        x[3 * n + d] = a * c[d] + 0.1 * a * (gpc_rng_uniform64(rng) - 0.5);
                        v[3 * n + d] = gpc_rng_normal(rng);
                    }
                    x[3 * n] += spread * box * (2 * gpc_rng_uniform64(rng) - 1);
                    id[n] = n;
                }
}

static md_split_cuda *open_slab(int rank, int world) {
    const double box = box_side();
    const md_split_cuda_slabs slabs = {.rank = rank,
                                       .world = world,
                                       .box = box,
                                       .width = box / world,
                                       .reach = REACH,
                                       .slack = 1e-9 * box};
    md_split_cuda *g = NULL;
    TEST_OK(md_split_cuda_create(&g, 0, &slabs, 3.0 * ATOMS, 64, CUTOFF * CUTOFF, 0.15 * 0.15));
    return g;
}

/* Indices of the atoms within `near` of the low face (left) or the high
 * one (right) of [lo, hi), ascending. */
static int64_t faces(const double *x, int64_t n, double lo, double hi, double near, int right,
                     int64_t *out) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        if (right ? x[3 * i] >= hi - near : x[3 * i] < lo + near) out[k++] = i;
    return k;
}

/* Both sides' packed positions: side s holds atoms want[s] shifted by
 * shift[s]. */
static void check_pack(md_split_cuda *g, const double *x, int64_t *const want[2],
                       const int64_t count[2], const double shift[2]) {
    const double *packed[2] = {NULL, NULL};
    TEST_OK(md_split_cuda_pack(g, packed));
    for (int side = 0; side < 2; side++) {
        const double *got = packed[side];
        for (int64_t a = 0; a < count[side]; a++) {
            const double *p = x + 3 * want[side][a];
            if (got[3 * a] != p[0] + shift[side] || got[3 * a + 1] != p[1] ||
                got[3 * a + 2] != p[2])
                fail_msg("side %d, packed %lld: (%g %g %g), want atom %lld at (%g %g %g) shifted "
                         "%g",
                         side, (long long)a, got[3 * a], got[3 * a + 1], got[3 * a + 2],
                         (long long)want[side][a], p[0], p[1], p[2], shift[side]);
        }
    }
}

/* One slab of one: the whole periodic crystal, its own ghosts. */
static void test_one_slab_list_forces_step(void **state) {
    (void)state;
    const double box = box_side(), near = REACH + 1e-9 * box;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 1);
    const size_t vec = 3 * ATOMS * sizeof(double);
    double *x = malloc(vec), *v = malloc(vec), *got = malloc(vec), *gv = malloc(vec);
    int64_t *id = malloc(ATOMS * sizeof *id), *send[2];
    send[0] = calloc(ATOMS, sizeof(int64_t)), send[1] = calloc(ATOMS, sizeof(int64_t));
    crystal(&rng, 0, x, v, id);
    for (int64_t k = 0; k < 3 * ATOMS; k++)
        x[k] = wrap(x[k], box);
    md_split_cuda *g = open_slab(0, 1);
    TEST_OK(md_split_cuda_upload(g, ATOMS, x, v, id));
    int bad = -1, stray = -1;
    TEST_OK(md_split_cuda_wrap(g, &bad, &stray));
    assert_int_equal(bad, 0);
    assert_int_equal(stray, 0);
    for (int side = 0; side < 2; side++) { /* one slab: its neighbours are itself */
        const double *out = NULL;
        int64_t count = -1;
        TEST_OK(md_split_cuda_leave(g, side, &out, &count));
        assert_int_equal(count, 0);
    }
    assert_int_equal(md_split_cuda_owned(g), ATOMS);

    /* ghosts: what goes right comes in from the left, and the other way */
    int64_t sends[2], want_sends[2];
    TEST_OK(md_split_cuda_choose(g, sends));
    want_sends[0] = faces(x, ATOMS, 0, box, near, 1, send[0]);
    want_sends[1] = faces(x, ATOMS, 0, box, near, 0, send[1]);
    assert_int_equal(sends[0], want_sends[0]);
    assert_int_equal(sends[1], want_sends[1]);
    assert_true(sends[0] > 0 && sends[1] > 0);
    /* the last slab's seam going right, the first's going left */
    check_pack(g, x, send, sends, (const double[2]){-box, box});
    const double *packed[2] = {NULL, NULL};
    TEST_OK(md_split_cuda_pack(g, packed));
    for (int side = 0; side < 2; side++) {
        double *room = NULL;
        TEST_OK(md_split_cuda_ghost_room(g, side, 3 * sends[side], &room));
        memcpy(room, packed[side], (size_t)(3 * sends[side]) * sizeof(double));
        TEST_OK(md_split_cuda_ghosts(g, side, sends[side]));
    }

    /* the list: every pair within reach, once from each side */
    int64_t pairs = -1, want_pairs = 0;
    TEST_OK(md_split_cuda_list(g, &pairs));
    double *f = calloc(3 * ATOMS, sizeof *f), energy = 0, virial = 0, fbig = 0;
    for (int64_t i = 0; i < ATOMS; i++)
        for (int64_t j = i + 1; j < ATOMS; j++) {
            double d[3], r2 = 0;
            for (int k = 0; k < 3; k++) {
                d[k] = nearest(x[3 * i + k] - x[3 * j + k], box);
                r2 += d[k] * d[k];
            }
            if (r2 < REACH * REACH) want_pairs += 2;
            if (r2 >= CUTOFF * CUTOFF) continue;
            const double r2inv = 1.0 / r2, r6inv = r2inv * r2inv * r2inv;
            const double fpair = r6inv * (48.0 * r6inv - 24.0) * r2inv;
            for (int k = 0; k < 3; k++)
                f[3 * i + k] += d[k] * fpair, f[3 * j + k] -= d[k] * fpair;
            energy += 4.0 * r6inv * (r6inv - 1.0);
            virial += r2 * fpair;
        }
    assert_int_equal(pairs, want_pairs);
    for (int64_t k = 0; k < 3 * ATOMS; k++)
        fbig = fmax(fbig, fabs(f[k]));

    /* forces: a whole kick (half_dt 1) makes v + f, less v is f (to the
     * rounding of v, 1e-16) */
    double e = 0, w = 0;
    TEST_OK(md_split_cuda_forces(g, 1.0, 1, &e, &w));
    TEST_OK(md_split_cuda_download(g, got, gv, NULL));
    double worst = 0;
    for (int64_t k = 0; k < 3 * ATOMS; k++)
        worst = fmax(worst, fabs(gv[k] - v[k] - f[k]));
    if (!(worst <= 1e-10 * fbig)) fail_msg("forces off by %g (largest %g)", worst, fbig);
    if (!(fabs(e - energy) <= 1e-10 * fabs(energy) && fabs(w - virial) <= 1e-10 * fabs(virial)))
        fail_msg("energy %.15g, virial %.15g; want %.15g, %.15g", e, w, energy, virial);
    memcpy(v, gv, vec);

    /* a kick and drift: v' = v + h f, x' = x + dt v' */
    const double h = 0.0025, dt = 0.005;
    int moved[2] = {-1, -1};
    TEST_OK(md_split_cuda_drift(g, h, dt, moved));
    TEST_OK(md_split_cuda_download(g, got, gv, NULL));
    double dx = 0, dv = 0, far = 0, v2 = 0, want_v2 = 0;
    for (int64_t k = 0; k < 3 * ATOMS; k++) {
        const double vk = v[k] + h * f[k], xk = x[k] + dt * vk;
        dv = fmax(dv, fabs(gv[k] - vk));
        dx = fmax(dx, fabs(got[k] - xk));
        want_v2 += gv[k] * gv[k];
    }
    for (int64_t i = 0; i < ATOMS; i++) {
        double d2 = 0;
        for (int k = 0; k < 3; k++)
            d2 += (got[3 * i + k] - x[3 * i + k]) * (got[3 * i + k] - x[3 * i + k]);
        far = fmax(far, d2);
    }
    if (!(dv <= 1e-10 * fbig && dx <= 1e-12 * box))
        fail_msg("after the drift: v off by %g, x by %g", dv, dx);
    assert_int_equal(moved[0], far > 0.15 * 0.15);
    assert_int_equal(moved[1], 0);
    TEST_OK(md_split_cuda_v2(g, &v2));
    if (!(fabs(v2 - want_v2) <= 1e-12 * want_v2)) fail_msg("v^2 %.15g, want %.15g", v2, want_v2);
    /* a drift far past half the skin raises the flag */
    TEST_OK(md_split_cuda_drift(g, 0, 1.0, moved));
    assert_int_equal(moved[0], 1);

    md_split_cuda_free(g);
    free(x), free(v), free(got), free(gv), free(id), free(send[0]), free(send[1]), free(f);
}

/* The first slab of two: wrap, leavers, stayers, arrivals, faces. */
static void test_first_of_two_migrates(void **state) {
    (void)state;
    const double box = box_side(), width = box / 2, near = REACH + 1e-9 * box;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 2);
    const size_t vec = 3 * ATOMS * sizeof(double);
    double *x = malloc(vec), *v = malloc(vec), *got = malloc(vec + 64 * 24),
           *gv = malloc(vec + 64 * 24);
    int64_t *id = malloc(ATOMS * sizeof *id), *gid = malloc((ATOMS + 64) * sizeof *gid);
    int64_t *send[2] = {calloc(ATOMS, sizeof(int64_t)), calloc(ATOMS, sizeof(int64_t))};
    crystal(&rng, 0.1, x, v, id); /* x up to a tenth of the box past each side */
    md_split_cuda *g = open_slab(0, 2);
    TEST_OK(md_split_cuda_upload(g, ATOMS, x, v, id));
    int bad = -1, stray = -1;
    TEST_OK(md_split_cuda_wrap(g, &bad, &stray));
    assert_int_equal(bad, 0);
    assert_int_equal(stray, 0); /* two slabs: the other is both neighbours */
    for (int64_t k = 0; k < 3 * ATOMS; k++)
        x[k] = wrap(x[k], box);
    TEST_OK(md_split_cuda_download(g, got, NULL, NULL));
    for (int64_t k = 0; k < 3 * ATOMS; k++)
        if (fabs(got[k] - x[k]) > 1e-12 * box) fail_msg("wrapped %g, want %g", got[k], x[k]);
    memcpy(x, got, vec); /* the GPU's rounding from here on */

    /* side 0: every atom in the second slab goes; side 1: none is left */
    const double *out = NULL;
    int64_t count = -1, stay = 0, go = 0;
    TEST_OK(md_split_cuda_leave(g, 0, &out, &count));
    for (int64_t i = 0; i < ATOMS; i++) {
        const int leaves = (int)(x[3 * i] / width) >= 1;
        if (!leaves) continue;
        const double *o = out + 7 * go++;
        assert_true(go <= count);
        for (int d = 0; d < 3; d++)
            if (o[d] != x[3 * i + d] || o[3 + d] != v[3 * i + d])
                fail_msg("leaver %lld: packed (%g, %g), want (%g, %g)", (long long)i, o[d],
                         o[3 + d], x[3 * i + d], v[3 * i + d]);
        assert_int_equal((int64_t)o[6], id[i]);
    }
    assert_int_equal(count, go);
    assert_true(go > 0 && go < ATOMS);
    TEST_OK(md_split_cuda_leave(g, 1, &out, &count));
    assert_int_equal(count, 0);
    assert_int_equal(md_split_cuda_owned(g), ATOMS - go);
    TEST_OK(md_split_cuda_download(g, got, gv, gid));
    for (int64_t i = 0; i < ATOMS; i++) {
        if ((int)(x[3 * i] / width) >= 1) continue;
        for (int d = 0; d < 3; d++)
            if (got[3 * stay + d] != x[3 * i + d] || gv[3 * stay + d] != v[3 * i + d])
                fail_msg("stayer %lld is not atom %lld", (long long)stay, (long long)i);
        assert_int_equal(gid[stay], id[i]);
        stay++;
    }

    /* arrivals land after the stayers, in order */
    double in[5][7];
    for (int a = 0; a < 5; a++) {
        for (int d = 0; d < 6; d++)
            in[a][d] = 0.1 * width * (1 + a) + d;
        in[a][6] = 1000 + a;
    }
    TEST_OK(md_split_cuda_arrive(g, &in[0][0], 5));
    const int64_t owned = md_split_cuda_owned(g);
    assert_int_equal(owned, stay + 5);
    TEST_OK(md_split_cuda_download(g, got, gv, gid));
    for (int a = 0; a < 5; a++) {
        for (int d = 0; d < 3; d++) {
            assert_true(got[3 * (stay + a) + d] == in[a][d]);
            assert_true(gv[3 * (stay + a) + d] == in[a][3 + d]);
        }
        assert_int_equal(gid[stay + a], 1000 + a);
    }

    /* faces: right of [0, width) packed as it is, left shifted by the box */
    int64_t sends[2];
    TEST_OK(md_split_cuda_choose(g, sends));
    const int64_t want[2] = {faces(got, owned, 0, width, near, 1, send[0]),
                             faces(got, owned, 0, width, near, 0, send[1])};
    assert_int_equal(sends[0], want[0]);
    assert_int_equal(sends[1], want[1]);
    check_pack(g, got, send, want, (const double[2]){0.0, box});

    /* a position no longer finite raises the wrap's flag */
    x[4] = NAN;
    TEST_OK(md_split_cuda_upload(g, ATOMS, x, v, id));
    TEST_OK(md_split_cuda_wrap(g, &bad, &stray));
    assert_int_equal(bad, 1);
    md_split_cuda_free(g);
    free(x), free(v), free(got), free(gv), free(id), free(gid), free(send[0]), free(send[1]);
}

int main(void) {
    const md_split_cuda_slabs probe = {
        .rank = 0, .world = 1, .box = 10, .width = 10, .reach = 1, .slack = 0};
    md_split_cuda *g = NULL;
    gpc_status st = md_split_cuda_create(&g, 0, &probe, 10, 8, 1, 0.01);
    if (st != GPC_OK) {
        printf("skipped: %s\n", gpc_last_error());
        return 77;
    }
    md_split_cuda_free(g);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_slab_list_forces_step),
        cmocka_unit_test(test_first_of_two_migrates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
