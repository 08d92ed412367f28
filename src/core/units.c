/*
 * units.c: sizes written the way people write them ("40G", "512MiB",
 * "1.5K"), in powers of 1024, as GPU memory is counted. One parser serves
 * the command line, gpcd's configuration and its API.
 */
#include "gpc/core.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

gpc_status gpc_parse_bytes(const char *text, uint64_t *out) {
    if (!text || !*text) return gpc_error(GPC_ERR_INVALID_ARG, "empty size (write 40G or 512M)");
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || errno || !isfinite(v) || v < 0)
        return gpc_error(GPC_ERR_INVALID_ARG, "size '%s' is not a size such as 40G or 512M", text);
    double unit = 1;
    switch (*end) {
    case 'k':
    case 'K':
        unit = 1024.0;
        break;
    case 'm':
    case 'M':
        unit = 1024.0 * 1024;
        break;
    case 'g':
    case 'G':
        unit = 1024.0 * 1024 * 1024;
        break;
    case 't':
    case 'T':
        unit = 1024.0 * 1024 * 1024 * 1024;
        break;
    default:
        break;
    }
    if (unit > 1) end++;
    if (*end == 'i' && unit > 1) end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end)
        return gpc_error(GPC_ERR_INVALID_ARG, "size '%s' has an unknown unit (use K, M, G or T)",
                         text);
    if (v * unit > 1e18) return gpc_error(GPC_ERR_INVALID_ARG, "size '%s' is too large", text);
    *out = (uint64_t)(v * unit);
    return GPC_OK;
}

const char *gpc_format_bytes(double bytes, char *buf, size_t size) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024 && u < 4) {
        bytes /= 1024;
        u++;
    }
    snprintf(buf, size, u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
    return buf;
}
