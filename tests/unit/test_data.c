/* test_data.c: token shards (round trips and every corrupt file), dataset
 * descriptions, the loader (windows, shuffle, ranks, resume, too-small
 * data), `prepare` on a small corpus and `synth`. Expected values are
 * computed here from the raw file bytes and the raw corpus, not by gpc. */
#include "testutil.h"

#include "gpc/data.h"
#include "gpc/tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint32_t read_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static unsigned char *read_all(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *data = malloc(*size + 1);
    assert_int_equal(fread(data, 1, *size, f), *size);
    fclose(f);
    return data;
}

static void write_all(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, size, f), size);
    fclose(f);
}

static char *path_in(const char *dir, const char *name) {
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

/* ------------------------------------------------------------------ shards */

static void check_shard_round_trip(const char *path, uint32_t vocab, uint64_t n, gpc_rng *rng) {
    uint32_t *tokens = malloc((n + 1) * sizeof *tokens);
    for (uint64_t i = 0; i < n; i++)
        tokens[i] = gpc_rng_below(rng, vocab);
    if (n) tokens[n - 1] = vocab - 1; /* the largest token survives */
    TEST_OK(gpc_shard_write(path, tokens, n, vocab));
    /* the bytes on disk, decoded by hand */
    size_t size;
    unsigned char *file = read_all(path, &size);
    size_t width = vocab <= 65536 ? 2 : 4;
    assert_int_equal(size, 64 + n * width);
    assert_memory_equal(file, "GPCSHARD", 8);
    assert_int_equal(read_u32(file + 8), GPC_SHARD_VERSION);
    assert_int_equal(read_u32(file + 12), width);
    assert_int_equal(read_u32(file + 16) | (uint64_t)read_u32(file + 20) << 32, n);
    assert_int_equal(read_u32(file + 24), vocab);
    assert_int_equal(read_u32(file + 28), gpc_crc32c(0, file + 64, n * width));
    assert_int_equal(read_u32(file + 60), gpc_crc32c(0, file, 60));
    for (uint64_t i = 0; i < n; i++) {
        uint32_t v = width == 2 ? (uint32_t)file[64 + 2 * i] | (uint32_t)file[65 + 2 * i] << 8
                                : read_u32(file + 64 + 4 * i);
        assert_int_equal(v, tokens[i]);
    }
    gpc_shard_info info;
    uint32_t *back;
    TEST_OK(gpc_shard_read(path, &info, &back));
    assert_int_equal(info.tokens, n);
    assert_int_equal(info.vocab_size, vocab);
    assert_int_equal(info.dtype, width == 2 ? GPC_U16 : GPC_U32);
    if (n) assert_memory_equal(back, tokens, n * sizeof *tokens);
    memset(&info, 0, sizeof info);
    TEST_OK(gpc_shard_info_read(path, &info));
    assert_int_equal(info.tokens, n);
    gpc_free(back);
    free(file);
    free(tokens);
}

static void test_shard_round_trip(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 21);
    char *dir = test_tmpdir("shard");
    char *path = path_in(dir, "s.bin");
    check_shard_round_trip(path, 50257, 100000 + gpc_rng_below(&rng, 1000), &rng); /* u16 */
    check_shard_round_trip(path, 65536, 70000, &rng);                              /* u16 edge */
    check_shard_round_trip(path, 65537, 70000, &rng);                              /* u32 */
    check_shard_round_trip(path, UINT32_C(1) << 31, 1000, &rng);
    check_shard_round_trip(path, 300, 0, &rng); /* empty shard */
    /* no temporary file is left behind */
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    assert_false(gpc_path_exists(tmp));
    uint32_t bad[] = {1, 2, 300};
    TEST_FAILS(gpc_shard_write(path, bad, 3, 300), GPC_ERR_INVALID_ARG,
               "token 300 at 2 is outside the vocabulary of 300");
    free(path);
    test_rmtree(dir);
    gpc_free(dir);
}

static void test_shard_corrupt_files(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 22);
    char *dir = test_tmpdir("shard-bad");
    char *good = path_in(dir, "good.bin"), *bad = path_in(dir, "bad.bin");
    uint32_t tokens[500];
    for (int i = 0; i < 500; i++)
        tokens[i] = gpc_rng_below(&rng, 1000);
    TEST_OK(gpc_shard_write(good, tokens, 500, 1000));
    size_t size;
    unsigned char *data = read_all(good, &size);
    unsigned char *copy = malloc(size + 16);
    gpc_shard_info info;
    uint32_t *out = NULL;

    TEST_FAILS(gpc_shard_read("/nonexistent/train_0000.bin", &info, &out), GPC_ERR_IO,
               "cannot open shard /nonexistent/train_0000.bin");
    /* a FIFO is refused at once: opening it to read would wait for a writer */
    char fifo[4300];
    snprintf(fifo, sizeof fifo, "%s.fifo", bad);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    alarm(20); /* a blocked open fails the test instead of hanging it */
    TEST_FAILS(gpc_shard_info_read(fifo, &info), GPC_ERR_FORMAT, "is not a regular file");
    alarm(0);
    unlink(fifo);

    memcpy(copy, data, size);
    memcpy(copy, "GPCTOKEN", 8);
    write_all(bad, copy, size);
    TEST_FAILS(gpc_shard_read(bad, &info, &out), GPC_ERR_FORMAT, "not a gpc shard file");
    write_all(bad, "hello", 5);
    TEST_FAILS(gpc_shard_info_read(bad, &info), GPC_ERR_FORMAT, "not a gpc shard file");

    memcpy(copy, data, size);
    put_u32(copy + 8, GPC_SHARD_VERSION + 1);
    put_u32(copy + 60, gpc_crc32c(0, copy, 60)); /* a well-formed newer file */
    write_all(bad, copy, size);
    TEST_FAILS(gpc_shard_read(bad, &info, &out), GPC_ERR_FORMAT,
               "is shard format version 2; this gpc reads version 1");

    write_all(bad, data, 40);
    TEST_FAILS(gpc_shard_read(bad, &info, &out), GPC_ERR_FORMAT, "is truncated: 40 bytes");
    write_all(bad, data, size - 2);
    TEST_FAILS(gpc_shard_read(bad, &info, &out), GPC_ERR_FORMAT, "truncated or damaged");
    TEST_FAILS(gpc_shard_info_read(bad, &info), GPC_ERR_FORMAT, "header says 500 tokens");
    memcpy(copy, data, size);
    memcpy(copy + size, "xx", 2);
    write_all(bad, copy, size + 2);
    TEST_FAILS(gpc_shard_read(bad, &info, &out), GPC_ERR_FORMAT, "truncated or damaged");

    for (int trial = 0; trial < 10; trial++) { /* any flipped header bit */
        memcpy(copy, data, size);
        copy[12 + gpc_rng_below(&rng, 48)] ^= (unsigned char)(1u << gpc_rng_below(&rng, 8));
        write_all(bad, copy, size);
        TEST_FAILS(gpc_shard_read(bad, &info, &out), GPC_ERR_FORMAT, "header checksum mismatch");
    }
    for (int trial = 0; trial < 10; trial++) { /* any flipped token bit */
        memcpy(copy, data, size);
        copy[64 + gpc_rng_below(&rng, (uint32_t)(size - 64))] ^=
            (unsigned char)(1u << gpc_rng_below(&rng, 8));
        write_all(bad, copy, size);
        TEST_FAILS(gpc_shard_read(bad, &info, &out), GPC_ERR_FORMAT,
                   "tokens do not match their checksum");
        TEST_OK(gpc_shard_info_read(bad, &info)); /* the header alone is fine */
    }
    /* valid checksums, but the vocabulary says 10 and the tokens go to 999 */
    memcpy(copy, data, size);
    put_u32(copy + 24, 10);
    put_u32(copy + 60, gpc_crc32c(0, copy, 60));
    write_all(bad, copy, size);
    int first = 0;
    while (tokens[first] < 10)
        first++;
    char needle[128];
    snprintf(needle, sizeof needle, "token %u at position %d is outside its vocabulary of 10",
             tokens[first], first);
    TEST_FAILS(gpc_shard_read(bad, &info, &out), GPC_ERR_FORMAT, needle);
    assert_null(out);
    TEST_OK(gpc_shard_read(good, &info, &out));
    gpc_free(out);
    free(copy);
    free(data);
    free(good);
    free(bad);
    test_rmtree(dir);
    gpc_free(dir);
}

/* ---------------------------------------------------- datasets and loader */

/* A dataset written by hand: tokens[i] = values[i] over several shards. */
static void write_dataset(const char *dir, uint32_t vocab, const uint32_t *train, uint64_t n_train,
                          const uint32_t *val, uint64_t n_val, uint64_t per_shard) {
    int shards[2] = {0, 0};
    const uint32_t *src[2] = {train, val};
    uint64_t count[2] = {n_train, n_val};
    for (int s = 0; s < 2; s++)
        for (uint64_t at = 0; at < count[s]; at += per_shard) {
            char path[4200];
            snprintf(path, sizeof path, "%s/%s_%04d.bin", dir, s ? "val" : "train", shards[s]++);
            uint64_t n = count[s] - at < per_shard ? count[s] - at : per_shard;
            TEST_OK(gpc_shard_write(path, src[s] + at, n, vocab));
        }
    char text[512];
    int len = snprintf(text, sizeof text,
                       "gpc-dataset 1\nvocab_size=%u\ntrain_tokens=%llu\nval_tokens=%llu\n"
                       "train_shards=%d\nval_shards=%d\nfuture_key=ignored\n",
                       vocab, (unsigned long long)n_train, (unsigned long long)n_val, shards[0],
                       shards[1]);
    char *path = path_in(dir, "dataset.txt");
    write_all(path, text, (size_t)len);
    free(path);
}

static void test_dataset_info_errors(void **state) {
    (void)state;
    char *dir = test_tmpdir("dataset");
    gpc_dataset_info info;
    TEST_FAILS(gpc_dataset_info_read("/nonexistent/data", &info), GPC_ERR_IO,
               "dataset folder /nonexistent/data does not exist; make one with `gpc data prepare");
    TEST_FAILS(gpc_dataset_info_read(dir, &info), GPC_ERR_IO, "has no dataset.txt");
    uint32_t tokens[100];
    for (int i = 0; i < 100; i++)
        tokens[i] = (uint32_t)i;
    write_dataset(dir, 200, tokens, 100, tokens, 30, 40);
    TEST_OK(gpc_dataset_info_read(dir, &info));
    assert_int_equal(info.vocab_size, 200);
    assert_int_equal(info.train_tokens, 100);
    assert_int_equal(info.val_tokens, 30);
    assert_int_equal(info.train_shards, 3);
    assert_int_equal(info.val_shards, 1);
    assert_int_equal(info.has_tokenizer, 0);
    char *txt = path_in(dir, "dataset.txt");
    write_all(txt, "hello\n", 6);
    TEST_FAILS(gpc_dataset_info_read(dir, &info), GPC_ERR_FORMAT, "first line should be");
    write_all(txt, "gpc-dataset 2\n", 14);
    TEST_FAILS(gpc_dataset_info_read(dir, &info), GPC_ERR_FORMAT, "dataset format version 2");
    const char *no_vocab =
        "gpc-dataset 1\ntrain_tokens=1\nval_tokens=1\ntrain_shards=1\nval_shards=1\n";
    write_all(txt, no_vocab, strlen(no_vocab));
    TEST_FAILS(gpc_dataset_info_read(dir, &info), GPC_ERR_FORMAT, "lacks vocab_size=");
    const char *words = "gpc-dataset 1\nvocab_size=ten\n";
    write_all(txt, words, strlen(words));
    TEST_FAILS(gpc_dataset_info_read(dir, &info), GPC_ERR_FORMAT,
               "vocab_size=ten is not a whole number");
    /* the description and the shards disagree */
    write_dataset(dir, 200, tokens, 100, tokens, 30, 40);
    const char *more = "gpc-dataset 1\nvocab_size=200\ntrain_tokens=101\nval_tokens=30\n"
                       "train_shards=3\nval_shards=1\n";
    write_all(txt, more, strlen(more));
    TEST_FAILS(gpc_dataset_info_read(dir, &info), GPC_ERR_MISMATCH,
               "says 101 train tokens but its shards hold 100");
    const char *other_vocab = "gpc-dataset 1\nvocab_size=300\ntrain_tokens=100\nval_tokens=30\n"
                              "train_shards=3\nval_shards=1\n";
    write_all(txt, other_vocab, strlen(other_vocab));
    TEST_FAILS(gpc_dataset_info_read(dir, &info), GPC_ERR_MISMATCH, "is for a vocabulary of 200");
    write_dataset(dir, 200, tokens, 100, tokens, 30, 40);
    char *shard = path_in(dir, "train_0002.bin");
    unlink(shard);
    TEST_FAILS(gpc_dataset_info_read(dir, &info), GPC_ERR_IO, "train_0002.bin");
    free(shard);
    free(txt);
    test_rmtree(dir);
    gpc_free(dir);
}

/* Reads one epoch of batches; returns the window index of each row (the
 * tokens are their own positions, so inputs[0] / T names the window) and
 * checks every row against the split. */
static void read_epoch(gpc_loader *l, int B, int T, const uint32_t *split, uint64_t *windows) {
    uint64_t batches = gpc_loader_batches_per_epoch(l);
    int32_t *in = malloc((size_t)B * T * sizeof *in), *tg = malloc((size_t)B * T * sizeof *tg);
    for (uint64_t k = 0; k < batches; k++) {
        TEST_OK(gpc_loader_next(l, in, tg));
        for (int b = 0; b < B; b++) {
            uint64_t start = 0;
            while (split[start] != (uint32_t)in[b * T])
                start++; /* position of the first token */
            assert_int_equal(start % (uint64_t)T, 0);
            windows[k * B + b] = start / T;
            for (int t = 0; t < T; t++) {
                assert_int_equal(in[b * T + t], (int32_t)split[start + t]);
                assert_int_equal(tg[b * T + t], (int32_t)split[start + t + 1]);
            }
        }
    }
    free(in);
    free(tg);
}

static void test_loader_windows_shuffle_ranks(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 23);
    char *dir = test_tmpdir("loader");
    /* distinct tokens (a permutation of 0..N-1) so a window is known by its
     * first token; vocab above 65536 for u32, shards of odd sizes */
    const int T = 8, B = 3;
    const uint64_t W = 24 * 3, N = W * T + 1, NV = 5 * T + 3;
    uint32_t *train = malloc(N * sizeof *train), *val = malloc(NV * sizeof *val);
    uint64_t *perm = malloc(N * sizeof *perm);
    for (uint64_t i = 0; i < N; i++)
        perm[i] = i;
    gpc_rng_shuffle_u64(&rng, perm, N);
    for (uint64_t i = 0; i < N; i++)
        train[i] = (uint32_t)perm[i];
    for (uint64_t i = 0; i < NV; i++)
        val[i] = (uint32_t)(N + i);
    write_dataset(dir, 100000, train, N, val, NV, 37);

    gpc_loader *l, *again;
    uint64_t seed = test_seed();
    TEST_OK(gpc_loader_open(&l, dir, GPC_SPLIT_TRAIN, B, T, seed, 0, 1));
    assert_int_equal(gpc_loader_vocab_size(l), 100000);
    assert_int_equal(gpc_loader_batches_per_epoch(l), W / B);
    uint64_t e0[72], e1[72], r0[72];
    read_epoch(l, B, T, train, e0);
    read_epoch(l, B, T, train, e1);
    /* each epoch is a permutation of all windows, and the two differ */
    int seen0[72] = {0}, seen1[72] = {0}, same = 1;
    for (uint64_t i = 0; i < W; i++) {
        seen0[e0[i]]++;
        seen1[e1[i]]++;
        same &= e0[i] == e1[i];
    }
    for (uint64_t i = 0; i < W; i++)
        assert_true(seen0[i] == 1 && seen1[i] == 1);
    assert_false(same);
    /* the same seed gives the same order; rewind starts epoch 0 again */
    TEST_OK(gpc_loader_open(&again, dir, GPC_SPLIT_TRAIN, B, T, seed, 0, 1));
    read_epoch(again, B, T, train, r0);
    assert_memory_equal(r0, e0, sizeof e0);
    gpc_loader_rewind(l);
    read_epoch(l, B, T, train, r0);
    assert_memory_equal(r0, e0, sizeof e0);
    gpc_loader_close(again);
    /* another seed, another order */
    TEST_OK(gpc_loader_open(&again, dir, GPC_SPLIT_TRAIN, B, T, seed + 1, 0, 1));
    read_epoch(again, B, T, train, r0);
    assert_memory_not_equal(r0, e0, sizeof e0);
    gpc_loader_close(again);
    gpc_loader_close(l);

    /* three ranks: disjoint, together all windows of the epoch, each in
     * the order's positions r, r+3, ... of the single-process order */
    uint64_t per_rank[3][24];
    int owner[72];
    memset(owner, -1, sizeof owner);
    for (int r = 0; r < 3; r++) {
        TEST_OK(gpc_loader_open(&l, dir, GPC_SPLIT_TRAIN, B, T, seed, r, 3));
        assert_int_equal(gpc_loader_batches_per_epoch(l), W / 3 / B);
        read_epoch(l, B, T, train, per_rank[r]);
        for (int i = 0; i < 24; i++) {
            assert_int_equal(owner[per_rank[r][i]], -1);
            owner[per_rank[r][i]] = r;
            assert_int_equal(per_rank[r][i], e0[i * 3 + r]);
        }
        gpc_loader_close(l);
    }

    /* validation keeps its order: window k is tokens [kT, kT+T] */
    TEST_OK(gpc_loader_open(&l, dir, GPC_SPLIT_VAL, 1, T, seed, 0, 1));
    assert_int_equal(gpc_loader_batches_per_epoch(l), (NV - 1) / T);
    int32_t in[8], tg[8];
    for (int pass = 0; pass < 2; pass++)
        for (uint64_t k = 0; k < (NV - 1) / T; k++) {
            TEST_OK(gpc_loader_next(l, in, tg));
            for (int t = 0; t < T; t++) {
                assert_int_equal(in[t], (int32_t)val[k * T + t]);
                assert_int_equal(tg[t], (int32_t)val[k * T + t + 1]);
            }
        }
    gpc_loader_close(l);
    free(train);
    free(val);
    free(perm);
    test_rmtree(dir);
    gpc_free(dir);
}

static void test_loader_resume_and_errors(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 24);
    char *dir = test_tmpdir("loader-resume");
    const int T = 16, B = 2;
    const uint64_t N = 1000;
    uint32_t *train = malloc(N * sizeof *train);
    for (uint64_t i = 0; i < N; i++)
        train[i] = gpc_rng_below(&rng, 50257); /* u16 shards */
    write_dataset(dir, 50257, train, N, train, 40, 300);
    uint64_t seed = test_seed();
    gpc_loader *a, *b;
    TEST_OK(gpc_loader_open(&a, dir, GPC_SPLIT_TRAIN, B, T, seed, 1, 2));
    uint64_t batches = gpc_loader_batches_per_epoch(a);
    assert_int_equal(batches, ((N - 1) / T) / 2 / B); /* 62 windows, 31 per rank, 15 batches */
    int32_t in[32], tg[32], want_in[20][32], want_tg[20][32], got_in[32], got_tg[32];
    /* stop at several points, including the last batch of an epoch */
    uint64_t stops[] = {0, 3, batches - 1, batches, batches + 4};
    for (int k = 0; k < 5; k++) {
        gpc_loader_rewind(a);
        for (uint64_t i = 0; i < stops[k]; i++)
            TEST_OK(gpc_loader_next(a, in, tg));
        gpc_loader_state st;
        gpc_loader_get_state(a, &st);
        assert_int_equal(st.epoch * batches + st.batch, stops[k]);
        for (int i = 0; i < 20; i++)
            TEST_OK(gpc_loader_next(a, want_in[i], want_tg[i]));
        TEST_OK(gpc_loader_open(&b, dir, GPC_SPLIT_TRAIN, B, T, seed, 1, 2));
        TEST_OK(gpc_loader_set_state(b, &st));
        for (int i = 0; i < 20; i++) {
            TEST_OK(gpc_loader_next(b, got_in, got_tg));
            assert_memory_equal(got_in, want_in[i], sizeof got_in);
            assert_memory_equal(got_tg, want_tg[i], sizeof got_tg);
        }
        gpc_loader_close(b);
    }
    gpc_loader_state past = {0, batches};
    TEST_FAILS(gpc_loader_set_state(a, &past), GPC_ERR_MISMATCH, "past this loader's 15 batches");
    gpc_loader_close(a);

    /* too little data: 40 validation tokens hold 2 windows of 16 */
    gpc_loader *l = NULL;
    TEST_FAILS(gpc_loader_open(&l, dir, GPC_SPLIT_VAL, 3, T, seed, 0, 1), GPC_ERR_MISMATCH,
               "has 40 tokens, too few for one batch of 3 x 16 tokens, which needs 49 tokens: "
               "lower --batch or --context");
    TEST_FAILS(gpc_loader_open(&l, dir, GPC_SPLIT_TRAIN, 8, 64, seed, 0, 2), GPC_ERR_MISMATCH,
               "on each of 2 ranks, which needs 1025 tokens");
    assert_null(l);
    TEST_FAILS(gpc_loader_open(&l, dir, GPC_SPLIT_TRAIN, 0, 16, seed, 0, 1), GPC_ERR_INVALID_ARG,
               "must both be at least 1");
    TEST_FAILS(gpc_loader_open(&l, dir, GPC_SPLIT_TRAIN, 1, 16, seed, 2, 2), GPC_ERR_INVALID_ARG,
               "rank 2 is not in 0..1");
    TEST_FAILS(gpc_loader_open(&l, "/nonexistent/ds", GPC_SPLIT_TRAIN, 1, 16, seed, 0, 1),
               GPC_ERR_IO, "gpc data prepare");
    free(train);
    test_rmtree(dir);
    gpc_free(dir);
}

/* ---------------------------------------------------------- prepare, synth */

typedef struct {
    char *text;
    size_t bytes;
} doc;

static void test_prepare_small_corpus(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 25);
    char *dir = test_tmpdir("prepare");
    char *in = path_in(dir, "in"), *sub = path_in(dir, "in/sub"), *out = path_in(dir, "out");
    assert_int_equal(mkdir(in, 0777), 0);
    assert_int_equal(mkdir(sub, 0777), 0);
    /* files are read in sorted path order: in/a, in/b.bin (binary), in/c,
     * in/sub/d, and in/z (a link to in/a, read once) */
    static const char *const phrases[] = {
        "Why did the chicken cross the road?\n", "A penny saved is a penny earned.\n",
        "  -- Benjamin Franklin, 1737\n", "Computers are fast; programmers are slow.\n",
        "%% is not a separator, nor is 100%\n"};
    doc docs[64];
    int ndocs = 0;
    const char *names[] = {"in/a", "in/c", "in/sub/d"};
    for (int f = 0; f < 3; f++) {
        char text[8192];
        size_t n = 0;
        int entries = 5 + (int)gpc_rng_below(&rng, 10);
        for (int e = 0; e < entries; e++) {
            size_t start = n;
            int lines = 1 + (int)gpc_rng_below(&rng, 3);
            for (int k = 0; k < lines; k++)
                n += (size_t)sprintf(text + n, "%s", phrases[gpc_rng_below(&rng, 5)]);
            docs[ndocs].bytes = n - start;
            docs[ndocs].text = malloc(n - start);
            memcpy(docs[ndocs].text, text + start, n - start);
            ndocs++;
            if (e + 1 < entries) n += (size_t)sprintf(text + n, "%s", f == 1 ? "%\r\n" : "%\n");
        }
        if (f == 0) n += (size_t)sprintf(text + n, "%%\n%%\n   \n"); /* blank documents */
        char *path = path_in(dir, names[f]);
        write_all(path, text, n);
        free(path);
    }
    char *bin = path_in(dir, "in/b.bin"), *link = path_in(dir, "in/z"), *a = path_in(dir, "in/a");
    write_all(bin, "DAT\0\1\2", 6);
    assert_int_equal(symlink(a, link), 0);

    gpc_prepare_options o;
    gpc_prepare_options_init(&o);
    assert_int_equal(o.vocab_size, 4096);
    assert_true(o.val_fraction == 0.05);
    gpc_prepare_summary sum;
    o.vocab_size = 300;
    o.val_fraction = 0.25;
    o.shard_tokens = 100; /* several shards */
    o.summary = &sum;
    const char *inputs[] = {in};
    TEST_OK(gpc_data_prepare(inputs, 1, out, &o));
    assert_int_equal(sum.files, 3);
    assert_int_equal(sum.skipped_files, 1);
    assert_int_equal(sum.documents, ndocs);
    /* document d goes to validation when floor((d+1)/4) > floor(d/4) */
    int is_val[64], nval = 0;
    size_t bytes = 0;
    for (int d = 0; d < ndocs; d++) {
        is_val[d] = (d + 1) / 4 > d / 4;
        nval += is_val[d];
        bytes += docs[d].bytes;
    }
    assert_int_equal(sum.val_documents, nval);
    assert_int_equal(sum.train_documents, ndocs - nval);
    assert_int_equal(sum.text_bytes, bytes);
    assert_int_equal(sum.vocab_size, 300);

    gpc_dataset_info info;
    TEST_OK(gpc_dataset_info_read(out, &info));
    assert_int_equal(info.vocab_size, 300);
    assert_int_equal(info.has_tokenizer, 1);
    assert_int_equal(info.train_tokens, sum.train_tokens);
    assert_int_equal(info.train_shards, (int)((sum.train_tokens + 99) / 100));
    /* decoding each split gives its documents in order, each ended by EOT */
    gpc_tokenizer *tok;
    char *tok_path = path_in(out, "tokenizer.bin");
    TEST_OK(gpc_tokenizer_load(&tok, tok_path));
    uint32_t eot = (uint32_t)gpc_tokenizer_eot(tok);
    for (int split = 0; split < 2; split++) {
        int shards = split ? info.val_shards : info.train_shards;
        int d = 0;
        while (d < ndocs && is_val[d] != split)
            d++;
        char *pending = malloc(65536);
        size_t pending_bytes = 0;
        for (int s = 0; s < shards; s++) {
            char path[4200];
            snprintf(path, sizeof path, "%s/%s_%04d.bin", out, split ? "val" : "train", s);
            gpc_shard_info si;
            uint32_t *tokens;
            TEST_OK(gpc_shard_read(path, &si, &tokens));
            for (uint64_t i = 0; i < si.tokens; i++) {
                if (tokens[i] != eot) {
                    size_t len;
                    const char *piece = gpc_tokenizer_token_bytes(tok, tokens[i], &len);
                    memcpy(pending + pending_bytes, piece, len);
                    pending_bytes += len;
                    continue;
                }
                assert_true(d < ndocs);
                assert_int_equal(pending_bytes, docs[d].bytes);
                assert_memory_equal(pending, docs[d].text, pending_bytes);
                pending_bytes = 0;
                d++;
                while (d < ndocs && is_val[d] != split)
                    d++;
            }
            gpc_free(tokens);
        }
        assert_int_equal(d, ndocs); /* every document of the split was there */
        assert_int_equal(pending_bytes, 0);
        free(pending);
    }
    gpc_tokenizer_free(tok);

    /* input and output errors */
    const char *missing[] = {in, "/nonexistent/corpus"};
    TEST_FAILS(gpc_data_prepare(missing, 2, out, &o), GPC_ERR_IO,
               "input /nonexistent/corpus: No such file or directory");
    const char *binary_only[] = {bin};
    TEST_FAILS(gpc_data_prepare(binary_only, 1, out, &o), GPC_ERR_FORMAT,
               "no text found in the inputs (1 binary files skipped)");
    char *under_file = path_in(dir, "in/a/out");
    TEST_FAILS(gpc_data_prepare(inputs, 1, under_file, &o), GPC_ERR_IO, "output folder: ");
    o.vocab_size = 256;
    TEST_FAILS(gpc_data_prepare(inputs, 1, out, &o), GPC_ERR_INVALID_ARG, "257 to 65536");
    o.vocab_size = 300;
    o.val_fraction = 0.7;
    TEST_FAILS(gpc_data_prepare(inputs, 1, out, &o), GPC_ERR_INVALID_ARG, "use 0 to 0.5");
    /* the earlier dataset is still intact */
    TEST_OK(gpc_dataset_info_read(out, &info));

    for (int d = 0; d < ndocs; d++)
        free(docs[d].text);
    free(under_file);
    free(tok_path);
    free(bin);
    free(link);
    free(a);
    free(in);
    free(sub);
    free(out);
    test_rmtree(dir);
    gpc_free(dir);
}

static void test_synth(void **state) {
    (void)state;
    char *dir = test_tmpdir("synth");
    uint64_t seed = test_seed();
    gpc_dataset_info info;
    TEST_OK(gpc_data_synth(dir, 100000, 50000, seed, 20000));
    TEST_OK(gpc_dataset_info_read(dir, &info));
    assert_int_equal(info.vocab_size, 100000);
    assert_int_equal(info.val_tokens, 2500); /* 1/20 */
    assert_int_equal(info.train_tokens, 47500);
    assert_int_equal(info.train_shards, 3);
    assert_int_equal(info.has_tokenizer, 0);
    /* uniform: the mean of 47500 draws is (V-1)/2 within 4 standard errors */
    double sum = 0;
    uint32_t *first = NULL;
    for (int s = 0; s < 3; s++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/train_%04d.bin", dir, s);
        gpc_shard_info si;
        uint32_t *tokens;
        TEST_OK(gpc_shard_read(path, &si, &tokens));
        assert_int_equal(si.dtype, GPC_U32);
        for (uint64_t i = 0; i < si.tokens; i++)
            sum += tokens[i];
        if (s == 0)
            first = tokens;
        else
            gpc_free(tokens);
    }
    double mean = sum / 47500, sd = 100000 / sqrt(12.0) / sqrt(47500.0);
    assert_true(fabs(mean - 49999.5) < 4 * sd);
    /* the same seed writes the same tokens, another seed others */
    char *dir2 = test_tmpdir("synth2");
    TEST_OK(gpc_data_synth(dir2, 100000, 50000, seed, 20000));
    char path[4200];
    snprintf(path, sizeof path, "%s/train_0000.bin", dir2);
    gpc_shard_info si;
    uint32_t *tokens;
    TEST_OK(gpc_shard_read(path, &si, &tokens));
    assert_memory_equal(tokens, first, 20000 * sizeof *tokens);
    gpc_free(tokens);
    TEST_OK(gpc_data_synth(dir2, 100000, 50000, seed + 1, 20000));
    TEST_OK(gpc_shard_read(path, &si, &tokens));
    assert_memory_not_equal(tokens, first, 20000 * sizeof *tokens);
    gpc_free(tokens);
    gpc_free(first);
    /* small counts keep one window of 1024 for validation when they can */
    TEST_OK(gpc_data_synth(dir2, 50257, 4000, seed, 0));
    TEST_OK(gpc_dataset_info_read(dir2, &info));
    assert_int_equal(info.val_tokens, 1025);
    assert_int_equal(info.train_tokens, 4000 - 1025);
    TEST_OK(gpc_data_synth(dir2, 50257, 100, seed, 0));
    TEST_OK(gpc_dataset_info_read(dir2, &info));
    assert_int_equal(info.val_tokens, 50);
    TEST_FAILS(gpc_data_synth(dir2, 1, 100, seed, 0), GPC_ERR_INVALID_ARG, "use 2 to 2147483648");
    TEST_FAILS(gpc_data_synth(dir2, 100, 0, seed, 0), GPC_ERR_INVALID_ARG, "at least 1");
    test_rmtree(dir);
    test_rmtree(dir2);
    gpc_free(dir);
    gpc_free(dir2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shard_round_trip),
        cmocka_unit_test(test_shard_corrupt_files),
        cmocka_unit_test(test_dataset_info_errors),
        cmocka_unit_test(test_loader_windows_shuffle_ranks),
        cmocka_unit_test(test_loader_resume_and_errors),
        cmocka_unit_test(test_prepare_small_corpus),
        cmocka_unit_test(test_synth),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
