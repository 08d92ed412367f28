/*
 * stencil.c: the 3D heat-equation solver of gpc/stencil.h on the CPU.
 *
 * Each slab d owns planes z0[d] .. z0[d] + nz[d] - 1 of the grid, stored as
 * nz + 2 planes of (n + 2)^2 points: the first and last are halo planes,
 * and every plane has a ring of boundary zeros, so the update reads its six
 * neighbours without a test. A step copies each slab's first and last
 * interior planes into its neighbours' halos, then updates every interior
 * point from u into v (OpenMP over planes, x innermost and vectorised) and
 * swaps the two. Points are updated by the same expression in the same
 * order whatever the split, so every split gives the same bits: c6 u + r s
 * as one fused multiply-add, in the vector and the scalar code alike.
 *
 * A grid larger than the last-level cache is written with streaming stores
 * (AVX-512 builds): v's lines then go to memory without being read first,
 * 16 bytes of traffic a point instead of 24.
 */
#include "gpc/stencil.h"
#include "sci/sci.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

struct gpc_stencil {
    gpc_stencil_config config;
    int n, domains;
    int stream; /* write v with streaming stores */
    int *z0, *nz;
    double **u, **v;
    int64_t steps;
    double lambda;
};

void gpc_stencil_defaults(gpc_stencil_config *c) {
    memset(c, 0, sizeof *c);
    c->n = 128;
    c->domains = 1;
    c->r = 0.125;
    c->mode[0] = c->mode[1] = c->mode[2] = 1;
}

static size_t plane_of(int n) {
    return (size_t)(n + 2) * (size_t)(n + 2);
}

void gpc_stencil_free(gpc_stencil *s) {
    if (!s) return;
    for (int d = 0; s->u && d < s->domains; d++)
        gpc_free(s->u[d]), gpc_free(s->v[d]);
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

/* The starting mode at interior point (x, y, z), each 0 to n - 1. */
static double mode_at(const gpc_stencil_config *c, int x, int y, int z) {
    const double h = 1.0 / (c->n + 1);
    return sin(c->mode[0] * M_PI * (x + 1) * h) * sin(c->mode[1] * M_PI * (y + 1) * h) *
           sin(c->mode[2] * M_PI * (z + 1) * h);
}

size_t gpc_stencil_copy_bytes(const gpc_stencil_config *c) {
    double array = (double)c->n * c->n * c->n * 8, most = 512.0 * 1024 * 1024;
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (llc <= 0) llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
    double least = 4.0 * (llc > 0 ? (double)llc : 64.0 * 1024 * 1024);
    double bytes = array > least ? array : least;
    return (size_t)(bytes < most ? bytes : most);
}

gpc_status gpc_stencil_create(gpc_stencil **out, const gpc_stencil_config *c) {
    *out = NULL;
    if (c->n < 1 || c->n > 4096)
        return gpc_error(GPC_ERR_INVALID_ARG, "stencil: n %d is not 1 to 4096", c->n);
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
    {
        /* refuse what cannot fit rather than be killed filling it in */
        char what[64];
        snprintf(what, sizeof what, "stencil: %d^3 points", c->n);
        /* the two arrays, and the two buffers of gpc stencil's copy-rate
         * baseline */
        double array = (c->n + 2.0) * (c->n + 2.0) * (c->n + 2.0 * c->domains) * 8;
        double copy = (double)gpc_stencil_copy_bytes(c);
        GPC_TRY(gpc_sci_check_memory(2.0 * array + 2.0 * copy, what, "use a smaller --n"));
    }
    gpc_stencil *s = gpc_calloc(1, sizeof *s);
    if (!s) return gpc_error(GPC_ERR_NOMEM, "stencil: out of host memory");
    s->config = *c;
    s->n = c->n, s->domains = c->domains;
    s->lambda = gpc_stencil_lambda(c);
    /* two arrays beyond 64 MiB: larger than the caches of the machines
     * gpc runs on, so v is not read back before the next step overwrites it */
    s->stream = 16.0 * c->n * c->n * c->n > 64.0 * 1024 * 1024;
    s->z0 = gpc_calloc((size_t)c->domains, sizeof *s->z0);
    s->nz = gpc_calloc((size_t)c->domains, sizeof *s->nz);
    s->u = gpc_calloc((size_t)c->domains, sizeof *s->u);
    s->v = gpc_calloc((size_t)c->domains, sizeof *s->v);
    int ok = s->z0 && s->nz && s->u && s->v;
    const size_t plane = plane_of(c->n);
    for (int d = 0; ok && d < c->domains; d++) {
        s->z0[d] = (int)((int64_t)c->n * d / c->domains);
        s->nz[d] = (int)((int64_t)c->n * (d + 1) / c->domains) - s->z0[d];
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

/* The slab holding grid plane z. */
static int slab_of(const gpc_stencil *s, int z) {
    int d = 0;
    while (z >= s->z0[d] + s->nz[d])
        d++;
    return d;
}

/* Each slab's outermost interior planes into its neighbours' halo planes. */
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

gpc_status gpc_stencil_run(gpc_stencil *s, int steps) {
    const int n = s->n, R = n + 2;
    const size_t plane = plane_of(n);
    const double r = s->config.r, c6 = 1.0 - 6.0 * r;
    for (int step = 0; step < steps; step++) {
        exchange_halos(s);
        /* every interior plane of every slab, numbered globally */
#pragma omp parallel for schedule(static)
        for (int z = 0; z < n; z++) {
            const int d = slab_of(s, z);
            const size_t base = (size_t)(z - s->z0[d] + 1) * plane;
            for (int y = 1; y <= n; y++)
                update_row(s->v[d], s->u[d], base + (size_t)y * R + 1, n, (size_t)R, plane, c6, r,
                           s->stream);
#if defined(__AVX512F__)
            /* this thread's streamed lines out before the barrier and the next step */
            if (s->stream) _mm_sfence();
#endif
        }
        for (int d = 0; d < s->domains; d++) {
            double *t = s->u[d];
            s->u[d] = s->v[d], s->v[d] = t;
        }
        s->steps++;
    }
    return GPC_OK;
}

int64_t gpc_stencil_steps(const gpc_stencil *s) {
    return s->steps;
}

double gpc_stencil_at(const gpc_stencil *s, int x, int y, int z) {
    const int d = slab_of(s, z);
    return s->u[d][(size_t)(z - s->z0[d] + 1) * plane_of(s->n) + (size_t)(y + 1) * (s->n + 2) +
                   (size_t)(x + 1)];
}

/* max |u - scale u0| / max |u0| over the grid. */
static double error_against(const gpc_stencil *s, double scale) {
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
    return big > 0 ? err / big : err;
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
