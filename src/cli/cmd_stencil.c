/*
 * cmd_stencil.c: `gpc stencil`, the 3D heat-equation solver (gpc/stencil.h).
 * Runs the steps with a progress line, then prints the rate in lattice
 * updates a second, the memory traffic that implies (a read and a write of
 * 8 bytes a point), the same machine's memory-copy rate measured here for
 * comparison, and how far the field is from its exact evolution.
 */
#include "cli/cli.h"
#include "gpc/stencil.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Memory-copy rate, bytes read plus written a second: the best of 5 copies
 * of `bytes` (a memory-bound stencil's ceiling on this machine). */
static double copy_rate(size_t bytes) {
    char *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) {
        free(a), free(b);
        return 0;
    }
    memset(a, 1, bytes), memset(b, 2, bytes);
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = gpc_time_seconds();
        /* split over the threads, as the solver's planes are */
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
    return best;
}

int cmd_stencil(int argc, char **argv) {
    gpc_stencil_config c;
    gpc_stencil_defaults(&c);
    int steps = 100;
    const char *mode = "1,1,1", *json = NULL;
    const cli_option options[] = {
        {"n", CLI_INT, &c.n, "N", "interior points along each side (default 128)"},
        {"steps", CLI_INT, &steps, "S", "time steps (default 100)"},
        {"domains", CLI_INT, &c.domains, "D",
         "slabs along z, each with its own arrays and halo planes (default 1)"},
        {"r", CLI_FLOAT, &c.r, "R", "alpha dt / h^2, at most 1/6 (default 0.125)"},
        {"mode", CLI_STRING, &mode, "KX,KY,KZ", "the starting sine mode (default 1,1,1)"},
        {"json", CLI_STRING, &json, "FILE", "also write the run's figures as JSON"},
        {0},
    };
    const cli_spec spec = {
        "stencil",
        "stencil [--n N] [--steps S] [--domains D] [--r R] [--mode KX,KY,KZ] [--json FILE]",
        "Solves the 3D heat equation on an N^3 grid (faces held at 0) with the 7-point stencil "
        "and explicit Euler, on the CPU (OpenMP threads: OMP_NUM_THREADS), split into D slabs "
        "that exchange halo planes every step. The field starts as a sine mode, whose exact "
        "evolution the result is checked against. Ctrl-C or SIGTERM stops the run cleanly with its "
        "summary.",
        options,
        0,
        NULL,
        NULL};
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    if (steps < 0) return cli_usage_error("stencil", "--steps %d is negative", steps);
    char tail;
    if (sscanf(mode, "%d,%d,%d%c", &c.mode[0], &c.mode[1], &c.mode[2], &tail) != 3)
        return cli_usage_error("stencil", "--mode %s is not three numbers like 1,2,1", mode);

    gpc_stencil *s = NULL;
    gpc_status st = gpc_stencil_create(&s, &c);
    if (st) return cli_fail("stencil", st);
    const double points = (double)c.n * c.n * c.n;
    printf("gpc stencil: %d^3 points in %d domain%s, r %g, mode %d,%d,%d, %d thread%s\n", c.n,
           c.domains, c.domains == 1 ? "" : "s", c.r, c.mode[0], c.mode[1], c.mode[2],
           omp_get_max_threads(), omp_get_max_threads() == 1 ? "" : "s");
    cli_progress progress;
    cli_progress_init(&progress);
    double seconds = 0;
    cli_catch_stop(NULL); /* Ctrl-C, SIGTERM: stop after the current steps, with the summary */
    int done = 0;
    for (; done < steps && st == GPC_OK && !cli_stop_signal();) {
        int chunk = steps - done < 10 ? steps - done : 10;
        double t0 = gpc_time_seconds();
        st = gpc_stencil_run(s, chunk);
        seconds += gpc_time_seconds() - t0;
        done += chunk;
        cli_progress_update(&progress, done == steps, "step %d of %d, %.2f G lattice updates/s",
                            done, steps, seconds > 0 ? points * done / seconds / 1e9 : 0.0);
    }
    cli_progress_end(&progress);
    if (cli_stop_signal() && st == GPC_OK) {
        fprintf(stderr, "gpc stencil: stopped by %s at step %d of %d\n", cli_stop_name(), done,
                steps);
        steps = done; /* the summary is of the steps that ran */
    }
    if (st) {
        gpc_stencil_free(s);
        return cli_fail("stencil", st);
    }
    double glups = seconds > 0 ? points * steps / seconds / 1e9 : 0;
    double traffic = 16.0 * glups; /* GB/s: u read, v written */
    /* a copy of one array's size, beyond the last-level cache, counted by
     * gpc_stencil_create's memory check */
    double copy = copy_rate(gpc_stencil_copy_bytes(&c)) / 1e9;
    double error = gpc_stencil_error(s), heat_error = gpc_stencil_heat_error(s);
    printf("gpc stencil: %d steps in %.3f s: %.3f G lattice updates/s, %.1f GB/s at 16 bytes a "
           "point (memory copy here: %.1f GB/s, so %.0f%% of it)\n",
           steps, seconds, glups, traffic, copy, copy > 0 ? 100 * traffic / copy : 0.0);
    /* the first checks the solver computes its scheme (rounding only); the
     * second is the scheme's own error against the heat equation */
    printf("gpc stencil: field vs the discrete operator's decay: %.2g; vs the heat equation's "
           "exact solution: %.2g\n",
           error, heat_error);
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) st = gpc_error(GPC_ERR_IO, "cannot write %s: check the directory exists", json);
        if (f) {
            fprintf(f,
                    "{\"n\": %d, \"domains\": %d, \"r\": %.17g, \"mode\": [%d, %d, %d], "
                    "\"threads\": %d, \"steps\": %d, \"seconds\": %.9g, \"glups\": %.9g, "
                    "\"gb_per_s\": %.9g, \"copy_gb_per_s\": %.9g, \"lambda\": %.17g, "
                    "\"error\": %.9g, \"heat_decay\": %.17g, \"heat_error\": %.9g, "
                    "\"center\": %.17g}\n",
                    c.n, c.domains, c.r, c.mode[0], c.mode[1], c.mode[2], omp_get_max_threads(),
                    steps, seconds, glups, traffic, copy, gpc_stencil_lambda(&c), error,
                    gpc_stencil_heat_decay(&c, steps), heat_error,
                    gpc_stencil_at(s, c.n / 2, c.n / 2, c.n / 2));
            if (fclose(f) != 0) st = gpc_error(GPC_ERR_IO, "cannot finish writing %s", json);
        }
    }
    gpc_stencil_free(s);
    if (st) return cli_fail("stencil", st);
    return cli_stop_signal() ? 128 + cli_stop_signal() : CLI_EXIT_OK;
}
