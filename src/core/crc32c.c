/*
 * crc32c.c: CRC-32C (Castagnoli polynomial 0x82F63B78, reflected), the
 * checksum of every file gpc writes. On x86-64 CPUs with SSE4.2 the
 * crc32 instruction does it 8 bytes at a time (about 4x the tables);
 * elsewhere slicing-by-8 tables, built once. Both give the same value.
 */
#include "gpc/core.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define GPC_CRC_HW 1

/* The same reflected update as the tables, without the inversions. */
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p,
                                                         size_t bytes) {
    while (bytes && ((uintptr_t)p & 7)) {
        crc = _mm_crc32_u8(crc, *p++);
        bytes--;
    }
    uint64_t c = crc;
    for (; bytes >= 8; p += 8, bytes -= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
    }
    crc = (uint32_t)c;
    while (bytes--)
        crc = _mm_crc32_u8(crc, *p++);
    return crc;
}
#endif

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;
static int hardware; /* 1: the crc32 instruction */

static void build_table(void) {
#ifdef GPC_CRC_HW
    __builtin_cpu_init();
    hardware = __builtin_cpu_supports("sse4.2");
#endif
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int s = 1; s < 8; s++)
            table[s][i] = (table[s - 1][i] >> 8) ^ table[0][table[s - 1][i] & 0xff];
}

uint32_t gpc_crc32c(uint32_t crc, const void *data, size_t bytes) {
    const unsigned char *p = data;
    pthread_once(&table_once, build_table);
    crc = ~crc;
#ifdef GPC_CRC_HW
    if (hardware) return ~crc_hw(crc, p, bytes);
#endif
    while (bytes >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                             (uint32_t)p[3] << 24);
        crc = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^
              table[4][lo >> 24] ^ table[3][p[4]] ^ table[2][p[5]] ^ table[1][p[6]] ^
              table[0][p[7]];
        p += 8;
        bytes -= 8;
    }
    while (bytes--)
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
    return ~crc;
}
