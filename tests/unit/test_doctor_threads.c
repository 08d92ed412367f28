/* test_doctor_threads.c: gpc doctor's OpenMP finding from given figures:
 * threads within idle cores pass; more threads than cores, or a load that
 * already holds the cores, is a problem whose advice names the thread
 * count that fits (and the passive wait policy when it is not set). */
#include "testutil.h"

#include <stdio.h>
#include <string.h>

#include "gpc/doctor.h"

typedef struct {
    char text[16][512];
    gpc_doctor_kind kind[16];
    int n;
} sink;

static void collect(void *user, gpc_doctor_kind kind, const char *text) {
    sink *s = user;
    if (s->n >= 16) return;
    s->kind[s->n] = kind;
    snprintf(s->text[s->n], sizeof s->text[0], "%s", text);
    s->n++;
}

static sink check(int threads, const char *env, int cores, double load, const char *policy) {
    sink s;
    memset(&s, 0, sizeof s);
    gpc_doctor *d = NULL;
    TEST_OK(gpc_doctor_open(collect, &s, &d));
    gpc_doctor_check_threads(d, threads, env, cores, load, policy);
    assert_int_equal(gpc_doctor_problems(d), s.n > 0 && s.kind[0] == GPC_DOCTOR_PROBLEM);
    gpc_doctor_close(d);
    return s;
}

static void test_threads_findings(void **state) {
    (void)state;
    /* idle: 8 threads on 8 cores at load 0.5 */
    sink s = check(8, NULL, 8, 0.5, "passive");
    assert_int_equal(s.n, 1);
    assert_int_equal(s.kind[0], GPC_DOCTOR_OK);
    assert_string_equal(s.text[0], "OpenMP: 8 threads (OMP_NUM_THREADS=unset) on 8 cores, "
                                   "waiting passive");
    /* a load of one besides this process is the slack: still fine */
    s = check(2, "2", 2, 1.0, "passive");
    assert_int_equal(s.kind[0], GPC_DOCTOR_OK);
    /* more threads than cores */
    s = check(16, "16", 8, 0.0, NULL);
    assert_int_equal(s.n, 2);
    assert_int_equal(s.kind[0], GPC_DOCTOR_PROBLEM);
    assert_non_null(strstr(s.text[0], "16 threads (OMP_NUM_THREADS=16) on 8 cores, waiting "
                                      "active (libgomp's default: spinning)"));
    assert_non_null(strstr(s.text[1], "set OMP_NUM_THREADS=8"));
    /* a busy machine: load 5.5 on 8 cores leaves 2 for 8 threads */
    s = check(8, NULL, 8, 5.5, "passive");
    assert_int_equal(s.n, 2);
    assert_int_equal(s.kind[0], GPC_DOCTOR_PROBLEM);
    assert_non_null(strstr(s.text[0], "oversubscribed: the load is already 5.50"));
    assert_int_equal(s.kind[1], GPC_DOCTOR_ADVICE);
    assert_non_null(strstr(s.text[1], "set OMP_NUM_THREADS=2, or run when the load is lower"));
    assert_null(strstr(s.text[1], "OMP_WAIT_POLICY"));
    /* busier than its cores: one thread, and passive waiting when spinning */
    s = check(2, NULL, 2, 7.0, "active");
    assert_non_null(strstr(s.text[1], "set OMP_NUM_THREADS=1"));
    assert_non_null(strstr(s.text[1], "with OMP_WAIT_POLICY=passive"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads_findings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
