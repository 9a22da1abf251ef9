/* runtime/device.c — memory and streams of the context's device, with accounting.
 *
 * Memory: cpu uses malloc, cuda cudaMalloc. Every pointer handed out is entered
 * in an open-addressing table (pointer -> bytes, kind) so that bmt_free can
 * subtract it from the right counter without a header in front of device
 * memory; the table also catches frees of pointers that are not ours. The
 * counters keep current and peak bytes per kind: the engine's tests assert the
 * "sharded from birth" invariant from them.
 *
 * Streams (cuda): compute, comm and replica are made at bmt_init and live in the
 * context as void * (cudaStream_t) so that headers compiled without CUDA can
 * carry them. CUDA errors become messages here, where they enter our code.
 *
 * A context made by hand in a unit test (calloc, no bmt_init) works: the table
 * starts empty on first use and the streams are NULL (the legacy stream).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bmt/bmt.h"
#include "ctx.h"
#include "device.h"
#include "error.h"

#ifdef BMT_HAVE_CUDA
#include <cuda_runtime.h>

static int cuda_fail(bmt_ctx_t *ctx, bmt_error_t *err, const char *call, cudaError_t e)
{
    return errprintf(err, "rank %d: %s on cuda:%d: %s", ctx->rank, call, ctx->device_index,
                     cudaGetErrorString(e));
}
#endif

/* ------------------------------------------------------------ the table */

struct mem_entry {
    void *ptr; /* NULL: empty slot; TOMBSTONE: freed slot */
    size_t bytes;
    int kind;
    bool pooled; /* from bmt_alloc_async (cuda: the context's memory pool) */
};

struct mem_table {
    struct mem_entry *slots;
    size_t cap, used, live; /* used counts tombstones too */
    bmt_mem_stats_t stats;
    uint64_t pooled; /* bytes of stats.current_total that came from the pool */
    uint64_t step_peak[BMT_MEM_KIND_COUNT]; /* peaks since the monitor's last step */
    uint64_t step_peak_total;               /* of all kinds at once, the same */
};

static char tombstone_;
#define TOMBSTONE ((void *)&tombstone_)

static size_t slot_of(const void *p, size_t cap)
{
    uintptr_t x = (uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

static struct mem_table *table(bmt_ctx_t *ctx)
{
    if (ctx->mem == NULL)
        ctx->mem = calloc(1, sizeof(struct mem_table));
    return ctx->mem;
}

static int table_grow(struct mem_table *t)
{
    size_t cap = t->cap ? t->cap * 2 : 256;
    while (t->live * 2 >= cap)
        cap *= 2;
    struct mem_entry *s = calloc(cap, sizeof(*s));
    if (s == NULL)
        return -1;
    for (size_t i = 0; i < t->cap; i++) {
        void *p = t->slots[i].ptr;
        if (p == NULL || p == TOMBSTONE)
            continue;
        size_t j = slot_of(p, cap);
        while (s[j].ptr)
            j = (j + 1) & (cap - 1);
        s[j] = t->slots[i];
    }
    free(t->slots);
    t->slots = s;
    t->cap = cap;
    t->used = t->live;
    return 0;
}

static int table_add(struct mem_table *t, void *p, size_t bytes, int kind, bool pooled)
{
    if ((t->used + 1) * 2 > t->cap && table_grow(t) < 0)
        return -1;
    size_t j = slot_of(p, t->cap);
    while (t->slots[j].ptr && t->slots[j].ptr != TOMBSTONE)
        j = (j + 1) & (t->cap - 1);
    if (t->slots[j].ptr == NULL)
        t->used++;
    t->slots[j] = (struct mem_entry){ p, bytes, kind, pooled };
    t->live++;
    if (pooled)
        t->pooled += bytes;
    bmt_mem_stats_t *st = &t->stats;
    st->current[kind] += bytes;
    st->current_total += bytes;
    if (st->current[kind] > st->peak[kind])
        st->peak[kind] = st->current[kind];
    if (st->current[kind] > t->step_peak[kind])
        t->step_peak[kind] = st->current[kind];
    if (st->current_total > st->peak_total)
        st->peak_total = st->current_total;
    if (st->current_total > t->step_peak_total)
        t->step_peak_total = st->current_total;
    return 0;
}

/* Remove p; returns its entry's kind, or -1 if p is not in the table.
 * *pooled: whether it came from bmt_alloc_async. */
static int table_remove(struct mem_table *t, const void *p, bool *pooled)
{
    if (t == NULL || t->cap == 0)
        return -1;
    size_t j = slot_of(p, t->cap);
    for (size_t n = 0; n < t->cap && t->slots[j].ptr; n++, j = (j + 1) & (t->cap - 1)) {
        if (t->slots[j].ptr != p)
            continue;
        int kind = t->slots[j].kind;
        *pooled = t->slots[j].pooled;
        if (*pooled)
            t->pooled -= t->slots[j].bytes;
        t->stats.current[kind] -= t->slots[j].bytes;
        t->stats.current_total -= t->slots[j].bytes;
        t->slots[j].ptr = TOMBSTONE;
        t->live--;
        return kind;
    }
    return -1;
}

/* ------------------------------------------------------------ exposed communication
 *
 * comm_wait_s of a step (bmt/monitor.h) on cuda: the time the compute stream
 * sat waiting for communication. Each wait of the compute stream on a comm
 * event is bracketed by two timing events on the compute stream; the host runs
 * ahead of the GPU, so the first one completes when compute's previous work
 * ends and the second when the wait is over. The optimizer adds the tail: how
 * long the comm and replica streams ran past the end of compute. The events are
 * read after the step's synchronization and reused. On cpu the collectives run
 * on the host and comm.c adds up their time instead.
 */
#define WAIT_EVENTS_MAX 12288

struct wait_mark {
    int a, b, c; /* event indices; c < 0: a wait (b - a), else a tail (max(b, c) - a) */
};

struct wait_clock {
    void **ev; /* cudaEvent_t pool, created on demand, timing enabled */
    int nev, used;
    struct wait_mark *marks;
    int nmarks;
    bool partial; /* the pool ran out this step: some waits went untimed */
};

static void wait_clock_free(bmt_ctx_t *ctx)
{
    struct wait_clock *w = ctx->waits;
    if (w == NULL)
        return;
#ifdef BMT_HAVE_CUDA
    for (int i = 0; i < w->nev; i++)
        cudaEventDestroy((cudaEvent_t)w->ev[i]);
#endif
    free(w->ev);
    free(w->marks);
    free(w);
    ctx->waits = NULL;
}

#ifdef BMT_HAVE_CUDA
/* Index of a free timing event, or -1 (pool full or out of memory: untimed). */
static int clock_event(bmt_ctx_t *ctx)
{
    struct wait_clock *w = ctx->waits;
    if (w == NULL) {
        w = ctx->waits = calloc(1, sizeof(*w));
        if (w) {
            w->ev = calloc(WAIT_EVENTS_MAX, sizeof(void *));
            w->marks = calloc(WAIT_EVENTS_MAX / 2, sizeof(struct wait_mark));
        }
        if (w == NULL || w->ev == NULL || w->marks == NULL) {
            wait_clock_free(ctx);
            return -1;
        }
    }
    if (w->used == w->nev) {
        cudaEvent_t e;
        if (w->nev == WAIT_EVENTS_MAX || cudaEventCreate(&e) != cudaSuccess) {
            w->partial = true;
            return -1;
        }
        w->ev[w->nev++] = e;
    }
    return w->used++;
}

static int clock_record(bmt_ctx_t *ctx, int i, void *stream, bmt_error_t *err)
{
    struct wait_clock *w = ctx->waits;
    cudaError_t r = cudaEventRecord((cudaEvent_t)w->ev[i], (cudaStream_t)stream);
    return r == cudaSuccess ? 0 : cuda_fail(ctx, err, "cudaEventRecord", r);
}
#endif

int device_wait_timed(bmt_ctx_t *ctx, void *ev, bmt_error_t *err)
{
    void *compute = ctx->streams[DEVICE_COMPUTE];
#ifdef BMT_HAVE_CUDA
    if (ev != NULL && ctx->device == BMT_DEVICE_CUDA) {
        int used = ctx->waits ? ((struct wait_clock *)ctx->waits)->used : 0;
        int a = clock_event(ctx), b = a < 0 ? -1 : clock_event(ctx);
        if (b >= 0) {
            struct wait_clock *w = ctx->waits;
            if (clock_record(ctx, a, compute, err) < 0 ||
                device_stream_wait(ctx, compute, ev, err) < 0 ||
                clock_record(ctx, b, compute, err) < 0)
                return -1;
            w->marks[w->nmarks++] = (struct wait_mark){ a, b, -1 };
            return 0;
        }
        if (ctx->waits) /* give back a lone event */
            ((struct wait_clock *)ctx->waits)->used = used;
    }
#endif
    return device_stream_wait(ctx, compute, ev, err);
}

int device_wait_tail(bmt_ctx_t *ctx, bmt_error_t *err)
{
#ifdef BMT_HAVE_CUDA
    if (ctx->device != BMT_DEVICE_CUDA || ctx->streams[DEVICE_COMPUTE] == NULL)
        return 0;
    int used = ctx->waits ? ((struct wait_clock *)ctx->waits)->used : 0;
    int a = clock_event(ctx), b = a < 0 ? -1 : clock_event(ctx), c = b < 0 ? -1 : clock_event(ctx);
    if (c < 0) {
        if (ctx->waits)
            ((struct wait_clock *)ctx->waits)->used = used;
        return 0;
    }
    struct wait_clock *w = ctx->waits;
    if (clock_record(ctx, a, ctx->streams[DEVICE_COMPUTE], err) < 0 ||
        clock_record(ctx, b, ctx->streams[DEVICE_COMM], err) < 0 ||
        clock_record(ctx, c, ctx->streams[DEVICE_REPLICA], err) < 0)
        return -1;
    w->marks[w->nmarks++] = (struct wait_mark){ a, b, c };
#endif
    return 0;
}

double device_wait_collect(bmt_ctx_t *ctx, bool *partial)
{
    struct wait_clock *w = ctx->waits;
    double total = 0;
    *partial = false;
    if (w == NULL)
        return 0;
#ifdef BMT_HAVE_CUDA
    for (int i = 0; i < w->nmarks; i++) {
        struct wait_mark *m = &w->marks[i];
        float ab = 0, ac = 0;
        if (cudaEventElapsedTime(&ab, (cudaEvent_t)w->ev[m->a], (cudaEvent_t)w->ev[m->b]) !=
            cudaSuccess) {
            w->partial = true; /* not complete: the caller did not synchronize */
            continue;
        }
        if (m->c >= 0 && cudaEventElapsedTime(&ac, (cudaEvent_t)w->ev[m->a],
                                              (cudaEvent_t)w->ev[m->c]) != cudaSuccess)
            ac = 0;
        double ms = ab > ac ? ab : ac;
        if (ms > 0)
            total += ms * 1e-3;
    }
    (void)cudaGetLastError(); /* a not-ready query leaves no sticky error; clear it anyway */
#endif
    *partial = w->partial;
    w->used = 0;
    w->nmarks = 0;
    w->partial = false;
    return total;
}

void device_release(bmt_ctx_t *ctx)
{
    struct mem_table *t = ctx->mem;
    if (t) {
        free(t->slots);
        free(t);
        ctx->mem = NULL;
    }
    wait_clock_free(ctx);
#ifdef BMT_HAVE_CUDA
    for (int i = 0; i < DEVICE_STREAMS; i++)
        if (ctx->pools[i]) { /* what is still allocated from it goes back when it is freed */
            cudaMemPoolDestroy((cudaMemPool_t)ctx->pools[i]);
            ctx->pools[i] = NULL;
        }
    for (int i = 0; i < DEVICE_STREAMS; i++)
        if (ctx->streams[i]) {
            cudaStreamDestroy((cudaStream_t)ctx->streams[i]);
            ctx->streams[i] = NULL;
        }
#endif
}

int device_setup_streams(bmt_ctx_t *ctx, bmt_error_t *err)
{
    if (ctx->device != BMT_DEVICE_CUDA)
        return 0;
#ifdef BMT_HAVE_CUDA
    for (int i = 0; i < DEVICE_STREAMS; i++) {
        cudaStream_t s;
        /* Non-blocking: the three streams order among themselves through events
         * only, never through the legacy stream. */
        cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        if (e != cudaSuccess)
            return cuda_fail(ctx, err, "cudaStreamCreate", e);
        ctx->streams[i] = s;
    }
    return 0;
#else
    return errprintf(err, "rank %d: this libbmt was built without CUDA", ctx->rank);
#endif
}

/* ------------------------------------------------------------ allocation */

const char *bmt_mem_kind_name(bmt_mem_kind_t kind)
{
    static const char *names[] = { "param", "gathered",   "grad_full", "grad",
                                   "optim", "activation", "workspace" };
    return (unsigned)kind < BMT_MEM_KIND_COUNT ? names[kind] : "invalid";
}

#ifdef BMT_HAVE_CUDA
/* The context's pools for bmt_alloc_async, one per context stream (another
 * stream takes the compute stream's), made at first use. A pool reuses what a
 * stream freed for that stream's allocations at once; one pool shared by the
 * compute and comm streams kept memory for each (the pool cannot reuse across
 * streams without ordering them), so each stream has its own. Each keeps what
 * it has reserved (release threshold: everything), as PyTorch's caching
 * allocator does: without that a pool gives its memory back to the driver at
 * every synchronization and the next step pays for mapping it again. */
static cudaMemPool_t pool_of(bmt_ctx_t *ctx, void *stream, bmt_error_t *err)
{
    int i = 0;
    while (i < DEVICE_STREAMS && ctx->streams[i] != stream)
        i++;
    i = i < DEVICE_STREAMS ? i : DEVICE_COMPUTE;
    if (ctx->pools[i])
        return (cudaMemPool_t)ctx->pools[i];
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof(props));
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = ctx->device_index;
    cudaMemPool_t pool;
    cudaError_t e = cudaMemPoolCreate(&pool, &props);
    if (e != cudaSuccess) {
        cuda_fail(ctx, err, "cudaMemPoolCreate", e);
        return NULL;
    }
    uint64_t keep = UINT64_MAX;
    e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    if (e != cudaSuccess) {
        cudaMemPoolDestroy(pool);
        cuda_fail(ctx, err, "cudaMemPoolSetAttribute", e);
        return NULL;
    }
    ctx->pools[i] = pool;
    return pool;
}
#endif

/* Memory for bytes (at least 1) from the host, cudaMalloc, or (stream not
 * NULL) the context's pool in stream order; NULL and err on failure. */
static void *device_alloc(bmt_ctx_t *ctx, bmt_mem_kind_t kind, size_t real, void *stream,
                          bmt_error_t *err)
{
    void *p = NULL;
    if (ctx->device == BMT_DEVICE_CPU) {
        /* 64-byte alignment, like cudaMalloc's 256: vector loads, no false sharing. */
        if (real > SIZE_MAX - 63 || posix_memalign(&p, 64, (real + 63) & ~(size_t)63) != 0)
            p = NULL; /* (rounding up SIZE_MAX would wrap to a tiny block) */
        if (p == NULL)
            errprintf(err, "rank %d: out of host memory allocating %zu bytes (%s)", ctx->rank, real,
                      bmt_mem_kind_name(kind));
        return p;
    }
#ifdef BMT_HAVE_CUDA
    cudaError_t e;
    if (stream == NULL) {
        e = cudaMalloc(&p, real);
    } else {
        cudaMemPool_t pool = pool_of(ctx, stream, err);
        if (pool == NULL)
            return NULL;
        e = cudaMallocFromPoolAsync(&p, real, pool, (cudaStream_t)stream);
    }
    if (e != cudaSuccess) {
        const struct mem_table *t = ctx->mem;
        errprintf(err, "rank %d: %s of %zu bytes (%s) on cuda:%d: %s; %.2f GiB in use", ctx->rank,
                  stream ? "cudaMallocFromPoolAsync" : "cudaMalloc", real, bmt_mem_kind_name(kind),
                  ctx->device_index, cudaGetErrorString(e),
                  t ? (double)t->stats.current_total / (1 << 30) : 0.0);
        cudaGetLastError(); /* an allocation failure is not sticky: clear it */
        return NULL;
    }
    return p;
#else
    (void)stream;
    errprintf(err, "rank %d: this libbmt was built without CUDA", ctx->rank);
    return NULL;
#endif
}

static void device_free(bmt_ctx_t *ctx, void *p, bool pooled, void *stream)
{
    if (ctx->device == BMT_DEVICE_CPU) {
        free(p);
        return;
    }
#ifdef BMT_HAVE_CUDA
    if (pooled)
        cudaFreeAsync(p, (cudaStream_t)(stream ? stream : ctx->streams[DEVICE_COMPUTE]));
    else
        cudaFree(p);
#else
    (void)pooled, (void)stream;
#endif
}

/* bmt_alloc (stream NULL) and bmt_alloc_async on cuda (stream: a cudaStream_t). */
static void *alloc_counted(bmt_ctx_t *ctx, bmt_mem_kind_t kind, size_t bytes, void *stream,
                           bmt_error_t *err)
{
    if ((unsigned)kind >= BMT_MEM_KIND_COUNT) {
        errprintf(err, "rank %d: bmt_alloc: invalid memory kind %d", ctx->rank, (int)kind);
        return NULL;
    }
    struct mem_table *t = table(ctx);
    if (t == NULL) {
        errprintf(err, "rank %d: out of host memory", ctx->rank);
        return NULL;
    }
    const bool pooled = stream != NULL; /* bmt_alloc_async passes none on cpu */
    void *p = device_alloc(ctx, kind, bytes ? bytes : 1, stream, err);
    if (p == NULL)
        return NULL;
    if (table_add(t, p, bytes, kind, pooled) < 0) {
        device_free(ctx, p, pooled, stream);
        errprintf(err, "rank %d: out of host memory for the allocation table", ctx->rank);
        return NULL;
    }
    return p;
}

void *bmt_alloc(bmt_ctx_t *ctx, bmt_mem_kind_t kind, size_t bytes, bmt_error_t *err)
{
    return alloc_counted(ctx, kind, bytes, NULL, err);
}

void *bmt_alloc_async(bmt_ctx_t *ctx, bmt_mem_kind_t kind, size_t bytes, void *stream,
                      bmt_error_t *err)
{
    if (ctx->device == BMT_DEVICE_CPU)
        return alloc_counted(ctx, kind, bytes, NULL, err);
    return alloc_counted(ctx, kind, bytes, stream ? stream : ctx->streams[DEVICE_COMPUTE], err);
}

void bmt_free_async(bmt_ctx_t *ctx, void *ptr, void *stream)
{
    if (ptr == NULL)
        return;
    /* Not ours (or freed already): leave it alone rather than corrupt the heap. */
    bool pooled;
    if (table_remove(ctx->mem, ptr, &pooled) < 0)
        return;
    device_free(ctx, ptr, pooled, stream);
}

void bmt_free(bmt_ctx_t *ctx, void *ptr) { bmt_free_async(ctx, ptr, NULL); }

void bmt_mem_pool_stats(const bmt_ctx_t *ctx, uint64_t *in_use, uint64_t *now, uint64_t *high)
{
    const struct mem_table *t = ctx->mem;
    uint64_t cur = 0, hi = 0;
#ifdef BMT_HAVE_CUDA
    for (int i = 0; i < DEVICE_STREAMS; i++) { /* the highs add up: at most, not at once */
        uint64_t c = 0, h = 0;
        if (ctx->pools[i] &&
            cudaMemPoolGetAttribute((cudaMemPool_t)ctx->pools[i], cudaMemPoolAttrReservedMemCurrent,
                                    &c) == cudaSuccess &&
            cudaMemPoolGetAttribute((cudaMemPool_t)ctx->pools[i], cudaMemPoolAttrReservedMemHigh,
                                    &h) == cudaSuccess)
            cur += c, hi += h;
    }
#else
    (void)ctx;
#endif
    if (in_use)
        *in_use = t ? t->pooled : 0;
    if (now)
        *now = cur;
    if (high)
        *high = hi;
}

void *bmt_mem_alloc(bmt_ctx_t *ctx, size_t bytes, bmt_error_t *err)
{
    return bmt_alloc(ctx, BMT_MEM_WORKSPACE, bytes, err);
}

void bmt_mem_free(bmt_ctx_t *ctx, void *ptr) { bmt_free(ctx, ptr); }

void bmt_mem_get_stats(const bmt_ctx_t *ctx, bmt_mem_stats_t *out)
{
    const struct mem_table *t = ctx->mem;
    if (t)
        *out = t->stats;
    else
        memset(out, 0, sizeof(*out));
}

void bmt_mem_reset_peaks(bmt_ctx_t *ctx)
{
    struct mem_table *t = table(ctx);
    if (t == NULL)
        return;
    memcpy(t->stats.peak, t->stats.current, sizeof(t->stats.peak));
    t->stats.peak_total = t->stats.current_total;
    memcpy(t->step_peak, t->stats.current, sizeof(t->step_peak));
    t->step_peak_total = t->stats.current_total;
}

void device_mem_step_peaks(bmt_ctx_t *ctx, uint64_t *current, uint64_t *peak, uint64_t *peak_all)
{
    struct mem_table *t = table(ctx);
    for (int k = 0; k < BMT_MEM_KIND_COUNT; k++) {
        current[k] = t ? t->stats.current[k] : 0;
        peak[k] = t ? t->step_peak[k] : 0;
        if (t)
            t->step_peak[k] = t->stats.current[k];
    }
    *peak_all = t ? t->step_peak_total : 0;
    if (t)
        t->step_peak_total = t->stats.current_total;
}

/* ------------------------------------------------------------ copies */

static int copy(bmt_ctx_t *ctx, void *dst, const void *src, size_t bytes, int to_device,
                bmt_error_t *err)
{
    if (bytes == 0)
        return 0;
    if (ctx == NULL || dst == NULL || src == NULL)
        return errprintf(err, "%s: a NULL %s", to_device ? "bmt_mem_upload" : "bmt_mem_download",
                         ctx == NULL   ? "context"
                         : dst == NULL ? "destination"
                                       : "source");
    if (ctx->device == BMT_DEVICE_CPU) {
        memmove(dst, src, bytes);
        return 0;
    }
#ifdef BMT_HAVE_CUDA
    /* cudaMemcpy from pageable host memory may return before the DMA into the
     * device has landed; a stream that does not wait for the legacy stream (such
     * as NCCL's) could then read half-copied data. Wait for it: these copies
     * promise completion. Work queued on the context's streams is waited for
     * first, so a download sees what the engine computed. */
    if (bmt_device_synchronize(ctx, err) < 0) /* bounded, watching the communicators */
        return -1;
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

/* ------------------------------------------------------------ streams and events */

void *bmt_compute_stream(bmt_ctx_t *ctx) { return ctx->streams[DEVICE_COMPUTE]; }

void *device_stream(bmt_ctx_t *ctx, int which) { return ctx->streams[which]; }

int device_sync_legacy(bmt_ctx_t *ctx, bmt_error_t *err)
{
    if (ctx->device != BMT_DEVICE_CUDA)
        return 0;
#ifdef BMT_HAVE_CUDA
    cudaError_t e = cudaStreamSynchronize(0);
    if (e != cudaSuccess)
        return cuda_fail(ctx, err, "cudaStreamSynchronize", e);
#endif
    return 0;
}

int device_event_create(bmt_ctx_t *ctx, void **ev, bmt_error_t *err)
{
    *ev = NULL;
    if (ctx->device != BMT_DEVICE_CUDA)
        return 0;
#ifdef BMT_HAVE_CUDA
    cudaEvent_t e;
    cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (r != cudaSuccess)
        return cuda_fail(ctx, err, "cudaEventCreate", r);
    *ev = e;
    return 0;
#else
    return errprintf(err, "rank %d: this libbmt was built without CUDA", ctx->rank);
#endif
}

void device_event_destroy(bmt_ctx_t *ctx, void *ev)
{
#ifdef BMT_HAVE_CUDA
    if (ev)
        cudaEventDestroy((cudaEvent_t)ev);
#endif
}

int device_event_record(bmt_ctx_t *ctx, void *ev, void *stream, bmt_error_t *err)
{
    if (ev == NULL)
        return 0;
#ifdef BMT_HAVE_CUDA
    cudaError_t r = cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream);
    if (r != cudaSuccess)
        return cuda_fail(ctx, err, "cudaEventRecord", r);
#endif
    return 0;
}

int device_stream_wait(bmt_ctx_t *ctx, void *stream, void *ev, bmt_error_t *err)
{
    if (ev == NULL)
        return 0;
#ifdef BMT_HAVE_CUDA
    cudaError_t r = cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)ev, 0);
    if (r != cudaSuccess)
        return cuda_fail(ctx, err, "cudaStreamWaitEvent", r);
#endif
    return 0;
}

#ifdef BMT_HAVE_CUDA
static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
#endif

#ifdef BMT_HAVE_CUDA
/* Wait for stream i of ctx until `deadline`, watching the communicators. */
static int wait_stream_until(bmt_ctx_t *ctx, int i, double deadline, bmt_error_t *err)
{
    static const char *names[DEVICE_STREAMS] = { "compute", "comm", "replica" };
    struct timespec nap = { 0, 20000 };
    if (ctx->streams[i] == NULL)
        return 0;
    for (unsigned it = 0;; it++) {
        cudaError_t e = cudaStreamQuery((cudaStream_t)ctx->streams[i]);
        if (e == cudaSuccess)
            return 0;
        if (e != cudaErrorNotReady)
            return cuda_fail(ctx, err, "cudaStreamQuery", e);
        /* A collective that can never finish shows up as an NCCL error, or
         * not at all: check the communicators, then the deadline. */
        bmt_comm_t *comms[3] = { ctx->world_comm, ctx->group_comm, ctx->replica_comm };
        for (int c = 0; c < 3; c++)
            if (comms[c] && comm_poll(comms[c], err) < 0) {
                /* Kernels of the other communicators may wait for this one's
                 * peers forever: abort them all, so nothing hangs later. */
                for (int k = 0; k < 3; k++)
                    comm_abort(comms[k]);
                return -1;
            }
        if (mono_s() > deadline) {
            ctx->comm_failed = true;
            for (int c = 0; c < 3; c++)
                comm_abort(comms[c]);
            return errprintf(err,
                             "rank %d: the %s stream did not finish within %.1f s: a peer "
                             "is missing or stuck (BMT_TIMEOUT)",
                             ctx->rank, names[i], ctx->timeout_s);
        }
        if (it > 2000)
            nanosleep(&nap, NULL);
    }
}
#endif

int bmt_device_synchronize(bmt_ctx_t *ctx, bmt_error_t *err)
{
    if (ctx->device != BMT_DEVICE_CUDA)
        return 0;
#ifdef BMT_HAVE_CUDA
    const double deadline = mono_s() + ctx->timeout_s;
    for (int i = 0; i < DEVICE_STREAMS; i++)
        if (wait_stream_until(ctx, i, deadline, err) < 0)
            return -1;
    return 0;
#else
    return errprintf(err, "rank %d: this libbmt was built without CUDA", ctx->rank);
#endif
}

int device_stream_synchronize(bmt_ctx_t *ctx, int which, bmt_error_t *err)
{
    if (ctx->device != BMT_DEVICE_CUDA)
        return 0;
#ifdef BMT_HAVE_CUDA
    return wait_stream_until(ctx, which, mono_s() + ctx->timeout_s, err);
#else
    return errprintf(err, "rank %d: this libbmt was built without CUDA", ctx->rank);
#endif
}

/* ------------------------------------------------------------ identity */

void device_name(bmt_ctx_t *ctx, char *out, size_t len)
{
    snprintf(out, len, "cpu");
#ifdef BMT_HAVE_CUDA
    struct cudaDeviceProp p;
    if (ctx->device == BMT_DEVICE_CUDA) {
        if (cudaGetDeviceProperties(&p, ctx->device_index) == cudaSuccess)
            snprintf(out, len, "%s", p.name);
        else
            snprintf(out, len, "cuda:%d", ctx->device_index);
        return;
    }
#endif
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f == NULL)
        return;
    char line[256];
    while (fgets(line, sizeof(line), f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) != 0 || colon == NULL)
            continue;
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        v[strcspn(v, "\n")] = '\0';
        if (*v)
            snprintf(out, len, "%s", v);
        break;
    }
    fclose(f);
}
