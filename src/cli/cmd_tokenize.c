/*
 * cmd_tokenize.c: `gpc tokenize --run RUN (--text S | --text-file F)
 * [--decode]`: the token ids of a text as a JSON array, or, with --decode,
 * the text of a JSON array of ids, with the tokenizer of a run folder, a
 * dataset or a Hugging Face folder.
 */
#include "cli.h"
#include "gpc/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME "tokenize"

static gpc_status decode(const gpc_tokenizer *tok, const char *text, size_t bytes) {
    json_error_t err;
    json_t *ids = json_loadb(text, bytes, 0, &err);
    if (!json_is_array(ids)) {
        json_decref(ids);
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--decode reads a JSON array of token ids, such as [15496, 995]");
    }
    size_t n = json_array_size(ids);
    uint32_t *list = malloc((n ? n : 1) * sizeof *list);
    gpc_status s = list ? GPC_OK : gpc_error(GPC_ERR_NOMEM, "out of memory");
    for (size_t i = 0; s == GPC_OK && i < n; i++) {
        json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT32_MAX)
            s = gpc_error(GPC_ERR_INVALID_ARG, "entry %zu of the array is not a token id", i);
        else
            list[i] = (uint32_t)json_integer_value(v);
    }
    char *out = NULL;
    size_t out_bytes = 0;
    if (s == GPC_OK) s = gpc_tokenizer_decode(tok, list, n, &out, &out_bytes);
    if (s == GPC_OK) fwrite(out, 1, out_bytes, stdout);
    gpc_free(out);
    free(list);
    json_decref(ids);
    return s;
}

static void print_ids(const uint32_t *ids, size_t n) {
    putchar('[');
    for (size_t i = 0; i < n; i++)
        printf(i ? ", %u" : "%u", ids[i]);
    puts("]");
}

int cmd_tokenize(int argc, char **argv) {
    const char *run = NULL, *text = NULL, *text_file = NULL;
    int do_decode = 0;
    const cli_option options[] = {
        {"run", CLI_STRING, &run, "RUN",
         "run folder (or dataset, Hugging Face folder, tokenizer.bin) whose tokenizer to use"},
        {"text", CLI_STRING, &text, "S", "the text (with --decode: a JSON array of ids)"},
        {"text-file", CLI_STRING, &text_file, "F", "read the text from F instead"},
        {"decode", CLI_FLAG, &do_decode, NULL, "turn a JSON array of ids back into text"},
        {NULL, 0, NULL, NULL, NULL},
    };
    const cli_spec spec = {
        NAME,
        "tokenize --run RUN (--text S | --text-file F) [--decode]",
        "Prints the token ids of a text as a JSON array, or with --decode writes the text of a "
        "JSON array of ids (exactly its bytes, no newline added).",
        options,
        0,
        NULL,
        NULL,
    };
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    if (!run) return cli_usage_error(NAME, "--run RUN is required: whose tokenizer to use");
    if (!text == !text_file) return cli_usage_error(NAME, "give --text S or --text-file F");
    char *file_text = NULL;
    size_t bytes = text ? strlen(text) : 0;
    gpc_status s = GPC_OK;
    if (text_file) s = gpc_read_file(text_file, &file_text, &bytes);
    gpc_tokenizer *tok = NULL;
    if (s == GPC_OK) s = gpc_tokenizer_load_from(&tok, run);
    const char *input = file_text ? file_text : text;
    if (s == GPC_OK && do_decode) {
        s = decode(tok, input, bytes);
    } else if (s == GPC_OK) {
        uint32_t *ids;
        size_t n;
        s = gpc_tokenizer_encode(tok, input, bytes, &ids, &n);
        if (s == GPC_OK) print_ids(ids, n);
        if (s == GPC_OK) gpc_free(ids);
    }
    gpc_tokenizer_free(tok);
    gpc_free(file_text);
    if (s != GPC_OK) return cli_fail(NAME, s);
    return CLI_EXIT_OK;
}
