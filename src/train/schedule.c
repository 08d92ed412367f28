/*
 * schedule.c: the learning-rate schedule of training: linear warmup, then
 * cosine decay to a floor, the shape GPT-2 reproductions use (nanoGPT,
 * llm.c). Warmup keeps the first AdamW steps, whose second-moment estimates
 * are still poor, from being large; the cosine tail anneals to a fraction of
 * the peak rather than zero so the last steps still learn.
 */
#include "gpc/train.h"

#include <math.h>

double gpc_lr_at(const gpc_lr_schedule *s, int step) {
    double min_lr = s->lr * s->min_lr_ratio;
    if (step < s->warmup) return s->lr * (double)(step + 1) / (double)s->warmup;
    if (s->steps <= s->warmup) return s->lr;
    double progress = (double)(step - s->warmup) / (double)(s->steps - s->warmup);
    if (progress > 1.0) progress = 1.0; /* past the planned end: stay at the floor */
    return min_lr + 0.5 * (1.0 + cos(M_PI * progress)) * (s->lr - min_lr);
}

int gpc_lr_default_warmup(int steps) {
    int warmup = steps / 10;
    return warmup > 1000 ? 1000 : warmup;
}

double gpc_lr_default(int channels) {
    /* small models tolerate and need a larger step; 6e-4 is GPT-2 small's */
    return channels <= 384 ? 1e-3 : 6e-4;
}
