/*
 * quant_run.c: `gpc quantize RUN --to int8|fp8 --out RUN2`: a run's weights
 * quantized for inference (src/model/quant.c), written as a run folder
 * RUN2 holding quant.bin, RUN's tokenizer.bin and a config.txt that names
 * the source run and the quantization.
 *
 * Everything is read, quantized and measured first; the folder is written
 * as RUN2.tmp.PID and renamed at the end, so a failure leaves no RUN2.
 */
#include "gpc/model.h"
#include "gpc/train.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Whether a folder holds anything besides . and .. */
static int dir_has_entries(const char *path) {
    DIR *d = opendir(path);
    if (!d) return 1; /* unreadable: treat as in use */
    const struct dirent *e;
    int any = 0;
    while (!any && (e = readdir(d)) != NULL)
        any = strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return any;
}

/* The relative error ||W - deq(q(W))|| / ||W|| over the quantized
 * matrices, in double: the figure config.txt and docs/quantize.md give. */
static double relative_error(const gpt_config *config, const float *w, const float *deq) {
    gpt_model *probe = NULL;
    double diff = 0, norm = 0;
    if (gpt_create(&probe, config, gpc_cpu(), GPC_F32, 1, 1, 0) != GPC_OK) return NAN;
    const size_t *off = gpt_param_offsets(probe);
    size_t P = gpt_num_params(probe);
    for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++) {
        if (!gpt_param_quantized(i)) continue;
        size_t end = i + 1 < GPT_NUM_PARAM_TENSORS ? off[i + 1] : P;
        for (size_t k = off[i]; k < end; k++) {
            double d = (double)w[k] - (double)deq[k];
            diff += d * d;
            norm += (double)w[k] * (double)w[k];
        }
    }
    gpt_free(probe);
    return norm > 0 ? sqrt(diff / norm) : 0.0;
}

gpc_status gpc_quantize_run(const char *run_dir, const char *out_dir,
                            const gpt_quant_options *quant, gpc_quantize_summary *summary) {
    char ckpt[4200], path[4400], tmp[4200];
    if (!gpc_path_is_dir(run_dir))
        return gpc_error(GPC_ERR_IO,
                         "run folder %s does not exist (train one with gpc train --out %s, or "
                         "import one with gpc import hf)",
                         run_dir, run_dir);
    snprintf(path, sizeof path, "%s/quant.bin", run_dir);
    if (gpc_path_exists(path))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s is already quantized (it holds quant.bin); quantize the run it came "
                         "from (source_run in its config.txt)",
                         run_dir);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint.bin", run_dir);
    if (!gpc_path_exists(ckpt))
        return gpc_error(GPC_ERR_IO,
                         "%s has no checkpoint.bin: train it first (gpc train --out %s)", run_dir,
                         run_dir);
    if (gpc_path_exists(out_dir) && (!gpc_path_is_dir(out_dir) || dir_has_entries(out_dir)))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%s already exists and is not an empty folder; quantize into a new --out "
                         "folder",
                         out_dir);
    gpt_config config;
    gpc_dtype precision;
    GPC_TRY(gpt_checkpoint_read_header(ckpt, &config, &precision, NULL));
    size_t P = gpt_config_num_params(&config);
    float *values = gpc_malloc(P * sizeof *values), *deq = gpc_malloc(P * sizeof *deq);
    gpt_model *plain = NULL, *quantized = NULL;
    gpc_status s = values && deq
                       ? GPC_OK
                       : gpc_error(GPC_ERR_NOMEM, "out of host memory quantizing %s", run_dir);
    if (s == GPC_OK) s = gpt_create(&plain, &config, gpc_cpu(), GPC_F32, 1, 1, 0);
    if (s == GPC_OK) s = gpt_checkpoint_load(ckpt, plain, NULL);
    if (s == GPC_OK) s = gpt_get_params(plain, values);
    gpt_free(plain);
    if (s == GPC_OK) s = gpt_create_quant(&quantized, &config, gpc_cpu(), GPC_F32, 1, 1, quant);
    if (s == GPC_OK) s = gpt_set_params(quantized, values);
    if (s == GPC_OK) s = gpt_get_params(quantized, deq);
    double error = s == GPC_OK ? relative_error(&config, values, deq) : 0.0;
    gpc_free(values);
    gpc_free(deq);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", out_dir, (int)getpid());
    int made = 0;
    if (s == GPC_OK) {
        s = gpc_mkdir_p(tmp);
        made = s == GPC_OK;
    }
    if (s == GPC_OK) {
        snprintf(path, sizeof path, "%s/quant.bin", tmp);
        s = gpt_quant_save(path, quantized, precision);
    }
    gpt_free(quantized);
    char tok[4200];
    snprintf(tok, sizeof tok, "%s/tokenizer.bin", run_dir);
    if (s == GPC_OK && gpc_path_exists(tok)) {
        snprintf(path, sizeof path, "%s/tokenizer.bin", tmp);
        s = gpc_copy_file(tok, path);
    }
    size_t bf16_bytes = P * 2, bytes = gpt_quant_weight_bytes(&config, quant, 2);
    if (s == GPC_OK) {
        char text[8800];
        snprintf(text, sizeof text,
                 "# gpc run: weights quantized for inference (gpc quantize)\n"
                 "source=quantize\nsource_run=%s\nquantization=%s\nsource_precision=%s\n"
                 "layers=%d\nheads=%d\nchannels=%d\ncontext=%d\nvocab_size=%d\n"
                 "padded_vocab=%d\nparameters=%zu\nweight_relative_error=%.6g\n",
                 run_dir, gpt_quant_name(quant), gpc_dtype_name(precision), config.layers,
                 config.heads, config.channels, config.max_context, config.vocab_size,
                 config.padded_vocab, P, error);
        snprintf(path, sizeof path, "%s/config.txt", tmp);
        s = gpc_write_file(path, text, strlen(text));
    }
    if (made) s = gpc_commit_flat_dir(tmp, out_dir, s);
    if (s == GPC_OK && summary) {
        summary->config = config;
        summary->relative_error = error;
        summary->bf16_bytes = bf16_bytes;
        summary->quant_bytes = bytes;
    }
    return s;
}
