/*
 * rng.c: PCG32 random numbers (M. E. O'Neill, "PCG: A Family of Simple Fast
 * Space-Efficient Statistically Good Algorithms for Random Number
 * Generation", 2014), plus uniform, normal and shuffle helpers on top.
 *
 * The same seed gives the same stream on every machine, which is what makes
 * `gpc train --seed S` and `--resume` reproducible bit for bit.
 */
#include "gpc/core.h"

#include <math.h>

void gpc_rng_seed(gpc_rng *rng, uint64_t seed, uint64_t stream) {
    rng->state = 0;
    rng->inc = (stream << 1u) | 1u;
    (void)gpc_rng_u32(rng);
    rng->state += seed;
    (void)gpc_rng_u32(rng);
}

uint32_t gpc_rng_u32(gpc_rng *rng) {
    uint64_t old = rng->state;
    rng->state = old * 6364136223846793005ULL + rng->inc;
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

void gpc_rng_fill_normal(gpc_rng *rng, float *out, size_t n, float mean, float stddev) {
    for (size_t i = 0; i < n; i++)
        out[i] = mean + stddev * gpc_rng_normal(rng);
}

void gpc_rng_fill_uniform(gpc_rng *rng, float *out, size_t n, float low, float high) {
    for (size_t i = 0; i < n; i++)
        out[i] = low + (high - low) * gpc_rng_uniform(rng);
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
