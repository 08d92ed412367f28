/* test_checkpoint.c: GPT checkpoints: a save/load round trip is bitwise
 * (weights, AdamW moments, training state), and a file that is missing, not a
 * checkpoint, truncated, corrupt, of another version or for another model is
 * each rejected with its own message. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpc/model.h"

static char *dir;

static int setup(void **state) {
    (void)state;
    dir = test_tmpdir("checkpoint");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    test_rmtree(dir);
    gpc_free(dir);
    return 0;
}

static char *path_in(const char *name) {
    static char paths[4][4096];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, 4096, "%s/%s", dir, name);
    return p;
}

static gpt_model *make_model(int layers, int training) {
    gpt_config c;
    gpt_model *m = NULL;
    TEST_OK(gpt_config_init(&c, layers, 2, 16, 8, 67));
    TEST_OK(gpt_create(&m, &c, gpc_cpu(), GPC_F32, 2, 8, training));
    return m;
}

/* A model with random weights and non-zero moments (after one real step). */
static gpt_model *trained_model(gpc_rng *rng) {
    gpt_model *m = make_model(2, 1);
    TEST_OK(gpt_init_weights(m, gpc_rng_u32(rng)));
    int32_t tok[16], tgt[16];
    for (int i = 0; i < 16; i++) {
        tok[i] = (int32_t)gpc_rng_below(rng, 67);
        tgt[i] = (int32_t)gpc_rng_below(rng, 67);
    }
    TEST_OK(gpt_zero_grad(m));
    TEST_OK(gpt_forward_backward(m, tok, tgt, 2, 8, 1.0f / 16));
    gpc_optim_options o;
    gpc_optim_defaults(&o);
    TEST_OK(gpt_update(m, &o, NULL, NULL));
    return m;
}

static gpt_checkpoint_state sample_state(gpc_rng *rng) {
    gpt_checkpoint_state s;
    memset(&s, 0, sizeof s);
    s.step = 1 + gpc_rng_below(rng, 100000);
    s.loader_epoch = gpc_rng_below(rng, 10);
    s.loader_batch = gpc_rng_below(rng, 1000);
    gpc_rng_seed(&s.rng, gpc_rng_u32(rng), 5);
    s.loss_scale = 1.0f;
    s.batch = 2;
    s.context = 8;
    s.total_batch = 32;
    s.steps = 500;
    s.warmup = 50;
    s.learning_rate = 6e-4;
    s.min_lr_ratio = 0.1;
    s.weight_decay = 0.1;
    s.max_grad_norm = 1.0;
    s.seed = gpc_rng_u32(rng);
    s.recompute = (int32_t)gpc_rng_below(rng, 3);
    return s;
}

static void assert_tensor_equal(const gpc_tensor *a, const gpc_tensor *b) {
    assert_int_equal(gpc_tensor_bytes(a), gpc_tensor_bytes(b));
    assert_memory_equal(a->data, b->data, gpc_tensor_bytes(a)); /* CPU tensors */
}

static void test_round_trip(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 21);
    gpt_model *a = trained_model(&rng);
    gpt_checkpoint_state s = sample_state(&rng), got;
    const char *path = path_in("ckpt.bin");
    TEST_OK(gpt_checkpoint_save(path, a, &s));

    gpt_config config;
    gpc_dtype precision;
    TEST_OK(gpt_checkpoint_read_header(path, &config, &precision, &got));
    assert_true(gpt_config_equal(&config, gpt_get_config(a), "test"));
    assert_int_equal(precision, GPC_F32);
    assert_memory_equal(&got, &s, sizeof s);

    gpt_model *b = make_model(2, 1);
    memset(&got, 0, sizeof got);
    TEST_OK(gpt_checkpoint_load(path, b, &got));
    assert_memory_equal(&got, &s, sizeof s);
    assert_tensor_equal(gpt_params_flat(a), gpt_params_flat(b));
    assert_tensor_equal(gpc_optim_m(gpt_optimizer(a)), gpc_optim_m(gpt_optimizer(b)));
    assert_tensor_equal(gpc_optim_v(gpt_optimizer(a)), gpc_optim_v(gpt_optimizer(b)));

    /* an inference model takes the weights and skips the moments */
    gpt_model *c = make_model(2, 0);
    TEST_OK(gpt_checkpoint_load(path, c, NULL));
    assert_tensor_equal(gpt_params_flat(a), gpt_params_flat(c));
    /* and its own checkpoint (weights only) loads into a training model with
     * zero moments */
    TEST_OK(gpt_checkpoint_save(path_in("weights.bin"), c, &s));
    TEST_OK(gpt_checkpoint_load(path_in("weights.bin"), b, NULL));
    assert_tensor_equal(gpt_params_flat(a), gpt_params_flat(b));
    for (size_t i = 0; i < gpt_num_params(b); i++)
        assert_true(((const float *)gpc_optim_m(gpt_optimizer(b))->data)[i] == 0.0f);
    gpt_free(a), gpt_free(b), gpt_free(c);
}

static int all_zero(const gpc_tensor *t) {
    const float *x = t->data;
    for (int64_t i = 0; i < gpc_tensor_numel(t); i++)
        if (x[i] != 0.0f) return 0;
    return 1;
}

/* gpt_checkpoint_load_weights (how --init-from starts a run): the weights
 * bit for bit, the file's moments left behind and the model's own zeroed,
 * for a whole model and for a tp rank's slice; a corrupt file is refused
 * as gpt_checkpoint_load refuses it. */
static void test_load_weights(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 24);
    gpt_model *a = trained_model(&rng);
    gpt_checkpoint_state s = sample_state(&rng);
    const char *path = path_in("init.bin");
    TEST_OK(gpt_checkpoint_save(path, a, &s));
    gpt_model *b = trained_model(&rng); /* other weights, moments not zero */
    assert_false(all_zero(gpc_optim_m(gpt_optimizer(b))));
    TEST_OK(gpt_checkpoint_load_weights(path, b));
    assert_tensor_equal(gpt_params_flat(a), gpt_params_flat(b));
    assert_true(all_zero(gpc_optim_m(gpt_optimizer(b))));
    assert_true(all_zero(gpc_optim_v(gpt_optimizer(b))));

    /* tp rank 1 of 2 takes its slice of the whole weights */
    const gpt_config *c = gpt_get_config(a);
    size_t P = gpt_num_params(a), Pl = gpt_tp_num_params(c, 2);
    float *whole = malloc(P * sizeof *whole), *want = malloc(Pl * sizeof *want);
    float *got = malloc(Pl * sizeof *got);
    TEST_OK(gpt_get_params(a, whole));
    gpt_tp_slice(c, 2, 1, whole, want);
    gpt_model *part = NULL;
    TEST_OK(gpt_create_tp(&part, c, gpc_cpu(), GPC_F32, 2, 8, 0, 2, 1, 0, SIZE_MAX));
    TEST_OK(gpt_checkpoint_load(path, part, NULL)); /* moments too */
    assert_false(all_zero(gpc_optim_m(gpt_optimizer(part))));
    TEST_OK(gpt_checkpoint_load_weights(path, part));
    TEST_OK(gpt_get_params(part, got));
    assert_memory_equal(got, want, Pl * sizeof *got);
    assert_true(all_zero(gpc_optim_m(gpt_optimizer(part))));
    assert_true(all_zero(gpc_optim_v(gpt_optimizer(part))));

    /* a flipped byte in the moments still fails the checksum */
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, -64, SEEK_END);
    int byte = fgetc(f);
    fseek(f, -64, SEEK_END);
    fputc(byte ^ 0x40, f);
    fclose(f);
    TEST_FAILS(gpt_checkpoint_load_weights(path, b), GPC_ERR_FORMAT, "checksum does not match");
    free(whole), free(want), free(got);
    gpt_free(a), gpt_free(b), gpt_free(part);
}

static char *slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(*size);
    assert_int_equal(fread(buf, 1, *size, f), *size);
    fclose(f);
    return buf;
}

/* A checkpoint written from a host array (what an import does, with no
 * model built) is byte for byte the one an inference model of the same
 * weights writes. */
static void test_save_weights(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 22);
    gpt_model *m = make_model(2, 0);
    size_t n = gpt_num_params(m);
    float *w = malloc(n * sizeof *w);
    gpc_rng_fill_normal(&rng, w, n, 0.0f, 1.0f);
    TEST_OK(gpt_set_params(m, w));
    gpt_checkpoint_state s = sample_state(&rng);
    s.loss_scale = 1.0f;
    TEST_OK(gpt_checkpoint_save(path_in("model.bin"), m, &s));
    TEST_OK(gpt_checkpoint_save_weights(path_in("array.bin"), gpt_get_config(m), w, &s));
    size_t na, nb;
    char *a = slurp(path_in("model.bin"), &na), *b = slurp(path_in("array.bin"), &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na);
    free(a), free(b), free(w);
    gpt_free(m);
}

/* --recompute travels in the header as value + 1, so checkpoints written
 * before it was stored (zeros there) read back as -1, "not recorded". */
static void test_recompute_in_header(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 23);
    gpt_model *a = trained_model(&rng);
    gpt_checkpoint_state s = sample_state(&rng), got;
    const char *path = path_in("recompute.bin");
    for (int r = -1; r <= 2; r++) {
        s.recompute = r;
        TEST_OK(gpt_checkpoint_save(path, a, &s));
        char *bytes;
        size_t size;
        TEST_OK(gpc_read_file(path, &bytes, &size));
        int32_t stored;
        memcpy(&stored, bytes + 168, 4);
        assert_int_equal(stored, r + 1); /* r = -1: the zeros of an older file */
        gpc_free(bytes);
        memset(&got, 0x5a, sizeof got);
        TEST_OK(gpt_checkpoint_read_header(path, NULL, NULL, &got));
        assert_int_equal(got.recompute, r);
    }
    gpt_free(a);
}

/* Writes bytes to a file in the test directory. */
static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void test_bad_files(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 22);
    gpt_model *a = trained_model(&rng);
    gpt_checkpoint_state s = sample_state(&rng);
    const char *good = path_in("good.bin");
    TEST_OK(gpt_checkpoint_save(good, a, &s));
    char *bytes;
    size_t size;
    TEST_OK(gpc_read_file(good, &bytes, &size));
    gpt_model *b = make_model(2, 1);
    const char *bad = path_in("bad.bin");

    TEST_FAILS(gpt_checkpoint_load(path_in("absent.bin"), b, NULL), GPC_ERR_IO, "cannot open");

    write_bytes(bad, "hello, this is text and not a checkpoint at all", 48);
    TEST_FAILS(gpt_checkpoint_load(bad, b, NULL), GPC_ERR_FORMAT, "not a gpc checkpoint");

    /* truncated: in the payload, and inside the header */
    write_bytes(bad, bytes, size - 1 - gpc_rng_below(&rng, (uint32_t)(size - 300)));
    TEST_FAILS(gpt_checkpoint_load(bad, b, NULL), GPC_ERR_FORMAT, "is truncated");
    TEST_FAILS(gpt_checkpoint_read_header(bad, NULL, NULL, NULL), GPC_ERR_FORMAT, "is truncated");
    write_bytes(bad, bytes, 100);
    TEST_FAILS(gpt_checkpoint_load(bad, b, NULL), GPC_ERR_FORMAT, "is truncated");

    /* one flipped byte anywhere after the header: the checksum catches it */
    size_t at = 256 + gpc_rng_below(&rng, (uint32_t)(size - 256));
    bytes[at] ^= (char)(1 + gpc_rng_below(&rng, 255));
    write_bytes(bad, bytes, size);
    TEST_FAILS(gpt_checkpoint_load(bad, b, NULL), GPC_ERR_FORMAT, "checksum does not match");
    gpc_free(bytes);
    TEST_OK(gpc_read_file(good, &bytes, &size)); /* a fresh copy */

    /* a flipped byte in the training state of the header: checksum too */
    bytes[60] ^= 0x10;
    write_bytes(bad, bytes, size);
    TEST_FAILS(gpt_checkpoint_load(bad, b, NULL), GPC_ERR_FORMAT, "checksum does not match");
    bytes[60] ^= 0x10;

    /* a damaged model shape in the header: the checksum, not the shape, is
     * what is reported, since nothing is used before the checksum holds */
    bytes[16] ^= 0x04;
    write_bytes(bad, bytes, size);
    TEST_FAILS(gpt_checkpoint_read_header(bad, NULL, NULL, NULL), GPC_ERR_FORMAT,
               "checksum does not match");
    bytes[16] ^= 0x04;

    /* fields out of range in a file whose checksum holds (a crafted or
     * foreign file): each is named, none reaches the trainer (a zero
     * micro-batch there was a division by zero) */
    static const struct {
        int offset, bytes;
        uint64_t value;
        const char *field;
    } crafted[] = {
        {100, 4, 0, "its batch"},                             /* batch 0 */
        {104, 4, 9, "its context"},                           /* longer than max_context 8 */
        {108, 4, 0, "its steps"},                             /* steps 0 */
        {120, 8, 33, "its total batch"},                      /* not a multiple of 2 x 8 */
        {128, 8, 0x7ff8000000000000ull, "its learning rate"}, /* NaN */
        {136, 8, 0x4000000000000000ull, "its min lr ratio"},  /* 2.0 */
        {168, 4, 14, "its recompute"}, /* recompute 13: gelu on 3 blocks of 2 */
        {44, 4, 2, "its optimizer flag"},
    };
    for (size_t k = 0; k < sizeof crafted / sizeof crafted[0]; k++) {
        char *copy = gpc_malloc(size);
        memcpy(copy, bytes, size);
        memcpy(copy + crafted[k].offset, &crafted[k].value, (size_t)crafted[k].bytes);
        uint32_t crc = gpc_crc32c(0, copy, size - 4);
        memcpy(copy + size - 4, &crc, 4);
        write_bytes(bad, copy, size);
        gpc_free(copy);
        TEST_FAILS(gpt_checkpoint_read_header(bad, NULL, NULL, NULL), GPC_ERR_FORMAT,
                   crafted[k].field);
        TEST_FAILS(gpt_checkpoint_load(bad, b, NULL), GPC_ERR_FORMAT, "out of range");
    }

    /* a FIFO is refused at once instead of blocking the open */
    const char *fifo = path_in("fifo.bin");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    alarm(20); /* a blocked open fails the test instead of hanging it */
    TEST_FAILS(gpt_checkpoint_read_header(fifo, NULL, NULL, NULL), GPC_ERR_FORMAT,
               "is not a regular file");
    alarm(0);

    /* another format version */
    uint32_t version = GPT_CHECKPOINT_VERSION + 1;
    memcpy(bytes + 8, &version, 4);
    write_bytes(bad, bytes, size);
    TEST_FAILS(gpt_checkpoint_load(bad, b, NULL), GPC_ERR_FORMAT, "has format version 2");
    gpc_free(bytes);

    /* another model */
    gpt_model *deeper = make_model(3, 1);
    TEST_FAILS(gpt_checkpoint_load(good, deeper, NULL), GPC_ERR_MISMATCH,
               "was written by a model with 2 layers; this config has 3");
    gpt_config wide;
    gpt_model *other = NULL;
    TEST_OK(gpt_config_init(&wide, 2, 2, 16, 8, 300));
    TEST_OK(gpt_create(&other, &wide, gpc_cpu(), GPC_F32, 1, 8, 0));
    TEST_FAILS(gpt_checkpoint_load(good, other, NULL), GPC_ERR_MISMATCH,
               "67 tokens of vocabulary; this config has 300");
    gpt_free(a), gpt_free(b), gpt_free(deeper), gpt_free(other);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),   cmocka_unit_test(test_save_weights),
        cmocka_unit_test(test_load_weights), cmocka_unit_test(test_recompute_in_header),
        cmocka_unit_test(test_bad_files),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
