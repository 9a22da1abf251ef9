/* bmt/optim.h — AdamW on sharded f32 master weights.
 *
 * Each rank updates only its shards: f32 master weights and both moments live
 * in BMT_MEM_OPTIM (for f32 parameters the master is the parameter shard
 * itself; for bf16 ones it starts as the bf16 shard widened to f32), and the
 * update writes the compute-dtype parameter shard. A step:
 *   1. waits for the block list's gradient reductions;
 *   2. scales the gradients by 1 / (world size x micro-batches);
 *   3. computes the global gradient norm (sum of squares over the group;
 *      replicas hold equal shards after the cross-group all-reduce);
 *   4. skips the step if the norm is inf or nan (counting it; more than
 *      max_skipped skipped steps in a row fail the step: a diverged run stops
 *      instead of running on with its parameters frozen), else clips to
 *      clip_norm when set and applies AdamW exactly as torch.optim.AdamW does
 *      (decoupled weight decay, bias correction);
 *   5. gives the gradient shards back (the next backward makes them anew,
 *      zeroed). With overlap (the default) 4 and 5 happen per block at the
 *      next forward, before the block's gather, overlapping the forward.
 */
#ifndef BMT_OPTIM_H
#define BMT_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "bmt/block.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bmt_optim bmt_optim_t;

/* Learning rate of step (1-based: the steps taken, skipped ones not counted)
 * given the base rate. NULL: constant. */
/* Must return a finite number >= 0 that f32 holds, with its product with
 * weight_decay (AdamW computes in f32; anything else fails the step unchanged). */
typedef double (*bmt_lr_schedule_fn)(void *user, int64_t step, double base_lr);

typedef struct bmt_adamw_config {
    size_t size;
    uint32_t magic;
    uint32_t version;
    double lr;           /* default 1e-3 */
    double beta1, beta2; /* default 0.9, 0.999 */
    double eps;          /* default 1e-8 */
    double weight_decay; /* default 0.01; not applied to BMT_PARAM_NO_DECAY parameters */
    double clip_norm;    /* > 0: clip the global gradient norm to it; 0 (default): off */
    bmt_lr_schedule_fn schedule;
    void *schedule_user;
    int master_only; /* 1: parameters stored in a lower precision than f32 (bf16) keep
                      * no shard of their own while this optimizer lives: the f32
                      * master is the only copy, and a gather rounds it on the way
                      * (FSDP2's arrangement; saves 2 bytes per parameter / group
                      * size). Each shard is freed as soon as its master
                      * exists, so creation never holds all of them next to
                      * the optimizer's state. The results are the same bits
                      * either way. In a group of one with overlap, the
                      * forward's deferred update writes the rounding into
                      * the gathered buffer itself (one pass over the master).
                      * bmt_optim_destroy gives the blocks their shards back.
                      * 2: the split master: for bf16 parameters the f32 master is
                      * kept as two 16-bit halves, the block's bf16 shard (the
                      * master rounded to nearest, ties away from zero) and the
                      * low 16 bits of the master's pattern beside it in the
                      * optimizer; no f32 copy. The memory of 1 (4 bytes a
                      * parameter / group size for the master), the gathers of
                      * 0 (they send the shard; a group of one computes on it in
                      * place, with no rounding pass), and an update that moves
                      * 28 bytes a parameter where 0 moves 30. The master is
                      * kept losslessly: given the same gradients, an update
                      * gives the same master bits as 0 and 1. The shard is its
                      * rounding ties away from zero where 0 and 1 round ties to
                      * even (ties to even cannot be split losslessly in 16 + 16
                      * bits), so the runs part in the last bits from the first
                      * master that lies exactly half-way between two bf16
                      * values. Checkpoints hold the joined master (".master",
                      * f32) and load into any mode. A checkpoint load must pass
                      * the optimizer; bmt_optim_destroy leaves the shards (the
                      * masters rounded) with the blocks.
                      * 0 (default): keep both. Other values are refused. */
    int overlap;     /* 1 (default): a step computes the norm, the clipping and the
                      * learning rate, and defers the update itself: each block's
                      * AdamW runs at the next forward, just before that block's
                      * gather, on a stream of its own, so it overlaps the forward
                      * of the blocks before it (the update is memory-bound, the
                      * forward compute-bound). The gradient shards live until
                      * their block's update. Anything else that touches the
                      * parameters or the optimizer's state (bmt_block_gather,
                      * checkpoints, destroying the optimizer) applies what is
                      * still pending first, so the results are the same bits
                      * as with 0: the update inside the step. */
    int max_skipped; /* version 2: the most steps in a row that may be skipped (non-finite
                      * gradients); the next one fails bmt_optim_step on every rank with
                      * an error that says so. Default 10; 0: no bound. */
} bmt_adamw_config_t;

#define BMT_ADAMW_CONFIG_MAGIC 0x4d414441u /* "ADAM" */
#define BMT_ADAMW_CONFIG_VERSION 2u        /* 2 added max_skipped; a version-1 config still works */
#define BMT_ADAMW_MAX_SKIPPED_DEFAULT 10
#define BMT_ADAMW_CONFIG_INITIALIZER                                                               \
    {                                                                                              \
        sizeof(bmt_adamw_config_t), BMT_ADAMW_CONFIG_MAGIC, BMT_ADAMW_CONFIG_VERSION, 1e-3, 0.9,   \
            0.999, 1e-8, 0.01, 0.0, NULL, NULL, 0, 1, BMT_ADAMW_MAX_SKIPPED_DEFAULT                \
    }

/* What a step did. */
typedef struct bmt_step_info {
    int64_t step;          /* steps taken, including this one if it was not skipped */
    double lr;             /* learning rate used (0 when skipped) */
    double grad_norm;      /* global norm before clipping (inf or nan when skipped) */
    bool skipped;          /* gradients held inf or nan: parameters unchanged */
    int64_t skipped_total; /* skipped steps so far */
    int microbatches;      /* micro-batches averaged into this step */
} bmt_step_info_t;

/* An AdamW optimizer over every block of list. Creating it seals the list (no
 * more blocks). Destroy it before the list (a step after the list is gone is
 * refused). A list has one optimizer at a time: a second while the first
 * lives is refused (destroy the first). lr, eps, weight_decay and clip_norm
 * must be finite, overlap 0 or 1; and since AdamW computes in f32, eps must
 * not round to 0 there (at least 1.4e-45) and lr, eps, weight_decay and
 * lr x weight_decay must be at most FLT_MAX (3.4e38). Every rank must give
 * the same settings:
 * the first step that updates compares them (and the schedule's learning
 * rate) over the world and fails on every rank, naming the first that
 * differs, if they do not agree. Refused when two blocks' optimizer files
 * would meet in a checkpoint ("x" and "x.optim": x's state is x.optim's
 * weights file). */
BMT_API bmt_optim_t *bmt_adamw_create(bmt_blocklist_t *list, const bmt_adamw_config_t *cfg,
                                      bmt_error_t *err);

/* One step. Collective over the world: it checks that every rank's last
 * micro-batch was this one's (each bmt_blocklist_backward agrees on it; ranks
 * that disagree would average different things, or pair their collectives
 * wrongly), and fails on every rank that can tell if not. Errors: no
 * backward with last_microbatch since the last step; micro-batch counts that
 * differ across ranks; more than max_skipped skipped steps in a row; a
 * schedule that gives a learning rate that is not finite or below 0; the
 * ranks' settings differ (first update); the list destroyed. A
 * forward made after that backward (evaluation) is cancelled: the next
 * backward needs a new forward. */
BMT_API int bmt_optim_step(bmt_optim_t *opt, bmt_step_info_t *info, bmt_error_t *err);

BMT_API void bmt_optim_destroy(bmt_optim_t *opt);

#ifdef __cplusplus
}
#endif
#endif
