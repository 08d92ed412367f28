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
 *   forces       `lanes` threads per atom (1, 2, 4 or 8) over its row, summed
 *                by shuffles: no atomics. Slot k of atom i is at
 *                ((k / lanes) * atoms + i) * lanes + k % lanes, so the lanes
 *                of a warp read one run of memory at each step of the loop
 *                (with one lane this is column-major: k * atoms + i);
 *                with unroll 2, 4 or 8 each thread takes that many partners at
 *                a time, their entries and positions loaded together and
 *                the next group's entries ahead of them (the loop is bound
 *                by the latency of those dependent loads, not by DRAM),
 *                and the build loads each cell's candidates that many at
 *                a time
 *   (run's end)  the closing half kick and the sum of v^2; the pair energy
 *                and virial only when first asked for (sums_get): the
 *                thermo force kernel over the same positions and list, so
 *                a chunk of steps whose row is not printed costs no more
 *                than its steps
 *
 * With fused_step (--gpu-step fused) the force kernel of each step but a
 * run's last goes on, once an atom's force is summed, to that atom's
 * closing half kick and the next step's opening half kick, drift and
 * displacement test (kick_drift, the integrate kernel's own body), so
 * integrate runs only at a run's first step. Other threads still read the
 * atom's position as a partner, so the drifted one goes to a second buffer
 * (x_alt, and xr_alt for float32 forces) and the host swaps the pair after
 * queueing each such step; the force is not stored. The last step stores
 * its forces and ends as the split step does, so thermo rows are the same.
 *
 * A neighbour entry is the partner's index in its low 27 bits and, in the
 * top 5, a code (0 to 26) of three offsets -1, 0 or 1 fixed at the build:
 * so the force loop takes no rounding per pair to find the periodic image.
 * In float64 the offsets are the partner's image (x_j + box * offset); in
 * float32 they are the partner's cell relative to the atom's, because
 * float32 positions are held relative to the corner of each atom's cell at
 * the build (a cell is cutoff + skin wide or a little more, 2.85 in in.lj,
 * so they are rounded to 2.4e-7, where absolute float32 coordinates in
 * in.lj's box of 168 at 4M atoms would carry 1.5e-5).
 *
 * The build tests each candidate in float32 on those relative positions;
 * only where that lands within a margin far above their rounding of the
 * reach does it take md.c's float64 test (its expression, the same
 * rounding). So the list is the CPU's, at float32's cost and without a
 * float64 load for all but the rare candidates whose r^2 is within 1e-4 of
 * the reach's. --gpu-build f64 tests every candidate in float64.
 *
 * Precision: positions, velocities and forces are float64, as on the CPU
 * (an fp32 coordinate of a 33-wide box carries 4e-6 of rounding, which
 * moves the printed energy's seventh digit; pair forces of 50 that cancel
 * to 10 carry float32's rounding into every step). --forces f32 computes
 * and sums the pair forces in float32 from the cell-relative positions, for
 * GPUs with little float64. On the steps whose thermo is reported the pair
 * energy and virial are computed in float64 from the float64 positions and
 * reduced in float64 in a fixed order (per block, then one block over the
 * blocks), the same from run to run.
 *
 * Each pair's periodic image is fixed at the build: positions are wrapped
 * at each build, move less than half the skin before the next, and the box
 * is more than twice cutoff + skin wide, so the image within the cutoff,
 * when there is one, is the one within reach at the build.
 */
#include "sci/md_cuda.h"

#include "cuda/cuda_common.cuh"
#include "gpc/md.h"
#include "sci/sci_cuda.cuh"
#include "gpc/settings.h"

#include <climits>
#include <type_traits>
#include <cub/device/device_scan.cuh>
#include <math.h>
#include <stdio.h>
#include <string.h>

namespace {

constexpr int ATOM_THREADS = 128;   /* the per-atom kernels' block; also the thermo partials' */
constexpr int REDUCE_THREADS = 256; /* the one block that sums the partials */
constexpr int LOOP_BLOCKS_PER_SM = 8;
constexpr int LOOP_THREADS = 256;       /* the build kernels' block (grid-stride loops) */
constexpr int CELL_BUILD_THREADS = 128; /* md_build_cells: four warps, four cells at a time */
/* md_build_cells stages up to this many entries of each row in shared
 * memory before writing them out (a multiple of 32 plus one: a lane's row
 * starts in the next bank from the lane before) */
constexpr int CELL_STAGE = 64;
constexpr int CELL_STAGE_STRIDE = CELL_STAGE + 1;
constexpr int CELL_FLUSH_RUN = 32; /* the warp writes its stages when each holds this many */
/* md_build_cells tests 32 * GROUP candidates at a time, GROUP a lane (2;
 * GPC_MD_LIST=cells1: 1), so that each home position read from shared
 * memory meets all of them */
constexpr int MAX_CELL_GROUP = 2;
constexpr int MAX_LANES = 8; /* threads per atom in the force kernel */
constexpr int DEFAULT_LANES = 4;
constexpr int INDEX_BITS = 27; /* a neighbour entry: index, then the offsets' code */
constexpr unsigned INDEX_MASK = (1u << INDEX_BITS) - 1;
constexpr unsigned CODE_NONE = 13; /* offsets (0, 0, 0) */
/* the float32 build test's margin on (cutoff + skin)^2: its rounding is under
 * 1e-5 of it (cell-relative positions, a few cells wide, rounded to ~1e-7
 * of their size) */
constexpr double SCREEN_MARGIN = 1e-4;

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

__device__ __forceinline__ double wrap(double p, double box, double inv_box) {
    double w = p - box * floor(p * inv_box);
    /* w = box or w < 0: rounding at the faces (md.c does the same) */
    return (w >= box || w < 0 || !isfinite(w)) ? 0.0 : w;
}

/* A neighbour cell's coordinate c (at most one cell outside 0 .. m-1)
 * wrapped into the box; returns the image it came from: -1, 0 or 1. */
__device__ __forceinline__ int wrap_cell(int &c, int m) {
    const int image = c < 0 ? -1 : (c >= m ? 1 : 0);
    c -= image * m;
    return image;
}

__device__ __forceinline__ int cell_index(double p, double inv_box, int m) {
    int c = (int)(p * inv_box * m); /* md.c's expression, so the cells agree */
    return c >= m ? m - 1 : (c < 0 ? 0 : c);
}

__device__ __forceinline__ double nearest(double d, double box, double inv_box) {
    return d - box * rint(d * inv_box);
}

/* Offsets (each -1, 0 or 1) as a code 0 to 26, md.c's shift_code. */
__host__ __device__ __forceinline__ unsigned offset_code(int ox, int oy, int oz) {
    return (unsigned)(((oz + 1) * 3 + (oy + 1)) * 3 + (ox + 1));
}

/* Where slot k of atom i lies with `1 << lanes_log2` threads per atom. */
__host__ __device__ __forceinline__ int64_t slot_of(int64_t i, int k, int64_t n, int lanes_log2) {
    return (((int64_t)(k >> lanes_log2) * n + i) << lanes_log2) + (k & ((1 << lanes_log2) - 1));
}

/* A position in float32 relative to the corner of the cell `built` (the
 * atom's position at the last build) lies in. */
__device__ __forceinline__ float4 relative(const md_vec &p, const md_vec &built, double inv_box,
                                           int m, double width) {
    float4 r;
    r.x = (float)(p.x - width * cell_index(built.x, inv_box, m));
    r.y = (float)(p.y - width * cell_index(built.y, inv_box, m));
    r.z = (float)(p.z - width * cell_index(built.z, inv_box, m));
    r.w = 0;
    return r;
}

/* ------------------------------------------------------------ the step */

/* Where a step's drift writes, and what it needs besides the atom's own
 * position, velocity and force. x and xr: the drifted positions (md_integrate:
 * the arrays it reads; the fused step: the other buffers of the pair, as the
 * force kernel's partners still read the current ones); xr NULL with float64
 * forces, which read x alone. */
struct md_drift {
    md_vec *v; /* in place: only atom i's thread reads v[i] */
    md_vec *x;
    float4 *xr;
    const md_vec *x_built;
    double inv_box, width, dt, half_dt, limit2;
    int m;
    long long step; /* the step the drift begins, for the blow-up message */
    md_flags *flags;
};

/* Atom i's closing half kick of the step before (finish_previous), the
 * opening half kick and the drift from xi, and the checks of displacement
 * and blow-up: md_integrate's body and the fused step's, one expression so
 * the two give the same bits. */
__device__ __forceinline__ void kick_drift(int64_t i, md_vec xi, const md_vec &fi,
                                           bool finish_previous, const md_drift &d) {
    md_vec vi = d.v[i];
    if (finish_previous) { /* the closing half kick of the step before */
        vi.x += d.half_dt * fi.x, vi.y += d.half_dt * fi.y, vi.z += d.half_dt * fi.z;
    }
    vi.x += d.half_dt * fi.x, vi.y += d.half_dt * fi.y, vi.z += d.half_dt * fi.z;
    xi.x += d.dt * vi.x, xi.y += d.dt * vi.y, xi.z += d.dt * vi.z;
    d.v[i] = vi;
    d.x[i] = xi;
    const md_vec b = d.x_built[i];
    if (d.xr) d.xr[i] = relative(xi, b, d.inv_box, d.m, d.width);
    double dx = xi.x - b.x, dy = xi.y - b.y, dz = xi.z - b.z;
    /* written so that NaN counts as moved: a blown-up atom forces a build */
    if (!(dx * dx + dy * dy + dz * dz <= d.limit2)) d.flags->moved = 1;
    if (!isfinite(xi.x) || !isfinite(xi.y) || !isfinite(xi.z))
        atomicMin(&d.flags->blowup_step, d.step);
}

/* The step's first half in place (d.x: the positions read). */
__global__ void md_integrate(int64_t n, const md_vec *__restrict__ f, int finish_previous,
                             md_drift d) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    kick_drift(i, d.x[i], f[i], finish_previous, d);
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
        const md_vec was = x[i];
        if (!isfinite(was.x) || !isfinite(was.y) || !isfinite(was.z))
            atomicMin(&flags->blowup_step, step);
        md_vec p = was;
        p.x = wrap(p.x, box, inv_box), p.y = wrap(p.y, box, inv_box), p.z = wrap(p.z, box, inv_box);
        /* written back only where it moved: inside the box wrap is exact,
         * so most atoms keep their bits and cost no store (NaN != 0) */
        if (p.x != was.x || p.y != was.y || p.z != was.z) x[i] = p;
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
        sort_ascending(order + lo, hi - lo);
    }
}

/* Positions go straight to x_built (the new start) and, float32 relative
 * to each atom's cell, to xr, which nothing reads here; velocities and
 * ids to buffers. */
__global__ void md_gather(int64_t n, const int *__restrict__ order, const md_vec *__restrict__ x,
                          const md_vec *__restrict__ v, const long long *__restrict__ id,
                          md_vec *__restrict__ x_built, float4 *__restrict__ xr,
                          md_vec *__restrict__ v_out, long long *__restrict__ id_out,
                          double inv_box, int m, double width, const md_flags *flags) {
    if (!flags->rebuild) return;
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < n;
         p += (int64_t)gridDim.x * blockDim.x) {
        const int j = order[p];
        const md_vec q = x[j];
        x_built[p] = q, v_out[p] = v[j], id_out[p] = id[j];
        xr[p] = relative(q, q, inv_box, m, width);
    }
}

/* Back into the arrays the step uses (the host does not know whether a
 * build ran, so it cannot swap pointers): x from x_built, v and ids from
 * the gather's buffers. */
__global__ void md_copy_back(int64_t n, const md_vec *__restrict__ x_built,
                             const md_vec *__restrict__ v_in, const long long *__restrict__ id_in,
                             md_vec *__restrict__ x, md_vec *__restrict__ v,
                             long long *__restrict__ id, const md_flags *flags) {
    if (!flags->rebuild) return;
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < n;
         p += (int64_t)gridDim.x * blockDim.x)
        x[p] = x_built[p], v[p] = v_in[p], id[p] = id_in[p];
}

/* Row i: every atom j != i of the 27 cells around i's within reach, each
 * with its code (the file's head). The 27 offsets are walked whatever the
 * grid: with 1 or 2 cells along a side one cell is met at several images,
 * of which at most one lies within reach (the box is over twice as wide).
 * The float32 test uses i's position relative to the neighbour cell's
 * corner (its own minus the offset times the cell's width) against the
 * partners' relative positions: below screen_low the pair is within reach
 * whatever the rounding, above screen_high beyond it; in between (and
 * with test_f64, always) md.c's float64 test decides. UNROLL (2, 4 or 8,
 * --gpu-unroll): a cell's candidates taken that many at a time, their
 * float32 positions loaded together before any is tested; the same tests
 * in the same order, so the same rows. */
template <int UNROLL>
__global__ void
md_build(int64_t n, const md_vec *__restrict__ x, const float4 *__restrict__ xr, double box,
         double inv_box, int m, double width, const int *__restrict__ cell_start, double reach2,
         float screen_low, float screen_high, int test_f64, int relative_codes, int capacity,
         int lanes_log2, int *__restrict__ count, unsigned *__restrict__ neigh, md_flags *flags) {
    if (!flags->rebuild) return;
    const float fwidth = (float)width;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const md_vec p = x[i];
        const float4 pr = xr[i];
        const int cx = cell_index(p.x, inv_box, m), cy = cell_index(p.y, inv_box, m),
                  cz = cell_index(p.z, inv_box, m);
        int found = 0;
        for (int oz = -1; oz <= 1; oz++) {
            int nz = cz + oz;
            const int sz = wrap_cell(nz, m);
            for (int oy = -1; oy <= 1; oy++) {
                int ny = cy + oy;
                const int sy = wrap_cell(ny, m);
                for (int ox = -1; ox <= 1; ox++) {
                    int nx = cx + ox;
                    const int sx = wrap_cell(nx, m);
                    const int cell = (nz * m + ny) * m + nx;
                    /* the partners' near image is at x_j + box * (sx, sy, sz) */
                    const double bx = box * sx, by = box * sy, bz = box * sz;
                    const float rx = pr.x - fwidth * ox, ry = pr.y - fwidth * oy,
                                rz = pr.z - fwidth * oz;
                    const unsigned code =
                        (relative_codes ? offset_code(ox, oy, oz) : offset_code(sx, sy, sz))
                        << INDEX_BITS;
                    const int end = cell_start[cell + 1];
                    for (int j0 = cell_start[cell]; j0 < end; j0 += UNROLL) {
                        float4 candidate[UNROLL];
                        if (!test_f64) {
#pragma unroll
                            for (int u = 0; u < UNROLL; u++)
                                if (UNROLL == 1 || j0 + u < end)
                                    candidate[u] = UNROLL == 1 ? xr[j0] : __ldg(&xr[j0 + u]);
                        }
#pragma unroll
                        for (int u = 0; u < UNROLL; u++) {
                            const int j = j0 + u;
                            if (UNROLL > 1 && j >= end) break;
                            if (j == i) continue; /* its images are over twice the reach away */
                            float s2 = 0;
                            if (!test_f64) {
                                const float4 q = candidate[u];
                                const float dx = rx - q.x, dy = ry - q.y, dz = rz - q.z;
                                s2 = dx * dx + dy * dy + dz * dz;
                                if (!(s2 < screen_high)) continue; /* NaN too */
                            }
                            bool within = !test_f64 && s2 < screen_low;
                            if (!within) {
                                const md_vec q = x[j];
                                const double dx = p.x - q.x - bx, dy = p.y - q.y - by,
                                             dz = p.z - q.z - bz;
                                within = dx * dx + dy * dy + dz * dz < reach2;
                            }
                            if (within) {
                                if (found < capacity)
                                    neigh[slot_of(i, found, n, lanes_log2)] = (unsigned)j | code;
                                found++; /* counted past the end: the host says how many */
                            }
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

/* CHUNK consecutive entries of a row, from shared memory to one store of
 * CHUNK * 4 bytes (to aligned to that). */
template <int CHUNK> __device__ __forceinline__ void store_run(unsigned *to, const unsigned *from) {
    if constexpr (CHUNK == 4)
        *reinterpret_cast<uint4 *>(to) = make_uint4(from[0], from[1], from[2], from[3]);
    else if constexpr (CHUNK == 2)
        *reinterpret_cast<uint2 *>(to) = make_uint2(from[0], from[1]);
    else
        to[0] = from[0];
}

/* The same rows as md_build's, a warp per cell: the cell's atoms (up to
 * 32 at a time, their float32 positions in shared memory) against the
 * candidates of each row of three cells around it (ox = -1, 0, 1 at one
 * oy, oz), 32 * GROUP candidates at a time, GROUP a lane. Each lane tests
 * its candidates against all the cell's atoms, a bit an atom; the warp
 * transposes the 32 x 32 bits by shuffles, so that lane a holds which
 * candidates atom a reaches. They take the row's next slots in candidate
 * order, which is md_build's order (the 27 cells in its order, each
 * cell's atoms in ascending index), so the rows are md_build's slot for
 * slot. Candidates are taken relative to the atom's cell corner (their own
 * corner plus the offset times the width): rounded otherwise than
 * md_build's, far below the screen's margin, so the same pairs go to the
 * float64 test and the same pairs are listed. All the warp's loops are
 * uniform, its candidate loads one run of memory; md_build's thread per
 * atom walks other cells than its warp's neighbours and reads each
 * candidate once per atom. The time goes to the tests (a shared-memory
 * read of the home position, six float operations and two compares), so
 * two candidates a lane halve the reads and the loop's overhead.
 *
 * The entries go first to a stage in shared memory, CELL_STAGE a row.
 * When every row's stage holds CELL_FLUSH_RUN entries or one is filling
 * (before each group of candidates), the warp writes out the slots that
 * all the cell's atoms have found, lane a atom a's, in runs of CHUNK slots
 * consecutive in memory (slot_of), one store each: the lanes write the
 * same slots at once, and the cell's atoms are consecutive, so each store
 * is one run of memory. The rest stays staged; a lane whose stage would
 * overflow within a group writes its own out first, and each lane writes
 * what is left at the end. Written straight from the ballot, each entry
 * was a store of its own to another place, and those partial stores were
 * most of the build's time. */
template <int CHUNK, int GROUP>
__global__ void __launch_bounds__(CELL_BUILD_THREADS)
    md_build_cells(int64_t n, const md_vec *__restrict__ x, const float4 *__restrict__ xr,
                   double box, int m, double width, const int *__restrict__ cell_start,
                   int64_t cells, double reach2, float screen_low, float screen_high, int test_f64,
                   int relative_codes, int capacity, int lanes_log2, int *__restrict__ count,
                   unsigned *__restrict__ neigh, md_flags *flags) {
    if (!flags->rebuild) return;
    constexpr int WARPS = CELL_BUILD_THREADS / 32;
    __shared__ float4 home_all[CELL_BUILD_THREADS];
    __shared__ unsigned stage_all[WARPS][32 * CELL_STAGE_STRIDE];
    const int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5);
    float4 *home = home_all + 32 * warp;
    unsigned *stage = stage_all[warp];
    __shared__ unsigned cand_all[WARPS][32 * MAX_CELL_GROUP]; /* the candidates' entries */
    unsigned *cand = cand_all[warp];
    const float fwidth = (float)width;
    for (int64_t c = (int64_t)blockIdx.x * WARPS + warp; c < cells;
         c += (int64_t)gridDim.x * WARPS) {
        const int cx = (int)(c % m), cy = (int)((c / m) % m), cz = (int)(c / ((int64_t)m * m));
        const int lo = cell_start[c], hi = cell_start[c + 1];
        for (int h0 = lo; h0 < hi; h0 += 32) {
            const int homes = min(32, hi - h0);
            __syncwarp();
            if (lane < homes) home[lane] = xr[h0 + lane];
            __syncwarp();
            int found = 0;  /* of atom h0 + lane, written or staged */
            int staged = 0; /* of those, staged */
            /* writes this lane's staged entries of the slots below upto,
             * CHUNK slots (consecutive in memory) a store, and moves the
             * rest to the stage's front. Callers pass a multiple of CHUNK
             * but at the row's end, so every run starts at one. */
            auto flush_to = [&](int upto) {
                const int from = found - staged;
                const int ready = min(max(upto - from, 0), staged);
                if (ready == 0) return;
                const unsigned *mine = stage + lane * CELL_STAGE_STRIDE;
                for (int k = 0; k < ready; k += CHUNK) {
                    const int slot = from + k;
                    if (slot >= capacity) break;
                    unsigned *to = neigh + slot_of(h0 + lane, slot, n, lanes_log2);
                    if (k + CHUNK <= ready) {
                        store_run<CHUNK>(to, mine + k);
                    } else {
                        for (int e = k; e < ready; e++)
                            to[e - k] = mine[e];
                    }
                }
                for (int e = ready; e < staged; e++)
                    stage[lane * CELL_STAGE_STRIDE + e - ready] = mine[e];
                staged -= ready;
            };
            /* the warp's flush: the slots every atom of the cell has found,
             * so that lanes write the same slot (runs) at once: a run of
             * memory across the cell's atoms */
            auto flush_common = [&]() {
                const int common = __reduce_min_sync(0xffffffffu, lane < homes ? found : INT_MAX);
                flush_to(common / CHUNK * CHUNK);
            };
            for (int oz = -1; oz <= 1; oz++) {
                int nz = cz + oz;
                const int sz = wrap_cell(nz, m);
                for (int oy = -1; oy <= 1; oy++) {
                    int ny = cy + oy;
                    const int sy = wrap_cell(ny, m);
                    /* the row's three cells (ox = -1, 0, 1): where each
                     * one's atoms start, where it ends in the row's count,
                     * and its x image */
                    int start0, start1, start2, end0, end1, total, shift0, shift1, shift2;
                    {
                        auto cell = [&](int ox, int &shift) {
                            int nx = cx + ox;
                            shift = wrap_cell(nx, m);
                            return (nz * m + ny) * m + nx;
                        };
                        const int c0 = cell(-1, shift0), c1 = cell(0, shift1), c2 = cell(1, shift2);
                        start0 = cell_start[c0], start1 = cell_start[c1], start2 = cell_start[c2];
                        end0 = cell_start[c0 + 1] - start0;
                        end1 = end0 + cell_start[c1 + 1] - start1;
                        total = end1 + cell_start[c2 + 1] - start2;
                    }
                    for (int t0 = 0; t0 < total; t0 += 32 * GROUP) {
                        /* when every row has a long run to write, or one
                         * stage is filling */
                        if (__reduce_min_sync(0xffffffffu, lane < homes ? staged : INT_MAX) >=
                                CELL_FLUSH_RUN ||
                            __reduce_max_sync(0xffffffffu, staged) > CELL_STAGE - 24)
                            flush_common();
                        /* candidate t0 + 32 g + lane, for each g */
                        float qx[GROUP], qy[GROUP], qz[GROUP];
                        unsigned entry[GROUP];
                        int jg[GROUP], sxg[GROUP];
                        bool valid[GROUP];
#pragma unroll
                        for (int g = 0; g < GROUP; g++) {
                            const int t = t0 + 32 * g + lane;
                            valid[g] = t < total;
                            const int ox = t < end0 ? -1 : (t < end1 ? 0 : 1);
                            jg[g] = ox < 0 ? start0 + t
                                           : (ox == 0 ? start1 + t - end0 : start2 + t - end1);
                            sxg[g] = ox < 0 ? shift0 : (ox == 0 ? shift1 : shift2);
                            float4 q = make_float4(0.f, 0.f, 0.f, 0.f);
                            if (valid[g]) q = __ldg(&xr[jg[g]]);
                            /* relative to the home cell's corner */
                            qx[g] = q.x + fwidth * ox, qy[g] = q.y + fwidth * oy,
                            qz[g] = q.z + fwidth * oz;
                            entry[g] =
                                (unsigned)jg[g] | ((relative_codes ? offset_code(ox, oy, oz)
                                                                   : offset_code(sxg[g], sy, sz))
                                                   << INDEX_BITS);
                        }
                        /* bit a: home a within reach (hits) or for the
                         * float64 test to decide (unsure); each home's
                         * position read once for all the lane's candidates */
                        unsigned hits[GROUP] = {}, unsure[GROUP] = {};
#pragma unroll
                        for (int a = 0; a < 32; a++) {
                            if (a >= homes) break;
                            const float4 p = home[a];
#pragma unroll
                            for (int g = 0; g < GROUP; g++) {
                                const float dx = p.x - qx[g], dy = p.y - qy[g], dz = p.z - qz[g];
                                const float s2 = dx * dx + dy * dy + dz * dz;
                                hits[g] |= (unsigned)(s2 < screen_low) << a; /* NaN: not */
                                unsure[g] |= (unsigned)(s2 < screen_high) << a;
                            }
                        }
#pragma unroll
                        for (int g = 0; g < GROUP; g++) {
                            const int j = jg[g];
                            unsigned h = hits[g], u = unsure[g] & ~hits[g];
                            if (test_f64) u = homes == 32 ? ~0u : (1u << homes) - 1, h = 0;
                            if (!valid[g]) h = u = 0;
                            if (j >= h0 && j < h0 + homes) { /* itself */
                                h &= ~(1u << (j - h0));
                                u &= ~(1u << (j - h0));
                            }
                            if (u) { /* md.c's test (the file's head) */
                                const md_vec pj = x[j];
                                const int sx = sxg[g];
                                do {
                                    const int b = __ffs(u) - 1;
                                    u &= u - 1;
                                    const md_vec pi = x[h0 + b];
                                    const double ex = pi.x - pj.x - box * sx,
                                                 ey = pi.y - pj.y - box * sy,
                                                 ez = pi.z - pj.z - box * sz;
                                    if (ex * ex + ey * ey + ez * ez < reach2) h |= 1u << b;
                                } while (u);
                            }
                            /* lane a takes bit a of each lane's hits: the
                             * 32 x 32 bit matrix transposed by swapping its
                             * blocks across lanes, halving them each round */
#pragma unroll
                            for (int w = 16; w > 0; w >>= 1) {
                                const unsigned low = w == 16  ? 0x0000ffffu
                                                     : w == 8 ? 0x00ff00ffu
                                                     : w == 4 ? 0x0f0f0f0fu
                                                     : w == 2 ? 0x33333333u
                                                              : 0x55555555u;
                                const unsigned other = __shfl_xor_sync(0xffffffffu, h, w);
                                h = lane & w ? (h & ~low) | ((other & ~low) >> w)
                                             : (h & low) | ((other & low) << w);
                            }
                            hits[g] = h;
                            cand[32 * g + lane] = entry[g];
                        }
                        __syncwarp();
                        /* hits[g]: bit l, candidate t0 + 32 g + l within
                         * reach of this lane's home atom; they take its next
                         * slots in candidate order. A stage that might not
                         * hold them is written out first (this lane's
                         * alone: rare). */
#pragma unroll
                        for (int g = 0; g < GROUP; g++) {
                            unsigned h = hits[g];
                            const int more = __popc(h);
                            if (staged + more > CELL_STAGE) flush_to(found / CHUNK * CHUNK);
                            found += more;
                            while (h) {
                                const int l = __ffs(h) - 1;
                                h &= h - 1;
                                stage[lane * CELL_STAGE_STRIDE + staged++] = cand[32 * g + l];
                            }
                        }
                        __syncwarp();
                    }
                }
            }
            flush_to(found);
            if (lane < homes) {
                count[h0 + lane] = found < capacity ? found : capacity;
                if (found > capacity) {
                    flags->overflow = 1;
                    atomicMax(&flags->longest, found);
                }
            }
        }
    }
}

__global__ void md_end_build(md_flags *flags) {
    if (flags->rebuild) flags->builds++;
    flags->rebuild = 0;
}

/* ---------------------------------------------------------- the forces */

/* Sums `value` over the LANES threads of an atom (aligned groups of a
 * warp); every thread of the warp must call it. */
template <int LANES, typename T> __device__ __forceinline__ T lanes_sum(T value) {
#pragma unroll
    for (int offset = LANES / 2; offset > 0; offset >>= 1)
        value += __shfl_xor_sync(0xffffffffu, value, offset);
    return value;
}

/* LANES threads per atom: lane l takes slots l, l + LANES, .. of the row.
 * With drift.v (the fused step, never with THERMO) lane 0 then ends the
 * atom's step and begins the next (kick_drift) instead of storing f.
 * UNROLL (1, 2, 4 or 8; 1 with THERMO): partners taken a group at a time,
 * their loads issued together (the loop's comment).
 * F32: pair forces computed and summed in float32 from xr (cell-relative
 * positions, the code being the partner's cell offset); else in float64
 * from x (the code being the partner's image), md.c's expressions.
 * THERMO: also the pair energy and virial in float64 from x, summed per
 * block into partials[2 * block] and [2 * block + 1] (each pair counted
 * from both ends: the reduction halves them). */
template <bool THERMO, bool F32, int LANES, int UNROLL>
__global__ void __launch_bounds__(ATOM_THREADS)
    md_forces(int64_t n, const md_vec *__restrict__ x, const float4 *__restrict__ xr,
              const int *__restrict__ count, const unsigned *__restrict__ neigh,
              md_vec *__restrict__ f, double box, double inv_box, double width, double rc2,
              double *__restrict__ partials, md_drift drift) {
    /* F32: each code's cell offset times the cell's width (the build's
     * float32 values, exact negatives of each other, so the two halves of a
     * pair see opposite separations) */
    __shared__ float4 cell_offset[27];
    if (F32) {
        if (threadIdx.x < 27) {
            const int c = threadIdx.x;
            const float fw = (float)width;
            cell_offset[c] =
                make_float4(fw * (c % 3 - 1), fw * ((c / 3) % 3 - 1), fw * (c / 9 - 1), 0.f);
        }
        __syncthreads();
    }
    const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    const int64_t i = t / LANES;
    const int lane = (int)(t % LANES);
    typedef typename std::conditional<F32, float, double>::type Real;
    Real fx = 0, fy = 0, fz = 0;
    double e = 0, w = 0;
    if (i < n) {
        const int partners = count[i];
        const unsigned *row = neigh + i * LANES + lane;
        const int64_t stride = n * LANES;
        md_vec p = {0, 0, 0, 0};
        if (!F32 || THERMO) p = x[i];
        float4 pr = make_float4(0.f, 0.f, 0.f, 0.f);
        if (F32) pr = xr[i];
        const float frc2 = (float)rc2;
        /* UNROLL > 1: that many entries, then that many partners'
         * positions (through the read-only path) loaded before any is used,
         * and the next group's entries loaded before this group's
         * positions: more loads in flight for each thread. UNROLL 1 is the
         * plain loop. The pairs are summed in the same order either way. */
        typedef typename std::conditional<F32, float4, md_vec>::type Position;
        unsigned next[UNROLL];
        if (UNROLL > 1) {
#pragma unroll
            for (int u = 0; u < UNROLL; u++)
                next[u] = lane + u * LANES < partners ? __ldg(row + u * stride) : 0u;
        }
        for (int k = lane, s = 0; k < partners; k += LANES * UNROLL, s += UNROLL) {
            unsigned entries[UNROLL];
            Position partner[UNROLL];
            if (UNROLL == 1) {
                entries[0] = __ldg(row + s * stride);
                const int j = (int)(entries[0] & INDEX_MASK);
                if constexpr (F32)
                    partner[0] = xr[j];
                else
                    partner[0] = x[j];
            } else {
#pragma unroll
                for (int u = 0; u < UNROLL; u++)
                    entries[u] = next[u];
#pragma unroll
                for (int u = 0; u < UNROLL; u++)
                    next[u] = k + (UNROLL + u) * LANES < partners
                                  ? __ldg(row + (s + UNROLL + u) * stride)
                                  : 0u;
#pragma unroll
                for (int u = 0; u < UNROLL; u++) {
                    const int j = (int)(entries[u] & INDEX_MASK);
                    if (k + u * LANES < partners) {
                        if constexpr (F32) {
                            partner[u] = __ldg(&xr[j]);
                        } else {
                            const double2 xy = __ldg((const double2 *)&x[j]);
                            partner[u].x = xy.x, partner[u].y = xy.y;
                            partner[u].z = __ldg(&x[j].z), partner[u].w = 0;
                        }
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                if (k + u * LANES >= partners) break;
                const unsigned entry = entries[u];
                const int j = (int)(entry & INDEX_MASK);
                const unsigned code = entry >> INDEX_BITS;
                double dx = 0, dy = 0, dz = 0, r2 = 0;
                if constexpr (F32) {
                    const float4 q = partner[u], o = cell_offset[code];
                    const float ex = pr.x - q.x - o.x, ey = pr.y - q.y - o.y, ez = pr.z - q.z - o.z;
                    const float s2 = ex * ex + ey * ey + ez * ez;
                    if (s2 < frc2) {
                        /* float32 division is not exact-rounded under
                         * --use_fast_math: unbiased enough for forces, not
                         * for the printed energy (THERMO does that in
                         * float64) */
                        const float r2inv = 1.f / s2, r6inv = r2inv * r2inv * r2inv;
                        const float fpair = r6inv * (48.f * r6inv - 24.f) * r2inv;
                        fx += ex * fpair, fy += ey * fpair, fz += ez * fpair;
                    }
                    if (THERMO) {
                        const md_vec q64 = x[j];
                        dx = nearest(p.x - q64.x, box, inv_box);
                        dy = nearest(p.y - q64.y, box, inv_box);
                        dz = nearest(p.z - q64.z, box, inv_box);
                        r2 = dx * dx + dy * dy + dz * dz;
                    }
                } else {
                    const md_vec q = partner[u];
                    dx = p.x - q.x, dy = p.y - q.y, dz = p.z - q.z;
                    if (code != CODE_NONE) { /* near a face: the image is a box away */
                        const int c = (int)code;
                        dx -= box * (c % 3 - 1), dy -= box * ((c / 3) % 3 - 1),
                            dz -= box * (c / 9 - 1);
                    }
                    r2 = dx * dx + dy * dy + dz * dz;
                    if (r2 < rc2) { /* md.c's expressions (float64 division is
                                     * exact-rounded even under --use_fast_math) */
                        const double r2inv = 1.0 / r2, r6inv = r2inv * r2inv * r2inv;
                        const double fpair = r6inv * (48.0 * r6inv - 24.0) * r2inv;
                        fx += dx * fpair, fy += dy * fpair, fz += dz * fpair;
                    }
                }
                if (THERMO && r2 < rc2) {
                    const double r2i = 1.0 / r2, r6i = r2i * r2i * r2i;
                    e += 4.0 * r6i * (r6i - 1.0);
                    w += r2 * (r6i * (48.0 * r6i - 24.0) * r2i);
                }
            }
        }
    }
    if (LANES > 1) {
        fx = lanes_sum<LANES>(fx), fy = lanes_sum<LANES>(fy), fz = lanes_sum<LANES>(fz);
    }
    if (i < n && lane == 0) {
        md_vec out;
        out.x = fx, out.y = fy, out.z = fz, out.w = 0;
        if (!THERMO && drift.v)
            kick_drift(i, x[i], out, true, drift);
        else if (f)
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
    md_reduce_thermo(int energy_blocks, const double *__restrict__ energy, int v2_blocks,
                     const double *__restrict__ v2, md_flags *flags) {
    double e = 0, w = 0, s = 0;
    for (int b = threadIdx.x; b < energy_blocks; b += REDUCE_THREADS)
        e += energy[2 * b], w += energy[2 * b + 1];
    for (int b = threadIdx.x; b < v2_blocks; b += REDUCE_THREADS)
        s += v2[b];
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
    double width; /* of a cell */
    int lanes, lanes_log2;
    int64_t slots; /* of the neighbour list: row_capacity rounded up to MAX_LANES, times n */
    int atom_blocks, loop_blocks, force_blocks;
    int build_blocks;      /* as many as are resident at once: one wave, no tail */
    int cell_build_blocks; /* the same for md_build_cells */
    int cell_group;        /* its candidates a lane: 2, or 1 with GPC_MD_LIST=cells1 */
    int64_t since_build;   /* steps since the last build, for rebuild_every */
    cudaStream_t stream;
    md_vec *x, *v, *x_built, *v_tmp;
    md_vec *f;
    float4 *xr; /* positions relative to each atom's cell, float32 (the file's head) */
    /* the fused step's other position buffers (NULL without it): it reads x
     * and xr, writes these, and the two swap */
    md_vec *x_alt;
    float4 *xr_alt;
    long long *id, *id_tmp;
    int *cell_of, *cell_rank, *cell_count, *cell_start, *order, *count;
    unsigned *neigh;
    void *scan_tmp;
    size_t scan_bytes;
    double *energy_partials, *v2_partials;
    md_flags *flags; /* on the device */
    md_flags host;   /* its last copy */
    /* a run ended since the pair energy and virial were summed (they are
     * summed when asked for), and the step it ended on */
    int energy_stale;
    long long last_step;
    /* GPC_MD_PHASES: events recorded between the phases of the queue, each
     * with the phase it ends (-1: a run's start), tallied into phase_ms when
     * the host next waits */
    int phases_on;
    cudaEvent_t *events;
    int *event_phase;
    int event_cap, event_used;
    double phase_ms[GPC_MD_PHASES];
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

/* Slots a row has: a multiple of every lane count, so the layout of any is
 * a whole array. */
static int64_t rounded_capacity(const gpc_md_cuda_config *c) {
    return ((int64_t)c->row_capacity + MAX_LANES - 1) / MAX_LANES * MAX_LANES;
}

static int64_t cells_of(const gpc_md_cuda_config *c) {
    return (int64_t)c->cells_per_side * c->cells_per_side * c->cells_per_side;
}

extern "C" double gpc_md_cuda_bytes(const gpc_md_cuda_config *c) {
    const double n = (double)c->atoms;
    /* x, v, f, x_built and the gather's velocities, 32 bytes each; xr 16;
     * ids and their buffer 16; cell, rank, order, count 16; the rows; the
     * fused step's second x and xr */
    const double per_atom =
        5 * 32 + 16 + 16 + 16 + 4.0 * rounded_capacity(c) + (c->fused_step ? 32 + 16 : 0);
    /* cell counts and starts, CUB's scan space (under 1% of the counts),
     * the thermo partials, and the context's own share */
    const double cells = 8.0 * (double)(cells_of(c) + 1) * 1.1 + 1e6;
    return n * per_atom + cells + 24.0 * (n / ATOM_THREADS + 1) + 512.0 * (1 << 20);
}

extern "C" gpc_status gpc_md_cuda_check(int device, const gpc_md_cuda_config *c) {
    size_t free_bytes = 0, total_bytes = 0;
    GPC_TRY(sci_cuda_open("md", device, &free_bytes, &total_bytes));
    if (c->atoms > (int64_t)INDEX_MASK + 1)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "md: %lld atoms on a GPU: at most %u (neighbour entries hold 27 bits of "
                         "index): use fewer cells",
                         (long long)c->atoms, INDEX_MASK + 1);
    if (c->lanes != 0 && c->lanes != 1 && c->lanes != 2 && c->lanes != 4 && c->lanes != 8)
        return gpc_error(GPC_ERR_INVALID_ARG, "md: %d GPU lanes per atom: use 1, 2, 4 or 8",
                         c->lanes);
    if (c->unroll != 0 && c->unroll != 1 && c->unroll != 2 && c->unroll != 4 && c->unroll != 8)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "md: %d partners at a time in the force kernel: use 1, 2, 4 or 8",
                         c->unroll);
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
    void *buffers[] = {g->x,
                       g->v,
                       g->x_built,
                       g->v_tmp,
                       g->f,
                       g->xr,
                       g->id,
                       g->id_tmp,
                       g->cell_of,
                       g->cell_rank,
                       g->cell_count,
                       g->cell_start,
                       g->order,
                       g->count,
                       g->neigh,
                       g->scan_tmp,
                       g->energy_partials,
                       g->v2_partials,
                       g->flags,
                       g->x_alt,
                       g->xr_alt};
    for (size_t k = 0; k < sizeof buffers / sizeof buffers[0]; k++)
        cudaFree(buffers[k]);
    for (int k = 0; k < g->event_cap; k++)
        if (g->events[k]) cudaEventDestroy(g->events[k]);
    gpc_free(g->events);
    gpc_free(g->event_phase);
    if (g->stream) cudaStreamDestroy(g->stream);
    gpc_free(g);
}

/* md_build_cells for a layout of 2^lanes_log2 lanes an atom (its stores
 * are runs of the slots consecutive in memory: 1, 2, or 4 of 4 or 8) and
 * `group` candidates a lane. */
static auto cell_builder(int lanes_log2, int group) {
    if (group == 1)
        return lanes_log2 >= 2   ? md_build_cells<4, 1>
               : lanes_log2 == 1 ? md_build_cells<2, 1>
                                 : md_build_cells<1, 1>;
    return lanes_log2 >= 2   ? md_build_cells<4, 2>
           : lanes_log2 == 1 ? md_build_cells<2, 2>
                             : md_build_cells<1, 2>;
}

/* Queues the build (each kernel returns at once unless flags->rebuild). */
static gpc_status queue_build(gpc_md_cuda *g, long long step) {
    const int lb = g->loop_blocks, t = LOOP_THREADS;
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
    md_gather<<<lb, t, 0, g->stream>>>(g->n, g->order, g->x, g->v, g->id, g->x_built, g->xr,
                                       g->v_tmp, g->id_tmp, g->inv_box, g->m, g->width, g->flags);
    md_copy_back<<<lb, t, 0, g->stream>>>(g->n, g->x_built, g->v_tmp, g->id_tmp, g->x, g->v, g->id,
                                          g->flags);
    const float screen_low = (float)(g->reach2 * (1 - SCREEN_MARGIN)),
                screen_high = (float)(g->reach2 * (1 + SCREEN_MARGIN));
    if (!g->c.build_per_atom) {
        cell_builder(g->lanes_log2,
                     g->cell_group)<<<g->cell_build_blocks, CELL_BUILD_THREADS, 0, g->stream>>>(
            g->n, g->x, g->xr, box, g->m, g->width, g->cell_start, g->cells, g->reach2, screen_low,
            screen_high, g->c.build_f64, g->c.forces_f32, g->c.row_capacity, g->lanes_log2,
            g->count, g->neigh, g->flags);
        md_end_build<<<1, 1, 0, g->stream>>>(g->flags);
        GPC_CUDA_CHECK_LAUNCH();
        return GPC_OK;
    }
    auto build = g->c.unroll == 8   ? md_build<8>
                 : g->c.unroll == 4 ? md_build<4>
                 : g->c.unroll == 2 ? md_build<2>
                                    : md_build<1>;
    build<<<g->build_blocks, t, 0, g->stream>>>(g->n, g->x, g->xr, box, g->inv_box, g->m, g->width,
                                                g->cell_start, g->reach2, screen_low, screen_high,
                                                g->c.build_f64, g->c.forces_f32, g->c.row_capacity,
                                                g->lanes_log2, g->count, g->neigh, g->flags);
    md_end_build<<<1, 1, 0, g->stream>>>(g->flags);
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

/* With GPC_MD_PHASES: an event in the queue ending `phase` (-1: the start
 * of a run). */
static gpc_status mark(gpc_md_cuda *g, int phase) {
    if (!g->phases_on) return GPC_OK;
    if (g->event_used == g->event_cap) {
        const int cap = g->event_cap ? 2 * g->event_cap : 128;
        cudaEvent_t *events = (cudaEvent_t *)gpc_calloc((size_t)cap, sizeof *events);
        int *tags = (int *)gpc_calloc((size_t)cap, sizeof *tags);
        if (!events || !tags) {
            gpc_free(events), gpc_free(tags);
            return gpc_error(GPC_ERR_NOMEM, "md: out of host memory");
        }
        if (g->event_cap) {
            memcpy(events, g->events, (size_t)g->event_cap * sizeof *events);
            memcpy(tags, g->event_phase, (size_t)g->event_cap * sizeof *tags);
        }
        gpc_free(g->events), gpc_free(g->event_phase);
        g->events = events, g->event_phase = tags;
        for (int k = g->event_cap; k < cap; k++) {
            GPC_CUDA_CHECK(cudaEventCreate(&g->events[k]));
            g->event_cap = k + 1;
        }
    }
    GPC_CUDA_CHECK(cudaEventRecord(g->events[g->event_used], g->stream));
    g->event_phase[g->event_used++] = phase;
    return GPC_OK;
}

/* After the stream has drained: the time between each event and the one
 * before, added to the phase the later one ends. */
static gpc_status tally_phases(gpc_md_cuda *g) {
    for (int k = 1; k < g->event_used; k++) {
        if (g->event_phase[k] < 0) continue;
        float ms = 0;
        GPC_CUDA_CHECK(cudaEventElapsedTime(&ms, g->events[k - 1], g->events[k]));
        g->phase_ms[g->event_phase[k]] += ms;
    }
    g->event_used = 0;
    return GPC_OK;
}

/* Waits for the queue and reads the flags; turns what they say into the
 * errors md.c gives on the CPU. `last` is the step the queue ended on. */
static gpc_status read_flags(gpc_md_cuda *g, long long last) {
    GPC_CUDA_CHECK(
        cudaMemcpyAsync(&g->host, g->flags, sizeof g->host, cudaMemcpyDeviceToHost, g->stream));
    GPC_CUDA_CHECK(cudaStreamSynchronize(g->stream));
    GPC_TRY(tally_phases(g));
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

/* The drift of the step beginning at `step`: into x and xr in place
 * (md_integrate) or into the other buffers (the fused step). */
static md_drift drift_of(gpc_md_cuda *g, long long step, bool into_other) {
    md_drift d;
    d.v = g->v;
    d.x = into_other ? g->x_alt : g->x;
    d.xr = g->c.forces_f32 ? (into_other ? g->xr_alt : g->xr) : NULL;
    d.x_built = g->x_built;
    d.inv_box = g->inv_box, d.width = g->width, d.dt = g->c.dt, d.half_dt = 0.5 * g->c.dt;
    d.limit2 = g->limit2;
    d.m = g->m;
    d.step = step;
    d.flags = g->flags;
    return d;
}

/* drift.v NULL: store the forces in f (NULL: not at all); else the fused
 * step (not with THERMO). */
template <bool THERMO, bool F32, int UNROLL>
static void launch_forces(gpc_md_cuda *g, const md_drift &drift, md_vec *f) {
    const dim3 grid(g->force_blocks), block(ATOM_THREADS);
    double *partials = THERMO ? g->energy_partials : NULL;
#define MD_FORCES(LANES)                                                                           \
    md_forces<THERMO, F32, LANES, UNROLL>                                                          \
        <<<grid, block, 0, g->stream>>>(g->n, g->x, g->xr, g->count, g->neigh, f, g->c.box,        \
                                        g->inv_box, g->width, g->rc2, partials, drift)
    switch (g->lanes) {
    case 1:
        MD_FORCES(1);
        break;
    case 2:
        MD_FORCES(2);
        break;
    case 4:
        MD_FORCES(4);
        break;
    default:
        MD_FORCES(8);
        break;
    }
#undef MD_FORCES
}

/* Queues the force kernel in the run's precision and lanes: the forces
 * into f, with the thermo sums when `thermo`; or (`fused_next`, the step
 * beginning then) the fused step, which ends each atom's step and drifts it
 * into the other position buffers, then makes those the current ones. */
static void queue_forces(gpc_md_cuda *g, bool thermo, long long fused_next = 0,
                         bool store_f = true) {
    md_vec *f = store_f ? g->f : NULL;
    md_drift drift = {};
    if (fused_next) drift = drift_of(g, fused_next, true);
    /* the thermo sums (for a printed row) in the plain loop */
    const int unroll = thermo ? 1 : g->c.unroll;
    if (g->c.forces_f32) {
        if (thermo)
            launch_forces<true, true, 1>(g, drift, f);
        else if (unroll == 8)
            launch_forces<false, true, 8>(g, drift, f);
        else if (unroll == 4)
            launch_forces<false, true, 4>(g, drift, f);
        else if (unroll == 2)
            launch_forces<false, true, 2>(g, drift, f);
        else
            launch_forces<false, true, 1>(g, drift, f);
    } else {
        if (thermo)
            launch_forces<true, false, 1>(g, drift, f);
        else if (unroll == 8)
            launch_forces<false, false, 8>(g, drift, f);
        else if (unroll == 4)
            launch_forces<false, false, 4>(g, drift, f);
        else if (unroll == 2)
            launch_forces<false, false, 2>(g, drift, f);
        else
            launch_forces<false, false, 1>(g, drift, f);
    }
    if (fused_next) {
        md_vec *x = g->x;
        g->x = g->x_alt, g->x_alt = x;
        float4 *xr = g->xr;
        g->xr = g->xr_alt, g->xr_alt = xr;
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
    md_reduce_thermo<<<1, REDUCE_THREADS, 0, g->stream>>>(g->force_blocks, g->energy_partials,
                                                          g->atom_blocks, g->v2_partials, g->flags);
    GPC_CUDA_CHECK_LAUNCH();
    g->energy_stale = 0;
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
    g->phases_on = gpc_setting_flag("GPC_MD_PHASES");
    {
        const char *list = gpc_setting_str("GPC_MD_LIST");
        g->cell_group = list && strcmp(list, "cells1") == 0 ? 1 : MAX_CELL_GROUP;
    }
    g->n = config->atoms;
    g->m = config->cells_per_side;
    g->cells = cells_of(config);
    g->inv_box = 1.0 / config->box;
    g->rc2 = config->cutoff * config->cutoff;
    const double reach = config->cutoff + config->skin;
    g->reach2 = reach * reach;
    g->limit2 = 0.25 * config->skin * config->skin;
    g->width = config->box / config->cells_per_side;
    g->lanes = config->lanes ? config->lanes : DEFAULT_LANES;
    while ((1 << g->lanes_log2) < g->lanes)
        g->lanes_log2++;
    g->slots = rounded_capacity(config) * g->n;
    g->atom_blocks = (int)((g->n + ATOM_THREADS - 1) / ATOM_THREADS);
    g->force_blocks = (int)((g->n * g->lanes + ATOM_THREADS - 1) / ATOM_THREADS);
    {
        cudaDeviceProp prop;
        MD_CHECK(cudaGetDeviceProperties(&prop, device));
        snprintf(g->name, sizeof g->name, "%s (cuda:%d)", prop.name, device);
        g->loop_blocks = prop.multiProcessorCount * LOOP_BLOCKS_PER_SM;
        int resident = 0;
        auto build = config->unroll == 8   ? md_build<8>
                     : config->unroll == 4 ? md_build<4>
                     : config->unroll == 2 ? md_build<2>
                                           : md_build<1>;
        MD_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, build, LOOP_THREADS, 0));
        g->build_blocks = prop.multiProcessorCount * (resident > 0 ? resident : 1);
        resident = 0;
        MD_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &resident, cell_builder(g->lanes_log2, g->cell_group), CELL_BUILD_THREADS, 0));
        g->cell_build_blocks = prop.multiProcessorCount * (resident > 0 ? resident : 1);
    }
    /* a blocking stream: it waits for the default stream's copies and sets
     * too, so no copy below can race a kernel */
    MD_CHECK(cudaStreamCreate(&g->stream));
    {
        const size_t n = (size_t)g->n, vec = n * sizeof(md_vec);
        MD_CHECK(cudaMalloc(&g->x, vec));
        MD_CHECK(cudaMalloc(&g->v, vec));
        MD_CHECK(cudaMalloc(&g->x_built, vec));
        MD_CHECK(cudaMalloc(&g->v_tmp, vec));
        MD_CHECK(cudaMalloc(&g->f, vec));
        MD_CHECK(cudaMalloc(&g->xr, n * sizeof(float4)));
        if (config->fused_step) {
            MD_CHECK(cudaMalloc(&g->x_alt, vec));
            MD_CHECK(cudaMalloc(&g->xr_alt, n * sizeof(float4)));
        }
        MD_CHECK(cudaMalloc(&g->id, n * sizeof(long long)));
        MD_CHECK(cudaMalloc(&g->id_tmp, n * sizeof(long long)));
        MD_CHECK(cudaMalloc(&g->cell_of, n * sizeof(int)));
        MD_CHECK(cudaMalloc(&g->cell_rank, n * sizeof(int)));
        MD_CHECK(cudaMalloc(&g->order, n * sizeof(int)));
        MD_CHECK(cudaMalloc(&g->count, n * sizeof(int)));
        MD_CHECK(cudaMalloc(&g->neigh, (size_t)g->slots * sizeof(unsigned)));
        MD_CHECK(cudaMalloc(&g->cell_count, (size_t)(g->cells + 1) * sizeof(int)));
        MD_CHECK(cudaMalloc(&g->cell_start, (size_t)(g->cells + 1) * sizeof(int)));
        MD_CHECK(cudaMalloc(&g->energy_partials, 2 * (size_t)g->force_blocks * sizeof(double)));
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
    const double half_dt = 0.5 * g->c.dt;
    GPC_TRY(mark(g, -1));
    for (int s = 0; s < steps; s++) {
        const long long step = (long long)first_step + s + 1;
        /* fused: only a run's first step begins here; the force kernel of
         * each step before the last begins the next */
        if (s == 0 || !g->c.fused_step) {
            md_integrate<<<g->atom_blocks, ATOM_THREADS, 0, g->stream>>>(g->n, g->f, s > 0,
                                                                         drift_of(g, step, false));
            GPC_TRY(mark(g, GPC_MD_PHASE_INTEGRATE));
        }
        int forced = -1;
        if (g->c.rebuild_every > 0) {
            forced = ++g->since_build >= g->c.rebuild_every;
            if (forced) g->since_build = 0;
        }
        md_decide<<<1, 1, 0, g->stream>>>(g->flags, forced);
        GPC_TRY(mark(g, GPC_MD_PHASE_DECIDE));
        GPC_TRY(queue_build(g, step));
        GPC_TRY(mark(g, GPC_MD_PHASE_BUILD));
        const bool last = s == steps - 1;
        queue_forces(g, false, g->c.fused_step && !last ? step + 1 : 0);
        GPC_CUDA_CHECK_LAUNCH();
        GPC_TRY(mark(g, GPC_MD_PHASE_FORCES));
    }
    /* the closing half kick and the sum of v^2 (a blow-up check); the pair
     * energy and virial wait until they are asked for (sums_get) */
    md_finish<<<g->atom_blocks, ATOM_THREADS, 0, g->stream>>>(g->n, g->v, g->f, half_dt, 1,
                                                              g->v2_partials);
    md_reduce_thermo<<<1, REDUCE_THREADS, 0, g->stream>>>(0, g->energy_partials, g->atom_blocks,
                                                          g->v2_partials, g->flags);
    GPC_CUDA_CHECK_LAUNCH();
    GPC_TRY(mark(g, GPC_MD_PHASE_THERMO));
    g->last_step = (long long)first_step + steps;
    g->energy_stale = 1;
    return read_flags(g, g->last_step);
}

extern "C" gpc_status gpc_md_cuda_compute(gpc_md_cuda *g, const double *x, const double *v) {
    GPC_CUDA_CHECK(cudaSetDevice(g->device));
    if (x) GPC_TRY(upload_vec(g, g->x, x));
    if (v) GPC_TRY(upload_vec(g, g->v, v));
    return compute_now(g, 0);
}

extern "C" gpc_status gpc_md_cuda_sums_get(gpc_md_cuda *g, gpc_md_cuda_sums *out) {
    /* v^2 is read back at the end of every create, compute and run; the pair
     * energy and virial at a create or compute, and after a run here, at
     * the first call: the thermo force kernel over the same positions and
     * list (forces not stored again: they are the run's), then the sums in
     * their fixed order, as a run that ended with them would have */
    if (g->energy_stale) {
        gpc_status st = GPC_OK;
        if (cudaSetDevice(g->device) != cudaSuccess)
            st = gpc_error(GPC_ERR_DEVICE, "md: cannot select cuda:%d", g->device);
        if (st == GPC_OK) st = mark(g, -1);
        if (st == GPC_OK) {
            queue_forces(g, true, 0, false);
            md_reduce_thermo<<<1, REDUCE_THREADS, 0, g->stream>>>(
                g->force_blocks, g->energy_partials, g->atom_blocks, g->v2_partials, g->flags);
            const cudaError_t err = cudaGetLastError();
            if (err != cudaSuccess)
                st = gpc_error(GPC_ERR_DEVICE, "md: %s", cudaGetErrorString(err));
        }
        if (st == GPC_OK) st = mark(g, GPC_MD_PHASE_THERMO);
        if (st == GPC_OK) st = read_flags(g, g->last_step);
        if (st != GPC_OK) {
            out->potential = out->virial = out->v2 = NAN;
            return st;
        }
        g->energy_stale = 0;
    }
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
    unsigned *slots = (unsigned *)gpc_malloc((size_t)g->slots * sizeof *slots);
    if (!slots) return gpc_error(GPC_ERR_NOMEM, "md: out of host memory for the neighbour list");
    cudaError_t err =
        cudaMemcpy(slots, g->neigh, (size_t)g->slots * sizeof(unsigned), cudaMemcpyDeviceToHost);
    if (err == cudaSuccess)
        for (int64_t i = 0; i < n; i++)
            for (int k = 0; k < cap; k++)
                rows[i * cap + k] =
                    k < counts[i] ? (int32_t)(slots[slot_of(i, k, n, g->lanes_log2)] & INDEX_MASK)
                                  : -1;
    gpc_free(slots);
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

extern "C" int gpc_md_cuda_phase_ms(const gpc_md_cuda *g, double *ms) {
    if (!g->phases_on) return 0;
    for (int p = 0; p < GPC_MD_PHASES; p++)
        ms[p] = g->phase_ms[p];
    return 1;
}

extern "C" const char *gpc_md_cuda_device_name(const gpc_md_cuda *g) {
    return g->name;
}
