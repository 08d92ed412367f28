/*
 * sample.c: the sampling op on the CPU (gpc_op_sample in ops.h): each row
 * through gpc_sample_select, the rule gpc_sample_token uses too, so a row
 * gives the token generation one stream at a time gives for the same
 * uniform. The parameters are on the host here, so each is checked and a
 * bad one names its row. gpc_op_forbid_tokens, the engine's step before a
 * draw, and gpc_op_feed_tokens, which gives a step the tokens its
 * predecessor drew, live here too.
 */
#include "cpu/cpu.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>

gpc_status gpc_cpu_sample(gpc_tensor *tokens_out, const gpc_tensor *logits, int vocab_size,
                          const gpc_tensor *params) {
    const char *op = "sample";
    GPC_TRY(gpc_cpu_need_f32(op, "logits", logits));
    int64_t Vp = gpc_cpu_last_dim(logits), R = gpc_cpu_rows(logits);
    const float *p = params->data;
    for (int64_t r = 0; r < R; r++) {
        float t = p[4 * r], k = p[4 * r + 1], top_p = p[4 * r + 2], u = p[4 * r + 3];
        if (!(t >= 0.0f) || isinf(t))
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "%s: row %lld has temperature %g; it must be finite and >= 0", op,
                             (long long)r, (double)t);
        if (!(k >= 0.0f) || k != floorf(k))
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "%s: row %lld has top_k %g; it must be a whole number >= 0 (0: all)",
                             op, (long long)r, (double)k);
        if (!(top_p > 0.0f && top_p <= 1.0f))
            return gpc_error(GPC_ERR_INVALID_ARG, "%s: row %lld has top_p %g; it must be in (0, 1]",
                             op, (long long)r, (double)top_p);
        if (!(u >= 0.0f && u < 1.0f))
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "%s: row %lld has uniform %g; it must be in [0, 1)", op, (long long)r,
                             (double)u);
    }
    int threads = omp_get_max_threads();
    char *scratch = malloc((size_t)threads * (size_t)vocab_size * 8);
    if (!scratch)
        return gpc_error(GPC_ERR_NOMEM, "%s: out of memory for %d candidates", op, vocab_size);
    const float *x = logits->data;
    int32_t *out = tokens_out->data;
#pragma omp parallel for schedule(dynamic, 1) if (R > 1 && R * vocab_size >= GPC_CPU_PARALLEL_MIN)
    for (int64_t r = 0; r < R; r++) {
        float k = p[4 * r + 1];
        int top_k = k >= (float)vocab_size ? vocab_size : (int)k;
        out[r] = (int32_t)gpc_sample_select(
            x + r * Vp, vocab_size, p[4 * r], top_k, p[4 * r + 2], (double)p[4 * r + 3],
            scratch + (size_t)omp_get_thread_num() * vocab_size * 8);
    }
    free(scratch);
    return GPC_OK;
}

gpc_status gpc_cpu_forbid_tokens(gpc_tensor *logits, const gpc_tensor *tokens) {
    const char *op = "forbid_tokens";
    GPC_TRY(gpc_cpu_need_f32(op, "logits", logits));
    int64_t Vp = gpc_cpu_last_dim(logits), R = gpc_cpu_rows(logits);
    const int32_t *t = tokens->data;
    for (int64_t r = 0; r < R; r++)
        if (t[r] >= Vp)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "%s: row %lld forbids token %d, past the logits' %lld columns", op,
                             (long long)r, t[r], (long long)Vp);
    float *x = logits->data;
    for (int64_t r = 0; r < R; r++)
        if (t[r] >= 0) x[r * Vp + t[r]] = -INFINITY;
    return GPC_OK;
}

gpc_status gpc_cpu_feed_tokens(gpc_tensor *tokens, const gpc_tensor *feed,
                               const gpc_tensor *previous) {
    const char *op = "feed_tokens";
    int64_t N = gpc_tensor_numel(tokens), R = gpc_tensor_numel(previous);
    const int32_t *f = feed->data, *prev = previous->data;
    for (int64_t i = 0; i < N; i++)
        if (f[i] >= R)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "%s: row %lld takes token %d of a step that drew %lld", op,
                             (long long)i, f[i], (long long)R);
    int32_t *t = tokens->data;
    for (int64_t i = 0; i < N; i++)
        if (f[i] >= 0) t[i] = prev[f[i]];
    return GPC_OK;
}
