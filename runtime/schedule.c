/* runtime/schedule.c — the block list: forward and backward with prefetch,
 * activation checkpointing, and two-level gradient reduction.
 *
 * Streams (cuda; on cpu every step is synchronous and the events are NULL):
 *   comm     gathers block parameters into pool slots, reduce-scatters full
 *            gradients into f32 shards (and accumulates micro-batches there);
 *   compute  the model's callbacks, zeroing of full gradient buffers (unless
 *            the callbacks overwrite fresh ones: bmt_blocklist_set_grad_overwrite);
 *   replica  on the last micro-batch, the all-reduce of each block's gradient
 *            shard across groups, as soon as that block's reduce-scatter is done.
 * Dependencies are CUDA events on pool slots: a slot's `ready` is recorded after
 * its gather (the compute stream waits for it), its `free` after its last use
 * (the comm stream waits for it before gathering into it again). The host never
 * waits; the optimizer step synchronizes, bounded by BMT_TIMEOUT.
 *
 * Pools (invariant 1): with zero level 3 at most two parameter slots exist
 * (the block computing and the one being prefetched; one without prefetch),
 * with zero level 2 one per block, kept from forward to backward. Two full
 * gradient buffers alternate: backward of block i fills one while the
 * reduce-scatter of block i+1 drains the other. Each is the size of the block
 * it holds, stream-ordered on the compute stream: block i's is made after the
 * compute stream's wait for the reduce-scatter that drained the buffer's last
 * block (whose memory is given back there first when the sizes differ), so at
 * most two blocks' full gradients exist at once, not two of the largest
 * block's, and none outside a backward (the last two go back on the comm
 * stream after their reduce-scatters). The reduce's staging and output
 * buffers are stream-ordered on the comm stream around each use (reduce).
 *
 * Forward (zero 3):  gather(0); for i: gather(i+1) | wait ready(i), forward(i),
 *                    record free, release(i).
 * Backward:          for i = n-1..0: [gather(i)] gather(i-1) | wait ready(i),
 *                    [recompute forward(i)], a gradient buffer (zeroed, or
 *                    left to the callbacks to overwrite), backward(i),
 *                    release(i) | comm: reduce-scatter -> shard (+= if not the
 *                    first micro-batch) | replica (last micro-batch): all-reduce.
 *
 * A group of one rank (gpus_per_group 1) has nothing to gather or reduce
 * inside it: its shard is the whole padded buffer. The callbacks read the
 * parameter shards in place (no gathered buffer, no copy; except under a
 * master_only optimizer, whose f32 masters are rounded into one, by the
 * deferred update itself when one is pending: update_into_slot) and add
 * straight into the f32 gradient shards (made at the step's first backward,
 * zeroed or, under bmt_blocklist_set_grad_overwrite, written by that first
 * call: grads_fresh; later micro-batches and a tied block's second use add), so no full gradient
 * buffers, reduce-scatter output or bf16 staging exist (grad_dtype has no wire to apply to), and
 * the replica all-reduce follows the block's backward on the compute stream.
 *
 * Memory bound (invariant 1; docs/engine.md has the numbers): with zero level
 * 3 and prefetch, at most two gathered parameter buffers exist at any time,
 * and during a backward in a group of two or more also two full f32 gradient
 * buffers (block i's being filled, block i+1's being reduce-scattered), plus,
 * with a bf16 reduce, one bf16 copy of a block's gradients: at most 2 P + 2 G
 * (+ G/2) bytes, with P and G the largest block's full parameter and f32
 * gradient buffers. A group of one has none of them.
 *
 * Layer: above block.c (storage), below optim.c (the update): nothing here
 * calls the optimizer by name; its deferred update and its orphaning go
 * through the hooks it installs in list_state (block.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block.h"
#include "checksum.h"
#include "comm.h"
#include "ctx.h"
#include "env.h"
#include "error.h"
#include "kernels.h"

struct slot {
    void *mem; /* full buffer: BMT_MEM_GATHERED or BMT_MEM_GRAD_FULL */
    size_t bytes;
    void *ready;        /* event: filled (gather done / gradients written) */
    void *free;         /* event: last reader done */
    bmt_block_t *owner; /* NULL when free */
    int users;          /* entries holding it: 2 while a tied block's two uses share it */
};

struct entry {
    bmt_block_t
        *block; /* the same block at two entries when tied (its first use is block->index) */
    bmt_block_ops_t ops;
    void *model;
    struct slot *slot; /* parameter slot while gathered */
    bool after_update; /* its gather follows a deferred update: compute waits for that first */
    bool recompute;    /* activation checkpointing of this use: the config's, or
                        * bmt_blocklist_set_checkpointing's */
};

enum phase {
    PHASE_IDLE,
    PHASE_FORWARD_DONE,
    PHASE_BROKEN
};

struct bmt_blocklist {
    bmt_ctx_t *ctx;
    bmt_blocklist_config_t cfg;
    struct entry *e;
    int n, cap;
    struct slot *pslots; /* parameter pool */
    int npslots, maxpslots;
    struct slot gslots[2]; /* full gradient buffers, sized per block during a backward */
    int gnext;
    struct list_state st;
    enum phase phase;
    bool checked;          /* the ranks agreed on the list's configuration and blocks */
    enum fresh_mode fresh; /* how gradients that hold nothing yet reach the callbacks */
    bool poison;           /* BMT_CHECK_OVERWRITE: FRESH_POISON where FRESH_LEAVE */
};

/* A group of one: gradients go straight into the shards (see the top). */
static bool direct_grads(const bmt_blocklist_t *l) { return l->ctx->layout.gpus_per_group == 1; }

static int broken(bmt_blocklist_t *l, bmt_error_t *err)
{
    l->phase = PHASE_BROKEN;
    return -1;
}

bmt_blocklist_t *bmt_blocklist_create(bmt_ctx_t *ctx, const bmt_blocklist_config_t *cfg,
                                      bmt_error_t *err)
{
    bmt_blocklist_config_t defaults = BMT_BLOCKLIST_CONFIG_INITIALIZER;
    if (ctx == NULL) {
        errprintf(err, "bmt_blocklist_create: context is NULL");
        return NULL;
    }
    if (cfg == NULL)
        cfg = &defaults;
    if (cfg->magic != BMT_BLOCKLIST_CONFIG_MAGIC || cfg->size < sizeof(*cfg) ||
        cfg->version != BMT_BLOCKLIST_CONFIG_VERSION) {
        errprintf(err, "bmt_blocklist_create: the config was not set up with "
                       "BMT_BLOCKLIST_CONFIG_INITIALIZER of this bmt");
        return NULL;
    }
    if ((cfg->zero_level != 2 && cfg->zero_level != 3) ||
        (cfg->checkpointing != 0 && cfg->checkpointing != 1) ||
        (cfg->grad_dtype != BMT_F32 && cfg->grad_dtype != BMT_BF16) ||
        (cfg->prefetch != 0 && cfg->prefetch != 1)) {
        errprintf(err,
                  "rank %d: bmt_blocklist_create: zero_level must be 2 or 3, checkpointing and "
                  "prefetch 0 or 1, grad_dtype f32 or bf16 (got %d, %d, %d, %d)",
                  ctx->rank, cfg->zero_level, cfg->checkpointing, (int)cfg->grad_dtype,
                  cfg->prefetch);
        return NULL;
    }
    bool poison = false;
    if (env_get_flag("BMT_CHECK_OVERWRITE", &poison, err) < 0) {
        errprefix(err, "rank %d: bmt_blocklist_create: ", ctx->rank);
        return NULL;
    }
    bmt_blocklist_t *l = calloc(1, sizeof(*l));
    if (l == NULL) {
        errprintf(err, "rank %d: out of memory", ctx->rank);
        return NULL;
    }
    l->ctx = ctx;
    ctx->live_lists++;
    l->cfg = *cfg;
    l->fresh = FRESH_ZERO;
    l->poison = poison;
    for (int k = 0; k < 2; k++)
        if (device_event_create(ctx, &l->gslots[k].ready, err) < 0 ||
            device_event_create(ctx, &l->gslots[k].free, err) < 0) {
            bmt_blocklist_destroy(l);
            return NULL;
        }
    if (device_event_create(ctx, &l->st.updated, err) < 0) {
        bmt_blocklist_destroy(l);
        return NULL;
    }
    return l;
}

/* Room for one more entry. */
static int grow(bmt_blocklist_t *l, bmt_error_t *err)
{
    if (l->n < l->cap)
        return 0;
    int cap = l->cap ? 2 * l->cap : 16;
    struct entry *e = realloc(l->e, (size_t)cap * sizeof(*e));
    if (e == NULL)
        return errprintf(err, "rank %d: out of memory", l->ctx->rank);
    l->e = e;
    l->cap = cap;
    return 0;
}

/* bmt_block.settle: a block read outside the schedule (bmt_block_gather)
 * gets the optimizer's deferred update first. */
static int settle(bmt_block_t *b, bmt_error_t *err)
{
    return b->list ? blocklist_flush(b->list, b, true, err) : 0;
}

int bmt_blocklist_append(bmt_blocklist_t *l, bmt_block_t *b, const bmt_block_ops_t *ops,
                         void *model, bmt_error_t *err)
{
    if (l == NULL || b == NULL || ops == NULL || ops->forward == NULL || ops->backward == NULL)
        return errprintf(err, "bmt_blocklist_append: list, block and both callbacks are required");
    bmt_ctx_t *ctx = l->ctx;
    if (b->ctx != ctx)
        return errprintf(err, "rank %d: block %.900s belongs to another context", ctx->rank,
                         b->name);
    if (!b->built)
        return errprintf(err, "rank %d: block %.900s is not built (bmt_block_build first)",
                         ctx->rank, b->name);
    if (b->list)
        return errprintf(err, "rank %d: block %.900s is already in a block list", ctx->rank,
                         b->name);
    if (b->full)
        return errprintf(err, "rank %d: block %.900s is gathered; release it first", ctx->rank,
                         b->name);
    if (l->st.sealed)
        return errprintf(err,
                         "rank %d: block %.900s: blocks can only be appended before the first "
                         "forward and before bmt_adamw_create",
                         ctx->rank, b->name);
    if (block_hf_shadowed(b, err) < 0)
        return errprefix(err, "rank %d: bmt_blocklist_append: ", ctx->rank);
    for (int i = 0; i < l->n; i++)
        if (block_name_clash(b, l->e[i].block, false, err) < 0)
            return errprefix(err, "rank %d: bmt_blocklist_append: ", ctx->rank);
    if (grow(l, err) < 0)
        return -1;
    block_layout_grads(b, BMT_F32); /* the model always writes f32 gradients */
    if (device_event_create(ctx, &b->rs_done, err) < 0 ||
        device_event_create(ctx, &b->updated, err) < 0)
        return errprefix(err, "block %.900s: ", b->name);
    b->grad_fresh = true; /* its gradient shards come with its first backward */
    l->e[l->n] = (struct entry){
        .block = b, .ops = *ops, .model = model, .recompute = l->cfg.checkpointing != 0
    };
    b->list = l;
    b->settle = settle;
    b->index = l->n++;
    return 0;
}

int bmt_blocklist_append_tied(bmt_blocklist_t *l, bmt_block_t *b, const bmt_block_ops_t *ops,
                              void *model, bmt_error_t *err)
{
    if (l == NULL || b == NULL || ops == NULL || ops->forward == NULL || ops->backward == NULL)
        return errprintf(err,
                         "bmt_blocklist_append_tied: list, block and both callbacks are required");
    bmt_ctx_t *ctx = l->ctx;
    if (b->list != l)
        return errprintf(err,
                         "rank %d: block %.900s is not in this block list; append it first, then "
                         "append its tied use",
                         ctx->rank, b->name);
    if (l->st.sealed)
        return errprintf(err,
                         "rank %d: block %.900s: blocks can only be appended before the first "
                         "forward and before bmt_adamw_create",
                         ctx->rank, b->name);
    for (int i = b->index + 1; i < l->n; i++)
        if (l->e[i].block == b)
            return errprintf(err, "rank %d: block %.900s is already tied (one second use at most)",
                             ctx->rank, b->name);
    if (grow(l, err) < 0)
        return -1;
    l->e[l->n++] = (struct entry){
        .block = b, .ops = *ops, .model = model, .recompute = l->cfg.checkpointing != 0
    };
    return 0;
}

int bmt_blocklist_set_checkpointing(bmt_blocklist_t *l, int i, bool recompute, bmt_error_t *err)
{
    if (l == NULL)
        return errprintf(err, "bmt_blocklist_set_checkpointing: list is NULL");
    if (i < 0 || i >= l->n)
        return errprintf(err,
                         "rank %d: bmt_blocklist_set_checkpointing: use %d is not in the list "
                         "(it holds uses 0..%d)",
                         l->ctx->rank, i, l->n - 1);
    if (l->checked)
        return errprintf(err,
                         "rank %d: bmt_blocklist_set_checkpointing: use %d (%.900s): "
                         "checkpointing is chosen before the first forward, not after",
                         l->ctx->rank, i, l->e[i].block->name);
    l->e[i].recompute = recompute;
    return 0;
}

bool bmt_blocklist_checkpointing(const bmt_blocklist_t *l, int i)
{
    return l && i >= 0 && i < l->n && l->e[i].recompute;
}

int bmt_blocklist_set_grad_overwrite(bmt_blocklist_t *l, bool overwrite, bmt_error_t *err)
{
    if (l == NULL)
        return errprintf(err, "bmt_blocklist_set_grad_overwrite: list is NULL");
    if (l->st.forward_pending)
        return errprintf(err,
                         "rank %d: bmt_blocklist_set_grad_overwrite: between a forward and its "
                         "backward; change it before the forward",
                         l->ctx->rank);
    l->fresh = !overwrite ? FRESH_ZERO : l->poison ? FRESH_POISON : FRESH_LEAVE;
    return 0;
}

bool bmt_blocklist_grad_overwrite(const bmt_blocklist_t *l) { return l && l->fresh != FRESH_ZERO; }

int bmt_blocklist_size(const bmt_blocklist_t *l) { return l ? l->n : 0; }

bmt_block_t *bmt_blocklist_block(const bmt_blocklist_t *l, int i)
{
    return l && i >= 0 && i < l->n ? l->e[i].block : NULL;
}

struct list_state *blocklist_state(bmt_blocklist_t *l) { return &l->st; }

int blocklist_flush(bmt_blocklist_t *l, bmt_block_t *b, bool drop, bmt_error_t *err)
{
    bmt_optim_t *o = l->st.pending;
    if (o == NULL || l->st.flush == NULL || (b != NULL && !b->update_pending))
        return 0;
    return l->st.flush(o, b, drop, err);
}

void blocklist_seal(bmt_blocklist_t *l)
{
    l->st.sealed = true;
    for (int i = 0; i < l->n; i++)
        l->e[i].block->sealed = true;
}

bmt_ctx_t *blocklist_ctx(bmt_blocklist_t *l) { return l->ctx; }

/* ------------------------------------------------------------ pools */

/* The next full gradient buffer, for block b, on the compute stream: after the
 * reduce-scatter that drained it (its `free`), given back there and made anew
 * when its size differs from b's, then made ready for the callback (zeroed,
 * or as the list's fresh mode says: each dtype group's padded elements). */
static struct slot *grad_slot(bmt_blocklist_t *l, bmt_block_t *b, bmt_error_t *err)
{
    bmt_ctx_t *ctx = l->ctx;
    void *compute = device_stream(ctx, DEVICE_COMPUTE);
    struct slot *g = &l->gslots[l->gnext];
    l->gnext ^= 1;
    if (device_wait_timed(ctx, g->free, err) < 0)
        return NULL;
    if (g->mem && g->bytes != b->grad_bytes) {
        bmt_free_async(ctx, g->mem, compute);
        g->mem = NULL;
    }
    if (g->mem == NULL) {
        g->bytes = 0;
        if ((g->mem = bmt_alloc_async(ctx, BMT_MEM_GRAD_FULL, b->grad_bytes, compute, err)) == NULL)
            return NULL;
        g->bytes = b->grad_bytes;
    }
    if (l->fresh == FRESH_ZERO)
        return kern_zero(ctx, compute, g->mem, b->grad_bytes, err) < 0 ? NULL : g;
    for (int k = 0; k < b->ngroups; k++)
        if (block_fresh_grads(b, k, (float *)((char *)g->mem + b->groups[k].grad_off), l->fresh,
                              compute, err) < 0)
            return NULL;
    return g;
}

/* After a backward: the full gradient buffers go back on the comm stream, behind
 * the reduce-scatters that read them last. */
static void grad_slots_drop(bmt_blocklist_t *l)
{
    for (int k = 0; k < 2; k++) {
        bmt_free_async(l->ctx, l->gslots[k].mem, device_stream(l->ctx, DEVICE_COMM));
        l->gslots[k].mem = NULL;
        l->gslots[k].bytes = 0;
    }
}

/* A free parameter slot, making one while under the pool's limit. */
static struct slot *pslot_get(bmt_blocklist_t *l, bmt_error_t *err)
{
    for (int k = 0; k < l->npslots; k++)
        if (l->pslots[k].owner == NULL)
            return &l->pslots[k];
    int limit = l->cfg.zero_level == 2 ? l->n : (l->cfg.prefetch ? 2 : 1);
    if (l->npslots >= limit) {
        errprintf(err, "rank %d: internal: no free parameter buffer (%d in use)", l->ctx->rank,
                  l->npslots);
        return NULL;
    }
    if (l->pslots == NULL) {
        l->maxpslots = l->n > 2 ? l->n : 2;
        l->pslots = calloc((size_t)l->maxpslots, sizeof(struct slot));
        if (l->pslots == NULL) {
            errprintf(err, "rank %d: out of memory", l->ctx->rank);
            return NULL;
        }
    }
    struct slot *s = &l->pslots[l->npslots]; /* its memory comes with its first gather */
    if (device_event_create(l->ctx, &s->ready, err) < 0 ||
        device_event_create(l->ctx, &s->free, err) < 0) {
        device_event_destroy(l->ctx, s->ready);
        *s = (struct slot){ 0 };
        return NULL;
    }
    l->npslots++;
    return s;
}

/* Can block b's deferred update write its values straight into its slot?
 * In a group of one whose every dtype group lives only in a master_only
 * optimizer's f32 master (bf16: the one rounding kern_adamw writes besides
 * f32), the gather is just the master rounded into the slot, no all-gather:
 * AdamW, which has the new master in hand, writes that rounding itself
 * (update_dst) and the master is read once instead of twice. */
static bool update_into_slot(const bmt_blocklist_t *l, const bmt_block_t *b)
{
    if (!b->update_pending || l->ctx->layout.gpus_per_group != 1 || b->ngroups == 0)
        return false;
    for (int g = 0; g < b->ngroups; g++) {
        const struct dgroup *d = &b->groups[g];
        if (d->param != NULL || d->master == NULL || d->dtype != BMT_BF16)
            return false;
    }
    return true;
}

/* The fused gather of update_into_slot: block b's deferred AdamW, on the
 * replica stream, writes the master, the moments and the bf16 values into
 * slot s (made on the comm stream, after the wait for its last reader); the
 * comm stream then waits for it. The slot's gaps and padding are left as the
 * pool had them: AdamW writes the parameters' segments only. Nothing reads
 * them in a group of one: there is no all-gather, the callbacks get each
 * parameter at its own offset (block_bind_full) and a model that spans two
 * parameters with one pointer may do so only where they lie back to back
 * (examples/llama checks it), bmt_block_gather fills a buffer of its own, and
 * checkpoints read the masters, never b->full. */
static int update_into(bmt_blocklist_t *l, bmt_block_t *b, struct slot *s, bmt_error_t *err)
{
    bmt_ctx_t *ctx = l->ctx;
    void *comm = device_stream(ctx, DEVICE_COMM);
    /* The replica stream writes the slot only once it exists and its last
     * reader is done: both are behind this point of the comm stream. (ready
     * is recorded again once the update is in.) */
    if (device_event_record(ctx, s->ready, comm, err) < 0 ||
        device_stream_wait(ctx, device_stream(ctx, DEVICE_REPLICA), s->ready, err) < 0)
        return -1;
    b->update_dst = s->mem;
    const int rc = blocklist_flush(l, b, false, err);
    b->update_dst = NULL;
    if (rc < 0)
        return -1;
    if (b->update_pending) /* the slot would hold no values at all */
        return errprintf(err, "rank %d: internal: block %.900s's deferred update did not run",
                         ctx->rank, b->name);
    return device_stream_wait(ctx, comm, b->updated, err);
}

/* Gather block i into a slot, on the comm stream. A slot's memory is the
 * size of the block it holds (stream-ordered on the comm stream): when the
 * next block's size differs it is given back and made anew there, after the
 * comm stream's wait for the slot's last reader, so the pool reuses it with
 * no new dependency. Two slots then hold a layer and the embedding at most,
 * not two buffers of the largest block, and zero level 2's slots the blocks'
 * own sizes. */
static int gather(bmt_blocklist_t *l, int i, bmt_error_t *err)
{
    struct entry *e = &l->e[i];
    bmt_block_t *b = e->block;
    if (e->slot)
        return 0; /* kept from forward (zero level 2) */
    if (b->nparams == 0)
        return 0;
    if (block_shards_whole(b)) {
        /* A group of one: the shards are the block; nothing is copied. The
         * compute stream waits for a deferred update of them (await_params). */
        if (b->update_pending) {
            if (blocklist_flush(l, b, false, err) < 0)
                return -1;
            e->after_update = true;
        }
        block_bind_shards(b);
        return 0;
    }
    for (int k = 0; k < l->npslots; k++)
        if (l->pslots[k].owner == b) { /* the block's other use holds it: share */
            l->pslots[k].users++;
            e->slot = &l->pslots[k];
            return 0;
        }
    if (b->own_full)
        return errprintf(err,
                         "rank %d: block %.900s is gathered by bmt_block_gather; release it "
                         "before the block list runs",
                         l->ctx->rank, b->name);
    struct slot *s = pslot_get(l, err);
    if (s == NULL)
        return -1;
    void *comm = device_stream(l->ctx, DEVICE_COMM);
    /* The optimizer's deferred update of b goes first, or writes the slot
     * itself (update_into_slot, below). */
    const bool fused = update_into_slot(l, b);
    if (b->update_pending && !fused) {
        if (blocklist_flush(l, b, false, err) < 0 ||
            device_stream_wait(l->ctx, comm, b->updated, err) < 0)
            return -1;
        e->after_update = true;
    }
    if (device_stream_wait(l->ctx, comm, s->free, err) < 0)
        return -1;
    if (s->bytes != b->full_bytes || s->mem == NULL) {
        bmt_free_async(l->ctx, s->mem, comm);
        s->bytes = 0;
        if ((s->mem = bmt_alloc_async(l->ctx, BMT_MEM_GATHERED, b->full_bytes, comm, err)) == NULL)
            return -1;
        s->bytes = b->full_bytes;
    }
    if (fused) {
        if (update_into(l, b, s, err) < 0)
            return -1;
        e->after_update = true;
    } else if (block_gather_into(b, s->mem, comm, err) < 0) {
        return -1;
    }
    if (device_event_record(l->ctx, s->ready, comm, err) < 0)
        return -1;
    s->owner = b;
    s->users = 1;
    e->slot = s;
    b->full = s->mem;
    block_bind_full(b, s->mem);
    return 0;
}

/* The compute stream waits for block i's parameters. When their gather
 * followed a deferred optimizer update, the wait for the update comes first
 * and is not timed (what the timed wait measures stays communication), and
 * the block's gradient shards, which the update read, go back on the compute
 * stream, whose pool they came from: enqueued here, after the forward of the
 * block before, the wait does not hold that forward up. */
static int await_params(bmt_blocklist_t *l, int i, bmt_error_t *err)
{
    struct entry *e = &l->e[i];
    if (e->after_update) {
        void *compute = device_stream(l->ctx, DEVICE_COMPUTE);
        e->after_update = false;
        if (device_stream_wait(l->ctx, compute, e->block->updated, err) < 0)
            return -1;
        for (int k = 0; k < e->block->ngroups; k++)
            block_drop_grads(e->block, k, compute);
    }
    return e->slot ? device_wait_timed(l->ctx, e->slot->ready, err) : 0;
}

/* Block i is done with its parameters (on the compute stream). */
static int release(bmt_blocklist_t *l, int i, bmt_error_t *err)
{
    struct entry *e = &l->e[i];
    if (e->slot == NULL)
        return 0;
    if (--e->slot->users > 0) { /* the tied block's other use still needs it */
        e->slot = NULL;
        return 0;
    }
    if (device_event_record(l->ctx, e->slot->free, device_stream(l->ctx, DEVICE_COMPUTE), err) < 0)
        return -1;
    e->slot->owner = NULL;
    e->slot = NULL;
    e->block->full = NULL;
    block_bind_full(e->block, NULL);
    return 0;
}

static int call(bmt_blocklist_t *l, int i, bool backward, bool keep, bool recompute, bool fresh,
                bmt_error_t *err)
{
    struct entry *e = &l->e[i];
    bmt_block_t *b = e->block;
    bmt_block_call_t c = {
        .index = i,
        .block = b,
        .params = b->param_ptrs,
        .grads = backward ? b->grad_ptrs : NULL,
        .stream = device_stream(l->ctx, DEVICE_COMPUTE),
        .keep_activations = keep,
        .recompute = recompute,
        .microbatch = l->st.microbatches,
        .grads_fresh = backward && fresh,
    };
    int rc = backward ? e->ops.backward(e->model, &c, err) : e->ops.forward(e->model, &c, err);
    if (rc < 0)
        return errprefix(err, "rank %d: %s of block %d (%.900s): ", l->ctx->rank,
                         backward    ? "backward"
                         : recompute ? "recomputed forward"
                                     : "forward",
                         i, b->name);
    return 0;
}

/* ------------------------------------------------------------ agreement */

/* Collectives on one communicator must be issued in the same order on every
 * rank, and that order follows from the configuration and the blocks. A rank
 * with another prefetch setting or another model would pair its all-gathers
 * with its peers' reduce-scatters: wrong numbers on shm, a hang on NCCL. And
 * layout-invariant initialization (DESIGN.md, invariant 2) holds only when
 * every rank names, shapes and initializes each parameter alike: a rank that
 * built with `seed + rank` or named a parameter after itself would train a
 * different model without any error. So the first forward checks, with one
 * all-reduce of max and min over the world, that every rank has the same
 * fingerprint (XXH3 of all of it); when they differ, one more all-reduce of
 * each block's fingerprints per aspect names the first block and aspect. */
enum aspect {
    ASPECT_NAMES,  /* the block's name and its parameters' names, in order */
    ASPECT_SHAPES, /* shapes, dtypes, padded sizes; the use's position (tied uses) */
    ASPECT_INIT,   /* init kinds and their arguments, flags */
    ASPECT_SEED,   /* the build seed, or "loaded" */
    ASPECTS
};
static const char *const aspect_name[ASPECTS] = {
    "parameter names",
    "parameter shapes or dtypes",
    "initializations (kind, arguments, flags)",
    "build seeds (or whether it was loaded)",
};

static void fp_add(ck_stream_t *h, const void *p, size_t n) { ck_update(h, p, n); }
static void fp_u64(ck_stream_t *h, uint64_t v) { ck_update(h, &v, sizeof(v)); }
static void fp_str(ck_stream_t *h, const char *s) { ck_update(h, s, strlen(s) + 1); }

/* The fingerprint of one aspect of use i, 52 bits (exact in a double). */
static int fingerprint(const bmt_blocklist_t *l, int i, enum aspect a, double *out)
{
    const bmt_block_t *b = l->e[i].block;
    ck_stream_t *h = ck_begin();
    if (h == NULL)
        return -1;
    fp_u64(h, (uint64_t)a);
    switch (a) {
    case ASPECT_NAMES:
        fp_str(h, b->name);
        for (int j = 0; j < b->nparams; j++)
            fp_str(h, b->params[j].name);
        break;
    case ASPECT_SHAPES:
        fp_u64(h, (uint64_t)b->index); /* != i: a tied use */
        fp_u64(h, (uint64_t)b->nparams);
        for (int j = 0; j < b->nparams; j++) {
            fp_u64(h, (uint64_t)b->params[j].ndim);
            fp_add(h, b->params[j].shape, sizeof(int64_t) * (size_t)b->params[j].ndim);
            fp_u64(h, (uint64_t)b->params[j].dtype);
        }
        for (int k = 0; k < b->ngroups; k++)
            fp_u64(h, (uint64_t)b->groups[k].padded);
        break;
    case ASPECT_INIT:
        for (int j = 0; j < b->nparams; j++) {
            const bmt_init_t *in = &b->params[j].init;
            fp_u64(h, (uint64_t)in->kind);
            fp_add(h, &in->a, sizeof(in->a));
            fp_add(h, &in->b, sizeof(in->b));
            fp_add(h, &in->scale, sizeof(in->scale));
            fp_u64(h, (uint64_t)b->params[j].flags);
        }
        break;
    case ASPECT_SEED:
        fp_u64(h, b->loaded ? 1 : 0);
        fp_u64(h, b->loaded ? 0 : b->seed);
        break;
    default: break;
    }
    *out = (double)(ck_end(h) >> 12);
    return 0;
}

/* Uses recomputed inside backward (activation checkpointing). */
static int recomputed(const bmt_blocklist_t *l)
{
    int n = 0;
    for (int i = 0; i < l->n; i++)
        n += l->e[i].recompute;
    return n;
}

static int check_same_everywhere(bmt_blocklist_t *l, bmt_error_t *err)
{
    bmt_ctx_t *ctx = l->ctx;
    /* 1. Everything at once: the configuration, the use count, every aspect. */
    ck_stream_t *h = ck_begin();
    if (h == NULL)
        return errprintf(err, "rank %d: out of memory", ctx->rank);
    fp_u64(h, (uint64_t)l->n);
    fp_u64(h, (uint64_t)l->cfg.zero_level);
    fp_u64(h, (uint64_t)l->cfg.checkpointing);
    fp_u64(h, (uint64_t)l->cfg.prefetch);
    fp_u64(h, (uint64_t)l->cfg.grad_dtype);
    for (int i = 0; i < l->n; i++)
        fp_u64(h, (uint64_t)l->e[i].recompute);
    double cfg_fp = 0;
    for (int i = 0; i < l->n; i++)
        for (int a = 0; a < ASPECTS; a++) {
            double f;
            if (fingerprint(l, i, (enum aspect)a, &f) < 0) {
                ck_end(h);
                return errprintf(err, "rank %d: out of memory", ctx->rank);
            }
            fp_add(h, &f, sizeof(f));
        }
    double mine = (double)(ck_end(h) >> 12), v[4] = { mine, -mine, l->n, -l->n };
    if (bmt_all_reduce_host_f64(ctx->world_comm, v, 4, BMT_MAX, err) < 0)
        return errprefix(err, "checking that every rank has the same block list: ");
    if (v[0] == mine && -v[1] == mine)
        return 0;
    /* 2. They differ: say where. The use counts first (the next all-reduce has
     * one entry per use, so its length must agree). */
    if (v[2] != l->n || -v[3] != l->n)
        return errprintf(err,
                         "rank %d: the ranks' block lists differ: they hold %d to %d blocks "
                         "(this rank %d); every rank must build the same blocks in the same "
                         "order",
                         ctx->rank, (int)-v[3], (int)v[2], l->n);
    const size_t n = (size_t)l->n * ASPECTS + 1;
    double *f = calloc(2 * n, sizeof(double));
    if (f == NULL)
        return errprintf(err, "rank %d: the ranks' block lists differ (out of memory saying where)",
                         ctx->rank);
    int rc = 0;
    for (int i = 0; i < l->n && rc == 0; i++)
        for (int a = 0; a < ASPECTS && rc == 0; a++)
            rc = fingerprint(l, i, (enum aspect)a, &f[(size_t)i * ASPECTS + (size_t)a]);
    ck_stream_t *c = ck_begin();
    if (c) {
        fp_u64(c, (uint64_t)l->cfg.zero_level);
        fp_u64(c, (uint64_t)l->cfg.checkpointing);
        fp_u64(c, (uint64_t)l->cfg.prefetch);
        fp_u64(c, (uint64_t)l->cfg.grad_dtype);
        for (int i = 0; i < l->n; i++)
            fp_u64(c, (uint64_t)l->e[i].recompute);
        cfg_fp = (double)(ck_end(c) >> 12);
    }
    f[n - 1] = cfg_fp;
    for (size_t k = 0; k < n; k++)
        f[n + k] = -f[k];
    if (rc < 0 || bmt_all_reduce_host_f64(ctx->world_comm, f, 2 * n, BMT_MAX, err) < 0) {
        free(f);
        return errprintf(err, "rank %d: the ranks' block lists differ (and saying where failed)",
                         ctx->rank);
    }
    if (f[n - 1] != -f[2 * n - 1]) {
        free(f);
        return errprintf(err,
                         "rank %d: the ranks' block lists differ in their configuration: every "
                         "rank needs the same zero level, checkpointing (of every use), prefetch "
                         "and grad dtype (this rank: %d, %d with %d of %d uses recomputed, %d, %s)",
                         ctx->rank, l->cfg.zero_level, l->cfg.checkpointing, recomputed(l), l->n,
                         l->cfg.prefetch, bmt_dtype_name(l->cfg.grad_dtype));
    }
    for (int i = 0; i < l->n; i++)
        for (int a = 0; a < ASPECTS; a++) {
            size_t k = (size_t)i * ASPECTS + (size_t)a;
            if (f[k] == -f[n + k])
                continue;
            const bmt_block_t *b = l->e[i].block;
            char mine_txt[256] = "";
            if (a == ASPECT_SEED && b->loaded)
                snprintf(mine_txt, sizeof(mine_txt), "; this rank loaded its values");
            else if (a == ASPECT_SEED)
                snprintf(mine_txt, sizeof(mine_txt), "; this rank's seed is %llu",
                         (unsigned long long)b->seed);
            else if (a == ASPECT_NAMES && b->nparams > 0)
                snprintf(mine_txt, sizeof(mine_txt), "; this rank's first is '%.200s'",
                         b->params[0].name);
            free(f);
            return errprintf(err,
                             "rank %d: the ranks' block lists differ: block %d ('%.900s') was "
                             "built differently, its %s differ across ranks%s. Every rank must "
                             "build the same blocks with the same names, shapes, initializations "
                             "and seed (layout-invariant initialization: the seed must not "
                             "depend on the rank)",
                             ctx->rank, i, b->name, aspect_name[a], mine_txt);
        }
    free(f);
    return errprintf(err, "rank %d: the ranks' block lists differ", ctx->rank);
}

/* A block gathered by bmt_block_gather holds its own buffer: the schedule must
 * not take it over. Checked before anything runs, so the list stays usable. */
static int none_held(const bmt_blocklist_t *l, bmt_error_t *err)
{
    for (int i = 0; i < l->n; i++)
        if (l->e[i].block->own_full)
            return errprintf(err,
                             "rank %d: block %.900s is gathered by bmt_block_gather; release it "
                             "before the block list runs",
                             l->ctx->rank, l->e[i].block->name);
    return 0;
}

int blocklist_cancel_forward(bmt_blocklist_t *l, bmt_error_t *err)
{
    for (int i = 0; i < l->n; i++)
        if (release(l, i, err) < 0)
            return broken(l, err);
    l->st.forward_pending = false;
    return 0;
}

/* ------------------------------------------------------------ forward */

int bmt_blocklist_forward(bmt_blocklist_t *l, bmt_error_t *err)
{
    if (l == NULL)
        return errprintf(err, "bmt_blocklist_forward: list is NULL");
    if (l->phase == PHASE_BROKEN)
        return errprintf(err, "rank %d: an earlier error left this block list unusable",
                         l->ctx->rank);
    if (l->n == 0)
        return errprintf(err, "rank %d: the block list is empty", l->ctx->rank);
    if (none_held(l, err) < 0)
        return -1;
    bmt_ctx_t *ctx = l->ctx;
    if (!l->checked) {
        if (check_same_everywhere(l, err) < 0)
            return broken(l, err);
        l->checked = true;
        blocklist_seal(l);
    }
    void *comm = device_stream(ctx, DEVICE_COMM);
    /* Parameters (and zeroed gradient shards) the optimizer wrote. */
    if (device_stream_wait(ctx, comm, l->st.updated, err) < 0)
        return broken(l, err);
    /* A forward without backward (evaluation) leaves zero-2 slots held: drop them. */
    for (int i = 0; i < l->n; i++)
        if (release(l, i, err) < 0)
            return broken(l, err);
    if (gather(l, 0, err) < 0)
        return broken(l, err);
    for (int i = 0; i < l->n; i++) {
        if (l->cfg.prefetch && i + 1 < l->n && gather(l, i + 1, err) < 0)
            return broken(l, err);
        if (await_params(l, i, err) < 0 ||
            call(l, i, false, !l->e[i].recompute, false, false, err) < 0)
            return broken(l, err);
        if (l->cfg.zero_level == 3 && release(l, i, err) < 0)
            return broken(l, err);
        if (!l->cfg.prefetch && i + 1 < l->n && gather(l, i + 1, err) < 0)
            return broken(l, err);
    }
    l->phase = PHASE_FORWARD_DONE;
    l->st.forward_pending = true;
    return 0;
}

/* ------------------------------------------------------------ backward */

static int shard_final(bmt_blocklist_t *l, bmt_block_t *b, void *after, bmt_error_t *err);

/* Reduce block b's full gradients (in slot g) into its f32 shards, on the comm
 * stream; on the last micro-batch, all-reduce the shards across groups on the
 * replica stream. What a dtype group needs besides (the bf16 copy of its
 * gradients for a bf16 reduce; the reduce-scatter's output when it adds to
 * the shard instead of writing it) is stream-ordered on the comm stream, the
 * group's size, from before its first use to after its last. */
static int reduce(bmt_blocklist_t *l, bmt_block_t *b, struct slot *g, bool last, bmt_error_t *err)
{
    bmt_ctx_t *ctx = l->ctx;
    void *comm = device_stream(ctx, DEVICE_COMM);
    const bmt_dtype_t gt = l->cfg.grad_dtype;
    if (device_stream_wait(ctx, comm, g->ready, err) < 0)
        return -1;
    for (int k = 0; k < b->ngroups; k++) {
        struct dgroup *d = &b->groups[k];
        const char *full = (const char *)g->mem + d->grad_off;
        void *stage = NULL, *tmp = NULL;
        int rc = 0;
        if (gt == BMT_BF16) {
            /* Half the traffic: round the f32 gradients to bf16 for the wire;
             * the shards stay f32. */
            stage = bmt_alloc_async(ctx, BMT_MEM_GRAD_FULL, dsize(BMT_BF16, d->padded), comm, err);
            rc = stage == NULL
                     ? -1
                     : kern_cast(ctx, comm, stage, BMT_BF16, full, BMT_F32, d->padded, err);
            full = stage;
        }
        if (rc == 0 && b->grad_fresh && gt == BMT_F32) {
            rc = comm_reduce_scatter_on(ctx->group_comm, full, d->grad, d->shard, gt, BMT_SUM, comm,
                                        err);
        } else if (rc == 0) {
            tmp = bmt_alloc_async(ctx, BMT_MEM_WORKSPACE, dsize(gt, d->shard), comm, err);
            rc = tmp == NULL ||
                         comm_reduce_scatter_on(ctx->group_comm, full, tmp, d->shard, gt, BMT_SUM,
                                                comm, err) < 0 ||
                         kern_accumulate(ctx, comm, d->grad, tmp, gt, d->shard, err) < 0
                     ? -1
                     : 0;
        }
        bmt_free_async(ctx, tmp, comm);
        bmt_free_async(ctx, stage, comm);
        if (rc < 0)
            return -1;
    }
    b->grad_fresh = false;
    if (device_event_record(ctx, g->free, comm, err) < 0)
        return -1;
    return last ? shard_final(l, b, comm, err) : 0;
}

/* On the last micro-batch, once what `after` has enqueued (the shard's last
 * writer) is done: all-reduce block b's gradient shards across the groups on
 * the replica stream, then take each shard's sum of squares for the
 * optimizer's gradient norm where the shard is final (the replica stream
 * across groups, else the comm stream), off the compute stream and before
 * the step, which then only reads them (list_state.sums). */
static int shard_final(bmt_blocklist_t *l, bmt_block_t *b, void *after, bmt_error_t *err)
{
    bmt_ctx_t *ctx = l->ctx;
    const bool cross = ctx->layout.groups > 1;
    if (!cross && l->st.sums == NULL)
        return 0;
    void *s = device_stream(ctx, cross ? DEVICE_REPLICA : DEVICE_COMM);
    if (s != after && (device_event_record(ctx, b->rs_done, after, err) < 0 ||
                       device_stream_wait(ctx, s, b->rs_done, err) < 0))
        return -1;
    for (int k = 0; k < b->ngroups; k++) {
        struct dgroup *d = &b->groups[k];
        if (cross && comm_all_reduce_on(ctx->replica_comm, d->grad, d->grad, d->shard, BMT_F32,
                                        BMT_SUM, s, err) < 0)
            return -1;
        if (l->st.sums && kern_sumsq(ctx, s, d->grad, d->shard, l->st.sums, d->sum_slot, err) < 0)
            return -1;
    }
    return 0;
}

/* Every backward starts with a world all-reduce (MAX) of whether it is this
 * rank's last micro-batch of the step: [last, -last, the lowest rank whose is
 * not, the lowest rank whose is], stream-ordered on the comm stream (after the
 * forward's gathers, before the backward's collectives; the host does not
 * wait). Ranks that disagree would average different things (across groups) or
 * pair their collectives with the wrong ones; a rank whose step ends here
 * reads the flags in its step (optim.c, after the step's synchronization and
 * before its first collective) and stops the job, naming the other rank. The
 * collectives a disagreement pairs before that inside a group are of the same
 * kinds and sizes (this backward's against the other rank's next one), so
 * nothing hangs on the way. Across groups the last micro-batch's backward
 * issues replica all-reduces that a rank still in an earlier micro-batch does
 * not: there the host waits for the flags first (once per step, for the comm
 * stream: its forward gathers and this all-reduce) and fails at once. */
static int backward_flags(bmt_blocklist_t *l, bool last, bmt_error_t *err)
{
    bmt_ctx_t *ctx = l->ctx;
    if (ctx->world == 1)
        return 0;
    void *comm = device_stream(ctx, DEVICE_COMM);
    if (l->st.flags == NULL &&
        (l->st.flags = bmt_alloc(ctx, BMT_MEM_WORKSPACE, 4 * sizeof(double), err)) == NULL)
        return -1;
    const double me = ctx->world - ctx->rank;
    const double v[4] = { last ? 1 : 0, last ? -1 : 0, last ? 0 : me, last ? me : 0 };
    for (int k = 0; k < 4; k++) {
        const bmt_init_t c = { BMT_INIT_CONSTANT, v[k], 0, 1 };
        const uint32_t key[2] = { 0, 0 };
        if (kern_init(ctx, comm, l->st.flags + k, BMT_F64, 1, 0, key, &c, err) < 0)
            return -1;
    }
    l->st.flags_micro = l->st.microbatches + 1;
    if (comm_all_reduce_on(ctx->world_comm, l->st.flags, l->st.flags, 4, BMT_F64, BMT_MAX, comm,
                           err) < 0)
        return -1;
    if (!last || ctx->layout.groups == 1)
        return 0;
    double f[4];
    if (device_stream_synchronize(ctx, DEVICE_COMM, err) < 0 ||
        bmt_mem_download(ctx, f, l->st.flags, sizeof(f), err) < 0)
        return -1;
    return blocklist_flags_agree(l, f, err);
}

int blocklist_flags_agree(bmt_blocklist_t *l, const double f[4], bmt_error_t *err)
{
    bmt_ctx_t *ctx = l->ctx;
    if (f[0] == -f[1]) /* max(last) == min(last) */
        return 0;
    return errprintf(err,
                     "rank %d: the ranks ran different numbers of micro-batches in this step: "
                     "micro-batch %d is this rank's last (bmt_blocklist_backward's "
                     "last_microbatch) but not rank %d's; every rank must call "
                     "bmt_blocklist_backward equally often between optimizer steps",
                     ctx->rank, l->st.flags_micro, ctx->world - (int)f[2]);
}

int bmt_blocklist_backward(bmt_blocklist_t *l, bool last, bmt_error_t *err)
{
    if (l == NULL)
        return errprintf(err, "bmt_blocklist_backward: list is NULL");
    bmt_ctx_t *ctx = l->ctx;
    if (l->phase == PHASE_BROKEN)
        return errprintf(err, "rank %d: an earlier error left this block list unusable", ctx->rank);
    if (!l->st.forward_pending)
        return errprintf(err,
                         "rank %d: bmt_blocklist_backward without a forward before it (since "
                         "the last backward or optimizer step)",
                         ctx->rank);
    if (l->st.reduced)
        return errprintf(err,
                         "rank %d: bmt_blocklist_backward after the last micro-batch's backward; "
                         "call bmt_optim_step first",
                         ctx->rank);
    if (none_held(l, err) < 0)
        return -1;
    if (backward_flags(l, last, err) < 0)
        return broken(l, err);
    /* Gradient shards and parameters are the optimizer's until its step is done. */
    if (device_stream_wait(ctx, device_stream(ctx, DEVICE_COMM), l->st.updated, err) < 0)
        return broken(l, err);
    void *compute = device_stream(ctx, DEVICE_COMPUTE);
    const bmt_dtype_t gt = BMT_F32; /* full gradients, as the model writes them */
    const bool direct = direct_grads(l), sums = last && l->st.sums != NULL;
    l->st.sums_ready = false;
    if (gather(l, l->n - 1, err) < 0)
        return broken(l, err);
    for (int i = l->n - 1; i >= 0; i--) {
        bmt_block_t *b = l->e[i].block;
        if (l->cfg.prefetch && i > 0 && gather(l, i - 1, err) < 0)
            return broken(l, err);
        if (await_params(l, i, err) < 0)
            return broken(l, err);
        if (l->e[i].recompute && call(l, i, false, true, true, false, err) < 0)
            return broken(l, err);
        struct slot *g = NULL;
        if (b->nparams > 0 && block_need_grads(b, compute, direct ? l->fresh : FRESH_ZERO, err) < 0)
            return broken(l, err);
        if (b->nparams > 0 && direct) {
            block_bind_shard_grads(b);
        } else if (b->nparams > 0) {
            if ((g = grad_slot(l, b, err)) == NULL)
                return broken(l, err);
            block_bind_grads(b, g->mem, gt);
        }
        /* fresh: the gradients hold nothing yet. A full buffer per call; in a
         * group of one the shards themselves, fresh from block_need_grads
         * (which makes and block_drop_grads' callers give back every dtype
         * group of a block together) until this call writes them. */
        const bool fresh = b->nparams > 0 && (!direct || b->grad_fresh);
        if (call(l, i, true, true, false, fresh, err) < 0)
            return broken(l, err);
        if (direct)
            b->grad_fresh = false; /* a later micro-batch or use adds */
        if (release(l, i, err) < 0)
            return broken(l, err);
        /* A tied block is reduced at each use; its shard crosses the groups
         * after its last reduction, at its first use. */
        const bool cross = last && i == b->index;
        if (b->nparams > 0) {
            block_bind_grads(b, NULL, gt);
            if (direct) { /* the shard is written: only the groups and its sum are left */
                if (cross && shard_final(l, b, compute, err) < 0)
                    return broken(l, err);
            } else if (device_event_record(ctx, g->ready, compute, err) < 0 ||
                       reduce(l, b, g, cross, err) < 0)
                return broken(l, err);
        }
        if (!l->cfg.prefetch && i > 0 && gather(l, i - 1, err) < 0)
            return broken(l, err);
    }
    grad_slots_drop(l);
    l->st.microbatches++;
    if (last)
        l->st.reduced = true;
    l->st.sums_ready = sums;
    l->st.forward_pending = false;
    l->phase = PHASE_IDLE;
    return 0;
}

void bmt_blocklist_destroy(bmt_blocklist_t *l)
{
    if (l == NULL)
        return;
    bmt_ctx_t *ctx = l->ctx;
    ctx->live_lists--;
    bmt_error_t ignored;
    bmt_device_synchronize(ctx, &ignored); /* nothing may still read what we free */
    if (l->st.orphan) {                    /* destroyed before its optimizer, against the rule */
        if (l->st.master_owner)
            l->st.orphan(l->st.master_owner);
        if (l->st.pending) /* likewise: its deferred updates are lost with the blocks */
            l->st.orphan(l->st.pending);
        if (l->st.optim)
            l->st.orphan(l->st.optim);
    }
    /* From the end: a tied block's second use comes after its first, so it is
     * seen (and skipped) while the block is still alive; the first use frees
     * it. (From the front, the second use read a freed block.) */
    for (int i = l->n - 1; i >= 0; i--) {
        bmt_block_t *b = l->e[i].block;
        if (b->index != i)
            continue; /* a tied use: the block goes with its first entry */
        b->list = NULL;
        b->settle = NULL;
        if (!b->own_full)
            b->full = NULL; /* a pool slot, freed below; its own buffer goes with it */
        bmt_block_destroy(b);
    }
    for (int k = 0; k < l->npslots; k++) {
        bmt_free(ctx, l->pslots[k].mem);
        device_event_destroy(ctx, l->pslots[k].ready);
        device_event_destroy(ctx, l->pslots[k].free);
    }
    for (int k = 0; k < 2; k++) {
        bmt_free(ctx, l->gslots[k].mem);
        device_event_destroy(ctx, l->gslots[k].ready);
        device_event_destroy(ctx, l->gslots[k].free);
    }
    device_event_destroy(ctx, l->st.updated);
    bmt_free(ctx, l->st.flags);
    free(l->pslots);
    free(l->e);
    free(l);
}
