/*
 * data_internal.h: what the data files of libgpc share but do not publish:
 * shard file names and the dataset.txt writer.
 */
#ifndef GPC_DATA_INTERNAL_H
#define GPC_DATA_INTERNAL_H

#include "gpc/data.h"

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

#endif /* GPC_DATA_INTERNAL_H */
