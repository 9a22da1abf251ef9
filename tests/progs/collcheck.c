/* tests/progs/collcheck.c — every collective on the world, group and replica
 * communicators, checked against values computed independently here.
 *
 * Run as a rank program: `bmlaunch -g 2 -n 4 -- collcheck`. Each rank knows what
 * every peer contributes (the inputs are functions of the peer's world rank and
 * the element index), so the expected result of every collective is computed
 * locally in double precision, in rank order, without trusting the library.
 * Receive buffers are poisoned (all bits set: NaN) before each call so an
 * element the collective failed to write cannot pass.
 *
 * Two input families:
 *   exact:  small integers in [-15, 15]; every sum over <= 8 ranks is exact in
 *           bf16, f32 and f64, so results must match bit for bit (AVG divides by
 *           a power of two in the tested layouts, also exact).
 *   random: uniform in [-1, 1) from a hash; compared with a relative bound suited
 *           to the dtype (f64 1e-12, f32 1e-6, bf16 one rounding of the f32 sum:
 *           2^-8 relative to the largest magnitude involved).
 * Options: --quick (fewer counts). BMT_EXPECT_BACKEND in the environment: assert
 * the backend. Prints one line per rank and exits 1 on the first error.
 *
 * --differ kind|count|dtype|op|root [--comm world|group]: a wrong program on
 * purpose. After two matching all_reduces on the communicator (with --comm
 * group: the last group's; the other groups then wait in a world barrier until
 * the launcher ends the job), its rank 1 issues a call that differs from
 * everyone else's in that one respect:
 *   kind   all_gather(count 4096, bf16)  against all_reduce(count 1, f64, sum)
 *   count  all_reduce(count 1001, f32, sum) against all_reduce(count 1000, f32, sum)
 *   dtype  all_gather(count 100, bf16)   against all_gather(count 100, f32)
 *   op     all_reduce(count 64, f32, max) against all_reduce(count 64, f32, sum)
 *   root   broadcast(count 10, f32, root 1) against broadcast(count 10, f32, root 0)
 * The library must fail the call: the rank prints the error and exits 1. A call
 * that returns 0 is the bug this mode exists for: the rank says so and exits 3.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bmt/bmt.h"

static bmt_ctx_t *ctx;
static long checks;

static uint64_t mix(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ULL;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dULL;
    x ^= x >> 33;
    return x;
}

/* Contribution of world rank w at element i, for salt s (which call), family f. */
static double input(int family, int w, size_t i, int s)
{
    if (family == 0)
        return (
            double)((int)((mix((uint64_t)w * 1000003u + i * 7919u + (uint64_t)s * 104729u) % 31)) -
                    15);
    uint64_t h = mix(((uint64_t)w << 40) ^ ((uint64_t)s << 56) ^ i);
    return (double)(h >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static void store(void *buf, bmt_dtype_t t, size_t i, double v)
{
    switch (t) {
    case BMT_F32: ((float *)buf)[i] = (float)v; break;
    case BMT_F64: ((double *)buf)[i] = v; break;
    case BMT_BF16: ((uint16_t *)buf)[i] = bmt_f32_to_bf16((float)v); break;
    default: break;
    }
}

static double load(const void *buf, bmt_dtype_t t, size_t i)
{
    switch (t) {
    case BMT_F32: return ((const float *)buf)[i];
    case BMT_F64: return ((const double *)buf)[i];
    case BMT_BF16: return bmt_bf16_to_f32(((const uint16_t *)buf)[i]);
    default: return NAN;
    }
}

/* The value the library sees for an input: rounded to the dtype first. */
static double as_dtype(bmt_dtype_t t, double v)
{
    switch (t) {
    case BMT_F32: return (float)v;
    case BMT_BF16: return bmt_bf16_to_f32(bmt_f32_to_bf16((float)v));
    default: return v;
    }
}

static int fail(const char *what)
{
    fprintf(stderr, "collcheck: rank %d: %s\n", bmt_rank(ctx), what);
    return -1;
}

/* Compare got[i] (dtype t) with want (exact reference in f64, from dtype-rounded
 * inputs). scale is the largest input magnitude that went into want. */
static int compare(const char *what, const void *got, bmt_dtype_t t, size_t i, double want,
                   double scale, int family, int n)
{
    double g = load(got, t, i);
    double tol;
    if (family == 0)
        tol = 0;
    else if (t == BMT_F64)
        tol = 1e-12 * scale * n;
    else if (t == BMT_F32)
        tol = 1e-6 * scale * n;
    else
        tol = (1.0 / 256) * (fabs(want) + scale * n * 1e-6) + 1e-6 * scale * n;
    checks++;
    if (isnan(g) || fabs(g - want) > tol) {
        char msg[256];
        snprintf(msg, sizeof(msg), "%s: element %zu is %.9g, expected %.9g (tolerance %.3g)", what,
                 i, g, want, tol);
        return fail(msg);
    }
    return 0;
}

typedef struct bufs {
    void *dev_send, *dev_recv; /* on the device */
    void *h_send, *h_recv;     /* host staging */
    size_t bytes;              /* capacity of each */
} bufs_t;

static int upload(bufs_t *b, size_t bytes)
{
    bmt_error_t err;
    if (bmt_mem_upload(ctx, b->dev_send, b->h_send, bytes, &err) < 0)
        return fail(err.text);
    return 0;
}

static int poison(bufs_t *b, size_t bytes)
{
    bmt_error_t err;
    memset(b->h_recv, 0xff, bytes);
    if (bmt_mem_upload(ctx, b->dev_recv, b->h_recv, bytes, &err) < 0)
        return fail(err.text);
    return 0;
}

static int download(bufs_t *b, void *dev, size_t bytes)
{
    bmt_error_t err;
    if (bmt_mem_download(ctx, b->h_recv, dev, bytes, &err) < 0)
        return fail(err.text);
    return 0;
}

static double reduce(bmt_op_t op, const double *v, int n)
{
    double acc = v[0];
    for (int k = 1; k < n; k++)
        acc = op == BMT_MAX ? fmax(acc, v[k]) : acc + v[k];
    return op == BMT_AVG ? acc / n : acc;
}

static int check_comm(bmt_comm_t *comm, bufs_t *b, const size_t *counts, int ncounts, int *salt)
{
    static const bmt_dtype_t dtypes[] = { BMT_F32, BMT_BF16, BMT_F64 };
    static const bmt_op_t ops[] = { BMT_SUM, BMT_AVG, BMT_MAX };
    const int n = bmt_comm_size(comm), me = bmt_comm_rank(comm);
    int *w = malloc(sizeof(int) * (size_t)n);
    double *v = malloc(sizeof(double) * (size_t)n);
    if (w == NULL || v == NULL)
        return fail("out of memory");
    for (int k = 0; k < n; k++)
        w[k] = bmt_comm_member(comm, k);
    if (w[me] != bmt_rank(ctx))
        return fail("the communicator does not list this rank at its own position");
    char what[160];
    bmt_error_t err;
    for (int family = 0; family < 2; family++)
        for (size_t ti = 0; ti < 3; ti++)
            for (int ci = 0; ci < ncounts; ci++) {
                bmt_dtype_t t = dtypes[ti];
                size_t es = bmt_dtype_size(t), count = counts[ci];
                const char *tn = bmt_dtype_name(t);

                /* all_gather */
                int s = (*salt)++;
                for (size_t i = 0; i < count; i++)
                    store(b->h_send, t, i, input(family, w[me], i, s));
                if (upload(b, count * es) < 0 || poison(b, count * es * n) < 0)
                    return -1;
                if (bmt_all_gather(comm, b->dev_send, b->dev_recv, count, t, &err) < 0)
                    return fail(err.text);
                if (download(b, b->dev_recv, count * es * n) < 0)
                    return -1;
                snprintf(what, sizeof(what), "%s all_gather %s count %zu", bmt_comm_name(comm), tn,
                         count);
                for (int k = 0; k < n; k++)
                    for (size_t i = 0; i < count; i++) {
                        double want = as_dtype(t, input(family, w[k], i, s));
                        if (compare(what, b->h_recv, t, (size_t)k * count + i, want, 1, 0, 1) < 0)
                            return -1;
                    }

                for (int oi = 0; oi < 3; oi++) {
                    bmt_op_t op = ops[oi];
                    /* AVG of integers is exact only when dividing by a power of two. */
                    int fam = family == 0 && op == BMT_AVG && (n & (n - 1)) != 0 ? 1 : family;
                    /* reduce_scatter: rank k sends count*n; block j goes to rank j. */
                    s = (*salt)++;
                    for (size_t i = 0; i < count * (size_t)n; i++)
                        store(b->h_send, t, i, input(family, w[me], i, s));
                    if (upload(b, count * es * n) < 0 || poison(b, count * es) < 0)
                        return -1;
                    if (bmt_reduce_scatter(comm, b->dev_send, b->dev_recv, count, t, op, &err) < 0)
                        return fail(err.text);
                    if (download(b, b->dev_recv, count * es) < 0)
                        return -1;
                    snprintf(what, sizeof(what), "%s reduce_scatter %s %s count %zu",
                             bmt_comm_name(comm), bmt_op_name(op), tn, count);
                    for (size_t i = 0; i < count; i++) {
                        for (int k = 0; k < n; k++)
                            v[k] = as_dtype(t, input(family, w[k], (size_t)me * count + i, s));
                        if (compare(what, b->h_recv, t, i, reduce(op, v, n), 1, fam, n) < 0)
                            return -1;
                    }

                    /* all_reduce, out of place then in place */
                    for (int inplace = 0; inplace < 2; inplace++) {
                        s = (*salt)++;
                        for (size_t i = 0; i < count; i++)
                            store(b->h_send, t, i, input(family, w[me], i, s));
                        if (upload(b, count * es) < 0 || (!inplace && poison(b, count * es) < 0))
                            return -1;
                        void *out = inplace ? b->dev_send : b->dev_recv;
                        if (bmt_all_reduce(comm, b->dev_send, out, count, t, op, &err) < 0)
                            return fail(err.text);
                        if (download(b, out, count * es) < 0)
                            return -1;
                        snprintf(what, sizeof(what), "%s all_reduce%s %s %s count %zu",
                                 bmt_comm_name(comm), inplace ? " (in place)" : "", bmt_op_name(op),
                                 tn, count);
                        for (size_t i = 0; i < count; i++) {
                            for (int k = 0; k < n; k++)
                                v[k] = as_dtype(t, input(family, w[k], i, s));
                            if (compare(what, b->h_recv, t, i, reduce(op, v, n), 1, fam, n) < 0)
                                return -1;
                        }
                    }
                }

                /* broadcast from every root (small counts), from the last otherwise */
                for (int root = count <= 1000 ? 0 : n - 1; root < n; root++) {
                    s = (*salt)++;
                    if (me == root)
                        for (size_t i = 0; i < count; i++)
                            store(b->h_send, t, i, input(family, w[root], i, s));
                    else
                        memset(b->h_send, 0xff, count * es);
                    if (upload(b, count * es) < 0)
                        return -1;
                    if (bmt_broadcast(comm, b->dev_send, count, t, root, &err) < 0)
                        return fail(err.text);
                    if (download(b, b->dev_send, count * es) < 0)
                        return -1;
                    snprintf(what, sizeof(what), "%s broadcast from %d %s count %zu",
                             bmt_comm_name(comm), root, tn, count);
                    for (size_t i = 0; i < count; i++)
                        if (compare(what, b->h_recv, t, i,
                                    as_dtype(t, input(family, w[root], i, s)), 1, 0, 1) < 0)
                            return -1;
                }
            }
    if (bmt_barrier(comm, &err) < 0)
        return fail(err.text);
    free(w);
    free(v);
    return 0;
}

/* One call of --differ: what the others issue (a) and what comm rank 1 issues (b). */
struct call {
    const char *kind; /* "all_gather", "all_reduce" or "broadcast" */
    size_t count;
    bmt_dtype_t t;
    bmt_op_t op;
    int root;
};

static const struct {
    const char *what;
    struct call a, b;
} differ_cases[] = {
    { "kind", { "all_reduce", 1, BMT_F64, BMT_SUM, 0 }, { "all_gather", 4096, BMT_BF16, 0, 0 } },
    { "count",
      { "all_reduce", 1000, BMT_F32, BMT_SUM, 0 },
      { "all_reduce", 1001, BMT_F32, BMT_SUM, 0 } },
    { "dtype", { "all_gather", 100, BMT_F32, 0, 0 }, { "all_gather", 100, BMT_BF16, 0, 0 } },
    { "op", { "all_reduce", 64, BMT_F32, BMT_SUM, 0 }, { "all_reduce", 64, BMT_F32, BMT_MAX, 0 } },
    { "root", { "broadcast", 10, BMT_F32, 0, 0 }, { "broadcast", 10, BMT_F32, 0, 1 } },
};

static int differ(const char *what, const char *comm_name)
{
    bool group = strcmp(comm_name, "group") == 0;
    bmt_comm_t *comm = group ? bmt_comm_group(ctx) : bmt_comm_world(ctx);
    bool wrong = !group || bmt_self(ctx).group == bmt_layout(ctx)->groups - 1;
    const struct call *k = NULL;
    for (size_t i = 0; i < sizeof(differ_cases) / sizeof(differ_cases[0]); i++)
        if (strcmp(differ_cases[i].what, what) == 0)
            k = wrong && bmt_comm_rank(comm) == 1 ? &differ_cases[i].b : &differ_cases[i].a;
    if (k == NULL) {
        fprintf(stderr, "collcheck: --differ %s: use kind, count, dtype, op or root\n", what);
        return 2;
    }
    size_t bytes = 4096 * 8 * (size_t)bmt_comm_size(comm);
    bmt_error_t err;
    void *send = bmt_mem_alloc(ctx, bytes, &err);
    void *recv = send ? bmt_mem_alloc(ctx, bytes, &err) : NULL;
    if (recv == NULL) {
        fprintf(stderr, "collcheck: rank %d: %s\n", bmt_rank(ctx), err.text);
        return 1;
    }
    double one = 1;
    int rc = bmt_mem_upload(ctx, send, &one, sizeof(one), &err);
    for (int i = 0; i < 2 && rc == 0; i++) /* calls #1 and #2 match */
        rc = bmt_all_reduce(comm, send, recv, 1, BMT_F64, BMT_SUM, &err);
    if (rc < 0) {
        fprintf(stderr, "collcheck: rank %d: a matching all_reduce failed: %s\n", bmt_rank(ctx),
                err.text);
        return 1;
    }
    if (strcmp(k->kind, "all_gather") == 0)
        rc = bmt_all_gather(comm, send, recv, k->count, k->t, &err);
    else if (strcmp(k->kind, "all_reduce") == 0)
        rc = bmt_all_reduce(comm, send, recv, k->count, k->t, k->op, &err);
    else
        rc = bmt_broadcast(comm, send, k->count, k->t, k->root, &err);
    if (rc == 0 && !wrong) { /* a correct group: wait for the end of the job */
        rc = bmt_barrier(bmt_comm_world(ctx), &err);
        fprintf(stderr, "collcheck: rank %d: world barrier: %s\n", bmt_rank(ctx),
                rc ? err.text : "returned 0");
        return 1;
    }
    if (rc == 0) {
        fprintf(stderr,
                "collcheck: rank %d: %s %s(count %zu, %s) returned 0 although rank 1 of %s "
                "issued something else\n",
                bmt_rank(ctx), bmt_comm_name(comm), k->kind, k->count, bmt_dtype_name(k->t),
                bmt_comm_name(comm));
        return 3;
    }
    fprintf(stderr, "collcheck: %s\n", err.text);
    return 1;
}

int main(int argc, char **argv)
{
    bool quick = false;
    const char *differ_what = NULL, *comm_name = "world";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            quick = true;
        else if (strcmp(argv[i], "--differ") == 0 && i + 1 < argc)
            differ_what = argv[++i];
        else if (strcmp(argv[i], "--comm") == 0 && i + 1 < argc)
            comm_name = argv[++i];
        else {
            fprintf(stderr, "usage: collcheck [--quick] [--differ kind|count|dtype|op|root "
                            "[--comm world|group]]\n");
            return 2;
        }
    }
    bmt_error_t err;
    if (bmt_init(&ctx, NULL, &err) < 0) {
        fprintf(stderr, "collcheck: %s\n", err.text);
        return 1;
    }
    if (differ_what) /* exits without bmt_finalize: the communicator may be aborted */
        return differ(differ_what, comm_name);
    const char *want_backend = getenv("BMT_EXPECT_BACKEND");
    if (want_backend && strcmp(want_backend, bmt_backend(ctx)) != 0) {
        fprintf(stderr, "collcheck: backend is %s, expected %s\n", bmt_backend(ctx), want_backend);
        return 1;
    }
    static const size_t full[] = { 0, 1, 3, 7, 1000, 300001 };
    static const size_t small[] = { 0, 1, 7, 1000, 70001 };
    const size_t *counts = quick ? small : full;
    int ncounts = quick ? 5 : 6;
    size_t maxcount = counts[ncounts - 1];
    int world = bmt_world_size(ctx);
    bufs_t b;
    b.bytes = maxcount * 8 * (size_t)world;
    b.h_send = malloc(b.bytes);
    b.h_recv = malloc(b.bytes);
    b.dev_send = bmt_mem_alloc(ctx, b.bytes, &err);
    b.dev_recv = b.dev_send ? bmt_mem_alloc(ctx, b.bytes, &err) : NULL;
    if (!b.h_send || !b.h_recv || !b.dev_send || !b.dev_recv) {
        fprintf(stderr, "collcheck: rank %d: %s\n", bmt_rank(ctx),
                b.dev_recv ? "out of host memory" : err.text);
        return 1;
    }
    int salt = 0;
    bmt_comm_t *comms[3] = { bmt_comm_world(ctx), bmt_comm_group(ctx), bmt_comm_replica(ctx) };
    for (int c = 0; c < 3; c++)
        if (check_comm(comms[c], &b, counts, ncounts, &salt) < 0) {
            bmt_finalize(ctx);
            return 1;
        }
    bmt_rank_info_t me = bmt_self(ctx);
    printf("collcheck: rank %d (group %d rank %d, %s on %s): %ld checks passed on world(%d), "
           "group(%d), replica(%d)\n",
           me.rank, me.group, me.group_rank, bmt_backend(ctx),
           bmt_device(ctx) == BMT_DEVICE_CUDA ? "cuda" : "cpu", checks, bmt_comm_size(comms[0]),
           bmt_comm_size(comms[1]), bmt_comm_size(comms[2]));
    bmt_mem_free(ctx, b.dev_send);
    bmt_mem_free(ctx, b.dev_recv);
    free(b.h_send);
    free(b.h_recv);
    bmt_finalize(ctx);
    return 0;
}
