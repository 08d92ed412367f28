/*
 * trace.c: job traces for studying gpcd's policies (simulate.c): the CSV
 * format (see gpc/sched_sim.h) and a generator of synthetic traces shaped
 * like the Microsoft Philly cluster's workload.
 *
 * The shape follows the published characterisation of Philly, Jeon et al.,
 * "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training
 * Workloads", USENIX ATC 2019, and the trace Microsoft released with it:
 *   - most jobs use one GPU, with a tail of 2-, 4-, 8- and 16-GPU jobs;
 *   - run times are heavy-tailed, from minutes to days and weeks;
 *   - submissions are bursty (users launch sweeps of similar jobs at once)
 *     and follow the working day.
 * The numbers below (size shares, a log-normal with a 30-minute median and
 * sigma 2, bursts of 4 jobs on average, a +-50% daily swing) are our own
 * approximation of that shape, not figures copied from the paper; the test
 * checks that generated traces match these targets. The default offered
 * load is 1.0: a busy shared cluster whose users ask, on average, for all of
 * its GPU time (more by day, less at night), so that jobs queue as they did
 * on Philly; bench/sched_simulate.sh also runs 0.8 and 0.9. Philly's trace has no
 * time limits or priorities: we model users asking for a round limit of one
 * to three times the real run time (the usual overestimate that EASY
 * backfill lives with), and 10% high, 20% low priority jobs.
 */
#include "gpc/sched_sim.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gpcd_trace_free(gpcd_trace *trace) {
    if (!trace) return;
    free(trace->jobs);
    trace->jobs = NULL;
    trace->count = 0;
}

/* ------------------------------------------------------------------- CSV */

enum { COL_SUBMIT, COL_DURATION, COL_GPUS, COL_PRIORITY, COL_TIME_LIMIT, COL_COUNT };
/* Times beyond a century are typing errors, and near DBL_MAX they overflow
 * the simulation's sums (1e308 + 1e308 is infinity). */
#define TRACE_MAX_SECONDS (100.0 * 365.25 * 86400.0)

static const char *const column_names[COL_COUNT] = {"submit", "duration", "gpus", "priority",
                                                    "time_limit"};

/* Splits one line at commas in place; trims spaces. Returns the field count. */
static int split_fields(char *line, char **fields, int max) {
    int n = 0;
    char *p = line;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma) *comma = '\0';
        while (*p == ' ' || *p == '\t')
            p++;
        size_t len = strlen(p);
        while (len && (p[len - 1] == ' ' || p[len - 1] == '\t' || p[len - 1] == '\r'))
            p[--len] = '\0';
        if (n < max) fields[n] = p;
        n++;
        if (!comma) break;
        p = comma + 1;
    }
    return n;
}

static int parse_number(const char *text, double *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

static gpc_status parse_header(char *line, const char *source, int lineno, int *map, int *ncols) {
    char *fields[16];
    int n = split_fields(line, fields, 16);
    if (n > COL_COUNT)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s line %d: the header has %d columns; use submit,duration,gpus,"
                         "priority,time_limit",
                         source, lineno, n);
    int seen[COL_COUNT] = {0};
    for (int i = 0; i < n; i++) {
        int col = -1;
        for (int c = 0; c < COL_COUNT; c++)
            if (strcmp(fields[i], column_names[c]) == 0) col = c;
        if (col < 0)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "%s line %d: unknown column '%s' (the header names columns among "
                             "submit, duration, gpus, priority, time_limit)",
                             source, lineno, fields[i]);
        if (seen[col])
            return gpc_error(GPC_ERR_INVALID_ARG, "%s line %d: column '%s' appears twice", source,
                             lineno, fields[i]);
        seen[col] = 1;
        map[i] = col;
    }
    for (int c = COL_SUBMIT; c <= COL_GPUS; c++)
        if (!seen[c])
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "%s line %d: the header lacks the column '%s' (needed: submit, "
                             "duration, gpus)",
                             source, lineno, column_names[c]);
    *ncols = n;
    return GPC_OK;
}

static gpc_status parse_job(char *line, const char *source, int lineno, const int *map, int ncols,
                            gpcd_trace_job *job) {
    char *fields[16];
    int n = split_fields(line, fields, 16);
    if (n != ncols)
        return gpc_error(GPC_ERR_INVALID_ARG, "%s line %d: %d fields, the header has %d", source,
                         lineno, n, ncols);
    memset(job, 0, sizeof *job);
    job->priority = GPCD_PRIORITY_NORMAL;
    job->line = lineno;
    for (int i = 0; i < n; i++) {
        const char *f = fields[i];
        double v = 0;
        switch (map[i]) {
        case COL_SUBMIT:
            if (parse_number(f, &v) != 0 || v < 0 || v > TRACE_MAX_SECONDS)
                return gpc_error(GPC_ERR_INVALID_ARG,
                                 "%s line %d: submit '%s' is not a time in seconds, 0 to 100 years",
                                 source, lineno, f);
            job->submit = v;
            break;
        case COL_DURATION:
            if (parse_number(f, &v) != 0 || v <= 0 || v > TRACE_MAX_SECONDS)
                return gpc_error(GPC_ERR_INVALID_ARG,
                                 "%s line %d: duration '%s' is not a number of seconds > 0, at "
                                 "most 100 years",
                                 source, lineno, f);
            job->duration = v;
            break;
        case COL_GPUS:
            if (parse_number(f, &v) != 0 || v != floor(v) || v < 1 || v > GPCD_MAX_GPUS)
                return gpc_error(GPC_ERR_INVALID_ARG,
                                 "%s line %d: gpus '%s' is not a whole number 1-%d", source, lineno,
                                 f, GPCD_MAX_GPUS);
            job->gpus = (int)v;
            break;
        case COL_PRIORITY:
            if (*f && gpcd_priority_parse(f, &job->priority) != GPC_OK)
                return gpc_error(GPC_ERR_INVALID_ARG,
                                 "%s line %d: priority '%s' is not low, normal, high or 0-100",
                                 source, lineno, f);
            break;
        case COL_TIME_LIMIT:
            if (*f && (parse_number(f, &v) != 0 || v < 0 || v > TRACE_MAX_SECONDS))
                return gpc_error(GPC_ERR_INVALID_ARG,
                                 "%s line %d: time_limit '%s' is not a number of seconds up to "
                                 "100 years (0 or empty for none)",
                                 source, lineno, f);
            job->time_limit = *f ? v : 0;
            break;
        }
    }
    return GPC_OK;
}

gpc_status gpcd_trace_parse(const char *text, size_t len, const char *source, gpcd_trace *out) {
    out->jobs = NULL;
    out->count = 0;
    int cap = 0, map[COL_COUNT], ncols = 0, have_header = 0, lineno = 0;
    size_t pos = 0;
    char line[4096];
    while (pos < len) {
        size_t end = pos;
        while (end < len && text[end] != '\n')
            end++;
        lineno++;
        size_t n = end - pos;
        if (n >= sizeof line) {
            gpcd_trace_free(out);
            return gpc_error(GPC_ERR_INVALID_ARG, "%s line %d: longer than %zu characters", source,
                             lineno, sizeof line - 1);
        }
        memcpy(line, text + pos, n);
        line[n] = '\0';
        pos = end + 1;
        if (memchr(line, '\0', n)) {
            gpcd_trace_free(out);
            return gpc_error(GPC_ERR_INVALID_ARG, "%s line %d: contains a NUL byte", source,
                             lineno);
        }
        const char *p = line;
        while (*p == ' ' || *p == '\t' || *p == '\r')
            p++;
        if (!*p || *p == '#') continue;
        gpc_status st;
        if (!have_header) {
            st = parse_header(line, source, lineno, map, &ncols);
            have_header = 1;
        } else {
            if (out->count == cap) {
                cap = cap ? cap * 2 : 1024;
                gpcd_trace_job *grown = realloc(out->jobs, sizeof *grown * (size_t)cap);
                if (!grown) {
                    gpcd_trace_free(out);
                    return gpc_error(GPC_ERR_NOMEM, "out of memory reading %s", source);
                }
                out->jobs = grown;
            }
            st = parse_job(line, source, lineno, map, ncols, &out->jobs[out->count]);
            if (st == GPC_OK) out->count++;
        }
        if (st != GPC_OK) {
            gpcd_trace_free(out);
            return st;
        }
    }
    if (!have_header)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s is empty: a trace starts with a header such as "
                         "submit,duration,gpus,priority,time_limit",
                         source);
    if (out->count == 0)
        return gpc_error(GPC_ERR_INVALID_ARG, "%s has a header but no jobs", source);
    return GPC_OK;
}

gpc_status gpcd_trace_load(const char *path, gpcd_trace *out) {
    char *text = NULL;
    size_t len = 0;
    gpc_status st = gpc_read_file(path, &text, &len);
    if (st != GPC_OK) return gpc_error_context(st, "trace: ");
    st = gpcd_trace_parse(text, len, path, out);
    gpc_free(text);
    return st;
}

gpc_status gpcd_trace_save(const char *path, const gpcd_trace *trace) {
    gpc_atomic_file f;
    GPC_TRY(gpc_atomic_open(&f, path));
    const char *header = "submit,duration,gpus,priority,time_limit\n";
    gpc_status st = gpc_atomic_write(&f, header, strlen(header));
    char line[160];
    for (int i = 0; i < trace->count && st == GPC_OK; i++) {
        const gpcd_trace_job *j = &trace->jobs[i];
        int n = snprintf(line, sizeof line, "%.3f,%.3f,%d,%d,%.0f\n", j->submit, j->duration,
                         j->gpus, j->priority, j->time_limit);
        st = gpc_atomic_write(&f, line, (size_t)n);
    }
    if (st == GPC_OK) st = gpc_atomic_commit(&f);
    if (st != GPC_OK) gpc_atomic_abort(&f);
    return st;
}

/* ------------------------------------------------------------- generator */

void gpcd_trace_targets_default(gpcd_trace_targets *t) {
    memset(t, 0, sizeof *t);
    t->jobs = 5000;
    t->seed = 1;
    t->cluster_gpus = 64;
    t->load = 1.0;
    static const int sizes[GPCD_TRACE_SIZES] = {1, 2, 4, 8, 16};
    /* Mostly single-GPU jobs with a thin tail of big ones (see the top). */
    static const double shares[GPCD_TRACE_SIZES] = {0.80, 0.08, 0.06, 0.05, 0.01};
    memcpy(t->size_gpus, sizes, sizeof sizes);
    memcpy(t->size_share, shares, sizeof shares);
    t->duration_median = 1800;
    t->duration_sigma = 2.0;
    t->duration_min = 60;
    t->duration_max = 14 * 86400.0;
    t->burst_mean = 4;
    t->diurnal_amplitude = 0.5;
    t->share_high = 0.10;
    t->share_low = 0.20;
}

static double normal64(gpc_rng *rng) {
    /* Box-Muller in double precision */
    double u1 = gpc_rng_uniform64(rng), u2 = gpc_rng_uniform64(rng);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* The round limit a user would ask for: the smallest usual value at least
 * `want` seconds. */
static double round_limit(double want) {
    static const double usual[] = {900,   1800,  3600,   7200,   14400,  28800,
                                   43200, 86400, 172800, 259200, 604800, 1209600};
    for (size_t i = 0; i < sizeof usual / sizeof usual[0]; i++)
        if (usual[i] >= want) return usual[i];
    return ceil(want / 86400.0) * 86400.0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int cmp_submit(const void *a, const void *b) {
    const gpcd_trace_job *x = a, *y = b;
    if (x->submit != y->submit) return x->submit < y->submit ? -1 : 1;
    return x->line - y->line;
}

gpc_status gpcd_trace_generate(const gpcd_trace_targets *t, gpcd_trace *out) {
    out->jobs = NULL;
    out->count = 0;
    if (t->jobs < 1 || t->jobs > 10000000)
        return gpc_error(GPC_ERR_INVALID_ARG, "a trace needs 1 to 10,000,000 jobs, not %d",
                         t->jobs);
    if (t->cluster_gpus < 1 || t->cluster_gpus > GPCD_MAX_GPUS)
        return gpc_error(GPC_ERR_INVALID_ARG, "the cluster needs 1-%d GPUs, not %d", GPCD_MAX_GPUS,
                         t->cluster_gpus);
    if (!(t->load > 0 && t->load <= 10))
        return gpc_error(GPC_ERR_INVALID_ARG, "load %g is outside (0, 10]", t->load);
    if (!(t->burst_mean >= 1) || !(t->diurnal_amplitude >= 0 && t->diurnal_amplitude < 1))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "bursts need a mean >= 1 and the daily swing must be in [0, 1)");
    double share_sum = 0;
    for (int s = 0; s < GPCD_TRACE_SIZES; s++)
        share_sum += t->size_share[s];
    if (fabs(share_sum - 1.0) > 1e-6)
        return gpc_error(GPC_ERR_INVALID_ARG, "the job size shares add up to %g, not 1", share_sum);
    int n = t->jobs;
    gpcd_trace_job *jobs = calloc((size_t)n, sizeof *jobs);
    double *times = NULL;
    if (!jobs) return gpc_error(GPC_ERR_NOMEM, "out of memory generating %d jobs", n);
    gpc_rng rng;
    gpc_rng_seed(&rng, t->seed, 0x7ace);

    /* Jobs come in bursts (a user's sweep): one size per burst, each job
     * with its own run time, submitted seconds apart. */
    int bursts = 0;
    double work = 0;
    for (int i = 0; i < n;) {
        double u = gpc_rng_uniform64(&rng), acc = 0;
        int size = t->size_gpus[GPCD_TRACE_SIZES - 1];
        for (int s = 0; s < GPCD_TRACE_SIZES; s++) {
            acc += t->size_share[s];
            if (u < acc) {
                size = t->size_gpus[s];
                break;
            }
        }
        if (size > t->cluster_gpus) size = t->cluster_gpus;
        /* geometric burst length with the given mean */
        int len = 1;
        double p_more = 1.0 - 1.0 / t->burst_mean;
        while (gpc_rng_uniform64(&rng) < p_more)
            len++;
        for (int k = 0; k < len && i < n; k++, i++) {
            gpcd_trace_job *j = &jobs[i];
            double d = t->duration_median * exp(t->duration_sigma * normal64(&rng));
            if (d < t->duration_min) d = t->duration_min;
            if (d > t->duration_max) d = t->duration_max;
            j->duration = round(d);
            j->gpus = size;
            j->line = bursts; /* burst index until the times are known */
            double over = 1.0 + 2.0 * gpc_rng_uniform64(&rng);
            j->time_limit = round_limit(j->duration * over);
            double p = gpc_rng_uniform64(&rng);
            j->priority = p < t->share_high                  ? GPCD_PRIORITY_HIGH
                          : p < t->share_high + t->share_low ? GPCD_PRIORITY_LOW
                                                             : GPCD_PRIORITY_NORMAL;
            work += j->duration * j->gpus;
        }
        bursts++;
    }

    /* The span that offers `load` of the cluster's GPU time; burst times
     * over it follow the day (rate 1 + A sin(2 pi t / day), by rejection). */
    double span = work / (t->load * t->cluster_gpus);
    times = malloc(sizeof *times * (size_t)bursts);
    if (!times) {
        free(jobs);
        return gpc_error(GPC_ERR_NOMEM, "out of memory generating %d jobs", n);
    }
    for (int b = 0; b < bursts;) {
        double x = gpc_rng_uniform64(&rng) * span;
        double rate = 1.0 + t->diurnal_amplitude * sin(2.0 * M_PI * x / 86400.0);
        if (gpc_rng_uniform64(&rng) * (1.0 + t->diurnal_amplitude) < rate) times[b++] = x;
    }
    qsort(times, (size_t)bursts, sizeof *times, cmp_double);
    times[0] = 0; /* the trace starts with its first submission */
    double offset = 0;
    int last_burst = -1;
    for (int i = 0; i < n; i++) {
        int b = jobs[i].line;
        offset = b == last_burst ? offset + gpc_rng_uniform64(&rng) * 10.0 : 0;
        last_burst = b;
        jobs[i].submit = round((times[b] + offset) * 1000.0) / 1000.0;
    }
    free(times);
    /* bursts overlap a little: put the file in submission order */
    for (int i = 0; i < n; i++)
        jobs[i].line = i;
    qsort(jobs, (size_t)n, sizeof *jobs, cmp_submit);
    for (int i = 0; i < n; i++)
        jobs[i].line = i + 2; /* as gpcd_trace_save writes it, after the header */
    out->jobs = jobs;
    out->count = n;
    return GPC_OK;
}
