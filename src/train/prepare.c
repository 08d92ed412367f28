/*
 * prepare.c: making datasets: `gpc data prepare` (text files to a
 * tokenizer and token shards) and `gpc data synth` (random tokens).
 *
 * prepare reads every file under its inputs in sorted order (so the same
 * inputs give the same dataset), skips binary files (a NUL byte in the first
 * 8 KiB: fortune's .dat indexes, images), and cuts the text into documents:
 * each file is one, and a line holding only "%" separates documents within
 * a file (the fortune format). It trains the tokenizer on all the text,
 * encodes each document followed by the end-of-text token, and sends every
 * k-th document to the validation split (document i goes there when
 * floor((i+1) f) > floor(i f), which spreads a fraction f evenly over the
 * corpus, whose files are grouped by topic). Splitting by document, not by
 * token, keeps one fortune from being half in each split.
 *
 * Files land in the folder in dependency order, dataset.txt last, so a
 * folder with a dataset.txt is complete.
 */
#include "gpc/tokenizer.h"
#include "train/data_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BINARY_PROBE_BYTES 8192

void gpc_prepare_options_init(gpc_prepare_options *o) {
    memset(o, 0, sizeof *o);
    o->vocab_size = 4096;
    o->val_fraction = 0.05;
    o->shard_tokens = (uint64_t)1 << 24;
}

/* ------------------------------------------------------------- progress */

typedef struct {
    const gpc_prepare_options *options;
    double last_print;
    const char *last_stage;
} progress_state;

static void progress(progress_state *p, const char *stage, uint64_t done, uint64_t total) {
    if (p->options->progress) {
        p->options->progress(p->options->progress_user, stage, done, total);
        return;
    }
    if (!p->options->verbose) return;
    double now = gpc_time_seconds();
    int finished = done == total;
    if (!finished && p->last_stage == stage && now - p->last_print < 2.0) return;
    p->last_print = now;
    p->last_stage = stage;
    fprintf(stderr, "gpc data: %s %llu/%llu\n", stage, (unsigned long long)done,
            (unsigned long long)total);
}

static void tokenizer_progress(void *user, int done, int total) {
    progress(user, "training", (uint64_t)done, (uint64_t)total);
}

/* ------------------------------------------------------- finding files */

typedef struct {
    char *path;
    dev_t dev;
    ino_t ino;
    size_t seq;
} file_entry;

typedef struct {
    file_entry *items;
    size_t count, capacity;
    dev_t out_dev; /* the output folder, never read as input */
    ino_t out_ino;
    int depth;
} file_list;

static char *join_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t at = a;
    if (a && dir[a - 1] != '/') p[at++] = '/';
    memcpy(p + at, name, b + 1);
    return p;
}

static int compare_names(const void *x, const void *y) {
    return strcmp(*(char *const *)x, *(char *const *)y);
}

static gpc_status collect(file_list *list, const char *path, int explicit_input) {
    struct stat st;
    if (stat(path, &st) != 0) {
        if (explicit_input)
            return gpc_error(GPC_ERR_IO, "input %s: %s; give existing files or folders to --input",
                             path, strerror(errno));
        return GPC_OK; /* a dangling link inside a folder */
    }
    if (S_ISDIR(st.st_mode)) {
        if (st.st_dev == list->out_dev && st.st_ino == list->out_ino) return GPC_OK;
        if (list->depth > 64) return GPC_OK; /* a link loop */
        DIR *d = opendir(path);
        if (!d) return gpc_error(GPC_ERR_IO, "cannot read folder %s: %s", path, strerror(errno));
        char **names = NULL;
        size_t n = 0, capacity = 0;
        struct dirent *e;
        gpc_status s = GPC_OK;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.') continue; /* ., .., and hidden files such as .git */
            if (n == capacity) {
                capacity = capacity ? capacity * 2 : 64;
                char **bigger = realloc(names, capacity * sizeof *bigger);
                if (!bigger) {
                    s = gpc_error(GPC_ERR_NOMEM, "out of memory listing %s", path);
                    break;
                }
                names = bigger;
            }
            names[n] = join_path(path, e->d_name);
            if (!names[n]) {
                s = gpc_error(GPC_ERR_NOMEM, "out of memory listing %s", path);
                break;
            }
            n++;
        }
        closedir(d);
        if (n) qsort(names, n, sizeof *names, compare_names);
        list->depth++;
        for (size_t i = 0; i < n; i++) {
            if (s == GPC_OK) s = collect(list, names[i], 0);
            free(names[i]);
        }
        list->depth--;
        free(names);
        return s;
    }
    if (!S_ISREG(st.st_mode)) {
        if (explicit_input)
            return gpc_error(GPC_ERR_IO, "input %s is neither a file nor a folder", path);
        return GPC_OK;
    }
    if (list->count == list->capacity) {
        size_t capacity = list->capacity ? list->capacity * 2 : 256;
        file_entry *bigger = realloc(list->items, capacity * sizeof *bigger);
        if (!bigger) return gpc_error(GPC_ERR_NOMEM, "out of memory listing the inputs");
        list->items = bigger;
        list->capacity = capacity;
    }
    char *copy = strdup(path);
    if (!copy) return gpc_error(GPC_ERR_NOMEM, "out of memory listing the inputs");
    file_entry *e = &list->items[list->count];
    e->path = copy;
    e->dev = st.st_dev;
    e->ino = st.st_ino;
    e->seq = list->count++;
    return GPC_OK;
}

static int compare_inode(const void *x, const void *y) {
    const file_entry *a = x, *b = y;
    if (a->dev != b->dev) return a->dev < b->dev ? -1 : 1;
    if (a->ino != b->ino) return a->ino < b->ino ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

static int compare_seq(const void *x, const void *y) {
    const file_entry *a = x, *b = y;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

/* Drops files seen twice (fortune's .u8 names are links to the same text),
 * keeping the first in input order. */
static void drop_duplicates(file_list *list) {
    if (list->count < 2) return;
    qsort(list->items, list->count, sizeof *list->items, compare_inode);
    size_t kept = 1;
    for (size_t i = 1; i < list->count; i++) {
        file_entry *prev = &list->items[kept - 1], *e = &list->items[i];
        if (e->dev == prev->dev && e->ino == prev->ino)
            free(e->path);
        else
            list->items[kept++] = *e;
    }
    list->count = kept;
    qsort(list->items, list->count, sizeof *list->items, compare_seq);
}

/* ------------------------------------------------------------ documents */

typedef struct {
    char *text; /* every document, back to back */
    size_t bytes, capacity;
    size_t *start; /* document d is text[start[d] .. start[d + 1]) */
    size_t count, start_capacity;
} corpus;

static int is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && (s[i] < '\t' || s[i] > '\r')) return 0;
    return 1;
}

static gpc_status corpus_add(corpus *c, const char *s, size_t n) {
    if (is_blank(s, n)) return GPC_OK;
    if (c->bytes + n > c->capacity) {
        size_t capacity = c->capacity ? c->capacity : 1 << 20;
        while (capacity < c->bytes + n)
            capacity *= 2;
        char *bigger = realloc(c->text, capacity);
        if (!bigger) return gpc_error(GPC_ERR_NOMEM, "out of memory reading the corpus");
        c->text = bigger;
        c->capacity = capacity;
    }
    if (c->count + 2 > c->start_capacity) {
        size_t capacity = c->start_capacity ? c->start_capacity * 2 : 4096;
        size_t *bigger = realloc(c->start, capacity * sizeof *bigger);
        if (!bigger) return gpc_error(GPC_ERR_NOMEM, "out of memory reading the corpus");
        c->start = bigger;
        c->start_capacity = capacity;
    }
    memcpy(c->text + c->bytes, s, n);
    c->start[c->count++] = c->bytes;
    c->bytes += n;
    c->start[c->count] = c->bytes;
    return GPC_OK;
}

/* Adds the documents of one file: the text between lines that hold only "%". */
static gpc_status corpus_add_file(corpus *c, const char *text, size_t bytes) {
    size_t doc = 0;
    for (size_t line = 0; line < bytes;) {
        const char *nl = memchr(text + line, '\n', bytes - line);
        size_t end = nl ? (size_t)(nl - text) : bytes; /* the line is text[line .. end) */
        size_t len = end - line;
        if (len && text[end - 1] == '\r') len--;
        if (len == 1 && text[line] == '%') {
            GPC_TRY(corpus_add(c, text + doc, line - doc));
            doc = nl ? end + 1 : bytes;
        }
        line = nl ? end + 1 : bytes;
    }
    return corpus_add(c, text + doc, bytes - doc);
}

/* ---------------------------------------------------------------- prepare */

typedef struct {
    uint32_t *tokens;
    size_t count;
} token_array;

static gpc_status write_split(const char *dir, gpc_split split, const token_array *a,
                              uint32_t vocab, uint64_t shard_tokens, int *shards,
                              progress_state *p) {
    *shards = 0;
    for (uint64_t at = 0; at < a->count; at += shard_tokens) {
        char path[4096];
        uint64_t n = a->count - at < shard_tokens ? a->count - at : shard_tokens;
        data_shard_path(path, sizeof path, dir, split, *shards);
        GPC_TRY(gpc_shard_write(path, a->tokens + at, n, vocab));
        (*shards)++;
        progress(p, "writing", at + n, a->count);
    }
    return GPC_OK;
}

static gpc_status check_output_dir(const char *out_dir) {
    gpc_status s = gpc_mkdir_p(out_dir);
    if (s != GPC_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", gpc_last_error());
        return gpc_error(s, "output folder: %s; choose another --out", why);
    }
    if (access(out_dir, W_OK) != 0)
        return gpc_error(GPC_ERR_IO, "cannot write to %s: %s; choose another --out", out_dir,
                         strerror(errno));
    return GPC_OK;
}

static gpc_status read_inputs(const char *const *inputs, int input_count, const char *out_dir,
                              corpus *c, gpc_prepare_summary *sum, progress_state *p) {
    file_list list;
    memset(&list, 0, sizeof list);
    struct stat st;
    if (stat(out_dir, &st) == 0) {
        list.out_dev = st.st_dev;
        list.out_ino = st.st_ino;
    }
    gpc_status s = GPC_OK;
    for (int i = 0; i < input_count && s == GPC_OK; i++)
        s = collect(&list, inputs[i], 1);
    if (s == GPC_OK) drop_duplicates(&list);
    for (size_t i = 0; i < list.count && s == GPC_OK; i++) {
        char *text;
        size_t bytes;
        s = gpc_read_file(list.items[i].path, &text, &bytes);
        if (s != GPC_OK) break;
        size_t probe = bytes < BINARY_PROBE_BYTES ? bytes : BINARY_PROBE_BYTES;
        if (memchr(text, '\0', probe)) {
            sum->skipped_files++;
        } else {
            sum->files++;
            s = corpus_add_file(c, text, bytes);
        }
        gpc_free(text);
        progress(p, "reading", i + 1, list.count);
    }
    for (size_t i = 0; i < list.count; i++)
        free(list.items[i].path);
    free(list.items);
    if (s == GPC_OK && c->count == 0)
        s = gpc_error(GPC_ERR_FORMAT,
                      "no text found in the inputs (%llu binary files skipped); give files or "
                      "folders that hold text",
                      (unsigned long long)sum->skipped_files);
    return s;
}

gpc_status gpc_data_prepare(const char *const *inputs, int input_count, const char *out_dir,
                            const gpc_prepare_options *options) {
    gpc_prepare_options defaults;
    gpc_prepare_options_init(&defaults);
    const gpc_prepare_options *o = options ? options : &defaults;
    int vocab_size = o->vocab_size ? o->vocab_size : 4096;
    uint64_t shard_tokens = o->shard_tokens ? o->shard_tokens : defaults.shard_tokens;
    if (input_count < 1)
        return gpc_error(GPC_ERR_INVALID_ARG, "no inputs: give text files or folders");
    if (vocab_size < 257 || vocab_size > 65536)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "vocabulary size %d is out of range: use 257 to 65536", vocab_size);
    if (!(o->val_fraction >= 0 && o->val_fraction <= 0.5))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "validation fraction %g is out of range: use 0 to 0.5", o->val_fraction);
    double t0 = gpc_time_seconds();
    progress_state p = {o, -1e9, NULL};
    gpc_prepare_summary sum;
    memset(&sum, 0, sizeof sum);
    corpus c;
    memset(&c, 0, sizeof c);
    gpc_tokenizer *tok = NULL;
    token_array split[2] = {{NULL, 0}, {NULL, 0}};
    char *is_val = NULL;
    gpc_status s = check_output_dir(out_dir);
    if (s == GPC_OK) s = read_inputs(inputs, input_count, out_dir, &c, &sum, &p);
    if (s == GPC_OK) {
        sum.documents = c.count;
        sum.text_bytes = c.bytes;
        /* documents touch in this buffer; a pre-token rarely spans two, and
         * the only cost is a slightly different count for that pair */
        s = o->tokenizer
                ? gpc_tokenizer_load_from(&tok, o->tokenizer)
                : gpc_tokenizer_train(&tok, c.text, c.bytes, vocab_size, tokenizer_progress, &p);
    }
    if (s == GPC_OK) {
        is_val = calloc(c.count, 1);
        size_t bytes[2] = {0, 0}, docs[2] = {0, 0};
        double f = o->val_fraction;
        for (size_t d = 0; is_val && d < c.count; d++)
            is_val[d] = (char)(f > 0 && (size_t)((double)(d + 1) * f) > (size_t)((double)d * f));
        for (size_t d = 0; is_val && d < c.count; d++)
            docs[(int)is_val[d]]++;
        if (is_val && f > 0 && c.count >= 2 && docs[1] == 0) { /* at least one */
            is_val[c.count - 1] = 1;
            docs[0]--;
            docs[1]++;
        }
        for (size_t d = 0; is_val && d < c.count; d++)
            bytes[(int)is_val[d]] += c.start[d + 1] - c.start[d] + 1;
        sum.train_documents = docs[0];
        sum.val_documents = docs[1];
        /* a document never has more tokens than bytes, plus its end-of-text */
        for (int k = 0; k < 2; k++)
            split[k].tokens = malloc((bytes[k] + 1) * sizeof(uint32_t));
        if (!is_val || !split[0].tokens || !split[1].tokens)
            s = gpc_error(GPC_ERR_NOMEM, "out of memory encoding the corpus");
    }
    for (size_t d = 0; s == GPC_OK && d < c.count; d++) {
        uint32_t *tokens;
        size_t n;
        s = gpc_tokenizer_encode(tok, c.text + c.start[d], c.start[d + 1] - c.start[d], &tokens,
                                 &n);
        if (s != GPC_OK) break;
        token_array *a = &split[(int)is_val[d]];
        memcpy(a->tokens + a->count, tokens, n * sizeof *tokens);
        a->count += n;
        a->tokens[a->count++] = (uint32_t)gpc_tokenizer_eot(tok);
        gpc_free(tokens);
        if (d % 1024 == 0 || d + 1 == c.count) progress(&p, "encoding", d + 1, c.count);
    }
    data_dataset_meta meta;
    memset(&meta, 0, sizeof meta);
    if (s == GPC_OK) {
        char path[4096];
        snprintf(path, sizeof path, "%s/" DATASET_TOKENIZER_FILE, out_dir);
        s = gpc_tokenizer_save(tok, path);
        meta.info.vocab_size = (uint32_t)gpc_tokenizer_vocab_size(tok);
        meta.info.train_tokens = split[0].count;
        meta.info.val_tokens = split[1].count;
        meta.info.has_tokenizer = 1;
    }
    if (s == GPC_OK)
        s = write_split(out_dir, GPC_SPLIT_TRAIN, &split[0], meta.info.vocab_size, shard_tokens,
                        &meta.info.train_shards, &p);
    if (s == GPC_OK)
        s = write_split(out_dir, GPC_SPLIT_VAL, &split[1], meta.info.vocab_size, shard_tokens,
                        &meta.info.val_shards, &p);
    if (s == GPC_OK) {
        meta.source = "prepare";
        meta.documents = sum.documents;
        meta.train_documents = sum.train_documents;
        meta.val_documents = sum.val_documents;
        meta.text_bytes = sum.text_bytes;
        meta.skipped_files = sum.skipped_files;
        s = data_write_dataset(out_dir, &meta);
    }
    if (s == GPC_OK) {
        sum.train_tokens = split[0].count;
        sum.val_tokens = split[1].count;
        sum.vocab_size = (int)meta.info.vocab_size;
        sum.seconds = gpc_time_seconds() - t0;
        if (o->summary) *o->summary = sum;
    }
    free(split[0].tokens);
    free(split[1].tokens);
    free(is_val);
    free(c.text);
    free(c.start);
    gpc_tokenizer_free(tok);
    return s;
}

/* ------------------------------------------------------------------ synth */

gpc_status gpc_data_synth(const char *out_dir, uint32_t vocab_size, uint64_t tokens, uint64_t seed,
                          uint64_t shard_tokens) {
    if (vocab_size < 2 || vocab_size > (UINT32_C(1) << 31))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "vocabulary size %u is out of range: use 2 to 2147483648", vocab_size);
    if (tokens == 0) return gpc_error(GPC_ERR_INVALID_ARG, "token count must be at least 1");
    if (shard_tokens == 0) shard_tokens = (uint64_t)1 << 24;
    GPC_TRY(check_output_dir(out_dir));
    /* validation gets 1/20 of the tokens, but at least one window of context
     * 1024 (1025 tokens) when there are enough tokens for that to stay a minority */
    uint64_t val = tokens / 20;
    if (val < 1025) val = tokens / 2 < 1025 ? tokens / 2 : 1025;
    uint64_t count[2] = {tokens - val, val};
    size_t chunk = (size_t)(tokens < shard_tokens ? tokens : shard_tokens);
    uint32_t *buf = gpc_malloc(chunk * sizeof *buf);
    if (!buf) return gpc_error(GPC_ERR_NOMEM, "out of memory for a shard of %zu tokens", chunk);
    gpc_rng rng;
    gpc_rng_seed(&rng, seed, 0x5917);
    data_dataset_meta meta;
    memset(&meta, 0, sizeof meta);
    gpc_status s = GPC_OK;
    for (int split = 0; split < 2 && s == GPC_OK; split++) {
        int shards = 0;
        for (uint64_t at = 0; at < count[split] && s == GPC_OK; at += chunk) {
            size_t n = (size_t)(count[split] - at < chunk ? count[split] - at : chunk);
            for (size_t i = 0; i < n; i++)
                buf[i] = gpc_rng_below(&rng, vocab_size);
            char path[4096];
            data_shard_path(path, sizeof path, out_dir, (gpc_split)split, shards++);
            s = gpc_shard_write(path, buf, n, vocab_size);
        }
        if (split == GPC_SPLIT_TRAIN)
            meta.info.train_shards = shards;
        else
            meta.info.val_shards = shards;
    }
    gpc_free(buf);
    if (s != GPC_OK) return s;
    meta.source = "synth";
    meta.info.vocab_size = vocab_size;
    meta.info.train_tokens = count[0];
    meta.info.val_tokens = count[1];
    meta.seed = seed;
    return data_write_dataset(out_dir, &meta);
}
