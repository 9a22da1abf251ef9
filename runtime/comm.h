/* runtime/comm.h — communicators and the backend interface (internal).
 *
 * comm.c owns what every backend shares: argument checks, membership, split
 * bookkeeping, error prefixes and the aborted state. A backend (comm_shm.c,
 * comm_nccl.c, and "none" in comm.c) supplies the operations below. Buffers are
 * on the context's device. Every operation completes before it returns and
 * honours the communicator's deadline (comm->timeout_s).
 */
#ifndef BMT_RUNTIME_COMM_H
#define BMT_RUNTIME_COMM_H

#include <stdbool.h>
#include <stdint.h>

#include "bmt/bmt.h"

struct bmt_comm {
    bmt_ctx_t *ctx;
    const struct comm_backend *be;
    char name[48]; /* "world", "group 3", "replica 1", or the split's name */
    int rank;      /* rank in this communicator */
    int size;
    int *members;    /* (size) world rank of each member; NULL: identity (world) */
    uint64_t id;     /* agreed by all members: hash of the parent's id, split seq, color */
    uint32_t splits; /* splits of this communicator so far (all members agree) */
    double timeout_s;
    bool owned;   /* destroyed by bmt_finalize, not by the user */
    bool aborted; /* a collective failed: every further call fails at once */
    void *impl;   /* backend state */
};

struct comm_backend {
    const char *name;
    /* Build the backend state of the world communicator (rank, size, id filled).
     * Collective over the whole job; may use the boot channel (ctx.h). */
    int (*create_world)(bmt_comm_t *world, bmt_error_t *err);
    /* Build child's backend state (membership, rank, size, id filled). Collective
     * over parent; child is NULL on ranks that join no communicator (color < 0),
     * which still take part in whatever the backend does over parent. */
    int (*create_split)(bmt_comm_t *parent, int color, int key, bmt_comm_t *child,
                        bmt_error_t *err);
    int (*all_gather)(bmt_comm_t *c, const void *send, void *recv, size_t count, bmt_dtype_t dtype,
                      bmt_error_t *err);
    int (*reduce_scatter)(bmt_comm_t *c, const void *send, void *recv, size_t count,
                          bmt_dtype_t dtype, bmt_op_t op, bmt_error_t *err);
    int (*all_reduce)(bmt_comm_t *c, const void *send, void *recv, size_t count, bmt_dtype_t dtype,
                      bmt_op_t op, bmt_error_t *err);
    int (*broadcast)(bmt_comm_t *c, void *buf, size_t count, bmt_dtype_t dtype, int root,
                     bmt_error_t *err);
    int (*barrier)(bmt_comm_t *c, bmt_error_t *err);
    /* The same three, enqueued on stream (a cudaStream_t) without waiting; the
     * caller synchronizes (bmt_device_synchronize). NULL: the backend has no
     * streams, and comm.c runs the synchronous operation instead. */
    int (*all_gather_on)(bmt_comm_t *c, const void *send, void *recv, size_t count,
                         bmt_dtype_t dtype, void *stream, bmt_error_t *err);
    int (*reduce_scatter_on)(bmt_comm_t *c, const void *send, void *recv, size_t count,
                             bmt_dtype_t dtype, bmt_op_t op, void *stream, bmt_error_t *err);
    int (*all_reduce_on)(bmt_comm_t *c, const void *send, void *recv, size_t count,
                         bmt_dtype_t dtype, bmt_op_t op, void *stream, bmt_error_t *err);
    /* Report an asynchronous error of enqueued work (nccl: ncclCommGetAsyncError).
     * NULL: nothing is ever asynchronous. */
    int (*poll)(bmt_comm_t *c, bmt_error_t *err);
    /* Mark the backend state unusable after an error (nccl: ncclCommAbort). */
    void (*abort)(bmt_comm_t *c);
    /* Release the backend state (impl may be NULL after a failed create). */
    void (*destroy)(bmt_comm_t *c);
};

extern const struct comm_backend comm_backend_none;
extern const struct comm_backend comm_backend_shm;
#ifdef BMT_HAVE_NCCL
extern const struct comm_backend comm_backend_nccl;
#endif

/* Look a backend up by name; NULL if unknown or not built. */
const struct comm_backend *comm_backend_find(const char *name);

/* Create the world communicator of ctx with backend be (collective). */
bmt_comm_t *comm_create_world(bmt_ctx_t *ctx, const struct comm_backend *be, bmt_error_t *err);

/* Split with membership computed by the caller: every rank of parent passes the
 * same (color, key) arrays indexed by parent rank, so no exchange is needed
 * (the layout's group and replica splits). */
int comm_split_known(bmt_comm_t *parent, const int *colors, const int *keys, const char *name,
                     bmt_comm_t **out, bmt_error_t *err);

/* Free a communicator regardless of ownership (bmt_finalize). */
void comm_free(bmt_comm_t *c);

/* Collectives enqueued on a stream (the engine's). Checked like the public
 * ones; on failure the communicator is aborted. Completion: see
 * bmt_device_synchronize. With stream NULL, or on cpu backends, they are the
 * synchronous calls and complete before returning. */
int comm_all_gather_on(bmt_comm_t *c, const void *send, void *recv, size_t count, bmt_dtype_t dtype,
                       void *stream, bmt_error_t *err);
int comm_reduce_scatter_on(bmt_comm_t *c, const void *send, void *recv, size_t count,
                           bmt_dtype_t dtype, bmt_op_t op, void *stream, bmt_error_t *err);
int comm_all_reduce_on(bmt_comm_t *c, const void *send, void *recv, size_t count, bmt_dtype_t dtype,
                       bmt_op_t op, void *stream, bmt_error_t *err);

/* Check for an asynchronous error of enqueued work; on one, abort c. */
int comm_poll(bmt_comm_t *c, bmt_error_t *err);

/* Abort c (NULL: no-op): every later call fails at once. */
void comm_abort(bmt_comm_t *c);

/* "rank 3: <name>" context for messages. */
#define COMM_WHERE_FMT "rank %d: %s"

#endif
