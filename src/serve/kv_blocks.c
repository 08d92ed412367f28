/*
 * kv_blocks.c: the block manager of the paged key/value cache: reference
 * counts, a free stack and the table of registered full blocks that makes
 * prefix sharing a lookup (kv_blocks.h says why sharing needs no copies).
 */
#include "serve/kv_blocks.h"

#include <string.h>

gpc_status kv_blocks_init(kv_blocks *kv, int num_blocks, int block_size) {
    memset(kv, 0, sizeof *kv);
    kv->num_blocks = num_blocks;
    kv->block_size = block_size;
    kv->buckets = 16;
    while (kv->buckets < 2 * (uint64_t)num_blocks)
        kv->buckets *= 2;
    size_t n = (size_t)num_blocks;
    kv->ref = gpc_calloc(n, sizeof *kv->ref);
    kv->free_list = gpc_malloc(n * sizeof *kv->free_list);
    kv->bucket = gpc_malloc((size_t)kv->buckets * sizeof *kv->bucket);
    kv->next = gpc_malloc(n * sizeof *kv->next);
    kv->key = gpc_calloc(n, sizeof *kv->key);
    kv->parent = gpc_malloc(n * sizeof *kv->parent);
    kv->tokens = gpc_malloc(n * (size_t)block_size * sizeof *kv->tokens);
    kv->registered = gpc_calloc(n, 1);
    if (!kv->ref || !kv->free_list || !kv->bucket || !kv->next || !kv->key || !kv->parent ||
        !kv->tokens || !kv->registered) {
        kv_blocks_destroy(kv);
        return gpc_error(GPC_ERR_NOMEM, "out of host memory for the bookkeeping of %d cache blocks",
                         num_blocks);
    }
    /* the stack hands out low block numbers first */
    for (int i = 0; i < num_blocks; i++)
        kv->free_list[i] = num_blocks - 1 - i;
    kv->num_free = num_blocks;
    for (uint64_t b = 0; b < kv->buckets; b++)
        kv->bucket[b] = -1;
    return GPC_OK;
}

void kv_blocks_destroy(kv_blocks *kv) {
    gpc_free(kv->ref);
    gpc_free(kv->free_list);
    gpc_free(kv->bucket);
    gpc_free(kv->next);
    gpc_free(kv->key);
    gpc_free(kv->parent);
    gpc_free(kv->tokens);
    gpc_free(kv->registered);
    memset(kv, 0, sizeof *kv);
}

int kv_blocks_alloc(kv_blocks *kv) {
    if (kv->num_free == 0) return -1;
    int b = kv->free_list[--kv->num_free];
    kv->ref[b] = 1;
    return b;
}

void kv_blocks_ref(kv_blocks *kv, int block) {
    kv->ref[block]++;
}

static void unregister(kv_blocks *kv, int block) {
    int *at = &kv->bucket[kv->key[block] & (kv->buckets - 1)];
    while (*at != -1 && *at != block)
        at = &kv->next[*at];
    if (*at == block) *at = kv->next[block];
    kv->registered[block] = 0;
}

void kv_blocks_release(kv_blocks *kv, int block) {
    if (--kv->ref[block] > 0) return;
    if (kv->registered[block]) unregister(kv, block);
    kv->free_list[kv->num_free++] = block;
}

int kv_blocks_free_count(const kv_blocks *kv) {
    return kv->num_free;
}

/* splitmix64's finaliser (Steele et al. 2014): every input bit reaches
 * every output bit, so chained keys of similar texts spread over the table. */
static uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

uint64_t kv_blocks_key(uint64_t prev, const uint32_t *tokens, int block_size) {
    uint64_t h = mix(prev + 0x9e3779b97f4a7c15ULL);
    for (int i = 0; i < block_size; i++)
        h = mix(h ^ tokens[i]);
    return h;
}

int kv_blocks_lookup(const kv_blocks *kv, uint64_t key, int parent, const uint32_t *tokens) {
    size_t bytes = (size_t)kv->block_size * sizeof *tokens;
    for (int b = kv->bucket[key & (kv->buckets - 1)]; b != -1; b = kv->next[b])
        if (kv->key[b] == key && kv->parent[b] == parent &&
            memcmp(kv->tokens + (size_t)b * kv->block_size, tokens, bytes) == 0)
            return b;
    return -1;
}

void kv_blocks_register(kv_blocks *kv, int block, uint64_t key, int parent,
                        const uint32_t *tokens) {
    if (kv->registered[block] || kv_blocks_lookup(kv, key, parent, tokens) >= 0) return;
    kv->key[block] = key;
    kv->parent[block] = parent;
    memcpy(kv->tokens + (size_t)block * kv->block_size, tokens,
           (size_t)kv->block_size * sizeof *tokens);
    uint64_t at = key & (kv->buckets - 1);
    kv->next[block] = kv->bucket[at];
    kv->bucket[at] = block;
    kv->registered[block] = 1;
}
