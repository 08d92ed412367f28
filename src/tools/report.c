/*
 * report.c: the HTML page of gpc/report.h. metrics.jsonl is parsed here by
 * a small reader of flat JSON objects (the trainer writes nothing nested),
 * so the library needs no JSON dependency; the charts are SVG written by
 * hand, the page's style inline.
 */
#include "gpc/report.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --------------------------------------------------------------- metrics */

/* The metrics a row keeps, by their names in metrics.jsonl: one list for
 * the struct, the parser and gpc_report_value. The GPU's readings are NAN
 * on the steps the trainer did not read them. */
// clang-format off
#define ROW_FIELD_LIST(X)                                                                    \
    X(step) X(loss) X(val_loss) X(lr) X(grad_norm) X(tokens_per_s) X(ms) X(tokens) X(memory) \
    X(gpu_power_w) X(gpu_sm_clock_mhz) X(gpu_power_capped) X(gpu_step_energy_j)          \
    X(comm_exposed) X(comm_exposed_ms) X(comm_bus_gbs) X(input_wait) X(input_wait_ms)
// clang-format on

typedef struct {
#define ROW_MEMBER(name) double name;
    ROW_FIELD_LIST(ROW_MEMBER)
#undef ROW_MEMBER
} report_row;

static const char *const row_names[] = {
#define ROW_NAME(name) #name,
    ROW_FIELD_LIST(ROW_NAME)
#undef ROW_NAME
};
#define ROW_FIELDS (sizeof row_names / sizeof row_names[0])

/* The field named row_names[i]. */
static double *row_field(report_row *row, size_t i) {
#define ROW_POINTER(name) &row->name,
    double *fields[] = {ROW_FIELD_LIST(ROW_POINTER)};
#undef ROW_POINTER
    return fields[i];
}

struct gpc_report {
    char *run; /* the run folder, the page's title */
    report_row *rows;
    int count, capacity;
    char **keys, **values; /* config.txt */
    int nconfig;
    /* alerts on the run's GPUs from the caller (gpcd's when the run was a
     * gpcd job); alerts_note says why none are shown otherwise. */
    char alerts[16][512];
    int nalerts;
    char alerts_note[512];
    char warning[4200]; /* a skipped unfinished line, or empty */
};

typedef struct gpc_report report_run;

/* Parses one flat JSON object of numbers (strings, booleans and null are
 * accepted and ignored, null leaving the field NAN). Returns 0 or -1 with
 * *why set. */
static int parse_line(const char *p, report_row *row, const char **why) {
    for (size_t i = 0; i < ROW_FIELDS; i++)
        *row_field(row, i) = NAN;
    while (isspace((unsigned char)*p))
        p++;
    if (*p++ != '{') return *why = "does not start with '{'", -1;
    for (;;) {
        while (isspace((unsigned char)*p))
            p++;
        if (*p == '}') break;
        if (*p++ != '"') return *why = "expected a quoted key", -1;
        const char *key = p;
        while (*p && *p != '"')
            p++;
        if (*p != '"') return *why = "unterminated key", -1;
        size_t key_len = (size_t)(p - key);
        p++;
        while (isspace((unsigned char)*p))
            p++;
        if (*p++ != ':') return *why = "expected ':' after a key", -1;
        while (isspace((unsigned char)*p))
            p++;
        double value = NAN;
        if (*p == '"') {
            for (p++; *p && *p != '"'; p++)
                if (*p == '\\' && p[1]) p++;
            if (*p++ != '"') return *why = "unterminated string", -1;
        } else if (!strncmp(p, "null", 4)) {
            p += 4;
        } else if (!strncmp(p, "true", 4)) {
            p += 4;
        } else if (!strncmp(p, "false", 5)) {
            p += 5;
        } else {
            char *end;
            value = strtod(p, &end);
            if (end == p) return *why = "a value is not a number, string or null", -1;
            p = end;
        }
        for (size_t i = 0; i < ROW_FIELDS; i++)
            if (strlen(row_names[i]) == key_len && !strncmp(row_names[i], key, key_len))
                *row_field(row, i) = value;
        /* the trainer may name memory either way */
        if ((key_len == 12 && !strncmp(key, "memory_bytes", 12))) row->memory = value;
        while (isspace((unsigned char)*p))
            p++;
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p == '}') break;
        return *why = "expected ',' or '}'", -1;
    }
    p++;
    while (isspace((unsigned char)*p))
        p++;
    if (*p) return *why = "text after the closing '}'", -1;
    if (isnan(row->step)) return *why = "no \"step\"", -1;
    return 0;
}

static gpc_status load_metrics(const char *run, report_run *r) {
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    if (!gpc_path_is_dir(run))
        return gpc_error(GPC_ERR_IO,
                         "%s is not a directory: give the run folder of gpc train --out", run);
    if (!gpc_path_exists(path))
        return gpc_error(GPC_ERR_IO,
                         "%s does not exist: is %s a run folder of gpc train? (it writes "
                         "metrics.jsonl from the first step)",
                         path, run);
    char *text;
    size_t size;
    GPC_TRY(gpc_read_file(path, &text, &size));
    int line_no = 0;
    gpc_status st = GPC_OK;
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        int complete = end != NULL;
        if (end) *end = 0;
        line_no++;
        const char *why = NULL;
        report_row row;
        int blank = strspn(line, " \t\r") == strlen(line);
        if (!blank && parse_line(line, &row, &why) != 0) {
            if (!complete) {
                snprintf(r->warning, sizeof r->warning,
                         "%s line %d is unfinished (the run was stopped while writing it); "
                         "skipped",
                         path, line_no);
                break;
            }
            st = gpc_error(GPC_ERR_FORMAT,
                           "%s line %d is not a metrics record (%s): the file is damaged; "
                           "remove that line or re-run",
                           path, line_no, why);
            break;
        }
        if (!blank) {
            if (r->count == r->capacity) {
                int capacity = r->capacity ? 2 * r->capacity : 256;
                report_row *grown = realloc(r->rows, (size_t)capacity * sizeof *grown);
                if (!grown) {
                    st = gpc_error(GPC_ERR_NOMEM, "out of memory reading %s", path);
                    break;
                }
                r->rows = grown;
                r->capacity = capacity;
            }
            r->rows[r->count++] = row;
        }
        if (!end) break;
        line = end + 1;
    }
    gpc_free(text);
    if (st == GPC_OK && r->count == 0)
        st = gpc_error(GPC_ERR_FORMAT, "%s has no steps yet: report after the first step", path);
    return st;
}

/* config.txt: key=value lines; '#' starts a comment. Missing is fine. */
static void load_config(const char *run, report_run *r) {
    char path[4096], line[4096];
    snprintf(path, sizeof path, "%s/config.txt", run);
    FILE *f = fopen(path, "r");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        char *eq = strchr(line, '=');
        if (line[0] == '#' || !eq) continue;
        *eq = 0;
        char **k = realloc(r->keys, (size_t)(r->nconfig + 1) * sizeof *k);
        if (!k) break;
        r->keys = k;
        char **v = realloc(r->values, (size_t)(r->nconfig + 1) * sizeof *v);
        if (!v) break;
        r->values = v;
        r->keys[r->nconfig] = strdup(line);
        r->values[r->nconfig] = strdup(eq + 1);
        r->nconfig++;
    }
    fclose(f);
    /* runs trained on the CPU before config.txt said cpu_name wrote the
     * CPU's name as gpu_name: shown for what it is */
    const char *device = NULL;
    for (int i = 0; i < r->nconfig; i++)
        if (!strcmp(r->keys[i], "device")) device = r->values[i];
    for (int i = 0; device && !strncmp(device, "cpu", 3) && i < r->nconfig; i++)
        if (!strcmp(r->keys[i], "gpu_name")) {
            char *name = strdup("cpu_name");
            if (name) free(r->keys[i]), r->keys[i] = name;
        }
}

static const char *config(const report_run *r, const char *key) {
    for (int i = 0; i < r->nconfig; i++)
        if (!strcmp(r->keys[i], key)) return r->values[i];
    return NULL;
}

/* ------------------------------------------------------------------- MFU */

/* FLOPs per token 6N + 6LCT (BENCHMARKS.md; Chinchilla appendix F without
 * the embedding term), against the device's dense peak: peak_tflops from
 * config.txt when the trainer wrote it, else 989 TFLOP/s (bf16/f16 dense,
 * datasheet) on an H100 or H200. Returns 0 when either is unknown, with
 * why filled in. */
static double mfu_setup(const report_run *r, double *flops_per_token, double *peak, char *why,
                        size_t why_size) {
    const char *n = config(r, "parameters"), *l = config(r, "layers");
    const char *c = config(r, "channels"), *t = config(r, "context");
    if (!n || !l || !c || !t) {
        snprintf(why, why_size, "MFU not shown: config.txt lacks the model size");
        return 0;
    }
    *flops_per_token = 6.0 * atof(n) + 6.0 * atof(l) * atof(c) * atof(t);
    const char *p = config(r, "peak_tflops");
    const char *gpu = config(r, "gpu_name") ? config(r, "gpu_name") : config(r, "gpu");
    const char *precision = config(r, "precision");
    int low = precision && (!strcmp(precision, "bf16") || !strcmp(precision, "f16"));
    if (p && atof(p) > 0) {
        *peak = atof(p) * 1e12;
    } else if (gpu && low && (strstr(gpu, "H100") || strstr(gpu, "H200"))) {
        *peak = 989e12;
    } else {
        snprintf(why, why_size,
                 "MFU not shown: the device's peak FLOP rate is not known (config.txt has no "
                 "peak_tflops, and the device is not an H100/H200 in bf16)");
        return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------ HTML */

static void html_text(FILE *f, const char *s) {
    for (; *s; s++)
        switch (*s) {
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '&':
            fputs("&amp;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            fputc(*s, f);
        }
}

/* A tick step of 1, 2 or 5 times a power of ten giving about 5 ticks. */
static double nice_step(double range) {
    if (!(range > 0)) return 1;
    double raw = range / 5, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

typedef struct {
    const char *name;
    const char *color;
    int field; /* offset into report_row as an index of doubles */
    double scale;
    int dots;      /* sparse series (validation): markers on each point, joined by a line */
    int from_zero; /* a size or a rate: the axis starts at 0, so a small change looks small */
} series;

static double field(const report_row *row, int index) {
    return ((const double *)row)[index];
}

#define FIELD(name) ((int)(offsetof(report_row, name) / sizeof(double)))

/* The chart's size in pixels: width, height, and the plot's margins. */
#define CHART_W 720.0
#define CHART_H 260.0
#define CHART_L 70.0
#define CHART_R 20.0
#define CHART_T 30.0
#define CHART_B 40.0

/* A line is drawn from at most four points a half-pixel column: the
 * column's first, lowest, highest and last, in step order. That draws what
 * every point would (a loss spike still reaches its height) while a run of
 * a million steps writes about 5,000 points a line, not a million (its
 * page was 45 MB, now well under 1 MB). */
#define CHART_COLUMNS_PER_PX 2

typedef struct {
    long c;                    /* the column; -1 before the first point */
    int first, min, max, last; /* rows */
} column;

/* The ranges the plot area spans: a value's pixel in the chart. */
typedef struct {
    double xmin, xmax, ymin, ymax;
} axes;

static double axis_x(const axes *a, double x) {
    return CHART_L + (x - a->xmin) / (a->xmax - a->xmin) * (CHART_W - CHART_L - CHART_R);
}

static double axis_y(const axes *a, double y) {
    return CHART_H - CHART_B - (y - a->ymin) / (a->ymax - a->ymin) * (CHART_H - CHART_T - CHART_B);
}

static void column_points(FILE *f, const report_run *r, const series *s, const column *col,
                          const axes *ax) {
    if (col->c < 0) return;
    int rows[4] = {col->first, col->min, col->max, col->last};
    for (int a = 1; a < 4; a++) /* four: insertion sort */
        for (int b = a; b > 0 && rows[b] < rows[b - 1]; b--) {
            int t = rows[b];
            rows[b] = rows[b - 1], rows[b - 1] = t;
        }
    for (int a = 0; a < 4; a++) {
        if (a && rows[a] == rows[a - 1]) continue;
        const report_row *row = &r->rows[rows[a]];
        fprintf(f, "%.1f,%.1f ", axis_x(ax, row->step),
                axis_y(ax, field(row, s->field) * s->scale));
    }
}

static void chart(FILE *f, const report_run *r, const char *title, const char *unit,
                  const series *s, int ns) {
    const double W = CHART_W, H = CHART_H, L = CHART_L, R = CHART_R, T = CHART_T, B = CHART_B;
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < r->count; i++) {
            double x = r->rows[i].step, y = field(&r->rows[i], s[k].field) * s[k].scale;
            if (!isfinite(y)) continue;
            xmin = fmin(xmin, x), xmax = fmax(xmax, x);
            ymin = fmin(ymin, y), ymax = fmax(ymax, y);
        }
    if (!isfinite(ymin)) return;
    if (xmax == xmin) xmax = xmin + 1;
    int from_zero = 0;
    for (int k = 0; k < ns; k++)
        from_zero |= s[k].from_zero;
    if (from_zero) ymin = fmin(ymin, 0), ymax = fmax(ymax, 0);
    /* An axis spanning less than a tenth of its values' magnitude (memory
     * that moved by 4 KiB of 170 MiB) draws noise as a cliff: widen it
     * about its middle. */
    double least = 0.1 * fmax(fabs(ymin), fabs(ymax));
    if (ymax - ymin < least) {
        double mid = (ymin + ymax) / 2;
        ymin = mid - least / 2, ymax = mid + least / 2;
        if (from_zero && ymin < 0 && mid >= 0) ymax -= ymin, ymin = 0;
    }
    if (ymax == ymin) ymax = ymin + 1; /* all zero */
    double pad = (ymax - ymin) * 0.05;
    ymin -= pad, ymax += pad;
    fprintf(f,
            "<figure><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "viewBox=\"0 0 %.0f %.0f\" role=\"img\" aria-label=\"",
            W, H, W, H);
    html_text(f, title);
    fprintf(f, "\">\n<text x=\"%.0f\" y=\"18\" class=\"title\">", L);
    html_text(f, title);
    fprintf(f, " (%s)</text>\n", unit);
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" class=\"frame\"/>\n", L,
            T, W - L - R, H - T - B);
    const axes ax = {xmin, xmax, ymin, ymax};
#define PX(x) axis_x(&ax, (x))
#define PY(y) axis_y(&ax, (y))
    double ys = nice_step(ymax - ymin);
    for (double y = ceil(ymin / ys) * ys; y <= ymax; y += ys)
        fprintf(f,
                "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>"
                "<text x=\"%.1f\" y=\"%.1f\" class=\"ytick\">%g</text>\n",
                L, W - R, PY(y), PY(y), L - 6, PY(y) + 4, fabs(y) < ys * 1e-6 ? 0.0 : y);
    double xs = nice_step(xmax - xmin);
    if (xs < 1) xs = 1;
    for (double x = ceil(xmin / xs) * xs; x <= xmax; x += xs)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" class=\"xtick\">%g</text>\n", PX(x), H - B + 16, x);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" class=\"xtick\">step</text>\n", (W + L) / 2, H - 4);
    for (int k = 0; k < ns; k++) {
        /* the line joins the points the series has (a sparse one's
         * steps without a value are skipped), then markers on a sparse one */
        fprintf(f,
                "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" "
                "class=\"series\" points=\"",
                s[k].color);
        column col = {-1, 0, 0, 0, 0};
        for (int i = 0; i < r->count; i++) {
            double y = field(&r->rows[i], s[k].field) * s[k].scale;
            if (!isfinite(y)) continue;
            long c = (long)floor((PX(r->rows[i].step) - L) * CHART_COLUMNS_PER_PX);
            if (c != col.c) {
                column_points(f, r, &s[k], &col, &ax);
                col = (column){c, i, i, i, i};
            }
            col.last = i;
            if (y < field(&r->rows[col.min], s[k].field) * s[k].scale) col.min = i;
            if (y > field(&r->rows[col.max], s[k].field) * s[k].scale) col.max = i;
        }
        column_points(f, r, &s[k], &col, &ax);
        fprintf(f, "\"/>\n");
        for (int i = 0; s[k].dots && i < r->count; i++) {
            double y = field(&r->rows[i], s[k].field) * s[k].scale;
            if (isfinite(y))
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n",
                        PX(r->rows[i].step), PY(y), s[k].color);
        }
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" fill=\"%s\" class=\"legend\">", W - R - 150,
                T + 16 + 16 * k, s[k].color);
        html_text(f, s[k].name);
        fprintf(f, "</text>\n");
    }
#undef PX
#undef PY
    fprintf(f, "</svg></figure>\n");
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of a field over the rows from `from` on that have it; NAN when none do. */
static double median_field(const report_run *r, int index, int from) {
    double *v = malloc((size_t)r->count * sizeof *v);
    int n = 0;
    if (!v) return NAN;
    for (int i = from < r->count ? from : 0; i < r->count; i++)
        if (isfinite(field(&r->rows[i], index))) v[n++] = field(&r->rows[i], index);
    double m = NAN;
    if (n) {
        qsort(v, (size_t)n, sizeof *v, compare_double);
        m = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    }
    free(v);
    return m;
}

/* Median tokens/s over the steps after the first (the first pays for
 * warm-up: allocation, kernel loading, caches). */
static double steady_tokens_per_s(const report_run *r) {
    return median_field(r, FIELD(tokens_per_s), 1);
}

static gpc_status write_html(const char *path, const char *run, const report_run *r) {
    FILE *f = fopen(path, "w");
    if (!f)
        return gpc_error(GPC_ERR_IO, "cannot write %s: %s%s", path, strerror(errno),
                         errno == ENOENT ? " (check that its directory exists)" : "");
    const report_row *last = &r->rows[r->count - 1];
    double best_val = NAN, peak_mem = NAN;
    int have_val = 0, have_mem = 0;
    for (int i = 0; i < r->count; i++) {
        if (isfinite(r->rows[i].val_loss)) {
            have_val = 1;
            if (!(r->rows[i].val_loss >= best_val)) best_val = r->rows[i].val_loss;
        }
        if (isfinite(r->rows[i].memory)) {
            have_mem = 1;
            if (!(r->rows[i].memory <= peak_mem)) peak_mem = r->rows[i].memory;
        }
    }
    double flops_per_token = 0, peak = 0, tps = steady_tokens_per_s(r);
    char mfu_why[256] = "";
    int have_mfu = mfu_setup(r, &flops_per_token, &peak, mfu_why, sizeof mfu_why);

    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>gpc "
               "report: ");
    html_text(f, run);
    fprintf(f, "</title>\n<style>\n"
               "body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:780px}\n"
               "h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em}\n"
               "table{border-collapse:collapse}td,th{padding:2px 12px 2px 0;text-align:left}\n"
               "td.num{text-align:right;font-variant-numeric:tabular-nums}\n"
               "figure{margin:0.8em 0}.frame{fill:none;stroke:#999}.grid{stroke:#eee}\n"
               ".title{font-size:14px;font-weight:600}.ytick{font-size:11px;text-anchor:end}\n"
               ".xtick{font-size:11px;text-anchor:middle}.legend{font-size:12px}\n"
               ".note{color:#666}\n</style></head><body>\n<h1>gpc training run ");
    html_text(f, run);
    fprintf(f, "</h1>\n<table id=\"summary\">\n");
    fprintf(f,
            "<tr><th>final loss</th><td class=\"num\" id=\"final-loss\">%.4f</td><td>step "
            "<span id=\"final-step\">%.0f</span></td></tr>\n",
            last->loss, last->step);
    if (have_val)
        fprintf(f,
                "<tr><th>best validation loss</th><td class=\"num\" id=\"best-val-loss\">%.4f"
                "</td><td></td></tr>\n",
                best_val);
    if (isfinite(last->tokens))
        fprintf(f,
                "<tr><th>tokens seen</th><td class=\"num\" id=\"tokens\">%.0f</td><td></td>"
                "</tr>\n",
                last->tokens);
    if (isfinite(tps))
        fprintf(f,
                "<tr><th>tokens/s (median after step 1)</th><td class=\"num\" "
                "id=\"tokens-per-s\">%.0f</td><td></td></tr>\n",
                tps);
    if (have_mfu && isfinite(tps))
        fprintf(f,
                "<tr><th>MFU</th><td class=\"num\" id=\"mfu\">%.3g%%</td><td>%.3g FLOP/token, "
                "peak %.0f TFLOP/s</td></tr>\n",
                100 * tps * flops_per_token / peak, flops_per_token, peak / 1e12);
    if (have_mem) {
        char human[32];
        fprintf(f,
                "<tr><th>peak memory</th><td class=\"num\" id=\"peak-memory\">%s</td><td></td>"
                "</tr>\n",
                gpc_format_bytes(peak_mem, human, sizeof human));
    }
    /* the GPU's power: how many steps read were at the limit, and energy */
    int gpu_read = 0, gpu_capped = 0;
    for (int i = 0; i < r->count; i++)
        if (isfinite(r->rows[i].gpu_power_capped)) {
            gpu_read++;
            gpu_capped += r->rows[i].gpu_power_capped > 0;
        }
    double step_energy = median_field(r, FIELD(gpu_step_energy_j), 0);
    double tokens_per_step = last->step > 0 ? last->tokens / last->step : NAN;
    if (gpu_read)
        fprintf(f,
                "<tr><th>steps at the GPU's power limit</th><td class=\"num\" "
                "id=\"gpu-capped\">%d of %d</td><td>steps read</td></tr>\n",
                gpu_capped, gpu_read);
    if (isfinite(step_energy)) {
        fprintf(f,
                "<tr><th>GPU energy a step (median)</th><td class=\"num\" "
                "id=\"step-energy\">%.4g J</td><td></td></tr>\n",
                step_energy);
        if (isfinite(tokens_per_step) && step_energy > 0)
            fprintf(f,
                    "<tr><th>tokens per joule</th><td class=\"num\" "
                    "id=\"tokens-per-joule\">%.0f</td><td>this process's GPU</td></tr>\n",
                    tokens_per_step / step_energy);
    }
    fprintf(f, "</table>\n<h2>Loss</h2>\n");
    series loss[2] = {{"training loss", "#1f77b4", FIELD(loss), 1, 0, 0},
                      {"validation loss", "#d62728", FIELD(val_loss), 1, 1, 0}};
    chart(f, r, "loss", "nats per token", loss, have_val ? 2 : 1);
    fprintf(f, "<h2>Throughput</h2>\n");
    series speed = {"tokens/s", "#2ca02c", FIELD(tokens_per_s), 1, 0, 1};
    chart(f, r, "tokens per second", "tokens/s", &speed, 1);
    if (have_mfu) {
        series mfu = {"MFU", "#9467bd", FIELD(tokens_per_s), 100 * flops_per_token / peak, 0, 1};
        chart(f, r, "model FLOPs utilisation", "% of peak", &mfu, 1);
    } else {
        fprintf(f, "<p class=\"note\" id=\"mfu-note\">");
        html_text(f, mfu_why);
        fprintf(f, "</p>\n");
    }
    fprintf(f, "<h2>Memory</h2>\n");
    if (have_mem) {
        series mem = {"memory", "#8c564b", FIELD(memory), 1.0 / (1024.0 * 1024 * 1024), 0, 1};
        chart(f, r, "memory", "GiB", &mem, 1);
    } else {
        fprintf(f, "<p class=\"note\">This run's metrics.jsonl records no memory figures.</p>\n");
    }
    fprintf(f, "<h2>GPU power</h2>\n");
    double any_power = median_field(r, FIELD(gpu_power_w), 0);
    if (isfinite(any_power)) {
        fprintf(f, "<p class=\"note\">Read while each step ran. A GPU at its power limit "
                   "lowers its clock: then the step's energy, not its kernels' speed, sets "
                   "its time.</p>\n");
        series power = {"power", "#d62728", FIELD(gpu_power_w), 1, 0, 1};
        chart(f, r, "GPU power", "W", &power, 1);
        series clock = {"SM clock", "#17becf", FIELD(gpu_sm_clock_mhz), 1, 0, 0};
        chart(f, r, "SM clock", "MHz", &clock, 1);
        if (isfinite(step_energy)) {
            series energy = {"energy a step", "#bcbd22", FIELD(gpu_step_energy_j), 1, 0, 1};
            chart(f, r, "GPU energy a step", "J", &energy, 1);
        }
    } else {
        fprintf(f, "<p class=\"note\" id=\"gpu-note\">No GPU readings in this run's "
                   "metrics.jsonl (a CPU run, or NVML could not read the GPU).</p>\n");
    }
    series lr = {"learning rate", "#ff7f0e", FIELD(lr), 1, 0, 1};
    fprintf(f, "<h2>Learning rate</h2>\n");
    chart(f, r, "learning rate", "lr", &lr, 1);
    fprintf(f, "<h2>Alerts</h2>\n<p class=\"note\" id=\"alerts-note\">");
    html_text(f, r->alerts_note);
    fprintf(f, "</p>\n");
    if (r->nalerts) {
        fprintf(f, "<ul id=\"alerts\">\n");
        for (int i = 0; i < r->nalerts; i++) {
            fprintf(f, "<li>");
            html_text(f, r->alerts[i]);
            fprintf(f, "</li>\n");
        }
        fprintf(f, "</ul>\n");
    }
    fprintf(f, "<h2>Configuration</h2>\n");
    if (r->nconfig) {
        fprintf(f, "<table id=\"config\">\n");
        for (int i = 0; i < r->nconfig; i++) {
            fprintf(f, "<tr><th>");
            html_text(f, r->keys[i]);
            fprintf(f, "</th><td>");
            html_text(f, r->values[i]);
            fprintf(f, "</td></tr>\n");
        }
        fprintf(f, "</table>\n");
    } else {
        fprintf(f, "<p class=\"note\">No config.txt in the run folder.</p>\n");
    }
    fprintf(f,
            "<p class=\"note\">Written by gpc %s from %d steps of metrics.jsonl.</p>\n"
            "</body></html>\n",
            GPC_VERSION, r->count);
    if (fclose(f) != 0) return gpc_error(GPC_ERR_IO, "cannot finish writing %s", path);
    return GPC_OK;
}

/* ----------------------------------------------------------- the API */

gpc_status gpc_report_create(gpc_report **out) {
    gpc_report *r = calloc(1, sizeof *r);
    if (!r) return gpc_error(GPC_ERR_NOMEM, "out of memory starting a report");
    snprintf(r->alerts_note, sizeof r->alerts_note,
             "This run did not run under gpcd: no alerts to show.");
    *out = r;
    return GPC_OK;
}

void gpc_report_free(gpc_report *r) {
    if (!r) return;
    for (int i = 0; i < r->nconfig; i++) {
        free(r->keys[i]);
        free(r->values[i]);
    }
    free(r->keys);
    free(r->values);
    free(r->rows);
    free(r->run);
    free(r);
}

gpc_status gpc_report_read(gpc_report *r, const char *run) {
    free(r->run);
    r->run = strdup(run);
    if (!r->run) return gpc_error(GPC_ERR_NOMEM, "out of memory reading %s", run);
    /* config.txt first: a run that ended before its first step still has
     * its settings (gpc doctor --run reads them after an out-of-memory end) */
    load_config(run, r);
    return load_metrics(run, r);
}

const char *gpc_report_warning(const gpc_report *r) {
    return r->warning[0] ? r->warning : NULL;
}

const char *gpc_report_config(const gpc_report *r, const char *key) {
    return config(r, key);
}

void gpc_report_set_alerts(gpc_report *r, const char *note, const char *const *alerts, int count) {
    snprintf(r->alerts_note, sizeof r->alerts_note, "%s", note ? note : "");
    r->nalerts = 0;
    for (int i = 0; i < count && r->nalerts < 16; i++)
        snprintf(r->alerts[r->nalerts++], sizeof r->alerts[0], "%s", alerts[i]);
}

int gpc_report_steps(const gpc_report *r) {
    return r->count;
}

double gpc_report_value(const gpc_report *r, int row, const char *name) {
    if (row < 0 || row >= r->count || !name) return NAN;
    for (size_t i = 0; i < ROW_FIELDS; i++)
        if (!strcmp(row_names[i], name)) return *row_field(&r->rows[row], i);
    return NAN;
}

double gpc_report_final_loss(const gpc_report *r) {
    return r->count ? r->rows[r->count - 1].loss : NAN;
}

gpc_status gpc_report_write_html(const gpc_report *r, const char *path) {
    if (!r->count)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "no steps to report: read a run with gpc_report_read first");
    return write_html(path, r->run, r);
}
