/* bmt/device.h — memory and streams of the context's device, with accounting.
 *
 * Every allocation the runtime makes goes through bmt_alloc with a kind, and the
 * context keeps current and peak bytes per kind (not counted: NCCL's and
 * cuBLAS's own buffers, the nccl backend's 4-byte barrier scratch, and an 8 KiB
 * scratch that each gradient-norm reduction takes and returns on its stream). That is how the
 * invariant "sharded from birth" is checked: a rank's parameter, gradient and optimizer bytes equal
 * its shard sizes, and the full-block buffers never exceed K blocks (docs/engine.md). Models
 * allocate their activations here too (kind BMT_MEM_ACTIVATION) so that the figures are whole.
 *
 * Streams: on cuda the context owns three CUDA streams, made at bmt_init:
 *   compute  - the model's kernels (block forward and backward run here);
 *   comm     - gathers of block parameters and reduce-scatters of gradients;
 *   replica  - the all-reduce of gradient shards across groups.
 * Work moves between them through CUDA events only; the host never waits
 * inside a step except where the optimizer reads the gradient norm. On cpu
 * everything is synchronous and the stream handles are NULL.
 */
#ifndef BMT_DEVICE_H
#define BMT_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "bmt/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bmt_ctx bmt_ctx_t;

typedef enum bmt_mem_kind {
    BMT_MEM_PARAM = 0,  /* parameter shards, compute dtype */
    BMT_MEM_GATHERED,   /* full (gathered) parameter buffers of blocks */
    BMT_MEM_GRAD_FULL,  /* full gradient buffers of blocks in backward */
    BMT_MEM_GRAD,       /* gradient shards (f32) */
    BMT_MEM_OPTIM,      /* optimizer state: f32 master shards, moments */
    BMT_MEM_ACTIVATION, /* activations (allocated by the model) */
    BMT_MEM_WORKSPACE,  /* everything else: staging, scratch, reductions */
    BMT_MEM_KIND_COUNT
} bmt_mem_kind_t;

/* "param", "gathered", "grad_full", "grad", "optim", "activation", "workspace". */
BMT_API const char *bmt_mem_kind_name(bmt_mem_kind_t kind);

/* Allocate bytes of device memory (host memory on cpu) counted under kind.
 * bytes 0 gives a distinct freeable pointer. NULL and err on failure. */
BMT_API void *bmt_alloc(bmt_ctx_t *ctx, bmt_mem_kind_t kind, size_t bytes, bmt_error_t *err);

/* Free memory from bmt_alloc or bmt_mem_alloc. NULL, or a pointer that is not
 * one of this context's (already freed, say): no-op. */
BMT_API void bmt_free(bmt_ctx_t *ctx, void *ptr);

/* Stream-ordered memory, for what lives only part of a step (a model's
 * activations, the runtime's gradient shards). Work enqueued on stream after
 * bmt_alloc_async may use the memory, and work on other streams that waits for
 * it through an event; bmt_free_async gives it back once the work enqueued on
 * stream before it is done, and a later bmt_alloc_async on that stream may
 * take it again at once, with no synchronization of the host. stream NULL: the
 * compute stream. On cuda the memory comes from a CUDA memory pool of the
 * context that keeps what it has reserved, so a step's allocations after the
 * first cost no cudaMalloc (one pool per context stream: a stream's frees serve
 * its own allocations); on cpu (the host is every stream) these are
 * bmt_alloc and bmt_free. The counters count the bytes from one call to the
 * other, as torch.cuda.max_memory_allocated does; what the pool holds beyond
 * that (granularity, fragmentation) is in bmt_mem_pool_stats. bmt_free of such
 * memory is bmt_free_async on the compute stream. */
BMT_API void *bmt_alloc_async(bmt_ctx_t *ctx, bmt_mem_kind_t kind, size_t bytes, void *stream,
                              bmt_error_t *err);
BMT_API void bmt_free_async(bmt_ctx_t *ctx, void *ptr, void *stream);

/* Stream-ordered memory: *in_use, the bytes allocated from the pools now
 * (counted in the stats too); *reserved and *reserved_high, what the pools
 * hold from the device now and the sum of the most each has held. All three
 * are cuda's: on cpu bmt_alloc_async is bmt_alloc, no pool, and all are 0, as
 * before the first bmt_alloc_async. What the process holds from the device for bmt is then
 * current_total - in_use + reserved (the counterpart of
 * torch.cuda.memory_reserved). Any pointer may be NULL. */
BMT_API void bmt_mem_pool_stats(const bmt_ctx_t *ctx, uint64_t *in_use, uint64_t *reserved,
                                uint64_t *reserved_high);

typedef struct bmt_mem_stats {
    uint64_t current[BMT_MEM_KIND_COUNT]; /* bytes allocated now */
    uint64_t peak[BMT_MEM_KIND_COUNT];    /* most bytes at any time since the last reset */
    uint64_t current_total, peak_total;
} bmt_mem_stats_t;

BMT_API void bmt_mem_get_stats(const bmt_ctx_t *ctx, bmt_mem_stats_t *out);

/* Start the peaks again from the current figures. */
BMT_API void bmt_mem_reset_peaks(bmt_ctx_t *ctx);

/* The compute stream as a cudaStream_t (cast it), NULL on cpu. Launch the model's
 * kernels on the stream a block callback receives; this is the same one. */
BMT_API void *bmt_compute_stream(bmt_ctx_t *ctx);

/* Wait (host) until the context's streams are idle, watching every
 * communicator for asynchronous errors, bounded by BMT_TIMEOUT. */
BMT_API int bmt_device_synchronize(bmt_ctx_t *ctx, bmt_error_t *err);

#ifdef __cplusplus
}
#endif
#endif
