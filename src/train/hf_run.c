/*
 * hf_run.c: run folders from and to Hugging Face GPT-2 folders (`gpc import
 * hf`, `gpc export hf`).
 *
 * An imported run holds what `gpc sample`, `gpc eval` and `gpc train
 * --init-from` read: checkpoint.bin (the weights in f32, no optimizer state,
 * step 0), tokenizer.bin (GPT-2's, when the folder had vocab.json and
 * merges.txt) and config.txt, which says where the run came from and which
 * tokenizer it has. Both directions read and check everything before they
 * write, and write into a temporary folder renamed at the end, so a failure
 * leaves no output folder behind.
 */
#include "gpc/hf.h"
#include "gpc/model.h"
#include "gpc/tokenizer.h"
#include "gpc/train.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int dir_is_empty(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int empty = 1;
    while (empty && (e = readdir(d)))
        empty = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
    closedir(d);
    return empty;
}

gpc_status gpc_run_save_weights(const char *dir, const gpt_config *config, const float *params) {
    gpt_checkpoint_state state;
    memset(&state, 0, sizeof state);
    state.loss_scale = 1.0f;
    state.recompute = -1; /* no run's settings: a checkpoint of weights */
    char path[4200];
    snprintf(path, sizeof path, "%s/checkpoint.bin", dir);
    /* straight from the array: no model, so the weights are held once */
    return gpt_checkpoint_save_weights(path, config, params, &state);
}

gpc_status gpc_hf_import(const char *hf_dir, const char *run_dir, gpc_hf_summary *summary) {
    double start = gpc_time_seconds();
    if (gpc_path_exists(run_dir))
        return gpc_error(GPC_ERR_INVALID_ARG, "%s already exists; import into a new --out folder",
                         run_dir);
    gpt_config config;
    float *params = NULL;
    gpc_dtype source;
    GPC_TRY(gpc_hf_gpt2_read(hf_dir, &config, &params, &source));
    double t_read = gpc_time_seconds();
    char vocab[4096], merges[4096], tmp[4096], path[4200];
    snprintf(vocab, sizeof vocab, "%s/vocab.json", hf_dir);
    snprintf(merges, sizeof merges, "%s/merges.txt", hf_dir);
    gpc_tokenizer *tok = NULL;
    gpc_status s = GPC_OK;
    if (gpc_path_exists(vocab) && gpc_path_exists(merges)) {
        s = gpc_tokenizer_load_gpt2(&tok, vocab, merges);
        if (s == GPC_OK && gpc_tokenizer_vocab_size(tok) != config.vocab_size)
            s = gpc_error(GPC_ERR_MISMATCH,
                          "%s has %d tokens but config.json's vocab_size is %d: the folder mixes "
                          "a tokenizer and a model that do not belong together",
                          vocab, gpc_tokenizer_vocab_size(tok), config.vocab_size);
    }
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", run_dir, (int)getpid());
    int made = 0;
    if (s == GPC_OK) s = gpc_mkdir_p(tmp);
    made = s == GPC_OK;
    if (s == GPC_OK) s = gpc_run_save_weights(tmp, &config, params);
    gpc_free(params);
    /* where an import's time goes (GPC_LOG=debug) */
    gpc_log(GPC_LOG_DEBUG, "import: read and convert %.2f s, model and checkpoint %.2f s",
            t_read - start, gpc_time_seconds() - t_read);
    if (s == GPC_OK && tok) {
        snprintf(path, sizeof path, "%s/tokenizer.bin", tmp);
        s = gpc_tokenizer_save(tok, path);
    }
    if (s == GPC_OK) {
        char text[8192];
        snprintf(text, sizeof text,
                 "# gpc run imported from a Hugging Face GPT-2 folder\n"
                 "source=hf\nhf_dir=%s\nlayers=%d\nheads=%d\nchannels=%d\ncontext=%d\n"
                 "vocab_size=%d\npadded_vocab=%d\nparameters=%zu\nprecision=f32\n"
                 "source_dtype=%s\ntokenizer=%s\n",
                 hf_dir, config.layers, config.heads, config.channels, config.max_context,
                 config.vocab_size, config.padded_vocab, gpt_config_num_params(&config),
                 gpc_dtype_name(source), tok ? "gpt2" : "none");
        snprintf(path, sizeof path, "%s/config.txt", tmp);
        s = gpc_write_file(path, text, strlen(text));
    }
    if (made) s = gpc_commit_flat_dir(tmp, run_dir, s);
    if (s == GPC_OK && summary) {
        memset(summary, 0, sizeof *summary);
        summary->config = config;
        summary->parameters = gpt_config_num_params(&config);
        summary->dtype = source;
        summary->tokenizer = tok != NULL;
        summary->seconds = gpc_time_seconds() - start;
    }
    gpc_tokenizer_free(tok);
    return s;
}

gpc_status gpc_hf_export(const char *run_dir, const char *hf_dir, gpc_dtype dtype,
                         gpc_hf_summary *summary) {
    double start = gpc_time_seconds();
    char ckpt[4096], tok_path[4096], tmp[4096];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint.bin", run_dir);
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.bin", run_dir);
    if (!gpc_path_exists(ckpt))
        return gpc_error(GPC_ERR_IO,
                         "%s has no checkpoint.bin: give a run folder of gpc train "
                         "or gpc import",
                         run_dir);
    if (gpc_path_exists(hf_dir) && !(gpc_path_is_dir(hf_dir) && dir_is_empty(hf_dir)))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s already exists and is not an empty folder; export into a new --out",
                         hf_dir);
    gpt_config config;
    GPC_TRY(gpt_checkpoint_read_header(ckpt, &config, NULL, NULL));
    gpc_tokenizer *tok = NULL;
    if (gpc_path_exists(tok_path)) GPC_TRY(gpc_tokenizer_load(&tok, tok_path));
    int gpt2 = tok && gpc_tokenizer_get_kind(tok) == GPC_TOKENIZER_GPT2;
    gpt_model *model = NULL;
    float *params = gpc_malloc(gpt_config_num_params(&config) * sizeof *params);
    gpc_status s = params ? GPC_OK : gpc_error(GPC_ERR_NOMEM, "out of host memory");
    if (s == GPC_OK) s = gpt_create(&model, &config, gpc_cpu(), GPC_F32, 1, 1, 0);
    if (s == GPC_OK) s = gpt_checkpoint_load(ckpt, model, NULL);
    if (s == GPC_OK) s = gpt_get_params(model, params);
    gpt_free(model); /* one copy of the weights at a time */
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", hf_dir, (int)getpid());
    int made = 0;
    if (s == GPC_OK) s = gpc_mkdir_p(tmp);
    made = s == GPC_OK;
    if (s == GPC_OK) s = gpc_hf_gpt2_write(tmp, &config, params, dtype);
    if (s == GPC_OK && gpt2) s = gpc_tokenizer_write_gpt2(tok, tmp);
    gpc_free(params);
    if (made) s = gpc_commit_flat_dir(tmp, hf_dir, s);
    if (s == GPC_OK && summary) {
        memset(summary, 0, sizeof *summary);
        summary->config = config;
        summary->parameters = gpt_config_num_params(&config);
        summary->dtype = dtype;
        summary->tokenizer = gpt2;
        summary->tokenizer_skipped = tok && !gpt2;
        summary->seconds = gpc_time_seconds() - start;
    }
    gpc_tokenizer_free(tok);
    return s;
}
