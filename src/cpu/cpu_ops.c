/*
 * cpu_ops.c: the CPU backend's table of numeric ops. Placeholder table until
 * the CPU kernels land; every entry NULL reports GPC_ERR_UNSUPPORTED.
 */
#include "cpu/cpu.h"

const gpc_ops_table gpc_cpu_ops = {0};
