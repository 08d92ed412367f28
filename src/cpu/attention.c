/*
 * attention.c: causal multi-head self-attention, forward and backward,
 * computed flash-style: no T x T matrix survives between the two passes.
 *
 * qkv [B,T,3C] holds q, k and v side by side; head h uses channels
 * h*hs .. (h+1)*hs of each third, hs = C/NH. For query row i of head (b,h):
 *   s_j = q_i . k_j / sqrt(hs) for j <= i (causal), lse_i = log sum_j e^{s_j},
 *   p_j = e^{s_j - lse_i}, out_i = sum_j p_j v_j.
 * Only lse [B,NH,T] is saved. The backward pass rebuilds p_j from s_j and
 * lse_i, then with dout_i and D_i = dout_i . out_i (= sum_j p_j dp_j):
 *   dp_j = dout_i . v_j, ds_j = p_j (dp_j - D_i),
 *   dq_i = sum_j ds_j k_j / sqrt(hs), dk_j += ds_j q_i / sqrt(hs), dv_j += p_j dout_i.
 * (Dao et al. 2022, FlashAttention, algorithm 4, without the tiling a GPU
 * needs for its shared memory.)
 *
 * Shape of the loops: one (b,h) pair per OpenMP task, so each thread owns the
 * dk and dv rows of its head and accumulates them in a fixed order: no races,
 * the same bits on every run. Per thread, K (and V in the backward) are first
 * transposed into scratch [hs, T], so the scores of a row are hs passes of a
 * contiguous axpy over j, which the compiler vectorises without having to
 * reorder a floating-point reduction. Scratch is one row of scores plus the
 * transposed head, allocated once per call (O(threads * hs * T) floats).
 */
#include "cpu/cpu.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t B, T, C, NH, hs;
    float scale;
} attention_shape;

static attention_shape shape_of(const gpc_tensor *qkv, int num_heads) {
    attention_shape s;
    s.B = qkv->shape[0];
    s.T = qkv->shape[1];
    s.C = qkv->shape[2] / 3;
    s.NH = num_heads;
    s.hs = s.C / num_heads;
    s.scale = 1.0f / sqrtf((float)s.hs);
    return s;
}

static gpc_status scratch_alloc(const char *op, size_t per_thread, float **out) {
    size_t threads = (size_t)omp_get_max_threads();
    *out = malloc(threads * per_thread * sizeof(float) + 1);
    if (!*out)
        return gpc_error(GPC_ERR_NOMEM,
                         "%s: out of memory for %zu threads of attention scratch; use a shorter "
                         "context",
                         op, threads);
    return GPC_OK;
}

/* kt[d*T + j] = k_j[d] for j < n: the head's keys (or values), transposed. */
static void transpose_head(float *kt, const float *base, int64_t stride, int64_t n, int64_t T,
                           int64_t hs) {
    for (int64_t j = 0; j < n; j++)
        for (int64_t d = 0; d < hs; d++)
            kt[d * T + j] = base[j * stride + d];
}

/* s[j] = scale * q . k_j for j <= i, with kt the transposed keys. */
static void scores_row(float *s, const float *q, const float *kt, int64_t i, int64_t T, int64_t hs,
                       float scale) {
    for (int64_t j = 0; j <= i; j++)
        s[j] = 0.0f;
    for (int64_t d = 0; d < hs; d++) {
        float qd = q[d] * scale;
        const float *krow = kt + d * T;
        for (int64_t j = 0; j <= i; j++)
            s[j] += qd * krow[j];
    }
}

gpc_status gpc_cpu_attention_forward(gpc_tensor *out, gpc_tensor *lse, const gpc_tensor *qkv,
                                     int num_heads) {
    const char *op = "attention_forward";
    GPC_TRY(gpc_cpu_need_f32(op, "out", out));
    GPC_TRY(gpc_cpu_need_f32(op, "qkv", qkv));
    attention_shape sh = shape_of(qkv, num_heads);
    int64_t T = sh.T, C = sh.C, hs = sh.hs, NH = sh.NH, C3 = 3 * C;
    size_t per_thread = (size_t)(hs * T + T);
    float *scratch;
    GPC_TRY(scratch_alloc(op, per_thread, &scratch));
    const float *x = qkv->data;
    float *o = out->data, *l = lse->data;
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < sh.B * NH; bh++) {
        int64_t b = bh / NH, h = bh % NH;
        float *kt = scratch + (size_t)omp_get_thread_num() * per_thread, *s = kt + hs * T;
        const float *q = x + b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
        transpose_head(kt, k, C3, T, T, hs);
        for (int64_t i = 0; i < T; i++) {
            scores_row(s, q + i * C3, kt, i, T, hs, sh.scale);
            float max = s[0];
            for (int64_t j = 1; j <= i; j++)
                max = s[j] > max ? s[j] : max;
            float sum = 0.0f;
            for (int64_t j = 0; j <= i; j++) {
                s[j] = expf(s[j] - max);
                sum += s[j];
            }
            float inv = 1.0f / sum;
            l[bh * T + i] = max + logf(sum);
            float *orow = o + (b * T + i) * C + h * hs;
            for (int64_t d = 0; d < hs; d++)
                orow[d] = 0.0f;
            for (int64_t j = 0; j <= i; j++) {
                float p = s[j] * inv;
                const float *vrow = v + j * C3;
                for (int64_t d = 0; d < hs; d++)
                    orow[d] += p * vrow[d];
            }
        }
    }
    free(scratch);
    return GPC_OK;
}

gpc_status gpc_cpu_attention_backward(gpc_tensor *dqkv, const gpc_tensor *dout,
                                      const gpc_tensor *qkv, const gpc_tensor *out,
                                      const gpc_tensor *lse, int num_heads) {
    const char *op = "attention_backward";
    GPC_TRY(gpc_cpu_need_f32(op, "dqkv", dqkv));
    GPC_TRY(gpc_cpu_need_f32(op, "dout", dout));
    GPC_TRY(gpc_cpu_need_f32(op, "qkv", qkv));
    GPC_TRY(gpc_cpu_need_f32(op, "out", out));
    attention_shape sh = shape_of(qkv, num_heads);
    int64_t T = sh.T, C = sh.C, hs = sh.hs, NH = sh.NH, C3 = 3 * C;
    size_t per_thread = (size_t)(2 * hs * T + 2 * T + hs);
    float *scratch;
    GPC_TRY(scratch_alloc(op, per_thread, &scratch));
    const float *x = qkv->data, *dy = dout->data, *y = out->data, *l = lse->data;
    float *dx = dqkv->data;
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < sh.B * NH; bh++) {
        int64_t b = bh / NH, h = bh % NH;
        float *kt = scratch + (size_t)omp_get_thread_num() * per_thread;
        float *vt = kt + hs * T, *p = vt + hs * T, *dp = p + T, *dq = dp + T;
        const float *q = x + b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
        float *dqh = dx + b * T * C3 + h * hs, *dkh = dqh + C, *dvh = dqh + 2 * C;
        transpose_head(kt, k, C3, T, T, hs);
        transpose_head(vt, v, C3, T, T, hs);
        for (int64_t t = 0; t < T; t++) {
            memset(dkh + t * C3, 0, (size_t)hs * sizeof(float));
            memset(dvh + t * C3, 0, (size_t)hs * sizeof(float));
        }
        for (int64_t i = 0; i < T; i++) {
            const float *qi = q + i * C3;
            const float *dyi = dy + (b * T + i) * C + h * hs, *yi = y + (b * T + i) * C + h * hs;
            float lse_i = l[bh * T + i];
            scores_row(p, qi, kt, i, T, hs, sh.scale);
            for (int64_t j = 0; j <= i; j++)
                p[j] = expf(p[j] - lse_i);
            /* dp_j = dout_i . v_j, as hs contiguous axpys like the scores */
            for (int64_t j = 0; j <= i; j++)
                dp[j] = 0.0f;
            for (int64_t d = 0; d < hs; d++) {
                float g = dyi[d];
                const float *vrow = vt + d * T;
                for (int64_t j = 0; j <= i; j++)
                    dp[j] += g * vrow[j];
            }
            float D = 0.0f;
            for (int64_t d = 0; d < hs; d++)
                D += dyi[d] * yi[d];
            for (int64_t d = 0; d < hs; d++)
                dq[d] = 0.0f;
            for (int64_t j = 0; j <= i; j++) {
                float ds = p[j] * (dp[j] - D) * sh.scale;
                const float *kj = k + j * C3;
                float *dkj = dkh + j * C3, *dvj = dvh + j * C3;
                float pj = p[j];
                for (int64_t d = 0; d < hs; d++) {
                    dq[d] += ds * kj[d];
                    dkj[d] += ds * qi[d];
                    dvj[d] += pj * dyi[d];
                }
            }
            memcpy(dqh + i * C3, dq, (size_t)hs * sizeof(float));
        }
    }
    free(scratch);
    return GPC_OK;
}
