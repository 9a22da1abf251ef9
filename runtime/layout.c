/* runtime/layout.c — the two-level layout, pure arithmetic.
 *
 * No I/O, no allocation: a layout is five ints and every query is O(1), so the
 * planner can describe 100k ranks and the runtime can ask about any peer without
 * tables. All products of layout numbers fit an int because the world is capped
 * at BMT_LAYOUT_MAX_WORLD (checked before anything multiplies).
 */
#include "bmt/layout.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

int bmt_parse_positive(const char *text, const char *what, int *out, bmt_error_t *err)
{
    if (text == NULL || *text == '\0')
        return errprintf(err, "%s needs a positive whole number, got nothing", what);
    for (const char *p = text; *p; p++)
        if (*p < '0' || *p > '9')
            return errprintf(err, "%s needs a positive whole number, got '%.900s'", what, text);
    errno = 0;
    char *end = NULL;
    long v = strtol(text, &end, 10);
    if (errno == ERANGE || v > INT_MAX)
        return errprintf(err, "%s: '%.900s' is too large (at most %d)", what, text, INT_MAX);
    if (v < 1)
        return errprintf(err, "%s must be at least 1, got '%.900s'", what, text);
    *out = (int)v;
    return 0;
}

int bmt_layout_make(bmt_layout_t *out, int groups, int gpus_per_group, int gpus_per_node, int nodes,
                    bmt_error_t *err)
{
    if (groups < 1)
        return errprintf(err, "groups must be at least 1, got %d", groups);
    if (gpus_per_group < 1)
        return errprintf(err, "gpus per group must be at least 1, got %d", gpus_per_group);
    if (gpus_per_node < 0)
        return errprintf(err, "gpus per node must be at least 1, got %d", gpus_per_node);
    if (nodes < 0)
        return errprintf(err, "nodes must be at least 1, got %d", nodes);
    if ((long long)groups * gpus_per_group > BMT_LAYOUT_MAX_WORLD)
        return errprintf(err, "%d groups x %d ranks = %lld ranks is more than bmt supports (%d)",
                         groups, gpus_per_group, (long long)groups * gpus_per_group,
                         BMT_LAYOUT_MAX_WORLD);
    int world = groups * gpus_per_group;
    if (gpus_per_node == 0)
        gpus_per_node = nodes > 0 ? (world + nodes - 1) / nodes : world;
    if (gpus_per_node > BMT_LAYOUT_MAX_WORLD)
        return errprintf(err, "gpus per node %d is more than bmt supports (%d)", gpus_per_node,
                         BMT_LAYOUT_MAX_WORLD);
    if (nodes > 0) {
        long long slots = (long long)nodes * gpus_per_node;
        if (world > slots)
            return errprintf(err,
                             "%d ranks (%d x %d) do not fit %d node%s x %d GPUs = %lld slots; "
                             "ask for fewer ranks or more nodes",
                             world, groups, gpus_per_group, nodes, nodes == 1 ? "" : "s",
                             gpus_per_node, slots);
        if (world < slots)
            return errprintf(err,
                             "%d ranks (%d x %d) leave %lld of %lld GPUs idle on %d node%s; "
                             "make the world %lld or ask for fewer nodes",
                             world, groups, gpus_per_group, slots - world, slots, nodes,
                             nodes == 1 ? "" : "s", slots);
    }
    if (world % gpus_per_node != 0)
        return errprintf(err,
                         "%d ranks (%d x %d) do not fill whole nodes of %d GPUs; "
                         "make the world a multiple of %d or change --gpus-per-node",
                         world, groups, gpus_per_group, gpus_per_node, gpus_per_node);
    out->groups = groups;
    out->gpus_per_group = gpus_per_group;
    out->gpus_per_node = gpus_per_node;
    out->world = world;
    out->nodes = world / gpus_per_node;
    return 0;
}

bmt_rank_info_t bmt_layout_rank(const bmt_layout_t *l, int rank)
{
    bmt_rank_info_t r = {
        .rank = rank,
        .node = rank / l->gpus_per_node,
        .local_rank = rank % l->gpus_per_node,
        .group = rank / l->gpus_per_group,
        .group_rank = rank % l->gpus_per_group,
    };
    return r;
}

int bmt_layout_group_member(const bmt_layout_t *l, int group, int i)
{
    return group * l->gpus_per_group + i;
}

int bmt_layout_replica_member(const bmt_layout_t *l, int group_rank, int g)
{
    return g * l->gpus_per_group + group_rank;
}

static bool aligned_size(int size, int per_node)
{
    return size % per_node == 0 || per_node % size == 0;
}

bool bmt_layout_rail_aligned(const bmt_layout_t *l)
{
    return aligned_size(l->gpus_per_group, l->gpus_per_node);
}

void bmt_layout_group_nodes(const bmt_layout_t *l, int group, int *first, int *last)
{
    int r0 = group * l->gpus_per_group;
    *first = r0 / l->gpus_per_node;
    *last = (r0 + l->gpus_per_group - 1) / l->gpus_per_node;
}

bool bmt_layout_group_straddles(const bmt_layout_t *l, int group)
{
    int first, last;
    bmt_layout_group_nodes(l, group, &first, &last);
    if (first == last)
        return false;
    int r0 = group * l->gpus_per_group;
    int r1 = r0 + l->gpus_per_group; /* one past the end */
    return r0 % l->gpus_per_node != 0 || r1 % l->gpus_per_node != 0;
}

int bmt_layout_straddling_groups(const bmt_layout_t *l)
{
    /* Group boundaries repeat with period lcm(gpg, gpn) ranks; counting directly
     * is O(groups), fine even for 2^22 ranks, and obviously right. */
    int n = 0;
    for (int g = 0; g < l->groups; g++)
        n += bmt_layout_group_straddles(l, g);
    return n;
}

/* Order by distance from the requested size, smaller size first on ties.
 * Insertion sort: at most a handful of entries, and no global for a comparator. */
static void alt_sort(bmt_layout_alt_t *v, size_t n, int size)
{
    for (size_t i = 1; i < n; i++) {
        bmt_layout_alt_t x = v[i];
        int dx = abs(x.gpus_per_group - size);
        size_t j = i;
        while (j > 0) {
            int dy = abs(v[j - 1].gpus_per_group - size);
            if (dy < dx || (dy == dx && v[j - 1].gpus_per_group <= x.gpus_per_group))
                break;
            v[j] = v[j - 1];
            j--;
        }
        v[j] = x;
    }
}

static bool alt_seen(const bmt_layout_alt_t *v, size_t n, int groups, int size)
{
    for (size_t i = 0; i < n; i++)
        if (v[i].groups == groups && v[i].gpus_per_group == size)
            return true;
    return false;
}

static void alt_push(bmt_layout_alt_t *v, size_t *n, size_t cap, const bmt_layout_t *l, int groups,
                     int size, const char *why)
{
    if (size < 1 || groups < 1 || *n >= cap)
        return;
    if ((long long)groups * size > BMT_LAYOUT_MAX_WORLD)
        return;
    int world = groups * size;
    if (world % l->gpus_per_node != 0 || alt_seen(v, *n, groups, size))
        return;
    v[(*n)++] = (bmt_layout_alt_t){ groups, size, world, world / l->gpus_per_node, why };
}

size_t bmt_layout_alternatives(const bmt_layout_t *l, bmt_layout_alt_t *out, size_t max)
{
    if (bmt_layout_rail_aligned(l) || max == 0)
        return 0;
    const int s = l->gpus_per_group, G = l->gpus_per_node;
    enum {
        CAP = 16
    };
    bmt_layout_alt_t same_groups[CAP], same_world[CAP];
    size_t ng = 0, nw = 0;

    /* Keep the number of groups: nearest aligned sizes around s. */
    if (s > G) {
        int lo = s / G * G;
        alt_push(same_groups, &ng, CAP, l, l->groups, lo, "same groups");
        alt_push(same_groups, &ng, CAP, l, l->groups, lo + G, "same groups");
        long long p = 1;
        while (p < s)
            p <<= 1;
        if (p <= BMT_LAYOUT_MAX_WORLD && p % G == 0)
            alt_push(same_groups, &ng, CAP, l, l->groups, (int)p, "same groups, power of two");
    } else {
        int below = 0, above = G;
        for (int d = 1; d <= G; d++)
            if (G % d == 0) {
                if (d < s)
                    below = d;
                else if (d > s) {
                    above = d;
                    break;
                }
            }
        alt_push(same_groups, &ng, CAP, l, l->groups, below, "same groups");
        alt_push(same_groups, &ng, CAP, l, l->groups, above, "same groups");
    }

    /* Keep the world: the aligned divisors of the world nearest s on each side. */
    int below = 0, above = 0;
    for (int d = s - 1; d >= 1 && below == 0; d--)
        if (l->world % d == 0 && aligned_size(d, G))
            below = d;
    for (int d = s + 1; d <= l->world && above == 0; d++)
        if (l->world % d == 0 && aligned_size(d, G))
            above = d;
    if (below)
        alt_push(same_world, &nw, CAP, l, l->world / below, below, "same world");
    if (above)
        alt_push(same_world, &nw, CAP, l, l->world / above, above, "same world");

    alt_sort(same_groups, ng, s);
    alt_sort(same_world, nw, s);
    size_t n = 0;
    for (size_t i = 0; i < ng && n < max; i++)
        out[n++] = same_groups[i];
    for (size_t i = 0; i < nw && n < max; i++)
        if (!alt_seen(out, n, same_world[i].groups, same_world[i].gpus_per_group))
            out[n++] = same_world[i];
    return n;
}
