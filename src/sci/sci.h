/*
 * sci.h: what the scientific kernels (md.c, stencil.c) share.
 */
#ifndef GPC_SCI_H
#define GPC_SCI_H

#include "gpc/core.h"

struct gpc_dist;

/* GPC_OK when `gpu_dist` (the NCCL collectives for GPU halos, or NULL)
 * suits a run on `device` as process `rank` of `world`: NULL, or GPUs in
 * several processes with nccl over the same ones, each on this process's
 * device. Otherwise GPC_ERR_INVALID_ARG saying why; `who` ("md",
 * "stencil") begins the message. */
gpc_status gpc_sci_check_gpu_dist(const char *who, const struct gpc_dist *gpu_dist,
                                  gpc_device device, int rank, int world);

#endif /* GPC_SCI_H */
