/*
 * gpt_config.c: the GPT-2 family's sizes: checking a config, "dN" names, the
 * parameter count and the parameter tensors' names and weight-decay groups.
 */
#include "gpc/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const gpt_param_names[GPT_NUM_PARAM_TENSORS] = {
    "wte",  "wpe",  "ln1w", "ln1b", "qkvw",    "qkvb",    "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw", "fcprojb", "lnfw",     "lnfb"};

int gpt_param_decays(int index) {
    /* wte, wpe, qkvw, attprojw, fcw, fcprojw: the tensors of rank 2 (per layer) */
    return index == 0 || index == 1 || index == 4 || index == 6 || index == 10 || index == 12;
}

gpc_status gpt_config_init(gpt_config *config, int layers, int heads, int channels, int max_context,
                           int vocab_size) {
    memset(config, 0, sizeof *config);
    if (layers < 1 || layers > 1024)
        return gpc_error(GPC_ERR_INVALID_ARG, "a model needs 1 to 1024 layers, not %d", layers);
    if (heads < 1 || channels < 1)
        return gpc_error(GPC_ERR_INVALID_ARG, "a model needs at least 1 head and 1 channel");
    if (channels % heads != 0)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "%d channels do not split into %d heads; choose channels a multiple "
                         "of heads",
                         channels, heads);
    if (channels > 65536)
        return gpc_error(GPC_ERR_INVALID_ARG, "%d channels is more than gpc supports (65536)",
                         channels);
    if (max_context < 1 || max_context > 1 << 20)
        return gpc_error(GPC_ERR_INVALID_ARG, "context %d is outside 1..1048576", max_context);
    if (vocab_size < 2 || vocab_size > (1 << 30))
        return gpc_error(GPC_ERR_INVALID_ARG, "vocabulary size %d is outside 2..2^30", vocab_size);
    config->layers = layers;
    config->heads = heads;
    config->channels = channels;
    config->max_context = max_context;
    config->vocab_size = vocab_size;
    config->padded_vocab = (vocab_size + 63) / 64 * 64;
    return GPC_OK;
}

gpc_status gpt_config_parse_depth(const char *name, int *layers, int *heads, int *channels) {
    char *end;
    long depth;
    if (!name || (name[0] != 'd' && name[0] != 'D')) goto bad;
    depth = strtol(name + 1, &end, 10);
    if (end == name + 1 || *end || depth < 1 || depth > 256) goto bad;
    *layers = (int)depth;
    *heads = (int)depth;
    *channels = 64 * (int)depth;
    /* GPT-2's larger sizes (Radford et al. 2019; llm.c's d24, d36, d48):
     * head size 64 as in the rule, fewer and wider heads than it */
    static const int gpt2[][3] = {{24, 16, 1024}, {36, 20, 1280}, {48, 25, 1600}};
    for (size_t i = 0; i < sizeof gpt2 / sizeof gpt2[0]; i++)
        if (depth == gpt2[i][0]) *heads = gpt2[i][1], *channels = gpt2[i][2];
    return GPC_OK;
bad:
    return gpc_error(GPC_ERR_INVALID_ARG,
                     "unknown model '%s': write dN (N layers, N heads, 64*N channels; d12, d24, "
                     "d36, d48 are GPT-2 124M, 350M, 774M, 1.5B), N from 1 to 256",
                     name ? name : "");
}

size_t gpt_config_num_params(const gpt_config *c) {
    size_t L = (size_t)c->layers, C = (size_t)c->channels;
    size_t per_layer = 2 * C               /* ln1 */
                       + 3 * C * C + 3 * C /* qkv */
                       + C * C + C         /* attproj */
                       + 2 * C             /* ln2 */
                       + 4 * C * C + 4 * C /* fc */
                       + 4 * C * C + C;    /* fcproj */
    return (size_t)c->padded_vocab * C + (size_t)c->max_context * C + L * per_layer + 2 * C;
}

int gpt_config_equal(const gpt_config *a, const gpt_config *b, const char *what) {
    const char *name = NULL;
    int va = 0, vb = 0;
    if (a->layers != b->layers)
        name = "layers", va = a->layers, vb = b->layers;
    else if (a->heads != b->heads)
        name = "heads", va = a->heads, vb = b->heads;
    else if (a->channels != b->channels)
        name = "channels", va = a->channels, vb = b->channels;
    else if (a->max_context != b->max_context)
        name = "positions of context", va = a->max_context, vb = b->max_context;
    else if (a->vocab_size != b->vocab_size)
        name = "tokens of vocabulary", va = a->vocab_size, vb = b->vocab_size;
    else if (a->padded_vocab != b->padded_vocab)
        name = "padded vocabulary rows", va = a->padded_vocab, vb = b->padded_vocab;
    if (!name) return 1;
    gpc_error(GPC_ERR_MISMATCH, "%s was written by a model with %d %s; this config has %d",
              what ? what : "the file", va, name, vb);
    return 0;
}
