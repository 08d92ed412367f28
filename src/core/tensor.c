/*
 * tensor.c: tensor views, device parsing, and allocation/copy through the
 * device's backend.
 */
#include "gpc/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *gpc_device_name(gpc_device device) {
    static _Thread_local char name[32];
    if (device.type == GPC_DEVICE_CPU) return "cpu";
    snprintf(name, sizeof name, "cuda:%d", device.index);
    return name;
}

gpc_status gpc_device_parse(const char *text, gpc_device *out) {
    if (strcmp(text, "cpu") == 0) {
        *out = gpc_cpu();
        return GPC_OK;
    }
    if (strcmp(text, "auto") == 0) {
        const gpc_backend *cuda = gpc_backend_get(GPC_DEVICE_CUDA);
        gpc_clear_error();
        out->type = (cuda && cuda->device_count() > 0) ? GPC_DEVICE_CUDA : GPC_DEVICE_CPU;
        out->index = 0;
        return GPC_OK;
    }
    if (strncmp(text, "cuda", 4) == 0) {
        int index = 0;
        if (text[4] == ':') {
            char *end;
            long v = strtol(text + 5, &end, 10);
            if (*end || end == text + 5 || v < 0 || v > 1024)
                return gpc_error(GPC_ERR_INVALID_ARG,
                                 "bad device '%s': write cuda:N with N a GPU number", text);
            index = (int)v;
        } else if (text[4]) {
            return gpc_error(GPC_ERR_INVALID_ARG, "unknown device '%s': use auto, cpu or cuda[:N]",
                             text);
        }
        out->type = GPC_DEVICE_CUDA;
        out->index = index;
        const gpc_backend *backend;
        return gpc_backend_require(*out, &backend);
    }
    return gpc_error(GPC_ERR_INVALID_ARG, "unknown device '%s': use auto, cpu or cuda[:N]", text);
}

gpc_tensor gpc_tensor_make(void *data, gpc_dtype dtype, gpc_device device, int ndim,
                           const int64_t *shape) {
    gpc_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.device = device;
    t.ndim = ndim < 0 ? 0 : (ndim > GPC_MAX_DIMS ? GPC_MAX_DIMS : ndim);
    for (int i = 0; i < t.ndim; i++)
        t.shape[i] = shape[i];
    return t;
}

gpc_tensor gpc_tensor_1d(void *data, gpc_dtype dtype, gpc_device device, int64_t d0) {
    return gpc_tensor_make(data, dtype, device, 1, &d0);
}

gpc_tensor gpc_tensor_2d(void *data, gpc_dtype dtype, gpc_device device, int64_t d0, int64_t d1) {
    int64_t shape[2] = {d0, d1};
    return gpc_tensor_make(data, dtype, device, 2, shape);
}

gpc_tensor gpc_tensor_3d(void *data, gpc_dtype dtype, gpc_device device, int64_t d0, int64_t d1,
                         int64_t d2) {
    int64_t shape[3] = {d0, d1, d2};
    return gpc_tensor_make(data, dtype, device, 3, shape);
}

int64_t gpc_tensor_numel(const gpc_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

size_t gpc_tensor_bytes(const gpc_tensor *t) {
    return (size_t)gpc_tensor_numel(t) * gpc_dtype_size(t->dtype);
}

const char *gpc_tensor_describe(const gpc_tensor *t, char *buf, size_t size) {
    size_t used = 0;
    used += (size_t)snprintf(buf + used, size - used, "[");
    for (int i = 0; i < t->ndim && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, i ? ", %lld" : "%lld",
                                 (long long)t->shape[i]);
    if (used < size)
        snprintf(buf + used, size - used, "] %s on %s", gpc_dtype_name(t->dtype),
                 gpc_device_name(t->device));
    return buf;
}

gpc_status gpc_tensor_alloc(gpc_tensor *t, gpc_dtype dtype, gpc_device device, int ndim,
                            const int64_t *shape) {
    const gpc_backend *backend;
    if (ndim < 0 || ndim > GPC_MAX_DIMS)
        return gpc_error(GPC_ERR_INVALID_ARG, "tensor rank %d is outside 0..%d", ndim,
                         GPC_MAX_DIMS);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return gpc_error(GPC_ERR_INVALID_ARG, "tensor dimension %d is negative (%lld)", i,
                             (long long)shape[i]);
    GPC_TRY(gpc_backend_require(device, &backend));
    *t = gpc_tensor_make(NULL, dtype, device, ndim, shape);
    size_t bytes = gpc_tensor_bytes(t);
    GPC_TRY(gpc_device_memory_reserve(device, bytes));
    gpc_status s = backend->alloc(device.index, bytes ? bytes : 1, &t->data);
    if (s != GPC_OK) gpc_device_memory_release(device, bytes);
    return s;
}

void gpc_tensor_free(gpc_tensor *t) {
    const gpc_backend *backend = gpc_backend_get(t->device.type);
    if (t->data && backend) {
        backend->free(t->device.index, t->data);
        gpc_device_memory_release(t->device, gpc_tensor_bytes(t));
    }
    t->data = NULL;
}

/* Checks that src fits dst and finds the backend that does the copy: a copy
 * that touches a GPU is done by that GPU's backend. */
static gpc_status copy_backend(const gpc_tensor *dst, const gpc_tensor *src,
                               const gpc_backend **backend) {
    if (gpc_tensor_bytes(dst) != gpc_tensor_bytes(src) || dst->dtype != src->dtype) {
        char a[96], b[96];
        return gpc_error(GPC_ERR_MISMATCH, "cannot copy %s into %s: sizes or dtypes differ",
                         gpc_tensor_describe(src, a, sizeof a),
                         gpc_tensor_describe(dst, b, sizeof b));
    }
    gpc_device via = dst->device.type != GPC_DEVICE_CPU ? dst->device : src->device;
    return gpc_backend_require(via, backend);
}

gpc_status gpc_tensor_copy(gpc_tensor *dst, const gpc_tensor *src) {
    const gpc_backend *backend;
    GPC_TRY(copy_backend(dst, src, &backend));
    return backend->copy(dst->data, dst->device, src->data, src->device, gpc_tensor_bytes(src),
                         NULL);
}

gpc_status gpc_tensor_copy_async(gpc_tensor *dst, const gpc_tensor *src) {
    const gpc_backend *backend;
    GPC_TRY(copy_backend(dst, src, &backend));
    if (!backend->copy_async)
        return backend->copy(dst->data, dst->device, src->data, src->device, gpc_tensor_bytes(src),
                             NULL);
    return backend->copy_async(dst->data, dst->device, src->data, src->device,
                               gpc_tensor_bytes(src));
}

gpc_status gpc_tensor_zero(gpc_tensor *t) {
    const gpc_backend *backend;
    GPC_TRY(gpc_backend_require(t->device, &backend));
    return backend->memset_zero(t->device, t->data, gpc_tensor_bytes(t), NULL);
}
