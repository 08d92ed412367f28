/*
 * attention.c: causal multi-head self-attention, forward and backward,
 * computed flash-style: no T x T matrix survives between the two passes.
 *
 * qkv [B,T,3C] holds q, k and v side by side; head h uses channels
 * h*hs .. (h+1)*hs of each third, hs = C/NH. For query row i of head (b,h):
 *   s_j = q_i . k_j / sqrt(hs) for j <= i (causal), lse_i = log sum_j e^{s_j},
 *   p_j = e^{s_j - lse_i}, out_i = sum_j p_j v_j.
 * Only lse [B,NH,T] is saved. The backward pass rebuilds p from the scores
 * and lse, then with D_i = dout_i . out_i (which equals sum_j p_j dp_j):
 *   dp_j = dout_i . v_j, ds_j = p_j (dp_j - D_i) / sqrt(hs),
 *   dq_i = sum_j ds_j k_j, dk_j += ds_j q_i, dv_j += p_j dout_i.
 * (Dao et al. 2022, FlashAttention, algorithm 4.)
 *
 * Shape of the computation: for each head, the queries go in blocks of
 * ATTENTION_QUERY_BLOCK rows; a block needs keys 0 .. its last row only, so
 * the causal mask skips almost half the work. Every product of a block is
 * one cblas_sgemm (scores Q K^T, output P V; in the backward dP = dO V^T,
 * dQ = dS K, dK += dS^T Q, dV += P^T dO), reading q, k, v in place through
 * the leading dimension 3C; only the softmax of a block's rows is our own
 * loop. Heads are spread over the OpenMP threads, each with its own scratch
 * of one or two [block, T] tiles and single-threaded GEMMs (cpu.h), so a
 * head's whole computation happens in one thread in a fixed order: the same
 * bits on every run, whatever the thread count, and no races on dk and dv.
 * dk and dv accumulate over the blocks of their head and are zeroed first:
 * dqkv as a whole is overwritten, as ops.h says.
 */
#include "cpu/cpu.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define ATTENTION_QUERY_BLOCK 128

typedef struct {
    int64_t B, T, C, NH, hs;
    float scale;
} attention_shape;

static gpc_status shape_of(const char *op, const gpc_tensor *qkv, int num_heads,
                           attention_shape *s) {
    s->B = qkv->shape[0];
    s->T = qkv->shape[1];
    s->C = qkv->shape[2] / 3;
    s->NH = num_heads;
    s->hs = s->C / num_heads;
    s->scale = 1.0f / sqrtf((float)s->hs);
    return gpc_cpu_need_blas_dim(op, 3 * s->C);
}

/* tiles [rows, T] tiles for each OpenMP thread, rows the query rows of a
 * block (ATTENTION_QUERY_BLOCK, or fewer when fewer are asked for: a
 * generation step's one row needs a small scratch, not a fresh mapping);
 * *per_thread gets their size. */
static gpc_status scratch_alloc(const char *op, int64_t rows, int64_t T, int tiles, float **out,
                                size_t *per_thread) {
    if (rows > ATTENTION_QUERY_BLOCK) rows = ATTENTION_QUERY_BLOCK;
    *per_thread = (size_t)tiles * (size_t)(rows > 0 ? rows : 1) * (size_t)(T > 0 ? T : 1);
    size_t floats = *per_thread * (size_t)omp_get_max_threads();
    gpc_cpu_blas_init();
    *out = malloc(floats * sizeof(float));
    if (!*out)
        return gpc_error(GPC_ERR_NOMEM,
                         "%s: out of memory for %.1f MiB of attention scratch; use a shorter "
                         "context",
                         op, (double)floats * sizeof(float) / (1 << 20));
    return GPC_OK;
}

/* Row r of a block (query i = i0 + r) holds scaled scores for keys 0..keys-1.
 * Writes p_j for j <= i and zeros after; returns lse_i. */
static float softmax_row(float *s, int64_t i, int64_t keys) {
    float max = s[0];
#pragma omp simd reduction(max : max)
    for (int64_t j = 0; j <= i; j++)
        max = s[j] > max ? s[j] : max;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j <= i; j++) {
        float e = gpc_cpu_expf(s[j] - max);
        s[j] = e;
        sum += e;
    }
    float inv = 1.0f / sum;
    for (int64_t j = 0; j <= i; j++)
        s[j] *= inv;
    for (int64_t j = i + 1; j < keys; j++)
        s[j] = 0.0f;
    return max + logf(sum);
}

/* Rows Tk-Tq .. Tk-1 of causal attention over qkv [B,Tk,3C] into out
 * [B,Tq,C]; lse [B,NH,Tq] too when not NULL. Tq = Tk is the whole forward. */
static gpc_status forward_rows(const char *op, gpc_tensor *out, gpc_tensor *lse,
                               const gpc_tensor *qkv, int num_heads) {
    GPC_TRY(gpc_cpu_need_f32(op, "out", out));
    GPC_TRY(gpc_cpu_need_f32(op, "qkv", qkv));
    attention_shape sh;
    GPC_TRY(shape_of(op, qkv, num_heads, &sh));
    int64_t T = sh.T, Tq = out->shape[1], q0 = T - Tq, C = sh.C, hs = sh.hs, NH = sh.NH, C3 = 3 * C;
    float *scratch;
    size_t per_thread;
    GPC_TRY(scratch_alloc(op, Tq, T, 1, &scratch, &per_thread));
    const float *x = qkv->data;
    float *o = out->data, *l = lse ? lse->data : NULL;
#pragma omp parallel for schedule(static) if (sh.B * Tq * T * C >= GPC_CPU_PARALLEL_MIN)
    for (int64_t bh = 0; bh < sh.B * NH; bh++) {
        int64_t b = bh / NH, h = bh % NH;
        float *S = scratch + (size_t)omp_get_thread_num() * per_thread;
        const float *q = x + b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
        float *oh = o + b * Tq * C + h * hs;
        /* query blocks of absolute rows i0 .. i0+rows-1, from q0 */
        for (int64_t i0 = q0; i0 < T; i0 += ATTENTION_QUERY_BLOCK) {
            int64_t rows = T - i0 < ATTENTION_QUERY_BLOCK ? T - i0 : ATTENTION_QUERY_BLOCK;
            int64_t keys = i0 + rows;
            gpc_cpu_sgemm1(0, 1, rows, keys, hs, sh.scale, q + i0 * C3, C3, k, C3, 0.0f, S, keys);
            for (int64_t r = 0; r < rows; r++) {
                float lse_r = softmax_row(S + r * keys, i0 + r, keys);
                if (l) l[bh * Tq + i0 - q0 + r] = lse_r;
            }
            gpc_cpu_sgemm1(0, 0, rows, hs, keys, 1.0f, S, keys, v, C3, 0.0f, oh + (i0 - q0) * C, C);
        }
    }
    free(scratch);
    return GPC_OK;
}

gpc_status gpc_cpu_attention_forward(gpc_tensor *out, gpc_tensor *lse, const gpc_tensor *qkv,
                                     int num_heads) {
    return forward_rows("attention_forward", out, lse, qkv, num_heads);
}

gpc_status gpc_cpu_attention_decode(gpc_tensor *out, const gpc_tensor *qkv, int num_heads) {
    return forward_rows("attention_decode", out, NULL, qkv, num_heads);
}

gpc_status gpc_cpu_attention_backward(gpc_tensor *dqkv, const gpc_tensor *dout,
                                      const gpc_tensor *qkv, const gpc_tensor *out,
                                      const gpc_tensor *lse, int num_heads) {
    const char *op = "attention_backward";
    GPC_TRY(gpc_cpu_need_f32(op, "dqkv", dqkv));
    GPC_TRY(gpc_cpu_need_f32(op, "dout", dout));
    GPC_TRY(gpc_cpu_need_f32(op, "qkv", qkv));
    GPC_TRY(gpc_cpu_need_f32(op, "out", out));
    attention_shape sh;
    GPC_TRY(shape_of(op, qkv, num_heads, &sh));
    int64_t T = sh.T, C = sh.C, hs = sh.hs, NH = sh.NH, C3 = 3 * C;
    float *scratch;
    size_t per_thread;
    GPC_TRY(scratch_alloc(op, T, T, 2, &scratch, &per_thread));
    const float *x = qkv->data, *dy = dout->data, *y = out->data, *l = lse->data;
    float *dx = dqkv->data;
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < sh.B * NH; bh++) {
        int64_t b = bh / NH, h = bh % NH;
        float *P = scratch + (size_t)omp_get_thread_num() * per_thread;
        float *dS = P + per_thread / 2;
        const float *q = x + b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
        const float *dyh = dy + b * T * C + h * hs, *yh = y + b * T * C + h * hs;
        const float *lh = l + bh * T;
        float *dq = dx + b * T * C3 + h * hs, *dk = dq + C, *dv = dq + 2 * C;
        for (int64_t t = 0; t < T; t++) {
            memset(dk + t * C3, 0, (size_t)hs * sizeof(float));
            memset(dv + t * C3, 0, (size_t)hs * sizeof(float));
        }
        for (int64_t i0 = 0; i0 < T; i0 += ATTENTION_QUERY_BLOCK) {
            int64_t rows = T - i0 < ATTENTION_QUERY_BLOCK ? T - i0 : ATTENTION_QUERY_BLOCK;
            int64_t keys = i0 + rows;
            /* scores again, and dP = dO V^T */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)keys, (int)hs,
                        sh.scale, q + i0 * C3, (int)C3, k, (int)C3, 0.0f, P, (int)keys);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)keys, (int)hs,
                        1.0f, dyh + i0 * C, (int)C, v, (int)C3, 0.0f, dS, (int)keys);
            for (int64_t r = 0; r < rows; r++) {
                int64_t i = i0 + r;
                float *p = P + r * keys, *ds = dS + r * keys, lse_i = lh[i];
                const float *dyi = dyh + i * C, *yi = yh + i * C;
                float D = 0.0f;
                for (int64_t d = 0; d < hs; d++)
                    D += dyi[d] * yi[d];
#pragma omp simd
                for (int64_t j = 0; j <= i; j++) {
                    float pj = gpc_cpu_expf(p[j] - lse_i);
                    p[j] = pj;
                    ds[j] = pj * (ds[j] - D) * sh.scale;
                }
                for (int64_t j = i + 1; j < keys; j++)
                    p[j] = ds[j] = 0.0f;
            }
            /* dQ (overwritten), dK and dV (accumulated over the blocks) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)hs, (int)keys,
                        1.0f, dS, (int)keys, k, (int)C3, 0.0f, dq + i0 * C3, (int)C3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)keys, (int)hs, (int)rows,
                        1.0f, dS, (int)keys, q + i0 * C3, (int)C3, 1.0f, dk, (int)C3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)keys, (int)hs, (int)rows,
                        1.0f, P, (int)keys, dyh + i0 * C, (int)C, 1.0f, dv, (int)C3);
        }
    }
    free(scratch);
    return GPC_OK;
}

/* The CPU's attention has nothing to build ahead: its scratch is taken per
 * call and it has one implementation. */
gpc_status gpc_cpu_attention_prepare(const gpc_tensor *qkv, int num_heads, int backward) {
    (void)qkv;
    (void)num_heads;
    (void)backward;
    return GPC_OK;
}
