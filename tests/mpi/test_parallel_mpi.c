/*
 * test_parallel_mpi.c: tensor and pipeline parallelism, alone and with data
 * parallelism, over MPI on the CPU, run by CTest as `mpirun -np N
 * test_parallel_mpi TP PP [RECOMPUTE]`: the N ranks form N/(TP*PP) data-parallel
 * copies of a model cut into TP slices and PP stages (gpc_dist_layout_make,
 * gpc_dist_split). Every rank also trains one whole model on the whole
 * global batch, the single-process run, and compares. With RECOMPUTE
 * (e.g. "block", every block of each stage) the parts recompute and the
 * whole models keep everything: recomputation rebuilds each value by the
 * ops forward ran, so the comparisons below hold as they are.
 *
 * Checked, over 10 AdamW steps of M = 4 micro-batches (the pipeline's
 * 1F1B schedule when PP > 1), with a checkpoint after step 5:
 *  - each step's gradient norm and mean loss equal the single process's;
 *  - the checkpoint gathered from the parts (gpc_tp_gather_full) loads
 *    into a whole model equal to the single process's (saved at TP x PP,
 *    resumed on one process), which then trains on alike;
 *  - a fresh part loads the single process's checkpoint (saved on one
 *    process, resumed at TP x PP): its values equal the file's exactly,
 *    and it trains on to the single process's parameters;
 *  - after 10 steps every rank's part equals the single process's, and so
 *    do its validation loss, its last logits and a decode (check_eval);
 *  - the pipeline's measured bubble is reported beside (P-1)/(M+P-1).
 * The bound: the tp all-reduce sums C/TP-long partial dot products that
 * one process sums in one pass, data parallelism and the stages' tied
 * embedding sum gradients in another order: each product differs by a few
 * f32 roundings (1e-7 relative), which AdamW's steps carry. Measured
 * norm-wise differences after 10 steps stay under 2e-6; the bound is 1e-4,
 * while a missing all-reduce or a wrong slice moves them by 1e-2 or more.
 * Losses agree within 1e-5. Gradient norms get 1e-4 too: AdamW divides by
 * the root of the second moment, so a last-bit difference in a gradient
 * near zero moves its weight by up to the learning rate, and the norms of
 * later steps differ by up to about 1e-5 relative (seen once in a few
 * hundred seeds).
 * Exits 77 outside mpirun or in a build without MPI.
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

enum { L = 4, T = 16, V = 97, B = 2, M = 4, STEPS = 10, SAVE_AT = 5 };

/* 4 heads of 8 channels; 3 of 16 for a tp of 3, which divides the heads
 * but not the 128 padded vocabulary rows (its last slice runs past them) */
static int NH = 4, C = 32;
static int failures, rank, recompute;

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

typedef struct {
    gpc_dist *world, *tp, *pp, *dp, *model; /* model: the tp x pp ranks of one copy */
    gpc_dist_layout lay;
    gpt_parallel par;
    gpt_config c;
} job;

/* This rank's part, its hooks set. */
static gpt_model *part(const job *j) {
    gpt_model *m;
    MUST(gpt_create_part(&m, &j->c, gpc_cpu(), GPC_F32, B, T, recompute, &j->par, 0, SIZE_MAX));
    MUST(gpc_tp_attach(m, j->tp));
    MUST(gpc_pipeline_attach(m, j->pp));
    return m;
}

static float *params_of(const gpt_model *m) {
    float *w = malloc(gpt_num_params(m) * sizeof *w);
    MUST(gpt_get_params(m, w));
    return w;
}

/* The whole model's values with this rank's part written over them: equal
 * to `whole` exactly when the part holds the same values (the tensors a
 * stage does not train are left out). */
static double part_error(const job *j, const gpt_model *m, const float *whole) {
    size_t P = gpt_config_num_params(&j->c);
    float *mine = params_of(m), *merged = malloc(P * sizeof *merged);
    memcpy(merged, whole, P * sizeof *merged);
    gpt_part_unslice(&j->c, &j->par, mine, merged);
    double e = norm_error(merged, whole, P);
    free(mine), free(merged);
    return e;
}

/* One optimizer step of the parts (through the pipeline when PP > 1, and
 * ddp when there are data-parallel copies) and of the whole models on the
 * whole batch; every model's norm and loss are compared with the first
 * whole one's. The batch: dp copies x M micro-batches of B x T. */
static void step(const job *j, int s, gpt_model **parts, gpc_ddp **ddp, int nparts,
                 gpt_model **whole, int wholes, const int32_t *in, const int32_t *tg,
                 gpc_pipeline_timing *timing) {
    size_t micro = (size_t)B * T, rows = (size_t)j->lay.dp * M * micro;
    size_t mine = (size_t)j->lay.dp_rank * M * micro;
    float dloss = 1.0f / (float)rows;
    gpc_optim_options adam;
    gpc_optim_defaults(&adam);
    adam.learning_rate = 1e-3f;
    adam.step = s;
    float want_loss = 0, want_norm = 0;
    for (int w = 0; w < wholes; w++) {
        MUST(gpt_zero_grad(whole[w]));
        for (size_t r = 0; r < rows / micro; r++)
            MUST(gpt_forward_backward(whole[w], in + r * micro, tg + r * micro, B, T, dloss));
        MUST(gpt_update(whole[w], &adam, NULL, NULL));
        float loss, norm;
        MUST(gpt_read_step(whole[w], &loss, &norm));
        if (w == 0) want_loss = loss, want_norm = norm;
        CHECK(fabs(norm - want_norm) <= 1e-4 * want_norm && fabs(loss - want_loss) <= 1e-5 * loss,
              "step %d: the whole model resumed from parts has norm %.9g and loss %.9g, one "
              "process %.9g and %.9g",
              s, (double)norm, (double)loss, (double)want_norm, (double)want_loss);
    }
    for (int k = 0; k < nparts; k++) {
        gpt_model *m = parts[k];
        MUST(gpt_zero_grad(m));
        if (j->lay.pp > 1) {
            MUST(gpc_pipeline_step(m, j->pp, ddp[k], in + mine, tg + mine, M, B, T, dloss, timing));
        } else {
            for (int i = 0; i < M; i++) {
                if (ddp[k]) MUST(gpc_ddp_micro_step(ddp[k], i == M - 1));
                MUST(gpt_forward_backward(m, in + mine + i * micro, tg + mine + i * micro, B, T,
                                          dloss));
            }
            if (ddp[k]) MUST(gpc_ddp_finish_backward(ddp[k]));
        }
        MUST(ddp[k] ? gpc_ddp_update(ddp[k], &adam, NULL) : gpt_update(m, &adam, NULL, NULL));
        float loss, norm;
        MUST(gpt_read_step(m, &loss, &norm));
        /* the loss is the last stage's; the copies' losses weighted by tokens */
        int64_t unmasked = 0;
        for (size_t i = mine; i < mine + M * micro; i++)
            unmasked += tg[i] >= 0;
        int last = j->lay.pp_rank == j->lay.pp - 1;
        double sums[2] = {last ? (double)loss * (double)unmasked : 0, last ? (double)unmasked : 0};
        MUST(j->pp->ops->all_reduce_host(j->pp, sums, 2));
        MUST(j->dp->ops->all_reduce_host(j->dp, sums, 2));
        double got_loss = sums[0] / sums[1];
        CHECK(fabs(norm - want_norm) <= 1e-4 * want_norm,
              "step %d, part %d: gradient norm %.9g, one process %.9g", s, k, (double)norm,
              (double)want_norm);
        CHECK(fabs(got_loss - want_loss) <= 1e-5 * want_loss,
              "step %d, part %d: loss %.9g, one process %.9g", s, k, got_loss, (double)want_loss);
    }
}

/* Validation and sampling through the parts, after training: one batch's
 * mean loss (through the stages with gpc_pipeline_eval, else gpt_forward)
 * and, without stages, the last position's logits (each tp slice's
 * gathered), and a decode over kept keys and values (gpt_forward_cached),
 * equal the whole model's. The parts' parameters are within 1e-7 of the
 * whole's, so losses agree within 1e-5 and logits within 1e-4 norm-wise. */
static void check_eval(const job *j, gpt_model *m, gpt_model *whole, const int32_t *in,
                       const int32_t *tg) {
    float want, got;
    MUST(gpt_forward(whole, in, tg, B, T));
    MUST(gpt_mean_loss(whole, &want));
    if (j->lay.pp > 1) {
        MUST(gpc_pipeline_eval(m, j->pp, in, tg, B, T, &got));
    } else {
        MUST(gpt_forward(m, in, tg, B, T));
        MUST(gpt_mean_loss(m, &got));
    }
    CHECK(fabsf(got - want) <= 1e-5f * want, "validation loss %.9g, one process %.9g", (double)got,
          (double)want);
    if (j->lay.pp > 1) return;
    float *a = malloc((size_t)B * V * sizeof *a), *b = malloc((size_t)B * V * sizeof *b);
    MUST(gpt_forward_last_logits(whole, in, B, T, b));
    MUST(gpt_forward_last_logits(m, in, B, T, a));
    double e = norm_error(a, b, (size_t)B * V);
    CHECK(e < 1e-4, "the last position's logits differ from one process's by %.2e", e);
    /* T - 1 positions, then one more over the kept keys and values (or,
     * where blocks are recomputed, over the whole sequence again) */
    MUST(gpt_forward_cached(whole, in, 0, T - 1, b));
    MUST(gpt_forward_cached(m, in, 0, T - 1, a));
    MUST(gpt_forward_cached(whole, in + T - 1, T - 1, 1, b + V));
    MUST(gpt_forward_cached(m, in + T - 1, T - 1, 1, a + V));
    double ec = norm_error(a, b, (size_t)2 * V);
    CHECK(ec < 1e-4, "decoded logits differ from one process's by %.2e", ec);
    free(a), free(b);
}

/* The optimizer's m and v of a whole model, [num_params] each. */
static const float *moment(const gpt_model *m, int which) {
    const gpc_optim *o = gpt_optimizer(m);
    return (const float *)(which ? gpc_optim_v(o) : gpc_optim_m(o))->data;
}

/* Layouts that do not fit are refused with a message that names the fix. */
static void check_errors(void) {
    gpt_config odd;
    MUST(gpt_config_init(&odd, 3, 3, 48, T, V));
    gpt_model *bad = NULL;
    gpt_parallel tp2 = {2, 0, 1, 0, 1}, pp2 = {1, 0, 2, 0, 2};
    CHECK(gpt_create_part(&bad, &odd, gpc_cpu(), GPC_F32, B, T, 0, &tp2, 0, SIZE_MAX) != GPC_OK &&
              strstr(gpc_last_error(), "--tp 2 does not divide the model's 3 attention heads"),
          "3 heads over tp 2 were not refused clearly: %s", gpc_last_error());
    CHECK(gpt_create_part(&bad, &odd, gpc_cpu(), GPC_F32, B, T, 0, &pp2, 0, SIZE_MAX) != GPC_OK &&
              strstr(gpc_last_error(), "--pp 2 does not divide the model's 3 layers"),
          "3 layers over pp 2 were not refused clearly: %s", gpc_last_error());
    gpc_dist_layout none;
    CHECK(gpc_dist_layout_make(6, 0, 2, 2, &none) != GPC_OK &&
              strstr(gpc_last_error(), "6 processes are not a multiple of --tp 2 x --pp 2"),
          "6 ranks over tp 2 x pp 2 were not refused clearly: %s", gpc_last_error());
}

int main(int argc, char **argv) {
    gpc_dist_env env;
    if (gpc_dist_env_from_process(&env) != GPC_OK || env.world_size < 2 || !gpc_dist_have_mpi()) {
        fprintf(stderr, "skipped: run under mpirun -np N (N >= 2) in a build with MPI\n");
        return 77;
    }
    rank = env.rank;
    int tp = argc > 1 ? atoi(argv[1]) : env.world_size, pp = argc > 2 ? atoi(argv[2]) : 1;
    if (tp % 3 == 0) NH = 3, C = 48;
    if (argc > 3) MUST(gpt_recompute_parse(argv[3], &recompute));
    job j;
    MUST(gpc_dist_create(&j.world, &env, gpc_cpu(), "mpi"));
    gpc_dist_layout *lay = &j.lay;
    MUST(gpc_dist_layout_make(j.world->world_size, rank, tp, pp, lay));
    int place = lay->pp_rank * tp + lay->tp_rank; /* in the model's tp x pp ranks */
    MUST(gpc_dist_split(j.world, lay->dp_rank * pp + lay->pp_rank, lay->tp_rank, &j.tp));
    MUST(gpc_dist_split(j.world, lay->dp_rank * tp + lay->tp_rank, lay->pp_rank, &j.pp));
    MUST(gpc_dist_split(j.world, place, lay->dp_rank, &j.dp));
    MUST(gpc_dist_split(j.world, lay->dp_rank, place, &j.model));
    j.par = (gpt_parallel){tp, lay->tp_rank, pp, lay->pp_rank, pp - lay->pp_rank};
    CHECK(j.tp->rank == lay->tp_rank && j.pp->rank == lay->pp_rank && j.dp->rank == lay->dp_rank &&
              j.model->rank == place,
          "groups: tp %d, pp %d, dp %d, model %d", j.tp->rank, j.pp->rank, j.dp->rank,
          j.model->rank);

    double s0 = getenv("GPC_TEST_SEED")
                    ? (double)strtoull(getenv("GPC_TEST_SEED"), NULL, 10)
                    : (double)((uint64_t)(gpc_time_seconds() * 1e6) % 1000000007u);
    double from0 = rank == 0 ? s0 : 0;
    MUST(j.world->ops->all_reduce_host(j.world, &from0, 1));
    uint64_t seed = (uint64_t)from0;
    if (rank == 0)
        printf("tp %d x pp %d x dp %d, %d micro-batches, recompute %s, seed %llu (set "
               "GPC_TEST_SEED to repeat)\n",
               tp, pp, lay->dp, M, argc > 3 ? argv[3] : "0", (unsigned long long)seed);
    check_errors();

    MUST(gpt_config_init(&j.c, L, NH, C, T, V));
    size_t P = gpt_config_num_params(&j.c);
    gpt_model *m = part(&j), *whole;
    MUST(gpt_create(&whole, &j.c, gpc_cpu(), GPC_F32, B, T, 1));
    MUST(gpt_init_weights(m, seed));
    MUST(gpt_init_weights(whole, seed));
    CHECK(gpt_num_params(m) == gpt_part_num_params(&j.c, &j.par), "%zu local parameters",
          gpt_num_params(m));
    /* the vocabulary-parallel wte: this rank's rows only */
    CHECK(gpt_param_offsets(m)[1] == (size_t)gpt_tp_vocab_rows(&j.c, tp) * (size_t)C &&
              gpt_tp_vocab_rows(&j.c, tp) * tp >= j.c.padded_vocab &&
              gpt_tp_vocab_rows(&j.c, tp) < j.c.padded_vocab / tp + 8,
          "wte holds %zu elements, %lld rows of %d", gpt_param_offsets(m)[1],
          (long long)gpt_tp_vocab_rows(&j.c, tp), j.c.padded_vocab);
    {
        float *w = params_of(whole);
        CHECK(part_error(&j, m, w) == 0, "the initial part differs from the whole's");
        free(w);
    }
    gpc_ddp *ddp = NULL;
    gpc_ddp_options o = {.zero = 0, .bucket_mb = 0.01};
    if (lay->dp > 1) MUST(gpc_ddp_create(&ddp, m, j.dp, &o));

    /* a folder rank 0 makes, named to every rank */
    char dir[64] = "/tmp/gpc_parallel_test_XXXXXX";
    if (rank == 0 && !mkdtemp(dir)) MUST(gpc_error(GPC_ERR_IO, "mkdtemp failed"));
    MUST(gpc_dist_mpi_bcast_bytes(dir, sizeof dir));
    char path_part[128], path_whole[128];
    snprintf(path_part, sizeof path_part, "%s/part.bin", dir);
    snprintf(path_whole, sizeof path_whole, "%s/whole.bin", dir);

    gpc_rng rng;
    gpc_rng_seed(&rng, seed, 5);
    size_t rows = (size_t)lay->dp * M * B * T;
    int32_t *in = malloc(rows * sizeof *in), *tg = malloc(rows * sizeof *tg);
    gpt_model *from_parts = NULL; /* a whole model resumed from the parts' checkpoint */
    gpt_model *resumed = NULL;    /* a part resumed from the whole one's */
    gpc_ddp *resumed_ddp = NULL;
    gpc_pipeline_timing timing = {0}, sum = {0};
    for (int s = 1; s <= STEPS; s++) {
        for (size_t i = 0; i < rows; i++) { /* the same global batch on every rank */
            in[i] = (int32_t)gpc_rng_below(&rng, V);
            tg[i] = i % 11 == 5 ? -1 : (int32_t)gpc_rng_below(&rng, V);
        }
        gpt_model *wholes[2] = {whole, from_parts}, *parts[2] = {m, resumed};
        gpc_ddp *ddps[2] = {ddp, resumed_ddp};
        step(&j, s, parts, ddps, resumed ? 2 : 1, wholes, from_parts ? 2 : 1, in, tg, &timing);
        sum.step_s += timing.step_s;
        sum.compute_s += timing.compute_s;
        if (s != SAVE_AT) continue;
        gpt_checkpoint_state st;
        memset(&st, 0, sizeof st);
        st.step = (uint64_t)s;
        if (lay->dp_rank == 0) { /* one copy's parts make the file */
            gpt_host_state full;
            MUST(gpc_tp_gather_full(m, j.model, NULL, &full));
            if (rank == 0) MUST(gpt_checkpoint_save_full(path_part, m, &st, &full));
            gpt_host_state_free(&full);
        }
        if (rank == 0) MUST(gpt_checkpoint_save(path_whole, whole, &st));
        MUST(j.world->ops->barrier(j.world));
        /* saved in parts, resumed on one process: the single process's state */
        MUST(gpt_create(&from_parts, &j.c, gpc_cpu(), GPC_F32, B, T, 1));
        MUST(gpt_checkpoint_load(path_part, from_parts, NULL));
        float *got = params_of(from_parts), *want = params_of(whole);
        double e = norm_error(got, want, P);
        double em = norm_error(moment(from_parts, 0), moment(whole, 0), P);
        double ev = norm_error(moment(from_parts, 1), moment(whole, 1), P);
        CHECK(e < 1e-5 && em < 1e-4 && ev < 1e-4,
              "the parts' checkpoint on one process: parameters %.2e, m %.2e, v %.2e from one "
              "process's",
              e, em, ev);
        free(got);
        /* saved on one process, resumed in parts: a fresh part holds the file's values */
        resumed = part(&j);
        MUST(gpt_checkpoint_load(path_whole, resumed, NULL));
        CHECK(part_error(&j, resumed, want) == 0,
              "a part loaded from a one-process checkpoint differs from the file's");
        free(want);
        if (lay->dp > 1) MUST(gpc_ddp_create(&resumed_ddp, resumed, j.dp, &o));
    }

    check_eval(&j, m, whole, in, tg);
    float *w = params_of(whole), *w2 = params_of(from_parts);
    double e = part_error(&j, m, w), e1 = part_error(&j, resumed, w), e2 = norm_error(w2, w, P);
    CHECK(e < 1e-4, "after %d steps the part differs from one process's by %.2e", STEPS, e);
    CHECK(e1 < 1e-4, "the part resumed from one process differs from one process's by %.2e", e1);
    CHECK(e2 < 1e-4, "the parts' checkpoint resumed on one process differs by %.2e", e2);
    printf("rank %d (tp %d/%d, pp %d/%d, dp %d/%d): after %d steps the part is within %.1e of "
           "one process's; resumed in parts within %.1e, on one process within %.1e",
           rank, lay->tp_rank, tp, lay->pp_rank, pp, lay->dp_rank, lay->dp, STEPS, e, e1, e2);
    if (pp > 1)
        printf("; pipeline bubble %.0f%% measured, %.0f%% predicted",
               100.0 * (1.0 - sum.compute_s / sum.step_s), 100.0 * timing.predicted);
    printf("\n");
    free(w), free(w2);

    double failed = failures;
    MUST(j.world->ops->all_reduce_host(j.world, &failed, 1));
    if (rank == 0) {
        unlink(path_part);
        unlink(path_whole);
        rmdir(dir);
    }
    gpc_ddp_free(ddp);
    gpc_ddp_free(resumed_ddp);
    gpt_free(m);
    gpt_free(resumed);
    gpt_free(whole);
    gpt_free(from_parts);
    free(in), free(tg);
    gpc_dist_destroy(j.model);
    gpc_dist_destroy(j.dp);
    gpc_dist_destroy(j.pp);
    gpc_dist_destroy(j.tp);
    gpc_dist_destroy(j.world);
    if (rank == 0)
        printf(failed > 0 ? "%g failure(s)\n" : "model parallelism over MPI: all checks passed\n",
               failed);
    return failed > 0 ? 1 : 0;
}
