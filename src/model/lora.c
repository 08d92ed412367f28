/*
 * lora.c: LoRA adapters outside the step: their targets and sizes, reading
 * and setting them, folding them into the base weights (merge), and the
 * adapter file. The forward and backward products live in gpt.c.
 *
 * Adapter file (little-endian), written through gpc_atomic_*:
 *   magic "GPCLORA\0", u32 version, u32 header bytes (256);
 *   config 6 x u32, rank u32, alpha f32, targets u32, has moments u32,
 *   adapter count u64, the training state as in checkpoints, the base
 *   run's folder (u32 length, then its bytes, in the header's tail);
 *   adapters f32 [n], then m and v f32 [n] when present;
 *   CRC-32C (u32) of every byte before it.
 * The checksum is checked before any header field is acted on.
 */
#include "model/gpt_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define LORA_MAGIC "GPCLORA" /* with its NUL: 8 bytes */
#define LORA_HEADER_BYTES 1024
#define LORA_BASE_MAX 800

static const char *const target_names[GPT_LORA_TARGETS] = {"qkv", "proj", "fc", "fcproj"};

void gpt_lora_dims(int target, int64_t C, int64_t *in, int64_t *out) {
    /* qkv C -> 3C, attention projection C -> C, fc C -> 4C, fcproj 4C -> C */
    static const int64_t ins[GPT_LORA_TARGETS] = {1, 1, 1, 4},
                         outs[GPT_LORA_TARGETS] = {3, 1, 4, 1};
    *in = ins[target] * C;
    *out = outs[target] * C;
}

gpc_status gpt_lora_parse_targets(const char *list, unsigned *targets) {
    *targets = 0;
    const char *p = list ? list : "";
    while (*p) {
        size_t n = strcspn(p, ",");
        int found = -1;
        for (int t = 0; t < GPT_LORA_TARGETS; t++)
            if (strlen(target_names[t]) == n && strncmp(p, target_names[t], n) == 0) found = t;
        if (found < 0)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "--lora-targets '%s': '%.*s' is not one of qkv, proj, fc, fcproj",
                             list, (int)n, p);
        *targets |= 1u << found;
        p += n;
        if (*p == ',') p++;
    }
    if (!*targets)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--lora-targets is empty: list some of qkv, proj, fc, fcproj");
    return GPC_OK;
}

size_t gpt_lora_count_params(const gpt_config *c, int rank, unsigned targets) {
    if (!targets) targets = GPT_LORA_ALL;
    size_t n = 0;
    for (int t = 0; t < GPT_LORA_TARGETS; t++) {
        if (!(targets & (1u << t))) continue;
        int64_t in, out;
        gpt_lora_dims(t, c->channels, &in, &out);
        n += (size_t)c->layers * (size_t)rank * (size_t)(in + out);
    }
    return n;
}

const gpt_lora_options *gpt_lora_of(const gpt_model *m) {
    return m->lora.options.rank ? &m->lora.options : NULL;
}

size_t gpt_lora_num_params(const gpt_model *m) {
    return m->lora.options.rank ? m->lora.num_params : 0;
}

static gpc_status need_lora(const gpt_model *m) {
    if (m->lora.options.rank) return GPC_OK;
    return gpc_error(GPC_ERR_INVALID_ARG,
                     "this model has no LoRA adapters; create it with gpt_create_lora");
}

gpc_status gpt_lora_set_params(gpt_model *m, const float *values) {
    GPC_TRY(need_lora(m));
    m->cached_len = 0;
    const gpc_tensor *master = gpc_optim_master(m->optim);
    if (master) return gpc_optim_set_master(m->optim, &m->lora.params_flat, values);
    gpc_tensor host =
        gpc_tensor_1d((void *)values, GPC_F32, gpc_cpu(), (int64_t)m->lora.num_params);
    return gpc_tensor_copy(&m->lora.params_flat, &host);
}

gpc_status gpt_lora_get_params(const gpt_model *m, float *values) {
    GPC_TRY(need_lora(m));
    if (gpc_optim_master(m->optim)) return gpc_optim_get_master(m->optim, values);
    gpc_tensor host = gpc_tensor_1d(values, GPC_F32, gpc_cpu(), (int64_t)m->lora.num_params);
    return gpc_tensor_copy(&host, &m->lora.params_flat);
}

/* The base tensor a target adapts. */
static int target_param(int t) {
    static const int index[GPT_LORA_TARGETS] = {4, 6, 10, 12}; /* qkvw attprojw fcw fcprojw */
    return index[t];
}

gpc_status gpt_lora_merged_params(const gpt_model *m, float *values) {
    GPC_TRY(need_lora(m));
    const gpt_lora *lo = &m->lora;
    float *ad = gpc_malloc(lo->num_params * sizeof *ad);
    if (!ad) return gpc_error(GPC_ERR_NOMEM, "out of host memory merging the adapters");
    gpc_status s = gpt_get_params(m, values);
    if (s == GPC_OK) s = gpt_lora_get_params(m, ad);
    int64_t L = m->config.layers, R = lo->options.rank;
    for (int t = 0; s == GPC_OK && t < GPT_LORA_TARGETS; t++) {
        if (!(lo->options.targets & (1u << t))) continue;
        int64_t in, out;
        gpt_lora_dims(t, m->config.channels, &in, &out);
        for (int64_t l = 0; l < L; l++) {
            const float *a = ad + lo->a_offset[t] + (size_t)(l * R * in);
            const float *b = ad + lo->b_offset[t] + (size_t)(l * out * R);
            float *w = values + m->param_offset[target_param(t)] + (size_t)(l * out * in);
            for (int64_t o = 0; o < out; o++)
                for (int64_t i = 0; i < in; i++) {
                    double sum = 0.0;
                    for (int64_t r = 0; r < R; r++)
                        sum += (double)b[o * R + r] * (double)a[r * in + i];
                    w[o * in + i] = (float)((double)w[o * in + i] + (double)lo->scale * sum);
                }
        }
    }
    gpc_free(ad);
    return s;
}

/* ------------------------------------------------------------ the file */

enum {
    OFF_MAGIC = 0,
    OFF_VERSION = 8,
    OFF_HEADER_BYTES = 12,
    OFF_CONFIG = 16, /* 6 x u32 */
    OFF_RANK = 40,
    OFF_ALPHA = 44,
    OFF_TARGETS = 48,
    OFF_HAS_MOMENTS = 52,
    OFF_COUNT = 56,
    OFF_STATE = 64, /* gpt_checkpoint_state fields, below */
    OFF_BASE_LEN = 200,
    OFF_BASE = 204,
};

typedef struct {
    gpt_config config;
    gpt_lora_options lora;
    uint32_t has_moments;
    uint64_t count;
    gpt_checkpoint_state state;
    char base[LORA_BASE_MAX + 1];
} lora_header;

/* The state's fields one after the other from OFF_STATE (decode when get). */
static void state_fields(unsigned char *h, gpt_checkpoint_state *s, int get) {
    struct {
        void *p;
        size_t n;
    } f[] = {{&s->step, 8},         {&s->loader_epoch, 8}, {&s->loader_batch, 8},
             {&s->rng.state, 8},    {&s->rng.inc, 8},      {&s->loss_scale, 4},
             {&s->batch, 4},        {&s->context, 4},      {&s->total_batch, 8},
             {&s->steps, 4},        {&s->warmup, 4},       {&s->learning_rate, 8},
             {&s->min_lr_ratio, 8}, {&s->weight_decay, 8}, {&s->max_grad_norm, 8},
             {&s->seed, 8},         {&s->recompute, 4}};
    size_t at = OFF_STATE;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (get)
            memcpy(f[i].p, h + at, f[i].n);
        else
            memcpy(h + at, f[i].p, f[i].n);
        at += f[i].n;
    }
}

/* Streams n f32 of a device tensor (or host values) into the file. */
static gpc_status write_floats(gpc_atomic_file *f, const gpc_tensor *t) {
    size_t n = (size_t)gpc_tensor_numel(t);
    float *host = gpc_malloc(n ? n * sizeof *host : 1);
    if (!host) return gpc_error(GPC_ERR_NOMEM, "out of host memory writing the adapters");
    gpc_tensor to = gpc_tensor_1d(host, GPC_F32, gpc_cpu(), (int64_t)n);
    gpc_status s = gpc_tensor_copy(&to, t);
    if (s == GPC_OK) s = gpc_atomic_write(f, host, n * sizeof *host);
    gpc_free(host);
    return s;
}

gpc_status gpt_lora_save(const char *path, const gpt_model *m, const gpt_checkpoint_state *state,
                         const char *base_run) {
    GPC_TRY(need_lora(m));
    const gpt_lora *lo = &m->lora;
    size_t base_len = base_run ? strlen(base_run) : 0;
    if (base_len > LORA_BASE_MAX)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "saving adapters %s: the base run's path is longer than %d bytes; move "
                         "the base run to a shorter path",
                         path, LORA_BASE_MAX);
    unsigned char h[LORA_HEADER_BYTES];
    memset(h, 0, sizeof h);
    memcpy(h + OFF_MAGIC, LORA_MAGIC, 8);
    uint32_t u32[6] = {GPT_LORA_VERSION, LORA_HEADER_BYTES};
    memcpy(h + OFF_VERSION, u32, 8);
    const gpt_config *c = &m->config;
    uint32_t config[6] = {(uint32_t)c->layers,     (uint32_t)c->heads,
                          (uint32_t)c->channels,   (uint32_t)c->max_context,
                          (uint32_t)c->vocab_size, (uint32_t)c->padded_vocab};
    memcpy(h + OFF_CONFIG, config, sizeof config);
    uint32_t rank = (uint32_t)lo->options.rank, targets = lo->options.targets;
    uint32_t has_moments = (uint32_t)m->training;
    uint64_t count = lo->num_params;
    memcpy(h + OFF_RANK, &rank, 4);
    memcpy(h + OFF_ALPHA, &lo->options.alpha, 4);
    memcpy(h + OFF_TARGETS, &targets, 4);
    memcpy(h + OFF_HAS_MOMENTS, &has_moments, 4);
    memcpy(h + OFF_COUNT, &count, 8);
    gpt_checkpoint_state st;
    memset(&st, 0, sizeof st);
    if (state) st = *state;
    st.loss_scale = gpc_optim_loss_scale(m->optim);
    state_fields(h, &st, 0);
    uint32_t len = (uint32_t)base_len;
    memcpy(h + OFF_BASE_LEN, &len, 4);
    if (base_len) memcpy(h + OFF_BASE, base_run, base_len);

    const gpc_tensor *master = gpc_optim_master(m->optim);
    gpc_atomic_file f;
    GPC_TRY(gpc_atomic_open(&f, path));
    gpc_status s = gpc_atomic_write(&f, h, sizeof h);
    if (s == GPC_OK) s = write_floats(&f, master ? master : &lo->params_flat);
    if (s == GPC_OK && m->training) s = write_floats(&f, gpc_optim_m(m->optim));
    if (s == GPC_OK && m->training) s = write_floats(&f, gpc_optim_v(m->optim));
    if (s == GPC_OK) {
        uint32_t crc = f.crc;
        s = gpc_atomic_write(&f, &crc, sizeof crc);
    }
    if (s == GPC_OK)
        s = gpc_atomic_commit(&f);
    else
        gpc_atomic_abort(&f);
    if (s != GPC_OK) return gpc_error_context(s, "saving adapters %s: ", path);
    return GPC_OK;
}

/* Reads the whole file and checks it: magic, version, checksum, then the
 * header's fields against their ranges and the size. *data gets the file. */
static gpc_status read_checked(const char *path, unsigned char **data, size_t *size,
                               lora_header *hdr) {
    char *bytes = NULL;
    GPC_TRY(gpc_read_file(path, &bytes, size));
    unsigned char *b = (unsigned char *)bytes;
    *data = b;
    if (*size < 8 || memcmp(b, LORA_MAGIC, 8) != 0) {
        gpc_free(bytes);
        return gpc_error(GPC_ERR_FORMAT,
                         "%s is not a gpc adapter file (its first bytes are not GPCLORA)", path);
    }
    uint32_t version = 0, header_bytes = 0;
    if (*size >= 16) {
        memcpy(&version, b + OFF_VERSION, 4);
        memcpy(&header_bytes, b + OFF_HEADER_BYTES, 4);
    }
    if (*size >= 16 && version != GPT_LORA_VERSION) {
        gpc_free(bytes);
        return gpc_error(GPC_ERR_FORMAT,
                         "adapter file %s has format version %u; this gpc reads version %d (use "
                         "the gpc that wrote it, or train the adapters again)",
                         path, version, GPT_LORA_VERSION);
    }
    if (*size < LORA_HEADER_BYTES + 4 || header_bytes != LORA_HEADER_BYTES) {
        gpc_free(bytes);
        return gpc_error(GPC_ERR_FORMAT,
                         "adapter file %s is truncated (%zu bytes); the write was interrupted: "
                         "train the adapters again",
                         path, *size);
    }
    uint32_t stored;
    memcpy(&stored, b + *size - 4, 4);
    if (gpc_crc32c(0, b, *size - 4) != stored) {
        gpc_free(bytes);
        return gpc_error(GPC_ERR_FORMAT,
                         "adapter file %s is corrupt: its checksum does not match its contents "
                         "(disk or copy error, or a cut copy); train the adapters again",
                         path);
    }
    memset(hdr, 0, sizeof *hdr);
    uint32_t config[6], rank, targets, len;
    memcpy(config, b + OFF_CONFIG, sizeof config);
    memcpy(&rank, b + OFF_RANK, 4);
    memcpy(&hdr->lora.alpha, b + OFF_ALPHA, 4);
    memcpy(&targets, b + OFF_TARGETS, 4);
    memcpy(&hdr->has_moments, b + OFF_HAS_MOMENTS, 4);
    memcpy(&hdr->count, b + OFF_COUNT, 8);
    memcpy(&len, b + OFF_BASE_LEN, 4);
    state_fields(b, &hdr->state, 1);
    const char *field = NULL;
    gpc_status cs = gpt_config_init(&hdr->config, (int)config[0], (int)config[1], (int)config[2],
                                    (int)config[3], (int)config[4]);
    hdr->lora.rank = (int)rank;
    hdr->lora.targets = targets;
    uint64_t arrays = hdr->has_moments ? 3 : 1;
    if (cs != GPC_OK || (uint32_t)hdr->config.padded_vocab != config[5])
        field = "model shape";
    else if (rank < 1 || rank > config[2])
        field = "rank";
    else if (!targets || (targets & ~GPT_LORA_ALL))
        field = "targets";
    else if (!(hdr->lora.alpha > 0.0f) || !isfinite(hdr->lora.alpha))
        field = "alpha";
    else if (hdr->has_moments > 1)
        field = "moments flag";
    else if (hdr->count != gpt_lora_count_params(&hdr->config, (int)rank, targets))
        field = "adapter count";
    else if (len > LORA_BASE_MAX)
        field = "base run path";
    else if (*size != LORA_HEADER_BYTES + arrays * hdr->count * sizeof(float) + 4)
        field = "size";
    if (field) {
        gpc_clear_error();
        gpc_free(bytes);
        return gpc_error(GPC_ERR_FORMAT,
                         "adapter file %s is corrupt: its %s is out of range although its "
                         "checksum holds (written by another program?)",
                         path, field);
    }
    memcpy(hdr->base, b + OFF_BASE, len);
    hdr->base[len] = '\0';
    return GPC_OK;
}

gpc_status gpt_lora_read_header(const char *path, gpt_config *config, gpt_lora_options *lora,
                                gpt_checkpoint_state *state, char *base_run, size_t base_size) {
    unsigned char *data;
    size_t size;
    lora_header hdr;
    GPC_TRY(read_checked(path, &data, &size, &hdr));
    gpc_free(data);
    if (config) *config = hdr.config;
    if (lora) *lora = hdr.lora;
    if (state) *state = hdr.state;
    if (base_run && base_size) snprintf(base_run, base_size, "%s", hdr.base);
    return GPC_OK;
}

gpc_status gpt_lora_load(const char *path, gpt_model *m, gpt_checkpoint_state *state) {
    GPC_TRY(need_lora(m));
    unsigned char *data;
    size_t size;
    lora_header hdr;
    GPC_TRY(read_checked(path, &data, &size, &hdr));
    char what[1200];
    snprintf(what, sizeof what, "adapter file %s", path);
    gpc_status s = GPC_OK;
    if (!gpt_config_equal(&hdr.config, &m->config, what))
        s = GPC_ERR_MISMATCH;
    else if (hdr.lora.rank != m->lora.options.rank || hdr.lora.targets != m->lora.options.targets)
        s = gpc_error(GPC_ERR_MISMATCH,
                      "adapter file %s holds rank %d on targets 0x%x; this model has rank %d on "
                      "0x%x: give the same --lora and --lora-targets",
                      path, hdr.lora.rank, hdr.lora.targets, m->lora.options.rank,
                      m->lora.options.targets);
    const void *payload = data + LORA_HEADER_BYTES; /* gpc_read_file: malloc-aligned */
    const float *values = payload;
    size_t n = (size_t)hdr.count;
    if (s == GPC_OK) {
        /* the scale is the file's: alpha is part of what was trained */
        m->lora.options.alpha = hdr.lora.alpha;
        m->lora.scale = hdr.lora.alpha / (float)hdr.lora.rank;
        s = gpt_lora_set_params(m, values);
    }
    if (s == GPC_OK && m->training) {
        gpc_tensor mom = *gpc_optim_m(m->optim), var = *gpc_optim_v(m->optim);
        if (hdr.has_moments) {
            gpc_tensor hm = gpc_tensor_1d((void *)(values + n), GPC_F32, gpc_cpu(), (int64_t)n);
            gpc_tensor hv = gpc_tensor_1d((void *)(values + 2 * n), GPC_F32, gpc_cpu(), (int64_t)n);
            s = gpc_tensor_copy(&mom, &hm);
            if (s == GPC_OK) s = gpc_tensor_copy(&var, &hv);
        } else {
            s = gpc_tensor_zero(&mom);
            if (s == GPC_OK) s = gpc_tensor_zero(&var);
        }
    }
    gpc_free(data);
    if (s != GPC_OK) return s;
    if (state) *state = hdr.state;
    if (m->dtype == GPC_F16 && hdr.state.loss_scale > 0)
        gpc_optim_set_loss_scale(m->optim, hdr.state.loss_scale);
    return GPC_OK;
}
