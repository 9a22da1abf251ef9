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

/* ------------------------------------------------------------ collective descriptors
 *
 * What a rank is about to do on a communicator, so that the ranks can compare it
 * before any data moves: always in the shm backend (each rank posts it in its
 * line of the segment), and in every backend under BMT_CHECK_COLLECTIVES=1 (an
 * all-gather of one descriptor per rank before each collective, comm.c). Fields a
 * kind does not use are canonical (0 or -1), so equal calls compare equal. */
typedef enum comm_kind {
    COMM_KIND_NONE = 0,  /* shm: this rank's sync was a later step of a longer collective */
    COMM_ALL_GATHER,     /* count, dtype */
    COMM_REDUCE_SCATTER, /* count, dtype, op */
    COMM_ALL_REDUCE,     /* count, dtype, op */
    COMM_BROADCAST,      /* count, dtype, root */
    COMM_BARRIER,        /* - */
    COMM_SPLIT,          /* shm: the barrier over the parent that ends a split */
    COMM_CHECK,          /* the descriptor exchange of BMT_CHECK_COLLECTIVES itself */
    COMM_KIND_COUNT
} comm_kind_t;

#define COMM_DESC_MAGIC 0x31435345445f4d42ULL /* "BM_DESC1" in memory order */

/* One rank's descriptor; exchanged as raw bytes between ranks of one build. */
typedef struct comm_desc {
    uint64_t magic; /* COMM_DESC_MAGIC: anything else is not a descriptor */
    uint64_t id;    /* the communicator's id (struct bmt_comm.id) */
    uint64_t seq;   /* this collective's number on the communicator, from 1 */
    uint64_t count; /* elements, as the call's count argument */
    int32_t kind;   /* comm_kind_t */
    int32_t dtype;  /* bmt_dtype_t, -1 where unused */
    int32_t op;     /* bmt_op_t, -1 where unused */
    int32_t root;   /* broadcast's root, -1 where unused */
} comm_desc_t;
_Static_assert(sizeof(comm_desc_t) == 48, "a descriptor has no padding and a fixed size");

/* The canonical descriptor of a call: fields kind does not use are reset. */
comm_desc_t comm_desc_make(comm_kind_t kind, uint64_t count, int dtype, int op, int root,
                           uint64_t id, uint64_t seq);

/* Whether two descriptors describe the same call (every field equal). */
bool comm_desc_equal(const comm_desc_t *a, const comm_desc_t *b);

/* The lowest rank of all (n descriptors, by comm rank) whose descriptor differs
 * from rank 0's; -1 when all agree. */
int comm_desc_first_diff(const comm_desc_t *all, int n);

/* Spell d into buf (always terminated), e.g. "all_gather(count 4096, bf16)" or
 * "all_reduce(count 1, f64, sum)"; " on communicator <id>" and " as call #<seq>"
 * are added where they differ from vs (NULL: never). Returns buf. */
char *comm_desc_format(char *buf, size_t len, const comm_desc_t *d, const comm_desc_t *vs);

/* Fill err with "<lead>rank R issued <d> while rank 0 issued <d0>" (each rank with
 * its world rank in parentheses when one of them differs from its comm rank) and
 * return -1. */
int comm_desc_mismatch(bmt_error_t *err, const char *lead, const comm_desc_t *d, int rank,
                       int world_rank, const comm_desc_t *d0, int world_rank0);

/* Compare all (n descriptors by comm rank; members: world rank of each, NULL for
 * the identity): 0 when they agree, else comm_desc_mismatch for the lowest rank
 * that differs from rank 0. Pure: no I/O. */
int comm_desc_check(const comm_desc_t *all, int n, const int *members, const char *lead,
                    bmt_error_t *err);

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
    bool owned;             /* destroyed by bmt_finalize, not by the user */
    bool aborted;           /* a collective failed: every further call fails at once */
    bool check;             /* BMT_CHECK_COLLECTIVES (from the context): agree before every call */
    uint64_t calls;         /* collectives issued on this communicator (members agree) */
    comm_desc_t *check_all; /* (size) host: the last check's descriptors; NULL until used */
    void *impl;             /* backend state */
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
    /* All-gather of bytes (a multiple of 8) per rank from host memory into host
     * memory (size, bytes): the descriptor exchange of BMT_CHECK_COLLECTIVES. It
     * completes before returning, and pairs with the same call on every member.
     * stream: where the collective it checks will run (a cudaStream_t; NULL: the
     * communicator's own), so the check runs after what was enqueued there. */
    int (*all_gather_host)(bmt_comm_t *c, const void *send, void *recv, size_t bytes, void *stream,
                           bmt_error_t *err);
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
