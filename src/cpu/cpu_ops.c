/*
 * cpu_ops.c: the CPU backend's table of numeric ops. Each entry points at the
 * kernel of its family (see cpu.h for which file holds which).
 */
#include "cpu/cpu.h"

const gpc_ops_table gpc_cpu_ops = {
    .embedding_forward = gpc_cpu_embedding_forward,
    .embedding_backward = gpc_cpu_embedding_backward,
    .layernorm_forward = gpc_cpu_layernorm_forward,
    .layernorm_backward = gpc_cpu_layernorm_backward,
    .residual_layernorm_forward = gpc_cpu_residual_layernorm_forward,
    .matmul_forward = gpc_cpu_matmul_forward,
    .matmul_backward = gpc_cpu_matmul_backward,
    .gelu_forward = gpc_cpu_gelu_forward,
    .gelu_backward = gpc_cpu_gelu_backward,
    .residual_forward = gpc_cpu_residual_forward,
    .attention_forward = gpc_cpu_attention_forward,
    .attention_backward = gpc_cpu_attention_backward,
    .crossentropy_forward_backward = gpc_cpu_crossentropy_forward_backward,
    .sum_squares = gpc_cpu_sum_squares,
    .adamw = gpc_cpu_adamw,
    .convert = gpc_cpu_convert,
    .scale = gpc_cpu_scale,
    .matmul_gelu_forward = gpc_cpu_matmul_gelu_forward,
    .matmul_backward_dgelu = gpc_cpu_matmul_backward_dgelu,
    .sum = gpc_cpu_sum,
};
