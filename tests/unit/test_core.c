/* test_core.c: status messages, dtype conversions, RNG, CRC-32C, arenas and
 * atomic files, each checked against values computed another way. */
#include "testutil.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_error_messages(void **state) {
    (void)state;
    assert_int_equal(gpc_error(GPC_ERR_IO, "cannot open %s", "x.bin"), GPC_ERR_IO);
    assert_string_equal(gpc_last_error(), "cannot open x.bin");
    gpc_error_context(GPC_ERR_IO, "loading %s: ", "run");
    assert_string_equal(gpc_last_error(), "loading run: cannot open x.bin");
    gpc_clear_error();
    assert_string_equal(gpc_last_error(), "no error");
}

static void test_bf16_round_trip(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 1);
    for (int i = 0; i < 100000; i++) {
        float x = gpc_rng_normal(&rng) * powf(2.0f, (float)gpc_rng_below(&rng, 40) - 20.0f);
        float y = gpc_bf16_to_f32(gpc_f32_to_bf16(x));
        /* bf16 keeps 8 significant bits: rounding error at most half an ulp, 2^-8 relative */
        assert_true(fabsf(y - x) <= fabsf(x) * (1.0f / 256.0f));
        float h = gpc_f16_to_f32(gpc_f32_to_f16(x));
        if (fabsf(x) > 6.2e-5f && fabsf(x) < 65000.0f)
            assert_true(fabsf(h - x) <= fabsf(x) / 2048.0f);
    }
    /* exact values and ties to even */
    assert_int_equal(gpc_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(gpc_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(gpc_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(gpc_f32_to_f16(1e6f), 0x7c00);
    assert_true(isnan(gpc_bf16_to_f32(gpc_f32_to_bf16(NAN))));
    assert_true(gpc_f16_to_f32(0x0001) == powf(2.0f, -24.0f));
}

static void test_rng_reproducible_and_uniform(void **state) {
    (void)state;
    gpc_rng a, b;
    gpc_rng_seed(&a, 42, 7);
    gpc_rng_seed(&b, 42, 7);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(gpc_rng_u32(&a), gpc_rng_u32(&b));
    /* moments of the normal generator */
    double sum = 0, sum2 = 0;
    int n = 200000;
    gpc_rng_seed(&a, test_seed(), 3);
    for (int i = 0; i < n; i++) {
        double x = gpc_rng_normal(&a);
        sum += x;
        sum2 += x * x;
    }
    assert_true(fabs(sum / n) < 0.02);
    assert_true(fabs(sum2 / n - 1.0) < 0.02);
    /* below() stays in range and hits every value */
    int seen[7] = {0};
    for (int i = 0; i < 7000; i++)
        seen[gpc_rng_below(&a, 7)]++;
    for (int i = 0; i < 7; i++)
        assert_true(seen[i] > 800 && seen[i] < 1200);
}

/* Jumping ahead lands where single steps do; the threaded fills give the
 * values and the final stream of a loop of single draws, bit for bit, for
 * any thread count and any length around the chunk size. */
static void test_rng_advance_and_threaded_fills(void **state) {
    (void)state;
    const uint64_t seed = test_seed();
    gpc_rng a, b;
    const uint64_t jumps[] = {0, 1, 2, 3, 63, 64, 1000, 262143, 262144, 1000003};
    for (size_t j = 0; j < sizeof jumps / sizeof jumps[0]; j++) {
        gpc_rng_seed(&a, seed, 11);
        gpc_rng_seed(&b, seed, 11);
        gpc_rng_advance(&a, jumps[j]);
        for (uint64_t k = 0; k < jumps[j]; k++)
            (void)gpc_rng_u32(&b);
        assert_true(a.state == b.state && a.inc == b.inc);
        assert_int_equal(gpc_rng_u32(&a), gpc_rng_u32(&b));
    }
    const size_t sizes[] = {1, 1000, 65535, 65536, 65537, 3 * 65536 + 17};
    const size_t most = 3 * 65536 + 17;
    float *got = malloc(most * sizeof *got), *want = malloc(most * sizeof *want);
    assert_non_null(got);
    assert_non_null(want);
    const int threads = omp_get_max_threads();
    for (int t = 1; t <= 3; t++) {
        omp_set_num_threads(t);
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            const size_t n = sizes[s];
            gpc_rng_seed(&a, seed, 5);
            gpc_rng_seed(&b, seed, 5);
            gpc_rng_fill_normal(&a, got, n, 0.5f, 0.02f);
            for (size_t i = 0; i < n; i++)
                want[i] = 0.5f + 0.02f * gpc_rng_normal(&b);
            assert_memory_equal(got, want, n * sizeof *got);
            assert_true(a.state == b.state);
            gpc_rng_fill_uniform(&a, got, n, -1.0f, 3.0f);
            for (size_t i = 0; i < n; i++)
                want[i] = -1.0f + 4.0f * gpc_rng_uniform(&b);
            assert_memory_equal(got, want, n * sizeof *got);
            assert_true(a.state == b.state);
        }
    }
    omp_set_num_threads(threads);
    free(got), free(want);
}

static void test_crc32c_known_vectors(void **state) {
    (void)state;
    /* RFC 3720 appendix B.4 test vectors */
    unsigned char zeros[32] = {0}, ones[32], inc[32];
    memset(ones, 0xff, sizeof ones);
    for (int i = 0; i < 32; i++)
        inc[i] = (unsigned char)i;
    assert_int_equal(gpc_crc32c(0, zeros, 32), 0x8a9136aa);
    assert_int_equal(gpc_crc32c(0, ones, 32), 0x62a8ab43);
    assert_int_equal(gpc_crc32c(0, inc, 32), 0x46dd794e);
    assert_int_equal(gpc_crc32c(0, "123456789", 9), 0xe3069283);
    /* incremental equals one-shot */
    uint32_t c = gpc_crc32c(0, "12345", 5);
    assert_int_equal(gpc_crc32c(c, "6789", 4), 0xe3069283);
}

/* Bit by bit, the polynomial's definition: the reference for the fast paths. */
static uint32_t crc32c_bitwise(uint32_t crc, const unsigned char *p, size_t bytes) {
    crc = ~crc;
    for (size_t i = 0; i < bytes; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++)
            crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
    }
    return ~crc;
}

/* Random bytes at every start alignment and lengths around the 8-byte
 * steps, whole and in two pieces, against the bitwise reference. */
static void test_crc32c_random_against_bitwise(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 9);
    unsigned char buf[4096 + 16];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (unsigned char)gpc_rng_u32(&rng);
    for (int trial = 0; trial < 400; trial++) {
        size_t at = gpc_rng_below(&rng, 16),
               n = trial < 40 ? (size_t)trial : gpc_rng_below(&rng, 4096);
        uint32_t seed = trial % 3 ? gpc_rng_u32(&rng) : 0;
        uint32_t want = crc32c_bitwise(seed, buf + at, n);
        assert_int_equal(gpc_crc32c(seed, buf + at, n), want);
        size_t cut = n ? gpc_rng_below(&rng, (uint32_t)n + 1) : 0;
        assert_int_equal(gpc_crc32c(gpc_crc32c(seed, buf + at, cut), buf + at + cut, n - cut),
                         want);
    }
}

static void test_arena_plans_then_places(void **state) {
    (void)state;
    gpc_arena arena;
    gpc_tensor a, b;
    int64_t sa[2] = {3, 5}, sb[1] = {100};
    gpc_arena_measure(&arena, gpc_cpu());
    TEST_OK(gpc_arena_tensor(&arena, &a, GPC_F32, 2, sa));
    TEST_OK(gpc_arena_tensor(&arena, &b, GPC_BF16, 1, sb));
    assert_null(a.data);
    size_t need = arena.used;
    assert_true(need >= 15 * 4 + 200);
    TEST_OK(gpc_arena_create(&arena, gpc_cpu(), need));
    TEST_OK(gpc_arena_tensor(&arena, &a, GPC_F32, 2, sa));
    TEST_OK(gpc_arena_tensor(&arena, &b, GPC_BF16, 1, sb));
    assert_non_null(a.data);
    assert_true((char *)b.data >= (char *)a.data + 60);
    assert_int_equal(((uintptr_t)b.data) % 256, 0);
    gpc_tensor c;
    TEST_FAILS(gpc_arena_tensor(&arena, &c, GPC_F32, 1, sb), GPC_ERR_INTERNAL, "arena overflow");
    gpc_arena_destroy(&arena);
}

static void test_atomic_file_and_errors(void **state) {
    (void)state;
    char *dir = test_tmpdir("core");
    char path[4200];
    snprintf(path, sizeof path, "%s/f.bin", dir);
    gpc_atomic_file f;
    TEST_OK(gpc_atomic_open(&f, path));
    TEST_OK(gpc_atomic_write(&f, "hello", 5));
    assert_false(gpc_path_exists(path)); /* nothing visible before commit */
    assert_int_equal(f.crc, gpc_crc32c(0, "hello", 5));
    TEST_OK(gpc_atomic_commit(&f));
    char *data;
    size_t size;
    TEST_OK(gpc_read_file(path, &data, &size));
    assert_int_equal(size, 5);
    assert_memory_equal(data, "hello", 5);
    gpc_free(data);
    /* an aborted write leaves the old file in place */
    TEST_OK(gpc_atomic_open(&f, path));
    TEST_OK(gpc_atomic_write(&f, "XX", 2));
    gpc_atomic_abort(&f);
    TEST_OK(gpc_read_file(path, &data, &size));
    assert_int_equal(size, 5);
    gpc_free(data);
    snprintf(path, sizeof path, "%s/missing/f.bin", dir);
    TEST_FAILS(gpc_read_file(path, &data, &size), GPC_ERR_IO, "cannot open");
    TEST_FAILS(gpc_atomic_open(&f, path), GPC_ERR_IO, "cannot write");
    snprintf(path, sizeof path, "%s/a/b/c", dir);
    TEST_OK(gpc_mkdir_p(path));
    assert_true(gpc_path_is_dir(path));
    test_rmtree(dir);
    gpc_free(dir);
}

static void test_tensor_and_device(void **state) {
    (void)state;
    gpc_tensor t, u;
    int64_t shape[3] = {2, 3, 4};
    TEST_OK(gpc_tensor_alloc(&t, GPC_F32, gpc_cpu(), 3, shape));
    assert_int_equal(gpc_tensor_numel(&t), 24);
    assert_int_equal(gpc_tensor_bytes(&t), 96);
    for (int i = 0; i < 24; i++)
        ((float *)t.data)[i] = (float)i;
    TEST_OK(gpc_tensor_alloc(&u, GPC_F32, gpc_cpu(), 3, shape));
    TEST_OK(gpc_tensor_copy(&u, &t));
    assert_memory_equal(u.data, t.data, 96);
    TEST_OK(gpc_tensor_zero(&u));
    assert_true(((float *)u.data)[23] == 0.0f);
    char buf[64];
    assert_string_equal(gpc_tensor_describe(&t, buf, sizeof buf), "[2, 3, 4] f32 on cpu");
    gpc_tensor small = gpc_tensor_1d(u.data, GPC_F32, gpc_cpu(), 5);
    TEST_FAILS(gpc_tensor_copy(&small, &t), GPC_ERR_MISMATCH, "cannot copy");
    gpc_tensor_free(&t);
    gpc_tensor_free(&u);
    gpc_device d;
    TEST_OK(gpc_device_parse("cpu", &d));
    assert_int_equal(d.type, GPC_DEVICE_CPU);
    TEST_FAILS(gpc_device_parse("tpu", &d), GPC_ERR_INVALID_ARG, "unknown device");
    TEST_OK(gpc_device_parse("auto", &d));
    gpc_dtype dt;
    TEST_OK(gpc_dtype_parse("bf16", &dt));
    assert_int_equal(dt, GPC_BF16);
    TEST_FAILS(gpc_dtype_parse("f64", &dt), GPC_ERR_INVALID_ARG, "unknown dtype");
}

/* The CPU backend registered itself before main (its constructor was kept in
 * the link); a registration replaces the finder of its type. */
static gpc_backend fake_backend;
static const gpc_backend *fake_find(void) {
    return &fake_backend;
}
static const gpc_backend *absent_find(void) {
    gpc_error(GPC_ERR_UNSUPPORTED, "the fake device is absent");
    return NULL;
}

static void test_backend_registry(void **state) {
    (void)state;
    const gpc_backend *cpu = gpc_backend_get(GPC_DEVICE_CPU);
    assert_non_null(cpu);
    assert_string_equal(cpu->name, "cpu");
    assert_int_equal(cpu->type, GPC_DEVICE_CPU);
    assert_non_null(cpu->ops);
    assert_null(gpc_backend_get((gpc_device_type)7));
    assert_non_null(strstr(gpc_last_error(), "unknown device type 7"));

    fake_backend = *cpu;
    fake_backend.name = "fake";
    fake_backend.type = GPC_DEVICE_CUDA;
    gpc_backend_register(GPC_DEVICE_CUDA, fake_find);
    const gpc_backend *got;
    gpc_device gpu = {GPC_DEVICE_CUDA, 0};
    TEST_OK(gpc_backend_require(gpu, &got));
    assert_ptr_equal(got, &fake_backend);
    gpc_backend_register(GPC_DEVICE_CUDA, absent_find);
    TEST_FAILS(gpc_backend_require(gpu, &got), GPC_ERR_UNSUPPORTED, "the fake device is absent");
    gpc_backend_register((gpc_device_type)7, fake_find); /* ignored */
    assert_null(gpc_backend_get((gpc_device_type)7));
}

static void test_parse_bytes(void **state) {
    (void)state;
    uint64_t v;
    TEST_OK(gpc_parse_bytes("4096", &v));
    assert_int_equal(v, 4096);
    TEST_OK(gpc_parse_bytes("40G", &v));
    assert_int_equal(v, 40ull << 30);
    TEST_OK(gpc_parse_bytes("512MiB", &v));
    assert_int_equal(v, 512ull << 20);
    TEST_OK(gpc_parse_bytes("1.5k", &v));
    assert_int_equal(v, 1536);
    TEST_OK(gpc_parse_bytes("2TB", &v));
    assert_int_equal(v, 2ull << 40);
    TEST_FAILS(gpc_parse_bytes("", &v), GPC_ERR_INVALID_ARG, "empty size");
    TEST_FAILS(gpc_parse_bytes("lots", &v), GPC_ERR_INVALID_ARG, "not a size");
    TEST_FAILS(gpc_parse_bytes("-1G", &v), GPC_ERR_INVALID_ARG, "not a size");
    TEST_FAILS(gpc_parse_bytes("40X", &v), GPC_ERR_INVALID_ARG, "unknown unit");
    TEST_FAILS(gpc_parse_bytes("9e9T", &v), GPC_ERR_INVALID_ARG, "too large");
}

/* GPC_DEVICE_MEMORY_LIMIT: arenas and tensors count against it per
 * device; what would pass it fails as out of memory and counts nothing; the
 * free memory reported is what it leaves; a bad value is no limit. */
static void test_device_memory_limit(void **state) {
    (void)state;
    gpc_device cpu = gpc_cpu();
    size_t before = gpc_device_memory_in_use(cpu);
    setenv("GPC_DEVICE_MEMORY_LIMIT", "1M", 1);
    assert_int_equal(gpc_device_memory_limit(), 1 << 20);
    gpc_arena a, b;
    TEST_OK(gpc_arena_create(&a, cpu, 600 << 10));
    assert_int_equal(gpc_device_memory_in_use(cpu), before + (600 << 10));
    size_t free_bytes = 0, total = 0;
    TEST_OK(gpc_device_memory_free(cpu, &free_bytes, &total));
    assert_int_equal(total, 1 << 20);
    assert_true(free_bytes <= (1 << 20) - before - (600 << 10));
    TEST_FAILS(gpc_arena_create(&b, cpu, 600 << 10), GPC_ERR_NOMEM,
               "GPC_DEVICE_MEMORY_LIMIT=1.0 MiB");
    gpc_tensor t;
    const int64_t big[] = {200 << 10}, small[] = {50 << 10};
    TEST_FAILS(gpc_tensor_alloc(&t, GPC_F32, cpu, 1, big), GPC_ERR_NOMEM, "asked for 800.0 KiB");
    assert_int_equal(gpc_device_memory_in_use(cpu), before + (600 << 10));
    TEST_OK(gpc_tensor_alloc(&t, GPC_F32, cpu, 1, small));
    assert_int_equal(gpc_device_memory_in_use(cpu), before + (800 << 10));
    gpc_tensor_free(&t);
    gpc_arena_destroy(&a);
    assert_int_equal(gpc_device_memory_in_use(cpu), before);
    TEST_OK(gpc_arena_create(&b, cpu, 900 << 10)); /* room again */
    gpc_arena_destroy(&b);
    setenv("GPC_DEVICE_MEMORY_LIMIT", "lots", 1);
    assert_int_equal(gpc_device_memory_limit(), 0);
    unsetenv("GPC_DEVICE_MEMORY_LIMIT");
    assert_int_equal(gpc_device_memory_limit(), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_messages),
        cmocka_unit_test(test_bf16_round_trip),
        cmocka_unit_test(test_rng_reproducible_and_uniform),
        cmocka_unit_test(test_rng_advance_and_threaded_fills),
        cmocka_unit_test(test_crc32c_known_vectors),
        cmocka_unit_test(test_crc32c_random_against_bitwise),
        cmocka_unit_test(test_arena_plans_then_places),
        cmocka_unit_test(test_atomic_file_and_errors),
        cmocka_unit_test(test_tensor_and_device),
        cmocka_unit_test(test_backend_registry),
        cmocka_unit_test(test_parse_bytes),
        cmocka_unit_test(test_device_memory_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
