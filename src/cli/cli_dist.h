/*
 * cli_dist.h: what `gpc train` (and later commands) need to join a
 * data-parallel job: read the job's environment, pick this rank's GPU and
 * create the collectives (src/cli/cli_dist.c).
 */
#ifndef GPC_CLI_DIST_H
#define GPC_CLI_DIST_H

#include "gpc/dist.h"
#include "gpc/train.h"

/* Reads gpc launch / mpirun / srun variables. With more than one process:
 * a GPU device becomes cuda:LOCAL_RANK, o->world_size and o->rank are set
 * and *out receives the collectives (backend "auto", "mpi", "nccl" or
 * "none"); alone, *out is NULL and o is left as it was. */
gpc_status cli_dist_setup(gpc_train_options *o, const char *backend, gpc_dist **out);

/* For the commands whose processes exchange halos over MPI (`gpc md`,
 * `gpc stencil`): refuses processes gpc launch started (it does not start
 * MPI), takes srun's for MPI's (PMI; the mpi backend checks that the ranks
 * agree) and creates the mpi collectives into *out. Returns 0, or the exit
 * code after saying why. */
int cli_dist_mpi(const char *command, gpc_dist_env *env, gpc_dist **out);

#endif /* GPC_CLI_DIST_H */
