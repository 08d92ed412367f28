/* test_gpt_fixture.c: gpc's GPT against PyTorch. tests/fixtures/gpt_tiny.bin
 * holds the weights, tokens, logits, loss and every gradient of the same tiny
 * GPT computed by tests/fixtures/gpt_reference.py (float64 from float32
 * weights; the format is documented there). gpc, in float32, must match
 * within a relative error of 1e-5 (with a floor for values near zero). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/model.h"

#define FIXTURE "tests/fixtures/gpt_tiny.bin"

typedef struct {
    int32_t L, NH, C, maxT, V, Vp, B, T;
    int64_t P;
    int32_t *tokens, *targets;
    float *params, *logits, loss, *grads;
} fixture;

/* Reads the fixture; 0 when absent (the caller skips), -1 when malformed. */
static int read_fixture(fixture *f, char **why) {
    char *path = test_source_path(FIXTURE);
    char *bytes;
    size_t size;
    if (!gpc_path_exists(path)) {
        gpc_free(path);
        return 0;
    }
    if (gpc_read_file(path, &bytes, &size) != GPC_OK) {
        *why = "cannot read it";
        gpc_free(path);
        return -1;
    }
    gpc_free(path);
    if (size < 48 || memcmp(bytes, "GPCFIXT1", 8) != 0) {
        *why = "bad magic (expected GPCFIXT1)";
        return -1;
    }
    memcpy(&f->L, bytes + 8, 32);
    memcpy(&f->P, bytes + 40, 8);
    size_t n = (size_t)f->B * f->T;
    size_t want = 48 + 2 * n * 4 + (size_t)f->P * 4 + n * (size_t)f->V * 4 + 4 + (size_t)f->P * 4;
    if (size != want) {
        *why = "size does not match its header";
        return -1;
    }
    char *at = bytes + 48;
#define TAKE(dst, count, type)                                                                     \
    do {                                                                                           \
        dst = malloc((count) * sizeof(type));                                                      \
        memcpy(dst, at, (count) * sizeof(type));                                                   \
        at += (count) * sizeof(type);                                                              \
    } while (0)
    TAKE(f->tokens, n, int32_t);
    TAKE(f->targets, n, int32_t);
    TAKE(f->params, (size_t)f->P, float);
    TAKE(f->logits, n * (size_t)f->V, float);
    memcpy(&f->loss, at, 4);
    at += 4;
    TAKE(f->grads, (size_t)f->P, float);
#undef TAKE
    gpc_free(bytes);
    return 1;
}

/* With GPC_TEST_VERBOSE: the largest error against the largest value. */
static void report(const char *what, const float *got, const float *want, size_t n) {
    if (!gpc_setting_flag("GPC_TEST_VERBOSE")) return;
    double err = 0, big = 0, rel = 0;
    for (size_t i = 0; i < n; i++) {
        err = fmax(err, fabs((double)got[i] - want[i]));
        big = fmax(big, fabs(want[i]));
        if (want[i] != 0) rel = fmax(rel, fabs((double)got[i] - want[i]) / fabs(want[i]));
    }
    fprintf(stderr, "%-22s max |error| %.3g, max |value| %.3g, ratio %.3g, max rel %.3g\n", what,
            err, big, err / big, rel);
}

static void test_matches_pytorch(void **state) {
    (void)state;
    fixture f;
    char *why = NULL;
    int got = read_fixture(&f, &why);
    if (got < 0) fail_msg("%s is malformed: %s", FIXTURE, why);
    assert_int_equal(got, 1); /* main() skips when absent */

    gpt_config c;
    gpt_model *m = NULL;
    TEST_OK(gpt_config_init(&c, f.L, f.NH, f.C, f.maxT, f.V));
    assert_int_equal(c.padded_vocab, f.Vp);
    assert_int_equal(gpt_config_num_params(&c), f.P);
    TEST_OK(gpt_create(&m, &c, gpc_cpu(), GPC_F32, f.B, f.T, 1));
    TEST_OK(gpt_set_params(m, f.params));

    size_t n = (size_t)f.B * f.T;
    int unmasked = 0;
    for (size_t i = 0; i < n; i++)
        unmasked += f.targets[i] >= 0;
    TEST_OK(gpt_zero_grad(m));
    TEST_OK(gpt_forward_backward(m, f.tokens, f.targets, f.B, f.T, 1.0f / unmasked));
    float loss;
    TEST_OK(gpt_mean_loss(m, &loss));
    test_assert_close_f32("loss", &loss, &f.loss, 1, 1e-5, 1e-3);

    /* logits: from a forward pass without the backward (which overwrites them) */
    float *logits = malloc(n * (size_t)f.V * sizeof(float));
    gpt_model *inference = NULL;
    TEST_OK(gpt_create(&inference, &c, gpc_cpu(), GPC_F32, f.B, f.T, 0));
    TEST_OK(gpt_set_params(inference, f.params));
    TEST_OK(gpt_forward(inference, f.tokens, f.targets, f.B, f.T));
    TEST_OK(gpt_copy_logits(inference, logits));
    double lmax = 0;
    for (size_t i = 0; i < n * (size_t)f.V; i++)
        lmax = fmax(lmax, fabs(f.logits[i]));
    report("logits", logits, f.logits, n * (size_t)f.V);
    for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++) {
        size_t start = gpt_param_offsets(m)[i];
        size_t end =
            i + 1 < GPT_NUM_PARAM_TENSORS ? gpt_param_offsets(m)[i + 1] : gpt_num_params(m);
        report(gpt_param_names[i], (const float *)gpt_grads_flat(m)->data + start, f.grads + start,
               end - start);
    }
    test_assert_close_f32("logits", logits, f.logits, n * (size_t)f.V, 1e-5, 0.25 * lmax);

    /* every parameter tensor's gradient. Floors: float32 sums carry an error
     * relative to the size of their terms, not of their (possibly cancelled)
     * result, so values under a quarter of the tensor's largest are held to
     * an absolute 1e-5 x that quarter; gpc's errors measure ~5e-7 of the
     * largest value here (GPC_TEST_VERBOSE=1 prints them) */
    const float *grads = gpt_grads_flat(m)->data;
    for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++) {
        size_t start = gpt_param_offsets(m)[i];
        size_t end =
            i + 1 < GPT_NUM_PARAM_TENSORS ? gpt_param_offsets(m)[i + 1] : gpt_num_params(m);
        double gmax = 0;
        for (size_t k = start; k < end; k++)
            gmax = fmax(gmax, fabs(f.grads[k]));
        char what[64];
        snprintf(what, sizeof what, "gradient of %s", gpt_param_names[i]);
        test_assert_close_f32(what, grads + start, f.grads + start, end - start, 1e-5,
                              fmax(0.25 * gmax, 1e-12));
    }
    free(logits);
    free(f.tokens), free(f.targets), free(f.params), free(f.logits), free(f.grads);
    gpt_free(m);
    gpt_free(inference);
}

int main(void) {
    fixture f;
    char *why = NULL;
    int got = read_fixture(&f, &why);
    if (got == 0) {
        fprintf(stderr, "fixture missing: run tests/fixtures/gpt_reference.py on a machine with "
                        "PyTorch (python3 tests/fixtures/gpt_reference.py "
                        "tests/fixtures/gpt_tiny.bin)\n");
        return 77;
    }
    if (got > 0) free(f.tokens), free(f.targets), free(f.params), free(f.logits), free(f.grads);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_pytorch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
