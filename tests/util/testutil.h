/*
 * testutil.h: helpers shared by gpc's tests: cmocka includes, fresh random
 * seeds (printed so a failure can be replayed with GPC_TEST_SEED), random
 * inputs, float64 comparison with a relative tolerance, and temporary
 * directories.
 */
#ifndef GPC_TESTUTIL_H
#define GPC_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the includes above first */
#include <cmocka.h>

#include "gpc/core.h"
#include "gpc/model.h"
#include "gpc/settings.h"

/* A seed that differs from run to run (time and pid) unless GPC_TEST_SEED is
 * set; printed once so a failing run can be repeated exactly. */
uint64_t test_seed(void);

/* n floats drawn from rng, uniform in [lo, hi), malloc'd (with room to
 * spare, so that n = 0 allocates too). */
float *test_random_floats(gpc_rng *rng, int64_t n, float lo, float hi);
/* The same, each rounded to dtype (test_round_to). */
float *test_random_floats_as(gpc_rng *rng, gpc_dtype dtype, int64_t n, float lo, float hi);
/* x rounded to the nearest value of dtype (bf16, f16), as a float; x itself
 * for f32. Inputs so rounded are the same values on a device that stores
 * dtype and on the CPU, which computes in f32. */
float test_round_to(gpc_dtype dtype, float x);

/* f32 tensors on the CPU over data, which the caller owns. */
gpc_tensor test_f32_1d(float *data, int64_t d0);
gpc_tensor test_f32_2d(float *data, int64_t d0, int64_t d1);

/* GPT-2's GELU (tanh form) in float64, for references. */
double test_gelu64(double x);

/* Largest |a-b| / max(|b|, floor) over n elements; floor keeps tiny
 * reference values from inflating the relative error. */
double test_max_rel_error(const float *a, const double *b, size_t n, double floor);
double test_max_rel_error_f32(const float *a, const float *b, size_t n, double floor);
/* ||got - want|| / ||want|| over n elements, in float64: the error of a
 * whole tensor, for bf16 results whose single elements may be far off. */
double test_rel_norm(const float *got, const float *want, size_t n);

/* Asserts with a message that names the worst element. */
void test_assert_close(const char *what, const float *got, const double *want, size_t n, double tol,
                       double floor);
void test_assert_close_f32(const char *what, const float *got, const float *want, size_t n,
                           double tol, double floor);

/* Creates a fresh directory under $TMPDIR (or /tmp) and returns its path
 * (static storage per call site is the caller's; the string is gpc_malloc'd). */
char *test_tmpdir(const char *tag);
/* rm -rf of a test directory. */
void test_rmtree(const char *path);

/* Path of a file in the source tree (GPC_SOURCE_DIR), gpc_malloc'd. */
char *test_source_path(const char *relative);

/* Asserts that status is GPC_OK, printing gpc_last_error() otherwise. */
#define TEST_OK(expr)                                                                              \
    do {                                                                                           \
        gpc_status test_status_ = (expr);                                                          \
        if (test_status_ != GPC_OK) fail_msg("%s failed: %s", #expr, gpc_last_error());            \
    } while (0)

/* Asserts that expr fails with the given status and a message containing needle. */
#define TEST_FAILS(expr, status, needle)                                                           \
    do {                                                                                           \
        gpc_status test_status_ = (expr);                                                          \
        if (test_status_ != (status))                                                              \
            fail_msg("%s returned %s, expected %s (%s)", #expr, gpc_status_name(test_status_),     \
                     gpc_status_name(status), gpc_last_error());                                   \
        if (!strstr(gpc_last_error(), (needle)))                                                   \
            fail_msg("%s: message '%s' lacks '%s'", #expr, gpc_last_error(), (needle));            \
    } while (0)

/* Writes a run folder for serving tests into dir: a tokenizer of 300 tokens
 * trained on a small fixed text (so the run has an end-of-text token) and a
 * model of the given sizes with random weights from seed, its wte (the
 * output head) times 8 so that greedy choices are rarely near-ties. Returns
 * the model's config. */
gpt_config test_make_serving_run(const char *dir, int layers, int heads, int channels, int context,
                                 uint64_t seed);

/* A model for the paged serving step (gpt_paged_create): a batch of one
 * row and no gradients, on device in dtype, its weights random from seed. */
gpt_model *test_make_serving_model(gpc_device device, gpc_dtype dtype, int layers, int heads,
                                   int channels, int context, int vocab, uint64_t seed);

/* Options of a paged cache of num_blocks blocks of block_size positions,
 * for steps of up to max_seqs sequences and max_tokens rows that want one
 * row of logits a sequence (max_logits = max_seqs), graphs as set. */
gpt_paged_options test_paged_options(int num_blocks, int block_size, int max_seqs, int max_tokens);

/* Steps first_step .. last_step of two offloaded models of batch B x T and
 * vocabulary V holding the same weights, on the same random batches (two
 * micro-steps a step, targets a learnable map of the inputs), model 0's
 * update waiting and model 1's with options.overlap = overlap; on steps
 * that are a multiple of eval_every, an evaluation forward follows the
 * update. Fails unless every step's loss and gradient norm and every
 * evaluation's loss are equal bit for bit. Model 0's losses of the first
 * and last steps go to first_loss and last_loss. */
void test_offload_overlap_steps(gpt_model *models[2], int overlap, int first_step, int last_step,
                                int eval_every, int B, int T, int V, float learning_rate,
                                gpc_rng *rng, float *first_loss, float *last_loss);

#endif /* GPC_TESTUTIL_H */
