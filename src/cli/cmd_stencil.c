/*
 * cmd_stencil.c: `gpc stencil`, the 3D heat-equation solver (gpc/stencil.h).
 * Runs the steps with a progress line, then prints the rate in lattice
 * updates a second, the memory traffic that implies (a read and a write of
 * an element a point), the same device's memory-copy rate measured here for
 * comparison, and how far the field is from its exact evolution.
 *
 * Started by mpirun or srun, every process takes a band of planes; rank 0
 * prints. The processes agree after every ten steps whether a signal came,
 * so they stop together rather than one waiting forever for another's halo.
 */
#include "cli/cli.h"
#include "cli/cli_dist.h"
#include "gpc/dist.h"
#include "gpc/stencil.h"

#include <inttypes.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The sum over the processes of one value (itself alone). */
static double sum_all(gpc_dist *dist, double value) {
    if (dist && dist->world_size > 1) dist->ops->all_reduce_host(dist, &value, 1);
    return value;
}

static gpc_status write_json(const char *path, const gpc_stencil_config *c, const char *kernel,
                             int steps, double seconds, double glups, double traffic, double copy,
                             double error, double heat_error, double center, uint64_t checksum,
                             int world, const char *halos) {
    FILE *f = fopen(path, "w");
    if (!f) return gpc_error(GPC_ERR_IO, "cannot write %s: check the directory exists", path);
    fprintf(f,
            "{\"n\": %d, \"domains\": %d, \"processes\": %d, \"device\": \"%s\", \"precision\": "
            "\"%s\", \"kernel\": \"%s\", \"r\": %.17g, \"mode\": [%d, %d, %d], \"threads\": %d, "
            "\"steps\": %d, "
            "\"seconds\": %.9g, \"glups\": %.9g, \"gb_per_s\": %.9g, \"copy_gb_per_s\": %.9g, "
            "\"lambda\": %.17g, \"error\": %.9g, \"heat_decay\": %.17g, \"heat_error\": %.9g, "
            "\"center\": %.17g, \"checksum\": \"%016" PRIx64 "\", \"halos\": \"%s\"}\n",
            c->n, c->domains, world, gpc_device_name(c->device), c->fp32 ? "f32" : "f64", kernel,
            c->r, c->mode[0], c->mode[1], c->mode[2], omp_get_max_threads(), steps, seconds, glups,
            traffic, copy, gpc_stencil_lambda(c), error, gpc_stencil_heat_decay(c, steps),
            heat_error, center, checksum, halos);
    if (fclose(f) != 0) return gpc_error(GPC_ERR_IO, "cannot finish writing %s", path);
    return GPC_OK;
}

int cmd_stencil(int argc, char **argv) {
    gpc_stencil_config c;
    gpc_stencil_defaults(&c);
    int steps = 100;
    const char *mode = "1,1,1", *json = NULL, *device = "cpu", *precision = "f64", *halos = "auto";
    const cli_option options[] = {
        {"n", CLI_INT, &c.n, "N", "interior points along each side (default 128)"},
        {"steps", CLI_INT, &steps, "S", "time steps (default 100)"},
        {"domains", CLI_INT, &c.domains, "D",
         "slabs along z in each process, each with its own arrays and halo planes (default 1)"},
        {"r", CLI_FLOAT, &c.r, "R", "alpha dt / h^2, at most 1/6 (default 0.125)"},
        {"mode", CLI_STRING, &mode, "KX,KY,KZ", "the starting sine mode (default 1,1,1)"},
        {"device", CLI_STRING, &device, "DEV",
         "cpu (default), cuda or cuda:N; under mpirun, cuda is each process's local rank"},
        {"precision", CLI_STRING, &precision, "P", "f64 (default) or f32 (GPUs only)"},
        {"halos", CLI_STRING, &halos, "H",
         "GPUs under mpirun: nccl (GPU to GPU), host (over MPI) or auto (default: nccl when "
         "each process has its own GPU and NCCL loads)"},
        {"json", CLI_STRING, &json, "FILE", "also write the run's figures as JSON"},
        {0},
    };
    const cli_spec spec = {
        "stencil",
        "stencil [--n N] [--steps S] [--domains D] [--r R] [--mode KX,KY,KZ] [--device DEV] "
        "[--precision f64|f32] [--halos auto|nccl|host] [--json FILE]",
        "Solves the 3D heat equation on an N^3 grid (faces held at 0) with the 7-point stencil "
        "and explicit Euler, on the CPU (OpenMP threads: OMP_NUM_THREADS) or a GPU, split into D "
        "slabs that exchange halo planes every step. Under mpirun or srun the grid is split "
        "across the processes too, halo planes going GPU to GPU over NCCL (each process on a GPU "
        "of its own) or through the host over MPI while the slabs' insides are updated. The field "
        "starts as a sine mode, whose exact evolution the result is checked "
        "against. Ctrl-C or SIGTERM stops the run cleanly with its summary.",
        options,
        0,
        NULL,
        NULL};
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    if (steps < 0) return cli_usage_error("stencil", "--steps %d is negative", steps);
    char tail;
    if (sscanf(mode, "%d,%d,%d%c", &c.mode[0], &c.mode[1], &c.mode[2], &tail) != 3)
        return cli_usage_error("stencil", "--mode %s is not three numbers like 1,2,1", mode);
    if (strcmp(precision, "f64") == 0 || strcmp(precision, "fp64") == 0)
        c.fp32 = 0;
    else if (strcmp(precision, "f32") == 0 || strcmp(precision, "fp32") == 0)
        c.fp32 = 1;
    else
        return cli_usage_error("stencil", "--precision %s: use f64 or f32", precision);
    if (cli_halos_check("stencil", halos)) return CLI_EXIT_USAGE;
    gpc_status st = gpc_device_parse(device, &c.device);
    if (st) return cli_fail("stencil", st);

    /* several processes: the mpi collectives start MPI and check the ranks */
    gpc_dist_env env;
    st = gpc_dist_env_from_process(&env);
    if (st) return cli_fail("stencil", st);
    gpc_dist *dist = NULL;
    if (env.world_size > 1) {
        int rc = cli_dist_mpi("stencil", &env, &dist);
        if (rc) return rc;
        /* one GPU a process unless the command named one */
        if (c.device.type == GPC_DEVICE_CUDA && !strchr(device, ':'))
            c.device.index = env.local_rank;
        c.dist = dist;
    }
    gpc_dist *peers = NULL;
    {
        int rc = cli_gpu_halos("stencil", &env, dist, c.device, strchr(device, ':') != NULL, halos,
                               &peers);
        if (rc) {
            gpc_dist_destroy(dist);
            return rc;
        }
        c.gpu_dist = peers;
    }
    const char *halo_path = !dist                             ? "none"
                            : c.device.type == GPC_DEVICE_CPU ? "mpi"
                            : peers                           ? "nccl"
                                                              : "host";
    const int rank = dist ? dist->rank : 0, world = dist ? dist->world_size : 1;

    gpc_stencil *s = NULL;
    st = gpc_stencil_create(&s, &c);
    /* every process must have started, or none goes on */
    if (sum_all(dist, st ? 1.0 : 0.0) > 0) {
        int rc = st ? cli_fail("stencil", st) : CLI_EXIT_RUNTIME;
        if (!st) fprintf(stderr, "gpc stencil: rank %d stops: another process failed\n", rank);
        gpc_stencil_free(s);
        gpc_dist_destroy(peers), gpc_dist_destroy(dist);
        return rc;
    }
    const double points = (double)c.n * c.n * c.n;
    const double bytes_per_point = 2.0 * (c.fp32 ? 4 : 8); /* u read, v written */
    if (rank == 0) {
        if (world > 1)
            printf("gpc stencil: %d^3 points in %d processes x %d domain%s", c.n, world, c.domains,
                   c.domains == 1 ? "" : "s");
        else
            printf("gpc stencil: %d^3 points in %d domain%s", c.n, c.domains,
                   c.domains == 1 ? "" : "s");
        printf(", %s on %s", c.fp32 ? "f32" : "f64", gpc_device_name(c.device));
        if (c.device.type == GPC_DEVICE_CUDA) printf(" (%s kernel)", gpc_stencil_kernel_name(s));
        if (world > 1 && c.device.type == GPC_DEVICE_CUDA)
            printf(", halos %s", peers ? "GPU to GPU over NCCL" : "through the host over MPI");
        printf(", r %g, mode %d,%d,%d, %d thread%s\n", c.r, c.mode[0], c.mode[1], c.mode[2],
               omp_get_max_threads(), omp_get_max_threads() == 1 ? "" : "s");
    }
    cli_progress progress;
    cli_progress_init(&progress);
    double seconds = 0;
    cli_catch_stop(NULL); /* Ctrl-C, SIGTERM: stop after the current steps, with the summary */
    int done = 0, stop = 0;
    while (done < steps && st == GPC_OK && !stop) {
        int chunk = steps - done < 10 ? steps - done : 10;
        double t0 = gpc_time_seconds();
        st = gpc_stencil_run(s, chunk);
        seconds += gpc_time_seconds() - t0;
        done += chunk;
        stop = sum_all(dist, cli_stop_signal() ? 1.0 : 0.0) > 0;
        if (rank == 0)
            cli_progress_update(&progress, done == steps, "step %d of %d, %.2f G lattice updates/s",
                                done, steps, seconds > 0 ? points * done / seconds / 1e9 : 0.0);
    }
    if (rank == 0) cli_progress_end(&progress);
    if (stop && st == GPC_OK) {
        if (rank == 0)
            fprintf(stderr, "gpc stencil: stopped by %s at step %d of %d\n",
                    cli_stop_signal() ? cli_stop_name() : "a signal to another process", done,
                    steps);
        steps = done; /* the summary is of the steps that ran */
    }
    if (st) {
        gpc_stencil_free(s);
        gpc_dist_destroy(peers), gpc_dist_destroy(dist);
        return cli_fail("stencil", st);
    }
    double glups = seconds > 0 ? points * steps / seconds / 1e9 : 0;
    double traffic = bytes_per_point * glups; /* GB/s */
    /* every process's device copies at once, as they all run the stencil:
     * the sum is the ceiling of the whole run */
    double copy_rate = 0;
    st = gpc_stencil_copy_rate(&c, &copy_rate);
    double copy = sum_all(dist, copy_rate) / 1e9;
    double error = gpc_stencil_error(s), heat_error = gpc_stencil_heat_error(s);
    double center = gpc_stencil_at_all(s, c.n / 2, c.n / 2, c.n / 2);
    uint64_t checksum = gpc_stencil_checksum(s);
    if (rank == 0) {
        printf("gpc stencil: %d steps in %.3f s: %.3f G lattice updates/s, %.1f GB/s at %.0f "
               "bytes a point (memory copy here: %.1f GB/s, so %.0f%% of it)\n",
               steps, seconds, glups, traffic, bytes_per_point, copy,
               copy > 0 ? 100 * traffic / copy : 0.0);
        /* the first checks the solver computes its scheme (rounding only); the
         * second is the scheme's own error against the heat equation */
        printf("gpc stencil: field vs the discrete operator's decay: %.2g; vs the heat "
               "equation's exact solution: %.2g\n",
               error, heat_error);
        printf("gpc stencil: field checksum %016" PRIx64 "\n", checksum);
        if (json && st == GPC_OK)
            st = write_json(json, &c, gpc_stencil_kernel_name(s), steps, seconds, glups, traffic,
                            copy, error, heat_error, center, checksum, world, halo_path);
    }
    gpc_stencil_free(s);
    gpc_dist_destroy(peers), gpc_dist_destroy(dist);
    if (st) return cli_fail("stencil", st);
    return cli_stop_signal() ? 128 + cli_stop_signal() : CLI_EXIT_OK;
}
