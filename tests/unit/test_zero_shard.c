/* test_zero_shard.c: ZeRO-1 models that hold one shard of the optimizer
 * state (gpt_create_shard): the memory each rank saves is exactly the f32
 * m and v of the elements it does not own, and agrees with gpc plan; a
 * whole checkpoint loads into the shards of any world size (each keeps its
 * slice); the shards gathered on the host write the same checkpoint as the
 * whole model; and the misuses fail with their messages. */
#include "testutil.h"

#include "gpc/dist.h"
#include "gpc/model.h"
#include "gpc/plan.h"

#include <stdio.h>
#include <string.h>

#define ALIGN 256u /* gpc_arena's alignment */

static size_t align_up(size_t bytes) {
    return (bytes + ALIGN - 1) / ALIGN * ALIGN;
}

/* Bytes the parameter arena gives to m and v for n elements: m padded to
 * the alignment, v last and unpadded (the arena measures its peak). */
static size_t moments_bytes(size_t n) {
    return align_up(n * sizeof(float)) + n * sizeof(float);
}

static void random_config(gpc_rng *rng, gpt_config *c, int *B, int *T) {
    int layers = 1 + (int)gpc_rng_below(rng, 3), heads = 1 + (int)gpc_rng_below(rng, 3);
    int channels = heads * 8 * (1 + (int)gpc_rng_below(rng, 2));
    *T = 4 + (int)gpc_rng_below(rng, 20);
    *B = 1 + (int)gpc_rng_below(rng, 3);
    TEST_OK(gpt_config_init(c, layers, heads, channels, *T, 50 + (int)gpc_rng_below(rng, 300)));
}

/* Every rank of N world sizes: memory drops by m and v of the elements it
 * does not hold, the shards cover the model once, and rank 0 (the largest
 * shard) is what gpc plan --zero 1 --gpus N predicts per GPU. */
static void test_shard_memory_matches_plan(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 41);
    for (int trial = 0; trial < 4; trial++) {
        gpt_config c;
        int B, T;
        random_config(&rng, &c, &B, &T);
        size_t P = gpt_config_num_params(&c);
        gpt_model *whole = NULL;
        TEST_OK(gpt_create(&whole, &c, gpc_cpu(), GPC_F32, B, T, 1));
        size_t full = gpt_memory_bytes(whole);
        gpt_free(whole);
        gpc_plan_input in;
        gpc_plan_defaults(&in);
        in.layers = c.layers, in.heads = c.heads, in.channels = c.channels;
        in.context = T, in.batch = B, in.vocab = c.vocab_size;
        in.dtype = GPC_F32, in.cuda = 0;
        gpc_plan_result plan_whole, plan_zero;
        TEST_OK(gpc_plan_compute(&in, &plan_whole));
        const int worlds[] = {2, 3, 4, 8};
        for (int w = 0; w < 4; w++) {
            int N = worlds[w];
            size_t offsets[9];
            gpc_dist_shard_offsets(P, N, 64, offsets);
            size_t covered = 0;
            for (int r = 0; r < N; r++) {
                size_t S = offsets[r + 1] - offsets[r];
                covered += S;
                gpt_model *m = NULL;
                TEST_OK(gpt_create_shard(&m, &c, gpc_cpu(), GPC_F32, B, T, 0, offsets[r], S));
                assert_int_equal(gpt_is_sharded(m), N > 1 && S != P);
                assert_int_equal(gpc_tensor_numel(gpc_optim_m(gpt_optimizer(m))), (int64_t)S);
                assert_int_equal(gpc_tensor_numel(gpc_optim_v(gpt_optimizer(m))), (int64_t)S);
                size_t saved = full - gpt_memory_bytes(m);
                if (saved != moments_bytes(P) - moments_bytes(S))
                    fail_msg("P=%zu N=%d rank %d: saved %zu bytes, expected %zu", P, N, r, saved,
                             moments_bytes(P) - moments_bytes(S));
                if (r == 0) {
                    /* rank 0's optimizer is 1/N of the whole, rounded up to 64 elements */
                    size_t per = (P + (size_t)N - 1) / (size_t)N;
                    assert_int_equal(S, (per + 63) / 64 * 64 < P ? (per + 63) / 64 * 64 : P);
                    in.zero = 1, in.gpus = N;
                    TEST_OK(gpc_plan_compute(&in, &plan_zero));
                    in.zero = 0, in.gpus = 1;
                    uint64_t predicted = plan_whole.optimizer - plan_zero.optimizer;
                    /* the plan pads v too: within one alignment of the real saving */
                    if (!(predicted >= saved && predicted - saved < ALIGN))
                        fail_msg("P=%zu N=%d: plan predicts %llu bytes saved, gpt_create_shard "
                                 "saved %zu",
                                 P, N, (unsigned long long)predicted, saved);
                    uint64_t real = gpt_memory_bytes(m);
                    if (!(plan_zero.total >= real && plan_zero.total - real < 2 * ALIGN))
                        fail_msg("P=%zu N=%d: plan %llu bytes, rank 0 holds %llu", P, N,
                                 (unsigned long long)plan_zero.total, (unsigned long long)real);
                }
                gpt_free(m);
            }
            assert_int_equal(covered, P);
        }
    }
}

static char *temp_file(const char *dir, const char *name) {
    static char paths[4][4096];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, 4096, "%s/%s", dir, name);
    return p;
}

static void read_moments(const gpt_model *m, float *mom, float *var) {
    int64_t n = (int64_t)gpc_optim_state_count(gpt_optimizer(m));
    gpc_tensor hm = gpc_tensor_1d(mom, GPC_F32, gpc_cpu(), n);
    gpc_tensor hv = gpc_tensor_1d(var, GPC_F32, gpc_cpu(), n);
    TEST_OK(gpc_tensor_copy(&hm, gpc_optim_m(gpt_optimizer(m))));
    TEST_OK(gpc_tensor_copy(&hv, gpc_optim_v(gpt_optimizer(m))));
}

static unsigned char *read_all(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *data = gpc_malloc(*size);
    assert_int_equal(fread(data, 1, *size, f), *size);
    fclose(f);
    return data;
}

/* A whole checkpoint after a real step loads into the shards of 3 ranks:
 * each holds its slice of m and v and every parameter. Gathered into host
 * arrays, the shards write a checkpoint byte-equal to the whole model's. */
static void test_checkpoint_round_trip_through_shards(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 42);
    gpt_config c;
    TEST_OK(gpt_config_init(&c, 2, 2, 16, 8, 67 + (int)gpc_rng_below(&rng, 100)));
    gpt_model *whole = NULL;
    TEST_OK(gpt_create(&whole, &c, gpc_cpu(), GPC_F32, 2, 8, 1));
    TEST_OK(gpt_init_weights(whole, gpc_rng_u32(&rng)));
    int32_t tok[16], tgt[16];
    for (int i = 0; i < 16; i++) {
        tok[i] = (int32_t)gpc_rng_below(&rng, (uint32_t)c.vocab_size);
        tgt[i] = (int32_t)gpc_rng_below(&rng, (uint32_t)c.vocab_size);
    }
    TEST_OK(gpt_zero_grad(whole));
    TEST_OK(gpt_forward_backward(whole, tok, tgt, 2, 8, 1.0f / 16));
    gpc_optim_options o;
    gpc_optim_defaults(&o);
    TEST_OK(gpt_update(whole, &o, NULL, NULL));
    size_t P = gpt_num_params(whole);
    float *params = gpc_malloc(P * sizeof(float)), *mom = gpc_malloc(P * sizeof(float));
    float *var = gpc_malloc(P * sizeof(float)), *got = gpc_malloc(P * sizeof(float));
    TEST_OK(gpt_get_params(whole, params));
    read_moments(whole, mom, var);

    char *dir = test_tmpdir("zero-shard");
    const char *ref = temp_file(dir, "whole.bin"), *again = temp_file(dir, "gathered.bin");
    gpt_checkpoint_state st;
    memset(&st, 0, sizeof st);
    st.step = 1 + gpc_rng_below(&rng, 1000);
    TEST_OK(gpt_checkpoint_save(ref, whole, &st));

    const int N = 3;
    size_t offsets[4];
    gpc_dist_shard_offsets(P, N, 64, offsets);
    gpt_host_state full = {0};
    full.m = gpc_malloc(P * sizeof(float));
    full.v = gpc_malloc(P * sizeof(float));
    gpt_model *shard[3];
    for (int r = 0; r < N; r++) {
        size_t lo = offsets[r], S = offsets[r + 1] - lo;
        TEST_OK(gpt_create_shard(&shard[r], &c, gpc_cpu(), GPC_F32, 2, 8, 0, lo, S));
        gpt_checkpoint_state loaded;
        TEST_OK(gpt_checkpoint_load(ref, shard[r], &loaded));
        assert_int_equal(loaded.step, st.step);
        TEST_OK(gpt_get_params(shard[r], got));
        assert_memory_equal(got, params, P * sizeof(float));
        read_moments(shard[r], full.m + lo, full.v + lo);
        assert_memory_equal(full.m + lo, mom + lo, S * sizeof(float));
        assert_memory_equal(full.v + lo, var + lo, S * sizeof(float));
    }
    /* a shard alone is not a checkpoint */
    TEST_FAILS(gpt_checkpoint_save(again, shard[1], &st), GPC_ERR_INVALID_ARG, "gather it first");
    /* the shards' moments gathered: the same file as the whole model's */
    TEST_OK(gpt_checkpoint_save_full(again, shard[0], &st, &full));
    size_t na, nb;
    unsigned char *a = read_all(ref, &na), *b = read_all(again, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na);
    gpc_free(a);
    gpc_free(b);
    for (int r = 0; r < N; r++)
        gpt_free(shard[r]);
    gpt_host_state_free(&full);
    assert_null(full.m);
    gpt_free(whole);
    gpc_free(params);
    gpc_free(mom);
    gpc_free(var);
    gpc_free(got);
    test_rmtree(dir);
    gpc_free(dir);
}

/* A shard outside the model, and the whole-model update on a shard. */
static void test_shard_errors(void **state) {
    (void)state;
    gpt_config c;
    TEST_OK(gpt_config_init(&c, 1, 2, 16, 8, 67));
    size_t P = gpt_config_num_params(&c);
    gpt_model *m = NULL;
    TEST_FAILS(gpt_create_shard(&m, &c, gpc_cpu(), GPC_F32, 2, 8, 0, P - 10, 11),
               GPC_ERR_INVALID_ARG, "lies outside the model's");
    assert_null(m);
    TEST_FAILS(gpt_create_shard(&m, &c, gpc_cpu(), GPC_F32, 2, 8, 0, P + 1, 0), GPC_ERR_INVALID_ARG,
               "lies outside the model's");
    TEST_OK(gpt_create_shard(&m, &c, gpc_cpu(), GPC_F32, 2, 8, 0, 64, 128));
    gpc_optim_options o;
    gpc_optim_defaults(&o);
    TEST_FAILS(gpt_update(m, &o, NULL, NULL), GPC_ERR_INVALID_ARG, "update it with gpc_ddp_update");
    gpt_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shard_memory_matches_plan),
        cmocka_unit_test(test_checkpoint_round_trip_through_shards),
        cmocka_unit_test(test_shard_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
