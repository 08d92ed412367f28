/*
 * socket.c: a listening unix socket for gpc's HTTP servers (gpc serve and
 * gpcd's API), with the rules both need: a socket file left by a server
 * that died is replaced, one whose server still answers is not, and the
 * file never exists with wider permissions than asked for.
 */
#include "gpc/core.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

gpc_status gpc_listen_unix(const char *path, unsigned mode, const char *in_use, int *out) {
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof addr.sun_path)
        return gpc_error(GPC_ERR_INVALID_ARG, "socket path %s is too long (at most %zu bytes)",
                         path, sizeof addr.sun_path - 1);
    memcpy(addr.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return gpc_error(GPC_ERR_IO, "socket: %s", strerror(errno));
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0) {
        close(fd);
        return gpc_error(GPC_ERR_IO, "%s", in_use);
    }
    close(fd);
    unlink(path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return gpc_error(GPC_ERR_IO, "socket: %s", strerror(errno));
    /* created owner-only, then opened up to mode: never wider in between */
    mode_t old = umask(0177);
    int rc = bind(fd, (struct sockaddr *)&addr, sizeof addr);
    umask(old);
    if (rc != 0 || chmod(path, (mode_t)mode) != 0 || listen(fd, 4096) != 0) {
        gpc_status st = gpc_error(GPC_ERR_IO, "cannot listen on %s: %s", path, strerror(errno));
        close(fd);
        return st;
    }
    *out = fd;
    return GPC_OK;
}
