/*
 * gpc bench: measurements of this machine that a user needs before choosing
 * how to train on it: GEMM rates (OpenBLAS on the CPU; a naive kernel, a
 * shared-memory tiled kernel and cuBLAS in each precision on the GPU), copy
 * bandwidth and latency from pageable, pinned and managed memory, a
 * copy-compute pipeline on 1, 2 and 4 streams, and gpc's attention op (on a
 * GPU both of its paths, gpc's kernels and cuDNN's, and their ratio); then
 * the seed article's claims set beside what was measured here.
 *
 * Every timing is the median of several repetitions after a warm-up. Every
 * GEMM checks sampled outputs against float64, so a result is only reported
 * as a rate when it is also right.
 */
#ifndef GPC_BENCH_H
#define GPC_BENCH_H

#include "gpc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char group[12];  /* "gemm", "copy", "overlap", "attention" */
    char name[40];   /* "openblas-f32", "cublas-bf16", "h2d-pinned", "streams-2", "cudnn-forward" */
    char device[16]; /* "cpu", "cuda:0" */
    int64_t size;    /* n of the n x n GEMM; bytes of a copy or pipeline; T of attention */
    double seconds;  /* median of the timed repetitions */
    double work;     /* per repetition: floating-point operations or bytes moved */
    double rate;     /* work / seconds / 1e9, in unit */
    char unit[8];    /* "GFLOP/s", "GB/s", or "x" for a ratio (attention's gpc/cudnn-time) */
    double error;    /* GEMM: largest sampled error against float64, normalised; -1 unchecked */
    int ok;          /* 0 when the result failed its check (then rate means nothing) */
} gpc_bench_result;

#define GPC_BENCH_MAX_SKIPPED 16

typedef struct {
    gpc_bench_result *results;
    int count, capacity;
    char skipped[GPC_BENCH_MAX_SKIPPED][256]; /* what was not run, and why */
    int num_skipped;
    char cpu_name[128];
    int cpu_threads; /* OpenBLAS threads used */
    char gpu_name[128];
    int gpu; /* index measured, -1 when no GPU part ran */
} gpc_bench_report;

typedef struct {
    int gemm, copy, overlap, attention; /* groups to run */
    int cuda;                           /* 1: GPU parts too (fails when there is no GPU) */
    int auto_device;                    /* 1: GPU parts when a GPU is usable, else skipped */
    int gpu;                            /* GPU index */
    int quick;                          /* small sizes, few repetitions: seconds in all */
    void (*on_result)(const gpc_bench_result *result, void *user);
    void (*on_skip)(const char *why, void *user);
    void *user;
} gpc_bench_options;

/* Runs the chosen groups, appending to report (zero it first; free with
 * gpc_bench_report_free). Fails only when --device cuda was asked and no GPU
 * is usable, or memory runs out; a group that cannot run here is recorded in
 * report->skipped instead. */
gpc_status gpc_bench_run(const gpc_bench_options *options, gpc_bench_report *report);
void gpc_bench_report_free(gpc_bench_report *report);

typedef enum {
    GPC_CLAIM_NOT_MEASURED = 0,
    GPC_CLAIM_HOLDS,
    GPC_CLAIM_PARTLY,        /* the direction holds, the size does not */
    GPC_CLAIM_DOES_NOT_HOLD, /* no gain at all */
} gpc_claim_verdict;

typedef struct {
    const char *claim; /* the seed article's words */
    double claimed;    /* the ratio claimed */
    double measured;   /* the ratio measured here, 0 when not measured */
    gpc_claim_verdict verdict;
    char detail[320]; /* what was compared, with the numbers, or why it was not */
} gpc_bench_claim;

#define GPC_BENCH_NUM_CLAIMS 4
const char *gpc_claim_verdict_name(gpc_claim_verdict verdict);
/* Fills the four claims (GEMM 50x, FP16 80x, tiling +30%, unified memory
 * latency 15 us -> 2 us) from a report. */
void gpc_bench_claims(const gpc_bench_report *report, gpc_bench_claim claims[GPC_BENCH_NUM_CLAIMS]);
gpc_status gpc_bench_write_json(const char *path, const gpc_bench_options *options,
                                const gpc_bench_report *report,
                                const gpc_bench_claim claims[GPC_BENCH_NUM_CLAIMS]);

/* gpc bench serve: a load generator for gpc serve (or any server of
 * OpenAI's completions API that reports usage). `concurrency` clients send
 * `requests` requests in all, each a prompt of prompt_tokens random token
 * ids asking for max_tokens tokens past end-of-text (ignore_eos), greedy.
 * Streaming gives time to first token and inter-token latencies; without it
 * TTFT is the whole request's time. */
typedef struct {
    const char *url;   /* http://HOST:PORT (IPv4) */
    const char *token; /* bearer token, or NULL */
    int concurrency, requests, prompt_tokens, max_tokens, stream;
    int warmup; /* requests sent first and not counted, so that the server's
                   lazy set-up (first allocations, kernel plans) stays out
                   of the figures */
} gpc_bench_serve_options;

typedef struct {
    int concurrency, requests;
    int ok, busy, failed;        /* 200s, 503s, anything else */
    uint64_t completion_tokens;  /* summed from the responses' usage */
    double seconds;              /* wall time of the whole run */
    double tokens_per_second;    /* completion tokens / seconds */
    double ttft_p50, ttft_p99;   /* seconds */
    uint64_t events;             /* streamed events that carried tokens, over the ok
                                    requests: the server may send several ready tokens
                                    in one event, so ok <= events <= completion_tokens;
                                    0 without stream */
    double itl_p50, itl_p99;     /* seconds between a request's token-carrying events; -1
                                    without stream, or when no request had two such
                                    events (events == ok) */
    double server_busy_fraction; /* gpc serve's busy seconds / wall seconds over the run
                                    (its /metrics); -1 when it does not say */
    char first_error[256];       /* the first failure's status and body */
} gpc_bench_serve_result;

gpc_status gpc_bench_serve(const gpc_bench_serve_options *options, gpc_bench_serve_result *result);

#ifdef __cplusplus
}
#endif

#endif /* GPC_BENCH_H */
