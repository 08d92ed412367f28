/*
 * cuda_backend.cu: the CUDA device: memory, copies, streams, events and
 * graphs. The numeric ops are gathered in gpc_cuda_ops (cuda_ops.cu).
 *
 * The backend answers only when a usable GPU is present, so a gpc built with
 * CUDA still runs on a machine without a driver: its finder returns
 * NULL there with a message saying so.
 */
#include "cuda/cuda_common.cuh"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static int cuda_device_count(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no driver" error */
        return 0;
    }
    return count;
}

static gpc_status cuda_alloc(int index, size_t bytes, void **out) {
    GPC_CUDA_CHECK(cudaSetDevice(index));
    cudaError_t err = cudaMalloc(out, bytes);
    if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        size_t free_bytes = 0, total = 0;
        cudaMemGetInfo(&free_bytes, &total);
        return gpc_error(GPC_ERR_NOMEM,
                         "out of GPU memory on cuda:%d: asked for %.2f GiB, %.2f GiB free of "
                         "%.2f GiB; lower --batch, use --recompute, or run 'gpc plan'",
                         index, bytes / 1073741824.0, free_bytes / 1073741824.0,
                         total / 1073741824.0);
    }
    GPC_CUDA_CHECK(err);
    return GPC_OK;
}

static void cuda_free(int index, void *ptr) {
    (void)index;
    cudaFree(ptr);
}

static gpc_status cuda_alloc_host(size_t bytes, void **out) {
    GPC_CUDA_CHECK(cudaMallocHost(out, bytes));
    return GPC_OK;
}

static void cuda_free_host(void *ptr) {
    cudaFreeHost(ptr);
}

static gpc_status cuda_memset_zero(gpc_device device, void *ptr, size_t bytes, gpc_stream stream) {
    if (device.type == GPC_DEVICE_CPU) {
        memset(ptr, 0, bytes);
        return GPC_OK;
    }
    GPC_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, (cudaStream_t)stream));
    return GPC_OK;
}

static gpc_status cuda_copy(void *dst, gpc_device dst_device, const void *src,
                            gpc_device src_device, size_t bytes, gpc_stream stream) {
    cudaMemcpyKind kind = cudaMemcpyDefault; /* unified addressing works out the direction */
    (void)dst_device;
    (void)src_device;
    if (!stream) {
        GPC_CUDA_CHECK(cudaMemcpy(dst, src, bytes, kind));
    } else {
        GPC_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, (cudaStream_t)stream));
    }
    return GPC_OK;
}

/* Queued on the ops' stream of the GPU involved (made current: the default
 * stream is per device), in order with the kernels that read dst. */
static gpc_status cuda_copy_async(void *dst, gpc_device dst_device, const void *src,
                                  gpc_device src_device, size_t bytes) {
    int index = dst_device.type != GPC_DEVICE_CPU ? dst_device.index : src_device.index;
    GPC_CUDA_CHECK(cudaSetDevice(index));
    GPC_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, gpc_cuda_stream()));
    return GPC_OK;
}

static gpc_status cuda_make_current(int index) {
    GPC_CUDA_CHECK(cudaSetDevice(index));
    return GPC_OK;
}

static gpc_status cuda_synchronize(int index) {
    GPC_CUDA_CHECK(cudaSetDevice(index));
    GPC_CUDA_CHECK(cudaDeviceSynchronize());
    return GPC_OK;
}

static gpc_status cuda_memory_info(int index, size_t *free_bytes, size_t *total_bytes) {
    GPC_CUDA_CHECK(cudaSetDevice(index));
    GPC_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
    return GPC_OK;
}

static gpc_status cuda_stream_create(int index, gpc_stream *out) {
    cudaStream_t s;
    GPC_CUDA_CHECK(cudaSetDevice(index));
    GPC_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *out = (gpc_stream)s;
    return GPC_OK;
}

static void cuda_stream_destroy(gpc_stream stream) {
    if (stream) cudaStreamDestroy((cudaStream_t)stream);
}

static gpc_status cuda_stream_synchronize(gpc_stream stream) {
    GPC_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)stream));
    return GPC_OK;
}

static gpc_status cuda_event_create(gpc_event *out) {
    cudaEvent_t e;
    GPC_CUDA_CHECK(cudaEventCreate(&e));
    *out = (gpc_event)e;
    return GPC_OK;
}

static void cuda_event_destroy(gpc_event event) {
    if (event) cudaEventDestroy((cudaEvent_t)event);
}

static gpc_status cuda_event_record(gpc_event event, gpc_stream stream) {
    GPC_CUDA_CHECK(cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream));
    return GPC_OK;
}

static gpc_status cuda_stream_wait_event(gpc_stream stream, gpc_event event) {
    GPC_CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0));
    return GPC_OK;
}

static gpc_status cuda_event_synchronize(gpc_event event) {
    GPC_CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)event));
    return GPC_OK;
}

static gpc_status cuda_event_elapsed_ms(gpc_event start, gpc_event stop, float *ms) {
    GPC_CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)stop));
    GPC_CUDA_CHECK(cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)stop));
    return GPC_OK;
}

static gpc_status cuda_device_name(int index, char *buf, size_t size) {
    cudaDeviceProp prop;
    GPC_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
    snprintf(buf, size, "%s", prop.name);
    return GPC_OK;
}

/* "0000:3B:00.0": CUDA writes 13 characters and the NUL. */
static gpc_status cuda_device_pci_bus_id(int index, char *buf, size_t size) {
    int length = size > 64 ? 64 : (int)size;
    GPC_CUDA_CHECK(cudaDeviceGetPCIBusId(buf, length, index));
    return GPC_OK;
}

/* ---------------------------------------------------------------- graphs
 *
 * The legacy default stream, where ops run, cannot be captured, so a
 * capture switches the calling thread's ops to a stream of its own (one per
 * device, made at the first capture) in thread-local mode: an allocation or
 * host wait from this thread during the capture fails instead of being
 * silently left out of the graph. The graph is launched on the default
 * stream, so it runs in order with the copies and ops around it. */

static cudaStream_t capture_streams[GPC_CUDA_MAX_DEVICES];
static pthread_mutex_t capture_lock = PTHREAD_MUTEX_INITIALIZER;

static gpc_status cuda_graph_capture_begin(int index) {
    if (index < 0 || index >= GPC_CUDA_MAX_DEVICES)
        return gpc_error(GPC_ERR_UNSUPPORTED, "graphs: GPU %d is beyond the %d gpc supports", index,
                         GPC_CUDA_MAX_DEVICES);
    if (gpc_cuda_capturing())
        return gpc_error(GPC_ERR_INTERNAL, "graphs: this thread is capturing a graph already");
    GPC_CUDA_CHECK(cudaSetDevice(index));
    pthread_mutex_lock(&capture_lock);
    cudaError_t err = cudaSuccess;
    if (!capture_streams[index])
        err = cudaStreamCreateWithFlags(&capture_streams[index], cudaStreamNonBlocking);
    cudaStream_t stream = capture_streams[index];
    pthread_mutex_unlock(&capture_lock);
    GPC_CUDA_CHECK(err);
    GPC_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    gpc_cuda_capture_stream = stream;
    return GPC_OK;
}

static gpc_status cuda_graph_capture_end(int index, gpc_graph *out) {
    *out = NULL;
    if (!gpc_cuda_capturing())
        return gpc_error(GPC_ERR_INTERNAL, "graphs: this thread is not capturing a graph");
    cudaStream_t stream = gpc_cuda_capture_stream;
    gpc_cuda_capture_stream = 0; /* whatever happens next, ops go to the default stream again */
    cudaGraph_t graph = NULL;
    cudaError_t err = cudaStreamEndCapture(stream, &graph);
    if (err != cudaSuccess || !graph) {
        cudaGetLastError();
        if (graph) cudaGraphDestroy(graph);
        return gpc_error(GPC_ERR_DEVICE,
                         "graphs: the capture on cuda:%d failed (%s): an op allocated, waited "
                         "for the device or used another stream; set GPC_SERVE_GRAPHS=0",
                         index, cudaGetErrorString(err));
    }
    cudaGraphExec_t exec = NULL;
    err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return gpc_error(err == cudaErrorMemoryAllocation ? GPC_ERR_NOMEM : GPC_ERR_DEVICE,
                         "graphs: instantiating a graph on cuda:%d failed: %s", index,
                         cudaGetErrorString(err));
    }
    gpc_cuda_scratch_keep(+1); /* the graph may read the scratch buffer */
    *out = (gpc_graph)exec;
    return GPC_OK;
}

static gpc_status cuda_graph_launch(int index, gpc_graph graph) {
    GPC_CUDA_CHECK(cudaSetDevice(index));
    GPC_CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)graph, gpc_cuda_stream()));
    return GPC_OK;
}

static void cuda_graph_destroy(gpc_graph graph) {
    if (!graph) return;
    cudaGraphExecDestroy((cudaGraphExec_t)graph);
    gpc_cuda_scratch_keep(-1);
}

static gpc_backend make_backend(void) {
    gpc_backend b;
    memset(&b, 0, sizeof b);
    b.name = "cuda";
    b.type = GPC_DEVICE_CUDA;
    b.device_count = cuda_device_count;
    b.alloc = cuda_alloc;
    b.free = cuda_free;
    b.alloc_host = cuda_alloc_host;
    b.free_host = cuda_free_host;
    b.memset_zero = cuda_memset_zero;
    b.copy = cuda_copy;
    b.synchronize = cuda_synchronize;
    b.memory_info = cuda_memory_info;
    b.stream_create = cuda_stream_create;
    b.stream_destroy = cuda_stream_destroy;
    b.stream_synchronize = cuda_stream_synchronize;
    b.event_create = cuda_event_create;
    b.event_destroy = cuda_event_destroy;
    b.event_record = cuda_event_record;
    b.stream_wait_event = cuda_stream_wait_event;
    b.event_synchronize = cuda_event_synchronize;
    b.event_elapsed_ms = cuda_event_elapsed_ms;
    b.device_name = cuda_device_name;
    b.device_pci_bus_id = cuda_device_pci_bus_id;
    b.copy_async = cuda_copy_async;
    b.make_current = cuda_make_current;
    b.graph_capture_begin = cuda_graph_capture_begin;
    b.graph_capture_end = cuda_graph_capture_end;
    b.graph_launch = cuda_graph_launch;
    b.graph_destroy = cuda_graph_destroy;
    b.ops = &gpc_cuda_ops;
    return b;
}

static const gpc_backend cuda_backend = make_backend();

static const gpc_backend *cuda_backend_find(void) {
    if (cuda_device_count() <= 0) {
        gpc_error(GPC_ERR_UNSUPPORTED,
                  "no usable NVIDIA GPU: the driver is missing or no GPU is visible "
                  "(check nvidia-smi and CUDA_VISIBLE_DEVICES), or use --device cpu");
        return NULL;
    }
    return &cuda_backend;
}

/* Runs before main (core/backend.c says why a constructor). It only records
 * the finder: the driver is first touched when a CUDA device is asked for.
 * extern "C" so that the build can name it to keep this object in every
 * link. */
extern "C" __attribute__((constructor)) void gpc_cuda_backend_register(void) {
    gpc_backend_register(GPC_DEVICE_CUDA, cuda_backend_find);
}
