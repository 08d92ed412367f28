/*
 * gpc tokenizer: byte-level BPE that gpc trains itself.
 *
 * Tokens 0..255 are the raw bytes, so any byte string encodes and decodes
 * back exactly. Merges learned from a corpus add tokens 256..V-2; the last
 * id, V-1, is the end-of-text token that separates documents. Training splits
 * text into pre-tokens (a run of letters with its leading space, a run of
 * digits, a run of other symbols, a run of whitespace) and counts unique ones,
 * so it is fast on a corpus of many megabytes; merges never cross pre-tokens.
 */
#ifndef GPC_TOKENIZER_H
#define GPC_TOKENIZER_H

#include "gpc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpc_tokenizer gpc_tokenizer;

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
 * The end-of-text token decodes to nothing. Ids out of range are an error. */
gpc_status gpc_tokenizer_decode(const gpc_tokenizer *tok, const uint32_t *tokens, size_t count,
                                char **text, size_t *bytes);
/* The bytes of one token, for streaming output; NULL for an id out of range. */
const char *gpc_tokenizer_token_bytes(const gpc_tokenizer *tok, uint32_t id, size_t *length);

/* File format: magic "GPCTOKEN", version, vocab size, merges, CRC-32C;
 * written atomically. Loading a wrong, short or corrupt file is a clear error. */
gpc_status gpc_tokenizer_save(const gpc_tokenizer *tok, const char *path);
gpc_status gpc_tokenizer_load(gpc_tokenizer **out, const char *path);

#ifdef __cplusplus
}
#endif

#endif /* GPC_TOKENIZER_H */
