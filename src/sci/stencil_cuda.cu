/*
 * stencil_cuda.cu: the 7-point heat-equation stencil on a GPU, in f32 and
 * f64 (stencil_cuda.h has the layout and the step's two halves).
 *
 * The update is bound by memory: a load and a store of an element a point
 * at best, against 8 flops. Its ceiling is a device-to-device copy, so a
 * kernel must read each point from DRAM about once and keep enough loads in
 * flight (some 32-64 KiB an SM) to cover HBM's latency. Seven kernels do
 * it in different ways; GPC_STENCIL_KERNEL picks one (stencil_cuda.h):
 *
 *   vector  a thread owns 16 bytes of a row (4 floats or 2 doubles) and
 *           marches along z through a chunk of planes. Planes z - 1, z and
 *           z + 1 of its points sit in a register queue that runs A planes
 *           ahead; the x and y neighbours are loaded from global memory,
 *           where the block's own loads of the plane left them in L1. No
 *           shared memory, no barrier: each warp streams on its own.
 *   column  the same with one point a thread.
 *   plain   one point a thread and plane, all seven values loaded; L1 and
 *           L2 give the reuse (the 3D scheme with nothing in registers).
 *   shared  the 2.5D scheme of Micikevicius ("3D finite difference
 *           computation on GPUs using CUDA", 2009): a 32 x 8 tile marches
 *           along z, the plane's tile with its rim in shared memory, two
 *           barriers a plane.
 *   twostep two time steps a pass (stencil_two_steps), so half the bytes
 *           a step; one slab in one process only, other steps by vector.
 *   async   a 128 x 16 (f32) or 64 x 16 (f64) tile marches along z; each
 *           plane of it with its rim is copied into a ring of five
 *           shared-memory stages by cp.async, three planes ahead, which
 *           keeps the bytes in flight without registers or L1 to hold
 *           them; a thread computes 16 bytes of two rows from the stages,
 *           one barrier a plane (GPC_STENCIL_ASYNC_ROWS: tiles of 8 or 32
 *           rows instead, in six or four stages).
 *   stream2 two time steps a pass (stencil_stream2), streamed like vector:
 *           16 bytes of a row a thread, u's planes in a register queue, a
 *           tile of 6 rows (GPC_STENCIL_STREAM2_ROWS: 14 or 30) and its rim
 *           rows computing step one into two shared-memory planes, the
 *           tile's rows step two from them, one barrier a plane; each
 *           point is read and written once every two steps. The same
 *           restrictions as twostep.
 *
 * The queue's slots are indexed by the unrolled loop's counter, so
 * advancing it renames registers rather than moving values: a move would
 * wait for the load it moves, and the queue would run one plane ahead only.
 * Stores are streaming (evict-first): v is not read again before it leaves
 * L2, and u's planes stay there for the neighbours that read them.
 *
 * Every point is (1 - 6 r) u + r s in one fused multiply-add, s summed as
 * x-1, x+1, y-1, y+1, z-1, z+1, with round-to-nearest intrinsics that no
 * compiler flag contracts or reorders: in f64 that is the CPU's arithmetic
 * exactly, so every kernel gives the CPU's bits; the starting field is made
 * from the CPU's sine tables with the CPU's two products.
 */
#include "cuda/cuda_common.cuh"
#include "gpc/dist.h"
#include "sci/sci_cuda.cuh"
#include "sci/stencil_cuda.h"

#include <stdio.h>

enum { BX = 32, BY = 8 };

/* ------------------------------------------------------------ arithmetic */

__device__ __forceinline__ double add_rn(double a, double b) {
    return __dadd_rn(a, b);
}
__device__ __forceinline__ float add_rn(float a, float b) {
    return __fadd_rn(a, b);
}
__device__ __forceinline__ double mul_rn(double a, double b) {
    return __dmul_rn(a, b);
}
__device__ __forceinline__ float mul_rn(float a, float b) {
    return __fmul_rn(a, b);
}
__device__ __forceinline__ double fma_rn(double a, double b, double c) {
    return __fma_rn(a, b, c);
}
__device__ __forceinline__ float fma_rn(float a, float b, float c) {
    return __fmaf_rn(a, b, c);
}
__device__ __forceinline__ uint64_t bits_of(double x) {
    return (uint64_t)__double_as_longlong(x);
}
__device__ __forceinline__ uint64_t bits_of(float x) {
    return (uint64_t)(uint32_t)__float_as_uint(x);
}

/* --------------------------------------------------------------- kernels */

/* Planes in flight beyond z + 1 in stencil_update's register queue: enough
 * that the loads under way cover HBM's latency at full bandwidth (f32 moves
 * half the bytes a load, so it keeps more loads going), few enough that the
 * kernel stays within 32 registers, so 8 blocks of 256 threads fit an SM. */
template <typename T> struct ahead_of {
    enum { value = sizeof(T) == 8 ? 3 : 5 };
};

/* v = c6 u + r (six neighbours) on planes z_begin .. z_end - 1 of one slab,
 * blockIdx.z taking zchunk planes each. u and v point at x = 0 of row 0 of
 * plane 0; planes z_begin - 1 .. z_end are read. */
template <typename T>
__global__ void __launch_bounds__(BX *BY, 8)
    stencil_update(T *__restrict__ v, const T *__restrict__ u, int n, int pitch, long long plane,
                   int z_begin, int z_end, int zchunk, T c6, T r) {
    enum { AHEAD = ahead_of<T>::value, QUEUE = AHEAD + 3 };
    __shared__ T tile[BY + 2][BX + 2];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int x = blockIdx.x * BX + tx + 1, y = blockIdx.y * BY + ty + 1;
    const int zb = z_begin + (int)blockIdx.z * zchunk;
    const int ze = min(zb + zchunk, z_end);
    if (zb >= ze) return;                         /* the whole block: before any barrier */
    const bool stored = x <= n + 1 && y <= n + 1; /* the ring of zeros included */
    const bool inside = x <= n && y <= n;
    const T zero = 0;
    /* this thread's point on plane zb, in u and in v */
    const long long at = (long long)zb * plane + (long long)y * pitch + x;
    const T *p = u + at;
    T *w = v + at;
    /* q[k] holds plane z - 1 + k: below, here, above, then AHEAD planes on
     * their way. Planes zb - 1 .. ze are read; plane p is loaded only if
     * p <= ze. */
    T q[QUEUE];
#pragma unroll
    for (int k = 0; k < QUEUE - 1; k++)
        q[k] = stored && (k <= 2 || zb - 1 + k <= ze) ? p[(k - 1) * plane] : zero;
    for (int z = zb; z < ze; z++) {
        q[QUEUE - 1] = stored && z + AHEAD + 1 <= ze ? p[(AHEAD + 1) * plane] : zero;
        tile[ty + 1][tx + 1] = q[1];
        if (tx == 0 && y <= n + 1) tile[ty + 1][0] = p[-1];
        if (tx == BX - 1 && stored && x <= n) tile[ty + 1][BX + 1] = p[1];
        if (ty == 0 && x <= n + 1) tile[0][tx + 1] = p[-pitch];
        if (ty == BY - 1 && stored && y <= n) tile[BY + 1][tx + 1] = p[pitch];
        __syncthreads();
        if (inside) {
            T s = add_rn(tile[ty + 1][tx], tile[ty + 1][tx + 2]);
            s = add_rn(s, tile[ty][tx + 1]);
            s = add_rn(s, tile[ty + 2][tx + 1]);
            s = add_rn(s, q[0]);
            s = add_rn(s, q[2]);
            *w = fma_rn(c6, q[1], mul_rn(r, s));
        }
        __syncthreads(); /* the tile is rewritten next plane */
#pragma unroll
        for (int k = 0; k < QUEUE - 1; k++)
            q[k] = q[k + 1];
        p += plane, w += plane;
    }
}

/* V consecutive elements of a row: what a thread of the column kernels
 * loads with one instruction (16 bytes at most, aligned to their size). */
template <typename T, int V> struct run_of { T e[V]; };

template <typename T, int V> __device__ __forceinline__ run_of<T, V> load_nc(const T *p) {
    run_of<T, V> out;
    if constexpr (V == 1) {
        out.e[0] = __ldg(p);
    } else if constexpr (sizeof(T) == 4 && V == 2) {
        const float2 t = __ldg(reinterpret_cast<const float2 *>(p));
        out.e[0] = t.x, out.e[1] = t.y;
    } else if constexpr (sizeof(T) == 4 && V == 4) {
        const float4 t = __ldg(reinterpret_cast<const float4 *>(p));
        out.e[0] = t.x, out.e[1] = t.y, out.e[2] = t.z, out.e[3] = t.w;
    } else {
        static_assert(sizeof(T) == 8 && V == 2, "16 bytes a load at most");
        const double2 t = __ldg(reinterpret_cast<const double2 *>(p));
        out.e[0] = t.x, out.e[1] = t.y;
    }
    return out;
}

template <typename T, int V> __device__ __forceinline__ void store_cs(T *p, const run_of<T, V> &w) {
    if constexpr (V == 1) {
        __stcs(p, w.e[0]);
    } else if constexpr (sizeof(T) == 4 && V == 2) {
        __stcs(reinterpret_cast<float2 *>(p), make_float2(w.e[0], w.e[1]));
    } else if constexpr (sizeof(T) == 4 && V == 4) {
        __stcs(reinterpret_cast<float4 *>(p), make_float4(w.e[0], w.e[1], w.e[2], w.e[3]));
    } else {
        static_assert(sizeof(T) == 8 && V == 2, "16 bytes a store at most");
        __stcs(reinterpret_cast<double2 *>(p), make_double2(w.e[0], w.e[1]));
    }
}

/* One run's update: each point (1 - 6 r) u + r s, s summed x-1, x+1, y-1,
 * y+1, z-1, z+1 (the file's arithmetic), from the run itself (here), the
 * points beside its ends (west, east) and the runs of the rows and planes
 * around it; points past x = n (x is the run's first) are 0. */
template <typename T, int V>
__device__ __forceinline__ run_of<T, V>
update_run(const run_of<T, V> &here, T west, T east, const run_of<T, V> &north,
           const run_of<T, V> &south, const run_of<T, V> &below, const run_of<T, V> &above, int x,
           int n, T c6, T r) {
    run_of<T, V> w;
#pragma unroll
    for (int i = 0; i < V; i++) {
        T s = add_rn(i == 0 ? west : here.e[i > 0 ? i - 1 : 0],
                     i == V - 1 ? east : here.e[i < V - 1 ? i + 1 : 0]);
        s = add_rn(s, north.e[i]);
        s = add_rn(s, south.e[i]);
        s = add_rn(s, below.e[i]);
        s = add_rn(s, above.e[i]);
        w.e[i] = x + i <= n ? fma_rn(c6, here.e[i], mul_rn(r, s)) : T(0);
    }
    return w;
}

/* The column kernels (vector: V = 16 bytes of elements; column: V = 1).
 * A block is 32 x H threads over a tile of 32 V x H points of a plane, and
 * marches through planes zb .. ze - 1 of its z chunk (blockIdx.z). Rows are
 * padded and x = 1 sits on 128 bytes, so each thread's run is aligned; runs
 * reach past x = n into the padding, which is read but written as 0 (it and
 * the ring are 0 already). Plane p of the column sits in slot
 * (p - zb + 1) mod Q of the queue; planes past ze are loaded as plane ze,
 * never used, so the last chunk reads nothing beyond its halo plane. */
template <typename T, int V, int H, int A, int MIN_BLOCKS>
__global__ void __launch_bounds__(32 * H, MIN_BLOCKS)
    stencil_column(T *__restrict__ v, const T *__restrict__ u, int n, int pitch, long long plane,
                   int z_begin, int z_end, int zchunk, T c6, T r) {
    enum { Q = A + 2 };
    const int x = 1 + V * ((int)blockIdx.x * 32 + (int)threadIdx.x);
    const int y = 1 + (int)blockIdx.y * H + (int)threadIdx.y;
    const int zb = z_begin + (int)blockIdx.z * zchunk;
    const int ze = min(zb + zchunk, z_end);
    if (x > n || y > n || zb >= ze) return; /* no barrier below */
    const long long at = (long long)y * pitch + x;
    const T *col = u + at;
    T *out = v + at;
    run_of<T, V> q[Q];
#pragma unroll
    for (int k = 0; k <= A; k++)
        q[k] = load_nc<T, V>(col + min(zb - 1 + k, ze) * plane);
    for (int z0 = zb; z0 < ze; z0 += Q) {
#pragma unroll
        for (int j = 0; j < Q; j++) {
            const int z = z0 + j;
            if (z >= ze) break;
            /* plane z + A into the slot of plane z - 2, used last plane */
            q[(j + A + 1) % Q] = load_nc<T, V>(col + min(z + A, ze) * plane);
            const T *c = col + z * plane;
            const run_of<T, V> north = load_nc<T, V>(c - pitch), south = load_nc<T, V>(c + pitch);
            const T west = __ldg(c - 1), east = __ldg(c + V);
            const run_of<T, V> &below = q[j], &here = q[(j + 1) % Q], &above = q[(j + 2) % Q];
            const run_of<T, V> w =
                update_run(here, west, east, north, south, below, above, x, n, c6, r);
            store_cs<T, V>(out + z * plane, w);
        }
    }
}

/* 16-byte copies from global to shared memory that bypass L1 (cp.async.cg):
 * `bytes` 16, or 0 to fill the 16 bytes with zeros and read nothing. A
 * commit closes the copies issued since the last into a group; a wait
 * returns once at most N of this thread's groups are still under way. */
__device__ __forceinline__ void copy_async16(uint32_t dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void copy_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void copy_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* 16 bytes of a row in shared memory, aligned to 16. */
template <typename T, int V> __device__ __forceinline__ run_of<T, V> load_shared(const T *p) {
    run_of<T, V> out;
    if constexpr (sizeof(T) == 4) {
        static_assert(V == 4, "16 bytes a load");
        const float4 t = *reinterpret_cast<const float4 *>(p);
        out.e[0] = t.x, out.e[1] = t.y, out.e[2] = t.z, out.e[3] = t.w;
    } else {
        static_assert(V == 2, "16 bytes a load");
        const double2 t = *reinterpret_cast<const double2 *>(p);
        out.e[0] = t.x, out.e[1] = t.y;
    }
    return out;
}

/* 16 bytes of a row into shared memory, aligned to 16. */
template <typename T, int V>
__device__ __forceinline__ void store_shared(T *p, const run_of<T, V> &w) {
    if constexpr (sizeof(T) == 4) {
        static_assert(V == 4, "16 bytes a store");
        *reinterpret_cast<float4 *>(p) = make_float4(w.e[0], w.e[1], w.e[2], w.e[3]);
    } else {
        static_assert(V == 2, "16 bytes a store");
        *reinterpret_cast<double2 *>(p) = make_double2(w.e[0], w.e[1]);
    }
}

/* The async kernel. A block of 32 x H threads owns a tile of TX = 32 V
 * points along x (V: 16 bytes of elements) by TY = H R rows and marches
 * along z through the planes of its z chunk. Each plane of the tile, with
 * its rim widened to a 16-byte run on either side (x0 + 1 - V .. x0 + TX +
 * V, rows y0 .. y0 + TY + 1), is copied into one of S stages of shared
 * memory by cp.async, S - 2 planes ahead of the plane computed, one commit
 * group a plane (empty past the chunk's end, so the waits count alike in
 * every block). Copies outside the grid's rows and ring fill zeros. Warp w
 * computes rows w R .. w R + R - 1 of the tile, 16 bytes a thread a row:
 * planes z - 1, z and z + 1 of its own points in registers (each plane's
 * read from shared memory once, as z + 1), the x neighbours and the rows
 * beside the warp's from plane z's stage. One barrier a plane: after it,
 * plane z + 1 has landed for every thread and nobody reads plane z - 1's
 * stage any more, which the copy of plane z + S - 1 then overwrites. */
template <typename T, int H, int R, int S, int MIN_BLOCKS>
__global__ void __launch_bounds__(32 * H, MIN_BLOCKS)
    stencil_async(T *__restrict__ v, const T *__restrict__ u, int n, int pitch, long long plane,
                  int z_begin, int z_end, int zchunk, T c6, T r) {
    static_assert(S >= 3, "planes z and z + 1 are read while the next are copied");
    enum {
        V = 16 / sizeof(T),
        TX = 32 * V,
        TY = H * R,
        RUNS = TX / V + 2, /* 16-byte runs of a stage's row */
        ROW = RUNS * V,    /* elements of a stage's row */
        STAGE = (TY + 2) * ROW,
        COPIES = (TY + 2) * RUNS,
        THREADS = 32 * H,
        PER = (COPIES + THREADS - 1) / THREADS
    };
    extern __shared__ __align__(16) unsigned char stages_raw[];
    T *const stages = reinterpret_cast<T *>(stages_raw);
    const int lane = (int)threadIdx.x, warp = (int)threadIdx.y, tid = warp * 32 + lane;
    const int x0 = (int)blockIdx.x * TX, y0 = (int)blockIdx.y * TY;
    const int zb = z_begin + (int)blockIdx.z * zchunk;
    const int ze = min(zb + zchunk, z_end);
    if (zb >= ze) return; /* the whole block: before any barrier */
    /* this thread's copies of a plane: copy k is run tid + k THREADS of a
     * stage, 16 bytes that far into it, and from[k] elements past x = 0 of
     * the plane's row 0 in u; -1 outside the grid, which copies 0 bytes
     * from x = 1 of row 0 (aligned, never past the array) */
    int from[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int i = tid + k * THREADS, row = i / RUNS, run = i % RUNS;
        const int y = y0 + row, x = x0 + 1 - V + run * V;
        from[k] = i < COPIES && y <= n + 1 && x <= n + 1 ? y * pitch + x : -1;
    }
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(stages) + 16u * (uint32_t)tid;
    /* plane p (zb - 1 .. ze) into stage (p - zb + 1) mod S */
    auto fetch = [&](int p) {
        if (p <= ze) {
            const T *src = u + (long long)p * plane;
            const uint32_t stage = (uint32_t)(((p - zb + 1) % S) * STAGE * sizeof(T));
#pragma unroll
            for (int k = 0; k < PER; k++)
                if (COPIES % THREADS == 0 || tid + k * THREADS < COPIES)
                    copy_async16(base + stage + 16u * (uint32_t)(k * THREADS),
                                 src + (from[k] < 0 ? 1 : from[k]), from[k] < 0 ? 0 : 16);
        }
        copy_commit();
    };
#pragma unroll
    for (int k = 0; k < S; k++)
        fetch(zb - 1 + k);
    /* this thread's points: rows ty .. ty + R - 1 of the tile (rows
     * ty + 1 .. of a stage), x .. x + V - 1 (column col of a stage) */
    const int ty = warp * R, col = V * (lane + 1);
    const int x = x0 + 1 + V * lane, y = y0 + 1 + ty;
    run_of<T, V> below[R], here[R];
    copy_wait<S - 2>(); /* planes zb - 1 and zb */
    __syncthreads();
#pragma unroll
    for (int j = 0; j < R; j++) {
        below[j] = load_shared<T, V>(stages + (ty + 1 + j) * ROW + col);
        here[j] = load_shared<T, V>(stages + STAGE + (ty + 1 + j) * ROW + col);
    }
    int now = 1; /* plane z's stage */
    T *out = v + (long long)zb * plane + (long long)y * pitch + x;
    for (int z = zb; z < ze; z++, out += plane) {
        copy_wait<S - 3>(); /* plane z + 1 */
        __syncthreads();
        fetch(z + S - 1);
        const int next = now + 1 == S ? 0 : now + 1;
        const T *cur = stages + now * STAGE + ty * ROW + col; /* the row above the warp's first */
        run_of<T, V> above[R];
#pragma unroll
        for (int j = 0; j < R; j++)
            above[j] = load_shared<T, V>(stages + next * STAGE + (ty + 1 + j) * ROW + col);
        const run_of<T, V> first = load_shared<T, V>(cur);
        const run_of<T, V> last = load_shared<T, V>(cur + (R + 1) * ROW);
#pragma unroll
        for (int j = 0; j < R; j++) {
            const T *c = cur + (j + 1) * ROW;
            const T west = c[-1], east = c[V];
            const run_of<T, V> &north = j == 0 ? first : here[j > 0 ? j - 1 : 0];
            const run_of<T, V> &south = j == R - 1 ? last : here[j < R - 1 ? j + 1 : 0];
            const run_of<T, V> w =
                update_run(here[j], west, east, north, south, below[j], above[j], x, n, c6, r);
            if (x <= n && y + j <= n) store_cs<T, V>(out + (long long)j * pitch, w);
        }
#pragma unroll
        for (int j = 0; j < R; j++)
            below[j] = here[j], here[j] = above[j];
        now = next;
    }
}

/* The plain kernel: one point a thread, plane z_begin + blockIdx.z (zchunk
 * is 1), its seven values loaded at once; the neighbours' loads hit L1
 * (the block's own points) or L2 (the tiles and planes around). */
template <typename T>
__global__ void __launch_bounds__(BX *BY, 8)
    stencil_plain(T *__restrict__ v, const T *__restrict__ u, int n, int pitch, long long plane,
                  int z_begin, int z_end, int zchunk, T c6, T r) {
    (void)z_end, (void)zchunk;
    const int x = 1 + (int)blockIdx.x * BX + (int)threadIdx.x;
    const int y = 1 + (int)blockIdx.y * BY + (int)threadIdx.y;
    if (x > n || y > n) return;
    const long long at = (z_begin + (long long)blockIdx.z) * plane + (long long)y * pitch + x;
    const T *c = u + at;
    T s = add_rn(__ldg(c - 1), __ldg(c + 1));
    s = add_rn(s, __ldg(c - pitch));
    s = add_rn(s, __ldg(c + pitch));
    s = add_rn(s, __ldg(c - plane));
    s = add_rn(s, __ldg(c + plane));
    __stcs(v + at, fma_rn(c6, __ldg(c), mul_rn(r, s)));
}

/* The two-step kernel: steps t + 1 and t + 2 in one pass over u, so each
 * point is read and written once every two steps. A block of TX + 2 by
 * TY + 2 threads marches along z over a TX x TY tile with a one-point rim.
 * Each thread computes its point's step one on plane p (u from a register
 * queue as in stencil_column, x and y neighbours through L1) into shared
 * memory; after a barrier the tile's inner threads compute step two on
 * plane p - 1 from the rim and tile of that plane and their own step-one
 * values of planes p - 2 and p. Step one is 0 on the ring and the faces,
 * as the CPU's field is. Three plane buffers need one barrier a plane: a
 * buffer is rewritten two barriers after it was read. Single slab, single
 * process only (the halos would have to be two planes deep). */
enum { TX = 32, TY = 8, EX = TX + 2, EY = TY + 2 };

template <typename T, int A>
__global__ void __launch_bounds__(EX *EY, 4)
    stencil_two_steps(T *__restrict__ v, const T *__restrict__ u, int n, int pitch, long long plane,
                      int nz, int zchunk, T c6, T r) {
    enum { Q = A + 2 };
    __shared__ T one[3][EY][EX];
    const int ex = (int)threadIdx.x % EX, ey = (int)threadIdx.x / EX;
    const int x = (int)blockIdx.x * TX + ex, y = (int)blockIdx.y * TY + ey;
    const int zb = 1 + (int)blockIdx.z * zchunk, ze = min(zb + zchunk, nz + 1);
    /* every thread reaches every barrier: no early return */
    const bool live = x >= 1 && x <= n && y >= 1 && y <= n;
    const bool inner = live && ex >= 1 && ex <= TX && ey >= 1 && ey <= TY;
    const long long at = (long long)y * pitch + x;
    const T *col = u + at;
    const T zero = 0;
    /* u's plane w of the column in slot (w - zb + 2) mod Q; step one's
     * plane p runs zb - 1 .. ze and reads planes p - 1 .. p + 1 */
    T q[Q];
#pragma unroll
    for (int k = 0; k <= A; k++)
        q[k] = live ? __ldg(col + min(max(zb - 2 + k, 0), nz + 1) * plane) : zero;
    T o0 = 0, o1 = 0, o2 = 0; /* this point's step one on planes p - 2, p - 1, p */
    int wb = (zb - 1) % 3;    /* the buffer of plane p */
    for (int p0 = zb - 1; p0 <= ze; p0 += Q) {
#pragma unroll
        for (int j = 0; j < Q; j++) {
            const int p = p0 + j;
            if (p > ze) break; /* the same for the whole block */
            q[(j + A + 1) % Q] = live ? __ldg(col + min(p + A, nz + 1) * plane) : zero;
            T s1 = 0;
            if (live && p >= 1 && p <= nz) {
                const T *c = col + p * plane;
                T s = add_rn(__ldg(c - 1), __ldg(c + 1));
                s = add_rn(s, __ldg(c - pitch));
                s = add_rn(s, __ldg(c + pitch));
                s = add_rn(s, q[j]);
                s = add_rn(s, q[(j + 2) % Q]);
                s1 = fma_rn(c6, q[(j + 1) % Q], mul_rn(r, s));
            }
            one[wb][ey][ex] = s1;
            o0 = o1, o1 = o2, o2 = s1;
            __syncthreads();
            const int rb = wb == 0 ? 2 : wb - 1; /* plane p - 1's buffer */
            if (inner && p - 1 >= zb) {
                T s = add_rn(one[rb][ey][ex - 1], one[rb][ey][ex + 1]);
                s = add_rn(s, one[rb][ey - 1][ex]);
                s = add_rn(s, one[rb][ey + 1][ex]);
                s = add_rn(s, o0);
                s = add_rn(s, o2);
                __stcs(v + at + (p - 1) * plane, fma_rn(c6, o1, mul_rn(r, s)));
            }
            wb = wb == 2 ? 0 : wb + 1;
        }
    }
}

/* The stream2 kernel: steps t + 1 and t + 2 in one pass, so each point is
 * read and written once every two steps, streamed like the vector kernel.
 * A block of 32 x (TY + 2) threads owns a tile of TX = 32 V points along x
 * (V: 16 bytes of elements) by TY rows and marches along z. Warp w takes
 * row y0 + w, 16 bytes a lane: warps 1 .. TY the tile's rows, warps 0 and
 * TY + 1 the rim rows above and below it. Each thread computes step one of
 * its run on plane p from a register queue of u's planes (loaded A planes
 * ahead), the y neighbours through L1 and the x neighbours from the lanes
 * beside it; the rim rows' warps, which have no step two, also compute
 * the rim columns x0 and x0 + TX + 1, a point a lane, so the tile's warps
 * wait on no loads from the tiles beside. After the plane's barrier
 * the tile's rows compute step two on plane p - 1: the x and y neighbours
 * and their own step one of plane p - 1 from that plane's shared-memory
 * buffer, their own of plane p - 2 from the other buffer, just before
 * plane p's step one replaces it there, and plane p's from registers
 * (which keeps the kernel within 64 registers unspilled). Two buffers
 * take one barrier a plane: the barrier comes after everyone has read
 * plane p - 2's buffer (last plane) and before anyone writes plane p into
 * it or reads plane p - 1's. Step one is 0 on the ring, the faces and
 * past x = n, as the CPU's field is. A z chunk computes step two on planes
 * zb .. ze - 1, so step one on zb - 1 .. ze, from u's planes zb - 2 ..
 * ze + 1. Single slab, single process only. */
template <typename T, int TY, int A, int MIN_BLOCKS>
__global__ void __launch_bounds__(32 * (TY + 2), MIN_BLOCKS)
    stencil_stream2(T *__restrict__ v, const T *__restrict__ u, int n, int pitch, long long plane,
                    int nz, int zchunk, T c6, T r) {
    enum { V = 16 / sizeof(T), TX = 32 * V, ROW = TX + 2 * V, Q = A + 2 };
    /* a buffer's row: the rim column x0 at V - 1, the tile's x0 + 1 .. at
     * V (16-byte aligned), the rim column x0 + TX + 1 at V + TX */
    __shared__ __align__(16) T one[2][TY + 2][ROW];
    const unsigned all = 0xffffffffu;
    const int lane = (int)threadIdx.x, w = (int)threadIdx.y;
    const int x0 = (int)blockIdx.x * TX, x = x0 + 1 + V * lane, y = (int)blockIdx.y * TY + w;
    const int zb = 1 + (int)blockIdx.z * zchunk, ze = min(zb + zchunk, nz + 1);
    /* every thread reaches every barrier and shuffle: no early return */
    const bool row_live = y >= 1 && y <= n;
    const bool live = row_live && x <= n; /* the run holds a point of the grid */
    const bool inner = w >= 1 && w <= TY; /* a row of the tile: step two */
    /* the rim rows' warps also compute the rim columns, a point a lane:
     * warp 0 column x0, warp TY + 1 column x0 + TX + 1, lane l row
     * y0 + 1 + l of the tile (lanes TY and up none) */
    const bool edge = !inner && lane < TY;
    const int xr = w == 0 ? x0 : x0 + TX + 1, yr = y - w + 1 + lane;
    const bool rim = edge && yr <= n && xr >= 1 && xr <= n;
    T *const rim_put = &one[0][1 + (lane < TY ? lane : 0)][w == 0 ? V - 1 : V + TX];
    const long long at = (long long)y * pitch + x;
    const T *col = u + at;
    const T *rcol = u + (long long)yr * pitch + xr;
    /* u's planes zb - 2 .. ze + 1, clamped into 0 .. nz + 1 (the planes
     * outside are never used: step one is 0 on planes 0 and nz + 1) */
    const int lo = max(zb - 2, 0), hi = min(ze + 1, nz + 1);
    run_of<T, V> zero;
#pragma unroll
    for (int i = 0; i < V; i++)
        zero.e[i] = 0;
    /* u's plane zb - 2 + k in slot k mod Q */
    run_of<T, V> q[Q];
#pragma unroll
    for (int k = 0; k <= A; k++)
        q[k] = live ? load_nc<T, V>(col + min(max(zb - 2 + k, lo), hi) * plane) : zero;
    T *const mine = &one[0][w][V + V * lane];
    int wb = (zb - 1) & 1; /* plane p's buffer */
    for (int p0 = zb - 1; p0 <= ze; p0 += Q) {
#pragma unroll
        for (int j = 0; j < Q; j++) {
            const int p = p0 + j;
            if (p > ze) break; /* the same for the whole block */
            /* u's plane p + A into the slot of plane p - 2, used last plane */
            q[(j + A + 1) % Q] = live ? load_nc<T, V>(col + min(max(p + A, lo), hi) * plane) : zero;
            const run_of<T, V> &below = q[j % Q], &here = q[(j + 1) % Q], &above = q[(j + 2) % Q];
            const bool plane_live = p >= 1 && p <= nz;
            /* x neighbours: the runs beside this one (0 past x = n, where
             * the lane holds no point), the block's edges from memory */
            T west = __shfl_up_sync(all, here.e[V - 1], 1);
            T east = __shfl_down_sync(all, here.e[0], 1);
            run_of<T, V> s1 = zero;
            if (live && plane_live) {
                const T *c = col + p * plane;
                if (lane == 0) west = __ldg(c - 1);
                if (lane == 31) east = __ldg(c + V);
                const run_of<T, V> north = load_nc<T, V>(c - pitch),
                                   south = load_nc<T, V>(c + pitch);
                s1 = update_run(here, west, east, north, south, below, above, x, n, c6, r);
            }
            T sr = 0; /* step one on the rim column */
            if (rim && plane_live) {
                const T *c = rcol + p * plane;
                T s = add_rn(__ldg(c - 1), __ldg(c + 1));
                s = add_rn(s, __ldg(c - pitch));
                s = add_rn(s, __ldg(c + pitch));
                s = add_rn(s, __ldg(c - plane));
                s = add_rn(s, __ldg(c + plane));
                sr = fma_rn(c6, __ldg(c), mul_rn(r, s));
            }
            __syncthreads(); /* plane p - 1's buffer is whole, p - 2's read */
            T *const put = mine + wb * (TY + 2) * ROW;
            if (inner && p - 1 >= zb) {
                /* step two on plane p - 1: this thread's step one on planes
                 * p - 2 (in the buffer plane p is about to take) and p - 1,
                 * the neighbours' on plane p - 1, from the buffers */
                const T *b = mine + (wb ^ 1) * (TY + 2) * ROW;
                const run_of<T, V> o0 = load_shared<T, V>(put), o1 = load_shared<T, V>(b);
                const run_of<T, V> &o2 = s1;
                T west2 = __shfl_up_sync(all, o1.e[V - 1], 1);
                T east2 = __shfl_down_sync(all, o1.e[0], 1);
                if (lane == 0) west2 = b[-1];
                if (lane == 31) east2 = b[V];
                if (live) {
                    const run_of<T, V> north = load_shared<T, V>(b - ROW),
                                       south = load_shared<T, V>(b + ROW);
                    const run_of<T, V> out =
                        update_run(o1, west2, east2, north, south, o0, o2, x, n, c6, r);
                    store_cs<T, V>(v + at + (long long)(p - 1) * plane, out);
                }
            }
            store_shared<T, V>(put, s1);
            if (edge) rim_put[wb * (TY + 2) * ROW] = sr;
            wb ^= 1;
        }
    }
}

/* The starting mode on planes 0 .. nz + 1 of one slab, halos included
 * (the first step reads them before any exchange): (sx sy) sz at grid
 * plane g0 - 1 + z, g0 the slab's first; the halos beyond the grid's faces
 * stay 0. */
template <typename T>
__global__ void stencil_start(T *u, const double *sx, const double *sy, const double *sz, int n,
                              int pitch, long long plane, int g0) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    const int z = blockIdx.z, g = g0 - 1 + z;
    if (x >= n || y >= n || g < 0 || g >= n) return;
    const double value = __dmul_rn(__dmul_rn(sx[x], sy[y]), sz[g]);
    u[(long long)z * plane + (long long)(y + 1) * pitch + x + 1] = (T)value;
}

/* max |u - scale u0| and max |u0| over planes 1 .. nz of one slab, into
 * out[0] and out[1] as the bits of non-negative doubles (which order as
 * integers, so atomicMax is exact and the order of blocks does not
 * matter). */
template <typename T>
__global__ void stencil_error(const T *u, const double *sx, const double *sy, const double *sz,
                              int n, int pitch, long long plane, int nz, double scale,
                              unsigned long long *out) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    double err = 0, big = 0;
    if (x < n && y < n)
        for (int z = 0; z < nz; z++) {
            const double start = __dmul_rn(__dmul_rn(sx[x], sy[y]), sz[z]);
            const double got =
                (double)u[(long long)(z + 1) * plane + (long long)(y + 1) * pitch + x + 1];
            err = fmax(err, fabs(__dsub_rn(got, __dmul_rn(scale, start))));
            big = fmax(big, fabs(start));
        }
    for (int o = 16; o > 0; o >>= 1) {
        err = fmax(err, __shfl_xor_sync(0xffffffffu, err, o));
        big = fmax(big, __shfl_xor_sync(0xffffffffu, big, o));
    }
    if ((threadIdx.x & 31) == 0) {
        atomicMax(&out[0], (unsigned long long)bits_of(err));
        atomicMax(&out[1], (unsigned long long)bits_of(big));
    }
}

/* The sum of gpc_stencil_hash terms over planes 1 .. nz of one slab, whose
 * first plane is grid plane z0 (integer sums: exact in any order). */
template <typename T>
__global__ void stencil_checksum(const T *u, int n, int pitch, long long plane, int nz, int z0,
                                 unsigned long long *out) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    uint64_t sum = 0;
    if (x < n && y < n)
        for (int z = 0; z < nz; z++) {
            const T value = u[(long long)(z + 1) * plane + (long long)(y + 1) * pitch + x + 1];
            const uint64_t index = ((uint64_t)(z0 + z) * n + (uint64_t)y) * n + (uint64_t)x;
            sum += gpc_stencil_hash(bits_of(value), index);
        }
    for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(&out[0], (unsigned long long)sum);
}

/* ------------------------------------------------------------ the solver */

struct gpc_stencil_cuda {
    gpc_stencil_cuda_config c;
    size_t elem;                 /* bytes of an element */
    int pitch;                   /* elements of a row */
    int shift;                   /* where x = 0 sits in its row, so x = 1 is 128-byte aligned */
    long long plane;             /* elements of a plane: pitch (n + 2) */
    int *z0, *nz;                /* each slab's first plane of the band (0-based) and its planes */
    char **u, **v;               /* each slab's arrays, nz + 2 planes */
    double *sine;                /* device: the x, y and z tables, n each */
    unsigned long long *scratch; /* device: two reduction results */
    cudaStream_t compute, halo;
    cudaEvent_t compute_done, halo_done;
    int started;       /* a step was queued: the events mean something */
    int resident;      /* update blocks the GPU runs at once */
    int resident_pair; /* the same for the two-step kernel */
    void *host[4];     /* pinned: send_lo, send_hi, recv_lo, recv_hi */
};

static void layout(const gpc_stencil_cuda_config *c, size_t *elem, int *pitch, int *shift,
                   long long *plane) {
    *elem = c->fp32 ? sizeof(float) : sizeof(double);
    const int align = (int)(128 / *elem);
    *shift = align - 1;
    *pitch = (*shift + c->n + 2 + align - 1) / align * align;
    *plane = (long long)*pitch * (c->n + 2);
}

extern "C" double gpc_stencil_cuda_bytes(const gpc_stencil_cuda_config *c) {
    size_t elem;
    int pitch, shift;
    long long plane;
    layout(c, &elem, &pitch, &shift, &plane);
    /* u and v of every slab: the band's planes plus two halos a slab */
    return 2.0 * (double)plane * (double)elem * (c->nz + 2.0 * c->slabs) + 3.0 * c->n * 8.0;
}

extern "C" gpc_status gpc_stencil_cuda_check(int device, double bytes, const char *what) {
    size_t free_bytes = 0, total = 0;
    GPC_TRY(sci_cuda_open("stencil", device, &free_bytes, &total));
    if (bytes > (double)free_bytes)
        return gpc_error(GPC_ERR_NOMEM,
                         "%s need about %.1f GiB on cuda:%d, which has %.1f GiB free of %.1f "
                         "GiB: use a smaller --n, --precision f32, or more processes",
                         what, bytes / (1 << 30), device, (double)free_bytes / (1 << 30),
                         (double)total / (1 << 30));
    return GPC_OK;
}

extern "C" void gpc_stencil_cuda_free(gpc_stencil_cuda *g) {
    if (!g) return;
    cudaSetDevice(g->c.device);
    if (g->compute) cudaStreamSynchronize(g->compute);
    if (g->halo) cudaStreamSynchronize(g->halo);
    for (int d = 0; g->u && d < g->c.slabs; d++) {
        cudaFree(g->u[d]);
        cudaFree(g->v[d]);
    }
    for (int k = 0; k < 4; k++)
        cudaFreeHost(g->host[k]);
    cudaFree(g->sine);
    cudaFree(g->scratch);
    if (g->compute_done) cudaEventDestroy(g->compute_done);
    if (g->halo_done) cudaEventDestroy(g->halo_done);
    if (g->compute) cudaStreamDestroy(g->compute);
    if (g->halo) cudaStreamDestroy(g->halo);
    free(g->u), free(g->v), free(g->z0), free(g->nz);
    free(g);
}

/* Planes of u the two-step kernel's queue loads ahead: 24 bytes a thread
 * in flight in either precision. */
template <typename T> struct two_step_ahead {
    enum { value = sizeof(T) == 8 ? 3 : 6 };
};

/* An update kernel and its launch: blocks of 32 x warps threads, each
 * covering width x height points of a plane. */
template <typename T> struct update_kernel {
    void (*fn)(T *, const T *, int, int, long long, int, int, int, T, T);
    int width, height, warps;
    int shared; /* bytes of dynamic shared memory a block */
};

/* The async kernel with 8 warps of `rows` / 8 rows each over a tile of 512
 * bytes by `rows` (128 x rows in f32, 64 x rows in f64), in S stages and
 * BLOCKS blocks an SM: its shared memory, a stage being the tile's rows and
 * rim rows of 32 runs of 16 bytes and one on either side. */
template <typename T, int ROWS, int S, int BLOCKS> static update_kernel<T> async_kernel() {
    enum { WARPS = 8 };
    return {stencil_async<T, WARPS, ROWS / WARPS, S, BLOCKS>, 512 / (int)sizeof(T), ROWS, WARPS,
            S * (ROWS + 2) * (32 + 2) * 16};
}

/* The stream2 kernel with a tile of TY rows (TY + 2 warps), A planes
 * ahead: its kernel, and the blocks an SM its launch bounds ask for (1024
 * threads an SM, 64 registers a thread). */
template <typename T> struct stream2_kernel {
    void (*fn)(T *, const T *, int, int, long long, int, int, T, T);
    int rows, warps;
};
template <typename T> static stream2_kernel<T> stream2_of(int rows) {
    enum { A = 2 };
    if (rows == 6) return {stencil_stream2<T, 6, A, 4>, 6, 8};
    if (rows == 30) return {stencil_stream2<T, 30, A, 1>, 30, 32};
    return {stencil_stream2<T, 14, A, 2>, 14, 16};
}

/* The update kernel `kind`; for async, the tile's rows (8, 16 or 32). */
template <typename T> static update_kernel<T> kernel_of(gpc_stencil_kernel kind, int rows) {
    /* vector: 16 bytes a load. column: one element a load, so more loads
     * ahead (8 in f32, 4 in f64) and more threads to issue them */
    enum { V = 16 / sizeof(T), COLUMN_AHEAD = sizeof(T) == 8 ? 4 : 8 };
    switch (kind) {
    case GPC_STENCIL_KERNEL_COLUMN:
        return {stencil_column<T, 1, 8, COLUMN_AHEAD, 6>, 32, 8, 8, 0};
    case GPC_STENCIL_KERNEL_PLAIN:
        return {stencil_plain<T>, BX, BY, BY, 0};
    case GPC_STENCIL_KERNEL_SHARED:
        return {stencil_update<T>, BX, BY, BY, 0};
    case GPC_STENCIL_KERNEL_ASYNC:
        /* stages of 5.3, 9.6 and 18.1 KiB in either precision; S - 2 planes
         * ahead: 4, 3 and 2 a block, with 6, 4 and 3 blocks an SM up to
         * 128, 115 and 108 KiB of copies in flight an SM */
        if (rows == 8) return async_kernel<T, 8, 6, 6>();
        if (rows == 32) return async_kernel<T, 32, 4, 3>();
        return async_kernel<T, 16, 5, 4>();
    default: /* twostep's and stream2's single steps too */
        /* 3 loads of 16 bytes ahead, 1024 threads an SM: 48 KiB in flight */
        return {stencil_column<T, V, 8, 3, 4>, 32 * V, 8, 8, 0};
    }
}

/* Planes a z chunk of the column kernels takes: tiles x chunks blocks run
 * in ceil(blocks / resident) waves, each a chunk's planes long, and a chunk
 * reads the plane on either side of it too (from DRAM when the chunk next
 * to it ran a wave apart), which costs `halo` planes of the chunk's time
 * (stream2 reads two on either side and computes step one on one more).
 * Picks the count of chunks that costs least in those terms: few chunks,
 * unless more fill the last wave better. */
static int z_chunk(long long tiles, int planes, int resident, double halo = 1.0) {
    const int most = planes / 16 > 1 ? planes / 16 : 1;
    int best = planes;
    double best_cost = 0;
    for (int chunks = 1; chunks <= most; chunks++) {
        const int zchunk = (planes + chunks - 1) / chunks;
        const long long blocks = tiles * ((planes + zchunk - 1) / zchunk);
        const double waves = (double)((blocks + resident - 1) / resident);
        /* zchunk + 2 halo planes read, zchunk written (one-step kernels) */
        const double cost = waves * (zchunk + halo);
        if (chunks == 1 || cost < best_cost) best = zchunk, best_cost = cost;
    }
    return best;
}

template <typename T> static gpc_status start_field(gpc_stencil_cuda *g) {
    const int n = g->c.n;
    for (int d = 0; d < g->c.slabs; d++) {
        dim3 block(BX, BY), grid((n + BX - 1) / BX, (n + BY - 1) / BY, g->nz[d] + 2);
        stencil_start<T><<<grid, block, 0, g->compute>>>((T *)g->u[d] + g->shift, g->sine,
                                                         g->sine + n, g->sine + 2 * n, n, g->pitch,
                                                         g->plane, g->c.z0 + g->z0[d]);
        GPC_CUDA_CHECK_LAUNCH();
    }
    int per_sm = 0, sms = 0;
    const update_kernel<T> k = kernel_of<T>(g->c.kernel, g->c.async_rows);
    if (k.shared > 0) {
        /* the async kernel's stages: over the 48 KiB a launch gets unasked,
         * and as many blocks an SM as they fit */
        GPC_CUDA_CHECK(cudaFuncSetAttribute((const void *)k.fn,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, k.shared));
        GPC_CUDA_CHECK(cudaFuncSetAttribute((const void *)k.fn,
                                            cudaFuncAttributePreferredSharedMemoryCarveout,
                                            (int)cudaSharedmemCarveoutMaxShared));
    } else if (g->c.kernel != GPC_STENCIL_KERNEL_SHARED) {
        /* the kernels without shared memory want all of it as L1, which
         * keeps the neighbours the block loaded */
        GPC_CUDA_CHECK(cudaFuncSetAttribute((const void *)k.fn,
                                            cudaFuncAttributePreferredSharedMemoryCarveout,
                                            (int)cudaSharedmemCarveoutMaxL1));
    }
    /* also loads the update kernel now, not inside the first timed step */
    GPC_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k.fn, 32 * k.warps, k.shared));
    GPC_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, g->c.device));
    g->resident = per_sm * sms > 0 ? per_sm * sms : 1;
    if (g->c.kernel == GPC_STENCIL_KERNEL_TWOSTEP) {
        GPC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &per_sm, stencil_two_steps<T, two_step_ahead<T>::value>, EX * EY, 0));
        g->resident_pair = per_sm * sms > 0 ? per_sm * sms : 1;
    }
    if (g->c.kernel == GPC_STENCIL_KERNEL_STREAM2) {
        const stream2_kernel<T> s = stream2_of<T>(g->c.stream2_rows);
        /* shared memory for as many blocks as an SM's 2048 threads take,
         * the rest L1, which keeps the y neighbours the block loaded: as a
         * percentage of the most an SM can give (rounded up by the driver
         * to a size it has) */
        cudaFuncAttributes fa;
        int most = 0;
        GPC_CUDA_CHECK(cudaFuncGetAttributes(&fa, (const void *)s.fn));
        GPC_CUDA_CHECK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerMultiprocessor,
                                              g->c.device));
        const int blocks = 2048 / (32 * s.warps) < 8 ? 2048 / (32 * s.warps) : 8;
        const size_t want = (size_t)blocks * (fa.sharedSizeBytes + 1024);
        const int percent = most > 0 ? (int)((want * 100 + (size_t)most - 1) / (size_t)most) : 100;
        GPC_CUDA_CHECK(cudaFuncSetAttribute((const void *)s.fn,
                                            cudaFuncAttributePreferredSharedMemoryCarveout,
                                            percent < 100 ? percent : 100));
        GPC_CUDA_CHECK(
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, s.fn, 32 * s.warps, 0));
        g->resident_pair = per_sm * sms > 0 ? per_sm * sms : 1;
    }
    return GPC_OK;
}

static gpc_status create(gpc_stencil_cuda *g) {
    const gpc_stencil_cuda_config *c = &g->c;
    GPC_CUDA_CHECK(cudaSetDevice(c->device));
    layout(c, &g->elem, &g->pitch, &g->shift, &g->plane);
    g->z0 = (int *)calloc((size_t)c->slabs, sizeof(int));
    g->nz = (int *)calloc((size_t)c->slabs, sizeof(int));
    g->u = (char **)calloc((size_t)c->slabs, sizeof(char *));
    g->v = (char **)calloc((size_t)c->slabs, sizeof(char *));
    if (!g->z0 || !g->nz || !g->u || !g->v)
        return gpc_error(GPC_ERR_NOMEM, "stencil: out of host memory");
    GPC_CUDA_CHECK(cudaStreamCreateWithFlags(&g->compute, cudaStreamNonBlocking));
    GPC_CUDA_CHECK(cudaStreamCreateWithFlags(&g->halo, cudaStreamNonBlocking));
    GPC_CUDA_CHECK(cudaEventCreateWithFlags(&g->compute_done, cudaEventDisableTiming));
    GPC_CUDA_CHECK(cudaEventCreateWithFlags(&g->halo_done, cudaEventDisableTiming));
    const size_t plane_bytes = (size_t)g->plane * g->elem;
    for (int d = 0; d < c->slabs; d++) {
        /* the same split of the band into slabs as the CPU's */
        g->z0[d] = (int)((long long)c->nz * d / c->slabs);
        g->nz[d] = (int)((long long)c->nz * (d + 1) / c->slabs) - g->z0[d];
        const size_t bytes = (size_t)(g->nz[d] + 2) * plane_bytes;
        GPC_CUDA_CHECK(cudaMalloc((void **)&g->u[d], bytes));
        GPC_CUDA_CHECK(cudaMalloc((void **)&g->v[d], bytes));
        /* the rings and the halos of the grid's faces stay 0 */
        GPC_CUDA_CHECK(cudaMemsetAsync(g->u[d], 0, bytes, g->compute));
        GPC_CUDA_CHECK(cudaMemsetAsync(g->v[d], 0, bytes, g->compute));
    }
    if (c->below || c->above)
        for (int k = 0; k < 4; k++) {
            GPC_CUDA_CHECK(cudaMallocHost(&g->host[k], plane_bytes));
            memset(g->host[k], 0, plane_bytes);
        }
    const size_t table = (size_t)c->n * sizeof(double);
    GPC_CUDA_CHECK(cudaMalloc((void **)&g->sine, 3 * table));
    GPC_CUDA_CHECK(cudaMalloc((void **)&g->scratch, 2 * sizeof(unsigned long long)));
    for (int a = 0; a < 3; a++)
        GPC_CUDA_CHECK(cudaMemcpyAsync((char *)g->sine + a * table, c->sine[a], table,
                                       cudaMemcpyHostToDevice, g->compute));
    GPC_TRY(c->fp32 ? start_field<float>(g) : start_field<double>(g));
    GPC_CUDA_CHECK(cudaStreamSynchronize(g->compute));
    return GPC_OK;
}

extern "C" gpc_status gpc_stencil_cuda_create(gpc_stencil_cuda **out,
                                              const gpc_stencil_cuda_config *c) {
    *out = NULL;
    gpc_stencil_cuda *g = (gpc_stencil_cuda *)calloc(1, sizeof *g);
    if (!g) return gpc_error(GPC_ERR_NOMEM, "stencil: out of host memory");
    g->c = *c;
    gpc_status s = create(g);
    for (int a = 0; a < 3; a++)
        g->c.sine[a] = NULL; /* the caller's tables were copied up, not kept */
    if (s) {
        gpc_stencil_cuda_free(g);
        return s;
    }
    *out = g;
    return GPC_OK;
}

extern "C" void gpc_stencil_cuda_host_halos(const gpc_stencil_cuda *g,
                                            gpc_stencil_cuda_halos *out) {
    out->send_lo = g->host[0], out->send_hi = g->host[1];
    out->recv_lo = g->host[2], out->recv_hi = g->host[3];
    out->bytes = (size_t)g->plane * g->elem;
}

/* Queues the update of planes z_begin .. z_end - 1 of slab d on `stream`. */
template <typename T>
static gpc_status update(gpc_stencil_cuda *g, int d, int z_begin, int z_end, cudaStream_t stream) {
    const int n = g->c.n, planes = z_end - z_begin;
    if (planes <= 0) return GPC_OK;
    const update_kernel<T> k = kernel_of<T>(g->c.kernel, g->c.async_rows);
    const int gx = (n + k.width - 1) / k.width, gy = (n + k.height - 1) / k.height;
    int zchunk = 1; /* plain: a plane a block */
    if (g->c.kernel == GPC_STENCIL_KERNEL_SHARED) {
        /* enough blocks for about 4 waves, but chunks of 16 planes or
         * more: a chunk re-reads the plane on either side of it */
        long long want = (4LL * g->resident + (long long)gx * gy - 1) / ((long long)gx * gy);
        int chunks = (int)(want < 1 ? 1 : want);
        if (chunks > planes / 16) chunks = planes / 16 > 1 ? planes / 16 : 1;
        zchunk = (planes + chunks - 1) / chunks;
    } else if (g->c.kernel != GPC_STENCIL_KERNEL_PLAIN) {
        zchunk = z_chunk((long long)gx * gy, planes, g->resident);
    }
    dim3 block(32, k.warps), grid(gx, gy, (planes + zchunk - 1) / zchunk);
    const double r = g->c.r, c6 = g->c.c6; /* the CPU's c6 */
    k.fn<<<grid, block, k.shared, stream>>>((T *)g->v[d] + g->shift, (const T *)g->u[d] + g->shift,
                                            n, g->pitch, g->plane, z_begin, z_end, zchunk, (T)c6,
                                            (T)r);
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

template <typename T> static gpc_status step_kernels(gpc_stencil_cuda *g) {
    const int single = g->c.slabs == 1 && !g->c.below && !g->c.above;
    for (int d = 0; d < g->c.slabs; d++) {
        const int nz = g->nz[d];
        if (single) {
            /* no halo to wait for: one launch over every plane */
            GPC_TRY(update<T>(g, d, 1, nz + 1, g->compute));
            continue;
        }
        /* the planes next to the halos first, on the halo stream, so their
         * exchange starts while the compute stream does the rest */
        GPC_TRY(update<T>(g, d, 1, 2, g->halo));
        if (nz >= 2) GPC_TRY(update<T>(g, d, nz, nz + 1, g->halo));
        GPC_TRY(update<T>(g, d, 2, nz, g->compute));
    }
    return GPC_OK;
}

/* The band's outer planes of v to the GPUs below and above, and theirs into
 * its halo planes, queued on the halo stream in one NCCL group (planes as
 * bytes: sends and receives copy, they do not compute). */
static gpc_status exchange_peers(gpc_stencil_cuda *g, size_t pb, int last) {
    gpc_dist *p = g->c.peers;
    cudaStream_t s = g->halo;
    const int nz = g->nz[last];
    GPC_TRY(p->ops->group_start(p));
    gpc_status st = GPC_OK;
    if (g->c.below) {
        st = p->ops->send(p, g->v[0] + pb, pb, GPC_I8, p->rank - 1, s);
        if (!st) st = p->ops->recv(p, g->v[0], pb, GPC_I8, p->rank - 1, s);
    }
    if (g->c.above && !st) {
        st = p->ops->send(p, g->v[last] + (size_t)nz * pb, pb, GPC_I8, p->rank + 1, s);
        if (!st)
            st = p->ops->recv(p, g->v[last] + (size_t)(nz + 1) * pb, pb, GPC_I8, p->rank + 1, s);
    }
    const gpc_status ended = p->ops->group_end(p); /* a group opened is closed */
    return st ? st : ended;
}

extern "C" gpc_status gpc_stencil_cuda_step_begin(gpc_stencil_cuda *g) {
    GPC_CUDA_CHECK(cudaSetDevice(g->c.device));
    if (g->started) {
        /* this step writes what the other stream's last step read, and
         * reads what it wrote */
        GPC_CUDA_CHECK(cudaStreamWaitEvent(g->halo, g->compute_done, 0));
        GPC_CUDA_CHECK(cudaStreamWaitEvent(g->compute, g->halo_done, 0));
    }
    GPC_TRY(g->c.fp32 ? step_kernels<float>(g) : step_kernels<double>(g));
    const size_t pb = (size_t)g->plane * g->elem;
    const int last = g->c.slabs - 1;
    /* the new boundary planes into the neighbouring slabs' halos of v */
    for (int d = 0; d < g->c.slabs; d++) {
        if (d > 0)
            GPC_CUDA_CHECK(cudaMemcpyAsync(g->v[d - 1] + (size_t)(g->nz[d - 1] + 1) * pb,
                                           g->v[d] + pb, pb, cudaMemcpyDeviceToDevice, g->halo));
        if (d < last)
            GPC_CUDA_CHECK(cudaMemcpyAsync(g->v[d + 1], g->v[d] + (size_t)g->nz[d] * pb, pb,
                                           cudaMemcpyDeviceToDevice, g->halo));
    }
    if (g->c.peers) return exchange_peers(g, pb, last);
    /* and the band's outer planes to the host, for the processes around */
    if (g->c.below)
        GPC_CUDA_CHECK(
            cudaMemcpyAsync(g->host[0], g->v[0] + pb, pb, cudaMemcpyDeviceToHost, g->halo));
    if (g->c.above)
        GPC_CUDA_CHECK(cudaMemcpyAsync(g->host[1], g->v[last] + (size_t)g->nz[last] * pb, pb,
                                       cudaMemcpyDeviceToHost, g->halo));
    if (g->c.below || g->c.above) GPC_CUDA_CHECK(cudaStreamSynchronize(g->halo));
    return GPC_OK;
}

extern "C" int gpc_stencil_cuda_pairs(const gpc_stencil_cuda *g) {
    return (g->c.kernel == GPC_STENCIL_KERNEL_TWOSTEP ||
            g->c.kernel == GPC_STENCIL_KERNEL_STREAM2) &&
           g->c.slabs == 1 && !g->c.below && !g->c.above;
}

template <typename T> static gpc_status two_steps(gpc_stencil_cuda *g) {
    const int n = g->c.n, nz = g->nz[0];
    if (g->c.kernel == GPC_STENCIL_KERNEL_STREAM2) {
        const stream2_kernel<T> s = stream2_of<T>(g->c.stream2_rows);
        const int width = 512 / (int)sizeof(T); /* 32 lanes of 16 bytes */
        const int gx = (n + width - 1) / width, gy = (n + s.rows - 1) / s.rows;
        /* a chunk reads two planes on either side, and computes step one
         * on one of them */
        const int zchunk = z_chunk((long long)gx * gy, nz, g->resident_pair, 3.0);
        dim3 grid(gx, gy, (nz + zchunk - 1) / zchunk), block(32, s.warps);
        s.fn<<<grid, block, 0, g->compute>>>((T *)g->v[0] + g->shift, (const T *)g->u[0] + g->shift,
                                             n, g->pitch, g->plane, nz, zchunk, (T)g->c.c6,
                                             (T)g->c.r);
        GPC_CUDA_CHECK_LAUNCH();
        return GPC_OK;
    }
    const long long tiles = (long long)((n + TX - 1) / TX) * ((n + TY - 1) / TY);
    const int zchunk = z_chunk(tiles, nz, g->resident_pair);
    dim3 grid((n + TX - 1) / TX, (n + TY - 1) / TY, (nz + zchunk - 1) / zchunk);
    stencil_two_steps<T, two_step_ahead<T>::value><<<grid, EX * EY, 0, g->compute>>>(
        (T *)g->v[0] + g->shift, (const T *)g->u[0] + g->shift, n, g->pitch, g->plane, nz, zchunk,
        (T)g->c.c6, (T)g->c.r);
    GPC_CUDA_CHECK_LAUNCH();
    return GPC_OK;
}

extern "C" gpc_status gpc_stencil_cuda_step_pair(gpc_stencil_cuda *g) {
    if (!gpc_stencil_cuda_pairs(g))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "stencil: two steps a pass need the twostep or stream2 kernel, one slab "
                         "and one process: step one at a time");
    GPC_CUDA_CHECK(cudaSetDevice(g->c.device));
    /* a single step before ran on this stream, and nothing on the halo stream */
    GPC_TRY(g->c.fp32 ? two_steps<float>(g) : two_steps<double>(g));
    GPC_CUDA_CHECK(cudaEventRecord(g->halo_done, g->halo));
    GPC_CUDA_CHECK(cudaEventRecord(g->compute_done, g->compute));
    g->started = 1;
    char *t = g->u[0];
    g->u[0] = g->v[0], g->v[0] = t;
    return GPC_OK;
}

extern "C" gpc_status gpc_stencil_cuda_step_end(gpc_stencil_cuda *g) {
    const size_t pb = (size_t)g->plane * g->elem;
    const int last = g->c.slabs - 1;
    if (g->c.below && !g->c.peers)
        GPC_CUDA_CHECK(cudaMemcpyAsync(g->v[0], g->host[2], pb, cudaMemcpyHostToDevice, g->halo));
    if (g->c.above && !g->c.peers)
        GPC_CUDA_CHECK(cudaMemcpyAsync(g->v[last] + (size_t)(g->nz[last] + 1) * pb, g->host[3], pb,
                                       cudaMemcpyHostToDevice, g->halo));
    GPC_CUDA_CHECK(cudaEventRecord(g->halo_done, g->halo));
    GPC_CUDA_CHECK(cudaEventRecord(g->compute_done, g->compute));
    g->started = 1;
    for (int d = 0; d < g->c.slabs; d++) {
        char *t = g->u[d];
        g->u[d] = g->v[d], g->v[d] = t;
    }
    return GPC_OK;
}

extern "C" gpc_status gpc_stencil_cuda_sync(gpc_stencil_cuda *g) {
    GPC_CUDA_CHECK(cudaSetDevice(g->c.device));
    GPC_CUDA_CHECK(cudaStreamSynchronize(g->compute));
    GPC_CUDA_CHECK(cudaStreamSynchronize(g->halo));
    GPC_CUDA_CHECK(cudaGetLastError());
    return GPC_OK;
}

/* The slab holding band plane zl, and zl within it. */
static int slab_of(const gpc_stencil_cuda *g, int zl, int *local) {
    int d = 0;
    while (d + 1 < g->c.slabs && zl >= g->z0[d] + g->nz[d])
        d++;
    *local = zl - g->z0[d];
    return d;
}

extern "C" gpc_status gpc_stencil_cuda_plane(const gpc_stencil_cuda *g, int zl, double *out) {
    GPC_TRY(gpc_stencil_cuda_sync((gpc_stencil_cuda *)g));
    const int n = g->c.n;
    int local;
    const int d = slab_of(g, zl, &local);
    void *rows = malloc((size_t)n * n * g->elem);
    if (!rows) return gpc_error(GPC_ERR_NOMEM, "stencil: out of host memory");
    const char *src =
        g->u[d] +
        ((size_t)(local + 1) * g->plane + (size_t)g->pitch + (size_t)g->shift + 1) * g->elem;
    cudaError_t e = cudaMemcpy2D(rows, (size_t)n * g->elem, src, (size_t)g->pitch * g->elem,
                                 (size_t)n * g->elem, (size_t)n, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess)
        for (size_t i = 0; i < (size_t)n * n; i++)
            out[i] = g->c.fp32 ? (double)((float *)rows)[i] : ((double *)rows)[i];
    free(rows);
    GPC_CUDA_CHECK(e);
    return GPC_OK;
}

extern "C" gpc_status gpc_stencil_cuda_at(const gpc_stencil_cuda *g, int x, int y, int zl,
                                          double *out) {
    GPC_TRY(gpc_stencil_cuda_sync((gpc_stencil_cuda *)g));
    int local;
    const int d = slab_of(g, zl, &local);
    const size_t i =
        (size_t)(local + 1) * g->plane + (size_t)(y + 1) * g->pitch + (size_t)g->shift + x + 1;
    if (g->c.fp32) {
        float value;
        GPC_CUDA_CHECK(
            cudaMemcpy(&value, g->u[d] + i * g->elem, sizeof value, cudaMemcpyDeviceToHost));
        *out = value;
    } else {
        GPC_CUDA_CHECK(cudaMemcpy(out, g->u[d] + i * g->elem, sizeof *out, cudaMemcpyDeviceToHost));
    }
    return GPC_OK;
}

/* Runs a reduction kernel over every slab into scratch; out[0..1] back. */
template <typename T>
static gpc_status reduce(const gpc_stencil_cuda *g, int checksum, double scale,
                         unsigned long long out[2]) {
    GPC_TRY(gpc_stencil_cuda_sync((gpc_stencil_cuda *)g));
    const int n = g->c.n;
    GPC_CUDA_CHECK(cudaMemsetAsync(g->scratch, 0, 2 * sizeof *g->scratch, g->compute));
    dim3 block(BX, BY), grid((n + BX - 1) / BX, (n + BY - 1) / BY);
    for (int d = 0; d < g->c.slabs; d++) {
        const T *u = (const T *)g->u[d] + g->shift;
        if (checksum)
            stencil_checksum<T><<<grid, block, 0, g->compute>>>(u, n, g->pitch, g->plane, g->nz[d],
                                                                g->c.z0 + g->z0[d], g->scratch);
        else
            stencil_error<T><<<grid, block, 0, g->compute>>>(
                u, g->sine, g->sine + n, g->sine + 2 * n + g->c.z0 + g->z0[d], n, g->pitch,
                g->plane, g->nz[d], scale, g->scratch);
        GPC_CUDA_CHECK_LAUNCH();
    }
    GPC_CUDA_CHECK(
        cudaMemcpyAsync(out, g->scratch, 2 * sizeof *out, cudaMemcpyDeviceToHost, g->compute));
    GPC_CUDA_CHECK(cudaStreamSynchronize(g->compute));
    return GPC_OK;
}

extern "C" gpc_status gpc_stencil_cuda_error(const gpc_stencil_cuda *g, double scale, double *err,
                                             double *big) {
    unsigned long long out[2] = {0, 0};
    GPC_TRY(g->c.fp32 ? reduce<float>(g, 0, scale, out) : reduce<double>(g, 0, scale, out));
    memcpy(err, &out[0], sizeof *err);
    memcpy(big, &out[1], sizeof *big);
    return GPC_OK;
}

extern "C" gpc_status gpc_stencil_cuda_checksum(const gpc_stencil_cuda *g, uint64_t *sum) {
    unsigned long long out[2] = {0, 0};
    GPC_TRY(g->c.fp32 ? reduce<float>(g, 1, 0, out) : reduce<double>(g, 1, 0, out));
    *sum = out[0];
    return GPC_OK;
}

extern "C" gpc_status gpc_stencil_cuda_copy_rate(int device, size_t bytes,
                                                 double *bytes_per_second) {
    *bytes_per_second = 0;
    GPC_CUDA_CHECK(cudaSetDevice(device));
    void *a = NULL, *b = NULL;
    cudaEvent_t t0 = NULL, t1 = NULL;
    cudaError_t e = cudaMalloc(&a, bytes);
    if (e == cudaSuccess) e = cudaMalloc(&b, bytes);
    if (e == cudaSuccess) e = cudaMemset(a, 1, bytes);
    if (e == cudaSuccess) e = cudaMemset(b, 2, bytes);
    if (e == cudaSuccess) e = cudaEventCreate(&t0);
    if (e == cudaSuccess) e = cudaEventCreate(&t1);
    if (e == cudaSuccess) e = cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice); /* warm-up */
    float best = 0;
    for (int rep = 0; rep < 5 && e == cudaSuccess; rep++) {
        float ms = 0;
        e = cudaEventRecord(t0, 0);
        if (e == cudaSuccess) e = cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0);
        if (e == cudaSuccess) e = cudaEventRecord(t1, 0);
        if (e == cudaSuccess) e = cudaEventSynchronize(t1);
        if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, t0, t1);
        if (e == cudaSuccess && ms > 0 && (best == 0 || ms < best)) best = ms;
    }
    if (t0) cudaEventDestroy(t0);
    if (t1) cudaEventDestroy(t1);
    cudaFree(a);
    cudaFree(b);
    GPC_CUDA_CHECK(e);
    /* bytes read plus bytes written */
    *bytes_per_second = best > 0 ? 2.0 * (double)bytes / (best * 1e-3) : 0;
    return GPC_OK;
}
