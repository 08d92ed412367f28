/* test_hf_gpt2.c: transformers' GPT-2 folders in gpc, against transformers.
 *
 * The fixture (tests/fixtures/hf_tiny, made by scripts/hf_fixtures.py) is a
 * randomly initialised GPT-2 of 2 layers, 4 heads, 48 channels, 32
 * positions and 500 tokens, saved by transformers in fp32 (one file and four
 * shards), fp16 and bf16, with transformers' logits, loss and gradients on
 * fixed tokens. gpc's logits on the CPU must be within 1e-4 of
 * transformers' (relative to the largest), the loss within 1e-5, and one
 * AdamW step (whose update, with lr 1000 and eps 1, is almost -1000 x the
 * gradient) must move each parameter as transformers' gradient says. Export
 * and import again is bit for bit; every bad folder is a one-line error that
 * leaves no run folder behind. */
#include "testutil.h"

#include "gpc/hf.h"
#include "gpc/model.h"
#include "gpc/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *tmp;
static char fixture[4096];

static int setup(void **state) {
    (void)state;
    tmp = test_tmpdir("hfgpt2");
    char *p = test_source_path("tests/fixtures/hf_tiny");
    snprintf(fixture, sizeof fixture, "%s", p);
    gpc_free(p);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    test_rmtree(tmp);
    gpc_free(tmp);
    return 0;
}

static float *read_dir(const char *name, gpt_config *c, gpc_dtype *dtype) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/%s", fixture, name);
    float *params;
    TEST_OK(gpc_hf_gpt2_read(dir, c, &params, dtype));
    return params;
}

static void test_read(void **state) {
    (void)state;
    gpt_config c;
    gpc_dtype d;
    float *p = read_dir("model", &c, &d);
    assert_int_equal(c.layers, 2);
    assert_int_equal(c.heads, 4);
    assert_int_equal(c.channels, 48);
    assert_int_equal(c.max_context, 32);
    assert_int_equal(c.vocab_size, 500);
    assert_int_equal(c.padded_vocab, 512);
    assert_int_equal(d, GPC_F32);
    size_t n = gpt_config_num_params(&c);
    for (size_t i = 500 * 48; i < 512 * 48; i++) /* padded rows */
        assert_true(p[i] == 0.0f);
    /* the transposes: c_attn.weight [C, 3C] is [in, out]; gpc's qkvw[o][i] */
    char path[4200];
    snprintf(path, sizeof path, "%s/model/model.safetensors", fixture);
    gpc_safetensors *st;
    TEST_OK(gpc_safetensors_open(&st, path));
    const gpc_st_tensor *w = gpc_safetensors_find(st, "transformer.h.1.attn.c_attn.weight");
    assert_non_null(w);
    size_t offset[GPT_NUM_PARAM_TENSORS], count[GPT_NUM_PARAM_TENSORS];
    gpc_hf_gpt2_layout(&c, offset, count);
    const float *hf = w->data;
    const float *qkvw1 = p + offset[4] + 3 * 48 * 48; /* layer 1 */
    for (int o = 0; o < 144; o += 7)
        for (int i = 0; i < 48; i += 5)
            assert_true(qkvw1[o * 48 + i] == hf[i * 144 + o]);
    gpc_safetensors_close(st);
    /* the shards hold the same weights, bit for bit */
    gpt_config c2;
    float *q = read_dir("sharded", &c2, &d);
    assert_memory_equal(p, q, n * sizeof *p);
    gpc_free(q);
    /* fp16 and bf16 copies: transformers rounded each weight to nearest */
    q = read_dir("fp16", &c2, &d);
    assert_int_equal(d, GPC_F16);
    for (size_t i = 0; i < n; i++)
        if (q[i] != gpc_f16_to_f32(gpc_f32_to_f16(p[i])))
            fail_msg("fp16 parameter %zu: %g, fp32 %g rounds to %g", i, q[i], p[i],
                     gpc_f16_to_f32(gpc_f32_to_f16(p[i])));
    gpc_free(q);
    q = read_dir("bf16", &c2, &d);
    assert_int_equal(d, GPC_BF16);
    for (size_t i = 0; i < n; i++)
        assert_true(q[i] == gpc_bf16_to_f32(gpc_f32_to_bf16(p[i])));
    gpc_free(q);
    gpc_free(p);
}

typedef struct {
    gpc_safetensors *st;
    int32_t tokens[32], targets[32];
    const float *logits; /* [2, 16, 500] */
    float loss;
} reference;

static void read_reference(reference *r) {
    char path[4200];
    snprintf(path, sizeof path, "%s/reference.safetensors", fixture);
    TEST_OK(gpc_safetensors_open(&r->st, path));
    const gpc_st_tensor *t = gpc_safetensors_find(r->st, "tokens");
    assert_int_equal(t->numel, 32);
    memcpy(r->tokens, t->data, sizeof r->tokens);
    memcpy(r->targets, gpc_safetensors_find(r->st, "targets")->data, sizeof r->targets);
    t = gpc_safetensors_find(r->st, "logits");
    assert_int_equal(t->numel, 2 * 16 * 500);
    r->logits = t->data;
    memcpy(&r->loss, gpc_safetensors_find(r->st, "loss")->data, 4);
}

static void test_logits_and_loss(void **state) {
    (void)state;
    gpt_config c;
    float *p = read_dir("model", &c, NULL);
    reference r;
    read_reference(&r);
    gpt_model *m;
    TEST_OK(gpt_create(&m, &c, gpc_cpu(), GPC_F32, 2, 16, 0));
    TEST_OK(gpt_set_params(m, p));
    TEST_OK(gpt_forward(m, r.tokens, r.targets, 2, 16));
    float *logits = malloc(2 * 16 * 500 * sizeof *logits);
    TEST_OK(gpt_copy_logits(m, logits));
    double worst = 0, scale = 0;
    for (int i = 0; i < 2 * 16 * 500; i++) {
        worst = fmax(worst, fabs((double)logits[i] - r.logits[i]));
        scale = fmax(scale, fabs((double)r.logits[i]));
    }
    fprintf(stderr, "logits: max |gpc - transformers| %.3g of max |logit| %.3g\n", worst, scale);
    assert_true(worst <= 1e-4 * scale);
    float loss;
    TEST_OK(gpt_mean_loss(m, &loss));
    fprintf(stderr, "loss: gpc %.7f transformers %.7f\n", (double)loss, (double)r.loss);
    assert_true(fabs((double)loss - r.loss) <= 1e-5 * r.loss);
    free(logits);
    gpt_free(m);
    gpc_safetensors_close(r.st);
    gpc_free(p);
}

/* One AdamW step from zero moments moves each weight by
 * -lr * g / (|g| + eps) (bias correction makes m and sqrt(v) g and |g|):
 * with lr 1000 and eps 1 that is about -1000 g, far above the weights'
 * rounding, so the step shows gpc's gradient to ~1e-6. */
static void test_gradients(void **state) {
    (void)state;
    gpt_config c;
    float *p = read_dir("model", &c, NULL);
    reference r;
    read_reference(&r);
    size_t n = gpt_config_num_params(&c);
    float *g = malloc(n * sizeof *g), *after = malloc(n * sizeof *after);
    gpc_safetensors *files[1] = {r.st};
    TEST_OK(gpc_hf_gpt2_gather(files, 1, "grad.", &c, g));
    gpt_model *m;
    TEST_OK(gpt_create(&m, &c, gpc_cpu(), GPC_F32, 2, 16, 1));
    TEST_OK(gpt_set_params(m, p));
    TEST_OK(gpt_zero_grad(m));
    TEST_OK(gpt_forward_backward(m, r.tokens, r.targets, 2, 16, 1.0f / 32));
    gpc_optim_options o;
    gpc_optim_defaults(&o);
    o.learning_rate = 1000.0f;
    o.eps = 1.0f;
    o.weight_decay = 0.0f;
    o.max_grad_norm = 0.0f;
    o.step = 1;
    TEST_OK(gpt_update(m, &o, NULL, NULL));
    TEST_OK(gpt_get_params(m, after));
    size_t offset[GPT_NUM_PARAM_TENSORS], count[GPT_NUM_PARAM_TENSORS];
    gpc_hf_gpt2_layout(&c, offset, count);
    double worst_ratio = 0;
    for (int t = 0; t < GPT_NUM_PARAM_TENSORS; t++) {
        double worst = 0, scale = 0;
        for (size_t i = offset[t]; i < offset[t] + count[t]; i++) {
            double want = -1000.0 * g[i] / (fabs((double)g[i]) + 1.0);
            double got = (double)after[i] - (double)p[i];
            worst = fmax(worst, fabs(got - want));
            scale = fmax(scale, fabs(want));
        }
        if (!(worst <= 1e-3 * scale))
            fail_msg("%s: step differs by %.3g from transformers' gradient's (largest %.3g)",
                     gpt_param_names[t], worst, scale);
        worst_ratio = fmax(worst_ratio, worst / scale);
    }
    fprintf(stderr, "gradients: worst tensor differs by %.3g of its largest step\n", worst_ratio);
    free(g);
    free(after);
    gpt_free(m);
    gpc_safetensors_close(r.st);
    gpc_free(p);
}

static void test_export_round_trip(void **state) {
    (void)state;
    char src[4200], run[4200], out[4200], out16[4200];
    snprintf(src, sizeof src, "%s/model", fixture);
    snprintf(run, sizeof run, "%s/run", tmp);
    snprintf(out, sizeof out, "%s/export", tmp);
    snprintf(out16, sizeof out16, "%s/export_bf16", tmp);
    gpc_hf_summary sum;
    TEST_OK(gpc_hf_import(src, run, &sum));
    assert_int_equal(sum.parameters, gpt_config_num_params(&sum.config));
    assert_int_equal(sum.tokenizer, 0);
    char path[4300];
    snprintf(path, sizeof path, "%s/checkpoint.bin", run);
    assert_true(gpc_path_exists(path));
    snprintf(path, sizeof path, "%s/config.txt", run);
    char *text;
    size_t size;
    TEST_OK(gpc_read_file(path, &text, &size));
    assert_non_null(strstr(text, "source=hf\n"));
    assert_non_null(strstr(text, "tokenizer=none\n"));
    gpc_free(text);
    TEST_OK(gpc_hf_export(run, out, GPC_F32, &sum));
    gpt_config a, b;
    float *p = read_dir("model", &a, NULL), *q;
    TEST_OK(gpc_hf_gpt2_read(out, &b, &q, NULL));
    assert_memory_equal(&a, &b, sizeof a);
    assert_memory_equal(p, q, gpt_config_num_params(&a) * sizeof *p);
    gpc_free(q);
    /* the written file is the same set of tensors transformers wrote */
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    gpc_safetensors *mine, *theirs;
    TEST_OK(gpc_safetensors_open(&mine, path));
    snprintf(path, sizeof path, "%s/model/model.safetensors", fixture);
    TEST_OK(gpc_safetensors_open(&theirs, path));
    assert_int_equal(gpc_safetensors_count(mine), gpc_safetensors_count(theirs));
    for (int i = 0; i < gpc_safetensors_count(theirs); i++) {
        const gpc_st_tensor *t = gpc_safetensors_at(theirs, i);
        const gpc_st_tensor *u = gpc_safetensors_find(mine, t->name);
        if (!u) fail_msg("export lacks %s", t->name);
        assert_int_equal(t->bytes, u->bytes);
        assert_memory_equal(t->data, u->data, t->bytes);
    }
    gpc_safetensors_close(mine);
    gpc_safetensors_close(theirs);
    /* bf16 export: each weight rounded to nearest */
    TEST_OK(gpc_hf_export(run, out16, GPC_BF16, NULL));
    TEST_OK(gpc_hf_gpt2_read(out16, &b, &q, NULL));
    for (size_t i = 0; i < gpt_config_num_params(&a); i++)
        assert_true(q[i] == gpc_bf16_to_f32(gpc_f32_to_bf16(p[i])));
    gpc_free(q);
    gpc_free(p);
    /* an existing --out is refused, and left alone */
    TEST_FAILS(gpc_hf_import(src, run, NULL), GPC_ERR_INVALID_ARG, "already exists");
    TEST_FAILS(gpc_hf_export(run, out, GPC_F32, NULL), GPC_ERR_INVALID_ARG, "already exists");
}

/* gpc_eval_tokens on the first row of the reference tokens: each token's
 * cross-entropy equals the one transformers' logits give. */
static void test_eval(void **state) {
    (void)state;
    gpt_config c;
    float *p = read_dir("model", &c, NULL);
    reference r;
    read_reference(&r);
    uint32_t tokens[17];
    for (int i = 0; i < 16; i++)
        tokens[i] = (uint32_t)r.tokens[i];
    tokens[16] = (uint32_t)r.targets[15];
    double want[16], mean = 0;
    for (int i = 0; i < 16; i++) {
        const float *row = r.logits + (size_t)i * 500;
        double max = row[0], z = 0;
        for (int v = 1; v < 500; v++)
            max = fmax(max, row[v]);
        for (int v = 0; v < 500; v++)
            z += exp(row[v] - max);
        want[i] = max + log(z) - row[r.targets[i]];
        mean += want[i] / 16;
    }
    gpt_model *m;
    TEST_OK(gpt_create(&m, &c, gpc_cpu(), GPC_F32, 1, 16, 0));
    TEST_OK(gpt_set_params(m, p));
    float losses[16];
    gpc_eval_result e;
    TEST_OK(gpc_eval_tokens(m, &c, 16, tokens, 17, losses, &e));
    assert_int_equal(e.tokens, 16);
    test_assert_close("eval losses", losses, want, 16, 1e-5, 1.0);
    assert_true(fabs(e.mean_loss - mean) < 1e-5);
    assert_true(fabs(e.perplexity - exp(mean)) < 1e-3);
    /* windows of 5: the first five predictions see the same tokens */
    TEST_OK(gpc_eval_tokens(m, &c, 5, tokens, 17, losses, &e));
    assert_int_equal(e.tokens, 16);
    test_assert_close("eval losses, context 5", losses, want, 5, 1e-5, 1.0);
    tokens[3] = 500;
    TEST_FAILS(gpc_eval_tokens(m, &c, 16, tokens, 17, losses, &e), GPC_ERR_INVALID_ARG,
               "outside the model's vocabulary");
    TEST_FAILS(gpc_eval_tokens(m, &c, 16, tokens, 1, losses, &e), GPC_ERR_INVALID_ARG,
               "at least 2 tokens");
    gpt_free(m);
    gpc_safetensors_close(r.st);
    gpc_free(p);
}

/* ------------------------------------------------------------- bad folders */

static void copy_file(const char *from, const char *to) {
    char *data;
    size_t size;
    TEST_OK(gpc_read_file(from, &data, &size));
    FILE *f = fopen(to, "wb");
    assert_non_null(f);
    fwrite(data, 1, size, f);
    fclose(f);
    gpc_free(data);
}

/* A folder with the fixture's config.json and its tensors, with tensor
 * `drop` left out, `rename_from` renamed to `rename_to`, and `reshape`
 * given a wrong first dimension (each NULL for none). */
static const char *bad_folder(const char *name, const char *drop, const char *rename_from,
                              const char *rename_to, const char *reshape) {
    static char dir[4200];
    char path[4300], from[4300];
    snprintf(dir, sizeof dir, "%s/%s", tmp, name);
    TEST_OK(gpc_mkdir_p(dir));
    snprintf(from, sizeof from, "%s/model/config.json", fixture);
    snprintf(path, sizeof path, "%s/config.json", dir);
    copy_file(from, path);
    snprintf(from, sizeof from, "%s/model/model.safetensors", fixture);
    gpc_safetensors *st;
    TEST_OK(gpc_safetensors_open(&st, from));
    int n = gpc_safetensors_count(st), k = 0;
    int openai = strcmp(name, "openai") == 0; /* OpenAI's names, with the mask buffers */
    static float mask[32 * 32];
    gpc_st_write_tensor *list = calloc((size_t)n + 2, sizeof *list);
    for (int i = 0; i < n; i++) {
        const gpc_st_tensor *t = gpc_safetensors_at(st, i);
        if (drop && strcmp(t->name, drop) == 0) continue;
        gpc_st_write_tensor *w = &list[k++];
        w->name = rename_from && strcmp(t->name, rename_from) == 0 ? rename_to : t->name;
        if (openai) w->name += strlen("transformer.");
        w->dtype = (gpc_dtype)t->gpc_dtype;
        w->ndim = t->ndim;
        memcpy(w->shape, t->shape, sizeof w->shape);
        w->data = t->data;
        if (reshape && strcmp(t->name, reshape) == 0) { /* same bytes, other shape */
            w->shape[0] = t->shape[1];
            w->shape[1] = t->shape[0];
        }
    }
    for (int l = 0; openai && l < 2; l++) {
        gpc_st_write_tensor *w = &list[k++];
        w->name = l ? "h.1.attn.bias" : "h.0.attn.bias";
        w->dtype = GPC_F32;
        w->ndim = 4;
        w->shape[0] = w->shape[1] = 1;
        w->shape[2] = w->shape[3] = 32;
        w->data = mask;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    TEST_OK(gpc_safetensors_write(path, list, k));
    free(list);
    gpc_safetensors_close(st);
    return dir;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* import fails with the message and writes nothing */
static void import_fails(const char *dir, gpc_status status, const char *needle) {
    char run[4200];
    snprintf(run, sizeof run, "%s/bad_run", tmp);
    TEST_FAILS(gpc_hf_import(dir, run, NULL), status, needle);
    assert_false(gpc_path_exists(run));
    assert_null(strchr(gpc_last_error(), '\n'));
}

static void test_bad_folders(void **state) {
    (void)state;
    const char *d;
    d = bad_folder("missing", "transformer.h.1.mlp.c_fc.weight", NULL, NULL, NULL);
    import_fails(d, GPC_ERR_FORMAT, "'transformer.h.1.mlp.c_fc.weight' is missing");
    d = bad_folder("unknown", NULL, "transformer.h.0.ln_1.bias", "transformer.h.0.ln_3.bias", NULL);
    import_fails(d, GPC_ERR_UNSUPPORTED, "unknown tensor 'transformer.h.0.ln_3.bias'");
    d = bad_folder("layer", NULL, "transformer.h.1.ln_1.bias", "transformer.h.7.ln_1.bias", NULL);
    import_fails(d, GPC_ERR_UNSUPPORTED, "unknown tensor 'transformer.h.7.ln_1.bias'");
    d = bad_folder("shape", NULL, NULL, NULL, "transformer.h.0.attn.c_attn.weight");
    import_fails(d, GPC_ERR_MISMATCH, "has shape [144, 48]; config.json's sizes need [48, 144]");
    /* an untied output head */
    d = bad_folder("untied", NULL, "transformer.wpe.weight", "lm_head.weight", NULL);
    import_fails(d, GPC_ERR_FORMAT, "'transformer.wpe.weight' is missing");
    /* OpenAI's names (no "transformer.") with the mask buffers: the same weights */
    char path[4300];
    d = bad_folder("openai", NULL, NULL, NULL, NULL);
    gpt_config a, b;
    float *p = read_dir("model", &a, NULL), *q;
    TEST_OK(gpc_hf_gpt2_read(d, &b, &q, NULL));
    assert_memory_equal(p, q, gpt_config_num_params(&a) * sizeof *p);
    gpc_free(p);
    gpc_free(q);
    /* another architecture */
    d = bad_folder("llama", NULL, NULL, NULL, NULL);
    snprintf(path, sizeof path, "%s/config.json", d);
    write_text(path, "{\"model_type\": \"llama\", \"hidden_size\": 48}");
    import_fails(d, GPC_ERR_UNSUPPORTED, "describes a 'llama' model");
    write_text(path, "{\"model_type\": \"gpt2\", \"n_embd\": 48, \"n_layer\": 2, \"n_head\": 4, "
                     "\"n_positions\": 32, \"vocab_size\": 500, \"activation_function\": "
                     "\"relu\"}");
    import_fails(d, GPC_ERR_UNSUPPORTED, "activation_function is 'relu'");
    write_text(path, "{\"model_type\": \"gpt2\", \"n_embd\": 48, \"n_layer\": 2, \"n_head\": 4, "
                     "\"n_positions\": 32, \"vocab_size\": 600}");
    import_fails(d, GPC_ERR_MISMATCH, "has shape [500, 48]; config.json's sizes need [600, 48]");
    write_text(path, "{\"model_type\": \"gpt2\", \"n_embd\": 48, \"n_layer\": 2}");
    import_fails(d, GPC_ERR_FORMAT, "\"n_head\" is missing");
    write_text(path, "{\"model_type\": \"gpt2\",");
    import_fails(d, GPC_ERR_FORMAT, "not valid JSON");
    /* a truncated weights file */
    d = bad_folder("truncated", NULL, NULL, NULL, NULL);
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    {
        char *data;
        size_t size;
        TEST_OK(gpc_read_file(path, &data, &size));
        FILE *f = fopen(path, "wb");
        fwrite(data, 1, size - 100, f);
        fclose(f);
        gpc_free(data);
    }
    import_fails(d, GPC_ERR_FORMAT, "truncated or its header lies");
    /* a shard index that points outside the folder */
    d = bad_folder("index", NULL, NULL, NULL, NULL);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", d);
    write_text(path, "{\"weight_map\": {\"transformer.wte.weight\": \"../../etc/passwd\"}}");
    import_fails(d, GPC_ERR_FORMAT, "not a .safetensors file of");
    import_fails("/nonexistent/folder", GPC_ERR_IO, "has no config.json");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read),      cmocka_unit_test(test_logits_and_loss),
        cmocka_unit_test(test_gradients), cmocka_unit_test(test_export_round_trip),
        cmocka_unit_test(test_eval),      cmocka_unit_test(test_bad_folders),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
