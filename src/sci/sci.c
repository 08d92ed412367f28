/*
 * sci.c: what the scientific kernels share (sci.h).
 */
#include "sci/sci.h"

gpc_status gpc_sci_check_memory(double bytes, const char *what, const char *advice) {
    const gpc_backend *cpu;
    size_t free_bytes = 0, total = 0;
    if (gpc_backend_require(gpc_cpu(), &cpu) != GPC_OK ||
        cpu->memory_info(0, &free_bytes, &total) != GPC_OK || total == 0) {
        gpc_clear_error();
        return GPC_OK; /* unknown: let the allocation decide */
    }
    if (bytes <= (double)total) return GPC_OK;
    return gpc_error(GPC_ERR_NOMEM, "%s need about %.1f GiB, more than this machine's %.1f GiB: %s",
                     what, bytes / (1 << 30), (double)total / (1 << 30), advice);
}
