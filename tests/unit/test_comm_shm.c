/* tests/unit/test_comm_shm.c — the shm communicator backend (runtime/comm_shm.c).
 *
 * Runs without PMIx or bmlaunch. For each run the parent forks N children; each
 * builds its own context and world communicator by hand (what init.c does) and
 * drives the public collectives (bmt_all_gather ... bmt_barrier, comm.c's
 * wrappers) and splits (comm_split_known). Children check every result against
 * values they compute on their own: the exact reduction the spec prescribes (rank
 * order; f32 accumulation for bf16, rounded once; AVG divides the final sum), bit
 * for bit, and an f64 reference within a relative bound. They send one record per
 * check through a pipe; the parent prints one TAP point per (run, check), and
 * checks that every child exited 0 and that /dev/shm holds nothing of the run.
 *
 * Runs: 1, 2 (default 1M chunk, big counts, a bandwidth figure), 3, 4 and 8 ranks
 * (4K chunk: big ops are chunked hundreds of times; 4 and 8 also split 2 x N/2),
 * a deadline case, a BMT_SHM_CHUNK mismatch, a stale leftover segment, and ranks
 * that call different collectives (kind, count, dtype, op, root), caught by the
 * backend's own check and, separately, by BMT_CHECK_COLLECTIVES (comm.c).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bmt/bmt.h"
#include "comm.h"
#include "ctx.h"
#include "hash.h"
#include "tap.h"

#define MAX_RANKS 8
#define MIXED_OPS 60

enum scenario {
    SC_SUITE,
    SC_TIMEOUT,
    SC_MISMATCH,
    SC_STALE,
    SC_RETIRED,     /* two creators of one segment: the first's is retired under it */
    SC_DIFFER,      /* different collectives, the shm backend's always-on check */
    SC_DIFFER_CHECK /* the same under BMT_CHECK_COLLECTIVES=1 */
};

struct run {
    const char *label;
    int n;
    const char *chunk; /* BMT_SHM_CHUNK; NULL: the default (1M) */
    enum scenario sc;
    double timeout_s;
    size_t big;  /* a count that crosses many chunks */
    bool splits; /* also split 2 x n/2 into group and replica comms */
    bool bench;  /* print a bandwidth figure */
    bool check;  /* BMT_CHECK_COLLECTIVES=1 */
};

static const struct run runs[] = {
    { "1 rank", 1, NULL, SC_SUITE, 20, 600001, false, false, false },
    { "2 ranks, 1M chunk", 2, NULL, SC_SUITE, 20, 600001, false, true, false },
    { "3 ranks, 4K chunk", 3, "4K", SC_SUITE, 20, 10007, false, false, false },
    { "4 ranks, 4K chunk", 4, "4K", SC_SUITE, 20, 10007, true, false, false },
    { "8 ranks, 4K chunk", 8, "4K", SC_SUITE, 20, 10007, true, false, false },
    { "4 ranks, 1 s deadline", 4, "4K", SC_TIMEOUT, 1, 0, false, false, false },
    { "2 ranks, chunk mismatch", 2, NULL, SC_MISMATCH, 5, 0, false, false, false },
    { "3 ranks, stale leftover", 3, "4K", SC_STALE, 20, 0, false, false, false },
    { "two rank 0s of one 2-rank communicator", 2, "4K", SC_RETIRED, 2, 0, false, false, false },
    { "3 ranks, different collectives", 3, "4K", SC_DIFFER, 10, 0, false, false, false },
    { "3 ranks, different collectives, BMT_CHECK_COLLECTIVES=1", 3, "4K", SC_DIFFER_CHECK, 10, 0,
      false, false, true },
    { "4 ranks, 4K chunk, BMT_CHECK_COLLECTIVES=1", 4, "4K", SC_SUITE, 20, 2049, true, false,
      true },
};

/* ------------------------------------------------------------ child -> parent records */

enum rec_kind {
    REC_CHECK,
    REC_SAME,
    REC_DIAG
};

struct rec {
    int kind;
    int rank;
    int pass;
    int expect;    /* ranks that must report this check (0: any) */
    uint64_t hash; /* REC_SAME: must be equal on every reporting rank */
    char name[96];
    char detail[144];
};
_Static_assert(sizeof(struct rec) <= 512, "a record is written atomically into the pipe");

static struct {
    int fd;
    int rank;
    int n;
    uint64_t job;
} me;

static void send_rec(int kind, const char *name, int pass, int expect, uint64_t hash,
                     const char *detail)
{
    struct rec r;
    memset(&r, 0, sizeof(r));
    r.kind = kind;
    r.rank = me.rank;
    r.pass = pass;
    r.expect = expect;
    r.hash = hash;
    snprintf(r.name, sizeof(r.name), "%s", name);
    snprintf(r.detail, sizeof(r.detail), "%s", detail ? detail : "");
    if (write(me.fd, &r, sizeof(r)) != (ssize_t)sizeof(r))
        _exit(3);
}

/* One check: passes until the first failure, whose story it keeps. */
struct chk {
    int pass;
    char detail[144];
};
#define CHK_INIT                                                                                   \
    {                                                                                              \
        1, ""                                                                                      \
    }

static void chk_fail(struct chk *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void chk_fail(struct chk *k, const char *fmt, ...)
{
    if (!k->pass)
        return;
    k->pass = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->detail, sizeof(k->detail), fmt, ap);
    va_end(ap);
}

static void chk_report(const struct chk *k, int expect, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void chk_report(const struct chk *k, int expect, const char *fmt, ...)
{
    char name[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    send_rec(REC_CHECK, name, k->pass, expect, 0, k->detail);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s)
{
    struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static void *xalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (p == NULL)
        _exit(4);
    return p;
}

/* ------------------------------------------------------------ data and references */

static uint64_t splitmix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static const bmt_dtype_t dtypes[] = { BMT_F32, BMT_BF16, BMT_F64 };
static const bmt_op_t ops[] = { BMT_SUM, BMT_AVG, BMT_MAX };

/* INT: small integers, every sum exact even in bf16. RAND: uniform in [-1, 1). */
enum data_kind {
    DATA_INT,
    DATA_RAND
};

static double in_dtype(bmt_dtype_t t, double x)
{
    switch (t) {
    case BMT_F32: return (float)x;
    case BMT_BF16: return bmt_bf16_to_f32(bmt_f32_to_bf16((float)x));
    default: return x;
    }
}

/* Element idx of the buffer that comm rank r contributes (exact in dtype t). */
static double value(bmt_dtype_t t, int kind, uint64_t seed, int r, size_t idx)
{
    if (kind == DATA_INT)
        return (double)(int)(((size_t)r * 5 + idx * 3 + seed % 7) % 13) - 6.0;
    uint64_t h = splitmix(seed ^ ((uint64_t)r << 48) ^ idx);
    return in_dtype(t, (double)(h >> 11) * 0x1p-53 * 2.0 - 1.0);
}

static void put(bmt_dtype_t t, void *buf, size_t i, double v)
{
    char *p = buf;
    if (t == BMT_F32) {
        float f = (float)v;
        memcpy(p + i * 4, &f, 4);
    } else if (t == BMT_BF16) {
        uint16_t h = bmt_f32_to_bf16((float)v);
        memcpy(p + i * 2, &h, 2);
    } else {
        memcpy(p + i * 8, &v, 8);
    }
}

static double get(bmt_dtype_t t, const void *buf, size_t i)
{
    const char *p = buf;
    if (t == BMT_F32) {
        float f;
        memcpy(&f, p + i * 4, 4);
        return f;
    }
    if (t == BMT_BF16) {
        uint16_t h;
        memcpy(&h, p + i * 2, 2);
        return bmt_bf16_to_f32(h);
    }
    double d;
    memcpy(&d, p + i * 8, 8);
    return d;
}

static bool same_bits(bmt_dtype_t t, const void *buf, size_t i, double want)
{
    unsigned char w[8];
    put(t, w, 0, want);
    size_t es = bmt_dtype_size(t);
    return memcmp((const char *)buf + i * es, w, es) == 0;
}

static void fill(bmt_dtype_t t, void *buf, size_t n, int kind, uint64_t seed, int r, size_t base)
{
    for (size_t i = 0; i < n; i++)
        put(t, buf, i, value(t, kind, seed, r, base + i));
}

/* The reduction over ranks 0..n-1 of element idx, computed as the spec says
 * (spec: bit-exact) and in f64 with an error bound (f64, tol). */
struct ref {
    double spec;
    double f64;
    double tol;
};

static struct ref ref_reduce(bmt_dtype_t t, bmt_op_t op, int kind, uint64_t seed, int n, size_t idx)
{
    struct ref r;
    double x0 = value(t, kind, seed, 0, idx);
    double acc64 = x0, sum = x0, sumabs = fabs(x0), max = x0;
    float acc32 = (float)x0;
    for (int j = 1; j < n; j++) {
        double x = value(t, kind, seed, j, idx);
        sum += x;
        sumabs += fabs(x);
        max = x > max ? x : max;
        if (op == BMT_MAX) {
            acc64 = x > acc64 ? x : acc64;
            acc32 = (float)x > acc32 ? (float)x : acc32;
        } else {
            acc64 += x;
            acc32 += (float)x;
        }
    }
    if (op == BMT_AVG) {
        acc64 /= (double)n;
        acc32 /= (float)n;
    }
    if (t == BMT_F64)
        r.spec = acc64;
    else if (t == BMT_F32)
        r.spec = acc32;
    else
        r.spec = bmt_bf16_to_f32(bmt_f32_to_bf16(acc32));
    double eps = t == BMT_F64 ? 0x1p-53 : 0x1p-24; /* accumulation */
    double out = t == BMT_BF16 ? 0x1p-8 : eps;     /* final rounding */
    r.f64 = op == BMT_MAX ? max : op == BMT_AVG ? sum / n : sum;
    double acc_err = eps * n * sumabs / (op == BMT_AVG ? n : 1);
    r.tol = op == BMT_MAX ? 0 : 2 * (acc_err + out * fabs(r.f64));
    return r;
}

static void check_reduced(struct chk *k, bmt_dtype_t t, bmt_op_t op, int kind, uint64_t seed, int n,
                          const void *buf, size_t i, size_t idx, size_t count)
{
    struct ref r = ref_reduce(t, op, kind, seed, n, idx);
    double got = get(t, buf, i);
    if (!same_bits(t, buf, i, r.spec))
        chk_fail(k, "count %zu, element %zu (%s data): got %.9g, want %.9g", count, i,
                 kind == DATA_INT ? "int" : "random", got, r.spec);
    else if (fabs(got - r.f64) > r.tol)
        chk_fail(k, "count %zu, element %zu: %.9g is off the f64 reference %.9g by > %.3g", count,
                 i, got, r.f64, r.tol);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

/* ------------------------------------------------------------ one collective, checked */

static void one_all_gather(bmt_comm_t *c, bmt_dtype_t t, int kind, uint64_t seed, size_t count,
                           struct chk *k)
{
    int n = bmt_comm_size(c), r = bmt_comm_rank(c);
    size_t es = bmt_dtype_size(t);
    char *send = xalloc(count * es), *recv = xalloc(count * (size_t)n * es);
    fill(t, send, count, kind, seed, r, 0);
    memset(recv, 0xff, count * (size_t)n * es);
    bmt_error_t err;
    if (bmt_all_gather(c, send, recv, count, t, &err) < 0)
        chk_fail(k, "count %zu: %s", count, err.text);
    for (int j = 0; j < n && k->pass; j++)
        for (size_t i = 0; i < count && k->pass; i++)
            if (!same_bits(t, recv, (size_t)j * count + i, value(t, kind, seed, j, i)))
                chk_fail(k, "count %zu: element %zu of rank %d's part differs", count, i, j);
    free(send);
    free(recv);
}

static void one_reduce_scatter(bmt_comm_t *c, bmt_dtype_t t, bmt_op_t op, int kind, uint64_t seed,
                               size_t count, struct chk *k)
{
    int n = bmt_comm_size(c), r = bmt_comm_rank(c);
    size_t es = bmt_dtype_size(t);
    char *send = xalloc(count * (size_t)n * es), *recv = xalloc(count * es);
    fill(t, send, count * (size_t)n, kind, seed, r, 0);
    memset(recv, 0xff, count * es);
    bmt_error_t err;
    if (bmt_reduce_scatter(c, send, recv, count, t, op, &err) < 0)
        chk_fail(k, "count %zu: %s", count, err.text);
    for (size_t i = 0; i < count && k->pass; i++)
        check_reduced(k, t, op, kind, seed, n, recv, i, (size_t)r * count + i, count);
    free(send);
    free(recv);
}

/* Out of place, then in place; folds the result bits into *hash. */
static void one_all_reduce(bmt_comm_t *c, bmt_dtype_t t, bmt_op_t op, int kind, uint64_t seed,
                           size_t count, struct chk *k, uint64_t *hash)
{
    int n = bmt_comm_size(c), r = bmt_comm_rank(c);
    size_t es = bmt_dtype_size(t);
    char *send = xalloc(count * es), *recv = xalloc(count * es);
    bmt_error_t err;
    for (int inplace = 0; inplace < 2; inplace++) {
        fill(t, send, count, kind, seed, r, 0);
        memset(recv, 0xff, count * es);
        char *out = inplace ? send : recv;
        if (bmt_all_reduce(c, send, out, count, t, op, &err) < 0)
            chk_fail(k, "count %zu%s: %s", count, inplace ? " in place" : "", err.text);
        for (size_t i = 0; i < count && k->pass; i++)
            check_reduced(k, t, op, kind, seed, n, out, i, i, count);
        if (hash)
            *hash = fnv(*hash, out, count * es);
    }
    free(send);
    free(recv);
}

static void one_broadcast(bmt_comm_t *c, bmt_dtype_t t, int kind, uint64_t seed, size_t count,
                          int root, struct chk *k)
{
    int r = bmt_comm_rank(c);
    size_t es = bmt_dtype_size(t);
    char *buf = xalloc(count * es);
    if (r == root)
        fill(t, buf, count, kind, seed, root, 0);
    else
        memset(buf, 0xff, count * es);
    bmt_error_t err;
    if (bmt_broadcast(c, buf, count, t, root, &err) < 0)
        chk_fail(k, "count %zu root %d: %s", count, root, err.text);
    for (size_t i = 0; i < count && k->pass; i++)
        if (!same_bits(t, buf, i, value(t, kind, seed, root, i)))
            chk_fail(k, "count %zu root %d: element %zu differs", count, root, i);
    free(buf);
}

/* ------------------------------------------------------------ suites */

/* Every collective x dtype x op x count x data kind on c. lite: f32 and bf16 sum only. */
static void suite(bmt_comm_t *c, const char *label, uint64_t seed, const size_t *counts,
                  int ncounts, bool lite)
{
    int n = bmt_comm_size(c);
    int ndt = lite ? 2 : 3, nop = lite ? 1 : 3;
    for (int d = 0; d < ndt; d++) {
        struct chk k = CHK_INIT;
        for (int kind = 0; kind < 2; kind++)
            for (int ci = 0; ci < ncounts; ci++)
                one_all_gather(c, dtypes[d], kind, seed, counts[ci], &k);
        chk_report(&k, n, "%s: all_gather %s", label, bmt_dtype_name(dtypes[d]));
    }
    for (int d = 0; d < ndt; d++)
        for (int o = 0; o < nop; o++) {
            struct chk k = CHK_INIT;
            for (int kind = 0; kind < 2; kind++)
                for (int ci = 0; ci < ncounts; ci++)
                    one_reduce_scatter(c, dtypes[d], ops[o], kind, seed, counts[ci], &k);
            chk_report(&k, n, "%s: reduce_scatter %s %s", label, bmt_dtype_name(dtypes[d]),
                       bmt_op_name(ops[o]));
        }
    for (int d = 0; d < ndt; d++) {
        uint64_t hash = 0xcbf29ce484222325ULL;
        for (int o = 0; o < nop; o++) {
            struct chk k = CHK_INIT;
            for (int kind = 0; kind < 2; kind++)
                for (int ci = 0; ci < ncounts; ci++)
                    one_all_reduce(c, dtypes[d], ops[o], kind, seed, counts[ci], &k, &hash);
            chk_report(&k, n, "%s: all_reduce %s %s, out of place and in place", label,
                       bmt_dtype_name(dtypes[d]), bmt_op_name(ops[o]));
        }
        if (!lite) {
            char name[96];
            snprintf(name, sizeof(name),
                     "%s: all_reduce %s results are bitwise identical on "
                     "every rank",
                     label, bmt_dtype_name(dtypes[d]));
            send_rec(REC_SAME, name, 1, n, hash, "");
        }
    }
    for (int d = 0; d < ndt; d++) {
        struct chk k = CHK_INIT;
        for (int root = 0; root < n; root++)
            for (int ci = 0; ci < ncounts; ci++)
                one_broadcast(c, dtypes[d], DATA_RAND, seed + (uint64_t)root, counts[ci], root, &k);
        chk_report(&k, n, "%s: broadcast %s from every root", label, bmt_dtype_name(dtypes[d]));
    }
}

/* Back-to-back collectives of random kinds, dtypes, ops and counts (the same
 * sequence on every rank): double buffering must hold across operations. */
static void mixed(bmt_comm_t *c, const char *label, uint64_t seed)
{
    struct chk k = CHK_INIT;
    int n = bmt_comm_size(c);
    bmt_error_t err;
    for (int it = 0; it < MIXED_OPS; it++) {
        uint64_t h = splitmix(seed + (uint64_t)it * 7919);
        bmt_dtype_t t = dtypes[(h >> 8) % 3];
        bmt_op_t op = ops[(h >> 16) % 3];
        size_t count = (h >> 24) % 5000;
        int root = (int)((h >> 40) % (uint64_t)n);
        switch (h % 5) {
        case 0: one_all_gather(c, t, DATA_RAND, h, count, &k); break;
        case 1: one_reduce_scatter(c, t, op, DATA_RAND, h, count / (size_t)n, &k); break;
        case 2: one_all_reduce(c, t, op, DATA_RAND, h, count, &k, NULL); break;
        case 3: one_broadcast(c, t, DATA_RAND, h, count, root, &k); break;
        default:
            if (bmt_barrier(c, &err) < 0)
                chk_fail(&k, "barrier %d: %s", it, err.text);
        }
    }
    chk_report(&k, n, "%s: %d back-to-back collectives of mixed kinds", label, MIXED_OPS);
}

static void bench(bmt_comm_t *c)
{
    const size_t per = (size_t)8 << 20; /* f32 elements per rank: 32 MiB */
    const int reps = 5;
    int n = bmt_comm_size(c);
    size_t bytes = per * 4 * (size_t)n;
    float *send = xalloc(per * 4), *recv = xalloc(bytes), *src = xalloc(bytes);
    memset(send, 1, per * 4);
    memset(recv, 2, bytes);
    memset(src, 3, bytes);
    bmt_error_t err;
    double t_ag = 0, t_ar = 0, t_cp = 0;
    int rc = 0;
    rc |= bmt_all_gather(c, send, recv, per, BMT_F32, &err);
    rc |= bmt_barrier(c, &err);
    double t0 = now_s();
    for (int i = 0; i < reps; i++)
        rc |= bmt_all_gather(c, send, recv, per, BMT_F32, &err);
    t_ag = (now_s() - t0) / reps;
    rc |= bmt_barrier(c, &err);
    t0 = now_s();
    for (int i = 0; i < reps; i++)
        rc |= bmt_all_reduce(c, send, recv, per, BMT_F32, BMT_SUM, &err);
    t_ar = (now_s() - t0) / reps;
    rc |= bmt_barrier(c, &err);
    if (me.rank == 0) { /* the other ranks wait in the barrier */
        memcpy(recv, src, bytes);
        t0 = now_s();
        for (int i = 0; i < reps; i++) {
            memcpy(recv, src, bytes);
            __asm__ __volatile__("" : : "r"(recv) : "memory");
        }
        t_cp = (now_s() - t0) / reps;
    }
    rc |= bmt_barrier(c, &err);
    if (me.rank == 0) {
        char d[144];
        double mib = (double)bytes / 1048576.0;
        snprintf(d, sizeof(d),
                 "bandwidth: all_gather of %.0f MiB over %d ranks %.1f ms (%.2f GB/s); "
                 "memcpy of %.0f MiB %.1f ms (%.2f GB/s)",
                 mib, n, t_ag * 1e3, (double)bytes / t_ag / 1e9, mib, t_cp * 1e3,
                 (double)bytes / t_cp / 1e9);
        send_rec(REC_DIAG, "", 1, 0, 0, d);
        snprintf(d, sizeof(d),
                 "bandwidth: all_reduce f32 sum of %.0f MiB over %d ranks %.1f ms "
                 "(%.2f GB/s of buffer)",
                 (double)per * 4 / 1048576.0, n, t_ar * 1e3, (double)per * 4 / t_ar / 1e9);
        send_rec(REC_DIAG, "", 1, 0, 0, d);
    }
    struct chk k = CHK_INIT;
    if (rc != 0)
        chk_fail(&k, "%s", err.text);
    chk_report(&k, n, "bandwidth run of 32 MiB collectives succeeds");
    free(send);
    free(recv);
    free(src);
}

static bool segment_exists(uint64_t job, uint64_t id)
{
    char path[96];
    snprintf(path, sizeof(path), "/dev/shm/bmt-%016llx-%016llx", (unsigned long long)job,
             (unsigned long long)id);
    return access(path, F_OK) == 0;
}

/* 2 x n/2 like the layout: group g = ranks g*half .. , replica i = ranks i, i + half. */
static void splits(bmt_comm_t *world, uint64_t seed, const size_t *counts, int ncounts)
{
    int n = me.n, r = me.rank, half = n / 2;
    int colors[MAX_RANKS], keys[MAX_RANKS];
    bmt_error_t err;
    bmt_comm_t *group = NULL, *replica = NULL, *evens = NULL;
    struct chk k = CHK_INIT;

    for (int i = 0; i < n; i++) {
        colors[i] = i / half;
        keys[i] = i % half;
    }
    if (comm_split_known(world, colors, keys, "group", &group, &err) < 0)
        chk_fail(&k, "group split: %s", err.text);
    for (int i = 0; i < n; i++) {
        colors[i] = i % half;
        keys[i] = i / half;
    }
    if (comm_split_known(world, colors, keys, "replica", &replica, &err) < 0)
        chk_fail(&k, "replica split: %s", err.text);
    if (k.pass) {
        if (bmt_comm_size(group) != half || bmt_comm_rank(group) != r % half)
            chk_fail(&k, "group: size %d rank %d", bmt_comm_size(group), bmt_comm_rank(group));
        for (int i = 0; i < half; i++)
            if (bmt_comm_member(group, i) != (r / half) * half + i)
                chk_fail(&k, "group member %d is %d", i, bmt_comm_member(group, i));
        if (bmt_comm_size(replica) != 2 || bmt_comm_rank(replica) != r / half)
            chk_fail(&k, "replica: size %d rank %d", bmt_comm_size(replica),
                     bmt_comm_rank(replica));
        for (int g = 0; g < 2; g++)
            if (bmt_comm_member(replica, g) != r % half + g * half)
                chk_fail(&k, "replica member %d is %d", g, bmt_comm_member(replica, g));
    }
    chk_report(&k, n, "split 2 x %d: group and replica membership", half);
    if (!k.pass)
        _exit(5);

    char label[64];
    snprintf(label, sizeof(label), "group %d (%d ranks)", r / half, half);
    suite(group, label, seed ^ splitmix((uint64_t)(r / half) + 101), counts, ncounts, true);
    snprintf(label, sizeof(label), "replica %d (2 ranks)", r % half);
    suite(replica, label, seed ^ splitmix((uint64_t)(r % half) + 202), counts, ncounts, true);

    /* Interleaved use of all three: each keeps its own sync sequence. */
    struct chk ki = CHK_INIT;
    for (int it = 0; it < 5; it++) {
        one_all_reduce(group, BMT_F32, BMT_SUM, DATA_RAND, seed + 1 + (uint64_t)(r / half), 3000,
                       &ki, NULL);
        one_reduce_scatter(replica, BMT_BF16, BMT_SUM, DATA_INT, seed + 7 + (uint64_t)(r % half),
                           700, &ki);
        one_all_gather(world, BMT_F64, DATA_RAND, seed + 9, 1500, &ki);
    }
    chk_report(&ki, n, "interleaved group, replica and world collectives");

    /* A split where odd ranks join nothing. */
    struct chk ke = CHK_INIT;
    for (int i = 0; i < n; i++) {
        colors[i] = i % 2 ? -1 : 0;
        keys[i] = i;
    }
    if (comm_split_known(world, colors, keys, "evens", &evens, &err) < 0)
        chk_fail(&ke, "%s", err.text);
    else if (r % 2 && evens != NULL)
        chk_fail(&ke, "rank %d got a communicator for color -1", r);
    else if (r % 2 == 0) {
        if (evens == NULL || bmt_comm_size(evens) != (n + 1) / 2)
            chk_fail(&ke, "evens: size %d", bmt_comm_size(evens));
        else
            one_all_reduce(evens, BMT_F64, BMT_SUM, DATA_RAND, seed + 3, 2049, &ke, NULL);
    }
    one_all_reduce(world, BMT_BF16, BMT_AVG, DATA_RAND, seed + 5, 999, &ke, NULL);
    chk_report(&ke, n, "split with color -1: odd ranks get NULL, evens and world still work");

    bmt_comm_destroy(evens);
    bmt_comm_destroy(group);
    bmt_comm_destroy(replica);
}

/* ------------------------------------------------------------ scenarios */

static int has(const char *s, const char *needle) { return strstr(s, needle) != NULL; }

static void sc_timeout(bmt_comm_t *world, double tmo)
{
    int n = me.n, r = me.rank, late = n - 1;
    int colors[MAX_RANKS], keys[MAX_RANKS];
    bmt_error_t err;
    struct chk k0 = CHK_INIT;
    bmt_comm_t *odd = NULL;
    for (int i = 0; i < n; i++) {
        colors[i] = i % 2 ? 0 : -1;
        keys[i] = i;
    }
    if (bmt_barrier(world, &err) < 0 ||
        comm_split_known(world, colors, keys, "odd", &odd, &err) < 0)
        chk_fail(&k0, "%s", err.text);
    chk_report(&k0, n, "barrier and split before the failure");

    char want[64];
    snprintf(want, sizeof(want), "waiting for rank %d (world rank %d)", late, late);
    if (r != late) {
        struct chk k = CHK_INIT, k2 = CHK_INIT;
        double t0 = now_s();
        int rc = bmt_barrier(world, &err);
        double dt = now_s() - t0;
        if (rc == 0)
            chk_fail(&k, "the barrier succeeded without rank %d", late);
        else if (dt < 0.9 * tmo || dt > tmo + 2.0)
            chk_fail(&k, "failed after %.2f s, deadline %.1f s", dt, tmo);
        else if (!has(err.text, want) || !has(err.text, "rank ") ||
                 !(has(err.text, "BMT_TIMEOUT") || has(err.text, "aborted the communicator")))
            chk_fail(&k, "message: %s", err.text);
        chk_report(&k, n - 1,
                   "world barrier without rank %d: the others fail within %.0f s + "
                   "slack, naming it",
                   late, tmo);
        send_rec(REC_DIAG, "", 1, 0, 0, err.text);
        t0 = now_s();
        rc = bmt_barrier(world, &err);
        dt = now_s() - t0;
        if (rc == 0 || dt > 0.1 || !has(err.text, "aborted"))
            chk_fail(&k2, "rc %d after %.3f s: %s", rc, dt, err.text);
        chk_report(&k2, n - 1, "the failed world refuses the next call at once");
    } else {
        struct chk k = CHK_INIT;
        sleep_s(tmo + 1.0);
        double t0 = now_s();
        int rc = bmt_barrier(world, &err);
        double dt = now_s() - t0;
        if (rc == 0 || dt > 0.5 || !has(err.text, "aborted the communicator"))
            chk_fail(&k, "rc %d after %.3f s: %s", rc, dt, err.text);
        chk_report(&k, 1, "rank %d arriving late fails at once: the others aborted the world",
                   late);
        send_rec(REC_DIAG, "", 1, 0, 0, err.text);
    }

    /* odd = world ranks {1, 3}: comm rank 1 is world rank 3; world rank 3 stays away. */
    if (odd != NULL && r == late) {
        sleep_s(tmo + 0.5);
    } else if (odd != NULL) {
        struct chk k = CHK_INIT;
        double t0 = now_s();
        int rc = bmt_barrier(odd, &err);
        double dt = now_s() - t0;
        snprintf(want, sizeof(want), "waiting for rank 1 (world rank %d) (BMT_TIMEOUT)", late);
        if (rc == 0 || dt < 0.9 * tmo || dt > tmo + 2.0 || !has(err.text, want) ||
            !has(err.text, "timed out after"))
            chk_fail(&k, "rc %d after %.2f s: %s", rc, dt, err.text);
        chk_report(&k, 1,
                   "split comm barrier without world rank %d: fails naming comm rank "
                   "and world rank",
                   late);
        send_rec(REC_DIAG, "", 1, 0, 0, err.text);
    }
    bmt_comm_destroy(odd);
}

/* One call of a collective, as a test case spells it. */
struct call {
    comm_kind_t kind;
    size_t count;
    bmt_dtype_t t;
    int op;   /* reductions */
    int root; /* broadcast */
};

static int do_call(bmt_comm_t *c, const struct call *k, void *send, void *recv, bmt_error_t *err)
{
    switch (k->kind) {
    case COMM_ALL_GATHER: return bmt_all_gather(c, send, recv, k->count, k->t, err);
    case COMM_REDUCE_SCATTER:
        return bmt_reduce_scatter(c, send, recv, k->count, k->t, (bmt_op_t)k->op, err);
    case COMM_ALL_REDUCE:
        return bmt_all_reduce(c, send, recv, k->count, k->t, (bmt_op_t)k->op, err);
    case COMM_BROADCAST: return bmt_broadcast(c, recv, k->count, k->t, k->root, err);
    default: return bmt_barrier(c, err);
    }
}

/* Rank `odd` calls b while the others call a, after `pre` matching all_reduces,
 * on a fresh communicator of every rank ("case"): every rank must fail, name
 * the odd rank (or rank 1 when rank 0 is the odd one) and both calls, leave its
 * receive buffer alone and refuse the next call; the world is not affected. */
static void sc_differ(bmt_comm_t *world, bool knob)
{
    static const struct {
        const char *what;
        int odd, pre;
        struct call a, b;
        const char *want;
    } cases[] = {
        { "all_reduce against all_gather",
          1,
          0,
          { COMM_ALL_REDUCE, 1, BMT_F64, BMT_SUM, -1 },
          { COMM_ALL_GATHER, 4096, BMT_BF16, -1, -1 },
          "rank 1 issued all_gather(count 4096, bf16) while rank 0 issued all_reduce(count 1, "
          "f64, sum)" },
        { "counts differ",
          2,
          2,
          { COMM_ALL_REDUCE, 1000, BMT_F32, BMT_SUM, -1 },
          { COMM_ALL_REDUCE, 1001, BMT_F32, BMT_SUM, -1 },
          "rank 2 issued all_reduce(count 1001, f32, sum) while rank 0 issued "
          "all_reduce(count 1000, f32, sum)" },
        { "dtypes differ",
          2,
          0,
          { COMM_ALL_GATHER, 100, BMT_F32, -1, -1 },
          { COMM_ALL_GATHER, 100, BMT_BF16, -1, -1 },
          "rank 2 issued all_gather(count 100, bf16) while rank 0 issued all_gather(count 100, "
          "f32)" },
        { "ops differ",
          1,
          0,
          { COMM_REDUCE_SCATTER, 100, BMT_F32, BMT_SUM, -1 },
          { COMM_REDUCE_SCATTER, 100, BMT_F32, BMT_MAX, -1 },
          "rank 1 issued reduce_scatter(count 100, f32, max) while rank 0 issued "
          "reduce_scatter(count 100, f32, sum)" },
        { "roots differ",
          2,
          0,
          { COMM_BROADCAST, 10, BMT_F32, -1, 0 },
          { COMM_BROADCAST, 10, BMT_F32, -1, 2 },
          "rank 2 issued broadcast(count 10, f32, root 2) while rank 0 issued broadcast(count "
          "10, f32, root 0)" },
        { "a barrier against a chunked all_reduce",
          1,
          0,
          { COMM_BARRIER, 0, BMT_F32, -1, -1 },
          { COMM_ALL_REDUCE, 3000, BMT_F32, BMT_AVG, -1 },
          "rank 1 issued all_reduce(count 3000, f32, avg) while rank 0 issued barrier()" },
        { "rank 0 is the odd one",
          0,
          1,
          { COMM_BARRIER, 0, BMT_F32, -1, -1 },
          { COMM_ALL_GATHER, 5000, BMT_F64, -1, -1 },
          "rank 1 issued barrier() while rank 0 issued all_gather(count 5000, f64)" },
    };
    int n = me.n, r = me.rank;
    int colors[MAX_RANKS], keys[MAX_RANKS];
    size_t cap = (size_t)5000 * 8 * MAX_RANKS;
    unsigned char *send = xalloc(cap), *recv = xalloc(cap);
    memset(send, 0, cap);
    for (int i = 0; i < n; i++) {
        colors[i] = 0;
        keys[i] = i;
    }
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct chk k = CHK_INIT, ka = CHK_INIT;
        bmt_comm_t *c = NULL;
        bmt_error_t err;
        if (comm_split_known(world, colors, keys, "case", &c, &err) < 0) {
            chk_fail(&k, "split: %s", err.text);
            chk_report(&k, n, "%s: split", cases[i].what);
            continue;
        }
        for (int p = 0; p < cases[i].pre; p++)
            if (bmt_all_reduce(c, send, recv, 10, BMT_F32, BMT_SUM, &err) < 0)
                chk_fail(&k, "matching all_reduce %d: %s", p, err.text);
        const struct call *mine = r == cases[i].odd ? &cases[i].b : &cases[i].a;
        memset(recv, 0xa5, cap);
        double t0 = now_s();
        int rc = do_call(c, mine, send, recv, &err);
        double dt = now_s() - t0;
        char lead[96];
        if (knob)
            snprintf(lead, sizeof(lead), "rank %d: collective check (case, call #%d): ", r,
                     cases[i].pre + 1);
        else
            snprintf(lead, sizeof(lead), "rank %d: case: ", r);
        size_t untouched = 0;
        while (untouched < cap && recv[untouched] == 0xa5)
            untouched++;
        if (rc == 0)
            chk_fail(&k, "the call returned 0");
        else if (strncmp(err.text, lead, strlen(lead)) != 0 || !has(err.text, cases[i].want) ||
                 (!knob && !has(err.text, "the ranks called different collectives: ")))
            chk_fail(&k, "message: %s", err.text);
        else if (untouched != cap)
            chk_fail(&k, "byte %zu of the receive buffer was written", untouched);
        else if (dt > 2.0)
            chk_fail(&k, "took %.2f s", dt);
        chk_report(&k, n, "%s: every rank fails at once naming both calls, buffers untouched",
                   cases[i].what);
        if (i == 0)
            send_rec(REC_DIAG, "", 1, 0, 0, err.text);
        if (bmt_barrier(c, &err) == 0 || !has(err.text, "aborted"))
            chk_fail(&ka, "%s", err.text);
        chk_report(&ka, n, "%s: the communicator is aborted", cases[i].what);
        bmt_comm_destroy(c);
    }
    struct chk kw = CHK_INIT;
    one_all_reduce(world, BMT_F32, BMT_SUM, DATA_INT, 77, 3000, &kw, NULL);
    chk_report(&kw, n, "the world still works after the failed cases");
    free(send);
    free(recv);
}

/* ------------------------------------------------------------ a child */

static bmt_comm_t *make_world(bmt_ctx_t *ctx, int r, int n, double tmo)
{
    bmt_error_t err;
    ctx->rank = r;
    ctx->world = n;
    ctx->timeout_s = tmo;
    ctx->job_hash = me.job;
    ctx->device = BMT_DEVICE_CPU;
    ctx->device_index = -1;
    ctx->backend = &comm_backend_shm;
    ctx->boot = NULL;
    if (bmt_layout_make(&ctx->layout, 1, n, 0, 0, &err) < 0)
        _exit(6);
    ctx->self = bmt_layout_rank(&ctx->layout, r);
    bmt_comm_t *w = calloc(1, sizeof(*w));
    if (w == NULL)
        _exit(4);
    w->ctx = ctx;
    w->be = &comm_backend_shm;
    snprintf(w->name, sizeof(w->name), "world");
    w->rank = r;
    w->size = n;
    w->members = NULL;
    w->id = comm_world_id(me.job);
    w->timeout_s = tmo;
    return w;
}

static void child(const struct run *run, int r)
{
    alarm(90); /* never outlive a broken run */
    bmt_ctx_t *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        _exit(4);
    const char *chunk = run->chunk;
    if (run->sc == SC_MISMATCH)
        chunk = r == 0 ? "4K" : "8K";
    if (chunk)
        setenv("BMT_SHM_CHUNK", chunk, 1);
    else
        unsetenv("BMT_SHM_CHUNK");
    /* BMT_CHECK_COLLECTIVES is read by bmt_init: here, by hand, into the context
     * before any communicator exists. */
    ctx->check_collectives = run->check;
    /* SC_RETIRED: both children are rank 0 of the same communicator; the
     * second comes 0.5 s later, finds the first's segment, retires it as a
     * leftover and makes its own. The first must fail at once saying so (it
     * once failed with whatever text err held before), the second at its
     * deadline, waiting for a rank 1 that never comes. */
    if (run->sc == SC_RETIRED && r == 1)
        usleep(500000);
    bmt_comm_t *world = make_world(ctx, run->sc == SC_RETIRED ? 0 : r, run->n, run->timeout_s);
    world->check = ctx->check_collectives;
    bmt_error_t err;
    snprintf(err.text, sizeof(err.text), "(stale text: no error was set)");
    struct chk k = CHK_INIT;
    double t0 = now_s();
    int rc = comm_backend_shm.create_world(world, &err);
    double dt = now_s() - t0;

    if (run->sc == SC_RETIRED) {
        const char *want = r == 0 ? "was retired while rank 0 waited" : "timed out after";
        if (rc == 0 || !has(err.text, want) || (r == 0 && dt > 1.5))
            chk_fail(&k, "rc %d after %.2f s: %s", rc, dt, rc ? err.text : "");
        chk_report(&k, 1, "creator %d: create_world fails (%s)", r,
                   r == 0 ? "at once: its segment was retired by the second creator"
                          : "at its deadline: no rank 1");
        send_rec(REC_DIAG, "", 1, 0, 0, err.text);
        comm_free(world);
        _exit(0);
    }

    if (run->sc == SC_MISMATCH) {
        const char *want = r == 0 ? "rank 1 (world rank 1) rejected" : "BMT_SHM_CHUNK alike";
        if (rc == 0 || !has(err.text, want) || dt > 2.0)
            chk_fail(&k, "rc %d after %.2f s: %s", rc, dt, rc ? err.text : "");
        chk_report(&k, 1, "rank %d: create_world fails fast (%s)", r,
                   r == 0 ? "names the rank that rejected the segment" : "the chunk sizes differ");
        send_rec(REC_DIAG, "", 1, 0, 0, err.text);
        comm_free(world); /* destroy must tolerate impl == NULL */
        _exit(0);
    }
    if (rc < 0)
        chk_fail(&k, "%s", err.text);
    chk_report(&k, run->n, "create_world (rendezvous through /dev/shm)");
    if (rc < 0)
        _exit(7);

    if (run->sc == SC_TIMEOUT) {
        sc_timeout(world, run->timeout_s);
        comm_free(world);
        _exit(0);
    }

    struct chk ku = CHK_INIT;
    if (bmt_barrier(world, &err) < 0)
        chk_fail(&ku, "%s", err.text);
    else if (segment_exists(me.job, world->id))
        chk_fail(&ku, "/dev/shm still has the world's segment");
    chk_report(&ku, run->n, "the segment's name is gone once every rank attached");

    if (run->sc == SC_DIFFER || run->sc == SC_DIFFER_CHECK) {
        sc_differ(world, run->sc == SC_DIFFER_CHECK);
        comm_free(world);
        _exit(0);
    }

    uint64_t seed = splitmix(me.job + 17);
    if (run->sc == SC_STALE) {
        struct chk ks = CHK_INIT;
        one_all_reduce(world, BMT_F64, BMT_SUM, DATA_RAND, seed, 1000, &ks, NULL);
        one_all_gather(world, BMT_BF16, DATA_INT, seed, 3000, &ks);
        chk_report(&ks, run->n, "collectives work on the segment that replaced the leftover");
        comm_free(world);
        _exit(0);
    }

    size_t counts[8];
    int nc = 0;
    counts[nc++] = 0;
    counts[nc++] = 1;
    counts[nc++] = 3;
    if (run->n > 2)
        counts[nc++] = (size_t)run->n - 1;
    counts[nc++] = 1000;
    counts[nc++] = 2049; /* > one 4K slot for every dtype; last chunk of 1 element */
    counts[nc++] = run->big;
    suite(world, "world", seed, counts, nc, false);
    mixed(world, "world", seed + 1);
    if (run->splits) {
        size_t small[] = { 0, 1, 3, 1000, 2049 };
        splits(world, seed + 2, small, 5);
    }
    if (run->bench)
        bench(world);
    struct chk kb = CHK_INIT;
    for (int i = 0; i < 20; i++)
        if (bmt_barrier(world, &err) < 0) {
            chk_fail(&kb, "%s", err.text);
            break;
        }
    chk_report(&kb, run->n, "20 barriers");
    comm_free(world);
    free(ctx);
    _exit(0);
}

/* ------------------------------------------------------------ the parent */

struct agg {
    char name[96];
    int kind;
    int nrep, npass, expect;
    uint64_t hash;
    bool hash_differs;
    int fail_rank;
    char detail[144];
};

static int count_leftovers(uint64_t job)
{
    char prefix[40];
    snprintf(prefix, sizeof(prefix), "bmt-%016llx-", (unsigned long long)job);
    DIR *d = opendir("/dev/shm");
    if (d == NULL)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

/* A file full of junk where the world's segment will go: a crashed run's leftover. */
static void make_leftover(uint64_t job)
{
    char name[64];
    snprintf(name, sizeof(name), "/bmt-%016llx-%016llx", (unsigned long long)job,
             (unsigned long long)comm_world_id(job));
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return;
    char junk[8192];
    memset(junk, 0x11, sizeof(junk));
    if (write(fd, junk, sizeof(junk)) != (ssize_t)sizeof(junk))
        diag("could not write the leftover");
    close(fd);
}

static void run_one(const struct run *run, int index)
{
    static struct agg aggs[512];
    int naggs = 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    me.job = splitmix((uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32) ^ (uint64_t)index);
    me.n = run->n;
    diag("run: %s (job %016llx)", run->label, (unsigned long long)me.job);
    if (run->sc == SC_STALE) {
        make_leftover(me.job);
        ok(count_leftovers(me.job) == 1, "[%s] a leftover segment is in /dev/shm before the run",
           run->label);
    }
    int fds[2];
    if (pipe(fds) < 0) {
        ok(0, "[%s] pipe: %s", run->label, strerror(errno));
        return;
    }
    pid_t pids[MAX_RANKS];
    double t0 = now_s();
    fflush(stdout);
    for (int r = 0; r < run->n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            close(fds[0]);
            me.fd = fds[1];
            me.rank = r;
            child(run, r);
            _exit(0);
        }
    }
    close(fds[1]);
    struct rec rec;
    size_t got = 0;
    struct pollfd pfd = { fds[0], POLLIN, 0 };
    for (;;) {
        if (now_s() - t0 > 120) {
            diag("run took over 120 s: killing its children");
            for (int r = 0; r < run->n; r++)
                if (pids[r] > 0)
                    kill(pids[r], SIGKILL);
            break;
        }
        if (poll(&pfd, 1, 1000) <= 0)
            continue;
        ssize_t m = read(fds[0], (char *)&rec + got, sizeof(rec) - got);
        if (m <= 0)
            break;
        got += (size_t)m;
        if (got < sizeof(rec))
            continue;
        got = 0;
        if (rec.kind == REC_DIAG) {
            diag("[%s] rank %d: %s", run->label, rec.rank, rec.detail);
            continue;
        }
        struct agg *a = NULL;
        for (int i = 0; i < naggs && !a; i++)
            if (strcmp(aggs[i].name, rec.name) == 0)
                a = &aggs[i];
        if (a == NULL && naggs < (int)(sizeof(aggs) / sizeof(aggs[0]))) {
            a = &aggs[naggs++];
            memset(a, 0, sizeof(*a));
            snprintf(a->name, sizeof(a->name), "%s", rec.name);
            a->kind = rec.kind;
            a->expect = rec.expect;
            a->hash = rec.hash;
            a->fail_rank = -1;
        }
        if (a == NULL)
            continue;
        a->nrep++;
        a->npass += rec.pass;
        if (rec.hash != a->hash)
            a->hash_differs = true;
        if (!rec.pass && a->fail_rank < 0) {
            a->fail_rank = rec.rank;
            snprintf(a->detail, sizeof(a->detail), "%s", rec.detail);
        }
    }
    close(fds[0]);
    int exited_ok = 0;
    char why[128] = "";
    for (int r = 0; r < run->n; r++) {
        int st = 0;
        if (waitpid(pids[r], &st, 0) == pids[r] && WIFEXITED(st) && WEXITSTATUS(st) == 0)
            exited_ok++;
        else if (why[0] == '\0')
            snprintf(why, sizeof(why), "rank %d: %s %d", r,
                     WIFSIGNALED(st) ? "signal" : "exit status",
                     WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    }
    for (int i = 0; i < naggs; i++) {
        struct agg *a = &aggs[i];
        bool pass = a->npass == a->nrep && (a->expect == 0 || a->nrep == a->expect);
        if (a->kind == REC_SAME)
            pass = pass && !a->hash_differs;
        ok(pass, "[%s] %s", run->label, a->name);
        if (!pass) {
            diag("  %d ranks reported (want %d), %d passed%s", a->nrep, a->expect, a->npass,
                 a->hash_differs ? ", results differ between ranks" : "");
            if (a->fail_rank >= 0)
                diag("  rank %d: %s", a->fail_rank, a->detail);
        }
    }
    ok(exited_ok == run->n, "[%s] all %d ranks exited 0 (%.1f s)", run->label, run->n,
       now_s() - t0);
    if (exited_ok != run->n)
        diag("  %s", why);
    int left = count_leftovers(me.job);
    ok(left == 0, "[%s] /dev/shm holds no bmt- segment of this run", run->label);
}

int main(void)
{
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++)
        run_one(&runs[i], (int)i);
    return done_testing();
}
