/*
 * status.c: error codes and the per-thread error message.
 *
 * The message is kept per thread so that loader threads and the training
 * thread do not overwrite each other's errors. gpc_error_context lets each
 * layer add what it was doing ("loading checkpoint run/model.ckpt: ") in
 * front of the lower layer's message, so the user reads one complete line.
 */
#include "gpc/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define GPC_ERROR_CAPACITY 1024

static _Thread_local char error_message[GPC_ERROR_CAPACITY];

gpc_status gpc_error(gpc_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_message, sizeof error_message, fmt, ap);
    va_end(ap);
    return code;
}

gpc_status gpc_error_context(gpc_status code, const char *fmt, ...) {
    char prefix[GPC_ERROR_CAPACITY / 2];
    char previous[GPC_ERROR_CAPACITY / 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(previous, error_message, sizeof previous - 1);
    previous[sizeof previous - 1] = '\0';
    snprintf(error_message, sizeof error_message, "%s%s", prefix, previous);
    return code;
}

const char *gpc_last_error(void) {
    return error_message[0] ? error_message : "no error";
}

void gpc_clear_error(void) {
    error_message[0] = '\0';
}

const char *gpc_status_name(gpc_status code) {
    switch (code) {
    case GPC_OK:
        return "ok";
    case GPC_ERR_INVALID_ARG:
        return "invalid argument";
    case GPC_ERR_IO:
        return "input/output error";
    case GPC_ERR_FORMAT:
        return "bad file format";
    case GPC_ERR_NOMEM:
        return "out of memory";
    case GPC_ERR_DEVICE:
        return "device error";
    case GPC_ERR_UNSUPPORTED:
        return "unsupported";
    case GPC_ERR_MISMATCH:
        return "mismatch";
    case GPC_ERR_INTERNAL:
        return "internal error";
    case GPC_ERR_INTERRUPTED:
        return "interrupted";
    case GPC_ERR_BUSY:
        return "busy";
    }
    return "unknown status";
}
