/*
 * cuda_ops.cu: the CUDA backend's table of numeric ops. Placeholder until the
 * kernels land; entries left NULL report GPC_ERR_UNSUPPORTED.
 */
#include "cuda/cuda_common.cuh"

extern "C" const gpc_ops_table gpc_cuda_ops = {};
