/* test_nvml.c: what of src/core/nvml.c runs without a GPU: PCI bus ids
 * compared as numbers whatever their spelling (CUDA's, sysfs's, NVML's), and
 * malformed ids never equal; finding a GPU by bus id or reading its power
 * without NVML is refused (its energy counter is unknown); and opening NVML
 * from a library that does not exist, for all GPUs or for one bus id, fails
 * with a message instead of crashing. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "gpc/nvml.h"

static void test_bus_ids_equal_across_spellings(void **state) {
    (void)state;
    const char *cuda = "0000:3B:00.0";     /* cudaDeviceGetPCIBusId */
    const char *sysfs = "0000:3b:00.0";    /* /sys/bus/pci/devices, gpc_nvml_sample */
    const char *nvml = "00000000:3B:00.0"; /* nvmlPciInfo_t.busId */
    assert_true(gpc_pci_bus_id_equal(cuda, sysfs));
    assert_true(gpc_pci_bus_id_equal(cuda, nvml));
    assert_true(gpc_pci_bus_id_equal(nvml, sysfs));
    assert_true(gpc_pci_bus_id_equal(cuda, cuda));
    /* leading zeros do not matter, the numbers do */
    assert_true(gpc_pci_bus_id_equal("0:3b:0.0", cuda));
    assert_true(gpc_pci_bus_id_equal("0001:c1:1f.7", "00000001:C1:1F.7"));
}

static void test_bus_ids_that_differ(void **state) {
    (void)state;
    const char *id = "0000:3b:00.0";
    assert_false(gpc_pci_bus_id_equal(id, "0000:3c:00.0"));     /* bus */
    assert_false(gpc_pci_bus_id_equal(id, "0001:3b:00.0"));     /* domain */
    assert_false(gpc_pci_bus_id_equal(id, "0000:3b:01.0"));     /* device */
    assert_false(gpc_pci_bus_id_equal(id, "0000:3b:00.1"));     /* function */
    assert_false(gpc_pci_bus_id_equal(id, "00010000:3b:00.0")); /* all 8 domain digits count */
}

static void test_malformed_bus_ids_are_never_equal(void **state) {
    (void)state;
    const char *bad[] = {
        "",
        "3b:00.0",           /* no domain */
        "0000:3b:00",        /* no function */
        "0000:3b.00.0",      /* wrong separator */
        "0000:3g:00.0",      /* not hex */
        "0000:13b:00.0",     /* bus of three digits */
        "000000000:3b:00.0", /* domain of nine digits */
        "0000:3b:20.0",      /* device 32: PCI has 0..31 */
        "0000:3b:00.8",      /* function 8: PCI has 0..7 */
        "0000:3b:00.0 ",     /* trailing text */
        " 0000:3b:00.0",     /* leading text */
        "0000:3b:00.0\n",    /* a line, not an id */
        "0000::00.0",        /* empty bus */
        "GPU-1f2e3d4c",      /* a UUID */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (gpc_pci_bus_id_equal(bad[i], "0000:3b:00.0") ||
            gpc_pci_bus_id_equal("0000:3b:00.0", bad[i]))
            fail_msg("'%s' compared equal to 0000:3b:00.0", bad[i]);
        /* not even to itself: a malformed id names no device */
        if (gpc_pci_bus_id_equal(bad[i], bad[i])) fail_msg("'%s' equals itself", bad[i]);
    }
    assert_false(gpc_pci_bus_id_equal(NULL, "0000:3b:00.0"));
    assert_false(gpc_pci_bus_id_equal("0000:3b:00.0", NULL));
    assert_false(gpc_pci_bus_id_equal(NULL, NULL));
}

static void test_refuses_bad_arguments(void **state) {
    (void)state;
    int index = 7;
    TEST_FAILS(gpc_nvml_find_bus_id(NULL, "0000:3b:00.0", &index), GPC_ERR_INVALID_ARG,
               "needs NVML");
    assert_int_equal(index, -1);
    gpc_nvml_power power;
    TEST_FAILS(gpc_nvml_sample_power(NULL, 0, &power), GPC_ERR_INVALID_ARG, "does not exist");
    /* the energy counter without NVML is unknown, not zero */
    assert_true(gpc_nvml_energy_j(NULL, 0) == -1.0);
}

static void test_open_without_the_library(void **state) {
    (void)state;
    const char *old = gpc_setting_given("GPC_NVML_LIBRARY");
    char *saved = old ? strdup(old) : NULL;
    setenv("GPC_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
    gpc_nvml *nvml = (gpc_nvml *)1;
    TEST_FAILS(gpc_nvml_open(&nvml), GPC_ERR_UNSUPPORTED, "no NVIDIA driver found");
    assert_null(nvml);
    /* opening for one GPU fails the same way and leaves nothing open */
    int index = 7;
    nvml = (gpc_nvml *)1;
    TEST_FAILS(gpc_nvml_open_bus_id("0000:3b:00.0", &nvml, &index), GPC_ERR_UNSUPPORTED,
               "no NVIDIA driver found");
    assert_null(nvml);
    assert_int_equal(index, -1);
    if (saved) {
        setenv("GPC_NVML_LIBRARY", saved, 1);
        free(saved);
    } else {
        unsetenv("GPC_NVML_LIBRARY");
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bus_ids_equal_across_spellings),
        cmocka_unit_test(test_bus_ids_that_differ),
        cmocka_unit_test(test_malformed_bus_ids_are_never_equal),
        cmocka_unit_test(test_refuses_bad_arguments),
        cmocka_unit_test(test_open_without_the_library),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
