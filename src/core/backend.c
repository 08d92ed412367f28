/*
 * backend.c: the registry of backends, one per device type, and the graph
 * calls, which reach the device's backend or say it has no graphs.
 *
 * Backends sit above core, so core names none of them: each registers
 * itself, from a constructor in its own file (gpc_cpu_backend_register in
 * src/cpu/cpu_backend.c, gpc_cuda_backend_register in
 * src/cuda/cuda_backend.cu). Constructors rather than a registration call
 * in main() because tests, benchmarks, gpc and gpcd all use tensors
 * without a common start-up call, and a forgotten one would fail only at
 * run time. libgpc is a static archive, from which the linker takes only
 * the objects a program references; CMakeLists.txt names the two
 * constructors as undefined symbols for every program linking gpc, so
 * their objects are always linked and the constructors always run.
 *
 * A registration stores a finder, not the backend: the CUDA backend is
 * linked in when gpc is built with CUDA (GPC_HAVE_CUDA) and answers only
 * when the machine has a usable GPU, so one binary runs on machines with
 * and without one, and nothing touches the driver before it is needed.
 */
#include "gpc/core.h"

#include <stddef.h>

static gpc_backend_finder finders[GPC_DEVICE_TYPE_COUNT];

void gpc_backend_register(gpc_device_type type, gpc_backend_finder find) {
    if ((unsigned)type < GPC_DEVICE_TYPE_COUNT) finders[type] = find;
}

const gpc_backend *gpc_backend_get(gpc_device_type type) {
    if ((unsigned)type >= GPC_DEVICE_TYPE_COUNT) {
        gpc_error(GPC_ERR_INVALID_ARG, "unknown device type %d", (int)type);
        return NULL;
    }
    if (finders[type]) return finders[type](); /* the finder set the message when NULL */
    if (type == GPC_DEVICE_CUDA)
        gpc_error(GPC_ERR_UNSUPPORTED,
                  "this gpc was built without CUDA: install the CUDA toolkit (nvcc) and rebuild, "
                  "or use --device cpu");
    else
        gpc_error(GPC_ERR_INTERNAL,
                  "no CPU backend is registered: link the program with libgpc through its CMake "
                  "target, which keeps src/cpu/cpu_backend.c in the link");
    return NULL;
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

/* The backend of a device that captures graphs, or an error saying it has none. */
static gpc_status graph_backend(gpc_device device, const gpc_backend **out) {
    GPC_TRY(gpc_backend_require(device, out));
    if (!(*out)->graph_capture_begin)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "the %s backend runs every op as it is called and captures no graphs",
                         (*out)->name);
    return GPC_OK;
}

int gpc_graph_supported(gpc_device device) {
    const gpc_backend *backend = gpc_backend_get(device.type);
    return backend && backend->graph_capture_begin != NULL;
}

gpc_status gpc_graph_capture_begin(gpc_device device) {
    const gpc_backend *backend = NULL;
    GPC_TRY(graph_backend(device, &backend));
    return backend->graph_capture_begin(device.index);
}

gpc_status gpc_graph_capture_end(gpc_device device, gpc_graph *out) {
    const gpc_backend *backend = NULL;
    *out = NULL;
    GPC_TRY(graph_backend(device, &backend));
    return backend->graph_capture_end(device.index, out);
}

gpc_status gpc_graph_launch(gpc_device device, gpc_graph graph) {
    const gpc_backend *backend = NULL;
    GPC_TRY(graph_backend(device, &backend));
    return backend->graph_launch(device.index, graph);
}

void gpc_graph_destroy(gpc_device device, gpc_graph graph) {
    const gpc_backend *backend = gpc_backend_get(device.type);
    if (graph && backend && backend->graph_destroy) backend->graph_destroy(graph);
}
