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
#include "nn/fp8.h"

/* A model's own long options take getopt values from here up. */
#define TRAINER_OPT_MODEL 1024

/* What trainer_main hands the model's configure(): the model-generic options
 * that choose the model, and the run's sequence length. */
typedef struct trainer_choice {
    const char *model;     /* --model NAME (default: the model's default_model) */
    int model_given;       /* --model was on the command line: with init_from, configure()
                            * refuses a preset whose sizes are not the file's */
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
     * for a usage error: 2; 1 for a file that cannot be used). With a file,
     * an override or a --model (c->model_given) may repeat the file's sizes,
     * never change them. */
    int (*configure)(void *self, const trainer_choice_t *c);
    int (*max_seq_len)(const void *self); /* positions of the configured model */
    int (*vocab_size)(const void *self);
    int max_vocab; /* a larger configured vocabulary is refused, saying so; 0: no limit */

    /* "L 4, H 4, C 64, V 256, maxT 256": the startup line's sizes. */
    void (*describe)(const void *self, char *out, size_t len);
    int64_t (*num_params)(const void *self);
    double (*flops_per_token)(const void *self, int T);

    void *(*create)(void *self, bmt_ctx_t *ctx, int B, int T, const bmt_blocklist_config_t *lc,
                    uint64_t seed, bmt_error_t *err);
    /* Optional: called right after create (GPT-2's --gemm-tune, --keep-attention). */
    int (*after_create)(void *self, void *m, bmt_error_t *err);
    /* Optional (--ckpt-budget), both or neither: act_bytes gives the bytes one
     * layer's kept activations take and those the head's whole logits take
     * beyond its chunks, and returns the number of layers; keep_layers makes
     * the last `layers` layers (and with head, the head) keep their
     * activations instead of being recomputed, before the first forward. */
    int (*act_bytes)(const void *m, int64_t *layer, int64_t *head);
    int (*keep_layers)(void *m, int layers, bool head, bmt_error_t *err);
    int (*load)(void *m, const char *path, bmt_error_t *err);
    bmt_blocklist_t *(*list)(void *m);
    int (*set_batch)(void *m, const int32_t *in, const int32_t *tg, bmt_error_t *err);
    float (*loss)(const void *m);
    bmt_dtype_t (*param_dtype)(const void *m);
    void (*destroy)(void *m);

    /* Optional: at the end of a run that trained, on every rank (GPT-2's FP8
     * statistics): 0, or -1 with err (the run then fails). */
    int (*finish)(void *self, void *m, int rank, bmt_error_t *err);

    /* A checkpoint's config.json (malloc'd text) for the model, parameters as dtype. */
    int (*hf_config_json)(const void *self, bmt_dtype_t dtype, char **json, bmt_error_t *err);
    /* --verify: does dir's config.json describe the model its files hold
     * (sizes, every tensor's shape)? NULL: not checked. */
    int (*check_dir)(const char *dir, bmt_error_t *err);
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

/* FP8's options, the same in every trainer that has them (docs/fp8.md):
 * --fp8 0|1, --fp8-scaling delayed|current, --fp8-history N. A model puts
 * TRAINER_FP8_OPTIONS(code) in its option list (codes code..code+2) and
 * TRAINER_FP8_USAGE in its usage text, hands those codes to
 * trainer_fp8_option, calls trainer_fp8_check from configure(), gives its
 * model trainer_fp8_history's window, and prints trainer_fp8_report's line
 * from finish(). */
typedef struct trainer_fp8 {
    int on;            /* --fp8 (0) */
    int delayed;       /* --fp8-scaling: 1 delayed (the default), 0 current */
    int history;       /* --fp8-history (16) */
    const char *given; /* the last scaling option given, for trainer_fp8_check */
    int history_given;
} trainer_fp8_t;
#define TRAINER_FP8_INIT                                                                           \
    {                                                                                              \
        0, 1, 16, NULL, 0                                                                          \
    }
#define TRAINER_FP8_OPTIONS(code)                                                                  \
    { "fp8", required_argument, NULL, (code) },                                                    \
        { "fp8-scaling", required_argument, NULL, (code) + 1 },                                    \
    {                                                                                              \
        "fp8-history", required_argument, NULL, (code) + 2                                         \
    }
#define TRAINER_FP8_USAGE                                                                          \
    "      --fp8-scaling delayed|current  with --fp8 1: each tensor's scale from the\n"            \
    "                          largest amax of its last passes (delayed, the default:\n"           \
    "                          no extra read of it) or from its own amax (current)\n"              \
    "      --fp8-history N     delayed scaling's passes (micro-batches; default 16,\n"             \
    "                          1..1024); the first pass is current\n"

/* Option `which` (0 --fp8, 1 --fp8-scaling, 2 --fp8-history) with its
 * argument: 0, or trainer_bad's 2. */
int trainer_fp8_option(trainer_fp8_t *f, int which, const char *arg);

/* After parsing: 0, or trainer_bad's 2 for a scaling option without --fp8 1
 * or --fp8-history with current scaling (either would change nothing). */
int trainer_fp8_check(const trainer_fp8_t *f);

/* The model's history argument: 0 for current scaling, else the window. */
int trainer_fp8_history(const trainer_fp8_t *f);

/* With --fp8 1, on rank 0 and on any rank with a count: "NAME: rank R: fp8:
 * delayed scaling over H passes; P passes; S operand-passes saturated, U
 * unscalable (docs/fp8.md)" ("current scaling; ..."), on stdout. */
void trainer_fp8_report(const trainer_fp8_t *f, int rank, const nn_fp8_stats_t *st);

#endif
