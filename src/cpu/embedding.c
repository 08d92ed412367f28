/*
 * embedding.c: token plus position embedding, forward and backward.
 *
 * Forward: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:], one row per thread
 * iteration. Backward: dwte[v,:] += sum of dout rows whose token is v and
 * dwpe[t,:] += sum over b of dout[b,t,:]. The backward scatter is where a
 * naive parallel loop over tokens would race (two tokens of the same id) or
 * depend on thread timing. So dwte is parallelised over blocks of channels:
 * each thread owns a slice of columns of every row and walks the tokens in
 * their natural order, which makes the result race-free and bitwise the same
 * on every run whatever the thread count. dwpe is parallelised over positions,
 * each summing its batch entries in order.
 *
 * The slice variants serve tensor parallelism's vocabulary-parallel
 * embedding: wte holds rows row0.. of the whole table, and a token outside
 * them reads zero and gets no gradient here (another rank's slice has it).
 */
#include "cpu/cpu.h"

#include <string.h>

/* Columns per task in the backward scatter: 64 floats is one cache line x4,
 * enough work per token to vectorise, small enough to spread over threads. */
#define EMBEDDING_CHANNEL_BLOCK 64

static gpc_status check_tokens(const char *op, const int32_t *tokens, int64_t n, int64_t vocab) {
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "%s: token %d at position %lld is outside 0..%lld: the data does "
                             "not match this model's vocabulary",
                             op, tokens[i], (long long)i, (long long)vocab - 1);
    return GPC_OK;
}

/* out rows for tokens in [row0, row0 + V): wte's row token - row0, plus the
 * position's wpe row when wpe is given; other tokens give zero (a slice of
 * the vocabulary, gpc_op_embedding_slice_forward). */
static gpc_status forward(const char *op, gpc_tensor *out, const gpc_tensor *tokens,
                          const gpc_tensor *wte, const gpc_tensor *wpe, int64_t row0) {
    GPC_TRY(gpc_cpu_need_f32(op, "out", out));
    GPC_TRY(gpc_cpu_need_f32(op, "wte", wte));
    GPC_TRY(gpc_cpu_need_f32(op, "wpe", wpe));
    int64_t C = gpc_cpu_last_dim(wte), T = gpc_cpu_last_dim(tokens);
    int64_t N = gpc_tensor_numel(tokens), V = gpc_cpu_rows(wte);
    const int32_t *tok = tokens->data;
    float *o = out->data;
    const float *te = wte->data, *pe = wpe ? wpe->data : NULL;
#pragma omp parallel for schedule(static) if (N * C >= GPC_CPU_PARALLEL_MIN)
    for (int64_t n = 0; n < N; n++) {
        float *row = o + n * C;
        int64_t v = (int64_t)tok[n] - row0;
        const float *trow = v >= 0 && v < V ? te + v * C : NULL;
        const float *prow = pe ? pe + (n % T) * C : NULL;
        if (trow && prow)
            for (int64_t c = 0; c < C; c++)
                row[c] = trow[c] + prow[c];
        else if (trow || prow)
            memcpy(row, trow ? trow : prow, (size_t)C * sizeof(float));
        else
            memset(row, 0, (size_t)C * sizeof(float));
    }
    return GPC_OK;
}

gpc_status gpc_cpu_embedding_forward(gpc_tensor *out, const gpc_tensor *tokens,
                                     const gpc_tensor *wte, const gpc_tensor *wpe) {
    GPC_TRY(check_tokens("embedding_forward", tokens->data, gpc_tensor_numel(tokens),
                         gpc_cpu_rows(wte)));
    return forward("embedding_forward", out, tokens, wte, wpe, 0);
}

gpc_status gpc_cpu_embedding_slice_forward(gpc_tensor *out, const gpc_tensor *tokens,
                                           const gpc_tensor *wte, const gpc_tensor *wpe,
                                           int64_t row0) {
    return forward("embedding_slice_forward", out, tokens, wte, wpe, row0);
}

/* dwte rows of the tokens in [row0, row0 + V) and every dwpe row. */
static gpc_status backward(const char *op, gpc_tensor *dwte, gpc_tensor *dwpe,
                           const gpc_tensor *dout, const gpc_tensor *tokens, int64_t row0) {
    GPC_TRY(gpc_cpu_need_f32(op, "dwte", dwte));
    GPC_TRY(gpc_cpu_need_f32(op, "dwpe", dwpe));
    GPC_TRY(gpc_cpu_need_f32(op, "dout", dout));
    int64_t C = gpc_cpu_last_dim(dwte), T = gpc_cpu_last_dim(tokens);
    int64_t N = gpc_tensor_numel(tokens), V = gpc_cpu_rows(dwte), B = N / T;
    const int32_t *tok = tokens->data;
    float *dte = dwte->data, *dpe = dwpe->data;
    const float *d = dout->data;
    int64_t blocks = (C + EMBEDDING_CHANNEL_BLOCK - 1) / EMBEDDING_CHANNEL_BLOCK;
#pragma omp parallel
    {
#pragma omp for schedule(static) nowait
        for (int64_t blk = 0; blk < blocks; blk++) {
            int64_t c0 = blk * EMBEDDING_CHANNEL_BLOCK;
            int64_t c1 = c0 + EMBEDDING_CHANNEL_BLOCK < C ? c0 + EMBEDDING_CHANNEL_BLOCK : C;
            for (int64_t n = 0; n < N; n++) {
                int64_t v = (int64_t)tok[n] - row0;
                if (v < 0 || v >= V) continue; /* another slice's token */
                float *dst = dte + v * C;
                const float *src = d + n * C;
                for (int64_t c = c0; c < c1; c++)
                    dst[c] += src[c];
            }
        }
        /* dwpe rows are disjoint from dwte, so no barrier is needed between the loops. */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++) {
            float *dst = dpe + t * C;
            for (int64_t b = 0; b < B; b++) {
                const float *src = d + (b * T + t) * C;
                for (int64_t c = 0; c < C; c++)
                    dst[c] += src[c];
            }
        }
    }
    return GPC_OK;
}

gpc_status gpc_cpu_embedding_backward(gpc_tensor *dwte, gpc_tensor *dwpe, const gpc_tensor *dout,
                                      const gpc_tensor *tokens) {
    GPC_TRY(check_tokens("embedding_backward", tokens->data, gpc_tensor_numel(tokens),
                         gpc_cpu_rows(dwte)));
    return backward("embedding_backward", dwte, dwpe, dout, tokens, 0);
}

gpc_status gpc_cpu_embedding_slice_backward(gpc_tensor *dwte, gpc_tensor *dwpe,
                                            const gpc_tensor *dout, const gpc_tensor *tokens,
                                            int64_t row0) {
    return backward("embedding_slice_backward", dwte, dwpe, dout, tokens, row0);
}
