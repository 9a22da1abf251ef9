/* runtime/comm_shm.c — the "shm" backend: collectives among the ranks of one node
 * through one POSIX shared-memory segment per communicator (CPU buffers).
 *
 * Segment, named /bmt-<job hash>-<comm id> (both 16 hex digits):
 *
 *   0        struct shm_hdr          line 0: geometry, ready word (the creator's
 *                                    nonce), attach word, abort word;
 *                                    line 1: the arrival count (the futex word)
 *   128      struct shm_line[size]   one 64-byte line per rank: syncs entered, attached,
 *                                    what the rank's collectives are (two posts)
 *   data_off slots   (2, size, slot) bytes: two sets of one staging slot per rank
 *            results (2, slot)       bytes: all_reduce's reduced chunk, two sets
 *
 * data_off is page-aligned and slot (BMT_SHM_CHUNK rounded down to 64, at least
 * 64 * size) a multiple of 64, so every slot starts on its own cache line.
 *
 * Synchronization. A collective is a sequence of syncs (barriers). Every rank counts
 * its syncs in s->seq; all members make the same syncs in the same order, so sync t
 * is complete when the shared arrival count reaches t * size (mod 2^32). Data staged
 * for sync t goes into set t % 2; it is read after sync t and before the reader
 * enters sync t + 1. So a rank that has passed sync t knows every rank has finished
 * reading set (t - 1) % 2 = (t + 1) % 2, and may fill it for sync t + 1: one sync per
 * chunk, no separate "slot free" handshake. Because t counts across operations,
 * consecutive collectives of any kind chain the same way. all_reduce's results
 * follow the same rule (written after sync t into result set t % 2, read after
 * sync t + 1), which lets it pipeline: one sync per chunk plus one at the end.
 *
 * Agreement, always on. Before the first sync of every collective a rank posts
 * what it is (kind, count, dtype, op, root) in its own line, in post t % 2 for
 * sync t, and after that sync it compares every rank's post with rank 0's. The
 * posts follow the staging rule, so the one read after sync t cannot change
 * before sync t + 2. The number of syncs of a collective is a function of its
 * (kind, count, dtype) and the communicator's geometry, so ranks that agreed so
 * far start their next collectives on the same sync and compare them there: an
 * all_reduce paired with an all_gather, or counts, dtypes, ops or roots that
 * differ, fail on every rank instead of mixing data. A post whose sync is not t
 * (its rank is inside a longer collective) differs from any collective's. The
 * cost is a 24-byte store into a line the rank writes anyway and one read of
 * each rank's line per collective, not per chunk.
 *
 * Collectives (per step of at most one slot per rank):
 *   all_gather      stage own part; sync; copy every slot out.
 *   reduce_scatter  stage (size, n): n elements for each destination; sync; rank r
 *                   reduces column r of every slot into its recv.
 *   all_reduce      small (size x bytes <= 32 KiB): stage all; sync; every rank
 *                   reduces all.
 *                   large: reduce-scatter of the chunk into a result set, and the
 *                   all-gather of the previous chunk's result, in one sync.
 *   broadcast       root fills a whole set (size slots); sync; the others copy.
 *
 * Waiting: poll the count briefly when every rank has a CPU (spinning while
 * oversubscribed would steal the CPU of the rank we wait for), then sleep on the
 * count with FUTEX_WAIT (shared futex: the processes map the page at different
 * addresses). Only the last arriver wakes sleepers, and only when some exist
 * (Dekker handshake through the seq_cst `sleepers` counter). Sleeps last at most
 * SHM_SLICE_S so that an abort by another rank, which changes no count, is seen
 * soon. One shared count (rather than waiting on each rank's own counter) means one
 * wake per sync instead of up to size per waiter, which is what keeps 8 ranks on 2
 * cores moving. Each rank also records its syncs in its own line, so that a
 * deadline error names the ranks that did not arrive. abort() publishes the
 * aborting rank in the header: the others' waits fail within SHM_SLICE_S and
 * their next sync fails at once.
 *
 * Determinism: every reduced element is combined in rank order 0..size-1 by one
 * rank (bf16 in f32, rounded once; AVG divides the final sum), and every rank copies
 * that one result, so all ranks get the same bits. The small all_reduce path lets
 * every rank reduce everything itself: the same code in the same order on the same
 * node gives the same bits.
 *
 * Rendezvous needs no PMIx: the name is derived from the job hash and the comm id.
 * Comm rank 0 creates the segment (O_EXCL; a leftover of a crashed run with the same
 * name is marked dead, so peers that mapped it reopen, and replaced), sizes it with
 * posix_fallocate (a full /dev/shm is an error now, not a SIGBUS later), fills the
 * header and publishes the ready word. Peers poll shm_open, check the header (one
 * that does not match is waited out as a leftover if its creator is gone, and
 * rejected at once, failing everyone, if its creator is alive: BMT_SHM_CHUNK or the
 * size differ), claim their line and bump the attach count; the rank that
 * completes it unlinks the name, so nothing stays in /dev/shm whatever happens
 * later. Everyone waits until all have attached: a rank that never comes is named
 * at creation time. A communicator of one rank has no segment at all.
 */
#include "comm.h"
#include "hash.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ctx.h"
#include "env.h"
#include "error.h"

#define SHM_MAGIC 0x314d48535f544d42ULL /* "BMT_SHM1" in memory order */
#define SHM_VERSION 2u
#define SHM_ATTACH_DEAD 0x80000000u /* attach word: a newer creator retired this segment */
#define SHM_LINE_ATTACHED 1u
#define SHM_LINE_REJECTED 2u /* this rank refused the header: fail everyone now */
#define SHM_SMALL_BYTES                                                                            \
    32768                       /* all_reduce with bytes * size up to this: one sync, every        \
                                 * rank reduces all (cost grows with size^2) */
#define SHM_TILE 512            /* elements per pass over the ranks (stack accumulator) */
#define SHM_SPIN_POLLS 4000     /* polls before sleeping, when not oversubscribed */
#define SHM_SLICE_S 0.1         /* longest futex sleep of a sync: abort latency */
#define SHM_ATTACH_SLICE_S 0.01 /* longest futex sleep of the rendezvous */
#define SHM_POLL_NS 1000000L    /* rendezvous: wait between shm_open tries (1 ms) */
#define SHM_DATA_ALIGN 4096

_Static_assert(ATOMIC_INT_LOCK_FREE == 2 && ATOMIC_LLONG_LOCK_FREE == 2,
               "atomics shared between processes must be lock-free");

struct shm_hdr {
    /* line 0: written by the creator before `ready`; then only attach and aborted change */
    uint64_t magic;
    uint64_t id;    /* communicator id */
    uint64_t slot;  /* bytes per rank slot, multiple of 64 */
    uint64_t total; /* bytes of the whole segment */
    uint32_t version;
    int32_t size;             /* ranks of the communicator */
    _Atomic uint64_t ready;   /* 0 until the header is valid, then the creator's nonce */
    _Atomic uint32_t attach;  /* ranks that mapped it (creator included) | SHM_ATTACH_DEAD */
    _Atomic uint32_t aborted; /* 0, or 1 + comm rank of the first rank that aborted */
    int32_t creator_pid;      /* tells a live creator from a crashed run's leftover */
    uint32_t pad0;
    /* line 1: the futex word every sync waits on */
    _Atomic uint32_t count;    /* syncs entered, summed over ranks (mod 2^32) */
    _Atomic uint32_t sleepers; /* ranks in (or about to enter) FUTEX_WAIT on count */
    char pad1[56];
};
_Static_assert(sizeof(struct shm_hdr) == 128, "shm header is two cache lines");
_Static_assert(offsetof(struct shm_hdr, ready) == 40, "shm header layout");
_Static_assert(offsetof(struct shm_hdr, count) == 64, "arrival count on its own line");

/* What a rank's collective starting at sync `sync` is (comm.h's comm_desc_t,
 * packed): written by its rank before that sync, read by all after it. */
struct shm_post {
    uint32_t sync;
    int8_t kind;  /* comm_kind_t */
    int8_t dtype; /* -1: unused */
    int8_t op;    /* -1: unused */
    int8_t pad0;
    int32_t root; /* -1: unused */
    uint32_t pad1;
    uint64_t count;
};
_Static_assert(sizeof(struct shm_post) == 24, "shm post layout");

struct shm_line {
    _Atomic uint32_t arrive;   /* syncs this rank entered */
    _Atomic uint32_t attached; /* 0, SHM_LINE_ATTACHED or SHM_LINE_REJECTED */
    struct shm_post post[2];   /* by the parity of the sync that starts a collective */
    char pad[8];
};
_Static_assert(sizeof(struct shm_line) == 64, "one cache line per rank");
_Static_assert(offsetof(struct shm_line, post) == 8, "shm line layout");

/* Process-local state of one communicator. */
struct shm {
    struct shm_hdr *hdr; /* the mapping; NULL for a communicator of one rank */
    size_t map_bytes;
    struct shm_line *lines; /* (size) */
    char *slots;            /* (2, size, slot) bytes */
    char *results;          /* (2, slot) bytes */
    size_t slot;            /* bytes per rank slot */
    uint32_t seq;           /* syncs this rank completed; the next one is seq + 1 */
    int spin;               /* polls of the count before sleeping */
    double timeout_s;
    bool aborted;
};

/* Geometry every member computes alike and the creator writes into the header. */
struct shm_geom {
    char name[48]; /* "/bmt-<job hash>-<comm id>" */
    size_t slot;
    size_t data_off;
    size_t total;
};

/* ------------------------------------------------------------ small helpers */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ns(long ns)
{
    struct timespec ts = { 0, ns };
    nanosleep(&ts, NULL);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Sleep while *word == val, at most secs; returns early on a wake, a signal or a
 * change of *word. Shared futex: keyed by the page, not by this address space. */
static void futex_wait(_Atomic uint32_t *word, uint32_t val, double secs)
{
    if (secs <= 0)
        return;
    struct timespec ts;
    ts.tv_sec = (time_t)secs;
    ts.tv_nsec = (long)((secs - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec > 999999999L)
        ts.tv_nsec = 999999999L;
    syscall(SYS_futex, (void *)word, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (void *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static uint64_t make_nonce(uint64_t id)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = mix64(id ^ mix64(((uint64_t)ts.tv_sec << 30) ^ (uint64_t)ts.tv_nsec ^
                                  ((uint64_t)getpid() << 40)));
    return x ? x : 1;
}

/* Spinning pays only when every rank has a CPU of its own. */
static int spin_polls(int size)
{
    cpu_set_t set;
    int cpus = 0;
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        cpus = CPU_COUNT(&set);
    if (cpus <= 0)
        cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
    return cpus >= size ? SHM_SPIN_POLLS : 0;
}

static inline bool reached(uint32_t v, uint32_t target) { return (int32_t)(v - target) >= 0; }

static inline size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

/* The set that sync seq + 1 publishes (fill before it) and the one sync seq
 * published (read after it). */
static inline char *next_set(const struct shm *s, int size)
{
    return s->slots + (size_t)((s->seq + 1) & 1) * (size_t)size * s->slot;
}

static inline char *cur_set(const struct shm *s, int size)
{
    return s->slots + (size_t)(s->seq & 1) * (size_t)size * s->slot;
}

/* ------------------------------------------------------------ syncs */

static int aborted_error(bmt_comm_t *c, uint32_t who, int waiting_for, bmt_error_t *err)
{
    int r = (int)who - 1;
    if (waiting_for < 0)
        return errprintf(err,
                         "rank %d (world rank %d) aborted the communicator after an error "
                         "of its own (see its message)",
                         r, bmt_comm_member(c, r));
    return errprintf(err,
                     "rank %d (world rank %d) aborted the communicator; this rank was "
                     "waiting for rank %d (world rank %d)",
                     r, bmt_comm_member(c, r), waiting_for, bmt_comm_member(c, waiting_for));
}

/* The first rank (and how many) that has not entered sync s->seq. */
static int missing_ranks(const bmt_comm_t *c, const struct shm *s, int *n_missing)
{
    int first = -1;
    *n_missing = 0;
    for (int j = 0; j < c->size; j++) {
        uint32_t a = atomic_load_explicit(&s->lines[j].arrive, memory_order_relaxed);
        if (!reached(a, s->seq)) {
            if (first < 0)
                first = j;
            (*n_missing)++;
        }
    }
    return first;
}

static int timeout_error(bmt_comm_t *c, const struct shm *s, bmt_error_t *err)
{
    int n = 0;
    int j = missing_ranks(c, s, &n);
    if (j < 0)
        return errprintf(err,
                         "timed out after %.1f s although every rank arrived "
                         "(did the ranks call different collectives?) (BMT_TIMEOUT)",
                         s->timeout_s);
    char more[32] = "";
    if (n > 1)
        snprintf(more, sizeof(more), " and %d more", n - 1);
    return errprintf(err,
                     "timed out after %.1f s waiting for rank %d (world rank %d)%s "
                     "(BMT_TIMEOUT)",
                     s->timeout_s, j, bmt_comm_member(c, j), more);
}

static int wait_count(bmt_comm_t *c, struct shm *s, uint32_t target, bmt_error_t *err)
{
    struct shm_hdr *h = s->hdr;
    for (int i = 0; i < s->spin; i++) {
        if (reached(atomic_load_explicit(&h->count, memory_order_acquire), target))
            return 0;
        cpu_relax();
    }
    double deadline = now_s() + s->timeout_s;
    for (;;) {
        atomic_fetch_add(&h->sleepers, 1);
        uint32_t v = atomic_load(&h->count);
        if (!reached(v, target) && atomic_load(&h->aborted) == 0) {
            double left = deadline - now_s();
            futex_wait(&h->count, v, left < SHM_SLICE_S ? left : SHM_SLICE_S);
        }
        atomic_fetch_sub(&h->sleepers, 1);
        if (reached(atomic_load_explicit(&h->count, memory_order_acquire), target))
            return 0;
        uint32_t who = atomic_load(&h->aborted);
        if (who != 0) {
            int n;
            return aborted_error(c, who, missing_ranks(c, s, &n), err);
        }
        if (now_s() >= deadline)
            return timeout_error(c, s, err);
    }
}

/* A barrier that also publishes everything this rank wrote into the segment
 * before it and makes visible everything the others wrote before theirs. */
static int shm_sync(bmt_comm_t *c, struct shm *s, bmt_error_t *err)
{
    struct shm_hdr *h = s->hdr;
    uint32_t who = atomic_load_explicit(&h->aborted, memory_order_relaxed);
    if (who != 0)
        return aborted_error(c, who, -1, err);
    uint32_t seq = ++s->seq;
    uint32_t target = seq * (uint32_t)c->size;
    atomic_store_explicit(&s->lines[c->rank].arrive, seq, memory_order_relaxed);
    /* seq_cst: releases our staged data, and orders the count before the read of
     * sleepers (the waiters do the mirror image). */
    uint32_t v = atomic_fetch_add(&h->count, 1) + 1;
    if (reached(v, target)) {
        if (atomic_load(&h->sleepers) != 0)
            futex_wake_all(&h->count);
        return 0;
    }
    return wait_count(c, s, target, err);
}

/* The post of a collective; fields its kind does not use are -1 or 0, as in
 * comm_desc_make. */
static struct shm_post post_make(comm_kind_t kind, size_t count, bmt_dtype_t dtype, int op,
                                 int root)
{
    comm_desc_t d = comm_desc_make(kind, count, (int)dtype, op, root, 0, 0);
    struct shm_post p;
    memset(&p, 0, sizeof(p));
    p.kind = (int8_t)d.kind;
    p.dtype = (int8_t)d.dtype;
    p.op = (int8_t)d.op;
    p.root = d.root;
    p.count = d.count;
    return p;
}

/* The descriptor a post read after sync t stands for. */
static comm_desc_t post_desc(const bmt_comm_t *c, const struct shm_post *p, uint32_t t)
{
    if (p->sync != t)
        return comm_desc_make(COMM_KIND_NONE, 0, -1, -1, -1, c->id, 0);
    return comm_desc_make((comm_kind_t)p->kind, p->count, p->dtype, p->op, p->root, c->id, 0);
}

static inline bool post_same(const struct shm_post *a, const struct shm_post *b, uint32_t t)
{
    return a->sync == t && b->sync == t && a->kind == b->kind && a->dtype == b->dtype &&
           a->op == b->op && a->root == b->root && a->count == b->count;
}

/* The first sync of a collective: post what it is (p), sync, and check that every
 * rank posted the same for this sync (see "Agreement" above). */
static int shm_sync_first(bmt_comm_t *c, struct shm *s, const struct shm_post *p, bmt_error_t *err)
{
    uint32_t t = s->seq + 1;
    struct shm_post *mine = &s->lines[c->rank].post[t & 1];
    *mine = *p;
    mine->sync = t;
    if (shm_sync(c, s, err) < 0)
        return -1;
    const struct shm_post *p0 = &s->lines[0].post[t & 1];
    for (int j = 1; j < c->size; j++) {
        const struct shm_post *pj = &s->lines[j].post[t & 1];
        if (post_same(pj, p0, t))
            continue;
        comm_desc_t dj = post_desc(c, pj, t), d0 = post_desc(c, p0, t);
        if (comm_desc_equal(&dj, &d0)) /* both inside longer collectives; this rank is not */
            continue;
        return comm_desc_mismatch(err, "the ranks called different collectives: ", &dj, j,
                                  bmt_comm_member(c, j), &d0, bmt_comm_member(c, 0));
    }
    return 0;
}

/* The sync of step `first` of a collective: the first one posts and checks. */
static inline int shm_step(bmt_comm_t *c, struct shm *s, bool first, const struct shm_post *p,
                           bmt_error_t *err)
{
    return first ? shm_sync_first(c, s, p, err) : shm_sync(c, s, err);
}

/* ------------------------------------------------------------ reductions */

/* Identical to bmt_bf16_to_f32; inlined because it runs once per element and rank. */
static inline float bf16_widen(uint16_t x)
{
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* max that propagates NaN from either side, so a NaN is never hidden. */
static inline float max_f32(float a, float x) { return x > a || isnan(x) ? x : a; }

static inline double max_f64(double a, double x) { return x > a || isnan(x) ? x : a; }

/* dst[0, n) = op over ranks j = 0..size-1, in that order, of elements [off, off + n)
 * of slot j of set (slots stride bytes apart), for f32 or (bf16 true) bf16:
 * accumulated in f32, AVG divides the final sum, bf16 rounds once at the end.
 * dst may be unaligned. */
static void reduce_f32(char *dst, const char *set, size_t stride, size_t off, size_t n, int size,
                       bmt_op_t op, bool bf16)
{
    float acc[SHM_TILE];  /* (m) running result of one tile */
    float wide[SHM_TILE]; /* (m) one rank's bf16 tile widened to f32 */
    uint16_t out[SHM_TILE];
    size_t es = bf16 ? 2 : 4;
    for (size_t t = 0; t < n; t += SHM_TILE) {
        size_t m = min_sz(SHM_TILE, n - t);
        for (int j = 0; j < size; j++) {
            const char *src = set + (size_t)j * stride + (off + t) * es;
            const float *x = (const float *)(const void *)src;
            if (bf16) {
                const uint16_t *hx = (const uint16_t *)(const void *)src;
                for (size_t i = 0; i < m; i++)
                    wide[i] = bf16_widen(hx[i]);
                x = wide;
            }
            if (j == 0)
                memcpy(acc, x, m * sizeof(float));
            else if (op == BMT_MAX)
                for (size_t i = 0; i < m; i++)
                    acc[i] = max_f32(acc[i], x[i]);
            else
                for (size_t i = 0; i < m; i++)
                    acc[i] += x[i];
        }
        if (op == BMT_AVG)
            for (size_t i = 0; i < m; i++)
                acc[i] /= (float)size;
        if (bf16) {
            for (size_t i = 0; i < m; i++)
                out[i] = bmt_f32_to_bf16(acc[i]);
            memcpy(dst + t * 2, out, m * 2);
        } else {
            memcpy(dst + t * 4, acc, m * 4);
        }
    }
}

static void reduce_f64(char *dst, const char *set, size_t stride, size_t off, size_t n, int size,
                       bmt_op_t op)
{
    double acc[SHM_TILE]; /* (m) running result of one tile */
    for (size_t t = 0; t < n; t += SHM_TILE) {
        size_t m = min_sz(SHM_TILE, n - t);
        for (int j = 0; j < size; j++) {
            const double *x = (const double *)(const void *)(set + (size_t)j * stride) + off + t;
            if (j == 0)
                memcpy(acc, x, m * sizeof(double));
            else if (op == BMT_MAX)
                for (size_t i = 0; i < m; i++)
                    acc[i] = max_f64(acc[i], x[i]);
            else
                for (size_t i = 0; i < m; i++)
                    acc[i] += x[i];
        }
        if (op == BMT_AVG)
            for (size_t i = 0; i < m; i++)
                acc[i] /= (double)size;
        memcpy(dst + t * 8, acc, m * 8);
    }
}

static void reduce(char *dst, const char *set, size_t stride, size_t off, size_t n, int size,
                   bmt_dtype_t dtype, bmt_op_t op)
{
    if (dtype == BMT_F64)
        reduce_f64(dst, set, stride, off, n, size, op);
    else
        reduce_f32(dst, set, stride, off, n, size, op, dtype == BMT_BF16);
}

/* ------------------------------------------------------------ rendezvous */

/* Mark a leftover segment dead (peers that mapped it reopen the name) and unlink it. */
static void retire_stale(const char *name)
{
    int fd = shm_open(name, O_RDWR, 0);
    if (fd >= 0) {
        struct stat st;
        if (fstat(fd, &st) == 0 && st.st_size >= (off_t)sizeof(struct shm_hdr)) {
            struct shm_hdr *h = mmap(NULL, sizeof(*h), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (h != MAP_FAILED) {
                atomic_fetch_or(&h->attach, SHM_ATTACH_DEAD);
                futex_wake_all(&h->attach);
                munmap(h, sizeof(*h));
            }
        }
        close(fd);
    }
    shm_unlink(name);
}

/* Wait until all members attached. 0: done; 1: the segment was retired (reopen);
 * -1: a member rejected it, or the deadline passed. */
static int wait_attached(bmt_comm_t *c, struct shm *s, double deadline, bmt_error_t *err)
{
    struct shm_hdr *h = s->hdr;
    for (;;) {
        uint32_t v = atomic_load_explicit(&h->attach, memory_order_acquire);
        if (v & SHM_ATTACH_DEAD)
            return 1;
        if ((int64_t)v >= c->size)
            return 0;
        int missing = -1;
        for (int j = 0; j < c->size; j++) {
            uint32_t a = atomic_load_explicit(&s->lines[j].attached, memory_order_relaxed);
            if (a == SHM_LINE_REJECTED)
                return errprintf(err,
                                 "rank %d (world rank %d) rejected the shm segment "
                                 "(see its error)",
                                 j, bmt_comm_member(c, j));
            if (a == 0 && missing < 0)
                missing = j;
        }
        double left = deadline - now_s();
        if (left <= 0) {
            if (missing < 0)
                missing = 0;
            return errprintf(err,
                             "timed out after %.1f s waiting for rank %d (world rank %d) "
                             "to attach to the shm segment (BMT_TIMEOUT)",
                             s->timeout_s, missing, bmt_comm_member(c, missing));
        }
        futex_wait(&h->attach, v, left < SHM_ATTACH_SLICE_S ? left : SHM_ATTACH_SLICE_S);
    }
}

static void seg_map(struct shm *s, void *p, size_t bytes, const struct shm_geom *g)
{
    s->hdr = p;
    s->map_bytes = bytes;
    s->lines = (struct shm_line *)(void *)((char *)p + sizeof(struct shm_hdr));
    s->slots = (char *)p + g->data_off;
}

static void seg_unmap(struct shm *s)
{
    if (s->hdr != NULL)
        munmap(s->hdr, s->map_bytes);
    s->hdr = NULL;
    s->lines = NULL;
    s->slots = NULL;
}

static int seg_create(bmt_comm_t *c, struct shm *s, const struct shm_geom *g, double deadline,
                      bmt_error_t *err)
{
    int fd = shm_open(g->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno == EEXIST) {
        /* Same job hash and comm id: a leftover of a crashed run of this job. */
        retire_stale(g->name);
        fd = shm_open(g->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    }
    if (fd < 0)
        return errprintf(err, "shm_open(%s): %s", g->name, strerror(errno));
    int e = ftruncate(fd, (off_t)g->total) < 0 ? errno : posix_fallocate(fd, 0, (off_t)g->total);
    if (e != 0) {
        close(fd);
        shm_unlink(g->name);
        return errprintf(err,
                         "cannot reserve %.1f MiB in /dev/shm: %s (lower BMT_SHM_CHUNK "
                         "or enlarge /dev/shm)",
                         (double)g->total / 1048576.0, strerror(e));
    }
    void *p = mmap(NULL, g->total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    e = errno;
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(g->name);
        return errprintf(err, "mmap(%s, %zu bytes): %s", g->name, g->total, strerror(e));
    }
    seg_map(s, p, g->total, g);
    struct shm_hdr *h = s->hdr;
    h->magic = SHM_MAGIC;
    h->id = c->id;
    h->slot = g->slot;
    h->total = g->total;
    h->version = SHM_VERSION;
    h->size = c->size;
    h->creator_pid = (int32_t)getpid();
    atomic_store_explicit(&s->lines[0].attached, SHM_LINE_ATTACHED, memory_order_relaxed);
    atomic_store_explicit(&h->attach, 1, memory_order_relaxed);
    atomic_store_explicit(&h->ready, make_nonce(c->id), memory_order_release);
    int w = wait_attached(c, s, deadline, err);
    if (w != 0) {
        if (w > 0) /* (wait_attached says nothing when the segment is dead) */
            errprintf(err,
                      "the shm segment %s was retired while rank 0 waited for the others to "
                      "attach: another process created the same communicator's segment (two "
                      "runs of one job, or a restarted rank 0 of this one)",
                      g->name);
        else /* nobody else will unlink a segment that never filled up */
            shm_unlink(g->name);
        seg_unmap(s);
        return -1;
    }
    return 0;
}

/* The header the creator wrote must describe the segment this rank expects. */
static int check_header(const bmt_comm_t *c, const struct shm_hdr *h, size_t bytes,
                        const struct shm_geom *g, bmt_error_t *err)
{
    if (h->magic != SHM_MAGIC || h->version != SHM_VERSION)
        return errprintf(err, "%s is not a bmt shm segment of version %u", g->name, SHM_VERSION);
    if (h->id != c->id)
        return errprintf(err, "%s belongs to another communicator", g->name);
    if (h->size != c->size)
        return errprintf(err, "%s was created for %d ranks, this communicator has %d", g->name,
                         (int)h->size, c->size);
    if (h->slot != g->slot)
        return errprintf(err,
                         "rank 0 stages %llu-byte chunks, this rank %zu: set BMT_SHM_CHUNK "
                         "alike on every rank",
                         (unsigned long long)h->slot, g->slot);
    if (h->total != g->total || bytes != g->total)
        return errprintf(err, "%s has %zu bytes, expected %zu", g->name, bytes, g->total);
    return 0;
}

/* A header that fails check_header is a leftover of a crashed run (rank 0 will
 * replace it: wait) unless a live bmt creator wrote it (a real mismatch: fail now). */
static bool header_is_stale(const struct shm_hdr *h)
{
    if (h->magic != SHM_MAGIC || h->version != SHM_VERSION || h->creator_pid <= 0)
        return true;
    return kill((pid_t)h->creator_pid, 0) < 0 && errno == ESRCH;
}

static int seg_join(bmt_comm_t *c, struct shm *s, const struct shm_geom *g, double deadline,
                    bmt_error_t *err)
{
    bmt_error_t why; /* what we are waiting for, for the deadline's message */
    snprintf(why.text, sizeof(why.text),
             " waiting for rank 0 (world rank %d) to create the shm "
             "segment",
             bmt_comm_member(c, 0));
    for (;; sleep_ns(SHM_POLL_NS)) {
        if (now_s() >= deadline)
            return errprintf(err, "timed out after %.1f s%s (BMT_TIMEOUT)", s->timeout_s, why.text);
        int fd = shm_open(g->name, O_RDWR, 0);
        if (fd < 0) {
            if (errno == ENOENT)
                continue;
            return errprintf(err, "shm_open(%s): %s", g->name, strerror(errno));
        }
        struct stat st;
        if (fstat(fd, &st) < 0) {
            int e = errno;
            close(fd);
            return errprintf(err, "fstat(%s): %s", g->name, strerror(e));
        }
        size_t bytes = (size_t)st.st_size;
        if (st.st_size < (off_t)g->data_off) { /* not sized yet */
            close(fd);
            continue;
        }
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        int e = errno;
        close(fd);
        if (p == MAP_FAILED)
            return errprintf(err, "mmap(%s, %zu bytes): %s", g->name, bytes, strerror(e));
        seg_map(s, p, bytes, g);
        struct shm_hdr *h = s->hdr;
        while (atomic_load_explicit(&h->ready, memory_order_acquire) == 0 &&
               !(atomic_load(&h->attach) & SHM_ATTACH_DEAD) && now_s() < deadline)
            sleep_ns(SHM_POLL_NS);
        if (atomic_load_explicit(&h->ready, memory_order_acquire) == 0 ||
            (atomic_load(&h->attach) & SHM_ATTACH_DEAD)) {
            seg_unmap(s);
            continue; /* retired, or the deadline: the loop head says which */
        }
        bmt_error_t bad;
        if (check_header(c, h, bytes, g, &bad) < 0) {
            if (header_is_stale(h)) {
                snprintf(why.text, sizeof(why.text), ": %.200s", bad.text);
                seg_unmap(s);
                continue;
            }
            if (h->size == c->size) { /* our line exists: fail the others now */
                atomic_store(&s->lines[c->rank].attached, SHM_LINE_REJECTED);
                futex_wake_all(&h->attach);
            }
            seg_unmap(s);
            return errprintf(err, "%s", bad.text);
        }
        if (atomic_exchange(&s->lines[c->rank].attached, SHM_LINE_ATTACHED) != 0) {
            /* Our line is taken: a leftover that rank 0 is about to retire. */
            seg_unmap(s);
            continue;
        }
        uint32_t v = atomic_load(&h->attach);
        while (!(v & SHM_ATTACH_DEAD) && !atomic_compare_exchange_weak(&h->attach, &v, v + 1))
            ;
        if (v & SHM_ATTACH_DEAD) {
            seg_unmap(s);
            continue;
        }
        if ((int64_t)v + 1 == c->size) {
            shm_unlink(g->name); /* everyone has it mapped: leave nothing in /dev/shm */
            futex_wake_all(&h->attach);
        }
        int rc = wait_attached(c, s, deadline, err);
        if (rc == 0)
            return 0;
        seg_unmap(s);
        if (rc < 0)
            return -1;
    }
}

/* Build c->impl: a segment shared by c's members (none for a single rank). */
static int shm_open_comm(bmt_comm_t *c, bmt_error_t *err)
{
    struct shm *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return errprintf(err, "out of memory");
    s->timeout_s = c->timeout_s > 0 ? c->timeout_s : 300.0;
    s->spin = spin_polls(c->size);
    if (c->size == 1) {
        c->impl = s;
        return 0;
    }
    size_t chunk;
    if (env_get_bytes("BMT_SHM_CHUNK", &chunk, err) < 0) {
        free(s);
        return -1;
    }
    struct shm_geom g;
    /* At least 64 bytes per rank, so reduce_scatter stages >= 8 elements per block. */
    g.slot = chunk / 64 * 64;
    if (g.slot < 64 * (size_t)c->size)
        g.slot = 64 * (size_t)c->size;
    g.data_off = sizeof(struct shm_hdr) + sizeof(struct shm_line) * (size_t)c->size;
    g.data_off = (g.data_off + SHM_DATA_ALIGN - 1) / SHM_DATA_ALIGN * SHM_DATA_ALIGN;
    size_t nslots = 2 * (size_t)c->size + 2;
    if (g.slot > ((size_t)INT64_MAX - g.data_off) / nslots) {
        free(s);
        return errprintf(err, "BMT_SHM_CHUNK=%zu is too large for %d ranks", chunk, c->size);
    }
    g.total = g.data_off + nslots * g.slot;
    snprintf(g.name, sizeof(g.name), "/bmt-%016llx-%016llx", (unsigned long long)c->ctx->job_hash,
             (unsigned long long)c->id);
    double deadline = now_s() + s->timeout_s;
    int rc = c->rank == 0 ? seg_create(c, s, &g, deadline, err) : seg_join(c, s, &g, deadline, err);
    if (rc < 0) {
        free(s);
        return -1;
    }
    s->slot = g.slot;
    s->results = s->slots + 2 * (size_t)c->size * g.slot;
    c->impl = s;
    return 0;
}

/* ------------------------------------------------------------ the backend */

static struct shm *usable(bmt_comm_t *c, bmt_error_t *err)
{
    struct shm *s = c->impl;
    if (s == NULL)
        errprintf(err, "the communicator has no shm state");
    else if (s->aborted)
        errprintf(err, "the communicator was aborted by an earlier error");
    else
        return s;
    return NULL;
}

static int shm_create_world(bmt_comm_t *world, bmt_error_t *err)
{
    return shm_open_comm(world, err);
}

static int barrier_of(bmt_comm_t *c, comm_kind_t kind, bmt_error_t *err);
static void shm_abort(bmt_comm_t *c);

static int shm_create_split(bmt_comm_t *parent, int color, int key, bmt_comm_t *child,
                            bmt_error_t *err)
{
    int rc = child ? shm_open_comm(child, err) : 0;
    /* One parent barrier after the children's rendezvous: the split is collective over
     * the parent, and non-members are not left running ahead of a failed member. */
    bmt_error_t berr;
    if (barrier_of(parent, COMM_SPLIT, &berr) < 0) {
        shm_abort(parent);
        if (rc == 0)
            errprintf(err, "barrier of %s: %s", parent->name, berr.text);
        return -1;
    }
    return rc;
}

/* all_gather: send (count) elements, recv (size, count) elements. Per step every
 * rank stages up to one slot of its part, syncs, and copies every slot out.
 * p: what the first sync posts. */
static int gather(bmt_comm_t *c, const void *send, void *recv, size_t count, bmt_dtype_t dtype,
                  const struct shm_post *p, bmt_error_t *err)
{
    struct shm *s = usable(c, err);
    if (s == NULL)
        return -1;
    size_t bytes = count * bmt_dtype_size(dtype); /* one rank's part */
    if (c->size == 1) {
        if (bytes && recv != send)
            memmove(recv, send, bytes);
        return 0;
    }
    size_t off = 0;
    do {
        size_t n = min_sz(s->slot, bytes - off);
        if (n)
            memcpy(next_set(s, c->size) + (size_t)c->rank * s->slot, (const char *)send + off, n);
        if (shm_step(c, s, off == 0, p, err) < 0)
            return -1;
        const char *set = cur_set(s, c->size);
        for (int j = 0; j < c->size && n; j++)
            memcpy((char *)recv + (size_t)j * bytes + off, set + (size_t)j * s->slot, n);
        off += n;
    } while (off < bytes);
    return 0;
}

static int shm_all_gather(bmt_comm_t *c, const void *send, void *recv, size_t count,
                          bmt_dtype_t dtype, bmt_error_t *err)
{
    struct shm_post p = post_make(COMM_ALL_GATHER, count, dtype, -1, -1);
    return gather(c, send, recv, count, dtype, &p, err);
}

/* The descriptor exchange of BMT_CHECK_COLLECTIVES: host buffers are what shm
 * moves anyway; posted as a check, so a rank without the knob is told apart. */
static int shm_all_gather_host(bmt_comm_t *c, const void *send, void *recv, size_t bytes,
                               void *stream, bmt_error_t *err)
{
    struct shm_post p = post_make(COMM_CHECK, bytes, BMT_F64, -1, -1);
    return gather(c, send, recv, bytes / 8, BMT_F64, &p, err);
}

/* reduce_scatter: send (size, count) elements, recv (count). Per step every rank
 * stages (size, n) elements in its slot, n of each destination block; after the
 * sync rank r reduces column r of every slot into its recv. */
static int shm_reduce_scatter(bmt_comm_t *c, const void *send, void *recv, size_t count,
                              bmt_dtype_t dtype, bmt_op_t op, bmt_error_t *err)
{
    struct shm *s = usable(c, err);
    if (s == NULL)
        return -1;
    size_t es = bmt_dtype_size(dtype);
    if (c->size == 1) {
        if (count && recv != send)
            memmove(recv, send, count * es);
        return 0;
    }
    size_t per = s->slot / es / (size_t)c->size; /* elements of each block per step, >= 8 */
    size_t done = 0;
    struct shm_post p = post_make(COMM_REDUCE_SCATTER, count, dtype, (int)op, -1);
    do {
        size_t n = min_sz(per, count - done);
        char *mine = next_set(s, c->size) + (size_t)c->rank * s->slot; /* (size, n) */
        for (int b = 0; b < c->size && n; b++)
            memcpy(mine + (size_t)b * n * es, (const char *)send + ((size_t)b * count + done) * es,
                   n * es);
        if (shm_step(c, s, done == 0, &p, err) < 0)
            return -1;
        reduce((char *)recv + done * es, cur_set(s, c->size), s->slot, (size_t)c->rank * n, n,
               c->size, dtype, op);
        done += n;
    } while (done < count);
    return 0;
}

/* all_reduce: send and recv (count) elements, may be the same buffer.
 * Small (what every rank reads, size x bytes, is at most SHM_SMALL_BYTES): stage
 * everything, sync, every rank reduces all of it (one sync).
 * Large, pipelined over chunks of one slot: step k stages chunk k, syncs, reduces
 * its sub-range of chunk k into result set seq % 2, and copies chunk k - 1's whole
 * result (written by every rank before this sync) out of the other result set. */
static int shm_all_reduce(bmt_comm_t *c, const void *send, void *recv, size_t count,
                          bmt_dtype_t dtype, bmt_op_t op, bmt_error_t *err)
{
    struct shm *s = usable(c, err);
    if (s == NULL)
        return -1;
    size_t es = bmt_dtype_size(dtype);
    size_t bytes = count * es;
    if (c->size == 1) {
        if (bytes && recv != send)
            memmove(recv, send, bytes);
        return 0;
    }
    char *mine_slot = NULL;
    struct shm_post p = post_make(COMM_ALL_REDUCE, count, dtype, (int)op, -1);
    if (bytes <= SHM_SMALL_BYTES / (size_t)c->size && bytes <= s->slot) {
        mine_slot = next_set(s, c->size) + (size_t)c->rank * s->slot;
        if (bytes)
            memcpy(mine_slot, send, bytes);
        if (shm_sync_first(c, s, &p, err) < 0)
            return -1;
        reduce(recv, cur_set(s, c->size), s->slot, 0, count, c->size, dtype, op);
        return 0;
    }
    size_t per = s->slot / es; /* elements of one chunk */
    size_t steps = (count + per - 1) / per;
    for (size_t k = 0; k <= steps; k++) {
        size_t m = k < steps ? min_sz(per, count - k * per) : 0;
        if (m) {
            mine_slot = next_set(s, c->size) + (size_t)c->rank * s->slot;
            memcpy(mine_slot, (const char *)send + k * per * es, m * es);
        }
        if (shm_step(c, s, k == 0, &p, err) < 0)
            return -1;
        if (m) {
            size_t lo = m * (size_t)c->rank / (size_t)c->size;
            size_t hi = m * ((size_t)c->rank + 1) / (size_t)c->size;
            char *result = s->results + (size_t)(s->seq & 1) * s->slot; /* (m) */
            reduce(result + lo * es, cur_set(s, c->size), s->slot, lo, hi - lo, c->size, dtype, op);
        }
        if (k > 0) {
            size_t pm = min_sz(per, count - (k - 1) * per);
            const char *prev = s->results + (size_t)((s->seq - 1) & 1) * s->slot; /* (pm) */
            memcpy((char *)recv + (k - 1) * per * es, prev, pm * es);
        }
    }
    return 0;
}

/* broadcast: buf (count) elements; per step root fills one whole set (size slots). */
static int shm_broadcast(bmt_comm_t *c, void *buf, size_t count, bmt_dtype_t dtype, int root,
                         bmt_error_t *err)
{
    struct shm *s = usable(c, err);
    if (s == NULL)
        return -1;
    if (c->size == 1)
        return 0;
    size_t bytes = count * bmt_dtype_size(dtype);
    size_t step = (size_t)c->size * s->slot;
    size_t off = 0;
    struct shm_post p = post_make(COMM_BROADCAST, count, dtype, -1, root);
    do {
        size_t n = min_sz(step, bytes - off);
        if (c->rank == root && n)
            memcpy(next_set(s, c->size), (const char *)buf + off, n);
        if (shm_step(c, s, off == 0, &p, err) < 0)
            return -1;
        if (c->rank != root && n)
            memcpy((char *)buf + off, cur_set(s, c->size), n);
        off += n;
    } while (off < bytes);
    return 0;
}

/* A barrier, posted as kind (a barrier, or the end of a split). */
static int barrier_of(bmt_comm_t *c, comm_kind_t kind, bmt_error_t *err)
{
    struct shm *s = usable(c, err);
    if (s == NULL)
        return -1;
    if (c->size == 1)
        return 0;
    struct shm_post p = post_make(kind, 0, BMT_F32, -1, -1);
    return shm_sync_first(c, s, &p, err);
}

static int shm_barrier(bmt_comm_t *c, bmt_error_t *err) { return barrier_of(c, COMM_BARRIER, err); }

/* Fail every later call here, and tell the other ranks (their waits see it within
 * SHM_SLICE_S) so the first failure stops the communicator everywhere. */
static void shm_abort(bmt_comm_t *c)
{
    struct shm *s = c->impl;
    if (s == NULL)
        return;
    s->aborted = true;
    if (s->hdr != NULL) {
        uint32_t none = 0;
        atomic_compare_exchange_strong(&s->hdr->aborted, &none, (uint32_t)c->rank + 1);
        futex_wake_all(&s->hdr->count);
    }
}

static void shm_destroy(bmt_comm_t *c)
{
    struct shm *s = c->impl;
    if (s == NULL)
        return;
    seg_unmap(s);
    free(s);
    c->impl = NULL;
}

const struct comm_backend comm_backend_shm = {
    .name = "shm",
    .create_world = shm_create_world,
    .create_split = shm_create_split,
    .all_gather = shm_all_gather,
    .reduce_scatter = shm_reduce_scatter,
    .all_reduce = shm_all_reduce,
    .broadcast = shm_broadcast,
    .barrier = shm_barrier,
    .all_gather_host = shm_all_gather_host,
    .abort = shm_abort,
    .destroy = shm_destroy,
};
