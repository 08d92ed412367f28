/*
 * cpu_ops.c: the CPU backend's table of numeric ops. Each entry points at the
 * kernel of its family (see cpu.h for which file holds which).
 */
#include "cpu/cpu.h"

/* CPU ops finish before they return: there is no queue to choose. */
gpc_status gpc_cpu_stream_switch(const gpc_tensor *on_device, gpc_stream_action action) {
    (void)on_device, (void)action;
    return GPC_OK;
}

#define GPC_CPU_ENTRY(name, params) .name = gpc_cpu_##name,
const gpc_ops_table gpc_cpu_ops = {GPC_OPS_LIST(GPC_CPU_ENTRY)};
#undef GPC_CPU_ENTRY
