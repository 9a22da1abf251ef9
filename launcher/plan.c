/* launcher/plan.c — `bmlaunch --plan`: the layout, readable or as JSON.
 *
 * The text form must stay readable at 1000 ranks and beyond: tables show the
 * first and last rows with an ellipsis between, and summaries say the rest.
 * The JSON form (Jansson) carries everything, per rank, for tools.
 */
#include "plan.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "bmt/layout.h"
#include "error.h"

#define PLAN_HEAD 4 /* rows shown before the ellipsis */
#define PLAN_TAIL 2 /* rows shown after it */
#define PLAN_ALTS 6

static void range(char *buf, size_t len, int a, int b)
{
    if (a == b)
        snprintf(buf, len, "%d", a);
    else
        snprintf(buf, len, "%d-%d", a, b);
}

static bool shown(int i, int n)
{
    return n <= PLAN_HEAD + PLAN_TAIL + 1 || i < PLAN_HEAD || i >= n - PLAN_TAIL;
}

/* The local ranks (GPU index on their node) that replica communicator i uses:
 * one rail when aligned, several when not. Writes up to max, returns count. */
static int replica_local_ranks(const bmt_layout_t *l, int i, int *out, int max)
{
    int n = 0;
    for (int g = 0; g < l->groups; g++) {
        int lr = bmt_layout_rank(l, bmt_layout_replica_member(l, i, g)).local_rank;
        bool seen = false;
        for (int k = 0; k < n && !seen; k++)
            seen = out[k] == lr;
        if (!seen) {
            if (n == max)
                return n + 1; /* more than max */
            out[n++] = lr;
        }
    }
    return n;
}

static void print_text(FILE *out, const bmt_layout_t *l)
{
    char a[48], b[48];
    fprintf(out, "bmt plan: %d group%s x %d GPU%s = %d rank%s on %d node%s x %d GPU%s\n", l->groups,
            l->groups == 1 ? "" : "s", l->gpus_per_group, l->gpus_per_group == 1 ? "" : "s",
            l->world, l->world == 1 ? "" : "s", l->nodes, l->nodes == 1 ? "" : "s",
            l->gpus_per_node, l->gpus_per_node == 1 ? "" : "s");
    fprintf(out, "  ZeRO-3 inside each group: %d group communicator%s of %d rank%s\n", l->groups,
            l->groups == 1 ? "" : "s", l->gpus_per_group, l->gpus_per_group == 1 ? "" : "s");
    fprintf(out, "  data parallel across groups: %d replica communicator%s of %d rank%s\n\n",
            l->gpus_per_group, l->gpus_per_group == 1 ? "" : "s", l->groups,
            l->groups == 1 ? "" : "s");

    fprintf(out, "  %-8s %-16s %-12s %s\n", "group", "ranks", "nodes", "straddles a node boundary");
    for (int g = 0; g < l->groups; g++) {
        if (!shown(g, l->groups)) {
            if (g == PLAN_HEAD)
                fprintf(out, "  %-8s (%d more groups)\n", "...", l->groups - PLAN_HEAD - PLAN_TAIL);
            continue;
        }
        int first, last;
        bmt_layout_group_nodes(l, g, &first, &last);
        int r0 = bmt_layout_group_member(l, g, 0);
        range(a, sizeof(a), r0, r0 + l->gpus_per_group - 1);
        range(b, sizeof(b), first, last);
        fprintf(out, "  %-8d %-16s %-12s %s\n", g, a, b,
                bmt_layout_group_straddles(l, g) ? "yes" : "no");
    }
    fprintf(out, "\n  %-8s %-16s %s\n", "node", "ranks", "groups");
    for (int n = 0; n < l->nodes; n++) {
        if (!shown(n, l->nodes)) {
            if (n == PLAN_HEAD)
                fprintf(out, "  %-8s (%d more nodes)\n", "...", l->nodes - PLAN_HEAD - PLAN_TAIL);
            continue;
        }
        int r0 = n * l->gpus_per_node, r1 = r0 + l->gpus_per_node - 1;
        range(a, sizeof(a), r0, r1);
        range(b, sizeof(b), r0 / l->gpus_per_group, r1 / l->gpus_per_group);
        fprintf(out, "  %-8d %-16s %s\n", n, a, b);
    }

    int lr[8];
    int nlr = replica_local_ranks(l, 0, lr, 8);
    fprintf(out, "\n  replica communicator 0: ranks 0");
    for (int g = 1; g < l->groups && g < 4; g++)
        fprintf(out, ", %d", bmt_layout_replica_member(l, 0, g));
    if (l->groups > 4)
        fprintf(out, ", ... %d", bmt_layout_replica_member(l, 0, l->groups - 1));
    fprintf(out, "; GPU index on their nodes: ");
    for (int k = 0; k < nlr && k < 8; k++)
        fprintf(out, "%s%d", k ? ", " : "", lr[k]);
    fprintf(out, "%s\n", nlr > 8 ? ", ..." : "");

    int straddling = bmt_layout_straddling_groups(l);
    if (bmt_layout_rail_aligned(l)) {
        if (l->gpus_per_group % l->gpus_per_node == 0)
            fprintf(out,
                    "\n  rail alignment: aligned (%d GPUs per group is a multiple of %d GPUs per "
                    "node): every replica communicator uses one GPU index, hence one NIC rail, "
                    "on every node\n",
                    l->gpus_per_group, l->gpus_per_node);
        else
            fprintf(out,
                    "\n  rail alignment: aligned (%d GPUs per group divides %d GPUs per node): "
                    "every replica communicator uses the same %d GPU indices on every node; "
                    "the hops between them on one node stay on NVLink\n",
                    l->gpus_per_group, l->gpus_per_node, l->gpus_per_node / l->gpus_per_group);
        return;
    }
    fprintf(out,
            "\n  rail alignment: NOT aligned: %d GPUs per group is neither a multiple nor a "
            "divisor of %d GPUs per node;\n    replica communicators mix GPU indices, so "
            "cross-group traffic crosses NIC rails; %d of %d groups straddle node "
            "boundaries\n",
            l->gpus_per_group, l->gpus_per_node, straddling, l->groups);
    bmt_layout_alt_t alts[PLAN_ALTS];
    size_t n = bmt_layout_alternatives(l, alts, PLAN_ALTS);
    if (n == 0)
        return;
    fprintf(out, "  aligned alternatives:\n");
    for (size_t i = 0; i < n; i++)
        fprintf(out, "    --groups %d --gpus-per-group %d: %d ranks on %d nodes (%s)\n",
                alts[i].groups, alts[i].gpus_per_group, alts[i].world, alts[i].nodes, alts[i].why);
}

static json_t *build_json(const bmt_layout_t *l)
{
    json_t *root = json_object();
    json_object_set_new(root, "groups", json_integer(l->groups));
    json_object_set_new(root, "gpus_per_group", json_integer(l->gpus_per_group));
    json_object_set_new(root, "gpus_per_node", json_integer(l->gpus_per_node));
    json_object_set_new(root, "nodes", json_integer(l->nodes));
    json_object_set_new(root, "world", json_integer(l->world));
    json_object_set_new(root, "rail_aligned", json_boolean(bmt_layout_rail_aligned(l)));
    json_object_set_new(root, "straddling_groups", json_integer(bmt_layout_straddling_groups(l)));

    json_t *alts = json_array();
    bmt_layout_alt_t alt[PLAN_ALTS];
    size_t na = bmt_layout_alternatives(l, alt, PLAN_ALTS);
    for (size_t i = 0; i < na; i++)
        json_array_append_new(alts,
                              json_pack("{s:i, s:i, s:i, s:i, s:s}", "groups", alt[i].groups,
                                        "gpus_per_group", alt[i].gpus_per_group, "world",
                                        alt[i].world, "nodes", alt[i].nodes, "why", alt[i].why));
    json_object_set_new(root, "alternatives", alts);

    json_t *groups = json_array();
    for (int g = 0; g < l->groups; g++) {
        int first, last;
        bmt_layout_group_nodes(l, g, &first, &last);
        int r0 = bmt_layout_group_member(l, g, 0);
        json_array_append_new(
            groups, json_pack("{s:i, s:i, s:i, s:i, s:i, s:b}", "group", g, "first_rank", r0,
                              "last_rank", r0 + l->gpus_per_group - 1, "first_node", first,
                              "last_node", last, "straddles", bmt_layout_group_straddles(l, g)));
    }
    json_object_set_new(root, "group_comms", groups);

    json_t *replicas = json_array();
    for (int i = 0; i < l->gpus_per_group; i++) {
        json_t *ranks = json_array();
        for (int g = 0; g < l->groups; g++)
            json_array_append_new(ranks, json_integer(bmt_layout_replica_member(l, i, g)));
        json_array_append_new(replicas, json_pack("{s:i, s:o}", "group_rank", i, "ranks", ranks));
    }
    json_object_set_new(root, "replica_comms", replicas);

    json_t *ranks = json_array();
    for (int r = 0; r < l->world; r++) {
        bmt_rank_info_t ri = bmt_layout_rank(l, r);
        json_array_append_new(ranks, json_pack("{s:i, s:i, s:i, s:i, s:i}", "rank", r, "node",
                                               ri.node, "local_rank", ri.local_rank, "group",
                                               ri.group, "group_rank", ri.group_rank));
    }
    json_object_set_new(root, "ranks", ranks);
    return root;
}

int plan_print(FILE *out, const bmt_layout_t *l, bool json, const costmodel_in_t *cin,
               const costmodel_candidate_t *cand, size_t n, bmt_error_t *err)
{
    if (!json) {
        print_text(out, l);
        /* costmodel_print_text fails on a write error too: that one is said below */
        if (cin && n > 0 && costmodel_print_text(out, cin, cand, n) < 0 && !ferror(out))
            return errprintf(err, "internal error: the cost model has no row for your layout");
    } else {
        json_t *root = build_json(l);
        json_t *cost = cin && n > 0 ? costmodel_json(cin, cand, n) : NULL;
        /* json_real takes no inf or nan: a figure out of range leaves a hole. */
        if (root == NULL || (cin && n > 0 && cost == NULL) ||
            (cost && json_object_set_new(root, "cost_model", cost) < 0)) {
            json_decref(root);
            return errprintf(err, "cannot encode the plan as JSON: a figure is out of range "
                                  "(not finite) or memory ran out");
        }
        int rc = json_dumpf(root, out, JSON_INDENT(1) | JSON_COMPACT);
        json_decref(root);
        if (rc != 0 && !ferror(out))
            return errprintf(err, "cannot encode the plan as JSON");
        fputc('\n', out);
    }
    /* Flushed here: an error of the last buffered write shows only then. */
    if (fflush(out) != 0 || ferror(out))
        return errprintf(err, "cannot write the plan: %s; what was written is incomplete",
                         strerror(errno ? errno : EIO));
    return 0;
}
