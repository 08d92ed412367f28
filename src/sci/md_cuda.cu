/*
 * md_cuda.cu: Lennard-Jones molecular dynamics on one GPU (md_cuda.h), the
 * same physics as md.c: LAMMPS's lj/cut (4 (r^-12 - r^-6), unshifted, cut at
 * rc), velocity Verlet at constant energy, a neighbour list with a skin
 * rebuilt when an atom moved over half of it (or every N steps).
 *
 * A time step is a fixed queue of kernels on one stream; the host reads
 * nothing back until the end of gpc_md_cuda_run:
 *   integrate    v += dt/2 f (ending the step before), v += dt/2 f, x += dt v,
 *                and a flag when an atom moved over half the skin since the
 *                last build (so the maximum displacement is a reduction into
 *                one flag, never a copy)
 *   decide       the flag (or the fixed interval) becomes "rebuild"
 *   build        every build kernel returns at once unless "rebuild" is set:
 *                wrap positions into the box and bin them into cells at
 *                least cutoff + skin wide; a counting sort by cell (counts,
 *                CUB's prefix scan, a scatter, then each cell's atoms put
 *                back in their previous order so the sort is stable and a
 *                run is deterministic); positions, velocities and ids
 *                gathered into the new order; a full neighbour list (both
 *                halves of each pair) from the 27 cells around each atom
 *   forces       one thread per atom over its row: no atomics, and the rows
 *                stored column-major (slot k of atom i at k * atoms + i) so a
 *                warp's loads of slot k are one coalesced line
 *   (last step)  the closing half kick and the thermo sums
 *
 * Precision: positions, velocities and forces are float64, as on the CPU
 * (an fp32 coordinate of a 33-wide box carries 4e-6 of rounding, which
 * moves the printed energy's seventh digit; pair forces of 50 that cancel
 * to 10 carry float32's rounding into every step). By the model in
 * bench/md_gpu.sh the step is bound by memory well before the H200's
 * float64 rate (half its float32 rate), so this should cost little there; --forces f32 computes and
 * sums the pair forces in float32 (separations still taken in float64) for GPUs with little
 * float64. On the steps whose thermo is reported the pair energy and virial are computed in float64
 * and reduced in float64 in a fixed order (per block, then one block over the blocks), the same
 * from run to run.
 *
 * Each pair's periodic image is the nearest one, taken per pair: positions
 * are wrapped at each build, move less than half the skin before the next,
 * and the box is more than twice cutoff + skin wide, so the image within
 * the cutoff, when there is one, is the nearest.
 */
#include "sci/md_cuda.h"

#include "cuda/cuda_common.cuh"

#include <climits>
#include <cub/device/device_scan.cuh>
#include <math.h>
#include <stdio.h>

namespace {

constexpr int ATOM_THREADS = 128;   /* one thread per atom; also the thermo partials' block */
constexpr int REDUCE_THREADS = 256; /* the one block that sums the partials */
constexpr int LOOP_BLOCKS_PER_SM = 8;

/* One atom's position or velocity: 32 bytes, so a gather is two 16-byte
 * loads from one sector pair. */
struct __align__(32) md_vec {
    double x, y, z, w;
};
static_assert(sizeof(md_vec) == 32, "one atom's vector is 32 bytes");

/* What the kernels tell the host and each other, in one struct so that a
 * run's end reads it back with one copy. */
struct md_flags {
    int rebuild;           /* the build kernels run this step */
    int moved;             /* an atom moved over half the skin since the build */
    int overflow;          /* a row had more partners than slots */
    int longest;           /* the most partners a row wanted */
    long long blowup_step; /* the first step with a position not finite; LLONG_MAX: none */
    long long builds, dangerous;
    long long pairs; /* gpc_md_cuda_pairs's count (twice the pairs) */
    double potential, virial, v2;
};

template <typename T> __device__ T block_sum(T value, T *shared) {
    shared[threadIdx.x] = value;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
        __syncthreads();
    }
    T total = shared[0];
    __syncthreads(); /* the caller may use shared again */
    return total;
}

__device__ __forceinline__ double wrap(double p, double box, double inv_box) {
    double w = p - box * floor(p * inv_box);
    /* w = box or w < 0: rounding at the faces (md.c does the same) */
    return (w >= box || w < 0 || !isfinite(w)) ? 0.0 : w;
}

__device__ __forceinline__ int cell_index(double p, double inv_box, int m) {
    int c = (int)(p * inv_box * m); /* md.c's expression, so the cells agree */
    return c >= m ? m - 1 : (c < 0 ? 0 : c);
}

__device__ __forceinline__ double nearest(double d, double box, double inv_box) {
    return d - box * rint(d * inv_box);
}

/* ------------------------------------------------------------ the step */

__global__ void md_integrate(int64_t n, md_vec *__restrict__ x, md_vec *__restrict__ v,
                             const md_vec *__restrict__ f, const md_vec *__restrict__ x_built,
                             double dt, double half_dt, int finish_previous, double limit2,
                             long long step, md_flags *flags) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    md_vec vi = v[i];
    const md_vec fi = f[i];
    if (finish_previous) { /* the closing half kick of the step before */
        vi.x += half_dt * fi.x, vi.y += half_dt * fi.y, vi.z += half_dt * fi.z;
    }
    vi.x += half_dt * fi.x, vi.y += half_dt * fi.y, vi.z += half_dt * fi.z;
    md_vec xi = x[i];
    xi.x += dt * vi.x, xi.y += dt * vi.y, xi.z += dt * vi.z;
    v[i] = vi;
    x[i] = xi;
    const md_vec b = x_built[i];
    double dx = xi.x - b.x, dy = xi.y - b.y, dz = xi.z - b.z;
    /* written so that NaN counts as moved: a blown-up atom forces a build */
    if (!(dx * dx + dy * dy + dz * dz <= limit2)) flags->moved = 1;
    if (!isfinite(xi.x) || !isfinite(xi.y) || !isfinite(xi.z)) atomicMin(&flags->blowup_step, step);
}

/* forced: -1 rebuild when an atom moved over half the skin; 0 or 1 the
 * fixed interval's decision, a build after such a move being dangerous. */
__global__ void md_decide(md_flags *flags, int forced) {
    int moved = flags->moved;
    flags->moved = 0;
    if (forced > 0 && moved) flags->dangerous++;
    flags->rebuild = forced < 0 ? moved : forced;
}

__global__ void md_force_rebuild(md_flags *flags) {
    flags->rebuild = 1;
    flags->moved = 0;
}

/* ----------------------------------------------------------- the build */

__global__ void md_clear_cells(int64_t cells, int *cell_count, const md_flags *flags) {
    if (!flags->rebuild) return;
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c <= cells;
         c += (int64_t)gridDim.x * blockDim.x)
        cell_count[c] = 0;
}

__global__ void md_bin(int64_t n, md_vec *__restrict__ x, double box, double inv_box, int m,
                       int *__restrict__ cell_of, int *__restrict__ cell_rank,
                       int *__restrict__ cell_count, long long step, md_flags *flags) {
    if (!flags->rebuild) return;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        md_vec p = x[i];
        if (!isfinite(p.x) || !isfinite(p.y) || !isfinite(p.z))
            atomicMin(&flags->blowup_step, step);
        p.x = wrap(p.x, box, inv_box), p.y = wrap(p.y, box, inv_box), p.z = wrap(p.z, box, inv_box);
        x[i] = p;
        int c = (cell_index(p.z, inv_box, m) * m + cell_index(p.y, inv_box, m)) * m +
                cell_index(p.x, inv_box, m);
        cell_of[i] = c;
        cell_rank[i] = atomicAdd(&cell_count[c], 1);
    }
}

__global__ void md_scatter(int64_t n, const int *__restrict__ cell_of,
                           const int *__restrict__ cell_rank, const int *__restrict__ cell_start,
                           int *__restrict__ order, const md_flags *flags) {
    if (!flags->rebuild) return;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        order[cell_start[cell_of[i]] + cell_rank[i]] = (int)i;
}

/* The atomics gave each cell's atoms in any order: put them back in their
 * previous order (insertion sort of about 20), as md.c's stable sort has. */
__global__ void md_sort_cells(int64_t cells, const int *__restrict__ cell_start,
                              int *__restrict__ order, const md_flags *flags) {
    if (!flags->rebuild) return;
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < cells;
         c += (int64_t)gridDim.x * blockDim.x) {
        const int lo = cell_start[c], hi = cell_start[c + 1];
        for (int a = lo + 1; a < hi; a++) {
            int key = order[a], b = a - 1;
            while (b >= lo && order[b] > key) {
                order[b + 1] = order[b];
                b--;
            }
            order[b + 1] = key;
        }
    }
}

__global__ void md_gather(int64_t n, const int *__restrict__ order, const md_vec *__restrict__ x,
                          const md_vec *__restrict__ v, const long long *__restrict__ id,
                          md_vec *__restrict__ x_out, md_vec *__restrict__ v_out,
                          long long *__restrict__ id_out, const md_flags *flags) {
    if (!flags->rebuild) return;
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < n;
         p += (int64_t)gridDim.x * blockDim.x) {
        const int j = order[p];
        x_out[p] = x[j], v_out[p] = v[j], id_out[p] = id[j];
    }
}

/* Back into the arrays the step uses (the host does not know whether a
 * build ran, so it cannot swap pointers); x_built is the new start. */
__global__ void md_copy_back(int64_t n, const md_vec *__restrict__ x_in,
                             const md_vec *__restrict__ v_in, const long long *__restrict__ id_in,
                             md_vec *__restrict__ x, md_vec *__restrict__ x_built,
                             md_vec *__restrict__ v, long long *__restrict__ id,
                             const md_flags *flags) {
    if (!flags->rebuild) return;
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < n;
         p += (int64_t)gridDim.x * blockDim.x) {
        const md_vec q = x_in[p];
        x[p] = q, x_built[p] = q, v[p] = v_in[p], id[p] = id_in[p];
    }
}

/* Row i: every atom j != i of the (up to) 27 cells around i's whose nearest
 * image is within reach, in slots k * n + i. With 2 cells along a side the
 * cells at -1 and +1 are the same one: each distinct cell is visited once. */
__global__ void md_build(int64_t n, const md_vec *__restrict__ x, double box, double inv_box, int m,
                         const int *__restrict__ cell_start, double reach2, int capacity,
                         int *__restrict__ count, int *__restrict__ neigh, md_flags *flags) {
    if (!flags->rebuild) return;
    const int span = m >= 3 ? 3 : m;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const md_vec p = x[i];
        const int cx = cell_index(p.x, inv_box, m), cy = cell_index(p.y, inv_box, m),
                  cz = cell_index(p.z, inv_box, m);
        int found = 0;
        for (int a = 0; a < span; a++) {
            const int nz = m >= 3 ? (cz + a - 1 + m) % m : a;
            for (int b = 0; b < span; b++) {
                const int ny = m >= 3 ? (cy + b - 1 + m) % m : b;
                for (int d = 0; d < span; d++) {
                    const int nx = m >= 3 ? (cx + d - 1 + m) % m : d;
                    const int cell = (nz * m + ny) * m + nx;
                    for (int j = cell_start[cell]; j < cell_start[cell + 1]; j++) {
                        if (j == i) continue;
                        const md_vec q = x[j];
                        double dx = nearest(p.x - q.x, box, inv_box);
                        double dy = nearest(p.y - q.y, box, inv_box);
                        double dz = nearest(p.z - q.z, box, inv_box);
                        if (dx * dx + dy * dy + dz * dz < reach2) {
                            if (found < capacity) neigh[(int64_t)found * n + i] = j;
                            found++; /* counted past the end: the host says how many */
                        }
                    }
                }
            }
        }
        count[i] = found < capacity ? found : capacity;
        if (found > capacity) {
            flags->overflow = 1;
            atomicMax(&flags->longest, found);
        }
    }
}

__global__ void md_end_build(md_flags *flags) {
    if (flags->rebuild) flags->builds++;
    flags->rebuild = 0;
}

/* ---------------------------------------------------------- the forces */

/* Real: the precision of the pair force and of its sum per atom (float64
 * by default, as the CPU's; float32 with --forces f32). THERMO: also the
 * pair energy and virial in float64, summed per block into
 * partials[2 * block] and [2 * block + 1] (each pair counted from both
 * ends: the reduction halves them). */
template <bool THERMO, typename Real>
__global__ void __launch_bounds__(ATOM_THREADS)
    md_forces(int64_t n, const md_vec *__restrict__ x, const int *__restrict__ count,
              const int *__restrict__ neigh, md_vec *__restrict__ f, double box, double inv_box,
              double rc2, double *__restrict__ partials) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    double e = 0, w = 0;
    if (i < n) {
        const md_vec p = x[i];
        Real fx = 0, fy = 0, fz = 0;
        const int partners = count[i];
        const int *row = neigh + i;
        for (int k = 0; k < partners; k++) {
            const int j = __ldg(row + (int64_t)k * n);
            const md_vec q = x[j];
            const double dx = nearest(p.x - q.x, box, inv_box);
            const double dy = nearest(p.y - q.y, box, inv_box);
            const double dz = nearest(p.z - q.z, box, inv_box);
            const double r2 = dx * dx + dy * dy + dz * dz;
            if (r2 < rc2) { /* the test in float64: the same pairs as the CPU's */
                /* md.c's expressions; float64 division is exact-rounded even
                 * under --use_fast_math, float32's is not (unbiased enough
                 * for forces, not for the printed energy: see THERMO) */
                const Real r2inv = Real(1) / (Real)r2, r6inv = r2inv * r2inv * r2inv;
                const Real fpair = r6inv * (Real(48) * r6inv - Real(24)) * r2inv;
                fx += (Real)dx * fpair, fy += (Real)dy * fpair, fz += (Real)dz * fpair;
                if (THERMO) {
                    const double r2i = 1.0 / r2, r6i = r2i * r2i * r2i;
                    e += 4.0 * r6i * (r6i - 1.0);
                    w += r2 * (r6i * (48.0 * r6i - 24.0) * r2i);
                }
            }
        }
        md_vec out;
        out.x = fx, out.y = fy, out.z = fz, out.w = 0;
        f[i] = out;
    }
    if (THERMO) {
        __shared__ double shared[ATOM_THREADS];
        e = block_sum(e, shared);
        w = block_sum(w, shared);
        if (threadIdx.x == 0) partials[2 * blockIdx.x] = e, partials[2 * blockIdx.x + 1] = w;
    }
}

/* The closing half kick (kick 0: none, for the thermo of a fresh state),
 * and each block's sum of v^2 into partials[block]. */
__global__ void __launch_bounds__(ATOM_THREADS)
    md_finish(int64_t n, md_vec *__restrict__ v, const md_vec *__restrict__ f, double half_dt,
              int kick, double *__restrict__ partials) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    double s = 0;
    if (i < n) {
        md_vec vi = v[i];
        if (kick) {
            const md_vec fi = f[i];
            vi.x += half_dt * fi.x, vi.y += half_dt * fi.y, vi.z += half_dt * fi.z;
            v[i] = vi;
        }
        s = vi.x * vi.x + vi.y * vi.y + vi.z * vi.z;
    }
    __shared__ double shared[ATOM_THREADS];
    s = block_sum(s, shared);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

/* One block sums the blocks' partials in a fixed order: the same figures
 * from run to run. */
__global__ void __launch_bounds__(REDUCE_THREADS)
    md_reduce_thermo(int blocks, const double *__restrict__ energy, const double *__restrict__ v2,
                     md_flags *flags) {
    double e = 0, w = 0, s = 0;
    for (int b = threadIdx.x; b < blocks; b += REDUCE_THREADS) {
        e += energy[2 * b], w += energy[2 * b + 1], s += v2[b];
    }
    __shared__ double shared[REDUCE_THREADS];
    e = block_sum(e, shared);
    w = block_sum(w, shared);
    s = block_sum(s, shared);
    if (threadIdx.x == 0) {
        flags->potential = 0.5 * e; /* each pair was met from both ends */
        flags->virial = 0.5 * w;
        flags->v2 = s;
    }
}

__global__ void md_sum_counts(int64_t n, const int *__restrict__ count, md_flags *flags) {
    long long s = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        s += count[i];
    __shared__ long long shared[REDUCE_THREADS];
    s = block_sum(s, shared);
    if (threadIdx.x == 0) atomicAdd((unsigned long long *)&flags->pairs, (unsigned long long)s);
}

} // namespace

struct gpc_md_cuda {
    gpc_md_cuda_config c;
    int device;
    char name[300];
    int m;
    int64_t n, cells;
    double inv_box, rc2, reach2, limit2;
    int atom_blocks, loop_blocks;
    int64_t since_build; /* steps since the last build, for rebuild_every */
    cudaStream_t stream;
    md_vec *x, *v, *x_built, *x_tmp, *v_tmp;
    md_vec *f;
    long long *id, *id_tmp;
    int *cell_of, *cell_rank, *cell_count, *cell_start, *order, *count, *neigh;
    void *scan_tmp;
    size_t scan_bytes;
    double *energy_partials, *v2_partials;
    md_flags *flags; /* on the device */
    md_flags host;   /* its last copy */
};

#define MD_CHECK(call)                                                                             \
    do {                                                                                           \
        cudaError_t md_err_ = (call);                                                              \
        if (md_err_ != cudaSuccess) {                                                              \
            status =                                                                               \
                gpc_error(md_err_ == cudaErrorMemoryAllocation ? GPC_ERR_NOMEM : GPC_ERR_DEVICE,   \
                          "md: CUDA error at %s:%d: %s (%s)", __FILE__, __LINE__,                  \
                          cudaGetErrorString(md_err_), #call);                                     \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

static int64_t cells_of(const gpc_md_cuda_config *c) {
    return (int64_t)c->cells_per_side * c->cells_per_side * c->cells_per_side;
}

extern "C" double gpc_md_cuda_bytes(const gpc_md_cuda_config *c) {
    const double n = (double)c->atoms;
    /* x, v, f, x_built and two gather buffers of 32 bytes; ids and their
     * buffer 16; cell, rank, order, count 16; the rows */
    const double per_atom = 6 * 32 + 16 + 16 + 4.0 * c->row_capacity;
    /* cell counts and starts, CUB's scan space (under 1% of the counts),
     * the thermo partials, and the context's own share */
    const double cells = 8.0 * (double)(cells_of(c) + 1) * 1.1 + 1e6;
    return n * per_atom + cells + 24.0 * (n / ATOM_THREADS + 1) + 512.0 * (1 << 20);
}

extern "C" gpc_status gpc_md_cuda_check(int device, const gpc_md_cuda_config *c) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        cudaGetLastError();
        return gpc_error(GPC_ERR_UNSUPPORTED,
                         "md: no usable GPU (%s): check nvidia-smi and CUDA_VISIBLE_DEVICES, or "
                         "run with --device cpu",
                         err != cudaSuccess ? cudaGetErrorString(err) : "none visible");
    }
    if (device < 0 || device >= count)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "md: GPU %d does not exist: this machine has %d usable GPU%s (cuda:0 to "
                         "cuda:%d)",
                         device, count, count == 1 ? "" : "s", count - 1);
    GPC_CUDA_CHECK(cudaSetDevice(device));
    size_t free_bytes = 0, total_bytes = 0;
    GPC_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const double need = gpc_md_cuda_bytes(c);
    if (need > (double)free_bytes)
        return gpc_error(GPC_ERR_NOMEM,
                         "md: %lld atoms need about %.1f GiB of GPU memory, more than cuda:%d has "
                         "free, %.1f GiB (of %.1f): use fewer cells",
                         (long long)c->atoms, need / (1 << 30), device,
                         (double)free_bytes / (1 << 30), (double)total_bytes / (1 << 30));
    return GPC_OK;
}

extern "C" void gpc_md_cuda_free(gpc_md_cuda *g) {
    if (!g) return;
    cudaSetDevice(g->device);
    void *buffers[] = {
        g->x,     g->v,      g->x_built, g->x_tmp,     g->v_tmp,           g->f,
        g->id,    g->id_tmp, g->cell_of, g->cell_rank, g->cell_count,      g->cell_start,
        g->order, g->count,  g->neigh,   g->scan_tmp,  g->energy_partials, g->v2_partials,
        g->flags};
    for (size_t k = 0; k < sizeof buffers / sizeof buffers[0]; k++)
        cudaFree(buffers[k]);
    if (g->stream) cudaStreamDestroy(g->stream);
    gpc_free(g);
}

/* Queues the build (each kernel returns at once unless flags->rebuild). */
static gpc_status queue_build(gpc_md_cuda *g, long long step) {
    const int lb = g->loop_blocks, t = 256;
    const double box = g->c.box;
    md_clear_cells<<<lb, t, 0, g->stream>>>(g->cells, g->cell_count, g->flags);
    md_bin<<<lb, t, 0, g->stream>>>(g->n, g->x, box, g->inv_box, g->m, g->cell_of, g->cell_rank,
                                    g->cell_count, step, g->flags);
    GPC_CUDA_CHECK_LAUNCH();
    /* unconditional, but over the cells only (a few per cent of an atom
     * array); unchanged counts give unchanged starts */
    size_t bytes = g->scan_bytes;
    GPC_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(g->scan_tmp, bytes, g->cell_count, g->cell_start,
                                                 (int)(g->cells + 1), g->stream));
    md_scatter<<<lb, t, 0, g->stream>>>(g->n, g->cell_of, g->cell_rank, g->cell_start, g->order,
                                        g->flags);
    md_sort_cells<<<lb, t, 0, g->stream>>>(g->cells, g->cell_start, g->order, g->flags);
    md_gather<<<lb, t, 0, g->stream>>>(g->n, g->order, g->x, g->v, g->id, g->x_tmp, g->v_tmp,
                                       g->id_tmp, g->flags);
    md_copy_back<<<lb, t, 0, g->stream>>>(g->n, g->x_tmp, g->v_tmp, g->id_tmp, g->x, g->x_built,
                                          g->v, g->id, g->flags);
    md_build<<<lb, t, 0, g->stream>>>(g->n, g->x, box, g->inv_box, g->m, g->cell_start, g->reach2,
                                      g->c.row_capacity, g->count, g->neigh, g->flags);
    md_end_build<<<1, 1, 0, g->stream>>>(g->flags);
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

/* Waits for the queue and reads the flags; turns what they say into the
 * errors md.c gives on the CPU. `last` is the step the queue ended on. */
static gpc_status read_flags(gpc_md_cuda *g, long long last) {
    GPC_CUDA_CHECK(
        cudaMemcpyAsync(&g->host, g->flags, sizeof g->host, cudaMemcpyDeviceToHost, g->stream));
    GPC_CUDA_CHECK(cudaStreamSynchronize(g->stream));
    const md_flags *h = &g->host;
    if (h->blowup_step != LLONG_MAX)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         h->blowup_step > 0
                             ? "md: the run blew up by step %lld (an atom's position is no longer "
                               "finite): use a smaller time step than %g or a lower temperature"
                             : "md: the positions given are not finite (step %lld; time step %g)",
                         h->blowup_step, g->c.dt);
    if (!isfinite(h->potential) || !isfinite(h->virial) || !isfinite(h->v2))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "md: the run blew up at step %lld (the energy is no longer finite): use "
                         "a smaller time step than %g or a lower temperature",
                         last, g->c.dt);
    if (h->overflow)
        return gpc_error(GPC_ERR_INTERNAL,
                         "md: an atom had %d partners within cutoff + skin, more than the %d "
                         "slots of a neighbour row (a region over twice --density dense): use a "
                         "smaller --skin, or run on the CPU",
                         h->longest, g->c.row_capacity);
    return GPC_OK;
}

/* Queues the force kernel in the run's precision. */
static void queue_forces(gpc_md_cuda *g, bool thermo) {
    const dim3 grid(g->atom_blocks), block(ATOM_THREADS);
    double *partials = thermo ? g->energy_partials : NULL;
    if (g->c.forces_f32) {
        if (thermo)
            md_forces<true, float><<<grid, block, 0, g->stream>>>(
                g->n, g->x, g->count, g->neigh, g->f, g->c.box, g->inv_box, g->rc2, partials);
        else
            md_forces<false, float><<<grid, block, 0, g->stream>>>(
                g->n, g->x, g->count, g->neigh, g->f, g->c.box, g->inv_box, g->rc2, partials);
    } else {
        if (thermo)
            md_forces<true, double><<<grid, block, 0, g->stream>>>(
                g->n, g->x, g->count, g->neigh, g->f, g->c.box, g->inv_box, g->rc2, partials);
        else
            md_forces<false, double><<<grid, block, 0, g->stream>>>(
                g->n, g->x, g->count, g->neigh, g->f, g->c.box, g->inv_box, g->rc2, partials);
    }
}

/* A build now, forces and the thermo sums of the current state. */
static gpc_status compute_now(gpc_md_cuda *g, long long step) {
    md_force_rebuild<<<1, 1, 0, g->stream>>>(g->flags);
    GPC_TRY(queue_build(g, step));
    g->since_build = 0;
    queue_forces(g, true);
    md_finish<<<g->atom_blocks, ATOM_THREADS, 0, g->stream>>>(g->n, g->v, g->f, 0.0, 0,
                                                              g->v2_partials);
    md_reduce_thermo<<<1, REDUCE_THREADS, 0, g->stream>>>(g->atom_blocks, g->energy_partials,
                                                          g->v2_partials, g->flags);
    GPC_CUDA_CHECK_LAUNCH();
    return read_flags(g, step);
}

/* float64 [n][3] <-> md_vec [n], through a host buffer. */
static gpc_status upload_vec(gpc_md_cuda *g, md_vec *dst, const double *src) {
    md_vec *h = (md_vec *)gpc_malloc((size_t)g->n * sizeof *h);
    if (!h)
        return gpc_error(GPC_ERR_NOMEM, "md: out of host memory for %lld atoms", (long long)g->n);
    for (int64_t i = 0; i < g->n; i++)
        h[i].x = src[3 * i], h[i].y = src[3 * i + 1], h[i].z = src[3 * i + 2], h[i].w = 0;
    /* from pageable memory a copy may return before its DMA ends: wait for
     * it before the buffer goes */
    cudaError_t err =
        cudaMemcpyAsync(dst, h, (size_t)g->n * sizeof *h, cudaMemcpyHostToDevice, g->stream);
    if (err == cudaSuccess) err = cudaStreamSynchronize(g->stream);
    gpc_free(h);
    GPC_CUDA_CHECK(err);
    return GPC_OK;
}

static gpc_status download_vec(gpc_md_cuda *g, double *dst, const md_vec *src) {
    md_vec *h = (md_vec *)gpc_malloc((size_t)g->n * sizeof *h);
    if (!h)
        return gpc_error(GPC_ERR_NOMEM, "md: out of host memory for %lld atoms", (long long)g->n);
    cudaError_t err =
        cudaMemcpyAsync(h, src, (size_t)g->n * sizeof *h, cudaMemcpyDeviceToHost, g->stream);
    if (err == cudaSuccess) err = cudaStreamSynchronize(g->stream);
    if (err == cudaSuccess)
        for (int64_t i = 0; i < g->n; i++)
            dst[3 * i] = h[i].x, dst[3 * i + 1] = h[i].y, dst[3 * i + 2] = h[i].z;
    gpc_free(h);
    GPC_CUDA_CHECK(err);
    return GPC_OK;
}

extern "C" gpc_status gpc_md_cuda_create(gpc_md_cuda **out, int device,
                                         const gpc_md_cuda_config *config, const double *x,
                                         const double *v, const int64_t *id) {
    *out = NULL;
    GPC_TRY(gpc_md_cuda_check(device, config));
    gpc_status status = GPC_OK;
    gpc_md_cuda *g = (gpc_md_cuda *)gpc_calloc(1, sizeof *g);
    if (!g) return gpc_error(GPC_ERR_NOMEM, "md: out of host memory");
    g->c = *config;
    g->device = device;
    g->n = config->atoms;
    g->m = config->cells_per_side;
    g->cells = cells_of(config);
    g->inv_box = 1.0 / config->box;
    g->rc2 = config->cutoff * config->cutoff;
    const double reach = config->cutoff + config->skin;
    g->reach2 = reach * reach;
    g->limit2 = 0.25 * config->skin * config->skin;
    g->atom_blocks = (int)((g->n + ATOM_THREADS - 1) / ATOM_THREADS);
    {
        cudaDeviceProp prop;
        MD_CHECK(cudaGetDeviceProperties(&prop, device));
        snprintf(g->name, sizeof g->name, "%s (cuda:%d)", prop.name, device);
        g->loop_blocks = prop.multiProcessorCount * LOOP_BLOCKS_PER_SM;
    }
    /* a blocking stream: it waits for the default stream's copies and sets
     * too, so no copy below can race a kernel */
    MD_CHECK(cudaStreamCreate(&g->stream));
    {
        const size_t n = (size_t)g->n, vec = n * sizeof(md_vec);
        MD_CHECK(cudaMalloc(&g->x, vec));
        MD_CHECK(cudaMalloc(&g->v, vec));
        MD_CHECK(cudaMalloc(&g->x_built, vec));
        MD_CHECK(cudaMalloc(&g->x_tmp, vec));
        MD_CHECK(cudaMalloc(&g->v_tmp, vec));
        MD_CHECK(cudaMalloc(&g->f, vec));
        MD_CHECK(cudaMalloc(&g->id, n * sizeof(long long)));
        MD_CHECK(cudaMalloc(&g->id_tmp, n * sizeof(long long)));
        MD_CHECK(cudaMalloc(&g->cell_of, n * sizeof(int)));
        MD_CHECK(cudaMalloc(&g->cell_rank, n * sizeof(int)));
        MD_CHECK(cudaMalloc(&g->order, n * sizeof(int)));
        MD_CHECK(cudaMalloc(&g->count, n * sizeof(int)));
        MD_CHECK(cudaMalloc(&g->neigh, n * (size_t)config->row_capacity * sizeof(int)));
        MD_CHECK(cudaMalloc(&g->cell_count, (size_t)(g->cells + 1) * sizeof(int)));
        MD_CHECK(cudaMalloc(&g->cell_start, (size_t)(g->cells + 1) * sizeof(int)));
        MD_CHECK(cudaMalloc(&g->energy_partials, 2 * (size_t)g->atom_blocks * sizeof(double)));
        MD_CHECK(cudaMalloc(&g->v2_partials, (size_t)g->atom_blocks * sizeof(double)));
        MD_CHECK(cudaMalloc(&g->flags, sizeof(md_flags)));
        MD_CHECK(cub::DeviceScan::ExclusiveSum(NULL, g->scan_bytes, g->cell_count, g->cell_start,
                                               (int)(g->cells + 1), g->stream));
        MD_CHECK(cudaMalloc(&g->scan_tmp, g->scan_bytes ? g->scan_bytes : 1));
        /* the count after the last cell stays 0: the scan's last start is n */
        MD_CHECK(
            cudaMemsetAsync(g->cell_count, 0, (size_t)(g->cells + 1) * sizeof(int), g->stream));
        MD_CHECK(cudaMemsetAsync(g->f, 0, vec, g->stream));
        MD_CHECK(cudaMemsetAsync(g->count, 0, n * sizeof(int), g->stream));
    }
    memset(&g->host, 0, sizeof g->host);
    g->host.blowup_step = LLONG_MAX;
    MD_CHECK(
        cudaMemcpyAsync(g->flags, &g->host, sizeof g->host, cudaMemcpyHostToDevice, g->stream));
    MD_CHECK(cudaStreamSynchronize(g->stream));
    status = upload_vec(g, g->x, x);
    if (status == GPC_OK) status = upload_vec(g, g->v, v);
    if (status != GPC_OK) goto done;
    static_assert(sizeof(long long) == sizeof(int64_t), "ids are 64 bits on both sides");
    MD_CHECK(cudaMemcpyAsync(g->id, id, (size_t)g->n * sizeof(long long), cudaMemcpyHostToDevice,
                             g->stream));
    MD_CHECK(cudaStreamSynchronize(g->stream));
    status = compute_now(g, 0);
done:
    if (status != GPC_OK) {
        gpc_md_cuda_free(g);
        return status;
    }
    *out = g;
    return GPC_OK;
}

extern "C" gpc_status gpc_md_cuda_run(gpc_md_cuda *g, int steps, int64_t first_step) {
    if (steps <= 0) return GPC_OK;
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    const double dt = g->c.dt, half_dt = 0.5 * dt;
    for (int s = 0; s < steps; s++) {
        const long long step = (long long)first_step + s + 1;
        md_integrate<<<g->atom_blocks, ATOM_THREADS, 0, g->stream>>>(
            g->n, g->x, g->v, g->f, g->x_built, dt, half_dt, s > 0, g->limit2, step, g->flags);
        int forced = -1;
        if (g->c.rebuild_every > 0) {
            forced = ++g->since_build >= g->c.rebuild_every;
            if (forced) g->since_build = 0;
        }
        md_decide<<<1, 1, 0, g->stream>>>(g->flags, forced);
        GPC_TRY(queue_build(g, step));
        queue_forces(g, s == steps - 1);
        GPC_CUDA_CHECK_LAUNCH();
    }
    md_finish<<<g->atom_blocks, ATOM_THREADS, 0, g->stream>>>(g->n, g->v, g->f, half_dt, 1,
                                                              g->v2_partials);
    md_reduce_thermo<<<1, REDUCE_THREADS, 0, g->stream>>>(g->atom_blocks, g->energy_partials,
                                                          g->v2_partials, g->flags);
    GPC_CUDA_CHECK_LAUNCH();
    return read_flags(g, (long long)first_step + steps);
}

extern "C" gpc_status gpc_md_cuda_compute(gpc_md_cuda *g, const double *x, const double *v) {
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    if (x) GPC_TRY(upload_vec(g, g->x, x));
    if (v) GPC_TRY(upload_vec(g, g->v, v));
    return compute_now(g, 0);
}

extern "C" gpc_status gpc_md_cuda_sums_get(gpc_md_cuda *g, gpc_md_cuda_sums *out) {
    /* read back at the end of every create, compute and run */
    out->potential = g->host.potential;
    out->virial = g->host.virial;
    out->v2 = g->host.v2;
    return GPC_OK;
}

extern "C" gpc_status gpc_md_cuda_download(gpc_md_cuda *g, double *x, double *v, double *f,
                                           int64_t *id) {
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    GPC_CUDA_CHECK(cudaStreamSynchronize(g->stream));
    if (x) GPC_TRY(download_vec(g, x, g->x));
    if (v) GPC_TRY(download_vec(g, v, g->v));
    if (f) GPC_TRY(download_vec(g, f, g->f));
    if (id)
        GPC_CUDA_CHECK(
            cudaMemcpy(id, g->id, (size_t)g->n * sizeof(long long), cudaMemcpyDeviceToHost));
    return GPC_OK;
}

extern "C" gpc_status gpc_md_cuda_neighbors(gpc_md_cuda *g, int32_t *counts, int32_t *rows) {
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    GPC_CUDA_CHECK(cudaStreamSynchronize(g->stream));
    const int64_t n = g->n, cap = g->c.row_capacity;
    GPC_CUDA_CHECK(cudaMemcpy(counts, g->count, (size_t)n * sizeof(int), cudaMemcpyDeviceToHost));
    int32_t *columns = (int32_t *)gpc_malloc((size_t)(n * cap) * sizeof *columns);
    if (!columns) return gpc_error(GPC_ERR_NOMEM, "md: out of host memory for the neighbour list");
    cudaError_t err =
        cudaMemcpy(columns, g->neigh, (size_t)(n * cap) * sizeof(int), cudaMemcpyDeviceToHost);
    if (err == cudaSuccess)
        for (int64_t i = 0; i < n; i++)
            for (int64_t k = 0; k < cap; k++)
                rows[i * cap + k] = columns[k * n + i];
    gpc_free(columns);
    GPC_CUDA_CHECK(err);
    return GPC_OK;
}

extern "C" int64_t gpc_md_cuda_builds(const gpc_md_cuda *g) {
    return g->host.builds;
}

extern "C" int64_t gpc_md_cuda_dangerous(const gpc_md_cuda *g) {
    return g->host.dangerous;
}

extern "C" int64_t gpc_md_cuda_pairs(gpc_md_cuda *g) {
    if (cudaSetDevice(g->device) != cudaSuccess) return -1;
    cudaMemsetAsync(&g->flags->pairs, 0, sizeof g->flags->pairs, g->stream);
    md_sum_counts<<<g->loop_blocks, REDUCE_THREADS, 0, g->stream>>>(g->n, g->count, g->flags);
    long long pairs = -1;
    if (cudaMemcpyAsync(&pairs, &g->flags->pairs, sizeof pairs, cudaMemcpyDeviceToHost,
                        g->stream) != cudaSuccess ||
        cudaStreamSynchronize(g->stream) != cudaSuccess)
        return -1;
    return pairs / 2; /* a full list holds each pair from both ends */
}

extern "C" const char *gpc_md_cuda_device_name(const gpc_md_cuda *g) {
    return g->name;
}
