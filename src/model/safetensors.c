/*
 * safetensors.c: Hugging Face's safetensors files, mapped and checked on
 * read, written atomically.
 *
 * The header is untrusted: its length may claim 2^63 bytes, offsets may
 * point past the end or overlap, shapes may not match the byte counts, the
 * JSON may nest without end. Every one of these is checked (jansson bounds
 * the nesting and rejects integers beyond 64 bits) before a tensor is handed
 * out, and each failure names the file and the tensor. As in the reference
 * reader, the tensors must cover the data area exactly, without holes or
 * overlaps, so every byte of the file is accounted for.
 */
#include "gpc/hf.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct gpc_safetensors {
    char *path;
    void *map;
    size_t map_bytes;
    json_t *header; /* owns the tensor names */
    int count;
    gpc_st_tensor *tensors; /* sorted by data offset */
};

typedef struct {
    const char *name;
    size_t size;
    int gpc_dtype;
} st_dtype;

static const st_dtype st_dtypes[] = {
    {"F64", 8, -1},  {"F32", 4, GPC_F32}, {"F16", 2, GPC_F16}, {"BF16", 2, GPC_BF16},
    {"I64", 8, -1},  {"I32", 4, GPC_I32}, {"I16", 2, -1},      {"I8", 1, -1},
    {"U64", 8, -1},  {"U32", 4, GPC_U32}, {"U16", 2, GPC_U16}, {"U8", 1, -1},
    {"BOOL", 1, -1}, {"F8_E4M3", 1, -1},  {"F8_E5M2", 1, -1},
};

static const st_dtype *dtype_lookup(const char *name) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(st_dtypes[i].name, name) == 0) return &st_dtypes[i];
    return NULL;
}

void gpc_safetensors_close(gpc_safetensors *st) {
    if (!st) return;
    if (st->map) munmap(st->map, st->map_bytes);
    if (st->header) json_decref(st->header);
    free(st->tensors);
    free(st->path);
    free(st);
}

int gpc_safetensors_count(const gpc_safetensors *st) {
    return st->count;
}

const gpc_st_tensor *gpc_safetensors_at(const gpc_safetensors *st, int index) {
    return index >= 0 && index < st->count ? &st->tensors[index] : NULL;
}

const gpc_st_tensor *gpc_safetensors_find(const gpc_safetensors *st, const char *name) {
    for (int i = 0; i < st->count; i++)
        if (strcmp(st->tensors[i].name, name) == 0) return &st->tensors[i];
    return NULL;
}

static int by_offset(const void *a, const void *b) {
    const gpc_st_tensor *x = a, *y = b;
    uintptr_t p = (uintptr_t)x->data, q = (uintptr_t)y->data;
    if (p != q) return p < q ? -1 : 1;
    return x->bytes < y->bytes ? -1 : x->bytes > y->bytes;
}

/* One entry of the header: fills t, with data as an offset into the data
 * area until the caller adds the base. */
static gpc_status parse_entry(const char *path, const char *name, json_t *entry,
                              uint64_t data_bytes, gpc_st_tensor *t) {
    memset(t, 0, sizeof *t);
    t->name = name;
    if (!json_is_object(entry))
        return gpc_error(GPC_ERR_FORMAT, "%s: tensor '%s' in the header is not an object", path,
                         name);
    json_t *dtype = json_object_get(entry, "dtype"), *shape = json_object_get(entry, "shape");
    json_t *offsets = json_object_get(entry, "data_offsets");
    if (!json_is_string(dtype) || !json_is_array(shape) || !json_is_array(offsets) ||
        json_array_size(offsets) != 2)
        return gpc_error(GPC_ERR_FORMAT,
                         "%s: tensor '%s' needs \"dtype\", \"shape\" and two \"data_offsets\"",
                         path, name);
    const st_dtype *d = dtype_lookup(json_string_value(dtype));
    if (!d)
        return gpc_error(GPC_ERR_FORMAT, "%s: tensor '%s' has unknown dtype '%.16s'", path, name,
                         json_string_value(dtype));
    snprintf(t->dtype, sizeof t->dtype, "%s", d->name);
    t->elem_bytes = d->size;
    t->gpc_dtype = d->gpc_dtype;
    size_t ndim = json_array_size(shape);
    if (ndim > GPC_ST_MAX_DIMS)
        return gpc_error(GPC_ERR_FORMAT, "%s: tensor '%s' has %zu dimensions; at most %d", path,
                         name, ndim, GPC_ST_MAX_DIMS);
    t->ndim = (int)ndim;
    uint64_t numel = 1;
    int overflow = 0;
    for (size_t i = 0; i < ndim; i++) {
        json_t *v = json_array_get(shape, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return gpc_error(GPC_ERR_FORMAT, "%s: tensor '%s' has a shape entry that is not a size",
                             path, name);
        uint64_t n = (uint64_t)json_integer_value(v);
        t->shape[i] = (int64_t)n;
        if (n && numel > UINT64_MAX / n) overflow = 1;
        numel *= n;
    }
    json_t *jb = json_array_get(offsets, 0), *je = json_array_get(offsets, 1);
    if (!json_is_integer(jb) || !json_is_integer(je) || json_integer_value(jb) < 0 ||
        json_integer_value(je) < json_integer_value(jb))
        return gpc_error(GPC_ERR_FORMAT, "%s: tensor '%s' has data_offsets that are not a range",
                         path, name);
    uint64_t begin = (uint64_t)json_integer_value(jb), end = (uint64_t)json_integer_value(je);
    if (end > data_bytes)
        return gpc_error(GPC_ERR_FORMAT,
                         "%s: tensor '%s' ends at byte %llu of a %llu-byte data area (the file is "
                         "truncated or its header lies)",
                         path, name, (unsigned long long)end, (unsigned long long)data_bytes);
    if (overflow || numel > UINT64_MAX / d->size || numel * d->size != end - begin)
        return gpc_error(GPC_ERR_FORMAT,
                         "%s: tensor '%s' has %llu bytes for a %s shape of %s%llu elements", path,
                         name, (unsigned long long)(end - begin), d->name, overflow ? "over " : "",
                         (unsigned long long)numel);
    t->numel = (size_t)numel;
    t->bytes = (size_t)(end - begin);
    t->data = (const void *)(uintptr_t)begin;
    return GPC_OK;
}

static gpc_status parse_header(gpc_safetensors *st, const char *text, size_t length,
                               uint64_t data_bytes) {
    const char *path = st->path;
    if (length == 0 || text[0] != '{')
        return gpc_error(GPC_ERR_FORMAT,
                         "%s is not a safetensors file: its header is not a JSON "
                         "object",
                         path);
    json_error_t err;
    st->header = json_loadb(text, length, JSON_REJECT_DUPLICATES, &err);
    if (!st->header)
        return gpc_error(GPC_ERR_FORMAT,
                         "%s: the safetensors header is not valid JSON (%s at byte "
                         "%d)",
                         path, err.text, err.position);
    if (!json_is_object(st->header))
        return gpc_error(GPC_ERR_FORMAT, "%s: the safetensors header is not a JSON object", path);
    size_t n = json_object_size(st->header);
    st->tensors = calloc(n ? n : 1, sizeof *st->tensors);
    if (!st->tensors) return gpc_error(GPC_ERR_NOMEM, "out of memory reading %s", path);
    const char *key;
    json_t *value;
    json_object_foreach(st->header, key, value) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(value))
                return gpc_error(GPC_ERR_FORMAT, "%s: __metadata__ is not an object", path);
            continue;
        }
        GPC_TRY(parse_entry(path, key, value, data_bytes, &st->tensors[st->count]));
        st->count++;
    }
    /* every byte of the data area belongs to exactly one tensor */
    qsort(st->tensors, (size_t)st->count, sizeof *st->tensors, by_offset);
    uint64_t at = 0;
    for (int i = 0; i < st->count; i++) {
        uint64_t begin = (uint64_t)(uintptr_t)st->tensors[i].data;
        if (begin < at)
            return gpc_error(GPC_ERR_FORMAT,
                             "%s: tensor '%s' overlaps the tensor before it (bytes %llu.. of the "
                             "data area are claimed twice)",
                             path, st->tensors[i].name, (unsigned long long)begin);
        if (begin > at)
            return gpc_error(GPC_ERR_FORMAT,
                             "%s: bytes %llu..%llu of the data area belong to no tensor", path,
                             (unsigned long long)at, (unsigned long long)begin);
        at = begin + st->tensors[i].bytes;
    }
    if (at != data_bytes)
        return gpc_error(GPC_ERR_FORMAT,
                         "%s: the tensors cover %llu of the %llu bytes after the header (the file "
                         "has bytes that belong to no tensor)",
                         path, (unsigned long long)at, (unsigned long long)data_bytes);
    return GPC_OK;
}

gpc_status gpc_safetensors_open(gpc_safetensors **out, const char *path) {
    *out = NULL;
    gpc_safetensors *st = calloc(1, sizeof *st);
    if (!st || !(st->path = strdup(path))) {
        free(st);
        return gpc_error(GPC_ERR_NOMEM, "out of memory opening %s", path);
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        gpc_status s = gpc_error(GPC_ERR_IO, "cannot open %s: %s", path, strerror(errno));
        gpc_safetensors_close(st);
        return s;
    }
    struct stat sb;
    gpc_status s = GPC_OK;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        s = gpc_error(GPC_ERR_IO, "%s is not a regular file", path);
    } else if (sb.st_size < 8) {
        s = gpc_error(GPC_ERR_FORMAT,
                      "%s is truncated: %lld bytes, less than the 8-byte header length", path,
                      (long long)sb.st_size);
    } else {
        st->map_bytes = (size_t)sb.st_size;
        st->map = mmap(NULL, st->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (st->map == MAP_FAILED) {
            st->map = NULL;
            s = gpc_error(GPC_ERR_IO, "cannot map %s: %s", path, strerror(errno));
        }
    }
    close(fd);
    if (s == GPC_OK) {
        const unsigned char *p = st->map;
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--)
            n = n << 8 | p[i];
        uint64_t size = (uint64_t)st->map_bytes;
        if (n > GPC_ST_MAX_HEADER)
            s = gpc_error(GPC_ERR_FORMAT,
                          "%s: the header claims %llu bytes, over the format's limit of %llu (not "
                          "a safetensors file, or a corrupt one)",
                          path, (unsigned long long)n, (unsigned long long)GPC_ST_MAX_HEADER);
        else if (n > size - 8)
            s = gpc_error(GPC_ERR_FORMAT,
                          "%s is truncated: its header claims %llu bytes, the file has %llu after "
                          "the length",
                          path, (unsigned long long)n, (unsigned long long)(size - 8));
        else
            s = parse_header(st, (const char *)p + 8, (size_t)n, size - 8 - n);
        if (s == GPC_OK)
            for (int i = 0; i < st->count; i++)
                st->tensors[i].data = p + 8 + n + (uintptr_t)st->tensors[i].data;
    }
    if (s != GPC_OK) {
        gpc_safetensors_close(st);
        return s;
    }
    *out = st;
    return GPC_OK;
}

/* --------------------------------------------------------------- writing */

static const char *dtype_name(gpc_dtype d) {
    switch (d) {
    case GPC_F32:
        return "F32";
    case GPC_BF16:
        return "BF16";
    case GPC_F16:
        return "F16";
    case GPC_I32:
        return "I32";
    case GPC_U16:
        return "U16";
    case GPC_U32:
        return "U32";
    default:
        return NULL;
    }
}

gpc_status gpc_safetensors_write(const char *path, const gpc_st_write_tensor *tensors, int count) {
    json_t *header = json_object();
    json_t *meta = json_pack("{s:s}", "format", "pt");
    if (!header || !meta || json_object_set_new(header, "__metadata__", meta) != 0) {
        json_decref(header);
        return gpc_error(GPC_ERR_NOMEM, "out of memory writing %s", path);
    }
    uint64_t at = 0;
    gpc_status s = GPC_OK;
    for (int i = 0; i < count && s == GPC_OK; i++) {
        const gpc_st_write_tensor *t = &tensors[i];
        const char *dn = dtype_name(t->dtype);
        if (!dn || t->ndim < 0 || t->ndim > GPC_ST_MAX_DIMS || !t->name ||
            json_object_get(header, t->name)) {
            s = gpc_error(GPC_ERR_INVALID_ARG, "%s: tensor %d (%s) cannot be written", path, i,
                          t->name ? t->name : "unnamed");
            break;
        }
        uint64_t numel = 1;
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) {
            numel *= (uint64_t)t->shape[d];
            json_array_append_new(shape, json_integer(t->shape[d]));
        }
        uint64_t bytes = numel * gpc_dtype_size(t->dtype);
        json_t *entry = json_pack("{s:s,s:o,s:[I,I]}", "dtype", dn, "shape", shape, "data_offsets",
                                  (json_int_t)at, (json_int_t)(at + bytes));
        if (!entry || json_object_set_new(header, t->name, entry) != 0)
            s = gpc_error(GPC_ERR_NOMEM, "out of memory writing %s", path);
        at += bytes;
    }
    char *text = s == GPC_OK ? json_dumps(header, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(header);
    if (s != GPC_OK) return s;
    if (!text) return gpc_error(GPC_ERR_NOMEM, "out of memory writing %s", path);
    /* the data area starts 8-aligned: the header is padded with spaces */
    size_t length = strlen(text), padded = (length + 7) / 8 * 8;
    unsigned char prefix[8];
    for (int i = 0; i < 8; i++)
        prefix[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    gpc_atomic_file f;
    s = gpc_atomic_open(&f, path);
    if (s == GPC_OK) {
        static const char spaces[] = "        ";
        s = gpc_atomic_write(&f, prefix, 8);
        if (s == GPC_OK) s = gpc_atomic_write(&f, text, length);
        if (s == GPC_OK) s = gpc_atomic_write(&f, spaces, padded - length);
        for (int i = 0; i < count && s == GPC_OK; i++) {
            size_t numel = 1;
            for (int d = 0; d < tensors[i].ndim; d++)
                numel *= (size_t)tensors[i].shape[d];
            s = gpc_atomic_write(&f, tensors[i].data, numel * gpc_dtype_size(tensors[i].dtype));
        }
        if (s == GPC_OK)
            s = gpc_atomic_commit(&f);
        else
            gpc_atomic_abort(&f);
    }
    free(text);
    return s;
}
