/* bmt/layout.h — the two-level layout: groups x gpus_per_group ranks on nodes.
 *
 * One pure module (runtime/layout.c) computes where every rank lives and which
 * communicators it belongs to. bmlaunch and libbmt both use it, so they can never
 * disagree. Nothing here allocates per rank: a layout of 100k ranks is five ints,
 * and every query about a rank or a group is O(1) arithmetic
 * (bmt_layout_straddling_groups counts over the groups: O(groups)).
 *
 * Vocabulary (../DESIGN.md §2):
 *   world      = groups * gpus_per_group
 *   group      = rank / gpus_per_group     group_rank = rank % gpus_per_group
 *   node       = rank / gpus_per_node      local_rank = rank % gpus_per_node
 *   group communicator g:   ranks g*gpus_per_group + i,  i in [0, gpus_per_group)
 *   replica communicator i: ranks i + g*gpus_per_group,  g in [0, groups)
 */
#ifndef BMT_LAYOUT_H
#define BMT_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>

#include "bmt/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest world bmt plans (2^22 ranks): far past any machine, small enough
 * that every product of two layout numbers fits an int. */
#define BMT_LAYOUT_MAX_WORLD (1 << 22)

typedef struct bmt_layout {
    int groups;         /* data-parallel replicas (ZeRO groups) */
    int gpus_per_group; /* ranks that shard one replica's state (ZeRO-3) */
    int gpus_per_node;  /* ranks on one node (consecutive) */
    int nodes;          /* world / gpus_per_node */
    int world;          /* groups * gpus_per_group */
} bmt_layout_t;

typedef struct bmt_rank_info {
    int rank;
    int node;
    int local_rank;
    int group;
    int group_rank;
} bmt_rank_info_t;

/* Build a layout and check it.
 *   gpus_per_node: 0 means "derived": all ranks on one node (gpus_per_node =
 *          world), or with nodes > 0, ceil(world / nodes) per node.
 *   nodes: 0 means "derived" (world / gpus_per_node); otherwise the allocation
 *          has exactly this many nodes and the world must fill them.
 * Errors (return -1, *out untouched, err says what is wrong and what to do):
 *   a size < 1, a world over BMT_LAYOUT_MAX_WORLD, a world that does not fill
 *   whole nodes, more ranks than nodes * gpus_per_node, fewer ranks than that. */
BMT_API int bmt_layout_make(bmt_layout_t *out, int groups, int gpus_per_group, int gpus_per_node,
                            int nodes, bmt_error_t *err);

/* Where rank lives. rank must be in [0, world). */
BMT_API bmt_rank_info_t bmt_layout_rank(const bmt_layout_t *l, int rank);

/* World rank of member i of group g's communicator (i in [0, gpus_per_group)). */
BMT_API int bmt_layout_group_member(const bmt_layout_t *l, int group, int i);

/* World rank of member g of the replica communicator of group_rank i
 * (g in [0, groups)). */
BMT_API int bmt_layout_replica_member(const bmt_layout_t *l, int group_rank, int g);

/* True when every replica communicator sees the same local ranks on every node,
 * i.e. gpus_per_group is a multiple of gpus_per_node or divides it (DESIGN §2). */
BMT_API bool bmt_layout_rail_aligned(const bmt_layout_t *l);

/* First and last node that group g's ranks occupy. */
BMT_API void bmt_layout_group_nodes(const bmt_layout_t *l, int group, int *first, int *last);

/* True when group g lies on more than one node without occupying those nodes
 * whole: it then shares a node with a neighbouring group at a boundary. */
BMT_API bool bmt_layout_group_straddles(const bmt_layout_t *l, int group);

/* Number of groups that straddle node boundaries. */
BMT_API int bmt_layout_straddling_groups(const bmt_layout_t *l);

/* An aligned layout near a request that is not. */
typedef struct bmt_layout_alt {
    int groups;
    int gpus_per_group;
    int world;
    int nodes;
    const char *why; /* static text: "same groups", "same world", ... */
} bmt_layout_alt_t;

/* Fill up to max aligned alternatives near l (same gpus_per_node), nearest first:
 * the nearest aligned group sizes keeping the number of groups (50 on 8-GPU nodes
 * -> 48, 56, and the next power of two, 64), then sizes that keep the world
 * (1000 ranks -> 25 groups of 40). Returns how many were written; 0 when l is
 * already aligned. Pure. */
BMT_API size_t bmt_layout_alternatives(const bmt_layout_t *l, bmt_layout_alt_t *out, size_t max);

/* Parse a positive decimal int for the named quantity ("--groups", "BMT_GROUPS").
 * Rejects empty text, signs, trailing characters, 0 and values over INT_MAX with a
 * message naming the quantity and the offending text. */
BMT_API int bmt_parse_positive(const char *text, const char *what, int *out, bmt_error_t *err);

#ifdef __cplusplus
}
#endif
#endif
