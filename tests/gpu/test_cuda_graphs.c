/*
 * test_cuda_graphs.c: decode steps replayed as CUDA graphs (gpt_serve.c)
 * against the same steps launched op by op (gpt_paged_options.eager), on
 * one random bf16 model.
 *
 * Both caches get the same prompts, then the same decode steps of 1, 3,
 * 17, 64 and 200 rows in an order that shrinks and grows the batch across
 * buckets (4, 32 and the cap of 200 rows pad), each step once returning
 * logits and once drawing (greedy and sampled rows). Padding does not
 * depend on graphs, so the kernels and shapes are the same and everything
 * must agree bit for bit: logits, tokens, and every real block of the
 * caches. The caches start as NaN: blocks no sequence owns, and slots past
 * each sequence's last position, must still be NaN at the end, so the
 * padding rows wrote nowhere but their own block. The graph cache must have
 * captured graphs, the eager one none. GPC_SERVE_GRAPHS=0 must capture
 * nothing, and the engine's cuda_graphs switch must change no token.
 *
 * Without a usable GPU the test exits 77, which CTest reports as skipped.
 */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/engine.h"
#include "gpc/model.h"
#include "gpc/settings.h"
#include "model/gpt_internal.h"

enum {
    LAYERS = 2,
    HEADS = 2,
    CHANNELS = 128,
    CONTEXT = 128,
    VOCAB = 300,
    BS = 16,
    SEQS = 200,
    PER_SEQ = 3, /* blocks a sequence owns: 48 positions, more than it reaches */
    SPARE = 8,   /* blocks no sequence owns */
    BLOCKS = SEQS * PER_SEQ + SPARE,
    MAX_TOKENS = 512,
};

static const gpc_device gpu = {GPC_DEVICE_CUDA, 0};

typedef struct {
    int32_t tokens[PER_SEQ * BS];
    int len; /* tokens known */
    int32_t blocks[PER_SEQ];
} sequence;

static sequence seqs[SEQS];
static int max_blocks;

/* Row j of a step for sequence sid: its token at pos, of step sequence
 * j, whose table row is sid's blocks. */
static void set_table(int j, int sid, int32_t *tables) {
    for (int b = 0; b < max_blocks; b++)
        tables[j * max_blocks + b] = b < PER_SEQ ? seqs[sid].blocks[b] : -1;
}

static void set_row(int i, int j, int sid, int pos, int32_t *tok, int32_t *posn, int32_t *seq,
                    int32_t *slot) {
    const sequence *s = &seqs[sid];
    tok[i] = s->tokens[pos], posn[i] = pos, seq[i] = j;
    slot[i] = s->blocks[pos / BS] * BS + pos % BS;
}

/* Fills both caches with 0xff bytes: NaN in bf16. */
static void fill_nan(gpt_paged *p) {
    gpc_tensor k, v;
    gpt_paged_cache(p, &k, &v);
    size_t bytes = gpc_tensor_bytes(&k);
    unsigned char *h = malloc(bytes);
    memset(h, 0xff, bytes);
    gpc_tensor host = gpc_tensor_make(h, k.dtype, gpc_cpu(), k.ndim, k.shape);
    TEST_OK(gpc_tensor_copy(&k, &host));
    TEST_OK(gpc_tensor_copy(&v, &host));
    free(h);
}

static uint16_t *cache_to_host(gpt_paged *p, int which) {
    gpc_tensor k, v;
    gpt_paged_cache(p, &k, &v);
    gpc_tensor *t = which ? &v : &k;
    uint16_t *h = malloc(gpc_tensor_bytes(t));
    gpc_tensor host = gpc_tensor_make(h, t->dtype, gpc_cpu(), t->ndim, t->shape);
    TEST_OK(gpc_tensor_copy(&host, t));
    return h;
}

static void test_graphs_match_eager(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 39);
    gpt_model *m =
        test_make_serving_model(gpu, GPC_BF16, LAYERS, HEADS, CHANNELS, CONTEXT, VOCAB, 20261202);
    gpt_paged_options po = test_paged_options(BLOCKS, BS, SEQS, MAX_TOKENS);
    gpt_paged *pg = NULL, *pe = NULL;
    TEST_OK(gpt_paged_create(&pg, m, &po));
    po.eager = 1;
    TEST_OK(gpt_paged_create(&pe, m, &po));
    int graphs_on = gpc_setting_flag("GPC_SERVE_GRAPHS");
    /* the start-up captured a drawing graph for each bucket: 1 .. 128, 200 */
    if (graphs_on) assert_true(gpt_paged_graph_count(pg) >= 9);
    assert_int_equal(gpt_paged_graph_count(pe), 0);
    fill_nan(pg);
    fill_nan(pe);
    max_blocks = gpt_paged_max_blocks(pg);

    /* blocks handed out in a shuffled order; the last SPARE nobody owns */
    int order[BLOCKS];
    for (int i = 0; i < BLOCKS; i++)
        order[i] = i;
    for (int i = BLOCKS - 1; i > 0; i--) {
        int k = (int)gpc_rng_below(&rng, (uint32_t)i + 1), t = order[i];
        order[i] = order[k], order[k] = t;
    }
    for (int s = 0; s < SEQS; s++) {
        seqs[s].len = 1 + (int)gpc_rng_below(&rng, 12);
        for (int i = 0; i < seqs[s].len; i++)
            seqs[s].tokens[i] = (int32_t)gpc_rng_below(&rng, VOCAB);
        for (int b = 0; b < PER_SEQ; b++)
            seqs[s].blocks[b] = order[s * PER_SEQ + b];
    }

    int32_t *tok = malloc(MAX_TOKENS * sizeof *tok), *pos = malloc(MAX_TOKENS * sizeof *pos);
    int32_t *seq = malloc(MAX_TOKENS * sizeof *seq), *slot = malloc(MAX_TOKENS * sizeof *slot);
    int32_t *tables = malloc((size_t)SEQS * max_blocks * sizeof *tables);
    float *lg = malloc((size_t)SEQS * VOCAB * sizeof *lg);
    float *le = malloc((size_t)SEQS * VOCAB * sizeof *le);

    /* the prompts but their last tokens, 25 sequences a step, no logits
     * (not decode steps: they run as they are on both) */
    for (int first = 0; first < SEQS; first += 25) {
        int n = 0;
        for (int j = 0; j < 25; j++) {
            set_table(j, first + j, tables);
            for (int i = 0; i + 1 < seqs[first + j].len; i++, n++)
                set_row(n, j, first + j, i, tok, pos, seq, slot);
        }
        if (n == 0) continue;
        gpt_paged_batch b = {n, tok, pos, seq, slot, 25, tables, 0, NULL};
        TEST_OK(gpt_step_paged(pg, &b, NULL));
        TEST_OK(gpt_step_paged(pe, &b, NULL));
    }

    /* decode steps: shrinking and growing across buckets */
    static const int sizes[] = {1, 3, 17, 64, 200, 64, 3, 200, 17, 1, 64, 200, 3};
    int steps = (int)(sizeof sizes / sizeof sizes[0]);
    gpt_paged_sampling *rows = malloc(SEQS * sizeof *rows);
    int32_t *dg = malloc(SEQS * sizeof *dg), *de = malloc(SEQS * sizeof *de);
    for (int k = 0; k < steps; k++) {
        int n = sizes[k], offset = (k * 37) % SEQS;
        for (int j = 0; j < n; j++) {
            int s = (offset + j) % SEQS;
            set_table(j, s, tables);
            set_row(j, j, s, seqs[s].len - 1, tok, pos, seq, slot);
            int greedy = (j + k) % 3 == 0;
            rows[j] = (gpt_paged_sampling){greedy ? 0.0f : 0.9f, greedy ? 0.0f : 40.0f, 0.95f,
                                           (float)gpc_rng_uniform(&rng), -1};
            if (j % 7 == 3) rows[j].forbidden = (int32_t)gpc_rng_below(&rng, VOCAB);
        }
        gpt_paged_batch b = {n, tok, pos, seq, slot, n, tables, n, NULL};
        TEST_OK(gpt_step_paged(pg, &b, lg));
        TEST_OK(gpt_step_paged(pe, &b, le));
        if (memcmp(lg, le, (size_t)n * VOCAB * sizeof *lg) != 0)
            fail_msg("step %d (%d rows): logits with graphs differ from those without", k, n);
        TEST_OK(gpt_step_paged_sample(pg, &b, rows, dg));
        TEST_OK(gpt_step_paged_sample(pe, &b, rows, de));
        for (int j = 0; j < n; j++) {
            if (dg[j] != de[j])
                fail_msg("step %d (%d rows), row %d: token %d with graphs, %d without", k, n, j,
                         dg[j], de[j]);
            assert_true(dg[j] >= 0 && dg[j] < VOCAB);
            if (rows[j].forbidden >= 0) assert_int_not_equal(dg[j], rows[j].forbidden);
            sequence *s = &seqs[(offset + j) % SEQS];
            s->tokens[s->len++] = dg[j];
        }
    }
    if (graphs_on) assert_true(gpt_paged_graph_count(pg) > 9); /* logits steps too by now */
    assert_int_equal(gpt_paged_graph_count(pe), 0);

    /* the caches: real blocks equal bit for bit; NaN wherever no real row
     * wrote (unowned blocks, and slots past a sequence's last position) */
    const uint16_t nan = 0xffff;
    size_t per_block = (size_t)BS * CHANNELS, cache_blocks = BLOCKS + 1;
    unsigned char *written = calloc((size_t)BLOCKS * BS, 1);
    for (int s = 0; s < SEQS; s++)
        for (int i = 0; i < seqs[s].len - 1; i++) /* the last token has not run */
            written[seqs[s].blocks[i / BS] * BS + i % BS] = 1;
    for (int which = 0; which < 2; which++) {
        uint16_t *g = cache_to_host(pg, which), *e = cache_to_host(pe, which);
        for (int l = 0; l < LAYERS; l++) {
            size_t layer = (size_t)l * cache_blocks * per_block;
            if (memcmp(g + layer, e + layer, BLOCKS * per_block * sizeof *g) != 0)
                fail_msg("layer %d's %s differ between the caches with and without graphs", l,
                         which ? "values" : "keys");
            for (size_t slot_i = 0; slot_i < (size_t)BLOCKS * BS; slot_i++) {
                const uint16_t *x = g + layer + slot_i * CHANNELS;
                int any_nan = 0, all_nan = 1;
                for (int c = 0; c < CHANNELS; c++)
                    any_nan |= x[c] == nan, all_nan &= x[c] == nan;
                if (written[slot_i] && any_nan)
                    fail_msg("layer %d slot %zu: a real row's key or value is NaN", l, slot_i);
                if (!written[slot_i] && !all_nan)
                    fail_msg("layer %d slot %zu: written though no real row is there (block %zu)",
                             l, slot_i, slot_i / BS);
            }
        }
        free(g), free(e);
    }
    free(written);
    free(tok), free(pos), free(seq), free(slot), free(tables), free(lg), free(le);
    free(rows), free(dg), free(de);
    gpt_paged_free(pg);
    gpt_paged_free(pe);
    gpt_free(m);
}

/* With GPC_SERVE_GRAPHS=0 a cache captures nothing, and its steps give
 * the tokens of a cache with graphs. */
static void test_setting_turns_graphs_off(void **state) {
    (void)state;
    gpt_model *m = test_make_serving_model(gpu, GPC_BF16, 1, 2, 64, 64, VOCAB, 7);
    gpt_paged_options po = test_paged_options(16, BS, 4, 16);
    gpt_paged *off = NULL, *on = NULL;
    TEST_OK(gpc_settings_override("GPC_SERVE_GRAPHS", "0"));
    gpc_status made = gpt_paged_create(&off, m, &po);
    TEST_OK(gpc_settings_override("GPC_SERVE_GRAPHS", NULL));
    TEST_OK(made);
    TEST_OK(gpt_paged_create(&on, m, &po));
    assert_int_equal(gpt_paged_graph_count(off), 0);
    if (gpc_setting_flag("GPC_SERVE_GRAPHS")) assert_true(gpt_paged_graph_count(on) > 0);
    int mb = gpt_paged_max_blocks(on);
    int32_t *tables = calloc((size_t)3 * mb, sizeof *tables);
    for (int s = 0; s < 3; s++) {
        tables[s * mb] = s;
        for (int b = 1; b < mb; b++)
            tables[s * mb + b] = -1;
    }
    int32_t tok[3] = {5, 9, 200}, pos[3] = {0, 0, 0}, seq[3] = {0, 1, 2};
    int32_t slot[3] = {0, BS, 2 * BS};
    gpt_paged_batch b = {3, tok, pos, seq, slot, 3, tables, 3, NULL};
    const gpt_paged_sampling rows[3] = {
        {0.0f, 0.0f, 1.0f, 0.0f, -1}, {1.0f, 0.0f, 1.0f, 0.5f, -1}, {0.7f, 10.0f, 0.9f, 0.25f, 3}};
    for (int step = 0; step < 3; step++) { /* eager, captured, replayed */
        int32_t a[3], c[3];
        TEST_OK(gpt_step_paged_sample(off, &b, rows, a));
        TEST_OK(gpt_step_paged_sample(on, &b, rows, c));
        for (int j = 0; j < 3; j++)
            assert_int_equal(a[j], c[j]);
        for (int j = 0; j < 3; j++)
            tok[j] = a[j], pos[j]++, slot[j]++;
    }
    free(tables);
    gpt_paged_free(off);
    gpt_paged_free(on);
    gpt_free(m);
}

/* One engine request's tokens (engine test below). */
typedef struct {
    int32_t got[40];
    int n, finished;
} engine_job;

static void on_engine_event(void *user, const gpc_engine_event *ev) {
    engine_job *j = user;
    if (ev->token >= 0 && j->n < 40) j->got[j->n++] = ev->token;
    if (ev->finish != GPC_FINISH_NONE) j->finished = 1;
}

/* Eight requests (prompts of 1 to 57 tokens, greedy and seeded sampled)
 * through an engine with graphs and one without: the same tokens. */
static void run_engine(const char *run_dir, int graphs, engine_job *jobs, int n) {
    gpc_engine_options o;
    gpc_engine_options_init(&o);
    o.max_batch = 16;
    o.max_step_tokens = 256;
    o.cuda_graphs = graphs;
    o.kv_bytes = 64 * gpt_paged_block_bytes(&(gpt_config){.layers = 2, .channels = 64}, GPC_BF16,
                                            o.block_size);
    gpc_engine *e = NULL;
    TEST_OK(gpc_engine_create(&e, run_dir, gpu, &o));
    gpc_rng rng;
    gpc_rng_seed(&rng, 5, 5);
    for (int i = 0; i < n; i++) {
        uint32_t prompt[64];
        size_t len = 1 + (size_t)(i * 8);
        for (size_t t = 0; t < len; t++)
            prompt[t] = gpc_rng_below(&rng, 250);
        memset(&jobs[i], 0, sizeof jobs[i]);
        gpc_engine_request r;
        gpc_engine_request_init(&r);
        r.prompt = prompt;
        r.prompt_len = len;
        r.max_tokens = 40;
        r.temperature = i % 2 ? 0.9f : 0.0f;
        r.top_k = i % 4 == 1 ? 20 : 0;
        r.seed = 100 + (uint64_t)i;
        r.ignore_eos = 1;
        r.callback = on_engine_event;
        r.user = &jobs[i];
        TEST_OK(gpc_engine_submit(e, &r, NULL));
    }
    int active = 1, steps = 0;
    while (active && steps < 10000) {
        TEST_OK(gpc_engine_step(e, &active));
        steps++;
    }
    gpc_engine_free(e);
    for (int i = 0; i < n; i++)
        if (!jobs[i].finished || jobs[i].n != 40)
            fail_msg("request %d gave %d tokens", i, jobs[i].n);
}

static void test_engine_switch(void **state) {
    (void)state;
    char *run_dir = test_tmpdir("cuda_graphs");
    test_make_serving_run(run_dir, 2, 2, 64, 128, 20261204);
    static engine_job on[8], off[8];
    run_engine(run_dir, 1, on, 8);
    run_engine(run_dir, 0, off, 8);
    for (int i = 0; i < 8; i++)
        for (int t = 0; t < 40; t++)
            if (on[i].got[t] != off[i].got[t])
                fail_msg("request %d token %d: %d with graphs, %d without", i, t, on[i].got[t],
                         off[i].got[t]);
    test_rmtree(run_dir);
    gpc_free(run_dir);
}

int main(void) {
    if (!gpc_backend_get(GPC_DEVICE_CUDA)) {
        fprintf(stderr, "skipped: %s\n", gpc_last_error());
        return 77;
    }
    if (gpc_setting_given("GPC_TEST_FILTER"))
        cmocka_set_test_filter(gpc_setting_given("GPC_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_graphs_match_eager),
        cmocka_unit_test(test_setting_turns_graphs_off),
        cmocka_unit_test(test_engine_switch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
