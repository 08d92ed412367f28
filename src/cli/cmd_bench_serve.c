/*
 * cmd_bench_serve.c: `gpc bench serve`: drives a running gpc serve at one
 * or several concurrencies (gpc_bench_serve in src/tools/bench_serve.c) and
 * prints throughput and latency percentiles as a table, and as JSON.
 */
#include "cli/cli.h"
#include "gpc/bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *NAME = "bench serve";

/* A latency cell: milliseconds, or "-" for a figure the run does not have. */
static void ms(double seconds, char *buf, size_t size) {
    if (seconds < 0)
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%.1f ms", seconds * 1e3);
}

static void json_number(FILE *f, const char *name, double v, int last) {
    if (v < 0)
        fprintf(f, "\"%s\": null%s", name, last ? "" : ", ");
    else
        fprintf(f, "\"%s\": %.6g%s", name, v, last ? "" : ", ");
}

static void print_json(FILE *f, const gpc_bench_serve_options *o, const gpc_bench_serve_result *r,
                       int n) {
    fprintf(f,
            "{\"url\": \"%s\", \"prompt_tokens\": %d, \"max_tokens\": %d, \"stream\": %s, "
            "\"runs\": [",
            o->url, o->prompt_tokens, o->max_tokens, o->stream ? "true" : "false");
    for (int i = 0; i < n; i++) {
        fprintf(f,
                "%s\n  {\"concurrency\": %d, \"requests\": %d, \"ok\": %d, \"busy\": %d, "
                "\"failed\": %d, \"completion_tokens\": %llu, ",
                i ? "," : "", r[i].concurrency, r[i].requests, r[i].ok, r[i].busy, r[i].failed,
                (unsigned long long)r[i].completion_tokens);
        if (o->stream)
            fprintf(f, "\"events\": %llu, ", (unsigned long long)r[i].events);
        else
            fprintf(f, "\"events\": null, ");
        json_number(f, "seconds", r[i].seconds, 0);
        json_number(f, "tokens_per_second", r[i].tokens_per_second, 0);
        json_number(f, "ttft_p50", r[i].ttft_p50, 0);
        json_number(f, "ttft_p99", r[i].ttft_p99, 0);
        json_number(f, "itl_p50", r[i].itl_p50, 0);
        json_number(f, "itl_p99", r[i].itl_p99, 0);
        json_number(f, "server_busy_fraction", r[i].server_busy_fraction, 1);
        fprintf(f, "}");
    }
    fprintf(f, "\n]}\n");
}

int cmd_bench_serve(int argc, char **argv) {
    const char *url = "http://127.0.0.1:8000", *levels = "1", *json = NULL, *token_file = NULL;
    int requests = 0, prompt_tokens = 128, max_tokens = 256, stream = 0, warmup = 1;
    const cli_option options[] = {
        {"url", CLI_STRING, &url, "URL", "the server (default http://127.0.0.1:8000)"},
        {"concurrency", CLI_STRING, &levels, "N[,N...]",
         "clients at once; several levels run one after another (default 1)"},
        {"requests", CLI_INT, &requests, "M",
         "requests at each level (default 4 x the concurrency)"},
        {"warmup", CLI_INT, &warmup, "N",
         "requests sent first at each level and not counted (default 1)"},
        {"prompt-tokens", CLI_INT, &prompt_tokens, "P", "random token ids a prompt (default 128)"},
        {"max-tokens", CLI_INT, &max_tokens, "K",
         "tokens a response, past end-of-text (default 256)"},
        {"output-tokens", CLI_INT, &max_tokens, "K", "the same as --max-tokens"},
        {"stream", CLI_FLAG, &stream, NULL,
         "stream the responses: time to first token, inter-token latency and the events "
         "that carried tokens"},
        {"token", CLI_STRING, &token_file, "FILE", "bearer token file of a server with --token"},
        {"json", CLI_STRING, &json, "FILE", "also write the results as JSON (- for stdout)"},
        {0},
    };
    const cli_spec spec = {
        "bench serve",
        "bench serve --url URL [--concurrency N[,N...]] [--requests M] [--warmup N] "
        "[--prompt-tokens P] [--max-tokens K] [--stream] [--json FILE]",
        "Load-tests a running gpc serve: at each concurrency, M greedy requests of P prompt "
        "tokens and K generated tokens; prints throughput, time to first token and "
        "inter-token latency (p50, p99) and the server's busy fraction. Streamed, it also "
        "counts the events that carried tokens: a server sends the tokens ready at once in "
        "one event, so a run whose every response came in one event (events = ok) has no "
        "inter-token gap, and its inter-token latency is '-' (null in JSON).",
        options,
        0,
        NULL,
        NULL,
    };
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    if (prompt_tokens < 1 || max_tokens < 1 || requests < 0)
        return cli_usage_error(NAME,
                               "--prompt-tokens, --max-tokens and --requests must be positive");
    if (warmup < 0) return cli_usage_error(NAME, "--warmup must be 0 or more, not %d", warmup);
    int conc[32], n = 0;
    for (const char *p = levels; *p && n < 32;) {
        char *end;
        long c = strtol(p, &end, 10);
        if (end == p || c < 1 || c > 100000 || (*end && *end != ','))
            return cli_usage_error(NAME, "--concurrency needs numbers such as 1,8,64, not '%s'",
                                   levels);
        conc[n++] = (int)c;
        p = *end ? end + 1 : end;
    }
    char token[512] = "";
    if (token_file) {
        char *text = NULL;
        size_t len = 0;
        gpc_status s = gpc_read_file(token_file, &text, &len);
        if (s != GPC_OK) return cli_fail(NAME, s);
        while (len && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' '))
            text[--len] = '\0';
        snprintf(token, sizeof token, "%s", text);
        gpc_free(text);
    }
    gpc_bench_serve_result results[32];
    gpc_bench_serve_options o = {
        url, token_file ? token : NULL, 0, 0, prompt_tokens, max_tokens, stream, warmup};
    printf("gpc bench serve: %s, prompts of %d tokens, %d tokens out%s\n", url, prompt_tokens,
           max_tokens, stream ? ", streamed" : "");
    printf("  %11s %8s %6s %6s %12s %10s %10s %9s %9s %8s %6s\n", "concurrency", "requests", "ok",
           "503", "tokens/s", "ttft p50", "ttft p99", "itl p50", "itl p99", "events", "busy");
    int failed = 0;
    for (int i = 0; i < n; i++) {
        o.concurrency = conc[i];
        o.requests = requests ? requests : 4 * conc[i];
        gpc_status s = gpc_bench_serve(&o, &results[i]);
        if (s != GPC_OK) return cli_fail(NAME, s);
        const gpc_bench_serve_result *r = &results[i];
        char a[24], b[24], c[24], d[24], events[24] = "-", busy[16] = "-";
        ms(r->ttft_p50, a, sizeof a);
        ms(r->ttft_p99, b, sizeof b);
        ms(r->itl_p50, c, sizeof c);
        ms(r->itl_p99, d, sizeof d);
        if (stream) snprintf(events, sizeof events, "%llu", (unsigned long long)r->events);
        if (r->server_busy_fraction >= 0)
            snprintf(busy, sizeof busy, "%.0f%%", 100 * r->server_busy_fraction);
        printf("  %11d %8d %6d %6d %12.1f %10s %10s %9s %9s %8s %6s\n", r->concurrency, r->requests,
               r->ok, r->busy, r->tokens_per_second, a, b, c, d, events, busy);
        if (stream && r->ok && r->itl_p50 < 0)
            printf("  %11s each response came in one event: no inter-token gap to time\n", "");
        if (r->failed) {
            fprintf(stderr, "gpc bench serve: %d requests failed; the first: %s\n", r->failed,
                    r->first_error);
            failed = 1;
        }
        fflush(stdout);
    }
    if (json) {
        FILE *f = strcmp(json, "-") ? fopen(json, "w") : stdout;
        if (!f) return cli_fail(NAME, gpc_error(GPC_ERR_IO, "cannot write %s", json));
        print_json(f, &o, results, n);
        if (f != stdout) fclose(f);
    }
    return failed ? CLI_EXIT_RUNTIME : CLI_EXIT_OK;
}
