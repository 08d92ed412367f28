/*
 * tokenizer_gpt2.c: GPT-2's byte-level BPE: its pre-tokenizer, and Hugging
 * Face's vocab.json and merges.txt read into and written from a gpc
 * tokenizer (tokenizer.c does the rest: token table, merges by rank, file).
 *
 * The pre-tokenizer is GPT-2's regex written out by hand (Radford et al.
 * 2019, encoder.py; the same in Hugging Face's ByteLevel pre-tokenizer):
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * Letters and numbers come from unicode_classes.h (generated, see
 * scripts/gen_unicode_classes.py), whitespace is Unicode's White_Space,
 * which is what \s means to the Oniguruma regex the tokenizers library uses
 * (not Python's str.isspace, which adds U+001C..U+001F).
 *
 * In vocab.json and merges.txt a token is written with one printable
 * character per byte (GPT-2's bytes_to_unicode): the printable Latin-1 bytes
 * stand for themselves, the 68 others for U+0100.. in byte order.
 */
#include "gpc/tokenizer.h"

#include "tokenizer_internal.h"
#include "unicode_classes.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ pre-tokens */

enum { CHAR_LETTER, CHAR_NUMBER, CHAR_SPACE, CHAR_OTHER };

static int is_white_space(uint32_t cp) {
    return (cp >= 0x9 && cp <= 0xD) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

static int code_point_class(uint32_t cp) {
    if (is_white_space(cp)) return CHAR_SPACE;
    if (cp < 0x80) {
        if ((cp | 32) >= 'a' && (cp | 32) <= 'z') return CHAR_LETTER;
        return cp >= '0' && cp <= '9' ? CHAR_NUMBER : CHAR_OTHER;
    }
    size_t lo = 0, hi = UNICODE_RANGE_COUNT;
    while (lo < hi) { /* first range whose end is >= cp */
        size_t mid = (lo + hi) / 2;
        if (unicode_ranges[mid].hi < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < UNICODE_RANGE_COUNT && unicode_ranges[lo].lo <= cp)
        return unicode_ranges[lo].cls == 'L' ? CHAR_LETTER : CHAR_NUMBER;
    return CHAR_OTHER;
}

/* The character at s (n > 0 bytes): its class, and its length in bytes. A
 * byte that does not start a valid UTF-8 sequence (overlong forms,
 * surrogates and values past U+10FFFF included) is one character of class
 * other, as U+FFFD is. */
static int next_char(const unsigned char *s, size_t n, size_t *length) {
    unsigned c = s[0];
    uint32_t cp;
    size_t need;
    if (c < 0x80) {
        *length = 1;
        return code_point_class(c);
    } else if (c >= 0xC2 && c <= 0xDF) {
        need = 2, cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3, cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4, cp = c & 0x07;
    } else {
        *length = 1;
        return CHAR_OTHER;
    }
    if (n < need) {
        *length = 1;
        return CHAR_OTHER;
    }
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *length = 1;
            return CHAR_OTHER;
        }
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if ((need == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (need == 4 && (cp < 0x10000 || cp > 0x10FFFF))) {
        *length = 1;
        return CHAR_OTHER;
    }
    *length = need;
    return code_point_class(cp);
}

/* Bytes from s up to the end of the run of characters of class cls. */
static size_t run_of(const unsigned char *s, size_t n, int cls) {
    size_t at = 0, length;
    while (at < n && next_char(s + at, n - at, &length) == cls)
        at += length;
    return at;
}

size_t gpc_gpt2_pretoken_length(const unsigned char *s, size_t n) {
    /* 's|'t|'re|'ve|'m|'ll|'d */
    if (s[0] == '\'' && n >= 2) {
        if (s[1] == 's' || s[1] == 't' || s[1] == 'm' || s[1] == 'd') return 2;
        if (n >= 3 && ((s[1] == 'r' && s[2] == 'e') || (s[1] == 'v' && s[2] == 'e') ||
                       (s[1] == 'l' && s[2] == 'l')))
            return 3;
    }
    size_t first;
    int cls = next_char(s, n, &first);
    /*  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+ : one leading space joins the run */
    if (s[0] == ' ' && n > 1) {
        size_t second;
        int next = next_char(s + 1, n - 1, &second);
        if (next != CHAR_SPACE) return 1 + run_of(s + 1, n - 1, next);
    }
    if (cls != CHAR_SPACE) return run_of(s, n, cls);
    /* \s+(?!\S) | \s+ : a whitespace run leaves its last character to what
     * follows it, unless the run ends the text or is one character long */
    size_t at = first, last = 0, length;
    while (at < n && next_char(s + at, n - at, &length) == CHAR_SPACE) {
        last = at;
        at += length;
    }
    if (at == n || last == 0) return at;
    return last;
}

/* --------------------------------------------------- GPT-2's byte strings */

/* GPT-2's bytes_to_unicode: the character that stands for each byte. */
static void byte_characters(uint32_t cp[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        cp[b] = printable ? (uint32_t)b : 256u + (uint32_t)n++;
    }
}

static size_t put_utf8(char *out, uint32_t cp) { /* cp < 0x800 here */
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* The vocab.json string of bytes (at most 2 bytes of output per byte). */
static char *token_string(const uint32_t chars[256], const char *bytes, size_t length) {
    char *out = malloc(2 * length + 1);
    if (!out) return NULL;
    size_t at = 0;
    for (size_t i = 0; i < length; i++)
        at += put_utf8(out + at, chars[(unsigned char)bytes[i]]);
    out[at] = '\0';
    return out;
}

/* ----------------------------------------------------------- Hugging Face */

static gpc_status vocab_id(json_t *vocab, const char *key, const char *path, uint32_t limit,
                           uint32_t *id) {
    json_t *v = json_object_get(vocab, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) >= (json_int_t)limit)
        return gpc_error(GPC_ERR_FORMAT, "%s has no id below %u for the token '%.40s'", path, limit,
                         key);
    *id = (uint32_t)json_integer_value(v);
    return GPC_OK;
}

static gpc_status parse_merges(json_t *vocab, const char *vocab_path, char *text,
                               const char *merges_path, uint32_t **out, int *count) {
    size_t vocab_size = json_object_size(vocab);
    if (vocab_size < 257 || vocab_size > 65536)
        return gpc_error(GPC_ERR_FORMAT, "%s has %zu tokens; gpc reads 257 to 65536", vocab_path,
                         vocab_size);
    int merge_count = (int)vocab_size - 257;
    uint32_t *merges = malloc(((size_t)merge_count * 2 + 1) * sizeof *merges);
    if (!merges) return gpc_error(GPC_ERR_NOMEM, "out of memory reading %s", merges_path);
    char *line = text, *next;
    int r = 0, line_number = 0;
    gpc_status s = GPC_OK;
    for (; line && *line && s == GPC_OK; line = next) {
        line_number++;
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        size_t len = strlen(line);
        if (len && line[len - 1] == '\r') line[--len] = '\0';
        if (len == 0 || (line_number == 1 && strncmp(line, "#version", 8) == 0)) continue;
        char *space = strchr(line, ' ');
        if (!space || space == line || !space[1] || strchr(space + 1, ' ')) {
            s = gpc_error(GPC_ERR_FORMAT, "%s line %d is not a merge \"A B\"", merges_path,
                          line_number);
            break;
        }
        if (r >= merge_count) {
            s = gpc_error(GPC_ERR_FORMAT,
                          "%s has more merges than %s has tokens for (%d merges for %zu tokens)",
                          merges_path, vocab_path, merge_count, vocab_size);
            break;
        }
        *space = '\0';
        uint32_t result = 256 + (uint32_t)r, a = 0, b = 0, joined = 0;
        s = vocab_id(vocab, line, vocab_path, result, &a);
        if (s == GPC_OK) s = vocab_id(vocab, space + 1, vocab_path, result, &b);
        *space = ' ';
        if (s == GPC_OK) {
            memmove(space, space + 1, strlen(space + 1) + 1); /* "A B" -> "AB" */
            s = vocab_id(vocab, line, vocab_path, (uint32_t)vocab_size, &joined);
            if (s == GPC_OK && joined != result)
                s = gpc_error(GPC_ERR_FORMAT,
                              "%s: merge %d (line %d) makes token %u, not %u; gpc reads GPT-2's "
                              "layout, where merge r makes token 256 + r",
                              merges_path, r, line_number, joined, result);
        }
        merges[2 * (size_t)r] = a;
        merges[2 * (size_t)r + 1] = b;
        r++;
    }
    if (s == GPC_OK && r != merge_count)
        s = gpc_error(GPC_ERR_FORMAT,
                      "%s has %d merges; %s has %zu tokens, which need %d (256 bytes, the merges "
                      "and <|endoftext|>)",
                      merges_path, r, vocab_path, vocab_size, merge_count);
    if (s != GPC_OK) {
        free(merges);
        return s;
    }
    *out = merges;
    *count = merge_count;
    return GPC_OK;
}

gpc_status gpc_tokenizer_load_gpt2(gpc_tokenizer **out, const char *vocab_path,
                                   const char *merges_path) {
    *out = NULL;
    json_error_t err;
    json_t *vocab = json_load_file(vocab_path, JSON_REJECT_DUPLICATES, &err);
    if (!vocab)
        return gpc_error(GPC_ERR_FORMAT, "%s is not valid JSON (%s, line %d)", vocab_path, err.text,
                         err.line);
    gpc_status s = GPC_OK;
    if (!json_is_object(vocab))
        s = gpc_error(GPC_ERR_FORMAT, "%s is not a JSON object of token -> id", vocab_path);
    uint32_t chars[256], byte_token[256];
    byte_characters(chars);
    for (int b = 0; b < 256 && s == GPC_OK; b++) {
        char key[4];
        key[put_utf8(key, chars[b])] = '\0';
        s = vocab_id(vocab, key, vocab_path, 256, &byte_token[b]);
    }
    if (s == GPC_OK) {
        uint32_t eot = 0;
        uint32_t size = (uint32_t)json_object_size(vocab);
        s = vocab_id(vocab, GPC_GPT2_EOT_TEXT, vocab_path, size, &eot);
        if (s == GPC_OK && eot != size - 1)
            s = gpc_error(GPC_ERR_FORMAT, "%s: <|endoftext|> is id %u; gpc needs it last (%u)",
                          vocab_path, eot, size - 1);
    }
    char *text = NULL;
    size_t bytes;
    if (s == GPC_OK) s = gpc_read_file(merges_path, &text, &bytes);
    uint32_t *merges = NULL;
    int merge_count = 0;
    if (s == GPC_OK) {
        if (strlen(text) != bytes)
            s = gpc_error(GPC_ERR_FORMAT, "%s holds a NUL byte: not a merges file", merges_path);
        else
            s = parse_merges(vocab, vocab_path, text, merges_path, &merges, &merge_count);
    }
    gpc_free(text);
    json_decref(vocab);
    if (s != GPC_OK) return s;
    return gpc_tokenizer_build(out, merges, merge_count, byte_token, GPC_TOKENIZER_GPT2,
                               vocab_path);
}

gpc_status gpc_tokenizer_write_gpt2(const gpc_tokenizer *tok, const char *dir) {
    if (gpc_tokenizer_get_kind(tok) != GPC_TOKENIZER_GPT2)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "only GPT-2's tokenizer can be written as vocab.json and merges.txt; "
                         "this one was trained by gpc");
    uint32_t chars[256];
    byte_characters(chars);
    int vocab_size = gpc_tokenizer_vocab_size(tok), merge_count;
    const uint32_t *merges = gpc_tokenizer_merge_list(tok, &merge_count);
    json_t *vocab = json_object();
    char **strings = calloc((size_t)vocab_size, sizeof *strings);
    gpc_status s = vocab && strings ? GPC_OK : gpc_error(GPC_ERR_NOMEM, "out of memory");
    for (int id = 0; id < vocab_size - 1 && s == GPC_OK; id++) {
        size_t length;
        const char *bytes = gpc_tokenizer_token_bytes(tok, (uint32_t)id, &length);
        strings[id] = token_string(chars, bytes, length);
        if (!strings[id] || json_object_set_new(vocab, strings[id], json_integer(id)) != 0)
            s = gpc_error(GPC_ERR_NOMEM, "out of memory writing vocab.json");
    }
    if (s == GPC_OK &&
        json_object_set_new(vocab, GPC_GPT2_EOT_TEXT, json_integer(vocab_size - 1)) != 0)
        s = gpc_error(GPC_ERR_NOMEM, "out of memory writing vocab.json");
    char path[4096];
    if (s == GPC_OK) {
        char *text = json_dumps(vocab, JSON_PRESERVE_ORDER | JSON_COMPACT);
        snprintf(path, sizeof path, "%s/vocab.json", dir);
        s = text ? gpc_write_file(path, text, strlen(text))
                 : gpc_error(GPC_ERR_NOMEM, "out of memory writing vocab.json");
        free(text);
    }
    if (s == GPC_OK) {
        size_t capacity = 64, at = 0;
        for (int r = 0; r < merge_count; r++)
            capacity += strlen(strings[merges[2 * r]]) + strlen(strings[merges[2 * r + 1]]) + 2;
        char *text = malloc(capacity);
        if (!text) {
            s = gpc_error(GPC_ERR_NOMEM, "out of memory writing merges.txt");
        } else {
            at += (size_t)snprintf(text, capacity, "#version: 0.2\n");
            for (int r = 0; r < merge_count; r++)
                at += (size_t)snprintf(text + at, capacity - at, "%s %s\n", strings[merges[2 * r]],
                                       strings[merges[2 * r + 1]]);
            snprintf(path, sizeof path, "%s/merges.txt", dir);
            s = gpc_write_file(path, text, at);
            free(text);
        }
    }
    for (int id = 0; strings && id < vocab_size; id++)
        free(strings[id]);
    free(strings);
    json_decref(vocab);
    return s;
}

gpc_status gpc_tokenizer_load_from(gpc_tokenizer **out, const char *path) {
    *out = NULL;
    if (!gpc_path_is_dir(path)) {
        if (!gpc_path_exists(path))
            return gpc_error(GPC_ERR_IO,
                             "%s does not exist: give a run folder, a Hugging Face "
                             "folder or a tokenizer.bin",
                             path);
        return gpc_tokenizer_load(out, path);
    }
    char bin[4096], vocab[4096], merges[4096];
    snprintf(bin, sizeof bin, "%s/tokenizer.bin", path);
    snprintf(vocab, sizeof vocab, "%s/vocab.json", path);
    snprintf(merges, sizeof merges, "%s/merges.txt", path);
    if (gpc_path_exists(bin)) return gpc_tokenizer_load(out, bin);
    if (gpc_path_exists(vocab) && gpc_path_exists(merges))
        return gpc_tokenizer_load_gpt2(out, vocab, merges);
    return gpc_error(GPC_ERR_IO,
                     "%s has no tokenizer: neither tokenizer.bin (gpc train, gpc import hf) nor "
                     "vocab.json and merges.txt (Hugging Face)",
                     path);
}
