/* nn/cuda_util.cuh — the small helpers every CUDA file of nn/ uses (internal):
 * error text ("nn cuda: <what>: <why>"), launch checks, grid sizes, 16-byte
 * alignment, GELU, warp reductions, bf16 <-> f32 in 16-byte chunks, and the
 * last step of a column sum (colsum_final). Everything
 * is in an anonymous namespace: each file gets its own copy, nothing is
 * exported from libnn.
 */
#ifndef NN_CUDA_UTIL_CUH
#define NN_CUDA_UTIL_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "bmt/error.h"

typedef __nv_bfloat16 bf16;

namespace
{

int fail_text(bmt_error_t *err, const char *what, const char *why)
{
    if (err)
        snprintf(err->text, sizeof(err->text), "nn cuda: %s: %s", what, why);
    return -1;
}

/* The FP8 products' residual (C) input: -1 with err when res is NULL or
 * out itself (in place, cuBLASLt's FP8 product gave other bits than into a
 * buffer of its own: tests/gpu/fp8_check.c), else 0. */
int fp8_res_refused(const void *out, const void *res, const char *what, bmt_error_t *err)
{
    if (res == NULL)
        return fail_text(err, what, "res is NULL");
    if (res == out)
        return fail_text(err, what,
                         "res is out: in place, cuBLASLt's FP8 product gave other bits than into "
                         "a buffer of its own (tests/gpu/fp8_check.c); give out a buffer of its "
                         "own");
    return 0;
}

int launched(bmt_error_t *err, const char *what)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : fail_text(err, what, cudaGetErrorString(e));
}

unsigned blocks_for(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 65535u * 8 ? 65535u * 8 : b);
}

/* Whether every pointer is 16-byte aligned (NULL counts as aligned). */
bool aligned16(const void *a, const void *b = NULL, const void *c = NULL, const void *d = NULL,
               const void *e = NULL)
{
    return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d | (uintptr_t)e) & 15) == 0;
}

__device__ __forceinline__ float ld(const bf16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ bf16 bf(float x) { return __float2bfloat16(x); }

/* GELU, tanh approximation (GPT-2's), and its derivative, in f32: the one
 * definition the element-wise kernels and the FP8 conversions share, so a
 * GELU fused into a conversion gives the bits nn_cuda_gelu_forward writes. */
#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */

__device__ __forceinline__ float gelu_f(float x)
{
    return 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x)));
}

__device__ __forceinline__ float gelu_grad(float x)
{
    const float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    const float th = tanhf(u);
    return 0.5f * (1.0f + th) +
           0.5f * x * (1.0f - th * th) * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The 8 bf16 of a 16-byte chunk as floats, and back (round to nearest). */
__device__ __forceinline__ void unpack8(float f[8], uint4 u)
{
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 t = __bfloat1622float2(h[k]);
        f[2 * k] = t.x, f[2 * k + 1] = t.y;
    }
}

__device__ __forceinline__ uint4 pack8(const float f[8])
{
    uint4 u;
    __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
#pragma unroll
    for (int k = 0; k < 4; k++)
        h[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
    return u;
}

/* dst_k[col] += sum over chunks of partial[k][chunk][col]: grid (ceil(cols /
 * 32)), block (32, 8); thread (x, y) adds chunks y, y + 8, ... of column x (8
 * independent loads in flight, not one chunk at a time), then the block adds
 * the 8 sums in y order: a fixed order, so the same bits on every run. add:
 * dst += the sums, else dst = them (a fresh gradient). */
__global__ void colsum_final(float *dst0, float *dst1, const float *partial, int cols, int chunks,
                             bool add)
{
    __shared__ float s[2][8][33];
    const int col = blockIdx.x * 32 + threadIdx.x, y = threadIdx.y, K = dst1 ? 2 : 1;
    for (int k = 0; k < K; k++) {
        float t = 0;
        if (col < cols) {
            const float *p = partial + (size_t)k * chunks * cols + col;
#pragma unroll 8
            for (int c = y; c < chunks; c += 8)
                t += p[(size_t)c * cols];
        }
        s[k][y][threadIdx.x] = t;
    }
    __syncthreads();
    if (y < K && col < cols) {
        float t = 0;
        for (int i = 0; i < 8; i++)
            t += s[y][i][threadIdx.x];
        float *d = y ? dst1 : dst0;
        d[col] = add ? d[col] + t : t;
    }
}

} // namespace

#endif
