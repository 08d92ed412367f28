/*
 * stencil_cuda.h: the GPU half of the stencil (gpc/stencil.h), as plain C
 * calls that stencil.c makes: stencil_cuda.cu implements them when gpc is
 * built with CUDA, stencil_cuda_stub.c answers "built without CUDA"
 * otherwise, so stencil.c needs no #ifdef.
 *
 * A GPU holds its process's band of planes as `slabs` subdomains, each two
 * arrays of nz + 2 planes (a halo plane on either side) with a ring of
 * zeros around every plane; rows are padded so that x = 1 starts on a
 * 128-byte boundary, which makes each warp's row loads whole sectors.
 *
 * A step runs in two halves around the exchange with the neighbouring
 * processes, which stencil.c does over MPI from host buffers:
 *   step_begin  the planes next to each halo on the halo stream, the rest
 *               of every slab on the compute stream, then (halo stream) the
 *               new boundary planes into the neighbouring slabs' halos and,
 *               with processes below or above, into the host send buffers;
 *               returns once those are on the host (at once when alone)
 *   step_end    the received planes up into the halos (halo stream)
 * With `peers` (NCCL, a GPU a process) step_begin instead queues the
 * boundary planes' sends and the halos' receives on the halo stream, GPU
 * to GPU, and returns at once; step_end has nothing to copy.
 * Each stream waits for the other's previous step (events), so the inside
 * of a slab is computed while the halos travel.
 */
#ifndef GPC_SCI_STENCIL_CUDA_H
#define GPC_SCI_STENCIL_CUDA_H

#include "gpc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __CUDACC__
#define GPC_STENCIL_HD __host__ __device__
#else
#define GPC_STENCIL_HD
#endif

/* One point's term of gpc_stencil_checksum: splitmix64's finalizer (Steele,
 * Lea and Flood 2014) of the value's bits mixed with the point's index
 * (z n + y) n + x. Shared by the CPU and the GPU so both give one number. */
static inline GPC_STENCIL_HD uint64_t gpc_stencil_hash(uint64_t bits, uint64_t index) {
    uint64_t z = bits ^ (index * 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct gpc_stencil_cuda gpc_stencil_cuda;

/* The update kernels (stencil_cuda.cu says how each reads its neighbours);
 * GPC_STENCIL_KERNEL picks one by name, stencil.c parses it. */
typedef enum {
    GPC_STENCIL_KERNEL_VECTOR,  /* z-marching columns, 16 bytes a thread along x */
    GPC_STENCIL_KERNEL_COLUMN,  /* z-marching columns, one point a thread along x */
    GPC_STENCIL_KERNEL_PLAIN,   /* one point a thread, every neighbour loaded */
    GPC_STENCIL_KERNEL_SHARED,  /* z-marching tiles through shared memory */
    GPC_STENCIL_KERNEL_TWOSTEP, /* two steps a pass where it can (else vector) */
    GPC_STENCIL_KERNEL_ASYNC,   /* z-marching tiles, planes copied ahead into shared memory */
    GPC_STENCIL_KERNEL_STREAM2, /* two steps a pass, z-marching 16-byte runs (else vector) */
    GPC_STENCIL_KERNELS
} gpc_stencil_kernel;

typedef struct {
    int device; /* CUDA ordinal */
    int fp32;
    int n;
    int z0, nz;       /* this process's planes of the grid */
    int slabs;        /* subdomains of them on the GPU */
    int below, above; /* 1: a process below (above) exchanges halo planes */
    /* NULL, or the processes over NCCL (ranks: this one's neighbours are
     * rank - 1 below and rank + 1 above), for halos from GPU to GPU */
    struct gpc_dist *peers;
    gpc_stencil_kernel kernel;
    int async_rows;   /* the async kernel's tile: 8, 16 or 32 rows */
    int stream2_rows; /* the stream2 kernel's tile: 6, 14 or 30 rows */
    double r;
    /* 1 - 6 r, rounded once (gpc_stencil_c6): the CPU's bits, whatever
     * the host compiler contracts */
    double c6;
    /* sin(k pi (i + 1) h), i = 0 .. n - 1, along x, y and z: the starting
     * field is their product, (sx sy) sz, as the CPU computes it */
    const double *sine[3];
} gpc_stencil_cuda_config;

/* Device memory the arrays need, in bytes. */
double gpc_stencil_cuda_bytes(const gpc_stencil_cuda_config *c);

/* GPC_OK when `device` exists and `bytes` fit in its free memory; else the
 * reason and what to do. `what` names the grid in the message. */
gpc_status gpc_stencil_cuda_check(int device, double bytes, const char *what);

gpc_status gpc_stencil_cuda_create(gpc_stencil_cuda **out, const gpc_stencil_cuda_config *c);
void gpc_stencil_cuda_free(gpc_stencil_cuda *g);

/* The host buffers of one halo plane each (valid after create). */
typedef struct {
    void *send_lo, *send_hi, *recv_lo, *recv_hi;
    size_t bytes;
} gpc_stencil_cuda_halos;
void gpc_stencil_cuda_host_halos(const gpc_stencil_cuda *g, gpc_stencil_cuda_halos *out);

gpc_status gpc_stencil_cuda_step_begin(gpc_stencil_cuda *g);
gpc_status gpc_stencil_cuda_step_end(gpc_stencil_cuda *g);
/* 1 when two steps can run as one pass over the field: the twostep or
 * stream2 kernel, one slab, no other process. step_pair then queues them (it stands for a
 * step_begin and step_end each). */
int gpc_stencil_cuda_pairs(const gpc_stencil_cuda *g);
gpc_status gpc_stencil_cuda_step_pair(gpc_stencil_cuda *g);
/* Waits for the steps queued; reports any error of theirs. */
gpc_status gpc_stencil_cuda_sync(gpc_stencil_cuda *g);

/* Plane zl (0 .. nz - 1 of this process) as n x n doubles. */
gpc_status gpc_stencil_cuda_plane(const gpc_stencil_cuda *g, int zl, double *out);
gpc_status gpc_stencil_cuda_at(const gpc_stencil_cuda *g, int x, int y, int zl, double *out);

/* Over this process's points: max |u - scale u0| and max |u0|. */
gpc_status gpc_stencil_cuda_error(const gpc_stencil_cuda *g, double scale, double *err,
                                  double *big);
/* Over this process's points: the sum of gpc_stencil_hash terms. */
gpc_status gpc_stencil_cuda_checksum(const gpc_stencil_cuda *g, uint64_t *sum);

/* cudaMemcpy device to device of `bytes` on `device`: bytes read plus
 * written a second, the best of 5 after a warm-up. */
gpc_status gpc_stencil_cuda_copy_rate(int device, size_t bytes, double *bytes_per_second);

#ifdef __cplusplus
}
#endif

#endif /* GPC_SCI_STENCIL_CUDA_H */
