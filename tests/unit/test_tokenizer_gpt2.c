/* test_tokenizer_gpt2.c: GPT-2's tokenizer against Hugging Face's.
 *
 * The fixtures (tests/fixtures/gpt2, made by scripts/hf_fixtures.py) hold
 * GPT-2's real vocab.json and merges.txt, a corpus of 694 texts and the ids
 * GPT-2's fast tokenizer gives each: gpc's ids must be the same, every one.
 * Also: decode(encode(x)) == x for every text, invalid UTF-8 included; the
 * pre-tokenizer's classes equal the tokenizers library's for every code
 * point (classes.txt, probed there the same way as here); vocab.json and
 * merges.txt written by gpc equal the originals; tokenizer.bin keeps the
 * kind; bad files are clear errors. */
#include "testutil.h"

#include "gpc/tokenizer.h"
#include "model/tokenizer_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *dir;
static gpc_tokenizer *tok;

typedef struct {
    char *data;
    size_t size;
} blob;

/* xz -dc of a fixture into memory */
static blob unxz(const char *name) {
    char *src = test_source_path(name);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "xz -dc '%s'", src);
    gpc_free(src);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    blob b = {NULL, 0};
    size_t cap = 0;
    for (;;) {
        if (b.size + 65536 > cap) {
            cap = cap ? 2 * cap : 1 << 20;
            b.data = realloc(b.data, cap);
        }
        size_t n = fread(b.data + b.size, 1, 65536, p);
        if (n == 0) break;
        b.size += n;
    }
    assert_int_equal(pclose(p), 0);
    return b;
}

static void write_blob(const char *path, blob b) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b.data, 1, b.size, f), b.size);
    fclose(f);
}

static uint32_t u32_at(const blob *b, size_t at) {
    assert_true(at + 4 <= b->size);
    const unsigned char *p = (const unsigned char *)b->data + at;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static char vocab_path[4096], merges_path[4096];

static int setup(void **state) {
    (void)state;
    dir = test_tmpdir("tokgpt2");
    snprintf(vocab_path, sizeof vocab_path, "%s/vocab.json", dir);
    snprintf(merges_path, sizeof merges_path, "%s/merges.txt", dir);
    blob v = unxz("tests/fixtures/gpt2/vocab.json.xz"),
         m = unxz("tests/fixtures/gpt2/merges.txt.xz");
    write_blob(vocab_path, v);
    write_blob(merges_path, m);
    free(v.data);
    free(m.data);
    if (gpc_tokenizer_load_gpt2(&tok, vocab_path, merges_path) != GPC_OK) {
        fprintf(stderr, "%s\n", gpc_last_error());
        return 1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    gpc_tokenizer_free(tok);
    test_rmtree(dir);
    gpc_free(dir);
    return 0;
}

static void test_shape(void **state) {
    (void)state;
    assert_int_equal(gpc_tokenizer_get_kind(tok), GPC_TOKENIZER_GPT2);
    assert_string_equal(gpc_tokenizer_kind_name(GPC_TOKENIZER_GPT2), "gpt2");
    assert_int_equal(gpc_tokenizer_vocab_size(tok), 50257);
    assert_int_equal(gpc_tokenizer_eot(tok), 50256);
    size_t n;
    const char *b = gpc_tokenizer_token_bytes(tok, 0, &n); /* '!' is GPT-2's id 0 */
    assert_int_equal(n, 1);
    assert_int_equal(b[0], '!');
    b = gpc_tokenizer_token_bytes(tok, 220, &n); /* and ' ' is 220 */
    assert_int_equal(n, 1);
    assert_int_equal(b[0], ' ');
    b = gpc_tokenizer_token_bytes(tok, 50256, &n);
    assert_int_equal(n, 13);
    assert_memory_equal(b, "<|endoftext|>", 13);
    /* "Hello world" is [15496, 995] in GPT-2, as every GPT-2 tutorial shows */
    uint32_t *ids;
    TEST_OK(gpc_tokenizer_encode(tok, "Hello world", 11, &ids, &n));
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 15496);
    assert_int_equal(ids[1], 995);
    gpc_free(ids);
}

/* The corpus against the fast tokenizer's ids, text by text. */
static void test_corpus(void **state) {
    (void)state;
    blob corpus = unxz("tests/fixtures/gpt2/corpus.bin.xz");
    blob want = unxz("tests/fixtures/gpt2/ids.bin.xz");
    assert_memory_equal(corpus.data, "GPCTXT01", 8);
    assert_memory_equal(want.data, "GPCIDS01", 8);
    uint32_t count = u32_at(&corpus, 8);
    assert_int_equal(count, u32_at(&want, 8));
    size_t at = 12, wat = 12, tokens = 0, bytes = 0;
    int mismatches = 0, invalid = 0;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t raw_n = u32_at(&corpus, at);
        const char *raw = corpus.data + at + 4;
        at += 4 + raw_n;
        uint32_t rep_n = u32_at(&corpus, at);
        const char *rep = corpus.data + at + 4;
        at += 4 + rep_n;
        uint32_t want_n = u32_at(&want, wat);
        wat += 4;
        uint32_t *ids;
        size_t n;
        TEST_OK(gpc_tokenizer_encode(tok, rep, rep_n, &ids, &n));
        int same = n == want_n;
        for (size_t k = 0; same && k < n; k++)
            same = ids[k] == u32_at(&want, wat + 4 * k);
        if (!same && mismatches++ < 5) {
            size_t k = 0;
            while (k < n && k < want_n && ids[k] == u32_at(&want, wat + 4 * k))
                k++;
            fprintf(stderr, "text %u (%u bytes): %zu ids, want %u; first difference at id %zu\n", i,
                    rep_n, n, want_n, k);
        }
        /* decoding gives the text back */
        char *text;
        size_t text_n;
        TEST_OK(gpc_tokenizer_decode(tok, ids, n, &text, &text_n));
        assert_int_equal(text_n, rep_n);
        assert_memory_equal(text, rep, rep_n);
        gpc_free(text);
        gpc_free(ids);
        /* the raw bytes, invalid UTF-8 included, round trip too */
        TEST_OK(gpc_tokenizer_encode(tok, raw, raw_n, &ids, &n));
        TEST_OK(gpc_tokenizer_decode(tok, ids, n, &text, &text_n));
        assert_int_equal(text_n, raw_n);
        assert_memory_equal(text, raw, raw_n);
        gpc_free(text);
        gpc_free(ids);
        invalid += raw_n != rep_n || memcmp(raw, rep, raw_n) != 0;
        wat += 4 * (size_t)want_n;
        tokens += want_n;
        bytes += rep_n;
    }
    fprintf(stderr, "%u texts, %zu bytes, %zu tokens, %d with invalid UTF-8: %d differ\n", count,
            bytes, tokens, invalid, mismatches);
    assert_int_equal(mismatches, 0);
    assert_true(tokens > 400000);
    assert_true(invalid >= 50);
    free(corpus.data);
    free(want.data);
}

static void utf8(char *out, uint32_t cp, size_t *n) {
    if (cp < 0x80) {
        out[0] = (char)cp, *n = 1;
    } else if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3F)), *n = 2;
    } else if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12), out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F)), *n = 3;
    } else {
        out[0] = (char)(0xF0 | cp >> 18), out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), out[3] = (char)(0x80 | (cp & 0x3F)), *n = 4;
    }
}

/* The pre-tokenizer cuts text into the pieces the regex gives. */
static void expect_pieces(const char *text, const char *const *parts, int count) {
    const unsigned char *s = (const unsigned char *)text;
    size_t n = strlen(text), at = 0;
    for (int i = 0; i < count; i++) {
        assert_true(at < n);
        size_t len = gpc_gpt2_pretoken_length(s + at, n - at);
        if (len != strlen(parts[i]) || memcmp(s + at, parts[i], len) != 0)
            fail_msg("'%s': piece %d is '%.*s', the regex gives '%s'", text, i, (int)len, text + at,
                     parts[i]);
        at += len;
    }
    assert_int_equal(at, n);
}

static void test_pieces(void **state) {
    (void)state;
    const char *a[] = {"I", "'m", " here"};
    expect_pieces("I'm here", a, 3);
    const char *b[] = {"  ", " x"}; /* a run leaves its last space to the word */
    expect_pieces("   x", b, 2);
    const char *c[] = {"\t", "\t", "x"}; /* but only a space joins the word */
    expect_pieces("\t\tx", c, 3);
    const char *c2[] = {"\t", "x"}; /* a run of one stays whole */
    expect_pieces("\tx", c2, 2);
    const char *d[] = {"a", "   "}; /* a run at the end stays whole */
    expect_pieces("a   ", d, 2);
    const char *e[] = {"DON", "'", "T"}; /* contractions are lower case only */
    expect_pieces("DON'T", e, 3);
    const char *f[] = {"x", " 123", " ...'", "s", "'ll"};
    expect_pieces("x 123 ...'s'll", f, 5);
    const char *g[] = {"caf\xc3\xa9", " \xe2\x82\xac", "12", "\xff\xfe", " \xc3\xa9"};
    expect_pieces("caf\xc3\xa9 \xe2\x82\xac"
                  "12\xff\xfe \xc3\xa9",
                  g, 5);
    /* Devanagari's virama and vowel signs are marks, not letters */
    const char *h[] = {"\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8", "\xe0\xa5\x8d", "\xe0\xa4\xa4",
                       "\xe0\xa5\x87"};
    expect_pieces("\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5\x8d\xe0\xa4\xa4\xe0\xa5\x87", h, 4);
}

/* Every code point classed as the tokenizers library classes it
 * (classes.txt, from the same probes there): "a"+c is one piece only for a
 * letter, "1"+c only for a number, "\t"+c only for whitespace. */
static void test_classes(void **state) {
    (void)state;
    char *path = test_source_path("tests/fixtures/gpt2/classes.txt");
    FILE *f = fopen(path, "r");
    gpc_free(path);
    assert_non_null(f);
    unsigned lo, hi;
    char cls;
    int checked = 0, wrong = 0;
    while (fscanf(f, "%x %x %c", &lo, &hi, &cls) == 3) {
        for (uint32_t cp = lo; cp <= hi; cp++) {
            if (cp >= 0xD800 && cp < 0xE000) continue;
            unsigned char text[8];
            size_t n;
            utf8((char *)text + 1, cp, &n);
            char got = 'O';
            const char *probe = "a1\t", *name = "LNS";
            for (int k = 0; k < 3 && got == 'O'; k++) {
                text[0] = (unsigned char)probe[k];
                if (gpc_gpt2_pretoken_length(text, n + 1) == n + 1) got = name[k];
            }
            if (got != cls && wrong++ < 5)
                fprintf(stderr, "U+%04X: %c, the tokenizers library says %c\n", cp, got, cls);
            checked++;
        }
    }
    fclose(f);
    assert_int_equal(wrong, 0);
    assert_true(checked > 1000000);
}

static void test_files(void **state) {
    (void)state;
    /* tokenizer.bin keeps the kind and every id */
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.bin", dir);
    TEST_OK(gpc_tokenizer_save(tok, path));
    gpc_tokenizer *back;
    TEST_OK(gpc_tokenizer_load(&back, path));
    assert_int_equal(gpc_tokenizer_get_kind(back), GPC_TOKENIZER_GPT2);
    const char *text = "Gr\xc3\xbc\xc3\x9f"
                       "e, I'm   back<|endoftext|>\xff!";
    uint32_t *x, *y;
    size_t nx, ny;
    TEST_OK(gpc_tokenizer_encode(tok, text, strlen(text), &x, &nx));
    TEST_OK(gpc_tokenizer_encode(back, text, strlen(text), &y, &ny));
    assert_int_equal(nx, ny);
    assert_memory_equal(x, y, nx * sizeof *x);
    assert_int_equal(x[nx - 3], 50256);
    gpc_free(x);
    gpc_free(y);
    gpc_tokenizer_free(back);
    /* vocab.json and merges.txt written back equal GPT-2's */
    char out[4096];
    snprintf(out, sizeof out, "%s/export", dir);
    TEST_OK(gpc_mkdir_p(out));
    TEST_OK(gpc_tokenizer_write_gpt2(tok, out));
    char written[8192];
    snprintf(written, sizeof written, "%s/vocab.json", out);
    json_t *a = json_load_file(vocab_path, 0, NULL), *b = json_load_file(written, 0, NULL);
    assert_non_null(a);
    assert_non_null(b);
    assert_true(json_equal(a, b));
    json_decref(a);
    json_decref(b);
    char *m1, *m2;
    size_t s1, s2;
    snprintf(written, sizeof written, "%s/merges.txt", out);
    TEST_OK(gpc_read_file(merges_path, &m1, &s1));
    TEST_OK(gpc_read_file(written, &m2, &s2));
    assert_int_equal(s1, s2);
    assert_memory_equal(m1, m2, s1);
    gpc_free(m1);
    gpc_free(m2);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_bad_files(void **state) {
    (void)state;
    gpc_tokenizer *t = NULL;
    char v[4096], m[4096];
    snprintf(v, sizeof v, "%s/bad_vocab.json", dir);
    snprintf(m, sizeof m, "%s/bad_merges.txt", dir);
    write_text(v, "[1, 2]");
    TEST_FAILS(gpc_tokenizer_load_gpt2(&t, v, merges_path), GPC_ERR_FORMAT, "not a JSON object");
    write_text(v, "{\"a\": 1");
    TEST_FAILS(gpc_tokenizer_load_gpt2(&t, v, merges_path), GPC_ERR_FORMAT, "not valid JSON");
    write_text(v, "{\"a\": 0}");
    TEST_FAILS(gpc_tokenizer_load_gpt2(&t, v, merges_path), GPC_ERR_FORMAT, "no id below 256");
    TEST_FAILS(gpc_tokenizer_load_gpt2(&t, vocab_path, "/nonexistent/merges.txt"), GPC_ERR_IO,
               "merges.txt");
    write_text(m, "#version: 0.2\n\xc4\xa0 t\n");
    TEST_FAILS(gpc_tokenizer_load_gpt2(&t, vocab_path, m), GPC_ERR_FORMAT, "has 1 merges");
    write_text(m, "#version: 0.2\nh e\n");
    TEST_FAILS(gpc_tokenizer_load_gpt2(&t, vocab_path, m), GPC_ERR_FORMAT, "merge r makes");
    write_text(m, "#version: 0.2\nabc\n");
    TEST_FAILS(gpc_tokenizer_load_gpt2(&t, vocab_path, m), GPC_ERR_FORMAT, "not a merge");
    assert_null(t);
    /* gpc's own tokenizer has no vocab.json */
    gpc_tokenizer *own;
    TEST_OK(gpc_tokenizer_train(&own, "aaa bbb aaa", 11, 258, NULL, NULL));
    TEST_FAILS(gpc_tokenizer_write_gpt2(own, dir), GPC_ERR_INVALID_ARG, "trained by gpc");
    gpc_tokenizer_free(own);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shape),  cmocka_unit_test(test_corpus),
        cmocka_unit_test(test_pieces), cmocka_unit_test(test_classes),
        cmocka_unit_test(test_files),  cmocka_unit_test(test_bad_files),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
