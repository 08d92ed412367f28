/*
 * matmul_gelu.c: the fused linear + GELU ops of ops.h on the CPU.
 *
 * On the CPU there is nothing to gain from a fused kernel (the GEMM dominates
 * and the GELU pass is cheap next to it), so each op runs the two existing
 * kernels in turn. That makes the CPU result bit for bit the unfused one,
 * which is what the GPU's epilogue versions are tested against.
 */
#include "cpu/cpu.h"

gpc_status gpc_cpu_matmul_gelu_forward(gpc_tensor *out_pre, gpc_tensor *out_gelu,
                                       const gpc_tensor *inp, const gpc_tensor *weight,
                                       const gpc_tensor *bias) {
    GPC_TRY(gpc_cpu_matmul_forward(out_pre, inp, weight, bias));
    return gpc_cpu_gelu_forward(out_gelu, out_pre);
}

gpc_status gpc_cpu_matmul_backward_dgelu(gpc_tensor *dinp, gpc_tensor *dweight, gpc_tensor *dbias,
                                         gpc_tensor *dpre_bias, const gpc_tensor *dout,
                                         const gpc_tensor *inp, const gpc_tensor *weight,
                                         const gpc_tensor *gelu_inp) {
    GPC_TRY(gpc_cpu_matmul_backward(dinp, dweight, dbias, dout, inp, weight));
    /* gelu_backward reads each element before writing it, so in place is safe */
    GPC_TRY(gpc_cpu_gelu_backward(dinp, gelu_inp, dinp));
    return dpre_bias ? gpc_cpu_column_sums(dpre_bias, dinp, 0) : GPC_OK;
}
