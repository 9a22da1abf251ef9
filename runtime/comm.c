/* runtime/comm.c — communicators: what every backend shares.
 *
 * Argument checks, membership bookkeeping, splits and error context live here so
 * that a backend only moves bytes. A split first agrees on membership (from the
 * caller's tables, or by exchanging (color, key) over the parent), then asks the
 * backend to build the child collectively over the parent. Communicator ids are
 * derived, not exchanged: child id = hash(parent id, parent's split count, color),
 * which every member computes identically.
 *
 * After a backend reports an error the communicator is marked aborted and every
 * later call fails at once with the same story: a collective that half-ran on some
 * ranks cannot be trusted to line up with the next one.
 *
 * Under BMT_CHECK_COLLECTIVES=1 every collective is preceded by an all-gather of
 * one fixed-size descriptor per rank (kind, count, dtype, op, root, communicator
 * id, call number) through the backend itself, so that the check of one rank
 * pairs with its peers' checks. Every rank sees the same descriptors and reaches
 * the same verdict: all fail, naming the lowest rank that differs from rank 0,
 * or all go on. The comparison and the message are pure functions (tested in
 * tests/unit/test_collcheck.c); the shm backend uses them for its always-on
 * check too.
 *
 * The "none" backend (membership only) lives here too: bootstrap tests at scale
 * build world, group and replica communicators without moving data.
 */
#include "comm.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctx.h"
#include "hash.h"
#include "error.h"

/* ------------------------------------------------------------ descriptors (pure) */

comm_desc_t comm_desc_make(comm_kind_t kind, uint64_t count, int dtype, int op, int root,
                           uint64_t id, uint64_t seq)
{
    comm_desc_t d = { COMM_DESC_MAGIC, id, seq, count, (int32_t)kind, dtype, op, root };
    switch (kind) {
    case COMM_ALL_GATHER:
        d.op = -1;
        d.root = -1;
        break;
    case COMM_REDUCE_SCATTER:
    case COMM_ALL_REDUCE: d.root = -1; break;
    case COMM_BROADCAST: d.op = -1; break;
    case COMM_CHECK: /* the exchange's own size: count is bytes */
        d.dtype = -1;
        d.op = -1;
        d.root = -1;
        break;
    default: /* barrier, split, none: nothing but the kind */
        d.count = 0;
        d.dtype = -1;
        d.op = -1;
        d.root = -1;
        break;
    }
    return d;
}

bool comm_desc_equal(const comm_desc_t *a, const comm_desc_t *b)
{
    return a->magic == b->magic && a->id == b->id && a->seq == b->seq && a->count == b->count &&
           a->kind == b->kind && a->dtype == b->dtype && a->op == b->op && a->root == b->root;
}

int comm_desc_first_diff(const comm_desc_t *all, int n)
{
    for (int j = 1; j < n; j++)
        if (!comm_desc_equal(&all[j], &all[0]))
            return j;
    return -1;
}

static const char *desc_dtype(int t, char *tmp, size_t len)
{
    if (bmt_dtype_size((bmt_dtype_t)t) != 0)
        return bmt_dtype_name((bmt_dtype_t)t);
    snprintf(tmp, len, "dtype %d", t);
    return tmp;
}

static const char *desc_op(int op, char *tmp, size_t len)
{
    if (op >= 0 && op < BMT_OP_COUNT)
        return bmt_op_name((bmt_op_t)op);
    snprintf(tmp, len, "op %d", op);
    return tmp;
}

char *comm_desc_format(char *buf, size_t len, const comm_desc_t *d, const comm_desc_t *vs)
{
    char t[24], o[24];
    unsigned long long n = (unsigned long long)d->count;
    if (len == 0)
        return buf;
    if (d->magic != COMM_DESC_MAGIC) {
        snprintf(buf, len, "no collective check (is BMT_CHECK_COLLECTIVES=1 on every rank?)");
        return buf;
    }
    switch (d->kind) {
    case COMM_ALL_GATHER:
        snprintf(buf, len, "all_gather(count %llu, %s)", n, desc_dtype(d->dtype, t, sizeof(t)));
        break;
    case COMM_REDUCE_SCATTER:
    case COMM_ALL_REDUCE:
        snprintf(buf, len, "%s(count %llu, %s, %s)",
                 d->kind == COMM_ALL_REDUCE ? "all_reduce" : "reduce_scatter", n,
                 desc_dtype(d->dtype, t, sizeof(t)), desc_op(d->op, o, sizeof(o)));
        break;
    case COMM_BROADCAST:
        snprintf(buf, len, "broadcast(count %llu, %s, root %d)", n,
                 desc_dtype(d->dtype, t, sizeof(t)), (int)d->root);
        break;
    case COMM_BARRIER: snprintf(buf, len, "barrier()"); break;
    case COMM_SPLIT: snprintf(buf, len, "a split of the communicator"); break;
    case COMM_CHECK: snprintf(buf, len, "a collective check (BMT_CHECK_COLLECTIVES=1)"); break;
    case COMM_KIND_NONE: snprintf(buf, len, "the next step of a longer collective"); break;
    default: snprintf(buf, len, "an unknown collective (kind %d)", (int)d->kind); break;
    }
    size_t used = strlen(buf);
    if (vs && vs->magic == COMM_DESC_MAGIC && d->id != vs->id && used < len)
        used += (size_t)snprintf(buf + used, len - used, " on communicator %016llx",
                                 (unsigned long long)d->id);
    if (vs && vs->magic == COMM_DESC_MAGIC && d->seq != vs->seq && used < len)
        snprintf(buf + used, len - used, " as call #%llu", (unsigned long long)d->seq);
    return buf;
}

int comm_desc_mismatch(bmt_error_t *err, const char *lead, const comm_desc_t *d, int rank,
                       int world_rank, const comm_desc_t *d0, int world_rank0)
{
    char a[160], b[160], wa[32] = "", wb[32] = "";
    if (world_rank != rank || world_rank0 != 0) {
        snprintf(wa, sizeof(wa), " (world rank %d)", world_rank);
        snprintf(wb, sizeof(wb), " (world rank %d)", world_rank0);
    }
    return errprintf(err, "%srank %d%s issued %s while rank 0%s issued %s", lead ? lead : "", rank,
                     wa, comm_desc_format(a, sizeof(a), d, d0), wb,
                     comm_desc_format(b, sizeof(b), d0, d));
}

int comm_desc_check(const comm_desc_t *all, int n, const int *members, const char *lead,
                    bmt_error_t *err)
{
    int j = comm_desc_first_diff(all, n);
    if (j < 0)
        return 0;
    return comm_desc_mismatch(err, lead, &all[j], j, members ? members[j] : j, &all[0],
                              members ? members[0] : 0);
}

/* ------------------------------------------------------------ ids */

static uint64_t child_id(uint64_t parent, uint32_t seq, int color)
{
    return mix64(parent ^ mix64(((uint64_t)seq << 32) ^ (uint32_t)color ^ 0x9e3779b97f4a7c15ULL));
}

/* ------------------------------------------------------------ the "none" backend */

static int none_create_world(bmt_comm_t *world, bmt_error_t *err) { return 0; }

static int none_create_split(bmt_comm_t *parent, int color, int key, bmt_comm_t *child,
                             bmt_error_t *err)
{
    return 0;
}

static int none_refuse(bmt_comm_t *c, bmt_error_t *err)
{
    return errprintf(err, "the 'none' backend moves no data (BMT_BACKEND=none); "
                          "use shm on CPU or nccl on GPUs");
}

static int none_all_gather(bmt_comm_t *c, const void *s, void *r, size_t n, bmt_dtype_t t,
                           bmt_error_t *err)
{
    return none_refuse(c, err);
}

static int none_reduce(bmt_comm_t *c, const void *s, void *r, size_t n, bmt_dtype_t t, bmt_op_t op,
                       bmt_error_t *err)
{
    return none_refuse(c, err);
}

static int none_broadcast(bmt_comm_t *c, void *b, size_t n, bmt_dtype_t t, int root,
                          bmt_error_t *err)
{
    return none_refuse(c, err);
}

static int none_barrier(bmt_comm_t *c, bmt_error_t *err) { return none_refuse(c, err); }

static int none_all_gather_host(bmt_comm_t *c, const void *s, void *r, size_t bytes, void *stream,
                                bmt_error_t *err)
{
    return none_refuse(c, err);
}

static void none_abort(bmt_comm_t *c) {}

static void none_destroy(bmt_comm_t *c) {}

const struct comm_backend comm_backend_none = {
    .name = "none",
    .create_world = none_create_world,
    .create_split = none_create_split,
    .all_gather = none_all_gather,
    .reduce_scatter = none_reduce,
    .all_reduce = none_reduce,
    .broadcast = none_broadcast,
    .barrier = none_barrier,
    .all_gather_host = none_all_gather_host,
    .abort = none_abort,
    .destroy = none_destroy,
};

const struct comm_backend *comm_backend_find(const char *name)
{
    if (strcmp(name, "none") == 0)
        return &comm_backend_none;
    if (strcmp(name, "shm") == 0)
        return &comm_backend_shm;
#ifdef BMT_HAVE_NCCL
    if (strcmp(name, "nccl") == 0)
        return &comm_backend_nccl;
#endif
    return NULL;
}

/* ------------------------------------------------------------ lifetime */

static bmt_comm_t *comm_alloc(bmt_ctx_t *ctx, const struct comm_backend *be, const char *name)
{
    bmt_comm_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->ctx = ctx;
    c->be = be;
    c->timeout_s = ctx->timeout_s;
    c->check = ctx->check_collectives;
    snprintf(c->name, sizeof(c->name), "%s", name ? name : "comm");
    return c;
}

void comm_free(bmt_comm_t *c)
{
    if (c == NULL)
        return;
    /* After any failure in this process, flushing (ncclCommFinalize) could wait
     * for a peer that is gone or stuck: abort instead. */
    if (c->ctx->comm_failed && !c->aborted) {
        c->aborted = true;
        c->be->abort(c);
    }
    c->be->destroy(c);
    free(c->check_all);
    free(c->members);
    free(c);
}

bmt_comm_t *comm_create_world(bmt_ctx_t *ctx, const struct comm_backend *be, bmt_error_t *err)
{
    bmt_comm_t *c = comm_alloc(ctx, be, "world");
    if (c == NULL) {
        errprintf(err, "rank %d: out of memory creating the world communicator", ctx->rank);
        return NULL;
    }
    c->rank = ctx->rank;
    c->size = ctx->world;
    c->id = comm_world_id(ctx->job_hash);
    if (be->create_world(c, err) < 0) {
        errprefix(err, "rank %d: %s backend, world communicator: ", ctx->rank, be->name);
        comm_free(c);
        return NULL;
    }
    return c;
}

/* A member of a split, ordered by (key, parent rank). */
struct member {
    int key;
    int parent_rank;
};

static int member_cmp(const void *a, const void *b)
{
    const struct member *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return (x->parent_rank > y->parent_rank) - (x->parent_rank < y->parent_rank);
}

int comm_split_known(bmt_comm_t *parent, const int *colors, const int *keys, const char *name,
                     bmt_comm_t **out, bmt_error_t *err)
{
    bmt_ctx_t *ctx = parent->ctx;
    if (parent->aborted)
        return errprintf(err, COMM_WHERE_FMT " was aborted by an earlier error", ctx->rank,
                         parent->name);
    int color = colors[parent->rank];
    uint32_t seq = parent->splits++;
    bmt_comm_t *child = NULL;
    if (color >= 0) {
        child = comm_alloc(ctx, parent->be, name);
        int n = 0;
        for (int i = 0; i < parent->size; i++)
            n += colors[i] == color;
        struct member *tmp = malloc(sizeof(*tmp) * (size_t)(n ? n : 1));
        if (child)
            child->members = malloc(sizeof(int) * (size_t)(n ? n : 1));
        if (child == NULL || child->members == NULL || tmp == NULL) {
            free(tmp);
            free(child ? child->members : NULL);
            free(child);
            child = NULL;
            /* Still take part in the backend's collective part so peers do not hang;
             * report the failure afterwards. */
        } else {
            int m = 0;
            for (int i = 0; i < parent->size; i++)
                if (colors[i] == color)
                    tmp[m++] = (struct member){ keys[i], i };
            qsort(tmp, (size_t)n, sizeof(*tmp), member_cmp);
            child->size = n;
            child->rank = -1;
            for (int i = 0; i < n; i++) {
                child->members[i] = bmt_comm_member(parent, tmp[i].parent_rank);
                if (tmp[i].parent_rank == parent->rank)
                    child->rank = i;
            }
            free(tmp);
            child->id = child_id(parent->id, seq, color);
        }
    }
    bool oom = color >= 0 && child == NULL;
    if (parent->be->create_split(parent, oom ? -1 : color, keys[parent->rank], child, err) < 0) {
        errprefix(err, COMM_WHERE_FMT ": split into %s: ", ctx->rank, parent->name,
                  name ? name : "comm");
        comm_free(child);
        return -1;
    }
    if (oom)
        return errprintf(err, "rank %d: out of memory splitting %s", ctx->rank, parent->name);
    *out = child;
    return 0;
}

/* ------------------------------------------------------------ public API */

int bmt_comm_rank(const bmt_comm_t *comm) { return comm ? comm->rank : -1; }

int bmt_comm_size(const bmt_comm_t *comm) { return comm ? comm->size : 0; }

const char *bmt_comm_name(const bmt_comm_t *comm) { return comm ? comm->name : "(none)"; }

int bmt_comm_member(const bmt_comm_t *comm, int i)
{
    if (comm == NULL || i < 0 || i >= comm->size)
        return -1;
    return comm->members ? comm->members[i] : i;
}

int bmt_comm_split(bmt_comm_t *parent, int color, int key, const char *name, bmt_comm_t **out,
                   bmt_error_t *err)
{
    if (parent == NULL || out == NULL)
        return errprintf(err, "bmt_comm_split: parent and out must not be NULL");
    bmt_ctx_t *ctx = parent->ctx;
    if (parent->aborted)
        return errprintf(err, COMM_WHERE_FMT " was aborted by an earlier error", ctx->rank,
                         parent->name);
    int n = parent->size;
    int *pairs = malloc(sizeof(int) * 2 * (size_t)n);
    int *colors = malloc(sizeof(int) * (size_t)n);
    int *keys = malloc(sizeof(int) * (size_t)n);
    int mine[2] = { color < 0 ? -1 : color, key };
    int rc = -1;
    /* pairs[] is in the parent's comm-rank order, except after the PMIx
     * exchange of the none backend, which is in world-rank order: a parent
     * holding every rank in another order (a world split by key) maps them. */
    bool by_world = false;
    if (pairs == NULL || colors == NULL || keys == NULL) {
        errprintf(err, "rank %d: out of memory splitting %s", ctx->rank, parent->name);
        goto out;
    }
    /* Exchange (color, key). The data backends carry it as raw bytes in a device
     * buffer (an all-gather moves bytes unchanged, so 2-byte bf16 elements are a
     * typeless carrier); "none" moves no data, so it goes over PMIx, which only
     * works when the parent is the whole world. */
    if (parent->be == &comm_backend_none) {
        if (n != ctx->world) {
            errprintf(err, "rank %d: the 'none' backend can only split the world", ctx->rank);
            goto out;
        }
        if (boot_allgather(ctx->boot, mine, sizeof(mine), pairs, err) < 0)
            goto out;
        by_world = true;
    } else {
        void *dev = bmt_mem_alloc(ctx, sizeof(int) * 2 * ((size_t)n + 1), err);
        if (dev == NULL)
            goto out;
        char *dall = (char *)dev + sizeof(mine);
        if (bmt_mem_upload(ctx, dev, mine, sizeof(mine), err) < 0 ||
            bmt_all_gather(parent, dev, dall, sizeof(mine) / 2, BMT_BF16, err) < 0 ||
            bmt_mem_download(ctx, pairs, dall, sizeof(int) * 2 * (size_t)n, err) < 0) {
            bmt_mem_free(ctx, dev);
            goto out;
        }
        bmt_mem_free(ctx, dev);
    }
    for (int i = 0; i < n; i++) {
        int at = by_world ? bmt_comm_member(parent, i) : i;
        colors[i] = pairs[2 * at];
        keys[i] = pairs[2 * at + 1];
    }
    rc = comm_split_known(parent, colors, keys, name, out, err);
out:
    free(pairs);
    free(colors);
    free(keys);
    return rc;
}

void bmt_comm_destroy(bmt_comm_t *comm)
{
    if (comm == NULL || comm->owned)
        return;
    comm_free(comm);
}

static int check_common(bmt_comm_t *c, const char *op, bmt_dtype_t dtype, bmt_error_t *err)
{
    if (c == NULL)
        return errprintf(err, "%s: communicator is NULL", op);
    if (c->aborted)
        return errprintf(err, COMM_WHERE_FMT ": %s: communicator was aborted by an earlier error",
                         c->ctx->rank, c->name, op);
    if (bmt_dtype_size(dtype) == 0)
        return errprintf(err, COMM_WHERE_FMT ": %s: invalid dtype %d", c->ctx->rank, c->name, op,
                         (int)dtype);
    return 0;
}

static int check_count(bmt_comm_t *c, const char *op, size_t count, bmt_dtype_t dtype,
                       size_t factor, bmt_error_t *err)
{
    size_t es = bmt_dtype_size(dtype);
    if (factor && count > SIZE_MAX / factor / es)
        return errprintf(err, COMM_WHERE_FMT ": %s: %zu elements x %zu ranks overflows",
                         c->ctx->rank, c->name, op, count, factor);
    return 0;
}

static int failed(bmt_comm_t *c, const char *op, bmt_error_t *err)
{
    if (c->be == &comm_backend_none) /* a refusal, nothing started: the communicator stays */
        return errprefix(err, COMM_WHERE_FMT ": %s: ", c->ctx->rank, c->name, op);
    c->aborted = true;
    c->ctx->comm_failed = true;
    c->be->abort(c);
    return errprefix(err, COMM_WHERE_FMT ": %s: ", c->ctx->rank, c->name, op);
}

/* Mark c aborted after an error that err already describes in full. */
static int abort_with(bmt_comm_t *c, bmt_error_t *err)
{
    c->aborted = true;
    c->ctx->comm_failed = true;
    c->be->abort(c);
    return -1;
}

/* Before collective number ++c->calls: under BMT_CHECK_COLLECTIVES, agree on
 * what it is with every member (one all-gather of a descriptor), or fail it on
 * every rank and abort c. op and root are -1 where the kind has none; stream is
 * the one the collective will be enqueued on (NULL: a synchronous call). */
static int agree(bmt_comm_t *c, const char *what, comm_kind_t kind, size_t count, bmt_dtype_t dtype,
                 int op, int root, void *stream, bmt_error_t *err)
{
    uint64_t seq = ++c->calls;
    if (!c->check || c->size == 1)
        return 0;
    if (c->check_all == NULL) {
        c->check_all = calloc((size_t)c->size, sizeof(comm_desc_t));
        if (c->check_all == NULL) {
            errprintf(err, "out of memory for the collective check (BMT_CHECK_COLLECTIVES)");
            return failed(c, what, err);
        }
    }
    comm_desc_t mine = comm_desc_make(kind, count, (int)dtype, op, root, c->id, seq);
    if (c->be->all_gather_host(c, &mine, c->check_all, sizeof(mine), stream, err) < 0) {
        errprefix(err, "collective check (call #%llu): ", (unsigned long long)seq);
        return failed(c, what, err);
    }
    char lead[128];
    snprintf(lead, sizeof(lead), "rank %d: collective check (%s, call #%llu): ", c->ctx->rank,
             c->name, (unsigned long long)seq);
    if (comm_desc_check(c->check_all, c->size, c->members, lead, err) < 0)
        return abort_with(c, err);
    return 0;
}

/* Everything the callers of a reduction or gather must get right; factor is the
 * communicator size for the ops whose buffers scale with it. NO_OP: a gather. */
#define NO_OP (-1)
static int check_args(bmt_comm_t *c, const char *what, const void *send, const void *recv,
                      size_t count, bmt_dtype_t dtype, long op, size_t factor, bmt_error_t *err)
{
    if (check_common(c, what, dtype, err) < 0 ||
        check_count(c, what, count, dtype, factor, err) < 0)
        return -1;
    if (op != NO_OP && (op < 0 || op >= BMT_OP_COUNT))
        return errprintf(err, COMM_WHERE_FMT ": %s: invalid op %ld", c->ctx->rank, c->name, what,
                         op);
    if (count && (send == NULL || recv == NULL))
        return errprintf(err, COMM_WHERE_FMT ": %s: NULL buffer", c->ctx->rank, c->name, what);
    return 0;
}

static double comm_clock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int bmt_all_gather(bmt_comm_t *c, const void *send, void *recv, size_t count, bmt_dtype_t dtype,
                   bmt_error_t *err)
{
    if (check_args(c, "all_gather", send, recv, count, dtype, NO_OP, c ? (size_t)c->size : 1, err) <
        0)
        return -1;
    double t0 = comm_clock();
    if (agree(c, "all_gather", COMM_ALL_GATHER, count, dtype, -1, -1, NULL, err) < 0)
        return -1;
    int rc = c->be->all_gather(c, send, recv, count, dtype, err);
    c->ctx->comm_host_s += comm_clock() - t0; /* comm_wait_s on cpu (bmt/monitor.h) */
    if (rc < 0)
        return failed(c, "all_gather", err);
    return 0;
}

int bmt_reduce_scatter(bmt_comm_t *c, const void *send, void *recv, size_t count, bmt_dtype_t dtype,
                       bmt_op_t op, bmt_error_t *err)
{
    if (check_args(c, "reduce_scatter", send, recv, count, dtype, (long)op, c ? (size_t)c->size : 1,
                   err) < 0)
        return -1;
    double t0 = comm_clock();
    if (agree(c, "reduce_scatter", COMM_REDUCE_SCATTER, count, dtype, (int)op, -1, NULL, err) < 0)
        return -1;
    int rc = c->be->reduce_scatter(c, send, recv, count, dtype, op, err);
    c->ctx->comm_host_s += comm_clock() - t0; /* comm_wait_s on cpu (bmt/monitor.h) */
    if (rc < 0)
        return failed(c, "reduce_scatter", err);
    return 0;
}

int bmt_all_reduce(bmt_comm_t *c, const void *send, void *recv, size_t count, bmt_dtype_t dtype,
                   bmt_op_t op, bmt_error_t *err)
{
    if (check_args(c, "all_reduce", send, recv, count, dtype, (long)op, 1, err) < 0)
        return -1;
    double t0 = comm_clock();
    if (agree(c, "all_reduce", COMM_ALL_REDUCE, count, dtype, (int)op, -1, NULL, err) < 0)
        return -1;
    int rc = c->be->all_reduce(c, send, recv, count, dtype, op, err);
    c->ctx->comm_host_s += comm_clock() - t0; /* comm_wait_s on cpu (bmt/monitor.h) */
    if (rc < 0)
        return failed(c, "all_reduce", err);
    return 0;
}

/* ------------------------------------------------------------ on a stream */

int comm_all_gather_on(bmt_comm_t *c, const void *send, void *recv, size_t count, bmt_dtype_t dtype,
                       void *stream, bmt_error_t *err)
{
    if (stream == NULL || c->be->all_gather_on == NULL) /* no stream: the synchronous call */
        return bmt_all_gather(c, send, recv, count, dtype, err);
    if (check_args(c, "all_gather", send, recv, count, dtype, NO_OP, (size_t)c->size, err) < 0 ||
        agree(c, "all_gather", COMM_ALL_GATHER, count, dtype, -1, -1, stream, err) < 0)
        return -1;
    if (c->be->all_gather_on(c, send, recv, count, dtype, stream, err) < 0)
        return failed(c, "all_gather", err);
    return 0;
}

int comm_reduce_scatter_on(bmt_comm_t *c, const void *send, void *recv, size_t count,
                           bmt_dtype_t dtype, bmt_op_t op, void *stream, bmt_error_t *err)
{
    if (stream == NULL || c->be->reduce_scatter_on == NULL) /* no stream: the synchronous call */
        return bmt_reduce_scatter(c, send, recv, count, dtype, op, err);
    if (check_args(c, "reduce_scatter", send, recv, count, dtype, (long)op, (size_t)c->size, err) <
            0 ||
        agree(c, "reduce_scatter", COMM_REDUCE_SCATTER, count, dtype, (int)op, -1, stream, err) < 0)
        return -1;
    if (c->be->reduce_scatter_on(c, send, recv, count, dtype, op, stream, err) < 0)
        return failed(c, "reduce_scatter", err);
    return 0;
}

int comm_all_reduce_on(bmt_comm_t *c, const void *send, void *recv, size_t count, bmt_dtype_t dtype,
                       bmt_op_t op, void *stream, bmt_error_t *err)
{
    if (stream == NULL || c->be->all_reduce_on == NULL) /* no stream: the synchronous call */
        return bmt_all_reduce(c, send, recv, count, dtype, op, err);
    if (check_args(c, "all_reduce", send, recv, count, dtype, (long)op, 1, err) < 0 ||
        agree(c, "all_reduce", COMM_ALL_REDUCE, count, dtype, (int)op, -1, stream, err) < 0)
        return -1;
    if (c->be->all_reduce_on(c, send, recv, count, dtype, op, stream, err) < 0)
        return failed(c, "all_reduce", err);
    return 0;
}

int comm_poll(bmt_comm_t *c, bmt_error_t *err)
{
    if (c == NULL || c->be->poll == NULL)
        return 0;
    if (c->aborted)
        return errprintf(err, COMM_WHERE_FMT ": communicator was aborted by an earlier error",
                         c->ctx->rank, c->name);
    if (c->be->poll(c, err) < 0)
        return failed(c, "asynchronous error", err);
    return 0;
}

void comm_abort(bmt_comm_t *c)
{
    if (c == NULL || c->aborted)
        return;
    c->aborted = true;
    c->ctx->comm_failed = true;
    c->be->abort(c);
}

int bmt_broadcast(bmt_comm_t *c, void *buf, size_t count, bmt_dtype_t dtype, int root,
                  bmt_error_t *err)
{
    if (check_common(c, "broadcast", dtype, err) < 0 ||
        check_count(c, "broadcast", count, dtype, 1, err) < 0)
        return -1;
    if (root < 0 || root >= c->size)
        return errprintf(err, COMM_WHERE_FMT ": broadcast: root %d is not in [0, %d)", c->ctx->rank,
                         c->name, root, c->size);
    if (count && buf == NULL)
        return errprintf(err, COMM_WHERE_FMT ": broadcast: NULL buffer", c->ctx->rank, c->name);
    double t0 = comm_clock();
    if (agree(c, "broadcast", COMM_BROADCAST, count, dtype, -1, root, NULL, err) < 0)
        return -1;
    int rc = c->be->broadcast(c, buf, count, dtype, root, err);
    c->ctx->comm_host_s += comm_clock() - t0; /* comm_wait_s on cpu (bmt/monitor.h) */
    if (rc < 0)
        return failed(c, "broadcast", err);
    return 0;
}

int bmt_barrier(bmt_comm_t *c, bmt_error_t *err)
{
    if (check_common(c, "barrier", BMT_F32, err) < 0)
        return -1;
    double t0 = comm_clock();
    if (agree(c, "barrier", COMM_BARRIER, 0, BMT_F32, -1, -1, NULL, err) < 0)
        return -1;
    int rc = c->be->barrier(c, err);
    c->ctx->comm_host_s += comm_clock() - t0; /* comm_wait_s on cpu (bmt/monitor.h) */
    if (rc < 0)
        return failed(c, "barrier", err);
    return 0;
}

int bmt_all_reduce_host_f64(bmt_comm_t *c, double *v, size_t n, bmt_op_t op, bmt_error_t *err)
{
    if (c == NULL || (n > 0 && v == NULL))
        return errprintf(err, "bmt_all_reduce_host_f64: the communicator or the buffer is NULL");
    if (n > SIZE_MAX / sizeof(double))
        return errprintf(err, "bmt_all_reduce_host_f64: %zu doubles overflow a size", n);
    bmt_ctx_t *ctx = c->ctx;
    double *d = bmt_alloc(ctx, BMT_MEM_WORKSPACE, n * sizeof(double), err);
    if (d == NULL)
        return -1;
    int rc = bmt_mem_upload(ctx, d, v, n * sizeof(double), err);
    if (rc == 0)
        rc = bmt_all_reduce(c, d, d, n, BMT_F64, op, err);
    if (rc == 0)
        rc = bmt_mem_download(ctx, v, d, n * sizeof(double), err);
    bmt_free(ctx, d);
    return rc;
}
