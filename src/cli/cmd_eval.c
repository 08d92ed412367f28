/*
 * cmd_eval.c: `gpc eval --run RUN (--data DIR | --text-file F)`: the mean
 * cross-entropy and perplexity of a run's model on a dataset's validation
 * tokens or on a text (tokenized with the run's tokenizer), and with --json
 * the cross-entropy of every token. What a user runs to check an imported
 * or fine-tuned model. The work is gpc_eval_tokens (src/train/eval.c).
 */
#include "cli.h"
#include "gpc/data.h"
#include "gpc/model.h"
#include "gpc/tokenizer.h"
#include "gpc/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME "eval"

/* The validation split of a dataset, all shards in order. */
static gpc_status read_val(const char *dir, uint32_t **tokens, size_t *count) {
    gpc_dataset_info info;
    GPC_TRY(gpc_dataset_info_read(dir, &info));
    if (info.val_shards < 1 || info.val_tokens < 2)
        return gpc_error(GPC_ERR_INVALID_ARG, "%s has no validation tokens to evaluate on", dir);
    uint32_t *all = gpc_malloc(info.val_tokens * sizeof *all);
    if (!all) return gpc_error(GPC_ERR_NOMEM, "out of host memory");
    size_t at = 0;
    for (int i = 0; i < info.val_shards; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/val_%04d.bin", dir, i);
        gpc_shard_info si;
        uint32_t *part;
        gpc_status s = gpc_shard_read(path, &si, &part);
        if (s == GPC_OK && at + si.tokens > info.val_tokens)
            s = gpc_error(GPC_ERR_FORMAT, "%s holds more tokens than dataset.txt says", dir);
        if (s != GPC_OK) {
            gpc_free(all);
            return s;
        }
        memcpy(all + at, part, si.tokens * sizeof *part);
        at += si.tokens;
        gpc_free(part);
    }
    *tokens = all;
    *count = at;
    return GPC_OK;
}

static gpc_status write_json(const char *path, const char *run, const gpc_eval_result *r,
                             const float *losses) {
    FILE *f = fopen(path, "w");
    if (!f) return gpc_error(GPC_ERR_IO, "cannot write %s", path);
    fprintf(f,
            "{\"run\": \"%s\", \"tokens\": %lld, \"mean_loss\": %.9g, \"perplexity\": %.9g, "
            "\"losses\": [",
            run, (long long)r->tokens, r->mean_loss, r->perplexity);
    for (int64_t i = 0; i < r->tokens; i++)
        fprintf(f, i ? ", %.7g" : "%.7g", (double)losses[i]);
    fprintf(f, "]}\n");
    if (fclose(f) != 0) return gpc_error(GPC_ERR_IO, "cannot write %s", path);
    return GPC_OK;
}

int cmd_eval(int argc, char **argv) {
    const char *run = NULL, *data = NULL, *text_file = NULL, *device_name = "auto",
               *precision_name = NULL, *json = NULL;
    int context = 0;
    const cli_option options[] = {
        {"run", CLI_STRING, &run, "RUN", "run folder (gpc train or gpc import hf)"},
        {"data", CLI_STRING, &data, "DIR", "evaluate on the validation split of this dataset"},
        {"text-file", CLI_STRING, &text_file, "F", "evaluate on this text (the run's tokenizer)"},
        {"context", CLI_INT, &context, "T", "tokens a prediction sees (default: the model's)"},
        {"device", CLI_STRING, &device_name, "DEV", "auto, cpu or cuda[:N] (default auto)"},
        {"precision", CLI_STRING, &precision_name, "P",
         "f32, bf16 or fp16 (default f32 on the CPU, bf16 on a GPU)"},
        {"json", CLI_STRING, &json, "FILE", "write the result and every token's loss here"},
        {NULL, 0, NULL, NULL, NULL},
    };
    const cli_spec spec = {
        NAME,
        "eval --run RUN (--data DIR | --text-file F) [--context T] [--device D] [--precision P] "
        "[--json FILE]",
        "Prints the mean cross-entropy (nats per token) and perplexity of the run's model on a "
        "dataset's validation tokens or on a text, in windows of T tokens.",
        options,
        0,
        NULL,
        NULL,
    };
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    int rc;
    if (!run) return cli_usage_error(NAME, "--run RUN is required");
    if (!data == !text_file) return cli_usage_error(NAME, "give --data DIR or --text-file F");
    if (context < 0) return cli_usage_error(NAME, "--context must be positive");
    int precision = -1;
    if (precision_name && (rc = cli_precision(NAME, precision_name, &precision))) return rc;
    gpc_device device;
    gpc_status s = gpc_device_parse(device_name, &device);
    if (s != GPC_OK) return cli_fail(NAME, s);
    if (precision < 0) precision = device.type == GPC_DEVICE_CPU ? GPC_F32 : GPC_BF16;
    if (device.type == GPC_DEVICE_CPU && precision != GPC_F32)
        return cli_usage_error(NAME, "the CPU computes in f32 only; bf16 and fp16 need a GPU");
    char weights[4200];
    gpt_config config;
    gpt_quant_options quant;
    uint32_t *tokens = NULL;
    size_t count = 0;
    s = gpt_run_weights(run, weights, sizeof weights, &config, &quant);
    if (s == GPC_OK && data) s = read_val(data, &tokens, &count);
    if (s == GPC_OK && text_file) {
        gpc_tokenizer *tok = NULL;
        char *text = NULL;
        size_t bytes;
        s = gpc_tokenizer_load_from(&tok, run);
        if (s == GPC_OK) s = gpc_read_file(text_file, &text, &bytes);
        if (s == GPC_OK) s = gpc_tokenizer_encode(tok, text, bytes, &tokens, &count);
        gpc_free(text);
        gpc_tokenizer_free(tok);
    }
    if (s == GPC_OK && context == 0) context = config.max_context;
    if (s == GPC_OK && context > config.max_context)
        s = gpc_error(GPC_ERR_INVALID_ARG, "--context %d is more than the model's %d positions",
                      context, config.max_context);
    gpt_model *model = NULL;
    if (s == GPC_OK) s = gpt_create_from_run(&model, run, device, (gpc_dtype)precision, 1, context);
    float *losses = NULL;
    if (s == GPC_OK) {
        losses = malloc((count ? count : 1) * sizeof *losses);
        if (!losses) s = gpc_error(GPC_ERR_NOMEM, "out of host memory");
    }
    gpc_eval_result r;
    if (s == GPC_OK) s = gpc_eval_tokens(model, &config, context, tokens, count, losses, &r);
    if (s == GPC_OK && json) s = write_json(json, run, &r, losses);
    if (s == GPC_OK)
        printf("eval %s on %s: %lld tokens, mean cross-entropy %.6f nats, perplexity %.4f "
               "(context %d, %s, %s%s%s)\n",
               run, data ? data : text_file, (long long)r.tokens, r.mean_loss, r.perplexity,
               context, gpc_device_name(device), gpc_dtype_name((gpc_dtype)precision),
               quant.dtype != GPC_F32 ? ", weights " : "",
               quant.dtype != GPC_F32 ? gpt_quant_name(&quant) : "");
    free(losses);
    gpc_free(tokens);
    gpt_free(model);
    if (s != GPC_OK) return cli_fail(NAME, s);
    return CLI_EXIT_OK;
}
