/*
 * sci.c: what the scientific kernels share (sci.h).
 */
#include "sci/sci.h"

gpc_status gpc_sci_check_memory(double bytes, const char *what, const char *advice) {
    /* what is free now, not the machine's total: other processes and the
     * cgroup's limit decide whether the arrays fit or the OOM killer comes */
    size_t available = gpc_host_memory_available();
    if (available == 0 || bytes <= (double)available) return GPC_OK; /* 0: unknown */
    return gpc_error(GPC_ERR_NOMEM,
                     "%s need about %.1f GiB, more than this machine has free, %.1f GiB: %s", what,
                     bytes / (1 << 30), (double)available / (1 << 30), advice);
}
