/*
 * gpc/server.h: the HTTP front end of the serving engine (gpc serve): an
 * OpenAI-compatible completions API, health and Prometheus metrics over one
 * gpc_engine, on TCP or a unix socket.
 *
 * Connection threads parse requests, tokenize prompts, detokenize and match
 * stop strings; the engine thread only queues tokens into each request's
 * buffer. So a slow client slows its own connection, never the engine.
 */
#ifndef GPC_SERVER_H
#define GPC_SERVER_H

#include "gpc/core.h"
#include "gpc/engine.h"
#include "gpc/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpc_server gpc_server;

typedef struct {
    const char *listen;     /* "ADDR:PORT" (IPv4; port 0 picks a free one); NULL with socket */
    const char *socket;     /* a unix socket path instead of TCP (mode 0600) */
    const char *token;      /* bearer token every request but GET /health must carry; NULL none */
    size_t max_body;        /* bytes of a request body; more is a 413; default 1 MiB */
    int retry_after;        /* seconds a 503 asks the client to wait; default 1 */
    int connection_limit;   /* open connections; default 1024 */
    double drain_timeout;   /* seconds gpc_server_drain waits for responses; default 60 */
    const char *model_name; /* the id in /v1/models; default the engine's model name */
} gpc_server_options;

void gpc_server_options_init(gpc_server_options *options);

/* Starts serving engine (started already) with tok, which may be NULL (a
 * run without a tokenizer: prompts must then be token ids, and responses
 * carry ids only). Neither is owned by the server; both must outlive it. */
gpc_status gpc_server_start(gpc_server **out, gpc_engine *engine, const gpc_tokenizer *tok,
                            const gpc_server_options *options);
/* Where it listens: "http://127.0.0.1:8000" or "unix:/path". */
const char *gpc_server_address(const gpc_server *server);
/* Stops accepting connections, answers new requests on open ones with 503,
 * lets every admitted request finish (gpc_engine_drain) and waits until its
 * response is sent, at most drain_timeout seconds. */
gpc_status gpc_server_drain(gpc_server *server);
/* Stops the HTTP threads and frees the server (not the engine). */
void gpc_server_free(gpc_server *server);

#ifdef __cplusplus
}
#endif

#endif /* GPC_SERVER_H */
