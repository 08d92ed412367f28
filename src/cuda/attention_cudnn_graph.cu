/*
 * attention_cudnn_graph.cu: builds the execution plans of cuDNN's fused
 * flash attention (attention_cudnn.cu caches and runs them).
 *
 * cuDNN 9 has no attention function to call. Its fused engines recognise a
 * graph of generic operations, two matrix products with a softmax between
 * them, and run it as one flash-attention kernel. So this file describes the
 * computation with cuDNN's backend graph API (descriptors for tensors and
 * operations, an operation graph, heuristics, an execution plan) in the
 * pattern NVIDIA's cudnn-frontend lowers its SDPA nodes to, which is the
 * pattern the engines accept:
 *
 *   forward   S = Q K^T (f32); S *= 1/sqrt(hs); causal mask: where row < col,
 *             S = -inf (gen_index row and col, CMP_GE, BINARY_SELECT);
 *             softmax with statistics: m = max_j S, e = exp(S - m),
 *             l = sum_j e, Stats = m + log l, P = e / l (rounded to the
 *             input dtype); O = P V.
 *   backward  D = rowsum(dO * O); P rebuilt as exp(S - Stats), masked;
 *             dV = P^T dO; dP = dO V^T; dS = P (dP - D) / sqrt(hs);
 *             dK = dS^T Q; dQ = dS K, accumulated in f32, then converted.
 *
 * Stats is the natural-log log-sum-exp of each row of scaled scores, exactly
 * gpc's lse [B,NH,T], so the two paths' forward and backward mix freely.
 *
 * No copies: Q, K and V are strided views into qkv [B,T,3C] (dims
 * [B,NH,T,hs], strides [T*3C, hs, 3C, 1], K^T and V^T by swapping the last
 * two), O and dO [B,NH,T,hs] with strides [T*C, hs, C, 1], dQ, dK, dV the
 * three thirds of dqkv like Q, K, V.
 */
#include "cuda/attention_cudnn_plan.cuh"

#include <stdlib.h>
#include <string.h>

#define CUDNN_ATT_MAX_OPS 40 /* operations of one graph (the backward: 22) */
#define CUDNN_ATT_ALIGN 256

static size_t align_up(size_t n) {
    return (n + CUDNN_ATT_ALIGN - 1) / CUDNN_ATT_ALIGN * CUDNN_ATT_ALIGN;
}

/* ------------------------------------------------------- graph building
 *
 * A graph under construction: every descriptor made (destroyed together if
 * the graph is abandoned, kept with the plan otherwise), the operations in
 * topological order, the tensors the caller provides, and the first
 * failure. After a failure every call is a no-op, so a graph is written as
 * straight-line code and checked once at the end. */

typedef struct {
    cudnnBackendDescriptor_t descs[CUDNN_ATT_MAX_DESCS];
    int num_descs;
    cudnnBackendDescriptor_t ops[CUDNN_ATT_MAX_OPS];
    int num_ops;
    int64_t uids[CUDNN_ATT_MAX_TENSORS];
    tensor_role roles[CUDNN_ATT_MAX_TENSORS];
    int num_tensors;
    int64_t next_uid;
    cudnnStatus_t status;
    char failure[768];
} graph;

typedef struct {
    cudnnBackendDescriptor_t desc;
    int64_t uid;
} tensor;

static void graph_fail(graph *g, cudnnStatus_t status, const char *what) {
    char last[512] = "";
    gpc_cudnn.GetLastErrorString(last, sizeof last);
    g->status = status;
    snprintf(g->failure, sizeof g->failure, "%s: %s%s%s", what, gpc_cudnn.GetErrorString(status),
             last[0] ? "; cuDNN says: " : "", last);
}

static void graph_release(graph *g) {
    for (int i = g->num_descs - 1; i >= 0; i--)
        gpc_cudnn.DestroyDescriptor(g->descs[i]);
    g->num_descs = 0;
}

static cudnnBackendDescriptor_t make(graph *g, cudnnBackendDescriptorType_t type,
                                     const char *what) {
    if (g->status != CUDNN_STATUS_SUCCESS) return NULL;
    if (g->num_descs == CUDNN_ATT_MAX_DESCS) {
        g->status = CUDNN_STATUS_INTERNAL_ERROR;
        snprintf(g->failure, sizeof g->failure, "%s: more than %d descriptors in one graph", what,
                 CUDNN_ATT_MAX_DESCS);
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    cudnnStatus_t status = gpc_cudnn.CreateDescriptor(type, &d);
    if (status != CUDNN_STATUS_SUCCESS) {
        graph_fail(g, status, what);
        return NULL;
    }
    g->descs[g->num_descs++] = d;
    return d;
}

static void set(graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendAttributeType_t type, int64_t count, const void *values,
                const char *what) {
    if (g->status != CUDNN_STATUS_SUCCESS) return;
    cudnnStatus_t status = gpc_cudnn.SetAttribute(d, name, type, count, values);
    if (status != CUDNN_STATUS_SUCCESS) graph_fail(g, status, what);
}

static void finalize(graph *g, cudnnBackendDescriptor_t d, const char *what) {
    if (g->status != CUDNN_STATUS_SUCCESS) return;
    cudnnStatus_t status = gpc_cudnn.Finalize(d);
    if (status != CUDNN_STATUS_SUCCESS) graph_fail(g, status, what);
}

static void set_desc(graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                     cudnnBackendDescriptor_t value, const char *what) {
    set(g, d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, what);
}

enum { TENSOR_VIRTUAL = 1, TENSOR_BY_VALUE = 2, TENSOR_REORDER_F16x16 = 4 };

/* A 4-d tensor. uid 0 makes a virtual (intermediate) tensor with a fresh uid;
 * other tensors are recorded with their role for the variant pack. */
static tensor make_tensor(graph *g, const char *what, cudnnDataType_t type, const int64_t dims[4],
                          const int64_t strides[4], int flags, tensor_role role) {
    tensor t = {NULL, 0};
    bool is_virtual = (flags & TENSOR_VIRTUAL) != 0, by_value = (flags & TENSOR_BY_VALUE) != 0;
    t.uid = is_virtual ? g->next_uid++ : (int64_t)role + 1;
    t.desc = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, what);
    int64_t alignment = 16;
    set(g, t.desc, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, what);
    set(g, t.desc, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, what);
    set(g, t.desc, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides, what);
    set(g, t.desc, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &t.uid, what);
    set(g, t.desc, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, what);
    set(g, t.desc, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, what);
    if (by_value)
        set(g, t.desc, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, what);
    if (flags & TENSOR_REORDER_F16x16) {
        cudnnBackendTensorReordering_t reorder = CUDNN_TENSOR_REORDERING_F16x16;
        set(g, t.desc, CUDNN_ATTR_TENSOR_REORDERING_MODE, CUDNN_TYPE_TENSOR_REORDERING_MODE, 1,
            &reorder, what);
    }
    finalize(g, t.desc, what);
    if (!is_virtual && g->status == CUDNN_STATUS_SUCCESS) {
        g->uids[g->num_tensors] = t.uid;
        g->roles[g->num_tensors++] = role;
    }
    return t;
}

static tensor make_virtual(graph *g, const char *what, cudnnDataType_t type, const int64_t dims[4],
                           const int64_t strides[4]) {
    return make_tensor(g, what, type, dims, strides, TENSOR_VIRTUAL, ROLE_Q);
}

/* A float scalar passed by value at execution. */
static tensor make_scalar(graph *g, const char *what, tensor_role role) {
    const int64_t ones[4] = {1, 1, 1, 1};
    return make_tensor(g, what, CUDNN_DATA_FLOAT, ones, ones, TENSOR_BY_VALUE, role);
}

static void add_op(graph *g, cudnnBackendDescriptor_t op, const char *what) {
    finalize(g, op, what);
    if (g->status != CUDNN_STATUS_SUCCESS) return;
    if (g->num_ops == CUDNN_ATT_MAX_OPS) {
        g->status = CUDNN_STATUS_INTERNAL_ERROR;
        snprintf(g->failure, sizeof g->failure, "%s: more than %d operations", what,
                 CUDNN_ATT_MAX_OPS);
        return;
    }
    g->ops[g->num_ops++] = op;
}

/* y = mode(x, b, t); axis only for GEN_INDEX. Returns y. */
static tensor pointwise(graph *g, const char *what, cudnnPointwiseMode_t mode,
                        cudnnDataType_t compute, tensor x, const tensor *b, const tensor *t,
                        tensor y, int64_t axis) {
    cudnnBackendDescriptor_t pw = make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what);
    set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, what);
    set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &compute, what);
    if (mode == CUDNN_POINTWISE_GEN_INDEX)
        set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, what);
    finalize(g, pw, what);
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what);
    set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, what);
    set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x.desc, what);
    if (b) set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b->desc, what);
    if (t) set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t->desc, what);
    set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y.desc, what);
    add_op(g, op, what);
    return y;
}

/* y = reduce(x) over the dimensions where y has extent 1. */
static tensor reduction(graph *g, const char *what, cudnnReduceTensorOp_t mode, tensor x,
                        tensor y) {
    cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t r = make(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what);
    set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, what);
    set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, what);
    finalize(g, r, what);
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what);
    set_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x.desc, what);
    set_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y.desc, what);
    set_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r, what);
    add_op(g, op, what);
    return y;
}

/* c = a b, batched over the first two dimensions, accumulated in f32. */
static tensor matmul(graph *g, const char *what, tensor a, tensor b, tensor c) {
    cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t m = make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, what);
    set(g, m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, what);
    finalize(g, m, what);
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what);
    set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a.desc, what);
    set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b.desc, what);
    set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c.desc, what);
    set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, m, what);
    add_op(g, op, what);
    return c;
}

/* y = x seen through y's dimensions and strides (here: a transpose). */
static tensor reshape(graph *g, const char *what, tensor x, tensor y) {
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, what);
    set_desc(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x.desc, what);
    set_desc(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y.desc, what);
    add_op(g, op, what);
    return y;
}

/* ------------------------------------------------------------ the graphs
 *
 * Variants of the same computation, tried in order until cuDNN finds an
 * engine: cudnn-frontend's lowering changed over its releases (where the
 * backward masks, whether D lives in the workspace, the dQ accumulator's
 * layout, the compute type of the index generator), and each cuDNN release
 * accepts the patterns of the frontends shipped beside it. The first
 * variant is the newest frontend's. */

enum {
    VARIANT_INDEX_F32 = 1,    /* gen_index computed in f32 rather than int32 */
    VARIANT_MASK_FIRST = 2,   /* backward: mask the scores before subtracting Stats */
    VARIANT_ROWSUM_VIRT = 4,  /* backward: D kept virtual rather than in the workspace */
    VARIANT_DP_TIMES_ONE = 8, /* backward: dP * 1, as dropout-free graphs once had */
    VARIANT_ACCUM_F16x16 = 16 /* backward: dQ accumulator in the F16x16 reordering */
};

static const int forward_variants[] = {0, VARIANT_INDEX_F32};
static const int backward_variants[] = {
    0,
    VARIANT_MASK_FIRST | VARIANT_ROWSUM_VIRT | VARIANT_DP_TIMES_ONE | VARIANT_ACCUM_F16x16,
    VARIANT_MASK_FIRST | VARIANT_ROWSUM_VIRT | VARIANT_DP_TIMES_ONE,
    VARIANT_INDEX_F32,
};

typedef struct {
    int64_t B, H, T, D, C;
    cudnnDataType_t io;
    int64_t qkv_dims[4], qkv_strides[4]; /* Q, V, dQ, dK, dV inside qkv / dqkv */
    int64_t kt_dims[4], kt_strides[4];   /* K^T (and V^T) inside qkv */
    int64_t o_strides[4];                /* O, dO [B,NH,T,hs] inside [B,T,C] */
    int64_t s_dims[4], s_strides[4];     /* scores [B,NH,T,T] */
    int64_t st_strides[4];               /* scores transposed */
    int64_t row_dims[4], row_strides[4]; /* one value per row [B,NH,T,1] */
    int64_t packed_strides[4];           /* [B,NH,T,hs] contiguous (dQ accumulator) */
} geometry;

static geometry geometry_of(const plan_key *k) {
    geometry s;
    int64_t B = k->B, H = k->NH, T = k->T, D = k->hs, C = H * D;
    s.B = B, s.H = H, s.T = T, s.D = D, s.C = C;
    s.io = k->dtype == GPC_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    const int64_t qd[4] = {B, H, T, D}, qs[4] = {T * 3 * C, D, 3 * C, 1};
    const int64_t kd[4] = {B, H, D, T}, ks[4] = {T * 3 * C, D, 1, 3 * C};
    const int64_t os[4] = {T * C, D, C, 1};
    const int64_t sd[4] = {B, H, T, T}, ss[4] = {H * T * T, T * T, T, 1};
    const int64_t sts[4] = {H * T * T, T * T, 1, T};
    const int64_t rd[4] = {B, H, T, 1}, rs[4] = {H * T, T, 1, 1};
    const int64_t ps[4] = {H * T * D, T * D, D, 1};
    memcpy(s.qkv_dims, qd, sizeof qd), memcpy(s.qkv_strides, qs, sizeof qs);
    memcpy(s.kt_dims, kd, sizeof kd), memcpy(s.kt_strides, ks, sizeof ks);
    memcpy(s.o_strides, os, sizeof os);
    memcpy(s.s_dims, sd, sizeof sd), memcpy(s.s_strides, ss, sizeof ss);
    memcpy(s.st_strides, sts, sizeof sts);
    memcpy(s.row_dims, rd, sizeof rd), memcpy(s.row_strides, rs, sizeof rs);
    memcpy(s.packed_strides, ps, sizeof ps);
    return s;
}

/* x where row >= col (the query may see the key), neg_inf elsewhere. */
static tensor causal_mask(graph *g, const geometry *s, tensor x, tensor neg_inf, int variant) {
    cudnnDataType_t index_compute =
        variant & VARIANT_INDEX_F32 ? CUDNN_DATA_FLOAT : CUDNN_DATA_INT32;
    tensor row = make_virtual(g, "row index", CUDNN_DATA_INT32, s->s_dims, s->s_strides);
    tensor col = make_virtual(g, "column index", CUDNN_DATA_INT32, s->s_dims, s->s_strides);
    pointwise(g, "row index", CUDNN_POINTWISE_GEN_INDEX, index_compute, x, NULL, NULL, row, 2);
    pointwise(g, "column index", CUDNN_POINTWISE_GEN_INDEX, index_compute, x, NULL, NULL, col, 3);
    tensor keep = make_virtual(g, "causal mask", CUDNN_DATA_BOOLEAN, s->s_dims, s->s_strides);
    pointwise(g, "causal mask", CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, &col, NULL, keep,
              -1);
    tensor y = make_virtual(g, "masked scores", CUDNN_DATA_FLOAT, s->s_dims, s->s_strides);
    return pointwise(g, "masked scores", CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x,
                     &neg_inf, &keep, y, -1);
}

static void build_forward(graph *g, const geometry *s, int variant) {
    const cudnnDataType_t F = CUDNN_DATA_FLOAT;
    tensor q = make_tensor(g, "Q", s->io, s->qkv_dims, s->qkv_strides, 0, ROLE_Q);
    tensor kt = make_tensor(g, "K^T", s->io, s->kt_dims, s->kt_strides, 0, ROLE_K);
    tensor v = make_tensor(g, "V", s->io, s->qkv_dims, s->qkv_strides, 0, ROLE_V);
    tensor o = make_tensor(g, "O", s->io, s->qkv_dims, s->o_strides, 0, ROLE_O);
    tensor stats = make_tensor(g, "Stats", F, s->row_dims, s->row_strides, 0, ROLE_STATS);
    tensor scale = make_scalar(g, "scale", ROLE_SCALE);
    tensor neg_inf = make_scalar(g, "-inf", ROLE_NEG_INF);

    tensor sc = make_virtual(g, "Q K^T", F, s->s_dims, s->s_strides);
    matmul(g, "Q K^T", q, kt, sc);
    tensor scaled = make_virtual(g, "scaled scores", F, s->s_dims, s->s_strides);
    pointwise(g, "scaled scores", CUDNN_POINTWISE_MUL, F, sc, &scale, NULL, scaled, -1);
    tensor masked = causal_mask(g, s, scaled, neg_inf, variant);

    tensor max = make_virtual(g, "row max", F, s->row_dims, s->row_strides);
    reduction(g, "row max", CUDNN_REDUCE_TENSOR_MAX, masked, max);
    tensor shifted = make_virtual(g, "scores - max", F, s->s_dims, s->s_strides);
    pointwise(g, "scores - max", CUDNN_POINTWISE_SUB, F, masked, &max, NULL, shifted, -1);
    tensor e = make_virtual(g, "exp", F, s->s_dims, s->s_strides);
    pointwise(g, "exp", CUDNN_POINTWISE_EXP, F, shifted, NULL, NULL, e, -1);
    tensor sum = make_virtual(g, "row sum", F, s->row_dims, s->row_strides);
    reduction(g, "row sum", CUDNN_REDUCE_TENSOR_ADD, e, sum);
    tensor log_sum = make_virtual(g, "log row sum", F, s->row_dims, s->row_strides);
    pointwise(g, "log row sum", CUDNN_POINTWISE_LOG, F, sum, NULL, NULL, log_sum, -1);
    pointwise(g, "Stats", CUDNN_POINTWISE_ADD, F, max, &log_sum, NULL, stats, -1);
    /* P in the input dtype: the second product's A operand */
    tensor p = make_virtual(g, "P", s->io, s->s_dims, s->s_strides);
    pointwise(g, "P", CUDNN_POINTWISE_DIV, F, e, &sum, NULL, p, -1);
    matmul(g, "P V", p, v, o);
}

static void build_backward(graph *g, const geometry *s, int variant) {
    const cudnnDataType_t F = CUDNN_DATA_FLOAT;
    tensor q = make_tensor(g, "Q", s->io, s->qkv_dims, s->qkv_strides, 0, ROLE_Q);
    tensor kt = make_tensor(g, "K^T", s->io, s->kt_dims, s->kt_strides, 0, ROLE_K);
    tensor vt = make_tensor(g, "V^T", s->io, s->kt_dims, s->kt_strides, 0, ROLE_V);
    tensor o = make_tensor(g, "O", s->io, s->qkv_dims, s->o_strides, 0, ROLE_O);
    tensor dout = make_tensor(g, "dO", s->io, s->qkv_dims, s->o_strides, 0, ROLE_DO);
    tensor stats = make_tensor(g, "Stats", F, s->row_dims, s->row_strides, 0, ROLE_STATS);
    tensor dq = make_tensor(g, "dQ", s->io, s->qkv_dims, s->qkv_strides, 0, ROLE_DQ);
    tensor dk = make_tensor(g, "dK", s->io, s->qkv_dims, s->qkv_strides, 0, ROLE_DK);
    tensor dv = make_tensor(g, "dV", s->io, s->qkv_dims, s->qkv_strides, 0, ROLE_DV);
    tensor scale = make_scalar(g, "scale", ROLE_SCALE);
    tensor neg_inf = make_scalar(g, "-inf", ROLE_NEG_INF);
    tensor one = make_scalar(g, "one", ROLE_ONE);

    /* D = rowsum(dO * O), which equals rowsum(P * dP) */
    const int64_t dod_strides[4] = {s->H * s->T * s->D, s->T * s->D, s->H * s->D, 1};
    tensor doo = make_virtual(g, "dO * O", F, s->qkv_dims, dod_strides);
    pointwise(g, "dO * O", CUDNN_POINTWISE_MUL, F, dout, &o, NULL, doo, -1);
    tensor dsum = make_virtual(g, "rowsum(dO * O)", F, s->row_dims, s->row_strides);
    reduction(g, "rowsum(dO * O)", CUDNN_REDUCE_TENSOR_ADD, doo, dsum);
    tensor rowsum = variant & VARIANT_ROWSUM_VIRT
                        ? make_virtual(g, "D", F, s->row_dims, s->row_strides)
                        : make_tensor(g, "D", F, s->row_dims, s->row_strides, 0, ROLE_ROWSUM);
    pointwise(g, "D", CUDNN_POINTWISE_MUL, F, dsum, &one, NULL, rowsum, -1);

    /* P = exp(scale * Q K^T - Stats), masked */
    tensor sc = make_virtual(g, "Q K^T", F, s->s_dims, s->s_strides);
    matmul(g, "Q K^T", q, kt, sc);
    tensor scaled = make_virtual(g, "scaled scores", F, s->s_dims, s->s_strides);
    pointwise(g, "scaled scores", CUDNN_POINTWISE_MUL, F, sc, &scale, NULL, scaled, -1);
    tensor shifted = make_virtual(g, "scores - Stats", F, s->s_dims, s->s_strides);
    if (variant & VARIANT_MASK_FIRST) {
        tensor masked = causal_mask(g, s, scaled, neg_inf, variant);
        pointwise(g, "scores - Stats", CUDNN_POINTWISE_SUB, F, masked, &stats, NULL, shifted, -1);
    } else {
        pointwise(g, "scores - Stats", CUDNN_POINTWISE_SUB, F, scaled, &stats, NULL, shifted, -1);
        shifted = causal_mask(g, s, shifted, neg_inf, variant);
    }
    tensor p = make_virtual(g, "P", F, s->s_dims, s->s_strides);
    pointwise(g, "P", CUDNN_POINTWISE_EXP, F, shifted, NULL, NULL, p, -1);

    /* dV = P^T dO */
    tensor pt = make_virtual(g, "P^T", s->io, s->s_dims, s->st_strides);
    reshape(g, "P^T", p, pt);
    matmul(g, "dV = P^T dO", pt, dout, dv);

    /* dS = P (dO V^T - D) * scale */
    tensor dp = make_virtual(g, "dP = dO V^T", F, s->s_dims, s->s_strides);
    matmul(g, "dP = dO V^T", dout, vt, dp);
    if (variant & VARIANT_DP_TIMES_ONE) {
        tensor dp1 = make_virtual(g, "dP * 1", F, s->s_dims, s->s_strides);
        dp = pointwise(g, "dP * 1", CUDNN_POINTWISE_MUL, F, dp, &one, NULL, dp1, -1);
    }
    tensor centred = make_virtual(g, "dP - D", F, s->s_dims, s->s_strides);
    pointwise(g, "dP - D", CUDNN_POINTWISE_SUB, F, dp, &rowsum, NULL, centred, -1);
    tensor weighted = make_virtual(g, "P (dP - D)", F, s->s_dims, s->s_strides);
    pointwise(g, "P (dP - D)", CUDNN_POINTWISE_MUL, F, centred, &p, NULL, weighted, -1);
    tensor ds = make_virtual(g, "dS", F, s->s_dims, s->s_strides);
    pointwise(g, "dS", CUDNN_POINTWISE_MUL, F, weighted, &scale, NULL, ds, -1);

    /* dK = dS^T Q */
    tensor dst = make_virtual(g, "dS^T", s->io, s->s_dims, s->st_strides);
    reshape(g, "dS^T", ds, dst);
    matmul(g, "dK = dS^T Q", dst, q, dk);

    /* dQ = dS K, summed in f32 in the workspace, then converted */
    tensor k = make_virtual(g, "K", s->io, s->qkv_dims, s->qkv_strides);
    reshape(g, "K", kt, k);
    tensor accum =
        make_tensor(g, "dQ accumulator", F, s->qkv_dims, s->packed_strides,
                    variant & VARIANT_ACCUM_F16x16 ? TENSOR_REORDER_F16x16 : 0, ROLE_ACCUM);
    matmul(g, "dQ = dS K", ds, k, accum);
    pointwise(g, "dQ", CUDNN_POINTWISE_IDENTITY, F, accum, NULL, NULL, dq, -1);
}

/* The global index of the engine a configuration runs, for the log; -1
 * when cuDNN does not say, which costs nothing else. */
static long engine_index_of(cudnnBackendDescriptor_t config) {
    cudnnBackendDescriptor_t engine = NULL;
    int64_t n = 0, index = -1;
    if (gpc_cudnn.CreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) ==
        CUDNN_STATUS_SUCCESS) {
        if (gpc_cudnn.GetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                   &engine) == CUDNN_STATUS_SUCCESS)
            gpc_cudnn.GetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                                   &index);
        gpc_cudnn.DestroyDescriptor(engine);
    }
    return (long)index;
}

/* Heuristics over the finished graph, then execution plans of the engine
 * configurations in the heuristics' order: the first that finalizes, or with
 * all_configs (GPC_CUDNN_TUNE=1) every one that does. Returns how many plans
 * it put in out, each with its engine and workspace size; 0, with g->status
 * saying why, when none finalized. The plans, like every descriptor made
 * here, belong to the graph. what names the graph for the debug log. */
static int build_plan(graph *g, cudnnHandle_t handle, int all_configs, const char *what,
                      candidate out[CUDNN_ATT_MAX_CONFIGS]) {
    cudnnBackendDescriptor_t op_graph = make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "graph");
    set(g, op_graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->num_ops,
        g->ops, "graph");
    set(g, op_graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "graph");
    finalize(g, op_graph, "operation graph");

    cudnnBackendDescriptor_t heur = make(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    set_desc(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, op_graph, "heuristics");
    set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics");
    finalize(g, heur, "heuristics");
    if (g->status != CUDNN_STATUS_SUCCESS) return 0;

    int64_t count = 0;
    cudnnStatus_t status = gpc_cudnn.GetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL);
    if (status != CUDNN_STATUS_SUCCESS) {
        graph_fail(g, status, "heuristics results");
        return 0;
    }
    gpc_log(GPC_LOG_DEBUG,
            "cuDNN attention: %s: the heuristics returned %lld engine configurations (up to %d "
            "are tried)",
            what, (long long)count, CUDNN_ATT_MAX_CONFIGS);
    if (count > CUDNN_ATT_MAX_CONFIGS) count = CUDNN_ATT_MAX_CONFIGS;
    if (count == 0) {
        g->status = CUDNN_STATUS_NOT_SUPPORTED;
        snprintf(g->failure, sizeof g->failure, "heuristics found no engine for the graph");
        return 0;
    }
    cudnnBackendDescriptor_t configs[CUDNN_ATT_MAX_CONFIGS];
    for (int64_t i = 0; i < count; i++)
        configs[i] = make(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine configuration");
    if (g->status != CUDNN_STATUS_SUCCESS) return 0;
    int64_t got = 0;
    status = gpc_cudnn.GetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, configs);
    if (status != CUDNN_STATUS_SUCCESS) {
        graph_fail(g, status, "heuristics results");
        return 0;
    }

    char first_failure[sizeof g->failure] = "";
    cudnnStatus_t first_status = CUDNN_STATUS_NOT_SUPPORTED;
    int found = 0;
    for (int64_t i = 0; i < got; i++) {
        cudnnBackendDescriptor_t plan = make(g, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "plan");
        set(g, plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "plan");
        set_desc(g, plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[i], "plan");
        finalize(g, plan, "execution plan");
        if (g->status == CUDNN_STATUS_SUCCESS) {
            /* a plan that finalized but cannot say its workspace is a broken
             * library rather than an unsuitable engine: the graph fails */
            int64_t bytes = 0, n = 0;
            status = gpc_cudnn.GetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                            CUDNN_TYPE_INT64, 1, &n, &bytes);
            if (status != CUDNN_STATUS_SUCCESS) {
                graph_fail(g, status, "plan workspace size");
                return 0;
            }
            out[found].plan = plan;
            out[found].engine_index = engine_index_of(configs[i]);
            out[found].workspace_bytes = bytes;
            out[found].rank = (int)i + 1;
            found++;
            if (!all_configs) return found;
            continue;
        }
        if (!first_failure[0]) {
            snprintf(first_failure, sizeof first_failure, "%s", g->failure);
            first_status = g->status;
        }
        g->status = CUDNN_STATUS_SUCCESS; /* try the next configuration */
    }
    if (found > 0) return found;
    g->status = first_status;
    snprintf(g->failure, sizeof g->failure, "no engine of %lld finalized; the first: %s",
             (long long)got, first_failure);
    return 0;
}

/* Builds the plan of one key: each variant of the graph in turn. */
void gpc_cudnn_att_plan_build(plan_entry *p, cudnnHandle_t handle) {
    const plan_key *k = &p->key;
    int tune = gpc_cudnn_att_tune_enabled();
    geometry s = geometry_of(k);
    const int *variants = k->backward ? backward_variants : forward_variants;
    int num_variants = k->backward ? (int)(sizeof backward_variants / sizeof(int))
                                   : (int)(sizeof forward_variants / sizeof(int));
    char first[sizeof((graph *)0)->failure] = "";
    cudnnStatus_t first_status = CUDNN_STATUS_SUCCESS;
    for (int i = 0; i < num_variants; i++) {
        graph *g = (graph *)calloc(1, sizeof *g);
        if (!g) {
            p->status = gpc_error(GPC_ERR_NOMEM, "cuDNN attention: out of host memory");
            snprintf(p->why, sizeof p->why, "%s", gpc_last_error());
            return;
        }
        g->next_uid = 100;
        if (k->backward)
            build_backward(g, &s, variants[i]);
        else
            build_forward(g, &s, variants[i]);
        char text[96], what[128];
        snprintf(what, sizeof what, "%s, graph variant %d", shape_text(k, text, sizeof text),
                 variants[i]);
        candidate found[CUDNN_ATT_MAX_CONFIGS];
        int num_found = 0;
        if (g->status == CUDNN_STATUS_SUCCESS) num_found = build_plan(g, handle, tune, what, found);
        if (g->status == CUDNN_STATUS_SUCCESS && num_found > 0) {
            /* the heuristics' first runs until timing picks another, and the
             * workspace has room for the largest candidate */
            int64_t bytes = 0;
            for (int c = 0; c < num_found; c++)
                if (found[c].workspace_bytes > bytes) bytes = found[c].workspace_bytes;
            p->plan = found[0].plan;
            if (num_found > 1) {
                memcpy(p->candidates, found, (size_t)num_found * sizeof found[0]);
                p->num_candidates = num_found;
            }
            memcpy(p->descs, g->descs, (size_t)g->num_descs * sizeof g->descs[0]);
            p->num_descs = g->num_descs;
            memcpy(p->uids, g->uids, (size_t)g->num_tensors * sizeof g->uids[0]);
            memcpy(p->roles, g->roles, (size_t)g->num_tensors * sizeof g->roles[0]);
            p->num_tensors = g->num_tensors;
            p->engine_bytes = bytes;
            p->engine_index = found[0].engine_index;
            p->variant = variants[i];
            size_t at = align_up((size_t)bytes);
            p->accum_offset = p->rowsum_offset = 0;
            if (k->backward) {
                p->accum_offset = at;
                at += align_up((size_t)(s.B * s.H * s.T * s.D) * sizeof(float));
                p->rowsum_offset = at;
                if (!(variants[i] & VARIANT_ROWSUM_VIRT))
                    at += align_up((size_t)(s.B * s.H * s.T) * sizeof(float));
            }
            p->total_bytes = at;
            p->status = GPC_OK;
            free(g);
            return;
        }
        if (!first[0]) {
            snprintf(first, sizeof first, "%s", g->failure);
            first_status = g->status;
        }
        gpc_log(GPC_LOG_DEBUG, "cuDNN attention: %s: %s", what, g->failure);
        graph_release(g);
        free(g);
    }
    char text[96];
    p->status =
        gpc_cudnn_failure(first_status, "no plan for %s (%d graph variants tried; the first: %s)",
                          shape_text(k, text, sizeof text), num_variants, first);
    snprintf(p->why, sizeof p->why, "%s", gpc_last_error());
}
