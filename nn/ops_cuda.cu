/* nn/ops_cuda.cu — the shared layers on CUDA (see ops_cuda.h).
 *
 * Plain, checked kernels first: one warp per row for the row-wise layers
 * (layernorm, softmax), grid-stride loops for the element-wise ones, and
 * column sums (bias and LayerNorm parameter gradients) in two fixed-order
 * passes (partial sums per chunk of rows, then per column) so that results do
 * not depend on scheduling. Matmuls are cuBLASLt, the attention scores batched
 * cuBLAS GEMMs. bench/NOTES.md records what each later change to these bought.
 */
#include "nn/ops_cuda.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda.h> /* CUtensorMap (the head-64 forward's TMA copies) */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "nn/cuda_util.cuh"

#define LT_WORKSPACE (32u << 20) /* cuBLASLt's workspace: what Hopper's kernels ask for */
#define COL_CHUNKS 64            /* row chunks of a column sum */
#define NN_MM_PLANS 256          /* products' plans kept; more are made per call */

/* A product's cuBLASLt plan: its descriptors and algorithm, made on the
 * first call of its shape and kept, so that a tuned choice (nn_cuda_gemm_tune)
 * is made once and no call repeats the heuristic query. Keyed by everything
 * the descriptors or the choice depend on; the pointers (bias, aux) are set on
 * each call. found 0: no cuBLASLt algorithm, the cuBLAS fallback below. */
struct mm_key {
    int m, n, k, lda, ldb, ldd, epi;
    bool ta, tb, bias, beta0;
    cudaDataType_t dtD;
    cudaDataType_t dtA, dtB; /* bf16, or FP8 (nn_cuda_fp8_matmul) */
    bool fast;               /* FP8: CUBLASLT_MATMUL_DESC_FAST_ACCUM */
    unsigned align;          /* the pointers' common alignment, capped at 256 */
};

/* An FP8 product's operand types and descales (device f32), for matmul_one. */
struct fp8_args {
    cudaDataType_t dtA, dtB;
    const float *sa, *sb;
    bool fast;
};

struct mm_plan {
    mm_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ldl;
    cublasLtMatmulAlgo_t algo;
    int found;
};

struct nn_cuda {
    cudaStream_t stream;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    void *lt_ws;    /* LT_WORKSPACE bytes */
    float *partial; /* COL_CHUNKS x 2 x max_cols f32 */
    int max_cols;
    int attn_mode; /* nn_cuda_attention_mode: 0 the fastest, 1 materialized, 2 mma.sync flash */
    bool wgmma;    /* built with NN_WGMMA and the device is compute capability 9.0 */
    int gemm_tune; /* nn_cuda_gemm_tune: candidates timed per product shape, 0/1 none */
    bool lt_off;   /* nn_cuda_lt_off: bf16 products through cuBLAS and the epilogue kernels */
    int nplans;
    mm_plan *plans; /* NN_MM_PLANS of them */
};

namespace
{

int blas_ok(cublasStatus_t s, bmt_error_t *err, const char *what)
{
    return s == CUBLAS_STATUS_SUCCESS ? 0 : fail_text(err, what, cublasGetStatusString(s));
}

/* ------------------------------------------------------------ encoder */

__global__ void encoder_fwd(bf16 *out, const int32_t *inp, const bf16 *wte, const bf16 *wpe, int T,
                            int C, size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / C;
        int c = (int)(i % C), t = (int)(n % T);
        out[i] = wpe ? bf(ld(&wte[(size_t)inp[n] * C + c]) + ld(&wpe[(size_t)t * C + c]))
                     : wte[(size_t)inp[n] * C + c];
    }
}

/* One block per distinct token: its positions' rows, summed in position order. */
__global__ void encoder_bwd_wte(float *dwte, const bf16 *dout, const int32_t *buckets, int U, int C)
{
    const int u = blockIdx.x;
    const int tok = buckets[u], begin = buckets[U + u], end = buckets[U + u + 1];
    const int32_t *pos = buckets + 2 * U + 1;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0;
        for (int j = begin; j < end; j++)
            s += ld(&dout[(size_t)pos[j] * C + c]);
        dwte[(size_t)tok * C + c] += s;
    }
}

__global__ void encoder_bwd_wpe(float *dwpe, const bf16 *dout, int B, int T, int C)
{
    const int t = blockIdx.x;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0;
        for (int b = 0; b < B; b++)
            s += ld(&dout[((size_t)b * T + t) * C + c]);
        dwpe[(size_t)t * C + c] += s;
    }
}

/* ------------------------------------------------------------ column sums */

/* Per-element terms of the column sums: K sums per column. */
struct bias_term {
    const bf16 *dout;
    int stride;
    __device__ float2 operator()(int r, int c) const
    {
        return make_float2(__bfloat162float(dout[(size_t)r * stride + c]), 0.f);
    }
    bool vec() const { return stride % 8 == 0 && aligned16(dout); }
    __device__ void add8(float (*acc)[8], int r, int c) const
    {
        float d[8];
        unpack8(d, *reinterpret_cast<const uint4 *>(dout + (size_t)r * stride + c));
#pragma unroll
        for (int e = 0; e < 8; e++)
            acc[0][e] += d[e];
    }
};

struct ln_term {
    const bf16 *dout, *inp;
    const float *mean, *rstd;
    int C;
    __device__ float2 operator()(int r, int c) const
    {
        const size_t i = (size_t)r * C + c;
        const float d = __bfloat162float(dout[i]);
        const float norm = (__bfloat162float(inp[i]) - mean[r]) * rstd[r];
        return make_float2(d * norm, d); /* dweight, dbias */
    }
    bool vec() const { return C % 8 == 0 && aligned16(dout, inp); }
    __device__ void add8(float (*acc)[8], int r, int c) const
    {
        const size_t i = (size_t)r * C + c;
        float d[8], x[8];
        unpack8(d, *reinterpret_cast<const uint4 *>(dout + i));
        unpack8(x, *reinterpret_cast<const uint4 *>(inp + i));
        const float m = mean[r], rs = rstd[r];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            acc[0][e] += d[e] * ((x[e] - m) * rs);
            acc[1][e] += d[e];
        }
    }
};

/* grid (ceil(cols / 32), chunks), block (32, 8): partial[k][chunk][col]. */
template <int K, class F> __global__ void colsum_partial(float *partial, int N, int cols, F f)
{
    __shared__ float s[K][8][33];
    const int col = blockIdx.x * 32 + threadIdx.x;
    const int per = (N + gridDim.y - 1) / gridDim.y;
    const int r0 = blockIdx.y * per, r1 = min(N, r0 + per);
    float a0 = 0, a1 = 0;
    if (col < cols)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            float2 v = f(r, col);
            a0 += v.x;
            a1 += v.y;
        }
    s[0][threadIdx.y][threadIdx.x] = a0;
    if (K > 1)
        s[K - 1][threadIdx.y][threadIdx.x] = a1;
    __syncthreads();
    if (threadIdx.y < K && col < cols) {
        float t = 0;
        for (int y = 0; y < 8; y++)
            t += s[threadIdx.y][y][threadIdx.x];
        partial[((size_t)threadIdx.y * gridDim.y + blockIdx.y) * cols + col] = t;
    }
}

/* colsum_final: nn/cuda_util.cuh (the FP8 conversions' bias sums use it too) */

/* The same partial sums 8 columns (16 bytes) per thread: grid (ceil(cols /
 * 256), chunks), 256 threads; lane l of warp w takes columns 8 (32 x + l) ..
 * + 7 of rows w, w + 8, ... of the chunk, and the block adds the 8 warps'
 * sums in warp order. Needs cols % 8 == 0 and 16-byte aligned rows (F::vec). */
template <int K, class F> __global__ void colsum_partial8(float *partial, int N, int cols, F f)
{
    __shared__ float s[K][8][256];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c0 = (blockIdx.x * 32 + lane) * 8;
    const int per = (N + gridDim.y - 1) / gridDim.y;
    const int r0 = blockIdx.y * per, r1 = min(N, r0 + per);
    float acc[K][8] = {};
    if (c0 < cols)
        for (int r = r0 + warp; r < r1; r += 8)
            f.add8(acc, r, c0);
#pragma unroll
    for (int k = 0; k < K; k++)
#pragma unroll
        for (int e = 0; e < 8; e++)
            s[k][warp][lane * 8 + e] = acc[k][e];
    __syncthreads();
    const int col = blockIdx.x * 256 + threadIdx.x;
    if (col < cols)
#pragma unroll
        for (int k = 0; k < K; k++) {
            float t = 0;
            for (int y = 0; y < 8; y++)
                t += s[k][y][threadIdx.x];
            partial[((size_t)k * gridDim.y + blockIdx.y) * cols + col] = t;
        }
}

template <int K, class F>
int colsum(nn_cuda_t *h, float *dst0, float *dst1, int N, int cols, F f, bool add, bmt_error_t *err)
{
    if (cols > h->max_cols)
        return fail_text(err, "column sum", "more columns than the handle was made for");
    const int chunks = N < COL_CHUNKS ? (N > 0 ? N : 1) : COL_CHUNKS;
    if (cols % 8 == 0 && f.vec())
        colsum_partial8<K, F>
            <<<dim3((unsigned)(cols + 255) / 256, (unsigned)chunks), 256, 0, h->stream>>>(
                h->partial, N, cols, f);
    else
        colsum_partial<K, F>
            <<<dim3((unsigned)(cols + 31) / 32, (unsigned)chunks), dim3(32, 8), 0, h->stream>>>(
                h->partial, N, cols, f);
    colsum_final<<<(unsigned)(cols + 31) / 32, dim3(32, 8), 0, h->stream>>>(dst0, dst1, h->partial,
                                                                            cols, chunks, add);
    return launched(err, "column sum");
}

/* ------------------------------------------------------------ layernorm */

__global__ void layernorm_fwd(bf16 *out, float *mean, float *rstd, const bf16 *inp, const bf16 *w,
                              const bf16 *b, int N, int C)
{
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N)
        return;
    const bf16 *x = inp + (size_t)row * C;
    float s = 0;
    for (int c = lane; c < C; c += 32)
        s += ld(&x[c]);
    const float m = warp_sum(s) / C;
    float v = 0;
    for (int c = lane; c < C; c += 32) {
        float d = ld(&x[c]) - m;
        v += d * d;
    }
    const float rs = rsqrtf(warp_sum(v) / C + 1e-5f);
    bf16 *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32)
        o[c] = bf((ld(&x[c]) - m) * rs * ld(&w[c]) + ld(&b[c]));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = rs;
    }
}

__global__ void layernorm_bwd(bf16 *dinp, const bf16 *dres, const bf16 *dout, const bf16 *inp,
                              const bf16 *w, const float *mean, const float *rstd, int N, int C)
{
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N)
        return;
    const size_t base = (size_t)row * C;
    const float m = mean[row], rs = rstd[row];
    float a = 0, b = 0;
    for (int c = lane; c < C; c += 32) {
        const float dn = ld(&w[c]) * ld(&dout[base + c]);
        a += dn;
        b += dn * (ld(&inp[base + c]) - m) * rs;
    }
    a = warp_sum(a) / C;
    b = warp_sum(b) / C;
    for (int c = lane; c < C; c += 32) {
        const float dn = ld(&w[c]) * ld(&dout[base + c]);
        const float norm = (ld(&inp[base + c]) - m) * rs;
        dinp[base + c] = bf((dres ? ld(&dres[base + c]) : 0.f) + (dn - a - norm * b) * rs);
    }
}

/* The same two kernels with rows held in registers as 16-byte chunks (C % 8
 * == 0, rows 16-byte aligned): lane l of a row's warp takes chunks l, l + 32,
 * ... (CPL of them at most: C <= 256 CPL), so each row is read from memory
 * once (the scalar kernels read it two or three times, 2 bytes per lane). */
template <int CPL>
__global__ void layernorm_fwd8(bf16 *out, float *mean, float *rstd, const bf16 *inp, const bf16 *w,
                               const bf16 *b, int N, int C)
{
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N)
        return;
    const int Q = C / 8;
    const uint4 *x = reinterpret_cast<const uint4 *>(inp + (size_t)row * C);
    uint4 xv[CPL];
    float f[8], s = 0;
#pragma unroll
    for (int i = 0; i < CPL; i++)
        if (lane + 32 * i < Q) {
            xv[i] = x[lane + 32 * i];
            unpack8(f, xv[i]);
#pragma unroll
            for (int e = 0; e < 8; e++)
                s += f[e];
        }
    const float m = warp_sum(s) / C;
    float v = 0;
#pragma unroll
    for (int i = 0; i < CPL; i++)
        if (lane + 32 * i < Q) {
            unpack8(f, xv[i]);
#pragma unroll
            for (int e = 0; e < 8; e++)
                v += (f[e] - m) * (f[e] - m);
        }
    const float rs = rsqrtf(warp_sum(v) / C + 1e-5f);
    uint4 *o = reinterpret_cast<uint4 *>(out + (size_t)row * C);
#pragma unroll
    for (int i = 0; i < CPL; i++) {
        const int q = lane + 32 * i;
        if (q < Q) {
            float wf[8], bf8[8];
            unpack8(f, xv[i]);
            unpack8(wf, reinterpret_cast<const uint4 *>(w)[q]);
            unpack8(bf8, reinterpret_cast<const uint4 *>(b)[q]);
#pragma unroll
            for (int e = 0; e < 8; e++)
                f[e] = (f[e] - m) * rs * wf[e] + bf8[e];
            o[q] = pack8(f);
        }
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = rs;
    }
}

/* The backward reads each row twice (the sums, then dinp) and keeps nothing
 * in registers between the passes: the second pass finds the row in L1. Rows
 * held in registers (CPL x 2 chunks) took 144 registers at C 1600, one block
 * per SM, and ran slower than the scalar kernel (61 against ~45 us at d48).
 * 16-byte chunks (C % 8 == 0, aligned rows). */
__global__ void layernorm_bwd8(bf16 *dinp, const bf16 *dres, const bf16 *dout, const bf16 *inp,
                               const bf16 *w, const float *mean, const float *rstd, int N, int C)
{
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N)
        return;
    const int Q = C / 8;
    const size_t base = (size_t)row * C;
    const uint4 *dv = reinterpret_cast<const uint4 *>(dout + base);
    const uint4 *xv = reinterpret_cast<const uint4 *>(inp + base);
    const uint4 *wv = reinterpret_cast<const uint4 *>(w);
    const float m = mean[row], rs = rstd[row];
    float d[8], x[8], wf[8], a = 0, b = 0;
    for (int q = lane; q < Q; q += 32) {
        unpack8(d, dv[q]);
        unpack8(x, xv[q]);
        unpack8(wf, wv[q]);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const float dn = wf[e] * d[e];
            a += dn;
            b += dn * (x[e] - m) * rs;
        }
    }
    a = warp_sum(a) / C;
    b = warp_sum(b) / C;
    uint4 *o = reinterpret_cast<uint4 *>(dinp + base);
    for (int q = lane; q < Q; q += 32) {
        float r[8] = {};
        if (dres)
            unpack8(r, reinterpret_cast<const uint4 *>(dres + base)[q]);
        unpack8(d, dv[q]);
        unpack8(x, xv[q]);
        unpack8(wf, wv[q]);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const float dn = wf[e] * d[e], norm = (x[e] - m) * rs;
            r[e] += (dn - a - norm * b) * rs;
        }
        o[q] = pack8(r);
    }
}

/* Chunks per lane of the 16-byte forward kernel (it holds its row in
 * registers) for C columns: 0 where it does not apply (C % 8, more than 8
 * chunks per lane). The backward's 16-byte kernel takes any C % 8 == 0. */
int ln_cpl(int C) { return C % 8 == 0 && C > 0 && C <= 256 * 8 ? (C + 255) / 256 : 0; }

#define LN_CPL_CASES(X) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8)

/* ------------------------------------------------------------ matmul */

__global__ void add_bias(bf16 *out, int ld_out, const bf16 *bias, int N, int OC)
{
    const size_t total = (size_t)N * OC;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t n = i / OC;
        const int c = (int)(i % OC);
        bf16 *o = &out[n * ld_out + c];
        *o = bf(ld(o) + ld(&bias[c]));
    }
}

/* GELU epilogues of a product (bf16 D): none; forward, D = GELU(x) and aux =
 * x, the pre-activation the backward needs; backward, D = x * GELU'(aux). x is
 * the product (+ bias), in f32 before any rounding. aux: bf16, ld as D. */
enum {
    EPI_NONE,
    EPI_GELU,
    EPI_DGELU
};

/* The epilogues' cuBLAS fallback: col-major (m, n), ld ldd; D = GELU(aux), or
 * (bwd) D *= GELU'(aux). */
__global__ void gelu_cols(bf16 *D, const bf16 *aux, int ldd, int m, int n, bool bwd);

void plan_release(mm_plan *p)
{
    if (p->ldl)
        cublasLtMatrixLayoutDestroy(p->ldl);
    if (p->lb)
        cublasLtMatrixLayoutDestroy(p->lb);
    if (p->la)
        cublasLtMatrixLayoutDestroy(p->la);
    if (p->desc)
        cublasLtMatmulDescDestroy(p->desc);
    p->ldl = p->lb = p->la = NULL;
    p->desc = NULL;
}

/* The alignment every pointer shares (its lowest set bit), capped at 256. */
unsigned ptrs_align(const void *a, const void *b, const void *c)
{
    const uintptr_t x = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | 256u;
    return (unsigned)(x & (~x + 1));
}

bool key_eq(const mm_key *a, const mm_key *b)
{
    return a->m == b->m && a->n == b->n && a->k == b->k && a->lda == b->lda && a->ldb == b->ldb &&
           a->ldd == b->ldd && a->epi == b->epi && a->ta == b->ta && a->tb == b->tb &&
           a->bias == b->bias && a->beta0 == b->beta0 && a->dtD == b->dtD && a->dtA == b->dtA &&
           a->dtB == b->dtB && a->fast == b->fast && a->align == b->align;
}

/* Times each candidate algorithm (one warm-up, then the median of three runs)
 * on scratch outputs, so that a product that accumulates (beta 1) is not
 * disturbed, and keeps the fastest in p->algo. Any failure keeps the
 * heuristic's first. The scratch (D, and GELU's aux output) comes from
 * cudaMallocAsync on the stream and goes back at once: it is outside the
 * context's memory accounting, and only there while a new shape is tuned. */
void plan_tune(nn_cuda_t *h, mm_plan *p, const cublasLtMatmulHeuristicResult_t *cand, int nc,
               const void *A, const void *B, float beta, void *aux)
{
    const size_t ds = p->key.dtD == CUDA_R_32F ? 4 : 2, bytes = (size_t)p->key.ldd * p->key.n * ds;
    void *tD = NULL, *tX = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    const float one = 1.0f;
    float best = INFINITY;
    if (cudaMallocAsync(&tD, bytes, h->stream) != cudaSuccess ||
        (p->key.epi == EPI_GELU &&
         cudaMallocAsync(&tX, (size_t)p->key.ldd * p->key.n * 2, h->stream) != cudaSuccess) ||
        cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess)
        goto out;
    if (p->key.epi == EPI_GELU) {
        void *x = tX;
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &x,
                                       sizeof(x));
    }
    cudaMemsetAsync(tD, 0, bytes, h->stream);
    for (int c = 0; c < nc; c++) {
        float ms[3];
        bool ok = true;
        for (int r = 0; r < 4 && ok; r++) {
            if (r > 0)
                cudaEventRecord(e0, h->stream);
            ok = cublasLtMatmul(h->lt, p->desc, &one, A, p->la, B, p->lb, &beta, tD, p->ldl, tD,
                                p->ldl, &cand[c].algo, h->lt_ws, LT_WORKSPACE,
                                h->stream) == CUBLAS_STATUS_SUCCESS;
            if (ok && r > 0) {
                cudaEventRecord(e1, h->stream);
                ok = cudaEventSynchronize(e1) == cudaSuccess &&
                     cudaEventElapsedTime(&ms[r - 1], e0, e1) == cudaSuccess;
            }
        }
        if (!ok)
            continue;
        const float lo = fminf(ms[0], fminf(ms[1], ms[2])), hi = fmaxf(ms[0], fmaxf(ms[1], ms[2]));
        const float med = ms[0] + ms[1] + ms[2] - lo - hi;
        if (med < best) {
            best = med;
            p->algo = cand[c].algo;
        }
    }
out:
    if (p->key.epi == EPI_GELU)
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                       sizeof(aux));
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    if (tD)
        cudaFreeAsync(tD, h->stream);
    if (tX)
        cudaFreeAsync(tX, h->stream);
    cudaGetLastError(); /* a candidate's failure is not the product's */
}

/* Makes the plan of a product (descriptors, heuristic, tuning); 0 or a
 * cuBLAS status. */
cublasStatus_t plan_make(nn_cuda_t *h, mm_plan *p, const void *A, const void *B, const void *bias,
                         float beta, void *aux, const fp8_args *f8)
{
    const cublasOperation_t opa = p->key.ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                            opb = p->key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const size_t ws = LT_WORKSPACE;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur[NN_GEMM_TUNE_MAX];
    const int want = h->gemm_tune > 1 ? h->gemm_tune : 1;
    cublasStatus_t s = cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa));
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb));
    const cublasLtEpilogue_t e =
        p->key.epi == EPI_GELU
            ? (p->key.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
        : p->key.epi == EPI_DGELU ? CUBLASLT_EPILOGUE_DGELU
        : p->key.bias             ? CUBLASLT_EPILOGUE_BIAS
                                  : CUBLASLT_EPILOGUE_DEFAULT;
    if (s == CUBLAS_STATUS_SUCCESS && e != CUBLASLT_EPILOGUE_DEFAULT)
        s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e));
    if (s == CUBLAS_STATUS_SUCCESS && p->key.bias && p->key.epi != EPI_DGELU)
        s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                           sizeof(bias));
    if (s == CUBLAS_STATUS_SUCCESS && p->key.epi != EPI_NONE) {
        const int64_t ld = p->key.ldd;
        s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                           sizeof(aux));
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                               sizeof(ld));
    }
    if (s == CUBLAS_STATUS_SUCCESS && f8) {
        const int8_t fast = p->key.fast;
        s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                                           sizeof(fast));
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                               &f8->sa, sizeof(f8->sa));
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                               &f8->sb, sizeof(f8->sb));
    }
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutCreate(&p->la, p->key.dtA, p->key.ta ? p->key.k : p->key.m,
                                       p->key.ta ? p->key.m : p->key.k, p->key.lda);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutCreate(&p->lb, p->key.dtB, p->key.tb ? p->key.n : p->key.k,
                                       p->key.tb ? p->key.k : p->key.n, p->key.ldb);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutCreate(&p->ldl, p->key.dtD, p->key.m, p->key.n, p->key.ldd);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceCreate(&pref);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws, sizeof(ws));
    p->found = 0;
    if (s == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulAlgoGetHeuristic(h->lt, p->desc, p->la, p->lb, p->ldl, p->ldl, pref, want,
                                       heur, &p->found) != CUBLAS_STATUS_SUCCESS)
        p->found = 0;
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (s == CUBLAS_STATUS_SUCCESS && p->found > 0) {
        p->algo = heur[0].algo;
        if (p->found > 1)
            plan_tune(h, p, heur, p->found, A, B, beta, aux);
    }
    return s;
}

/* D (m,n) col-major, ldd, of type dtD = op(A) (m,k) x op(B) (k,n) [+ beta C]
 * [+ bias (m) bf16 broadcast over columns], then the GELU epilogue `epi` with
 * aux; A and B bf16; f32 compute. C is res (of D's type and layout) where
 * given, else D itself. */
int matmul_one(nn_cuda_t *h, void *D, cudaDataType_t dtD, int ldd, const void *A, bool ta, int lda,
               const void *B, bool tb, int ldb, int m, int n, int k, const void *bias, float beta,
               int epi, void *aux, bmt_error_t *err, const fp8_args *f8 = NULL,
               const void *res = NULL)
{
    const float one = 1.0f;
    mm_plan fresh = {};
    mm_key &key = fresh.key;
    key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldd = ldd, key.epi = epi;
    key.ta = ta, key.tb = tb, key.bias = bias != NULL, key.beta0 = beta == 0.0f, key.dtD = dtD;
    key.dtA = f8 ? f8->dtA : CUDA_R_16BF, key.dtB = f8 ? f8->dtB : CUDA_R_16BF;
    key.fast = f8 && f8->fast;
    key.align = ptrs_align(A, B, D) & ptrs_align(res ? res : D, D, D); /* C's too */
    mm_plan *p = NULL;
    for (int i = 0; i < h->nplans && p == NULL; i++)
        if (key_eq(&h->plans[i].key, &key))
            p = &h->plans[i];
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    const bool cached = p != NULL || h->nplans < NN_MM_PLANS;
    if (p == NULL) {
        p = cached ? &h->plans[h->nplans] : &fresh;
        *p = fresh;
        s = plan_make(h, p, A, B, bias, beta, aux, f8);
        if (s != CUBLAS_STATUS_SUCCESS) {
            plan_release(p);
            return blas_ok(s, err, "cublasLt plan");
        }
        if (cached)
            h->nplans++;
    } else {
        if (bias && epi != EPI_DGELU)
            s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                               sizeof(bias));
        if (s == CUBLAS_STATUS_SUCCESS && epi != EPI_NONE)
            s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                               &aux, sizeof(aux));
        if (s == CUBLAS_STATUS_SUCCESS && f8)
            s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                               &f8->sa, sizeof(f8->sa));
        if (s == CUBLAS_STATUS_SUCCESS && f8)
            s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                               &f8->sb, sizeof(f8->sb));
    }
    const int found = h->lt_off && !f8 ? 0 : p->found;
    if (s == CUBLAS_STATUS_SUCCESS && found > 0)
        s = cublasLtMatmul(h->lt, p->desc, &one, A, p->la, B, p->lb, &beta, res ? res : D, p->ldl,
                           D, p->ldl, &p->algo, h->lt_ws, LT_WORKSPACE, h->stream);
    if (!cached)
        plan_release(p);
    if (s != CUBLAS_STATUS_SUCCESS)
        return blas_ok(s, err, "cublasLtMatmul");
    if (found > 0)
        return launched(err, "cublasLtMatmul");
    if (f8) { /* cuBLAS has no FP8 product to fall back on */
        char why[160];
        snprintf(why, sizeof(why), "no cuBLASLt FP8 algorithm for m %d, n %d, k %d (ld %d, %d, %d)",
                 m, n, k, lda, ldb, ldd);
        return fail_text(err, "fp8 matmul", why);
    }
    /* No cuBLASLt algorithm for these sizes: cuBLAS, then the bias and the
     * GELU on their own (the forward's product goes to aux first). */
    void *P = epi == EPI_GELU ? aux : D;
    const size_t ds = dtD == CUDA_R_32F ? 4 : 2;
    if (res && res != D && beta != 0.0f && /* C in D's place first */
        cudaMemcpy2DAsync(D, (size_t)ldd * ds, res, (size_t)ldd * ds, (size_t)m * ds, n,
                          cudaMemcpyDeviceToDevice, h->stream) != cudaSuccess)
        return launched(err, "residual (copy)");
    if (epi == EPI_GELU && beta != 0.0f &&
        cudaMemcpy2DAsync(aux, (size_t)ldd * 2, D, (size_t)ldd * 2, (size_t)m * 2, n,
                          cudaMemcpyDeviceToDevice, h->stream) != cudaSuccess)
        return launched(err, "gelu epilogue (copy)");
    const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                            opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (blas_ok(cublasGemmEx(h->blas, opa, opb, m, n, k, &one, A, CUDA_R_16BF, lda, B, CUDA_R_16BF,
                             ldb, &beta, P, dtD, ldd, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                err, "cublasGemmEx") < 0)
        return -1;
    if (bias && epi != EPI_DGELU) {
        add_bias<<<blocks_for((size_t)m * n, 256), 256, 0, h->stream>>>((bf16 *)P, ldd,
                                                                        (const bf16 *)bias, n, m);
        if (launched(err, "bias") < 0)
            return -1;
    }
    if (epi != EPI_NONE) {
        gelu_cols<<<blocks_for((size_t)m * n, 256), 256, 0, h->stream>>>(
            (bf16 *)D, (const bf16 *)aux, ldd, m, n, epi == EPI_DGELU);
        return launched(err, "gelu epilogue");
    }
    return 0;
}

/* The same product with every dimension but a remainder a multiple of 64: a
 * dimension such as GPT-2's vocabulary (50257) makes cuBLASLt fall back to
 * kernels several times slower (measured: the head's forward at 95 TFLOP/s
 * against 550 for the layers' products, bench/NOTES.md), so it is split into
 * an aligned part and the remainder. Splitting m or n splits D; splitting k
 * adds the remainder's product into D (beta 1), one more rounding of D. */
int matmul(nn_cuda_t *h, void *D, cudaDataType_t dtD, int ldd, const void *A, bool ta, int lda,
           const void *B, bool tb, int ldb, int m, int n, int k, const void *bias, float beta,
           int epi, void *aux, bmt_error_t *err, const void *res = NULL)
{
    const size_t ds = dtD == CUDA_R_32F ? 4 : 2;
    const char *a = (const char *)A, *b = (const char *)B, *r = (const char *)res;
    char *d = (char *)D, *x = (char *)aux; /* aux: bf16, ld ldd; res: D's type, ld ldd */
    if (m > 64 && m % 64) {
        const int m1 = m / 64 * 64;
        return matmul(h, D, dtD, ldd, A, ta, lda, B, tb, ldb, m1, n, k, bias, beta, epi, aux, err,
                      res) < 0 ||
                       matmul(h, d + m1 * ds, dtD, ldd, a + (ta ? (size_t)m1 * lda : m1) * 2, ta,
                              lda, B, tb, ldb, m - m1, n, k,
                              bias ? (const char *)bias + (size_t)m1 * 2 : NULL, beta, epi,
                              x ? x + (size_t)m1 * 2 : NULL, err, r ? r + m1 * ds : NULL) < 0
                   ? -1
                   : 0;
    }
    if (n > 64 && n % 64) {
        const int n1 = n / 64 * 64;
        return matmul(h, D, dtD, ldd, A, ta, lda, B, tb, ldb, m, n1, k, bias, beta, epi, aux, err,
                      res) < 0 ||
                       matmul(h, d + (size_t)n1 * ldd * ds, dtD, ldd, A, ta, lda,
                              b + (tb ? n1 : (size_t)n1 * ldb) * 2, tb, ldb, m, n - n1, k, bias,
                              beta, epi, x ? x + (size_t)n1 * ldd * 2 : NULL, err,
                              r ? r + (size_t)n1 * ldd * ds : NULL) < 0
                   ? -1
                   : 0;
    }
    if (k > 64 && k % 64) { /* the epilogue on the last partial product, which completes D; res
                             * (beta C) goes into the first, the second adds to D */
        const int k1 = k / 64 * 64;
        if (epi == EPI_GELU) /* the bias once, on the last */
            return matmul(h, D, dtD, ldd, A, ta, lda, B, tb, ldb, m, n, k1, NULL, beta, EPI_NONE,
                          NULL, err, res) < 0 ||
                           matmul(h, D, dtD, ldd, a + (ta ? k1 : (size_t)k1 * lda) * 2, ta, lda,
                                  b + (tb ? (size_t)k1 * ldb : k1) * 2, tb, ldb, m, n, k - k1, bias,
                                  1.0f, epi, aux, err) < 0
                       ? -1
                       : 0;
        return matmul(h, D, dtD, ldd, A, ta, lda, B, tb, ldb, m, n, k1, bias, beta, EPI_NONE, NULL,
                      err, res) < 0 ||
                       matmul(h, D, dtD, ldd, a + (ta ? k1 : (size_t)k1 * lda) * 2, ta, lda,
                              b + (tb ? (size_t)k1 * ldb : k1) * 2, tb, ldb, m, n, k - k1, NULL,
                              1.0f, epi, aux, err) < 0
                   ? -1
                   : 0;
    }
    return matmul_one(h, D, dtD, ldd, A, ta, lda, B, tb, ldb, m, n, k, bias, beta, epi, aux, err,
                      NULL, res);
}

/* ------------------------------------------------------------ attention */

/* Between the token layout (B,T,parts,NH,hs) — qkv is parts = 3, [q | k | v] —
 * and `parts` head-major tensors (B,NH,T,hs) back to back: TO_HEADS gathers
 * src (tokens) into dst (heads), otherwise scatters src (heads) back. */
template <bool TO_HEADS>
__global__ void permute_heads(bf16 *dst, const bf16 *src, int parts, int B, int T, int NH, int hs)
{
    const size_t C = (size_t)NH * hs, one = (size_t)B * T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)parts * one;
         i += (size_t)gridDim.x * blockDim.x) {
        const int which = (int)(i / one);
        size_t r = i % one;
        const int d = (int)(r % hs);
        r /= hs;
        const int t = (int)(r % T);
        r /= T;
        const int hh = (int)(r % NH);
        const size_t b = r / NH;
        const size_t tok = (b * T + t) * parts * C + which * C + (size_t)hh * hs + d;
        if (TO_HEADS)
            dst[i] = src[tok];
        else
            dst[tok] = src[i];
    }
}

/* In place on rows of T scores (rows = B NH T, row r is query t = r % T):
 * att = softmax(scale * s) over t2 <= t, 0 above. */
__global__ void softmax_causal_fwd(bf16 *att, float scale, int rows, int T)
{
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows)
        return;
    const int t = row % T;
    bf16 *a = att + (size_t)row * T;
    float mx = -INFINITY;
    for (int j = lane; j <= t; j += 32)
        mx = fmaxf(mx, scale * ld(&a[j]));
    mx = warp_max(mx);
    float s = 0;
    for (int j = lane; j <= t; j += 32)
        s += expf(scale * ld(&a[j]) - mx);
    const float inv = 1.0f / warp_sum(s);
    for (int j = lane; j < T; j += 32)
        a[j] = j <= t ? bf(expf(scale * ld(&a[j]) - mx) * inv) : bf(0.f);
}

/* In place: datt -> d scores = scale * att * (datt - sum(att * datt)), 0 above. */
__global__ void softmax_causal_bwd(bf16 *datt, const bf16 *att, float scale, int rows, int T)
{
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows)
        return;
    const int t = row % T;
    bf16 *d = datt + (size_t)row * T;
    const bf16 *a = att + (size_t)row * T;
    float s = 0;
    for (int j = lane; j <= t; j += 32)
        s += ld(&a[j]) * ld(&d[j]);
    s = warp_sum(s);
    for (int j = lane; j < T; j += 32)
        d[j] = j <= t ? bf(scale * ld(&a[j]) * (ld(&d[j]) - s)) : bf(0.f);
}

int batched(nn_cuda_t *h, bool ta, bool tb, int m, int n, int k, const void *A, int lda,
            long long sa, const void *B, int ldb, long long sb, void *Cm, int ldc, long long sc,
            int count, bmt_error_t *err)
{
    const float one = 1.0f, zero = 0.0f;
    return blas_ok(cublasGemmStridedBatchedEx(
                       h->blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m,
                       n, k, &one, A, CUDA_R_16BF, lda, sa, B, CUDA_R_16BF, ldb, sb, &zero, Cm,
                       CUDA_R_16BF, ldc, sc, count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   err, "cublasGemmStridedBatchedEx");
}

/* ------------------------------------------------------------ flash attention
 *
 * FlashAttention-2's algorithm: the (T,T) scores never reach device memory.
 * The forward keeps a running max and sum per row and saves LSE = max +
 * log(sum); the backward recomputes P = exp(scale S - LSE) and runs as two
 * kernels, one over key tiles (dK, dV) and one over query tiles (dQ), so that
 * nothing is accumulated with atomics: fixed order, the same bits every run.
 * Head sizes 16, 32, 64 and 128 (nn_cuda_flash_*); GPT-2's attention
 * (nn_cuda_attention_*) takes the materialized path above for sizes other
 * than 16, 32 and 64. (A first version with WMMA fragments, whose opaque layout forced the
 * scores through shared memory, ran slower than the materialized path: see
 * bench/NOTES.md.)
 */
#define FA_ROWS 64 /* rows of the tiles a block walks */

/* Dd (B,NH,T) = rowsum(dout * out) per head, from (B,T,C) layouts: each
 * thread takes 8 elements (16 bytes), the D / 8 lanes of a (b, t, head) row
 * are adjacent and sum by shuffles. chunks = B T C / 8. */
template <int D>
__global__ void flash_bwd_dot(float *Dd, const bf16 *dout, const bf16 *out, size_t chunks, int T,
                              int NH)
{
    constexpr int P = D / 8;
    const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    float s = 0.f;
    if (i < chunks) {
        const uint4 a = reinterpret_cast<const uint4 *>(dout)[i];
        const uint4 b = reinterpret_cast<const uint4 *>(out)[i];
        const bf16 *x = reinterpret_cast<const bf16 *>(&a), *y = reinterpret_cast<const bf16 *>(&b);
#pragma unroll
        for (int e = 0; e < 8; e++)
            s += __bfloat162float(x[e]) * __bfloat162float(y[e]);
    }
#pragma unroll
    for (int o = P / 2; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    if (i < chunks && i % P == 0) {
        const size_t row = i / P, bt = row / NH, b = bt / T, t = bt % T; /* row: (b, t, head) */
        Dd[(b * NH + row % NH) * T + t] = s;
    }
}

bool flash_ok(int hs) { return hs == 16 || hs == 32 || hs == 64; }

/* ------------------------------------------------------------ flash attention, mma.sync
 *
 * The kernels use PTX mma.m16n8k16 (bf16 in, f32 accumulators), whose
 * fragment layouts are documented, so that scores, probabilities and output
 * accumulators stay in registers: the accumulator fragments of two adjacent
 * 8-column score tiles are, packed to bf16, exactly the A fragment of the next
 * product (FlashAttention-2's arrangement). The kernels read q, k and v where
 * they lie in the (B,T,3C) output of c_attn and write out (B,T,C) and dq, dk,
 * dv into (B,T,3C) directly (rows 3C or C apart): no permutes to and from a
 * head-major layout. Tiles reach shared memory (rows padded by 8 elements,
 * conflict-free) through cp.async, two stages deep, so the next tile's loads
 * run under the current tile's mma work; operands leave it through ldmatrix
 * (.x4, and .trans for a tile read along its other dimension). The forward
 * and dQ blocks own 128 rows (8 warps, two blocks per SM) so each K/V tile
 * feeds twice the work; the dK/dV blocks own 64 keys (4 warps: they hold the
 * most registers; three blocks per SM). Softmax works in base 2: the
 * forward keeps the maxima of the raw scores (the scale is positive), so each
 * probability is one FFMA and one MUFU.EX2 (ex2f), and the backward's P is
 * the same from the saved log-sum-exp, kept in f32 up to the products. Only
 * tiles that cross the diagonal or T are masked (to -inf, whose ex2 is 0);
 * the ALU work per score was what bounded these kernels (ncu, bench/NOTES.md).
 * bench/NOTES.md has what each of these bought.
 *
 * The grids are (columns, tiles): blockIdx.x a (batch, head) pair, blockIdx.y
 * the tile. The device dispatches blocks in the order of their linear index,
 * so every column's longest block starts first, then every column's next
 * longest, and so on (longest processing time first), and the last blocks to
 * start are short ones. Tile-major grids started each column's short blocks
 * before the next column's long ones and ended on a tail of long blocks:
 * 10-15% of each kernel at the Llama shapes (bench/NOTES.md, session 21).
 * mfa_grid makes every such grid.
 *
 * Grouped-query attention (nn_cuda_flash_*: the Llama family) reads the same
 * packed rows with NH query heads, then NKV key and NKV value heads
 * (mfa_locate); GPT-2's qkv is the case NKV = NH. The forward and dQ blocks
 * own one query head's rows and read its kv head's tiles; a dK/dV block owns
 * one kv head's keys and walks the query tiles of each of its NH / NKV query
 * heads in turn, so the group's sums stay in registers, without atomics and
 * without K or V ever copied per query head. Head size 128 (Llama 3 8B, 3B)
 * runs these kernels with smaller blocks (mfa_cfg); GPT-2's attention
 * (nn_cuda_attention_*) keeps 16, 32 and 64 on this path and materializes
 * the scores for other sizes.
 */
#define LOG2E_F 1.4426950408889634f
#define LN2_F 0.6931471805599453f

/* The grid of a flash kernel: cols (batch, head) columns in x, the tiles of
 * `rows` rows that cover T in y (the order is the comment's above). */
static inline dim3 mfa_grid(int cols, int T, int rows)
{
    return dim3((unsigned)cols, (unsigned)((T + rows - 1) / rows));
}

__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack2(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* 2^x as one MUFU.EX2: results below 2^-126 flush to zero, which a softmax
 * weight (at most 1, summed with others of at most 1) cannot notice; exp2f
 * spends three more instructions per call keeping them. ex2(-inf) = 0. */
__device__ __forceinline__ float ex2f(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* cp.async: 16 (or 4) bytes from global memory straight into shared memory,
 * without passing through registers; with valid false the bytes are zeros
 * and nothing is read (src must still be a mapped address). Groups of copies
 * are committed and waited for by count, so the next tile's loads run while
 * the block computes on the current one. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool valid)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(src),
                 "r"(valid ? 4 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

__device__ __forceinline__ void cp_wait_all()
{
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

/* Starts copying rows [r0, r0 + ROWS) of a (T, D) bf16 matrix whose rows lie
 * ld elements apart into smem (ld D + 8), zeros past T; NT threads take part
 * (the loop unrolls, so every thread's copies are in flight at once). */
template <int D, int ROWS, int NT>
__device__ __forceinline__ void mfa_load(bf16 *dst, const bf16 *src, int r0, int T, int ld)
{
    constexpr int LDH = D + 8, PER_ROW = D / 8, N = ROWS * PER_ROW;
#pragma unroll
    for (int it = 0; it < (N + NT - 1) / NT; it++) {
        const int i = (int)threadIdx.x + it * NT;
        if (N % NT == 0 || i < N) {
            const int r = i / PER_ROW, c = (i % PER_ROW) * 8;
            const bool in = r0 + r < T;
            cp_async16(dst + r * LDH + c, src + (size_t)(in ? r0 + r : 0) * ld + c, in);
        }
    }
}

/* ldmatrix: four (or two) 8x8 bf16 matrices, lanes 8m..8m+7 giving the row
 * addresses of matrix m; .trans hands out the transposed matrices. */
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const bf16 *p)
{
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const bf16 *p)
{
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* A fragments of the warp's 16 rows (from row wr) of a row-major tile, ld
 * LDH: per 16 columns one ldmatrix.x4 (matrices: rows 0-7 and 8-15 of
 * columns 0-7, then of columns 8-15, which is the a0..a3 order of mma). */
template <int D>
__device__ __forceinline__ void mfa_frag_a(uint32_t f[D / 16][4], const bf16 *tile, int wr,
                                           int lane)
{
    constexpr int LDH = D + 8;
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++)
        ldsm_x4(f[kc], tile + (wr + (lane & 15)) * LDH + kc * 16 + (lane >> 4) * 8);
}

/* s (16 x 64 per row block) = A (fragments, 16 x D) x B^T with B a row-major
 * (64 x D) tile, ld LDH, for RB blocks of 16 rows at once: each B fragment is
 * loaded once for all of them (a warp of 32 rows reads the tile from shared
 * memory half as often per product as one of 16). The B fragment of (8 rows,
 * 16 columns) is two 8x8 matrices as they lie, so one ldmatrix.x4 gives two of
 * them: two column chunks (D >= 32) or, for D 16, two 8-row tiles. */
template <int D, int RB>
__device__ __forceinline__ void mfa_abt_n(float (*s)[8][4], const uint32_t (*a)[D / 16][4],
                                          const bf16 *B, int lane)
{
    constexpr int LDH = D + 8;
#pragma unroll
    for (int rb = 0; rb < RB; rb++)
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
            s[rb][nt][0] = s[rb][nt][1] = s[rb][nt][2] = s[rb][nt][3] = 0.f;
    if constexpr (D == 16) {
#pragma unroll
        for (int nt = 0; nt < 8; nt += 2) {
            uint32_t b[4];
            ldsm_x4(b, B + ((nt + (lane >> 4)) * 8 + (lane & 7)) * LDH + ((lane >> 3) & 1) * 8);
#pragma unroll
            for (int rb = 0; rb < RB; rb++) {
                mma16816(s[rb][nt], a[rb][0], b[0], b[1]);
                mma16816(s[rb][nt + 1], a[rb][0], b[2], b[3]);
            }
        }
    } else {
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int kc = 0; kc < D / 16; kc += 2) {
                uint32_t b[4];
                ldsm_x4(b, B + (nt * 8 + (lane & 7)) * LDH + kc * 16 + (lane >> 3) * 8);
#pragma unroll
                for (int rb = 0; rb < RB; rb++) {
                    mma16816(s[rb][nt], a[rb][kc], b[0], b[1]);
                    mma16816(s[rb][nt], a[rb][kc + 1], b[2], b[3]);
                }
            }
    }
}

template <int D>
__device__ __forceinline__ void mfa_abt(float s[8][4], const uint32_t a[D / 16][4], const bf16 *B,
                                        int lane)
{
    mfa_abt_n<D, 1>(reinterpret_cast<float(*)[8][4]>(s),
                    reinterpret_cast<const uint32_t(*)[D / 16][4]>(a), B, lane);
}

/* The score fragments of one row block (16 x 64, f32) rounded to bf16 pairs
 * in the order of mma's A fragments: p[kc] holds keys 16 kc .. 16 kc + 15. */
__device__ __forceinline__ void mfa_pack_p(uint32_t p[4][4], const float s[8][4])
{
#pragma unroll
    for (int kc = 0; kc < 4; kc++) {
        p[kc][0] = pack2(s[2 * kc][0], s[2 * kc][1]);
        p[kc][1] = pack2(s[2 * kc][2], s[2 * kc][3]);
        p[kc][2] = pack2(s[2 * kc + 1][0], s[2 * kc + 1][1]);
        p[kc][3] = pack2(s[2 * kc + 1][2], s[2 * kc + 1][3]);
    }
}

/* o (16 x D per row block) += P (16 x 64, packed by mfa_pack_p) x B, B a
 * row-major (64 x D) tile, ld LDH, for RB row blocks sharing each B fragment:
 * the B fragments are transposed 8x8 matrices, two column chunks per
 * ldmatrix.x4.trans. */
template <int D, int RB>
__device__ __forceinline__ void mfa_pv_n(float (*o)[D / 8][4], const uint32_t (*p)[4][4],
                                         const bf16 *B, int lane)
{
    constexpr int LDH = D + 8;
#pragma unroll
    for (int kc = 0; kc < 4; kc++)
#pragma unroll
        for (int dn = 0; dn < D / 8; dn += 2) {
            uint32_t b[4];
            ldsm_x4_t(b, B + (kc * 16 + (lane & 15)) * LDH + (dn + (lane >> 4)) * 8);
#pragma unroll
            for (int rb = 0; rb < RB; rb++) {
                mma16816(o[rb][dn], p[rb][kc], b[0], b[1]);
                mma16816(o[rb][dn + 1], p[rb][kc], b[2], b[3]);
            }
        }
}

template <int D>
__device__ __forceinline__ void mfa_pv(float o[D / 8][4], const float s[8][4], const bf16 *B,
                                       int lane)
{
    uint32_t p[1][4][4];
    mfa_pack_p(p[0], s);
    mfa_pv_n<D, 1>(reinterpret_cast<float(*)[D / 8][4]>(o), p, B, lane);
}

/* Rows row0 and row0 + 8 of the warp's 16 x D accumulator fragments, scaled by
 * f0 and f1, rounded to bf16 into dst (T rows of D, ld elements apart); rows
 * from T on are not written. */
template <int D>
__device__ __forceinline__ void mfa_store(bf16 *dst, const float acc[D / 8][4], int row0, float f0,
                                          float f1, int T, int t, int ld)
{
#pragma unroll
    for (int dn = 0; dn < D / 8; dn++) {
        const int col = dn * 8 + 2 * t;
        if (row0 < T)
            *reinterpret_cast<uint32_t *>(dst + (size_t)row0 * ld + col) =
                pack2(acc[dn][0] * f0, acc[dn][1] * f0);
        if (row0 + 8 < T)
            *reinterpret_cast<uint32_t *>(dst + (size_t)(row0 + 8) * ld + col) =
                pack2(acc[dn][2] * f1, acc[dn][3] * f1);
    }
}

/* The causal mask on a warp's 16 x 64 score fragments (rows row0 and row0 + 8,
 * column c of fragment (nt, e) is col0 + nt * 8 + (e & 1)): -inf where the
 * column is after the row or the row is past T. */
__device__ __forceinline__ void mfa_mask(float s[8][4], int col0, int row0, int T)
{
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int col = col0 + nt * 8 + (e & 1), row = e < 2 ? row0 : row0 + 8;
            if (!(col <= row && row < T))
                s[nt][e] = -INFINITY;
        }
}

/* Starts the copies of the K/V tile from row r0 into the stage at KV (K, then
 * V FA_ROWS (D + 8) elements after it). */
template <int D, int NT>
__device__ __forceinline__ void mfa_kv_load(bf16 *KV, const bf16 *k, const bf16 *v, int r0, int T,
                                            int ld)
{
    mfa_load<D, FA_ROWS, NT>(KV, k, r0, T, ld);
    mfa_load<D, FA_ROWS, NT>(KV + FA_ROWS * (D + 8), v, r0, T, ld);
    cp_commit();
}

/* One tile's step of the online softmax for a warp's 16 rows (rows g and
 * g + 8 of the mma fragments; s: the raw scores of NT x 8 keys, masked): the
 * running maxima m of the raw scores (scale > 0 keeps the order) and sums l
 * move on, s becomes the probabilities ex2(s sl2 - m sl2), and a gets the
 * factors that rescale what was accumulated before (row g, row g + 8). */
template <int NT>
__device__ __forceinline__ void mfa_softmax_step(float s[NT][4], float m[2], float l[2], float a[2],
                                                 float sl2)
{
    float mx0 = m[0], mx1 = m[1];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
        mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    /* a row with no key yet keeps offset 0: its p = ex2(-inf) = 0 */
    const float f0 = mx0 == -INFINITY ? 0.f : -mx0 * sl2;
    const float f1 = mx1 == -INFINITY ? 0.f : -mx1 * sl2;
    const float a0 = ex2f(fmaf(m[0], sl2, f0)), a1 = ex2f(fmaf(m[1], sl2, f1));
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        s[nt][0] = ex2f(fmaf(s[nt][0], sl2, f0));
        s[nt][1] = ex2f(fmaf(s[nt][1], sl2, f0));
        s[nt][2] = ex2f(fmaf(s[nt][2], sl2, f1));
        s[nt][3] = ex2f(fmaf(s[nt][3], sl2, f1));
        sum0 += s[nt][0] + s[nt][1];
        sum1 += s[nt][2] + s[nt][3];
    }
    sum0 += __shfl_xor_sync(0xffffffffu, sum0, 1);
    sum0 += __shfl_xor_sync(0xffffffffu, sum0, 2);
    sum1 += __shfl_xor_sync(0xffffffffu, sum1, 1);
    sum1 += __shfl_xor_sync(0xffffffffu, sum1, 2);
    l[0] = l[0] * a0 + sum0, l[1] = l[1] * a1 + sum1;
    m[0] = mx0, m[1] = mx1;
    a[0] = a0, a[1] = a1;
}

/* o's rows g (factor a[0]) and g + 8 (a[1]) rescaled */
template <int D> __device__ __forceinline__ void mfa_rescale(float o[D / 8][4], const float a[2])
{
#pragma unroll
    for (int dn = 0; dn < D / 8; dn++) {
        o[dn][0] *= a[0], o[dn][1] *= a[0];
        o[dn][2] *= a[1], o[dn][3] *= a[1];
    }
}

/* One 64-key tile's step (mfa_softmax_step), the accumulator o rescaled,
 * and p gets the probabilities packed as mma A fragments (mfa_pack_p). */
template <int D>
__device__ __forceinline__ void mfa_online_softmax(float s[8][4], float m[2], float l[2],
                                                   float o[D / 8][4], uint32_t p[4][4], float sl2)
{
    float a[2];
    mfa_softmax_step<8>(s, m, l, a, sl2);
    mfa_rescale<D>(o, a);
    mfa_pack_p(p, s); /* the f32 scores die here */
}

/* Rows row0 and row0 + 8 of a finished forward: the output (o / l) and the
 * log-sum-exp of each row (natural log), rows from T on not written. */
template <int D>
__device__ __forceinline__ void mfa_fwd_finish(bf16 *out, float *lse, const float o[D / 8][4],
                                               const float m[2], const float l[2], int row0, int T,
                                               int t, int C, float sl2)
{
    const float i0 = l[0] > 0.f ? 1.f / l[0] : 0.f, i1 = l[1] > 0.f ? 1.f / l[1] : 0.f;
    mfa_store<D>(out, o, row0, i0, i1, T, t, C);
    if (t == 0) {
        if (row0 < T)
            lse[row0] = (m[0] * sl2 + log2f(l[0])) * LN2_F;
        if (row0 + 8 < T)
            lse[row0 + 8] = (m[1] * sl2 + log2f(l[1])) * LN2_F;
    }
}

/* The shape of the kernels per head size: warps per block and row blocks of
 * 16 per warp (forward), blocks per SM the registers must allow, and whether
 * a warp keeps its own rows' A fragments in registers for the whole walk
 * (KEEP) or reloads them from shared memory for each tile. Head size 128
 * holds twice the accumulators: its blocks are smaller (64 rows) and reload
 * the fragments, so that no kernel spills (dK/dV would need ~256 registers
 * as head size 64 arranges them). */
template <int D> struct mfa_cfg {
    static constexpr int W_FWD = 4, RB_FWD = D == 128 ? 1 : 2, MINB_FWD = 2;
    static constexpr int W_DKDV = 4, MINB_DKDV = D == 128 ? 2 : 3;
    static constexpr int W_DQ = D == 128 ? 4 : 8, MINB_DQ = 2;
    static constexpr bool KEEP = D <= 64;
};

/* Where a (batch, query head) pair's q, k and v start in a packed qkv of rows
 * LDI = (NH + 2 NKV) D apart: query heads, then key heads, then value heads;
 * query head hq reads kv head hq / (NH / NKV). GPT-2's c_attn output is the
 * case NKV = NH. */
struct mfa_heads {
    const bf16 *q, *k, *v;
};
__device__ __forceinline__ mfa_heads mfa_locate(const bf16 *qkv, int b, int hq, int T, int NH,
                                                int NKV, int D)
{
    const int LDI = (NH + 2 * NKV) * D;
    const bf16 *base = qkv + (size_t)b * T * LDI;
    const bf16 *k = base + (NH + hq / (NH / NKV)) * D;
    return { base + hq * D, k, k + NKV * D };
}

/* Blocks of W warps own 16 W rows of their side (queries, or keys for dK/dV;
 * the forward: 16 RB rows per warp) and walk 64-row tiles of the other side,
 * two stages deep: the copies of tile j + 1 are in flight while the block
 * computes on tile j, and one barrier per tile both publishes tile j + 1 and
 * frees tile j's stage. A warp skips the mma work of a tile that lies wholly
 * above the diagonal for its rows; tiles wholly below it skip the mask. */
template <int D, int W, int RB, int MINB>
__global__ void __launch_bounds__(W * 32, MINB)
    mfa_fwd(bf16 *out, float *lse, const bf16 *qkv, int T, int NH, int NKV, float scale)
{
    constexpr int LDH = D + 8, WR = 16 * RB, QR = W * WR, NT = W * 32, TILE = FA_ROWS * LDH;
    extern __shared__ __align__(128) unsigned char fa_sh[];
    bf16 *Qs = (bf16 *)fa_sh, *KV = Qs + QR * LDH; /* stage s: K at KV + 2s TILE, V after it */
    const int tile = gridDim.y - 1 - blockIdx.y;   /* the longest rows first (mfa_grid) */
    const int bh = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t = lane & 3, r0 = tile * QR, wr = warp * WR;
    const int C = NH * D, LDI = (NH + 2 * NKV) * D;
    const mfa_heads hp = mfa_locate(qkv, bh / NH, bh % NH, T, NH, NKV, D);
    const bf16 *q = hp.q, *k = hp.k, *v = hp.v;
    const float sl2 = scale * LOG2E_F;
    const int jmax = min(r0 + QR - 1, T - 1) / FA_ROWS;
    mfa_load<D, QR, NT>(Qs, q, r0, T, LDI);
    mfa_load<D, FA_ROWS, NT>(KV, k, 0, T, LDI);
    mfa_load<D, FA_ROWS, NT>(KV + TILE, v, 0, T, LDI);
    cp_commit();
    cp_wait_all();
    __syncthreads();
    uint32_t qf[RB][D / 16][4];
    float o[RB][D / 8][4], m[RB][2], l[RB][2];
#pragma unroll
    for (int rb = 0; rb < RB; rb++) {
        mfa_frag_a<D>(qf[rb], Qs, wr + 16 * rb, lane);
#pragma unroll
        for (int dn = 0; dn < D / 8; dn++)
            o[rb][dn][0] = o[rb][dn][1] = o[rb][dn][2] = o[rb][dn][3] = 0.f;
        m[rb][0] = m[rb][1] = -INFINITY;
        l[rb][0] = l[rb][1] = 0.f;
    }
    for (int j = 0; j <= jmax; j++) {
        const int c0 = j * FA_ROWS;
        const bf16 *Ks = KV + (j & 1) * 2 * TILE, *Vs = Ks + TILE;
        if (j < jmax) /* the next tile into the other stage */
            mfa_kv_load<D, NT>(KV + ((j + 1) & 1) * 2 * TILE, k, v, c0 + FA_ROWS, T, LDI);
        /* skipped when every key of the tile is after every row of the warp */
        if (r0 + wr + WR - 1 >= c0 && r0 + wr < T) {
            float s[RB][8][4];
            uint32_t p[RB][4][4];
            mfa_abt_n<D, RB>(s, qf, Ks, lane);
            const bool masked = !(c0 + FA_ROWS - 1 <= r0 + wr && r0 + wr + WR - 1 < T);
#pragma unroll
            for (int rb = 0; rb < RB; rb++) {
                if (masked) /* masked: p = ex2(-inf) = 0 */
                    mfa_mask(s[rb], c0 + 2 * t, r0 + wr + 16 * rb + g, T);
                mfa_online_softmax<D>(s[rb], m[rb], l[rb], o[rb], p[rb], sl2);
            }
            mfa_pv_n<D, RB>(o, p, Vs, lane);
        }
        cp_wait_all();
        __syncthreads();
    }
#pragma unroll
    for (int rb = 0; rb < RB; rb++)
        mfa_fwd_finish<D>(out + (size_t)(bh / NH) * T * C + (bh % NH) * D, lse + (size_t)bh * T,
                          o[rb], m[rb], l[rb], r0 + wr + 16 * rb + g, T, t, C, sl2);
}

/* Starts copying a query tile's Q and dO rows and its LSE and D values into one stage */
template <int D, int NT>
__device__ __forceinline__ void mfa_load_qtile(bf16 *Qs, float *ls, const bf16 *q, const bf16 *dout,
                                               const float *lse, const float *Dd, int r0, int T,
                                               int ldq, int ldo)
{
    mfa_load<D, FA_ROWS, NT>(Qs, q, r0, T, ldq);
    mfa_load<D, FA_ROWS, NT>(Qs + FA_ROWS * (D + 8), dout, r0, T, ldo);
    for (int x = threadIdx.x; x < FA_ROWS; x += NT) {
        const bool in = r0 + x < T;
        cp_async4(ls + x, lse + (in ? r0 + x : 0), in);
        cp_async4(ls + FA_ROWS + x, Dd + (in ? r0 + x : 0), in);
    }
}

/* The backward's tiles of S^T (keys x queries; rows key0 and key0 + 8 of the
 * warp, column c of fragment (nt, e) is query q0 + nt * 8 + (e & 1), q0 =
 * the tile's first query + 2 t): the causal mask, -inf where the query is
 * before the key or past T. */
__device__ __forceinline__ void mfa_mask_t(float s[8][4], int q0, int key0, int T)
{
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int query = q0 + nt * 8 + (e & 1);
            if (!(query < T && (e < 2 ? key0 : key0 + 8) <= query))
                s[nt][e] = -INFINITY;
        }
}

/* P^T = ex2(S^T sl2 - lse[query] log2 e) in place, for the queries of a tile
 * whose log-sum-exp values are lse2[0..63]; in f32. */
__device__ __forceinline__ void mfa_p_t(float s[8][4], const float *lse2, int t, float sl2)
{
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            s[nt][e] = ex2f(fmaf(s[nt][e], sl2, -lse2[nt * 8 + 2 * t + (e & 1)] * LOG2E_F));
}

/* dP^T := P^T (dP^T - D[query]) (dS^T without the scale), D of the tile's
 * queries in Ds[0..63]. */
__device__ __forceinline__ void mfa_ds_t(float dp[8][4], const float p[8][4], const float *Ds,
                                         int t)
{
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dp[nt][e] = p[nt][e] * (dp[nt][e] - Ds[nt * 8 + 2 * t + (e & 1)]);
}

/* P = ex2(S sl2 - ls) in place for a warp's two query rows (ls: the rows'
 * log-sum-exp times log2 e). */
__device__ __forceinline__ void mfa_p_rows(float s[8][4], float ls0, float ls1, float sl2)
{
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            s[nt][e] = ex2f(fmaf(s[nt][e], sl2, e < 2 ? -ls0 : -ls1));
}

/* dS (without the scale) into p: P (dP - D of the row). */
__device__ __forceinline__ void mfa_ds_rows(float p[8][4], const float dp[8][4], float D0, float D1)
{
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            p[nt][e] *= dp[nt][e] - (e < 2 ? D0 : D1);
}

/* dK, dV of 16 W keys of one kv head, over the 64-row query tiles at or
 * below them of every query head that reads it (NH / NKV of them, one after
 * the other in the same two-stage walk): the sums over the group stay in
 * registers, in a fixed order. */
template <int D, int W, int MINB, bool KEEP>
__global__ void __launch_bounds__(W * 32, MINB)
    mfa_bwd_dkdv(bf16 *dqkv, const bf16 *qkv, const bf16 *dout, const float *lse, const float *Dd,
                 int T, int NH, int NKV, float scale)
{
    constexpr int LDH = D + 8, KR = W * 16, NT = W * 32, TILE = FA_ROWS * LDH;
    extern __shared__ __align__(128) unsigned char fa_sh[];
    /* the block's K and V rows, then two stages of (Q tile, dO tile), then
     * two stages of (LSE, D) */
    bf16 *Kr = (bf16 *)fa_sh, *Vr = Kr + KR * LDH, *QD = Vr + KR * LDH;
    float *LD = (float *)(QD + 4 * TILE);
    const int tile = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = blockIdx.x / NKV, hk = blockIdx.x % NKV, G = NH / NKV;
    const int g = lane >> 2, t = lane & 3, c0 = tile * KR, wr = warp * 16;
    const int C = NH * D, LDI = (NH + 2 * NKV) * D;
    const mfa_heads hp = mfa_locate(qkv, b, hk * G, T, NH, NKV, D);
    const bf16 *k = hp.k, *v = hp.v;
    const int i0 = c0 / FA_ROWS, qtiles = (T + FA_ROWS - 1) / FA_ROWS, n = qtiles - i0;
    const float sl2 = scale * LOG2E_F;
    const int key0 = c0 + wr + g;
    /* step `it` of the walk: query head hk G + it / n, query tile i0 + it % n */
    auto load_step = [&](int it, bf16 *Qst, float *Lst) {
        const int hq = hk * G + it / n;
        const size_t lb = ((size_t)b * NH + hq) * T;
        mfa_load_qtile<D, NT>(Qst, Lst, hp.q + (size_t)(it / n) * D,
                              dout + (size_t)b * T * C + (size_t)hq * D, lse + lb, Dd + lb,
                              (i0 + it % n) * FA_ROWS, T, LDI, C);
    };
    mfa_load<D, KR, NT>(Kr, k, c0, T, LDI);
    mfa_load<D, KR, NT>(Vr, v, c0, T, LDI);
    load_step(0, QD, LD);
    cp_commit();
    cp_wait_all();
    __syncthreads();
    uint32_t kf[KEEP ? D / 16 : 1][4], vf[KEEP ? D / 16 : 1][4];
    if constexpr (KEEP) {
        mfa_frag_a<D>(kf, Kr, wr, lane);
        mfa_frag_a<D>(vf, Vr, wr, lane);
    }
    float dkacc[D / 8][4], dvacc[D / 8][4];
#pragma unroll
    for (int dn = 0; dn < D / 8; dn++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dkacc[dn][e] = dvacc[dn][e] = 0.f;
    for (int it = 0; it < G * n; it++) {
        const int r0 = (i0 + it % n) * FA_ROWS, st = it & 1;
        const bf16 *Qs = QD + st * 2 * TILE, *dOs = Qs + TILE;
        const float *lse2 = LD + st * 2 * FA_ROWS, *Ds = lse2 + FA_ROWS;
        if (it + 1 < G * n) {
            load_step(it + 1, QD + (st ^ 1) * 2 * TILE, LD + (st ^ 1) * 2 * FA_ROWS);
            cp_commit();
        }
        /* skipped when every key of the warp is after every query of the tile */
        if (c0 + wr < T && c0 + wr <= r0 + FA_ROWS - 1) {
            float s[8][4], dp[8][4];
            if constexpr (KEEP) {
                mfa_abt<D>(s, kf, Qs, lane); /* S^T: keys x queries */
            } else {
                uint32_t f[D / 16][4];
                mfa_frag_a<D>(f, Kr, wr, lane);
                mfa_abt<D>(s, f, Qs, lane);
            }
            if (!(c0 + wr + 15 <= r0 && r0 + FA_ROWS - 1 < T)) /* masked: P = ex2(-inf) = 0 */
                mfa_mask_t(s, r0 + 2 * t, key0, T);
            mfa_p_t(s, lse2, t, sl2);
            mfa_pv<D>(dvacc, s, dOs, lane); /* dV += P^T dO */
            if constexpr (KEEP) {
                mfa_abt<D>(dp, vf, dOs, lane); /* dP^T = V dO^T */
            } else {
                uint32_t f[D / 16][4];
                mfa_frag_a<D>(f, Vr, wr, lane);
                mfa_abt<D>(dp, f, dOs, lane);
            }
            mfa_ds_t(dp, s, Ds, t);
            mfa_pv<D>(dkacc, dp, Qs, lane); /* dK += dS^T Q */
        }
        cp_wait_all();
        __syncthreads();
    }
    bf16 *dk = dqkv + (k - qkv), *dv = dqkv + (v - qkv);
    mfa_store<D>(dk, dkacc, key0, scale, scale, T, t, LDI);
    mfa_store<D>(dv, dvacc, key0, 1.f, 1.f, T, t, LDI);
}

/* dQ of 16 W queries, over the 64-row key tiles at or below them. */
template <int D, int W, int MINB, bool KEEP>
__global__ void __launch_bounds__(W * 32, MINB)
    mfa_bwd_dq(bf16 *dqkv, const bf16 *qkv, const bf16 *dout, const float *lse, const float *Dd,
               int T, int NH, int NKV, float scale)
{
    constexpr int LDH = D + 8, QR = W * 16, NT = W * 32, TILE = FA_ROWS * LDH;
    extern __shared__ __align__(128) unsigned char fa_sh[];
    /* the block's Q and dO rows, then two stages of (K tile, V tile) */
    bf16 *Qr = (bf16 *)fa_sh, *Dr = Qr + QR * LDH, *KV = Dr + QR * LDH;
    const int tile = gridDim.y - 1 - blockIdx.y;
    const int bh = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t = lane & 3, r0 = tile * QR, wr = warp * 16;
    const int C = NH * D, LDI = (NH + 2 * NKV) * D;
    const mfa_heads hp = mfa_locate(qkv, bh / NH, bh % NH, T, NH, NKV, D);
    const bf16 *q = hp.q, *k = hp.k, *v = hp.v;
    const int row0 = r0 + wr + g, row1 = row0 + 8;
    const float sl2 = scale * LOG2E_F;
    const int jmax = min(r0 + QR - 1, T - 1) / FA_ROWS;
    mfa_load<D, QR, NT>(Qr, q, r0, T, LDI);
    mfa_load<D, QR, NT>(Dr, dout + (size_t)(bh / NH) * T * C + (bh % NH) * D, r0, T, C);
    mfa_load<D, FA_ROWS, NT>(KV, k, 0, T, LDI);
    mfa_load<D, FA_ROWS, NT>(KV + TILE, v, 0, T, LDI);
    cp_commit();
    cp_wait_all();
    __syncthreads();
    uint32_t qf[KEEP ? D / 16 : 1][4], df[KEEP ? D / 16 : 1][4];
    if constexpr (KEEP) {
        mfa_frag_a<D>(qf, Qr, wr, lane);
        mfa_frag_a<D>(df, Dr, wr, lane);
    }
    const float ls0 = row0 < T ? lse[(size_t)bh * T + row0] * LOG2E_F : 0.f;
    const float ls1 = row1 < T ? lse[(size_t)bh * T + row1] * LOG2E_F : 0.f;
    const float D0 = row0 < T ? Dd[(size_t)bh * T + row0] : 0.f;
    const float D1 = row1 < T ? Dd[(size_t)bh * T + row1] : 0.f;
    float dqacc[D / 8][4];
#pragma unroll
    for (int dn = 0; dn < D / 8; dn++)
        dqacc[dn][0] = dqacc[dn][1] = dqacc[dn][2] = dqacc[dn][3] = 0.f;
    for (int j = 0; j <= jmax; j++) {
        const int c0 = j * FA_ROWS;
        const bf16 *Ks = KV + (j & 1) * 2 * TILE, *Vs = Ks + TILE;
        if (j < jmax) /* the next tile into the other stage */
            mfa_kv_load<D, NT>(KV + ((j + 1) & 1) * 2 * TILE, k, v, c0 + FA_ROWS, T, LDI);
        if (r0 + wr + 15 >= c0 && r0 + wr < T) {
            float s[8][4], dp[8][4];
            if constexpr (KEEP) {
                mfa_abt<D>(s, qf, Ks, lane);
            } else {
                uint32_t f[D / 16][4];
                mfa_frag_a<D>(f, Qr, wr, lane);
                mfa_abt<D>(s, f, Ks, lane);
            }
            if (!(c0 + FA_ROWS - 1 <= r0 + wr && r0 + wr + 15 < T))
                mfa_mask(s, c0 + 2 * t, row0, T); /* masked: p = ex2(-inf) = 0 */
            if constexpr (KEEP) {
                mfa_abt<D>(dp, df, Vs, lane); /* dP = dO V^T */
            } else {
                uint32_t f[D / 16][4];
                mfa_frag_a<D>(f, Dr, wr, lane);
                mfa_abt<D>(dp, f, Vs, lane);
            }
            mfa_p_rows(s, ls0, ls1, sl2);
            mfa_ds_rows(s, dp, D0, D1);
            mfa_pv<D>(dqacc, s, Ks, lane); /* dQ += dS K */
        }
        cp_wait_all();
        __syncthreads();
    }
    mfa_store<D>(dqkv + (q - qkv), dqacc, row0, scale, scale, T, t, LDI);
}

template <int D>
cudaError_t mfa_forward(cudaStream_t st, bf16 *out, float *lse, const bf16 *qkv, int B, int NH,
                        int NKV, int T, float scale)
{
    typedef mfa_cfg<D> K;
    constexpr int QR = K::W_FWD * 16 * K::RB_FWD;
    const size_t sm = (size_t)(QR + 4 * FA_ROWS) * (D + 8) * 2;
    auto kern = mfa_fwd<D, K::W_FWD, K::RB_FWD, K::MINB_FWD>;
    cudaError_t e =
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
    if (e != cudaSuccess)
        return e;
    kern<<<mfa_grid(B * NH, T, QR), K::W_FWD * 32, sm, st>>>(out, lse, qkv, T, NH, NKV, scale);
    return cudaGetLastError();
}

/* ------------------------------------------------- attention: Hopper's wgmma
 *
 * Flash attention for head sizes 64 and 128 on sm_90a (built with NN_WGMMA, run
 * where the device is compute capability 9.0), the mma.sync kernels'
 * arrangement with warpgroup products: a warpgroup (4 warps) owns 64 rows
 * (queries; keys in dK/dV) and takes S = Q K^T, O += P V and the backward's
 * products as wgmma instructions that read Q, K, V and dO straight from shared
 * memory, with no fragment loads through registers; P and dS go in from
 * registers (the accumulator's layout is mma's, so mfa_pack_p,
 * mfa_online_softmax and the backward's helpers serve both). Tiles lie in
 * shared memory as wgmma's 128-byte swizzle wants them: rows of 64 bf16 (128
 * bytes), 16-byte chunk c of row r at chunk c ^ (r % 8), each tile 1024-byte
 * aligned, 8-row groups 1024 bytes apart. An operand read along its rows is
 * K-major (Q and K in S = Q K^T); one read across them, as V in P V, is
 * MN-major (the instruction's transpose of B). Head size 128 keeps each tile
 * as two such 64-column halves (wg_load_d). bench/NOTES.md has the figures
 * (d48: forward 0.183 -> 0.152 ms, backward 0.470 -> 0.282; head 128 at the
 * Llama 3B shape: 1.36x and 1.80x the mma.sync kernels). */
#if defined(NN_WGMMA)
#define WG_Q 128 /* query rows per block: two warpgroups */

/* A shared-memory matrix descriptor, 128-byte swizzle: start address, leading
 * and stride byte offsets (each in 16-byte units). */
__device__ __forceinline__ uint64_t wg_desc(const void *p, uint32_t lbo, uint32_t sbo)
{
    const uint64_t a = (uint32_t)__cvta_generic_to_shared(p);
    return ((a & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) |
           (1ull << 62);
}

__device__ __forceinline__ void wg_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_wait0()
{
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
/* all but the last committed group complete (groups complete in order) */
__device__ __forceinline__ void wg_wait1()
{
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
}
/* Shared memory written by the threads (cp.async) made visible to wgmma,
 * which reads it through the async proxy. */
__device__ __forceinline__ void wg_fence_smem()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* Keeps the compiler from moving accesses of the accumulators across an
 * asynchronous product (they are in flight between issue and wait). */
__device__ __forceinline__ void wg_hold(float d[8][4])
{
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            asm volatile("" : "+f"(d[i][j])::"memory");
}

/* The 64 x 64 f32 accumulator of a warpgroup product as inline-asm operands
 * %0..%31 (per warp, mma's fragment layout: d[n8 block][4]). */
#define WG_ACC_REGS                                                                                \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "  \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_ACC_OUTS(d)                                                                             \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),      \
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),  \
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),  \
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),  \
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),  \
        "+f"(d[7][2]), "+f"(d[7][3])

/* d (64 x 64 per warpgroup) (+)= A x B^T: A and B K-major through
 * descriptors; acc 0: d = A B^T. */
__device__ __forceinline__ void wg_ss(float d[8][4], uint64_t da, uint64_t db, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_ACC_REGS
                 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : WG_ACC_OUTS(d)
                 : "l"(da), "l"(db), "r"(acc));
}

/* d += A x B: A from registers (mma's A fragments, 16 x 16 per warp), B (16 x
 * 64) MN-major through its descriptor. */
__device__ __forceinline__ void wg_rs_t(float d[8][4], const uint32_t a[4], uint64_t db)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_ACC_REGS
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : WG_ACC_OUTS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

/* Starts copying rows [r0, r0 + ROWS) of a (T, 64) bf16 matrix whose rows lie
 * ld elements apart into a swizzled tile (zeros past T); NT threads. */
template <int ROWS, int NT = 256>
__device__ __forceinline__ void wg_load(unsigned char *dst, const bf16 *src, int r0, int T, int ld)
{
#pragma unroll
    for (int it = 0; it < ROWS * 8 / NT; it++) {
        const int i = (int)threadIdx.x + it * NT, r = i >> 3, c = i & 7;
        const bool in = r0 + r < T;
        cp_async16(dst + r * 128 + ((c ^ (r & 7)) << 4),
                   src + (size_t)(in ? r0 + r : 0) * ld + c * 8, in);
    }
}

/* Head size D as D / 64 column halves: a (ROWS, D) tile lies in shared memory
 * as D / 64 swizzled (ROWS, 64) tiles, half h at h ROWS 128 bytes, so that
 * every product over D is the head size 64 product once per half (the
 * K-major operands' 16-column steps kc: half kc / 4, 32 bytes kc % 4 in; the
 * MN-major ones: one 64-column accumulator per half). */
template <int D, int ROWS, int NT = 256>
__device__ __forceinline__ void wg_load_d(unsigned char *dst, const bf16 *src, int r0, int T,
                                          int ld)
{
#pragma unroll
    for (int h = 0; h < D / 64; h++)
        wg_load<ROWS, NT>(dst + h * ROWS * 128, src + h * 64, r0, T, ld);
}

/* The descriptor of 16-column step kc of a K-major (ROWS, D) tile at p. */
template <int ROWS> __device__ __forceinline__ uint64_t wg_kstep(const unsigned char *p, int kc)
{
    return wg_desc(p + (kc >> 2) * ROWS * 128, 16, 1024) + 2 * (kc & 3);
}

/* d (64 x D, D / 64 accumulators of 64 columns) += A x B: A from registers
 * (16 keys' or queries' P, dS), B 16 rows of an MN-major (FA_ROWS, D) tile. */
template <int D>
__device__ __forceinline__ void wg_rs_d(float (*d)[4], const uint32_t a[4], const unsigned char *B,
                                        int kc)
{
#pragma unroll
    for (int h = 0; h < D / 64; h++)
        wg_rs_t(d + 8 * h, a, wg_desc(B + h * FA_ROWS * 128 + kc * 2048, 1024, 1024));
}

template <int D> __device__ __forceinline__ void wg_hold_d(float (*d)[4])
{
#pragma unroll
    for (int h = 0; h < D / 64; h++)
        wg_hold(d + 8 * h);
}

/* Starts the copies of the K/V tile of ROWS rows from row r0 into the stage
 * at KV (K, then V after it, swizzled) and commits them; 256 threads. */
template <int D, int ROWS = FA_ROWS>
__device__ __forceinline__ void wg_kv_load(unsigned char *KV, const bf16 *k, const bf16 *v, int r0,
                                           int T, int ld)
{
    wg_load_d<D, ROWS>(KV, k, r0, T, ld);
    wg_load_d<D, ROWS>(KV + D / 64 * ROWS * 128, v, r0, T, ld);
    cp_commit();
}

/* Tile j's stage of the two-stage K/V ring at KV (a K tile, then a V tile),
 * after starting to copy tile j + 1 into the other stage (none after jmax). */
template <int D>
__device__ __forceinline__ unsigned char *wg_kv_stage(unsigned char *KV, const bf16 *k,
                                                      const bf16 *v, int j, int jmax, int T, int ld)
{
    constexpr int STAGE = 2 * (D / 64) * FA_ROWS * 128;
    if (j < jmax)
        wg_kv_load<D>(KV + ((j + 1) & 1) * STAGE, k, v, (j + 1) * FA_ROWS, T, ld);
    return KV + (j & 1) * STAGE;
}

/* The copies started so far have landed and the warpgroups' products (the
 * async proxy) see them, in every thread of the block. */
__device__ __forceinline__ void wg_stage_ready()
{
    cp_wait_all();
    wg_fence_smem();
    __syncthreads();
}

/* Starts copying a query tile's Q and dO rows (swizzled) and its LSE and D
 * values into one stage; 128 threads. */
template <int D>
__device__ __forceinline__ void wg_load_qtile(unsigned char *Qs, float *ls, const bf16 *q,
                                              const bf16 *dout, const float *lse, const float *Dd,
                                              int r0, int T, int ldq, int ldo)
{
    wg_load_d<D, FA_ROWS, 128>(Qs, q, r0, T, ldq);
    wg_load_d<D, FA_ROWS, 128>(Qs + D / 64 * FA_ROWS * 128, dout, r0, T, ldo);
    const int x = threadIdx.x & (FA_ROWS - 1);
    const bool in = r0 + x < T;
    if (threadIdx.x < FA_ROWS)
        cp_async4(ls + x, lse + (in ? r0 + x : 0), in);
    else
        cp_async4(ls + FA_ROWS + x, Dd + (in ? r0 + x : 0), in);
}

/* ------------------------------------------------ head 64: TMA, mbarriers
 *
 * The head-64 forward (GPT-2's and Llama 1B's heads): blocks of two
 * warpgroups own 128 query rows (64 each) and walk 64-key tiles; a warpgroup
 * skips the tiles that lie wholly after its rows. The K/V tiles come through
 * a ring of TMA_NS stages filled by the TMA unit: thread 0 issues every copy
 * (a (64 rows, 64 columns) box of the (B, T, (NH + 2 NKV) 64) qkv tensor, in
 * the 128-byte swizzle the products read, rows past T zero-filled) TMA_DIST
 * tiles ahead, and mbarriers hand each stage over (full[s]: its bytes have
 * landed; empty[s]: the 8 warps are done with it), so no block-wide barrier
 * keeps the two warpgroups in step. Within a warpgroup, FlashAttention-3's
 * overlap: tile j's S = Q K_j^T and tile j - 1's O += P V_{j-1} are issued
 * together, and S_j's softmax runs while the tensor cores do P V_{j-1}.
 * 127 registers, 2 blocks per SM (83 KB of shared memory each). Measured
 * (twenty-eighth session, bench/NOTES.md, one H100): the Llama 1B shape's
 * forward 0.378 -> 0.350 ms, d48's 0.115 -> 0.100, against the cp.async
 * kernel with a barrier a tile it replaced. */
#define TMA_NS 4
#define TMA_DIST 2
#define WG_SMEM_TMA (WG_Q * 128 + TMA_NS * 2 * FA_ROWS * 128 + 1024 + 256)

__device__ __forceinline__ void mb_init(uint64_t *b, int count)
{
    asm volatile(
        "mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"((uint32_t)__cvta_generic_to_shared(b)),
        "r"(count)
        : "memory");
}
__device__ __forceinline__ void mb_expect_tx(uint64_t *b, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(b)),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mb_arrive(uint64_t *b)
{
    asm volatile(
        "mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"((uint32_t)__cvta_generic_to_shared(b))
        : "memory");
}
/* waits until the barrier's phase with this parity has completed */
__device__ __forceinline__ void mb_wait(uint64_t *b, uint32_t parity)
{
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(b);
    asm volatile("{\n.reg .pred p;\nWAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WAIT_%=;\n}\n" ::"r"(a),
                 "r"(parity)
                 : "memory");
}
/* one (64, 64) box at (column c, row r, batch b) of the map into dst, its
 * bytes counted on bar */
__device__ __forceinline__ void tma_box(unsigned char *dst, const CUtensorMap *map, int c, int r,
                                        int b, uint64_t *bar)
{
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
        "l"(map), "r"(c), "r"(r), "r"(b), "r"((uint32_t)__cvta_generic_to_shared(bar))
        : "memory");
}

/* mfa_mask through selects, no branch (it runs inside a product's window) */
__device__ __forceinline__ void mfa_mask_sel(float s[8][4], int col0, int row0, int T)
{
    const int lim0 = row0 < T ? row0 : -(1 << 30), lim1 = row0 + 8 < T ? row0 + 8 : -(1 << 30);
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int col = col0 + nt * 8 + (e & 1);
            s[nt][e] = col <= (e < 2 ? lim0 : lim1) ? s[nt][e] : -INFINITY;
        }
}
/* wg_hold for P's A fragments: an RS product reads them while in flight */
__device__ __forceinline__ void wg_hold_p(uint32_t p[4][4])
{
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            asm volatile("" : "+r"(p[i][j])::"memory");
}

__global__ void __launch_bounds__(256, 2)
    mfa_fwd_wg_tma(const __grid_constant__ CUtensorMap map, bf16 *out, float *lse, int T, int NH,
                   int NKV, float scale)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int D = 64, TILE = FA_ROWS * 128, STAGE = 2 * TILE, BOX = FA_ROWS * 128;
    extern __shared__ __align__(128) unsigned char wg_raw[];
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(wg_raw);
    unsigned char *Qs = wg_raw + ((1024 - (sa & 1023)) & 1023), *KV = Qs + WG_Q * 128;
    uint64_t *full = (uint64_t *)(KV + TMA_NS * STAGE), *empty = full + TMA_NS,
             *qbar = empty + TMA_NS;
    const int tile = gridDim.y - 1 - blockIdx.y; /* the longest rows first (mfa_grid) */
    const int bh = blockIdx.x, wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, r0 = tile * WG_Q;
    const int wr0 = r0 + wg * 64, row0 = wr0 + warp * 16 + g;
    const int C = NH * D, b = bh / NH, hq = bh % NH, kh = hq / (NH / NKV);
    const int kcol = (NH + kh) * D, vcol = (NH + NKV + kh) * D;
    const float sl2 = scale * LOG2E_F;
    const int jmax = min(r0 + WG_Q - 1, T - 1) / FA_ROWS;
    if (threadIdx.x == 0) {
        for (int s = 0; s < TMA_NS; s++)
            mb_init(full + s, 1), mb_init(empty + s, 8);
        mb_init(qbar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const bool q2 = r0 + 64 < T;
        mb_expect_tx(qbar, (q2 ? 2 : 1) * BOX);
        tma_box(Qs, &map, hq * D, r0, b, qbar);
        if (q2)
            tma_box(Qs + BOX, &map, hq * D, r0 + 64, b, qbar);
        for (int j = 0; j <= min(TMA_DIST - 1, jmax); j++) {
            mb_expect_tx(full + j, 2 * BOX);
            tma_box(KV + j * STAGE, &map, kcol, j * FA_ROWS, b, full + j);
            tma_box(KV + j * STAGE + TILE, &map, vcol, j * FA_ROWS, b, full + j);
        }
    }
    const unsigned char *Qw = Qs + wg * 64 * 128;
    float o[D / 8][4], m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.f, 0.f };
    uint32_t p[4][4]; /* tile j - 1's probabilities, in flight in its P V */
#pragma unroll
    for (int dn = 0; dn < D / 8; dn++)
        o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.f;
    mb_wait(qbar, 0);
    /* Tile j's stage, once landed, after thread 0 has started tile j + DIST's
     * copies. Nothing of this warpgroup's is in flight here: the branches on
     * threadIdx stay outside the products' windows (ptxas serializes every
     * wgmma of a kernel with a branch inside one). */
    auto stage = [&](int j) -> const unsigned char * {
        if (threadIdx.x == 0 && j + TMA_DIST <= jmax) {
            const int n = j + TMA_DIST, sn = n % TMA_NS;
            if (n >= TMA_NS) /* tile n - NS given back by both warpgroups */
                mb_wait(empty + sn, ((n - TMA_NS) / TMA_NS) & 1);
            mb_expect_tx(full + sn, 2 * BOX);
            tma_box(KV + sn * STAGE, &map, kcol, n * FA_ROWS, b, full + sn);
            tma_box(KV + sn * STAGE + TILE, &map, vcol, n * FA_ROWS, b, full + sn);
        }
        __syncwarp();
        mb_wait(full + j % TMA_NS, (j / TMA_NS) & 1); /* every warp, also one that skips it */
        __syncwarp();
        return KV + (j % TMA_NS) * STAGE;
    };
    /* Tiles j >= 1: S_j and P V_{j-1} issued together, S_j's softmax under
     * P V_{j-1}, then o rescaled and tile j - 1's stage given back. MASK: the
     * causal / T mask (tiles from jn on); the others have no branch inside. */
    auto step = [&](int j, auto maskc) {
        constexpr bool MASK = decltype(maskc)::value;
        const unsigned char *Ks = stage(j), *Vp = KV + ((j - 1) % TMA_NS) * STAGE + TILE;
        float s[8][4] = {}, a[2];
        wg_fence();
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++)
            wg_ss(s, wg_kstep<WG_Q>(Qw, kc), wg_kstep<FA_ROWS>(Ks, kc), kc);
        wg_commit();
#pragma unroll
        for (int kc = 0; kc < 4; kc++)
            wg_rs_d<D>(o, p[kc], Vp, kc);
        wg_commit();
        wg_wait1(); /* S_j is done; P V_{j-1} may still run */
        wg_hold(s);
        if constexpr (MASK)
            mfa_mask_sel(s, j * FA_ROWS + 2 * t, row0, T);
        mfa_softmax_step<8>(s, m, l, a, sl2);
        wg_wait0(); /* P V_{j-1} done: o and p are the threads' again */
        wg_hold_d<D>(o);
        wg_hold_p(p);
        mfa_rescale<D>(o, a);
        mfa_pack_p(p, s);
        __syncwarp();
        if (lane == 0) /* V_{j-1}'s stage read */
            mb_arrive(empty + (j - 1) % TMA_NS);
    };
    /* this warpgroup's last tile (the one with its last row; -1: no rows) and
     * its first masked one */
    const int jw = wr0 < T ? min(wr0 + 63, T - 1) / FA_ROWS : -1;
    const int jn = wr0 + 63 < T ? wr0 / FA_ROWS : 0;
    if (jw >= 0) {
        const unsigned char *Ks = stage(0);
        float s[8][4] = {}, a[2];
        wg_fence();
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++)
            wg_ss(s, wg_kstep<WG_Q>(Qw, kc), wg_kstep<FA_ROWS>(Ks, kc), kc);
        wg_commit();
        wg_wait0();
        wg_hold(s);
        if (jn == 0)
            mfa_mask(s, 2 * t, row0, T);
        mfa_softmax_step<8>(s, m, l, a, sl2); /* o is 0: nothing to rescale */
        mfa_pack_p(p, s);
        int j = 1;
        for (; j < jn; j++)
            step(j, std::false_type());
        for (; j <= jw; j++)
            step(j, std::true_type());
        const unsigned char *Vl = KV + (jw % TMA_NS) * STAGE + TILE; /* the last P V */
        wg_fence();
#pragma unroll
        for (int kc = 0; kc < 4; kc++)
            wg_rs_d<D>(o, p[kc], Vl, kc);
        wg_commit();
        wg_wait0();
        wg_hold_d<D>(o);
        __syncwarp();
        if (lane == 0)
            mb_arrive(empty + jw % TMA_NS);
    }
    for (int j = jw + 1; j <= jmax; j++) { /* after this warpgroup's rows: given back unread */
        stage(j);
        if (lane == 0)
            mb_arrive(empty + j % TMA_NS);
    }
    mfa_fwd_finish<D>(out + (size_t)b * T * C + hq * D, lse + (size_t)bh * T, o, m, l, row0, T, t,
                      C, sl2);
#else
    __trap(); /* a build whose image for this device lacks wgmma: fail, never return nothing */
#endif
}

/* The qkv tensor's map for mfa_fwd_wg_tma: (B, T, (NH + 2 NKV) 64) bf16,
 * (64, 64) boxes, 128-byte swizzle, rows past T read as zeros. */
static cudaError_t mfa_tma_map(CUtensorMap *map, const bf16 *qkv, int B, int T, int NH, int NKV)
{
    typedef CUresult (*encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                  const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                  const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                  CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    /* looked up once, by whichever thread comes first (a local static's
     * initialization is thread-safe); NULL where the driver lacks it */
    static const encode_fn encode = [] {
        void *f = NULL;
        cudaDriverEntryPointQueryResult q;
        return cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                cudaEnableDefault, &q) == cudaSuccess &&
                       q == cudaDriverEntryPointSuccess
                   ? (encode_fn)f
                   : (encode_fn)NULL;
    }();
    if (encode == NULL)
        return cudaErrorNotSupported;
    const cuuint64_t ldi = (cuuint64_t)(NH + 2 * NKV) * 64;
    const cuuint64_t dims[3] = { ldi, (cuuint64_t)T, (cuuint64_t)B };
    const cuuint64_t strides[2] = { ldi * 2, ldi * 2 * (cuuint64_t)T };
    const cuuint32_t box[3] = { 64, FA_ROWS, 1 }, estr[3] = { 1, 1, 1 };
    CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)qkv, dims, strides, box,
                        estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

/* ------------------------------------------------ head 128: 128 keys a step
 *
 * The head-128 forward takes 128 keys a step: S = Q K^T as m64n128k16 (a
 * warpgroup's 64 rows against 128 keys, 64 accumulators), P V over those 128
 * keys as eight 16-key steps of one m64n128k16 over the whole head (V read
 * MN-major across both swizzled halves: LBO is the distance between them).
 * Twice the work per instruction and per barrier of 64-key steps; 202
 * registers, one block per SM. Its K/V tiles come by cp.async into two stages
 * with a block barrier a tile (wg_kv_stage). Measured in the twenty-seventh
 * session (bench/NOTES.md): the Llama 3B shape's forward 0.561 -> 0.487 ms on
 * an H100 against 64-key steps, the step -1.2%. At head 64 the same
 * arrangement (one block per SM, or two at 128 registers) did not pay: head 64
 * takes mfa_fwd_wg_tma. */
#define KT128 128
#define WG_ACC128_REGS                                                                             \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "  \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "   \
    "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "   \
    "%56, %57, %58, %59, %60, %61, %62, %63}"
/* the 64 accumulators of an n128 product: two n64 ones' (d[0..7], d[8..15]) */
#define WG_ACC128_OUTS(d) WG_ACC_OUTS(d), WG_ACC_OUTS((d + 8))

/* wg_ss over 128 columns of B: d (64 x 128 per warpgroup) (+)= A x B^T */
__device__ __forceinline__ void wg_ss128(float d[16][4], uint64_t da, uint64_t db, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_ACC128_REGS
                 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WG_ACC128_OUTS(d)
                 : "l"(da), "l"(db), "r"(acc));
}

/* wg_rs_t over 128 columns of B: d (64 x 128) += A x B, B (16 x 128) MN-major */
__device__ __forceinline__ void wg_rs128_t(float d[16][4], const uint32_t a[4], uint64_t db)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_ACC128_REGS
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : WG_ACC128_OUTS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

/* wg_hold over an n128 product's 64 accumulators */
__device__ __forceinline__ void wg_hold16(float d[16][4])
{
    wg_hold(d);
    wg_hold(d + 8);
}

/* mfa_mask over 16 n8 blocks (128 columns) */
__device__ __forceinline__ void mfa_mask16(float s[16][4], int col0, int row0, int T)
{
    mfa_mask(s, col0, row0, T);
    mfa_mask(s + 8, col0 + 64, row0, T);
}

/* Q (WG_Q rows), two stages of K and V tiles of KT128 rows, alignment: 161 KiB */
#define WG_SMEM_K128(D) ((D) / 64 * (WG_Q * 128 + 4 * KT128 * 128) + 1024)
template <int D>
__global__ void __launch_bounds__(256, 1)
    mfa_fwd_wg_k128(bf16 *out, float *lse, const bf16 *qkv, int T, int NH, int NKV, float scale)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(D == 128, "one n128 P V spans a head of 128");
    constexpr int TILE = D / 64 * KT128 * 128, STAGE = 2 * TILE; /* a (KT128, D) tile: 32 KiB */
    extern __shared__ __align__(128) unsigned char wg_raw[];
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(wg_raw);
    unsigned char *Qs = wg_raw + ((1024 - (sa & 1023)) & 1023), *KV = Qs + D / 64 * WG_Q * 128;
    const int tile = gridDim.y - 1 - blockIdx.y; /* the longest rows first (mfa_grid) */
    const int bh = blockIdx.x, wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, r0 = tile * WG_Q;
    const int wr0 = r0 + wg * 64, w0 = wr0 + warp * 16, row0 = w0 + g;
    const int C = NH * D, LDI = (NH + 2 * NKV) * D;
    const mfa_heads hp = mfa_locate(qkv, bh / NH, bh % NH, T, NH, NKV, D);
    const bf16 *q = hp.q, *k = hp.k, *v = hp.v;
    const float sl2 = scale * LOG2E_F;
    /* WG_Q = KT128: the diagonal tile is the block's own; the first warpgroup's
     * rows see only its first 64 keys (the rest masked) */
    const int jmax = min(r0 + WG_Q - 1, T - 1) / KT128;
    const bool active = wr0 < T; /* the same for the whole warpgroup */
    wg_load_d<D, WG_Q>(Qs, q, r0, T, LDI);
    wg_kv_load<D, KT128>(KV, k, v, 0, T, LDI);
    wg_stage_ready();
    const unsigned char *Qw = Qs + wg * 64 * 128;
    float o[D / 8][4], m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.f, 0.f };
#pragma unroll
    for (int dn = 0; dn < D / 8; dn++)
        o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.f;
    for (int j = 0; j <= jmax; j++) {
        const int c0 = j * KT128;
        const unsigned char *Ks = KV + (j & 1) * STAGE, *Vs = Ks + TILE;
        if (j < jmax)
            wg_kv_load<D, KT128>(KV + ((j + 1) & 1) * STAGE, k, v, (j + 1) * KT128, T, LDI);
        if (active) {
            float s[16][4] = {};
            uint32_t p[8][4];
            wg_fence();
#pragma unroll
            for (int kc = 0; kc < D / 16; kc++)
                wg_ss128(s, wg_kstep<WG_Q>(Qw, kc), wg_kstep<KT128>(Ks, kc), kc);
            wg_commit();
            wg_wait0();
            wg_hold16(s);
            if (!(c0 + KT128 - 1 <= w0 && w0 + 15 < T)) /* masked: p = ex2(-inf) = 0 */
                mfa_mask16(s, c0 + 2 * t, row0, T);
            float a[2];
            mfa_softmax_step<16>(s, m, l, a, sl2);
            mfa_rescale<D>(o, a);
            mfa_pack_p(p, s);
            mfa_pack_p(p + 4, s + 8);
            wg_hold_d<D>(o);
            wg_fence();
#pragma unroll
            for (int kc = 0; kc < 8; kc++) /* 16 keys (2048 bytes of each half) of V each */
                wg_rs128_t(o, p[kc], wg_desc(Vs + kc * 2048, KT128 * 128, 1024));
            wg_commit();
            wg_wait0();
            wg_hold_d<D>(o);
        }
        wg_stage_ready();
    }
    mfa_fwd_finish<D>(out + (size_t)(bh / NH) * T * C + (bh % NH) * D, lse + (size_t)bh * T, o, m,
                      l, row0, T, t, C, sl2);
#else
    __trap(); /* a build whose image for this device lacks wgmma: fail, never return nothing */
#endif
}

/* dK, dV of 64 keys (one warpgroup; warp w has keys 16 w .. 16 w + 15), over
 * the 64-query tiles at or below them: S^T = K Q^T and dP^T = V dO^T with K
 * and V as A from shared memory (K-major, Q and dO as B likewise), then dV +=
 * P^T dO and dK += dS^T Q with P^T and dS^T from registers and dO, Q read
 * across their rows (MN-major). Head size 64: three blocks per SM (168
 * registers, no spill): 0.299 -> 0.282 ms at d48 against two (188
 * registers). Head size 128 (dK and dV 128 accumulators): two. */
/* K and V (2 tiles), two stages of Q and dO (4 tiles), two of LSE and D, alignment */
#define WG_DKDV_SMEM(D) ((D) / 64 * 6 * FA_ROWS * 128 + 4 * FA_ROWS * 4 + 1024)
template <int D>
__global__ void __launch_bounds__(128, D == 64 ? 3 : 2)
    mfa_bwd_dkdv_wg(bf16 *dqkv, const bf16 *qkv, const bf16 *dout, const float *lse,
                    const float *Dd, int T, int NH, int NKV, float scale)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int TILE = D / 64 * FA_ROWS * 128; /* one (FA_ROWS, D) tile */
    extern __shared__ __align__(128) unsigned char wg_raw[];
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(wg_raw);
    /* K and V rows, two stages of (Q tile, dO tile), two stages of (LSE, D) */
    unsigned char *Kr = wg_raw + ((1024 - (sa & 1023)) & 1023), *Vr = Kr + TILE;
    unsigned char *QD = Vr + TILE;
    float *LD = (float *)(QD + 4 * TILE);
    const int tile = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int b = blockIdx.x / NKV, hk = blockIdx.x % NKV, G = NH / NKV;
    const int g = lane >> 2, t = lane & 3, c0 = tile * FA_ROWS, key0 = c0 + warp * 16 + g;
    const int C = NH * D, LDI = (NH + 2 * NKV) * D;
    const mfa_heads hp = mfa_locate(qkv, b, hk * G, T, NH, NKV, D);
    const bf16 *k = hp.k, *v = hp.v;
    const int i0 = c0 / FA_ROWS, qtiles = (T + FA_ROWS - 1) / FA_ROWS, n = qtiles - i0;
    const float sl2 = scale * LOG2E_F;
    /* step `it` of the walk: query head hk G + it / n, query tile i0 + it % n */
    auto load_step = [&](int it, unsigned char *Qst, float *Lst) {
        const int hq = hk * G + it / n;
        const size_t lb = ((size_t)b * NH + hq) * T;
        wg_load_qtile<D>(Qst, Lst, hp.q + (size_t)(it / n) * D,
                         dout + (size_t)b * T * C + (size_t)hq * D, lse + lb, Dd + lb,
                         (i0 + it % n) * FA_ROWS, T, LDI, C);
    };
    wg_load_d<D, FA_ROWS, 128>(Kr, k, c0, T, LDI);
    wg_load_d<D, FA_ROWS, 128>(Vr, v, c0, T, LDI);
    load_step(0, QD, LD);
    cp_commit();
    wg_stage_ready();
    float dk[D / 8][4] = {}, dv[D / 8][4] = {};
    for (int it = 0; it < G * n; it++) {
        const int r0 = (i0 + it % n) * FA_ROWS, st = it & 1;
        unsigned char *Qs = QD + st * 2 * TILE, *dOs = Qs + TILE;
        const float *lse2 = LD + st * 2 * FA_ROWS, *Ds = lse2 + FA_ROWS;
        if (it + 1 < G * n) {
            load_step(it + 1, QD + (st ^ 1) * 2 * TILE, LD + (st ^ 1) * 2 * FA_ROWS);
            cp_commit();
        }
        float s[8][4] = {}, dp[8][4] = {};
        uint32_t p[4][4], ds[4][4];
        wg_fence();
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++) /* S^T = K Q^T */
            wg_ss(s, wg_kstep<FA_ROWS>(Kr, kc), wg_kstep<FA_ROWS>(Qs, kc), kc);
        wg_commit();
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++) /* dP^T = V dO^T, under P^T's exps */
            wg_ss(dp, wg_kstep<FA_ROWS>(Vr, kc), wg_kstep<FA_ROWS>(dOs, kc), kc);
        wg_commit();
        wg_wait1();
        wg_hold(s);
        if (!(c0 + warp * 16 + 15 <= r0 && r0 + FA_ROWS - 1 < T)) /* masked: P = ex2(-inf) = 0 */
            mfa_mask_t(s, r0 + 2 * t, key0, T);
        mfa_p_t(s, lse2, t, sl2);
        mfa_pack_p(p, s);
        wg_fence();
#pragma unroll
        for (int kc = 0; kc < 4; kc++) /* dV += P^T dO: 16 queries (2048 bytes) of dO each */
            wg_rs_d<D>(dv, p[kc], dOs, kc);
        wg_commit();
        wg_wait1(); /* dP^T; dV's products run under dS^T */
        wg_hold(dp);
        mfa_ds_t(dp, s, Ds, t);
        mfa_pack_p(ds, dp);
        wg_fence();
#pragma unroll
        for (int kc = 0; kc < 4; kc++) /* dK += dS^T Q */
            wg_rs_d<D>(dk, ds[kc], Qs, kc);
        wg_commit();
        wg_wait0();
        wg_hold_d<D>(dv);
        wg_hold_d<D>(dk);
        wg_stage_ready();
    }
    mfa_store<D>(dqkv + (k - qkv), dk, key0, scale, scale, T, t, LDI);
    mfa_store<D>(dqkv + (v - qkv), dv, key0, 1.f, 1.f, T, t, LDI);
#else
    __trap(); /* a build whose image for this device lacks wgmma: fail, never return nothing */
#endif
}

/* dQ of 128 queries (two warpgroups of 64) over the 64-key tiles at or below
 * them: S = Q K^T and dP = dO V^T (Q, dO as A from shared memory), then dQ +=
 * dS K with dS from registers and K read across its rows. Head size 128: one
 * block per SM (its Q, dO and K/V stages take 129 KiB). */
#define WG_DQ_SMEM(D) ((D) / 64 * (2 * WG_Q * 128 + 4 * FA_ROWS * 128) + 1024)
template <int D>
__global__ void __launch_bounds__(256, D == 64 ? 2 : 1)
    mfa_bwd_dq_wg(bf16 *dqkv, const bf16 *qkv, const bf16 *dout, const float *lse, const float *Dd,
                  int T, int NH, int NKV, float scale)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(128) unsigned char wg_raw[];
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(wg_raw);
    /* the block's Q and dO rows, then two stages of (K tile, V tile) */
    unsigned char *Qr = wg_raw + ((1024 - (sa & 1023)) & 1023), *Dr = Qr + D / 64 * WG_Q * 128;
    unsigned char *KV = Dr + D / 64 * WG_Q * 128;
    const int tile = gridDim.y - 1 - blockIdx.y;
    const int bh = blockIdx.x, wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, r0 = tile * WG_Q;
    const int wr0 = r0 + wg * 64, w0 = wr0 + warp * 16, row0 = w0 + g, row1 = row0 + 8;
    const int C = NH * D, LDI = (NH + 2 * NKV) * D;
    const mfa_heads hp = mfa_locate(qkv, bh / NH, bh % NH, T, NH, NKV, D);
    const bf16 *q = hp.q, *k = hp.k, *v = hp.v;
    const float sl2 = scale * LOG2E_F;
    const int jmax = min(r0 + WG_Q - 1, T - 1) / FA_ROWS;
    wg_load_d<D, WG_Q>(Qr, q, r0, T, LDI);
    wg_load_d<D, WG_Q>(Dr, dout + (size_t)(bh / NH) * T * C + (bh % NH) * D, r0, T, C);
    wg_kv_load<D>(KV, k, v, 0, T, LDI);
    wg_stage_ready();
    const unsigned char *Qw = Qr + wg * 64 * 128, *Dw = Dr + wg * 64 * 128;
    const float ls0 = row0 < T ? lse[(size_t)bh * T + row0] * LOG2E_F : 0.f;
    const float ls1 = row1 < T ? lse[(size_t)bh * T + row1] * LOG2E_F : 0.f;
    const float D0 = row0 < T ? Dd[(size_t)bh * T + row0] : 0.f;
    const float D1 = row1 < T ? Dd[(size_t)bh * T + row1] : 0.f;
    float dq[D / 8][4] = {};
    for (int j = 0; j <= jmax; j++) {
        const int c0 = j * FA_ROWS;
        unsigned char *Ks = wg_kv_stage<D>(KV, k, v, j, jmax, T, LDI);
        unsigned char *Vs = Ks + D / 64 * FA_ROWS * 128;
        if (wr0 + 63 >= c0 && wr0 < T) { /* the same for the whole warpgroup */
            float s[8][4] = {}, dp[8][4] = {};
            uint32_t ds[4][4];
            wg_fence();
#pragma unroll
            for (int kc = 0; kc < D / 16; kc++) /* S = Q K^T */
                wg_ss(s, wg_kstep<WG_Q>(Qw, kc), wg_kstep<FA_ROWS>(Ks, kc), kc);
            wg_commit();
#pragma unroll
            for (int kc = 0; kc < D / 16; kc++) /* dP = dO V^T, under P's exps */
                wg_ss(dp, wg_kstep<WG_Q>(Dw, kc), wg_kstep<FA_ROWS>(Vs, kc), kc);
            wg_commit();
            wg_wait1();
            wg_hold(s);
            if (!(c0 + FA_ROWS - 1 <= w0 && w0 + 15 < T))
                mfa_mask(s, c0 + 2 * t, row0, T); /* masked: p = ex2(-inf) = 0 */
            mfa_p_rows(s, ls0, ls1, sl2);
            wg_wait0();
            wg_hold(dp);
            mfa_ds_rows(s, dp, D0, D1);
            mfa_pack_p(ds, s);
            wg_fence();
#pragma unroll
            for (int kc = 0; kc < 4; kc++) /* dQ += dS K: 16 keys (2048 bytes) of K each */
                wg_rs_d<D>(dq, ds[kc], Ks, kc);
            wg_commit();
            wg_wait0();
            wg_hold_d<D>(dq);
        }
        wg_stage_ready();
    }
    mfa_store<D>(dqkv + (q - qkv), dq, row0, scale, scale, T, t, LDI);
#else
    __trap(); /* a build whose image for this device lacks wgmma: fail, never return nothing */
#endif
}

template <int D>
cudaError_t mfa_backward_wg(cudaStream_t st, bf16 *dqkv, const bf16 *qkv, const bf16 *out,
                            const bf16 *dout, const float *lse, float *Dd, int B, int NH, int NKV,
                            int T, float scale)
{
    cudaError_t e = cudaFuncSetAttribute(
        mfa_bwd_dkdv_wg<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, WG_DKDV_SMEM(D));
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(mfa_bwd_dq_wg<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 WG_DQ_SMEM(D));
    if (e != cudaSuccess)
        return e;
    const size_t chunks = (size_t)B * T * NH * D / 8;
    flash_bwd_dot<D>
        <<<(unsigned)((chunks + 255) / 256), 256, 0, st>>>(Dd, dout, out, chunks, T, NH);
    mfa_bwd_dkdv_wg<D><<<mfa_grid(B * NKV, T, FA_ROWS), 128, WG_DKDV_SMEM(D), st>>>(
        dqkv, qkv, dout, lse, Dd, T, NH, NKV, scale);
    mfa_bwd_dq_wg<D><<<mfa_grid(B * NH, T, WG_Q), 256, WG_DQ_SMEM(D), st>>>(dqkv, qkv, dout, lse,
                                                                            Dd, T, NH, NKV, scale);
    return cudaGetLastError();
}

template <int D>
cudaError_t mfa_forward_wg(cudaStream_t st, bf16 *out, float *lse, const bf16 *qkv, int B, int NH,
                           int NKV, int T, float scale)
{
    if constexpr (D == 128) { /* 128 keys a step (mfa_fwd_wg_k128) */
        cudaError_t e = cudaFuncSetAttribute(
            mfa_fwd_wg_k128<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, WG_SMEM_K128(D));
        if (e != cudaSuccess)
            return e;
        mfa_fwd_wg_k128<D><<<mfa_grid(B * NH, T, WG_Q), 256, WG_SMEM_K128(D), st>>>(
            out, lse, qkv, T, NH, NKV, scale);
    } else { /* head 64: the TMA ring (mfa_fwd_wg_tma) */
        static_assert(D == 64, "the TMA forward's boxes are 64 columns wide");
        CUtensorMap map;
        cudaError_t e = mfa_tma_map(&map, qkv, B, T, NH, NKV);
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(mfa_fwd_wg_tma, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     WG_SMEM_TMA);
        if (e != cudaSuccess)
            return e;
        mfa_fwd_wg_tma<<<mfa_grid(B * NH, T, WG_Q), 256, WG_SMEM_TMA, st>>>(map, out, lse, T, NH,
                                                                            NKV, scale);
    }
    return cudaGetLastError();
}
#endif

template <int D>
cudaError_t mfa_backward(cudaStream_t st, bf16 *dqkv, const bf16 *qkv, const bf16 *out,
                         const bf16 *dout, const float *lse, float *Dd, int B, int NH, int NKV,
                         int T, float scale)
{
    typedef mfa_cfg<D> K;
    constexpr int KR = K::W_DKDV * 16, QR = K::W_DQ * 16;
    const size_t s1 = (size_t)(2 * KR + 4 * FA_ROWS) * (D + 8) * 2 + 4 * FA_ROWS * 4;
    const size_t s2 = (size_t)(2 * QR + 4 * FA_ROWS) * (D + 8) * 2;
    auto dkdv = mfa_bwd_dkdv<D, K::W_DKDV, K::MINB_DKDV, K::KEEP>;
    auto dq = mfa_bwd_dq<D, K::W_DQ, K::MINB_DQ, K::KEEP>;
    cudaError_t e =
        cudaFuncSetAttribute(dkdv, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s1);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(dq, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s2);
    if (e != cudaSuccess)
        return e;
    const size_t chunks = (size_t)B * T * NH * D / 8;
    flash_bwd_dot<D>
        <<<(unsigned)((chunks + 255) / 256), 256, 0, st>>>(Dd, dout, out, chunks, T, NH);
    dkdv<<<mfa_grid(B * NKV, T, KR), K::W_DKDV * 32, s1, st>>>(dqkv, qkv, dout, lse, Dd, T, NH, NKV,
                                                               scale);
    dq<<<mfa_grid(B * NH, T, QR), K::W_DQ * 32, s2, st>>>(dqkv, qkv, dout, lse, Dd, T, NH, NKV,
                                                          scale);
    return cudaGetLastError();
}

/* ------------------------------------------------------------ element-wise */

/* gelu_f and gelu_grad: nn/cuda_util.cuh (the FP8 conversions use gelu_f too) */

__global__ void gelu_cols(bf16 *D, const bf16 *aux, int ldd, int m, int n, bool bwd)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)m * n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t at = (i / m) * ldd + i % m;
        const float x = __bfloat162float(aux[at]);
        D[at] = __float2bfloat16(bwd ? __bfloat162float(D[at]) * gelu_grad(x) : gelu_f(x));
    }
}

/* OP 0: GELU(a); 1: GELU'(a) * b (b = dout); 2: a + b (residual). */
template <int OP> __device__ __forceinline__ float ew(float a, float b)
{
    return OP == 0 ? gelu_f(a) : OP == 1 ? gelu_grad(a) * b : a + b;
}

/* W elements per thread: W = 8 through 16-byte loads and stores, else 1; n
 * counts units of W elements. b is not read for OP 0. */
template <int OP, int W>
__global__ void elementwise(bf16 *out, const bf16 *a, const bf16 *b, size_t n)
{
    typedef typename std::conditional<W == 8, uint4, bf16>::type vec;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        vec ra = reinterpret_cast<const vec *>(a)[i], rb = ra, ro;
        if (OP != 0)
            rb = reinterpret_cast<const vec *>(b)[i];
        const bf16 *xa = reinterpret_cast<const bf16 *>(&ra),
                   *xb = reinterpret_cast<const bf16 *>(&rb);
        bf16 *xo = reinterpret_cast<bf16 *>(&ro);
#pragma unroll
        for (int j = 0; j < W; j++)
            xo[j] = bf(ew<OP>(__bfloat162float(xa[j]), __bfloat162float(xb[j])));
        reinterpret_cast<vec *>(out)[i] = ro;
    }
}

/* The 16-byte kernel where n is a multiple of 8 and every pointer 16-byte
 * aligned, else the one-element one. */
template <int OP>
int elementwise_launch(cudaStream_t st, void *out, const void *a, const void *b, size_t n,
                       const char *what, bmt_error_t *err)
{
    const bool v8 = n % 8 == 0 && (uintptr_t)out % 16 == 0 && (uintptr_t)a % 16 == 0 &&
                    (uintptr_t)(b ? b : a) % 16 == 0;
    if (v8)
        elementwise<OP, 8><<<blocks_for(n / 8, 256), 256, 0, st>>>((bf16 *)out, (const bf16 *)a,
                                                                   (const bf16 *)b, n / 8);
    else
        elementwise<OP, 1>
            <<<blocks_for(n, 256), 256, 0, st>>>((bf16 *)out, (const bf16 *)a, (const bf16 *)b, n);
    return launched(err, what);
}

/* ------------------------------------------------------------ cross-entropy */

#define CE_THREADS 512

/* Block-wide reduction in a fixed order: warps, then warp 0 over the warps. */
template <bool MAX> __device__ float block_reduce(float v, float *sh)
{
    v = MAX ? warp_max(v) : warp_sum(v);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    __syncthreads(); /* sh may still be read from a previous call */
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    float r = lane < nw ? sh[lane] : (MAX ? -INFINITY : 0.f);
    r = MAX ? warp_max(r) : warp_sum(r);
    return r;
}

/* One block a row (blockIdx.x, + gridDim.x, ...), W elements a thread a
 * load: W = 8 through 16-byte loads and stores (ld a multiple of 8, logits
 * 16-byte aligned), else 1; U loads a thread in flight. One pass for the max
 * and the sum (online softmax per thread, a chunk's max taken first: one
 * rescale a chunk, not a compare and branch an element; combined across the
 * block), one to overwrite the row with its gradient. Each exponential is one
 * FFMA and one MUFU.EX2 (ex2f), in log2 units, where expf spends a range
 * reduction: 1.730 -> 1.619 ms at d12's head (16K rows of 50,304), d12's step
 * -1.6% (bench/NOTES.md, session 34). */
template <int W, int U>
__global__ void crossentropy_rows(float *losses, bf16 *logits, int ldv, const int32_t *targets,
                                  float dloss, int V, int N)
{
    typedef typename std::conditional<W == 8, uint4, bf16>::type vec;
    __shared__ float sh[32];
    const int step = blockDim.x * W, row = blockIdx.x; /* a block a row: the grid is N */
    if (row >= N)
        return;
    bf16 *x = logits + (size_t)row * ldv;
    const int tg = targets[row];
    float m = -INFINITY, s = 0.f; /* m in log2 units: the max times log2 e */
    for (int c0 = threadIdx.x * W; c0 < V; c0 += U * step) {
        vec raw[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (c0 + u * step < V)
                raw[u] = *reinterpret_cast<const vec *>(x + c0 + u * step);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + u * step;
            const bf16 *v = reinterpret_cast<const bf16 *>(&raw[u]);
            float y[W], cm = -INFINITY;
#pragma unroll
            for (int i = 0; i < W; i++) {
                y[i] = c + i < V ? __bfloat162float(v[i]) * LOG2E_F : -INFINITY;
                cm = fmaxf(cm, y[i]);
            }
            if (cm > m) {
                s *= ex2f(m - cm); /* m = -inf: s is 0 and stays 0 */
                m = cm;
            }
#pragma unroll
            for (int i = 0; i < W; i++)
                s += ex2f(y[i] - m);
        }
    }
    const float mx = block_reduce<true>(m, sh);
    s = m == -INFINITY ? 0.f : s * ex2f(m - mx);
    s = block_reduce<false>(s, sh);
    const float lse = (mx + log2f(s)) / LOG2E_F;
    if (threadIdx.x == 0)
        losses[row] = tg >= 0 ? lse - ld(&x[tg]) : 0.f;
    if (dloss == 0.f)
        return;
    __syncthreads(); /* x[tg] is read above before any thread overwrites it */
    const float inv = dloss / s;
    for (int c = threadIdx.x * W; c < ldv; c += step) {
        vec raw = *reinterpret_cast<const vec *>(x + c);
        bf16 *v = reinterpret_cast<bf16 *>(&raw);
#pragma unroll
        for (int i = 0; i < W; i++) {
            const int j = c + i;
            float g = 0.f;
            if (tg >= 0 && j < V)
                g = ex2f(fmaf(__bfloat162float(v[i]), LOG2E_F, -mx)) * inv -
                    (j == tg ? dloss : 0.f);
            v[i] = bf(g);
        }
        *reinterpret_cast<vec *>(x + c) = raw;
    }
}

__global__ void sum_f32(float *out, const float *x, int n)
{
    __shared__ float sh[32];
    float s = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        s += x[i];
    s = block_reduce<false>(s, sh);
    if (threadIdx.x == 0)
        *out = s;
}

__global__ void to_f32(float *dst, const bf16 *src, int rows, int cols, int ldv)
{
    const size_t total = (size_t)rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = ld(&src[(i / cols) * ldv + i % cols]);
}

/* ------------------------------------------------------------ attention over a KV cache */

#define KVC_WARPS 4               /* warps of a block: one (query, head) */
#define KVC_MAX_HD 256            /* head sizes nn_cuda_attention_cached takes */
#define KVC_DPL (KVC_MAX_HD / 32) /* head dims per lane, at most */

/* Block (query i, head h): warp w takes keys w, w + W, ... of 0..pos0+i and
 * lane l the dims l, l + 32, ... < hd of the head. Each warp keeps an online
 * softmax over its keys (running maximum m, sum of exp(s - m), and the
 * weighted sum of v rows, rescaled when m grows); the warps' states are then
 * combined through shared memory in warp order. Every sum has a fixed order
 * (the warp's keys in order, the butterfly of warp_sum, the warps in order):
 * the same inputs give the same bits. */
__global__ void __launch_bounds__(KVC_WARPS * 32)
    attention_cached(bf16 *out, const bf16 *q, int ldq, const bf16 *kc, const bf16 *vc, int pos0,
                     int NH, int NKV, int hd, float scale)
{
    __shared__ float sm_m[KVC_WARPS], sm_l[KVC_WARPS], sm_acc[KVC_WARPS][KVC_MAX_HD];
    const int h = (int)(blockIdx.x % (unsigned)NH), i = (int)(blockIdx.x / (unsigned)NH);
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    const int P = pos0 + i + 1; /* keys 0..pos0+i */
    const size_t kv_row = (size_t)NKV * hd;
    const size_t kv0 = (size_t)(h / (NH / NKV)) * hd; /* the head's kv head in a cache row */
    const bf16 *qh = q + (size_t)i * ldq + (size_t)h * hd;
    float qr[KVC_DPL], acc[KVC_DPL];
#pragma unroll
    for (int k = 0; k < KVC_DPL; k++) {
        const int e = lane + 32 * k;
        qr[k] = e < hd ? ld(qh + e) : 0.0f;
        acc[k] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int j = warp; j < P; j += KVC_WARPS) { /* the same trip count for the warp's lanes */
        const bf16 *kj = kc + (size_t)j * kv_row + kv0, *vj = vc + (size_t)j * kv_row + kv0;
        float d = 0.0f;
#pragma unroll
        for (int k = 0; k < KVC_DPL; k++) {
            const int e = lane + 32 * k;
            if (e < hd)
                d += qr[k] * ld(kj + e);
        }
        const float s = warp_sum(d) * scale;
        const float mn = fmaxf(m, s);
        const float c = expf(m - mn), p = expf(s - mn); /* c = 0 at the first key (m = -inf) */
        l = l * c + p;
#pragma unroll
        for (int k = 0; k < KVC_DPL; k++) {
            const int e = lane + 32 * k;
            if (e < hd)
                acc[k] = acc[k] * c + p * ld(vj + e);
        }
        m = mn;
    }
    if (lane == 0)
        sm_m[warp] = m, sm_l[warp] = l;
#pragma unroll
    for (int k = 0; k < KVC_DPL; k++) {
        const int e = lane + 32 * k;
        if (e < hd)
            sm_acc[warp][e] = acc[k];
    }
    __syncthreads();
    /* A warp without keys (P < KVC_WARPS) has m = -inf, l = 0, acc = 0: its
     * weight exp(m - M) is 0. Warp 0 always has key 0, so M is finite. */
    float M = sm_m[0], L = 0.0f;
    for (int w = 1; w < KVC_WARPS; w++)
        M = fmaxf(M, sm_m[w]);
    for (int w = 0; w < KVC_WARPS; w++)
        L += sm_l[w] * expf(sm_m[w] - M);
    bf16 *o = out + ((size_t)i * NH + h) * hd;
    for (int e = (int)threadIdx.x; e < hd; e += (int)blockDim.x) {
        float y = 0.0f;
        for (int w = 0; w < KVC_WARPS; w++)
            y += sm_acc[w][e] * expf(sm_m[w] - M);
        o[e] = bf(y / L);
    }
}

} /* namespace */

/* ------------------------------------------------------------ the C API */

extern "C" size_t nn_cuda_workspace_bytes(int max_cols)
{
    return LT_WORKSPACE + (size_t)COL_CHUNKS * 2 * (size_t)max_cols * sizeof(float);
}

extern "C" nn_cuda_t *nn_cuda_create(void *stream, void *workspace, int max_cols, bmt_error_t *err)
{
    nn_cuda_t *h = (nn_cuda_t *)calloc(1, sizeof(*h));
    if (h == NULL) {
        fail_text(err, "handle", "out of memory");
        return NULL;
    }
    h->stream = (cudaStream_t)stream;
    h->lt_ws = workspace;
    h->partial = (float *)((char *)workspace + LT_WORKSPACE);
    h->max_cols = max_cols;
#if defined(NN_WGMMA)
    int dev = 0, major = 0, minor = 0;
    h->wgmma =
        cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
        major == 9 && minor == 0;
#endif
    h->plans = (mm_plan *)calloc(NN_MM_PLANS, sizeof(mm_plan));
    if (h->plans == NULL) {
        fail_text(err, "handle", "out of memory");
        free(h);
        return NULL;
    }
    if (blas_ok(cublasCreate(&h->blas), err, "cublasCreate") < 0) {
        free(h->plans);
        free(h);
        return NULL;
    }
    if (blas_ok(cublasLtCreate(&h->lt), err, "cublasLtCreate") < 0 ||
        blas_ok(cublasSetStream(h->blas, h->stream), err, "cublasSetStream") < 0 ||
        blas_ok(cublasSetWorkspace(h->blas, workspace, LT_WORKSPACE), err, "cublasSetWorkspace") <
            0) {
        nn_cuda_destroy(h);
        return NULL;
    }
    return h;
}

extern "C" void *nn_cuda_stream(nn_cuda_t *h) { return (void *)h->stream; }

extern "C" void *nn_cuda_workspace(nn_cuda_t *h, size_t *bytes)
{
    *bytes = nn_cuda_workspace_bytes(h->max_cols);
    return h->lt_ws; /* LT_WORKSPACE bytes for cuBLAS(Lt), then the column sums' partials */
}

extern "C" void nn_cuda_attention_mode(nn_cuda_t *h, int mode) { h->attn_mode = mode; }

extern "C" void nn_cuda_lt_off(nn_cuda_t *h, int off) { h->lt_off = off != 0; }

extern "C" const char *nn_cuda_attention_kernel(const nn_cuda_t *h)
{
    return h->wgmma ? "wgmma" : "mma.sync";
}

extern "C" int nn_cuda_gemm_tune(nn_cuda_t *h, int candidates)
{
    if (candidates < 0 || candidates > NN_GEMM_TUNE_MAX)
        return -1;
    h->gemm_tune = candidates;
    for (int i = 0; i < h->nplans; i++) /* the next products choose again */
        plan_release(&h->plans[i]);
    h->nplans = 0;
    return 0;
}

extern "C" void nn_cuda_destroy(nn_cuda_t *h)
{
    if (h == NULL)
        return;
    for (int i = 0; i < h->nplans; i++)
        plan_release(&h->plans[i]);
    free(h->plans);
    if (h->lt)
        cublasLtDestroy(h->lt);
    if (h->blas)
        cublasDestroy(h->blas);
    free(h);
}

extern "C" int nn_cuda_encoder_forward(nn_cuda_t *h, void *out, const int32_t *inp, const void *wte,
                                       const void *wpe, int B, int T, int C, bmt_error_t *err)
{
    const size_t total = (size_t)B * T * C;
    encoder_fwd<<<blocks_for(total, 256), 256, 0, h->stream>>>((bf16 *)out, inp, (const bf16 *)wte,
                                                               (const bf16 *)wpe, T, C, total);
    return launched(err, "encoder forward");
}

extern "C" int nn_token_buckets(const int32_t *inp, int N, int V, int32_t *out)
{
    /* Counting sort by token, stable: positions of each token in order. */
    int32_t *count = (int32_t *)calloc((size_t)V + 1, sizeof(int32_t));
    if (count == NULL)
        return -1;
    for (int i = 0; i < N; i++)
        count[inp[i] + 1]++;
    int U = 0;
    for (int v = 0; v < V; v++)
        U += count[v + 1] > 0;
    for (int v = 0; v < V; v++)
        count[v + 1] += count[v]; /* count[v]: first slot of token v */
    int32_t *tok = out, *start = out + U, *pos = out + 2 * U + 1;
    int u = 0;
    for (int v = 0; v < V; v++)
        if (count[v + 1] > count[v]) {
            tok[u] = v;
            start[u++] = count[v];
        }
    start[U] = N;
    for (int i = 0; i < N; i++)
        pos[count[inp[i]]++] = i;
    free(count);
    return U;
}

extern "C" int nn_cuda_encoder_backward(nn_cuda_t *h, float *dwte, float *dwpe, const void *dout,
                                        const int32_t *buckets, int U, int B, int T, int C,
                                        bmt_error_t *err)
{
    if (U > 0)
        encoder_bwd_wte<<<(unsigned)U, 256, 0, h->stream>>>(dwte, (const bf16 *)dout, buckets, U,
                                                            C);
    if (dwpe)
        encoder_bwd_wpe<<<(unsigned)T, 256, 0, h->stream>>>(dwpe, (const bf16 *)dout, B, T, C);
    return launched(err, "encoder backward");
}

extern "C" int nn_cuda_layernorm_forward(nn_cuda_t *h, void *out, float *mean, float *rstd,
                                         const void *inp, const void *weight, const void *bias,
                                         int N, int C, bmt_error_t *err)
{
    const unsigned grid = (unsigned)(N + 7) / 8;
    bf16 *o = (bf16 *)out;
    const bf16 *x = (const bf16 *)inp, *w = (const bf16 *)weight, *b = (const bf16 *)bias;
    switch (aligned16(out, inp, weight, bias) ? ln_cpl(C) : 0) {
#define LN_FWD(n)                                                                                  \
    case n: layernorm_fwd8<n><<<grid, 256, 0, h->stream>>>(o, mean, rstd, x, w, b, N, C); break;
        LN_CPL_CASES(LN_FWD)
#undef LN_FWD
    default: layernorm_fwd<<<grid, 256, 0, h->stream>>>(o, mean, rstd, x, w, b, N, C);
    }
    return launched(err, "layernorm forward");
}

extern "C" int nn_cuda_layernorm_backward(nn_cuda_t *h, void *dinp, const void *dres,
                                          float *dweight, float *dbias, const void *dout,
                                          const void *inp, const void *weight, const float *mean,
                                          const float *rstd, int N, int C, int add,
                                          bmt_error_t *err)
{
    /* The parameter sums first: dinp may alias nothing they read, but keep the
     * order that reads inp and dout before anything is written. */
    ln_term f = { (const bf16 *)dout, (const bf16 *)inp, mean, rstd, C };
    if (colsum<2>(h, dweight, dbias, N, C, f, add != 0, err) < 0)
        return -1;
    const unsigned grid = (unsigned)(N + 7) / 8;
    bf16 *di = (bf16 *)dinp;
    const bf16 *dr = (const bf16 *)dres, *dy = (const bf16 *)dout, *x = (const bf16 *)inp,
               *w = (const bf16 *)weight;
    if (aligned16(dinp, dres, dout, inp, weight) && C % 8 == 0)
        layernorm_bwd8<<<grid, 256, 0, h->stream>>>(di, dr, dy, x, w, mean, rstd, N, C);
    else
        layernorm_bwd<<<grid, 256, 0, h->stream>>>(di, dr, dy, x, w, mean, rstd, N, C);
    return launched(err, "layernorm backward");
}

/* Row-major (rows, cols) is col-major (cols, rows): every product below is
 * written for cuBLAS's column-major view of our row-major buffers. */
extern "C" int nn_cuda_matmul_forward(nn_cuda_t *h, void *out, int ld_out, const void *inp,
                                      const void *weight, const void *bias, int N, int IC, int OC,
                                      int wt, bmt_error_t *err)
{
    /* out^T (OC,N) = W' (OC,IC) x inp^T (IC,N); W' is Conv1D's (IC,OC) seen
     * col-major (no transpose, ld OC), or the head's (OC,IC) transposed. */
    return matmul(h, out, CUDA_R_16BF, ld_out, weight, wt != 0, wt ? IC : OC, inp, false, IC, OC, N,
                  IC, bias, 0.0f, EPI_NONE, NULL, err);
}

extern "C" int nn_cuda_matmul_residual_forward(nn_cuda_t *h, void *out, const void *res,
                                               const void *inp, const void *weight,
                                               const void *bias, int N, int IC, int OC, int wt,
                                               bmt_error_t *err)
{
    if (res == NULL)
        return fail_text(err, "matmul residual forward", "res is NULL");
    return matmul(h, out, CUDA_R_16BF, OC, weight, wt != 0, wt ? IC : OC, inp, false, IC, OC, N, IC,
                  bias, 1.0f, EPI_NONE, NULL, err, res);
}

extern "C" int nn_cuda_matmul_gelu_forward(nn_cuda_t *h, void *out, void *pre, const void *inp,
                                           const void *weight, const void *bias, int N, int IC,
                                           int OC, bmt_error_t *err)
{
    return matmul(h, out, CUDA_R_16BF, OC, weight, false, OC, inp, false, IC, OC, N, IC, bias, 0.0f,
                  EPI_GELU, pre, err);
}

/* nn_cuda_matmul_backward with dinp's product through the epilogue epi (aux: pre) */
static int matmul_backward(nn_cuda_t *h, void *dinp, float *dweight, float *dbias, const void *dout,
                           int ld_dout, const void *inp, const void *weight, int N, int IC, int OC,
                           int wt, int epi, const void *pre, int add, bmt_error_t *err)
{
    /* dinp^T (IC,N) = W'^T (IC,OC) x dout^T (OC,N) */
    if (dinp && matmul(h, dinp, CUDA_R_16BF, IC, weight, wt == 0, wt ? IC : OC, dout, false,
                       ld_dout, IC, N, OC, NULL, 0.0f, epi, (void *)pre, err) < 0)
        return -1;
    /* Conv1D: dW^T (OC,IC) += dout^T (OC,N) x inp (N,IC);
     * head:   dW^T (IC,OC) += inp^T (IC,N) x dout (N,OC);
     * = instead of += (beta 0) when not add. */
    const float beta = add ? 1.0f : 0.0f;
    if (dweight && wt == 0 &&
        matmul(h, dweight, CUDA_R_32F, OC, dout, false, ld_dout, inp, true, IC, OC, IC, N, NULL,
               beta, EPI_NONE, NULL, err) < 0)
        return -1;
    if (dweight && wt != 0 &&
        matmul(h, dweight, CUDA_R_32F, IC, inp, false, IC, dout, true, ld_dout, IC, OC, N, NULL,
               beta, EPI_NONE, NULL, err) < 0)
        return -1;
    if (dbias) {
        bias_term f = { (const bf16 *)dout, ld_dout };
        return colsum<1>(h, dbias, NULL, N, OC, f, add != 0, err);
    }
    return 0;
}

extern "C" int nn_cuda_matmul_backward(nn_cuda_t *h, void *dinp, float *dweight, float *dbias,
                                       const void *dout, int ld_dout, const void *inp,
                                       const void *weight, int N, int IC, int OC, int wt, int add,
                                       bmt_error_t *err)
{
    return matmul_backward(h, dinp, dweight, dbias, dout, ld_dout, inp, weight, N, IC, OC, wt,
                           EPI_NONE, NULL, add, err);
}

extern "C" int nn_cuda_matmul_backward_dgelu(nn_cuda_t *h, void *dinp, float *dweight, float *dbias,
                                             const void *dout, int ld_dout, const void *inp,
                                             const void *weight, const void *pre, int N, int IC,
                                             int OC, int add, bmt_error_t *err)
{
    return matmul_backward(h, dinp, dweight, dbias, dout, ld_dout, inp, weight, N, IC, OC, 0,
                           EPI_DGELU, pre, add, err);
}

/* nn_cuda_fp8_matmul with C = res (bf16, out's layout) where given, else out */
static int fp8_matmul(nn_cuda_t *h, void *out, int out_f32, int ld_out, const uint8_t *a,
                      nn_fp8_kind_t ka, const float *a_descale, const uint8_t *b, nn_fp8_kind_t kb,
                      const float *b_descale, const void *bias, const void *res, float beta,
                      int fast_accum, int N, int K, int OC, bmt_error_t *err)
{
    char why[200];
    const bool ka_ok = ka == NN_FP8_E4M3 || ka == NN_FP8_E5M2,
               kb_ok = kb == NN_FP8_E4M3 || kb == NN_FP8_E5M2;
    if (!ka_ok || !kb_ok || (ka == NN_FP8_E5M2 && kb == NN_FP8_E5M2))
        return fail_text(err, "fp8 matmul",
                         "the operands must be E4M3 x E4M3, E4M3 x E5M2 or E5M2 x E4M3 "
                         "(Hopper has no E5M2 x E5M2 product)");
    if (out == NULL || a == NULL || b == NULL || a_descale == NULL || b_descale == NULL)
        return fail_text(err, "fp8 matmul", "a pointer is NULL");
    if (N < 1 || OC < 1 || K < 16 || K % 16 || ld_out < OC || ld_out % (out_f32 ? 4 : 8) ||
        !aligned16(out, a, b, bias) || !aligned16(res)) {
        snprintf(why, sizeof(why),
                 "N %d, K %d, OC %d, ld_out %d: K must be a multiple of 16, ld_out >= OC with "
                 "rows of 16-byte multiples, every pointer 16-byte aligned",
                 N, K, OC, ld_out);
        return fail_text(err, "fp8 matmul", why);
    }
    if (out_f32 && bias)
        return fail_text(err, "fp8 matmul", "a bias only with a bf16 output");
    /* cuBLASLt's heuristic takes them, then cublasLtMatmul says "not
     * supported" (tests/gpu/fp8_check.c shows both) */
    if (!aligned16(a_descale, b_descale))
        return fail_text(err, "fp8 matmul",
                         "the descales must be 16-byte aligned (cuBLASLt's "
                         "scale pointers)");
    /* col-major: out^T (OC,N) = b (K,OC)^T x a (K,N): b is cuBLASLt's A
     * (transposed), a its B: the "TN" form FP8 products require. */
    const cudaDataType_t dt[2] = { CUDA_R_8F_E4M3, CUDA_R_8F_E5M2 };
    const fp8_args f8 = { dt[kb], dt[ka], b_descale, a_descale, fast_accum != 0 };
    return matmul_one(h, out, out_f32 ? CUDA_R_32F : CUDA_R_16BF, ld_out, b, true, K, a, false, K,
                      OC, N, K, bias, beta, EPI_NONE, NULL, err, &f8, res);
}

extern "C" int nn_cuda_fp8_matmul(nn_cuda_t *h, void *out, int out_f32, int ld_out,
                                  const uint8_t *a, nn_fp8_kind_t ka, const float *a_descale,
                                  const uint8_t *b, nn_fp8_kind_t kb, const float *b_descale,
                                  const void *bias, float beta, int fast_accum, int N, int K,
                                  int OC, bmt_error_t *err)
{
    return fp8_matmul(h, out, out_f32, ld_out, a, ka, a_descale, b, kb, b_descale, bias, NULL, beta,
                      fast_accum, N, K, OC, err);
}

extern "C" int nn_cuda_fp8_matmul_residual(nn_cuda_t *h, void *out, const void *res,
                                           const uint8_t *a, nn_fp8_kind_t ka,
                                           const float *a_descale, const uint8_t *b,
                                           nn_fp8_kind_t kb, const float *b_descale,
                                           const void *bias, int fast_accum, int N, int K, int OC,
                                           bmt_error_t *err)
{
    if (fp8_res_refused(out, res, "fp8 matmul residual", err) < 0)
        return -1;
    return fp8_matmul(h, out, 0, OC, a, ka, a_descale, b, kb, b_descale, bias, res, 1.0f,
                      fast_accum, N, K, OC, err);
}

extern "C" int nn_cuda_attention_is_flash(int C, int NH) { return C % NH == 0 && flash_ok(C / NH); }

extern "C" int nn_cuda_flash_ok(int hd) { return flash_ok(hd) || hd == 128; }

/* Whether head size hd runs the wgmma kernels (64 and 128, on a device
 * that has them, unless nn_cuda_attention_mode picked mma.sync). */
static bool wgmma_ok(const nn_cuda_t *h, int hd)
{
    return h->wgmma && h->attn_mode == 0 && (hd == 64 || hd == 128);
}

/* The heads as nn_cuda_flash_* take them: NH a multiple of NKV, a supported
 * head size, rows of 16-byte multiples (cp.async's unit). */
static int flash_args(int B, int T, int NH, int NKV, int hd, const void *p0, const void *p1,
                      const void *p2, const void *p3, const char *what, bmt_error_t *err)
{
    char why[200];
    if (!nn_cuda_flash_ok(hd))
        snprintf(why, sizeof why, "head size %d is not one of 16, 32, 64, 128", hd);
    else if (B < 1 || T < 1 || NH < 1 || NKV < 1 || NH % NKV != 0)
        snprintf(why, sizeof why,
                 "B %d, T %d, NH %d, NKV %d: every one must be >= 1 and NH a multiple of NKV", B, T,
                 NH, NKV);
    else if (((long long)T + FA_ROWS - 1) / FA_ROWS > 65535) /* the grids' y: 64-row tiles */
        snprintf(why, sizeof why, "T %d: at most %d (65535 tiles of %d rows)", T, 65535 * FA_ROWS,
                 FA_ROWS);
    else if ((long long)B * NH > 0x7fffffff) /* the grids' x */
        snprintf(why, sizeof why, "B %d x NH %d = %lld (batch, head) pairs; at most 2^31 - 1", B,
                 NH, (long long)B * NH);
    else if (!aligned16(p0, p1, p2, p3))
        snprintf(why, sizeof why,
                 "a buffer is not 16-byte aligned (the kernels copy 16 bytes at a time): "
                 "pass the start of an allocation, or an offset that is a multiple of 8 elements");
    else
        return 0;
    return fail_text(err, what, why);
}

extern "C" int nn_cuda_flash_forward(nn_cuda_t *h, void *out, float *lse, const void *qkv, int B,
                                     int T, int NH, int NKV, int hd, bmt_error_t *err)
{
    if (flash_args(B, T, NH, NKV, hd, out, qkv, NULL, NULL, "flash attention forward", err) < 0)
        return -1;
    const float scale = 1.0f / sqrtf((float)hd);
    const bf16 *x = (const bf16 *)qkv;
    bf16 *y = (bf16 *)out;
    const bool wg = wgmma_ok(h, hd);
    cudaError_t e = hd == 16   ? mfa_forward<16>(h->stream, y, lse, x, B, NH, NKV, T, scale)
                    : hd == 32 ? mfa_forward<32>(h->stream, y, lse, x, B, NH, NKV, T, scale)
#if defined(NN_WGMMA)
                    : wg && hd == 64
                        ? mfa_forward_wg<64>(h->stream, y, lse, x, B, NH, NKV, T, scale)
                    : wg ? mfa_forward_wg<128>(h->stream, y, lse, x, B, NH, NKV, T, scale)
#endif
                    : hd == 128 ? mfa_forward<128>(h->stream, y, lse, x, B, NH, NKV, T, scale)
                                : mfa_forward<64>(h->stream, y, lse, x, B, NH, NKV, T, scale);
    if (e != cudaSuccess)
        return fail_text(err, "flash attention forward", cudaGetErrorString(e));
    return 0;
}

extern "C" int nn_cuda_flash_backward(nn_cuda_t *h, void *dqkv, float *Dd, const void *dout,
                                      const void *out, const void *qkv, const float *lse, int B,
                                      int T, int NH, int NKV, int hd, bmt_error_t *err)
{
    if (flash_args(B, T, NH, NKV, hd, dqkv, dout, out, qkv, "flash attention backward", err) < 0)
        return -1;
    const float scale = 1.0f / sqrtf((float)hd);
    const bf16 *x = (const bf16 *)qkv, *o = (const bf16 *)out, *dy = (const bf16 *)dout;
    bf16 *dx = (bf16 *)dqkv;
    cudaStream_t st = h->stream;
    const bool wg = wgmma_ok(h, hd);
    cudaError_t e = hd == 16   ? mfa_backward<16>(st, dx, x, o, dy, lse, Dd, B, NH, NKV, T, scale)
                    : hd == 32 ? mfa_backward<32>(st, dx, x, o, dy, lse, Dd, B, NH, NKV, T, scale)
#if defined(NN_WGMMA)
                    : wg && hd == 64
                        ? mfa_backward_wg<64>(st, dx, x, o, dy, lse, Dd, B, NH, NKV, T, scale)
                    : wg ? mfa_backward_wg<128>(st, dx, x, o, dy, lse, Dd, B, NH, NKV, T, scale)
#endif
                    : hd == 128 ? mfa_backward<128>(st, dx, x, o, dy, lse, Dd, B, NH, NKV, T, scale)
                                : mfa_backward<64>(st, dx, x, o, dy, lse, Dd, B, NH, NKV, T, scale);
    if (e != cudaSuccess)
        return fail_text(err, "flash attention backward", cudaGetErrorString(e));
    return 0;
}

extern "C" size_t nn_cuda_attention_saved_bytes(int B, int T, int C, int NH)
{
    return nn_cuda_attention_is_flash(C, NH) ? (size_t)B * NH * T * sizeof(float)
                                             : (size_t)B * NH * T * T * sizeof(bf16);
}

extern "C" int nn_cuda_attention_forward(nn_cuda_t *h, void *out, void *qkvr, void *att,
                                         const void *qkv, void *scratch, int B, int T, int C,
                                         int NH, bmt_error_t *err)
{
    const int hs = C / NH, BH = B * NH;
    const size_t one = (size_t)B * T * C;
    if (flash_ok(hs) && h->attn_mode != 1) {
        /* The kernels read the heads where they lie in qkv; the saved input is qkv itself. */
        if (qkvr != qkv && cudaMemcpyAsync(qkvr, qkv, 3 * one * sizeof(bf16),
                                           cudaMemcpyDeviceToDevice, h->stream) != cudaSuccess)
            return launched(err, "attention: saving qkv");
        return nn_cuda_flash_forward(h, out, (float *)att, qkv, B, T, NH, NH, hs, err);
    }
    bf16 *q = (bf16 *)qkvr, *k = q + one, *v = k + one, *y = (bf16 *)scratch;
    permute_heads<true>
        <<<blocks_for(3 * one, 256), 256, 0, h->stream>>>(q, (const bf16 *)qkv, 3, B, T, NH, hs);
    if (launched(err, "attention permute") < 0)
        return -1;
    /* scores[t1][t2] = q[t1] . k[t2]: col-major (t2, t1) = k^T q */
    if (batched(h, true, false, T, T, hs, k, hs, (long long)T * hs, q, hs, (long long)T * hs, att,
                T, (long long)T * T, BH, err) < 0)
        return -1;
    const int rows = BH * T;
    softmax_causal_fwd<<<(unsigned)(rows + 7) / 8, 256, 0, h->stream>>>(
        (bf16 *)att, 1.0f / sqrtf((float)hs), rows, T);
    if (launched(err, "attention softmax") < 0)
        return -1;
    /* y[t1] = sum_t2 att[t1][t2] v[t2]: col-major (d, t1) = v (d,t2) x att (t2,t1) */
    if (batched(h, false, false, hs, T, T, v, hs, (long long)T * hs, att, T, (long long)T * T, y,
                hs, (long long)T * hs, BH, err) < 0)
        return -1;
    permute_heads<false>
        <<<blocks_for(one, 256), 256, 0, h->stream>>>((bf16 *)out, y, 1, B, T, NH, hs);
    return launched(err, "attention unpermute");
}

extern "C" int nn_cuda_attention_backward(nn_cuda_t *h, void *dqkv, const void *dout,
                                          const void *out, const void *qkvr, const void *att,
                                          void *datt, void *scratch, int B, int T, int C, int NH,
                                          bmt_error_t *err)
{
    const int hs = C / NH, BH = B * NH;
    const size_t one = (size_t)B * T * C;
    const long long sh = (long long)T * hs, st = (long long)T * T;
    if (flash_ok(hs) && h->attn_mode != 1)
        return nn_cuda_flash_backward(h, dqkv, (float *)datt, dout, out, qkvr, (const float *)att,
                                      B, T, NH, NH, hs, err);
    const bf16 *q = (const bf16 *)qkvr, *k = q + one, *v = k + one;
    bf16 *dy = (bf16 *)scratch, *dq = dy + one, *dk = dq + one, *dv = dk + one;
    permute_heads<true>
        <<<blocks_for(one, 256), 256, 0, h->stream>>>(dy, (const bf16 *)dout, 1, B, T, NH, hs);
    if (launched(err, "attention permute") < 0)
        return -1;
    /* datt[t1][t2] = dy[t1] . v[t2] */
    if (batched(h, true, false, T, T, hs, v, hs, sh, dy, hs, sh, datt, T, st, BH, err) < 0)
        return -1;
    /* dv[t2] = sum_t1 att[t1][t2] dy[t1]: col-major (d,t2) = dy (d,t1) x att^T */
    if (batched(h, false, true, hs, T, T, dy, hs, sh, att, T, st, dv, hs, sh, BH, err) < 0)
        return -1;
    const int rows = BH * T;
    softmax_causal_bwd<<<(unsigned)(rows + 7) / 8, 256, 0, h->stream>>>(
        (bf16 *)datt, (const bf16 *)att, 1.0f / sqrtf((float)hs), rows, T);
    if (launched(err, "attention softmax backward") < 0)
        return -1;
    /* dq[t1] = sum_t2 dpre[t1][t2] k[t2]; dk[t2] = sum_t1 dpre[t1][t2] q[t1] */
    if (batched(h, false, false, hs, T, T, k, hs, sh, datt, T, st, dq, hs, sh, BH, err) < 0 ||
        batched(h, false, true, hs, T, T, q, hs, sh, datt, T, st, dk, hs, sh, BH, err) < 0)
        return -1;
    permute_heads<false>
        <<<blocks_for(3 * one, 256), 256, 0, h->stream>>>((bf16 *)dqkv, dq, 3, B, T, NH, hs);
    return launched(err, "attention unpermute");
}

extern "C" int nn_cuda_attention_cached(nn_cuda_t *h, void *out, const void *q, int ldq,
                                        const void *kcache, const void *vcache, int pos0, int n,
                                        int NH, int NKV, int hd, bmt_error_t *err)
{
    char why[200];
    if (hd < 1 || hd > KVC_MAX_HD)
        snprintf(why, sizeof why, "head size %d: 1 to %d are taken", hd, KVC_MAX_HD);
    else if (NH < 1 || NKV < 1 || NH % NKV != 0)
        snprintf(why, sizeof why, "NH %d, NKV %d: both >= 1 and NH a multiple of NKV", NH, NKV);
    else if (n < 0 || pos0 < 0 || (long long)n * NH > 0x7fffffffLL)
        snprintf(why, sizeof why, "n %d, pos0 %d, NH %d: n >= 0, pos0 >= 0, n NH < 2^31", n, pos0,
                 NH);
    else if (ldq < NH * hd)
        snprintf(why, sizeof why, "ldq %d is less than a row of queries (NH %d x hd %d)", ldq, NH,
                 hd);
    else if (n == 0)
        return 0;
    else {
        attention_cached<<<(unsigned)(n * NH), KVC_WARPS * 32, 0, h->stream>>>(
            (bf16 *)out, (const bf16 *)q, ldq, (const bf16 *)kcache, (const bf16 *)vcache, pos0, NH,
            NKV, hd, 1.0f / sqrtf((float)hd));
        return launched(err, "attention over the KV cache");
    }
    return fail_text(err, "attention over the KV cache", why);
}

extern "C" int nn_cuda_gelu_forward(nn_cuda_t *h, void *out, const void *inp, size_t n,
                                    bmt_error_t *err)
{
    return elementwise_launch<0>(h->stream, out, inp, NULL, n, "gelu forward", err);
}

extern "C" int nn_cuda_gelu_backward(nn_cuda_t *h, void *dinp, const void *inp, const void *dout,
                                     size_t n, bmt_error_t *err)
{
    return elementwise_launch<1>(h->stream, dinp, inp, dout, n, "gelu backward", err);
}

extern "C" int nn_cuda_residual_forward(nn_cuda_t *h, void *out, const void *a, const void *b,
                                        size_t n, bmt_error_t *err)
{
    return elementwise_launch<2>(h->stream, out, a, b, n, "residual", err);
}

extern "C" int nn_cuda_crossentropy(nn_cuda_t *h, float *losses, void *logits, int ldv,
                                    const int32_t *targets, float dloss, int N, int V,
                                    bmt_error_t *err)
{
    if (N > 0) {
        if (ldv % 8 == 0 && (uintptr_t)logits % 16 == 0)
            crossentropy_rows<8, 2><<<(unsigned)N, CE_THREADS, 0, h->stream>>>(
                losses, (bf16 *)logits, ldv, targets, dloss, V, N);
        else
            crossentropy_rows<1, 1><<<(unsigned)N, CE_THREADS, 0, h->stream>>>(
                losses, (bf16 *)logits, ldv, targets, dloss, V, N);
    }
    return launched(err, "cross-entropy");
}

extern "C" int nn_cuda_sum(nn_cuda_t *h, float *out, const float *x, int n, bmt_error_t *err)
{
    sum_f32<<<1, 1024, 0, h->stream>>>(out, x, n);
    return launched(err, "sum");
}

extern "C" int nn_cuda_to_f32(nn_cuda_t *h, float *dst, const void *src, int rows, int cols,
                              int ldv, bmt_error_t *err)
{
    to_f32<<<blocks_for((size_t)rows * cols, 256), 256, 0, h->stream>>>(dst, (const bf16 *)src,
                                                                        rows, cols, ldv);
    return launched(err, "to f32");
}
