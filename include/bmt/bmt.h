/* bmt/bmt.h — the libbmt runtime API.
 *
 * A rank program calls bmt_init() once. It joins the job through PMIx (started by
 * bmlaunch, which is the PMIx server, or by `srun --mpi=pmix`), learns the
 * two-level layout (bmt/layout.h), picks its device (cpu, or cuda:<local_rank>)
 * and builds three communicators:
 *   world   all ranks;
 *   group   the ranks of this rank's group (parameters are sharded over it);
 *   replica the ranks with this rank's group_rank in every group (gradient
 *           shards are all-reduced over it).
 * Two backends implement them: "shm" (POSIX shared memory among the ranks of one
 * node; CPU buffers) and "nccl" (GPU buffers). A third, "none", builds the
 * communicators' membership only (bootstrap tests at scale); its collectives fail.
 *
 * Errors follow bmt/error.h: 0/-1 or pointer/NULL, and a one-line bmt_error_t.
 * Every collective has a deadline (BMT_TIMEOUT seconds): a peer that never
 * arrives gives an error naming the communicator and the missing rank instead of
 * a hang. After a failed collective the communicator is aborted: every further
 * call on it fails at once.
 */
#ifndef BMT_BMT_H
#define BMT_BMT_H

#include <stddef.h>
#include <stdint.h>

#include "bmt/error.h"
#include "bmt/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BMT_VERSION_MAJOR 0
#define BMT_VERSION_MINOR 1
#define BMT_VERSION_PATCH 0
#define BMT_VERSION_STRING "0.1.0"

/* Element types of communicated and stored buffers. */
typedef enum bmt_dtype {
    BMT_F32 = 0,
    BMT_BF16 = 1,
    BMT_F64 = 2,
    BMT_DTYPE_COUNT
} bmt_dtype_t;

/* Reductions. AVG divides the sum by the communicator size. */
typedef enum bmt_op {
    BMT_SUM = 0,
    BMT_AVG = 1,
    BMT_MAX = 2,
    BMT_OP_COUNT
} bmt_op_t;

typedef enum bmt_device_kind {
    BMT_DEVICE_CPU = 0,
    BMT_DEVICE_CUDA = 1
} bmt_device_kind_t;

/* Bytes per element (0 for an invalid dtype) and the name ("f32", "bf16", "f64"). */
BMT_API size_t bmt_dtype_size(bmt_dtype_t dtype);
BMT_API const char *bmt_dtype_name(bmt_dtype_t dtype);
BMT_API const char *bmt_op_name(bmt_op_t op);

/* Options of bmt_init. Start from BMT_CONFIG_INITIALIZER; fields left NULL or 0
 * take their value from the environment (docs/env.md) or the default. */
typedef struct bmt_config {
    size_t size;         /* sizeof(bmt_config_t), for extension */
    uint32_t magic;      /* BMT_CONFIG_MAGIC */
    uint32_t version;    /* BMT_CONFIG_VERSION */
    const char *device;  /* "cpu" or "cuda"; NULL: BMT_DEVICE, else "cpu" */
    const char *backend; /* "shm", "nccl" or "none"; NULL: BMT_BACKEND, else by device */
    double timeout_s;    /* deadline of bootstrap and collectives; 0: BMT_TIMEOUT, else 300;
                          * negative, NaN or above 1e9: bmt_init fails */
} bmt_config_t;

#define BMT_CONFIG_MAGIC 0x434d4254u /* "BMTC" */
#define BMT_CONFIG_VERSION 1u
#define BMT_CONFIG_INITIALIZER                                                                     \
    {                                                                                              \
        sizeof(bmt_config_t), BMT_CONFIG_MAGIC, BMT_CONFIG_VERSION, NULL, NULL, 0.0                \
    }

typedef struct bmt_ctx bmt_ctx_t;   /* one per process */
typedef struct bmt_comm bmt_comm_t; /* owned by the context unless made by bmt_comm_split */

/* Join the job and build the world, group and replica communicators.
 *   cfg: options, or NULL for all defaults.
 * A program started without PMIx (no PMIX_NAMESPACE in the environment) runs as a
 * 1x1 job of its own. Every rank's layout, device, backend and
 * BMT_CHECK_COLLECTIVES must be rank 0's (compared through PMIx before any
 * communicator exists: every rank fails otherwise, naming the first that
 * differs), and on cuda PMIx's local rank must be the layout's (it picks the
 * GPU). Returns the context in *out; on failure *out is untouched,
 * nothing is left allocated, and err names the step, the rank (once PMIx has
 * given it: a bad BMT_TIMEOUT or BMT_CHECK_COLLECTIVES is "bmt_init: ...") and
 * the cause. */
BMT_API int bmt_init(bmt_ctx_t **out, const bmt_config_t *cfg, bmt_error_t *err);

/* Finalize the monitor plugins (each flushes what it holds), tear down the
 * communicators (finalizing NCCL ones) and leave PMIx. NULL: no-op, 0.
 * Returns 0, or -1 with the reason on stderr ("bmt: rank N: bmt_finalize:
 * ..."): make the program's exit status non-zero then, for what the job
 * produced is incomplete.
 *   - Block lists and optimizers must be destroyed first: while one lives it
 *     finalizes nothing (their destroy needs the context) and returns -1;
 *     call it again after destroying them. Only in this case does ctx stay.
 *   - A monitor plugin failed at any time, its final flush included (jsonl:
 *     the disk filled, or its fsync failed): the job's metrics are incomplete
 *     (not with BMT_PLUGIN_ERRORS=warn). Everything is finalized still.
 *   - cuda: the device's queued work did not finish within BMT_TIMEOUT (a
 *     collective never completed); the communicators are aborted, not
 *     flushed.
 * Before this returned void; a caller that ignores the value compiles and
 * links unchanged. */
BMT_API int bmt_finalize(bmt_ctx_t *ctx);

/* End the whole job now: asks the launcher (through PMIx_Abort) to stop every rank
 * with this status, and prints msg in the launcher's summary. Returns only when
 * the job could not be aborted that way (then exit yourself). */
BMT_API void bmt_abort(bmt_ctx_t *ctx, int status, const char *msg);

BMT_API int bmt_rank(const bmt_ctx_t *ctx);
BMT_API int bmt_world_size(const bmt_ctx_t *ctx);
BMT_API const bmt_layout_t *bmt_layout(const bmt_ctx_t *ctx);
BMT_API bmt_rank_info_t bmt_self(const bmt_ctx_t *ctx);
BMT_API bmt_device_kind_t bmt_device(const bmt_ctx_t *ctx);
BMT_API int bmt_device_index(const bmt_ctx_t *ctx); /* CUDA ordinal, -1 on CPU */
BMT_API const char *bmt_backend(const bmt_ctx_t *ctx);
BMT_API const char *bmt_hostname(const bmt_ctx_t *ctx);
BMT_API double bmt_timeout(const bmt_ctx_t *ctx);

BMT_API bmt_comm_t *bmt_comm_world(bmt_ctx_t *ctx);
BMT_API bmt_comm_t *bmt_comm_group(bmt_ctx_t *ctx);
BMT_API bmt_comm_t *bmt_comm_replica(bmt_ctx_t *ctx);

BMT_API int bmt_comm_rank(const bmt_comm_t *comm);
BMT_API int bmt_comm_size(const bmt_comm_t *comm);
BMT_API const char *bmt_comm_name(const bmt_comm_t *comm);
/* World rank of member i (comm rank i), or -1 if i is out of range. */
BMT_API int bmt_comm_member(const bmt_comm_t *comm, int i);

/* Split parent into communicators of the ranks with equal color, ordered by
 * (key, parent rank). Collective over parent. color < 0: this rank joins none and
 * *out is set to NULL. name (copied) labels the new communicator in errors.
 * Destroy the result with bmt_comm_destroy. */
BMT_API int bmt_comm_split(bmt_comm_t *parent, int color, int key, const char *name,
                           bmt_comm_t **out, bmt_error_t *err);
/* Destroy a communicator made by bmt_comm_split. NULL: no-op. */
BMT_API void bmt_comm_destroy(bmt_comm_t *comm);

/* Collectives. Buffers live on the context's device (host memory for shm, device
 * memory for nccl); they complete before the call returns. Semantics are NCCL's:
 *   all_gather:     send count elements, recv count*size (rank i's at i*count).
 *   reduce_scatter: send count*size elements, recv count (the reduction of the
 *                   i-th count-sized block lands on rank i).
 *   all_reduce:     count elements; send == recv allowed (in place).
 *   broadcast:      count elements from root's buf into every rank's buf.
 * Every rank receives bitwise-identical results. bf16 reductions: the shm backend
 * accumulates in f32 in rank order and rounds once; nccl follows NCCL (rounding
 * to bf16 at each step of its ring or tree). count may be 0. */
BMT_API int bmt_all_gather(bmt_comm_t *comm, const void *send, void *recv, size_t count,
                           bmt_dtype_t dtype, bmt_error_t *err);
BMT_API int bmt_reduce_scatter(bmt_comm_t *comm, const void *send, void *recv, size_t count,
                               bmt_dtype_t dtype, bmt_op_t op, bmt_error_t *err);
BMT_API int bmt_all_reduce(bmt_comm_t *comm, const void *send, void *recv, size_t count,
                           bmt_dtype_t dtype, bmt_op_t op, bmt_error_t *err);
BMT_API int bmt_broadcast(bmt_comm_t *comm, void *buf, size_t count, bmt_dtype_t dtype, int root,
                          bmt_error_t *err);
BMT_API int bmt_barrier(bmt_comm_t *comm, bmt_error_t *err);

/* All-reduce of n doubles in host memory, whatever the device (on cuda they go
 * through a device buffer of the context: the collectives above take device
 * memory). For a program's own figures (a loss, a flag); synchronizes. */
BMT_API int bmt_all_reduce_host_f64(bmt_comm_t *comm, double *v, size_t n, bmt_op_t op,
                                    bmt_error_t *err);

/* Out-of-band all-gather over the whole job through PMIx (slow; for setup data
 * such as hostnames): every rank contributes len bytes (the same len everywhere),
 * all receives world*len bytes ordered by rank. Collective over the world. */
BMT_API int bmt_oob_allgather(bmt_ctx_t *ctx, const void *mine, size_t len, void *all,
                              bmt_error_t *err);

/* The same in two halves, for when a rank needs only some peers' data (at
 * scale, a world-wide all-gather costs every rank world fetches):
 * bmt_oob_publish (collective over the world; every rank publishes len bytes,
 * the same len everywhere) makes them available, and bmt_oob_fetch copies rank
 * peer's bytes of the latest publication (local, cheap). */
BMT_API int bmt_oob_publish(bmt_ctx_t *ctx, const void *mine, size_t len, bmt_error_t *err);
BMT_API int bmt_oob_fetch(bmt_ctx_t *ctx, int peer, void *buf, size_t len, bmt_error_t *err);

/* Memory on the context's device: host memory on cpu, device memory on cuda.
 * upload and download copy bytes (0: nothing, any pointers); a NULL context
 * or buffer otherwise is -1 with err. */
BMT_API void *bmt_mem_alloc(bmt_ctx_t *ctx, size_t bytes, bmt_error_t *err);
BMT_API void bmt_mem_free(bmt_ctx_t *ctx, void *ptr);
BMT_API int bmt_mem_upload(bmt_ctx_t *ctx, void *dst, const void *host_src, size_t bytes,
                           bmt_error_t *err);
BMT_API int bmt_mem_download(bmt_ctx_t *ctx, void *host_dst, const void *src, size_t bytes,
                             bmt_error_t *err);

/* bf16 <-> f32 on the host: round to nearest even; NaN stays NaN. */
BMT_API uint16_t bmt_f32_to_bf16(float x);
BMT_API float bmt_bf16_to_f32(uint16_t x);

#ifdef __cplusplus
}
#endif
#endif
