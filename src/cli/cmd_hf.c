/*
 * cmd_hf.c: `gpc import hf DIR --out RUN` and `gpc export hf RUN --out DIR`:
 * Hugging Face GPT-2 folders to gpc run folders and back. The work is in
 * libgpc (gpc_hf_import, gpc_hf_export in src/train/hf_run.c).
 */
#include "cli.h"
#include "gpc/train.h"

#include <stdio.h>
#include <string.h>

static void print_summary(const char *verb, const char *from, const char *to,
                          const gpc_hf_summary *s, const char *dtype_word) {
    char took[32];
    printf("%s %s -> %s: GPT-2 of %d layers, %d heads, %d channels, %d positions, %d tokens "
           "(%zu parameters, %s), tokenizer: %s, in %s\n",
           verb, from, to, s->config.layers, s->config.heads, s->config.channels,
           s->config.max_context, s->config.vocab_size, s->parameters, dtype_word,
           s->tokenizer           ? "GPT-2's"
           : s->tokenizer_skipped ? "gpc's, not written (Hugging Face has no format for it)"
                                  : "none",
           cli_format_duration(s->seconds, took, sizeof took));
}

/* "hf" must come first: the only format today, named so that others can follow */
static int need_hf(const char *command, int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "hf") != 0) {
        if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) return 0;
        return cli_usage_error(command, "say the format: gpc %s hf ... (Hugging Face GPT-2)",
                               command);
    }
    return 0;
}

int cmd_import(int argc, char **argv) {
    int rc = need_hf("import", argc, argv);
    if (rc) return rc;
    const char *out = NULL, *positional[1] = {NULL};
    int positional_count = 0;
    const cli_option options[] = {
        {"out", CLI_STRING, &out, "RUN", "run folder to write (must not exist)"},
        {NULL, 0, NULL, NULL, NULL},
    };
    const cli_spec spec = {
        "import hf",
        "import hf DIR --out RUN",
        "Reads a transformers GPT-2 folder (config.json, model.safetensors or its shards, and "
        "vocab.json + merges.txt when there) into a run folder that gpc sample, gpc eval and "
        "gpc train --init-from use. Weights may be f32, f16 or bf16; they are stored in f32.",
        options,
        1,
        positional,
        &positional_count,
    };
    if (argc >= 2 && strcmp(argv[1], "hf") == 0) argc--, argv++;
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    if (positional_count != 1) return cli_usage_error("import", "give the folder to import");
    if (!out) return cli_usage_error("import", "--out RUN is required");
    gpc_hf_summary summary;
    gpc_status s = gpc_hf_import(positional[0], out, &summary);
    if (s != GPC_OK) return cli_fail("import", s);
    print_summary("imported", positional[0], out, &summary, gpc_dtype_name(summary.dtype));
    return CLI_EXIT_OK;
}

int cmd_export(int argc, char **argv) {
    int rc = need_hf("export", argc, argv);
    if (rc) return rc;
    const char *out = NULL, *dtype_name = "f32", *positional[1] = {NULL};
    int positional_count = 0;
    const cli_option options[] = {
        {"out", CLI_STRING, &out, "DIR", "folder to write (must not exist, or be empty)"},
        {"dtype", CLI_STRING, &dtype_name, "T", "f32, bf16 or fp16 weights (default f32)"},
        {NULL, 0, NULL, NULL, NULL},
    };
    const cli_spec spec = {
        "export hf",
        "export hf RUN --out DIR [--dtype T]",
        "Writes a run's weights as a transformers GPT-2 folder (config.json, model.safetensors, "
        "and vocab.json + merges.txt when the run has GPT-2's tokenizer) that "
        "GPT2LMHeadModel.from_pretrained(DIR) loads.",
        options,
        1,
        positional,
        &positional_count,
    };
    if (argc >= 2 && strcmp(argv[1], "hf") == 0) argc--, argv++;
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    if (positional_count != 1) return cli_usage_error("export", "give the run folder to export");
    if (!out) return cli_usage_error("export", "--out DIR is required");
    int dtype;
    if ((rc = cli_precision("export", dtype_name, &dtype))) return rc;
    gpc_hf_summary summary;
    gpc_status s = gpc_hf_export(positional[0], out, (gpc_dtype)dtype, &summary);
    if (s != GPC_OK) return cli_fail("export", s);
    print_summary("exported", positional[0], out, &summary, gpc_dtype_name(summary.dtype));
    return CLI_EXIT_OK;
}
