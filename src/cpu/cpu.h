/*
 * cpu.h: the CPU backend's ops, one function per entry of gpc_ops_table.
 * Implementations are C11 + OpenMP; every matrix product goes through
 * OpenBLAS (cblas_sgemm). Inputs arrive validated by src/ops/ops.c.
 */
#ifndef GPC_CPU_H
#define GPC_CPU_H

#include "ops/ops_backend.h"

extern const gpc_ops_table gpc_cpu_ops;

#endif /* GPC_CPU_H */
