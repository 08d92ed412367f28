/*
 * sci.h: what the scientific kernels (md.c, stencil.c) share.
 */
#ifndef GPC_SCI_H
#define GPC_SCI_H

#include "gpc/core.h"

/* GPC_OK when `bytes` fit in the host memory available now (MemAvailable
 * and the cgroup's limit: gpc_host_memory_available; or it cannot be read);
 * otherwise GPC_ERR_NOMEM saying "<what> need about X GiB, more than this
 * machine has free, Y GiB: <advice>", so a run too large is refused before
 * it is killed filling its arrays. */
gpc_status gpc_sci_check_memory(double bytes, const char *what, const char *advice);

struct gpc_dist;

/* GPC_OK when `gpu_dist` (the NCCL collectives for GPU halos, or NULL)
 * suits a run on `device` as process `rank` of `world`: NULL, or GPUs in
 * several processes with nccl over the same ones, each on this process's
 * device. Otherwise GPC_ERR_INVALID_ARG saying why; `who` ("md",
 * "stencil") begins the message. */
gpc_status gpc_sci_check_gpu_dist(const char *who, const struct gpc_dist *gpu_dist,
                                  gpc_device device, int rank, int world);

#endif /* GPC_SCI_H */
