/* test_tokenizer.c: the byte-level BPE tokenizer: exact round trips of any
 * bytes, compression of text, deterministic training, encoding equal to a
 * naive encoder that applies every merge in order (written here from the
 * file format, not from gpc's code), and every kind of bad tokenizer file. */
#include "testutil.h"

#include "gpc/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const words[] = {
    "the",     "of",   "and",   "a",     "to",    "in",       "is",     "you",  "that",  "it",
    "he",      "was",  "for",   "on",    "are",   "as",       "with",   "his",  "they",  "I",
    "at",      "be",   "this",  "have",  "from",  "or",       "one",    "had",  "by",    "word",
    "but",     "not",  "what",  "all",   "were",  "we",       "when",   "your", "can",   "said",
    "there",   "use",  "an",    "each",  "which", "she",      "do",     "how",  "their", "if",
    "will",    "up",   "other", "about", "out",   "many",     "then",   "them", "these", "so",
    "some",    "her",  "would", "make",  "like",  "him",      "into",   "time", "has",   "look",
    "two",     "more", "write", "go",    "see",   "number",   "no",     "way",  "could", "people",
    "my",      "than", "first", "water", "been",  "call",     "who",    "oil",  "its",   "now",
    "find",    "long", "down",  "day",   "did",   "get",      "come",   "made", "may",   "part",
    "Fortune", "GPU",  "café",  "naïve", "über",  "computer", "program"};

/* Random English-like text: words, spaces, punctuation, numbers, newlines. */
static char *make_text(gpc_rng *rng, size_t target, size_t *bytes) {
    char *text = malloc(target + 64);
    size_t n = 0;
    while (n < target) {
        const char *w = words[gpc_rng_below(rng, sizeof words / sizeof words[0])];
        size_t len = strlen(w);
        memcpy(text + n, w, len);
        n += len;
        uint32_t r = gpc_rng_below(rng, 100);
        if (r < 70)
            text[n++] = ' ';
        else if (r < 80)
            n += (size_t)sprintf(text + n, ", ");
        else if (r < 87)
            n += (size_t)sprintf(text + n, ".\n");
        else if (r < 92)
            n += (size_t)sprintf(text + n, " %u ", gpc_rng_below(rng, 2000));
        else if (r < 96)
            n += (size_t)sprintf(text + n, "\n\n    ");
        else
            n += (size_t)sprintf(text + n, " -- ");
    }
    *bytes = n;
    return text;
}

static gpc_tokenizer *train_on(const char *text, size_t bytes, int vocab) {
    gpc_tokenizer *tok = NULL;
    TEST_OK(gpc_tokenizer_train(&tok, text, bytes, vocab, NULL, NULL));
    return tok;
}

static void assert_round_trip(const gpc_tokenizer *tok, const char *text, size_t bytes) {
    uint32_t *tokens;
    size_t count;
    char *back;
    size_t back_bytes;
    TEST_OK(gpc_tokenizer_encode(tok, text, bytes, &tokens, &count));
    assert_true(count <= bytes);
    for (size_t i = 0; i < count; i++)
        assert_true(tokens[i] < (uint32_t)gpc_tokenizer_eot(tok)); /* never the end-of-text */
    TEST_OK(gpc_tokenizer_decode(tok, tokens, count, &back, &back_bytes));
    assert_int_equal(back_bytes, bytes);
    assert_memory_equal(back, text, bytes);
    assert_int_equal(back[back_bytes], '\0');
    gpc_free(tokens);
    gpc_free(back);
}

static void test_round_trip_any_bytes(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 11);
    size_t bytes;
    char *text = make_text(&rng, 60000, &bytes);
    gpc_tokenizer *tok = train_on(text, bytes, 600);
    assert_int_equal(gpc_tokenizer_vocab_size(tok), 600);
    assert_int_equal(gpc_tokenizer_eot(tok), 599);
    assert_round_trip(tok, text, bytes);
    assert_round_trip(tok, "", 0);
    char *buf = malloc(5000);
    for (int trial = 0; trial < 300; trial++) {
        size_t n = gpc_rng_below(&rng, 5000);
        int kind = trial % 3;
        for (size_t i = 0; i < n; i++) {
            if (kind == 0)
                buf[i] = (char)gpc_rng_below(&rng, 256); /* binary, NULs included */
            else if (kind == 1)
                buf[i] = text[gpc_rng_below(&rng, (uint32_t)bytes)]; /* text bytes */
            else
                buf[i] = "ab \n\0\xff"[gpc_rng_below(&rng, 6)]; /* long runs, NUL, invalid UTF-8 */
        }
        assert_round_trip(tok, buf, n);
    }
    /* slices of the text, cut anywhere (also inside UTF-8 characters) */
    for (int trial = 0; trial < 200; trial++) {
        size_t at = gpc_rng_below(&rng, (uint32_t)bytes), n = gpc_rng_below(&rng, 3000);
        if (at + n > bytes) n = bytes - at;
        assert_round_trip(tok, text + at, n);
    }
    free(buf);
    free(text);
    gpc_tokenizer_free(tok);
}

static void test_compresses_text(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 12);
    size_t bytes, held_bytes;
    char *text = make_text(&rng, 200000, &bytes);
    char *held_out = make_text(&rng, 50000, &held_bytes);
    gpc_tokenizer *tok = train_on(text, bytes, 1024);
    uint32_t *tokens;
    size_t count;
    TEST_OK(gpc_tokenizer_encode(tok, held_out, held_bytes, &tokens, &count));
    /* measured: 3.50 to 3.52 bytes per token on held-out text of this word
     * list (words become one token with their space; numbers and
     * punctuation cost more); raw bytes would be 1.0 */
    double ratio = (double)held_bytes / (double)count;
    assert_true(ratio > 3.3);
    /* the most frequent words are single tokens, with their leading space */
    uint32_t *one;
    size_t one_count;
    TEST_OK(gpc_tokenizer_encode(tok, " the", 4, &one, &one_count));
    assert_int_equal(one_count, 1);
    size_t len;
    const char *piece = gpc_tokenizer_token_bytes(tok, one[0], &len);
    assert_int_equal(len, 4);
    assert_memory_equal(piece, " the", 4);
    gpc_free(one);
    gpc_free(tokens);
    free(text);
    free(held_out);
    gpc_tokenizer_free(tok);
}

static unsigned char *save_and_read(const gpc_tokenizer *tok, const char *path, size_t *size) {
    TEST_OK(gpc_tokenizer_save(tok, path));
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *data = malloc(*size);
    assert_int_equal(fread(data, 1, *size, f), *size);
    fclose(f);
    return data;
}

static void test_training_is_deterministic(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 13);
    size_t bytes;
    char *text = make_text(&rng, 100000, &bytes);
    char *dir = test_tmpdir("tok-det");
    char a_path[4200], b_path[4200];
    snprintf(a_path, sizeof a_path, "%s/a.bin", dir);
    snprintf(b_path, sizeof b_path, "%s/b.bin", dir);
    gpc_tokenizer *a = train_on(text, bytes, 800), *b = train_on(text, bytes, 800);
    size_t a_size, b_size;
    unsigned char *a_data = save_and_read(a, a_path, &a_size);
    unsigned char *b_data = save_and_read(b, b_path, &b_size);
    assert_int_equal(a_size, b_size);
    assert_memory_equal(a_data, b_data, a_size);
    /* a tokenizer trained on a prefix makes a prefix of the merges: the
     * greedy choice of the first merges does not depend on the vocab size */
    gpc_tokenizer *c = train_on(text, bytes, 500);
    size_t c_size;
    unsigned char *c_data = save_and_read(c, a_path, &c_size);
    assert_memory_equal(c_data + 24, a_data + 24, (500 - 257) * 8);
    free(a_data);
    free(b_data);
    free(c_data);
    gpc_tokenizer_free(a);
    gpc_tokenizer_free(b);
    gpc_tokenizer_free(c);
    test_rmtree(dir);
    gpc_free(dir);
    free(text);
}

/* ---- the naive reference: pre-tokens, then every merge in rank order ---- */

static int isalpha_ascii(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static int ref_class(unsigned char c) {
    if (strchr(" \t\n\v\f\r", c) && c) return 0;
    if (isalpha_ascii(c) || c >= 128) return 1;
    if (c >= '0' && c <= '9') return 2;
    return 3;
}

static size_t ref_pretoken(const unsigned char *s, size_t n) {
    size_t limit = n < 256 ? n : 256, i;
    if (s[0] == ' ' && limit > 1 && ref_class(s[1]) == 1) {
        for (i = 2; i < limit && ref_class(s[i]) == 1; i++) {
        }
        return i;
    }
    for (i = 1; i < limit && ref_class(s[i]) == ref_class(s[0]); i++) {
    }
    if (ref_class(s[0]) == 0 && i > 1 && i < n && s[i - 1] == ' ' && ref_class(s[i]) == 1) i--;
    return i;
}

static uint32_t read_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static size_t naive_encode(const uint32_t *merges, int merge_count, const unsigned char *text,
                           size_t bytes, uint32_t *out) {
    size_t total = 0;
    uint32_t *seq = malloc(256 * sizeof *seq);
    for (size_t at = 0; at < bytes;) {
        size_t n = ref_pretoken(text + at, bytes - at);
        for (size_t i = 0; i < n; i++)
            seq[i] = text[at + i];
        at += n;
        for (int r = 0; r < merge_count; r++) {
            size_t m = 0;
            for (size_t i = 0; i < n;) {
                if (i + 1 < n && seq[i] == merges[2 * r] && seq[i + 1] == merges[2 * r + 1]) {
                    seq[m++] = 256 + (uint32_t)r;
                    i += 2;
                } else {
                    seq[m++] = seq[i++];
                }
            }
            n = m;
        }
        memcpy(out + total, seq, n * sizeof *seq);
        total += n;
    }
    free(seq);
    return total;
}

static void test_encode_matches_naive_merges(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 14);
    size_t bytes;
    char *text = make_text(&rng, 80000, &bytes);
    /* long runs so that pre-tokens are cut at 256 bytes and merges overlap */
    for (size_t i = 1000; i < 1600; i++)
        text[i] = 'a';
    for (size_t i = 3000; i < 3400; i++)
        text[i] = '-';
    for (size_t i = 5000; i < 5300; i++)
        text[i] = (i % 3) ? '7' : '1';
    gpc_tokenizer *tok = train_on(text, bytes, 700);
    char *dir = test_tmpdir("tok-naive");
    char path[4200];
    snprintf(path, sizeof path, "%s/tok.bin", dir);
    size_t size;
    unsigned char *file = save_and_read(tok, path, &size);
    int merge_count = (int)read_u32(file + 16);
    assert_int_equal(merge_count, 700 - 257);
    uint32_t *merges = malloc((size_t)merge_count * 2 * sizeof *merges);
    for (int i = 0; i < 2 * merge_count; i++)
        merges[i] = read_u32(file + 24 + 4 * (size_t)i);
    uint32_t *want = malloc(bytes * sizeof *want);
    const char *samples[] = {text, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "   the the  the\n\n\nof",
                             "1234567890123 -- ,,,, x"};
    size_t sample_bytes[] = {bytes, 35, 20, 23};
    for (int k = 0; k < 4; k++) {
        uint32_t *got;
        size_t count;
        TEST_OK(gpc_tokenizer_encode(tok, samples[k], sample_bytes[k], &got, &count));
        size_t want_count = naive_encode(merges, merge_count, (const unsigned char *)samples[k],
                                         sample_bytes[k], want);
        assert_int_equal(count, want_count);
        assert_memory_equal(got, want, count * sizeof *got);
        gpc_free(got);
    }
    /* random bytes too */
    char buf[3000];
    for (int trial = 0; trial < 20; trial++) {
        for (size_t i = 0; i < sizeof buf; i++)
            buf[i] = trial % 2 ? (char)gpc_rng_below(&rng, 256) : text[gpc_rng_below(&rng, 200)];
        uint32_t *got;
        size_t count;
        TEST_OK(gpc_tokenizer_encode(tok, buf, sizeof buf, &got, &count));
        size_t want_count =
            naive_encode(merges, merge_count, (unsigned char *)buf, sizeof buf, want);
        assert_int_equal(count, want_count);
        assert_memory_equal(got, want, count * sizeof *got);
        gpc_free(got);
    }
    free(merges);
    free(want);
    free(file);
    free(text);
    gpc_tokenizer_free(tok);
    test_rmtree(dir);
    gpc_free(dir);
}

static void test_save_load_round_trip(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 15);
    size_t bytes;
    char *text = make_text(&rng, 50000, &bytes);
    gpc_tokenizer *tok = train_on(text, bytes, 900);
    char *dir = test_tmpdir("tok-file");
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.bin", dir);
    TEST_OK(gpc_tokenizer_save(tok, path));
    gpc_tokenizer *back;
    TEST_OK(gpc_tokenizer_load(&back, path));
    assert_int_equal(gpc_tokenizer_vocab_size(back), 900);
    for (uint32_t id = 0; id < 900; id++) {
        size_t a_len, b_len;
        const char *a = gpc_tokenizer_token_bytes(tok, id, &a_len);
        const char *b = gpc_tokenizer_token_bytes(back, id, &b_len);
        assert_int_equal(a_len, b_len);
        assert_memory_equal(a, b, a_len);
        /* every token but the byte tokens and end-of-text is at least 2 bytes */
        if (id >= 256 && id < 899) assert_true(a_len >= 2);
    }
    size_t eot_len = 99;
    assert_non_null(gpc_tokenizer_token_bytes(back, 899, &eot_len));
    assert_int_equal(eot_len, 0);
    assert_null(gpc_tokenizer_token_bytes(back, 900, NULL));
    uint32_t *a, *b;
    size_t a_count, b_count;
    TEST_OK(gpc_tokenizer_encode(tok, text, bytes, &a, &a_count));
    TEST_OK(gpc_tokenizer_encode(back, text, bytes, &b, &b_count));
    assert_int_equal(a_count, b_count);
    assert_memory_equal(a, b, a_count * sizeof *a);
    gpc_free(a);
    gpc_free(b);
    /* end-of-text decodes to nothing; ids past the vocabulary are an error */
    uint32_t ids[] = {'h', 899, 'i'};
    char *out;
    size_t out_bytes;
    TEST_OK(gpc_tokenizer_decode(back, ids, 3, &out, &out_bytes));
    assert_int_equal(out_bytes, 2);
    assert_string_equal(out, "hi");
    gpc_free(out);
    ids[1] = 900;
    TEST_FAILS(gpc_tokenizer_decode(back, ids, 3, &out, &out_bytes), GPC_ERR_INVALID_ARG,
               "token 900 at position 1 is outside this tokenizer's vocabulary of 900");
    gpc_tokenizer_free(back);
    gpc_tokenizer_free(tok);
    test_rmtree(dir);
    gpc_free(dir);
    free(text);
}

static void write_bytes(const char *path, const unsigned char *data, size_t size) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, size, f), size);
    fclose(f);
}

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void test_bad_files_are_rejected(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 16);
    size_t bytes;
    char *text = make_text(&rng, 20000, &bytes);
    gpc_tokenizer *tok = train_on(text, bytes, 400), *out = NULL;
    char *dir = test_tmpdir("tok-bad");
    char good[4200], bad[4200];
    snprintf(good, sizeof good, "%s/good.bin", dir);
    snprintf(bad, sizeof bad, "%s/bad.bin", dir);
    size_t size;
    unsigned char *data = save_and_read(tok, good, &size);
    assert_int_equal(size, 24 + (400 - 257) * 8 + 4);
    assert_int_equal(read_u32(data + size - 4), gpc_crc32c(0, data, size - 4));
    unsigned char *copy = malloc(size);

    TEST_FAILS(gpc_tokenizer_load(&out, "/nonexistent/tokenizer.bin"), GPC_ERR_IO,
               "cannot open /nonexistent/tokenizer.bin");

    memcpy(copy, data, size);
    memcpy(copy, "GPCSHARD", 8);
    write_bytes(bad, copy, size);
    TEST_FAILS(gpc_tokenizer_load(&out, bad), GPC_ERR_FORMAT, "is not a gpc tokenizer file");
    write_bytes(bad, copy, 3);
    TEST_FAILS(gpc_tokenizer_load(&out, bad), GPC_ERR_FORMAT, "is not a gpc tokenizer file");

    memcpy(copy, data, size);
    put_u32(copy + 8, 3);
    put_u32(copy + size - 4, gpc_crc32c(0, copy, size - 4)); /* a valid file of version 3 */
    write_bytes(bad, copy, size);
    TEST_FAILS(gpc_tokenizer_load(&out, bad), GPC_ERR_FORMAT,
               "is tokenizer format version 3; this gpc reads versions 1 and 2");
    put_u32(copy + 8, 2); /* GPT-2's version: its byte ids are missing */
    put_u32(copy + size - 4, gpc_crc32c(0, copy, size - 4));
    write_bytes(bad, copy, size);
    TEST_FAILS(gpc_tokenizer_load(&out, bad), GPC_ERR_FORMAT, "is corrupt: ");

    size_t cuts[] = {12, 27, size / 2, size - 1};
    for (int k = 0; k < 4; k++) {
        write_bytes(bad, data, cuts[k]);
        TEST_FAILS(gpc_tokenizer_load(&out, bad), GPC_ERR_FORMAT, "is truncated");
        assert_non_null(strstr(gpc_last_error(), bad));
    }

    for (int trial = 0; trial < 20; trial++) {
        memcpy(copy, data, size);
        size_t at = 24 + gpc_rng_below(&rng, (uint32_t)(size - 24));
        copy[at] ^= (unsigned char)(1u << gpc_rng_below(&rng, 8));
        write_bytes(bad, copy, size);
        TEST_FAILS(gpc_tokenizer_load(&out, bad), GPC_ERR_FORMAT, "checksum mismatch");
    }
    /* a damaged vocabulary size in the header is a checksum error, caught
     * before the size is used */
    memcpy(copy, data, size);
    put_u32(copy + 12, read_u32(copy + 12) ^ 0x100);
    write_bytes(bad, copy, size);
    TEST_FAILS(gpc_tokenizer_load(&out, bad), GPC_ERR_FORMAT, "checksum mismatch");
    /* a FIFO is refused at once instead of blocking the read */
    char fifo[4300];
    snprintf(fifo, sizeof fifo, "%s/fifo.bin", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    alarm(20); /* a blocked open fails the test instead of hanging it */
    TEST_FAILS(gpc_tokenizer_load(&out, fifo), GPC_ERR_FORMAT, "is not a regular file");
    alarm(0);
    /* a file with a valid checksum but a merge that uses a later token */
    memcpy(copy, data, size);
    put_u32(copy + 24, 300);
    put_u32(copy + size - 4, gpc_crc32c(0, copy, size - 4));
    write_bytes(bad, copy, size);
    TEST_FAILS(gpc_tokenizer_load(&out, bad), GPC_ERR_FORMAT, "merge 0 uses token 300");
    assert_null(out);

    /* the good file still loads */
    TEST_OK(gpc_tokenizer_load(&out, good));
    gpc_tokenizer_free(out);
    free(copy);
    free(data);
    free(text);
    gpc_tokenizer_free(tok);
    test_rmtree(dir);
    gpc_free(dir);
}

static void test_training_arguments_and_small_corpora(void **state) {
    (void)state;
    gpc_tokenizer *tok = NULL;
    TEST_FAILS(gpc_tokenizer_train(&tok, "abc", 3, 256, NULL, NULL), GPC_ERR_INVALID_ARG,
               "vocabulary size 256 is out of range");
    TEST_FAILS(gpc_tokenizer_train(&tok, "abc", 3, 65537, NULL, NULL), GPC_ERR_INVALID_ARG,
               "use 257 to 65536");
    /* "abab ab" is the pre-tokens "abab" and " ab". (a,b) occurs 3 times:
     * merge 256 = "ab". Then (256,256) in "abab" and (' ',256) in " ab" occur
     * once each: ties go to the smaller pair, so 257 = " ab", 258 = "abab",
     * and no pair is left */
    TEST_OK(gpc_tokenizer_train(&tok, "abab ab", 7, 1000, NULL, NULL));
    assert_int_equal(gpc_tokenizer_vocab_size(tok), 257 + 3); /* ran out of pairs */
    size_t len;
    const char *t = gpc_tokenizer_token_bytes(tok, 256, &len);
    assert_int_equal(len, 2);
    assert_memory_equal(t, "ab", 2);
    t = gpc_tokenizer_token_bytes(tok, 257, &len);
    assert_memory_equal(t, " ab", 3);
    t = gpc_tokenizer_token_bytes(tok, 258, &len);
    assert_memory_equal(t, "abab", 4);
    assert_int_equal(gpc_tokenizer_eot(tok), 259);
    gpc_tokenizer_free(tok);
    /* an empty corpus gives the bytes and end-of-text only */
    TEST_OK(gpc_tokenizer_train(&tok, "", 0, 4096, NULL, NULL));
    assert_int_equal(gpc_tokenizer_vocab_size(tok), 257);
    assert_round_trip(tok, "\0\1xyz", 5);
    gpc_tokenizer_free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_any_bytes),
        cmocka_unit_test(test_compresses_text),
        cmocka_unit_test(test_training_is_deterministic),
        cmocka_unit_test(test_encode_matches_naive_merges),
        cmocka_unit_test(test_save_load_round_trip),
        cmocka_unit_test(test_bad_files_are_rejected),
        cmocka_unit_test(test_training_arguments_and_small_corpora),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
