/* test_memory_available.c: memory checks count what is free, not the
 * machine's total: MemAvailable and the cgroup's limit less its usage, the
 * smaller; gpc_host_memory_check refuses a size between the free and the
 * total memory; the stencil's copy baseline is larger than the last-level
 * cache and counted by its memory check; the cores a process may use are
 * its affinity's, fewer under a cgroup CPU quota. */
#include "testutil.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gpc/stencil.h"

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_available_from_files(void **state) {
    (void)state;
    char *dir = test_tmpdir("memavail");
    char meminfo[4200], limit[4200], usage[4200];
    snprintf(meminfo, sizeof meminfo, "%s/meminfo", dir);
    snprintf(limit, sizeof limit, "%s/memory.max", dir);
    snprintf(usage, sizeof usage, "%s/memory.current", dir);
    const size_t GiB = (size_t)1 << 30;
    write_text(meminfo, "MemTotal:       33554432 kB\nMemFree:         1048576 kB\n"
                        "MemAvailable:   20971520 kB\nBuffers:          123 kB\n");
    /* no cgroup: MemAvailable (20 GiB), not MemTotal or MemFree */
    assert_int_equal(gpc_host_memory_available_from(meminfo, NULL, NULL), 20 * GiB);
    /* a cgroup limit of 16 GiB with 4 GiB used leaves 12 GiB */
    write_text(limit, "17179869184\n");
    write_text(usage, "4294967296\n");
    assert_int_equal(gpc_host_memory_available_from(meminfo, limit, usage), 12 * GiB);
    /* a generous limit: MemAvailable is the smaller */
    write_text(limit, "107374182400\n");
    assert_int_equal(gpc_host_memory_available_from(meminfo, limit, usage), 20 * GiB);
    /* "max" (v2) and 2^63 - 4096 (v1) mean no limit */
    write_text(limit, "max\n");
    assert_int_equal(gpc_host_memory_available_from(meminfo, limit, usage), 20 * GiB);
    write_text(limit, "9223372036854771712\n");
    assert_int_equal(gpc_host_memory_available_from(meminfo, limit, usage), 20 * GiB);
    /* over the limit: nothing left */
    write_text(limit, "1073741824\n");
    assert_int_equal(gpc_host_memory_available_from(meminfo, limit, usage), 0);
    test_rmtree(dir);
    gpc_free(dir);
}

static void test_check_uses_free_memory(void **state) {
    (void)state;
    size_t available = gpc_host_memory_available();
    double total = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (available == 0) skip();
    assert_true((double)available <= total);
    TEST_OK(gpc_host_memory_check((double)available * 0.5, "test arrays need", "", "smaller"));
    /* between free and total: the old check, against the total, let it by */
    double between = (double)available + 0.5 * (total - (double)available);
    if (total - (double)available > 64.0 * 1024 * 1024)
        TEST_FAILS(gpc_host_memory_check(between, "test arrays need", "", "smaller"), GPC_ERR_NOMEM,
                   "more than this machine has free");
    TEST_FAILS(
        gpc_host_memory_check((double)available * 1.5 + 1e9, "test arrays need", "", "smaller"),
        GPC_ERR_NOMEM, "test arrays need about");
    TEST_FAILS(gpc_host_memory_check((double)available * 1.5 + 1e9, "this run needs", " (detail)",
                                     "advice"),
               GPC_ERR_NOMEM, "GiB of host memory (detail), more than this machine has free");
}

static void test_cores_under_quota(void **state) {
    (void)state;
    char *dir = test_tmpdir("cpumax");
    char path[4200];
    snprintf(path, sizeof path, "%s/cpu.max", dir);
    assert_int_equal(gpc_host_cores_available_from(8, NULL), 8);
    assert_int_equal(gpc_host_cores_available_from(0, NULL), 1);
    write_text(path, "max 100000\n"); /* no quota */
    assert_int_equal(gpc_host_cores_available_from(8, path), 8);
    write_text(path, "200000 100000\n"); /* 2 cores' time */
    assert_int_equal(gpc_host_cores_available_from(8, path), 2);
    write_text(path, "150000 100000\n"); /* 1.5: the second core part of the time */
    assert_int_equal(gpc_host_cores_available_from(8, path), 2);
    write_text(path, "50000 100000\n"); /* half a core: still one thread */
    assert_int_equal(gpc_host_cores_available_from(8, path), 1);
    write_text(path, "1600000 100000\n"); /* a quota above the cores seen */
    assert_int_equal(gpc_host_cores_available_from(8, path), 8);
    int here = gpc_host_cores_available();
    assert_true(here >= 1 && here <= sysconf(_SC_NPROCESSORS_ONLN));
    test_rmtree(dir);
    gpc_free(dir);
}

static void test_stencil_copy_beyond_cache(void **state) {
    (void)state;
    gpc_stencil_config c;
    gpc_stencil_defaults(&c);
    c.n = 128; /* 16.8 MB arrays: within many L3 caches */
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    size_t bytes = gpc_stencil_copy_bytes(&c);
    assert_true(bytes >= (size_t)128 * 128 * 128 * 8);
    if (llc > 0 && 4.0 * (double)llc <= 512.0 * 1024 * 1024) assert_true(bytes >= 4 * (size_t)llc);
    c.n = 2000; /* 64 GB arrays: the copy stops at 512 MiB */
    assert_int_equal(gpc_stencil_copy_bytes(&c), (size_t)512 << 20);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_available_from_files),
        cmocka_unit_test(test_check_uses_free_memory),
        cmocka_unit_test(test_stencil_copy_beyond_cache),
        cmocka_unit_test(test_cores_under_quota),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
