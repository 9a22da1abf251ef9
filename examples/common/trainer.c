/* examples/common/trainer.c — the trainer the example binaries share.
 *
 *     bmlaunch -g 2 -n 2 -- gpt2 --model tiny --data 'corpus_train.bin' --val corpus_val.bin
 *     gpt2 --prepare corpus.txt --out build/data/corpus     (tokenize, byte level)
 *
 * Everything here is model-agnostic; the model comes in through
 * trainer_model_t (trainer.h), whose example (examples/gpt2/train.c,
 * examples/llama/train.c) is only its wiring. Each rank trains on its own
 * slice of every global batch (llm.c's shards and DataLoader semantics,
 * examples/common/data.h); the model's blocks are sharded over the group (ZeRO-3)
 * and the groups are data parallel. One line per step on rank 0: step, loss
 * (mean over the world), learning rate, step time, tokens/s of the whole job,
 * MFU (when the peak is known: the GPU's, or BMT_PEAK_TFLOPS) and memory;
 * every step is also reported to the monitor plugins (bmt_report_step) and
 * each validation loss (bmt_report_scalar "val_loss"), so bmlaunch's /metrics
 * shows them live.
 *
 * Layer: above libbmt and the token-shard loader; below the examples' main()s.
 */
#include "common/trainer.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bmt/block.h"
#include "bmt/bmt.h"
#include "bmt/ckpt.h"
#include "bmt/device.h"
#include "bmt/monitor.h"
#include "bmt/optim.h"
#include "common/data.h"

typedef struct opts {
    const char *data, *val, *prepare, *out, *save_dir, *verify;
    trainer_choice_t choice; /* --model, --init-from, --seq */
    int save_every, keep, resume, save_async, max_skipped;
    int override_optim; /* --override-optim: a resume takes this run's schedule */
    int accum_given;    /* -a was on the command line (a resume may not derive it) */
    int keep_given;     /* --keep was: it needs --save-dir */
    /* options that change nothing without another (--val, --prepare): the
     * first of each kind given, for the message; NULL: none */
    const char *eval_given, *prepare_given;
    int B, T, accum, steps, warmup, eval_every, eval_batches, zero, ckpt, prefetch, master_only;
    double ckpt_budget; /* --ckpt-budget MiB, or -1: not given */
    int overlap_step;
    double lr, lr_min_frac, weight_decay, clip, val_fraction;
    unsigned long long seed;
} opts_t;

/* The program's name in messages: trainer_main's model's. */
static const char *prog = "trainer";

const char *trainer_name(void) { return prog; }

static void usage(const trainer_model_t *md, FILE *f)
{
    /* Columns 43 and 33 whatever the name's length (gpt2's lines as they were). */
    const int n = (int)strlen(prog), pad1 = n < 25 ? 26 - n : 1, pad2 = n < 12 ? 13 - n : 1;
    fprintf(f,
            "usage: %s [options]%*s(a rank program: run it under bmlaunch)\n"
            "       %s --prepare TEXT --out PREFIX [--val-fraction F]\n"
            "       %s --verify DIR%*scheck a checkpoint (DIR or DIR/latest's) without\n"
            "                                 training: checksums, finite values, index\n",
            prog, pad1, "", prog, prog, pad2, "");
    fputs(md->usage_model ? md->usage_model : "", f);
    fputs("Data (llm.c token shards of uint16 or uint32 tokens, docs/gpt2.md):\n"
          "  -i, --data PATTERN      training shards (a path or a glob)\n"
          "  -j, --val PATTERN       validation shards (optional)\n"
          "Batch:\n"
          "  -b, --batch B           sequences per micro-batch per rank (default 4)\n"
          "  -t, --seq T             sequence length (default 64)\n"
          "  -a, --accum A           micro-batches per step (default 1)\n"
          "Optimizer (AdamW):\n"
          "  -l, --lr LR             peak learning rate (default 1e-3)\n"
          "      --warmup N          linear warm-up steps (default 0)\n"
          "      --lr-min-frac F     cosine decay to F x LR at the last step (default 1: none)\n"
          "      --weight-decay W    (default 0.0)\n"
          "      --clip NORM         clip the global gradient norm (default 1.0; 0: off)\n"
          "      --max-skipped N     stop with an error after more than N steps in a row were\n"
          "                          skipped for non-finite gradients (default 10; 0: never)\n"
          "Checkpoints (docs/gpt2.md):\n"
          "      --save-dir DIR      save DIR/step-NNNNNNNN at --save-every, at the end and on\n"
          "                          SIGUSR1 (then exit 0); DIR/latest names the newest\n"
          "      --save-every N      every N steps (default 0: only at the end and on SIGUSR1)\n"
          "      --keep K            keep the newest K checkpoints (default 3; 0: all)\n"
          "      --resume            continue from DIR/latest when there is one (any layout;\n"
          "                          the global batch is kept: --accum is derived, or a\n"
          "                          batch that differs is refused with the options to use)\n"
          "      --save-async        write checkpoints in the background while training goes on\n"
          "      --override-optim    with --resume: use this run's --lr, --warmup,\n"
          "                          --lr-min-frac, --steps, --weight-decay and --clip where\n"
          "                          the checkpoint's differ (without it they are refused)\n"
          "Run:\n"
          "  -n, --steps N           optimizer steps (default 50)\n"
          "  -s, --seed S            initialization seed (default 1337)\n"
          "  -v, --eval-every N      validation loss every N steps and at the end (default 0: "
          "end only)\n"
          "      --eval-batches K    micro-batches per validation (default 4; at most the\n"
          "                          distinct batches --val holds)\n"
          "      --zero 2|3          keep gathered parameters from forward to backward (2) or "
          "not (3, default)\n"
          "      --ckpt 0|1          activation checkpointing per block (default 1)\n"
          "      --ckpt-budget MIB   with --ckpt 1: the last layers keep their activations\n"
          "                          (not recomputed) while their sets fit in MIB, then the\n"
          "                          head its whole logits (default: every layer recomputed)\n"
          "      --prefetch 0|1      gather block i+1 while block i computes (default 1)\n"
          "      --master-only 0|1|2 bf16 parameters (cuda): 2 keeps each f32 master as the\n"
          "                          bf16 shard plus its low 16 bits (default); 1 keeps only\n"
          "                          the masters, rounded at each gather (2's memory, ~1-4%\n"
          "                          slower); 0 keeps shard and master (2 bytes more a\n"
          "                          parameter / group size)\n",
          f);
    fputs(md->usage_run_mid ? md->usage_run_mid : "", f);
    fputs("      --overlap-step 0|1  run each block's optimizer update at the next forward,\n"
          "                          under the forward of the block before (default 1; the\n"
          "                          same results, bitwise)\n",
          f);
    fputs(md->usage_run_end ? md->usage_run_end : "", f);
    fputs("  -h, --help\n", f);
}

int trainer_bad(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry '%s --help' for more information.\n", prog);
    va_end(ap);
    return 2;
}

int trainer_int_arg(const char *name, const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return trainer_bad("%s needs an integer from %d to %d, not '%s'", name, lo, hi, s);
    *out = (int)v;
    return 0;
}

static int real_arg(const char *name, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        return trainer_bad("%s needs a number from %g to %g, not '%s'", name, lo, hi, s);
    *out = v;
    return 0;
}

enum {
    O_WARMUP = 256,
    O_LRMIN,
    O_WD,
    O_CLIP,
    O_EVALB,
    O_ZERO,
    O_CKPT,
    O_CKPT_BUDGET,
    O_PREFETCH,
    O_MASTER_ONLY,
    O_PREPARE,
    O_OUT,
    O_VALFRAC,
    O_INIT,
    O_SAVEDIR,
    O_SAVEEVERY,
    O_KEEP,
    O_RESUME,
    O_SAVEASYNC,
    O_OVERLAP,
    O_MAXSKIP,
    O_VERIFY,
    O_OVERRIDE_OPTIM
};
_Static_assert(O_OVERRIDE_OPTIM < TRAINER_OPT_MODEL,
               "the trainer's option codes stay below the model's");

static const struct option common_options[] = {
    { "model", required_argument, NULL, 'm' },
    { "data", required_argument, NULL, 'i' },
    { "val", required_argument, NULL, 'j' },
    { "batch", required_argument, NULL, 'b' },
    { "seq", required_argument, NULL, 't' },
    { "accum", required_argument, NULL, 'a' },
    { "lr", required_argument, NULL, 'l' },
    { "warmup", required_argument, NULL, O_WARMUP },
    { "lr-min-frac", required_argument, NULL, O_LRMIN },
    { "weight-decay", required_argument, NULL, O_WD },
    { "clip", required_argument, NULL, O_CLIP },
    { "steps", required_argument, NULL, 'n' },
    { "seed", required_argument, NULL, 's' },
    { "eval-every", required_argument, NULL, 'v' },
    { "eval-batches", required_argument, NULL, O_EVALB },
    { "zero", required_argument, NULL, O_ZERO },
    { "ckpt", required_argument, NULL, O_CKPT },
    { "ckpt-budget", required_argument, NULL, O_CKPT_BUDGET },
    { "prefetch", required_argument, NULL, O_PREFETCH },
    { "master-only", required_argument, NULL, O_MASTER_ONLY },
    { "overlap-step", required_argument, NULL, O_OVERLAP },
    { "prepare", required_argument, NULL, O_PREPARE },
    { "out", required_argument, NULL, O_OUT },
    { "val-fraction", required_argument, NULL, O_VALFRAC },
    { "init-from", required_argument, NULL, O_INIT },
    { "save-dir", required_argument, NULL, O_SAVEDIR },
    { "save-every", required_argument, NULL, O_SAVEEVERY },
    { "keep", required_argument, NULL, O_KEEP },
    { "resume", no_argument, NULL, O_RESUME },
    { "save-async", no_argument, NULL, O_SAVEASYNC },
    { "max-skipped", required_argument, NULL, O_MAXSKIP },
    { "verify", required_argument, NULL, O_VERIFY },
    { "override-optim", no_argument, NULL, O_OVERRIDE_OPTIM },
    { "help", no_argument, NULL, 'h' },
};
#define N_COMMON ((int)(sizeof(common_options) / sizeof(common_options[0])))

/* The common options and the model's, in one getopt_long table. */
static struct option *option_table(const trainer_model_t *md)
{
    int n = 0;
    while (md->options && md->options[n].name)
        n++;
    struct option *t = calloc((size_t)(N_COMMON + n + 1), sizeof(*t));
    if (t == NULL)
        return NULL;
    memcpy(t, common_options, sizeof(common_options));
    if (n)
        memcpy(t + N_COMMON, md->options, sizeof(*t) * (size_t)n);
    return t;
}

static int parse(const trainer_model_t *md, int argc, char **argv, opts_t *o)
{
    *o = (opts_t){ .choice = { .model = md->default_model },
                   .B = 4,
                   .T = 64,
                   .accum = 1,
                   .steps = 50,
                   .eval_batches = 4,
                   .zero = 3,
                   .ckpt = 1,
                   .ckpt_budget = -1,
                   .prefetch = 1,
                   .master_only = 2,
                   .overlap_step = 1,
                   .lr = 1e-3,
                   .lr_min_frac = 1,
                   .clip = 1.0,
                   .val_fraction = 0.1,
                   .seed = 1337,
                   .max_skipped = BMT_ADAMW_MAX_SKIPPED_DEFAULT,
                   .keep = 3 };
    struct option *lo = option_table(md);
    if (lo == NULL) {
        fprintf(stderr, "%s: out of memory\n", prog);
        return 1;
    }
    int c, rc = 0;
    opterr = 0;
    while (rc == 0 && (c = getopt_long(argc, argv, ":m:i:j:b:t:a:l:n:s:v:h", lo, NULL)) != -1) {
        switch (c) {
        case 'm':
            o->choice.model = optarg;
            o->choice.model_given = 1;
            break;
        case 'i': o->data = optarg; break;
        case 'j': o->val = optarg; break;
        case 'b': rc = trainer_int_arg("--batch", optarg, 1, 1 << 20, &o->B); break;
        case 't': rc = trainer_int_arg("--seq", optarg, 1, 65536, &o->T); break;
        case 'a':
            rc = trainer_int_arg("--accum", optarg, 1, 1 << 20, &o->accum);
            o->accum_given = 1;
            break;
        case 'l': rc = real_arg("--lr", optarg, 0, 10, &o->lr); break;
        case O_WARMUP: rc = trainer_int_arg("--warmup", optarg, 0, 1 << 30, &o->warmup); break;
        case O_LRMIN: rc = real_arg("--lr-min-frac", optarg, 0, 1, &o->lr_min_frac); break;
        case O_WD: rc = real_arg("--weight-decay", optarg, 0, 10, &o->weight_decay); break;
        case O_CLIP: rc = real_arg("--clip", optarg, 0, 1e9, &o->clip); break;
        case 'n': rc = trainer_int_arg("--steps", optarg, 1, 1 << 30, &o->steps); break;
        case 's': {
            char *end;
            errno = 0;
            o->seed = strtoull(optarg, &end, 10);
            if (errno || end == optarg || *end || !(optarg[0] >= '0' && optarg[0] <= '9'))
                rc = trainer_bad("--seed needs a non-negative integer, not '%s'", optarg);
            break;
        }
        case 'v':
            rc = trainer_int_arg("--eval-every", optarg, 0, 1 << 30, &o->eval_every);
            o->eval_given = o->eval_given ? o->eval_given : "--eval-every";
            break;
        case O_EVALB:
            rc = trainer_int_arg("--eval-batches", optarg, 1, 1 << 20, &o->eval_batches);
            o->eval_given = o->eval_given ? o->eval_given : "--eval-batches";
            break;
        case O_ZERO: rc = trainer_int_arg("--zero", optarg, 2, 3, &o->zero); break;
        case O_CKPT: rc = trainer_int_arg("--ckpt", optarg, 0, 1, &o->ckpt); break;
        case O_CKPT_BUDGET:
            rc = real_arg("--ckpt-budget", optarg, 0, 1 << 30, &o->ckpt_budget);
            break;
        case O_PREFETCH: rc = trainer_int_arg("--prefetch", optarg, 0, 1, &o->prefetch); break;
        case O_MASTER_ONLY:
            rc = trainer_int_arg("--master-only", optarg, 0, 2, &o->master_only);
            break;
        case O_OVERLAP:
            rc = trainer_int_arg("--overlap-step", optarg, 0, 1, &o->overlap_step);
            break;
        case O_PREPARE: o->prepare = optarg; break;
        case O_OUT:
            o->out = optarg;
            o->prepare_given = o->prepare_given ? o->prepare_given : "--out";
            break;
        case O_INIT: o->choice.init_from = optarg; break;
        case O_SAVEDIR:
            o->save_dir = optarg;
            if (*optarg == '\0')
                rc = trainer_bad("--save-dir needs a directory name");
            break;
        case O_SAVEEVERY:
            rc = trainer_int_arg("--save-every", optarg, 0, 1 << 30, &o->save_every);
            break;
        case O_KEEP:
            rc = trainer_int_arg("--keep", optarg, 0, 1 << 20, &o->keep);
            o->keep_given = 1;
            break;
        case O_RESUME: o->resume = 1; break;
        case O_SAVEASYNC: o->save_async = 1; break;
        case O_MAXSKIP:
            rc = trainer_int_arg("--max-skipped", optarg, 0, 1 << 30, &o->max_skipped);
            break;
        case O_VERIFY: o->verify = optarg; break;
        case O_OVERRIDE_OPTIM: o->override_optim = 1; break;
        case O_VALFRAC:
            rc = real_arg("--val-fraction", optarg, 0, 0.5, &o->val_fraction);
            o->prepare_given = o->prepare_given ? o->prepare_given : "--val-fraction";
            break;
        case 'h': usage(md, stdout); exit(0);
        case ':': rc = trainer_bad("%s needs an argument", argv[optind - 1]); break;
        default:
            if (c >= TRAINER_OPT_MODEL && md->option)
                rc = md->option(md->self, c, optarg);
            else
                rc = trainer_bad("unknown option '%s'", argv[optind - 1]);
            break;
        }
    }
    free(lo);
    if (rc)
        return rc;
    if (optind < argc)
        return trainer_bad("unexpected argument '%s'", argv[optind]);
    if (o->prepare_given && o->prepare == NULL) /* --out is not where checkpoints go */
        return trainer_bad("%s is --prepare's (the shards it writes): it needs --prepare TEXT; "
                           "checkpoints go to --save-dir DIR",
                           o->prepare_given);
    if (o->verify && o->prepare) /* verify() would run, and --prepare write nothing */
        return trainer_bad("--verify and --prepare are two runs of their own: give one");
    if (o->verify)
        return 0;
    if (o->prepare)
        return o->out ? 0
                      : trainer_bad("--prepare needs --out PREFIX (writes PREFIX_train.bin and "
                                    "PREFIX_val.bin)");
    o->choice.T = o->T;
    if ((rc = md->configure(md->self, &o->choice)) != 0)
        return rc;
    if (o->T > md->max_seq_len(md->self))
        return trainer_bad("--seq %d is longer than the model's %d positions (--max-seq)", o->T,
                           md->max_seq_len(md->self));
    if (o->data == NULL)
        return trainer_bad("--data PATTERN is required (token shards; make them with --prepare)");
    if (o->ckpt_budget >= 0 && !o->ckpt)
        return trainer_bad("--ckpt-budget chooses which layers checkpointing spares: it needs "
                           "--ckpt 1 (with --ckpt 0 every layer keeps its activations)");
    if (o->ckpt_budget >= 0 && md->keep_layers == NULL)
        return trainer_bad("--ckpt-budget: this model has no selective checkpointing");
    if ((o->save_every || o->resume || o->save_async || o->keep_given) && o->save_dir == NULL)
        return trainer_bad("--save-every, --save-async, --keep and --resume need --save-dir DIR");
    if (o->override_optim && !o->resume)
        return trainer_bad("--override-optim chooses between a checkpoint's optimizer settings "
                           "and this run's at a resume: it needs --resume");
    if (o->eval_given && o->val == NULL)
        return trainer_bad("%s sets the validation, which needs --val PATTERN (validation "
                           "shards): give --val, or leave %s out",
                           o->eval_given, o->eval_given);
    /* lr_at decays only after the warm-up: with none of the steps left, the
     * run would end at the peak (or below it, still warming up), not at F x LR */
    if (o->lr_min_frac < 1 && o->warmup >= o->steps)
        return trainer_bad("--lr-min-frac %g decays the learning rate over the steps after the "
                           "warm-up, and --warmup %d leaves none of --steps %d: make --warmup "
                           "shorter than --steps, or leave --lr-min-frac out",
                           o->lr_min_frac, o->warmup, o->steps);
    if (md->max_vocab && md->vocab_size(md->self) > md->max_vocab)
        return trainer_bad("a vocabulary of %d is more than this trainer's %d token ids (the "
                           "llama trainer takes larger ones)",
                           md->vocab_size(md->self), md->max_vocab);
    return 0;
}

/* ------------------------------------------------------------ learning rate */

typedef struct sched {
    int warmup, steps;
    double min_frac;
} sched_t;

/* Linear warm-up over `warmup` steps, then cosine from the peak to min_frac x
 * the peak at the last step. */
static double lr_at(void *user, int64_t step, double base)
{
    const sched_t *s = user;
    if (step <= s->warmup && s->warmup > 0)
        return base * (double)step / s->warmup;
    if (s->min_frac >= 1 || s->steps <= s->warmup)
        return base;
    double t = (double)(step - s->warmup) / (double)(s->steps - s->warmup);
    t = t > 1 ? 1 : t;
    return base * (s->min_frac + (1 - s->min_frac) * 0.5 * (1 + cos(M_PI * t)));
}

/* ------------------------------------------------------------ the run */

/* Sum of v (host memory) over the world. */
static int world_sum(bmt_ctx_t *ctx, double *v, int n, bmt_error_t *err)
{
    return bmt_all_reduce_host_f64(bmt_comm_world(ctx), v, (size_t)n, BMT_SUM, err);
}

/* A --val shard that is also a --data shard (the same file by device and
 * inode, so another spelling of its path or a hard link counts) would measure
 * the validation loss on tokens the model trains on: a loss that looks fine
 * and means nothing. 0, or -1 with err naming the shard. */
static int val_apart(const data_loader_t *train, const data_loader_t *val, const opts_t *o,
                     bmt_error_t *err)
{
    const int nv = data_loader_num_shards(val), nt = data_loader_num_shards(train);
    struct stat *vs = calloc((size_t)nv, sizeof(*vs));
    if (vs == NULL)
        return snprintf(err->text, sizeof(err->text), "out of memory"), -1;
    for (int v = 0; v < nv; v++) /* one that cannot be stat'ed now fails at its read */
        if (stat(data_loader_shard_path(val, v), &vs[v]) != 0)
            vs[v].st_ino = 0, vs[v].st_dev = 0;
    int rc = 0;
    for (int t = 0; t < nt && rc == 0; t++) {
        struct stat ts;
        if (stat(data_loader_shard_path(train, t), &ts) != 0)
            continue;
        for (int v = 0; v < nv && rc == 0; v++)
            if (vs[v].st_ino == ts.st_ino && vs[v].st_dev == ts.st_dev && ts.st_ino != 0) {
                snprintf(err->text, sizeof(err->text),
                         "--val shard %.500s is also a training shard: --data %.500s matches it "
                         "(as %.500s), so the validation loss would be measured on tokens the "
                         "model trains on; give --data a path or pattern that leaves the "
                         "validation shards out",
                         data_loader_shard_path(val, v), o->data, data_loader_shard_path(train, t));
                rc = -1;
            }
    }
    free(vs);
    return rc;
}

/* Every rank reads its part of each global batch at one position that the
 * ranks move in step, so every rank must see the same shards: a node whose
 * copy of the data lacks a shard or holds one of another size would read
 * other tokens than its part (some trained twice, others never) with nothing
 * said, and with --val run another number of batches than the others and
 * hang them. The ranks' views (data_loader_digest: names, token counts,
 * widths) are gathered, and every rank refuses a difference with the same
 * message, naming rank 0 and the first rank that differs. The tokens
 * themselves are not compared. 0, or -1 with err. */
static int same_shards(bmt_ctx_t *ctx, const data_loader_t *ld, const char *opt,
                       const char *pattern, bmt_error_t *err)
{
    enum {
        K = 4 /* shards, tokens, the digest's two halves (exact in a double) */
    };
    const int world = bmt_world_size(ctx), rank = bmt_rank(ctx);
    double *v = calloc((size_t)world * K, sizeof(*v));
    if (v == NULL)
        return snprintf(err->text, sizeof(err->text), "out of memory"), -1;
    const uint64_t d = data_loader_digest(ld);
    double *mine = v + (size_t)rank * K; /* a sum with zeros elsewhere: an all-gather */
    mine[0] = data_loader_num_shards(ld);
    mine[1] = (double)data_loader_tokens(ld);
    mine[2] = (double)(d >> 32);
    mine[3] = (double)(d & 0xffffffffu);
    if (world_sum(ctx, v, world * K, err) < 0) {
        free(v);
        return -1;
    }
    int r = 1;
    for (; r < world; r++) {
        const double *o = v + (size_t)r * K;
        if (o[0] != v[0] || o[1] != v[1] || o[2] != v[2] || o[3] != v[3])
            break;
    }
    if (r < world) {
        const double *o = v + (size_t)r * K;
        char theirs[128];
        if (o[0] == v[0] && o[1] == v[1])
            snprintf(theirs, sizeof(theirs), "as many, with other file names or sizes");
        else
            snprintf(theirs, sizeof(theirs), "%.0f (%.0f tokens)", o[0], o[1]);
        snprintf(
            err->text, sizeof(err->text),
            "%s %.500s does not match the same shards on every rank: rank 0 sees %.0f shard%s "
            "(%.0f tokens), rank %d sees %s. Every rank reads its part of each global batch at "
            "the same position, so all must see the same shards (file names and sizes) in "
            "the same order: make each node's copy of the data the same",
            opt, pattern, v[0], v[0] == 1 ? "" : "s", v[1], r, theirs);
    }
    free(v);
    return r < world ? -1 : 0;
}

static int evaluate(const trainer_model_t *md, bmt_ctx_t *ctx, void *m, data_loader_t *val,
                    int batches, int32_t *in, int32_t *tg, double *loss, bmt_error_t *err)
{
    data_loader_reset(val);
    double sum[1] = { 0 };
    for (int k = 0; k < batches; k++) {
        if (data_loader_next(val, in, tg, err) < 0 || md->set_batch(m, in, tg, err) < 0 ||
            bmt_blocklist_forward(md->list(m), err) < 0)
            return -1;
        sum[0] += md->loss(m);
    }
    if (world_sum(ctx, sum, 1, err) < 0)
        return -1;
    *loss = sum[0] / ((double)batches * bmt_world_size(ctx));
    return 0;
}

static void human(double v, char *out, size_t len)
{
    if (v >= 1e9)
        snprintf(out, len, "%.2fG", v / 1e9);
    else if (v >= 1e6)
        snprintf(out, len, "%.2fM", v / 1e6);
    else if (v >= 1e3)
        snprintf(out, len, "%.1fK", v / 1e3);
    else
        snprintf(out, len, "%.0f", v);
}

/* SIGUSR1 (sbatch --signal, or bmlaunch forwarding it): save at the next step
 * boundary and exit. The ranks agree on the step through the per-step
 * all-reduce, since each sees the signal at its own moment. */
static volatile sig_atomic_t usr1;
static void on_usr1(int sig)
{
    (void)sig;
    usr1 = 1;
}

/* The file name of a shard path (what survives the data being moved or
 * copied to another folder between runs). */
static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* The tokens around a data position whose XXH3 a checkpoint keeps: HASH_SPAN
 * each side of it, within its shard. A shard remade at the same size (another
 * tokenizer, another order, other text) differs there, and a save reads at
 * most 4 x HASH_SPAN bytes for it, however large the shard. */
#define HASH_SPAN ((int64_t)1 << 18)

static void hash_range(const data_loader_t *ld, int shard, int64_t pos, int64_t *from, int64_t *to)
{
    const int64_t n = data_loader_shard_tokens(ld, shard);
    *from = pos > HASH_SPAN ? pos - HASH_SPAN : 0;
    *to = pos < n - HASH_SPAN ? pos + HASH_SPAN : n;
}

/* What the trainer adds to a checkpoint: its step, the model's sizes (a resume
 * must match them: the model's state()), the data position (the same on every
 * rank) with the name and token count of the shard it is in and, from rank 0
 * (only rank 0's is written), the XXH3 of the tokens around it (a resume
 * checks that the position still means the same tokens), and the batch (a
 * resume keeps the global batch: B x accum x world sequences of T), and the
 * optimizer's settings (a resume keeps them: same_optim). NULL and err when
 * the shard cannot be read or memory runs out. */
static char *train_state(const trainer_model_t *md, const opts_t *o, const data_loader_t *ld,
                         int step, int accum, int world, int rank, bmt_error_t *err)
{
    int shard;
    int64_t pos, from = 0, to = 0;
    uint64_t h = 0;
    data_loader_position(ld, &shard, &pos);
    hash_range(ld, shard, pos, &from, &to);
    if (rank == 0 && data_loader_shard_hash(ld, shard, from, to, &h, err) < 0)
        return NULL;
    char hex[17];
    snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)h);
    json_t *model = md->state(md->self);
    json_t *j = model ? json_pack("{sisos{sisIsssIs[II]ss}s{sisisisi}}", "step", step, "model",
                                  model, "data", "shard", shard, "pos", (json_int_t)pos, "name",
                                  base_name(data_loader_shard_path(ld, shard)), "tokens",
                                  (json_int_t)data_loader_shard_tokens(ld, shard), "hashed",
                                  (json_int_t)from, (json_int_t)to, "xxh3", hex, "batch", "B", o->B,
                                  "T", o->T, "accum", accum, "world", world)
                      : NULL;
    if (j && json_object_set_new(j, "optim",
                                 json_pack("{sfsisfsisfsf}", "lr", o->lr, "warmup", o->warmup,
                                           "lr_min_frac", o->lr_min_frac, "steps", o->steps,
                                           "weight_decay", o->weight_decay, "clip", o->clip)) < 0) {
        json_decref(j);
        j = NULL;
    }
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (s == NULL)
        snprintf(err->text, sizeof(err->text), "out of memory");
    return s;
}

/* The batch a checkpoint was trained with (world -1: not recorded), and its
 * optimizer's settings (has_optim 0: not recorded). */
typedef struct saved_batch {
    int B, T, accum, world;
    int has_optim, warmup, steps;
    double lr, lr_min_frac, weight_decay, clip;
} saved_batch_t;

/* Is a checkpoint's "model" object (NULL: it has none) this run's, the model's
 * state() as a whole? 0, or -1 with err showing both. */
static int model_matches(const trainer_model_t *md, const json_t *saved, bmt_error_t *err)
{
    if (saved == NULL)
        return snprintf(err->text, sizeof(err->text),
                        "the checkpoint has no %s state (step, model, data position)", md->name),
               -1;
    json_t *ours = md->state(md->self);
    int same = ours && json_equal((json_t *)saved, ours);
    if (!same) {
        char *a = json_dumps(saved, JSON_COMPACT),
             *b = ours ? json_dumps(ours, JSON_COMPACT) : NULL;
        snprintf(err->text, sizeof(err->text),
                 "the checkpoint is of another model (%s); this run's is %s", a ? a : "?",
                 b ? b : "?");
        free(a);
        free(b);
    }
    json_decref(ours);
    return same ? 0 : -1;
}

/* Does the checkpoint's data position (shard, pos) still point at the tokens
 * it was taken at? The position is a shard index and a token offset, so
 * --data with shards added before it, removed, renamed or remade would
 * otherwise go on silently elsewhere: tokens trained twice, others never. The
 * shard there must have the name (not the folder: data may move between jobs)
 * and the token count the checkpoint recorded, and the tokens around the
 * position (hash_range) the XXH3 it recorded. Tokens farther from the position
 * are not compared. A checkpoint from before these were recorded is not
 * checked (one without the hash: name and count only). 0, or -1 with err. */
static int data_matches(const json_t *data, int shard, int64_t pos, const data_loader_t *ld,
                        const opts_t *o, const char *dir, bmt_error_t *err)
{
    const char *name = NULL, *xxh3 = NULL;
    json_int_t tokens = -1, from = -1, to = -1;
    if (json_unpack((json_t *)data, "{sssI}", "name", &name, "tokens", &tokens) != 0)
        return 0;
    const char *path = data_loader_shard_path(ld, shard);
    char now[600];
    if (path && strcmp(base_name(path), name) == 0 &&
        data_loader_shard_tokens(ld, shard) == (int64_t)tokens) {
        if (json_unpack((json_t *)data, "{s[II]ss}", "hashed", &from, &to, "xxh3", &xxh3) != 0)
            return 0;
        uint64_t h = 0;
        if (data_loader_shard_hash(ld, shard, (int64_t)from, (int64_t)to, &h, err) < 0)
            return -1;
        char hex[17];
        snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)h);
        if (strcmp(hex, xxh3) == 0)
            return 0;
        snprintf(now, sizeof(now),
                 "%.400s, of that name and size, but other tokens: XXH3 %s of tokens %lld..%lld, "
                 "where the checkpoint recorded %.20s",
                 path, hex, (long long)from, (long long)to, xxh3);
    } else if (path) {
        snprintf(now, sizeof(now), "%.500s of %lld tokens", path,
                 (long long)data_loader_shard_tokens(ld, shard));
    } else {
        snprintf(now, sizeof(now), "no such shard (it matches %d)", data_loader_num_shards(ld));
    }
    snprintf(err->text, sizeof(err->text),
             "--data %.300s is not the data the checkpoint was trained on: its position is token "
             "%lld of shard %d, %.200s of %lld tokens, and shard %d of --data is now %s. Resume "
             "with the shards it was trained on, in the same order, or start a new run from its "
             "weights (--init-from %.300s)",
             o->data, (long long)pos, shard, name, (long long)tokens, shard, now, dir);
    return -1;
}

/* Check a checkpoint's model against ours (model_matches) and its data
 * position against --data (data_matches), move the loader to that position
 * and return its step (or -1 with err); *sb: its batch. */
static int resume_state(const trainer_model_t *md, const opts_t *o, const char *dir,
                        const char *text, data_loader_t *ld, saved_batch_t *sb, bmt_error_t *err)
{
    json_error_t je;
    json_t *j = text ? json_loads(text, 0, &je) : NULL;
    int step = -1, shard = -1;
    json_int_t pos = -1;
    *sb = (saved_batch_t){ .B = -1, .T = -1, .accum = -1, .world = -1 };
    const json_t *model = j ? json_object_get(j, "model") : NULL;
    int bad_json =
        j == NULL || !json_is_object(model) ||
        json_unpack(j, "{sis{sisI}}", "step", &step, "data", "shard", &shard, "pos", &pos);
    if (!bad_json) {
        json_unpack(j, "{s{sisisis?i}}", "batch", "B", &sb->B, "T", &sb->T, "accum", &sb->accum,
                    "world", &sb->world);
        sb->has_optim =
            json_unpack(j, "{s{sFsisFsisFsF}}", "optim", "lr", &sb->lr, "warmup", &sb->warmup,
                        "lr_min_frac", &sb->lr_min_frac, "steps", &sb->steps, "weight_decay",
                        &sb->weight_decay, "clip", &sb->clip) == 0;
    }
    int rc = model_matches(md, bad_json ? NULL : model, err);
    if (rc == 0)
        rc = data_matches(json_object_get(j, "data"), shard, (int64_t)pos, ld, o, dir, err);
    json_decref(j);
    if (rc < 0)
        return -1;
    if (data_loader_seek(ld, shard, (int64_t)pos, err) < 0)
        return -1;
    return step;
}

/* A resume keeps the global batch: sequences per step (B x accum x world) and
 * T as saved. Without -a, the accumulation is derived; a batch that would
 * differ is refused with options that keep it. *accum: what to run. */
static int keep_batch(const opts_t *o, const saved_batch_t *sb, int world, int *accum,
                      bmt_error_t *err)
{
    if (sb->world <= 0 || sb->B <= 0 || sb->accum <= 0 || sb->T <= 0)
        return 0; /* an older checkpoint: its batch is not known */
    const long long seqs = (long long)sb->B * sb->accum * sb->world;
    if (sb->T != o->T)
        return snprintf(err->text, sizeof(err->text),
                        "the checkpoint was trained on %lld sequences of %d tokens per step (-b %d "
                        "-t %d -a %d on %d ranks); this run has -t %d: resume with -t %d, or "
                        "start a new run",
                        seqs, sb->T, sb->B, sb->T, sb->accum, sb->world, o->T, sb->T),
               -1;
    const long long per = (long long)o->B * world; /* sequences per micro-batch, all ranks */
    if (!o->accum_given && seqs % per == 0) {
        *accum = (int)(seqs / per);
        return 0;
    }
    if (o->accum_given && per * o->accum == seqs) {
        *accum = o->accum;
        return 0;
    }
    char fix[200];
    if (seqs % world != 0) {
        snprintf(fix, sizeof(fix),
                 "no -b and -a keep it on %d ranks: use a number of ranks that "
                 "divides %lld",
                 world, seqs);
    } else {
        long long q = seqs / world, b = o->B < q ? o->B : q; /* B x accum per rank */
        while (q % b != 0)
            b--;
        snprintf(fix, sizeof(fix), "resume with -b %lld -a %lld", b, q / b);
    }
    return snprintf(err->text, sizeof(err->text),
                    "the checkpoint was trained on %lld sequences of %d tokens per step (-b %d -a "
                    "%d on %d ranks); -b %d%s on %d ranks would make %lld%s: %s, so the learning "
                    "rate schedule sees the same batch",
                    seqs, sb->T, sb->B, sb->accum, sb->world, o->B,
                    o->accum_given ? " with that -a" : "", world,
                    o->accum_given ? per * o->accum : per,
                    o->accum_given ? "" : " per micro-batch, which does not divide it", fix),
           -1;
}

/* The shortest decimal that reads back as x (the options' own spelling, as a
 * rule). */
static const char *real_str(double x, char *buf, size_t n)
{
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, n, "%.*g", p, x);
        if (strtod(buf, NULL) == x)
            break;
    }
    return buf;
}

/* A resume keeps the optimizer's settings: the learning rate's schedule
 * (--lr, --warmup, --lr-min-frac and, when it decays, --steps, which places
 * the cosine) and --weight-decay and --clip. Another value would reshape the
 * run from the checkpoint's step on with nothing said, so it is refused,
 * naming both, unless --override-optim asks for this run's; then rank 0 says
 * what changed. An older checkpoint without them is not checked. 0, or -1
 * with err. */
static int same_optim(const opts_t *o, const saved_batch_t *sb, int rank, bmt_error_t *err)
{
    if (!sb->has_optim)
        return 0;
    char diff[900] = "", was[40], now[40];
    size_t len = 0;
    const struct {
        const char *name;
        double saved, ours;
        int is_int;
    } v[] = {
        { "--lr", sb->lr, o->lr, 0 },
        { "--warmup", sb->warmup, o->warmup, 1 },
        { "--lr-min-frac", sb->lr_min_frac, o->lr_min_frac, 0 },
        /* with no decay the last step places nothing */
        { "--steps", sb->steps, (sb->lr_min_frac < 1 || o->lr_min_frac < 1) ? o->steps : sb->steps,
          1 },
        { "--weight-decay", sb->weight_decay, o->weight_decay, 0 },
        { "--clip", sb->clip, o->clip, 0 },
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        if (v[i].saved == v[i].ours)
            continue;
        if (v[i].is_int) {
            snprintf(was, sizeof(was), "%.0f", v[i].saved);
            snprintf(now, sizeof(now), "%.0f", v[i].ours);
        } else {
            real_str(v[i].saved, was, sizeof(was));
            real_str(v[i].ours, now, sizeof(now));
        }
        len +=
            (size_t)snprintf(diff + len, len < sizeof(diff) ? sizeof(diff) - len : 0,
                             "%s%s %s (the checkpoint's %s)", len ? ", " : "", v[i].name, now, was);
        if (len >= sizeof(diff))
            len = sizeof(diff) - 1;
    }
    if (len == 0)
        return 0;
    if (o->override_optim) {
        if (rank == 0)
            printf("%s: --override-optim: %s\n", prog, diff);
        return 0;
    }
    return snprintf(err->text, sizeof(err->text),
                    "this run's optimizer settings are not the checkpoint's: %s. A resume goes on "
                    "with the checkpoint's (the learning rate's schedule and the update would "
                    "change from its step on): give its values, or --override-optim to use "
                    "this run's",
                    diff),
           -1;
}

/* Save step's checkpoint; with --save-async, finish the previous one first and
 * leave this one to the writer threads (*pending), finished by the next save or
 * at the end. */
static int save(const trainer_model_t *md, const opts_t *o, void *m, bmt_optim_t *opt,
                const data_loader_t *ld, int step, int accum, int world, int rank,
                bmt_ckpt_pending_t **pending, bmt_error_t *err)
{
    char name[64];
    snprintf(name, sizeof(name), "step-%08d", step);
    int rc = bmt_ckpt_finish(*pending, err);
    *pending = NULL;
    char *st = rc == 0 ? train_state(md, o, ld, step, accum, world, rank, err) : NULL;
    /* HF's config beside the weights: from_pretrained(DIR/step-N) loads it as
     * written, and --init-from takes the model's shape from it. */
    char *hf = NULL;
    if (st == NULL)
        rc = -1;
    if (rc == 0)
        rc = md->hf_config_json(md->self, md->param_dtype(m), &hf, err);
    bmt_ckpt_config_t c = BMT_CKPT_CONFIG_INITIALIZER;
    c.user_json = st;
    c.config_json = hf;
    c.keep = o->keep;
    c.async = o->save_async;
    if (rc == 0)
        rc = bmt_ckpt_save_ex(md->list(m), opt, o->save_dir, name, &c, pending, err);
    free(st);
    free(hf);
    return rc;
}

/* --ckpt-budget: the last layers keep their activations while their sets fit
 * in budget MiB, then (every layer kept) the head its whole logits if the
 * rest fits; rank 0 says what was chosen. The same choice on every rank: the
 * sizes are the model's. */
static int ckpt_budget(const trainer_model_t *md, void *m, double budget_mib, int rank,
                       bmt_error_t *err)
{
    int64_t layer = 0, head = 0;
    const int L = md->act_bytes(m, &layer, &head);
    const double budget = budget_mib * 1048576.0;
    const double fit = layer > 0 ? budget / (double)layer : L;
    const int k = fit < L ? (int)fit : L;
    const bool keep_head = k == L && budget - (double)k * layer >= (double)head;
    if (md->keep_layers(m, k, keep_head, err) < 0)
        return -1;
    if (rank == 0) {
        const double mib = (double)layer / 1048576.0;
        char what[256];
        if (k == 0)
            snprintf(what, sizeof(what),
                     "every layer is recomputed (one layer's activations take %.1f MiB)", mib);
        else if (k == L)
            snprintf(what, sizeof(what), "every layer keeps its activations (%d x %.1f MiB)", L,
                     mib);
        else
            snprintf(what, sizeof(what),
                     "layers %d..%d keep their activations (%d x %.1f MiB), layers 0..%d are "
                     "recomputed",
                     L - k, L - 1, k, mib, L - k - 1);
        printf("%s: checkpointing within %.1f MiB: %s; the head %s\n", trainer_name(), budget_mib,
               what,
               head == 0   ? "keeps its logits (nothing to recompute)"
               : keep_head ? "keeps its logits whole"
                           : "recomputes its logits chunk by chunk");
        fflush(stdout);
    }
    return 0;
}

/* Is step-N's pattern (a step directory the trainer saves)? */
static bool is_step_name(const char *n)
{
    if (strncmp(n, "step-", 5) != 0 || n[5] == '\0')
        return false;
    for (const char *c = n + 5; *c; c++)
        if (*c < '0' || *c > '9')
            return false;
    return true;
}

/* The run's hold on its --save-dir (rank 0): DIR/.lock, open with an
 * exclusive flock(2) until the run ends, and whether the run made DIR
 * (removed again at the end when the lock is all it holds, as when the run
 * never saved). A file, not DIR itself: NFS takes flock only on a file open
 * for writing. */
typedef struct save_lock {
    int fd; /* -1: none (no --save-dir, another rank, or no locks there) */
    bool made;
} save_lock_t;

/* --save-dir, checked before any step runs (rank 0): its checkpoints must be
 * possible, so that a run does not learn at its first save, after hours,
 * that the directory cannot be written; a run that is not resumed must not
 * mix its checkpoints with another run's (--keep prunes by step, and would
 * remove the newer run's); and no other job may be saving there now. Two
 * jobs in one directory (a job started twice, a requeued one whose first
 * copy still runs, both with --resume) removed each other's .tmp- directories
 * and replaced each other's step directories: each said "saved" and exited
 * 0, and a step directory could be left with its JSON files only. So DIR is
 * locked (flock, exclusive, not waited for) for the whole run; on a file
 * system without flock the run goes on unlocked. Writability is tried by
 * making the lock and a directory there, as a save does, and removing the
 * directory. */
static int check_save_dir(const opts_t *o, save_lock_t *lk, bmt_error_t *err)
{
    const char *dir = o->save_dir;
    char path[4200], newest[256] = "";
    struct stat st;
    bool latest = false;
    if (stat(dir, &st) != 0) {
        if (errno != ENOENT)
            return snprintf(err->text, sizeof(err->text), "--save-dir %.900s: %s", dir,
                            strerror(errno)),
                   -1;
        /* a save makes it, one level: made now, to hold the lock */
        if (mkdir(dir, 0755) == 0)
            lk->made = true;
        else if (errno != EEXIST) /* (EEXIST: another job's, made since the stat) */
            return snprintf(err->text, sizeof(err->text),
                            "--save-dir %.900s: cannot make a checkpoint there (mkdir %.900s: %s)",
                            dir, dir, strerror(errno)),
                   -1;
    } else if (!S_ISDIR(st.st_mode)) {
        return snprintf(err->text, sizeof(err->text), "--save-dir %.900s is not a directory", dir),
               -1;
    }
    int rc = 0;
    snprintf(path, sizeof(path), "%.4000s/.lock", dir);
    lk->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lk->fd < 0) {
        rc = snprintf(err->text, sizeof(err->text),
                      "--save-dir %.900s: cannot make a checkpoint there (open %.900s: %s)", dir,
                      path, strerror(errno));
    } else if (flock(lk->fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
        lk->made = false; /* the other job's now, even if this run made it */
        rc = snprintf(err->text, sizeof(err->text),
                      "--save-dir %.900s is in use: another job running now saves its "
                      "checkpoints there (it holds %.900s); two jobs in one directory remove "
                      "and replace each other's checkpoints: wait for that job to end, or save "
                      "into another directory",
                      dir, path);
    }
    DIR *d = rc ? NULL : opendir(dir);
    if (rc == 0 && d == NULL)
        rc = snprintf(err->text, sizeof(err->text), "--save-dir %.900s: %s", dir, strerror(errno));
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        if (strcmp(e->d_name, "latest") == 0)
            latest = true;
        else if (is_step_name(e->d_name) && strcmp(e->d_name, newest) > 0)
            snprintf(newest, sizeof(newest), "%s", e->d_name);
    }
    if (d)
        closedir(d);
    if (rc == 0 && !o->resume && (latest || newest[0]))
        rc = snprintf(err->text, sizeof(err->text),
                      "--save-dir %.900s already holds another run's checkpoints (%s%s): "
                      "continue that run with --resume, or save into another directory",
                      dir, latest ? "latest, " : "the newest ", newest[0] ? newest : "...");
    if (rc == 0 && o->resume && !latest && newest[0])
        rc = snprintf(err->text, sizeof(err->text),
                      "--resume: %.900s holds checkpoints (the newest %s) but no latest "
                      "naming the one to resume; write that name into %.900s/latest to "
                      "resume from it, or start afresh in another directory",
                      dir, newest, dir);
    snprintf(path, sizeof(path), "%.4000s/.tmp-probe-%ld", dir, (long)getpid());
    if (rc == 0 && mkdir(path, 0755) != 0)
        rc = snprintf(err->text, sizeof(err->text),
                      "--save-dir %.900s: cannot make a checkpoint there (mkdir %.900s: %s)", dir,
                      path, strerror(errno));
    else if (rc == 0)
        rmdir(path);
    return rc ? -1 : 0;
}

/* The end of a run (rank 0): the lock goes, and so does a directory the run
 * made and never saved into (the lock its only entry). */
static void release_save_dir(const opts_t *o, save_lock_t *lk)
{
    DIR *d = lk->made ? opendir(o->save_dir) : NULL;
    bool only_lock = d != NULL;
    for (struct dirent *e; d && only_lock && (e = readdir(d)) != NULL;)
        only_lock = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
                    strcmp(e->d_name, ".lock") == 0;
    if (d)
        closedir(d);
    if (only_lock) {
        char path[4200];
        snprintf(path, sizeof(path), "%.4000s/.lock", o->save_dir);
        unlink(path);
        rmdir(o->save_dir);
    }
    if (lk->fd >= 0)
        close(lk->fd);
    *lk = (save_lock_t){ -1, false };
}

/* NAME --verify DIR: the whole checkpoint, without a job. */
static int verify(const trainer_model_t *md, const char *path)
{
    bmt_ckpt_report_t r;
    bmt_error_t err;
    if (bmt_ckpt_verify(path, &r, &err) < 0) {
        fprintf(stderr, "%s: %s\n", prog, err.text);
        return 1;
    }
    /* config.json agrees with the files: the sizes, each tensor's shape */
    if (r.has_config && md->check_dir && md->check_dir(r.dir, &err) < 0) {
        fprintf(stderr, "%s: %s: config.json does not describe the files: %s\n", prog, r.dir,
                err.text);
        return 1;
    }
    printf("%s: %s: ok: step %lld, %d blocks, %d files, %d tensors, %.1f MiB checked "
           "(checksums of every byte, finite values, index%s%s)\n",
           prog, r.dir, (long long)r.step, r.blocks, r.files, r.tensors,
           (double)r.bytes / 1048576.0, r.optimizer ? ", optimizer state" : "",
           r.has_config ? ", config.json" : "");
    return 0;
}

static int train(const trainer_model_t *md, const opts_t *o)
{
    signal(SIGUSR1, on_usr1); /* before anything: its default action ends the process */
    /* A file-size limit (ulimit -f, which Slurm propagates) makes a write
     * past it fail with EFBIG, which the save reports naming the file, and
     * cleans up after; the default action killed the rank without a word. */
    signal(SIGXFSZ, SIG_IGN);
    bmt_ctx_t *ctx = NULL;
    bmt_error_t err;
    if (bmt_init(&ctx, NULL, &err) < 0) {
        fprintf(stderr, "%s: %s\n", prog, err.text);
        return 1;
    }
    const int rank = bmt_rank(ctx), world = bmt_world_size(ctx);
    const bmt_layout_t *lay = bmt_layout(ctx);
    data_loader_t *train_ld = NULL, *val_ld = NULL;
    void *m = NULL;
    bmt_optim_t *opt = NULL;
    int32_t *in = malloc(sizeof(int32_t) * (size_t)o->B * o->T);
    int32_t *tg = malloc(sizeof(int32_t) * (size_t)o->B * o->T);
    int rc = 1;
    bmt_blocklist_config_t lc = BMT_BLOCKLIST_CONFIG_INITIALIZER;
    lc.zero_level = o->zero;
    lc.checkpointing = o->ckpt;
    lc.prefetch = o->prefetch;
    sched_t sched = { o->warmup, o->steps, o->lr_min_frac };
    bmt_adamw_config_t oc = BMT_ADAMW_CONFIG_INITIALIZER;
    oc.lr = o->lr;
    oc.weight_decay = o->weight_decay;
    oc.clip_norm = o->clip;
    oc.schedule = lr_at;
    oc.schedule_user = &sched;
    oc.master_only = o->master_only;
    oc.overlap = o->overlap_step;
    oc.max_skipped = o->max_skipped;
    int accum = o->accum; /* a resume may derive it (keep_batch) */
    save_lock_t lock = { -1, false };
    if (in == NULL || tg == NULL) {
        snprintf(err.text, sizeof(err.text), "out of memory");
        goto out;
    }
    if (o->save_dir) { /* rank 0 looks; every rank learns the verdict and why */
        enum {
            W = 512
        };
        double why[W] = { 0 };
        if (rank == 0 && check_save_dir(o, &lock, &err) < 0)
            for (int i = 0; i < W - 1 && err.text[i]; i++)
                why[i] = (unsigned char)err.text[i];
        bmt_error_t werr;
        if (world_sum(ctx, why, W, &werr) < 0) {
            err = werr;
            goto out;
        }
        if (why[0] > 0) {
            int n = 0;
            for (; n < W - 1 && why[n] > 0; n++)
                err.text[n] = (char)(int)why[n];
            err.text[n] = '\0';
            goto out;
        }
    }
    if ((train_ld = data_loader_open(o->data, o->B, o->T, rank, world, &err)) == NULL ||
        (o->val && (val_ld = data_loader_open(o->val, o->B, o->T, rank, world, &err)) == NULL) ||
        same_shards(ctx, train_ld, "--data", o->data, &err) < 0 ||
        (val_ld && same_shards(ctx, val_ld, "--val", o->val, &err) < 0) ||
        (val_ld && val_apart(train_ld, val_ld, o, &err) < 0) ||
        (m = md->create(md->self, ctx, o->B, o->T, &lc, o->seed, &err)) == NULL ||
        (md->after_create && md->after_create(md->self, m, &err) < 0) ||
        (o->ckpt_budget >= 0 && ckpt_budget(md, m, o->ckpt_budget, rank, &err) < 0) ||
        (o->choice.init_from && md->load(m, o->choice.init_from, &err) < 0) ||
        (opt = bmt_adamw_create(md->list(m), &oc, &err)) == NULL)
        goto out;
    int eval_batches = o->eval_batches;
    if (val_ld) {
        /* past the distinct global batches of --val evaluate() would start
         * again at the first and count batches twice */
        const int64_t nb = data_loader_batches(val_ld);
        if (nb < eval_batches) {
            eval_batches = (int)nb;
            if (rank == 0)
                printf("%s: --val holds %lld batches of %d x %d tokens a rank on %d ranks: each "
                       "validation uses those, not --eval-batches %d\n",
                       prog, (long long)nb, o->B, o->T, world, o->eval_batches);
        }
    }
    int first = 1;
    bmt_ckpt_pending_t *pending = NULL;
    if (o->resume) {
        char dir[4200], *user = NULL;
        saved_batch_t sb;
        int r = bmt_ckpt_resolve(o->save_dir, dir, sizeof(dir), &err), done = 0;
        if (r < 0) { /* named as bmt_ckpt_load names its errors (docs/checkpoints.md, Load) */
            const bmt_error_t cause = err;
            snprintf(err.text, sizeof(err.text), "rank %d: loading %.600s: %.1400s", rank,
                     o->save_dir, cause.text);
        }
        if (r < 0 || (r == 0 && (bmt_ckpt_load(md->list(m), opt, dir, &user, &err) < 0 ||
                                 (done = resume_state(md, o, dir, user, train_ld, &sb, &err)) < 0 ||
                                 keep_batch(o, &sb, world, &accum, &err) < 0 ||
                                 same_optim(o, &sb, rank, &err) < 0))) {
            free(user);
            goto out;
        }
        free(user);
        first = done + 1;
        if (r == 0 && rank == 0) {
            printf("%s: resumed from %s (step %d)\n", prog, dir, done);
            if (accum != o->accum)
                printf("%s: --accum %d keeps the checkpoint's global batch (%d x %d x %d "
                       "ranks sequences of %d tokens)\n",
                       prog, accum, o->B, accum, world, o->T);
        }
    }
    /* a step's micro-batches are one global batch of the data: the same tokens
     * whatever the split into ranks and micro-batches (data.h) */
    if (data_loader_set_accum(train_ld, accum, &err) < 0)
        goto out;
    if (first > o->steps && rank == 0) {
        printf("%s: the checkpoint is at step %d and --steps is %d: nothing left to train "
               "(raise --steps to go on)\n",
               prog, first - 1, o->steps);
        fflush(stdout);
    }
    const int64_t params = md->num_params(md->self);
    const double tokens_step = (double)o->B * o->T * accum; /* per rank */
    const double flops_step = md->flops_per_token(md->self, o->T) * tokens_step;
    if (rank == 0) {
        char p[32], d[32], sizes[160];
        human((double)params, p, sizeof(p));
        human((double)data_loader_tokens(train_ld), d, sizeof(d));
        md->describe(md->self, sizes, sizeof(sizes));
        printf("%s: %s params (%s) | layout %d x %d = %d ranks "
               "(%s) | batch %d x %d x %d accum x %d ranks = %.0f tokens/step | data %s tokens\n",
               prog, p, sizes, lay->groups, lay->gpus_per_group, world, bmt_backend(ctx), o->B,
               o->T, accum, world, tokens_step * world, d);
        fflush(stdout);
    }
    for (int step = first; step <= o->steps; step++) {
        bmt_step_begin(ctx);
        double loss[1] = { 0 };
        for (int a = 0; a < accum; a++) {
            if (data_loader_next(train_ld, in, tg, &err) < 0 ||
                md->set_batch(m, in, tg, &err) < 0 ||
                bmt_blocklist_forward(md->list(m), &err) < 0 ||
                bmt_blocklist_backward(md->list(m), a == accum - 1, &err) < 0)
                goto out;
            loss[0] += md->loss(m);
        }
        bmt_step_info_t info;
        double sums[2] = { loss[0], usr1 ? 1 : 0 }; /* loss, and whether anyone got SIGUSR1 */
        if (bmt_optim_step(opt, &info, &err) < 0 || world_sum(ctx, sums, 2, &err) < 0)
            goto out;
        const double mean_loss = sums[0] / ((double)accum * world);
        const bool stop = sums[1] > 0;
        bmt_step_report_t r = BMT_STEP_REPORT_INITIALIZER;
        r.tokens = (int64_t)tokens_step;
        r.samples = (int64_t)o->B * accum;
        r.loss = mean_loss;
        r.flops = flops_step;
        r.params = params;
        r.optim = &info;
        bmt_step_metrics_t mt;
        if (bmt_report_step(ctx, &r, &mt, &err) < 0)
            goto out;
        if (rank == 0) {
            char tps[32], mfu[16] = "-";
            human(mt.tokens_per_s * world, tps, sizeof(tps));
            if (isfinite(mt.mfu))
                snprintf(mfu, sizeof(mfu), "%.1f%%", 100 * mt.mfu);
            uint64_t cur = 0, peak = mt.mem_peak_all; /* all kinds at once */
            for (int k = 0; k < mt.mem_kinds; k++)
                cur += mt.mem_current[k];
            printf("step %*d/%d | loss %.4f | lr %.2e | norm %.3f%s | %.1f ms | %s tok/s | MFU %s "
                   "| mem %.1f MiB (peak %.1f)\n",
                   o->steps >= 1000 ? 4 : 3, step, o->steps, mean_loss, info.lr, info.grad_norm,
                   info.skipped ? " (skipped)" : "", mt.step_time_s * 1e3, tps, mfu,
                   (double)cur / 1048576.0, (double)peak / 1048576.0);
            fflush(stdout);
        }
        if (o->save_dir &&
            (stop || step == o->steps || (o->save_every && step % o->save_every == 0))) {
            if (save(md, o, m, opt, train_ld, step, accum, world, rank, &pending, &err) < 0)
                goto out;
            if (rank == 0) {
                printf("%s: %s %s/step-%08d%s\n", prog, pending ? "saving" : "saved", o->save_dir,
                       step, stop ? " (SIGUSR1: stopping)" : "");
                fflush(stdout);
            }
        }
        if (stop) {
            if (o->save_dir == NULL && rank == 0)
                printf("%s: SIGUSR1: stopping after step %d (no --save-dir: nothing saved)\n", prog,
                       step);
            break;
        }
        if (val_ld && ((o->eval_every && step % o->eval_every == 0) || step == o->steps)) {
            double vl;
            if (evaluate(md, ctx, m, val_ld, eval_batches, in, tg, &vl, &err) < 0 ||
                bmt_report_scalar(ctx, "val_loss", vl, &err) < 0)
                goto out;
            if (rank == 0) {
                printf("step %*d/%d | val loss %.4f\n", o->steps >= 1000 ? 4 : 3, step, o->steps,
                       vl);
                fflush(stdout);
            }
        }
    }
    if (pending) {
        if (bmt_ckpt_finish(pending, &err) < 0) {
            pending = NULL;
            goto out;
        }
        pending = NULL;
        if (rank == 0)
            printf("%s: the last checkpoint is complete\n", prog);
    }
    if (md->finish && md->finish(md->self, m, rank, &err) < 0)
        goto out;
    if (rank == 0) { /* where the memory went: each kind's peak, and the whole's */
        bmt_mem_stats_t ms;
        bmt_mem_get_stats(ctx, &ms);
        char line[512];
        int n = 0;
        for (int k = 0; k < BMT_MEM_KIND_COUNT && n < (int)sizeof(line); k++)
            n += snprintf(line + n, sizeof(line) - (size_t)n, "%s%s %.1f", k ? ", " : "",
                          bmt_mem_kind_name((bmt_mem_kind_t)k), (double)ms.peak[k] / 1048576.0);
        /* What bmt holds from the device: its cudaMalloc'd buffers (constant
         * in the steps) and the stream-ordered pool at its largest. */
        uint64_t in_use, pool_high;
        bmt_mem_pool_stats(ctx, &in_use, NULL, &pool_high);
        printf("%s: peak memory by kind (MiB): %s; all kinds at once %.1f\n", prog, line,
               (double)ms.peak_total / 1048576.0);
        if (bmt_device(ctx) == BMT_DEVICE_CUDA)
            printf("%s: held from the device at most %.1f MiB: %.1f cudaMalloc'd and the "
                   "stream-ordered pool's %.1f\n",
                   prog, (double)(ms.current_total - in_use + pool_high) / 1048576.0,
                   (double)(ms.current_total - in_use) / 1048576.0, (double)pool_high / 1048576.0);
    }
    rc = 0;
out:
    if (rc) {
        if (strncmp(err.text, "rank ", 5) == 0) /* libbmt's errors name the rank */
            fprintf(stderr, "%s: %s\n", prog, err.text);
        else
            fprintf(stderr, "%s: rank %d: %s\n", prog, rank, err.text);
    }
    bmt_optim_destroy(opt);
    if (m)
        md->destroy(m);
    data_loader_destroy(train_ld);
    data_loader_destroy(val_ld);
    free(in);
    free(tg);
    release_save_dir(o, &lock);
    if (rc)
        bmt_abort(ctx, rc, err.text);
    /* -1: what the run produced is incomplete (a monitor plugin lost
     * metrics, or the device's work did not finish); it says why */
    if (bmt_finalize(ctx) < 0 && rc == 0)
        rc = 1;
    return rc;
}

int trainer_main(const trainer_model_t *md, int argc, char **argv)
{
    prog = md->name;
    opts_t o;
    int rc = parse(md, argc, argv, &o);
    if (rc)
        return rc;
    if (o.verify)
        return verify(md, o.verify);
    if (o.prepare) {
        bmt_error_t err;
        if (data_tokenize_file(o.prepare, o.out, o.val_fraction, &err) < 0) {
            fprintf(stderr, "%s: %s\n", prog, err.text);
            return 1;
        }
        printf("%s: wrote %s_train.bin and %s_val.bin (byte-level tokens)\n", prog, o.out, o.out);
        return 0;
    }
    return train(md, &o);
}

int trainer_fp8_option(trainer_fp8_t *f, int which, const char *arg)
{
    switch (which) {
    case 0: return trainer_int_arg("--fp8", arg, 0, 1, &f->on);
    case 1:
        f->given = "--fp8-scaling";
        if (strcmp(arg, "delayed") == 0 || strcmp(arg, "current") == 0) {
            f->delayed = arg[0] == 'd';
            return 0;
        }
        return trainer_bad("--fp8-scaling: '%s': give delayed or current", arg);
    case 2:
        f->given = "--fp8-history";
        f->history_given = 1;
        return trainer_int_arg("--fp8-history", arg, 1, NN_FP8_HISTORY_MAX, &f->history);
    }
    return trainer_bad("unknown option");
}

int trainer_fp8_check(const trainer_fp8_t *f)
{
    if (f->given && !f->on)
        return trainer_bad("%s without --fp8 1 changes nothing: add --fp8 1, or leave it out",
                           f->given);
    if (f->history_given && !f->delayed)
        return trainer_bad("--fp8-history is delayed scaling's: leave it out with --fp8-scaling "
                           "current");
    return 0;
}

int trainer_fp8_history(const trainer_fp8_t *f) { return f->delayed ? f->history : 0; }

void trainer_fp8_report(const trainer_fp8_t *f, int rank, const nn_fp8_stats_t *st)
{
    if (!f->on || (rank != 0 && st->saturated == 0 && st->unscalable == 0))
        return;
    char how[64] = "current scaling";
    if (f->delayed)
        snprintf(how, sizeof how, "delayed scaling over %d passes", f->history);
    printf("%s: rank %d: fp8: %s; %ld passes; %ld operand-passes saturated, %ld unscalable "
           "(docs/fp8.md)\n",
           trainer_name(), rank, how, st->passes, st->saturated, st->unscalable);
    fflush(stdout);
}
