/*
 * shard.c: token shard files, the unit of a dataset on disk.
 *
 * Layout (little-endian), a 64-byte header then the tokens:
 *   0  "GPCSHARD"           8  u32 format version      12 u32 bytes per token (2 or 4)
 *   16 u64 token count      24 u32 vocabulary size     28 u32 CRC-32C of the tokens
 *   32 reserved, zero       60 u32 CRC-32C of bytes 0..59
 * Tokens are u16 when the vocabulary fits (GPT-2's 50257 does), halving the
 * disk and memory a dataset needs; u32 otherwise. Files are written through
 * gpc_atomic_* and every field is checked on read, tokens included, so a bad
 * file is an error with a message and never an out-of-range embedding index.
 */
#include "gpc/data.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gpc shard files are little-endian; this code stores tokens in host order"
#endif

#define SHARD_MAGIC "GPCSHARD"
#define SHARD_HEADER_BYTES 64
#define SHARD_CHUNK 65536 /* tokens converted per write */

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const unsigned char *p) {
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

static int token_width(uint32_t vocab_size) {
    return vocab_size <= 65536 ? 2 : 4;
}

/* Converts tokens[0..n) to the file's width into buf. */
static const void *pack(const uint32_t *tokens, size_t n, int width, uint16_t *buf) {
    if (width == 4) return tokens;
    for (size_t i = 0; i < n; i++)
        buf[i] = (uint16_t)tokens[i];
    return buf;
}

gpc_status gpc_shard_write(const char *path, const uint32_t *tokens, uint64_t count,
                           uint32_t vocab_size) {
    if (vocab_size == 0)
        return gpc_error(GPC_ERR_INVALID_ARG, "cannot write shard %s: vocabulary size is 0", path);
    for (uint64_t i = 0; i < count; i++)
        if (tokens[i] >= vocab_size)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "cannot write shard %s: token %u at %llu is outside the vocabulary "
                             "of %u",
                             path, tokens[i], (unsigned long long)i, vocab_size);
    int width = token_width(vocab_size);
    static _Thread_local uint16_t buf[SHARD_CHUNK];
    /* the header holds the payload checksum, so it is computed first */
    uint32_t payload_crc = 0;
    for (uint64_t at = 0; at < count; at += SHARD_CHUNK) {
        size_t n = count - at < SHARD_CHUNK ? (size_t)(count - at) : SHARD_CHUNK;
        payload_crc = gpc_crc32c(payload_crc, pack(tokens + at, n, width, buf), n * width);
    }
    unsigned char header[SHARD_HEADER_BYTES] = {0};
    memcpy(header, SHARD_MAGIC, 8);
    put_u32(header + 8, GPC_SHARD_VERSION);
    put_u32(header + 12, (uint32_t)width);
    put_u64(header + 16, count);
    put_u32(header + 24, vocab_size);
    put_u32(header + 28, payload_crc);
    put_u32(header + 60, gpc_crc32c(0, header, 60));
    gpc_atomic_file f;
    GPC_TRY(gpc_atomic_open(&f, path));
    gpc_status s = gpc_atomic_write(&f, header, sizeof header);
    for (uint64_t at = 0; at < count && s == GPC_OK; at += SHARD_CHUNK) {
        size_t n = count - at < SHARD_CHUNK ? (size_t)(count - at) : SHARD_CHUNK;
        s = gpc_atomic_write(&f, pack(tokens + at, n, width, buf), n * width);
    }
    if (s == GPC_OK) return gpc_atomic_commit(&f);
    gpc_atomic_abort(&f);
    return s;
}

/* Opens path and checks everything but the payload; on success *file is
 * positioned at the first token and *payload_crc holds the stored checksum. */
static gpc_status shard_open(const char *path, gpc_shard_info *info, FILE **file,
                             uint32_t *payload_crc) {
    const char *redo = "prepare the dataset again (gpc data prepare or gpc data synth)";
    *file = NULL;
    if (!gpc_path_exists(path))
        return gpc_error(GPC_ERR_IO, "cannot open shard %s: %s%s", path, strerror(errno),
                         errno == ENOENT ? "; is the dataset complete? prepare it again" : "");
    void *opened; /* a regular file: a FIFO would block forever */
    GPC_TRY(gpc_open_regular(path, "shard", &opened));
    FILE *f = opened;
    struct stat st;
    unsigned char h[SHARD_HEADER_BYTES];
    gpc_status s = GPC_OK;
    size_t got = fstat(fileno(f), &st) == 0 ? fread(h, 1, sizeof h, f) : 0;
    uint64_t size = (uint64_t)st.st_size;
    if (got < 8 || memcmp(h, SHARD_MAGIC, 8) != 0) {
        s = gpc_error(GPC_ERR_FORMAT,
                      "%s is not a gpc shard file (wrong magic); a dataset folder holds the "
                      "train_NNNN.bin and val_NNNN.bin files that gpc data prepare writes",
                      path);
    } else if (got < SHARD_HEADER_BYTES) {
        s = gpc_error(GPC_ERR_FORMAT,
                      "%s is truncated: %zu bytes, shorter than the %d-byte header; %s", path, got,
                      SHARD_HEADER_BYTES, redo);
    } else if (get_u32(h + 8) != GPC_SHARD_VERSION) {
        s = gpc_error(GPC_ERR_FORMAT,
                      "%s is shard format version %u; this gpc reads version %d: use the gpc "
                      "that wrote it, or %s",
                      path, get_u32(h + 8), GPC_SHARD_VERSION, redo);
    } else if (gpc_crc32c(0, h, 60) != get_u32(h + 60)) {
        s = gpc_error(GPC_ERR_FORMAT, "%s is corrupt: header checksum mismatch; %s", path, redo);
    } else {
        uint32_t width = get_u32(h + 12), vocab = get_u32(h + 24);
        uint64_t tokens = get_u64(h + 16);
        if (vocab == 0 || width != (uint32_t)token_width(vocab)) {
            s = gpc_error(GPC_ERR_FORMAT,
                          "%s is corrupt: %u-byte tokens for a vocabulary of %u; %s", path, width,
                          vocab, redo);
        } else if (tokens > (UINT64_MAX - SHARD_HEADER_BYTES) / width ||
                   size != SHARD_HEADER_BYTES + tokens * width) {
            s = gpc_error(GPC_ERR_FORMAT,
                          "%s is truncated or damaged: it is %llu bytes, but its header says "
                          "%llu tokens (%llu bytes); %s",
                          path, (unsigned long long)size, (unsigned long long)tokens,
                          (unsigned long long)(SHARD_HEADER_BYTES + tokens * width), redo);
        } else {
            info->tokens = tokens;
            info->vocab_size = vocab;
            info->dtype = width == 2 ? GPC_U16 : GPC_U32;
            *payload_crc = get_u32(h + 28);
        }
    }
    if (s != GPC_OK) {
        fclose(f);
        return s;
    }
    *file = f;
    return GPC_OK;
}

gpc_status gpc_shard_info_read(const char *path, gpc_shard_info *info) {
    FILE *f;
    uint32_t crc;
    GPC_TRY(shard_open(path, info, &f, &crc));
    fclose(f);
    return GPC_OK;
}

gpc_status gpc_shard_read(const char *path, gpc_shard_info *info, uint32_t **tokens) {
    *tokens = NULL;
    FILE *f;
    uint32_t want_crc;
    gpc_shard_info header;
    GPC_TRY(shard_open(path, &header, &f, &want_crc));
    size_t width = gpc_dtype_size(header.dtype), count = (size_t)header.tokens;
    uint32_t *out = gpc_malloc((count ? count : 1) * sizeof *out);
    if (!out) {
        fclose(f);
        return gpc_error(GPC_ERR_NOMEM, "out of memory reading %llu tokens of %s",
                         (unsigned long long)header.tokens, path);
    }
    /* u16 tokens land in the upper half of the buffer and are widened in
     * place from the front: each write stays behind the reads */
    unsigned char *raw = (unsigned char *)out + count * (sizeof *out - width);
    size_t got = fread(raw, width, count, f);
    fclose(f);
    if (got != count) {
        gpc_free(out);
        return gpc_error(GPC_ERR_IO, "cannot read %s: it ended early (read %zu of %zu tokens)",
                         path, got, count);
    }
    if (gpc_crc32c(0, raw, count * width) != want_crc) {
        gpc_free(out);
        return gpc_error(GPC_ERR_FORMAT,
                         "%s is corrupt: its tokens do not match their checksum; prepare the "
                         "dataset again",
                         path);
    }
    if (width == 2) {
        for (size_t i = 0; i < count; i++) {
            uint16_t v;
            memcpy(&v, raw + 2 * i, 2);
            out[i] = v;
        }
    }
    for (size_t i = 0; i < count; i++)
        if (out[i] >= header.vocab_size) {
            uint32_t bad = out[i];
            gpc_free(out);
            return gpc_error(GPC_ERR_FORMAT,
                             "%s is corrupt: token %u at position %zu is outside its vocabulary "
                             "of %u; prepare the dataset again",
                             path, bad, i, header.vocab_size);
        }
    if (info) *info = header;
    *tokens = out;
    return GPC_OK;
}
