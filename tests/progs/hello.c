/* tests/progs/hello.c — the demo rank program: join the job, say where this rank
 * lives, and prove the three communicators work with one all-reduce each.
 *
 * Every rank contributes its rank number; the sums are checked against the
 * layout's arithmetic, so the demo fails loudly if anything is off.
 */
#include <stdio.h>
#include <stdlib.h>

#include "bmt/bmt.h"

static int sum_check(bmt_ctx_t *ctx, bmt_comm_t *comm, double *sum, bmt_error_t *err)
{
    double mine = (double)bmt_rank(ctx);
    double *buf = bmt_mem_alloc(ctx, sizeof(double), err);
    if (buf == NULL)
        return -1;
    int rc = bmt_mem_upload(ctx, buf, &mine, sizeof(mine), err);
    if (rc == 0)
        rc = bmt_all_reduce(comm, buf, buf, 1, BMT_F64, BMT_SUM, err);
    if (rc == 0)
        rc = bmt_mem_download(ctx, sum, buf, sizeof(*sum), err);
    bmt_mem_free(ctx, buf);
    if (rc < 0)
        return -1;
    double want = 0;
    for (int i = 0; i < bmt_comm_size(comm); i++)
        want += bmt_comm_member(comm, i);
    if (*sum != want) {
        snprintf(err->text, sizeof(err->text), "%s: sum of ranks %.0f, expected %.0f",
                 bmt_comm_name(comm), *sum, want);
        return -1;
    }
    return 0;
}

int main(void)
{
    bmt_ctx_t *ctx = NULL;
    bmt_error_t err;
    if (bmt_init(&ctx, NULL, &err) < 0) {
        fprintf(stderr, "hello: %s\n", err.text);
        return 1;
    }
    bmt_rank_info_t me = bmt_self(ctx);
    double w, g, r;
    if (sum_check(ctx, bmt_comm_world(ctx), &w, &err) < 0 ||
        sum_check(ctx, bmt_comm_group(ctx), &g, &err) < 0 ||
        sum_check(ctx, bmt_comm_replica(ctx), &r, &err) < 0) {
        fprintf(stderr, "hello: %s\n", err.text);
        bmt_finalize(ctx);
        return 1;
    }
    char dev[32] = "cpu";
    if (bmt_device(ctx) == BMT_DEVICE_CUDA)
        snprintf(dev, sizeof(dev), "cuda:%d", bmt_device_index(ctx));
    printf("rank %d of %d on %s: node %d, local rank %d, group %d rank %d, device %s, "
           "backend %s; sums of ranks: world %.0f, group %.0f, replica %.0f\n",
           me.rank, bmt_world_size(ctx), bmt_hostname(ctx), me.node, me.local_rank, me.group,
           me.group_rank, dev, bmt_backend(ctx), w, g, r);
    return bmt_finalize(ctx) < 0 ? 1 : 0; /* it says why */
}
