/*
 * attention_cudnn.cu: causal multi-head attention through cuDNN's fused
 * flash-attention engines, the CUDA backend's second attention path beside
 * gpc's own kernels (attention.cu chooses; attention_cudnn.h is the API).
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
 *
 * Plans are built once per (GPU, B, T, NH, hs, dtype, direction) and cached
 * for the life of the process, failures included, so a shape cuDNN cannot
 * run is asked about once. Building also sizes the GPU's one workspace
 * (forward and backward run one after the other on one stream, so they
 * share it): the engine's scratch, then the backward's f32 dQ accumulator
 * and the row sums D. The model builds its plans at setup through
 * gpc_op_attention_prepare, so the training step allocates nothing.
 *
 * A plan is the first of cuDNN's heuristic (mode A) engine configurations
 * whose execution plan finalizes. With GPC_CUDNN_TUNE=1 every configuration
 * that finalizes is kept as a candidate (the workspace sized for the
 * largest), and the first call of the shape and direction, when the real
 * tensors are known, times each on the current stream with CUDA events (one
 * warm-up run, then CUDNN_ATT_TUNE_RUNS), keeps the fastest median, destroys
 * the others and logs the times. GPC_CUDNN_TUNE=energy instead runs each
 * candidate back to back for a second and keeps the one of the least energy
 * a run (NVML's counter; the least time a run when there is no counter): the
 * training step runs at the GPU's power limit, where a short timing at full
 * clock ranks candidates by the wrong measure. Repeating a run is harmless: the forward
 * writes O and Stats, the backward writes dQ, dK and dV (none is added to),
 * and the backward's f32 dQ accumulator starts from zero in every run.
 *
 * The library is opened with dlopen("libcudnn.so.9") on first use and only
 * the dozen functions below are looked up, so the binary needs no cuDNN to
 * start. Every cuDNN failure becomes a gpc_error carrying
 * cudnnGetErrorString and cudnnGetLastErrorString; with CUDNN_LOGERR_DBG=1
 * CUDNN_LOGDEST_DBG=stderr cuDNN also explains why it rejects a graph.
 */
#include "cuda/attention_cudnn.h"
#include "cuda/cuda_common.cuh"
#include "gpc/nvml.h"

#include <cudnn.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if CUDNN_MAJOR != 9
#error "gpc's cuDNN attention is written against cuDNN 9's backend API"
#endif

#define CUDNN_ATT_MAX_PLANS 64
#define CUDNN_ATT_MAX_PACKS 128  /* variant packs kept per plan: one per layer's tensors */
#define CUDNN_ATT_MAX_CONFIGS 8  /* engine configurations tried per graph */
#define CUDNN_ATT_MAX_DESCS 160  /* descriptors of one graph (the backward: about 90) */
#define CUDNN_ATT_MAX_OPS 40     /* operations of one graph (the backward: 22) */
#define CUDNN_ATT_MAX_TENSORS 16 /* tensors the caller provides (the variant pack) */
#define CUDNN_ATT_TUNE_RUNS 3    /* timed runs of each candidate with GPC_CUDNN_TUNE=1 */
#define CUDNN_ATT_ENERGY_S 1.0   /* GPC_CUDNN_TUNE=energy: seconds each candidate is measured */
#define CUDNN_ATT_ALIGN 256

/* ------------------------------------------------------------ the library */

static struct {
    void *lib;
    decltype(&cudnnGetVersion) GetVersion;
    decltype(&cudnnGetErrorString) GetErrorString;
    decltype(&cudnnGetLastErrorString) GetLastErrorString;
    decltype(&cudnnCreate) Create;
    decltype(&cudnnSetStream) SetStream;
    decltype(&cudnnBackendCreateDescriptor) CreateDescriptor;
    decltype(&cudnnBackendDestroyDescriptor) DestroyDescriptor;
    decltype(&cudnnBackendSetAttribute) SetAttribute;
    decltype(&cudnnBackendGetAttribute) GetAttribute;
    decltype(&cudnnBackendFinalize) Finalize;
    decltype(&cudnnBackendExecute) Execute;
    long version;
} api;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_failure[512]; /* empty when the library loaded */

static void load_library(void) {
    const char *names[] = {"libcudnn.so.9", "libcudnn.so"};
    char first_error[256] = "";
    for (int i = 0; i < 2 && !api.lib; i++) {
        api.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!api.lib && i == 0) {
            const char *e = dlerror();
            snprintf(first_error, sizeof first_error, "%s", e ? e : "not found");
        }
    }
    if (!api.lib) {
        snprintf(load_failure, sizeof load_failure,
                 "cuDNN is not installed here (dlopen libcudnn.so.9: %s); install cuDNN 9 "
                 "(Debian/Ubuntu: libcudnn9-cuda-12 or -13) or add its folder to "
                 "LD_LIBRARY_PATH, or use GPC_ATTENTION=gpc",
                 first_error);
        return;
    }
#define CUDNN_ATT_SYM(field, name)                                                                 \
    api.field = (decltype(api.field))dlsym(api.lib, #name);                                        \
    if (!api.field) {                                                                              \
        snprintf(load_failure, sizeof load_failure,                                                \
                 "the cuDNN library found lacks %s (not cuDNN 9?); install cuDNN 9 or use "        \
                 "GPC_ATTENTION=gpc",                                                              \
                 #name);                                                                           \
        return;                                                                                    \
    }
    CUDNN_ATT_SYM(GetVersion, cudnnGetVersion);
    CUDNN_ATT_SYM(GetErrorString, cudnnGetErrorString);
    CUDNN_ATT_SYM(GetLastErrorString, cudnnGetLastErrorString);
    CUDNN_ATT_SYM(Create, cudnnCreate);
    CUDNN_ATT_SYM(SetStream, cudnnSetStream);
    CUDNN_ATT_SYM(CreateDescriptor, cudnnBackendCreateDescriptor);
    CUDNN_ATT_SYM(DestroyDescriptor, cudnnBackendDestroyDescriptor);
    CUDNN_ATT_SYM(SetAttribute, cudnnBackendSetAttribute);
    CUDNN_ATT_SYM(GetAttribute, cudnnBackendGetAttribute);
    CUDNN_ATT_SYM(Finalize, cudnnBackendFinalize);
    CUDNN_ATT_SYM(Execute, cudnnBackendExecute);
#undef CUDNN_ATT_SYM
    long version = (long)api.GetVersion();
    if (version / 10000 != CUDNN_MAJOR) {
        snprintf(load_failure, sizeof load_failure,
                 "the cuDNN library found is version %ld.%ld; gpc was built for cuDNN %d; "
                 "install cuDNN %d or use GPC_ATTENTION=gpc",
                 version / 10000, version / 100 % 100, CUDNN_MAJOR, CUDNN_MAJOR);
        return;
    }
    api.version = version;
}

/* A cuDNN failure as a gpc status: the call, cuDNN's name for the status and
 * its own last message. */
static gpc_status cudnn_failure(cudnnStatus_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static gpc_status cudnn_failure(cudnnStatus_t status, const char *fmt, ...) {
    char what[256], last[512] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    api.GetLastErrorString(last, sizeof last);
    int category = (int)status / 1000 * 1000;
    gpc_status code = category == CUDNN_STATUS_NOT_SUPPORTED ? GPC_ERR_UNSUPPORTED
                      : status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
                              status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED
                          ? GPC_ERR_NOMEM
                          : GPC_ERR_DEVICE;
    return gpc_error(code, "cuDNN attention: %s: %s%s%s", what, api.GetErrorString(status),
                     last[0] ? "; cuDNN says: " : "", last);
}

/* ------------------------------------------------------------ shared state
 *
 * One lock guards the handles, the workspaces and the plan cache. Calls are
 * short (a lookup and an asynchronous launch); building a plan holds it for
 * as long as cuDNN takes, which happens once per shape. */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static cudnnHandle_t handles[GPC_CUDA_MAX_DEVICES];
static void *workspace[GPC_CUDA_MAX_DEVICES];
static size_t workspace_bytes[GPC_CUDA_MAX_DEVICES];

typedef struct {
    int device, B, T, NH, hs, backward;
    gpc_dtype dtype;
} plan_key;

/* What each tensor of a graph's variant pack is, so one execution fills the
 * pointers without knowing which variant of the graph was built. */
typedef enum {
    ROLE_Q,
    ROLE_K,
    ROLE_V,
    ROLE_O,
    ROLE_STATS,
    ROLE_DO,
    ROLE_DQ,
    ROLE_DK,
    ROLE_DV,
    ROLE_SCALE,
    ROLE_NEG_INF,
    ROLE_ONE,
    ROLE_ACCUM, /* f32 dQ accumulator, in the workspace */
    ROLE_ROWSUM /* D = rowsum(dO * O), in the workspace */
} tensor_role;

typedef struct {
    const void *key[6]; /* the caller's tensors, then the workspace it was made for */
    cudnnBackendDescriptor_t pack;
} pack_entry;

/* An execution plan that finalized, with what it needs to be kept or timed. */
typedef struct {
    cudnnBackendDescriptor_t plan;
    long engine_index;       /* cuDNN's global index of the engine, -1 if unknown */
    int rank;                /* its place in the heuristics' order, from 1 */
    int64_t workspace_bytes; /* the engine's own workspace */
} candidate;

typedef struct {
    plan_key key;
    gpc_status status; /* GPC_OK, or why cuDNN cannot run this shape */
    char why[1024];
    cudnnBackendDescriptor_t plan;
    /* GPC_CUDNN_TUNE=1: the plans still to time at the first execution, plan
     * among them (the heuristics' first); 0 when there is nothing to time */
    candidate candidates[CUDNN_ATT_MAX_CONFIGS];
    int num_candidates;
    cudnnBackendDescriptor_t descs[CUDNN_ATT_MAX_DESCS]; /* what the plan was built from */
    int num_descs;
    int64_t uids[CUDNN_ATT_MAX_TENSORS];
    tensor_role roles[CUDNN_ATT_MAX_TENSORS];
    int num_tensors;
    int64_t engine_bytes; /* the engine's own workspace (the largest of the candidates') */
    size_t accum_offset, rowsum_offset, total_bytes;
    long engine_index;
    int variant;
    float scale, neg_inf, one; /* by-value scalars: read from host memory at execution */
    pack_entry packs[CUDNN_ATT_MAX_PACKS];
    int num_packs, next_pack;
} plan_entry;

static plan_entry *plans[CUDNN_ATT_MAX_PLANS];
static int num_plans;

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
    api.GetLastErrorString(last, sizeof last);
    g->status = status;
    snprintf(g->failure, sizeof g->failure, "%s: %s%s%s", what, api.GetErrorString(status),
             last[0] ? "; cuDNN says: " : "", last);
}

static void graph_release(graph *g) {
    for (int i = g->num_descs - 1; i >= 0; i--)
        api.DestroyDescriptor(g->descs[i]);
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
    cudnnStatus_t status = api.CreateDescriptor(type, &d);
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
    cudnnStatus_t status = api.SetAttribute(d, name, type, count, values);
    if (status != CUDNN_STATUS_SUCCESS) graph_fail(g, status, what);
}

static void finalize(graph *g, cudnnBackendDescriptor_t d, const char *what) {
    if (g->status != CUDNN_STATUS_SUCCESS) return;
    cudnnStatus_t status = api.Finalize(d);
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
    if (api.CreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) == CUDNN_STATUS_SUCCESS) {
        if (api.GetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                             &n, &engine) == CUDNN_STATUS_SUCCESS)
            api.GetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                             &index);
        api.DestroyDescriptor(engine);
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
    cudnnStatus_t status = api.GetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
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
    status = api.GetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                              count, &got, configs);
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
            status = api.GetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
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

/* ------------------------------------------------------------ the cache */

static gpc_status device_of_caller(int *device) {
    int d = 0;
    GPC_CUDA_CHECK(cudaGetDevice(&d));
    if (d < 0 || d >= GPC_CUDA_MAX_DEVICES)
        return gpc_error(GPC_ERR_UNSUPPORTED, "cuDNN attention: GPU index %d out of range", d);
    *device = d;
    return GPC_OK;
}

/* The library and this GPU's handle. Holds the lock. */
static gpc_status handle_for(int device, cudnnHandle_t *out) {
    pthread_once(&load_once, load_library);
    if (load_failure[0]) return gpc_error(GPC_ERR_UNSUPPORTED, "%s", load_failure);
    if (!handles[device]) {
        cudnnStatus_t status = api.Create(&handles[device]);
        if (status != CUDNN_STATUS_SUCCESS) {
            handles[device] = NULL;
            return cudnn_failure(status, "cudnnCreate on cuda:%d", device);
        }
    }
    *out = handles[device];
    return GPC_OK;
}

static gpc_status workspace_reserve(int device, size_t bytes) {
    if (workspace_bytes[device] >= bytes) return GPC_OK;
    /* cudaFree waits for work still using the old buffer; this runs when a
     * plan is built, at setup or a new shape's first call, never per step */
    if (workspace[device]) cudaFree(workspace[device]);
    workspace[device] = NULL;
    workspace_bytes[device] = 0;
    cudaError_t err = cudaMalloc(&workspace[device], bytes);
    if (err != cudaSuccess) {
        cudaGetLastError();
        workspace[device] = NULL;
        return gpc_error(GPC_ERR_NOMEM,
                         "cuDNN attention: no room for %.1f MiB of workspace on cuda:%d; lower "
                         "--batch or use GPC_ATTENTION=gpc (gpc's kernels need almost none)",
                         bytes / 1048576.0, device);
    }
    workspace_bytes[device] = bytes;
    return GPC_OK;
}

static const char *shape_text(const plan_key *k, char *buf, size_t size) {
    snprintf(buf, size, "%s B=%d T=%d NH=%d hs=%d %s", k->backward ? "backward" : "forward", k->B,
             k->T, k->NH, k->hs, gpc_dtype_name(k->dtype));
    return buf;
}

/* GPC_CUDNN_TUNE=1 (or =energy): keep every engine configuration that
 * finalizes and time them at the first execution. */
static int tune_enabled(void) {
    const char *e = gpc_setting_str("GPC_CUDNN_TUNE");
    return e && (strcmp(e, "1") == 0 || strcmp(e, "energy") == 0);
}

/* GPC_CUDNN_TUNE=energy: compare the candidates by their energy a run at the
 * power limit instead of by a few short timings (tune_energy). */
static int tune_by_energy(void) {
    const char *e = gpc_setting_str("GPC_CUDNN_TUNE");
    return e && strcmp(e, "energy") == 0;
}

/* Builds the plan of one key: each variant of the graph in turn. */
static void plan_build(plan_entry *p, cudnnHandle_t handle) {
    const plan_key *k = &p->key;
    int tune = tune_enabled();
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
        cudnn_failure(first_status, "no plan for %s (%d graph variants tried; the first: %s)",
                      shape_text(k, text, sizeof text), num_variants, first);
    snprintf(p->why, sizeof p->why, "%s", gpc_last_error());
}

static int key_equal(const plan_key *a, const plan_key *b) {
    return a->device == b->device && a->B == b->B && a->T == b->T && a->NH == b->NH &&
           a->hs == b->hs && a->backward == b->backward && a->dtype == b->dtype;
}

/* The cached plan of key, built when missing. Holds the lock. */
static gpc_status plan_get(const plan_key *key, plan_entry **out) {
    cudnnHandle_t handle = NULL;
    GPC_TRY(handle_for(key->device, &handle));
    for (int i = 0; i < num_plans; i++)
        if (key_equal(&plans[i]->key, key)) {
            *out = plans[i];
            if (plans[i]->status != GPC_OK) return gpc_error(plans[i]->status, "%s", plans[i]->why);
            return GPC_OK;
        }
    if (num_plans == CUDNN_ATT_MAX_PLANS)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "cuDNN attention: more than %d attention shapes in one process; use "
                         "GPC_ATTENTION=gpc",
                         CUDNN_ATT_MAX_PLANS);
    plan_entry *p = (plan_entry *)calloc(1, sizeof *p);
    if (!p) return gpc_error(GPC_ERR_NOMEM, "cuDNN attention: out of host memory");
    p->key = *key;
    p->scale = 1.0f / sqrtf((float)key->hs);
    /* cuDNN before 9.10 preferred the lowest float to -inf as the mask value
     * (cudnn-frontend's get_negative_inf_value) */
    p->neg_inf = api.version >= 91000 ? -INFINITY : -FLT_MAX;
    p->one = 1.0f;
    plan_build(p, handle);
    plans[num_plans++] = p;
    *out = p;
    if (p->status != GPC_OK) return gpc_error(p->status, "%s", p->why);
    gpc_status s = workspace_reserve(key->device, p->total_bytes);
    if (s != GPC_OK) return s;
    char text[96];
    if (p->num_candidates > 1)
        gpc_log(GPC_LOG_INFO,
                "cuDNN %ld.%ld attention %s on cuda:%d: %d engine candidates to time at the "
                "first call (GPC_CUDNN_TUNE=1), workspace %.1f MiB (the GPU's attention "
                "workspace is %.1f MiB)",
                api.version / 10000, api.version / 100 % 100, shape_text(key, text, sizeof text),
                key->device, p->num_candidates, p->total_bytes / 1048576.0,
                workspace_bytes[key->device] / 1048576.0);
    else
        gpc_log(GPC_LOG_INFO,
                "cuDNN %ld.%ld attention %s on cuda:%d: engine %ld, workspace %.1f MiB (the "
                "GPU's attention workspace is %.1f MiB)",
                api.version / 10000, api.version / 100 % 100, shape_text(key, text, sizeof text),
                key->device, p->engine_index, p->total_bytes / 1048576.0,
                workspace_bytes[key->device] / 1048576.0);
    return GPC_OK;
}

/* The variant pack for these tensors: cached per plan, since a model calls
 * one plan with each layer's tensors and the pointers repeat every step. */
static gpc_status pack_for(plan_entry *p, const void *const key[6], void *const by_role[14],
                           cudnnBackendDescriptor_t *out) {
    for (int i = 0; i < p->num_packs; i++)
        if (!memcmp(p->packs[i].key, key, sizeof p->packs[i].key)) {
            *out = p->packs[i].pack;
            return GPC_OK;
        }
    void *ptrs[CUDNN_ATT_MAX_TENSORS];
    for (int i = 0; i < p->num_tensors; i++)
        ptrs[i] = by_role[p->roles[i]];
    void *ws = (void *)key[5];
    cudnnBackendDescriptor_t pack = NULL;
    cudnnStatus_t st = api.CreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (st == CUDNN_STATUS_SUCCESS)
        st = api.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                              p->num_tensors, p->uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = api.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                              p->num_tensors, ptrs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = api.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    if (st == CUDNN_STATUS_SUCCESS) st = api.Finalize(pack);
    if (st != CUDNN_STATUS_SUCCESS) {
        if (pack) api.DestroyDescriptor(pack);
        return cudnn_failure(st, "variant pack");
    }
    pack_entry *slot;
    if (p->num_packs < CUDNN_ATT_MAX_PACKS) {
        slot = &p->packs[p->num_packs++];
    } else {
        slot = &p->packs[p->next_pack];
        p->next_pack = (p->next_pack + 1) % CUDNN_ATT_MAX_PACKS;
        api.DestroyDescriptor(slot->pack);
    }
    memcpy(slot->key, key, sizeof slot->key);
    slot->pack = pack;
    *out = pack;
    return GPC_OK;
}

/* One run of a plan on the handle's stream, after zeroing the backward's dQ
 * accumulator where this cuDNN needs it. */
static gpc_status run_plan(const plan_entry *p, cudnnBackendDescriptor_t plan,
                           cudnnBackendDescriptor_t pack, cudaStream_t stream) {
    int device = p->key.device;
    if (p->key.backward && api.version < 90600) {
        /* before cuDNN 9.6 the engine expected a zeroed dQ accumulator */
        size_t bytes = (size_t)p->key.B * p->key.NH * p->key.T * p->key.hs * sizeof(float);
        GPC_CUDA_CHECK(
            cudaMemsetAsync((char *)workspace[device] + p->accum_offset, 0, bytes, stream));
    }
    cudnnStatus_t st = api.Execute(handles[device], plan, pack);
    if (st != CUDNN_STATUS_SUCCESS) {
        char text[96];
        return cudnn_failure(st, "running %s", shape_text(&p->key, text, sizeof text));
    }
    return GPC_OK;
}

/* Destroys one of a plan entry's descriptors and drops it from the list. */
static void drop_descriptor(plan_entry *p, cudnnBackendDescriptor_t d) {
    for (int i = 0; i < p->num_descs; i++)
        if (p->descs[i] == d) {
            api.DestroyDescriptor(d);
            memmove(&p->descs[i], &p->descs[i + 1],
                    (size_t)(p->num_descs - i - 1) * sizeof p->descs[0]);
            p->num_descs--;
            return;
        }
}

/* GPC_CUDNN_TUNE=energy: NVML, opened at the first use and kept, and the
 * index of `device` in it; -1 when NVML cannot read it (energy_run then
 * measures time alone). Plans run, and are tuned, under `lock`, one at a time. */
static gpc_nvml *energy_nvml;

static int energy_index(int device) {
    static int index[GPC_CUDA_MAX_DEVICES], looked[GPC_CUDA_MAX_DEVICES];
    if (device < 0 || device >= GPC_CUDA_MAX_DEVICES) return -1;
    if (!looked[device]) {
        char bus[32];
        looked[device] = 1;
        index[device] = -1;
        if ((energy_nvml || gpc_nvml_open(&energy_nvml) == GPC_OK) &&
            cudaDeviceGetPCIBusId(bus, (int)sizeof bus, device) == cudaSuccess &&
            gpc_nvml_find_bus_id(energy_nvml, bus, &index[device]) != GPC_OK)
            index[device] = -1;
        cudaGetLastError();
        gpc_clear_error();
    }
    return index[device];
}

/* NVML's energy counter of the GPU at `index`, joules; -1 when unknown. */
static double energy_now(int index) {
    gpc_nvml_power power;
    if (index < 0 || !energy_nvml || gpc_nvml_sample_power(energy_nvml, index, &power) != GPC_OK) {
        gpc_clear_error();
        return -1;
    }
    return power.energy_j;
}

/* Seconds each candidate is measured with GPC_CUDNN_TUNE=energy:
 * GPC_CUDNN_TUNE_ENERGY_S (0.01 to 60; tests take a short one), else
 * CUDNN_ATT_ENERGY_S. */
static double energy_seconds(void) {
    static double seconds;
    if (seconds == 0) {
        const char *e = gpc_setting_str("GPC_CUDNN_TUNE_ENERGY_S");
        char *end = NULL;
        double v = e && *e ? strtod(e, &end) : CUDNN_ATT_ENERGY_S;
        if (e && *e && (*end || !(v >= 0.01 && v <= 60))) {
            gpc_log(GPC_LOG_WARN, "GPC_CUDNN_TUNE_ENERGY_S=%s is not 0.01 to 60 seconds: using %g",
                    e, CUDNN_ATT_ENERGY_S);
            v = CUDNN_ATT_ENERGY_S;
        }
        seconds = v;
    }
    return seconds;
}

/* Runs plan back to back, a quarter of energy_seconds() so that the clock
 * settles where the candidate's power puts it, then energy_seconds() measured: *ms
 * gets the time a run and *mj its energy from NVML's counter (-1 when the
 * counter cannot be read). At the power limit, where the training step runs,
 * a run's time follows its energy; a short timing at full clock does not. */
static gpc_status energy_run(const plan_entry *p, cudnnBackendDescriptor_t plan,
                             cudnnBackendDescriptor_t pack, cudaStream_t stream, int index,
                             float *ms, float *mj) {
    double e0 = -1, t0 = 0;
    long runs = 0, batch = 1;
    for (int phase = 0; phase < 2; phase++) {
        double start = gpc_time_seconds(),
               length = phase ? energy_seconds() : 0.25 * energy_seconds();
        if (phase) e0 = energy_now(index), t0 = start, runs = 0;
        do { /* at least one batch a phase */
            double b0 = gpc_time_seconds();
            for (long r = 0; r < batch; r++)
                GPC_TRY(run_plan(p, plan, pack, stream));
            GPC_CUDA_CHECK(cudaStreamSynchronize(stream));
            runs += batch;
            /* batches of 10 ms or more keep the queue full between the waits */
            double took = gpc_time_seconds() - b0;
            if (took < 0.01 && batch < (1L << 20)) batch *= 2;
        } while (gpc_time_seconds() - start < length);
    }
    double seconds = gpc_time_seconds() - t0, e1 = energy_now(index);
    *ms = (float)(seconds * 1e3 / (double)runs);
    *mj = e0 >= 0 && e1 > e0 ? (float)((e1 - e0) * 1e3 / (double)runs) : -1.0f;
    return GPC_OK;
}

/* GPC_CUDNN_TUNE=1, at a plan's first execution: times each candidate with
 * the call's own tensors on stream (one warm-up run, then
 * CUDNN_ATT_TUNE_RUNS runs, each between two events), keeps the one of the
 * lowest median as p->plan, destroys the other plans and logs the times.
 * The timed runs include run_plan's zeroing of the dQ accumulator where
 * there is one, the same for every candidate. A candidate that fails to run
 * is left out; when all fail, the heuristics' first stays and the run that
 * follows reports its error. Waiting for the events is a host-device
 * synchronisation inside the step, which this opt-in pays once per shape and
 * direction. A CUDA failure of the timing itself is returned, and the
 * candidates stay for the next call. */
static gpc_status tune(plan_entry *p, cudnnBackendDescriptor_t pack, cudaStream_t stream) {
    const int runs = CUDNN_ATT_TUNE_RUNS;
    cudaEvent_t events[CUDNN_ATT_TUNE_RUNS + 1] = {0};
    float median[CUDNN_ATT_MAX_CONFIGS], mean[CUDNN_ATT_MAX_CONFIGS];
    int ran[CUDNN_ATT_MAX_CONFIGS] = {0};
    char text[96];
    shape_text(&p->key, text, sizeof text);
    cudaError_t err = cudaSuccess;
    for (int e = 0; e <= runs && err == cudaSuccess; e++)
        err = cudaEventCreate(&events[e]);
    const int by_energy = tune_by_energy();
    const int index = by_energy ? energy_index(p->key.device) : -1;
    /* why energies were not compared, when they were not */
    const char *by_time =
        index < 0 ? "ms a run, no energy counter" : "ms a run, the energy counter did not move";
    int measured_energy = by_energy;
    for (int c = 0; by_energy && c < p->num_candidates && err == cudaSuccess; c++) {
        /* energy a run (or, without NVML's counter, the time a run) back to
         * back: median[] holds what is compared, mean[] the time */
        cudnnBackendDescriptor_t plan = p->candidates[c].plan;
        float ms = 0.0f, mj = 0.0f;
        if (energy_run(p, plan, pack, stream, index, &ms, &mj) != GPC_OK) {
            gpc_log(GPC_LOG_DEBUG, "cuDNN attention: %s: engine %ld left out: %s", text,
                    p->candidates[c].engine_index, gpc_last_error());
            cudaGetLastError(); /* a failed launch's error is this candidate's alone */
            err = cudaStreamSynchronize(stream);
            continue;
        }
        if (mj < 0) measured_energy = 0;
        median[c] = mj >= 0 ? mj : ms, mean[c] = ms, ran[c] = 1;
    }
    for (int c = 0; !by_energy && c < p->num_candidates && err == cudaSuccess; c++) {
        cudnnBackendDescriptor_t plan = p->candidates[c].plan;
        int ok = run_plan(p, plan, pack, stream) == GPC_OK; /* the warm-up */
        for (int r = 0; ok && r <= runs && err == cudaSuccess; r++) {
            err = cudaEventRecord(events[r], stream);
            if (r < runs && err == cudaSuccess) ok = run_plan(p, plan, pack, stream) == GPC_OK;
        }
        if (ok && err == cudaSuccess) err = cudaEventSynchronize(events[runs]);
        if (err != cudaSuccess) break;
        if (!ok) {
            gpc_log(GPC_LOG_DEBUG, "cuDNN attention: %s: engine %ld left out: %s", text,
                    p->candidates[c].engine_index, gpc_last_error());
            cudaGetLastError(); /* a failed launch's error is this candidate's alone */
            continue;
        }
        float ms[CUDNN_ATT_TUNE_RUNS], sum = 0.0f;
        for (int r = 0; r < runs && err == cudaSuccess; r++) {
            err = cudaEventElapsedTime(&ms[r], events[r], events[r + 1]);
            if (err == cudaSuccess) sum += ms[r];
        }
        if (err != cudaSuccess) break;
        for (int r = 1; r < runs; r++) /* insertion sort, for the median */
            for (int q = r; q > 0 && ms[q] < ms[q - 1]; q--) {
                float t = ms[q];
                ms[q] = ms[q - 1], ms[q - 1] = t;
            }
        median[c] = ms[runs / 2], mean[c] = sum / runs, ran[c] = 1;
    }
    for (int e = 0; e <= runs; e++)
        if (events[e]) cudaEventDestroy(events[e]);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return gpc_error(err == cudaErrorMemoryAllocation ? GPC_ERR_NOMEM : GPC_ERR_DEVICE,
                         "cuDNN attention: timing the engines of %s (GPC_CUDNN_TUNE=1): %s; "
                         "unset GPC_CUDNN_TUNE to run the heuristics' first engine untimed",
                         text, cudaGetErrorString(err));
    }

    if (by_energy && !measured_energy) /* a mix of energies and times cannot be compared */
        for (int c = 0; c < p->num_candidates; c++)
            if (ran[c]) median[c] = mean[c];
    int best = 0, any = 0;
    for (int c = 0; c < p->num_candidates; c++)
        if (ran[c] && (!any || median[c] < median[best])) best = c, any = 1;
    char line[1024];
    size_t at =
        by_energy
            ? (size_t)snprintf(line, sizeof line,
                               "cuDNN attention %s on cuda:%d: %d engine candidates, each run "
                               "back to back %.2g s (heuristics' rank: engine, %s):",
                               text, p->key.device, p->num_candidates, energy_seconds(),
                               measured_energy ? "mJ/ms a run" : by_time)
            : (size_t)snprintf(line, sizeof line,
                               "cuDNN attention %s on cuda:%d: %d engine candidates "
                               "(heuristics' rank: engine, median/mean of %d runs):",
                               text, p->key.device, p->num_candidates, runs);
    for (int c = 0; c < p->num_candidates && at < sizeof line; c++) {
        const char *sep = c + 1 < p->num_candidates ? "," : ";";
        if (ran[c] && by_energy && measured_energy)
            at += (size_t)snprintf(line + at, sizeof line - at, " %d: engine %ld %.3f mJ %.4f ms%s",
                                   p->candidates[c].rank, p->candidates[c].engine_index, median[c],
                                   mean[c], sep);
        else if (ran[c] && by_energy)
            at += (size_t)snprintf(line + at, sizeof line - at, " %d: engine %ld %.4f ms%s",
                                   p->candidates[c].rank, p->candidates[c].engine_index, mean[c],
                                   sep);
        else if (ran[c])
            at += (size_t)snprintf(line + at, sizeof line - at, " %d: engine %ld %.3f/%.3f ms%s",
                                   p->candidates[c].rank, p->candidates[c].engine_index, median[c],
                                   mean[c], sep);
        else
            at += (size_t)snprintf(line + at, sizeof line - at, " %d: engine %ld failed to run%s",
                                   p->candidates[c].rank, p->candidates[c].engine_index, sep);
    }
    gpc_log(GPC_LOG_INFO, "%s %s %d (engine %ld)", line,
            any ? "picked" : "none ran; keeping the heuristics' first,", p->candidates[best].rank,
            p->candidates[best].engine_index);
    for (int c = 0; c < p->num_candidates; c++)
        if (c != best) drop_descriptor(p, p->candidates[c].plan);
    p->plan = p->candidates[best].plan;
    p->engine_index = p->candidates[best].engine_index;
    p->num_candidates = 0;
    return GPC_OK;
}

static gpc_status execute(plan_entry *p, const void *const key[6], void *by_role[14]) {
    int device = p->key.device;
    char *ws = (char *)workspace[device];
    by_role[ROLE_SCALE] = &p->scale;
    by_role[ROLE_NEG_INF] = &p->neg_inf;
    by_role[ROLE_ONE] = &p->one;
    by_role[ROLE_ACCUM] = ws + p->accum_offset;
    by_role[ROLE_ROWSUM] = ws + p->rowsum_offset;
    cudnnBackendDescriptor_t pack = NULL;
    GPC_TRY(pack_for(p, key, by_role, &pack));
    cudaStream_t stream = gpc_cuda_stream();
    cudnnStatus_t st = api.SetStream(handles[device], stream);
    if (st != CUDNN_STATUS_SUCCESS) return cudnn_failure(st, "cudnnSetStream");
    /* the timing's runs write the call's outputs; the run below writes them
     * again with the plan kept */
    if (p->num_candidates > 1) GPC_TRY(tune(p, pack, stream));
    return run_plan(p, p->plan, pack, stream);
}

/* ------------------------------------------------------------ public API */

extern "C" int gpc_cudnn_attention_built(void) {
    return 1;
}

extern "C" gpc_status gpc_cudnn_attention_load(void) {
    int device;
    GPC_TRY(device_of_caller(&device));
    cudnnHandle_t handle = NULL;
    pthread_mutex_lock(&lock);
    gpc_status s = handle_for(device, &handle);
    pthread_mutex_unlock(&lock);
    return s;
}

extern "C" long gpc_cudnn_attention_version(void) {
    return api.version;
}

/* The head sizes and dtypes cuDNN's fused engines take. */
static gpc_status check_shape(const char *op, int T, int hs, gpc_dtype dtype) {
    if (dtype != GPC_BF16 && dtype != GPC_F16)
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "%s: cuDNN's attention runs bf16 or fp16, not %s; use --precision bf16 "
                         "or GPC_ATTENTION=gpc",
                         op, gpc_dtype_name(dtype));
    if (!gpc_attention_cudnn_head_size_ok(hs))
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "%s: cuDNN's attention needs a head size that is a multiple of 8 up to "
                         "128, not %d; use GPC_ATTENTION=gpc",
                         op, hs);
    if (T < 1) return gpc_error(GPC_ERR_INVALID_ARG, "%s: empty sequence", op);
    return GPC_OK;
}

extern "C" gpc_status gpc_cudnn_attention_prepare(int B, int T, int NH, int hs, gpc_dtype dtype,
                                                  int which) {
    GPC_TRY(check_shape("attention", T, hs, dtype));
    plan_key key;
    memset(&key, 0, sizeof key);
    GPC_TRY(device_of_caller(&key.device));
    key.B = B, key.T = T, key.NH = NH, key.hs = hs, key.dtype = dtype;
    pthread_mutex_lock(&lock);
    plan_entry *p;
    gpc_status s = GPC_OK;
    if (which & GPC_CUDNN_FORWARD) s = plan_get(&key, &p);
    if (s == GPC_OK && (which & GPC_CUDNN_BACKWARD)) {
        key.backward = 1;
        s = plan_get(&key, &p);
    }
    pthread_mutex_unlock(&lock);
    return s;
}

extern "C" int gpc_cudnn_attention_ready(int B, int T, int NH, int hs, gpc_dtype dtype, int which) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= GPC_CUDA_MAX_DEVICES) {
        cudaGetLastError();
        return 0;
    }
    plan_key key;
    memset(&key, 0, sizeof key);
    key.device = device, key.B = B, key.T = T, key.NH = NH, key.hs = hs, key.dtype = dtype;
    int found = 0, wanted = 0;
    pthread_mutex_lock(&lock);
    for (int backward = 0; backward < 2; backward++) {
        if (!(which & (backward ? GPC_CUDNN_BACKWARD : GPC_CUDNN_FORWARD))) continue;
        wanted++;
        key.backward = backward;
        for (int i = 0; i < num_plans; i++)
            if (key_equal(&plans[i]->key, &key) && plans[i]->status == GPC_OK) found++;
    }
    pthread_mutex_unlock(&lock);
    return wanted > 0 && found == wanted;
}

static gpc_status check_aligned(const char *op, const gpc_tensor *const *ts, int n, int C) {
    for (int i = 0; i < n; i++)
        if (!gpc_cuda_aligned16(ts[i]->data))
            return gpc_error(GPC_ERR_UNSUPPORTED,
                             "%s: cuDNN's attention needs 16-byte aligned tensors; use "
                             "GPC_ATTENTION=gpc",
                             op);
    if (C % 8 != 0)
        return gpc_error(GPC_ERR_UNSUPPORTED, "%s: cuDNN's attention needs C a multiple of 8", op);
    return GPC_OK;
}

extern "C" gpc_status gpc_cudnn_attention_forward(gpc_tensor *out, gpc_tensor *lse,
                                                  const gpc_tensor *qkv, int num_heads) {
    const char *op = "attention_forward";
    GPC_TRY(gpc_cuda_enter(out));
    plan_key key;
    memset(&key, 0, sizeof key);
    key.B = (int)qkv->shape[0], key.T = (int)qkv->shape[1], key.NH = num_heads;
    int C = (int)(qkv->shape[2] / 3);
    key.hs = C / num_heads, key.dtype = qkv->dtype;
    if (key.B == 0) return GPC_OK;
    GPC_TRY(check_shape(op, key.T, key.hs, key.dtype));
    GPC_TRY(gpc_cuda_same_dtype(op, "out", out, "qkv", qkv));
    const gpc_tensor *ts[] = {out, lse, qkv};
    GPC_TRY(check_aligned(op, ts, 3, C));
    GPC_TRY(device_of_caller(&key.device));
    pthread_mutex_lock(&lock);
    plan_entry *p;
    gpc_status s = plan_get(&key, &p);
    if (s == GPC_OK) {
        char *base = (char *)qkv->data;
        size_t third = (size_t)C * gpc_dtype_size(qkv->dtype);
        void *by_role[14] = {0};
        by_role[ROLE_Q] = base, by_role[ROLE_K] = base + third, by_role[ROLE_V] = base + 2 * third;
        by_role[ROLE_O] = out->data, by_role[ROLE_STATS] = lse->data;
        const void *pack_key[6] = {qkv->data, out->data, lse->data,
                                   NULL,      NULL,      workspace[key.device]};
        s = execute(p, pack_key, by_role);
    }
    pthread_mutex_unlock(&lock);
    return s;
}

extern "C" gpc_status gpc_cudnn_attention_backward(gpc_tensor *dqkv, const gpc_tensor *dout,
                                                   const gpc_tensor *qkv, const gpc_tensor *out,
                                                   const gpc_tensor *lse, int num_heads) {
    const char *op = "attention_backward";
    GPC_TRY(gpc_cuda_enter(out));
    plan_key key;
    memset(&key, 0, sizeof key);
    key.B = (int)qkv->shape[0], key.T = (int)qkv->shape[1], key.NH = num_heads;
    int C = (int)(qkv->shape[2] / 3);
    key.hs = C / num_heads, key.dtype = qkv->dtype, key.backward = 1;
    if (key.B == 0) return GPC_OK;
    GPC_TRY(check_shape(op, key.T, key.hs, key.dtype));
    GPC_TRY(gpc_cuda_same_dtype(op, "out", out, "qkv", qkv));
    GPC_TRY(gpc_cuda_same_dtype(op, "dqkv", dqkv, "qkv", qkv));
    GPC_TRY(gpc_cuda_same_dtype(op, "dout", dout, "qkv", qkv));
    const gpc_tensor *ts[] = {dqkv, dout, qkv, out, lse};
    GPC_TRY(check_aligned(op, ts, 5, C));
    GPC_TRY(device_of_caller(&key.device));
    pthread_mutex_lock(&lock);
    plan_entry *p;
    gpc_status s = plan_get(&key, &p);
    if (s == GPC_OK) {
        char *base = (char *)qkv->data, *dbase = (char *)dqkv->data;
        size_t third = (size_t)C * gpc_dtype_size(qkv->dtype);
        void *by_role[14] = {0};
        by_role[ROLE_Q] = base, by_role[ROLE_K] = base + third, by_role[ROLE_V] = base + 2 * third;
        by_role[ROLE_O] = out->data, by_role[ROLE_DO] = dout->data;
        by_role[ROLE_STATS] = lse->data;
        by_role[ROLE_DQ] = dbase, by_role[ROLE_DK] = dbase + third;
        by_role[ROLE_DV] = dbase + 2 * third;
        const void *pack_key[6] = {qkv->data, dqkv->data, dout->data,
                                   out->data, lse->data,  workspace[key.device]};
        s = execute(p, pack_key, by_role);
    }
    pthread_mutex_unlock(&lock);
    return s;
}

extern "C" void gpc_cudnn_attention_get_stats(gpc_cudnn_attention_stats *stats) {
    memset(stats, 0, sizeof *stats);
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= GPC_CUDA_MAX_DEVICES) {
        cudaGetLastError();
        device = 0;
    }
    pthread_mutex_lock(&lock);
    for (int i = 0; i < num_plans; i++)
        if (plans[i]->status == GPC_OK) stats->plans++;
    stats->workspace_bytes = workspace_bytes[device];
    pthread_mutex_unlock(&lock);
}
