/*
 * prefetch.c: the input pipeline of training. A host thread reads the
 * split's shards and cuts the batches of gpc_loader_next into a ring of host
 * buffers; the caller's thread hands each batch to the step, on a GPU
 * through asynchronous copies on a copy stream.
 *
 * Batch j (counted from the last start or gpc_prefetch_set_state) lives in
 * host slot j % depth and, on a GPU, in device slot j % 2. What orders them:
 *  - the thread fills host slot j % depth only once batch j - depth has
 *    left it: taken by the caller and, on a GPU, copied (the slot's
 *    `copied` event). That event wait is the one place the host waits for
 *    the device, on the thread, and only when the ring wraps: in steady
 *    state it finds a copy finished long ago;
 *  - the copy into device slot d waits, on the copy stream, for
 *    consumed[d], which the compute stream records when the caller asks
 *    for the batch after the slot's last one, i.e. once all the work that
 *    reads the slot has been queued;
 *  - the compute stream waits, on the GPU, for copied[d] before the step's
 *    first op reads the batch.
 * So the step never waits for data it could have had earlier, and the
 * caller's thread never waits for the device. Each slot carries the
 * loader's position after its batch, so the position a checkpoint stores is
 * that of the last batch returned, never that of the thread, which runs
 * ahead.
 *
 * GPC_LOADER_DELAY_MS makes the thread sleep before cutting each batch: a
 * loader slower than the step on purpose, to provoke an input-bound run
 * and check that gpc doctor names it.
 */
#include "train/data_internal.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "gpc/settings.h"

#define DEVICE_SLOTS 2
#define MAX_DEPTH 64

typedef enum {
    SLOT_FREE,    /* the thread may fill it */
    SLOT_READY,   /* holds a batch the caller has not taken yet */
    SLOT_HELD,    /* CPU: the batch the caller is using */
    SLOT_COPYING, /* GPU: its copy is queued; reusable once `copied` completes */
} slot_state;

typedef struct {
    int32_t *inputs, *targets; /* [B*T] each, in the ring's host memory */
    int64_t unmasked;
    gpc_loader_state after; /* the loader's position after this batch */
    slot_state state;
    gpc_event copied; /* GPU: recorded on the copy stream after this slot's copy */
} host_slot;

struct gpc_prefetch {
    gpc_loader *loader; /* only the thread moves it, once started */
    gpc_device device;
    const gpc_backend *backend;
    int B, T, depth, gpu;
    long delay_ms;         /* GPC_LOADER_DELAY_MS: sleep before each batch */
    size_t batch_elements; /* B*T */
    void *host_memory;     /* depth x (inputs, targets), pinned on a GPU */
    host_slot *slots;

    /* GPU: device slots and their ordering */
    void *device_memory; /* DEVICE_SLOTS x (inputs, targets) */
    gpc_stream copy_stream;
    gpc_event copied[DEVICE_SLOTS];   /* the slot's tokens have arrived */
    gpc_event consumed[DEVICE_SLOTS]; /* the compute stream is done with the slot */
    int64_t device_unmasked[DEVICE_SLOTS];
    gpc_loader_state device_after[DEVICE_SLOTS];
    uint64_t queued; /* batches whose copy has been queued */

    /* shared with the thread, under lock */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    pthread_t thread;
    int lock_ready, thread_started;
    atomic_int stop;     /* close: the thread ends (between shards while reading) */
    int done;            /* the thread has ended */
    uint64_t generation; /* set_state: a batch cut in an older one is dropped */
    int has_pending;
    gpc_loader_state pending; /* the position set_state asked for */
    uint64_t produced;        /* batches of this generation made ready */
    gpc_status error;         /* why the thread ended, with its message */
    char message[1024];

    /* the caller's side */
    uint64_t taken; /* batches returned in this generation */
    gpc_loader_state position;
    gpc_status failed; /* a failure of the caller's side, returned again after */
    char failed_message[1024];
};

/* ------------------------------------------------------------ the thread */

/* Sleeps ms in slices of at most 50 ms, so that close does not wait out a
 * long delay. */
static void loader_delay(gpc_prefetch *p, long ms) {
    while (ms > 0 && !atomic_load(&p->stop)) {
        long slice = ms < 50 ? ms : 50;
        struct timespec ts = {0, slice * 1000000L};
        nanosleep(&ts, NULL);
        ms -= slice;
    }
}

static void *prefetch_thread(void *arg) {
    gpc_prefetch *p = arg;
    gpc_status s = loader_load(p->loader, &p->stop);
    size_t n = p->batch_elements;
    pthread_mutex_lock(&p->lock);
    while (s == GPC_OK && !atomic_load(&p->stop)) {
        if (p->has_pending) {
            s = gpc_loader_set_state(p->loader, &p->pending); /* checked by the caller */
            p->has_pending = 0;
            if (s != GPC_OK) break;
        }
        uint64_t generation = p->generation;
        host_slot *slot = &p->slots[p->produced % (uint64_t)p->depth];
        if (slot->state == SLOT_READY || slot->state == SLOT_HELD) {
            pthread_cond_wait(&p->cond, &p->lock); /* the ring is full */
            continue;
        }
        int copying = slot->state == SLOT_COPYING;
        pthread_mutex_unlock(&p->lock);
        /* the slot's last copy must have left it before it is written */
        if (copying) s = p->backend->event_synchronize(slot->copied);
        loader_delay(p, p->delay_ms);
        int64_t unmasked = 0;
        gpc_loader_state after;
        if (s == GPC_OK) s = gpc_loader_next(p->loader, slot->inputs, slot->targets);
        if (s == GPC_OK) {
            for (size_t i = 0; i < n; i++)
                unmasked += slot->targets[i] >= 0;
            gpc_loader_get_state(p->loader, &after);
        }
        pthread_mutex_lock(&p->lock);
        if (s != GPC_OK) break;
        slot->state = SLOT_FREE;
        if (p->generation != generation) continue; /* dropped by set_state */
        slot->unmasked = unmasked;
        slot->after = after;
        slot->state = SLOT_READY;
        p->produced++;
        pthread_cond_broadcast(&p->cond);
    }
    if (s != GPC_OK) {
        p->error = s;
        snprintf(p->message, sizeof p->message, "%s", gpc_last_error());
    }
    p->done = 1;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

/* --------------------------------------------------------- the caller */

/* Waits (when block) until batch j is ready; *slot is its host slot, or
 * NULL when it is not ready. Fails with the thread's error (its message,
 * word for word) when the thread ended before making it. */
static gpc_status wait_ready(gpc_prefetch *p, uint64_t j, int block, host_slot **slot) {
    *slot = NULL;
    pthread_mutex_lock(&p->lock);
    while (block && p->produced <= j && !p->done)
        pthread_cond_wait(&p->cond, &p->lock);
    gpc_status s = GPC_OK;
    if (p->produced > j)
        *slot = &p->slots[j % (uint64_t)p->depth];
    else if (block && p->error != GPC_OK)
        s = gpc_error(p->error, "%s", p->message);
    else if (block)
        s = gpc_error(GPC_ERR_INTERNAL, "the prefetch thread ended before batch %llu",
                      (unsigned long long)j);
    pthread_mutex_unlock(&p->lock);
    return s;
}

static void set_slot_state(gpc_prefetch *p, host_slot *slot, slot_state state) {
    pthread_mutex_lock(&p->lock);
    slot->state = state;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
}

static int32_t *device_tokens(const gpc_prefetch *p, int d, int which) {
    return (int32_t *)p->device_memory + ((size_t)d * 2 + (size_t)which) * p->batch_elements;
}

/* GPU: queues the copy of batch j into device slot j % 2, once the work
 * reading that slot's previous batch is done. Without block, only when
 * batch j is ready already. */
static gpc_status queue_copy(gpc_prefetch *p, uint64_t j, int block) {
    host_slot *slot;
    GPC_TRY(wait_ready(p, j, block, &slot));
    if (!slot) return GPC_OK;
    int d = (int)(j % DEVICE_SLOTS);
    size_t bytes = p->batch_elements * sizeof(int32_t);
    const gpc_backend *b = p->backend;
    GPC_TRY(b->stream_wait_event(p->copy_stream, p->consumed[d]));
    GPC_TRY(
        b->copy(device_tokens(p, d, 0), p->device, slot->inputs, gpc_cpu(), bytes, p->copy_stream));
    GPC_TRY(b->copy(device_tokens(p, d, 1), p->device, slot->targets, gpc_cpu(), bytes,
                    p->copy_stream));
    GPC_TRY(b->event_record(p->copied[d], p->copy_stream));
    GPC_TRY(b->event_record(slot->copied, p->copy_stream));
    p->device_unmasked[d] = slot->unmasked;
    p->device_after[d] = slot->after;
    set_slot_state(p, slot, SLOT_COPYING);
    p->queued = j + 1;
    return GPC_OK;
}

/* The caller is done queueing work on the batch it took last. */
static gpc_status release_previous(gpc_prefetch *p) {
    if (p->taken == 0) return GPC_OK;
    uint64_t j = p->taken - 1;
    if (p->gpu) return p->backend->event_record(p->consumed[j % DEVICE_SLOTS], NULL);
    set_slot_state(p, &p->slots[j % (uint64_t)p->depth], SLOT_FREE);
    return GPC_OK;
}

static gpc_status caller_failed(gpc_prefetch *p, gpc_status s) {
    p->failed = s;
    snprintf(p->failed_message, sizeof p->failed_message, "%s", gpc_last_error());
    return s;
}

gpc_status gpc_prefetch_next(gpc_prefetch *p, gpc_batch *batch) {
    if (p->failed != GPC_OK) return gpc_error(p->failed, "%s", p->failed_message);
    memset(batch, 0, sizeof *batch);
    gpc_status s = release_previous(p);
    uint64_t j = p->taken;
    int64_t B = p->B, T = p->T;
    if (s == GPC_OK && p->gpu) {
        int d = (int)(j % DEVICE_SLOTS);
        if (p->queued <= j) s = queue_copy(p, j, 1);
        if (s == GPC_OK) s = p->backend->stream_wait_event(NULL, p->copied[d]);
        /* the next batch's copy overlaps this step when it is ready now */
        if (s == GPC_OK && p->queued == j + 1) s = queue_copy(p, j + 1, 0);
        if (s == GPC_OK) {
            batch->inputs = gpc_tensor_2d(device_tokens(p, d, 0), GPC_I32, p->device, B, T);
            batch->targets = gpc_tensor_2d(device_tokens(p, d, 1), GPC_I32, p->device, B, T);
            batch->unmasked = p->device_unmasked[d];
            p->position = p->device_after[d];
        }
    } else if (s == GPC_OK) {
        host_slot *slot;
        s = wait_ready(p, j, 1, &slot);
        if (s == GPC_OK) {
            set_slot_state(p, slot, SLOT_HELD);
            batch->inputs = gpc_tensor_2d(slot->inputs, GPC_I32, p->device, B, T);
            batch->targets = gpc_tensor_2d(slot->targets, GPC_I32, p->device, B, T);
            batch->unmasked = slot->unmasked;
            p->position = slot->after;
        }
    }
    if (s != GPC_OK) return caller_failed(p, s);
    p->taken = j + 1;
    return GPC_OK;
}

gpc_status gpc_prefetch_set_state(gpc_prefetch *p, const gpc_loader_state *state) {
    GPC_TRY(loader_check_state(p->loader, state));
    if (p->failed != GPC_OK) return gpc_error(p->failed, "%s", p->failed_message);
    gpc_status s = release_previous(p);
    /* copies still queued read host slots the thread is about to refill */
    if (s == GPC_OK && p->gpu) s = p->backend->stream_synchronize(p->copy_stream);
    if (s != GPC_OK) return caller_failed(p, s);
    pthread_mutex_lock(&p->lock);
    p->generation++;
    p->pending = *state;
    p->has_pending = 1;
    p->produced = 0;
    for (int i = 0; i < p->depth; i++)
        p->slots[i].state = SLOT_FREE;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    p->taken = 0;
    p->queued = 0;
    p->position = *state;
    return GPC_OK;
}

void gpc_prefetch_get_state(const gpc_prefetch *p, gpc_loader_state *state) {
    *state = p->position;
}

uint64_t gpc_prefetch_batches_per_epoch(const gpc_prefetch *p) {
    return gpc_loader_batches_per_epoch(p->loader); /* fixed at open: no race with the thread */
}

/* ------------------------------------------------------- open and close */

static gpc_status start_thread(gpc_prefetch *p) {
    int r = pthread_mutex_init(&p->lock, NULL);
    if (r == 0 && (r = pthread_cond_init(&p->cond, NULL)) != 0) pthread_mutex_destroy(&p->lock);
    if (r == 0) {
        p->lock_ready = 1;
        /* signals (Ctrl-C, gpcd's SIGTERM) go to the caller's threads and
         * never interrupt a shard read here */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        r = pthread_create(&p->thread, NULL, prefetch_thread, p);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    if (r != 0)
        return gpc_error(GPC_ERR_NOMEM, "cannot start the data loader's thread: %s", strerror(r));
    p->thread_started = 1;
    return GPC_OK;
}

static gpc_status create_gpu_side(gpc_prefetch *p) {
    const gpc_backend *b = p->backend;
    size_t bytes = (size_t)DEVICE_SLOTS * 2 * p->batch_elements * sizeof(int32_t);
    GPC_TRY(b->stream_create(p->device.index, &p->copy_stream)); /* also makes the GPU current */
    GPC_TRY(gpc_device_memory_reserve(p->device, bytes));        /* GPC_DEVICE_MEMORY_LIMIT */
    gpc_status s = b->alloc(p->device.index, bytes, &p->device_memory);
    if (s != GPC_OK) {
        gpc_device_memory_release(p->device, bytes);
        return s;
    }
    for (int d = 0; d < DEVICE_SLOTS; d++) {
        GPC_TRY(b->event_create(&p->copied[d]));
        GPC_TRY(b->event_create(&p->consumed[d]));
    }
    for (int i = 0; i < p->depth; i++)
        GPC_TRY(b->event_create(&p->slots[i].copied));
    return GPC_OK;
}

gpc_status gpc_prefetch_open(gpc_prefetch **out, const char *dir, gpc_split split, int B, int T,
                             uint64_t seed, int rank, int world_size, gpc_device device,
                             int depth) {
    *out = NULL;
    if (depth == 0) depth = GPC_PREFETCH_DEPTH;
    if (depth < 2 || depth > MAX_DEPTH)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "the data loader needs 2 to %d batches in flight, not %d (two: one for "
                         "the step, one being prepared)",
                         MAX_DEPTH, depth);
    long delay_ms;
    GPC_TRY(gpc_setting_int_checked("GPC_LOADER_DELAY_MS", &delay_ms));
    const gpc_backend *backend;
    GPC_TRY(gpc_backend_require(device, &backend));
    gpc_loader *loader;
    GPC_TRY(loader_open_unloaded(&loader, dir, split, B, T, seed, rank, world_size));
    gpc_prefetch *p = gpc_calloc(1, sizeof *p);
    if (!p) {
        gpc_loader_close(loader);
        return gpc_error(GPC_ERR_NOMEM, "out of host memory opening the data loader");
    }
    p->loader = loader;
    p->device = device;
    p->backend = backend;
    p->B = B;
    p->T = T;
    p->depth = depth;
    p->delay_ms = delay_ms;
    p->gpu = device.type != GPC_DEVICE_CPU;
    p->batch_elements = (size_t)B * (size_t)T;
    gpc_loader_get_state(loader, &p->position);
    gpc_status s = GPC_OK;
    size_t slot_bytes = 2 * p->batch_elements * sizeof(int32_t);
    p->slots = gpc_calloc((size_t)depth, sizeof *p->slots);
    if (!p->slots) s = gpc_error(GPC_ERR_NOMEM, "out of host memory opening the data loader");
    /* the GPU side first: it makes the GPU current, so the pinned ring
     * belongs to its context */
    if (s == GPC_OK && p->gpu) s = create_gpu_side(p);
    if (s == GPC_OK) s = backend->alloc_host(slot_bytes * (size_t)depth, &p->host_memory);
    for (int i = 0; s == GPC_OK && i < depth; i++) {
        p->slots[i].inputs = (int32_t *)((char *)p->host_memory + slot_bytes * (size_t)i);
        p->slots[i].targets = p->slots[i].inputs + p->batch_elements;
    }
    if (s == GPC_OK) s = start_thread(p);
    if (s != GPC_OK) {
        gpc_prefetch_close(p);
        return s;
    }
    *out = p;
    return GPC_OK;
}

void gpc_prefetch_close(gpc_prefetch *p) {
    if (!p) return;
    if (p->thread_started) {
        pthread_mutex_lock(&p->lock);
        atomic_store(&p->stop, 1);
        pthread_cond_broadcast(&p->cond);
        pthread_mutex_unlock(&p->lock);
        pthread_join(p->thread, NULL);
    }
    if (p->lock_ready) {
        pthread_cond_destroy(&p->cond);
        pthread_mutex_destroy(&p->lock);
    }
    const gpc_backend *b = p->backend;
    if (p->gpu && b) {
        /* nothing may still read the buffers: queued copies, or steps that
         * read the device slots */
        if (p->copy_stream) (void)b->stream_synchronize(p->copy_stream);
        (void)b->synchronize(p->device.index);
        for (int d = 0; d < DEVICE_SLOTS; d++) {
            if (p->copied[d]) b->event_destroy(p->copied[d]);
            if (p->consumed[d]) b->event_destroy(p->consumed[d]);
        }
        for (int i = 0; p->slots && i < p->depth; i++)
            if (p->slots[i].copied) b->event_destroy(p->slots[i].copied);
        if (p->device_memory) {
            b->free(p->device.index, p->device_memory);
            gpc_device_memory_release(p->device, (size_t)DEVICE_SLOTS * 2 * p->batch_elements *
                                                     sizeof(int32_t));
        }
        if (p->copy_stream) b->stream_destroy(p->copy_stream);
    }
    if (p->host_memory && b) b->free_host(p->host_memory);
    gpc_free(p->slots);
    gpc_loader_close(p->loader);
    gpc_free(p);
}
