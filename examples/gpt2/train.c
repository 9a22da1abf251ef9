/* examples/gpt2/train.c — the GPT-2 reference trainer on libbmt (bin/gpt2).
 *
 *     bmlaunch -g 2 -n 2 -- gpt2 --model tiny --data 'corpus_train.bin' --val corpus_val.bin
 *     gpt2 --prepare corpus.txt --out build/data/corpus     (tokenize, byte level)
 *
 * Only GPT-2's wiring: its options (--layers, --heads, --embd, --vocab,
 * --max-seq, --keep-attention, --gemm-tune, --fp8) and the trainer_model_t that
 * hands the shared trainer (examples/common/trainer.h: options, schedule,
 * loop, evaluation, checkpoints, SIGUSR1, metrics, every line printed) the
 * model of gpt2/model.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/trainer.h"
#include "gpt2/model.h"
#include "nn/ops_cuda.h" /* NN_GEMM_TUNE_MAX */

typedef struct gpt2_wiring {
    gpt2_config_t cfg;
    int layers, heads, embd, vocab, max_seq; /* overrides; 0: the model's */
    int keep_attention, gemm_tune;
    trainer_fp8_t fp8; /* --fp8, --fp8-scaling, --fp8-history */
} gpt2_wiring_t;

enum {
    O_LAYERS = TRAINER_OPT_MODEL,
    O_HEADS,
    O_EMBD,
    O_VOCAB,
    O_MAXSEQ,
    O_KEEPATT,
    O_GEMM_TUNE,
    O_FP8, /* and the two after it (TRAINER_FP8_OPTIONS) */
};

static const struct option gpt2_options[] = {
    { "layers", required_argument, NULL, O_LAYERS },
    { "heads", required_argument, NULL, O_HEADS },
    { "embd", required_argument, NULL, O_EMBD },
    { "vocab", required_argument, NULL, O_VOCAB },
    { "max-seq", required_argument, NULL, O_MAXSEQ },
    { "keep-attention", required_argument, NULL, O_KEEPATT },
    { "gemm-tune", required_argument, NULL, O_GEMM_TUNE },
    TRAINER_FP8_OPTIONS(O_FP8),
    { NULL, 0, NULL, 0 },
};

static int option(void *self, int code, const char *arg)
{
    gpt2_wiring_t *w = self;
    switch (code) {
    case O_LAYERS: return trainer_int_arg("--layers", arg, 1, 1024, &w->layers);
    case O_HEADS: return trainer_int_arg("--heads", arg, 1, 1024, &w->heads);
    case O_EMBD: return trainer_int_arg("--embd", arg, 1, 65536, &w->embd);
    case O_VOCAB: return trainer_int_arg("--vocab", arg, 2, 65536, &w->vocab);
    case O_MAXSEQ: return trainer_int_arg("--max-seq", arg, 1, 65536, &w->max_seq);
    case O_KEEPATT: return trainer_int_arg("--keep-attention", arg, 0, 1, &w->keep_attention);
    case O_GEMM_TUNE:
        return trainer_int_arg("--gemm-tune", arg, 0, NN_GEMM_TUNE_MAX, &w->gemm_tune);
    }
    if (code >= O_FP8 && code <= O_FP8 + 2)
        return trainer_fp8_option(&w->fp8, code - O_FP8, arg);
    return trainer_bad("unknown option");
}

static int configure(void *self, const trainer_choice_t *c)
{
    gpt2_wiring_t *w = self;
    bmt_error_t err;
    const int rc = trainer_fp8_check(&w->fp8);
    if (rc)
        return rc;
    if (c->init_from) {
        if (gpt2_config_from_file(c->init_from, w->heads, &w->cfg, &err) < 0) {
            fprintf(stderr, "gpt2: %s\n", err.text);
            return 1;
        }
        /* The sizes are the file's: an option may repeat one, never change
         * it (fewer layers would load the first ones silently). */
        const struct {
            const char *opt, *what;
            int given, file;
        } size[] = {
            { "--layers", "layers (h.<N>)", w->layers, w->cfg.n_layer },
            { "--embd", "n_embd", w->embd, w->cfg.n_embd },
            { "--vocab", "vocab_size", w->vocab, w->cfg.vocab_size },
            { "--max-seq", "positions (wpe)", w->max_seq, w->cfg.max_seq_len },
        };
        for (size_t i = 0; i < sizeof(size) / sizeof(size[0]); i++)
            if (size[i].given && size[i].given != size[i].file)
                return trainer_bad("%s has %d %s but %s is %d: with --init-from the sizes are "
                                   "the file's; leave %s out or make them agree",
                                   c->init_from, size[i].file, size[i].what, size[i].opt,
                                   size[i].given, size[i].opt);
        /* So is a --model: a preset of other sizes would otherwise be
         * trained as the file's model without a word. */
        gpt2_config_t p;
        if (c->model_given && gpt2_config_by_name(c->model, &p, &err) < 0)
            return trainer_bad("%s", err.text);
        const gpt2_config_t *f = &w->cfg;
        if (c->model_given &&
            (p.n_layer != f->n_layer || p.n_head != f->n_head || p.n_embd != f->n_embd ||
             p.vocab_size != f->vocab_size || p.max_seq_len != f->max_seq_len))
            return trainer_bad("--model %s is L %d, H %d, C %d, V %d, maxT %d, but %s holds L %d, "
                               "H %d, C %d, V %d, maxT %d: with --init-from the model is the "
                               "file's; leave --model out or name the file's",
                               c->model, p.n_layer, p.n_head, p.n_embd, p.vocab_size, p.max_seq_len,
                               c->init_from, f->n_layer, f->n_head, f->n_embd, f->vocab_size,
                               f->max_seq_len);
    } else if (gpt2_config_by_name(c->model, &w->cfg, &err) < 0)
        return trainer_bad("%s", err.text);
    if (w->layers)
        w->cfg.n_layer = w->layers;
    if (w->heads)
        w->cfg.n_head = w->heads;
    if (w->embd)
        w->cfg.n_embd = w->embd;
    if (w->vocab)
        w->cfg.vocab_size = w->vocab;
    if (w->max_seq)
        w->cfg.max_seq_len = w->max_seq;
    if (gpt2_config_check(&w->cfg, &err) < 0)
        return trainer_bad("%s", err.text);
    return 0;
}

static int max_seq_len(const void *self) { return ((const gpt2_wiring_t *)self)->cfg.max_seq_len; }

static int vocab_size(const void *self) { return ((const gpt2_wiring_t *)self)->cfg.vocab_size; }

static void describe(const void *self, char *out, size_t len)
{
    const gpt2_config_t *c = &((const gpt2_wiring_t *)self)->cfg;
    snprintf(out, len, "L %d, H %d, C %d, V %d, maxT %d", c->n_layer, c->n_head, c->n_embd,
             c->vocab_size, c->max_seq_len);
}

static int64_t num_params(const void *self)
{
    return gpt2_num_params(&((const gpt2_wiring_t *)self)->cfg);
}

static double flops_per_token(const void *self, int T)
{
    return gpt2_flops_per_token(&((const gpt2_wiring_t *)self)->cfg, T);
}

static void *create(void *self, bmt_ctx_t *ctx, int B, int T, const bmt_blocklist_config_t *lc,
                    uint64_t seed, bmt_error_t *err)
{
    return gpt2_model_create(ctx, &((gpt2_wiring_t *)self)->cfg, B, T, lc, seed, err);
}

static int after_create(void *self, void *m, bmt_error_t *err)
{
    const gpt2_wiring_t *w = self;
    if (gpt2_model_gemm_tune(m, w->gemm_tune, err) < 0 ||
        gpt2_model_keep_attention(m, w->keep_attention, err) < 0 ||
        gpt2_model_fp8(m, w->fp8.on, trainer_fp8_history(&w->fp8), err) < 0)
        return -1;
    return 0;
}

static int act_bytes(const void *m, int64_t *layer, int64_t *head)
{
    return gpt2_model_act_bytes(m, layer, head);
}

static int keep_layers(void *m, int layers, bool head, bmt_error_t *err)
{
    return gpt2_model_keep_layers(m, layers, head, err);
}

/* FP8's statistics: a line on rank 0, and on any rank whose tensors
 * saturated or could not be scaled. */
static int finish(void *self, void *m, int rank, bmt_error_t *err)
{
    const gpt2_wiring_t *w = self;
    nn_fp8_stats_t st;
    if (!w->fp8.on)
        return 0;
    if (gpt2_model_fp8_stats(m, &st, err) < 0)
        return -1;
    trainer_fp8_report(&w->fp8, rank, &st);
    return 0;
}

static int load(void *m, const char *path, bmt_error_t *err)
{
    return gpt2_model_load(m, path, err);
}

static bmt_blocklist_t *list(void *m) { return gpt2_model_list(m); }

static int set_batch(void *m, const int32_t *in, const int32_t *tg, bmt_error_t *err)
{
    return gpt2_model_set_batch(m, in, tg, err);
}

static float loss(const void *m) { return gpt2_model_loss(m); }

static bmt_dtype_t param_dtype(const void *m) { return gpt2_model_param_dtype(m); }

static void destroy(void *m) { gpt2_model_destroy(m); }

/* HF's GPT2Config beside the weights: from_pretrained(DIR/step-N) loads it as
 * written, and --init-from takes the heads from it. */
/* gpt2_config_from_file takes the sizes from the weights and refuses a
 * config.json that disagrees with them. */
static int check_dir(const char *dir, bmt_error_t *err)
{
    gpt2_config_t c;
    return gpt2_config_from_file(dir, 0, &c, err);
}

static int hf_config_json(const void *self, bmt_dtype_t dtype, char **json, bmt_error_t *err)
{
    return gpt2_hf_config_json(&((const gpt2_wiring_t *)self)->cfg, dtype, json, err);
}

static json_t *state(const void *self)
{
    const gpt2_config_t *c = &((const gpt2_wiring_t *)self)->cfg;
    return json_pack("{sisisisisi}", "n_layer", c->n_layer, "n_head", c->n_head, "n_embd",
                     c->n_embd, "vocab_size", c->vocab_size, "max_seq_len", c->max_seq_len);
}

int main(int argc, char **argv)
{
    gpt2_wiring_t w = { .keep_attention = -1, .fp8 = TRAINER_FP8_INIT };
    const trainer_model_t model = {
        .name = "gpt2",
        .default_model = "tiny",
        .self = &w,
        .usage_model =
            "Model:\n"
            "  -m, --model NAME        tiny (default), d12, d24, d36, d48\n"
            "      --init-from PATH    start from a safetensors file, index or directory (HF\n"
            "                          GPT-2 names); its sizes are the model's, the heads from\n"
            "                          its config.json (else --heads, else C/64)\n"
            "      --layers L --heads H --embd C --vocab V --max-seq N   override its sizes\n",
        .usage_run_mid =
            "      --keep-attention 0|1  cuda, with --ckpt 1: keep each layer's attention output\n"
            "                          so that the recomputation skips attention (default: 1\n"
            "                          where it applies, flash attention on cuda; N x C bf16\n"
            "                          more per layer, the same results; 0: least memory)\n",
        .usage_run_end =
            "      --gemm-tune N       cuda: time N of cuBLASLt's candidates per product shape\n"
            "                          at its first use and keep the fastest (0, the default:\n"
            "                          the heuristic's first, the same from run to run; <= 32)\n"
            "      --fp8 0|1           the layers' products with FP8 operands (docs/fp8.md);\n"
            "                          cpu: emulated in f32, the reference of the GPU's; cuda:\n"
            "                          cuBLASLt's FP8 products (B x T, width multiples of "
            "16)\n" TRAINER_FP8_USAGE,
        .options = gpt2_options,
        .option = option,
        .configure = configure,
        .max_seq_len = max_seq_len,
        .vocab_size = vocab_size,
        .max_vocab = 65536,
        .describe = describe,
        .num_params = num_params,
        .flops_per_token = flops_per_token,
        .create = create,
        .after_create = after_create,
        .act_bytes = act_bytes,
        .keep_layers = keep_layers,
        .finish = finish,
        .load = load,
        .list = list,
        .set_batch = set_batch,
        .loss = loss,
        .param_dtype = param_dtype,
        .destroy = destroy,
        .hf_config_json = hf_config_json,
        .check_dir = check_dir,
        .state = state,
    };
    return trainer_main(&model, argc, argv);
}
