/* tests/progs/engine_model.h — what engine_check.c and engine_check_cuda.cu share:
 * the model's sizes and the table of its element-wise and matrix operations.
 *
 * The block callbacks of engine_check are written once against ec_ops_t; the cpu
 * table (plain loops, engine_check.c) is the reference of every cuda kernel
 * (engine_check_cuda.cu), and `engine_check --kernel-check` compares the two on
 * random data. All activations are f32, row-major; parameters are f32 or bf16
 * (`pt`), gradients f32. The cpu table ignores dev and stream; the cuda one
 * enqueues on stream (a cudaStream_t) and returns at once.
 */
#ifndef ENGINE_MODEL_H
#define ENGINE_MODEL_H

#include "bmt/bmt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sizes. Every parameter count is odd, so no shard boundary falls on a
 * parameter boundary by accident in groups of 2, 4 or 8. */
enum {
    EC_ROWS = 3,  /* rows of a micro-batch */
    EC_DIN = 7,   /* input features */
    EC_C = 13,    /* width of the residual stream */
    EC_H = 29,    /* hidden width of the MLP */
    EC_DOUT = 5,  /* outputs */
    EC_LAYERS = 3 /* residual blocks */
};

#define EC_LN_EPS 1e-5f

typedef struct ec_ops {
    /* C (M x N) = beta C + op(A) op(B), with op(A) M x K: A is M x K, or K x M
     * stored when ta (likewise B: K x N, or N x K when tb). A and B are stored
     * in at / bt (f32 or bf16). cd BMT_BF16: every operand is rounded to bf16
     * first; products are summed in f32 either way. beta is 0 or 1. */
    int (*gemm)(void *dev, void *stream, int ta, int tb, int M, int N, int K, const void *A,
                bmt_dtype_t at, const void *B, bmt_dtype_t bt, float beta, float *Cm,
                bmt_dtype_t cd, bmt_error_t *err);
    /* y = (x - mean) * rstd * w + b per row of x (M x N); keeps mean, rstd (M). */
    int (*ln_fwd)(void *dev, void *stream, int M, int N, const float *x, const void *w,
                  const void *b, bmt_dtype_t pt, float *y, float *mean, float *rstd,
                  bmt_error_t *err);
    /* dx += d(layernorm)/dx dy; dw += sum over rows of dy * xhat; db += sum of dy. */
    int (*ln_bwd)(void *dev, void *stream, int M, int N, const float *x, const float *mean,
                  const float *rstd, const void *w, bmt_dtype_t pt, const float *dy, float *dx,
                  float *dw, float *db, bmt_error_t *err);
    /* y (M x N) += b (N) on every row. */
    int (*bias_add)(void *dev, void *stream, int M, int N, float *y, const void *b, bmt_dtype_t pt,
                    bmt_error_t *err);
    /* db (N) += sum over rows of dy (M x N). */
    int (*bias_grad)(void *dev, void *stream, int M, int N, const float *dy, float *db,
                     bmt_error_t *err);
    /* y = gelu_tanh(x); dx = dy * gelu_tanh'(x). n elements. */
    int (*gelu_fwd)(void *dev, void *stream, int n, const float *x, float *y, bmt_error_t *err);
    int (*gelu_bwd)(void *dev, void *stream, int n, const float *x, const float *dy, float *dx,
                    bmt_error_t *err);
    /* y = 0.5 x + 0.25 tanh(x); dx = dy * (0.5 + 0.25 (1 - tanh(x)^2)). */
    int (*mix_fwd)(void *dev, void *stream, int n, const float *x, float *y, bmt_error_t *err);
    int (*mix_bwd)(void *dev, void *stream, int n, const float *x, const float *dy, float *dx,
                   bmt_error_t *err);
    /* y = x (x NULL: y = 0). */
    int (*copy)(void *dev, void *stream, int n, const float *x, float *y, bmt_error_t *err);
    /* Over out and target (M x N): *loss = sum (out - t)^2 / (2 M N) unless loss is
     * NULL; dout = (out - t) / (M N) unless dout is NULL. */
    int (*mse)(void *dev, void *stream, int M, int N, const float *out, const float *target,
               float *loss, float *dout, bmt_error_t *err);
} ec_ops_t;

#ifdef BMT_HAVE_CUDA
typedef struct ec_cuda ec_cuda_t;
/* A cuBLAS handle (default math: no TF32) and bf16 staging for cap elements per
 * operand, allocated with bmt_alloc (BMT_MEM_WORKSPACE). NULL and err on failure. */
ec_cuda_t *ec_cuda_create(bmt_ctx_t *ctx, int cap, bmt_error_t *err);
void ec_cuda_destroy(ec_cuda_t *dev);
/* The cuda table; its dev argument is an ec_cuda_t. */
const ec_ops_t *ec_cuda_ops(void);
#endif

#ifdef __cplusplus
}
#endif
#endif
