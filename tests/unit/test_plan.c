/* test_plan.c: gpc plan's memory model (src/train/memory_plan.c) against
 * figures computed by hand from the buffer list of gpt_create, written out in
 * the comments, and its error messages. */
#include "testutil.h"

#include "gpc/dist.h"
#include "gpc/model.h"
#include "gpc/plan.h"

#include <stdio.h>
#include <string.h>

/* d12, T = 1024, B = 4, bf16 on CUDA: the GPT-2 124M run.
 * Vp = 50304 (50257 rounded up to 64), C = 768, L = NH = 12, BT = 4096.
 * P = Vp*C + T*C + L*(12C^2 + 13C) + 2C
 *   = 38,633,472 + 786,432 + 12*(7,077,888 + 9,984) + 1,536 = 124,475,904.
 * parameters (bf16) = 2P = 248,951,808; gradients the same;
 * optimizer = m + v + master = 3 * 4P = 1,493,710,848.
 * activations (bytes; s = 2 for bf16, statistics f32):
 *   encoded BTC*2           6,291,456
 *   ln1 L*BTC*2            75,497,472
 *   ln1 mean+rstd 2*L*BT*4    393,216
 *   qkv L*BT*3C*2         226,492,416
 *   atty                   75,497,472
 *   lse L*B*NH*T*4          2,359,296
 *   residual2              75,497,472
 *   ln2                    75,497,472
 *   ln2 mean+rstd             393,216
 *   fch L*BT*4C*2         301,989,888
 *   fch_gelu              301,989,888
 *   residual3              75,497,472
 *   lnf BTC*2               6,291,456
 *   lnf mean+rstd 2*BT*4       32,768
 *   losses BT*4                16,384
 *   tokens+targets 2*BT*4      32,768
 *   sum                 1,223,770,112
 * backward = dresidual + dbtc (2*BTC*2) + dbt4c (BT*4C*2) + norm (4 -> 256)
 *          = 12,582,912 + 25,165,824 + 256 = 37,748,992.
 * workspace = logits BT*Vp*2 + 32 MiB + cuDNN attention's f32 dQ BTC*4
 *           = 412,090,368 + 33,554,432 + 12,582,912 = 458,227,712.
 * context = 600 MiB = 629,145,600.
 * total = 248,951,808*2 + 1,493,710,848 + 1,223,770,112 + 37,748,992
 *       + 458,227,712 + 629,145,600 = 4,340,506,880.
 * One more sequence (B=1, BT=1024) adds a quarter of every BT-sized buffer:
 * (1,223,770,112 + 37,748,992 - 256 + 412,090,368 + 12,582,912) / 4
 * = 421,548,032.
 * With the optimizer offloaded the device drops the 1,493,710,848 bytes
 * of state (total 2,846,796,032) and the host pins them beside a copy of
 * the gradients and of the weights, plus 256 for the norm:
 * 1,493,710,848 + 2 * 248,951,808 + 256 = 1,991,614,720. */
static void test_d12_bf16_by_hand(void **state) {
    (void)state;
    gpc_plan_input in;
    gpc_plan_defaults(&in);
    TEST_OK(gpc_plan_parse_model("d12", &in));
    in.context = 1024;
    in.batch = 4;
    gpc_plan_result r;
    TEST_OK(gpc_plan_compute(&in, &r));
    assert_int_equal(r.num_params, 124475904ull);
    assert_int_equal(r.trainable, 124475904ull);
    assert_int_equal(r.parameters, 248951808ull);
    assert_int_equal(r.gradients, 248951808ull);
    assert_int_equal(r.optimizer, 1493710848ull);
    assert_int_equal(r.activations, 1223770112ull);
    assert_int_equal(r.backward, 37748992ull);
    assert_int_equal(r.workspace, 458227712ull);
    assert_int_equal(r.context, 629145600ull);
    assert_int_equal(r.total, 4340506880ull);
    assert_int_equal(r.per_sample, 421548032ull);
    assert_int_equal(r.host_pinned, 0);
    in.offload = 1;
    TEST_OK(gpc_plan_compute(&in, &r));
    assert_int_equal(r.optimizer, 0);
    assert_int_equal(r.total, 2846796032ull);
    /* also all the host memory the run needs to start: the weights are
     * drawn or read into the pinned master */
    assert_int_equal(r.host_pinned, 1991614720ull);
    assert_int_equal(r.per_sample, 421548032ull);
}

/* Recompute 1 keeps one layer of fch_gelu instead of 12: saves
 * 11 * BT*4C*2 = 11 * 25,165,824 = 276,824,064. Recompute 2 also keeps one
 * layer of ln1 and of ln2: saves another 2 * 11 * BTC*2 = 2 * 11 * 6,291,456
 * = 138,412,032. */
static void test_recompute_by_hand(void **state) {
    (void)state;
    gpc_plan_input in;
    gpc_plan_defaults(&in);
    TEST_OK(gpc_plan_parse_model("d12", &in));
    gpc_plan_result r0, r1, r2;
    TEST_OK(gpc_plan_compute(&in, &r0));
    in.recompute = 1;
    TEST_OK(gpc_plan_compute(&in, &r1));
    in.recompute = 2;
    TEST_OK(gpc_plan_compute(&in, &r2));
    assert_int_equal(r0.activations - r1.activations, 276824064ull);
    assert_int_equal(r1.activations - r2.activations, 138412032ull);
    assert_int_equal(r0.parameters + r0.optimizer, r2.parameters + r2.optimizer);
    /* block: 11 more layers of everything inside a block go, per layer
     * ln1 and ln2 mean and rstd 4 x 16,384, qkv 18,874,368, atty and
     * residual2 2 x 6,291,456, lse 196,608, fch 25,165,824 = 56,885,248 */
    gpc_plan_result r3, r6;
    in.recompute = GPT_RECOMPUTE_BLOCK;
    TEST_OK(gpc_plan_compute(&in, &r3));
    assert_int_equal(r2.activations - r3.activations, 11 * 56885248ull);
    /* block on the first 6 blocks: 5 layers of all of it, GELU (25,165,824)
     * and layernorm outputs (2 x 6,291,456) included */
    in.recompute = GPT_RECOMPUTE(GPT_RECOMPUTE_BLOCK, 6);
    TEST_OK(gpc_plan_compute(&in, &r6));
    assert_int_equal(r0.activations - r6.activations, 5 * (56885248ull + 37748736ull));
    /* a count of all blocks is the plain level */
    in.recompute = GPT_RECOMPUTE(GPT_RECOMPUTE_BLOCK, 12);
    TEST_OK(gpc_plan_compute(&in, &r6));
    assert_int_equal(r6.activations, r3.activations);
    in.recompute = GPT_RECOMPUTE(GPT_RECOMPUTE_BLOCK, 13);
    TEST_FAILS(gpc_plan_compute(&in, &r6), GPC_ERR_INVALID_ARG, "more than the model's 12");
}

/* fp32 with ZeRO-1 on 4 GPUs: parameters 4P = 497,903,616, gradients the
 * same, no master copy, m and v each hold P/4 = 31,118,976 f32 elements:
 * optimizer = 2 * 124,475,904 = 248,951,808. On 3 GPUs the shard is
 * ceil(P/3) = 41,491,968 elements: 2 * 165,967,872 = 331,935,744. */
static void test_fp32_zero1_by_hand(void **state) {
    (void)state;
    gpc_plan_input in;
    gpc_plan_defaults(&in);
    TEST_OK(gpc_plan_parse_model("d12", &in));
    in.dtype = GPC_F32;
    in.zero = 1;
    in.gpus = 4;
    gpc_plan_result r;
    TEST_OK(gpc_plan_compute(&in, &r));
    assert_int_equal(r.parameters, 497903616ull);
    assert_int_equal(r.gradients, 497903616ull);
    assert_int_equal(r.optimizer, 248951808ull);
    in.gpus = 3;
    TEST_OK(gpc_plan_compute(&in, &r));
    assert_int_equal(r.optimizer, 331935744ull);
    /* without ZeRO the GPU count changes nothing per GPU */
    in.zero = 0;
    TEST_OK(gpc_plan_compute(&in, &r));
    assert_int_equal(r.optimizer, 2 * 497903616ull);
}

/* LoRA rank 8 on d12: adapters 12 layers * 16 * 8 * 768 = 1,179,648 elements.
 * parameters = 248,951,808 + 2,359,296; gradients 2,359,296 (adapters only);
 * optimizer 3 * 4,718,592 = 14,155,776; activations grow by the four
 * down-projections 4 * L*BT*R*2 = 4 * 12 * 4096 * 8 * 2 = 3,145,728. */
static void test_lora_by_hand(void **state) {
    (void)state;
    gpc_plan_input in;
    gpc_plan_defaults(&in);
    TEST_OK(gpc_plan_parse_model("d12", &in));
    gpc_plan_result full, lora;
    TEST_OK(gpc_plan_compute(&in, &full));
    in.lora_rank = 8;
    TEST_OK(gpc_plan_compute(&in, &lora));
    assert_int_equal(lora.trainable, 1179648ull);
    assert_int_equal(lora.num_params, 124475904ull + 1179648ull);
    assert_int_equal(lora.parameters, 248951808ull + 2359296ull);
    assert_int_equal(lora.gradients, 2359296ull);
    assert_int_equal(lora.optimizer, 14155776ull);
    assert_int_equal(lora.activations - full.activations, 3145728ull);
}

/* d1 (C = 64), T = 3, B = 1, vocab 10 (Vp 64), fp32 on the CPU: the small
 * buffers show the 256-byte arena alignment.
 * P = 64*64 + 3*64 + (12*4096 + 13*64) + 128 = 54,400 -> 217,600 bytes.
 * activations: encoded 768, ln1 768, ln1 stats 2 * (12 -> 256) = 512,
 * qkv 2304, atty 768, lse 12 -> 256, residual2 768, ln2 768,
 * ln2 stats 512, fch 3072, fch_gelu 3072, residual3 768,
 * lnf 768, lnf stats 512, losses 256, tokens+targets 512: 16,384.
 * backward: 2 * 768 + 3072 + 256 = 4,864. workspace: logits 3*64*4 = 768.
 * total = 217,600 * 2 (params, grads) + 2 * 217,600 (m, v) + 16,384 + 4,864
 *       + 768 = 892,416. */
/* d24, d36 and d48 are GPT-2 medium, large and XL: their parameter counts
 * as Hugging Face's GPT-2 checkpoints state them (354,823,168, 774,030,080
 * and 1,557,611,200 with 1024 positions), plus the 47 padding rows of the
 * vocabulary rounded to 50,304; and the positional table grows with the
 * context (2048, 4096), in the plan and in the model's config alike. */
static void test_gpt2_sizes(void **state) {
    (void)state;
    static const struct {
        const char *name;
        int heads, channels;
        uint64_t hf_params;
    } sizes[] = {{"d12", 12, 768, 124439808ull},
                 {"d24", 16, 1024, 354823168ull},
                 {"d36", 20, 1280, 774030080ull},
                 {"d48", 25, 1600, 1557611200ull}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        gpc_plan_input in;
        gpc_plan_defaults(&in);
        TEST_OK(gpc_plan_parse_model(sizes[i].name, &in));
        assert_int_equal(in.heads, sizes[i].heads);
        assert_int_equal(in.channels, sizes[i].channels);
        assert_int_equal(in.channels / in.heads, 64);
        uint64_t C = (uint64_t)in.channels;
        for (int T = 1024; T <= 4096; T *= 2) {
            in.context = T;
            in.batch = 1;
            gpc_plan_result r;
            TEST_OK(gpc_plan_compute(&in, &r));
            assert_int_equal(r.num_params, sizes[i].hf_params + 47 * C + (uint64_t)(T - 1024) * C);
            gpt_config config;
            TEST_OK(gpt_config_init(&config, in.layers, in.heads, in.channels, T, 50257));
            assert_int_equal(gpt_config_num_params(&config), r.num_params);
        }
    }
    int L, NH, C;
    TEST_OK(gpt_config_parse_depth("d6", &L, &NH, &C));
    assert_true(L == 6 && NH == 6 && C == 384); /* the rule elsewhere */
}

static void test_tiny_alignment_by_hand(void **state) {
    (void)state;
    gpc_plan_input in;
    gpc_plan_defaults(&in);
    TEST_OK(gpc_plan_parse_model("d1", &in));
    in.context = 3;
    in.batch = 1;
    in.vocab = 10;
    in.dtype = GPC_F32;
    in.cuda = 0;
    gpc_plan_result r;
    TEST_OK(gpc_plan_compute(&in, &r));
    assert_int_equal(r.num_params, 54400ull);
    assert_int_equal(r.parameters, 217600ull);
    assert_int_equal(r.optimizer, 435200ull);
    assert_int_equal(r.activations, 16384ull);
    assert_int_equal(r.backward, 4864ull);
    assert_int_equal(r.workspace, 768ull);
    assert_int_equal(r.context, 0ull);
    assert_int_equal(r.total, 892416ull);
}

/* The largest batch is the last B whose total fits: check the boundary for
 * random models and capacities rather than trusting the search. */
static void test_max_batch_boundary(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 11);
    for (int trial = 0; trial < 20; trial++) {
        gpc_plan_input in;
        gpc_plan_defaults(&in);
        char name[8];
        snprintf(name, sizeof name, "d%u", 2 + gpc_rng_below(&rng, 30));
        TEST_OK(gpc_plan_parse_model(name, &in));
        in.context = 64 << gpc_rng_below(&rng, 5);
        in.recompute = (int)gpc_rng_below(&rng, 3);
        uint64_t capacity = (uint64_t)(1.0 + 80.0 * gpc_rng_uniform(&rng)) << 30;
        int b = gpc_plan_max_batch(&in, capacity);
        gpc_plan_result r;
        if (b > 0) {
            in.batch = b;
            TEST_OK(gpc_plan_compute(&in, &r));
            assert_true(r.total <= capacity);
        }
        in.batch = b + 1;
        TEST_OK(gpc_plan_compute(&in, &r));
        assert_true(r.total > capacity);
    }
    /* H200 and d12 at T=1024 bf16: (capacity - fixed) / 421,548,032 by hand,
     * fixed = 4,340,506,880 - 4 * 421,548,032 = 2,654,314,752;
     * (150,754,820,096 - 2,654,314,752) / 421,548,032 = 351.33 -> 351. */
    gpc_plan_input in;
    gpc_plan_defaults(&in);
    assert_int_equal(gpc_plan_max_batch(&in, 143771ull << 20), 351);
}

static void test_bad_input_messages(void **state) {
    (void)state;
    gpc_plan_input in;
    gpc_plan_defaults(&in);
    TEST_FAILS(gpc_plan_parse_model("x12", &in), GPC_ERR_INVALID_ARG, "not of the form dN");
    TEST_FAILS(gpc_plan_parse_model("d0", &in), GPC_ERR_INVALID_ARG, "N from 1 to 256");
    TEST_FAILS(gpc_plan_parse_model("d", &in), GPC_ERR_INVALID_ARG, "not of the form dN");
    TEST_FAILS(gpc_plan_parse_model("d12x", &in), GPC_ERR_INVALID_ARG, "not of the form dN");
    gpc_plan_result r;
    gpc_plan_defaults(&in);
    in.recompute = -1;
    TEST_FAILS(gpc_plan_compute(&in, &r), GPC_ERR_INVALID_ARG, "--recompute -1");
    gpc_plan_defaults(&in);
    in.zero = 2;
    TEST_FAILS(gpc_plan_compute(&in, &r), GPC_ERR_INVALID_ARG, "--zero 2");
    gpc_plan_defaults(&in);
    in.heads = 7;
    TEST_FAILS(gpc_plan_compute(&in, &r), GPC_ERR_INVALID_ARG, "multiple of heads");
    gpc_plan_defaults(&in);
    in.lora_rank = 10000;
    TEST_FAILS(gpc_plan_compute(&in, &r), GPC_ERR_INVALID_ARG, "--lora 10000");
    gpc_plan_defaults(&in);
    in.dtype = GPC_I32;
    TEST_FAILS(gpc_plan_compute(&in, &r), GPC_ERR_INVALID_ARG, "cannot be trained");
    gpc_plan_defaults(&in);
    in.gpus = 0;
    TEST_FAILS(gpc_plan_compute(&in, &r), GPC_ERR_INVALID_ARG, "--gpus 0");
    /* under pp a recompute block count is each stage's: d12 over pp 4 has 3 */
    gpc_plan_defaults(&in);
    in.pp = 4, in.gpus = 4, in.recompute = GPT_RECOMPUTE(GPT_RECOMPUTE_BLOCK, 4);
    TEST_FAILS(gpc_plan_compute(&in, &r), GPC_ERR_INVALID_ARG,
               "--recompute-layers 4 is more than a pipeline stage's 3 blocks");
    in.recompute = GPT_RECOMPUTE(GPT_RECOMPUTE_BLOCK, 3);
    TEST_OK(gpc_plan_compute(&in, &r));
    /* the optimizer offloaded: one GPU, a whole model */
    const char *what[4] = {"zero", "gpus", "tp", "lora"};
    for (int k = 0; k < 4; k++) {
        gpc_plan_defaults(&in);
        in.offload = 1;
        if (k == 0) in.zero = 1;
        if (k == 1) in.gpus = 2;
        if (k == 2) in.tp = 2, in.gpus = 2;
        if (k == 3) in.lora_rank = 8;
        TEST_FAILS(gpc_plan_compute(&in, &r), GPC_ERR_INVALID_ARG, what[k]);
        assert_non_null(strstr(gpc_last_error(), "--offload-optimizer plans one GPU"));
    }
}

/* The plan against the model itself: gpt_create_recompute and
 * gpt_create_lora on the CPU (f32), at each recomputation level, place the very buffers the plan
 * counts, and gpt_memory_bytes is what its two arenas hold. The arenas do not pad their last
 * tensor, so the plan may be above by less than one alignment (256 bytes) per arena. */
static void test_plan_matches_gpt_create(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 21);
    for (int trial = 0; trial < 12; trial++) {
        int layers = 1 + (int)gpc_rng_below(&rng, 3), heads = 1 + (int)gpc_rng_below(&rng, 4);
        int channels = heads * 8 * (1 + (int)gpc_rng_below(&rng, 3));
        int T = 4 + (int)gpc_rng_below(&rng, 40), B = 1 + (int)gpc_rng_below(&rng, 4);
        int vocab = 50 + (int)gpc_rng_below(&rng, 300);
        gpt_config config;
        TEST_OK(gpt_config_init(&config, layers, heads, channels, T, vocab));
        /* every recomputation level, on all blocks or the first few */
        int level = trial % 4, blocks = level ? (int)gpc_rng_below(&rng, (uint64_t)layers + 1) : 0;
        int recompute = GPT_RECOMPUTE(level, blocks);
        gpt_model *model = NULL;
        TEST_OK(gpt_create_recompute(&model, &config, gpc_cpu(), GPC_F32, B, T, 1, recompute));
        gpc_plan_input in;
        gpc_plan_defaults(&in);
        in.layers = layers, in.heads = heads, in.channels = channels;
        in.context = T, in.batch = B, in.vocab = vocab;
        in.dtype = GPC_F32, in.cuda = 0, in.recompute = recompute;
        gpc_plan_result r;
        TEST_OK(gpc_plan_compute(&in, &r));
        assert_int_equal(r.num_params, gpt_config_num_params(&config));
        uint64_t real = gpt_memory_bytes(model);
        if (!(r.total >= real && r.total - real < 2 * 256))
            fail_msg("L=%d NH=%d C=%d T=%d B=%d V=%d recompute %d: plan %llu bytes, gpt_create "
                     "%llu",
                     layers, heads, channels, T, B, vocab, recompute, (unsigned long long)r.total,
                     (unsigned long long)real);
        gpt_free(model);
        /* LoRA on all four projections (what --lora counts): the base
         * without gradients or state, the adapters' buffers and scratch */
        gpt_lora_options lora = {.rank = 1 + (int)gpc_rng_below(&rng, 4)};
        TEST_OK(gpt_create_lora(&model, &config, gpc_cpu(), GPC_F32, B, T, 1, recompute, &lora));
        in.lora_rank = lora.rank;
        TEST_OK(gpc_plan_compute(&in, &r));
        assert_int_equal(r.trainable, gpt_lora_num_params(model));
        real = gpt_memory_bytes(model);
        if (!(r.total >= real && r.total - real < 2 * 256))
            fail_msg("LoRA rank %d, L=%d C=%d T=%d B=%d V=%d: plan %llu bytes, gpt_create_lora "
                     "%llu",
                     lora.rank, layers, channels, T, B, vocab, (unsigned long long)r.total,
                     (unsigned long long)real);
        gpt_free(model);
        in.lora_rank = 0;
        /* ZeRO-1 on 2, 3 or 4 GPUs: rank 0 holds the largest shard of m and v
         * (gpc_dist_shard_offsets, align 64), which is what the plan counts */
        int gpus = 2 + trial % 3;
        size_t shard[5];
        gpc_dist_shard_offsets(gpt_config_num_params(&config), gpus, 64, shard);
        TEST_OK(
            gpt_create_shard(&model, &config, gpc_cpu(), GPC_F32, B, T, recompute, 0, shard[1]));
        in.zero = 1, in.gpus = gpus;
        TEST_OK(gpc_plan_compute(&in, &r));
        real = gpt_memory_bytes(model);
        if (!(r.total >= real && r.total - real < 2 * 256))
            fail_msg("zero 1 on %d GPUs, L=%d C=%d T=%d B=%d V=%d: plan %llu bytes, rank 0 holds "
                     "%llu",
                     gpus, layers, channels, T, B, vocab, (unsigned long long)r.total,
                     (unsigned long long)real);
        gpt_free(model);
        in.zero = 0;
        /* a part (gpt_create_part) of tp slices and pp stages: the first
         * stage, with pp micro-batches' activations (1F1B's most); a tp of
         * 3 cuts the padded vocabulary unevenly (gpt_tp_vocab_rows) */
        int tp = heads % 2 == 0 ? 2 : heads == 3 ? 3 : 1, pp = trial % 8 < 6 ? layers : 1;
        gpt_parallel par = {tp, 0, pp, 0, pp};
        /* under pp a block count is each stage's: at most its L/pp blocks */
        int stage_blocks = blocks < layers / pp ? blocks : layers / pp;
        int part_recompute = GPT_RECOMPUTE(level, stage_blocks);
        TEST_OK(gpt_create_part(&model, &config, gpc_cpu(), GPC_F32, B, T, part_recompute, &par, 0,
                                SIZE_MAX));
        in.tp = tp, in.pp = pp, in.gpus = tp * pp, in.recompute = part_recompute;
        TEST_OK(gpc_plan_compute(&in, &r));
        assert_int_equal(r.num_params, gpt_num_params(model));
        real = gpt_memory_bytes(model);
        if (!(r.total >= real && r.total - real < 2 * 256))
            fail_msg("tp %d x pp %d, L=%d NH=%d C=%d T=%d B=%d V=%d: plan %llu bytes, the first "
                     "stage holds %llu",
                     tp, pp, layers, heads, channels, T, B, vocab, (unsigned long long)r.total,
                     (unsigned long long)real);
        gpt_free(model);
        in.tp = in.pp = in.gpus = 1;
        /* the optimizer offloaded: the arenas lose m and v, and the
         * host's pinned block is what the plan says, to the byte */
        in.recompute = recompute, in.offload = 1;
        TEST_OK(gpt_create_offload(&model, &config, gpc_cpu(), GPC_F32, B, T, recompute));
        TEST_OK(gpc_plan_compute(&in, &r));
        real = gpt_memory_bytes(model);
        if (!(r.total >= real && r.total - real < 2 * 256))
            fail_msg("offloaded, L=%d C=%d T=%d B=%d V=%d: plan %llu bytes, gpt_create_offload "
                     "%llu",
                     layers, channels, T, B, vocab, (unsigned long long)r.total,
                     (unsigned long long)real);
        assert_int_equal(r.host_pinned, gpt_host_pinned_bytes(model));
        assert_true(gpt_optimizer_offloaded(model));
        gpt_free(model);
        in.offload = 0;
    }
}

/* The layouts that do not divide the model or the GPUs are refused, each
 * with the option to change. */
static void test_parallel_messages(void **state) {
    (void)state;
    gpc_plan_input in;
    gpc_plan_result r;
    gpc_plan_defaults(&in); /* d12: 12 layers, 12 heads */
    in.tp = 5, in.gpus = 5;
    TEST_FAILS(gpc_plan_compute(&in, &r), GPC_ERR_INVALID_ARG, "--tp 5 does not divide");
    gpc_plan_defaults(&in);
    in.pp = 5, in.gpus = 5;
    TEST_FAILS(gpc_plan_compute(&in, &r), GPC_ERR_INVALID_ARG, "--pp 5 does not divide");
    gpc_plan_defaults(&in);
    in.tp = 2, in.pp = 2, in.gpus = 6;
    TEST_FAILS(gpc_plan_compute(&in, &r), GPC_ERR_INVALID_ARG, "--gpus 6 is not a multiple");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_d12_bf16_by_hand),        cmocka_unit_test(test_recompute_by_hand),
        cmocka_unit_test(test_fp32_zero1_by_hand),      cmocka_unit_test(test_lora_by_hand),
        cmocka_unit_test(test_tiny_alignment_by_hand),  cmocka_unit_test(test_gpt2_sizes),
        cmocka_unit_test(test_max_batch_boundary),      cmocka_unit_test(test_bad_input_messages),
        cmocka_unit_test(test_plan_matches_gpt_create), cmocka_unit_test(test_parallel_messages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
