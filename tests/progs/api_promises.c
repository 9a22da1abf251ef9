/* tests/progs/api_promises.c — promises of docs/runtime.md, docs/engine.md and
 * the public headers that no other program checks, on every rank of a job
 * (tests/integration/test_engine.sh):
 *
 *     api_promises          under bmlaunch with the shm backend, or alone
 *     api_promises none     under BMT_BACKEND=none: the membership checks only
 *
 * Membership (every backend, none included): a split of a communicator that
 * holds every rank in another order than the world's (the world split by a
 * descending key) is ordered by (key, parent rank) and holds the ranks of its
 * color. The none backend exchanges the (color, key) pairs through PMIx, in
 * world-rank order; it took them for the parent's order, so such a split got
 * the wrong members and order and exited 0.
 * Data backends: the accessors of NULL, split names cut at 47 characters, a
 * negative color, destroying a context's own communicator (a no-op), argument
 * errors that leave the communicator usable, count 0, bmt_mem_alloc(0),
 * bmt_mem_pool_stats on the cpu; the engine's refusals after a list has run
 * (bmt_block_load, bmt_blocklist_append_tied) and bmt_adamw_create's refusal
 * of master_only 3 and of an infinite clip_norm.
 * Each check prints "ok ..." or "FAIL ..."; the last line is
 * "api_promises: N passed, M failed" and the exit status 1 on any failure.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bmt/block.h"
#include "bmt/bmt.h"
#include "bmt/device.h"
#include "bmt/optim.h"

static int passed, failed, me = -1;

static void check(bool ok, const char *what, const char *detail)
{
    if (ok)
        passed++;
    else
        failed++;
    printf("%s %s%s%s\n", ok ? "ok" : "FAIL", what, detail ? ": " : "", detail ? detail : "");
}

/* The world split by key -rank (members in descending world rank), then that
 * split by color = world rank % 2 with key kf(world rank): the members must be
 * the ranks of this parity ordered by (key, rank in the reversed parent). */
static void check_split_order(bmt_ctx_t *ctx, bool key_by_rank)
{
    bmt_error_t err;
    int n = bmt_world_size(ctx);
    bmt_comm_t *rev = NULL, *sub = NULL;
    char what[160], detail[600];
    snprintf(what, sizeof(what),
             "a split of the world in reverse order, split again (key %s): members and order",
             key_by_rank ? "the world rank" : "0, ties by parent rank");
    if (bmt_comm_split(bmt_comm_world(ctx), 0, -me, "rev", &rev, &err) < 0 ||
        bmt_comm_split(rev, me % 2, key_by_rank ? me : 0, "sub", &sub, &err) < 0) {
        check(false, what, err.text);
        bmt_comm_destroy(rev);
        return;
    }
    /* What it must be, from world ranks alone. */
    int want[64], nw = 0;
    for (int i = 0; i < n && nw < 64; i++) {
        int r = key_by_rank ? i : n - 1 - i; /* equal keys: the parent's order */
        if (r % 2 == me % 2)
            want[nw++] = r;
    }
    bool ok =
        bmt_comm_size(rev) == n && bmt_comm_member(rev, 0) == n - 1 && bmt_comm_size(sub) == nw;
    int len = snprintf(detail, sizeof(detail), "got");
    for (int i = 0; i < bmt_comm_size(sub) && len < 500; i++) {
        len += snprintf(detail + len, sizeof(detail) - len, " %d", bmt_comm_member(sub, i));
        ok = ok && i < nw && bmt_comm_member(sub, i) == want[i];
        if (bmt_comm_member(sub, i) == me)
            ok = ok && bmt_comm_rank(sub) == i;
    }
    len += snprintf(detail + len, sizeof(detail) - len, ", want");
    for (int i = 0; i < nw && len < 580; i++)
        len += snprintf(detail + len, sizeof(detail) - len, " %d", want[i]);
    check(ok, what, ok ? NULL : detail);
    bmt_comm_destroy(sub);
    bmt_comm_destroy(rev);
}

static int fw(void *m, const bmt_block_call_t *c, bmt_error_t *e) { return 0; }
static int bw(void *m, const bmt_block_call_t *c, bmt_error_t *e) { return 0; }
static int source(void *user, const bmt_block_t *b, int p, int64_t first, int64_t count, void *dst,
                  bmt_dtype_t dtype, bmt_error_t *e)
{
    for (int64_t i = 0; i < count; i++)
        ((float *)dst)[i] = 7.0f;
    return 0;
}

/* source, with the first value of each call a nan (user NULL) or -inf */
static int bad_source(void *user, const bmt_block_t *b, int p, int64_t first, int64_t count,
                      void *dst, bmt_dtype_t dtype, bmt_error_t *e)
{
    source(user, b, p, first, count, dst, dtype, e);
    if (count > 0)
        ((float *)dst)[0] = user ? -INFINITY : NAN;
    return 0;
}

static void check_data(bmt_ctx_t *ctx)
{
    bmt_error_t err;
    bmt_comm_t *w = bmt_comm_world(ctx);
    check(bmt_comm_rank(NULL) == -1 && bmt_comm_size(NULL) == 0 &&
              strcmp(bmt_comm_name(NULL), "(none)") == 0 && bmt_comm_member(NULL, 0) == -1 &&
              bmt_comm_member(w, bmt_comm_size(w)) == -1 && bmt_comm_member(w, -1) == -1,
          "the accessors of a NULL communicator, and members out of range", NULL);

    char longname[100];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    bmt_comm_t *c = (bmt_comm_t *)&err;
    int rc = bmt_comm_split(w, me % 2 ? -1 : 0, 0, longname, &c, &err);
    check(rc == 0 && (me % 2 ? c == NULL : c && strlen(bmt_comm_name(c)) == 47),
          "a split's name is cut at 47 characters; a negative color gets NULL", NULL);
    bmt_comm_destroy(c);
    bmt_comm_destroy(w); /* the context's own: a no-op */
    bmt_comm_destroy(bmt_comm_group(ctx));

    float buf[4] = { 1, 2, 3, 4 };
    int n = bmt_comm_size(w);
    bool refused = bmt_all_reduce(w, NULL, buf, 1, BMT_F32, BMT_SUM, &err) < 0 &&
                   bmt_all_reduce(w, buf, buf, 1, (bmt_dtype_t)9, BMT_SUM, &err) < 0 &&
                   bmt_all_reduce(w, buf, buf, 1, BMT_F32, (bmt_op_t)9, &err) < 0 &&
                   bmt_broadcast(w, buf, 1, BMT_F32, n, &err) < 0 &&
                   bmt_all_gather(w, buf, buf, SIZE_MAX / 2, BMT_F32, &err) < 0;
    float v = (float)me;
    bool usable = bmt_all_reduce(w, buf, buf, 0, BMT_F32, BMT_SUM, &err) == 0 &&
                  bmt_all_reduce(w, &v, &v, 1, BMT_F32, BMT_SUM, &err) == 0 &&
                  v == (float)(n * (n - 1) / 2);
    check(refused && usable,
          "argument errors return -1 and leave the communicator usable; count 0 is allowed",
          refused && usable ? NULL : err.text);

    void *a = bmt_mem_alloc(ctx, 0, &err), *b = bmt_mem_alloc(ctx, 0, &err);
    check(a && b && a != b, "bmt_mem_alloc(0) gives distinct pointers", NULL);
    bmt_mem_free(ctx, a);
    bmt_mem_free(ctx, b);
    bmt_mem_free(ctx, NULL);
    uint64_t in_use = 1, reserved = 1, high = 1;
    bmt_mem_pool_stats(ctx, &in_use, &reserved, &high);
    bmt_mem_pool_stats(ctx, NULL, NULL, NULL);
    check(bmt_device(ctx) != BMT_DEVICE_CPU || (in_use == 0 && reserved == 0 && high == 0),
          "bmt_mem_pool_stats is 0 on the cpu", NULL);

    /* The engine after its list has run. */
    const bmt_block_ops_t ops = { fw, bw };
    bmt_blocklist_t *list = bmt_blocklist_create(ctx, NULL, &err);
    bmt_block_t *blk = bmt_block_create(ctx, "a", &err);
    int64_t shape[1] = { 40 };
    if (!list || !blk ||
        bmt_block_add_param(blk, "w", 1, shape, BMT_F32, BMT_INIT_ONES_V, 0, &err) < 0 ||
        bmt_block_build(blk, 1, &err) < 0 ||
        bmt_blocklist_append(list, blk, &ops, NULL, &err) < 0 ||
        bmt_block_load(blk, source, NULL, &err) < 0) {
        check(false, "a block list of one block, loaded before it runs", err.text);
        return;
    }
    /* A source that writes a non-finite value fails the load, naming the
     * parameter and the element, and the shards keep the values they had. */
    bool named = true;
    for (int k = 0; k < 2; k++) {
        bmt_error_t e2 = { 0 };
        long long at = -1;
        char what[8] = "";
        const char *m = NULL;
        named = named && bmt_block_load(blk, bad_source, k ? (void *)1 : NULL, &e2) < 0 &&
                (m = strstr(e2.text, "loading a.w: element ")) != NULL &&
                sscanf(m, "loading a.w: element %lld is %7[-a-z]:", &at, what) == 2 && at >= 0 &&
                at < 40 && strcmp(what, k ? "-inf" : "nan") == 0 &&
                strstr(m, ": parameters must be finite") != NULL;
        if (!named)
            fprintf(stderr, "api_promises: load %d: %s\n", k, e2.text);
    }
    bool kept = bmt_block_gather(blk, &err) == 0;
    for (int i = 0; kept && i < 40; i++)
        kept = ((const float *)bmt_block_param(blk, 0))[i] == 7.0f;
    kept = bmt_block_release(blk, &err) == 0 && kept;
    check(named && kept,
          "bmt_block_load refuses a nan or an inf from its source, naming the parameter and "
          "element, and changes no shard",
          NULL);
    bmt_adamw_config_t oc = BMT_ADAMW_CONFIG_INITIALIZER;
    oc.master_only = 3;
    bool bad_mo = bmt_adamw_create(list, &oc, &err) == NULL;
    oc = (bmt_adamw_config_t)BMT_ADAMW_CONFIG_INITIALIZER;
    oc.clip_norm = INFINITY;
    bool bad_clip = bmt_adamw_create(list, &oc, &err) == NULL;
    check(bad_mo && bad_clip, "bmt_adamw_create refuses master_only 3 and clip_norm inf", NULL);
    if (bmt_blocklist_forward(list, &err) < 0) {
        check(false, "a forward", err.text);
        bmt_blocklist_destroy(list);
        return;
    }
    check(bmt_block_load(blk, source, NULL, &err) < 0 &&
              strstr(err.text, "before bmt_adamw_create and the first forward") != NULL,
          "bmt_block_load after the list ran is refused", err.text);
    check(bmt_blocklist_append_tied(list, blk, &ops, NULL, &err) < 0 &&
              bmt_blocklist_size(list) == 1,
          "bmt_blocklist_append_tied after the list ran is refused, the list unchanged", err.text);
    check(bmt_blocklist_backward(list, true, &err) == 0, "the list runs on after the refusals",
          err.text);
    bmt_blocklist_destroy(list);
}

int main(int argc, char **argv)
{
    bool none = argc > 1 && strcmp(argv[1], "none") == 0;
    bmt_ctx_t *ctx = NULL;
    bmt_error_t err;
    if (bmt_init(&ctx, NULL, &err) < 0) {
        fprintf(stderr, "api_promises: %s\n", err.text);
        return 1;
    }
    me = bmt_rank(ctx);
    setvbuf(stdout, NULL, _IOLBF, 0);
    check_split_order(ctx, true);
    check_split_order(ctx, false);
    if (!none)
        check_data(ctx);
    printf("api_promises: %d passed, %d failed\n", passed, failed);
    bmt_finalize(ctx);
    return failed ? 1 : 0;
}
