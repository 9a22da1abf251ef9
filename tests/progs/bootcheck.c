/* tests/progs/bootcheck.c — bootstrap only: join, build the communicators'
 * membership, and check every peer's view against the layout.
 *
 * No data collectives (the default backend here is "none"), so it runs at any
 * scale (1000 ranks on two cores) and across nodes where shm cannot go. Each
 * rank publishes what it believes about itself through PMIx (bmt_oob_allgather)
 * and checks every peer's record against the layout arithmetic and against its
 * own communicators: same group -> same group communicator members in the same
 * order, and so on. Rank 0 prints the summary; any rank prints what is wrong and
 * exits 1.
 *   bootcheck [--all]   --all: every rank prints its line, not only rank 0
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bmt/bmt.h"

typedef struct record {
    int32_t rank, node, local_rank, group, group_rank;
    int32_t world_size, group_size, group_comm_rank, replica_size, replica_comm_rank;
    int32_t env_rank;                   /* BMT_RANK as the launcher set it, -1 if unset */
    int32_t group_first, replica_first; /* world rank of member 0 of each comm */
    char host[64];
} record_t;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int problem(int rank, int peer, const char *what)
{
    fprintf(stderr, "bootcheck: rank %d: peer %d: %s\n", rank, peer, what);
    return 1;
}

int main(int argc, char **argv)
{
    int all = argc > 1 && strcmp(argv[1], "--all") == 0;
    double t0 = now();
    bmt_config_t cfg = BMT_CONFIG_INITIALIZER;
    if (getenv("BMT_BACKEND") == NULL)
        cfg.backend = "none";
    bmt_ctx_t *ctx;
    bmt_error_t err;
    if (bmt_init(&ctx, &cfg, &err) < 0) {
        fprintf(stderr, "bootcheck: %s\n", err.text);
        return 1;
    }
    double t_init = now() - t0;
    const bmt_layout_t *l = bmt_layout(ctx);
    bmt_rank_info_t me = bmt_self(ctx);
    bmt_comm_t *g = bmt_comm_group(ctx), *rc = bmt_comm_replica(ctx), *w = bmt_comm_world(ctx);
    const char *env_rank = getenv("BMT_RANK");
    record_t mine = {
        .rank = me.rank,
        .node = me.node,
        .local_rank = me.local_rank,
        .group = me.group,
        .group_rank = me.group_rank,
        .world_size = bmt_comm_size(w),
        .group_size = bmt_comm_size(g),
        .group_comm_rank = bmt_comm_rank(g),
        .replica_size = bmt_comm_size(rc),
        .replica_comm_rank = bmt_comm_rank(rc),
        .env_rank = env_rank ? atoi(env_rank) : -1,
        .group_first = bmt_comm_member(g, 0),
        .replica_first = bmt_comm_member(rc, 0),
    };
    snprintf(mine.host, sizeof(mine.host), "%s", bmt_hostname(ctx));
    int n = bmt_world_size(ctx);
    /* Publish once; fetch what this rank checks: the peers of its group and
     * replica communicators, and (rank 0, or every rank with --all) the whole
     * world. Together the ranks check every peer; no rank fetches world records
     * unless asked, which keeps 1000 ranks cheap (a world-wide all-gather costs
     * a million fetches). */
    if (bmt_oob_publish(ctx, &mine, sizeof(mine), &err) < 0) {
        fprintf(stderr, "bootcheck: rank %d: %s\n", me.rank, err.text);
        return 1;
    }
    double t_total = now() - t0;
    int bad = 0, checked = 0;
    char hosts[8][64];
    int nhosts = 0;
    bool world_check = all || me.rank == 0;
    int todo = world_check ? n : l->gpus_per_group + l->groups;
    for (int k = 0; k < todo && !bad; k++) {
        int p = world_check ? k
                : k < l->gpus_per_group
                    ? bmt_layout_group_member(l, me.group, k)
                    : bmt_layout_replica_member(l, me.group_rank, k - l->gpus_per_group);
        record_t rec;
        if (bmt_oob_fetch(ctx, p, &rec, sizeof(rec), &err) < 0) {
            fprintf(stderr, "bootcheck: rank %d: %s\n", me.rank, err.text);
            return 1;
        }
        checked++;
        const record_t *r = &rec;
        bmt_rank_info_t want = bmt_layout_rank(l, p);
        if (r->rank != p)
            bad = problem(me.rank, p, "reports another rank number");
        else if (r->env_rank != -1 && r->env_rank != p)
            bad = problem(me.rank, p, "BMT_RANK differs from its PMIx rank");
        else if (r->node != want.node || r->local_rank != want.local_rank ||
                 r->group != want.group || r->group_rank != want.group_rank)
            bad = problem(me.rank, p, "placement differs from the layout");
        else if (r->world_size != n || r->group_size != l->gpus_per_group ||
                 r->replica_size != l->groups)
            bad = problem(me.rank, p, "communicator sizes differ from the layout");
        else if (r->group_comm_rank != want.group_rank || r->replica_comm_rank != want.group)
            bad = problem(me.rank, p, "its rank in the group or replica communicator is wrong");
        else if (r->group_first != bmt_layout_group_member(l, want.group, 0) ||
                 r->replica_first != bmt_layout_replica_member(l, want.group_rank, 0))
            bad = problem(me.rank, p, "its communicators start at the wrong rank");
        else if (r->group == me.group && bmt_comm_member(g, r->group_comm_rank) != p)
            bad = problem(me.rank, p, "my group communicator lists it elsewhere");
        else if (r->group_rank == me.group_rank && bmt_comm_member(rc, r->replica_comm_rank) != p)
            bad = problem(me.rank, p, "my replica communicator lists it elsewhere");
        int seen = 0;
        for (int h = 0; h < nhosts; h++)
            seen |= strcmp(hosts[h], r->host) == 0;
        if (!seen && nhosts < 8)
            snprintf(hosts[nhosts++], sizeof(hosts[0]), "%s", r->host);
    }
    double t_check = now() - t0;
    if (!bad && (all || me.rank == 0)) {
        printf("bootcheck: rank %d: %d ranks (%d x %d) on %d host%s", me.rank, n, l->groups,
               l->gpus_per_group, nhosts, nhosts == 1 ? "" : "s");
        for (int h = 0; h < nhosts; h++)
            printf("%s%s", h ? "," : " ", hosts[h]);
        printf("; every peer's placement and communicators check out (%d checked here); init "
               "%.3f s, init+publish %.3f s, +checks %.3f s\n",
               checked, t_init, t_total, t_check);
    }
    bmt_finalize(ctx);
    return bad;
}
