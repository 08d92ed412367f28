/* test_prefetch.c: the prefetching loader (gpc_prefetch_*) against the
 * synchronous one: the same batches over several epochs, shards and ranks,
 * the same positions, across restores of the position mid-run; a corrupt
 * shard reported with the synchronous loader's message and the thread
 * gone; bad arguments. Then the model's step on prefetched tokens
 * (gpt_forward_backward_device) against the step on host tokens, bit for
 * bit, and its bad inputs. The synchronous loader is itself checked against
 * the raw tokens in test_data.c; here each row is also checked against the
 * raw split. */
#include "testutil.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpc/data.h"
#include "gpc/model.h"

static gpc_rng rng;

/* A dataset written by hand: the train split's tokens over shards of
 * per_shard tokens, a small validation split. */
static void write_dataset(const char *dir, uint32_t vocab, const uint32_t *train, uint64_t n,
                          uint64_t per_shard) {
    int shards = 0;
    for (uint64_t at = 0; at < n; at += per_shard) {
        char path[4200];
        snprintf(path, sizeof path, "%s/train_%04d.bin", dir, shards++);
        TEST_OK(gpc_shard_write(path, train + at, n - at < per_shard ? n - at : per_shard, vocab));
    }
    char path[4200], text[512];
    snprintf(path, sizeof path, "%s/val_0000.bin", dir);
    TEST_OK(gpc_shard_write(path, train, 100, vocab));
    int len = snprintf(text, sizeof text,
                       "gpc-dataset 1\nvocab_size=%u\ntrain_tokens=%llu\nval_tokens=100\n"
                       "train_shards=%d\nval_shards=1\n",
                       vocab, (unsigned long long)n, shards);
    snprintf(path, sizeof path, "%s/dataset.txt", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, (size_t)len, f), (size_t)len);
    fclose(f);
}

static uint32_t *random_tokens(uint64_t n, uint32_t vocab) {
    uint32_t *t = malloc(n * sizeof *t);
    for (uint64_t i = 0; i < n; i++)
        t[i] = gpc_rng_below(&rng, vocab);
    return t;
}

/* Threads of this process, from /proc (the loader's thread shows there
 * while it runs). */
static int count_threads(void) {
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* The kernel may still list a thread for a moment after pthread_join has
 * returned (its task is released just after it wakes the joiner), so wait
 * up to 2 s for the count to settle before asserting it. */
static void expect_threads(int want) {
    int n = count_threads();
    for (int i = 0; i < 2000 && n != want; i++) {
        usleep(1000);
        n = count_threads();
    }
    assert_int_equal(n, want);
}

/* The baseline, once a thread joined by an earlier test is surely gone. */
static int settled_threads(void) {
    usleep(20000);
    return count_threads();
}

/* The next batch of both loaders must agree, with each row a window of the
 * raw split, and so must their positions afterwards. */
static void expect_next_same(gpc_prefetch *p, gpc_loader *l, const uint32_t *split, uint64_t n,
                             int B, int T, uint64_t k) {
    gpc_batch batch;
    int32_t *in = malloc((size_t)B * T * sizeof *in), *tg = malloc((size_t)B * T * sizeof *tg);
    TEST_OK(gpc_prefetch_next(p, &batch));
    TEST_OK(gpc_loader_next(l, in, tg));
    assert_int_equal(batch.inputs.dtype, GPC_I32);
    assert_int_equal(batch.inputs.device.type, GPC_DEVICE_CPU);
    assert_int_equal(batch.inputs.ndim, 2);
    assert_int_equal(batch.inputs.shape[0], B);
    assert_int_equal(batch.inputs.shape[1], T);
    assert_int_equal(batch.targets.shape[0], B);
    if (memcmp(batch.inputs.data, in, (size_t)B * T * sizeof *in) != 0 ||
        memcmp(batch.targets.data, tg, (size_t)B * T * sizeof *tg) != 0)
        fail_msg("batch %llu differs from the synchronous loader's", (unsigned long long)k);
    assert_int_equal(batch.unmasked, (int64_t)B * T); /* the loader never masks */
    const int32_t *got_in = batch.inputs.data, *got_tg = batch.targets.data;
    for (int b = 0; b < B; b++) {
        /* the raw split has the row's T+1 tokens somewhere at a multiple of T */
        const int32_t *row = got_in + (size_t)b * T;
        int found = 0;
        for (uint64_t w = 0; !found && w < (n - 1) / (uint64_t)T; w++) {
            int same = 1;
            for (int t = 0; same && t < T; t++)
                same = (uint32_t)row[t] == split[w * T + t] &&
                       (uint32_t)got_tg[(size_t)b * T + t] == split[w * T + t + 1];
            found = same;
        }
        if (!found)
            fail_msg("batch %llu row %d is no window of the split", (unsigned long long)k, b);
    }
    gpc_loader_state sp, sl;
    gpc_prefetch_get_state(p, &sp);
    gpc_loader_get_state(l, &sl);
    if (sp.epoch != sl.epoch || sp.batch != sl.batch)
        fail_msg("after batch %llu: position (%llu, %llu), the loader's (%llu, %llu)",
                 (unsigned long long)k, (unsigned long long)sp.epoch, (unsigned long long)sp.batch,
                 (unsigned long long)sl.epoch, (unsigned long long)sl.batch);
    free(in);
    free(tg);
}

/* Sometimes the caller is slow (the thread fills the ring), sometimes fast
 * (it waits for the thread). */
static void jitter(void) {
    uint32_t r = gpc_rng_below(&rng, 8);
    if (r == 0) usleep(2000);
    if (r == 1) usleep(50);
}

static void test_prefetch_matches_loader(void **state) {
    (void)state;
    struct {
        uint32_t vocab;
        int B, T, rank, world, depth;
    } cases[] = {
        {50257, 3, 8, 0, 1, 2},  /* u16 shards, the smallest ring */
        {100000, 2, 8, 2, 3, 3}, /* u32 shards, the last of 3 ranks */
        {300, 4, 16, 1, 2, 0},   /* the default ring */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char *dir = test_tmpdir("prefetch");
        int B = cases[c].B, T = cases[c].T;
        uint64_t n = 300 * (uint64_t)T + 1 + gpc_rng_below(&rng, (uint32_t)T);
        uint32_t *split = random_tokens(n, cases[c].vocab);
        write_dataset(dir, cases[c].vocab, split, n, 37 * (uint64_t)T + 5); /* odd shard sizes */
        uint64_t seed = test_seed() + c;
        gpc_loader *l;
        gpc_prefetch *p;
        TEST_OK(
            gpc_loader_open(&l, dir, GPC_SPLIT_TRAIN, B, T, seed, cases[c].rank, cases[c].world));
        TEST_OK(gpc_prefetch_open(&p, dir, GPC_SPLIT_TRAIN, B, T, seed, cases[c].rank,
                                  cases[c].world, gpc_cpu(), cases[c].depth));
        uint64_t batches = gpc_loader_batches_per_epoch(l);
        assert_int_equal(gpc_prefetch_batches_per_epoch(p), batches);
        gpc_loader_state st;
        gpc_prefetch_get_state(p, &st);
        assert_true(st.epoch == 0 && st.batch == 0);
        for (uint64_t k = 0; k < 3 * batches + 7; k++) { /* three epochs and a bit */
            expect_next_same(p, l, split, n, B, T, k);
            jitter();
        }
        gpc_prefetch_close(p);
        gpc_loader_close(l);
        free(split);
        test_rmtree(dir);
        gpc_free(dir);
    }
}

static void test_prefetch_resume(void **state) {
    (void)state;
    char *dir = test_tmpdir("prefetch-resume");
    const int B = 2, T = 8;
    const uint64_t n = 200 * T + 3;
    uint32_t *split = random_tokens(n, 50257);
    write_dataset(dir, 50257, split, n, 300);
    uint64_t seed = test_seed();
    gpc_loader *a, *b;
    gpc_prefetch *p, *q;
    TEST_OK(gpc_loader_open(&a, dir, GPC_SPLIT_TRAIN, B, T, seed, 0, 1));
    TEST_OK(gpc_prefetch_open(&p, dir, GPC_SPLIT_TRAIN, B, T, seed, 0, 1, gpc_cpu(), 3));
    uint64_t batches = gpc_loader_batches_per_epoch(a);
    uint64_t k1 = gpc_rng_below(&rng, (uint32_t)(2 * batches));
    for (uint64_t k = 0; k < k1; k++)
        expect_next_same(p, a, split, n, B, T, k);
    gpc_loader_state st1;
    gpc_prefetch_get_state(p, &st1); /* what a checkpoint would store now */

    /* a new run from it, set before the thread has read the shards */
    TEST_OK(gpc_prefetch_open(&q, dir, GPC_SPLIT_TRAIN, B, T, seed, 0, 1, gpc_cpu(), 2));
    TEST_OK(gpc_prefetch_set_state(q, &st1));
    gpc_loader_state got;
    gpc_prefetch_get_state(q, &got);
    assert_true(got.epoch == st1.epoch && got.batch == st1.batch);
    TEST_OK(gpc_loader_open(&b, dir, GPC_SPLIT_TRAIN, B, T, seed, 0, 1));
    TEST_OK(gpc_loader_set_state(b, &st1));
    for (uint64_t k = 0; k < 2 * batches + 3; k++) {
        expect_next_same(q, b, split, n, B, T, k1 + k);
        jitter();
    }
    gpc_prefetch_close(q);

    /* the running one goes on, then back to st1 with its ring full */
    for (uint64_t k = 0; k < 5; k++)
        expect_next_same(p, a, split, n, B, T, k1 + k);
    usleep(20000);
    TEST_OK(gpc_prefetch_set_state(p, &st1));
    TEST_OK(gpc_loader_set_state(a, &st1));
    for (uint64_t k = 0; k < batches + 2; k++)
        expect_next_same(p, a, split, n, B, T, k1 + k);
    /* twice in a row, the last batch of an epoch, across the epoch's end */
    gpc_loader_state early = {0, 1}, last = {4, batches - 1};
    TEST_OK(gpc_prefetch_set_state(p, &early));
    TEST_OK(gpc_prefetch_set_state(p, &last));
    TEST_OK(gpc_loader_set_state(a, &last));
    for (uint64_t k = 0; k < 3; k++)
        expect_next_same(p, a, split, n, B, T, k);
    gpc_prefetch_get_state(p, &got);
    assert_true(got.epoch == 5 && got.batch == 2);

    /* positions set while the thread is cutting a batch: what it cut for
     * the old position must never come out */
    for (int round = 0; round < 300; round++) {
        gpc_loader_state to = {gpc_rng_below(&rng, 3), gpc_rng_below(&rng, (uint32_t)batches)};
        TEST_OK(gpc_prefetch_set_state(p, &to));
        TEST_OK(gpc_loader_set_state(a, &to));
        uint32_t take = gpc_rng_below(&rng, 4);
        for (uint32_t k = 0; k < take; k++)
            expect_next_same(p, a, split, n, B, T, k);
        if (round % 7 == 0) usleep(200);
    }

    /* a position past the epoch: the synchronous loader's refusal */
    gpc_loader_state past = {1, batches};
    assert_int_equal(gpc_loader_set_state(b, &past), GPC_ERR_MISMATCH);
    char want[1024];
    snprintf(want, sizeof want, "%s", gpc_last_error());
    TEST_FAILS(gpc_prefetch_set_state(p, &past), GPC_ERR_MISMATCH, want);
    expect_next_same(p, a, split, n, B, T, 3); /* and it goes on where it was */
    gpc_prefetch_close(p);
    gpc_loader_close(a);
    gpc_loader_close(b);
    free(split);
    test_rmtree(dir);
    gpc_free(dir);
}

static void flip_byte(const char *path, long offset) {
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, offset, SEEK_SET), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, offset, SEEK_SET), 0);
    fputc(c ^ 0x10, f);
    fclose(f);
}

/* A bad shard in the middle of the split: the first gpc_prefetch_next (the
 * step that needs data) fails with gpc_loader_open's message, every later
 * call too, and closing leaves no thread behind. */
static void test_prefetch_corrupt_shard(void **state) {
    (void)state;
    char *dir = test_tmpdir("prefetch-bad");
    const int B = 2, T = 8;
    const uint64_t n = 3000;
    uint32_t *split = random_tokens(n, 1000);
    write_dataset(dir, 1000, split, n, 1000); /* train_0000..0002 */
    char path[4200];
    snprintf(path, sizeof path, "%s/train_0001.bin", dir);
    flip_byte(path, 64 + 2 * (long)gpc_rng_below(&rng, 1000)); /* a token; the header is fine */
    gpc_loader *l = NULL;
    assert_int_equal(gpc_loader_open(&l, dir, GPC_SPLIT_TRAIN, B, T, 1, 0, 1), GPC_ERR_FORMAT);
    char want[1024];
    snprintf(want, sizeof want, "%s", gpc_last_error());
    assert_non_null(strstr(want, "train_0001.bin is corrupt: its tokens do not match their "
                                 "checksum"));

    int threads = settled_threads();
    for (int depth = 2; depth <= 4; depth++) {
        gpc_prefetch *p;
        gpc_batch batch;
        TEST_OK(gpc_prefetch_open(&p, dir, GPC_SPLIT_TRAIN, B, T, 1, 0, 1, gpc_cpu(), depth));
        for (int again = 0; again < 2; again++) {
            gpc_clear_error();
            TEST_FAILS(gpc_prefetch_next(p, &batch), GPC_ERR_FORMAT, want);
            assert_string_equal(gpc_last_error(), want);
        }
        gpc_loader_state st = {0, 0};
        TEST_FAILS(gpc_prefetch_set_state(p, &st), GPC_ERR_FORMAT, want);
        gpc_prefetch_close(p);
        expect_threads(threads);
    }

    /* a shard cut short is found by the header check, before any thread */
    snprintf(path, sizeof path, "%s/train_0002.bin", dir);
    assert_int_equal(truncate(path, 100), 0);
    assert_int_equal(gpc_loader_open(&l, dir, GPC_SPLIT_TRAIN, B, T, 1, 0, 1), GPC_ERR_FORMAT);
    snprintf(want, sizeof want, "%s", gpc_last_error());
    gpc_prefetch *p = NULL;
    TEST_FAILS(gpc_prefetch_open(&p, dir, GPC_SPLIT_TRAIN, B, T, 1, 0, 1, gpc_cpu(), 2),
               GPC_ERR_FORMAT, want);
    assert_null(p);
    expect_threads(threads);
    free(split);
    test_rmtree(dir);
    gpc_free(dir);
}

/* Closing at any moment ends the thread: while it reads the shards, while
 * it waits on a full ring, after some batches. */
static void test_prefetch_close_anytime(void **state) {
    (void)state;
    char *dir = test_tmpdir("prefetch-close");
    const int B = 4, T = 16;
    const uint64_t n = 400000;
    uint32_t *split = random_tokens(n, 50257);
    write_dataset(dir, 50257, split, n, 4000); /* 100 shards */
    int threads = settled_threads();
    for (int trial = 0; trial < 12; trial++) {
        gpc_prefetch *p;
        gpc_batch batch;
        TEST_OK(gpc_prefetch_open(&p, dir, GPC_SPLIT_TRAIN, B, T, 9, 0, 1, gpc_cpu(), 2));
        expect_threads(threads + 1);
        if (trial % 3 == 1) usleep(100000); /* loaded, ring full */
        if (trial % 3 == 2)
            for (int k = 0; k < 5; k++)
                TEST_OK(gpc_prefetch_next(p, &batch));
        gpc_prefetch_close(p);
        expect_threads(threads);
    }
    free(split);
    test_rmtree(dir);
    gpc_free(dir);
}

static void test_prefetch_bad_arguments(void **state) {
    (void)state;
    char *dir = test_tmpdir("prefetch-args");
    uint32_t *split = random_tokens(500, 100);
    write_dataset(dir, 100, split, 500, 500);
    gpc_prefetch *p = NULL;
    TEST_FAILS(gpc_prefetch_open(&p, dir, GPC_SPLIT_TRAIN, 2, 8, 1, 0, 1, gpc_cpu(), 1),
               GPC_ERR_INVALID_ARG, "needs 2 to 64 batches in flight, not 1");
    TEST_FAILS(gpc_prefetch_open(&p, dir, GPC_SPLIT_TRAIN, 2, 8, 1, 0, 1, gpc_cpu(), 65),
               GPC_ERR_INVALID_ARG, "not 65");
    /* the synchronous loader's checks, with its messages */
    gpc_loader *l = NULL;
    struct {
        const char *dir;
        int B, T, rank, world;
    } bad[] = {
        {dir, 0, 8, 0, 1}, {dir, 2, 8, 2, 2}, {dir, 8, 64, 0, 1}, {"/nonexistent/ds", 2, 8, 0, 1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gpc_status want = gpc_loader_open(&l, bad[i].dir, GPC_SPLIT_TRAIN, bad[i].B, bad[i].T, 1,
                                          bad[i].rank, bad[i].world);
        assert_int_not_equal(want, GPC_OK);
        char message[1024];
        snprintf(message, sizeof message, "%s", gpc_last_error());
        TEST_FAILS(gpc_prefetch_open(&p, bad[i].dir, GPC_SPLIT_TRAIN, bad[i].B, bad[i].T, 1,
                                     bad[i].rank, bad[i].world, gpc_cpu(), 0),
                   want, message);
        assert_null(p);
    }
    /* a GPU this machine does not have */
    gpc_device gpu = {GPC_DEVICE_CUDA, 63};
    assert_int_not_equal(gpc_prefetch_open(&p, dir, GPC_SPLIT_TRAIN, 2, 8, 1, 0, 1, gpu, 0),
                         GPC_OK);
    assert_null(p);
    free(split);
    test_rmtree(dir);
    gpc_free(dir);
}

/* ------------------------------------------------- the model's device step */

/* Trains two copies of one model for a few steps of two micro-steps: one on
 * the synchronous loader's host tokens, one on the prefetched batches.
 * Losses, gradients and weights must agree bit for bit. */
static void test_device_step_equals_host_step(void **state) {
    (void)state;
    char *dir = test_tmpdir("prefetch-model");
    const int B = 4, T = 16, V = 64;
    uint32_t *split = random_tokens(3000, V);
    write_dataset(dir, V, split, 3000, 1000);
    gpt_config config;
    TEST_OK(gpt_config_init(&config, 2, 2, 32, T, V));
    gpt_model *host = NULL, *dev = NULL;
    TEST_OK(gpt_create(&host, &config, gpc_cpu(), GPC_F32, B, T, 1));
    TEST_OK(gpt_create(&dev, &config, gpc_cpu(), GPC_F32, B, T, 1));
    uint64_t seed = test_seed();
    TEST_OK(gpt_init_weights(host, seed));
    TEST_OK(gpt_init_weights(dev, seed));
    gpc_loader *l;
    gpc_prefetch *p;
    TEST_OK(gpc_loader_open(&l, dir, GPC_SPLIT_TRAIN, B, T, seed, 0, 1));
    TEST_OK(gpc_prefetch_open(&p, dir, GPC_SPLIT_TRAIN, B, T, seed, 0, 1, gpc_cpu(), 0));
    int32_t in[4 * 16], tg[4 * 16];
    size_t P = gpt_num_params(host);
    float *wa = malloc(P * sizeof *wa), *wb = malloc(P * sizeof *wb);
    for (int step = 1; step <= 4; step++) {
        TEST_OK(gpt_zero_grad(host));
        TEST_OK(gpt_zero_grad(dev));
        for (int micro = 0; micro < 2; micro++) {
            gpc_batch batch;
            TEST_OK(gpc_loader_next(l, in, tg));
            TEST_OK(gpc_prefetch_next(p, &batch));
            TEST_OK(gpt_forward_backward(host, in, tg, B, T, 1.0f / (2 * B * T)));
            TEST_OK(gpt_forward_backward_device(dev, &batch.inputs, &batch.targets, batch.unmasked,
                                                1.0f / (2 * B * T)));
        }
        if (memcmp(gpt_grads_flat(host)->data, gpt_grads_flat(dev)->data, P * sizeof(float)) != 0)
            fail_msg("step %d: the gradients differ", step);
        gpc_optim_options o;
        gpc_optim_defaults(&o);
        o.learning_rate = 1e-2f;
        o.step = step;
        TEST_OK(gpt_update(host, &o, NULL, NULL));
        TEST_OK(gpt_update(dev, &o, NULL, NULL));
        float la, lb, na, nb;
        TEST_OK(gpt_read_step(host, &la, &na));
        TEST_OK(gpt_read_step(dev, &lb, &nb));
        if (la != lb || na != nb)
            fail_msg("step %d: loss %.9g and norm %.9g on host tokens, %.9g and %.9g on "
                     "prefetched ones",
                     step, la, na, lb, nb);
        assert_false(gpt_step_skipped(dev));
    }
    TEST_OK(gpt_get_params(host, wa));
    TEST_OK(gpt_get_params(dev, wb));
    assert_memory_equal(wa, wb, P * sizeof *wa);

    /* masked targets: the count given is what the mean divides by */
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)gpc_rng_below(&rng, V);
        tg[i] = gpc_rng_below(&rng, 3) == 0 ? -1 : (int32_t)gpc_rng_below(&rng, V);
    }
    tg[0] = 5;
    int64_t unmasked = 0;
    for (int i = 0; i < B * T; i++)
        unmasked += tg[i] >= 0;
    gpc_tensor tin = gpc_tensor_2d(in, GPC_I32, gpc_cpu(), B, T);
    gpc_tensor ttg = gpc_tensor_2d(tg, GPC_I32, gpc_cpu(), B, T);
    TEST_OK(gpt_zero_grad(host));
    TEST_OK(gpt_zero_grad(dev));
    TEST_OK(gpt_forward_backward(host, in, tg, B, T, 1.0f));
    TEST_OK(gpt_forward_backward_device(dev, &tin, &ttg, unmasked, 1.0f));
    assert_memory_equal(gpt_grads_flat(host)->data, gpt_grads_flat(dev)->data, P * sizeof(float));
    float la, lb;
    TEST_OK(gpt_read_step(host, &la, NULL));
    TEST_OK(gpt_read_step(dev, &lb, NULL));
    assert_true(la == lb && la > 0);

    /* what the device step refuses */
    gpc_tensor small = gpc_tensor_2d(in, GPC_I32, gpc_cpu(), 2, T);
    gpc_tensor wide = gpc_tensor_2d(in, GPC_I32, gpc_cpu(), 1, 2 * T);
    gpc_tensor floats = gpc_tensor_2d(in, GPC_F32, gpc_cpu(), B, T);
    gpc_tensor flat = gpc_tensor_1d(in, GPC_I32, gpc_cpu(), B * T);
    gpc_tensor on_gpu = gpc_tensor_2d(in, GPC_I32, (gpc_device){GPC_DEVICE_CUDA, 0}, B, T);
    TEST_FAILS(gpt_forward_backward_device(dev, &floats, &ttg, unmasked, 1.0f), GPC_ERR_INVALID_ARG,
               "inputs must be a [B, T] i32 tensor on cpu, not [4, 16] f32");
    TEST_FAILS(gpt_forward_backward_device(dev, &tin, &flat, unmasked, 1.0f), GPC_ERR_INVALID_ARG,
               "targets must be a [B, T] i32 tensor");
    TEST_FAILS(gpt_forward_backward_device(dev, &on_gpu, &ttg, unmasked, 1.0f), GPC_ERR_INVALID_ARG,
               "on cpu, not [4, 16] i32 on cuda");
    TEST_FAILS(gpt_forward_backward_device(dev, &small, &ttg, unmasked, 1.0f), GPC_ERR_MISMATCH,
               "inputs are [2, 16] but targets [4, 16]");
    TEST_FAILS(gpt_forward_backward_device(dev, &wide, &wide, 0, 1.0f), GPC_ERR_INVALID_ARG,
               "batch 1 x 32 is outside what the model was planned for (4 x 16)");
    TEST_FAILS(gpt_forward_backward_device(dev, &tin, &ttg, B * T + 1, 1.0f), GPC_ERR_INVALID_ARG,
               "65 unmasked targets in a batch of 4 x 16 positions");
    TEST_FAILS(gpt_forward_backward_device(dev, &tin, &ttg, -1, 1.0f), GPC_ERR_INVALID_ARG,
               "-1 unmasked targets");
    gpt_model *infer = NULL;
    TEST_OK(gpt_create(&infer, &config, gpc_cpu(), GPC_F32, B, T, 0));
    TEST_FAILS(gpt_forward_backward_device(infer, &tin, &ttg, unmasked, 1.0f), GPC_ERR_INVALID_ARG,
               "created for inference");
    gpt_free(infer);
    free(wa);
    free(wb);
    gpc_prefetch_close(p);
    gpc_loader_close(l);
    gpt_free(host);
    gpt_free(dev);
    free(split);
    test_rmtree(dir);
    gpc_free(dir);
}

int main(void) {
    gpc_rng_seed(&rng, test_seed(), 41);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefetch_matches_loader),
        cmocka_unit_test(test_prefetch_resume),
        cmocka_unit_test(test_prefetch_corrupt_shard),
        cmocka_unit_test(test_prefetch_close_anytime),
        cmocka_unit_test(test_prefetch_bad_arguments),
        cmocka_unit_test(test_device_step_equals_host_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
