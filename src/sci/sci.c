/*
 * sci.c: what the scientific kernels share (sci.h).
 */
#include "sci/sci.h"

#include "gpc/dist.h"

#include <string.h>

gpc_status gpc_sci_check_gpu_dist(const char *who, const gpc_dist *p, gpc_device device, int rank,
                                  int world) {
    if (!p) return GPC_OK;
    if (device.type != GPC_DEVICE_CUDA || world < 2)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s: halos over NCCL are for GPUs in several processes: leave out "
                         "--halos nccl on %s",
                         who, world < 2 ? "one process" : "the CPU");
    if (!p->ops || strcmp(p->ops->name, "nccl") != 0 || p->world_size != world || p->rank != rank ||
        p->device.index != device.index)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s: the GPU halos' collectives must be nccl over the same %d processes, "
                         "each on its own device (cuda:%d here)",
                         who, world, device.index);
    return GPC_OK;
}

