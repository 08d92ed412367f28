/*
 * decode_step.c: one serving decode step (gpt_step_paged_sample: upload,
 * the model over the paged cache, drawing on the device, the tokens back)
 * with its CUDA graph replayed and with its kernels launched one by one,
 * on a random GPT-2 of the given depth.
 *
 *   bench_decode_step [--rows 1,64,256] [--context 256] [--depth d12]
 *                     [--max-context 1024] [--vocab 50257] [--block-size 16]
 *                     [--reps 200] [--precision bf16] [--temperature 0]
 *
 * Each row is one sequence at position context - 1 of a model of
 * max-context positions (GPT-2's 1024, so the block tables are as wide as
 * a server's), its blocks spread over the cache in a shuffled order and
 * filled by prompt steps first; every step writes the same slots again, so
 * the steps are alike. The time is the host's wall time of a whole call,
 * the median of --reps after a few untimed ones: what the engine waits for
 * a step. Both caches pad the same way, so their tokens must agree; the
 * program fails when they do not. Lines:
 * RESULT decode_step rows=R context=T graphs=on|off us=... tokens_s=...
 * RESULT decode_step_graph_gain rows=R x=... (off's time over on's).
 * The last timed step of each case and mode is the NVTX range
 * decode-step-R-graphs-on or -off: Nsight Compute's --nvtx --nvtx-include
 * "decode-step-1-graphs-off/" times that step's kernels one by one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "gpc/model.h"
#include "gpc/settings.h"
#include "gpc/trace.h"
#include "model/gpt_internal.h"

#define PROG "bench_decode_step"
#define CHECK(x) BENCH_TRY(PROG, x)
#define MAX_CASES 16
#define MAX_REPS 10000

/* Median wall microseconds of reps steps (after 5 untimed ones), the
 * last step's tokens in drawn. The last step is the NVTX range `range`, so
 * a profiler can take its kernels alone. */
static int time_steps(gpt_paged *p, const gpt_paged_batch *b, const gpt_paged_sampling *rows,
                      int reps, int32_t *drawn, double *us, const char *range) {
    static double t[MAX_REPS];
    for (int r = -5; r < reps; r++) {
        if (r == reps - 1) gpc_trace_push(range);
        double t0 = gpc_time_seconds();
        CHECK(gpt_step_paged_sample(p, b, rows, drawn));
        if (r >= 0) t[r] = (gpc_time_seconds() - t0) * 1e6;
        if (r == reps - 1) gpc_trace_pop();
    }
    qsort(t, (size_t)reps, sizeof(double), bench_cmp_double);
    *us = t[reps / 2];
    return 0;
}

int main(int argc, char **argv) {
    int64_t context = 256, max_context = 1024, vocab = 50257, bs = 16, r64 = 200;
    const char *precision = "bf16", *depth = "d12", *rows_list = "1,64,256";
    double temperature = 0.0;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = v != NULL;
        if (ok && !strcmp(a, "--context"))
            ok = bench_parse_int64(PROG, a, v, 1, 1 << 16, &context);
        else if (ok && !strcmp(a, "--max-context"))
            ok = bench_parse_int64(PROG, a, v, 1, 1 << 16, &max_context);
        else if (ok && !strcmp(a, "--vocab"))
            ok = bench_parse_int64(PROG, a, v, 2, 1 << 20, &vocab);
        else if (ok && !strcmp(a, "--block-size"))
            ok = bench_parse_int64(PROG, a, v, 1, 4096, &bs);
        else if (ok && !strcmp(a, "--reps"))
            ok = bench_parse_int64(PROG, a, v, 1, MAX_REPS, &r64);
        else if (ok && !strcmp(a, "--precision"))
            precision = v;
        else if (ok && !strcmp(a, "--depth"))
            depth = v;
        else if (ok && !strcmp(a, "--rows"))
            rows_list = v;
        else if (ok && !strcmp(a, "--temperature")) {
            char *end;
            temperature = strtod(v, &end);
            ok = end != v && !*end && temperature >= 0 && temperature <= 100;
            if (!ok) fprintf(stderr, "%s: --temperature needs a number from 0 to 100\n", PROG);
        } else {
            fprintf(stderr, "%s: unknown option or missing value: %s\n", PROG, a);
            return 2;
        }
        if (!ok) return 2;
    }
    gpc_dtype dt;
    if (!bench_parse_float_dtype(PROG, precision, &dt)) return 2;
    if (context > max_context) {
        fprintf(stderr, "%s: --context %lld is more than --max-context %lld\n", PROG,
                (long long)context, (long long)max_context);
        return 2;
    }
    int64_t sizes[MAX_CASES];
    int ncases = 0, most = 0;
    for (const char *p = rows_list; *p && ncases < MAX_CASES;) {
        char *end;
        long long x = strtoll(p, &end, 10);
        if (end == p || x < 1 || x > 256 || (*end && *end != ',')) {
            fprintf(stderr,
                    "%s: --rows needs numbers from 1 to 256 separated by commas, not '%s'\n", PROG,
                    rows_list);
            return 2;
        }
        sizes[ncases++] = x;
        if (x > most) most = (int)x;
        p = *end ? end + 1 : end;
    }
    int layers, heads, channels;
    if (gpt_config_parse_depth(depth, &layers, &heads, &channels) != GPC_OK) {
        fprintf(stderr, "%s: --depth: %s\n", PROG, gpc_last_error());
        return 2;
    }
    if (!bench_cuda(PROG)) return 1;
    const gpc_device dev = {GPC_DEVICE_CUDA, 0};
    const int reps = (int)r64, B = (int)bs;
    gpt_config config;
    CHECK(gpt_config_init(&config, layers, heads, channels, (int)max_context, (int)vocab));
    gpt_model *m = NULL;
    CHECK(gpt_create(&m, &config, dev, dt, 1, 1, 0));
    CHECK(gpt_init_weights(m, 20261202));
    const int per_seq = (int)((context + bs - 1) / bs);
    gpt_paged_options po = {.num_blocks = most * per_seq,
                            .block_size = B,
                            .max_seqs = most,
                            .max_tokens = most,
                            .max_logits = most};
    gpt_paged *on = NULL, *off = NULL;
    double t0 = gpc_time_seconds();
    CHECK(gpt_paged_create(&on, m, &po));
    double create_on = gpc_time_seconds() - t0;
    po.eager = 1;
    t0 = gpc_time_seconds();
    CHECK(gpt_paged_create(&off, m, &po));
    double create_off = gpc_time_seconds() - t0;
    printf("# %s, context %lld, %s; creation with its warm-up: %.0f ms with graphs (%d "
           "captured), %.0f ms without\n",
           depth, (long long)context, precision, create_on * 1e3, gpt_paged_graph_count(on),
           create_off * 1e3);
    printf("# fused decode products up to %ld rows (GPC_DECODE_FUSED_MAX_M), programmatic "
           "dependent launch %s (GPC_DECODE_PDL), attention's %s (GPC_PAGED_PDL); splits merged "
           "by %s (GPC_PAGED_COMBINE), %ld keys a split at least (GPC_PAGED_SPLIT_KEYS)\n",
           gpc_setting_int("GPC_DECODE_FUSED_MAX_M"),
           gpc_setting_flag("GPC_DECODE_PDL") ? "on" : "off",
           gpc_setting_flag("GPC_PAGED_PDL") ? "on" : "off", gpc_setting_str("GPC_PAGED_COMBINE"),
           gpc_setting_int("GPC_PAGED_SPLIT_KEYS"));

    const int mb = gpt_paged_max_blocks(on);
    int32_t *order = malloc((size_t)po.num_blocks * sizeof *order);
    int32_t *tables = malloc((size_t)most * mb * sizeof *tables);
    int32_t *tok = malloc((size_t)most * sizeof *tok), *pos = malloc((size_t)most * sizeof *pos);
    int32_t *seq = malloc((size_t)most * sizeof *seq), *slot = malloc((size_t)most * sizeof *slot);
    int32_t *got_on = malloc((size_t)most * sizeof *got_on);
    int32_t *got_off = malloc((size_t)most * sizeof *got_off);
    gpt_paged_sampling *rows = malloc((size_t)most * sizeof *rows);
    gpc_rng rng;
    gpc_rng_seed(&rng, 17, 1);
    for (int i = 0; i < po.num_blocks; i++)
        order[i] = i;
    for (int i = po.num_blocks - 1; i > 0; i--) {
        int j = (int)gpc_rng_below(&rng, (uint32_t)i + 1);
        int32_t t = order[i];
        order[i] = order[j], order[j] = t;
    }
    const int last = (int)context - 1;
    for (int r = 0; r < most; r++) {
        for (int b = 0; b < mb; b++)
            tables[r * mb + b] = b < per_seq ? order[r * per_seq + b] : -1;
        tok[r] = (int32_t)gpc_rng_below(&rng, (uint32_t)vocab), pos[r] = last, seq[r] = r;
        slot[r] = tables[r * mb + last / B] * B + last % B;
        rows[r] = (gpt_paged_sampling){(float)temperature, 0.0f, 1.0f, gpc_rng_uniform(&rng), -1};
    }
    /* the whole context of every sequence in the cache first: one prompt
     * step per sequence, so the attention reads real keys */
    int32_t *ptok = malloc((size_t)context * sizeof *ptok);
    int32_t *ppos = malloc((size_t)context * sizeof *ppos);
    int32_t *pseq = calloc((size_t)context, sizeof *pseq);
    int32_t *pslot = malloc((size_t)context * sizeof *pslot);
    int chunk = most; /* rows a prompt step may have */
    for (int r = 0; r < most; r++)
        for (int first = 0; first < last; first += chunk) {
            int n = last - first < chunk ? last - first : chunk;
            for (int i = 0; i < n; i++) {
                int p = first + i;
                ptok[i] = (int32_t)gpc_rng_below(&rng, (uint32_t)vocab), ppos[i] = p;
                pslot[i] = tables[r * mb + p / B] * B + p % B;
            }
            gpt_paged_batch b = {n, ptok, ppos, pseq, pslot, 1, tables + r * mb, 0, NULL};
            CHECK(gpt_step_paged(on, &b, NULL));
            CHECK(gpt_step_paged(off, &b, NULL));
        }
    for (int c = 0; c < ncases; c++) {
        int n = (int)sizes[c];
        gpt_paged_batch b = {n, tok, pos, seq, slot, n, tables, n, NULL};
        double us_on, us_off;
        char range_on[64], range_off[64];
        snprintf(range_on, sizeof range_on, "decode-step-%d-graphs-on", n);
        snprintf(range_off, sizeof range_off, "decode-step-%d-graphs-off", n);
        if (time_steps(on, &b, rows, reps, got_on, &us_on, range_on)) return 1;
        if (time_steps(off, &b, rows, reps, got_off, &us_off, range_off)) return 1;
        for (int r = 0; r < n; r++)
            if (got_on[r] != got_off[r]) {
                fprintf(stderr,
                        "%s: %d rows: row %d drew %d with graphs and %d without; they must "
                        "agree\n",
                        PROG, n, r, got_on[r], got_off[r]);
                return 1;
            }
        printf("RESULT decode_step rows=%d context=%lld graphs=on us=%.1f tokens_s=%.0f\n", n,
               (long long)context, us_on, n / (us_on * 1e-6));
        printf("RESULT decode_step rows=%d context=%lld graphs=off us=%.1f tokens_s=%.0f\n", n,
               (long long)context, us_off, n / (us_off * 1e-6));
        printf("RESULT decode_step_graph_gain rows=%d x=%.2f\n", n, us_off / us_on);
    }
    free(ptok), free(ppos), free(pseq), free(pslot);
    free(order), free(tables), free(tok), free(pos), free(seq), free(slot);
    free(got_on), free(got_off), free(rows);
    gpt_paged_free(on);
    gpt_paged_free(off);
    gpt_free(m);
    return 0;
}
