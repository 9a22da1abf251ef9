/* examples/llama/train.c — the Llama-family trainer on libbmt (bin/llama).
 *
 *     bmlaunch -g 2 -n 2 --device cpu -- llama --model tiny --data 'corpus_train.bin'
 *     llama --init-from DIR ...        (an HF Llama directory: config.json + safetensors)
 *
 * Only the Llama wiring: its presets (--model), its size overrides and the
 * trainer_model_t that hands the shared trainer (examples/common/trainer.h:
 * options, schedule, loop, evaluation, checkpoints, SIGUSR1, metrics, every
 * line printed) the model of llama/model.h. A checkpoint's step directory is
 * an HF Llama directory: HF names, and llama_hf_config_json's config.json.
 * f32 on cpu ranks, bf16 parameters with f32 masters on cuda ranks
 * (bmlaunch --device cuda; the model chooses by the context's device).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/trainer.h"
#include "llama/config.h"
#include "llama/model.h"
#include "nn/ops_cuda.h" /* NN_GEMM_TUNE_MAX */

typedef struct llama_wiring {
    llama_config_t cfg;
    int layers, heads, kv_heads, embd, ffn, vocab, max_seq; /* overrides; 0: the model's */
    int keep_attention;                                     /* --keep-attention; -1: the default */
    int gemm_tune;                                          /* --gemm-tune */
    trainer_fp8_t fp8; /* --fp8, --fp8-scaling, --fp8-history */
} llama_wiring_t;

/* The presets: "tiny", byte-level (V 256) for the corpus the repository ships,
 * grouped-query attention (4 query heads sharing 2 key/value heads); and
 * SmolLM-135M's shape (HuggingFaceTB/SmolLM-135M's config.json: 30 layers,
 * C 576, 9 heads over 3 key/value heads, F 1536, V 49152, tied). */
static int preset(const char *name, llama_config_t *c)
{
    const llama_config_t base = { .rms_eps = 1e-5, .rope_theta = 10000, .bos_token_id = -1 };
    *c = base;
    if (strcmp(name, "tiny") == 0) {
        c->n_layer = 4, c->n_embd = 64, c->n_head = 4, c->n_kv_head = 2, c->head_dim = 16;
        c->ffn = 176, c->vocab_size = 256, c->max_seq_len = 256;
        return 0;
    }
    if (strcmp(name, "smollm-135m") == 0) {
        c->n_layer = 30, c->n_embd = 576, c->n_head = 9, c->n_kv_head = 3, c->head_dim = 64;
        c->ffn = 1536, c->vocab_size = 49152, c->max_seq_len = 2048, c->tied = true;
        c->bos_token_id = 0, c->eos_token_ids[0] = 0, c->n_eos = 1;
        return 0;
    }
    /* Llama 3.2 1B and 3B (meta-llama/Llama-3.2-{1B,3B}'s config.json): tied,
     * 8 key/value heads, head size 64 and 128, rope_theta 500000 with Llama 3's
     * scaling (factor 32, low 1, high 4, original 8192), V 128256. */
    const bool l1 = strcmp(name, "llama3.2-1b") == 0, l3 = strcmp(name, "llama3.2-3b") == 0;
    if (l1 || l3) {
        c->n_layer = l1 ? 16 : 28, c->n_embd = l1 ? 2048 : 3072, c->n_head = l1 ? 32 : 24;
        c->n_kv_head = 8, c->head_dim = l1 ? 64 : 128, c->ffn = 8192, c->vocab_size = 128256;
        c->max_seq_len = 131072, c->rope_theta = 500000, c->tied = true;
        c->rope_llama3 = true, c->rope_factor = 32, c->rope_low_freq_factor = 1;
        c->rope_high_freq_factor = 4, c->rope_original_max = 8192;
        c->bos_token_id = 128000, c->eos_token_ids[0] = 128001, c->n_eos = 1;
        return 0;
    }
    return -1;
}

/* llama/ names itself in its messages; the trainer prefixes the program. */
enum {
    O_LAYERS = TRAINER_OPT_MODEL,
    O_HEADS,
    O_KVHEADS,
    O_EMBD,
    O_FFN,
    O_VOCAB,
    O_MAXSEQ,
    O_KEEPATT,
    O_GEMM_TUNE,
    O_FP8, /* and the two after it (TRAINER_FP8_OPTIONS) */
};

static const struct option llama_options[] = {
    { "layers", required_argument, NULL, O_LAYERS },
    { "heads", required_argument, NULL, O_HEADS },
    { "kv-heads", required_argument, NULL, O_KVHEADS },
    { "embd", required_argument, NULL, O_EMBD },
    { "ffn", required_argument, NULL, O_FFN },
    { "vocab", required_argument, NULL, O_VOCAB },
    { "max-seq", required_argument, NULL, O_MAXSEQ },
    { "keep-attention", required_argument, NULL, O_KEEPATT },
    { "gemm-tune", required_argument, NULL, O_GEMM_TUNE },
    TRAINER_FP8_OPTIONS(O_FP8),
    { NULL, 0, NULL, 0 },
};

static int option(void *self, int code, const char *arg)
{
    llama_wiring_t *w = self;
    switch (code) {
    case O_LAYERS: return trainer_int_arg("--layers", arg, 1, 1024, &w->layers);
    case O_HEADS: return trainer_int_arg("--heads", arg, 1, 1024, &w->heads);
    case O_KVHEADS: return trainer_int_arg("--kv-heads", arg, 1, 1024, &w->kv_heads);
    case O_EMBD: return trainer_int_arg("--embd", arg, 1, 65536, &w->embd);
    case O_FFN: return trainer_int_arg("--ffn", arg, 1, 1 << 20, &w->ffn);
    case O_VOCAB: return trainer_int_arg("--vocab", arg, 2, 1 << 24, &w->vocab);
    case O_MAXSEQ: return trainer_int_arg("--max-seq", arg, 1, 1 << 20, &w->max_seq);
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
    llama_wiring_t *w = self;
    bmt_error_t err;
    const int rc = trainer_fp8_check(&w->fp8);
    if (rc)
        return rc;
    if (c->init_from) {
        if (llama_config_from_file(c->init_from, &w->cfg, &err) < 0) {
            fprintf(stderr, "llama: %s\n", err.text);
            return 1;
        }
    } else if (preset(c->model, &w->cfg) < 0)
        return trainer_bad("unknown model '%s': use tiny, smollm-135m, llama3.2-1b or "
                           "llama3.2-3b, or --init-from an HF Llama directory",
                           c->model);
    llama_config_t *m = &w->cfg;
    if (c->init_from) {
        /* The sizes are the directory's: an option may repeat one, never
         * change it (the weights would be read as another model's). */
        const struct {
            const char *opt, *key;
            int given, file;
        } size[] = {
            { "--layers", "num_hidden_layers", w->layers, m->n_layer },
            { "--heads", "num_attention_heads", w->heads, m->n_head },
            { "--kv-heads", "num_key_value_heads", w->kv_heads, m->n_kv_head },
            { "--embd", "hidden_size", w->embd, m->n_embd },
            { "--ffn", "intermediate_size", w->ffn, m->ffn },
            { "--vocab", "vocab_size", w->vocab, m->vocab_size },
        };
        for (size_t i = 0; i < sizeof(size) / sizeof(size[0]); i++)
            if (size[i].given && size[i].given != size[i].file)
                return trainer_bad("%s: config.json: %s is %d but %s is %d: with --init-from the "
                                   "sizes are the checkpoint's; leave %s out or make them agree",
                                   c->init_from, size[i].key, size[i].file, size[i].opt,
                                   size[i].given, size[i].opt);
        /* So is a --model: a preset of other sizes would otherwise be
         * trained as the directory's model without a word. The positions
         * are left out: --max-seq may change them (RoPE has no table). */
        llama_config_t p;
        if (c->model_given && preset(c->model, &p) < 0)
            return trainer_bad("unknown model '%s': use tiny, smollm-135m, llama3.2-1b or "
                               "llama3.2-3b, or --init-from an HF Llama directory",
                               c->model);
        if (c->model_given &&
            (p.n_layer != m->n_layer || p.n_head != m->n_head || p.n_kv_head != m->n_kv_head ||
             p.n_embd != m->n_embd || p.head_dim != m->head_dim || p.ffn != m->ffn ||
             p.vocab_size != m->vocab_size || p.tied != m->tied))
            return trainer_bad("--model %s is L %d, H %d, KV %d, C %d, head size %d, F %d, V "
                               "%d%s, but %s holds L %d, H %d, KV %d, C %d, head size %d, F %d, V "
                               "%d%s: with --init-from the model is the directory's; leave "
                               "--model out or name the directory's",
                               c->model, p.n_layer, p.n_head, p.n_kv_head, p.n_embd, p.head_dim,
                               p.ffn, p.vocab_size, p.tied ? ", tied" : "", c->init_from,
                               m->n_layer, m->n_head, m->n_kv_head, m->n_embd, m->head_dim, m->ffn,
                               m->vocab_size, m->tied ? ", tied" : "");
    } else {
        if (w->layers)
            m->n_layer = w->layers;
        if (w->heads)
            m->n_head = w->heads;
        if (w->kv_heads)
            m->n_kv_head = w->kv_heads;
        else if (w->heads)
            m->n_kv_head = w->heads; /* MHA unless said otherwise */
        if (w->embd)
            m->n_embd = w->embd;
        if (w->heads || w->embd) { /* the head size follows C / NH */
            if (m->n_head > 0 && m->n_embd % m->n_head != 0)
                return trainer_bad("the head size is C / H, and C %d is not a multiple of H %d: "
                                   "change --embd or --heads",
                                   m->n_embd, m->n_head);
            m->head_dim = m->n_head > 0 ? m->n_embd / m->n_head : 0;
        }
        if (w->ffn)
            m->ffn = w->ffn;
        if (w->vocab)
            m->vocab_size = w->vocab;
    }
    if (w->max_seq)
        m->max_seq_len = w->max_seq;
    if (llama_config_check(m, &err) < 0)
        return trainer_bad("%s", err.text);
    return 0;
}

static int max_seq_len(const void *self) { return ((const llama_wiring_t *)self)->cfg.max_seq_len; }

static int vocab_size(const void *self) { return ((const llama_wiring_t *)self)->cfg.vocab_size; }

static void describe(const void *self, char *out, size_t len)
{
    const llama_config_t *c = &((const llama_wiring_t *)self)->cfg;
    snprintf(out, len, "L %d, H %d, KV %d, C %d, F %d, V %d, maxT %d%s", c->n_layer, c->n_head,
             c->n_kv_head, c->n_embd, c->ffn, c->vocab_size, c->max_seq_len,
             c->tied ? ", tied" : "");
}

static int64_t num_params(const void *self)
{
    return llama_num_params(&((const llama_wiring_t *)self)->cfg);
}

static double flops_per_token(const void *self, int T)
{
    return llama_flops_per_token(&((const llama_wiring_t *)self)->cfg, T);
}

static void *create(void *self, bmt_ctx_t *ctx, int B, int T, const bmt_blocklist_config_t *lc,
                    uint64_t seed, bmt_error_t *err)
{
    return llama_model_create(ctx, &((llama_wiring_t *)self)->cfg, B, T, lc, seed, err);
}

static int after_create(void *self, void *m, bmt_error_t *err)
{
    const llama_wiring_t *w = self;
    return llama_model_keep_attention(m, w->keep_attention, err) < 0 ||
                   llama_model_gemm_tune(m, w->gemm_tune, err) < 0 ||
                   llama_model_fp8(m, w->fp8.on, trainer_fp8_history(&w->fp8), err) < 0
               ? -1
               : 0;
}

/* FP8's statistics (trainer_fp8_report). */
static int finish(void *self, void *m, int rank, bmt_error_t *err)
{
    const trainer_fp8_t *f = &((const llama_wiring_t *)self)->fp8;
    nn_fp8_stats_t st;
    if (!f->on)
        return 0;
    if (llama_model_fp8_stats(m, &st, err) < 0)
        return -1;
    trainer_fp8_report(f, rank, &st);
    return 0;
}

static int load(void *m, const char *path, bmt_error_t *err)
{
    return llama_model_load(m, path, err);
}

static int act_bytes(const void *m, int64_t *layer, int64_t *head)
{
    return llama_model_act_bytes(m, layer, head);
}

static int keep_layers(void *m, int layers, bool head, bmt_error_t *err)
{
    return llama_model_keep_layers(m, layers, head, err);
}

static bmt_blocklist_t *list(void *m) { return llama_model_list(m); }

static int set_batch(void *m, const int32_t *in, const int32_t *tg, bmt_error_t *err)
{
    return llama_model_set_batch(m, in, tg, err);
}

static float loss(const void *m) { return llama_model_loss(m); }

static bmt_dtype_t param_dtype(const void *m) { return llama_model_param_dtype(m); }

static void destroy(void *m) { llama_model_destroy(m); }

/* HF's LlamaConfig beside the weights: the step directory is an HF Llama
 * directory (from_pretrained, --init-from). */
static int check_dir(const char *dir, bmt_error_t *err)
{
    llama_config_t c;
    return llama_config_from_file(dir, &c, err) < 0 ? -1 : llama_config_check_files(&c, dir, err);
}

static int hf_config_json(const void *self, bmt_dtype_t dtype, char **json, bmt_error_t *err)
{
    return llama_hf_config_json(&((const llama_wiring_t *)self)->cfg, dtype, json, err);
}

static json_t *state(const void *self)
{
    const llama_config_t *c = &((const llama_wiring_t *)self)->cfg;
    return json_pack("{sisisisisisisisisb}", "n_layer", c->n_layer, "n_head", c->n_head,
                     "n_kv_head", c->n_kv_head, "n_embd", c->n_embd, "head_dim", c->head_dim, "ffn",
                     c->ffn, "vocab_size", c->vocab_size, "max_seq_len", c->max_seq_len, "tied",
                     c->tied);
}

int main(int argc, char **argv)
{
    llama_wiring_t w = { .keep_attention = -1, .fp8 = TRAINER_FP8_INIT };
    const trainer_model_t model = {
        .name = "llama",
        .default_model = "tiny",
        .self = &w,
        .usage_model =
            "Model (HF's LlamaForCausalLM; f32 on cpu, bf16 on cuda; docs/llama.md):\n"
            "  -m, --model NAME        tiny (default: L 4, C 64, 4 heads over 2 kv heads, V 256),\n"
            "                          smollm-135m (SmolLM-135M's shape), llama3.2-1b,\n"
            "                          llama3.2-3b (Llama 3.2 1B's and 3B's shapes)\n"
            "      --init-from DIR     start from an HF Llama directory (config.json and\n"
            "                          safetensors; a checkpoint's step directory is one)\n"
            "      --layers L --heads H --kv-heads K --embd C --ffn F --vocab V --max-seq N\n"
            "                          override its sizes (--heads or --embd: head size C/H)\n"
            "      --fp8 0|1           the layers' products with FP8 operands (docs/fp8.md);\n"
            "                          cpu: the exact f32 emulation; cuda: Hopper's FP8\n"
            "                          products (B T, C and F multiples of 16)\n" TRAINER_FP8_USAGE,
        .usage_run_mid =
            "      --keep-attention 0|1  cuda, with --ckpt 1: keep each layer's attention output\n"
            "                          and log-sum-exps so that the recomputation skips the\n"
            "                          flash forward (default: 1; N x NH hd bf16 and B NH T\n"
            "                          f32 more per layer, the same results; 0: least memory)\n"
            "      --gemm-tune N       cuda: time N of cuBLASLt's candidates per product shape\n"
            "                          at its first use and keep the fastest (0, the default:\n"
            "                          the heuristic's first, the same from run to run; <= 32)\n",
        .options = llama_options,
        .option = option,
        .configure = configure,
        .max_seq_len = max_seq_len,
        .vocab_size = vocab_size,
        .max_vocab = 0,
        .describe = describe,
        .num_params = num_params,
        .flops_per_token = flops_per_token,
        .create = create,
        .after_create = after_create,
        .finish = finish,
        .act_bytes = act_bytes,
        .keep_layers = keep_layers,
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
