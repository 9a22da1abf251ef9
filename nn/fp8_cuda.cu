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
 * lies above infinity's, so a NaN anywhere wins, as in nn_fp8_amax. bf16 is
 * the high half of an f32, so the order holds for bf16 patterns too: a thread
 * reads 16-byte chunks (8 bf16) and takes the max of two 16-bit patterns at a
 * time (__vmaxu2). Warps reduce with __reduce_max_sync, then one atomicMax
 * per warp; max does not depend on the order, so every run gives the same
 * bits.
 *
 * The conversion reads x once and writes both layouts: a block of 256 threads
 * takes a 64 x 64 tile in 16-byte chunks (8 bf16 in, 8 codes out, one 8-byte
 * store of the row-major codes), keeps the tile's codes in shared memory, and
 * writes the transposed codes from there, 16 bytes per thread. Where x's rows
 * are not whole chunks (cols or ld not a multiple of 8, or x not 16-byte
 * aligned) a 32 x 32 tile of single elements does the same.
 *
 * nn_cuda_fp8_cast takes three launches: clear amax, amax, and the conversion,
 * whose blocks each make the scale from amax (one division) and the first of
 * them stores it, so no kernel of one thread runs in between.
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

/* x 16-byte aligned, n8 chunks of 8 bf16; two 16-bit |x| patterns per word. */
__global__ void amax_chunks_k(unsigned *amax, const uint4 *x, size_t n8)
{
    unsigned m = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n8; i += 4 * stride) { /* four loads in flight */
        uint4 u[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            u[k] = __ldg(&x[i + k * stride]);
#pragma unroll
        for (int k = 0; k < 4; k++)
            m = __vmaxu2(m, __vmaxu2(__vmaxu2(u[k].x & 0x7fff7fffu, u[k].y & 0x7fff7fffu),
                                     __vmaxu2(u[k].z & 0x7fff7fffu, u[k].w & 0x7fff7fffu)));
    }
    for (; i < n8; i += stride) {
        const uint4 u = __ldg(&x[i]);
        m = __vmaxu2(m, __vmaxu2(__vmaxu2(u.x & 0x7fff7fffu, u.y & 0x7fff7fffu),
                                 __vmaxu2(u.z & 0x7fff7fffu, u.w & 0x7fff7fffu)));
    }
    amax_add(amax, max(m & 0xffffu, m >> 16) << 16); /* the bf16 pattern as an f32's */
}

/* nn_fp8_scale's arithmetic: 0 where the tensor cannot be scaled. */
__device__ __forceinline__ float scale_of(float a, float fmax, int margin)
{
    if (isnan(a) || isinf(a) || a < 0.0f)
        return 0.0f;
    if (a == 0.0f)
        return 1.0f;
    const float s = scalbnf(__fdiv_rn(fmax, a), -margin);
    return isfinite(s) && s > 0.0f ? s : 0.0f;
}

/* A tensor that cannot be scaled gets NaN for both, so its codes and every
 * product it enters are NaN: the step is seen as non-finite, never as a
 * silent zero. */
__device__ __forceinline__ void store_scale(float *scale, float *descale, int *bad, float s)
{
    *scale = s == 0.0f ? __int_as_float(0x7fc00000) : s;
    *descale = s == 0.0f ? __int_as_float(0x7fc00000) : __fdiv_rn(1.0f, s);
    if (s == 0.0f)
        *bad = 1;
}

__global__ void scale_k(float *scale, float *descale, const float *amax, float fmax, int margin,
                        int *bad)
{
    store_scale(scale, descale, bad, scale_of(*amax, fmax, margin));
}

/* Where a conversion's scale comes from: the scale itself, or (nn_cuda_fp8_cast)
 * the amax it is made from, every block making it and the first one storing
 * it with its descale. */
struct scale_src {
    const float *scale; /* or NULL: from amax */
    const float *amax;
    float *scale_out, *descale_out;
    int *bad;
    float fmax;
};

__device__ __forceinline__ float scale_get(const scale_src &src)
{
    if (src.scale)
        return *src.scale;
    const float s = scale_of(*src.amax, src.fmax, 0);
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0)
        store_scale(src.scale_out, src.descale_out, src.bad, s);
    return s == 0.0f ? __int_as_float(0x7fc00000) : s;
}

/* blockDim (TILE, TILE_ROWS); grid (cols / TILE, rows / TILE) rounded up. */
template <int KIND>
__global__ void quantize_k(uint8_t *q, uint8_t *qt, const bf16 *x, int ldx, int rows, int cols,
                           scale_src src, unsigned *amax)
{
    __shared__ uint8_t tile[TILE][TILE + 1];
    const float s = scale_get(src);
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

/* The 16-byte path: blockDim 256, grid (cols / CT, rows / CT) rounded up; x
 * 16-byte aligned, ld and cols multiples of 8, so a chunk is wholly in or
 * out; for qt, rows a multiple of 16, so a transposed chunk is too. */
#define CT 64
#define CT_PITCH 68 /* bytes per shared row: 17 words, few bank conflicts */
template <int KIND>
__global__ void __launch_bounds__(256)
    quantize_chunks_k(uint8_t *q, uint8_t *qt, const bf16 *x, int ldx, int rows, int cols,
                      scale_src src, unsigned *amax)
{
    __shared__ __align__(16) uint8_t tile[CT * CT_PITCH];
    const float s = scale_get(src);
    const int c0 = blockIdx.x * CT, r0 = blockIdx.y * CT, t = threadIdx.x;
    const int cc = (t & 7) * 8; /* this thread's chunk of a row */
    unsigned m = 0;
#pragma unroll
    for (int p = 0; p < 2; p++) {
        const int i = (t >> 3) + 32 * p, r = r0 + i, c = c0 + cc;
        uint32_t lo = 0, hi = 0;
        if (r < rows && c < cols) {
            const uint4 u = __ldg(reinterpret_cast<const uint4 *>(&x[(size_t)r * ldx + c]));
            const uint32_t w[4] = { u.x, u.y, u.z, u.w };
#pragma unroll
            for (int k = 0; k < 4; k++) {
                m = __vmaxu2(m, w[k] & 0x7fff7fffu);
                const uint32_t a = to_fp8<KIND>(__fmul_rn(__uint_as_float(w[k] << 16), s)),
                               b = to_fp8<KIND>(__fmul_rn(__uint_as_float(w[k] & 0xffff0000u), s));
                const uint32_t two = a | b << 8;
                if (k < 2)
                    lo |= two << (16 * k);
                else
                    hi |= two << (16 * (k - 2));
            }
            if (q)
                *reinterpret_cast<uint2 *>(&q[(size_t)r * cols + c]) = make_uint2(lo, hi);
        }
        uint32_t *row = reinterpret_cast<uint32_t *>(&tile[i * CT_PITCH + cc]);
        row[0] = lo, row[1] = hi;
    }
    if (amax)
        amax_add(amax, max(m & 0xffffu, m >> 16) << 16);
    if (qt) {
        __syncthreads();
        const int j = t >> 2, i0 = (t & 3) * 16, c = c0 + j, r = r0 + i0;
        if (c < cols && r < rows) {
            uint32_t w[4];
#pragma unroll
            for (int k = 0; k < 4; k++)
                w[k] = (uint32_t)tile[(i0 + 4 * k) * CT_PITCH + j] |
                       (uint32_t)tile[(i0 + 4 * k + 1) * CT_PITCH + j] << 8 |
                       (uint32_t)tile[(i0 + 4 * k + 2) * CT_PITCH + j] << 16 |
                       (uint32_t)tile[(i0 + 4 * k + 3) * CT_PITCH + j] << 24;
            *reinterpret_cast<uint4 *>(&qt[(size_t)c * rows + r]) =
                make_uint4(w[0], w[1], w[2], w[3]);
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
    /* 16-byte chunks where x is aligned; single elements for the rest */
    const size_t n8 = aligned16(x) ? n / 8 : 0, rest = n - 8 * n8;
    if (n8) {
        const unsigned b = blocks_for(n8, 256 * 4), grid = b < 1056 ? b : 1056;
        amax_chunks_k<<<grid, 256, 0, st>>>((unsigned *)amax, (const uint4 *)x, n8);
    }
    if (rest) {
        const unsigned b = blocks_for(rest, 256), grid = b < 1024 ? b : 1024;
        amax_k<<<grid, 256, 0, st>>>((unsigned *)amax, (const bf16 *)x + 8 * n8, rest);
    }
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

template <int KIND>
static void quantize_launch(cudaStream_t st, uint8_t *q, uint8_t *qt, const bf16 *x, int ld,
                            int rows, int cols, const scale_src &src, unsigned *amax)
{
    if (aligned16(x) && ld % 8 == 0 && cols % 8 == 0) {
        const dim3 grid((cols + CT - 1) / CT, (rows + CT - 1) / CT);
        quantize_chunks_k<KIND><<<grid, 256, 0, st>>>(q, qt, x, ld, rows, cols, src, amax);
    } else {
        const dim3 grid((cols + TILE - 1) / TILE, (rows + TILE - 1) / TILE), block(TILE, TILE_ROWS);
        quantize_k<KIND><<<grid, block, 0, st>>>(q, qt, x, ld, rows, cols, src, amax);
    }
}

static int quantize(nn_cuda_t *h, uint8_t *q, uint8_t *qt, const void *x, int ld, int rows,
                    int cols, const scale_src &src, nn_fp8_kind_t kind, float *amax,
                    bmt_error_t *err)
{
    char why[160];
    if (x == NULL || (q == NULL && qt == NULL))
        return fail_text(err, "fp8 quantize", "x, or both outputs, are NULL");
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
    if (kind != NN_FP8_E4M3 && kind != NN_FP8_E5M2)
        return fail_text(err, "fp8 quantize", "not an FP8 kind");
    cudaStream_t st = stream_of(h);
    if (amax && cudaMemsetAsync(amax, 0, sizeof(float), st) != cudaSuccess)
        return launched(err, "fp8 quantize (clear amax)");
    if (kind == NN_FP8_E4M3)
        quantize_launch<NN_FP8_E4M3>(st, q, qt, (const bf16 *)x, ld, rows, cols, src,
                                     (unsigned *)amax);
    else
        quantize_launch<NN_FP8_E5M2>(st, q, qt, (const bf16 *)x, ld, rows, cols, src,
                                     (unsigned *)amax);
    return launched(err, "fp8 quantize");
}

extern "C" int nn_cuda_fp8_quantize(nn_cuda_t *h, uint8_t *q, uint8_t *qt, const void *x, int ld,
                                    int rows, int cols, const float *scale, nn_fp8_kind_t kind,
                                    float *amax, bmt_error_t *err)
{
    if (scale == NULL)
        return fail_text(err, "fp8 quantize", "scale is NULL");
    scale_src src = {};
    src.scale = scale;
    return quantize(h, q, qt, x, ld, rows, cols, src, kind, amax, err);
}

extern "C" int nn_cuda_fp8_cast(nn_cuda_t *h, uint8_t *q, uint8_t *qt, const void *x, int rows,
                                int cols, nn_fp8_kind_t kind, float *s, int *bad, bmt_error_t *err)
{
    if (s == NULL || (uintptr_t)s % 16 || bad == NULL)
        return fail_text(err, "fp8 cast",
                         "the scales are NULL or not 16-byte aligned, or bad is NULL");
    if (rows < 1 || cols < 1)
        return fail_text(err, "fp8 cast", "rows and cols must be >= 1");
    if (kind != NN_FP8_E4M3 && kind != NN_FP8_E5M2)
        return fail_text(err, "fp8 cast", "not an FP8 kind");
    if (nn_cuda_fp8_amax(h, &s[2], x, (size_t)rows * cols, err) < 0)
        return -1;
    /* the conversion makes s[1] and s[0] from s[2] (scale_get) */
    scale_src src = {};
    src.amax = &s[2], src.scale_out = &s[1], src.descale_out = &s[0], src.bad = bad;
    src.fmax = nn_fp8_max(kind);
    return quantize(h, q, qt, x, cols, rows, cols, src, kind, NULL, err);
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
