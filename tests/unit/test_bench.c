/* test_bench.c: gpc bench's judgement of the seed article's claims
 * (gpc_bench_claims) on reports with known figures, its CPU GEMM rates
 * against the time and work they were computed from, and the JSON error path. */
#include "testutil.h"

#include "gpc/bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void put(gpc_bench_report *r, const char *group, const char *name, const char *device,
                int64_t size, double seconds, double work) {
    if (r->count == r->capacity) {
        r->capacity = r->capacity ? 2 * r->capacity : 16;
        r->results = realloc(r->results, (size_t)r->capacity * sizeof *r->results);
        assert_non_null(r->results);
    }
    gpc_bench_result *x = &r->results[r->count++];
    memset(x, 0, sizeof *x);
    snprintf(x->group, sizeof x->group, "%s", group);
    snprintf(x->name, sizeof x->name, "%s", name);
    snprintf(x->device, sizeof x->device, "%s", device);
    x->size = size;
    x->seconds = seconds;
    x->work = work;
    x->rate = work / seconds / 1e9;
    x->ok = 1;
}

/* Random rates with known ratios: GPU f32 = k1 * the best CPU rate, f16 =
 * k2 * it, the tiled kernel takes 1/k3 of the naive one's time, and managed
 * memory takes 1/k4 of the pageable copy's time. The claims must report
 * exactly those ratios and the verdict they imply (holds from 90% of the
 * claim, partly above 1, otherwise does not hold). */
static void test_claims_ratios_and_verdicts(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 3);
    for (int trial = 0; trial < 50; trial++) {
        gpc_bench_report r;
        memset(&r, 0, sizeof r);
        r.cpu_threads = 2;
        double cpu_best = 50 + 100 * gpc_rng_uniform64(&rng);
        double n3 = 2.0 * 1024 * 1024 * 1024;
        put(&r, "gemm", "openblas-f32", "cpu", 1024, n3 / (cpu_best * 1e9), n3);
        put(&r, "gemm", "openblas-f32", "cpu", 512, n3 / 8 / (cpu_best * 0.5e9), n3 / 8);
        double k[4];
        for (int i = 0; i < 4; i++)
            k[i] = 0.5 + 120 * gpc_rng_uniform64(&rng);
        k[2] = 0.7 + gpc_rng_uniform64(&rng); /* tiling gains are around 1 */
        k[3] = 0.5 + 10 * gpc_rng_uniform64(&rng);
        put(&r, "gemm", "cublas-f32", "cuda:0", 1024, n3 / (k[0] * cpu_best * 1e9), n3);
        put(&r, "gemm", "cublas-f16", "cuda:0", 1024, n3 / (k[1] * cpu_best * 1e9), n3);
        put(&r, "gemm", "naive-f32", "cuda:0", 2048, 0.01 * k[2], 8 * n3);
        put(&r, "gemm", "tiled-f32", "cuda:0", 2048, 0.01, 8 * n3);
        put(&r, "gemm", "naive-f32", "cuda:0", 1024, 1.0, n3); /* smaller size: not the one used */
        put(&r, "gemm", "tiled-f32", "cuda:0", 1024, 0.5, n3);
        put(&r, "copy", "h2d-pageable", "cuda:0", 4096, 15e-6 * k[3], 4096);
        put(&r, "copy", "h2d-pinned", "cuda:0", 4096, 9e-6, 4096);
        put(&r, "copy", "h2d-managed+prefetch", "cuda:0", 4096, 15e-6, 4096);
        gpc_bench_claim c[GPC_BENCH_NUM_CLAIMS];
        gpc_bench_claims(&r, c);
        const double claimed[4] = {50, 80, 1.3, 7.5};
        for (int i = 0; i < 4; i++) {
            assert_true(fabs(c[i].measured - k[i]) <= 1e-9 * k[i]);
            assert_true(c[i].claimed == claimed[i]);
            gpc_claim_verdict want = k[i] >= 0.9 * claimed[i] ? GPC_CLAIM_HOLDS
                                     : k[i] > 1.0             ? GPC_CLAIM_PARTLY
                                                              : GPC_CLAIM_DOES_NOT_HOLD;
            if (c[i].verdict != want)
                fail_msg("claim %d: ratio %g gave '%s', expected '%s'", i, k[i],
                         gpc_claim_verdict_name(c[i].verdict), gpc_claim_verdict_name(want));
        }
        /* the detail names the figures compared */
        assert_non_null(strstr(c[0].detail, "OpenBLAS f32"));
        assert_non_null(strstr(c[2].detail, "n=2048"));
        assert_non_null(strstr(c[3].detail, "managed memory with prefetch 15.0 us"));
        gpc_bench_report_free(&r);
    }
}

/* Without GPU results each claim is "not measured" with the reason the GPU
 * part gave; a result that failed its check is not used. */
static void test_claims_not_measured(void **state) {
    (void)state;
    gpc_bench_report r;
    memset(&r, 0, sizeof r);
    put(&r, "gemm", "openblas-f32", "cpu", 256, 1e-3, 2.0 * 256 * 256 * 256);
    put(&r, "gemm", "cublas-f32", "cuda:0", 256, 1e-6, 2.0 * 256 * 256 * 256);
    r.results[1].ok = 0; /* wrong result */
    snprintf(r.skipped[0], sizeof r.skipped[0], "gemm on the GPU not run: no GPU: reason here");
    r.num_skipped = 1;
    gpc_bench_claim c[GPC_BENCH_NUM_CLAIMS];
    gpc_bench_claims(&r, c);
    for (int i = 0; i < GPC_BENCH_NUM_CLAIMS; i++) {
        assert_int_equal(c[i].verdict, GPC_CLAIM_NOT_MEASURED);
        assert_string_equal(c[i].detail, "not measured: no GPU: reason here");
    }
    assert_string_equal(gpc_claim_verdict_name(GPC_CLAIM_NOT_MEASURED), "not measured");
    gpc_bench_report_free(&r);
}

static void collect(const gpc_bench_result *result, void *user) {
    (*(int *)user)++;
    (void)result;
}

/* A real quick CPU run: sizes 64, 128, 256; each rate is 2 n^3 over the
 * median time; the GPU part is recorded as skipped since --device cpu. */
static void test_cpu_gemm_run(void **state) {
    (void)state;
    gpc_bench_options o;
    memset(&o, 0, sizeof o);
    o.gemm = 1;
    o.quick = 1;
    int seen = 0;
    o.on_result = collect;
    o.user = &seen;
    gpc_bench_report r;
    memset(&r, 0, sizeof r);
    TEST_OK(gpc_bench_run(&o, &r));
    assert_int_equal(r.count, 3);
    assert_int_equal(seen, 3);
    const int64_t sizes[3] = {64, 128, 256};
    for (int i = 0; i < 3; i++) {
        const gpc_bench_result *x = &r.results[i];
        assert_int_equal(x->size, sizes[i]);
        assert_true(x->work == 2.0 * sizes[i] * sizes[i] * sizes[i]);
        assert_true(x->seconds > 0 && x->ok);
        assert_true(fabs(x->rate - x->work / x->seconds / 1e9) <= 1e-12 * x->rate);
        assert_true(x->error >= 0 && x->error < 1e-5);
    }
    assert_int_equal(r.gpu, -1);
    assert_true(r.num_skipped >= 1);
    assert_non_null(strstr(r.skipped[0], "gemm on the GPU"));
    gpc_bench_claim c[GPC_BENCH_NUM_CLAIMS];
    gpc_bench_claims(&r, c);
    TEST_FAILS(gpc_bench_write_json("/nonexistent-dir/x.json", &o, &r, c), GPC_ERR_IO,
               "cannot write /nonexistent-dir/x.json");
    gpc_bench_report_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_claims_ratios_and_verdicts),
        cmocka_unit_test(test_claims_not_measured),
        cmocka_unit_test(test_cpu_gemm_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
