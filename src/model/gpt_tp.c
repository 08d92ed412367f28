/*
 * gpt_tp.c: the parameter layout of a tensor-parallel GPT (Megatron-LM,
 * Shoeybi et al. 2019) and the copies between it and the whole model's.
 *
 * Rank r of tp ranks holds, in every block, the column slices of qkvw and
 * fcw (its heads' query, key and value rows; its quarter of the MLP's
 * hidden units) and the row slices of attprojw and fcprojw (the input
 * columns those heads and units feed), and Vl = ceil(Vp/tp) (rounded up to
 * 8, 16-byte rows of logits) rows of wte from r Vl on (the
 * vocabulary-parallel embedding and head). Where tp does not divide the
 * padded vocabulary Vp, the last rank's slice runs past it: those rows
 * stay zero (a token never reaches them and their logits are padding, so
 * their gradient is zero) and no checkpoint holds them, so a checkpoint
 * keeps the whole model's Vp at any tp. Everything else is replicated. The
 * local flat buffer keeps llm.c's tensor order with the sliced tensors
 * narrower, so the data-parallel buckets, the optimizer's ranges and the
 * gradient-ready hook work on it unchanged.
 *
 * Checkpoints hold the whole model: gpt_tp_slice cuts a rank's part out of
 * it and gpt_tp_unslice puts a part back, so a run saved at one tp size
 * resumes at any other.
 */
#include "model/gpt_internal.h"

#include <string.h>

/* How one layer's slice of tensor i is cut: the layer's matrix is
 * [rows, cols] (cols 1 for a vector); its rows form `parts` equal blocks
 * (qkv's query, key and value), each cut into tp row ranges when
 * split_rows; or its columns are cut into tp ranges when split_cols. */
typedef struct {
    int64_t rows, cols;
    int parts, split_rows, split_cols;
} tp_cut;

static tp_cut cut_of(const gpt_config *c, int i) {
    int64_t C = c->channels;
    switch (i) {
    case 4:
        return (tp_cut){3 * C, C, 3, 1, 0}; /* qkvw */
    case 5:
        return (tp_cut){3 * C, 1, 3, 1, 0}; /* qkvb */
    case 6:
        return (tp_cut){C, C, 1, 0, 1}; /* attprojw */
    case 10:
        return (tp_cut){4 * C, C, 1, 1, 0}; /* fcw */
    case 11:
        return (tp_cut){4 * C, 1, 1, 1, 0}; /* fcb */
    case 12:
        return (tp_cut){C, 4 * C, 1, 0, 1}; /* fcprojw */
    default:
        return (tp_cut){0, 0, 1, 0, 0}; /* replicated */
    }
}

int gpt_tp_sliced(int index) {
    return index == 0 || index == 4 || index == 5 || index == 6 || index == 10 || index == 11 ||
           index == 12;
}

int64_t gpt_tp_vocab_rows(const gpt_config *c, int tp) {
    int64_t rows = (c->padded_vocab + tp - 1) / tp;
    return tp == 1 ? rows : (rows + 7) / 8 * 8;
}

void gpt_param_shapes(const gpt_config *c, int tp, int64_t shapes[GPT_NUM_PARAM_TENSORS][3],
                      int ndims[GPT_NUM_PARAM_TENSORS]) {
    int64_t L = c->layers, C = c->channels, Cl = C / tp, F = 4 * C / tp;
    const int64_t table[GPT_NUM_PARAM_TENSORS][3] = {{gpt_tp_vocab_rows(c, tp), C, 0},
                                                     {c->max_context, C, 0},
                                                     {L, C, 0},
                                                     {L, C, 0},
                                                     {L, 3 * Cl, C},
                                                     {L, 3 * Cl, 0},
                                                     {L, C, Cl},
                                                     {L, C, 0},
                                                     {L, C, 0},
                                                     {L, C, 0},
                                                     {L, F, C},
                                                     {L, F, 0},
                                                     {L, C, F},
                                                     {L, C, 0},
                                                     {C, 0, 0},
                                                     {C, 0, 0}};
    for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++) {
        ndims[i] = table[i][2] ? 3 : table[i][1] ? 2 : 1;
        for (int d = 0; d < 3; d++)
            shapes[i][d] = table[i][d];
    }
}

void gpt_param_layout(const gpt_config *c, int tp, size_t off[GPT_NUM_PARAM_TENSORS + 1]) {
    int64_t shapes[GPT_NUM_PARAM_TENSORS][3];
    int ndims[GPT_NUM_PARAM_TENSORS];
    gpt_param_shapes(c, tp, shapes, ndims);
    off[0] = 0;
    for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++) {
        size_t n = 1;
        for (int d = 0; d < ndims[i]; d++)
            n *= (size_t)shapes[i][d];
        off[i + 1] = off[i] + n;
    }
}

gpc_status gpt_tp_check(const gpt_config *c, int tp) {
    if (tp < 1)
        return gpc_error(GPC_ERR_INVALID_ARG, "--tp %d must be 1 or more (ranks per tensor)", tp);
    if (c->heads % tp != 0)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--tp %d does not divide the model's %d attention heads: pick a tp "
                         "that divides %d",
                         tp, c->heads, c->heads);
    return GPC_OK;
}

size_t gpt_tp_num_params(const gpt_config *c, int tp) {
    size_t off[GPT_NUM_PARAM_TENSORS + 1];
    gpt_param_layout(c, tp, off);
    return off[GPT_NUM_PARAM_TENSORS];
}

/* Copies the part of tp rank r holding layers [layer0, layer0 + layers)
 * between the whole layout (full) and that part's local one: to_local 1
 * reads full, 0 writes it. */
static void copy_part(const gpt_config *c, int tp, int r, int layer0, int layers, float *full,
                      float *local, int to_local) {
    gpt_config part = *c;
    part.layers = layers;
    size_t fo[GPT_NUM_PARAM_TENSORS + 1], lo[GPT_NUM_PARAM_TENSORS + 1];
    gpt_param_layout(c, 1, fo);
    gpt_param_layout(&part, tp, lo);
    for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++) {
        int per_layer = i >= 2 && i <= 13; /* ln1w .. fcprojb carry the layer first */
        size_t full_layer = per_layer ? (fo[i + 1] - fo[i]) / (size_t)c->layers : 0;
        float *f = full + fo[i] + (size_t)layer0 * full_layer, *g = local + lo[i];
        /* a pipeline stage writes back only the embeddings (first stage)
         * and the final layernorm (last stage) that it trains */
        if (!to_local && ((i <= 1 && layer0 != 0) || (i >= 14 && layer0 + layers != c->layers)))
            continue;
        if (i == 0) { /* wte: rows [r Vl, (r+1) Vl), where the whole has them */
            int64_t rows = gpt_tp_vocab_rows(c, tp), row0 = (int64_t)r * rows;
            int64_t have = c->padded_vocab - row0 < rows ? c->padded_vocab - row0 : rows;
            if (have < 0) have = 0;
            size_t n = (size_t)(have * c->channels) * sizeof(float);
            size_t pad = (size_t)((rows - have) * c->channels) * sizeof(float);
            if (to_local) {
                memcpy(g, f + row0 * c->channels, n);
                memset((char *)g + n, 0, pad); /* rows past the whole's padding */
            } else {
                memcpy(f + row0 * c->channels, g, n);
            }
            continue;
        }
        if (!gpt_tp_sliced(i)) {
            size_t n = (lo[i + 1] - lo[i]) * sizeof(float);
            if (to_local)
                memcpy(g, f, n);
            else
                memcpy(f, g, n);
            continue;
        }
        tp_cut k = cut_of(c, i);
        int64_t part_rows = k.rows / k.parts;
        int64_t local_part_rows = k.split_rows ? part_rows / tp : part_rows;
        int64_t local_cols = k.split_cols ? k.cols / tp : k.cols;
        int64_t row0 = k.split_rows ? (int64_t)r * local_part_rows : 0;
        int64_t col0 = k.split_cols ? (int64_t)r * local_cols : 0;
        size_t local_layer = (size_t)(k.parts * local_part_rows * local_cols);
        for (int l = 0; l < (per_layer ? layers : 1); l++)
            for (int p = 0; p < k.parts; p++)
                for (int64_t row = 0; row < local_part_rows; row++) {
                    float *fr = f + (size_t)l * full_layer +
                                (size_t)((p * part_rows + row0 + row) * k.cols + col0);
                    float *lr = g + (size_t)l * local_layer +
                                (size_t)((p * local_part_rows + row) * local_cols);
                    size_t n = (size_t)local_cols * sizeof(float);
                    if (to_local)
                        memcpy(lr, fr, n);
                    else
                        memcpy(fr, lr, n);
                }
    }
}

void gpt_tp_slice(const gpt_config *c, int tp, int rank, const float *full, float *local) {
    copy_part(c, tp, rank, 0, c->layers, (float *)full, local, 1);
}

void gpt_tp_unslice(const gpt_config *c, int tp, int rank, const float *local, float *full) {
    copy_part(c, tp, rank, 0, c->layers, full, (float *)local, 0);
}

void gpt_part_slice(const gpt_config *c, const gpt_parallel *par, const float *full, float *local) {
    int layers = c->layers / par->pp_size;
    copy_part(c, par->tp_size, par->tp_rank, par->pp_rank * layers, layers, (float *)full, local,
              1);
}

void gpt_part_unslice(const gpt_config *c, const gpt_parallel *par, const float *local,
                      float *full) {
    int layers = c->layers / par->pp_size;
    copy_part(c, par->tp_size, par->tp_rank, par->pp_rank * layers, layers, full, (float *)local,
              0);
}

gpc_status gpt_parallel_check(const gpt_config *c, const gpt_parallel *par) {
    GPC_TRY(gpt_tp_check(c, par->tp_size));
    if (par->tp_rank < 0 || par->tp_rank >= par->tp_size)
        return gpc_error(GPC_ERR_INVALID_ARG, "tensor-parallel rank %d is outside 0..%d",
                         par->tp_rank, par->tp_size - 1);
    if (par->pp_size < 1)
        return gpc_error(GPC_ERR_INVALID_ARG, "--pp %d must be 1 or more (pipeline stages)",
                         par->pp_size);
    if (c->layers % par->pp_size != 0)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--pp %d does not divide the model's %d layers: pick a pp that divides "
                         "%d",
                         par->pp_size, c->layers, c->layers);
    if (par->pp_rank < 0 || par->pp_rank >= par->pp_size)
        return gpc_error(GPC_ERR_INVALID_ARG, "pipeline stage %d is outside 0..%d", par->pp_rank,
                         par->pp_size - 1);
    return GPC_OK;
}

size_t gpt_part_num_params(const gpt_config *c, const gpt_parallel *par) {
    gpt_config part = *c;
    part.layers = c->layers / par->pp_size;
    return gpt_tp_num_params(&part, par->tp_size);
}
