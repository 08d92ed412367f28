/*
 * paged.cu: the serving ops on the GPU (ops.h, "serving"): embedding at
 * given positions, storing keys and values in the paged cache, and attention
 * over the cache through block tables.
 *
 * Not yet implemented on the GPU: each answers GPC_ERR_UNSUPPORTED, so a
 * caller learns it at the first call rather than from wrong output.
 */
#include "cuda/cuda_common.cuh"

gpc_status gpc_cuda_embedding_at(gpc_tensor *out, const gpc_tensor *tokens,
                                 const gpc_tensor *positions, const gpc_tensor *wte,
                                 const gpc_tensor *wpe) {
    (void)out, (void)tokens, (void)positions, (void)wte, (void)wpe;
    return gpc_error(GPC_ERR_UNSUPPORTED, "embedding_at is not implemented on CUDA yet");
}

gpc_status gpc_cuda_kv_store(gpc_tensor *k_cache, gpc_tensor *v_cache, const gpc_tensor *qkv,
                             const gpc_tensor *slots) {
    (void)k_cache, (void)v_cache, (void)qkv, (void)slots;
    return gpc_error(GPC_ERR_UNSUPPORTED, "kv_store is not implemented on CUDA yet");
}

gpc_status gpc_cuda_paged_attention(gpc_tensor *out, const gpc_tensor *qkv,
                                    const gpc_tensor *k_cache, const gpc_tensor *v_cache,
                                    const gpc_tensor *block_tables, const gpc_tensor *token_seq,
                                    const gpc_tensor *token_pos, int num_heads) {
    (void)out, (void)qkv, (void)k_cache, (void)v_cache, (void)block_tables, (void)token_seq,
        (void)token_pos, (void)num_heads;
    return gpc_error(GPC_ERR_UNSUPPORTED, "paged_attention is not implemented on CUDA yet");
}
