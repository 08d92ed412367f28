/*
 * dataset.c: the dataset folder's description, dataset.txt.
 *
 * dataset.txt is plain key=value lines after the line "gpc-dataset 1", so a
 * person can read it and a later gpc can add keys without breaking this one
 * (unknown keys are ignored). It is written last when a dataset is made,
 * and reading it checks every shard's header against it, so a half-written
 * or mixed-up folder is reported before training starts, not hours later.
 */
#include "train/data_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void data_shard_path(char *buf, size_t size, const char *dir, gpc_split split, int index) {
    snprintf(buf, size, "%s/%s_%04d.bin", dir, split == GPC_SPLIT_TRAIN ? "train" : "val", index);
}

gpc_status data_write_dataset(const char *dir, const data_dataset_meta *m) {
    char text[2048], path[4096];
    const gpc_dataset_info *d = &m->info;
    int n = snprintf(text, sizeof text,
                     DATASET_FIRST_LINE "\n"
                                        "source=%s\n"
                                        "vocab_size=%" PRIu32 "\n"
                                        "train_tokens=%" PRIu64 "\n"
                                        "val_tokens=%" PRIu64 "\n"
                                        "train_shards=%d\n"
                                        "val_shards=%d\n"
                                        "tokenizer=%d\n"
                                        "documents=%" PRIu64 "\n"
                                        "train_documents=%" PRIu64 "\n"
                                        "val_documents=%" PRIu64 "\n"
                                        "text_bytes=%" PRIu64 "\n"
                                        "skipped_files=%" PRIu64 "\n"
                                        "seed=%" PRIu64 "\n",
                     m->source, d->vocab_size, d->train_tokens, d->val_tokens, d->train_shards,
                     d->val_shards, d->has_tokenizer, m->documents, m->train_documents,
                     m->val_documents, m->text_bytes, m->skipped_files, m->seed);
    snprintf(path, sizeof path, "%s/" DATASET_FILE, dir);
    GPC_TRY(gpc_write_file(path, text, (size_t)n));
    /* shards beyond the new counts belong to an earlier dataset in this folder */
    for (int split = 0; split < 2; split++) {
        int first = split == GPC_SPLIT_TRAIN ? d->train_shards : d->val_shards;
        for (int i = first;; i++) {
            data_shard_path(path, sizeof path, dir, (gpc_split)split, i);
            if (unlink(path) != 0) break;
        }
    }
    if (!d->has_tokenizer) {
        snprintf(path, sizeof path, "%s/" DATASET_TOKENIZER_FILE, dir);
        unlink(path);
    }
    return GPC_OK;
}

/* Parses an unsigned decimal value; -1 when it is not one. */
static int parse_u64(const char *text, uint64_t *out) {
    char *end;
    if (*text < '0' || *text > '9') return -1;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

gpc_status gpc_dataset_info_read(const char *dir, gpc_dataset_info *info) {
    memset(info, 0, sizeof *info);
    if (!gpc_path_is_dir(dir))
        return gpc_error(GPC_ERR_IO,
                         "dataset folder %s does not exist; make one with `gpc data prepare "
                         "--input TEXT... --out %s` (or `gpc data synth`)",
                         dir, dir);
    char path[4096];
    snprintf(path, sizeof path, "%s/" DATASET_FILE, dir);
    if (!gpc_path_exists(path))
        return gpc_error(GPC_ERR_IO,
                         "%s is not a gpc dataset (it has no " DATASET_FILE "); make one with "
                         "`gpc data prepare --input TEXT... --out %s`",
                         dir, dir);
    char *text;
    void *check; /* a FIFO or device would block the read below */
    GPC_TRY(gpc_open_regular(path, "dataset description", &check));
    fclose(check);
    GPC_TRY(gpc_read_file(path, &text, NULL));
    const char *redo = "prepare the dataset again";
    gpc_status s = GPC_OK;
    /* the keys that must be there, in the order of the fields they fill */
    static const char *const keys[] = {"vocab_size", "train_tokens", "val_tokens", "train_shards",
                                       "val_shards"};
    uint64_t values[5];
    int seen[5] = {0};
    uint64_t has_tokenizer = 2; /* unknown: look for the file */
    char *line = text, *next;
    int line_number = 0;
    for (; line && s == GPC_OK; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        line_number++;
        size_t len = strlen(line);
        if (len && line[len - 1] == '\r') line[--len] = '\0';
        if (line_number == 1) {
            int version = 0;
            if (sscanf(line, "gpc-dataset %d", &version) != 1)
                s = gpc_error(GPC_ERR_FORMAT,
                              "%s is not a gpc dataset description (its first line should be "
                              "'" DATASET_FIRST_LINE "'); %s",
                              path, redo);
            else if (version != 1)
                s = gpc_error(GPC_ERR_FORMAT,
                              "%s is dataset format version %d; this gpc reads version 1: use "
                              "the gpc that wrote it, or %s",
                              path, version, redo);
            continue;
        }
        if (len == 0 || line[0] == '#') continue;
        char *eq = strchr(line, '=');
        if (!eq) {
            s = gpc_error(GPC_ERR_FORMAT, "%s line %d is not key=value: '%s'; %s", path,
                          line_number, line, redo);
            break;
        }
        *eq = '\0';
        const char *value = eq + 1;
        for (int k = 0; k < 5; k++) {
            if (strcmp(line, keys[k]) != 0) continue;
            if (parse_u64(value, &values[k]) != 0)
                s = gpc_error(GPC_ERR_FORMAT, "%s line %d: %s=%s is not a whole number; %s", path,
                              line_number, line, value, redo);
            seen[k] = 1;
        }
        if (strcmp(line, "tokenizer") == 0 && parse_u64(value, &has_tokenizer) != 0)
            has_tokenizer = 2;
    }
    gpc_free(text);
    if (s != GPC_OK) return s;
    for (int k = 0; k < 5; k++)
        if (!seen[k]) return gpc_error(GPC_ERR_FORMAT, "%s lacks %s=; %s", path, keys[k], redo);
    if (values[0] < 1 || values[0] > UINT32_MAX || values[3] < 1 || values[3] > 9999 ||
        values[4] > 9999)
        return gpc_error(GPC_ERR_FORMAT,
                         "%s has impossible values (vocab_size=%" PRIu64 ", %" PRIu64
                         " and %" PRIu64 " shards); %s",
                         path, values[0], values[3], values[4], redo);
    info->vocab_size = (uint32_t)values[0];
    info->train_tokens = values[1];
    info->val_tokens = values[2];
    info->train_shards = (int)values[3];
    info->val_shards = (int)values[4];
    snprintf(path, sizeof path, "%s/" DATASET_TOKENIZER_FILE, dir);
    info->has_tokenizer = has_tokenizer == 2 ? gpc_path_exists(path) : has_tokenizer != 0;
    if (info->has_tokenizer && !gpc_path_exists(path))
        return gpc_error(GPC_ERR_IO, "dataset %s lacks its %s; %s", dir, DATASET_TOKENIZER_FILE,
                         redo);
    /* every shard's header must agree with the description */
    for (int split = 0; split < 2; split++) {
        int shards = split == GPC_SPLIT_TRAIN ? info->train_shards : info->val_shards;
        uint64_t want = split == GPC_SPLIT_TRAIN ? info->train_tokens : info->val_tokens, sum = 0;
        for (int i = 0; i < shards; i++) {
            gpc_shard_info shard;
            data_shard_path(path, sizeof path, dir, (gpc_split)split, i);
            GPC_TRY(gpc_shard_info_read(path, &shard));
            if (shard.vocab_size != info->vocab_size)
                return gpc_error(GPC_ERR_MISMATCH,
                                 "%s is for a vocabulary of %u but dataset %s says %u; the folder "
                                 "mixes two datasets: %s",
                                 path, shard.vocab_size, dir, info->vocab_size, redo);
            sum += shard.tokens;
        }
        if (sum != want)
            return gpc_error(GPC_ERR_MISMATCH,
                             "dataset %s says %" PRIu64 " %s tokens but its shards hold %" PRIu64
                             "; %s",
                             dir, want, split == GPC_SPLIT_TRAIN ? "train" : "val", sum, redo);
    }
    return GPC_OK;
}
