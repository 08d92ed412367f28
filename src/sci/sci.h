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

#endif /* GPC_SCI_H */
