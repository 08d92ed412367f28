/*
 * kv_blocks.h: the serving engine's block manager: which blocks of the
 * paged key/value cache are free, how many sequences use each, and which
 * full blocks hold which tokens (prefix sharing). Private to src/serve/;
 * called only from the engine thread.
 *
 * A block is free when no sequence uses it (reference count 0). A full
 * block is never written again (a sequence only appends), so once its keys
 * and values are computed it can be registered under its tokens and shared
 * by any later sequence whose text starts the same way: no copy-on-write.
 * The key of block j of a text is a hash of its tokens chained with the key
 * of block j-1, and a lookup also compares the tokens and the previous
 * block, so two texts share a block only when everything before it agrees.
 */
#ifndef GPC_SERVE_KV_BLOCKS_H
#define GPC_SERVE_KV_BLOCKS_H

#include "gpc/core.h"

typedef struct {
    int num_blocks, block_size;
    int *ref;       /* [num_blocks] sequences using each block */
    int *free_list; /* [num_blocks] a stack of the free blocks */
    int num_free;
    /* registered full blocks: a hash table chained through next */
    int *bucket;               /* [buckets] first block of each chain, -1 for none */
    int *next;                 /* [num_blocks] next block of the chain, -1 at its end */
    uint64_t *key;             /* [num_blocks] the chained hash of a registered block */
    int *parent;               /* [num_blocks] the block before it in its text, -1 for the first */
    uint32_t *tokens;          /* [num_blocks, block_size] the tokens of a registered block */
    unsigned char *registered; /* [num_blocks] */
    uint64_t buckets;          /* a power of two */
} kv_blocks;

gpc_status kv_blocks_init(kv_blocks *kv, int num_blocks, int block_size);
void kv_blocks_destroy(kv_blocks *kv);

/* A free block with one user, or -1 when none is free. */
int kv_blocks_alloc(kv_blocks *kv);
/* One more user of a block in use (a sequence sharing it). */
void kv_blocks_ref(kv_blocks *kv, int block);
/* One user fewer; the last one frees it (and forgets its tokens). */
void kv_blocks_release(kv_blocks *kv, int block);
int kv_blocks_free_count(const kv_blocks *kv);

/* The key of a full block of tokens that follows the block of key prev
 * (0 for the first block of a text). */
uint64_t kv_blocks_key(uint64_t prev, const uint32_t *tokens, int block_size);
/* The registered block with this key, previous block and tokens, or -1. */
int kv_blocks_lookup(const kv_blocks *kv, uint64_t key, int parent, const uint32_t *tokens);
/* Registers a full, computed block; does nothing when an equal block is
 * registered already (two sequences computed the same text at once: the
 * later one keeps its copy unshared). */
void kv_blocks_register(kv_blocks *kv, int block, uint64_t key, int parent, const uint32_t *tokens);

#endif /* GPC_SERVE_KV_BLOCKS_H */
