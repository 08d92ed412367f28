/* test_cuda_md.c: `gpc md` on a GPU against the CPU's md.c and against sums
 * over every pair of atoms:
 *   - the neighbour list on random positions holds every pair within
 *     cutoff + skin and nothing else, in each layout (lanes per atom),
 *     with either build test and candidates taken 1, 2, 4 or 8 at a time,
 *     and after a hot run still every pair within the cutoff; the build of
 *     a warp per cell (the default) gives the rows of the build of a thread
 *     per atom slot for slot (and under GPC_MD_LIST=atoms every test
 *     against the CPU runs on the latter);
 *   - forces, energy and virial of a disordered crystal against every pair
 *     summed in float64 (float32 forces: 3e-5 of the largest);
 *   - a small crystal's trajectory, atom by atom, and its thermo rows
 *     against the CPU's, with each rebuild policy;
 *   - each kernel variant (lanes per atom 1, 2, 4, 8; the build's float32
 *     test or float64 alone; float64 or float32 forces) on 4,000 atoms
 *     of in.lj, 100 steps: every thermo row agrees with the CPU's;
 *   - the fused step (kicks and drift in the force kernel) and the
 *     unrolled force loops against the plain split step: the same rows and
 *     coordinates, and the same bits from run to run (run again under
 *     GPC_MD_STEP=fused or GPC_MD_UNROLL=4, every test against the CPU
 *     passes as it does with the defaults);
 *   - the energy and virial summed when asked for: the same bits whether
 *     each run's row is read or only the last;
 *   - LAMMPS's in.lj (32,000 atoms), 100 steps: every thermo row agrees
 *     with the CPU's to the printed digits (Temp, E_pair and TotEng within
 *     1e-7, Press within 3e-7: perturbing the CPU's velocities by 1e-8 moves
 *     row 100 by 1e-9, and by 1e-6 moves it by 1e-7; float64 forces differ
 *     from the CPU's by the order of sums only). Float32 forces (1e-6 of a
 *     net force: pair forces of 50 cancel) are held to 2e-6;
 *   - 10,000 steps of NVE at 4,000 atoms: the energy of the shifted
 *     potential (the unshifted one jumps as pairs cross the cutoff) drifts
 *     no more than the CPU's over the same run;
 *   - bad input: a GPU that does not exist, more atoms than its memory, a
 *     box too small, a time step that blows up.
 * Exits 77 without a GPU. GPC_TEST_FILTER='*small*' runs the tests of a few
 * hundred atoms only (for compute-sanitizer). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/md.h"
#include "gpc/settings.h"
#include "sci/md_cuda.h"

enum { CPU, GPU, GPU_F32 }; /* where make runs: the GPU with float64 or float32 forces */

/* lanes 0 and build_f64 0: the defaults; fused -1: gpc_md_defaults's
 * (GPC_MD_STEP), else the split (0) or fused (1) step; unroll -1:
 * GPC_MD_UNROLL, else 1, 2, 4 or 8 */
static gpc_md *make_step(int cells, double temperature, uint64_t seed, int rebuild_every, int where,
                         int lanes, int build_f64, int fused, int unroll) {
    gpc_md_config c;
    gpc_md_defaults(&c);
    c.cells = cells, c.temperature = temperature, c.seed = seed, c.rebuild_every = rebuild_every;
    if (where != CPU) c.device = (gpc_device){GPC_DEVICE_CUDA, 0};
    c.gpu_forces_f32 = where == GPU_F32;
    c.gpu_lanes = lanes, c.gpu_build_f64 = build_f64;
    if (fused >= 0) c.gpu_step_fused = fused;
    if (unroll >= 0) c.gpu_unroll = unroll;
    gpc_md *md = NULL;
    TEST_OK(gpc_md_create(&md, &c));
    return md;
}

static gpc_md *make_variant(int cells, double temperature, uint64_t seed, int rebuild_every,
                            int where, int lanes, int build_f64) {
    return make_step(cells, temperature, seed, rebuild_every, where, lanes, build_f64, -1, -1);
}

static gpc_md *make(int cells, double temperature, uint64_t seed, int rebuild_every, int where) {
    return make_variant(cells, temperature, seed, rebuild_every, where, 0, 0);
}

static double nearest(double d, double box) {
    return d - box * nearbyint(d / box);
}

/* Positions by atom id (the GPU and the CPU order atoms each their own way). */
static double *by_id(gpc_md *md) {
    int64_t n = gpc_md_atoms(md);
    double *out = malloc((size_t)(3 * n) * sizeof *out);
    const double *x = gpc_md_positions(md);
    const int64_t *id = gpc_md_ids(md);
    assert_non_null(x);
    assert_non_null(id);
    for (int64_t i = 0; i < n; i++)
        for (int d = 0; d < 3; d++)
            out[3 * id[i] + d] = x[3 * i + d];
    return out;
}

/* ---------------------------------------------------- neighbour list */

/* Every pair (i, j) of rows within reach must be in i's row and j's; no
 * row holds itself, a duplicate or a pair beyond reach. Pairs within 1e-9
 * of reach either way may go either way. */
static void expect_list_complete(const double *x, int64_t n, double box, const int32_t *counts,
                                 const int32_t *rows, int cap, double reach, const char *when) {
    unsigned char *listed = calloc((size_t)n, 1);
    int64_t checked = 0;
    for (int64_t i = 0; i < n; i++) {
        assert_true(counts[i] >= 0 && counts[i] <= cap);
        for (int k = 0; k < counts[i]; k++) {
            int32_t j = rows[i * cap + k];
            if (j < 0 || j >= n || j == i || listed[j])
                fail_msg("%s: row %lld slot %d holds %d (self, duplicate or out of range)", when,
                         (long long)i, k, j);
            listed[j] = 1;
        }
        for (int64_t j = 0; j < n; j++) {
            if (j == i) continue;
            double r2 = 0;
            for (int d = 0; d < 3; d++) {
                double dx = nearest(x[3 * i + d] - x[3 * j + d], box);
                r2 += dx * dx;
            }
            double margin = r2 - reach * reach;
            if (margin < -1e-9 && !listed[j])
                fail_msg("%s: atoms %lld and %lld are %.6f apart, within %.3f, but not listed",
                         when, (long long)i, (long long)j, sqrt(r2), reach);
            if (margin > 1e-9 && listed[j])
                fail_msg("%s: atoms %lld and %lld are %.6f apart, beyond %.3f, yet listed", when,
                         (long long)i, (long long)j, sqrt(r2), reach);
            checked += margin < 0;
        }
        for (int k = 0; k < counts[i]; k++)
            listed[rows[i * cap + k]] = 0;
    }
    assert_true(checked > 20 * n); /* about 77 an atom at in.lj's density */
    free(listed);
}

static void test_small_neighbor_list_random(void **state) {
    (void)state;
    /* 6 cells: 864 atoms, 10 cells of 2.8 wide; 5 cells: 2 cells a side,
     * where the cells at -1 and +1 are one */
    const int sizes[] = {6, 5};
    /* each layout (lanes per atom), each build test, both kinds of codes,
     * the candidates one at a time or 2, 4 or 8 together */
    const int lanes[] = {1, 2, 4, 8, 0, 8, 1, 4, 1}, build_f64[] = {0, 0, 1, 0, 1, 1, 0, 0, 0},
              f32[] = {0, 1, 0, 1, 1, 0, 1, 0, 0}, unroll[] = {0, 0, 0, 0, 0, 0, 4, 2, 8};
    for (int variant = 0; variant < 18; variant++) {
        const int s = variant % 2, l = variant / 2;
        const int cells = sizes[s];
        const int64_t n = 4 * (int64_t)cells * cells * cells;
        const double box = cells * cbrt(4.0 / 0.8442), reach = 2.8;
        gpc_md_cuda_config c = {.atoms = n,
                                .box = box,
                                .cutoff = 2.5,
                                .skin = 0.3,
                                .dt = 0.005,
                                .cells_per_side = (int)floor(box / reach),
                                .row_capacity =
                                    (int)(2 * 0.8442 * 4 * M_PI / 3 * 2.8 * 2.8 * 2.8) + 32,
                                .rebuild_every = 0,
                                .forces_f32 = f32[l],
                                .lanes = lanes[l],
                                .build_f64 = build_f64[l],
                                .unroll = unroll[l]};
        double *x = malloc((size_t)(3 * n) * sizeof *x), *v = calloc((size_t)(3 * n), sizeof *v);
        int64_t *id = malloc((size_t)n * sizeof *id);
        gpc_rng rng;
        gpc_rng_seed(&rng, test_seed(), 11 + (uint64_t)s);
        /* uniform in the box, some outside it (the build wraps them) */
        for (int64_t k = 0; k < 3 * n; k++)
            x[k] = box * (1.2 * gpc_rng_uniform64(&rng) - 0.1);
        for (int64_t i = 0; i < n; i++)
            id[i] = i;
        gpc_md_cuda *g = NULL;
        TEST_OK(gpc_md_cuda_create(&g, 0, &c, x, v, id));
        int32_t *counts = malloc((size_t)n * sizeof *counts);
        int32_t *rows = malloc((size_t)(n * c.row_capacity) * sizeof *rows);
        double *sorted = malloc((size_t)(3 * n) * sizeof *sorted);
        int64_t *sorted_id = malloc((size_t)n * sizeof *sorted_id);
        TEST_OK(gpc_md_cuda_download(g, sorted, NULL, NULL, sorted_id));
        TEST_OK(gpc_md_cuda_neighbors(g, counts, rows));
        /* the build wrapped the positions into the box and kept every atom */
        for (int64_t i = 0; i < n; i++) {
            for (int d = 0; d < 3; d++) {
                double want = x[3 * sorted_id[i] + d] - box * floor(x[3 * sorted_id[i] + d] / box);
                if (!(sorted[3 * i + d] >= 0 && sorted[3 * i + d] < box &&
                      fabs(sorted[3 * i + d] - want) < 1e-12))
                    fail_msg("atom %lld axis %d: %.15g after the build, %.15g wrapped",
                             (long long)sorted_id[i], d, sorted[3 * i + d], want);
            }
        }
        char when[64];
        snprintf(when, sizeof when, "random, %d cells, lanes %d, build %s, forces %s, unroll %d",
                 cells, lanes[l], build_f64[l] ? "f64" : "f32", f32[l] ? "f32" : "f64", unroll[l]);
        expect_list_complete(sorted, n, box, counts, rows, c.row_capacity, reach, when);
        int64_t pairs = 0;
        for (int64_t i = 0; i < n; i++)
            pairs += counts[i];
        assert_int_equal(gpc_md_cuda_pairs(g), pairs / 2);
        /* the other builder (a thread per atom; c's is a warp per cell) from
         * the same positions: the same rows, slot for slot */
        gpc_md_cuda *other = NULL;
        c.build_per_atom = 1;
        TEST_OK(gpc_md_cuda_create(&other, 0, &c, x, v, id));
        int32_t *other_counts = malloc((size_t)n * sizeof *other_counts);
        int32_t *other_rows = malloc((size_t)(n * c.row_capacity) * sizeof *other_rows);
        TEST_OK(gpc_md_cuda_neighbors(other, other_counts, other_rows));
        for (int64_t i = 0; i < n; i++) {
            if (counts[i] != other_counts[i])
                fail_msg("%s: row %lld has %d partners per cell, %d per atom", when, (long long)i,
                         counts[i], other_counts[i]);
            for (int k = 0; k < counts[i]; k++)
                if (rows[i * c.row_capacity + k] != other_rows[i * c.row_capacity + k])
                    fail_msg("%s: row %lld slot %d: %d per cell, %d per atom", when, (long long)i,
                             k, rows[i * c.row_capacity + k], other_rows[i * c.row_capacity + k]);
        }
        free(other_counts), free(other_rows);
        gpc_md_cuda_free(other);
        gpc_md_cuda_free(g);
        free(x), free(v), free(id), free(counts), free(rows), free(sorted), free(sorted_id);
    }
}

/* After a hot run (the list rebuilt on displacement), every pair now within
 * the cutoff is still listed: the skin did its job. */
static void test_small_neighbor_list_after_run(void **state) {
    (void)state;
    gpc_md *md = make(6, 3.0, test_seed(), 0, GPU);
    TEST_OK(gpc_md_run(md, 150));
    assert_true(gpc_md_neighbor_builds(md) > 3);
    /* a white-box look at the list through a second handle is not possible,
     * so compare forces with every pair: a missed pair inside the cutoff
     * shows as a force error of order 0.01 or more */
    int64_t n = gpc_md_atoms(md);
    double *want = malloc((size_t)(3 * n) * sizeof *want), energy, virial;
    gpc_md_brute_force(md, want, &energy, &virial);
    const double *got = gpc_md_forces(md);
    assert_non_null(got);
    double big = 0, err = 0;
    for (int64_t k = 0; k < 3 * n; k++)
        big = fmax(big, fabs(want[k])), err = fmax(err, fabs(got[k] - want[k]));
    if (!(err <= 1e-10 * big))
        fail_msg("after 150 steps: forces off by %.3g (largest %.3g)", err, big);
    free(want);
    gpc_md_free(md);
}

/* ------------------------------------------------------------- forces */

static void forces_match_every_pair(int where, double tolerance) {
    gpc_md *md = make(5, 1.5, test_seed(), 0, where);
    /* a disordered crystal: every atom moved by up to 0.15 along each axis */
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 3);
    double *x = gpc_md_positions(md);
    assert_non_null(x);
    for (int64_t k = 0; k < 3 * gpc_md_atoms(md); k++)
        x[k] += 0.15 * (2 * gpc_rng_uniform64(&rng) - 1);
    TEST_OK(gpc_md_compute(md));
    int64_t n = gpc_md_atoms(md);
    double *want = malloc((size_t)(3 * n) * sizeof *want), energy, virial;
    gpc_md_brute_force(md, want, &energy, &virial);
    const double *got = gpc_md_forces(md);
    assert_non_null(got);
    double big = 0, err = 0;
    for (int64_t k = 0; k < 3 * n; k++)
        big = fmax(big, fabs(want[k])), err = fmax(err, fabs(got[k] - want[k]));
    if (!(err <= tolerance * big))
        fail_msg("%s forces off by %.3g (largest %.3g)", where == GPU ? "float64" : "float32", err,
                 big);
    gpc_md_thermo t;
    gpc_md_get_thermo(md, &t);
    double pe = energy / (double)n;
    if (!(fabs(t.potential - pe) <= 1e-12 * fabs(pe)))
        fail_msg("energy %.15g, every pair gives %.15g", t.potential, pe);
    double volume = pow(gpc_md_box(md), 3), dof = 3.0 * n - 3;
    double pressure = (dof * t.temperature + virial) / (3 * volume);
    if (!(fabs(t.pressure - pressure) <= 1e-12 * fmax(1, fabs(pressure))))
        fail_msg("pressure %.15g, every pair gives %.15g", t.pressure, pressure);
    free(want);
    gpc_md_free(md);
}

/* float64 forces as every pair gives them to 1e-10 of the largest (only
 * the order of the sums differs); float32 pair forces summed in float32 to
 * 3e-5: separations from cell-relative float32 positions carry up to 5e-7,
 * and near r = 0.8, where this crystal's largest force is, a pair force
 * moves by 17 times the relative change of r (pair forces of 100 and more
 * also cancel to the net force). Energy and pressure are float64 either
 * way. */
static void test_small_forces_match_every_pair(void **state) {
    (void)state;
    forces_match_every_pair(GPU, 1e-10);
    forces_match_every_pair(GPU_F32, 3e-5);
}

/* ------------------------------------------------------- against the CPU */

static void expect_rows_agree(const gpc_md_thermo *cpu, const gpc_md_thermo *gpu, double tol,
                              double press_tol) {
    if (cpu->step != gpu->step)
        fail_msg("steps %lld and %lld", (long long)cpu->step, (long long)gpu->step);
    double d[4] = {gpu->temperature - cpu->temperature, gpu->potential - cpu->potential,
                   gpu->total - cpu->total, gpu->pressure - cpu->pressure};
    if (!(fabs(d[0]) <= tol && fabs(d[1]) <= tol && fabs(d[2]) <= tol && fabs(d[3]) <= press_tol))
        fail_msg("step %lld: CPU %.9f %.9f %.9f %.9f, GPU %.9f %.9f %.9f %.9f",
                 (long long)cpu->step, cpu->temperature, cpu->potential, cpu->total, cpu->pressure,
                 gpu->temperature, gpu->potential, gpu->total, gpu->pressure);
}

/* 500 atoms, each rebuild policy, float64 forces, and float32 with the
 * rebuild on displacement: the same trajectory atom by atom within 1e-4
 * after 60 steps (float32 forces part them by about 1e-6; a pair missed
 * within the cutoff moves atoms by 1e-3), the same thermo rows within 5e-6
 * (5e-5 for the pressure: 500 atoms average little), and the same builds
 * with a fixed interval. */
static void test_small_run_matches_cpu(void **state) {
    (void)state;
    const int every[] = {0, 1, 10, 0}, where[] = {GPU, GPU, GPU, GPU_F32};
    for (int p = 0; p < 4; p++) {
        uint64_t seed = test_seed() + (uint64_t)p;
        gpc_md *cpu = make(5, 2.0, seed, every[p], CPU),
               *gpu = make(5, 2.0, seed, every[p], where[p]);
        for (int chunk = 0; chunk <= 6; chunk++) {
            if (chunk) {
                TEST_OK(gpc_md_run(cpu, 10));
                TEST_OK(gpc_md_run(gpu, 10));
            }
            gpc_md_thermo a, b;
            gpc_md_get_thermo(cpu, &a);
            gpc_md_get_thermo(gpu, &b);
            expect_rows_agree(&a, &b, 5e-6, 5e-5);
        }
        double *xa = by_id(cpu), *xb = by_id(gpu), box = gpc_md_box(cpu);
        for (int64_t k = 0; k < 3 * gpc_md_atoms(cpu); k++)
            if (!(fabs(nearest(xa[k] - xb[k], box)) < 1e-4))
                fail_msg("rebuild policy %d, %s: coordinate %lld: CPU %.12f, GPU %.12f", every[p],
                         where[p] == GPU ? "float64" : "float32", (long long)k, xa[k], xb[k]);
        if (every[p] == 0) assert_true(gpc_md_neighbor_builds(gpu) > 1);
        if (every[p] > 0)
            assert_int_equal(gpc_md_neighbor_builds(gpu), gpc_md_neighbor_builds(cpu));
        if (every[p] == 10) assert_int_equal(gpc_md_neighbor_builds(gpu), 7); /* 0, 10, .. 60 */
        assert_int_equal(gpc_md_dangerous_builds(gpu), gpc_md_dangerous_builds(cpu));
        free(xa), free(xb);
        gpc_md_free(cpu), gpc_md_free(gpu);
    }
}

/* LAMMPS's in.lj, 100 steps, a row every 10: the CPU's figures to the
 * printed digits (float64 forces: Temp, E_pair, TotEng within 1e-7 and
 * Press within 3e-7; float32 forces within 2e-6 and 1e-5); the first row
 * is LAMMPS's own. */
static void in_lj_thermo_matches_cpu(int where, double tol, double press_tol) {
    gpc_md *cpu = make(20, 3.0, 87287, 0, CPU), *gpu = make(20, 3.0, 87287, 0, where);
    gpc_md_thermo a, b;
    gpc_md_get_thermo(gpu, &b);
    if (fabs(b.potential - -6.7733681) > 1e-7 || fabs(b.total - -2.2735087) > 1e-7 ||
        fabs(b.pressure - -3.7027964) > 1e-7)
        fail_msg("step 0 on the GPU: E_pair %.8f TotEng %.8f Press %.8f; LAMMPS -6.7733681 "
                 "-2.2735087 -3.7027964",
                 b.potential, b.total, b.pressure);
    for (int row = 0; row <= 10; row++) {
        if (row) {
            TEST_OK(gpc_md_run(cpu, 10));
            TEST_OK(gpc_md_run(gpu, 10));
        }
        gpc_md_get_thermo(cpu, &a);
        gpc_md_get_thermo(gpu, &b);
        if (gpc_setting_flag("GPC_TEST_VERBOSE"))
            printf("%4lld CPU %.9f %.9f %.9f %.9f GPU %.9f %.9f %.9f %.9f\n", (long long)a.step,
                   a.temperature, a.potential, a.total, a.pressure, b.temperature, b.potential,
                   b.total, b.pressure);
        expect_rows_agree(&a, &b, tol, press_tol);
    }
    gpc_md_free(cpu), gpc_md_free(gpu);
}

static void test_in_lj_thermo_matches_cpu(void **state) {
    (void)state;
    in_lj_thermo_matches_cpu(GPU, 1e-7, 3e-7);
    in_lj_thermo_matches_cpu(GPU_F32, 2e-6, 1e-5);
}

/* 4,000 atoms of in.lj, 100 steps, a row every 10, each kernel variant
 * against the CPU: float64 forces to the printed digits (as the 32,000
 * atoms of in.lj above), float32 forces within 5e-6 and 3e-5 for the
 * pressure (their rounding, averaged over 8 times fewer atoms). */
static void test_variants_match_cpu(void **state) {
    (void)state;
    gpc_md *cpu = make(10, 3.0, 87287, 0, CPU);
    gpc_md_thermo want[11];
    for (int row = 0; row <= 10; row++) {
        if (row) TEST_OK(gpc_md_run(cpu, 10));
        gpc_md_get_thermo(cpu, &want[row]);
    }
    gpc_md_free(cpu);
    const int lanes[] = {1, 2, 4, 8};
    for (int v = 0; v < 16; v++) {
        const int where = v / 8 ? GPU_F32 : GPU, l = lanes[v % 4], build_f64 = (v / 4) % 2;
        gpc_md *gpu = make_variant(10, 3.0, 87287, 0, where, l, build_f64);
        for (int row = 0; row <= 10; row++) {
            if (row) TEST_OK(gpc_md_run(gpu, 10));
            gpc_md_thermo got;
            gpc_md_get_thermo(gpu, &got);
            if (gpc_setting_flag("GPC_TEST_VERBOSE") || row == 10)
                printf("%s lanes %d build %s step %3lld: GPU %.9f %.9f %.9f %.9f\n",
                       where == GPU ? "f64" : "f32", l, build_f64 ? "f64" : "f32",
                       (long long)got.step, got.temperature, got.potential, got.total,
                       got.pressure);
            if (where == GPU)
                expect_rows_agree(&want[row], &got, 1e-7, 3e-7);
            else
                expect_rows_agree(&want[row], &got, 5e-6, 3e-5);
        }
        gpc_md_free(gpu);
    }
}

/* A kernel variant against the plain split step (an integration kernel,
 * then the force loop one partner at a time), 4,000 atoms of in.lj, runs
 * of 10, 1, 37 and 52 steps (a run's first step is the integration
 * kernel's, its last the plain forces'): the fused step (the force kernel
 * ends each step and begins the next) and the unrolled loops (2, 4 or 8
 * partners' loads issued together) do the same arithmetic in the same
 * order, so the thermo rows and every coordinate agree bit for bit where
 * the compiler contracts both alike, which the test reports. It holds
 * them within 1e-12 with float64 forces; with float32 ones, where a last
 * bit of one pair force would grow to about 1e-8 over 100 steps, within
 * 1e-7 (rows; 1e-6 coordinates), still far below the 1e-3 of a pair
 * missed or counted twice. And the variant again: the same bits, run to
 * run. */
static void expect_like_plain(int where, int lanes, int fused, int unroll) {
    const int runs[] = {10, 1, 37, 52};
    const char *name = where == GPU ? "f64" : "f32";
    gpc_md *plain = make_step(10, 3.0, 87287, 0, where, lanes, 0, 0, 1),
           *variant = make_step(10, 3.0, 87287, 0, where, lanes, 0, fused, unroll),
           *again = make_step(10, 3.0, 87287, 0, where, lanes, 0, fused, unroll);
    int bitwise = 1;
    for (int r = 0; r < 4; r++) {
        TEST_OK(gpc_md_run(plain, runs[r]));
        TEST_OK(gpc_md_run(variant, runs[r]));
        TEST_OK(gpc_md_run(again, runs[r]));
        gpc_md_thermo a, b, c;
        gpc_md_get_thermo(plain, &a);
        gpc_md_get_thermo(variant, &b);
        gpc_md_get_thermo(again, &c);
        if (where == GPU)
            expect_rows_agree(&a, &b, 1e-12, 1e-12);
        else
            expect_rows_agree(&a, &b, 1e-7, 1e-6);
        if (memcmp(&b, &c, sizeof b) != 0)
            fail_msg("%s lanes %d step %s unroll %d: two runs differ at step %lld", name, lanes,
                     fused ? "fused" : "split", unroll, (long long)b.step);
        bitwise &= memcmp(&a, &b, sizeof a) == 0;
    }
    assert_int_equal(gpc_md_neighbor_builds(plain), gpc_md_neighbor_builds(variant));
    double *xa = by_id(plain), *xb = by_id(variant), box = gpc_md_box(plain);
    for (int64_t k = 0; k < 3 * gpc_md_atoms(plain); k++) {
        if (!(fabs(nearest(xa[k] - xb[k], box)) <= (where == GPU ? 1e-12 : 1e-6)))
            fail_msg("%s lanes %d step %s unroll %d: coordinate %lld: plain %.17g, variant %.17g",
                     name, lanes, fused ? "fused" : "split", unroll, (long long)k, xa[k], xb[k]);
        bitwise &= xa[k] == xb[k];
    }
    printf("%s forces, lanes %d, %s step, unroll %d: %s the plain split step's\n", name, lanes,
           fused ? "fused" : "split", unroll,
           bitwise ? "the bits of" : "within the tolerance of, not the bits of");
    free(xa), free(xb);
    gpc_md_free(plain), gpc_md_free(variant), gpc_md_free(again);
}

static void test_step_variants_match_plain(void **state) {
    (void)state;
    const int fused[] = {1, 0, 0, 1, 1}, unroll[] = {1, 2, 4, 4, 8}, lanes[] = {1, 4};
    for (int where = GPU; where <= GPU_F32; where++)
        for (int l = 0; l < 2; l++)
            for (int v = 0; v < 5; v++)
                expect_like_plain(where, lanes[l], fused[v], unroll[v]);
}

/* The pair energy and virial of a run are summed when first asked for:
 * runs of 20 steps whose rows are read after each and the same runs read
 * only at the end give the same bits, forces included, and a second read
 * changes nothing. One run of 100 steps agrees to the rounding of the
 * velocity's half kicks, which a run's end and the next one's start take
 * apart (measured on an H200: the last bit of a float64 row): 1e-11 with
 * float64 forces, 1e-6 with float32 ones. */
static void test_thermo_when_asked(void **state) {
    (void)state;
    for (int where = GPU; where <= GPU_F32; where++) {
        gpc_md *each = make_step(6, 3.0, test_seed(), 0, where, 1, 0, 0, 1),
               *unread = make_step(6, 3.0, test_seed(), 0, where, 1, 0, 0, 1),
               *whole = make_step(6, 3.0, test_seed(), 0, where, 1, 0, 0, 1);
        gpc_md_thermo a, b, c, again;
        for (int r = 0; r < 5; r++) {
            TEST_OK(gpc_md_run(each, 20));
            gpc_md_get_thermo(each, &a);
            TEST_OK(gpc_md_run(unread, 20));
        }
        TEST_OK(gpc_md_run(whole, 100));
        gpc_md_get_thermo(unread, &b);
        gpc_md_get_thermo(whole, &c);
        gpc_md_get_thermo(unread, &again);
        assert_int_equal(a.step, 100);
        double tol = where == GPU ? 1e-11 : 1e-6;
        int near = fabs(c.temperature - a.temperature) <= tol * fabs(a.temperature) &&
                   fabs(c.potential - a.potential) <= tol * fabs(a.potential) &&
                   fabs(c.pressure - a.pressure) <= tol * fabs(a.pressure) && c.step == a.step;
        if (memcmp(&a, &b, sizeof a) != 0 || !near || memcmp(&b, &again, sizeof b) != 0)
            fail_msg("%s: step 100 read after each run %.17g %.17g %.17g, read at the end "
                     "%.17g %.17g %.17g, one run %.17g %.17g %.17g",
                     where == GPU ? "f64" : "f32", a.temperature, a.potential, a.pressure,
                     b.temperature, b.potential, b.pressure, c.temperature, c.potential,
                     c.pressure);
        const int64_t n3 = 3 * gpc_md_atoms(each);
        double *fa = malloc((size_t)n3 * sizeof *fa);
        const double *fb = gpc_md_forces(unread), *got = gpc_md_forces(each);
        assert_non_null(fb);
        assert_non_null(got);
        memcpy(fa, got, (size_t)n3 * sizeof *fa);
        fb = gpc_md_forces(unread);
        assert_non_null(fb);
        assert_memory_equal(fa, fb, (size_t)n3 * sizeof *fa);
        free(fa);
        gpc_md_free(each), gpc_md_free(unread), gpc_md_free(whole);
    }
}

/* Pairs closer than the cutoff, over every pair. */
static int64_t pairs_inside(gpc_md *md, double cutoff) {
    const double *x = gpc_md_positions(md), box = gpc_md_box(md);
    int64_t n = gpc_md_atoms(md), count = 0;
    assert_non_null(x);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = i + 1; j < n; j++) {
            double r2 = 0;
            for (int d = 0; d < 3; d++) {
                double dx = nearest(x[3 * i + d] - x[3 * j + d], box);
                r2 += dx * dx;
            }
            count += r2 < cutoff * cutoff;
        }
    return count;
}

/* The largest |E(t) - E(0)| per atom of the shifted potential's energy
 * over `steps`, sampled every `every` steps. */
static double drift_of(gpc_md *md, int steps, int every) {
    const double rc = 2.5, vc = 4 * (pow(rc, -12) - pow(rc, -6)), n = (double)gpc_md_atoms(md);
    double start = 0, worst = 0;
    for (int s = 0; s <= steps; s += every) {
        if (s) TEST_OK(gpc_md_run(md, every));
        gpc_md_thermo t;
        gpc_md_get_thermo(md, &t);
        double e = t.total - (double)pairs_inside(md, rc) * vc / n;
        if (s == 0) start = e;
        worst = fmax(worst, fabs(e - start));
    }
    return worst;
}

/* 4,000 atoms of in.lj, 10,000 steps of NVE. On the CPU the shifted
 * potential's energy falls by about 8e-4 per atom in the first 500 steps
 * (the melt, at time step 0.005), then wanders within 2e-4 of that
 * (largest deviation 1.2e-3: seed 1, sampled every 500 steps). The two
 * trajectories part after a few thousand steps, so their deviations are
 * two draws of the same integrator's error: the GPU's may exceed the CPU's
 * by such spread but not by a factor 2, which float32's rounding growing
 * into a trend, or a wrong half kick, would pass at once. */
static void test_energy_drift_like_cpu(void **state) {
    (void)state;
    gpc_md *cpu = make(10, 3.0, 87287, 0, CPU), *gpu = make(10, 3.0, 87287, 0, GPU),
           *gpu32 = make(10, 3.0, 87287, 0, GPU_F32);
    double a = drift_of(cpu, 10000, 500), b = drift_of(gpu, 10000, 500),
           b32 = drift_of(gpu32, 10000, 500);
    printf("energy drift per atom over 10,000 steps: CPU %.3g, GPU %.3g, GPU float32 forces %.3g\n",
           a, b, b32);
    if (!(b <= 2 * a + 1e-5)) fail_msg("GPU drift %.3g per atom, CPU %.3g", b, a);
    if (!(b32 <= 2 * a + 1e-5)) fail_msg("GPU drift with float32 forces %.3g, CPU %.3g", b32, a);
    gpc_md_free(cpu), gpc_md_free(gpu), gpc_md_free(gpu32);
}

/* ---------------------------------------------------------- bad input */

static void test_small_bad_input(void **state) {
    (void)state;
    gpc_md_config c;
    gpc_md *md = NULL;
    gpc_md_defaults(&c);
    c.device = (gpc_device){GPC_DEVICE_CUDA, 999};
    TEST_FAILS(gpc_md_create(&md, &c), GPC_ERR_INVALID_ARG, "cuda:999 does not exist");
    gpc_md_defaults(&c);
    c.device = (gpc_device){GPC_DEVICE_CUDA, 0};
    c.cells = 300, c.density = 9; /* 108 million atoms, 1,700 partners each: ~700 GiB */
    TEST_FAILS(gpc_md_create(&md, &c), GPC_ERR_NOMEM, "GiB of GPU memory, more than cuda:0 has");
    gpc_md_defaults(&c);
    c.device = (gpc_device){GPC_DEVICE_CUDA, 0};
    c.cells = 3;
    TEST_FAILS(gpc_md_create(&md, &c), GPC_ERR_INVALID_ARG, "use at least 4 cells");
    assert_null(md);
    gpc_md_defaults(&c);
    c.device = (gpc_device){GPC_DEVICE_CUDA, 0};
    c.cells = 5, c.dt = 0.5, c.seed = test_seed();
    TEST_OK(gpc_md_create(&md, &c));
    TEST_FAILS(gpc_md_run(md, 200), GPC_ERR_INVALID_ARG, "the run blew up");
    gpc_md_free(md);
}

int main(void) {
    gpc_md_cuda_config probe = {.atoms = 4,
                                .box = 10,
                                .cutoff = 1,
                                .skin = 0.1,
                                .dt = 0.001,
                                .cells_per_side = 2,
                                .row_capacity = 8};
    gpc_status st = gpc_md_cuda_check(0, &probe);
    if (st == GPC_ERR_UNSUPPORTED || st == GPC_ERR_INVALID_ARG) {
        printf("skipped: %s\n", gpc_last_error());
        return 77;
    }
    /* GPC_TEST_FILTER='*small*' runs the tests of a few hundred atoms */
    if (gpc_setting_given("GPC_TEST_FILTER"))
        cmocka_set_test_filter(gpc_setting_given("GPC_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_neighbor_list_random),
        cmocka_unit_test(test_small_neighbor_list_after_run),
        cmocka_unit_test(test_small_forces_match_every_pair),
        cmocka_unit_test(test_small_run_matches_cpu),
        cmocka_unit_test(test_small_bad_input),
        cmocka_unit_test(test_variants_match_cpu),
        cmocka_unit_test(test_step_variants_match_plain),
        cmocka_unit_test(test_thermo_when_asked),
        cmocka_unit_test(test_in_lj_thermo_matches_cpu),
        cmocka_unit_test(test_energy_drift_like_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
