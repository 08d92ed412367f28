/*
 * sample_rule.c: the rule that picks a token from a row of logits and a
 * uniform number (gpc_sample_select in ops.h). It is the meaning of
 * gpc_op_sample, run by the CPU backend row by row, and the body of
 * gpc_sample_token, so generation one stream at a time and the serving
 * engine draw the same token from the same logits and the same uniform.
 *
 * Top-k keeps the k largest logits (Fan et al. 2018), temperature divides
 * the logits before the softmax; both are the knobs of GPT-2's own sampler.
 * Top-p (nucleus sampling, Holtzman et al. 2020) then keeps the smallest
 * set of the likeliest tokens whose probability reaches p. The softmax is
 * computed with the largest logit subtracted, so neither a low temperature
 * nor large logits overflow; weights are summed in double.
 */
#include "ops/ops.h"

#include <math.h>
#include <stdlib.h>

/* A candidate token: its logit (then its weight) and its id. */
typedef struct {
    float value;
    int index;
} candidate;

/* Largest logit first; equal logits by id, so the order is total. */
static int by_logit_desc(const void *pa, const void *pb) {
    const candidate *a = pa, *b = pb;
    if (a->value != b->value) return a->value < b->value ? 1 : -1;
    return (a->index > b->index) - (a->index < b->index);
}

uint32_t gpc_sample_select(const float *logits, int V, float temperature, int top_k, float top_p,
                           double uniform, void *scratch) {
    if (temperature <= 0.0f) {
        int best = 0;
        for (int v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v;
        return (uint32_t)best;
    }
    int k = (top_k <= 0 || top_k > V) ? V : top_k;
    candidate *c = scratch;
    int n = 0;
    if (k == V) {
        for (int v = 0; v < V; v++)
            c[v].value = logits[v], c[v].index = v;
        n = V;
        /* top-p needs them in order; top-k alone does not */
        if (top_p < 1.0f) qsort(c, (size_t)n, sizeof *c, by_logit_desc);
    } else {
        /* keep the k largest, sorted descending, by insertion: O(V k) with
         * k small is faster than sorting V; a logit equal to the last kept
         * one goes after it, so equal logits stay in id order */
        for (int v = 0; v < V; v++) {
            float x = logits[v];
            if (n == k && x <= c[n - 1].value) continue;
            int at = n < k ? n++ : k - 1;
            while (at > 0 && c[at - 1].value < x) {
                c[at] = c[at - 1];
                at--;
            }
            c[at].value = x;
            c[at].index = v;
        }
    }
    float max = c[0].value;
    for (int i = 1; i < n; i++)
        if (c[i].value > max) max = c[i].value;
    /* each candidate's weight exp((x - max) / T), in (0, 1], computed once
     * in place and summed in double; top-p and the draw read the weights */
    const float inv_t = 1.0f / temperature;
    double total = 0;
    for (int i = 0; i < n; i++) {
        c[i].value = expf((c[i].value - max) * inv_t);
        total += c[i].value;
    }
    if (top_p < 1.0f) {
        /* the smallest prefix whose probability reaches top_p (the token
         * that crosses it included; at least one) */
        double want = (double)top_p * total, kept = 0;
        int m = 0;
        while (m < n && (m == 0 || kept < want))
            kept += c[m++].value;
        n = m;
        total = kept;
    }
    double r = uniform * total, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += c[i].value;
        if (r < acc) return (uint32_t)c[i].index;
    }
    return (uint32_t)c[n - 1].index; /* rounding left r at the very top */
}
