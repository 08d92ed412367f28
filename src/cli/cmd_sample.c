/*
 * cmd_sample.c: `gpc sample`: generates text from a trained run. Reads
 * RUN/checkpoint.bin (or quant.bin, from gpc quantize) and RUN/tokenizer.bin,
 * so a run folder is all it needs, and streams the text to stdout as it is
 * drawn.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "gpc/model.h"
#include "gpc/serve.h"
#include "gpc/tokenizer.h"

static const char *NAME = "sample";

typedef struct {
    const gpc_tokenizer *tok;
    uint32_t eot; /* printed as a line break when --ignore-eos lets it through */
    double first; /* when the first token came (the prompt's cost), 0 before */
} stream;

static int print_token(void *user, uint32_t token) {
    stream *s = user;
    if (s->first == 0) s->first = gpc_time_seconds();
    size_t n;
    const char *bytes = token == s->eot ? "\n" : gpc_tokenizer_token_bytes(s->tok, token, &n);
    if (token == s->eot) n = 1;
    if (bytes && n) fwrite(bytes, 1, n, stdout);
    fflush(stdout);
    return 0;
}

/* Why the text ended, so a short sample is not taken for a fault. */
static void report_stop(const gpc_generate_result *r, const gpc_generate_options *o, int context) {
    if (r->stop == GPC_GENERATE_END_OF_TEXT)
        fprintf(stderr,
                "sample: stopped at the end-of-text token after %zu tokens (--ignore-eos or "
                "--min-tokens N write on past it)\n",
                r->generated);
    else
        fprintf(stderr, "sample: stopped at the limit of --tokens %d\n", o->max_tokens);
    if (r->window_drops)
        fprintf(stderr,
                "sample: the text outgrew the context of %d tokens %d time(s): each token saw "
                "at least the last %d\n",
                context, r->window_drops, context - gpc_generate_window_drop(context));
}

static gpc_status run(const char *run_dir, const char *prompt, size_t prompt_len,
                      const gpc_generate_options *g, uint64_t seed, gpc_device device,
                      int precision, int ignore_eos) {
    char weights[4200], tok_path[4096];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.bin", run_dir);
    /* checkpoint.bin, or quant.bin for a run of gpc quantize */
    gpt_config config;
    GPC_TRY(gpt_run_weights(run_dir, weights, sizeof weights, &config, NULL));
    if (!gpc_path_exists(tok_path))
        return gpc_error(GPC_ERR_IO,
                         "%s has no tokenizer.bin (was it trained on synthetic data?): sampling "
                         "text needs a run trained on a prepared dataset",
                         run_dir);
    gpc_tokenizer *tok = NULL;
    GPC_TRY(gpc_tokenizer_load(&tok, tok_path));
    gpc_status s = GPC_OK;
    if (gpc_tokenizer_vocab_size(tok) != config.vocab_size)
        s = gpc_error(GPC_ERR_MISMATCH,
                      "%s has %d tokens but the checkpoint's model has %d: the run folder mixes "
                      "two runs",
                      tok_path, gpc_tokenizer_vocab_size(tok), config.vocab_size);
    gpc_dtype dtype = precision >= 0                  ? (gpc_dtype)precision
                      : device.type == GPC_DEVICE_CPU ? GPC_F32
                                                      : GPC_BF16;
    gpt_model *model = NULL;
    if (s == GPC_OK) s = gpt_create_from_run(&model, run_dir, device, dtype, 1, config.max_context);
    uint32_t *tokens = NULL;
    size_t count = 0;
    if (s == GPC_OK) s = gpc_tokenizer_encode(tok, prompt, prompt_len, &tokens, &count);
    if (s == GPC_OK) {
        uint32_t eot = (uint32_t)gpc_tokenizer_eot(tok);
        gpc_generate_options o = *g;
        o.stop_token = ignore_eos ? -1 : (int64_t)eot;
        gpc_rng rng;
        gpc_rng_seed(&rng, seed, 0x73616d706c65ULL); /* "sample" */
        if (count > (size_t)config.max_context)
            fprintf(stderr,
                    "sample: the prompt's %zu tokens exceed the context of %d: the model sees "
                    "the last %d\n",
                    count, config.max_context, config.max_context);
        stream out = {tok, eot, 0};
        fwrite(prompt, 1, prompt_len, stdout);
        fflush(stdout);
        /* an empty prompt starts a fresh text, as after a document's end */
        gpc_generate_result r;
        double t0 = gpc_time_seconds();
        s = count ? gpc_generate_run(model, tokens, count, &o, &rng, print_token, &out, &r)
                  : gpc_generate_run(model, &eot, 1, &o, &rng, print_token, &out, &r);
        size_t made = r.generated;
        double dt = gpc_time_seconds() - t0;
        fputc('\n', stdout);
        fflush(stdout);
        /* the first token pays for the prompt; the rate is of those after it */
        double first = out.first > 0 ? out.first - t0 : dt, rest = dt - first;
        if (s == GPC_OK) {
            fprintf(stderr,
                    "sample: %zu tokens in %.2f s: a prompt of %zu and the first token in %.2f s, "
                    "then %.1f tokens/s\n",
                    made, dt, count ? count : 1, first,
                    made > 1 && rest > 0 ? (double)(made - 1) / rest : 0.0);
            report_stop(&r, &o, config.max_context);
        }
    }
    gpc_free(tokens);
    gpt_free(model);
    gpc_tokenizer_free(tok);
    return s;
}

int cmd_sample(int argc, char **argv) {
    const char *run_dir = NULL, *prompt = NULL, *prompt_file = NULL, *device_name = "auto",
               *precision_name = NULL;
    int tokens = 200, top_k = 40, no_kv_cache = 0, ignore_eos = 0, min_tokens = 0;
    double temperature = 0.8, top_p = 1.0;
    int64_t seed = 1337;
    const cli_option options[] = {
        {"run", CLI_STRING, &run_dir, "RUN", "run folder written by gpc train"},
        {"prompt", CLI_STRING, &prompt, "TEXT", "text to continue (default: a fresh text)"},
        {"prompt-file", CLI_STRING, &prompt_file, "FILE", "continue the text of FILE instead"},
        {"tokens", CLI_INT, &tokens, "N", "tokens to generate (default 200)"},
        {"min-tokens", CLI_INT, &min_tokens, "N",
         "write at least N tokens: end-of-text is not drawn before (default 0)"},
        {"ignore-eos", CLI_FLAG, &ignore_eos, NULL,
         "write on past end-of-text (as a line break) up to --tokens"},
        {"temperature", CLI_FLOAT, &temperature, "X",
         "randomness: 0 picks the likeliest token (default 0.8)"},
        {"top-k", CLI_INT, &top_k, "K",
         "draw among the K likeliest tokens, 0 for all (default 40)"},
        {"top-p", CLI_FLOAT, &top_p, "P",
         "then among the likeliest whose probabilities sum to P, in (0, 1] (default 1: all)"},
        {"seed", CLI_INT64, &seed, "S", "random seed (default 1337)"},
        {"device", CLI_STRING, &device_name, "DEV", "auto, cpu or cuda[:N] (default auto)"},
        {"precision", CLI_STRING, &precision_name, "P",
         "f32, bf16 or fp16 (default f32 on the CPU, bf16 on a GPU)"},
        {"no-kv-cache", CLI_FLAG, &no_kv_cache, NULL,
         "recompute the whole window for every token instead of keeping keys and values "
         "(slower; for comparisons)"},
        {NULL, 0, NULL, NULL, NULL},
    };
    const cli_spec spec = {
        "sample",
        "sample --run RUN [--prompt TEXT | --prompt-file FILE] [--tokens N] [--temperature X] "
        "[--top-k K] [--top-p P] [--seed S] [--device DEV] [--precision P] [--no-kv-cache] "
        "[--min-tokens N] [--ignore-eos]",
        "Generates text from a trained run, streaming it to stdout. Stops at the end-of-text "
        "token or after N tokens, and says which on stderr.",
        options,
        0,
        NULL,
        NULL,
    };
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    int rc;
    if (!run_dir) return cli_usage_error(NAME, "--run RUN is required (a folder from gpc train)");
    if (prompt && prompt_file)
        return cli_usage_error(NAME, "give --prompt or --prompt-file, not both");
    if (tokens <= 0) return cli_usage_error(NAME, "--tokens must be positive, not %d", tokens);
    if (min_tokens < 0 || min_tokens > tokens)
        return cli_usage_error(NAME, "--min-tokens must be 0 to --tokens (%d), not %d", tokens,
                               min_tokens);
    if (temperature < 0)
        return cli_usage_error(NAME, "--temperature must not be negative, not %g", temperature);
    if (top_k < 0) return cli_usage_error(NAME, "--top-k must not be negative, not %d", top_k);
    if (!(top_p > 0 && top_p <= 1))
        return cli_usage_error(NAME, "--top-p must be more than 0 and at most 1, not %g", top_p);
    if (seed < 0) return cli_usage_error(NAME, "--seed must not be negative");
    int precision = -1;
    if (precision_name && (rc = cli_precision(NAME, precision_name, &precision))) return rc;
    gpc_device device;
    gpc_status s = gpc_device_parse(device_name, &device);
    if (s != GPC_OK) return cli_fail(NAME, s);
    if (device.type == GPC_DEVICE_CPU && precision >= 0 && precision != GPC_F32)
        return cli_usage_error(NAME, "the CPU computes in f32 only; use --precision f32 (bf16 "
                                     "and fp16 need a GPU)");
    gpc_generate_options g;
    gpc_generate_options_init(&g);
    g.max_tokens = tokens;
    g.temperature = (float)temperature;
    g.top_k = top_k;
    g.top_p = (float)top_p;
    g.kv_cache = !no_kv_cache;
    g.min_tokens = min_tokens;
    char *file_text = NULL;
    size_t prompt_len = prompt ? strlen(prompt) : 0;
    if (prompt_file) {
        s = gpc_read_file(prompt_file, &file_text, &prompt_len);
        if (s != GPC_OK) return cli_fail(NAME, s);
    }
    s = run(run_dir,
            file_text ? file_text
            : prompt  ? prompt
                      : "",
            prompt_len, &g, (uint64_t)seed, device, precision, ignore_eos);
    gpc_free(file_text);
    if (s != GPC_OK) return cli_fail(NAME, s);
    return CLI_EXIT_OK;
}
