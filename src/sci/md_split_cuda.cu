/*
 * md_split_cuda.cu: one process's slab of a split `gpc md` run on its GPU
 * (md_split_cuda.h says what the host and the GPU each do).
 *
 * A build bins every atom (owned and ghost) into cells: a count a cell,
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
    int moved, bad, longest;
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

template <typename T> __device__ T block_sum(T value, T *shared) {
    shared[threadIdx.x] = value;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
        __syncthreads();
    }
    return shared[0];
}

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
    int *a = cell_atoms + cell_start[c];
    const int n = cell_count[c];
    for (int i = 1; i < n; i++) {
        const int key = a[i];
        int k = i - 1;
        while (k >= 0 && a[k] > key) {
            a[k + 1] = a[k];
            k--;
        }
        a[k + 1] = key;
    }
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
        __syncthreads();
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

unsigned blocks(int64_t items) {
    return (unsigned)((items + THREADS - 1) / THREADS);
}

} // namespace

/* A device buffer and the items it has room for. */
struct dev_buf {
    void *p;
    int64_t cap;
};

struct md_split_cuda {
    int device;
    char name[300];
    cudaStream_t stream;
    double box, inv_box, rc2, reach, reach2, limit2;
    int64_t owned, ghosts[2], sends[2], row_cap;
    double shift[2];
    /* doubles: all (owned positions, then the ghosts'), v, f, x_built
     * (owned), pack (the larger side's); int64: send[2]; int: cell_of,
     * slot, cell_atoms (every atom), cell_count, cell_start (every cell);
     * int32: rows (owned x row_cap), count (owned) */
    dev_buf all, v, f, x_built, pack, send[2], cell_of, slot, cell_atoms, cell_count, cell_start,
        rows, count;
    void *scan_tmp;
    size_t scan_bytes;
    split_flags *flags, *host_flags;
};

namespace {

/* Device room for `need` items of `item` bytes in *b (contents dropped). */
gpc_status reserve(dev_buf *b, int64_t need, size_t item) {
    if (need <= b->cap && b->p) return GPC_OK;
    const int64_t want = need + need / 2 + 64;
    cudaFree(b->p);
    b->p = NULL;
    b->cap = 0;
    if (cudaMalloc(&b->p, (size_t)want * item) != cudaSuccess) {
        cudaGetLastError();
        b->p = NULL;
        return gpc_error(GPC_ERR_NOMEM,
                         "md: out of GPU memory for %lld items of a slab (%.1f MiB): use more "
                         "processes or fewer cells",
                         (long long)need, (double)want * (double)item / (1 << 20));
    }
    b->cap = want;
    return GPC_OK;
}

double *dbl(const dev_buf &b) {
    return (double *)b.p;
}

int *ints(const dev_buf &b) {
    return (int *)b.p;
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

} // namespace

extern "C" gpc_status md_split_cuda_create(md_split_cuda **out, int device, double atoms,
                                           int64_t row_cap, double box, double rc2, double reach,
                                           double limit2) {
    *out = NULL;
    size_t free_bytes = 0, total_bytes = 0;
    GPC_TRY(sci_cuda_open("md", device, &free_bytes, &total_bytes));
    /* positions, velocities, forces, build positions, pack, cells and rows */
    const double need = atoms * (5 * 24.0 + 4 * 4.0 + 4.0 * (double)row_cap) * 1.5;
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
    g->box = box, g->inv_box = 1.0 / box, g->rc2 = rc2, g->reach = reach;
    g->reach2 = reach * reach, g->limit2 = limit2, g->row_cap = row_cap;
    cudaDeviceProp prop;
    gpc_status st = GPC_OK;
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess)
        snprintf(g->name, sizeof g->name, "%s (cuda:%d)", prop.name, device);
    else
        snprintf(g->name, sizeof g->name, "cuda:%d", device);
    if (cudaStreamCreate(&g->stream) != cudaSuccess ||
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
    dev_buf *buffers[] = {&g->all,        &g->v,          &g->f,       &g->x_built, &g->pack,
                          &g->send[0],    &g->send[1],    &g->cell_of, &g->slot,    &g->cell_atoms,
                          &g->cell_count, &g->cell_start, &g->rows,    &g->count};
    for (size_t k = 0; k < sizeof buffers / sizeof buffers[0]; k++)
        cudaFree(buffers[k]->p);
    cudaFree(g->scan_tmp);
    cudaFree(g->flags);
    if (g->host_flags) cudaFreeHost(g->host_flags);
    if (g->stream) cudaStreamDestroy(g->stream);
    gpc_free(g);
}

extern "C" gpc_status md_split_cuda_build(md_split_cuda *g, const md_split_cuda_load *load,
                                          int64_t *pairs) {
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    const int64_t n = load->owned, total = n + load->ghosts[0] + load->ghosts[1];
    GPC_TRY(reserve(&g->all, 3 * total, sizeof(double)));
    GPC_TRY(reserve(&g->v, 3 * n, sizeof(double)));
    GPC_TRY(reserve(&g->f, 3 * n, sizeof(double)));
    GPC_TRY(reserve(&g->x_built, 3 * n, sizeof(double)));
    GPC_TRY(reserve(&g->count, n, sizeof(int32_t)));
    GPC_TRY(reserve(&g->cell_of, total, sizeof(int)));
    GPC_TRY(reserve(&g->slot, total, sizeof(int)));
    GPC_TRY(reserve(&g->cell_atoms, total, sizeof(int)));
    g->owned = n, g->ghosts[0] = load->ghosts[0], g->ghosts[1] = load->ghosts[1];
    cudaStream_t s = g->stream;
    GPC_CUDA_CHECK(cudaMemcpyAsync(g->all.p, load->all, (size_t)(3 * total) * sizeof(double),
                                   cudaMemcpyHostToDevice, s));
    GPC_CUDA_CHECK(cudaMemcpyAsync(g->v.p, load->v, (size_t)(3 * n) * sizeof(double),
                                   cudaMemcpyHostToDevice, s));
    GPC_CUDA_CHECK(cudaMemcpyAsync(g->x_built.p, g->all.p, (size_t)(3 * n) * sizeof(double),
                                   cudaMemcpyDeviceToDevice, s));
    int64_t most = 0;
    for (int side = 0; side < 2; side++) {
        g->sends[side] = load->sends[side], g->shift[side] = load->shift[side];
        GPC_TRY(reserve(&g->send[side], load->sends[side], sizeof(int64_t)));
        if (load->sends[side] > 0)
            GPC_CUDA_CHECK(cudaMemcpyAsync(g->send[side].p, load->send[side],
                                           (size_t)load->sends[side] * sizeof(int64_t),
                                           cudaMemcpyHostToDevice, s));
        if (load->sends[side] > most) most = load->sends[side];
    }
    GPC_TRY(reserve(&g->pack, 3 * most, sizeof(double)));

    /* the host's grid: along x over the span of the positions */
    double xmin = INFINITY, xmax = -INFINITY;
    for (int64_t j = 0; j < total; j++)
        xmin = fmin(xmin, load->all[3 * j]), xmax = fmax(xmax, load->all[3 * j]);
    if (total == 0) xmin = xmax = 0;
    cell_grid grid;
    grid.mx = (int)floor((xmax - xmin) / g->reach);
    if (grid.mx < 1) grid.mx = 1;
    grid.cw = (xmax - xmin) / grid.mx > 0 ? (xmax - xmin) / grid.mx : 1.0;
    grid.m = (int)floor(g->box / g->reach);
    if (grid.m < 1) grid.m = 1;
    grid.xmin = xmin, grid.inv_box = g->inv_box;
    const int64_t cells = (int64_t)grid.mx * grid.m * grid.m;
    if (cells > INT_MAX / 2 || total > INT_MAX / 2)
        return gpc_error(GPC_ERR_UNSUPPORTED, "md: %lld atoms in %lld cells: too many for a slab",
                         (long long)total, (long long)cells);
    GPC_TRY(reserve(&g->cell_count, cells, sizeof(int)));
    GPC_TRY(reserve(&g->cell_start, cells, sizeof(int)));
    int *cell_count = ints(g->cell_count), *cell_start = ints(g->cell_start);
    size_t bytes = 0;
    GPC_CUDA_CHECK(
        cub::DeviceScan::ExclusiveSum(NULL, bytes, cell_count, cell_start, (int)cells, s));
    if (bytes > g->scan_bytes) {
        cudaFree(g->scan_tmp);
        g->scan_tmp = NULL, g->scan_bytes = 0;
        GPC_CUDA_CHECK(cudaMalloc(&g->scan_tmp, bytes));
        g->scan_bytes = bytes;
    }
    GPC_CUDA_CHECK(cudaMemsetAsync(cell_count, 0, (size_t)cells * sizeof(int), s));
    if (total > 0) {
        split_bin<<<blocks(total), THREADS, 0, s>>>(total, dbl(g->all), grid, ints(g->cell_of),
                                                    ints(g->slot), cell_count);
        GPC_CUDA_CHECK_LAUNCH();
    }
    bytes = g->scan_bytes;
    GPC_CUDA_CHECK(
        cub::DeviceScan::ExclusiveSum(g->scan_tmp, bytes, cell_count, cell_start, (int)cells, s));
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
        GPC_TRY(reserve(&g->rows, n * g->row_cap, sizeof(int32_t)));
        GPC_TRY(clear_flags(g));
        if (n > 0) {
            split_build<<<blocks(n), THREADS, 0, s>>>(
                n, dbl(g->all), grid, cell_start, cell_count, ints(g->cell_atoms), g->box,
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
            g->box, g->inv_box, g->rc2, dbl(g->f), dbl(g->v), half_dt, g->flags);
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

extern "C" gpc_status md_split_cuda_pack(md_split_cuda *g, int side, double *out) {
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    const int64_t count = g->sends[side];
    if (count == 0) return GPC_OK;
    split_pack<<<blocks(count), THREADS, 0, g->stream>>>(count, (const int64_t *)g->send[side].p,
                                                         dbl(g->all), g->shift[side], dbl(g->pack));
    GPC_CUDA_CHECK_LAUNCH();
    GPC_CUDA_CHECK(cudaMemcpyAsync(out, g->pack.p, (size_t)(3 * count) * sizeof(double),
                                   cudaMemcpyDeviceToHost, g->stream));
    GPC_CUDA_CHECK(cudaStreamSynchronize(g->stream));
    return GPC_OK;
}

extern "C" gpc_status md_split_cuda_ghosts(md_split_cuda *g, int side, const double *in) {
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    const int64_t at = g->owned + (side == 0 ? 0 : g->ghosts[0]), count = g->ghosts[side];
    if (count == 0) return GPC_OK;
    GPC_CUDA_CHECK(cudaMemcpyAsync(dbl(g->all) + 3 * at, in, (size_t)(3 * count) * sizeof(double),
                                   cudaMemcpyHostToDevice, g->stream));
    /* `in` is the host's receive buffer, which the next exchange reuses */
    GPC_CUDA_CHECK(cudaStreamSynchronize(g->stream));
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

extern "C" gpc_status md_split_cuda_download(md_split_cuda *g, double *x, double *v) {
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    const size_t bytes = (size_t)(3 * g->owned) * sizeof(double);
    if (x && bytes)
        GPC_CUDA_CHECK(cudaMemcpyAsync(x, g->all.p, bytes, cudaMemcpyDeviceToHost, g->stream));
    if (v && bytes)
        GPC_CUDA_CHECK(cudaMemcpyAsync(v, g->v.p, bytes, cudaMemcpyDeviceToHost, g->stream));
    GPC_CUDA_CHECK(cudaStreamSynchronize(g->stream));
    return GPC_OK;
}

extern "C" const char *md_split_cuda_device_name(const md_split_cuda *g) {
    return g->name;
}
