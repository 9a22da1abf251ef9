/* tests/progs/trust_check.c — what the engine must refuse instead of training
 * on silently (tests/integration/test_trust.sh), one scenario per run:
 *
 *   trust_check MODE [DIR]        under bmlaunch, any layout
 *
 * Each rank builds a small model (blocks "b.0", "b.1", ... of a few f32
 * parameters, no-op callbacks) and then does what MODE says. When the call
 * that should refuse does, every rank prints "trust_check: refused: <its
 * error>" and exits 3 (every rank: the first to exit ends the job, so only its
 * line is sure to be there); when it goes through, rank 0 prints
 * "trust_check: accepted" and every rank exits 0.
 *
 *   same          every rank alike: the first forward is accepted
 *   seed-rank     rank r builds with seed 7 + r: the first forward refuses
 *   name-rank     rank 1 names a parameter "w1" instead of "w"
 *   init-rank     rank 1 initializes a parameter uniform instead of normal
 *   shape-rank    rank 1 gives a parameter 9 rows instead of 8
 *   loaded-seed   seeds differ per rank, but every rank then loads the same
 *                 values from DIR (a checkpoint of "same"): accepted
 *   save          "same", one step, then save DIR/ck (for the load modes)
 *   extra-block   load DIR/ck into a model with one block fewer: refused
 *   missing-block load DIR/ck into a model with one block more: refused
 *   extra-tensor  load DIR/ck into a model whose b.1 lacks parameter "v"
 *   adamw-twice   a second bmt_adamw_create on the list while the first lives
 *   save-fails    a save that must fail (under tests/plugins/failio.so: an fsync
 *                 or a malloc made to fail): refused, and the process holds as
 *                 many open files after it as before ("trust_check: fds N N",
 *                 every rank)
 *   long-name     like save, with one parameter named by 997 'q's (so that its
 *                 names have sizes no other allocation has)
 *   adamw-v1      a config of bmt_adamw_config_t version 1 (before max_skipped) is
 *                 accepted; version 3, or a size smaller than version 1's, refused
 *   null-shape    bmt_block_add_param with a NULL shape
 */
#include <dirent.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bmt/block.h"
#include "bmt/bmt.h"
#include "bmt/ckpt.h"
#include "bmt/optim.h"

/* Open file descriptors of this process. */
static int count_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return -1;
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n;
}

static int nop(void *model, const bmt_block_call_t *call, bmt_error_t *err)
{
    (void)model, (void)call, (void)err;
    return 0;
}

static const bmt_block_ops_t ops = { nop, nop };
static int rank;

static int done(bool refused, const bmt_error_t *err)
{
    if (refused)
        printf("trust_check: refused: %s\n", err->text);
    else if (rank == 0)
        printf("trust_check: accepted\n");
    fflush(stdout);
    return refused ? 3 : 0;
}

static void die(const char *what, const bmt_error_t *err)
{
    fprintf(stderr, "trust_check: rank %d: %s: %s\n", rank, what, err->text);
    exit(1);
}

/* nblocks blocks of parameters w (8 x 5, normal) and v (13, zeros; absent from
 * b.1 when drop_v), with the twists the mode asks for. */
static bmt_blocklist_t *build(bmt_ctx_t *ctx, const char *mode, int nblocks, bool drop_v)
{
    bmt_error_t err;
    bmt_blocklist_t *l = bmt_blocklist_create(ctx, NULL, &err);
    if (l == NULL)
        die("bmt_blocklist_create", &err);
    for (int i = 0; i < nblocks; i++) {
        char name[32];
        snprintf(name, sizeof(name), "b.%d", i);
        bmt_block_t *b = bmt_block_create(ctx, name, &err);
        int64_t w[2] = { 8, 5 }, v[1] = { 13 };
        bmt_init_t wi = BMT_INIT_NORMAL_V(0, 0.02);
        const char *wname = "w";
        uint64_t seed = 7;
        if (rank == 1 && strcmp(mode, "name-rank") == 0)
            wname = "w1";
        if (rank == 1 && strcmp(mode, "init-rank") == 0)
            wi = (bmt_init_t)BMT_INIT_UNIFORM_V(-0.02, 0.02);
        if (rank == 1 && strcmp(mode, "shape-rank") == 0)
            w[0] = 9;
        char longname[1000];
        if (strcmp(mode, "long-name") == 0 && i == 1) {
            memset(longname, 'q', 997);
            longname[997] = '\0';
            wname = longname;
        }
        if (strcmp(mode, "seed-rank") == 0 || strcmp(mode, "loaded-seed") == 0)
            seed += (uint64_t)rank;
        if (b == NULL || bmt_block_add_param(b, wname, 2, w, BMT_F32, wi, 0, &err) < 0 ||
            (!(drop_v && i == 1) &&
             bmt_block_add_param(b, "v", 1, v, BMT_F32, BMT_INIT_ZEROS_V, 0, &err) < 0) ||
            bmt_block_build(b, seed, &err) < 0 || bmt_blocklist_append(l, b, &ops, NULL, &err) < 0)
            die("building the model", &err);
    }
    return l;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: trust_check MODE [DIR]\n");
        return 2;
    }
    const char *mode = argv[1], *dir = argc > 2 ? argv[2] : ".";
    bmt_ctx_t *ctx;
    bmt_error_t err;
    if (bmt_init(&ctx, NULL, &err) < 0) {
        fprintf(stderr, "trust_check: %s\n", err.text);
        return 1;
    }
    rank = bmt_rank(ctx);
    int rc = 0;
    char ck[4200];
    snprintf(ck, sizeof(ck), "%s/ck", dir);
    if (strcmp(mode, "null-shape") == 0) {
        bmt_block_t *b = bmt_block_create(ctx, "b.0", &err);
        rc = done(bmt_block_add_param(b, "w", 2, NULL, BMT_F32, BMT_INIT_ZEROS_V, 0, &err) < 0,
                  &err);
        bmt_block_destroy(b);
    } else if (strcmp(mode, "adamw-twice") == 0) {
        bmt_blocklist_t *l = build(ctx, "same", 2, false);
        bmt_optim_t *o = bmt_adamw_create(l, NULL, &err);
        if (o == NULL)
            die("bmt_adamw_create", &err);
        bmt_optim_t *o2 = bmt_adamw_create(l, NULL, &err);
        rc = done(o2 == NULL, &err);
        bmt_optim_destroy(o2);
        bmt_optim_destroy(o);
        /* after the first is gone, a new one is fine */
        if ((o = bmt_adamw_create(l, NULL, &err)) == NULL)
            die("bmt_adamw_create after bmt_optim_destroy", &err);
        bmt_optim_destroy(o);
        bmt_blocklist_destroy(l);
    } else if (strcmp(mode, "adamw-v1") == 0) {
        bmt_blocklist_t *l = build(ctx, "same", 2, false);
        bmt_adamw_config_t c = BMT_ADAMW_CONFIG_INITIALIZER;
        c.version = 1;
        c.size = offsetof(bmt_adamw_config_t, max_skipped);
        bmt_optim_t *o = bmt_adamw_create(l, &c, &err);
        if (o == NULL)
            die("bmt_adamw_create of a version-1 config", &err);
        bmt_optim_destroy(o);
        c.size = offsetof(bmt_adamw_config_t, max_skipped) - 8;
        bmt_optim_t *small = bmt_adamw_create(l, &c, &err);
        c = (bmt_adamw_config_t)BMT_ADAMW_CONFIG_INITIALIZER;
        c.version = 3;
        bmt_optim_t *v3 = small ? NULL : bmt_adamw_create(l, &c, &err);
        rc = done(small == NULL && v3 == NULL, &err);
        bmt_optim_destroy(small);
        bmt_optim_destroy(v3);
        bmt_blocklist_destroy(l);
    } else if (strcmp(mode, "save") == 0 || strcmp(mode, "long-name") == 0 ||
               strcmp(mode, "save-fails") == 0) {
        const bool fails = strcmp(mode, "save-fails") == 0;
        bmt_blocklist_t *l = build(ctx, fails ? "long-name" : mode, 3, false);
        bmt_optim_t *o = bmt_adamw_create(l, NULL, &err);
        if (o == NULL || bmt_blocklist_forward(l, &err) < 0 ||
            bmt_blocklist_backward(l, true, &err) < 0 || bmt_optim_step(o, NULL, &err) < 0)
            die("one step", &err);
        const int before = count_fds();
        const int s = bmt_ckpt_save(l, o, dir, "ck", NULL, 0, &err);
        const int after = count_fds();
        if (!fails && s < 0)
            die("the save", &err);
        printf("trust_check: fds %d %d\n", before, after); /* before done(): the same rank's */
        rc = done(s < 0, &err);
        bmt_optim_destroy(o);
        bmt_blocklist_destroy(l);
    } else if (strcmp(mode, "extra-block") == 0 || strcmp(mode, "missing-block") == 0 ||
               strcmp(mode, "extra-tensor") == 0) {
        int nb = strcmp(mode, "extra-block") == 0 ? 2 : strcmp(mode, "missing-block") == 0 ? 4 : 3;
        bmt_blocklist_t *l = build(ctx, "same", nb, strcmp(mode, "extra-tensor") == 0);
        bmt_optim_t *o = bmt_adamw_create(l, NULL, &err);
        if (o == NULL)
            die("bmt_adamw_create", &err);
        rc = done(bmt_ckpt_load(l, o, ck, NULL, &err) < 0, &err);
        bmt_optim_destroy(o);
        bmt_blocklist_destroy(l);
    } else {
        bool load = strcmp(mode, "loaded-seed") == 0;
        bmt_blocklist_t *l = build(ctx, mode, 3, false);
        if (load && bmt_ckpt_load(l, NULL, ck, NULL, &err) < 0)
            die("bmt_ckpt_load", &err);
        rc = done(bmt_blocklist_forward(l, &err) < 0, &err);
        bmt_blocklist_destroy(l);
    }
    bmt_finalize(ctx);
    return rc;
}
