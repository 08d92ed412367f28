/*
 * gpc hf: Hugging Face's file formats for GPT-2 models.
 *
 * safetensors: an 8-byte little-endian header length N, N bytes of JSON
 * ({"NAME": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
 * "__metadata__": {...}}), then the tensors' bytes. A file is mapped, not
 * read, and every offset, size, dtype and shape is checked before any byte
 * is used: the header is untrusted input.
 *
 * GPT-2 import and export: a transformers GPT-2 folder (config.json,
 * model.safetensors or model-0000N-of-0000M.safetensors with
 * model.safetensors.index.json, vocab.json and merges.txt) to and from
 * gpc's parameters in llm.c's layout (gpt_set_params / gpt_get_params).
 * transformers' Conv1D stores weights [in, out]; gpc stores [out, in], so
 * the four matrix weights of each block are transposed on the way. The
 * output head is tied to wte; the padded vocabulary rows are zero.
 */
#ifndef GPC_HF_H
#define GPC_HF_H

#include "gpc/core.h"
#include "gpc/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ safetensors */

#define GPC_ST_MAX_DIMS 8
/* The format's own limit on the JSON header (the reference reader's). */
#define GPC_ST_MAX_HEADER ((uint64_t)100000000)

typedef struct {
    const char *name;
    char dtype[8];     /* "F32", "F16", "BF16", "I32", ... as in the header */
    int gpc_dtype;     /* the matching gpc_dtype, or -1 (F64, I64, U8, ...) */
    size_t elem_bytes; /* bytes per element */
    int ndim;
    int64_t shape[GPC_ST_MAX_DIMS];
    size_t numel;
    const void *data; /* into the mapping; may be unaligned */
    size_t bytes;
} gpc_st_tensor;

typedef struct gpc_safetensors gpc_safetensors;

/* Maps and validates a file; a bad one is a one-line error naming the file
 * and what is wrong with it. */
gpc_status gpc_safetensors_open(gpc_safetensors **out, const char *path);
void gpc_safetensors_close(gpc_safetensors *st);
int gpc_safetensors_count(const gpc_safetensors *st);
const gpc_st_tensor *gpc_safetensors_at(const gpc_safetensors *st, int index);
/* NULL when the file has no tensor of that name. */
const gpc_st_tensor *gpc_safetensors_find(const gpc_safetensors *st, const char *name);

/* A tensor to write: data holds numel elements of dtype (F32, F16, BF16,
 * I32, U16 or U32), row-major. */
typedef struct {
    const char *name;
    gpc_dtype dtype;
    int ndim;
    int64_t shape[GPC_ST_MAX_DIMS];
    const void *data;
} gpc_st_write_tensor;

/* Writes a safetensors file atomically, with {"format": "pt"} as its
 * metadata (what transformers expects). Names must be unique. */
gpc_status gpc_safetensors_write(const char *path, const gpc_st_write_tensor *tensors, int count);

/* ------------------------------------------------------------ GPT-2 */

/* The parameter layout of a config: element offset and count of each of
 * the GPT_NUM_PARAM_TENSORS tensors (llm.c's order, as gpt_set_params
 * takes them). */
void gpc_hf_gpt2_layout(const gpt_config *config, size_t offset[GPT_NUM_PARAM_TENSORS],
                        size_t count[GPT_NUM_PARAM_TENSORS]);

/* Reads DIR/config.json of a transformers GPT-2 and checks that gpc runs
 * it the same way (model_type gpt2, gelu_new, layernorm eps 1e-5, no
 * cross-attention, no per-layer attention scaling, a 4C MLP). */
gpc_status gpc_hf_gpt2_read_config(const char *dir, gpt_config *config);

/* Fills params (gpt_config_num_params(config) f32, llm.c's layout) from the
 * tensors of files whose names start with prefix, then transformers' name
 * ("transformer.h.0.attn.c_attn.weight", the "transformer." optional):
 * every tensor of the model must be there once with its shape, in F32, F16
 * or BF16; Conv1D weights are transposed; the padded vocabulary rows are
 * zero; lm_head.weight, if there, must equal wte (tied); the attention
 * mask buffers are skipped; any other tensor under prefix is an error. */
gpc_status gpc_hf_gpt2_gather(gpc_safetensors *const *files, int file_count, const char *prefix,
                              const gpt_config *config, float *params);

/* Reads a transformers GPT-2 folder: config.json and model.safetensors, or
 * the shards model.safetensors.index.json names. *params is gpc_malloc'd
 * (gpt_config_num_params elements, llm.c's layout); *source_dtype is the
 * dtype the weights were stored in. */
gpc_status gpc_hf_gpt2_read(const char *dir, gpt_config *config, float **params,
                            gpc_dtype *source_dtype);

/* Writes DIR/config.json and DIR/model.safetensors (dtype F32, BF16 or
 * F16) that transformers' GPT2LMHeadModel.from_pretrained(DIR) loads. DIR
 * must exist. */
gpc_status gpc_hf_gpt2_write(const char *dir, const gpt_config *config, const float *params,
                             gpc_dtype dtype);

#ifdef __cplusplus
}
#endif

#endif /* GPC_HF_H */
