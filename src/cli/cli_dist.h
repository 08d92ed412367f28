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

/* --halos: "auto", "nccl" or "host"; else says so and returns nonzero. */
int cli_halos_check(const char *command, const char *halos);

/* The GPUs' halos of a command split over processes (`gpc md`, `gpc
 * stencil`), after cli_dist_mpi: *out receives NCCL collectives over the
 * same processes when halos is "nccl", or "auto" with every process on a GPU
 * of its own (`named` 0: none named for all) and NCCL loading everywhere;
 * it stays NULL for halos through the host ("host", "auto" otherwise, or
 * the CPU). All processes agree, so all create the NCCL collectives or
 * none does. Returns 0, or the exit code after saying why ("nccl" on the
 * CPU, in one process or where a process cannot use it). */
int cli_gpu_halos(const char *command, const gpc_dist_env *env, gpc_dist *dist, gpc_device device,
                  int named, const char *halos, gpc_dist **out);

#endif /* GPC_CLI_DIST_H */
