/* runtime/cuda/kernels.cu — the cuda half of runtime/kernels.h.
 *
 * Each launcher enqueues one kernel (sumsq: two) with a grid-stride loop on the
 * caller's stream. Where every pointer is aligned for it, element-wise kernels
 * move four elements per load (16 bytes of f32, 8 of bf16), and the first
 * threads of the grid take the n % 4 elements of the tail; otherwise they go
 * one element at a time.
 *
 * The cpu loops of runtime/kernels.c are the reference (tests/gpu): init runs
 * the same philox.h code; AdamW the same element function, whose f32 operations
 * are rounded one by one (kernels_cuda.h), so the two agree bit for bit; bf16
 * rounding below copies bmt_f32_to_bf16 (runtime/dtype.c), NaN payloads included,
 * instead of __float2bfloat16_rn, which canonicalizes NaNs.
 *
 * Sums of squares are deterministic: the grid depends on n only (never on the
 * device or the pointer's alignment, hence no vector loads there), each block
 * reduces in a fixed tree, and a single block adds the per-block partials in a
 * fixed order. The partials (at most 1024 doubles) live in a scratch buffer
 * taken with cudaMallocAsync and given back with cudaFreeAsync on the same
 * stream: stream-ordered, served from the device's default memory pool after
 * the first call, and no state kept here between calls.
 */
#include <stdint.h>

#include "cuda/kernels_cuda.h"
#include "philox.h"

namespace
{

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 8192;
constexpr int kSumThreads = 256;
constexpr size_t kSumMaxBlocks = 1024;

struct bf16_t {
    uint16_t bits;
};

template <typename T> struct alignas(4 * sizeof(T)) pack4 {
    T v[4];
};

unsigned grid_for(size_t work)
{
    size_t b = (work + kThreads - 1) / kThreads;
    if (b == 0)
        b = 1;
    return (unsigned)(b < kMaxBlocks ? b : kMaxBlocks);
}

template <typename T> bool aligned4(const void *p) { return ((uintptr_t)p % (4 * sizeof(T))) == 0; }

__device__ __forceinline__ size_t thread_id()
{
    return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ size_t thread_count() { return (size_t)gridDim.x * blockDim.x; }

/* bmt_f32_to_bf16, bit for bit. */
__device__ __forceinline__ bf16_t f32_to_bf16(float x)
{
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return bf16_t{ (uint16_t)((u >> 16) | 0x0040u) };
    u += 0x7fffu + ((u >> 16) & 1u);
    return bf16_t{ (uint16_t)(u >> 16) };
}

__device__ __forceinline__ float bf16_to_f32(bf16_t h)
{
    return __uint_as_float((uint32_t)h.bits << 16);
}

/* Conversions between the three element types, exact or rounded to nearest even
 * (bf16 from f64 through f32, as on the host). */
template <typename D> struct cvt;
template <> struct cvt<float> {
    __device__ static float from(float x) { return x; }
    __device__ static float from(double x) { return __double2float_rn(x); }
    __device__ static float from(bf16_t x) { return bf16_to_f32(x); }
};
template <> struct cvt<double> {
    __device__ static double from(float x) { return (double)x; }
    __device__ static double from(double x) { return x; }
    __device__ static double from(bf16_t x) { return (double)bf16_to_f32(x); }
};
template <> struct cvt<bf16_t> {
    __device__ static bf16_t from(float x) { return f32_to_bf16(x); }
    __device__ static bf16_t from(double x) { return f32_to_bf16(__double2float_rn(x)); }
    __device__ static bf16_t from(bf16_t x) { return x; }
};

/* ------------------------------------------------------------ init */

template <typename T>
__global__ void init_kernel(T *dst, size_t n, uint64_t first, uint32_t key0, uint32_t key1,
                            int kind, double a, double b, double scale)
{
    const uint32_t key[2] = { key0, key1 };
    for (size_t i = thread_id(); i < n; i += thread_count())
        dst[i] = cvt<T>::from(philox_init_value(key, first + i, kind, a, b, scale));
}

/* ------------------------------------------------------------ cast, accumulate */

template <typename D, typename S>
__global__ void cast_kernel(D *dst, const S *src, size_t n, bool vec)
{
    size_t start = 0;
    if (vec) {
        size_t n4 = n / 4;
        pack4<D> *d4 = reinterpret_cast<pack4<D> *>(dst);
        const pack4<S> *s4 = reinterpret_cast<const pack4<S> *>(src);
        for (size_t i = thread_id(); i < n4; i += thread_count()) {
            pack4<S> s = s4[i];
            pack4<D> d;
#pragma unroll
            for (int j = 0; j < 4; j++)
                d.v[j] = cvt<D>::from(s.v[j]);
            d4[i] = d;
        }
        start = 4 * n4;
    }
    for (size_t i = start + thread_id(); i < n; i += thread_count())
        dst[i] = cvt<D>::from(src[i]);
}

template <typename D, typename S>
cudaError_t launch_cast(cudaStream_t st, void *dst, const void *src, size_t n)
{
    bool vec = aligned4<D>(dst) && aligned4<S>(src);
    cast_kernel<D, S><<<grid_for(vec ? n / 4 : n), kThreads, 0, st>>>(
        static_cast<D *>(dst), static_cast<const S *>(src), n, vec);
    return cudaGetLastError();
}

template <typename D>
cudaError_t launch_cast_to(cudaStream_t st, void *dst, const void *src, bmt_dtype_t src_dtype,
                           size_t n)
{
    switch (src_dtype) {
    case BMT_F32: return launch_cast<D, float>(st, dst, src, n);
    case BMT_BF16: return launch_cast<D, bf16_t>(st, dst, src, n);
    case BMT_F64: return launch_cast<D, double>(st, dst, src, n);
    default: return cudaErrorInvalidValue;
    }
}

template <typename S>
__global__ void accumulate_kernel(float *dst, const S *src, size_t n, bool vec)
{
    size_t start = 0;
    if (vec) {
        size_t n4 = n / 4;
        pack4<float> *d4 = reinterpret_cast<pack4<float> *>(dst);
        const pack4<S> *s4 = reinterpret_cast<const pack4<S> *>(src);
        for (size_t i = thread_id(); i < n4; i += thread_count()) {
            pack4<S> s = s4[i];
            pack4<float> d = d4[i];
#pragma unroll
            for (int j = 0; j < 4; j++)
                d.v[j] = __fadd_rn(d.v[j], cvt<float>::from(s.v[j]));
            d4[i] = d;
        }
        start = 4 * n4;
    }
    for (size_t i = start + thread_id(); i < n; i += thread_count())
        dst[i] = __fadd_rn(dst[i], cvt<float>::from(src[i]));
}

template <typename S>
cudaError_t launch_accumulate(cudaStream_t st, float *dst, const void *src, size_t n)
{
    bool vec = aligned4<float>(dst) && aligned4<S>(src);
    accumulate_kernel<S>
        <<<grid_for(vec ? n / 4 : n), kThreads, 0, st>>>(dst, static_cast<const S *>(src), n, vec);
    return cudaGetLastError();
}

/* ------------------------------------------------------------ sumsq */

/* Sum of the block's values in a fixed tree; the result in thread 0. */
__device__ double block_sum(double s)
{
    __shared__ double sh[kSumThreads];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int w = kSumThreads / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w)
            sh[threadIdx.x] = __dadd_rn(sh[threadIdx.x], sh[threadIdx.x + w]);
        __syncthreads();
    }
    return sh[0];
}

__global__ void __launch_bounds__(kSumThreads)
    sumsq_partial_kernel(const float *x, size_t n, double *partial)
{
    /* Thread t adds x[t], x[t + T], x[t + 2T], ... in that order (T threads in
     * the grid); eight loads are issued ahead of their additions to keep more
     * memory requests in flight, without changing the order. */
    const size_t T = thread_count();
    double s = 0.0;
    size_t i = thread_id();
    for (; i + 7 * T < n; i += 8 * T) {
        float v[8];
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = x[i + (size_t)k * T];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            double d = (double)v[k];
            s = __dadd_rn(s, __dmul_rn(d, d)); /* the square is exact */
        }
    }
    for (; i < n; i += T) {
        double d = (double)x[i];
        s = __dadd_rn(s, __dmul_rn(d, d));
    }
    double total = block_sum(s);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = total;
}

__global__ void __launch_bounds__(kSumThreads)
    sumsq_final_kernel(const double *partial, unsigned count, double *out)
{
    double s = 0.0;
    for (unsigned i = threadIdx.x; i < count; i += kSumThreads)
        s = __dadd_rn(s, partial[i]);
    double total = block_sum(s);
    if (threadIdx.x == 0)
        *out = total;
}

/* ------------------------------------------------------------ adamw */

enum {
    ADAMW_IN_PLACE = 0,
    ADAMW_F32 = 1,
    ADAMW_BF16 = 2
};

template <int MODE> __device__ __forceinline__ void adamw_store(void *param, size_t i, float p)
{
    if (MODE == ADAMW_F32)
        static_cast<float *>(param)[i] = p;
    else if (MODE == ADAMW_BF16)
        static_cast<bf16_t *>(param)[i] = f32_to_bf16(p);
}

template <int MODE>
__global__ void adamw_kernel(float *master, float *m, float *v, const float *grad, void *param,
                             size_t n, kern_adamw_scalars_t s, bool vec)
{
    size_t start = 0;
    if (vec) {
        size_t n4 = n / 4;
        pack4<float> *p4 = reinterpret_cast<pack4<float> *>(master);
        pack4<float> *m4 = reinterpret_cast<pack4<float> *>(m);
        pack4<float> *v4 = reinterpret_cast<pack4<float> *>(v);
        const pack4<float> *g4 = reinterpret_cast<const pack4<float> *>(grad);
        for (size_t i = thread_id(); i < n4; i += thread_count()) {
            pack4<float> pp = p4[i], mm = m4[i], vv = v4[i], gg = g4[i];
#pragma unroll
            for (int j = 0; j < 4; j++)
                kern_adamw_elem(&pp.v[j], &mm.v[j], &vv.v[j], gg.v[j], &s);
            p4[i] = pp;
            m4[i] = mm;
            v4[i] = vv;
            if (MODE == ADAMW_F32) {
                reinterpret_cast<pack4<float> *>(param)[i] = pp;
            } else if (MODE == ADAMW_BF16) {
                pack4<bf16_t> h;
#pragma unroll
                for (int j = 0; j < 4; j++)
                    h.v[j] = f32_to_bf16(pp.v[j]);
                reinterpret_cast<pack4<bf16_t> *>(param)[i] = h;
            }
        }
        start = 4 * n4;
    }
    for (size_t i = start + thread_id(); i < n; i += thread_count()) {
        float p = master[i], mi = m[i], vi = v[i];
        kern_adamw_elem(&p, &mi, &vi, grad[i], &s);
        master[i] = p;
        m[i] = mi;
        v[i] = vi;
        adamw_store<MODE>(param, i, p);
    }
}

template <int MODE>
cudaError_t launch_adamw(cudaStream_t st, float *master, float *m, float *v, const float *grad,
                         void *param, size_t n, const kern_adamw_scalars_t *s, bool param_ok)
{
    bool vec = aligned4<float>(master) && aligned4<float>(m) && aligned4<float>(v) &&
               aligned4<float>(grad) && param_ok;
    adamw_kernel<MODE>
        <<<grid_for(vec ? n / 4 : n), kThreads, 0, st>>>(master, m, v, grad, param, n, *s, vec);
    return cudaGetLastError();
}

/* AdamW on a split master (kern_split_*): 4 elements a thread where every
 * pointer allows (hi and lo 8 bytes, the f32 arrays 16). */
__global__ void adamw_split_kernel(uint16_t *hi, uint16_t *lo, float *m, float *v,
                                   const float *grad, size_t n, kern_adamw_scalars_t s, bool vec)
{
    size_t start = 0;
    if (vec) {
        size_t n4 = n / 4;
        pack4<uint16_t> *h4 = reinterpret_cast<pack4<uint16_t> *>(hi);
        pack4<uint16_t> *l4 = reinterpret_cast<pack4<uint16_t> *>(lo);
        pack4<float> *m4 = reinterpret_cast<pack4<float> *>(m);
        pack4<float> *v4 = reinterpret_cast<pack4<float> *>(v);
        const pack4<float> *g4 = reinterpret_cast<const pack4<float> *>(grad);
        for (size_t i = thread_id(); i < n4; i += thread_count()) {
            pack4<uint16_t> hh = h4[i], ll = l4[i];
            pack4<float> mm = m4[i], vv = v4[i], gg = g4[i];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float p = kern_split_join(hh.v[j], ll.v[j]);
                kern_adamw_elem(&p, &mm.v[j], &vv.v[j], gg.v[j], &s);
                hh.v[j] = kern_split_hi(p);
                ll.v[j] = kern_split_lo(p, hh.v[j]);
            }
            h4[i] = hh;
            l4[i] = ll;
            m4[i] = mm;
            v4[i] = vv;
        }
        start = 4 * n4;
    }
    for (size_t i = start + thread_id(); i < n; i += thread_count()) {
        float p = kern_split_join(hi[i], lo[i]), mi = m[i], vi = v[i];
        kern_adamw_elem(&p, &mi, &vi, grad[i], &s);
        m[i] = mi;
        v[i] = vi;
        hi[i] = kern_split_hi(p);
        lo[i] = kern_split_lo(p, hi[i]);
    }
}

} // namespace

/* ------------------------------------------------------------ launchers */

extern "C" cudaError_t kern_cuda_init(void *stream, void *dst, bmt_dtype_t dtype, size_t n,
                                      uint64_t first, uint32_t key0, uint32_t key1, int kind,
                                      double a, double b, double scale)
{
    if (n == 0)
        return cudaSuccess;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    unsigned grid = grid_for(n);
    switch (dtype) {
    case BMT_F32:
        init_kernel<float><<<grid, kThreads, 0, st>>>(static_cast<float *>(dst), n, first, key0,
                                                      key1, kind, a, b, scale);
        break;
    case BMT_BF16:
        init_kernel<bf16_t><<<grid, kThreads, 0, st>>>(static_cast<bf16_t *>(dst), n, first, key0,
                                                       key1, kind, a, b, scale);
        break;
    case BMT_F64:
        init_kernel<double><<<grid, kThreads, 0, st>>>(static_cast<double *>(dst), n, first, key0,
                                                       key1, kind, a, b, scale);
        break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

extern "C" cudaError_t kern_cuda_fill(void *stream, void *dst, int value, size_t bytes)
{
    if (bytes == 0)
        return cudaSuccess;
    return cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream));
}

extern "C" cudaError_t kern_cuda_cast(void *stream, void *dst, bmt_dtype_t dst_dtype,
                                      const void *src, bmt_dtype_t src_dtype, size_t n)
{
    if (n == 0)
        return cudaSuccess;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (dst_dtype == src_dtype)
        return cudaMemcpyAsync(dst, src, n * bmt_dtype_size(src_dtype), cudaMemcpyDeviceToDevice,
                               st);
    switch (dst_dtype) {
    case BMT_F32: return launch_cast_to<float>(st, dst, src, src_dtype, n);
    case BMT_BF16: return launch_cast_to<bf16_t>(st, dst, src, src_dtype, n);
    case BMT_F64: return launch_cast_to<double>(st, dst, src, src_dtype, n);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t kern_cuda_accumulate(void *stream, float *dst, const void *src,
                                            bmt_dtype_t src_dtype, size_t n)
{
    if (n == 0)
        return cudaSuccess;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    switch (src_dtype) {
    case BMT_F32: return launch_accumulate<float>(st, dst, src, n);
    case BMT_BF16: return launch_accumulate<bf16_t>(st, dst, src, n);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t kern_cuda_sumsq(void *stream, const float *x, size_t n, double *out)
{
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    size_t blocks = (n + kSumThreads - 1) / kSumThreads;
    if (blocks == 0)
        blocks = 1;
    if (blocks > kSumMaxBlocks)
        blocks = kSumMaxBlocks;
    double *partial = NULL;
    cudaError_t e = cudaMallocAsync((void **)&partial, blocks * sizeof(double), st);
    if (e != cudaSuccess)
        return e;
    sumsq_partial_kernel<<<(unsigned)blocks, kSumThreads, 0, st>>>(x, n, partial);
    sumsq_final_kernel<<<1, kSumThreads, 0, st>>>(partial, (unsigned)blocks, out);
    e = cudaGetLastError();
    cudaError_t f = cudaFreeAsync(partial, st);
    return e != cudaSuccess ? e : f;
}

extern "C" cudaError_t kern_cuda_adamw(void *stream, float *master, float *m, float *v,
                                       const float *grad, void *param, bmt_dtype_t param_dtype,
                                       size_t n, const kern_adamw_scalars_t *s)
{
    if (n == 0)
        return cudaSuccess;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (param == static_cast<void *>(master))
        return launch_adamw<ADAMW_IN_PLACE>(st, master, m, v, grad, param, n, s, true);
    switch (param_dtype) {
    case BMT_F32:
        return launch_adamw<ADAMW_F32>(st, master, m, v, grad, param, n, s, aligned4<float>(param));
    case BMT_BF16:
        return launch_adamw<ADAMW_BF16>(st, master, m, v, grad, param, n, s,
                                        aligned4<bf16_t>(param));
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t kern_cuda_adamw_split(void *stream, uint16_t *hi, uint16_t *lo, float *m,
                                             float *v, const float *grad, size_t n,
                                             const kern_adamw_scalars_t *s)
{
    if (n == 0)
        return cudaSuccess;
    const bool vec = aligned4<uint16_t>(hi) && aligned4<uint16_t>(lo) && aligned4<float>(m) &&
                     aligned4<float>(v) && aligned4<float>(grad);
    adamw_split_kernel<<<grid_for(vec ? n / 4 : n), kThreads, 0,
                         static_cast<cudaStream_t>(stream)>>>(hi, lo, m, v, grad, n, *s, vec);
    return cudaGetLastError();
}
