/* tests/progs/engine_check_cuda.cu — the cuda side of engine_check: its model's
 * kernels and matrix products (ec_ops_t, engine_model.h) on a cuda stream.
 *
 * Each op enqueues on the stream the block callback got (the context's compute
 * stream) and returns; nothing here waits for the device. The cpu functions of
 * engine_check.c are the reference of every kernel (`engine_check --kernel-check`
 * compares them on random data). Reductions are sequential per thread (one thread
 * per row or column; the sizes are tiny) so that a result does not depend on the
 * launch shape.
 *
 * Matrix products go through cuBLAS with its default math mode (no TF32): f32
 * products with cublasSgemm; with bf16 operands, f32 operands are first rounded
 * to bf16 into staging (round to nearest even, as bmt_f32_to_bf16), then
 * cublasGemmEx with CUBLAS_COMPUTE_32F writes f32. Row-major C = op(A) op(B) is
 * computed as the column-major C^T = op(B)^T op(A)^T.
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "bmt/bmt.h"
#include "bmt/device.h"
#include "engine_model.h"

struct ec_cuda {
    bmt_ctx_t *ctx;
    cublasHandle_t blas;
    __nv_bfloat16 *stage[2]; /* (cap) bf16 copies of f32 operands, A and B */
    int cap;
};

static int cuda_err(bmt_error_t *err, const char *what, cudaError_t e)
{
    snprintf(err->text, sizeof(err->text), "engine_check: %s: %s", what, cudaGetErrorString(e));
    return -1;
}

static int blas_err(bmt_error_t *err, const char *what, cublasStatus_t s)
{
    snprintf(err->text, sizeof(err->text), "engine_check: %s: %s", what, cublasGetStatusString(s));
    return -1;
}

static int launched(bmt_error_t *err, const char *what)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : cuda_err(err, what, e);
}

static unsigned grid(int n) { return (unsigned)((n + 255) / 256); }

__device__ static float ldp(const void *p, int bf, int i)
{
    return bf ? __bfloat162float(((const __nv_bfloat16 *)p)[i]) : ((const float *)p)[i];
}

/* ------------------------------------------------------------ kernels */

__global__ static void k_to_bf16(int n, const float *x, __nv_bfloat16 *y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = __float2bfloat16_rn(x[i]);
}

__global__ static void k_ln_fwd(int M, int N, const float *x, const void *w, const void *b, int bf,
                                float *y, float *mean, float *rstd)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= M)
        return;
    const float *xr = x + (size_t)r * N;
    float mu = 0, var = 0;
    for (int j = 0; j < N; j++)
        mu += xr[j];
    mu /= N;
    for (int j = 0; j < N; j++)
        var += (xr[j] - mu) * (xr[j] - mu);
    var /= N;
    float rs = 1.0f / sqrtf(var + EC_LN_EPS);
    mean[r] = mu;
    rstd[r] = rs;
    for (int j = 0; j < N; j++)
        y[(size_t)r * N + j] = (xr[j] - mu) * rs * ldp(w, bf, j) + ldp(b, bf, j);
}

__global__ static void k_ln_bwd_dx(int M, int N, const float *x, const float *mean,
                                   const float *rstd, const void *w, int bf, const float *dy,
                                   float *dx)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= M)
        return;
    const float *xr = x + (size_t)r * N, *dyr = dy + (size_t)r * N;
    float s1 = 0, s2 = 0;
    for (int j = 0; j < N; j++) {
        float xhat = (xr[j] - mean[r]) * rstd[r], g = dyr[j] * ldp(w, bf, j);
        s1 += g;
        s2 += g * xhat;
    }
    for (int j = 0; j < N; j++) {
        float xhat = (xr[j] - mean[r]) * rstd[r], g = dyr[j] * ldp(w, bf, j);
        dx[(size_t)r * N + j] += rstd[r] * (g - s1 / N - xhat * (s2 / N));
    }
}

__global__ static void k_ln_bwd_dwb(int M, int N, const float *x, const float *mean,
                                    const float *rstd, const float *dy, float *dw, float *db)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= N)
        return;
    float w = dw[j], b = db[j];
    for (int r = 0; r < M; r++) {
        float xhat = (x[(size_t)r * N + j] - mean[r]) * rstd[r];
        w += dy[(size_t)r * N + j] * xhat;
        b += dy[(size_t)r * N + j];
    }
    dw[j] = w;
    db[j] = b;
}

__global__ static void k_bias_add(int M, int N, float *y, const void *b, int bf)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < M * N)
        y[i] += ldp(b, bf, i % N);
}

__global__ static void k_bias_grad(int M, int N, const float *dy, float *db)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= N)
        return;
    float s = db[j];
    for (int r = 0; r < M; r++)
        s += dy[(size_t)r * N + j];
    db[j] = s;
}

#define GELU_KF 0.7978845608028654f /* sqrt(2 / pi) */

__global__ static void k_gelu_fwd(int n, const float *x, float *y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float v = x[i];
    y[i] = 0.5f * v * (1.0f + tanhf(GELU_KF * (v + 0.044715f * v * v * v)));
}

__global__ static void k_gelu_bwd(int n, const float *x, const float *dy, float *dx)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float v = x[i], t = tanhf(GELU_KF * (v + 0.044715f * v * v * v));
    float d =
        0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * GELU_KF * (1.0f + 3.0f * 0.044715f * v * v);
    dx[i] = dy[i] * d;
}

__global__ static void k_mix_fwd(int n, const float *x, float *y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = 0.5f * x[i] + 0.25f * tanhf(x[i]);
}

__global__ static void k_mix_bwd(int n, const float *x, const float *dy, float *dx)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float t = tanhf(x[i]);
    dx[i] = dy[i] * (0.5f + 0.25f * (1.0f - t * t));
}

__global__ static void k_copy(int n, const float *x, float *y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = x ? x[i] : 0.0f;
}

/* One thread: the same order of summation as the cpu function. */
__global__ static void k_mse_loss(int n, const float *out, const float *t, float *loss)
{
    float s = 0;
    for (int i = 0; i < n; i++) {
        float d = out[i] - t[i];
        s += d * d;
    }
    *loss = s / (float)(2 * n);
}

__global__ static void k_mse_grad(int n, const float *out, const float *t, float *dout)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dout[i] = (out[i] - t[i]) / (float)n;
}

/* ------------------------------------------------------------ ops */

static int cu_gemm(void *dev, void *stream, int ta, int tb, int M, int N, int K, const void *A,
                   bmt_dtype_t at, const void *B, bmt_dtype_t bt, float beta, float *Cm,
                   bmt_dtype_t cd, bmt_error_t *err)
{
    ec_cuda_t *d = (ec_cuda_t *)dev;
    cudaStream_t st = (cudaStream_t)stream;
    const float alpha = 1.0f;
    cublasStatus_t s = cublasSetStream(d->blas, st);
    if (s != CUBLAS_STATUS_SUCCESS)
        return blas_err(err, "cublasSetStream", s);
    cublasOperation_t opA = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opB = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    int lda = ta ? M : K, ldb = tb ? K : N;
    if (cd != BMT_BF16) {
        if (at != BMT_F32 || bt != BMT_F32) {
            snprintf(err->text, sizeof(err->text), "engine_check: f32 gemm of bf16 operands");
            return -1;
        }
        s = cublasSgemm(d->blas, opB, opA, N, M, K, &alpha, (const float *)B, ldb, (const float *)A,
                        lda, &beta, Cm, N);
        return s == CUBLAS_STATUS_SUCCESS ? 0 : blas_err(err, "cublasSgemm", s);
    }
    const void *ops[2] = { A, B };
    const bmt_dtype_t types[2] = { at, bt };
    const int sizes[2] = { M * K, K * N };
    for (int i = 0; i < 2; i++) {
        if (types[i] == BMT_BF16)
            continue;
        if (sizes[i] > d->cap) {
            snprintf(err->text, sizeof(err->text),
                     "engine_check: gemm operand of %d elements "
                     "over the staging capacity %d",
                     sizes[i], d->cap);
            return -1;
        }
        k_to_bf16<<<grid(sizes[i]), 256, 0, st>>>(sizes[i], (const float *)ops[i], d->stage[i]);
        if (launched(err, "bf16 staging") < 0)
            return -1;
        ops[i] = d->stage[i];
    }
    s = cublasGemmEx(d->blas, opB, opA, N, M, K, &alpha, ops[1], CUDA_R_16BF, ldb, ops[0],
                     CUDA_R_16BF, lda, &beta, Cm, CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_SUCCESS ? 0 : blas_err(err, "cublasGemmEx (bf16)", s);
}

static int cu_ln_fwd(void *dev, void *stream, int M, int N, const float *x, const void *w,
                     const void *b, bmt_dtype_t pt, float *y, float *mean, float *rstd,
                     bmt_error_t *err)
{
    k_ln_fwd<<<grid(M), 256, 0, (cudaStream_t)stream>>>(M, N, x, w, b, pt == BMT_BF16, y, mean,
                                                        rstd);
    return launched(err, "layernorm forward");
}

static int cu_ln_bwd(void *dev, void *stream, int M, int N, const float *x, const float *mean,
                     const float *rstd, const void *w, bmt_dtype_t pt, const float *dy, float *dx,
                     float *dw, float *db, bmt_error_t *err)
{
    cudaStream_t st = (cudaStream_t)stream;
    k_ln_bwd_dx<<<grid(M), 256, 0, st>>>(M, N, x, mean, rstd, w, pt == BMT_BF16, dy, dx);
    if (launched(err, "layernorm backward (dx)") < 0)
        return -1;
    k_ln_bwd_dwb<<<grid(N), 256, 0, st>>>(M, N, x, mean, rstd, dy, dw, db);
    return launched(err, "layernorm backward (dw, db)");
}

static int cu_bias_add(void *dev, void *stream, int M, int N, float *y, const void *b,
                       bmt_dtype_t pt, bmt_error_t *err)
{
    k_bias_add<<<grid(M * N), 256, 0, (cudaStream_t)stream>>>(M, N, y, b, pt == BMT_BF16);
    return launched(err, "bias add");
}

static int cu_bias_grad(void *dev, void *stream, int M, int N, const float *dy, float *db,
                        bmt_error_t *err)
{
    k_bias_grad<<<grid(N), 256, 0, (cudaStream_t)stream>>>(M, N, dy, db);
    return launched(err, "bias grad");
}

static int cu_gelu_fwd(void *dev, void *stream, int n, const float *x, float *y, bmt_error_t *err)
{
    k_gelu_fwd<<<grid(n), 256, 0, (cudaStream_t)stream>>>(n, x, y);
    return launched(err, "gelu forward");
}

static int cu_gelu_bwd(void *dev, void *stream, int n, const float *x, const float *dy, float *dx,
                       bmt_error_t *err)
{
    k_gelu_bwd<<<grid(n), 256, 0, (cudaStream_t)stream>>>(n, x, dy, dx);
    return launched(err, "gelu backward");
}

static int cu_mix_fwd(void *dev, void *stream, int n, const float *x, float *y, bmt_error_t *err)
{
    k_mix_fwd<<<grid(n), 256, 0, (cudaStream_t)stream>>>(n, x, y);
    return launched(err, "mix forward");
}

static int cu_mix_bwd(void *dev, void *stream, int n, const float *x, const float *dy, float *dx,
                      bmt_error_t *err)
{
    k_mix_bwd<<<grid(n), 256, 0, (cudaStream_t)stream>>>(n, x, dy, dx);
    return launched(err, "mix backward");
}

static int cu_copy(void *dev, void *stream, int n, const float *x, float *y, bmt_error_t *err)
{
    k_copy<<<grid(n), 256, 0, (cudaStream_t)stream>>>(n, x, y);
    return launched(err, "copy");
}

static int cu_mse(void *dev, void *stream, int M, int N, const float *out, const float *target,
                  float *loss, float *dout, bmt_error_t *err)
{
    cudaStream_t st = (cudaStream_t)stream;
    if (loss) {
        k_mse_loss<<<1, 1, 0, st>>>(M * N, out, target, loss);
        if (launched(err, "mse loss") < 0)
            return -1;
    }
    if (dout) {
        k_mse_grad<<<grid(M * N), 256, 0, st>>>(M * N, out, target, dout);
        if (launched(err, "mse gradient") < 0)
            return -1;
    }
    return 0;
}

static const ec_ops_t cuda_ops = { cu_gemm,      cu_ln_fwd,   cu_ln_bwd,   cu_bias_add,
                                   cu_bias_grad, cu_gelu_fwd, cu_gelu_bwd, cu_mix_fwd,
                                   cu_mix_bwd,   cu_copy,     cu_mse };

extern "C" const ec_ops_t *ec_cuda_ops(void) { return &cuda_ops; }

extern "C" ec_cuda_t *ec_cuda_create(bmt_ctx_t *ctx, int cap, bmt_error_t *err)
{
    ec_cuda_t *d = (ec_cuda_t *)calloc(1, sizeof(*d));
    if (d == NULL) {
        snprintf(err->text, sizeof(err->text), "engine_check: out of host memory");
        return NULL;
    }
    d->ctx = ctx;
    d->cap = cap;
    cublasStatus_t s = cublasCreate(&d->blas);
    if (s != CUBLAS_STATUS_SUCCESS) {
        blas_err(err, "cublasCreate", s);
        free(d);
        return NULL;
    }
    /* Default math: no TF32 for f32 products, whatever NVIDIA_TF32_OVERRIDE says
     * elsewhere; the 1e-5 bound of the f32 run needs full f32 products. */
    s = cublasSetMathMode(d->blas, CUBLAS_DEFAULT_MATH);
    for (int i = 0; i < 2 && s == CUBLAS_STATUS_SUCCESS; i++) {
        d->stage[i] = (__nv_bfloat16 *)bmt_alloc(ctx, BMT_MEM_WORKSPACE, (size_t)cap * 2, err);
        if (d->stage[i] == NULL) {
            ec_cuda_destroy(d);
            return NULL;
        }
    }
    if (s != CUBLAS_STATUS_SUCCESS) {
        blas_err(err, "cublasSetMathMode", s);
        ec_cuda_destroy(d);
        return NULL;
    }
    return d;
}

extern "C" void ec_cuda_destroy(ec_cuda_t *d)
{
    if (d == NULL)
        return;
    for (int i = 0; i < 2; i++)
        bmt_free(d->ctx, d->stage[i]);
    if (d->blas)
        cublasDestroy(d->blas);
    free(d);
}
