/*
 * gpc data: token shard files, datasets and the training data loader.
 *
 * A dataset is a folder:
 *   DIR/dataset.txt      "gpc-dataset 1", vocab_size=N, tokens, shard lists (key=value lines)
 *   DIR/tokenizer.bin    the tokenizer (absent for synthetic data)
 *   DIR/train_NNNN.bin   training shards
 *   DIR/val_NNNN.bin     validation shards
 *
 * A shard file starts with a 64-byte header: magic "GPCSHARD", format
 * version, dtype of the tokens (u16 when the vocabulary fits, else u32),
 * token count, vocabulary size, CRC-32C of the payload and of the header;
 * then the tokens. Every file is written atomically and checked on read.
 */
#ifndef GPC_DATA_H
#define GPC_DATA_H

#include "gpc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GPC_SHARD_VERSION 1

typedef struct {
    uint64_t tokens;
    uint32_t vocab_size;
    gpc_dtype dtype; /* GPC_U16 or GPC_U32 */
} gpc_shard_info;

gpc_status gpc_shard_write(const char *path, const uint32_t *tokens, uint64_t count,
                           uint32_t vocab_size);
/* Reads a whole shard; *tokens is gpc_malloc'd (free with gpc_free). Every
 * token is checked against the vocabulary. */
gpc_status gpc_shard_read(const char *path, gpc_shard_info *info, uint32_t **tokens);
/* Reads and checks only the header. */
gpc_status gpc_shard_info_read(const char *path, gpc_shard_info *info);

typedef struct {
    uint32_t vocab_size;
    uint64_t train_tokens;
    uint64_t val_tokens;
    int train_shards;
    int val_shards;
    int has_tokenizer;
} gpc_dataset_info;

gpc_status gpc_dataset_info_read(const char *dir, gpc_dataset_info *info);

/* The loader cuts the token stream of a split into windows of T+1 tokens
 * (stride T), shuffles their order each epoch with the seed (the validation
 * split keeps its order), and hands out B windows per batch: inputs are the
 * first T tokens, targets the next T. With world_size > 1 each rank takes
 * every world_size-th window, so ranks read disjoint data. */
typedef struct gpc_loader gpc_loader;

typedef enum { GPC_SPLIT_TRAIN = 0, GPC_SPLIT_VAL = 1 } gpc_split;

gpc_status gpc_loader_open(gpc_loader **out, const char *dir, gpc_split split, int B, int T,
                           uint64_t seed, int rank, int world_size);
void gpc_loader_close(gpc_loader *loader);
/* Fills inputs and targets (host i32, B*T each). Wraps to a new epoch (and a
 * new shuffle) at the end. */
gpc_status gpc_loader_next(gpc_loader *loader, int32_t *inputs, int32_t *targets);
/* Batches in one epoch for this rank (at least 1). */
uint64_t gpc_loader_batches_per_epoch(const gpc_loader *loader);
uint32_t gpc_loader_vocab_size(const gpc_loader *loader);
/* Back to the first batch of epoch 0 (used before each validation pass). */
void gpc_loader_rewind(gpc_loader *loader);

/* Position for checkpoints: resuming from it continues with the same batches. */
typedef struct {
    uint64_t epoch;
    uint64_t batch; /* next batch within the epoch */
} gpc_loader_state;

void gpc_loader_get_state(const gpc_loader *loader, gpc_loader_state *state);
gpc_status gpc_loader_set_state(gpc_loader *loader, const gpc_loader_state *state);

/* The prefetching loader: the batches of gpc_loader_next, in the same
 * order, prepared ahead by a host thread and delivered on a device.
 *
 * The thread reads the split's shards (so a bad shard is reported by the
 * gpc_prefetch_next that needed it, with gpc_shard_read's message), then
 * cuts batches into a ring of `depth` host buffers: pinned on a GPU, so
 * their copies are asynchronous. On a GPU, gpc_prefetch_next queues the
 * batch's copy on a copy stream into one of two device buffers, makes the
 * compute stream (the default stream, where every op runs) wait for it on
 * the GPU, and queues the next batch's copy too, so it overlaps this step;
 * the host never waits for the device here. A host buffer is filled again
 * only after its copy is done: the thread waits for that, when the ring
 * wraps. On the CPU the batch is the host buffer itself. */
typedef struct gpc_prefetch gpc_prefetch;

typedef struct {
    gpc_tensor inputs;  /* [B, T] i32 on the prefetcher's device */
    gpc_tensor targets; /* [B, T] i32 (-1 would mask a position) */
    int64_t unmasked;   /* targets that are not -1, counted on the host */
} gpc_batch;

#define GPC_PREFETCH_DEPTH 4 /* host buffers when depth is 0 */

/* Opens the split as gpc_loader_open does (same checks and messages, except
 * that the shards' own errors come from gpc_prefetch_next) and starts the
 * thread. depth: host buffers, at least 2 (0: GPC_PREFETCH_DEPTH). */
gpc_status gpc_prefetch_open(gpc_prefetch **out, const char *dir, gpc_split split, int B, int T,
                             uint64_t seed, int rank, int world_size, gpc_device device, int depth);
/* Stops and joins the thread; waits for the copies still queued. */
void gpc_prefetch_close(gpc_prefetch *prefetch);
/* The next batch: the one gpc_loader_next would give. Its tensors stay valid
 * until the next call (or gpc_prefetch_set_state); on a GPU, work queued on
 * the compute stream before that call may read them. The thread's error,
 * if it failed before preparing this batch, is returned here (and again by
 * every later call). */
gpc_status gpc_prefetch_next(gpc_prefetch *prefetch, gpc_batch *batch);
uint64_t gpc_prefetch_batches_per_epoch(const gpc_prefetch *prefetch);
/* The position after the last batch returned (not after those prepared
 * ahead), as gpc_loader_get_state would give it: what a checkpoint stores. */
void gpc_prefetch_get_state(const gpc_prefetch *prefetch, gpc_loader_state *state);
/* Continues from a position (gpc_loader_set_state's checks and message);
 * batches prepared ahead are dropped. */
gpc_status gpc_prefetch_set_state(gpc_prefetch *prefetch, const gpc_loader_state *state);

/* Dataset creation (what `gpc data prepare` and `gpc data synth` do). */

/* What a prepare did, for the summary line. */
typedef struct {
    uint64_t files;         /* text files read */
    uint64_t skipped_files; /* binary files skipped */
    uint64_t documents, train_documents, val_documents;
    uint64_t text_bytes;
    uint64_t train_tokens, val_tokens;
    int vocab_size; /* smaller than asked when the corpus ran out of pairs to merge */
    double seconds;
} gpc_prepare_summary;

/* Progress of a long stage ("reading", "training", "encoding", "writing"). */
typedef void (*gpc_data_progress)(void *user, const char *stage, uint64_t done, uint64_t total);

typedef struct {
    int vocab_size;             /* tokenizer size, default 4096 */
    const char *tokenizer;      /* use this tokenizer instead of training one: a run folder,
                                 * a Hugging Face folder or a tokenizer.bin (gpc_tokenizer_
                                 * load_from); vocab_size is then the tokenizer's */
    double val_fraction;        /* default 0.05 */
    uint64_t shard_tokens;      /* tokens per shard file, default 1<<24 */
    int verbose;                /* progress on stderr (when progress is NULL) */
    gpc_data_progress progress; /* optional */
    void *progress_user;
    gpc_prepare_summary *summary; /* optional: filled on success */
} gpc_prepare_options;

/* The defaults above; passing NULL options means the same. */
void gpc_prepare_options_init(gpc_prepare_options *options);

/* Reads every text file under the paths (folders recursively; binary files
 * such as fortune's .dat indexes are skipped and counted), trains the
 * tokenizer (or loads options->tokenizer), encodes, splits into train/val by
 * document, writes shards. */
gpc_status gpc_data_prepare(const char *const *inputs, int input_count, const char *out_dir,
                            const gpc_prepare_options *options);
gpc_status gpc_data_synth(const char *out_dir, uint32_t vocab_size, uint64_t tokens, uint64_t seed,
                          uint64_t shard_tokens);

#ifdef __cplusplus
}
#endif

#endif /* GPC_DATA_H */
