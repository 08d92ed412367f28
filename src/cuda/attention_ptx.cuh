/*
 * attention_ptx.cuh: the inline PTX under gpc's tensor-core attention
 * (attention_mma.cu): ldmatrix loads of 8x8 b16 tiles from shared memory,
 * mma.sync m16n8k16 products with f32 accumulation in bf16 and f16, the
 * packing of two f32 into one register of two 16-bit values, and cp.async
 * copies from global to shared memory with their commit and wait.
 *
 * Device functions, forced inline: each translation unit that includes this
 * gets its own copy (the library is built without separable compilation).
 */
#ifndef GPC_CUDA_ATTENTION_PTX_CUH
#define GPC_CUDA_ATTENTION_PTX_CUH

#include "cuda/cuda_common.cuh"

__device__ __forceinline__ uint32_t att_smem(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void att_ldsm_x4(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3,
                                            const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(att_smem(p)));
}

__device__ __forceinline__ void att_ldsm_x4_t(uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                              uint32_t &r3, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(att_smem(p)));
}

template <typename T>
__device__ __forceinline__ void att_mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void att_mma<gpc_bf16_t>(float *c, const uint32_t *a, uint32_t b0,
                                                    uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void att_mma<gpc_f16_t>(float *c, const uint32_t *a, uint32_t b0,
                                                   uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two f32 into one register of two 16-bit values, the lower column first. */
template <typename T> __device__ __forceinline__ uint32_t att_pack(float lo, float hi);
template <> __device__ __forceinline__ uint32_t att_pack<gpc_bf16_t>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}
template <> __device__ __forceinline__ uint32_t att_pack<gpc_f16_t>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&v;
}

__device__ __forceinline__ void att_cp_async16(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(att_smem(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void att_cp_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> __device__ __forceinline__ void att_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

#endif /* GPC_CUDA_ATTENTION_PTX_CUH */
