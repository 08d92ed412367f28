/*
 * cmd_md.c: `gpc md`, Lennard-Jones molecular dynamics (gpc/md.h) on the CPU
 * or one GPU, or split across the processes of mpirun (or gpc launch).
 * Prints a thermodynamic table in LAMMPS's columns (per-atom energies), then
 * the run's rate in atom-steps a second; --json writes the same figures.
 * In a split run every process steps and rank 0 alone prints and writes.
 */
#include "cli/cli.h"
#include "cli/cli_dist.h"
#include "gpc/dist.h"
#include "gpc/md.h"
#include "gpc/settings.h"

#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    gpc_md_thermo *rows;
    int count, capacity;
} thermo_log;

static int printing = 1; /* rank 0 of a split run, or the only process */

static int log_row(thermo_log *log, const gpc_md *md) {
    if (log->count == log->capacity) {
        int capacity = log->capacity ? 2 * log->capacity : 16;
        gpc_md_thermo *grown = realloc(log->rows, (size_t)capacity * sizeof *grown);
        if (!grown) return 0;
        log->rows = grown, log->capacity = capacity;
    }
    gpc_md_get_thermo(md, &log->rows[log->count++]);
    const gpc_md_thermo *t = &log->rows[log->count - 1];
    if (!printing) return 1;
    printf("%8lld %12.7f %12.7f %12.7f %12.7f\n", (long long)t->step, t->temperature, t->potential,
           t->total, t->pressure);
    fflush(stdout);
    return 1;
}

/* One frame of the trajectory in extended XYZ (OVITO, ASE and VMD read it):
 * the atoms in the order they were created, positions wrapped into the box.
 * Collective in a split run (the positions are gathered); f is rank 0's. */
static gpc_status write_frame(FILE *f, const char *path, gpc_md *md, double *scratch, double dt) {
    const int64_t n = gpc_md_atoms(md);
    const double box = gpc_md_box(md);
    GPC_TRY(gpc_md_gather_positions(md, scratch));
    if (!f) return GPC_OK;
    gpc_md_thermo t;
    gpc_md_get_thermo(md, &t);
    fprintf(f,
            "%lld\nLattice=\"%.10g 0 0 0 %.10g 0 0 0 %.10g\" Properties=species:S:1:pos:R:3 "
            "pbc=\"T T T\" step=%lld time=%.10g\n",
            (long long)n, box, box, box, (long long)t.step, (double)t.step * dt);
    for (int64_t i = 0; i < n; i++)
        fprintf(f, "Ar %.8f %.8f %.8f\n", scratch[3 * i], scratch[3 * i + 1], scratch[3 * i + 2]);
    if (ferror(f)) return gpc_error(GPC_ERR_IO, "cannot write the trajectory to %s", path);
    return GPC_OK;
}

static gpc_status write_json(const char *path, const gpc_md_config *c, gpc_md *md,
                             const thermo_log *log, int steps, double seconds) {
    FILE *f = fopen(path, "w");
    if (!f) return gpc_error(GPC_ERR_IO, "cannot write %s: check the directory exists", path);
    fprintf(f,
            "{\"atoms\": %lld, \"cells\": %d, \"density\": %.17g, \"box\": %.17g, "
            "\"temperature\": %.17g, \"cutoff\": %.17g, \"skin\": %.17g, \"dt\": %.17g, "
            "\"seed\": %llu, \"rebuild_every\": %d, \"device\": \"%s\", \"forces\": \"%s\", "
            "\"gpu_lanes\": %d, \"gpu_build\": \"%s\", \"gpu_step\": \"%s\", "
            "\"gpu_unroll\": %d, \"gpu_list\": \"%s\", \"processes\": %d, "
            "\"threads\": %d, \"steps\": %d, "
            "\"seconds\": %.9g, \"atom_steps_per_s\": %.9g, \"neighbor_builds\": %lld, "
            "\"dangerous_builds\": %lld, \"pairs\": %lld,\n",
            (long long)gpc_md_atoms(md), c->cells, c->density, gpc_md_box(md), c->temperature,
            c->cutoff, c->skin, c->dt, (unsigned long long)c->seed, c->rebuild_every,
            gpc_device_name(c->device),
            c->device.type == GPC_DEVICE_CUDA && c->gpu_forces_f32 ? "f32" : "f64",
            c->gpu_lanes ? c->gpu_lanes : 4, c->gpu_build_f64 ? "f64" : "f32",
            c->gpu_step_fused ? "fused" : "split", c->gpu_unroll ? c->gpu_unroll : 1,
            c->gpu_list_per_atom ? "atoms" : "cells", gpc_md_processes(md), omp_get_max_threads(),
            steps, seconds, seconds > 0 ? (double)gpc_md_atoms(md) * steps / seconds : 0.0,
            (long long)gpc_md_neighbor_builds(md), (long long)gpc_md_dangerous_builds(md),
            (long long)gpc_md_pairs(md));
    double ms[GPC_MD_PHASES];
    if (gpc_md_gpu_phase_ms(md, ms)) {
        fprintf(f, " \"gpu_ms\": {");
        for (int p = 0; p < GPC_MD_PHASES; p++)
            fprintf(f, "%s\"%s\": %.9g", p ? ", " : "", gpc_md_phase_name(p), ms[p]);
        fprintf(f, "},\n");
    }
    fprintf(f, " \"thermo\": [");
    for (int i = 0; i < log->count; i++) {
        const gpc_md_thermo *t = &log->rows[i];
        fprintf(f,
                "%s\n  {\"step\": %lld, \"temperature\": %.17g, \"potential\": %.17g, "
                "\"kinetic\": %.17g, \"total\": %.17g, \"pressure\": %.17g}",
                i ? "," : "", (long long)t->step, t->temperature, t->potential, t->kinetic,
                t->total, t->pressure);
    }
    fprintf(f, "]}\n");
    if (fclose(f) != 0) return gpc_error(GPC_ERR_IO, "cannot finish writing %s", path);
    return GPC_OK;
}

int cmd_md(int argc, char **argv) {
    gpc_md_config c;
    gpc_md_defaults(&c);
    int steps = 100, thermo = -1;
    int64_t seed = (int64_t)c.seed; /* signed, so a negative value is refused, not wrapped */
    const char *json = NULL, *dump = NULL, *device = "cpu", *forces = "f64", *build = "f32";
    const char *halos = "auto";
    const char *gpu_step = c.gpu_step_fused ? "fused" : "split";
    const char *gpu_list = c.gpu_list_per_atom ? "atoms" : "cells";
    int dump_every = 0;
    const cli_option options[] = {
        {"cells", CLI_INT, &c.cells, "N",
         "fcc unit cells along each side: 4 N^3 atoms (default 20)"},
        {"density", CLI_FLOAT, &c.density, "RHO", "atoms per unit volume (default 0.8442)"},
        {"temperature", CLI_FLOAT, &c.temperature, "T", "initial temperature (default 3.0)"},
        {"cutoff", CLI_FLOAT, &c.cutoff, "RC", "pair cutoff, unshifted (default 2.5)"},
        {"skin", CLI_FLOAT, &c.skin, "S", "neighbour-list margin beyond the cutoff (default 0.3)"},
        {"dt", CLI_FLOAT, &c.dt, "DT", "time step (default 0.005)"},
        {"device", CLI_STRING, &device, "DEV",
         "cpu or cuda[:N]: the whole step on that GPU (default cpu)"},
        {"forces", CLI_STRING, &forces, "P",
         "on a GPU, pair forces in f64 (default) or f32 (for GPUs slow in float64)"},
        {"gpu-lanes", CLI_INT, &c.gpu_lanes, "L",
         "on a GPU, threads per atom in the force kernel: 1, 2, 4 or 8 (default 4)"},
        {"gpu-build", CLI_STRING, &build, "P",
         "on a GPU, the list build tests candidates in f32, in f64 only near the reach (f32, "
         "default), or each in f64"},
        {"gpu-step", CLI_STRING, &gpu_step, "S",
         "on a GPU, split: an integration kernel, then the forces; fused: the force kernel ends "
         "each step and begins the next (default fused, or GPC_MD_STEP)"},
        {"gpu-unroll", CLI_INT, &c.gpu_unroll, "U",
         "on a GPU, partners (in the forces) and candidates (in the list build) whose loads issue "
         "together: 1, 2, 4 or 8 (default 4, or GPC_MD_UNROLL)"},
        {"gpu-list", CLI_STRING, &gpu_list, "B",
         "on a GPU, the neighbour list built by a warp per cell (cells) or a thread per atom "
         "(atoms); the same rows (default cells, or GPC_MD_LIST)"},
        {"halos", CLI_STRING, &halos, "H",
         "GPUs under mpirun: ghosts over nccl (GPU to GPU), host (over MPI) or auto (default: "
         "nccl when each process has its own GPU and NCCL loads)"},
        {"steps", CLI_INT, &steps, "N", "time steps to run (default 100)"},
        {"seed", CLI_INT64, &seed, "S", "seed of the initial velocities (default 87287)"},
        {"rebuild-every", CLI_INT, &c.rebuild_every, "N",
         "rebuild the neighbour list every N steps; 0 when an atom moved over half the skin "
         "(default 0)"},
        {"thermo", CLI_INT, &thermo, "N",
         "print the thermodynamic row every N steps (default: 10 rows a run)"},
        {"json", CLI_STRING, &json, "FILE", "also write the run's figures as JSON"},
        {"dump", CLI_STRING, &dump, "FILE",
         "write the trajectory to FILE (extended XYZ, atoms in creation order)"},
        {"dump-every", CLI_INT, &dump_every, "N",
         "steps between trajectory frames (default: the --thermo interval)"},
        {0},
    };
    const cli_spec spec = {
        "md",
        "md [--cells N] [--density RHO] [--temperature T] [--cutoff RC] [--skin S] [--dt DT] "
        "[--device cpu|cuda[:N]] [--forces f64|f32] [--gpu-lanes L] [--gpu-build f32|f64] "
        "[--gpu-step split|fused] [--gpu-unroll U] [--gpu-list cells|atoms] "
        "[--halos auto|nccl|host] [--steps N] [--seed S] [--rebuild-every N] "
        "[--thermo N] [--json "
        "FILE] [--dump FILE "
        "[--dump-every N]]",
        "Lennard-Jones molecular dynamics on the CPU (OpenMP threads: OMP_NUM_THREADS) or a GPU "
        "(--device cuda): atoms on an fcc lattice in a periodic box, constant energy, reduced "
        "units. The defaults are "
        "LAMMPS's in.lj melt benchmark (32,000 atoms); the table has LAMMPS's thermo columns "
        "(per-atom energies). Ctrl-C or SIGTERM stops the run cleanly with its summary.",
        options,
        0,
        NULL,
        NULL};
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    if (cli_halos_check("md", halos)) return CLI_EXIT_USAGE;
    /* the settings behind the GPU flags' defaults: a value the table does
     * not list is refused, not read as the default */
    static const char *const choice_settings[] = {"GPC_MD_STEP", "GPC_MD_LIST"};
    for (size_t k = 0; k < sizeof choice_settings / sizeof choice_settings[0]; k++) {
        const char *given = gpc_setting_given(choice_settings[k]);
        if (given && !gpc_setting_is_choice(choice_settings[k], given))
            return cli_usage_error("md", "%s=%s: use one of %s (or unset it)", choice_settings[k],
                                   given, gpc_settings_find(choice_settings[k])->choices);
    }
    if (steps < 0) return cli_usage_error("md", "--steps %d is negative", steps);
    if (thermo == 0 || thermo < -1)
        return cli_usage_error("md", "--thermo %d is not 1 or more", thermo);
    if (seed < 0) return cli_usage_error("md", "--seed %lld is negative", (long long)seed);
    c.seed = (uint64_t)seed;
    if (dump_every < 0 || (dump_every > 0 && !dump))
        return cli_usage_error("md", "--dump-every %d needs --dump FILE and 1 or more steps",
                               dump_every);
    if (thermo < 0) thermo = steps >= 10 ? steps / 10 : 1;
    if (dump && !dump_every) dump_every = thermo;
    if (strcmp(forces, "f64") != 0 && strcmp(forces, "f32") != 0)
        return cli_usage_error("md", "--forces %s: use f64 or f32", forces);
    c.gpu_forces_f32 = strcmp(forces, "f32") == 0;
    if (c.gpu_lanes != 1 && c.gpu_lanes != 2 && c.gpu_lanes != 4 && c.gpu_lanes != 8 &&
        c.gpu_lanes != 0)
        return cli_usage_error("md", "--gpu-lanes %d: use 1, 2, 4 or 8", c.gpu_lanes);
    if (strcmp(build, "f64") != 0 && strcmp(build, "f32") != 0)
        return cli_usage_error("md", "--gpu-build %s: use f32 or f64", build);
    c.gpu_build_f64 = strcmp(build, "f64") == 0;
    if (strcmp(gpu_step, "split") != 0 && strcmp(gpu_step, "fused") != 0)
        return cli_usage_error("md", "--gpu-step %s: use split or fused", gpu_step);
    c.gpu_step_fused = strcmp(gpu_step, "fused") == 0;
    if (strcmp(gpu_list, "cells") != 0 && strcmp(gpu_list, "atoms") != 0)
        return cli_usage_error("md", "--gpu-list %s: use cells or atoms", gpu_list);
    c.gpu_list_per_atom = strcmp(gpu_list, "atoms") == 0;
    if (c.gpu_unroll != 1 && c.gpu_unroll != 2 && c.gpu_unroll != 4 && c.gpu_unroll != 8)
        return cli_usage_error("md", "--gpu-unroll %d: use 1, 2, 4 or 8", c.gpu_unroll);
    /* the syntax only: whether the GPU exists, and has room, gpc_md_create
     * says before it allocates anything */
    if (strcmp(device, "cuda") == 0) {
        c.device = (gpc_device){GPC_DEVICE_CUDA, 0};
    } else if (strncmp(device, "cuda:", 5) == 0) {
        char *end;
        long index = strtol(device + 5, &end, 10);
        if (*end || end == device + 5 || index < 0 || index > 1024)
            return cli_usage_error("md", "--device %s: write cuda:N with N a GPU number", device);
        c.device = (gpc_device){GPC_DEVICE_CUDA, (int)index};
    } else if (strcmp(device, "cpu") != 0) {
        return cli_usage_error("md", "--device %s: use cpu or cuda[:N]", device);
    }

    /* several processes (mpirun, srun, gpc launch): each owns a slab */
    gpc_dist_env env;
    gpc_status st = gpc_dist_env_from_process(&env);
    if (st) return cli_fail("md", st);
    gpc_dist *dist = NULL;
    if (env.world_size > 1) {
        int rc = cli_dist_mpi("md", &env, &dist);
        if (rc) return rc;
        /* one GPU a process unless the command named one */
        if (c.device.type == GPC_DEVICE_CUDA && !strchr(device, ':'))
            c.device.index = env.local_rank;
        printing = env.rank == 0;
    }
    gpc_dist *peers = NULL;
    {
        int rc =
            cli_gpu_halos("md", &env, dist, c.device, strchr(device, ':') != NULL, halos, &peers);
        if (rc) {
            gpc_dist_destroy(dist);
            return rc;
        }
        c.gpu_dist = peers;
    }
    gpc_md *md = NULL;
    double t0 = gpc_time_seconds();
    st = gpc_md_create_split(&md, &c, env.rank, env.world_size > 1 ? env.world_size : 1);
    if (st) {
        int rc = cli_fail("md", st);
        gpc_dist_destroy(peers), gpc_dist_destroy(dist);
        return rc;
    }
    double setup = gpc_time_seconds() - t0;
    if (printing)
        printf(
            "gpc md: %lld atoms (%d^3 fcc cells, density %g, box %.4f), cutoff %g, skin %g, dt %g, "
            "%s; set up in %.2f s\n",
            (long long)gpc_md_atoms(md), c.cells, c.density, gpc_md_box(md), c.cutoff, c.skin, c.dt,
            gpc_md_where(md), setup);
    if (printing) printf("%8s %12s %12s %12s %12s\n", "Step", "Temp", "E_pair", "TotEng", "Press");
    FILE *trajectory = NULL;
    double *scratch = NULL;
    if (dump) {
        if (printing) trajectory = fopen(dump, "w");
        scratch = malloc((size_t)(3 * gpc_md_atoms(md)) * sizeof *scratch);
        if ((printing && !trajectory) || !scratch) {
            if (trajectory) fclose(trajectory);
            free(scratch);
            gpc_md_free(md);
            gpc_dist_destroy(peers), gpc_dist_destroy(dist);
            return cli_fail("md", gpc_error(GPC_ERR_IO,
                                            "cannot write %s: check the directory "
                                            "exists",
                                            dump));
        }
        st = write_frame(trajectory, dump, md, scratch, c.dt);
    }
    thermo_log log = {0};
    int ok = log_row(&log, md);
    double seconds = 0;
    cli_catch_stop(NULL); /* Ctrl-C, SIGTERM: stop after the current steps, with the summary */
    int done = 0, stopped = 0;
    for (; ok && st == GPC_OK && done < steps;) {
        /* the processes of a split run stop at the same step: any one's
         * signal stops them all */
        double stop = cli_stop_signal() != 0;
        if (dist && dist->ops->all_reduce_host(dist, &stop, 1) != GPC_OK) stop = 1;
        if (stop > 0) {
            stopped = 1;
            break;
        }
        /* up to the next thermo row, frame or the end, at most 20 steps so a
         * stop request is seen soon */
        int chunk = thermo - done % thermo;
        if (chunk > 20) chunk = 20;
        if (dump && dump_every - done % dump_every < chunk) chunk = dump_every - done % dump_every;
        if (steps - done < chunk) chunk = steps - done;
        double start = gpc_time_seconds();
        st = gpc_md_run(md, chunk);
        done += chunk;
        if (st == GPC_OK && (done % thermo == 0 || done == steps)) ok = log_row(&log, md);
        /* a row is part of the steps timed: on a GPU its pair energy and
         * virial are summed when it is asked for */
        seconds += gpc_time_seconds() - start;
        if (st == GPC_OK && dump && done % dump_every == 0)
            st = write_frame(trajectory, dump, md, scratch, c.dt);
    }
    if (stopped && st == GPC_OK && ok) {
        if (done % thermo) ok = log_row(&log, md); /* the last step reached */
        if (printing)
            fprintf(stderr, "gpc md: stopped by %s at step %d of %d%s\n", cli_stop_name(), done,
                    steps, dump ? "; the trajectory holds the frames written so far" : "");
        steps = done; /* the summary is of the steps that ran */
    }
    if (trajectory && fclose(trajectory) != 0 && st == GPC_OK)
        st = gpc_error(GPC_ERR_IO, "cannot finish writing %s", dump);
    free(scratch);
    if (st == GPC_OK && !ok) st = gpc_error(GPC_ERR_NOMEM, "out of host memory for the thermo log");
    if (st == GPC_OK && log.count > 0 && printing) {
        const gpc_md_thermo *first = &log.rows[0], *last = &log.rows[log.count - 1];
        printf("gpc md: %d steps in %.3f s: %.3g million atom-steps/s, %lld neighbour-list "
               "builds, %.1f listed pairs an atom; energy drift %.3g per atom\n",
               steps, seconds, seconds > 0 ? (double)gpc_md_atoms(md) * steps / seconds / 1e6 : 0.0,
               (long long)gpc_md_neighbor_builds(md),
               (double)gpc_md_pairs(md) / (double)gpc_md_atoms(md), last->total - first->total);
        double ms[GPC_MD_PHASES], total = 0;
        if (gpc_md_gpu_phase_ms(md, ms)) {
            for (int p = 0; p < GPC_MD_PHASES; p++)
                total += ms[p];
            printf("gpc md: GPU time by phase (GPC_MD_PHASES):");
            for (int p = 0; p < GPC_MD_PHASES; p++)
                printf(" %s %.1f ms (%.0f%%)%s", gpc_md_phase_name(p), ms[p],
                       total > 0 ? 100 * ms[p] / total : 0.0, p + 1 < GPC_MD_PHASES ? "," : "\n");
        }
        if (json) st = write_json(json, &c, md, &log, steps, seconds);
    }
    /* also when the run failed: missed pairs are a likely reason it blew up */
    if (gpc_md_dangerous_builds(md) && printing) {
        fflush(stdout);
        fprintf(stderr,
                "gpc md: warning: %lld of the rebuilds every %d steps came after an atom had moved "
                "more than half the skin, so pairs may have been missed: use --rebuild-every 0 "
                "(rebuild on that) or a larger --skin\n",
                (long long)gpc_md_dangerous_builds(md), c.rebuild_every);
    }
    free(log.rows);
    gpc_md_free(md);
    gpc_dist_destroy(peers), gpc_dist_destroy(dist);
    if (st) return cli_fail("md", st);
    return stopped ? 128 + (cli_stop_signal() ? cli_stop_signal() : SIGTERM) : CLI_EXIT_OK;
}
