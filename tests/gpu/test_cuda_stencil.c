/* test_cuda_stencil.c: the stencil on a GPU against the CPU and against the
 * exact decay of its sine mode, for every update kernel GPC_STENCIL_KERNEL
 * names (vector, column, plain, shared, twostep, async, stream2).
 *
 * f64: the GPU computes each point with the CPU's operations in the CPU's
 * order (one fused multiply-add of c6 u and r s, s summed x-1, x+1, y-1,
 * y+1, z-1, z+1, each rounded to nearest) from the CPU's starting bits, so
 * every kernel's field must equal the CPU's bit for bit, not merely be
 * close; a failure prints the largest distance in units in the last place.
 * The sizes leave part tiles and runs that reach past the row's end, and z
 * chunks whose length is not a multiple of the register queue's; odd step
 * counts make twostep and stream2 end their pairs with a single step; 70
 * and 129 are no multiple of any kernel's tile, so the async kernel's
 * copies of the last tiles reach past the ring and fill zeros. f32:
 * within 5e-7 a step (plus 1e-6) of the f64 field, whose amplitude is 1:
 * each step rounds five additions of terms up to 1, a product and the fused
 * multiply-add (under 4.2e-7 at worst for r <= 1/6, and the scheme never
 * amplifies an error); the kernels share that arithmetic, so their f32
 * fields are equal bit for bit. Slabs on one GPU, whose halos go by device
 * copies on a second stream while the inside is updated, must give one
 * slab's bits, in f64 and f32, down to slabs of one and two planes, for
 * every kernel; so must a run split into several calls, and an odd grid in
 * three slabs must give the CPU's bits in f64, with each of the async
 * kernel's tiles. The stream2 kernel's three tiles (6, 14 and 30 rows)
 * give the CPU's bits in f64 from n = 1 up, with odd and even step counts,
 * and the vector kernel's bits in f32. Bad input: a GPU
 * index that does not exist, a kernel that does not, and a grid larger
 * than the GPU. Exits 77 without a GPU. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/settings.h"
#include "gpc/stencil.h"

static const char *const kernels[] = {"vector",  "column", "plain",  "shared",
                                      "twostep", "async",  "stream2"};
enum { KERNELS = sizeof kernels / sizeof kernels[0] };

/* The kernel GPC_STENCIL_KERNEL=auto (or unset) picks. */
static const char *const default_kernel = "stream2";

static int gpu_count(void) {
    const gpc_backend *b = gpc_backend_get(GPC_DEVICE_CUDA);
    return b && b->device_count ? b->device_count() : 0;
}

static gpc_device cuda0(void) {
    gpc_device d = {GPC_DEVICE_CUDA, 0};
    return d;
}

/* A run on `device`; on a GPU with the update kernel named (NULL: the
 * default, GPC_STENCIL_KERNEL unset). */
static gpc_stencil *make_with(const char *kernel, int n, int domains, double r, const int k[3],
                              gpc_device device, int fp32, int steps) {
    TEST_OK(gpc_settings_override("GPC_STENCIL_KERNEL", kernel));
    gpc_stencil_config c;
    gpc_stencil_defaults(&c);
    c.n = n, c.domains = domains, c.r = r, c.device = device, c.fp32 = fp32;
    memcpy(c.mode, k, sizeof c.mode);
    gpc_stencil *s = NULL;
    TEST_OK(gpc_stencil_create(&s, &c));
    TEST_OK(gpc_settings_override("GPC_STENCIL_KERNEL", NULL));
    /* the default (auto), unless the environment names one */
    const char *given = getenv("GPC_STENCIL_KERNEL");
    if (device.type == GPC_DEVICE_CUDA && (kernel || !given || !*given))
        assert_string_equal(gpc_stencil_kernel_name(s), kernel ? kernel : default_kernel);
    TEST_OK(gpc_stencil_run(s, steps));
    return s;
}

static gpc_stencil *make(int n, int domains, double r, const int k[3], gpc_device device, int fp32,
                         int steps) {
    return make_with(NULL, n, domains, r, k, device, fp32, steps);
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

/* f64 on the GPU gives the CPU's bits, with every kernel; both follow the
 * exact decay. */
static void test_f64_matches_cpu_bits(void **state) {
    (void)state;
    const struct {
        int n, k[3], steps;
        double r;
    } runs[] = {
        {45, {3, 2, 5}, 30, 1.0 / 6}, /* part tiles; runs past x = n; z chunks of 23 and 22 */
        {64, {7, 1, 3}, 25, 0.1},
        {200, {1, 2, 1}, 20, 0.125}, /* z split into chunks of blocks */
        {97, {2, 3, 1}, 7, 0.15},    /* odd: every kernel's last run of a row is partial */
        {70, {2, 1, 2}, 11, 1.0 / 6},
        {129, {1, 3, 2}, 9, 0.1}, /* a tile of one column and row past 128 */
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        gpc_stencil *cpu = make(runs[i].n, 1, runs[i].r, runs[i].k, gpc_cpu(), 0, runs[i].steps);
        const double ec = gpc_stencil_error(cpu), hc = gpc_stencil_heat_error(cpu);
        for (int kernel = 0; kernel < KERNELS; kernel++) {
            char what[64];
            snprintf(what, sizeof what, "n %d f64 GPU (%s) vs CPU", runs[i].n, kernels[kernel]);
            gpc_stencil *gpu = make_with(kernels[kernel], runs[i].n, 1, runs[i].r, runs[i].k,
                                         cuda0(), 0, runs[i].steps);
            same_bits(what, gpu, cpu, runs[i].n);
            double eg = gpc_stencil_error(gpu);
            if (!(eg < 1e-14 * runs[i].steps))
                fail_msg("%s: error %.3g against lambda^s", what, eg);
            /* the same field: |u - s u0| may round differently, by an ulp */
            if (!(fabs(eg - ec) <= 1e-15))
                fail_msg("%s: errors %.17g GPU, %.17g CPU", what, eg, ec);
            double hg = gpc_stencil_heat_error(gpu);
            if (!(fabs(hg - hc) <= 1e-15 && hg > 1e-9))
                fail_msg("%s: heat errors %.17g GPU, %.17g CPU", what, hg, hc);
            gpc_stencil_free(gpu);
        }
        gpc_stencil_free(cpu);
    }
}

/* f32 on the GPU within the stated tolerance of the f64 field and of the
 * exact decay, with every kernel; the kernels' f32 fields are equal. */
static void test_f32_within_tolerance(void **state) {
    (void)state;
    const int sizes[] = {64, 45};
    for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
        const int n = sizes[z], steps = 40, k[3] = {2, 1, 3};
        const double r = 0.15, tol = 5e-7 * steps + 1e-6;
        gpc_stencil *cpu = make(n, 1, r, k, gpc_cpu(), 0, steps);
        gpc_stencil *first = NULL;
        double *fc = field_of(cpu, n);
        for (int kernel = 0; kernel < KERNELS; kernel++) {
            char what[64];
            snprintf(what, sizeof what, "n %d f32 (%s)", n, kernels[kernel]);
            gpc_stencil *gpu = make_with(kernels[kernel], n, 1, r, k, cuda0(), 1, steps);
            double *fg = field_of(gpu, n), worst = 0;
            for (size_t i = 0; i < (size_t)n * n * n; i++)
                worst = fmax(worst, fabs(fc[i] - fg[i]));
            if (!(worst <= tol)) fail_msg("%s vs f64: %.3g over %.3g", what, worst, tol);
            /* and not the f64 field itself: the run is really in f32 */
            if (!(worst > 0)) fail_msg("%s run gave the f64 bits", what);
            double e = gpc_stencil_error(gpu);
            if (!(e <= tol)) fail_msg("%s error against lambda^s: %.3g over %.3g", what, e, tol);
            double hg = gpc_stencil_heat_error(gpu), hc = gpc_stencil_heat_error(cpu);
            if (!(fabs(hg - hc) <= tol)) fail_msg("%s heat error %.6g, f64 %.6g", what, hg, hc);
            free(fg);
            if (first) {
                same_bits(what, gpu, first, n);
                gpc_stencil_free(gpu);
            } else {
                first = gpu;
            }
        }
        free(fc);
        gpc_stencil_free(first);
        gpc_stencil_free(cpu);
    }
}

/* Slabs on one GPU, halos exchanged on the second stream during the
 * inside's update, give one slab's bits with every kernel; so does a run in
 * pieces. */
static void test_slabs_give_the_same_bits(void **state) {
    (void)state;
    const int k[3] = {3, 1, 2};
    for (int kernel = 0; kernel < KERNELS; kernel++)
        for (int fp32 = 0; fp32 <= 1; fp32++) {
            const char *name = kernels[kernel];
            const int n = 40, steps = 23, splits[] = {2, 3, 20, 40};
            gpc_stencil *one = make_with(name, n, 1, 1.0 / 6, k, cuda0(), fp32, steps);
            for (size_t p = 0; p < sizeof splits / sizeof splits[0]; p++) {
                char what[64];
                snprintf(what, sizeof what, "%s %s, %d slabs vs 1", name, fp32 ? "f32" : "f64",
                         splits[p]);
                gpc_stencil *split =
                    make_with(name, n, splits[p], 1.0 / 6, k, cuda0(), fp32, steps);
                same_bits(what, split, one, n);
                gpc_stencil_free(split);
            }
            /* 23 steps as 10 + 13 calls, two slabs */
            char what[64];
            snprintf(what, sizeof what, "%s %s in pieces", name, fp32 ? "f32" : "f64");
            gpc_stencil *pieces = make_with(name, n, 2, 1.0 / 6, k, cuda0(), fp32, 10);
            TEST_OK(gpc_stencil_run(pieces, steps - 10));
            assert_int_equal(gpc_stencil_steps(pieces), steps);
            same_bits(what, pieces, one, n);
            gpc_stencil_free(pieces);
            gpc_stencil_free(one);
        }
    /* an odd grid in three slabs, each kernel against the CPU */
    {
        const int n = 129, steps = 9;
        gpc_stencil *cpu = make(n, 1, 0.15, k, gpc_cpu(), 0, steps);
        for (int kernel = 0; kernel < KERNELS; kernel++) {
            char what[64];
            snprintf(what, sizeof what, "%s f64 n %d, 3 slabs vs the CPU", kernels[kernel], n);
            gpc_stencil *gpu = make_with(kernels[kernel], n, 3, 0.15, k, cuda0(), 0, steps);
            same_bits(what, gpu, cpu, n);
            gpc_stencil_free(gpu);
        }
        gpc_stencil_free(cpu);
    }
    /* a large grid in two slabs: the overlap with real work on both streams;
     * its CPU run checks the default kernel's long z chunks too */
    const int big = 256;
    gpc_stencil *cpu = make(big, 1, 0.125, k, gpc_cpu(), 0, 12);
    gpc_stencil *one = make(big, 1, 0.125, k, cuda0(), 0, 12);
    gpc_stencil *two = make(big, 2, 0.125, k, cuda0(), 0, 12);
    same_bits("256^3 f64, 1 slab vs the CPU", one, cpu, big);
    same_bits("256^3 f64, 2 slabs vs 1", two, one, big);
    gpc_stencil_free(cpu);
    gpc_stencil_free(one);
    gpc_stencil_free(two);
}

/* The async kernel's other tiles (GPC_STENCIL_ASYNC_ROWS 8 and 32, with
 * six and four stages) give the CPU's bits in f64, in one slab and three,
 * and the vector kernel's bits in f32. */
static void test_async_tiles(void **state) {
    (void)state;
    const char *const rows[] = {"8", "32"};
    const int k[3] = {2, 3, 1};
    const int sizes[] = {70, 129};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        const int n = sizes[i], steps = 7;
        gpc_stencil *cpu = make(n, 1, 0.125, k, gpc_cpu(), 0, steps);
        gpc_stencil *f32 = make_with("vector", n, 1, 0.125, k, cuda0(), 1, steps);
        for (size_t t = 0; t < sizeof rows / sizeof rows[0]; t++) {
            TEST_OK(gpc_settings_override("GPC_STENCIL_ASYNC_ROWS", rows[t]));
            for (int slabs = 1; slabs <= 3; slabs += 2) {
                char what[80];
                snprintf(what, sizeof what, "async %s rows, n %d f64, %d slab%s vs the CPU",
                         rows[t], n, slabs, slabs > 1 ? "s" : "");
                gpc_stencil *gpu = make_with("async", n, slabs, 0.125, k, cuda0(), 0, steps);
                same_bits(what, gpu, cpu, n);
                gpc_stencil_free(gpu);
            }
            char what[80];
            snprintf(what, sizeof what, "async %s rows, n %d f32 vs vector", rows[t], n);
            gpc_stencil *gpu = make_with("async", n, 2, 0.125, k, cuda0(), 1, steps);
            same_bits(what, gpu, f32, n);
            gpc_stencil_free(gpu);
            TEST_OK(gpc_settings_override("GPC_STENCIL_ASYNC_ROWS", NULL));
        }
        gpc_stencil_free(f32);
        gpc_stencil_free(cpu);
    }
}

/* The stream2 kernel's tiles (GPC_STENCIL_STREAM2_ROWS 6, 14 and 30):
 * the CPU's bits in f64 and the vector kernel's in f32, on grids from one
 * point to sizes no multiple of a tile's 128 (f32) or 64 (f64) points by
 * 6, 14 or 30 rows, with even step counts (pairs only) and odd ones (a
 * single step last), and a run in two calls of odd steps (a pair after a
 * single step). */
static void test_stream2_tiles(void **state) {
    (void)state;
    const char *const rows[] = {"6", "14", "30"};
    const struct {
        int n, steps;
    } runs[] = {{1, 2}, {2, 3}, {3, 4}, {5, 7}, {17, 6}, {33, 5}, {70, 10}, {129, 9}, {150, 12}};
    const int k[3] = {1, 2, 1};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        const int n = runs[i].n, steps = runs[i].steps;
        const double r = i % 2 ? 0.125 : 1.0 / 6;
        const int mode[3] = {k[0], k[1] <= n ? k[1] : 1, k[2]};
        gpc_stencil *cpu = make(n, 1, r, mode, gpc_cpu(), 0, steps);
        gpc_stencil *f32 = make_with("vector", n, 1, r, mode, cuda0(), 1, steps);
        for (size_t t = 0; t < sizeof rows / sizeof rows[0]; t++) {
            TEST_OK(gpc_settings_override("GPC_STENCIL_STREAM2_ROWS", rows[t]));
            char what[80];
            snprintf(what, sizeof what, "stream2 %s rows, n %d f64, %d steps vs the CPU", rows[t],
                     n, steps);
            gpc_stencil *gpu = make_with("stream2", n, 1, r, mode, cuda0(), 0, steps);
            same_bits(what, gpu, cpu, n);
            gpc_stencil_free(gpu);
            /* 1 + (steps - 1) steps: a single step, then pairs */
            snprintf(what, sizeof what, "stream2 %s rows, n %d f64 in pieces", rows[t], n);
            gpu = make_with("stream2", n, 1, r, mode, cuda0(), 0, 1);
            TEST_OK(gpc_stencil_run(gpu, steps - 1));
            same_bits(what, gpu, cpu, n);
            gpc_stencil_free(gpu);
            snprintf(what, sizeof what, "stream2 %s rows, n %d f32 vs vector", rows[t], n);
            gpu = make_with("stream2", n, 1, r, mode, cuda0(), 1, steps);
            same_bits(what, gpu, f32, n);
            gpc_stencil_free(gpu);
            TEST_OK(gpc_settings_override("GPC_STENCIL_STREAM2_ROWS", NULL));
        }
        gpc_stencil_free(f32);
        gpc_stencil_free(cpu);
    }
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
    /* a kernel that does not exist, named in the environment */
    gpc_stencil_defaults(&c);
    c.device = cuda0();
    setenv("GPC_STENCIL_KERNEL", "tiled", 1);
    TEST_FAILS(gpc_stencil_create(&s, &c), GPC_ERR_INVALID_ARG,
               "GPC_STENCIL_KERNEL=tiled is not a GPU kernel");
    unsetenv("GPC_STENCIL_KERNEL");
    assert_null(s);
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
    /* GPC_TEST_FILTER='*stream2*' runs the stream2 tiles' test alone */
    if (gpc_setting_given("GPC_TEST_FILTER"))
        cmocka_set_test_filter(gpc_setting_given("GPC_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f64_matches_cpu_bits),
        cmocka_unit_test(test_f32_within_tolerance),
        cmocka_unit_test(test_slabs_give_the_same_bits),
        cmocka_unit_test(test_async_tiles),
        cmocka_unit_test(test_stream2_tiles),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
