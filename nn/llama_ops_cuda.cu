/* nn/llama_ops_cuda.cu — the Llama family's own layers on CUDA (see llama_ops_cuda.h).
 *
 * Layer: nn/, below every model. The functions run on an nn/ops_cuda.h
 * handle's stream (nn_cuda_stream) and borrow its workspace as scratch
 * (nn_cuda_workspace); nothing is allocated per call.
 *
 * Every kernel here is bound by memory, so each reads and writes each tensor
 * once, 16 bytes (8 bf16) per access where the rows allow it (a multiple of 8
 * elements, 16-byte aligned pointers), with a one-element kernel of the same
 * arithmetic otherwise. Arithmetic is f32; every sum runs in a fixed order (no
 * atomics), so the same inputs give the same bits on every run.
 *   - RMSNorm: a block of threads spans a row (each thread owning the same
 *     columns in every row), and takes R rows per step (R x CPL 16-byte loads
 *     in flight per thread) with one block-wide sum for all R. The forward
 *     strides over the rows. The backward is one fused pass: each block owns
 *     a chunk of consecutive rows, writes their dinp and adds their dweight
 *     terms per column, in row order, in registers; a second kernel adds the
 *     chunks' partial sums per column in chunk order into dweight. So dout,
 *     inp and dres are read once (a separate column pass would read dout and
 *     inp twice), and the partials (RMS_CHUNKS x C f32, 4 MiB at C 2048)
 *     add 3-6% to the traffic at N = 8192-16384 rows. On an H200 at N 8192
 *     it moves 2.9 TB/s at C 2048, 3.2 at C 4096 (the forward 2.8 and 3.2). Blocks that each own
 *     a column range over all N rows would need no scratch, but at C 2048
 *     there are 32 ranges of 64 columns (128-byte segments) for 132 SMs, and
 *     dinp would need each row's sum from another pass.
 *   - RoPE: a thread takes 8 dims i (16 bytes) of one token for up to
 *     ROPE_HPT of its query and key heads, so each cos and sin is taken once
 *     for those heads; it loads every head before it stores any (the stores
 *     could alias the later loads as far as the compiler knows).
 *   - SwiGLU: grid-stride over 16-byte units of the output.
 */
#include "nn/llama_ops_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include <type_traits>

#include "nn/cuda_util.cuh"

#define RMS_CHUNKS 512    /* row chunks of RMSNorm's backward: its blocks, and its partial sums */
#define RMS_FWD_GRID 1024 /* blocks of RMSNorm's forward (they stride over the rows) */
#define ROPE_HPT 8        /* heads per thread of the 16-byte RoPE kernel */

namespace
{

cudaStream_t stream_of(nn_cuda_t *h) { return (cudaStream_t)nn_cuda_stream(h); }

/* A unit of V bf16 read or written in one access: V = 8 (16 bytes) or 1, kept
 * packed in registers until used. */
template <int V> using raw_t = typename std::conditional<V == 8, uint4, bf16>::type;

template <int V> __device__ __forceinline__ raw_t<V> raw_zero()
{
    if constexpr (V == 8)
        return make_uint4(0, 0, 0, 0);
    else
        return __ushort_as_bfloat16(0);
}

template <int V> __device__ __forceinline__ void unpack(float (&f)[V], raw_t<V> r)
{
    if constexpr (V == 8)
        unpack8(f, r);
    else
        f[0] = __bfloat162float(r);
}

template <int V> __device__ __forceinline__ raw_t<V> pack(const float (&f)[V])
{
    if constexpr (V == 8)
        return pack8(f);
    else
        return __float2bfloat16(f[0]);
}

/* ------------------------------------------------------------ RMSNorm */

/* v[j] = the sum of v[j] over the block's threads, the same bits in every
 * thread: each warp by shuffles, then the warps in order. sh[R][32] is one of
 * two buffers the caller alternates between calls: a thread that writes one
 * again has passed the barrier of the call in between, which every thread
 * reaches only after reading it, so one barrier per call suffices. */
template <int R, int THREADS>
__device__ __forceinline__ void block_sum(float (&v)[R], float (*sh)[32])
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int j = 0; j < R; j++)
        v[j] = warp_sum(v[j]);
    if (lane == 0)
#pragma unroll
        for (int j = 0; j < R; j++)
            sh[j][warp] = v[j];
    __syncthreads();
#pragma unroll
    for (int j = 0; j < R; j++) {
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < THREADS / 32; w++)
            s += sh[j][w];
        v[j] = s;
    }
}

/* Thread x of the block owns units x, x + THREADS, ... (CPL of them at most)
 * of V bf16 in every row: C <= V THREADS CPL. R rows per step. */
template <int V, int CPL, int R, int THREADS>
__global__ void __launch_bounds__(THREADS)
    rmsnorm_fwd(bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int N, int C, float eps)
{
    __shared__ float sh[2][R][32];
    const int U = C / V;
    raw_t<V> rw[CPL];
#pragma unroll
    for (int i = 0; i < CPL; i++) {
        const int u = threadIdx.x + i * THREADS;
        rw[i] = u < U ? reinterpret_cast<const raw_t<V> *>(w)[u] : raw_zero<V>();
    }
    int parity = 0;
    for (int r0 = blockIdx.x * R; r0 < N; r0 += gridDim.x * R, parity ^= 1) {
        raw_t<V> rx[R][CPL];
        float ss[R];
#pragma unroll
        for (int j = 0; j < R; j++) {
            const raw_t<V> *x = reinterpret_cast<const raw_t<V> *>(inp + (size_t)(r0 + j) * C);
#pragma unroll
            for (int i = 0; i < CPL; i++) {
                const int u = threadIdx.x + i * THREADS;
                rx[j][i] = r0 + j < N && u < U ? x[u] : raw_zero<V>();
            }
        }
#pragma unroll
        for (int j = 0; j < R; j++) {
            ss[j] = 0.f;
#pragma unroll
            for (int i = 0; i < CPL; i++) {
                float f[V];
                unpack<V>(f, rx[j][i]);
#pragma unroll
                for (int e = 0; e < V; e++)
                    ss[j] += f[e] * f[e];
            }
        }
        block_sum<R, THREADS>(ss, sh[parity]);
#pragma unroll
        for (int j = 0; j < R; j++) {
            const int row = r0 + j;
            const float rs = 1.0f / sqrtf(ss[j] / (float)C + eps);
            raw_t<V> *o = reinterpret_cast<raw_t<V> *>(out + (size_t)row * C);
#pragma unroll
            for (int i = 0; i < CPL; i++) {
                const int u = threadIdx.x + i * THREADS;
                if (row < N && u < U) {
                    float f[V], wf[V];
                    unpack<V>(f, rx[j][i]);
                    unpack<V>(wf, rw[i]);
#pragma unroll
                    for (int e = 0; e < V; e++)
                        f[e] = f[e] * rs * wf[e];
                    o[u] = pack<V>(f);
                }
            }
            if (row < N && threadIdx.x == 0)
                rstd[row] = rs;
        }
    }
}

/* Block b owns rows [b per, (b + 1) per) (per a multiple of R): their dinp,
 * and partial[b][c] = the sum of their dweight terms, in row order. With
 * dnorm = weight dout and norm = inp rstd, dinp = dres + rstd (dnorm - norm
 * mean(dnorm norm)); mean(dnorm norm) = rstd sum(dnorm inp) / C. Every
 * element is read and written by the thread that owns its column, so dinp may
 * be dres. */
template <int V, int CPL, int R, int THREADS>
__global__ void __launch_bounds__(THREADS)
    rmsnorm_bwd(bf16 *dinp, const bf16 *dres, float *partial, const bf16 *dout, const bf16 *inp,
                const bf16 *w, const float *rstd, int N, int C, int per)
{
    __shared__ float sh[2][R][32];
    const int U = C / V;
    const int r0 = blockIdx.x * per, r1 = min(N, r0 + per);
    raw_t<V> rw[CPL];
    float dw[CPL][V];
#pragma unroll
    for (int i = 0; i < CPL; i++) {
        const int u = threadIdx.x + i * THREADS;
        rw[i] = u < U ? reinterpret_cast<const raw_t<V> *>(w)[u] : raw_zero<V>();
#pragma unroll
        for (int e = 0; e < V; e++)
            dw[i][e] = 0.f;
    }
    int parity = 0;
    for (int r = r0; r < r1; r += R, parity ^= 1) {
        raw_t<V> rd[R][CPL], rx[R][CPL], rr[R][CPL];
        float a[R], rs[R];
#pragma unroll
        for (int j = 0; j < R; j++) {
            const bool ok = r + j < r1;
            const size_t base = (size_t)(r + j) * C;
            const raw_t<V> *d = reinterpret_cast<const raw_t<V> *>(dout + base);
            const raw_t<V> *x = reinterpret_cast<const raw_t<V> *>(inp + base);
            const raw_t<V> *res = reinterpret_cast<const raw_t<V> *>(dres + base);
            rs[j] = ok ? rstd[r + j] : 0.f;
#pragma unroll
            for (int i = 0; i < CPL; i++) {
                const int u = threadIdx.x + i * THREADS;
                const bool in = ok && u < U;
                rd[j][i] = in ? d[u] : raw_zero<V>();
                rx[j][i] = in ? x[u] : raw_zero<V>();
                rr[j][i] = in && dres ? res[u] : raw_zero<V>();
            }
        }
#pragma unroll
        for (int j = 0; j < R; j++) {
            a[j] = 0.f;
#pragma unroll
            for (int i = 0; i < CPL; i++) {
                float d[V], x[V], wf[V];
                unpack<V>(d, rd[j][i]);
                unpack<V>(x, rx[j][i]);
                unpack<V>(wf, rw[i]);
#pragma unroll
                for (int e = 0; e < V; e++)
                    a[j] += wf[e] * d[e] * x[e];
            }
        }
        block_sum<R, THREADS>(a, sh[parity]);
#pragma unroll
        for (int j = 0; j < R; j++) {
            const float m = a[j] * rs[j] / (float)C; /* mean(dnorm norm) */
            raw_t<V> *o = reinterpret_cast<raw_t<V> *>(dinp + (size_t)(r + j) * C);
#pragma unroll
            for (int i = 0; i < CPL; i++) {
                const int u = threadIdx.x + i * THREADS;
                if (r + j < r1 && u < U) {
                    float d[V], x[V], wf[V], g[V];
                    unpack<V>(d, rd[j][i]);
                    unpack<V>(x, rx[j][i]);
                    unpack<V>(wf, rw[i]);
                    unpack<V>(g, rr[j][i]);
#pragma unroll
                    for (int e = 0; e < V; e++) {
                        const float norm = x[e] * rs[j];
                        g[e] += (wf[e] * d[e] - norm * m) * rs[j];
                        dw[i][e] += d[e] * norm;
                    }
                    o[u] = pack<V>(g);
                }
            }
        }
    }
    float *p = partial + (size_t)blockIdx.x * C;
#pragma unroll
    for (int i = 0; i < CPL; i++) {
        const int u = threadIdx.x + i * THREADS;
        if (u < U) {
            if constexpr (V == 8) {
                float4 *q = reinterpret_cast<float4 *>(p + (size_t)u * 8);
                q[0] = make_float4(dw[i][0], dw[i][1], dw[i][2], dw[i][3]);
                q[1] = make_float4(dw[i][4], dw[i][5], dw[i][6], dw[i][7]);
            } else {
                p[u] = dw[i][0];
            }
        }
    }
}

/* dst[col] += (add; = otherwise) the sum over chunks of partial[chunk][col]:
 * grid ceil(cols / 32), block (32, 32); thread (x, y) adds chunks y, y + 32,
 * ... of column x (8 loads in flight), then thread (x, 0) adds the 32 sums
 * in y order. */
__global__ void colsum_chunks(float *dst, const float *partial, int cols, int chunks, bool add)
{
    __shared__ float s[32][33];
    const int col = blockIdx.x * 32 + threadIdx.x, y = threadIdx.y;
    float t = 0.f;
    if (col < cols) {
        const float *p = partial + col;
#pragma unroll 8
        for (int c = y; c < chunks; c += 32)
            t += p[(size_t)c * cols];
    }
    s[y][threadIdx.x] = t;
    __syncthreads();
    if (y == 0 && col < cols) {
        float u = 0.f;
        for (int i = 0; i < 32; i++)
            u += s[i][threadIdx.x];
        dst[col] = add ? dst[col] + u : u;
    }
}

/* The RMSNorm kernels' shapes X(V, CPL, R, THREADS): V bf16 per unit, CPL
 * units per thread per row, R rows per step. 16-byte units (C % 8 == 0,
 * aligned pointers) over 256 threads for C <= 4096, over 1024 for C <= 16384;
 * else one-element units over 1024 threads for C <= 8192. R x CPL units of
 * each tensor per thread in registers: 4 in the forward (fewer at 1024
 * threads: 64 registers at most), 1 or 2 in the backward, which holds three
 * inputs and the floats the compiler keeps across the block's sum. Measured
 * on an H200 at N 8192, C 2048 (bench: llama_ops_check --bench): the
 * backward took 53 us at R 2 (73 registers, 3 blocks per SM), 47 us at R 1
 * (56 registers); 256 or 1024 chunks, 512 threads for C 3072, or a cap of 64
 * registers gained nothing; the forward's R 2 or more blocks neither. */
#define RMS_FWD_CASES(X)                                                                           \
    X(8, 1, 4, 256)  /* C <= 2048 */                                                               \
    X(8, 2, 2, 256)  /* C <= 4096 */                                                               \
    X(8, 1, 2, 1024) /* C <= 8192 */                                                               \
    X(8, 2, 1, 1024) /* C <= 16384 */                                                              \
    X(1, 1, 2, 1024) /* C <= 1024, one element per unit */                                         \
    X(1, 2, 1, 1024) /* C <= 2048 */                                                               \
    X(1, 4, 1, 1024) /* C <= 4096 */                                                               \
    X(1, 8, 1, 1024) /* C <= 8192 */
#define RMS_BWD_CASES(X)                                                                           \
    X(8, 1, 1, 256)                                                                                \
    X(8, 2, 1, 256)                                                                                \
    X(8, 1, 1, 1024)                                                                               \
    X(8, 2, 1, 1024)                                                                               \
    X(1, 1, 2, 1024)                                                                               \
    X(1, 2, 1, 1024)                                                                               \
    X(1, 4, 1, 1024)                                                                               \
    X(1, 8, 1, 1024)

struct rms_shape {
    int V, CPL, threads;
};

int rms_shape_for(rms_shape *s, int C, bool v8, const char *what, bmt_error_t *err)
{
    s->V = v8 ? 8 : 1;
    s->threads = v8 && C <= 4096 ? 256 : 1024;
    const int need = (C / s->V + s->threads - 1) / s->threads;
    s->CPL = need <= 1 ? 1 : need <= 2 ? 2 : need <= 4 && !v8 ? 4 : need <= 8 && !v8 ? 8 : 0;
    if (C <= 0 || s->CPL == 0) {
        char why[128];
        snprintf(why, sizeof(why), "C %d outside 1..%d", C, v8 ? 16384 : 8192);
        return fail_text(err, what, why);
    }
    return 0;
}

/* Blocks of RMSNorm's forward: R rows each, RMS_FWD_GRID at most (they
 * stride over the rest). */
unsigned rms_grid(int N, int R)
{
    const int g = (N + R - 1) / R;
    return (unsigned)(g < RMS_FWD_GRID ? g : RMS_FWD_GRID);
}

/* RMSNorm backward's row chunks (its blocks): *per rows each, a multiple of R,
 * RMS_CHUNKS chunks at most, or fewer where their partial sums would not fit
 * in `fit` rows of C f32 (never for C <= 16384: the workspace holds at least
 * 32 MiB). So the chunks depend on N, C and the kernel only, and so do the
 * sums' order and bits. */
int rms_chunks(int N, int R, size_t fit, int *per)
{
    const int most = fit < RMS_CHUNKS ? (int)fit : RMS_CHUNKS;
    int p = (N + most - 1) / most;
    p = (p + R - 1) / R * R;
    *per = p;
    return (N + p - 1) / p;
}

/* ------------------------------------------------------------ RoPE */

/* Thread (token n, head group g, dims 8j..8j+7 of the first half) rotates
 * dims i and i + hd/2 of heads g, g + G, ... (ROPE_HPT at most, below nh), so
 * a warp's loads cover whole half-heads side by side. SIGN -1: the transpose. */
template <int SIGN>
__global__ void rope8(bf16 *qkv, const float *inv_freq, int N, int T, int nh, int row, int hd,
                      int pos0, int G)
{
    const int J = hd / 16, half = hd / 2;
    const size_t total = (size_t)N * G * J;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const int j = (int)(idx % J), g = (int)(idx / J % G);
        const size_t n = idx / J / G;
        const float pos = (float)(pos0 + (int)(n % T));
        bf16 *base = qkv + n * row + 8 * j;
        uint4 ra[ROPE_HPT], rb[ROPE_HPT];
#pragma unroll
        for (int k = 0; k < ROPE_HPT; k++) {
            const int h = g + k * G;
            if (h < nh) {
                ra[k] = *reinterpret_cast<const uint4 *>(base + (size_t)h * hd);
                rb[k] = *reinterpret_cast<const uint4 *>(base + (size_t)h * hd + half);
            }
        }
        float c[8], s[8];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            sincosf(pos * inv_freq[8 * j + e], &s[e], &c[e]);
            s[e] *= (float)SIGN;
        }
#pragma unroll
        for (int k = 0; k < ROPE_HPT; k++) {
            const int h = g + k * G;
            if (h < nh) {
                float x1[8], x2[8], y1[8], y2[8];
                unpack8(x1, ra[k]);
                unpack8(x2, rb[k]);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    y1[e] = x1[e] * c[e] - x2[e] * s[e];
                    y2[e] = x2[e] * c[e] + x1[e] * s[e];
                }
                *reinterpret_cast<uint4 *>(base + (size_t)h * hd) = pack8(y1);
                *reinterpret_cast<uint4 *>(base + (size_t)h * hd + half) = pack8(y2);
            }
        }
    }
}

/* One (token, head, dim i < hd/2) pair per thread: any even hd, any alignment. */
template <int SIGN>
__global__ void rope1(bf16 *qkv, const float *inv_freq, int N, int T, int nh, int row, int hd,
                      int pos0)
{
    const int half = hd / 2;
    const size_t total = (size_t)N * nh * half;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(idx % half), h = (int)(idx / half % nh);
        const size_t n = idx / half / nh;
        const float pos = (float)(pos0 + (int)(n % T));
        float c, s;
        sincosf(pos * inv_freq[i], &s, &c);
        s *= (float)SIGN;
        bf16 *p = qkv + n * row + (size_t)h * hd + i;
        const float x1 = __bfloat162float(p[0]), x2 = __bfloat162float(p[half]);
        p[0] = __float2bfloat16(x1 * c - x2 * s);
        p[half] = __float2bfloat16(x2 * c + x1 * s);
    }
}

template <int SIGN>
int rope(nn_cuda_t *h, void *qkv, const float *inv_freq, int B, int T, int NH, int NKV, int hd,
         int pos0, const char *what, bmt_error_t *err)
{
    if (hd <= 0 || hd % 2 != 0 || NH < 0 || NKV < 0)
        return fail_text(err, what, "the head size must be even and positive");
    if (B < 0 || T < 0 || pos0 < 0)
        return fail_text(err, what, "B, T and pos0 must not be negative");
    const int N = B * T, nh = NH + NKV, row = (NH + 2 * NKV) * hd;
    if (N <= 0 || nh == 0)
        return 0;
    bf16 *x = (bf16 *)qkv;
    if (hd % 16 == 0 && aligned16(qkv)) {
        const int G = (nh + ROPE_HPT - 1) / ROPE_HPT;
        rope8<SIGN><<<blocks_for((size_t)N * G * (hd / 16), 128), 128, 0, stream_of(h)>>>(
            x, inv_freq, N, T, nh, row, hd, pos0, G);
    } else {
        rope1<SIGN><<<blocks_for((size_t)N * nh * (hd / 2), 256), 256, 0, stream_of(h)>>>(
            x, inv_freq, N, T, nh, row, hd, pos0);
    }
    return launched(err, what);
}

/* ------------------------------------------------------------ SwiGLU */

/* out[n][f] = silu(gu[n][f]) gu[n][F + f], V outputs per unit (F % V == 0). */
template <int V> __global__ void swiglu_fwd(bf16 *out, const bf16 *gu, int N, int F)
{
    const int U = F / V;
    const size_t total = (size_t)N * U;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t n = idx / U;
        const int u = (int)(idx % U);
        const raw_t<V> *g = reinterpret_cast<const raw_t<V> *>(gu + n * 2 * F);
        float gf[V], uf[V];
        unpack<V>(gf, g[u]);
        unpack<V>(uf, g[U + u]); /* up: F = U V elements on */
#pragma unroll
        for (int e = 0; e < V; e++)
            gf[e] = gf[e] / (1.0f + expf(-gf[e])) * uf[e];
        reinterpret_cast<raw_t<V> *>(out + n * F)[u] = pack<V>(gf);
    }
}

/* dgate = dout up silu'(gate), dup = dout silu(gate), with sig = 1 / (1 +
 * e^-gate) (0 for gate << 0: no NaN), silu = gate sig, silu' = sig (1 + gate
 * (1 - sig)). */
template <int V>
__global__ void swiglu_bwd(bf16 *dgu, const bf16 *dout, const bf16 *gu, int N, int F)
{
    const int U = F / V;
    const size_t total = (size_t)N * U;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t n = idx / U;
        const int u = (int)(idx % U);
        const raw_t<V> *g = reinterpret_cast<const raw_t<V> *>(gu + n * 2 * F);
        float gf[V], uf[V], d[V];
        unpack<V>(gf, g[u]);
        unpack<V>(uf, g[U + u]);
        unpack<V>(d, reinterpret_cast<const raw_t<V> *>(dout + n * F)[u]);
#pragma unroll
        for (int e = 0; e < V; e++) {
            const float sig = 1.0f / (1.0f + expf(-gf[e]));
            const float dg = d[e] * uf[e] * (sig * (1.0f + gf[e] * (1.0f - sig)));
            uf[e] = d[e] * (gf[e] * sig);
            gf[e] = dg;
        }
        raw_t<V> *o = reinterpret_cast<raw_t<V> *>(dgu + n * 2 * F);
        o[u] = pack<V>(gf);
        o[U + u] = pack<V>(uf);
    }
}

} /* namespace */

/* ------------------------------------------------------------ the C API */

extern "C" int nn_cuda_rmsnorm_forward(nn_cuda_t *h, void *out, float *rstd, const void *inp,
                                       const void *weight, int N, int C, float eps,
                                       bmt_error_t *err)
{
    const char *what = "rmsnorm forward";
    rms_shape s;
    if (rms_shape_for(&s, C, C % 8 == 0 && aligned16(out, inp, weight), what, err) < 0)
        return -1;
    if (N <= 0)
        return 0;
    bf16 *o = (bf16 *)out;
    const bf16 *x = (const bf16 *)inp, *w = (const bf16 *)weight;
#define RMS_FWD(V_, CPL_, R_, T_)                                                                  \
    if (s.V == V_ && s.CPL == CPL_ && s.threads == T_)                                             \
        rmsnorm_fwd<V_, CPL_, R_, T_>                                                              \
            <<<rms_grid(N, R_), T_, 0, stream_of(h)>>>(o, rstd, x, w, N, C, eps);
    RMS_FWD_CASES(RMS_FWD)
#undef RMS_FWD
    return launched(err, what);
}

extern "C" int nn_cuda_rmsnorm_backward(nn_cuda_t *h, void *dinp, const void *dres, float *dweight,
                                        const void *dout, const void *inp, const void *weight,
                                        const float *rstd, int N, int C, int add, bmt_error_t *err)
{
    const char *what = "rmsnorm backward";
    rms_shape s;
    if (rms_shape_for(&s, C, C % 8 == 0 && aligned16(dinp, dres, dout, inp, weight), what, err) < 0)
        return -1;
    if (N <= 0) /* no rows: dweight's gradient is 0 (written when not added to) */
        return add || cudaMemsetAsync(dweight, 0, (size_t)C * sizeof(float), stream_of(h)) ==
                           cudaSuccess
                   ? 0
                   : launched(err, what);
    size_t bytes = 0;
    float *partial = (float *)nn_cuda_workspace(h, &bytes);
    const size_t fit = bytes / ((size_t)C * sizeof(float)); /* rows of partial sums */
    if (fit < 1)
        return fail_text(err, what, "the handle's workspace is smaller than a row of f32");
    int per = 0, chunks = 0;
    bf16 *di = (bf16 *)dinp;
    const bf16 *dr = (const bf16 *)dres, *dy = (const bf16 *)dout, *x = (const bf16 *)inp,
               *w = (const bf16 *)weight;
#define RMS_BWD(V_, CPL_, R_, T_)                                                                  \
    if (s.V == V_ && s.CPL == CPL_ && s.threads == T_) {                                           \
        chunks = rms_chunks(N, R_, fit, &per);                                                     \
        rmsnorm_bwd<V_, CPL_, R_, T_><<<(unsigned)chunks, T_, 0, stream_of(h)>>>(                  \
            di, dr, partial, dy, x, w, rstd, N, C, per);                                           \
    }
    RMS_BWD_CASES(RMS_BWD)
#undef RMS_BWD
    colsum_chunks<<<(unsigned)(C + 31) / 32, dim3(32, 32), 0, stream_of(h)>>>(dweight, partial, C,
                                                                              chunks, add != 0);
    return launched(err, what);
}

extern "C" int nn_cuda_rope_forward(nn_cuda_t *h, void *qkv, const float *inv_freq, int B, int T,
                                    int NH, int NKV, int hd, int pos0, bmt_error_t *err)
{
    return rope<1>(h, qkv, inv_freq, B, T, NH, NKV, hd, pos0, "rope forward", err);
}

extern "C" int nn_cuda_rope_backward(nn_cuda_t *h, void *dqkv, const float *inv_freq, int B, int T,
                                     int NH, int NKV, int hd, int pos0, bmt_error_t *err)
{
    return rope<-1>(h, dqkv, inv_freq, B, T, NH, NKV, hd, pos0, "rope backward", err);
}

extern "C" int nn_cuda_swiglu_forward(nn_cuda_t *h, void *out, const void *gu, int N, int F,
                                      bmt_error_t *err)
{
    if (N <= 0 || F <= 0)
        return 0;
    bf16 *o = (bf16 *)out;
    const bf16 *g = (const bf16 *)gu;
    if (F % 8 == 0 && aligned16(out, gu))
        swiglu_fwd<8><<<blocks_for((size_t)N * (F / 8), 256), 256, 0, stream_of(h)>>>(o, g, N, F);
    else
        swiglu_fwd<1><<<blocks_for((size_t)N * F, 256), 256, 0, stream_of(h)>>>(o, g, N, F);
    return launched(err, "swiglu forward");
}

extern "C" int nn_cuda_swiglu_backward(nn_cuda_t *h, void *dgu, const void *dout, const void *gu,
                                       int N, int F, bmt_error_t *err)
{
    if (N <= 0 || F <= 0)
        return 0;
    bf16 *o = (bf16 *)dgu;
    const bf16 *d = (const bf16 *)dout, *g = (const bf16 *)gu;
    if (F % 8 == 0 && aligned16(dgu, dout, gu))
        swiglu_bwd<8>
            <<<blocks_for((size_t)N * (F / 8), 256), 256, 0, stream_of(h)>>>(o, d, g, N, F);
    else
        swiglu_bwd<1><<<blocks_for((size_t)N * F, 256), 256, 0, stream_of(h)>>>(o, d, g, N, F);
    return launched(err, "swiglu backward");
}
