/*
 * rng.c: PCG32 random numbers (M. E. O'Neill, "PCG: A Family of Simple Fast
 * Space-Efficient Statistically Good Algorithms for Random Number
 * Generation", 2014), plus uniform, normal and shuffle helpers on top.
 *
 * The same seed gives the same stream on every machine, which is what makes
 * `gpc train --seed S` and `--resume` reproducible bit for bit. The fills
 * run over OpenMP threads in chunks, each thread jumping the stream ahead
 * to its chunk's first draw (the LCG's closed form, O(log n) steps), so
 * they give the sequential stream's values whatever the thread count.
 */
#include "gpc/core.h"

#include <math.h>

#define PCG_MULT 6364136223846793005ULL

void gpc_rng_seed(gpc_rng *rng, uint64_t seed, uint64_t stream) {
    rng->state = 0;
    rng->inc = (stream << 1u) | 1u;
    (void)gpc_rng_u32(rng);
    rng->state += seed;
    (void)gpc_rng_u32(rng);
}

uint32_t gpc_rng_u32(gpc_rng *rng) {
    uint64_t old = rng->state;
    rng->state = old * PCG_MULT + rng->inc;
    uint32_t xorshifted = (uint32_t)(((old >> 18u) ^ old) >> 27u);
    uint32_t rot = (uint32_t)(old >> 59u);
    return (xorshifted >> rot) | (xorshifted << ((-rot) & 31));
}

uint32_t gpc_rng_below(gpc_rng *rng, uint32_t bound) {
    if (bound == 0) return 0;
    uint32_t threshold = (-bound) % bound; /* rejects the biased low values */
    for (;;) {
        uint32_t r = gpc_rng_u32(rng);
        if (r >= threshold) return r % bound;
    }
}

float gpc_rng_uniform(gpc_rng *rng) {
    return (float)(gpc_rng_u32(rng) >> 8) * (1.0f / 16777216.0f);
}

double gpc_rng_uniform64(gpc_rng *rng) {
    uint64_t hi = gpc_rng_u32(rng) >> 5, lo = gpc_rng_u32(rng) >> 6;
    return (double)(hi * 67108864ULL + lo) * (1.0 / 9007199254740992.0);
}

float gpc_rng_normal(gpc_rng *rng) {
    double u1 = gpc_rng_uniform64(rng), u2 = gpc_rng_uniform64(rng);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

void gpc_rng_advance(gpc_rng *rng, uint64_t draws) {
    /* state after k steps: A state + C, with A = mult^k and C = inc (mult^(k-1)
     * + .. + 1), built from the bits of k by squaring the one-step map */
    uint64_t a = 1, c = 0, mult = PCG_MULT, plus = rng->inc;
    for (; draws; draws >>= 1) {
        if (draws & 1) a *= mult, c = c * mult + plus;
        plus = (mult + 1) * plus;
        mult *= mult;
    }
    rng->state = a * rng->state + c;
}

/* Values a fill's chunk holds: a thread's share of work, large enough that
 * jumping ahead costs nothing beside it. */
enum { FILL_CHUNK = 1 << 16 };

void gpc_rng_fill_normal(gpc_rng *rng, float *out, size_t n, float mean, float stddev) {
    const size_t chunks = (n + FILL_CHUNK - 1) / FILL_CHUNK;
    const gpc_rng start = *rng;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (size_t k = 0; k < chunks; k++) {
        gpc_rng r = start;
        gpc_rng_advance(&r, 4 * (uint64_t)k * FILL_CHUNK); /* a normal draws 4 u32 */
        const size_t end = k * FILL_CHUNK + FILL_CHUNK < n ? k * FILL_CHUNK + FILL_CHUNK : n;
        for (size_t i = k * FILL_CHUNK; i < end; i++)
            out[i] = mean + stddev * gpc_rng_normal(&r);
    }
    gpc_rng_advance(rng, 4 * (uint64_t)n);
}

void gpc_rng_fill_uniform(gpc_rng *rng, float *out, size_t n, float low, float high) {
    const size_t chunks = (n + FILL_CHUNK - 1) / FILL_CHUNK;
    const gpc_rng start = *rng;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (size_t k = 0; k < chunks; k++) {
        gpc_rng r = start;
        gpc_rng_advance(&r, (uint64_t)k * FILL_CHUNK);
        const size_t end = k * FILL_CHUNK + FILL_CHUNK < n ? k * FILL_CHUNK + FILL_CHUNK : n;
        for (size_t i = k * FILL_CHUNK; i < end; i++)
            out[i] = low + (high - low) * gpc_rng_uniform(&r);
    }
    gpc_rng_advance(rng, n);
}

void gpc_rng_shuffle_u64(gpc_rng *rng, uint64_t *items, size_t n) {
    for (size_t i = n; i > 1; i--) { /* Fisher-Yates */
        size_t j = i <= UINT32_MAX ? gpc_rng_below(rng, (uint32_t)i)
                                   : (size_t)(gpc_rng_uniform64(rng) * (double)i);
        uint64_t tmp = items[i - 1];
        items[i - 1] = items[j];
        items[j] = tmp;
    }
}
