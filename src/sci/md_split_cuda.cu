/*
 * md_split_cuda.cu: one process's slab of a split `gpc md` run on its GPU
 * (md_split_cuda.h says what the host and the GPU each do).
 *
 * A build starts as md_split.c's migrate(): a kernel wraps the owned
 * positions and flags what the host must know (a position not finite, an
 * atom whose new owner is no neighbour); then, for each side, a kernel marks
 * the leavers, a scan numbers them, and a partition kernel writes the
 * stayers in order into a second set of arrays (x, v, id) and the leavers,
 * packed [7] each, for the host to send; arrivals are unpacked after the
 * owned atoms. The atoms each neighbour needs are chosen the same way (mark,
 * scan, scatter of the indices, ascending).
 *
 * The list: every atom (owned and ghost) binned into cells, a count a cell,
 * a scan, a scatter, then each cell's atoms sorted by index, so that the
 * walk over a cell meets them in the host's order. A thread per owned atom
 * then walks the cells around it as md_split.c's build_list does and keeps
 * the partners within cutoff + skin; the distance test multiplies and adds
 * with explicit round-to-nearest operations (no fused multiply-adds), so
 * the rows are the host's but for a candidate within a rounding of the
 * reach, which lies beyond the cutoff and adds no force.
 *
 * Between builds a step is three kernels: the half kick and drift (with
 * the displacement test against the build's positions), the pack of the
 * positions each neighbour needs, and forces followed by the second half
 * kick, with the ghosts' new positions copied in between by the host.
 */
#include "sci/md_split_cuda.h"

#include "cuda/cuda_common.cuh"
#include "gpc/dist.h"
#include "sci/sci_cuda.cuh"

#include <climits>
#include <cub/device/device_scan.cuh>
#include <math.h>
#include <stdio.h>
#include <string.h>

namespace {

constexpr int THREADS = 128;

/* What the kernels report, zeroed before each kernel that reports. */
struct split_flags {
    int moved, bad, stray, longest;
    unsigned long long pairs;
    double potential, virial, v2;
};

__device__ __forceinline__ double nearest(double d, double box, double inv_box) {
    return __dsub_rn(d, __dmul_rn(box, rint(__dmul_rn(d, inv_box))));
}

struct cell_grid {
    double xmin, cw, inv_box;
    int mx, m;
    __device__ __forceinline__ int x_of(double p) const {
        return (int)fmin(fmax(floor(__ddiv_rn(__dsub_rn(p, xmin), cw)), 0.0), (double)(mx - 1));
    }
    __device__ __forceinline__ int p_of(double p) const {
        return (int)fmin(fmax(floor(__dmul_rn(__dmul_rn(p, inv_box), (double)m)), 0.0),
                         (double)(m - 1));
    }
    __device__ __forceinline__ int64_t cell(const double *p) const {
        return ((int64_t)p_of(p[2]) * m + p_of(p[1])) * mx + x_of(p[0]);
    }
};

__global__ void split_bin(int64_t total, const double *__restrict__ all, cell_grid grid,
                          int *__restrict__ cell_of, int *__restrict__ slot,
                          int *__restrict__ cell_count) {
    const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (j >= total) return;
    const int c = (int)grid.cell(all + 3 * j);
    cell_of[j] = c;
    slot[j] = atomicAdd(cell_count + c, 1);
}

__global__ void split_scatter(int64_t total, const int *__restrict__ cell_of,
                              const int *__restrict__ slot, const int *__restrict__ cell_start,
                              int *__restrict__ cell_atoms) {
    const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (j >= total) return;
    cell_atoms[cell_start[cell_of[j]] + slot[j]] = (int)j;
}

/* Each cell's atoms in ascending index (the scatter's order is the atomics'). */
__global__ void split_sort_cells(int64_t cells, const int *__restrict__ cell_start,
                                 const int *__restrict__ cell_count, int *__restrict__ cell_atoms) {
    const int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (c >= cells) return;
    sort_ascending(cell_atoms + cell_start[c], cell_count[c]);
}

__global__ void split_build(int64_t n, const double *__restrict__ all, cell_grid grid,
                            const int *__restrict__ cell_start, const int *__restrict__ cell_count,
                            const int *__restrict__ cell_atoms, double box, double reach2,
                            int32_t *__restrict__ rows, int32_t *__restrict__ count, int64_t cap,
                            split_flags *flags) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    const double *p = all + 3 * i;
    const int m = grid.m, mx = grid.mx, span = m >= 3 ? 3 : m;
    const int cx = grid.x_of(p[0]), cy = grid.p_of(p[1]), cz = grid.p_of(p[2]);
    int32_t *row = rows + i * cap;
    int64_t found = 0;
    for (int a = 0; a < span; a++) {
        const int nz = m >= 3 ? (cz + a - 1 + m) % m : a;
        for (int b = 0; b < span; b++) {
            const int ny = m >= 3 ? (cy + b - 1 + m) % m : b;
            for (int dxc = -1; dxc <= 1; dxc++) {
                const int nx = cx + dxc;
                if (nx < 0 || nx >= mx) continue;
                const int64_t c = ((int64_t)nz * m + ny) * mx + nx;
                const int *atoms = cell_atoms + cell_start[c];
                for (int k = 0; k < cell_count[c]; k++) {
                    const int j = atoms[k];
                    if (j == i) continue;
                    const double *q = all + 3 * (int64_t)j;
                    const double dx = __dsub_rn(p[0], q[0]);
                    const double dy = nearest(__dsub_rn(p[1], q[1]), box, grid.inv_box);
                    const double dz = nearest(__dsub_rn(p[2], q[2]), box, grid.inv_box);
                    const double r2 = __dadd_rn(__dadd_rn(__dmul_rn(dx, dx), __dmul_rn(dy, dy)),
                                                __dmul_rn(dz, dz));
                    if (r2 < reach2) {
                        if (found < cap) row[found] = j;
                        found++;
                    }
                }
            }
        }
    }
    const int kept = (int)(found < cap ? found : cap);
    count[i] = kept;
    atomicMax(&flags->longest, (int)(found < INT_MAX ? found : INT_MAX));
    atomicAdd(&flags->pairs, (unsigned long long)kept);
}

template <bool THERMO>
__global__ void __launch_bounds__(THREADS)
    split_forces(int64_t n, const double *__restrict__ all, const int32_t *__restrict__ rows,
                 const int32_t *__restrict__ count, int64_t cap, double box, double inv_box,
                 double rc2, double *__restrict__ f, double *__restrict__ v, double half_dt,
                 split_flags *flags) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    double e = 0, w = 0;
    if (i < n) {
        const double px = all[3 * i], py = all[3 * i + 1], pz = all[3 * i + 2];
        double fx = 0, fy = 0, fz = 0;
        const int32_t *row = rows + i * cap;
        const int partners = count[i];
        for (int k = 0; k < partners; k++) {
            const double *q = all + 3 * (int64_t)row[k];
            const double dx = px - q[0];
            const double dy = nearest(py - q[1], box, inv_box);
            const double dz = nearest(pz - q[2], box, inv_box);
            const double r2 = dx * dx + dy * dy + dz * dz;
            if (r2 >= rc2) continue;
            const double r2inv = 1.0 / r2, r6inv = r2inv * r2inv * r2inv;
            const double fpair = r6inv * (48.0 * r6inv - 24.0) * r2inv;
            fx += dx * fpair, fy += dy * fpair, fz += dz * fpair;
            if (THERMO) {
                e += 0.5 * 4.0 * r6inv * (r6inv - 1.0); /* half: the partner adds the other */
                w += 0.5 * r2 * fpair;
            }
        }
        f[3 * i] = fx, f[3 * i + 1] = fy, f[3 * i + 2] = fz;
        if (half_dt != 0) {
            v[3 * i] += half_dt * fx;
            v[3 * i + 1] += half_dt * fy;
            v[3 * i + 2] += half_dt * fz;
        }
    }
    if (THERMO) {
        __shared__ double shared[THREADS];
        e = block_sum(e, shared);
        w = block_sum(w, shared);
        if (threadIdx.x == 0) {
            atomicAdd(&flags->potential, e);
            atomicAdd(&flags->virial, w);
        }
    }
}

__global__ void split_drift(int64_t n, double *__restrict__ x, double *__restrict__ v,
                            const double *__restrict__ f, const double *__restrict__ x_built,
                            double half_dt, double dt, double limit2, split_flags *flags) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    double d2 = 0;
    for (int d = 0; d < 3; d++) {
        const int64_t k = 3 * i + d;
        v[k] += half_dt * f[k];
        x[k] += dt * v[k];
        const double dx = x[k] - x_built[k];
        d2 += dx * dx;
    }
    if (!(d2 <= limit2)) flags->moved = 1;
    if (!isfinite(d2)) flags->bad = 1;
}

__global__ void split_pack(int64_t count, const int64_t *__restrict__ list,
                           const double *__restrict__ all, double shift, double *__restrict__ out) {
    const int64_t a = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (a >= count) return;
    const double *p = all + 3 * list[a];
    out[3 * a] = p[0] + shift;
    out[3 * a + 1] = p[1];
    out[3 * a + 2] = p[2];
}

__global__ void __launch_bounds__(THREADS)
    split_v2(int64_t n, const double *__restrict__ v, split_flags *flags) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    double s = 0;
    if (i < n)
        for (int d = 0; d < 3; d++)
            s += v[3 * i + d] * v[3 * i + d];
    __shared__ double shared[THREADS];
    s = block_sum(s, shared);
    if (threadIdx.x == 0) atomicAdd(&flags->v2, s);
}

/* The slab that owns position x along the box (md_split.c's owner_of). */
__device__ __forceinline__ int owner_of(double x, double width, int world) {
    const int r = (int)(x / width);
    return r < 0 ? 0 : (r >= world ? world - 1 : r);
}

/* md_split.c's wrap: into [0, box), a face's rounding to 0. */
__device__ __forceinline__ double wrap(double p, double box, double inv_box) {
    const double w = p - box * floor(p * inv_box);
    return w >= box || w < 0 ? 0.0 : w;
}

struct slab_of {
    int rank, world, left, right;
    double box, inv_box, width, lo, hi, near;
    /* 1 if the atom at x leaves for `side`'s neighbour (0: right, 1: left;
     * with two processes both neighbours are the right) */
    __device__ __forceinline__ int leaves(double x, int side) const {
        const int r = owner_of(x, width, world);
        return r != rank && (side == 0 ? r == right : r == left);
    }
};

__global__ void split_wrap(int64_t n, double *__restrict__ x, slab_of slab, split_flags *flags) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    int bad = 0;
    for (int d = 0; d < 3; d++) {
        const double p = x[3 * i + d];
        if (!isfinite(p)) bad = 1;
        x[3 * i + d] = wrap(p, slab.box, slab.inv_box);
    }
    const int r = owner_of(x[3 * i], slab.width, slab.world);
    if (bad) flags->bad = 1;
    if (r != slab.rank && r != slab.left && r != slab.right) flags->stray = 1;
}

/* mark[i]: atom i leaves for `side`; mark[n] = 0, so the scan's last entry
 * is the count. */
__global__ void split_mark_leavers(int64_t n, const double *__restrict__ x, slab_of slab, int side,
                                   int *__restrict__ mark) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) mark[i] = slab.leaves(x[3 * i], side);
    if (i == n) mark[i] = 0;
}

/* Stayers in order into x2, v2, id2 (at i minus the leavers before i);
 * leavers packed into pack[at][7]: x, v, id. */
__global__ void split_partition(int64_t n, const int *__restrict__ mark, const int *__restrict__ at,
                                const double *__restrict__ x, const double *__restrict__ v,
                                const int64_t *__restrict__ id, double *__restrict__ x2,
                                double *__restrict__ v2, int64_t *__restrict__ id2,
                                double *__restrict__ pack) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (mark[i]) {
        double *o = pack + 7 * (int64_t)at[i];
        for (int d = 0; d < 3; d++)
            o[d] = x[3 * i + d], o[3 + d] = v[3 * i + d];
        o[6] = (double)id[i];
    } else {
        const int64_t j = i - at[i];
        for (int d = 0; d < 3; d++)
            x2[3 * j + d] = x[3 * i + d], v2[3 * j + d] = v[3 * i + d];
        id2[j] = id[i];
    }
}

/* Arrivals ([count][7]) after the first `at` atoms. */
__global__ void split_unpack(int64_t count, const double *__restrict__ in, int64_t at,
                             double *__restrict__ x, double *__restrict__ v,
                             int64_t *__restrict__ id) {
    const int64_t a = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (a >= count) return;
    const double *p = in + 7 * a;
    for (int d = 0; d < 3; d++)
        x[3 * (at + a) + d] = p[d], v[3 * (at + a) + d] = p[3 + d];
    id[at + a] = (int64_t)p[6];
}

/* mark[i] (right) and mark[n + 1 + i] (left): atom i is within reach of
 * that face (md_split.c's choose_ghosts); each half's last entry 0. */
__global__ void split_mark_faces(int64_t n, const double *__restrict__ x, slab_of slab,
                                 int *__restrict__ mark) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i > n) return;
    int right = 0, left = 0;
    if (i < n) {
        const double p = x[3 * i];
        left = p < slab.lo + slab.near;
        right = p >= slab.hi - slab.near;
    }
    mark[i] = right;
    mark[n + 1 + i] = left;
}

__global__ void split_scatter_sends(int64_t n, const int *__restrict__ mark,
                                    const int *__restrict__ at, int64_t *__restrict__ right,
                                    int64_t *__restrict__ left) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (mark[i]) right[at[i]] = i;
    if (mark[n + 1 + i]) left[at[n + 1 + i]] = i;
}

/* The smallest and largest x over `total` atoms, by one block. */
__global__ void __launch_bounds__(1024)
    split_span(int64_t total, const double *__restrict__ all, double *__restrict__ span) {
    __shared__ double lo[1024], hi[1024];
    double a = INFINITY, b = -INFINITY;
    for (int64_t j = threadIdx.x; j < total; j += blockDim.x)
        a = fmin(a, all[3 * j]), b = fmax(b, all[3 * j]);
    lo[threadIdx.x] = a, hi[threadIdx.x] = b;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            lo[threadIdx.x] = fmin(lo[threadIdx.x], lo[threadIdx.x + s]);
            hi[threadIdx.x] = fmax(hi[threadIdx.x], hi[threadIdx.x + s]);
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) span[0] = lo[0], span[1] = hi[0];
}

unsigned blocks(int64_t items) {
    return (unsigned)((items + THREADS - 1) / THREADS);
}

} // namespace

/* A device buffer and the items it has room for. */
struct dev_buf {
    void *p;
    int64_t cap;
};

/* Pinned host memory that grows. */
struct host_buf {
    double *p;
    int64_t cap;
};

struct md_split_cuda {
    int device;
    char name[300];
    cudaStream_t stream;
    slab_of slab;
    double rc2, reach2, limit2;
    int64_t owned, ghosts[2], sends[2], row_cap;
    double shift[2];
    /* doubles: all (owned positions, then the ghosts'), v, f, x_built
     * (owned), all2 and v2 (the partition's other side), pack (leavers
     * [7] each, or both sides' positions), stage (arrivals), span
     * [2]; int64: id, id2 (owned), send[2]; int: mark, at (the scans'),
     * cell_of, slot, cell_atoms (every atom), cell_count, cell_start (every
     * cell); int32: rows (owned x row_cap), count (owned) */
    dev_buf all, v, f, x_built, all2, v2, pack, stage, span, id, id2, send[2], mark, at, cell_of,
        slot, cell_atoms, cell_count, cell_start, rows, count;
    void *scan_tmp;
    size_t scan_bytes;
    split_flags *flags, *host_flags;
    /* pinned: the leavers the host sends at a build; the positions it
     * sends each step (both sides, the right's first); those it receives
     * (a side each), uploaded from there, `received` marking each upload */
    host_buf leavers, sent, got[2];
    cudaEvent_t received[2];
};

namespace {

/* Room for `need` doubles in pinned host memory *b (contents dropped). */
gpc_status host_room(host_buf *b, int64_t need) {
    if (need <= b->cap && b->p) return GPC_OK;
    if (b->p) cudaFreeHost(b->p);
    b->p = NULL, b->cap = 0;
    const int64_t want = need + need / 2 + 64;
    if (cudaMallocHost((void **)&b->p, (size_t)want * sizeof(double)) != cudaSuccess) {
        cudaGetLastError();
        b->p = NULL;
        return gpc_error(GPC_ERR_NOMEM,
                         "md: out of pinned host memory for %lld values (%.1f MiB): use more "
                         "processes or fewer cells",
                         (long long)need, (double)want * sizeof(double) / (1 << 20));
    }
    b->cap = want;
    return GPC_OK;
}

/* Device room for `need` items of `item` bytes in *b; the first `keep`
 * items stay (0: contents dropped). */
gpc_status reserve(md_split_cuda *g, dev_buf *b, int64_t need, size_t item, int64_t keep = 0) {
    if (need <= b->cap && b->p) return GPC_OK;
    const int64_t want = need + need / 2 + 64;
    void *q = NULL;
    if (cudaMalloc(&q, (size_t)want * item) != cudaSuccess) {
        cudaGetLastError();
        return gpc_error(GPC_ERR_NOMEM,
                         "md: out of GPU memory for %lld items of a slab (%.1f MiB): use more "
                         "processes or fewer cells",
                         (long long)need, (double)want * (double)item / (1 << 20));
    }
    if (keep > 0 && b->p)
        GPC_CUDA_CHECK(
            cudaMemcpyAsync(q, b->p, (size_t)keep * item, cudaMemcpyDeviceToDevice, g->stream));
    cudaFree(b->p); /* waits for the copy */
    b->p = q;
    b->cap = want;
    return GPC_OK;
}

double *dbl(const dev_buf &b) {
    return (double *)b.p;
}

int *ints(const dev_buf &b) {
    return (int *)b.p;
}

int64_t *longs(const dev_buf &b) {
    return (int64_t *)b.p;
}

gpc_status wait_flags(md_split_cuda *g) {
    GPC_CUDA_CHECK(cudaMemcpyAsync(g->host_flags, g->flags, sizeof *g->flags,
                                   cudaMemcpyDeviceToHost, g->stream));
    GPC_CUDA_CHECK(cudaStreamSynchronize(g->stream));
    return GPC_OK;
}

gpc_status clear_flags(md_split_cuda *g) {
    GPC_CUDA_CHECK(cudaMemsetAsync(g->flags, 0, sizeof *g->flags, g->stream));
    return GPC_OK;
}

/* at = the exclusive scan of mark over `items` ints. */
gpc_status scan(md_split_cuda *g, const int *mark, int *at, int64_t items) {
    size_t bytes = 0;
    GPC_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(NULL, bytes, mark, at, (int)items, g->stream));
    if (bytes > g->scan_bytes) {
        cudaFree(g->scan_tmp);
        g->scan_tmp = NULL, g->scan_bytes = 0;
        GPC_CUDA_CHECK(cudaMalloc(&g->scan_tmp, bytes));
        g->scan_bytes = bytes;
    }
    bytes = g->scan_bytes;
    GPC_CUDA_CHECK(
        cub::DeviceScan::ExclusiveSum(g->scan_tmp, bytes, mark, at, (int)items, g->stream));
    return GPC_OK;
}

/* The int at device address p, waited for. */
gpc_status read_int(md_split_cuda *g, const int *p, int *out) {
    GPC_CUDA_CHECK(cudaMemcpyAsync(out, p, sizeof *out, cudaMemcpyDeviceToHost, g->stream));
    GPC_CUDA_CHECK(cudaStreamSynchronize(g->stream));
    return GPC_OK;
}

gpc_status too_many(int64_t n) {
    return gpc_error(GPC_ERR_UNSUPPORTED,
                     "md: %lld atoms in one process's slab: at most %d; use more processes",
                     (long long)n, INT_MAX / 4);
}

} // namespace

extern "C" gpc_status md_split_cuda_create(md_split_cuda **out, int device,
                                           const md_split_cuda_slabs *slabs, double atoms,
                                           int64_t row_cap, double rc2, double limit2) {
    *out = NULL;
    size_t free_bytes = 0, total_bytes = 0;
    GPC_TRY(sci_cuda_open("md", device, &free_bytes, &total_bytes));
    /* positions, velocities, forces, build positions, the partition's
     * second arrays, ids, marks and cells, and the rows */
    const double need = atoms * (7 * 24.0 + 2 * 8.0 + 7 * 4.0 + 4.0 * (double)row_cap) * 1.5;
    if (need > (double)free_bytes)
        return gpc_error(GPC_ERR_NOMEM,
                         "md: a slab of about %.0f atoms needs about %.1f GiB of GPU memory, more "
                         "than cuda:%d has free, %.1f GiB (of %.1f): use more processes or fewer "
                         "cells",
                         atoms, need / (1 << 30), device, (double)free_bytes / (1 << 30),
                         (double)total_bytes / (1 << 30));
    md_split_cuda *g = (md_split_cuda *)gpc_calloc(1, sizeof *g);
    if (!g) return gpc_error(GPC_ERR_NOMEM, "md: out of host memory");
    g->device = device;
    slab_of &sl = g->slab;
    sl.rank = slabs->rank, sl.world = slabs->world;
    sl.left = (slabs->rank - 1 + slabs->world) % slabs->world;
    sl.right = (slabs->rank + 1) % slabs->world;
    sl.box = slabs->box, sl.inv_box = 1.0 / slabs->box, sl.width = slabs->width;
    sl.lo = slabs->rank * slabs->width, sl.hi = (slabs->rank + 1) * slabs->width;
    sl.near = slabs->reach + slabs->slack;
    g->rc2 = rc2, g->reach2 = slabs->reach * slabs->reach, g->limit2 = limit2;
    g->row_cap = row_cap;
    /* to the right from the last slab, to the left from the first: the
     * copies land on the far side of the neighbour's slab */
    g->shift[0] = slabs->rank == slabs->world - 1 ? -slabs->box : 0.0;
    g->shift[1] = slabs->rank == 0 ? slabs->box : 0.0;
    cudaDeviceProp prop;
    gpc_status st = GPC_OK;
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess)
        snprintf(g->name, sizeof g->name, "%s (cuda:%d)", prop.name, device);
    else
        snprintf(g->name, sizeof g->name, "cuda:%d", device);
    if (cudaStreamCreate(&g->stream) != cudaSuccess ||
        cudaEventCreateWithFlags(&g->received[0], cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&g->received[1], cudaEventDisableTiming) != cudaSuccess ||
        cudaMalloc((void **)&g->flags, sizeof *g->flags) != cudaSuccess ||
        cudaMallocHost((void **)&g->host_flags, sizeof *g->host_flags) != cudaSuccess) {
        cudaError_t err = cudaGetLastError();
        st = gpc_error(GPC_ERR_DEVICE, "md: cannot set up cuda:%d: %s", device,
                       cudaGetErrorString(err));
    }
    if (st != GPC_OK) {
        md_split_cuda_free(g);
        return st;
    }
    *out = g;
    return GPC_OK;
}

extern "C" void md_split_cuda_free(md_split_cuda *g) {
    if (!g) return;
    cudaSetDevice(g->device);
    dev_buf *buffers[] = {&g->all,     &g->v,       &g->f,          &g->x_built,    &g->all2,
                          &g->v2,      &g->pack,    &g->stage,      &g->span,       &g->id,
                          &g->id2,     &g->send[0], &g->send[1],    &g->mark,       &g->at,
                          &g->cell_of, &g->slot,    &g->cell_atoms, &g->cell_count, &g->cell_start,
                          &g->rows,    &g->count};
    for (size_t k = 0; k < sizeof buffers / sizeof buffers[0]; k++)
        cudaFree(buffers[k]->p);
    cudaFree(g->scan_tmp);
    cudaFree(g->flags);
    if (g->host_flags) cudaFreeHost(g->host_flags);
    host_buf *pinned[] = {&g->leavers, &g->sent, &g->got[0], &g->got[1]};
    for (size_t k = 0; k < sizeof pinned / sizeof pinned[0]; k++)
        if (pinned[k]->p) cudaFreeHost(pinned[k]->p);
    for (int side = 0; side < 2; side++)
        if (g->received[side]) cudaEventDestroy(g->received[side]);
    if (g->stream) cudaStreamDestroy(g->stream);
    gpc_free(g);
}

extern "C" gpc_status md_split_cuda_upload(md_split_cuda *g, int64_t n, const double *x,
                                           const double *v, const int64_t *id) {
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    if (n > INT_MAX / 4) return too_many(n);
    GPC_TRY(reserve(g, &g->all, 3 * n, sizeof(double)));
    GPC_TRY(reserve(g, &g->v, 3 * n, sizeof(double)));
    GPC_TRY(reserve(g, &g->id, n, sizeof(int64_t)));
    g->owned = n, g->ghosts[0] = g->ghosts[1] = 0;
    if (n == 0) return GPC_OK;
    cudaStream_t s = g->stream;
    GPC_CUDA_CHECK(
        cudaMemcpyAsync(g->all.p, x, (size_t)(3 * n) * sizeof(double), cudaMemcpyHostToDevice, s));
    GPC_CUDA_CHECK(
        cudaMemcpyAsync(g->v.p, v, (size_t)(3 * n) * sizeof(double), cudaMemcpyHostToDevice, s));
    GPC_CUDA_CHECK(
        cudaMemcpyAsync(g->id.p, id, (size_t)n * sizeof(int64_t), cudaMemcpyHostToDevice, s));
    GPC_CUDA_CHECK(cudaStreamSynchronize(s)); /* the host's arrays may change after */
    return GPC_OK;
}

extern "C" gpc_status md_split_cuda_wrap(md_split_cuda *g, int *bad, int *stray) {
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    GPC_TRY(clear_flags(g));
    if (g->owned > 0) {
        split_wrap<<<blocks(g->owned), THREADS, 0, g->stream>>>(g->owned, dbl(g->all), g->slab,
                                                                g->flags);
        GPC_CUDA_CHECK_LAUNCH();
    }
    GPC_TRY(wait_flags(g));
    *bad = g->host_flags->bad;
    *stray = g->host_flags->stray;
    return GPC_OK;
}

extern "C" gpc_status md_split_cuda_leave(md_split_cuda *g, int side, const double **out,
                                          int64_t *count) {
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    const int64_t n = g->owned;
    *out = g->leavers.p;
    *count = 0;
    if (n == 0) return GPC_OK;
    cudaStream_t s = g->stream;
    GPC_TRY(reserve(g, &g->mark, n + 1, sizeof(int)));
    GPC_TRY(reserve(g, &g->at, n + 1, sizeof(int)));
    split_mark_leavers<<<blocks(n + 1), THREADS, 0, s>>>(n, dbl(g->all), g->slab, side,
                                                         ints(g->mark));
    GPC_CUDA_CHECK_LAUNCH();
    GPC_TRY(scan(g, ints(g->mark), ints(g->at), n + 1));
    int leaving = 0;
    GPC_TRY(read_int(g, ints(g->at) + n, &leaving));
    if (leaving == 0) return GPC_OK;
    GPC_TRY(reserve(g, &g->all2, 3 * n, sizeof(double)));
    GPC_TRY(reserve(g, &g->v2, 3 * n, sizeof(double)));
    GPC_TRY(reserve(g, &g->id2, n, sizeof(int64_t)));
    GPC_TRY(reserve(g, &g->pack, 7 * (int64_t)leaving, sizeof(double)));
    split_partition<<<blocks(n), THREADS, 0, s>>>(n, ints(g->mark), ints(g->at), dbl(g->all),
                                                  dbl(g->v), longs(g->id), dbl(g->all2), dbl(g->v2),
                                                  longs(g->id2), dbl(g->pack));
    GPC_CUDA_CHECK_LAUNCH();
    GPC_TRY(host_room(&g->leavers, 7 * (int64_t)leaving));
    GPC_CUDA_CHECK(cudaMemcpyAsync(g->leavers.p, g->pack.p,
                                   (size_t)(7 * (int64_t)leaving) * sizeof(double),
                                   cudaMemcpyDeviceToHost, s));
    GPC_CUDA_CHECK(cudaStreamSynchronize(s));
    /* the stayers' arrays become the slab's */
    dev_buf t = g->all;
    g->all = g->all2, g->all2 = t;
    t = g->v, g->v = g->v2, g->v2 = t;
    t = g->id, g->id = g->id2, g->id2 = t;
    g->owned = n - leaving;
    *out = g->leavers.p;
    *count = leaving;
    return GPC_OK;
}

extern "C" gpc_status md_split_cuda_arrive(md_split_cuda *g, const double *in, int64_t count) {
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    if (count == 0) return GPC_OK;
    const int64_t n = g->owned, total = n + count;
    if (total > INT_MAX / 4) return too_many(total);
    GPC_TRY(reserve(g, &g->all, 3 * total, sizeof(double), 3 * n));
    GPC_TRY(reserve(g, &g->v, 3 * total, sizeof(double), 3 * n));
    GPC_TRY(reserve(g, &g->id, total, sizeof(int64_t), n));
    GPC_TRY(reserve(g, &g->stage, 7 * count, sizeof(double)));
    GPC_CUDA_CHECK(cudaMemcpyAsync(g->stage.p, in, (size_t)(7 * count) * sizeof(double),
                                   cudaMemcpyHostToDevice, g->stream));
    split_unpack<<<blocks(count), THREADS, 0, g->stream>>>(count, dbl(g->stage), n, dbl(g->all),
                                                           dbl(g->v), longs(g->id));
    GPC_CUDA_CHECK_LAUNCH();
    /* `in` is the host's receive buffer, which the next exchange reuses */
    GPC_CUDA_CHECK(cudaStreamSynchronize(g->stream));
    g->owned = total;
    return GPC_OK;
}

extern "C" gpc_status md_split_cuda_choose(md_split_cuda *g, int64_t sends[2]) {
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    const int64_t n = g->owned;
    cudaStream_t s = g->stream;
    GPC_TRY(reserve(g, &g->mark, 2 * (n + 1), sizeof(int)));
    GPC_TRY(reserve(g, &g->at, 2 * (n + 1), sizeof(int)));
    split_mark_faces<<<blocks(n + 1), THREADS, 0, s>>>(n, dbl(g->all), g->slab, ints(g->mark));
    GPC_CUDA_CHECK_LAUNCH();
    /* each half scanned alone: right, then left */
    GPC_TRY(scan(g, ints(g->mark), ints(g->at), n + 1));
    GPC_TRY(scan(g, ints(g->mark) + n + 1, ints(g->at) + n + 1, n + 1));
    int right = 0, left = 0;
    GPC_TRY(read_int(g, ints(g->at) + n, &right));
    GPC_TRY(read_int(g, ints(g->at) + 2 * n + 1, &left));
    GPC_TRY(reserve(g, &g->send[0], right, sizeof(int64_t)));
    GPC_TRY(reserve(g, &g->send[1], left, sizeof(int64_t)));
    if (n > 0) {
        split_scatter_sends<<<blocks(n), THREADS, 0, s>>>(n, ints(g->mark), ints(g->at),
                                                          longs(g->send[0]), longs(g->send[1]));
        GPC_CUDA_CHECK_LAUNCH();
    }
    g->sends[0] = sends[0] = right;
    g->sends[1] = sends[1] = left;
    g->ghosts[0] = g->ghosts[1] = 0;
    return GPC_OK;
}

/* Both sides' positions into g->pack on the device, the right's first. */
static gpc_status pack_sides(md_split_cuda *g) {
    GPC_TRY(reserve(g, &g->pack, 3 * (g->sends[0] + g->sends[1]), sizeof(double)));
    for (int side = 0, at = 0; side < 2; at += (int)g->sends[side], side++) {
        const int64_t count = g->sends[side];
        if (count == 0) continue;
        split_pack<<<blocks(count), THREADS, 0, g->stream>>>(
            count, longs(g->send[side]), dbl(g->all), g->shift[side], dbl(g->pack) + 3 * at);
        GPC_CUDA_CHECK_LAUNCH();
    }
    return GPC_OK;
}

extern "C" gpc_status md_split_cuda_pack(md_split_cuda *g, const double *out[2]) {
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    const int64_t total = g->sends[0] + g->sends[1];
    GPC_TRY(pack_sides(g));
    GPC_TRY(host_room(&g->sent, 3 * total));
    out[0] = g->sent.p, out[1] = g->sent.p + 3 * g->sends[0];
    if (total == 0) return GPC_OK;
    GPC_CUDA_CHECK(cudaMemcpyAsync(g->sent.p, g->pack.p, (size_t)(3 * total) * sizeof(double),
                                   cudaMemcpyDeviceToHost, g->stream));
    GPC_CUDA_CHECK(cudaStreamSynchronize(g->stream));
    return GPC_OK;
}

extern "C" gpc_status md_split_cuda_ghost_room(md_split_cuda *g, int side, int64_t values,
                                               double **in) {
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    /* the last upload from this side's buffer is done before it is reused */
    GPC_CUDA_CHECK(cudaEventSynchronize(g->received[side]));
    GPC_TRY(host_room(&g->got[side], values));
    *in = g->got[side].p;
    return GPC_OK;
}

/* A build's `count` ghosts from `side`: room for them in g->all after the
 * owned atoms and (side 1) the left's ghosts, which stay. */
static gpc_status ghost_slots(md_split_cuda *g, int side, int64_t count) {
    const int64_t at = g->owned + (side == 0 ? 0 : g->ghosts[0]);
    if (at + count > INT_MAX / 4) return too_many(at + count);
    GPC_TRY(reserve(g, &g->all, 3 * (at + count), sizeof(double), 3 * at));
    g->ghosts[side] = count;
    return GPC_OK;
}

extern "C" gpc_status md_split_cuda_ghosts(md_split_cuda *g, int side, int64_t count) {
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    if (count >= 0) GPC_TRY(ghost_slots(g, side, count));
    const int64_t at = g->owned + (side == 0 ? 0 : g->ghosts[0]);
    count = g->ghosts[side];
    if (count == 0) return GPC_OK;
    if (3 * count > g->got[side].cap)
        return gpc_error(GPC_ERR_INTERNAL, "md: %lld ghosts from side %d, room for %lld",
                         (long long)count, side, (long long)(g->got[side].cap / 3));
    GPC_CUDA_CHECK(cudaMemcpyAsync(dbl(g->all) + 3 * at, g->got[side].p,
                                   (size_t)(3 * count) * sizeof(double), cudaMemcpyHostToDevice,
                                   g->stream));
    GPC_CUDA_CHECK(cudaEventRecord(g->received[side], g->stream));
    return GPC_OK;
}

extern "C" gpc_status md_split_cuda_forward_peers(md_split_cuda *g, gpc_dist *peers,
                                                  const int to[2], const int from[2],
                                                  const int64_t *arriving) {
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    const int64_t n = g->owned;
    for (int side = 0; arriving && side < 2; side++) /* a build's: new numbers */
        GPC_TRY(ghost_slots(g, side, arriving[side]));
    GPC_TRY(pack_sides(g));
    /* positions as bytes: the sends and receives copy, they do not compute */
    const size_t atom = 3 * sizeof(double);
    char *packed = (char *)g->pack.p, *ghosts = (char *)g->all.p + (size_t)n * atom;
    GPC_TRY(peers->ops->group_start(peers));
    gpc_status st = GPC_OK;
    for (int side = 0; side < 2 && !st; side++) {
        /* a side with nothing to move is skipped on both ends: the
         * receiver's count is the sender's */
        if (g->sends[side] > 0)
            st = peers->ops->send(peers, packed, (size_t)g->sends[side] * atom, GPC_I8, to[side],
                                  g->stream);
        if (!st && g->ghosts[side] > 0)
            st = peers->ops->recv(peers, ghosts, (size_t)g->ghosts[side] * atom, GPC_I8, from[side],
                                  g->stream);
        packed += (size_t)g->sends[side] * atom;
        ghosts += (size_t)g->ghosts[side] * atom;
    }
    const gpc_status ended = peers->ops->group_end(peers); /* a group opened is closed */
    return st ? st : ended;
}

extern "C" gpc_status md_split_cuda_list(md_split_cuda *g, int64_t *pairs) {
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    const int64_t n = g->owned, total = n + g->ghosts[0] + g->ghosts[1];
    cudaStream_t s = g->stream;
    GPC_TRY(reserve(g, &g->f, 3 * n, sizeof(double)));
    GPC_TRY(reserve(g, &g->x_built, 3 * n, sizeof(double)));
    GPC_TRY(reserve(g, &g->count, n, sizeof(int32_t)));
    GPC_TRY(reserve(g, &g->cell_of, total, sizeof(int)));
    GPC_TRY(reserve(g, &g->slot, total, sizeof(int)));
    GPC_TRY(reserve(g, &g->cell_atoms, total, sizeof(int)));
    GPC_TRY(reserve(g, &g->span, 2, sizeof(double)));
    if (n > 0)
        GPC_CUDA_CHECK(cudaMemcpyAsync(g->x_built.p, g->all.p, (size_t)(3 * n) * sizeof(double),
                                       cudaMemcpyDeviceToDevice, s));

    /* the host's grid: along x over the span of the positions */
    double span[2] = {0, 0};
    if (total > 0) {
        split_span<<<1, 1024, 0, s>>>(total, dbl(g->all), dbl(g->span));
        GPC_CUDA_CHECK_LAUNCH();
        GPC_CUDA_CHECK(cudaMemcpyAsync(span, g->span.p, sizeof span, cudaMemcpyDeviceToHost, s));
        GPC_CUDA_CHECK(cudaStreamSynchronize(s));
    }
    const double xmin = span[0], xmax = span[1], reach = sqrt(g->reach2);
    cell_grid grid;
    grid.mx = (int)floor((xmax - xmin) / reach);
    if (grid.mx < 1) grid.mx = 1;
    grid.cw = (xmax - xmin) / grid.mx > 0 ? (xmax - xmin) / grid.mx : 1.0;
    grid.m = (int)floor(g->slab.box / reach);
    if (grid.m < 1) grid.m = 1;
    grid.xmin = xmin, grid.inv_box = g->slab.inv_box;
    const int64_t cells = (int64_t)grid.mx * grid.m * grid.m;
    if (cells > INT_MAX / 4 || total > INT_MAX / 4) return too_many(total);
    GPC_TRY(reserve(g, &g->cell_count, cells, sizeof(int)));
    GPC_TRY(reserve(g, &g->cell_start, cells, sizeof(int)));
    int *cell_count = ints(g->cell_count), *cell_start = ints(g->cell_start);
    GPC_CUDA_CHECK(cudaMemsetAsync(cell_count, 0, (size_t)cells * sizeof(int), s));
    if (total > 0) {
        split_bin<<<blocks(total), THREADS, 0, s>>>(total, dbl(g->all), grid, ints(g->cell_of),
                                                    ints(g->slot), cell_count);
        GPC_CUDA_CHECK_LAUNCH();
    }
    GPC_TRY(scan(g, cell_count, cell_start, cells));
    if (total > 0) {
        split_scatter<<<blocks(total), THREADS, 0, s>>>(total, ints(g->cell_of), ints(g->slot),
                                                        cell_start, ints(g->cell_atoms));
        GPC_CUDA_CHECK_LAUNCH();
    }
    split_sort_cells<<<blocks(cells), THREADS, 0, s>>>(cells, cell_start, cell_count,
                                                       ints(g->cell_atoms));
    GPC_CUDA_CHECK_LAUNCH();

    /* rows that overflow make the build run again with more slots */
    for (;;) {
        GPC_TRY(reserve(g, &g->rows, n * g->row_cap, sizeof(int32_t)));
        GPC_TRY(clear_flags(g));
        if (n > 0) {
            split_build<<<blocks(n), THREADS, 0, s>>>(
                n, dbl(g->all), grid, cell_start, cell_count, ints(g->cell_atoms), g->slab.box,
                g->reach2, (int32_t *)g->rows.p, (int32_t *)g->count.p, g->row_cap, g->flags);
            GPC_CUDA_CHECK_LAUNCH();
        }
        GPC_TRY(wait_flags(g));
        const int64_t longest = g->host_flags->longest;
        if (longest <= g->row_cap) break;
        g->row_cap = longest + longest / 4 + 8;
    }
    *pairs = (int64_t)g->host_flags->pairs;
    return GPC_OK;
}

extern "C" gpc_status md_split_cuda_forces(md_split_cuda *g, double half_dt, int thermo,
                                           double *potential, double *virial) {
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    const int64_t n = g->owned;
    if (thermo) GPC_TRY(clear_flags(g));
    if (n > 0) {
        auto kernel = thermo ? split_forces<true> : split_forces<false>;
        kernel<<<blocks(n), THREADS, 0, g->stream>>>(
            n, dbl(g->all), (const int32_t *)g->rows.p, (const int32_t *)g->count.p, g->row_cap,
            g->slab.box, g->slab.inv_box, g->rc2, dbl(g->f), dbl(g->v), half_dt, g->flags);
        GPC_CUDA_CHECK_LAUNCH();
    }
    if (!thermo) return GPC_OK;
    GPC_TRY(wait_flags(g));
    *potential = g->host_flags->potential;
    *virial = g->host_flags->virial;
    return GPC_OK;
}

extern "C" gpc_status md_split_cuda_drift(md_split_cuda *g, double half_dt, double dt,
                                          int moved[2]) {
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    GPC_TRY(clear_flags(g));
    if (g->owned > 0) {
        split_drift<<<blocks(g->owned), THREADS, 0, g->stream>>>(g->owned, dbl(g->all), dbl(g->v),
                                                                 dbl(g->f), dbl(g->x_built),
                                                                 half_dt, dt, g->limit2, g->flags);
        GPC_CUDA_CHECK_LAUNCH();
    }
    GPC_TRY(wait_flags(g));
    moved[0] = g->host_flags->moved;
    moved[1] = g->host_flags->bad;
    return GPC_OK;
}

extern "C" gpc_status md_split_cuda_v2(md_split_cuda *g, double *v2) {
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    GPC_TRY(clear_flags(g));
    if (g->owned > 0) {
        split_v2<<<blocks(g->owned), THREADS, 0, g->stream>>>(g->owned, dbl(g->v), g->flags);
        GPC_CUDA_CHECK_LAUNCH();
    }
    GPC_TRY(wait_flags(g));
    *v2 = g->host_flags->v2;
    return GPC_OK;
}

extern "C" int64_t md_split_cuda_owned(const md_split_cuda *g) {
    return g->owned;
}

extern "C" gpc_status md_split_cuda_download(md_split_cuda *g, double *x, double *v, int64_t *id) {
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    const int64_t n = g->owned;
    if (x && n)
        GPC_CUDA_CHECK(cudaMemcpyAsync(x, g->all.p, (size_t)(3 * n) * sizeof(double),
                                       cudaMemcpyDeviceToHost, g->stream));
    if (v && n)
        GPC_CUDA_CHECK(cudaMemcpyAsync(v, g->v.p, (size_t)(3 * n) * sizeof(double),
                                       cudaMemcpyDeviceToHost, g->stream));
    if (id && n)
        GPC_CUDA_CHECK(cudaMemcpyAsync(id, g->id.p, (size_t)n * sizeof(int64_t),
                                       cudaMemcpyDeviceToHost, g->stream));
    GPC_CUDA_CHECK(cudaStreamSynchronize(g->stream));
    return GPC_OK;
}

extern "C" const char *md_split_cuda_device_name(const md_split_cuda *g) {
    return g->name;
}
