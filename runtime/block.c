/* runtime/block.c — sharded parameter storage: layout, shards, init, gather.
 *
 * Layout: parameters go into one flat buffer per dtype, in the order they were
 * added, each at a multiple of BMT_BLOCK_ALIGN elements (aligned vector access
 * in kernels, and a parameter never shares a 64-byte line with the previous
 * one). The buffer is padded to BMT_BLOCK_ALIGN x group size so that every group
 * rank owns one equal, aligned, contiguous shard. Gaps and padding are zeros in
 * the parameters and stay zero in the gradients, so they never move.
 *
 * Sharded from birth: bmt_block_build allocates only this rank's shards
 * (BMT_MEM_PARAM) and fills them with kern_init, which computes each element
 * from (seed, parameter name, element index): the shard holds the same values
 * whatever the layout, and no rank ever materializes another rank's part.
 *
 * A full buffer holds the dtype groups back to back (each 256-byte aligned),
 * so one allocation (or one pool slot of the block list) serves a whole block.
 *
 * Layer: the bottom of the engine (storage). It calls nothing of the block
 * list or the optimizer; what they must do first reaches it through the
 * block's settle hook (block.h).
 */
#include "block.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bmt/safetensors.h"
#include "ctx.h"
#include "error.h"
#include "kernels.h"

#define FULL_ALIGN 256                 /* bytes between dtype groups in a full buffer */
#define BF16_MAX 3.3895313892515355e38 /* the largest finite bf16, 0x7f7f */
/* The most a normal init's draw reaches, in standard deviations: Box-Muller's
 * radius sqrt(-2 ln u) at the smallest u philox_u01 gives, 2^-54, is 8.652. */
#define INIT_NORMAL_REACH 8.66

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

bmt_block_t *bmt_block_create(bmt_ctx_t *ctx, const char *name, bmt_error_t *err)
{
    if (ctx == NULL || name == NULL || *name == '\0') {
        errprintf(err, "bmt_block_create: a context and a non-empty name are required");
        return NULL;
    }
    bmt_block_t *b = calloc(1, sizeof(*b));
    if (b == NULL || (b->name = strdup(name)) == NULL) {
        free(b);
        errprintf(err, "rank %d: out of memory creating block %.900s", ctx->rank, name);
        return NULL;
    }
    b->ctx = ctx;
    b->index = -1;
    b->grad_fresh = true;
    return b;
}

int bmt_block_add_param(bmt_block_t *b, const char *name, int ndim, const int64_t *shape,
                        bmt_dtype_t dtype, bmt_init_t init, unsigned flags, bmt_error_t *err)
{
    if (b == NULL)
        return errprintf(err, "bmt_block_add_param: block is NULL");
    int rank = b->ctx->rank;
    if (b->built)
        return errprintf(err,
                         "rank %d: block %.900s: parameter %.900s added after bmt_block_build; "
                         "add every parameter first",
                         rank, b->name, name ? name : "(null)");
    if (name == NULL || *name == '\0')
        return errprintf(err, "rank %d: block %.900s: a parameter needs a name", rank, b->name);
    if (shape == NULL)
        return errprintf(err, "rank %d: %.900s.%.900s: the shape is NULL (give ndim sizes)", rank,
                         b->name, name);
    if (ndim < 1 || ndim > BMT_MAX_DIMS)
        return errprintf(err, "rank %d: %.900s.%.900s: ndim must be 1..%d, got %d", rank, b->name,
                         name, BMT_MAX_DIMS, ndim);
    if (bmt_dtype_size(dtype) == 0)
        return errprintf(err, "rank %d: %.900s.%.900s: invalid dtype %d", rank, b->name, name,
                         (int)dtype);
    if ((unsigned)init.kind > BMT_INIT_TRUNC_NORMAL)
        return errprintf(err, "rank %d: %.900s.%.900s: invalid init kind %d", rank, b->name, name,
                         (int)init.kind);
    /* A parameter starts finite, or the first steps would fail far from here
     * ("the run has diverged") */
    if (!isfinite(init.a) || !isfinite(init.b) || !isfinite(init.scale))
        return errprintf(err,
                         "rank %d: %.900s.%.900s: the init's values must be finite (a %g, b %g, "
                         "scale %g)",
                         rank, b->name, name, init.a, init.b, init.scale);
    if ((init.kind == BMT_INIT_NORMAL || init.kind == BMT_INIT_TRUNC_NORMAL) && init.b < 0)
        return errprintf(err,
                         "rank %d: %.900s.%.900s: the standard deviation (init b) is %g; it must "
                         "be >= 0",
                         rank, b->name, name, init.b);
    if (init.kind == BMT_INIT_UNIFORM && !(init.a <= init.b))
        return errprintf(err, "rank %d: %.900s.%.900s: a uniform init needs a <= b (got [%g, %g))",
                         rank, b->name, name, init.a, init.b);
    /* Finite arguments can still give values the dtype cannot hold (a constant
     * 1e39 in f32, a std of 1e38 in bf16, b - a past DBL_MAX): those would
     * start as inf just the same. The most any element can reach: */
    const double reach = init.kind == BMT_INIT_ZEROS      ? 0
                         : init.kind == BMT_INIT_ONES     ? 1
                         : init.kind == BMT_INIT_CONSTANT ? fabs(init.a)
                         : init.kind == BMT_INIT_UNIFORM  ? fabs(init.a) + fabs(init.b - init.a)
                         : init.kind == BMT_INIT_NORMAL
                             ? fabs(init.a) + INIT_NORMAL_REACH * fabs(init.b)
                             : fabs(init.a) + 2 * fabs(init.b); /* cut at a +- 2b */
    const double most = reach * (init.scale == 0 ? 1 : fabs(init.scale));
    const double dmax = dtype == BMT_F64 ? DBL_MAX : dtype == BMT_F32 ? FLT_MAX : BF16_MAX;
    if (!(most <= dmax))
        return errprintf(err,
                         "rank %d: %.900s.%.900s: the init (a %g, b %g, scale %g) reaches %g, "
                         "more than %s holds (%g): its values would start as inf",
                         rank, b->name, name, init.a, init.b, init.scale, most,
                         bmt_dtype_name(dtype), dmax);
    if (flags & ~BMT_PARAM_NO_DECAY)
        return errprintf(err, "rank %d: %.900s.%.900s: unknown parameter flags 0x%x", rank, b->name,
                         name, flags & ~BMT_PARAM_NO_DECAY);
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 1 || numel > INT64_MAX / shape[d] / 16)
            return errprintf(err, "rank %d: %.900s.%.900s: dimension %d is %lld", rank, b->name,
                             name, d, (long long)shape[d]);
        numel *= shape[d];
    }
    for (int i = 0; i < b->nparams; i++) {
        const char *short_name = b->params[i].name + strlen(b->name) + 1;
        if (strcmp(short_name, name) == 0)
            return errprintf(err, "rank %d: block %.900s already has a parameter %.900s", rank,
                             b->name, name);
    }
    if (b->nparams == b->cap) {
        int cap = b->cap ? 2 * b->cap : 8;
        struct param *p = realloc(b->params, (size_t)cap * sizeof(*p));
        if (p == NULL)
            return errprintf(err, "rank %d: out of memory", rank);
        b->params = p;
        b->cap = cap;
    }
    struct param *p = &b->params[b->nparams];
    memset(p, 0, sizeof(*p));
    size_t len = strlen(b->name) + 1 + strlen(name) + 1;
    if ((p->name = malloc(len)) == NULL)
        return errprintf(err, "rank %d: out of memory", rank);
    snprintf(p->name, len, "%s.%s", b->name, name);
    p->ndim = ndim;
    memcpy(p->shape, shape, sizeof(int64_t) * (size_t)ndim);
    p->numel = numel;
    p->dtype = dtype;
    p->init = init;
    if (p->init.scale == 0)
        p->init.scale = 1;
    p->flags = flags;
    return b->nparams++;
}

int bmt_block_build(bmt_block_t *b, uint64_t seed, bmt_error_t *err)
{
    if (b == NULL)
        return errprintf(err, "bmt_block_build: block is NULL");
    bmt_ctx_t *ctx = b->ctx;
    if (b->built)
        return errprintf(err, "rank %d: block %.900s is already built", ctx->rank, b->name);
    const int gpg = ctx->layout.gpus_per_group, grank = ctx->self.group_rank;

    /* One dtype group per dtype in use, in order of first appearance. */
    b->ngroups = 0;
    for (int i = 0; i < b->nparams; i++) {
        struct param *p = &b->params[i];
        int g = 0;
        while (g < b->ngroups && b->groups[g].dtype != p->dtype)
            g++;
        if (g == b->ngroups)
            b->groups[b->ngroups++] = (struct dgroup){ .dtype = p->dtype };
        p->group = g;
        p->offset = round_up(b->groups[g].numel, BMT_BLOCK_ALIGN);
        b->groups[g].numel = p->offset + (size_t)p->numel;
    }
    size_t full = 0;
    for (int g = 0; g < b->ngroups; g++) {
        struct dgroup *d = &b->groups[g];
        d->padded = round_up(d->numel, (size_t)BMT_BLOCK_ALIGN * (size_t)gpg);
        d->shard = d->padded / (size_t)gpg;
        d->shard_first = (size_t)grank * d->shard;
        d->full_off = full;
        full = round_up(full + dsize(d->dtype, d->padded), FULL_ALIGN);
    }
    b->full_bytes = full;
    block_layout_grads(b, BMT_F32);

    b->param_ptrs = calloc((size_t)(b->nparams ? b->nparams : 1), sizeof(void *));
    b->grad_ptrs = calloc((size_t)(b->nparams ? b->nparams : 1), sizeof(void *));
    if (b->param_ptrs == NULL || b->grad_ptrs == NULL)
        return errprintf(err, "rank %d: out of memory", ctx->rank);

    /* Allocate and fill this rank's shards: zeros first (gaps, padding), then
     * every parameter's overlap with the shard. */
    for (int g = 0; g < b->ngroups; g++) {
        struct dgroup *d = &b->groups[g];
        d->param = bmt_alloc(ctx, BMT_MEM_PARAM, dsize(d->dtype, d->shard), err);
        if (d->param == NULL)
            goto fail;
        if (kern_zero(ctx, NULL, d->param, dsize(d->dtype, d->shard), err) < 0)
            goto fail;
    }
    for (int i = 0; i < b->nparams; i++) {
        const struct param *p = &b->params[i];
        const struct dgroup *d = &b->groups[p->group];
        size_t lo, hi;
        if (!block_in_shard(p, d, &lo, &hi))
            continue;
        uint32_t key[2];
        kern_init_key(seed, p->name, key);
        char *dst = (char *)d->param + dsize(d->dtype, lo - d->shard_first);
        if (kern_init(ctx, NULL, dst, d->dtype, hi - lo, lo - p->offset, key, &p->init, err) < 0)
            goto fail;
    }
    if (device_sync_legacy(ctx, err) < 0)
        goto fail;
    b->seed = seed;
    b->built = true;
    return 0;
fail:
    errprefix(err, "block %.900s: ", b->name);
    for (int g = 0; g < b->ngroups; g++) {
        bmt_free(ctx, b->groups[g].param);
        b->groups[g].param = NULL;
    }
    return -1;
}

void bmt_block_destroy(bmt_block_t *b)
{
    if (b == NULL || b->list)
        return; /* a list owns its blocks */
    bmt_ctx_t *ctx = b->ctx;
    if (b->own_full)
        bmt_free(ctx, b->full);
    for (int g = 0; g < b->ngroups; g++) {
        bmt_free(ctx, b->groups[g].param);
        bmt_free(ctx, b->groups[g].grad);
    }
    for (int i = 0; i < b->nparams; i++)
        free(b->params[i].name);
    free(b->params);
    free(b->param_ptrs);
    free(b->grad_ptrs);
    device_event_destroy(ctx, b->rs_done);
    device_event_destroy(ctx, b->updated);
    free(b->name);
    free(b);
}

void block_file_name(const bmt_block_t *b, bool optim, char *out, size_t len)
{
    snprintf(out, len, "%s%s.safetensors", b->name, optim ? ".optim" : "");
    for (char *c = out; *c; c++)
        if (*c == '/')
            *c = '_';
}

int block_hf_shadowed(const bmt_block_t *b, bmt_error_t *err)
{
    char fn[1024];
    block_file_name(b, false, fn, sizeof(fn));
    if (strcmp(fn, BMT_ST_FILE_NAME) != 0)
        return 0;
    return errprintf(err,
                     "block '%.900s' would be saved as " BMT_ST_FILE_NAME
                     ", which transformers' from_pretrained and bmt_st_open read instead of the "
                     "checkpoint's index (the other blocks unread): give the block another name",
                     b->name);
}

int block_name_clash(const bmt_block_t *b, const bmt_block_t *other, bool optim, bmt_error_t *err)
{
    if (strcmp(b->name, other->name) == 0)
        return errprintf(err,
                         "two blocks are named '%.900s': a checkpoint needs a file of its own per "
                         "block (give the blocks distinct names)",
                         b->name);
    char fb[1024], fo[1024];
    for (int i = 0; i < (optim ? 4 : 1); i++) {
        block_file_name(b, i & 1, fb, sizeof(fb));
        block_file_name(other, i & 2, fo, sizeof(fo));
        if (strcmp(fb, fo) == 0)
            return errprintf(err,
                             "blocks '%.900s' and '%.900s' would share the file %.900s: a "
                             "checkpoint needs a file of its own per block (give the blocks "
                             "distinct names)",
                             other->name, b->name, fb);
    }
    for (int i = 0; i < b->nparams; i++)
        for (int j = 0; j < other->nparams; j++)
            if (strcmp(b->params[i].name, other->params[j].name) == 0)
                return errprintf(err,
                                 "two blocks have a parameter named '%.900s': a checkpoint (its "
                                 "index) needs distinct names",
                                 b->params[i].name);
    return 0;
}

const char *bmt_block_name(const bmt_block_t *b) { return b ? b->name : NULL; }
int bmt_block_num_params(const bmt_block_t *b) { return b ? b->nparams : 0; }

const char *bmt_block_param_name(const bmt_block_t *b, int i)
{
    return b && i >= 0 && i < b->nparams ? b->params[i].name : NULL;
}

int64_t bmt_block_param_numel(const bmt_block_t *b, int i)
{
    return b && i >= 0 && i < b->nparams ? b->params[i].numel : -1;
}

int bmt_block_param_dtype(const bmt_block_t *b, int i)
{
    return b && i >= 0 && i < b->nparams ? (int)b->params[i].dtype : -1;
}

void block_bind_full(bmt_block_t *b, void *base)
{
    for (int i = 0; i < b->nparams; i++) {
        const struct param *p = &b->params[i];
        const struct dgroup *d = &b->groups[p->group];
        b->param_ptrs[i] = base ? (char *)base + d->full_off + dsize(p->dtype, p->offset) : NULL;
    }
}

bool block_shards_whole(const bmt_block_t *b)
{
    if (b->ctx->layout.gpus_per_group != 1)
        return false;
    for (int g = 0; g < b->ngroups; g++)
        if (b->groups[g].param == NULL) /* master_only: the values are f32 masters */
            return false;
    return true;
}

void block_bind_shards(bmt_block_t *b)
{
    for (int i = 0; i < b->nparams; i++) {
        const struct param *p = &b->params[i];
        const struct dgroup *d = &b->groups[p->group];
        b->param_ptrs[i] = (char *)d->param + dsize(p->dtype, p->offset);
    }
}

void block_layout_grads(bmt_block_t *b, bmt_dtype_t gt)
{
    size_t off = 0;
    for (int g = 0; g < b->ngroups; g++) {
        b->groups[g].grad_off = off;
        off = round_up(off + dsize(gt, b->groups[g].padded), FULL_ALIGN);
    }
    b->grad_bytes = off;
}

void block_bind_grads(bmt_block_t *b, void *base, bmt_dtype_t gt)
{
    for (int i = 0; i < b->nparams; i++) {
        const struct param *p = &b->params[i];
        const struct dgroup *d = &b->groups[p->group];
        b->grad_ptrs[i] = base ? (char *)base + d->grad_off + dsize(gt, p->offset) : NULL;
    }
}

void block_bind_shard_grads(bmt_block_t *b)
{
    for (int i = 0; i < b->nparams; i++) {
        const struct param *p = &b->params[i];
        b->grad_ptrs[i] = (char *)b->groups[p->group].grad + dsize(BMT_F32, p->offset);
    }
}

int block_shard_values(bmt_ctx_t *ctx, const struct dgroup *d, void *dst, void *stream,
                       bmt_error_t *err)
{
    if (d->param)
        return kern_cast(ctx, stream, dst, d->dtype, d->param, d->dtype, d->shard, err);
    if (d->master)
        return kern_cast(ctx, stream, dst, d->dtype, d->master, BMT_F32, d->shard, err);
    return errprintf(err, "rank %d: a parameter shard has no values (its optimizer is gone)",
                     ctx->rank);
}

int block_gather_into(bmt_block_t *b, void *base, void *stream, bmt_error_t *err)
{
    bmt_comm_t *group = b->ctx->group_comm;
    for (int g = 0; g < b->ngroups; g++) {
        const struct dgroup *d = &b->groups[g];
        char *full = (char *)base + d->full_off;
        const void *send = d->param;
        if (send == NULL) {
            /* master_only: round the master into this rank's own slot of the
             * full buffer, on the gather's stream, and gather in place. */
            char *mine = block_own_part(d, base);
            if (block_shard_values(b->ctx, d, mine, stream, err) < 0)
                return errprefix(err, "gathering block %.900s: ", b->name);
            send = mine;
        }
        if (comm_all_gather_on(group, send, full, d->shard, d->dtype, stream, err) < 0)
            return errprefix(err, "gathering block %.900s: ", b->name);
    }
    return 0;
}

/* The elements of dtype group g's layout that no parameter covers (alignment
 * gaps, padding) at base, zeroed: the optimizer's sums of squares read them. */
static int zero_gaps(bmt_block_t *b, int g, float *base, void *stream, bmt_error_t *err)
{
    size_t at = 0;
    for (int i = 0; i <= b->nparams; i++) {
        const struct param *p = i < b->nparams ? &b->params[i] : NULL;
        if (p && p->group != g)
            continue;
        const size_t end = p ? p->offset : b->groups[g].padded;
        if (end > at && kern_zero(b->ctx, stream, base + at, dsize(BMT_F32, end - at), err) < 0)
            return -1;
        if (p)
            at = p->offset + (size_t)p->numel;
    }
    return 0;
}

int block_fresh_grads(bmt_block_t *b, int g, float *base, enum fresh_mode mode, void *stream,
                      bmt_error_t *err)
{
    const size_t bytes = dsize(BMT_F32, b->groups[g].padded);
    if (mode == FRESH_ZERO)
        return kern_zero(b->ctx, stream, base, bytes, err);
    if (mode == FRESH_POISON && kern_fill(b->ctx, stream, base, 0xff, bytes, err) < 0)
        return -1;
    return zero_gaps(b, g, base, stream, err);
}

int block_need_grads(bmt_block_t *b, void *stream, enum fresh_mode mode, bmt_error_t *err)
{
    for (int g = 0; g < b->ngroups; g++) {
        struct dgroup *d = &b->groups[g];
        if (d->grad)
            continue;
        const size_t bytes = dsize(BMT_F32, d->shard);
        d->grad = bmt_alloc_async(b->ctx, BMT_MEM_GRAD, bytes, stream, err);
        const int rc = d->grad == NULL         ? -1
                       : d->shard == d->padded ? block_fresh_grads(b, g, d->grad, mode, stream, err)
                                               : kern_zero(b->ctx, stream, d->grad, bytes, err);
        if (rc < 0)
            return errprefix(err, "gradient shard of block %.900s: ", b->name);
        b->grad_fresh = true;
    }
    return 0;
}

int bmt_block_call_zero_grad(const bmt_block_call_t *c, int i, bmt_error_t *err)
{
    if (c == NULL || c->block == NULL || c->grads == NULL)
        return errprintf(err, "bmt_block_call_zero_grad: not a backward call (no gradients)");
    bmt_block_t *b = c->block;
    if (i < -1 || i >= b->nparams)
        return errprintf(err,
                         "rank %d: bmt_block_call_zero_grad: block %.900s has parameters 0..%d, "
                         "not %d (-1: all)",
                         b->ctx->rank, b->name, b->nparams - 1, i);
    /* Not fresh: a group of one's gradient shards holding the step's sum so
     * far (earlier micro-batches, a tied block's other use), which zeroing
     * would lose there and only there. */
    if (!c->grads_fresh)
        return errprintf(err,
                         "rank %d: bmt_block_call_zero_grad: block %.900s's gradients already hold "
                         "this step's sum so far (call->grads_fresh is false); add into them "
                         "instead",
                         b->ctx->rank, b->name);
    for (int k = i < 0 ? 0 : i; k < (i < 0 ? b->nparams : i + 1); k++)
        if (kern_zero(b->ctx, c->stream, c->grads[k], dsize(BMT_F32, (size_t)b->params[k].numel),
                      err) < 0)
            return errprefix(err, "gradient %d of block %.900s: ", k, b->name);
    return 0;
}

void block_drop_grads(bmt_block_t *b, int group, void *stream)
{
    bmt_free_async(b->ctx, b->groups[group].grad, stream);
    b->groups[group].grad = NULL;
    b->grad_fresh = true;
}

int bmt_block_gather(bmt_block_t *b, bmt_error_t *err)
{
    if (b == NULL)
        return errprintf(err, "bmt_block_gather: block is NULL");
    bmt_ctx_t *ctx = b->ctx;
    if (!b->built)
        return errprintf(err, "rank %d: block %.900s: gather before bmt_block_build", ctx->rank,
                         b->name);
    if (b->full)
        return errprintf(err, "rank %d: block %.900s is already gathered", ctx->rank, b->name);
    if (b->settle && b->settle(b, err) < 0) /* the optimizer's deferred update */
        return -1;
    void *full = bmt_alloc(ctx, BMT_MEM_GATHERED, b->full_bytes, err);
    if (full == NULL)
        return -1;
    /* Outside a schedule: synchronous, on the communicator's own path. */
    if (bmt_device_synchronize(ctx, err) < 0 || block_gather_into(b, full, NULL, err) < 0 ||
        bmt_device_synchronize(ctx, err) < 0) {
        bmt_free(ctx, full);
        return -1;
    }
    b->full = full;
    b->own_full = true;
    block_bind_full(b, full);
    return 0;
}

void *bmt_block_param(const bmt_block_t *b, int i)
{
    if (b == NULL || b->full == NULL || i < 0 || i >= b->nparams)
        return NULL;
    return b->param_ptrs[i];
}

int bmt_block_release(bmt_block_t *b, bmt_error_t *err)
{
    if (b == NULL)
        return errprintf(err, "bmt_block_release: block is NULL");
    if (b->full == NULL || !b->own_full)
        return errprintf(err,
                         "rank %d: block %.900s: release of a block that is not gathered "
                         "(by bmt_block_gather)",
                         b->ctx->rank, b->name);
    if (bmt_device_synchronize(b->ctx, err) < 0)
        return -1;
    bmt_free(b->ctx, b->full);
    b->full = NULL;
    b->own_full = false;
    block_bind_full(b, NULL);
    return 0;
}

/* ------------------------------------------------------------ loading shards */

/* bmt_block_load's source: the caller's, then every value it wrote checked
 * finite. A parameter never holds nan or inf on purpose: a file that does is
 * corrupt or comes from a run that diverged, and training from it would skip
 * steps or spread NaN (checkpoint loads check their own, naming the file). */
typedef struct finite_src {
    bmt_block_source_fn fn;
    void *user;
} finite_src_t;

static int finite_read(void *user, const bmt_block_t *b, int param, int64_t first, int64_t count,
                       void *dst, bmt_dtype_t dtype, bmt_error_t *err)
{
    const finite_src_t *s = user;
    if (s->fn(s->user, b, param, first, count, dst, dtype, err) < 0)
        return -1;
    const int64_t bad = dtype_first_nonfinite(dst, dtype, (size_t)count);
    if (bad >= 0)
        return errprintf(err,
                         "element %lld is %s: parameters must be finite, so nothing of this block "
                         "was loaded (the source holds a non-finite value: a corrupt file or one "
                         "saved from a run that diverged)",
                         (long long)(first + bad), dtype_nonfinite_name(dst, dtype, (size_t)bad));
    return 0;
}

int bmt_block_load(bmt_block_t *b, bmt_block_source_fn fn, void *user, bmt_error_t *err)
{
    if (b == NULL || fn == NULL)
        return errprintf(err, "bmt_block_load: block and source are required");
    if (b->sealed)
        return errprintf(err,
                         "rank %d: block %.900s: load parameters before bmt_adamw_create and the "
                         "first forward",
                         b->ctx->rank, b->name);
    finite_src_t src = { fn, user };
    return block_load(b, finite_read, &src, false, err);
}

int block_load(bmt_block_t *b, bmt_block_source_fn fn, void *user, bool direct, bmt_error_t *err)
{
    bmt_ctx_t *ctx = b->ctx;
    if (!b->built)
        return errprintf(err, "rank %d: block %.900s: load before bmt_block_build", ctx->rank,
                         b->name);
    if (b->full)
        return errprintf(err, "rank %d: block %.900s is gathered; release it first", ctx->rank,
                         b->name);
    /* Stage every group's shard on the host (O(shard)) and upload only when
     * every source call succeeded: a failed load changes nothing. direct (on
     * cpu only): the source writes into the shards themselves, no copy; a
     * failure then leaves them partly loaded (checkpoint loads, which check
     * every name and shape first and stop the program on an I/O error). */
    direct = direct && bmt_device(ctx) == BMT_DEVICE_CPU;
    void *stage[BMT_DTYPE_COUNT] = { 0 };
    int rc = 0;
    /* A group whose values live in a master_only optimizer has no shard to load:
     * its values come with the optimizer's state (ckpt.c). */
    for (int g = 0; g < b->ngroups && rc == 0 && !direct; g++) {
        struct dgroup *d = &b->groups[g];
        if (d->param == NULL)
            continue;
        size_t bytes = dsize(d->dtype, d->shard);
        /* Zeros, not a download: alignment gaps and padding hold zeros always
         * (optim.c never touches them), and every parameter piece is read. */
        if ((stage[g] = calloc(1, bytes ? bytes : 1)) == NULL)
            rc = errprintf(err, "rank %d: out of memory staging block %.900s", ctx->rank, b->name);
    }
    for (int i = 0; i < b->nparams && rc == 0; i++) {
        const struct param *p = &b->params[i];
        const struct dgroup *d = &b->groups[p->group];
        size_t lo, hi;
        if (d->param == NULL || !block_in_shard(p, d, &lo, &hi))
            continue;
        char *dst =
            (char *)(direct ? d->param : stage[p->group]) + dsize(d->dtype, lo - d->shard_first);
        if (fn(user, b, i, (int64_t)(lo - p->offset), (int64_t)(hi - lo), dst, d->dtype, err) < 0)
            rc = errprefix(err, "rank %d: loading %.900s: ", ctx->rank, p->name);
    }
    for (int g = 0; g < b->ngroups && rc == 0 && !direct; g++) {
        struct dgroup *d = &b->groups[g];
        if (d->param)
            rc = bmt_mem_upload(ctx, d->param, stage[g], dsize(d->dtype, d->shard), err);
    }
    for (int g = 0; g < b->ngroups; g++)
        free(stage[g]);
    if (rc == 0)
        b->loaded = true;
    return rc;
}

void bmt_block_param_shape(const bmt_block_t *b, int i, int *ndim, int64_t shape[BMT_MAX_DIMS])
{
    *ndim = 0;
    if (b == NULL || i < 0 || i >= b->nparams)
        return;
    *ndim = b->params[i].ndim;
    memcpy(shape, b->params[i].shape, sizeof(int64_t) * (size_t)b->params[i].ndim);
}
