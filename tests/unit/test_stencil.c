/* test_stencil.c: the 3D heat-equation solver against references computed
 * another way: the exact decay of a discrete sine mode (lambda^s, lambda
 * from the mode's numbers) and its distance from the heat equation's
 * exact solution, the update written here as plain float64 loops
 * over the whole grid from a random field, and the same run split into
 * slabs, which must give the same bits as one slab. The field's checksum
 * is recomputed here from the points, and bad configs (f32 on the CPU, a
 * GPU that is not there, a GPU kernel that does not exist, more processes than planes, collectives
 * other than MPI's) are refused with the reason. */
#include "testutil.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/stencil.h"

static gpc_stencil *make(int n, int domains, double r, int kx, int ky, int kz) {
    gpc_stencil_config c;
    gpc_stencil_defaults(&c);
    c.n = n, c.domains = domains, c.r = r, c.mode[0] = kx, c.mode[1] = ky, c.mode[2] = kz;
    gpc_stencil *s = NULL;
    TEST_OK(gpc_stencil_create(&s, &c));
    return s;
}

/* A sine mode decays by exactly lambda a step, lambda computed here from its
 * definition rather than taken from the library. */
static void test_mode_decays_exactly(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 1);
    for (int trial = 0; trial < 4; trial++) {
        int n = 8 + (int)gpc_rng_below(&rng, 40), k[3];
        for (int a = 0; a < 3; a++)
            k[a] = 1 + (int)gpc_rng_below(&rng, (uint32_t)n);
        double r = 0.02 + 0.14 * gpc_rng_uniform64(&rng);
        int steps = 5 + (int)gpc_rng_below(&rng, 60);
        gpc_stencil *s = make(n, 1 + (int)gpc_rng_below(&rng, 3), r, k[0], k[1], k[2]);
        TEST_OK(gpc_stencil_run(s, steps));
        assert_int_equal(gpc_stencil_steps(s), steps);
        double h = 1.0 / (n + 1), lambda = 1;
        for (int a = 0; a < 3; a++)
            lambda -= 4 * r * pow(sin(k[a] * M_PI * h / 2), 2);
        /* the library's lambda sums the three terms in another order: the
         * same to a few units in the last place */
        gpc_stencil_config c;
        gpc_stencil_defaults(&c);
        c.n = n, c.r = r, c.mode[0] = k[0], c.mode[1] = k[1], c.mode[2] = k[2];
        double lib_lambda = gpc_stencil_lambda(&c);
        assert_true(fabs(lib_lambda - lambda) <= 4 * DBL_EPSILON);
        double scale = pow(lambda, steps), lib_scale = pow(lib_lambda, steps);
        double err = 0, lib_err = 0, big = 0;
        for (int z = 0; z < n; z++)
            for (int y = 0; y < n; y++)
                for (int x = 0; x < n; x++) {
                    double start = sin(k[0] * M_PI * (x + 1) * h) * sin(k[1] * M_PI * (y + 1) * h) *
                                   sin(k[2] * M_PI * (z + 1) * h),
                           got = gpc_stencil_at(s, x, y, z);
                    err = fmax(err, fabs(got - scale * start));
                    lib_err = fmax(lib_err, fabs(got - lib_scale * start));
                    big = fmax(big, fabs(start));
                }
        /* against the starting amplitude, 1: rounding adds about a unit a
         * step, in other modes too, which a high mode's fast decay does not
         * take away */
        if (!(err <= 1e-14 * steps))
            fail_msg("n %d mode %d,%d,%d r %g, %d steps: error %.3g", n, k[0], k[1], k[2], r, steps,
                     err);
        /* gpc_stencil_error: the same maximum against the library's
         * lambda^s, over the mode's largest value */
        double reported = gpc_stencil_error(s);
        if (!(fabs(reported - lib_err / big) <= 1e-15))
            fail_msg("gpc_stencil_error %.3g, measured here %.3g (n %d, mode %d,%d,%d, r %.17g, "
                     "%d steps)",
                     reported, lib_err / big, n, k[0], k[1], k[2], r, steps);
        /* against the heat equation's exact solution, exp(-pi^2 |k|^2 t)
         * with alpha t = steps r h^2: the field is scale u0 up to err, so
         * the error is |scale - exact| of the starting amplitude */
        double exact =
            exp(-M_PI * M_PI * (k[0] * k[0] + k[1] * k[1] + k[2] * k[2]) * r * h * h * steps);
        assert_true(fabs(gpc_stencil_heat_decay(&c, steps) - exact) <= 1e-15);
        if (!(fabs(gpc_stencil_heat_error(s) - fabs(scale - exact)) <= (err + 1e-15) / big))
            fail_msg("gpc_stencil_heat_error %.6g, |lambda^s - exp(..)| here %.6g",
                     gpc_stencil_heat_error(s), fabs(scale - exact));
        gpc_stencil_free(s);
    }
}

/* Three slabs against the update written here as plain float64 loops over
 * one grid with a zero border (u + r times the Laplacian, summed in another
 * order), from a high mode whose neighbours differ a lot. */
static void test_matches_plain_loops(void **state) {
    (void)state;
    const int n = 13, steps = 7;
    const double r = 0.15;
    const int k[3] = {2, 3, 5};
    gpc_stencil *s = make(n, 3, r, k[0], k[1], k[2]);
    TEST_OK(gpc_stencil_run(s, steps));
    /* float64 reference: the same mode on a grid with a zero border */
    const int R = n + 2;
    double *u = calloc((size_t)R * R * R, sizeof *u), *v = calloc((size_t)R * R * R, sizeof *v);
    double h = 1.0 / (n + 1);
    for (int z = 1; z <= n; z++)
        for (int y = 1; y <= n; y++)
            for (int x = 1; x <= n; x++)
                u[(z * R + y) * R + x] =
                    sin(k[0] * M_PI * x * h) * sin(k[1] * M_PI * y * h) * sin(k[2] * M_PI * z * h);
    for (int t = 0; t < steps; t++) {
        for (int z = 1; z <= n; z++)
            for (int y = 1; y <= n; y++)
                for (int x = 1; x <= n; x++) {
                    int i = (z * R + y) * R + x;
                    double lap = u[i - 1] + u[i + 1] + u[i - R] + u[i + R] + u[i - R * R] +
                                 u[i + R * R] - 6 * u[i];
                    v[i] = u[i] + r * lap;
                }
        double *tmp = u;
        u = v, v = tmp;
    }
    double err = 0;
    for (int z = 0; z < n; z++)
        for (int y = 0; y < n; y++)
            for (int x = 0; x < n; x++)
                err = fmax(err, fabs(gpc_stencil_at(s, x, y, z) -
                                     u[((z + 1) * R + (y + 1)) * R + (x + 1)]));
    if (!(err < 1e-14)) fail_msg("against plain loops: %.3g", err);
    free(u), free(v);
    gpc_stencil_free(s);
}

/* Split into 2, 3, 5 or n slabs (one plane each), the field is the same to
 * the last bit as one slab's: the halos carry exactly the planes needed. */
static void test_domains_give_the_same_bits(void **state) {
    (void)state;
    const int n = 20, steps = 25, splits[] = {1, 2, 3, 5, 20};
    double *first = NULL;
    for (size_t p = 0; p < sizeof splits / sizeof splits[0]; p++) {
        gpc_stencil *s = make(n, splits[p], 1.0 / 6, 3, 1, 2);
        TEST_OK(gpc_stencil_run(s, steps));
        double *field = malloc((size_t)n * n * n * sizeof *field);
        for (int z = 0; z < n; z++)
            for (int y = 0; y < n; y++)
                for (int x = 0; x < n; x++)
                    field[(z * n + y) * n + x] = gpc_stencil_at(s, x, y, z);
        if (!first)
            first = field;
        else {
            if (memcmp(first, field, (size_t)n * n * n * sizeof *field))
                fail_msg("%d domains differ from one", splits[p]);
            free(field);
        }
        gpc_stencil_free(s);
    }
    free(first);
}

/* A grid too large for the caches (170^3 points, 79 MB in two arrays), which
 * AVX-512 builds write with streaming stores: the same bits split or not,
 * and the exact decay. */
static void test_large_grid(void **state) {
    (void)state;
    const int n = 170, steps = 3;
    gpc_stencil *one = make(n, 1, 1.0 / 6, 2, 1, 3), *three = make(n, 3, 1.0 / 6, 2, 1, 3);
    TEST_OK(gpc_stencil_run(one, steps));
    TEST_OK(gpc_stencil_run(three, steps));
    for (int z = 0; z < n; z += 7)
        for (int y = 0; y < n; y += 3)
            for (int x = 0; x < n; x++)
                if (gpc_stencil_at(one, x, y, z) != gpc_stencil_at(three, x, y, z))
                    fail_msg("point %d,%d,%d: %.17g with one domain, %.17g with three", x, y, z,
                             gpc_stencil_at(one, x, y, z), gpc_stencil_at(three, x, y, z));
    double err = gpc_stencil_error(one);
    if (!(err < 1e-14 * steps)) fail_msg("error %.3g against the exact decay", err);
    gpc_stencil_free(one);
    gpc_stencil_free(three);
}

/* splitmix64's finalizer of the bits mixed with the index, written out
 * here from its definition (Steele, Lea and Flood 2014). */
static uint64_t hash_here(uint64_t bits, uint64_t index) {
    uint64_t z = bits ^ (index * 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The checksum is the sum of the points' hashes, the same for every split,
 * and changes with the field; gpc_stencil_plane gives what gpc_stencil_at
 * gives. */
static void test_checksum_and_planes(void **state) {
    (void)state;
    const int n = 17, steps = 9;
    gpc_stencil *one = make(n, 1, 0.1, 2, 3, 1), *four = make(n, 4, 0.1, 2, 3, 1);
    TEST_OK(gpc_stencil_run(one, steps));
    TEST_OK(gpc_stencil_run(four, steps));
    int first = -1, count = -1;
    gpc_stencil_planes(four, &first, &count);
    assert_int_equal(first, 0);
    assert_int_equal(count, n);
    uint64_t want = 0;
    double *plane = malloc((size_t)n * n * sizeof *plane);
    for (int z = 0; z < n; z++) {
        TEST_OK(gpc_stencil_plane(four, z, plane));
        for (int y = 0; y < n; y++)
            for (int x = 0; x < n; x++) {
                double value = gpc_stencil_at(one, x, y, z);
                assert_true(memcmp(&value, &plane[y * n + x], sizeof value) == 0);
                uint64_t bits;
                memcpy(&bits, &value, sizeof bits);
                want += hash_here(bits, ((uint64_t)z * n + (uint64_t)y) * n + (uint64_t)x);
            }
    }
    assert_true(gpc_stencil_checksum(one) == want);
    assert_true(gpc_stencil_checksum(four) == want);
    assert_true(gpc_stencil_at_all(four, 3, 4, 5) == gpc_stencil_at(one, 3, 4, 5));
    TEST_FAILS(gpc_stencil_plane(four, n, plane), GPC_ERR_INVALID_ARG, "is not this process's");
    assert_true(isnan(gpc_stencil_at(four, 0, 0, n)));
    TEST_OK(gpc_stencil_run(one, 1));
    assert_true(gpc_stencil_checksum(one) != want);
    free(plane);
    gpc_stencil_free(one);
    gpc_stencil_free(four);
}

static gpc_status fake_all_reduce_host(gpc_dist *d, double *values, int n) {
    (void)d, (void)values, (void)n;
    return GPC_OK;
}

static void test_bad_configs(void **state) {
    (void)state;
    gpc_stencil_config c;
    gpc_stencil *s = NULL;
    gpc_stencil_defaults(&c);
    c.r = 0.2;
    TEST_FAILS(gpc_stencil_create(&s, &c), GPC_ERR_INVALID_ARG, "at most 1/6");
    gpc_stencil_defaults(&c);
    c.n = 4, c.domains = 5;
    TEST_FAILS(gpc_stencil_create(&s, &c), GPC_ERR_INVALID_ARG, "5 domains for 4 planes");
    gpc_stencil_defaults(&c);
    c.mode[1] = 0;
    TEST_FAILS(gpc_stencil_create(&s, &c), GPC_ERR_INVALID_ARG, "mode 1,0,1");
    gpc_stencil_defaults(&c);
    c.n = 0;
    TEST_FAILS(gpc_stencil_create(&s, &c), GPC_ERR_INVALID_ARG, "n 0 is not 1 to 4096");
    gpc_stencil_defaults(&c);
    c.fp32 = 1;
    TEST_FAILS(gpc_stencil_create(&s, &c), GPC_ERR_INVALID_ARG, "f32 runs on GPUs only");
    /* a GPU that is not there: which words depend on the build and the
     * machine, but the reason is always given */
    gpc_stencil_defaults(&c);
    c.device.type = GPC_DEVICE_CUDA, c.device.index = 9999;
    assert_int_not_equal(gpc_stencil_create(&s, &c), GPC_OK);
    const char *why = gpc_last_error();
    if (!strstr(why, "built without CUDA") && !strstr(why, "no CUDA GPU is usable") &&
        !strstr(why, "cuda:9999 does not exist"))
        fail_msg("cuda:9999: %s", why);
    /* a GPU update kernel that does not exist: refused before the GPU is
     * looked for, so in any build */
    c.device.index = 0;
    setenv("GPC_STENCIL_KERNEL", "tiled", 1);
    TEST_FAILS(gpc_stencil_create(&s, &c), GPC_ERR_INVALID_ARG,
               "GPC_STENCIL_KERNEL=tiled is not a GPU kernel: use auto, vector");
    unsetenv("GPC_STENCIL_KERNEL");
    /* a tile the async kernel is not built for, likewise */
    setenv("GPC_STENCIL_ASYNC_ROWS", "12", 1);
    TEST_FAILS(gpc_stencil_create(&s, &c), GPC_ERR_INVALID_ARG,
               "GPC_STENCIL_ASYNC_ROWS=12 is not a tile of the async kernel: use 8, 16 or 32");
    unsetenv("GPC_STENCIL_ASYNC_ROWS");
    setenv("GPC_STENCIL_STREAM2_ROWS", "16", 1);
    TEST_FAILS(gpc_stencil_create(&s, &c), GPC_ERR_INVALID_ARG,
               "GPC_STENCIL_STREAM2_ROWS=16 is not a tile of the stream2 kernel: use 6, 14 or 30");
    unsetenv("GPC_STENCIL_STREAM2_ROWS");
    /* processes: a grid of fewer planes than slabs, and collectives that do
     * not carry the stencil's halos (the checks come before any message) */
    gpc_dist_ops ops;
    memset(&ops, 0, sizeof ops);
    ops.name = "nccl";
    ops.all_reduce_host = fake_all_reduce_host;
    gpc_dist dist;
    memset(&dist, 0, sizeof dist);
    dist.ops = &ops, dist.rank = 0, dist.world_size = 4;
    gpc_stencil_defaults(&c);
    c.dist = &dist, c.n = 7, c.domains = 2;
    TEST_FAILS(gpc_stencil_create(&s, &c), GPC_ERR_INVALID_ARG,
               "4 processes x 2 domains for 7 planes");
    c.n = 8;
    if (gpc_dist_have_mpi())
        TEST_FAILS(gpc_stencil_create(&s, &c), GPC_ERR_UNSUPPORTED, "halo planes go over MPI");
    else
        TEST_FAILS(gpc_stencil_create(&s, &c), GPC_ERR_UNSUPPORTED, "built without MPI");
    assert_null(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mode_decays_exactly),
        cmocka_unit_test(test_matches_plain_loops),
        cmocka_unit_test(test_domains_give_the_same_bits),
        cmocka_unit_test(test_large_grid),
        cmocka_unit_test(test_checksum_and_planes),
        cmocka_unit_test(test_bad_configs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
