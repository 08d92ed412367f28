/*
 * test_tp_mpi.c: tensor parallelism, alone and with data parallelism, over
 * MPI on the CPU, run by CTest as `mpirun -np N test_tp_mpi TP`: the N
 * ranks form N/TP data-parallel groups of TP tensor-parallel ranks
 * (gpc_dist_layout_make, gpc_dist_split). Every rank also trains one whole
 * model on the whole global batch, the single-process run, and compares.
 *
 * Checked, over 10 AdamW steps with a checkpoint after step 5:
 *  - each step's gradient norm and mean loss equal the single process's;
 *  - the checkpoint gathered from the slices (gpc_tp_gather_full) loads
 *    into a whole model equal to the single process's (saved at tp=TP,
 *    resumed at tp=1), which then trains on alike;
 *  - a fresh tensor-parallel model loads the single process's checkpoint
 *    (saved at tp=1, resumed at tp=TP): its slices equal the file's
 *    exactly, and it trains on to the single process's parameters;
 *  - after 10 steps every rank's slices equal the single process's.
 * The bound: the tp all-reduce sums C/TP-long partial dot products that
 * one process sums in one pass, and data parallelism sums the batch in
 * another order: each product differs by a few f32 roundings (1e-7
 * relative), which AdamW's steps carry. Over 30 seeds the norm-wise
 * parameter differences after 10 steps stayed under 2e-6; the bound is
 * 1e-4, while a missing all-reduce or a wrong slice moves them by 1e-2 or
 * more. Exits 77 outside mpirun or in a build without MPI.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpc/ddp.h"
#include "gpc/dist.h"
#include "gpc/model.h"
#include "gpc/parallel.h"

enum { L = 2, NH = 4, C = 32, T = 16, V = 97, B = 2, STEPS = 10, SAVE_AT = 5 };

static int failures, rank;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rank %d: ", rank);                                                    \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

#define MUST(expr)                                                                                 \
    do {                                                                                           \
        if ((expr) != GPC_OK) {                                                                    \
            fprintf(stderr, "rank %d: %s failed: %s\n", rank, #expr, gpc_last_error());            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* ||a - b|| / ||b|| over n elements. */
static double norm_error(const float *a, const float *b, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return sqrt(d / (r > 0 ? r : 1));
}

typedef struct {
    gpc_dist *world, *tp, *dp;
    gpc_dist_layout lay;
    gpt_config c;
} job;

/* A tensor-parallel model for this rank, its tp hook set. */
static gpt_model *tp_model(const job *j) {
    gpt_model *m;
    MUST(gpt_create_tp(&m, &j->c, gpc_cpu(), GPC_F32, B, T, 0, j->lay.tp, j->lay.tp_rank, 0,
                       SIZE_MAX));
    MUST(gpc_tp_attach(m, j->tp));
    return m;
}

/* This rank's slice of a whole model's f32 array. */
static float *slice_of(const job *j, const float *full) {
    float *local = malloc(gpt_tp_num_params(&j->c, j->lay.tp) * sizeof *local);
    gpt_tp_slice(&j->c, j->lay.tp, j->lay.tp_rank, full, local);
    return local;
}

static float *params_of(const gpt_model *m) {
    float *w = malloc(gpt_num_params(m) * sizeof *w);
    MUST(gpt_get_params(m, w));
    return w;
}

/* One optimizer step of the tensor-parallel models (through ddp when there
 * are data-parallel groups) and of the whole models on the whole batch;
 * every model's norm and loss are compared with the first whole one's. */
static void step(const job *j, int s, gpt_model **tpm, gpc_ddp **ddp, int tps, gpt_model **whole,
                 int wholes, const int32_t *in, const int32_t *tg) {
    size_t rows = (size_t)j->lay.dp * B * T, mine = (size_t)j->lay.dp_rank * B * T;
    float dloss = 1.0f / (float)rows;
    gpc_optim_options adam;
    gpc_optim_defaults(&adam);
    adam.learning_rate = 1e-3f;
    adam.step = s;
    float want_loss = 0, want_norm = 0;
    for (int w = 0; w < wholes; w++) {
        MUST(gpt_zero_grad(whole[w]));
        for (int r = 0; r < j->lay.dp; r++)
            MUST(gpt_forward_backward(whole[w], in + (size_t)r * B * T, tg + (size_t)r * B * T, B,
                                      T, dloss));
        MUST(gpt_update(whole[w], &adam, NULL, NULL));
        float loss, norm;
        MUST(gpt_read_step(whole[w], &loss, &norm));
        if (w == 0) want_loss = loss, want_norm = norm;
        CHECK(fabs(norm - want_norm) <= 1e-5 * want_norm && fabs(loss - want_loss) <= 1e-5 * loss,
              "step %d: the whole model resumed from tp has norm %.9g and loss %.9g, one process "
              "%.9g and %.9g",
              s, (double)norm, (double)loss, (double)want_norm, (double)want_loss);
    }
    for (int k = 0; k < tps; k++) {
        gpt_model *m = tpm[k];
        MUST(gpt_zero_grad(m));
        if (ddp[k]) MUST(gpc_ddp_micro_step(ddp[k], 1));
        MUST(gpt_forward_backward(m, in + mine, tg + mine, B, T, dloss));
        if (ddp[k]) MUST(gpc_ddp_finish_backward(ddp[k]));
        MUST(ddp[k] ? gpc_ddp_update(ddp[k], &adam, NULL) : gpt_update(m, &adam, NULL, NULL));
        float loss, norm;
        MUST(gpt_read_step(m, &loss, &norm));
        int64_t unmasked = 0;
        for (size_t i = mine; i < mine + (size_t)B * T; i++)
            unmasked += tg[i] >= 0;
        double sums[2] = {(double)loss * (double)unmasked, (double)unmasked};
        MUST(j->dp->ops->all_reduce_host(j->dp, sums, 2));
        double got_loss = sums[0] / sums[1];
        CHECK(fabs(norm - want_norm) <= 1e-5 * want_norm,
              "step %d, tp model %d: gradient norm %.9g, one process %.9g", s, k, (double)norm,
              (double)want_norm);
        CHECK(fabs(got_loss - want_loss) <= 1e-5 * want_loss,
              "step %d, tp model %d: loss %.9g, one process %.9g", s, k, got_loss,
              (double)want_loss);
    }
}

/* The optimizer's m and v of a whole model, [num_params] each. */
static const float *moment(const gpt_model *m, int which) {
    const gpc_optim *o = gpt_optimizer(m);
    return (const float *)(which ? gpc_optim_v(o) : gpc_optim_m(o))->data;
}

int main(int argc, char **argv) {
    gpc_dist_env env;
    if (gpc_dist_env_from_process(&env) != GPC_OK || env.world_size < 2 || !gpc_dist_have_mpi()) {
        fprintf(stderr, "skipped: run under mpirun -np N (N >= 2) in a build with MPI\n");
        return 77;
    }
    rank = env.rank;
    int tp = argc > 1 ? atoi(argv[1]) : env.world_size;
    job j;
    MUST(gpc_dist_create(&j.world, &env, gpc_cpu(), "mpi"));
    MUST(gpc_dist_layout_make(j.world->world_size, rank, tp, 1, &j.lay));
    /* tp: the ranks of one data-parallel place; dp: one rank of each tp place */
    MUST(gpc_dist_split(j.world, j.lay.dp_rank, j.lay.tp_rank, &j.tp));
    MUST(gpc_dist_split(j.world, j.lay.tp_rank, j.lay.dp_rank, &j.dp));
    CHECK(j.tp->rank == j.lay.tp_rank && j.tp->world_size == tp, "tp group: rank %d of %d",
          j.tp->rank, j.tp->world_size);
    CHECK(j.dp->rank == j.lay.dp_rank && j.dp->world_size == j.lay.dp, "dp group: rank %d of %d",
          j.dp->rank, j.dp->world_size);

    uint64_t seed = 1;
    const char *fixed = getenv("GPC_TEST_SEED");
    double s0 = fixed ? (double)strtoull(fixed, NULL, 10)
                      : (double)((uint64_t)(gpc_time_seconds() * 1e6) % 1000000007u);
    double from0 = rank == 0 ? s0 : 0;
    MUST(j.world->ops->all_reduce_host(j.world, &from0, 1));
    seed = (uint64_t)from0;
    if (rank == 0)
        printf("tp %d x dp %d, seed %llu (set GPC_TEST_SEED to repeat)\n", tp, j.lay.dp,
               (unsigned long long)seed);

    /* a layout that does not divide the model is refused with a message */
    gpt_config odd;
    MUST(gpt_config_init(&odd, L, 3, 48, T, V));
    gpt_model *bad = NULL;
    CHECK(gpt_create_tp(&bad, &odd, gpc_cpu(), GPC_F32, B, T, 0, 2, 0, 0, SIZE_MAX) != GPC_OK &&
              strstr(gpc_last_error(), "does not divide") != NULL,
          "3 heads over tp 2 were not refused clearly: %s", gpc_last_error());
    gpc_dist_layout none;
    CHECK(gpc_dist_layout_make(6, 0, 4, 1, &none) != GPC_OK &&
              strstr(gpc_last_error(), "not a multiple") != NULL,
          "6 ranks over tp 4 were not refused clearly: %s", gpc_last_error());

    MUST(gpt_config_init(&j.c, L, NH, C, T, V));
    size_t P = gpt_config_num_params(&j.c), Pl = gpt_tp_num_params(&j.c, tp);
    gpt_model *m = tp_model(&j), *whole;
    MUST(gpt_create(&whole, &j.c, gpc_cpu(), GPC_F32, B, T, 1));
    MUST(gpt_init_weights(m, seed));
    MUST(gpt_init_weights(whole, seed));
    CHECK(gpt_num_params(m) == Pl, "%zu local parameters, expected %zu", gpt_num_params(m), Pl);
    {
        float *w = params_of(whole), *want = slice_of(&j, w), *got = params_of(m);
        CHECK(memcmp(got, want, Pl * sizeof *got) == 0, "initial slices differ from the whole's");
        free(w), free(want), free(got);
    }
    gpc_ddp *ddp = NULL;
    gpc_ddp_options o = {.zero = 0, .bucket_mb = 0.01};
    if (j.lay.dp > 1) MUST(gpc_ddp_create(&ddp, m, j.dp, &o));

    /* a folder rank 0 makes, named to every rank */
    char dir[64] = "/tmp/gpc_tp_test_XXXXXX";
    if (rank == 0 && !mkdtemp(dir)) MUST(gpc_error(GPC_ERR_IO, "mkdtemp failed"));
    MUST(gpc_dist_mpi_bcast_bytes(dir, sizeof dir));
    char path_tp[128], path_whole[128];
    snprintf(path_tp, sizeof path_tp, "%s/tp.bin", dir);
    snprintf(path_whole, sizeof path_whole, "%s/whole.bin", dir);

    gpc_rng rng;
    gpc_rng_seed(&rng, seed, 5);
    size_t rows = (size_t)j.lay.dp * B * T;
    int32_t *in = malloc(rows * sizeof *in), *tg = malloc(rows * sizeof *tg);
    gpt_model *from_tp = NULL; /* a whole model resumed from the tp checkpoint */
    gpt_model *resumed = NULL; /* a tp model resumed from the whole one's */
    gpc_ddp *resumed_ddp = NULL;
    for (int s = 1; s <= STEPS; s++) {
        for (size_t i = 0; i < rows; i++) { /* the same global batch on every rank */
            in[i] = (int32_t)gpc_rng_below(&rng, V);
            tg[i] = i % 11 == 5 ? -1 : (int32_t)gpc_rng_below(&rng, V);
        }
        gpt_model *wholes[2] = {whole, from_tp}, *tps[2] = {m, resumed};
        gpc_ddp *ddps[2] = {ddp, resumed_ddp};
        step(&j, s, tps, ddps, resumed ? 2 : 1, wholes, from_tp ? 2 : 1, in, tg);
        if (s != SAVE_AT) continue;
        gpt_checkpoint_state st;
        memset(&st, 0, sizeof st);
        st.step = (uint64_t)s;
        gpt_host_state full;
        MUST(gpc_tp_gather_full(m, j.tp, &full));
        if (rank == 0) {
            MUST(gpt_checkpoint_save_full(path_tp, m, &st, &full));
            MUST(gpt_checkpoint_save(path_whole, whole, &st));
        }
        gpt_host_state_free(&full);
        MUST(j.world->ops->barrier(j.world));
        /* saved at tp, resumed at 1: the single process's state */
        MUST(gpt_create(&from_tp, &j.c, gpc_cpu(), GPC_F32, B, T, 1));
        MUST(gpt_checkpoint_load(path_tp, from_tp, NULL));
        float *got = params_of(from_tp), *want = params_of(whole);
        double e = norm_error(got, want, P);
        double em = norm_error(moment(from_tp, 0), moment(whole, 0), P);
        double ev = norm_error(moment(from_tp, 1), moment(whole, 1), P);
        CHECK(e < 1e-5 && em < 1e-4 && ev < 1e-4,
              "tp checkpoint at tp 1: parameters %.2e, m %.2e, v %.2e from one process's", e, em,
              ev);
        free(got), free(want);
        /* saved at 1, resumed at tp: a fresh model, its slices the file's */
        resumed = tp_model(&j);
        MUST(gpt_checkpoint_load(path_whole, resumed, NULL));
        float *w = params_of(whole), *slice = slice_of(&j, w), *mine = params_of(resumed);
        CHECK(memcmp(mine, slice, Pl * sizeof *mine) == 0,
              "slices loaded from a tp 1 checkpoint differ from the file's");
        free(w), free(slice), free(mine);
        if (j.lay.dp > 1) MUST(gpc_ddp_create(&resumed_ddp, resumed, j.dp, &o));
    }

    float *w = params_of(whole), *want = slice_of(&j, w), *got = params_of(m);
    float *got2 = params_of(resumed), *w2 = params_of(from_tp);
    double e = norm_error(got, want, Pl), e1 = norm_error(got2, want, Pl);
    double e2 = norm_error(w2, w, P);
    CHECK(e < 1e-4, "after %d steps the slices differ from one process's by %.2e", STEPS, e);
    CHECK(e1 < 1e-4, "the tp model resumed from tp 1 differs from one process's by %.2e", e1);
    CHECK(e2 < 1e-4, "the model resumed at tp 1 differs from one process's by %.2e", e2);
    printf("rank %d (tp %d/%d, dp %d/%d): after %d steps the slices are within %.1e of one "
           "process's; resumed at tp %d within %.1e, at tp 1 within %.1e\n",
           rank, j.lay.tp_rank, tp, j.lay.dp_rank, j.lay.dp, STEPS, e, tp, e1, e2);
    free(w), free(want), free(got), free(got2), free(w2);

    double failed = failures;
    MUST(j.world->ops->all_reduce_host(j.world, &failed, 1));
    if (rank == 0) {
        unlink(path_tp);
        unlink(path_whole);
        rmdir(dir);
    }
    gpc_ddp_free(ddp);
    gpc_ddp_free(resumed_ddp);
    gpt_free(m);
    gpt_free(resumed);
    gpt_free(whole);
    gpt_free(from_tp);
    free(in), free(tg);
    gpc_dist_destroy(j.dp);
    gpc_dist_destroy(j.tp);
    gpc_dist_destroy(j.world);
    if (rank == 0)
        printf(failed > 0 ? "%g failure(s)\n" : "tensor parallelism over MPI: all checks passed\n",
               failed);
    return failed > 0 ? 1 : 0;
}
