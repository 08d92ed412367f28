/*
 * decode.c: the fused products of a decode step (ops.h, decode_product) on
 * the CPU.
 *
 * The fusion saves kernel launches on a GPU; on the CPU there is nothing to
 * save, so the op runs the unfused kernels in turn (layernorm, the product
 * with its bias and residual, GELU, the cache store). That makes its result
 * bit for bit that of the ops it stands for, so a serving step gives the
 * same tokens whichever it runs, and the GPU's fused kernel is tested
 * against it.
 */
#include "cpu/cpu.h"

gpc_status gpc_cpu_decode_product(gpc_tensor *out, const gpc_tensor *inp, const gpc_tensor *weight,
                                  const gpc_decode_product_args *args) {
    const char *op = "decode_product";
    GPC_TRY(gpc_cpu_need_f32(op, "out", out));
    GPC_TRY(gpc_cpu_need_f32(op, "inp", inp));
    int64_t C = gpc_cpu_last_dim(inp), N = gpc_cpu_rows(inp);
    gpc_tensor x = gpc_tensor_2d(inp->data, GPC_F32, inp->device, N, C);
    float *scratch = NULL;
    if (args->ln_weight) {
        /* the normalised rows, then each row's mean and rstd */
        scratch = gpc_malloc(((size_t)N * (size_t)C + 2 * (size_t)N) * sizeof(float) + 1);
        if (!scratch)
            return gpc_error(GPC_ERR_NOMEM, "%s: out of host memory for %lld normalised rows", op,
                             (long long)N);
        gpc_tensor ln = gpc_tensor_2d(scratch, GPC_F32, inp->device, N, C);
        gpc_tensor mean = gpc_tensor_1d(scratch + N * C, GPC_F32, inp->device, N);
        gpc_tensor rstd = gpc_tensor_1d(scratch + N * C + N, GPC_F32, inp->device, N);
        gpc_status s =
            gpc_cpu_layernorm_forward(&ln, &mean, &rstd, inp, args->ln_weight, args->ln_bias);
        if (s != GPC_OK) {
            gpc_free(scratch);
            return s;
        }
        x = ln;
    }
    gpc_status s;
    if (args->residual)
        s = gpc_cpu_matmul_residual_forward(out, &x, weight, args->bias, args->residual);
    else
        s = gpc_cpu_matmul_forward(out, &x, weight, args->bias);
    /* GELU reads each element before it writes it: in place is safe */
    if (s == GPC_OK && args->gelu) s = gpc_cpu_gelu_forward(out, out);
    gpc_free(scratch);
    if (s != GPC_OK || !args->k_cache) return s;
    int64_t OC = gpc_cpu_rows(weight);
    gpc_tensor qkv = gpc_tensor_2d(out->data, GPC_F32, out->device, N, OC);
    return gpc_cpu_kv_store(args->k_cache, args->v_cache, &qkv, args->slots);
}
