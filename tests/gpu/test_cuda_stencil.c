/* test_cuda_stencil.c: the stencil on a GPU against the CPU and against the
 * exact decay of its sine mode.
 *
 * f64: the GPU computes each point with the CPU's operations in the CPU's
 * order (one fused multiply-add of c6 u and r s, s summed x-1, x+1, y-1,
 * y+1, z-1, z+1, each rounded to nearest) from the CPU's starting bits, so
 * the fields must be equal bit for bit, not merely close; a failure prints
 * the largest distance in units in the last place. f32: within 5e-7 a step
 * (plus 1e-6) of the f64 field, whose amplitude is 1: each step rounds
 * five additions of terms up to 1, a product and the fused multiply-add
 * (under 4.2e-7 at worst for r <= 1/6, and the scheme never amplifies an
 * error). Slabs on one GPU, whose halos go by device copies on a second
 * stream while the inside is updated, must give one slab's bits, in f64
 * and f32, down to slabs of one and two planes; so must a run split into
 * several calls. Bad input: a GPU index that does not exist and a grid
 * larger than the GPU. Exits 77 without a GPU. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/stencil.h"

static int gpu_count(void) {
    const gpc_backend *b = gpc_backend_get(GPC_DEVICE_CUDA);
    return b && b->device_count ? b->device_count() : 0;
}

static gpc_device cuda0(void) {
    gpc_device d = {GPC_DEVICE_CUDA, 0};
    return d;
}

static gpc_stencil *make(int n, int domains, double r, const int k[3], gpc_device device, int fp32,
                         int steps) {
    gpc_stencil_config c;
    gpc_stencil_defaults(&c);
    c.n = n, c.domains = domains, c.r = r, c.device = device, c.fp32 = fp32;
    memcpy(c.mode, k, sizeof c.mode);
    gpc_stencil *s = NULL;
    TEST_OK(gpc_stencil_create(&s, &c));
    TEST_OK(gpc_stencil_run(s, steps));
    return s;
}

/* The whole field as doubles, plane after plane. */
static double *field_of(const gpc_stencil *s, int n) {
    double *f = malloc((size_t)n * n * n * sizeof *f);
    assert_non_null(f);
    for (int z = 0; z < n; z++)
        TEST_OK(gpc_stencil_plane(s, z, f + (size_t)z * n * n));
    return f;
}

/* Largest distance between a and b in units in the last place (as f64). */
static double ulps(const double *a, const double *b, size_t count, size_t *where) {
    double worst = 0;
    for (size_t i = 0; i < count; i++) {
        int64_t x, y;
        memcpy(&x, &a[i], sizeof x);
        memcpy(&y, &b[i], sizeof y);
        double d = fabs((double)x - (double)y);
        if (d > worst) worst = d, *where = i;
    }
    return worst;
}

static void same_bits(const char *what, const gpc_stencil *a, const gpc_stencil *b, int n) {
    double *fa = field_of(a, n), *fb = field_of(b, n);
    size_t count = (size_t)n * n * n, where = 0;
    if (memcmp(fa, fb, count * sizeof *fa) != 0) {
        double worst = ulps(fa, fb, count, &where);
        fail_msg("%s: fields differ, by up to %.0f ulp at (%zu, %zu, %zu): %.17g against %.17g",
                 what, worst, where % n, where / n % n, where / n / n, fa[where], fb[where]);
    }
    uint64_t ca = gpc_stencil_checksum(a), cb = gpc_stencil_checksum(b);
    if (ca != cb)
        fail_msg("%s: checksums %016llx and %016llx", what, (unsigned long long)ca,
                 (unsigned long long)cb);
    free(fa), free(fb);
}

/* f64 on the GPU gives the CPU's bits; both follow the exact decay. */
static void test_f64_matches_cpu_bits(void **state) {
    (void)state;
    const struct {
        int n, k[3], steps;
        double r;
    } runs[] = {
        {45, {3, 2, 5}, 30, 1.0 / 6}, /* rows that are not whole 32 x 8 tiles */
        {64, {7, 1, 3}, 25, 0.1},
        {200, {1, 2, 1}, 20, 0.125}, /* z split into chunks of blocks */
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        char what[64];
        snprintf(what, sizeof what, "n %d f64 GPU vs CPU", runs[i].n);
        gpc_stencil *cpu = make(runs[i].n, 1, runs[i].r, runs[i].k, gpc_cpu(), 0, runs[i].steps);
        gpc_stencil *gpu = make(runs[i].n, 1, runs[i].r, runs[i].k, cuda0(), 0, runs[i].steps);
        same_bits(what, gpu, cpu, runs[i].n);
        double eg = gpc_stencil_error(gpu), ec = gpc_stencil_error(cpu);
        if (!(eg < 1e-14 * runs[i].steps)) fail_msg("%s: error %.3g against lambda^s", what, eg);
        /* the same field: |u - s u0| may round differently, by an ulp */
        if (!(fabs(eg - ec) <= 1e-15)) fail_msg("%s: errors %.17g GPU, %.17g CPU", what, eg, ec);
        double hg = gpc_stencil_heat_error(gpu), hc = gpc_stencil_heat_error(cpu);
        if (!(fabs(hg - hc) <= 1e-15 && hg > 1e-9))
            fail_msg("%s: heat errors %.17g GPU, %.17g CPU", what, hg, hc);
        gpc_stencil_free(cpu);
        gpc_stencil_free(gpu);
    }
}

/* f32 on the GPU within the stated tolerance of the f64 field and of the
 * exact decay. */
static void test_f32_within_tolerance(void **state) {
    (void)state;
    const int n = 64, steps = 40, k[3] = {2, 1, 3};
    const double r = 0.15, tol = 5e-7 * steps + 1e-6;
    gpc_stencil *cpu = make(n, 1, r, k, gpc_cpu(), 0, steps);
    gpc_stencil *gpu = make(n, 1, r, k, cuda0(), 1, steps);
    double *fc = field_of(cpu, n), *fg = field_of(gpu, n), worst = 0;
    for (size_t i = 0; i < (size_t)n * n * n; i++)
        worst = fmax(worst, fabs(fc[i] - fg[i]));
    if (!(worst <= tol)) fail_msg("f32 vs f64: %.3g over %.3g", worst, tol);
    /* and not the f64 field itself: the run is really in f32 */
    if (!(worst > 0)) fail_msg("f32 run gave the f64 bits");
    double e = gpc_stencil_error(gpu);
    if (!(e <= tol)) fail_msg("f32 error against lambda^s: %.3g over %.3g", e, tol);
    double hg = gpc_stencil_heat_error(gpu), hc = gpc_stencil_heat_error(cpu);
    if (!(fabs(hg - hc) <= tol)) fail_msg("f32 heat error %.6g, f64 %.6g", hg, hc);
    free(fc), free(fg);
    gpc_stencil_free(cpu);
    gpc_stencil_free(gpu);
}

/* Slabs on one GPU, halos exchanged on the second stream during the
 * inside's update, give one slab's bits; so does a run in pieces. */
static void test_slabs_give_the_same_bits(void **state) {
    (void)state;
    const int k[3] = {3, 1, 2};
    for (int fp32 = 0; fp32 <= 1; fp32++) {
        const int n = 40, steps = 23, splits[] = {2, 3, 20, 40};
        gpc_stencil *one = make(n, 1, 1.0 / 6, k, cuda0(), fp32, steps);
        for (size_t p = 0; p < sizeof splits / sizeof splits[0]; p++) {
            char what[64];
            snprintf(what, sizeof what, "%s, %d slabs vs 1", fp32 ? "f32" : "f64", splits[p]);
            gpc_stencil *split = make(n, splits[p], 1.0 / 6, k, cuda0(), fp32, steps);
            same_bits(what, split, one, n);
            gpc_stencil_free(split);
        }
        /* 23 steps as 10 + 13 calls, two slabs */
        gpc_stencil *pieces = make(n, 2, 1.0 / 6, k, cuda0(), fp32, 10);
        TEST_OK(gpc_stencil_run(pieces, steps - 10));
        assert_int_equal(gpc_stencil_steps(pieces), steps);
        same_bits(fp32 ? "f32 in pieces" : "f64 in pieces", pieces, one, n);
        gpc_stencil_free(pieces);
        gpc_stencil_free(one);
    }
    /* a large grid in two slabs: the overlap with real work on both streams */
    const int big = 256;
    gpc_stencil *one = make(big, 1, 0.125, k, cuda0(), 0, 12);
    gpc_stencil *two = make(big, 2, 0.125, k, cuda0(), 0, 12);
    same_bits("256^3 f64, 2 slabs vs 1", two, one, big);
    gpc_stencil_free(one);
    gpc_stencil_free(two);
}

static void test_bad_input(void **state) {
    (void)state;
    gpc_stencil_config c;
    gpc_stencil *s = NULL;
    gpc_stencil_defaults(&c);
    c.device = cuda0();
    c.device.index = gpu_count();
    char want[64];
    snprintf(want, sizeof want, "cuda:%d does not exist", gpu_count());
    TEST_FAILS(gpc_stencil_create(&s, &c), GPC_ERR_INVALID_ARG, want);
    /* 4096^3 f64 twice is over a TiB: refused before allocating */
    gpc_stencil_defaults(&c);
    c.device = cuda0(), c.n = 4096;
    TEST_FAILS(gpc_stencil_create(&s, &c), GPC_ERR_NOMEM, "GiB free of");
    assert_null(s);
    /* the copy baseline: a positive rate under what any HBM moves */
    gpc_stencil_defaults(&c);
    c.device = cuda0(), c.n = 256;
    double rate = 0;
    TEST_OK(gpc_stencil_copy_rate(&c, &rate));
    if (!(rate > 1e9 && rate < 2e13)) fail_msg("copy rate %.3g B/s", rate);
}

int main(void) {
    if (gpu_count() <= 0) {
        printf("no GPU: %s\n", gpc_last_error());
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f64_matches_cpu_bits),
        cmocka_unit_test(test_f32_within_tolerance),
        cmocka_unit_test(test_slabs_give_the_same_bits),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
