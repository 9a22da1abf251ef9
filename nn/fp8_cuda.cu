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
 * A conversion can convert a function of x instead of x (act1): GELU(x), or
 * GELU's input gradient from x and GELU's input, each value rounded to bf16
 * as the element-wise kernel would write it, so the GELU kernels' outputs
 * need not exist. A backward's conversion also takes the column sums of what
 * it converts (the bias gradient): each block sums its tile's columns in a
 * fixed order into partial sums, and colsum_final adds those in a fixed
 * order, so the bits are the same on every run.
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

/* max into *amax and, if rec, into *rec (a pass's record) */
__device__ __forceinline__ void amax_add(unsigned *amax, unsigned *rec, unsigned m)
{
    m = __reduce_max_sync(0xffffffffu, m);
    if ((threadIdx.x & 31) == 0) {
        atomicMax(amax, m);
        if (rec)
            atomicMax(rec, m);
    }
}

/* The block's max (blockDim.x * blockDim.y threads, a multiple of 32, at most
 * 1024) into *amax with one atomic per block: a large tensor's conversion
 * has thousands of blocks, all on one address. */
__device__ __forceinline__ void amax_block(unsigned *amax, unsigned m)
{
    __shared__ unsigned red[32];
    const int t = threadIdx.y * blockDim.x + threadIdx.x, nw = blockDim.x * blockDim.y / 32;
    m = __reduce_max_sync(0xffffffffu, m);
    if ((t & 31) == 0)
        red[t >> 5] = m;
    __syncthreads();
    if (t < 32) {
        m = t < nw ? red[t] : 0u;
        m = __reduce_max_sync(0xffffffffu, m);
        if (t == 0 && m)
            atomicMax(amax, m);
    }
}

/* What a conversion converts (ACT): x itself; GELU(x), for a GELU's output
 * read from its input (nn_cuda_fp8_codes' gelu), each value rounded to bf16
 * as nn_cuda_gelu_forward writes it; or GELU'(pre) x, for GELU's input
 * gradient read from its output gradient x and its input pre
 * (nn_cuda_fp8_conv1d_backward's dgelu_pre), rounded as nn_cuda_gelu_backward
 * writes it. Either way the codes are the same bits as converting the
 * element-wise kernel's output. */
enum {
    ACT_NONE,
    ACT_GELU,
    ACT_DGELU
};

template <int ACT> __device__ __forceinline__ float act1(float f, float p)
{
    if (ACT == ACT_GELU)
        return __bfloat162float(bf(gelu_f(f)));
    if (ACT == ACT_DGELU)
        return __bfloat162float(bf(gelu_grad(p) * f));
    return f;
}

/* act1 on the two bf16 of a word (and of pre's word) */
template <int ACT> __device__ __forceinline__ uint32_t act2(uint32_t w, uint32_t wp)
{
    if (ACT == ACT_NONE)
        return w;
    const uint32_t lo = __float_as_uint(
                            act1<ACT>(__uint_as_float(w << 16), __uint_as_float(wp << 16))) >>
                        16,
                   hi = __float_as_uint(act1<ACT>(__uint_as_float(w & 0xffff0000u),
                                                  __uint_as_float(wp & 0xffff0000u)));
    return lo | hi;
}

template <int ACT> __device__ __forceinline__ uint4 act4(uint4 u, const uint4 *pre, size_t i)
{
    if (ACT == ACT_NONE)
        return u;
    const uint4 p = ACT == ACT_DGELU ? __ldg(&pre[i]) : u;
    return make_uint4(act2<ACT>(u.x, p.x), act2<ACT>(u.y, p.y), act2<ACT>(u.z, p.z),
                      act2<ACT>(u.w, p.w));
}

template <int ACT>
__global__ void amax_k(unsigned *amax, unsigned *rec, const bf16 *x, const bf16 *pre, size_t n)
{
    unsigned m = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        m = max(m, __float_as_uint(act1<ACT>(ld(&x[i]), ACT == ACT_DGELU ? ld(&pre[i]) : 0.0f)) &
                       0x7fffffffu);
    amax_add(amax, rec, m);
}

/* x (and pre) 16-byte aligned, n8 chunks of 8 bf16; two 16-bit |x| patterns
 * per word. */
template <int ACT>
__global__ void amax_chunks_k(unsigned *amax, unsigned *rec, const uint4 *x, const uint4 *pre,
                              size_t n8)
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
            u[k] = act4<ACT>(u[k], pre, i + k * stride);
#pragma unroll
        for (int k = 0; k < 4; k++)
            m = __vmaxu2(m, __vmaxu2(__vmaxu2(u[k].x & 0x7fff7fffu, u[k].y & 0x7fff7fffu),
                                     __vmaxu2(u[k].z & 0x7fff7fffu, u[k].w & 0x7fff7fffu)));
    }
    for (; i < n8; i += stride) {
        const uint4 u = act4<ACT>(__ldg(&x[i]), pre, i);
        m = __vmaxu2(m, __vmaxu2(__vmaxu2(u.x & 0x7fff7fffu, u.y & 0x7fff7fffu),
                                 __vmaxu2(u.z & 0x7fff7fffu, u.w & 0x7fff7fffu)));
    }
    amax_add(amax, rec, max(m & 0xffffu, m >> 16) << 16); /* the bf16 pattern as an f32's */
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
    bool inf_nan; /* an infinity in x becomes NaN (delayed scaling), not the largest value */
    int act;      /* what is converted: ACT_NONE, ACT_GELU or ACT_DGELU (act1) */
};

__device__ __forceinline__ float nan_if_inf(const scale_src &src, float f)
{
    return src.inf_nan && isinf(f) ? __int_as_float(0x7fc00000) : f;
}

__device__ __forceinline__ float scale_get(const scale_src &src)
{
    if (src.scale)
        return *src.scale;
    const float s = scale_of(*src.amax, src.fmax, 0);
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0)
        store_scale(src.scale_out, src.descale_out, src.bad, s);
    return s == 0.0f ? __int_as_float(0x7fc00000) : s;
}

/* blockDim (TILE, TILE_ROWS); grid (cols / TILE, rows / TILE) rounded up.
 * part, if not NULL: part[blockIdx.y][c] = the sum of the tile's converted
 * values (before the scale) in column c, rows in a fixed order. */
template <int KIND, int ACT>
__global__ void quantize_k(uint8_t *q, uint8_t *qt, const bf16 *x, const bf16 *pre, int ldx,
                           int rows, int cols, scale_src src, unsigned *amax, float *part)
{
    __shared__ uint8_t tile[TILE][TILE + 1];
    __shared__ float sums[TILE_ROWS][TILE];
    const float s = scale_get(src);
    const int c0 = blockIdx.x * TILE, r0 = blockIdx.y * TILE;
    unsigned m = 0;
    float cs = 0.0f;
    for (int i = threadIdx.y; i < TILE; i += TILE_ROWS) {
        const int r = r0 + i, c = c0 + threadIdx.x;
        uint8_t v = 0;
        if (r < rows && c < cols) {
            const size_t at = (size_t)r * ldx + c;
            const float f = act1<ACT>(ld(&x[at]), ACT == ACT_DGELU ? ld(&pre[at]) : 0.0f);
            m = max(m, __float_as_uint(f) & 0x7fffffffu);
            cs += f;
            v = to_fp8<KIND>(__fmul_rn(nan_if_inf(src, f), s));
            if (q)
                q[(size_t)r * cols + c] = v;
        }
        tile[i][threadIdx.x] = v;
    }
    if (amax)
        amax_block(amax, m);
    if (part) {
        sums[threadIdx.y][threadIdx.x] = cs;
        __syncthreads();
        const int c = c0 + threadIdx.x;
        if (threadIdx.y == 0 && c < cols) {
            float t = 0.0f;
            for (int y = 0; y < TILE_ROWS; y++)
                t += sums[y][threadIdx.x];
            part[(size_t)blockIdx.y * cols + c] = t;
        }
    }
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
 * (and pre) 16-byte aligned, ld and cols multiples of 8, so a chunk is wholly
 * in or out; for qt, rows a multiple of 16, so a transposed chunk is too.
 * part as quantize_k's: a thread sums its chunk's 8 columns over its two
 * rows, the warp's four threads of a chunk add theirs (xor 8, 16), and the
 * block adds its 8 warps' sums in warp order. */
#define CT 64
#define CT_PITCH 68 /* bytes per shared row: 17 words, few bank conflicts */
template <int KIND, int ACT>
__global__ void __launch_bounds__(256)
    quantize_chunks_k(uint8_t *q, uint8_t *qt, const bf16 *x, const bf16 *pre, int ldx, int rows,
                      int cols, scale_src src, unsigned *amax, float *part)
{
    __shared__ __align__(16) uint8_t tile[CT * CT_PITCH];
    __shared__ float sums[8][CT];
    const float s = scale_get(src);
    const int c0 = blockIdx.x * CT, r0 = blockIdx.y * CT, t = threadIdx.x;
    const int cc = (t & 7) * 8; /* this thread's chunk of a row */
    unsigned m = 0;
    float cs[8] = {};
#pragma unroll
    for (int p = 0; p < 2; p++) {
        const int i = (t >> 3) + 32 * p, r = r0 + i, c = c0 + cc;
        uint32_t lo = 0, hi = 0;
        if (r < rows && c < cols) {
            const size_t at = ((size_t)r * ldx + c) / 8;
            const uint4 u = act4<ACT>(__ldg(reinterpret_cast<const uint4 *>(x) + at),
                                      reinterpret_cast<const uint4 *>(pre), at);
            const uint32_t w[4] = { u.x, u.y, u.z, u.w };
#pragma unroll
            for (int k = 0; k < 4; k++) {
                m = __vmaxu2(m, w[k] & 0x7fff7fffu);
                const float g0 = __uint_as_float(w[k] << 16),
                            g1 = __uint_as_float(w[k] & 0xffff0000u);
                cs[2 * k] += g0, cs[2 * k + 1] += g1;
                const uint32_t a = to_fp8<KIND>(__fmul_rn(nan_if_inf(src, g0), s)),
                               b = to_fp8<KIND>(__fmul_rn(nan_if_inf(src, g1), s));
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
        amax_block(amax, max(m & 0xffffu, m >> 16) << 16); /* its __syncthreads serves qt */
    if (part) {
#pragma unroll
        for (int e = 0; e < 8; e++) {
            cs[e] += __shfl_xor_sync(0xffffffffu, cs[e], 8);
            cs[e] += __shfl_xor_sync(0xffffffffu, cs[e], 16);
        }
        if ((t & 31) < 8)
#pragma unroll
            for (int e = 0; e < 8; e++)
                sums[t >> 5][cc + e] = cs[e];
        __syncthreads();
        if (t < CT && c0 + t < cols) {
            float v = 0.0f;
#pragma unroll
            for (int y = 0; y < 8; y++)
                v += sums[y][t];
            part[(size_t)blockIdx.y * cols + c0 + t] = v;
        }
    }
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

/* *amax = max |x| (of act's values; cleared first); rec, if not NULL, gets
 * it max'ed in. */
template <int ACT>
static void amax_launch(cudaStream_t st, float *amax, float *rec, const void *x, const void *pre,
                        size_t n8, size_t rest)
{
    if (n8) {
        const unsigned b = blocks_for(n8, 256 * 4), grid = b < 1056 ? b : 1056;
        amax_chunks_k<ACT><<<grid, 256, 0, st>>>((unsigned *)amax, (unsigned *)rec,
                                                 (const uint4 *)x, (const uint4 *)pre, n8);
    }
    if (rest) {
        const unsigned b = blocks_for(rest, 256), grid = b < 1024 ? b : 1024;
        amax_k<ACT><<<grid, 256, 0, st>>>((unsigned *)amax, (unsigned *)rec,
                                          (const bf16 *)x + 8 * n8,
                                          pre ? (const bf16 *)pre + 8 * n8 : NULL, rest);
    }
}

static int amax_to(nn_cuda_t *h, float *amax, float *rec, const void *x, const void *pre, size_t n,
                   int act, bmt_error_t *err)
{
    if (amax == NULL || x == NULL || (act == ACT_DGELU && pre == NULL))
        return fail_text(err, "fp8 amax", "a pointer is NULL");
    cudaStream_t st = stream_of(h);
    if (cudaMemsetAsync(amax, 0, sizeof(float), st) != cudaSuccess)
        return launched(err, "fp8 amax (clear)");
    /* 16-byte chunks where x (and pre) are aligned; single elements for the rest */
    const size_t n8 = aligned16(x, pre) ? n / 8 : 0, rest = n - 8 * n8;
    if (act == ACT_GELU)
        amax_launch<ACT_GELU>(st, amax, rec, x, pre, n8, rest);
    else if (act == ACT_DGELU)
        amax_launch<ACT_DGELU>(st, amax, rec, x, pre, n8, rest);
    else
        amax_launch<ACT_NONE>(st, amax, rec, x, pre, n8, rest);
    return launched(err, "fp8 amax");
}

extern "C" int nn_cuda_fp8_amax(nn_cuda_t *h, float *amax, const void *x, size_t n,
                                bmt_error_t *err)
{
    return amax_to(h, amax, NULL, x, NULL, n, ACT_NONE, err);
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

/* Launches the conversion; returns its row blocks (the partial sums' count). */
template <int KIND, int ACT>
static int quantize_launch(cudaStream_t st, uint8_t *q, uint8_t *qt, const bf16 *x, const bf16 *pre,
                           int ld, int rows, int cols, const scale_src &src, unsigned *amax,
                           float *part)
{
    if (aligned16(x, pre) && ld % 8 == 0 && cols % 8 == 0) {
        const dim3 grid((cols + CT - 1) / CT, (rows + CT - 1) / CT);
        quantize_chunks_k<KIND, ACT>
            <<<grid, 256, 0, st>>>(q, qt, x, pre, ld, rows, cols, src, amax, part);
        return (int)grid.y;
    }
    const dim3 grid((cols + TILE - 1) / TILE, (rows + TILE - 1) / TILE), block(TILE, TILE_ROWS);
    quantize_k<KIND, ACT><<<grid, block, 0, st>>>(q, qt, x, pre, ld, rows, cols, src, amax, part);
    return (int)grid.y;
}

/* The partial sums' floats a conversion of rows x cols may write (the
 * single-element kernel's row blocks are the smaller). */
static size_t part_floats(int rows, int cols) { return (size_t)((rows + TILE - 1) / TILE) * cols; }

/* clear_amax: *amax = this x's max; else max'ed into *amax (a record).
 * pre: GELU's input for src.act ACT_DGELU (same layout as x), else NULL.
 * dbias, if not NULL: += (dbias_add) or = the column sums of the converted
 * values (before the scale), through part (part_floats(rows, cols) device
 * f32): a fixed order, the same bits on every run. q and qt may then both be
 * NULL. */
static int quantize(nn_cuda_t *h, uint8_t *q, uint8_t *qt, const void *x, const void *pre, int ld,
                    int rows, int cols, const scale_src &src, nn_fp8_kind_t kind, float *amax,
                    bool clear_amax, float *dbias, float *part, bool dbias_add, bmt_error_t *err)
{
    char why[160];
    if (x == NULL || (q == NULL && qt == NULL && dbias == NULL) ||
        (src.act == ACT_DGELU && pre == NULL) || (dbias && part == NULL))
        return fail_text(err, "fp8 quantize",
                         "x, GELU's input, the partial sums, or every output is NULL");
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
    if (amax && clear_amax && cudaMemsetAsync(amax, 0, sizeof(float), st) != cudaSuccess)
        return launched(err, "fp8 quantize (clear amax)");
    const bf16 *xb = (const bf16 *)x, *pb = (const bf16 *)pre;
    unsigned *am = (unsigned *)amax;
    float *pt = dbias ? part : NULL;
    int chunks;
#define QL(K, A) quantize_launch<K, A>(st, q, qt, xb, pb, ld, rows, cols, src, am, pt)
    if (kind == NN_FP8_E4M3)
        chunks = src.act == ACT_GELU    ? QL(NN_FP8_E4M3, ACT_GELU)
                 : src.act == ACT_DGELU ? QL(NN_FP8_E4M3, ACT_DGELU)
                                        : QL(NN_FP8_E4M3, ACT_NONE);
    else
        chunks = src.act == ACT_GELU    ? QL(NN_FP8_E5M2, ACT_GELU)
                 : src.act == ACT_DGELU ? QL(NN_FP8_E5M2, ACT_DGELU)
                                        : QL(NN_FP8_E5M2, ACT_NONE);
#undef QL
    if (dbias)
        colsum_final<<<(unsigned)(cols + 31) / 32, dim3(32, 8), 0, st>>>(dbias, NULL, part, cols,
                                                                         chunks, dbias_add);
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
    return quantize(h, q, qt, x, NULL, ld, rows, cols, src, kind, amax, true, NULL, NULL, false,
                    err);
}

/* The codes of act's values of x (x itself, GELU(x), or GELU'(pre) x) under
 * sc's scaling, operand j's scales at s = &sc->s[4 j] and record at
 * sc->rec[j]: current, amax (into s[2] and the record), then the conversion
 * making s[1] and s[0] from s[2]; delayed, the conversion at s[1],
 * infinities to NaN, its amax max'ed into the record. dbias and part as
 * quantize's. */
static int convert(nn_cuda_t *h, uint8_t *q, uint8_t *qt, const void *x, const void *pre, int rows,
                   int cols, nn_fp8_kind_t kind, const nn_cuda_fp8_scales_t *sc, int j, int act,
                   float *dbias, float *part, bool dbias_add, bmt_error_t *err)
{
    float *s = &sc->s[4 * j], *rec = sc->rec ? &sc->rec[j] : NULL;
    scale_src src = {};
    src.act = act;
    if (sc->delayed) {
        src.scale = &s[1], src.inf_nan = true;
        return quantize(h, q, qt, x, pre, cols, rows, cols, src, kind, rec, false, dbias, part,
                        dbias_add, err);
    }
    if (amax_to(h, &s[2], rec, x, pre, (size_t)rows * cols, act, err) < 0)
        return -1;
    /* the conversion makes s[1] and s[0] from s[2] (scale_get) */
    src.amax = &s[2], src.scale_out = &s[1], src.descale_out = &s[0], src.bad = sc->bad;
    src.fmax = nn_fp8_max(kind);
    return quantize(h, q, qt, x, pre, cols, rows, cols, src, kind, NULL, false, dbias, part,
                    dbias_add, err);
}

extern "C" int nn_cuda_fp8_codes(nn_cuda_t *h, uint8_t *q, uint8_t *qt, const void *x, int gelu,
                                 int rows, int cols, nn_fp8_kind_t kind,
                                 const nn_cuda_fp8_scales_t *sc, int j, bmt_error_t *err)
{
    if (sc == NULL || sc->s == NULL || (uintptr_t)sc->s % 16 || sc->bad == NULL || j < 0 || j > 2)
        return fail_text(err, "fp8 codes",
                         "the scales are NULL or not 16-byte aligned, bad is NULL, or the "
                         "operand is not 0..2");
    if (rows < 1 || cols < 1)
        return fail_text(err, "fp8 codes", "rows and cols must be >= 1");
    if (kind != NN_FP8_E4M3 && kind != NN_FP8_E5M2)
        return fail_text(err, "fp8 codes", "not an FP8 kind");
    if (q == NULL && qt == NULL)
        return fail_text(err, "fp8 codes", "both outputs are NULL");
    return convert(h, q, qt, x, NULL, rows, cols, kind, sc, j, gelu ? ACT_GELU : ACT_NONE, NULL,
                   NULL, false, err);
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
    const nn_cuda_fp8_scales_t sc = { s, NULL, 0, bad };
    if (q == NULL && qt == NULL)
        return fail_text(err, "fp8 cast", "both outputs are NULL");
    return convert(h, q, qt, x, NULL, rows, cols, kind, &sc, 0, ACT_NONE, NULL, NULL, false, err);
}

/* Scratch: [a: N max(IC,OC)] [b: N OC] [c: IC OC] [d: the bias sums' partial
 * sums, part_floats(N, OC) f32], each rounded up to 256 bytes. The forward
 * puts the input's row-major codes in a and the weight's transposed codes in
 * c; the backward puts dout's codes in a (row-major) and b (transposed), the
 * weight's row-major codes in c, and dbias's partial sums in d. */
static size_t up256(size_t n) { return (n + 255) / 256 * 256; }

extern "C" size_t nn_cuda_fp8_conv1d_scratch_bytes(int N, int IC, int OC)
{
    const size_t n = (size_t)N, ic = (size_t)IC, oc = (size_t)OC;
    return up256(n * (ic > oc ? ic : oc)) + up256(n * oc) + up256(ic * oc) +
           up256(part_floats(N, OC) * sizeof(float));
}

static int conv1d_args(int N, int IC, int OC, const nn_cuda_fp8_scales_t *sc, const void *scratch,
                       const char *what, bmt_error_t *err)
{
    char why[200];
    if (N < 16 || IC < 16 || OC < 16 || N % 16 || IC % 16 || OC % 16) {
        snprintf(why, sizeof(why),
                 "N %d, IC %d, OC %d: each must be a multiple of 16 (the FP8 products' reduced "
                 "dimension and the transposed codes' rows)",
                 N, IC, OC);
        return fail_text(err, what, why);
    }
    if (sc == NULL || sc->s == NULL || sc->bad == NULL || scratch == NULL ||
        (uintptr_t)sc->s % 16 || (uintptr_t)scratch % 256)
        return fail_text(err, what,
                         "the scales, bad or the scratch are NULL, or the scales and the scratch "
                         "not 16- and 256-byte aligned");
    return 0;
}

/* The forward of either weight layout: linear 0, HF's Conv1D weight (IC,OC),
 * its transposed codes for the product and row-major ones kept (wkept);
 * linear 1, nn.Linear's (OC,IC), its row-major codes for the product and the
 * transposed ones kept. The same codes either way, laid out for the product
 * out (N,OC) = x (N,IC) x (W as (OC,IC))^T, both with IC contiguous. */
static int forward(nn_cuda_t *h, void *out, const void *res, uint8_t *xqt, uint8_t *wkept,
                   const void *inp, int gelu, const void *weight, const void *bias, int N, int IC,
                   int OC, int fast_accum, const nn_cuda_fp8_scales_t *sc, void *scratch,
                   int linear, const char *what, bmt_error_t *err)
{
    if (conv1d_args(N, IC, OC, sc, scratch, what, err) < 0)
        return -1;
    uint8_t *xq = (uint8_t *)scratch;
    uint8_t *wp = xq + up256((size_t)N * (IC > OC ? IC : OC)) + up256((size_t)N * OC);
    float *s = sc->s;
    if (convert(h, xq, xqt, inp, NULL, N, IC, NN_FP8_E4M3, sc, 0, gelu ? ACT_GELU : ACT_NONE, NULL,
                NULL, false, err) < 0 ||
        (linear ? convert(h, wp, wkept, weight, NULL, OC, IC, NN_FP8_E4M3, sc, 1, ACT_NONE, NULL,
                          NULL, false, err)
                : convert(h, wkept, wp, weight, NULL, IC, OC, NN_FP8_E4M3, sc, 1, ACT_NONE, NULL,
                          NULL, false, err)) < 0)
        return -1;
    if (res)
        return nn_cuda_fp8_matmul_residual(h, out, res, xq, NN_FP8_E4M3, &s[0], wp, NN_FP8_E4M3,
                                           &s[4], bias, fast_accum, N, IC, OC, err);
    return nn_cuda_fp8_matmul(h, out, 0, OC, xq, NN_FP8_E4M3, &s[0], wp, NN_FP8_E4M3, &s[4], bias,
                              0.0f, fast_accum, N, IC, OC, err);
}

extern "C" int nn_cuda_fp8_conv1d_forward(nn_cuda_t *h, void *out, uint8_t *xqt, uint8_t *wq,
                                          const void *inp, int gelu, const void *weight,
                                          const void *bias, int N, int IC, int OC, int fast_accum,
                                          const nn_cuda_fp8_scales_t *sc, void *scratch,
                                          bmt_error_t *err)
{
    return forward(h, out, NULL, xqt, wq, inp, gelu, weight, bias, N, IC, OC, fast_accum, sc,
                   scratch, 0, "fp8 conv1d forward", err);
}

extern "C" int nn_cuda_fp8_conv1d_residual_forward(nn_cuda_t *h, void *out, const void *res,
                                                   uint8_t *xqt, uint8_t *wq, const void *inp,
                                                   int gelu, const void *weight, const void *bias,
                                                   int N, int IC, int OC, int fast_accum,
                                                   const nn_cuda_fp8_scales_t *sc, void *scratch,
                                                   bmt_error_t *err)
{
    if (fp8_res_refused(out, res, "fp8 conv1d residual forward", err) < 0)
        return -1; /* before the conversions touch the records */
    return forward(h, out, res, xqt, wq, inp, gelu, weight, bias, N, IC, OC, fast_accum, sc,
                   scratch, 0, "fp8 conv1d residual forward", err);
}

extern "C" int nn_cuda_fp8_linear_forward(nn_cuda_t *h, void *out, uint8_t *xqt, uint8_t *wqt,
                                          const void *inp, const void *weight, const void *bias,
                                          int N, int IC, int OC, int fast_accum,
                                          const nn_cuda_fp8_scales_t *sc, void *scratch,
                                          bmt_error_t *err)
{
    return forward(h, out, NULL, xqt, wqt, inp, 0, weight, bias, N, IC, OC, fast_accum, sc, scratch,
                   1, "fp8 linear forward", err);
}

extern "C" int nn_cuda_fp8_linear_residual_forward(nn_cuda_t *h, void *out, const void *res,
                                                   uint8_t *xqt, uint8_t *wqt, const void *inp,
                                                   const void *weight, const void *bias, int N,
                                                   int IC, int OC, int fast_accum,
                                                   const nn_cuda_fp8_scales_t *sc, void *scratch,
                                                   bmt_error_t *err)
{
    if (fp8_res_refused(out, res, "fp8 linear residual forward", err) < 0)
        return -1; /* before the conversions touch the records */
    return forward(h, out, res, xqt, wqt, inp, 0, weight, bias, N, IC, OC, fast_accum, sc, scratch,
                   1, "fp8 linear residual forward", err);
}

/* The backward of either layout (forward's linear). */
static int backward(nn_cuda_t *h, void *dinp, float *dweight, float *dbias, const void *dout,
                    const void *dgelu_pre, const uint8_t *xqt, const uint8_t *wkept,
                    const void *weight, int N, int IC, int OC, const nn_cuda_fp8_scales_t *sc,
                    void *scratch, int add, int linear, const char *what, bmt_error_t *err)
{
    if (conv1d_args(N, IC, OC, sc, scratch, what, err) < 0)
        return -1;
    if (dweight && xqt == NULL)
        return fail_text(err, what, "dweight wants the forward's xqt");
    if (dout == NULL || (dinp && weight == NULL && wkept == NULL))
        return fail_text(err, what,
                         "dout is NULL, or dinp is wanted without the weight or its kept codes");
    uint8_t *gq = (uint8_t *)scratch;
    uint8_t *gqt = gq + up256((size_t)N * (IC > OC ? IC : OC));
    uint8_t *wq = gqt + up256((size_t)N * OC);
    float *part = (float *)(wq + up256((size_t)IC * OC));
    float *s = sc->s;
    /* one pass over dout (and GELU's input): the row-major codes for dinp, the
     * transposed ones for dweight, dbias's column sums */
    if ((dinp || dweight || dbias) &&
        convert(h, dinp ? gq : NULL, dweight ? gqt : NULL, dout, dgelu_pre, N, OC, NN_FP8_E5M2, sc,
                2, dgelu_pre ? ACT_DGELU : ACT_NONE, dbias, part, add != 0, err) < 0)
        return -1;
    /* Conv1D: dW (IC,OC) += (add) or = x^T (IC,N) x (dout^T (OC,N))^T; Linear:
     * dW (OC,IC) = dout^T (OC,N) x (x^T (IC,N))^T. Both operands with N
     * contiguous. */
    if (dweight &&
        (linear ? nn_cuda_fp8_matmul(h, dweight, 1, IC, gqt, NN_FP8_E5M2, &s[8], xqt, NN_FP8_E4M3,
                                     &s[0], NULL, add ? 1.0f : 0.0f, 0, OC, N, IC, err)
                : nn_cuda_fp8_matmul(h, dweight, 1, OC, xqt, NN_FP8_E4M3, &s[0], gqt, NN_FP8_E5M2,
                                     &s[8], NULL, add ? 1.0f : 0.0f, 0, IC, N, OC, err)) < 0)
        return -1;
    /* dinp (N,IC) = dout (N,OC) x (W as (IC,OC))^T: both with OC contiguous;
     * the weight's codes the forward kept, or made again at the forward's
     * scale (the same bits; an infinity NaN, as the forward's conversion made
     * it under either scaling): Conv1D's row-major, Linear's transposed */
    scale_src ws = {};
    ws.scale = &s[5], ws.inf_nan = true;
    if (dinp == NULL)
        return 0;
    if (wkept == NULL && (linear ? quantize(h, NULL, wq, weight, NULL, IC, OC, IC, ws, NN_FP8_E4M3,
                                            NULL, false, NULL, NULL, false, err)
                                 : quantize(h, wq, NULL, weight, NULL, OC, IC, OC, ws, NN_FP8_E4M3,
                                            NULL, false, NULL, NULL, false, err)) < 0)
        return -1;
    return nn_cuda_fp8_matmul(h, dinp, 0, IC, gq, NN_FP8_E5M2, &s[8], wkept ? wkept : wq,
                              NN_FP8_E4M3, &s[4], NULL, 0.0f, 0, N, OC, IC, err);
}

extern "C" int nn_cuda_fp8_conv1d_backward(nn_cuda_t *h, void *dinp, float *dweight, float *dbias,
                                           const void *dout, const void *dgelu_pre,
                                           const uint8_t *xqt, const uint8_t *wq_kept,
                                           const void *weight, int N, int IC, int OC,
                                           const nn_cuda_fp8_scales_t *sc, void *scratch, int add,
                                           bmt_error_t *err)
{
    return backward(h, dinp, dweight, dbias, dout, dgelu_pre, xqt, wq_kept, weight, N, IC, OC, sc,
                    scratch, add, 0, "fp8 conv1d backward", err);
}

extern "C" int nn_cuda_fp8_linear_backward(nn_cuda_t *h, void *dinp, float *dweight, float *dbias,
                                           const void *dout, const uint8_t *xqt,
                                           const uint8_t *wqt_kept, const void *weight, int N,
                                           int IC, int OC, const nn_cuda_fp8_scales_t *sc,
                                           void *scratch, int add, bmt_error_t *err)
{
    return backward(h, dinp, dweight, dbias, dout, NULL, xqt, wqt_kept, weight, N, IC, OC, sc,
                    scratch, add, 1, "fp8 linear backward", err);
}

/* One thread per operand t of n layers (nn_cuda_fp8_advance). */
static __global__ void advance_k(float *s, unsigned *rec, float *hist, int n3, int len, int slot,
                                 int count, int was_delayed, int *bad, unsigned long long *stats)
{
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n3)
        return;
    const int j = t % 3;
    const float fmax = j == 2 ? 57344.0f : 448.0f;                  /* nn_fp8_max: E5M2, E4M3 */
    const float fsat = j == 2 ? 61440.0f : 464.0f;                  /* nn_fp8_saturation */
    float *st = s + (size_t)(t / 3) * NN_FP8_CONV1D_SCALES + 4 * j; /* descale, scale */
    const float r = __uint_as_float(rec[t]);
    if (!isfinite(r))
        atomicAdd(&stats[1], 1ull);
    else if (was_delayed && __fmul_rn(r, st[1]) > fsat)
        atomicAdd(&stats[0], 1ull);
    rec[t] = 0u;
    if (len == 0)
        return;
    hist[(size_t)slot * n3 + t] = r;
    float m = -1.0f;
    for (int i = 0; i < count; i++) {
        const float v = hist[(size_t)i * n3 + t];
        if (isfinite(v) && v > m)
            m = v;
    }
    const float sc = m < 0.0f ? 0.0f : scale_of(m, fmax, 0);
    if (sc == 0.0f)
        atomicAdd(&stats[1], 1ull);
    store_scale(&st[1], &st[0], bad, sc);
}

extern "C" int nn_cuda_fp8_advance(nn_cuda_t *h, float *s, float *rec, float *hist, int n, int len,
                                   int slot, int count, int was_delayed, int *bad,
                                   unsigned long long *stats, bmt_error_t *err)
{
    if (s == NULL || rec == NULL || bad == NULL || stats == NULL || (len > 0 && hist == NULL) ||
        (uintptr_t)s % 16 || n < 1 || len < 0 || len > NN_FP8_HISTORY_MAX ||
        (len > 0 && (slot < 0 || slot >= len || count < 1 || count > len)))
        return fail_text(err, "fp8 advance",
                         "want s (16-byte aligned), rec, bad, stats and (len > 0) hist, n >= 1, "
                         "len 0..NN_FP8_HISTORY_MAX, slot in 0..len-1, count in 1..len");
    const int n3 = 3 * n;
    advance_k<<<blocks_for((size_t)n3, 128), 128, 0, stream_of(h)>>>(
        s, (unsigned *)rec, hist, n3, len, slot, count, was_delayed, bad, stats);
    return launched(err, "fp8 advance");
}

/* The model's bookkeeping around nn_cuda_fp8_advance (nn_cuda_fp8_plan_t). */
extern "C" size_t nn_cuda_fp8_plan_bytes(int n, int history)
{
    const size_t ns = (size_t)n * NN_FP8_CONV1D_SCALES, nr = (size_t)n * 3;
    return (ns + nr + 4 + 4 + (size_t)history * nr) * sizeof(float);
}

extern "C" int nn_cuda_fp8_plan_init(nn_cuda_t *h, nn_cuda_fp8_plan_t *p, void *buf, int n,
                                     int history, bmt_error_t *err)
{
    if (p == NULL || buf == NULL || (uintptr_t)buf % 16 || n < 1 || history < 0 ||
        history > NN_FP8_HISTORY_MAX)
        return fail_text(err, "fp8 plan",
                         "want a plan, a 16-byte aligned buffer, n >= 1 and a history of 0.."
                         "NN_FP8_HISTORY_MAX");
    /* the scales (16-byte aligned blocks of 12), the records, the statistics
     * (two u64) and bad (16 bytes), then the history */
    const size_t ns = (size_t)n * NN_FP8_CONV1D_SCALES, nr = (size_t)n * 3;
    *p = nn_cuda_fp8_plan_t{};
    p->s = (float *)buf;
    p->rec = p->s + ns;
    p->stats = (unsigned long long *)(p->rec + nr);
    p->bad = (int *)(p->rec + nr + 4);
    p->hist = history ? p->rec + nr + 8 : NULL;
    p->n = n, p->history = history;
    if (cudaMemsetAsync(buf, 0, nn_cuda_fp8_plan_bytes(n, history), stream_of(h)) != cudaSuccess)
        return launched(err, "fp8 plan (zeroing)");
    return 0;
}

extern "C" nn_cuda_fp8_scales_t nn_cuda_fp8_plan_at(const nn_cuda_fp8_plan_t *p, int i)
{
    return nn_cuda_fp8_scales_t{ p->s + (size_t)i * NN_FP8_CONV1D_SCALES, p->rec + (size_t)i * 3,
                                 p->delayed, p->bad };
}

extern "C" int nn_cuda_fp8_plan_begin(nn_cuda_t *h, nn_cuda_fp8_plan_t *p, bmt_error_t *err)
{
    if (!p->ended)
        return 0;
    const int H = p->history;
    const int count = H && p->count < H ? p->count + 1 : p->count;
    if (nn_cuda_fp8_advance(h, p->s, p->rec, p->hist, p->n, H, p->slot, count, p->delayed, p->bad,
                            p->stats, err) < 0)
        return -1;
    if (H)
        p->slot = (p->slot + 1) % H, p->count = count;
    p->delayed = H > 0;
    p->ended = 0;
    p->passes++;
    return 0;
}

extern "C" void nn_cuda_fp8_plan_end(nn_cuda_fp8_plan_t *p) { p->ended = 1; }
