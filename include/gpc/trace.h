/*
 * gpc trace: named ranges on the profiler's timeline (NVTX), so Nsight
 * Systems shows "forward", "backward", "optimizer" over the training step's
 * kernels.
 *
 * With a CUDA build the NVTX3 header-only API is used: without a profiler
 * attached each call is one untaken branch. Without CUDA, libnvToolsExt.so.1
 * is looked up once with dlopen; when absent the calls do nothing. Ranges
 * nest per thread; every push needs its pop.
 */
#ifndef GPC_TRACE_H
#define GPC_TRACE_H

#ifdef __cplusplus
extern "C" {
#endif

void gpc_trace_push(const char *name);
void gpc_trace_pop(void);
/* 1 when ranges go somewhere (NVTX available), 0 when the calls are no-ops. */
int gpc_trace_available(void);

#ifdef __cplusplus
}
#endif

#endif /* GPC_TRACE_H */
