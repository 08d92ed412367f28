/*
 * memory.c: host allocation with accounting, and arenas that plan memory up
 * front.
 *
 * gpc_malloc keeps a small header in front of each block so the bytes in use
 * and the peak can be reported on the progress line without asking the OS.
 * Arenas are the way the model and trainer place all their tensors: measure
 * once, allocate once, place; the training step then allocates nothing.
 *
 * Device memory that arenas and tensors take is counted per device, so that
 * GPC_DEVICE_MEMORY_LIMIT can cap it: a GPU shared with other jobs, and
 * tests, which make an allocation fail on purpose on the CPU as a full GPU
 * would.
 */
#include "gpc/core.h"
#include "gpc/settings.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GPC_ALIGN 256 /* covers cache lines, AVX-512 and GPU transaction sizes */

static _Atomic size_t host_in_use;
static _Atomic size_t host_peak;

typedef struct {
    size_t bytes;
    size_t pad; /* keeps the payload 16-byte aligned */
} block_header;

static void note_peak(size_t now) {
    size_t peak = atomic_load(&host_peak);
    while (now > peak && !atomic_compare_exchange_weak(&host_peak, &peak, now)) {
    }
}

void *gpc_malloc(size_t bytes) {
    block_header *h = malloc(sizeof *h + bytes);
    if (!h) return NULL;
    h->bytes = bytes;
    note_peak(atomic_fetch_add(&host_in_use, bytes) + bytes);
    return h + 1;
}

void *gpc_calloc(size_t count, size_t size) {
    if (size && count > SIZE_MAX / size) return NULL;
    void *p = gpc_malloc(count * size);
    if (p) memset(p, 0, count * size);
    return p;
}

void gpc_free(void *ptr) {
    if (!ptr) return;
    block_header *h = (block_header *)ptr - 1;
    atomic_fetch_sub(&host_in_use, h->bytes);
    free(h);
}

size_t gpc_host_bytes_in_use(void) {
    return atomic_load(&host_in_use);
}

size_t gpc_host_bytes_peak(void) {
    return atomic_load(&host_peak);
}

size_t gpc_process_rss(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages_total = 0, pages_resident = 0;
    if (!f) return 0;
    if (fscanf(f, "%lu %lu", &pages_total, &pages_resident) != 2) pages_resident = 0;
    fclose(f);
    return (size_t)pages_resident * (size_t)sysconf(_SC_PAGESIZE);
}

/* A byte count from a one-number file; 0 when absent, unreadable or "max". */
static unsigned long long file_bytes(const char *path) {
    unsigned long long v = 0;
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return 0;
    if (fscanf(f, "%llu", &v) != 1) v = 0;
    fclose(f);
    return v;
}

size_t gpc_host_memory_available_from(const char *meminfo, const char *limit, const char *usage) {
    unsigned long long avail = 0, kb;
    char line[256];
    FILE *f = fopen(meminfo, "r");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) avail = kb * 1024;
    if (f) fclose(f);
    /* cgroup v1 reports "no limit" as a number near 2^63 */
    unsigned long long cap = file_bytes(limit), used = file_bytes(usage);
    if (cap > 0 && cap < (1ull << 62)) {
        unsigned long long left = cap > used ? cap - used : 0;
        if (avail == 0 || left < avail) avail = left;
    }
    return (size_t)avail;
}

size_t gpc_host_memory_available(void) {
    if (gpc_path_exists("/sys/fs/cgroup/memory.max")) /* v2, as a container sees it */
        return gpc_host_memory_available_from("/proc/meminfo", "/sys/fs/cgroup/memory.max",
                                              "/sys/fs/cgroup/memory.current");
    return gpc_host_memory_available_from("/proc/meminfo",
                                          "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                          "/sys/fs/cgroup/memory/memory.usage_in_bytes");
}

gpc_status gpc_host_memory_check(double bytes, const char *what, const char *detail,
                                 const char *advice) {
    /* what is free now, not the machine's total: other processes and the
     * cgroup's limit decide whether it fits or the OOM killer comes */
    size_t available = gpc_host_memory_available();
    if (available == 0 || bytes <= (double)available) return GPC_OK; /* 0: unknown */
    return gpc_error(GPC_ERR_NOMEM,
                     "%s about %.1f GiB of host memory%s, more than this machine has free, %.1f "
                     "GiB: %s",
                     what, bytes / (1 << 30), detail, (double)available / (1 << 30), advice);
}

/* ------------------------------------------------ device memory limit */

#define LIMIT_DEVICES 64 /* device indices counted; beyond, no limit applies */

static _Atomic size_t device_in_use[GPC_DEVICE_TYPE_COUNT][LIMIT_DEVICES];

static _Atomic size_t *in_use_of(gpc_device device) {
    if ((int)device.type < 0 || device.type >= GPC_DEVICE_TYPE_COUNT || device.index < 0 ||
        device.index >= LIMIT_DEVICES)
        return NULL;
    return &device_in_use[device.type][device.index];
}

size_t gpc_device_memory_limit(void) {
    const char *text = gpc_setting_str("GPC_DEVICE_MEMORY_LIMIT");
    if (!text || !*text) return 0;
    uint64_t bytes = 0;
    if (gpc_parse_bytes(text, &bytes) != GPC_OK) {
        static atomic_int warned;
        if (!atomic_exchange(&warned, 1))
            gpc_log(GPC_LOG_WARN, "GPC_DEVICE_MEMORY_LIMIT=%s: %s; no limit applies", text,
                    gpc_last_error());
        gpc_clear_error();
        return 0;
    }
    return (size_t)bytes;
}

size_t gpc_device_memory_in_use(gpc_device device) {
    _Atomic size_t *used = in_use_of(device);
    return used ? atomic_load(used) : 0;
}

gpc_status gpc_device_memory_reserve(gpc_device device, size_t bytes) {
    _Atomic size_t *used = in_use_of(device);
    if (!used) return GPC_OK;
    size_t limit = gpc_device_memory_limit();
    size_t now = atomic_load(used);
    do {
        if (limit && (bytes > limit || now > limit - bytes)) {
            char want[32], held[32], cap[32];
            return gpc_error(GPC_ERR_NOMEM,
                             "out of memory on %s: asked for %s with %s held, over "
                             "GPC_DEVICE_MEMORY_LIMIT=%s; lower --batch, use --recompute, or run "
                             "'gpc plan'",
                             gpc_device_name(device), gpc_format_bytes((double)bytes, want, 32),
                             gpc_format_bytes((double)now, held, 32),
                             gpc_format_bytes((double)limit, cap, 32));
        }
    } while (!atomic_compare_exchange_weak(used, &now, now + bytes));
    return GPC_OK;
}

void gpc_device_memory_release(gpc_device device, size_t bytes) {
    _Atomic size_t *used = in_use_of(device);
    if (used) atomic_fetch_sub(used, bytes);
}

gpc_status gpc_device_memory_free(gpc_device device, size_t *free_bytes, size_t *total_bytes) {
    const gpc_backend *backend;
    size_t free_now = 0, total = 0;
    GPC_TRY(gpc_backend_require(device, &backend));
    if (!backend->memory_info)
        return gpc_error(GPC_ERR_UNSUPPORTED, "%s cannot report its free memory",
                         gpc_device_name(device));
    GPC_TRY(backend->memory_info(device.index, &free_now, &total));
    size_t limit = gpc_device_memory_limit(), used = gpc_device_memory_in_use(device);
    if (limit) {
        size_t left = used < limit ? limit - used : 0;
        if (left < free_now) free_now = left;
        if (limit < total || total == 0) total = limit;
    }
    if (free_bytes) *free_bytes = free_now;
    if (total_bytes) *total_bytes = total;
    return GPC_OK;
}

void gpc_arena_measure(gpc_arena *arena, gpc_device device) {
    memset(arena, 0, sizeof *arena);
    arena->device = device;
}

gpc_status gpc_arena_create(gpc_arena *arena, gpc_device device, size_t bytes) {
    const gpc_backend *backend;
    memset(arena, 0, sizeof *arena);
    arena->device = device;
    GPC_TRY(gpc_backend_require(device, &backend));
    GPC_TRY(gpc_device_memory_reserve(device, bytes));
    gpc_status s = backend->alloc(device.index, bytes ? bytes : 1, (void **)&arena->base);
    if (s != GPC_OK) {
        gpc_device_memory_release(device, bytes);
        return s;
    }
    arena->capacity = bytes;
    arena->owns = 1;
    return GPC_OK;
}

void gpc_arena_destroy(gpc_arena *arena) {
    if (arena->owns && arena->base) {
        const gpc_backend *backend = gpc_backend_get(arena->device.type);
        if (backend) backend->free(arena->device.index, arena->base);
        gpc_device_memory_release(arena->device, arena->capacity);
    }
    memset(arena, 0, sizeof *arena);
}

gpc_status gpc_arena_tensor(gpc_arena *arena, gpc_tensor *t, gpc_dtype dtype, int ndim,
                            const int64_t *shape) {
    *t = gpc_tensor_make(NULL, dtype, arena->device, ndim, shape);
    size_t bytes = gpc_tensor_bytes(t);
    size_t offset = (arena->used + GPC_ALIGN - 1) & ~(size_t)(GPC_ALIGN - 1);
    if (arena->base) {
        if (offset + bytes > arena->capacity)
            return gpc_error(GPC_ERR_INTERNAL,
                             "arena overflow: %zu bytes asked at offset %zu of %zu; the layout "
                             "changed between measuring and placing",
                             bytes, offset, arena->capacity);
        t->data = arena->base + offset;
    }
    arena->used = offset + bytes;
    if (arena->used > arena->peak) arena->peak = arena->used;
    return GPC_OK;
}

void gpc_arena_reset(gpc_arena *arena) {
    arena->used = 0;
}
