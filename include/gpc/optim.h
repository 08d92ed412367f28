/*
 * gpc optim: AdamW with f32 master weights and fp16 loss scaling, over a
 * list of trainable ranges of a flat parameter buffer.
 *
 * A model keeps its parameters and gradients in flat buffers; the optimizer
 * is told which ranges of them it trains (each with its weight-decay flag
 * and stochastic-rounding id) and, for ZeRO-1, which span of the flat layout
 * this process owns. It holds state only for the trained elements inside
 * that span: the AdamW moments m and v (f32) and, when the parameters are
 * bf16 or fp16, their f32 master copy. The state arrays are packed in range
 * order, so with ranges that tile [lo, hi) element e sits at e - lo.
 *
 * Elements outside every range are frozen: no state, no update, and their
 * gradients do not count in the clipping norm. That is the shape a frozen
 * base model under LoRA adapters, or weights kept in another type, needs.
 *
 * Offloaded (layout.offload), master, m and v live in the device's pinned
 * host memory instead of on the device (ZeRO-Offload, Ren et al. 2021).
 * A step copies the gradients to the host chunk by chunk on a copy stream,
 * runs the CPU backend's AdamW on each chunk as soon as it has arrived, and
 * copies the updated compute-dtype weights back on a second stream: the
 * download of chunk k+1, the update of chunk k and the upload of chunk k-1
 * overlap. The chunks follow the order gpc_optim_set_offload_order gives (a
 * model's layers as its forward reads them). A plain step returns once
 * every chunk is updated and the device's next work waits for the last
 * upload. An overlapped step (options.overlap, on a GPU) returns once the
 * gradient norm is read: a host thread updates the chunks while the caller
 * queues the next forward, whose reads of each group's weights wait for
 * that group alone (gpc_optim_wait_group). The CPU update rounds bf16 to
 * nearest (no stochastic rounding).
 *
 * fp16 gradients are computed from a loss scaled by gpc_optim_loss_scale
 * (Micikevicius et al. 2018); the step divides it out, skips a step whose
 * gradients overflowed, and adapts the scale.
 */
#ifndef GPC_OPTIM_H
#define GPC_OPTIM_H

#include "gpc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* AdamW's settings for one step (Loshchilov & Hutter 2019). */
typedef struct {
    float learning_rate;
    float beta1;         /* default 0.9 */
    float beta2;         /* default 0.95 */
    float eps;           /* default 1e-8 */
    float weight_decay;  /* default 0.1, on ranges with decay set only */
    float max_grad_norm; /* clip the global norm to this; 0 disables */
    int step;            /* 1-based optimizer step, for bias correction */
    uint32_t seed;       /* 0: round to nearest; else stochastic rounding of bf16 */
    /* offloaded on a GPU: return once the norm is read and leave the update
     * running on a host thread (see gpc_optim_wait_group); ignored elsewhere.
     * 2: on the CPU too (tests of the thread: there the update competes with
     * the forward for the cores) */
    int overlap;
} gpc_optim_options;

void gpc_optim_defaults(gpc_optim_options *options);

/* One trainable tensor (or part of one) of the flat buffers. */
typedef struct {
    size_t offset, count; /* elements of the flat parameter and gradient buffers */
    int decay;            /* AdamW's weight decay applies (2-D weights) */
    uint32_t round_id;    /* with the step's seed, seeds this range's stochastic rounding */
} gpc_optim_range;

typedef struct {
    gpc_device device;
    gpc_dtype dtype; /* of the parameters and gradients: f32, bf16 or f16 */
    /* the trainable ranges, by ascending offset and disjoint (copied) */
    const gpc_optim_range *ranges;
    int range_count;
    /* ZeRO-1: state only for the elements in [shard_begin, shard_end);
     * 0 and SIZE_MAX for all of them */
    size_t shard_begin, shard_end;
    int moments; /* 0: master weights only, for a model that does not train */
    /* 1: the state in pinned host memory, updated on CPU threads; needs
     * the whole state stepped at once (no shard) */
    int offload;
    size_t offload_chunk; /* elements per copy and update; 0: GPC_OPTIM_OFFLOAD_CHUNK */
} gpc_optim_layout;

/* Elements per offloaded chunk: 16 MiB of bf16 gradients, large enough
 * for full-speed copies over PCIe, small enough to overlap. */
#define GPC_OPTIM_OFFLOAD_CHUNK ((size_t)8 << 20)

typedef struct gpc_optim gpc_optim;

/* Checks the layout and keeps it; the state has no memory until
 * gpc_optim_place or gpc_optim_alloc. */
gpc_status gpc_optim_create(gpc_optim **out, const gpc_optim_layout *layout);
/* Places master, m and v (in that order; those that exist) in an arena:
 * a measuring one, then the real one, as a model plans its memory. An
 * offloaded optimizer places nothing: gpc_optim_alloc gives it host memory. */
gpc_status gpc_optim_place(gpc_optim *optim, gpc_arena *arena);
/* Places the state in an arena of its own (callers that plan no memory);
 * offloaded: in pinned host memory, with the staging buffers, copy streams
 * and events of the step. */
gpc_status gpc_optim_alloc(gpc_optim *optim);
/* Whether the state is offloaded, and the pinned host bytes it holds. */
int gpc_optim_offloaded(const gpc_optim *optim);
size_t gpc_optim_host_bytes(const gpc_optim *optim);
/* Zeroes master, m and v. */
gpc_status gpc_optim_zero(gpc_optim *optim);
void gpc_optim_free(gpc_optim *optim);

/* A span of the flat buffers in an offloaded update's order, and its group. */
typedef struct {
    size_t offset, count;
    int group;
} gpc_optim_span;

/* Offloaded: the order the host updates the state in, before
 * gpc_optim_alloc. Spans are tagged with groups 0, 1, ... (each group's
 * spans together, groups ascending) and cover every trained element once:
 * a model's embedding, then each layer, then its head, as its forward reads
 * them. Without an order the state is one group in flat order. Nothing for
 * a state on the device. */
gpc_status gpc_optim_set_offload_order(gpc_optim *optim, const gpc_optim_span *spans, int count);
/* After an overlapped step: waits until the weights of group (and every
 * group before it) are queued on their way to the device, and makes the
 * device's stream wait for them, so the ops queued next read the new
 * weights. A group past the last waits for the whole update. Nothing when
 * no update is running; an update that failed reports its error here. */
gpc_status gpc_optim_wait_group(gpc_optim *optim, int group);
/* Waits for the whole running update: the host state is final and the
 * device's stream waits for the last upload. The state accessors below,
 * and every function that reads or writes the state, settle first. */
gpc_status gpc_optim_settle(gpc_optim *optim);

/* Elements in each state array: the trained elements inside the shard. */
size_t gpc_optim_state_count(const gpc_optim *optim);
/* The state arrays ([state_count] f32, packed in range order); master is
 * NULL with f32 parameters (the parameters are their own master) and m, v
 * NULL without moments. Offloaded, they are host (CPU) tensors. */
const gpc_tensor *gpc_optim_master(const gpc_optim *optim);
const gpc_tensor *gpc_optim_m(const gpc_optim *optim);
const gpc_tensor *gpc_optim_v(const gpc_optim *optim);

/* Low-precision parameters: sets the held master elements from values
 * (host f32, indexed like the flat buffer) and rounds them to nearest into
 * params, the flat buffer. The rest of params is the caller's. */
gpc_status gpc_optim_set_master(gpc_optim *optim, gpc_tensor *params, const float *values);
/* Rounds the held master elements to nearest into params, the flat buffer
 * (a checkpoint's master was just read). Nothing with f32 parameters. */
gpc_status gpc_optim_master_to_params(gpc_optim *optim, gpc_tensor *params);
/* Copies the held master elements into values (host f32, flat-indexed). */
gpc_status gpc_optim_get_master(const gpc_optim *optim, float *values);
/* The master as one host array indexed like the flat buffer's first count
 * elements, where it is one: offloaded, holding every element of
 * [0, count) in order. Values written there reach the parameters through
 * gpc_optim_master_to_params, with no f32 copy of the model beside them.
 * NULL otherwise. */
float *gpc_optim_host_master(const gpc_optim *optim, size_t count);

/* Zeroes norm_sq (device f32 [1]) and adds the squared gradients of the
 * trained elements in [begin, end) of grads, the flat gradient buffer.
 * Data parallelism sums it over the ranks before gpc_optim_step. A pending
 * overflow verdict is read first, since it may sit in the same buffer. */
gpc_status gpc_optim_norm_sq(gpc_optim *optim, const gpc_tensor *grads, size_t begin, size_t end,
                             gpc_tensor *norm_sq);
/* AdamW on the trained elements in [begin, end) (inside the shard), with
 * the gradients clipped to the global norm in norm_sq and divided by the
 * loss scale. fp16: a step whose norm is not finite is skipped and the
 * scale halved. With grad_norm or skipped given, the norm is read here (a
 * wait for the device); with neither, nothing waits: the kernels skip the
 * step on the device, and gpc_optim_observe_norm or gpc_optim_resolve
 * later adapts the scale. *grad_norm (optional) gets the norm before
 * clipping, NaN when skipped. */
gpc_status gpc_optim_step(gpc_optim *optim, gpc_tensor *params, const gpc_tensor *grads,
                          size_t begin, size_t end, gpc_tensor *norm_sq,
                          const gpc_optim_options *options, float *grad_norm, int *skipped);

/* fp16 loss scaling: the factor the loss is multiplied by (1 for f32 and
 * bf16; fp16 starts at 4096), set on resuming a run. */
float gpc_optim_loss_scale(const gpc_optim *optim);
void gpc_optim_set_loss_scale(gpc_optim *optim, float scale);
/* Whether the last step was skipped (fp16 overflow; known once observed). */
int gpc_optim_step_skipped(const gpc_optim *optim);
/* Whether a step's overflow verdict is still on the device. */
int gpc_optim_check_pending(const gpc_optim *optim);
/* The verdict of a pending step from its squared norm, read by the caller
 * (with other values, in one copy). Nothing when no check is pending. */
void gpc_optim_observe_norm(gpc_optim *optim, float norm_sq);
/* The same, reading the pending step's norm from the device (waits). */
gpc_status gpc_optim_resolve(gpc_optim *optim);

/* The stochastic-rounding seed of a range: 0 (round to nearest) when the
 * step's seed is 0, otherwise a non-zero seed of its own for each id. */
uint32_t gpc_optim_round_seed(uint32_t step_seed, uint32_t round_id);

#ifdef __cplusplus
}
#endif

#endif /* GPC_OPTIM_H */
