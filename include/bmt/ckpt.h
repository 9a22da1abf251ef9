/* bmt/ckpt.h — checkpoints: safetensors per block, every rank its own bytes,
 * any layout to any layout, atomic.
 *
 * A checkpoint is a directory DIR/NAME:
 *   <block>.safetensors           the block's parameters, full shapes, their
 *                                 dtypes and names ("transformer.h.3.ln_1.weight")
 *   model.safetensors.index.json  HF's index: {"metadata": {"total_size": ...},
 *                                 "weight_map": {tensor: file}}
 *   <block>.optim.safetensors     AdamW's state: "<param>.exp_avg",
 *                                 "<param>.exp_avg_sq" (f32), and "<param>.master"
 *                                 (f32) for parameters stored in another dtype
 *   train_state.json              the optimizer's step counters, the layout it was
 *                                 saved under, the blocks and files, and the
 *                                 caller's own state (a JSON object: data
 *                                 position, config, ...)
 * and DIR/latest names the newest complete checkpoint.
 *
 * Save: rank 0 makes DIR/.tmp-NAME and preallocates every file; each rank of
 * group 0 writes only its shards' byte ranges with pwrite and fsyncs (the
 * other groups hold the same shards and write nothing; nothing is gathered);
 * rank 0 then writes the index and train_state.json, fsyncs the directory,
 * renames it to DIR/NAME, points DIR/latest at it (write, fsync, rename) and
 * removes the oldest checkpoints beyond `keep`. A checkpoint that DIR/latest
 * names is complete; a crash leaves at most a .tmp- directory, which the next
 * save removes and loading never reads.
 * Load: every rank reads (pread) only the byte ranges of its own shards, so
 * any layout loads any checkpoint with O(shard) memory. Every name, shape and
 * dtype is checked before anything is read.
 */
#ifndef BMT_CKPT_H
#define BMT_CKPT_H

#include "bmt/block.h"
#include "bmt/bmt.h"
#include "bmt/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Save the list's parameters (and opt's state when opt is not NULL) as
 * DIR/NAME, then DIR/latest. name: letters, digits, '.', '-', '_' (no '/').
 * user_json: NULL or a JSON object's text, stored as train_state.json's "user".
 * keep > 0: remove the oldest checkpoints of DIR so that `keep` remain (by the
 * optimizer step in their train_state.json; DIR/latest's is always kept).
 * Collective over the world; call between optimizer steps (no forward or
 * backward pending). Returns 0 on every rank, or -1 on every rank (the ranks
 * agree) with err; then DIR/latest and the checkpoints it names are unchanged. */
BMT_API int bmt_ckpt_save(bmt_blocklist_t *list, bmt_optim_t *opt, const char *dir,
                          const char *name, const char *user_json, int keep, bmt_error_t *err);

/* The same in two halves, so that training goes on while the files are
 * written: bmt_ckpt_save_async prepares the directory and copies this rank's
 * shards to host memory (O(shard); the caller waits only for that), and a
 * thread of each rank of group 0 writes them; bmt_ckpt_finish waits for the
 * writers and completes the checkpoint (index, train state, rename, latest).
 * Both are collective over the world. Call bmt_ckpt_finish before the next
 * save, before bmt_finalize, and before the program exits; in between, the
 * program may run any steps. On failure either returns -1 on every rank and
 * latest is unchanged; a failed save_async leaves nothing pending (*pending
 * NULL). bmt_ckpt_finish(NULL) returns 0. */
typedef struct bmt_ckpt_pending bmt_ckpt_pending_t;
BMT_API int bmt_ckpt_save_async(bmt_blocklist_t *list, bmt_optim_t *opt, const char *dir,
                                const char *name, const char *user_json, int keep,
                                bmt_ckpt_pending_t **pending, bmt_error_t *err);
BMT_API int bmt_ckpt_finish(bmt_ckpt_pending_t *pending, bmt_error_t *err);

/* The checkpoint directory path names: path itself when it holds a
 * train_state.json, else path/<the name in path/latest>. Writes it to out
 * (len bytes). Returns 0, 1 when there is no checkpoint there yet (no latest),
 * or -1 with err (latest names something that is not there). Local. */
BMT_API int bmt_ckpt_resolve(const char *path, char *out, size_t len, bmt_error_t *err);

/* Load a checkpoint (bmt_ckpt_resolve's rules) into the list and, when opt is
 * not NULL, the optimizer (its moments, master weights and step counters).
 * The list may have a different layout than the one saved. *user_json (when
 * not NULL) gets a copy of the saved "user" object's text (free it), or NULL.
 * Local (each rank reads its own bytes); call before the first forward or
 * between steps. Errors name the file and tensor: a missing or extra block, a
 * missing tensor, another shape or dtype, a truncated or corrupt file. */
BMT_API int bmt_ckpt_load(bmt_blocklist_t *list, bmt_optim_t *opt, const char *path,
                          char **user_json, bmt_error_t *err);

#ifdef __cplusplus
}
#endif
#endif
