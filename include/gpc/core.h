/*
 * gpc core: status codes with messages, logging, tensors, devices and the
 * backend interface, memory arenas, timers and a reproducible RNG.
 *
 * Every other layer of libgpc builds on this header. Library functions return
 * a gpc_status; when it is not GPC_OK, gpc_last_error() holds one line that
 * says what was wrong and what to do about it. Nothing in the library exits.
 */
#ifndef GPC_CORE_H
#define GPC_CORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GPC_VERSION "0.1.0"

/* ---------------------------------------------------------------- status */

typedef enum {
    GPC_OK = 0,
    GPC_ERR_INVALID_ARG, /* the caller passed something wrong: a usage error */
    GPC_ERR_IO,          /* a file or socket could not be read or written */
    GPC_ERR_FORMAT,      /* a file is not what it claims: magic, version, checksum, size */
    GPC_ERR_NOMEM,       /* host or device memory ran out */
    GPC_ERR_DEVICE,      /* the GPU runtime or driver reported an error */
    GPC_ERR_UNSUPPORTED, /* asked for something this build or device cannot do */
    GPC_ERR_MISMATCH,    /* two things that must agree do not (shapes, configs) */
    GPC_ERR_INTERNAL,    /* a bug in gpc: please report it */
    GPC_ERR_INTERRUPTED, /* stopped on request (signal), state saved where it applies */
    GPC_ERR_BUSY,        /* full for now (a queue at its bound): try again later */
} gpc_status;

/* Records a formatted message for the current thread and returns code, so
 * error paths read `return gpc_error(GPC_ERR_IO, "cannot open %s: %s", ...)`. */
gpc_status gpc_error(gpc_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prepends context to the current message ("loading checkpoint: " + message). */
gpc_status gpc_error_context(gpc_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
const char *gpc_last_error(void);
const char *gpc_status_name(gpc_status code);
void gpc_clear_error(void);

#define GPC_TRY(expr)                                                                              \
    do {                                                                                           \
        gpc_status gpc_try_status_ = (expr);                                                       \
        if (gpc_try_status_ != GPC_OK) return gpc_try_status_;                                     \
    } while (0)

/* --------------------------------------------------------------- logging */

typedef enum { GPC_LOG_DEBUG = 0, GPC_LOG_INFO, GPC_LOG_WARN, GPC_LOG_ERROR } gpc_log_level;

/* Level comes from GPC_LOG (debug|info|warn|error), default info. Output goes
 * to stderr, one line per call, prefixed with the level. */
void gpc_log(gpc_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void gpc_log_set_level(gpc_log_level level);
gpc_log_level gpc_log_get_level(void);

/* ------------------------------------------------------------ data types */

typedef enum {
    GPC_F32 = 0,
    GPC_BF16,
    GPC_F16,
    GPC_I32,
    GPC_U16,
    GPC_U32,
    GPC_I8,     /* int8: quantized weights (gpc quantize --to int8) */
    GPC_F8E4M3, /* fp8 E4M3 (OCP FP8: 4 exponent, 3 mantissa bits, max 448, no inf) */
    GPC_DTYPE_COUNT
} gpc_dtype;

size_t gpc_dtype_size(gpc_dtype dtype);
const char *gpc_dtype_name(gpc_dtype dtype);
/* Parses "f32", "bf16", "f16", "i32", "u16", "u32", "i8", "f8e4m3". */
gpc_status gpc_dtype_parse(const char *name, gpc_dtype *out);

/* bf16 and f16 are stored as uint16_t on the host. bf16 conversion rounds to
 * nearest even; NaN stays NaN. */
uint16_t gpc_f32_to_bf16(float x);
float gpc_bf16_to_f32(uint16_t x);
uint16_t gpc_f32_to_f16(float x);
float gpc_f16_to_f32(uint16_t x);
/* fp8 E4M3 (the OCP FP8 format of Hopper's tensor cores) as a uint8_t:
 * conversion rounds to nearest even and saturates at +-448 (the format has
 * no infinity; NaN stays NaN, 0x7f). Decoding is exact. */
#define GPC_F8E4M3_MAX 448.0f
uint8_t gpc_f32_to_f8e4m3(float x);
float gpc_f8e4m3_to_f32(uint8_t x);

/* --------------------------------------------------------------- devices */

typedef enum { GPC_DEVICE_CPU = 0, GPC_DEVICE_CUDA = 1, GPC_DEVICE_TYPE_COUNT } gpc_device_type;

typedef struct {
    gpc_device_type type;
    int index; /* GPU ordinal; 0 for the CPU */
} gpc_device;

static inline gpc_device gpc_cpu(void) {
    gpc_device d = {GPC_DEVICE_CPU, 0};
    return d;
}
const char *gpc_device_name(gpc_device device);
/* "cpu", "cuda", "cuda:1", or "auto" (the first GPU if one is usable, else the CPU). */
gpc_status gpc_device_parse(const char *text, gpc_device *out);

/* --------------------------------------------------------------- tensors */

#define GPC_MAX_DIMS 4

/* A tensor is a plain view: it does not own its memory unless it came from
 * gpc_tensor_alloc. Data is contiguous, row-major. */
typedef struct {
    void *data;
    gpc_dtype dtype;
    gpc_device device;
    int ndim;
    int64_t shape[GPC_MAX_DIMS];
} gpc_tensor;

gpc_tensor gpc_tensor_make(void *data, gpc_dtype dtype, gpc_device device, int ndim,
                           const int64_t *shape);
/* Shorthands for the common ranks. */
gpc_tensor gpc_tensor_1d(void *data, gpc_dtype dtype, gpc_device device, int64_t d0);
gpc_tensor gpc_tensor_2d(void *data, gpc_dtype dtype, gpc_device device, int64_t d0, int64_t d1);
gpc_tensor gpc_tensor_3d(void *data, gpc_dtype dtype, gpc_device device, int64_t d0, int64_t d1,
                         int64_t d2);
int64_t gpc_tensor_numel(const gpc_tensor *t);
size_t gpc_tensor_bytes(const gpc_tensor *t);
/* Allocates through the device's backend; free with gpc_tensor_free. */
gpc_status gpc_tensor_alloc(gpc_tensor *t, gpc_dtype dtype, gpc_device device, int ndim,
                            const int64_t *shape);
void gpc_tensor_free(gpc_tensor *t);
/* Copies bytes between any two devices; dtypes and sizes must match. */
gpc_status gpc_tensor_copy(gpc_tensor *dst, const gpc_tensor *src);
/* The same copy queued on the device's compute stream (the one ops run on),
 * returning without waiting for it: the host side must be pinned memory
 * (alloc_host) that stays unchanged until the stream has passed the copy.
 * On the CPU it is gpc_tensor_copy. */
gpc_status gpc_tensor_copy_async(gpc_tensor *dst, const gpc_tensor *src);
gpc_status gpc_tensor_zero(gpc_tensor *t);
/* Describes the shape as "[4, 64, 768] f32 on cpu" into buf. */
const char *gpc_tensor_describe(const gpc_tensor *t, char *buf, size_t size);

/* --------------------------------------------------------------- backend */

struct gpc_ops_table; /* numeric operations, declared in src/ops/ops_backend.h */

typedef void *gpc_stream; /* NULL is the device's default stream */
typedef void *gpc_event;
typedef void *gpc_graph; /* a captured sequence of device work, replayed as one launch */

/* What a device offers. The CPU backend fills every entry; the CUDA backend
 * registers itself when libgpc is built with CUDA and a GPU is present. */
typedef struct gpc_backend {
    const char *name;
    gpc_device_type type;
    int (*device_count)(void);
    gpc_status (*alloc)(int index, size_t bytes, void **out);
    void (*free)(int index, void *ptr);
    /* Host memory that the device can copy from asynchronously (pinned). */
    gpc_status (*alloc_host)(size_t bytes, void **out);
    void (*free_host)(void *ptr);
    gpc_status (*memset_zero)(gpc_device device, void *ptr, size_t bytes, gpc_stream stream);
    gpc_status (*copy)(void *dst, gpc_device dst_device, const void *src, gpc_device src_device,
                       size_t bytes, gpc_stream stream);
    gpc_status (*synchronize)(int index);
    gpc_status (*memory_info)(int index, size_t *free_bytes, size_t *total_bytes);
    gpc_status (*stream_create)(int index, gpc_stream *out);
    void (*stream_destroy)(gpc_stream stream);
    gpc_status (*stream_synchronize)(gpc_stream stream);
    gpc_status (*event_create)(gpc_event *out);
    void (*event_destroy)(gpc_event event);
    gpc_status (*event_record)(gpc_event event, gpc_stream stream);
    gpc_status (*stream_wait_event)(gpc_stream stream, gpc_event event);
    /* The host waits until the work before the event's last record is done
     * (at once when it was never recorded). Callable from any thread. */
    gpc_status (*event_synchronize)(gpc_event event);
    gpc_status (*event_elapsed_ms)(gpc_event start, gpc_event stop, float *ms);
    /* The device's marketing name ("NVIDIA H200", or the CPU model). */
    gpc_status (*device_name)(int index, char *buf, size_t size);
    /* The device's PCI bus id, "0000:3B:00.0" (domain:bus:device.function, hex),
     * which names the same GPU for NVML whatever CUDA_VISIBLE_DEVICES renumbers.
     * Optional: NULL where the device has none (the CPU). */
    gpc_status (*device_pci_bus_id)(int index, char *buf, size_t size);
    /* copy queued on the compute stream without waiting (gpc_tensor_copy_async).
     * Optional: NULL makes it a plain copy. */
    gpc_status (*copy_async)(void *dst, gpc_device dst_device, const void *src,
                             gpc_device src_device, size_t bytes);
    /* Makes device index the calling thread's own (a host thread other than
     * the one that set the device up, queueing copies for it). Optional: NULL
     * where there is nothing to make current (the CPU). */
    gpc_status (*make_current)(int index);
    /* Graphs (gpc_graph_capture_begin and the functions after it). Optional:
     * NULL where the device runs every op as it is called (the CPU). */
    gpc_status (*graph_capture_begin)(int index);
    gpc_status (*graph_capture_end)(int index, gpc_graph *out);
    gpc_status (*graph_launch)(int index, gpc_graph graph);
    void (*graph_destroy)(gpc_graph graph);
    const struct gpc_ops_table *ops;
} gpc_backend;

/* The backend for a device type, or NULL (with a message) when this build or
 * machine has none. */
const gpc_backend *gpc_backend_get(gpc_device_type type);
gpc_status gpc_backend_require(gpc_device device, const gpc_backend **out);

/* Graphs: the device work one thread queues between capture_begin and
 * capture_end is recorded, not run, and becomes a graph that each
 * gpc_graph_launch replays on the compute stream with one launch. A graph
 * keeps the addresses and sizes it saw, so what it reads must vary only in
 * the contents of buffers at fixed addresses. Between begin and end the
 * thread must not allocate device memory or wait for the device; an op
 * that does fails, and capture_end then fails too. capture_end always ends
 * the capture, so call it after any begin that succeeded. The CPU backend
 * has none: gpc_graph_supported says 0 and the others GPC_ERR_UNSUPPORTED. */
int gpc_graph_supported(gpc_device device);
gpc_status gpc_graph_capture_begin(gpc_device device);
gpc_status gpc_graph_capture_end(gpc_device device, gpc_graph *out);
gpc_status gpc_graph_launch(gpc_device device, gpc_graph graph);
void gpc_graph_destroy(gpc_device device, gpc_graph graph);

/* How a backend makes itself known: find returns it, or NULL with a message
 * when this machine cannot run it (no driver, no GPU). It is called on each
 * gpc_backend_get, so it must be cheap after its first call. A later
 * registration of a type replaces the earlier one. */
typedef const gpc_backend *(*gpc_backend_finder)(void);
void gpc_backend_register(gpc_device_type type, gpc_backend_finder find);

/* ------------------------------------------------------- memory: arenas */

/* An arena hands out aligned slices of one allocation. Used to plan memory up
 * front: run the layout once with a measuring arena (base == NULL) to learn
 * the size, allocate once, run it again to place tensors. Nothing is freed
 * piecemeal; the hot loop never allocates. */
typedef struct {
    gpc_device device;
    char *base;      /* NULL while measuring */
    size_t capacity; /* bytes owned; 0 while measuring */
    size_t used;     /* bytes handed out so far (or that would be) */
    size_t peak;
    int owns;
} gpc_arena;

void gpc_arena_measure(gpc_arena *arena, gpc_device device);
gpc_status gpc_arena_create(gpc_arena *arena, gpc_device device, size_t bytes);
void gpc_arena_destroy(gpc_arena *arena);
/* Places a tensor; while measuring, t->data is NULL and only the size counts. */
gpc_status gpc_arena_tensor(gpc_arena *arena, gpc_tensor *t, gpc_dtype dtype, int ndim,
                            const int64_t *shape);
void gpc_arena_reset(gpc_arena *arena);

/* Device memory taken by arenas and tensors (gpc_arena_create,
 * gpc_tensor_alloc, and gpc_device_memory_reserve for other buffers) is
 * counted per device. GPC_DEVICE_MEMORY_LIMIT=SIZE caps each device's
 * count, on the CPU and on GPUs alike: for sharing a GPU with other jobs,
 * and for tests that make an allocation fail as on a full GPU. */
size_t gpc_device_memory_limit(void); /* bytes; 0: no limit (unset or unparsable) */
size_t gpc_device_memory_in_use(gpc_device device);
/* Counts bytes against the device's limit: GPC_ERR_NOMEM (and nothing
 * counted) when they would pass it. */
gpc_status gpc_device_memory_reserve(gpc_device device, size_t bytes);
void gpc_device_memory_release(gpc_device device, size_t bytes);
/* The backend's free and total memory of the device, each made no larger
 * than what the limit leaves (total: the limit). Either pointer may be NULL. */
gpc_status gpc_device_memory_free(gpc_device device, size_t *free_bytes, size_t *total_bytes);

/* Host memory accounting: bytes currently held through gpc_malloc. */
void *gpc_malloc(size_t bytes);
void *gpc_calloc(size_t count, size_t size);
void gpc_free(void *ptr);
size_t gpc_host_bytes_in_use(void);
size_t gpc_host_bytes_peak(void);
/* Resident set size of this process in bytes, from /proc (0 where unknown). */
size_t gpc_process_rss(void);
/* Host memory a new allocation can take: the smaller of the kernel's
 * MemAvailable and what this process's cgroup (v2 memory.max, or v1
 * memory.limit_in_bytes) leaves. 0 when neither can be read. */
size_t gpc_host_memory_available(void);
/* The same from given files (tests): meminfo like /proc/meminfo; limit and
 * usage, each NULL or a file holding a byte count ("max": no limit). */
size_t gpc_host_memory_available_from(const char *meminfo, const char *limit, const char *usage);
/* GPC_OK when `bytes` fit in the host memory available now
 * (gpc_host_memory_available; or it cannot be read); otherwise
 * GPC_ERR_NOMEM saying "<what> about X GiB of host memory<detail>, more
 * than this machine has free, Y GiB: <advice>" (what ends in its verb:
 * "this run needs"; detail is "" or " (...)"), so a run too large is
 * refused before the OOM killer ends it part way. */
gpc_status gpc_host_memory_check(double bytes, const char *what, const char *detail,
                                 const char *advice);

/* CPU cores this process may use: those of its affinity mask, fewer when its
 * cgroup's CPU quota (v2 cpu.max) allows less. At least 1. */
int gpc_host_cores_available(void);
/* The same from given values (tests): affinity cores, and a file like
 * cpu.max ("200000 100000": 2 cores; "max 100000": no quota) or NULL. */
int gpc_host_cores_available_from(int affinity, const char *cpu_max);

/* ----------------------------------------------------------------- units */

/* Parses a size such as "40G", "512MiB", "1.5K" or "4096" (powers of 1024). */
gpc_status gpc_parse_bytes(const char *text, uint64_t *out);
/* Writes a size for people: "512 B", "1.5 GiB" (one decimal above bytes).
 * Returns buf. */
const char *gpc_format_bytes(double bytes, char *buf, size_t size);

/* ---------------------------------------------------------------- timers */

double gpc_time_seconds(void); /* monotonic clock */
double gpc_wall_seconds(void); /* since the epoch */

/* ------------------------------------------------------------------- rng */

/* PCG32 (O'Neill 2014): small state, reproducible for a seed on every
 * platform, cheap to store in a checkpoint. */
typedef struct {
    uint64_t state;
    uint64_t inc;
} gpc_rng;

void gpc_rng_seed(gpc_rng *rng, uint64_t seed, uint64_t stream);
uint32_t gpc_rng_u32(gpc_rng *rng);
/* Uniform in [0, bound) without modulo bias. */
uint32_t gpc_rng_below(gpc_rng *rng, uint32_t bound);
float gpc_rng_uniform(gpc_rng *rng); /* [0, 1) */
double gpc_rng_uniform64(gpc_rng *rng);
float gpc_rng_normal(gpc_rng *rng); /* mean 0, stddev 1 (Box-Muller); 4 draws of u32 */
/* Moves the stream on by `draws` calls of gpc_rng_u32, in O(log draws). */
void gpc_rng_advance(gpc_rng *rng, uint64_t draws);
/* n values of gpc_rng_normal (uniform) in turn, the stream left after them,
 * as a loop of single draws gives; over OpenMP threads when n is large. */
void gpc_rng_fill_normal(gpc_rng *rng, float *out, size_t n, float mean, float stddev);
void gpc_rng_fill_uniform(gpc_rng *rng, float *out, size_t n, float low, float high);
void gpc_rng_shuffle_u64(gpc_rng *rng, uint64_t *items, size_t n);

/* ------------------------------------------------------------- checksums */

/* CRC-32C (Castagnoli), the checksum of every file gpc writes. */
uint32_t gpc_crc32c(uint32_t crc, const void *data, size_t bytes);

/* ----------------------------------------------------------------- files */

/* Writes a file atomically: data goes to PATH.tmp.PID, is fsynced, then
 * renamed over PATH and the directory fsynced, so a crash, a kill -9 or a
 * full disk leaves either the old file or the new one. */
typedef struct {
    char *path;
    char *tmp_path;
    void *file; /* FILE* */
    uint32_t crc;
    uint64_t bytes;
} gpc_atomic_file;

gpc_status gpc_atomic_open(gpc_atomic_file *f, const char *path);
gpc_status gpc_atomic_write(gpc_atomic_file *f, const void *data, size_t bytes);
/* Flushes, fsyncs and renames. */
gpc_status gpc_atomic_commit(gpc_atomic_file *f);
/* Removes the temporary file; safe after a failed write or commit. */
void gpc_atomic_abort(gpc_atomic_file *f);

/* Reads a whole file into memory (gpc_malloc'd, NUL-terminated). */
gpc_status gpc_read_file(const char *path, char **out, size_t *size);
/* Writes SIZE bytes of DATA as the file PATH, atomically (gpc_atomic_open). */
gpc_status gpc_write_file(const char *path, const void *data, size_t size);
/* Copies FROM to TO byte for byte, written atomically (gpc_atomic_open). */
gpc_status gpc_copy_file(const char *from, const char *to);
/* Removes the files of a flat folder, then the folder: what a failed
 * command wrote into its temporary folder. Errors are ignored. */
void gpc_remove_flat_dir(const char *dir);
/* Ends a command that wrote its output folder as the flat folder TMP: when
 * S is GPC_OK, TMP is renamed to OUT (an empty folder OUT is replaced);
 * otherwise, or when the rename fails, TMP is removed. Returns S or the
 * rename's error. */
gpc_status gpc_commit_flat_dir(const char *tmp, const char *out, gpc_status s);
/* Opens PATH for reading as a FILE* (returned in *out), refusing anything but
 * a regular file: a FIFO or a device would block or never end. WHAT names
 * the file in the message ("shard", "checkpoint"). */
gpc_status gpc_open_regular(const char *path, const char *what, void **out);
/* Makes TO a second name of the file FROM (a hard link), replacing TO
 * atomically; the directory is fsynced. */
gpc_status gpc_link_replace(const char *from, const char *to);
/* Removes PATH.tmp.PID files that gpc_atomic_open left behind, those of
 * processes that no longer run; returns how many it removed. */
int gpc_remove_stale_temporaries(const char *path);
gpc_status gpc_mkdir_p(const char *path);
/* A unix socket listening at path with permissions mode (0600: the owner
 * only) in *out. A socket file left by a server that died is replaced; when
 * a server answers there, the error is in_use (GPC_ERR_IO). */
gpc_status gpc_listen_unix(const char *path, unsigned mode, const char *in_use, int *out);
int gpc_path_exists(const char *path);
int gpc_path_is_dir(const char *path);

#ifdef __cplusplus
}
#endif

#endif /* GPC_CORE_H */
