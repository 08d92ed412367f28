/*
 * tokenizer_internal.h: what tokenizer.c (the shared byte-level BPE: token
 * table, merges by rank, the file) and tokenizer_gpt2.c (GPT-2's
 * pre-tokenizer and Hugging Face's vocab.json / merges.txt) share.
 */
#ifndef GPC_TOKENIZER_INTERNAL_H
#define GPC_TOKENIZER_INTERNAL_H

#include "gpc/tokenizer.h"

/* Builds a tokenizer from merges (2 ids per merge, merge r makes token
 * 256 + r; validated, and owned by the tokenizer afterwards). byte_token[b]
 * is the id of the one-byte token b (NULL: b itself); it must be a
 * permutation of 0..255. what names the source in messages. */
gpc_status gpc_tokenizer_build(gpc_tokenizer **out, uint32_t *merges, int merge_count,
                               const uint32_t *byte_token, gpc_tokenizer_kind kind,
                               const char *what);
/* The merges, 2 ids each, and their count. */
const uint32_t *gpc_tokenizer_merge_list(const gpc_tokenizer *tok, int *count);
/* The id of each one-byte token (256 entries). */
const uint32_t *gpc_tokenizer_byte_tokens(const gpc_tokenizer *tok);

/* GPT-2's pre-tokenizer: the length in bytes of the piece that starts at s
 * (n > 0 bytes left), as the regex
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * would match it. Bytes that are not valid UTF-8 count as one character
 * each, of the class of U+FFFD (neither letter, number nor space). */
size_t gpc_gpt2_pretoken_length(const unsigned char *s, size_t n);

/* GPT-2's end-of-text token as it appears in text. */
#define GPC_GPT2_EOT_TEXT "<|endoftext|>"

#endif /* GPC_TOKENIZER_INTERNAL_H */
