/* runtime/device.c — memory on the context's device (cpu: malloc, cuda: cudaMalloc).
 *
 * The smallest layer the communicators and their tests need: allocate, free and
 * copy to and from the host. CUDA errors are turned into messages here, where
 * they enter our code. (The training engine grows this into the full device
 * layer with streams, events and per-kind byte accounting.)
 */
#include <stdlib.h>
#include <string.h>

#include "bmt/bmt.h"
#include "ctx.h"
#include "error.h"

#ifdef BMT_HAVE_CUDA
#include <cuda_runtime.h>

static int cuda_fail(bmt_ctx_t *ctx, bmt_error_t *err, const char *call, cudaError_t e)
{
    return errprintf(err, "rank %d: %s on cuda:%d: %s", ctx->rank, call, ctx->device_index,
                     cudaGetErrorString(e));
}
#endif

void *bmt_mem_alloc(bmt_ctx_t *ctx, size_t bytes, bmt_error_t *err)
{
    if (bytes == 0)
        bytes = 1; /* a distinct, freeable pointer, as malloc(0) is not promised to be */
    if (ctx->device == BMT_DEVICE_CPU) {
        void *p = malloc(bytes);
        if (p == NULL)
            errprintf(err, "rank %d: out of host memory allocating %zu bytes", ctx->rank, bytes);
        return p;
    }
#ifdef BMT_HAVE_CUDA
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        cuda_fail(ctx, err, "cudaMalloc", e);
        return NULL;
    }
    return p;
#else
    errprintf(err, "rank %d: this libbmt was built without CUDA", ctx->rank);
    return NULL;
#endif
}

void bmt_mem_free(bmt_ctx_t *ctx, void *ptr)
{
    if (ptr == NULL)
        return;
    if (ctx->device == BMT_DEVICE_CPU) {
        free(ptr);
        return;
    }
#ifdef BMT_HAVE_CUDA
    cudaFree(ptr);
#endif
}

static int copy(bmt_ctx_t *ctx, void *dst, const void *src, size_t bytes, int to_device,
                bmt_error_t *err)
{
    if (bytes == 0)
        return 0;
    if (ctx->device == BMT_DEVICE_CPU) {
        memmove(dst, src, bytes);
        return 0;
    }
#ifdef BMT_HAVE_CUDA
    /* cudaMemcpy from pageable host memory may return before the DMA into the
     * device has landed; a stream that does not wait for the legacy stream (such
     * as NCCL's) could then read half-copied data. Wait for it: these copies
     * promise completion. */
    cudaError_t e =
        cudaMemcpy(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
    if (e == cudaSuccess && to_device)
        e = cudaStreamSynchronize(0);
    if (e != cudaSuccess)
        return cuda_fail(ctx, err, "cudaMemcpy", e);
    return 0;
#else
    return errprintf(err, "rank %d: this libbmt was built without CUDA", ctx->rank);
#endif
}

int bmt_mem_upload(bmt_ctx_t *ctx, void *dst, const void *host_src, size_t bytes, bmt_error_t *err)
{
    return copy(ctx, dst, host_src, bytes, 1, err);
}

int bmt_mem_download(bmt_ctx_t *ctx, void *host_dst, const void *src, size_t bytes,
                     bmt_error_t *err)
{
    return copy(ctx, host_dst, src, bytes, 0, err);
}
