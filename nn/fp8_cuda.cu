/* nn/fp8_cuda.cu — FP8 conversions and scales on CUDA (see fp8_cuda.h).
 *
 * Layer: nn/, below every model; runs on an nn/ops_cuda.h handle's stream.
 *
 * The arithmetic is nn/fp8.c's, step for step, so the results are the same bits:
 * x (bf16, exact in f32) times the scale, one f32 multiplication (__fmul_rn:
 * never fused), converted by the hardware's cvt.rn.satfinite (round to nearest
 * even, saturate to the largest finite value; CUDA's __nv_cvt_float_to_fp8
 * with __NV_SATFINITE). The scale is one IEEE division and a scaling by a power
 * of two, as nn_fp8_scale (f32 denormals are kept: no -ftz in NVCC_FLAGS).
 *
 * amax: the largest |x| as the largest bit pattern of |x| (sign cleared): for
 * non-negative floats the bit order is the value order, and every NaN pattern
 * lies above infinity's, so a NaN anywhere wins, as in nn_fp8_amax. Warps
 * reduce with __reduce_max_sync, then one atomicMax per warp; max does not
 * depend on the order, so every run gives the same bits.
 *
 * The transposed copy: a block converts a 32 x 32 tile (32 x 8 threads, four
 * rows each), writes the row-major codes, and writes the transposed codes from
 * shared memory, so both layouts come from one read of x.
 */
#include "nn/fp8_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "nn/cuda_util.cuh"

#define TILE 32
#define TILE_ROWS 8 /* threadIdx.y: each thread converts TILE / TILE_ROWS rows of a tile */

namespace
{

cudaStream_t stream_of(nn_cuda_t *h) { return (cudaStream_t)nn_cuda_stream(h); }

template <int KIND> __device__ __forceinline__ uint8_t to_fp8(float y)
{
    return (uint8_t)__nv_cvt_float_to_fp8(y, __NV_SATFINITE,
                                          KIND == NN_FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
}

__device__ __forceinline__ void amax_add(unsigned *amax, unsigned m)
{
    m = __reduce_max_sync(0xffffffffu, m);
    if ((threadIdx.x & 31) == 0)
        atomicMax(amax, m);
}

__global__ void amax_k(unsigned *amax, const bf16 *x, size_t n)
{
    unsigned m = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        m = max(m, __float_as_uint(ld(&x[i])) & 0x7fffffffu);
    amax_add(amax, m);
}

__global__ void scale_k(float *scale, float *descale, const float *amax, float fmax, int margin,
                        int *bad)
{
    const float a = *amax;
    float s = 0.0f;
    if (!isnan(a) && !isinf(a) && a >= 0.0f) {
        if (a == 0.0f) {
            s = 1.0f;
        } else {
            s = scalbnf(__fdiv_rn(fmax, a), -margin);
            if (!isfinite(s) || s <= 0.0f)
                s = 0.0f;
        }
    }
    /* A tensor that cannot be scaled gets NaN for both, so its codes and every
     * product it enters are NaN: the step is seen as non-finite, never as a
     * silent zero. */
    *scale = s == 0.0f ? __int_as_float(0x7fc00000) : s;
    *descale = s == 0.0f ? __int_as_float(0x7fc00000) : __fdiv_rn(1.0f, s);
    if (s == 0.0f)
        *bad = 1;
}

/* blockDim (TILE, TILE_ROWS); grid (cols / TILE, rows / TILE) rounded up. */
template <int KIND>
__global__ void quantize_k(uint8_t *q, uint8_t *qt, const bf16 *x, int ldx, int rows, int cols,
                           const float *scale, unsigned *amax)
{
    __shared__ uint8_t tile[TILE][TILE + 1];
    const float s = *scale;
    const int c0 = blockIdx.x * TILE, r0 = blockIdx.y * TILE;
    unsigned m = 0;
    for (int i = threadIdx.y; i < TILE; i += TILE_ROWS) {
        const int r = r0 + i, c = c0 + threadIdx.x;
        uint8_t v = 0;
        if (r < rows && c < cols) {
            const float f = ld(&x[(size_t)r * ldx + c]);
            m = max(m, __float_as_uint(f) & 0x7fffffffu);
            v = to_fp8<KIND>(__fmul_rn(f, s));
            if (q)
                q[(size_t)r * cols + c] = v;
        }
        tile[i][threadIdx.x] = v;
    }
    if (amax)
        amax_add(amax, m);
    if (qt) {
        __syncthreads();
        for (int i = threadIdx.y; i < TILE; i += TILE_ROWS) {
            const int c = c0 + i, r = r0 + threadIdx.x;
            if (c < cols && r < rows)
                qt[(size_t)c * rows + r] = tile[threadIdx.x][i];
        }
    }
}

} // namespace

extern "C" int nn_cuda_fp8_amax(nn_cuda_t *h, float *amax, const void *x, size_t n,
                                bmt_error_t *err)
{
    if (amax == NULL || x == NULL)
        return fail_text(err, "fp8 amax", "a pointer is NULL");
    cudaStream_t st = stream_of(h);
    if (cudaMemsetAsync(amax, 0, sizeof(float), st) != cudaSuccess)
        return launched(err, "fp8 amax (clear)");
    amax_k<<<blocks_for(n, 256) < 1024 ? blocks_for(n, 256) : 1024, 256, 0, st>>>(
        (unsigned *)amax, (const bf16 *)x, n);
    return launched(err, "fp8 amax");
}

extern "C" int nn_cuda_fp8_scale(nn_cuda_t *h, float *scale, float *descale, const float *amax,
                                 nn_fp8_kind_t kind, int margin, int *bad, bmt_error_t *err)
{
    if (scale == NULL || descale == NULL || amax == NULL || bad == NULL)
        return fail_text(err, "fp8 scale", "a pointer is NULL");
    if (margin < 0 || margin > 64 || (kind != NN_FP8_E4M3 && kind != NN_FP8_E5M2))
        return fail_text(err, "fp8 scale", "margin not in 0..64, or not an FP8 kind");
    scale_k<<<1, 1, 0, stream_of(h)>>>(scale, descale, amax, nn_fp8_max(kind), margin, bad);
    return launched(err, "fp8 scale");
}

extern "C" int nn_cuda_fp8_quantize(nn_cuda_t *h, uint8_t *q, uint8_t *qt, const void *x, int ld,
                                    int rows, int cols, const float *scale, nn_fp8_kind_t kind,
                                    float *amax, bmt_error_t *err)
{
    char why[160];
    if (x == NULL || scale == NULL || (q == NULL && qt == NULL))
        return fail_text(err, "fp8 quantize", "x, scale, or both outputs are NULL");
    if (rows < 1 || cols < 1 || ld < cols || (rows + TILE - 1) / TILE > 65535) {
        snprintf(why, sizeof(why),
                 "rows %d, cols %d, ld %d: want rows 1..%d, cols >= 1, ld >= cols", rows, cols, ld,
                 65535 * TILE);
        return fail_text(err, "fp8 quantize", why);
    }
    if ((q && cols % 16) || (qt && rows % 16) || !aligned16(q, qt)) {
        snprintf(why, sizeof(why),
                 "the FP8 products want rows of 16-byte multiples: cols %d (q), rows %d (qt), "
                 "and 16-byte aligned outputs",
                 cols, rows);
        return fail_text(err, "fp8 quantize", why);
    }
    cudaStream_t st = stream_of(h);
    if (amax && cudaMemsetAsync(amax, 0, sizeof(float), st) != cudaSuccess)
        return launched(err, "fp8 quantize (clear amax)");
    const dim3 grid((cols + TILE - 1) / TILE, (rows + TILE - 1) / TILE), block(TILE, TILE_ROWS);
    if (kind == NN_FP8_E4M3)
        quantize_k<NN_FP8_E4M3><<<grid, block, 0, st>>>(q, qt, (const bf16 *)x, ld, rows, cols,
                                                        scale, (unsigned *)amax);
    else if (kind == NN_FP8_E5M2)
        quantize_k<NN_FP8_E5M2><<<grid, block, 0, st>>>(q, qt, (const bf16 *)x, ld, rows, cols,
                                                        scale, (unsigned *)amax);
    else
        return fail_text(err, "fp8 quantize", "not an FP8 kind");
    return launched(err, "fp8 quantize");
}

extern "C" int nn_cuda_fp8_cast(nn_cuda_t *h, uint8_t *q, uint8_t *qt, const void *x, int rows,
                                int cols, nn_fp8_kind_t kind, float *s, int *bad, bmt_error_t *err)
{
    if (s == NULL || (uintptr_t)s % 16)
        return fail_text(err, "fp8 cast", "the scales are NULL or not 16-byte aligned");
    if (rows < 1 || cols < 1)
        return fail_text(err, "fp8 cast", "rows and cols must be >= 1");
    if (nn_cuda_fp8_amax(h, &s[2], x, (size_t)rows * cols, err) < 0 ||
        nn_cuda_fp8_scale(h, &s[1], &s[0], &s[2], kind, 0, bad, err) < 0)
        return -1;
    return nn_cuda_fp8_quantize(h, q, qt, x, cols, rows, cols, &s[1], kind, NULL, err);
}

/* Scratch: [a: N max(IC,OC)] [b: N OC] [c: IC OC], each rounded up to 256
 * bytes. The forward puts the input's row-major codes in a and the weight's
 * transposed codes in c; the backward puts dout's codes in a (row-major) and b
 * (transposed), and the weight's row-major codes in c. */
static size_t up256(size_t n) { return (n + 255) / 256 * 256; }

extern "C" size_t nn_cuda_fp8_conv1d_scratch_bytes(int N, int IC, int OC)
{
    const size_t n = (size_t)N, ic = (size_t)IC, oc = (size_t)OC;
    return up256(n * (ic > oc ? ic : oc)) + up256(n * oc) + up256(ic * oc);
}

static int conv1d_args(int N, int IC, int OC, const float *s, const void *scratch, const char *what,
                       bmt_error_t *err)
{
    char why[200];
    if (N < 16 || IC < 16 || OC < 16 || N % 16 || IC % 16 || OC % 16) {
        snprintf(why, sizeof(why),
                 "N %d, IC %d, OC %d: each must be a multiple of 16 (the FP8 products' reduced "
                 "dimension and the transposed codes' rows)",
                 N, IC, OC);
        return fail_text(err, what, why);
    }
    if (s == NULL || scratch == NULL || (uintptr_t)s % 16 || (uintptr_t)scratch % 256)
        return fail_text(err, what,
                         "the scales or the scratch are NULL, or not 16- and 256-byte "
                         "aligned");
    return 0;
}

extern "C" int nn_cuda_fp8_conv1d_forward(nn_cuda_t *h, void *out, uint8_t *xqt, const void *inp,
                                          const void *weight, const void *bias, int N, int IC,
                                          int OC, int fast_accum, float *s, int *bad, void *scratch,
                                          bmt_error_t *err)
{
    if (conv1d_args(N, IC, OC, s, scratch, "fp8 conv1d forward", err) < 0)
        return -1;
    uint8_t *xq = (uint8_t *)scratch;
    uint8_t *wqt = xq + up256((size_t)N * (IC > OC ? IC : OC)) + up256((size_t)N * OC);
    /* out (N,OC) = x (N,IC) x (W^T (OC,IC))^T: both with IC contiguous */
    if (nn_cuda_fp8_cast(h, xq, xqt, inp, N, IC, NN_FP8_E4M3, &s[0], bad, err) < 0 ||
        nn_cuda_fp8_cast(h, NULL, wqt, weight, IC, OC, NN_FP8_E4M3, &s[4], bad, err) < 0)
        return -1;
    return nn_cuda_fp8_matmul(h, out, 0, OC, xq, NN_FP8_E4M3, &s[0], wqt, NN_FP8_E4M3, &s[4], bias,
                              0.0f, fast_accum, N, IC, OC, err);
}

extern "C" int nn_cuda_fp8_conv1d_backward(nn_cuda_t *h, void *dinp, float *dweight, float *dbias,
                                           const void *dout, const uint8_t *xqt, const void *weight,
                                           int N, int IC, int OC, float *s, int *bad, void *scratch,
                                           bmt_error_t *err)
{
    if (conv1d_args(N, IC, OC, s, scratch, "fp8 conv1d backward", err) < 0)
        return -1;
    if (dweight && xqt == NULL)
        return fail_text(err, "fp8 conv1d backward", "dweight wants the forward's xqt");
    uint8_t *gq = (uint8_t *)scratch;
    uint8_t *gqt = gq + up256((size_t)N * (IC > OC ? IC : OC));
    uint8_t *wq = gqt + up256((size_t)N * OC);
    if ((dinp || dweight) && nn_cuda_fp8_cast(h, dinp ? gq : NULL, dweight ? gqt : NULL, dout, N,
                                              OC, NN_FP8_E5M2, &s[8], bad, err) < 0)
        return -1;
    /* dW (IC,OC) += x^T (IC,N) x (dout^T (OC,N))^T: both with N contiguous */
    if (dweight && nn_cuda_fp8_matmul(h, dweight, 1, OC, xqt, NN_FP8_E4M3, &s[0], gqt, NN_FP8_E5M2,
                                      &s[8], NULL, 1.0f, 0, IC, N, OC, err) < 0)
        return -1;
    /* dinp (N,IC) = dout (N,OC) x (W (IC,OC))^T: both with OC contiguous; the
     * weight's codes again at the forward's scale (the same bits) */
    if (dinp &&
        (nn_cuda_fp8_quantize(h, wq, NULL, weight, OC, IC, OC, &s[5], NN_FP8_E4M3, NULL, err) < 0 ||
         nn_cuda_fp8_matmul(h, dinp, 0, IC, gq, NN_FP8_E5M2, &s[8], wq, NN_FP8_E4M3, &s[4], NULL,
                            0.0f, 0, N, OC, IC, err) < 0))
        return -1;
    return dbias ? nn_cuda_matmul_backward(h, NULL, NULL, dbias, dout, OC, NULL, NULL, N, IC, OC, 0,
                                           err)
                 : 0;
}
