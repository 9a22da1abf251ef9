/* runtime/comm_nccl.c — the nccl backend: GPU buffers, NCCL communicators.
 *
 * World: rank 0 makes the unique id, PMIx carries it to everyone (boot_bcast:
 * Put/Commit/Fence(collect)/Get), every rank calls ncclCommInitRankConfig.
 * Group and replica communicators come from ncclCommSplit of the world; no more
 * ids are exchanged.
 *
 * Two kinds of NCCL communicator, for two measured reasons (bench/NOTES.md,
 * 2026-11-30, 2x H200):
 *   - a non-blocking one ("boot", world only) for everything that waits on
 *     peers to show up: init and the splits of the world. Every such call
 *     returns at once and is polled (ncclCommGetAsyncError) against the
 *     deadline, so a peer that never arrives is an error, not a hang.
 *   - blocking ones for the collectives. Non-blocking NCCL hands every call to a
 *     background thread: +55 us per call, 2x slower at 16 MiB. Blocking calls
 *     only enqueue a kernel, so they cannot wait on a peer either, once every
 *     connection exists: NCCL_RUNTIME_CONNECT=0 (set unless the user set it)
 *     makes NCCL connect at creation instead of inside the first collective.
 *     Completion is polled (cudaStreamQuery, and ncclCommGetAsyncError for
 *     NCCL's own errors) against the deadline; on timeout or error the
 *     communicator is aborted (ncclCommAbort) and the error names the
 *     communicator, the operation and the rank.
 * Splits of a communicator other than the world go through its blocking
 * handle: they are bounded only by the launcher's fail-fast (docs/runtime.md).
 *
 * Each communicator has its own stream; the collectives of this layer complete
 * before returning (the training engine issues on its own streams).
 *
 * BMT_CHECK_COLLECTIVES: the descriptors travel through a small device buffer
 * made with the communicator (NCCL moves device memory only) and a pinned host
 * one (so that neither copy waits on the host), on the communicator's stream,
 * polled against the deadline like every collective. The check of one of the
 * engine's stream-ordered collectives runs on the engine's stream, after what
 * was enqueued there (the engine's earlier collectives on this communicator),
 * so the host waits for that work before each such collective (debug only).
 */
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "boot.h"
#include "comm.h"
#include "ctx.h"
#include "error.h"

typedef struct nccl_state {
    ncclComm_t comm;     /* blocking, for collectives; NULL once aborted or destroyed */
    ncclComm_t boot;     /* non-blocking world communicator (world only): init, splits */
    cudaStream_t stream; /* this communicator's stream */
    float *scratch;      /* (1) f32, device: the barrier's all-reduce */
    char *check;         /* (size + 1, sizeof(comm_desc_t)) bytes, device: mine, then all;
                          * NULL unless BMT_CHECK_COLLECTIVES */
    char *check_host;    /* the same, pinned host memory */
} nccl_state_t;

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Spin briefly (latency of small collectives), then yield, then sleep: a rank
 * waiting on a slow peer should not steal a core from it. */
static void backoff(unsigned *iter)
{
    unsigned i = (*iter)++;
    if (i < 2000)
        return;
    if (i < 4000) {
        sched_yield();
        return;
    }
    struct timespec ts = { 0, 50000 };
    nanosleep(&ts, NULL);
}

static void state_abort(nccl_state_t *s)
{
    if (s && s->comm) {
        ncclCommAbort(s->comm);
        s->comm = NULL;
    }
    if (s && s->boot) {
        ncclCommAbort(s->boot);
        s->boot = NULL;
    }
}

/* Wait until comm's asynchronous state leaves ncclInProgress. */
static int wait_ready(bmt_comm_t *c, ncclComm_t comm, const char *call, double deadline,
                      bmt_error_t *err)
{
    unsigned it = 0;
    for (;;) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(comm, &st);
        if (r != ncclSuccess)
            return errprintf(err, "ncclCommGetAsyncError after %s: %s", call,
                             ncclGetErrorString(r));
        if (st == ncclSuccess)
            return 0;
        if (st != ncclInProgress)
            return errprintf(err, "%s: %s (%s)", call, ncclGetErrorString(st),
                             ncclGetLastError(comm));
        if (mono_s() > deadline)
            return errprintf(err, "%s: not every rank of %s arrived within %.1f s (BMT_TIMEOUT)",
                             call, c->name, c->timeout_s);
        backoff(&it);
    }
}

/* Wait for the work on stream (the collective's kernel), watching NCCL's errors. */
static int wait_on(bmt_comm_t *c, nccl_state_t *s, cudaStream_t stream, const char *call,
                   bmt_error_t *err)
{
    double deadline = mono_s() + c->timeout_s;
    unsigned it = 0;
    for (;;) {
        cudaError_t e = cudaStreamQuery(stream);
        if (e == cudaSuccess)
            return 0;
        if (e != cudaErrorNotReady)
            return errprintf(err, "%s: %s", call, cudaGetErrorString(e));
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError(s->comm, &st) == ncclSuccess && st != ncclSuccess &&
            st != ncclInProgress)
            return errprintf(err, "%s: %s (%s)", call, ncclGetErrorString(st),
                             ncclGetLastError(s->comm));
        if (mono_s() > deadline)
            return errprintf(err,
                             "%s: did not complete within %.1f s: a peer of %s is missing "
                             "or stuck (BMT_TIMEOUT)",
                             call, c->timeout_s, c->name);
        backoff(&it);
    }
}

static int wait_stream(bmt_comm_t *c, nccl_state_t *s, const char *call, bmt_error_t *err)
{
    return wait_on(c, s, s->stream, call, err);
}

static int state_new(bmt_comm_t *c, nccl_state_t **out, bmt_error_t *err)
{
    nccl_state_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return errprintf(err, "out of memory");
    /* A blocking stream: it orders after work the caller put on the legacy
     * default stream, so "the input is ready" needs no extra event. */
    cudaError_t e = cudaStreamCreate(&s->stream);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&s->scratch, sizeof(float));
    if (e == cudaSuccess && c->check)
        e = cudaMalloc((void **)&s->check, ((size_t)c->size + 1) * sizeof(comm_desc_t));
    if (e == cudaSuccess && c->check)
        e = cudaMallocHost((void **)&s->check_host, ((size_t)c->size + 1) * sizeof(comm_desc_t));
    if (e != cudaSuccess) {
        if (s->check)
            cudaFree(s->check);
        if (s->scratch)
            cudaFree(s->scratch);
        if (s->stream)
            cudaStreamDestroy(s->stream);
        free(s);
        return errprintf(err, "creating the stream of %s: %s", c->name, cudaGetErrorString(e));
    }
    *out = s;
    return 0;
}

static void state_free(nccl_state_t *s)
{
    if (s == NULL)
        return;
    if (s->scratch)
        cudaFree(s->scratch);
    if (s->check)
        cudaFree(s->check);
    if (s->check_host)
        cudaFreeHost(s->check_host);
    if (s->stream)
        cudaStreamDestroy(s->stream);
    free(s);
}

static ncclConfig_t make_config(bmt_comm_t *c, int blocking)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = blocking;
    cfg.commName = c->name;
    return cfg;
}

/* Split parent (polled against deadline) into *out with the given blocking mode.
 * *out is NULL for color < 0. */
static int split(bmt_comm_t *named, ncclComm_t parent, int color, int key, int blocking,
                 ncclComm_t *out, double deadline, bmt_error_t *err)
{
    ncclConfig_t cfg = make_config(named, blocking);
    *out = NULL;
    ncclResult_t r = ncclCommSplit(parent, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, out, &cfg);
    int rc = 0;
    if (r != ncclSuccess && r != ncclInProgress)
        rc = errprintf(err, "ncclCommSplit: %s (%s)", ncclGetErrorString(r),
                       ncclGetLastError(parent));
    if (rc == 0)
        rc = wait_ready(named, parent, "ncclCommSplit", deadline, err);
    if (rc == 0 && *out)
        rc = wait_ready(named, *out, "ncclCommSplit", deadline, err);
    if (rc < 0 && *out) {
        ncclCommAbort(*out);
        *out = NULL;
    }
    return rc;
}

static int nccl_create_world(bmt_comm_t *c, bmt_error_t *err)
{
    bmt_ctx_t *ctx = c->ctx;
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (c->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess)
            return errprintf(err, "ncclGetUniqueId: %s (%s)", ncclGetErrorString(r),
                             ncclGetLastError(NULL));
    }
    /* Every rank takes part in the exchange, even one that will fail later, so
     * that no peer waits for it in vain. */
    if (boot_bcast(ctx->boot, 0, &id, sizeof(id), err) < 0)
        return -1;
    nccl_state_t *s = NULL;
    if (state_new(c, &s, err) < 0)
        return -1;
    /* NCCL_RUNTIME_CONNECT=0 (connect everything at creation, so that no
     * blocking collective waits on a peer's handshake) was set by bmt_init. */
    ncclConfig_t cfg = make_config(c, 0);
    double deadline = mono_s() + c->timeout_s;
    ncclResult_t r = ncclCommInitRankConfig(&s->boot, c->size, id, c->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        errprintf(err, "ncclCommInitRankConfig: %s (%s)", ncclGetErrorString(r),
                  ncclGetLastError(NULL));
        state_abort(s);
        state_free(s);
        return -1;
    }
    if (wait_ready(c, s->boot, "ncclCommInitRankConfig", deadline, err) < 0 ||
        split(c, s->boot, 0, c->rank, 1, &s->comm, deadline, err) < 0) {
        state_abort(s);
        state_free(s);
        return -1;
    }
    c->impl = s;
    return 0;
}

static int nccl_create_split(bmt_comm_t *parent, int color, int key, bmt_comm_t *child,
                             bmt_error_t *err)
{
    nccl_state_t *ps = parent->impl;
    nccl_state_t *s = NULL;
    if (ps == NULL || ps->comm == NULL)
        return errprintf(err, "the NCCL communicator was aborted");
    if (child && state_new(child, &s, err) < 0)
        color = -1; /* still take part in the collective split */
    ncclComm_t out = NULL;
    double deadline = mono_s() + parent->timeout_s;
    int rc = split(child ? child : parent, ps->boot ? ps->boot : ps->comm, color, key, 1, &out,
                   deadline, err);
    if (rc == 0 && child && s == NULL)
        rc = -1; /* state_new's error is in err */
    if (rc < 0) {
        if (out)
            ncclCommAbort(out);
        state_free(s);
        return -1;
    }
    if (child) {
        s->comm = out;
        child->impl = s;
    }
    return 0;
}

static ncclDataType_t nccl_type(bmt_dtype_t t)
{
    switch (t) {
    case BMT_BF16: return ncclBfloat16;
    case BMT_F64: return ncclFloat64;
    default: return ncclFloat32;
    }
}

/* The NCCL op of op on c. On a communicator of one rank the average is the
 * sum (x / 1 is x, exactly), and NCCL before 2.29.7 ran its one-rank average
 * through a kernel that leaves the last elements of the output unwritten when
 * the count is not a multiple of its block count (NVIDIA/nccl#1950: the
 * output's tail keeps whatever it held): ncclSum there is a plain copy. */
static ncclRedOp_t nccl_op(const bmt_comm_t *c, bmt_op_t op)
{
    switch (op) {
    case BMT_AVG: return c->size == 1 ? ncclSum : ncclAvg;
    case BMT_MAX: return ncclMax;
    default: return ncclSum;
    }
}

/* Issue-and-wait common to every collective: r is what the NCCL call returned. */
static int finish(bmt_comm_t *c, ncclResult_t r, const char *call, bmt_error_t *err)
{
    nccl_state_t *s = c->impl;
    if (r != ncclSuccess && r != ncclInProgress)
        return errprintf(err, "%s: %s (%s)", call, ncclGetErrorString(r),
                         ncclGetLastError(s->comm));
    if (r == ncclInProgress && wait_ready(c, s->comm, call, mono_s() + c->timeout_s, err) < 0)
        return -1;
    return wait_stream(c, s, call, err);
}

static int live(bmt_comm_t *c, bmt_error_t *err)
{
    nccl_state_t *s = c->impl;
    if (s == NULL || s->comm == NULL)
        return errprintf(err, "the NCCL communicator was aborted");
    return 0;
}

static int nccl_all_gather(bmt_comm_t *c, const void *send, void *recv, size_t count,
                           bmt_dtype_t dtype, bmt_error_t *err)
{
    if (live(c, err) < 0)
        return -1;
    nccl_state_t *s = c->impl;
    return finish(c, ncclAllGather(send, recv, count, nccl_type(dtype), s->comm, s->stream),
                  "ncclAllGather", err);
}

static int nccl_reduce_scatter(bmt_comm_t *c, const void *send, void *recv, size_t count,
                               bmt_dtype_t dtype, bmt_op_t op, bmt_error_t *err)
{
    if (live(c, err) < 0)
        return -1;
    nccl_state_t *s = c->impl;
    return finish(
        c,
        ncclReduceScatter(send, recv, count, nccl_type(dtype), nccl_op(c, op), s->comm, s->stream),
        "ncclReduceScatter", err);
}

static int nccl_all_reduce(bmt_comm_t *c, const void *send, void *recv, size_t count,
                           bmt_dtype_t dtype, bmt_op_t op, bmt_error_t *err)
{
    if (live(c, err) < 0)
        return -1;
    nccl_state_t *s = c->impl;
    return finish(
        c, ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(c, op), s->comm, s->stream),
        "ncclAllReduce", err);
}

static int nccl_broadcast(bmt_comm_t *c, void *buf, size_t count, bmt_dtype_t dtype, int root,
                          bmt_error_t *err)
{
    if (live(c, err) < 0)
        return -1;
    nccl_state_t *s = c->impl;
    return finish(c, ncclBroadcast(buf, buf, count, nccl_type(dtype), root, s->comm, s->stream),
                  "ncclBroadcast", err);
}

static int nccl_barrier(bmt_comm_t *c, bmt_error_t *err)
{
    if (live(c, err) < 0)
        return -1;
    nccl_state_t *s = c->impl;
    return finish(
        c, ncclAllReduce(s->scratch, s->scratch, 1, ncclFloat32, ncclSum, s->comm, s->stream),
        "barrier (ncclAllReduce)", err);
}

/* Host to host through s->check: upload, all-gather and download queued on
 * stream (else s->stream) from pinned memory, then one polled wait: nothing here
 * can block past the deadline. */
static int nccl_all_gather_host(bmt_comm_t *c, const void *send, void *recv, size_t bytes,
                                void *stream, bmt_error_t *err)
{
    if (live(c, err) < 0)
        return -1;
    nccl_state_t *s = c->impl;
    if (s->check == NULL || bytes > sizeof(comm_desc_t))
        return errprintf(err,
                         "no device buffer for %zu bytes per rank (BMT_CHECK_COLLECTIVES "
                         "is read once, at bmt_init)",
                         bytes);
    size_t all_bytes = bytes * (size_t)c->size;
    char *all = s->check + sizeof(comm_desc_t), *all_host = s->check_host + sizeof(comm_desc_t);
    cudaStream_t st = stream ? (cudaStream_t)stream : s->stream;
    memcpy(s->check_host, send, bytes);
    cudaError_t e = cudaMemcpyAsync(s->check, s->check_host, bytes, cudaMemcpyHostToDevice, st);
    if (e != cudaSuccess)
        return errprintf(err, "cudaMemcpyAsync to the device: %s", cudaGetErrorString(e));
    ncclResult_t r = ncclAllGather(s->check, all, bytes, ncclUint8, s->comm, st);
    if (r != ncclSuccess && r != ncclInProgress)
        return errprintf(err, "ncclAllGather: %s (%s)", ncclGetErrorString(r),
                         ncclGetLastError(s->comm));
    e = cudaMemcpyAsync(all_host, all, all_bytes, cudaMemcpyDeviceToHost, st);
    if (e != cudaSuccess)
        return errprintf(err, "cudaMemcpyAsync to the host: %s", cudaGetErrorString(e));
    if ((r == ncclInProgress &&
         wait_ready(c, s->comm, "ncclAllGather", mono_s() + c->timeout_s, err) < 0) ||
        wait_on(c, s, st, "ncclAllGather", err) < 0)
        return -1;
    memcpy(recv, all_host, all_bytes);
    return 0;
}

/* Enqueue-only variants for the engine's streams: an error here is one NCCL
 * reported at once; the rest surface in nccl_poll or the stream's deadline. */
static int enqueued(bmt_comm_t *c, ncclResult_t r, const char *call, bmt_error_t *err)
{
    nccl_state_t *s = c->impl;
    if (r != ncclSuccess && r != ncclInProgress)
        return errprintf(err, "%s: %s (%s)", call, ncclGetErrorString(r),
                         ncclGetLastError(s->comm));
    return 0;
}

static int nccl_all_gather_on(bmt_comm_t *c, const void *send, void *recv, size_t count,
                              bmt_dtype_t dtype, void *stream, bmt_error_t *err)
{
    if (live(c, err) < 0)
        return -1;
    nccl_state_t *s = c->impl;
    return enqueued(
        c, ncclAllGather(send, recv, count, nccl_type(dtype), s->comm, (cudaStream_t)stream),
        "ncclAllGather", err);
}

static int nccl_reduce_scatter_on(bmt_comm_t *c, const void *send, void *recv, size_t count,
                                  bmt_dtype_t dtype, bmt_op_t op, void *stream, bmt_error_t *err)
{
    if (live(c, err) < 0)
        return -1;
    nccl_state_t *s = c->impl;
    return enqueued(c,
                    ncclReduceScatter(send, recv, count, nccl_type(dtype), nccl_op(c, op), s->comm,
                                      (cudaStream_t)stream),
                    "ncclReduceScatter", err);
}

static int nccl_all_reduce_on(bmt_comm_t *c, const void *send, void *recv, size_t count,
                              bmt_dtype_t dtype, bmt_op_t op, void *stream, bmt_error_t *err)
{
    if (live(c, err) < 0)
        return -1;
    nccl_state_t *s = c->impl;
    return enqueued(c,
                    ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(c, op), s->comm,
                                  (cudaStream_t)stream),
                    "ncclAllReduce", err);
}

static int nccl_poll(bmt_comm_t *c, bmt_error_t *err)
{
    if (live(c, err) < 0)
        return -1;
    nccl_state_t *s = c->impl;
    ncclResult_t st = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(s->comm, &st);
    if (r != ncclSuccess)
        return errprintf(err, "ncclCommGetAsyncError: %s", ncclGetErrorString(r));
    if (st != ncclSuccess && st != ncclInProgress)
        return errprintf(err, "%s (%s)", ncclGetErrorString(st), ncclGetLastError(s->comm));
    return 0;
}

static void nccl_abort(bmt_comm_t *c) { state_abort(c->impl); }

/* Finalize (flush) then destroy; bounded like everything else, abort on timeout. */
static void close_comm(bmt_comm_t *c, ncclComm_t *comm)
{
    if (*comm == NULL)
        return;
    bmt_error_t ignored;
    ncclResult_t r = ncclCommFinalize(*comm);
    if ((r == ncclSuccess || r == ncclInProgress) &&
        wait_ready(c, *comm, "ncclCommFinalize", mono_s() + c->timeout_s, &ignored) == 0)
        ncclCommDestroy(*comm);
    else
        ncclCommAbort(*comm);
    *comm = NULL;
}

static void nccl_destroy(bmt_comm_t *c)
{
    nccl_state_t *s = c->impl;
    if (s == NULL)
        return;
    close_comm(c, &s->comm);
    close_comm(c, &s->boot);
    state_free(s);
    c->impl = NULL;
}

const struct comm_backend comm_backend_nccl = {
    .name = "nccl",
    .create_world = nccl_create_world,
    .create_split = nccl_create_split,
    .all_gather = nccl_all_gather,
    .reduce_scatter = nccl_reduce_scatter,
    .all_reduce = nccl_all_reduce,
    .broadcast = nccl_broadcast,
    .barrier = nccl_barrier,
    .all_gather_host = nccl_all_gather_host,
    .all_gather_on = nccl_all_gather_on,
    .reduce_scatter_on = nccl_reduce_scatter_on,
    .all_reduce_on = nccl_all_reduce_on,
    .poll = nccl_poll,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
};
