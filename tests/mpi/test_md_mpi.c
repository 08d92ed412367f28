/*
 * test_md_mpi.c: `gpc md` split across processes (gpc_md_create_split), run
 * by CTest under `mpirun -np 2` and `-np 4`. Every rank steps its slab of
 * the crystal; rank 0 also runs the whole crystal in one process (md.c's
 * half list), the reference.
 *
 * Checked, for the rebuild on displacement and every 10 steps: each thermo
 * row (every 10 steps of 100) equals the single process's within 1e-9 per
 * atom (energies; 1e-8 for the pressure), every atom's position (gathered by
 * id) within 1e-9, and the neighbour-list builds and listed pairs are the
 * same. The two differ only in the order of the force sums: over 100 steps
 * at temperature 3 the rows of 1 and 4 processes differed by about 1e-14
 * per atom (gpc md --json), while a lost ghost or a dropped migrant moves
 * them by 1e-3 or more.
 * The energy of the whole run (drift of TotEng) agrees within 1e-9 per atom.
 * Also: slabs narrower than cutoff + skin are refused on every rank, before
 * anything is sent; so are float32 forces on GPUs, and a GPU that does not
 * exist (on every rank, none left waiting for the others).
 *
 * With the argument "cuda" every rank steps its slab on cuda:0 (the code
 * path of one GPU a process, on one GPU); the reference stays the CPU's one
 * process. With "nccl" every rank steps its slab on its own GPU (its local
 * rank) and the ghosts go GPU to GPU over NCCL: the same checks. Exits 77
 * outside mpirun, in a build without MPI, for "cuda" where no process sees
 * a GPU, and for "nccl" unless every rank has a GPU of its own and NCCL
 * loads.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/dist.h"
#include "gpc/md.h"

static int rank, failures;
static gpc_device split_device; /* where the split run steps */
static gpc_dist *peers;         /* "nccl": the split run's GPU halos */

#include "mpi_check.h"

static void compare_run(int world, int rebuild_every) {
    gpc_md_config c;
    gpc_md_defaults(&c);
    c.cells = 8, c.rebuild_every = rebuild_every; /* 2,048 atoms, a box 13.4 wide */
    gpc_md *split = NULL, *whole = NULL;
    gpc_md_config on = c;
    on.device = split_device;
    on.gpu_dist = peers;
    MUST(gpc_md_create_split(&split, &on, rank, world));
    CHECK(gpc_md_processes(split) == world, "processes %d, not %d", gpc_md_processes(split), world);
    if (split_device.type == GPC_DEVICE_CUDA)
        CHECK(strstr(gpc_md_where(split), "(cuda:") && strstr(gpc_md_where(split), "processes") &&
                  strstr(gpc_md_where(split), peers ? "over NCCL" : "through the host"),
              "a split run on a GPU says it runs on %s", gpc_md_where(split));
    if (rank == 0) MUST(gpc_md_create(&whole, &c));
    const int64_t n = gpc_md_atoms(split);
    double *xs = malloc((size_t)(3 * n) * sizeof *xs), *xw = malloc((size_t)(3 * n) * sizeof *xw);
    double first_split = 0, first_whole = 0;
    for (int row = 0; row <= 10; row++) {
        if (row) {
            MUST(gpc_md_run(split, 10));
            if (whole) MUST(gpc_md_run(whole, 10));
        }
        gpc_md_thermo a, b;
        gpc_md_get_thermo(split, &a);
        if (row == 0) first_split = a.total;
        if (!whole) continue;
        gpc_md_get_thermo(whole, &b);
        if (row == 0) first_whole = b.total;
        CHECK(a.step == b.step && fabs(a.temperature - b.temperature) < 1e-9 &&
                  fabs(a.potential - b.potential) < 1e-9 && fabs(a.total - b.total) < 1e-9 &&
                  fabs(a.pressure - b.pressure) < 1e-8,
              "rebuild every %d, step %lld: split %.12f %.12f %.12f %.12f, one process %.12f "
              "%.12f %.12f %.12f",
              rebuild_every, (long long)a.step, a.temperature, a.potential, a.total, a.pressure,
              b.temperature, b.potential, b.total, b.pressure);
    }
    MUST(gpc_md_gather_positions(split, xs));
    if (whole) {
        MUST(gpc_md_gather_positions(whole, xw));
        double box = gpc_md_box(whole), worst = 0;
        for (int64_t k = 0; k < 3 * n; k++) {
            double d = xs[k] - xw[k];
            d -= box * nearbyint(d / box);
            worst = fmax(worst, fabs(d));
        }
        CHECK(worst < 1e-9, "rebuild every %d: positions differ by up to %.3g", rebuild_every,
              worst);
        gpc_md_thermo a, b;
        gpc_md_get_thermo(split, &a);
        gpc_md_get_thermo(whole, &b);
        CHECK(fabs((a.total - first_split) - (b.total - first_whole)) < 1e-9,
              "energy drift %.3g split, %.3g in one process", a.total - first_split,
              b.total - first_whole);
        CHECK(gpc_md_neighbor_builds(split) == gpc_md_neighbor_builds(whole),
              "builds %lld split, %lld in one process", (long long)gpc_md_neighbor_builds(split),
              (long long)gpc_md_neighbor_builds(whole));
        CHECK(gpc_md_pairs(split) == gpc_md_pairs(whole), "pairs %lld split, %lld in one process",
              (long long)gpc_md_pairs(split), (long long)gpc_md_pairs(whole));
        CHECK(gpc_md_neighbor_builds(whole) > 3, "only %lld builds: the test moves too little",
              (long long)gpc_md_neighbor_builds(whole));
    }
    free(xs), free(xw);
    gpc_md_free(split);
    gpc_md_free(whole);
}

int main(int argc, char **argv) {
    const int nccl = argc > 1 && strcmp(argv[1], "nccl") == 0;
    const int cuda = nccl || (argc > 1 && strcmp(argv[1], "cuda") == 0);
    gpc_dist_env env;
    if (gpc_dist_env_from_process(&env) != GPC_OK || env.world_size < 2 || !gpc_dist_have_mpi()) {
        fprintf(stderr, "skipped: run under mpirun -np N (N >= 2) in a build with MPI\n");
        return 77;
    }
    gpc_dist *d;
    rank = env.rank;
    MUST(gpc_dist_create(&d, &env, gpc_cpu(), "mpi"));
    split_device = gpc_cpu();
    if (cuda) {
        if (!every_rank_has_a_gpu(d)) {
            if (rank == 0) printf("no GPU: skipped\n");
            gpc_dist_destroy(d);
            return 77;
        }
        split_device = (gpc_device){GPC_DEVICE_CUDA, 0};
    }
    if (nccl) { /* a GPU a rank, and NCCL on every one */
        if (!every_rank_has_its_own_gpu_and_nccl(d, env.local_rank)) {
            if (rank == 0) printf("not a GPU a process with NCCL: skipped\n");
            gpc_dist_destroy(d);
            return 77;
        }
        split_device.index = env.local_rank;
        MUST(gpc_dist_create(&peers, &env, split_device, "nccl"));
    }
    compare_run(env.world_size, 0);
    compare_run(env.world_size, 10);
    gpc_dist_destroy(peers);

    /* 5 cells: a box 8.4 wide, so slabs of 4.2 (2 processes) pass and 2.8
     * or less (3 and more) are narrower than cutoff + skin, 2.8 */
    gpc_md_config c;
    gpc_md_defaults(&c);
    c.cells = 5;
    gpc_md *md = NULL;
    gpc_status st = gpc_md_create_split(&md, &c, rank, 3 * env.world_size);
    CHECK(st == GPC_ERR_INVALID_ARG && strstr(gpc_last_error(), "narrower than cutoff + skin") &&
              strstr(gpc_last_error(), "use at most 2 processes"),
          "slabs too narrow: %s", gpc_last_error());
    CHECK(md == NULL, "a refused run left a handle");
    c.cells = 8;
    c.device = (gpc_device){GPC_DEVICE_CUDA, 0};
    c.gpu_forces_f32 = 1;
    st = gpc_md_create_split(&md, &c, rank, env.world_size);
    CHECK(st == GPC_ERR_UNSUPPORTED && strstr(gpc_last_error(), "float64") && md == NULL,
          "a split run on GPUs with float32 forces: %s", gpc_last_error());
    /* no GPU 99 anywhere: every rank stops, the message says why */
    c.gpu_forces_f32 = 0;
    c.device.index = 99;
    st = gpc_md_create_split(&md, &c, rank, env.world_size);
    CHECK(st != GPC_OK && md == NULL &&
              (strstr(gpc_last_error(), "GPU") || strstr(gpc_last_error(), "CUDA")),
          "a split run on a GPU that is not there: %d %s", (int)st, gpc_last_error());
    /* NCCL halos on the CPU, in one process, or over collectives not NCCL's */
    gpc_md_defaults(&c);
    c.cells = 8, c.gpu_dist = d;
    st = gpc_md_create_split(&md, &c, rank, env.world_size);
    CHECK(st == GPC_ERR_INVALID_ARG && strstr(gpc_last_error(), "halos over NCCL are for GPUs"),
          "NCCL halos on the CPU: %s", gpc_last_error());
    st = gpc_md_create(&md, &c);
    CHECK(st == GPC_ERR_INVALID_ARG && strstr(gpc_last_error(), "several processes"),
          "NCCL halos in one process: %s", gpc_last_error());
    c.device = (gpc_device){GPC_DEVICE_CUDA, 0};
    st = gpc_md_create_split(&md, &c, rank, env.world_size);
    CHECK(st == GPC_ERR_INVALID_ARG && strstr(gpc_last_error(), "must be nccl over the same"),
          "GPU halos over the mpi collectives: %s", gpc_last_error());

    double bad = failures;
    MUST(d->ops->all_reduce_host(d, &bad, 1));
    if (rank == 0)
        printf("%s: %g failures over %d processes\n", bad ? "FAIL" : "ok", bad, env.world_size);
    gpc_dist_destroy(d);
    return bad ? 1 : 0;
}
