/* test_energy.c: gpc_energy_sustain (src/core/energy.c) without a GPU: a
 * fake call and a fake wait whose duration is chosen, so the batches, the
 * calls counted in the measured stretch and the time are known in advance;
 * without NVML the energy is unknown (-1), never zero; a failing call stops
 * the run with its own error; bad arguments are refused. */
#include "testutil.h"

#include <string.h>
#include <time.h>

#include "gpc/energy.h"

#define MAX_BATCHES 4096

/* What the fakes saw: calls since the last wait, each batch's size. */
typedef struct {
    long calls, pending, fail_at;
    double wait_s;
    long batches[MAX_BATCHES];
    int num_batches;
} fake;

static gpc_status fake_call(void *ctx) {
    fake *f = (fake *)ctx;
    if (f->fail_at > 0 && f->calls + 1 == f->fail_at)
        return gpc_error(GPC_ERR_DEVICE, "fake call %ld failed", f->fail_at);
    f->calls++;
    f->pending++;
    return GPC_OK;
}

static gpc_status fake_wait(void *ctx) {
    fake *f = (fake *)ctx;
    struct timespec ts = {0, (long)(f->wait_s * 1e9)};
    nanosleep(&ts, NULL);
    if (f->num_batches < MAX_BATCHES) f->batches[f->num_batches++] = f->pending;
    f->pending = 0;
    return GPC_OK;
}

/* A device that finishes each batch in about 1 ms: batches under
 * GPC_ENERGY_BATCH_S double from 1 (a loaded machine may slow one past it,
 * which keeps its size), and the settling part of 0 s is one batch of one
 * call, left out of the count. */
static void test_batches_double_while_short(void **state) {
    (void)state;
    fake f;
    memset(&f, 0, sizeof f);
    f.wait_s = 0.001;
    gpc_energy_run r;
    assert_int_equal(gpc_energy_sustain(NULL, -1, fake_call, fake_wait, &f, 0.0, 0.01, &r), GPC_OK);
    assert_true(f.num_batches >= 2);
    assert_int_equal(f.batches[0], 1);
    long sum = 0;
    int doubled = 0;
    for (int b = 0; b < f.num_batches; b++) {
        if (b > 0) {
            assert_true(f.batches[b] == f.batches[b - 1] || f.batches[b] == 2 * f.batches[b - 1]);
            doubled += f.batches[b] == 2 * f.batches[b - 1];
        }
        sum += f.batches[b];
    }
    assert_true(doubled >= 1);
    assert_int_equal(sum, f.calls);
    assert_int_equal(r.calls, f.calls - 1);
    assert_true(r.seconds >= 0.01 && r.seconds < 5.0);
    assert_true(r.joules == -1.0);
    assert_int_equal(r.sm_clock_mhz, -1);
    assert_int_equal(r.throttle_reasons, -1);
}

/* A device that takes 12 ms a batch: batches stay at one call; the
 * settling part of 30 ms takes some of them, the measured part the rest. */
static void test_batches_stay_when_long(void **state) {
    (void)state;
    fake f;
    memset(&f, 0, sizeof f);
    f.wait_s = 0.012;
    gpc_energy_run r;
    assert_int_equal(gpc_energy_sustain(NULL, -1, fake_call, fake_wait, &f, 0.03, 0.05, &r),
                     GPC_OK);
    for (int b = 0; b < f.num_batches; b++)
        assert_int_equal(f.batches[b], 1);
    assert_int_equal(f.num_batches, f.calls);
    assert_true(r.calls >= 1 && r.calls <= f.calls - 1);
    /* the measured calls' time is their waits' */
    assert_true(r.seconds >= 0.05 && r.seconds >= r.calls * 0.012 * 0.99);
    assert_true(r.joules == -1.0);
}

static void test_a_failing_call_stops_the_run(void **state) {
    (void)state;
    fake f;
    memset(&f, 0, sizeof f);
    f.wait_s = 0.001;
    f.fail_at = 5; /* after two or more batches (1, 2, then 4 calls) */
    gpc_energy_run r;
    TEST_FAILS(gpc_energy_sustain(NULL, -1, fake_call, fake_wait, &f, 0.0, 10.0, &r),
               GPC_ERR_DEVICE, "fake call 5 failed");
    assert_int_equal(f.calls, 4);
    assert_true(f.num_batches >= 2 && f.num_batches <= 4);
}

static void test_refuses_bad_arguments(void **state) {
    (void)state;
    fake f;
    memset(&f, 0, sizeof f);
    gpc_energy_run r;
    TEST_FAILS(gpc_energy_sustain(NULL, -1, NULL, fake_wait, &f, 0.0, 1.0, &r), GPC_ERR_INVALID_ARG,
               "needs a call");
    TEST_FAILS(gpc_energy_sustain(NULL, -1, fake_call, NULL, &f, 0.0, 1.0, &r), GPC_ERR_INVALID_ARG,
               "needs a call");
    TEST_FAILS(gpc_energy_sustain(NULL, -1, fake_call, fake_wait, &f, 0.0, 0.0, &r),
               GPC_ERR_INVALID_ARG, "more than 0");
    TEST_FAILS(gpc_energy_sustain(NULL, -1, fake_call, fake_wait, &f, -1.0, 1.0, &r),
               GPC_ERR_INVALID_ARG, "settling");
    assert_int_equal(f.calls, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batches_double_while_short),
        cmocka_unit_test(test_batches_stay_when_long),
        cmocka_unit_test(test_a_failing_call_stops_the_run),
        cmocka_unit_test(test_refuses_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
