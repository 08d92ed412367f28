/*
 * paged.c: the serving ops on the CPU: embedding at given positions, storing
 * keys and values in the paged cache, and attention that reads the cache
 * through block tables (ops.h, "serving").
 *
 * Every index that comes from the caller (token ids, positions, slots, block
 * numbers) is checked before it is used: a serving engine with a bug in its
 * block bookkeeping gets an error naming the row, not a read out of bounds.
 *
 * Attention runs one (row, head) pair per iteration, in a fixed order of
 * positions: two-pass softmax (scores, then max and exponentials) in f32, the
 * same bits whatever the thread count and whatever other rows share the
 * step, which is what makes a sequence's output independent of its batch.
 */
#include "cpu/cpu.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>

gpc_status gpc_cpu_embedding_at(gpc_tensor *out, const gpc_tensor *tokens,
                                const gpc_tensor *positions, const gpc_tensor *wte,
                                const gpc_tensor *wpe) {
    const char *op = "embedding_at";
    GPC_TRY(gpc_cpu_need_f32(op, "out", out));
    GPC_TRY(gpc_cpu_need_f32(op, "wte", wte));
    GPC_TRY(gpc_cpu_need_f32(op, "wpe", wpe));
    int64_t C = gpc_cpu_last_dim(wte), N = gpc_tensor_numel(tokens);
    int64_t V = gpc_cpu_rows(wte), maxT = gpc_cpu_rows(wpe);
    const int32_t *tok = tokens->data, *pos = positions->data;
    for (int64_t i = 0; i < N; i++) {
        if (tok[i] < 0 || tok[i] >= V)
            return gpc_error(GPC_ERR_INVALID_ARG, "%s: token %d of row %lld is outside 0..%lld", op,
                             tok[i], (long long)i, (long long)V - 1);
        if (pos[i] < 0 || pos[i] >= maxT)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "%s: position %d of row %lld is outside the context 0..%lld", op,
                             pos[i], (long long)i, (long long)maxT - 1);
    }
    const float *te = wte->data, *pe = wpe->data;
    float *o = out->data;
#pragma omp parallel for schedule(static) if (N * C >= GPC_CPU_PARALLEL_MIN)
    for (int64_t i = 0; i < N; i++) {
        const float *a = te + (int64_t)tok[i] * C, *b = pe + (int64_t)pos[i] * C;
        float *r = o + i * C;
        for (int64_t c = 0; c < C; c++)
            r[c] = a[c] + b[c];
    }
    return GPC_OK;
}

gpc_status gpc_cpu_kv_store(gpc_tensor *k_cache, gpc_tensor *v_cache, const gpc_tensor *qkv,
                            const gpc_tensor *slots) {
    const char *op = "kv_store";
    GPC_TRY(gpc_cpu_need_f32(op, "qkv", qkv));
    int64_t N = qkv->shape[0], C = qkv->shape[1] / 3;
    int64_t rows = k_cache->shape[0] * k_cache->shape[1];
    const int32_t *slot = slots->data;
    for (int64_t i = 0; i < N; i++)
        if (slot[i] < 0 || slot[i] >= rows)
            return gpc_error(GPC_ERR_INVALID_ARG, "%s: slot %d of row %lld is outside 0..%lld", op,
                             slot[i], (long long)i, (long long)rows - 1);
    const float *x = qkv->data;
    float *k = k_cache->data, *v = v_cache->data;
    for (int64_t i = 0; i < N; i++)
        for (int64_t c = 0; c < C; c++) {
            k[(int64_t)slot[i] * C + c] = x[i * 3 * C + C + c];
            v[(int64_t)slot[i] * C + c] = x[i * 3 * C + 2 * C + c];
        }
    return GPC_OK;
}

gpc_status gpc_cpu_paged_attention(gpc_tensor *out, const gpc_tensor *qkv,
                                   const gpc_tensor *k_cache, const gpc_tensor *v_cache,
                                   const gpc_tensor *block_tables, const gpc_tensor *token_seq,
                                   const gpc_tensor *token_pos, int num_heads) {
    const char *op = "paged_attention";
    GPC_TRY(gpc_cpu_need_f32(op, "qkv", qkv));
    GPC_TRY(gpc_cpu_need_f32(op, "out", out));
    int64_t N = qkv->shape[0], C = qkv->shape[1] / 3, hs = C / num_heads;
    int64_t num_blocks = k_cache->shape[0], block_size = k_cache->shape[1];
    int64_t S = block_tables->shape[0], max_blocks = block_tables->shape[1];
    const int32_t *seq = token_seq->data, *pos = token_pos->data, *tables = block_tables->data;
    int64_t longest = 0;
    for (int64_t i = 0; i < N; i++) {
        if (seq[i] < 0 || seq[i] >= S)
            return gpc_error(GPC_ERR_INVALID_ARG, "%s: row %lld names sequence %d of %lld", op,
                             (long long)i, seq[i], (long long)S);
        if (pos[i] < 0 || pos[i] >= max_blocks * block_size)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "%s: row %lld is at position %d, past its block table's %lld", op,
                             (long long)i, pos[i], (long long)(max_blocks * block_size));
        const int32_t *table = tables + (int64_t)seq[i] * max_blocks;
        for (int64_t b = 0; b <= pos[i] / block_size; b++)
            if (table[b] < 0 || table[b] >= num_blocks)
                return gpc_error(GPC_ERR_INVALID_ARG,
                                 "%s: block %lld of sequence %d is %d, outside 0..%lld", op,
                                 (long long)b, seq[i], table[b], (long long)num_blocks - 1);
        if (pos[i] + 1 > longest) longest = pos[i] + 1;
    }
    int threads = omp_get_max_threads();
    float *scratch = malloc((size_t)threads * (size_t)(longest > 0 ? longest : 1) * sizeof(float));
    if (!scratch)
        return gpc_error(GPC_ERR_NOMEM, "%s: out of memory for %lld scores", op,
                         (long long)longest);
    const float *x = qkv->data, *k = k_cache->data, *v = v_cache->data;
    float *o = out->data;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(dynamic, 4) if (N * longest * C >= GPC_CPU_PARALLEL_MIN)
    for (int64_t ih = 0; ih < N * num_heads; ih++) {
        int64_t i = ih / num_heads, h = ih % num_heads, keys = pos[i] + 1;
        const int32_t *table = tables + (int64_t)seq[i] * max_blocks;
        const float *q = x + i * 3 * C + h * hs;
        float *s = scratch + (size_t)omp_get_thread_num() * (size_t)longest;
        /* block by block, so a position's cache row is an add, not a
         * division; the dot products as SIMD reductions (a fixed order for
         * a given build, whatever the batch) */
        float max = -INFINITY;
        for (int64_t p0 = 0; p0 < keys; p0 += block_size) {
            const float *kb = k + (int64_t)table[p0 / block_size] * block_size * C + h * hs;
            int64_t n = keys - p0 < block_size ? keys - p0 : block_size;
            for (int64_t r = 0; r < n; r++) {
                const float *kp = kb + r * C;
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int64_t d = 0; d < hs; d++)
                    dot += q[d] * kp[d];
                s[p0 + r] = dot * scale;
                max = s[p0 + r] > max ? s[p0 + r] : max;
            }
        }
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t p = 0; p < keys; p++) {
            s[p] = gpc_cpu_expf(s[p] - max);
            sum += s[p];
        }
        float inv = 1.0f / sum, *oh = o + i * C + h * hs;
        for (int64_t d = 0; d < hs; d++)
            oh[d] = 0.0f;
        for (int64_t p0 = 0; p0 < keys; p0 += block_size) {
            const float *vb = v + (int64_t)table[p0 / block_size] * block_size * C + h * hs;
            int64_t n = keys - p0 < block_size ? keys - p0 : block_size;
            for (int64_t r = 0; r < n; r++) {
                const float *vp = vb + r * C;
                float w = s[p0 + r] * inv;
#pragma omp simd
                for (int64_t d = 0; d < hs; d++)
                    oh[d] += w * vp[d];
            }
        }
    }
    free(scratch);
    return GPC_OK;
}
