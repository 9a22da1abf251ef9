/* bench/overlap.c — does the block list hide block i+1's gather behind block i?
 *
 *   bmlaunch --device cuda -n 2 -- build/bench/overlap [--blocks 8] [--n 4096] [--rows 8192]
 *
 * Every block is one bf16 parameter W (n x n, sharded over the group) and its
 * forward is one matrix product x[i+1] = x[i] W (cuBLAS, f32 accumulation) on
 * the compute stream. The same model runs through bmt_blocklist_forward with
 * prefetch on and off, in one run. CUDA events around each block's product
 * give, on the compute stream's own clock, the compute time and the gaps
 * between consecutive blocks: the time compute waited for a gather (exposed
 * communication). With prefetch the gather of block i+1 runs on the comm stream
 * during block i's product, so the gaps should vanish when a gather is shorter
 * than a product. A gather alone (bmt_block_gather) is timed too. Not a test.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bmt/block.h"
#include "bmt/bmt.h"
#include "bmt/device.h"

#ifdef BMT_HAVE_CUDA
int ov_setup(int n, int rows, int blocks);
int ov_block(int i, const void *w, void *stream);
int ov_timeline(float *compute_ms, float *gaps_ms, float *span_ms);

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, const char *why)
{
    fprintf(stderr, "bench/overlap: %s: %s\n", what, why);
    exit(1);
}

static int fwd(void *model, const bmt_block_call_t *c, bmt_error_t *err)
{
    if (ov_block(c->index, c->params[0], c->stream) < 0) {
        snprintf(err->text, sizeof(err->text), "cublasGemmEx failed");
        return -1;
    }
    return 0;
}

static int bwd(void *model, const bmt_block_call_t *c, bmt_error_t *err) { return 0; }

static bmt_block_t *make_block(bmt_ctx_t *ctx, int i, int n, bmt_error_t *err)
{
    char name[32];
    snprintf(name, sizeof(name), "b.%d", i);
    bmt_block_t *b = bmt_block_create(ctx, name, err);
    int64_t shape[2] = { n, n };
    if (b == NULL ||
        bmt_block_add_param(b, "w", 2, shape, BMT_BF16, BMT_INIT_NORMAL_V(0, 0.02), 0, err) < 0 ||
        bmt_block_build(b, 1234, err) < 0)
        die("block", err->text);
    return b;
}

int main(int argc, char **argv)
{
    int blocks = 8, n = 4096, rows = 8192, reps = 10;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--blocks") == 0)
            blocks = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--n") == 0)
            n = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--rows") == 0)
            rows = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--reps") == 0)
            reps = atoi(argv[i + 1]);
        else
            die("unknown option", argv[i]);
    }
    bmt_ctx_t *ctx;
    bmt_error_t err;
    if (bmt_init(&ctx, NULL, &err) < 0)
        die("bmt_init", err.text);
    if (bmt_device(ctx) != BMT_DEVICE_CUDA)
        die("device", "run with --device cuda");
    if (ov_setup(n, rows, blocks) < 0)
        die("setup", "cuBLAS or memory");
    const bmt_block_ops_t ops = { fwd, bwd };
    double gflop = 2.0 * rows * (double)n * n * blocks / 1e9;
    double mib = (double)n * n * 2 / (1 << 20);
    if (bmt_rank(ctx) == 0)
        printf("bench/overlap: %d blocks, W %dx%d bf16 (%.0f MiB gathered per block over %d "
               "ranks), x %dx%d, %.0f GFLOP per forward\n",
               blocks, n, n, mib, bmt_comm_size(bmt_comm_group(ctx)), rows, n, gflop);

    /* A gather alone. */
    bmt_block_t *solo = make_block(ctx, 99, n, &err);
    double g0 = now();
    for (int r = 0; r < reps; r++)
        if (bmt_block_gather(solo, &err) < 0 || bmt_block_release(solo, &err) < 0)
            die("gather", err.text);
    double gather_ms = (now() - g0) / reps * 1e3;
    bmt_block_destroy(solo);

    if (bmt_rank(ctx) == 0)
        printf("%-12s %10s %12s %14s %12s\n", "prefetch", "ms/fwd", "compute ms", "exposed wait",
               "TFLOP/s");
    for (int prefetch = 1; prefetch >= 0; prefetch--) {
        bmt_blocklist_config_t cfg = BMT_BLOCKLIST_CONFIG_INITIALIZER;
        cfg.prefetch = prefetch;
        cfg.checkpointing = 0;
        bmt_blocklist_t *list = bmt_blocklist_create(ctx, &cfg, &err);
        if (list == NULL)
            die("list", err.text);
        for (int i = 0; i < blocks; i++)
            if (bmt_blocklist_append(list, make_block(ctx, i, n, &err), &ops, NULL, &err) < 0)
                die("append", err.text);
        for (int w = 0; w < 2; w++)
            if (bmt_blocklist_forward(list, &err) < 0 || bmt_device_synchronize(ctx, &err) < 0)
                die("warm-up", err.text);
        double t0 = now();
        for (int r = 0; r < reps; r++)
            if (bmt_blocklist_forward(list, &err) < 0 || bmt_device_synchronize(ctx, &err) < 0)
                die("forward", err.text);
        double ms = (now() - t0) / reps * 1e3;
        float compute, gaps, span;
        if (ov_timeline(&compute, &gaps, &span) < 0)
            die("timeline", "events");
        if (bmt_rank(ctx) == 0)
            printf("%-12s %10.3f %12.3f %11.3f ms %12.1f\n", prefetch ? "on" : "off", ms, compute,
                   gaps, gflop / (ms / 1e3) / 1e3);
        bmt_blocklist_destroy(list);
    }
    if (bmt_rank(ctx) == 0)
        printf("one gather alone (bmt_block_gather, synchronous): %.3f ms; without overlap a "
               "forward needs about compute + %d gathers\n",
               gather_ms, blocks);
    bmt_finalize(ctx);
    return 0;
}
#else
int main(void)
{
    fprintf(stderr, "bench/overlap: needs a CUDA build\n");
    return 1;
}
#endif
