/*
 * classifier_sm90.cu: the output head of a training step fused on Hopper
 * (under construction: every call answers GPC_ERR_UNSUPPORTED for now).
 */
#include "cuda/gemm_sm90.h"
#include "cuda/sm90_common.cuh"

gpc_status gpc_cuda_classifier_sm90(float *losses, gpc_bf16_t *dinp, gpc_bf16_t *dw,
                                    gpc_bf16_t *logits, const gpc_bf16_t *inp,
                                    const gpc_bf16_t *w, const int32_t *targets, int64_t N,
                                    int64_t Vp, int64_t C, int V, float dloss) {
    (void)losses, (void)dinp, (void)dw, (void)logits, (void)inp, (void)w, (void)targets, (void)N,
        (void)Vp, (void)C, (void)V, (void)dloss;
    return gpc_error(GPC_ERR_UNSUPPORTED, "classifier_sm90: not built yet");
}
