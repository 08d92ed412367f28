/*
 * cudnn_loader.cuh: libcudnn, opened with dlopen on first use
 * (cudnn_loader.cu), so a gpc binary needs no cuDNN to start: the dozen
 * functions of cuDNN's backend API that gpc calls, looked up by name, and
 * a cuDNN failure turned into a gpc_status. For the cuDNN files alone:
 * they need cudnn.h, which CMake finds (CUDNN_INCLUDE_DIR).
 */
#ifndef GPC_CUDA_CUDNN_LOADER_CUH
#define GPC_CUDA_CUDNN_LOADER_CUH

#include "cuda/cuda_common.cuh"

#include <cudnn.h>

#if CUDNN_MAJOR != 9
#error "gpc's cuDNN attention is written against cuDNN 9's backend API"
#endif

typedef struct {
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
} gpc_cudnn_library;

/* The functions, filled by gpc_cudnn_open; version 0 until it succeeds. */
extern gpc_cudnn_library gpc_cudnn;

/* Loads the library once (callable from any thread): GPC_OK when it loaded,
 * else GPC_ERR_UNSUPPORTED saying why (not installed, not cuDNN 9) and what
 * to do. */
gpc_status gpc_cudnn_open(void);

/* A cuDNN failure as a gpc status: the call, cuDNN's name for the status and
 * its own last message. */
gpc_status gpc_cudnn_failure(cudnnStatus_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif /* GPC_CUDA_CUDNN_LOADER_CUH */
