/* runtime/kernels.h — the engine's element-wise work, on the cpu or a cuda stream.
 *
 * Each function runs on the context's device: plain C loops on cpu
 * (runtime/kernels.c), a kernel launched on `stream` (a cudaStream_t) on
 * cuda (runtime/cuda/kernels.cu). On cpu, stream is ignored and the work is done
 * when the call returns; on cuda the call only enqueues. Every cuda kernel has
 * the cpu function as its reference (tests/gpu). All return 0, or -1 and err.
 *
 * Buffers: `dst`, `x`, ... are device memory of n elements in the stated dtype.
 */
#ifndef BMT_RUNTIME_KERNELS_H
#define BMT_RUNTIME_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "bmt/block.h"

/* Philox key of a parameter: from the seed and the parameter's full name. */
void kern_init_key(uint64_t seed, const char *name, uint32_t key[2]);

/* dst[i] = init value of parameter element (first + i), i in [0, n): the same
 * formula as bmt_init_value (runtime/philox.h), rounded to dtype. */
int kern_init(bmt_ctx_t *ctx, void *stream, void *dst, bmt_dtype_t dtype, size_t n, uint64_t first,
              const uint32_t key[2], const bmt_init_t *init, bmt_error_t *err);

/* dst[i] = 0 for bytes bytes. */
int kern_zero(bmt_ctx_t *ctx, void *stream, void *dst, size_t bytes, bmt_error_t *err);

/* Every byte of dst = value (0..255) for bytes bytes (0xff: f32 and bf16 NaNs). */
int kern_fill(bmt_ctx_t *ctx, void *stream, void *dst, int value, size_t bytes, bmt_error_t *err);

/* dst[i] = (dst dtype) src[i]; f32 <-> bf16 (round to nearest even), or a copy. */
int kern_cast(bmt_ctx_t *ctx, void *stream, void *dst, bmt_dtype_t dst_dtype, const void *src,
              bmt_dtype_t src_dtype, size_t n, bmt_error_t *err);

/* dst[i] += src[i] with dst f32 and src f32 or bf16 (gradient accumulation). */
int kern_accumulate(bmt_ctx_t *ctx, void *stream, float *dst, const void *src,
                    bmt_dtype_t src_dtype, size_t n, bmt_error_t *err);

/* out[slot] = sum over i of (x[i])^2, in double, deterministically (the same
 * bits for the same input on every run). out is device memory of doubles. */
int kern_sumsq(bmt_ctx_t *ctx, void *stream, const float *x, size_t n, double *out, int slot,
               bmt_error_t *err);

/* One AdamW update of n elements, torch.optim.AdamW's formula with g = grad[i] * grad_scale:
 *   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
 *   master = master * (1 - lr wd) - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
 * then param[i] = (param dtype) master[i] unless param == master (f32 shards).
 * bc1 = 1 - beta1^step, bc2 = 1 - beta2^step. */
typedef struct kern_adamw_args {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale;
    float bc1, bc2;
    /* (float)(1 - beta) computed in double, as torch does: 1.0f - 0.999f is
     * 1.3e-5 off, which moves parameters by ~1e-5 relative over 20 steps.
     * 0 means: take 1.0f - beta (only for callers that already pass f32 betas). */
    float one_minus_beta1, one_minus_beta2;
} kern_adamw_args_t;

int kern_adamw(bmt_ctx_t *ctx, void *stream, float *master, float *m, float *v, const float *grad,
               void *param, bmt_dtype_t param_dtype, size_t n, const kern_adamw_args_t *a,
               bmt_error_t *err);

/* The same update on a split master (master_only 2, runtime/optim.c): the f32
 * master kept as hi (n bf16: the parameter shard, the master rounded to nearest
 * with ties away from zero) and lo (n: the rest of its bits), no f32 copy. The
 * master, m and v come out bit for bit as kern_adamw's; hi is kern_split_hi
 * of the new master (runtime/cuda/kernels_cuda.h says why the pair is exact). */
int kern_adamw_split(bmt_ctx_t *ctx, void *stream, uint16_t *hi, uint16_t *lo, float *m, float *v,
                     const float *grad, size_t n, const kern_adamw_args_t *a, bmt_error_t *err);

/* Host memory, n elements: x into its split halves, and back (exact for every
 * non-NaN x). */
void kern_split_host(const float *x, uint16_t *hi, uint16_t *lo, size_t n);
void kern_join_host(const uint16_t *hi, const uint16_t *lo, float *x, size_t n);

#endif
