/*
 * lora_run.c: `gpc merge RUN --out RUN2`: the LoRA adapters of a run
 * (RUN/lora.bin) folded into the weights of their base run, written as a
 * plain run folder that gpc sample, gpc eval, gpc export hf and gpc train
 * --init-from read like any other.
 *
 * Everything is read and merged first; the folder is written as RUN2.tmp.PID
 * and renamed at the end, so a failure leaves no RUN2 behind.
 */
#include "gpc/model.h"
#include "gpc/train.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The merged weights: the base run's checkpoint under the adapters. */
static gpc_status merged_weights(const char *lora_path, gpt_config *config, float **out,
                                 gpt_lora_options *lora, char *base, size_t base_size) {
    *out = NULL;
    GPC_TRY(gpt_lora_read_header(lora_path, config, lora, NULL, base, base_size));
    char path[4200];
    snprintf(path, sizeof path, "%s/checkpoint.bin", base);
    gpt_config base_config;
    gpc_status s = gpt_checkpoint_read_header(path, &base_config, NULL, NULL);
    if (s != GPC_OK) return gpc_error_context(s, "the base run of %s (%s): ", lora_path, base);
    if (!gpt_config_equal(&base_config, config, "the base run"))
        return gpc_error_context(GPC_ERR_MISMATCH, "%s does not fit its base run %s: ", lora_path,
                                 base);
    gpt_model *plain = NULL, *adapted = NULL;
    size_t P = gpt_config_num_params(config);
    float *values = gpc_malloc(P * sizeof *values);
    if (!values) return gpc_error(GPC_ERR_NOMEM, "out of host memory merging %s", lora_path);
    s = gpt_create(&plain, config, gpc_cpu(), GPC_F32, 1, 1, 0);
    if (s == GPC_OK) s = gpt_checkpoint_load(path, plain, NULL);
    if (s == GPC_OK) s = gpt_get_params(plain, values);
    if (s == GPC_OK) s = gpt_create_lora(&adapted, config, gpc_cpu(), GPC_F32, 1, 1, 0, 0, lora);
    if (s == GPC_OK) s = gpt_set_params(adapted, values);
    if (s == GPC_OK) s = gpt_lora_load(lora_path, adapted, NULL);
    if (s == GPC_OK) s = gpt_lora_merged_params(adapted, values);
    gpt_free(plain);
    gpt_free(adapted);
    if (s != GPC_OK) {
        gpc_free(values);
        return s;
    }
    *out = values;
    return GPC_OK;
}

gpc_status gpc_lora_merge(const char *run_dir, const char *out_dir) {
    char lora_path[4200], base[4096], tmp[4200], path[4400];
    snprintf(lora_path, sizeof lora_path, "%s/lora.bin", run_dir);
    if (!gpc_path_exists(lora_path))
        return gpc_error(GPC_ERR_IO, "%s has no lora.bin: give a run trained with gpc train --lora",
                         run_dir);
    if (gpc_path_exists(out_dir))
        return gpc_error(GPC_ERR_INVALID_ARG, "%s already exists; merge into a new --out folder",
                         out_dir);
    gpt_config config;
    gpt_lora_options lora;
    float *values;
    GPC_TRY(merged_weights(lora_path, &config, &values, &lora, base, sizeof base));
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", out_dir, (int)getpid());
    gpc_status s = gpc_mkdir_p(tmp);
    int made = s == GPC_OK;
    if (s == GPC_OK) s = gpc_run_save_weights(tmp, &config, values);
    gpc_free(values);
    /* the tokenizer: the LoRA run's (its dataset's), else the base's */
    char tok[4200];
    snprintf(tok, sizeof tok, "%s/tokenizer.bin", run_dir);
    if (!gpc_path_exists(tok)) snprintf(tok, sizeof tok, "%s/tokenizer.bin", base);
    if (s == GPC_OK && gpc_path_exists(tok)) {
        snprintf(path, sizeof path, "%s/tokenizer.bin", tmp);
        s = gpc_copy_file(tok, path);
    }
    if (s == GPC_OK) {
        char text[8800];
        snprintf(text, sizeof text,
                 "# gpc run: LoRA adapters merged into their base\n"
                 "source=merge\nlora_run=%s\nbase_run=%s\nlora=%d\nlora_alpha=%g\n"
                 "lora_targets=%u\nlayers=%d\nheads=%d\nchannels=%d\ncontext=%d\n"
                 "vocab_size=%d\npadded_vocab=%d\nparameters=%zu\nprecision=f32\n",
                 run_dir, base, lora.rank, (double)lora.alpha, lora.targets, config.layers,
                 config.heads, config.channels, config.max_context, config.vocab_size,
                 config.padded_vocab, gpt_config_num_params(&config));
        snprintf(path, sizeof path, "%s/config.txt", tmp);
        s = gpc_write_file(path, text, strlen(text));
    }
    return made ? gpc_commit_flat_dir(tmp, out_dir, s) : s;
}
