/*
 * cpu_ops.c: the CPU backend's table of numeric ops. Each entry points at the
 * kernel of its family (see cpu.h for which file holds which).
 */
#include "cpu/cpu.h"

#define GPC_CPU_ENTRY(name, params) .name = gpc_cpu_##name,
const gpc_ops_table gpc_cpu_ops = {GPC_OPS_LIST(GPC_CPU_ENTRY)};
#undef GPC_CPU_ENTRY
