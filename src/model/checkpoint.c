/*
 * checkpoint.c: GPT checkpoint files: everything a training run needs to
 * continue exactly (f32 master weights, AdamW moments, step, loader position,
 * RNG, the run's settings), or a sampler needs to generate.
 *
 * Layout (little-endian):
 *   a 256-byte header: magic "GPCCKPT\0", version, header size, the model
 *   config, precision, whether optimizer state follows, parameter count, the
 *   training state, zero padding;
 *   params f32 [P]; then, when present, m f32 [P] and v f32 [P];
 *   CRC-32C (u32) of every byte before it.
 * Written through gpc_atomic_* (temporary file, fsync, rename), so a crash
 * leaves the previous checkpoint whole. Device data streams through a small
 * host buffer so a large model does not need three host copies.
 */
#include "model/gpt_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "ops/ops.h"

#define CKPT_MAGIC "GPCCKPT" /* with its NUL: 8 bytes */
#define CKPT_HEADER_BYTES 256
#define CKPT_CHUNK_FLOATS ((size_t)1 << 20)

/* Field offsets in the header. The host is assumed little-endian (x86-64 and
 * aarch64, the machines gpc runs on). */
enum {
    OFF_MAGIC = 0,
    OFF_VERSION = 8,
    OFF_HEADER_BYTES = 12,
    OFF_CONFIG = 16, /* 6 x u32: layers, heads, channels, max_context, vocab, padded vocab */
    OFF_PRECISION = 40,
    OFF_HAS_OPTIMIZER = 44,
    OFF_NUM_PARAMS = 48,
    OFF_STEP = 56,
    OFF_LOADER_EPOCH = 64,
    OFF_LOADER_BATCH = 72,
    OFF_RNG_STATE = 80,
    OFF_RNG_INC = 88,
    OFF_LOSS_SCALE = 96,
    OFF_BATCH = 100,
    OFF_CONTEXT = 104,
    OFF_STEPS = 108,
    OFF_WARMUP = 112,
    OFF_TOTAL_BATCH = 120,
    OFF_LR = 128,
    OFF_MIN_LR_RATIO = 136,
    OFF_WEIGHT_DECAY = 144,
    OFF_MAX_GRAD_NORM = 152,
    OFF_SEED = 160,
    OFF_RECOMPUTE = 168, /* recompute + 1: older files hold 0 there (unknown) */
};

static void put(unsigned char *h, int offset, const void *value, size_t bytes) {
    memcpy(h + offset, value, bytes);
}

static void get(const unsigned char *h, int offset, void *value, size_t bytes) {
    memcpy(value, h + offset, bytes);
}

typedef struct {
    gpt_config config;
    gpc_dtype precision;
    uint32_t has_optimizer;
    uint64_t num_params;
    gpt_checkpoint_state state;
} ckpt_header;

/* The header of a checkpoint of a model of config c: its parameters in
 * dtype, with optimizer state when training, as the run's state s says. */
static void encode_header_of(unsigned char *h, const gpt_config *c, gpc_dtype dtype, int training,
                             float loss_scale, const gpt_checkpoint_state *s) {
    memset(h, 0, CKPT_HEADER_BYTES);
    memcpy(h + OFF_MAGIC, CKPT_MAGIC, 8);
    uint32_t version = GPT_CHECKPOINT_VERSION, header_bytes = CKPT_HEADER_BYTES;
    put(h, OFF_VERSION, &version, 4);
    put(h, OFF_HEADER_BYTES, &header_bytes, 4);
    uint32_t config[6] = {(uint32_t)c->layers,     (uint32_t)c->heads,
                          (uint32_t)c->channels,   (uint32_t)c->max_context,
                          (uint32_t)c->vocab_size, (uint32_t)c->padded_vocab};
    put(h, OFF_CONFIG, config, sizeof config);
    uint32_t precision = (uint32_t)dtype, has_optimizer = (uint32_t)training;
    uint64_t num_params = gpt_config_num_params(c);
    put(h, OFF_PRECISION, &precision, 4);
    put(h, OFF_HAS_OPTIMIZER, &has_optimizer, 4);
    put(h, OFF_NUM_PARAMS, &num_params, 8);
    put(h, OFF_STEP, &s->step, 8);
    put(h, OFF_LOADER_EPOCH, &s->loader_epoch, 8);
    put(h, OFF_LOADER_BATCH, &s->loader_batch, 8);
    put(h, OFF_RNG_STATE, &s->rng.state, 8);
    put(h, OFF_RNG_INC, &s->rng.inc, 8);
    put(h, OFF_LOSS_SCALE, &loss_scale, 4);
    put(h, OFF_BATCH, &s->batch, 4);
    put(h, OFF_CONTEXT, &s->context, 4);
    put(h, OFF_STEPS, &s->steps, 4);
    put(h, OFF_WARMUP, &s->warmup, 4);
    put(h, OFF_TOTAL_BATCH, &s->total_batch, 8);
    put(h, OFF_LR, &s->learning_rate, 8);
    put(h, OFF_MIN_LR_RATIO, &s->min_lr_ratio, 8);
    put(h, OFF_WEIGHT_DECAY, &s->weight_decay, 8);
    put(h, OFF_MAX_GRAD_NORM, &s->max_grad_norm, 8);
    put(h, OFF_SEED, &s->seed, 8);
    int32_t recompute_plus_one = s->recompute + 1;
    put(h, OFF_RECOMPUTE, &recompute_plus_one, 4);
}

static void encode_header(unsigned char *h, const gpt_model *m, const gpt_checkpoint_state *s) {
    /* the loss scale is the model's, which fp16 adapts; a part's file is
     * the whole model's */
    encode_header_of(h, &m->whole, m->dtype, m->training, gpc_optim_loss_scale(m->optim), s);
}

static void decode_header(const unsigned char *h, ckpt_header *out) {
    uint32_t config[6], precision;
    memset(out, 0, sizeof *out);
    get(h, OFF_CONFIG, config, sizeof config);
    out->config.layers = (int)config[0];
    out->config.heads = (int)config[1];
    out->config.channels = (int)config[2];
    out->config.max_context = (int)config[3];
    out->config.vocab_size = (int)config[4];
    out->config.padded_vocab = (int)config[5];
    get(h, OFF_PRECISION, &precision, 4);
    out->precision = (gpc_dtype)precision;
    get(h, OFF_HAS_OPTIMIZER, &out->has_optimizer, 4);
    get(h, OFF_NUM_PARAMS, &out->num_params, 8);
    gpt_checkpoint_state *s = &out->state;
    get(h, OFF_STEP, &s->step, 8);
    get(h, OFF_LOADER_EPOCH, &s->loader_epoch, 8);
    get(h, OFF_LOADER_BATCH, &s->loader_batch, 8);
    get(h, OFF_RNG_STATE, &s->rng.state, 8);
    get(h, OFF_RNG_INC, &s->rng.inc, 8);
    get(h, OFF_LOSS_SCALE, &s->loss_scale, 4);
    get(h, OFF_BATCH, &s->batch, 4);
    get(h, OFF_CONTEXT, &s->context, 4);
    get(h, OFF_STEPS, &s->steps, 4);
    get(h, OFF_WARMUP, &s->warmup, 4);
    get(h, OFF_TOTAL_BATCH, &s->total_batch, 8);
    get(h, OFF_LR, &s->learning_rate, 8);
    get(h, OFF_MIN_LR_RATIO, &s->min_lr_ratio, 8);
    get(h, OFF_WEIGHT_DECAY, &s->weight_decay, 8);
    get(h, OFF_MAX_GRAD_NORM, &s->max_grad_norm, 8);
    get(h, OFF_SEED, &s->seed, 8);
    int32_t recompute_plus_one = 0;
    get(h, OFF_RECOMPUTE, &recompute_plus_one, 4);
    s->recompute = recompute_plus_one - 1;
}

/* ------------------------------------------------------------ saving */

/* Streams a device f32 tensor into the file through the staging buffer, or
 * host values when host is not NULL. */
static gpc_status write_tensor(gpc_atomic_file *f, const gpc_tensor *t, float *stage,
                               const float *host) {
    size_t n = (size_t)gpc_tensor_numel(t);
    if (host) return gpc_atomic_write(f, host, n * sizeof(float));
    for (size_t done = 0; done < n; done += CKPT_CHUNK_FLOATS) {
        size_t k = n - done < CKPT_CHUNK_FLOATS ? n - done : CKPT_CHUNK_FLOATS;
        gpc_tensor src = gpc_tensor_1d((float *)t->data + done, GPC_F32, t->device, (int64_t)k);
        gpc_tensor dst = gpc_tensor_1d(stage, GPC_F32, gpc_cpu(), (int64_t)k);
        GPC_TRY(gpc_tensor_copy(&dst, &src));
        GPC_TRY(gpc_atomic_write(f, stage, k * sizeof(float)));
    }
    return GPC_OK;
}

void gpt_host_state_free(gpt_host_state *state) {
    gpc_free(state->master);
    gpc_free(state->m);
    gpc_free(state->v);
    memset(state, 0, sizeof *state);
}

gpc_status gpt_checkpoint_save(const char *path, const gpt_model *m,
                               const gpt_checkpoint_state *state) {
    return gpt_checkpoint_save_full(path, m, state, NULL);
}

gpc_status gpt_checkpoint_save_full(const char *path, const gpt_model *m,
                                    const gpt_checkpoint_state *state, const gpt_host_state *full) {
    gpt_host_state none = {0};
    if (!full) full = &none;
    if (m->quant.on)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "saving checkpoint %s: the model's weights are quantized (inference "
                         "only); save them with gpt_quant_save",
                         path);
    if (m->lora.options.rank)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "saving checkpoint %s: a LoRA model's base is frozen; save its adapters "
                         "with gpt_lora_save, or merge them first (gpt_lora_merged_params)",
                         path);
    /* a shard of the optimizer state is not a checkpoint */
    const gpc_tensor *master = gpc_optim_master(m->optim);
    const gpc_tensor *mom = gpc_optim_m(m->optim), *var = gpc_optim_v(m->optim);
    if (gpt_is_sharded(m) && ((master && !full->master) || (m->training && (!full->m || !full->v))))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "saving checkpoint %s: the model holds one shard of the optimizer state; "
                         "gather it first (gpc_ddp_gather_state) and pass it to "
                         "gpt_checkpoint_save_full",
                         path);
    if (gpt_is_part(m) && (!full->master || (m->training && (!full->m || !full->v))))
        return gpc_error(
            GPC_ERR_INVALID_ARG,
            "saving checkpoint %s: the model holds one tensor- or pipeline-parallel part; "
            "gather the whole parameters, m and v first and pass them to "
            "gpt_checkpoint_save_full",
            path);
    unsigned char header[CKPT_HEADER_BYTES];
    encode_header(header, m, state);
    float *stage = gpc_malloc(CKPT_CHUNK_FLOATS * sizeof(float));
    if (!stage) return gpc_error(GPC_ERR_NOMEM, "out of host memory writing %s", path);
    gpc_atomic_file f;
    gpc_status s = gpc_atomic_open(&f, path);
    if (s != GPC_OK) {
        gpc_free(stage);
        return s;
    }
    /* f32 arrays of num_params elements (data unused where host values come) */
    int64_t P = (int64_t)gpt_config_num_params(&m->whole);
    gpc_tensor whole = gpc_tensor_make(NULL, GPC_F32, m->device, 1, &P);
    const gpc_tensor *params = full->master ? &whole : master ? master : &m->params_flat;
    s = gpc_atomic_write(&f, header, sizeof header);
    if (s == GPC_OK) s = write_tensor(&f, params, stage, full->master);
    if (s == GPC_OK && m->training) s = write_tensor(&f, full->m ? &whole : mom, stage, full->m);
    if (s == GPC_OK && m->training) s = write_tensor(&f, full->v ? &whole : var, stage, full->v);
    if (s == GPC_OK) {
        uint32_t crc = f.crc;
        s = gpc_atomic_write(&f, &crc, sizeof crc);
    }
    if (s == GPC_OK)
        s = gpc_atomic_commit(&f);
    else
        gpc_atomic_abort(&f);
    gpc_free(stage);
    if (s != GPC_OK) return gpc_error_context(s, "saving checkpoint %s: ", path);
    return GPC_OK;
}

gpc_status gpt_checkpoint_save_weights(const char *path, const gpt_config *config,
                                       const float *params, const gpt_checkpoint_state *state) {
    unsigned char header[CKPT_HEADER_BYTES];
    encode_header_of(header, config, GPC_F32, 0, state->loss_scale, state);
    gpc_atomic_file f;
    gpc_status s = gpc_atomic_open(&f, path);
    if (s != GPC_OK) return gpc_error_context(s, "saving checkpoint %s: ", path);
    s = gpc_atomic_write(&f, header, sizeof header);
    if (s == GPC_OK)
        s = gpc_atomic_write(&f, params, gpt_config_num_params(config) * sizeof *params);
    if (s == GPC_OK) {
        uint32_t crc = f.crc;
        s = gpc_atomic_write(&f, &crc, sizeof crc);
    }
    if (s == GPC_OK)
        s = gpc_atomic_commit(&f);
    else
        gpc_atomic_abort(&f);
    if (s != GPC_OK) return gpc_error_context(s, "saving checkpoint %s: ", path);
    return GPC_OK;
}

/* ------------------------------------------------------------ loading */

/* The CRC-32C of the first bytes of a file, read from its start. */
static int crc_of_prefix(FILE *file, uint64_t bytes, uint32_t *crc) {
    unsigned char buf[1 << 16];
    *crc = 0;
    if (fseek(file, 0, SEEK_SET) != 0) return -1;
    while (bytes > 0) {
        size_t k = bytes < sizeof buf ? (size_t)bytes : sizeof buf;
        if (fread(buf, 1, k, file) != k) return -1;
        *crc = gpc_crc32c(*crc, buf, k);
        bytes -= k;
    }
    return 0;
}

static int finite_in(double v, double lo, double hi) {
    return isfinite(v) && v >= lo && v <= hi;
}

/* The training state's fields, each in the range gpc trains with; NULL when
 * all hold, else the first that does not. A checkpoint saved for sampling
 * alone (batch, context and steps 0) has no training state to check. */
static const char *bad_state_field(const gpt_checkpoint_state *s, const gpt_config *c) {
    if (s->batch == 0 && s->context == 0 && s->steps == 0) return NULL;
    if (s->batch <= 0) return "batch";
    if (s->context <= 0 || s->context > c->max_context) return "context";
    if (s->steps <= 0) return "steps";
    if (s->warmup < 0) return "warmup";
    int64_t micro = (int64_t)s->batch * s->context;
    if (s->total_batch < micro || s->total_batch % micro != 0 ||
        s->total_batch / micro > (int64_t)1 << 30)
        return "total batch";
    if (!finite_in(s->learning_rate, 0, 1) || s->learning_rate == 0) return "learning rate";
    if (!finite_in(s->min_lr_ratio, 0, 1)) return "min lr ratio";
    if (!finite_in(s->weight_decay, 0, 1e6)) return "weight decay";
    if (!finite_in(s->max_grad_norm, 0, 1e30)) return "max grad norm";
    if (!finite_in(s->loss_scale, 0, 1e38)) return "loss scale";
    if (s->recompute < -1 ||
        (s->recompute >= 0 && gpt_recompute_check(s->recompute, c->layers) != GPC_OK)) {
        gpc_clear_error();
        return "recompute";
    }
    if (s->rng.inc % 2 == 0) return "random number state";
    return NULL;
}

/* A run folder that holds quantized weights (quant.bin) and no
 * checkpoint.bin: inference only, which says more than "no such file". */
static gpc_status refuse_quantized_run(const char *path) {
    if (gpc_path_exists(path)) return GPC_OK;
    char dir[4096], quant[4200];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    else
        snprintf(dir, sizeof dir, ".");
    snprintf(quant, sizeof quant, "%s/quant.bin", dir);
    if (!gpc_path_exists(quant)) return GPC_OK;
    return gpc_error(GPC_ERR_INVALID_ARG,
                     "%s holds quantized weights (quant.bin, written by gpc quantize) for "
                     "inference only (gpc sample, gpc eval, serving); train or export from the "
                     "run it was quantized from (source_run in its config.txt)",
                     dir);
}

/* Opens a checkpoint and checks it before its payload is read: magic and
 * version, then the checksum of the whole file, and only then the header's
 * fields, each against its range, and the file's size against them. A
 * damaged field is thus reported as a damaged file, never acted on. */
static gpc_status open_checked(const char *path, FILE **out, ckpt_header *hdr, unsigned char *raw) {
    *out = NULL;
    void *opened;
    GPC_TRY(refuse_quantized_run(path));
    GPC_TRY(gpc_open_regular(path, "checkpoint", &opened));
    FILE *file = opened;
    struct stat st;
    if (fstat(fileno(file), &st) != 0) {
        fclose(file);
        return gpc_error(GPC_ERR_IO, "cannot read checkpoint %s: %s", path, strerror(errno));
    }
    memset(raw, 0, CKPT_HEADER_BYTES); /* a short read leaves zeros, not garbage */
    size_t got = fread(raw, 1, CKPT_HEADER_BYTES, file);
    if (got < 8 || memcmp(raw, CKPT_MAGIC, 8) != 0) {
        fclose(file);
        return gpc_error(GPC_ERR_FORMAT,
                         "%s is not a gpc checkpoint (its first bytes are not "
                         "GPCCKPT)",
                         path);
    }
    uint32_t version = 0, header_bytes = 0;
    if (got >= 16) {
        get(raw, OFF_VERSION, &version, 4);
        get(raw, OFF_HEADER_BYTES, &header_bytes, 4);
    }
    if (got >= 16 && version != GPT_CHECKPOINT_VERSION) {
        fclose(file);
        return gpc_error(GPC_ERR_FORMAT,
                         "checkpoint %s has format version %u; this gpc reads version %d (use "
                         "the gpc that wrote it, or train again)",
                         path, version, GPT_CHECKPOINT_VERSION);
    }
    if (got < CKPT_HEADER_BYTES || header_bytes != CKPT_HEADER_BYTES ||
        st.st_size < CKPT_HEADER_BYTES + 4) {
        fclose(file);
        return gpc_error(GPC_ERR_FORMAT,
                         "checkpoint %s is truncated: its header is incomplete (%zu bytes); the "
                         "write was interrupted, use checkpoint.prev.bin or train again",
                         path, got);
    }
    uint64_t size = (uint64_t)st.st_size;
    uint32_t crc = 0, stored = 0;
    int readable = crc_of_prefix(file, size - 4, &crc) == 0 && fread(&stored, 4, 1, file) == 1;
    decode_header(raw, hdr);
    /* the header's sizes, used only to say why the checksum failed */
    uint64_t arrays = hdr->has_optimizer ? 3 : 1;
    uint64_t expected = hdr->num_params < ((uint64_t)1 << 60) / 12
                            ? CKPT_HEADER_BYTES + arrays * hdr->num_params * sizeof(float) + 4
                            : UINT64_MAX;
    if (!readable || stored != crc) {
        fclose(file);
        if (hdr->has_optimizer <= 1 && size < expected)
            return gpc_error(GPC_ERR_FORMAT,
                             "checkpoint %s is truncated: %llu bytes, expected %llu; the write "
                             "was interrupted, use checkpoint.prev.bin or train again",
                             path, (unsigned long long)size, (unsigned long long)expected);
        if (!readable)
            return gpc_error(GPC_ERR_IO, "cannot read checkpoint %s: %s", path,
                             strerror(errno ? errno : EIO));
        return gpc_error(GPC_ERR_FORMAT,
                         "checkpoint %s is corrupt: its checksum does not match its contents "
                         "(disk or copy error); use checkpoint.prev.bin or train again",
                         path);
    }
    gpt_config check;
    const char *field = NULL;
    if (gpt_config_init(&check, hdr->config.layers, hdr->config.heads, hdr->config.channels,
                        hdr->config.max_context, hdr->config.vocab_size) != GPC_OK ||
        check.padded_vocab != hdr->config.padded_vocab ||
        gpt_config_num_params(&check) != hdr->num_params)
        field = "model shape";
    else if (hdr->has_optimizer > 1)
        field = "optimizer flag";
    else if (hdr->precision != GPC_F32 && hdr->precision != GPC_BF16 && hdr->precision != GPC_F16)
        field = "precision";
    else if (size != expected)
        field = "size";
    else
        field = bad_state_field(&hdr->state, &hdr->config);
    if (field) {
        gpc_clear_error();
        fclose(file);
        return gpc_error(GPC_ERR_FORMAT,
                         "checkpoint %s is corrupt: its %s is out of range although its "
                         "checksum holds (written by another program?); use "
                         "checkpoint.prev.bin or train again",
                         path, field);
    }
    if (fseek(file, CKPT_HEADER_BYTES, SEEK_SET) != 0) {
        fclose(file);
        return gpc_error(GPC_ERR_IO, "cannot read checkpoint %s: %s", path, strerror(errno));
    }
    *out = file;
    return GPC_OK;
}

gpc_status gpt_checkpoint_read_header(const char *path, gpt_config *config, gpc_dtype *precision,
                                      gpt_checkpoint_state *state) {
    FILE *file;
    ckpt_header hdr = {0};
    unsigned char raw[CKPT_HEADER_BYTES];
    GPC_TRY(open_checked(path, &file, &hdr, raw));
    fclose(file);
    if (config) *config = hdr.config;
    if (precision) *precision = hdr.precision;
    if (state) *state = hdr.state;
    return GPC_OK;
}

/* Where the n floats of one array go: elements [lo, lo + count) into the
 * device tensor dst (element lo at dst's start); the rest is skipped. And,
 * when low is set, every element converted to the compute dtype into the
 * parameters (a sharded low-precision model has no whole f32 copy). */
typedef struct {
    const gpc_tensor *dst;
    size_t lo, count;
    gpc_tensor *low; /* [n] bf16 or fp16 */
    uint16_t *half;  /* [CKPT_CHUNK_FLOATS] host staging for low */
} read_target;

/* Reads the CRC that ends the file and compares it with the one computed
 * over what was read. */
static gpc_status read_trailer(FILE *file, const char *path, uint32_t crc) {
    uint32_t stored = 0;
    if (fread(&stored, 4, 1, file) != 1)
        return gpc_error(GPC_ERR_FORMAT, "checkpoint %s is truncated", path);
    if (stored != crc)
        return gpc_error(GPC_ERR_FORMAT,
                         "checkpoint %s is corrupt: its checksum does not match its contents "
                         "(disk or copy error); use checkpoint.prev.bin or train again",
                         path);
    return GPC_OK;
}

/* Reads n floats into the target, adding them to the running CRC. */
static gpc_status read_tensor(FILE *file, const char *path, const read_target *t, size_t n,
                              float *stage, uint32_t *crc) {
    for (size_t done = 0; done < n; done += CKPT_CHUNK_FLOATS) {
        size_t k = n - done < CKPT_CHUNK_FLOATS ? n - done : CKPT_CHUNK_FLOATS;
        if (fread(stage, sizeof(float), k, file) != k)
            return gpc_error(GPC_ERR_FORMAT, "checkpoint %s is truncated", path);
        *crc = gpc_crc32c(*crc, stage, k * sizeof(float));
        size_t a = done > t->lo ? done : t->lo, e = t->lo + t->count;
        if (e > done + k) e = done + k;
        if (t->dst && a < e) {
            gpc_tensor src =
                gpc_tensor_1d(stage + (a - done), GPC_F32, gpc_cpu(), (int64_t)(e - a));
            gpc_tensor to = gpc_tensor_1d((float *)t->dst->data + (a - t->lo), GPC_F32,
                                          t->dst->device, (int64_t)(e - a));
            GPC_TRY(gpc_tensor_copy(&to, &src));
        }
        if (t->low) {
            for (size_t i = 0; i < k; i++)
                t->half[i] = t->low->dtype == GPC_BF16 ? gpc_f32_to_bf16(stage[i])
                                                       : gpc_f32_to_f16(stage[i]);
            gpc_tensor src = gpc_tensor_1d(t->half, t->low->dtype, gpc_cpu(), (int64_t)k);
            gpc_tensor to = gpc_tensor_1d((uint16_t *)t->low->data + done, t->low->dtype,
                                          t->low->device, (int64_t)k);
            GPC_TRY(gpc_tensor_copy(&to, &src));
        }
    }
    return GPC_OK;
}

/* A part's load (tensor or pipeline parallelism): the whole arrays on the
 * host, checked, then this rank's part of them (gpt_tp.c). */
static gpc_status load_sliced(const char *path, FILE *file, const ckpt_header *hdr,
                              const unsigned char *raw, gpt_model *m, int weights_only) {
    size_t P = (size_t)hdr->num_params, Pl = m->num_params;
    int arrays = hdr->has_optimizer ? 3 : 1;
    float *whole = gpc_malloc((size_t)arrays * P * sizeof(float));
    float *local = gpc_malloc((size_t)arrays * Pl * sizeof(float));
    float *stage = gpc_malloc(CKPT_CHUNK_FLOATS * sizeof(float));
    gpc_status s = GPC_OK;
    if (!whole || !local || !stage)
        s = gpc_error(GPC_ERR_NOMEM, "out of host memory reading %s (%.1f MiB)", path,
                      (double)arrays * (double)(P + Pl) * 4.0 / 1048576.0);
    uint32_t crc = gpc_crc32c(0, raw, CKPT_HEADER_BYTES);
    for (int k = 0; s == GPC_OK && k < arrays; k++) {
        gpc_tensor host = gpc_tensor_1d(whole + (size_t)k * P, GPC_F32, gpc_cpu(), (int64_t)P);
        read_target t = {&host, 0, P, NULL, NULL};
        s = read_tensor(file, path, &t, P, stage, &crc);
    }
    if (s == GPC_OK) s = read_trailer(file, path, crc);
    for (int k = 0; s == GPC_OK && k < arrays; k++)
        gpt_part_slice(&m->whole, &m->par, whole + (size_t)k * P, local + (size_t)k * Pl);
    if (s == GPC_OK) s = gpt_set_params(m, local);
    for (int k = 1; s == GPC_OK && m->training && k < 3; k++) {
        /* the optimizer's m (k 1) and v (k 2) over its shard; zero without them */
        gpc_tensor dst = *(k == 1 ? gpc_optim_m(m->optim) : gpc_optim_v(m->optim));
        if (k >= arrays || weights_only) {
            s = gpc_tensor_zero(&dst);
            continue;
        }
        gpc_tensor src = gpc_tensor_1d(local + (size_t)k * Pl + m->shard_offset, GPC_F32, gpc_cpu(),
                                       (int64_t)m->shard_count);
        s = gpc_tensor_copy(&dst, &src);
    }
    gpc_free(whole);
    gpc_free(local);
    gpc_free(stage);
    fclose(file);
    return s;
}

/* The file's training state into *state (when asked) and its fp16 loss
 * scale into the optimizer: what a resumed run takes besides the arrays. */
static void take_state(gpt_model *m, const ckpt_header *hdr, gpt_checkpoint_state *state) {
    if (state) *state = hdr->state;
    if (m->dtype == GPC_F16 && hdr->state.loss_scale > 0)
        gpc_optim_set_loss_scale(m->optim, hdr->state.loss_scale);
}

/* weights_only: the optimizer state in the file is read (for the checksum)
 * but not kept; a training model's m and v are zeroed, and no state or loss
 * scale is taken. */
static gpc_status load_checkpoint(const char *path, gpt_model *m, gpt_checkpoint_state *state,
                                  int weights_only) {
    FILE *file;
    ckpt_header hdr = {0};
    unsigned char raw[CKPT_HEADER_BYTES];
    if (m->quant.on)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "loading checkpoint %s into a quantized model: give it quantized "
                         "weights (gpt_quant_load), or f32 values through gpt_set_params",
                         path);
    if (m->lora.options.rank)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "loading checkpoint %s: a LoRA model takes its base through "
                         "gpt_set_params and its adapters through gpt_lora_load",
                         path);
    GPC_TRY(open_checked(path, &file, &hdr, raw));
    char what[1200];
    snprintf(what, sizeof what, "checkpoint %s", path);
    if (!gpt_config_equal(&hdr.config, &m->whole, what)) {
        fclose(file);
        return GPC_ERR_MISMATCH;
    }
    if (gpt_is_part(m)) {
        GPC_TRY(load_sliced(path, file, &hdr, raw, m, weights_only));
        if (!weights_only) take_state(m, &hdr, state);
        return GPC_OK;
    }
    /* a sharded low-precision model converts every parameter on the host
     * and keeps its shard of the f32 values as master weights */
    const gpc_tensor *master = gpc_optim_master(m->optim);
    int low_shard = master && gpt_is_sharded(m);
    float *stage = gpc_malloc(CKPT_CHUNK_FLOATS * sizeof(float));
    uint16_t *half = low_shard ? gpc_malloc(CKPT_CHUNK_FLOATS * sizeof(uint16_t)) : NULL;
    if (!stage || (low_shard && !half)) {
        gpc_free(stage);
        fclose(file);
        return gpc_error(GPC_ERR_NOMEM, "out of host memory reading %s", path);
    }
    uint32_t crc = gpc_crc32c(0, raw, CKPT_HEADER_BYTES);
    size_t P = m->num_params, lo = m->shard_offset, count = m->shard_count;
    int moments = hdr.has_optimizer && m->training && !weights_only;
    /* the optimizer's state arrays tile the shard: element e at e - lo */
    read_target params = {&m->params_flat, 0, P, NULL, NULL};
    if (master) params = (read_target){master, lo, count, NULL, NULL};
    if (low_shard) params.low = &m->params_flat, params.half = half;
    read_target mom = {moments ? gpc_optim_m(m->optim) : NULL, lo, count, NULL, NULL};
    read_target var = {moments ? gpc_optim_v(m->optim) : NULL, lo, count, NULL, NULL};
    gpc_status s = read_tensor(file, path, &params, P, stage, &crc);
    if (s == GPC_OK && hdr.has_optimizer) s = read_tensor(file, path, &mom, P, stage, &crc);
    if (s == GPC_OK && hdr.has_optimizer) s = read_tensor(file, path, &var, P, stage, &crc);
    if (s == GPC_OK) s = read_trailer(file, path, crc);
    gpc_free(stage);
    gpc_free(half);
    fclose(file);
    if (s != GPC_OK) return s;
    if (master && gpc_optim_offloaded(m->optim)) {
        /* the master is in host memory: rounded there, then copied up */
        GPC_TRY(gpc_optim_master_to_params(m->optim, &m->params_flat));
    } else if (master) {
        /* the shard (all of it unsharded) from the master, on the device */
        int64_t n = (int64_t)count;
        gpc_tensor own =
            gpc_tensor_make((char *)m->params_flat.data + lo * gpc_dtype_size(m->dtype), m->dtype,
                            m->device, 1, &n);
        GPC_TRY(gpc_op_convert(low_shard ? &own : &m->params_flat, master));
    }
    if (m->training && !moments) {
        gpc_tensor mom_zero = *gpc_optim_m(m->optim), var_zero = *gpc_optim_v(m->optim);
        GPC_TRY(gpc_tensor_zero(&mom_zero));
        GPC_TRY(gpc_tensor_zero(&var_zero));
    }
    if (!weights_only) take_state(m, &hdr, state);
    return GPC_OK;
}

gpc_status gpt_checkpoint_load(const char *path, gpt_model *m, gpt_checkpoint_state *state) {
    return load_checkpoint(path, m, state, 0);
}

gpc_status gpt_checkpoint_load_weights(const char *path, gpt_model *m) {
    return load_checkpoint(path, m, NULL, 1);
}
