/* test_md.c: Lennard-Jones molecular dynamics against references computed
 * another way: LAMMPS's figures for its in.lj benchmark at step 0 (the fcc
 * lattice fixes them, whatever the velocities), every pair of atoms summed
 * directly for forces, energy and virial, central finite differences of the
 * energy for the forces, and the invariants of constant-energy dynamics
 * (energy, zero total momentum, and no dependence on when the neighbour
 * list is rebuilt). */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/md.h"

static gpc_md *make(int cells, double temperature, uint64_t seed, int rebuild_every) {
    gpc_md_config c;
    gpc_md_defaults(&c);
    c.cells = cells, c.temperature = temperature, c.seed = seed, c.rebuild_every = rebuild_every;
    gpc_md *md = NULL;
    TEST_OK(gpc_md_create(&md, &c));
    return md;
}

/* Moves every atom by up to `amount` along each axis, then recomputes. */
static void jiggle(gpc_md *md, double amount, uint64_t seed) {
    gpc_rng rng;
    gpc_rng_seed(&rng, seed, 3);
    double *x = gpc_md_positions(md);
    for (int64_t k = 0; k < 3 * gpc_md_atoms(md); k++)
        x[k] += amount * (2 * gpc_rng_uniform64(&rng) - 1);
    TEST_OK(gpc_md_compute(md));
}

/* LAMMPS (Debian's lammps 20220106, `lmp -in in.lj`, 32,000 atoms) prints
 * at step 0: Temp 3, E_pair -6.7733681, TotEng -2.2735087, Press -3.7027964.
 * On a perfect lattice every atom sees the same neighbours, so a smaller
 * crystal gives the same per-atom figures. */
static void test_lattice_matches_lammps(void **state) {
    (void)state;
    const int sizes[] = {20, 5};
    for (int s = 0; s < 2; s++) {
        gpc_md *md = make(sizes[s], 3.0, test_seed(), 20);
        gpc_md_thermo t;
        gpc_md_get_thermo(md, &t);
        assert_int_equal(gpc_md_atoms(md), 4 * sizes[s] * sizes[s] * sizes[s]);
        assert_true(fabs(t.temperature - 3.0) < 1e-12);
        /* the kinetic energy per atom is (3N - 3) T / 2N, N's only trace */
        double n = (double)gpc_md_atoms(md), ke = (3 * n - 3) * 3.0 / (2 * n);
        double total = sizes[s] == 20 ? -2.2735087 : -6.7733681 + ke;
        if (fabs(t.potential - -6.7733681) > 1e-7 || fabs(t.total - total) > 1e-7)
            fail_msg("%d cells: E_pair %.8f TotEng %.8f, LAMMPS -6.7733681 and %.8f", sizes[s],
                     t.potential, t.total, total);
        if (sizes[s] == 20 && fabs(t.pressure - -3.7027964) > 1e-7)
            fail_msg("Press %.8f, LAMMPS -3.7027964", t.pressure);
        gpc_md_free(md);
    }
}

static void expect_brute_force(gpc_md *md, const char *when) {
    int64_t n = gpc_md_atoms(md);
    double *want = malloc((size_t)(3 * n) * sizeof *want), energy, virial;
    gpc_md_brute_force(md, want, &energy, &virial);
    const double *got = gpc_md_forces(md);
    double big = 0, err = 0;
    for (int64_t k = 0; k < 3 * n; k++)
        big = fmax(big, fabs(want[k])), err = fmax(err, fabs(got[k] - want[k]));
    if (!(err <= 1e-12 * big)) fail_msg("%s: forces off by %.3g (largest %.3g)", when, err, big);
    gpc_md_thermo t;
    gpc_md_get_thermo(md, &t);
    double pe = energy / (double)n;
    if (!(fabs(t.potential - pe) <= 1e-12 * fabs(pe)))
        fail_msg("%s: energy %.15g, every pair gives %.15g", when, t.potential, pe);
    free(want);
}

/* The neighbour list finds exactly the pairs inside the cutoff, across the
 * box's faces too: forces and energy as every pair of atoms gives them, on a
 * disordered crystal and after atoms moved (and were re-sorted). */
static void test_forces_match_every_pair(void **state) {
    (void)state;
    const int sizes[] = {4, 6};
    for (int s = 0; s < 2; s++) {
        gpc_md *md = make(sizes[s], 1.5, test_seed() + (uint64_t)s, 0);
        jiggle(md, 0.15, test_seed());
        expect_brute_force(md, "disordered lattice");
        TEST_OK(gpc_md_run(md, 60));
        assert_true(gpc_md_neighbor_builds(md) > 2);
        expect_brute_force(md, "after 60 steps");
        gpc_md_free(md);
    }
}

/* The potential energy with every pair, for finite differences. */
static double energy_of(const gpc_md *md) {
    int64_t n = gpc_md_atoms(md);
    double *scratch = malloc((size_t)(3 * n) * sizeof *scratch), energy, virial;
    gpc_md_brute_force(md, scratch, &energy, &virial);
    free(scratch);
    return energy;
}

/* The nearest distance from atom i to the cutoff sphere of any partner (the
 * energy jumps there, which finite differences must not straddle). */
static double gap_to_cutoff(gpc_md *md, int64_t i) {
    const double *x = gpc_md_positions(md);
    double box = gpc_md_box(md), gap = INFINITY;
    for (int64_t j = 0; j < gpc_md_atoms(md); j++) {
        if (j == i) continue;
        double r2 = 0;
        for (int d = 0; d < 3; d++) {
            double dx = x[3 * i + d] - x[3 * j + d];
            dx -= box * nearbyint(dx / box);
            r2 += dx * dx;
        }
        gap = fmin(gap, fabs(sqrt(r2) - 2.5));
    }
    return gap;
}

static void test_forces_are_energy_gradient(void **state) {
    (void)state;
    gpc_md *md = make(4, 1.0, test_seed(), 0);
    jiggle(md, 0.1, test_seed() + 1);
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 5);
    double *x = gpc_md_positions(md);
    const double h = 1e-5;
    int checked = 0;
    for (int trial = 0; trial < 40; trial++) {
        int64_t i = gpc_rng_below(&rng, (uint32_t)gpc_md_atoms(md));
        int d = (int)gpc_rng_below(&rng, 3);
        if (gap_to_cutoff(md, i) < 10 * h) continue;
        double force = gpc_md_forces(md)[3 * i + d], orig = x[3 * i + d];
        x[3 * i + d] = orig + h;
        double plus = energy_of(md);
        x[3 * i + d] = orig - h;
        double minus = energy_of(md);
        x[3 * i + d] = orig;
        double want = -(plus - minus) / (2 * h);
        /* central differences: error h^2 |E'''| / 6, far below 1e-6 of a force near 1 */
        if (!(fabs(force - want) <= 1e-6 * fmax(1.0, fabs(want))))
            fail_msg("atom %lld axis %d: force %.10g, -dE/dx %.10g", (long long)i, d, force, want);
        checked++;
    }
    assert_true(checked >= 30);
    gpc_md_free(md);
}

/* The pairs closer than the cutoff, counted over every pair. */
static int64_t pairs_inside(gpc_md *md) {
    const double *x = gpc_md_positions(md);
    double box = gpc_md_box(md);
    int64_t n = gpc_md_atoms(md), count = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = i + 1; j < n; j++) {
            double r2 = 0;
            for (int d = 0; d < 3; d++) {
                double dx = x[3 * i + d] - x[3 * j + d];
                dx -= box * nearbyint(dx / box);
                r2 += dx * dx;
            }
            count += r2 < 2.5 * 2.5;
        }
    return count;
}

/* Constant energy, zero momentum. The unshifted cutoff makes the energy
 * jump by V(rc) whenever a pair crosses it, which the motion never sees; the
 * energy of the shifted potential V(r) - V(rc), continuous at the cutoff, is
 * what velocity Verlet conserves: 500 atoms melting for 400 steps of 0.002
 * keep it within 1e-4 of its start per atom. The momentum stays zero to
 * rounding. */
static void test_energy_and_momentum_conserved(void **state) {
    (void)state;
    gpc_md_config c;
    gpc_md_defaults(&c);
    c.cells = 5, c.temperature = 1.2, c.dt = 0.002, c.seed = test_seed();
    gpc_md *md = NULL;
    TEST_OK(gpc_md_create(&md, &c));
    const double vc = 4 * (pow(2.5, -12) - pow(2.5, -6)), n = (double)gpc_md_atoms(md);
    gpc_md_thermo start, end;
    gpc_md_get_thermo(md, &start);
    double shifted0 = start.total - (double)pairs_inside(md) * vc / n;
    TEST_OK(gpc_md_run(md, 400));
    gpc_md_get_thermo(md, &end);
    double shifted1 = end.total - (double)pairs_inside(md) * vc / n;
    if (!(fabs(shifted1 - shifted0) < 1e-4))
        fail_msg("energy of the shifted potential per atom %.8f at the start, %.8f after 400 "
                 "steps (unshifted %.8f, %.8f)",
                 shifted0, shifted1, start.total, end.total);
    /* it really moved: the crystal melts at 1.2, trading kinetic for potential energy */
    assert_true(fabs(end.temperature - start.temperature) > 0.05);
    const double *v = gpc_md_velocities(md);
    for (int d = 0; d < 3; d++) {
        double p = 0;
        for (int64_t i = 0; i < gpc_md_atoms(md); i++)
            p += v[3 * i + d];
        if (!(fabs(p) < 1e-10)) fail_msg("total momentum along axis %d: %.3g", d, p);
    }
    gpc_md_free(md);
}

/* Rebuilding the list every step, every 10 steps, or when an atom moved
 * over half the skin: the same trajectory (atom by atom, through the ids),
 * up to rounding in the order of the sums. */
static void test_rebuild_policies_agree(void **state) {
    (void)state;
    const int every[] = {1, 10, 0};
    double *pos[3];
    int64_t n = 0;
    for (int p = 0; p < 3; p++) {
        gpc_md *md = make(5, 2.0, test_seed(), every[p]);
        TEST_OK(gpc_md_run(md, 30));
        n = gpc_md_atoms(md);
        pos[p] = calloc((size_t)(3 * n), sizeof(double));
        const double *x = gpc_md_positions(md);
        const int64_t *id = gpc_md_ids(md);
        for (int64_t i = 0; i < n; i++)
            for (int d = 0; d < 3; d++)
                pos[p][3 * id[i] + d] = x[3 * i + d];
        gpc_md_free(md);
    }
    for (int p = 1; p < 3; p++)
        for (int64_t k = 0; k < 3 * n; k++) {
            double dx = pos[p][k] - pos[0][k], box = 5 * cbrt(4.0 / 0.8442);
            dx -= box * nearbyint(dx / box); /* each may be wrapped differently */
            if (!(fabs(dx) < 1e-9))
                fail_msg("rebuild policy %d: coordinate %lld off by %.3g", every[p], (long long)k,
                         dx);
        }
    for (int p = 0; p < 3; p++)
        free(pos[p]);
}

/* A time step far too long blows the crystal apart: the run stops with an
 * error saying so instead of going on with infinities (or writing outside
 * the cell grid). Fixed-interval rebuilds too far apart for a hot gas are
 * counted as dangerous; the default policy has none by construction. */
static void test_blow_up_and_dangerous_builds(void **state) {
    (void)state;
    gpc_md_config c;
    gpc_md_defaults(&c);
    c.cells = 5, c.dt = 0.5, c.seed = test_seed();
    gpc_md *md = NULL;
    TEST_OK(gpc_md_create(&md, &c));
    TEST_FAILS(gpc_md_run(md, 200), GPC_ERR_INVALID_ARG, "the run blew up");
    gpc_md_free(md);
    for (int every = 0; every <= 40; every += 40) {
        /* a hot gas: atoms cross half the skin (0.15) in a few steps */
        gpc_md_defaults(&c);
        c.cells = 5, c.temperature = 10.0, c.dt = 0.002, c.seed = test_seed();
        c.rebuild_every = every;
        gpc_md *hot = NULL;
        TEST_OK(gpc_md_create(&hot, &c));
        gpc_status st = gpc_md_run(hot, 45); /* one fixed rebuild, at step 40 */
        if (every) {
            /* counted at the rebuild, whatever the pairs missed before it did next */
            assert_true(gpc_md_dangerous_builds(hot) == 1);
            gpc_clear_error();
        } else {
            assert_int_equal(st, GPC_OK);
            assert_int_equal(gpc_md_dangerous_builds(hot), 0);
        }
        gpc_md_free(hot);
    }
}

static void test_bad_configs(void **state) {
    (void)state;
    gpc_md_config c;
    gpc_md *md = NULL;
    gpc_md_defaults(&c);
    c.cells = 3; /* 5.04 wide, cutoff + skin 2.8 */
    TEST_FAILS(gpc_md_create(&md, &c), GPC_ERR_INVALID_ARG,
               "must be more than twice cutoff + skin (2.8): use at least 4 cells");
    gpc_md_defaults(&c);
    c.cells = 0;
    TEST_FAILS(gpc_md_create(&md, &c), GPC_ERR_INVALID_ARG, "cells 0 is not 1 to 300");
    gpc_md_defaults(&c);
    c.density = -1;
    TEST_FAILS(gpc_md_create(&md, &c), GPC_ERR_INVALID_ARG, "density -1");
    gpc_md_defaults(&c);
    c.dt = 0;
    TEST_FAILS(gpc_md_create(&md, &c), GPC_ERR_INVALID_ARG, "time step 0");
    gpc_md_defaults(&c);
    c.skin = -0.1;
    TEST_FAILS(gpc_md_create(&md, &c), GPC_ERR_INVALID_ARG, "skin -0.1 is negative");
    gpc_md_defaults(&c);
    c.temperature = NAN;
    TEST_FAILS(gpc_md_create(&md, &c), GPC_ERR_INVALID_ARG, "temperature nan");
    gpc_md_defaults(&c);
    c.gpu_lanes = 3; /* checked on the CPU too, before any device is asked */
    TEST_FAILS(gpc_md_create(&md, &c), GPC_ERR_INVALID_ARG, "3 GPU lanes per atom: use 1, 2, 4");
    assert_null(md);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lattice_matches_lammps),
        cmocka_unit_test(test_forces_match_every_pair),
        cmocka_unit_test(test_forces_are_energy_gradient),
        cmocka_unit_test(test_energy_and_momentum_conserved),
        cmocka_unit_test(test_rebuild_policies_agree),
        cmocka_unit_test(test_blow_up_and_dangerous_builds),
        cmocka_unit_test(test_bad_configs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
