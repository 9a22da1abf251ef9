/* runtime/cuda/kernels_cuda.h — what the cpu and cuda halves of runtime/kernels.h
 * share (internal).
 *
 * 1. The AdamW element update, compiled for the host (runtime/kernels.c) and the
 *    device (runtime/cuda/kernels.cu) from this one text, with every f32
 *    operation rounded on its own (no fused multiply-add on the device), so that
 *    both give the same bits.
 * 2. The launchers of the cuda kernels (only where CUDA is built). runtime/kernels.c
 *    validates arguments and calls them for a context on cuda. They take plain
 *    arguments (no bmt_ctx_t), enqueue on `stream` (a cudaStream_t; NULL is the
 *    legacy default stream) on the current device, and return the launch's
 *    cudaError_t (cudaGetLastError): errors of the kernel itself show up at the
 *    next synchronization. Pointers are device memory; n may be 0.
 */
#ifndef BMT_RUNTIME_CUDA_KERNELS_CUDA_H
#define BMT_RUNTIME_CUDA_KERNELS_CUDA_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "bmt/bmt.h"

#ifndef BMT_HD
#ifdef __CUDACC__
#define BMT_HD __host__ __device__
#else
#define BMT_HD
#endif
#endif

/* Per-call scalars of AdamW, computed once on the host (runtime/kernels.c) so
 * that the cpu loop and the kernel use the same f32 values. */
typedef struct kern_adamw_scalars {
    float grad_scale;
    float beta1, one_minus_beta1;
    float beta2, one_minus_beta2;
    float eps;
    float decay;     /* 1 - lr * weight_decay */
    float step_size; /* lr / bc1 */
    float bc2_sqrt;  /* sqrt(bc2) */
} kern_adamw_scalars_t;

/* IEEE f32 operations rounded one at a time: the device's intrinsics keep nvcc
 * from contracting a * b + c into an fma (the host compiler does not contract in
 * ISO C/C++ mode, and x86-64 has no fma without -march). */
#ifdef __CUDA_ARCH__
#define KERN_ADD(x, y) __fadd_rn((x), (y))
#define KERN_SUB(x, y) __fsub_rn((x), (y))
#define KERN_MUL(x, y) __fmul_rn((x), (y))
#define KERN_DIV(x, y) __fdiv_rn((x), (y))
#define KERN_SQRT(x) __fsqrt_rn((x))
#else
#define KERN_ADD(x, y) ((x) + (y))
#define KERN_SUB(x, y) ((x) - (y))
#define KERN_MUL(x, y) ((x) * (y))
#define KERN_DIV(x, y) ((x) / (y))
#define KERN_SQRT(x) sqrtf((x))
#endif

/* One element of AdamW, in torch.optim.AdamW's order:
 *   g = grad * grad_scale
 *   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) (g g)
 *   master = master * decay - step_size * (m / (sqrt(v) / bc2_sqrt + eps))
 * Updates *master, *m, *v and returns the new master. */
BMT_HD static inline float kern_adamw_elem(float *master, float *m, float *v, float grad,
                                           const kern_adamw_scalars_t *s)
{
    float g = KERN_MUL(grad, s->grad_scale);
    float mm = KERN_ADD(KERN_MUL(s->beta1, *m), KERN_MUL(s->one_minus_beta1, g));
    float vv = KERN_ADD(KERN_MUL(s->beta2, *v), KERN_MUL(s->one_minus_beta2, KERN_MUL(g, g)));
    float denom = KERN_ADD(KERN_DIV(KERN_SQRT(vv), s->bc2_sqrt), s->eps);
    float p = KERN_MUL(*master, s->decay);
    p = KERN_SUB(p, KERN_MUL(s->step_size, KERN_DIV(mm, denom)));
    *m = mm;
    *v = vv;
    *master = p;
    return p;
}

/* A split master (master_only 2, runtime/optim.c): an f32 master kept as two
 * 16-bit halves, hi and lo, with no f32 copy.
 *   hi: the master rounded to bf16, to nearest with ties away from zero (the
 *       bf16 parameter shard itself); NaN as bmt_f32_to_bf16 makes it.
 *   lo: the master's bit pattern minus hi's (hi << 16), a signed 16-bit number.
 * Ties away from zero is what makes this lossless: the f32 patterns that round
 * to one hi lie within (hi << 16) - 0x8000 .. (hi << 16) + 0x7fff, 65,536 of
 * them at most whatever hi's last bit (32,768 for +0 and -0; ties to even
 * would give an even hi 65,537), since a pattern's magnitude bits order the
 * magnitudes of one sign. So kern_split_join(kern_split_hi(x), kern_split_lo(x,
 * hi)) == x bit for bit for every non-NaN f32, inf included, and a NaN for
 * every NaN. */
BMT_HD static inline uint32_t kern_f32_bits(float x)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    return u;
#endif
}

BMT_HD static inline uint16_t kern_split_hi(float x)
{
    const uint32_t u = kern_f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign, force a quiet payload */
        return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x8000u) >> 16); /* finite past bf16's range: inf */
}

BMT_HD static inline uint16_t kern_split_lo(float x, uint16_t hi)
{
    return (uint16_t)(kern_f32_bits(x) - ((uint32_t)hi << 16));
}

BMT_HD static inline float kern_split_join(uint16_t hi, uint16_t lo)
{
    /* lo as a signed number, without C's implementation-defined narrowing */
    const uint32_t u = ((uint32_t)hi << 16) + (uint32_t)lo - ((uint32_t)(lo & 0x8000u) << 1);
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
#endif
}

#if defined(BMT_HAVE_CUDA) || defined(__CUDACC__)
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dst (n, dtype f32|bf16|f64) = philox_init_value(key, first + i, kind, a, b, scale)
 * rounded to dtype (bf16 through f32, like bmt_f32_to_bf16((float)v)). */
cudaError_t kern_cuda_init(void *stream, void *dst, bmt_dtype_t dtype, size_t n, uint64_t first,
                           uint32_t key0, uint32_t key1, int kind, double a, double b,
                           double scale);

/* Every byte of dst = value for bytes bytes. */
cudaError_t kern_cuda_fill(void *stream, void *dst, int value, size_t bytes);

/* dst (n, dst_dtype) = src (n, src_dtype), dtypes f32|bf16|f64; equal dtypes copy. */
cudaError_t kern_cuda_cast(void *stream, void *dst, bmt_dtype_t dst_dtype, const void *src,
                           bmt_dtype_t src_dtype, size_t n);

/* dst (n, f32) += src (n, f32|bf16). */
cudaError_t kern_cuda_accumulate(void *stream, float *dst, const void *src, bmt_dtype_t src_dtype,
                                 size_t n);

/* *out (one double, device memory) = sum of x[i]^2 (x: n f32) in double,
 * deterministically: a grid that depends on n only, per-block partial sums (each
 * a fixed-order tree) into a scratch array from cudaMallocAsync on the stream,
 * then one block sums the partials in fixed order; cudaFreeAsync on the stream. */
cudaError_t kern_cuda_sumsq(void *stream, const float *x, size_t n, double *out);

/* One AdamW step on n elements (master, m, v, grad: f32 shards); param (n,
 * param_dtype f32|bf16) gets the new master unless param == master. */
cudaError_t kern_cuda_adamw(void *stream, float *master, float *m, float *v, const float *grad,
                            void *param, bmt_dtype_t param_dtype, size_t n,
                            const kern_adamw_scalars_t *s);

/* The same AdamW step on a split master (hi, lo: n each, kern_split_*): the
 * master is joined from them, updated, and split again; hi is the bf16
 * parameter. 28 bytes an element where a master with a bf16 copy moves 30. */
cudaError_t kern_cuda_adamw_split(void *stream, uint16_t *hi, uint16_t *lo, float *m, float *v,
                                  const float *grad, size_t n, const kern_adamw_scalars_t *s);

#ifdef __cplusplus
}
#endif
#endif /* BMT_HAVE_CUDA || __CUDACC__ */
#endif
