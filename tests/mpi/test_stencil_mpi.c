/*
 * test_stencil_mpi.c: the stencil split across processes, run by CTest
 * under `mpirun -np 2` and `-np 4`. Every rank solves the whole grid alone
 * on the CPU (the one-process run) and its band of the grid together with
 * the others; the band must hold the same bits as the alone run's planes,
 * and the collective figures (checksum, errors, a point read by every rank)
 * must equal the alone run's, for one and two slabs a process, bands of one
 * plane, and a grid that does not divide evenly.
 *
 * With the argument "cuda", the split runs on cuda:0 for every rank (the
 * halos then go through host buffers and MPI, the path several GPUs take):
 * f64 must still give the CPU's bits, and f32 the bits of one process on
 * the GPU. With "nccl", each rank runs on its own GPU (its local rank) and
 * the halos go GPU to GPU over NCCL: the same checks. Exits 77 outside
 * mpirun, in a build without MPI, for "cuda" without a GPU, and for "nccl"
 * unless every rank has a GPU of its own and NCCL loads.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/dist.h"
#include "gpc/stencil.h"

static int rank, failures;
static gpc_dist *peers; /* "nccl": the split runs' GPU halos */

#include "mpi_check.h"

typedef struct {
    int n, domains, steps, mode[3];
    double r;
} run_spec;

static gpc_stencil *make(const run_spec *r, gpc_dist *dist, gpc_device device, int fp32) {
    gpc_stencil_config c;
    gpc_stencil_defaults(&c);
    c.n = r->n, c.domains = r->domains, c.r = r->r;
    memcpy(c.mode, r->mode, sizeof c.mode);
    c.dist = dist, c.device = device, c.fp32 = fp32;
    if (dist) c.gpu_dist = peers;
    gpc_stencil *s = NULL;
    MUST(gpc_stencil_create(&s, &c));
    MUST(gpc_stencil_run(s, r->steps));
    return s;
}

/* split (this rank's band) against alone (the whole grid): every plane of
 * the band bit for bit, and the collective figures. exact: the errors too
 * (both on the CPU, or both on the GPU). */
static void compare(const char *what, const run_spec *r, gpc_stencil *split, gpc_stencil *alone,
                    int exact_errors, double decay_tol) {
    int first, count;
    gpc_stencil_planes(split, &first, &count);
    CHECK(count >= r->domains, "%s: %d planes for %d domains", what, count, r->domains);
    const size_t points = (size_t)r->n * r->n;
    double *a = malloc(points * sizeof *a), *b = malloc(points * sizeof *b);
    for (int z = first; z < first + count; z++) {
        MUST(gpc_stencil_plane(split, z, a));
        MUST(gpc_stencil_plane(alone, z, b));
        if (memcmp(a, b, points * sizeof *a) != 0) {
            size_t i = 0;
            while (a[i] == b[i])
                i++;
            CHECK(0, "%s: plane %d differs first at (%zu, %zu): %.17g split, %.17g alone", what, z,
                  i % r->n, i / r->n, a[i], b[i]);
            break;
        }
    }
    free(a), free(b);
    /* collectives: every rank calls them, in the same order */
    unsigned long long cs = gpc_stencil_checksum(split), ca = gpc_stencil_checksum(alone);
    CHECK(cs == ca, "%s: checksum %016llx split, %016llx alone", what, cs, ca);
    double es = gpc_stencil_error(split), ea = gpc_stencil_error(alone);
    double hs = gpc_stencil_heat_error(split), ha = gpc_stencil_heat_error(alone);
    if (exact_errors) {
        CHECK(es == ea && hs == ha, "%s: errors %.17g %.17g split, %.17g %.17g alone", what, es, hs,
              ea, ha);
    } else { /* the same field; |u - s u0| rounded by another compiler, by an ulp */
        CHECK(fabs(es - ea) <= 1e-15 && fabs(hs - ha) <= 1e-15,
              "%s: errors %.17g %.17g split, %.17g %.17g alone", what, es, hs, ea, ha);
    }
    CHECK(ea < decay_tol, "%s: error %.3g against the exact decay, over %.3g", what, ea, decay_tol);
    for (int k = 0; k < 3; k++) {
        int z = (k * (r->n - 1)) / 2; /* the first, middle and last planes */
        double vs = gpc_stencil_at_all(split, k, r->n - 1 - k, z);
        double va = gpc_stencil_at(alone, k, r->n - 1 - k, z);
        CHECK(memcmp(&vs, &va, sizeof vs) == 0, "%s: point at plane %d: %.17g split, %.17g alone",
              what, z, vs, va);
    }
}

int main(int argc, char **argv) {
    const int nccl = argc > 1 && strcmp(argv[1], "nccl") == 0;
    const int cuda = nccl || (argc > 1 && strcmp(argv[1], "cuda") == 0);
    gpc_dist_env env;
    MUST(gpc_dist_env_from_process(&env));
    rank = env.rank;
    if (env.world_size < 2 || !gpc_dist_have_mpi()) {
        printf("not under mpirun with 2 or more processes, or no MPI: skipped\n");
        return 77;
    }
    gpc_dist *dist = NULL;
    MUST(gpc_dist_create(&dist, &env, gpc_cpu(), "mpi"));
    const int world = dist->world_size;
    gpc_device device = gpc_cpu();
    if (cuda) {
        if (!every_rank_has_a_gpu(dist)) {
            printf("no GPU: skipped\n");
            gpc_dist_destroy(dist);
            return 77;
        }
        device.type = GPC_DEVICE_CUDA, device.index = 0;
    }
    if (nccl) { /* a GPU a rank, and NCCL on every one */
        if (!every_rank_has_its_own_gpu_and_nccl(dist, env.local_rank)) {
            printf("not a GPU a process with NCCL: skipped\n");
            gpc_dist_destroy(dist);
            return 77;
        }
        device.index = env.local_rank;
        MUST(gpc_dist_create(&peers, &env, device, "nccl"));
    }
    const run_spec runs[] = {
        {23, 1, 17, {2, 3, 1}, 1.0 / 6}, /* 23 planes do not divide by 2 or 4 */
        {30, 2, 12, {1, 4, 3}, 0.1},     /* two slabs a process */
        {world, 1, 9, {1, 1, 1}, 0.15},  /* one plane a process */
        {45, 3, 11, {3, 2, 5}, 0.125},   /* rows that are not whole tiles on a GPU */
    };
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        const run_spec *r = &runs[k];
        char what[96];
        snprintf(what, sizeof what, "n %d, %d domains, %d processes%s", r->n, r->domains, world,
                 nccl   ? ", nccl f64"
                 : cuda ? ", cuda f64"
                        : "");
        gpc_stencil *alone = make(r, NULL, gpc_cpu(), 0);
        gpc_stencil *split = make(r, dist, device, 0);
        compare(what, r, split, alone, !cuda, 1e-14 * r->steps);
        gpc_stencil_free(split);
        gpc_stencil_free(alone);
        if (cuda) { /* f32: the split GPU run against one process on the GPU */
            snprintf(what, sizeof what, "n %d, %d domains, %d processes, %s f32", r->n, r->domains,
                     world, nccl ? "nccl" : "cuda");
            alone = make(r, NULL, device, 1);
            split = make(r, dist, device, 1);
            /* f32's rounding: test_cuda_stencil.c says why 5e-7 a step */
            compare(what, r, split, alone, 1, 5e-7 * r->steps + 1e-6);
            gpc_stencil_free(split);
            gpc_stencil_free(alone);
        }
    }
    /* a grid with fewer planes than processes is refused, on every rank */
    gpc_stencil_config c;
    gpc_stencil_defaults(&c);
    c.n = world - 1, c.dist = dist, c.device = device;
    gpc_stencil *s = NULL;
    char want[96];
    snprintf(want, sizeof want, "%d processes x 1 domains for %d planes", world, world - 1);
    gpc_status st = gpc_stencil_create(&s, &c);
    CHECK(st == GPC_ERR_INVALID_ARG && strstr(gpc_last_error(), want), "n %d on %d processes: %s",
          world - 1, world, gpc_last_error());
    /* NCCL halos on the CPU, or over collectives that are not NCCL's, are refused */
    gpc_stencil_defaults(&c);
    c.dist = dist, c.gpu_dist = dist;
    st = gpc_stencil_create(&s, &c);
    CHECK(st == GPC_ERR_INVALID_ARG &&
              strstr(gpc_last_error(), "leave out --halos nccl on the CPU"),
          "NCCL halos on the CPU: %s", gpc_last_error());
    if (cuda) {
        c.device = device;
        st = gpc_stencil_create(&s, &c);
        CHECK(st == GPC_ERR_INVALID_ARG && strstr(gpc_last_error(), "must be nccl over the same"),
              "GPU halos over the mpi collectives: %s", gpc_last_error());
    }
    gpc_dist_destroy(peers);

    double bad = failures;
    dist->ops->all_reduce_host(dist, &bad, 1);
    if (rank == 0)
        printf("%s: %g failures over %d processes\n", bad > 0 ? "FAIL" : "ok", bad, world);
    gpc_dist_destroy(dist);
    return bad > 0 ? 1 : 0;
}
