/*
 * eval.c: the cross-entropy of a model on a token stream (`gpc eval`), what
 * a user measures to check an imported or fine-tuned model.
 *
 * Each window's logits are copied to the host and the cross-entropy of each
 * position is computed there in double (log-sum-exp less the target's
 * logit), so the per-token values do not depend on the device's reduction
 * order and can be compared with another framework's token by token.
 */
#include "gpc/train.h"

#include <math.h>
#include <stdlib.h>

gpc_status gpc_eval_tokens(gpt_model *model, const gpt_config *config, int context,
                           const uint32_t *tokens, size_t count, float *losses,
                           gpc_eval_result *result) {
    if (count < 2)
        return gpc_error(GPC_ERR_INVALID_ARG,
                         "evaluation needs at least 2 tokens (one to predict from, one to "
                         "predict); the text has %zu",
                         count);
    if (context < 1 || context > config->max_context)
        return gpc_error(GPC_ERR_INVALID_ARG, "context %d is out of range: the model knows 1..%d",
                         context, config->max_context);
    const size_t V = (size_t)config->vocab_size;
    for (size_t i = 0; i < count; i++)
        if (tokens[i] >= V)
            return gpc_error(GPC_ERR_INVALID_ARG,
                             "token %u at position %zu is outside the model's vocabulary of %zu: "
                             "the data was tokenized for another model",
                             tokens[i], i, V);
    int32_t *inputs = malloc((size_t)context * sizeof *inputs);
    int32_t *targets = malloc((size_t)context * sizeof *targets);
    float *logits = malloc((size_t)context * V * sizeof *logits);
    gpc_status s = inputs && targets && logits
                       ? GPC_OK
                       : gpc_error(GPC_ERR_NOMEM, "out of host memory for the logits");
    double sum = 0;
    size_t done = 0;
    for (size_t start = 0; s == GPC_OK && start + 1 < count; start += (size_t)context) {
        size_t n = count - 1 - start < (size_t)context ? count - 1 - start : (size_t)context;
        for (size_t i = 0; i < n; i++) {
            inputs[i] = (int32_t)tokens[start + i];
            targets[i] = (int32_t)tokens[start + i + 1];
        }
        s = gpt_forward(model, inputs, targets, 1, (int)n);
        if (s == GPC_OK) s = gpt_copy_logits(model, logits);
        for (size_t i = 0; s == GPC_OK && i < n; i++) {
            const float *row = logits + i * V;
            double max = row[0], z = 0;
            for (size_t v = 1; v < V; v++)
                if (row[v] > max) max = row[v];
            for (size_t v = 0; v < V; v++)
                z += exp((double)row[v] - max);
            /* z >= 1: the largest logit adds exp(0) */
            // cppcheck-suppress invalidFunctionArg
            double loss = max + log(z) - (double)row[targets[i]];
            if (losses) losses[done] = (float)loss;
            sum += loss;
            done++;
        }
    }
    free(inputs);
    free(targets);
    free(logits);
    if (s != GPC_OK) return s;
    result->tokens = (int64_t)done;
    result->mean_loss = sum / (double)done;
    result->perplexity = exp(result->mean_loss);
    return GPC_OK;
}
