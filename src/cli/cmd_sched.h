/*
 * cmd_sched.h: what the gpcd client commands (cmd_sched_*.c: submit, queue,
 * show, logs, cancel, top, sched) share: talking to gpcd and turning its
 * errors into the one-line "gpc CMD: error: ..." with the right exit code.
 */
#ifndef GPC_CMD_SCHED_H
#define GPC_CMD_SCHED_H

#include "cli/cli.h"
#include "gpc/sched.h"

/* Sends one request. On success (2xx) returns 0 with the response filled;
 * otherwise prints the error line and returns the exit status (2 for a bad
 * request, 1 for everything else), with the response freed. */
int gpcd_cli_call(const char *command, const char *socket, const char *method, const char *path,
                  const char *body, gpcd_response *out);
/* "high" for 90, the number otherwise; a short age such as "3m12s". */
const char *gpcd_cli_age(double seconds, char *buf, size_t size);

#endif /* GPC_CMD_SCHED_H */
