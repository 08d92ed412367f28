/*
 * data_internal.h: what the data files of libgpc share but do not publish:
 * shard file names, the dataset.txt writer and the loader's two-step open.
 */
#ifndef GPC_DATA_INTERNAL_H
#define GPC_DATA_INTERNAL_H

#include "gpc/data.h"

#include <stdatomic.h>
#include <stdio.h>

#define DATASET_FILE "dataset.txt"
#define DATASET_FIRST_LINE "gpc-dataset 1"
#define DATASET_TOKENIZER_FILE "tokenizer.bin"

/* DIR/train_0003.bin or DIR/val_0003.bin. */
void data_shard_path(char *buf, size_t size, const char *dir, gpc_split split, int index);

/* What dataset.txt records beyond gpc_dataset_info. */
typedef struct {
    gpc_dataset_info info;
    const char *source; /* "prepare" or "synth" */
    uint64_t documents, train_documents, val_documents;
    uint64_t text_bytes;
    uint64_t skipped_files;
    uint64_t seed;
} data_dataset_meta;

/* Writes DIR/dataset.txt atomically (written last, so its presence means the
 * dataset is complete) and removes shards of an earlier, bigger dataset. */
gpc_status data_write_dataset(const char *dir, const data_dataset_meta *meta);

/* gpc_loader_open in two halves, for the prefetch thread: the checks, the
 * sizes (from dataset.txt) and the window order, then the shards' tokens.
 * gpc_loader_next needs loader_load first, which stops between shards with
 * GPC_ERR_INTERRUPTED once *cancel (optional) is set. */
gpc_status loader_open_unloaded(gpc_loader **out, const char *dir, gpc_split split, int B, int T,
                                uint64_t seed, int rank, int world_size);
gpc_status loader_load(gpc_loader *loader, atomic_int *cancel);
/* gpc_loader_set_state's check alone: whether the position exists. */
gpc_status loader_check_state(const gpc_loader *loader, const gpc_loader_state *state);

#endif /* GPC_DATA_INTERNAL_H */
