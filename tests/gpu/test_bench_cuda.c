/* test_bench_cuda.c: the GPU measurements of gpc bench on a real GPU: every
 * GEMM kernel and precision agrees with float64 on sampled entries (the
 * check inside gpc_bench_cuda_gemm, asserted here with tolerances set by the
 * precision), the naive and tiled kernels agree, copies return positive
 * times with bandwidth under what the device can do, and the pipeline over
 * 1, 2 and 4 streams returns its input transformed exactly as the host
 * computes it. Exits 77 without a GPU. */
#include "testutil.h"

#include "tools/bench_cuda.h"

#include <stdio.h>
#include <string.h>

static void test_gemm_kernels_match_float64(void **state) {
    (void)state;
    int major = 0, minor = 0;
    TEST_OK(gpc_bench_cuda_device_info(0, NULL, 0, &major, &minor, NULL));
    const double tol[] = {1e-4, 1e-2, 2e-2, 1e-2, 2e-2};
    int sizes[] = {256, 384 + 16 * (int)(test_seed() % 8)}; /* one size not a multiple of 32 */
    for (int s = 0; s < 2; s++) {
        for (int k = GPC_GEMM_NAIVE; k <= GPC_GEMM_CUBLAS; k++) {
            for (int p = GPC_GEMM_F32; p <= GPC_GEMM_FP8; p++) {
                if (k != GPC_GEMM_CUBLAS && p != GPC_GEMM_F32) continue;
                if (p == GPC_GEMM_FP8 && major * 10 + minor < 89) continue;
                double seconds = 0, error = -1;
                TEST_OK(gpc_bench_cuda_gemm(0, k, p, sizes[s], 2, &seconds, &error));
                if (!(error >= 0 && error <= tol[p]))
                    fail_msg("%s-%s n=%d: error %g over %g", gpc_gemm_kernel_name(k),
                             gpc_gemm_precision_name(p), sizes[s], error, tol[p]);
                assert_true(seconds > 0);
            }
        }
    }
    double t, e;
    TEST_FAILS(gpc_bench_cuda_gemm(0, GPC_GEMM_TILED, GPC_GEMM_BF16, 256, 1, &t, &e),
               GPC_ERR_UNSUPPORTED, "f32 only");
}

static void test_copies_and_overlap(void **state) {
    (void)state;
    const size_t bytes = 64u << 20;
    for (int d = GPC_COPY_H2D; d <= GPC_COPY_D2D; d++)
        for (int m = GPC_COPY_PAGEABLE; m <= GPC_COPY_MANAGED_PREFETCH; m++) {
            double seconds = 0;
            TEST_OK(gpc_bench_cuda_copy(0, m, d, bytes, 3, &seconds));
            double gbps = bytes / seconds / 1e9;
            /* no host link or HBM moves more than 10 TB/s */
            if (!(seconds > 0 && gbps < 10000))
                fail_msg("%s %s: %g s (%g GB/s)", gpc_copy_direction_name(d),
                         gpc_copy_memory_name(m), seconds, gbps);
        }
    /* the pipeline's output, whatever the streams' interleaving, is the
     * host's transform of its input to the bit (its speed is gpc bench's
     * to report, not a test's to judge) */
    for (int streams = 1; streams <= 4; streams *= 2) {
        double seconds = 0, error = -1;
        TEST_OK(gpc_bench_cuda_overlap(0, streams, 64u << 20, 16, 3, &seconds, &error));
        if (!(seconds > 0 && error == 0))
            fail_msg("%d streams: %g s, output off by %g", streams, seconds, error);
    }
}

int main(void) {
    if (gpc_bench_cuda_device_count() <= 0) {
        printf("no GPU: %s\n", gpc_last_error());
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_kernels_match_float64),
        cmocka_unit_test(test_copies_and_overlap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
