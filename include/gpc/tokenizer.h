/*
 * gpc tokenizer: byte-level BPE, of two kinds: the one gpc trains itself,
 * and GPT-2's (imported from Hugging Face's vocab.json and merges.txt).
 *
 * Tokens 0..255 are the raw bytes, so any byte string encodes and decodes
 * back exactly. Merges learned from a corpus add tokens 256..V-2; the last
 * id, V-1, is the end-of-text token that separates documents. Training splits
 * text into pre-tokens (a run of letters with its leading space, a run of
 * digits, a run of other symbols, a run of whitespace) and counts unique ones,
 * so it is fast on a corpus of many megabytes; merges never cross pre-tokens.
 *
 * GPT-2's tokenizer works the same way with GPT-2's own pieces: its
 * pre-tokenizer regex (letters, numbers, other symbols, each with one leading
 * space; the contractions 's 't 're 've 'm 'll 'd; whitespace runs), its
 * byte ids (the bytes are a permutation of ids 0..255), its 50,000 merges
 * and <|endoftext|> (id 50256), which is recognised in text and decodes back
 * to "<|endoftext|>". Its ids equal Hugging Face's for valid UTF-8; bytes
 * that are not valid UTF-8 are kept (decode gives them back) and are
 * pre-tokenized as U+FFFD would be.
 */
#ifndef GPC_TOKENIZER_H
#define GPC_TOKENIZER_H

#include "gpc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpc_tokenizer gpc_tokenizer;

typedef enum {
    GPC_TOKENIZER_GPC = 0,  /* trained by gpc (gpc_tokenizer_train) */
    GPC_TOKENIZER_GPT2 = 1, /* GPT-2's byte-level BPE */
} gpc_tokenizer_kind;

gpc_tokenizer_kind gpc_tokenizer_get_kind(const gpc_tokenizer *tok);
/* "gpc" or "gpt2" */
const char *gpc_tokenizer_kind_name(gpc_tokenizer_kind kind);

/* Called now and then during training with the merges done so far. */
typedef void (*gpc_tokenizer_progress)(void *user, int merges_done, int merges_total);

/* Learns vocab_size - 257 merges from text (vocab_size 257..65536). */
gpc_status gpc_tokenizer_train(gpc_tokenizer **out, const char *text, size_t bytes, int vocab_size,
                               gpc_tokenizer_progress progress, void *user);
void gpc_tokenizer_free(gpc_tokenizer *tok);

int gpc_tokenizer_vocab_size(const gpc_tokenizer *tok);
int gpc_tokenizer_eot(const gpc_tokenizer *tok); /* end-of-text id, vocab_size - 1 */

/* Encodes bytes into *tokens (gpc_malloc'd; free with gpc_free). */
gpc_status gpc_tokenizer_encode(const gpc_tokenizer *tok, const char *text, size_t bytes,
                                uint32_t **tokens, size_t *count);
/* Decodes into *text (gpc_malloc'd, NUL-terminated; *bytes excludes the NUL).
 * The end-of-text token decodes to nothing (gpc's) or to "<|endoftext|>"
 * (GPT-2's, as Hugging Face's does). Ids out of range are an error. */
gpc_status gpc_tokenizer_decode(const gpc_tokenizer *tok, const uint32_t *tokens, size_t count,
                                char **text, size_t *bytes);
/* The bytes of one token, for streaming output; NULL for an id out of range. */
const char *gpc_tokenizer_token_bytes(const gpc_tokenizer *tok, uint32_t id, size_t *length);

/* File format: magic "GPCTOKEN", version (1: gpc's; 2: GPT-2's, whose byte
 * ids follow the header), vocab size, merges, CRC-32C; written atomically.
 * Loading a wrong, short or corrupt file is a clear error. */
gpc_status gpc_tokenizer_save(const gpc_tokenizer *tok, const char *path);
gpc_status gpc_tokenizer_load(gpc_tokenizer **out, const char *path);

/* GPT-2's tokenizer from Hugging Face's files: vocab.json (token string ->
 * id, the bytes written as GPT-2's printable characters) and merges.txt
 * ("#version" line, then one "A B" merge a line, in rank order). gpc needs
 * GPT-2's layout: the 256 bytes take ids 0..255, merge r makes id 256 + r,
 * and <|endoftext|> is the last id; anything else is a clear error. */
gpc_status gpc_tokenizer_load_gpt2(gpc_tokenizer **out, const char *vocab_path,
                                   const char *merges_path);
/* The tokenizer of PATH: a run or dataset folder (PATH/tokenizer.bin), a
 * Hugging Face folder (PATH/vocab.json and PATH/merges.txt), or a
 * tokenizer.bin itself. */
gpc_status gpc_tokenizer_load_from(gpc_tokenizer **out, const char *path);
/* Writes DIR/vocab.json and DIR/merges.txt of a GPT-2 tokenizer, which
 * transformers' GPT2TokenizerFast.from_pretrained(DIR) reads back. */
gpc_status gpc_tokenizer_write_gpt2(const gpc_tokenizer *tok, const char *dir);

#ifdef __cplusplus
}
#endif

#endif /* GPC_TOKENIZER_H */
