/* test_optim.c: the optimizer (src/model/optim.c) against AdamW written here
 * in float64, over a list of ranges with a frozen gap that must not move and
 * whose gradients must not count in the clipping norm; a ZeRO-1 shard that
 * cuts through ranges steps its elements exactly as the whole optimizer
 * does; fp16's overflow skip (read at once, on the device, or observed
 * later) and the loss scale halving and doubling; an offloaded optimizer
 * (state in host memory, chunks that cut through ranges) steps bit for bit
 * as the plain one in f32, bf16 and fp16; and the misuses. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/optim.h"
#include "ops/ops.h"

enum { MAX_RANGES = 8 };

/* A flat buffer of P elements: trained ranges with gaps between some of
 * them (frozen), random decay flags. Returns the range count. */
static int random_ranges(gpc_rng *rng, size_t P, gpc_optim_range *r) {
    int n = 0;
    size_t at = 0;
    while (at < P && n < MAX_RANGES) {
        size_t len = 1 + gpc_rng_below(rng, (uint32_t)(P / 4));
        if (len > P - at) len = P - at;
        if (gpc_rng_below(rng, 3) == 0 || (n == 1 && at < P / 2)) { /* a frozen gap */
            at += len;
            continue;
        }
        r[n] = (gpc_optim_range){at, len, (int)gpc_rng_below(rng, 2), (uint32_t)n};
        n++;
        at += len;
    }
    return n;
}

/* Which range trains element e, or -1. */
static int range_of(const gpc_optim_range *r, int n, size_t e) {
    for (int k = 0; k < n; k++)
        if (e >= r[k].offset && e < r[k].offset + r[k].count) return k;
    return -1;
}

typedef struct {
    double *w, *m, *v; /* [P], flat-indexed */
} reference;

/* One AdamW step in float64 (Loshchilov & Hutter 2019) on the trained
 * elements, clipping by the global norm of their gradients; returns that
 * norm before clipping. */
static double reference_step(reference *ref, const gpc_optim_range *r, int n, const float *grads,
                             size_t P, const gpc_optim_options *o) {
    double sq = 0;
    for (size_t e = 0; e < P; e++)
        if (range_of(r, n, e) >= 0) sq += (double)grads[e] * grads[e];
    double norm = sqrt(sq);
    double clip = o->max_grad_norm > 0 && norm > o->max_grad_norm ? o->max_grad_norm / norm : 1.0;
    double c1 = 1 - pow(o->beta1, o->step), c2 = 1 - pow(o->beta2, o->step);
    for (size_t e = 0; e < P; e++) {
        int k = range_of(r, n, e);
        if (k < 0) continue;
        double g = grads[e] * clip, wd = r[k].decay ? o->weight_decay : 0.0;
        ref->m[e] = o->beta1 * ref->m[e] + (1 - o->beta1) * g;
        ref->v[e] = o->beta2 * ref->v[e] + (1 - o->beta2) * g * g;
        double mhat = ref->m[e] / c1, vhat = ref->v[e] / c2;
        ref->w[e] -= o->learning_rate * (mhat / (sqrt(vhat) + o->eps) + wd * ref->w[e]);
    }
    return norm;
}

/* The state array st (packed in range order) spread back to flat indices. */
static void unpack(const gpc_optim_range *r, int n, const gpc_tensor *st, float *flat) {
    const float *s = st->data;
    for (int k = 0; k < n; k++) {
        memcpy(flat + r[k].offset, s, r[k].count * sizeof(float));
        s += r[k].count;
    }
}

static void test_matches_float64_reference(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 71);
    for (int trial = 0; trial < 4; trial++) {
        size_t P = 200 + gpc_rng_below(&rng, 800);
        gpc_optim_range r[MAX_RANGES];
        int n = random_ranges(&rng, P, r);
        size_t trained = 0;
        for (int k = 0; k < n; k++)
            trained += r[k].count;
        gpc_optim_layout layout = {gpc_cpu(), GPC_F32, r, n, 0, SIZE_MAX, 1, 0, 0};
        gpc_optim *opt = NULL;
        TEST_OK(gpc_optim_create(&opt, &layout));
        TEST_OK(gpc_optim_alloc(opt));
        assert_int_equal(gpc_optim_state_count(opt), trained);
        assert_null(gpc_optim_master(opt)); /* f32 parameters are their own master */

        float *w = malloc(P * sizeof *w), *g = malloc(P * sizeof *g), *w0 = malloc(P * sizeof *w0);
        float *flat = malloc(P * sizeof *flat), norm_value[1];
        reference ref = {calloc(P, 8), calloc(P, 8), calloc(P, 8)};
        gpc_rng_fill_normal(&rng, w, P, 0.0f, 1.0f);
        memcpy(w0, w, P * sizeof *w);
        for (size_t e = 0; e < P; e++)
            ref.w[e] = w[e];
        gpc_tensor params = gpc_tensor_1d(w, GPC_F32, gpc_cpu(), (int64_t)P);
        gpc_tensor grads = gpc_tensor_1d(g, GPC_F32, gpc_cpu(), (int64_t)P);
        gpc_tensor norm_sq = gpc_tensor_1d(norm_value, GPC_F32, gpc_cpu(), 1);
        gpc_optim_options o;
        gpc_optim_defaults(&o);
        o.learning_rate = 1e-2f;
        o.max_grad_norm = trial % 2 ? 1.0f : 0.0f; /* clipped (the norm is ~sqrt(P)) or not */
        for (int step = 1; step <= 5; step++) {
            gpc_rng_fill_normal(&rng, g, P, 0.0f, 1.0f);
            for (size_t e = 0; e < P; e++) /* frozen gradients that would dominate the norm */
                if (range_of(r, n, e) < 0) g[e] = 1e3f;
            o.step = step;
            double want = reference_step(&ref, r, n, g, P, &o);
            float got = 0;
            TEST_OK(gpc_optim_norm_sq(opt, &grads, 0, P, &norm_sq));
            TEST_OK(gpc_optim_step(opt, &params, &grads, 0, P, &norm_sq, &o, &got, NULL));
            if (fabs(got - want) > 1e-5 * want)
                fail_msg("step %d: norm %.9g, float64 %.9g", step, (double)got, want);
        }
        for (size_t e = 0; e < P; e++)
            if (range_of(r, n, e) < 0 && memcmp(&w[e], &w0[e], sizeof *w) != 0)
                fail_msg("frozen element %zu moved from %g to %g", e, (double)w0[e], (double)w[e]);
        test_assert_close("weights", w, ref.w, P, 1e-5, 1e-2);
        memset(flat, 0, P * sizeof *flat);
        unpack(r, n, gpc_optim_m(opt), flat);
        test_assert_close("m", flat, ref.m, P, 1e-4, 1e-3);
        unpack(r, n, gpc_optim_v(opt), flat);
        test_assert_close("v", flat, ref.v, P, 1e-4, 1e-4);
        gpc_optim_free(opt);
        free(w), free(g), free(w0), free(flat), free(ref.w), free(ref.m), free(ref.v);
    }
}

/* ZeRO-1: shards of 3 ranks that cut through ranges hold only their trained
 * elements, their norms add up to the whole one, and with the whole norm
 * (the all-reduce) each steps its elements bit for bit as the whole
 * optimizer does, leaving the rest alone. */
static void test_shards_step_like_the_whole(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 72);
    size_t P = 500 + gpc_rng_below(&rng, 500);
    gpc_optim_range r[MAX_RANGES];
    int n = random_ranges(&rng, P, r);
    float *w = malloc(P * sizeof *w), *g = malloc(P * sizeof *g), *ws = malloc(P * sizeof *ws);
    gpc_rng_fill_normal(&rng, w, P, 0.0f, 1.0f);
    memcpy(ws, w, P * sizeof *w);
    gpc_rng_fill_normal(&rng, g, P, 0.0f, 1.0f);
    float whole_sq[1], part_sq[1];
    gpc_tensor params = gpc_tensor_1d(w, GPC_F32, gpc_cpu(), (int64_t)P);
    gpc_tensor grads = gpc_tensor_1d(g, GPC_F32, gpc_cpu(), (int64_t)P);
    gpc_tensor norm_whole = gpc_tensor_1d(whole_sq, GPC_F32, gpc_cpu(), 1);
    gpc_tensor norm_part = gpc_tensor_1d(part_sq, GPC_F32, gpc_cpu(), 1);
    gpc_optim_options o;
    gpc_optim_defaults(&o);
    o.learning_rate = 1e-2f;
    gpc_optim *whole = NULL;
    gpc_optim_layout layout = {gpc_cpu(), GPC_F32, r, n, 0, SIZE_MAX, 1, 0, 0};
    TEST_OK(gpc_optim_create(&whole, &layout));
    TEST_OK(gpc_optim_alloc(whole));
    TEST_OK(gpc_optim_norm_sq(whole, &grads, 0, P, &norm_whole));
    float whole_norm_sq = whole_sq[0];
    TEST_OK(gpc_optim_step(whole, &params, &grads, 0, P, &norm_whole, &o, NULL, NULL));

    const size_t cut[4] = {0, P / 3 + 1, 2 * P / 3 + 5, P};
    double sum = 0;
    for (int rank = 0; rank < 3; rank++) {
        size_t lo = cut[rank], hi = cut[rank + 1], held = 0;
        for (int k = 0; k < n; k++) {
            size_t a = r[k].offset > lo ? r[k].offset : lo;
            size_t e = r[k].offset + r[k].count < hi ? r[k].offset + r[k].count : hi;
            held += a < e ? e - a : 0;
        }
        gpc_optim *shard = NULL;
        layout.shard_begin = lo, layout.shard_end = hi;
        TEST_OK(gpc_optim_create(&shard, &layout));
        TEST_OK(gpc_optim_alloc(shard));
        assert_int_equal(gpc_optim_state_count(shard), held);
        assert_int_equal(gpc_tensor_numel(gpc_optim_m(shard)), (int64_t)held);
        TEST_OK(gpc_optim_norm_sq(shard, &grads, lo, hi, &norm_part));
        sum += part_sq[0];
        part_sq[0] = whole_norm_sq; /* what the all-reduce leaves */
        gpc_tensor mine = gpc_tensor_1d(ws, GPC_F32, gpc_cpu(), (int64_t)P);
        TEST_FAILS(gpc_optim_step(shard, &mine, &grads, lo, hi + 1, &norm_part, &o, NULL, NULL),
                   GPC_ERR_INVALID_ARG, "holds the state of elements");
        float *before = malloc(P * sizeof *before);
        memcpy(before, ws, P * sizeof *ws);
        TEST_OK(gpc_optim_step(shard, &mine, &grads, lo, hi, &norm_part, &o, NULL, NULL));
        for (size_t e = 0; e < P; e++) {
            int inside = e >= lo && e < hi && range_of(r, n, e) >= 0;
            if (inside && memcmp(&ws[e], &w[e], sizeof *w) != 0)
                fail_msg("rank %d: element %zu is %.9g, the whole optimizer's %.9g", rank, e,
                         (double)ws[e], (double)w[e]);
            if (!inside && memcmp(&ws[e], &before[e], sizeof *w) != 0)
                fail_msg("rank %d: element %zu outside its trained shard moved", rank, e);
        }
        free(before);
        gpc_optim_free(shard);
    }
    if (fabs(sum - whole_norm_sq) > 1e-5 * whole_norm_sq)
        fail_msg("the shards' squared norms add to %.9g, the whole's is %.9g", sum,
                 (double)whole_norm_sq);
    gpc_optim_free(whole);
    free(w), free(g), free(ws);
}

/* fp16 on the CPU: parameters and gradients in fp16, f32 master. */
typedef struct {
    size_t P;
    uint16_t *w, *g;
    float norm_value[1];
    gpc_tensor params, grads, norm_sq;
    gpc_optim *opt;
} half_model;

static void half_create(half_model *h, gpc_rng *rng, size_t P, const gpc_optim_range *r, int n) {
    h->P = P;
    h->w = calloc(P, 2), h->g = calloc(P, 2);
    h->params = gpc_tensor_1d(h->w, GPC_F16, gpc_cpu(), (int64_t)P);
    h->grads = gpc_tensor_1d(h->g, GPC_F16, gpc_cpu(), (int64_t)P);
    h->norm_sq = gpc_tensor_1d(h->norm_value, GPC_F32, gpc_cpu(), 1);
    gpc_optim_layout layout = {gpc_cpu(), GPC_F16, r, n, 0, SIZE_MAX, 1, 0, 0};
    TEST_OK(gpc_optim_create(&h->opt, &layout));
    TEST_OK(gpc_optim_alloc(h->opt));
    float *values = malloc(P * sizeof *values);
    gpc_rng_fill_normal(rng, values, P, 0.0f, 0.5f);
    TEST_OK(gpc_optim_set_master(h->opt, &h->params, values));
    for (size_t e = 0; e < P; e++) {
        if (range_of(r, n, e) >= 0) { /* the master rounded to nearest */
            assert_int_equal(h->w[e], gpc_f32_to_f16(values[e]));
        } else { /* frozen: no master, the caller's to set */
            assert_int_equal(h->w[e], 0);
            h->w[e] = gpc_f32_to_f16(values[e]);
        }
    }
    free(values);
}

/* Gradients of a loss scaled by the optimizer's scale; with overflow one of
 * them is infinite, as fp16 gradients that overflowed are. */
static void half_grads(half_model *h, gpc_rng *rng, float *unscaled, int overflow) {
    float scale = gpc_optim_loss_scale(h->opt);
    for (size_t e = 0; e < h->P; e++) {
        h->g[e] = gpc_f32_to_f16((float)(gpc_rng_uniform(rng) - 0.5) * 1e-2f * scale);
        if (unscaled) unscaled[e] = gpc_f16_to_f32(h->g[e]) / scale;
    }
    if (overflow) h->g[gpc_rng_below(rng, 40)] = 0x7c00; /* +inf, in the first range */
}

static int half_step(half_model *h, const gpc_optim_options *o, float *norm, int *skipped) {
    TEST_OK(gpc_optim_norm_sq(h->opt, &h->grads, 0, h->P, &h->norm_sq));
    TEST_OK(gpc_optim_step(h->opt, &h->params, &h->grads, 0, h->P, &h->norm_sq, o, norm, skipped));
    return 0;
}

/* Copies of everything a skipped step must leave alone. */
static void snapshot(const half_model *h, unsigned char *out) {
    size_t S = gpc_optim_state_count(h->opt) * sizeof(float);
    memcpy(out, h->w, h->P * 2);
    memcpy(out + h->P * 2, gpc_optim_master(h->opt)->data, S);
    memcpy(out + h->P * 2 + S, gpc_optim_m(h->opt)->data, S);
    memcpy(out + h->P * 2 + 2 * S, gpc_optim_v(h->opt)->data, S);
}

static void test_fp16_overflow_and_loss_scale(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 73);
    const size_t P = 96;
    gpc_optim_range r[2] = {{0, 40, 1, 0}, {56, 40, 0, 1}}; /* 40..55 frozen */
    half_model h;
    half_create(&h, &rng, P, r, 2);
    assert_true(gpc_optim_loss_scale(h.opt) == 4096.0f);
    size_t bytes = P * 2 + 3 * gpc_optim_state_count(h.opt) * sizeof(float);
    unsigned char *before = malloc(bytes), *after = malloc(bytes);
    gpc_optim_options o;
    gpc_optim_defaults(&o);
    o.learning_rate = 1e-2f;

    /* read at once: skipped, NaN norm, nothing moved, the scale halves */
    half_grads(&h, &rng, NULL, 1);
    snapshot(&h, before);
    float norm = 0;
    int skipped = 0;
    half_step(&h, &o, &norm, &skipped);
    assert_int_equal(skipped, 1);
    assert_true(isnan(norm));
    assert_true(gpc_optim_step_skipped(h.opt) && !gpc_optim_check_pending(h.opt));
    assert_true(gpc_optim_loss_scale(h.opt) == 2048.0f);
    snapshot(&h, after);
    assert_memory_equal(before, after, bytes);

    /* on the device: the kernel skips; the verdict waits for resolve */
    half_grads(&h, &rng, NULL, 1);
    half_step(&h, &o, NULL, NULL);
    assert_true(gpc_optim_check_pending(h.opt));
    assert_true(gpc_optim_loss_scale(h.opt) == 2048.0f);
    snapshot(&h, after);
    assert_memory_equal(before, after, bytes);
    TEST_OK(gpc_optim_resolve(h.opt));
    assert_true(gpc_optim_step_skipped(h.opt) && !gpc_optim_check_pending(h.opt));
    assert_true(gpc_optim_loss_scale(h.opt) == 1024.0f);
    /* or observed from a norm the caller read itself (gpt_read_step) */
    half_grads(&h, &rng, NULL, 1);
    half_step(&h, &o, NULL, NULL);
    gpc_optim_observe_norm(h.opt, h.norm_value[0]);
    assert_true(gpc_optim_loss_scale(h.opt) == 512.0f && !gpc_optim_check_pending(h.opt));

    /* a clean step: the scale divided out, against float64 AdamW */
    float *g = malloc(P * sizeof *g);
    half_grads(&h, &rng, g, 0);
    reference ref = {calloc(P, 8), calloc(P, 8), calloc(P, 8)};
    float *master = malloc(P * sizeof *master);
    memset(master, 0, P * sizeof *master);
    TEST_OK(gpc_optim_get_master(h.opt, master));
    for (size_t e = 0; e < P; e++)
        ref.w[e] = master[e];
    double want = reference_step(&ref, r, 2, g, P, &o);
    half_step(&h, &o, &norm, &skipped);
    assert_int_equal(skipped, 0);
    assert_false(gpc_optim_step_skipped(h.opt));
    if (fabs(norm - want) > 1e-4 * want) fail_msg("norm %.9g, float64 %.9g", (double)norm, want);
    TEST_OK(gpc_optim_get_master(h.opt, master));
    for (size_t e = 0; e < P; e++) {
        if (range_of(r, 2, e) < 0) continue;
        if (fabs(master[e] - ref.w[e]) > 1e-5 * fmax(fabs(ref.w[e]), 1e-2))
            fail_msg("master %zu: %.9g, float64 %.9g", e, (double)master[e], ref.w[e]);
        assert_int_equal(h.w[e], gpc_f32_to_f16(master[e]));
    }
    for (size_t e = 40; e < 56; e++) /* frozen: no master, fp16 value as set */
        assert_memory_equal(&h.w[e], before + e * 2, 2);

    /* 1000 clean steps since the last change double the scale (one done) */
    for (int step = 2; step <= 1000; step++) {
        half_grads(&h, &rng, NULL, 0);
        o.step = step;
        half_step(&h, &o, NULL, NULL);
        TEST_OK(gpc_optim_resolve(h.opt));
        float expect = step < 1000 ? 512.0f : 1024.0f;
        if (gpc_optim_loss_scale(h.opt) != expect)
            fail_msg("after %d clean steps the scale is %g, not %g", step,
                     (double)gpc_optim_loss_scale(h.opt), (double)expect);
    }
    gpc_optim_free(h.opt);
    free(h.w), free(h.g), free(before), free(after), free(g), free(master);
    free(ref.w), free(ref.m), free(ref.v);
}

/* The offloaded optimizer, in chunks of 7 elements that cut through the
 * ranges, against the plain one on the same values: weights, m, v and the
 * master equal bit for bit after 6 steps, and so do the norms; in fp16 an
 * overflowed step is skipped by both, and the loss scales agree. A third,
 * offloaded with an update order (each range's halves, last range first, a
 * group each), steps alike, and so does a fourth in the same order whose
 * update runs on its thread (overlap 2: on the CPU too), waited for group
 * by group (gpc_optim_wait_group) and then whole. */
static void test_offload_steps_like_plain(void **state) {
    (void)state;
    const gpc_dtype dtypes[3] = {GPC_F32, GPC_BF16, GPC_F16};
    for (int d = 0; d < 3; d++) {
        gpc_dtype dt = dtypes[d];
        gpc_rng rng;
        gpc_rng_seed(&rng, test_seed(), 80 + (uint64_t)d);
        size_t P = 300 + gpc_rng_below(&rng, 300), size = gpc_dtype_size(dt);
        gpc_optim_range r[MAX_RANGES];
        int n = random_ranges(&rng, P, r);
        enum { RUNS = 4 };
        gpc_optim *opt[RUNS] = {NULL, NULL, NULL, NULL};
        void *w[RUNS], *g = malloc(P * size);
        float *values = malloc(P * sizeof *values), *gf = malloc(P * sizeof *gf), sq[RUNS][1];
        gpc_rng_fill_normal(&rng, values, P, 0.0f, 1.0f);
        gpc_optim_span spans[2 * MAX_RANGES];
        int ns = 0;
        for (int i = n - 1; i >= 0; i--) {
            size_t half = r[i].count / 2;
            spans[ns] = (gpc_optim_span){r[i].offset + half, r[i].count - half, ns};
            ns++;
            if (half) {
                spans[ns] = (gpc_optim_span){r[i].offset, half, ns};
                ns++;
            }
        }
        for (int k = 0; k < RUNS; k++) {
            gpc_optim_layout layout = {gpc_cpu(), dt, r, n, 0, SIZE_MAX, 1, k > 0, 7};
            TEST_OK(gpc_optim_create(&opt[k], &layout));
            if (k >= 2) TEST_OK(gpc_optim_set_offload_order(opt[k], spans, ns));
            TEST_OK(gpc_optim_alloc(opt[k]));
            assert_int_equal(gpc_optim_offloaded(opt[k]), k > 0);
            assert_true(k ? gpc_optim_host_bytes(opt[k]) > 0 : gpc_optim_host_bytes(opt[k]) == 0);
            w[k] = malloc(P * size);
            gpc_tensor host = gpc_tensor_1d(values, GPC_F32, gpc_cpu(), (int64_t)P);
            gpc_tensor params = gpc_tensor_1d(w[k], dt, gpc_cpu(), (int64_t)P);
            TEST_OK(gpc_op_convert(&params, &host)); /* frozen elements too */
            TEST_OK(gpc_optim_set_master(opt[k], &params, values));
        }
        assert_memory_equal(w[0], w[1], P * size);
        gpc_optim_options o;
        gpc_optim_defaults(&o);
        o.learning_rate = 1e-2f;
        for (int step = 1; step <= 6; step++) {
            gpc_rng_fill_normal(&rng, gf, P, 0.0f, dt == GPC_F16 ? 100.0f : 1.0f);
            if (dt == GPC_F16 && step == 3) gf[r[0].offset] = INFINITY; /* an overflow */
            gpc_tensor host = gpc_tensor_1d(gf, GPC_F32, gpc_cpu(), (int64_t)P);
            gpc_tensor grads = gpc_tensor_1d(g, dt, gpc_cpu(), (int64_t)P);
            TEST_OK(gpc_op_convert(&grads, &host));
            o.step = step;
            o.max_grad_norm = step % 2 ? 1.0f : 0.0f;
            float norm[RUNS];
            int skipped[RUNS];
            for (int k = 0; k < RUNS; k++) {
                gpc_tensor params = gpc_tensor_1d(w[k], dt, gpc_cpu(), (int64_t)P);
                gpc_tensor norm_sq = gpc_tensor_1d(sq[k], GPC_F32, gpc_cpu(), 1);
                TEST_OK(gpc_optim_norm_sq(opt[k], &grads, 0, P, &norm_sq));
                o.overlap = k == 3 ? 2 : 0;
                TEST_OK(gpc_optim_step(opt[k], &params, &grads, 0, P, &norm_sq, &o, &norm[k],
                                       &skipped[k]));
            }
            for (int group = 0; group < ns; group++) /* the update's groups as they come */
                TEST_OK(gpc_optim_wait_group(opt[3], group));
            TEST_OK(gpc_optim_settle(opt[3]));
            assert_int_equal(skipped[0], dt == GPC_F16 && step == 3);
            for (int k = 1; k < RUNS; k++) {
                assert_int_equal(skipped[0], skipped[k]);
                assert_true(skipped[0] ? isnan(norm[k]) : norm[0] == norm[k]);
                assert_true(gpc_optim_loss_scale(opt[0]) == gpc_optim_loss_scale(opt[k]));
                if (memcmp(w[0], w[k], P * size) != 0)
                    fail_msg("%s step %d: the offloaded weights differ (%s)", gpc_dtype_name(dt),
                             step,
                             k == 3   ? "overlapped"
                             : k == 2 ? "in the given order"
                                      : "in flat order");
            }
        }
        size_t count = gpc_optim_state_count(opt[0]);
        for (int k = 1; k < RUNS; k++) {
            assert_memory_equal(gpc_optim_m(opt[0])->data, gpc_optim_m(opt[k])->data, count * 4);
            assert_memory_equal(gpc_optim_v(opt[0])->data, gpc_optim_v(opt[k])->data, count * 4);
            if (dt != GPC_F32)
                assert_memory_equal(gpc_optim_master(opt[0])->data, gpc_optim_master(opt[k])->data,
                                    count * 4);
        }
        for (int k = 0; k < RUNS; k++) {
            gpc_optim_free(opt[k]);
            free(w[k]);
        }
        free(g), free(values), free(gf);
    }
}

/* A model offloaded on the CPU, its update on the optimizer's thread
 * (overlap 2) while the next forward waits layer by layer, against the same
 * model whose step waits: the same losses, evaluations and weights, bit
 * for bit, over 4 steps of two micro-steps. */
static void test_offload_overlap_model(void **state) {
    (void)state;
    enum { L = 3, C = 64, T = 32, V = 96, B = 2 };
    gpt_config config;
    TEST_OK(gpt_config_init(&config, L, 2, C, T, V));
    gpt_model *m[2] = {NULL, NULL};
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 90);
    uint64_t seed = gpc_rng_u32(&rng);
    for (int k = 0; k < 2; k++) {
        TEST_OK(gpt_create_offload(&m[k], &config, gpc_cpu(), GPC_F32, B, T, 0));
        TEST_OK(gpt_init_weights(m[k], seed));
    }
    test_offload_overlap_steps(m, 2, 1, 4, 2, B, T, V, 3e-3f, &rng, NULL, NULL);
    size_t P = gpt_num_params(m[0]);
    float *w[2] = {malloc(P * sizeof(float)), malloc(P * sizeof(float))};
    for (int k = 0; k < 2; k++) /* read while the last update may still run */
        TEST_OK(gpt_get_params(m[k], w[k]));
    assert_memory_equal(w[0], w[1], P * sizeof(float));
    for (int k = 0; k < 2; k++) {
        free(w[k]);
        gpt_free(m[k]);
    }
}

static void test_errors(void **state) {
    (void)state;
    gpc_optim *opt = NULL;
    const gpc_optim_range overlap[2] = {{0, 10, 1, 0}, {5, 10, 0, 1}};
    const gpc_optim_range two[2] = {{0, 10, 1, 0}, {10, 10, 0, 1}};
    gpc_optim_layout layout = {gpc_cpu(), GPC_F32, overlap, 2, 0, SIZE_MAX, 1, 0, 0};
    TEST_FAILS(gpc_optim_create(&opt, &layout), GPC_ERR_INVALID_ARG, "ascending offset");
    assert_null(opt);
    layout.ranges = two;
    layout.dtype = GPC_I32;
    TEST_FAILS(gpc_optim_create(&opt, &layout), GPC_ERR_INVALID_ARG, "f32, bf16 or fp16");
    layout.dtype = GPC_F32;
    layout.moments = 0; /* a model that does not train */
    TEST_OK(gpc_optim_create(&opt, &layout));
    TEST_OK(gpc_optim_alloc(opt));
    assert_null(gpc_optim_m(opt));
    float w[20] = {0}, g[20] = {0}, sq[1];
    gpc_tensor params = gpc_tensor_1d(w, GPC_F32, gpc_cpu(), 20);
    gpc_tensor grads = gpc_tensor_1d(g, GPC_F32, gpc_cpu(), 20);
    gpc_tensor norm_sq = gpc_tensor_1d(sq, GPC_F32, gpc_cpu(), 1);
    gpc_optim_options o;
    gpc_optim_defaults(&o);
    gpc_tensor short_grads = gpc_tensor_1d(g, GPC_F32, gpc_cpu(), 19);
    TEST_FAILS(gpc_optim_norm_sq(opt, &short_grads, 0, 20, &norm_sq), GPC_ERR_INVALID_ARG,
               "ranges end at element 20");
    TEST_OK(gpc_optim_norm_sq(opt, &grads, 0, 20, &norm_sq));
    TEST_FAILS(gpc_optim_step(opt, &params, &grads, 0, 20, &norm_sq, &o, NULL, NULL),
               GPC_ERR_INVALID_ARG, "without moments");
    gpc_optim_free(opt);
    /* an offloaded update's order: the trained elements, each once, in
     * groups from 0 ascending by one, given before the state is allocated */
    layout.moments = 1;
    layout.offload = 1;
    TEST_OK(gpc_optim_create(&opt, &layout));
    const gpc_optim_span good[3] = {{10, 10, 0}, {5, 5, 1}, {0, 5, 1}};
    const gpc_optim_span overlapping[3] = {{10, 10, 0}, {4, 6, 1}, {0, 5, 1}};
    const gpc_optim_span short_of[2] = {{10, 10, 0}, {0, 9, 1}};
    const gpc_optim_span beyond[2] = {{10, 11, 0}, {0, 10, 1}};
    const gpc_optim_span skipping[2] = {{10, 10, 0}, {0, 10, 2}};
    TEST_FAILS(gpc_optim_set_offload_order(opt, overlapping, 3), GPC_ERR_INVALID_ARG,
               "spans overlap");
    TEST_FAILS(gpc_optim_set_offload_order(opt, short_of, 2), GPC_ERR_INVALID_ARG,
               "leave trained elements out");
    TEST_FAILS(gpc_optim_set_offload_order(opt, beyond, 2), GPC_ERR_INVALID_ARG, "not trained");
    TEST_FAILS(gpc_optim_set_offload_order(opt, skipping, 2), GPC_ERR_INVALID_ARG, "ascend by one");
    TEST_FAILS(gpc_optim_set_offload_order(opt, good, 0), GPC_ERR_INVALID_ARG, "needs spans");
    TEST_OK(gpc_optim_set_offload_order(opt, good, 3));
    TEST_OK(gpc_optim_alloc(opt));
    TEST_FAILS(gpc_optim_set_offload_order(opt, good, 3), GPC_ERR_INVALID_ARG,
               "before gpc_optim_alloc");
    /* nothing runs: waiting for a group or for all of it returns at once */
    TEST_OK(gpc_optim_wait_group(opt, 1));
    TEST_OK(gpc_optim_settle(opt));
    gpc_optim_free(opt);
    assert_int_equal(gpc_optim_round_seed(0, 3), 0); /* round to nearest */
    for (uint32_t seed = 1; seed < 64; seed++)
        for (uint32_t id = 0; id < 64; id++) {
            assert_true(gpc_optim_round_seed(seed, id) & 1u);
            if (id)
                assert_true(gpc_optim_round_seed(seed, id) != gpc_optim_round_seed(seed, id - 1));
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_float64_reference),
        cmocka_unit_test(test_shards_step_like_the_whole),
        cmocka_unit_test(test_fp16_overflow_and_loss_scale),
        cmocka_unit_test(test_offload_steps_like_plain),
        cmocka_unit_test(test_offload_overlap_model),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
