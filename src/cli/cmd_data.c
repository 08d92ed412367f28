/*
 * cmd_data.c: `gpc data prepare` (text to tokenizer and token shards) and
 * `gpc data synth` (random tokens for benchmarks).
 *
 * The work is in libgpc (gpc_data_prepare, gpc_data_synth); this file checks
 * the options, shows progress and prints the one-line summary.
 */
#include "cli/cli.h"
#include "gpc/data.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static void data_print_actions(FILE *out) {
    fprintf(out, "usage: gpc data ACTION [OPTIONS]\n\n"
                 "actions:\n"
                 "  prepare  train a tokenizer on text files and write token shards\n"
                 "  synth    write shards of random tokens (for benchmarks)\n\n"
                 "Run 'gpc data ACTION --help' for an action's options.\n");
}

typedef struct {
    cli_progress line;
    const char *stage;
} data_progress;

static void data_show_progress(void *user, const char *stage, uint64_t done, uint64_t total) {
    data_progress *p = user;
    int changed = p->stage != stage;
    if (changed && p->stage) cli_progress_end(&p->line);
    p->stage = stage;
    const char *what = strcmp(stage, "reading") == 0    ? "files read"
                       : strcmp(stage, "training") == 0 ? "tokenizer merges"
                       : strcmp(stage, "encoding") == 0 ? "documents encoded"
                                                        : "tokens written";
    cli_progress_update(&p->line, changed || done == total,
                        "gpc data prepare: %s %" PRIu64 "/%" PRIu64 " %s", stage, done, total,
                        what);
}

static int data_prepare(int argc, char **argv) {
    cli_list inputs = {NULL, 0};
    const char *out = NULL;
    int vocab = 4096;
    const char *tokenizer = NULL;
    double val_fraction = 0.05;
    const cli_option options[] = {
        {"input", CLI_STRING_LIST, &inputs, "PATH...",
         "text files or folders (read recursively; binary files are skipped)"},
        {"out", CLI_STRING, &out, "DIR", "dataset folder to write"},
        {"vocab-size", CLI_INT, &vocab, "N", "tokenizer vocabulary, 257 to 65536 (default 4096)"},
        {"tokenizer", CLI_STRING, &tokenizer, "RUN",
         "use the tokenizer of RUN (a run folder such as gpc import hf writes, a Hugging Face "
         "folder, or a tokenizer.bin) instead of training one"},
        {"val-fraction", CLI_FLOAT, &val_fraction, "F",
         "share of documents for validation, 0 to 0.5 (default 0.05)"},
        {NULL, 0, NULL, NULL, NULL},
    };
    const cli_spec spec = {
        "data prepare",
        "data prepare --input PATH... --out DIR [--vocab-size N | --tokenizer RUN] "
        "[--val-fraction F]",
        "Trains a byte-level BPE tokenizer on the text under PATH (or takes RUN's, such as\n"
        "GPT-2's) and writes DIR/tokenizer.bin,\n"
        "token shards DIR/train_NNNN.bin and DIR/val_NNNN.bin, and DIR/dataset.txt. Each file\n"
        "is a document, and a line holding only '%' separates documents within a file (the\n"
        "fortune format); documents, not tokens, are split between training and validation.",
        options,
        0,
        NULL,
        NULL};
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    if (inputs.count == 0)
        return cli_usage_error(spec.name, "--input PATH... is required: the text to learn from");
    if (!out) return cli_usage_error(spec.name, "--out DIR is required: where the dataset goes");
    if (vocab < 257 || vocab > 65536)
        return cli_usage_error(spec.name, "--vocab-size %d is out of range: use 257 to 65536",
                               vocab);
    if (!(val_fraction >= 0 && val_fraction <= 0.5))
        return cli_usage_error(spec.name, "--val-fraction %g is out of range: use 0 to 0.5",
                               val_fraction);
    data_progress progress;
    memset(&progress, 0, sizeof progress);
    cli_progress_init(&progress.line);
    gpc_prepare_summary summary;
    gpc_prepare_options o;
    gpc_prepare_options_init(&o);
    o.vocab_size = vocab;
    o.tokenizer = tokenizer;
    o.val_fraction = val_fraction;
    o.verbose = 1;
    o.progress = data_show_progress;
    o.progress_user = &progress;
    o.summary = &summary;
    gpc_status s = gpc_data_prepare(inputs.items, inputs.count, out, &o);
    cli_progress_end(&progress.line);
    if (s != GPC_OK) return cli_fail(spec.name, s);
    char size[32];
    uint64_t tokens = summary.train_tokens + summary.val_tokens;
    printf("prepared %s: %" PRIu64 " documents from %" PRIu64 " files (%" PRIu64
           " binary skipped), %s of text, tokens train %" PRIu64 " / val %" PRIu64
           ", vocab %d, %.2f bytes/token, %.1f s\n",
           out, summary.documents, summary.files, summary.skipped_files,
           cli_format_bytes((double)summary.text_bytes, size, sizeof size), summary.train_tokens,
           summary.val_tokens, summary.vocab_size,
           tokens ? (double)summary.text_bytes / (double)tokens : 0.0, summary.seconds);
    if (!tokenizer && summary.vocab_size < vocab)
        printf("note: the text ran out of pairs to merge, so the vocabulary is %d, not %d\n",
               summary.vocab_size, vocab);
    return CLI_EXIT_OK;
}

static int data_synth(int argc, char **argv) {
    int64_t vocab = INT64_MIN, tokens = INT64_MIN, seed = 1; /* INT64_MIN: not given */
    const char *out = NULL;
    const cli_option options[] = {
        {"vocab", CLI_INT64, &vocab, "N", "vocabulary size, 2 to 2147483648 (GPT-2: 50257)"},
        {"tokens", CLI_INT64, &tokens, "M", "number of tokens (1/20 go to validation)"},
        {"out", CLI_STRING, &out, "DIR", "dataset folder to write"},
        {"seed", CLI_INT64, &seed, "S", "random seed (default 1)"},
        {NULL, 0, NULL, NULL, NULL},
    };
    const cli_spec spec = {
        "data synth",
        "data synth --vocab N --tokens M --out DIR [--seed S]",
        "Writes shards of uniformly random tokens in [0, N) and DIR/dataset.txt, for measuring\n"
        "training speed (throughput does not depend on the text). There is no tokenizer.",
        options,
        0,
        NULL,
        NULL};
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    if (vocab == INT64_MIN) return cli_usage_error(spec.name, "--vocab N is required");
    if (tokens == INT64_MIN) return cli_usage_error(spec.name, "--tokens M is required");
    if (!out) return cli_usage_error(spec.name, "--out DIR is required");
    if (vocab < 2 || vocab > ((int64_t)1 << 31))
        return cli_usage_error(spec.name,
                               "--vocab %" PRId64 " is out of range: use 2 to 2147483648", vocab);
    if (tokens <= 0)
        return cli_usage_error(spec.name, "--tokens %" PRId64 " must be at least 1", tokens);
    double t0 = gpc_time_seconds();
    gpc_status s = gpc_data_synth(out, (uint32_t)vocab, (uint64_t)tokens, (uint64_t)seed, 0);
    if (s != GPC_OK) return cli_fail(spec.name, s);
    gpc_dataset_info info;
    s = gpc_dataset_info_read(out, &info);
    if (s != GPC_OK) return cli_fail(spec.name, s);
    printf("wrote %s: %" PRIu64 " train + %" PRIu64 " val random tokens, vocab %u, %.1f s\n", out,
           info.train_tokens, info.val_tokens, info.vocab_size, gpc_time_seconds() - t0);
    return CLI_EXIT_OK;
}

int cmd_data(int argc, char **argv) {
    if (argc < 2)
        return cli_usage_error("data", "say which action: prepare (text to token shards) or "
                                       "synth (random tokens)");
    const char *action = argv[1];
    if (strcmp(action, "--help") == 0 || strcmp(action, "-h") == 0) {
        data_print_actions(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(action, "prepare") == 0) return data_prepare(argc - 1, argv + 1);
    if (strcmp(action, "synth") == 0) return data_synth(argc - 1, argv + 1);
    return cli_usage_error("data", "unknown action '%s': use prepare or synth", action);
}
