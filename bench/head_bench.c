/*
 * head_bench.c: the output head of a training step at GPT-2's shape on the
 * GPU, two ways, timed with CUDA events (the median of --reps calls of each,
 * alternating, after 3 warm-up calls of each):
 *
 *   ops         gpc_op_matmul_forward (logits = inp . wte^T), the
 *               cross-entropy writing dlogits over the logits, and
 *               gpc_op_matmul_backward (dinp and dwte): the head as three ops
 *   classifier  gpc_op_classifier, the same computed as one op, which on a
 *               Hopper GPU never stores dlogits (classifier_sm90.cu);
 *               GPC_GEMM_SM90_HEAD=0 makes it the three ops again
 *
 *   bench_head_bench [--rows 65536] [--channels 768] [--reps 10]
 *
 * bf16, inp and wte filled from 64 random host rows repeated, targets
 * random. After the timing both ways run once more from dwte = 0 and the
 * program prints how far apart their losses, dinp and dwte are (the largest
 * difference over the largest magnitude). Prints
 * RESULT head NAME rows=... ms=... tflops=... (6 N C Vp FLOPs) and
 * RESULT head_diff loss=... dinp=... dwte=...
 * With GPC_BENCH_ENERGY_S=S each way, and the three ops' forward product and
 * backward products alone, also run back to back for S seconds at the power
 * cap: RESULT head_energy NAME mj=... pj_per_flop=... a call
 * (bench_energy.h), so the classifier's product can be set against
 * cuBLASLt's (classifier - backward against forward).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_energy.h"
#include "ops/ops.h"

#define PROG "bench_head_bench"
#define CHECK(x) BENCH_TRY(PROG, x)
#define VOCAB 50257
#define PADDED 50304

typedef struct {
    gpc_tensor inp, wte, logits, losses, targets, dinp, dwte;
} head;

static gpc_status run_ops(head *h, float dloss) {
    GPC_TRY(gpc_op_matmul_forward(&h->logits, &h->inp, &h->wte, NULL));
    GPC_TRY(gpc_op_crossentropy_forward_backward(&h->losses, &h->logits, &h->logits, &h->targets,
                                                 VOCAB, dloss));
    return gpc_op_matmul_backward(&h->dinp, &h->dwte, NULL, &h->logits, &h->inp, &h->wte);
}

static gpc_status run_classifier(head *h, float dloss) {
    return gpc_op_classifier(&h->losses, &h->dinp, &h->dwte, &h->logits, &h->inp, &h->wte,
                             &h->targets, VOCAB, dloss);
}

/* One part of the head for bench_energy_sustain: 0 the three ops, 1 the
 * classifier, 2 the forward product alone, 3 the backward products alone
 * (the logits standing in for dlogits). */
typedef struct {
    head *h;
    int part;
    float dloss;
} head_call;

static gpc_status run_part(void *ctx) {
    head_call *c = ctx;
    head *h = c->h;
    switch (c->part) {
    case 0:
        return run_ops(h, c->dloss);
    case 1:
        return run_classifier(h, c->dloss);
    case 2:
        return gpc_op_matmul_forward(&h->logits, &h->inp, &h->wte, NULL);
    default:
        return gpc_op_matmul_backward(&h->dinp, &h->dwte, NULL, &h->logits, &h->inp, &h->wte);
    }
}

/* t (device) as f32 on the host, in out (allocated here). */
static gpc_status to_host(const gpc_tensor *t, gpc_tensor *out) {
    GPC_TRY(gpc_tensor_alloc(out, GPC_F32, gpc_cpu(), t->ndim, t->shape));
    gpc_tensor same;
    GPC_TRY(gpc_tensor_alloc(&same, t->dtype, gpc_cpu(), t->ndim, t->shape));
    GPC_TRY(gpc_tensor_copy(&same, t));
    gpc_status st = gpc_op_convert(out, &same);
    gpc_tensor_free(&same);
    return st;
}

/* max |a - b| / max |b| over two host f32 tensors of n elements. */
static double rel_diff(const gpc_tensor *a, const gpc_tensor *b) {
    const float *x = a->data, *y = b->data;
    double d = 0, m = 0;
    for (int64_t i = 0; i < gpc_tensor_numel(a); i++) {
        d = fmax(d, fabs((double)x[i] - y[i]));
        m = fmax(m, fabs((double)y[i]));
    }
    return m > 0 ? d / m : d;
}

/* One run of each way from dwte = 0: their outputs on the host. */
static gpc_status compare(head *h, float dloss, double out[3]) {
    gpc_tensor res[2][3];
    for (int way = 0; way < 2; way++) {
        GPC_TRY(gpc_tensor_zero(&h->dwte));
        GPC_TRY(way ? run_classifier(h, dloss) : run_ops(h, dloss));
        GPC_TRY(to_host(&h->losses, &res[way][0]));
        GPC_TRY(to_host(&h->dinp, &res[way][1]));
        GPC_TRY(to_host(&h->dwte, &res[way][2]));
    }
    for (int k = 0; k < 3; k++) {
        out[k] = rel_diff(&res[1][k], &res[0][k]);
        gpc_tensor_free(&res[0][k]);
        gpc_tensor_free(&res[1][k]);
    }
    return GPC_OK;
}

int main(int argc, char **argv) {
    int64_t N = 65536, C = 768, reps = 10;
    if (bench_parse_rows_channels_reps(PROG, argc, argv, &N, &C, 8192, &reps)) return 2;
    double energy_s;
    if (!bench_energy_seconds(PROG, &energy_s)) return 2;
    const gpc_backend *cuda = bench_cuda(PROG);
    if (!cuda) return 1;
    gpc_device dev = {GPC_DEVICE_CUDA, 0};
    int64_t s_x[2] = {N, C}, s_w[2] = {PADDED, C}, s_l[2] = {N, PADDED}, s_n[1] = {N};
    head h;
    CHECK(gpc_tensor_alloc(&h.inp, GPC_BF16, dev, 2, s_x));
    CHECK(gpc_tensor_alloc(&h.wte, GPC_BF16, dev, 2, s_w));
    CHECK(gpc_tensor_alloc(&h.logits, GPC_BF16, dev, 2, s_l));
    CHECK(gpc_tensor_alloc(&h.losses, GPC_F32, dev, 1, s_n));
    CHECK(gpc_tensor_alloc(&h.targets, GPC_I32, dev, 1, s_n));
    CHECK(gpc_tensor_alloc(&h.dinp, GPC_BF16, dev, 2, s_x));
    CHECK(gpc_tensor_alloc(&h.dwte, GPC_BF16, dev, 2, s_w));
    gpc_rng rng;
    gpc_rng_seed(&rng, 11, 1);
    /* logits of standard deviation about 2, as a model's early steps give */
    if (bench_fill_rows(PROG, &h.inp, &rng, -1.0f, 1.0f, 64)) return 1;
    if (bench_fill_rows(PROG, &h.wte, &rng, -0.2f, 0.2f, 64)) return 1;
    gpc_tensor host_t;
    CHECK(gpc_tensor_alloc(&host_t, GPC_I32, gpc_cpu(), 1, s_n));
    for (int64_t i = 0; i < N; i++)
        ((int32_t *)host_t.data)[i] = (int32_t)(gpc_rng_uniform(&rng) * VOCAB) % VOCAB;
    CHECK(gpc_tensor_copy(&h.targets, &host_t));
    CHECK(gpc_tensor_zero(&h.dwte));
    const float dloss = 1.0f / (float)N;

    gpc_event e0, e1;
    CHECK(cuda->event_create(&e0));
    CHECK(cuda->event_create(&e1));
    static float ms[2][10000]; /* --reps is at most 10000 */
    for (int r = -3; r < reps; r++)
        for (int way = 0; way < 2; way++) {
            CHECK(cuda->event_record(e0, NULL));
            CHECK(way ? run_classifier(&h, dloss) : run_ops(&h, dloss));
            CHECK(cuda->event_record(e1, NULL));
            float t;
            CHECK(cuda->event_elapsed_ms(e0, e1, &t));
            if (r >= 0) ms[way][r] = t;
        }
    const char *names[2] = {"ops", "classifier"};
    for (int way = 0; way < 2; way++) {
        qsort(ms[way], (size_t)reps, sizeof(float), bench_cmp_float);
        float med = ms[way][reps / 2];
        printf("RESULT head %s rows=%lld channels=%lld ms=%.3f min_ms=%.3f tflops=%.1f\n",
               names[way], (long long)N, (long long)C, med, ms[way][0],
               6.0 * (double)N * (double)C * PADDED / (med * 1e9));
    }
    double diff[3];
    CHECK(compare(&h, dloss, diff));
    printf("RESULT head_diff loss=%.2e dinp=%.2e dwte=%.2e\n", diff[0], diff[1], diff[2]);
    if (energy_s > 0) {
        gpc_nvml *nvml = NULL;
        CHECK(gpc_nvml_open(&nvml));
        const char *parts[4] = {"ops", "classifier", "forward", "backward"};
        const double product = 2.0 * (double)N * (double)C * PADDED;
        const double flops[4] = {3 * product, 3 * product, product, 2 * product};
        for (int k = 0; k < 4; k++) {
            head_call call = {&h, k, dloss};
            if (bench_energy_sustain(PROG, cuda, nvml, run_part, &call, energy_s, "head_energy",
                                     parts[k], flops[k]))
                return 1;
        }
        gpc_nvml_close(nvml);
    }
    return 0;
}
