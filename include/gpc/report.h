/*
 * gpc report: one self-contained HTML page for a training run: loss and
 * validation loss, tokens/s, model FLOPs utilisation, memory and the GPU's
 * power over the steps, alerts, and the run's configuration. Charts are
 * inline SVG; the page fetches nothing, so it opens offline, in a mail
 * attachment or from a CI artefact.
 *
 * Input: RUN/metrics.jsonl (one flat JSON object per step, as the trainer
 * writes it) and RUN/config.txt (key=value). A missing or corrupt metrics
 * file is an error that names the file and line; an unfinished last line
 * (a run killed while writing) is skipped with a warning. Alerts come from
 * the caller (gpcd's, for a run it started), since this layer is below it.
 */
#ifndef GPC_REPORT_H
#define GPC_REPORT_H

#include "gpc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpc_report gpc_report;

gpc_status gpc_report_create(gpc_report **out);
void gpc_report_free(gpc_report *report);

/* Reads RUN/metrics.jsonl and RUN/config.txt (config.txt may be absent).
 * Read gpc_report_warning after it, whatever it returns. config.txt is
 * read first, so gpc_report_config answers even when metrics.jsonl is
 * missing or empty (a run that failed before its first step). */
gpc_status gpc_report_read(gpc_report *report, const char *run);

/* What was skipped while reading ("RUN/metrics.jsonl line 3 is
 * unfinished ..."), or NULL. */
const char *gpc_report_warning(const gpc_report *report);

/* A value of config.txt, or NULL. */
const char *gpc_report_config(const gpc_report *report, const char *key);

/* The page's alerts section: a note (why there are none, or whose they
 * are) and up to 16 alert messages. Without a call the note says the run
 * did not run under gpcd. */
void gpc_report_set_alerts(gpc_report *report, const char *note, const char *const *alerts,
                           int count);

int gpc_report_steps(const gpc_report *report);
double gpc_report_final_loss(const gpc_report *report);
/* Field name ("ms", "tokens_per_s", "gpu_power_capped", ...) of metrics
 * line row (0 = the first): NAN when the line lacks it, row is out of
 * range or the name is not one of metrics.jsonl's fields. */
double gpc_report_value(const gpc_report *report, int row, const char *name);

/* Writes the page to path. */
gpc_status gpc_report_write_html(const gpc_report *report, const char *path);

#ifdef __cplusplus
}
#endif

#endif /* GPC_REPORT_H */
