/*
 * test_settings.c: the table of settings (src/core/settings.c) and its
 * accessors: every row well formed, each type parsed as documented, a bad
 * value warned about once and replaced by the default (or, read checked,
 * refused), an override ahead of the environment, and a name missing from
 * the table logged as an error.
 */
#include "testutil.h"

#include "gpc/settings.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What stderr received while fn(arg) ran (gpc_log writes there), in out. */
static void capture_stderr(void (*fn)(void *), void *arg, char *out, size_t size) {
    fflush(stderr);
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    int saved = dup(2);
    assert_true(saved >= 0);
    assert_true(dup2(fileno(tmp), 2) >= 0);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t n = fread(out, 1, size - 1, tmp);
    out[n] = '\0';
    fclose(tmp);
}

static int count_of(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

static void test_table_rows(void **state) {
    (void)state;
    static const char *const groups[] = {"everyday", "numerics",   "distributed",
                                         "gpcd",     "benchmarks", "tests"};
    size_t n = gpc_settings_count();
    assert_true(n >= 40);
    assert_null(gpc_settings_at(n));
    int last_group = -1;
    for (size_t i = 0; i < n; i++) {
        const gpc_setting_info *s = gpc_settings_at(i);
        assert_non_null(s);
        /* a name of capitals, digits and underscores after GPC_ */
        assert_int_equal(strncmp(s->name, "GPC_", 4), 0);
        assert_int_equal(strspn(s->name, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"), strlen(s->name));
        assert_ptr_equal(gpc_settings_find(s->name), s); /* and only one row of it */
        /* the groups in the order gpc help env prints them, each rows in one run */
        int g = -1;
        for (int k = 0; k < 6; k++)
            if (strcmp(s->group, groups[k]) == 0) g = k;
        if (g < 0) fail_msg("%s: group '%s' is not one of the six", s->name, s->group);
        if (g < last_group) fail_msg("%s: group %s comes after a later one", s->name, s->group);
        last_group = g;
        /* one line of help, which fits a terminal next to the name */
        assert_true(strlen(s->help) > 8 && strlen(s->help) <= 100);
        assert_null(strchr(s->help, '\n'));
        assert_null(strchr(s->help, '|')); /* it becomes a markdown table cell */
        if (s->type == GPC_SETTING_FLAG) assert_non_null(s->default_value);
        if (s->choices) assert_int_equal(s->type, GPC_SETTING_STRING);
        /* the default is a value the setting accepts (type, range, choices) */
        if (s->default_value) {
            gpc_status st = gpc_settings_override(s->name, s->default_value);
            if (st != GPC_OK) fail_msg("%s's default: %s", s->name, gpc_last_error());
            TEST_OK(gpc_settings_override(s->name, NULL));
        }
    }
    assert_null(gpc_settings_find("HOME"));
    assert_null(gpc_settings_find(NULL));
}

static void test_flag(void **state) {
    (void)state;
    static const char *const on[] = {"1", "on", "true", "yes", "ON", "True", "YES"};
    static const char *const off[] = {"0", "off", "false", "no", "Off", "FALSE", "No"};
    unsetenv("GPC_STOCHASTIC_ROUNDING");
    assert_int_equal(gpc_setting_flag("GPC_STOCHASTIC_ROUNDING"), 0); /* default 0 */
    for (int i = 0; i < 7; i++) {
        setenv("GPC_STOCHASTIC_ROUNDING", on[i], 1);
        assert_int_equal(gpc_setting_flag("GPC_STOCHASTIC_ROUNDING"), 1);
        setenv("GPC_STOCHASTIC_ROUNDING", off[i], 1);
        assert_int_equal(gpc_setting_flag("GPC_STOCHASTIC_ROUNDING"), 0);
    }
    unsetenv("GPC_STOCHASTIC_ROUNDING");
    setenv("GPC_QKV_BIAS_DERIVED", "", 1); /* empty counts as unset: default 1 */
    assert_int_equal(gpc_setting_flag("GPC_QKV_BIAS_DERIVED"), 1);
    setenv("GPC_QKV_BIAS_DERIVED", "no", 1);
    assert_int_equal(gpc_setting_flag("GPC_QKV_BIAS_DERIVED"), 0);
    unsetenv("GPC_QKV_BIAS_DERIVED");
    assert_int_equal(gpc_setting_flag("GPC_QKV_BIAS_DERIVED"), 1);
}

static void read_bad_flag_twice(void *arg) {
    int *got = arg;
    got[0] = gpc_setting_flag("GPC_FUSED_BIAS_GRADS");
    got[1] = gpc_setting_flag("GPC_FUSED_BIAS_GRADS");
}

/* A word that is not a flag: its default (1 here), and one warning that
 * names it, however often it is read. */
static void test_flag_bad_value(void **state) {
    (void)state;
    gpc_log_set_level(GPC_LOG_INFO);
    setenv("GPC_FUSED_BIAS_GRADS", "2", 1);
    int got[2] = {-1, -1};
    char err[2048];
    capture_stderr(read_bad_flag_twice, got, err, sizeof err);
    unsetenv("GPC_FUSED_BIAS_GRADS");
    assert_int_equal(got[0], 1);
    assert_int_equal(got[1], 1);
    assert_int_equal(count_of(err, "GPC_FUSED_BIAS_GRADS=2 is not 1, on, true, yes, 0, off, "
                                   "false or no: using 1"),
                     1);
}

static void read_workspace(void *arg) {
    *(long *)arg = gpc_setting_int("GPC_MATMUL_WORKSPACE_MB");
}

static void test_int(void **state) {
    (void)state;
    gpc_log_set_level(GPC_LOG_INFO);
    unsetenv("GPC_MATMUL_WORKSPACE_MB");
    assert_int_equal(gpc_setting_int("GPC_MATMUL_WORKSPACE_MB"), 32);
    setenv("GPC_MATMUL_WORKSPACE_MB", "4096", 1);
    assert_int_equal(gpc_setting_int("GPC_MATMUL_WORKSPACE_MB"), 4096);
    setenv("GPC_MATMUL_WORKSPACE_MB", "1", 1);
    assert_int_equal(gpc_setting_int("GPC_MATMUL_WORKSPACE_MB"), 1);
    /* out of range, not a number, trailing text: the default, said once */
    static const char *const bad[] = {"4097", "0", "-3", "lots", "64MB", "1e3"};
    char err[2048];
    long got = -1;
    setenv("GPC_MATMUL_WORKSPACE_MB", bad[0], 1);
    capture_stderr(read_workspace, &got, err, sizeof err);
    assert_int_equal(got, 32);
    assert_non_null(strstr(err, "GPC_MATMUL_WORKSPACE_MB=4097 is not a whole number from 1 to "
                                "4096: using 32"));
    for (int i = 1; i < 6; i++) {
        setenv("GPC_MATMUL_WORKSPACE_MB", bad[i], 1);
        capture_stderr(read_workspace, &got, err, sizeof err);
        assert_int_equal(got, 32);
        assert_string_equal(err, ""); /* the warning came once */
    }
    unsetenv("GPC_MATMUL_WORKSPACE_MB");
    /* no default: 0 when unset */
    unsetenv("GPC_SM90_BLOCKS");
    assert_int_equal(gpc_setting_int("GPC_SM90_BLOCKS"), 0);
    setenv("GPC_SM90_BLOCKS", "3", 1);
    assert_int_equal(gpc_setting_int("GPC_SM90_BLOCKS"), 3);
    unsetenv("GPC_SM90_BLOCKS");
}

static void test_double(void **state) {
    (void)state;
    gpc_log_set_level(GPC_LOG_ERROR); /* the warnings are test_int's to check */
    unsetenv("GPC_DIST_TIMEOUT");
    assert_true(gpc_setting_double("GPC_DIST_TIMEOUT") == 300.0);
    setenv("GPC_DIST_TIMEOUT", "2.5", 1);
    assert_true(gpc_setting_double("GPC_DIST_TIMEOUT") == 2.5);
    setenv("GPC_DIST_TIMEOUT", "1e2", 1);
    assert_true(gpc_setting_double("GPC_DIST_TIMEOUT") == 100.0);
    static const char *const bad[] = {"0", "-1", "soon", "5s", "nan", "inf"};
    for (int i = 0; i < 6; i++) {
        setenv("GPC_DIST_TIMEOUT", bad[i], 1);
        assert_true(gpc_setting_double("GPC_DIST_TIMEOUT") == 300.0);
    }
    unsetenv("GPC_DIST_TIMEOUT");
    setenv("GPC_CUDNN_TUNE_ENERGY_S", "0.001", 1); /* below its 0.01 */
    assert_true(gpc_setting_double("GPC_CUDNN_TUNE_ENERGY_S") == 1.0);
    setenv("GPC_CUDNN_TUNE_ENERGY_S", "0.01", 1);
    assert_true(gpc_setting_double("GPC_CUDNN_TUNE_ENERGY_S") == 0.01);
    unsetenv("GPC_CUDNN_TUNE_ENERGY_S");
    gpc_log_set_level(GPC_LOG_INFO);
}

static void test_string(void **state) {
    (void)state;
    unsetenv("GPC_LOG");
    assert_string_equal(gpc_setting_str("GPC_LOG"), "info");
    assert_null(gpc_setting_given("GPC_LOG"));
    setenv("GPC_LOG", "", 1);
    assert_string_equal(gpc_setting_str("GPC_LOG"), "info");
    assert_null(gpc_setting_given("GPC_LOG"));
    setenv("GPC_LOG", "debug", 1);
    assert_string_equal(gpc_setting_str("GPC_LOG"), "debug");
    assert_string_equal(gpc_setting_given("GPC_LOG"), "debug");
    unsetenv("GPC_LOG");
    unsetenv("GPC_TOKEN"); /* no default */
    assert_null(gpc_setting_str("GPC_TOKEN"));
    /* the text as given, even where the table has choices: the reader
     * decides (attention.cu warns about an unknown backward itself) */
    setenv("GPC_ATTENTION_BWD", "quick", 1);
    assert_string_equal(gpc_setting_str("GPC_ATTENTION_BWD"), "quick");
    unsetenv("GPC_ATTENTION_BWD");
}

static void test_override(void **state) {
    (void)state;
    setenv("GPC_ATTENTION_BWD", "two", 1);
    TEST_OK(gpc_settings_override("GPC_ATTENTION_BWD", "fused")); /* ahead of the environment */
    assert_string_equal(gpc_setting_str("GPC_ATTENTION_BWD"), "fused");
    assert_string_equal(gpc_setting_given("GPC_ATTENTION_BWD"), "fused");
    TEST_FAILS(gpc_settings_override("GPC_ATTENTION_BWD", "quick"), GPC_ERR_INVALID_ARG,
               "GPC_ATTENTION_BWD must be one of auto|two|fused|wgmma, not 'quick'");
    assert_string_equal(gpc_setting_str("GPC_ATTENTION_BWD"), "fused"); /* unchanged */
    TEST_OK(gpc_settings_override("GPC_ATTENTION_BWD", NULL));
    assert_string_equal(gpc_setting_str("GPC_ATTENTION_BWD"), "two");
    unsetenv("GPC_ATTENTION_BWD");
    assert_string_equal(gpc_setting_str("GPC_ATTENTION_BWD"), "auto");

    setenv("GPC_STOCHASTIC_ROUNDING", "0", 1);
    TEST_OK(gpc_settings_override("GPC_STOCHASTIC_ROUNDING", "1"));
    assert_int_equal(gpc_setting_flag("GPC_STOCHASTIC_ROUNDING"), 1);
    TEST_FAILS(gpc_settings_override("GPC_STOCHASTIC_ROUNDING", "maybe"), GPC_ERR_INVALID_ARG,
               "GPC_STOCHASTIC_ROUNDING must be 1, on, true, yes, 0, off, false or no");
    TEST_OK(gpc_settings_override("GPC_STOCHASTIC_ROUNDING", NULL));
    assert_int_equal(gpc_setting_flag("GPC_STOCHASTIC_ROUNDING"), 0);
    unsetenv("GPC_STOCHASTIC_ROUNDING");

    TEST_FAILS(gpc_settings_override("GPC_MATMUL_WORKSPACE_MB", "5000"), GPC_ERR_INVALID_ARG,
               "GPC_MATMUL_WORKSPACE_MB must be a whole number from 1 to 4096, not '5000'");
    TEST_OK(gpc_settings_override("GPC_MATMUL_WORKSPACE_MB", "64"));
    assert_int_equal(gpc_setting_int("GPC_MATMUL_WORKSPACE_MB"), 64);
    TEST_OK(gpc_settings_override("GPC_MATMUL_WORKSPACE_MB", NULL));
    TEST_FAILS(gpc_settings_override("GPC_DIST_TIMEOUT", "-1"), GPC_ERR_INVALID_ARG,
               "GPC_DIST_TIMEOUT must be a number from 0.001 to 1e+07, not '-1'");
    TEST_FAILS(gpc_settings_override("GPC_NO_SUCH_THING", "1"), GPC_ERR_INVALID_ARG,
               "GPC_NO_SUCH_THING is not a gpc setting");
}

static void read_unknown(void *arg) {
    const char **got = arg;
    got[0] = gpc_setting_str("GPC_NO_SUCH_SETTING");
    got[1] = gpc_setting_flag("GPC_NO_SUCH_SETTING") ? "1" : NULL;
    got[2] = gpc_setting_int("GPC_NO_SUCH_SETTING") ? "1" : NULL;
}

/* A name missing from the table is a bug: an error at each read, which
 * answers as if unset without default, even when the environment has it. */
/* The checked read: the default when unset, the value when good, and a
 * bad value an error naming what is allowed, with no default in its place. */
static void test_int_checked(void **state) {
    (void)state;
    long v = -1;
    unsetenv("GPC_LOADER_DELAY_MS");
    TEST_OK(gpc_setting_int_checked("GPC_LOADER_DELAY_MS", &v));
    assert_int_equal(v, 0);
    setenv("GPC_LOADER_DELAY_MS", "60000", 1);
    TEST_OK(gpc_setting_int_checked("GPC_LOADER_DELAY_MS", &v));
    assert_int_equal(v, 60000);
    static const char *const bad[] = {"60001", "-1", "fast", "5ms", "1.5"};
    for (int i = 0; i < 5; i++) {
        char want[128];
        snprintf(want, sizeof want,
                 "GPC_LOADER_DELAY_MS must be a whole number from 0 to 60000, not '%s'", bad[i]);
        setenv("GPC_LOADER_DELAY_MS", bad[i], 1);
        TEST_FAILS(gpc_setting_int_checked("GPC_LOADER_DELAY_MS", &v), GPC_ERR_INVALID_ARG, want);
    }
    unsetenv("GPC_LOADER_DELAY_MS");
    /* a setting of another type is a bug in the caller */
    TEST_FAILS(gpc_setting_int_checked("GPC_LOG", &v), GPC_ERR_INTERNAL, "not an integer setting");
}

static void test_unknown_name(void **state) {
    (void)state;
    gpc_log_set_level(GPC_LOG_INFO);
    setenv("GPC_NO_SUCH_SETTING", "1", 1);
    const char *got[3] = {"x", "x", "x"};
    char err[2048];
    capture_stderr(read_unknown, got, err, sizeof err);
    unsetenv("GPC_NO_SUCH_SETTING");
    assert_null(got[0]);
    assert_null(got[1]);
    assert_null(got[2]);
    assert_int_equal(count_of(err, "gpc: error: GPC_NO_SUCH_SETTING is read as a setting but is "
                                   "not in gpc's table of settings: add it to src/core/settings.c"),
                     3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_rows),     cmocka_unit_test(test_flag),
        cmocka_unit_test(test_flag_bad_value), cmocka_unit_test(test_int),
        cmocka_unit_test(test_double),         cmocka_unit_test(test_string),
        cmocka_unit_test(test_override),       cmocka_unit_test(test_unknown_name),
        cmocka_unit_test(test_int_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
