/*
 * matmul.h: what matmul.cu tells tests and benchmarks about its choices.
 * Plain C.
 */
#ifndef GPC_CUDA_MATMUL_H
#define GPC_CUDA_MATMUL_H

#ifdef __cplusplus
extern "C" {
#endif

/* How many product shapes have taken a configuration from matmul.cu's
 * measured table (measured_configs) instead of cuBLASLt's heuristic, since
 * the process started. Each shape counts once, at its first call. */
int gpc_cuda_matmul_measured_uses(void);

/* 1 when the measured table applies to the current GPU and cuBLASLt (an
 * sm_90 GPU with 132 SMs, cuBLASLt 13), GPC_MATMUL_MEASURED is not 0 and
 * GPC_MATMUL_TUNE (which times its own picks) is not on. */
int gpc_cuda_matmul_measured_applies(void);

/* Which of gpc's own Hopper products (gemm_sm90.cu) serve the current GPU:
 * 1 the fc layer's GELU forward, 2 the DGELU backward after it (bits), when
 * it has compute capability 9.0 and GPC_GEMM_SM90 leaves them on (both by
 * default; "0" none, "gelu" or "dgelu" one); 0 for none. */
int gpc_cuda_gemm_sm90_available(void);

/* How many products it has queued since the process started, and how many
 * of them ran as clusters of two blocks sharing B's tiles. */
long gpc_cuda_gemm_sm90_calls(void);
long gpc_cuda_gemm_sm90_cluster_calls(void);

/* Whether gpc_op_classifier runs the output head fused on the current GPU
 * (classifier_sm90.cu: compute capability 9.0, and neither GPC_GEMM_SM90=0
 * nor GPC_GEMM_SM90_HEAD=0), for bf16 tensors of the shapes it takes; and
 * how many heads it has run fused since the process started. */
int gpc_cuda_classifier_sm90_available(void);
long gpc_cuda_classifier_sm90_calls(void);

#ifdef __cplusplus
}
#endif

#endif
