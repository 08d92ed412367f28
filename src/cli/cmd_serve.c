/*
 * cmd_serve.c: `gpc serve`: serves a run over HTTP (gpc/server.h) with the
 * serving engine (gpc/engine.h) until SIGTERM or Ctrl-C, then lets the
 * requests in flight finish and exits 0. This file parses options, reads
 * the token file and prints where the server listens; the rest is in
 * src/serve/.
 */
#include "cli/cli.h"
#include "gpc/engine.h"
#include "gpc/server.h"
#include "gpc/tokenizer.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *NAME = "serve";

/* The bearer token of --token FILE: the file must be its owner's alone,
 * since whoever holds the token uses the server. */
static gpc_status read_token(const char *path, char *token, size_t size) {
    struct stat st;
    if (stat(path, &st) != 0) return gpc_error(GPC_ERR_IO, "cannot read --token file %s", path);
    if (st.st_mode & 077)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--token file %s can be read or changed by other users (mode %04o); run "
                         "chmod 600 %s",
                         path, (unsigned)(st.st_mode & 07777), path);
    char *text = NULL;
    size_t len = 0;
    GPC_TRY(gpc_read_file(path, &text, &len));
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' '))
        text[--len] = '\0';
    gpc_status s = GPC_OK;
    if (len < 16 || len >= size || strlen(text) != len)
        s = gpc_error(GPC_ERR_INVALID_ARG,
                      "--token file %s must hold one token of 16-255 characters", path);
    else
        memcpy(token, text, len + 1);
    gpc_free(text);
    return s;
}

/* The run's tokenizer, or NULL for a run that has none (an import from
 * Hugging Face without its tokenizer files): then prompts are token ids. */
static gpc_status load_tokenizer(const char *run_dir, gpc_tokenizer **tok) {
    char path[4096];
    *tok = NULL;
    snprintf(path, sizeof path, "%s/tokenizer.bin", run_dir);
    int has = gpc_path_exists(path);
    snprintf(path, sizeof path, "%s/vocab.json", run_dir);
    has = has || gpc_path_exists(path);
    if (!has) return GPC_OK;
    return gpc_tokenizer_load_from(tok, run_dir);
}

static gpc_status serve(const char *run_dir, gpc_device device, const gpc_engine_options *eo,
                        const gpc_server_options *so) {
    if (!gpc_path_is_dir(run_dir))
        return gpc_error(GPC_ERR_IO,
                         "run folder %s does not exist (train one with gpc train "
                         "--out %s, or import one with gpc import hf)",
                         run_dir, run_dir);
    gpc_tokenizer *tok = NULL;
    GPC_TRY(load_tokenizer(run_dir, &tok));
    gpc_engine *engine = NULL;
    gpc_server *server = NULL;
    gpc_status s = gpc_engine_create(&engine, run_dir, device, eo);
    gpc_engine_model_info info;
    if (s == GPC_OK) {
        gpc_engine_model(engine, &info);
        if (tok && gpc_tokenizer_vocab_size(tok) != info.vocab_size)
            s = gpc_error(GPC_ERR_MISMATCH,
                          "%s's tokenizer has %d tokens but its model has %d: the run folder "
                          "mixes two runs",
                          run_dir, gpc_tokenizer_vocab_size(tok), info.vocab_size);
    }
    if (s == GPC_OK) s = gpc_engine_start(engine);
    if (s == GPC_OK) s = gpc_server_start(&server, engine, tok, so);
    if (s == GPC_OK) {
        cli_catch_stop(NULL);
        fprintf(stderr, "serve: %s on %s: context %d, vocabulary %d%s\n", info.name,
                gpc_device_name(device), info.context, info.vocab_size,
                tok ? "" : ", no tokenizer (prompts must be token ids)");
        /* the last line before serving: scripts wait for it */
        fprintf(stderr, "serve: listening on %s\n", gpc_server_address(server));
        fflush(stderr);
        while (!cli_stop_signal())
            usleep(50 * 1000);
        gpc_engine_stats stats;
        gpc_engine_get_stats(engine, &stats);
        fprintf(stderr, "serve: %s: finishing %zu running and %zu waiting requests\n",
                cli_stop_name(), stats.running, stats.waiting);
        s = gpc_server_drain(server);
        gpc_engine_get_stats(engine, &stats);
        fprintf(stderr, "serve: stopped after %llu requests and %llu tokens\n",
                (unsigned long long)stats.requests_total,
                (unsigned long long)stats.tokens_generated);
    }
    gpc_server_free(server);
    gpc_engine_free(engine);
    gpc_tokenizer_free(tok);
    return s;
}

int cmd_serve(int argc, char **argv) {
    const char *run_dir = NULL, *device_name = "auto", *listen = NULL, *socket = NULL,
               *token_file = NULL, *precision_name = NULL, *model_name = NULL;
    int max_batch = 0, max_queue = 0, block_size = 0;
    uint64_t kv_memory = 0, max_body = 1u << 20;
    const cli_option options[] = {
        {"run", CLI_STRING, &run_dir, "RUN",
         "run folder: written by gpc train, fine-tuned, or imported with gpc import hf"},
        {"device", CLI_STRING, &device_name, "DEV", "auto, cpu or cuda[:N] (default auto)"},
        {"listen", CLI_STRING, &listen, "ADDR:PORT",
         "TCP address (default 127.0.0.1:8000; port 0 picks a free one)"},
        {"socket", CLI_STRING, &socket, "PATH", "listen on a unix socket (mode 0600) instead"},
        {"max-batch", CLI_INT, &max_batch, "N", "sequences in one engine step (default 256)"},
        {"kv-memory", CLI_BYTES, &kv_memory, "SIZE",
         "memory of the paged key/value cache, e.g. 4G (default: 90% of the GPU's free memory, "
         "1G on the CPU)"},
        {"max-queue", CLI_INT, &max_queue, "N",
         "requests waiting for a batch slot; more get 503 with Retry-After (default 1024)"},
        {"block-size", CLI_INT, &block_size, "N", "positions per cache block (default 16)"},
        {"token", CLI_STRING, &token_file, "FILE",
         "require Authorization: Bearer TOKEN, the token in FILE (mode 0600)"},
        {"max-body", CLI_BYTES, &max_body, "SIZE",
         "largest request body; more gets 413 (default 1M)"},
        {"precision", CLI_STRING, &precision_name, "P",
         "GPU compute precision: bf16 (default), fp16 or f32; the CPU computes in f32"},
        {"model-name", CLI_STRING, &model_name, "NAME",
         "the model's id in /v1/models (default the run's name)"},
        {NULL, 0, NULL, NULL, NULL},
    };
    const cli_spec spec = {
        "serve",
        "serve --run RUN [--device cuda[:N]|cpu] [--listen ADDR:PORT | --socket PATH] "
        "[--max-batch N] [--kv-memory SIZE] [--max-queue N] [--token FILE]",
        "Serves a run over HTTP with continuous batching and a paged key/value cache: POST "
        "/v1/completions (OpenAI's completions API, streaming as server-sent events), GET "
        "/v1/models, GET /health and GET /metrics (Prometheus). SIGTERM or Ctrl-C stops taking "
        "requests, finishes those in flight and exits 0. docs/serve.md describes the API.",
        options,
        0,
        NULL,
        NULL,
    };
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    int rc;
    if (!run_dir) return cli_usage_error(NAME, "--run RUN is required (a folder from gpc train)");
    if (listen && socket) return cli_usage_error(NAME, "give --listen or --socket, not both");
    if (max_batch < 0)
        return cli_usage_error(NAME, "--max-batch must be positive, not %d", max_batch);
    if (max_queue < 0)
        return cli_usage_error(NAME, "--max-queue must be positive, not %d", max_queue);
    if (block_size < 0)
        return cli_usage_error(NAME, "--block-size must be positive, not %d", block_size);
    if (max_body < 64 || max_body > (1u << 30))
        return cli_usage_error(NAME, "--max-body must be 64 bytes to 1G");
    gpc_engine_options eo;
    gpc_engine_options_init(&eo);
    if (max_batch) eo.max_batch = max_batch;
    if (max_queue) eo.max_queue = max_queue;
    if (block_size) eo.block_size = block_size;
    if (kv_memory) eo.kv_bytes = (size_t)kv_memory;
    gpc_device device;
    gpc_status s = gpc_device_parse(device_name, &device);
    if (s != GPC_OK) return cli_fail(NAME, s);
    if (precision_name) {
        int precision;
        if ((rc = cli_precision(NAME, precision_name, &precision))) return rc;
        if (device.type == GPC_DEVICE_CPU && precision != GPC_F32)
            return cli_usage_error(NAME, "the CPU computes in f32 only; --precision bf16 and fp16 "
                                         "need a GPU");
        eo.precision = (gpc_dtype)precision;
    }
    gpc_server_options so;
    gpc_server_options_init(&so);
    so.listen = listen;
    so.socket = socket;
    so.max_body = (size_t)max_body;
    so.model_name = model_name;
    char token[256];
    if (token_file) {
        s = read_token(token_file, token, sizeof token);
        if (s != GPC_OK) return cli_fail(NAME, s);
        so.token = token;
    }
    s = serve(run_dir, device, &eo, &so);
    if (s != GPC_OK) return cli_fail(NAME, s);
    return CLI_EXIT_OK;
}
