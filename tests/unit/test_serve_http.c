/* test_serve_http.c: the socket-free parts of gpc serve's HTTP front end:
 * the completions request parser (every field, and the 400 of each kind of
 * bad input), the UTF-8 hold-back across tokens, the stop-string matcher,
 * and the incremental detokenizer against the tokenizer's own decode of the
 * whole text. */
#include "testutil.h"

#include "gpc/tokenizer.h"
#include "serve/http_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse(const char *body, http_completion_request *req, char *error) {
    return http_completion_parse(body, strlen(body), 300, req, error, 512);
}

static void expect_400(const char *body, const char *says) {
    http_completion_request req;
    char error[512] = "";
    int rc = parse(body, &req, error);
    if (rc != 400 || !strstr(error, says))
        fail_msg("%s: got %d '%s', expected 400 saying '%s'", body, rc, error, says);
}

static void test_parse_fields(void **state) {
    (void)state;
    http_completion_request req;
    char error[512];
    assert_int_equal(parse("{\"prompt\":\"hi\"}", &req, error), 0);
    assert_true(req.has_text);
    assert_string_equal(req.prompt_text, "hi");
    assert_int_equal(req.max_tokens, 16);
    assert_true(req.temperature == 1.0f && req.top_p == 1.0f && req.top_k == 0);
    assert_false(req.stream || req.has_seed || req.stop_count || req.ignore_eos);
    http_completion_clear(&req);

    assert_int_equal(parse("{\"model\":\"m\",\"prompt\":[5,7,299],\"max_tokens\":9,"
                           "\"temperature\":0,\"top_k\":-1,\"top_p\":0.5,\"seed\":42,"
                           "\"stop\":[\"a\",\"bc\"],\"stream\":true,\"ignore_eos\":true,"
                           "\"min_tokens\":3,\"n\":1,\"echo\":false,\"logprobs\":null,"
                           "\"stream_options\":{\"include_usage\":true},\"user\":\"u\"}",
                           &req, error),
                     0);
    assert_false(req.has_text);
    assert_int_equal(req.prompt_ids_len, 3);
    assert_int_equal(req.prompt_ids[2], 299);
    assert_int_equal(req.max_tokens, 9);
    assert_true(req.temperature == 0.0f && req.top_p == 0.5f && req.top_k == 0);
    assert_true(req.has_seed && req.seed == 42);
    assert_int_equal(req.stop_count, 2);
    assert_string_equal(req.stop[1], "bc");
    assert_int_equal(req.stop_len[1], 2);
    assert_true(req.stream && req.ignore_eos && req.include_usage);
    assert_int_equal(req.min_tokens, 3);
    http_completion_clear(&req);

    /* OpenAI's one-prompt batch forms */
    assert_int_equal(parse("{\"prompt\":[\"x\"],\"stop\":\"END\"}", &req, error), 0);
    assert_string_equal(req.prompt_text, "x");
    assert_int_equal(req.stop_count, 1);
    http_completion_clear(&req);
    assert_int_equal(parse("{\"prompt\":[[1,2]],\"max_tokens\":null}", &req, error), 0);
    assert_int_equal(req.prompt_ids_len, 2);
    assert_int_equal(req.max_tokens, 16);
    http_completion_clear(&req);
}

static void test_parse_errors(void **state) {
    (void)state;
    expect_400("{\"prompt\":", "not valid JSON");
    expect_400("", "not valid JSON");
    expect_400("[1,2]", "must be a JSON object");
    expect_400("{}", "'prompt' is required");
    expect_400("{\"prompt\":5}", "'prompt' must be a string or an array");
    expect_400("{\"prompt\":[]}", "at least one id");
    expect_400("{\"prompt\":[1,\"a\"]}", "array of token ids");
    expect_400("{\"prompt\":[300]}", "outside the vocabulary (0 to 299)");
    expect_400("{\"prompt\":[-1]}", "outside the vocabulary");
    expect_400("{\"prompt\":[\"a\",\"b\"]}", "several prompts");
    expect_400("{\"prompt\":\"x\",\"max_tokens\":0}", "'max_tokens' must be 1 to");
    expect_400("{\"prompt\":\"x\",\"max_tokens\":-3}", "'max_tokens' must be 1 to");
    expect_400("{\"prompt\":\"x\",\"max_tokens\":\"5\"}", "'max_tokens' must be a whole number");
    expect_400("{\"prompt\":\"x\",\"max_tokens\":2.5}", "'max_tokens' must be a whole number");
    expect_400("{\"prompt\":\"x\",\"temperature\":\"hot\"}", "'temperature' must be a number");
    expect_400("{\"prompt\":\"x\",\"temperature\":-1}", "'temperature' must be 0");
    expect_400("{\"prompt\":\"x\",\"top_p\":0}", "'top_p' must be above 0");
    expect_400("{\"prompt\":\"x\",\"top_k\":-2}", "'top_k' must be -1 to");
    expect_400("{\"prompt\":\"x\",\"seed\":-1}", "'seed' must be 0 to");
    expect_400("{\"prompt\":\"x\",\"stream\":1}", "'stream' must be true or false");
    expect_400("{\"prompt\":\"x\",\"stop\":5}", "'stop' must be a string or an array");
    expect_400("{\"prompt\":\"x\",\"stop\":[\"\"]}", "a stop string must hold 1 to");
    expect_400("{\"prompt\":\"x\",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\","
               "\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}",
               "at most 16");
    expect_400("{\"prompt\":\"x\",\"max_tokens\":2,\"min_tokens\":3}", "must not exceed");
    expect_400("{\"prompt\":\"x\",\"n\":2}", "'n' must be 1");
    expect_400("{\"prompt\":\"x\",\"echo\":true}", "'echo' must be false");
    expect_400("{\"prompt\":\"x\",\"max_token\":5}", "unknown field 'max_token'");
    expect_400("{\"prompt\":\"x\",\"stream_options\":{\"x\":1}}", "stream_options.x");
    expect_400("{\"prompt\":\"x\",\"prompt\":\"y\"}", "duplicate");
}

/* Feeds bytes one at a time; returns what came out. */
static void utf8_bytewise(const char *in, size_t n, http_text *out) {
    http_utf8 u = {{0}, 0};
    for (size_t i = 0; i < n; i++)
        assert_int_equal(http_utf8_feed(&u, in + i, 1, 0, out), 0);
    assert_int_equal(http_utf8_feed(&u, "", 0, 1, out), 0);
}

static void test_utf8_hold_back(void **state) {
    (void)state;
    http_utf8 u = {{0}, 0};
    http_text out = {0};
    /* "é" = C3 A9 split across two tokens: nothing, then the whole character */
    assert_int_equal(http_utf8_feed(&u, "caf\xC3", 4, 0, &out), 0);
    assert_string_equal(out.data, "caf");
    assert_int_equal(http_utf8_feed(&u, "\xA9!", 2, 0, &out), 0);
    assert_string_equal(out.data, "caf\xC3\xA9!");
    http_text_free(&out);
    /* a 4-byte emoji byte by byte, valid text byte by byte comes out whole */
    const char *text = "a\xF0\x9F\x98\x80 \xE2\x82\xAC\xC3\xBC z";
    utf8_bytewise(text, strlen(text), &out);
    assert_string_equal(out.data, text);
    http_text_free(&out);
    /* bytes that are not UTF-8 each become U+FFFD: a stray continuation, an
     * overlong form, a surrogate, a lead byte cut off by the end */
    const char *bad = "x\x80y\xC0\xAFz\xED\xA0\x80w\xE2\x82";
    utf8_bytewise(bad, strlen(bad), &out);
    assert_string_equal(out.data, "x\xEF\xBF\xBDy\xEF\xBF\xBD\xEF\xBF\xBDz\xEF\xBF\xBD\xEF\xBF\xBD"
                                  "\xEF\xBF\xBDw\xEF\xBF\xBD\xEF\xBF\xBD");
    http_text_free(&out);
}

/* Feeds text in pieces of `step` bytes through stops; returns the output
 * and whether a stop matched. */
static int stop_run(const char *const *stops, const size_t *lens, int count, const char *text,
                    size_t step, http_text *out) {
    http_stop s = {stops, lens, count, {0}};
    int matched = 0;
    size_t n = strlen(text);
    for (size_t i = 0; i < n && !matched; i += step) {
        size_t k = i + step <= n ? step : n - i;
        int rc = http_stop_feed(&s, text + i, k, out);
        assert_true(rc >= 0);
        matched = rc;
    }
    if (!matched) http_stop_flush(&s, out);
    http_stop_free(&s);
    if (!out->data) http_text_append(out, "", 0);
    return matched;
}

static void test_stop_strings(void **state) {
    (void)state;
    const char *stops[] = {"STOP", "\n\n", "Sx"};
    const size_t lens[] = {4, 2, 2};
    for (size_t step = 1; step <= 5; step++) {
        http_text out = {0};
        assert_int_equal(stop_run(stops, lens, 1, "abcSTOPdef", step, &out), 1);
        assert_string_equal(out.data, "abc");
        http_text_free(&out);
        /* a near miss is text after all, once it cannot become a stop string */
        assert_int_equal(stop_run(stops, lens, 1, "abSTOxSTO", step, &out), 0);
        assert_string_equal(out.data, "abSTOxSTO");
        http_text_free(&out);
        /* the earliest match wins, whichever string it is */
        assert_int_equal(stop_run(stops, lens, 3, "one\n\ntwo STOP", step, &out), 1);
        assert_string_equal(out.data, "one");
        http_text_free(&out);
        assert_int_equal(stop_run(stops, lens, 3, "aSSxSTOP", step, &out), 1);
        assert_string_equal(out.data, "aS");
        http_text_free(&out);
    }
    /* no stop strings: everything passes at once */
    http_stop none = {NULL, NULL, 0, {0}};
    http_text out = {0};
    assert_int_equal(http_stop_feed(&none, "STOP", 4, &out), 0);
    assert_string_equal(out.data, "STOP");
    http_text_free(&out);
}

static const char CORPUS[] = "the café serves crème brûlée, the naïve über cat eats 🍰 and 🍵. ";

static void test_detok_matches_decode(void **state) {
    (void)state;
    /* a tokenizer whose merges cut multi-byte characters: token by token
     * text must still equal the decode of the whole */
    char *corpus = malloc(sizeof CORPUS * 40);
    size_t n = 0;
    for (int i = 0; i < 40; i++, n += sizeof CORPUS - 1)
        memcpy(corpus + n, CORPUS, sizeof CORPUS - 1);
    gpc_tokenizer *tok = NULL;
    assert_int_equal(gpc_tokenizer_train(&tok, corpus, n, 330, NULL, NULL), GPC_OK);
    const char *text = "crème brûlée 🍰 over the café; naïve über 🍵 end";
    uint32_t *ids = NULL;
    size_t count = 0;
    assert_int_equal(gpc_tokenizer_encode(tok, text, strlen(text), &ids, &count), GPC_OK);
    char *whole = NULL;
    size_t bytes = 0;
    assert_int_equal(gpc_tokenizer_decode(tok, ids, count, &whole, &bytes), GPC_OK);
    assert_string_equal(whole, text);

    http_completion_request req;
    memset(&req, 0, sizeof req);
    http_detok d;
    http_detok_init(&d, tok, gpc_tokenizer_eot(tok), &req);
    http_text out = {0};
    int split = 0;
    for (size_t i = 0; i < count; i++) {
        size_t before = out.len;
        assert_int_equal(http_detok_token(&d, ids[i], &out), 0);
        /* every prefix given out is whole UTF-8 and a prefix of the text */
        assert_memory_equal(out.data ? out.data : "", text, out.len);
        size_t len;
        gpc_tokenizer_token_bytes(tok, ids[i], &len);
        split += out.len - before != len;
    }
    assert_int_equal(http_detok_finish(&d, &out), 0);
    assert_string_equal(out.data, text);
    assert_true(split > 0); /* the test did cut characters */
    http_detok_free(&d);
    http_text_free(&out);

    /* with a stop string: the text before its first occurrence */
    req.stop[0] = "über";
    req.stop_len[0] = strlen("über");
    req.stop_count = 1;
    http_detok_init(&d, tok, gpc_tokenizer_eot(tok), &req);
    int matched = 0;
    for (size_t i = 0; i < count && !matched; i++)
        matched = http_detok_token(&d, ids[i], &out);
    assert_int_equal(matched, 1);
    assert_string_equal(out.data, "crème brûlée 🍰 over the café; naïve ");
    /* tokens after the match add nothing */
    assert_int_equal(http_detok_token(&d, ids[0], &out), 1);
    assert_string_equal(out.data, "crème brûlée 🍰 over the café; naïve ");
    http_detok_free(&d);
    http_text_free(&out);
    gpc_free(ids);
    gpc_free(whole);
    gpc_tokenizer_free(tok);
    free(corpus);
}

static void test_error_body(void **state) {
    (void)state;
    char *body = http_error_body(400, "bad \"thing\"");
    assert_string_equal(body, "{\"error\":{\"message\":\"bad \\\"thing\\\"\",\"type\":"
                              "\"invalid_request_error\",\"code\":400}}\n");
    free(body);
    assert_string_equal(http_openai_finish(GPC_FINISH_EOS), "stop");
    assert_string_equal(http_openai_finish(GPC_FINISH_STOP), "stop");
    assert_string_equal(http_openai_finish(GPC_FINISH_LENGTH), "length");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_fields),         cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_utf8_hold_back),       cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_detok_matches_decode), cmocka_unit_test(test_error_body),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
