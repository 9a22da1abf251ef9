/* tests/unit/test_costmodel.c — the communication model of `bmlaunch --plan --model`.
 *
 * Expected figures are written out as numbers computed by hand (the issue's 70B
 * case: 419.58 GB flat vs 411.6 + 5.32 GB two-level, 999 vs 49 and 38 ring steps),
 * not recomputed with the module's formulas. A property checked on many layouts
 * ties the schemes together independently: with one dtype for gathers and
 * gradients, two-level sends exactly (R-1)/W * P * bytes less than flat at ZeRO-3
 * and exactly as much at ZeRO-2. The busbw defaults' ranks-per-node figure is
 * checked against a scan of every rank; the GPT-2 presets against a sum over the
 * model's tensors; then the parsers' accepted and refused inputs, the JSON against
 * the struct, and the text's key lines.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel.h"
#include "tap.h"

static bool close_to(double got, double want)
{
    if (want == 0)
        return got == 0;
    return fabs(got - want) <= 1e-9 * fabs(want);
}

static int is_real(double got, double want, const char *what)
{
    int cond = close_to(got, want);
    ok(cond, "%s", what);
    if (!cond)
        diag("got %.17g, want %.17g", got, want);
    return cond;
}

static bmt_layout_t layout(int groups, int gpg, int gpn)
{
    bmt_layout_t l;
    bmt_error_t err = { { 0 } };
    if (bmt_layout_make(&l, groups, gpg, gpn, 0, &err) < 0) {
        diag("layout %dx%d/%d: %s", groups, gpg, gpn, err.text);
        abort();
    }
    return l;
}

/* ---------------------------------------------------------------- hand-computed cases */

typedef struct {
    const char *name;
    struct {
        int groups, gpg;
        double params;
        int gather_bytes, reduce_bytes, zero;
        double bw_group, bw_replica, bw_world, latency_us;
        int blocks;
        int shard_bytes; /* 0: as reduce_bytes */
    } in;
    struct {           /* expected, by hand */
        int rows;      /* collectives */
        double gather; /* bytes of one all-gather */
        double reduce; /* bytes of the reduce-scatter */
        int step;      /* ring steps per collective */
        double bytes;  /* total */
        long long steps;
        double s;
    } flat;
    struct {
        double gather, reduce; /* in the group */
        double allreduce;      /* over the replica */
        int step, ar_step;
        double bytes;
        long long steps;
        double s;
    } two;
} eval_case_t;

static const eval_case_t eval_cases[] = {
    /* The issue: 70B, bf16/bf16, ZeRO-3, 1000 GPUs in groups of 50.
     * flat: 3 x 0.999 x 140 GB = 419.58 GB; two-level: 3 x 0.98 x 140 GB = 411.6 GB
     * + 2 x 0.95 x 1.4e9 x 2 B = 5.32 GB. Times at 100 GB/s (50 across groups):
     * 4.1958 s flat; 4.116 + 0.1064 = 4.2224 s two-level. */
    { "issue 70B 20x50 zero 3",
      { 20, 50, 70e9, 2, 2, 3, 100, 50, 100, 0, 1, 0 },
      { 3, 139.86e9, 139.86e9, 999, 419.58e9, 2997, 4.1958 },
      { 137.2e9, 137.2e9, 5.32e9, 49, 38, 416.92e9, 185, 4.2224 } },
    /* ZeRO-2: one gather. flat 2 x 139.86 = 279.72 GB; two 274.4 + 5.32 = 279.72 GB. */
    { "70B 20x50 zero 2",
      { 20, 50, 70e9, 2, 2, 2, 100, 50, 100, 0, 1, 0 },
      { 2, 139.86e9, 139.86e9, 999, 279.72e9, 1998, 2.7972 },
      { 137.2e9, 137.2e9, 5.32e9, 49, 38, 279.72e9, 136, 2.744 + 0.1064 } },
    /* f32 gradients: reduce-scatter 0.999 x 280 = 279.72 GB flat, 0.98 x 280 = 274.4 GB
     * in the group, all-reduce 2 x 0.95 x 1.4e9 x 4 = 10.64 GB. */
    { "70B 20x50 zero 3 f32 grads",
      { 20, 50, 70e9, 2, 4, 3, 100, 50, 100, 0, 1, 0 },
      { 3, 139.86e9, 279.72e9, 999, 559.44e9, 2997, 5.5944 },
      { 137.2e9, 274.4e9, 10.64e9, 49, 38, 559.44e9, 185, 5.488 + 0.2128 } },
    /* Latency: 10 us per ring step, 80 calls per pass: flat adds 2997 x 80 x 10 us =
     * 2.3976 s, two-level 185 x 80 x 10 us = 0.148 s (all busbw 100 GB/s). */
    { "70B 20x50 latency 10 us x 80 blocks",
      { 20, 50, 70e9, 2, 2, 3, 100, 100, 100, 10, 80, 0 },
      { 3, 139.86e9, 139.86e9, 999, 419.58e9, 2997, 4.1958 + 2.3976 },
      { 137.2e9, 137.2e9, 5.32e9, 49, 38, 416.92e9, 185, 4.1692 + 0.148 } },
    /* One rank: nothing moves, no ring steps, no time even with latency. */
    { "1x1",
      { 1, 1, 1e9, 2, 2, 3, 100, 100, 100, 5, 10, 0 },
      { 3, 0, 0, 0, 0, 0, 0 },
      { 0, 0, 0, 0, 0, 0, 0, 0 } },
    /* One group of 8: two-level is flat (3 x 7/8 x 2 GB = 5.25 GB, 21 steps). */
    { "1x8 is flat",
      { 1, 8, 1e9, 2, 2, 3, 200, 10, 200, 1, 1, 0 },
      { 3, 1.75e9, 1.75e9, 7, 5.25e9, 21, 0.02625 + 21e-6 },
      { 1.75e9, 1.75e9, 0, 7, 0, 5.25e9, 21, 0.02625 + 21e-6 } },
    /* Eight groups of 1: no group traffic, only the all-reduce of the whole gradient,
     * 2 x 7/8 x 1e9 x 4 B = 7 GB in 14 steps; flat ZeRO-2 sends 7/8 x 2 GB + 7/8 x 4 GB. */
    { "8x1 is all cross-group",
      { 8, 1, 1e9, 2, 4, 2, 100, 50, 100, 0, 1, 0 },
      { 2, 1.75e9, 3.5e9, 7, 5.25e9, 14, 0.0525 },
      { 0, 0, 7e9, 0, 14, 7e9, 14, 0.14 } },
    /* bmt's engine: bf16 reduce-scatter, f32 shards all-reduced across groups:
     * 2 x 0.95 x 1.4e9 x 4 B = 10.64 GB; two-level 411.6 + 10.64 = 422.24 GB. */
    { "70B 20x50 f32 shards",
      { 20, 50, 70e9, 2, 2, 3, 100, 50, 100, 0, 1, 4 },
      { 3, 139.86e9, 139.86e9, 999, 419.58e9, 2997, 4.1958 },
      { 137.2e9, 137.2e9, 10.64e9, 49, 38, 422.24e9, 185, 4.116 + 0.2128 } },
    /* d48 on 2 x 4: flat 3 x 7/8 x 2 x 1,557,611,200 = 8,177,458,800 B;
     * group 3 x 3/4 x 3,115,222,400 = 7,009,250,400 B; all-reduce 2 x 1/2 x
     * 389,402,800 x 2 = 778,805,600 B; 7,788,056,000 B in all; at 1 GB/s, seconds = GB. */
    { "d48 2x4",
      { 2, 4, 1557611200.0, 2, 2, 3, 1, 1, 1, 0, 1, 0 },
      { 3, 2725819600.0, 2725819600.0, 7, 8177458800.0, 21, 8.1774588 },
      { 2336416800.0, 2336416800.0, 778805600.0, 3, 2, 7788056000.0, 11, 7.788056 } },
};

static void check_eval(const eval_case_t *c)
{
    bmt_layout_t l = layout(c->in.groups, c->in.gpg, 0);
    costmodel_in_t in = COSTMODEL_IN_INITIALIZER;
    in.params = c->in.params;
    in.gather_bytes = c->in.gather_bytes;
    in.reduce_bytes = c->in.reduce_bytes;
    in.shard_bytes = c->in.shard_bytes;
    in.zero_level = c->in.zero;
    in.busbw_group = c->in.bw_group;
    in.busbw_replica = c->in.bw_replica;
    in.busbw_world = c->in.bw_world;
    in.latency_us = c->in.latency_us;
    in.blocks = c->in.blocks;
    costmodel_out_t o;
    bmt_error_t err = { { 0 } };
    char what[160];
    if (!ok(costmodel_eval(&l, &in, &o, &err) == 0, "%s: evaluates", c->name)) {
        diag("%s", err.text);
        return;
    }
    const costmodel_scheme_t *f = &o.flat, *t = &o.two_level;
    snprintf(what, sizeof(what), "%s: flat has %d collectives", c->name, c->flat.rows);
    is_int(f->nrows, c->flat.rows, what);
    snprintf(what, sizeof(what), "%s: two-level has one more", c->name);
    is_int(t->nrows, c->flat.rows + 1, what);
    if (f->nrows != c->flat.rows || t->nrows != c->flat.rows + 1)
        return;
    bool flat_ok = true, two_ok = true;
    for (int i = 0; i < f->nrows; i++) {
        bool gather = i < f->nrows - 1;
        const costmodel_row_t *r = &f->rows[i], *s = &t->rows[i];
        flat_ok &= close_to(r->bytes, gather ? c->flat.gather : c->flat.reduce) &&
                   r->ring_steps == c->flat.step && r->ranks == c->in.groups * c->in.gpg &&
                   r->where == COSTMODEL_WORLD;
        two_ok &= close_to(s->bytes, gather ? c->two.gather : c->two.reduce) &&
                  s->ring_steps == c->two.step && s->ranks == c->in.gpg &&
                  s->where == COSTMODEL_GROUP;
        flat_ok &= strstr(r->op, gather ? "all-gather" : "reduce-scatter") != NULL;
    }
    ok(flat_ok, "%s: flat collectives send %.6g / %.6g B in %d steps", c->name, c->flat.gather,
       c->flat.reduce, c->flat.step);
    ok(two_ok, "%s: group collectives send %.6g / %.6g B in %d steps", c->name, c->two.gather,
       c->two.reduce, c->two.step);
    const costmodel_row_t *ar = &t->rows[t->nrows - 1];
    ok(close_to(ar->bytes, c->two.allreduce) && ar->ring_steps == c->two.ar_step &&
           ar->ranks == c->in.groups && ar->where == COSTMODEL_REPLICA &&
           strstr(ar->op, "all-reduce") != NULL,
       "%s: replica all-reduce sends %.6g B in %d steps", c->name, c->two.allreduce,
       c->two.ar_step);
    snprintf(what, sizeof(what), "%s: flat total %.6g B", c->name, c->flat.bytes);
    is_real(f->bytes, c->flat.bytes, what);
    snprintf(what, sizeof(what), "%s: two-level total %.6g B", c->name, c->two.bytes);
    is_real(t->bytes, c->two.bytes, what);
    snprintf(what, sizeof(what), "%s: ring steps %lld flat, %lld two-level", c->name, c->flat.steps,
             c->two.steps);
    ok(f->ring_steps == c->flat.steps && t->ring_steps == c->two.steps, "%s", what);
    snprintf(what, sizeof(what), "%s: flat %.6g s", c->name, c->flat.s);
    is_real(f->seconds, c->flat.s, what);
    snprintf(what, sizeof(what), "%s: two-level %.6g s", c->name, c->two.s);
    is_real(t->seconds, c->two.s, what);
    double want_ratio = c->two.bytes > 0 ? c->flat.bytes / c->two.bytes : 1;
    snprintf(what, sizeof(what), "%s: ratio of bytes %.6g", c->name, want_ratio);
    is_real(o.ratio_bytes, want_ratio, what);
    want_ratio = c->two.s > 0 ? c->flat.s / c->two.s : 1;
    snprintf(what, sizeof(what), "%s: ratio of times %.6g", c->name, want_ratio);
    is_real(o.ratio_seconds, want_ratio, what);
}

/* Every row's time is its bytes over its busbw plus its latency; rows sum to totals. */
static bool consistent(const costmodel_scheme_t *s, const costmodel_in_t *in)
{
    double bytes = 0, seconds = 0;
    long long steps = 0;
    for (int i = 0; i < s->nrows; i++) {
        const costmodel_row_t *r = &s->rows[i];
        double want =
            r->bytes / (r->busbw * 1e9) + in->blocks * r->ring_steps * in->latency_us * 1e-6;
        if (!close_to(r->seconds, want))
            return false;
        bytes += r->bytes;
        seconds += r->seconds;
        steps += r->ring_steps;
    }
    return close_to(s->bytes, bytes) && close_to(s->seconds, seconds) && s->ring_steps == steps;
}

static void check_identity(void)
{
    static const int sizes[][2] = { { 1, 1 },   { 2, 1 },    { 1, 2 },    { 2, 2 },  { 3, 5 },
                                    { 5, 3 },   { 20, 50 },  { 40, 25 },  { 7, 13 }, { 128, 8 },
                                    { 8, 128 }, { 1000, 1 }, { 1, 1000 }, { 64, 64 } };
    bool z3 = true, z2 = true, sums = true, busbw = true;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        int R = sizes[i][0], G = sizes[i][1], W = R * G;
        bmt_layout_t l = layout(R, G, 0);
        for (int b = 1; b <= 8; b *= 2)
            for (int zero = 2; zero <= 3; zero++) {
                costmodel_in_t in = COSTMODEL_IN_INITIALIZER;
                in.params = 123456789.0;
                in.gather_bytes = in.reduce_bytes = b;
                in.zero_level = zero;
                in.busbw_group = 170;
                in.busbw_replica = 35;
                in.busbw_world = 90;
                in.latency_us = 3;
                in.blocks = 7;
                costmodel_out_t o;
                if (costmodel_eval(&l, &in, &o, NULL) < 0) {
                    z2 = z3 = false;
                    continue;
                }
                double diff = o.flat.bytes - o.two_level.bytes;
                double want = zero == 3 ? (double)(R - 1) / W * in.params * b : 0;
                bool good = fabs(diff - want) <= 1e-9 * o.flat.bytes + 1e-6;
                if (zero == 3)
                    z3 &= good;
                else
                    z2 &= good;
                if (!good)
                    diag("%dx%d b=%d zero %d: flat - two-level = %.17g, want %.17g", R, G, b, zero,
                         diff, want);
                sums &= consistent(&o.flat, &in) && consistent(&o.two_level, &in);
                busbw &= o.flat.rows[0].busbw == 90 && o.two_level.rows[0].busbw == 170 &&
                         o.two_level.rows[o.two_level.nrows - 1].busbw == 35;
            }
    }
    ok(z3, "ZeRO-3, one dtype: two-level sends (R-1)/W * P * bytes less than flat");
    ok(z2, "ZeRO-2, one dtype: two-level sends as much as flat");
    ok(sums, "row time = bytes / busbw + blocks * steps * latency; rows sum to totals");
    ok(busbw, "each row uses its communicator's busbw");
}

/* ---------------------------------------------------------------- refused inputs */

static void check_eval_errors(void)
{
    static const struct {
        const char *field;
        double value;
        const char *want;
    } bad[] = {
        { "params", 0, "parameter count 0 is not in [1, 1e15]" },
        { "params", -5, "not in [1, 1e15]" },
        { "params", NAN, "not in [1, 1e15]" },
        { "params", INFINITY, "not in [1, 1e15]" },
        { "params", 2e15, "not in [1, 1e15]" },
        { "gather_bytes", 0, "0 bytes per gathered parameter" },
        { "gather_bytes", 16, "16 bytes per gathered parameter" },
        { "reduce_bytes", -4, "-4 bytes per reduced gradient" },
        { "shard_bytes", -1, "-1 bytes per gradient-shard element" },
        { "shard_bytes", 9, "9 bytes per gradient-shard element" },
        { "zero", 1, "ZeRO level must be 2 or 3, got 1" },
        { "zero", 4, "ZeRO level must be 2 or 3, got 4" },
        { "busbw_group", 0, "busbw of the group must be a positive GB/s, got 0" },
        { "busbw_replica", -1, "busbw of the replica must be a positive GB/s, got -1" },
        { "busbw_world", NAN, "busbw of the world must be a positive GB/s" },
        { "busbw_world", INFINITY, "busbw of the world must be a positive GB/s" },
        { "latency", -1, "latency must be >= 0 us, got -1" },
        { "latency", NAN, "latency must be >= 0 us" },
        { "blocks", 0, "blocks must be at least 1, got 0" },
        { "layout", 0, "inconsistent layout" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        bmt_layout_t l = layout(4, 2, 0);
        costmodel_in_t in = COSTMODEL_IN_INITIALIZER;
        in.params = 1e9;
        in.busbw_group = in.busbw_replica = in.busbw_world = 100;
        const char *f = bad[i].field;
        double v = bad[i].value;
        if (strcmp(f, "params") == 0)
            in.params = v;
        else if (strcmp(f, "gather_bytes") == 0)
            in.gather_bytes = (int)v;
        else if (strcmp(f, "shard_bytes") == 0)
            in.shard_bytes = (int)v;
        else if (strcmp(f, "reduce_bytes") == 0)
            in.reduce_bytes = (int)v;
        else if (strcmp(f, "zero") == 0)
            in.zero_level = (int)v;
        else if (strcmp(f, "busbw_group") == 0)
            in.busbw_group = v;
        else if (strcmp(f, "busbw_replica") == 0)
            in.busbw_replica = v;
        else if (strcmp(f, "busbw_world") == 0)
            in.busbw_world = v;
        else if (strcmp(f, "latency") == 0)
            in.latency_us = v;
        else if (strcmp(f, "blocks") == 0)
            in.blocks = (int)v;
        else
            l.world = 9; /* not 4 x 2 */
        costmodel_out_t o = { .ratio_bytes = 42 };
        bmt_error_t err = { { 0 } };
        int rc = costmodel_eval(&l, &in, &o, &err);
        ok(rc == -1 && strstr(err.text, bad[i].want) && o.ratio_bytes == 42 && o.flat.nrows == 0,
           "refused: %s = %g: '%s', output untouched", f, v, bad[i].want);
        if (rc != -1 || !strstr(err.text, bad[i].want))
            diag("got rc %d, '%s'", rc, err.text);
    }
    bmt_layout_t l = layout(1, 1, 0);
    costmodel_in_t in = COSTMODEL_IN_INITIALIZER;
    costmodel_out_t o;
    ok(costmodel_eval(&l, &in, &o, NULL) == -1, "a NULL error pointer is allowed");
}

/* ---------------------------------------------------------------- default busbw */

/* Fewest ranks of one communicator on a node, by enumerating every communicator's
 * members from the definitions (DESIGN §2) and counting them per node. */
static int scan_ranks_per_node(const bmt_layout_t *l, costmodel_comm_t which)
{
    int ncomms = which == COSTMODEL_GROUP     ? l->groups
                 : which == COSTMODEL_REPLICA ? l->gpus_per_group
                                              : 1;
    int size = which == COSTMODEL_GROUP     ? l->gpus_per_group
               : which == COSTMODEL_REPLICA ? l->groups
                                            : l->world;
    int *count = calloc((size_t)l->nodes, sizeof(int));
    int least = 0;
    for (int c = 0; c < ncomms; c++) {
        memset(count, 0, (size_t)l->nodes * sizeof(int));
        for (int m = 0; m < size; m++) {
            int rank = which == COSTMODEL_GROUP     ? c * l->gpus_per_group + m
                       : which == COSTMODEL_REPLICA ? m * l->gpus_per_group + c
                                                    : m;
            count[rank / l->gpus_per_node]++;
        }
        int used = 0, fewest = 0;
        for (int n = 0; n < l->nodes; n++)
            if (count[n] > 0) {
                used++;
                if (fewest == 0 || count[n] < fewest)
                    fewest = count[n];
            }
        if (used > 1 && (least == 0 || fewest < least))
            least = fewest;
    }
    free(count);
    return least;
}

static void check_default_busbw(void)
{
    static const struct {
        int groups, gpg, gpn;
        int want_group, want_replica, want_world; /* ranks per node, 0: on one node */
    } cases[] = {
        { 20, 50, 8, 2, 1, 8 }, /* the issue's layout: a group ends with 2 ranks on a node */
        { 20, 48, 8, 8, 1, 8 }, /* aligned: groups own whole nodes */
        { 40, 25, 8, 1, 1, 8 }, /* 25 = 3 x 8 + 1 */
        { 4, 2, 8, 0, 0, 0 },   /* one node */
        { 4, 4, 8, 0, 2, 8 },   /* groups inside nodes; replicas 2 per node */
        { 8, 2, 4, 0, 2, 4 },
        { 8, 3, 8, 1, 2, 8 },  /* a group of 3 crosses with 1 rank; replicas 2 or 3 a node */
        { 1, 16, 8, 8, 0, 8 }, /* one group on two nodes: the replica is one rank */
        { 16, 1, 8, 0, 8, 8 }, /* groups of one: the replica spans every node */
        { 13, 7, 13, 1, 1, 13 },
        { 100, 10, 10, 0, 1, 10 },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        bmt_layout_t l = layout(cases[i].groups, cases[i].gpg, cases[i].gpn);
        int want[3] = { cases[i].want_group, cases[i].want_replica, cases[i].want_world };
        for (int c = COSTMODEL_GROUP; c <= COSTMODEL_WORLD; c++) {
            int got = costmodel_ranks_per_node(&l, (costmodel_comm_t)c);
            int scan = scan_ranks_per_node(&l, (costmodel_comm_t)c);
            ok(got == want[c] && scan == want[c],
               "%dx%d on %d-GPU nodes: %s communicators have down to %d ranks on a node",
               cases[i].groups, cases[i].gpg, cases[i].gpn, costmodel_comm_name(c), want[c]);
            if (got != want[c] || scan != want[c])
                diag("module %d, scan %d", got, scan);
        }
    }
    /* Against the scan on every small layout. */
    bool all = true;
    for (int gpn = 1; gpn <= 8 && all; gpn++)
        for (int g = 1; g <= 12; g++)
            for (int s = 1; s <= 12; s++) {
                bmt_layout_t l;
                if (g * s % gpn != 0 || bmt_layout_make(&l, g, s, gpn, 0, NULL) < 0)
                    continue;
                for (int c = COSTMODEL_GROUP; c <= COSTMODEL_WORLD; c++)
                    if (costmodel_ranks_per_node(&l, (costmodel_comm_t)c) !=
                        scan_ranks_per_node(&l, (costmodel_comm_t)c)) {
                        diag("%dx%d/%d %s differs", g, s, gpn, costmodel_comm_name(c));
                        all = false;
                    }
            }
    ok(all, "ranks per node match the scan on every layout up to 12 x 12 on 1..8-GPU nodes");

    bmt_layout_t l = layout(20, 50, 8);
    costmodel_in_t in = COSTMODEL_IN_INITIALIZER;
    costmodel_default_busbw(&l, 230, 45, &in);
    ok(in.busbw_group == 90 && in.busbw_replica == 45 && in.busbw_world == 230 &&
           in.defaulted ==
               (COSTMODEL_DEFAULT_GROUP | COSTMODEL_DEFAULT_REPLICA | COSTMODEL_DEFAULT_WORLD),
       "20x50/8 defaults: group 2 x 45 = 90, replica 45, world min(8 x 45, 230) = 230 GB/s");
    in = (costmodel_in_t)COSTMODEL_IN_INITIALIZER;
    in.busbw_replica = 12.5;
    l = layout(2, 4, 8);
    costmodel_default_busbw(&l, COSTMODEL_NVLINK_GBPS, COSTMODEL_NIC_GBPS, &in);
    ok(in.busbw_group == COSTMODEL_NVLINK_GBPS && in.busbw_replica == 12.5 &&
           in.busbw_world == COSTMODEL_NVLINK_GBPS &&
           in.defaulted == (COSTMODEL_DEFAULT_GROUP | COSTMODEL_DEFAULT_WORLD),
       "one node: NVLink figures; a given figure is kept and not marked as defaulted");
}

/* ---------------------------------------------------------------- presets */

/* GPT-2 parameters summed tensor by tensor (HF names), tied embeddings. */
static double gpt2_tensors(double L, double C, double V, double T)
{
    double wte = V * C, wpe = T * C, lnf = 2 * C;
    double ln1 = 2 * C, attn = C * 3 * C + 3 * C, proj = C * C + C, ln2 = 2 * C;
    double fc = C * 4 * C + 4 * C, fcproj = 4 * C * C + C;
    return wte + wpe + L * (ln1 + attn + proj + ln2 + fc + fcproj) + lnf;
}

static void check_presets(void)
{
    static const struct {
        const char *name, *alias;
        int L, C;
        double params; /* as given in the brief */
    } want[] = {
        { "d12", "gpt2", 12, 768, 124439808.0 },
        { "d24", "gpt2-medium", 24, 1024, 354823168.0 },
        { "d36", "gpt2-large", 36, 1280, 774030080.0 },
        { "d48", "gpt2-xl", 48, 1600, 1557611200.0 },
    };
    int n = 0;
    for (const costmodel_preset_t *p = costmodel_presets(); p->name; p++)
        n++;
    is_int(n, 4, "four presets");
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const costmodel_preset_t *p = costmodel_preset(want[i].name);
        if (!ok(p != NULL, "preset %s exists", want[i].name))
            continue;
        double t = gpt2_tensors(want[i].L, want[i].C, 50257, 1024);
        ok(p->layers == want[i].L && p->channels == want[i].C && p->vocab == 50257 &&
               p->context == 1024,
           "%s: %d layers, %d channels, vocabulary 50257, context 1024", want[i].name, want[i].L,
           want[i].C);
        ok(p->params == t && t == want[i].params, "%s: %.0f parameters, tensor by tensor",
           want[i].name, want[i].params);
        ok(costmodel_preset(want[i].alias) == p, "%s is %s", want[i].alias, want[i].name);
    }
    ok(costmodel_preset("D48") == costmodel_preset("d48") && costmodel_preset("GPT2-XL"),
       "preset names are case-insensitive");
    ok(costmodel_preset("d60") == NULL && costmodel_preset("") == NULL &&
           costmodel_preset(NULL) == NULL,
       "unknown presets are NULL");
}

/* ---------------------------------------------------------------- parsers */

static void check_parse_params(void)
{
    static const struct {
        const char *text;
        double value; /* 0: refused with want */
        const char *want;
    } cases[] = {
        { "d48", 1557611200.0, NULL },
        { "D12", 124439808.0, NULL },
        { "gpt2-medium", 354823168.0, NULL },
        { "1558000000", 1558000000.0, NULL },
        { "1.5e9", 1.5e9, NULL },
        { "1.5E+9", 1.5e9, NULL },
        { "70B", 70e9, NULL },
        { "70b", 70e9, NULL },
        { "7b", 7e9, NULL },
        { "1.5G", 1.5e9, NULL },
        { "350M", 350e6, NULL },
        { "350m", 350e6, NULL },
        { "125k", 125e3, NULL },
        { "1T", 1e12, NULL },
        { "1000T", 1e15, NULL },
        { "1", 1, NULL },
        { ".5k", 500, NULL },
        { "1.4", 1, NULL },
        { "2.5", 3, NULL },
        { "", 0, "--model needs a parameter count (1.5e9, 350M, 70B) or a preset" },
        { "-5", 0, "--model needs a positive parameter count, got '-5'" },
        { "-70B", 0, "--model needs a positive parameter count, got '-70B'" },
        { "0", 0, "--model needs at least 1 parameter, got '0'" },
        { "0B", 0, "--model needs at least 1 parameter, got '0B'" },
        { "0.4", 0, "--model needs at least 1 parameter, got '0.4'" },
        { "1e-999", 0, "--model needs at least 1 parameter" },
        { "1001T", 0, "--model: '1001T' is too many parameters (at most 1e15)" },
        { "2e15", 0, "too many parameters" },
        { "1e999", 0, "too many parameters" },
        { "nan", 0, "--model: 'nan' is neither a parameter count" },
        { "NaN", 0, "is neither a parameter count" },
        { "inf", 0, "is neither a parameter count" },
        { "70BB", 0, "--model: '70BB' is neither a parameter count" },
        { "70B ", 0, "is neither a parameter count" },
        { " 70B", 0, "is neither a parameter count" },
        { "+7", 0, "is neither a parameter count" },
        { "0x10", 0, "is neither a parameter count" },
        { "7x", 0, "is neither a parameter count" },
        { "1e", 0, "is neither a parameter count" },
        { "1e9M", 1e15, NULL }, /* exponent and suffix together: 1e9 x 1e6 */
        { "1.2.3", 0, "is neither a parameter count" },
        { "B", 0, "is neither a parameter count" },
        { ".", 0, "is neither a parameter count" },
        { "d48x", 0, "is neither a parameter count" },
        { "gpt3", 0, "nor a preset (d12, d24, d36, d48)" },
        { "1000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
          0, "too long a number" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        double v = -7;
        bmt_error_t err = { { 0 } };
        int rc = costmodel_parse_params(cases[i].text, "--model", &v, &err);
        if (cases[i].want == NULL) {
            ok(rc == 0 && v == cases[i].value, "--model '%s' = %.17g", cases[i].text,
               cases[i].value);
            if (rc != 0 || v != cases[i].value)
                diag("rc %d, value %.17g, '%s'", rc, v, err.text);
        } else {
            ok(rc == -1 && v == -7 && strstr(err.text, cases[i].want),
               "--model '%.20s' refused: '%s'", cases[i].text, cases[i].want);
            if (rc != -1 || !strstr(err.text, cases[i].want))
                diag("rc %d, value %.17g, '%s'", rc, v, err.text);
        }
    }
    double v = 0;
    bmt_error_t err;
    ok(costmodel_parse_params(NULL, "--model", &v, &err) == -1 && strstr(err.text, "got nothing"),
       "--model NULL refused");
}

static void check_parse_other(void)
{
    static const struct {
        int kind; /* 0 gbps, 1 us, 2 zero, 3 dtype */
        const char *text;
        double value;
        const char *want; /* NULL: accepted */
    } cases[] = {
        { 0, "230", 230, NULL },
        { 0, "45.5", 45.5, NULL },
        { 0, "1e3", 1000, NULL },
        { 0, "0.001", 0.001, NULL },
        { 0, "100000", 1e5, NULL },
        { 0, "0", 0, "--x needs a positive number of GB/s, got '0'" },
        { 0, "", 0, "--x needs a positive number of GB/s, got ''" },
        { 0, "-5", 0, "--x needs a positive number of GB/s, got '-5'" },
        { 0, "45GB", 0, "needs a positive number of GB/s" },
        { 0, "nan", 0, "needs a positive number of GB/s" },
        { 0, "inf", 0, "needs a positive number of GB/s" },
        { 0, "1e6", 0, "--x: '1e6' is too large (at most 100000 GB/s)" },
        { 1, "0", 0, NULL },
        { 1, "5", 5, NULL },
        { 1, "2.5", 2.5, NULL },
        { 1, "1000000", 1e6, NULL },
        { 1, "-1", 0, "--x needs a non-negative number of microseconds, got '-1'" },
        { 1, "1e7", 0, "too large (at most 1e+06 microseconds)" },
        { 1, "5us", 0, "needs a non-negative number of microseconds" },
        { 2, "2", 2, NULL },
        { 2, "3", 3, NULL },
        { 2, "1", 0, "--x must be 2 or 3, got '1'" },
        { 2, "03", 0, "must be 2 or 3, got '03'" },
        { 2, "", 0, "must be 2 or 3, got ''" },
        { 3, "bf16", 2, NULL },
        { 3, "BF16", 2, NULL },
        { 3, "fp16", 2, NULL },
        { 3, "f32", 4, NULL },
        { 3, "fp32", 4, NULL },
        { 3, "f64", 0, "--x must be bf16, fp16 or f32, got 'f64'" },
        { 3, "", 0, "must be bf16, fp16 or f32, got ''" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        double d = -7;
        int n = -7;
        bmt_error_t err = { { 0 } };
        int rc;
        switch (cases[i].kind) {
        case 0: rc = costmodel_parse_gbps(cases[i].text, "--x", &d, &err); break;
        case 1: rc = costmodel_parse_us(cases[i].text, "--x", &d, &err); break;
        case 2: rc = costmodel_parse_zero(cases[i].text, "--x", &n, &err); break;
        default: rc = costmodel_parse_dtype(cases[i].text, "--x", &n, &err); break;
        }
        double got = cases[i].kind < 2 ? d : n;
        static const char *kinds[] = { "GB/s", "us", "zero", "dtype" };
        if (cases[i].want == NULL)
            ok(rc == 0 && got == cases[i].value, "%s '%s' = %g", kinds[cases[i].kind],
               cases[i].text, cases[i].value);
        else
            ok(rc == -1 && got == -7 && strstr(err.text, cases[i].want), "%s '%s' refused: '%s'",
               kinds[cases[i].kind], cases[i].text, cases[i].want);
        if ((rc == 0) != (cases[i].want == NULL) ||
            (cases[i].want && !strstr(err.text, cases[i].want)))
            diag("rc %d, '%s'", rc, err.text);
    }
    double d = -7;
    int n = -7;
    ok(costmodel_parse_gbps(NULL, "--x", &d, NULL) == -1 &&
           costmodel_parse_us(NULL, "--x", &d, NULL) == -1 &&
           costmodel_parse_zero(NULL, "--x", &n, NULL) == -1 &&
           costmodel_parse_dtype(NULL, "--x", &n, NULL) == -1 && d == -7 && n == -7,
       "NULL text refused by every parser");
}

/* ---------------------------------------------------------------- JSON and text */

static costmodel_out_t issue_case(bmt_layout_t *l, costmodel_in_t *in)
{
    *l = layout(20, 50, 8);
    *in = (costmodel_in_t)COSTMODEL_IN_INITIALIZER;
    in->params = 70e9;
    in->model = "70B";
    in->busbw_world = 150;
    costmodel_default_busbw(l, 230, 45, in);
    in->latency_us = 5;
    in->blocks = 80;
    costmodel_out_t o;
    if (costmodel_eval(l, in, &o, NULL) < 0)
        abort();
    return o;
}

static bool json_real_is(json_t *obj, const char *key, double want)
{
    json_t *v = json_object_get(obj, key);
    return v && json_is_number(v) && json_number_value(v) == want;
}

static bool scheme_json_ok(json_t *s, const costmodel_scheme_t *c)
{
    json_t *rows = json_object_get(s, "collectives");
    if (!json_real_is(s, "bytes_per_gpu", c->bytes) || !json_real_is(s, "seconds", c->seconds) ||
        !json_real_is(s, "ring_steps", (double)c->ring_steps) || !json_is_array(rows) ||
        json_array_size(rows) != (size_t)c->nrows)
        return false;
    for (int i = 0; i < c->nrows; i++) {
        json_t *r = json_array_get(rows, (size_t)i);
        const costmodel_row_t *w = &c->rows[i];
        if (!json_real_is(r, "bytes_per_gpu", w->bytes) ||
            !json_real_is(r, "seconds", w->seconds) || !json_real_is(r, "busbw_gbps", w->busbw) ||
            !json_real_is(r, "ranks", w->ranks) || !json_real_is(r, "ring_steps", w->ring_steps) ||
            strcmp(json_string_value(json_object_get(r, "op")), w->op) != 0 ||
            strcmp(json_string_value(json_object_get(r, "where")), costmodel_comm_name(w->where)))
            return false;
    }
    return true;
}

static void check_json(void)
{
    bmt_layout_t l;
    costmodel_in_t in;
    costmodel_out_t o = issue_case(&l, &in);
    json_t *j = costmodel_json(&l, &in, &o);
    if (!ok(j != NULL, "JSON object built"))
        return;
    /* Through text and back: what a tool reading --plan --json sees. */
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    json_error_t jerr;
    j = text ? json_loads(text, 0, &jerr) : NULL;
    free(text);
    if (!ok(j != NULL, "JSON dumps and loads back"))
        return;
    ok(strcmp(json_string_value(json_object_get(j, "model")), "70B") == 0 &&
           json_integer_value(json_object_get(j, "params")) == 70000000000LL &&
           json_real_is(j, "zero_level", 3) && json_real_is(j, "gather_bytes", 2) &&
           json_real_is(j, "reduce_bytes", 2) && json_real_is(j, "shard_bytes", 2) &&
           json_real_is(j, "latency_us", 5) && json_real_is(j, "blocks", 80),
       "JSON: model, params, zero level, dtypes, latency, blocks");
    json_t *bw = json_object_get(j, "busbw_gbps"), *def = json_object_get(j, "busbw_default");
    ok(json_real_is(bw, "group", 90) && json_real_is(bw, "replica", 45) &&
           json_real_is(bw, "world", 150) && json_is_true(json_object_get(def, "group")) &&
           json_is_true(json_object_get(def, "replica")) &&
           json_is_false(json_object_get(def, "world")),
       "JSON: busbw figures and which were defaulted");
    ok(scheme_json_ok(json_object_get(j, "flat"), &o.flat), "JSON: flat scheme = struct");
    ok(scheme_json_ok(json_object_get(j, "two_level"), &o.two_level),
       "JSON: two-level scheme = struct");
    json_t *r = json_object_get(j, "flat_over_two_level");
    ok(json_real_is(r, "bytes", o.ratio_bytes) &&
           json_real_is(r, "ring_steps", o.ratio_ring_steps) &&
           json_real_is(r, "seconds", o.ratio_seconds),
       "JSON: ratios = struct");
    ok(json_real_is(json_object_get(j, "flat"), "bytes_per_gpu", 419.58e9) &&
           json_real_is(json_object_get(j, "two_level"), "ring_steps", 185),
       "JSON: the issue's 419.58 GB and 185 ring steps");
    json_decref(j);

    in.model = NULL;
    j = costmodel_json(&l, &in, &o);
    ok(j && json_is_null(json_object_get(j, "model")), "JSON: no name gives model null");
    json_decref(j);
}

static void check_text(void)
{
    bmt_layout_t l;
    costmodel_in_t in;
    costmodel_out_t o = issue_case(&l, &in);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    int rc = costmodel_print_text(f, &l, &in, &o);
    fclose(f);
    ok(rc == 0, "text printed");
    static const char *want[] = {
        "model 70B = 70,000,000,000 parameters; GB = 1e9 bytes",
        "scheme     collective               where      ranks ring steps    GB sent     est. ms",
        "flat       all-gather params (fwd)  world       1000        999    139.860    1332.000",
        "flat       reduce-scatter grads     world       1000        999    139.860    1332.000",
        "two-level  all-gather params (bwd)  group         50         49    137.200",
        "two-level  all-reduce grad shard    replica       20         38      5.320",
        "flat       total                                           2997    419.580    3996.000",
        "two-level  total                                            185    416.920",
        "flat / two-level: 1.006x the bytes, 16.2x the ring steps",
        "assumptions: ZeRO-3, params gathered in forward and again in backward\n",
        "    dtypes: bf16 gathers, bf16 gradients\n",
        "busbw group       90.0 GB/s  default: crosses nodes with as few as 2 ranks on one (2 "
        "NICs)",
        "busbw replica     45.0 GB/s  default: crosses nodes with as few as 1 rank on one (1 NIC)",
        "busbw world      150.0 GB/s  given",
        "time = GB sent / busbw + ring steps x 5 us x 80 calls a pass; no overlap\n",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        ok(buf && strstr(buf, want[i]), "text has '%.*s'", (int)strcspn(want[i], "\n"), want[i]);
    }
    int lines = 0;
    for (char *p = buf; p && *p; p++)
        lines += *p == '\n';
    ok(lines <= 20, "text is %d lines (at most 20)", lines);
    /* Times: flat all-gather 139.86 GB / 150 GB/s + 999 x 80 x 5 us = 1332 ms; group
     * all-gather 137.2 / 90 + 49 x 80 x 5 us = 1544.044 ms; all-reduce 5.32 / 45 +
     * 38 x 80 x 5 us = 133.422 ms; two-level 3 x 1544.044 + 133.422 = 4765.556 ms. */
    ok(buf && strstr(buf, "1544.044") && strstr(buf, "133.422") && strstr(buf, "4765.556") &&
           strstr(buf, "0.839x the time"),
       "text shows the hand-computed times (ms) and their ratio 3996 / 4765.556");
    for (char *line = buf; tap_failed && line && *line;) {
        size_t n = strcspn(line, "\n");
        diag("%.*s", (int)n, line);
        line += n + (line[n] != '\0');
    }
    free(buf);

    /* ZeRO-2, f32 gradients, one node, in defaults. */
    l = layout(2, 4, 0);
    in = (costmodel_in_t)COSTMODEL_IN_INITIALIZER;
    in.params = 124439808;
    in.zero_level = 2;
    in.reduce_bytes = 4;
    in.shard_bytes = 4;
    costmodel_default_busbw(&l, 230, 45, &in);
    ok(costmodel_eval(&l, &in, &o, NULL) == 0, "d12 on 2x4 evaluates");
    buf = NULL;
    f = open_memstream(&buf, &len);
    costmodel_print_text(f, &l, &in, &o);
    fclose(f);
    ok(buf && strstr(buf, "model 124,439,808 parameters") &&
           strstr(buf, "ZeRO-2, params gathered once a step, kept through backward\n") &&
           strstr(buf, "dtypes: bf16 gathers, f32 gradients\n") &&
           strstr(buf, "time = GB sent / busbw (ring-step latency not counted); no overlap\n") &&
           strstr(buf, "busbw group      230.0 GB/s  default: on one node (NVLink)") &&
           strstr(buf, "flat       all-gather params        world") && !strstr(buf, "(fwd)") &&
           !strstr(buf, "shards across groups"),
       "text for ZeRO-2, f32 gradients and one node");
    free(buf);

    /* bf16 reduce-scatter, f32 shards: the assumptions say so. */
    in.reduce_bytes = 2;
    ok(costmodel_eval(&l, &in, &o, NULL) == 0, "d12 with f32 shards evaluates");
    buf = NULL;
    f = open_memstream(&buf, &len);
    costmodel_print_text(f, &l, &in, &o);
    fclose(f);
    ok(buf && strstr(buf, "bf16 gathers, bf16 gradients, f32 gradient shards across groups\n"),
       "text names the shards' dtype when it differs from the gradients'");
    free(buf);
}

int main(void)
{
    for (size_t i = 0; i < sizeof(eval_cases) / sizeof(eval_cases[0]); i++)
        check_eval(&eval_cases[i]);
    check_identity();
    check_eval_errors();
    check_default_busbw();
    check_presets();
    check_parse_params();
    check_parse_other();
    check_json();
    check_text();
    return done_testing();
}
