/* examples/gpt2/config.c — GPT-2's configuration: presets, checks, sizes, and
 * HF's config.json in and out (see model.h). Apart from the model so that a
 * program that only reads configurations (bin/generate) does not link the
 * model and its CUDA half.
 *
 * HF's config.json is this model's contract with transformers: the trainer
 * writes one that describes exactly what it computes (gpt2_hf_config_json),
 * and --init-from reads one beside the weights and refuses any value it does
 * not compute (gpt2_config_from_hf_json) rather than train another model than
 * the file describes. Absent keys mean GPT2Config's defaults, because that is
 * what from_pretrained builds from the same file.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bmt/safetensors.h"
#include "gpt2/model.h"
#include "nn/hfjson.h"

int gpt2_config_by_name(const char *name, gpt2_config_t *cfg, bmt_error_t *err)
{
    static const struct {
        const char *name;
        gpt2_config_t c;
    } known[] = {
        { "tiny", { 256, 256, 4, 4, 64 } },       { "d12", { 1024, 50257, 12, 12, 768 } },
        { "d24", { 1024, 50257, 24, 16, 1024 } }, { "d36", { 1024, 50257, 36, 20, 1280 } },
        { "d48", { 1024, 50257, 48, 25, 1600 } },
    };
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        if (name && strcmp(name, known[i].name) == 0) {
            *cfg = known[i].c;
            return 0;
        }
    return nn_fail(err, "unknown model '%.200s': use tiny, d12, d24, d36 or d48, or give the sizes",
                   name ? name : "(null)");
}

int gpt2_config_check(const gpt2_config_t *c, bmt_error_t *err)
{
    const struct {
        const char *what;
        int v, max;
    } f[] = {
        { "sequence length (max_seq_len)", c->max_seq_len, 1 << 16 },
        { "vocabulary size", c->vocab_size, 1 << 20 },
        { "layers", c->n_layer, 1024 },
        { "heads", c->n_head, 1024 },
        { "embedding size", c->n_embd, 1 << 16 },
    };
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
        if (f[i].v < 1 || f[i].v > f[i].max)
            return nn_fail(err, "model: %s must be in 1..%d, not %d", f[i].what, f[i].max, f[i].v);
    if (c->n_embd % c->n_head != 0)
        return nn_fail(err, "model: the embedding size %d is not a multiple of the %d heads",
                       c->n_embd, c->n_head);
    return 0;
}

int64_t gpt2_num_params(const gpt2_config_t *c)
{
    const int64_t C = c->n_embd, L = c->n_layer;
    const int64_t layer =
        2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C);
    return (int64_t)c->vocab_size * C + (int64_t)c->max_seq_len * C + L * layer + 2 * C;
}

double gpt2_flops_per_token(const gpt2_config_t *c, int T)
{
    return 6.0 * (double)gpt2_num_params(c) + 6.0 * c->n_layer * c->n_embd * (double)T;
}

static const bmt_st_tensor_t *named(const bmt_st_t *st, const char *a, const char *b)
{
    int i = bmt_st_find(st, a);
    return bmt_st_tensor(st, i >= 0 ? i : bmt_st_find(st, b));
}

/* ------------------------------------------------------------ HF config.json */

int gpt2_config_from_hf_json(const char *text, const char *file, int n_head, gpt2_config_t *cfg,
                             bmt_error_t *err)
{
    json_t *root = nn_hf_json_load(text, file, err);
    if (root == NULL)
        return -1;
    int rc = 0;
    gpt2_config_t c = *cfg;
    const json_t *v;
    if (!json_is_object(root))
        rc = nn_fail(err, "%s: malformed: a JSON object is needed, not %s", file,
                     nn_json_kind(root));

    /* What kind of model: GPT-2, as a causal LM or its body. */
    if (rc == 0 && (v = json_object_get(root, "model_type")) != NULL) {
        if (!json_is_string(v))
            rc = nn_hf_wrong_type(err, file, "model_type", "a string", v);
        else if (strcmp(json_string_value(v), "gpt2") != 0)
            rc = nn_hf_unsupported(err, file, "model_type", v, "\"gpt2\"");
    }
    if (rc == 0 && (v = json_object_get(root, "architectures")) != NULL && !json_is_null(v)) {
        if (!json_is_array(v))
            rc = nn_hf_wrong_type(err, file, "architectures", "an array of strings", v);
        for (size_t i = 0; rc == 0 && i < json_array_size(v); i++) {
            const json_t *e = json_array_get(v, i);
            if (!json_is_string(e))
                rc = nn_hf_wrong_type(err, file, "architectures", "an array of strings", e);
            else if (strcmp(json_string_value(e), "GPT2LMHeadModel") != 0 &&
                     strcmp(json_string_value(e), "GPT2Model") != 0)
                rc = nn_hf_unsupported(err, file, "architectures[]", e,
                                       "\"GPT2LMHeadModel\", \"GPT2Model\"");
        }
    }
    static const char *const rotary[] = { "rotary_dim", "rotary_pct", "rope_theta", "rope_scaling",
                                          "rope_parameters" };
    for (size_t i = 0; rc == 0 && i < sizeof(rotary) / sizeof(rotary[0]); i++)
        if ((v = json_object_get(root, rotary[i])) != NULL && !json_is_null(v))
            rc = nn_hf_unsupported(err, file, rotary[i], v, "absent (positions are learned: wpe)");

    /* The sizes: the weights have them; the file must say the same. */
    const struct {
        const char *key, *alias, *what;
        int dflt, have;
    } sizes[] = {
        { "n_layer", "num_hidden_layers", "layers (h.<N>)", 12, c.n_layer },
        { "n_embd", "hidden_size", "columns in wte", 768, c.n_embd },
        { "vocab_size", NULL, "rows in wte", 50257, c.vocab_size },
        { "n_positions", "max_position_embeddings", "rows in wpe", 1024, c.max_seq_len },
    };
    for (size_t i = 0; rc == 0 && i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        long long x;
        bool given;
        rc = nn_hf_int(root, file, sizes[i].key, sizes[i].alias, sizes[i].dflt, false, &x, &given,
                       err);
        if (rc == 0 && x != sizes[i].have)
            rc = nn_fail(err, "%s: %s is %lld%s but the weights have %d %s", file, sizes[i].key, x,
                         given ? "" : " (absent: the default)", sizes[i].have, sizes[i].what);
    }
    long long heads = 12;
    bool given = false;
    if (rc == 0)
        rc = nn_hf_int(root, file, "n_head", "num_attention_heads", 12, false, &heads, &given, err);
    if (rc == 0 && (heads < 1 || heads > 1024 || c.n_embd % heads != 0))
        rc = nn_fail(err, "%s: n_head is %lld%s: it must be in 1..1024 and divide n_embd %d", file,
                     heads, given ? "" : " (absent: the default)", c.n_embd);
    if (rc == 0 && n_head != 0 && n_head != heads)
        rc = nn_fail(err,
                     "%s: n_head is %lld%s but --heads is %d: leave --heads out or make them agree",
                     file, heads, given ? "" : " (absent: the default)", n_head);
    if (rc == 0 && (v = json_object_get(root, "n_inner")) != NULL && !json_is_null(v)) {
        if (!json_is_integer(v))
            rc = nn_hf_wrong_type(err, file, "n_inner", "an integer or null", v);
        else if (json_integer_value(v) != 4 * (json_int_t)c.n_embd) {
            char s[48];
            snprintf(s, sizeof(s), "null or %lld (4 x n_embd)", 4LL * c.n_embd);
            rc = nn_hf_unsupported(err, file, "n_inner", v, s);
        }
    }

    /* What a layer computes. */
    if (rc == 0 && (v = json_object_get(root, "activation_function")) != NULL) {
        if (!json_is_string(v))
            rc = nn_hf_wrong_type(err, file, "activation_function", "a string", v);
        else if (strcmp(json_string_value(v), "gelu_new") != 0 &&
                 strcmp(json_string_value(v), "gelu_pytorch_tanh") != 0)
            rc = nn_hf_unsupported(err, file, "activation_function", v,
                                   "\"gelu_new\", \"gelu_pytorch_tanh\" (GELU, tanh)");
    }
    if (rc == 0 && (v = json_object_get(root, "layer_norm_epsilon")) != NULL) {
        if (!json_is_number(v))
            rc = nn_hf_wrong_type(err, file, "layer_norm_epsilon", "a number", v);
        else if (!(fabs(json_number_value(v) - GPT2_LAYERNORM_EPS) <= 1e-9 * GPT2_LAYERNORM_EPS))
            rc = nn_hf_unsupported(err, file, "layer_norm_epsilon", v,
                                   "1e-5 (the LayerNorms' epsilon)");
    }
    if (rc == 0)
        rc = nn_hf_bool(root, file, "tie_word_embeddings", true, "true (the LM head is wte)", err);
    if (rc == 0)
        rc = nn_hf_bool(root, file, "scale_attn_weights", true,
                        "true (scores scaled by 1/sqrt(head size))", err);
    if (rc == 0)
        rc = nn_hf_bool(root, file, "scale_attn_by_inverse_layer_idx", false,
                        "false (no 1/(layer+1) scaling)", err);
    if (rc == 0)
        rc =
            nn_hf_bool(root, file, "add_cross_attention", false, "false (no cross-attention)", err);
    if (rc == 0 && (v = json_object_get(root, "reorder_and_upcast_attn")) != NULL &&
        !json_is_boolean(v))
        rc = nn_hf_wrong_type(err, file, "reorder_and_upcast_attn", "true or false", v);
    if (rc == 0 && (v = json_object_get(root, "pruned_heads")) != NULL && !json_is_null(v)) {
        if (!json_is_object(v))
            rc = nn_hf_wrong_type(err, file, "pruned_heads", "an object", v);
        else if (json_object_size(v) != 0)
            rc = nn_hf_unsupported(err, file, "pruned_heads", v, "{} (every head)");
    }
    static const char *const dropouts[] = { "resid_pdrop", "embd_pdrop", "attn_pdrop" };
    for (size_t i = 0; rc == 0 && i < sizeof(dropouts) / sizeof(dropouts[0]); i++)
        if ((v = json_object_get(root, dropouts[i])) != NULL &&
            !(json_is_number(v) && json_number_value(v) >= 0 && json_number_value(v) <= 1))
            rc = json_is_number(v)
                     ? nn_fail(err, "%s: malformed: %s is %s; a probability is in [0, 1]", file,
                               dropouts[i], nn_json_show(v).s)
                     : nn_hf_wrong_type(err, file, dropouts[i], "a number", v);
    json_decref(root);
    if (rc == 0) {
        c.n_head = (int)heads;
        *cfg = c;
    }
    return rc;
}

int gpt2_config_from_file(const char *path, int n_head, gpt2_config_t *cfg, bmt_error_t *err)
{
    bmt_st_t *st = bmt_st_open(path, err);
    if (st == NULL)
        return -1;
    bmt_st_plan_t *plan = NULL;
    int rc = bmt_st_discover(st, &plan, err);
    const bmt_st_tensor_t *wte = named(st, "wte.weight", "transformer.wte.weight");
    const bmt_st_tensor_t *wpe = named(st, "wpe.weight", "transformer.wpe.weight");
    if (rc == 0 && (wte == NULL || wpe == NULL || wte->ndim != 2 || wpe->ndim != 2))
        rc = nn_fail(err, "%.200s: no GPT-2 embeddings: need 2-D wte.weight and wpe.weight", path);
    if (rc == 0 && plan->nlayers < 1)
        rc = nn_fail(err, "%.200s: no transformer layers (h.<N>.*) found", path);
    if (rc == 0 && wte->shape[1] != wpe->shape[1])
        rc = nn_fail(err, "%.200s: wte is %lld wide and wpe %lld: they must agree", path,
                     (long long)wte->shape[1], (long long)wpe->shape[1]);
    gpt2_config_t c = { 0 };
    if (rc == 0)
        c = (gpt2_config_t){ .max_seq_len = (int)wpe->shape[0],
                             .vocab_size = (int)wte->shape[0],
                             .n_layer = plan->nlayers,
                             .n_embd = (int)wte->shape[1] };
    bmt_st_plan_free(plan);
    bmt_st_close(st);
    char file[4096], *text = NULL;
    if (rc == 0)
        rc = nn_hf_config_path(path, file, sizeof(file), err);
    if (rc == 0)
        rc = nn_hf_config_read(file, &text, err);
    if (rc == 0 && text)
        rc = gpt2_config_from_hf_json(text, file, n_head, &c, err);
    else if (rc == 0) {
        c.n_head = n_head ? n_head : c.n_embd % 64 == 0 ? c.n_embd / 64 : 0;
        if (c.n_head == 0)
            rc = nn_fail(err,
                         "%.200s: the embedding size %d is not a multiple of 64: give the heads",
                         path, c.n_embd);
    }
    free(text);
    if (rc == 0)
        rc = gpt2_config_check(&c, err);
    if (rc == 0)
        *cfg = c;
    return rc;
}

int gpt2_hf_config_json(const gpt2_config_t *cfg, bmt_dtype_t dtype, char **json, bmt_error_t *err)
{
    if (gpt2_config_check(cfg, err) < 0)
        return -1;
    if (dtype != BMT_F32 && dtype != BMT_BF16)
        return nn_fail(err, "gpt2: config.json for %s parameters: only f32 and bf16 are written",
                       bmt_dtype_name(dtype));
    /* GPT-2's tokenizer has <|endoftext|> = 50256 as both; a smaller
     * vocabulary (bytes) has no such token, and GPT2Config's default 50256
     * would point outside it, so say null. */
    const bool gpt2_vocab = cfg->vocab_size >= 50257;
    json_t *j = json_pack(
        "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:n, s:s, s:f, s:f, s:f, s:f, s:f, s:b, s:b, "
        "s:b, s:b, s:b, s:b, s:o, s:o, s:s}",
        "architectures", "GPT2LMHeadModel", "model_type", "gpt2", "vocab_size", cfg->vocab_size,
        "n_positions", cfg->max_seq_len, "n_ctx", cfg->max_seq_len, "n_embd", cfg->n_embd,
        "n_layer", cfg->n_layer, "n_head", cfg->n_head, "n_inner", "activation_function",
        "gelu_new", "layer_norm_epsilon", GPT2_LAYERNORM_EPS, "resid_pdrop", 0.0, "embd_pdrop", 0.0,
        "attn_pdrop", 0.0, "initializer_range", 0.02, "tie_word_embeddings", 1,
        "scale_attn_weights", 1, "scale_attn_by_inverse_layer_idx", 0, "reorder_and_upcast_attn", 0,
        "add_cross_attention", 0, "use_cache", 1, "bos_token_id",
        gpt2_vocab ? json_integer(50256) : json_null(), "eos_token_id",
        gpt2_vocab ? json_integer(50256) : json_null(), "torch_dtype",
        dtype == BMT_F32 ? "float32" : "bfloat16");
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(j);
    char *out = text ? malloc(strlen(text) + 2) : NULL;
    if (out == NULL) {
        free(text);
        return nn_fail(err, "gpt2: config.json: out of memory");
    }
    snprintf(out, strlen(text) + 2, "%s\n", text);
    free(text);
    *json = out;
    return 0;
}
