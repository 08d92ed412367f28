/* test_tokenizer_gpt2.c: GPT-2's tokenizer against Hugging Face's.
 *
 * The fixtures (tests/fixtures/gpt2, made by scripts/hf_fixtures.py) hold
 * GPT-2's real vocab.json and merges.txt, a corpus of 694 texts and the ids
 * GPT-2's fast tokenizer gives each: gpc's ids must be the same, every one.
 * Also: decode(encode(x)) == x for every text, invalid UTF-8 included; the
 * pre-tokenizer's classes equal the tokenizers library's for every code
 * point (classes.txt, probed there the same way as here); vocab.json and
 * merges.txt written by gpc equal the originals; tokenizer.bin keeps the
 * kind; bad files are clear errors. Long pre-tokens give the tokens of
 * encoder.py's merge loop, and encode in time linear in their length. */
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

/* ---- the reference: encoder.py's bpe(), merges looked up by bisection ---- */

typedef struct {
    uint64_t pair;
    uint32_t rank;
} ref_merge;

static ref_merge *ref_merges;
static size_t ref_merge_count;

static int ref_merge_order(const void *x, const void *y) {
    const ref_merge *a = x, *b = y;
    if (a->pair != b->pair) return a->pair < b->pair ? -1 : 1;
    return a->rank < b->rank ? -1 : a->rank > b->rank;
}

static void ref_build(void) {
    int count;
    const uint32_t *merges = gpc_tokenizer_merge_list(tok, &count);
    ref_merges = malloc((size_t)count * sizeof *ref_merges);
    assert_non_null(ref_merges);
    for (int r = 0; r < count; r++)
        ref_merges[r] = (ref_merge){(uint64_t)merges[2 * r] << 32 | merges[2 * r + 1], (uint32_t)r};
    qsort(ref_merges, (size_t)count, sizeof *ref_merges, ref_merge_order);
    ref_merge_count = 0; /* a pair listed twice keeps its first rank */
    for (int r = 0; r < count; r++)
        if (ref_merge_count == 0 || ref_merges[ref_merge_count - 1].pair != ref_merges[r].pair)
            ref_merges[ref_merge_count++] = ref_merges[r];
}

static uint32_t ref_rank(uint32_t a, uint32_t b) {
    uint64_t pair = (uint64_t)a << 32 | b;
    size_t lo = 0, hi = ref_merge_count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (ref_merges[mid].pair < pair)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < ref_merge_count && ref_merges[lo].pair == pair ? ref_merges[lo].rank : UINT32_MAX;
}

/* The bigram of lowest rank, merged wherever it occurs, left to right, until
 * no bigram has a rank; end of text between the pre-tokens. */
static size_t ref_encode(const unsigned char *s, size_t bytes, uint32_t *out) {
    const uint32_t *byte_token = gpc_tokenizer_byte_tokens(tok);
    const size_t eot_n = strlen(GPC_GPT2_EOT_TEXT);
    size_t total = 0;
    for (size_t at = 0;;) {
        size_t end = at;
        while (end < bytes && (bytes - end < eot_n || memcmp(s + end, GPC_GPT2_EOT_TEXT, eot_n)))
            end++;
        while (at < end) {
            size_t n = gpc_gpt2_pretoken_length(s + at, end - at);
            uint32_t *word = out + total;
            for (size_t i = 0; i < n; i++)
                word[i] = byte_token[s[at + i]];
            at += n;
            for (;;) {
                uint32_t best = UINT32_MAX;
                for (size_t i = 0; i + 1 < n; i++) {
                    uint32_t r = ref_rank(word[i], word[i + 1]);
                    if (r < best) best = r;
                }
                if (best == UINT32_MAX) break;
                size_t m = 0;
                for (size_t i = 0; i < n;) {
                    if (i + 1 < n && ref_rank(word[i], word[i + 1]) == best) {
                        word[m++] = 256 + best;
                        i += 2;
                    } else {
                        word[m++] = word[i++];
                    }
                }
                n = m;
            }
            total += n;
        }
        if (end == bytes) return total;
        out[total++] = (uint32_t)gpc_tokenizer_eot(tok);
        at = end + eot_n;
    }
}

/* Appends a random stretch of text: a run of one character or of random
 * ones from a class, words, bytes, or end of text. Runs are long one time
 * in four, so that pre-tokens of thousands of bytes are common. */
static size_t random_stretch(gpc_rng *rng, char *out, size_t room) {
    static const char *const letters2[] = {"\xc3\xa9", "\xc3\xbc", "\xc3\x9f", "\xd0\xb6",
                                           "\xce\xbb"};
    static const char *const words[] = {" the", " of", "'s",           " and", " 1999", "\n",
                                        "  ",   ",",   " caf\xc3\xa9", "'ll",  " x",    "\t"};
    const char *punct = "!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~'";
    size_t length = 1 + gpc_rng_below(rng, gpc_rng_below(rng, 4) == 0 ? 3000 : 20), n = 0;
    int kind = (int)gpc_rng_below(rng, 11);
    char one = (char)('a' + gpc_rng_below(rng, 26));
    const char *two = letters2[gpc_rng_below(rng, 5)];
    while (n < length && n + 16 < room) {
        switch (kind) {
        case 0:
            out[n++] = one;
            break; /* one letter */
        case 1:
            out[n++] = (char)('a' + gpc_rng_below(rng, 26));
            break;
        case 2:
            out[n++] = (char)('0' + gpc_rng_below(rng, 10));
            break;
        case 3:
            out[n++] = " \t\n"[gpc_rng_below(rng, 8) / 6 * (1 + gpc_rng_below(rng, 2))];
            break;
        case 4:
            out[n++] = punct[gpc_rng_below(rng, (uint32_t)strlen(punct))];
            break;
        case 5:
            out[n++] = punct[length % strlen(punct)];
            break; /* one mark */
        case 6:
            memcpy(out + n, two, 2), n += 2;
            break; /* one 2-byte letter */
        case 7:
            memcpy(out + n, letters2[gpc_rng_below(rng, 5)], 2), n += 2;
            break;
        case 8: {
            const char *w = words[gpc_rng_below(rng, 12)];
            memcpy(out + n, w, strlen(w)), n += strlen(w);
            break;
        }
        case 9:
            out[n++] = (char)gpc_rng_below(rng, 256);
            break;
        default:
            memcpy(out + n, GPC_GPT2_EOT_TEXT, 13), n += 13;
            length = 0;
        }
    }
    return n;
}

/* The bucket merge of long pre-tokens gives encoder.py's tokens: random
 * texts of long runs, random characters, words and bytes. */
static void test_long_pieces(void **state) {
    (void)state;
    ref_build();
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 31);
    enum { ROOM = 40000 };
    char *text = malloc(ROOM);
    uint32_t *want = malloc(ROOM * sizeof *want);
    size_t longest = 0, total = 0;
    for (int trial = 0; trial < 150; trial++) {
        size_t n = 0;
        int stretches = 1 + (int)gpc_rng_below(&rng, 8);
        for (int k = 0; k < stretches; k++)
            n += random_stretch(&rng, text + n, ROOM - n);
        size_t want_n = ref_encode((const unsigned char *)text, n, want);
        uint32_t *ids;
        size_t count;
        TEST_OK(gpc_tokenizer_encode(tok, text, n, &ids, &count));
        size_t k = 0;
        while (k < count && k < want_n && ids[k] == want[k])
            k++;
        if (count != want_n || k < count)
            fail_msg("trial %d (%zu bytes): %zu ids, encoder.py's loop gives %zu; first "
                     "difference at id %zu",
                     trial, n, count, want_n, k);
        for (size_t at = 0; at < n;) {
            size_t piece = gpc_gpt2_pretoken_length((const unsigned char *)text + at, n - at);
            if (piece > longest) longest = piece;
            at += piece;
        }
        total += n;
        gpc_free(ids);
    }
    fprintf(stderr, "%zu bytes, the longest pre-token %zu bytes\n", total, longest);
    assert_true(longest > 1000);
    free(text);
    free(want);
    free(ref_merges);
}

/* The best of tries times to encode text. */
static double encode_seconds(const char *text, size_t n, int tries, size_t *count) {
    double best = 1e30;
    for (int t = 0; t < tries; t++) {
        uint32_t *ids;
        double start = gpc_time_seconds();
        TEST_OK(gpc_tokenizer_encode(tok, text, n, &ids, count));
        double seconds = gpc_time_seconds() - start;
        if (seconds < best) best = seconds;
        gpc_free(ids);
    }
    return best;
}

/* A megabyte (what one `gpc serve` request may hold) that is one long
 * pre-token encodes in about the time of a megabyte of the corpus: the
 * bound of 20x leaves room for a loaded machine, and merging by rescanning
 * the pre-token for each rank took over 1000x for random letters. */
static void test_linear_time(void **state) {
    (void)state;
    enum { MB = 1 << 20 };
    blob corpus = unxz("tests/fixtures/gpt2/corpus.bin.xz");
    char *normal = malloc(MB), *text = malloc(MB);
    size_t n = 0;
    uint32_t count = u32_at(&corpus, 8);
    for (uint32_t i = 0, at = 12; n < MB; i++) { /* the texts, with valid UTF-8, repeated */
        if (i == count) i = 0, at = 12;
        at += 4 + u32_at(&corpus, at);
        uint32_t rep_n = u32_at(&corpus, at);
        size_t take = rep_n < MB - n ? rep_n : MB - n;
        memcpy(normal + n, corpus.data + at + 4, take);
        n += take;
        at += 4 + rep_n;
    }
    size_t tokens;
    double base = encode_seconds(normal, MB, 3, &tokens);
    fprintf(stderr, "1 MiB of the corpus: %.4f s, %.1f MB/s, %zu tokens\n", base, MB / base / 1e6,
            tokens);
    assert_true(tokens > MB / 5);
    const char *names[] = {"one letter",      "random letters",     "random digits",
                           "spaces",          "a 2-byte letter",    "random 2-byte letters",
                           "one punctuation", "random punctuation", "random bytes"};
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 32);
    const char *punct = "!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~";
    for (int c = 0; c < 9; c++) {
        for (size_t i = 0; i < MB; i++) {
            uint32_t x = gpc_rng_below(&rng, 26);
            const char v[] = {'a',
                              (char)('a' + x),
                              (char)('0' + x % 10),
                              ' ',
                              i % 2 ? '\xa9' : '\xc3',
                              i % 2 ? (char)(0x80 + x) : '\xc3',
                              '-',
                              punct[x],
                              (char)gpc_rng_below(&rng, 256)};
            text[i] = v[c];
        }
        double seconds = encode_seconds(text, MB, 2, &tokens);
        fprintf(stderr, "1 MiB of %s: %.4f s (%.1fx), %zu tokens\n", names[c], seconds,
                seconds / base, tokens);
        if (seconds > 20 * base)
            fail_msg("1 MiB of %s takes %.3f s to encode, %.0fx the corpus's %.4f s: encoding is "
                     "not linear in the text's length",
                     names[c], seconds, seconds / base, base);
    }
    free(normal);
    free(text);
    free(corpus.data);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shape),       cmocka_unit_test(test_corpus),
        cmocka_unit_test(test_pieces),      cmocka_unit_test(test_classes),
        cmocka_unit_test(test_files),       cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_long_pieces), cmocka_unit_test(test_linear_time),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
