/*
 * cmd_report.c: `gpc report RUN`, the HTML page of gpc/report.h for a
 * training run. This file parses options, asks gpcd for the alerts on the
 * GPUs of a run it started, and prints where the page went.
 */
#include "cli/cli.h"
#include "gpc/report.h"
#ifdef GPC_HAVE_SCHED
#include "gpc/sched.h"

#include <jansson.h>
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Asks gpcd for the alerts on the GPUs of the job that ran this training
 * (GPC_JOB_ID, recorded by the trainer as gpcd_job in config.txt). A report
 * is still written when gpcd is unreachable; the page says why no alerts are
 * shown. */
static void load_alerts(gpc_report *r) {
    const char *job = gpc_report_config(r, "gpcd_job");
    char note[512];
    if (!job || !*job) return; /* the report's own note says so */
#ifdef GPC_HAVE_SCHED
    /* The job's GPUs from /jobs/ID, then the alerts of those GPUs from /alerts. */
    char path[96];
    json_t *objects[2] = {NULL, NULL};
    const char *paths[2] = {path, "/alerts"};
    snprintf(path, sizeof path, "/jobs/%lld", atoll(job));
    for (int i = 0; i < 2; i++) {
        gpcd_response response;
        json_error_t err;
        memset(&response, 0, sizeof response);
        if (gpcd_client_request(gpcd_client_socket(NULL), "GET", paths[i], NULL, &response)) {
            snprintf(note, sizeof note, "gpcd job %s: alerts not shown: %s", job, gpc_last_error());
            gpc_report_set_alerts(r, note, NULL, 0);
            json_decref(objects[0]);
            return;
        }
        if (response.status == 200)
            objects[i] = json_loads(response.body ? response.body : "", 0, &err);
        gpcd_response_free(&response);
    }
    json_t *gpus = objects[0] ? json_object_get(objects[0], "assigned_gpus") : NULL;
    json_t *alerts = objects[1] ? json_object_get(objects[1], "alerts") : NULL;
    if (!json_is_array(gpus) || !json_is_array(alerts)) {
        snprintf(note, sizeof note, "gpcd job %s: gpcd has no GPUs on record for this job", job);
        gpc_report_set_alerts(r, note, NULL, 0);
    } else {
        const char *ours[16];
        int count = 0;
        for (size_t i = 0; i < json_array_size(alerts) && count < 16; i++) {
            json_t *alert = json_array_get(alerts, i);
            json_int_t gpu = json_integer_value(json_object_get(alert, "gpu"));
            int on_ours = 0;
            for (size_t g = 0; g < json_array_size(gpus); g++)
                if (json_integer_value(json_array_get(gpus, g)) == gpu) on_ours = 1;
            const char *m = json_string_value(json_object_get(alert, "message"));
            if (on_ours && m) ours[count++] = m;
        }
        snprintf(note, sizeof note, "gpcd job %s: %s", job,
                 count ? "active alerts on its GPUs" : "no alerts on its GPUs");
        gpc_report_set_alerts(r, note, ours, count);
    }
    json_decref(objects[0]);
    json_decref(objects[1]);
#else
    snprintf(note, sizeof note,
             "gpcd job %s: alerts not shown: this gpc was built without the gpcd client", job);
    gpc_report_set_alerts(r, note, NULL, 0);
#endif
}

int cmd_report(int argc, char **argv) {
    const char *out = NULL;
    const char *positional[1];
    int npositional = 0;
    const cli_option options[] = {
        {"out", CLI_STRING, &out, "FILE.html", "where to write the page (default RUN/report.html)"},
        {0},
    };
    const cli_spec spec = {
        "report",
        "report RUN [--out FILE.html]",
        "Writes one self-contained HTML page (inline SVG, nothing fetched) for a training "
        "run: loss and validation loss, tokens/s, MFU and memory over the steps, and the "
        "run's configuration, from RUN/metrics.jsonl and RUN/config.txt; for a run started "
        "by gpcd, the alerts gpcd shows for the job's GPUs.",
        options,
        1,
        positional,
        &npositional};
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    if (npositional != 1) return cli_usage_error("report", "give the run folder: gpc report RUN");
    const char *run = positional[0];
    char default_out[4096];
    if (!out) {
        snprintf(default_out, sizeof default_out, "%s/report.html", run);
        out = default_out;
    }
    gpc_report *r;
    gpc_status st = gpc_report_create(&r);
    if (st) return cli_fail("report", st);
    st = gpc_report_read(r, run);
    if (gpc_report_warning(r)) fprintf(stderr, "gpc report: warning: %s\n", gpc_report_warning(r));
    if (st == GPC_OK) {
        load_alerts(r);
        st = gpc_report_write_html(r, out);
    }
    if (st == GPC_OK)
        printf("gpc report: %s (%d steps, final loss %.4f)\n", out, gpc_report_steps(r),
               gpc_report_final_loss(r));
    gpc_report_free(r);
    return st ? cli_fail("report", st) : CLI_EXIT_OK;
}
