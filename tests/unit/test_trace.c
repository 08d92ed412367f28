/* test_trace.c: gpc/trace.h reports NVTX as available exactly when it can
 * reach it (the NVTX3 header in a CUDA build, else libnvToolsExt.so.1
 * found by dlopen), and nested ranges are accepted either way. */
#include "testutil.h"

#include "gpc/trace.h"

#include <dlfcn.h>

static void test_trace_availability(void **state) {
    (void)state;
    int expected;
#if defined(GPC_HAVE_CUDA) && __has_include(<nvtx3/nvToolsExt.h>)
    expected = 1;
#else
    void *lib = dlopen("libnvToolsExt.so.1", RTLD_NOW | RTLD_LOCAL);
    expected = lib != NULL;
    if (lib) dlclose(lib);
#endif
    assert_int_equal(gpc_trace_available(), expected);
    for (int i = 0; i < 1000; i++) {
        gpc_trace_push("step");
        gpc_trace_push("forward");
        gpc_trace_pop();
        gpc_trace_pop();
    }
    assert_int_equal(gpc_trace_available(), expected);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_trace_availability)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
