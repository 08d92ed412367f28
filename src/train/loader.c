/*
 * loader.c: the training data loader: fixed windows of a split, shuffled
 * per epoch, split among ranks, handed out B at a time.
 *
 * Window w covers tokens [w*T, w*T + T] of the split's concatenated shards
 * (T+1 tokens, stride T): inputs are its first T tokens, targets the last T,
 * so every token but the split's last is predicted once per epoch. The
 * training split visits windows in an order shuffled by PCG32 seeded with
 * (seed, epoch), so an epoch's order depends only on those two numbers and a
 * checkpoint needs to store just (epoch, batch) to resume on the same batch.
 * Rank r of world_size takes positions r, r + world_size, ... of the order,
 * and every rank gets the same number of batches (the leftover windows of
 * an epoch are skipped), which keeps data-parallel ranks in step.
 *
 * Memory: the whole split is loaded (as u16 when the vocabulary fits),
 * which is right for the corpora gpc prepares today: at open here, or on
 * the prefetch thread (prefetch.c), which opens the loader without its
 * tokens (loader_open_unloaded: the sizes come from dataset.txt, whose
 * shard headers gpc_dataset_info_read has checked) and reads them there.
 * A streaming version would keep the window order here and read the
 * windows a batch needs from the shards (their offsets are known from the
 * headers) on that thread; the interface above it would not change.
 */
#include "train/data_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

struct gpc_loader {
    gpc_split split;
    int B, T, rank, world_size;
    uint64_t seed;
    uint32_t vocab_size;
    int width; /* bytes per stored token: 2 or 4 */
    void *tokens;
    uint64_t token_count;
    uint64_t windows; /* in the whole split */
    uint64_t batches; /* per epoch, per rank */
    uint64_t *order;  /* window order of order_epoch */
    uint64_t order_epoch;
    uint64_t epoch, batch; /* the next batch handed out */
    char *dir;
    gpc_dataset_info info;
};

static void loader_order(gpc_loader *l, uint64_t epoch) {
    for (uint64_t i = 0; i < l->windows; i++)
        l->order[i] = i;
    if (l->split == GPC_SPLIT_TRAIN) {
        gpc_rng rng;
        gpc_rng_seed(&rng, l->seed, epoch);
        gpc_rng_shuffle_u64(&rng, l->order, (size_t)l->windows);
    }
    l->order_epoch = epoch;
}

static inline int32_t loader_token(const gpc_loader *l, uint64_t i) {
    if (l->width == 2) return ((const uint16_t *)l->tokens)[i];
    return (int32_t)((const uint32_t *)l->tokens)[i];
}

/* Loads every shard of the split into one array of l->width-byte tokens. */
static gpc_status loader_read_split(gpc_loader *l, const char *dir, const gpc_dataset_info *info,
                                    atomic_int *cancel) {
    int shards = l->split == GPC_SPLIT_TRAIN ? info->train_shards : info->val_shards;
    uint64_t total = l->split == GPC_SPLIT_TRAIN ? info->train_tokens : info->val_tokens;
    l->tokens = gpc_malloc(total ? (size_t)total * l->width : 1);
    if (!l->tokens)
        return gpc_error(GPC_ERR_NOMEM, "out of memory loading %" PRIu64 " tokens of %s", total,
                         dir);
    uint64_t at = 0;
    for (int i = 0; i < shards; i++) {
        char path[4096];
        gpc_shard_info shard;
        if (cancel && atomic_load(cancel))
            return gpc_error(GPC_ERR_INTERRUPTED,
                             "reading the shards of %s stopped: the loader "
                             "was closed",
                             dir);
        uint32_t *tokens;
        data_shard_path(path, sizeof path, dir, l->split, i);
        GPC_TRY(gpc_shard_read(path, &shard, &tokens));
        if (at + shard.tokens > total) {
            gpc_free(tokens);
            return gpc_error(
                GPC_ERR_MISMATCH,
                "%s holds more tokens than dataset.txt says; prepare the dataset again", path);
        }
        if (l->width == 2)
            for (uint64_t k = 0; k < shard.tokens; k++)
                ((uint16_t *)l->tokens)[at + k] = (uint16_t)tokens[k];
        else
            memcpy((uint32_t *)l->tokens + at, tokens, (size_t)shard.tokens * sizeof *tokens);
        at += shard.tokens;
        gpc_free(tokens);
    }
    if (at != total)
        return gpc_error(GPC_ERR_MISMATCH,
                         "the %s shards of %s hold %" PRIu64 " tokens but dataset.txt says %" PRIu64
                         "; prepare the dataset again",
                         l->split == GPC_SPLIT_TRAIN ? "train" : "val", dir, at, total);
    return GPC_OK;
}

gpc_status loader_open_unloaded(gpc_loader **out, const char *dir, gpc_split split, int B, int T,
                                uint64_t seed, int rank, int world_size) {
    *out = NULL;
    if (B < 1 || T < 1)
        return gpc_error(GPC_ERR_INVALID_ARG, "batch %d and context %d must both be at least 1", B,
                         T);
    if (world_size < 1 || rank < 0 || rank >= world_size)
        return gpc_error(GPC_ERR_INVALID_ARG, "rank %d is not in 0..%d (world size %d)", rank,
                         world_size - 1, world_size);
    gpc_dataset_info info;
    GPC_TRY(gpc_dataset_info_read(dir, &info));
    gpc_loader *l = gpc_calloc(1, sizeof *l);
    if (!l) return gpc_error(GPC_ERR_NOMEM, "out of memory opening the loader");
    l->split = split;
    l->B = B;
    l->T = T;
    l->rank = rank;
    l->world_size = world_size;
    l->seed = seed;
    l->vocab_size = info.vocab_size;
    l->width = info.vocab_size <= 65536 ? 2 : 4;
    l->info = info;
    l->dir = gpc_malloc(strlen(dir) + 1);
    if (!l->dir) {
        gpc_loader_close(l);
        return gpc_error(GPC_ERR_NOMEM, "out of memory opening the loader");
    }
    memcpy(l->dir, dir, strlen(dir) + 1);
    /* gpc_dataset_info_read checked that the shards' headers add up to the
     * split's count, so the windows are known before a token is read */
    l->token_count = split == GPC_SPLIT_TRAIN ? info.train_tokens : info.val_tokens;
    const char *name = split == GPC_SPLIT_TRAIN ? "training" : "validation";
    l->windows = l->token_count > 0 ? (l->token_count - 1) / (uint64_t)T : 0;
    l->batches = l->windows / (uint64_t)world_size / (uint64_t)B;
    if (l->batches == 0) {
        uint64_t need = (uint64_t)B * (uint64_t)world_size * (uint64_t)T + 1;
        char ranks[64] = "";
        if (world_size > 1) snprintf(ranks, sizeof ranks, " on each of %d ranks", world_size);
        gpc_status s = gpc_error(GPC_ERR_MISMATCH, /* the data's fault as much: exit 1 */
                                 "the %s split of %s has %" PRIu64 " tokens, too few for one "
                                 "batch of %d x %d tokens%s, which needs %" PRIu64
                                 " tokens: lower --batch or --context, or prepare more data",
                                 name, dir, l->token_count, B, T, ranks, need);
        gpc_loader_close(l);
        return s;
    }
    l->order = gpc_malloc((size_t)l->windows * sizeof *l->order);
    if (!l->order) {
        gpc_loader_close(l);
        return gpc_error(GPC_ERR_NOMEM, "out of memory for the order of %" PRIu64 " windows",
                         l->windows);
    }
    loader_order(l, 0);
    *out = l;
    return GPC_OK;
}

gpc_status loader_load(gpc_loader *l, atomic_int *cancel) {
    if (l->tokens) return GPC_OK;
    gpc_status s = loader_read_split(l, l->dir, &l->info, cancel);
    if (s != GPC_OK) {
        gpc_free(l->tokens);
        l->tokens = NULL;
    }
    return s;
}

gpc_status gpc_loader_open(gpc_loader **out, const char *dir, gpc_split split, int B, int T,
                           uint64_t seed, int rank, int world_size) {
    gpc_loader *l;
    GPC_TRY(loader_open_unloaded(&l, dir, split, B, T, seed, rank, world_size));
    gpc_status s = loader_load(l, NULL);
    if (s != GPC_OK) {
        gpc_loader_close(l);
        return s;
    }
    *out = l;
    return GPC_OK;
}

void gpc_loader_close(gpc_loader *loader) {
    if (!loader) return;
    gpc_free(loader->tokens);
    gpc_free(loader->order);
    gpc_free(loader->dir);
    gpc_free(loader);
}

gpc_status gpc_loader_next(gpc_loader *l, int32_t *inputs, int32_t *targets) {
    if (!l->tokens)
        return gpc_error(GPC_ERR_INTERNAL, "the loader's shards were never read (loader_load)");
    if (l->batch >= l->batches) {
        l->epoch++;
        l->batch = 0;
    }
    if (l->order_epoch != l->epoch) loader_order(l, l->epoch);
    uint64_t ws = (uint64_t)l->world_size, T = (uint64_t)l->T;
    for (uint64_t b = 0; b < (uint64_t)l->B; b++) {
        uint64_t w = l->order[(l->batch * (uint64_t)l->B + b) * ws + (uint64_t)l->rank];
        uint64_t start = w * T;
        int32_t *in = inputs + b * T, *tg = targets + b * T;
        for (uint64_t t = 0; t < T; t++) {
            in[t] = loader_token(l, start + t);
            tg[t] = loader_token(l, start + t + 1);
        }
    }
    l->batch++;
    return GPC_OK;
}

uint64_t gpc_loader_batches_per_epoch(const gpc_loader *loader) {
    return loader->batches;
}

uint32_t gpc_loader_vocab_size(const gpc_loader *loader) {
    return loader->vocab_size;
}

void gpc_loader_rewind(gpc_loader *loader) {
    loader->epoch = 0;
    loader->batch = 0;
}

void gpc_loader_get_state(const gpc_loader *loader, gpc_loader_state *state) {
    /* the end of an epoch is the start of the next one */
    if (loader->batch >= loader->batches) {
        state->epoch = loader->epoch + 1;
        state->batch = 0;
    } else {
        state->epoch = loader->epoch;
        state->batch = loader->batch;
    }
}

gpc_status loader_check_state(const gpc_loader *loader, const gpc_loader_state *state) {
    if (state->batch >= loader->batches)
        return gpc_error(GPC_ERR_MISMATCH,
                         "saved loader position (epoch %" PRIu64 ", batch %" PRIu64
                         ") is past this loader's %" PRIu64
                         " batches per epoch; resume with the dataset, --batch, --context and "
                         "number of processes of the original run",
                         state->epoch, state->batch, loader->batches);
    return GPC_OK;
}

gpc_status gpc_loader_set_state(gpc_loader *loader, const gpc_loader_state *state) {
    GPC_TRY(loader_check_state(loader, state));
    loader->epoch = state->epoch;
    loader->batch = state->batch;
    return GPC_OK;
}
