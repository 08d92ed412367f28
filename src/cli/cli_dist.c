/*
 * cli_dist.c: joins a data-parallel job from the command line: the job's
 * environment (gpc launch, mpirun or srun), this rank's GPU, the collectives.
 */
#include "cli/cli_dist.h"

#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

gpc_status cli_dist_setup(gpc_train_options *o, const char *backend, gpc_dist **out) {
    *out = NULL;
    gpc_dist_env env;
    GPC_TRY(gpc_dist_env_from_process(&env));
    if (env.world_size <= 1 && (!backend || strcmp(backend, "auto") == 0)) return GPC_OK;
    if (o->device.type == GPC_DEVICE_CUDA) {
        /* one process per GPU: the rank's place on its node picks the GPU */
        const gpc_backend *b = gpc_backend_get(GPC_DEVICE_CUDA);
        int count = b && b->device_count ? b->device_count() : 0;
        if (count > 0 && env.local_rank >= count)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "local rank %d has no GPU: this node has %d; start at most %d "
                             "processes per node",
                             env.local_rank, count, count);
        o->device.index = env.local_rank;
    }
    GPC_TRY(gpc_dist_create(out, &env, o->device, backend));
    o->world_size = env.world_size;
    o->rank = env.rank;
    o->dist = *out;
    return GPC_OK;
}

/* Whether any process of dist says yes. */
static int anyone(gpc_dist *dist, int yes) {
    double v = yes ? 1.0 : 0.0;
    if (dist->ops->all_reduce_host(dist, &v, 1) != GPC_OK) return 1;
    return v > 0;
}

int cli_halos_check(const char *command, const char *halos) {
    if (strcmp(halos, "auto") == 0 || strcmp(halos, "nccl") == 0 || strcmp(halos, "host") == 0)
        return 0;
    return cli_usage_error(command, "--halos %s: use auto, nccl or host", halos);
}

int cli_gpu_halos(const char *command, const gpc_dist_env *env, gpc_dist *dist, gpc_device device,
                  int named, const char *halos, gpc_dist **out) {
    *out = NULL;
    const int asked = strcmp(halos, "nccl") == 0;
    if (asked && (!dist || device.type != GPC_DEVICE_CUDA))
        return cli_usage_error(command,
                               "--halos nccl is for GPUs in several processes: add --device cuda "
                               "and start the processes with mpirun");
    if (!dist || device.type != GPC_DEVICE_CUDA || strcmp(halos, "host") == 0) return 0;
    const gpc_backend *b = gpc_backend_get(GPC_DEVICE_CUDA);
    const int count = b && b->device_count ? b->device_count() : 0;
    char why[512] = "";
    if (named)
        snprintf(why, sizeof why, "--device cuda:%d puts every process on that GPU", device.index);
    else if (env->local_rank >= count)
        snprintf(why, sizeof why, "local rank %d has no GPU of its own (this machine has %d)",
                 env->local_rank, count);
    else if (gpc_dist_nccl_available() != GPC_OK)
        snprintf(why, sizeof why, "%s", gpc_last_error());
    if (anyone(dist, why[0] != 0)) {
        if (!asked) return 0; /* auto: through the host */
        if (why[0])
            return cli_usage_error(command,
                                   "rank %d: --halos nccl needs each process on a GPU of its own "
                                   "and NCCL: %s",
                                   dist->rank, why);
        fprintf(stderr, "gpc %s: rank %d stops: another process cannot use NCCL\n", command,
                dist->rank);
        return CLI_EXIT_USAGE;
    }
    gpc_status st = gpc_dist_create(out, env, device, "nccl");
    if (anyone(dist, st != GPC_OK)) {
        int rc = st ? cli_fail(command, st) : CLI_EXIT_RUNTIME;
        if (!st)
            fprintf(stderr, "gpc %s: rank %d stops: another process's NCCL failed\n", command,
                    dist->rank);
        gpc_dist_destroy(*out);
        *out = NULL;
        return rc;
    }
    return 0;
}

int cli_dist_mpi(const char *command, gpc_dist_env *env, gpc_dist **out) {
    *out = NULL;
    if (strcmp(env->source, "gpc launch") == 0)
        return cli_usage_error(command,
                               "the processes exchange halos over MPI, which gpc launch does not "
                               "start: run mpirun -np %d gpc %s ... (or srun)",
                               env->world_size, command);
    if (strcmp(env->source, "slurm") == 0) env->source = "mpirun";
    gpc_status st = gpc_dist_create(out, env, gpc_cpu(), "mpi");
    return st ? cli_fail(command, st) : 0;
}
