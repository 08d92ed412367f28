/*
 * client.c: the HTTP client the gpc commands (submit, queue, show, logs,
 * cancel, top) use to talk to gpcd: one request per connection over the
 * unix socket, or over TCP when the socket is given as tcp://HOST:PORT (the
 * token then comes from GPC_TOKEN). Small on purpose: gpcd's replies are
 * always Content-Length framed.
 */
#include "gpc/sched.h"
#include "gpc/settings.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

const char *gpcd_client_socket(const char *explicit_path) {
    if (explicit_path && *explicit_path) return explicit_path;
    const char *env = gpc_setting_str("GPC_SOCKET");
    if (env && *env) return env;
    return GPCD_DEFAULT_SOCKET;
}

static gpc_status not_running(const char *where, int err) {
    if (err == EACCES)
        return gpc_error(GPC_ERR_IO,
                         "permission denied on gpcd's socket %s: its socket_mode lets only "
                         "gpcd's user in (ask the administrator, or use --socket)",
                         where);
    return gpc_error(GPC_ERR_IO,
                     "gpcd is not running at %s (%s); start it with 'gpcd --config FILE', or "
                     "point --socket or GPC_SOCKET at its socket",
                     where, strerror(err));
}

static gpc_status connect_to(const char *where, int *out) {
    int fd = -1;
    if (strncmp(where, "tcp://", 6) == 0) {
        char host[128];
        const char *hp = where + 6, *colon = strrchr(hp, ':');
        if (!colon || (size_t)(colon - hp) >= sizeof host)
            return gpc_error(GPC_ERR_INVALID_ARG, "'%s' is not tcp://HOST:PORT", where);
        memcpy(host, hp, (size_t)(colon - hp));
        host[colon - hp] = '\0';
        struct sockaddr_in addr;
        memset(&addr, 0, sizeof addr);
        addr.sin_family = AF_INET;
        addr.sin_port = htons((uint16_t)atoi(colon + 1));
        if (inet_pton(AF_INET, host, &addr.sin_addr) != 1)
            return gpc_error(GPC_ERR_INVALID_ARG, "'%s' is not tcp://IPV4:PORT", where);
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return gpc_error(GPC_ERR_IO, "socket: %s", strerror(errno));
        if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
            int err = errno;
            close(fd);
            return not_running(where, err);
        }
    } else {
        struct sockaddr_un addr;
        memset(&addr, 0, sizeof addr);
        addr.sun_family = AF_UNIX;
        if (strlen(where) >= sizeof addr.sun_path)
            return gpc_error(GPC_ERR_INVALID_ARG, "socket path %s is too long", where);
        snprintf(addr.sun_path, sizeof addr.sun_path, "%s", where);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return gpc_error(GPC_ERR_IO, "socket: %s", strerror(errno));
        if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
            int err = errno;
            close(fd);
            return not_running(where, err);
        }
    }
    *out = fd;
    return GPC_OK;
}

static int send_all(int fd, const char *data, size_t len) {
    while (len > 0) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Copies header NAME's value (case-insensitive) from the head into out. */
static void header_value(const char *head, const char *name, char *out, size_t size) {
    size_t nlen = strlen(name);
    out[0] = '\0';
    for (const char *line = strstr(head, "\r\n"); line; line = strstr(line + 2, "\r\n")) {
        const char *p = line + 2;
        if (strncasecmp(p, name, nlen) == 0 && p[nlen] == ':') {
            p += nlen + 1;
            while (*p == ' ')
                p++;
            size_t len = strcspn(p, "\r\n");
            if (len >= size) len = size - 1;
            memcpy(out, p, len);
            out[len] = '\0';
            return;
        }
    }
}

gpc_status gpcd_client_request(const char *socket_path, const char *method, const char *path,
                               const char *body, gpcd_response *out) {
    memset(out, 0, sizeof *out);
    int fd = -1;
    GPC_TRY(connect_to(socket_path, &fd));
    size_t body_len = body ? strlen(body) : 0;
    char head[1024], auth[400] = "";
    const char *token = gpc_setting_str("GPC_TOKEN");
    if (strncmp(socket_path, "tcp://", 6) == 0 && token && *token)
        snprintf(auth, sizeof auth, "Authorization: Bearer %.300s\r\n", token);
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: gpcd\r\nConnection: close\r\n%s"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, path, auth, body_len);
    if (n < 0 || (size_t)n >= sizeof head) {
        close(fd);
        return gpc_error(GPC_ERR_INVALID_ARG, "request path is too long");
    }
    if (send_all(fd, head, (size_t)n) != 0 || (body_len && send_all(fd, body, body_len) != 0)) {
        int err = errno;
        close(fd);
        return gpc_error(GPC_ERR_IO, "gpcd at %s closed the connection: %s", socket_path,
                         strerror(err));
    }
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        if (len + 1 >= cap) {
            char *grown = realloc(buf, cap * 2);
            if (!grown) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = grown;
            cap *= 2;
        }
        ssize_t got = recv(fd, buf + len, cap - len - 1, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        len += (size_t)got;
    }
    close(fd);
    if (!buf) return gpc_error(GPC_ERR_NOMEM, "out of memory reading gpcd's reply");
    buf[len] = '\0';
    char *end = strstr(buf, "\r\n\r\n");
    int status = 0;
    if (!end || sscanf(buf, "HTTP/1.%*d %d", &status) != 1) {
        free(buf);
        return gpc_error(GPC_ERR_IO,
                         "gpcd at %s sent no valid reply (is that socket really gpcd's?)",
                         socket_path);
    }
    *end = '\0';
    header_value(buf, "X-Gpc-Next-Offset", out->next_offset, sizeof out->next_offset);
    header_value(buf, "X-Gpc-Job-State", out->job_state, sizeof out->job_state);
    out->status = status;
    out->body_len = len - (size_t)(end + 4 - buf);
    out->body = malloc(out->body_len + 1);
    if (!out->body) {
        free(buf);
        return gpc_error(GPC_ERR_NOMEM, "out of memory reading gpcd's reply");
    }
    memcpy(out->body, end + 4, out->body_len);
    out->body[out->body_len] = '\0';
    free(buf);
    return GPC_OK;
}

void gpcd_response_free(gpcd_response *response) {
    free(response->body);
    response->body = NULL;
}
