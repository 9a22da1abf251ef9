/* runtime/optim.c — AdamW on sharded f32 master weights.
 *
 * State per block and dtype group, all shards (BMT_MEM_OPTIM): f32 master
 * weights (for f32 parameters the parameter shard itself, so nothing is stored
 * twice), first and second moments. Weight decay differs per parameter
 * (BMT_PARAM_NO_DECAY), so a shard is updated in segments: the pieces of each
 * parameter that fall into this rank's shard. Gaps and padding are never
 * touched; their gradients are zero and their values stay zero.
 *
 * master_only (bmt/optim.h): for a bf16 group the master is then the only copy
 * of the values: the block's shard is freed at creation (d->param NULL,
 * d->master set; gathers round the master, block.c) and made again from the
 * master by bmt_optim_destroy, unless the list went first (optim_orphan). In
 * a group of one the forward's deferred update of such a block writes the
 * rounding itself, into the block's gathered buffer (bmt_block.update_dst,
 * set by the schedule around the flush): one pass over the master, not two.
 *
 * master_only 2, the split master: for a bf16 group the f32 master is kept as
 * two 16-bit halves, the block's bf16 shard itself (hi: the master rounded to
 * nearest, ties away from zero) and s->lo (the rest of its bits), and never
 * as an f32 array: the memory of master_only 1 (4 bytes a parameter), the
 * gathers of 0 (they copy the shard; in a group of one the layers read it in
 * place), and an update that moves 28 bytes a parameter instead of 30
 * (kern_adamw_split, runtime/cuda/kernels_cuda.h). The master is kept
 * losslessly (from the same gradients the same master bits as 0 and 1); the
 * shard differs from their rounding (ties to even) only where the master lies
 * exactly half-way between two bf16 values, so runs part from there.
 * Checkpoints see the joined master (ckpt.c, optim_view's lo).
 *
 * The gradient norm is summed per shard on the device (kern_sumsq, in double,
 * deterministic), read by the host (the step's one synchronization point: it
 * decides skipping and clipping), and summed over the group with an all-reduce:
 * after the cross-group all-reduce every replica holds the same shards, so the
 * group's sum is the whole model's. The last micro-batch's backward takes the
 * sums as each shard becomes final, off the compute stream (schedule.c,
 * shard_final); the step computes them itself only when it has none.
 *
 * overlap (the default): the step ends once it knows the update's arguments;
 * each state's AdamW is enqueued later, on the replica stream, by
 * blocklist_flush: the next forward calls it for each block just before its
 * gather (the gather waits for it), so the update of block i + 1 runs under
 * the forward of block i. Every other reader of the state flushes everything
 * first. The arguments are fixed at the step, so the bits are the same.
 *
 * Layer: the update, above the block list (schedule.c) and storage (block.c):
 * it calls them, never the reverse; the schedule reaches the deferred update
 * and the orphaning through the hooks installed here (list_state.flush and
 * .orphan).
 */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block.h"
#include "ctx.h"
#include "error.h"
#include "fault.h"
#include "kernels.h"

struct segment {
    size_t first; /* element offset within the shard */
    size_t n;
    bool decay;
};

struct ostate {
    bool pending; /* the last step's update is not enqueued yet (overlap) */
    bmt_block_t *block;
    struct dgroup *d;
    float *master; /* (shard) f32: d->param itself for f32 groups; NULL when split */
    bool own_master;
    uint16_t *lo; /* (shard) master_only 2, bf16 groups: the master's low half (d->param is hi) */
    float *m, *v; /* (shard) f32 */
    struct segment *seg;
    int nseg;
};

struct bmt_optim {
    bmt_ctx_t *ctx;
    bmt_blocklist_t *list;
    bmt_adamw_config_t cfg;
    struct ostate *s;
    int ns;
    double *sums;  /* (ns) device doubles: per-state sums of squares */
    double *hsums; /* (ns) host copy */
    int64_t step;
    int64_t skipped;
    int64_t skipped_run;    /* skipped steps in a row, up to the last one */
    bool broken;            /* a step failed half-way: shards may be half updated */
    bool half_loaded;       /* a checkpoint load failed half-way (optim_set_loaded) */
    bool settings_checked;  /* every rank's settings compared (same_settings) */
    bool holds;             /* master_only took the bf16 shards: give them back at destroy */
    bool orphaned;          /* the list was destroyed first: never touch its blocks */
    bool is_pending;        /* list_state.pending is this optimizer */
    bool sums_owner;        /* list_state.optim is this optimizer */
    kern_adamw_args_t pend; /* the pending update's arguments (weight decay per segment) */
    int npending;           /* states with pending set */
};

/* list_state.orphan: the list went before this optimizer; never touch its
 * blocks again. */
static void optim_orphan(bmt_optim_t *o) { o->orphaned = true; }

static int optim_apply(bmt_optim_t *o, const bmt_block_t *b, bool drop, bmt_error_t *err);

/* list_state.flush */
static int optim_flush(bmt_optim_t *o, bmt_block_t *b, bool drop, bmt_error_t *err)
{
    return optim_apply(o, b, drop, err);
}

/* master_only: the blocks' bf16 shards again, from the masters (destroy). A
 * failure leaves a group without values; its next gather says so. */
static void give_back_shards(bmt_optim_t *o)
{
    bmt_ctx_t *ctx = o->ctx;
    bmt_error_t err;
    for (int i = 0; i < o->ns; i++) {
        struct ostate *s = &o->s[i];
        struct dgroup *d = s->d;
        if (d->param != NULL || d->master != s->master)
            continue;
        void *p = bmt_alloc(ctx, BMT_MEM_PARAM, dsize(d->dtype, d->shard), &err);
        if (p == NULL || block_shard_values(ctx, d, p, NULL, &err) < 0 || /* the master, rounded */
            device_sync_legacy(ctx, &err) < 0) {
            fprintf(stderr, "bmt: rank %d: block %.200s loses its parameters: %s\n", ctx->rank,
                    s->block->name, err.text);
            bmt_free(ctx, p);
            d->master = NULL;
            continue;
        }
        d->param = p;
        d->master = NULL;
    }
    blocklist_state(o->list)->master_owner = NULL;
}

void bmt_optim_destroy(bmt_optim_t *o)
{
    if (o == NULL)
        return;
    bmt_ctx_t *ctx = o->ctx;
    ctx->live_optims--;
    if (!o->orphaned && o->npending > 0) {
        bmt_error_t err;
        if (optim_apply(o, NULL, true, &err) < 0 || bmt_device_synchronize(ctx, &err) < 0)
            fprintf(stderr, "bmt: rank %d: the last step's update failed: %s\n", ctx->rank,
                    err.text); /* still destroyed; the values are as they are */
    }
    if (!o->orphaned && (o->is_pending || o->sums_owner)) {
        struct list_state *st = blocklist_state(o->list);
        if (o->is_pending)
            st->pending = NULL;
        if (o->sums_owner) {
            st->optim = NULL;
            st->sums = NULL;
            st->sums_ready = false;
        }
    }
    if (o->holds && !o->orphaned)
        give_back_shards(o);
    for (int i = 0; i < o->ns; i++) {
        struct ostate *s = &o->s[i];
        if (s->own_master) /* s->d may be gone: never look at it here */
            bmt_free(ctx, s->master);
        bmt_free(ctx, s->lo);
        bmt_free(ctx, s->m);
        bmt_free(ctx, s->v);
        free(s->seg);
    }
    bmt_free(ctx, o->sums);
    free(o->hsums);
    free(o->s);
    free(o);
}

static int make_segments(struct ostate *s, bmt_error_t *err)
{
    const bmt_block_t *b = s->block;
    s->seg = calloc((size_t)(b->nparams ? b->nparams : 1), sizeof(*s->seg));
    if (s->seg == NULL)
        return errprintf(err, "out of memory");
    for (int i = 0; i < b->nparams; i++) {
        const struct param *p = &b->params[i];
        if (&b->groups[p->group] != s->d)
            continue;
        size_t lo, hi;
        if (block_in_shard(p, s->d, &lo, &hi))
            s->seg[s->nseg++] = (struct segment){ lo - s->d->shard_first, hi - lo,
                                                  !(p->flags & BMT_PARAM_NO_DECAY) };
    }
    return 0;
}

/* Whether 1 - lr x weight_decay, as the update computes it in f32, is finite. */
static bool lr_decay_fits(double lr, double weight_decay)
{
    return lr <= FLT_MAX && weight_decay <= FLT_MAX && isfinite((float)lr * (float)weight_decay);
}

bmt_optim_t *bmt_adamw_create(bmt_blocklist_t *list, const bmt_adamw_config_t *cfg,
                              bmt_error_t *err)
{
    bmt_adamw_config_t defaults = BMT_ADAMW_CONFIG_INITIALIZER;
    if (list == NULL) {
        errprintf(err, "bmt_adamw_create: list is NULL");
        return NULL;
    }
    bmt_ctx_t *ctx = blocklist_ctx(list);
    if (cfg == NULL)
        cfg = &defaults;
    /* Version 1 lacked max_skipped: such a config gets its default. */
    bmt_adamw_config_t v1 = BMT_ADAMW_CONFIG_INITIALIZER;
    const size_t v1_size = offsetof(bmt_adamw_config_t, max_skipped);
    if (cfg->magic == BMT_ADAMW_CONFIG_MAGIC && cfg->version == 1 && cfg->size >= v1_size) {
        memcpy(&v1, cfg, v1_size);
        v1.size = sizeof(v1);
        v1.version = BMT_ADAMW_CONFIG_VERSION;
        v1.max_skipped = BMT_ADAMW_MAX_SKIPPED_DEFAULT;
        cfg = &v1;
    }
    if (cfg->magic != BMT_ADAMW_CONFIG_MAGIC || cfg->size < sizeof(*cfg) ||
        cfg->version != BMT_ADAMW_CONFIG_VERSION) {
        errprintf(err, "bmt_adamw_create: the config was not set up with "
                       "BMT_ADAMW_CONFIG_INITIALIZER of this bmt");
        return NULL;
    }
    if (cfg->master_only < 0 || cfg->master_only > 2) {
        errprintf(err,
                  "rank %d: bmt_adamw_create: master_only is %d; it must be 0 (a bf16 shard and "
                  "an f32 master), 1 (the f32 master alone) or 2 (the master split in two "
                  "16-bit halves, one of them the bf16 shard)",
                  ctx->rank, cfg->master_only);
        return NULL;
    }
    if (!(cfg->lr >= 0) || !(cfg->beta1 >= 0 && cfg->beta1 < 1) ||
        !(cfg->beta2 >= 0 && cfg->beta2 < 1) || !(cfg->eps > 0) || !(cfg->weight_decay >= 0) ||
        !(cfg->clip_norm >= 0) || cfg->max_skipped < 0 || !isfinite(cfg->lr) ||
        !isfinite(cfg->eps) || !isfinite(cfg->weight_decay) || !isfinite(cfg->clip_norm)) {
        errprintf(err,
                  "rank %d: bmt_adamw_create: need finite lr >= 0, 0 <= betas < 1, finite eps > "
                  "0, finite weight_decay >= 0, finite clip_norm >= 0, max_skipped >= 0",
                  ctx->rank);
        return NULL;
    }
    /* The update computes in f32 (kern_adamw_scalars_t): a value that passes in
     * double but not there would train on an eps of 0 or an lr of inf, making
     * every parameter with a zero gradient NaN in a step that returns 0. */
    const char *f32_bad = cfg->eps > FLT_MAX || (float)cfg->eps == 0.0f ? "eps"
                          : cfg->lr > FLT_MAX                           ? "lr"
                          : cfg->weight_decay > FLT_MAX                 ? "weight_decay"
                          : !lr_decay_fits(cfg->lr, cfg->weight_decay)  ? "lr x weight_decay"
                                                                        : NULL;
    if (f32_bad != NULL) {
        errprintf(err,
                  "rank %d: bmt_adamw_create: %s is out of f32's range (lr %g, eps %g, "
                  "weight_decay %g), which AdamW computes in: eps must be at least %g and, like "
                  "lr, weight_decay and lr x weight_decay, at most %g",
                  ctx->rank, f32_bad, cfg->lr, cfg->eps, cfg->weight_decay, (double)FLT_TRUE_MIN,
                  (double)FLT_MAX);
        return NULL;
    }
    if (cfg->overlap != 0 && cfg->overlap != 1) {
        errprintf(err, "rank %d: bmt_adamw_create: overlap is %d; it must be 0 or 1", ctx->rank,
                  cfg->overlap);
        return NULL;
    }
    if (blocklist_state(list)->optim) {
        errprintf(err,
                  "rank %d: bmt_adamw_create: this block list already has an optimizer; "
                  "destroy it first (bmt_optim_destroy): two would update the same shards",
                  ctx->rank);
        return NULL;
    }
    if (blocklist_state(list)->master_owner) {
        errprintf(err,
                  "rank %d: bmt_adamw_create: another optimizer (master_only) holds this list's "
                  "parameters; destroy it first",
                  ctx->rank);
        return NULL;
    }
    /* With an optimizer each block has a second checkpoint file, NAME.optim:
     * blocks "x" and "x.optim" would share one (bmt_blocklist_append checked
     * the rest). */
    for (int i = 0; i < bmt_blocklist_size(list); i++)
        for (int j = 0; j < i; j++) {
            bmt_block_t *a = bmt_blocklist_block(list, i), *b = bmt_blocklist_block(list, j);
            if (a->index == i && b->index == j && block_name_clash(a, b, true, err) < 0) {
                errprefix(err, "rank %d: bmt_adamw_create: ", ctx->rank);
                return NULL;
            }
        }
    /* The parameter shards may still be written by the streams (a forward,
     * a step of another optimizer, deferred or not): read them settled. */
    if (blocklist_flush(list, NULL, true, err) < 0 || bmt_device_synchronize(ctx, err) < 0)
        return NULL;
    bmt_optim_t *o = calloc(1, sizeof(*o));
    if (o == NULL) {
        errprintf(err, "rank %d: out of memory", ctx->rank);
        return NULL;
    }
    o->ctx = ctx;
    ctx->live_optims++;
    o->list = list;
    o->cfg = *cfg;
    int total = 0;
    for (int i = 0; i < bmt_blocklist_size(list); i++)
        if (bmt_blocklist_block(list, i)->index == i) /* a tied block's second use: once */
            total += bmt_blocklist_block(list, i)->ngroups;
    o->s = calloc((size_t)(total ? total : 1), sizeof(*o->s));
    o->hsums = calloc((size_t)(total ? total : 1), sizeof(double));
    if (o->s == NULL || o->hsums == NULL) {
        errprintf(err, "rank %d: out of memory", ctx->rank);
        goto fail;
    }
    for (int i = 0; i < bmt_blocklist_size(list); i++) {
        bmt_block_t *b = bmt_blocklist_block(list, i);
        if (b->index != i)
            continue;
        for (int g = 0; g < b->ngroups; g++) {
            struct ostate *s = &o->s[o->ns++];
            s->block = b;
            s->d = &b->groups[g];
            s->d->sum_slot = o->ns - 1;
            size_t bytes = dsize(BMT_F32, s->d->shard);
            if (s->d->dtype == BMT_F32) {
                s->master = s->d->param;
            } else if (cfg->master_only == 2 && s->d->dtype == BMT_BF16) {
                /* the bf16 shard is hi exactly (its f32 value rounds to
                 * itself), so the master's other half starts at zero */
                const size_t lo_bytes = dsize(BMT_BF16, s->d->shard);
                if (s->d->param == NULL) { /* an earlier master_only 1 could not give it back */
                    errprintf(err, "rank %d: bmt_adamw_create: block %.900s has no parameter shard",
                              ctx->rank, s->block->name);
                    goto fail;
                }
                s->lo = bmt_alloc(ctx, BMT_MEM_OPTIM, lo_bytes, err);
                if (s->lo == NULL || kern_zero(ctx, NULL, s->lo, lo_bytes, err) < 0)
                    goto fail;
            } else {
                s->master = bmt_alloc(ctx, BMT_MEM_OPTIM, bytes, err);
                s->own_master = s->master != NULL;
                if (s->master == NULL || kern_cast(ctx, NULL, s->master, BMT_F32, s->d->param,
                                                   s->d->dtype, s->d->shard, err) < 0)
                    goto fail;
                /* master_only: the shard goes as soon as its master is settled,
                 * so that the shards never all coexist with the optimizer's
                 * state (a failure further on gives them back: destroy). */
                if (cfg->master_only == 1) {
                    if (device_sync_legacy(ctx, err) < 0)
                        goto fail;
                    bmt_free(ctx, s->d->param);
                    s->d->param = NULL;
                    s->d->master = s->master;
                    o->holds = true;
                }
            }
            s->m = bmt_alloc(ctx, BMT_MEM_OPTIM, bytes, err);
            s->v = s->m ? bmt_alloc(ctx, BMT_MEM_OPTIM, bytes, err) : NULL;
            if (s->v == NULL || kern_zero(ctx, NULL, s->m, bytes, err) < 0 ||
                kern_zero(ctx, NULL, s->v, bytes, err) < 0 || make_segments(s, err) < 0)
                goto fail;
        }
    }
    o->sums = bmt_alloc(ctx, BMT_MEM_WORKSPACE, sizeof(double) * (size_t)(total ? total : 1), err);
    if (o->sums == NULL || device_sync_legacy(ctx, err) < 0)
        goto fail;
    struct list_state *st = blocklist_state(list);
    blocklist_seal(list); /* a block appended now would be missed */
    st->flush = optim_flush;
    st->orphan = optim_orphan;
    if (o->holds)
        st->master_owner = o;
    if (st->optim) /* an older optimizer of the list: its sums are no longer taken */
        st->optim->sums_owner = false;
    st->optim = o;
    st->sums = o->sums;
    st->sums_ready = false;
    o->sums_owner = true;
    return o;
fail:
    bmt_optim_destroy(o);
    return NULL;
}

/* Sum of squares of every gradient shard, over the group: the whole model's. */
static int grad_sumsq(bmt_optim_t *o, double *total, bmt_error_t *err)
{
    bmt_ctx_t *ctx = o->ctx;
    void *compute = device_stream(ctx, DEVICE_COMPUTE);
    struct list_state *st = blocklist_state(o->list);
    const bool ready = o->sums_owner && st->sums_ready; /* the backward took them */
    st->sums_ready = false;
    for (int i = 0; i < o->ns && !ready; i++) {
        if (o->s[i].d->grad == NULL) /* every block's backward makes its shards */
            return errprintf(err, "rank %d: internal: block %.900s has no gradient shard",
                             ctx->rank, o->s[i].block->name);
        if (kern_sumsq(ctx, compute, o->s[i].d->grad, o->s[i].d->shard, o->sums, i, err) < 0)
            return -1;
    }
    if (bmt_mem_download(ctx, o->hsums, o->sums, sizeof(double) * (size_t)o->ns, err) < 0)
        return -1;
    double local = 0;
    for (int i = 0; i < o->ns; i++) /* fixed order: the same bits on every run */
        local += o->hsums[i];
    /* The group's sum, through a device double (the nccl backend needs one). */
    if (ctx->layout.gpus_per_group > 1) {
        if (bmt_mem_upload(ctx, o->sums, &local, sizeof(local), err) < 0 ||
            bmt_all_reduce(ctx->group_comm, o->sums, o->sums, 1, BMT_F64, BMT_SUM, err) < 0 ||
            bmt_mem_download(ctx, &local, o->sums, sizeof(local), err) < 0)
            return -1;
    }
    *total = local;
    return 0;
}

/* Did every rank end its micro-batches where this one did? Each backward
 * all-reduced its flags on the comm stream (schedule.c, backward_flags); this
 * rank's last one said "last", so every rank's must have. Read after the
 * step's synchronization, before the step's first collective. */
static int same_microbatches(bmt_optim_t *o, bmt_error_t *err)
{
    bmt_ctx_t *ctx = o->ctx;
    const struct list_state *st = blocklist_state(o->list);
    if (ctx->world == 1 || st->flags == NULL)
        return 0;
    double f[4];
    if (bmt_mem_download(ctx, f, st->flags, sizeof(f), err) < 0)
        return -1;
    return blocklist_flags_agree(o->list, f, err);
}

/* Every rank must update with the same rule: at the first step that updates,
 * the settings and the schedule's first learning rate are compared over the
 * world (one all-reduce), and a difference is named. Each rank applies AdamW
 * to its own shards, so ranks with other settings would train a model that
 * no rank holds whole, and nothing else would notice. */
static int same_settings(bmt_optim_t *o, double lr, bmt_error_t *err)
{
    bmt_ctx_t *ctx = o->ctx;
    if (o->settings_checked || ctx->world == 1)
        return 0;
    const struct {
        const char *name;
        double v;
    } f[] = {
        { "lr", o->cfg.lr },
        { "the schedule's learning rate", lr },
        { "weight_decay", o->cfg.weight_decay },
        { "clip_norm", o->cfg.clip_norm },
        { "beta1", o->cfg.beta1 },
        { "beta2", o->cfg.beta2 },
        { "eps", o->cfg.eps },
        { "master_only", o->cfg.master_only },
        { "overlap", o->cfg.overlap },
        { "max_skipped", o->cfg.max_skipped },
        { "a schedule (1) or none (0)", o->cfg.schedule != NULL },
    };
    enum {
        N = sizeof(f) / sizeof(f[0])
    };
    double v[2 * N];
    for (int i = 0; i < N; i++)
        v[2 * i] = f[i].v, v[2 * i + 1] = -f[i].v;
    if (bmt_all_reduce_host_f64(ctx->world_comm, v, 2 * N, BMT_MAX, err) < 0)
        return errprefix(err, "checking that every rank has the same optimizer settings: ");
    for (int i = 0; i < N; i++)
        if (v[2 * i] != f[i].v || -v[2 * i + 1] != f[i].v)
            return errprintf(err,
                             "rank %d: the ranks' optimizer settings differ: %s is %.9g on some "
                             "and %.9g on others (this rank %.9g); every rank must create its "
                             "optimizer with the same bmt_adamw_config_t and schedule",
                             ctx->rank, f[i].name, -v[2 * i + 1], v[2 * i], f[i].v);
    o->settings_checked = true;
    return 0;
}

/* BMT_FAULT=nan:RANK:STEP (tests only): the first element of this rank's
 * first parameter shard becomes NaN, master and parameter, once whatever the
 * step left pending is applied. */
static void plant_nan(bmt_optim_t *o)
{
    bmt_ctx_t *ctx = o->ctx;
    bmt_error_t err;
    if (blocklist_flush(o->list, NULL, true, &err) < 0 || bmt_device_synchronize(ctx, &err) < 0)
        return;
    for (int i = 0; i < o->ns; i++) {
        struct ostate *s = &o->s[i];
        if (s->nseg == 0)
            continue;
        const size_t at = s->seg[0].first;
        const float nan32 = NAN;
        const uint16_t nan16 = 0x7fc0;
        if (s->master) /* split: the NaN shard makes a NaN master */
            bmt_mem_upload(ctx, s->master + at, &nan32, sizeof(nan32), &err);
        if (s->d->param && s->d->dtype == BMT_BF16)
            bmt_mem_upload(ctx, (uint16_t *)s->d->param + at, &nan16, sizeof(nan16), &err);
        return;
    }
}

/* The step has consumed the gradient shards: they go back to the pool in
 * stream order after the step's kernels, and the next backward makes them
 * anew (zeroed, or left to callbacks that overwrite them: block_need_grads). */
static void drop_grads(bmt_optim_t *o)
{
    void *compute = device_stream(o->ctx, DEVICE_COMPUTE);
    for (int i = 0; i < o->ns; i++)
        block_drop_grads(o->s[i].block, (int)(o->s[i].d - o->s[i].block->groups), compute);
}

/* Enqueue state s's AdamW (every segment) with arguments a on stream. */
static int update_state(bmt_optim_t *o, struct ostate *s, kern_adamw_args_t a, void *stream,
                        bmt_error_t *err)
{
    for (int k = 0; k < s->nseg; k++) {
        const struct segment *g = &s->seg[k];
        a.weight_decay = g->decay ? (float)o->cfg.weight_decay : 0.0f;
        if (s->lo != NULL) { /* split: hi is the bf16 shard */
            if (kern_adamw_split(o->ctx, stream, (uint16_t *)s->d->param + g->first,
                                 s->lo + g->first, s->m + g->first, s->v + g->first,
                                 s->d->grad + g->first, g->n, &a, err) < 0)
                return -1;
            continue;
        }
        /* master_only in a group of one (update_dst set): the rounding goes
         * straight into the gathered slot, where block_gather_into would have
         * cast the master (the same position, the same bits), so the master
         * is read once per step instead of twice. */
        char *shard = s->d->param                    ? (char *)s->d->param
                      : s->block->update_dst != NULL ? block_own_part(s->d, s->block->update_dst)
                                                     : NULL;
        /* the master alone when it is the only copy (f32, master_only) */
        const bool alone = shard == NULL || s->d->dtype == BMT_F32;
        void *param = alone ? (void *)(s->master + g->first) : shard + dsize(s->d->dtype, g->first);
        if (kern_adamw(o->ctx, stream, s->master + g->first, s->m + g->first, s->v + g->first,
                       s->d->grad + g->first, param, alone ? BMT_F32 : s->d->dtype, g->n, &a,
                       err) < 0)
            return -1;
    }
    return 0;
}

/* The deferred update of block b's states (every pending state when b is
 * NULL), on the replica stream: AdamW, then (drop) the gradient shards go back
 * there; each block's `updated` is recorded after its states. Without drop the
 * caller gives the shards back (the forward does it on the compute stream
 * after that stream's wait for `updated`, so that the compute stream's pool,
 * which they came from, reuses them at once). */
static int optim_apply(bmt_optim_t *o, const bmt_block_t *b, bool drop, bmt_error_t *err)
{
    bmt_ctx_t *ctx = o->ctx;
    void *rep = device_stream(ctx, DEVICE_REPLICA);
    for (int i = 0; i < o->ns && o->npending > 0; i++) {
        struct ostate *s = &o->s[i];
        if (!s->pending || (b != NULL && s->block != b))
            continue;
        if (update_state(o, s, o->pend, rep, err) < 0) {
            o->broken = true; /* some shards are updated, others not */
            return -1;
        }
        if (drop)
            block_drop_grads(s->block, (int)(s->d - s->block->groups), rep);
        s->pending = false;
        o->npending--;
        const bool block_done = i + 1 == o->ns || o->s[i + 1].block != s->block;
        if (block_done) {
            s->block->update_pending = false;
            if (device_event_record(ctx, s->block->updated, rep, err) < 0) {
                o->broken = true;
                return -1;
            }
        }
    }
    if (o->npending == 0 && o->is_pending) {
        blocklist_state(o->list)->pending = NULL;
        o->is_pending = false;
    }
    return 0;
}

int bmt_optim_step(bmt_optim_t *o, bmt_step_info_t *info, bmt_error_t *err)
{
    if (o == NULL)
        return errprintf(err, "bmt_optim_step: optimizer is NULL");
    bmt_ctx_t *ctx = o->ctx;
    if (o->orphaned)
        return errprintf(err,
                         "rank %d: bmt_optim_step: the optimizer's block list was destroyed "
                         "(bmt_blocklist_destroy before bmt_optim_destroy): it has nothing to "
                         "update; destroy the optimizer",
                         ctx->rank);
    struct list_state *st = blocklist_state(o->list);
    if (o->half_loaded)
        return errprintf(err,
                         "rank %d: a checkpoint load failed half-way: parameters and optimizer "
                         "state may not belong together; load a checkpoint again (a load that "
                         "succeeds makes the optimizer usable)",
                         ctx->rank);
    if (o->broken)
        return errprintf(err, "rank %d: an earlier failed step left the optimizer unusable",
                         ctx->rank);
    if (!st->reduced)
        return errprintf(err,
                         "rank %d: bmt_optim_step without bmt_blocklist_backward(..., "
                         "last_microbatch = true) since the last step",
                         ctx->rank);
    if (o->npending > 0 && optim_apply(o, NULL, true, err) < 0) /* never left by a forward */
        return -1;

    /* Every reduce-scatter and cross-group all-reduce must have landed; how long
     * they ran past compute is exposed communication (device_wait_tail). */
    if (device_wait_tail(ctx, err) < 0 || bmt_device_synchronize(ctx, err) < 0)
        return -1;
    const int micro = st->microbatches;
    double scale = 1.0 / ((double)ctx->world * micro);
    double sumsq = 0;
    if (same_microbatches(o, err) < 0 || grad_sumsq(o, &sumsq, err) < 0)
        return -1;
    double norm = sqrt(sumsq) * scale;
    bmt_step_info_t out = { .grad_norm = norm, .microbatches = micro };
    if (!isfinite(norm)) {
        /* Every rank has the same norm, so all stop here together, before any
         * counter moves (a failed call changes nothing). */
        if (o->cfg.max_skipped > 0 && o->skipped_run + 1 > o->cfg.max_skipped)
            return errprintf(err,
                             "rank %d: %lld optimizer steps in a row were skipped (gradient "
                             "norm %g, not finite), more than max_skipped %d: the run has "
                             "diverged or its parameters hold non-finite values; resume from "
                             "the last checkpoint, perhaps with a lower learning rate",
                             ctx->rank, (long long)o->skipped_run + 1, norm, o->cfg.max_skipped);
        o->skipped++;
        o->skipped_run++;
        out.skipped = true;
    } else {
        const int64_t step = o->step + 1;
        double lr =
            o->cfg.schedule ? o->cfg.schedule(o->cfg.schedule_user, step, o->cfg.lr) : o->cfg.lr;
        /* Nothing has moved yet: a bad learning rate fails the call unchanged
         * (one past f32's range would be inf in the update: NaN parameters). */
        if (!(isfinite(lr) && lr >= 0 && lr_decay_fits(lr, o->cfg.weight_decay)))
            return errprintf(err,
                             "rank %d: bmt_optim_step: the learning-rate schedule gave %g for "
                             "step %lld; it must give a finite number >= 0 that f32, which "
                             "AdamW computes in, holds: at most %g, and so must lr x "
                             "weight_decay (%g) be",
                             ctx->rank, lr, (long long)step, (double)FLT_MAX, o->cfg.weight_decay);
        if (same_settings(o, lr, err) < 0)
            return -1;
        o->skipped_run = 0;
        if (o->cfg.clip_norm > 0) {
            /* torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), at most 1. */
            double coef = o->cfg.clip_norm / (norm + 1e-6);
            if (coef < 1)
                scale *= coef;
        }
        out.lr = lr;
        kern_adamw_args_t a = {
            .lr = (float)lr,
            .beta1 = (float)o->cfg.beta1,
            .beta2 = (float)o->cfg.beta2,
            .eps = (float)o->cfg.eps,
            .grad_scale = (float)scale,
            .bc1 = (float)(1.0 - pow(o->cfg.beta1, (double)step)),
            .bc2 = (float)(1.0 - pow(o->cfg.beta2, (double)step)),
            .one_minus_beta1 = (float)(1.0 - o->cfg.beta1),
            .one_minus_beta2 = (float)(1.0 - o->cfg.beta2),
        };
        if (o->cfg.overlap) { /* the update waits for each block's next gather */
            o->pend = a;
            for (int i = 0; i < o->ns; i++) {
                o->s[i].pending = true;
                o->s[i].block->update_pending = true;
            }
            o->npending = o->ns;
            o->is_pending = o->ns > 0;
            if (o->ns > 0)
                st->pending = o;
        } else {
            void *compute = device_stream(ctx, DEVICE_COMPUTE);
            for (int i = 0; i < o->ns; i++)
                if (update_state(o, &o->s[i], a, compute, err) < 0) {
                    o->broken = true; /* some shards are updated, others not */
                    return -1;
                }
        }
        o->step = step;
    }
    if (o->npending == 0) /* else each block's update gives its shards back */
        drop_grads(o);
    if (device_event_record(ctx, st->updated, device_stream(ctx, DEVICE_COMPUTE), err) < 0) {
        o->broken = true;
        return -1;
    }
    st->microbatches = 0;
    st->reduced = false;
    if (st->forward_pending && blocklist_cancel_forward(o->list, err) < 0)
        return -1; /* a forward before the step is stale now */
    out.step = o->step;
    out.skipped_total = o->skipped;
    if (info)
        *info = out;
    fault_point(o->ctx, FAULT_STEP, o->step); /* BMT_FAULT=step:...: tests only */
    if (!out.skipped && fault_due(o->ctx, FAULT_NAN, o->step))
        plant_nan(o);
    return 0;
}

/* ------------------------------------------------------------ checkpoint view */

int optim_count(const bmt_optim_t *o) { return o->ns; }

void optim_get(const bmt_optim_t *o, int i, optim_view_t *out)
{
    const struct ostate *s = &o->s[i];
    *out = (optim_view_t){ s->block, s->d, s->master, s->m, s->v, s->lo };
}

bool optim_splits(const bmt_optim_t *o)
{
    for (int i = 0; i < o->ns; i++)
        if (o->s[i].lo != NULL)
            return true;
    return false;
}

bmt_blocklist_t *optim_list(const bmt_optim_t *o) { return o->list; }

void optim_counters(const bmt_optim_t *o, int64_t *step, int64_t *skipped)
{
    *step = o->step;
    *skipped = o->skipped;
}

void optim_set_loaded(bmt_optim_t *o, bool whole) { o->half_loaded = !whole; }

void optim_set_counters(bmt_optim_t *o, int64_t step, int64_t skipped)
{
    o->step = step;
    o->skipped = skipped;
}
