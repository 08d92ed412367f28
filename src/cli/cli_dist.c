/*
 * cli_dist.c: joins a data-parallel job from the command line: the job's
 * environment (gpc launch, mpirun or srun), this rank's GPU, the collectives.
 */
#include "cli/cli_dist.h"

#include "cli/cli.h"

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
