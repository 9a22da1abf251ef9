/* tests/mock/nn_cuda_mock.c — the CUDA runtime calls and the nn_cuda_* layers
 * that examples/generate/decode_cuda.c uses, emulated on the CPU, so that the
 * CUDA decoder's host code (its layouts, the stacked q|k|v and gate|up, the
 * cache copies, the chunks, the head's row) runs in `make check` on a machine
 * without a GPU: build/tests/mock/generate-cuda-mock is bin/generate-cuda
 * linked with this file instead of libcudart and nn's kernels
 * (tests/integration/test_generate.sh).
 *
 * "Device" memory is host memory and every copy is a memcpy. Each layer
 * widens its bf16 inputs to f32, runs its CPU twin of nn/ops_cpu.h and
 * nn/llama_ops_cpu.h, and rounds its outputs to bf16, where the kernels round
 * them (a product's bias and GELU are applied before the rounding, as
 * cuBLASLt's epilogue does); norms' statistics stay f32. So the numbers
 * are the GPU's up to the order of f32 sums (the twins sum in double), and the
 * bounds of tests/gpu/test_generate.sh can be set from them. Only what the
 * decoder calls is here; the linker says when it calls something else.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bmt/bmt.h"
#include "nn/llama_ops_cpu.h"
#include "nn/llama_ops_cuda.h"
#include "nn/ops_cpu.h"
#include "nn/ops_cuda.h"

/* Poisoned, as tests/gpu/llama_ops_check.c poisons device buffers: all bits
 * set is NaN in bf16 and f32, so a read of what nothing wrote reaches the
 * logits, which generate checks. */
cudaError_t cudaMalloc(void **p, size_t n)
{
    if ((*p = malloc(n ? n : 1)) == NULL)
        return cudaErrorMemoryAllocation;
    memset(*p, 0xff, n);
    return cudaSuccess;
}
cudaError_t cudaFree(void *p)
{
    free(p);
    return cudaSuccess;
}
const char *cudaGetErrorString(cudaError_t e) { return e ? "mock error" : "no error"; }
cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d)
{
    (void)d;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d)
{
    (void)d;
    memset(p, 0, sizeof(*p));
    strcpy(p->name, "CPU mock");
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k,
                            cudaStream_t st)
{
    (void)k, (void)st;
    memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h,
                              enum cudaMemcpyKind k, cudaStream_t st)
{
    (void)k, (void)st;
    if (dp < w || sp < w)
        return cudaErrorInvalidValue;
    for (size_t i = 0; i < h; i++)
        memmove((char *)d + i * dp, (const char *)s + i * sp, w);
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned f)
{
    (void)f;
    *s = (cudaStream_t)0x1;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    (void)s;
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    (void)s;
    return cudaSuccess;
}

static float *wide(const void *b, size_t n)
{
    float *f = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        f[i] = bmt_bf16_to_f32(((const uint16_t *)b)[i]);
    return f;
}
static float *wide_rows(const void *b, int rows, int cols, int ld)
{
    float *f = malloc((size_t)rows * cols * sizeof(float));
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            f[(size_t)r * cols + c] = bmt_bf16_to_f32(((const uint16_t *)b)[(size_t)r * ld + c]);
    return f;
}
static void narrow_rows(void *b, const float *f, int rows, int cols, int ld)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            ((uint16_t *)b)[(size_t)r * ld + c] = bmt_f32_to_bf16(f[(size_t)r * cols + c]);
}

struct nn_cuda {
    int x;
};
static struct nn_cuda the_handle;
size_t nn_cuda_workspace_bytes(int max_cols) { return (size_t)max_cols * 4 + 64; }
nn_cuda_t *nn_cuda_create(void *stream, void *ws, int max_cols, bmt_error_t *err)
{
    (void)stream, (void)ws, (void)max_cols, (void)err;
    return &the_handle;
}
void nn_cuda_destroy(nn_cuda_t *h) { (void)h; }

int nn_cuda_encoder_forward(nn_cuda_t *h, void *out, const int32_t *inp, const void *wte,
                            const void *wpe, int B, int T, int C, bmt_error_t *err)
{
    (void)h, (void)err;
    const uint16_t *w = wte, *p = wpe;
    for (int n = 0; n < B * T; n++)
        for (int c = 0; c < C; c++) {
            float v = bmt_bf16_to_f32(w[(size_t)inp[n] * C + c]);
            if (p)
                v += bmt_bf16_to_f32(p[(size_t)(n % T) * C + c]);
            ((uint16_t *)out)[(size_t)n * C + c] = bmt_f32_to_bf16(v);
        }
    return 0;
}

int nn_cuda_layernorm_forward(nn_cuda_t *h, void *out, float *mean, float *rstd, const void *inp,
                              const void *weight, const void *bias, int N, int C, bmt_error_t *err)
{
    (void)h, (void)err;
    float *x = wide(inp, (size_t)N * C), *w = wide(weight, C), *b = wide(bias, C),
          *y = malloc((size_t)N * C * 4);
    nn_layernorm_forward(y, mean, rstd, x, w, b, N, C);
    narrow_rows(out, y, N, C, C);
    free(x), free(w), free(b), free(y);
    return 0;
}

int nn_cuda_rmsnorm_forward(nn_cuda_t *h, void *out, float *rstd, const void *inp,
                            const void *weight, int N, int C, float eps, bmt_error_t *err)
{
    (void)h, (void)err;
    float *x = wide(inp, (size_t)N * C), *w = wide(weight, C), *y = malloc((size_t)N * C * 4);
    nn_rmsnorm_forward(y, rstd, x, w, N, C, eps);
    narrow_rows(out, y, N, C, C);
    free(x), free(w), free(y);
    return 0;
}

static void mm(float *y, const void *inp, const void *weight, const void *bias, int N, int IC,
               int OC, int wt)
{
    float *x = wide(inp, (size_t)N * IC), *w = wide(weight, (size_t)IC * OC),
          *b = bias ? wide(bias, OC) : NULL;
    nn_conv1d_forward(y, x, w, b, N, IC, OC, wt);
    free(x), free(w), free(b);
}

int nn_cuda_matmul_forward(nn_cuda_t *h, void *out, int ld_out, const void *inp, const void *weight,
                           const void *bias, int N, int IC, int OC, int wt, bmt_error_t *err)
{
    (void)h, (void)err;
    if (ld_out < OC) {
        fprintf(stderr, "mock: ld_out %d < OC %d\n", ld_out, OC);
        abort();
    }
    float *y = malloc((size_t)N * OC * 4);
    mm(y, inp, weight, bias, N, IC, OC, wt);
    narrow_rows(out, y, N, OC, ld_out);
    free(y);
    return 0;
}

int nn_cuda_matmul_gelu_forward(nn_cuda_t *h, void *out, void *pre, const void *inp,
                                const void *weight, const void *bias, int N, int IC, int OC,
                                bmt_error_t *err)
{
    (void)h, (void)err;
    float *y = malloc((size_t)N * OC * 4), *g = malloc((size_t)N * OC * 4);
    mm(y, inp, weight, bias, N, IC, OC, 0);
    nn_gelu_forward(g, y, N * OC);
    narrow_rows(pre, y, N, OC, OC);
    narrow_rows(out, g, N, OC, OC);
    free(y), free(g);
    return 0;
}

int nn_cuda_residual_forward(nn_cuda_t *h, void *out, const void *a, const void *b, size_t n,
                             bmt_error_t *err)
{
    (void)h, (void)err;
    for (size_t i = 0; i < n; i++)
        ((uint16_t *)out)[i] = bmt_f32_to_bf16(bmt_bf16_to_f32(((const uint16_t *)a)[i]) +
                                               bmt_bf16_to_f32(((const uint16_t *)b)[i]));
    return 0;
}

int nn_cuda_swiglu_forward(nn_cuda_t *h, void *out, const void *gu, int N, int F, bmt_error_t *err)
{
    (void)h, (void)err;
    float *g = wide_rows(gu, N, F, 2 * F), *u = wide_rows((const uint16_t *)gu + F, N, F, 2 * F),
          *y = malloc((size_t)N * F * 4);
    nn_swiglu_forward(y, g, u, N * F);
    narrow_rows(out, y, N, F, F);
    free(g), free(u), free(y);
    return 0;
}

int nn_cuda_rope_forward(nn_cuda_t *h, void *qkv, const float *inv_freq, int B, int T, int NH,
                         int NKV, int hd, int pos0, bmt_error_t *err)
{
    (void)h, (void)err;
    const int row = (NH + 2 * NKV) * hd;
    for (int part = 0; part < 2; part++) {
        const int nh = part ? NKV : NH, off = part ? NH * hd : 0;
        void *base = (uint16_t *)qkv + off;
        float *x = wide_rows(base, B * T, nh * hd, row), *y = malloc((size_t)B * T * nh * hd * 4);
        nn_rope_forward_at(y, x, inv_freq, pos0, B, T, nh, hd);
        narrow_rows(base, y, B * T, nh * hd, row);
        free(x), free(y);
    }
    return 0;
}

int nn_cuda_attention_cached(nn_cuda_t *h, void *out, const void *q, int ldq, const void *kcache,
                             const void *vcache, int pos0, int n, int NH, int NKV, int hd,
                             bmt_error_t *err)
{
    (void)h;
    if (hd < 1 || hd > 256 || NH % NKV || ldq < NH * hd) {
        snprintf(err->text, sizeof err->text, "mock: bad args");
        return -1;
    }
    float *qf = wide_rows(q, n, NH * hd, ldq), *k = wide(kcache, (size_t)(pos0 + n) * NKV * hd),
          *v = wide(vcache, (size_t)(pos0 + n) * NKV * hd);
    float *y = malloc((size_t)n * NH * hd * 4);
    double *s = malloc(((size_t)pos0 + n + hd) * sizeof(double));
    nn_attention_cached(y, qf, NH * hd, k, v, pos0, n, NH, NKV, hd, s);
    narrow_rows(out, y, n, NH * hd, NH * hd);
    free(qf), free(k), free(v), free(y), free(s);
    return 0;
}

int nn_cuda_to_f32(nn_cuda_t *h, float *dst, const void *src, int rows, int cols, int ld,
                   bmt_error_t *err)
{
    (void)h, (void)err;
    float *f = wide_rows(src, rows, cols, ld);
    memcpy(dst, f, (size_t)rows * cols * 4);
    free(f);
    return 0;
}
