/* test_diagnose.c: the classifier of gpc/diagnose.h on recorded traces
 * (the CSV files of tests/fixtures/doctor), one per failure kind, each named alone,
 * and healthy traces named by nothing; the trace reader's errors; the peak
 * table behind MFU; and the post-mortem of three run folders (an
 * out-of-memory end whose remedy matches gpc plan's model, a healthy run
 * whose MFU matches 6N + 6LCT computed here, a power-capped run, a
 * data-parallel run waiting on its all-reduce, and two runs whose metrics
 * record the step's wait for input: high, named input-bound with its
 * figures, and low, named by nothing though some steps stall). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/diagnose.h"
#include "gpc/plan.h"

/* The kinds gpc_diagnose names for a fixture trace, as a bit set. */
static unsigned classify(const char *fixture, gpc_diag_finding *out, int *count) {
    char rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/doctor/%s", fixture);
    char *path = test_source_path(rel);
    gpc_diag_sample *samples;
    int n;
    TEST_OK(gpc_diag_trace_read(path, &samples, &n));
    assert_true(n >= 10);
    *count = gpc_diagnose(samples, n, out, 16);
    unsigned kinds = 0;
    for (int i = 0; i < *count; i++) {
        kinds |= 1u << out[i].kind;
        /* every finding says what was seen and what to do */
        assert_true(strlen(out[i].text) > 20);
        assert_true(strlen(out[i].remedy) > 20);
    }
    free(samples);
    gpc_free(path);
    return kinds;
}

static void expect_only(const char *fixture, gpc_diag_kind kind, const char *in_text,
                        const char *in_remedy) {
    gpc_diag_finding out[16];
    int count;
    unsigned kinds = classify(fixture, out, &count);
    if (kinds != 1u << kind || count != 1)
        fail_msg("%s: expected only %s, got %d findings (first: %s)", fixture,
                 gpc_diag_kind_name(kind), count, count ? out[0].text : "none");
    if (!strstr(out[0].text, in_text))
        fail_msg("%s: '%s' lacks '%s'", fixture, out[0].text, in_text);
    if (!strstr(out[0].remedy, in_remedy))
        fail_msg("%s: remedy '%s' lacks '%s'", fixture, out[0].remedy, in_remedy);
}

static void test_healthy_traces_give_nothing(void **state) {
    (void)state;
    gpc_diag_finding out[16];
    int count;
    assert_int_equal(classify("healthy.csv", out, &count), 0);
    assert_int_equal(classify("healthy_nvml_only.csv", out, &count), 0);
}

static void test_each_kind_is_named_alone(void **state) {
    (void)state;
    expect_only("launch_bound.csv", GPC_DIAG_LAUNCH_BOUND, "SM activity", "CUDA graph");
    expect_only("launch_bound_nvml_only.csv", GPC_DIAG_LAUNCH_BOUND, "utilisation", "CUDA graph");
    expect_only("input_bound.csv", GPC_DIAG_INPUT_BOUND, "swings", "loader threads");
    expect_only("input_bound_copies.csv", GPC_DIAG_INPUT_BOUND, "PCIe", "pin the host buffers");
    expect_only("under_occupied.csv", GPC_DIAG_UNDER_OCCUPIED, "occupancy", "micro-batch");
    expect_only("power_capped.csv", GPC_DIAG_POWER_CAPPED, "75%", "nvidia-smi");
    expect_only("thermal.csv", GPC_DIAG_THERMAL, "85 C", "airflow");
    expect_only("memory_full.csv", GPC_DIAG_MEMORY_FULL, "90%", "--total-batch");
    expect_only("communication.csv", GPC_DIAG_COMMUNICATION, "all-reduce", "--bucket-mb");
}

/* The thresholds sit where their comments say: just over and just under. */
static void test_thresholds_are_the_named_constants(void **state) {
    (void)state;
    gpc_diag_sample s[4];
    gpc_diag_finding out[8];
    for (int i = 0; i < 4; i++) {
        gpc_diag_sample_clear(&s[i]);
        s[i].util = GPC_DIAG_UTIL_LOW + 1;
        s[i].cpu_top_thread = 100;
        s[i].memory_frac = GPC_DIAG_MEMORY_FRAC;
        s[i].temperature_c = GPC_DIAG_TEMPERATURE_HOT;
    }
    assert_int_equal(gpc_diagnose(s, 4, out, 8), 0); /* at the limits: fine */
    for (int i = 0; i < 4; i++) {
        s[i].util = GPC_DIAG_UTIL_LOW - 1;
        s[i].memory_frac = GPC_DIAG_MEMORY_FRAC + 0.01;
        s[i].temperature_c = GPC_DIAG_TEMPERATURE_HOT + 1;
    }
    assert_int_equal(gpc_diagnose(s, 4, out, 8), 3);
    assert_int_equal(out[0].kind, GPC_DIAG_LAUNCH_BOUND);
    assert_int_equal(out[1].kind, GPC_DIAG_THERMAL);
    assert_int_equal(out[2].kind, GPC_DIAG_MEMORY_FULL);
    /* max bounds what is written */
    assert_int_equal(gpc_diagnose(s, 4, out, 1), 1);
    assert_int_equal(gpc_diagnose(s, 0, out, 8), 0);
}

static char *write_temp(const char *dir, const char *name, const char *text) {
    char *path = gpc_malloc(strlen(dir) + strlen(name) + 2);
    sprintf(path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static void test_trace_reader_refuses_bad_files(void **state) {
    (void)state;
    char *dir = test_tmpdir("diag_trace");
    gpc_diag_sample *s = NULL;
    int n = 0;
    char *p = write_temp(dir, "a.csv", "util,gpu_heat\n1,2\n");
    TEST_FAILS(gpc_diag_trace_read(p, &s, &n), GPC_ERR_FORMAT, "'gpu_heat' is not a trace field");
    gpc_free(p);
    p = write_temp(dir, "b.csv", "util,step_ms\n50,abc\n");
    TEST_FAILS(gpc_diag_trace_read(p, &s, &n), GPC_ERR_FORMAT, "line 2: 'abc' is not a number");
    gpc_free(p);
    p = write_temp(dir, "c.csv", "util\n50,3\n");
    TEST_FAILS(gpc_diag_trace_read(p, &s, &n), GPC_ERR_FORMAT, "more cells than the header");
    gpc_free(p);
    p = write_temp(dir, "d.csv", "# only a comment\nutil\n");
    TEST_FAILS(gpc_diag_trace_read(p, &s, &n), GPC_ERR_FORMAT, "holds no samples");
    assert_null(s);
    gpc_free(p);
    /* empty cells and missing columns are unknown */
    p = write_temp(dir, "e.csv", "step_ms, util\n12.5,\n");
    TEST_OK(gpc_diag_trace_read(p, &s, &n));
    assert_int_equal(n, 1);
    assert_true(s[0].step_ms == 12.5 && s[0].util == -1 && s[0].sm_active == -1);
    free(s);
    gpc_free(p);
    test_rmtree(dir);
    gpc_free(dir);
}

static void test_peak_table(void **state) {
    (void)state;
    assert_true(gpc_diag_peak_flops("NVIDIA H200", "bf16") == 989e12);
    assert_true(gpc_diag_peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989e12);
    assert_true(gpc_diag_peak_flops("NVIDIA H100 PCIe", "f16") == 756e12);
    assert_true(gpc_diag_peak_flops("NVIDIA A100-SXM4-80GB", "f32") == 19.5e12);
    assert_true(gpc_diag_peak_flops("NVIDIA L4", "bf16") == 121e12);
    assert_true(gpc_diag_peak_flops("NVIDIA L40S", "bf16") == 362e12);
    assert_true(gpc_diag_peak_flops("Imaginary GPU 9000", "bf16") == 0);
    assert_true(gpc_diag_peak_flops("", "bf16") == 0);
    assert_true(gpc_diag_peak_flops(NULL, "bf16") == 0);
}

static void test_oom_lines(void **state) {
    (void)state;
    assert_true(gpc_diag_is_oom_line("gpc train: error: out of GPU memory on cuda:0: asked for "
                                     "6.00 GiB, 2.10 GiB free of 79.11 GiB"));
    assert_true(gpc_diag_is_oom_line("cuda: no room for 512.0 MiB of scratch memory on cuda:1; "
                                     "lower --batch or free GPU memory"));
    assert_true(gpc_diag_is_oom_line("RuntimeError: CUDA out of memory. Tried to allocate"));
    assert_false(gpc_diag_is_oom_line("step 100: loss 3.2, memory 61.2 GiB"));
    assert_false(gpc_diag_is_oom_line("gpc train: error: data/x: no such file"));
}

static gpc_diag_run_summary run_fixture(const char *name, gpc_diag_finding *out, int *count) {
    char rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/doctor/%s", name);
    char *path = test_source_path(rel);
    gpc_diag_run_summary s;
    TEST_OK(gpc_diag_run(path, NULL, &s, out, 16, count));
    gpc_free(path);
    return s;
}

static void test_run_oom_says_what_fits(void **state) {
    (void)state;
    gpc_diag_finding out[16];
    int count;
    gpc_diag_run_summary s = run_fixture("run_oom", out, &count);
    assert_int_equal(s.out_of_memory, 1);
    assert_int_equal(s.steps, 0);
    assert_non_null(strstr(s.oom_line, "out of GPU memory on cuda:0"));
    assert_int_equal(count, 1);
    assert_int_equal(out[0].kind, GPC_DIAG_OUT_OF_MEMORY);
    /* the reference: gpc plan's model for config.txt's run in the GPU's
     * 79.11 GiB (the OOM message's total) */
    gpc_plan_input in;
    gpc_plan_defaults(&in);
    in.layers = in.heads = 24;
    in.channels = 1536;
    in.context = 1024;
    in.batch = 64;
    uint64_t bytes = (uint64_t)(79.11 * 1073741824.0);
    int fits = gpc_plan_max_batch(&in, bytes);
    assert_true(fits > 0 && fits < 64);
    in.recompute = 2;
    int fits_rc = gpc_plan_max_batch(&in, bytes);
    char want[64];
    snprintf(want, sizeof want, "--batch %d fits", fits);
    if (!strstr(out[0].remedy, want)) fail_msg("'%s' lacks '%s'", out[0].remedy, want);
    snprintf(want, sizeof want, "with --recompute 2, --batch %d fits", fits_rc);
    if (fits_rc > fits && !strstr(out[0].remedy, want))
        fail_msg("'%s' lacks '%s'", out[0].remedy, want);
}

static void test_run_healthy_mfu(void **state) {
    (void)state;
    gpc_diag_finding out[16];
    int count;
    gpc_diag_run_summary s = run_fixture("run_healthy", out, &count);
    if (count) fail_msg("a healthy run got '%s'", out[0].text);
    assert_int_equal(s.out_of_memory, 0);
    assert_int_equal(s.steps, 40);
    /* 6N + 6LCT for config.txt's d12, and 989 TFLOP/s for an H200 in bf16 */
    double fpt = 6.0 * 124475904 + 6.0 * 12 * 768 * 1024;
    assert_true(s.flops_per_token == fpt);
    assert_true(s.peak_flops == 989e12);
    /* the fixture's steps take 1070 +- 8 ms for 524288 tokens */
    double lo = 524288 / 1.078 * fpt / 989e12, hi = 524288 / 1.062 * fpt / 989e12;
    if (!(s.mfu > lo && s.mfu < hi)) fail_msg("MFU %g outside [%g, %g]", s.mfu, lo, hi);
}

static void test_run_power_capped(void **state) {
    (void)state;
    gpc_diag_finding out[16];
    int count;
    gpc_diag_run_summary s = run_fixture("run_power", out, &count);
    assert_int_equal(count, 1);
    assert_int_equal(out[0].kind, GPC_DIAG_POWER_CAPPED);
    assert_int_equal(s.out_of_memory, 0);
    assert_true(s.mfu > 0.2 && s.mfu < 0.4);
}

/* A data-parallel run whose steps wait a third of their time on the
 * gradient exchange (comm_exposed, written by the trainer from
 * gpc_ddp_comm_times): doctor names communication and nothing else. */
static void test_run_communication(void **state) {
    (void)state;
    gpc_diag_finding out[16];
    int count;
    run_fixture("run_comm", out, &count);
    assert_int_equal(count, 1);
    assert_int_equal(out[0].kind, GPC_DIAG_COMMUNICATION);
    /* the median of 0.30, 0.32, 0.34, 0.36 over the steps after the first two */
    if (!strstr(out[0].text, "communication: 3")) fail_msg("text: %s", out[0].text);
}

/* The measured input wait against GPC_DIAG_INPUT_WAIT: at it, nothing;
 * just over it, input-bound with the figures; unknown, the stalls of the
 * same steps suggest input-bound as before; known and low, they do not. */
static void test_input_wait_threshold(void **state) {
    (void)state;
    gpc_diag_sample s[20];
    gpc_diag_finding out[8];
    for (int i = 0; i < 20; i++) {
        gpc_diag_sample_clear(&s[i]);
        s[i].step_ms = i % 5 == 0 ? 300 : 100; /* a fifth of the steps stall */
        s[i].input_wait = GPC_DIAG_INPUT_WAIT;
        s[i].input_wait_ms = GPC_DIAG_INPUT_WAIT * s[i].step_ms;
    }
    assert_int_equal(gpc_diagnose(s, 20, out, 8), 0);
    for (int i = 0; i < 20; i++) {
        s[i].input_wait = GPC_DIAG_INPUT_WAIT + 0.01;
        s[i].input_wait_ms = s[i].input_wait * s[i].step_ms;
    }
    assert_int_equal(gpc_diagnose(s, 20, out, 8), 1);
    assert_int_equal(out[0].kind, GPC_DIAG_INPUT_BOUND);
    if (!strstr(out[0].text, "waits 21% of its time (21.0 ms of 100.0 ms)"))
        fail_msg("text: %s", out[0].text);
    assert_non_null(strstr(out[0].remedy, "loader more threads"));
    assert_int_equal(out[0].nfigures, 3);
    assert_string_equal(out[0].figures[0].name, "input_wait");
    assert_true(fabs(out[0].figures[0].value - (GPC_DIAG_INPUT_WAIT + 0.01)) < 1e-12);
    assert_string_equal(out[0].figures[1].name, "input_wait_ms");
    assert_true(fabs(out[0].figures[1].value - 100 * (GPC_DIAG_INPUT_WAIT + 0.01)) < 1e-9);
    assert_string_equal(out[0].figures[2].name, "step_ms");
    assert_true(out[0].figures[2].value == 100);
    /* a saturated host thread is the loader's when the wait is measured */
    for (int i = 0; i < 20; i++) {
        s[i].util = GPC_DIAG_UTIL_LOW - 20;
        s[i].cpu_top_thread = 100;
    }
    assert_int_equal(gpc_diagnose(s, 20, out, 8), 1);
    assert_int_equal(out[0].kind, GPC_DIAG_INPUT_BOUND);
    for (int i = 0; i < 20; i++) {
        gpc_diag_sample_clear(&s[i]);
        s[i].step_ms = i % 5 == 0 ? 300 : 100;
    }
    assert_int_equal(gpc_diagnose(s, 20, out, 8), 1); /* unknown: the stalls */
    assert_int_equal(out[0].kind, GPC_DIAG_INPUT_BOUND);
    assert_non_null(strstr(out[0].text, "of steps take over"));
    assert_int_equal(out[0].nfigures, 0);
    for (int i = 0; i < 20; i++)
        s[i].input_wait = 0.01;
    assert_int_equal(gpc_diagnose(s, 20, out, 8), 0); /* measured low: not the loader */
}

/* The trainer's input_wait, high: input-bound with the medians of the
 * steps after the first two (1618..1630 ms of 2688..2700), and no
 * under-occupied for the low MFU that the waiting causes. */
static void test_run_input_bound(void **state) {
    (void)state;
    gpc_diag_finding out[16];
    int count;
    gpc_diag_run_summary s = run_fixture("run_input", out, &count);
    if (count != 1) fail_msg("%d findings, first: %s", count, count ? out[0].text : "none");
    assert_int_equal(out[0].kind, GPC_DIAG_INPUT_BOUND);
    /* the reference: the fixture's steps 3..40 are 2694 + 3d ms waiting
     * 1624 + 3d ms, d = -2..2 in turn, the share written to 4 decimals;
     * their median share is that of d = 0, as the share grows with d */
    assert_int_equal(out[0].nfigures, 3);
    assert_true(fabs(out[0].figures[0].value - round(1624.0 / 2694.0 * 1e4) / 1e4) < 1e-12);
    assert_true(out[0].figures[1].value == 1624.0);
    assert_true(out[0].figures[2].value == 2694.0);
    if (!strstr(out[0].text, "waits 60% of its time (1624.0 ms of 2694.0 ms)"))
        fail_msg("text: %s", out[0].text);
    assert_true(s.mfu > 0 && s.mfu < GPC_DIAG_MFU_LOW * 2);
    double share, wait_ms;
    char *path = test_source_path("tests/fixtures/doctor/run_input");
    TEST_OK(gpc_diag_run_input_wait(path, 0, &share, &wait_ms));
    assert_true(share == out[0].figures[0].value && wait_ms == 1624.0);
    /* the last 3 steps: d = -2, -1, 0 (steps 38..40) */
    TEST_OK(gpc_diag_run_input_wait(path, 3, &share, &wait_ms));
    assert_true(wait_ms == 1621.0);
    gpc_free(path);
    path = test_source_path("tests/fixtures/doctor/run_healthy");
    TEST_OK(gpc_diag_run_input_wait(path, 20, &share, &wait_ms));
    assert_true(share == -1 && wait_ms == -1); /* not recorded */
    gpc_free(path);
}

/* input_wait low while a step in eight stalls (2.2x the median): the
 * measured wait says the loader keeps up, so nothing is named. */
static void test_run_input_low(void **state) {
    (void)state;
    gpc_diag_finding out[16];
    int count;
    gpc_diag_run_summary s = run_fixture("run_input_low", out, &count);
    if (count) fail_msg("got '%s'", out[0].text);
    assert_true(s.mfu > 0.3);
}

static void test_run_unknown_gpu_and_bad_folders(void **state) {
    (void)state;
    char *dir = test_tmpdir("diag_run");
    gpc_diag_finding out[16];
    int count;
    gpc_diag_run_summary s;
    TEST_FAILS(gpc_diag_run("/nonexistent/run", NULL, &s, out, 16, &count), GPC_ERR_INVALID_ARG,
               "is not a directory");
    TEST_FAILS(gpc_diag_run(dir, NULL, &s, out, 16, &count), GPC_ERR_INVALID_ARG,
               "neither config.txt nor metrics.jsonl");
    char *c = write_temp(dir, "config.txt",
                         "layers=2\nheads=2\nchannels=128\ncontext=64\nparameters=6800000\n"
                         "batch=1\nprecision=bf16\ngpu_name=Imaginary GPU 9000\n");
    char *m = write_temp(dir, "metrics.jsonl", "{\"step\":0,\"tokens_per_s\":1000,\"ms\":64}\n");
    TEST_OK(gpc_diag_run(dir, NULL, &s, out, 16, &count));
    assert_true(s.mfu == -1 && s.peak_flops == -1);
    assert_non_null(strstr(s.peak_note, "unknown GPU 'Imaginary GPU 9000'"));
    TEST_FAILS(gpc_diag_run(dir, "/nonexistent.log", &s, out, 16, &count), GPC_ERR_IO,
               "cannot read the log");
    gpc_free(c);
    gpc_free(m);
    test_rmtree(dir);
    gpc_free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_healthy_traces_give_nothing),
        cmocka_unit_test(test_each_kind_is_named_alone),
        cmocka_unit_test(test_thresholds_are_the_named_constants),
        cmocka_unit_test(test_trace_reader_refuses_bad_files),
        cmocka_unit_test(test_peak_table),
        cmocka_unit_test(test_oom_lines),
        cmocka_unit_test(test_run_oom_says_what_fits),
        cmocka_unit_test(test_run_healthy_mfu),
        cmocka_unit_test(test_run_power_capped),
        cmocka_unit_test(test_run_communication),
        cmocka_unit_test(test_input_wait_threshold),
        cmocka_unit_test(test_run_input_bound),
        cmocka_unit_test(test_run_input_low),
        cmocka_unit_test(test_run_unknown_gpu_and_bad_folders),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
