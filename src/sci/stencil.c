/*
 * stencil.c: the 3D heat-equation solver of gpc/stencil.h: the checks,
 * the split of the grid, the CPU solver, the exchange with other processes,
 * and the GPU's half (stencil_cuda.h) driven step by step (two steps a call
 * where GPC_STENCIL_KERNEL=twostep or stream2 allows it).
 *
 * On the CPU each slab d owns planes z0[d] .. z0[d] + nz[d] - 1 of the grid,
 * stored as nz + 2 planes of (n + 2)^2 points: the first and last are halo
 * planes, and every plane has a ring of boundary zeros, so the update reads
 * its six neighbours without a test. A step copies each slab's first and
 * last interior planes into its neighbours' halos; with other processes it
 * starts the exchange of the band's outer planes over MPI, updates every
 * plane that needs no remote halo (OpenMP over rows, x innermost and
 * vectorised), waits for the halos and updates the band's two outer planes;
 * then it swaps u and v. Points are updated by the same expression whatever
 * the split, so every split gives the same bits: c6 u + r s as one fused
 * multiply-add, in the vector and the scalar code alike.
 *
 * A grid larger than the last-level cache is written with streaming stores
 * (AVX-512 builds): v's lines then go to memory without being read first,
 * 16 bytes of traffic a point instead of 24.
 */
#include "gpc/stencil.h"
#include "gpc/settings.h"
#include "sci/sci.h"
#include "sci/stencil_cuda.h"
#include "sci/stencil_mpi.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

struct gpc_stencil {
    gpc_stencil_config config;
    int n, domains;
    int rank, world;
    int first, count; /* this process's planes of the grid */
    int stream;       /* write v with streaming stores */
    int *z0, *nz;     /* each slab's first plane of the grid and its planes */
    double **u, **v;  /* CPU: each slab's arrays */
    gpc_stencil_cuda *gpu;
    gpc_stencil_kernel kernel; /* the GPU's update kernel */
    gpc_stencil_halo *halo;
    int64_t steps;
    double lambda;
};

void gpc_stencil_defaults(gpc_stencil_config *c) {
    memset(c, 0, sizeof *c);
    c->n = 128;
    c->domains = 1;
    c->r = 0.125;
    c->mode[0] = c->mode[1] = c->mode[2] = 1;
    c->device = gpc_cpu();
}

static size_t plane_of(int n) {
    return (size_t)(n + 2) * (size_t)(n + 2);
}

static int world_of(const gpc_stencil_config *c) {
    return c->dist ? c->dist->world_size : 1;
}

/* Process p's planes of n split over world: as even as integers allow. */
static void band_of(int n, int p, int world, int *first, int *count) {
    *first = (int)((int64_t)n * p / world);
    *count = (int)((int64_t)n * (p + 1) / world) - *first;
}

void gpc_stencil_free(gpc_stencil *s) {
    if (!s) return;
    for (int d = 0; s->u && d < s->domains; d++)
        gpc_free(s->u[d]), gpc_free(s->v[d]);
    gpc_stencil_cuda_free(s->gpu);
    gpc_stencil_halo_free(s->halo);
    gpc_free(s->u), gpc_free(s->v), gpc_free(s->z0), gpc_free(s->nz);
    gpc_free(s);
}

double gpc_stencil_lambda(const gpc_stencil_config *c) {
    const double h = 1.0 / (c->n + 1);
    double sum = 0;
    for (int a = 0; a < 3; a++) {
        double q = sin(c->mode[a] * M_PI * h / 2);
        sum += q * q;
    }
    return 1.0 - 4.0 * c->r * sum;
}

/* sin(k pi (i + 1) h) of axis a: one factor of the starting mode. The GPU
 * gets tables of these, so its starting field has the CPU's bits. */
static double sine_at(const gpc_stencil_config *c, int a, int i) {
    const double h = 1.0 / (c->n + 1);
    return sin(c->mode[a] * M_PI * (i + 1) * h);
}

/* The starting mode at interior point (x, y, z), each 0 to n - 1. */
static double mode_at(const gpc_stencil_config *c, int x, int y, int z) {
    return sine_at(c, 0, x) * sine_at(c, 1, y) * sine_at(c, 2, z);
}

/* 1 - 6 r rounded once. Written as a fused multiply-add so that no
 * compiler's choice to contract (or not) 1 - 6 r changes its last bit: the
 * CPU and the GPU must use the same c6 to give the same field. */
static double c6_of(double r) {
    return fma(-6.0, r, 1.0);
}

static size_t element_of(const gpc_stencil_config *c) {
    return c->fp32 ? sizeof(float) : sizeof(double);
}

size_t gpc_stencil_copy_bytes(const gpc_stencil_config *c) {
    /* one process's share of one array */
    double array = (double)c->n * c->n * ((double)c->n / world_of(c)) * (double)element_of(c);
    double least, most;
    if (c->device.type == GPC_DEVICE_CUDA) {
        least = 256.0 * 1024 * 1024, most = 2048.0 * 1024 * 1024;
    } else {
        long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
        if (llc <= 0) llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
        least = 4.0 * (llc > 0 ? (double)llc : 64.0 * 1024 * 1024);
        most = 512.0 * 1024 * 1024;
    }
    double bytes = array > least ? array : least;
    return (size_t)(bytes < most ? bytes : most);
}

gpc_status gpc_stencil_copy_rate(const gpc_stencil_config *c, double *rate) {
    *rate = 0;
    size_t bytes = gpc_stencil_copy_bytes(c);
    if (c->device.type == GPC_DEVICE_CUDA)
        return gpc_stencil_cuda_copy_rate(c->device.index, bytes, rate);
    char *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) {
        free(a), free(b);
        return gpc_error(GPC_ERR_NOMEM, "stencil: no host memory for the copy baseline");
    }
    memset(a, 1, bytes), memset(b, 2, bytes);
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = gpc_time_seconds();
        /* split over the threads, as the solver's rows are */
#pragma omp parallel
        {
            int t = omp_get_thread_num(), nt = omp_get_num_threads();
            size_t lo = bytes * (size_t)t / (size_t)nt, hi = bytes * (size_t)(t + 1) / (size_t)nt;
            memcpy(b + lo, a + lo, hi - lo);
        }
        double s = gpc_time_seconds() - t0;
        if (s > 0 && 2.0 * (double)bytes / s > best) best = 2.0 * (double)bytes / s;
    }
    volatile char sink = b[bytes / 2];
    (void)sink;
    free(a), free(b);
    *rate = best;
    return GPC_OK;
}

/* GPC_STENCIL_KERNEL's names, in gpc_stencil_kernel's order. */
static const char *const kernel_names[GPC_STENCIL_KERNELS] = {
    "vector", "column", "plain", "shared", "twostep", "async", "stream2"};

/* The kernel auto picks. */
static const gpc_stencil_kernel default_kernel = GPC_STENCIL_KERNEL_STREAM2;

/* The tile rows a kernel's rows setting (GPC_STENCIL_ASYNC_ROWS,
 * GPC_STENCIL_STREAM2_ROWS) names, its table default when unset; -1 for a
 * value that is not one of the table's choices. */
static int tile_rows_of_setting(const char *name) {
    const char *rows = gpc_setting_str(name);
    return gpc_setting_is_choice(name, rows) ? atoi(rows) : -1;
}

/* The tile rows a run uses: the setting's, or its table default when it
 * was changed since create to a value the table does not list (create's
 * check_config refuses one given before). */
static int tile_rows(const char *name) {
    const int rows = tile_rows_of_setting(name);
    return rows >= 0 ? rows : atoi(gpc_settings_find(name)->default_value);
}

/* The update kernel GPC_STENCIL_KERNEL names; -1 for a name it does not
 * know. */
static int kernel_of_setting(void) {
    const char *name = gpc_setting_str("GPC_STENCIL_KERNEL");
    if (!name || strcmp(name, "auto") == 0) return default_kernel;
    for (int k = 0; k < GPC_STENCIL_KERNELS; k++)
        if (strcmp(name, kernel_names[k]) == 0) return k;
    return -1;
}

const char *gpc_stencil_kernel_name(const gpc_stencil *s) {
    return s->gpu ? kernel_names[s->kernel] : "cpu";
}

/* Everything gpc_stencil_create refuses without allocating. */
static gpc_status check_config(const gpc_stencil_config *c) {
    if (c->n < 1 || c->n > 4096)
        return gpc_error(GPC_ERR_INVALID_ARG, "stencil: n %d is not 1 to 4096", c->n);
    const int world = world_of(c);
    if (world > 1 && c->domains >= 1 && (int64_t)world * c->domains > c->n)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "stencil: %d processes x %d domains for %d planes: each domain needs a "
                         "plane or more (use a larger --n, fewer processes or fewer domains)",
                         world, c->domains, c->n);
    if (c->domains < 1 || c->domains > c->n)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "stencil: %d domains for %d planes: each domain needs a plane or more",
                         c->domains, c->n);
    if (!(c->r > 0 && c->r <= 1.0 / 6))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "stencil: r = %g is not above 0 and at most 1/6 (explicit Euler is "
                         "unstable beyond)",
                         c->r);
    for (int a = 0; a < 3; a++)
        if (c->mode[a] < 1 || c->mode[a] > c->n)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "stencil: mode %d,%d,%d: each must be 1 to n (%d)", c->mode[0],
                             c->mode[1], c->mode[2], c->n);
    if (c->device.type != GPC_DEVICE_CPU && c->device.type != GPC_DEVICE_CUDA)
        return gpc_error(GPC_ERR_INVALID_ARG, "stencil: runs on the CPU or a CUDA GPU, not %s",
                         gpc_device_name(c->device));
    if (c->device.type == GPC_DEVICE_CUDA && kernel_of_setting() < 0)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "stencil: GPC_STENCIL_KERNEL=%s is not a GPU kernel: use auto, vector, "
                         "column, plain, shared, twostep, async or stream2 (or unset it)",
                         gpc_setting_str("GPC_STENCIL_KERNEL"));
    if (c->device.type == GPC_DEVICE_CUDA && tile_rows_of_setting("GPC_STENCIL_ASYNC_ROWS") < 0)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "stencil: GPC_STENCIL_ASYNC_ROWS=%s is not a tile of the async kernel: "
                         "use 8, 16 or 32 (or unset it)",
                         gpc_setting_str("GPC_STENCIL_ASYNC_ROWS"));
    if (c->device.type == GPC_DEVICE_CUDA && tile_rows_of_setting("GPC_STENCIL_STREAM2_ROWS") < 0)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "stencil: GPC_STENCIL_STREAM2_ROWS=%s is not a tile of the stream2 "
                         "kernel: use 6, 14 or 30 (or unset it)",
                         gpc_setting_str("GPC_STENCIL_STREAM2_ROWS"));
    if (c->fp32 && c->device.type == GPC_DEVICE_CPU)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "stencil: f32 runs on GPUs only (the CPU solver computes in f64): use "
                         "--precision f64 or --device cuda");
    if (world > 1) {
        if (!gpc_stencil_mpi_built())
            return gpc_error(GPC_ERR_UNSUPPORTED,
                             "stencil: this gpc was built without MPI, which %d processes need: "
                             "install libopenmpi-dev (scripts/setup.sh) and rebuild",
                             world);
        if (!c->dist->ops || strcmp(c->dist->ops->name, "mpi") != 0)
            return gpc_error(GPC_ERR_UNSUPPORTED,
                             "stencil: halo planes go over MPI between processes, not %s: start "
                             "the processes with mpirun (or srun) and create the collectives "
                             "with the mpi backend",
                             c->dist->ops ? c->dist->ops->name : "none");
    }
    return gpc_sci_check_gpu_dist("stencil", c->gpu_dist, c->device, c->dist ? c->dist->rank : 0,
                                  world);
}

static void fill_gpu_config(const gpc_stencil *s, gpc_stencil_cuda_config *g, double **tables) {
    const gpc_stencil_config *c = &s->config;
    memset(g, 0, sizeof *g);
    g->device = c->device.index, g->fp32 = c->fp32, g->n = c->n;
    g->z0 = s->first, g->nz = s->count, g->slabs = c->domains;
    g->below = s->rank > 0, g->above = s->rank + 1 < s->world;
    g->peers = c->gpu_dist;
    g->kernel = s->kernel;
    g->async_rows = tile_rows("GPC_STENCIL_ASYNC_ROWS");
    g->stream2_rows = tile_rows("GPC_STENCIL_STREAM2_ROWS");
    g->r = c->r, g->c6 = c6_of(c->r);
    for (int a = 0; a < 3; a++)
        g->sine[a] = tables ? tables[a] : NULL;
}

gpc_status gpc_stencil_create(gpc_stencil **out, const gpc_stencil_config *c) {
    *out = NULL;
    GPC_TRY(check_config(c));
    const int world = world_of(c), rank = c->dist ? c->dist->rank : 0;
    int first, count;
    band_of(c->n, rank, world, &first, &count);
    char what[96];
    snprintf(what, sizeof what, "stencil: %d^3 points%s in %s need", c->n,
             world > 1 ? " (this process's share)" : "", c->fp32 ? "f32" : "f64");
    const double copy = (double)gpc_stencil_copy_bytes(c);
    if (c->device.type == GPC_DEVICE_CUDA) {
        gpc_stencil *probe = gpc_calloc(1, sizeof *probe);
        if (!probe) return gpc_error(GPC_ERR_NOMEM, "stencil: out of host memory");
        probe->config = *c, probe->rank = rank, probe->world = world;
        probe->first = first, probe->count = count;
        gpc_stencil_cuda_config g;
        fill_gpu_config(probe, &g, NULL);
        gpc_free(probe);
        /* the device exists, and the arrays and the copy baseline's two
         * buffers fit in what it has free */
        GPC_TRY(
            gpc_stencil_cuda_check(c->device.index, gpc_stencil_cuda_bytes(&g) + 2.0 * copy, what));
    } else {
        /* refuse what cannot fit rather than be killed filling it in: the
         * two arrays, and the two buffers of the copy-rate baseline */
        double array = (c->n + 2.0) * (c->n + 2.0) * (count + 2.0 * c->domains) * 8;
        GPC_TRY(gpc_host_memory_check(2.0 * array + 2.0 * copy, what, "", "use a smaller --n"));
    }
    gpc_stencil *s = gpc_calloc(1, sizeof *s);
    if (!s) return gpc_error(GPC_ERR_NOMEM, "stencil: out of host memory");
    s->config = *c;
    s->n = c->n, s->domains = c->domains;
    s->rank = rank, s->world = world, s->first = first, s->count = count;
    s->lambda = gpc_stencil_lambda(c);
    if (c->device.type == GPC_DEVICE_CUDA) {
        const int kernel = kernel_of_setting(); /* checked above, unless changed since */
        s->kernel = kernel < 0 ? default_kernel : (gpc_stencil_kernel)kernel;
    }
    gpc_status st = gpc_stencil_halo_create(&s->halo, rank, world);
    if (st) {
        gpc_stencil_free(s);
        return st;
    }
    if (c->device.type == GPC_DEVICE_CUDA) {
        double *tables[3] = {NULL, NULL, NULL};
        for (int a = 0; a < 3; a++) {
            tables[a] = gpc_calloc((size_t)c->n, sizeof(double));
            for (int i = 0; tables[a] && i < c->n; i++)
                tables[a][i] = sine_at(c, a, i);
        }
        gpc_stencil_cuda_config g;
        fill_gpu_config(s, &g, tables);
        st = tables[0] && tables[1] && tables[2]
                 ? gpc_stencil_cuda_create(&s->gpu, &g)
                 : gpc_error(GPC_ERR_NOMEM, "stencil: out of host memory");
        for (int a = 0; a < 3; a++)
            gpc_free(tables[a]);
        if (st) {
            gpc_stencil_free(s);
            return st;
        }
        *out = s;
        return GPC_OK;
    }
    /* two arrays beyond 64 MiB: larger than the caches of the machines
     * gpc runs on, so v is not read back before the next step overwrites it */
    s->stream = 16.0 * c->n * c->n * count > 64.0 * 1024 * 1024;
    s->z0 = gpc_calloc((size_t)c->domains, sizeof *s->z0);
    s->nz = gpc_calloc((size_t)c->domains, sizeof *s->nz);
    s->u = gpc_calloc((size_t)c->domains, sizeof *s->u);
    s->v = gpc_calloc((size_t)c->domains, sizeof *s->v);
    int ok = s->z0 && s->nz && s->u && s->v;
    const size_t plane = plane_of(c->n);
    for (int d = 0; ok && d < c->domains; d++) {
        int f, k;
        band_of(count, d, c->domains, &f, &k);
        s->z0[d] = first + f, s->nz[d] = k;
        size_t points = (size_t)(s->nz[d] + 2) * plane;
        s->u[d] = gpc_calloc(points, sizeof(double));
        s->v[d] = gpc_calloc(points, sizeof(double));
        ok = s->u[d] && s->v[d];
    }
    if (!ok) {
        gpc_stencil_free(s);
        return gpc_error(GPC_ERR_NOMEM, "stencil: out of host memory for %d^3 points twice", c->n);
    }
    const int R = c->n + 2;
    for (int d = 0; d < c->domains; d++)
#pragma omp parallel for schedule(static)
        for (int zl = 1; zl <= s->nz[d]; zl++)
            for (int y = 1; y <= c->n; y++)
                for (int x = 1; x <= c->n; x++)
                    s->u[d][(size_t)zl * plane + (size_t)y * R + x] =
                        mode_at(c, x - 1, y - 1, s->z0[d] + zl - 1);
    *out = s;
    return GPC_OK;
}

/* The slab holding grid plane z, one of this process's. */
static int slab_of(const gpc_stencil *s, int z) {
    int d = 0;
    while (z >= s->z0[d] + s->nz[d])
        d++;
    return d;
}

/* The process holding grid plane z. */
static int rank_of(const gpc_stencil *s, int z) {
    int p = 0, first, count;
    for (;; p++) {
        band_of(s->n, p, s->world, &first, &count);
        if (z < first + count || p + 1 == s->world) return p;
    }
}

/* Each slab's outermost interior planes into its neighbours' halo planes
 * (the slabs of this process). */
static void exchange_halos(gpc_stencil *s) {
    const size_t plane = plane_of(s->n);
#pragma omp parallel for schedule(static)
    for (int d = 0; d < s->domains; d++) {
        if (d > 0) /* from below: the previous slab's last interior plane */
            memcpy(s->u[d], s->u[d - 1] + (size_t)s->nz[d - 1] * plane, plane * sizeof(double));
        if (d + 1 < s->domains) /* from above: the next slab's first interior plane */
            memcpy(s->u[d] + (size_t)(s->nz[d] + 1) * plane, s->u[d + 1] + plane,
                   plane * sizeof(double));
    }
}

/* v[i] = c6 u[i] + r (its six neighbours) for the n points from i0 on. */
static void update_row(double *restrict v, const double *restrict u, size_t i0, int n, size_t R,
                       size_t P, double c6, double r, int stream) {
    size_t i = i0, end = i0 + (size_t)n;
#if defined(__AVX512F__)
    if (stream) {
        for (; i < end && ((uintptr_t)(v + i) & 63); i++)
            v[i] = fma(c6, u[i],
                       r * (u[i - 1] + u[i + 1] + u[i - R] + u[i + R] + u[i - P] + u[i + P]));
        const __m512d vc6 = _mm512_set1_pd(c6), vr = _mm512_set1_pd(r);
        for (; i + 8 <= end; i += 8) {
            __m512d sum = _mm512_add_pd(_mm512_loadu_pd(u + i - 1), _mm512_loadu_pd(u + i + 1));
            sum = _mm512_add_pd(sum, _mm512_loadu_pd(u + i - R));
            sum = _mm512_add_pd(sum, _mm512_loadu_pd(u + i + R));
            sum = _mm512_add_pd(sum, _mm512_loadu_pd(u + i - P));
            sum = _mm512_add_pd(sum, _mm512_loadu_pd(u + i + P));
            _mm512_stream_pd(v + i,
                             _mm512_fmadd_pd(vc6, _mm512_loadu_pd(u + i), _mm512_mul_pd(vr, sum)));
        }
    }
#else
    (void)stream;
#endif
#pragma omp simd
    for (size_t k = i; k < end; k++)
        v[k] = fma(c6, u[k], r * (u[k - 1] + u[k + 1] + u[k - R] + u[k + R] + u[k - P] + u[k + P]));
}

/* Updates grid planes zlo .. zhi - 1 (this process's), rows spread over the
 * threads. */
static void update_planes(gpc_stencil *s, int zlo, int zhi) {
    if (zlo >= zhi) return;
    const int n = s->n, R = n + 2;
    const size_t plane = plane_of(n);
    const double r = s->config.r, c6 = c6_of(r);
#pragma omp parallel
    {
#pragma omp for collapse(2) schedule(static) nowait
        for (int z = zlo; z < zhi; z++)
            for (int y = 1; y <= n; y++) {
                const int d = slab_of(s, z);
                const size_t base = (size_t)(z - s->z0[d] + 1) * plane;
                update_row(s->v[d], s->u[d], base + (size_t)y * R + 1, n, (size_t)R, plane, c6, r,
                           s->stream);
            }
#if defined(__AVX512F__)
        /* this thread's streamed lines out before the barrier and the next step */
        if (s->stream) _mm_sfence();
#endif
    }
}

static gpc_status run_cpu(gpc_stencil *s) {
    exchange_halos(s);
    const int first = s->first, last = s->first + s->count - 1;
    if (s->world == 1) {
        update_planes(s, first, last + 1);
    } else {
        /* the band's outer planes travel while the planes that need no
         * remote halo are updated */
        const size_t plane = plane_of(s->n), bytes = plane * sizeof(double);
        const int top = s->domains - 1;
        GPC_TRY(gpc_stencil_halo_post(s->halo, s->u[0] + plane, s->u[top] + s->nz[top] * plane,
                                      s->u[0], s->u[top] + (size_t)(s->nz[top] + 1) * plane,
                                      bytes));
        update_planes(s, first + 1, last);
        GPC_TRY(gpc_stencil_halo_wait(s->halo));
        update_planes(s, first, first + 1);
        if (last > first) update_planes(s, last, last + 1);
    }
    for (int d = 0; d < s->domains; d++) {
        double *t = s->u[d];
        s->u[d] = s->v[d], s->v[d] = t;
    }
    return GPC_OK;
}

static gpc_status run_gpu(gpc_stencil *s) {
    GPC_TRY(gpc_stencil_cuda_step_begin(s->gpu));
    if (s->world > 1) {
        gpc_stencil_cuda_halos h;
        gpc_stencil_cuda_host_halos(s->gpu, &h);
        GPC_TRY(
            gpc_stencil_halo_post(s->halo, h.send_lo, h.send_hi, h.recv_lo, h.recv_hi, h.bytes));
        GPC_TRY(gpc_stencil_halo_wait(s->halo));
    }
    return gpc_stencil_cuda_step_end(s->gpu);
}

gpc_status gpc_stencil_run(gpc_stencil *s, int steps) {
    for (int step = 0; step < steps;) {
        if (s->gpu && steps - step >= 2 && gpc_stencil_cuda_pairs(s->gpu)) {
            /* twostep or stream2: two steps, one pass over the field */
            GPC_TRY(gpc_stencil_cuda_step_pair(s->gpu));
            step += 2, s->steps += 2;
            continue;
        }
        GPC_TRY(s->gpu ? run_gpu(s) : run_cpu(s));
        step++, s->steps++;
    }
    return s->gpu ? gpc_stencil_cuda_sync(s->gpu) : GPC_OK;
}

int64_t gpc_stencil_steps(const gpc_stencil *s) {
    return s->steps;
}

void gpc_stencil_planes(const gpc_stencil *s, int *first, int *count) {
    *first = s->first, *count = s->count;
}

double gpc_stencil_at(const gpc_stencil *s, int x, int y, int z) {
    if (z < s->first || z >= s->first + s->count) return NAN;
    if (s->gpu) {
        double value = NAN;
        if (gpc_stencil_cuda_at(s->gpu, x, y, z - s->first, &value)) return NAN;
        return value;
    }
    const int d = slab_of(s, z);
    return s->u[d][(size_t)(z - s->z0[d] + 1) * plane_of(s->n) + (size_t)(y + 1) * (s->n + 2) +
                   (size_t)(x + 1)];
}

double gpc_stencil_at_all(const gpc_stencil *s, int x, int y, int z) {
    double value = gpc_stencil_at(s, x, y, z);
    if (gpc_stencil_mpi_bcast(&value, rank_of(s, z), s->world)) return NAN;
    return value;
}

gpc_status gpc_stencil_plane(const gpc_stencil *s, int z, double *out) {
    if (z < s->first || z >= s->first + s->count)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "stencil: plane %d is not this process's (it holds %d to %d)", z, s->first,
                         s->first + s->count - 1);
    if (s->gpu) return gpc_stencil_cuda_plane(s->gpu, z - s->first, out);
    const int n = s->n, d = slab_of(s, z);
    const double *p = s->u[d] + (size_t)(z - s->z0[d] + 1) * plane_of(n);
    for (int y = 0; y < n; y++)
        memcpy(out + (size_t)y * n, p + (size_t)(y + 1) * (n + 2) + 1, (size_t)n * sizeof *out);
    return GPC_OK;
}

uint64_t gpc_stencil_checksum(const gpc_stencil *s) {
    uint64_t sum = 0;
    if (s->gpu) {
        if (gpc_stencil_cuda_checksum(s->gpu, &sum)) sum = 0;
    } else {
        const int n = s->n;
        const size_t plane = plane_of(n), R = (size_t)n + 2;
        for (int d = 0; d < s->domains; d++)
#pragma omp parallel for schedule(static) reduction(+ : sum)
            for (int zl = 1; zl <= s->nz[d]; zl++)
                for (int y = 1; y <= n; y++)
                    for (int x = 1; x <= n; x++) {
                        double value = s->u[d][(size_t)zl * plane + (size_t)y * R + (size_t)x];
                        uint64_t bits;
                        memcpy(&bits, &value, sizeof bits);
                        uint64_t index =
                            ((uint64_t)(s->z0[d] + zl - 1) * n + (uint64_t)(y - 1)) * n + (x - 1);
                        sum += gpc_stencil_hash(bits, index);
                    }
    }
    gpc_stencil_mpi_sum_u64(&sum, 1, s->world);
    return sum;
}

/* max |u - scale u0| / max |u0| over the grid (every process's points). */
static double error_against(const gpc_stencil *s, double scale) {
    double m[2] = {0, 0}; /* err, big */
    if (s->gpu) {
        if (gpc_stencil_cuda_error(s->gpu, scale, &m[0], &m[1])) m[0] = NAN;
    } else {
        const size_t plane = plane_of(s->n), R = (size_t)s->n + 2;
        double err = 0, big = 0;
        for (int d = 0; d < s->domains; d++)
#pragma omp parallel for schedule(static) reduction(max : err, big)
            for (int zl = 1; zl <= s->nz[d]; zl++)
                for (int y = 1; y <= s->n; y++)
                    for (int x = 1; x <= s->n; x++) {
                        double start = mode_at(&s->config, x - 1, y - 1, s->z0[d] + zl - 1);
                        double got = s->u[d][(size_t)zl * plane + (size_t)y * R + (size_t)x];
                        err = fmax(err, fabs(got - scale * start));
                        big = fmax(big, fabs(start));
                    }
        m[0] = err, m[1] = big;
    }
    /* maxima: exact in any order, so any split reports the same figure */
    gpc_stencil_mpi_max(m, 2, s->world);
    return m[1] > 0 ? m[0] / m[1] : m[0];
}

double gpc_stencil_error(const gpc_stencil *s) {
    return error_against(s, pow(s->lambda, (double)s->steps));
}

double gpc_stencil_heat_decay(const gpc_stencil_config *c, int64_t steps) {
    /* u = exp(-alpha pi^2 |k|^2 t) u0 solves u_t = alpha lap u for a sine
     * mode; alpha t = steps alpha dt = steps r h^2 */
    const double h = 1.0 / (c->n + 1);
    double k2 = 0;
    for (int a = 0; a < 3; a++)
        k2 += (double)c->mode[a] * c->mode[a];
    return exp(-M_PI * M_PI * k2 * c->r * h * h * (double)steps);
}

double gpc_stencil_heat_error(const gpc_stencil *s) {
    return error_against(s, gpc_stencil_heat_decay(&s->config, s->steps));
}
