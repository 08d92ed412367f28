/*
 * cpu_backend.c: the CPU device: memory from the C heap (aligned for SIMD),
 * copies with memcpy, and no-op streams and synchronisation (CPU work is
 * finished when the call returns). The numeric ops live in the other files of
 * this folder and are gathered in gpc_cpu_ops (cpu_ops.c).
 */
#include "cpu/cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int cpu_device_count(void) {
    return 1;
}

static gpc_status cpu_alloc(int index, size_t bytes, void **out) {
    (void)index;
    size_t rounded = (bytes + 255) & ~(size_t)255;
    *out = aligned_alloc(256, rounded ? rounded : 256); /* matches the arena alignment */
    if (!*out)
        return gpc_error(GPC_ERR_NOMEM,
                         "out of host memory allocating %.1f MiB: use a smaller model or batch",
                         (double)bytes / (1 << 20));
    return GPC_OK;
}

static void cpu_free(int index, void *ptr) {
    (void)index;
    free(ptr);
}

static gpc_status cpu_alloc_host(size_t bytes, void **out) {
    return cpu_alloc(0, bytes, out);
}

static void cpu_free_host(void *ptr) {
    free(ptr);
}

static gpc_status cpu_memset_zero(gpc_device device, void *ptr, size_t bytes, gpc_stream stream) {
    (void)device;
    (void)stream;
    if (bytes) memset(ptr, 0, bytes);
    return GPC_OK;
}

static gpc_status cpu_copy(void *dst, gpc_device dst_device, const void *src, gpc_device src_device,
                           size_t bytes, gpc_stream stream) {
    (void)stream;
    if (dst_device.type != GPC_DEVICE_CPU || src_device.type != GPC_DEVICE_CPU)
        return gpc_error(GPC_ERR_INTERNAL, "the CPU backend was asked to copy GPU memory");
    if (bytes && dst != src) memmove(dst, src, bytes);
    return GPC_OK;
}

static gpc_status cpu_synchronize(int index) {
    (void)index;
    return GPC_OK;
}

static gpc_status cpu_memory_info(int index, size_t *free_bytes, size_t *total_bytes) {
    (void)index;
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
    long page = sysconf(_SC_PAGESIZE);
    *total_bytes = pages > 0 ? (size_t)pages * (size_t)page : 0;
    *free_bytes = avail > 0 ? (size_t)avail * (size_t)page : 0;
    return GPC_OK;
}

static gpc_status cpu_stream_create(int index, gpc_stream *out) {
    (void)index;
    *out = NULL;
    return GPC_OK;
}

static void cpu_stream_destroy(gpc_stream stream) {
    (void)stream;
}

static gpc_status cpu_stream_synchronize(gpc_stream stream) {
    (void)stream;
    return GPC_OK;
}

/* A CPU event is the time it was recorded, so elapsed time works the same way
 * on both backends in benchmarks. */
static gpc_status cpu_event_create(gpc_event *out) {
    double *t = calloc(1, sizeof *t);
    if (!t) return gpc_error(GPC_ERR_NOMEM, "out of memory creating an event");
    *out = t;
    return GPC_OK;
}

static void cpu_event_destroy(gpc_event event) {
    free(event);
}

static gpc_status cpu_event_record(gpc_event event, gpc_stream stream) {
    (void)stream;
    *(double *)event = gpc_time_seconds();
    return GPC_OK;
}

static gpc_status cpu_stream_wait_event(gpc_stream stream, gpc_event event) {
    (void)stream;
    (void)event;
    return GPC_OK;
}

static gpc_status cpu_event_synchronize(gpc_event event) {
    (void)event;
    return GPC_OK;
}

static gpc_status cpu_event_elapsed_ms(gpc_event start, gpc_event stop, float *ms) {
    *ms = (float)((*(double *)stop - *(double *)start) * 1e3);
    return GPC_OK;
}

static gpc_status cpu_device_name(int index, char *buf, size_t size) {
    (void)index;
    snprintf(buf, size, "CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && colon) {
            snprintf(buf, size, "%s", colon + 2);
            buf[strcspn(buf, "\n")] = '\0';
            break;
        }
    }
    if (f) fclose(f);
    return GPC_OK;
}

static const gpc_backend cpu_backend = {
    .name = "cpu",
    .type = GPC_DEVICE_CPU,
    .device_count = cpu_device_count,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .alloc_host = cpu_alloc_host,
    .free_host = cpu_free_host,
    .memset_zero = cpu_memset_zero,
    .copy = cpu_copy,
    .synchronize = cpu_synchronize,
    .memory_info = cpu_memory_info,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_synchronize = cpu_stream_synchronize,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_synchronize = cpu_event_synchronize,
    .event_elapsed_ms = cpu_event_elapsed_ms,
    .device_name = cpu_device_name,
    .ops = &gpc_cpu_ops,
};

static const gpc_backend *cpu_backend_find(void) {
    return &cpu_backend;
}

/* Runs before main (core/backend.c says why a constructor); extern so that
 * the build can name it to keep this object in every link. */
__attribute__((constructor)) void gpc_cpu_backend_register(void) {
    gpc_backend_register(GPC_DEVICE_CPU, cpu_backend_find);
}
