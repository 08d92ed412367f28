/*
 * openmp.c: OpenMP's wait policy and thread count for a gpc process, chosen
 * for shared servers before a command runs.
 *
 * libgomp's threads spin at every barrier by default (about 300,000 turns)
 * before they sleep. On a machine whose cores are busy with other work the
 * spinning threads take the cores from the thread everyone waits for: a
 * 2-thread `gpc md --cells 10` beside one busy process took 3.1-4.6 s
 * against 0.36-0.52 s with OMP_WAIT_POLICY=passive. Passive costs little on
 * an idle machine, since gpc's parallel loops are long, so it is the default.
 * libgomp reads the variable once, when it is loaded, before main: gpc sets
 * it and executes itself again. OMP_WAIT_POLICY or GOMP_SPINCOUNT given by
 * the user are left alone.
 *
 * Threads: OpenMP starts one per core it sees, which in a container can be
 * many more than the cgroup's CPU quota allows; without OMP_NUM_THREADS,
 * gpc uses the cores the quota allows (gpc_host_cores_available).
 */
#include "cli/cli.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void cli_openmp_setup(char **argv) {
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT")) {
        setenv("OMP_WAIT_POLICY", "passive", 1);
        fflush(NULL);
        execv("/proc/self/exe", argv);
        /* no /proc (or no exec): run on with libgomp's default */
    }
    if (!getenv("OMP_NUM_THREADS")) {
        int cores = gpc_host_cores_available();
        if (cores < omp_get_max_threads()) omp_set_num_threads(cores);
    }
}
