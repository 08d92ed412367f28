/*
 * test_zero_mpi.c: ZeRO-1 over MPI on the CPU, run by CTest under
 * `mpirun -np 2` and `-np 4`. Every rank trains a sharded model
 * (gpt_create_shard over gpc_dist_shard_offsets) through gpc_ddp on its part
 * of each global batch; rank 0 also trains one whole model on the whole
 * batch, the single-process run.
 *
 * Checked: each rank holds the optimizer state of its shard only (element
 * counts, and the bytes it saves against a whole model: m and v of the
 * elements it does not own); every step's global gradient norm and mean
 * loss equal the single process's; after the steps every rank holds the
 * same parameters, and they, and the gathered m and v, equal the single
 * process's norm-wise within 1e-4. The gradients are summed in another
 * order (per rank, then across ranks): over 30 seeds the differences were
 * 1e-7 to 5e-6, while a lost bucket or shard moves them by 1e-2 or more.
 * Exits 77 outside mpirun or in a build without MPI.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/ddp.h"
#include "gpc/dist.h"
#include "gpc/model.h"

enum { L = 2, NH = 2, C = 32, T = 16, V = 97, B = 2, STEPS = 4 };

static int failures;

static int rank;

#include "mpi_check.h"

/* ||a - b|| / ||b|| over n elements. */
static double norm_error(const float *a, const float *b, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return sqrt(d / (r > 0 ? r : 1));
}

static size_t align_up(size_t bytes) {
    return (bytes + 255) / 256 * 256; /* gpc_arena's alignment */
}

/* The same value on every rank: rank 0's. */
static double from_rank0(gpc_dist *d, double value) {
    double v = d->rank == 0 ? value : 0;
    MUST(d->ops->all_reduce_host(d, &v, 1));
    return v;
}

int main(void) {
    gpc_dist_env env;
    if (gpc_dist_env_from_process(&env) != GPC_OK || env.world_size < 2 || !gpc_dist_have_mpi()) {
        fprintf(stderr, "skipped: run under mpirun -np N (N >= 2) in a build with MPI\n");
        return 77;
    }
    gpc_dist *d;
    rank = env.rank;
    MUST(gpc_dist_create(&d, &env, gpc_cpu(), "mpi"));
    int world = d->world_size;
    const char *fixed = getenv("GPC_TEST_SEED");
    uint64_t seed = (uint64_t)from_rank0(
        d, fixed ? (double)strtoull(fixed, NULL, 10)
                 : (double)((uint64_t)(gpc_time_seconds() * 1e6) % 1000000007u));
    if (rank == 0) printf("seed %llu (set GPC_TEST_SEED to repeat)\n", (unsigned long long)seed);

    gpt_config c;
    MUST(gpt_config_init(&c, L, NH, C, T, V));
    size_t P = gpt_config_num_params(&c), off[5];
    gpc_dist_shard_offsets(P, world, 64, off);
    size_t lo = off[rank], S = off[rank + 1] - lo;

    /* each rank holds its shard's m and v (f32 has no master) */
    gpt_model *m, *whole;
    MUST(gpt_create_shard(&m, &c, gpc_cpu(), GPC_F32, B, T, 0, lo, S));
    MUST(gpt_create(&whole, &c, gpc_cpu(), GPC_F32, B, T, 1));
    MUST(gpt_init_weights(m, seed));
    MUST(gpt_init_weights(whole, seed));
    size_t off_m, count;
    gpt_shard_range(m, &off_m, &count);
    CHECK(off_m == lo && count == S, "shard range [%zu, +%zu), expected [%zu, +%zu)", off_m, count,
          lo, S);
    CHECK(gpc_optim_state_count(gpt_optimizer(m)) == S, "optimizer holds %zu elements, not %zu",
          gpc_optim_state_count(gpt_optimizer(m)), S);
    CHECK(gpc_tensor_numel(gpc_optim_m(gpt_optimizer(m))) == (int64_t)S, "m is not [%zu]", S);
    size_t saved = gpt_memory_bytes(whole) - gpt_memory_bytes(m);
    size_t expect = align_up(P * 4) + P * 4 - (align_up(S * 4) + S * 4);
    CHECK(saved == expect, "saves %zu bytes, expected %zu (m and v of %zu elements)", saved, expect,
          P - S);
    if (rank != 0) { /* the single-process run is rank 0's */
        gpt_free(whole);
        whole = NULL;
    }

    gpc_ddp *ddp;
    gpc_ddp_options o = {.zero = 1, .bucket_mb = 0.01}; /* several buckets */
    MUST(gpc_ddp_create(&ddp, m, d, &o));

    gpc_rng rng;
    gpc_rng_seed(&rng, seed, 5);
    size_t rows = (size_t)world * B * T;
    int32_t *in = malloc(rows * sizeof *in), *tg = malloc(rows * sizeof *tg);
    float dloss = 1.0f / (float)rows;
    for (int step = 1; step <= STEPS; step++) {
        for (size_t i = 0; i < rows; i++) { /* the same global batch on every rank */
            in[i] = (int32_t)gpc_rng_below(&rng, V);
            tg[i] = i % 11 == 5 ? -1 : (int32_t)gpc_rng_below(&rng, V);
        }
        gpc_optim_options adam;
        gpc_optim_defaults(&adam);
        adam.learning_rate = 1e-2f;
        adam.step = step;
        size_t mine = (size_t)rank * B * T;
        MUST(gpt_zero_grad(m));
        MUST(gpc_ddp_micro_step(ddp, 1));
        MUST(gpt_forward_backward(m, in + mine, tg + mine, B, T, dloss));
        MUST(gpc_ddp_finish_backward(ddp));
        MUST(gpc_ddp_update(ddp, &adam, NULL));
        float loss, norm;
        MUST(gpt_read_step(m, &loss, &norm));
        int64_t unmasked = 0;
        for (size_t i = mine; i < mine + (size_t)B * T; i++)
            unmasked += tg[i] >= 0;
        double sums[2] = {(double)loss * (double)unmasked, (double)unmasked};
        MUST(gpc_ddp_reduce_host(ddp, sums, 2));
        if (rank != 0) continue;
        /* the single process: the ranks' batches as micro-steps */
        MUST(gpt_zero_grad(whole));
        for (int r = 0; r < world; r++)
            MUST(gpt_forward_backward(whole, in + (size_t)r * B * T, tg + (size_t)r * B * T, B, T,
                                      dloss));
        MUST(gpt_update(whole, &adam, NULL, NULL));
        float want_loss, want_norm;
        MUST(gpt_read_step(whole, &want_loss, &want_norm));
        double got_loss = sums[0] / sums[1];
        CHECK(fabs(norm - want_norm) <= 1e-5 * want_norm,
              "step %d: gradient norm %.9g, one process %.9g", step, (double)norm,
              (double)want_norm);
        CHECK(fabs(got_loss - want_loss) <= 1e-5 * want_loss,
              "step %d: loss %.9g, one process %.9g", step, got_loss, (double)want_loss);
    }

    /* every rank holds the same parameters (the all-gather) */
    float *w = malloc(P * sizeof *w);
    MUST(gpt_get_params(m, w));
    double sum = 0;
    for (size_t i = 0; i < P; i++)
        sum += (double)w[i] * (double)(i % 7 + 1);
    double sum0 = from_rank0(d, sum);
    CHECK(sum == sum0, "parameters differ from rank 0's (weighted sums %.17g and %.17g)", sum,
          sum0);
    gpt_host_state full;
    MUST(gpc_ddp_gather_state(ddp, &full));
    if (rank == 0) {
        float *want = malloc(P * sizeof *want);
        MUST(gpt_get_params(whole, want));
        double e = norm_error(w, want, P);
        CHECK(e < 1e-4, "parameters differ from one process's by %.2e (norm-wise)", e);
        const float *mom = gpc_optim_m(gpt_optimizer(whole))->data;
        const float *var = gpc_optim_v(gpt_optimizer(whole))->data;
        double em = norm_error(full.m, mom, P), ev = norm_error(full.v, var, P);
        CHECK(em < 1e-4 && ev < 1e-4, "gathered m, v differ from one process's by %.2e, %.2e", em,
              ev);
        printf("%d ranks: parameters within %.1e, m %.1e, v %.1e of one process\n", world, e, em,
               ev);
        free(want);
    }
    gpt_host_state_free(&full);
    double failed = failures;
    MUST(d->ops->all_reduce_host(d, &failed, 1));
    gpc_ddp_free(ddp);
    gpt_free(m);
    gpt_free(whole);
    free(in), free(tg), free(w);
    gpc_dist_destroy(d);
    if (rank == 0)
        printf(failed > 0 ? "%g failure(s)\n" : "ZeRO-1 over MPI: all checks passed\n", failed);
    return failed > 0 ? 1 : 0;
}
