/*
 * cmd_sched_tool.c: gpc sched, gpcd's helper tools:
 *
 *   gpc sched options   every gpcd config key with its default and meaning
 *                       (the table docs/gpcd.md is written from)
 *   gpc sched trace     writes a synthetic Philly-like job trace (trace.c)
 *   gpc sched simulate  runs a trace through the real policies on a
 *                       simulated clock and reports job completion times
 *                       (simulate.c)
 */
#include "cli/cmd_sched.h"
#include "gpc/sched_sim.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int gpcd_tool_trace(int argc, char **argv) {
    gpcd_trace_targets t;
    gpcd_trace_targets_default(&t);
    int64_t seed = 1;
    const char *out = NULL;
    const cli_option options[] = {
        {"jobs", CLI_INT, &t.jobs, "N", "jobs in the trace (default 5000)"},
        {"seed", CLI_INT64, &seed, "S", "random seed (default 1): same seed, same trace"},
        {"out", CLI_STRING, &out, "FILE", "where to write the CSV (required)"},
        {"gpus", CLI_INT, &t.cluster_gpus, "N", "GPUs the load is offered to (default 64)"},
        {"load", CLI_FLOAT, &t.load, "X",
         "offered load: GPU-time asked for / (GPUs x span), default 1.0"},
        {0},
    };
    const cli_spec spec = {"sched trace",
                           "sched trace --jobs N --seed S --out FILE [--gpus N] [--load X]",
                           "Writes a synthetic job trace shaped like the Microsoft Philly "
                           "workload (Jeon et al., ATC 2019): mostly 1-GPU jobs with a tail of "
                           "2-16 GPUs, heavy-tailed run times, bursty daily arrivals. Columns: "
                           "submit,duration,gpus,priority,time_limit (seconds).",
                           options,
                           0,
                           NULL,
                           NULL};
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    if (!out) return cli_usage_error("sched trace", "--out FILE is required");
    t.seed = (uint64_t)seed;
    gpcd_trace trace;
    gpc_status st = gpcd_trace_generate(&t, &trace);
    if (st != GPC_OK) return cli_fail("sched trace", st);
    st = gpcd_trace_save(out, &trace);
    if (st != GPC_OK) {
        gpcd_trace_free(&trace);
        return cli_fail("sched trace", st);
    }
    double work = 0, span = trace.jobs[trace.count - 1].submit;
    int single = 0;
    for (int i = 0; i < trace.count; i++) {
        work += trace.jobs[i].duration * trace.jobs[i].gpus;
        single += trace.jobs[i].gpus == 1;
    }
    fprintf(stderr,
            "gpc sched trace: %d jobs over %.1f days (%.0f%% single-GPU), %.0f GPU-hours, "
            "offered load %.2f on %d GPUs -> %s\n",
            trace.count, span / 86400.0, 100.0 * single / trace.count, work / 3600.0,
            span > 0 ? work / (span * t.cluster_gpus) : 0, t.cluster_gpus, out);
    gpcd_trace_free(&trace);
    return CLI_EXIT_OK;
}

static json_t *result_json(const char *policy, const gpcd_sim_result *r) {
    json_t *o = json_object();
    json_object_set_new(o, "policy", json_string(policy));
    json_object_set_new(o, "jobs", json_integer(r->jobs));
    json_object_set_new(o, "completed", json_integer(r->completed));
    json_object_set_new(o, "timed_out", json_integer(r->timed_out));
    json_object_set_new(o, "preemptions", json_integer(r->preemptions));
    json_object_set_new(o, "elastic_jobs", json_integer(r->elastic_jobs));
    json_object_set_new(o, "resizes", json_integer(r->resizes));
    json_object_set_new(o, "passes", json_integer(r->passes));
    json_object_set_new(o, "mean_jct", json_real(r->mean_jct));
    json_object_set_new(o, "median_jct", json_real(r->median_jct));
    json_object_set_new(o, "p95_jct", json_real(r->p95_jct));
    json_object_set_new(o, "makespan", json_real(r->makespan));
    json_object_set_new(o, "utilization", json_real(r->utilization));
    json_object_set_new(o, "mean_wait", json_real(r->mean_wait));
    json_object_set_new(o, "worst_wait", json_real(r->worst_wait));
    json_object_set_new(o, "worst_wait_line", json_integer(r->worst_wait_line));
    return o;
}

static int gpcd_tool_simulate(int argc, char **argv) {
    const char *trace_path = NULL;
    cli_list policies = {0};
    int gpus = 64, json = 0, per_job = 0;
    uint64_t gpu_mem = 141ull << 30;
    double tick = 0, grace = 30, elastic = 0;
    cli_list settings = {0};
    const cli_option options[] = {
        {"trace", CLI_STRING, &trace_path, "FILE", "the job trace (CSV; see gpc sched trace)"},
        {"policy", CLI_STRING_LIST, &policies, "P...",
         "one or more policy sets: fifo, all, or a comma list such as "
         "priority,aging,backfill (default: all)"},
        {"gpus", CLI_INT, &gpus, "N", "GPUs in the simulated cluster, 1-64 (default 64)"},
        {"gpu-mem", CLI_BYTES, &gpu_mem, "SIZE", "memory per GPU (default 141G)"},
        {"tick", CLI_FLOAT, &tick, "SECONDS",
         "also run a pass this often while jobs wait (default 0: only on arrivals and ends)"},
        {"set", CLI_STRING_LIST, &settings, "KEY=VALUE...",
         "gpcd config keys for the policies, e.g. aging_per_hour=5 shortest_first_points=20"},
        {"preempt-grace", CLI_FLOAT, &grace, "SECONDS",
         "how long a preempted job holds its GPUs (default 30)"},
        {"elastic", CLI_FLOAT, &elastic, "SHARE",
         "also run each policy set with this share (0-1) of the jobs elastic: a job of G GPUs "
         "runs at G/2 to 2G (default 0: rigid only)"},
        {"json", CLI_FLAG, &json, NULL, "print the results as JSON"},
        {"per-job", CLI_FLAG, &per_job, NULL, "with --json: every job's completion time too"},
        {0},
    };
    const cli_spec spec = {
        "sched simulate",
        "sched simulate --trace FILE [--policy P...] [--gpus N] [--json]",
        "Runs a job trace through gpcd's real scheduling pass on a simulated clock (no "
        "processes, no sleeping) and reports mean, median and p95 job completion time (JCT), "
        "makespan, GPU utilisation and waits; the worst wait shows whether a job starved.",
        options,
        0,
        NULL,
        NULL};
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    if (!trace_path) return cli_usage_error("sched simulate", "--trace FILE is required");
    if (gpus < 1 || gpus > GPCD_MAX_GPUS)
        return cli_usage_error("sched simulate", "--gpus %d is outside 1-%d", gpus, GPCD_MAX_GPUS);
    if (tick < 0 || grace < 0)
        return cli_usage_error("sched simulate", "--tick and --preempt-grace must be >= 0");
    if (!(elastic >= 0 && elastic <= 1))
        return cli_usage_error("sched simulate", "--elastic is a share of the jobs, 0-1, not %g",
                               elastic);
    const char *default_policy = "all";
    if (policies.count == 0) {
        policies.items = &default_policy;
        policies.count = 1;
    }
    gpcd_config config;
    gpcd_config_defaults(&config);
    for (int i = 0; i < settings.count; i++) {
        char key[64];
        const char *eq = strchr(settings.items[i], '=');
        if (!eq || eq == settings.items[i] || (size_t)(eq - settings.items[i]) >= sizeof key)
            return cli_usage_error("sched simulate", "--set '%s' is not KEY=VALUE",
                                   settings.items[i]);
        memcpy(key, settings.items[i], (size_t)(eq - settings.items[i]));
        key[eq - settings.items[i]] = '\0';
        if (gpcd_config_set(&config, key, eq + 1) != GPC_OK)
            return cli_fail("sched simulate", GPC_ERR_INVALID_ARG);
    }
    unsigned flags[64];
    if (policies.count > 64) return cli_usage_error("sched simulate", "at most 64 policy sets");
    for (int i = 0; i < policies.count; i++)
        if (gpcd_sim_policy_parse(policies.items[i], &flags[i]) != GPC_OK)
            return cli_fail("sched simulate", GPC_ERR_INVALID_ARG);
    gpcd_trace trace;
    gpc_status st = gpcd_trace_load(trace_path, &trace);
    if (st != GPC_OK) return cli_fail("sched simulate", st);
    gpcd_sim_options o = {gpus, gpu_mem, grace, tick, 0};
    double *jct = per_job ? malloc(sizeof *jct * (size_t)trace.count) : NULL;
    json_t *all = json_array();
    if (!json) {
        printf("%d jobs on %d GPUs; times in hours\n", trace.count, gpus);
        printf("%-44s %9s %9s %9s %9s %6s %9s %10s %8s %7s %6s\n", "policy", "mean JCT", "median",
               "p95 JCT", "makespan", "util", "mean wait", "worst wait", "timeouts", "preempt",
               "resize");
    }
    /* with --elastic, each set twice: all jobs rigid, then the share elastic */
    int runs = elastic > 0 ? 2 : 1;
    for (int n = 0; n < policies.count * runs && st == GPC_OK; n++) {
        int i = n / runs, elastic_run = n % runs;
        gpcd_policy_config policy = config.policy;
        policy.flags = flags[i];
        o.elastic = elastic_run ? elastic : 0;
        char label[300];
        snprintf(label, sizeof label, elastic_run ? "%.260s +elastic %g" : "%.260s",
                 policies.items[i], elastic);
        gpcd_sim_result r;
        st = gpcd_simulate(&trace, &policy, &o, &r, jct);
        if (st != GPC_OK) break;
        if (json) {
            json_t *row = result_json(policies.items[i], &r);
            json_object_set_new(row, "elastic", json_real(o.elastic));
            if (jct) {
                json_t *list = json_array();
                for (int j = 0; j < trace.count; j++)
                    json_array_append_new(list, json_real(jct[j]));
                json_object_set_new(row, "jct", list);
            }
            json_array_append_new(all, row);
        } else {
            printf("%-44s %9.2f %9.2f %9.2f %9.1f %5.1f%% %9.2f %10.2f %8d %7d %6d\n", label,
                   r.mean_jct / 3600, r.median_jct / 3600, r.p95_jct / 3600, r.makespan / 3600,
                   100 * r.utilization, r.mean_wait / 3600, r.worst_wait / 3600, r.timed_out,
                   r.preemptions, r.resizes);
            fflush(stdout);
        }
    }
    if (st == GPC_OK && json) {
        json_t *o2 = json_object();
        json_object_set_new(o2, "trace", json_string(trace_path));
        json_object_set_new(o2, "gpus", json_integer(gpus));
        json_object_set_new(o2, "results", all);
        all = NULL;
        char *text = json_dumps(o2, JSON_COMPACT | JSON_REAL_PRECISION(17));
        printf("%s\n", text ? text : "{}");
        free(text);
        json_decref(o2);
    }
    json_decref(all);
    free(jct);
    gpcd_trace_free(&trace);
    return st == GPC_OK ? CLI_EXIT_OK : cli_fail("sched simulate", st);
}

int cmd_sched(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        printf("usage: gpc sched options|trace|simulate [OPTIONS]\n\n"
               "Tools for gpcd. 'options' prints every config key with its default and meaning;\n"
               "'trace' writes a synthetic Philly-like job trace; 'simulate' runs a trace\n"
               "through the real placement policies on a simulated clock.\n");
        return argc < 2 ? CLI_EXIT_USAGE : CLI_EXIT_OK;
    }
    if (strcmp(argv[1], "options") == 0) {
        if (argc > 2) return cli_usage_error("sched", "'options' takes no arguments");
        gpcd_config_write_markdown(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(argv[1], "trace") == 0) return gpcd_tool_trace(argc - 1, argv + 1);
    if (strcmp(argv[1], "simulate") == 0) return gpcd_tool_simulate(argc - 1, argv + 1);
    return cli_usage_error("sched", "unknown tool '%s' (use: options, trace, simulate)", argv[1]);
}
