/* bmt/block.h — sharded blocks of parameters and the block list that runs them.
 *
 * The ideas are BMTrain's (Block / CheckpointBlock, BlockList, init_parameters,
 * zero_level), rebuilt around a C model that gives each block forward and
 * backward callbacks:
 *
 *   bmt_block_t      A group of parameters that is gathered and released as one
 *                    (a transformer layer, the embeddings, the head). Parameters
 *                    are laid out in one flat buffer per dtype, in the order they
 *                    were added, each starting at a multiple of BMT_BLOCK_ALIGN
 *                    elements; the buffer is padded to a multiple of
 *                    BMT_BLOCK_ALIGN x group size, and each group rank allocates
 *                    and keeps only its contiguous shard (padded / group size
 *                    elements, at group_rank x shard). Nothing ever holds a
 *                    whole model. A full (gathered) buffer holds the dtype
 *                    groups' padded buffers back to back, each starting at a
 *                    multiple of 256 bytes.
 *   initialization   An element's initial value depends only on (seed, the
 *                    parameter's full name, the element's index), through
 *                    Philox 4x32-10, so every layout starts from the same bits.
 *   bmt_blocklist_t  The schedule: forward gathers block i+1 (on the comm
 *                    stream) while block i computes; backward runs in reverse
 *                    with the same prefetch, recomputes a block's forward first
 *                    when activation checkpointing is on, and reduce-scatters
 *                    each block's gradients in the group (and, on the last
 *                    micro-batch, all-reduces the shard across groups on its own
 *                    stream) as soon as the block is done.
 *
 * The model owns activations: its forward callback reads the block's input and
 * writes its output in its own buffers, keeping what its backward needs only
 * when call->keep_activations says so. The runtime owns parameters, gradients
 * and the schedule. The optimizer (bmt/optim.h) finishes a step.
 *
 * Collective calls: bmt_block_build is local; bmt_block_gather and
 * bmt_block_release are collective over the group; bmt_blocklist_forward and
 * bmt_blocklist_backward over the world (group and replica communicators).
 * Every rank must build the same blocks, in the same order, with the same list
 * configuration: the first forward checks it and fails on every rank if not.
 * Destroy optimizers before their list, and everything before bmt_finalize.
 */
#ifndef BMT_BLOCK_H
#define BMT_BLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bmt/bmt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ initialization */

typedef enum bmt_init_kind {
    BMT_INIT_ZEROS = 0,
    BMT_INIT_ONES,
    BMT_INIT_CONSTANT,     /* a */
    BMT_INIT_UNIFORM,      /* uniform in [a, b) */
    BMT_INIT_NORMAL,       /* mean a, standard deviation b */
    BMT_INIT_TRUNC_NORMAL, /* mean a, standard deviation b, cut at a +- 2b */
} bmt_init_kind_t;

typedef struct bmt_init {
    bmt_init_kind_t kind;
    double a, b;
    double scale; /* the value is multiplied by this; 0 means 1 */
} bmt_init_t;

#define BMT_INIT_ZEROS_V ((bmt_init_t){ BMT_INIT_ZEROS, 0, 0, 1 })
#define BMT_INIT_ONES_V ((bmt_init_t){ BMT_INIT_ONES, 0, 0, 1 })
#define BMT_INIT_NORMAL_V(mean, std) ((bmt_init_t){ BMT_INIT_NORMAL, (mean), (std), 1 })
#define BMT_INIT_TRUNC_NORMAL_V(mean, std) ((bmt_init_t){ BMT_INIT_TRUNC_NORMAL, (mean), (std), 1 })
#define BMT_INIT_UNIFORM_V(lo, hi) ((bmt_init_t){ BMT_INIT_UNIFORM, (lo), (hi), 1 })

/* The value of element `index` of the parameter `name` (full name, e.g.
 * "h.3.mlp.c_fc.weight") under seed, computed on the host in double precision:
 * the reference the tests compare with. The device computes the same formula. */
BMT_API double bmt_init_value(uint64_t seed, const char *name, uint64_t index,
                              const bmt_init_t *init);

/* ------------------------------------------------------------ blocks */

typedef struct bmt_block bmt_block_t;

/* Parameter flags. */
#define BMT_PARAM_NO_DECAY 1u /* AdamW applies no weight decay (biases, norms) */

#define BMT_MAX_DIMS 4
#define BMT_BLOCK_ALIGN 16 /* elements: parameter offsets and shard sizes are multiples */

/* A new, empty block. name prefixes its parameters' names ("h.3" + "." + "ln_1.weight").
 * It belongs to the caller until appended to a block list. */
BMT_API bmt_block_t *bmt_block_create(bmt_ctx_t *ctx, const char *name, bmt_error_t *err);

/* Register a parameter before bmt_block_build. shape has ndim (1..4) positive
 * sizes, C order; init's values finite (a standard deviation >= 0, a uniform
 * range with a <= b), and the values it gives within what dtype holds (|a| +
 * 8.66 std for a normal, |a| + 2 std truncated, times |scale|): none may start
 * as inf; flags of BMT_PARAM_*. Returns its index (0, 1, ...) in the block,
 * or -1. */
BMT_API int bmt_block_add_param(bmt_block_t *block, const char *name, int ndim,
                                const int64_t *shape, bmt_dtype_t dtype, bmt_init_t init,
                                unsigned flags, bmt_error_t *err);

/* Lay the parameters out, allocate this rank's shards only, and initialize them
 * (on the device) from seed. No parameter can be added afterwards. */
BMT_API int bmt_block_build(bmt_block_t *block, uint64_t seed, bmt_error_t *err);

/* Free a block that is not in a block list (those go with the list). NULL: no-op. */
BMT_API void bmt_block_destroy(bmt_block_t *block);

BMT_API const char *bmt_block_name(const bmt_block_t *block);
BMT_API int bmt_block_num_params(const bmt_block_t *block);
/* Full name ("h.3.ln_1.weight"), numel, dtype of parameter i; NULL/-1 if out of range. */
BMT_API const char *bmt_block_param_name(const bmt_block_t *block, int i);
BMT_API int64_t bmt_block_param_numel(const bmt_block_t *block, int i);
BMT_API int bmt_block_param_dtype(const bmt_block_t *block, int i);

/* Gather the whole block into a full buffer of its own and wait for it (outside
 * the block list's schedule: tests, export; the buffer counts as
 * BMT_MEM_GATHERED on top of the list's pool). bmt_block_param then gives
 * parameter i's full data on the device until bmt_block_release. Errors: not
 * built, already gathered. */
BMT_API int bmt_block_gather(bmt_block_t *block, bmt_error_t *err);
BMT_API void *bmt_block_param(const bmt_block_t *block, int i);
BMT_API int bmt_block_release(bmt_block_t *block, bmt_error_t *err);

/* Shape of parameter i: *ndim (0 when out of range) and shape[0..ndim). */
BMT_API void bmt_block_param_shape(const bmt_block_t *block, int i, int *ndim,
                                   int64_t shape[BMT_MAX_DIMS]);

/* Where bmt_block_load gets values: write elements [first, first + count) of
 * parameter `param` (flat, C order) into dst (host memory, dtype, count
 * elements). Return 0, or -1 with err. */
typedef int (*bmt_block_source_fn)(void *user, const bmt_block_t *block, int param, int64_t first,
                                   int64_t count, void *dst, bmt_dtype_t dtype, bmt_error_t *err);

/* Replace this rank's shards with values from a source (a checkpoint, a
 * safetensors file): fn is called once for each parameter that overlaps this
 * rank's shard, with just that part, so a rank reads only its own bytes and
 * stages O(shard) host memory. Local (no collective). All or nothing: if any
 * call fails, no shard changes. Every value the source writes must be finite:
 * a nan or an infinity fails the load, naming the parameter and the element.
 * Errors: not built, gathered, or the list has an optimizer or has run (load
 * before bmt_adamw_create). */
BMT_API int bmt_block_load(bmt_block_t *block, bmt_block_source_fn fn, void *user,
                           bmt_error_t *err);

/* ------------------------------------------------------------ block list */

typedef struct bmt_blocklist bmt_blocklist_t;

/* What a block callback gets. Pointers are valid during the call only. */
typedef struct bmt_block_call {
    int index; /* position of the block in the list */
    bmt_block_t *block;
    void *const *params;   /* (num params) full parameters, device memory, param dtype;
                            * read only: in a group of one they are the shards
                            * themselves (an f32 one the optimizer's master), so a
                            * write would change the model there and nowhere else */
    void *const *grads;    /* backward: (num params) full gradients, f32 whatever
                            * the parameter dtype: ADD into them, unless
                            * grads_fresh says they hold nothing yet. Zeroed
                            * before the call (unless the list lets its callbacks
                            * overwrite: bmt_blocklist_set_grad_overwrite), except
                            * in a group of one rank: there they are the gradient
                            * shards themselves, holding the sum so far (earlier
                            * micro-batches of the step, a tied block's other use)
                            * when grads_fresh is false. forward: NULL */
    void *stream;          /* cudaStream_t of the compute stream, NULL on cpu */
    bool keep_activations; /* forward: keep what backward needs (false in the first
                            * forward under activation checkpointing) */
    bool recompute;        /* forward: this is the recomputation inside backward */
    int microbatch;        /* micro-batches since the last optimizer step, from 0 */
    bool grads_fresh;      /* backward: the gradients hold nothing of this step yet
                            * (a group of two or more: always; a group of one: the
                            * step's first micro-batch, at a tied block's first
                            * use in backward order). Writing (=) into them is then
                            * right, and adding (+=) too unless the list lets its
                            * callbacks overwrite, where their contents are
                            * undefined and the callback must write every element
                            * of every gradient of the block. false in forwards
                            * and for blocks without parameters */
} bmt_block_call_t;

typedef struct bmt_block_ops {
    int (*forward)(void *model, const bmt_block_call_t *call, bmt_error_t *err);
    int (*backward)(void *model, const bmt_block_call_t *call, bmt_error_t *err);
} bmt_block_ops_t;

typedef struct bmt_blocklist_config {
    size_t size;
    uint32_t magic;
    uint32_t version;
    int zero_level;         /* 3 (default): release after forward, gather again in
                             * backward; 2: keep forward's full parameters until the
                             * block's backward (no second gather, more memory) */
    int checkpointing;      /* 1 (default): keep only block inputs and recompute a
                             * block's forward inside backward; 0: keep activations.
                             * Each use starts with it; bmt_blocklist_set_checkpointing
                             * changes single uses */
    bmt_dtype_t grad_dtype; /* dtype of the gradient reduce-scatter: BMT_F32
                             * (default) or BMT_BF16 (gradients rounded to bf16
                             * for the wire: half the traffic, plus one bf16
                             * staging buffer of the largest flat buffer, counted
                             * as BMT_MEM_GRAD_FULL). Full gradients (what
                             * callbacks add into) and gradient shards are always
                             * f32. A group of one rank has no reduce-scatter:
                             * its callbacks add into the f32 shards, and this
                             * setting changes nothing there. */
    int prefetch;           /* 1 (default): gather block i+1 during block i; 0: no overlap */
} bmt_blocklist_config_t;

#define BMT_BLOCKLIST_CONFIG_MAGIC 0x4c4b4c42u /* "BLKL" */
#define BMT_BLOCKLIST_CONFIG_VERSION 1u
#define BMT_BLOCKLIST_CONFIG_INITIALIZER                                                           \
    {                                                                                              \
        sizeof(bmt_blocklist_config_t), BMT_BLOCKLIST_CONFIG_MAGIC, BMT_BLOCKLIST_CONFIG_VERSION,  \
            3, 1, BMT_F32, 1                                                                       \
    }

/* A new, empty list. cfg NULL: defaults. Blocks are appended until the first
 * forward or bmt_adamw_create, whichever comes first. */
BMT_API bmt_blocklist_t *bmt_blocklist_create(bmt_ctx_t *ctx, const bmt_blocklist_config_t *cfg,
                                              bmt_error_t *err);

/* Append a built block with its callbacks; model is passed back to them. The
 * list takes ownership of the block. Refused (the block stays the caller's)
 * when it could not be checkpointed with the list's blocks: the same name,
 * checkpoint files that meet ("a/b" and "a_b") or a parameter full name one
 * of them has already ("a" + "b.w" and "a.b" + "w"), or a block named "model"
 * (its file, model.safetensors, is what transformers' from_pretrained and
 * bmt_st_open read instead of a checkpoint's index). */
BMT_API int bmt_blocklist_append(bmt_blocklist_t *list, bmt_block_t *block,
                                 const bmt_block_ops_t *ops, void *model, bmt_error_t *err);

/* Use a block of this list a second time, at the list's current end: a tied
 * block, such as GPT-2's token embedding reused by its LM head. The runtime
 * gathers the block again for this use (or shares the buffer while the first
 * use still holds it), calls these callbacks (call->index tells the uses apart),
 * reduce-scatters the gradients of each use into the same f32 shard, crosses
 * the groups once after both, and the optimizer updates the block once.
 * bmt_blocklist_size counts uses; bmt_blocklist_block(list, i) returns the
 * block of use i. Errors: the block is not in this list, already tied, or the
 * list has run. */
BMT_API int bmt_blocklist_append_tied(bmt_blocklist_t *list, bmt_block_t *block,
                                      const bmt_block_ops_t *ops, void *model, bmt_error_t *err);

/* Selective activation checkpointing: whether use i recomputes its forward
 * inside backward (recompute true: its first forward gets keep_activations
 * false, and a recomputing forward runs just before its backward) or keeps
 * what its forward saved until its backward (false: no recomputation). Every
 * use starts with the config's checkpointing; this overrides it for use i
 * alone, e.g. so that a model's last layers keep their activations where the
 * memory allows (the example trainers' --ckpt-budget). Call it before the
 * first forward, on every rank alike (the first forward checks that the ranks
 * agree, use by use). Errors: list NULL, i out of range, or after the first
 * forward; nothing changes then. */
BMT_API int bmt_blocklist_set_checkpointing(bmt_blocklist_t *list, int i, bool recompute,
                                            bmt_error_t *err);

/* Whether use i is recomputed inside backward (false when out of range). */
BMT_API bool bmt_blocklist_checkpointing(const bmt_blocklist_t *list, int i);

/* Fresh gradients left to the callbacks (overwrite true): where a backward
 * call's gradients hold nothing yet (call->grads_fresh), the list no longer
 * zeroes them first, and the callbacks must write every element of every
 * gradient of the block (a product with beta 0, say, instead of beta 1 into
 * zeros): one pass over the gradients fewer per step, and no read of zeros.
 * Alignment gaps and padding are still zeroed by the list. Under
 * BMT_CHECK_OVERWRITE=1 the list fills those gradients with NaN first, so a
 * callback that adds to them or misses an element makes NaN (tests).
 * Default false: zeroed, the callbacks may add. May differ between ranks
 * (the values do not). Errors: list NULL, or between a forward and its
 * backward; nothing changes then. */
BMT_API int bmt_blocklist_set_grad_overwrite(bmt_blocklist_t *list, bool overwrite,
                                             bmt_error_t *err);
BMT_API bool bmt_blocklist_grad_overwrite(const bmt_blocklist_t *list);

/* Zero gradient i of a backward call (every gradient when i is -1), on the
 * call's stream: for a callback given fresh gradients (call->grads_fresh)
 * under bmt_blocklist_set_grad_overwrite that does not write one of them, or
 * that writes it with a kernel that can only add. Errors: call NULL or not
 * a backward, i out of range, gradients not fresh (in a group of one they
 * then hold the step's sum so far, which zeroing would lose). */
BMT_API int bmt_block_call_zero_grad(const bmt_block_call_t *call, int i, bmt_error_t *err);

/* Run every block's forward in order. */
BMT_API int bmt_blocklist_forward(bmt_blocklist_t *list, bmt_error_t *err);

/* Run every block's backward in reverse order, after a forward. Gradients are
 * reduce-scattered in the group and accumulated into the f32 gradient shards;
 * with last_microbatch, each block's shard is also all-reduced across groups.
 * The optimizer step then averages over world size x micro-batches. Every
 * rank must call it equally often between steps: each call agrees with the
 * world on whether it is the last micro-batch, and a rank whose step ends
 * while another's goes on fails (in this call across groups, else in
 * bmt_optim_step) naming the other rank. */
BMT_API int bmt_blocklist_backward(bmt_blocklist_t *list, bool last_microbatch, bmt_error_t *err);

/* Number of uses (blocks, plus tied second uses), and the block of use i (NULL
 * when out of range). */
BMT_API int bmt_blocklist_size(const bmt_blocklist_t *list);
BMT_API bmt_block_t *bmt_blocklist_block(const bmt_blocklist_t *list, int i);

/* Free the list, its blocks and their memory. NULL: no-op. */
BMT_API void bmt_blocklist_destroy(bmt_blocklist_t *list);

#ifdef __cplusplus
}
#endif
#endif
