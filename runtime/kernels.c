/* runtime/kernels.c — the element-wise kernels: argument checks, the cpu loops,
 * and dispatch to the cuda launchers (runtime/cuda/kernels.cu).
 *
 * The cpu loops are the reference every cuda kernel is checked against
 * (tests/gpu/kernels_check.c), so they are written for clarity and for the same
 * arithmetic as the device: init evaluates the same philox.h code; AdamW runs the
 * same element function (cuda/kernels_cuda.h) with the same f32 scalars, which
 * are computed here once per call; bf16 rounding is bmt_f32_to_bf16, which the
 * device mirrors bit for bit. Sums of squares accumulate in double in index order
 * (the device uses a fixed tree instead: same bits run to run, not the same bits
 * as here).
 *
 * Every function checks all its arguments before touching memory, so a failed
 * call changes nothing.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bmt/block.h"
#include "ctx.h"
#include "cuda/kernels_cuda.h"
#include "error.h"
#include "kernels.h"
#include "philox.h"

_Static_assert(BMT_INIT_ZEROS == 0 && BMT_INIT_TRUNC_NORMAL == 5,
               "philox_init_value and the kernels know the init kinds 0..5");

static int bad_dtype(bmt_dtype_t t) { return (unsigned)t >= (unsigned)BMT_DTYPE_COUNT; }

static int check_ctx(bmt_ctx_t *ctx, const char *fn, bmt_error_t *err)
{
    if (ctx == NULL)
        return errprintf(err, "%s: no context", fn);
    if (ctx->device != BMT_DEVICE_CPU && ctx->device != BMT_DEVICE_CUDA)
        return errprintf(err, "rank %d: %s: unknown device kind %d", ctx->rank, fn,
                         (int)ctx->device);
#ifndef BMT_HAVE_CUDA
    if (ctx->device == BMT_DEVICE_CUDA)
        return errprintf(err, "rank %d: %s: this libbmt was built without CUDA", ctx->rank, fn);
#endif
    return 0;
}

#ifdef BMT_HAVE_CUDA
static int cuda_result(bmt_ctx_t *ctx, const char *fn, cudaError_t e, bmt_error_t *err)
{
    if (e == cudaSuccess)
        return 0;
    return errprintf(err, "rank %d: %s on cuda:%d: %s (%s)", ctx->rank, fn, ctx->device_index,
                     cudaGetErrorString(e), cudaGetErrorName(e));
}
#endif

/* ------------------------------------------------------------ init */

void kern_init_key(uint64_t seed, const char *name, uint32_t key[2])
{
    philox_key(seed, name, key);
}

double bmt_init_value(uint64_t seed, const char *name, uint64_t index, const bmt_init_t *init)
{
    uint32_t key[2];
    if (name == NULL || init == NULL)
        return NAN;
    philox_key(seed, name, key);
    return philox_init_value(key, index, (int)init->kind, init->a, init->b, init->scale);
}

int kern_init(bmt_ctx_t *ctx, void *stream, void *dst, bmt_dtype_t dtype, size_t n, uint64_t first,
              const uint32_t key[2], const bmt_init_t *init, bmt_error_t *err)
{
    if (check_ctx(ctx, "kern_init", err) < 0)
        return -1;
    if (bad_dtype(dtype))
        return errprintf(err, "rank %d: kern_init: invalid dtype %d", ctx->rank, (int)dtype);
    if (init == NULL || key == NULL)
        return errprintf(err, "rank %d: kern_init: no init or key", ctx->rank);
    if ((unsigned)init->kind > (unsigned)BMT_INIT_TRUNC_NORMAL)
        return errprintf(err, "rank %d: kern_init: unknown init kind %d", ctx->rank,
                         (int)init->kind);
    if (n == 0)
        return 0;
    if (dst == NULL)
        return errprintf(err, "rank %d: kern_init: dst is NULL", ctx->rank);
    if (first + (n - 1) < first)
        return errprintf(err, "rank %d: kern_init: element indices overflow 64 bits", ctx->rank);
#ifdef BMT_HAVE_CUDA
    if (ctx->device == BMT_DEVICE_CUDA)
        return cuda_result(ctx, "kern_init",
                           kern_cuda_init(stream, dst, dtype, n, first, key[0], key[1],
                                          (int)init->kind, init->a, init->b, init->scale),
                           err);
#endif
    int kind = (int)init->kind;
    for (size_t i = 0; i < n; i++) {
        double v = philox_init_value(key, first + i, kind, init->a, init->b, init->scale);
        switch (dtype) {
        case BMT_F32: ((float *)dst)[i] = (float)v; break;
        case BMT_BF16: ((uint16_t *)dst)[i] = bmt_f32_to_bf16((float)v); break;
        default: ((double *)dst)[i] = v; break;
        }
    }
    return 0;
}

/* ------------------------------------------------------------ zero, cast, accumulate */

/* kern_fill and kern_zero, errors under the caller's name (what). */
static int fill(bmt_ctx_t *ctx, void *stream, void *dst, int value, size_t bytes, const char *what,
                bmt_error_t *err)
{
    if (check_ctx(ctx, what, err) < 0)
        return -1;
    if (bytes == 0)
        return 0;
    if (dst == NULL)
        return errprintf(err, "rank %d: %s: dst is NULL", ctx->rank, what);
#ifdef BMT_HAVE_CUDA
    if (ctx->device == BMT_DEVICE_CUDA)
        return cuda_result(ctx, what, kern_cuda_fill(stream, dst, value & 0xff, bytes), err);
#endif
    memset(dst, value & 0xff, bytes);
    return 0;
}

int kern_fill(bmt_ctx_t *ctx, void *stream, void *dst, int value, size_t bytes, bmt_error_t *err)
{
    return fill(ctx, stream, dst, value, bytes, "kern_fill", err);
}

int kern_zero(bmt_ctx_t *ctx, void *stream, void *dst, size_t bytes, bmt_error_t *err)
{
    return fill(ctx, stream, dst, 0, bytes, "kern_zero", err);
}

/* Element i of src as a double: exact for every dtype. */
static double load(const void *src, bmt_dtype_t t, size_t i)
{
    switch (t) {
    case BMT_F32: return ((const float *)src)[i];
    case BMT_BF16: return bmt_bf16_to_f32(((const uint16_t *)src)[i]);
    default: return ((const double *)src)[i];
    }
}

int kern_cast(bmt_ctx_t *ctx, void *stream, void *dst, bmt_dtype_t dst_dtype, const void *src,
              bmt_dtype_t src_dtype, size_t n, bmt_error_t *err)
{
    if (check_ctx(ctx, "kern_cast", err) < 0)
        return -1;
    if (bad_dtype(dst_dtype) || bad_dtype(src_dtype))
        return errprintf(err, "rank %d: kern_cast: invalid dtype (%d to %d)", ctx->rank,
                         (int)src_dtype, (int)dst_dtype);
    if (n == 0)
        return 0;
    if (dst == NULL || src == NULL)
        return errprintf(err, "rank %d: kern_cast: NULL buffer", ctx->rank);
#ifdef BMT_HAVE_CUDA
    if (ctx->device == BMT_DEVICE_CUDA)
        return cuda_result(ctx, "kern_cast",
                           kern_cuda_cast(stream, dst, dst_dtype, src, src_dtype, n), err);
#endif
    if (dst_dtype == src_dtype) {
        memmove(dst, src, n * bmt_dtype_size(src_dtype));
        return 0;
    }
    /* f32 <-> bf16 by bits (a signalling NaN stays as it is, as on the
     * device); the rest through double, which holds every source value
     * exactly, and bf16 rounds through f32 (f64 -> bf16 rounds twice, like the
     * device). */
    if (src_dtype == BMT_F32 && dst_dtype == BMT_BF16) {
        const float *s = src;
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = bmt_f32_to_bf16(s[i]);
        return 0;
    }
    if (src_dtype == BMT_BF16 && dst_dtype == BMT_F32) {
        const uint16_t *s = src;
        uint32_t *d = dst; /* the bits: no floating-point operation may quiet a NaN */
        for (size_t i = 0; i < n; i++)
            d[i] = (uint32_t)s[i] << 16;
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        double v = load(src, src_dtype, i);
        switch (dst_dtype) {
        case BMT_F32: ((float *)dst)[i] = (float)v; break;
        case BMT_BF16: ((uint16_t *)dst)[i] = bmt_f32_to_bf16((float)v); break;
        default: ((double *)dst)[i] = v; break;
        }
    }
    return 0;
}

int kern_accumulate(bmt_ctx_t *ctx, void *stream, float *dst, const void *src,
                    bmt_dtype_t src_dtype, size_t n, bmt_error_t *err)
{
    if (check_ctx(ctx, "kern_accumulate", err) < 0)
        return -1;
    if (src_dtype != BMT_F32 && src_dtype != BMT_BF16)
        return errprintf(err, "rank %d: kern_accumulate: source dtype %s (want f32 or bf16)",
                         ctx->rank, bmt_dtype_name(src_dtype));
    if (n == 0)
        return 0;
    if (dst == NULL || src == NULL)
        return errprintf(err, "rank %d: kern_accumulate: NULL buffer", ctx->rank);
#ifdef BMT_HAVE_CUDA
    if (ctx->device == BMT_DEVICE_CUDA)
        return cuda_result(ctx, "kern_accumulate",
                           kern_cuda_accumulate(stream, dst, src, src_dtype, n), err);
#endif
    if (src_dtype == BMT_F32) {
        const float *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] += s[i];
    } else {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] += bmt_bf16_to_f32(s[i]);
    }
    return 0;
}

/* ------------------------------------------------------------ norms, optimizer */

int kern_sumsq(bmt_ctx_t *ctx, void *stream, const float *x, size_t n, double *out, int slot,
               bmt_error_t *err)
{
    if (check_ctx(ctx, "kern_sumsq", err) < 0)
        return -1;
    if (out == NULL || slot < 0)
        return errprintf(err, "rank %d: kern_sumsq: no output (out %p, slot %d)", ctx->rank,
                         (void *)out, slot);
    if (n > 0 && x == NULL)
        return errprintf(err, "rank %d: kern_sumsq: x is NULL", ctx->rank);
#ifdef BMT_HAVE_CUDA
    if (ctx->device == BMT_DEVICE_CUDA)
        return cuda_result(ctx, "kern_sumsq", kern_cuda_sumsq(stream, x, n, out + slot), err);
#endif
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * (double)x[i]; /* exact square; one rounding per addition */
    out[slot] = s;
    return 0;
}

/* The scalars of an AdamW call, once, in f32, for both devices. */
static kern_adamw_scalars_t adamw_scalars(const kern_adamw_args_t *a)
{
    kern_adamw_scalars_t s;
    s.grad_scale = a->grad_scale;
    s.beta1 = a->beta1;
    s.one_minus_beta1 = a->one_minus_beta1 != 0 ? a->one_minus_beta1 : 1.0f - a->beta1;
    s.beta2 = a->beta2;
    s.one_minus_beta2 = a->one_minus_beta2 != 0 ? a->one_minus_beta2 : 1.0f - a->beta2;
    s.eps = a->eps;
    s.decay = 1.0f - a->lr * a->weight_decay;
    s.step_size = a->lr / a->bc1;
    s.bc2_sqrt = sqrtf(a->bc2);
    return s;
}

/* What every AdamW call checks first. */
static int adamw_args_ok(bmt_ctx_t *ctx, const char *fn, const kern_adamw_args_t *a,
                         bmt_error_t *err)
{
    if (check_ctx(ctx, fn, err) < 0)
        return -1;
    if (a == NULL)
        return errprintf(err, "rank %d: %s: no arguments", ctx->rank, fn);
    if (!(a->bc1 > 0.0f) || !(a->bc2 > 0.0f))
        return errprintf(err, "rank %d: %s: bias corrections must be > 0 (bc1 %g, bc2 %g)",
                         ctx->rank, fn, (double)a->bc1, (double)a->bc2);
    return 0;
}

int kern_adamw(bmt_ctx_t *ctx, void *stream, float *master, float *m, float *v, const float *grad,
               void *param, bmt_dtype_t param_dtype, size_t n, const kern_adamw_args_t *a,
               bmt_error_t *err)
{
    if (adamw_args_ok(ctx, "kern_adamw", a, err) < 0)
        return -1;
    if (param_dtype != BMT_F32 && param_dtype != BMT_BF16)
        return errprintf(err, "rank %d: kern_adamw: parameter dtype %s (want f32 or bf16)",
                         ctx->rank, bmt_dtype_name(param_dtype));
    if (param == (void *)master && param_dtype != BMT_F32)
        return errprintf(err, "rank %d: kern_adamw: param is the master but its dtype is %s",
                         ctx->rank, bmt_dtype_name(param_dtype));
    if (n == 0)
        return 0;
    if (master == NULL || m == NULL || v == NULL || grad == NULL || param == NULL)
        return errprintf(err, "rank %d: kern_adamw: NULL buffer", ctx->rank);

    const kern_adamw_scalars_t s = adamw_scalars(a);
#ifdef BMT_HAVE_CUDA
    if (ctx->device == BMT_DEVICE_CUDA)
        return cuda_result(ctx, "kern_adamw",
                           kern_cuda_adamw(stream, master, m, v, grad, param, param_dtype, n, &s),
                           err);
#endif
    if (param == (void *)master) {
        for (size_t i = 0; i < n; i++)
            kern_adamw_elem(&master[i], &m[i], &v[i], grad[i], &s);
    } else if (param_dtype == BMT_F32) {
        float *p = param;
        for (size_t i = 0; i < n; i++)
            p[i] = kern_adamw_elem(&master[i], &m[i], &v[i], grad[i], &s);
    } else {
        uint16_t *p = param;
        for (size_t i = 0; i < n; i++)
            p[i] = bmt_f32_to_bf16(kern_adamw_elem(&master[i], &m[i], &v[i], grad[i], &s));
    }
    return 0;
}

int kern_adamw_split(bmt_ctx_t *ctx, void *stream, uint16_t *hi, uint16_t *lo, float *m, float *v,
                     const float *grad, size_t n, const kern_adamw_args_t *a, bmt_error_t *err)
{
    if (adamw_args_ok(ctx, "kern_adamw_split", a, err) < 0)
        return -1;
    if (n == 0)
        return 0;
    if (hi == NULL || lo == NULL || m == NULL || v == NULL || grad == NULL)
        return errprintf(err, "rank %d: kern_adamw_split: NULL buffer", ctx->rank);
    const kern_adamw_scalars_t s = adamw_scalars(a);
#ifdef BMT_HAVE_CUDA
    if (ctx->device == BMT_DEVICE_CUDA)
        return cuda_result(ctx, "kern_adamw_split",
                           kern_cuda_adamw_split(stream, hi, lo, m, v, grad, n, &s), err);
#endif
    for (size_t i = 0; i < n; i++) {
        float p = kern_split_join(hi[i], lo[i]);
        kern_adamw_elem(&p, &m[i], &v[i], grad[i], &s);
        hi[i] = kern_split_hi(p);
        lo[i] = kern_split_lo(p, hi[i]);
    }
    return 0;
}

void kern_split_host(const float *x, uint16_t *hi, uint16_t *lo, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        hi[i] = kern_split_hi(x[i]);
        lo[i] = kern_split_lo(x[i], hi[i]);
    }
}

void kern_join_host(const uint16_t *hi, const uint16_t *lo, float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = kern_split_join(hi[i], lo[i]);
}
