/*
 * tokenizer.c: gpc's byte-level BPE: pre-tokenizing, training merges,
 * encoding, decoding, and the tokenizer file. GPT-2's tokenizer shares the
 * token table, the encoder and the file; its pre-tokenizer and Hugging
 * Face's files are in tokenizer_gpt2.c.
 *
 * Training follows the usual fast recipe (as in Hugging Face tokenizers):
 * the corpus is cut into pre-tokens once and only the unique ones are kept
 * with their counts, so a few megabytes of text become tens of thousands of
 * short words. Pair counts are kept for the whole corpus and updated only
 * for the words that contain the pair being merged (each pair remembers the
 * words it occurs in), and the next merge comes from a max-heap of pair
 * counts with lazy invalidation. A merge never creates a pair of two old
 * tokens, so an old pair's count only falls after it is pushed: a heap entry
 * is an upper bound, and an entry whose count is current is the true maximum.
 * Ties go to the smaller pair (a, b), so training is deterministic.
 *
 * Encoding applies merges by rank within each pre-token: repeatedly merge
 * the adjacent pair of lowest rank. Every merge that uses token z was learned
 * after z itself, so this gives exactly the tokens that applying every merge
 * in order would give (the unit test checks it against that naive encoder).
 * Long pre-tokens keep their pairs in buckets by rank, so that encoding
 * takes time linear in the text's length whatever the text.
 */
#define _GNU_SOURCE /* memmem */
#include "gpc/tokenizer.h"

#include "tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOKENIZER_MAGIC "GPCTOKEN"
#define TOKENIZER_VERSION 1u      /* gpc's */
#define TOKENIZER_VERSION_GPT2 2u /* GPT-2's: the header is followed by 256 byte ids */
#define TOKENIZER_HEADER_BYTES 24 /* magic, version, vocab size, merge count, reserved */
/* gpc's pre-tokenizer cuts longer runs (ASCII art, long numbers, binary
 * data) into pieces of this size; trained tokenizers depend on the cut. */
#define PRETOKEN_MAX 256

struct gpc_tokenizer {
    gpc_tokenizer_kind kind;
    uint32_t byte_token[256]; /* id of each one-byte token */
    int vocab_size;
    int merge_count;
    uint32_t *merges; /* 2 per merge: merge r joins (a, b) into token 256 + r */
    uint32_t *offset; /* vocab_size + 1: token id is pool[offset[id] .. offset[id + 1]) */
    char *pool;
    uint64_t *rank_keys; /* open addressing: pair key -> merge rank */
    uint32_t *rank_values;
    size_t rank_mask;
};

/* ------------------------------------------------------------ pre-tokens */

enum { CLASS_SPACE, CLASS_LETTER, CLASS_DIGIT, CLASS_OTHER };

static inline int byte_class(unsigned char c) {
    if (c == ' ' || (c >= '\t' && c <= '\r')) return CLASS_SPACE;
    /* bytes >= 0x80 are parts of UTF-8 letters in practice; keeping them with
     * letters keeps accented words whole */
    if (((c | 32) >= 'a' && (c | 32) <= 'z') || c >= 0x80) return CLASS_LETTER;
    if (c >= '0' && c <= '9') return CLASS_DIGIT;
    return CLASS_OTHER;
}

/* Length of the pre-token at s (n > 0 bytes left): a run of letters with
 * its leading space, a run of digits, of other symbols, or of whitespace. */
static size_t pretoken_length(const unsigned char *s, size_t n) {
    size_t limit = n < PRETOKEN_MAX ? n : PRETOKEN_MAX;
    int first = byte_class(s[0]);
    size_t i = 1;
    if (s[0] == ' ' && limit > 1 && byte_class(s[1]) == CLASS_LETTER) {
        i = 2;
        while (i < limit && byte_class(s[i]) == CLASS_LETTER)
            i++;
        return i;
    }
    while (i < limit && byte_class(s[i]) == first)
        i++;
    /* leave the last space of a whitespace run to the word after it, as
     * GPT-2 does, so " the" is one pre-token after any indentation */
    if (first == CLASS_SPACE && i > 1 && i < n && s[i - 1] == ' ' &&
        byte_class(s[i]) == CLASS_LETTER)
        i--;
    return i;
}

static uint64_t hash_bytes(const unsigned char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 1099511628211ULL;
    return h ^ (h >> 29);
}

static inline uint64_t pair_key(uint32_t a, uint32_t b) {
    return ((uint64_t)a << 32) | b;
}

static inline size_t hash_key(uint64_t key) {
    key ^= key >> 31;
    key *= 0x9E3779B97F4A7C15ULL;
    return (size_t)(key ^ (key >> 29));
}

/* ------------------------------------------------------ tokenizer object */

static uint32_t rank_lookup(const gpc_tokenizer *tok, uint32_t a, uint32_t b) {
    uint64_t key = pair_key(a, b);
    for (size_t i = hash_key(key) & tok->rank_mask;; i = (i + 1) & tok->rank_mask) {
        if (tok->rank_values[i] == UINT32_MAX) return UINT32_MAX;
        if (tok->rank_keys[i] == key) return tok->rank_values[i];
    }
}

/* Builds the token table and the merge lookup from merges (validated:
 * each merge uses only bytes and earlier merges). Takes ownership of merges. */
gpc_status gpc_tokenizer_build(gpc_tokenizer **out, uint32_t *merges, int merge_count,
                               const uint32_t *byte_token, gpc_tokenizer_kind kind,
                               const char *what) {
    *out = NULL;
    if (byte_token) { /* a permutation of the 256 one-byte ids */
        uint8_t seen[256] = {0};
        for (int b = 0; b < 256; b++) {
            if (byte_token[b] > 255 || seen[byte_token[b]]) {
                free(merges);
                return gpc_error(GPC_ERR_FORMAT,
                                 "%s is corrupt: the byte tokens are not ids 0..255 once each",
                                 what);
            }
            seen[byte_token[b]] = 1;
        }
    }
    gpc_tokenizer *tok = calloc(1, sizeof *tok);
    int vocab = 256 + merge_count + 1;
    /* GPT-2's end of text decodes to its text, as Hugging Face's does */
    size_t eot_length = kind == GPC_TOKENIZER_GPT2 ? strlen(GPC_GPT2_EOT_TEXT) : 0;
    size_t table = 16;
    while (table < (size_t)merge_count * 2)
        table *= 2;
    if (tok) {
        tok->kind = kind;
        for (uint32_t b = 0; b < 256; b++)
            tok->byte_token[b] = byte_token ? byte_token[b] : b;
        tok->vocab_size = vocab;
        tok->merge_count = merge_count;
        tok->merges = merges;
        tok->offset = malloc(((size_t)vocab + 1) * sizeof *tok->offset);
        tok->rank_keys = malloc(table * sizeof *tok->rank_keys);
        tok->rank_values = malloc(table * sizeof *tok->rank_values);
        tok->rank_mask = table - 1;
    }
    if (!tok || !tok->offset || !tok->rank_keys || !tok->rank_values) {
        if (tok) tok->merges = NULL;
        gpc_tokenizer_free(tok);
        free(merges);
        return gpc_error(GPC_ERR_NOMEM, "out of memory building a tokenizer of %d tokens", vocab);
    }
    memset(tok->rank_values, 0xff, table * sizeof *tok->rank_values);
    /* token lengths first, to size the pool */
    size_t total = 0;
    for (uint32_t id = 0; id < 256; id++)
        tok->offset[id] = (uint32_t)id;
    total = 256;
    uint32_t *length = malloc((size_t)vocab * sizeof *length);
    if (!length) {
        gpc_tokenizer_free(tok);
        return gpc_error(GPC_ERR_NOMEM, "out of memory building a tokenizer");
    }
    for (int id = 0; id < 256; id++)
        length[id] = 1;
    for (int r = 0; r < merge_count; r++) {
        uint32_t a = merges[2 * (size_t)r], b = merges[2 * (size_t)r + 1], id = 256 + (uint32_t)r;
        if (a >= id || b >= id) {
            free(length);
            gpc_tokenizer_free(tok);
            return gpc_error(GPC_ERR_FORMAT,
                             "%s is corrupt: merge %d uses token %u, which does not exist yet; "
                             "rerun `gpc data prepare` to write the tokenizer again",
                             what, r, a >= id ? a : b);
        }
        length[id] = length[a] + length[b];
        total += length[id];
        if (total > UINT32_MAX) {
            free(length);
            gpc_tokenizer_free(tok);
            return gpc_error(GPC_ERR_FORMAT, "%s is corrupt: its tokens are impossibly long", what);
        }
    }
    length[vocab - 1] = (uint32_t)eot_length; /* end of text */
    tok->pool = malloc(total + eot_length + 1);
    if (!tok->pool) {
        free(length);
        gpc_tokenizer_free(tok);
        return gpc_error(GPC_ERR_NOMEM, "out of memory building a tokenizer");
    }
    for (int b = 0; b < 256; b++)
        tok->pool[tok->byte_token[b]] = (char)b;
    uint32_t at = 256;
    for (int r = 0; r < merge_count; r++) {
        uint32_t a = merges[2 * (size_t)r], b = merges[2 * (size_t)r + 1], id = 256 + (uint32_t)r;
        tok->offset[id] = at;
        memcpy(tok->pool + at, tok->pool + tok->offset[a], length[a]);
        memcpy(tok->pool + at + length[a], tok->pool + tok->offset[b], length[b]);
        at += length[id];
        uint64_t key = pair_key(a, b);
        size_t i = hash_key(key) & tok->rank_mask;
        while (tok->rank_values[i] != UINT32_MAX && tok->rank_keys[i] != key)
            i = (i + 1) & tok->rank_mask;
        if (tok->rank_values[i] == UINT32_MAX) { /* a repeated pair keeps its first rank */
            tok->rank_keys[i] = key;
            tok->rank_values[i] = (uint32_t)r;
        }
    }
    tok->offset[vocab - 1] = at;
    memcpy(tok->pool + at, GPC_GPT2_EOT_TEXT, eot_length);
    at += (uint32_t)eot_length;
    tok->offset[vocab] = at;
    tok->pool[at] = '\0';
    free(length);
    *out = tok;
    return GPC_OK;
}

void gpc_tokenizer_free(gpc_tokenizer *tok) {
    if (!tok) return;
    free(tok->merges);
    free(tok->offset);
    free(tok->pool);
    free(tok->rank_keys);
    free(tok->rank_values);
    free(tok);
}

gpc_tokenizer_kind gpc_tokenizer_get_kind(const gpc_tokenizer *tok) {
    return tok->kind;
}

const char *gpc_tokenizer_kind_name(gpc_tokenizer_kind kind) {
    return kind == GPC_TOKENIZER_GPT2 ? "gpt2" : "gpc";
}

const uint32_t *gpc_tokenizer_merge_list(const gpc_tokenizer *tok, int *count) {
    *count = tok->merge_count;
    return tok->merges;
}

const uint32_t *gpc_tokenizer_byte_tokens(const gpc_tokenizer *tok) {
    return tok->byte_token;
}

int gpc_tokenizer_vocab_size(const gpc_tokenizer *tok) {
    return tok->vocab_size;
}

int gpc_tokenizer_eot(const gpc_tokenizer *tok) {
    return tok->vocab_size - 1;
}

const char *gpc_tokenizer_token_bytes(const gpc_tokenizer *tok, uint32_t id, size_t *length) {
    if (id >= (uint32_t)tok->vocab_size) {
        if (length) *length = 0;
        return NULL;
    }
    if (length) *length = tok->offset[id + 1] - tok->offset[id];
    return tok->pool + tok->offset[id];
}

/* -------------------------------------------------------------- training */

typedef struct {
    const unsigned char *bytes;
    uint32_t length;
    uint32_t count;
} word_entry;

typedef struct {
    uint32_t a, b;
    int64_t count;
    uint32_t *words; /* words the pair has occurred in (may hold stale entries) */
    uint32_t word_count, word_capacity;
    uint32_t last_word; /* the word appended last, to skip repeats within a word */
    int pushed_at;      /* merge that last queued this pair, to queue it once */
} pair_entry;

typedef struct {
    int64_t count;
    uint32_t pair;
} heap_entry;

typedef struct {
    /* unique words: symbols of word w are symbols[start[w] .. start[w] + length[w]) */
    uint32_t *symbols;
    uint64_t *start;
    uint32_t *length;
    uint32_t *count;
    int *visited; /* merge that last rewrote the word */
    size_t words;
    /* pairs and their lookup */
    pair_entry *pairs;
    size_t pair_count, pair_capacity;
    uint32_t *pair_slots; /* index + 1, 0 = empty */
    size_t slot_mask;
    heap_entry *heap;
    size_t heap_size, heap_capacity;
    uint32_t *fresh; /* pairs created by the current merge */
    size_t fresh_count, fresh_capacity;
    int failed; /* out of memory somewhere */
} trainer;

static int heap_before(const trainer *t, heap_entry x, heap_entry y) {
    if (x.count != y.count) return x.count > y.count;
    const pair_entry *p = &t->pairs[x.pair], *q = &t->pairs[y.pair];
    if (p->a != q->a) return p->a < q->a;
    return p->b < q->b;
}

static void heap_push(trainer *t, int64_t count, uint32_t pair) {
    if (t->heap_size == t->heap_capacity) {
        size_t capacity = t->heap_capacity ? t->heap_capacity * 2 : 1024;
        heap_entry *bigger = realloc(t->heap, capacity * sizeof *bigger);
        if (!bigger) {
            t->failed = 1;
            return;
        }
        t->heap = bigger;
        t->heap_capacity = capacity;
    }
    heap_entry e = {count, pair};
    size_t i = t->heap_size++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!heap_before(t, e, t->heap[parent])) break;
        t->heap[i] = t->heap[parent];
        i = parent;
    }
    t->heap[i] = e;
}

static void fresh_add(trainer *t, uint32_t pair) {
    if (t->fresh_count == t->fresh_capacity) {
        size_t capacity = t->fresh_capacity ? t->fresh_capacity * 2 : 256;
        uint32_t *bigger = realloc(t->fresh, capacity * sizeof *bigger);
        if (!bigger) {
            t->failed = 1;
            return;
        }
        t->fresh = bigger;
        t->fresh_capacity = capacity;
    }
    t->fresh[t->fresh_count++] = pair;
}

static heap_entry heap_pop(trainer *t) {
    heap_entry top = t->heap[0], last = t->heap[--t->heap_size];
    size_t i = 0, n = t->heap_size;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && heap_before(t, t->heap[child + 1], t->heap[child])) child++;
        if (!heap_before(t, t->heap[child], last)) break;
        t->heap[i] = t->heap[child];
        i = child;
    }
    if (n) t->heap[i] = last;
    return top;
}

static int pair_table_grow(trainer *t) {
    size_t slots = t->slot_mask ? (t->slot_mask + 1) * 2 : 1 << 16;
    uint32_t *table = calloc(slots, sizeof *table);
    if (!table) return -1;
    for (size_t p = 0; p < t->pair_count; p++) {
        size_t i = hash_key(pair_key(t->pairs[p].a, t->pairs[p].b)) & (slots - 1);
        while (table[i])
            i = (i + 1) & (slots - 1);
        table[i] = (uint32_t)p + 1;
    }
    free(t->pair_slots);
    t->pair_slots = table;
    t->slot_mask = slots - 1;
    return 0;
}

/* The pair (a, b), created with count 0 when new; UINT32_MAX when out of memory. */
static uint32_t pair_find(trainer *t, uint32_t a, uint32_t b) {
    if ((t->pair_count + 1) * 2 > t->slot_mask + 1 && pair_table_grow(t) != 0) return UINT32_MAX;
    uint64_t key = pair_key(a, b);
    size_t i = hash_key(key) & t->slot_mask;
    while (t->pair_slots[i]) {
        pair_entry *p = &t->pairs[t->pair_slots[i] - 1];
        if (p->a == a && p->b == b) return t->pair_slots[i] - 1;
        i = (i + 1) & t->slot_mask;
    }
    if (t->pair_count == t->pair_capacity) {
        size_t capacity = t->pair_capacity ? t->pair_capacity * 2 : 1 << 15;
        pair_entry *bigger = realloc(t->pairs, capacity * sizeof *bigger);
        if (!bigger) return UINT32_MAX;
        t->pairs = bigger;
        t->pair_capacity = capacity;
    }
    pair_entry *p = &t->pairs[t->pair_count];
    memset(p, 0, sizeof *p);
    p->a = a;
    p->b = b;
    p->last_word = UINT32_MAX;
    p->pushed_at = -1;
    t->pair_slots[i] = (uint32_t)t->pair_count + 1;
    return (uint32_t)t->pair_count++;
}

/* Adds delta occurrences of (a, b); with word != UINT32_MAX also records
 * that the pair occurs in that word. Returns the pair index. */
static uint32_t pair_add(trainer *t, uint32_t a, uint32_t b, int64_t delta, uint32_t word) {
    uint32_t index = pair_find(t, a, b);
    if (index == UINT32_MAX) {
        t->failed = 1;
        return index;
    }
    pair_entry *p = &t->pairs[index];
    p->count += delta;
    if (word != UINT32_MAX && p->last_word != word) {
        if (p->word_count == p->word_capacity) {
            uint32_t capacity = p->word_capacity ? p->word_capacity * 2 : 4;
            uint32_t *bigger = realloc(p->words, capacity * sizeof *bigger);
            if (!bigger) {
                t->failed = 1;
                return index;
            }
            p->words = bigger;
            p->word_capacity = capacity;
        }
        p->words[p->word_count++] = word;
        p->last_word = word;
    }
    return index;
}

static void trainer_free(trainer *t) {
    for (size_t p = 0; p < t->pair_count; p++)
        free(t->pairs[p].words);
    free(t->pairs);
    free(t->pair_slots);
    free(t->heap);
    free(t->fresh);
    free(t->symbols);
    free(t->start);
    free(t->length);
    free(t->count);
    free(t->visited);
}

/* Counts unique pre-tokens of text into entries (first-seen order). */
static gpc_status count_words(const unsigned char *text, size_t bytes, word_entry **out,
                              size_t *out_count) {
    size_t capacity = 1 << 14, count = 0, mask = (1 << 16) - 1;
    word_entry *entries = malloc(capacity * sizeof *entries);
    uint32_t *slots = calloc(mask + 1, sizeof *slots); /* entry index + 1 */
    if (!entries || !slots) goto nomem;
    for (size_t at = 0; at < bytes;) {
        size_t n = pretoken_length(text + at, bytes - at);
        const unsigned char *s = text + at;
        at += n;
        size_t i = hash_bytes(s, n) & mask;
        while (slots[i]) {
            word_entry *e = &entries[slots[i] - 1];
            if (e->length == n && memcmp(e->bytes, s, n) == 0) break;
            i = (i + 1) & mask;
        }
        if (slots[i]) {
            entries[slots[i] - 1].count++;
            continue;
        }
        if (count == capacity) {
            word_entry *bigger = realloc(entries, capacity * 2 * sizeof *bigger);
            if (!bigger) goto nomem;
            entries = bigger;
            capacity *= 2;
        }
        entries[count] = (word_entry){s, (uint32_t)n, 1};
        slots[i] = (uint32_t)++count;
        if (count * 2 > mask + 1) { /* keep the table at most half full */
            size_t new_mask = mask * 2 + 1;
            uint32_t *bigger = calloc(new_mask + 1, sizeof *bigger);
            if (!bigger) goto nomem;
            for (size_t w = 0; w < count; w++) {
                size_t j = hash_bytes(entries[w].bytes, entries[w].length) & new_mask;
                while (bigger[j])
                    j = (j + 1) & new_mask;
                bigger[j] = (uint32_t)w + 1;
            }
            free(slots);
            slots = bigger;
            mask = new_mask;
        }
    }
    free(slots);
    *out = entries;
    *out_count = count;
    return GPC_OK;
nomem:
    free(entries);
    free(slots);
    return gpc_error(GPC_ERR_NOMEM, "out of memory counting the words of a %zu-byte corpus", bytes);
}

/* Rewrites every word that holds pair (a, b) with token z and updates the
 * pair counts; pairs that gained occurrences (all contain z) are queued. */
static void apply_merge(trainer *t, uint32_t pair, uint32_t z, int merge) {
    uint32_t a = t->pairs[pair].a, b = t->pairs[pair].b;
    /* this list is not appended to while we walk it: new pairs contain z */
    const uint32_t *words = t->pairs[pair].words;
    uint32_t word_count = t->pairs[pair].word_count;
    for (uint32_t k = 0; k < word_count; k++) {
        uint32_t w = words[k];
        if (t->visited[w] == merge) continue;
        t->visited[w] = merge;
        uint32_t *s = t->symbols + t->start[w];
        uint32_t n = t->length[w], found = 0;
        for (uint32_t i = 0; i + 1 < n && !found; i++)
            found = s[i] == a && s[i + 1] == b;
        if (!found) continue; /* a stale entry: an earlier merge took the pair away */
        int64_t c = t->count[w];
        for (uint32_t i = 0; i + 1 < n; i++)
            pair_add(t, s[i], s[i + 1], -c, UINT32_MAX);
        uint32_t m = 0;
        for (uint32_t i = 0; i < n;) {
            if (i + 1 < n && s[i] == a && s[i + 1] == b) {
                s[m++] = z;
                i += 2;
            } else {
                s[m++] = s[i++];
            }
        }
        t->length[w] = m;
        for (uint32_t i = 0; i + 1 < m; i++) {
            int fresh = s[i] == z || s[i + 1] == z;
            uint32_t p = pair_add(t, s[i], s[i + 1], c, fresh ? w : UINT32_MAX);
            if (fresh && p != UINT32_MAX && t->pairs[p].pushed_at != merge) {
                t->pairs[p].pushed_at = merge;
                fresh_add(t, p);
            }
        }
    }
    /* queued once each, with the count after every word is rewritten */
    for (size_t i = 0; i < t->fresh_count; i++)
        if (t->pairs[t->fresh[i]].count > 0) heap_push(t, t->pairs[t->fresh[i]].count, t->fresh[i]);
    t->fresh_count = 0;
}

gpc_status gpc_tokenizer_train(gpc_tokenizer **out, const char *text, size_t bytes, int vocab_size,
                               gpc_tokenizer_progress progress, void *user) {
    *out = NULL;
    if (vocab_size < 257 || vocab_size > 65536)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "vocabulary size %d is out of range: use 257 to 65536 (256 bytes, the "
                         "merges, and the end-of-text token)",
                         vocab_size);
    if (bytes > 0 && !text) return gpc_error(GPC_ERR_INVALID_ARG, "no text to train on");
    int merges_wanted = vocab_size - 257;
    uint32_t *merges = malloc(((size_t)merges_wanted + 1) * 2 * sizeof *merges);
    word_entry *entries = NULL;
    size_t unique = 0;
    trainer t;
    memset(&t, 0, sizeof t);
    if (!merges) return gpc_error(GPC_ERR_NOMEM, "out of memory training a tokenizer");
    gpc_status s = count_words((const unsigned char *)text, bytes, &entries, &unique);
    if (s != GPC_OK) {
        free(merges);
        return s;
    }
    /* words of one byte hold no pair and are dropped */
    size_t total_symbols = 0;
    for (size_t w = 0; w < unique; w++)
        if (entries[w].length > 1) {
            total_symbols += entries[w].length;
            t.words++;
        }
    t.symbols = malloc((total_symbols + 1) * sizeof *t.symbols);
    t.start = malloc((t.words + 1) * sizeof *t.start);
    t.length = malloc((t.words + 1) * sizeof *t.length);
    t.count = malloc((t.words + 1) * sizeof *t.count);
    t.visited = malloc((t.words + 1) * sizeof *t.visited);
    if (!t.symbols || !t.start || !t.length || !t.count || !t.visited) t.failed = 1;
    size_t w = 0, at = 0;
    for (size_t e = 0; e < unique && !t.failed; e++) {
        if (entries[e].length < 2) continue;
        t.start[w] = at;
        t.length[w] = entries[e].length;
        t.count[w] = entries[e].count;
        t.visited[w] = -1;
        for (uint32_t i = 0; i < entries[e].length; i++)
            t.symbols[at++] = entries[e].bytes[i];
        for (uint32_t i = 0; i + 1 < entries[e].length; i++)
            pair_add(&t, entries[e].bytes[i], entries[e].bytes[i + 1], entries[e].count,
                     (uint32_t)w);
        w++;
    }
    free(entries);
    for (size_t p = 0; p < t.pair_count && !t.failed; p++)
        heap_push(&t, t.pairs[p].count, (uint32_t)p);

    int done = 0;
    while (done < merges_wanted && !t.failed && t.heap_size > 0) {
        heap_entry top = heap_pop(&t);
        int64_t current = t.pairs[top.pair].count;
        if (current <= 0) continue;
        if (current != top.count) { /* stale: requeue with the true count */
            heap_push(&t, current, top.pair);
            continue;
        }
        uint32_t z = 256 + (uint32_t)done;
        merges[2 * (size_t)done] = t.pairs[top.pair].a;
        merges[2 * (size_t)done + 1] = t.pairs[top.pair].b;
        apply_merge(&t, top.pair, z, done);
        done++;
        if (progress && (done % 64 == 0 || done == merges_wanted))
            progress(user, done, merges_wanted);
    }
    int failed = t.failed;
    trainer_free(&t);
    if (failed) {
        free(merges);
        return gpc_error(GPC_ERR_NOMEM, "out of memory training a tokenizer on %zu bytes", bytes);
    }
    /* a small corpus can run out of pairs before the vocabulary is full: the
     * tokenizer is then smaller, and the dataset records its real size */
    if (progress && done < merges_wanted) progress(user, done, done);
    return gpc_tokenizer_build(out, merges, done, NULL, GPC_TOKENIZER_GPC, "the trained tokenizer");
}

/* -------------------------------------------------------------- encoding */

/* Merging within a pre-token: every occurrence of the lowest-rank pair,
 * left to right, again and again. A pre-token of up to RESCAN_MAX bytes
 * (most words) is rescanned for each rank, which costs least there; a
 * longer one keeps its pairs in buckets by rank, in time linear in its
 * length where rescanning is quadratic (GPT-2's pre-tokens have no length
 * limit: a megabyte of random letters is one). */
#define RESCAN_MAX 16
#define NO_PAIR UINT32_MAX

/* Symbols live at the position of their first byte, linked by next and
 * prev. The pair that starts at symbol i has rank[i] (NO_PAIR: none) and
 * sits in that rank's bucket, a list linked by bucket_next and
 * bucket_prev. A two-level bitmap of the ranks whose bucket is not empty
 * finds the lowest rank in a few word reads. */
typedef struct {
    uint32_t *next, *prev, *rank, *bucket_next, *bucket_prev; /* per symbol */
    size_t capacity;                                          /* symbols */
    void *symbol_block;     /* the symbol arrays' allocation, NULL while on the stack */
    uint32_t *bucket_first; /* per rank, read only while the rank's bit is set; NULL until needed */
    uint64_t *bits, *summary; /* bit r: rank r's bucket holds a pair; bit w: bits[w] is not 0 */
    size_t summary_words;
    uint32_t small[5 * PRETOKEN_MAX]; /* the symbol arrays for up to PRETOKEN_MAX bytes */
} merge_scratch;

static void scratch_place(merge_scratch *w, uint32_t *base, size_t capacity) {
    w->next = base;
    w->prev = base + capacity;
    w->rank = base + 2 * capacity;
    w->bucket_next = base + 3 * capacity;
    w->bucket_prev = base + 4 * capacity;
    w->capacity = capacity;
}

static void scratch_init(merge_scratch *w) {
    w->symbol_block = NULL;
    w->bucket_first = NULL;
    w->bits = w->summary = NULL;
    w->summary_words = 0;
    scratch_place(w, w->small, PRETOKEN_MAX);
}

static void scratch_free(merge_scratch *w) {
    free(w->symbol_block);
    free(w->bucket_first);
    free(w->bits);
}

/* Makes room for a pre-token of n bytes. The per-rank arrays (GPT-2 has
 * 50000 ranks) are made for the first long pre-token only; the bitmap
 * starts empty, and every pre-token leaves it empty. */
static gpc_status scratch_reserve(merge_scratch *w, const gpc_tokenizer *tok, size_t n) {
    if (n >= UINT32_MAX)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "the text holds a piece of %zu bytes without a break; gpc encodes pieces "
                         "of less than 4 GiB: split the text",
                         n);
    if (n > w->capacity) {
        size_t capacity = n > 2 * w->capacity ? n : 2 * w->capacity;
        uint32_t *block = malloc(5 * capacity * sizeof *block);
        if (!block) return gpc_error(GPC_ERR_NOMEM, "out of memory encoding a %zu-byte piece", n);
        free(w->symbol_block);
        w->symbol_block = block;
        scratch_place(w, block, capacity);
    }
    if (n > RESCAN_MAX && !w->bucket_first) {
        size_t words = ((size_t)tok->merge_count + 63) / 64;
        w->summary_words = (words + 63) / 64;
        w->bucket_first = malloc(((size_t)tok->merge_count + 1) * sizeof *w->bucket_first);
        w->bits = calloc(words + w->summary_words + 1, sizeof *w->bits); /* + 1: never 0 */
        w->summary = w->bits ? w->bits + words : NULL;
        if (!w->bucket_first || !w->bits)
            return gpc_error(GPC_ERR_NOMEM, "out of memory encoding a %zu-byte piece", n);
    }
    return GPC_OK;
}

/* The short way: ranks is scratch of n entries, ranks[i] the rank of the
 * pair (out[i], out[i + 1]). Returns the count. */
static size_t merge_by_rescan(const gpc_tokenizer *tok, uint32_t *out, size_t n, uint32_t *ranks) {
    for (size_t i = 0; i + 1 < n; i++)
        ranks[i] = rank_lookup(tok, out[i], out[i + 1]);
    for (;;) {
        uint32_t best = NO_PAIR;
        for (size_t i = 0; i + 1 < n; i++)
            if (ranks[i] < best) best = ranks[i];
        if (best == NO_PAIR) return n;
        uint32_t z = 256 + best;
        size_t m = 0;
        for (size_t i = 0; i < n;) {
            if (i + 1 < n && ranks[i] == best) {
                out[m++] = z;
                i += 2;
            } else {
                out[m++] = out[i++];
            }
        }
        n = m;
        for (size_t i = 0; i + 1 < n; i++)
            ranks[i] = rank_lookup(tok, out[i], out[i + 1]);
    }
}

/* Takes symbol i's pair out of its bucket. */
static void bucket_remove(merge_scratch *w, uint32_t i) {
    uint32_t r = w->rank[i];
    if (r == NO_PAIR) return;
    uint32_t after = w->bucket_next[i], before = w->bucket_prev[i];
    if (after != NO_PAIR) w->bucket_prev[after] = before;
    if (before != NO_PAIR) {
        w->bucket_next[before] = after;
    } else if (after != NO_PAIR) {
        w->bucket_first[r] = after;
    } else { /* the bucket is empty now */
        w->bits[r / 64] &= ~(1ull << (r % 64));
        if (!w->bits[r / 64]) w->summary[r / 4096] &= ~(1ull << (r / 64 % 64));
    }
    w->rank[i] = NO_PAIR;
}

/* Puts symbol i's pair, of rank r, into its bucket. */
static void bucket_insert(merge_scratch *w, uint32_t i, uint32_t r) {
    w->rank[i] = r;
    if (r == NO_PAIR) return;
    w->bucket_prev[i] = NO_PAIR;
    if (w->bits[r / 64] & (1ull << (r % 64))) {
        w->bucket_next[i] = w->bucket_first[r];
        w->bucket_prev[w->bucket_first[r]] = i;
    } else {
        w->bucket_next[i] = NO_PAIR;
        w->bits[r / 64] |= 1ull << (r % 64);
        w->summary[r / 4096] |= 1ull << (r / 64 % 64);
    }
    w->bucket_first[r] = i;
}

/* The lowest rank that has a pair; NO_PAIR when none is left. */
static uint32_t lowest_rank(const merge_scratch *w) {
    for (size_t s = 0; s < w->summary_words; s++)
        if (w->summary[s]) {
            size_t word = s * 64 + (size_t)__builtin_ctzll(w->summary[s]);
            return (uint32_t)(word * 64 + (size_t)__builtin_ctzll(w->bits[word]));
        }
    return NO_PAIR;
}

/* Symbol i's pair again, after i or the symbol after it changed. */
static void pair_update(const gpc_tokenizer *tok, const uint32_t *out, merge_scratch *w, uint32_t i,
                        uint32_t count) {
    bucket_remove(w, i);
    uint32_t j = w->next[i];
    bucket_insert(w, i, j < count ? rank_lookup(tok, out[i], out[j]) : NO_PAIR);
}

/* The long way, in time linear in n (< UINT32_MAX, at most w's capacity).
 * Pairs of one rank are all the same pair (a, b). When a != b its
 * occurrences cannot overlap, so their order does not matter; when a == b
 * they form runs, each merged here from its left end, as rescanning does.
 * A merge makes token 256 + r, whose pairs have higher ranks (the merges
 * were checked to use only earlier tokens), so rank r's bucket only
 * empties while it is worked on, and each merge costs a few steps.
 * Returns the count. */
static size_t merge_by_buckets(const gpc_tokenizer *tok, uint32_t *out, size_t n,
                               merge_scratch *w) {
    uint32_t count = (uint32_t)n, *next = w->next, *prev = w->prev, *rank = w->rank;
    for (uint32_t i = 0; i < count; i++) {
        next[i] = i + 1;
        prev[i] = i - 1; /* NO_PAIR for the first */
        bucket_insert(w, i, i + 1 < count ? rank_lookup(tok, out[i], out[i + 1]) : NO_PAIR);
    }
    for (uint32_t r = lowest_rank(w); r != NO_PAIR; r = lowest_rank(w)) {
        while (w->bits[r / 64] & (1ull << (r % 64))) {
            uint32_t start = w->bucket_first[r];
            while (prev[start] != NO_PAIR && rank[prev[start]] == r)
                start = prev[start];
            uint32_t k = start;
            do { /* (a b) here, and again right after it: one run */
                uint32_t j = next[k];
                bucket_remove(w, k);
                bucket_remove(w, j);
                out[k] = 256 + r;
                next[k] = next[j];
                if (next[k] < count) prev[next[k]] = k;
                k = next[k];
            } while (k < count && rank[k] == r);
            for (uint32_t i = start; i != k; i = next[i])
                pair_update(tok, out, w, i, count);
            if (prev[start] != NO_PAIR) pair_update(tok, out, w, prev[start], count);
        }
    }
    size_t m = 0;
    for (uint32_t i = 0; i < count; i = next[i])
        out[m++] = out[i];
    return m;
}

/* Encodes one pre-token of n bytes into out, adding its token count to
 * *used. */
static gpc_status encode_pretoken(const gpc_tokenizer *tok, const unsigned char *s, size_t n,
                                  uint32_t *out, merge_scratch *w, size_t *used) {
    GPC_TRY(scratch_reserve(w, tok, n));
    for (size_t i = 0; i < n; i++)
        out[i] = tok->byte_token[s[i]];
    if (n >= 2 && tok->merge_count > 0)
        n = n <= RESCAN_MAX ? merge_by_rescan(tok, out, n, w->rank)
                            : merge_by_buckets(tok, out, n, w);
    *used += n;
    return GPC_OK;
}

/* GPT-2: <|endoftext|> in the text is the end-of-text token; the text
 * between is cut by GPT-2's pre-tokenizer, whose pieces have no length
 * limit (the merge loop's scratch grows for the long ones). */
static gpc_status encode_gpt2(const gpc_tokenizer *tok, const unsigned char *s, size_t bytes,
                              uint32_t *out, size_t *used, merge_scratch *w) {
    const size_t eot_length = strlen(GPC_GPT2_EOT_TEXT);
    for (size_t at = 0; at < bytes;) {
        const unsigned char *eot = memmem(s + at, bytes - at, GPC_GPT2_EOT_TEXT, eot_length);
        size_t end = eot ? (size_t)(eot - s) : bytes;
        while (at < end) {
            size_t n = gpc_gpt2_pretoken_length(s + at, end - at);
            GPC_TRY(encode_pretoken(tok, s + at, n, out + *used, w, used));
            at += n;
        }
        if (eot) {
            out[(*used)++] = (uint32_t)tok->vocab_size - 1;
            at = end + eot_length;
        }
    }
    return GPC_OK;
}

gpc_status gpc_tokenizer_encode(const gpc_tokenizer *tok, const char *text, size_t bytes,
                                uint32_t **tokens, size_t *count) {
    *tokens = NULL;
    *count = 0;
    /* a pre-token never yields more tokens than bytes */
    uint32_t *out = gpc_malloc((bytes ? bytes : 1) * sizeof *out);
    if (!out) return gpc_error(GPC_ERR_NOMEM, "out of memory encoding %zu bytes", bytes);
    const unsigned char *s = (const unsigned char *)text;
    size_t used = 0;
    merge_scratch w;
    scratch_init(&w);
    gpc_status st = GPC_OK;
    if (tok->kind == GPC_TOKENIZER_GPT2) {
        st = encode_gpt2(tok, s, bytes, out, &used, &w);
    } else {
        for (size_t at = 0; at < bytes && st == GPC_OK;) {
            size_t n = pretoken_length(s + at, bytes - at);
            st = encode_pretoken(tok, s + at, n, out + used, &w, &used);
            at += n;
        }
    }
    scratch_free(&w);
    if (st != GPC_OK) {
        gpc_free(out);
        return st;
    }
    *tokens = out;
    *count = used;
    return GPC_OK;
}

gpc_status gpc_tokenizer_decode(const gpc_tokenizer *tok, const uint32_t *tokens, size_t count,
                                char **text, size_t *bytes) {
    *text = NULL;
    if (bytes) *bytes = 0;
    size_t total = 0;
    for (size_t i = 0; i < count; i++) {
        if (tokens[i] >= (uint32_t)tok->vocab_size)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "token %u at position %zu is outside this tokenizer's vocabulary "
                             "of %d; the tokens come from another model or dataset",
                             tokens[i], i, tok->vocab_size);
        total += tok->offset[tokens[i] + 1] - tok->offset[tokens[i]];
    }
    char *out = gpc_malloc(total + 1);
    if (!out) return gpc_error(GPC_ERR_NOMEM, "out of memory decoding %zu tokens", count);
    size_t at = 0;
    for (size_t i = 0; i < count; i++) {
        uint32_t n = tok->offset[tokens[i] + 1] - tok->offset[tokens[i]];
        memcpy(out + at, tok->pool + tok->offset[tokens[i]], n);
        at += n;
    }
    out[at] = '\0';
    *text = out;
    if (bytes) *bytes = at;
    return GPC_OK;
}

/* ------------------------------------------------------------------ file */

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Layout (little-endian): "GPCTOKEN", u32 version, u32 vocab size, u32
 * merge count, u32 reserved, merge_count pairs of u32 (a, b), then the
 * CRC-32C of everything before it. */
gpc_status gpc_tokenizer_save(const gpc_tokenizer *tok, const char *path) {
    int gpt2 = tok->kind == GPC_TOKENIZER_GPT2;
    size_t bytes_table = gpt2 ? 256 * 4 : 0;
    size_t size = TOKENIZER_HEADER_BYTES + bytes_table + (size_t)tok->merge_count * 8;
    unsigned char *buf = malloc(size);
    if (!buf) return gpc_error(GPC_ERR_NOMEM, "out of memory saving the tokenizer to %s", path);
    memcpy(buf, TOKENIZER_MAGIC, 8);
    put_u32(buf + 8, gpt2 ? TOKENIZER_VERSION_GPT2 : TOKENIZER_VERSION);
    put_u32(buf + 12, (uint32_t)tok->vocab_size);
    put_u32(buf + 16, (uint32_t)tok->merge_count);
    put_u32(buf + 20, 0);
    for (int b = 0; gpt2 && b < 256; b++)
        put_u32(buf + TOKENIZER_HEADER_BYTES + 4 * (size_t)b, tok->byte_token[b]);
    for (int r = 0; r < 2 * tok->merge_count; r++)
        put_u32(buf + TOKENIZER_HEADER_BYTES + bytes_table + 4 * (size_t)r, tok->merges[r]);
    unsigned char crc[4];
    put_u32(crc, gpc_crc32c(0, buf, size));
    gpc_atomic_file f;
    gpc_status s = gpc_atomic_open(&f, path);
    if (s == GPC_OK) s = gpc_atomic_write(&f, buf, size);
    if (s == GPC_OK) s = gpc_atomic_write(&f, crc, 4);
    if (s == GPC_OK)
        s = gpc_atomic_commit(&f);
    else
        gpc_atomic_abort(&f);
    free(buf);
    return s == GPC_OK ? s : gpc_error_context(s, "saving the tokenizer: ");
}

gpc_status gpc_tokenizer_load(gpc_tokenizer **out, const char *path) {
    *out = NULL;
    char *data;
    size_t size;
    void *check; /* a FIFO or device would block the read below */
    GPC_TRY(gpc_open_regular(path, "tokenizer", &check));
    fclose(check);
    GPC_TRY(gpc_read_file(path, &data, &size));
    const unsigned char *p = (const unsigned char *)data;
    gpc_status s = GPC_OK;
    const char *redo = "rerun `gpc data prepare` to write it again";
    if (size < 8 || memcmp(p, TOKENIZER_MAGIC, 8) != 0) {
        s = gpc_error(GPC_ERR_FORMAT,
                      "%s is not a gpc tokenizer file (wrong magic); give the tokenizer.bin "
                      "that `gpc data prepare` writes",
                      path);
    } else if (size < TOKENIZER_HEADER_BYTES + 4) {
        s = gpc_error(GPC_ERR_FORMAT, "%s is truncated (%zu bytes, the header alone is %d); %s",
                      path, size, TOKENIZER_HEADER_BYTES + 4, redo);
    } else if (get_u32(p + 8) != TOKENIZER_VERSION && get_u32(p + 8) != TOKENIZER_VERSION_GPT2) {
        s = gpc_error(GPC_ERR_FORMAT,
                      "%s is tokenizer format version %u; this gpc reads versions %u and %u: use "
                      "the gpc that wrote it, or %s",
                      path, get_u32(p + 8), TOKENIZER_VERSION, TOKENIZER_VERSION_GPT2, redo);
    } else {
        /* the checksum first: the header's fields are used only once it holds
         * (its sizes, before, only to say that a file is truncated) */
        int gpt2 = get_u32(p + 8) == TOKENIZER_VERSION_GPT2;
        size_t bytes_table = gpt2 ? 256 * 4 : 0;
        uint32_t vocab = get_u32(p + 12), merges = get_u32(p + 16);
        size_t want = TOKENIZER_HEADER_BYTES + bytes_table + (size_t)merges * 8 + 4;
        if (gpc_crc32c(0, p, size - 4) != get_u32(p + size - 4))
            s = size < want ? gpc_error(GPC_ERR_FORMAT,
                                        "%s is truncated (%zu bytes, expected %zu for %u tokens); "
                                        "%s",
                                        path, size, want, vocab, redo)
                            : gpc_error(GPC_ERR_FORMAT, "%s is corrupt (checksum mismatch); %s",
                                        path, redo);
        else if (vocab < 257 || vocab > 65536 || merges != vocab - 257)
            s = gpc_error(GPC_ERR_FORMAT,
                          "%s is corrupt: vocabulary size %u with %u merges is impossible; %s",
                          path, vocab, merges, redo);
        else if (size != want)
            s = gpc_error(GPC_ERR_FORMAT,
                          "%s is corrupt: %zu bytes, expected %zu for %u tokens; %s", path, size,
                          want, vocab, redo);
        else {
            uint32_t *list = malloc(((size_t)merges * 2 + 1) * sizeof *list);
            if (!list) {
                s = gpc_error(GPC_ERR_NOMEM, "out of memory loading %s", path);
            } else {
                uint32_t byte_token[256];
                for (int b = 0; gpt2 && b < 256; b++)
                    byte_token[b] = get_u32(p + TOKENIZER_HEADER_BYTES + 4 * (size_t)b);
                for (size_t i = 0; i < (size_t)merges * 2; i++)
                    list[i] = get_u32(p + TOKENIZER_HEADER_BYTES + bytes_table + 4 * i);
                s = gpc_tokenizer_build(out, list, (int)merges, gpt2 ? byte_token : NULL,
                                        gpt2 ? GPC_TOKENIZER_GPT2 : GPC_TOKENIZER_GPC, path);
            }
        }
    }
    gpc_free(data);
    return s;
}
