/*
 * recompute.c: the activation-recomputation setting (a level and the count
 * of blocks it applies to, packed by GPT_RECOMPUTE in gpc/model.h): its
 * check, its name in config.txt and messages, and its parsing from the
 * command line ("block", "block:6", "2").
 */
#include "gpc/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const level_names[] = {"0", "gelu", "layernorm", "block"};

gpc_status gpt_recompute_check(int recompute, int layers) {
    if (recompute < 0)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--recompute %d is not 0 (keep activations), 1 (GELU), 2 (GELU and "
                         "layernorm) or block",
                         recompute);
    int n = recompute >> 2;
    if (n && gpt_recompute_level(recompute) == 0)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--recompute-layers %d needs a --recompute level (gelu, layernorm or "
                         "block) to apply to those blocks",
                         n);
    if (layers > 0 && n > layers)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--recompute-layers %d is more than the model's %d blocks: give 1 to %d "
                         "(or 0 for all)",
                         n, layers, layers);
    return GPC_OK;
}

const char *gpt_recompute_name(int recompute, char *buf, size_t size) {
    int level = recompute >= 0 ? gpt_recompute_level(recompute) : 0;
    int n = recompute >= 0 ? recompute >> 2 : 0;
    if (n)
        snprintf(buf, size, "%s:%d", level_names[level], n);
    else
        snprintf(buf, size, "%s", level_names[level]);
    return buf;
}

gpc_status gpt_recompute_parse(const char *text, int *recompute) {
    static const struct {
        const char *name;
        int level;
    } names[] = {{"0", 0},         {"none", 0}, {"1", 1}, {"gelu", 1}, {"2", 2},
                 {"layernorm", 2}, {"ln", 2},   {"3", 3}, {"block", 3}};
    const char *colon = strchr(text, ':');
    size_t len = colon ? (size_t)(colon - text) : strlen(text);
    int level = -1;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i].name) == len && strncmp(text, names[i].name, len) == 0)
            level = names[i].level;
    long n = 0;
    if (level >= 0 && colon) {
        char *end;
        n = strtol(colon + 1, &end, 10);
        if (end == colon + 1 || *end || n < 1 || n > (1 << 20)) level = -1;
    }
    if (level < 0 || (level == 0 && n))
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "--recompute %s is not 0, gelu (1), layernorm (2) or block (3), "
                         "optionally with :N for the first N blocks only (block:6)",
                         text);
    *recompute = GPT_RECOMPUTE(level, (int)n);
    return GPC_OK;
}
