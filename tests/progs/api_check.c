/* tests/progs/api_check.c — edge cases of the public API that the headers
 * promise (tests/integration/test_api.sh): on a failure, -1 with a message
 * and nothing changed; no crash on a NULL where a caller may pass one.
 *
 *     api_check [none]              one rank; "none" under BMT_BACKEND=none
 *
 * Default (a CPU rank, any backend that moves data):
 *   - bmt_mem_alloc of SIZE_MAX: NULL and a message, the counters unchanged
 *     (rounding it up to the 64-byte alignment wrapped to a tiny block);
 *   - bmt_all_reduce_host_f64 with a NULL communicator or buffer: -1 and a
 *     message (it dereferenced the communicator); 0 doubles: 0;
 *   - bmt_ckpt_save_async without a pending pointer: -1, nothing made;
 *   - bmt_ckpt_save of a list holding a NaN: refused, naming the tensor, and
 *     the directory it would have created does not exist after;
 *   - bmt_ckpt_resolve into a buffer too small: -1, out untouched (it held
 *     the path cut short);
 *   - bmt_ckpt_verify of a train_state.json of version 99 or without
 *     "skipped": -1, as bmt_ckpt_load (verify passed both), and both name
 *     the version (the load's message said "version 0": read after free);
 *   - bmt_ckpt_load with a block gathered by bmt_block_gather: -1 before any
 *     block is loaded (the blocks before it were loaded, unflagged);
 *   - bmt_optim_step over max_skipped: -1, and a second call gives the same
 *     message (the failed call counted nothing);
 *   - bmt_init with a negative or NaN timeout_s: refused;
 *   - a 300-character parameter name in an error: whole, not cut at 200;
 *   - the engine's misuse (optimizer): a step after its list was destroyed
 *     (it read freed memory and returned 0); a schedule giving a negative or
 *     NaN learning rate (used as given), or one past f32's range, then a
 *     good one: the step counter unmoved; lr, eps or weight_decay inf, values
 *     finite in double but not in the f32 update (eps 1e-50 or 1e39, lr or
 *     weight_decay 1e39, their product past 3.4e38: every parameter with a
 *     zero gradient became NaN in a step that returned 0) and overlap 5
 *     refused at create;
 *   - bmt_block_add_param with a NaN or inf init value, a negative standard
 *     deviation, an inverted uniform range or unknown flags: refused; and an
 *     init whose values pass what the dtype holds (a constant 1e39 in f32,
 *     a huge std or scale): refused (they started as inf), up to it: taken;
 *   - bmt_mem_upload and bmt_mem_download with a NULL buffer: -1 (a crash);
 *   - bmt_finalize with a list and optimizer alive finalizes nothing (their
 *     destroy used the freed context), and finalizes after them;
 *   - bmt_block_call_zero_grad on gradients that are not fresh (a group of
 *     one's second micro-batch, which it wiped there and only there): -1;
 *   - checkpoints committed (commits): a NULL err on a good and a failing
 *     save; a re-save of the name DIR/latest names that fails at its last
 *     step (DIR/latest.tmp blocked) leaves the old checkpoint and latest;
 *     the names "latest" and "latest.tmp" refused, nothing made; a load in
 *     an async save's directory spelled otherwise ("sp/" and "./sp") leaves
 *     that save's files alone; a crash's re-saved name left aside
 *     (DIR/.tmp-NAME~old) is what a load through latest reads, and the
 *     next save puts it back.
 * "settings" (two ranks or more): a last rank with another weight decay and
 * a learning rate of another schedule: its first step fails on every rank,
 * naming the setting.
 * "none": the first data collective is refused with "the 'none' backend moves
 * no data", and so is a barrier after it (not "aborted by an earlier error");
 * the world still splits.
 * Output: "ok N - ..." / "not ok N - ..." and "api_check: P passed, F failed";
 * exit 1 on any failure.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bmt/block.h"
#include "bmt/bmt.h"
#include "bmt/ckpt.h"
#include "bmt/device.h"
#include "bmt/optim.h"

static int tap_n, tap_failed;

static void ok(int good, const char *what, const bmt_error_t *err)
{
    printf("%sok %d - %s%s%s\n", good ? "" : "not ", ++tap_n, what, err ? ": " : "",
           err ? err->text : "");
    tap_failed += !good;
}

static void die(const char *what, const bmt_error_t *err)
{
    fprintf(stderr, "api_check: %s: %s\n", what, err->text);
    exit(1);
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Backward: a NaN into the first gradient when nan_grads is set. */
static int nan_grads;
static int nop(void *model, const bmt_block_call_t *call, bmt_error_t *err)
{
    (void)model, (void)call, (void)err;
    return 0;
}
static int bwd(void *model, const bmt_block_call_t *call, bmt_error_t *err)
{
    (void)model, (void)err;
    if (nan_grads)
        ((float *)call->grads[0])[0] += NAN;
    return 0;
}
/* Forward: a NaN into element 5 of block 1's first parameter when plant_nan
 * is set (one rank on the cpu: the parameter is the shard itself), as a
 * corrupted shard; bmt_block_load refuses such a value from a source. */
static int plant_nan;
static int fwd(void *model, const bmt_block_call_t *call, bmt_error_t *err)
{
    (void)model, (void)err;
    if (plant_nan && call->index == 1)
        ((float *)call->params[0])[5] = NAN;
    return 0;
}
static const bmt_block_ops_t ops = { fwd, bwd };

/* Values for bmt_block_load: NaN at element 5 of parameter 0, else 0.5. */
static int nan_source(void *user, const bmt_block_t *block, int param, int64_t first, int64_t count,
                      void *dst, bmt_dtype_t dtype, bmt_error_t *err)
{
    (void)user, (void)block, (void)dtype, (void)err;
    float *d = dst;
    for (int64_t i = 0; i < count; i++)
        d[i] = param == 0 && first + i == 5 ? NAN : 0.5f;
    return 0;
}

/* Two blocks of w (8 x 5) and v (13). */
static bmt_blocklist_t *build(bmt_ctx_t *ctx)
{
    bmt_error_t err;
    bmt_blocklist_t *l = bmt_blocklist_create(ctx, NULL, &err);
    if (l == NULL)
        die("bmt_blocklist_create", &err);
    for (int i = 0; i < 2; i++) {
        char name[32];
        snprintf(name, sizeof(name), "b.%d", i);
        bmt_block_t *b = bmt_block_create(ctx, name, &err);
        int64_t w[2] = { 8, 5 }, v[1] = { 13 };
        if (b == NULL ||
            bmt_block_add_param(b, "w", 2, w, BMT_F32, BMT_INIT_NORMAL_V(0, 0.02), 0, &err) < 0 ||
            bmt_block_add_param(b, "v", 1, v, BMT_F32, BMT_INIT_ZEROS_V, 0, &err) < 0 ||
            bmt_block_build(b, 7, &err) < 0 || bmt_blocklist_append(l, b, &ops, NULL, &err) < 0)
            die("building the model", &err);
    }
    return l;
}

static void memory(bmt_ctx_t *ctx)
{
    bmt_error_t err = { { 0 } };
    bmt_mem_stats_t a, b;
    bmt_mem_get_stats(ctx, &a);
    void *p = bmt_mem_alloc(ctx, SIZE_MAX, &err);
    bmt_mem_get_stats(ctx, &b);
    ok(p == NULL && strstr(err.text, "out of host memory") != NULL,
       "bmt_mem_alloc of SIZE_MAX bytes: NULL and a message", &err);
    ok(memcmp(&a, &b, sizeof(a)) == 0, "bmt_mem_alloc of SIZE_MAX bytes: the counters unchanged",
       NULL);
    bmt_mem_free(ctx, p);
    /* NULL buffers: refused (a crash in memmove), 0 bytes: nothing */
    float host = 1, *dev = bmt_mem_alloc(ctx, sizeof(host), &err);
    int up = bmt_mem_upload(ctx, NULL, &host, sizeof(host), &err);
    int down = up < 0 ? bmt_mem_download(ctx, NULL, dev, sizeof(host), &err) : 0;
    ok(dev && up < 0 && down < 0 && strstr(err.text, "NULL destination") &&
           bmt_mem_upload(ctx, dev, NULL, 0, &err) == 0,
       "bmt_mem_upload and download to NULL: -1 and a message; 0 bytes: 0", &err);
    bmt_mem_free(ctx, dev);
}

static void host_f64(bmt_ctx_t *ctx)
{
    bmt_error_t err = { { 0 } };
    double v = 1;
    ok(bmt_all_reduce_host_f64(NULL, &v, 1, BMT_SUM, &err) < 0 && err.text[0],
       "bmt_all_reduce_host_f64 with a NULL communicator: -1", &err);
    err.text[0] = '\0';
    ok(bmt_all_reduce_host_f64(bmt_comm_world(ctx), NULL, 1, BMT_SUM, &err) < 0 && err.text[0],
       "bmt_all_reduce_host_f64 with a NULL buffer: -1", &err);
    ok(bmt_all_reduce_host_f64(bmt_comm_world(ctx), NULL, 0, BMT_SUM, &err) == 0,
       "bmt_all_reduce_host_f64 of 0 doubles: 0", NULL);
    ok(bmt_all_reduce_host_f64(bmt_comm_world(ctx), &v, 1, BMT_SUM, &err) == 0 && v == 1,
       "bmt_all_reduce_host_f64 of 1 double over one rank: the same value", NULL);
}

/* Values for bmt_block_load: 0.5 everywhere. */
static int half_source(void *user, const bmt_block_t *block, int param, int64_t first,
                       int64_t count, void *dst, bmt_dtype_t dtype, bmt_error_t *err)
{
    (void)user, (void)block, (void)param, (void)first, (void)dtype, (void)err;
    for (int64_t i = 0; i < count; i++)
        ((float *)dst)[i] = 0.5f;
    return 0;
}

/* Element 0 of block i's first parameter (gathered and released), NAN on error. */
static float first_value(bmt_blocklist_t *l, int i)
{
    bmt_error_t err;
    bmt_block_t *b = bmt_blocklist_block(l, i);
    float v = NAN;
    if (bmt_block_gather(b, &err) == 0) {
        v = *(const float *)bmt_block_param(b, 0);
        bmt_block_release(b, &err);
    }
    return v;
}

/* A file's text (free it), or NULL. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    char *text = f ? calloc(1, 1 << 16) : NULL;
    if (text)
        fread(text, 1, (1 << 16) - 1, f);
    if (f)
        fclose(f);
    return text;
}

static void checkpoints(bmt_ctx_t *ctx)
{
    bmt_error_t err = { { 0 } };
    bmt_blocklist_t *l = build(ctx);
    ok(bmt_ckpt_save_async(l, NULL, "async-dir", "ck", NULL, 0, NULL, &err) < 0 &&
           strstr(err.text, "pending") && !exists("async-dir"),
       "bmt_ckpt_save_async without a pending pointer: -1, nothing made", &err);

    /* a good save, then resolve into buffers too small and large enough */
    if (bmt_ckpt_save(l, NULL, "good", "ck", NULL, 0, &err) < 0)
        die("a save", &err);
    char out[4096];
    err.text[0] = '\0';
    memcpy(out, "as-was", 7);
    int r = bmt_ckpt_resolve("good", out, 7, &err); /* "good/ck" needs 8 */
    ok(r < 0 && strstr(err.text, "does not fit") && strcmp(out, "as-was") == 0,
       "bmt_ckpt_resolve through latest into 7 bytes: -1, out untouched (not a path cut short)",
       &err);
    ok(bmt_ckpt_resolve("good", out, sizeof(out), &err) == 0 && strcmp(out, "good/ck") == 0,
       "bmt_ckpt_resolve into a large buffer: good/ck", NULL);
    ok(bmt_ckpt_resolve("good/ck", out, 7, &err) < 0 && strstr(err.text, "does not fit") &&
           strcmp(out, "good/ck") == 0,
       "bmt_ckpt_resolve of a step directory into 7 bytes: -1, out untouched", &err);

    /* what a load refuses, a verify refuses too (it passed both) */
    const char *const edits[2][2] = { { "\"version\": 2", "\"version\": 99" },
                                      { "\"skipped\": 0,", "" } };
    char *state = slurp("good/ck/train_state.json");
    if (state == NULL || system("cp -r good bad-state") != 0)
        die("copying good to bad-state", &err);
    for (int i = 0; i < 2; i++) {
        const char *at = strstr(state, edits[i][0]);
        FILE *f = fopen("bad-state/ck/train_state.json", "w");
        if (at == NULL || f == NULL)
            die("editing bad-state/ck/train_state.json", &err);
        fprintf(f, "%.*s%s%s", (int)(at - state), state, edits[i][1], at + strlen(edits[i][0]));
        fclose(f);
        bmt_error_t lerr = { { 0 } };
        const int lr = bmt_ckpt_load(l, NULL, "bad-state", NULL, &lerr);
        bmt_ckpt_report_t rep;
        err.text[0] = '\0';
        const int vr = bmt_ckpt_verify("bad-state", &rep, &err);
        char what[96];
        snprintf(what, sizeof(what),
                 "bmt_ckpt_verify of a train_state.json %s: -1, as a load, both naming it",
                 i == 0 ? "of version 99" : "without skipped");
        const char *why = i == 0 ? "version 99;" : "step or skipped missing";
        ok(lr < 0 && vr < 0 && strstr(err.text, why) && strstr(lerr.text, why), what,
           strstr(lerr.text, why) ? &err : &lerr);
    }
    free(state);

    /* a load with a block gathered: refused before any block is loaded */
    if (bmt_block_load(bmt_blocklist_block(l, 0), half_source, NULL, &err) < 0 ||
        bmt_block_gather(bmt_blocklist_block(l, 1), &err) < 0)
        die("loading 0.5 into b.0, gathering b.1", &err);
    r = bmt_ckpt_load(l, NULL, "good", NULL, &err);
    if (bmt_block_release(bmt_blocklist_block(l, 1), &err) < 0)
        die("bmt_block_release", &err);
    ok(r < 0 && strstr(err.text, "gathered") && first_value(l, 0) == 0.5f,
       "bmt_ckpt_load with block 1 gathered: -1, block 0 not loaded", &err);

    /* a NaN from a load's source: refused, naming the parameter and element */
    ok(bmt_block_load(bmt_blocklist_block(l, 1), nan_source, NULL, &err) < 0 &&
           strstr(err.text, "loading b.1.w: element 5 is nan: parameters must be finite"),
       "bmt_block_load of a source with a NaN: -1, naming the parameter and element", &err);
    /* a NaN in a parameter (planted by a forward): the save is refused, and
     * the directory it made first is gone again */
    bmt_adamw_config_t oc = BMT_ADAMW_CONFIG_INITIALIZER;
    bmt_step_info_t info;
    bmt_optim_t *o = bmt_adamw_create(l, &oc, &err);
    plant_nan = 1;
    if (o == NULL || bmt_blocklist_forward(l, &err) < 0 ||
        bmt_blocklist_backward(l, true, &err) < 0 || bmt_optim_step(o, &info, &err) < 0)
        die("a step whose forward plants a NaN", &err);
    plant_nan = 0;
    ok(bmt_ckpt_save(l, NULL, "nan-dir", "ck", NULL, 0, &err) < 0 &&
           strstr(err.text, "holds nan") && !exists("nan-dir"),
       "bmt_ckpt_save of a NaN: refused, the directory it made taken away", &err);
    bmt_optim_destroy(o);
    bmt_blocklist_destroy(l);
}

/* The "v" of the user state a load of path gives, or -1. */
static int loaded_v(bmt_blocklist_t *l, const char *path)
{
    bmt_error_t err;
    char *user = NULL;
    int v = -1;
    if (bmt_ckpt_load(l, NULL, path, &user, &err) == 0 && user)
        sscanf(user, "{\"v\": %d}", &v);
    free(user);
    return v;
}

static void commits(bmt_ctx_t *ctx)
{
    bmt_error_t err = { { 0 } };
    bmt_blocklist_t *l = build(ctx);
    ok(bmt_ckpt_save(l, NULL, "nul", "s1", NULL, 0, NULL) == 0 && exists("nul/s1/train_state.json"),
       "bmt_ckpt_save with a NULL err: saved", NULL);
    ok(bmt_ckpt_save(l, NULL, "/proc/no/such", "s1", NULL, 0, NULL) < 0,
       "a failing bmt_ckpt_save with a NULL err: -1, no crash", NULL);

    /* a re-save of latest's checkpoint failing at its last step */
    if (bmt_ckpt_save(l, NULL, "re", "s1", "{\"v\": 1}", 0, &err) < 0)
        die("a save", &err);
    if (mkdir("re/latest.tmp", 0755) != 0)
        die("mkdir re/latest.tmp", &err);
    int rc = bmt_ckpt_save(l, NULL, "re", "s1", "{\"v\": 2}", 0, &err);
    rmdir("re/latest.tmp");
    ok(rc < 0 && strstr(err.text, "latest.tmp") && loaded_v(l, "re") == 1 &&
           !exists("re/.tmp-s1") && !exists("re/.tmp-s1~old"),
       "a re-save failing at latest: -1, the old checkpoint and latest as they were", &err);
    ok(bmt_ckpt_save(l, NULL, "re", "s1", "{\"v\": 3}", 0, &err) == 0 && loaded_v(l, "re") == 3 &&
           !exists("re/.tmp-s1~old"),
       "the same re-save unblocked: the new checkpoint, nothing aside", &err);

    ok(bmt_ckpt_save(l, NULL, "lat", "latest", NULL, 0, &err) < 0 && strstr(err.text, "'latest'") &&
           !exists("lat"),
       "the name latest: refused, nothing made", &err);
    ok(bmt_ckpt_save(l, NULL, "lat", "latest.tmp", NULL, 0, &err) < 0 && !exists("lat"),
       "the name latest.tmp: refused, nothing made", &err);

    /* a load in an async save's directory, spelled otherwise */
    bmt_ckpt_pending_t *p = NULL;
    if (bmt_ckpt_save(l, NULL, "sp", "s0", "{\"v\": 4}", 0, &err) < 0 ||
        bmt_ckpt_save_async(l, NULL, "sp/", "s1", "{\"v\": 5}", 0, &p, &err) < 0)
        die("the saves in sp", &err);
    int v0 = loaded_v(l, "./sp/s0");
    ok(v0 == 4 && bmt_ckpt_finish(p, &err) == 0 && loaded_v(l, "sp") == 5,
       "a load of ./sp/s0 while sp/'s save is in flight: that save completes", &err);

    /* a crash between the renames of a re-save: the old one aside */
    if (bmt_ckpt_save(l, NULL, "cr", "s1", "{\"v\": 6}", 0, &err) < 0 ||
        rename("cr/s1", "cr/.tmp-s1~old") != 0)
        die("the save in cr", &err);
    ok(loaded_v(l, "cr") == 6 && exists("cr/.tmp-s1~old") && !exists("cr/s1"),
       "latest's checkpoint left aside by a crash: a load through latest reads it there", NULL);
    ok(bmt_ckpt_save(l, NULL, "cr", "s2", "{\"v\": 7}", 0, &err) == 0 &&
           exists("cr/s1/train_state.json") && !exists("cr/.tmp-s1~old") &&
           loaded_v(l, "cr/s1") == 6 && loaded_v(l, "cr") == 7,
       "the next save puts it back as cr/s1", &err);
    bmt_blocklist_destroy(l);
}

static void skipped(bmt_ctx_t *ctx)
{
    bmt_error_t err = { { 0 } }, first = { { 0 } };
    bmt_blocklist_t *l = build(ctx);
    bmt_adamw_config_t c = BMT_ADAMW_CONFIG_INITIALIZER;
    c.max_skipped = 1;
    bmt_optim_t *o = bmt_adamw_create(l, &c, &err);
    if (o == NULL)
        die("bmt_adamw_create", &err);
    nan_grads = 1;
    bmt_step_info_t info;
    if (bmt_blocklist_forward(l, &err) < 0 || bmt_blocklist_backward(l, true, &err) < 0 ||
        bmt_optim_step(o, &info, &err) < 0)
        die("the first skipped step", &err);
    ok(info.skipped, "a non-finite gradient: the step is skipped", NULL);
    if (bmt_blocklist_forward(l, &err) < 0 || bmt_blocklist_backward(l, true, &err) < 0)
        die("the second step's forward and backward", &err);
    const int r1 = bmt_optim_step(o, &info, &first);
    const int r2 = bmt_optim_step(o, &info, &err);
    ok(r1 < 0 && strstr(first.text, "2 optimizer steps in a row were skipped"),
       "the second skip in a row, over max_skipped 1: -1", &first);
    ok(r2 < 0 && strcmp(first.text, err.text) == 0,
       "the same call again: the same message (the failed call counted nothing)", &err);
    nan_grads = 0;
    bmt_optim_destroy(o);
    bmt_blocklist_destroy(l);
}

static double sched_value;
static double sched(void *user, int64_t step, double base)
{
    (void)user, (void)step, (void)base;
    return sched_value;
}

/* Backward that zeroes its gradients first (zero_grad) when zero_first is set. */
static int zero_first, zero_rc;
static char zero_err[512];
static int bwd_zero(void *model, const bmt_block_call_t *call, bmt_error_t *err)
{
    (void)model;
    if (zero_first) {
        zero_rc = bmt_block_call_zero_grad(call, -1, err);
        snprintf(zero_err, sizeof(zero_err), "%.500s", zero_rc < 0 ? err->text : "");
        return zero_rc;
    }
    return 0;
}
static const bmt_block_ops_t zero_ops = { nop, bwd_zero };

static void engine_misuse(bmt_ctx_t *ctx)
{
    bmt_error_t err = { { 0 } };
    bmt_step_info_t info;
    /* a step after the list is gone */
    bmt_blocklist_t *l = build(ctx);
    bmt_adamw_config_t c = BMT_ADAMW_CONFIG_INITIALIZER;
    bmt_optim_t *o = bmt_adamw_create(l, &c, &err);
    if (o == NULL || bmt_blocklist_forward(l, &err) < 0 ||
        bmt_blocklist_backward(l, true, &err) < 0)
        die("the orphan's model", &err);
    bmt_blocklist_destroy(l);
    ok(bmt_optim_step(o, &info, &err) < 0 && strstr(err.text, "block list was destroyed"),
       "a step after the list was destroyed: refused", &err);
    bmt_optim_destroy(o);

    /* a schedule's bad learning rate: refused, nothing counted */
    l = build(ctx);
    c.schedule = sched;
    o = bmt_adamw_create(l, &c, &err);
    if (o == NULL)
        die("bmt_adamw_create", &err);
    const double bad[3] = { -0.02, NAN, 1e39 }; /* 1e39: inf in the f32 update */
    if (bmt_blocklist_forward(l, &err) < 0 || bmt_blocklist_backward(l, true, &err) < 0)
        die("forward and backward", &err);
    for (int i = 0; i < 3; i++) { /* a failed step leaves the backward's gradients waiting */
        sched_value = bad[i];
        char what[96];
        snprintf(what, sizeof(what), "a schedule giving lr %g: the step refused", bad[i]);
        ok(bmt_optim_step(o, &info, &err) < 0 &&
               strstr(err.text, "the learning-rate schedule gave"),
           what, &err);
    }
    sched_value = 1e-3;
    ok(bmt_optim_step(o, &info, &err) == 0 && info.step == 1 && info.lr == 1e-3,
       "then a good one: the step is step 1", NULL);
    bmt_optim_destroy(o);
    c.schedule = NULL;
    const struct {
        const char *what;
        double *field;
    } inf_fields[] = { { "lr", &c.lr }, { "eps", &c.eps }, { "weight_decay", &c.weight_decay } };
    for (size_t i = 0; i < sizeof(inf_fields) / sizeof(inf_fields[0]); i++) {
        bmt_adamw_config_t keep = c;
        *inf_fields[i].field = INFINITY;
        char what[64];
        snprintf(what, sizeof(what), "bmt_adamw_create with %s inf: refused", inf_fields[i].what);
        o = bmt_adamw_create(l, &c, &err);
        ok(o == NULL && strstr(err.text, "finite"), what, &err);
        bmt_optim_destroy(o);
        c = keep;
    }
    /* finite in double but not in the f32 update: an eps of 0 or an lr of inf
     * made every parameter with a zero gradient NaN, and the step returned 0 */
    const struct {
        const char *what;
        double *field;
        double v;
    } f32_fields[] = { { "eps", &c.eps, 1e-50 },
                       { "eps", &c.eps, 1e39 },
                       { "lr", &c.lr, 1e39 },
                       { "weight_decay", &c.weight_decay, 1e39 },
                       { "lr x weight_decay", &c.lr, 1e37 } };
    for (size_t i = 0; i < sizeof(f32_fields) / sizeof(f32_fields[0]); i++) {
        bmt_adamw_config_t keep = c;
        *f32_fields[i].field = f32_fields[i].v;
        if (i == 4)
            c.weight_decay = 100;
        char what[96], want[64];
        snprintf(what, sizeof(what), "bmt_adamw_create with %s %g (f32 cannot hold it): refused",
                 f32_fields[i].what, f32_fields[i].v);
        snprintf(want, sizeof(want), "%s is out of f32's range", f32_fields[i].what);
        o = bmt_adamw_create(l, &c, &err);
        ok(o == NULL && strstr(err.text, want), what, &err);
        bmt_optim_destroy(o);
        c = keep;
    }
    c.overlap = 5;
    o = bmt_adamw_create(l, &c, &err);
    ok(o == NULL && strstr(err.text, "overlap is 5; it must be 0 or 1"),
       "bmt_adamw_create with overlap 5: refused", &err);
    bmt_optim_destroy(o);
    bmt_blocklist_destroy(l);

    /* bad init arguments and flags */
    bmt_block_t *b = bmt_block_create(ctx, "i", &err);
    int64_t shape[1] = { 4 };
    const struct {
        bmt_init_t init;
        unsigned flags;
        const char *why, *what;
    } inits[] = {
        { BMT_INIT_NORMAL_V(NAN, 1), 0, "must be finite", "a NaN mean" },
        { BMT_INIT_NORMAL_V(0, INFINITY), 0, "must be finite", "an infinite std" },
        { BMT_INIT_NORMAL_V(0, -1), 0, "the standard deviation (init b) is -1", "a negative std" },
        { BMT_INIT_UNIFORM_V(1, -1), 0, "a uniform init needs a <= b", "an inverted range" },
        { BMT_INIT_ZEROS_V, 0x80, "unknown parameter flags 0x80", "unknown flags" },
        { { BMT_INIT_CONSTANT, 1e39, 0, 1 }, 0, "more than f32 holds", "a constant 1e39" },
        { BMT_INIT_NORMAL_V(0, 1e38), 0, "more than f32 holds", "a std of 1e38" },
        { { BMT_INIT_ONES, 0, 0, 1e300 }, 0, "more than f32 holds", "a scale of 1e300" },
        { BMT_INIT_UNIFORM_V(-1e308, 1e308), 0, "more than f32 holds", "b - a past DBL_MAX" },
    };
    for (size_t i = 0; i < sizeof(inits) / sizeof(inits[0]); i++) {
        char what[96];
        snprintf(what, sizeof(what), "bmt_block_add_param with %s: refused", inits[i].what);
        int r =
            b ? bmt_block_add_param(b, "p", 1, shape, BMT_F32, inits[i].init, inits[i].flags, &err)
              : -1;
        ok(r < 0 && strstr(err.text, inits[i].why), what, &err);
    }
    /* the bounds: bf16's is below f32's (3.3895e38), f64 holds 1e300 */
    const struct {
        bmt_dtype_t dtype;
        bmt_init_t init;
        int good;
    } reach[] = {
        { BMT_BF16, { BMT_INIT_CONSTANT, 3.3e38, 0, 1 }, 1 },
        { BMT_BF16, { BMT_INIT_CONSTANT, 3.39e38, 0, 1 }, 0 },
        { BMT_F32, { BMT_INIT_CONSTANT, 3.39e38, 0, 1 }, 1 },
        { BMT_F64, { BMT_INIT_CONSTANT, 1e300, 0, 1 }, 1 },
        { BMT_F32, BMT_INIT_TRUNC_NORMAL_V(0, 1e38), 1 },
    };
    int reach_ok = b != NULL;
    for (size_t i = 0; i < sizeof(reach) / sizeof(reach[0]) && reach_ok; i++) {
        char pn[16];
        snprintf(pn, sizeof(pn), "r%zu", i);
        reach_ok = (bmt_block_add_param(b, pn, 1, shape, reach[i].dtype, reach[i].init, 0, &err) >=
                    0) == reach[i].good;
    }
    ok(reach_ok, "bmt_block_add_param: inits up to what the dtype holds, not past it", &err);
    bmt_block_destroy(b);

    /* zero_grad on gradients that hold the step's first micro-batch (a group
     * of one: the shards themselves) */
    l = bmt_blocklist_create(ctx, NULL, &err);
    b = l ? bmt_block_create(ctx, "z", &err) : NULL;
    if (b == NULL ||
        bmt_block_add_param(b, "w", 1, shape, BMT_F32, BMT_INIT_ZEROS_V, 0, &err) < 0 ||
        bmt_block_build(b, 7, &err) < 0 || bmt_blocklist_append(l, b, &zero_ops, NULL, &err) < 0)
        die("the zero_grad model", &err);
    zero_first = 1;
    int r1 = bmt_blocklist_forward(l, &err) == 0 ? bmt_blocklist_backward(l, false, &err) : -1;
    int fresh_rc = zero_rc;
    int r2 =
        r1 == 0 && bmt_blocklist_forward(l, &err) == 0 ? bmt_blocklist_backward(l, true, &err) : 0;
    ok(r1 == 0 && fresh_rc == 0 && r2 < 0 && zero_rc < 0 &&
           strstr(zero_err, "grads_fresh is false"),
       "zero_grad: fresh gradients zeroed; the second micro-batch's (the sum so far) refused",
       &err);
    zero_first = 0;
    bmt_blocklist_destroy(l);
}

static void other_settings(bmt_ctx_t *ctx)
{
    bmt_error_t err = { { 0 } };
    bmt_blocklist_t *l = build(ctx);
    const int last = bmt_rank(ctx) == bmt_world_size(ctx) - 1;
    bmt_adamw_config_t c = BMT_ADAMW_CONFIG_INITIALIZER;
    c.schedule = sched;
    sched_value = last ? 2e-3 : 1e-3;
    bmt_optim_t *o = bmt_adamw_create(l, &c, &err);
    bmt_step_info_t info;
    if (o == NULL || bmt_blocklist_forward(l, &err) < 0 ||
        bmt_blocklist_backward(l, true, &err) < 0)
        die("the model", &err);
    ok(bmt_optim_step(o, &info, &err) < 0 &&
           strstr(err.text, "the ranks' optimizer settings differ: the schedule's learning rate is "
                            "0.001 on some and 0.002 on others"),
       "another schedule on the last rank: the first step refused on every rank", &err);
    sched_value = 1e-3;
    bmt_optim_destroy(o);
    bmt_blocklist_destroy(l); /* its step is still waiting: a new model */
    l = build(ctx);
    c.schedule = NULL;
    c.weight_decay = last ? 0.1 : 0.01;
    o = bmt_adamw_create(l, &c, &err);
    if (o == NULL || bmt_blocklist_forward(l, &err) < 0 ||
        bmt_blocklist_backward(l, true, &err) < 0)
        die("the model", &err);
    ok(bmt_optim_step(o, &info, &err) < 0 &&
           strstr(err.text, "weight_decay is 0.01 on some and 0.1 on others"),
       "another weight decay on the last rank: the first step refused on every rank", &err);
    bmt_optim_destroy(o);
    bmt_blocklist_destroy(l);
}

static void long_name(bmt_ctx_t *ctx)
{
    bmt_error_t err = { { 0 } };
    char name[301];
    memset(name, 't', 300);
    name[300] = '\0';
    bmt_block_t *b = bmt_block_create(ctx, "b", &err);
    int64_t shape[1] = { 4 };
    int r =
        b ? bmt_block_add_param(b, name, 1, shape, (bmt_dtype_t)99, BMT_INIT_ZEROS_V, 0, &err) : -1;
    ok(r < 0 && strstr(err.text, name) != NULL && strstr(err.text, "invalid dtype"),
       "a 300-character parameter name is in its error whole", NULL);
    bmt_block_destroy(b);
}

static void none_backend(bmt_ctx_t *ctx)
{
    bmt_error_t err = { { 0 } };
    float *d = bmt_mem_alloc(ctx, 4, &err);
    if (d == NULL)
        die("bmt_mem_alloc", &err);
    ok(bmt_all_reduce(bmt_comm_world(ctx), d, d, 1, BMT_F32, BMT_SUM, &err) < 0 &&
           strstr(err.text, "moves no data"),
       "none: an all-reduce is refused", &err);
    ok(bmt_barrier(bmt_comm_world(ctx), &err) < 0 && strstr(err.text, "moves no data") &&
           !strstr(err.text, "abort"),
       "none: a barrier after it is refused the same way, the communicator not aborted", &err);
    bmt_comm_t *sub = NULL;
    const int r = bmt_comm_split(bmt_comm_world(ctx), 0, 0, "sub", &sub, &err);
    ok(r == 0 && sub != NULL, "none: the world still splits", r == 0 ? NULL : &err);
    bmt_comm_destroy(sub);
    bmt_mem_free(ctx, d);
}

int main(int argc, char **argv)
{
    const int none = argc > 1 && strcmp(argv[1], "none") == 0;
    const int settings = argc > 1 && strcmp(argv[1], "settings") == 0;
    if (argc > 2 || (argc == 2 && !none && !settings)) {
        fprintf(stderr, "usage: api_check [none | settings]\n");
        return 2;
    }
    bmt_ctx_t *ctx = NULL;
    bmt_error_t err;
    if (!none && !settings) { /* a negative or NaN deadline: refused, not taken as "the default" */
        bmt_config_t c = BMT_CONFIG_INITIALIZER;
        c.timeout_s = -1;
        ok(bmt_init(&ctx, &c, &err) < 0 && ctx == NULL && strstr(err.text, "timeout_s must be"),
           "bmt_init with timeout_s -1: refused", &err);
        c.timeout_s = NAN;
        ok(bmt_init(&ctx, &c, &err) < 0 && ctx == NULL, "bmt_init with timeout_s NaN: refused",
           &err);
    }
    if (bmt_init(&ctx, NULL, &err) < 0)
        die("bmt_init", &err);
    if (none) {
        none_backend(ctx);
    } else if (settings) {
        other_settings(ctx);
    } else {
        memory(ctx);
        host_f64(ctx);
        checkpoints(ctx);
        commits(ctx);
        skipped(ctx);
        engine_misuse(ctx);
        long_name(ctx);
    }
    if (!none && !settings) {
        /* bmt_finalize before a list and optimizer are destroyed: it finalizes
         * nothing (their destroy needs the context), and again after them */
        bmt_blocklist_t *l = build(ctx);
        bmt_adamw_config_t c = BMT_ADAMW_CONFIG_INITIALIZER;
        bmt_optim_t *o = bmt_adamw_create(l, &c, &err);
        fflush(stdout); /* its message goes to stderr */
        const int early = bmt_finalize(ctx);
        bmt_optim_destroy(o);
        bmt_blocklist_destroy(l);
        ok(o != NULL && early == -1,
           "bmt_finalize with a list and optimizer alive: -1, nothing finalized, they are "
           "destroyed after it",
           NULL);
    }
    const int fin = bmt_finalize(ctx);
    ok(fin == 0, "bmt_finalize: 0 (the job's work and metrics complete)", NULL);
    ok(bmt_finalize(NULL) == 0, "bmt_finalize(NULL): 0", NULL);
    printf("api_check: %d passed, %d failed\n", tap_n - tap_failed, tap_failed);
    return tap_failed ? 1 : 0;
}
