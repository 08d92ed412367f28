/*
 * file.c: atomic file writes and small file-system helpers.
 *
 * Every file gpc writes goes through gpc_atomic_*: the bytes land in a
 * temporary file beside the target, are flushed and fsynced, and the file is
 * renamed over the target (rename is atomic on POSIX file systems), and the
 * directory is fsynced so that the rename itself survives a power cut. A
 * crash, a kill or a full disk at any moment leaves the previous complete
 * file, never a torn one or none.
 * The running CRC-32C of everything written is kept for the caller's footer.
 */
#include "gpc/core.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Shards, tokenizers and checkpoints store numbers in the host's byte order
 * and are read back with memcpy, which is right on the little-endian hosts
 * gpc runs on (x86-64, aarch64); a big-endian build stops here rather than
 * write files no other machine reads correctly. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "gpc's file formats are little-endian; this host is not");

static char *string_copy(const char *s) {
    size_t n = strlen(s) + 1;
    char *copy = gpc_malloc(n);
    if (copy) memcpy(copy, s, n);
    return copy;
}

/* fsync of the directory that holds path: makes a rename or link in it
 * durable (POSIX leaves that to the directory's own fsync). */
static gpc_status fsync_parent(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (n >= sizeof dir) return GPC_OK;
    if (slash && n == 0) n = 1; /* "/file": the root */
    memcpy(dir, slash ? path : ".", slash ? n : 1);
    dir[slash ? n : 1] = '\0';
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return gpc_error(GPC_ERR_IO, "cannot open directory %s: %s", dir, strerror(errno));
    /* some file systems refuse fsync on directories (EINVAL): nothing to do */
    int failed = fsync(fd) != 0 && errno != EINVAL && errno != EROFS;
    int err = errno;
    close(fd);
    if (failed) return gpc_error(GPC_ERR_IO, "cannot flush directory %s: %s", dir, strerror(err));
    return GPC_OK;
}

gpc_status gpc_atomic_open(gpc_atomic_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    size_t n = strlen(path) + 32;
    f->path = string_copy(path);
    f->tmp_path = gpc_malloc(n);
    if (!f->path || !f->tmp_path) {
        gpc_atomic_abort(f);
        return gpc_error(GPC_ERR_NOMEM, "out of memory opening %s", path);
    }
    snprintf(f->tmp_path, n, "%s.tmp.%ld", path, (long)getpid());
    f->file = fopen(f->tmp_path, "wb");
    if (!f->file) {
        int err = errno;
        gpc_status s = gpc_error(GPC_ERR_IO, "cannot write %s: %s", f->tmp_path, strerror(err));
        gpc_free(f->path);
        gpc_free(f->tmp_path);
        memset(f, 0, sizeof *f);
        return s;
    }
    return GPC_OK;
}

gpc_status gpc_atomic_write(gpc_atomic_file *f, const void *data, size_t bytes) {
    if (!f->file) return gpc_error(GPC_ERR_INTERNAL, "write to a file that is not open");
    if (bytes && fwrite(data, 1, bytes, f->file) != bytes)
        return gpc_error(GPC_ERR_IO, "cannot write %s: %s (is the disk full?)", f->tmp_path,
                         strerror(errno));
    f->crc = gpc_crc32c(f->crc, data, bytes);
    f->bytes += bytes;
    return GPC_OK;
}

gpc_status gpc_atomic_commit(gpc_atomic_file *f) {
    FILE *file = f->file;
    gpc_status s = GPC_OK;
    if (!file) return gpc_error(GPC_ERR_INTERNAL, "commit of a file that is not open");
    f->file = NULL;
    if (fflush(file) != 0 || fsync(fileno(file)) != 0)
        s = gpc_error(GPC_ERR_IO, "cannot flush %s: %s", f->tmp_path, strerror(errno));
    if (fclose(file) != 0 && s == GPC_OK)
        s = gpc_error(GPC_ERR_IO, "cannot close %s: %s", f->tmp_path, strerror(errno));
    if (s == GPC_OK && rename(f->tmp_path, f->path) != 0)
        s = gpc_error(GPC_ERR_IO, "cannot rename %s to %s: %s", f->tmp_path, f->path,
                      strerror(errno));
    else if (s == GPC_OK)
        s = fsync_parent(f->path);
    if (s != GPC_OK) {
        unlink(f->tmp_path);
    }
    gpc_free(f->path);
    gpc_free(f->tmp_path);
    f->path = f->tmp_path = NULL;
    return s;
}

void gpc_atomic_abort(gpc_atomic_file *f) {
    if (f->file) fclose(f->file);
    if (f->tmp_path) unlink(f->tmp_path);
    gpc_free(f->path);
    gpc_free(f->tmp_path);
    memset(f, 0, sizeof *f);
}

gpc_status gpc_read_file(const char *path, char **out, size_t *size) {
    FILE *f = fopen(path, "rb");
    *out = NULL;
    if (size) *size = 0;
    if (!f) return gpc_error(GPC_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    size_t capacity = 1 << 16, used = 0;
    char *buf = gpc_malloc(capacity + 1);
    if (!buf) {
        fclose(f);
        return gpc_error(GPC_ERR_NOMEM, "out of memory reading %s", path);
    }
    for (;;) {
        size_t n = fread(buf + used, 1, capacity - used, f);
        used += n;
        if (used < capacity) break;
        char *bigger = gpc_malloc(capacity * 2 + 1);
        if (!bigger) {
            gpc_free(buf);
            fclose(f);
            return gpc_error(GPC_ERR_NOMEM, "out of memory reading %s", path);
        }
        memcpy(bigger, buf, used);
        gpc_free(buf);
        buf = bigger;
        capacity *= 2;
    }
    int failed = ferror(f);
    fclose(f);
    if (failed) {
        gpc_free(buf);
        return gpc_error(GPC_ERR_IO, "cannot read %s", path);
    }
    buf[used] = '\0';
    *out = buf;
    if (size) *size = used;
    return GPC_OK;
}

gpc_status gpc_open_regular(const char *path, const char *what, void **out) {
    *out = NULL;
    /* O_NONBLOCK so that opening a FIFO without a writer returns at once */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return gpc_error(GPC_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return gpc_error(GPC_ERR_IO, "cannot read %s %s: %s", what, path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return gpc_error(GPC_ERR_FORMAT,
                         "%s %s is not a regular file (a pipe, device or directory); give the "
                         "path of a file",
                         what, path);
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) (void)fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return gpc_error(GPC_ERR_NOMEM, "out of memory opening %s %s", what, path);
    }
    *out = f;
    return GPC_OK;
}

gpc_status gpc_write_file(const char *path, const void *data, size_t size) {
    gpc_atomic_file f;
    GPC_TRY(gpc_atomic_open(&f, path));
    gpc_status s = gpc_atomic_write(&f, data, size);
    if (s != GPC_OK) {
        gpc_atomic_abort(&f);
        return s;
    }
    return gpc_atomic_commit(&f);
}

gpc_status gpc_copy_file(const char *from, const char *to) {
    char *bytes;
    size_t size;
    GPC_TRY(gpc_read_file(from, &bytes, &size));
    gpc_status s = gpc_write_file(to, bytes, size);
    gpc_free(bytes);
    return s;
}

void gpc_remove_flat_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[4600];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

gpc_status gpc_commit_flat_dir(const char *tmp, const char *out, gpc_status s) {
    if (s == GPC_OK) {
        if (gpc_path_exists(out)) rmdir(out); /* an empty folder given as the output */
        if (rename(tmp, out) != 0)
            s = gpc_error(GPC_ERR_IO, "cannot rename %s to %s: %s", tmp, out, strerror(errno));
    }
    if (s != GPC_OK) gpc_remove_flat_dir(tmp);
    return s;
}

gpc_status gpc_link_replace(const char *from, const char *to) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", to, (long)getpid());
    unlink(tmp);
    if (link(from, tmp) != 0)
        return gpc_error(GPC_ERR_IO, "cannot link %s to %s: %s", from, tmp, strerror(errno));
    if (rename(tmp, to) != 0) {
        int err = errno;
        unlink(tmp);
        return gpc_error(GPC_ERR_IO, "cannot rename %s to %s: %s", tmp, to, strerror(err));
    }
    /* when TO already was a name of the file, rename does nothing (POSIX)
     * and leaves the temporary name behind */
    unlink(tmp);
    return fsync_parent(to);
}

int gpc_remove_stale_temporaries(const char *path) {
    char dir[4096], prefix[1024];
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (n >= sizeof dir || strlen(base) + 6 >= sizeof prefix) return 0;
    memcpy(dir, slash ? path : ".", slash ? (n ? n : 1) : 1);
    dir[slash ? (n ? n : 1) : 1] = '\0';
    snprintf(prefix, sizeof prefix, "%s.tmp.", base);
    size_t plen = strlen(prefix);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int removed = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, prefix, plen) != 0) continue;
        char *end;
        long pid = strtol(e->d_name + plen, &end, 10);
        if (*end || pid <= 0) continue;
        /* a live writer's file is left alone; this process's own are stale */
        if (pid != (long)getpid() && (kill((pid_t)pid, 0) == 0 || errno == EPERM)) continue;
        char full[4096 + 256];
        snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
        if (unlink(full) == 0) removed++;
    }
    closedir(d);
    return removed;
}

gpc_status gpc_mkdir_p(const char *path) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return gpc_error(GPC_ERR_INVALID_ARG, "bad directory path");
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char c = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST)
                return gpc_error(GPC_ERR_IO, "cannot create directory %s: %s", buf,
                                 strerror(errno));
            buf[i] = c;
        }
    }
    if (!gpc_path_is_dir(path))
        return gpc_error(GPC_ERR_IO, "%s exists and is not a directory", path);
    return GPC_OK;
}

int gpc_path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int gpc_path_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}
