/*
 * quant.c: weights quantized for inference (gpc quantize): the quantizer,
 * the quantized model's parameters to and from f32 host values, its file
 * (a run's quant.bin) and the loading of a run folder, quantized or not,
 * for inference.
 *
 * int8 is symmetric with a scale per output channel, max|w_row| / 127, and
 * q = round(w / scale) in -127..127 (LLM.int8 and GPTQ's weight-only form:
 * one scale per row keeps a few large rows from crushing the others). fp8
 * is E4M3 with scale amax / 448 (per row or per matrix), as Hopper's FP8
 * tensor cores take it (NVIDIA Transformer Engine's per-tensor recipe).
 *
 * quant.bin (little-endian): a 128-byte header (magic "GPCQUANT", version,
 * header size, config, quantized dtype, per-channel flag, parameter counts,
 * the source checkpoint's precision), the other tensors f32 in layout
 * order, then for each quantized tensor (qkvw, attprojw, fcw, fcprojw) its
 * scales f32 [L * (OC or 1)] and its bytes [L * OC * C], then CRC-32C of
 * every byte before it. Written atomically.
 */
#include "model/gpt_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "ops/ops.h"

#define QUANT_MAGIC "GPCQUANT" /* 8 bytes, no NUL */
#define QUANT_HEADER_BYTES 128

enum {
    QOFF_MAGIC = 0,
    QOFF_VERSION = 8,
    QOFF_HEADER_BYTES = 12,
    QOFF_CONFIG = 16, /* 6 x u32 as in checkpoint.bin */
    QOFF_DTYPE = 40,
    QOFF_PER_CHANNEL = 44,
    QOFF_NUM_PARAMS = 48,
    QOFF_DENSE = 56,
    QOFF_SOURCE_PRECISION = 64,
};

int gpt_param_quantized(int index) {
    return index == 4 || index == 6 || index == 10 || index == 12; /* qkvw attprojw fcw fcprojw */
}

gpc_status gpt_quant_parse(const char *to, const char *scales, gpt_quant_options *out) {
    if (!to || (strcmp(to, "int8") != 0 && strcmp(to, "fp8") != 0))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--to %s is not a quantization gpc knows: use int8 or fp8 (E4M3)",
                         to ? to : "(none)");
    int per_channel;
    if (!scales || strcmp(scales, "channel") == 0)
        per_channel = 1;
    else if (strcmp(scales, "tensor") == 0)
        per_channel = 0;
    else
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--scales %s is not channel (one per output channel) or tensor (one per "
                         "matrix)",
                         scales);
    if (strcmp(to, "int8") == 0 && !per_channel)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "int8 takes a scale per output channel only: drop --scales tensor, or "
                         "use --to fp8 for per-tensor scales");
    out->dtype = strcmp(to, "int8") == 0 ? GPC_I8 : GPC_F8E4M3;
    out->per_channel = per_channel;
    return GPC_OK;
}

const char *gpt_quant_name(const gpt_quant_options *q) {
    if (q->dtype == GPC_I8) return "int8/channel";
    return q->per_channel ? "fp8/channel" : "fp8/tensor";
}

float gpt_quant_value(gpc_dtype dtype, uint8_t q) {
    return dtype == GPC_F8E4M3 ? gpc_f8e4m3_to_f32(q) : (float)(int8_t)q;
}

static uint8_t quantize_one(gpc_dtype dtype, float x) {
    if (dtype == GPC_F8E4M3) return gpc_f32_to_f8e4m3(x);
    float r = rintf(x); /* nearest, ties to even */
    if (r > 127.0f) r = 127.0f;
    if (r < -127.0f) r = -127.0f;
    return (uint8_t)(int8_t)r;
}

gpc_status gpt_quantize_matrix(const float *w, int64_t rows, int64_t cols,
                               const gpt_quant_options *options, uint8_t *q, float *scales,
                               const char *what) {
    const float top = options->dtype == GPC_F8E4M3 ? GPC_F8E4M3_MAX : 127.0f;
    float amax_all = 0.0f;
    for (int64_t i = 0; i < rows * cols; i++) {
        if (!isfinite(w[i]))
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "%s holds a non-finite value (%g at element %lld): the checkpoint "
                             "is damaged; quantize a healthy one",
                             what, (double)w[i], (long long)i);
        float a = fabsf(w[i]);
        if (a > amax_all) amax_all = a;
    }
    for (int64_t r = 0; r < rows; r++) {
        float amax = 0.0f;
        if (options->per_channel) {
            for (int64_t c = 0; c < cols; c++)
                if (fabsf(w[r * cols + c]) > amax) amax = fabsf(w[r * cols + c]);
        } else {
            amax = amax_all;
        }
        float scale = amax > 0.0f ? amax / top : 1.0f;
        if (options->per_channel || r == 0) scales[options->per_channel ? r : 0] = scale;
        for (int64_t c = 0; c < cols; c++)
            q[r * cols + c] = quantize_one(options->dtype, w[r * cols + c] / scale);
    }
    return GPC_OK;
}

size_t gpt_quant_weight_bytes(const gpt_config *c, const gpt_quant_options *quant,
                              size_t dense_bytes) {
    size_t L = (size_t)c->layers, C = (size_t)c->channels;
    size_t matrix = L * 12 * C * C;                         /* 3C*C + C*C + 4C*C + C*4C per layer */
    size_t scales = quant->per_channel ? L * 9 * C : L * 4; /* 3C + C + 4C + C rows */
    return matrix + scales * sizeof(float) + (gpt_config_num_params(c) - matrix) * dense_bytes;
}

/* The [rows, cols] view of quantized tensor i per layer. */
static void matrix_dims(const gpt_model *m, int i, int64_t *L, int64_t *rows, int64_t *cols) {
    const gpc_tensor *t = &m->params.all[i];
    *L = t->shape[0];
    *rows = t->shape[1];
    *cols = t->shape[2];
}

/* Host buffers of a quantized model's parameters: dense f32 [dense_count],
 * and per quantized tensor its bytes and scales. */
typedef struct {
    float *dense;
    uint8_t *q[GPT_NUM_PARAM_TENSORS];
    float *scales[GPT_NUM_PARAM_TENSORS];
} quant_host;

static void host_free(quant_host *h) {
    gpc_free(h->dense);
    for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++) {
        gpc_free(h->q[i]);
        gpc_free(h->scales[i]);
    }
    memset(h, 0, sizeof *h);
}

static gpc_status host_alloc(const gpt_model *m, quant_host *h) {
    memset(h, 0, sizeof *h);
    h->dense = gpc_malloc(m->quant.dense_count * sizeof(float));
    int ok = h->dense != NULL;
    for (int i = 0; ok && i < GPT_NUM_PARAM_TENSORS; i++) {
        if (!gpt_param_quantized(i)) continue;
        h->q[i] = gpc_malloc(gpc_tensor_bytes(&m->params.all[i]));
        h->scales[i] = gpc_malloc(gpc_tensor_bytes(&m->quant.scales[i]));
        ok = h->q[i] && h->scales[i];
    }
    if (ok) return GPC_OK;
    host_free(h);
    return gpc_error(GPC_ERR_NOMEM, "out of host memory for the quantized weights");
}

/* Host buffers to the device: the dense values converted to the compute
 * dtype on the host (round to nearest even, as the backends convert). */
static gpc_status host_upload(gpt_model *m, const quant_host *h) {
    size_t n = m->quant.dense_count;
    gpc_status s = GPC_OK;
    if (m->dtype == GPC_F32) {
        gpc_tensor src = gpc_tensor_1d(h->dense, GPC_F32, gpc_cpu(), (int64_t)n);
        s = gpc_tensor_copy(&m->params_flat, &src);
    } else {
        uint16_t *half = gpc_malloc((n ? n : 1) * sizeof *half);
        if (!half) return gpc_error(GPC_ERR_NOMEM, "out of host memory for the weights");
        for (size_t k = 0; k < n; k++)
            half[k] =
                m->dtype == GPC_BF16 ? gpc_f32_to_bf16(h->dense[k]) : gpc_f32_to_f16(h->dense[k]);
        gpc_tensor src = gpc_tensor_1d(half, m->dtype, gpc_cpu(), (int64_t)n);
        s = gpc_tensor_copy(&m->params_flat, &src);
        gpc_free(half);
    }
    for (int i = 0; s == GPC_OK && i < GPT_NUM_PARAM_TENSORS; i++) {
        if (!gpt_param_quantized(i)) continue;
        gpc_tensor q = m->params.all[i], sc = m->quant.scales[i];
        q.data = h->q[i];
        q.device = gpc_cpu();
        sc.data = h->scales[i];
        sc.device = gpc_cpu();
        s = gpc_tensor_copy(&m->params.all[i], &q);
        if (s == GPC_OK) s = gpc_tensor_copy(&m->quant.scales[i], &sc);
    }
    return s;
}

static gpc_status host_download(const gpt_model *m, quant_host *h) {
    size_t n = m->quant.dense_count;
    gpc_status s = GPC_OK;
    if (m->dtype == GPC_F32) {
        gpc_tensor dst = gpc_tensor_1d(h->dense, GPC_F32, gpc_cpu(), (int64_t)n);
        s = gpc_tensor_copy(&dst, &m->params_flat);
    } else {
        uint16_t *half = gpc_malloc((n ? n : 1) * sizeof *half);
        if (!half) return gpc_error(GPC_ERR_NOMEM, "out of host memory for the weights");
        gpc_tensor dst = gpc_tensor_1d(half, m->dtype, gpc_cpu(), (int64_t)n);
        s = gpc_tensor_copy(&dst, &m->params_flat);
        for (size_t k = 0; s == GPC_OK && k < n; k++)
            h->dense[k] = m->dtype == GPC_BF16 ? gpc_bf16_to_f32(half[k]) : gpc_f16_to_f32(half[k]);
        gpc_free(half);
    }
    for (int i = 0; s == GPC_OK && i < GPT_NUM_PARAM_TENSORS; i++) {
        if (!gpt_param_quantized(i)) continue;
        gpc_tensor q = m->params.all[i], sc = m->quant.scales[i];
        q.data = h->q[i];
        q.device = gpc_cpu();
        sc.data = h->scales[i];
        sc.device = gpc_cpu();
        s = gpc_tensor_copy(&q, &m->params.all[i]);
        if (s == GPC_OK) s = gpc_tensor_copy(&sc, &m->quant.scales[i]);
    }
    return s;
}

gpc_status gpt_quant_set_params(gpt_model *m, const float *values) {
    quant_host h;
    GPC_TRY(host_alloc(m, &h));
    gpc_status s = GPC_OK;
    for (int i = 0; s == GPC_OK && i < GPT_NUM_PARAM_TENSORS; i++) {
        const float *v = values + m->param_offset[i];
        size_t n = gpt_param_count(m, i);
        if (!gpt_param_quantized(i)) {
            memcpy(h.dense + m->quant.dense_offset[i], v, n * sizeof(float));
            continue;
        }
        int64_t L, rows, cols;
        matrix_dims(m, i, &L, &rows, &cols);
        size_t per_scale = m->quant.options.per_channel ? (size_t)rows : 1;
        for (int64_t l = 0; s == GPC_OK && l < L; l++) {
            char what[64];
            snprintf(what, sizeof what, "%s of layer %lld", gpt_param_names[i], (long long)l);
            s = gpt_quantize_matrix(v + (size_t)l * (size_t)(rows * cols), rows, cols,
                                    &m->quant.options, h.q[i] + (size_t)l * (size_t)(rows * cols),
                                    h.scales[i] + (size_t)l * per_scale, what);
        }
    }
    if (s == GPC_OK) s = host_upload(m, &h);
    host_free(&h);
    return s;
}

gpc_status gpt_quant_get_params(const gpt_model *m, float *values) {
    quant_host h;
    GPC_TRY(host_alloc(m, &h));
    gpc_status s = host_download(m, &h);
    for (int i = 0; s == GPC_OK && i < GPT_NUM_PARAM_TENSORS; i++) {
        float *v = values + m->param_offset[i];
        size_t n = gpt_param_count(m, i);
        if (!gpt_param_quantized(i)) {
            memcpy(v, h.dense + m->quant.dense_offset[i], n * sizeof(float));
            continue;
        }
        int64_t L, rows, cols;
        matrix_dims(m, i, &L, &rows, &cols);
        int pc = m->quant.options.per_channel;
        for (int64_t r = 0; r < L * rows; r++) {
            float scale = h.scales[i][pc ? r : r / rows];
            for (int64_t c = 0; c < cols; c++)
                v[r * cols + c] =
                    gpt_quant_value(m->quant.options.dtype, h.q[i][r * cols + c]) * scale;
        }
    }
    host_free(&h);
    return s;
}

/* ------------------------------------------------------------ the file */

static void put(unsigned char *h, int offset, const void *value, size_t bytes) {
    memcpy(h + offset, value, bytes);
}

static void get(const unsigned char *h, int offset, void *value, size_t bytes) {
    memcpy(value, h + offset, bytes);
}

gpc_status gpt_quant_save(const char *path, const gpt_model *m, gpc_dtype source_precision) {
    if (!m->quant.on)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "saving %s: the model is not quantized; create it with gpt_create_quant",
                         path);
    unsigned char header[QUANT_HEADER_BYTES] = {0};
    memcpy(header + QOFF_MAGIC, QUANT_MAGIC, 8);
    uint32_t version = GPT_QUANT_VERSION, header_bytes = QUANT_HEADER_BYTES;
    put(header, QOFF_VERSION, &version, 4);
    put(header, QOFF_HEADER_BYTES, &header_bytes, 4);
    const gpt_config *c = &m->config;
    uint32_t config[6] = {(uint32_t)c->layers,     (uint32_t)c->heads,
                          (uint32_t)c->channels,   (uint32_t)c->max_context,
                          (uint32_t)c->vocab_size, (uint32_t)c->padded_vocab};
    put(header, QOFF_CONFIG, config, sizeof config);
    uint32_t dtype = (uint32_t)m->quant.options.dtype, pc = (uint32_t)m->quant.options.per_channel;
    uint32_t source = (uint32_t)source_precision;
    uint64_t num_params = m->num_params, dense = m->quant.dense_count;
    put(header, QOFF_DTYPE, &dtype, 4);
    put(header, QOFF_PER_CHANNEL, &pc, 4);
    put(header, QOFF_NUM_PARAMS, &num_params, 8);
    put(header, QOFF_DENSE, &dense, 8);
    put(header, QOFF_SOURCE_PRECISION, &source, 4);
    quant_host h;
    GPC_TRY(host_alloc(m, &h));
    gpc_status s = host_download(m, &h);
    gpc_atomic_file f;
    int opened = 0;
    if (s == GPC_OK) s = gpc_atomic_open(&f, path);
    opened = s == GPC_OK;
    if (s == GPC_OK) s = gpc_atomic_write(&f, header, sizeof header);
    if (s == GPC_OK) s = gpc_atomic_write(&f, h.dense, dense * sizeof(float));
    for (int i = 0; s == GPC_OK && i < GPT_NUM_PARAM_TENSORS; i++) {
        if (!gpt_param_quantized(i)) continue;
        s = gpc_atomic_write(&f, h.scales[i], gpc_tensor_bytes(&m->quant.scales[i]));
        if (s == GPC_OK) s = gpc_atomic_write(&f, h.q[i], gpc_tensor_bytes(&m->params.all[i]));
    }
    if (s == GPC_OK) {
        uint32_t crc = f.crc;
        s = gpc_atomic_write(&f, &crc, sizeof crc);
    }
    if (s == GPC_OK)
        s = gpc_atomic_commit(&f);
    else if (opened)
        gpc_atomic_abort(&f);
    host_free(&h);
    if (s != GPC_OK) return gpc_error_context(s, "saving quantized weights %s: ", path);
    return GPC_OK;
}

typedef struct {
    gpt_config config;
    gpt_quant_options quant;
    gpc_dtype source;
    uint64_t num_params, dense;
} quant_header;

/* The file's expected size from its header (UINT64_MAX when the header's
 * counts are absurd). */
static uint64_t expected_size(const quant_header *q) {
    const gpt_config *c = &q->config;
    uint64_t L = (uint64_t)c->layers, C = (uint64_t)c->channels;
    uint64_t matrix = L * 12 * C * C;
    uint64_t scales = q->quant.per_channel ? L * 9 * C : L * 4;
    if (q->dense > ((uint64_t)1 << 40) || matrix > ((uint64_t)1 << 44)) return UINT64_MAX;
    return QUANT_HEADER_BYTES + q->dense * 4 + scales * 4 + matrix + 4;
}

/* Opens, checks (magic, version, checksum over the whole file, then every
 * header field) and leaves the file positioned after the header. */
static gpc_status open_checked(const char *path, FILE **out, quant_header *q, unsigned char *raw) {
    *out = NULL;
    void *opened;
    GPC_TRY(gpc_open_regular(path, "quantized weights", &opened));
    FILE *file = opened;
    struct stat st;
    if (fstat(fileno(file), &st) != 0) {
        fclose(file);
        return gpc_error(GPC_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    }
    memset(raw, 0, QUANT_HEADER_BYTES);
    size_t got = fread(raw, 1, QUANT_HEADER_BYTES, file);
    if (got < 8 || memcmp(raw, QUANT_MAGIC, 8) != 0) {
        fclose(file);
        return gpc_error(GPC_ERR_FORMAT,
                         "%s is not a gpc quantized-weights file (its first bytes are not "
                         "GPCQUANT)",
                         path);
    }
    uint32_t version = 0, header_bytes = 0;
    get(raw, QOFF_VERSION, &version, 4);
    get(raw, QOFF_HEADER_BYTES, &header_bytes, 4);
    if (got >= 16 && version != GPT_QUANT_VERSION) {
        fclose(file);
        return gpc_error(GPC_ERR_FORMAT,
                         "%s has format version %u; this gpc reads version %d (quantize the run "
                         "again with this gpc)",
                         path, version, GPT_QUANT_VERSION);
    }
    if (got < QUANT_HEADER_BYTES || header_bytes != QUANT_HEADER_BYTES ||
        st.st_size < QUANT_HEADER_BYTES + 4) {
        fclose(file);
        return gpc_error(GPC_ERR_FORMAT,
                         "%s is truncated: its header is incomplete; quantize the run again", path);
    }
    uint32_t config[6], dtype, pc, source;
    get(raw, QOFF_CONFIG, config, sizeof config);
    get(raw, QOFF_DTYPE, &dtype, 4);
    get(raw, QOFF_PER_CHANNEL, &pc, 4);
    get(raw, QOFF_SOURCE_PRECISION, &source, 4);
    get(raw, QOFF_NUM_PARAMS, &q->num_params, 8);
    get(raw, QOFF_DENSE, &q->dense, 8);
    q->config = (gpt_config){(int)config[0], (int)config[1], (int)config[2],
                             (int)config[3], (int)config[4], (int)config[5]};
    q->quant.dtype = (gpc_dtype)dtype;
    q->quant.per_channel = (int)pc;
    q->source = (gpc_dtype)source;
    /* the checksum first: a damaged field is reported as a damaged file */
    uint64_t size = (uint64_t)st.st_size, left = size - 4;
    uint32_t crc = 0, stored = 0;
    unsigned char buf[1 << 16];
    int readable = fseek(file, 0, SEEK_SET) == 0;
    while (readable && left > 0) {
        size_t k = left < sizeof buf ? (size_t)left : sizeof buf;
        readable = fread(buf, 1, k, file) == k;
        crc = gpc_crc32c(crc, buf, k);
        left -= k;
    }
    readable = readable && fread(&stored, 4, 1, file) == 1;
    uint64_t expected = expected_size(q);
    if (!readable || stored != crc) {
        fclose(file);
        if (expected != UINT64_MAX && size < expected)
            return gpc_error(GPC_ERR_FORMAT,
                             "%s is truncated: %llu bytes, expected %llu; quantize the run again",
                             path, (unsigned long long)size, (unsigned long long)expected);
        return gpc_error(GPC_ERR_FORMAT,
                         "%s is corrupt: its checksum does not match its contents (disk or copy "
                         "error); quantize the run again",
                         path);
    }
    gpt_config check;
    const char *field = NULL;
    if (gpt_config_init(&check, q->config.layers, q->config.heads, q->config.channels,
                        q->config.max_context, q->config.vocab_size) != GPC_OK ||
        check.padded_vocab != q->config.padded_vocab ||
        gpt_config_num_params(&check) != q->num_params)
        field = "model shape";
    else if ((q->quant.dtype != GPC_I8 && q->quant.dtype != GPC_F8E4M3) || pc > 1 ||
             (q->quant.dtype == GPC_I8 && !pc))
        field = "quantization";
    else if (q->num_params - 12 * (uint64_t)check.layers * (uint64_t)check.channels *
                                 (uint64_t)check.channels !=
             q->dense)
        field = "parameter count";
    else if (size != expected)
        field = "size";
    if (field) {
        gpc_clear_error();
        fclose(file);
        return gpc_error(GPC_ERR_FORMAT,
                         "%s is corrupt: its %s is out of range although its checksum holds "
                         "(written by another program?); quantize the run again",
                         path, field);
    }
    if (fseek(file, QUANT_HEADER_BYTES, SEEK_SET) != 0) {
        fclose(file);
        return gpc_error(GPC_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    }
    *out = file;
    return GPC_OK;
}

gpc_status gpt_quant_read_header(const char *path, gpt_config *config, gpt_quant_options *quant,
                                 gpc_dtype *source_precision) {
    FILE *file;
    quant_header q;
    unsigned char raw[QUANT_HEADER_BYTES];
    GPC_TRY(open_checked(path, &file, &q, raw));
    fclose(file);
    if (config) *config = q.config;
    if (quant) *quant = q.quant;
    if (source_precision) *source_precision = q.source;
    return GPC_OK;
}

static int read_all(FILE *file, void *data, size_t bytes) {
    return bytes == 0 || fread(data, 1, bytes, file) == bytes;
}

gpc_status gpt_quant_load(const char *path, gpt_model *m) {
    if (!m->quant.on)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s holds quantized weights: load them into a model made by "
                         "gpt_create_quant (or gpt_create_from_run)",
                         path);
    FILE *file;
    quant_header q;
    unsigned char raw[QUANT_HEADER_BYTES];
    GPC_TRY(open_checked(path, &file, &q, raw));
    char what[1200];
    snprintf(what, sizeof what, "quantized weights %s", path);
    if (!gpt_config_equal(&q.config, &m->config, what)) {
        fclose(file);
        return GPC_ERR_MISMATCH;
    }
    if (q.quant.dtype != m->quant.options.dtype ||
        q.quant.per_channel != m->quant.options.per_channel) {
        fclose(file);
        return gpc_error(GPC_ERR_MISMATCH, "%s is %s but the model was created for %s", path,
                         gpt_quant_name(&q.quant), gpt_quant_name(&m->quant.options));
    }
    m->cached_len = 0;
    quant_host h;
    gpc_status s = host_alloc(m, &h);
    if (s == GPC_OK && !read_all(file, h.dense, m->quant.dense_count * sizeof(float)))
        s = gpc_error(GPC_ERR_FORMAT, "%s is truncated", path);
    for (int i = 0; s == GPC_OK && i < GPT_NUM_PARAM_TENSORS; i++) {
        if (!gpt_param_quantized(i)) continue;
        if (!read_all(file, h.scales[i], gpc_tensor_bytes(&m->quant.scales[i])) ||
            !read_all(file, h.q[i], gpc_tensor_bytes(&m->params.all[i])))
            s = gpc_error(GPC_ERR_FORMAT, "%s is truncated", path);
    }
    fclose(file);
    if (s == GPC_OK) s = host_upload(m, &h);
    host_free(&h);
    return s;
}

/* ------------------------------------------------------------ run folders */

gpc_status gpt_run_weights(const char *run_dir, char *path, size_t size, gpt_config *config,
                           gpt_quant_options *quant) {
    if (!gpc_path_is_dir(run_dir))
        return gpc_error(GPC_ERR_IO,
                         "run folder %s does not exist (train one with gpc train --out %s, or "
                         "import one with gpc import hf)",
                         run_dir, run_dir);
    snprintf(path, size, "%s/quant.bin", run_dir);
    if (gpc_path_exists(path)) {
        gpt_quant_options q;
        GPC_TRY(gpt_quant_read_header(path, config, &q, NULL));
        if (quant) *quant = q;
        return GPC_OK;
    }
    snprintf(path, size, "%s/checkpoint.bin", run_dir);
    if (!gpc_path_exists(path))
        return gpc_error(GPC_ERR_IO,
                         "%s has no checkpoint.bin: train it first (gpc train --out %s)", run_dir,
                         run_dir);
    GPC_TRY(gpt_checkpoint_read_header(path, config, NULL, NULL));
    if (quant) *quant = (gpt_quant_options){GPC_F32, 0};
    return GPC_OK;
}

gpc_status gpt_create_from_run(gpt_model **out, const char *run_dir, gpc_device device,
                               gpc_dtype dtype, int B, int T) {
    *out = NULL;
    char path[4200];
    gpt_config config;
    gpt_quant_options q;
    GPC_TRY(gpt_run_weights(run_dir, path, sizeof path, &config, &q));
    gpt_model *m = NULL;
    int quantized = q.dtype != GPC_F32;
    gpc_status s = quantized ? gpt_create_quant(&m, &config, device, dtype, B, T, &q)
                             : gpt_create(&m, &config, device, dtype, B, T, 0);
    if (s == GPC_OK) s = quantized ? gpt_quant_load(path, m) : gpt_checkpoint_load(path, m, NULL);
    if (s != GPC_OK) {
        gpt_free(m);
        return s;
    }
    *out = m;
    return GPC_OK;
}
