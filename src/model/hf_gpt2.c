/*
 * hf_gpt2.c: transformers' GPT-2 folders to and from gpc's parameters.
 *
 * transformers names a GPT-2's tensors "transformer.wte.weight",
 * "transformer.h.L.attn.c_attn.weight", ... (OpenAI's original files drop
 * the "transformer." and add the attention mask buffers "h.L.attn.bias").
 * Its Conv1D layers store their weights [in, out] and compute x W + b;
 * gpc's matrices are [out, in] (llm.c's layout, x W^T + b), so the four
 * matrix weights of each block are transposed on the way in and out. The
 * output head is tied to wte: lm_head.weight, if written at all, must equal
 * it. gpc pads the vocabulary to a multiple of 64 rows; those rows are zero
 * on the way in and dropped on the way out.
 *
 * The weights are read from the mapped files straight into the f32 layout
 * (one copy in memory besides the page cache), in parallel.
 */
#include "gpc/hf.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- the layout */

enum {
    T_WTE,
    T_WPE,
    T_LN1W,
    T_LN1B,
    T_QKVW,
    T_QKVB,
    T_ATTPROJW,
    T_ATTPROJB,
    T_LN2W,
    T_LN2B,
    T_FCW,
    T_FCB,
    T_FCPROJW,
    T_FCPROJB,
    T_LNFW,
    T_LNFB
};

/* transformers' name of each tensor (per layer: after "h.L."), and whether
 * it is a Conv1D weight, stored transposed */
static const struct {
    const char *name;
    int per_layer;
    int transposed;
} hf_names[GPT_NUM_PARAM_TENSORS] = {
    {"wte.weight", 0, 0},         {"wpe.weight", 0, 0},         {"ln_1.weight", 1, 0},
    {"ln_1.bias", 1, 0},          {"attn.c_attn.weight", 1, 1}, {"attn.c_attn.bias", 1, 0},
    {"attn.c_proj.weight", 1, 1}, {"attn.c_proj.bias", 1, 0},   {"ln_2.weight", 1, 0},
    {"ln_2.bias", 1, 0},          {"mlp.c_fc.weight", 1, 1},    {"mlp.c_fc.bias", 1, 0},
    {"mlp.c_proj.weight", 1, 1},  {"mlp.c_proj.bias", 1, 0},    {"ln_f.weight", 0, 0},
    {"ln_f.bias", 0, 0},
};

/* gpc's shape of one layer's slice (rows, cols; cols 0 for vectors) */
static void slice_shape(const gpt_config *c, int t, size_t *rows, size_t *cols) {
    size_t C = (size_t)c->channels;
    static const int mult_rows[GPT_NUM_PARAM_TENSORS] = {0, 0, 1, 1, 3, 3, 1, 1,
                                                         1, 1, 4, 4, 1, 1, 1, 1};
    *cols = 0;
    switch (t) {
    case T_WTE:
        *rows = (size_t)c->padded_vocab, *cols = C;
        return;
    case T_WPE:
        *rows = (size_t)c->max_context, *cols = C;
        return;
    case T_QKVW:
        *rows = 3 * C, *cols = C;
        return;
    case T_ATTPROJW:
        *rows = C, *cols = C;
        return;
    case T_FCW:
        *rows = 4 * C, *cols = C;
        return;
    case T_FCPROJW:
        *rows = C, *cols = 4 * C;
        return;
    default:
        *rows = (size_t)mult_rows[t] * C;
        return;
    }
}

void gpc_hf_gpt2_layout(const gpt_config *c, size_t offset[GPT_NUM_PARAM_TENSORS],
                        size_t count[GPT_NUM_PARAM_TENSORS]) {
    size_t at = 0;
    for (int t = 0; t < GPT_NUM_PARAM_TENSORS; t++) {
        size_t rows, cols;
        slice_shape(c, t, &rows, &cols);
        count[t] = rows * (cols ? cols : 1) * (hf_names[t].per_layer ? (size_t)c->layers : 1);
        offset[t] = at;
        at += count[t];
    }
}

/* ------------------------------------------------------------- config */

static gpc_status int_field(json_t *root, const char *key, const char *fallback, const char *path,
                            int *out) {
    json_t *v = json_object_get(root, key);
    if (!v && fallback) v = json_object_get(root, fallback);
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > INT32_MAX)
        return gpc_error(GPC_ERR_FORMAT, "%s: \"%s\" is missing or not a positive integer", path,
                         key);
    *out = (int)json_integer_value(v);
    return GPC_OK;
}

/* A boolean setting gpc runs only at one value (absent means transformers'
 * default, which is that value). */
static gpc_status bool_field(json_t *root, const char *key, int want, const char *path) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return GPC_OK;
    if (!json_is_boolean(v) || json_is_true(v) != want)
        return gpc_error(GPC_ERR_UNSUPPORTED, "%s: %s is %s; gpc runs GPT-2 only with %s", path,
                         key, json_is_true(v) ? "true" : "not true", want ? "true" : "false");
    return GPC_OK;
}

static gpc_status check_config(json_t *root, const char *path, gpt_config *config) {
    if (!json_is_object(root)) return gpc_error(GPC_ERR_FORMAT, "%s is not a JSON object", path);
    json_t *type = json_object_get(root, "model_type");
    if (json_is_string(type) && strcmp(json_string_value(type), "gpt2") != 0)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "%s describes a '%.40s' model; gpc imports GPT-2 (model_type gpt2) only",
                         path, json_string_value(type));
    if (!json_is_string(type)) {
        json_t *arch = json_array_get(json_object_get(root, "architectures"), 0);
        if (!json_is_string(arch) || strncmp(json_string_value(arch), "GPT2", 4) != 0)
            return gpc_error(GPC_ERR_UNSUPPORTED,
                             "%s names no GPT-2 model (no model_type gpt2, no GPT2LMHeadModel); "
                             "gpc imports GPT-2 only",
                             path);
    }
    int C, L, NH, T, V;
    GPC_TRY(int_field(root, "n_embd", NULL, path, &C));
    GPC_TRY(int_field(root, "n_layer", NULL, path, &L));
    GPC_TRY(int_field(root, "n_head", NULL, path, &NH));
    GPC_TRY(int_field(root, "n_positions", "n_ctx", path, &T));
    GPC_TRY(int_field(root, "vocab_size", NULL, path, &V));
    json_t *act = json_object_get(root, "activation_function");
    if (act && !(json_is_string(act) && (strcmp(json_string_value(act), "gelu_new") == 0 ||
                                         strcmp(json_string_value(act), "gelu_pytorch_tanh") == 0)))
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "%s: activation_function is '%.40s'; gpc computes GPT-2's tanh GELU "
                         "(gelu_new)",
                         path, json_is_string(act) ? json_string_value(act) : "?");
    json_t *eps = json_object_get(root, "layer_norm_epsilon");
    if (eps && !(json_is_number(eps) && fabs(json_number_value(eps) - 1e-5) < 1e-12))
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "%s: layer_norm_epsilon is %g; gpc's layernorm uses GPT-2's 1e-5", path,
                         json_is_number(eps) ? json_number_value(eps) : NAN);
    json_t *inner = json_object_get(root, "n_inner");
    if (inner && !json_is_null(inner) &&
        !(json_is_integer(inner) && json_integer_value(inner) == 4 * (json_int_t)C))
        return gpc_error(GPC_ERR_UNSUPPORTED, "%s: n_inner is not 4 x n_embd; gpc's MLP is 4C",
                         path);
    GPC_TRY(bool_field(root, "add_cross_attention", 0, path));
    GPC_TRY(bool_field(root, "scale_attn_by_inverse_layer_idx", 0, path));
    GPC_TRY(bool_field(root, "scale_attn_weights", 1, path));
    GPC_TRY(bool_field(root, "tie_word_embeddings", 1, path));
    gpc_status s = gpt_config_init(config, L, NH, C, T, V);
    return s == GPC_OK ? s : gpc_error_context(s, "%s: ", path);
}

gpc_status gpc_hf_gpt2_read_config(const char *dir, gpt_config *config) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!gpc_path_exists(path))
        return gpc_error(GPC_ERR_IO,
                         "%s has no config.json: give a folder written by transformers' "
                         "save_pretrained",
                         dir);
    json_error_t err;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return gpc_error(GPC_ERR_FORMAT, "%s is not valid JSON (%s, line %d)", path, err.text,
                         err.line);
    gpc_status s = check_config(root, path, config);
    json_decref(root);
    return s;
}

/* ------------------------------------------------------------- reading */

static inline float load_element(const gpc_st_tensor *t, size_t i) {
    const unsigned char *p = (const unsigned char *)t->data + i * t->elem_bytes;
    if (t->gpc_dtype == GPC_F32) {
        float x;
        memcpy(&x, p, 4);
        return x;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return t->gpc_dtype == GPC_BF16 ? gpc_bf16_to_f32(h) : gpc_f16_to_f32(h);
}

/* Copies t into dst: [rows, cols] as is, or, transposed, from t's [cols,
 * rows] (Conv1D's [in, out]); in blocks of 32 x 32 so both sides stay in
 * cache. */
static void copy_tensor(const gpc_st_tensor *t, float *dst, size_t rows, size_t cols,
                        int transposed) {
    size_t n = rows * (cols ? cols : 1);
    if (!transposed) {
#pragma omp parallel for schedule(static) if (n > 65536)
        for (size_t i = 0; i < n; i++)
            dst[i] = load_element(t, i);
        return;
    }
    const size_t B = 32;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t r0 = 0; r0 < rows; r0 += B)
        for (size_t c0 = 0; c0 < cols; c0 += B)
            for (size_t c = c0; c < c0 + B && c < cols; c++)
                for (size_t r = r0; r < r0 + B && r < rows; r++)
                    dst[r * cols + c] = load_element(t, c * rows + r);
}

/* transformers' name of tensor t of layer l, without prefixes */
static void hf_name(int t, int l, char *out, size_t size) {
    if (hf_names[t].per_layer)
        snprintf(out, size, "h.%d.%s", l, hf_names[t].name);
    else
        snprintf(out, size, "%s", hf_names[t].name);
}

/* Which tensor and layer a name (prefixes removed) is: 1, or 0 for a name
 * GPT-2 does not have; *skip for the attention mask buffers. */
static int parse_name(const char *name, const gpt_config *c, int *t, int *l, int *skip) {
    *skip = 0;
    *l = 0;
    if (strncmp(name, "h.", 2) == 0) {
        char *end;
        long layer = strtol(name + 2, &end, 10);
        if (end == name + 2 || *end != '.' || layer < 0 || layer >= c->layers) return 0;
        if (strcmp(end + 1, "attn.bias") == 0 || strcmp(end + 1, "attn.masked_bias") == 0) {
            *skip = 1;
            return 1;
        }
        for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++)
            if (hf_names[i].per_layer && strcmp(end + 1, hf_names[i].name) == 0) {
                *t = i;
                *l = (int)layer;
                return 1;
            }
        return 0;
    }
    for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++)
        if (!hf_names[i].per_layer && strcmp(name, hf_names[i].name) == 0) {
            *t = i;
            return 1;
        }
    return 0;
}

static gpc_status check_tensor(const gpc_st_tensor *st, const char *name, const gpt_config *c,
                               int t, size_t rows, size_t cols) {
    if (st->gpc_dtype != GPC_F32 && st->gpc_dtype != GPC_BF16 && st->gpc_dtype != GPC_F16)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "tensor '%s' is %s; gpc reads GPT-2 weights in F32, F16 or BF16", name,
                         st->dtype);
    int64_t want[2];
    int ndim = cols ? 2 : 1;
    if (t == T_WTE) rows = (size_t)c->vocab_size; /* the file has no padded rows */
    if (hf_names[t].transposed)
        want[0] = (int64_t)cols, want[1] = (int64_t)rows;
    else
        want[0] = (int64_t)rows, want[1] = (int64_t)cols;
    if (st->ndim != ndim || st->shape[0] != want[0] || (ndim == 2 && st->shape[1] != want[1])) {
        char got[96] = "", exp[64];
        for (int d = 0; d < st->ndim && d < 4; d++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
                     (long long)st->shape[d]);
        if (ndim == 2)
            snprintf(exp, sizeof exp, "%lld, %lld", (long long)want[0], (long long)want[1]);
        else
            snprintf(exp, sizeof exp, "%lld", (long long)want[0]);
        return gpc_error(GPC_ERR_MISMATCH,
                         "tensor '%s' has shape [%s]; config.json's sizes need [%s]", name, got,
                         exp);
    }
    return GPC_OK;
}

gpc_status gpc_hf_gpt2_gather(gpc_safetensors *const *files, int file_count, const char *prefix,
                              const gpt_config *c, float *params) {
    size_t offset[GPT_NUM_PARAM_TENSORS], count[GPT_NUM_PARAM_TENSORS];
    gpc_hf_gpt2_layout(c, offset, count);
    size_t total = offset[GPT_NUM_PARAM_TENSORS - 1] + count[GPT_NUM_PARAM_TENSORS - 1];
    if (total != gpt_config_num_params(c))
        return gpc_error(GPC_ERR_INTERNAL, "GPT-2 layout of %zu parameters, the model has %zu",
                         total, gpt_config_num_params(c));
    size_t slots = (size_t)GPT_NUM_PARAM_TENSORS * (size_t)c->layers;
    const gpc_st_tensor **found = calloc(slots, sizeof *found);
    if (!found) return gpc_error(GPC_ERR_NOMEM, "out of memory");
    const gpc_st_tensor *lm_head = NULL;
    size_t plen = strlen(prefix);
    gpc_status s = GPC_OK;
    for (int f = 0; f < file_count && s == GPC_OK; f++) {
        for (int i = 0; i < gpc_safetensors_count(files[f]) && s == GPC_OK; i++) {
            const gpc_st_tensor *st = gpc_safetensors_at(files[f], i);
            if (strncmp(st->name, prefix, plen) != 0) continue;
            const char *name = st->name + plen;
            if (strncmp(name, "transformer.", 12) == 0) name += 12;
            int t, l, skip;
            if (strcmp(name, "lm_head.weight") == 0) {
                lm_head = st;
                continue;
            }
            if (!parse_name(name, c, &t, &l, &skip)) {
                s = gpc_error(GPC_ERR_UNSUPPORTED,
                              "unknown tensor '%s': not part of a GPT-2 of %d layers as gpc "
                              "runs it",
                              st->name, c->layers);
                break;
            }
            if (skip) continue;
            const gpc_st_tensor **slot = &found[(size_t)t * (size_t)c->layers + (size_t)l];
            if (*slot) {
                s = gpc_error(GPC_ERR_FORMAT, "tensor '%s' is stored twice", st->name);
                break;
            }
            size_t rows, cols;
            slice_shape(c, t, &rows, &cols);
            s = check_tensor(st, st->name, c, t, rows, cols);
            *slot = st;
        }
    }
    for (int t = 0; t < GPT_NUM_PARAM_TENSORS && s == GPC_OK; t++) {
        int layers = hf_names[t].per_layer ? c->layers : 1;
        size_t rows, cols;
        slice_shape(c, t, &rows, &cols);
        size_t slice = count[t] / (size_t)layers;
        for (int l = 0; l < layers && s == GPC_OK; l++) {
            const gpc_st_tensor *st = found[(size_t)t * (size_t)c->layers + (size_t)l];
            if (!st) {
                char name[128];
                hf_name(t, l, name, sizeof name);
                s = gpc_error(GPC_ERR_FORMAT, "tensor '%stransformer.%s' is missing", prefix, name);
                break;
            }
            float *dst = params + offset[t] + (size_t)l * slice;
            if (t == T_WTE) { /* the padded rows are zero */
                size_t real = (size_t)c->vocab_size * cols;
                copy_tensor(st, dst, (size_t)c->vocab_size, cols, 0);
                memset(dst + real, 0, (slice - real) * sizeof *dst);
            } else {
                copy_tensor(st, dst, rows, cols, hf_names[t].transposed);
            }
        }
    }
    if (s == GPC_OK && lm_head) { /* tied: must be wte itself */
        size_t C = (size_t)c->channels, V = (size_t)c->vocab_size;
        if (lm_head->ndim != 2 || lm_head->shape[0] != (int64_t)V ||
            lm_head->shape[1] != (int64_t)C || lm_head->gpc_dtype < 0 ||
            lm_head->gpc_dtype == GPC_I32 || lm_head->gpc_dtype == GPC_U16 ||
            lm_head->gpc_dtype == GPC_U32) {
            s = gpc_error(GPC_ERR_UNSUPPORTED, "lm_head.weight is not a [%zu, %zu] float tensor", V,
                          C);
        } else {
            for (size_t i = 0; i < V * C; i++)
                if (load_element(lm_head, i) != params[offset[T_WTE] + i]) {
                    s = gpc_error(GPC_ERR_UNSUPPORTED,
                                  "lm_head.weight differs from wte.weight; gpc's GPT-2 ties the "
                                  "output head to the token embedding");
                    break;
                }
        }
    }
    free(found);
    return s;
}

/* The shard files of model.safetensors.index.json, each named once. */
static gpc_status index_files(const char *dir, const char *index_path, char ***names_out,
                              int *count_out) {
    json_error_t err;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return gpc_error(GPC_ERR_FORMAT, "%s is not valid JSON (%s, line %d)", index_path, err.text,
                         err.line);
    json_t *map = json_object_get(root, "weight_map");
    gpc_status s = GPC_OK;
    if (!json_is_object(map) || json_object_size(map) == 0)
        s = gpc_error(GPC_ERR_FORMAT, "%s has no \"weight_map\" of tensor -> file", index_path);
    size_t n = json_object_size(map);
    char **names = s == GPC_OK ? calloc(n, sizeof *names) : NULL;
    int count = 0;
    if (s == GPC_OK && !names) s = gpc_error(GPC_ERR_NOMEM, "out of memory");
    const char *key;
    json_t *value;
    json_object_foreach(map, key, value) {
        if (s != GPC_OK) break;
        const char *file = json_string_value(value);
        size_t len = file ? strlen(file) : 0;
        if (!file || len < 12 || strchr(file, '/') || file[0] == '.' ||
            strcmp(file + len - 12, ".safetensors") != 0) {
            s = gpc_error(GPC_ERR_FORMAT,
                          "%s: tensor '%s' is in '%.80s', not a .safetensors file of %s",
                          index_path, key, file ? file : "?", dir);
            break;
        }
        int known = 0;
        for (int i = 0; i < count && !known; i++)
            known = strcmp(names[i], file) == 0;
        if (!known && !(names[count++] = strdup(file)))
            s = gpc_error(GPC_ERR_NOMEM, "out of memory");
    }
    json_decref(root);
    if (s != GPC_OK) {
        for (int i = 0; names && i < count; i++)
            free(names[i]);
        free(names);
        return s;
    }
    *names_out = names;
    *count_out = count;
    return GPC_OK;
}

gpc_status gpc_hf_gpt2_read(const char *dir, gpt_config *config, float **params,
                            gpc_dtype *source_dtype) {
    *params = NULL;
    GPC_TRY(gpc_hf_gpt2_read_config(dir, config));
    char path[4096];
    char **names = NULL;
    int count = 0;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (gpc_path_exists(path)) {
        GPC_TRY(index_files(dir, path, &names, &count));
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (!gpc_path_exists(path))
            return gpc_error(GPC_ERR_IO,
                             "%s has neither model.safetensors nor model.safetensors.index.json "
                             "(PyTorch .bin files are not read: save with safe_serialization)",
                             dir);
        names = calloc(1, sizeof *names);
        if (!names || !(names[0] = strdup("model.safetensors"))) {
            free(names);
            return gpc_error(GPC_ERR_NOMEM, "out of memory");
        }
        count = 1;
    }
    gpc_safetensors **files = calloc((size_t)count, sizeof *files);
    gpc_status s = files ? GPC_OK : gpc_error(GPC_ERR_NOMEM, "out of memory");
    for (int i = 0; i < count && s == GPC_OK; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        s = gpc_safetensors_open(&files[i], path);
    }
    size_t n = gpt_config_num_params(config);
    float *values = NULL;
    if (s == GPC_OK) {
        values = gpc_malloc(n * sizeof *values);
        if (!values)
            s = gpc_error(GPC_ERR_NOMEM, "out of host memory for %zu parameters (%.1f GB)", n,
                          (double)n * 4 / 1e9);
    }
    if (s == GPC_OK) s = gpc_hf_gpt2_gather(files, count, "", config, values);
    if (s == GPC_OK && source_dtype) {
        *source_dtype = GPC_F32;
        for (int i = 0; i < count; i++) {
            const gpc_st_tensor *t = gpc_safetensors_find(files[i], "transformer.wte.weight");
            if (!t) t = gpc_safetensors_find(files[i], "wte.weight");
            if (t) *source_dtype = (gpc_dtype)t->gpc_dtype;
        }
    }
    for (int i = 0; i < count; i++) {
        if (files) gpc_safetensors_close(files[i]);
        free(names[i]);
    }
    free(files);
    free(names);
    if (s != GPC_OK) {
        gpc_free(values);
        return s;
    }
    *params = values;
    return GPC_OK;
}

/* ------------------------------------------------------------- writing */

static gpc_status write_config(const char *dir, const gpt_config *c, gpc_dtype dtype) {
    int eot = c->vocab_size - 1; /* GPT-2's <|endoftext|> is its last token */
    const char *dtype_name = dtype == GPC_BF16  ? "bfloat16"
                             : dtype == GPC_F16 ? "float16"
                                                : "float32";
    json_t *root = json_pack(
        "{s:s, s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:n, s:f, s:f, s:f, s:i, s:i, "
        "s:b, s:b, s:b, s:b, s:f, s:s}",
        "activation_function", "gelu_new", "architectures", "GPT2LMHeadModel", "model_type", "gpt2",
        "n_embd", c->channels, "n_head", c->heads, "n_layer", c->layers, "n_positions",
        c->max_context, "n_ctx", c->max_context, "vocab_size", c->vocab_size, "layer_norm_epsilon",
        1e-5, "n_inner", "attn_pdrop", 0.1, "embd_pdrop", 0.1, "resid_pdrop", 0.1, "bos_token_id",
        eot, "eos_token_id", eot, "tie_word_embeddings", 1, "scale_attn_weights", 1,
        "scale_attn_by_inverse_layer_idx", 0, "use_cache", 1, "initializer_range", 0.02,
        "torch_dtype", dtype_name);
    if (!root) return gpc_error(GPC_ERR_NOMEM, "out of memory writing config.json");
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text) return gpc_error(GPC_ERR_NOMEM, "out of memory writing config.json");
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    gpc_atomic_file f;
    gpc_status s = gpc_atomic_open(&f, path);
    if (s == GPC_OK) s = gpc_atomic_write(&f, text, strlen(text));
    if (s == GPC_OK) s = gpc_atomic_write(&f, "\n", 1);
    if (s == GPC_OK)
        s = gpc_atomic_commit(&f);
    else
        gpc_atomic_abort(&f);
    free(text);
    return s;
}

static inline void store_element(void *base, gpc_dtype dtype, size_t i, float x) {
    if (dtype == GPC_F32)
        ((float *)base)[i] = x;
    else
        ((uint16_t *)base)[i] = dtype == GPC_BF16 ? gpc_f32_to_bf16(x) : gpc_f32_to_f16(x);
}

gpc_status gpc_hf_gpt2_write(const char *dir, const gpt_config *c, const float *params,
                             gpc_dtype dtype) {
    if (dtype != GPC_F32 && dtype != GPC_BF16 && dtype != GPC_F16)
        return gpc_error(GPC_ERR_INVALID_ARG, "Hugging Face weights are written in f32, bf16 or "
                                              "f16");
    size_t offset[GPT_NUM_PARAM_TENSORS], count[GPT_NUM_PARAM_TENSORS];
    gpc_hf_gpt2_layout(c, offset, count);
    size_t n = gpt_config_num_params(c), elem = gpc_dtype_size(dtype);
    int tensors = 4 + 12 * c->layers;
    gpc_st_write_tensor *list = calloc((size_t)tensors, sizeof *list);
    char *names = calloc((size_t)tensors, 64);
    unsigned char *data = gpc_malloc(n * elem);
    if (!list || !names || !data) {
        free(list);
        free(names);
        gpc_free(data);
        return gpc_error(GPC_ERR_NOMEM, "out of host memory writing %zu parameters", n);
    }
    size_t at = 0;
    int k = 0;
    for (int t = 0; t < GPT_NUM_PARAM_TENSORS; t++) {
        int layers = hf_names[t].per_layer ? c->layers : 1;
        size_t rows, cols, slice = count[t] / (size_t)layers;
        slice_shape(c, t, &rows, &cols);
        if (t == T_WTE) rows = (size_t)c->vocab_size; /* the padded rows stay behind */
        for (int l = 0; l < layers; l++, k++) {
            gpc_st_write_tensor *w = &list[k];
            char *name = names + 64 * (size_t)k;
            memcpy(name, "transformer.", 12);
            hf_name(t, l, name + 12, 52);
            w->name = name;
            w->dtype = dtype;
            w->ndim = cols ? 2 : 1;
            int tr = hf_names[t].transposed;
            w->shape[0] = (int64_t)(tr ? cols : rows);
            w->shape[1] = (int64_t)(tr ? rows : cols);
            w->data = data + at * elem;
            const float *src = params + offset[t] + (size_t)l * slice;
            void *dst = data + at * elem;
            size_t m = rows * (cols ? cols : 1);
            if (!tr) {
#pragma omp parallel for schedule(static) if (m > 65536)
                for (size_t i = 0; i < m; i++)
                    store_element(dst, dtype, i, src[i]);
            } else { /* gpc's [rows, cols] to Conv1D's [cols, rows] */
#pragma omp parallel for schedule(static) if (m > 65536)
                for (size_t c0 = 0; c0 < cols; c0 += 32)
                    for (size_t r0 = 0; r0 < rows; r0 += 32)
                        for (size_t r = r0; r < r0 + 32 && r < rows; r++)
                            for (size_t q = c0; q < c0 + 32 && q < cols; q++)
                                store_element(dst, dtype, q * rows + r, src[r * cols + q]);
            }
            at += m;
        }
    }
    gpc_status s = write_config(dir, c, dtype);
    if (s == GPC_OK) {
        char path[4096];
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        s = gpc_safetensors_write(path, list, k);
    }
    free(list);
    free(names);
    gpc_free(data);
    return s;
}
