/*
 * cmd_bench.c: `gpc bench`, the measurements of gpc/bench.h printed as a
 * table while they run, then the seed article's claims beside what this
 * machine measured, and optionally the whole as JSON. The measuring is in
 * the library (src/tools/bench.c, src/tools/bench_gemm.cu); this file parses
 * options and prints.
 */
#include "cli/cli.h"
#include "gpc/bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *format_size(const gpc_bench_result *r, char *buf, size_t size) {
    if (!strcmp(r->group, "gemm"))
        snprintf(buf, size, "n=%lld", (long long)r->size);
    else if (!strcmp(r->group, "attention"))
        snprintf(buf, size, "T=%lld", (long long)r->size);
    else
        cli_format_bytes((double)r->size, buf, size);
    return buf;
}

static const char *format_time(double seconds, char *buf, size_t size) {
    if (seconds < 1e-3)
        snprintf(buf, size, "%.1f us", seconds * 1e6);
    else if (seconds < 1)
        snprintf(buf, size, "%.3f ms", seconds * 1e3);
    else
        snprintf(buf, size, "%.3f s", seconds);
    return buf;
}

/* The table header, printed with the first row so that an early error (no
 * GPU with --device cuda) is not preceded by an empty table. */
static void print_header(const int *quick) {
    static int printed;
    if (printed++) return;
    printf("gpc bench%s: %-9s %-22s %-7s %-10s %11s %12s\n", *quick ? " (quick)" : "", "group",
           "name", "device", "size", "time", "rate");
}

static void print_result(const gpc_bench_result *r, void *user) {
    print_header(user);
    char size[32], time[32], err[32] = "";
    if (r->error >= 0) snprintf(err, sizeof err, "err %.1e", r->error);
    /* a ratio ("x") gets two decimals, rates one */
    printf(strcmp(r->unit, "x") ? "  %-9s %-22s %-7s %-10s %11s %12.1f %-7s %s%s\n"
                                : "  %-9s %-22s %-7s %-10s %11s %12.2f %-7s %s%s\n",
           r->group, r->name, r->device, format_size(r, size, sizeof size),
           format_time(r->seconds, time, sizeof time), r->rate, r->unit, err,
           r->ok ? "" : "  WRONG RESULT");
    fflush(stdout);
}

static void print_skip(const char *why, void *user) {
    print_header(user);
    printf("  -- %s\n", why);
    fflush(stdout);
}

int cmd_bench_serve(int argc, char **argv); /* cmd_bench_serve.c */

int cmd_bench(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "serve") == 0) return cmd_bench_serve(argc - 1, argv + 1);
    const char *device = "auto", *json = NULL;
    const char *groups[4];
    int ngroups = 0, quick = 0;
    const cli_option options[] = {
        {"device", CLI_STRING, &device, "D",
         "cpu, cuda, cuda:N, or auto (the GPU parts when a GPU is usable; default auto)"},
        {"json", CLI_STRING, &json, "FILE", "also write every result and the claims as JSON"},
        {"quick", CLI_FLAG, &quick, NULL, "small sizes and few repetitions (seconds in all)"},
        {0},
    };
    const cli_spec spec = {
        "bench",
        "bench [gemm|attention|copy|overlap|all] [--device cpu|cuda] [--json FILE] [--quick]\n"
        "       gpc bench serve --url URL [--concurrency N,...] (see gpc bench serve --help)",
        "Measures GEMM (OpenBLAS on every CPU core; on the GPU a naive kernel, a shared-memory "
        "tiled kernel and cuBLAS in f32, tf32, bf16, f16 and fp8), copies (pageable, pinned, "
        "managed with and without prefetch), a copy-compute pipeline on 1, 2 and 4 streams and "
        "gpc's attention op, then sets the seed article's claims beside what this machine "
        "measured. Without a GPU the CPU parts run and the rest is reported as not run.",
        options,
        4,
        groups,
        &ngroups};
    CLI_PARSE_OR_RETURN(&spec, argc, argv);

    gpc_bench_options o;
    memset(&o, 0, sizeof o);
    o.quick = quick;
    o.on_result = print_result;
    o.on_skip = print_skip;
    o.user = &quick;
    if (ngroups == 0) groups[ngroups++] = "all";
    for (int i = 0; i < ngroups; i++) {
        const char *g = groups[i];
        if (!strcmp(g, "all"))
            o.gemm = o.copy = o.overlap = o.attention = 1;
        else if (!strcmp(g, "gemm"))
            o.gemm = 1;
        else if (!strcmp(g, "copy"))
            o.copy = 1;
        else if (!strcmp(g, "overlap"))
            o.overlap = 1;
        else if (!strcmp(g, "attention"))
            o.attention = 1;
        else
            return cli_usage_error("bench",
                                   "'%s' is not a benchmark: use gemm, attention, copy, "
                                   "overlap or all",
                                   g);
    }
    if (!strcmp(device, "auto")) {
        o.auto_device = 1;
    } else if (!strcmp(device, "cpu")) {
        o.cuda = 0;
    } else {
        /* cuda or cuda:N; whether that GPU is usable is gpc_bench_run's to say,
         * with the reason (no CUDA in this build, no driver, no such GPU). */
        char *end = NULL;
        long index = 0;
        if (!strncmp(device, "cuda:", 5)) index = strtol(device + 5, &end, 10);
        if (strcmp(device, "cuda") != 0 && (strncmp(device, "cuda:", 5) != 0 || end == device + 5 ||
                                            *end || index < 0 || index > 1024))
            return cli_usage_error("bench", "--device %s is not cpu, cuda, cuda:N or auto", device);
        o.cuda = 1;
        o.gpu = (int)index;
    }

    gpc_bench_report report;
    memset(&report, 0, sizeof report);
    gpc_status st = gpc_bench_run(&o, &report);
    if (st) {
        gpc_bench_report_free(&report);
        return cli_fail("bench", st);
    }

    gpc_bench_claim claims[GPC_BENCH_NUM_CLAIMS];
    gpc_bench_claims(&report, claims);
    printf("\nmachine: CPU %s, %d OpenBLAS threads; GPU %s\n", report.cpu_name, report.cpu_threads,
           report.gpu >= 0 ? report.gpu_name : "not measured");
    printf("\nseed-article claims against this machine:\n");
    for (int i = 0; i < GPC_BENCH_NUM_CLAIMS; i++) {
        char measured[32] = "-";
        if (claims[i].verdict != GPC_CLAIM_NOT_MEASURED)
            snprintf(measured, sizeof measured, "%.3gx", claims[i].measured);
        printf("  %-14s claimed %5.3gx, measured %-8s %s\n      %s\n",
               gpc_claim_verdict_name(claims[i].verdict), claims[i].claimed, measured,
               claims[i].claim, claims[i].detail);
    }
    int wrong = 0;
    for (int i = 0; i < report.count; i++)
        wrong += !report.results[i].ok;
    if (json) {
        st = gpc_bench_write_json(json, &o, &report, claims);
        if (st) {
            gpc_bench_report_free(&report);
            return cli_fail("bench", st);
        }
    }
    gpc_bench_report_free(&report);
    if (wrong) {
        fprintf(stderr,
                "gpc bench: error: %d result%s failed the check against float64 (marked WRONG "
                "RESULT): the GPU or its library computes wrongly; report it with the table\n",
                wrong, wrong == 1 ? "" : "s");
        return CLI_EXIT_RUNTIME;
    }
    return CLI_EXIT_OK;
}
