/* test_tools.c: the tools layer's library calls as gpcd or a server would
 * make them: gpc_doctor's findings through a sink (problems counted as the
 * sink saw them, advice only after a finding, a missing process refused),
 * gpc_report on a run written here (steps, final loss, config, the warning
 * for an unfinished line, the page's figures), and gpc_format_bytes. */
#include "testutil.h"

#include "gpc/doctor.h"
#include "gpc/report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    int count[5];
    int advice_alone; /* advice before any finding, or right after a section */
    int after_finding;
    char first_section[256];
} seen;

static void collect(void *user, gpc_doctor_kind kind, const char *text) {
    seen *s = user;
    assert_true((unsigned)kind < 5);
    assert_true(text[0] != 0);
    s->count[kind]++;
    if (kind == GPC_DOCTOR_ADVICE && !s->after_finding) s->advice_alone++;
    s->after_finding = kind != GPC_DOCTOR_SECTION;
    if (kind == GPC_DOCTOR_SECTION && !s->first_section[0])
        snprintf(s->first_section, sizeof s->first_section, "%s", text);
}

static void test_doctor_sink(void **state) {
    (void)state;
    seen s;
    memset(&s, 0, sizeof s);
    gpc_doctor *d;
    TEST_OK(gpc_doctor_open(collect, &s, &d));
    gpc_doctor_check_machine(d);
    /* the host's CPU, OpenMP and OpenBLAS lines at least */
    assert_true(s.count[GPC_DOCTOR_OK] + s.count[GPC_DOCTOR_PROBLEM] >= 3);
    assert_int_equal(gpc_doctor_problems(d), s.count[GPC_DOCTOR_PROBLEM]);
    /* advice always follows the finding it is about */
    assert_int_equal(s.advice_alone, 0);
    assert_int_equal(s.count[GPC_DOCTOR_SECTION], 0);

    /* this process exists; one that cannot (pid_max is at most 2^22) does not */
    assert_true(gpc_doctor_process_exists((int)getpid()));
    assert_false(gpc_doctor_process_exists(1 << 23));
    TEST_FAILS(gpc_doctor_watch(d, 1 << 23, NULL, 0, 0.1), GPC_ERR_INVALID_ARG,
               "no process with pid 8388608");
    TEST_FAILS(gpc_doctor_watch(d, (int)getpid(), NULL, 0, 0), GPC_ERR_INVALID_ARG, "out of range");
    int before = s.count[GPC_DOCTOR_SECTION];
    TEST_OK(gpc_doctor_watch(d, (int)getpid(), NULL, 0, 0.3));
    assert_int_equal(s.count[GPC_DOCTOR_SECTION], before + 1);
    char want[64];
    snprintf(want, sizeof want, "watching process %d (", (int)getpid());
    assert_non_null(strstr(s.first_section, want));
    assert_int_equal(gpc_doctor_problems(d), s.count[GPC_DOCTOR_PROBLEM]);
    gpc_doctor_close(d);
    assert_string_equal(gpc_doctor_kind_name(GPC_DOCTOR_PROBLEM), "PROBLEM");
    assert_string_equal(gpc_doctor_kind_name(GPC_DOCTOR_ADVICE), "advice");
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static char *read_text(const char *path) {
    char *text;
    size_t size;
    TEST_OK(gpc_read_file(path, &text, &size));
    return text;
}

static void test_report_run(void **state) {
    (void)state;
    char *dir = test_tmpdir("report");
    char path[4096], page[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    /* three steps; the last line unfinished, as when a run is killed */
    write_text(path, "{\"step\": 1, \"loss\": 5.5, \"tokens_per_s\": 100, \"memory\": 2048}\n"
                     "{\"step\": 2, \"loss\": 4.25, \"val_loss\": 4.5, \"tokens_per_s\": 300}\n"
                     "{\"step\": 3, \"loss\": 3.0, \"tokens_per_s\": 500}\n"
                     "{\"step\": 4, \"lo");
    snprintf(path, sizeof path, "%s/config.txt", dir);
    write_text(path, "# a run\nlayers=2\nprecision=bf16\n");

    gpc_report *r;
    TEST_OK(gpc_report_create(&r));
    TEST_FAILS(gpc_report_write_html(r, "/dev/null"), GPC_ERR_INVALID_ARG, "no steps");
    TEST_OK(gpc_report_read(r, dir));
    assert_int_equal(gpc_report_steps(r), 3);
    assert_true(gpc_report_final_loss(r) == 3.0);
    assert_string_equal(gpc_report_config(r, "layers"), "2");
    assert_null(gpc_report_config(r, "heads"));
    assert_non_null(gpc_report_warning(r));
    assert_non_null(strstr(gpc_report_warning(r), "line 4 is unfinished"));
    const char *alerts[] = {"GPU 0 is hot", "GPU 0 <throttled>"};
    gpc_report_set_alerts(r, "gpcd job 7: active alerts on its GPUs", alerts, 2);
    snprintf(page, sizeof page, "%s/page.html", dir);
    TEST_OK(gpc_report_write_html(r, page));
    char *html = read_text(page);
    assert_non_null(strstr(html, "id=\"final-loss\">3.0000<"));
    assert_non_null(strstr(html, "id=\"best-val-loss\">4.5000<"));
    /* median tokens/s after the first step: (300 + 500) / 2 */
    assert_non_null(strstr(html, "id=\"tokens-per-s\">400<"));
    assert_non_null(strstr(html, "id=\"peak-memory\">2.0 KiB<"));
    assert_non_null(strstr(html, "<li>GPU 0 &lt;throttled&gt;</li>"));
    assert_non_null(strstr(html, "gpcd job 7: active alerts on its GPUs"));
    gpc_free(html);
    gpc_report_free(r);

    /* no metrics file: an error naming it */
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    remove(path);
    TEST_OK(gpc_report_create(&r));
    TEST_FAILS(gpc_report_read(r, dir), GPC_ERR_IO, "metrics.jsonl does not exist");
    assert_null(gpc_report_warning(r));
    gpc_report_free(r);
    test_rmtree(dir);
    gpc_free(dir);
}

static void test_format_bytes(void **state) {
    (void)state;
    char buf[32];
    assert_string_equal(gpc_format_bytes(0, buf, sizeof buf), "0 B");
    assert_string_equal(gpc_format_bytes(1023, buf, sizeof buf), "1023 B");
    assert_string_equal(gpc_format_bytes(1536, buf, sizeof buf), "1.5 KiB");
    assert_string_equal(gpc_format_bytes(141.0 * (1 << 30), buf, sizeof buf), "141.0 GiB");
    assert_string_equal(gpc_format_bytes(3.0 * 1024 * 1024 * 1024 * 1024 * 1024, buf, sizeof buf),
                        "3072.0 TiB");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_doctor_sink),
        cmocka_unit_test(test_report_run),
        cmocka_unit_test(test_format_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
