/*
 * test_zero_shard_gpu.c: ZeRO-1's sharded optimizer in bf16 and fp16 on one
 * GPU against the unsharded update. The ranks are emulated: one whole model
 * and one model per rank holding only its shard of master weights, m and v
 * (gpt_create_shard), all on the same GPU. Each step the whole model
 * computes the gradients; every shard model gets the whole model's
 * parameters (what the all-gather leaves) and gradients (what the
 * reduce-scatter leaves, over its shard), and steps its shard with
 * gpt_update_span, the norm's all-reduce standing in as the whole
 * gradient's sum of squares (the same two-pass reduction the whole model
 * runs, so the same bits).
 *
 * With rounding to nearest each shard's master weights and compute-dtype
 * parameters equal the whole model's bit for bit. With stochastic rounding
 * the master weights still do, and the bf16 copies are within one bf16
 * step: a shard's launch starts its rounding hash at its own first element.
 * fp16: an overflow forced by a huge loss scale is skipped on every shard
 * and the scale halves everywhere. The memory each shard model saves is the
 * three f32 arrays of the elements it does not own.
 *
 * Without a usable GPU the test exits 77 (CTest: skipped).
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/dist.h"
#include "gpc/model.h"
#include "ops/ops.h"

static const gpc_device gpu = {GPC_DEVICE_CUDA, 0};
static gpc_rng rng;

enum { B = 2, T = 64, V = 300, MAX_WORLD = 4 };

/* The norm's all-reduce, emulated: the sum of squares of the whole
 * gradient, which the ranks' shard sums add up to. */
static gpc_status whole_norm(void *user, gpc_tensor *norm_sq) {
    const gpc_tensor *grads = user;
    GPC_TRY(gpc_tensor_zero(norm_sq));
    return gpc_op_sum_squares(norm_sq, grads);
}

/* Overwrites a model's flat buffer with another's (the collectives' work). */
static void copy_flat(const gpc_tensor *dst, const gpc_tensor *src) {
    gpc_tensor to = *dst;
    TEST_OK(gpc_tensor_copy(&to, src));
}

static void low_params(const gpt_model *m, void *out) {
    gpc_tensor host = gpc_tensor_1d(out, gpt_dtype(m), gpc_cpu(), (int64_t)gpt_num_params(m));
    TEST_OK(gpc_tensor_copy(&host, gpt_params_flat(m)));
}

static void check_shards(gpc_dtype dtype, int world, uint32_t round_seed) {
    gpt_config c;
    TEST_OK(gpt_config_init(&c, 2, 2, 128, T, V));
    uint64_t seed = gpc_rng_u32(&rng);
    gpt_model *whole = NULL, *shard[MAX_WORLD];
    TEST_OK(gpt_create(&whole, &c, gpu, dtype, B, T, 1));
    TEST_OK(gpt_init_weights(whole, seed));
    size_t P = gpt_num_params(whole), off[MAX_WORLD + 1];
    gpc_dist_shard_offsets(P, world, 64, off);
    for (int r = 0; r < world; r++) {
        size_t S = off[r + 1] - off[r];
        TEST_OK(gpt_create_shard(&shard[r], &c, gpu, dtype, B, T, 0, off[r], S));
        TEST_OK(gpt_init_weights(shard[r], seed));
        assert_int_equal(gpc_optim_state_count(gpt_optimizer(shard[r])), S);
        /* master, m and v of the P - S elements it does not own, give or
         * take the arena's 256-byte alignment of each */
        double saved = (double)gpt_memory_bytes(whole) - (double)gpt_memory_bytes(shard[r]);
        double want = (dtype == GPC_F32 ? 8.0 : 12.0) * (double)(P - S);
        if (fabs(saved - want) > 3 * 256)
            fail_msg("rank %d of %d: %.0f bytes saved, expected %.0f", r, world, saved, want);
    }
    float *master = malloc(P * sizeof *master), *mine = malloc(P * sizeof *mine);
    size_t es = gpc_dtype_size(dtype);
    uint16_t *low = malloc(P * es), *low_mine = malloc(P * es);
    int32_t in[B * T], tg[B * T];
    for (int step = 1; step <= 4; step++) {
        for (int i = 0; i < B * T; i++) {
            in[i] = (int32_t)gpc_rng_below(&rng, V);
            tg[i] = (int32_t)gpc_rng_below(&rng, V);
        }
        int overflow = dtype == GPC_F16 && step == 3;
        if (overflow) { /* dlogits ~ 1e9 / (B*T), far beyond fp16's 65504 */
            gpt_set_loss_scale(whole, 1e9f);
            for (int r = 0; r < world; r++)
                gpt_set_loss_scale(shard[r], 1e9f);
        }
        TEST_OK(gpt_zero_grad(whole));
        TEST_OK(gpt_forward_backward(whole, in, tg, B, T, 1.0f / (B * T)));
        gpc_optim_options o;
        gpc_optim_defaults(&o);
        o.learning_rate = 1e-3f;
        o.step = step;
        o.seed = round_seed ? round_seed + (uint32_t)step : 0;
        const gpc_tensor *grads = gpt_grads_flat(whole);
        for (int r = 0; r < world; r++) {
            copy_flat(gpt_params_flat(shard[r]), gpt_params_flat(whole));
            copy_flat(gpt_grads_flat(shard[r]), grads);
            TEST_OK(gpt_update_span(shard[r], &o, off[r], off[r + 1], whole_norm, (void *)grads,
                                    NULL, NULL));
        }
        TEST_OK(gpt_update(whole, &o, NULL, NULL));
        float norm, norm_mine;
        TEST_OK(gpt_read_step(whole, NULL, &norm));
        TEST_OK(gpt_get_params(whole, master));
        low_params(whole, low);
        int skipped = gpt_step_skipped(whole);
        if (overflow) assert_true(skipped);
        for (int r = 0; r < world; r++) {
            size_t lo = off[r], n = off[r + 1] - lo;
            TEST_OK(gpt_read_step(shard[r], NULL, &norm_mine));
            assert_int_equal(gpt_step_skipped(shard[r]), skipped);
            assert_true(gpt_loss_scale(shard[r]) == gpt_loss_scale(whole));
            assert_true(skipped ? isnan(norm_mine) : norm_mine == norm);
            TEST_OK(gpt_get_params(shard[r], mine));
            if (memcmp(mine + lo, master + lo, n * sizeof *mine) != 0)
                fail_msg("%s, %d ranks, step %d: rank %d's master weights differ from the "
                         "unsharded update's",
                         gpc_dtype_name(dtype), world, step, r);
            low_params(shard[r], low_mine);
            if (!round_seed && memcmp((char *)low_mine + lo * es, (char *)low + lo * es, n * es))
                fail_msg("%s, %d ranks, step %d: rank %d's parameters differ from the unsharded "
                         "update's",
                         gpc_dtype_name(dtype), world, step, r);
            for (size_t e = lo; round_seed && es == 2 && e < lo + n; e++) {
                int ulps = abs((int)low_mine[e] - (int)low[e]);
                if (ulps > 1)
                    fail_msg("%s, %d ranks, step %d: rank %d's parameter %zu is %#x, the "
                             "unsharded update's %#x",
                             gpc_dtype_name(dtype), world, step, r, e, low_mine[e], low[e]);
            }
        }
        if (overflow) { /* back to a scale that trains */
            assert_true(gpt_loss_scale(whole) == 5e8f);
            gpt_set_loss_scale(whole, 1024.0f);
            for (int r = 0; r < world; r++)
                gpt_set_loss_scale(shard[r], 1024.0f);
        }
    }
    for (int r = 0; r < world; r++)
        gpt_free(shard[r]);
    gpt_free(whole);
    free(master), free(mine), free(low), free(low_mine);
}

static void test_bf16_two_ranks(void **state) {
    (void)state;
    check_shards(GPC_BF16, 2, 0);
}

static void test_bf16_three_ranks_stochastic(void **state) {
    (void)state;
    check_shards(GPC_BF16, 3, 7);
}

static void test_f16_four_ranks(void **state) {
    (void)state;
    check_shards(GPC_F16, 4, 0);
}

int main(void) {
    if (!gpc_backend_get(GPC_DEVICE_CUDA)) {
        fprintf(stderr, "skipped: %s\n", gpc_last_error());
        return 77;
    }
    gpc_rng_seed(&rng, test_seed(), 9);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_two_ranks),
        cmocka_unit_test(test_bf16_three_ranks_stochastic),
        cmocka_unit_test(test_f16_four_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
