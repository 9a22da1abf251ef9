/* bmt/ckpt.h — checkpoints: safetensors per block, every rank its own bytes,
 * any layout to any layout, atomic, checksummed, never non-finite.
 *
 * A checkpoint is a directory DIR/NAME:
 *   <block>.safetensors           the block's parameters, full shapes, their
 *                                 dtypes and names ("transformer.h.3.ln_1.weight")
 *   model.safetensors.index.json  HF's index: {"metadata": {"total_size": ...},
 *                                 "weight_map": {tensor: file}}
 *   config.json                   the model's configuration as the caller gave it
 *                                 (bmt_ckpt_config_t.config_json; HF's config for
 *                                 the GPT-2 trainer, so from_pretrained(DIR/NAME)
 *                                 loads it); absent when none was given
 *   <block>.optim.safetensors     AdamW's state: "<param>.exp_avg",
 *                                 "<param>.exp_avg_sq" (f32), and "<param>.master"
 *                                 (f32) for parameters stored in another dtype
 *   checksums-<r>.json            XXH3-64 of every byte range that writer r (group
 *                                 rank r of group 0) wrote, in units of at most
 *                                 256 KiB cut at multiples of 256 KiB of the file
 *   train_state.json              the optimizer's step counters (as they were when
 *                                 the save began), the layout it was saved under,
 *                                 the blocks and files, the checksums' list and
 *                                 each file header's hash, "finite": true, and the
 *                                 caller's own state (a JSON object: data
 *                                 position, config, ...)
 * and DIR/latest names the newest complete checkpoint.
 *
 * Save: rank 0 makes DIR/.tmp-NAME and preallocates every file; each rank of
 * group 0 stages its shards, checks that every value is finite (a nan or inf
 * anywhere fails the save on every rank, naming the tensor and element, and
 * nothing is committed), writes only its shards' byte ranges with pwrite,
 * hashes them and fsyncs (the other groups hold the same shards and write
 * nothing; nothing is gathered); rank 0 then writes the index, config.json and
 * train_state.json, fsyncs the directory, renames it to DIR/NAME, points
 * DIR/latest at it (write, fsync, rename) and removes the oldest checkpoints
 * beyond `keep` (each renamed to DIR/.tmp-NAME~gone first, then removed). A
 * checkpoint that DIR/latest names is complete; a crash leaves at most a .tmp-
 * directory, which the next save or load in DIR removes and loading never
 * reads. Those are the .tmp- directories no save of this process is writing:
 * one job saves into a DIR at a time (the trainers lock it for the run,
 * docs/checkpoints.md). One exception: re-saving a name moves its old
 * checkpoint aside (DIR/.tmp-NAME~old) until the new one is renamed in; a
 * crash in between leaves it there, a load through DIR/latest reads it there,
 * and the next save in DIR puts it back as DIR/NAME.
 * Load: every rank reads (pread) only the byte ranges of its own shards, so
 * any layout loads any checkpoint with O(shard) memory, and checks the hash of
 * every byte it reads (the units that cover its ranges: at most one unit more
 * than its own bytes on each side of a range). Every name, shape and dtype is
 * checked before anything is read (the dtype must be the model's: a load
 * converts nothing); a value that is not finite is refused.
 *
 * What is guaranteed, and what is not: docs/checkpoints.md ("Trust").
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
 * DIR/NAME, then DIR/latest. name: letters, digits, '.', '-', '_' (no '/'),
 * not starting with '.', and neither "latest" nor "latest.tmp".
 * user_json: NULL or a JSON object's text, stored as train_state.json's "user".
 * keep > 0: remove the oldest checkpoints of DIR so that `keep` remain (by the
 * optimizer step in their train_state.json; DIR/latest's is always kept).
 * Collective over the world; call between optimizer steps (no forward or
 * backward pending). Every block needs files of its own and every parameter
 * a full name of its own: two blocks of one name, blocks whose file names
 * meet ("a/b" and "a_b"; "x" and "x.optim" with an optimizer) or two
 * parameters of one full name in two blocks are refused, as is a block named
 * "model" (its file, model.safetensors, is what transformers' from_pretrained
 * and bmt_st_open read instead of the index) and a path that does not fit
 * (never cut short): bmt_blocklist_append and bmt_adamw_create refuse such
 * blocks as the model is built, so no save meets them. Returns 0 on every rank, or
 * -1 on every rank (the ranks agree) with err; then DIR/latest and the checkpoints it names are
 * unchanged (a re-save of latest's own name too: the new one replaces it by
 * renames after everything that can fail for want of space is written). One
 * failure comes after the renames: the fsync of DIR that makes them durable.
 * Then DIR/NAME is whole and DIR/latest names it, and err says so ("... is
 * written and .../latest names it, but the fsync of DIR after the renames
 * failed: ..."): the file system reported an error, so the call still fails. */
BMT_API int bmt_ckpt_save(bmt_blocklist_t *list, bmt_optim_t *opt, const char *dir,
                          const char *name, const char *user_json, int keep, bmt_error_t *err);

/* The same in two halves, so that training goes on while the files are
 * written: bmt_ckpt_save_async prepares the directory and copies this rank's
 * shards to host memory (O(shard); the caller waits only for that), and a
 * thread of each rank of group 0 writes them; bmt_ckpt_finish waits for the
 * writers and completes the checkpoint (index, train state, rename, latest).
 * Both are collective over the world. Call bmt_ckpt_finish before the next
 * save (a save while one of this process is pending is refused, -1 with err,
 * and the pending one goes on), before bmt_finalize, and before the program
 * exits; in between, the program may run any steps. On failure either returns -1 on every rank and
 * latest is unchanged; a failed save_async leaves nothing pending (*pending
 * NULL; a NULL pending pointer is refused, -1 with err). A directory that a
 * failed save created is taken away again. bmt_ckpt_finish(NULL) returns 0. Every committed save,
 * synchronous or not, tells the monitor plugins once: rank 0 reports BMT_EVENT_CHECKPOINT_SAVED
 * with "DIR/NAME" as its detail (bmt_report_event), so the collector's
 * bmt_events_total{kind="checkpoint_saved"} counts checkpoints. */
typedef struct bmt_ckpt_pending bmt_ckpt_pending_t;
BMT_API int bmt_ckpt_save_async(bmt_blocklist_t *list, bmt_optim_t *opt, const char *dir,
                                const char *name, const char *user_json, int keep,
                                bmt_ckpt_pending_t **pending, bmt_error_t *err);
BMT_API int bmt_ckpt_finish(bmt_ckpt_pending_t *pending, bmt_error_t *err);

/* Everything a save can be told, as an extensible struct (set it up with
 * BMT_CKPT_CONFIG_INITIALIZER, then change fields). */
typedef struct bmt_ckpt_config {
    size_t size;
    uint32_t magic;
    uint32_t version;
    const char *user_json;   /* NULL or a JSON object's text: train_state.json's "user" */
    const char *config_json; /* NULL or a JSON object's text: written as config.json */
    int keep;                /* > 0: keep the newest `keep` checkpoints of DIR (by step;
                              * DIR/latest, the save just made, always stays) */
    int async;               /* 1: return once the shards are staged, *pending set;
                              * bmt_ckpt_finish completes the save. 0: all at once */
} bmt_ckpt_config_t;

#define BMT_CKPT_CONFIG_MAGIC 0x54504b43u /* "CKPT" */
#define BMT_CKPT_CONFIG_VERSION 1u
#define BMT_CKPT_CONFIG_INITIALIZER                                                                \
    {                                                                                              \
        sizeof(bmt_ckpt_config_t), BMT_CKPT_CONFIG_MAGIC, BMT_CKPT_CONFIG_VERSION, NULL, NULL, 0,  \
            0                                                                                      \
    }

/* bmt_ckpt_save or bmt_ckpt_save_async with every option (cfg NULL: the
 * defaults). pending: where async saves put their handle (required when
 * cfg->async is 1, else may be NULL). Collective over the world; the same
 * errors and guarantees as bmt_ckpt_save. */
BMT_API int bmt_ckpt_save_ex(bmt_blocklist_t *list, bmt_optim_t *opt, const char *dir,
                             const char *name, const bmt_ckpt_config_t *cfg,
                             bmt_ckpt_pending_t **pending, bmt_error_t *err);

/* The checkpoint directory path names: path itself when it holds a
 * train_state.json, else path/<the name in path/latest>. Writes it to out
 * (len bytes). Returns 0, 1 when there is no checkpoint there yet (no latest),
 * or -1 with err (latest is not a regular file, a FIFO say, which is never
 * waited on; latest names something that is not there; or the path does not
 * fit len bytes: never a path cut short). out is written only on 0. Local. */
BMT_API int bmt_ckpt_resolve(const char *path, char *out, size_t len, bmt_error_t *err);

/* Load a checkpoint (bmt_ckpt_resolve's rules) into the list and, when opt is
 * not NULL, the optimizer (its moments, master weights and step counters).
 * The list may have a different layout than the one saved. *user_json (when
 * not NULL) gets a copy of the saved "user" object's text (free it), or NULL.
 * Local (each rank reads its own bytes); call before the first forward or
 * between steps. Errors name the file and tensor: a missing or extra block, a
 * missing or extra tensor, another shape or dtype (a parameter's is the
 * model's, the optimizer's state f32: nothing is converted), blocks whose files
 * would be one (as for a save), a block gathered by bmt_block_gather (refused
 * before any block is loaded), a truncated or corrupt file,
 * a checksum that does not match the bytes read, a value that is nan or inf.
 * On cpu a load that fails after its checks may leave the shards partly
 * loaded (they are read in place), and on any device one that fails after
 * it began writing (a checksum or a value found bad in a later block) leaves
 * the blocks before it loaded: do not train on after a failed load. With opt,
 * such a load leaves the optimizer refusing to step (bmt_optim_step fails and
 * says why) until a load succeeds. */
BMT_API int bmt_ckpt_load(bmt_blocklist_t *list, bmt_optim_t *opt, const char *path,
                          char **user_json, bmt_error_t *err);

/* What bmt_ckpt_verify found. */
typedef struct bmt_ckpt_report {
    char dir[4096];  /* the checkpoint directory (bmt_ckpt_resolve) */
    int64_t step;    /* the optimizer step saved */
    int blocks;      /* blocks in train_state.json */
    int files;       /* safetensors files checked */
    int tensors;     /* tensors checked */
    uint64_t bytes;  /* bytes read and hashed (headers and data) */
    bool optimizer;  /* the optimizer's state is in it */
    bool has_config; /* a config.json is in it */
} bmt_ckpt_report_t;

/* Check a whole checkpoint (bmt_ckpt_resolve's rules) without a job or a
 * model: train_state.json and the index are well formed and agree with the
 * files (every block's files present, the weight_map naming exactly the
 * tensors of each file, total_size right), every optimizer tensor belongs to a
 * parameter (F32, its shape) and every parameter has all of its optimizer state
 * (exp_avg, exp_avg_sq, and a master when it is not F32), train_state.json's
 * version is one this bmt reads and its step and skipped counters whole
 * numbers >= 0 (what bmt_ckpt_load refuses, this refuses too), config.json
 * (when present) is a JSON object, every byte of every file matches its
 * recorded checksum (headers included), and every value is finite. report
 * (may be NULL) is filled as far as the check got. Local, no bmt_init needed.
 * 0, or -1 with err naming the file, tensor and cause. A checkpoint written
 * before checksums existed fails ("has no checksums"). */
BMT_API int bmt_ckpt_verify(const char *path, bmt_ckpt_report_t *report, bmt_error_t *err);

#ifdef __cplusplus
}
#endif
#endif
