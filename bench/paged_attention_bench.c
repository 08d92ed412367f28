/*
 * paged_attention_bench.c: the serving step's attention over the paged
 * cache (gpc_op_paged_attention) at GPT-2's shape, and its sampling op
 * (gpc_op_sample), timed with CUDA events (median of --reps after
 * warm-up).
 *
 *   bench_paged_attention_bench [--rows 1,16,64,256]
 *                               [--contexts 128,256,512,1024]
 *                               [--kernels v1,v2,v3] [--heads 12]
 *                               [--head-size 64] [--block-size 16]
 *                               [--reps 50] [--precision bf16]
 *                               [--vocab 50257] [--width 0]
 *
 * Each row is one decoding sequence at the last position of a context of
 * the given length, its blocks spread over the cache in a shuffled order
 * (as an engine hands them out). The block tables cover --width positions
 * (0: the context), as gpc serve's cover its longest context whatever the
 * rows' own lengths (this matters where a kernel splits the keys: splits
 * are cut over the table's width). Every count of rows runs at every context
 * under each kernel (GPC_PAGED_KERNEL's v1, v2 and v3, set in turn). The
 * figure that matters is the bandwidth of the keys and values read, rows x
 * context x 2 x C x element size bytes a call, against the GPU's peak
 * (H200: about 4.8 TB/s). Lines: RESULT paged_attention kernel=K rows=R
 * context=T ... us=... kv_gbs=... of_peak=... (peak taken as 4800 GB/s;
 * kernel is the one that ran: v1 where v2 or v3 does not take the shape),
 * then RESULT sample rows=R mode=greedy|top_k|top_p us=... for the
 * sampling op on [R, vocab padded to 64] logits, R the most rows asked
 * for.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "ops/ops.h"
#ifdef GPC_HAVE_CUDA
#include "cuda/paged.h"
#endif

#define PROG "bench_paged_attention_bench"
#define CHECK(x) BENCH_TRY(PROG, x)
#define PEAK_GBS 4800.0 /* H200 HBM3e, NVIDIA's figure */

/* f32 values drawn on the host, converted to t's dtype on the device. */
static gpc_status fill_random(gpc_tensor *t, gpc_rng *rng, float scale) {
    gpc_tensor host, staged;
    GPC_TRY(gpc_tensor_alloc(&host, GPC_F32, gpc_cpu(), t->ndim, t->shape));
    gpc_rng_fill_normal(rng, host.data, (size_t)gpc_tensor_numel(&host), 0, scale);
    gpc_status s = gpc_tensor_alloc(&staged, GPC_F32, t->device, t->ndim, t->shape);
    if (s == GPC_OK) {
        s = gpc_tensor_copy(&staged, &host);
        if (s == GPC_OK) s = gpc_op_convert(t, &staged);
        gpc_tensor_free(&staged);
    }
    gpc_tensor_free(&host);
    return s;
}

/* Median milliseconds of reps calls of gpc_op_paged_attention or, with
 * logits, gpc_op_sample. */
typedef struct {
    gpc_tensor *out, *qkv, *k, *v, *tables, *seq, *pos;
    gpc_tensor *tokens, *logits, *params;
    int NH, vocab;
} bench_call;

static gpc_status run(const bench_call *c) {
    if (c->logits) return gpc_op_sample(c->tokens, c->logits, c->vocab, c->params);
    return gpc_op_paged_attention(c->out, c->qkv, c->k, c->v, c->tables, c->seq, c->pos, c->NH);
}

static int time_median(const gpc_backend *cuda, const bench_call *c, int reps, float *ms) {
    static float t[10000];
    gpc_event e0, e1;
    CHECK(cuda->event_create(&e0));
    CHECK(cuda->event_create(&e1));
    for (int r = -3; r < reps; r++) {
        CHECK(cuda->event_record(e0, NULL));
        CHECK(run(c));
        CHECK(cuda->event_record(e1, NULL));
        float x;
        CHECK(cuda->event_elapsed_ms(e0, e1, &x));
        if (r >= 0) t[r] = x;
    }
    cuda->event_destroy(e0);
    cuda->event_destroy(e1);
    qsort(t, (size_t)reps, sizeof(float), bench_cmp_float);
    *ms = t[reps / 2];
    return 0;
}

/* The kernel switch of paged.cu (without CUDA there is nothing to time:
 * bench_cuda says so before these are called). */
static int set_kernel(int kernel) {
#ifdef GPC_HAVE_CUDA
    return gpc_cuda_paged_set_kernel(kernel);
#else
    return kernel;
#endif
}
static long calls(int kernel) {
#ifdef GPC_HAVE_CUDA
    return gpc_cuda_paged_calls(kernel);
#else
    (void)kernel;
    return 0;
#endif
}

/* "1,16,64" into up to 16 numbers from lo to hi; 0 (and a message) when the
 * text is not such a list. */
static int parse_list(const char *flag, const char *text, long long lo, long long hi, int64_t *out,
                      int *n) {
    *n = 0;
    for (const char *p = text; *p;) {
        char *end;
        long long x = strtoll(p, &end, 10);
        if (end == p || x < lo || x > hi || (*end && *end != ',') || *n == 16) {
            fprintf(stderr,
                    "%s: %s needs up to 16 numbers from %lld to %lld separated by commas, "
                    "not '%s'\n",
                    PROG, flag, lo, hi, text);
            return 0;
        }
        out[(*n)++] = x;
        p = *end ? end + 1 : end;
    }
    if (*n == 0) fprintf(stderr, "%s: %s is empty\n", PROG, flag);
    return *n > 0;
}

int main(int argc, char **argv) {
    int64_t nh = 12, head = 64, bs = 16, r64 = 50, vocab = 50257, width = 0;
    const char *precision = "bf16", *contexts = "128,256,512,1024", *row_list = "1,16,64,256";
    const char *kernels = "v1,v2,v3";
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = v != NULL;
        if (ok && !strcmp(a, "--rows"))
            row_list = v;
        else if (ok && !strcmp(a, "--kernels"))
            kernels = v;
        else if (ok && !strcmp(a, "--heads"))
            ok = bench_parse_int64(PROG, a, v, 1, 256, &nh);
        else if (ok && !strcmp(a, "--head-size"))
            ok = bench_parse_int64(PROG, a, v, 1, 256, &head);
        else if (ok && !strcmp(a, "--block-size"))
            ok = bench_parse_int64(PROG, a, v, 1, 4096, &bs);
        else if (ok && !strcmp(a, "--reps"))
            ok = bench_parse_int64(PROG, a, v, 1, 10000, &r64);
        else if (ok && !strcmp(a, "--width"))
            ok = bench_parse_int64(PROG, a, v, 0, 1 << 20, &width);
        else if (ok && !strcmp(a, "--vocab"))
            ok = bench_parse_int64(PROG, a, v, 1, 1 << 20, &vocab);
        else if (ok && !strcmp(a, "--precision"))
            precision = v;
        else if (ok && !strcmp(a, "--contexts"))
            contexts = v;
        else {
            fprintf(stderr, "%s: unknown option or missing value: %s\n", PROG, a);
            return 2;
        }
        if (!ok) return 2;
    }
    gpc_dtype dt;
    if (!bench_parse_float_dtype(PROG, precision, &dt)) return 2;
    int64_t ctx[16], row_counts[16], kernel_ids[16];
    int nctx, nrows, nkernels = 0;
    if (!parse_list("--contexts", contexts, 1, 1 << 20, ctx, &nctx) ||
        !parse_list("--rows", row_list, 1, 65536, row_counts, &nrows))
        return 2;
    for (const char *p = kernels; *p && nkernels < 16;) {
        size_t len = strcspn(p, ",");
        if (len == 2 && p[0] == 'v' && p[1] >= '1' && p[1] <= '3') {
            kernel_ids[nkernels++] = p[1] - '0';
        } else {
            fprintf(stderr, "%s: --kernels needs v1, v2 or v3 separated by commas, not '%s'\n",
                    PROG, kernels);
            return 2;
        }
        p += len + (p[len] == ',');
    }
    if (nkernels == 0) {
        fprintf(stderr, "%s: --kernels is empty\n", PROG);
        return 2;
    }
    int64_t rows = 0; /* the most rows: the sampling op's */
    for (int r = 0; r < nrows; r++)
        rows = row_counts[r] > rows ? row_counts[r] : rows;
    const gpc_backend *cuda = bench_cuda(PROG);
    if (!cuda) return 1;
    gpc_device dev = {GPC_DEVICE_CUDA, 0};
    const int reps = (int)r64, NH = (int)nh;
    const int64_t C = nh * head, es = (int64_t)gpc_dtype_size(dt);
    gpc_rng rng;
    gpc_rng_seed(&rng, 13, 1);
    for (int rc = 0; rc < nrows; rc++)
        for (int c = 0; c < nctx; c++) {
            const int64_t rows = row_counts[rc];
            const int64_t T = ctx[c], per_seq = (T + bs - 1) / bs, num_blocks = rows * per_seq;
            const int64_t W = width > T ? width : T, table_blocks = (W + bs - 1) / bs;
            const int64_t s_qkv[2] = {rows, 3 * C}, s_out[2] = {rows, C};
            const int64_t s_cache[3] = {num_blocks, bs, C}, s_tab[2] = {rows, table_blocks};
            const int64_t s_rows[1] = {rows};
            gpc_tensor qkv, out, k, v, tables, seq, pos, h_tables, h_seq, h_pos;
            CHECK(gpc_tensor_alloc(&qkv, dt, dev, 2, s_qkv));
            CHECK(gpc_tensor_alloc(&out, dt, dev, 2, s_out));
            CHECK(gpc_tensor_alloc(&k, dt, dev, 3, s_cache));
            CHECK(gpc_tensor_alloc(&v, dt, dev, 3, s_cache));
            CHECK(gpc_tensor_alloc(&tables, GPC_I32, dev, 2, s_tab));
            CHECK(gpc_tensor_alloc(&seq, GPC_I32, dev, 1, s_rows));
            CHECK(gpc_tensor_alloc(&pos, GPC_I32, dev, 1, s_rows));
            CHECK(gpc_tensor_alloc(&h_tables, GPC_I32, gpc_cpu(), 2, s_tab));
            CHECK(gpc_tensor_alloc(&h_seq, GPC_I32, gpc_cpu(), 1, s_rows));
            CHECK(gpc_tensor_alloc(&h_pos, GPC_I32, gpc_cpu(), 1, s_rows));
            CHECK(fill_random(&qkv, &rng, 1.0f));
            CHECK(fill_random(&k, &rng, 1.0f));
            CHECK(fill_random(&v, &rng, 1.0f));
            /* blocks handed out in a shuffled order; -1 past a row's own */
            int32_t *tab = h_tables.data, *sq = h_seq.data, *ps = h_pos.data;
            int32_t *order = malloc((size_t)num_blocks * sizeof(int32_t));
            if (!order) {
                fprintf(stderr, "%s: out of memory\n", PROG);
                return 1;
            }
            for (int64_t i = 0; i < num_blocks; i++)
                order[i] = (int32_t)i;
            for (int64_t i = num_blocks - 1; i > 0; i--) {
                int64_t j = gpc_rng_below(&rng, (uint32_t)(i + 1));
                int32_t t = order[i];
                order[i] = order[j], order[j] = t;
            }
            for (int64_t r = 0; r < rows; r++)
                for (int64_t b = 0; b < table_blocks; b++)
                    tab[r * table_blocks + b] = b < per_seq ? order[r * per_seq + b] : -1;
            free(order);
            for (int64_t r = 0; r < rows; r++)
                sq[r] = (int32_t)r, ps[r] = (int32_t)(T - 1);
            CHECK(gpc_tensor_copy(&tables, &h_tables));
            CHECK(gpc_tensor_copy(&seq, &h_seq));
            CHECK(gpc_tensor_copy(&pos, &h_pos));
            bench_call call = {&out, &qkv, &k, &v, &tables, &seq, &pos, NULL, NULL, NULL, NH, 0};
            for (int kk = 0; kk < nkernels; kk++) {
                int before = set_kernel((int)kernel_ids[kk]);
                long before_calls = calls((int)kernel_ids[kk]);
                float ms;
                if (time_median(cuda, &call, reps, &ms)) return 1;
                int ran = calls((int)kernel_ids[kk]) > before_calls ? (int)kernel_ids[kk] : 1;
                set_kernel(before);
                double bytes = (double)rows * (double)T * 2.0 * (double)C * (double)es;
                double gbs = bytes / (ms * 1e6);
                printf("RESULT paged_attention kernel=v%d rows=%lld context=%lld width=%lld NH=%d "
                       "hs=%lld block=%lld %s us=%.1f kv_mb=%.1f kv_gbs=%.0f of_peak=%.1f%%\n",
                       ran, (long long)rows, (long long)T, (long long)(table_blocks * bs), NH,
                       (long long)head, (long long)bs, precision, ms * 1e3, bytes / 1e6, gbs,
                       100.0 * gbs / PEAK_GBS);
                fflush(stdout);
            }
            gpc_tensor *all[] = {&qkv, &out, &k,        &v,     &tables,
                                 &seq, &pos, &h_tables, &h_seq, &h_pos};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
                gpc_tensor_free(all[i]);
        }

    /* sampling: greedy, top-k 40 and top-p 0.9 over the whole vocabulary */
    const int64_t Vp = (vocab + 63) / 64 * 64;
    const int64_t s_logits[2] = {rows, Vp}, s_params[2] = {rows, 4}, s_tokens[1] = {rows};
    gpc_tensor logits, params, tokens, h_params;
    CHECK(gpc_tensor_alloc(&logits, dt, dev, 2, s_logits));
    CHECK(gpc_tensor_alloc(&params, GPC_F32, dev, 2, s_params));
    CHECK(gpc_tensor_alloc(&tokens, GPC_I32, dev, 1, s_tokens));
    CHECK(gpc_tensor_alloc(&h_params, GPC_F32, gpc_cpu(), 2, s_params));
    CHECK(fill_random(&logits, &rng, 3.0f));
    const char *modes[3] = {"greedy", "top_k40", "top_p0.9"};
    const float settings[3][3] = {{0, 0, 1}, {0.8f, 40, 1}, {1, 0, 0.9f}};
    for (int m = 0; m < 3; m++) {
        float *p = h_params.data;
        for (int64_t r = 0; r < rows; r++) {
            p[4 * r] = settings[m][0], p[4 * r + 1] = settings[m][1];
            p[4 * r + 2] = settings[m][2], p[4 * r + 3] = gpc_rng_uniform(&rng);
        }
        CHECK(gpc_tensor_copy(&params, &h_params));
        bench_call call = {NULL, NULL,    NULL,    NULL,    NULL, NULL,
                           NULL, &tokens, &logits, &params, NH,   (int)vocab};
        float ms;
        if (time_median(cuda, &call, reps, &ms)) return 1;
        printf("RESULT sample rows=%lld vocab=%lld mode=%s %s us=%.1f\n", (long long)rows,
               (long long)vocab, modes[m], precision, ms * 1e3);
    }
    gpc_tensor_free(&logits), gpc_tensor_free(&params), gpc_tensor_free(&tokens);
    gpc_tensor_free(&h_params);
    return 0;
}
