/*
 * cpu_common.c: checks shared by the CPU kernels. ops.c has already checked
 * shapes and devices; what is left here is what only the CPU backend cannot
 * do: compute in a dtype other than f32, or hand OpenBLAS (whose integers are
 * 32-bit in Debian's build) a dimension that does not fit.
 */
#include "cpu/cpu.h"

#include <limits.h>

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
