/* bench/ckpt.c — checkpoint save and load throughput next to dd, in one run.
 *
 *     bmlaunch -g G -n P -- build/bench/ckpt DIR [MB_PER_BLOCK [BLOCKS]]
 *
 * Builds BLOCKS blocks (default 8) of MB_PER_BLOCK MiB of f32 parameters
 * (default 32) with an AdamW optimizer, so a checkpoint holds 3x that (weights,
 * two moments). Then, timed on the wall clock between world barriers:
 *   save   bmt_ckpt_save (preallocate, pwrite by the ranks of group 0, fsync,
 *          rename, latest);
 *   load   bmt_ckpt_load into the same list (each rank reads its own ranges
 *          and checks the XXH3 of every unit that covers them), after dropping
 *          the page cache when allowed (root), so that it reads from the disk;
 *   load without checksums
 *          the same, with train_state.json rewritten as a checkpoint of a bmt
 *          before checksums (version 1: nothing to verify), so the two loads
 *          differ only in the verification; restored afterwards. The two
 *          alternate, twice each, and each keeps its faster run;
 *   xxh3   rank 0 hashes the checkpoint's bytes in memory (bmt_st_checksum):
 *          what the hashing alone costs;
 *   dd     rank 0 runs dd with the same number of bytes: write with
 *          conv=fsync, then (cache dropped) read, 4 MiB blocks.
 * Prints one table: bytes, seconds, GB/s for ours and dd's, and the ratio.
 * Not a test: the machines are shared and noisy.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bmt/block.h"
#include "bmt/bmt.h"
#include "bmt/ckpt.h"
#include "bmt/optim.h"
#include "bmt/safetensors.h"

#include <jansson.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, "bench/ckpt: " __VA_ARGS__);                                               \
        fprintf(stderr, "\n");                                                                     \
        exit(1);                                                                                   \
    } while (0)

static int noop(void *m, const bmt_block_call_t *c, bmt_error_t *e)
{
    (void)m, (void)c, (void)e;
    return 0;
}

/* Drop the page cache (root only); returns whether it could. */
static int drop_caches(void)
{
    sync();
    FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
    if (f == NULL)
        return 0;
    int ok = fputs("3\n", f) >= 0;
    return fclose(f) == 0 && ok;
}

/* Rewrite DIR/bench/train_state.json as version 1 without checksums (off) or
 * put the saved text back (on). */
static void checksums(const char *dir, bool on, char **saved)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/bench/train_state.json", dir);
    if (on) {
        FILE *f = fopen(path, "w");
        if (f == NULL || fputs(*saved, f) < 0 || fclose(f) != 0)
            DIE("cannot restore %s", path);
        free(*saved);
        *saved = NULL;
        return;
    }
    json_error_t je;
    json_t *ts = json_load_file(path, 0, &je);
    if (ts == NULL)
        DIE("%s: %s", path, je.text);
    *saved = json_dumps(ts, JSON_INDENT(1));
    json_object_del(ts, "checksums");
    json_object_set_new(ts, "version", json_integer(1));
    if (*saved == NULL || json_dump_file(ts, path, JSON_INDENT(1)) != 0)
        DIE("cannot rewrite %s", path);
    json_decref(ts);
}

static double timed(const char *cmd)
{
    double t0 = now();
    if (system(cmd) != 0)
        DIE("'%s' failed", cmd);
    return now() - t0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        DIE("usage: bench/ckpt DIR [MB_PER_BLOCK [BLOCKS]]");
    const char *dir = argv[1];
    const int mb = argc > 2 ? atoi(argv[2]) : 32, nblocks = argc > 3 ? atoi(argv[3]) : 8;
    if (mb < 1 || nblocks < 1)
        DIE("MB_PER_BLOCK and BLOCKS must be positive");
    bmt_ctx_t *ctx;
    bmt_error_t err;
    if (bmt_init(&ctx, NULL, &err) < 0)
        DIE("%s", err.text);
    const int rank = bmt_rank(ctx);
    bmt_blocklist_t *list = bmt_blocklist_create(ctx, NULL, &err);
    const bmt_block_ops_t ops = { noop, noop };
    if (list == NULL)
        DIE("%s", err.text);
    for (int b = 0; b < nblocks; b++) {
        char name[32];
        snprintf(name, sizeof(name), "h.%d", b);
        const int64_t shape[2] = { (int64_t)mb * 256, 1024 }; /* mb MiB of f32 */
        bmt_block_t *blk = bmt_block_create(ctx, name, &err);
        if (blk == NULL ||
            bmt_block_add_param(blk, "w", 2, shape, BMT_F32, BMT_INIT_NORMAL_V(0, 0.02), 0, &err) <
                0 ||
            bmt_block_build(blk, 1, &err) < 0 ||
            bmt_blocklist_append(list, blk, &ops, NULL, &err) < 0)
            DIE("%s", err.text);
    }
    bmt_optim_t *opt = bmt_adamw_create(list, NULL, &err);
    if (opt == NULL)
        DIE("%s", err.text);
    const double bytes = 3.0 * nblocks * mb * 1048576.0; /* weights + 2 moments */

    bmt_barrier(bmt_comm_world(ctx), &err);
    double t0 = now();
    if (bmt_ckpt_save(list, opt, dir, "bench", NULL, 1, &err) < 0)
        DIE("%s", err.text);
    bmt_barrier(bmt_comm_world(ctx), &err);
    double t_save = now() - t0;

    /* Loads, page cache dropped before each: with checksums and without
     * (train_state.json rewritten as a version-1 checkpoint's), alternating
     * A B A B, so that drift on the machine shows; the faster of each kept. */
    int dropped = 0;
    double t_load = 1e30, t_plain = 1e30;
    for (int round = 0; round < 4; round++) {
        const bool with = round % 2 == 0;
        char *saved = NULL;
        if (rank == 0) {
            if (!with)
                checksums(dir, false, &saved);
            dropped = drop_caches();
        }
        bmt_barrier(bmt_comm_world(ctx), &err);
        t0 = now();
        if (bmt_ckpt_load(list, opt, dir, NULL, &err) < 0)
            DIE("%s", err.text);
        bmt_barrier(bmt_comm_world(ctx), &err);
        const double t = now() - t0;
        if (with && t < t_load)
            t_load = t;
        if (!with && t < t_plain)
            t_plain = t;
        if (rank == 0 && !with)
            checksums(dir, true, &saved);
        bmt_barrier(bmt_comm_world(ctx), &err);
    }

    if (rank == 0) {
        char cmd[4400];
        const long count = (long)(bytes / 4194304.0);
        snprintf(cmd, sizeof(cmd),
                 "dd if=/dev/zero of=%s/dd.bin bs=4M count=%ld conv=fsync status=none", dir, count);
        double t_ddw = timed(cmd);
        drop_caches();
        snprintf(cmd, sizeof(cmd), "dd if=%s/dd.bin of=/dev/null bs=4M status=none", dir);
        double t_ddr = timed(cmd);
        snprintf(cmd, sizeof(cmd), "%s/dd.bin", dir);
        remove(cmd);
        const bmt_layout_t *l = bmt_layout(ctx);
        printf("bench/ckpt: %d blocks x %d MiB f32 + AdamW = %.0f MiB per checkpoint, layout %d x "
               "%d (%d writers), page cache %s\n",
               nblocks, mb, bytes / 1048576.0, l->groups, l->gpus_per_group, l->gpus_per_group,
               dropped ? "dropped before reads" : "NOT dropped (not root): reads may be cached");
        printf("%-6s %10s %10s %10s %10s %10s %7s\n", "op", "MiB", "ours s", "ours GB/s", "dd s",
               "dd GB/s", "ratio");
        printf("%-6s %10.0f %10.3f %10.3f %10.3f %10.3f %7.2f\n", "save", bytes / 1048576.0, t_save,
               bytes / t_save / 1e9, t_ddw, bytes / t_ddw / 1e9, t_ddw / t_save);
        printf("%-6s %10.0f %10.3f %10.3f %10.3f %10.3f %7.2f\n", "load", bytes / 1048576.0, t_load,
               bytes / t_load / 1e9, t_ddr, bytes / t_ddr / 1e9, t_ddr / t_load);
        /* The hash alone, over the same number of bytes in memory. */
        const size_t hb = (size_t)bytes < ((size_t)256 << 20) ? (size_t)bytes : (size_t)256 << 20;
        unsigned char *buf = malloc(hb);
        double t_hash = 0;
        if (buf) {
            memset(buf, 0x5a, hb);
            volatile uint64_t sink = bmt_st_checksum(buf, hb); /* warm */
            double th = now();
            for (int k = 0; k < 4; k++)
                sink ^= bmt_st_checksum(buf, hb);
            t_hash = (now() - th) / (4.0 * (double)hb) * bytes;
            (void)sink;
            free(buf);
        }
        printf("load with checksums %.3f s, without %.3f s: %.2fx (%+.1f%%); XXH3 alone over %.0f "
               "MiB in memory %.3f s (%.1f GB/s, one thread)\n",
               t_load, t_plain, t_load / t_plain, 100.0 * (t_load - t_plain) / t_plain,
               bytes / 1048576.0, t_hash, t_hash > 0 ? bytes / t_hash / 1e9 : 0.0);
    }
    bmt_optim_destroy(opt);
    bmt_blocklist_destroy(list);
    bmt_finalize(ctx);
    return 0;
}
