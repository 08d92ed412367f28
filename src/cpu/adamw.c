/*
 * adamw.c: one AdamW step (Loshchilov & Hutter 2019) over a flat buffer.
 *
 *   g = grad * grad_scale * clip
 *   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 *   mhat = m / (1 - b1^t);  vhat = v / (1 - b2^t)
 *   p -= lr (mhat / (sqrt(vhat) + eps) + wd p)
 *
 * clip = min(1, max_grad_norm / sqrt(grad_norm_sq)) when the caller passes
 * the global squared norm (gpc_op_sum_squares over every gradient) and a
 * positive max_grad_norm: clipping by global norm, as GPT-2 training does.
 * A NaN norm leaves clip at 1 (the NaN then shows in the loss); detecting
 * divergence is the trainer's job, not the kernel's.
 * grad_scale undoes a loss scale (fp16), and skip_nonfinite skips the whole
 * step on a non-finite norm (fp16 overflow). Weight decay is decoupled: it acts
 * on the weights, not through the gradient's moments.
 *
 * With master != NULL the f32 master copy is what is updated and params
 * (bf16/f16) receive it rounded to nearest even, as on the GPU. Each
 * element is independent: a parallel loop. bf16 gradients and weights,
 * what an offloaded GPU run updates here, take a loop of their own with
 * the conversions inline (those of src/core/dtype.c, so the bits are the
 * same), which the compiler can vectorise.
 */
#include "cpu/cpu.h"

#include <math.h>
#include <string.h>

/* gpc_bf16_to_f32 and gpc_f32_to_bf16 (src/core/dtype.c), inline. */
static inline float bf16_load(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

/* The step's constants: betas, learning rate, epsilon, weight decay and the
 * bias corrections c1 = 1 - b1^t, c2 = 1 - b2^t. */
typedef struct {
    float b1, b2, lr, eps, wd, c1, c2;
} adamw_constants;

/* One element's update: g already scaled, moments updated in place, the new
 * weight returned. Inline so both loops below still vectorise. */
static inline float adamw_element(float g, float *m, float *v, float w, const adamw_constants *k) {
    float mi = k->b1 * *m + (1.0f - k->b1) * g;
    float vi = k->b2 * *v + (1.0f - k->b2) * g * g;
    *m = mi;
    *v = vi;
    float mhat = mi / k->c1, vhat = vi / k->c2;
    return w - k->lr * (mhat / (sqrtf(vhat) + k->eps) + k->wd * w);
}

gpc_status gpc_cpu_adamw(gpc_tensor *params, gpc_tensor *master, const gpc_tensor *grads,
                         gpc_tensor *m, gpc_tensor *v, const gpc_adamw_args *args) {
    int64_t n = gpc_tensor_numel(params);
    if (args->skip_nonfinite && !isfinite(((const float *)args->grad_norm_sq->data)[0]))
        return GPC_OK; /* fp16 overflow: the step is skipped */
    float clip = 1.0f;
    if (args->grad_norm_sq && args->grad_norm_sq->data && args->max_grad_norm > 0.0f) {
        float norm = sqrtf(((const float *)args->grad_norm_sq->data)[0]);
        if (norm > args->max_grad_norm) clip = args->max_grad_norm / norm;
    }
    float gscale = args->grad_scale * clip;
    adamw_constants k = {.b1 = args->beta1,
                         .b2 = args->beta2,
                         .lr = args->learning_rate,
                         .eps = args->eps,
                         .wd = args->weight_decay,
                         .c1 = (float)(1.0 - pow((double)args->beta1, args->step)),
                         .c2 = (float)(1.0 - pow((double)args->beta2, args->step))};
    float *pm = m->data, *pv = v->data;
    gpc_tensor *weights = master && master->data ? master : params;
    float *w = weights->data; /* f32: ops.c requires a master for low-precision params */
    const float *gf = grads->dtype == GPC_F32 ? grads->data : NULL;
    int write_params = weights != params;
    if (write_params && params->dtype == GPC_BF16 && grads->dtype == GPC_BF16) {
        const uint16_t *gb = grads->data;
        uint16_t *pb = params->data;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float g = bf16_load(gb[i]) * gscale;
            float wi = adamw_element(g, &pm[i], &pv[i], w[i], &k);
            w[i] = wi;
            pb[i] = bf16_round(wi);
        }
        return GPC_OK;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float g = (gf ? gf[i] : gpc_cpu_load(grads, i)) * gscale;
        float wi = adamw_element(g, &pm[i], &pv[i], w[i], &k);
        w[i] = wi;
        if (write_params) gpc_cpu_store(params, i, wi);
    }
    return GPC_OK;
}
