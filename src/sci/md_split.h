/*
 * md_split.h: `gpc md` split across the processes of an MPI job (md.c calls
 * it for gpc_md_create_split): each process owns the atoms of one slab of
 * the box along x and sees copies (ghosts) of its two neighbours' atoms
 * within cutoff + skin of its faces.
 *
 * With config->device a GPU, each process steps its slab on that GPU
 * (md_split_cuda.h); pair forces are float64 there.
 *
 * Private to the sci layer. Every call is collective: each process of the
 * job makes it, in the same order. Built on MPI when gpc has it; otherwise
 * md_split_create answers GPC_ERR_UNSUPPORTED.
 */
#ifndef GPC_SCI_MD_SPLIT_H
#define GPC_SCI_MD_SPLIT_H

#include "gpc/md.h"

typedef struct md_split md_split;

/* Takes this process's slab of the whole crystal (x, v: [atoms][3], id:
 * [atoms], the same on every process), exchanges ghosts, builds the
 * neighbour list and computes forces and the thermo sums. Refuses slabs
 * narrower than cutoff + skin. */
gpc_status md_split_create(md_split **out, const gpc_md_config *config, int rank, int world,
                           int64_t atoms, double box, const double *x, const double *v,
                           const int64_t *id);
void md_split_free(md_split *s);

/* Advances `steps` steps (first_step: the step before, for messages). */
gpc_status md_split_run(md_split *s, int steps, int64_t first_step);

/* The whole crystal's sums at the last step computed: pair energy, virial
 * r . f (each pair once), sum of v^2, listed pairs. */
void md_split_sums(const md_split *s, double *potential, double *virial, double *v2,
                   int64_t *pairs);
int64_t md_split_builds(const md_split *s);
int64_t md_split_dangerous(const md_split *s);
/* "NVIDIA H200 (cuda:0)" or the like for a run on GPUs; NULL on the CPU. */
const char *md_split_device_name(const md_split *s);

/* Every atom's position, wrapped into the box, by id ([atoms][3]), on every
 * process. */
gpc_status md_split_gather_positions(md_split *s, double *out);

#endif /* GPC_SCI_MD_SPLIT_H */
