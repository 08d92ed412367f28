/*
 * test_engine.c: the serving engine (include/gpc/engine.h) on the CPU,
 * against gpc_generate (gpc sample's loop) on the same run folder: a tiny
 * random GPT saved with a tokenizer into a temporary run.
 *
 * The paged step and gpt_forward_cached round differently (the contiguous
 * attention runs through OpenBLAS, the paged one through its own loops; a
 * one-row product is a matrix-vector call), so the logits are compared with
 * a tolerance and the tokens exactly. Greedy and seeded sampling must give
 * the same tokens alone, batched with 63 other requests of other lengths
 * that arrive over several steps, with prompts split over steps (chunked
 * prefill), with shared prefix blocks, and under a cache so small that
 * sequences are preempted and recomputed. Every test runs twice: with the
 * engine running one step ahead (its default) and without.
 */
#include "testutil.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/engine.h"
#include "gpc/model.h"
#include "gpc/serve.h"
#include "gpc/tokenizer.h"
#include "gpc/train.h"
#include "ops/ops.h" /* gpc_sample_select: what a device draw must give */

enum { LAYERS = 2, HEADS = 2, CHANNELS = 32, CONTEXT = 64, MAX_GEN = 64 };

static char *run_dir;
static gpt_config config;
static gpt_model *reference; /* batch 1, the whole context: gpc_generate's model */
static int vocab;
static int pipeline = 1; /* the engine option of this pass over the tests */

static int setup(void **state) {
    (void)state;
    run_dir = test_tmpdir("engine");
    config = test_make_serving_run(run_dir, LAYERS, HEADS, CHANNELS, CONTEXT, 20261202);
    vocab = config.vocab_size;
    char path[4200];
    TEST_OK(gpt_create(&reference, &config, gpc_cpu(), GPC_F32, 1, CONTEXT, 0));
    snprintf(path, sizeof path, "%s/checkpoint.bin", run_dir);
    TEST_OK(gpt_checkpoint_load(path, reference, NULL));
    return 0;
}

static int teardown(void **state) {
    (void)state;
    gpt_free(reference);
    test_rmtree(run_dir);
    gpc_free(run_dir);
    return 0;
}

/* ------------------------------------------------------------ helpers */

typedef struct {
    uint32_t prompt[CONTEXT];
    size_t prompt_len;
    int max_tokens, min_tokens, ignore_eos;
    float temperature, top_p;
    int top_k;
    uint64_t seed;
    int64_t eos;
    /* what the engine gave */
    uint32_t got[MAX_GEN + 1];
    int n_got, finished, events_after_final;
    gpc_finish_reason finish;
    size_t final_generated;
    int last_token;
    uint64_t id;
    /* what gpc_generate gives */
    uint32_t want[MAX_GEN + 1];
    int n_want;
    gpc_generate_stop want_stop;
} job;

static void on_event(void *user, const gpc_engine_event *ev) {
    job *j = user;
    if (j->finished) j->events_after_final++;
    if (ev->token >= 0) j->got[j->n_got++] = (uint32_t)ev->token;
    if (ev->finish != GPC_FINISH_NONE) {
        j->finished = 1;
        j->finish = ev->finish;
        j->final_generated = ev->generated;
        j->last_token = ev->token;
    }
}

static void make_job(job *j, gpc_rng *rng, size_t prompt_len, int max_tokens) {
    memset(j, 0, sizeof *j);
    for (size_t i = 0; i < prompt_len; i++)
        j->prompt[i] = gpc_rng_below(rng, (uint32_t)vocab);
    j->prompt_len = prompt_len;
    j->max_tokens = max_tokens;
    j->temperature = 0.0f;
    j->top_p = 1.0f;
    j->eos = -1;
}

static int collect(void *user, uint32_t token) {
    job *j = user;
    j->want[j->n_want++] = token;
    return 0;
}

/* gpc_generate on the reference model, as gpc sample runs it. */
static void expect(job *j) {
    gpc_generate_options o;
    gpc_generate_options_init(&o);
    o.max_tokens = j->max_tokens;
    o.temperature = j->temperature;
    o.top_k = j->top_k;
    o.top_p = j->top_p;
    o.min_tokens = j->min_tokens;
    o.stop_token = j->ignore_eos ? -1 : j->eos;
    gpc_rng rng;
    gpc_rng_seed(&rng, j->seed, 0x73616d706c65ULL);
    gpc_generate_result r;
    j->n_want = 0;
    TEST_OK(gpc_generate_run(reference, j->prompt, j->prompt_len, &o, &rng, collect, j, &r));
    j->want_stop = r.stop;
}

static uint64_t submit(gpc_engine *e, job *j) {
    gpc_engine_request r;
    gpc_engine_request_init(&r);
    r.prompt = j->prompt;
    r.prompt_len = j->prompt_len;
    r.max_tokens = j->max_tokens;
    r.temperature = j->temperature;
    r.top_k = j->top_k;
    r.top_p = j->top_p;
    r.seed = j->seed;
    r.eos_token = j->eos;
    r.ignore_eos = j->ignore_eos;
    r.min_tokens = j->min_tokens;
    r.callback = on_event;
    r.user = j;
    TEST_OK(gpc_engine_submit(e, &r, &j->id));
    return j->id;
}

/* The engine's tokens equal gpc_generate's, and it ended for the same
 * reason. */
static void assert_same(const char *what, int index, const job *j) {
    if (!j->finished) fail_msg("%s: request %d never finished", what, index);
    if (j->events_after_final) fail_msg("%s: request %d had events after its last", what, index);
    if (j->n_got != j->n_want)
        fail_msg("%s: request %d (prompt %zu) gave %d tokens, gpc_generate %d", what, index,
                 j->prompt_len, j->n_got, j->n_want);
    for (int i = 0; i < j->n_got; i++)
        if (j->got[i] != j->want[i])
            fail_msg("%s: request %d (prompt %zu): token %d is %u, gpc_generate's %u", what, index,
                     j->prompt_len, i, j->got[i], j->want[i]);
    gpc_finish_reason want =
        j->want_stop == GPC_GENERATE_END_OF_TEXT ? GPC_FINISH_EOS : GPC_FINISH_LENGTH;
    if (j->finish != want)
        fail_msg("%s: request %d ended with %s, expected %s", what, index,
                 gpc_finish_reason_name(j->finish), gpc_finish_reason_name(want));
    assert_int_equal(j->final_generated, (size_t)j->n_got);
}

static gpc_engine *make_engine(int max_batch, int block_size, size_t kv_blocks, int max_step,
                               int max_queue) {
    gpc_engine_options o;
    gpc_engine_options_init(&o);
    o.max_batch = max_batch;
    o.block_size = block_size;
    o.max_step_tokens = max_step;
    o.max_queue = max_queue;
    o.kv_bytes = kv_blocks * gpt_paged_block_bytes(&config, GPC_F32, block_size);
    o.pipeline = pipeline;
    gpc_engine *e = NULL;
    TEST_OK(gpc_engine_create(&e, run_dir, gpc_cpu(), &o));
    return e;
}

static int run_until_idle(gpc_engine *e, int limit) {
    int active = 1, steps = 0;
    while (active && steps < limit) {
        TEST_OK(gpc_engine_step(e, &active));
        steps++;
    }
    if (active) fail_msg("the engine still had %d sequences after %d steps", active, limit);
    return steps;
}

/* ------------------------------------------------------------ the model step */

/* gpt_step_paged against gpt_forward_cached: three sequences of different
 * lengths in one step, their blocks scattered over the cache, the prompt
 * of one split over two steps; the logits agree to rounding. */
static void test_paged_step_logits(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, 7, 1);
    enum { BS = 4, SEQS = 3 };
    gpt_paged_options po = {
        .num_blocks = 48, .block_size = BS, .max_seqs = SEQS, .max_tokens = 96, .max_logits = SEQS};
    gpt_paged *p = NULL;
    TEST_OK(gpt_paged_create(&p, reference, &po));
    int mb = gpt_paged_max_blocks(p);
    assert_int_equal(mb, CONTEXT / BS);
    const int len[SEQS] = {13, 1, 40};
    int32_t tokens[SEQS][CONTEXT], tables[SEQS * CONTEXT / BS] = {0};
    int order[48];
    for (int i = 0; i < 48; i++)
        order[i] = i;
    for (int i = 47; i > 0; i--) {
        int k = (int)gpc_rng_below(&rng, (uint32_t)i + 1), t = order[i];
        order[i] = order[k], order[k] = t;
    }
    for (int s = 0; s < SEQS; s++) {
        for (int i = 0; i < len[s]; i++)
            tokens[s][i] = (int32_t)gpc_rng_below(&rng, (uint32_t)vocab);
        for (int b = 0; b < mb; b++)
            tables[s * mb + b] = order[s * 16 + b];
    }
    /* step 1: sequence 2's first 25 positions only (no logits); step 2:
     * everything else, the logits rows first */
    int32_t tok[96], pos[96], seq[96], slot[96];
    int n = 0;
    for (int i = 0; i < 25; i++, n++) {
        tok[n] = tokens[2][i], pos[n] = i, seq[n] = 2;
        slot[n] = tables[2 * mb + i / BS] * BS + i % BS;
    }
    gpt_paged_batch b = {n, tok, pos, seq, slot, SEQS, tables, 0, NULL};
    TEST_OK(gpt_step_paged(p, &b, NULL));
    n = 0;
    for (int s = 0; s < SEQS; s++) { /* the last rows */
        int i = len[s] - 1;
        tok[n] = tokens[s][i], pos[n] = i, seq[n] = s;
        slot[n++] = tables[s * mb + i / BS] * BS + i % BS;
    }
    for (int s = 0; s < SEQS; s++)
        for (int i = s == 2 ? 25 : 0; i < len[s] - 1; i++, n++) {
            tok[n] = tokens[s][i], pos[n] = i, seq[n] = s;
            slot[n] = tables[s * mb + i / BS] * BS + i % BS;
        }
    float got[SEQS * 512], want[512];
    assert_true(vocab <= 512);
    gpt_paged_batch b2 = {n, tok, pos, seq, slot, SEQS, tables, SEQS, NULL};
    TEST_OK(gpt_step_paged(p, &b2, got));
    for (int s = 0; s < SEQS; s++) {
        TEST_OK(gpt_forward_cached(reference, tokens[s], 0, len[s], want));
        test_assert_close_f32("paged logits", got + s * vocab, want, (size_t)vocab, 1e-4, 1e-2);
    }
    /* the same step drawing on the device (the CPU here; it writes the same
     * keys and values again): each row gives gpc_sample_select's token of
     * the logits above, with the forbidden token out */
    int best0 = 0;
    for (int v = 1; v < vocab; v++)
        if (got[v] > got[best0]) best0 = v;
    const gpt_paged_sampling rows[SEQS] = {
        {0.0f, 0.0f, 1.0f, 0.0f, best0}, /* greedy, its first choice forbidden */
        {0.8f, 5.0f, 1.0f, 0.3f, -1},
        {1.0f, 0.0f, 0.9f, 0.77f, 7},
    };
    int32_t drawn[SEQS];
    TEST_OK(gpt_step_paged_sample(p, &b2, rows, drawn));
    char *scratch = malloc((size_t)vocab * 8);
    for (int s = 0; s < SEQS; s++) {
        float *x = got + s * vocab;
        if (rows[s].forbidden >= 0) x[rows[s].forbidden] = -INFINITY;
        uint32_t want_token = gpc_sample_select(x, vocab, rows[s].temperature, (int)rows[s].top_k,
                                                rows[s].top_p, rows[s].uniform, scratch);
        assert_int_equal(drawn[s], want_token);
    }
    assert_int_not_equal(drawn[0], best0);
    free(scratch);
    /* steps larger than planned, and plans that cannot work, are errors */
    gpt_paged_batch big = b2;
    big.num_tokens = 97;
    TEST_FAILS(gpt_step_paged(p, &big, got), GPC_ERR_INVALID_ARG, "planned for");
    big = b2;
    big.num_logits = SEQS + 1;
    TEST_FAILS(gpt_step_paged(p, &big, got), GPC_ERR_INVALID_ARG, "planned for");
    gpt_paged *none = NULL;
    gpt_paged_options bad = po;
    bad.max_logits = po.max_tokens + 1;
    TEST_FAILS(gpt_paged_create(&none, reference, &bad), GPC_ERR_INVALID_ARG, "logits rows");
    bad = po;
    bad.num_blocks = 0;
    TEST_FAILS(gpt_paged_create(&none, reference, &bad), GPC_ERR_INVALID_ARG, "at least one block");
    /* serving runs a whole model: a tensor- or pipeline-parallel part is refused */
    gpt_model *half = NULL;
    const gpt_parallel stage = {1, 0, 2, 0, 1};
    TEST_OK(gpt_create_part(&half, gpt_get_config(reference), gpc_cpu(), GPC_F32, 1, CONTEXT, 0,
                            &stage, 0, SIZE_MAX));
    TEST_FAILS(gpt_paged_create(&none, half, &po), GPC_ERR_UNSUPPORTED,
               "not a tensor or pipeline part (tp 1, pp 2)");
    gpt_free(half);
    assert_null(none);
    /* a bad slot is an error that names the row, not a write out of bounds */
    slot[3] = 48 * BS; /* cppcheck-suppress unreadVariable ; b2 reads it */
    TEST_FAILS(gpt_step_paged(p, &b2, got), GPC_ERR_INVALID_ARG, "row 3");
    gpt_paged_free(p);
}

/* gpt_step_paged_launch and _collect with a feed: a decode step launched
 * before the previous one is collected takes that step's tokens on the
 * device, and draws what a step given those tokens on the host draws. */
static void test_paged_launch_feed(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, 9, 14);
    enum { BS = 4, SEQS = 3, ROWS = 32 };
    gpt_paged_options po = {.num_blocks = 48,
                            .block_size = BS,
                            .max_seqs = SEQS,
                            .max_tokens = ROWS,
                            .max_logits = SEQS};
    gpt_paged *piped = NULL, *plain = NULL;
    TEST_OK(gpt_paged_create(&piped, reference, &po));
    TEST_OK(gpt_paged_create(&plain, reference, &po));
    int mb = gpt_paged_max_blocks(piped);
    const int len[SEQS] = {5, 1, 9};
    int32_t tables[SEQS * CONTEXT / BS];
    for (int i = 0; i < SEQS * mb; i++)
        tables[i] = i;
    /* step A: the prompts, their last rows first */
    int32_t tok[ROWS], pos[ROWS], seq[ROWS], slot[ROWS];
    int n = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int s = 0; s < SEQS; s++)
            for (int i = 0; i < len[s]; i++) {
                if ((i == len[s] - 1) != (pass == 0)) continue;
                tok[n] = (int32_t)gpc_rng_below(&rng, (uint32_t)vocab), pos[n] = i, seq[n] = s;
                slot[n++] = tables[s * mb + i / BS] * BS + i % BS;
            }
    gpt_paged_batch a = {n, tok, pos, seq, slot, SEQS, tables, SEQS, NULL};
    const gpt_paged_sampling rows[SEQS] = {
        {0.0f, 0.0f, 1.0f, 0.0f, -1}, {0.9f, 0.0f, 1.0f, 0.4f, -1}, {1.0f, 8.0f, 0.9f, 0.6f, 2}};
    /* step B: one decode row each, at the position after its prompt */
    int32_t btok[SEQS], bpos[SEQS], bseq[SEQS], bslot[SEQS], feed[SEQS];
    for (int s = 0; s < SEQS; s++) {
        btok[s] = 0, bpos[s] = len[s], bseq[s] = s, feed[s] = s;
        bslot[s] = tables[s * mb + len[s] / BS] * BS + len[s] % BS;
    }
    gpt_paged_batch b = {SEQS, btok, bpos, bseq, bslot, SEQS, tables, SEQS, feed};
    /* a feed before any launch has no tokens to take */
    TEST_FAILS(gpt_step_paged_launch(piped, &b, rows), GPC_ERR_INVALID_ARG, "previous step");
    TEST_FAILS(gpt_step_paged_collect(piped, btok), GPC_ERR_INVALID_ARG, "no paged step");
    TEST_OK(gpt_step_paged_launch(piped, &a, rows));
    TEST_OK(gpt_step_paged_launch(piped, &b, rows));
    TEST_FAILS(gpt_step_paged_launch(piped, &b, rows), GPC_ERR_INVALID_ARG, "two paged steps");
    TEST_FAILS(gpt_step_paged(piped, &a, NULL), GPC_ERR_INVALID_ARG, "runs alone");
    int32_t got_a[SEQS], got_b[SEQS], want_a[SEQS], want_b[SEQS];
    TEST_OK(gpt_step_paged_collect(piped, got_a));
    TEST_OK(gpt_step_paged_collect(piped, got_b));
    assert_true(gpt_paged_collected_seconds(piped) >= 0.0);
    /* the same two steps one at a time, step B given A's tokens */
    TEST_OK(gpt_step_paged_sample(plain, &a, rows, want_a));
    for (int s = 0; s < SEQS; s++)
        btok[s] = want_a[s]; /* cppcheck-suppress unreadVariable ; b reads it */
    b.feed = NULL;
    TEST_OK(gpt_step_paged_sample(plain, &b, rows, want_b));
    assert_memory_equal(got_a, want_a, sizeof got_a);
    assert_memory_equal(got_b, want_b, sizeof got_b);
    /* a feed past the rows the previous step drew names the row */
    feed[1] = SEQS;
    b.feed = feed;
    TEST_FAILS(gpt_step_paged_launch(piped, &b, rows), GPC_ERR_INVALID_ARG,
               "row 1 is fed token 3 of the previous step, which drew 3");
    gpt_paged_free(piped);
    gpt_paged_free(plain);
}

/* ------------------------------------------------------------ greedy */

static void test_greedy_alone_and_batched(void **state) {
    (void)state;
    enum { JOBS = 64 };
    static job jobs[JOBS];
    gpc_rng rng;
    gpc_rng_seed(&rng, 11, 2);
    for (int i = 0; i < JOBS; i++) {
        size_t plen = 1 + (size_t)((i * 7) % 40);
        int gen = 1 + (i * 13) % 24;
        make_job(&jobs[i], &rng, plen, gen);
        expect(&jobs[i]);
    }
    /* request 0 alone */
    gpc_engine *e = make_engine(64, 4, 0, 64, 1024);
    job alone = jobs[0];
    submit(e, &alone);
    run_until_idle(e, 200);
    assert_same("alone", 0, &alone);
    /* all 64: 16 at first, then 8 more each step; rows of a step capped at
     * 64, so prompts also run in chunks */
    int next = 0, active = 1, steps = 0;
    while (next < 16)
        submit(e, &jobs[next++]);
    while (active || next < JOBS) {
        TEST_OK(gpc_engine_step(e, &active));
        steps++;
        for (int k = 0; k < 8 && next < JOBS; k++)
            submit(e, &jobs[next++]);
        if (next < JOBS) active = 1;
        assert_true(steps < 1000);
    }
    for (int i = 0; i < JOBS; i++)
        assert_same("batched", i, &jobs[i]);
    gpc_engine_stats st;
    gpc_engine_get_stats(e, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.waiting, 0);
    assert_int_equal(st.requests_total, JOBS + 1);
    size_t tokens = (size_t)alone.n_got, prompt = alone.prompt_len;
    for (int i = 0; i < JOBS; i++)
        tokens += (size_t)jobs[i].n_got, prompt += jobs[i].prompt_len;
    assert_int_equal(st.tokens_generated, tokens);
    assert_int_equal(st.prompt_tokens, prompt);
    assert_true(st.busy_seconds > 0 && st.wall_seconds >= st.busy_seconds);
    gpc_engine_free(e);
}

/* The end-of-text token ends a request unless ignore_eos, and not before
 * min_tokens; the context's end ends it with "length". */
static void test_eos_and_context(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, 5, 3);
    job j[4];
    make_job(&j[0], &rng, 6, 40);
    expect(&j[0]);
    /* the eos: the third token gpc_generate draws */
    assert_true(j[0].n_want >= 3);
    int64_t eos = j[0].want[2];
    for (int i = 0; i < 3; i++) {
        job keep = j[0];
        j[i] = keep;
        j[i].eos = eos;
        j[i].ignore_eos = i == 1;
        j[i].min_tokens = i == 2 ? 10 : 0;
        expect(&j[i]);
    }
    assert_int_equal(j[0].want_stop, GPC_GENERATE_END_OF_TEXT);
    /* the context: a prompt of 60 gets 5 tokens (the last at position 64
     * never runs) */
    make_job(&j[3], &rng, 60, 40);
    expect(&j[3]);
    j[3].n_want = 5;
    j[3].want_stop = GPC_GENERATE_TOKEN_LIMIT;
    gpc_engine *e = make_engine(8, 8, 0, 256, 16);
    for (int i = 0; i < 4; i++)
        submit(e, &j[i]);
    run_until_idle(e, 200);
    for (int i = 0; i < 4; i++)
        assert_same("eos", i, &j[i]);
    assert_int_equal(j[0].last_token, -1); /* the eos is not emitted */
    assert_int_equal(j[3].last_token, (int)j[3].got[4]);
    gpc_engine_model_info info;
    gpc_engine_model(e, &info);
    assert_int_equal(info.context, CONTEXT);
    assert_int_equal(info.vocab_size, vocab);
    assert_int_equal(info.eos_token, vocab - 1);
    const char *base = strrchr(run_dir, '/');
    assert_string_equal(info.name, base ? base + 1 : run_dir);
    assert_non_null(gpc_engine_tokenizer(e));
    gpc_engine_free(e);
}

/* ------------------------------------------------------------ sampling */

static void test_sampled_alone_and_batched(void **state) {
    (void)state;
    enum { JOBS = 24 };
    static job jobs[JOBS];
    gpc_rng rng;
    gpc_rng_seed(&rng, 13, 4);
    for (int i = 0; i < JOBS; i++) {
        make_job(&jobs[i], &rng, 1 + (size_t)(i * 5) % 30, 10 + i % 12);
        jobs[i].temperature = 0.8f + 0.05f * (float)(i % 5);
        jobs[i].top_k = i % 3 ? 0 : 20;
        jobs[i].top_p = i % 4 ? 1.0f : 0.9f;
        jobs[i].seed = 1000 + (uint64_t)i;
        expect(&jobs[i]);
    }
    gpc_engine *e = make_engine(32, 4, 0, 48, 64);
    for (int i = 0; i < 3; i++) { /* alone, one after the other */
        job alone = jobs[i];
        submit(e, &alone);
        run_until_idle(e, 200);
        assert_same("sampled alone", i, &alone);
    }
    for (int i = 0; i < JOBS; i++) {
        submit(e, &jobs[i]);
        if (i % 6 == 5) TEST_OK(gpc_engine_step(e, NULL));
    }
    run_until_idle(e, 500);
    for (int i = 0; i < JOBS; i++)
        assert_same("sampled batched", i, &jobs[i]);
    gpc_engine_free(e);
}

/* ------------------------------------------------------------ blocks */

static void test_prefix_sharing(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, 17, 5);
    job a, b;
    make_job(&a, &rng, 40, 12);
    expect(&a);
    b = a;
    gpc_engine *e = make_engine(8, 4, 0, 256, 16);
    submit(e, &a);
    TEST_OK(gpc_engine_step(e, NULL)); /* a's prompt: 10 blocks */
    gpc_engine_stats st;
    gpc_engine_get_stats(e, &st);
    /* running ahead, a's first decode (position 40, a new block) is in flight */
    assert_int_equal(st.kv_blocks_used, 10 + pipeline);
    submit(e, &b);
    /* a decodes position 40 (a new block), b shares a's first 9 blocks and
     * takes one for its last prompt position */
    TEST_OK(gpc_engine_step(e, NULL));
    gpc_engine_get_stats(e, &st);
    assert_int_equal(st.kv_blocks_used, 10 + 1 + 1);
    run_until_idle(e, 100);
    assert_same("prefix a", 0, &a);
    assert_same("prefix b", 1, &b);
    gpc_engine_get_stats(e, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    /* a block shared by two is freed only when both left: a third request
     * with the same prompt, cancelled, leaves the other's blocks intact */
    job c = a, d = a;
    c.n_got = d.n_got = 0, c.finished = d.finished = 0;
    submit(e, &c);
    TEST_OK(gpc_engine_step(e, NULL));
    submit(e, &d);
    TEST_OK(gpc_engine_step(e, NULL));
    gpc_engine_cancel(e, c.id, GPC_FINISH_CANCELLED);
    run_until_idle(e, 100);
    assert_int_equal(c.finish, GPC_FINISH_CANCELLED);
    assert_same("prefix d", 3, &d);
    gpc_engine_free(e);
}

static void test_kv_exhaustion(void **state) {
    (void)state;
    enum { JOBS = 16 };
    static job jobs[JOBS];
    gpc_rng rng;
    gpc_rng_seed(&rng, 19, 6);
    for (int i = 0; i < JOBS; i++) {
        /* each fits the 48 positions of the cache on its own */
        make_job(&jobs[i], &rng, 8 + (size_t)(i % 5) * 3, 16 + i % 10);
        expect(&jobs[i]);
    }
    gpc_engine *e = make_engine(16, 4, 12, 256, 64);
    gpc_engine_stats st;
    gpc_engine_get_stats(e, &st);
    assert_int_equal(st.kv_blocks_total, 12);
    for (int i = 0; i < JOBS; i++)
        submit(e, &jobs[i]);
    int active = 1, steps = 0;
    while (active) {
        TEST_OK(gpc_engine_step(e, &active));
        gpc_engine_get_stats(e, &st);
        assert_true(st.kv_blocks_used <= 12);
        assert_true(++steps < 2000);
    }
    for (int i = 0; i < JOBS; i++)
        assert_same("exhausted", i, &jobs[i]);
    gpc_engine_get_stats(e, &st);
    assert_true(st.preemptions > 0);
    assert_int_equal(st.kv_blocks_used, 0);
    /* one request that alone outgrows the cache ends where it is full: a
     * prompt of 20 gets positions up to 47, and the token drawn there */
    job big;
    make_job(&big, &rng, 20, 40);
    expect(&big);
    big.n_want = 48 - 20 + 1;
    big.want_stop = GPC_GENERATE_TOKEN_LIMIT;
    submit(e, &big);
    run_until_idle(e, 200);
    assert_same("outgrown", 0, &big);
    /* a prompt longer than the whole cache is refused at once */
    gpc_engine_request r;
    gpc_engine_request_init(&r);
    r.prompt = big.prompt;
    r.prompt_len = 49;
    r.callback = on_event;
    r.user = &big;
    TEST_FAILS(gpc_engine_submit(e, &r, NULL), GPC_ERR_INVALID_ARG, "whole cache");
    gpc_engine_free(e);
}

static void test_cancel(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, 23, 7);
    job run, wait, stop;
    make_job(&run, &rng, 10, 50);
    make_job(&wait, &rng, 10, 50);
    make_job(&stop, &rng, 10, 50);
    gpc_engine *e = make_engine(2, 4, 0, 256, 16);
    submit(e, &run);
    submit(e, &stop);
    submit(e, &wait); /* max_batch 2: this one waits */
    for (int i = 0; i < 3; i++)
        TEST_OK(gpc_engine_step(e, NULL));
    gpc_engine_stats st;
    gpc_engine_get_stats(e, &st);
    assert_int_equal(st.running, 2);
    assert_int_equal(st.waiting, 1);
    size_t used = st.kv_blocks_used;
    /* 12 positions each; running ahead, 13 with the step in flight */
    assert_int_equal(used, 2 * (pipeline ? 4 : 3));
    gpc_engine_cancel(e, run.id, GPC_FINISH_CANCELLED);
    gpc_engine_cancel(e, wait.id, GPC_FINISH_CANCELLED);
    gpc_engine_cancel(e, stop.id, GPC_FINISH_STOP);
    gpc_engine_cancel(e, 999999, GPC_FINISH_CANCELLED); /* unknown: ignored */
    int active = -1;
    TEST_OK(gpc_engine_step(e, &active));
    assert_int_equal(active, 0);
    gpc_engine_get_stats(e, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_int_equal(run.finish, GPC_FINISH_CANCELLED);
    assert_int_equal(wait.finish, GPC_FINISH_CANCELLED);
    assert_int_equal(stop.finish, GPC_FINISH_STOP);
    assert_int_equal(run.n_got, 3);
    assert_int_equal(wait.n_got, 0);
    assert_int_equal(run.last_token, -1);
    gpc_engine_cancel(e, run.id, GPC_FINISH_CANCELLED); /* finished: ignored */
    TEST_OK(gpc_engine_step(e, &active));
    assert_int_equal(run.events_after_final, 0);
    gpc_engine_free(e);
}

/* A callback that cancels its own request after three tokens (what a
 * server does when a stop string matched). */
static void stop_after_three(void *user, const gpc_engine_event *ev);
typedef struct {
    gpc_engine *e;
    job j;
} self_stop;

static void stop_after_three(void *user, const gpc_engine_event *ev) {
    self_stop *s = user;
    on_event(&s->j, ev);
    if (ev->finish == GPC_FINISH_NONE && s->j.n_got == 3)
        gpc_engine_cancel(s->e, ev->id, GPC_FINISH_STOP);
}

static void test_cancel_from_callback(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, 29, 8);
    static self_stop s;
    make_job(&s.j, &rng, 5, 30);
    s.e = make_engine(4, 4, 0, 256, 16);
    gpc_engine_request r;
    gpc_engine_request_init(&r);
    r.prompt = s.j.prompt;
    r.prompt_len = s.j.prompt_len;
    r.max_tokens = 30;
    r.temperature = 0;
    r.callback = stop_after_three;
    r.user = &s;
    TEST_OK(gpc_engine_submit(s.e, &r, NULL));
    run_until_idle(s.e, 100);
    assert_int_equal(s.j.finish, GPC_FINISH_STOP);
    assert_int_equal(s.j.n_got, 3);
    gpc_engine_free(s.e);
}

/* ------------------------------------------------------------ input */

static void test_queue_bound_and_errors(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, 31, 9);
    static job j[6];
    for (int i = 0; i < 6; i++)
        make_job(&j[i], &rng, 4, 2);
    gpc_engine *e = make_engine(8, 4, 0, 256, 4);
    for (int i = 0; i < 4; i++)
        submit(e, &j[i]);
    gpc_engine_request r;
    gpc_engine_request_init(&r);
    r.prompt = j[4].prompt;
    r.prompt_len = j[4].prompt_len;
    r.callback = on_event;
    r.user = &j[4];
    TEST_FAILS(gpc_engine_submit(e, &r, NULL), GPC_ERR_BUSY, "try again later");
    TEST_OK(gpc_engine_step(e, NULL)); /* the four join the batch */
    TEST_OK(gpc_engine_submit(e, &r, NULL));
    /* bad requests */
    r.prompt_len = 0;
    TEST_FAILS(gpc_engine_submit(e, &r, NULL), GPC_ERR_INVALID_ARG, "at least one token");
    r.prompt_len = CONTEXT + 1;
    TEST_FAILS(gpc_engine_submit(e, &r, NULL), GPC_ERR_INVALID_ARG, "context");
    uint32_t bad = (uint32_t)vocab;
    r.prompt = &bad;
    r.prompt_len = 1;
    TEST_FAILS(gpc_engine_submit(e, &r, NULL), GPC_ERR_INVALID_ARG, "vocabulary");
    r.prompt = j[4].prompt;
    r.top_p = 0;
    TEST_FAILS(gpc_engine_submit(e, &r, NULL), GPC_ERR_INVALID_ARG, "top_p");
    r.top_p = 1;
    r.max_tokens = 0;
    TEST_FAILS(gpc_engine_submit(e, &r, NULL), GPC_ERR_INVALID_ARG, "max_tokens");
    r.max_tokens = 4;
    r.callback = NULL;
    TEST_FAILS(gpc_engine_submit(e, &r, NULL), GPC_ERR_INVALID_ARG, "callback");
    r.callback = on_event;
    /* draining: what was admitted finishes, nothing new is taken */
    TEST_OK(gpc_engine_drain(e));
    for (int i = 0; i < 5; i++)
        assert_true(j[i].finished);
    r.user = &j[5];
    TEST_FAILS(gpc_engine_submit(e, &r, NULL), GPC_ERR_INTERRUPTED, "shutting down");
    gpc_engine_free(e);
    /* bad runs and options */
    gpc_engine *none = NULL;
    TEST_FAILS(gpc_engine_create(&none, "/nonexistent/run", gpc_cpu(), NULL), GPC_ERR_IO,
               "does not exist");
    gpc_engine_options o;
    gpc_engine_options_init(&o);
    o.max_batch = 0;
    TEST_FAILS(gpc_engine_create(&none, run_dir, gpc_cpu(), &o), GPC_ERR_INVALID_ARG, "max_batch");
    gpc_engine_options_init(&o);
    o.kv_bytes = 10;
    TEST_FAILS(gpc_engine_create(&none, run_dir, gpc_cpu(), &o), GPC_ERR_NOMEM, "no block");
    assert_null(none);
}

/* GPC_DEVICE_MEMORY_LIMIT (what gpcd sets for a job's --mem) caps the
 * cache: an engine measured at 64 blocks, then made again under a limit
 * 20 blocks below what it held, keeps 64 - 20 - 1 (one block stays free for
 * a GPU's padding rows), and a limit below the weights refuses clearly. */
static void test_memory_limit(void **state) {
    (void)state;
    size_t before = gpc_device_memory_in_use(gpc_cpu());
    gpc_engine *e = make_engine(8, 4, 64, 256, 4);
    size_t held = gpc_device_memory_in_use(gpc_cpu()) - before;
    gpc_engine_stats st;
    gpc_engine_get_stats(e, &st);
    assert_int_equal(st.kv_blocks_total, 64);
    gpc_engine_free(e);
    assert_int_equal(gpc_device_memory_in_use(gpc_cpu()), before);
    size_t block = gpt_paged_block_bytes(&config, GPC_F32, 4);
    char limit[32];
    snprintf(limit, sizeof limit, "%zu", before + held - 20 * block);
    setenv("GPC_DEVICE_MEMORY_LIMIT", limit, 1);
    e = make_engine(8, 4, 64, 256, 4);
    gpc_engine_get_stats(e, &st);
    gpc_engine_free(e);
    assert_int_equal(st.kv_blocks_total, 64 - 20 - 1);
    snprintf(limit, sizeof limit, "%zu", before + held / 4);
    setenv("GPC_DEVICE_MEMORY_LIMIT", limit, 1);
    gpc_engine *none = NULL;
    gpc_engine_options o;
    gpc_engine_options_init(&o);
    gpc_status s = gpc_engine_create(&none, run_dir, gpc_cpu(), &o);
    unsetenv("GPC_DEVICE_MEMORY_LIMIT");
    assert_int_equal(s, GPC_ERR_NOMEM);
    assert_null(none);
    gpc_clear_error();
}

/* A run without a tokenizer serves token ids (no end-of-text token); one
 * whose tokenizer does not fit the model, or without a checkpoint, is
 * refused with what to do. */
static void test_run_folders(void **state) {
    (void)state;
    char *dir = test_tmpdir("engine_run");
    char from[4200], to[4200];
    snprintf(from, sizeof from, "%s/checkpoint.bin", run_dir);
    gpc_engine *e = NULL;
    TEST_FAILS(gpc_engine_create(&e, dir, gpc_cpu(), NULL), GPC_ERR_IO, "no checkpoint.bin");
    snprintf(to, sizeof to, "%s/checkpoint.bin", dir);
    TEST_OK(gpc_copy_file(from, to));
    gpc_engine_options o;
    gpc_engine_options_init(&o);
    o.max_batch = 4;
    TEST_OK(gpc_engine_create(&e, dir, gpc_cpu(), &o));
    gpc_engine_model_info info;
    gpc_engine_model(e, &info);
    assert_int_equal(info.eos_token, -1);
    assert_null(gpc_engine_tokenizer(e));
    gpc_engine_free(e);
    /* a tokenizer of 257 tokens beside a model of more */
    gpc_tokenizer *tok = NULL;
    TEST_OK(gpc_tokenizer_train(&tok, "abc abc abc", 11, 257, NULL, NULL));
    snprintf(to, sizeof to, "%s/tokenizer.bin", dir);
    TEST_OK(gpc_tokenizer_save(tok, to));
    gpc_tokenizer_free(tok);
    e = NULL;
    TEST_FAILS(gpc_engine_create(&e, dir, gpc_cpu(), &o), GPC_ERR_MISMATCH, "mixes two runs");
    assert_null(e);
    test_rmtree(dir);
    gpc_free(dir);
}

/* A run of gpc quantize (int8, and fp8 per tensor) is served: the engine's
 * greedy tokens, alone and batched, equal gpc_generate's on the same
 * quantized model, as gpc sample loads it. */
static void test_quantized_run(void **state) {
    (void)state;
    const gpt_quant_options kinds[2] = {{GPC_I8, 1}, {GPC_F8E4M3, 0}};
    char *dir = test_tmpdir("engine_quant");
    gpt_model *plain = reference;
    for (int k = 0; k < 2; k++) {
        char out[4200];
        snprintf(out, sizeof out, "%s/q%d", dir, k);
        TEST_OK(gpc_quantize_run(run_dir, out, &kinds[k], NULL));
        gpt_model *quantized = NULL;
        TEST_OK(gpt_create_from_run(&quantized, out, gpc_cpu(), GPC_F32, 1, CONTEXT));
        reference = quantized; /* what expect() generates with */
        enum { JOBS = 6 };
        job jobs[JOBS];
        gpc_rng rng;
        gpc_rng_seed(&rng, 23, (uint64_t)k);
        for (int i = 0; i < JOBS; i++) {
            make_job(&jobs[i], &rng, 1 + (size_t)(i * 5) % 20, 4 + i * 3);
            expect(&jobs[i]);
        }
        gpc_engine_options o;
        gpc_engine_options_init(&o);
        o.max_batch = 8;
        o.block_size = 4;
        gpc_engine *e = NULL;
        TEST_OK(gpc_engine_create(&e, out, gpc_cpu(), &o));
        for (int i = 0; i < JOBS; i++)
            submit(e, &jobs[i]);
        run_until_idle(e, 200);
        for (int i = 0; i < JOBS; i++)
            assert_same(kinds[k].dtype == GPC_I8 ? "int8 run" : "fp8 run", i, &jobs[i]);
        gpc_engine_free(e);
        reference = plain;
        gpt_free(quantized);
    }
    test_rmtree(dir);
    gpc_free(dir);
}

/* ------------------------------------------------------------ chunks */

/* A prompt of 50 in chunks of 8 rows a step gives gpc_generate's tokens,
 * and a stream that decodes meanwhile gets a token every step. */
static void test_chunked_prefill(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, 37, 10);
    job stream, longp;
    make_job(&stream, &rng, 3, 30);
    make_job(&longp, &rng, 50, 8);
    expect(&stream);
    expect(&longp);
    gpc_engine *e = make_engine(4, 4, 0, 8, 16);
    submit(e, &stream);
    TEST_OK(gpc_engine_step(e, NULL));
    assert_int_equal(stream.n_got, 1);
    submit(e, &longp);
    int steps = 0;
    while (longp.n_got == 0) {
        int before = stream.n_got;
        TEST_OK(gpc_engine_step(e, NULL));
        steps++;
        assert_int_equal(stream.n_got, before + 1); /* never stalls */
    }
    /* 7 rows a step beside the stream's one: 50 in 8 steps (running ahead,
     * it joins a step later than it would) */
    assert_int_equal(steps, 8 + pipeline);
    run_until_idle(e, 100);
    assert_same("stream", 0, &stream);
    assert_same("chunked", 1, &longp);
    gpc_engine_free(e);
}

/* ------------------------------------------------------------ pipeline */

/* 64 requests of other lengths, seeds and sampling settings, some ending
 * by their end-of-text token, arriving over the steps into a cache small
 * enough to preempt: the engine running ahead gives every request the
 * tokens and the ending it gives without, and both are gpc_generate's. */
static void test_pipeline_same_outputs(void **state) {
    (void)state;
    enum { JOBS = 64 };
    static job jobs[2][JOBS];
    gpc_rng rng;
    gpc_rng_seed(&rng, 43, 12);
    for (int i = 0; i < JOBS; i++) {
        job *j = &jobs[0][i];
        make_job(j, &rng, 1 + (size_t)((i * 11) % 37), 1 + (i * 7) % 26); /* within the context */
        j->temperature = i % 3 ? 0.7f + 0.1f * (float)(i % 4) : 0.0f;
        j->top_k = i % 5 ? 0 : 16;
        j->top_p = i % 4 ? 1.0f : 0.85f;
        j->seed = 7000 + (uint64_t)i;
        j->eos = i % 2 ? vocab - 1 : -1;
        j->min_tokens = i % 6 == 1 ? 3 : 0;
        expect(j);
        /* a request that meets its end-of-text token early */
        if (i % 8 == 3 && j->n_want > 2) {
            j->eos = j->want[1];
            expect(j);
        }
        jobs[1][i] = *j;
    }
    for (int pass = 0; pass < 2; pass++) {
        int saved = pipeline;
        pipeline = pass == 0;
        gpc_engine *e = make_engine(24, 4, 60, 40, 1024);
        pipeline = saved;
        int next = 0, active = 1, steps = 0;
        while (active || next < JOBS) {
            for (int k = 0; k < 5 && next < JOBS; k++)
                submit(e, &jobs[pass][next++]);
            TEST_OK(gpc_engine_step(e, &active));
            assert_true(++steps < 3000);
        }
        gpc_engine_stats st;
        gpc_engine_get_stats(e, &st);
        assert_int_equal(st.kv_blocks_used, 0);
        assert_true(st.preemptions > 0);
        gpc_engine_free(e);
    }
    for (int i = 0; i < JOBS; i++) {
        assert_same("pipelined", i, &jobs[0][i]);
        assert_same("one at a time", i, &jobs[1][i]);
        assert_int_equal(jobs[0][i].n_got, jobs[1][i].n_got);
        assert_memory_equal(jobs[0][i].got, jobs[1][i].got, sizeof jobs[0][i].got);
        assert_int_equal(jobs[0][i].finish, jobs[1][i].finish);
    }
}

/* GPC_SERVE_PIPELINE=0 turns the option off: after one step nothing runs
 * ahead, so the cache holds the prompt's blocks alone. */
static void test_pipeline_setting(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, 47, 13);
    job j;
    make_job(&j, &rng, 8, 6);
    expect(&j);
    for (int off = 0; off < 2; off++) {
        job run = j;
        int saved = pipeline;
        pipeline = 1;
        if (off) setenv("GPC_SERVE_PIPELINE", "0", 1);
        gpc_engine *e = make_engine(4, 4, 0, 64, 16);
        unsetenv("GPC_SERVE_PIPELINE");
        pipeline = saved;
        submit(e, &run);
        TEST_OK(gpc_engine_step(e, NULL));
        gpc_engine_stats st;
        gpc_engine_get_stats(e, &st);
        /* 8 prompt positions: 2 blocks; running ahead, position 8 too */
        assert_int_equal(st.kv_blocks_used, off ? 2 : 3);
        assert_int_equal(run.n_got, 1);
        run_until_idle(e, 100);
        assert_same("setting", off, &run);
        gpc_engine_free(e);
    }
}

/* ------------------------------------------------------------ threads */

enum { THREADS = 4, PER_THREAD = 8 };
static job thread_jobs[THREADS * PER_THREAD];
static gpc_engine *thread_engine;

static void *submitter(void *arg) {
    int t = (int)(intptr_t)arg;
    for (int i = 0; i < PER_THREAD; i++) {
        job *j = &thread_jobs[t * PER_THREAD + i];
        gpc_engine_request r;
        gpc_engine_request_init(&r);
        r.prompt = j->prompt;
        r.prompt_len = j->prompt_len;
        r.max_tokens = j->max_tokens;
        r.temperature = 0;
        r.callback = on_event;
        r.user = j;
        gpc_status s;
        while ((s = gpc_engine_submit(thread_engine, &r, &j->id)) == GPC_ERR_BUSY)
            ;
        if (s != GPC_OK) return (void *)1;
    }
    return NULL;
}

static void test_threaded(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, 41, 11);
    for (int i = 0; i < THREADS * PER_THREAD; i++) {
        make_job(&thread_jobs[i], &rng, 1 + (size_t)(i * 3) % 30, 4 + i % 9);
        expect(&thread_jobs[i]);
    }
    thread_engine = make_engine(16, 4, 0, 64, 8);
    TEST_OK(gpc_engine_start(thread_engine));
    TEST_FAILS(gpc_engine_step(thread_engine, NULL), GPC_ERR_INVALID_ARG, "own thread");
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++)
        assert_int_equal(pthread_create(&th[t], NULL, submitter, (void *)(intptr_t)t), 0);
    for (int t = 0; t < THREADS; t++) {
        void *rc;
        pthread_join(th[t], &rc);
        assert_null(rc);
    }
    TEST_OK(gpc_engine_drain(thread_engine));
    for (int i = 0; i < THREADS * PER_THREAD; i++)
        assert_same("threaded", i, &thread_jobs[i]);
    gpc_engine_stats st;
    gpc_engine_get_stats(thread_engine, &st);
    assert_int_equal(st.requests_total, THREADS * PER_THREAD);
    assert_int_equal(st.kv_blocks_used, 0);
    gpc_engine_free(thread_engine);
    /* freeing a started engine with requests in flight cancels them */
    job late;
    make_job(&late, &rng, 10, 60);
    gpc_engine *e = make_engine(4, 4, 0, 64, 8);
    TEST_OK(gpc_engine_start(e));
    submit(e, &late);
    gpc_engine_free(e);
    assert_true(late.finished);
    assert_true(late.finish == GPC_FINISH_CANCELLED || late.finish == GPC_FINISH_LENGTH);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paged_step_logits),
        cmocka_unit_test(test_paged_launch_feed),
        cmocka_unit_test(test_greedy_alone_and_batched),
        cmocka_unit_test(test_eos_and_context),
        cmocka_unit_test(test_sampled_alone_and_batched),
        cmocka_unit_test(test_prefix_sharing),
        cmocka_unit_test(test_kv_exhaustion),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_cancel_from_callback),
        cmocka_unit_test(test_queue_bound_and_errors),
        cmocka_unit_test(test_memory_limit),
        cmocka_unit_test(test_run_folders),
        cmocka_unit_test(test_quantized_run),
        cmocka_unit_test(test_chunked_prefill),
        cmocka_unit_test(test_pipeline_same_outputs),
        cmocka_unit_test(test_pipeline_setting),
        cmocka_unit_test(test_threaded),
    };
    int failed = cmocka_run_group_tests_name("running ahead", tests, setup, teardown);
    pipeline = 0;
    return failed + cmocka_run_group_tests_name("one step at a time", tests, setup, teardown);
}
