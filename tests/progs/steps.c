/* tests/progs/steps.c — a rank that reports training steps and does nothing else.
 *
 *     bmlaunch ... -- steps [--steps N] [--pace MS] [--tokens T] [--late MS] [--stop N]
 *                       [--scalars K]
 *
 * bmt_init, then N steps of: sleep --pace milliseconds, bmt_report_step with
 * T tokens (default 1000 + rank, so that sums over ranks are checkable), one
 * sample, loss 1/step, 1e9 model FLOPs; then bmt_finalize. Without --late it
 * needs no data collectives, so it runs with --backend none, on many ranks and
 * across nodes (where shm cannot go): the metrics tests use it for scale and
 * for Slurm. With --late MS every step also all-reduces one number over the
 * world, which the last rank joins MS milliseconds late: the others' comm_wait_s
 * must show that wait, the last rank's must not. With --stop N the last rank
 * stops itself (SIGSTOP) after step N: a stuck rank for the stale-rank tests.
 * With --scalars K every step also reports "val_loss" = 2/step + rank/100 and
 * K scalars "custom_I" = I + rank (I from 0), through bmt_report_scalar: a K
 * of 32 or more goes over the bound on names, which must fail the rank.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bmt/bmt.h"
#include "bmt/monitor.h"

static int usage(void)
{
    fprintf(stderr, "usage: steps [--steps N] [--pace MS] [--tokens T] [--late MS] [--stop N] "
                    "[--scalars K]\n");
    return 2;
}

static void nap(long ms)
{
    if (ms > 0) {
        struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
        nanosleep(&ts, NULL);
    }
}

static int all_reduce_one(bmt_ctx_t *ctx, bmt_error_t *err)
{
    float one = 1, *d = bmt_mem_alloc(ctx, sizeof(one), err);
    if (d == NULL)
        return -1;
    int rc = bmt_mem_upload(ctx, d, &one, sizeof(one), err);
    if (rc == 0)
        rc = bmt_all_reduce(bmt_comm_world(ctx), d, d, 1, BMT_F32, BMT_SUM, err);
    if (rc == 0)
        rc = bmt_mem_download(ctx, &one, d, sizeof(one), err);
    bmt_mem_free(ctx, d);
    if (rc == 0 && one != (float)bmt_world_size(ctx)) {
        snprintf(err->text, sizeof(err->text), "all-reduce of ones gave %g", one);
        rc = -1;
    }
    return rc;
}

int main(int argc, char **argv)
{
    long steps = 5, pace_ms = 0, tokens = -1, late_ms = 0, stop = 0, scalars = -1;
    for (int i = 1; i < argc; i++) {
        long *dst = strcmp(argv[i], "--steps") == 0     ? &steps
                    : strcmp(argv[i], "--pace") == 0    ? &pace_ms
                    : strcmp(argv[i], "--tokens") == 0  ? &tokens
                    : strcmp(argv[i], "--late") == 0    ? &late_ms
                    : strcmp(argv[i], "--stop") == 0    ? &stop
                    : strcmp(argv[i], "--scalars") == 0 ? &scalars
                                                        : NULL;
        char *end = NULL;
        if (dst == NULL || i + 1 >= argc)
            return usage();
        *dst = strtol(argv[++i], &end, 10);
        if (*end != '\0' || *dst < 0)
            return usage();
    }
    bmt_ctx_t *ctx = NULL;
    bmt_error_t err;
    if (bmt_init(&ctx, NULL, &err) < 0) {
        fprintf(stderr, "steps: %s\n", err.text);
        return 1;
    }
    if (tokens < 0)
        tokens = 1000 + bmt_rank(ctx);
    for (long s = 1; s <= steps; s++) {
        nap(pace_ms);
        if (late_ms > 0) {
            if (bmt_rank(ctx) == bmt_world_size(ctx) - 1)
                nap(late_ms);
            if (all_reduce_one(ctx, &err) < 0) {
                fprintf(stderr, "steps: %s\n", err.text);
                bmt_abort(ctx, 1, err.text);
            }
        }
        bmt_step_report_t r = BMT_STEP_REPORT_INITIALIZER;
        r.tokens = tokens;
        r.samples = 1;
        r.loss = 1.0 / (double)s;
        r.flops = 1e9;
        if (bmt_report_step(ctx, &r, NULL, &err) < 0) {
            fprintf(stderr, "steps: %s\n", err.text);
            bmt_abort(ctx, 1, err.text);
        }
        for (long k = -1; k < scalars; k++) {
            char name[32];
            snprintf(name, sizeof(name), k < 0 ? "val_loss" : "custom_%ld", k);
            double v =
                k < 0 ? 2.0 / (double)s + bmt_rank(ctx) / 100.0 : (double)(k + bmt_rank(ctx));
            if (bmt_report_scalar(ctx, name, v, &err) < 0) {
                fprintf(stderr, "steps: %s\n", err.text);
                bmt_abort(ctx, 1, err.text);
            }
        }
        if (s == stop && bmt_rank(ctx) == bmt_world_size(ctx) - 1) {
            printf("steps: rank %d stops after step %ld\n", bmt_rank(ctx), s);
            fflush(stdout);
            raise(SIGSTOP);
        }
    }
    if (bmt_rank(ctx) == 0)
        printf("steps: %ld steps reported on each of %d ranks\n", steps, bmt_world_size(ctx));
    return bmt_finalize(ctx) < 0 ? 1 : 0; /* it says why */
}
