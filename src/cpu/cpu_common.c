/*
 * cpu_common.c: checks shared by the CPU kernels. ops.c has already checked
 * shapes and devices; what is left here is what only the CPU backend cannot
 * do: compute in a dtype other than f32, or hand OpenBLAS (whose integers are
 * 32-bit in Debian's build) a dimension that does not fit. And the one
 * place where matrix products are split across threads (see cpu.h for why).
 */
#include "cpu/cpu.h"

#include <cblas.h>
#include <limits.h>
#include <omp.h>
#include <pthread.h>

/* Products smaller than this many multiply-adds run in the calling thread:
 * waking the other threads costs more than it saves. */
#define SGEMM_PARALLEL_WORK (1 << 18)
/* Blocks handed to threads are multiples of this many rows or columns, so
 * OpenBLAS's kernels see whole register tiles. */
#define SGEMM_BLOCK_ALIGN 16

gpc_status gpc_cpu_need_f32(const char *op, const char *name, const gpc_tensor *t) {
    if (!t || !t->data || t->dtype == GPC_F32) return GPC_OK;
    return gpc_error(GPC_ERR_UNSUPPORTED,
                     "%s on the CPU computes in f32 only; tensor '%s' is %s: convert it with "
                     "gpc_op_convert or run on a GPU",
                     op, name, gpc_dtype_name(t->dtype));
}

gpc_status gpc_cpu_need_blas_dim(const char *op, int64_t dim) {
    if (dim >= 0 && dim <= INT_MAX) return GPC_OK;
    return gpc_error(GPC_ERR_UNSUPPORTED,
                     "%s: dimension %lld is too large for the CPU's BLAS (at most %d): use "
                     "smaller batches",
                     op, (long long)dim, INT_MAX);
}

int64_t gpc_cpu_last_dim(const gpc_tensor *t) {
    return t->ndim ? t->shape[t->ndim - 1] : 1;
}

int64_t gpc_cpu_rows(const gpc_tensor *t) {
    int64_t c = gpc_cpu_last_dim(t);
    return c ? gpc_tensor_numel(t) / c : 0;
}

static void blas_one_thread(void) {
    openblas_set_num_threads(1);
}

void gpc_cpu_blas_init(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, blas_one_thread);
}

void gpc_cpu_sgemm1(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                    int64_t ldc) {
    if (M == 1 && !trans_a) {
        /* c = alpha op(B)^T a + beta c, op(B) [K, N]: B is [N, K] (trans_b)
         * or [K, N] */
        if (trans_b)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)N, (int)K, alpha, B, (int)ldb, A, 1, beta,
                        C, 1);
        else
            cblas_sgemv(CblasRowMajor, CblasTrans, (int)K, (int)N, alpha, B, (int)ldb, A, 1, beta,
                        C, 1);
        return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K, alpha, A, (int)lda, B,
                (int)ldb, beta, C, (int)ldc);
}

void gpc_cpu_sgemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                   int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    gpc_cpu_blas_init();
    int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (threads <= 1 || M * N * K < SGEMM_PARALLEL_WORK) {
        gpc_cpu_sgemm1(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    /* split the longer side of C; a block of rows of C takes the same rows of
     * op(A), a block of columns the same columns of op(B) */
    int split_rows = M >= N;
    int64_t extent = split_rows ? M : N;
    int64_t block = (extent + threads - 1) / threads;
    block = (block + SGEMM_BLOCK_ALIGN - 1) / SGEMM_BLOCK_ALIGN * SGEMM_BLOCK_ALIGN;
#pragma omp parallel num_threads(threads)
    {
        int64_t start = (int64_t)omp_get_thread_num() * block;
        int64_t size = extent - start < block ? extent - start : block;
        if (size > 0) {
            if (split_rows) {
                const float *a = trans_a ? A + start : A + start * lda;
                gpc_cpu_sgemm1(trans_a, trans_b, size, N, K, alpha, a, lda, B, ldb, beta,
                               C + start * ldc, ldc);
            } else {
                const float *b = trans_b ? B + start * ldb : B + start;
                gpc_cpu_sgemm1(trans_a, trans_b, M, size, K, alpha, A, lda, b, ldb, beta, C + start,
                               ldc);
            }
        }
    }
}
