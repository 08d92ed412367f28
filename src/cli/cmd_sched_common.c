/*
 * cmd_sched_common.c: the request helper every gpcd client command uses
 * (see cmd_sched.h).
 */
#include "cli/cmd_sched.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

int gpcd_cli_call(const char *command, const char *socket, const char *method, const char *path,
                  const char *body, gpcd_response *out) {
    const char *where = gpcd_client_socket(socket);
    gpc_status st = gpcd_client_request(where, method, path, body, out);
    if (st != GPC_OK) return cli_fail(command, st);
    if (out->status >= 200 && out->status < 300) return 0;
    json_t *reply = json_loadb(out->body, out->body_len, 0, NULL);
    const char *message = reply ? json_string_value(json_object_get(reply, "error")) : NULL;
    fprintf(stderr, "gpc %s: error: %s\n", command,
            message ? message : "gpcd answered with an error it did not explain");
    json_decref(reply);
    int status = out->status;
    gpcd_response_free(out);
    return status == 400 ? CLI_EXIT_USAGE : CLI_EXIT_RUNTIME;
}

const char *gpcd_cli_age(double seconds, char *buf, size_t size) {
    return cli_format_duration(seconds < 0 ? 0 : seconds, buf, size);
}
