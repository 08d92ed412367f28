/*
 * attention.cu: the CUDA backend's causal multi-head self-attention ops
 * (forward, backward, decode and prepare of the ops table), which choose
 * the path that serves each call (gpc_attention_path):
 *
 *   attention_mma.cu     gpc's flash attention on tensor cores (mma.sync),
 *                        bf16 or f16, head size 64;
 *   attention_simple.cu  gpc's exact one-warp-per-row kernels: f32, other
 *                        head sizes up to 128, and generation's rows;
 *   attention_sm90.cu    the backward on Hopper's wgmma (bf16, T a multiple
 *                        of 128, compute capability 9.0);
 *   attention_cudnn.cu   cuDNN's fused flash attention (attention_cudnn.h;
 *                        attention_no_cudnn.cu where cuDNN is absent),
 *                        which computes the same lse, so a forward of one
 *                        path and a backward of another agree.
 *
 * The backward's kernels follow GPC_ATTENTION_BWD: on gpc's path two
 * kernels by default (dk/dv, then dq: the same bits every run); "fused"
 * runs FA2's one-kernel backward (dq summed with atomics); "wgmma" runs
 * attention_sm90.cu's kernel, which adds each key block's dQ in bf16
 * straight into dqkv, where it serves (elsewhere the mma.sync one-kernel
 * backward). Under the auto path it replaces cuDNN's backward by default
 * where it serves.
 */
#include "cuda/attention_cudnn.h"
#include "cuda/attention_kernels.cuh"
#include "cuda/attention_sm90.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ shape */

static att_shape att_shape_of(const gpc_tensor *qkv, int num_heads) {
    att_shape s;
    s.B = (int)qkv->shape[0];
    s.T = (int)qkv->shape[1];
    s.C = (int)(qkv->shape[2] / 3);
    s.NH = num_heads;
    s.hs = s.C / num_heads;
    return s;
}

/* The tensor-core kernels need bf16/f16, head size 64 and 16-byte aligned
 * rows; the path simple forces the simple kernels (for comparisons). */
static int att_fast(gpc_attention_path path, gpc_dtype dtype, const att_shape *s,
                    const void *const *ptrs, int n) {
    if (path == GPC_ATTENTION_SIMPLE) return 0;
    if ((dtype != GPC_BF16 && dtype != GPC_F16) || s->hs != ATT_HS) return 0;
    for (int i = 0; i < n; i++)
        if (!gpc_cuda_aligned16(ptrs[i])) return 0;
    return 1;
}

/* ------------------------------------------------------- path choice
 *
 * auto takes cuDNN where it measured faster than gpc's kernels
 * (bench/RESULTS.md, "cuDNN's attention beside gpc's": on an H200 with cuDNN
 * 9.14, forward+backward 1.77x faster at B=64 T=1024 NH=12 hs=64, the GPT-2
 * step 11.5% faster): on Hopper-class GPUs (compute capability 9 and up), in
 * bf16 or fp16, when libcudnn loaded and its engines accepted the shape.
 * Anywhere else auto means gpc's kernels. A missing library under auto costs
 * a one-line notice, once; asking for cudnn by name makes every such reason
 * an error instead. */
#define ATT_AUTO_CUDNN_MIN_MAJOR 9

static int att_auto_wants_cudnn(gpc_dtype dtype, const att_shape *s) {
    if (dtype != GPC_BF16 && dtype != GPC_F16) return 0;
    if (!gpc_cudnn_attention_built() || s->hs % 8 != 0 || s->hs > 128) return 0;
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return major >= ATT_AUTO_CUDNN_MIN_MAJOR;
}

/* *use: 1 when cuDNN serves this call (which: GPC_CUDNN_FORWARD and/or
 * GPC_CUDNN_BACKWARD, the plans it needs). Fails only when cudnn was asked for
 * by name and cannot serve it, or GPC_ATTENTION is not a path.
 *
 * Under auto, only gpc_op_attention_prepare (build = 1) builds plans; a call
 * takes cuDNN only for a shape prepared ahead, as a model's training and
 * evaluation shapes are at gpt_create. Other shapes, such as the growing
 * windows of sampling, stay on gpc's kernels rather than pay a plan build
 * each. cudnn by name builds whatever shape it is given. */
static gpc_status att_route(const char *op, gpc_dtype dtype, const att_shape *s, int which,
                            int build, const void *const *ptrs, int n, gpc_attention_path *path,
                            int *use) {
    *use = 0;
    GPC_TRY(gpc_op_attention_path(path));
    if (*path == GPC_ATTENTION_GPC || *path == GPC_ATTENTION_SIMPLE) return GPC_OK;
    if (*path == GPC_ATTENTION_CUDNN) {
        gpc_status st = gpc_cudnn_attention_prepare(s->B, s->T, s->NH, s->hs, dtype, which);
        if (st != GPC_OK)
            return gpc_error_context(st,
                                     "%s with the cuDNN path (GPC_ATTENTION=cudnn or "
                                     "--attention cudnn): ",
                                     op);
        *use = 1;
        return GPC_OK;
    }
    if (!att_auto_wants_cudnn(dtype, s)) return GPC_OK;
    for (int i = 0; i < n; i++)
        if (!gpc_cuda_aligned16(ptrs[i])) return GPC_OK;
    if (!build) {
        *use = gpc_cudnn_attention_ready(s->B, s->T, s->NH, s->hs, dtype, which);
        return GPC_OK;
    }
    gpc_status st = gpc_cudnn_attention_load();
    if (st != GPC_OK) {
        static int noticed;
        if (!noticed++)
            gpc_log(GPC_LOG_WARN, "attention runs on gpc's kernels: %s", gpc_last_error());
        gpc_clear_error();
        return GPC_OK;
    }
    /* a shape cuDNN has no engine for is cached as such and left to us */
    if (gpc_cudnn_attention_prepare(s->B, s->T, s->NH, s->hs, dtype, which) == GPC_OK)
        *use = 1;
    else
        gpc_clear_error();
    return GPC_OK;
}

/* GPC_ATTENTION_BWD: "auto" (the default: under the auto path the wgmma
 * kernel in place of cuDNN's backward where it serves, and on gpc's path
 * the two kernels) 3, "two" 0, "fused" (the one-kernel backward) 1, "wgmma"
 * (the same on attention_sm90.cu's kernel where it runs, on either path) 2;
 * read once, and any other value is named in a warning. */
enum { ATT_BWD_TWO, ATT_BWD_FUSED, ATT_BWD_WGMMA, ATT_BWD_AUTO };
static int att_backward_mode(void) {
    static int mode = -1;
    if (mode < 0) {
        const char *e = gpc_setting_str("GPC_ATTENTION_BWD");
        mode = !e || !*e || !strcmp(e, "auto") ? ATT_BWD_AUTO
               : !strcmp(e, "two")             ? ATT_BWD_TWO
               : !strcmp(e, "fused")           ? ATT_BWD_FUSED
               : !strcmp(e, "wgmma")           ? ATT_BWD_WGMMA
                                               : -2;
        if (mode == -2) {
            gpc_log(GPC_LOG_WARN,
                    "GPC_ATTENTION_BWD=%s is not 'auto', 'two', 'fused' or 'wgmma': using the "
                    "two-kernel backward",
                    e);
            mode = ATT_BWD_TWO;
        }
    }
    return mode;
}

/* Whether, under the auto path, gpc's wgmma kernel takes a shape's backward
 * from cuDNN (GPC_ATTENTION_BWD auto or wgmma, bf16, head size 64, a T and
 * GPU it serves): cuDNN's forward, then this backward (the two paths' lse
 * agree), and cuDNN's backward plan is never built for the shape. */
static int att_wgmma_takes_backward(gpc_attention_path path, gpc_dtype dtype, const att_shape *s) {
    const int mode = att_backward_mode();
    return path == GPC_ATTENTION_AUTO && (mode == ATT_BWD_AUTO || mode == ATT_BWD_WGMMA) &&
           dtype == GPC_BF16 && s->hs == ATT_HS && gpc_cuda_attention_sm90_serves(s->T);
}

static gpc_status att_check(const char *op, const att_shape *s) {
    if ((int64_t)s->B * s->T * 3 * s->C > ((int64_t)1 << 40) || s->T <= 0)
        return gpc_error(GPC_ERR_UNSUPPORTED, "%s: shape out of the GPU kernel's range", op);
    return GPC_OK;
}

/* What every attention entry does first: out's dtype against qkv's, the
 * device, and qkv's shape into *s (s->B 0: nothing to do). */
static gpc_status att_begin(const char *op, const gpc_tensor *out, const gpc_tensor *qkv,
                            int num_heads, att_shape *s) {
    GPC_TRY(gpc_cuda_same_dtype(op, "out", out, "qkv", qkv));
    GPC_TRY(gpc_cuda_enter(out));
    *s = att_shape_of(qkv, num_heads);
    return s->B == 0 ? GPC_OK : att_check(op, s);
}

gpc_status gpc_cuda_attention_forward(gpc_tensor *out, gpc_tensor *lse, const gpc_tensor *qkv,
                                      int num_heads) {
    const char *op = "attention_forward";
    att_shape s;
    GPC_TRY(att_begin(op, out, qkv, num_heads, &s));
    if (s.B == 0) return GPC_OK;
    const void *ptrs[] = {out->data, qkv->data, lse->data};
    gpc_attention_path path;
    int use_cudnn;
    GPC_TRY(att_route(op, out->dtype, &s, GPC_CUDNN_FORWARD, 0, ptrs, 3, &path, &use_cudnn));
    if (use_cudnn) return gpc_cudnn_attention_forward(out, lse, qkv, num_heads);
    float scale = 1.0f / sqrtf((float)s.hs);
    cudaStream_t st = gpc_cuda_stream();
    if (att_fast(path, out->dtype, &s, ptrs, 2)) {
        gpc_cuda_attention_mma_forward(out, lse, qkv, &s, scale, st);
        GPC_CUDA_CHECK_LAUNCH();
        return GPC_OK;
    }
    if (s.hs > ATT_NAIVE_MAX_HS)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "%s: head size %d on the GPU needs bf16 or f16 and head size 64, or a "
                         "head size of at most %d",
                         op, s.hs, ATT_NAIVE_MAX_HS);
    GPC_TRY(gpc_cuda_attention_simple_forward(out, lse, qkv, &s, scale, st));
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

/* Generation's few rows at a time (att_decode_kernel), whose loads of the
 * kept keys and values are what a decoding step costs. */
gpc_status gpc_cuda_attention_decode(gpc_tensor *out, const gpc_tensor *qkv, int num_heads) {
    const char *op = "attention_decode";
    att_shape s;
    GPC_TRY(att_begin(op, out, qkv, num_heads, &s));
    if (s.B == 0) return GPC_OK;
    if (s.hs > ATT_NAIVE_MAX_HS)
        return gpc_error(GPC_ERR_UNSUPPORTED, "%s: head size %d on the GPU is over %d", op, s.hs,
                         ATT_NAIVE_MAX_HS);
    int Tq = (int)out->shape[1];
    int64_t rows = (int64_t)s.B * s.NH * Tq;
    float scale = 1.0f / sqrtf((float)s.hs);
    if (rows > 0x7fffffff) return gpc_error(GPC_ERR_UNSUPPORTED, "%s: too many rows", op);
    GPC_TRY(gpc_cuda_attention_simple_decode(out, qkv, &s, Tq, scale, gpc_cuda_stream()));
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

gpc_status gpc_cuda_attention_backward(gpc_tensor *dqkv, const gpc_tensor *dout,
                                       const gpc_tensor *qkv, const gpc_tensor *out,
                                       const gpc_tensor *lse, int num_heads) {
    const char *op = "attention_backward";
    GPC_TRY(gpc_cuda_same_dtype(op, "dqkv", dqkv, "qkv", qkv));
    GPC_TRY(gpc_cuda_same_dtype(op, "dout", dout, "qkv", qkv));
    att_shape s;
    GPC_TRY(att_begin(op, out, qkv, num_heads, &s));
    if (s.B == 0) return GPC_OK;
    const void *ptrs[] = {out->data, qkv->data, dqkv->data, dout->data, lse->data};
    gpc_attention_path path;
    GPC_TRY(gpc_op_attention_path(&path));
    /* where the wgmma kernel takes the backward from cuDNN, a shape cuDNN
     * serves is one whose forward plan was prepared (its backward plan never
     * is); the wgmma kernel then runs in place of cuDNN's backward */
    const int takes = att_wgmma_takes_backward(path, out->dtype, &s);
    int use_cudnn;
    GPC_TRY(att_route(op, out->dtype, &s, takes ? GPC_CUDNN_FORWARD : GPC_CUDNN_BACKWARD, 0, ptrs,
                      5, &path, &use_cudnn));
    if (use_cudnn && !takes)
        return gpc_cudnn_attention_backward(dqkv, dout, qkv, out, lse, num_heads);
    const int from_cudnn = use_cudnn && takes;
    const int mode = att_backward_mode();
    int fast = att_fast(path, out->dtype, &s, ptrs, 4);
    if (!fast && s.hs > ATT_NAIVE_MAX_HS)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "%s: head size %d on the GPU needs bf16 or f16 and head size 64, or a "
                         "head size of at most %d",
                         op, s.hs, ATT_NAIVE_MAX_HS);
    int64_t rows = (int64_t)s.B * s.NH * s.T;
    /* the wgmma kernel (bf16, T a multiple of 128 on compute capability
     * 9.0; lse 16-byte aligned as its bulk copies need), or the mma.sync
     * one-kernel backward in its place where it does not serve. gpc's path
     * keeps its two kernels by default: they give the same bits every run */
    int wgmma = fast && (mode == ATT_BWD_WGMMA || from_cudnn) && out->dtype == GPC_BF16 &&
                gpc_cuda_aligned16(lse->data) && gpc_cuda_attention_sm90_serves(s.T);
    int fused = fast && !wgmma && (mode == ATT_BWD_FUSED || mode == ATT_BWD_WGMMA);
    /* scratch: dsum [rows], then (fused) the f32 dq accumulator [rows, 64].
     * dsum's pass zeroes it, or (wgmma) dqkv's q third, into which that
     * kernel adds dQ itself */
    size_t dsum_bytes = ((size_t)rows * sizeof(float) + 255) & ~(size_t)255;
    size_t zero_bytes = fused ? (size_t)rows * ATT_HS * sizeof(float) : 0;
    void *dsum;
    GPC_TRY(gpc_cuda_scratch(dsum_bytes + zero_bytes, &dsum));
    float *dq_acc = (float *)((char *)dsum + dsum_bytes);
    float scale = 1.0f / sqrtf((float)s.hs);
    cudaStream_t st = gpc_cuda_stream();
    if (fast)
        GPC_TRY(gpc_cuda_attention_mma_dsum((float *)dsum, dq_acc, (int64_t)(zero_bytes / 16),
                                            wgmma ? dqkv->data : NULL, dout, out, &s, st));
    else
        GPC_TRY(gpc_cuda_attention_simple_dsum((float *)dsum, dout, out, &s, st));
    GPC_CUDA_CHECK_LAUNCH();
    if (wgmma)
        return gpc_cuda_attention_backward_sm90(
            (gpc_bf16_t *)dqkv->data, (const gpc_bf16_t *)qkv->data, (const gpc_bf16_t *)dout->data,
            (const float *)lse->data, (const float *)dsum, s.B, s.T, s.NH, scale);
    if (fused) {
        gpc_cuda_attention_mma_backward_fused(dqkv, qkv, dout, lse, dq_acc, (const float *)dsum, &s,
                                              scale, st);
        GPC_CUDA_CHECK_LAUNCH();
        return GPC_OK;
    }
    if (fast) {
        gpc_cuda_attention_mma_backward(dqkv, qkv, dout, lse, (const float *)dsum, &s, scale, st);
        GPC_CUDA_CHECK_LAUNCH();
        return GPC_OK;
    }
    GPC_TRY(gpc_cuda_attention_simple_backward(dqkv, qkv, dout, lse, (const float *)dsum, &s, scale,
                                               st));
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

/* Builds what the chosen path needs for this shape ahead of the first step:
 * cuDNN's plans and workspace, when cuDNN will serve it (under auto, only
 * the forward's where gpc's wgmma kernel takes the backward). gpc's kernels
 * need nothing built (their small row-sum scratch grows on first use). */
gpc_status gpc_cuda_attention_prepare(const gpc_tensor *qkv, int num_heads, int backward) {
    GPC_TRY(gpc_cuda_enter(qkv));
    att_shape s = att_shape_of(qkv, num_heads);
    if (s.B == 0 || s.T == 0) return GPC_OK;
    /* the model's tensors are placed 256-byte aligned, so alignment is
     * settled at each call; here only the shape and dtype decide */
    const void *aligned[] = {(const void *)(uintptr_t)256};
    gpc_attention_path path;
    GPC_TRY(gpc_op_attention_path(&path));
    int use;
    int which =
        GPC_CUDNN_FORWARD |
        (backward && !att_wgmma_takes_backward(path, qkv->dtype, &s) ? GPC_CUDNN_BACKWARD : 0);
    return att_route("attention_prepare", qkv->dtype, &s, which, 1, aligned, 1, &path, &use);
}
