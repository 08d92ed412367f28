/*
 * backend.c: the registry of backends, one per device type.
 *
 * The CPU backend is always present. The CUDA backend is linked in when gpc
 * is built with CUDA (GPC_HAVE_CUDA) and answers only when the machine has a
 * usable GPU, so one binary runs on machines with and without one.
 */
#include "gpc/core.h"

#include <stddef.h>

extern const gpc_backend gpc_cpu_backend;
#ifdef GPC_HAVE_CUDA
const gpc_backend *gpc_cuda_backend(void);
#endif

static const gpc_backend *registered[GPC_DEVICE_TYPE_COUNT];

void gpc_backend_register(const gpc_backend *backend) {
    if (backend && (unsigned)backend->type < GPC_DEVICE_TYPE_COUNT)
        registered[backend->type] = backend;
}

const gpc_backend *gpc_backend_get(gpc_device_type type) {
    if ((unsigned)type >= GPC_DEVICE_TYPE_COUNT) {
        gpc_error(GPC_ERR_INVALID_ARG, "unknown device type %d", (int)type);
        return NULL;
    }
    if (registered[type]) return registered[type];
    if (type == GPC_DEVICE_CPU) return &gpc_cpu_backend;
#ifdef GPC_HAVE_CUDA
    const gpc_backend *cuda = gpc_cuda_backend();
    if (cuda) return cuda; /* gpc_cuda_backend set the message when it returns NULL */
    return NULL;
#else
    gpc_error(GPC_ERR_UNSUPPORTED,
              "this gpc was built without CUDA: install the CUDA toolkit (nvcc) and rebuild, or "
              "use --device cpu");
    return NULL;
#endif
}

gpc_status gpc_backend_require(gpc_device device, const gpc_backend **out) {
    const gpc_backend *backend = gpc_backend_get(device.type);
    if (!backend) return GPC_ERR_UNSUPPORTED;
    if (device.type != GPC_DEVICE_CPU) {
        int count = backend->device_count();
        if (device.index < 0 || device.index >= count)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "GPU %d does not exist: this machine has %d usable GPU%s",
                             device.index, count, count == 1 ? "" : "s");
    }
    *out = backend;
    return GPC_OK;
}
