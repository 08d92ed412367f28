/*
 * dtype.c: element types and the conversions between f32 and the 16-bit
 * and 8-bit floating formats, done bit by bit so the CPU needs no special hardware.
 */
#include "gpc/core.h"

#include <math.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtype_info[GPC_DTYPE_COUNT] = {
    [GPC_F32] = {"f32", 4}, [GPC_BF16] = {"bf16", 2},     [GPC_F16] = {"f16", 2},
    [GPC_I32] = {"i32", 4}, [GPC_U16] = {"u16", 2},       [GPC_U32] = {"u32", 4},
    [GPC_I8] = {"i8", 1},   [GPC_F8E4M3] = {"f8e4m3", 1},
};

size_t gpc_dtype_size(gpc_dtype dtype) {
    return (unsigned)dtype < GPC_DTYPE_COUNT ? dtype_info[dtype].size : 0;
}

const char *gpc_dtype_name(gpc_dtype dtype) {
    return (unsigned)dtype < GPC_DTYPE_COUNT ? dtype_info[dtype].name : "unknown";
}

gpc_status gpc_dtype_parse(const char *name, gpc_dtype *out) {
    for (int i = 0; i < GPC_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_info[i].name) == 0) {
            *out = (gpc_dtype)i;
            return GPC_OK;
        }
    }
    return gpc_error(GPC_ERR_INVALID_ARG,
                     "unknown dtype '%s': use one of f32, bf16, f16, i32, u16, u32, i8, f8e4m3",
                     name);
}

static uint32_t float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float bits_float(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

uint16_t gpc_f32_to_bf16(float x) {
    uint32_t u = float_bits(x);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint16_t)((u >> 16) | 0x40);
    /* round to nearest, ties to even */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float gpc_bf16_to_f32(uint16_t x) {
    return bits_float((uint32_t)x << 16);
}

uint16_t gpc_f32_to_f16(float x) {
    uint32_t u = float_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t exponent = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t mantissa = u & 0x007fffffu;
    if (((u >> 23) & 0xff) == 0xff) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (mantissa ? 0x200u : 0));
    if (exponent >= 31) return (uint16_t)(sign | 0x7c00u); /* overflow to inf */
    if (exponent <= 0) {                                   /* subnormal or zero */
        if (exponent < -10) return (uint16_t)sign;
        mantissa |= 0x00800000u;
        uint32_t shift = (uint32_t)(14 - exponent);
        uint32_t half = mantissa >> shift;
        uint32_t rest = mantissa & ((1u << shift) - 1);
        uint32_t halfway = 1u << (shift - 1);
        if (rest > halfway || (rest == halfway && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)exponent << 10) | (mantissa >> 13);
    uint32_t rest = mantissa & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) half++; /* may carry into inf */
    return (uint16_t)half;
}

float gpc_f16_to_f32(uint16_t x) {
    uint32_t sign = (uint32_t)(x & 0x8000u) << 16;
    uint32_t exponent = (x >> 10) & 0x1f;
    uint32_t mantissa = x & 0x3ffu;
    if (exponent == 0) {
        if (mantissa == 0) return bits_float(sign);
        /* subnormal: value = mantissa * 2^-24 */
        float value = (float)mantissa * (1.0f / 16777216.0f);
        return sign ? -value : value;
    }
    if (exponent == 31) return bits_float(sign | 0x7f800000u | (mantissa << 13));
    return bits_float(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

/* E4M3: bias 7, normals 2^-6 .. 448 (1.75 * 2^8; S.1111.111 is NaN, so the
 * top binade stops at mantissa 110), subnormals m * 2^-9. Rounding works on
 * the magnitude: the spacing of representable values at |x| is 2^(e-3) for
 * the binade 2^e (e >= -6) and 2^-9 below; x / spacing rounded to nearest
 * even and multiplied back is exact in f32, since every quantity is a power
 * of two times a small integer. */
uint8_t gpc_f32_to_f8e4m3(float x) {
    uint32_t u = float_bits(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint8_t)(sign | 0x7f);
    float a = fabsf(x);
    if (!(a < GPC_F8E4M3_MAX)) return (uint8_t)(sign | 0x7e); /* saturate, inf included */
    int e;
    frexpf(a, &e); /* a = f * 2^e, f in [0.5, 1): binade 2^(e-1) */
    int binade = e - 1 < -6 ? -6 : e - 1;
    float spacing = ldexpf(1.0f, binade - 3);
    float steps = rintf(a / spacing); /* round to nearest even (default mode) */
    float r = steps * spacing;
    if (r >= GPC_F8E4M3_MAX) return (uint8_t)(sign | 0x7e);
    if (r == 0.0f) return sign;
    int re;
    frexpf(r, &re);
    int rb = re - 1; /* the binade of the rounded value (may have carried up) */
    if (rb < -6) return (uint8_t)(sign | (uint8_t)(r * 512.0f)); /* subnormal: m * 2^-9 */
    uint8_t mantissa = (uint8_t)(ldexpf(r, -rb) * 8.0f - 8.0f);
    return (uint8_t)(sign | (uint8_t)((rb + 7) << 3) | mantissa);
}

float gpc_f8e4m3_to_f32(uint8_t x) {
    int exponent = (x >> 3) & 0xf, mantissa = x & 7;
    float v;
    if (exponent == 0xf && mantissa == 7)
        v = NAN;
    else if (exponent == 0)
        v = ldexpf((float)mantissa, -9);
    else
        v = ldexpf(1.0f + (float)mantissa / 8.0f, exponent - 7);
    return (x & 0x80) ? -v : v;
}
