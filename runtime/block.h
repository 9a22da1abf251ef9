/* runtime/block.h — blocks, block lists and the optimizer's shared view (internal).
 *
 * Three layers, each calling only the ones below it:
 *   block.c     storage: parameter layout, shards, initialization, full buffers;
 *   schedule.c  the block list: the forward/backward schedule over blocks and
 *               the gradient reduction;
 *   optim.c     the update over shards: AdamW;
 * and ckpt.c above all three. Where a lower layer must let an upper one act
 * (a block read outside the schedule must first get the optimizer's deferred
 * update; a list destroyed first must tell its optimizer), the upper layer
 * installs a function pointer below (bmt_block.settle, list_state.flush and
 * .orphan): the lower layer never names the upper one's functions.
 */
#ifndef BMT_RUNTIME_BLOCK_H
#define BMT_RUNTIME_BLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bmt/block.h"
#include "bmt/optim.h"

struct param {
    char *name; /* full name: "<block>.<param>" */
    int ndim;
    int64_t shape[BMT_MAX_DIMS];
    int64_t numel;
    bmt_dtype_t dtype;
    bmt_init_t init;
    unsigned flags;
    int group;     /* index into bmt_block.groups */
    size_t offset; /* elements, in the group's flat buffer */
};

/* One flat buffer per dtype. Sizes in elements. */
struct dgroup {
    bmt_dtype_t dtype;
    size_t numel;       /* used, including alignment gaps */
    size_t padded;      /* numel rounded up to BMT_BLOCK_ALIGN x group size */
    size_t shard;       /* padded / group size */
    size_t shard_first; /* group_rank x shard: first element of this rank's shard */
    void *param;        /* (shard) dtype, BMT_MEM_PARAM; NULL while a master_only
                         * optimizer holds the values (master below) */
    float *master;      /* (shard) f32: the optimizer's master when param is NULL */
    float *grad;        /* (shard) f32, BMT_MEM_GRAD; allocated when appended to a list */
    int sum_slot;       /* the optimizer's index of this group's sum of squares (optim.c) */
    size_t full_off;    /* bytes: where this group starts in a full parameter buffer */
    size_t grad_off;    /* bytes: where this group starts in a full gradient buffer */
};

struct bmt_block {
    bmt_ctx_t *ctx;
    char *name;
    struct param *params;
    int nparams, cap;
    struct dgroup groups[BMT_DTYPE_COUNT];
    int ngroups;
    bool built;
    bool sealed;           /* in a list that trains or has an optimizer: no loads */
    uint64_t seed;         /* bmt_block_build's: every rank must use the same */
    bool loaded;           /* its values were replaced by a load: the seed no longer matters */
    bmt_blocklist_t *list; /* the list that owns it, once appended */
    /* Installed by the list (schedule.c): apply what is pending on the shards
     * (the optimizer's deferred update) before bmt_block_gather reads them. */
    int (*settle)(bmt_block_t *b, bmt_error_t *err);
    int index;         /* position in the list */
    size_t full_bytes; /* a full parameter buffer of this block */
    size_t grad_bytes; /* a full gradient buffer (list's grad dtype) */
    /* Gathered state. */
    void *full;        /* the full parameter buffer, NULL when released */
    bool own_full;     /* allocated by bmt_block_gather (outside a list) */
    void **param_ptrs; /* (nparams) into full */
    void **grad_ptrs;  /* (nparams) into the full gradient buffer in backward */
    /* Gradient state (schedule.c, optim.c). */
    bool grad_fresh; /* grad shards hold nothing yet (or none exist): reduce-scatter overwrites;
                      * in a group of one the next backward call writes them (grads_fresh) */
    void *rs_done;   /* event: this block's gradient shard is reduced in the group */
    /* Deferred optimizer update (optim.c): the step's update of this block is
     * still to be enqueued; updated: the last enqueued update is done. */
    bool update_pending;
    void *updated;
    /* Set by the schedule only around the flush of a forward's gather in a
     * group of one whose every dtype group lives in a master_only optimizer
     * (schedule.c, update_into_slot): the full buffer (a pool slot) that the
     * update writes its bf16 rounding into, at the gathered positions, in the
     * same pass as the master; NULL otherwise. */
    void *update_dst;
};

/* The part of parameter p in this rank's shard of its group d: elements
 * [*lo, *hi) of the group's flat buffer; false when it lies outside the shard. */
static inline bool block_in_shard(const struct param *p, const struct dgroup *d, size_t *lo,
                                  size_t *hi)
{
    *lo = p->offset > d->shard_first ? p->offset : d->shard_first;
    *hi = p->offset + (size_t)p->numel;
    if (*hi > d->shard_first + d->shard)
        *hi = d->shard_first + d->shard;
    return *lo < *hi;
}

/* The first of n values of dtype t at p that is not finite (nan, +-inf): its
 * index, or -1 (dtype.c; checkpoints' save and load, bmt_block_load). */
int64_t dtype_first_nonfinite(const void *p, bmt_dtype_t t, size_t n);
/* "nan", "inf" or "-inf": what element i of p (dtype t) holds. */
const char *dtype_nonfinite_name(const void *p, bmt_dtype_t t, size_t i);

/* Bytes of n elements of t. */
static inline size_t dsize(bmt_dtype_t t, size_t n) { return n * bmt_dtype_size(t); }

/* Point block->param_ptrs into a full buffer at base. */
void block_bind_full(bmt_block_t *b, void *base);

/* A group of one rank holds whole blocks: its shards are the full (padded)
 * flat buffers. block_shards_whole says so (and that every dtype group has its
 * shard: not under a master_only optimizer, whose values must be rounded into
 * a buffer); block_bind_shards points param_ptrs into the shards themselves. */
bool block_shards_whole(const bmt_block_t *b);
void block_bind_shards(bmt_block_t *b);

/* Lay out a full gradient buffer of dtype gt (grad_off, grad_bytes). */
void block_layout_grads(bmt_block_t *b, bmt_dtype_t gt);

/* Point block->grad_ptrs into a full gradient buffer at base (dtype gt). */
void block_bind_grads(bmt_block_t *b, void *base, bmt_dtype_t gt);

/* Point block->grad_ptrs into the f32 gradient shards themselves: for a group
 * of one rank, whose shard is the whole (padded) buffer. */
void block_bind_shard_grads(bmt_block_t *b);

/* Where this rank's shard of dtype group d lies in a full buffer at base (in
 * d's dtype): what an all-gather in place sends. */
static inline char *block_own_part(const struct dgroup *d, void *base)
{
    return (char *)base + d->full_off + dsize(d->dtype, d->shard_first);
}

/* Enqueue the all-gather of every dtype group into the full buffer at base, on
 * stream (comm stream in a list, NULL otherwise). */
int block_gather_into(bmt_block_t *b, void *base, void *stream, bmt_error_t *err);

/* How gradients that hold nothing yet are made ready for the callbacks:
 * zeroed (FRESH_ZERO: the callbacks add), or left to callbacks that overwrite
 * every element (bmt_blocklist_set_grad_overwrite), with only the alignment
 * gaps and the padding zeroed (FRESH_LEAVE), after a fill with NaN under
 * BMT_CHECK_OVERWRITE=1 (FRESH_POISON), so that a callback that adds to them
 * or misses an element makes NaN instead of a plausible wrong number. */
enum fresh_mode {
    FRESH_ZERO,
    FRESH_LEAVE,
    FRESH_POISON
};

/* Make dtype group g's f32 gradients at base (its padded elements, laid out
 * as the flat buffer) ready as mode says, on stream. */
int block_fresh_grads(bmt_block_t *b, int g, float *base, enum fresh_mode mode, void *stream,
                      bmt_error_t *err);

/* Gradient shards (f32, BMT_MEM_GRAD) live from the first backward of a step
 * that writes them to the optimizer's step that consumes them: between steps
 * (the forward's peak) they take no memory. block_need_grads allocates the
 * missing ones in stream order on stream, ready there as mode says (a mode
 * other than FRESH_ZERO only where a shard is the whole padded buffer, a
 * group of one; elsewhere they are zeroed), and sets b->grad_fresh when it
 * allocated them (they hold nothing yet); block_drop_grads gives them back on
 * stream once what is enqueued before it is done. */
int block_need_grads(bmt_block_t *b, void *stream, enum fresh_mode mode, bmt_error_t *err);
void block_drop_grads(bmt_block_t *b, int group, void *stream);

/* What the optimizer needs of a list. */
struct list_state {
    int microbatches;          /* backward calls since the last step */
    bool reduced;              /* a backward with last_microbatch ran since the last step */
    bool forward_pending;      /* a forward ran whose backward has not (a step cancels it) */
    bool sealed;               /* training started or an optimizer exists: no more blocks */
    void *updated;             /* event: the optimizer wrote the parameter shards */
    bmt_optim_t *master_owner; /* a master_only optimizer holds the shards' values */
    bmt_optim_t *pending;      /* an optimizer whose last step is not applied to every block */
    bmt_optim_t *optim;        /* the optimizer whose sums the backward writes (the newest) */
    double *sums;              /* device, optim's (one per state): sums of squares of the shards */
    bool sums_ready;           /* the last micro-batch's backward wrote every shard's sum */
    double *flags;             /* device (4): each backward's all-reduce of whether it ends
                                * the step (schedule.c); the step reads it (optim.c) */
    int flags_micro;           /* the micro-batch (from 1) of the last backward's flags */
    /* Installed by the optimizer (optim.c), called by the schedule: apply o's
     * deferred update to block b (every block when NULL), and tell o that the
     * list is gone. */
    int (*flush)(bmt_optim_t *o, bmt_block_t *b, bool drop, bmt_error_t *err);
    void (*orphan)(bmt_optim_t *o);
};

struct list_state *blocklist_state(bmt_blocklist_t *list);

/* The file of b in a checkpoint: "transformer.h.3" -> "transformer.h.3.safetensors"
 * (".optim" before it for the optimizer's); '/' would leave the directory, so
 * it becomes '_'. */
void block_file_name(const bmt_block_t *b, bool optim, char *out, size_t len);

/* Would b's checkpoint file be model.safetensors? transformers'
 * from_pretrained, and bmt_st_open of a step directory (generate, the
 * trainers' --init-from), read that file alone when a directory has one and
 * never open the index, so the checkpoint would load as that one block: -1
 * with err, else 0. bmt_blocklist_append refuses such a block. */
int block_hf_shadowed(const bmt_block_t *b, bmt_error_t *err);

/* Could b and other not both be in one checkpoint? The same name, checkpoint
 * files that meet ("a/b" and "a_b"; with optim, also the optimizer's files:
 * "x" and "x.optim") or a parameter full name in both ("a" + "b.w", "a.b" +
 * "w"): -1 with err saying which, else 0. bmt_blocklist_append checks each new
 * block against the list's (without optim) and bmt_adamw_create every pair
 * (with), so a model that cannot be saved is refused as it is built rather
 * than at its first save: blocks enter a list only through these, so the save
 * and the load need no check of their own. */
int block_name_clash(const bmt_block_t *b, const bmt_block_t *other, bool optim, bmt_error_t *err);

/* bmt_block_load without the "before the optimizer" rule (ckpt.c loads the
 * parameters and the optimizer's state together); direct: on cpu, read into
 * the shards without staging (not all or nothing; see block.c). */
int block_load(bmt_block_t *b, bmt_block_source_fn fn, void *user, bool direct, bmt_error_t *err);

/* The optimizer's state, as checkpoints see it (optim.c). */
typedef struct optim_view {
    bmt_block_t *block;
    struct dgroup *d;
    float *master; /* (shard) f32; d->param itself when the group is f32; NULL when split */
    float *m, *v;  /* (shard) f32 */
    uint16_t *lo;  /* (shard) master_only 2: the master's low half, d->param its high
                    * (kern_split_*, runtime/kernels.h); NULL otherwise */
} optim_view_t;
int optim_count(const bmt_optim_t *o);
void optim_get(const bmt_optim_t *o, int i, optim_view_t *out);
bmt_blocklist_t *optim_list(const bmt_optim_t *o);
/* Does o keep any master split (master_only 2)? Its low halves then belong
 * with the shards: a checkpoint load must pass o. */
bool optim_splits(const bmt_optim_t *o);
/* A checkpoint load wrote o's state (and the parameters) in full (whole), or
 * failed after it began writing them: then o refuses to step until a load
 * succeeds, since parameters and state may not belong together (under
 * master_only 2 a half-loaded pair of halves may even join to NaN). */
void optim_set_loaded(bmt_optim_t *o, bool whole);
/* The values of a group's shard in its dtype, into dst (device memory of
 * shard elements): a copy of param, or the master rounded when param is NULL. */
int block_shard_values(bmt_ctx_t *ctx, const struct dgroup *d, void *dst, void *stream,
                       bmt_error_t *err);
void optim_counters(const bmt_optim_t *o, int64_t *step, int64_t *skipped);
void optim_set_counters(bmt_optim_t *o, int64_t step, int64_t skipped);

/* A deferred optimizer step (bmt_adamw_config_t.overlap) applied now to block
 * b, or to every block when b is NULL, through list_state.flush: its AdamW
 * kernels are enqueued on the replica stream and b->updated recorded after
 * them; drop: the gradient shards go back on that stream too (else the caller
 * gives them back after a wait for b->updated). Anything that reads or writes
 * parameters, gradient shards or optimizer state outside the forward calls
 * this first, with drop (the forward calls it for each block before its
 * gather, without). No-op when nothing is pending. */
int blocklist_flush(bmt_blocklist_t *list, bmt_block_t *b, bool drop, bmt_error_t *err);

/* f: the flags of the last backward (list_state.flags, downloaded), on a rank
 * whose step ends there: 0, or -1 with err naming a rank whose step does not. */
int blocklist_flags_agree(bmt_blocklist_t *list, const double f[4], bmt_error_t *err);

/* No more blocks: training starts or an optimizer exists. Marks every block
 * sealed too (bmt_block_load refuses then). */
void blocklist_seal(bmt_blocklist_t *list);

/* Drop a forward whose backward will not run (the optimizer stepped): release
 * the parameter buffers zero level 2 kept for it. */
int blocklist_cancel_forward(bmt_blocklist_t *list, bmt_error_t *err);
bmt_ctx_t *blocklist_ctx(bmt_blocklist_t *list);

#endif
