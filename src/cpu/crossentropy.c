/*
 * crossentropy.c: fused softmax + cross-entropy over the classifier's logits,
 * loss and gradient in one pass over each row.
 *
 * For row n with target t: loss = logsumexp(logits[n, :V]) - logits[n, t],
 * computed stably by subtracting the row maximum first; dlogits[n, j] =
 * (softmax_j - [j == t]) * dloss for j < V and 0 in the padded columns
 * V..Vp-1 (they are not real tokens, and zero keeps their weights still).
 * A target of -1 masks the row: loss 0, gradient 0.
 *
 * dlogits may be logits itself: the [N, Vp] logits are the largest
 * activation of a small model, and overwriting them with their gradient saves
 * that buffer. So each row first reads everything it needs (max and the
 * target's logit), then writes e^{x-max} over the row while summing, then
 * scales in place. Rows are independent: a parallel loop over rows.
 * Targets are all checked before anything is written, so a bad target leaves
 * the logits untouched.
 *
 * The slice ops compute the same over one tensor-parallel rank's columns,
 * with the row's max and sums reduced over the ranks between them.
 *
 * The whole output head (gpc_op_classifier) is not fused on the CPU: its
 * entry here answers unsupported, and ops.c composes it.
 */
#include "cpu/cpu.h"

#include <math.h>
#include <string.h>

/* Targets are -1 (masked) or in 0..V-1. All are checked before anything is
 * written, so a bad target leaves the logits untouched. */
static gpc_status check_targets(const char *op, const gpc_tensor *targets, int64_t N, int64_t V) {
    const int32_t *tg = targets->data;
    for (int64_t n = 0; n < N; n++)
        if (tg[n] != -1 && (tg[n] < 0 || tg[n] >= V))
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "%s: target %d in row %lld is outside 0..%lld (use -1 to mask a "
                             "row): the data does not match this model's vocabulary",
                             op, tg[n], (long long)n, (long long)V - 1);
    return GPC_OK;
}

gpc_status gpc_cpu_crossentropy_forward_backward(gpc_tensor *losses, gpc_tensor *dlogits,
                                                 const gpc_tensor *logits,
                                                 const gpc_tensor *targets, int vocab_size,
                                                 float dloss) {
    const char *op = "crossentropy_forward_backward";
    GPC_TRY(gpc_cpu_need_f32(op, "logits", logits));
    GPC_TRY(gpc_cpu_need_f32(op, "dlogits", dlogits));
    int64_t Vp = gpc_cpu_last_dim(logits), N = gpc_cpu_rows(logits), V = vocab_size;
    GPC_TRY(check_targets(op, targets, N, V));
    const int32_t *tg = targets->data;
    float *loss = losses->data;
    float *dl = dlogits && dlogits->data ? dlogits->data : NULL;
    const float *x = logits->data;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * Vp;
        float *dr = dl ? dl + n * Vp : NULL;
        int32_t t = tg[n];
        if (t < 0) {
            loss[n] = 0.0f;
            if (dr) memset(dr, 0, (size_t)Vp * sizeof(float));
            continue;
        }
        float max = xr[0];
#pragma omp simd reduction(max : max)
        for (int64_t j = 0; j < V; j++)
            max = xr[j] > max ? xr[j] : max;
        float xt = xr[t];
        /* the sum in double, vectorised in a fixed order: V can be 50k terms */
        double sum = 0.0;
        if (dr) {
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < V; j++) {
                float e = gpc_cpu_expf(xr[j] - max);
                dr[j] = e;
                sum += e;
            }
        } else {
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < V; j++)
                sum += gpc_cpu_expf(xr[j] - max);
        }
        loss[n] = (float)((double)max + log(sum) - (double)xt);
        if (dr) {
            float scale = (float)(1.0 / sum) * dloss;
            for (int64_t j = 0; j < V; j++)
                dr[j] *= scale;
            dr[t] -= dloss;
            for (int64_t j = V; j < Vp; j++)
                dr[j] = 0.0f;
        }
    }
    return GPC_OK;
}

/* ---------------------------------------- vocabulary-parallel (ops.h) */

/* The real columns of a slice [col0, col0 + S) of a vocabulary of V: the
 * first `real` of its S columns. */
static int64_t slice_real(int64_t col0, int64_t S, int64_t V) {
    int64_t real = V - col0;
    return real < 0 ? 0 : real > S ? S : real;
}

gpc_status gpc_cpu_crossentropy_slice_max(gpc_tensor *stats, const gpc_tensor *logits, int64_t col0,
                                          int vocab_size) {
    GPC_TRY(gpc_cpu_need_f32("crossentropy_slice_max", "logits", logits));
    int64_t S = gpc_cpu_last_dim(logits), N = gpc_cpu_rows(logits);
    int64_t real = slice_real(col0, S, vocab_size);
    const float *x = logits->data;
    float *max = stats->data;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * S;
        float m = -INFINITY;
        for (int64_t j = 0; j < real; j++)
            m = xr[j] > m ? xr[j] : m;
        max[n] = m;
    }
    return GPC_OK;
}

gpc_status gpc_cpu_crossentropy_slice_sums(gpc_tensor *stats, const gpc_tensor *logits,
                                           const gpc_tensor *targets, int64_t col0,
                                           int vocab_size) {
    const char *op = "crossentropy_slice_sums";
    GPC_TRY(gpc_cpu_need_f32(op, "logits", logits));
    int64_t S = gpc_cpu_last_dim(logits), N = gpc_cpu_rows(logits);
    GPC_TRY(check_targets(op, targets, N, vocab_size));
    int64_t real = slice_real(col0, S, vocab_size);
    const float *x = logits->data;
    const int32_t *tg = targets->data;
    float *max = stats->data, *sum = max + N, *target = max + 2 * N;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * S;
        /* in double, in a fixed order, as the whole-row op sums */
        double s = 0.0;
        float m = max[n];
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < real; j++)
            s += gpc_cpu_expf(xr[j] - m);
        sum[n] = (float)s;
        int64_t t = (int64_t)tg[n] - col0;
        target[n] = tg[n] >= 0 && t >= 0 && t < real ? xr[t] : 0.0f;
    }
    return GPC_OK;
}

gpc_status gpc_cpu_crossentropy_slice_finish(gpc_tensor *losses, gpc_tensor *dlogits,
                                             const gpc_tensor *logits, const gpc_tensor *targets,
                                             const gpc_tensor *stats, int64_t col0, int vocab_size,
                                             float dloss) {
    const char *op = "crossentropy_slice_finish";
    GPC_TRY(gpc_cpu_need_f32(op, "logits", logits));
    GPC_TRY(gpc_cpu_need_f32(op, "dlogits", dlogits));
    int64_t S = gpc_cpu_last_dim(logits), N = gpc_cpu_rows(logits);
    GPC_TRY(check_targets(op, targets, N, vocab_size));
    int64_t real = slice_real(col0, S, vocab_size);
    const float *x = logits->data, *max = stats->data, *sum = max + N, *target = max + 2 * N;
    const int32_t *tg = targets->data;
    float *loss = losses->data;
    float *dl = dlogits && dlogits->data ? dlogits->data : NULL;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * S;
        float *dr = dl ? dl + n * S : NULL;
        if (tg[n] < 0) {
            loss[n] = 0.0f;
            if (dr) memset(dr, 0, (size_t)S * sizeof(float));
            continue;
        }
        loss[n] = (float)((double)max[n] + log((double)sum[n]) - (double)target[n]);
        if (!dr) continue;
        float scale = (float)(1.0 / (double)sum[n]) * dloss;
        for (int64_t j = 0; j < real; j++)
            dr[j] = gpc_cpu_expf(xr[j] - max[n]) * scale;
        int64_t t = (int64_t)tg[n] - col0;
        if (t >= 0 && t < real) dr[t] -= dloss;
        for (int64_t j = real; j < S; j++)
            dr[j] = 0.0f;
    }
    return GPC_OK;
}

/* The output head in one call (gpc_op_classifier): the CPU has no fused
 * kernel for it. Answering unsupported makes ops.c run the product, the
 * cross-entropy above (in place) and the backward products, so a CPU
 * training step runs the same kernels in the same order as before the op
 * existed, and gives the same bits. */
gpc_status gpc_cpu_classifier(gpc_tensor *losses, gpc_tensor *dinp, gpc_tensor *dweight,
                              gpc_tensor *logits, const gpc_tensor *inp, const gpc_tensor *weight,
                              const gpc_tensor *targets, int vocab_size, float dloss) {
    (void)losses, (void)dinp, (void)dweight, (void)logits, (void)inp, (void)weight, (void)targets,
        (void)vocab_size, (void)dloss;
    return gpc_error(GPC_ERR_UNSUPPORTED, "classifier: no fused kernel on the CPU");
}
