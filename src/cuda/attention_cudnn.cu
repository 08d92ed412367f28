/*
 * attention_cudnn.cu: causal multi-head attention through cuDNN's fused
 * flash-attention engines, the CUDA backend's second attention path beside
 * gpc's own kernels (attention.cu chooses; attention_cudnn.h is the API):
 * the cache of execution plans, their runs, and the API.
 *
 * Plans are built once per (GPU, B, T, NH, hs, dtype, direction) and cached
 * for the life of the process, failures included, so a shape cuDNN cannot
 * run is asked about once. Building also sizes the GPU's one workspace
 * (forward and backward run one after the other on one stream, so they
 * share it): the engine's scratch, then the backward's f32 dQ accumulator
 * and the row sums D. The model builds its plans at setup through
 * gpc_op_attention_prepare, so the training step allocates nothing.
 *
 * attention_cudnn_graph.cu builds the plans, attention_cudnn_tune.cu picks
 * among candidates when GPC_CUDNN_TUNE asks, and cudnn_loader.cu opens the
 * library.
 */
#include "cuda/attention_cudnn_plan.cuh"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define CUDNN_ATT_MAX_PLANS 64

/* ------------------------------------------------------------ shared state
 *
 * One lock guards the handles, the workspaces and the plan cache. Calls are
 * short (a lookup and an asynchronous launch); building a plan holds it for
 * as long as cuDNN takes, which happens once per shape. */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static cudnnHandle_t handles[GPC_CUDA_MAX_DEVICES];
static void *workspace[GPC_CUDA_MAX_DEVICES];
static size_t workspace_bytes[GPC_CUDA_MAX_DEVICES];

static plan_entry *plans[CUDNN_ATT_MAX_PLANS];
static int num_plans;

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
    GPC_TRY(gpc_cudnn_open());
    if (!handles[device]) {
        cudnnStatus_t status = gpc_cudnn.Create(&handles[device]);
        if (status != CUDNN_STATUS_SUCCESS) {
            handles[device] = NULL;
            return gpc_cudnn_failure(status, "cudnnCreate on cuda:%d", device);
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
    p->neg_inf = gpc_cudnn.version >= 91000 ? -INFINITY : -FLT_MAX;
    p->one = 1.0f;
    gpc_cudnn_att_plan_build(p, handle);
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
                gpc_cudnn.version / 10000, gpc_cudnn.version / 100 % 100,
                shape_text(key, text, sizeof text), key->device, p->num_candidates,
                p->total_bytes / 1048576.0, workspace_bytes[key->device] / 1048576.0);
    else
        gpc_log(GPC_LOG_INFO,
                "cuDNN %ld.%ld attention %s on cuda:%d: engine %ld, workspace %.1f MiB (the "
                "GPU's attention workspace is %.1f MiB)",
                gpc_cudnn.version / 10000, gpc_cudnn.version / 100 % 100,
                shape_text(key, text, sizeof text), key->device, p->engine_index,
                p->total_bytes / 1048576.0, workspace_bytes[key->device] / 1048576.0);
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
    cudnnStatus_t st = gpc_cudnn.CreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (st == CUDNN_STATUS_SUCCESS)
        st = gpc_cudnn.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                    p->num_tensors, p->uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = gpc_cudnn.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                    CUDNN_TYPE_VOID_PTR, p->num_tensors, ptrs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = gpc_cudnn.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                                    &ws);
    if (st == CUDNN_STATUS_SUCCESS) st = gpc_cudnn.Finalize(pack);
    if (st != CUDNN_STATUS_SUCCESS) {
        if (pack) gpc_cudnn.DestroyDescriptor(pack);
        return gpc_cudnn_failure(st, "variant pack");
    }
    pack_entry *slot;
    if (p->num_packs < CUDNN_ATT_MAX_PACKS) {
        slot = &p->packs[p->num_packs++];
    } else {
        slot = &p->packs[p->next_pack];
        p->next_pack = (p->next_pack + 1) % CUDNN_ATT_MAX_PACKS;
        gpc_cudnn.DestroyDescriptor(slot->pack);
    }
    memcpy(slot->key, key, sizeof slot->key);
    slot->pack = pack;
    *out = pack;
    return GPC_OK;
}

/* One run of a plan on the handle's stream, after zeroing the backward's dQ
 * accumulator where this cuDNN needs it. */
gpc_status gpc_cudnn_att_run_plan(const plan_entry *p, cudnnBackendDescriptor_t plan,
                                  cudnnBackendDescriptor_t pack, cudaStream_t stream) {
    int device = p->key.device;
    if (p->key.backward && gpc_cudnn.version < 90600) {
        /* before cuDNN 9.6 the engine expected a zeroed dQ accumulator */
        size_t bytes = (size_t)p->key.B * p->key.NH * p->key.T * p->key.hs * sizeof(float);
        GPC_CUDA_CHECK(
            cudaMemsetAsync((char *)workspace[device] + p->accum_offset, 0, bytes, stream));
    }
    cudnnStatus_t st = gpc_cudnn.Execute(handles[device], plan, pack);
    if (st != CUDNN_STATUS_SUCCESS) {
        char text[96];
        return gpc_cudnn_failure(st, "running %s", shape_text(&p->key, text, sizeof text));
    }
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
    cudnnStatus_t st = gpc_cudnn.SetStream(handles[device], stream);
    if (st != CUDNN_STATUS_SUCCESS) return gpc_cudnn_failure(st, "cudnnSetStream");
    /* the timing's runs write the call's outputs; the run below writes them
     * again with the plan kept */
    if (p->num_candidates > 1) GPC_TRY(gpc_cudnn_att_tune(p, pack, stream));
    return gpc_cudnn_att_run_plan(p, p->plan, pack, stream);
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
    return gpc_cudnn.version;
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
