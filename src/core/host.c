/*
 * host.c: the CPU cores this process may use (gpc/core.h). A container can
 * see every core of the machine but be allowed only a few by its cgroup's
 * CPU quota; OpenMP counts the cores it sees, so threads beyond the quota
 * are descheduled in turn and every parallel loop waits on the slowest.
 */
#define _GNU_SOURCE
#include "gpc/core.h"

#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int gpc_host_cores_available_from(int affinity, const char *cpu_max) {
    int cores = affinity > 0 ? affinity : 1;
    FILE *f = cpu_max ? fopen(cpu_max, "r") : NULL;
    if (!f) return cores;
    char quota[32] = "";
    double period = 0;
    /* cgroup v2 cpu.max: "QUOTA PERIOD" in microseconds, or "max PERIOD" */
    if (fscanf(f, "%31s %lf", quota, &period) == 2 && strcmp(quota, "max") != 0 && period > 0) {
        double allowed = ceil(atof(quota) / period);
        if (allowed >= 1 && allowed < cores) cores = (int)allowed;
    }
    fclose(f);
    return cores;
}

int gpc_host_cores_available(void) {
    cpu_set_t set;
    int affinity = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                               : (int)sysconf(_SC_NPROCESSORS_ONLN);
    return gpc_host_cores_available_from(affinity, "/sys/fs/cgroup/cpu.max");
}
