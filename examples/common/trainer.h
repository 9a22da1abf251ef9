/* examples/common/trainer.h — the model-agnostic trainer that the example
 * binaries share (bin/gpt2, bin/llama).
 *
 * A model example supplies a trainer_model_t: its name, its own options and
 * their usage lines, and the functions that build, feed and describe its
 * model; trainer_main does the rest: the common options, --prepare and
 * --verify, the learning rate schedule, the loop (gradient accumulation, the
 * world's mean loss, bmt_report_step), evaluation (bmt_report_scalar
 * "val_loss"), checkpoints (--save-dir/--save-every/--keep/--resume/
 * --save-async, SIGUSR1 save-and-exit) and every line printed
 * (docs/gpt2.md describes them; docs/llama.md for the Llama binary).
 *
 * Layer: above libbmt (block list, optimizer, checkpoints, monitor) and the
 * token-shard loader (common/data.h); below the model examples' main()s.
 */
#ifndef TRAINER_H
#define TRAINER_H

#include <getopt.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "bmt/block.h"
#include "bmt/bmt.h"

/* A model's own long options take getopt values from here up. */
#define TRAINER_OPT_MODEL 1024

/* What trainer_main hands the model's configure(): the model-generic options
 * that choose the model, and the run's sequence length. */
typedef struct trainer_choice {
    const char *model;     /* --model NAME (default: the model's default_model) */
    const char *init_from; /* --init-from PATH, or NULL */
    int T;                 /* --seq */
} trainer_choice_t;

/* The model interface. `self` is the example's own state (its option values
 * and its configuration, filled by configure()); `m` a model that create()
 * returned. Functions that take err return 0 (or a pointer) or -1 (or NULL)
 * with err set. */
typedef struct trainer_model {
    const char *name;          /* the program: "gpt2"; every message starts "NAME: " */
    const char *default_model; /* --model's default: "tiny" */
    void *self;

    /* Usage text: the "Model:" section (heading included), lines for the Run
     * section after --master-only and after --overlap-step ("" or NULL:
     * none). */
    const char *usage_model, *usage_run_mid, *usage_run_end;
    /* The model's long options (NULL-terminated; val >= TRAINER_OPT_MODEL),
     * and the handler of each: 0, or the exit code trainer_bad returned. */
    const struct option *options;
    int (*option)(void *self, int code, const char *arg);

    /* Make the configuration from c (a preset and overrides, or a file) and
     * check it: 0, or the exit code after printing the message (trainer_bad
     * for a usage error: 2; 1 for a file that cannot be used). */
    int (*configure)(void *self, const trainer_choice_t *c);
    int (*max_seq_len)(const void *self); /* positions of the configured model */
    int (*vocab_size)(const void *self);
    int max_vocab; /* a larger configured vocabulary is refused (uint16 shards); 0: no limit */

    /* "L 4, H 4, C 64, V 256, maxT 256": the startup line's sizes. */
    void (*describe)(const void *self, char *out, size_t len);
    int64_t (*num_params)(const void *self);
    double (*flops_per_token)(const void *self, int T);

    void *(*create)(void *self, bmt_ctx_t *ctx, int B, int T, const bmt_blocklist_config_t *lc,
                    uint64_t seed, bmt_error_t *err);
    /* Optional: called right after create (GPT-2's --gemm-tune, --keep-attention). */
    int (*after_create)(void *self, void *m, bmt_error_t *err);
    int (*load)(void *m, const char *path, bmt_error_t *err);
    bmt_blocklist_t *(*list)(void *m);
    int (*set_batch)(void *m, const int32_t *in, const int32_t *tg, bmt_error_t *err);
    float (*loss)(const void *m);
    bmt_dtype_t (*param_dtype)(const void *m);
    void (*destroy)(void *m);

    /* A checkpoint's config.json (malloc'd text) for the model, parameters as dtype. */
    int (*hf_config_json)(const void *self, bmt_dtype_t dtype, char **json, bmt_error_t *err);
    /* The "model" object of the trainer's state in a checkpoint (new reference):
     * the sizes a --resume must match; the trainer compares a saved one with
     * this one as a whole and shows both when they differ. */
    json_t *(*state)(const void *self);
} trainer_model_t;

/* Run the program: parse argv (common options and the model's), then
 * --verify, --prepare or training under bmlaunch. Returns main()'s exit code:
 * 0, 1 (a run or file error), 2 (a usage error). */
int trainer_main(const trainer_model_t *model, int argc, char **argv);

/* Print "NAME: message" and the --help hint on stderr; returns 2 (a usage
 * error's exit code). For the model's option() and configure(). */
int trainer_bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Parse an integer option in [lo, hi] into *out: 0, or trainer_bad's 2. */
int trainer_int_arg(const char *name, const char *s, int lo, int hi, int *out);

/* The program's name, as trainer_main was given it (for messages). */
const char *trainer_name(void);

#endif
