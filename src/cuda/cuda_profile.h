/*
 * cuda_profile.h: the per-op timing of the CUDA backend, for benchmarks.
 *
 * With GPC_CUDA_PROFILE=1 set before the first op, each op of the CUDA
 * backend is timed with CUDA events (see cuda_ops.cu); without it these
 * calls do nothing. C linkage, so bench programs in C can call them.
 */
#ifndef GPC_CUDA_PROFILE_H
#define GPC_CUDA_PROFILE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Forgets the times gathered so far (e.g. after warm-up steps). */
void gpc_cuda_profile_reset(void);
/* Writes a table (op, calls, milliseconds, share) into buf; returns 0 when
 * profiling is off. Waits for the GPU to finish the timed ops. */
int gpc_cuda_profile_report(char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* GPC_CUDA_PROFILE_H */
