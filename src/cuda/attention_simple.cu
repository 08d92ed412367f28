/*
 * attention_simple.cu: gpc's exact causal attention for what the
 * tensor-core path (attention_mma.cu) does not take: f32, or a head size
 * other than 64 (up to ATT_NAIVE_MAX_HS). One warp per row, with the same
 * online softmax and the same natural-log lse, so its forward and the other
 * paths' backward mix. Slow: it exists for tests and unusual shapes, not
 * for training. Generation's decoding rows (att_decode_kernel) run here
 * too, whatever the dtype. attention.cu chooses when this path runs.
 */
#include "cuda/attention_kernels.cuh"

#include <math.h>

/* One warp per row; lane l holds dimensions l, l+32, l+64, l+96. */
#define ATT_NAIVE_PER (ATT_NAIVE_MAX_HS / 32)

template <typename T>
__device__ __forceinline__ void att_row(float *dst, const T *src, int hs, int lane) {
#pragma unroll
    for (int i = 0; i < ATT_NAIVE_PER; i++) {
        int d = lane + 32 * i;
        dst[i] = d < hs ? gpc_to_f32(src[d]) : 0.0f;
    }
}

__device__ __forceinline__ float att_dot(const float *a, const float *b) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < ATT_NAIVE_PER; i++)
        s += a[i] * b[i];
    return gpc_warp_sum(s);
}

/* One key of a row's online softmax: running max m, sum l, output acc. */
__device__ __forceinline__ void att_online(const float *q, const float *k, const float *v,
                                           float *acc, float &m, float &l, float scale) {
    float s = att_dot(q, k) * scale, mn = fmaxf(m, s);
    float corr = expf(m - mn), p = expf(s - mn);
    l = l * corr + p;
    for (int i = 0; i < ATT_NAIVE_PER; i++)
        acc[i] = acc[i] * corr + p * v[i];
    m = mn;
}

template <typename T>
__global__ void att_naive_forward_kernel(T *out, float *lse, const T *qkv, int B, int T_, int NH,
                                         int hs, float scale) {
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= (int64_t)B * NH * T_) return;
    int t = (int)(w % T_), bh = (int)(w / T_), b = bh / NH, h = bh % NH, C = NH * hs;
    int64_t stride = 3 * (int64_t)C;
    const T *base = qkv + (int64_t)b * T_ * stride + h * hs;
    float q[ATT_NAIVE_PER], k[ATT_NAIVE_PER], v[ATT_NAIVE_PER], acc[ATT_NAIVE_PER] = {0};
    att_row(q, base + t * stride, hs, lane);
    float m = -INFINITY, l = 0.0f;
    for (int j = 0; j <= t; j++) {
        att_row(k, base + j * stride + C, hs, lane);
        att_row(v, base + j * stride + 2 * C, hs, lane);
        att_online(q, k, v, acc, m, l, scale);
    }
    T *o = out + ((int64_t)b * T_ + t) * C + h * hs;
    for (int i = 0; i < ATT_NAIVE_PER; i++)
        if (lane + 32 * i < hs) o[lane + 32 * i] = gpc_from_f32<T>(acc[i] / l);
    if (lane == 0) lse[(int64_t)bh * T_ + t] = m + logf(l);
}

/* Generation's rows (attention_decode): one block of ATT_DECODE_WARPS warps
 * a row, the row's keys dealt out to the warps in turn (key j to warp
 * j % ATT_DECODE_WARPS), each warp keeping its own online softmax as
 * att_naive_forward_kernel does; the warps' (max, sum, output) are then
 * merged in shared memory. A decoding step has few rows (B x NH), so one
 * warp a row would leave the GPU nearly idle while each walked the whole
 * kept sequence alone. */
#define ATT_DECODE_WARPS 8
template <typename T>
__global__ void __launch_bounds__(32 * ATT_DECODE_WARPS)
    att_decode_kernel(T *out, const T *qkv, int T_, int Tq, int NH, int hs, float scale) {
    __shared__ float part_m[ATT_DECODE_WARPS], part_l[ATT_DECODE_WARPS];
    __shared__ float part_o[ATT_DECODE_WARPS][ATT_NAIVE_MAX_HS];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int r = (int)(blockIdx.x % Tq), bh = (int)(blockIdx.x / Tq), b = bh / NH, h = bh % NH;
    int C = NH * hs, t = T_ - Tq + r;
    int64_t stride = 3 * (int64_t)C;
    const T *base = qkv + (int64_t)b * T_ * stride + h * hs;
    float q[ATT_NAIVE_PER], k[ATT_NAIVE_PER], v[ATT_NAIVE_PER], acc[ATT_NAIVE_PER] = {0};
    att_row(q, base + t * stride, hs, lane);
    float m = -INFINITY, l = 0.0f;
    for (int j = warp; j <= t; j += ATT_DECODE_WARPS) {
        att_row(k, base + j * stride + C, hs, lane);
        att_row(v, base + j * stride + 2 * C, hs, lane);
        att_online(q, k, v, acc, m, l, scale);
    }
    if (lane == 0) {
        part_m[warp] = m;
        part_l[warp] = l;
    }
    for (int i = 0; i < ATT_NAIVE_PER; i++)
        if (lane + 32 * i < hs) part_o[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    /* warp 0 holds key 0, so the merged max is finite; a warp with no keys
     * (t < warp) has m = -inf and weighs 0 */
    float mx = part_m[0];
    for (int w = 1; w < ATT_DECODE_WARPS; w++)
        mx = fmaxf(mx, part_m[w]);
    float total = 0.0f;
    for (int w = 0; w < ATT_DECODE_WARPS; w++)
        total += part_l[w] * expf(part_m[w] - mx);
    T *o = out + ((int64_t)b * Tq + r) * C + h * hs;
    for (int d = threadIdx.x; d < hs; d += blockDim.x) {
        float sum = 0.0f;
        for (int w = 0; w < ATT_DECODE_WARPS; w++)
            sum += part_o[w][d] * expf(part_m[w] - mx);
        o[d] = gpc_from_f32<T>(sum / total);
    }
}

template <typename T>
__global__ void att_naive_dq_kernel(T *dqkv, const T *qkv, const T *dout, const float *lse,
                                    const float *dsum, int B, int T_, int NH, int hs, float scale) {
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= (int64_t)B * NH * T_) return;
    int t = (int)(w % T_), bh = (int)(w / T_), b = bh / NH, h = bh % NH, C = NH * hs;
    int64_t stride = 3 * (int64_t)C;
    const T *base = qkv + (int64_t)b * T_ * stride + h * hs;
    float q[ATT_NAIVE_PER], k[ATT_NAIVE_PER], v[ATT_NAIVE_PER], dy[ATT_NAIVE_PER],
        dq[ATT_NAIVE_PER] = {0};
    att_row(q, base + t * stride, hs, lane);
    att_row(dy, dout + ((int64_t)b * T_ + t) * C + h * hs, hs, lane);
    float L = lse[(int64_t)bh * T_ + t], D = dsum[(int64_t)bh * T_ + t];
    for (int j = 0; j <= t; j++) {
        att_row(k, base + j * stride + C, hs, lane);
        att_row(v, base + j * stride + 2 * C, hs, lane);
        float p = expf(att_dot(q, k) * scale - L);
        float ds = p * (att_dot(dy, v) - D);
        for (int i = 0; i < ATT_NAIVE_PER; i++)
            dq[i] += ds * k[i];
    }
    T *o = dqkv + ((int64_t)b * T_ + t) * stride + h * hs;
    for (int i = 0; i < ATT_NAIVE_PER; i++)
        if (lane + 32 * i < hs) o[lane + 32 * i] = gpc_from_f32<T>(dq[i] * scale);
}

template <typename T>
__global__ void att_naive_dkdv_kernel(T *dqkv, const T *qkv, const T *dout, const float *lse,
                                      const float *dsum, int B, int T_, int NH, int hs,
                                      float scale) {
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= (int64_t)B * NH * T_) return;
    int j = (int)(w % T_), bh = (int)(w / T_), b = bh / NH, h = bh % NH, C = NH * hs;
    int64_t stride = 3 * (int64_t)C;
    const T *base = qkv + (int64_t)b * T_ * stride + h * hs;
    float q[ATT_NAIVE_PER], k[ATT_NAIVE_PER], v[ATT_NAIVE_PER], dy[ATT_NAIVE_PER],
        dk[ATT_NAIVE_PER] = {0}, dv[ATT_NAIVE_PER] = {0};
    att_row(k, base + j * stride + C, hs, lane);
    att_row(v, base + j * stride + 2 * C, hs, lane);
    for (int t = j; t < T_; t++) {
        att_row(q, base + t * stride, hs, lane);
        att_row(dy, dout + ((int64_t)b * T_ + t) * C + h * hs, hs, lane);
        float p = expf(att_dot(q, k) * scale - lse[(int64_t)bh * T_ + t]);
        float ds = p * (att_dot(dy, v) - dsum[(int64_t)bh * T_ + t]);
        for (int i = 0; i < ATT_NAIVE_PER; i++) {
            dv[i] += p * dy[i];
            dk[i] += ds * q[i];
        }
    }
    T *o = dqkv + ((int64_t)b * T_ + j) * stride + h * hs;
    for (int i = 0; i < ATT_NAIVE_PER; i++)
        if (lane + 32 * i < hs) {
            o[C + lane + 32 * i] = gpc_from_f32<T>(dk[i] * scale);
            o[2 * C + lane + 32 * i] = gpc_from_f32<T>(dv[i]);
        }
}

/* dsum[b,h,t] = dout[b,t,h,:] . out[b,t,h,:], one warp per row. */
template <typename T>
__global__ void att_dsum_kernel(float *dsum, const T *dout, const T *out, int B, int T_, int NH,
                                int hs) {
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= (int64_t)B * NH * T_) return;
    int t = (int)(w % T_), bh = (int)(w / T_), b = bh / NH, h = bh % NH, C = NH * hs;
    int64_t at = ((int64_t)b * T_ + t) * C + h * hs;
    float s = 0.0f;
    for (int d = lane; d < hs; d += 32)
        s += gpc_to_f32(dout[at + d]) * gpc_to_f32(out[at + d]);
    s = gpc_warp_sum(s);
    if (lane == 0) dsum[w] = s;
}

/* ------------------------------------------------------------- launchers */

gpc_status gpc_cuda_attention_simple_forward(gpc_tensor *out, gpc_tensor *lse,
                                             const gpc_tensor *qkv, const att_shape *s, float scale,
                                             cudaStream_t st) {
    int64_t rows = (int64_t)s->B * s->NH * s->T;
    GPC_CUDA_DISPATCH(out->dtype, E, {
        att_naive_forward_kernel<E><<<gpc_cuda_blocks(rows * 32, 128), 128, 0, st>>>(
            (E *)out->data, (float *)lse->data, (const E *)qkv->data, s->B, s->T, s->NH, s->hs,
            scale);
    });
    return GPC_OK;
}

gpc_status gpc_cuda_attention_simple_decode(gpc_tensor *out, const gpc_tensor *qkv,
                                            const att_shape *s, int Tq, float scale,
                                            cudaStream_t st) {
    int64_t rows = (int64_t)s->B * s->NH * Tq;
    GPC_CUDA_DISPATCH(out->dtype, E, {
        att_decode_kernel<E><<<(unsigned)rows, 32 * ATT_DECODE_WARPS, 0, st>>>(
            (E *)out->data, (const E *)qkv->data, s->T, Tq, s->NH, s->hs, scale);
    });
    return GPC_OK;
}

gpc_status gpc_cuda_attention_simple_dsum(float *dsum, const gpc_tensor *dout,
                                          const gpc_tensor *out, const att_shape *s,
                                          cudaStream_t st) {
    int64_t rows = (int64_t)s->B * s->NH * s->T;
    GPC_CUDA_DISPATCH(out->dtype, E, {
        att_dsum_kernel<E><<<gpc_cuda_blocks(rows * 32, 256), 256, 0, st>>>(
            dsum, (const E *)dout->data, (const E *)out->data, s->B, s->T, s->NH, s->hs);
    });
    return GPC_OK;
}

gpc_status gpc_cuda_attention_simple_backward(gpc_tensor *dqkv, const gpc_tensor *qkv,
                                              const gpc_tensor *dout, const gpc_tensor *lse,
                                              const float *dsum, const att_shape *s, float scale,
                                              cudaStream_t st) {
    int64_t rows = (int64_t)s->B * s->NH * s->T;
    GPC_CUDA_DISPATCH(dqkv->dtype, E, {
        unsigned grid = gpc_cuda_blocks(rows * 32, 128);
        att_naive_dq_kernel<E>
            <<<grid, 128, 0, st>>>((E *)dqkv->data, (const E *)qkv->data, (const E *)dout->data,
                                   (const float *)lse->data, dsum, s->B, s->T, s->NH, s->hs, scale);
        att_naive_dkdv_kernel<E>
            <<<grid, 128, 0, st>>>((E *)dqkv->data, (const E *)qkv->data, (const E *)dout->data,
                                   (const float *)lse->data, dsum, s->B, s->T, s->NH, s->hs, scale);
    });
    return GPC_OK;
}
