/* bench/overlap_cuda.cu — the GPU side of bench/overlap: a block that is one
 * bf16 matrix product (cuBLAS, f32 accumulation), and CUDA events around each
 * block's compute so the host can see when the compute stream started and
 * stopped every block.
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>

extern "C" {

struct ov {
    cublasHandle_t h;
    int n, rows, blocks;
    __nv_bfloat16 *x; /* (blocks + 1, rows, n) activations */
    cudaEvent_t *start, *stop;
};

static struct ov g;

static __global__ void fill(__nv_bfloat16 *p, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2bfloat16(((i * 2654435761u) % 1000) / 1000.0f - 0.5f);
}

int ov_setup(int n, int rows, int blocks)
{
    g.n = n;
    g.rows = rows;
    g.blocks = blocks;
    if (cublasCreate(&g.h) != CUBLAS_STATUS_SUCCESS)
        return -1;
    size_t elems = (size_t)(blocks + 1) * rows * n;
    if (cudaMalloc(&g.x, elems * sizeof(__nv_bfloat16)) != cudaSuccess)
        return -1;
    fill<<<1024, 256>>>(g.x, elems);
    g.start = (cudaEvent_t *)calloc((size_t)blocks, sizeof(cudaEvent_t));
    g.stop = (cudaEvent_t *)calloc((size_t)blocks, sizeof(cudaEvent_t));
    for (int i = 0; i < blocks; i++)
        if (cudaEventCreate(&g.start[i]) != cudaSuccess ||
            cudaEventCreate(&g.stop[i]) != cudaSuccess)
            return -1;
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : -1;
}

/* Block i: x[i+1] = x[i] W (rows x n times n x n), timed by events on stream. */
int ov_block(int i, const void *w, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    cublasSetStream(g.h, s);
    cudaEventRecord(g.start[i], s);
    const float one = 1.0f, zero = 0.0f;
    size_t act = (size_t)g.rows * g.n;
    /* Row-major Y = X W is column-major Y^T = W^T X^T. */
    cublasStatus_t st =
        cublasGemmEx(g.h, CUBLAS_OP_N, CUBLAS_OP_N, g.n, g.rows, g.n, &one, w, CUDA_R_16BF, g.n,
                     g.x + i * act, CUDA_R_16BF, g.n, &zero, g.x + (i + 1) * act, CUDA_R_16BF, g.n,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cudaEventRecord(g.stop[i], s);
    return st == CUBLAS_STATUS_SUCCESS ? 0 : -1;
}

/* After the stream is idle: total compute (sum of block times) and exposed
 * waiting (gaps between the end of block i-1 and the start of block i), ms. */
int ov_timeline(float *compute_ms, float *gaps_ms, float *span_ms)
{
    if (cudaDeviceSynchronize() != cudaSuccess)
        return -1;
    float c = 0, gap = 0, t;
    for (int i = 0; i < g.blocks; i++) {
        cudaEventElapsedTime(&t, g.start[i], g.stop[i]);
        c += t;
        if (i > 0) {
            cudaEventElapsedTime(&t, g.stop[i - 1], g.start[i]);
            gap += t;
        }
    }
    cudaEventElapsedTime(&t, g.start[0], g.stop[g.blocks - 1]);
    *compute_ms = c;
    *gaps_ms = gap;
    *span_ms = t;
    return 0;
}
}
