/*
 * gpt.c: the GPT-2 model: memory plan, initialisation, forward, backward and
 * the step through the model's optimizer (optim.c), written only against
 * ops.h so every backend runs it.
 *
 * The structure follows llm.c (train_gpt2.cu): one flat parameter buffer and
 * one flat gradient buffer, activations kept per layer for the backward pass,
 * the residual add fused with the next layernorm, and the training step's
 * output head (the logits, the cross-entropy and its gradient, and the head's
 * two backward products) one op, gpc_op_classifier, which a backend may fuse
 * so that the logits' gradient is never stored. Backward shares one dresidual
 * buffer: ops.h's layernorm backward ADDS into its dinp, so the gradient of
 * the residual stream flows down the stack without a separate residual
 * backward. Parameter gradients accumulate (+=), which is what makes gradient
 * accumulation over micro-steps a matter of calling forward_backward again.
 */
#include "model/gpt_internal.h"
#include "gpc/settings.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

/* ------------------------------------------------------------ views */

/* A view of `numel_shape` elements starting `offset` elements into t. */
static gpc_tensor view(const gpc_tensor *t, size_t offset, int ndim, int64_t d0, int64_t d1,
                       int64_t d2) {
    int64_t shape[3] = {d0, d1, d2};
    char *base = t->data ? (char *)t->data + offset * gpc_dtype_size(t->dtype) : NULL;
    return gpc_tensor_make(base, t->dtype, t->device, ndim, shape);
}

/* Layer l of a per-layer activation planned as [L, Bplan*Tplan*X], from row
 * `start` on, seen as [B, T, X]: the current batch (start 0), or positions
 * start .. start+T-1 of a batch of one (generation over kept keys and
 * values). */
static gpc_tensor act_rows(const gpt_model *m, const gpc_tensor *t, int l, int start, int B, int T,
                           int64_t X) {
    size_t stride = (size_t)m->B * (size_t)m->T * (size_t)X;
    return view(t, (size_t)l * stride + (size_t)start * (size_t)X, 3, B, T, X);
}

static gpc_tensor act_layer(const gpt_model *m, const gpc_tensor *t, int l, int B, int T,
                            int64_t X) {
    return act_rows(m, t, l, 0, B, T, X);
}

/* Whether backward rebuilds layer l's activations of recomputation level
 * `level` (fch_gelu: 1; ln1, ln2: 2; the rest of the block: 3): the model's
 * level covers it and l is one of the first gpt_recompute_layers blocks. */
static int recomputed(const gpt_model *m, int l, int level) {
    return gpt_recompute_level(m->recompute) >= level &&
           l < gpt_recompute_layers(m->recompute, m->config.layers);
}

/* Slots of an activation of level `level`: one shared by the recomputed
 * layers, then one per kept layer (gpc plan counts the same). */
static int64_t kept_slots(const gpt_model *m, int level) {
    int L = m->config.layers;
    int n = gpt_recompute_level(m->recompute) >= level ? gpt_recompute_layers(m->recompute, L) : 0;
    return n ? L - n + 1 : L;
}

/* The slot of layer l in such an activation. */
static int kept_layer(const gpt_model *m, int l, int level) {
    if (recomputed(m, l, level)) return 0;
    int n = gpt_recompute_level(m->recompute) >= level
                ? gpt_recompute_layers(m->recompute, m->config.layers)
                : 0;
    return n ? l - n + 1 : l;
}

/* Per-layer statistics [L, Bplan*Tplan] from row `start`, seen as [B, T]. */
static gpc_tensor stat_rows(const gpt_model *m, const gpc_tensor *t, int l, int start, int B,
                            int T) {
    size_t stride = (size_t)m->B * (size_t)m->T;
    return view(t, (size_t)l * stride + (size_t)start, 2, B, T, 0);
}

static gpc_tensor stat_layer(const gpt_model *m, const gpc_tensor *t, int l, int B, int T) {
    return stat_rows(m, t, l, 0, B, T);
}

/* Layer l's log-sum-exp of attention [B, NH, T] (slot kept_layer(l, 3)),
 * over this tp rank's heads. */
static gpc_tensor lse_layer(const gpt_model *m, int l, int B, int T) {
    int64_t NH = m->config.heads / m->tp_size;
    size_t stride = (size_t)m->B * (size_t)NH * (size_t)m->T;
    return view(&m->acts.lse, (size_t)kept_layer(m, l, 3) * stride, 3, B, NH, T);
}

/* Layer l of a per-layer parameter [L, ...] seen as [rows, cols] (or [cols]
 * when rows is 0). */
static gpc_tensor param_layer(const gpc_tensor *t, int l, int64_t rows, int64_t cols) {
    size_t per_layer = (size_t)(rows ? rows : 1) * (size_t)cols;
    return rows ? view(t, (size_t)l * per_layer, 2, rows, cols, 0)
                : view(t, (size_t)l * per_layer, 1, cols, 0, 0);
}

/* ------------------------------------------------------------ LoRA */

static int lora_on(const gpt_model *m, int target) {
    return m->lora.options.rank && (m->lora.options.targets & (1u << target));
}

/* Fills in the defaults and the adapters' offsets in their flat buffer. */
static void lora_layout(gpt_model *m, const gpt_lora_options *options) {
    gpt_lora *lo = &m->lora;
    lo->options = *options;
    if (!lo->options.targets) lo->options.targets = GPT_LORA_ALL;
    if (lo->options.alpha == 0.0f) lo->options.alpha = (float)lo->options.rank;
    lo->scale = lo->options.alpha / (float)lo->options.rank;
    size_t at = 0, L = (size_t)m->config.layers, R = (size_t)lo->options.rank;
    for (int t = 0; t < GPT_LORA_TARGETS; t++) {
        if (!lora_on(m, t)) continue;
        int64_t in, out;
        gpt_lora_dims(t, m->config.channels, &in, &out);
        lo->a_offset[t] = at;
        at += L * R * (size_t)in;
        lo->b_offset[t] = at;
        at += L * R * (size_t)out;
    }
    lo->num_params = at;
}

/* A [R, in] and B [out, R] of target t in layer l, from the adapters'
 * parameter or gradient buffer. */
static gpc_tensor lora_a(const gpt_model *m, const gpc_tensor *flat, int t, int l) {
    int64_t in, out, R = m->lora.options.rank;
    gpt_lora_dims(t, m->config.channels, &in, &out);
    return view(flat, m->lora.a_offset[t] + (size_t)l * (size_t)(R * in), 2, R, in, 0);
}

static gpc_tensor lora_b(const gpt_model *m, const gpc_tensor *flat, int t, int l) {
    int64_t in, out, R = m->lora.options.rank;
    gpt_lora_dims(t, m->config.channels, &in, &out);
    return view(flat, m->lora.b_offset[t] + (size_t)l * (size_t)(R * out), 2, out, R, 0);
}

/* A from a normal of variance 1/(3 in), the variance of PEFT's default
 * Kaiming-uniform A; B zero, so the adapted model starts as the base. */
static gpc_status lora_init(gpt_model *m) {
    const gpt_lora *lo = &m->lora;
    float *w = gpc_calloc(lo->num_params ? lo->num_params : 1, sizeof *w);
    if (!w) return gpc_error(GPC_ERR_NOMEM, "out of host memory initialising the adapters");
    gpc_rng rng;
    gpc_rng_seed(&rng, lo->options.seed, 0x6c6f72612d696e69ULL); /* "lora-ini" */
    int64_t L = m->config.layers, R = lo->options.rank;
    for (int t = 0; t < GPT_LORA_TARGETS; t++) {
        if (!lora_on(m, t)) continue;
        int64_t in, out;
        gpt_lora_dims(t, m->config.channels, &in, &out);
        gpc_rng_fill_normal(&rng, w + lo->a_offset[t], (size_t)(L * R * in), 0.0f,
                            1.0f / sqrtf(3.0f * (float)in));
    }
    gpc_status s = gpt_lora_set_params(m, w);
    gpc_free(w);
    return s;
}

/* out += scale * x . A^T . B^T for target t of layer l, keeping the scaled
 * down-projection u = scale * x . A^T for backward. With B = 0 the added
 * product is exactly zero, so out is unchanged bit for bit. */
static gpc_status lora_forward(gpt_model *m, int t, int l, int start, int B, int T,
                               const gpc_tensor *x, gpc_tensor *out) {
    if (!lora_on(m, t)) return GPC_OK;
    const gpt_lora *lo = &m->lora;
    gpc_tensor a = lora_a(m, &lo->params_flat, t, l), b = lora_b(m, &lo->params_flat, t, l);
    gpc_tensor u = act_rows(m, &lo->u[t], l, start, B, T, lo->options.rank);
    GPC_TRY(gpc_op_matmul_forward(&u, x, &a, NULL));
    GPC_TRY(gpc_op_scale(&u, lo->scale));
    return gpc_op_matmul_residual_forward(out, &u, &b, NULL, out);
}

/* The adapter's backward for target t of layer l: dB += dout^T . u,
 * dA += (scale * dout . B)^T . x, and dx += scale * dout . B . A (dx is the
 * gradient of the projection's input, which the base's product wrote). */
static gpc_status lora_backward(gpt_model *m, int t, int l, int B, int T, const gpc_tensor *dout,
                                const gpc_tensor *x, gpc_tensor *dx) {
    if (!lora_on(m, t)) return GPC_OK;
    gpt_lora *lo = &m->lora;
    int64_t R = lo->options.rank, in, out;
    gpt_lora_dims(t, m->config.channels, &in, &out);
    gpc_tensor a = lora_a(m, &lo->params_flat, t, l), b = lora_b(m, &lo->params_flat, t, l);
    gpc_tensor da = lora_a(m, &lo->grads_flat, t, l), db = lora_b(m, &lo->grads_flat, t, l);
    gpc_tensor u = act_layer(m, &lo->u[t], l, B, T, R);
    gpc_tensor du = view(&lo->du, 0, 3, B, T, R);
    gpc_tensor dxa = view(&lo->dx, 0, 3, B, T, in);
    GPC_TRY(gpc_op_matmul_backward(&du, &db, NULL, dout, &u, &b));
    GPC_TRY(gpc_op_scale(&du, lo->scale));
    GPC_TRY(gpc_op_matmul_backward(&dxa, &da, NULL, &du, x, &a));
    return gpc_op_residual_forward(dx, dx, &dxa);
}

/* ------------------------------------------------------------ memory plan */

/* Views of a flat buffer, one per parameter tensor. */
static void split_flat(const gpt_model *m, const gpc_tensor *flat, gpt_tensors *out) {
    int64_t shapes[GPT_NUM_PARAM_TENSORS][3];
    int ndims[GPT_NUM_PARAM_TENSORS];
    gpt_param_shapes(&m->config, m->tp_size, shapes, ndims);
    for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++) {
        if (m->quant.on && gpt_param_quantized(i)) continue; /* its own 8-bit tensor */
        size_t at = m->quant.on ? m->quant.dense_offset[i] : m->param_offset[i];
        out->all[i] = view(flat, at, ndims[i], shapes[i][0], shapes[i][1], shapes[i][2]);
    }
}

/* A quantized model's parameters: the other tensors in params_flat, then
 * each quantized tensor's 8-bit weight and f32 scales. */
static gpc_status place_quant_params(gpt_model *m, gpc_arena *arena) {
    int64_t dense = (int64_t)m->quant.dense_count;
    GPC_TRY(gpc_arena_tensor(arena, &m->params_flat, m->dtype, 1, &dense));
    int64_t shapes[GPT_NUM_PARAM_TENSORS][3];
    int ndims[GPT_NUM_PARAM_TENSORS];
    gpt_param_shapes(&m->config, 1, shapes, ndims); /* quantized models are whole */
    for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++) {
        if (!gpt_param_quantized(i)) continue;
        const int64_t scale_shape[2] = {shapes[i][0],
                                        m->quant.options.per_channel ? shapes[i][1] : 1};
        GPC_TRY(gpc_arena_tensor(arena, &m->params.all[i], m->quant.options.dtype, 3, shapes[i]));
        GPC_TRY(gpc_arena_tensor(arena, &m->quant.scales[i], GPC_F32, 2, scale_shape));
    }
    return GPC_OK;
}

/* Layer l's scales of quantized parameter tensor `index`: [OC] or [1]. */
static gpc_tensor quant_scales(const gpt_model *m, int index, int l) {
    const gpc_tensor *all = &m->quant.scales[index];
    return param_layer(all, l, 0, all->shape[1]);
}

/* The product of a block's matrix weight (parameter tensor `index`, layer
 * l): out = [residual +] inp @ W^T + bias, on the quantized weight when the
 * model has one. */
static gpc_status project(gpt_model *m, int index, int l, gpc_tensor *out, const gpc_tensor *inp,
                          const gpc_tensor *weight, const gpc_tensor *bias,
                          const gpc_tensor *residual) {
    if (m->quant.on) {
        gpc_tensor scales = quant_scales(m, index, l);
        return gpc_op_matmul_quant_forward(out, inp, weight, &scales, bias, residual);
    }
    return residual ? gpc_op_matmul_residual_forward(out, inp, weight, bias, residual)
                    : gpc_op_matmul_forward(out, inp, weight, bias);
}

static gpc_status place_params(gpt_model *m, gpc_arena *arena) {
    if (m->quant.on) return place_quant_params(m, arena);
    int64_t P = (int64_t)m->num_params;
    GPC_TRY(gpc_arena_tensor(arena, &m->params_flat, m->dtype, 1, &P));
    gpt_lora *lo = &m->lora;
    if (lo->options.rank) { /* a frozen base: gradients for the adapters only */
        int64_t n = (int64_t)lo->num_params;
        GPC_TRY(gpc_arena_tensor(arena, &lo->params_flat, m->dtype, 1, &n));
        if (m->training) GPC_TRY(gpc_arena_tensor(arena, &lo->grads_flat, m->dtype, 1, &n));
    } else if (m->training) {
        GPC_TRY(gpc_arena_tensor(arena, &m->grads_flat, m->dtype, 1, &P));
    }
    /* master, m and v: the shard only (all of it without ZeRO) */
    return gpc_optim_place(m->optim, arena);
}

/* The groups of an offloaded update, in the order the forward reads them:
 * the embedding (wte, wpe), each layer's slice of the per-layer tensors,
 * the final layernorm (offload_group gives a layer's). An overlapped step's
 * next forward then waits for each layer's new weights alone. */
enum { GPT_OFFLOAD_EMBEDDING = 0 };
static int offload_group(int layer) {
    return 1 + layer; /* layer L: the final layernorm's */
}

static gpc_status offload_order(gpt_model *m) {
    /* wte and wpe first, lnfw and lnfb last, the per-layer ones between */
    const int L = m->config.layers, first_layered = 2, last_layered = GPT_NUM_PARAM_TENSORS - 3;
    const size_t most = (size_t)L * (last_layered - first_layered + 1) + 4;
    gpc_optim_span *spans = gpc_malloc(most * sizeof *spans);
    if (!spans) return gpc_error(GPC_ERR_NOMEM, "out of host memory creating the model");
    int n = 0;
    for (int i = 0; i < first_layered; i++)
        spans[n++] =
            (gpc_optim_span){m->param_offset[i], gpt_param_count(m, i), GPT_OFFLOAD_EMBEDDING};
    for (int l = 0; l < L; l++)
        for (int i = first_layered; i <= last_layered; i++) {
            size_t per = gpt_param_count(m, i) / (size_t)L;
            spans[n++] =
                (gpc_optim_span){m->param_offset[i] + (size_t)l * per, per, offload_group(l)};
        }
    for (int i = last_layered + 1; i < GPT_NUM_PARAM_TENSORS; i++)
        spans[n++] = (gpc_optim_span){m->param_offset[i], gpt_param_count(m, i), offload_group(L)};
    gpc_status s = gpc_optim_set_offload_order(m->optim, spans, n);
    gpc_free(spans);
    return s;
}

/* Before the forward reads a group's weights: an overlapped offloaded
 * update queued them (nothing otherwise). */
static gpc_status weights_ready(gpt_model *m, int group) {
    return m->offload && m->optim ? gpc_optim_wait_group(m->optim, group) : GPC_OK;
}

/* The optimizer over the 16 tensors, each its own range: weight decay on
 * the 2-D weights, the tensor's index as its rounding id. */
static gpc_status create_optimizer(gpt_model *m) {
    gpc_optim_range ranges[GPT_NUM_PARAM_TENSORS];
    int count = 0;
    const gpt_lora *lo = &m->lora;
    if (m->quant.on) {
        /* quantized weights are for inference: an optimizer of no ranges,
         * which holds no state (f32: no master copy either) */
    } else if (lo->options.rank) {
        /* LoRA: the adapters' own flat buffers, A and B of each target (2-D
         * weights, so decayed); the frozen base is in no range */
        size_t per_a[GPT_LORA_TARGETS], per_b[GPT_LORA_TARGETS];
        for (int t = 0; t < GPT_LORA_TARGETS; t++) {
            if (!(lo->options.targets & (1u << t))) continue;
            int64_t in, out;
            gpt_lora_dims(t, m->config.channels, &in, &out);
            per_a[t] = (size_t)m->config.layers * (size_t)lo->options.rank * (size_t)in;
            per_b[t] = (size_t)m->config.layers * (size_t)lo->options.rank * (size_t)out;
            ranges[count++] = (gpc_optim_range){lo->a_offset[t], per_a[t], 1,
                                                (uint32_t)(GPT_NUM_PARAM_TENSORS + 2 * t)};
            ranges[count++] = (gpc_optim_range){lo->b_offset[t], per_b[t], 1,
                                                (uint32_t)(GPT_NUM_PARAM_TENSORS + 2 * t + 1)};
        }
    } else {
        for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++)
            ranges[count++] = (gpc_optim_range){m->param_offset[i], gpt_param_count(m, i),
                                                gpt_param_decays(i), (uint32_t)i};
    }
    gpc_optim_layout layout = {.device = m->device,
                               .dtype = m->quant.on ? GPC_F32 : m->dtype,
                               .ranges = ranges,
                               .range_count = count,
                               .shard_begin = m->shard_offset,
                               .shard_end = m->shard_offset + m->shard_count,
                               .moments = m->training,
                               .offload = m->offload,
                               .offload_chunk = (size_t)gpc_setting_int("GPC_OFFLOAD_CHUNK")};
    GPC_TRY(gpc_optim_create(&m->optim, &layout));
    return m->offload ? offload_order(m) : GPC_OK;
}

/* One slot's activations; backward's scratch and LoRA's buffers only with
 * slot 0 (the other slots name slot 0's scratch). */
static gpc_status place_slot(gpt_model *m, gpc_arena *arena, int slot) {
    gpt_activations *a = &m->slot_acts[slot];
    int64_t L = m->config.layers, B = m->B, T = m->T, C = m->config.channels;
    int64_t NH = m->config.heads;
    /* tensor parallelism: this rank's heads and MLP units only */
    int64_t Cl = C / m->tp_size, F = 4 * C / m->tp_size, NHl = NH / m->tp_size;
    gpc_dtype d = m->dtype;
    /* recomputed activations share one slot (gpc plan counts the same) */
    int64_t kept_gelu = kept_slots(m, 1), kept_ln = kept_slots(m, 2), kept = kept_slots(m, 3);
#define PLACE(t, dtype, ...)                                                                       \
    do {                                                                                           \
        const int64_t shape_[] = {__VA_ARGS__};                                                    \
        GPC_TRY(gpc_arena_tensor(arena, &a->t, dtype, (int)(sizeof shape_ / sizeof shape_[0]),     \
                                 shape_));                                                         \
    } while (0)
    PLACE(encoded, d, B, T, C);
    PLACE(ln1, d, kept_ln, B, T, C);
    PLACE(ln1_mean, GPC_F32, kept, B, T);
    PLACE(ln1_rstd, GPC_F32, kept, B, T);
    PLACE(qkv, d, kept, B, T, 3 * Cl);
    PLACE(atty, d, kept, B, T, Cl);
    PLACE(lse, GPC_F32, kept, B, NHl, T);
    PLACE(residual2, d, kept, B, T, C);
    PLACE(ln2, d, kept_ln, B, T, C);
    PLACE(ln2_mean, GPC_F32, kept, B, T);
    PLACE(ln2_rstd, GPC_F32, kept, B, T);
    PLACE(fch, d, kept, B, T, F);
    PLACE(fch_gelu, d, kept_gelu, B, T, F);
    PLACE(residual3, d, L, B, T, C);
    PLACE(lnf, d, B, T, C);
    PLACE(lnf_mean, GPC_F32, B, T);
    PLACE(lnf_rstd, GPC_F32, B, T);
    if (slot == 0) {
        int64_t Vl = gpt_tp_vocab_rows(&m->config, m->tp_size); /* a tp rank's rows */
        PLACE(logits, d, B, T, Vl);
        PLACE(losses, GPC_F32, B, T);
        if (m->tp_size > 1) {
            PLACE(ce_stats, GPC_F32, 3, B * T);
            PLACE(logits_full, d, m->tp_size * Vl); /* Vp and the last slice's extra rows */
        }
    } else { /* the head runs one micro-batch at a time: one buffer serves all */
        a->logits = m->slot_acts[0].logits;
        a->losses = m->slot_acts[0].losses;
        a->ce_stats = m->slot_acts[0].ce_stats;
        a->logits_full = m->slot_acts[0].logits_full;
    }
    PLACE(tokens, GPC_I32, B, T);
    PLACE(targets, GPC_I32, B, T);
    if (m->training && slot > 0) {
        const gpt_activations *first = &m->slot_acts[0];
        a->dresidual = first->dresidual;
        a->dbtc = first->dbtc;
        a->dbt4c = first->dbt4c;
        a->norm_sq = first->norm_sq;
        a->loss_sum = first->loss_sum;
        return GPC_OK;
    }
    if (m->training) {
        PLACE(dresidual, d, B, T, C);
        PLACE(dbtc, d, B, T, C);
        PLACE(dbt4c, d, B, T, F);
        /* two device scalars in one buffer, so gpt_read_step reads both in
         * one copy: the squared gradient norm and the summed loss */
        PLACE(norm_sq, GPC_F32, 2);
        a->loss_sum = view(&a->norm_sq, 1, 1, 1, 0, 0);
        a->norm_sq = view(&a->norm_sq, 0, 1, 1, 0, 0);
    }
    gpt_lora *lo = &m->lora;
    int64_t R = lo->options.rank;
    for (int t = 0; R && t < GPT_LORA_TARGETS; t++)
        if (lo->options.targets & (1u << t)) {
            const int64_t shape[] = {L, B, T, R};
            GPC_TRY(gpc_arena_tensor(arena, &lo->u[t], d, 4, shape));
        }
    if (R && m->training) {
        int64_t widest = lo->options.targets & GPT_LORA_FCPROJ ? 4 * C : C;
        const int64_t du[] = {B, T, R}, dx[] = {B, T, widest}, dln[] = {2 * C};
        GPC_TRY(gpc_arena_tensor(arena, &lo->du, d, 3, du));
        GPC_TRY(gpc_arena_tensor(arena, &lo->dx, d, 3, dx));
        GPC_TRY(gpc_arena_tensor(arena, &lo->dln, d, 1, dln));
    }
#undef PLACE
    return GPC_OK;
}

static gpc_status place_acts(gpt_model *m, gpc_arena *arena) {
    for (int k = 0; k < m->par.slots; k++)
        GPC_TRY(place_slot(m, arena, k));
    m->acts = m->slot_acts[0];
    return GPC_OK;
}

/* Runs a placement twice: measuring, then into one allocation. */
static gpc_status plan(gpt_model *m, gpc_arena *arena,
                       gpc_status (*place)(gpt_model *, gpc_arena *)) {
    gpc_arena measure;
    gpc_arena_measure(&measure, m->device);
    GPC_TRY(place(m, &measure));
    gpc_status s = gpc_arena_create(arena, m->device, measure.peak);
    if (s != GPC_OK)
        return gpc_error_context(s, "allocating %.1f MiB for the model on %s: ",
                                 (double)measure.peak / (1 << 20), gpc_device_name(m->device));
    return place(m, arena);
}

gpc_status gpt_create(gpt_model **out, const gpt_config *config, gpc_device device, gpc_dtype dtype,
                      int B, int T, int training) {
    return gpt_create_recompute(out, config, device, dtype, B, T, training, 0);
}

/* shard_count SIZE_MAX: the whole buffer. */
static gpc_status create_with(gpt_model **out, const gpt_config *config, gpc_device device,
                              gpc_dtype dtype, int B, int T, int training, int recompute,
                              size_t shard_offset, size_t shard_count, const gpt_lora_options *lora,
                              const gpt_parallel *par, const gpt_quant_options *quant,
                              int offload) {
    *out = NULL;
    const gpt_parallel whole_model = {1, 0, 1, 0, 1};
    if (!par) par = &whole_model;
    GPC_TRY(gpt_recompute_check(recompute, config->layers));
    gpt_config check;
    GPC_TRY(gpt_config_init(&check, config->layers, config->heads, config->channels,
                            config->max_context, config->vocab_size));
    GPC_TRY(gpt_parallel_check(&check, par));
    int tp_size = par->tp_size;
    /* under pipeline parallelism a block count is per stage, as Megatron's
     * --recompute-num-layers: each stage recomputes its first N blocks */
    int stage_layers = check.layers / par->pp_size;
    if (par->pp_size > 1 && (recompute >> 2) > stage_layers)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--recompute-layers %d is more than a pipeline stage's %d blocks (%d "
                         "layers over --pp %d): under --pp it counts each stage's blocks; give 1 "
                         "to %d (or 0 for all)",
                         recompute >> 2, stage_layers, check.layers, par->pp_size, stage_layers);
    if (dtype != GPC_F32 && dtype != GPC_BF16 && dtype != GPC_F16)
        return gpc_error(GPC_ERR_INVALID_ARG, "a model computes in f32, bf16 or fp16, not %s",
                         gpc_dtype_name(dtype));
    if (device.type == GPC_DEVICE_CPU && dtype != GPC_F32)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "the CPU computes in f32 only, not %s; use --precision f32 (bf16 and "
                         "fp16 need a GPU)",
                         gpc_dtype_name(dtype));
    if (B < 1 || T < 1 || T > check.max_context)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "batch %d x context %d does not fit a model with context %d", B, T,
                         check.max_context);
    const gpc_backend *backend;
    GPC_TRY(gpc_backend_require(device, &backend));

    gpt_model *m = gpc_calloc(1, sizeof *m);
    if (!m) return gpc_error(GPC_ERR_NOMEM, "out of host memory creating the model");
    m->whole = check;
    m->par = *par;
    if (m->par.slots < 1) m->par.slots = 1;
    m->config = check;
    m->config.layers = check.layers / par->pp_size; /* a pipeline stage's */
    m->device = device;
    m->dtype = dtype;
    m->training = training ? 1 : 0;
    m->recompute = training ? recompute : 0; /* inference keeps no activations for backward */
    m->offload = offload;
    m->derived_qkv_bias = gpc_setting_flag("GPC_QKV_BIAS_DERIVED");
    m->B = B;
    m->T = T;
    m->tp_size = tp_size;
    m->tp_rank = par->tp_rank;
    m->num_params = gpt_part_num_params(&check, par);
    m->slot_acts = gpc_calloc((size_t)m->par.slots, sizeof *m->slot_acts);
    m->slot_unmasked = gpc_calloc((size_t)m->par.slots, sizeof *m->slot_unmasked);
    if (!m->slot_acts || !m->slot_unmasked) {
        gpc_free(m->slot_acts);
        gpc_free(m->slot_unmasked);
        gpc_free(m);
        return gpc_error(GPC_ERR_NOMEM, "out of host memory creating the model");
    }
    if (shard_count == SIZE_MAX) shard_count = m->num_params;
    if (shard_offset > m->num_params || shard_count > m->num_params - shard_offset) {
        size_t num_params = (size_t)m->num_params;
        gpc_free(m->slot_acts);
        gpc_free(m->slot_unmasked);
        gpc_free(m);
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "optimizer shard [%zu, %zu) lies outside the model's %zu parameters; "
                         "cut the shards with gpc_dist_shard_offsets over num_params",
                         shard_offset, shard_offset + shard_count, num_params);
    }
    m->shard_offset = shard_offset;
    m->shard_count = shard_count;
    if (lora) lora_layout(m, lora);

    {
        size_t offsets[GPT_NUM_PARAM_TENSORS + 1];
        gpt_param_layout(&m->config, tp_size, offsets);
        memcpy(m->param_offset, offsets, sizeof m->param_offset);
        for (int i = 0; quant && i < GPT_NUM_PARAM_TENSORS; i++) {
            if (gpt_param_quantized(i)) continue;
            m->quant.dense_offset[i] = m->quant.dense_count;
            m->quant.dense_count += offsets[i + 1] - offsets[i];
        }
    }
    if (quant) {
        m->quant.on = 1;
        m->quant.options = *quant;
    }

    gpc_status s = create_optimizer(m);
    if (s == GPC_OK) s = plan(m, &m->param_arena, place_params);
    if (s == GPC_OK) s = plan(m, &m->act_arena, place_acts);
    /* offloaded, the optimizer state is in pinned host memory, not an arena */
    if (s == GPC_OK && m->offload) s = gpc_optim_alloc(m->optim);
    /* attention's own plans and workspace (cuDNN's) are built now, with the
     * rest of the model's memory, rather than in the first step */
    if (s == GPC_OK) {
        gpc_tensor qkv = act_layer(m, &m->acts.qkv, 0, B, T, 3 * (int64_t)check.channels / tp_size);
        s = gpc_op_attention_prepare(&qkv, check.heads / tp_size, m->training);
    }
    if (s == GPC_OK) {
        size_t rows = (size_t)B * (size_t)T;
        m->host_losses = gpc_malloc(rows * sizeof(float));
        m->host_row = gpc_malloc((size_t)B * (size_t)check.padded_vocab * gpc_dtype_size(dtype));
        if (!m->host_losses || !m->host_row)
            s = gpc_error(GPC_ERR_NOMEM, "out of host memory creating the model");
    }
    if (s != GPC_OK) {
        gpt_free(m);
        return s;
    }
    split_flat(m, &m->params_flat, &m->params);
    if (m->training) split_flat(m, &m->grads_flat, &m->grads);
    s = gpc_tensor_zero(&m->params_flat);
    for (int i = 0; s == GPC_OK && m->quant.on && i < GPT_NUM_PARAM_TENSORS; i++)
        if (gpt_param_quantized(i)) {
            s = gpc_tensor_zero(&m->params.all[i]);
            if (s == GPC_OK) s = gpc_tensor_zero(&m->quant.scales[i]);
        }
    if (s == GPC_OK) s = gpc_optim_zero(m->optim);
    if (s == GPC_OK && m->training) {
        s = gpc_tensor_zero(m->lora.options.rank ? &m->lora.grads_flat : &m->grads_flat);
        if (s == GPC_OK) s = gpc_tensor_zero(&m->acts.loss_sum);
    }
    if (s == GPC_OK && lora) s = lora_init(m);
    if (s != GPC_OK) {
        gpt_free(m);
        return s;
    }
    *out = m;
    return GPC_OK;
}

static gpc_status create(gpt_model **out, const gpt_config *config, gpc_device device,
                         gpc_dtype dtype, int B, int T, int training, int recompute,
                         size_t shard_offset, size_t shard_count, const gpt_lora_options *lora,
                         const gpt_parallel *par, const gpt_quant_options *quant) {
    return create_with(out, config, device, dtype, B, T, training, recompute, shard_offset,
                       shard_count, lora, par, quant, 0);
}

gpc_status gpt_create_offload(gpt_model **out, const gpt_config *config, gpc_device device,
                              gpc_dtype dtype, int B, int T, int recompute) {
    return create_with(out, config, device, dtype, B, T, 1, recompute, 0, SIZE_MAX, NULL, NULL,
                       NULL, 1);
}

int gpt_optimizer_offloaded(const gpt_model *m) {
    return m->offload;
}

size_t gpt_host_pinned_bytes(const gpt_model *m) {
    return gpc_optim_host_bytes(m->optim);
}

gpc_status gpt_create_recompute(gpt_model **out, const gpt_config *config, gpc_device device,
                                gpc_dtype dtype, int B, int T, int training, int recompute) {
    return create(out, config, device, dtype, B, T, training, recompute, 0, SIZE_MAX, NULL, NULL,
                  NULL);
}

gpc_status gpt_create_lora(gpt_model **out, const gpt_config *config, gpc_device device,
                           gpc_dtype dtype, int B, int T, int training, int recompute,
                           const gpt_lora_options *lora) {
    *out = NULL;
    if (!lora || lora->rank < 1 || lora->rank > config->channels)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--lora %d is out of range: give a rank from 1 to %d (the channels)",
                         lora ? lora->rank : 0, config->channels);
    if (!(lora->alpha >= 0.0f) || !isfinite(lora->alpha))
        return gpc_error(GPC_ERR_INVALID_ARG, "--lora-alpha %g must be a positive number",
                         (double)lora->alpha);
    if (lora->targets & ~GPT_LORA_ALL)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "LoRA targets 0x%x are not a set of qkv, proj, fc and fcproj",
                         lora->targets);
    return create(out, config, device, dtype, B, T, training, recompute, 0, SIZE_MAX, lora, NULL,
                  NULL);
}

gpc_status gpt_create_shard(gpt_model **out, const gpt_config *config, gpc_device device,
                            gpc_dtype dtype, int B, int T, int recompute, size_t shard_offset,
                            size_t shard_count) {
    return create(out, config, device, dtype, B, T, 1, recompute, shard_offset, shard_count, NULL,
                  NULL, NULL);
}

gpc_status gpt_create_tp(gpt_model **out, const gpt_config *config, gpc_device device,
                         gpc_dtype dtype, int B, int T, int recompute, int tp_size, int tp_rank,
                         size_t shard_offset, size_t shard_count) {
    const gpt_parallel par = {tp_size, tp_rank, 1, 0, 1};
    return create(out, config, device, dtype, B, T, 1, recompute, shard_offset, shard_count, NULL,
                  &par, NULL);
}

gpc_status gpt_create_part(gpt_model **out, const gpt_config *config, gpc_device device,
                           gpc_dtype dtype, int B, int T, int recompute, const gpt_parallel *par,
                           size_t shard_offset, size_t shard_count) {
    return create(out, config, device, dtype, B, T, 1, recompute, shard_offset, shard_count, NULL,
                  par, NULL);
}

int gpt_is_part(const gpt_model *m) {
    return m->par.tp_size > 1 || m->par.pp_size > 1;
}

gpc_status gpt_create_quant(gpt_model **out, const gpt_config *config, gpc_device device,
                            gpc_dtype dtype, int B, int T, const gpt_quant_options *quant) {
    *out = NULL;
    if (!quant || (quant->dtype != GPC_I8 && quant->dtype != GPC_F8E4M3))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "quantized weights are int8 or fp8 (E4M3), not %s; see gpc quantize --to",
                         quant ? gpc_dtype_name(quant->dtype) : "none");
    if (quant->dtype == GPC_I8 && !quant->per_channel)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "int8 weights take a scale per output channel; per-tensor scales are "
                         "for fp8 (use --scales channel)");
    /* inference only and whole: no tensor or pipeline parts (par NULL) */
    return create(out, config, device, dtype, B, T, 0, 0, 0, SIZE_MAX, NULL, NULL, quant);
}

const gpt_quant_options *gpt_quant_of(const gpt_model *m) {
    return m->quant.on ? &m->quant.options : NULL;
}

int gpt_is_sharded(const gpt_model *m) {
    return m->shard_offset != 0 || m->shard_count != m->num_params;
}

void gpt_free(gpt_model *m) {
    if (!m) return;
    /* first: an offloaded update's thread may still be queueing weights
     * into the parameters */
    gpc_optim_free(m->optim);
    gpc_arena_destroy(&m->param_arena);
    gpc_arena_destroy(&m->act_arena);
    gpc_free(m->host_losses);
    gpc_free(m->host_row);
    gpc_free(m->slot_acts);
    gpc_free(m->slot_unmasked);
    gpc_free(m);
}

size_t gpt_memory_bytes(const gpt_model *m) {
    return m->param_arena.capacity + m->act_arena.capacity;
}

/* ------------------------------------------------------------ parameters */

/* A sharded low-precision model: the compute-dtype parameters outside the
 * master shard come from f32 values converted on the host (round to
 * nearest even, as the backends' convert); the optimizer then converts its
 * shard from the master on the device, as in the unsharded model. */
static gpc_status set_low_params(gpt_model *m, const float *values) {
    size_t P = m->num_params, chunk = (size_t)1 << 20;
    uint16_t *half = gpc_malloc(chunk * sizeof *half);
    if (!half) return gpc_error(GPC_ERR_NOMEM, "out of host memory setting the parameters");
    gpc_status s = GPC_OK;
    for (size_t done = 0; s == GPC_OK && done < P; done += chunk) {
        size_t k = P - done < chunk ? P - done : chunk;
        for (size_t i = 0; i < k; i++)
            half[i] = m->dtype == GPC_BF16 ? gpc_f32_to_bf16(values[done + i])
                                           : gpc_f32_to_f16(values[done + i]);
        gpc_tensor src = gpc_tensor_1d(half, m->dtype, gpc_cpu(), (int64_t)k);
        gpc_tensor dst = view(&m->params_flat, done, 1, (int64_t)k, 0, 0);
        s = gpc_tensor_copy(&dst, &src);
    }
    gpc_free(half);
    return s;
}

gpc_status gpt_set_params(gpt_model *m, const float *values) {
    m->cached_len = 0; /* kept keys and values belong to the old weights */
    if (m->quant.on) return gpt_quant_set_params(m, values);
    /* a LoRA model's frozen base has no master copy: converted on the host */
    if (m->lora.options.rank && m->dtype != GPC_F32) return set_low_params(m, values);
    if (!gpc_optim_master(m->optim) || m->lora.options.rank) {
        int64_t P = (int64_t)m->num_params;
        gpc_tensor host = gpc_tensor_make((void *)values, GPC_F32, gpc_cpu(), 1, &P);
        return gpc_tensor_copy(&m->params_flat, &host);
    }
    if (gpt_is_sharded(m)) GPC_TRY(set_low_params(m, values));
    return gpc_optim_set_master(m->optim, &m->params_flat, values);
}

gpc_status gpt_get_params(const gpt_model *m, float *values) {
    if (m->quant.on) return gpt_quant_get_params(m, values);
    int64_t P = (int64_t)m->num_params;
    gpc_tensor host = gpc_tensor_make(values, GPC_F32, gpc_cpu(), 1, &P);
    if (!gpc_optim_master(m->optim) || (m->lora.options.rank && m->dtype == GPC_F32))
        return gpc_tensor_copy(&host, &m->params_flat);
    if (gpt_is_sharded(m) || m->lora.options.rank) {
        /* the compute-dtype values everywhere, then the master's over its shard */
        size_t elem = gpc_dtype_size(m->dtype);
        void *raw = gpc_malloc(m->num_params * elem);
        if (!raw) return gpc_error(GPC_ERR_NOMEM, "out of host memory reading the parameters");
        gpc_tensor low = gpc_tensor_make(raw, m->dtype, gpc_cpu(), 1, &P);
        gpc_status s = gpc_tensor_copy(&low, &m->params_flat);
        const uint16_t *half = raw;
        for (size_t i = 0; s == GPC_OK && i < m->num_params; i++)
            values[i] = m->dtype == GPC_BF16 ? gpc_bf16_to_f32(half[i]) : gpc_f16_to_f32(half[i]);
        gpc_free(raw);
        if (s != GPC_OK || m->lora.options.rank) return s; /* the base is in no master */
    }
    return gpc_optim_get_master(m->optim, values);
}

gpc_status gpt_init_weights(gpt_model *m, uint64_t seed) {
    /* the whole model's values, then this rank's part of them: every tp
     * and pp layout starts from the same weights */
    const gpt_config *c = &m->whole;
    size_t full[GPT_NUM_PARAM_TENSORS + 1];
    gpt_param_layout(c, 1, full);
    /* an offloaded optimizer's master is already a host array of the whole
     * model (gpt_create_offload makes no part, LoRA or quantized model):
     * drawn there, the start needs no f32 copy beside it (4 bytes a
     * parameter, 28 GB at 7B) */
    float *master = gpc_optim_host_master(m->optim, full[GPT_NUM_PARAM_TENSORS]);
    float *w = master ? master : gpc_malloc(full[GPT_NUM_PARAM_TENSORS] * sizeof(float));
    if (!w) return gpc_error(GPC_ERR_NOMEM, "out of host memory initialising the model");
    gpc_rng rng;
    gpc_rng_seed(&rng, seed, 0x6770742d696e6974ULL); /* "gpt-init": its own stream */
    /* GPT-2: std 0.02; residual projections 0.02/sqrt(2L) so the residual
     * stream's variance does not grow with depth (Radford et al. 2019, 2.3). */
    const float std = 0.02f, residual_std = 0.02f / sqrtf(2.0f * (float)c->layers);
    for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++) {
        float *p = w + full[i];
        size_t n = full[i + 1] - full[i];
        const char *name = gpt_param_names[i];
        if (i == 0) { /* wte: real rows random, padded rows zero */
            size_t real = (size_t)c->vocab_size * (size_t)c->channels;
            gpc_rng_fill_normal(&rng, p, real, 0.0f, std);
            memset(p + real, 0, (n - real) * sizeof(float));
        } else if (i == 1) {
            gpc_rng_fill_normal(&rng, p, n, 0.0f, 0.01f);
        } else if (strcmp(name, "attprojw") == 0 || strcmp(name, "fcprojw") == 0) {
            gpc_rng_fill_normal(&rng, p, n, 0.0f, residual_std);
        } else if (gpt_param_decays(i)) {
            gpc_rng_fill_normal(&rng, p, n, 0.0f, std);
        } else if (strstr(name, "ln") == name && name[strlen(name) - 1] == 'w') {
            for (size_t k = 0; k < n; k++)
                p[k] = 1.0f;
        } else {
            memset(p, 0, n * sizeof(float));
        }
    }
    gpc_status s = GPC_OK;
    if (master) {
        m->cached_len = 0;
        return gpc_optim_master_to_params(m->optim, &m->params_flat);
    }
    if (gpt_is_part(m)) {
        float *local = gpc_malloc(m->num_params * sizeof(float));
        if (!local) s = gpc_error(GPC_ERR_NOMEM, "out of host memory initialising the model");
        if (local) gpt_part_slice(c, &m->par, w, local);
        if (local) s = gpt_set_params(m, local);
        gpc_free(local);
    } else {
        s = gpt_set_params(m, w);
    }
    gpc_free(w);
    return s;
}

/* ------------------------------------------------------------ forward */

static gpc_status check_batch(const gpt_model *m, int B, int T) {
    if (B < 1 || T < 1 || B > m->B || T > m->T)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "batch %d x %d is outside what the model was planned for (%d x %d)", B, T,
                         m->B, m->T);
    return GPC_OK;
}

/* Checks and copies B x T tokens (and targets, when given) to the device,
 * from position `start` of the token buffer on (start > 0 only for a batch
 * of one: generation over kept keys and values). */
static gpc_status upload_tokens(gpt_model *m, const int32_t *inputs, const int32_t *targets,
                                int start, int B, int T) {
    size_t n = (size_t)B * (size_t)T;
    int V = m->config.vocab_size;
    for (size_t i = 0; i < n; i++)
        if (inputs[i] < 0 || inputs[i] >= V)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "token %d at position %zu is outside the vocabulary (0..%d)",
                             inputs[i], (size_t)start + i, V - 1);
    gpc_tensor host = gpc_tensor_2d((void *)inputs, GPC_I32, gpc_cpu(), B, T);
    gpc_tensor dev = view(&m->acts.tokens, (size_t)start, 2, B, T, 0);
    GPC_TRY(gpc_tensor_copy(&dev, &host));
    m->last_unmasked = 0;
    if (!targets) return GPC_OK;
    for (size_t i = 0; i < n; i++) {
        if (targets[i] < -1 || targets[i] >= V)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "target %d at position %zu is outside the vocabulary (0..%d, or -1 "
                             "to mask)",
                             targets[i], i, V - 1);
        m->last_unmasked += targets[i] >= 0;
    }
    host = gpc_tensor_2d((void *)targets, GPC_I32, gpc_cpu(), B, T);
    dev = view(&m->acts.targets, (size_t)start, 2, B, T, 0);
    return gpc_tensor_copy(&dev, &host);
}

/* Tensor parallelism's sum over the tp ranks, in place: the g operator of
 * Megatron-LM in forward, f's in backward. Nothing on a whole model. */
static gpc_status tp_sum(gpt_model *m, gpc_tensor *t) {
    if (m->tp_size == 1) return GPC_OK;
    if (!m->tp_reduce)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "a tensor-parallel model needs its sum over the tp ranks: set it with "
                         "gpt_set_tp_reduce before the first forward");
    return m->tp_reduce(m->tp_reduce_user, t);
}

/* Tensor parallelism's elementwise max over the tp ranks, in place. */
static gpc_status tp_max(gpt_model *m, gpc_tensor *t) {
    if (m->tp_size == 1) return GPC_OK;
    if (!m->tp_max)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "a tensor-parallel model needs its max over the tp ranks: set it with "
                         "gpt_set_tp_max before the first forward");
    return m->tp_max(m->tp_max_user, t);
}

/* The rows of wte (the vocabulary) that this tp rank holds: vocab_rows of
 * them from vocab_row0 on; the whole padded vocabulary without tp. */
static int64_t vocab_rows(const gpt_model *m) {
    return gpt_tp_vocab_rows(&m->config, m->tp_size);
}

static int64_t vocab_row0(const gpt_model *m) {
    return (int64_t)m->tp_rank * vocab_rows(m);
}

/* out = residual + x . w^T + bias through a projection (parameter tensor
 * `index`, layer l, by project) whose input is cut over the tp ranks
 * (row-parallel): rank 0 adds the residual and the bias to its partial
 * product, the others give their partial product alone, and the sum over
 * the ranks is the whole output on every rank. */
static gpc_status row_parallel_forward(gpt_model *m, int index, int l, gpc_tensor *out,
                                       const gpc_tensor *x, const gpc_tensor *w,
                                       const gpc_tensor *bias, const gpc_tensor *residual) {
    if (m->tp_rank == 0)
        GPC_TRY(project(m, index, l, out, x, w, bias, residual));
    else
        GPC_TRY(project(m, index, l, out, x, w, NULL, NULL));
    return tp_sum(m, out);
}

/* Blocks first .. end-1 from the residual stream before block `first`, for
 * blocks_forward; with rebuild, one block's activations up to its GELU
 * again, for backward (recomputation level 3), by the very ops forward ran,
 * so the values are bitwise the same. */
static gpc_status blocks_range(gpt_model *m, int start, int B, int T, int first, int end,
                               int rebuild) {
    const gpt_config *c = &m->config;
    gpt_activations *a = &m->acts;
    gpt_tensors *p = &m->params;
    int L = c->layers, NH = c->heads / m->tp_size; /* this rank's heads */
    int64_t C = c->channels, Cl = C / m->tp_size, F = 4 * C / m->tp_size;
    size_t at = (size_t)start * (size_t)C;
    gpc_tensor encoded = view(&a->encoded, at, 3, B, T, C);

    /* Each projection adds to the residual stream inside its product
     * (gpc_op_matmul_residual_forward), so its output is never stored: the
     * layernorm after it reads the new residual alone. */
    {
        int l = first;
        GPC_TRY(weights_ready(m, offload_group(l)));
        gpc_tensor residual = l == 0 ? encoded : act_rows(m, &a->residual3, l - 1, start, B, T, C);
        gpc_tensor ln1 = act_rows(m, &a->ln1, kept_layer(m, l, 2), start, B, T, C);
        gpc_tensor mean = stat_rows(m, &a->ln1_mean, kept_layer(m, l, 3), start, B, T);
        gpc_tensor rstd = stat_rows(m, &a->ln1_rstd, kept_layer(m, l, 3), start, B, T);
        gpc_tensor w = param_layer(&p->ln1w, l, 0, C), b = param_layer(&p->ln1b, l, 0, C);
        GPC_TRY(gpc_op_layernorm_forward(&ln1, &mean, &rstd, &residual, &w, &b));
    }
    for (int l = first; l < end; l++) {
        int k = kept_layer(m, l, 3); /* the slot of the block's inner activations */
        gpc_tensor residual = l == 0 ? encoded : act_rows(m, &a->residual3, l - 1, start, B, T, C);
        gpc_tensor ln1 = act_rows(m, &a->ln1, kept_layer(m, l, 2), start, B, T, C);
        gpc_tensor qkv = act_rows(m, &a->qkv, k, start, B, T, 3 * Cl);
        gpc_tensor atty = act_rows(m, &a->atty, k, start, B, T, Cl);
        gpc_tensor residual2 = act_rows(m, &a->residual2, k, start, B, T, C);
        gpc_tensor ln2 = act_rows(m, &a->ln2, kept_layer(m, l, 2), start, B, T, C);
        gpc_tensor ln2_mean = stat_rows(m, &a->ln2_mean, k, start, B, T);
        gpc_tensor ln2_rstd = stat_rows(m, &a->ln2_rstd, k, start, B, T);
        gpc_tensor fch = act_rows(m, &a->fch, k, start, B, T, F);
        gpc_tensor fch_gelu = act_rows(m, &a->fch_gelu, kept_layer(m, l, 1), start, B, T, F);
        gpc_tensor residual3 = act_rows(m, &a->residual3, l, start, B, T, C);

        gpc_tensor qkvw = param_layer(&p->qkvw, l, 3 * Cl, C);
        gpc_tensor qkvb = param_layer(&p->qkvb, l, 0, 3 * Cl);
        gpc_tensor attprojw = param_layer(&p->attprojw, l, C, Cl);
        gpc_tensor attprojb = param_layer(&p->attprojb, l, 0, C);
        gpc_tensor ln2w = param_layer(&p->ln2w, l, 0, C);
        gpc_tensor ln2b = param_layer(&p->ln2b, l, 0, C);
        gpc_tensor fcw = param_layer(&p->fcw, l, F, C);
        gpc_tensor fcb = param_layer(&p->fcb, l, 0, F);
        gpc_tensor fcprojw = param_layer(&p->fcprojw, l, C, F);
        gpc_tensor fcprojb = param_layer(&p->fcprojb, l, 0, C);

        GPC_TRY(project(m, 4, l, &qkv, &ln1, &qkvw, &qkvb, NULL));
        GPC_TRY(lora_forward(m, 0, l, start, B, T, &ln1, &qkv));
        if (start > 0) {
            gpc_tensor kept = act_rows(m, &a->qkv, k, 0, 1, start + T, 3 * Cl);
            GPC_TRY(gpc_op_attention_decode(&atty, &kept, NH));
        } else { /* the whole sequence so far: the flash kernels */
            gpc_tensor lse = lse_layer(m, l, B, T);
            GPC_TRY(gpc_op_attention_forward(&atty, &lse, &qkv, NH));
        }
        GPC_TRY(row_parallel_forward(m, 6, l, &residual2, &atty, &attprojw, &attprojb, &residual));
        GPC_TRY(lora_forward(m, 1, l, start, B, T, &atty, &residual2));
        GPC_TRY(gpc_op_layernorm_forward(&ln2, &ln2_mean, &ln2_rstd, &residual2, &ln2w, &ln2b));
        if (m->quant.on) { /* quantized models have no adapters */
            gpc_tensor scales = quant_scales(m, 10, l);
            GPC_TRY(gpc_op_matmul_quant_gelu_forward(&fch, &fch_gelu, &ln2, &fcw, &scales, &fcb));
        } else if (lora_on(m, 2)) { /* an adapter adds before the GELU: the two apart */
            GPC_TRY(project(m, 10, l, &fch, &ln2, &fcw, &fcb, NULL));
            GPC_TRY(lora_forward(m, 2, l, start, B, T, &ln2, &fch));
            GPC_TRY(gpc_op_gelu_forward(&fch_gelu, &fch));
        } else {
            GPC_TRY(gpc_op_matmul_gelu_forward(&fch, &fch_gelu, &ln2, &fcw, &fcb));
        }
        if (rebuild) continue; /* backward keeps residual3 and the next ln1 comes again */
        GPC_TRY(
            row_parallel_forward(m, 12, l, &residual3, &fch_gelu, &fcprojw, &fcprojb, &residual2));
        GPC_TRY(lora_forward(m, 3, l, start, B, T, &fch_gelu, &residual3));
        /* the next layer's ln1 or the final layernorm, of residual3 */
        int last = l + 1 == L;
        gpc_tensor next = last ? view(&a->lnf, at, 3, B, T, C)
                               : act_rows(m, &a->ln1, kept_layer(m, l + 1, 2), start, B, T, C);
        gpc_tensor mean = last ? view(&a->lnf_mean, (size_t)start, 2, B, T, 0)
                               : stat_rows(m, &a->ln1_mean, kept_layer(m, l + 1, 3), start, B, T);
        gpc_tensor rstd = last ? view(&a->lnf_rstd, (size_t)start, 2, B, T, 0)
                               : stat_rows(m, &a->ln1_rstd, kept_layer(m, l + 1, 3), start, B, T);
        gpc_tensor w = last ? p->lnfw : param_layer(&p->ln1w, l + 1, 0, C);
        gpc_tensor b = last ? p->lnfb : param_layer(&p->ln1b, l + 1, 0, C);
        GPC_TRY(weights_ready(m, offload_group(l + 1))); /* the next layer's, or lnf's */
        GPC_TRY(gpc_op_layernorm_forward(&next, &mean, &rstd, &residual3, &w, &b));
    }
    return GPC_OK;
}

/* Embedding, the blocks and the final layernorm, into lnf: the whole batch
 * (start 0: attention over the batch's own positions, lse kept for the
 * backward pass), or positions start .. start+T-1 (start > 0) of a batch of
 * one, whose attention (attention_decode) reads the keys and values kept in
 * qkv for the positions before them. tokens: [B,T] i32 on the model's
 * device. */
static gpc_status blocks_forward(gpt_model *m, const gpc_tensor *tokens, int start, int B, int T) {
    const gpt_config *c = &m->config;
    gpt_tensors *p = &m->params;
    size_t at = (size_t)start * (size_t)c->channels;
    gpc_tensor encoded = view(&m->acts.encoded, at, 3, B, T, c->channels);
    gpc_tensor wpe = view(&p->wpe, at, 2, c->max_context - start, c->channels, 0);
    GPC_TRY(weights_ready(m, GPT_OFFLOAD_EMBEDDING));
    /* a later pipeline stage's input is in encoded already */
    if (m->par.pp_rank == 0 && m->tp_size == 1)
        GPC_TRY(gpc_op_embedding_forward(&encoded, tokens, &p->wte, &wpe));
    if (m->par.pp_rank == 0 && m->tp_size > 1) {
        /* vocabulary-parallel: each rank embeds the tokens of its rows
         * (zero for the others), rank 0 adds the positions, and the sum
         * over the ranks is the embedding (the zeros add exactly) */
        GPC_TRY(gpc_op_embedding_slice_forward(&encoded, tokens, &p->wte,
                                               m->tp_rank == 0 ? &wpe : NULL, vocab_row0(m)));
        GPC_TRY(tp_sum(m, &encoded));
    }
    return blocks_range(m, start, B, T, 0, c->layers, 0);
}

/* Embedding, the blocks and the final layernorm of a whole batch: lnf
 * [B,T,C], the output head's input. tokens: [B,T] i32 on the model's device. */
static gpc_status forward_to_lnf(gpt_model *m, const gpc_tensor *tokens, int B, int T) {
    m->cached_len = 0; /* qkv is overwritten from position 0 */
    GPC_TRY(blocks_forward(m, tokens, 0, B, T));
    m->last_B = B;
    m->last_T = T;
    return GPC_OK;
}

/* forward_to_lnf and the head's product: logits [B,T,Vp], or a tp rank's
 * [B,T,Vp/tp] of its vocabulary rows. */
static gpc_status forward_to_logits(gpt_model *m, const gpc_tensor *tokens, int B, int T) {
    GPC_TRY(forward_to_lnf(m, tokens, B, T));
    gpc_tensor lnf = view(&m->acts.lnf, 0, 3, B, T, m->config.channels);
    gpc_tensor logits = view(&m->acts.logits, 0, 3, B, T, vocab_rows(m));
    return gpc_op_matmul_forward(&logits, &lnf, &m->params.wte, NULL);
}

/* The cross-entropy of the logits [B,T,Vp/tp] into losses and, when
 * dlogits is not NULL (it may be logits), their gradient. With tp ranks it
 * runs vocabulary-parallel as Megatron-LM's: each rank's row maxima, their
 * max over the ranks, each rank's sums of exponentials and target logits,
 * their sums over the ranks, then each rank's losses (the same on every
 * rank) and gradient columns. No rank holds a whole row of logits. */
static gpc_status head_loss(gpt_model *m, gpc_tensor *losses, gpc_tensor *dlogits,
                            const gpc_tensor *logits, const gpc_tensor *tgt, int B, int T,
                            float dloss) {
    int V = m->config.vocab_size;
    if (m->tp_size == 1)
        return gpc_op_crossentropy_forward_backward(losses, dlogits, logits, tgt, V, dloss);
    int64_t N = (int64_t)B * T, col0 = vocab_row0(m);
    gpc_tensor stats = view(&m->acts.ce_stats, 0, 2, 3, N, 0);
    gpc_tensor maxes = view(&m->acts.ce_stats, 0, 1, N, 0, 0);
    gpc_tensor sums = view(&m->acts.ce_stats, (size_t)N, 1, 2 * N, 0, 0);
    GPC_TRY(gpc_op_crossentropy_slice_max(&stats, logits, col0, V));
    GPC_TRY(tp_max(m, &maxes));
    GPC_TRY(gpc_op_crossentropy_slice_sums(&stats, logits, tgt, col0, V));
    GPC_TRY(tp_sum(m, &sums));
    return gpc_op_crossentropy_slice_finish(losses, dlogits, logits, tgt, &stats, col0, V, dloss);
}

gpc_status gpt_forward(gpt_model *m, const int32_t *inputs, const int32_t *targets, int B, int T) {
    GPC_TRY(check_batch(m, B, T));
    GPC_TRY(upload_tokens(m, inputs, targets, 0, B, T));
    gpc_tensor tokens = view(&m->acts.tokens, 0, 2, B, T, 0);
    GPC_TRY(forward_to_logits(m, &tokens, B, T));
    if (!targets) return GPC_OK;
    gpc_tensor logits = view(&m->acts.logits, 0, 3, B, T, vocab_rows(m));
    gpc_tensor losses = view(&m->acts.losses, 0, 2, B, T, 0);
    gpc_tensor tgt = view(&m->acts.targets, 0, 2, B, T, 0);
    return head_loss(m, &losses, NULL, &logits, &tgt, B, T, 1.0f);
}

gpc_status gpt_mean_loss(gpt_model *m, float *loss) {
    int B = m->last_B, T = m->last_T;
    size_t n = (size_t)B * (size_t)T;
    if (n == 0 || m->last_unmasked == 0) {
        *loss = 0.0f;
        return GPC_OK;
    }
    gpc_tensor host = gpc_tensor_1d(m->host_losses, GPC_F32, gpc_cpu(), (int64_t)n);
    gpc_tensor dev = view(&m->acts.losses, 0, 1, (int64_t)n, 0, 0);
    GPC_TRY(gpc_tensor_copy(&host, &dev));
    double sum = 0.0; /* masked positions hold a loss of 0 */
    for (size_t i = 0; i < n; i++)
        sum += m->host_losses[i];
    *loss = (float)(sum / (double)m->last_unmasked);
    return GPC_OK;
}

gpc_status gpt_read_step(gpt_model *m, float *mean_loss, float *grad_norm) {
    if (!m->training)
        return gpc_error(GPC_ERR_INVALID_ARG, "this model was created for inference; it has no "
                                              "training step to read");
    /* norm_sq and loss_sum are adjacent in one buffer: one copy, one wait */
    float both[2];
    gpc_tensor host = gpc_tensor_1d(both, GPC_F32, gpc_cpu(), 2);
    gpc_tensor dev = view(&m->acts.norm_sq, 0, 1, 2, 0, 0);
    GPC_TRY(gpc_tensor_copy(&host, &dev));
    gpc_optim_observe_norm(m->optim, both[0]);
    if (mean_loss) *mean_loss = m->loss_count ? (float)(both[1] / (double)m->loss_count) : 0.0f;
    if (grad_norm) *grad_norm = gpc_optim_step_skipped(m->optim) ? NAN : sqrtf(both[0]);
    m->loss_count = 0;
    return gpc_tensor_zero(&m->acts.loss_sum);
}

/* ------------------------------------------------------------ backward */

/* Whether backward takes the two projections' bias gradients from the
 * layernorm backwards that already read the residual gradient (see
 * backward); GPC_FUSED_BIAS_GRADS=0 sums each in gpc_op_matmul_backward
 * instead (for benchmarks). */
static int fused_bias_grads(void) {
    static int fused = -1;
    if (fused < 0) fused = gpc_setting_flag("GPC_FUSED_BIAS_GRADS");
    return fused;
}

/* The key and value thirds of layer l's qkv bias gradient, without reading
 * dqkv (m->derived_qkv_bias). Adding a vector b_k to every key adds q . b_k
 * to all of a query's scores alike, which its softmax ignores: the key bias
 * has no effect, and its gradient is zero (the third stays as zeroed).
 * Adding b_v to every value adds b_v to every attention output, since each
 * row of attention weights sums to 1: its gradient is the column sums of
 * the output's gradient, dO = dproj @ W_proj, which are the projection's
 * bias gradient times W_proj. That bias gradient accumulates over the
 * micro-steps of a step and W_proj does not change within one, so setting
 * the value third from it after each micro-step keeps it the accumulated
 * gradient too. */
static gpc_status derive_qkv_bias_grad(gpt_model *m, int l, const gpc_tensor *dattprojb,
                                       const gpc_tensor *attprojw, const gpc_tensor *scratch) {
    /* with tensor parallelism: this rank's value third, from its columns of
     * W_proj (the whole dattprojb is on every rank) */
    int64_t C = m->config.channels, Cl = C / m->tp_size;
    gpc_tensor dqkvb = param_layer(&m->grads.qkvb, l, 0, 3 * Cl);
    gpc_tensor dvb = view(&dqkvb, (size_t)(2 * Cl), 2, 1, Cl, 0);
    gpc_tensor dout = view(dattprojb, 0, 2, 1, C, 0);
    gpc_tensor shape = view(scratch, 0, 2, 1, Cl, 0); /* only its shape is read */
    return gpc_op_matmul_backward(&dvb, NULL, NULL, &dout, &shape, attprojw);
}

static gpc_status backward(gpt_model *m, const gpc_tensor *tokens, int B, int T) {
    /* frozen: a LoRA model's base, whose weights get no gradient (NULL
     * skips each product; the layernorms write theirs to a discarded
     * scratch, since their op computes them with the input's gradient) */
    const int frozen = m->lora.options.rank > 0;
    const int fused = fused_bias_grads() && !frozen, derived = m->derived_qkv_bias && !frozen;
    const gpt_config *c = &m->config;
    gpt_activations *a = &m->acts;
    gpt_tensors *p = &m->params, *g = &m->grads;
    int L = c->layers, NH = c->heads / m->tp_size; /* this rank's heads */
    int64_t C = c->channels, Cl = C / m->tp_size, F = 4 * C / m->tp_size;

    gpc_tensor dresidual = view(&a->dresidual, 0, 3, B, T, C);
    gpc_tensor dbtc = view(&a->dbtc, 0, 3, B, T, C);
    gpc_tensor datty = view(&a->dbtc, 0, 3, B, T, Cl);
    gpc_tensor dfch = view(&a->dbt4c, 0, 3, B, T, F);
    gpc_tensor dqkv = view(&a->dbt4c, 0, 3, B, T, 3 * Cl);
    /* the head's backward products ran in forward_backward's
     * gpc_op_classifier: dbtc holds the gradient of lnf, and wte's gradient
     * has the head's part added. A pipeline stage before the last starts
     * from dresidual as the next stage sent it. */
    if (m->par.pp_rank == m->par.pp_size - 1) {
        GPC_TRY(gpc_tensor_zero(&dresidual));
        gpc_tensor residual = act_layer(m, &a->residual3, L - 1, B, T, C);
        gpc_tensor mean = view(&a->lnf_mean, 0, 2, B, T, 0);
        gpc_tensor rstd = view(&a->lnf_rstd, 0, 2, B, T, 0);
        gpc_tensor dw = frozen ? view(&m->lora.dln, 0, 1, C, 0, 0) : g->lnfw;
        gpc_tensor db = frozen ? view(&m->lora.dln, (size_t)C, 1, C, 0, 0) : g->lnfb;
        GPC_TRY(gpc_op_layernorm_backward(&dresidual, &dw, &db, NULL, &dbtc, &residual, &p->lnfw,
                                          &mean, &rstd));
    }
    if (m->grad_ready) GPC_TRY(m->grad_ready(m->grad_ready_user, L));
    gpc_tensor encoded = view(&a->encoded, 0, 3, B, T, C);
    for (int l = L - 1; l >= 0; l--) {
        /* here dresidual is the gradient of residual3[l] */
        gpc_tensor residual = l == 0 ? encoded : act_layer(m, &a->residual3, l - 1, B, T, C);
        int k = kept_layer(m, l, 3);
        gpc_tensor ln1 = act_layer(m, &a->ln1, kept_layer(m, l, 2), B, T, C);
        gpc_tensor ln1_mean = stat_layer(m, &a->ln1_mean, k, B, T);
        gpc_tensor ln1_rstd = stat_layer(m, &a->ln1_rstd, k, B, T);
        gpc_tensor qkv = act_layer(m, &a->qkv, k, B, T, 3 * Cl);
        gpc_tensor atty = act_layer(m, &a->atty, k, B, T, Cl);
        gpc_tensor lse = lse_layer(m, l, B, T);
        gpc_tensor residual2 = act_layer(m, &a->residual2, k, B, T, C);
        gpc_tensor ln2 = act_layer(m, &a->ln2, kept_layer(m, l, 2), B, T, C);
        gpc_tensor ln2_mean = stat_layer(m, &a->ln2_mean, k, B, T);
        gpc_tensor ln2_rstd = stat_layer(m, &a->ln2_rstd, k, B, T);
        gpc_tensor fch = act_layer(m, &a->fch, k, B, T, F);
        gpc_tensor fch_gelu = act_layer(m, &a->fch_gelu, kept_layer(m, l, 1), B, T, F);

        gpc_tensor ln1w = param_layer(&p->ln1w, l, 0, C);
        gpc_tensor qkvw = param_layer(&p->qkvw, l, 3 * Cl, C);
        gpc_tensor attprojw = param_layer(&p->attprojw, l, C, Cl);
        gpc_tensor ln2w = param_layer(&p->ln2w, l, 0, C);
        gpc_tensor fcw = param_layer(&p->fcw, l, F, C);
        gpc_tensor fcprojw = param_layer(&p->fcprojw, l, C, F);

        gpc_tensor dln1w = param_layer(&g->ln1w, l, 0, C), dln1b = param_layer(&g->ln1b, l, 0, C);
        gpc_tensor dqkvw = param_layer(&g->qkvw, l, 3 * Cl, C);
        gpc_tensor dqkvb = param_layer(&g->qkvb, l, 0, 3 * Cl);
        gpc_tensor dattprojw = param_layer(&g->attprojw, l, C, Cl);
        gpc_tensor dattprojb = param_layer(&g->attprojb, l, 0, C);
        gpc_tensor dln2w = param_layer(&g->ln2w, l, 0, C), dln2b = param_layer(&g->ln2b, l, 0, C);
        gpc_tensor dfcw = param_layer(&g->fcw, l, F, C);
        gpc_tensor dfcb = param_layer(&g->fcb, l, 0, F);
        gpc_tensor dfcprojw = param_layer(&g->fcprojw, l, C, F);
        gpc_tensor dfcprojb = param_layer(&g->fcprojb, l, 0, C);
        if (frozen) {
            dln1w = dln2w = view(&m->lora.dln, 0, 1, C, 0, 0);
            dln1b = dln2b = view(&m->lora.dln, (size_t)C, 1, C, 0, 0);
        }
#define GRAD(t) (frozen ? NULL : &(t))

        /* Recomputation rebuilds this layer's dropped activations from what
         * was kept (the same ops as forward, so the same values): the whole
         * block from its input, or the GELU and layernorm outputs. */
        const int block = recomputed(m, l, 3);
        if (block) GPC_TRY(blocks_range(m, 0, B, T, l, l + 1, 1));
        if (!block && recomputed(m, l, 1)) GPC_TRY(gpc_op_gelu_forward(&fch_gelu, &fch));
        if (!block && recomputed(m, l, 2)) {
            gpc_tensor ln2b = param_layer(&p->ln2b, l, 0, C);
            GPC_TRY(gpc_op_layernorm_forward(&ln2, &ln2_mean, &ln2_rstd, &residual2, &ln2w, &ln2b));
        }
        /* MLP: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))). With
         * fused bias gradients, fcproj's comes from ln2's backward (the column
         * sums of dresidual as it enters), so that gradient is not read again
         * for it; attproj's likewise from ln1's. fc's bias gradient, the
         * column sums of dfch, comes with dfch itself. */
        if (lora_on(m, 3)) { /* the adapter's input gradient joins before gelu' */
            GPC_TRY(gpc_op_matmul_backward(&dfch, NULL, NULL, &dresidual, &fch_gelu, &fcprojw));
            GPC_TRY(lora_backward(m, 3, l, B, T, &dresidual, &fch_gelu, &dfch));
            GPC_TRY(gpc_op_gelu_backward(&dfch, &fch, &dfch));
        } else {
            GPC_TRY(gpc_op_matmul_backward_dgelu(&dfch, GRAD(dfcprojw),
                                                 fused || frozen ? NULL : &dfcprojb, GRAD(dfcb),
                                                 &dresidual, &fch_gelu, &fcprojw, &fch));
        }
        GPC_TRY(gpc_op_matmul_backward(&dbtc, GRAD(dfcw), NULL, &dfch, &ln2, &fcw));
        GPC_TRY(lora_backward(m, 2, l, B, T, &dfch, &ln2, &dbtc));
        GPC_TRY(tp_sum(m, &dbtc)); /* ln2's gradient: the ranks' units summed */
        GPC_TRY(gpc_op_layernorm_backward(&dresidual, &dln2w, &dln2b, fused ? &dfcprojb : NULL,
                                          &dbtc, &residual2, &ln2w, &ln2_mean, &ln2_rstd));
        /* attention: residual2 = residual + attproj(attention(qkv(ln1(residual)))) */
        GPC_TRY(gpc_op_matmul_backward(&datty, GRAD(dattprojw), fused || frozen ? NULL : &dattprojb,
                                       &dresidual, &atty, &attprojw));
        GPC_TRY(lora_backward(m, 1, l, B, T, &dresidual, &atty, &datty));
        GPC_TRY(gpc_op_attention_backward(&dqkv, &datty, &qkv, &atty, &lse, NH));
        if (!block && recomputed(m, l, 2)) {
            gpc_tensor ln1b = param_layer(&p->ln1b, l, 0, C);
            GPC_TRY(gpc_op_layernorm_forward(&ln1, &ln1_mean, &ln1_rstd, &residual, &ln1w, &ln1b));
        }
        GPC_TRY(gpc_op_matmul_backward(&dbtc, GRAD(dqkvw), derived || frozen ? NULL : &dqkvb, &dqkv,
                                       &ln1, &qkvw));
        GPC_TRY(lora_backward(m, 0, l, B, T, &dqkv, &ln1, &dbtc));
        GPC_TRY(tp_sum(m, &dbtc)); /* ln1's gradient: the ranks' heads summed */
#undef GRAD
        if (derived) {
            gpc_tensor dqb = view(&dqkvb, 0, 1, Cl, 0, 0);
            GPC_TRY(gpc_op_column_sums(&dqb, &dqkv, 0));
        }
        GPC_TRY(gpc_op_layernorm_backward(&dresidual, &dln1w, &dln1b, fused ? &dattprojb : NULL,
                                          &dbtc, &residual, &ln1w, &ln1_mean, &ln1_rstd));
        if (derived) GPC_TRY(derive_qkv_bias_grad(m, l, &dattprojb, &attprojw, &dbtc));
        if (m->grad_ready) GPC_TRY(m->grad_ready(m->grad_ready_user, l));
    }
    /* a later pipeline stage leaves its input's gradient in dresidual;
     * dresidual is whole on every tp rank, which adds to its wte rows only */
    if (!frozen && m->par.pp_rank == 0 && m->tp_size == 1)
        GPC_TRY(gpc_op_embedding_backward(&g->wte, &g->wpe, &dresidual, tokens));
    if (!frozen && m->par.pp_rank == 0 && m->tp_size > 1)
        GPC_TRY(
            gpc_op_embedding_slice_backward(&g->wte, &g->wpe, &dresidual, tokens, vocab_row0(m)));
    return m->grad_ready ? m->grad_ready(m->grad_ready_user, -1) : GPC_OK;
}

/* A training micro-step on tokens and targets ([B,T] i32) on the device;
 * m->last_unmasked counts the targets that are not -1. */
static gpc_status head_backward(gpt_model *m, const gpc_tensor *tgt, int B, int T, float dloss);

static gpc_status forward_backward(gpt_model *m, const gpc_tensor *tokens, const gpc_tensor *tgt,
                                   int B, int T, float dloss) {
    GPC_TRY(forward_to_lnf(m, tokens, B, T));
    GPC_TRY(head_backward(m, tgt, B, T, dloss));
    return backward(m, tokens, B, T);
}

/* The output head of a training step, after forward_to_lnf: losses summed
 * into loss_sum, lnf's gradient into dbtc, wte's gradient +=. */
static gpc_status head_backward(gpt_model *m, const gpc_tensor *tgt, int B, int T, float dloss) {
    const gpt_config *c = &m->config;
    gpt_activations *a = &m->acts;
    gpc_tensor lnf = view(&a->lnf, 0, 3, B, T, c->channels);
    gpc_tensor logits = view(&a->logits, 0, 3, B, T, vocab_rows(m));
    gpc_tensor losses = view(&a->losses, 0, 2, B, T, 0);
    gpc_tensor dlnf = view(&a->dbtc, 0, 3, B, T, c->channels);
    /* The output head in one op: logits = lnf . wte^T, the losses and their
     * gradient, then lnf's gradient into dbtc (where backward starts) and
     * wte's gradient +=. The logits buffer is its scratch: a backend that
     * fuses the head never stores the logits' gradient. fp16 gradients would
     * underflow: the loss is scaled up here and the gradients scaled back
     * down inside the AdamW step. */
    float scaled = dloss * gpc_optim_loss_scale(m->optim);
    if (m->tp_size > 1) {
        /* vocabulary-parallel: this rank's logits, loss and their gradient
         * (in place), its rows' wte gradient, and its part of lnf's
         * gradient, summed over the ranks (Megatron's f in backward) */
        GPC_TRY(gpc_op_matmul_forward(&logits, &lnf, &m->params.wte, NULL));
        GPC_TRY(head_loss(m, &losses, &logits, &logits, tgt, B, T, scaled));
        GPC_TRY(gpc_op_matmul_backward(&dlnf, &m->grads.wte, NULL, &logits, &lnf, &m->params.wte));
        GPC_TRY(tp_sum(m, &dlnf));
    } else if (m->lora.options.rank) { /* a frozen head: its three ops without wte's gradient */
        GPC_TRY(gpc_op_matmul_forward(&logits, &lnf, &m->params.wte, NULL));
        GPC_TRY(gpc_op_crossentropy_forward_backward(&losses, &logits, &logits, tgt, c->vocab_size,
                                                     scaled));
        GPC_TRY(gpc_op_matmul_backward(&dlnf, NULL, NULL, &logits, &lnf, &m->params.wte));
    } else {
        GPC_TRY(gpc_op_classifier(&losses, &dlnf, &m->grads.wte, &logits, &lnf, &m->params.wte, tgt,
                                  c->vocab_size, scaled));
    }
    /* masked rows have loss 0, so the plain sum is the sum over real targets */
    GPC_TRY(gpc_op_sum(&m->acts.loss_sum, &losses));
    m->loss_count += m->last_unmasked;
    return GPC_OK;
}

gpc_status gpt_forward_backward(gpt_model *m, const int32_t *inputs, const int32_t *targets, int B,
                                int T, float dloss) {
    if (!m->training)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "this model was created for inference; create it with training on");
    if (!targets) return gpc_error(GPC_ERR_INVALID_ARG, "a training step needs targets");
    GPC_TRY(check_batch(m, B, T));
    GPC_TRY(gpc_optim_resolve(m->optim));
    GPC_TRY(upload_tokens(m, inputs, targets, 0, B, T));
    gpc_tensor tokens = view(&m->acts.tokens, 0, 2, B, T, 0);
    gpc_tensor tgt = view(&m->acts.targets, 0, 2, B, T, 0);
    return forward_backward(m, &tokens, &tgt, B, T, dloss);
}

/* A token tensor the model can read as it is: [B,T] i32 on its device. */
static gpc_status check_tokens(const gpt_model *m, const char *name, const gpc_tensor *t) {
    if (!t || !t->data || t->dtype != GPC_I32 || t->ndim != 2 || t->device.type != m->device.type ||
        t->device.index != m->device.index) {
        char text[96];
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s must be a [B, T] i32 tensor on %s, not %s; give host tokens to "
                         "gpt_forward_backward instead",
                         name, gpc_device_name(m->device),
                         t ? gpc_tensor_describe(t, text, sizeof text) : "none");
    }
    return GPC_OK;
}

gpc_status gpt_forward_backward_device(gpt_model *m, const gpc_tensor *inputs,
                                       const gpc_tensor *targets, int64_t unmasked, float dloss) {
    if (!m->training)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "this model was created for inference; create it with training on");
    GPC_TRY(check_tokens(m, "inputs", inputs));
    GPC_TRY(check_tokens(m, "targets", targets));
    if (inputs->shape[0] != targets->shape[0] || inputs->shape[1] != targets->shape[1])
        return gpc_error(GPC_ERR_MISMATCH, "inputs are [%lld, %lld] but targets [%lld, %lld]",
                         (long long)inputs->shape[0], (long long)inputs->shape[1],
                         (long long)targets->shape[0], (long long)targets->shape[1]);
    if (inputs->shape[0] > m->B || inputs->shape[1] > m->T)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "batch %lld x %lld is outside what the model was planned for (%d x %d)",
                         (long long)inputs->shape[0], (long long)inputs->shape[1], m->B, m->T);
    int B = (int)inputs->shape[0], T = (int)inputs->shape[1];
    GPC_TRY(check_batch(m, B, T));
    if (unmasked < 0 || unmasked > (int64_t)B * T)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%lld unmasked targets in a batch of %d x %d positions: count the "
                         "targets that are not -1",
                         (long long)unmasked, B, T);
    GPC_TRY(gpc_optim_resolve(m->optim));
    m->last_unmasked = unmasked;
    return forward_backward(m, inputs, targets, B, T, dloss);
}

gpc_status gpt_zero_grad(gpt_model *m) {
    if (!m->training) return GPC_OK;
    if (m->lora.options.rank) {
        /* the discarded layernorm gradients too, so that their sums never
         * grow to infinity over a long run */
        GPC_TRY(gpc_tensor_zero(&m->lora.dln));
        return gpc_tensor_zero(&m->lora.grads_flat);
    }
    return gpc_tensor_zero(&m->grads_flat);
}

/* ------------------------------------------------------------ pipeline */

static gpc_status check_stage(const gpt_model *m, int slot, int B, int T) {
    if (!m->training)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "this model was created for inference; create it with training on");
    if (slot < 0 || slot >= m->par.slots)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "activation slot %d is outside the %d the stage was planned with", slot,
                         m->par.slots);
    return check_batch(m, B, T);
}

gpc_status gpt_stage_forward(gpt_model *m, int slot, const int32_t *inputs, const int32_t *targets,
                             int B, int T) {
    GPC_TRY(check_stage(m, slot, B, T));
    if (!inputs || !targets)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "a pipeline stage's forward needs inputs and targets");
    GPC_TRY(gpc_optim_resolve(m->optim));
    m->acts = m->slot_acts[slot];
    GPC_TRY(upload_tokens(m, inputs, targets, 0, B, T));
    m->slot_unmasked[slot] = m->last_unmasked;
    gpc_tensor tokens = view(&m->acts.tokens, 0, 2, B, T, 0);
    return forward_to_lnf(m, &tokens, B, T);
}

gpc_status gpt_stage_backward(gpt_model *m, int slot, int B, int T, float dloss) {
    GPC_TRY(check_stage(m, slot, B, T));
    m->acts = m->slot_acts[slot];
    m->last_unmasked = m->slot_unmasked[slot];
    gpc_tensor tokens = view(&m->acts.tokens, 0, 2, B, T, 0);
    if (m->par.pp_rank == m->par.pp_size - 1) {
        gpc_tensor tgt = view(&m->acts.targets, 0, 2, B, T, 0);
        GPC_TRY(head_backward(m, &tgt, B, T, dloss));
    }
    return backward(m, &tokens, B, T);
}

gpc_status gpt_stage_loss(gpt_model *m, int slot, int B, int T, float *loss) {
    GPC_TRY(check_stage(m, slot, B, T));
    if (m->par.pp_rank != m->par.pp_size - 1)
        return gpc_error(GPC_ERR_INVALID_ARG, "only the last pipeline stage has the head and "
                                              "computes losses");
    m->acts = m->slot_acts[slot];
    m->last_unmasked = m->slot_unmasked[slot];
    const gpt_config *c = &m->config;
    gpc_tensor lnf = view(&m->acts.lnf, 0, 3, B, T, c->channels);
    gpc_tensor logits = view(&m->acts.logits, 0, 3, B, T, vocab_rows(m));
    gpc_tensor losses = view(&m->acts.losses, 0, 2, B, T, 0);
    gpc_tensor tgt = view(&m->acts.targets, 0, 2, B, T, 0);
    GPC_TRY(gpc_op_matmul_forward(&logits, &lnf, &m->params.wte, NULL));
    GPC_TRY(head_loss(m, &losses, NULL, &logits, &tgt, B, T, 1.0f));
    return gpt_mean_loss(m, loss);
}

gpc_tensor gpt_stage_input(const gpt_model *m, int slot, int B, int T) {
    return view(&m->slot_acts[slot].encoded, 0, 3, B, T, m->config.channels);
}

gpc_tensor gpt_stage_output(const gpt_model *m, int slot, int B, int T) {
    return act_layer(m, &m->slot_acts[slot].residual3, m->config.layers - 1, B, T,
                     m->config.channels);
}

gpc_tensor gpt_stage_grad(const gpt_model *m, int B, int T) {
    return view(&m->slot_acts[0].dresidual, 0, 3, B, T, m->config.channels);
}

gpc_tensor gpt_stage_tied_grad(const gpt_model *m) {
    return m->grads.wte;
}

const gpt_parallel *gpt_parallel_of(const gpt_model *m) {
    return &m->par;
}

const gpt_config *gpt_whole_config(const gpt_model *m) {
    return &m->whole;
}

void gpt_set_pp_reduce(gpt_model *m, gpt_tp_reduce_fn fn, void *user) {
    m->pp_reduce = fn;
    m->pp_reduce_user = fn ? user : NULL;
}

/* ------------------------------------------------------------ update */

/* Whether a pipeline stage counts tensor i in the gradient norm: wte and
 * wpe on the first stage (the last stage's wte gradient is the same sum),
 * lnf on the last, the blocks everywhere. */
static int stage_owns(const gpt_model *m, int i) {
    if (i <= 1) return m->par.pp_rank == 0;
    if (i >= 14) return m->par.pp_rank == m->par.pp_size - 1;
    return 1;
}

/* The squared gradient norm of the span [begin, end) of a part's local
 * layout, as the whole model's: the sliced tensors' squares summed over
 * the tp ranks, then the replicated tensors' added once (every tp rank
 * holds the same replicated gradients), then the stages' summed. */
static gpc_status part_norm_sq(gpt_model *m, size_t begin, size_t end, gpc_tensor *norm_sq) {
    GPC_TRY(gpc_optim_norm_sq(m->optim, &m->grads_flat, begin, begin, norm_sq)); /* zero */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++) {
            if (gpt_tp_sliced(i) != (pass == 0) || !stage_owns(m, i)) continue;
            size_t lo = m->param_offset[i];
            size_t hi = gpt_param_end(m, i);
            if (lo < begin) lo = begin;
            if (hi > end) hi = end;
            if (lo >= hi) continue;
            gpc_tensor g = view(&m->grads_flat, lo, 1, (int64_t)(hi - lo), 0, 0);
            GPC_TRY(gpc_op_sum_squares(norm_sq, &g));
        }
        if (pass == 0) GPC_TRY(tp_sum(m, norm_sq));
    }
    if (m->par.pp_size == 1) return GPC_OK;
    if (!m->pp_reduce)
        return gpc_error(GPC_ERR_INVALID_ARG, "a pipeline stage needs its sum over the stages: "
                                              "set it with gpt_set_pp_reduce");
    return m->pp_reduce(m->pp_reduce_user, norm_sq);
}

gpc_status gpt_update_span(gpt_model *m, const gpc_optim_options *o, size_t begin, size_t end,
                           gpt_norm_reduce_fn reduce, void *user, float *grad_norm, int *skipped) {
    m->cached_len = 0; /* kept keys and values belong to the old weights */
    if (!m->training)
        return gpc_error(GPC_ERR_INVALID_ARG, "this model was created for inference; it has no "
                                              "optimizer state");
    gpc_tensor *norm_sq = &m->acts.norm_sq;
    if (m->lora.options.rank) {
        /* the adapters' buffers, whole: the base has no optimizer state */
        if (begin != 0 || end != m->num_params || reduce)
            return gpc_error(GPC_ERR_UNSUPPORTED,
                             "a LoRA model trains in one process; data parallelism over "
                             "adapters is not supported yet (train without --lora or on one "
                             "device)");
        GPC_TRY(gpc_optim_norm_sq(m->optim, &m->lora.grads_flat, 0, m->lora.num_params, norm_sq));
        return gpc_optim_step(m->optim, &m->lora.params_flat, &m->lora.grads_flat, 0,
                              m->lora.num_params, norm_sq, o, grad_norm, skipped);
    }
    if (gpt_is_part(m))
        GPC_TRY(part_norm_sq(m, begin, end, norm_sq));
    else
        GPC_TRY(gpc_optim_norm_sq(m->optim, &m->grads_flat, begin, end, norm_sq));
    if (reduce) GPC_TRY(reduce(user, norm_sq));
    /* norm_sq is left holding the global squared norm, for gpt_read_step */
    return gpc_optim_step(m->optim, &m->params_flat, &m->grads_flat, begin, end, norm_sq, o,
                          grad_norm, skipped);
}

gpc_status gpt_update(gpt_model *m, const gpc_optim_options *o, float *grad_norm, int *skipped) {
    if (gpt_is_sharded(m))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "this model holds the optimizer state of elements [%zu, %zu) only "
                         "(ZeRO-1); update it with gpc_ddp_update, which steps every shard",
                         m->shard_offset, m->shard_offset + m->shard_count);
    return gpt_update_span(m, o, 0, m->num_params, NULL, NULL, grad_norm, skipped);
}

/* ------------------------------------------------------------ inference */

/* Copies row r of the logits [rows, Vp] (compute dtype) into out[V] as f32.
 * With tp ranks each holds [rows, Vp/tp]: every rank calls it, and the
 * row's slices are gathered into logits_full (each placed among zeros, then
 * summed over the ranks), since a sampler needs the whole row. */
static gpc_status logits_row(gpt_model *m, size_t r, float *out) {
    int Vp = m->config.padded_vocab, V = m->config.vocab_size;
    int64_t rows = vocab_rows(m);
    gpc_tensor dev = view(&m->acts.logits, r * (size_t)rows, 1, rows, 0, 0);
    if (m->tp_size > 1) {
        gpc_tensor full = view(&m->acts.logits_full, 0, 1, m->tp_size * rows, 0, 0);
        gpc_tensor mine = view(&m->acts.logits_full, (size_t)vocab_row0(m), 1, rows, 0, 0);
        GPC_TRY(gpc_tensor_zero(&full));
        GPC_TRY(gpc_tensor_copy(&mine, &dev));
        GPC_TRY(tp_sum(m, &full));
        dev = view(&m->acts.logits_full, 0, 1, Vp, 0, 0);
    }
    gpc_tensor host = gpc_tensor_1d(m->host_row, m->dtype, gpc_cpu(), Vp);
    GPC_TRY(gpc_tensor_copy(&host, &dev));
    const uint16_t *half = m->host_row;
    for (int v = 0; v < V; v++)
        out[v] = m->dtype == GPC_F32    ? ((const float *)m->host_row)[v]
                 : m->dtype == GPC_BF16 ? gpc_bf16_to_f32(half[v])
                                        : gpc_f16_to_f32(half[v]);
    return GPC_OK;
}

gpc_status gpt_forward_last_logits(gpt_model *m, const int32_t *inputs, int B, int T,
                                   float *logits_out) {
    GPC_TRY(gpt_forward(m, inputs, NULL, B, T));
    for (int b = 0; b < B; b++)
        GPC_TRY(logits_row(m, (size_t)b * T + (size_t)(T - 1),
                           logits_out + (size_t)b * m->config.vocab_size));
    return GPC_OK;
}

gpc_status gpt_forward_cached(gpt_model *m, const int32_t *tokens, int start, int n,
                              float *logits_out) {
    if (start < 0 || n < 1 || start > m->T - n)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "positions %d..%d are outside the model's context of %d", start,
                         start + n - 1, m->T);
    if (start > m->cached_len)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "position %d follows positions that are not kept (only %d are); start "
                         "at %d or earlier",
                         start, m->cached_len, m->cached_len);
    const gpt_config *c = &m->config;
    int end = start + n;
    int64_t C = c->channels;
    m->cached_len = start; /* until the rows below are all written */
    GPC_TRY(upload_tokens(m, tokens, NULL, start, 1, n));
    /* Blocks recomputed whole share one slot of qkv, so the keys and values
     * of earlier positions are overwritten by the next such block: run the
     * sequence again from position 0 (its tokens stay in the token buffer).
     * Only training models recompute, so generation never pays this. */
    int from = recomputed(m, 0, 3) ? 0 : start;
    gpc_tensor tok = view(&m->acts.tokens, (size_t)from, 2, 1, end - from, 0);
    GPC_TRY(blocks_forward(m, &tok, from, 1, end - from));
    /* the head on the last position only, into logits row 0 */
    gpc_tensor lnf = view(&m->acts.lnf, (size_t)(end - 1) * (size_t)C, 3, 1, 1, C);
    gpc_tensor logits = view(&m->acts.logits, 0, 3, 1, 1, vocab_rows(m));
    GPC_TRY(gpc_op_matmul_forward(&logits, &lnf, &m->params.wte, NULL));
    m->last_B = 1;
    m->last_T = 1;
    m->last_unmasked = 0;
    GPC_TRY(logits_row(m, 0, logits_out));
    m->cached_len = end;
    return GPC_OK;
}

gpc_status gpt_copy_logits(gpt_model *m, float *out) {
    size_t rows = (size_t)m->last_B * (size_t)m->last_T;
    for (size_t r = 0; r < rows; r++)
        GPC_TRY(logits_row(m, r, out + r * (size_t)m->config.vocab_size));
    return GPC_OK;
}

/* ------------------------------------------------------------ accessors */

const gpt_config *gpt_get_config(const gpt_model *m) {
    return &m->config;
}

gpc_device gpt_device(const gpt_model *m) {
    return m->device;
}

gpc_dtype gpt_dtype(const gpt_model *m) {
    return m->dtype;
}

int gpt_is_training(const gpt_model *m) {
    return m->training;
}

int gpt_batch(const gpt_model *m) {
    return m->B;
}

int gpt_context(const gpt_model *m) {
    return m->T;
}

int gpt_recompute(const gpt_model *m) {
    return m->recompute;
}

size_t gpt_num_params(const gpt_model *m) {
    return m->num_params;
}

const size_t *gpt_param_offsets(const gpt_model *m) {
    return m->param_offset;
}

int gpt_cached_len(const gpt_model *m) {
    return m->cached_len;
}

const gpc_tensor *gpt_params_flat(const gpt_model *m) {
    return &m->params_flat;
}

const gpc_tensor *gpt_grads_flat(const gpt_model *m) {
    return &m->grads_flat;
}

void gpt_shard_range(const gpt_model *m, size_t *offset, size_t *count) {
    *offset = m->shard_offset;
    *count = m->shard_count;
}

const gpc_optim *gpt_optimizer(const gpt_model *m) {
    return m->optim;
}

int gpt_tp_size(const gpt_model *m) {
    return m->tp_size;
}

int gpt_tp_rank(const gpt_model *m) {
    return m->tp_rank;
}

void gpt_set_tp_reduce(gpt_model *m, gpt_tp_reduce_fn fn, void *user) {
    m->tp_reduce = fn;
    m->tp_reduce_user = fn ? user : NULL;
}

void gpt_set_tp_max(gpt_model *m, gpt_tp_reduce_fn fn, void *user) {
    m->tp_max = fn;
    m->tp_max_user = fn ? user : NULL;
}

void gpt_set_grad_ready(gpt_model *m, gpt_grad_ready_fn fn, void *user) {
    m->grad_ready = fn;
    m->grad_ready_user = fn ? user : NULL;
}

float gpt_loss_scale(const gpt_model *m) {
    return gpc_optim_loss_scale(m->optim);
}

void gpt_set_loss_scale(gpt_model *m, float scale) {
    gpc_optim_set_loss_scale(m->optim, scale);
}

int gpt_step_skipped(const gpt_model *m) {
    return gpc_optim_step_skipped(m->optim);
}
