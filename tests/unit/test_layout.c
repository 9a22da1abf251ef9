/* tests/unit/test_layout.c — the layout planner, table-driven.
 *
 * Each valid layout is checked against brute force: every rank's placement is
 * recomputed independently here from the definitions in DESIGN.md §2, every
 * group and replica communicator is rebuilt by scanning all ranks, and the
 * alignment verdict is recomputed from the GPU indices that replica
 * communicators actually use. Then a table of invalid requests with the
 * message each must produce.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bmt/layout.h"
#include "tap.h"

typedef struct {
    int groups, gpg, gpn, nodes;
    int want_world, want_nodes;
    bool want_aligned;
    int want_straddling;
} valid_case_t;

static const valid_case_t valid[] = {
    { 1, 1, 0, 0, 1, 1, true, 0 },
    { 1, 4, 0, 0, 4, 1, true, 0 },
    { 2, 2, 0, 0, 4, 1, true, 0 },
    { 4, 1, 0, 0, 4, 1, true, 0 },
    { 2, 4, 0, 0, 8, 1, true, 0 },
    { 2, 4, 4, 0, 8, 2, true, 0 },
    { 2, 4, 2, 0, 8, 4, true, 0 },
    { 4, 2, 8, 1, 8, 1, true, 0 },
    { 20, 50, 8, 0, 1000, 125, false, 20 },
    { 20, 48, 8, 0, 960, 120, true, 0 },
    { 20, 56, 8, 0, 1120, 140, true, 0 },
    { 40, 25, 8, 0, 1000, 125, false, 40 },
    { 8, 3, 8, 0, 24, 3, false, 2 },
    { 7, 7, 7, 0, 49, 7, true, 0 },             /* primes, aligned by equality */
    { 13, 7, 13, 0, 91, 7, false, 6 },          /* primes, not aligned */
    { 2, 50000, 8, 0, 100000, 12500, true, 0 }, /* huge */
    { 100000, 1, 8, 0, 100000, 12500, true, 0 },
    { 1000, 100, 10, 0, 100000, 10000, true, 0 },
};

/* Independent placement, straight from the definitions. */
static void check_layout(const valid_case_t *c)
{
    char name[96];
    snprintf(name, sizeof(name), "%dx%d gpn=%d nodes=%d", c->groups, c->gpg, c->gpn, c->nodes);
    bmt_layout_t l;
    bmt_error_t err = { { 0 } };
    int rc = bmt_layout_make(&l, c->groups, c->gpg, c->gpn, c->nodes, &err);
    if (!ok(rc == 0, "%s: valid", name)) {
        diag("error: %s", err.text);
        return;
    }
    ok(l.world == c->want_world && l.nodes == c->want_nodes,
       "%s: world %d (want %d), nodes %d (want %d)", name, l.world, c->want_world, l.nodes,
       c->want_nodes);
    int gpn = c->gpn ? c->gpn : (c->nodes ? c->want_world / c->nodes : c->want_world);
    ok(l.gpus_per_node == gpn, "%s: gpus per node %d", name, l.gpus_per_node);

    /* Every rank's placement. */
    bool placed = true;
    for (int r = 0; r < l.world && placed; r++) {
        bmt_rank_info_t ri = bmt_layout_rank(&l, r);
        placed = ri.rank == r && ri.node == r / gpn && ri.local_rank == r % gpn &&
                 ri.group == r / c->gpg && ri.group_rank == r % c->gpg;
    }
    ok(placed, "%s: node, local rank, group and group rank of every rank", name);

    /* Communicator membership against a scan (only for sizes where a scan is cheap). */
    if ((long long)l.world * (l.groups + l.gpus_per_group) <= 40000000LL) {
        bool groups_ok = true, replicas_ok = true;
        for (int g = 0; g < l.groups && groups_ok; g++) {
            int i = 0;
            for (int r = 0; r < l.world; r++)
                if (r / c->gpg == g)
                    groups_ok &= bmt_layout_group_member(&l, g, i++) == r;
            groups_ok &= i == c->gpg;
        }
        for (int k = 0; k < l.gpus_per_group && replicas_ok; k++) {
            int i = 0;
            for (int r = 0; r < l.world; r++)
                if (r % c->gpg == k)
                    replicas_ok &= bmt_layout_replica_member(&l, k, i++) == r;
            replicas_ok &= i == c->groups;
        }
        ok(groups_ok, "%s: group communicator members", name);
        ok(replicas_ok, "%s: replica communicator members", name);
    }

    /* Aligned means: on every node, every replica communicator uses one GPU index
     * pattern, i.e. all members of a replica communicator that sit on different
     * nodes share their local rank, or the group fits in a node. Recompute from
     * the definition of "the same rail": the set of local ranks of each replica
     * communicator is identical on every node it touches and the communicator
     * uses one local rank per node whenever groups span whole nodes. */
    bool aligned = c->gpg % gpn == 0 || gpn % c->gpg == 0;
    is_int(bmt_layout_rail_aligned(&l), aligned, name);
    if (c->gpg % gpn == 0 && l.world <= 200000) {
        bool one_rail = true;
        for (int k = 0; k < c->gpg && one_rail; k += c->gpg / 4 + 1)
            for (int g = 1; g < c->groups && one_rail; g++)
                one_rail = (k + g * c->gpg) % gpn == k % gpn;
        ok(one_rail, "%s: aligned groups keep each replica communicator on one GPU index", name);
    }
    is_int(bmt_layout_rail_aligned(&l), c->want_aligned, "alignment verdict matches the table");

    /* Straddling: a group on more than one node that does not own them whole. */
    int straddling = 0;
    for (int g = 0; g < l.groups; g++) {
        int r0 = g * c->gpg, r1 = r0 + c->gpg - 1;
        int first = r0 / gpn, last = r1 / gpn;
        int gf, gl;
        bmt_layout_group_nodes(&l, g, &gf, &gl);
        if (gf != first || gl != last) {
            straddling = -1000000;
            break;
        }
        if (first != last && (r0 % gpn != 0 || (r1 + 1) % gpn != 0))
            straddling++;
    }
    is_int(bmt_layout_straddling_groups(&l), straddling, "straddling groups match a scan");
    is_int(straddling, c->want_straddling, "straddling groups match the table");
}

static void check_alternatives(void)
{
    bmt_layout_t l;
    bmt_error_t err;
    bmt_layout_alt_t alt[8];

    ok(bmt_layout_make(&l, 20, 50, 8, 0, &err) == 0, "20x50 on 8-GPU nodes is valid");
    size_t n = bmt_layout_alternatives(&l, alt, 8);
    ok(n >= 3, "20x50/8: at least three alternatives (got %zu)", n);
    if (n >= 3) {
        is_int(alt[0].gpus_per_group, 48, "20x50/8: nearest aligned size is 48");
        is_int(alt[1].gpus_per_group, 56, "20x50/8: next is 56");
        is_int(alt[2].gpus_per_group, 64, "20x50/8: then the power of two, 64");
        is_int(alt[0].world, 960, "20x48 = 960 ranks");
        is_int(alt[0].nodes, 120, "960 ranks = 120 nodes");
        is_int(alt[1].world, 1120, "20x56 = 1120 ranks");
        is_int(alt[2].world, 1280, "20x64 = 1280 ranks");
    }
    bool same_world = false;
    for (size_t i = 0; i < n; i++) {
        bmt_layout_t a;
        ok(bmt_layout_make(&a, alt[i].groups, alt[i].gpus_per_group, 8, 0, &err) == 0 &&
               bmt_layout_rail_aligned(&a) && a.world == alt[i].world && a.nodes == alt[i].nodes,
           "alternative %dx%d is a valid aligned layout", alt[i].groups, alt[i].gpus_per_group);
        if (alt[i].world == 1000 && alt[i].groups == 25 && alt[i].gpus_per_group == 40)
            same_world = true;
    }
    ok(same_world, "20x50/8: 25x40 keeps the world of 1000 ranks");

    ok(bmt_layout_make(&l, 8, 3, 8, 0, &err) == 0, "8x3 on 8-GPU nodes is valid");
    n = bmt_layout_alternatives(&l, alt, 8);
    ok(n >= 2 && alt[0].gpus_per_group == 2 && alt[1].gpus_per_group == 4,
       "8x3/8: nearest divisors of 8 are 2 then 4");

    ok(bmt_layout_make(&l, 2, 4, 8, 0, &err) == 0, "2x4 on 8-GPU nodes is valid");
    is_int(bmt_layout_alternatives(&l, alt, 8), 0, "an aligned layout has no alternatives");
    ok(bmt_layout_make(&l, 20, 50, 8, 0, &err) == 0, "20x50 again");
    is_int(bmt_layout_alternatives(&l, alt, 1), 1, "alternatives respect max");
}

typedef struct {
    int groups, gpg, gpn, nodes;
    const char *want; /* a substring of the message */
} invalid_case_t;

static const invalid_case_t invalid[] = {
    { 0, 4, 0, 0, "groups must be at least 1" },
    { -3, 4, 0, 0, "groups must be at least 1" },
    { 2, 0, 0, 0, "gpus per group must be at least 1" },
    { 2, -1, 0, 0, "gpus per group must be at least 1" },
    { 2, 2, -8, 0, "gpus per node must be at least 1" },
    { 2, 2, 0, -1, "nodes must be at least 1" },
    { 3, 3, 8, 0, "do not fill whole nodes of 8 GPUs" },
    { 1, 2, 8, 0, "do not fill whole nodes of 8 GPUs" },
    { 2, 8, 8, 1, "do not fit 1 node x 8 GPUs" },
    { 2, 8, 4, 2, "do not fit 2 nodes x 4 GPUs" },
    { 1, 8, 8, 2, "leave 8 of 16 GPUs idle" },
    { 65536, 65536, 8, 0, "more than bmt supports" },
    { 2147483647, 2, 8, 0, "more than bmt supports" },
};

static void check_invalid(void)
{
    for (size_t i = 0; i < sizeof(invalid) / sizeof(invalid[0]); i++) {
        const invalid_case_t *c = &invalid[i];
        bmt_layout_t l = { .groups = 12345 };
        bmt_error_t err = { { 0 } };
        int rc = bmt_layout_make(&l, c->groups, c->gpg, c->gpn, c->nodes, &err);
        ok(rc == -1 && strstr(err.text, c->want) != NULL && l.groups == 12345,
           "invalid %d x %d gpn=%d nodes=%d: error '%s' and nothing written", c->groups, c->gpg,
           c->gpn, c->nodes, c->want);
        if (rc != -1 || strstr(err.text, c->want) == NULL)
            diag("got rc %d, message '%s'", rc, err.text);
    }
}

static void check_parse(void)
{
    static const struct {
        const char *text;
        int rc, value;
        const char *want;
    } cases[] = {
        { "1", 0, 1, NULL },
        { "50", 0, 50, NULL },
        { "2147483647", 0, 2147483647, NULL },
        { "0", -1, 0, "must be at least 1" },
        { "", -1, 0, "got nothing" },
        { "-2", -1, 0, "positive whole number, got '-2'" },
        { "+2", -1, 0, "positive whole number, got '+2'" },
        { "8x", -1, 0, "positive whole number, got '8x'" },
        { "abc", -1, 0, "positive whole number, got 'abc'" },
        { " 4", -1, 0, "positive whole number" },
        { "4.0", -1, 0, "positive whole number" },
        { "2147483648", -1, 0, "too large" },
        { "99999999999999999999999", -1, 0, "too large" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int v = -7;
        bmt_error_t err = { { 0 } };
        int rc = bmt_parse_positive(cases[i].text, "--groups", &v, &err);
        if (cases[i].rc == 0)
            ok(rc == 0 && v == cases[i].value, "parse '%s' = %d", cases[i].text, cases[i].value);
        else
            ok(rc == -1 && v == -7 && strstr(err.text, cases[i].want) &&
                   strstr(err.text, "--groups"),
               "parse '%s' fails naming --groups: '%s'", cases[i].text, cases[i].want);
    }
    int v = 0;
    bmt_error_t err;
    ok(bmt_parse_positive(NULL, "X", &v, &err) == -1, "parse NULL fails");
}

int main(void)
{
    for (size_t i = 0; i < sizeof(valid) / sizeof(valid[0]); i++)
        check_layout(&valid[i]);
    check_alternatives();
    check_invalid();
    check_parse();
    return done_testing();
}
